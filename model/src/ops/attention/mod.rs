//! Causal self-attention, flash-style (FlashAttention-2: Dao 2023, Algorithms 1 and 2): the
//! forward keeps only the output and each query row's log-sum-exp, never the `[T, T]`
//! probabilities; the backward recomputes them block by block from q, k and the log-sum-exp.
//!
//! Layout "BTHD" as flash-attn: q `[batch, seq, n_head, d_head]`, k and v `[batch, seq,
//! n_kv_head, d_head]` with `n_head` a multiple of `n_kv_head` (grouped-query attention,
//! Ainslie et al. 2023: query head `h` reads kv head `h / (n_head / n_kv_head)`, no copies).
//! Inputs may have any strides; the output is contiguous `[batch, seq, n_head, d_head]`, so
//! merging the heads (`reshape([batch, seq, n_head·d_head])`) is free. Scale `1/√d_head`.
//!
//! Packed documents (see [`crate::Packing`]) are given as each token's position within its
//! document, `positions` `[batch, seq]` (Int): query `i` sees keys `j` with
//! `i − pos_i ≤ j ≤ i` (the documents of a row are contiguous), never as a `[T, T]` mask.
//! Positions are clamped to `0..=i`, so every query sees at least itself and no row of the
//! softmax is empty (a negative position makes a token see only itself).

mod autodiff;
pub(crate) mod composed;
#[cfg(feature = "cube")]
mod cube;
mod flex;
#[cfg(test)]
mod tests;

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorPrimitive};

use super::dispatch::{same, with_fused_backend};

/// Fused causal attention, as a Burn backend extension (see the module docs for the layout
/// and masking). The defaults are composed Burn ops, so every backend works; Flex overrides
/// them with blocked kernels on raw buffers, Burn's CubeCL backends (CUDA, HIP, wgpu; feature
/// `cube`) with flash kernels, and `Autodiff<B>` records one graph node whose
/// backward calls `B`'s fused backward with only the saved output and log-sum-exp.
pub trait FusedAttention: Backend {
    /// `softmax(q·kᵀ/√d_head, causal and document mask)·v` (Vaswani et al. 2017, eq. 1).
    /// q `[B, T, H, D]`, k, v `[B, T, KV, D]`, positions `[B, T]` (Int) or `None` (one
    /// document per row) → `[B, T, H, D]` contiguous.
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        composed::attention::<Self>(q, k, v, positions)
    }

    /// The forward that backward needs: `(out, lse)` with `out` as [`Self::fused_attention`]
    /// and `lse[b, h, i] = log Σ_j exp(s_ij)` over the keys `j` query `i` sees, where
    /// `s_ij = q_i·k_j/√d_head` (`[B, H, T]`, f32 for f32 inputs; FlashAttention-2 Algorithm 1,
    /// `L_i = m_i + log ℓ_i`).
    fn fused_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed::forward::<Self>(q, k, v, positions)
    }

    /// `(dq, dk, dv)` given `dout` (`[B, T, H, D]`), from the forward's inputs, `out` and `lse`
    /// (FlashAttention-2 Algorithm 2): `P_ij = exp(s_ij − lse_i)` recomputed,
    /// `D_i = rowsum(dO ∘ O)_i`, `dV = Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = P ∘ (dP − D)`,
    /// `dQ = dS·K/√d_head`, `dK = dSᵀ·Q/√d_head`; with GQA, dk and dv sum over the query heads
    /// of a group. Shapes as the inputs (`dk`, `dv`: `[B, T, KV, D]`), contiguous.
    #[allow(clippy::too_many_arguments)]
    fn fused_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        composed::backward::<Self>(q, k, v, out, lse, dout, positions)
    }

    /// GPT's entry: attention over the fused projection `qkv` `[B, T, 3·H·D]` (q, then k, then
    /// v; heads contiguous chunks of `D` within each, as nanoGPT's `c_attn`), read in place;
    /// → `[B, T, H, D]` contiguous. Under autodiff `qkv` is one parent whose gradient is one
    /// `[B, T, 3·H·D]` buffer (no zero-padded gradient per chunk).
    fn fused_attention_qkv(
        qkv: FloatTensor<Self>,
        n_head: usize,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        let (q, k, v) = composed::split_qkv::<Self>(qkv, n_head);
        Self::fused_attention(q, k, v, positions)
    }

    /// `(out, lse)` of [`Self::fused_attention_qkv`], as [`Self::fused_attention_forward`].
    fn fused_attention_qkv_forward(
        qkv: FloatTensor<Self>,
        n_head: usize,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (q, k, v) = composed::split_qkv::<Self>(qkv, n_head);
        Self::fused_attention_forward(q, k, v, positions)
    }

    /// `dqkv` `[B, T, 3·H·D]` (dq | dk | dv along the last axis), as
    /// [`Self::fused_attention_backward`].
    fn fused_attention_qkv_backward(
        qkv: FloatTensor<Self>,
        n_head: usize,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        let (q, k, v) = composed::split_qkv::<Self>(qkv, n_head);
        let (dq, dk, dv) = Self::fused_attention_backward(q, k, v, out, lse, dout, positions);
        composed::merge_qkv::<Self>(dq, dk, dv)
    }
}

/// Causal attention `softmax(q·kᵀ/√d_head)·v` in the BTHD layout (see the module docs), fused
/// where the backend has it ([`FusedAttention`]), else composed tensor ops.
/// q `[B, T, H, D]`, k, v `[B, T, KV, D]`, `positions` `[B, T]` for packed documents →
/// `[B, T, H, D]`.
pub fn flash_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    positions: Option<Tensor<B, 2, Int>>,
) -> Tensor<B, 4> {
    let (q, k, v) = (q.into_primitive().tensor(), k.into_primitive().tensor(), v.into_primitive().tensor());
    let positions = positions.map(|p| p.into_primitive());
    let y = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_attention(same(q), same(k), same(v), positions.map(same)))
    } else {
        composed::attention::<B>(q, k, v, positions)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// [`flash_attention`] over GPT's fused projection `qkv` `[B, T, 3·H·D]` (q | k | v, heads
/// contiguous within each) with `n_head` heads → `[B, T, H, D]`; reads q, k, v in place and,
/// under autodiff, returns the gradient of `qkv` as one buffer.
pub fn flash_attention_qkv<B: Backend>(
    qkv: Tensor<B, 3>,
    n_head: usize,
    positions: Option<Tensor<B, 2, Int>>,
) -> Tensor<B, 4> {
    let qkv = qkv.into_primitive().tensor();
    let positions = positions.map(|p| p.into_primitive());
    let y = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_attention_qkv(same(qkv), n_head, positions.map(same)))
    } else {
        let (q, k, v) = composed::split_qkv::<B>(qkv, n_head);
        composed::attention::<B>(q, k, v, positions)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}
