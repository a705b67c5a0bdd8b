//! The `[model]` table: `arch`, an optional `preset` (a typed [`ModelConfig::preset`]), and
//! explicit fields laid over the preset — or over the architecture's defaults — one by one.

use ember_model::{GeluKind, GptConfig, LlamaConfig, ModelConfig};
use serde::Deserialize;

use super::schema::VocabSource;

/// Keys `[model]` takes for `arch = "gpt2"`, besides `arch` and `preset`.
const GPT2_KEYS: &[&str] = &[
    "vocab_size",
    "n_layer",
    "n_head",
    "d_model",
    "block_size",
    "dropout",
    "bias",
    "tie_embeddings",
    "gelu",
    "layer_norm_eps",
];

/// Keys `[model]` takes for `arch = "llama"`, besides `arch` and `preset`.
const LLAMA_KEYS: &[&str] = &[
    "vocab_size",
    "n_layer",
    "n_head",
    "n_kv_head",
    "d_model",
    "d_ff",
    "block_size",
    "rope_theta",
    "rms_norm_eps",
    "tie_embeddings",
];

/// The explicit fields of a `[model]` table, each optional (the preset or a default fills the
/// rest). Fields of the other architecture are refused before this is read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fields {
    vocab_size: Option<usize>,
    n_layer: Option<usize>,
    n_head: Option<usize>,
    n_kv_head: Option<usize>,
    d_model: Option<usize>,
    d_ff: Option<usize>,
    block_size: Option<usize>,
    dropout: Option<f64>,
    bias: Option<bool>,
    tie_embeddings: Option<bool>,
    gelu: Option<GeluKind>,
    layer_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rms_norm_eps: Option<f64>,
}

/// A `(dotted key, message)` error, placed in a file by the caller.
pub(super) type KeyError = (String, String);

/// Resolves a `[model]` table into a model configuration and says where its vocabulary size
/// comes from: given, or pending until the data is known (`model.vocab_size` is then 0).
///
/// Errors: an unknown `arch` or `preset`, an `arch` that contradicts the preset, a key of
/// another architecture or none, a value of the wrong type, a size with neither a value nor a
/// preset.
pub(super) fn resolve_model(mut table: toml::Table) -> Result<(ModelConfig, VocabSource), KeyError> {
    let arch = match table.remove("arch") {
        None => None,
        Some(toml::Value::String(arch)) if arch == "gpt2" || arch == "llama" => Some(arch),
        Some(other) => {
            return Err(("model.arch".into(), format!("expected \"gpt2\" or \"llama\", got {other}")))
        }
    };
    let preset = match table.remove("preset") {
        None => None,
        Some(toml::Value::String(name)) => Some(ModelConfig::preset(&name).ok_or_else(|| {
            (
                "model.preset".to_string(),
                format!("unknown preset {name:?}; expected one of {:?}", ember_model::lm::preset_names()),
            )
        })?)
        .map(|preset| (name, preset)),
        Some(other) => return Err(("model.preset".into(), format!("expected a string, got {other}"))),
    };
    if let (Some(arch), Some((name, preset))) = (&arch, &preset) {
        if arch != preset.arch() {
            return Err((
                "model.arch".into(),
                format!("{arch:?} contradicts preset {name:?}, which is {:?}", preset.arch()),
            ));
        }
    }
    let preset = preset.map(|(_, preset)| preset);
    let arch = match &preset {
        Some(preset) => preset.arch().to_string(),
        None => arch.unwrap_or_else(|| "gpt2".into()),
    };
    let known = if arch == "llama" { LLAMA_KEYS } else { GPT2_KEYS };
    if let Some(key) = table.keys().find(|key| !known.contains(&key.as_str())) {
        return Err((
            format!("model.{key}"),
            format!("unknown key for arch {arch:?}; expected `arch`, `preset` or one of {known:?}"),
        ));
    }
    let fields: Fields = serde_path_to_error::deserialize(toml::Value::Table(table))
        .map_err(|e| (format!("model.{}", e.path()), e.inner().to_string()))?;
    let vocab = match fields.vocab_size {
        Some(_) => VocabSource::Given,
        None => VocabSource::Pending { preset: preset.as_ref().map(ModelConfig::vocab_size) },
    };
    let mut model = match (arch.as_str(), preset) {
        ("llama", preset) => ModelConfig::Llama(fields.over_llama(preset)?),
        (_, preset) => ModelConfig::Gpt2(fields.over_gpt(preset)?),
    };
    if vocab != VocabSource::Given {
        model.set_vocab_size(0);
    }
    Ok((model, vocab))
}

/// `value`, or an error saying that the size `key` is missing.
fn required(value: Option<usize>, key: &str) -> Result<usize, KeyError> {
    value.ok_or_else(|| ("model".into(), format!("missing field `{key}`: give it, or a `preset`")))
}

impl Fields {
    /// The GPT-2 of `preset` (or Burn's defaults with the given sizes) with these fields.
    fn over_gpt(self, preset: Option<ModelConfig>) -> Result<GptConfig, KeyError> {
        let mut c = match preset {
            Some(ModelConfig::Gpt2(preset)) => preset,
            _ => GptConfig::new(
                self.vocab_size.unwrap_or(0),
                required(self.n_layer, "n_layer")?,
                required(self.n_head, "n_head")?,
                required(self.d_model, "d_model")?,
                required(self.block_size, "block_size")?,
            ),
        };
        set(&mut c.vocab_size, self.vocab_size);
        set(&mut c.n_layer, self.n_layer);
        set(&mut c.n_head, self.n_head);
        set(&mut c.d_model, self.d_model);
        set(&mut c.block_size, self.block_size);
        set(&mut c.dropout, self.dropout);
        set(&mut c.bias, self.bias);
        set(&mut c.tie_embeddings, self.tie_embeddings);
        set(&mut c.gelu, self.gelu);
        set(&mut c.layer_norm_eps, self.layer_norm_eps);
        Ok(c)
    }

    /// The Llama of `preset` (or Burn's defaults with the given sizes) with these fields.
    fn over_llama(self, preset: Option<ModelConfig>) -> Result<LlamaConfig, KeyError> {
        let mut c = match preset {
            Some(ModelConfig::Llama(preset)) => preset,
            _ => LlamaConfig::new(
                self.vocab_size.unwrap_or(0),
                required(self.n_layer, "n_layer")?,
                required(self.n_head, "n_head")?,
                required(self.n_kv_head, "n_kv_head")?,
                required(self.d_model, "d_model")?,
                required(self.d_ff, "d_ff")?,
                required(self.block_size, "block_size")?,
            ),
        };
        set(&mut c.vocab_size, self.vocab_size);
        set(&mut c.n_layer, self.n_layer);
        set(&mut c.n_head, self.n_head);
        set(&mut c.n_kv_head, self.n_kv_head);
        set(&mut c.d_model, self.d_model);
        set(&mut c.d_ff, self.d_ff);
        set(&mut c.block_size, self.block_size);
        set(&mut c.rope_theta, self.rope_theta);
        set(&mut c.rms_norm_eps, self.rms_norm_eps);
        set(&mut c.tie_embeddings, self.tie_embeddings);
        Ok(c)
    }
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *field = value;
    }
}
