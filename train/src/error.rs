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
    /// A file's contents are not what was expected (e.g. a parity fixture's field).
    #[error("{path}: {message}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong and what was expected.
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
    /// Another rank stopped with an error: this one stops too. The other rank's own error is
    /// the cause; this is the reaction to it.
    #[error(
        "data parallel: rank {rank} stopped with an error (see its message); stopping rank {this_rank} too"
    )]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
        /// The rank reporting it.
        this_rank: usize,
    },
    /// The exchange with the other ranks failed or timed out (a rank stopped or disconnected).
    #[error("data parallel: rank {rank}: {message}")]
    Exchange {
        /// The rank reporting it.
        rank: usize,
        /// What failed, and while doing what.
        message: String,
    },
    /// The replicas' parameters (or the settings they share) differed at a comparison.
    #[error("data parallel: the replicas' parameters or run settings differed before step {step}: a rank diverged or was started with other settings (rank {rank} stops)")]
    ReplicasDiffer {
        /// The optimizer step about to run when the hashes were compared.
        step: u64,
        /// The rank reporting it.
        rank: usize,
    },
    /// A port that burn-collective's servers need is taken, or their runtime cannot start.
    #[error("data parallel: {0}")]
    Network(String),
    /// A failure injected on purpose by [`crate::parallel::FaultInjector`] (tests only).
    #[error("rank {rank}: failure injected at step {step}")]
    InjectedFault {
        /// The failing rank.
        rank: usize,
        /// The optimizer step it failed at.
        step: u64,
    },
    /// An evaluation whose batches have no scored target: the loss would be 0/0.
    #[error("no scored target in {batches} evaluation batches of {batch_size}: every example's response lies beyond block_size (raise model.block_size) or is empty")]
    NoEvalTokens {
        /// Batches evaluated.
        batches: usize,
        /// Rows per batch.
        batch_size: usize,
    },
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
    /// Whether this is a rank's reaction to another rank's failure (a peer failed, the
    /// exchange broke, the replicas differ) rather than a cause of its own: with several
    /// ranks, the cause is what gets reported, and only a cause is passed on to the others.
    pub fn is_reaction(&self) -> bool {
        matches!(
            self,
            TrainError::PeerFailed { .. } | TrainError::Exchange { .. } | TrainError::ReplicasDiffer { .. }
        )
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TrainError {
        let path = path.into();
        move |source| TrainError::Io { path, source }
    }
}
