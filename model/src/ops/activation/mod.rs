//! GELU (erf and tanh forms) and SwiGLU, forward and backward in one pass each.

mod autodiff;
pub(crate) mod composed;
#[cfg(feature = "cube")]
mod cube;
mod flex;
#[cfg(test)]
mod tests;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::dispatch::{same, with_fused_backend};
use crate::GeluKind;

pub use composed::gelu_tanh;

/// Fused activations, as a Burn backend extension. The defaults are composed Burn ops, so a
/// backend only overrides what it has a kernel for: Flex (raw-buffer kernels) and Burn's CubeCL
/// backends (CUDA, HIP, wgpu; CubeCL kernels, feature `cube`). Tensors are of any shape.
pub trait FusedActivation: Backend {
    /// `GELU(x)` of every element: `x·Φ(x)` (erf) or `½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`
    /// (tanh; Hendrycks & Gimpel 2016 §2).
    fn fused_gelu(x: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        composed::gelu::<Self>(x, kind)
    }

    /// `grad · GELU′(x)`: `Φ(x) + x·φ(x)` (erf) or the derivative of the tanh form.
    fn fused_gelu_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: GeluKind,
    ) -> FloatTensor<Self> {
        composed::gelu_backward::<Self>(x, grad, kind)
    }

    /// `GELU(x + bias)`: `x` `[.., m]` (any rank), `bias` `[m]` added to every row — a linear
    /// layer's bias and its activation in one pass over the `[rows, m]` activations (GPT-2's
    /// `c_fc`), instead of one pass for the bias and one for GELU. The default adds the bias
    /// with Burn's broadcasting add, then calls [`Self::fused_gelu`].
    fn fused_bias_gelu(x: FloatTensor<Self>, bias: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        bias_gelu_by_add::<Self>(x, bias, kind)
    }

    /// `(dx, dbias)` of `Σ grad ⊙ GELU(x + bias)`: `dx = grad·GELU′(x + bias)` (`x`'s shape)
    /// and `dbias = Σ over the rows of dx` (`[m]`). The default recomputes `x + bias`, calls
    /// [`Self::fused_gelu_backward`] and sums the rows with Burn's `sum_dim`.
    fn fused_bias_gelu_backward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: GeluKind,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        with_bias_grad::<Self>(bias_gelu_dx_by_add::<Self>(x, bias, grad, kind))
    }

    /// `SiLU(gate) ⊙ up` (Shazeer 2020, eq. 6): `gate`, `up` of the same shape.
    fn fused_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        composed::swiglu::<Self>(gate, up)
    }

    /// `(∂/∂gate, ∂/∂up)` of `Σ grad ⊙ SiLU(gate) ⊙ up`: `grad·up·σ(g)·(1 + g·(1 − σ(g)))` and
    /// `grad·SiLU(g)`.
    fn fused_swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed::swiglu_backward::<Self>(gate, up, grad)
    }
}

/// [`FusedActivation::fused_bias_gelu`]'s default, and its implementations' fallback: Burn's
/// broadcasting add, then the backend's [`FusedActivation::fused_gelu`].
fn bias_gelu_by_add<B: FusedActivation>(
    x: FloatTensor<B>,
    bias: FloatTensor<B>,
    kind: GeluKind,
) -> FloatTensor<B> {
    B::fused_gelu(composed::add_bias::<B>(x, bias), kind)
}

/// `grad·GELU′(x + bias)` by Burn's add and the backend's [`FusedActivation::fused_gelu_backward`].
fn bias_gelu_dx_by_add<B: FusedActivation>(
    x: FloatTensor<B>,
    bias: FloatTensor<B>,
    grad: FloatTensor<B>,
    kind: GeluKind,
) -> FloatTensor<B> {
    B::fused_gelu_backward(composed::add_bias::<B>(x, bias), grad, kind)
}

/// `(dx, dbias)` from the gradient of `x + bias`: the bias's is its sum over the rows.
fn with_bias_grad<B: Backend>(dx: FloatTensor<B>) -> (FloatTensor<B>, FloatTensor<B>) {
    (dx.clone(), composed::sum_rows::<B>(dx))
}

/// GELU of `x` (any shape), fused where the backend has it (see [`FusedActivation`]).
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>, kind: GeluKind) -> Tensor<B, D> {
    let x = x.into_primitive().tensor();
    let y = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_gelu(same(x), kind))
    } else {
        composed::gelu::<B>(x, kind)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// `GELU(x + bias)` for `x` `[.., m]` and `bias` `[m]`, in one pass where the backend has it
/// (see [`FusedActivation::fused_bias_gelu`]); the gradient reaches both.
pub fn bias_gelu<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    bias: Tensor<B, 1>,
    kind: GeluKind,
) -> Tensor<B, D> {
    let (x, bias) = (x.into_primitive().tensor(), bias.into_primitive().tensor());
    let y = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_bias_gelu(same(x), same(bias), kind))
    } else {
        composed::gelu::<B>(composed::add_bias::<B>(x, bias), kind)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// `SiLU(gate) ⊙ up` (Llama's MLP), fused where the backend has it.
pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    let (gate, up) = (gate.into_primitive().tensor(), up.into_primitive().tensor());
    let y = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_swiglu(same(gate), same(up)))
    } else {
        composed::swiglu::<B>(gate, up)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}
