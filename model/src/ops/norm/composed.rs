//! LayerNorm and RMSNorm as composed Burn tensor ops: the generic default (CUDA and every other
//! backend) and the test oracle for the Flex kernels. Rows are flattened to `[rows, C]`; the
//! math is in f32 whatever the input's dtype.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive};

/// `x` `[rows.., C]` as `[rows, C]`, with its shape and the statistics' shape `[rows.., 1]`.
fn rows<B: Backend>(x: FloatTensor<B>) -> (Tensor<B, 2>, Shape, Shape) {
    let shape = x.shape();
    let rank = shape.num_dims();
    assert!(rank >= 1, "norm: the input needs a last dimension");
    let c = shape[rank - 1];
    let rows = shape[..rank - 1].iter().product::<usize>();
    let mut stats = shape.clone();
    stats[rank - 1] = 1;
    (from_primitive(B::float_reshape(x, Shape::new([rows, c]))), shape, stats)
}

fn from_primitive<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn to_primitive<B: Backend, const D: usize>(t: Tensor<B, D>, shape: Shape) -> FloatTensor<B> {
    B::float_reshape(t.into_primitive().tensor(), shape)
}

fn cast<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if t.dtype() == dtype {
        t
    } else {
        t.cast(dtype)
    }
}

/// A `[C]` parameter as an f32 row `[1, C]` (for broadcasting over rows).
fn param_row<B: Backend>(p: FloatTensor<B>) -> Tensor<B, 2> {
    cast(from_primitive::<B, 1>(p), DType::F32).unsqueeze_dim(0)
}

/// Statistics `[rows.., 1]` as `[rows, 1]`.
fn stat_col<B: Backend>(s: FloatTensor<B>, rows: usize) -> Tensor<B, 2> {
    from_primitive(B::float_reshape(s, Shape::new([rows, 1])))
}

/// `(y, mean, rstd)` of LayerNorm: two-pass mean and biased variance (as Burn's `layer_norm`).
pub fn layer_norm_forward<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: Option<FloatTensor<B>>,
    eps: f64,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (x, shape, stats) = rows::<B>(x);
    let dtype = x.dtype();
    let x = cast(x, DType::F32);
    let mean = x.clone().mean_dim(1); // [rows, 1]
    let centered = x - mean.clone();
    let rstd = (centered.clone().square().mean_dim(1) + eps).sqrt().recip();
    let y = centered * rstd.clone() * param_row::<B>(gamma);
    let y = match beta {
        Some(beta) => y + param_row::<B>(beta),
        None => y,
    };
    (to_primitive(cast(y, dtype), shape), to_primitive(mean, stats.clone()), to_primitive(rstd, stats))
}

/// `(dx, dgamma, dbeta)` of LayerNorm from the saved `mean` and `rstd` (llm.c
/// `layernorm_backward`).
pub fn layer_norm_backward<B: Backend>(
    dy: FloatTensor<B>,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    mean: FloatTensor<B>,
    rstd: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let gamma_shape = gamma.shape();
    let gamma_dtype = gamma.dtype();
    let (x, shape, _) = rows::<B>(x);
    let (dy, _, _) = rows::<B>(dy);
    let [n, c] = x.dims();
    let dtype = x.dtype();
    let (x, dy) = (cast(x, DType::F32), cast(dy, DType::F32));
    let rstd = stat_col::<B>(rstd, n);
    let xhat = (x - stat_col::<B>(mean, n)) * rstd.clone();
    let dyhat = dy.clone() * param_row::<B>(gamma);
    let mean_dyhat = dyhat.clone().mean_dim(1);
    let mean_dyhat_xhat = (dyhat.clone() * xhat.clone()).mean_dim(1);
    let dx = (dyhat - mean_dyhat - xhat.clone() * mean_dyhat_xhat) * rstd;
    let dgamma = (dy.clone() * xhat).sum_dim(0).reshape([c]);
    let dbeta = dy.sum_dim(0).reshape([c]);
    (
        to_primitive(cast(dx, dtype), shape),
        to_primitive(cast(dgamma, gamma_dtype), gamma_shape.clone()),
        to_primitive(cast(dbeta, gamma_dtype), gamma_shape),
    )
}

/// `(y, rstd)` of RMSNorm, computed in f32 like Burn's `RmsNorm::forward`.
pub fn rms_norm_forward<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    eps: f64,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (x, shape, stats) = rows::<B>(x);
    let dtype = x.dtype();
    let x = cast(x, DType::F32);
    let rstd = (x.clone().square().mean_dim(1) + eps).sqrt().recip(); // [rows, 1]
    let y = x * rstd.clone() * param_row::<B>(gamma);
    (to_primitive(cast(y, dtype), shape), to_primitive(rstd, stats))
}

/// `(dx, dgamma)` of RMSNorm from the saved `rstd`.
pub fn rms_norm_backward<B: Backend>(
    dy: FloatTensor<B>,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    rstd: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let gamma_shape = gamma.shape();
    let gamma_dtype = gamma.dtype();
    let (x, shape, _) = rows::<B>(x);
    let (dy, _, _) = rows::<B>(dy);
    let [n, c] = x.dims();
    let dtype = x.dtype();
    let (x, dy) = (cast(x, DType::F32), cast(dy, DType::F32));
    let rstd = stat_col::<B>(rstd, n);
    let xhat = x * rstd.clone();
    let dyhat = dy.clone() * param_row::<B>(gamma);
    let mean_dyhat_xhat = (dyhat.clone() * xhat.clone()).mean_dim(1);
    let dx = (dyhat - xhat.clone() * mean_dyhat_xhat) * rstd;
    let dgamma = (dy * xhat).sum_dim(0).reshape([c]);
    (to_primitive(cast(dx, dtype), shape), to_primitive(cast(dgamma, gamma_dtype), gamma_shape))
}
