//! Checkpoints: `RUN_DIR/checkpoints/step-NNNNNNNN/` holding the model, both AdamW groups'
//! state, `state.json`, the run's `config.toml` and, written last, `manifest.json` (every
//! file's size and SHA-256).
//!
//! [`save`]'s protocol, so that a process killed at any moment leaves the earlier checkpoints
//! usable: write every file into `checkpoints/.tmp-step-N-PID/` and fsync it; write the
//! manifest and fsync it; fsync the directory; rename it to `step-N`; fsync `checkpoints/`;
//! then replace `checkpoints/latest` (temp file, fsync, rename). Loading takes the newest
//! directory that verifies against its manifest ([`newest_verified`]), not `latest` alone.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use ember_model::LanguageModel;
use serde::{Deserialize, Serialize};

use super::durable::{remedy, sync_dir, write_synced};
use super::manifest::{FileEntry, Manifest, MANIFEST};
use crate::error::TrainError;
use crate::step::optim::AdamWGroups;
use crate::step::{LossScaler, SentinelState};

pub use super::recover::{
    any_checkpoint, newest, newest_before, newest_verified, newest_verified_before, remove_leftovers,
    Skipped, LATEST, TMP_PREFIX,
};

/// Layout version of a checkpoint directory (3: with `manifest.json` and `config.toml`).
pub const CHECKPOINT_VERSION: u32 = 3;

/// Everything besides tensors that a run needs to continue exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// [`CHECKPOINT_VERSION`].
    pub version: u32,
    /// Optimizer steps completed.
    pub step: u64,
    /// Tokens consumed so far.
    pub tokens: u64,
    /// Wall-clock seconds spent so far (all sessions of the run).
    pub elapsed_s: f64,
    /// The run's seed. Every random draw is a pure function of it: initial weights, the
    /// epoch permutations of the data (`seed`, epoch), and step `s`'s dropout (the backend is
    /// re-seeded with `mix(seed, s)` before it).
    pub seed: u64,
    /// Where the data continues: the epoch and the batches of it already consumed.
    pub sampler: ember_data::SamplerState,
    /// Token counts of the prepared data the run was trained on, checked on resume.
    pub data_tokens: (u64, u64),
    /// Data-parallel ranks that trained up to this checkpoint (the sampler state is in their
    /// batches; another rank count continues at the next epoch).
    #[serde(default = "one")]
    pub world_size: usize,
    /// The stability sentinel's running state (loss window, skip and spike counters), so a
    /// resumed run judges steps as the uninterrupted one would.
    #[serde(default)]
    pub sentinel: SentinelState,
    /// The loss scaler of an fp16-mixed run (scale, finite steps since it changed, overflow
    /// count), so a resumed run scales as the uninterrupted one would; `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
}

fn one() -> usize {
    1
}

/// Records are encoded to bytes by Burn and written (and read) by Ember's own I/O, so a
/// failed write or read reports its real cause.
fn recorder() -> NamedMpkBytesRecorder<FullPrecisionSettings> {
    NamedMpkBytesRecorder::new()
}

/// The name of step `step`'s checkpoint directory.
pub fn step_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// Writes the checkpoint of `state.step` (with `config_toml`, the run's resolved config) by
/// the protocol of this module; keeps the newest `keep` checkpoints. Returns its directory.
///
/// Errors: a record that cannot be encoded; a failed write ([`TrainError::CheckpointWrite`],
/// e.g. a full disk: the temporary directory is removed, the earlier checkpoints and
/// `latest` stay as they were).
pub fn save<B: AutodiffBackend>(
    run_dir: &Path,
    state: &TrainState,
    model: &LanguageModel<B>,
    optimizer: &AdamWGroups<LanguageModel<B>, B>,
    config_toml: &str,
    keep: usize,
) -> Result<PathBuf, TrainError> {
    let root = run_dir.join("checkpoints");
    let name = step_name(state.step);
    let previous = fs::read_to_string(root.join(LATEST)).ok().map(|s| s.trim().to_string());
    let failed = |path: PathBuf, source: io::Error, done: bool| {
        let outcome = outcome(run_dir, &name, previous.as_deref(), &source, done);
        TrainError::CheckpointWrite { path, source, outcome }
    };
    if !root.is_dir() {
        fs::create_dir_all(&root).map_err(|e| failed(root.clone(), e, false))?;
        sync_dir(run_dir).map_err(|e| failed(run_dir.into(), e, false))?;
    }
    let tmp = root.join(format!("{TMP_PREFIX}{name}-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(TrainError::io(&tmp))?;
    }
    let written = write_files(&tmp, state, model, optimizer, config_toml);
    let final_dir = root.join(&name);
    let published = written.and_then(|()| publish(&tmp, &final_dir).map_err(Failure::Io));
    if let Err(failure) = published {
        let _ = fs::remove_dir_all(&tmp);
        return Err(match failure {
            Failure::Io((path, e)) => failed(path, e, false),
            Failure::Encode(e) => e,
        });
    }
    // The checkpoint is complete and on disk; `latest` is a pointer for people and tools
    // (`write_atomic` fsyncs `checkpoints/` after its rename).
    let latest = root.join(LATEST);
    ember_data::write_atomic(&latest, name.as_bytes()).map_err(|e| match e {
        ember_data::DataError::Io { source, .. } => failed(latest.clone(), source, true),
        other => other.into(),
    })?;
    super::recover::prune(&root, state.step, keep)?;
    Ok(final_dir)
}

/// Why [`save`] failed before its checkpoint was complete.
enum Failure {
    /// A file-system step failed on this path.
    Io((PathBuf, io::Error)),
    /// A record could not be encoded.
    Encode(TrainError),
}

/// Writes and fsyncs every file of the checkpoint into `tmp` (a new directory), the
/// manifest last, then fsyncs `tmp` itself.
fn write_files<B: AutodiffBackend>(
    tmp: &Path,
    state: &TrainState,
    model: &LanguageModel<B>,
    optimizer: &AdamWGroups<LanguageModel<B>, B>,
    config_toml: &str,
) -> Result<(), Failure> {
    let at = |path: PathBuf| move |e: io::Error| Failure::Io((path, e));
    fs::create_dir(tmp).map_err(at(tmp.into()))?;
    let mut files = Vec::new();
    let mut write = |name: &str, bytes: &[u8]| -> Result<(), Failure> {
        let path = tmp.join(name);
        write_synced(&path, bytes).map_err(at(path))?;
        files.push(FileEntry::of(name, bytes));
        Ok(())
    };
    let encoded = |what: &str, result: Result<Vec<u8>, burn::record::RecorderError>| {
        result.map_err(|e| {
            let message = format!("cannot encode {what}: {e}");
            Failure::Encode(TrainError::Checkpoint { path: tmp.join(what), message })
        })
    };
    // One record in memory at a time.
    write(
        "model.mpk",
        &encoded("model.mpk", Recorder::<B>::record(&recorder(), model.clone().into_record(), ()))?,
    )?;
    let (decay, no_decay) = optimizer.to_record();
    write("optim_decay.mpk", &encoded("optim_decay.mpk", Recorder::<B>::record(&recorder(), decay, ()))?)?;
    write(
        "optim_no_decay.mpk",
        &encoded("optim_no_decay.mpk", Recorder::<B>::record(&recorder(), no_decay, ()))?,
    )?;
    write("state.json", &serde_json::to_vec_pretty(state).expect("state serializes"))?;
    write("config.toml", config_toml.as_bytes())?;
    let manifest = Manifest { version: CHECKPOINT_VERSION, step: state.step, files };
    let json = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
    let path = tmp.join(MANIFEST);
    write_synced(&path, &json).map_err(at(path))?;
    sync_dir(tmp).map_err(at(tmp.into()))
}

/// Renames the complete `tmp` to `final_dir` (an existing one, e.g. a damaged checkpoint of
/// the same step from before a resume, is moved aside first) and fsyncs their parent.
fn publish(tmp: &Path, final_dir: &Path) -> Result<(), (PathBuf, io::Error)> {
    let root = final_dir.parent().expect("checkpoints/step-N has a parent");
    let aside = final_dir.exists().then(|| {
        let name = final_dir.file_name().unwrap_or_default().to_string_lossy();
        root.join(format!("{TMP_PREFIX}replaced-{name}-{}", std::process::id()))
    });
    if let Some(aside) = &aside {
        fs::rename(final_dir, aside).map_err(|e| (final_dir.to_path_buf(), e))?;
    }
    if let Err(e) = fs::rename(tmp, final_dir) {
        if let Some(aside) = &aside {
            let _ = fs::rename(aside, final_dir); // put the old one back
        }
        return Err((final_dir.to_path_buf(), e));
    }
    sync_dir(root).map_err(|e| (root.to_path_buf(), e))?;
    if let Some(aside) = aside {
        let _ = fs::remove_dir_all(aside); // a leftover is removed at the next start
    }
    Ok(())
}

/// What a failed [`save`] left and what to do, for [`TrainError::CheckpointWrite`].
fn outcome(run_dir: &Path, name: &str, previous: Option<&str>, error: &io::Error, done: bool) -> String {
    let remedy = remedy(error);
    let resume = format!("`ember train --resume {}`", run_dir.display());
    match (done, previous) {
        (true, _) => format!(
            "{name} is complete but checkpoints/latest was not updated ({remedy}; {resume} loads {name})"
        ),
        (false, Some(previous)) => format!(
            "{name} was not saved; the earlier checkpoints are untouched and checkpoints/latest still names {previous}: {remedy}, then continue with {resume}"
        ),
        (false, None) => format!(
            "{name} was not saved: {remedy}, then continue with {resume} (or start the run again if it has no earlier checkpoint)"
        ),
    }
}

/// Reads file `name` of checkpoint `dir` and checks it against the manifest.
///
/// Errors: no or a damaged manifest; the file unreadable, or of another size or hash than
/// the manifest's (the message names the file and says it is damaged).
pub fn read_verified(dir: &Path, name: &str) -> Result<Vec<u8>, TrainError> {
    let problem = |problem| TrainError::Checkpoint { path: dir.into(), message: format!("{problem}") };
    let manifest = Manifest::read(dir).map_err(problem)?;
    let path = dir.join(name);
    let bytes = fs::read(&path).map_err(TrainError::io(&path))?;
    manifest.check(name, &bytes).map_err(problem)?;
    Ok(bytes)
}

/// Reads `state.json` of a checkpoint directory (checked against its manifest).
pub fn load_state(dir: &Path) -> Result<TrainState, TrainError> {
    let bytes = read_verified(dir, "state.json")?;
    let path = dir.join("state.json");
    let state: TrainState = serde_json::from_slice(&bytes)
        .map_err(|e| TrainError::Checkpoint { path: path.clone(), message: format!("invalid state: {e}") })?;
    if state.version != CHECKPOINT_VERSION {
        return Err(TrainError::Checkpoint {
            path,
            message: format!(
                "checkpoint version {} is not supported (expected {CHECKPOINT_VERSION})",
                state.version
            ),
        });
    }
    Ok(state)
}

/// Loads a checkpoint's weights into `model` (built from the run's config on `device`),
/// from bytes checked against the manifest.
pub fn load_model<B: Backend>(
    dir: &Path,
    model: LanguageModel<B>,
    device: &B::Device,
) -> Result<LanguageModel<B>, TrainError> {
    let bytes = read_verified(dir, "model.mpk")?;
    let record = Recorder::<B>::load(&recorder(), bytes, device).map_err(|e| TrainError::Checkpoint {
        path: dir.join("model.mpk"),
        message: format!("matches {MANIFEST} but cannot be loaded as this model's weights: {e}"),
    })?;
    Ok(model.load_record(record))
}

/// Loads both AdamW groups' state (after [`load_model`], whose parameter ids key the state),
/// from bytes checked against the manifest.
pub fn load_optimizer<B: AutodiffBackend>(
    dir: &Path,
    optimizer: AdamWGroups<LanguageModel<B>, B>,
    device: &B::Device,
) -> Result<AdamWGroups<LanguageModel<B>, B>, TrainError> {
    let load = |name: &str| {
        let bytes = read_verified(dir, name)?;
        Recorder::<B>::load(&recorder(), bytes, device).map_err(|e| TrainError::Checkpoint {
            path: dir.join(name),
            message: format!("matches {MANIFEST} but cannot be loaded as optimizer state: {e}"),
        })
    };
    Ok(optimizer.load_record((load("optim_decay.mpk")?, load("optim_no_decay.mpk")?)))
}
