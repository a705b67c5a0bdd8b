//! Cross-entropy as composed Burn tensor ops: the generic default (any backend, CUDA included)
//! and the fallback for backends without [`FusedCrossEntropy`](super::FusedCrossEntropy).

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Bool, DType, IndexingUpdateOp, Int, Tensor, TensorPrimitive};

fn f32_of<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if x.dtype() == DType::F32 {
        x
    } else {
        x.cast(DType::F32)
    }
}

/// `targets` `[N]` as `([N, 1] ignored, [N, 1] targets with ignored ones replaced by 0)`, so a
/// gather stays in bounds.
fn mask_targets<B: Backend>(
    targets: Tensor<B, 1, Int>,
    ignore_index: i64,
) -> (Tensor<B, 2, Bool>, Tensor<B, 2, Int>) {
    let [n] = targets.dims();
    let targets = targets.reshape([n, 1]);
    let ignored = targets.clone().equal_elem(ignore_index);
    let safe = targets.mask_fill(ignored.clone(), 0);
    (ignored, safe)
}

/// Per row of f32 `x` `[N, V]`: `(m, log Σ exp(x − m))`, each `[N, 1]`, `m` the row max
/// (detached: the loss does not depend on it).
fn row_stats<B: Backend>(x: Tensor<B, 2>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let m = x.clone().max_dim(1).detach();
    let log_sum = (x - m.clone()).exp().sum_dim(1).log();
    (m, log_sum)
}

/// `Σ (log Σ exp(x − m) − (x[target] − m))` over scored rows as differentiable tensor ops on
/// `B` (its autodiff then keeps its own intermediates): `[1]` f32. The path of backends
/// without the trait.
pub fn cross_entropy_sum<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    ignore_index: i64,
) -> Tensor<B, 1> {
    let x = f32_of(logits);
    let (ignored, safe) = mask_targets(targets, ignore_index);
    let (m, log_sum) = row_stats(x.clone());
    (log_sum - (x.gather(1, safe) - m)).mask_fill(ignored, 0.0).sum()
}

/// The generic [`fused_cross_entropy`](super::FusedCrossEntropy::fused_cross_entropy): `(sum
/// [1], stats [N, 2])`, f32.
pub fn forward<B: Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    ignore_index: i64,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let x = f32_of(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(logits)));
    let (ignored, safe) = mask_targets(Tensor::from_primitive(targets), ignore_index);
    let (m, log_sum) = row_stats(x.clone());
    let sum = (log_sum.clone() - (x.gather(1, safe) - m.clone())).mask_fill(ignored, 0.0).sum();
    (sum.into_primitive().tensor(), Tensor::cat(vec![m, log_sum], 1).into_primitive().tensor())
}

/// The generic [`fused_cross_entropy_backward`](super::FusedCrossEntropy::fused_cross_entropy_backward):
/// `grad · (exp((x − m) − log_sum) − onehot(target))`, rows of ignored targets 0; in the
/// logits' dtype.
pub fn backward<B: Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    stats: FloatTensor<B>,
    grad: FloatTensor<B>,
    ignore_index: i64,
) -> FloatTensor<B> {
    let x = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(logits));
    let dtype = x.dtype();
    let x = f32_of(x);
    let [n, _] = x.dims();
    let device = x.device();
    let stats = f32_of(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(stats)));
    let (m, log_sum) = (stats.clone().slice([0..n, 0..1]), stats.slice([0..n, 1..2]));
    let grad = f32_of(Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(grad))).reshape([1, 1]);
    let (ignored, safe) = mask_targets(Tensor::from_primitive(targets), ignore_index);
    let minus_one = Tensor::<B, 2>::full([n, 1], -1.0, (&device, DType::F32));
    let softmax_minus_onehot = ((x - m) - log_sum).exp().scatter(1, safe, minus_one, IndexingUpdateOp::Add);
    // Per-row weight: grad for scored rows, 0 for ignored ones (a multiply, as the row's
    // softmax is finite; `mask_fill` would need an [N, V] mask).
    let weight = ignored.bool_not().float().cast(DType::F32) * grad;
    let d = softmax_minus_onehot * weight;
    let d = if dtype == DType::F32 { d } else { d.cast(dtype) };
    d.into_primitive().tensor()
}
