//! The decoder-only skeleton both architectures share: logits of every position, of packed
//! rows, or of new tokens after a KV cache — all the final norm's hidden states through the LM
//! head — and the loop of blocks over a cache. What differs (embeddings, positions, blocks,
//! norms) stays in each architecture's folder.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use crate::attention::{first_position, KvCache, LayerCache};
use crate::packing::{positions, Packing};

/// A decoder-only language model: an architecture gives its hidden states and head, and gets
/// the forward passes.
pub trait Decoder<B: Backend> {
    /// Final hidden states (after the last norm) of `tokens`: `[batch, seq_len]` →
    /// `[batch, seq_len, d_model]`, at positions after the cached ones (`cache`), or restarting
    /// at each document of a packed row (`packing`).
    ///
    /// # Panics
    /// If the cached and new positions exceed `block_size`.
    fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3>;

    /// Hidden states `[batch, seq_len, d_model]` → logits `[batch, seq_len, vocab]` (through
    /// the token embedding's transpose when tied).
    fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3>;

    /// Number of blocks (layers of the KV cache).
    fn n_layer(&self) -> usize;

    /// The input of the first block, `tokens` `[batch, seq_len]` → `[batch, seq_len,
    /// d_model]`: embeddings (GPT-2: plus position embeddings, then dropout), at positions from
    /// 0 or restarting at each document (`packing`). With [`Decoder::block`] and
    /// [`Decoder::final_norm`], the stages of [`Decoder::hidden`] without a cache, for callers
    /// that run them apart ([`crate::checkpoint`]).
    fn embed(&self, tokens: Tensor<B, 2, Int>, packing: Option<&Packing<B>>) -> Tensor<B, 3>;

    /// What every block of a forward over `tokens` (`[batch, seq_len]`) reads besides its
    /// input (Llama: the RoPE tables of the positions).
    fn block_inputs(&self, tokens: &Tensor<B, 2, Int>, packing: Option<&Packing<B>>) -> BlockInputs<B>;

    /// Block `layer` (from 0) without a cache: `[batch, seq_len, d_model]` → same.
    fn block(
        &self,
        layer: usize,
        x: Tensor<B, 3>,
        inputs: &BlockInputs<B>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3>;

    /// The norm after the last block: `[batch, seq_len, d_model]` → same.
    fn final_norm(&self, x: Tensor<B, 3>) -> Tensor<B, 3>;

    /// Context length: the most positions a sequence may have.
    fn block_size(&self) -> usize;

    /// Logits for every position (teacher forcing): `tokens` `[batch, seq_len]` (ids in
    /// `[0, vocab_size)`, `seq_len ≤ block_size`) → `[batch, seq_len, vocab_size]`
    /// unnormalized logits; position `t` scores token `t + 1`.
    ///
    /// # Panics
    /// If `seq_len > block_size` (callers crop; the CLI validates before calling).
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.lm_head(self.hidden(tokens, None, None))
    }

    /// Logits `[batch, seq_len, vocab]` of rows that pack several documents: each token
    /// attends only to its own document, at positions counted from the document's start
    /// (see [`Packing`]). A document's logits equal those it gets alone.
    fn forward_packed(&self, tokens: Tensor<B, 2, Int>, packing: &Packing<B>) -> Tensor<B, 3> {
        self.lm_head(self.hidden(tokens, None, Some(packing)))
    }

    /// Incremental decoding: logits `[batch, new, vocab]` of the `new` tokens `tokens`
    /// (`[batch, new]`) that follow the cached positions; appends their keys and values to
    /// `cache`. Equal to the last `new` positions of [`Decoder::forward`] on the whole
    /// sequence.
    ///
    /// # Panics
    /// If `cache.len() + new > block_size`.
    fn forward_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        self.lm_head(self.hidden(tokens, Some(cache), None))
    }

    /// An empty cache for [`Decoder::forward_cached`].
    fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.n_layer())
    }
}

/// What the blocks of one forward share besides the residual stream: constants computed once
/// from the positions ([`Decoder::block_inputs`]).
#[derive(Clone, Debug)]
pub struct BlockInputs<B: Backend> {
    /// Llama's RoPE `(cos, sin)` tables, each `[1 or batch, seq_len, 1, d_head / 2]`; `None`
    /// for GPT-2.
    pub rope: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
}

/// The positions of `tokens` (`[batch, seq_len]`): after the cached ones, or restarting at each
/// document of a packed row; `[1 or batch, seq_len]`.
///
/// # Panics
/// If the cached and new positions exceed `block_size`.
pub(crate) fn new_positions<B: Backend>(
    tokens: &Tensor<B, 2, Int>,
    cache: &Option<&mut KvCache<B>>,
    packing: Option<&Packing<B>>,
    block_size: usize,
) -> Tensor<B, 2, Int> {
    let [_, seq_len] = tokens.dims();
    let start = first_position(cache, seq_len, block_size);
    positions(packing, start, seq_len, &tokens.device())
}

/// Runs `n_layer` blocks over `x` (`[batch, seq_len, d_model]`), block `i` as
/// `block(i, x, its layer of the cache)` in dropout stage `i + 1` ([`crate::dropout`]), then
/// marks the `seq_len` new positions as cached.
pub(crate) fn through_blocks<B: Backend>(
    mut x: Tensor<B, 3>,
    n_layer: usize,
    mut cache: Option<&mut KvCache<B>>,
    mut block: impl FnMut(usize, Tensor<B, 3>, Option<LayerCache<'_, B>>) -> Tensor<B, 3>,
) -> Tensor<B, 3> {
    let seq_len = x.dims()[1];
    for layer in 0..n_layer {
        let layer_cache = cache.as_deref_mut().map(|cache| LayerCache { cache, layer });
        crate::dropout::enter_block(layer);
        x = block(layer, x, layer_cache);
    }
    if let Some(cache) = cache {
        cache.advance(seq_len);
    }
    x
}
