//! The gradient exchange as the step sees it: [`GradSync`] sums each rank's [`Contribution`]
//! over all data-parallel ranks. [`Solo`] is the single worker; burn-collective's
//! implementation lives in [`crate::parallel`].

use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use ember_model::LanguageModel;

use crate::error::TrainError;

/// One rank's share of an optimizer step.
pub struct Contribution<B: AutodiffBackend> {
    /// `∇ Σ NLL` summed over this rank's micro-batches.
    pub grads: GradientsParams,
    /// `Σ NLL` (nats), `[1]`.
    pub nll_sum: Tensor<B::InnerBackend, 1>,
    /// Scored tokens of this rank's micro-batches.
    pub tokens: u64,
    /// This rank asks every rank to stop after this step.
    pub stop: bool,
    /// This rank asks for a checkpoint after this step (the dashboard's `c`), which every rank
    /// takes part in when the optimizer state is sharded.
    pub checkpoint: bool,
    /// This rank's parameter hash, when replicas are checked at this step.
    pub param_hash: Option<u64>,
}

/// The sums over all ranks.
pub struct Exchanged<B: AutodiffBackend> {
    /// Σ over ranks of `∇ Σ NLL`.
    pub grads: GradientsParams,
    /// Σ over ranks of `Σ NLL`, `[1]`.
    pub nll_sum: Tensor<B::InnerBackend, 1>,
    /// Scored tokens of the global batch (exact: exchanged as integers).
    pub tokens: u64,
    /// Some rank asked to stop.
    pub stop: bool,
    /// Some rank asked for a checkpoint after this step.
    pub checkpoint: bool,
    /// `Some(agree)` when hashes were compared in this exchange.
    pub hashes_agree: Option<bool>,
}

/// Sums contributions over data-parallel ranks.
pub trait GradSync<B: AutodiffBackend> {
    /// This rank, from 0.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Sums `local` with every other rank's (one collective call).
    ///
    /// Errors: another rank failed (named); the exchange timed out; the collective failed.
    fn exchange(
        &mut self,
        model: &LanguageModel<B>,
        local: Contribution<B>,
    ) -> Result<Exchanged<B>, TrainError>;
    /// All-gathers a `[num_params]` buffer in which this rank filled the slots it owns and
    /// −0.0 everywhere else (ZeRO-1, [`super::shard`]): the sum over all ranks, so every rank
    /// receives every owner's values exactly. One collective call, the size of an exchange.
    ///
    /// Errors: as [`Self::exchange`].
    fn gather(
        &mut self,
        buffer: Tensor<B::InnerBackend, 1>,
    ) -> Result<Tensor<B::InnerBackend, 1>, TrainError>;
    /// Tells the other ranks that this rank failed, so they stop instead of waiting for it
    /// (`num_params`: the model's parameter count, the size of the exchange).
    fn abort(&mut self, num_params: usize);
    /// Gradient all-reduces done so far.
    fn all_reduce_calls(&self) -> usize;
    /// Bytes all-reduced per exchange for a model of `num_params` parameters (0 for a single
    /// worker).
    fn bytes_per_exchange(&self, num_params: usize) -> usize;
    /// The all-reduce strategy, in words.
    fn strategy(&self) -> String;
    /// Leaves the group at the end of a run (after this rank's last exchange).
    fn finish(&mut self) {}
}

/// A single worker: nothing to exchange.
pub struct Solo;

impl<B: AutodiffBackend> GradSync<B> for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn exchange(&mut self, _: &LanguageModel<B>, local: Contribution<B>) -> Result<Exchanged<B>, TrainError> {
        Ok(Exchanged {
            grads: local.grads,
            nll_sum: local.nll_sum,
            tokens: local.tokens,
            stop: local.stop,
            checkpoint: local.checkpoint,
            hashes_agree: local.param_hash.map(|_| true),
        })
    }
    fn gather(
        &mut self,
        buffer: Tensor<B::InnerBackend, 1>,
    ) -> Result<Tensor<B::InnerBackend, 1>, TrainError> {
        Ok(buffer)
    }
    fn abort(&mut self, _: usize) {}
    fn all_reduce_calls(&self) -> usize {
        0
    }
    fn bytes_per_exchange(&self, _: usize) -> usize {
        0
    }
    fn strategy(&self) -> String {
        "none (1 rank)".into()
    }
}
