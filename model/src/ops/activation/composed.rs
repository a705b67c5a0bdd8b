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

/// `(rows, m)` of a tensor seen as rows of its last dimension.
fn rows_and_width(shape: &burn::tensor::Shape) -> (usize, usize) {
    let m = shape.to_vec().last().copied().unwrap_or(1).max(1);
    (shape.num_elements() / m, m)
}

/// `x + bias` for `x` `[.., m]` and `bias` `[m]` (Burn's broadcasting add over `[rows, m]`).
pub fn add_bias<B: Backend>(x: FloatTensor<B>, bias: FloatTensor<B>) -> FloatTensor<B> {
    let shape = burn::tensor::TensorMetadata::shape(&x);
    let (rows, m) = rows_and_width(&shape);
    let x = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_reshape(x, [rows, m].into())));
    let bias = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_reshape(bias, [1, m].into())));
    B::float_reshape((x + bias).into_primitive().tensor(), shape)
}

/// `Σ over the rows of t`: `[.., m]` → `[m]` (a bias's gradient).
pub fn sum_rows<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let (rows, m) = rows_and_width(&burn::tensor::TensorMetadata::shape(&t));
    let t = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_reshape(t, [rows, m].into())));
    t.sum_dim(0).reshape([m]).into_primitive().tensor()
}

/// GPT-2's tanh-approximate GELU, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (Hendrycks &
/// Gimpel 2016, §2; Hugging Face `gelu_new`), as composed tensor ops: the same formula as Burn's
/// `gelu_approximate`, with `x³` as two multiplications (`powf` is slow on the CPU backend).
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let cube = x.clone() * x.clone() * x.clone();
    let inner = (x.clone() + cube * 0.044715) * SQRT_2_OVER_PI;
    x * (inner.tanh() + 1.0) * 0.5
}

/// The standard normal CDF `Φ(x) = ½·erfc(−x/√2)` from tensor ops, to about 1e-7 *relative*
/// error for every x: erfc by the Chebyshev fit of Press et al., *Numerical Recipes* (2nd ed.,
/// §6.2, `erfcc`: fractional error below 1.2e-7 everywhere), so that Φ of a negative x keeps
/// its relative accuracy. Burn's `erf` on CubeCL's WGSL backends is Abramowitz & Stegun 7.1.26,
/// 1.5e-7 *absolute*, and through GELU′ that bias adds up over the tokens of a batch into weight
/// gradients 4e-5 off (measured on the gpt2-erf-nobias fixture on wgpu).
pub fn normal_cdf<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    const C: [f64; 10] = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let u = x * -std::f64::consts::FRAC_1_SQRT_2; // Φ(x) = ½·erfc(u)
    let z = u.clone().abs();
    let t = (z.clone() * 0.5).add_scalar(1.0).recip();
    let mut poly = t.clone() * C[9];
    for &c in C[1..9].iter().rev() {
        poly = (poly.add_scalar(c)) * t.clone();
    }
    let erfc_z = t * (poly.add_scalar(C[0]) - z.clone() * z).exp(); // erfc(|u|)
                                                                    // erfc(u) = 2 − erfc(|u|) for u < 0; Φ = ½·erfc(u).
    let negative = u.lower_elem(0.0);
    let half = erfc_z.clone() * 0.5;
    half.clone().mask_where(negative, half.neg().add_scalar(1.0))
}

/// GELU from tensor ops: `x·Φ(x)` for erf ([`normal_cdf`]), [`gelu_tanh`] for tanh.
pub fn gelu<B: Backend>(x: FloatTensor<B>, kind: GeluKind) -> FloatTensor<B> {
    let (x, shape) = to_flat::<B>(x);
    let y = match kind {
        GeluKind::Erf => x.clone() * normal_cdf(x),
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
            let cdf = normal_cdf(x.clone());
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
