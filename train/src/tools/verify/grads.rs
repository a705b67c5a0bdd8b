//! Per-tensor gradient parity (like llm.c's test against PyTorch): Ember's gradient of every
//! parameter at the fixture's initial weights beside the fixture's `init_grads.safetensors`,
//! so a mismatch names its tensor instead of only moving the global norm.

use std::path::Path;

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use ember_model::{hf, LanguageModel};

use super::Check;
use crate::error::TrainError;

/// The fixture file with PyTorch's gradients of the mean loss at the initial weights, named
/// and shaped as `init.safetensors`.
pub const FILE: &str = "init_grads.safetensors";

/// One check per parameter tensor, in the model's order: `diff` is the largest element-wise
/// difference divided by the largest |value| of the fixture's gradient of that tensor (a
/// tensor's rounding scales with its largest entries, not with each element; at most
/// `tolerance`), NaN when either
/// gradient has a non-finite value; `ember` and `expected` are the two gradients' L2 norms.
///
/// `model` is a fresh model of the fixture's config (it fixes names and shapes) and `grads`
/// Ember's gradients at the fixture's initial weights on its full batch.
///
/// Errors: the file is unreadable or not a file, or its tensors do not match the model's (each
/// missing, unexpected or mis-shaped tensor named).
pub fn checks<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    grads: &GradientsParams,
    path: &Path,
    tolerance: f64,
) -> Result<Vec<Check>, TrainError> {
    let expected = hf::named_tensors(&hf::load(model.clone(), path)?)?;
    let ours = hf::named_tensors(&model.clone().map(&mut GradsAsWeights { grads }))?;
    let mut checks = Vec::new();
    for ((name, ours), (_, theirs)) in ours.into_iter().zip(expected) {
        let values = |data: burn::tensor::TensorData| {
            data.convert::<f64>()
                .to_vec::<f64>()
                .map_err(|e| TrainError::BadFile { path: path.into(), message: format!("{name}: {e:?}") })
        };
        let (a, b) = (values(ours)?, values(theirs)?);
        let max_diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        // `f64::max` skips NaN: a non-finite value on either side makes the check NaN (failed).
        let finite = a.iter().chain(&b).all(|v| v.is_finite());
        let diff = match (finite, scale > 0.0) {
            (false, _) => f64::NAN,
            (true, true) => max_diff / scale,
            (true, false) => max_diff,
        };
        checks.push(Check {
            name: format!("grad {name}"),
            ember: norm(&a),
            expected: norm(&b),
            diff,
            tolerance,
            kind: "elementwise",
            ok: diff <= tolerance,
        });
    }
    Ok(checks)
}

/// Replaces each parameter's value with its gradient (zeros where there is none), so the
/// gradients can be named and laid out as the weights are.
struct GradsAsWeights<'a> {
    grads: &'a GradientsParams,
}

impl<B: AutodiffBackend> ModuleMapper<B> for GradsAsWeights<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let grad = match self.grads.get::<B::InnerBackend, D>(id) {
            Some(grad) => Tensor::from_inner(grad),
            None => tensor.zeros_like(),
        };
        Param::from_mapped_value(id, grad, mapper)
    }
}
