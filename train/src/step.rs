//! `train_step`: one optimizer step, the six steps of the training iteration in order.

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use ember_data::Batch;
use ember_model::{LanguageModel, Packing};

use crate::batch::to_tensors;
use crate::error::TrainError;
use crate::loss::nll_sum;
use crate::optim::{clip_grad_norm, AdamWGroups};

/// What one optimizer step measured. Tensors stay on the device: reading them is a host sync,
/// done only at logging steps.
pub struct StepOutput<B: burn::tensor::backend::Backend> {
    /// Mean NLL of the global batch, nats/token: Σ NLL ÷ scored tokens of all micro-batches.
    pub loss: Tensor<B, 1>,
    /// Global L2 norm of the gradient before clipping.
    pub grad_norm: Tensor<B, 1>,
    /// Scored target positions in the global batch.
    pub scored_tokens: usize,
}

/// Steps 1–4 of the iteration: for each micro-batch, forward, loss ÷ the global batch's
/// scored-token count, backward; gradients summed over micro-batches. Returns the summed
/// gradients (equal to the full global batch's gradient of its token-mean loss), the loss
/// (nats/token, `[1]`) and the number of scored tokens.
///
/// Errors: [`TrainError::NoScoredTokens`] when no target of any micro-batch is scored.
pub fn forward_backward<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    step: u64,
    device: &B::Device,
) -> Result<(GradientsParams, Tensor<B::InnerBackend, 1>, usize), TrainError> {
    // 1. Data: the caller drew this step's micro-batches (a pure function of seed and step).
    //    The loss is normalized by the scored tokens of the *global* batch — all micro-steps
    //    (and, with data parallelism, all ranks) — so that the accumulated gradient equals the
    //    full-batch gradient even when masks are uneven.
    let scored_tokens: usize = micro_batches.iter().map(Batch::scored_tokens).sum();
    if scored_tokens == 0 {
        return Err(TrainError::NoScoredTokens { step });
    }
    let mut accumulator = GradientsAccumulator::new();
    let mut loss_sum: Option<Tensor<B::InnerBackend, 1>> = None;
    for batch in micro_batches {
        // 2. Forward: logits for every position (teacher forcing), [B, T, V]; rows that pack
        //    several documents attend within each document only when masking is on.
        // 3. Loss: this micro-batch's Σ NLL over its scored targets ÷ the global count.
        let loss = batch_nll(model, batch, device) / scored_tokens as f64;
        // 4. Backward; Burn's accumulator sums the micro-steps' gradients, which is right
        //    because each loss is already divided by the global token count.
        let grads = GradientsParams::from_grads(loss.backward(), model);
        accumulator.accumulate(model, grads);
        let detached = loss.inner();
        loss_sum = Some(match loss_sum {
            Some(sum) => sum + detached,
            None => detached,
        });
    }
    let loss = loss_sum.expect("at least one micro-batch, since scored_tokens > 0");
    Ok((accumulator.grads(), loss, scored_tokens))
}

/// One optimizer step over `micro_batches` (one per accumulation step), with learning rate
/// `lr` and global-norm clip `grad_clip` (0 = off). Returns the updated model.
///
/// Seed the backend before calling (dropout draws from it) to make the step reproducible.
///
/// Errors: [`TrainError::NoScoredTokens`] when no target of any micro-batch is scored.
pub fn train_step<B: AutodiffBackend>(
    model: LanguageModel<B>,
    optimizer: &mut AdamWGroups<LanguageModel<B>, B>,
    micro_batches: &[Batch],
    step: u64,
    lr: f64,
    grad_clip: f64,
    device: &B::Device,
) -> Result<(LanguageModel<B>, StepOutput<B::InnerBackend>), TrainError> {
    // 1–4. Data, forward, loss, backward (see `forward_backward`).
    let (mut grads, loss, scored_tokens) = forward_backward(&model, micro_batches, step, device)?;
    // 5. Gradient sync: a single worker has nothing to all-reduce.
    // 6. Optimizer: clip by the global norm, AdamW (decay on 2-D weights only) at this step's
    //    learning rate; the gradients are consumed, so nothing carries into the next step.
    let grad_norm = clip_grad_norm(&model, &mut grads, grad_clip);
    let model = optimizer.step(lr, model, grads);
    Ok((model, StepOutput { loss, grad_norm, scored_tokens }))
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
