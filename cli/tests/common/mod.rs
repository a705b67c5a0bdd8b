//! Running the `ember` binary from the CLI tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs `ember args` in `cwd`.
pub fn ember(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember")).args(args).current_dir(cwd).output().expect("ember runs")
}

/// Runs `ember args`, which must succeed; returns its stdout.
pub fn ok(args: &[&str], cwd: &Path) -> String {
    let out = ember(args, cwd);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ember {args:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    stdout.into_owned()
}

/// Runs `ember args`, which must fail with exit status 1 (an error, not a panic's 101) and
/// an `error: ` line; returns its stderr.
pub fn fails(args: &[&str], cwd: &Path) -> String {
    let out = ember(args, cwd);
    assert_eq!(out.status.code(), Some(1), "ember {args:?}: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// The (step, loss) of every training record of a run, bit for bit.
pub fn train_losses(run_dir: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// The tiny run configuration of `workdir()`'s `tiny.toml`.
pub const CONFIG: &str = r#"
data = "prepared"
max_steps = 6
micro_batch_size = 4
eval_every = 3
eval_batches = 2
checkpoint_every = 3
log_every = 1
[model]
preset = "tiny"
dropout = 0.1
[optimizer]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2
lr_decay_steps = 6
"#;

/// A work directory with a prepared char corpus (`prepared/`) and `tiny.toml`.
pub fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..150).map(|i| format!("ALICE:\nLine {i} of the play, said she.\n\n")).collect();
    std::fs::write(dir.path().join("corpus.txt"), text).unwrap();
    std::fs::write(dir.path().join("tiny.toml"), CONFIG).unwrap();
    ok(&["prepare", "--tokenizer", "char", "--input", "corpus.txt", "--out", "prepared"], dir.path());
    dir
}
