//! End to end on the real corpus: `ember-data` prepares Tiny Shakespeare, `ember-train`
//! trains nanoGPT's CPU model on it through `ember-model`, and the loss falls as the
//! PyTorch reference's does. Needs the shared corpus (`EMBER_SHARED`); skips without it.

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use ember_data::{prepare, PrepareOptions, TokenizerKind};
use ember_train::{train, RunConfig, RunOptions};

fn shared_corpus() -> Option<PathBuf> {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED is not set (point it at the shared/ folder to run this test)");
        return None;
    };
    let path = Path::new(&shared).join("data/tinyshakespeare.txt");
    if !path.exists() {
        eprintln!("skipping: {} does not exist", path.display());
        return None;
    }
    Some(path)
}

#[test]
fn char_model_on_tiny_shakespeare_learns_like_the_reference() {
    let Some(corpus) = shared_corpus() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("shakespeare_char");
    let mut options = PrepareOptions::new(TokenizerKind::Char, vec![corpus], data.clone());
    options.progress = false;
    let summary = prepare(&options).unwrap();
    assert_eq!(summary.meta.vocab_size, 66, "65 characters + end-of-text");

    let config_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shakespeare_char.toml");
    let overrides: Vec<String> = ["max_steps=150", "eval_every=150", "checkpoint_every=0", "log_every=50"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut config = RunConfig::load(&config_path, &overrides).unwrap();
    config.data = Some(data);
    config.optimizer.lr_decay_steps = Some(2000); // the schedule of the full 2000-step run
    let options = RunOptions::new(config, dir.path().join("run"));
    let mut lines = Vec::new();
    let summary =
        train::<Autodiff<Flex>>(options, Default::default(), &mut |l| lines.push(l.to_string())).unwrap();
    let val = summary.final_val_loss.unwrap();
    // The initial loss is ≈ ln 66 = 4.19; the PyTorch reference reaches 2.43 at step 250.
    assert!(lines.iter().any(|l| l.contains("eval      0 | val loss 4.2")), "{}", lines.join("\n"));
    assert!(val < 2.65, "val loss after 150 steps: {val}\n{}", lines.join("\n"));
}
