//! Loading a trained run (`RUN_DIR`) for evaluation and sampling.

use std::fs;
use std::path::Path;

use burn::tensor::backend::Backend;
use ember_data::{Meta, Tokenizer};
use ember_model::Gpt;

use crate::checkpoint;
use crate::config::{ConfigError, RunConfig};
use crate::error::TrainError;
use crate::run::files;

/// A run's resolved configuration and the prepared data's metadata (its tokenizer).
pub struct RunInfo {
    /// `RUN_DIR/config.toml`.
    pub config: RunConfig,
    /// `RUN_DIR/data_meta.json`.
    pub meta: Meta,
}

impl RunInfo {
    /// Reads `RUN_DIR/config.toml` (with `overrides`) and `RUN_DIR/data_meta.json`.
    ///
    /// Errors: either file missing or invalid (the message says which).
    pub fn read(run_dir: &Path, overrides: &[String]) -> Result<Self, TrainError> {
        let config_path = run_dir.join(files::CONFIG);
        if !config_path.exists() {
            return Err(TrainError::Checkpoint {
                path: run_dir.into(),
                message: format!("not a run directory: {} is missing", files::CONFIG),
            });
        }
        let config = RunConfig::load(&config_path, overrides)?;
        let meta_path = run_dir.join(files::DATA_META);
        let bytes = fs::read(&meta_path).map_err(TrainError::io(&meta_path))?;
        let meta = serde_json::from_slice(&bytes).map_err(|e| TrainError::Checkpoint {
            path: meta_path,
            message: format!("invalid data metadata: {e}"),
        })?;
        Ok(Self { config, meta })
    }

    /// The tokenizer the run was trained with.
    pub fn tokenizer(&self) -> Result<Tokenizer, TrainError> {
        Ok(Tokenizer::from_spec(&self.meta.tokenizer)?)
    }

    /// The model of the latest checkpoint, on `device`.
    ///
    /// Errors: no checkpoint, or weights that do not fit the configured model.
    pub fn load_model<B: Backend>(
        &self,
        run_dir: &Path,
        device: &B::Device,
    ) -> Result<Gpt<B>, TrainError> {
        let dir = checkpoint::latest(run_dir)?;
        let model = self
            .config
            .model
            .init(device)
            .map_err(|e| ConfigError::Key {
                path: run_dir.join(files::CONFIG),
                key: format!("model.{}", e.field),
                message: e.message,
            })?;
        checkpoint::load_model(&dir, model, device)
    }
}
