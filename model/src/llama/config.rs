//! [`LlamaConfig`]: hyper-parameters of a Llama-style model, presets and validation.

use burn::config::Config;

use crate::error::ConfigError;

/// Hyper-parameters of a Llama-style decoder (Touvron et al. 2023; Hugging Face
/// `LlamaConfig`): RMSNorm, rotary position embeddings, SwiGLU MLP, grouped-query attention,
/// no biases.
#[derive(Config, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Number of decoder layers (`num_hidden_layers`).
    pub n_layer: usize,
    /// Query heads (`num_attention_heads`); must divide `d_model`.
    pub n_head: usize,
    /// Key/value heads (`num_key_value_heads`); must divide `n_head` (grouped-query
    /// attention: query head `h` reads key/value head `h / (n_head / n_kv_head)`).
    pub n_kv_head: usize,
    /// Width of the residual stream (`hidden_size`).
    pub d_model: usize,
    /// Hidden width of the SwiGLU MLP (`intermediate_size`).
    pub d_ff: usize,
    /// Context length (`max_position_embeddings`).
    pub block_size: usize,
    /// RoPE base θ (`rope_theta`).
    #[config(default = 10000.0)]
    pub rope_theta: f64,
    /// RMSNorm ε (`rms_norm_eps`).
    #[config(default = 1e-5)]
    pub rms_norm_eps: f64,
    /// LM head shares the token embedding (`tie_word_embeddings`; Llama: false).
    #[config(default = false)]
    pub tie_embeddings: bool,
}

/// Names accepted by [`LlamaConfig::preset`].
pub const LLAMA_PRESETS: &[&str] = &["llama-15m", "llama-125m", "llama-tiny"];

impl LlamaConfig {
    /// A named preset:
    /// - `llama-15m`: llama2.c's TinyStories `stories15M` (dim 288, 6 layers, 6 heads, MLP 768,
    ///   context 256, vocabulary 32000, head tied to the embedding as llama2.c trains it):
    ///   15.19M parameters;
    /// - `llama-125m`: 12 layers, 12 query / 4 key-value heads, 768 wide, MLP 2048, context
    ///   1024, vocabulary 32000, untied: 124.7M parameters;
    /// - `llama-tiny`: 2 layers, 4 / 2 heads, 32 wide, context 16, vocabulary 64 (tests).
    ///
    /// Returns `None` for an unknown name (see [`LLAMA_PRESETS`]).
    pub fn preset(name: &str) -> Option<LlamaConfig> {
        Some(match name {
            "llama-15m" => LlamaConfig::new(32000, 6, 6, 6, 288, 768, 256).with_tie_embeddings(true),
            "llama-125m" => LlamaConfig::new(32000, 12, 12, 4, 768, 2048, 1024),
            "llama-tiny" => LlamaConfig::new(64, 2, 4, 2, 32, 88, 16),
            _ => return None,
        })
    }

    /// Checks that a model can be built.
    ///
    /// Errors: a size of 0; `d_model` not divisible by `n_head`; `n_head` not divisible by
    /// `n_kv_head`; an odd head width (RoPE rotates pairs); non-positive θ or ε.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, message: String| Err(ConfigError { field, message, also: None });
        let err_with = |field, also, message: String| Err(ConfigError { field, message, also: Some(also) });
        crate::error::require_positive(&[
            ("vocab_size", self.vocab_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
            ("d_model", self.d_model),
            ("d_ff", self.d_ff),
            ("block_size", self.block_size),
        ])?;
        crate::error::require_heads_divide(self.d_model, self.n_head)?;
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return err_with(
                "n_kv_head",
                "n_head",
                format!("must divide n_head ({}), got {}", self.n_head, self.n_kv_head),
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            return err_with(
                "d_model",
                "n_head",
                format!("d_model / n_head must be even for RoPE, got {}", self.head_dim()),
            );
        }
        for (field, value) in [("rope_theta", self.rope_theta), ("rms_norm_eps", self.rms_norm_eps)] {
            if !(value > 0.0 && value.is_finite()) {
                return err(field, format!("must be a positive number, got {value}"));
            }
        }
        Ok(())
    }

    /// Width of one head, `d_model / n_head`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_head
    }

    /// Parameter count: embedding `V·C`, per layer `C·(C + 2·kv·Dh) + C·C` attention,
    /// `3·C·F` MLP and two RMSNorm gains `2·C`, the final norm `C`, an untied head `C·V`.
    pub fn num_params(&self) -> usize {
        let (c, f) = (self.d_model, self.d_ff);
        let kv = self.n_kv_head * self.head_dim();
        let layer = c * c + 2 * c * kv + c * c + 3 * c * f + 2 * c;
        let head = if self.tie_embeddings { 0 } else { c * self.vocab_size };
        self.vocab_size * c + self.n_layer * layer + c + head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_stated_sizes() {
        assert_eq!(LlamaConfig::preset("llama-15m").unwrap().num_params(), 15_191_712);
        assert_eq!(LlamaConfig::preset("llama-125m").unwrap().num_params(), 124_668_672);
        for name in LLAMA_PRESETS {
            LlamaConfig::preset(name).unwrap().validate().unwrap();
        }
    }

    #[test]
    fn gqa_heads_must_divide() {
        let err = LlamaConfig::new(8, 1, 6, 4, 48, 64, 8).validate().unwrap_err();
        assert_eq!(err.field, "n_kv_head");
        assert!(err.to_string().contains("must divide n_head (6), got 4"), "{err}");
    }
}
