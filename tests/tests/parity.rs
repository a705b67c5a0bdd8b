//! Numerical parity with PyTorch: `ember verify`'s checks on every fixture — the shared
//! `gpt2-tiny` (from `gpt_ref.py parity`, when `EMBER_SHARED` is set) and the committed ones
//! written by `scripts/parity_gpt2.py` (erf GELU, no biases, other shapes, three uneven
//! micro-batches) and `scripts/parity_llama.py` (Hugging Face `LlamaForCausalLM`, GQA).

use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::Tensor;
use ember_model::hf;
use ember_train::tools::verify::{verify, verify_in, Report};
use ember_train::PrecisionKind;

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

/// 21 parameter tensors (3 layers × 6 without biases, wte, wpe, ln_f), each within 1e-5 of its
/// largest gradient entry in PyTorch's `init_grads.safetensors`.
#[test]
fn gpt2_with_erf_gelu_no_bias_and_uneven_micro_batches_matches_pytorch() {
    let report = check(&fixture("gpt2-erf-nobias"), 21);
    assert!(report.worst_gradient.unwrap().diff < 1e-5);
}

/// 21 parameter tensors (2 layers × 9, the embedding, the final norm, the untied head) against
/// Hugging Face's gradients.
#[test]
fn llama_with_grouped_query_attention_matches_hugging_face() {
    let report = check(&fixture("llama-tiny-gqa"), 21);
    assert!(report.worst_gradient.unwrap().diff < 1e-5);
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
    assert!(report.worst_gradient.unwrap().diff < 1e-5);
}

/// `ember verify --precision bf16-mixed`: Ember in bfloat16 matmuls against PyTorch's fp32
/// passes every fixture within bfloat16's tolerances, and is not fp32 (the gradient norm
/// differs by more than fp32's 1e-5); fp16-mixed is refused with the reason.
#[test]
fn bf16_mixed_matches_pytorch_within_bfloat16_rounding() {
    let mut dirs = vec![fixture("gpt2-erf-nobias"), fixture("llama-tiny-gqa")];
    if let Some(shared) = std::env::var_os("EMBER_SHARED") {
        dirs.push(Path::new(&shared).join("parity/gpt2-tiny"));
    }
    for dir in &dirs {
        let report = verify_in::<Autodiff<Flex>>(dir, &Default::default(), PrecisionKind::Bf16Mixed).unwrap();
        assert!(report.ok, "{report}");
        let norm = &report.checks[1];
        assert_eq!((norm.name.as_str(), norm.tolerance), ("initial grad norm", 1.0 / 256.0));
        assert!(norm.diff > 1e-5, "bf16 rounding shows in the gradient norm: {report}");
    }
    let err =
        verify_in::<Autodiff<Flex>>(&dirs[0], &Default::default(), PrecisionKind::Fp16Mixed).unwrap_err();
    assert!(err.to_string().contains("fp32 or bf16-mixed"), "{err}");
}

/// A gradient file with one tensor off by 1e-3 of its largest value: exactly that tensor's
/// check fails, and the report names it as the worst.
#[test]
fn a_gradient_mismatch_names_its_tensor() {
    let source = fixture("gpt2-erf-nobias");
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
    let nudged = grads.clone().map(&mut Nudge { index: 0, target, factor: 1e-3 });
    hf::save(&nudged, &dir.path().join("init_grads.safetensors")).unwrap();

    let report = verify::<Autodiff<Flex>>(dir.path(), &Default::default()).unwrap();
    let failed: Vec<&str> = report.checks.iter().filter(|c| !c.ok).map(|c| c.name.as_str()).collect();
    assert_eq!(failed, vec![format!("grad {name}")], "{report}");
    let worst = report.worst_gradient.clone().unwrap();
    assert_eq!(worst.tensor, name);
    assert!((worst.diff - 1e-3).abs() < 1e-5, "{report}");
    assert!(report.to_string().contains(&format!("largest gradient difference: {name}")));

    // NaN in one tensor of the file: that check fails (NaN is never within tolerance) and
    // that tensor is named, although `max` would skip NaN.
    let poisoned = grads.map(&mut Nudge { index: 0, target, factor: f32::NAN });
    hf::save(&poisoned, &dir.path().join("init_grads.safetensors")).unwrap();
    let report = verify::<Autodiff<Flex>>(dir.path(), &Default::default()).unwrap();
    let failed: Vec<&str> = report.checks.iter().filter(|c| !c.ok).map(|c| c.name.as_str()).collect();
    assert_eq!(failed, vec![format!("grad {name}")], "{report}");
    assert_eq!(report.worst_gradient.unwrap().tensor, name);

    // A path of that name that is not a file is an error, not a skipped check.
    std::fs::remove_file(dir.path().join("init_grads.safetensors")).unwrap();
    std::fs::create_dir(dir.path().join("init_grads.safetensors")).unwrap();
    let err = verify::<Autodiff<Flex>>(dir.path(), &Default::default()).unwrap_err().to_string();
    assert!(err.contains("init_grads.safetensors: a directory without model.safetensors"), "{err}");
}

/// A `batch.json` whose ids, targets or row lengths do not fit the model is an error naming the
/// field and what was expected (it panicked in the model before).
#[test]
fn a_bad_batch_is_an_error_naming_its_field() {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED is not set");
        return;
    };
    let source = Path::new(&shared).join("parity/gpt2-tiny");
    let batch: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("batch.json")).unwrap()).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 4] = [
        (
            "input id 999",
            |b| b["input_ids"][0][0] = 999.into(),
            "input_ids must be token ids in 0..64 (vocab_size), not 999",
        ),
        (
            "target 64",
            |b| b["targets"][1][2] = 64.into(),
            "targets must be token ids in 0..64 (vocab_size) or -100",
        ),
        (
            "ragged row",
            |b| {
                b["targets"][1].as_array_mut().unwrap().pop();
            },
            "targets must be 4 rows of 16 tokens",
        ),
        (
            "too long",
            |b| {
                for key in ["input_ids", "targets"] {
                    for row in b[key].as_array_mut().unwrap() {
                        row.as_array_mut().unwrap().extend([1.into(), 2.into()]);
                    }
                }
            },
            "input_ids must be rows of 1 to 16 tokens",
        ),
    ];
    for (what, edit, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        for file in ["init.safetensors", "expected.json"] {
            std::fs::copy(source.join(file), dir.path().join(file)).unwrap();
        }
        let mut bad = batch.clone();
        edit(&mut bad);
        std::fs::write(dir.path().join("batch.json"), bad.to_string()).unwrap();
        let err = verify::<Autodiff<Flex>>(dir.path(), &Default::default()).unwrap_err().to_string();
        assert!(err.contains("batch.json") && err.contains(expected), "{what}: {err}");
    }
}

/// Adds `factor` × its largest |value| to every element of the `target`-th float parameter.
struct Nudge {
    index: usize,
    target: usize,
    factor: f32,
}

impl ModuleMapper<Flex> for Nudge {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Flex, D>>) -> Param<Tensor<Flex, D>> {
        let (id, tensor, mapper) = param.consume();
        let hit = self.index == self.target;
        self.index += 1;
        let tensor = if hit {
            let largest = tensor.clone().abs().max().into_scalar();
            tensor.add_scalar(largest * self.factor)
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}
