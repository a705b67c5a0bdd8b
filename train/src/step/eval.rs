//! Evaluation: mean loss over a fixed set of batches, without autodiff.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use ember_data::{DataView, EpochSampler, SamplerState};
use ember_model::LanguageModel;

use super::train_step::batch_nll;
use crate::error::TrainError;

/// Mean NLL in nats/token over `batches` batches of `batch_size` rows of `view`: Σ NLL over
/// all scored targets ÷ their number. The batches are the first of `seed`'s epoch-0 order, so
/// every evaluation of a run sees the same rows (curves compare like with like). Pass an
/// inner-backend model (`AutodiffModule::valid`) so no graph is recorded and dropout is off.
///
/// Errors: the split has fewer rows than `batch_size`.
pub fn evaluate<B: Backend>(
    model: &LanguageModel<B>,
    view: &DataView,
    seed: u64,
    batches: usize,
    batch_size: usize,
    device: &B::Device,
) -> Result<f64, TrainError> {
    let mut sampler = EpochSampler::new(seed, view.len(), 0, 1, batch_size)?;
    let mut state = SamplerState::default();
    let mut nll: Option<Tensor<B, 1>> = None;
    let mut tokens = 0usize;
    for _ in 0..batches {
        let batch = view.batch(&sampler.next(&mut state)?)?;
        tokens += batch.scored_tokens();
        let sum = batch_nll(model, &batch, device);
        nll = Some(match nll {
            Some(total) => total + sum,
            None => sum,
        });
    }
    if tokens == 0 {
        return Err(TrainError::NoEvalTokens { batches, batch_size });
    }
    let total: f64 = nll.map_or(0.0, |t| t.into_scalar().elem());
    Ok(total / tokens as f64)
}
