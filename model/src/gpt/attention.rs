//! GPT-2 causal self-attention with a fused q|k|v projection.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

use super::config::GptConfig;
use crate::attention::{causal_attention, with_cache, LayerCache};
use crate::init;

/// Multi-head causal self-attention (Radford et al. 2019; nanoGPT `CausalSelfAttention`).
/// Parameter names follow Hugging Face GPT-2 (`c_attn` = q|k|v fused, `c_proj`).
#[derive(Module, Debug)]
pub struct CausalSelfAttention<B: Backend> {
    /// Fused projection `[d_model, 3·d_model]`: columns are q, then k, then v; heads are
    /// contiguous chunks of `d_head` within each.
    pub c_attn: Linear<B>,
    /// Output projection `[d_model, d_model]`.
    pub c_proj: Linear<B>,
    attn_dropout: Dropout,
    resid_dropout: Dropout,
    n_head: usize,
}

impl<B: Backend> CausalSelfAttention<B> {
    /// Builds the block with GPT-2 initialization (see [`crate::init`]).
    pub fn new(config: &GptConfig, device: &B::Device) -> Self {
        let c = config.d_model;
        Self {
            c_attn: init::linear(c, 3 * c, config.bias, init::INIT_STD, device),
            c_proj: init::linear(c, c, config.bias, init::residual_std(config.n_layer), device),
            attn_dropout: DropoutConfig::new(config.dropout).init(),
            resid_dropout: DropoutConfig::new(config.dropout).init(),
            n_head: config.n_head,
        }
    }

    /// `x`: `[batch, seq_len, d_model]` → `[batch, seq_len, d_model]`; with a cache, `x`
    /// holds the new positions only and attends to the cached ones too; `mask` replaces the
    /// causal mask for packed documents (see [`crate::Packing`]).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: Option<LayerCache<'_, B>>,
        mask: Option<&Tensor<B, 4, Bool>>,
    ) -> Tensor<B, 3> {
        let [batch, seq_len, d_model] = x.dims();
        let heads = |t: Tensor<B, 3>| {
            t.reshape([batch, seq_len, self.n_head, d_model / self.n_head]).swap_dims(1, 2)
            // [B, H, T, Dh]
        };
        let mut qkv = self.c_attn.forward(x).chunk(3, 2).into_iter().map(heads); // q | k | v
        let (q, k, v) = (qkv.next().unwrap(), qkv.next().unwrap(), qkv.next().unwrap());
        let (k, v) = with_cache(cache, k, v);
        let y = causal_attention(q, k, v, mask, Some(&self.attn_dropout)); // [B, H, T, Dh]
        let y = y.swap_dims(1, 2).reshape([batch, seq_len, d_model]);
        self.resid_dropout.forward(self.c_proj.forward(y))
    }
}
