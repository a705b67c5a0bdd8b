//! The AdamW update as Burn tensor operations, in the order of Burn 0.21's `AdamW`: the generic
//! default and the reference of the kernels.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{AdamWScalars, UpdateGate};

/// `(θ', m', v')` from tensor operations, gated by `gate` when there is one (see the parent
/// module).
pub fn update<B: Backend>(
    weight: FloatTensor<B>,
    grad: FloatTensor<B>,
    moments: Option<(FloatTensor<B>, FloatTensor<B>)>,
    s: AdamWScalars,
    gate: Option<UpdateGate<B>>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let t = |p| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(p));
    let shape = burn::tensor::TensorMetadata::shape(&weight);
    let n = shape.num_elements();
    let flat = |p: FloatTensor<B>| t(B::float_reshape(p, [n].into()));
    let (tensor, grad) = (flat(weight), flat(grad));
    let old = gate.is_some().then(|| match &moments {
        Some((m, v)) => (tensor.clone(), flat(m.clone()), flat(v.clone())),
        None => (tensor.clone(), grad.zeros_like(), grad.zeros_like()),
    });
    let (moment_1, moment_2) = match moments {
        Some((m, v)) => (
            flat(m).mul_scalar(s.beta_1).add(grad.clone().mul_scalar(s.factor_1)),
            flat(v).mul_scalar(s.beta_2).add(grad.clone().square().mul_scalar(s.factor_2)),
        ),
        None => (grad.clone().mul_scalar(s.factor_1), grad.square().mul_scalar(s.factor_2)),
    };
    let gate = gate.map(t);
    let (m_hat, v_hat) = match &gate {
        None => (moment_1.clone().div_scalar(s.correction_1), moment_2.clone().div_scalar(s.correction_2)),
        Some(gate) => {
            let skipped = gate.clone().slice(1..2);
            let correction = |beta: f32, host: f32| {
                let steps = skipped.clone().neg().add_scalar(s.time as f32);
                let device = steps.mul_scalar(beta.ln()).exp().neg().add_scalar(1.0);
                let exact = skipped.clone().equal_elem(0.0);
                device.mask_fill(exact, host).expand([n])
            };
            (
                moment_1.clone().div(correction(s.beta_1, s.correction_1)),
                moment_2.clone().div(correction(s.beta_2, s.correction_2)),
            )
        }
    };
    let delta = m_hat.div(v_hat.sqrt().add_scalar(s.epsilon));
    let decayed = if s.decay_rate == 0.0 { tensor } else { tensor.mul_scalar(1.0 - s.decay_rate) };
    let mut out = (decayed - delta.mul_scalar(s.lr), moment_1, moment_2);
    if let (Some(gate), Some((w, m, v))) = (gate, old) {
        let off = gate.slice(0..1).equal_elem(0.0).expand([n]);
        out = (out.0.mask_where(off.clone(), w), out.1.mask_where(off.clone(), m), out.2.mask_where(off, v));
    }
    let back = |x: Tensor<B, 1>| B::float_reshape(x.into_primitive().tensor(), shape.clone());
    (back(out.0), back(out.1), back(out.2))
}
