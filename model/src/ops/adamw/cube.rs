//! The AdamW update as one CubeCL kernel: a unit per element reads `θ`, `g`, `m`, `v` once and
//! writes `θ'`, `m'`, `v'`, with Burn's operations in Burn's order (each in f32). A gated update
//! ([`UpdateGate`]) reads the gate's two numbers too: no host read decides it.

use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::{AdamWScalars, FusedAdamWUpdate, UpdateGate};
use crate::ops::cube::fusion::custom_op;
use crate::ops::cube::{contiguous, element_index, elementwise_grid, empty, three, ELEMENTWISE_THREADS};

/// [`AdamWScalars`] as kernel arguments (`keep = 1 − lr·λ`, `lr` in f32 as Burn's f32 ops;
/// `ln β` for the corrections of a gated update after skipped ones, as the composed default
/// computes them: `1 − exp((t − skipped)·ln β)`).
#[derive(CubeType, CubeLaunch, Clone, Copy)]
struct Scalars {
    ln_beta_1: f32,
    ln_beta_2: f32,
    time: f32,
    beta_1: f32,
    beta_2: f32,
    factor_1: f32,
    factor_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    lr: f32,
    keep: f32,
}

/// One element per unit; `first`: no moments yet (zeros), `decay`: `keep ≠ 1`, `gated`: `gate`
/// is an [`UpdateGate`] (else unused).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn adamw_kernel<F: Float>(
    weight: &Array<F>,
    grad: &Array<F>,
    m: &Array<F>,
    v: &Array<F>,
    gate: &Array<F>,
    weight_out: &mut Array<F>,
    m_out: &mut Array<F>,
    v_out: &mut Array<F>,
    s: Scalars,
    n: usize,
    #[comptime] first: bool,
    #[comptime] decay: bool,
    #[comptime] gated: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = element_index();
    if i >= n {
        terminate!();
    }
    let mut correction_1 = s.correction_1;
    let mut correction_2 = s.correction_2;
    if gated {
        if f32::cast_from(gate[0]) == 0.0 {
            // Gated off: the state as it was (a first step's moments are zeros).
            weight_out[i] = weight[i];
            if first {
                m_out[i] = F::new(0.0);
                v_out[i] = F::new(0.0);
            } else {
                m_out[i] = m[i];
                v_out[i] = v[i];
            }
            terminate!();
        }
        let skipped = f32::cast_from(gate[1]);
        if skipped != 0.0 {
            let t = s.time - skipped;
            correction_1 = 1.0 - f32::exp(t * s.ln_beta_1);
            correction_2 = 1.0 - f32::exp(t * s.ln_beta_2);
        }
    }
    let g = f32::cast_from(grad[i]);
    let mut mi = g * s.factor_1;
    let mut vi = (g * g) * s.factor_2;
    if !first {
        // (IEEE addition commutes exactly: the same bits as Burn's `β₁·m + (1 − β₁)·g`.)
        mi += f32::cast_from(m[i]) * s.beta_1;
        vi += f32::cast_from(v[i]) * s.beta_2;
    }
    let delta = (mi / correction_1) / (f32::sqrt(vi / correction_2) + s.epsilon);
    let mut w = f32::cast_from(weight[i]);
    if decay {
        w *= s.keep;
    }
    weight_out[i] = F::cast_from(w - delta * s.lr);
    m_out[i] = F::cast_from(mi);
    v_out[i] = F::cast_from(vi);
}

/// The kernel for every CubeCL runtime (CUDA, HIP, wgpu).
impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> FusedAdamWUpdate
    for CubeBackend<R, F, I, BT>
{
    fn fused_adamw_update(
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        s: AdamWScalars,
        gate: Option<UpdateGate<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let dtypes_differ = grad.dtype != weight.dtype
            || moments.as_ref().is_some_and(|(m, v)| m.dtype != weight.dtype || v.dtype != weight.dtype)
            || gate.as_ref().is_some_and(|g| g.dtype != weight.dtype);
        if dtypes_differ {
            return super::composed::update::<Self>(weight, grad, moments, s, gate);
        }
        let (weight, grad) = (contiguous(weight), contiguous(grad));
        let first = moments.is_none();
        let (m, v) = match moments {
            Some((m, v)) => (contiguous(m), contiguous(v)),
            None => (grad.clone(), grad.clone()),
        };
        let n = weight.shape().num_elements();
        let out = || empty(&weight, weight.shape(), weight.dtype);
        let (w_out, m_out, v_out) = (out(), out(), out());
        let gated = gate.is_some();
        let gate = gate.map_or_else(|| grad.clone(), contiguous);
        let scalars = ScalarsLaunch::new(
            s.beta_1.ln(),
            s.beta_2.ln(),
            s.time as f32,
            s.beta_1,
            s.beta_2,
            s.factor_1,
            s.factor_2,
            s.correction_1,
            s.correction_2,
            s.epsilon,
            s.lr as f32,
            (1.0 - s.decay_rate) as f32,
        );
        adamw_kernel::launch::<R>(
            &weight.client,
            elementwise_grid(n),
            CubeDim::new_1d(ELEMENTWISE_THREADS),
            weight.clone().into_array_arg(),
            grad.into_array_arg(),
            m.into_array_arg(),
            v.into_array_arg(),
            gate.into_array_arg(),
            w_out.clone().into_array_arg(),
            m_out.clone().into_array_arg(),
            v_out.clone().into_array_arg(),
            scalars,
            n,
            first,
            s.decay_rate != 0.0,
            gated,
            weight.dtype.into(),
        );
        (w_out, m_out, v_out)
    }
}

/// Burn's fusion backend over a backend with this kernel: one custom operation per tensor.
impl<B: FusionBackend + FusedAdamWUpdate> FusedAdamWUpdate for Fusion<B> {
    fn fused_adamw_update(
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        s: AdamWScalars,
        gate: Option<UpdateGate<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let out = |t: &FloatTensor<Self>| (t.shape.clone(), t.dtype);
        let outputs = match &moments {
            Some((m, v)) => vec![out(&weight), out(m), out(v)],
            None => vec![out(&weight), out(&weight), out(&weight)],
        };
        let (first, gated) = (moments.is_none(), gate.is_some());
        let mut inputs = vec![weight, grad];
        if let Some((m, v)) = moments {
            inputs.extend([m, v]);
        }
        inputs.extend(gate);
        let [w, m, v] = three(custom_op::<B>("adamw", inputs, outputs, move |i| {
            let moments = (!first).then(|| (i.float(2), i.float(3)));
            let gate = gated.then(|| i.float(if first { 2 } else { 4 }));
            let (w, m, v) = B::fused_adamw_update(i.float(0), i.float(1), moments, s, gate);
            vec![w, m, v]
        }));
        (w, m, v)
    }
}
