//! Grouped-query causal self-attention with rotary position embeddings.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::config::LlamaConfig;
use super::rope::apply_rope;
use crate::attention::{causal_attention, with_cache, LayerCache};
use crate::packing::Packing;
use crate::{init, ops};

/// Llama self-attention (Hugging Face `LlamaAttention`): q, k, v projections without bias,
/// RoPE on q and k, `n_kv_head` key/value heads shared by groups of query heads
/// (Ainslie et al. 2023, GQA), causal softmax attention, output projection.
#[derive(Module, Debug)]
pub struct LlamaAttention<B: Backend> {
    /// `[d_model, n_head·d_head]` (Hugging Face stores the transpose, `[out, in]`).
    pub q_proj: Linear<B>,
    /// `[d_model, n_kv_head·d_head]`.
    pub k_proj: Linear<B>,
    /// `[d_model, n_kv_head·d_head]`.
    pub v_proj: Linear<B>,
    /// `[n_head·d_head, d_model]`.
    pub o_proj: Linear<B>,
    n_head: usize,
    n_kv_head: usize,
}

impl<B: Backend> LlamaAttention<B> {
    /// Builds the block; weights ~ N(0, 0.02) (Hugging Face `initializer_range`).
    pub fn new(config: &LlamaConfig, device: &B::Device) -> Self {
        let (c, dh) = (config.d_model, config.head_dim());
        let linear = |i, o| init::linear(i, o, false, init::INIT_STD, device);
        Self {
            q_proj: linear(c, config.n_head * dh),
            k_proj: linear(c, config.n_kv_head * dh),
            v_proj: linear(c, config.n_kv_head * dh),
            o_proj: linear(config.n_head * dh, c),
            n_head: config.n_head,
            n_kv_head: config.n_kv_head,
        }
    }

    /// `x`: `[batch, seq_len, d_model]` → `[batch, seq_len, d_model]`; `cos`/`sin`: the RoPE
    /// tables of the positions of `x` (`[batch or 1, seq_len, 1, d_head]`); `packing` restricts
    /// each token to its own document (see [`crate::Packing`]).
    ///
    /// Heads stay in the projections' layout `[batch, seq_len, heads, d_head]` throughout
    /// (RoPE, the fused attention with grouped kv heads read in place — no `repeat_kv` copy —
    /// and the output projection), so no transpose is ever copied.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cos: Tensor<B, 4>,
        sin: Tensor<B, 4>,
        cache: Option<LayerCache<'_, B>>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3> {
        let [batch, seq_len, d_model] = x.dims();
        let d_head = d_model / self.n_head;
        let heads = |t: Tensor<B, 3>, n: usize| t.reshape([batch, seq_len, n, d_head]);
        let q = heads(ops::linear(&self.q_proj, x.clone()), self.n_head); // [B, T, H, Dh]
        let k = heads(ops::linear(&self.k_proj, x.clone()), self.n_kv_head); // [B, T, KV, Dh]
        let v = heads(ops::linear(&self.v_proj, x), self.n_kv_head);
        let q = apply_rope(q, cos.clone(), sin.clone());
        let k = apply_rope(k, cos, sin);
        let (k, v) = with_cache(cache, k, v); // [B, T_all, KV, Dh]
        let y = causal_attention(q, k, v, packing, None); // [B, T, H, Dh]
        ops::linear(&self.o_proj, y.reshape([batch, seq_len, d_model]))
    }
}
