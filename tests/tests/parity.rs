//! Numerical parity with PyTorch: `ember verify`'s checks on every fixture — the shared
//! `gpt2-tiny` (from `gpt_ref.py parity`, when `EMBER_SHARED` is set) and the committed ones
//! written by `scripts/parity_gpt2.py` (erf GELU, no biases, other shapes, three uneven
//! micro-batches) and `scripts/parity_llama.py` (Hugging Face `LlamaForCausalLM`, GQA).

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::Tensor;
use ember_model::hf;
use ember_train::tools::verify::{verify, Report};

/// Every check within tolerance: the 27 global ones, plus one per parameter tensor when the
/// fixture carries `init_grads.safetensors`.
fn check(dir: &Path, tensors: usize) -> Report {
    let report = verify::<Autodiff<Flex>>(dir, &Default::default()).unwrap();
    assert!(report.ok, "{report}");
    assert_eq!(report.checks.len(), 27 + tensors, "{report}");
    assert_eq!(report.worst_gradient.is_some(), tensors > 0, "{report}");
    report
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

#[test]
fn gpt2_with_erf_gelu_no_bias_and_uneven_micro_batches_matches_pytorch() {
    check(&fixture("gpt2-erf-nobias"), 0);
}

#[test]
fn llama_with_grouped_query_attention_matches_hugging_face() {
    check(&fixture("llama-tiny-gqa"), 0);
}

#[test]
fn shared_gpt2_tiny_fixture_matches_pytorch() {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED is not set");
        return;
    };
    // 28 parameter tensors (2 layers × 12, ln_f × 2, wte, wpe), each within 1e-5 of its
    // largest gradient entry.
    let report = check(&Path::new(&shared).join("parity/gpt2-tiny"), 28);
    assert!(report.worst_gradient.unwrap().1 < 1e-5);
}

/// A gradient file with one tensor off by 1e-3 of its largest value: exactly that tensor's
/// check fails, and the report names it as the worst.
#[test]
fn a_gradient_mismatch_names_its_tensor() {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED is not set");
        return;
    };
    let source = Path::new(&shared).join("parity/gpt2-tiny");
    let dir = tempfile::tempdir().unwrap();
    for file in ["init.safetensors", "batch.json", "expected.json"] {
        std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    // PyTorch's gradients as the weights of a model of the fixture's config, one tensor nudged.
    let config = ember_train::tools::verify::fixture_model(&source).unwrap();
    let model = config.init::<Flex>(&Default::default()).unwrap();
    let grads = hf::load(model, &source.join("init_grads.safetensors")).unwrap();
    let target = 5; // the 6th parameter tensor in the model's order
    let name = hf::named_tensors(&grads).unwrap()[target].0.clone();
    let nudged = grads.map(&mut Nudge { index: 0, target });
    hf::save(&nudged, &dir.path().join("init_grads.safetensors")).unwrap();

    let report = verify::<Autodiff<Flex>>(dir.path(), &Default::default()).unwrap();
    let failed: Vec<&str> = report.checks.iter().filter(|c| !c.ok).map(|c| c.name.as_str()).collect();
    assert_eq!(failed, vec![format!("grad {name}")], "{report}");
    let (worst, diff) = report.worst_gradient.clone().unwrap();
    assert_eq!(worst, name);
    assert!((diff - 1e-3).abs() < 1e-5, "{report}");
    assert!(report.to_string().contains(&format!("largest gradient difference: {name}")));
}

/// Adds 1e-3 × its largest |value| to every element of the `target`-th float parameter.
struct Nudge {
    index: usize,
    target: usize,
}

impl ModuleMapper<Flex> for Nudge {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Flex, D>>) -> Param<Tensor<Flex, D>> {
        let (id, tensor, mapper) = param.consume();
        let hit = self.index == self.target;
        self.index += 1;
        let tensor = if hit {
            let largest = tensor.clone().abs().max().into_scalar();
            tensor.add_scalar(largest * 1e-3)
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}
