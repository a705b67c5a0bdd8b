//! # runner — a training run from start to finish
//!
//! [`train`] sets the run up ([`setup`]: devices, data — opened or prepared by `run_data` —,
//! vocabulary, model, resume checks, run files), starts one replica per device ([`replica`]:
//! the loop body, logging through a `meter`), and reports how the run ended. [`feed`] builds
//! each rank's batches ahead on a background thread; [`controls`] carries stop, checkpoint and
//! pause requests from other threads (Ctrl-C, the dashboard); [`lock`] keeps a second training
//! out of the run directory.
//!
//! May use: everything before it — [`crate::config`], [`crate::observe`], [`crate::step`],
//! [`crate::parallel`], [`crate::persist`].

pub mod controls;
pub mod feed;
mod judge;
pub mod lock;
mod meter;
mod replica;
mod run_data;
mod same_data;
mod setup;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use ember_data::PreparedData;
use ember_model::LanguageModel;

use crate::config::RunConfig;
use crate::error::TrainError;
use crate::observe::metrics::MetricsLog;
use crate::observe::words::count;
use crate::parallel::{FaultInjector, Faults, Group};
use crate::persist::{checkpoint, files};
use crate::step::optim::AdamWGroups;
use crate::step::schedule::LrSchedule;
use crate::step::shard::{OptimizerShard, Partition};
use crate::step::{GradSync, Solo};
use controls::Controls;
use feed::Feed;
pub use replica::step_seed;
use replica::{run_replica, Leader, Plan, Replica, ReplicaReport};

/// What to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The resolved configuration (for a resume: `RUN_DIR/config.toml` plus `--set`s).
    pub config: RunConfig,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Continue the run in `run_dir` from its latest checkpoint.
    pub resume: bool,
    /// Stop (e.g. Ctrl-C), checkpoint-now and pause requests.
    pub controls: Arc<Controls>,
    /// The caller runs burn-collective's orchestrators itself (the CLI starts them in a child
    /// process), so node 0 does not start them in-process.
    pub coordinator_elsewhere: bool,
    /// Faults to inject (tests of failure handling; none by default).
    pub faults: Faults,
    /// A new run given a text file as `data` may replace `RUN_DIR/data` prepared from another
    /// text (`ember train --force`); without it that is refused.
    pub force: bool,
}

impl RunOptions {
    /// A new run of `config` in `run_dir`: not a resume, no requests, no faults.
    pub fn new(config: RunConfig, run_dir: impl Into<PathBuf>) -> Self {
        Self {
            config,
            run_dir: run_dir.into(),
            resume: false,
            controls: Arc::default(),
            coordinator_elsewhere: false,
            faults: Faults::default(),
            force: false,
        }
    }

    /// Continues the run in `run_dir` from its latest checkpoint instead.
    pub fn resuming(mut self) -> Self {
        self.resume = true;
        self
    }

    /// Takes stop, checkpoint and pause requests from `controls`.
    pub fn with_controls(mut self, controls: Arc<Controls>) -> Self {
        self.controls = controls;
        self
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSummary {
    /// Optimizer steps completed.
    pub steps: u64,
    /// Validation loss of the last evaluation (nats/token).
    pub final_val_loss: Option<f64>,
    /// Wall-clock seconds of this session.
    pub wall_s: f64,
    /// Wall-clock seconds of the whole run, all sessions.
    pub elapsed_s: f64,
    /// Mean training throughput of this session, tokens/s of step time.
    pub tokens_per_sec: f64,
    /// True when stopped before `max_steps` (a checkpoint was written).
    pub stopped_early: bool,
    /// True when a resume found the run already at `max_steps` (or beyond): nothing was
    /// trained and nothing in the run directory changed; `steps` is the checkpoint's step.
    pub already_finished: bool,
}

/// Trains (or resumes) a run on backend `B` with one replica per device of `devices` (empty:
/// `devices` default devices of the config) and `parallel.nodes` processes; `log` receives
/// every human-readable line (node 0 only).
///
/// A resume whose checkpoint is already at `max_steps` trains nothing, changes nothing in the
/// run directory and returns [`RunSummary::already_finished`] (a requeued job that was
/// preempted just after its last checkpoint succeeds).
///
/// Errors: bad data or configuration, a run directory that already holds a run (without
/// `resume`) or that another training holds ([`TrainError::RunDirLocked`]), a missing or
/// inconsistent checkpoint or other data (with `resume`: [`TrainError::DataChanged`]), a model
/// too large for the memory ([`TrainError::WontFit`]), I/O failures, a diverged loss, a failed
/// or unreachable rank.
pub fn train<B: AutodiffBackend>(
    options: RunOptions,
    devices: Vec<B::Device>,
    log: &mut dyn FnMut(&str),
) -> Result<RunSummary, TrainError> {
    let RunOptions { mut config, run_dir, resume, controls, coordinator_elsewhere, faults, force } = options;
    let session = Instant::now();
    let devices = setup::devices::<B>(&config, devices)?;
    // This process writes the run directory: it holds its lock until the run ends, taken
    // before anything in the directory changes.
    let leads = config.parallel.node_rank == 0;
    // The run directory and the parents that this run creates.
    let created: Vec<PathBuf> = if leads {
        run_dir
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .map(PathBuf::from)
            .collect()
    } else {
        Vec::new()
    };
    let mut lock = if leads { Some(lock::RunLock::acquire(&run_dir, log)?) } else { None };
    let setup = setup::Setup { resume, leads, force };
    let (data, setup::Start { model, state, resume_dir, val_note }) =
        match setup::start::<B>(&mut config, &run_dir, setup, &devices[0], log) {
            Ok(setup::Begun::Run(data, start)) => (data, *start),
            Ok(setup::Begun::Finished { step, elapsed_s }) => {
                return Ok(RunSummary {
                    steps: step,
                    final_val_loss: None,
                    wall_s: session.elapsed().as_secs_f64(),
                    elapsed_s,
                    tokens_per_sec: 0.0,
                    stopped_early: false,
                    already_finished: true,
                })
            }
            Err(error) => {
                // A run refused before it started leaves no empty directory behind, nor the
                // parents it created (`remove_dir` removes only an empty one).
                drop(lock.take());
                for dir in &created {
                    if std::fs::remove_dir(dir).is_err() {
                        break;
                    }
                }
                return Err(error);
            }
        };
    describe(&config, &data, &model, log);
    let plan = Plan {
        config: &config,
        schedule: LrSchedule::from_config(&config.optimizer, config.max_steps),
        start: state,
        session,
        controls: &controls,
        peak_flops: config.peak_flops.or_else(|| crate::observe::accounting::table_peak_flops(&config)),
    };
    let local = devices.len();
    crate::parallel::check_data_ports(&config)?;
    let group = (config.world_size() > 1).then(|| Group::new(&config, local));
    if group.is_some() {
        log(&crate::parallel::describe(&config, local));
    }
    let coordinator = crate::parallel::start_coordinator(&config, coordinator_elsewhere)?;
    let replicas = Replicas { plan: &plan, data, resume_dir, group, faults, val_note };
    let leader = match leads {
        true => Some((MetricsLog::open(&run_dir.join(files::METRICS))?, run_dir.as_path())),
        false => None,
    };
    let report = replicas.run(model, &devices, leader, log);
    if replicas.group.is_some() {
        // Leave burn-collective's process-wide server clean for the next run in this process
        // (after a failure, peers and operations may be left pending). After a lost peer,
        // burn-collective's server may itself be gone (it panics there).
        let _ = std::panic::catch_unwind(burn::collective::reset_collective::<B::InnerBackend>);
    }
    drop(coordinator);
    let report = report?;
    if let Some((step, reason)) = report.unstable {
        return Err(TrainError::Unstable { step, reason, run_dir });
    }
    Ok(RunSummary {
        steps: report.steps,
        final_val_loss: report.final_val_loss,
        wall_s: session.elapsed().as_secs_f64(),
        elapsed_s: report.elapsed_s,
        tokens_per_sec: report.tokens as f64 / report.step_s.max(1e-9),
        stopped_early: report.stopped_early,
        already_finished: false,
    })
}

/// The start-of-run report: model, optimizer groups, data, global batch.
fn describe<B: AutodiffBackend>(
    config: &RunConfig,
    data: &PreparedData,
    model: &LanguageModel<B>,
    log: &mut dyn FnMut(&str),
) {
    let census = AdamWGroups::<LanguageModel<B>, B>::new(&config.optimizer, model).census;
    log(&format!("model: {} with {} parameters; {census}", config.model.arch(), model.num_params()));
    log(&format!("device: {}", crate::observe::device::describe_device(config.backend, config.device)));
    match config.precision {
        crate::config::PrecisionKind::Fp32 => log("precision: fp32"),
        crate::config::PrecisionKind::Bf16Mixed => {
            log("precision: bf16-mixed (matmuls in bfloat16 from f32 weights; norms, softmax, loss, gradients and AdamW in f32)")
        }
        crate::config::PrecisionKind::Fp16Mixed => log(
            "precision: fp16-mixed (matmuls in half precision from f32 weights, f32 elsewhere; dynamic loss scaling, 2^16 at the start of a run, a checkpoint's scale on resume)",
        ),
    }
    if config.activation_checkpointing == crate::config::CheckpointingKind::Blocks {
        log("activation checkpointing: blocks (the forward keeps each block's input; the backward recomputes one block at a time)");
    }
    log(&format!(
        "data: {} ({} train / {} val tokens, vocabulary {})",
        data.dir.display(),
        data.meta.train_tokens,
        data.meta.val_tokens,
        data.meta.vocab_size
    ));
    let world_size = config.world_size();
    if config.parallel.shard_optimizer && world_size == 1 {
        log("optimizer state: parallel.shard_optimizer has no effect with 1 rank (its AdamW state is whole)");
    }
    if config.parallel.shard_optimizer && world_size > 1 {
        let partition = Partition::of(model, world_size);
        let shares: Vec<String> = partition.elements.iter().map(|n| bytes_text(8 * *n as u64)).collect();
        log(&format!(
            "optimizer state: sharded over {world_size} ranks (ZeRO-1); AdamW moments per rank: {} (unsharded: {} each); the updated parameters are gathered after every step",
            shares.join(", "),
            bytes_text(8 * model.num_params() as u64)
        ));
    }
    log(&format!(
        "global batch: {} × {} = {} per optimizer step (micro-batch {} × {} × {})",
        count(config.sequences_per_step(world_size), "sequence"),
        count(config.model.block_size(), "token"),
        count(config.tokens_per_step(world_size), "token"),
        config.micro_batch_size,
        count(config.accumulation_steps, "accumulation step"),
        count(world_size, "rank"),
    ));
}

/// `bytes` in MB with one decimal, or in kB below 0.1 MB.
fn bytes_text(bytes: u64) -> String {
    match bytes {
        0..100_000 => format!("{:.1} kB", bytes as f64 / 1e3),
        _ => format!("{:.1} MB", bytes as f64 / 1e6),
    }
}

/// The replicas of this process: what they share to start.
struct Replicas<'a> {
    plan: &'a Plan<'a>,
    data: Arc<PreparedData>,
    /// The checkpoint resumed from, whose optimizer state each replica loads.
    resume_dir: Option<PathBuf>,
    /// Their link to the other ranks (`None` for a single rank).
    group: Option<Group>,
    faults: Faults,
    /// The leader's note on `eval_batches` (see [`feed::check_splits`]), logged at the start.
    val_note: Option<String>,
}

impl Replicas<'_> {
    /// Runs one replica of `model` per device, each on its own thread (burn-collective registers
    /// the local peers together); the first runs on this thread with `model` itself, as the
    /// leader when `leader` (rank 0's metrics log and run directory) is given. Returns the first
    /// replica's report, or the cause of a failure: the first error that is not another rank's
    /// reaction to it.
    fn run<B: AutodiffBackend>(
        &self,
        model: LanguageModel<B>,
        devices: &[B::Device],
        leader: Option<(MetricsLog, &std::path::Path)>,
        log: &mut dyn FnMut(&str),
    ) -> Result<ReplicaReport, TrainError> {
        let first_rank = self.plan.config.parallel.node_rank * devices.len();
        std::thread::scope(|scope| {
            let followers: Vec<_> = (devices.iter().enumerate().skip(1))
                .map(|(i, device)| {
                    let model = model.clone().fork(device);
                    scope.spawn(move || {
                        let replica = self.replica(&model, first_rank + i, device)?;
                        run_replica(self.plan, replica, model, None)
                    })
                })
                .collect();
            let ours = (|| {
                let leader = match leader {
                    Some((metrics, run_dir)) => {
                        let val = feed::val_view(self.data.clone(), self.plan.config)?;
                        Some((metrics, val, run_dir))
                    }
                    None => None,
                };
                let replica = self.replica(&model, first_rank, &devices[0])?;
                log(&replica.feed.description);
                if let (Some(note), true) = (&self.val_note, leader.is_some()) {
                    log(note);
                }
                let leader =
                    leader.map(|(metrics, val, run_dir)| Leader { log: &mut *log, metrics, val, run_dir });
                run_replica(self.plan, replica, model, leader)
            })();
            let mut errors = Vec::new();
            let report = ours.map_err(|e| errors.push(e)).ok();
            for (i, follower) in followers.into_iter().enumerate() {
                let panicked = |_| {
                    let message = "its thread panicked".into();
                    Err(TrainError::Exchange { rank: first_rank + i + 1, message })
                };
                if let Err(e) = follower.join().unwrap_or_else(panicked) {
                    errors.push(e);
                }
            }
            match report {
                Some(report) if errors.is_empty() => Ok(report),
                _ => {
                    let cause = errors.iter().position(|e| !e.is_reaction()).unwrap_or(0);
                    Err(errors.swap_remove(cause))
                }
            }
        })
    }

    /// The replica of rank `rank` on `device`: its optimizer for `model` (restored from the
    /// checkpoint resumed), its data shard, and its link to the other ranks (with the faults to
    /// inject, if any).
    fn replica<B: AutodiffBackend>(
        &self,
        model: &LanguageModel<B>,
        rank: usize,
        device: &B::Device,
    ) -> Result<Replica<B>, TrainError> {
        let config = self.plan.config;
        let feed =
            Feed::start(self.data.clone(), config, self.plan.start.sampler, rank, config.world_size())?;
        let world_size = config.world_size();
        let mut optimizer = AdamWGroups::new(&config.optimizer, model);
        if config.parallel.shard_optimizer && world_size > 1 {
            optimizer = optimizer.sharded(OptimizerShard { rank, world_size });
        }
        if let Some(dir) = &self.resume_dir {
            // A checkpoint holds the whole state; a sharded rank keeps its own part.
            optimizer = checkpoint::load_optimizer(dir, optimizer, device)?.keep_own(model);
        }
        let mut sync: Box<dyn GradSync<B> + Send> = match &self.group {
            None => Box::new(Solo),
            Some(group) => Box::new(crate::parallel::join::<B>(config, rank, device, group.clone())?),
        };
        if self.faults.any() {
            sync = Box::new(FaultInjector::new(sync, self.faults, self.plan.start.step + 1));
        }
        Ok(Replica { rank, device: device.clone(), optimizer, feed, sync })
    }
}
