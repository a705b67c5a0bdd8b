//! A training run: set up (or resume) the run directory, then loop over optimizer steps with
//! logging, evaluation and checkpoints.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ElementConversion;
use ember_data::{PrepareOptions, PreparedData, SamplerState, TokenizerKind};
use ember_model::LanguageModel;

use crate::checkpoint::{self, TrainState, CHECKPOINT_VERSION};
use crate::config::{ConfigError, RunConfig};
use crate::error::TrainError;
use crate::eval::evaluate;
use crate::feed::Feed;
use crate::fsutil::write_atomic;
use crate::metrics::{self, EvalRecord, MetricsLog, Record, TrainRecord};
use crate::optim::AdamWGroups;
use crate::schedule::LrSchedule;
use crate::step::train_step;

/// What to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The resolved configuration (for a resume: `RUN_DIR/config.toml` plus `--set`s).
    pub config: RunConfig,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Continue the run in `run_dir` from its latest checkpoint.
    pub resume: bool,
    /// Set (e.g. by Ctrl-C) to stop after the current step, with a checkpoint.
    pub stop: Arc<AtomicBool>,
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

/// Trains (or resumes) a run on backend `B`; `log` receives every human-readable line.
///
/// Errors: bad data or configuration, a run directory that already holds a run (without
/// `resume`), a missing or inconsistent checkpoint (with `resume`), I/O failures, a
/// diverged loss.
pub fn train<B: AutodiffBackend>(
    options: RunOptions,
    device: B::Device,
    log: &mut dyn FnMut(&str),
) -> Result<RunSummary, TrainError> {
    let RunOptions { mut config, run_dir, resume, stop } = options;
    let session = Instant::now();
    fs::create_dir_all(&run_dir).map_err(TrainError::io(&run_dir))?;
    if !resume {
        ensure_fresh(&run_dir, log)?;
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

    B::seed(&device, config.seed);
    let mut model: LanguageModel<B> = config.model.init(&device).map_err(model_err)?;
    let mut optimizer = AdamWGroups::new(&config.optimizer, &model);
    let data_tokens = (data.meta.train_tokens, data.meta.total_tokens - data.meta.train_tokens);
    let mut state = TrainState {
        version: CHECKPOINT_VERSION,
        step: 0,
        tokens: 0,
        elapsed_s: 0.0,
        seed: config.seed,
        sampler: SamplerState::default(),
        data_tokens,
    };
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
        optimizer = checkpoint::load_optimizer(&dir, optimizer, &device)?;
        metrics::truncate_after(&run_dir.join(files::METRICS), state.step)?;
        log(&format!("resumed from {} (step {})", dir.display(), state.step));
    }
    write_atomic(&run_dir.join(files::CONFIG), config.to_toml().as_bytes())?;
    let meta_json = serde_json::to_vec_pretty(&data.meta).expect("meta serializes");
    write_atomic(&run_dir.join(files::DATA_META), &meta_json)?;
    let hf_tokenizer = data.dir.join(ember_data::HF_TOKENIZER_FILE);
    if hf_tokenizer.exists() {
        // Sampling from the run needs the Hugging Face tokenizer beside its data_meta.json.
        let bytes = fs::read(&hf_tokenizer).map_err(TrainError::io(&hf_tokenizer))?;
        write_atomic(&run_dir.join(ember_data::HF_TOKENIZER_FILE), &bytes)?;
    }

    let tokens_per_step = config.tokens_per_step(1) as u64;
    log(&format!(
        "model: {} with {} parameters; {}",
        config.model.arch(),
        model.num_params(),
        optimizer.census
    ));
    log(&format!(
        "data: {} ({} train / {} val tokens, vocabulary {})",
        data.dir.display(),
        data.meta.train_tokens,
        data.meta.val_tokens,
        data.meta.vocab_size
    ));
    log(&format!(
        "global batch: {} sequences × {} tokens = {} tokens per optimizer step (micro-batch {} × {} accumulation steps × 1 worker)",
        config.sequences_per_step(1),
        config.model.block_size(),
        tokens_per_step,
        config.micro_batch_size,
        config.accumulation_steps
    ));

    let o = &config.optimizer;
    let schedule = LrSchedule {
        peak: o.lr,
        min: o.min_lr,
        warmup_steps: o.warmup_steps,
        decay_steps: o.lr_decay_steps.unwrap_or(config.max_steps),
    };
    let (mut feed, val) = Feed::start(Arc::new(data), &config, state.sampler)?;
    log(&feed.description);
    let mut metrics_log = MetricsLog::open(&run_dir.join(files::METRICS))?;
    let elapsed = |state: &TrainState| state.elapsed_s + session.elapsed().as_secs_f64();
    let mut final_val_loss = None;
    let val_loss = |model: &LanguageModel<B>, val| {
        evaluate(&model.valid(), val, config.seed, config.eval_batches, config.micro_batch_size, &device)
    };
    if state.step == 0 && config.eval_every > 0 {
        let record = EvalRecord::new(0, val_loss(&model, &val)?, elapsed(&state));
        final_val_loss = Some(record.val_loss);
        log(&record.to_string());
        metrics_log.write(&Record::Eval(record))?;
    }

    let (mut interval_tokens, mut interval_s, mut interval_wait) = (0u64, 0.0f64, Duration::ZERO);
    let (mut session_tokens, mut session_step_s) = (0u64, 0.0f64);
    let mut stopped_early = false;
    let start_step = state.step;
    for step in start_step + 1..=config.max_steps {
        let started = Instant::now();
        // 1. Data: this step's micro-batches, built ahead on the feed's thread.
        let (data, data_wait) = feed.next_step()?;
        B::seed(&device, step_seed(config.seed, step));
        let lr = schedule.lr(step);
        let (next, out) = train_step(
            model,
            &mut optimizer,
            &data.micro_batches,
            step,
            lr,
            config.optimizer.grad_clip,
            &device,
        )?;
        model = next;
        state.step = step;
        state.sampler = data.state;
        state.tokens += out.scored_tokens as u64;

        let stop_now = stop.load(Ordering::SeqCst);
        let last = step == config.max_steps || stop_now;
        let logging = step % config.log_every == 0 || last;
        let read = logging.then(|| {
            let loss: f64 = out.loss.into_scalar().elem();
            let grad_norm: f64 = out.grad_norm.into_scalar().elem();
            (loss, grad_norm)
        });
        let step_s = started.elapsed().as_secs_f64();
        interval_s += step_s;
        interval_wait += data_wait;
        interval_tokens += out.scored_tokens as u64;
        session_step_s += step_s;
        session_tokens += out.scored_tokens as u64;
        if let Some((loss, grad_norm)) = read {
            for (what, value) in [("loss", loss), ("grad norm", grad_norm)] {
                if !value.is_finite() {
                    return Err(TrainError::NonFinite { step, what, value });
                }
            }
            let record = TrainRecord {
                step,
                loss,
                perplexity: loss.exp(),
                lr,
                grad_norm,
                tokens_per_sec: interval_tokens as f64 / interval_s.max(1e-9),
                data_wait_frac: interval_wait.as_secs_f64() / interval_s.max(1e-9),
                tokens: state.tokens,
                elapsed_s: elapsed(&state),
            };
            log(&record.to_string());
            metrics_log.write(&Record::Train(record))?;
            (interval_tokens, interval_s, interval_wait) = (0, 0.0, Duration::ZERO);
        }
        let due = |every: u64| every > 0 && step % every == 0;
        if due(config.eval_every) || last {
            let record = EvalRecord::new(step, val_loss(&model, &val)?, elapsed(&state));
            final_val_loss = Some(record.val_loss);
            log(&record.to_string());
            metrics_log.write(&Record::Eval(record))?;
        }
        if due(config.checkpoint_every) || last {
            let mut saved = state.clone();
            saved.elapsed_s = elapsed(&state);
            let dir = checkpoint::save(&run_dir, &saved, &model, &optimizer, config.keep_checkpoints)?;
            write_atomic(&dir.join(files::CONFIG), config.to_toml().as_bytes())?;
            log(&format!("checkpoint {}", dir.display()));
        }
        if stop_now && step < config.max_steps {
            log(&format!(
                "stopped after step {step}; continue with `ember train --resume {}`",
                run_dir.display()
            ));
            stopped_early = true;
            break;
        }
    }
    Ok(RunSummary {
        steps: state.step,
        final_val_loss,
        wall_s: session.elapsed().as_secs_f64(),
        elapsed_s: elapsed(&state),
        tokens_per_sec: session_tokens as f64 / session_step_s.max(1e-9),
        stopped_early,
    })
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
