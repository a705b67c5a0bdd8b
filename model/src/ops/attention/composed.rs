//! Attention as composed Burn tensor ops: the generic default of [`super::FusedAttention`]
//! (CUDA and any other backend). The forward materializes the `[B, H, T, T]` scores but
//! returns only the output and the log-sum-exp; the backward recomputes the probabilities
//! from q, k and the log-sum-exp (FlashAttention-2 Algorithm 2 in whole-matrix form), so under
//! autodiff nothing of size `T²` is kept between the passes.

use burn::tensor::backend::Backend;
use burn::tensor::module::attention as burn_attention;
use burn::tensor::ops::{AttentionModuleOptions, FloatTensor, IntTensor};
use burn::tensor::{Bool, Int, Tensor, TensorPrimitive};

fn float<B: Backend, const D: usize>(x: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(x))
}

fn prim<B: Backend, const D: usize>(x: Tensor<B, D>) -> FloatTensor<B> {
    x.into_primitive().tensor()
}

/// `[B, T, n, D]` → `[B, H, T, D]`: heads first, each kv head repeated for its
/// `H / n` query heads (a copy only when `n < H`).
fn heads_first<B: Backend>(x: FloatTensor<B>, n_head: usize) -> Tensor<B, 4> {
    let x = float::<B, 4>(x).swap_dims(1, 2); // [B, n, T, D]
    let [batch, n, len, d] = x.dims();
    if n == n_head {
        return x;
    }
    let rep = n_head / n;
    x.unsqueeze_dim::<5>(2).expand([batch, n, rep, len, d]).reshape([batch, n_head, len, d])
}

/// `[B, H, T, D]` → `[B, T, n, D]`, summing each group of `H / n` heads.
fn heads_last<B: Backend>(x: Tensor<B, 4>, n: usize) -> FloatTensor<B> {
    let [batch, n_head, len, d] = x.dims();
    let x = if n == n_head {
        x
    } else {
        x.reshape([batch, n, n_head / n, len, d]).sum_dim(2).reshape([batch, n, len, d])
    };
    prim(x.swap_dims(1, 2))
}

/// `[B or 1, 1, T, T]`, true where query `i` must not see key `j`: `j > i`, or `j` before
/// the start of `i`'s document `i − clamp(pos_i, 0, i)`.
fn hidden<B: Backend>(positions: Option<IntTensor<B>>, len: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let causal = Tensor::<B, 2, Bool>::tril_mask([len, len], 0, device).unsqueeze::<4>(); // j > i
    let Some(positions) = positions else { return causal };
    let positions = Tensor::<B, 2, Int>::from_primitive(positions);
    let batch = positions.dims()[0];
    let i = Tensor::<B, 1, Int>::arange(0..len as i64, device).unsqueeze::<2>(); // [1, T]
    let start = (i - positions.clamp_min(0)).clamp_min(0); // [B, T]
    let start = start.unsqueeze_dim::<3>(2).unsqueeze_dim::<4>(1).expand([batch, 1, len, len]);
    let j = Tensor::<B, 1, Int>::arange(0..len as i64, device)
        .reshape([1, 1, 1, len])
        .expand([batch, 1, len, len]);
    causal.expand([batch, 1, len, len]).bool_or(j.lower(start))
}

/// `s = q·kᵀ/√D` with hidden entries −∞: `[B, H, T, T]`.
fn scores<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>, positions: Option<IntTensor<B>>) -> Tensor<B, 4> {
    let [batch, n_head, len, d] = q.dims();
    let s = q.clone().matmul(k.clone().swap_dims(2, 3)) / (d as f64).sqrt();
    let mask = hidden::<B>(positions, len, &q.device());
    s.mask_fill(mask.expand([batch, n_head, len, len]), f32::NEG_INFINITY)
}

/// `(out [B, T, H, D], lse [B, H, T])`: the forward of [`super::FusedAttention`] from
/// tensor ops (softmax with its row maximum subtracted; every row sees its diagonal, so the
/// maximum is finite).
pub fn forward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    positions: Option<IntTensor<B>>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let n_head = burn::tensor::TensorMetadata::shape(&q)[2];
    let (q, k, v) = (heads_first::<B>(q, n_head), heads_first::<B>(k, n_head), heads_first::<B>(v, n_head));
    let s = scores(&q, &k, positions);
    let m = s.clone().max_dim(3); // [B, H, T, 1]
    let e = (s - m.clone()).exp();
    let l = e.clone().sum_dim(3);
    let out = (e / l.clone()).matmul(v); // [B, H, T, D]
    let lse = (m + l.log()).squeeze_dim::<3>(3);
    (prim(out.swap_dims(1, 2)), prim(lse))
}

/// The output of [`forward`] alone. Without packed documents this is Burn's attention op
/// (a flash kernel on backends that have one, e.g. CUDA inference).
pub fn attention<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    positions: Option<IntTensor<B>>,
) -> FloatTensor<B> {
    if positions.is_some() {
        return forward::<B>(q, k, v, positions).0;
    }
    let n_head = burn::tensor::TensorMetadata::shape(&q)[2];
    let (q, k, v) = (heads_first::<B>(q, n_head), heads_first::<B>(k, n_head), heads_first::<B>(v, n_head));
    let options = AttentionModuleOptions { is_causal: q.dims()[2] > 1, ..Default::default() };
    prim(burn_attention(q, k, v, None, None, options).swap_dims(1, 2))
}

/// `(dq, dk, dv)` from tensor ops (see [`super::FusedAttention::fused_attention_backward`]).
#[allow(clippy::too_many_arguments)]
pub fn backward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    dout: FloatTensor<B>,
    positions: Option<IntTensor<B>>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let n_head = burn::tensor::TensorMetadata::shape(&q)[2];
    let n_kv = burn::tensor::TensorMetadata::shape(&k)[2];
    let d = burn::tensor::TensorMetadata::shape(&q)[3];
    let scale = 1.0 / (d as f64).sqrt();
    let (q, k, v) = (heads_first::<B>(q, n_head), heads_first::<B>(k, n_head), heads_first::<B>(v, n_head));
    let (out, dout) = (heads_first::<B>(out, n_head), heads_first::<B>(dout, n_head));
    let lse = float::<B, 3>(lse).unsqueeze_dim::<4>(3); // [B, H, T, 1]
    let p = (scores(&q, &k, positions) - lse).exp(); // hidden: exp(−∞) = 0
    let delta = (dout.clone() * out).sum_dim(3); // D_i, [B, H, T, 1]
    let dv = p.clone().swap_dims(2, 3).matmul(dout.clone());
    let dp = dout.matmul(v.swap_dims(2, 3));
    let ds = p * (dp - delta);
    let dq = ds.clone().matmul(k) * scale;
    let dk = ds.swap_dims(2, 3).matmul(q) * scale;
    (heads_last(dq, n_head), heads_last(dk, n_kv), heads_last(dv, n_kv))
}

/// `qkv` `[B, T, 3·H·D]` → q, k, v `[B, T, H, D]` (copies where the backend cannot view).
pub fn split_qkv<B: Backend>(
    qkv: FloatTensor<B>,
    n_head: usize,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let qkv = float::<B, 3>(qkv);
    let [batch, len, c3] = qkv.dims();
    let d = c3 / 3 / n_head;
    let mut parts = qkv.chunk(3, 2).into_iter().map(|t| prim(t.reshape([batch, len, n_head, d])));
    (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap())
}

/// dq, dk, dv `[B, T, H, D]` → `[B, T, 3·H·D]`.
pub fn merge_qkv<B: Backend>(dq: FloatTensor<B>, dk: FloatTensor<B>, dv: FloatTensor<B>) -> FloatTensor<B> {
    let flat = |x: FloatTensor<B>| {
        let [batch, len, h, d] = float::<B, 4>(x.clone()).dims();
        float::<B, 4>(x).reshape([batch, len, h * d])
    };
    prim(Tensor::cat(vec![flat(dq), flat(dk), flat(dv)], 2))
}
