//! # config — what a run is told to do
//!
//! One TOML file (`examples/*.toml`), `--set key=value` overrides, the `[model]` table resolved
//! from a typed preset, and checks whose errors name the file, the key and what was expected.
//!
//! - [`schema`]: every key, its default and unit ([`RunConfig`], [`OptimizerConfig`]);
//! - [`parallel`]: `devices` and `[parallel]`, with the parsed [`HostPort`];
//! - [`sentinel`]: `[sentinel]`, what non-finite steps and loss spikes do;
//! - `model`, `load`, `validate`, `vocab`: reading, checking, and settling the vocabulary;
//! - [`error`] holds [`ConfigError`].
//!
//! May use: `ember-model` (model configs and presets), `ember-data` (tokenizer names, the
//! prepared data's vocabulary). Nothing else of this crate.

pub mod error;
mod load;
mod model;
pub mod parallel;
pub mod schema;
pub mod sentinel;
mod validate;
mod vocab;

pub use error::ConfigError;
pub use parallel::{Devices, HostPort, ParallelConfig, Strategy};
pub use schema::{
    BackendKind, CheckpointingKind, OptimizerConfig, Origin, Override, PrecisionKind, RunConfig, VocabSource,
};
pub use sentinel::{OnNonFinite, SentinelConfig, SpikeAction};

#[cfg(test)]
mod tests;
