//! Causal scaled dot-product attention shared by every architecture, and the KV cache.

use burn::nn::Dropout;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Tensor};

/// Causal attention `softmax(Q·Kᵀ/√d_head + mask)·V` per head (Vaswani et al. 2017, eq. 1).
///
/// `q`: `[batch, n_head, seq_q, d_head]`; `k`, `v`: `[batch, n_head, seq_k, d_head]` with
/// `seq_k ≥ seq_q`: query `i` sits at key position `i + seq_k − seq_q` (a KV cache holds the
/// first `seq_k − seq_q` keys). `mask` (`[batch, 1, seq_q, seq_k]`, true = hidden) replaces
/// the causal mask when documents are packed in a row (see [`crate::Packing`]). Returns
/// `[batch, n_head, seq_q, d_head]`.
///
/// Runs Burn's fused `attention` op (backends with a flash kernel use it; under autodiff Burn
/// 0.21 runs its fallback, which materializes `[batch, n_head, seq_q, seq_k]`). The explicit
/// path [`attention_reference`] runs instead when attention dropout is active (training with
/// `dropout > 0`: the fused op has no dropout) and for a multi-token query against a longer
/// cache (a case the fused op's causal flag does not define on every backend).
pub fn causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<&Tensor<B, 4, Bool>>,
    dropout: Option<&Dropout>,
) -> Tensor<B, 4> {
    let [batch, n_head, seq_q, _] = q.dims();
    let seq_k = k.dims()[2];
    let dropout = dropout.filter(|d| d.prob > 0.0 && B::ad_enabled(&q.device()));
    if dropout.is_some() || (mask.is_none() && seq_q > 1 && seq_q != seq_k) {
        return attention_reference(q, k, v, mask.cloned(), dropout);
    }
    let mask = mask.map(|m| m.clone().expand([batch, n_head, seq_q, seq_k]));
    // One query (incremental decoding) sees every cached key: no mask at all.
    let options = AttentionModuleOptions { is_causal: mask.is_none() && seq_q > 1, ..Default::default() };
    attention(q, k, v, mask, None, options)
}

/// The explicit attention path, kept as the test oracle for the fused op:
/// `softmax(Q·Kᵀ/√d_head, masked with −∞)·V`, then `dropout` on the attention weights if
/// given. The mask is `mask` (`[batch, 1, seq_q, seq_k]`, true = hidden) or else causal.
/// Shapes as [`causal_attention`]. Materializes the `[batch, n_head, seq_q, seq_k]` scores.
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
        Some(dropout) => dropout.forward(weights),
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
/// each `[batch, n_kv_head, cached_len, d_head]`.
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

    /// Appends layer `layer`'s keys and values of the new positions (`[batch, n_kv_head,
    /// new, d_head]`) and returns all of them, cached first.
    pub fn extend(&mut self, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (k, v) = match self.layers[layer].take() {
            Some((pk, pv)) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)),
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
