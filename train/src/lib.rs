//! # ember-train
//!
//! Ember's training loop on Burn: [`step::optimizer_step`] runs the six steps of an LLM
//! training iteration — data, forward, loss, backward, gradient sync, optimizer — with the
//! semantics PyTorch users expect and Burn 0.21's own pieces get wrong: the loss is Σ NLL ÷
//! scored tokens of the *global* batch ([`step::loss`]), clipping uses the *global* gradient
//! norm and AdamW decays only 2-D weights ([`step::optim`]), the learning rate advances once
//! per optimizer step ([`step::schedule`]), and checkpoints resume bit-exactly
//! ([`persist::checkpoint`]).
//!
//! ## Map (each folder may use only those above it)
//!
//! | folder | holds |
//! | --- | --- |
//! | [`config`] | the run configuration: schema, presets, `--set`, checks, vocabulary |
//! | [`observe`] | metrics records, memory/FLOP accounting, device and host memory |
//! | [`step`] | the optimizer step and its parts: loss, AdamW groups, clipping, schedule, eval |
//! | [`parallel`] | data parallelism on burn-collective: the exchange, hashes, fault injection |
//! | [`persist`] | checkpoints and the run directory's files |
//! | [`runner`] | a whole run: set-up, replicas, the loop, its meter, the data feed |
//! | [`tools`] | bench, verify, eval, sample, export, backend choice |
//! | [`learner`] | the step as a burn-train strategy (feature `burn-train`) |
//!
//! [`error`] sits beside them all.
#![warn(missing_docs)]

pub mod config;
pub mod error;
#[cfg(feature = "burn-train")]
pub mod learner;
pub mod observe;
pub mod parallel;
pub mod persist;
pub mod runner;
pub mod step;
pub mod tools;

pub use config::{BackendKind, CheckpointingKind, ConfigError, OptimizerConfig, PrecisionKind, RunConfig};
pub use error::TrainError;
pub use runner::controls::Controls;
pub use runner::{train, RunOptions, RunSummary};
pub use tools::backend::{run_on, BackendTask};
