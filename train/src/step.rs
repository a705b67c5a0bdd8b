//! `train_step`: one optimizer step, the six steps of the training iteration in order.

use std::time::{Duration, Instant};

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use ember_data::Batch;
use ember_model::{LanguageModel, Packing};

use crate::batch::to_tensors;
use crate::error::TrainError;
use crate::loss::nll_sum;
use crate::optim::{clip_grad_norm, scale_grads, AdamWGroups};
use crate::sync::{Contribution, GradSync};

/// What one optimizer step measured. Tensors stay on the device: reading them is a host sync,
/// done only at logging steps.
pub struct StepOutput<B: Backend> {
    /// Mean NLL of the global batch, nats/token: Σ NLL ÷ scored tokens of all micro-batches of
    /// all ranks.
    pub loss: Tensor<B, 1>,
    /// Global L2 norm of the (reduced) gradient before clipping.
    pub grad_norm: Tensor<B, 1>,
    /// Scored target positions in the global batch.
    pub scored_tokens: usize,
    /// Some rank asked to stop after this step (Ctrl-C, `q`): every rank stops.
    pub stop: bool,
    /// The parameter hashes compared in this step's exchange: `Some(true)` when every rank
    /// had the same parameters after the previous step.
    pub replicas_agree: Option<bool>,
    /// Time in the gradient exchange (including waiting for slower ranks).
    pub sync_time: Duration,
    /// Forward and backward passes (with a device sync when `timed`).
    pub forward_backward_time: Duration,
    /// Clipping and the AdamW update (with a device sync when `timed`).
    pub optimizer_time: Duration,
}

/// Per-step inputs besides the data.
#[derive(Clone, Copy, Debug)]
pub struct StepSettings {
    /// Optimizer step, from 1.
    pub step: u64,
    /// Learning rate of this step.
    pub lr: f64,
    /// Global-norm clip (0 = off).
    pub grad_clip: f64,
    /// This rank asks every rank to stop after this step.
    pub stop: bool,
    /// This rank's parameter hash (after the previous step), to compare across ranks.
    pub param_hash: Option<u64>,
    /// Wait for the device at the end of each phase, so their times are exact (costs a
    /// host sync: logging steps only).
    pub timed: bool,
}

impl StepSettings {
    /// Step `step` at learning rate `lr`, clipping at `grad_clip`: nothing to stop, no
    /// parameter hash to compare, phases untimed (a single worker's usual step).
    pub fn new(step: u64, lr: f64, grad_clip: f64) -> Self {
        Self { step, lr, grad_clip, stop: false, param_hash: None, timed: false }
    }
}

/// Steps 2–4 on one rank: for each micro-batch, forward, Σ NLL over its scored targets,
/// backward; gradients summed over micro-batches. Returns `∇ Σ NLL`, `Σ NLL` (nats, `[1]`) and
/// the scored-token count — not yet divided by the global count, which only the gradient
/// exchange knows.
pub fn accumulate<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    device: &B::Device,
) -> (GradientsParams, Tensor<B::InnerBackend, 1>, usize) {
    let mut accumulator = GradientsAccumulator::new();
    let mut nll_total: Option<Tensor<B::InnerBackend, 1>> = None;
    for batch in micro_batches {
        // 2. Forward: logits for every position (teacher forcing), [B, T, V]; rows that pack
        //    several documents attend within each document only when masking is on.
        // 3. Loss: Σ NLL over this micro-batch's scored targets (normalized after the sync).
        let nll = batch_nll(model, batch, device);
        // 4. Backward; Burn's accumulator sums the micro-steps' gradients.
        let grads = GradientsParams::from_grads(nll.backward(), model);
        accumulator.accumulate(model, grads);
        let detached = nll.inner();
        nll_total = Some(match nll_total {
            Some(sum) => sum + detached,
            None => detached,
        });
    }
    let nll = nll_total.unwrap_or_else(|| Tensor::zeros([1], device));
    (accumulator.grads(), nll, micro_batches.iter().map(Batch::scored_tokens).sum())
}

/// Steps 1–4 for a single worker, normalized: the gradient and the loss (nats/token, `[1]`)
/// of Σ NLL ÷ the scored tokens of all `micro_batches` — equal to the full batch's token-mean
/// loss and its gradient — and the scored-token count.
///
/// Errors: [`TrainError::NoScoredTokens`] when no target of any micro-batch is scored.
pub fn forward_backward<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    step: u64,
    device: &B::Device,
) -> Result<(GradientsParams, Tensor<B::InnerBackend, 1>, usize), TrainError> {
    let (mut grads, nll, tokens) = accumulate(model, micro_batches, device);
    if tokens == 0 {
        return Err(TrainError::NoScoredTokens { step });
    }
    scale_grads(model, &mut grads, 1.0 / tokens as f64);
    Ok((grads, nll / tokens as f64, tokens))
}

/// The gradient of the global batch's token-mean loss, identical on every rank.
pub struct GlobalGradients<B: AutodiffBackend> {
    /// `∇ (Σ NLL ÷ scored tokens)` over all micro-batches of all ranks.
    pub grads: GradientsParams,
    /// Mean NLL of the global batch, nats/token, `[1]`.
    pub loss: Tensor<B::InnerBackend, 1>,
    /// Scored target positions in the global batch.
    pub scored_tokens: usize,
    /// Some rank asked to stop after this step.
    pub stop: bool,
    /// `Some(true)` when the parameter hashes were compared and agreed.
    pub replicas_agree: Option<bool>,
    /// Time in the gradient exchange (including waiting for slower ranks).
    pub sync_time: Duration,
    /// Time of the forward and backward passes.
    pub forward_backward_time: Duration,
}

/// Steps 2–5 on one rank: forward, loss and backward over this rank's `micro_batches` with
/// nothing communicated, then one exchange that sums the gradients, Σ NLL and scored-token
/// counts of every rank (plus the stop flag and parameter hashes of `settings`), and the
/// normalization by the global batch's scored tokens — all micro-steps, all ranks — so the
/// result equals the full global batch's gradient even with uneven masks.
///
/// Errors: [`TrainError::NoScoredTokens`] when no target of the global batch is scored; the
/// exchange's errors (a rank failed, a timeout).
pub fn global_gradients<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    settings: &StepSettings,
    sync: &mut dyn GradSync<B>,
    device: &B::Device,
) -> Result<GlobalGradients<B>, TrainError> {
    let started = Instant::now();
    let (grads, nll_sum, tokens) = accumulate(model, micro_batches, device);
    if settings.timed {
        let _ = B::sync(device);
    }
    let forward_backward_time = started.elapsed();
    let started = Instant::now();
    let local = Contribution {
        grads,
        nll_sum,
        tokens: tokens as f64,
        stop: settings.stop,
        param_hash: settings.param_hash,
    };
    let global = sync.exchange(model, local)?;
    let sync_time = started.elapsed();
    let scored_tokens = global.tokens.round() as usize;
    if scored_tokens == 0 {
        return Err(TrainError::NoScoredTokens { step: settings.step });
    }
    let mut grads = global.grads;
    scale_grads(model, &mut grads, 1.0 / scored_tokens as f64);
    Ok(GlobalGradients {
        grads,
        loss: global.nll_sum / scored_tokens as f64,
        scored_tokens,
        stop: global.stop,
        replicas_agree: global.hashes_agree,
        sync_time,
        forward_backward_time,
    })
}

/// One optimizer step over this rank's `micro_batches` (one per accumulation step). Returns
/// the updated model.
///
/// Seed the backend before calling (dropout draws from it) to make the step reproducible.
///
/// Errors: as [`global_gradients`].
pub fn train_step<B: AutodiffBackend>(
    model: LanguageModel<B>,
    optimizer: &mut AdamWGroups<LanguageModel<B>, B>,
    micro_batches: &[Batch],
    settings: StepSettings,
    sync: &mut dyn GradSync<B>,
    device: &B::Device,
) -> Result<(LanguageModel<B>, StepOutput<B::InnerBackend>), TrainError> {
    // 1. Data: the caller drew this step's micro-batches from this rank's shard.
    // 2–4. Forward, loss, backward over the micro-batches; nothing is communicated.
    // 5. Gradient sync, once per optimizer step, and normalization by the global token count.
    let global = global_gradients(&model, micro_batches, &settings, sync, device)?;
    let mut grads = global.grads;
    // 6. Optimizer: clip by the global norm of the reduced gradient (the same on every rank),
    //    AdamW (decay on 2-D weights only) at this step's learning rate; the gradients are
    //    consumed, so nothing carries into the next step.
    let started = Instant::now();
    let grad_norm = clip_grad_norm(&model, &mut grads, settings.grad_clip);
    let model = optimizer.step(settings.lr, model, grads);
    if settings.timed {
        let _ = B::sync(device);
    }
    let optimizer_time = started.elapsed();
    let output = StepOutput {
        loss: global.loss,
        grad_norm,
        scored_tokens: global.scored_tokens,
        stop: global.stop,
        replicas_agree: global.replicas_agree,
        sync_time: global.sync_time,
        forward_backward_time: global.forward_backward_time,
        optimizer_time,
    };
    Ok((model, output))
}

/// Σ NLL (nats) over the scored targets of `batch`: forward (with document masking when the
/// batch carries segments) and [`nll_sum`]. A `[1]` tensor.
pub fn batch_nll<B: Backend>(model: &LanguageModel<B>, batch: &Batch, device: &B::Device) -> Tensor<B, 1> {
    let (inputs, targets) = to_tensors::<B>(batch, device);
    let logits = match &batch.segments {
        Some(segments) => {
            let packing = Packing::from_segments(segments, batch.batch_size, batch.seq_len, device);
            model.forward_packed(inputs, &packing)
        }
        None => model.forward(inputs),
    };
    nll_sum(logits, targets)
}
