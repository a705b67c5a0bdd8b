//! The activations as composed Burn tensor ops: the generic default and the test oracle.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{activation, Tensor, TensorPrimitive};

use crate::GeluKind;

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4; // √(2/π)
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7; // 1/√(2π)

fn to_flat<B: Backend>(x: FloatTensor<B>) -> (Tensor<B, 1>, burn::tensor::Shape) {
    let shape = burn::tensor::TensorMetadata::shape(&x);
    let n = shape.num_elements();
    (Tensor::from_primitive(TensorPrimitive::Float(B::float_reshape(x, [n].into()))), shape)
}

fn back<B: Backend>(t: Tensor<B, 1>, shape: burn::tensor::Shape) -> FloatTensor<B> {
    B::float_reshape(t.into_primitive().tensor(), shape)
}

/// GPT-2's tanh-approximate GELU, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (Hendrycks &
/// Gimpel 2016, §2; Hugging Face `gelu_new`), as composed tensor ops: the same formula as Burn's
/// `gelu_approximate`, with `x³` as two multiplications (`powf` is slow on the CPU backend).
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let cube = x.clone() * x.clone() * x.clone();
    let inner = (x.clone() + cube * 0.044715) * SQRT_2_OVER_PI;
    x * (inner.tanh() + 1.0) * 0.5
}

/// GELU from tensor ops (`activation::gelu` for erf).
pub fn gelu<B: Backend>(x: FloatTensor<B>, kind: GeluKind) -> FloatTensor<B> {
    let (x, shape) = to_flat::<B>(x);
    let y = match kind {
        GeluKind::Erf => activation::gelu(x),
        GeluKind::Tanh => gelu_tanh(x),
    };
    back(y, shape)
}

/// `grad · GELU′(x)` from tensor ops.
pub fn gelu_backward<B: Backend>(x: FloatTensor<B>, grad: FloatTensor<B>, kind: GeluKind) -> FloatTensor<B> {
    let (x, shape) = to_flat::<B>(x);
    let (grad, _) = to_flat::<B>(grad);
    let slope = match kind {
        GeluKind::Erf => {
            let cdf = ((x.clone() * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0) * 0.5;
            let pdf = (x.clone() * x.clone() * -0.5).exp() * INV_SQRT_2PI;
            cdf + x * pdf
        }
        GeluKind::Tanh => {
            let x2 = x.clone() * x.clone();
            let t = ((x.clone() + x2.clone() * x.clone() * 0.044715) * SQRT_2_OVER_PI).tanh();
            let du = (x2 * (3.0 * 0.044715) + 1.0) * SQRT_2_OVER_PI;
            (t.clone() + 1.0) * 0.5 + x * (t.clone() * t).neg().add_scalar(1.0) * du * 0.5
        }
    };
    back(grad * slope, shape)
}

/// `SiLU(gate) ⊙ up` from tensor ops.
pub fn swiglu<B: Backend>(gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B> {
    let (gate, shape) = to_flat::<B>(gate);
    let (up, _) = to_flat::<B>(up);
    back(activation::silu(gate) * up, shape)
}

/// The SwiGLU gradients from tensor ops.
pub fn swiglu_backward<B: Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (gate, shape) = to_flat::<B>(gate);
    let (up, _) = to_flat::<B>(up);
    let (grad, _) = to_flat::<B>(grad);
    let sig = activation::sigmoid(gate.clone());
    let silu = gate.clone() * sig.clone();
    let dgate = grad.clone() * up * sig.clone() * ((sig.neg().add_scalar(1.0)) * gate).add_scalar(1.0);
    let dup = grad * silu;
    (back(dgate, shape.clone()), back(dup, shape))
}
