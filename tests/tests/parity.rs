//! Numerical parity with PyTorch: `ember verify`'s checks on every fixture — the shared
//! `gpt2-tiny` (from `gpt_ref.py parity`, when `EMBER_SHARED` is set) and the committed ones
//! written by `scripts/parity_gpt2.py` (erf GELU, no biases, other shapes, three uneven
//! micro-batches) and `scripts/parity_llama.py` (Hugging Face `LlamaForCausalLM`, GQA).

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use ember_train::tools::verify::verify;

fn check(dir: &Path) {
    let report = verify::<Autodiff<Flex>>(dir, &Default::default()).unwrap();
    assert!(report.ok, "{report}");
    assert_eq!(report.checks.len(), 27, "{report}");
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

#[test]
fn gpt2_with_erf_gelu_no_bias_and_uneven_micro_batches_matches_pytorch() {
    check(&fixture("gpt2-erf-nobias"));
}

#[test]
fn llama_with_grouped_query_attention_matches_hugging_face() {
    check(&fixture("llama-tiny-gqa"));
}

#[test]
fn shared_gpt2_tiny_fixture_matches_pytorch() {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED is not set");
        return;
    };
    check(&Path::new(&shared).join("parity/gpt2-tiny"));
}
