//! # ember-train
//!
//! Ember's training loop on Burn: [`step::train_step`] runs the six steps of an LLM training
//! iteration — data, forward, loss, backward, gradient sync, optimizer — with the semantics
//! PyTorch users expect and Burn 0.21's own pieces get wrong: the loss is Σ NLL ÷ scored
//! tokens of the *global* batch ([`loss`]), clipping uses the *global* gradient norm and AdamW
//! decays only 2-D weights ([`optim`]), the learning rate advances once per optimizer step
//! ([`schedule`]), and checkpoints resume bit-exactly ([`checkpoint`]).
#![warn(missing_docs)]

pub mod accounting;
pub mod backend;
pub mod batch;
pub mod bench;
pub mod checkpoint;
pub mod commands;
pub mod config;
pub mod controls;
pub mod device_memory;
pub mod error;
pub mod eval;
pub mod feed;
pub mod fsutil;
#[cfg(feature = "burn-train")]
pub mod learner;
pub mod loss;
pub mod metrics;
pub mod optim;
pub mod parallel;
pub mod replica;
pub mod run;
pub mod sample;
pub mod schedule;
pub mod step;
pub mod sync;
pub mod trained;
pub mod verify;

pub use backend::{run_on, BackendTask};
pub use config::{BackendKind, OptimizerConfig, RunConfig};
pub use error::TrainError;
pub use run::{train, RunOptions, RunSummary};
