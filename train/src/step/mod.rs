//! # step — one optimizer step and what it is made of
//!
//! [`optimizer_step`] runs the six steps of the training iteration in order — data, forward,
//! loss, backward, gradient sync, optimizer — and is the only implementation of the step:
//! `ember train`'s loop, `ember bench`, `ember verify` and the burn-train strategy all call it.
//!
//! - [`train_step`](mod@train_step): the step, [`StepTarget`] (what it updates), [`global_gradients`];
//! - [`loss`]: Σ NLL over the scored targets (the mean is taken over the *global* batch);
//! - [`optim`]: AdamW in two decay groups; [`adamw`]: the fused update; [`clip`]: scaling and
//!   global-norm clipping of the gradients (parallel over tensors on burn-flex);
//! - [`schedule`]: warmup + cosine, advanced once per optimizer step;
//! - [`sentinel`]: the stability sentinel (non-finite steps skipped, loss spikes);
//!   [`device_sentinel`]: the same rules on the device, gating the update without a host read;
//! - [`shard`]: ZeRO-1, the AdamW state sharded across ranks (`[parallel] shard_optimizer`);
//! - [`sync`]: the gradient exchange as the step sees it ([`GradSync`], [`Solo`]);
//! - [`batch`], [`eval`]: host batches to tensors; the validation loss;
//! - [`init`]: the seeded initial weights, drawn on the CPU whatever the backend;
//! - [`worker`]: a single-rank loop run on one of rayon's worker threads.
//!
//! May use: [`crate::config`], [`crate::observe`], [`crate::error`]. Knows no ranks' transport
//! (that is [`crate::parallel`]), no files and no run loop.

pub mod adamw;
pub mod batch;
pub mod clip;
pub mod device_sentinel;
pub mod eval;
pub mod init;
pub mod loss;
pub mod optim;
#[cfg(test)]
mod precision_tests;
pub mod scaler;
pub mod schedule;
pub mod sentinel;
pub mod shard;
pub mod sync;
pub mod train_step;
pub mod worker;

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};

pub use device_sentinel::{DeviceSentinel, Settled};
pub use scaler::LossScaler;
pub use sentinel::{Anomaly, Judgement, Sentinel, SentinelState};
pub use sync::{Contribution, Exchanged, GradSync, Solo};
pub use train_step::{
    accumulate, accumulate_in, batch_nll, forward_backward, global_gradients, loss_multiplier,
    optimizer_step, train_step, train_step_judged_on_device, GlobalGradients, Passes, StepOutput,
    StepSettings, StepTarget, Trainee,
};

/// The value of a `[1]` tensor, read back to the host (a device sync).
pub fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    t.into_scalar().elem()
}
