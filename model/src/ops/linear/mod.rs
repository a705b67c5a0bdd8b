//! Linear layers and the LM head as one 2-D matmul with its own backward.

mod autodiff;
pub mod bf16;
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

    /// `bf16(x)·bf16(w)`, summed in f32, f32 out: `bf16-mixed`'s matmul of f32 operands
    /// (`[n, k]·[k, m]` → `[n, m]`). The default is Burn's casts around
    /// [`Self::fused_matmul`] on the bf16 copies (whose product is itself rounded to bf16).
    fn fused_matmul_bf16(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        bf16_by_casts::<Self>(x, w)
    }

    /// Both gradients of [`Self::fused_matmul_bf16`] for the incoming f32 `dy`, in f32:
    /// `(bf16(dy)·bf16(w)ᵀ, bf16(x)ᵀ·bf16(dy))`, each only where asked. The default casts the
    /// three to bf16 and the products back.
    fn fused_matmul_bf16_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        want_dx: bool,
        want_dw: bool,
    ) -> (Option<FloatTensor<Self>>, Option<FloatTensor<Self>>) {
        bf16_backward_by_casts::<Self>(x, w, dy, want_dx, want_dw)
    }
}

/// `t` cast to `dtype` (Burn's cast on the primitive).
fn cast<B: Backend>(t: FloatTensor<B>, dtype: DType) -> FloatTensor<B> {
    B::float_cast(t, dtype.into())
}

/// [`FusedMatmul::fused_matmul_bf16`]'s default: bf16 copies, [`FusedMatmul::fused_matmul`],
/// the product cast back to f32.
fn bf16_by_casts<B: FusedMatmul>(x: FloatTensor<B>, w: FloatTensor<B>) -> FloatTensor<B> {
    cast::<B>(B::fused_matmul(cast::<B>(x, DType::BF16), cast::<B>(w, DType::BF16)), DType::F32)
}

/// [`FusedMatmul::fused_matmul_bf16_backward`]'s default: the three cast to bf16, the
/// products cast back.
fn bf16_backward_by_casts<B: FusedMatmul>(
    x: FloatTensor<B>,
    w: FloatTensor<B>,
    dy: FloatTensor<B>,
    want_dx: bool,
    want_dw: bool,
) -> (Option<FloatTensor<B>>, Option<FloatTensor<B>>) {
    let [x, w, dy] = [x, w, dy].map(|t| cast::<B>(t, DType::BF16));
    let (dx, dw) = B::fused_matmul_backward(x, w, dy, want_dx, want_dw);
    (dx.map(|t| cast::<B>(t, DType::F32)), dw.map(|t| cast::<B>(t, DType::F32)))
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
        if dtype == DType::BF16 && x.dtype() == DType::F32 && w.dtype() == DType::F32 && bf16::available() {
            if let Some(y) = flex_bf16::<B>(x.clone(), w.clone()) {
                return y;
            }
        }
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

/// `bf16(x)·bf16(w)` in f32 by the AVX512-BF16 kernel ([`bf16`]), with its own backward, where
/// `B` is burn-flex or its `Autodiff`; `None` on other backends.
fn flex_bf16<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    use super::dispatch::is;
    use burn::backend::{Autodiff, Flex};
    let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
    let y = if is::<B, Flex>() {
        same::<FloatTensor<Flex>, FloatTensor<B>>(Flex::fused_matmul_bf16(same(x), same(w)))
    } else if is::<B, Autodiff<Flex>>() {
        type Ad = Autodiff<Flex>;
        same::<FloatTensor<Ad>, FloatTensor<B>>(Ad::fused_matmul_bf16(same(x), same(w)))
    } else {
        return None;
    };
    Some(Tensor::from_primitive(TensorPrimitive::Float(y)))
}

/// `layer(x)` for `x` `[d₀, …, in]` → `[d₀, …, out]`, computed on the `[d₀·…, in]` view.
///
/// Burn 0.21's `linear` keeps `x`'s batch dimensions, so its weight gradient is a batched
/// `xᵀ·dy` per batch row (`[batch, in, out]`) summed afterwards on one thread; on the flattened
/// view it is one `[in, N]·[N, out]` matmul over all N positions (PyTorch's `F.linear` does the
/// same), and the forward is one large matmul instead of `batch` smaller ones. The reshapes are
/// free for the contiguous activations a model produces. The matmul is [`matmul`].
pub fn linear<B: Backend, const D: usize>(layer: &Linear<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    on_rows(x, |x| {
        let y = matmul(x, layer.weight.val());
        match &layer.bias {
            Some(bias) => y + bias.val().unsqueeze::<2>(),
            None => y,
        }
    })
}

/// `f` of `x`'s `[d₀·…, in]` view (free for a contiguous `x`), reshaped back to `[d₀, …, out]`.
fn on_rows<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    f: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 2>,
) -> Tensor<B, D> {
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    let y = f(x.reshape([rows, dims[D - 1]]));
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
    on_rows(x, |x| {
        let y = matmul(x, layer.weight.val());
        match &layer.bias {
            Some(bias) => super::bias_gelu(y, bias.val(), kind),
            None => super::gelu(y, kind),
        }
    })
}
