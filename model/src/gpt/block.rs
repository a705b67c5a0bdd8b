//! One pre-LayerNorm Transformer block (GPT-2: Radford et al. 2019 §2.3).

use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

use super::attention::CausalSelfAttention;
use super::config::GptConfig;
use super::mlp::Mlp;
use crate::attention::LayerCache;

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
}

impl<B: Backend> Block<B> {
    /// Builds a block with GPT-2 initialization.
    pub fn new(config: &GptConfig, device: &B::Device) -> Self {
        Self {
            ln_1: layer_norm(config, device),
            attn: CausalSelfAttention::new(config, device),
            ln_2: layer_norm(config, device),
            mlp: Mlp::new(config, device),
        }
    }

    /// `x`: `[batch, seq_len, d_model]` → `[batch, seq_len, d_model]` (with a cache: the new
    /// positions only; `mask`: packed documents).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: Option<LayerCache<'_, B>>,
        mask: Option<&Tensor<B, 4, Bool>>,
    ) -> Tensor<B, 3> {
        let x = x.clone() + self.attn.forward(self.ln_1.forward(x), cache, mask);
        x.clone() + self.mlp.forward(self.ln_2.forward(x))
    }
}

/// A LayerNorm over `d_model` (gain 1, bias 0 when `config.bias`).
pub fn layer_norm<B: Backend>(config: &GptConfig, device: &B::Device) -> LayerNorm<B> {
    LayerNormConfig::new(config.d_model)
        .with_epsilon(config.layer_norm_eps)
        .with_bias(config.bias)
        .init(device)
}
