//! Model configuration: [`GptConfig`], its presets, and validation.

use burn::config::Config;
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Which GELU the MLP uses.
///
/// - `Tanh`: the tanh approximation GPT-2 was trained with,
///   `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (Hendrycks & Gimpel 2016, eq. in §2;
///   `gelu_new` in Hugging Face, `approximate="tanh"` in PyTorch).
/// - `Erf`: the exact `x·Φ(x) = 0.5·x·(1 + erf(x/√2))` (PyTorch's default `nn.GELU()`, nanoGPT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GeluKind {
    /// tanh approximation (GPT-2).
    #[default]
    Tanh,
    /// exact erf form.
    Erf,
}

/// Hyper-parameters of a GPT-2-style decoder-only Transformer (Radford et al. 2019; nanoGPT's
/// `GPTConfig`). Serialized field by field into run directories and TOML configs.
#[derive(Config, Debug, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size (rows of the token embedding). GPT-2's 50257 is padded to 50304
    /// (a multiple of 64) in the `gpt2*` presets, as nanoGPT does, for faster matmuls.
    pub vocab_size: usize,
    /// Number of Transformer blocks.
    pub n_layer: usize,
    /// Number of attention heads; must divide `d_model`.
    pub n_head: usize,
    /// Width of the residual stream (`n_embd` in nanoGPT).
    pub d_model: usize,
    /// Context length: the most positions a sequence may have (rows of the position embedding).
    pub block_size: usize,
    /// Dropout probability on embeddings, attention weights, and residual branches (0 = off).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases in Linear layers and LayerNorms (GPT-2: true; nanoGPT's default: false).
    #[config(default = true)]
    pub bias: bool,
    /// LM head shares the token-embedding matrix (weight tying, Press & Wolf 2017).
    #[config(default = true)]
    pub tie_embeddings: bool,
    /// GELU variant of the MLP.
    #[config(default = "GeluKind::Tanh")]
    pub gelu: GeluKind,
    /// LayerNorm epsilon (GPT-2: 1e-5).
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
}

/// Names accepted by [`GptConfig::preset`].
pub const PRESETS: &[&str] =
    &["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "shakespeare-char", "shakespeare-char-gpu", "tiny"];

impl GptConfig {
    /// A named preset. GPT-2 sizes follow Radford et al. 2019, Table 2 (as corrected by the
    /// released checkpoints: 124M / 350M / 774M / 1558M), with the vocabulary padded to 50304.
    /// `shakespeare-char` is nanoGPT's CPU "baby GPT" (4/4/128, context 64) and
    /// `shakespeare-char-gpu` its `train_shakespeare_char.py` (6/6/384, context 256, dropout 0.2);
    /// both have `vocab_size` 65 until the prepared data sets it, no biases and nanoGPT's exact
    /// (erf) GELU. `tiny` (2/2/32, context 16,
    /// vocab 64) is for tests.
    ///
    /// Returns `None` for an unknown name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Option<GptConfig> {
        let gpt2 = |n_layer, n_head, d_model| GptConfig::new(50304, n_layer, n_head, d_model, 1024);
        Some(match name {
            "gpt2" => gpt2(12, 12, 768),
            "gpt2-medium" => gpt2(24, 16, 1024),
            "gpt2-large" => gpt2(36, 20, 1280),
            "gpt2-xl" => gpt2(48, 25, 1600),
            "shakespeare-char" => GptConfig::new(65, 4, 4, 128, 64).with_bias(false).with_gelu(GeluKind::Erf),
            "shakespeare-char-gpu" => {
                GptConfig::new(65, 6, 6, 384, 256).with_bias(false).with_gelu(GeluKind::Erf).with_dropout(0.2)
            }
            "tiny" => GptConfig::new(64, 2, 2, 32, 16),
            _ => return None,
        })
    }

    /// Checks that a model can be built.
    ///
    /// Errors: any size of 0; `d_model` not divisible by `n_head`; `dropout` outside `[0, 1)`;
    /// `layer_norm_eps` not positive.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, message: String| Err(ConfigError { field, message, also: None });
        crate::error::require_positive(&[
            ("vocab_size", self.vocab_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("d_model", self.d_model),
            ("block_size", self.block_size),
        ])?;
        crate::error::require_heads_divide(self.d_model, self.n_head)?;
        if !(0.0..1.0).contains(&self.dropout) {
            return err("dropout", format!("must be in [0, 1), got {}", self.dropout));
        }
        if self.layer_norm_eps <= 0.0 || !self.layer_norm_eps.is_finite() {
            return err("layer_norm_eps", format!("must be a positive number, got {}", self.layer_norm_eps));
        }
        Ok(())
    }

    /// Width of one attention head, `d_model / n_head`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_head
    }

    /// Parameter count implied by the config (equals [`crate::Gpt::num_params`] of the built
    /// model): embeddings `V·C + L_ctx·C`, per block `12·C² + 13·C` with biases (`12·C² + 4·C`
    /// LayerNorm-gain-only without), final LayerNorm, and an untied head `C·V`.
    pub fn num_params(&self) -> usize {
        let c = self.d_model;
        let b = usize::from(self.bias);
        let ln = c + b * c;
        let attn = c * 3 * c + b * 3 * c + c * c + b * c;
        let mlp = c * 4 * c + b * 4 * c + 4 * c * c + b * c;
        let block = 2 * ln + attn + mlp;
        let head = if self.tie_embeddings { 0 } else { c * self.vocab_size };
        self.vocab_size * c + self.block_size * c + self.n_layer * block + ln + head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_preset_has_124m_parameters() {
        let cfg = GptConfig::preset("gpt2").unwrap();
        // 124,475,904 with the padded vocabulary (nanoGPT prints 123.65M non-embedding + wpe).
        assert_eq!(cfg.num_params(), 124_475_904);
        let mut unpadded = cfg.clone();
        unpadded.vocab_size = 50257;
        // The published GPT-2 small: 124,439,808 parameters.
        assert_eq!(unpadded.num_params(), 124_439_808);
    }

    #[test]
    fn every_preset_validates() {
        for name in PRESETS {
            GptConfig::preset(name).unwrap().validate().unwrap();
        }
        assert!(GptConfig::preset("gpt5").is_none());
    }

    #[test]
    fn d_model_not_divisible_by_n_head_is_an_error_naming_both() {
        let err = GptConfig::new(65, 2, 3, 128, 64).validate().unwrap_err();
        assert_eq!(err.field, "d_model");
        assert!(err.to_string().contains("divisible by n_head (3), got 128"), "{err}");
    }

    #[test]
    fn zero_sizes_and_bad_dropout_are_errors() {
        assert_eq!(GptConfig::new(0, 2, 2, 8, 4).validate().unwrap_err().field, "vocab_size");
        let err = GptConfig::new(8, 2, 2, 8, 4).with_dropout(1.0).validate().unwrap_err();
        assert_eq!(err.field, "dropout");
    }

    #[test]
    fn gelu_kind_serializes_lowercase() {
        let cfg = GptConfig::new(8, 1, 1, 8, 4).with_gelu(GeluKind::Erf);
        let json = serde_json_like(&cfg);
        assert!(json.contains("\"gelu\": \"erf\""), "{json}");
    }

    fn serde_json_like(cfg: &GptConfig) -> String {
        // Burn's Config derive provides `save`/JSON through serde_json.
        burn::config::config_to_json(cfg)
    }
}
