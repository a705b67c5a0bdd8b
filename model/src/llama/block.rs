//! One Llama decoder layer.

use burn::module::Module;
use burn::nn::{RmsNorm, RmsNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::attention::LlamaAttention;
use super::config::LlamaConfig;
use super::mlp::LlamaMlp;
use crate::attention::LayerCache;
use crate::ops::norm::rms_norm_module;
use crate::ops::residual_add;
use crate::packing::Packing;

/// `h = x + attn(rms(x))`, `out = h + mlp(rms(h))` (Hugging Face `LlamaDecoderLayer`).
#[derive(Module, Debug)]
pub struct LlamaLayer<B: Backend> {
    /// RMSNorm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Self-attention.
    pub self_attn: LlamaAttention<B>,
    /// RMSNorm before the MLP.
    pub post_attention_layernorm: RmsNorm<B>,
    /// SwiGLU MLP.
    pub mlp: LlamaMlp<B>,
}

impl<B: Backend> LlamaLayer<B> {
    /// Builds a layer (RMSNorm gains 1).
    pub fn new(config: &LlamaConfig, device: &B::Device) -> Self {
        Self {
            input_layernorm: rms_norm(config, device),
            self_attn: LlamaAttention::new(config, device),
            post_attention_layernorm: rms_norm(config, device),
            mlp: LlamaMlp::new(config, device),
        }
    }

    /// `x`: `[batch, seq_len, d_model]` → `[batch, seq_len, d_model]`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cos: Tensor<B, 4>,
        sin: Tensor<B, 4>,
        cache: Option<LayerCache<'_, B>>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3> {
        let h = residual_add(
            x.clone(),
            self.self_attn.forward(rms_norm_module(&self.input_layernorm, x), cos, sin, cache, packing),
        );
        residual_add(h.clone(), self.mlp.forward(rms_norm_module(&self.post_attention_layernorm, h)))
    }
}

/// RMSNorm over `d_model`: `x / √(mean(x²) + ε) · g` (Zhang & Sennrich 2019, eq. 4), computed
/// in f32. The module holds the parameters and ε; the forward is [`crate::ops::rms_norm`].
pub fn rms_norm<B: Backend>(config: &LlamaConfig, device: &B::Device) -> RmsNorm<B> {
    RmsNormConfig::new(config.d_model).with_epsilon(config.rms_norm_eps).init(device)
}
