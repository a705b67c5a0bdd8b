//! GPT-2 causal self-attention with a fused q|k|v projection.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::config::GptConfig;
use crate::attention::{causal_attention, causal_attention_qkv, split_qkv, with_cache, LayerCache};
use crate::dropout::dropout;
use crate::packing::Packing;
use crate::{init, ops};

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
    /// holds the new positions only and attends to the cached ones too; `packing` restricts
    /// each token to its own document (see [`crate::Packing`]).
    ///
    /// Without a cache the fused op reads q, k and v as strided views of the `c_attn` output
    /// `[batch, seq_len, 3, n_head, d_head]`, and its output `[batch, seq_len, n_head,
    /// d_head]` is already in the layout `c_proj` reads (no head transposes or copies).
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: Option<LayerCache<'_, B>>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3> {
        let [batch, seq_len, d_model] = x.dims();
        let qkv = ops::linear(&self.c_attn, x); // [B, T, 3C]: q | k | v
        let y = match cache {
            None => causal_attention_qkv(qkv, self.n_head, packing, Some(&self.attn_dropout)),
            Some(cache) => {
                let (q, k, v) = split_qkv(qkv, self.n_head); // [B, T, H, Dh]
                let (k, v) = with_cache(Some(cache), k, v);
                causal_attention(q, k, v, packing, Some(&self.attn_dropout))
            }
        }; // [B, T, H, Dh]
        dropout(&self.resid_dropout, ops::linear(&self.c_proj, y.reshape([batch, seq_len, d_model])))
    }
}
