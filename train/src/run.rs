//! A training run: set up (or resume) the run directory, then loop over optimizer steps with
//! logging, evaluation and checkpoints.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use ember_data::{PrepareOptions, PreparedData, SamplerState, TokenizerKind};
use ember_model::LanguageModel;

use crate::checkpoint::{self, TrainState, CHECKPOINT_VERSION};
use crate::config::{ConfigError, RunConfig};
use crate::controls::Controls;
use crate::error::TrainError;
use crate::feed::Feed;
use crate::fsutil::write_atomic;
use crate::metrics::{self, MetricsLog};
use crate::optim::AdamWGroups;
use crate::replica::{run_replica, Leader, Plan, Replica, ReplicaReport};
use crate::schedule::LrSchedule;
use crate::sync::{GradSync, Solo};

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
}

/// Files of a run directory.
pub mod files {
    /// The resolved configuration.
    pub const CONFIG: &str = "config.toml";
    /// A copy of the prepared data's `meta.json` (tokenizer for sampling).
    pub const DATA_META: &str = "data_meta.json";
    /// One JSON record per logged step.
    pub const METRICS: &str = "metrics.jsonl";
}

/// The backend seed of step `step`'s dropout: a splitmix64 mix of (seed, step), so the
/// random draws of a step do not depend on how many steps ran before it in this process.
pub fn step_seed(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Opens the run's prepared data: `config.data` is a prepared directory, or a text file that
/// is prepared into `RUN_DIR/data` once. On return `config.data` names the prepared
/// directory as an absolute path.
pub fn open_data(config: &mut RunConfig, run_dir: &Path) -> Result<PreparedData, TrainError> {
    let given = config.data.clone().ok_or_else(|| ConfigError::Key {
        path: "config".into(),
        key: "data".into(),
        message: "missing: set `data` in the config or pass --data DIR|FILE".into(),
    })?;
    let dir = if given.is_file() {
        let out = run_dir.join("data");
        if !out.join("meta.json").exists() {
            let tokenizer: TokenizerKind = config.tokenizer.as_deref().unwrap_or("char").parse()?;
            let mut options = PrepareOptions::new(tokenizer, vec![given], out.clone());
            options.progress = false;
            ember_data::prepare(&options)?;
        }
        out
    } else {
        given
    };
    let data = PreparedData::open(&dir)?;
    if let Some(wanted) = &config.tokenizer {
        let kind = data.meta.tokenizer.kind();
        if kind != wanted.parse::<TokenizerKind>()? {
            return Err(ConfigError::Key {
                path: dir.join(ember_data::META_FILE),
                key: "tokenizer".into(),
                message: format!("the config asks for {wanted:?} but the data was prepared with \"{kind}\""),
            }
            .into());
        }
    }
    config.data = Some(fs::canonicalize(&dir).map_err(TrainError::io(&dir))?);
    Ok(data)
}

/// Trains (or resumes) a run on backend `B` with one replica per device of `devices` (empty:
/// `devices` default devices of the config) and `parallel.nodes` processes; `log` receives
/// every human-readable line (node 0 only).
///
/// Errors: bad data or configuration, a run directory that already holds a run (without
/// `resume`), a missing or inconsistent checkpoint (with `resume`), I/O failures, a
/// diverged loss, a failed or unreachable rank.
pub fn train<B: AutodiffBackend>(
    options: RunOptions,
    devices: Vec<B::Device>,
    log: &mut dyn FnMut(&str),
) -> Result<RunSummary, TrainError> {
    let RunOptions { mut config, run_dir, resume, controls } = options;
    let session = Instant::now();
    let wanted = config.devices.indices(config.device).len();
    let devices = match devices.len() {
        0 => vec![B::Device::default(); wanted],
        n if n == wanted => devices,
        n => {
            return Err(ConfigError::Key {
                path: run_dir.join(files::CONFIG),
                key: "devices".into(),
                message: format!("the config asks for {wanted} replicas but {n} devices were given"),
            }
            .into())
        }
    };
    let leads = config.parallel.node_rank == 0; // this process writes the run directory
    let device = devices[0].clone();
    if leads {
        fs::create_dir_all(&run_dir).map_err(TrainError::io(&run_dir))?;
        if !resume {
            ensure_fresh(&run_dir, log)?;
        }
    }
    if config.parallel.nodes > 1 && config.data.as_deref().is_some_and(Path::is_file) {
        return Err(ConfigError::Key {
            path: run_dir.join(files::CONFIG),
            key: "data".into(),
            message: "several nodes need prepared data (run `ember prepare` once), not a text file".into(),
        }
        .into());
    }
    let data = open_data(&mut config, &run_dir)?;
    if resume {
        checkpoint::latest(&run_dir)?; // a run without a checkpoint has nothing to resume
        check_same_tokenizer(&run_dir, &data.meta)?;
    }
    config.adopt_weights_vocab()?;
    config.resolve_vocab(data.meta.vocab_size).map_err(|(key, message)| ConfigError::Key {
        path: run_dir.join(files::CONFIG),
        key,
        message,
    })?;
    let model_err = |e: ember_model::ConfigError| ConfigError::Key {
        path: run_dir.join(files::CONFIG),
        key: format!("model.{}", e.field),
        message: e.message,
    };

    // Every rank starts from the same weights: built from the same seed here and copied to
    // each local replica (other processes build them the same way); the first step compares
    // the replicas' parameter hashes.
    B::seed(&device, config.seed);
    let mut model: LanguageModel<B> = config.model.init(&device).map_err(model_err)?;
    let data_tokens = (data.meta.train_tokens, data.meta.total_tokens - data.meta.train_tokens);
    let world_size = config.world_size();
    let mut state = TrainState {
        version: CHECKPOINT_VERSION,
        step: 0,
        tokens: 0,
        elapsed_s: 0.0,
        seed: config.seed,
        sampler: SamplerState::default(),
        data_tokens,
        world_size,
    };
    let mut resume_dir = None;
    if let (Some(path), false) = (&config.init_from, resume) {
        model = ember_model::hf::load(model, path)?;
        log(&format!("initialized from {}", path.display()));
    }
    if resume {
        let dir = checkpoint::latest(&run_dir)?;
        state = checkpoint::load_state(&dir)?;
        check_resumable(&config, &state, &dir, data_tokens)?;
        if config.max_steps <= state.step {
            return Err(ConfigError::Key {
                path: run_dir.join(files::CONFIG),
                key: "max_steps".into(),
                message: format!(
                    "{} is not beyond the checkpoint's step {}: nothing to train; raise it with --set max_steps=N",
                    config.max_steps, state.step
                ),
            }
            .into());
        }
        model = checkpoint::load_model(&dir, model, &device)?;
        if state.world_size != world_size {
            // The epoch's remaining batches were cut for another rank count.
            log(&format!(
                "the checkpoint was written by {} ranks, this run has {world_size}: the data continues at the start of epoch {}",
                state.world_size,
                state.sampler.epoch + 1
            ));
            state.sampler = SamplerState { epoch: state.sampler.epoch + 1, cursor: 0 };
            state.world_size = world_size;
        }
        if leads {
            metrics::truncate_after(&run_dir.join(files::METRICS), state.step)?;
        }
        log(&format!("resumed from {} (step {})", dir.display(), state.step));
        resume_dir = Some(dir);
    }
    if leads {
        write_atomic(&run_dir.join(files::CONFIG), config.to_toml().as_bytes())?;
        let meta_json = serde_json::to_vec_pretty(&data.meta).expect("meta serializes");
        write_atomic(&run_dir.join(files::DATA_META), &meta_json)?;
        let hf_tokenizer = data.dir.join(ember_data::HF_TOKENIZER_FILE);
        if hf_tokenizer.exists() {
            // Sampling from the run needs the Hugging Face tokenizer beside its data_meta.json.
            let bytes = fs::read(&hf_tokenizer).map_err(TrainError::io(&hf_tokenizer))?;
            write_atomic(&run_dir.join(ember_data::HF_TOKENIZER_FILE), &bytes)?;
        }
    }

    let census = AdamWGroups::<LanguageModel<B>, B>::new(&config.optimizer, &model).census;
    log(&format!("model: {} with {} parameters; {census}", config.model.arch(), model.num_params()));
    log(&format!(
        "data: {} ({} train / {} val tokens, vocabulary {})",
        data.dir.display(),
        data.meta.train_tokens,
        data.meta.val_tokens,
        data.meta.vocab_size
    ));
    log(&format!(
        "global batch: {} sequences × {} tokens = {} tokens per optimizer step (micro-batch {} × {} accumulation steps × {} rank{})",
        config.sequences_per_step(world_size),
        config.model.block_size(),
        config.tokens_per_step(world_size),
        config.micro_batch_size,
        config.accumulation_steps,
        world_size,
        if world_size == 1 { "" } else { "s" }
    ));
    let plan = Plan {
        config: &config,
        schedule: LrSchedule::from_config(&config.optimizer, config.max_steps),
        start: state,
        session,
        controls: &controls,
        peak_flops: config.peak_flops.or_else(|| crate::accounting::table_peak_flops(&config)),
    };
    let data = Arc::new(data);
    let local = devices.len();
    let first_rank = config.parallel.node_rank * local;
    crate::parallel::check_data_ports(&config)?;
    let collective = (world_size > 1).then(|| crate::parallel::Group::new(&config, local));
    if collective.is_some() {
        log(&crate::parallel::describe(&config, local));
    }
    let coordinator = crate::parallel::start_coordinator(&config)?;
    // One replica per local device, each on its own thread (burn-collective registers the
    // local peers together); rank `first_rank` of this process runs on this thread.
    let report = std::thread::scope(|scope| -> Result<ReplicaReport, TrainError> {
        let mut followers = Vec::new();
        for (i, device) in devices.iter().enumerate().skip(1) {
            let (plan, data, collective, resume_dir) =
                (&plan, &data, collective.clone(), resume_dir.as_deref());
            let model = model.clone().fork(device);
            followers.push(scope.spawn(move || {
                let replica =
                    build_replica(plan, data, &model, first_rank + i, device, collective, resume_dir)?;
                run_replica(plan, replica, model, None)
            }));
        }
        let ours = (|| {
            let leader_parts = match leads {
                true => Some((
                    MetricsLog::open(&run_dir.join(files::METRICS))?,
                    crate::feed::val_view(data.clone(), &config)?,
                )),
                false => None,
            };
            let replica = build_replica(
                &plan,
                &data,
                &model,
                first_rank,
                &device,
                collective.clone(),
                resume_dir.as_deref(),
            )?;
            log(&replica.feed.description);
            let leader =
                leader_parts.map(|(metrics, val)| Leader { log: &mut *log, metrics, val, run_dir: &run_dir });
            run_replica(&plan, replica, model, leader)
        })();
        // Report the cause: the first error that is not another rank's reaction to it.
        let mut errors: Vec<TrainError> = Vec::new();
        let report = match ours {
            Ok(report) => Some(report),
            Err(e) => {
                errors.push(e);
                None
            }
        };
        for follower in followers {
            match follower.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => errors.push(TrainError::Sync("a replica thread panicked".into())),
            }
        }
        let cause = errors.iter().position(|e| !matches!(e, TrainError::Sync(_))).unwrap_or(0);
        match report {
            Some(report) if errors.is_empty() => Ok(report),
            _ => Err(errors.swap_remove(cause)),
        }
    });
    if collective.is_some() {
        // Leave burn-collective's process-wide server clean for the next run in this process
        // (after a failure, peers and operations may be left pending).
        // After a lost peer, burn-collective's server may itself be gone (it panics there).
        let _ = std::panic::catch_unwind(burn::collective::reset_collective::<B::InnerBackend>);
    }
    drop(coordinator);
    let report = report?;
    Ok(RunSummary {
        steps: report.steps,
        final_val_loss: report.final_val_loss,
        wall_s: session.elapsed().as_secs_f64(),
        elapsed_s: report.elapsed_s,
        tokens_per_sec: report.tokens as f64 / report.step_s.max(1e-9),
        stopped_early: report.stopped_early,
    })
}

/// A replica of rank `rank` on `device`: its optimizer for `model` (restored from
/// `resume_dir`), its data shard, and its link to the other ranks (`collective`: `None` for a
/// single rank).
fn build_replica<B: AutodiffBackend>(
    plan: &Plan<'_>,
    data: &Arc<PreparedData>,
    model: &LanguageModel<B>,
    rank: usize,
    device: &B::Device,
    collective: Option<crate::parallel::Group>,
    resume_dir: Option<&Path>,
) -> Result<Replica<B>, TrainError> {
    let config = plan.config;
    let feed = Feed::start(data.clone(), config, plan.start.sampler, rank, config.world_size())?;
    let mut optimizer = AdamWGroups::new(&config.optimizer, model);
    if let Some(dir) = resume_dir {
        optimizer = checkpoint::load_optimizer(dir, optimizer, device)?;
    }
    let sync: Box<dyn GradSync<B> + Send> = match collective {
        None => Box::new(Solo),
        Some(collective) => Box::new(crate::parallel::join::<B>(config, rank, device, collective)?),
    };
    Ok(Replica { rank, device: device.clone(), optimizer, feed, sync })
}

/// A new run must not overwrite another one. A run directory without a checkpoint holds
/// nothing to resume (the run stopped before its first checkpoint): its metrics are replaced.
fn ensure_fresh(run_dir: &Path, log: &mut dyn FnMut(&str)) -> Result<(), TrainError> {
    if run_dir.join("checkpoints").join("latest").exists() {
        return Err(TrainError::RunDirTaken { path: run_dir.into(), found: "checkpoints".into() });
    }
    let metrics = run_dir.join(files::METRICS);
    if metrics.exists() {
        fs::remove_file(&metrics).map_err(TrainError::io(&metrics))?;
        log(&format!(
            "{} held a run that stopped before its first checkpoint: starting over",
            run_dir.display()
        ));
    }
    Ok(())
}

/// The data of a resumed run must be tokenized as the run's was.
fn check_same_tokenizer(run_dir: &Path, meta: &ember_data::Meta) -> Result<(), TrainError> {
    let path = run_dir.join(files::DATA_META);
    let bytes = fs::read(&path).map_err(TrainError::io(&path))?;
    let saved: ember_data::Meta = serde_json::from_slice(&bytes).map_err(|e| TrainError::Checkpoint {
        path: path.clone(),
        message: format!("invalid data metadata: {e}"),
    })?;
    if saved.tokenizer != meta.tokenizer {
        return Err(TrainError::Checkpoint {
            path,
            message: format!(
                "the data's tokenizer ({}) is not the run's ({}): a run continues on data tokenized the same way",
                meta.tokenizer.kind(),
                saved.tokenizer.kind()
            ),
        });
    }
    Ok(())
}

/// The model and seed of a resumed run must be the checkpoint's, and so must the data.
fn check_resumable(
    config: &RunConfig,
    state: &TrainState,
    dir: &Path,
    data_tokens: (u64, u64),
) -> Result<(), TrainError> {
    let saved = RunConfig::load(&dir.join(files::CONFIG), &[])?;
    let mismatch = |message: String| Err(TrainError::Checkpoint { path: dir.into(), message });
    if saved.model != config.model {
        return mismatch(format!(
            "the model cannot change when resuming: checkpoint has {:?}, config has {:?}",
            saved.model, config.model
        ));
    }
    if state.seed != config.seed {
        return mismatch(format!(
            "seed {} differs from the checkpoint's {}: the run would not continue the same data order",
            config.seed, state.seed
        ));
    }
    if state.data_tokens != data_tokens {
        return mismatch(format!(
            "the prepared data changed since the checkpoint: it had {:?} train/val tokens, now {:?}",
            state.data_tokens, data_tokens
        ));
    }
    Ok(())
}
