//! Errors of training, evaluation and sampling.

use std::path::PathBuf;

use crate::config::ConfigError;

/// Everything that can stop a run, each naming the file, key or step involved.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Bad or missing prepared data.
    #[error(transparent)]
    Data(#[from] ember_data::DataError),
    /// A file or directory of the run could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A checkpoint or run directory is missing, incomplete or inconsistent.
    #[error("{path}: {message}")]
    Checkpoint {
        /// The checkpoint or run directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The run directory already holds a run.
    #[error("{path} already holds a run (it has {found}); continue it with `ember train --resume {path}` or choose another --run-dir")]
    RunDirTaken {
        /// The run directory.
        path: PathBuf,
        /// What was found there.
        found: String,
    },
    /// A step had no scored target in its whole global batch: the loss would be 0/0.
    #[error("optimizer step {step}: the global batch has no scored tokens (every target is ignore_index)")]
    NoScoredTokens {
        /// The optimizer step.
        step: u64,
    },
    /// The loss or gradient norm stopped being finite.
    #[error("optimizer step {step}: {what} is {value} (diverged); lower optimizer.lr or check the data")]
    NonFinite {
        /// The optimizer step.
        step: u64,
        /// `loss` or `grad norm`.
        what: &'static str,
        /// The value.
        value: f64,
    },
    /// Hugging Face weights could not be read, written, or do not fit the model.
    #[error(transparent)]
    Weights(#[from] ember_model::hf::HfError),
    /// Data-parallel ranks could not exchange gradients, or one of them failed.
    #[error("data parallel: {0}")]
    Sync(String),
    /// The background batch builder failed.
    #[error("data feed: {0}")]
    Feed(String),
    /// The requested backend is unavailable.
    #[error("backend: {0}")]
    Backend(String),
    /// Sampling input is invalid (e.g. a prompt longer than allowed).
    #[error("{0}")]
    Sample(String),
}

impl TrainError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TrainError {
        let path = path.into();
        move |source| TrainError::Io { path, source }
    }
}
