//! Causal scaled dot-product attention shared by every architecture, and the KV cache.

use burn::nn::Dropout;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

use crate::ops::{flash_attention, flash_attention_qkv};
use crate::packing::Packing;

/// Causal attention `softmax(Q·Kᵀ/√d_head + mask)·V` per head (Vaswani et al. 2017, eq. 1),
/// in the "BTHD" layout (as flash-attn).
///
/// `q`: `[batch, seq_q, n_head, d_head]`; `k`, `v`: `[batch, seq_k, n_kv_head, d_head]` with
/// `n_head` a multiple of `n_kv_head` (grouped-query attention: query head `h` reads kv head
/// `h / (n_head / n_kv_head)`) and `seq_k ≥ seq_q`: query `i` sits at key position
/// `i + seq_k − seq_q` (a KV cache holds the first `seq_k − seq_q` keys). `packing` restricts
/// each token to its own document (see [`Packing`]). Returns `[batch, seq_q, n_head, d_head]`.
///
/// Training and full-sequence forwards (`seq_q = seq_k`) run the fused flash-style op
/// ([`crate::ops::FusedAttention`]: under autodiff it keeps the output and a log-sum-exp per
/// row, never the `[batch, n_head, seq, seq]` probabilities; packed documents go in as
/// `Packing::positions`). The explicit path [`attention_reference`] runs instead when
/// attention dropout is active (training with `dropout > 0`: the fused op has no dropout) and
/// for queries against a longer cache (incremental decoding).
pub fn causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    packing: Option<&Packing<B>>,
    dropout: Option<&Dropout>,
) -> Tensor<B, 4> {
    let dropout = active::<B>(dropout, &q.device());
    if dropout.is_none() && q.dims()[1] == k.dims()[1] {
        return flash_attention(q, k, v, packing.map(|p| p.positions.clone()));
    }
    let n_head = q.dims()[2];
    let (k, v) = (heads_first(k, n_head), heads_first(v, n_head));
    let mask = packing.map(|p| p.mask.clone());
    attention_reference(q.swap_dims(1, 2), k, v, mask, dropout).swap_dims(1, 2)
}

/// [`causal_attention`] over GPT's fused projection `qkv` `[batch, seq, 3·n_head·d_head]`
/// (q | k | v, heads contiguous chunks of `d_head` within each) → `[batch, seq, n_head,
/// d_head]`. The fused op reads q, k and v in place and, under autodiff, writes the gradient
/// of `qkv` as one buffer; with attention dropout the explicit path runs on the chunks.
pub fn causal_attention_qkv<B: Backend>(
    qkv: Tensor<B, 3>,
    n_head: usize,
    packing: Option<&Packing<B>>,
    dropout: Option<&Dropout>,
) -> Tensor<B, 4> {
    if active::<B>(dropout, &qkv.device()).is_none() {
        return flash_attention_qkv(qkv, n_head, packing.map(|p| p.positions.clone()));
    }
    let (q, k, v) = split_qkv(qkv, n_head);
    causal_attention(q, k, v, packing, dropout)
}

/// `qkv` `[batch, seq, 3·n_head·d_head]` → q, k, v `[batch, seq, n_head, d_head]`.
pub fn split_qkv<B: Backend>(qkv: Tensor<B, 3>, n_head: usize) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    let [batch, seq, c3] = qkv.dims();
    let heads = |t: Tensor<B, 3>| t.reshape([batch, seq, n_head, c3 / 3 / n_head]);
    let mut parts = qkv.chunk(3, 2).into_iter().map(heads);
    (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap())
}

/// The dropout to apply to the attention weights: only in training (autodiff, or a graph-free
/// training pass) with `prob > 0` ([`crate::dropout::is_active`]).
fn active<'a, B: Backend>(dropout: Option<&'a Dropout>, device: &B::Device) -> Option<&'a Dropout> {
    dropout.filter(|d| crate::dropout::is_active::<B>(d, device))
}

/// `[batch, seq, n_kv, d_head]` → `[batch, n_head, seq, d_head]`, each kv head repeated for its
/// `n_head / n_kv` query heads (Hugging Face `repeat_kv`).
fn heads_first<B: Backend>(x: Tensor<B, 4>, n_head: usize) -> Tensor<B, 4> {
    let x = x.swap_dims(1, 2);
    let [batch, n_kv, len, d_head] = x.dims();
    if n_kv == n_head {
        return x;
    }
    x.unsqueeze_dim::<5>(2)
        .expand([batch, n_kv, n_head / n_kv, len, d_head])
        .reshape([batch, n_head, len, d_head])
}

/// The explicit attention path, kept as the test oracle for the fused op:
/// `softmax(Q·Kᵀ/√d_head, masked with −∞)·V`, then `dropout` on the attention weights if
/// given. The mask is `mask` (`[batch, 1, seq_q, seq_k]`, true = hidden) or else causal.
/// Heads first: `q` `[batch, n_head, seq_q, d_head]`, `k`, `v` `[batch, n_head, seq_k,
/// d_head]` (kv heads already repeated) → `[batch, n_head, seq_q, d_head]`. Materializes the
/// `[batch, n_head, seq_q, seq_k]` scores.
pub fn attention_reference<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    dropout: Option<&Dropout>,
) -> Tensor<B, 4> {
    let [batch, n_head, seq_q, d_head] = q.dims();
    let seq_k = k.dims()[2];
    let scores = q.matmul(k.swap_dims(2, 3)) / (d_head as f64).sqrt(); // [B, H, Tq, Tk]
    let mask = mask.unwrap_or_else(|| causal_mask::<B>(seq_q, seq_k, &scores.device()));
    let weights = softmax(scores.mask_fill(mask.expand([batch, n_head, seq_q, seq_k]), f32::NEG_INFINITY), 3);
    let weights = match dropout {
        Some(dropout) => crate::dropout::dropout(dropout, weights),
        None => weights,
    };
    weights.matmul(v)
}

/// `[1, 1, seq_q, seq_k]`, true where key `j` is in the future of query `i`
/// (`j > i + seq_k − seq_q`).
fn causal_mask<B: Backend>(seq_q: usize, seq_k: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let offset = (seq_k - seq_q) as i64;
    Tensor::<B, 2, Bool>::tril_mask([seq_q, seq_k], offset, device).unsqueeze::<4>()
}

/// Keys and values of earlier positions for incremental decoding, one entry per layer,
/// each `[batch, cached_len, n_kv_head, d_head]` (the layout of [`causal_attention`]).
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
    len: usize,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for a model of `n_layer` layers.
    pub fn new(n_layer: usize) -> Self {
        Self { layers: vec![None; n_layer], len: 0 }
    }

    /// Positions cached so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first forward.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends layer `layer`'s keys and values of the new positions (`[batch, new,
    /// n_kv_head, d_head]`) and returns all of them, cached first.
    pub fn extend(&mut self, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (k, v) = match self.layers[layer].take() {
            Some((pk, pv)) => (Tensor::cat(vec![pk, k], 1), Tensor::cat(vec![pv, v], 1)),
            None => (k, v),
        };
        self.layers[layer] = Some((k.clone(), v.clone()));
        (k, v)
    }

    /// Records that a forward pass appended `new` positions to every layer.
    pub fn advance(&mut self, new: usize) {
        self.len += new;
    }
}

/// The position of the first of `len` new tokens: after the cached ones, or 0 without a cache.
///
/// # Panics
/// If the positions would exceed the context length `block_size`.
pub fn first_position<B: Backend>(cache: &Option<&mut KvCache<B>>, len: usize, block_size: usize) -> usize {
    let start = cache.as_ref().map_or(0, |c| c.len());
    assert!(
        start + len <= block_size,
        "{} positions exceed the context length (block_size {block_size})",
        start + len
    );
    start
}

/// An optional cache of one layer: lets a block run with or without a [`KvCache`].
pub struct LayerCache<'a, B: Backend> {
    /// The model's cache.
    pub cache: &'a mut KvCache<B>,
    /// This layer's index in it.
    pub layer: usize,
}

/// Keys/values to attend over: the new ones alone, or appended to the layer's cache.
pub fn with_cache<B: Backend>(
    cache: Option<LayerCache<'_, B>>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    match cache {
        Some(LayerCache { cache, layer }) => cache.extend(layer, k, v),
        None => (k, v),
    }
}
