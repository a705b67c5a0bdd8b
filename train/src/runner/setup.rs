//! Setting a run up: its devices, its data (prepared once from a text file if need be), the
//! vocabulary, the model (fresh, imported or from the latest checkpoint), the checks a resume
//! must pass, and the files of the run directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use ember_data::{PreparedData, SamplerState};
use ember_model::LanguageModel;

use crate::config::{ConfigError, RunConfig};
use crate::error::TrainError;
use crate::observe::metrics;
use crate::observe::words::count;
use crate::persist::checkpoint::{self, TrainState, CHECKPOINT_VERSION};
use crate::persist::files;
use crate::persist::written::{Written, WRITTEN};

/// Where a run starts: its model and state, and the checkpoint they come from.
pub(super) struct Start<B: AutodiffBackend> {
    /// Fresh (seeded), imported (`init_from`), or the checkpoint's weights.
    pub model: LanguageModel<B>,
    /// Step 0, or the checkpoint's state.
    pub state: TrainState,
    /// The checkpoint resumed from (its optimizer state is loaded per replica).
    pub resume_dir: Option<PathBuf>,
    /// A note when `eval_batches` is more than the val split holds ([`super::feed::check_splits`]).
    pub val_note: Option<String>,
}

/// One device per replica of `config`: `given`, or as many default devices.
///
/// Errors: a number of devices other than the config's replicas; a device without the dtype
/// of the config's mixed precision (e.g. a wgpu adapter without f16 for `fp16-mixed`).
pub(super) fn devices<B: AutodiffBackend>(
    config: &RunConfig,
    given: Vec<B::Device>,
) -> Result<Vec<B::Device>, TrainError> {
    let wanted = config.devices.count();
    let devices = match given.len() {
        0 => vec![B::Device::default(); wanted],
        n if n == wanted => given,
        n => {
            return Err(ConfigError::at(
                &config.origin.path,
                "devices",
                format!("the config asks for {wanted} replicas but {n} devices were given"),
            )
            .into())
        }
    };
    if let Some(dtype) = config.precision.mode().matmul_dtype() {
        if let Some(device) = devices.iter().find(|d| !B::supports_dtype(d, dtype)) {
            return Err(TrainError::Unsupported(format!(
                "precision {}: device {device:?} cannot compute in {dtype:?}; use precision = \"fp32\"",
                config.precision.name()
            )));
        }
    }
    Ok(devices)
}

/// How a run's set-up ended.
pub(super) enum Begun<B: AutodiffBackend> {
    /// The run starts (or continues) from this data and start (boxed: a model beside a
    /// variant of two numbers).
    Run(Arc<PreparedData>, Box<Start<B>>),
    /// A resume whose checkpoint is already at `max_steps` (a requeued job preempted after
    /// its last checkpoint): nothing to train, nothing in the run directory changed.
    Finished {
        /// The checkpoint's step.
        step: u64,
        /// Wall-clock seconds of the run, all its sessions.
        elapsed_s: f64,
    },
}

/// Opens the run's data, settles the vocabulary, and builds the model and state the run starts
/// from (checking that a resume continues the same run). `leads`: this process writes the run
/// directory (node 0), which it then holds the resolved config and data metadata.
///
/// A resume of a run whose checkpoint is at (or beyond) `max_steps` is
/// [`Begun::Finished`], checked before anything in the run directory changes.
///
/// Errors: see [`crate::runner::train`].
pub(super) fn start<B: AutodiffBackend>(
    config: &mut RunConfig,
    run_dir: &Path,
    options: Setup,
    device: &B::Device,
    log: &mut dyn FnMut(&str),
) -> Result<Begun<B>, TrainError> {
    let Setup { resume, leads, force } = options;
    if leads {
        fs::create_dir_all(run_dir).map_err(TrainError::io(run_dir))?;
        if !resume {
            ensure_fresh(run_dir, log)?;
        }
    }
    if config.parallel.nodes > 1 && config.data.as_deref().is_some_and(Path::is_file) {
        let message = "several nodes need prepared data (run `ember prepare` once), not a text file";
        return Err(config.origin.at("data", message).into());
    }
    let data = super::run_data::open_data(config, run_dir, resume, force, log)?;
    // The newest checkpoint that verifies against its manifest is the one loaded (each newer
    // one skipped is logged). A run that stopped before its first checkpoint starts again from
    // step 0 (a requeued job preempted early), as torchtitan does with no checkpoint to load.
    // (Only a run that was set up there: its config.toml and data_meta.json written.)
    let set_up = [files::CONFIG, files::DATA_META].iter().all(|f| run_dir.join(f).is_file());
    let from_scratch = resume && set_up && !checkpoint::any_checkpoint(run_dir)?;
    if from_scratch {
        log(&format!(
            "{} has no checkpoint yet (the run stopped before its first): starting it from step 0",
            run_dir.display()
        ));
    }
    let latest = if resume && !from_scratch { Some(checkpoint::newest(run_dir, log)?) } else { None };
    if resume {
        super::same_data::check_same_data(run_dir, &data)?;
    }
    config.resolve_vocab(Some(data.meta.vocab_size))?;
    let data_tokens = (data.meta.train_tokens, data.meta.total_tokens - data.meta.train_tokens);
    let resumed = match &latest {
        Some(dir) => {
            let state = checkpoint::load_state(dir)?;
            check_resumable(config, &state, dir, data_tokens)?;
            if config.max_steps <= state.step {
                // As torchtitan and Hugging Face's Trainer do: the loop has no step left.
                return Ok(Begun::Finished { step: state.step, elapsed_s: state.elapsed_s });
            }
            Some(state)
        }
        None => None,
    };
    if leads {
        checkpoint::remove_leftovers(run_dir, log)?;
    }
    // Before the model is allocated.
    crate::observe::fits::check(config, log)?;
    // Before anything in the run directory changes (a resume with a batch too large for the
    // data must leave the run as it was).
    let data = Arc::new(data);
    let val_note = super::feed::check_splits(&data, config)?;

    // Every rank starts from the same weights: built from the same seed here and copied to
    // each local replica (other processes build them the same way); the first step compares
    // the replicas' parameter hashes.
    let mut model: LanguageModel<B> = crate::step::init::seeded_model(config, device)?;
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
        sentinel: Default::default(),
        loss_scaler: None,
    };
    let mut resume_dir = None;
    if let (Some(path), None) = (&config.init_from, &latest) {
        model = ember_model::hf::load(model, path)?;
        log(&format!("initialized from {}", path.display()));
    }
    if let (Some(dir), Some(resumed)) = (latest, resumed) {
        state = resumed;
        model = checkpoint::load_model(&dir, model, device)?;
        if state.world_size != world_size {
            // The epoch's remaining batches were cut for another rank count.
            log(&format!(
                "the checkpoint was written by {}, this run has {world_size}: the data continues at the start of epoch {}",
                count(state.world_size, "rank"),
                state.sampler.epoch + 1
            ));
            state.sampler = SamplerState { epoch: state.sampler.epoch + 1, cursor: 0 };
            state.world_size = world_size;
        }
        if leads {
            metrics::truncate_after(&run_dir.join(files::METRICS), state.step, log)?;
        }
        log(&format!("resumed from {} (step {})", dir.display(), state.step));
        resume_dir = Some(dir);
    }
    if from_scratch && leads {
        // The records of the attempt that reached no checkpoint (checked to be Ember's first).
        let path = run_dir.join(files::METRICS);
        if path.exists() {
            metrics::truncate_after(&path, 0, log)?;
            fs::remove_file(&path).map_err(TrainError::io(&path))?;
        }
    }
    if leads {
        write_run_files(config, &data, run_dir)?;
    }
    Ok(Begun::Run(data, Box::new(Start { model, state, resume_dir, val_note })))
}

/// What [`start`] is asked to do.
#[derive(Clone, Copy, Debug)]
pub(super) struct Setup {
    /// Continue the run from its latest checkpoint.
    pub resume: bool,
    /// This process writes the run directory (node 0).
    pub leads: bool,
    /// Replace `RUN_DIR/data` prepared from another text than `--data`'s.
    pub force: bool,
}

/// The resolved config, the data's metadata and (for Hugging Face tokenizers) its
/// `tokenizer.json`, which sampling from the run needs beside `data_meta.json`; then the
/// record of what was written ([`Written`]).
fn write_run_files(config: &RunConfig, data: &PreparedData, run_dir: &Path) -> Result<(), TrainError> {
    let config_toml = config.to_toml();
    let meta_json = serde_json::to_vec_pretty(&data.meta).expect("meta serializes");
    let mut run_files: Vec<(&str, &[u8])> =
        vec![(files::CONFIG, config_toml.as_bytes()), (files::DATA_META, &meta_json)];
    let hf_tokenizer = data.dir.join(ember_data::HF_TOKENIZER_FILE);
    let tokenizer_json;
    if hf_tokenizer.exists() {
        tokenizer_json = fs::read(&hf_tokenizer).map_err(TrainError::io(&hf_tokenizer))?;
        run_files.push((ember_data::HF_TOKENIZER_FILE, &tokenizer_json));
    }
    Written::write_files(run_dir, &run_files)
}

/// A new run must not overwrite another one. A run directory without a checkpoint holds
/// nothing to resume (the run stopped before its first checkpoint): its files are replaced —
/// only those that are still exactly what Ember wrote there (their SHA-256 in
/// `written.json`), and a `metrics.jsonl` only when it holds nothing but Ember's records, so
/// that a user's own files (a config passed as `--config RUN_DIR/config.toml`, an Ember
/// config edited by hand, a `metrics.jsonl`) are never overwritten.
fn ensure_fresh(run_dir: &Path, log: &mut dyn FnMut(&str)) -> Result<(), TrainError> {
    // `latest`, or a checkpoint directory without it (a run stopped while naming its first).
    let checkpoints = run_dir.join("checkpoints");
    let step_dir = |e: fs::DirEntry| e.file_name().to_string_lossy().starts_with("step-");
    let found = checkpoints.join("latest").exists()
        || fs::read_dir(&checkpoints).is_ok_and(|mut d| d.any(|e| e.is_ok_and(step_dir)));
    if found {
        return Err(TrainError::RunDirTaken { path: run_dir.into(), found: "checkpoints".into() });
    }
    let written = Written::read(run_dir);
    let ours = |name: &str| written.as_ref().is_some_and(|w| w.holds(run_dir, name));
    let is_ember = |name: &str| match name {
        // A torn last line (a write cut short) only beside Ember's config.toml.
        files::METRICS => metrics::holds_only_records(&run_dir.join(name), ours(files::CONFIG)),
        // A file of that name that is not Ember's record is the user's.
        WRITTEN => written.is_some(),
        _ => ours(name),
    };
    let replaced = [files::CONFIG, files::METRICS, files::DATA_META, ember_data::HF_TOKENIZER_FILE, WRITTEN];
    let foreign: Vec<&str> = replaced
        .into_iter()
        .filter(|name| run_dir.join(name).exists())
        .filter(|&name| !is_ember(name))
        .collect();
    if !foreign.is_empty() {
        return Err(TrainError::RunDirForeign { path: run_dir.into(), files: foreign.join(", ") });
    }
    let metrics = run_dir.join(files::METRICS);
    if metrics.exists() {
        fs::remove_file(&metrics).map_err(TrainError::io(&metrics))?;
        log(&format!(
            "{} held a run that stopped before its first checkpoint: starting over",
            run_dir.display()
        ));
    }
    // The earlier run's tokenizer.json (Ember's, checked above): the new run writes its own if
    // its data has one, and a stale copy would no longer be in the record.
    let tokenizer = run_dir.join(ember_data::HF_TOKENIZER_FILE);
    if tokenizer.exists() {
        fs::remove_file(&tokenizer).map_err(TrainError::io(&tokenizer))?;
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
            "the model cannot change when resuming ({}): {}",
            config.origin.described(),
            model_differences(&saved.model, &config.model)
        ));
    }
    if state.seed != config.seed {
        let message = format!(
            "{} differs from the checkpoint's {} ({}): the run would not continue the same data order",
            config.seed,
            state.seed,
            dir.display()
        );
        return Err(config.origin.at("seed", message).into());
    }
    if state.data_tokens != data_tokens {
        return mismatch(format!(
            "the prepared data changed since the checkpoint: it had {:?} train/val tokens, now {:?}",
            state.data_tokens, data_tokens
        ));
    }
    Ok(())
}

/// The `[model]` keys whose values differ, as `model.KEY: checkpoint A, config B`.
fn model_differences(saved: &ember_model::ModelConfig, now: &ember_model::ModelConfig) -> String {
    let table = |m| toml::Table::try_from(m).expect("a model config serializes to a TOML table");
    let (saved, now) = (table(saved), table(now));
    let mut keys: Vec<&String> = saved.keys().chain(now.keys()).collect();
    keys.sort();
    keys.dedup();
    let show = |v: Option<&toml::Value>| v.map_or("(none)".to_string(), toml::Value::to_string);
    keys.into_iter()
        .filter(|k| saved.get(*k) != now.get(*k))
        .map(|k| format!("model.{k}: checkpoint {}, config {}", show(saved.get(k)), show(now.get(k))))
        .collect::<Vec<_>>()
        .join("; ")
}
