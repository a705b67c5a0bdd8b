//! # learner — Ember's step under burn-train
//!
//! [`EmberStrategy`] is a burn-train
//! `SupervisedLearningStrategy`, so a Burn user's `SupervisedTraining` (metrics, renderer,
//! checkpointer, interrupter, early stopping) runs Ember's optimizer step — token-weighted
//! loss over all micro-batches, global-norm clipping, one learning-rate step per optimizer
//! step — instead of burn-train's own loop, which steps the learning rate per micro-batch,
//! averages per-batch means and drops a partial accumulation window (see `ember_train`'s
//! crate docs).
//!
//! The pieces: [`EmberLm`] (the model as a burn-train `TrainStep`/`InferenceStep`),
//! [`WindowBatcher`] (Ember's rows into host-side [`ember_data::Batch`]es for Burn's `DataLoader`),
//! [`LmOutput`] (what each step reports) and two numeric metrics burn-train lacks,
//! [`TokensPerSecondMetric`] and [`GradNormMetric`]. Loss and learning rate use burn-train's
//! own `LossMetric` and `LearningRateMetric`. `examples/burn_train.rs` shows it end to end.
//!
//! With several devices [`EmberStrategy`] runs data-parallel replicas on threads, through the
//! exchange of [`crate::parallel`] (`replicas`).
//!
//! May use: [`crate::step`] (the optimizer step, its loss), [`crate::parallel`] (the exchange).
//! Behind the `burn-train` feature.

pub mod metrics;
pub mod model;
mod replicas;
pub mod strategy;

pub use metrics::{GradNormInput, GradNormMetric, TokensInput, TokensPerSecondMetric};
pub use model::{EmberLm, LmOutput, LmStats, WindowBatcher};
pub use strategy::{EmberComponents, EmberStrategy};
