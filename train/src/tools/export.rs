//! `ember export`: a run's latest checkpoint as Hugging Face safetensors with its
//! `config.json` (`DIR/model.safetensors` + `DIR/config.json`), never overwriting a file
//! without `force`, each file written whole or not at all.

use std::path::{Path, PathBuf};

use super::trained::{Source, Trained};
use crate::error::TrainError;

/// Weight formats of `ember export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// Hugging Face `GPT2LMHeadModel` safetensors.
    HfGpt2,
    /// Hugging Face `LlamaForCausalLM` safetensors.
    HfLlama,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hf-gpt2" => Ok(ExportFormat::HfGpt2),
            "hf-llama" => Ok(ExportFormat::HfLlama),
            other => Err(format!("unknown format {other:?}; expected hf-gpt2 or hf-llama")),
        }
    }
}

/// The files `ember export --out OUT` writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportTarget {
    /// The safetensors weights: `OUT/model.safetensors`, or OUT itself if it ends in
    /// `.safetensors` (the older `--out FILE.safetensors`).
    pub weights: PathBuf,
    /// The Hugging Face `config.json`, beside the weights.
    pub config: PathBuf,
}

impl ExportTarget {
    /// `OUT/model.safetensors` + `OUT/config.json` — the Hugging Face layout that
    /// `from_pretrained(OUT)` loads — or, for an OUT ending in `.safetensors`, that file with
    /// `config.json` beside it.
    pub fn for_out(out: &Path) -> ExportTarget {
        if out.extension().is_some_and(|e| e == "safetensors") {
            ExportTarget { weights: out.into(), config: out.with_file_name("config.json") }
        } else {
            ExportTarget { weights: out.join(ember_model::hf::WEIGHTS_FILE), config: out.join("config.json") }
        }
    }

    /// Refuses an OUT that is a file (for the directory form) and, without `force`, files
    /// that exist already, naming them; creates the directory.
    fn prepare(&self, out: &Path, force: bool) -> Result<(), TrainError> {
        let refuse = |message: String| TrainError::BadFile {
            path: format!("--out {}", out.display()).into(),
            message,
        };
        if out.is_file() && self.weights != out {
            return Err(refuse("is a file; expected a directory (ember export writes DIR/model.safetensors and DIR/config.json)".into()));
        }
        let existing: Vec<String> = [&self.weights, &self.config]
            .into_iter()
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        if !force && !existing.is_empty() {
            let (list, verb) = match existing.len() {
                1 => (existing[0].clone(), "exists"),
                _ => (existing.join(" and "), "exist"),
            };
            return Err(refuse(format!(
                "{list} already {verb}; pass --force to overwrite (other files are left alone)"
            )));
        }
        let dir = self.weights.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(TrainError::io(dir))
    }
}

/// Writes the latest checkpoint of `run_dir` in `format` (CPU; no GPU needed) with its Hugging
/// Face `config.json`, to [`ExportTarget::for_out`]`(out)`. Existing files are overwritten
/// only with `force`. Each file is written to a temp file in its directory, synced and renamed
/// into place, so a failed export leaves the previous files whole. Returns the paths written.
///
/// Errors: a format of another architecture than the run's; no checkpoint; an `out` that is a
/// file, or files that exist without `force` (naming them); an unwritable directory.
pub fn export_run(
    run_dir: &Path,
    format: ExportFormat,
    out: &Path,
    force: bool,
) -> Result<Vec<PathBuf>, TrainError> {
    let trained = Trained::open(Source::Run(run_dir.into()))?;
    let arch = trained.config.model.arch();
    let wanted = match format {
        ExportFormat::HfGpt2 => "gpt2",
        ExportFormat::HfLlama => "llama",
    };
    if arch != wanted {
        return Err(TrainError::Checkpoint {
            path: run_dir.into(),
            message: format!("the run's model is {arch:?}; export it with --format hf-{arch}"),
        });
    }
    let target = ExportTarget::for_out(out);
    target.prepare(out, force)?;
    let model = trained.load_model::<burn::backend::Flex>(&Default::default())?;
    let staged = Staged::new(&target.weights);
    staged.fill(|tmp| ember_model::hf::save(&model, tmp).map_err(TrainError::from))?;
    let text = serde_json::to_string_pretty(&hf_config(&trained.config.model)).expect("JSON");
    ember_data::write_atomic(&target.config, text.as_bytes())?;
    staged.commit()?;
    Ok(vec![target.weights, target.config])
}

/// A file written under a temp name in its destination's directory, then renamed onto it;
/// the temp file is removed if dropped before [`Staged::commit`].
struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
}

impl Staged {
    fn new(dest: &Path) -> Staged {
        let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dest.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        Staged { tmp, dest: dest.into() }
    }

    /// Lets `write` create the temp file, then syncs it to disk. Errors name the destination
    /// and say that it was left as it was.
    fn fill(&self, write: impl FnOnce(&Path) -> Result<(), TrainError>) -> Result<(), TrainError> {
        let synced = write(&self.tmp).and_then(|()| {
            let file = std::fs::File::open(&self.tmp).map_err(TrainError::io(&self.tmp))?;
            file.sync_all().map_err(TrainError::io(&self.tmp))
        });
        synced.map_err(|e| TrainError::BadFile {
            path: self.dest.clone(),
            message: format!("not written (left as it was): {e}"),
        })
    }

    /// Renames the temp file onto the destination and syncs the directory.
    fn commit(self) -> Result<(), TrainError> {
        std::fs::rename(&self.tmp, &self.dest).map_err(TrainError::io(&self.dest))?;
        if let Some(dir) = self.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// The Hugging Face `config.json` of a model (`GPT2Config` / `LlamaConfig` field names).
/// A GPT-2 without biases has no Hugging Face equivalent (`GPT2LMHeadModel` always has them).
pub fn hf_config(config: &ember_model::ModelConfig) -> serde_json::Value {
    match config {
        ember_model::ModelConfig::Gpt2(c) => serde_json::json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": c.vocab_size,
            "n_positions": c.block_size,
            "n_ctx": c.block_size,
            "n_embd": c.d_model,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "activation_function": if c.gelu == ember_model::GeluKind::Erf { "gelu" } else { "gelu_new" },
            "layer_norm_epsilon": c.layer_norm_eps,
            "resid_pdrop": c.dropout,
            "embd_pdrop": c.dropout,
            "attn_pdrop": c.dropout,
            "tie_word_embeddings": c.tie_embeddings,
            "torch_dtype": "float32",
        }),
        ember_model::ModelConfig::Llama(c) => serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": c.vocab_size,
            "hidden_size": c.d_model,
            "intermediate_size": c.d_ff,
            "num_hidden_layers": c.n_layer,
            "num_attention_heads": c.n_head,
            "num_key_value_heads": c.n_kv_head,
            "max_position_embeddings": c.block_size,
            "rope_theta": c.rope_theta,
            "rms_norm_eps": c.rms_norm_eps,
            "tie_word_embeddings": c.tie_embeddings,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "torch_dtype": "float32",
        }),
    }
}
