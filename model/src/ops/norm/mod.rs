//! LayerNorm and RMSNorm over the last dimension, forward and backward in one pass each, saving
//! only per-row statistics for the backward (x itself is the tensor that already exists).
//!
//! # Formulas
//! Over each row `x ∈ ℝᶜ` (the last dimension; every other dimension is a row):
//! - LayerNorm (Ba et al. 2016, §3; PyTorch `F.layer_norm`): `μ = mean(x)`,
//!   `rstd = 1/√(mean((x − μ)²) + ε)` (biased variance, as PyTorch and Burn), `x̂ = (x − μ)·rstd`,
//!   `y = x̂·γ + β`. Backward (llm.c `layernorm_backward`; Karpathy's `layernorm.py`), with
//!   `dŷ = dy·γ`: `dx = rstd·(dŷ − mean(dŷ) − x̂·mean(dŷ·x̂))`, `dγ = Σ_rows dy·x̂`, `dβ = Σ_rows dy`.
//! - RMSNorm (Zhang & Sennrich 2019, eq. 4): `rstd = 1/√(mean(x²) + ε)`, `x̂ = x·rstd`,
//!   `y = x̂·γ`. Backward: `dx = rstd·(dŷ − x̂·mean(dŷ·x̂))`, `dγ = Σ_rows dy·x̂`.
//!
//! The statistics `mean` and `rstd` are f32 tensors of the input's shape with the last dimension
//! 1 (`[rows.., 1]`, as `mean_dim` keeps it). Both norms compute in f32 whatever the input's
//! dtype (as Burn's `RmsNorm`) and return `y`/`dx` in the input's dtype, `dγ`/`dβ` in `γ`'s.

mod autodiff;
mod composed;
#[cfg(feature = "cube")]
mod cube;
mod flex;
#[cfg(test)]
mod tests;

use burn::nn::{LayerNorm, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::dispatch::{same, with_fused_backend};

/// LayerNorm and RMSNorm with a saved-statistics backward, as a Burn backend extension. The
/// defaults are composed Burn tensor ops (any backend); Flex overrides them with raw-buffer
/// kernels, Burn's CubeCL backends (CUDA, HIP, wgpu, and Burn's fusion over them) with CubeCL
/// kernels (feature `cube`), and `Autodiff<B>` with one graph node per norm. Shapes: `x`, `y`, `dy`, `dx`
/// `[rows.., C]` (any rank ≥ 1), `gamma`, `beta`, `dgamma`, `dbeta` `[C]`, `mean`, `rstd`
/// `[rows.., 1]` (f32).
pub trait FusedNorm: Backend {
    /// LayerNorm of `x` over its last dimension: `(x − μ)·rstd·γ + β` (see the module docs).
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> FloatTensor<Self> {
        Self::fused_layer_norm_forward(x, gamma, beta, eps).0
    }

    /// [`FusedNorm::fused_layer_norm`] and its per-row statistics `(y, mean, rstd)`, with
    /// `rstd = 1/√(var + ε)` of the biased variance.
    fn fused_layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        composed::layer_norm_forward::<Self>(x, gamma, beta, eps)
    }

    /// `(dx, dgamma, dbeta)` of LayerNorm from the forward's `mean` and `rstd` (llm.c
    /// `layernorm_backward`): `dx = rstd·(dŷ − mean(dŷ) − x̂·mean(dŷ·x̂))`, `dŷ = dy·γ`.
    fn fused_layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        composed::layer_norm_backward::<Self>(dy, x, gamma, mean, rstd)
    }

    /// RMSNorm of `x` over its last dimension: `x·rstd·γ`, `rstd = 1/√(mean(x²) + ε)`.
    fn fused_rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        Self::fused_rms_norm_forward(x, gamma, eps).0
    }

    /// [`FusedNorm::fused_rms_norm`] and its per-row `rstd`: `(y, rstd)`.
    fn fused_rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed::rms_norm_forward::<Self>(x, gamma, eps)
    }

    /// `(dx, dgamma)` of RMSNorm from the forward's `rstd`: `dx = rstd·(dŷ − x̂·mean(dŷ·x̂))`.
    fn fused_rms_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        composed::rms_norm_backward::<Self>(dy, x, gamma, rstd)
    }
}

/// LayerNorm of `x` `[rows.., C]` over `C` with gain `gamma` `[C]` and optional bias `beta`
/// `[C]`, fused where the backend has it (see [`FusedNorm`]); Burn's `LayerNorm::forward`.
pub fn layer_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
) -> Tensor<B, D> {
    let (x, gamma) = (x.into_primitive().tensor(), gamma.into_primitive().tensor());
    let beta = beta.map(|b| b.into_primitive().tensor());
    let y = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_layer_norm(same(x), same(gamma), beta.map(same), eps))
    } else {
        composed::layer_norm_forward::<B>(x, gamma, beta, eps).0
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// RMSNorm of `x` `[rows.., C]` over `C` with gain `gamma` `[C]`, fused where the backend has it;
/// Burn's `RmsNorm::forward`.
pub fn rms_norm<B: Backend, const D: usize>(x: Tensor<B, D>, gamma: Tensor<B, 1>, eps: f64) -> Tensor<B, D> {
    let (x, gamma) = (x.into_primitive().tensor(), gamma.into_primitive().tensor());
    let y = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_rms_norm(same(x), same(gamma), eps))
    } else {
        composed::rms_norm_forward::<B>(x, gamma, eps).0
    });
    Tensor::from_primitive(TensorPrimitive::Float(y))
}

/// [`layer_norm`] with the parameters of Burn's `LayerNorm` module (whose ε field is private,
/// hence `eps`), so the module keeps holding the parameters and their record paths.
pub fn layer_norm_module<B: Backend, const D: usize>(
    ln: &LayerNorm<B>,
    x: Tensor<B, D>,
    eps: f64,
) -> Tensor<B, D> {
    layer_norm(x, ln.gamma.val(), ln.beta.as_ref().map(|b| b.val()), eps)
}

/// [`rms_norm`] with the parameters and ε of Burn's `RmsNorm` module.
pub fn rms_norm_module<B: Backend, const D: usize>(norm: &RmsNorm<B>, x: Tensor<B, D>) -> Tensor<B, D> {
    rms_norm(x, norm.gamma.val(), norm.epsilon)
}
