//! Evaluation: mean loss over a fixed set of batches, without autodiff.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use ember_data::{PreparedData, Split, WindowSampler};
use ember_model::LanguageModel;

use crate::batch::to_tensors;
use crate::error::TrainError;
use crate::loss::nll_sum;

/// Evaluation batch `k` is drawn as if it were step `EVAL_STEP_BASE + k`, a range training
/// never reaches, so train-split evaluation never reuses a training batch and every
/// evaluation of a run sees the same batches (curves compare like with like).
pub const EVAL_STEP_BASE: u64 = 1 << 62;

/// Mean NLL in nats/token over `batches` batches of `batch_size` windows of `split`:
/// Σ NLL over all scored targets ÷ their number. Pass an inner-backend model
/// (`AutodiffModule::valid`) so no graph is recorded and dropout is off.
///
/// Errors: the split holds fewer than `block_size + 1` tokens.
pub fn evaluate<B: Backend>(
    model: &LanguageModel<B>,
    data: &PreparedData,
    split: Split,
    sampler: &WindowSampler,
    batches: usize,
    batch_size: usize,
    device: &B::Device,
) -> Result<f64, TrainError> {
    let mut nll: Option<Tensor<B, 1>> = None;
    let mut tokens = 0usize;
    for k in 0..batches as u64 {
        let batch = sampler.batch(data.stream(split), split, EVAL_STEP_BASE + k, 0, 0, batch_size)?;
        tokens += batch.scored_tokens();
        let (inputs, targets) = to_tensors::<B>(&batch, device);
        let sum = nll_sum(model.forward(inputs), targets);
        nll = Some(match nll {
            Some(total) => total + sum,
            None => sum,
        });
    }
    let total: f64 = nll.map_or(0.0, |t| t.into_scalar().elem());
    Ok(total / tokens.max(1) as f64)
}
