//! Checkpoints: `RUN_DIR/checkpoints/step-NNNNNNNN/` holding the model, both AdamW groups'
//! state and `state.json`, written to a temporary directory and renamed into place; then
//! `RUN_DIR/checkpoints/latest` (the directory's name) is replaced atomically.

use std::fs;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use ember_model::LanguageModel;
use serde::{Deserialize, Serialize};

use ember_data::write_atomic;

use crate::error::TrainError;
use crate::step::optim::AdamWGroups;

/// Layout version of a checkpoint directory.
pub const CHECKPOINT_VERSION: u32 = 2;

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
}

fn one() -> usize {
    1
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}

fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Writes the checkpoint of `state.step`; keeps the newest `keep` checkpoints.
/// Returns the checkpoint directory.
pub fn save<B: AutodiffBackend>(
    run_dir: &Path,
    state: &TrainState,
    model: &LanguageModel<B>,
    optimizer: &AdamWGroups<LanguageModel<B>, B>,
    keep: usize,
) -> Result<PathBuf, TrainError> {
    let root = checkpoints_dir(run_dir);
    fs::create_dir_all(&root).map_err(TrainError::io(&root))?;
    let name = format!("step-{:08}", state.step);
    let final_dir = root.join(&name);
    let tmp = root.join(format!(".tmp-{name}-{}", std::process::id()));
    let written = (|| {
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(TrainError::io(&tmp))?;
        }
        fs::create_dir_all(&tmp).map_err(TrainError::io(&tmp))?;
        let record_err = |e: burn::record::RecorderError| TrainError::Checkpoint {
            path: tmp.clone(),
            message: format!("cannot write record: {e}"),
        };
        recorder().record(model.clone().into_record(), tmp.join("model")).map_err(record_err)?;
        let (decay, no_decay) = optimizer.to_record();
        recorder().record(decay, tmp.join("optim_decay")).map_err(record_err)?;
        recorder().record(no_decay, tmp.join("optim_no_decay")).map_err(record_err)?;
        let json = serde_json::to_vec_pretty(state).expect("state serializes");
        write_atomic(&tmp.join("state.json"), &json)?;
        if final_dir.exists() {
            fs::remove_dir_all(&final_dir).map_err(TrainError::io(&final_dir))?;
        }
        fs::rename(&tmp, &final_dir).map_err(TrainError::io(&final_dir))
    })();
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    write_atomic(&root.join("latest"), name.as_bytes())?;
    prune(&root, &name, keep)?;
    Ok(final_dir)
}

/// Removes all but the newest `keep` `step-*` directories (never `latest_name`).
fn prune(root: &Path, latest_name: &str, keep: usize) -> Result<(), TrainError> {
    let mut names: Vec<String> = fs::read_dir(root)
        .map_err(TrainError::io(root))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort();
    let excess = names.len().saturating_sub(keep);
    for name in names.into_iter().take(excess).filter(|n| n != latest_name) {
        let dir = root.join(name);
        fs::remove_dir_all(&dir).map_err(TrainError::io(&dir))?;
    }
    Ok(())
}

/// The newest complete checkpoint directory of a run.
///
/// Errors: no `checkpoints/latest` (the run never reached a checkpoint), or it names a
/// missing directory.
pub fn latest(run_dir: &Path) -> Result<PathBuf, TrainError> {
    let pointer = checkpoints_dir(run_dir).join("latest");
    let name = fs::read_to_string(&pointer).map_err(|e| TrainError::Checkpoint {
        path: run_dir.into(),
        message: format!(
            "no checkpoint to load ({}: {e}): the run stopped before its first checkpoint (start it again with `ember train --config FILE --run-dir {}`), or this is not its --run-dir",
            pointer.display(),
            run_dir.display()
        ),
    })?;
    let dir = checkpoints_dir(run_dir).join(name.trim());
    if !dir.join("state.json").exists() {
        return Err(TrainError::Checkpoint {
            path: dir,
            message: "checkpoint named by checkpoints/latest is missing or incomplete".into(),
        });
    }
    Ok(dir)
}

/// Reads `state.json` of a checkpoint directory.
pub fn load_state(dir: &Path) -> Result<TrainState, TrainError> {
    let path = dir.join("state.json");
    let bytes = fs::read(&path).map_err(TrainError::io(&path))?;
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

/// Loads a checkpoint's weights into `model` (built from the run's config on `device`).
pub fn load_model<B: Backend>(
    dir: &Path,
    model: LanguageModel<B>,
    device: &B::Device,
) -> Result<LanguageModel<B>, TrainError> {
    let record = recorder().load(dir.join("model"), device).map_err(|e| TrainError::Checkpoint {
        path: dir.join("model.mpk"),
        message: format!("cannot load weights: {e}"),
    })?;
    Ok(model.load_record(record))
}

/// Loads both AdamW groups' state (after [`load_model`], whose parameter ids key the state).
pub fn load_optimizer<B: AutodiffBackend>(
    dir: &Path,
    optimizer: AdamWGroups<LanguageModel<B>, B>,
    device: &B::Device,
) -> Result<AdamWGroups<LanguageModel<B>, B>, TrainError> {
    let load = |name: &str| {
        recorder().load(dir.join(name), device).map_err(|e| TrainError::Checkpoint {
            path: dir.join(format!("{name}.mpk")),
            message: format!("cannot load optimizer state: {e}"),
        })
    };
    Ok(optimizer.load_record((load("optim_decay")?, load("optim_no_decay")?)))
}
