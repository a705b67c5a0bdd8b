//! Loading a trained model — a run's newest checkpoint that verifies against its manifest, or
//! a config's `init_from` weights — for evaluation, sampling and export.

use std::fs;
use std::path::PathBuf;

use burn::tensor::backend::Backend;
use ember_data::{Meta, PreparedData, Tokenizer};
use ember_model::LanguageModel;

use crate::config::{ConfigError, RunConfig};
use crate::error::TrainError;
use crate::persist::{checkpoint, files};

/// Where the weights come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A run directory: `config.toml`, `data_meta.json`, the newest checkpoint that verifies.
    Run(PathBuf),
    /// A run configuration whose `init_from` names Hugging Face weights.
    Config(PathBuf),
}

/// A model's resolved configuration and the metadata of its data (its tokenizer).
pub struct Trained {
    /// Where it comes from.
    pub source: Source,
    /// The resolved configuration.
    pub config: RunConfig,
    /// The prepared data's metadata, when known.
    pub meta: Option<Meta>,
    /// The checkpoint the weights come from (a run: the newest that verifies against its
    /// manifest; `None` for `init_from` weights).
    pub checkpoint: Option<PathBuf>,
}

impl Trained {
    /// Reads the configuration (and data metadata) of `source`, and for a run chooses its
    /// newest checkpoint that verifies, printing a line on stderr for each newer one skipped
    /// (see [`Trained::open_logged`]).
    ///
    /// Errors: see [`Trained::open_logged`].
    pub fn open(source: Source) -> Result<Self, TrainError> {
        Self::open_logged(source, &mut |line| {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{line}");
        })
    }

    /// [`Trained::open`], with each skipped checkpoint's line (`skipped
    /// checkpoints/step-00000200: model.mpk is damaged (sha256 differs from manifest.json);
    /// using step-00000100`) sent to `log`.
    ///
    /// Errors: not a run directory; no checkpoint that verifies; a bad config; a config
    /// without `init_from`; a vocabulary size that neither the config nor the data gives.
    pub fn open_logged(source: Source, log: &mut dyn FnMut(&str)) -> Result<Self, TrainError> {
        match &source {
            Source::Run(run_dir) => {
                let config_path = run_dir.join(files::CONFIG);
                if !config_path.exists() {
                    return Err(TrainError::Checkpoint {
                        path: run_dir.clone(),
                        message: format!("not a run directory: {} is missing", files::CONFIG),
                    });
                }
                let config = RunConfig::load(&config_path, &[])?;
                let meta_path = run_dir.join(files::DATA_META);
                let bytes = fs::read(&meta_path).map_err(TrainError::io(&meta_path))?;
                let meta = serde_json::from_slice(&bytes).map_err(|e| TrainError::Checkpoint {
                    path: meta_path,
                    message: format!("invalid data metadata: {e}"),
                })?;
                let checkpoint = Some(checkpoint::newest(run_dir, log)?);
                Ok(Self { source, config, meta: Some(meta), checkpoint })
            }
            Source::Config(path) => {
                let mut config = RunConfig::load(path, &[])?;
                if config.init_from.is_none() {
                    let message = "missing: the weights to load (Hugging Face safetensors)";
                    return Err(ConfigError::at(path, "init_from", message).into());
                }
                let meta = match &config.data {
                    Some(dir) if dir.join(ember_data::META_FILE).exists() => Some(Meta::read(dir)?),
                    _ => None,
                };
                config.resolve_vocab(meta.as_ref().map(|m| m.vocab_size))?;
                Ok(Self { source, config, meta, checkpoint: None })
            }
        }
    }

    /// The tokenizer: the prepared data's, else GPT-2's when `tokenizer = "gpt2"`.
    ///
    /// Errors: a char model without its prepared data (its vocabulary lives there).
    pub fn tokenizer(&self) -> Result<Tokenizer, TrainError> {
        match (&self.meta, self.config.tokenizer.as_deref().unwrap_or("char")) {
            (Some(meta), _) => {
                // A Hugging Face tokenizer.json sits beside the metadata: in the run directory
                // (copied at training time) or in the prepared data.
                let dir = match &self.source {
                    Source::Run(dir) => dir.clone(),
                    Source::Config(_) => self.config.data.clone().unwrap_or_default(),
                };
                Ok(Tokenizer::from_spec_in(&meta.tokenizer, &dir)?)
            }
            (None, "gpt2") => Ok(Tokenizer::gpt2()),
            (None, other) => Err(TrainError::Sample(format!(
                "no tokenizer: a {other:?} tokenizer's vocabulary comes from the prepared data; set `data` to it"
            ))),
        }
    }

    /// The prepared data, for evaluation.
    pub fn data(&self) -> Result<PreparedData, TrainError> {
        let dir = self
            .config
            .data
            .clone()
            .ok_or_else(|| self.config.origin.at("data", "missing: evaluation needs prepared data"))?;
        Ok(PreparedData::open(&dir)?)
    }

    /// The optimizer step of the weights (0 for `init_from` weights).
    pub fn step(&self) -> Result<u64, TrainError> {
        match &self.checkpoint {
            Some(dir) => Ok(checkpoint::load_state(dir)?.step),
            None => Ok(0),
        }
    }

    /// The model with its weights, on `device`.
    ///
    /// Errors: a damaged checkpoint file; weights that do not fit the configured model.
    pub fn load_model<B: Backend>(&self, device: &B::Device) -> Result<LanguageModel<B>, TrainError> {
        let model = self
            .config
            .model
            .init(device)
            .map_err(|e| self.config.origin.at(&format!("model.{}", e.field), e.message))?;
        match &self.checkpoint {
            Some(dir) => checkpoint::load_model(dir, model, device),
            None => {
                let weights = self.config.init_from.as_ref().expect("checked by open");
                Ok(ember_model::hf::load(model, weights)?)
            }
        }
    }
}
