//! `ember export`: a run's latest checkpoint as Hugging Face safetensors with its
//! `config.json`.

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

/// Writes the latest checkpoint of `run_dir` to `out` in `format` (CPU; no GPU needed), and
/// the matching Hugging Face `config.json` beside it (so `from_pretrained(dir)` works).
/// Returns the paths written.
///
/// Errors: a format of another architecture than the run's; no checkpoint; an unwritable
/// `out`.
pub fn export_run(run_dir: &Path, format: ExportFormat, out: &Path) -> Result<Vec<PathBuf>, TrainError> {
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
    let model = trained.load_model::<burn::backend::Flex>(&Default::default())?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(TrainError::io(parent))?;
    }
    ember_model::hf::save(&model, out)?;
    let config_json = out.with_file_name("config.json");
    let text = serde_json::to_string_pretty(&hf_config(&trained.config.model)).expect("JSON");
    ember_data::write_atomic(&config_json, text.as_bytes())?;
    Ok(vec![out.into(), config_json])
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
