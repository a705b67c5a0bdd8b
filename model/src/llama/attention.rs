//! Grouped-query causal self-attention with rotary position embeddings.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

use super::config::LlamaConfig;
use super::rope::apply_rope;
use crate::attention::{causal_attention, with_cache, LayerCache};
use crate::init;

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
    /// tables of the positions of `x` (`[batch or 1, 1, seq_len, d_head]`); `mask` replaces the
    /// causal mask for packed documents.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        cos: Tensor<B, 4>,
        sin: Tensor<B, 4>,
        cache: Option<LayerCache<'_, B>>,
        mask: Option<&Tensor<B, 4, Bool>>,
    ) -> Tensor<B, 3> {
        let [batch, seq_len, d_model] = x.dims();
        let d_head = d_model / self.n_head;
        let heads = |t: Tensor<B, 3>, n: usize| t.reshape([batch, seq_len, n, d_head]).swap_dims(1, 2);
        let q = heads(self.q_proj.forward(x.clone()), self.n_head); // [B, H, T, Dh]
        let k = heads(self.k_proj.forward(x.clone()), self.n_kv_head); // [B, KV, T, Dh]
        let v = heads(self.v_proj.forward(x), self.n_kv_head);
        let q = apply_rope(q, cos.clone(), sin.clone());
        let k = apply_rope(k, cos, sin);
        let (k, v) = with_cache(cache, k, v); // [B, KV, T_all, Dh]
        let (k, v) = (self.repeat_kv(k), self.repeat_kv(v)); // [B, H, T_all, Dh]
        let y = causal_attention(q, k, v, mask, None);
        self.o_proj.forward(y.swap_dims(1, 2).reshape([batch, seq_len, d_model]))
    }

    /// `[batch, n_kv_head, len, d_head]` → `[batch, n_head, len, d_head]`, each key/value head
    /// repeated for its `n_head / n_kv_head` query heads (Hugging Face `repeat_kv`).
    fn repeat_kv(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let n_rep = self.n_head / self.n_kv_head;
        if n_rep == 1 {
            return x;
        }
        let [batch, kv, len, d_head] = x.dims();
        x.unsqueeze_dim::<5>(2).expand([batch, kv, n_rep, len, d_head]).reshape([
            batch,
            kv * n_rep,
            len,
            d_head,
        ])
    }
}
