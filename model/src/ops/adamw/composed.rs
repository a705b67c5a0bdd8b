//! The AdamW update as Burn tensor operations, in the order of Burn 0.21's `AdamW`: the generic
//! default and the reference of the kernels.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::AdamWScalars;

/// `(θ', m', v')` from tensor operations (see the parent module).
pub fn update<B: Backend>(
    weight: FloatTensor<B>,
    grad: FloatTensor<B>,
    moments: Option<(FloatTensor<B>, FloatTensor<B>)>,
    s: AdamWScalars,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let t = |p| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(p));
    let shape = burn::tensor::TensorMetadata::shape(&weight);
    let n = shape.num_elements();
    let flat = |p: FloatTensor<B>| t(B::float_reshape(p, [n].into()));
    let (tensor, grad) = (flat(weight), flat(grad));
    let (moment_1, moment_2) = match moments {
        Some((m, v)) => (
            flat(m).mul_scalar(s.beta_1).add(grad.clone().mul_scalar(s.factor_1)),
            flat(v).mul_scalar(s.beta_2).add(grad.clone().square().mul_scalar(s.factor_2)),
        ),
        None => (grad.clone().mul_scalar(s.factor_1), grad.square().mul_scalar(s.factor_2)),
    };
    let m_hat = moment_1.clone().div_scalar(s.correction_1);
    let v_hat = moment_2.clone().div_scalar(s.correction_2);
    let delta = m_hat.div(v_hat.sqrt().add_scalar(s.epsilon));
    let decayed = if s.decay_rate == 0.0 { tensor } else { tensor.mul_scalar(1.0 - s.decay_rate) };
    let updated = decayed - delta.mul_scalar(s.lr);
    let back = |x: Tensor<B, 1>| B::float_reshape(x.into_primitive().tensor(), shape.clone());
    (back(updated), back(moment_1), back(moment_2))
}
