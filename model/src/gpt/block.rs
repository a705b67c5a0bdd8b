//! One pre-LayerNorm Transformer block (GPT-2: Radford et al. 2019 §2.3).

use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::attention::CausalSelfAttention;
use super::config::GptConfig;
use super::mlp::Mlp;
use crate::attention::LayerCache;
use crate::ops::norm::layer_norm_module;
use crate::ops::residual_add;
use crate::packing::Packing;

/// `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    /// LayerNorm before attention.
    pub ln_1: LayerNorm<B>,
    /// Causal self-attention.
    pub attn: CausalSelfAttention<B>,
    /// LayerNorm before the MLP.
    pub ln_2: LayerNorm<B>,
    /// Feed-forward block.
    pub mlp: Mlp<B>,
    /// The LayerNorms' ε (`GptConfig::layer_norm_eps`; Burn's `LayerNorm` keeps its own
    /// private). A constant like `Gpt::block_size`: its record entry is empty, so checkpoints
    /// hold the same parameters and older ones still load.
    ln_eps: f64,
}

impl<B: Backend> Block<B> {
    /// Builds a block with GPT-2 initialization.
    pub fn new(config: &GptConfig, device: &B::Device) -> Self {
        Self {
            ln_1: layer_norm(config, device),
            attn: CausalSelfAttention::new(config, device),
            ln_2: layer_norm(config, device),
            mlp: Mlp::new(config, device),
            ln_eps: config.layer_norm_eps,
        }
    }

    /// `x`: `[batch, seq_len, d_model]` → `[batch, seq_len, d_model]` (with a cache: the new
    /// positions only; `packing`: packed documents).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: Option<LayerCache<'_, B>>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3> {
        // LayerNorm and the residual adds are fused ops (ops::norm, ops::residual).
        let ln = |ln: &LayerNorm<B>, x: Tensor<B, 3>| layer_norm_module(ln, x, self.ln_eps);
        let x = residual_add(x.clone(), self.attn.forward(ln(&self.ln_1, x), cache, packing));
        residual_add(x.clone(), self.mlp.forward(ln(&self.ln_2, x)))
    }
}

/// A LayerNorm over `d_model` (gain 1, bias 0 when `config.bias`): the parameter holder; the
/// forward is [`crate::ops::layer_norm`].
pub fn layer_norm<B: Backend>(config: &GptConfig, device: &B::Device) -> LayerNorm<B> {
    LayerNormConfig::new(config.d_model)
        .with_epsilon(config.layer_norm_eps)
        .with_bias(config.bias)
        .init(device)
}
