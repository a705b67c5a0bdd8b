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
    /// A checkpoint could not be written (a full disk, a file-size limit, …): what was left
    /// and what to do are in `outcome` (the earlier checkpoints are untouched).
    #[error("cannot write checkpoint file {path}: {source}; {outcome}")]
    CheckpointWrite {
        /// The file or directory being written.
        path: PathBuf,
        /// The I/O error, e.g. "No space left on device (os error 28)".
        source: std::io::Error,
        /// Whether the checkpoint was saved, which one `latest` names, what to do.
        outcome: String,
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
    /// The run directory holds files a new run would write (`config.toml`, `metrics.jsonl`,
    /// …) that are not exactly what an earlier Ember run wrote there, such as the user's own
    /// config or an Ember config edited by hand.
    #[error(
        "{path} holds {files}, which no earlier Ember run wrote there as {} now (yours, or edited since) and a new run would overwrite: choose another --run-dir, or move {} away",
        if files.contains(", ") { "they are" } else { "it is" },
        if files.contains(", ") { "them" } else { "it" }
    )]
    RunDirForeign {
        /// The run directory.
        path: PathBuf,
        /// The files found, comma-separated.
        files: String,
    },
    /// Another training holds the run directory's lock.
    #[error("{run_dir} is in use by another training: {holder} holds {lock}; two trainings in one run directory would overwrite each other's files: wait for it to end, stop it, or choose another --run-dir")]
    RunDirLocked {
        /// The run directory.
        run_dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// `process PID on host HOST`.
        holder: String,
    },
    /// The data of a resumed run is not the data the run started on.
    #[error("{saved}: the data changed since the run started: {differences} (now {now}); resume on the run's own data (--data DIR) or start a new run")]
    DataChanged {
        /// The run's copy of its data's metadata (`RUN_DIR/data_meta.json`).
        saved: PathBuf,
        /// The metadata of the data given now (`DIR/meta.json`).
        now: PathBuf,
        /// What differs, `KEY was A, now B`, joined by `; `.
        differences: String,
    },
    /// The model and batch need more memory than is available (`check_memory`).
    #[error("{config}: {message}")]
    WontFit {
        /// The configuration: its file and overrides ([`crate::config::Origin::described`]).
        config: String,
        /// Bytes the run needs, by `ember estimate`'s accounting.
        needed_bytes: u64,
        /// Bytes available.
        available_bytes: u64,
        /// Both numbers, where they come from, and the keys to change.
        message: String,
    },
    /// A step had no scored target in its whole global batch: the loss would be 0/0.
    #[error("optimizer step {step}: the global batch has no scored tokens (every target is ignore_index)")]
    NoScoredTokens {
        /// The optimizer step.
        step: u64,
    },
    /// `ember replay` cannot replay the step asked for.
    #[error("replay: {0}")]
    Replay(String),
    /// The stability sentinel stopped the run (a checkpoint of the last good state was
    /// written at `step`).
    #[error("the stability sentinel stopped the run at step {step}: {reason}. The checkpoint of step {step} holds the weights of the last applied update (skipped steps leave them unchanged); if the evaluation above already shows a NaN loss, that update broke them and resuming will not help: start again with a lower optimizer.lr. The events are in {}; `ember replay --run {} --step {step}` shows a step's data and numbers. To go on past bad data: raise sentinel.max_skipped_steps and `ember train --resume {}`", run_dir.join("metrics.jsonl").display(), run_dir.display(), run_dir.display())]
    Unstable {
        /// The last step run.
        step: u64,
        /// Why it stopped.
        reason: String,
        /// The run directory.
        run_dir: std::path::PathBuf,
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
    /// A replica of a data-parallel burn-train strategy failed on its own (its step errored or
    /// panicked); every replica stops.
    #[error("data parallel: replica {rank} failed: {message}")]
    ReplicaFailed {
        /// The replica (rank) that failed.
        rank: usize,
        /// Its error.
        message: String,
    },
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
    /// A split with fewer rows than one batch (per rank, for the training split).
    #[error(
        "the {split} split has {} (packed windows or examples){}, fewer than one batch of {batch_size}: use a smaller micro_batch_size or model.block_size{}, or more data",
        crate::observe::words::count(*rows, "row"),
        if *ranks > 1 { format!(", {} for each of {ranks} ranks", rows / ranks) } else { String::new() },
        if *ranks > 1 { ", fewer ranks" } else { "" }
    )]
    SplitTooSmall {
        /// "train" or "val".
        split: &'static str,
        /// Rows (windows or examples) in the split.
        rows: usize,
        /// Rows per batch.
        batch_size: usize,
        /// Ranks sharing the split (1 for evaluation).
        ranks: usize,
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
    /// A combination of options Ember does not support, with what to use instead.
    #[error("{0}")]
    Unsupported(String),
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
