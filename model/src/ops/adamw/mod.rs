//! One AdamW update of a parameter tensor and its two moments (Loshchilov & Hutter 2019,
//! Algorithm 2, as PyTorch's `torch.optim.AdamW` and Burn 0.21's `AdamW` compute it), as a Burn
//! backend extension, so that the optimizer (ember-train's `FusedAdamW`, which keeps Burn's
//! state records) runs one kernel per tensor where a backend has one. With step `t` from 1:
//!
//! ```text
//! m ← β₁·m + (1 − β₁)·g                 (t = 1: m ← (1 − β₁)·g)
//! v ← β₂·v + (1 − β₂)·g²                (t = 1: v ← (1 − β₂)·g²)
//! θ ← θ·(1 − lr·λ) − lr·(m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε)
//! ```
//!
//! The default is Burn tensor operations in Burn's order (every backend); Burn's CubeCL
//! backends (feature `cube`) run one kernel that reads `θ`, `g`, `m`, `v` once and writes the
//! three results. burn-flex's in-place update lives in ember-train (it owns its buffers).
//!
//! An update can be *gated* by a decision that lives on the device ([`UpdateGate`]): the
//! stability sentinel's verdict, computed from the all-reduced loss and gradient norm without
//! reading them back, so a skipped step costs no host sync. A gated-off update leaves `θ`, `m`
//! and `v` as they were, as PyTorch's `GradScaler` leaves a skipped step's state.

mod composed;
#[cfg(feature = "cube")]
mod cube;
#[cfg(all(test, feature = "wgpu"))]
mod tests;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::dispatch::{same, with_fused_backend};

/// The scalars of one AdamW update at step `t`, with Burn's types (and so its rounding).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWScalars {
    /// β₁.
    pub beta_1: f32,
    /// β₂.
    pub beta_2: f32,
    /// `1 − β₁` (f32).
    pub factor_1: f32,
    /// `1 − β₂` (f32).
    pub factor_2: f32,
    /// `1 − β₁ᵗ` (f32).
    pub correction_1: f32,
    /// `1 − β₂ᵗ` (f32).
    pub correction_2: f32,
    /// ε, added to `√v̂`.
    pub epsilon: f32,
    /// The learning rate.
    pub lr: f64,
    /// `lr·λ`; no decay when it is 0.
    pub decay_rate: f64,
    /// The step count `t` of this update (from 1), whose bias corrections these are; a gate's
    /// skipped count is taken off it ([`UpdateGate`]).
    pub time: u32,
}

/// A device-side decision about one AdamW update: a float tensor `[2]` on the update's device,
/// `[apply, skipped]`.
///
/// - `apply` = 1: the update is made; 0: `θ`, `m` and `v` come out unchanged (zeros for the
///   moments of a first step).
/// - `skipped`: updates gated off since the caller last corrected its step count, which counted
///   them (the caller cannot know them without a host read). The update then runs at step
///   `t = time − skipped`, with the bias corrections `1 − βᵗ` computed on the device (exactly
///   [`AdamWScalars`]'s when `skipped` is 0).
pub type UpdateGate<B> = FloatTensor<B>;

/// The AdamW update as a Burn backend extension. Shapes: `weight`, `grad`, `m`, `v` and the
/// results all the same (any shape); `m`, `v` `None` at the first step (zeros); `gate` `[2]`
/// ([`UpdateGate`]) or `None` (always applied).
pub trait FusedAdamWUpdate: Backend {
    /// `(θ', m', v')` after one update (see the module docs).
    fn fused_adamw_update(
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        s: AdamWScalars,
        gate: Option<UpdateGate<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        composed::update::<Self>(weight, grad, moments, s, gate)
    }
}

/// burn-flex: the composed default here (ember-train updates Flex f32 tensors in place).
impl FusedAdamWUpdate for burn::backend::Flex {}

/// Optimizers run on the inner backend; an autodiff backend takes the composed default.
impl<B: Backend, C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy> FusedAdamWUpdate
    for burn::backend::Autodiff<B, C>
{
}

/// One AdamW update of `weight` with `grad` and the moments `(m, v)` (`None` at the first
/// step), gated by `gate` (`[2]`, see [`UpdateGate`]) when there is one, fused where the
/// backend has a kernel ([`FusedAdamWUpdate`]), else Burn tensor ops: `(θ', m', v')`.
pub fn adamw_update<B: Backend, const D: usize>(
    weight: Tensor<B, D>,
    grad: Tensor<B, D>,
    moments: Option<(Tensor<B, D>, Tensor<B, D>)>,
    s: AdamWScalars,
    gate: Option<Tensor<B, 1>>,
) -> (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>) {
    let (w, g) = (weight.into_primitive().tensor(), grad.into_primitive().tensor());
    let moments = moments.map(|(m, v)| (m.into_primitive().tensor(), v.into_primitive().tensor()));
    let gate = gate.map(|g| g.into_primitive().tensor());
    let (w, m, v) = with_fused_backend!(B, FB => {
        let moments = moments.map(|(m, v)| (same(m), same(v)));
        let (w, m, v) = FB::fused_adamw_update(same(w), same(g), moments, s, gate.map(same));
        (same::<FloatTensor<FB>, FloatTensor<B>>(w), same(m), same(v))
    } else {
        composed::update::<B>(w, g, moments, s, gate)
    });
    let t = |p| Tensor::from_primitive(TensorPrimitive::Float(p));
    (t(w), t(m), t(v))
}
