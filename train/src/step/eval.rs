//! Evaluation: mean loss over a fixed set of batches, without autodiff.

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use ember_data::{DataView, EpochSampler, SamplerState};
use ember_model::LanguageModel;

use super::train_step::batch_nll;
use crate::error::TrainError;

/// A mean loss and the batches it was taken over.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// Mean NLL, nats/token.
    pub nats: f64,
    /// Batches evaluated: those asked for, at most the split's (see [`evaluate`]).
    pub batches: usize,
}

/// The batches [`evaluate`] runs when `wanted` are asked for on a split of `rows` rows:
/// `min(wanted, ⌊rows / batch_size⌋)`. Past one pass over the split, more batches would only
/// repeat rows (the mean of a full pass is already the split's exact loss).
pub fn eval_batches(wanted: usize, rows: usize, batch_size: usize) -> usize {
    wanted.min(rows / batch_size.max(1))
}

/// Errors ([`TrainError::SplitTooSmall`]) unless `view` holds a batch of `batch_size` rows for
/// each of `ranks` ranks.
pub fn require_batch(view: &DataView, batch_size: usize, ranks: usize) -> Result<(), TrainError> {
    if view.len() / ranks >= batch_size {
        return Ok(());
    }
    Err(TrainError::SplitTooSmall { split: view.split().name(), rows: view.len(), batch_size, ranks })
}

/// Mean NLL in nats/token over [`eval_batches`] batches of `batch_size` rows of `view`: Σ NLL
/// over all scored targets ÷ their number. The batches are the first of `seed`'s epoch-0
/// order, so every evaluation of a run sees the same rows (curves compare like with like), and
/// no row is seen twice. Pass an inner-backend model (`AutodiffModule::valid`) so no graph is
/// recorded and dropout is off.
///
/// Errors: [`TrainError::SplitTooSmall`] when the split has fewer rows than `batch_size`;
/// [`TrainError::NoEvalTokens`] when no target is scored.
pub fn evaluate<B: Backend>(
    model: &LanguageModel<B>,
    view: &DataView,
    seed: u64,
    batches: usize,
    batch_size: usize,
    device: &B::Device,
) -> Result<Evaluation, TrainError> {
    require_batch(view, batch_size, 1)?;
    let mut sampler = EpochSampler::new(seed, view.len(), 0, 1, batch_size)?;
    let batches = eval_batches(batches, view.len(), batch_size);
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
    Ok(Evaluation { nats: total / tokens as f64, batches })
}
