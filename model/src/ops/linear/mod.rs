//! Linear layers and the LM head as one 2-D matmul with its own backward.

mod autodiff;
mod flex;
#[cfg(test)]
mod tests;
mod transpose;

use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

use super::dispatch::{same, with_fused_backend};

/// `x·w` for `x` `[n, k]` and `w` `[k, m]` (either may be a strided view, e.g. a transposed
/// embedding), as a Burn backend extension. The default is Burn's matmul; Flex calls the same
/// `gemm` crate Burn uses, but writes the output into a fresh `Vec` (Burn's Flex matmul zeroes
/// its output and then copies it to realign it: two extra passes over every activation, the
/// 200 MB logits of a 50k vocabulary included), and its weight gradient keeps the weight's
/// layout, so a tied embedding's gradient needs no transposed copy.
pub trait FusedMatmul: Backend {
    /// `x·w`: `[n, k]·[k, m]` → `[n, m]`.
    fn fused_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(x, w)
    }

    /// `dy·wᵀ`: the gradient of `x`, `[n, k]`.
    fn fused_matmul_dx(dy: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(dy, Self::float_swap_dims(w, 0, 1))
    }

    /// `xᵀ·dy`: the gradient of `w`, `[k, m]` (`w` is passed so an implementation can give
    /// the gradient the weight's memory layout).
    fn fused_matmul_dw(
        x: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        _w: &FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::float_matmul(Self::float_swap_dims(x, 0, 1), dy)
    }

    /// Both gradients of `y = x·w` for the incoming `dy` `[n, m]`: `(dy·wᵀ, xᵀ·dy)`, each
    /// only where asked (`want_dx`, `want_dw`). The default computes them one after the
    /// other with [`Self::fused_matmul_dw`] and [`Self::fused_matmul_dx`]; an implementation
    /// may run the two independent products at the same time.
    fn fused_matmul_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        want_dx: bool,
        want_dw: bool,
    ) -> (Option<FloatTensor<Self>>, Option<FloatTensor<Self>>) {
        one_after_the_other::<Self>(x, w, dy, want_dx, want_dw)
    }
}

/// [`FusedMatmul::fused_matmul_backward`]'s default: `xᵀ·dy` (if `want_dw`), then `dy·wᵀ` (if
/// `want_dx`), returned as `(dx, dw)`; also what an implementation falls back to.
fn one_after_the_other<B: FusedMatmul>(
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    dy: FloatTensor<B>,
    want_dx: bool,
    want_dw: bool,
) -> (Option<FloatTensor<B>>, Option<FloatTensor<B>>) {
    let dw = want_dw.then(|| B::fused_matmul_dw(x, dy.clone(), &w));
    let dx = want_dx.then(|| B::fused_matmul_dx(dy, w));
    (dx, dw)
}

/// CUDA: Burn's matmul (cubek), unchanged.
#[cfg(feature = "cuda")]
impl FusedMatmul for burn::backend::Cuda {}

/// wgpu (`Fusion<CubeBackend>` over Vulkan, Metal, DX12): the same as CUDA.
#[cfg(feature = "wgpu")]
impl FusedMatmul for burn::backend::Wgpu {}

/// `x·w` (`[n, k]·[k, m]` → `[n, m]`), fused where the backend has it ([`FusedMatmul`]).
///
/// Inside a low-precision [`crate::autocast`] region both operands are cast to its dtype and
/// the product back to f32 (the gradients flow back through the casts in f32).
pub fn matmul<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Tensor<B, 2> {
    if let Some(dtype) = crate::precision::matmul_dtype() {
        if x.dtype() != dtype {
            return matmul(x.cast(dtype), w.cast(dtype)).cast(DType::F32);
        }
    }
    let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
    let y = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_matmul(same(x), same(w)))
    } else {
        B::float_matmul(x, w)
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// `layer(x)` for `x` `[d₀, …, in]` → `[d₀, …, out]`, computed on the `[d₀·…, in]` view.
///
/// Burn 0.21's `linear` keeps `x`'s batch dimensions, so its weight gradient is a batched
/// `xᵀ·dy` per batch row (`[batch, in, out]`) summed afterwards on one thread; on the flattened
/// view it is one `[in, N]·[N, out]` matmul over all N positions (PyTorch's `F.linear` does the
/// same), and the forward is one large matmul instead of `batch` smaller ones. The reshapes are
/// free for the contiguous activations a model produces. The matmul is [`matmul`].
pub fn linear<B: Backend, const D: usize>(layer: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    let y = matmul(x.reshape([rows, dims[D - 1]]), layer.weight.val());
    let y = match &layer.bias {
        Some(bias) => y + bias.val().unsqueeze::<2>(),
        None => y,
    };
    let mut out = dims;
    out[D - 1] = y.dims()[1];
    y.reshape(out)
}

/// `GELU(layer(x))` for `x` `[d₀, …, in]` → `[d₀, …, out]`: [`linear`]'s matmul, then the bias
/// and the activation in one pass ([`crate::ops::bias_gelu`]) where the layer has a bias,
/// [`crate::ops::gelu`] where it has none (GPT-2's `c_fc`).
pub fn linear_gelu<B: Backend, const D: usize>(
    layer: &Linear<B>,
    x: Tensor<B, D>,
    kind: crate::GeluKind,
) -> Tensor<B, D> {
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    let y = matmul(x.reshape([rows, dims[D - 1]]), layer.weight.val());
    let y = match &layer.bias {
        Some(bias) => super::bias_gelu(y, bias.val(), kind),
        None => super::gelu(y, kind),
    };
    let mut out = dims;
    out[D - 1] = y.dims()[1];
    y.reshape(out)
}
