//! Cross-entropy with an ignore index as a token sum, computed row by row without the
//! `[N, V]` log-softmax: the forward pass keeps only each row's log-sum-exp (as max and
//! log Σ exp(x − max)), the backward pass recomputes the softmax from the logits and writes
//! `dlogits` once.

mod autodiff;
pub(crate) mod composed;
#[cfg(feature = "cube")]
mod cube;
mod flex;
#[cfg(test)]
mod tests;

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Tensor, TensorPrimitive};

use super::dispatch::{same, with_fused_backend};

/// Fused cross-entropy, as a Burn backend extension. The defaults are composed Burn ops (so
/// every backend, CUDA included, works, and `Autodiff` over it still keeps only the per-row
/// statistics); Flex overrides them with row-parallel kernels on raw buffers, Burn's CubeCL
/// backends (CUDA, HIP, wgpu; feature `cube`) with one cube per row.
///
/// Shapes: `logits` `[N, V]` (any strides; computed in f32), `targets` `[N]` Int (class ids in
/// `0..V`, or `ignore_index` for rows that are not scored). Units: nats.
pub trait FusedCrossEntropy: Backend {
    /// `(Σ_{n: targets[n] ≠ ignore_index} −log softmax(logits)[n, targets[n]], stats)`: the
    /// summed negative log-likelihood as a `[1]` f32 tensor, and per row `stats[n] = (m[n],
    /// log Σ_v exp(logits[n, v] − m[n]))` `[N, 2]` f32 with `m[n]` the row max, i.e. the
    /// log-sum-exp `lse = m + log Σ exp(x − m)` kept in two parts. That is all the backward
    /// needs besides the inputs; two parts rather than `lse` alone so the backward's
    /// `x − lse` is `(x − m) − log Σ`, as in a log-softmax, with no precision lost to rounding
    /// `lse` when the logits are large. Subtracting the max first keeps ±10⁴ logits from
    /// overflowing. `stats` of ignored rows is unspecified (the backward never reads it). The
    /// value of PyTorch's `F.cross_entropy(logits, targets, ignore_index=ignore_index,
    /// reduction="sum")`.
    ///
    /// # Panics
    /// If a scored target is outside `0..V` (PyTorch raises there too; the composed default
    /// may instead give an unspecified value on backends without bound checks).
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        ignore_index: i64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed::forward::<Self>(logits, targets, ignore_index)
    }

    /// `dlogits` `[N, V]` (the logits' dtype) of `grad · Σ NLL` for the `[1]` upstream gradient
    /// `grad`: `grad · (softmax(logits)[n] − onehot(targets[n]))` with `softmax =
    /// exp((logits − m) − log Σ)` from `stats` for scored rows, exactly 0 for ignored rows (the
    /// derivative of log-softmax: Goodfellow et al., *Deep Learning*, 2016, §6.2.2.3). `stats`
    /// as returned by [`fused_cross_entropy`](Self::fused_cross_entropy). Not itself
    /// differentiable.
    fn fused_cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        stats: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        ignore_index: i64,
    ) -> FloatTensor<Self> {
        composed::backward::<Self>(logits, targets, stats, grad, ignore_index)
    }
}

/// `Σ −log softmax(logits)[n, targets[n]]` over the rows `n` whose target is not
/// `ignore_index`, in nats, as a `[1]` f32 tensor (PyTorch: `F.cross_entropy(logits, targets,
/// ignore_index=ignore_index, reduction="sum")`; 0 when every row is ignored). `logits`
/// `[N, V]`, `targets` `[N]`. Fused where the backend has it (see [`FusedCrossEntropy`]):
/// under autodiff only the per-row log-sum-exp (two f32 per row) is kept for the backward, not
/// an `[N, V]` log-softmax. Logits of another dtype (bf16) are cast to f32 first, then take the
/// same path (the cast's backward returns the gradient in their dtype). The mean is left to the
/// caller, who knows the number of scored tokens of the whole batch.
///
/// # Panics
/// If `targets` is not `[N]`, or (fused backends) a scored target is outside `0..V`.
pub fn cross_entropy_sum<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    ignore_index: i64,
) -> Tensor<B, 1> {
    let [n, _] = logits.dims();
    assert_eq!(targets.dims(), [n], "cross_entropy_sum: targets must be [N] for logits [N, V]");
    let logits = if logits.dtype() == DType::F32 { logits } else { logits.cast(DType::F32) };
    let (x, t) = (logits.into_primitive().tensor(), targets.into_primitive());
    let y = with_fused_backend!(B, FB => {
        let t = same::<IntTensor<B>, IntTensor<FB>>(t);
        let (sum, _stats) = FB::fused_cross_entropy(same(x), t, ignore_index);
        same::<FloatTensor<FB>, FloatTensor<B>>(sum)
    } else {
        return composed::cross_entropy_sum(
            Tensor::from_primitive(TensorPrimitive::Float(x)),
            Tensor::from_primitive(t),
            ignore_index,
        );
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}
