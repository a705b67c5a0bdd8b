//! GELU (erf and tanh, with or without a bias added first) and SwiGLU as CubeCL kernels: one
//! unit per element, forward and backward each in one pass, computing in f32 whatever the tensors' dtype. GELU-erf's Φ is
//! the same Numerical Recipes erfc fit as the composed default ([`super::composed::normal_cdf`],
//! 1.2e-7 relative), not the backend's `erf`.

use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::{bias_gelu_by_add, bias_gelu_dx_by_add, with_bias_grad, FusedActivation};
use crate::ops::cube::fusion::custom_op;
use crate::ops::cube::{
    contiguous, element_index, elementwise_grid, empty, rows_cols, two, ELEMENTWISE_THREADS,
};
use crate::GeluKind;

/// `√(2/π)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// `1/√(2π)`.
const INV_SQRT_2PI: f32 = 0.398_942_3;

/// `Φ(x) = ½·erfc(−x/√2)` by Numerical Recipes' `erfcc` (Press et al., 2nd ed., §6.2).
#[cube]
fn normal_cdf(x: f32) -> f32 {
    let u = x * f32::new(-core::f32::consts::FRAC_1_SQRT_2);
    let z = f32::abs(u);
    let t = f32::new(1.0) / (f32::new(1.0) + f32::new(0.5) * z);
    let mut poly = t * f32::new(0.170_872_77);
    poly = (poly + f32::new(-0.822_152_23)) * t;
    poly = (poly + f32::new(1.488_515_9)) * t;
    poly = (poly + f32::new(-1.135_204)) * t;
    poly = (poly + f32::new(0.278_868_07)) * t;
    poly = (poly + f32::new(-0.186_288_06)) * t;
    poly = (poly + f32::new(0.096_784_18)) * t;
    poly = (poly + f32::new(0.374_091_96)) * t;
    poly = (poly + f32::new(1.000_023_7)) * t;
    let half_erfc = f32::new(0.5) * t * f32::exp(poly + f32::new(-1.265_512_2) - z * z);
    let mut cdf = half_erfc;
    if u < f32::new(0.0) {
        cdf = f32::new(1.0) - half_erfc;
    }
    cdf
}

/// `(GELU(x), GELU′(x))` of the erf form (`tanh` false) or the tanh form.
#[cube]
fn gelu_and_slope(x: f32, #[comptime] tanh: bool) -> (f32, f32) {
    if tanh {
        let x2 = x * x;
        let t = f32::tanh(f32::new(SQRT_2_OVER_PI) * (x + f32::new(0.044_715) * x2 * x));
        let du = f32::new(SQRT_2_OVER_PI) * (f32::new(1.0) + f32::new(3.0 * 0.044_715) * x2);
        let y = f32::new(0.5) * x * (f32::new(1.0) + t);
        let slope = f32::new(0.5) * (f32::new(1.0) + t) + f32::new(0.5) * x * (f32::new(1.0) - t * t) * du;
        (y, slope)
    } else {
        let cdf = normal_cdf(x);
        let pdf = f32::new(INV_SQRT_2PI) * f32::exp(f32::new(-0.5) * x * x);
        (x * cdf, cdf + x * pdf)
    }
}

/// `y = GELU(x + bias)`, or (`backward`) `y = grad·GELU′(x + bias)`, one unit per element;
/// `bias` (`[m]`, added to each row of `m`) only when `with_bias`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn gelu_kernel<F: Float>(
    x: &Array<F>,
    bias: &Array<F>,
    grad: &Array<F>,
    y: &mut Array<F>,
    n: usize,
    m: usize,
    #[comptime] with_bias: bool,
    #[comptime] tanh: bool,
    #[comptime] backward: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = element_index();
    if i >= n {
        terminate!();
    }
    let mut pre = f32::cast_from(x[i]);
    if with_bias {
        pre += f32::cast_from(bias[i % m]);
    }
    let (value, slope) = gelu_and_slope(pre, tanh);
    if backward {
        y[i] = F::cast_from(f32::cast_from(grad[i]) * slope);
    } else {
        y[i] = F::cast_from(value);
    }
}

/// `out = SiLU(gate)·up`, or (`backward`) `out = grad·up·σ(g)·(1 + g·(1 − σ(g)))` and
/// `out2 = grad·SiLU(g)`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn swiglu_kernel<F: Float>(
    gate: &Array<F>,
    up: &Array<F>,
    grad: &Array<F>,
    out: &mut Array<F>,
    out2: &mut Array<F>,
    n: usize,
    #[comptime] backward: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = element_index();
    if i >= n {
        terminate!();
    }
    let g = f32::cast_from(gate[i]);
    let u = f32::cast_from(up[i]);
    let sig = f32::new(1.0) / (f32::new(1.0) + f32::exp(-g));
    if backward {
        let dy = f32::cast_from(grad[i]);
        out[i] = F::cast_from(dy * u * sig * (f32::new(1.0) + g * (f32::new(1.0) - sig)));
        out2[i] = F::cast_from(dy * g * sig);
    } else {
        out[i] = F::cast_from(g * sig * u);
    }
}

/// GELU of `x + bias` (no bias: of `x`), or its gradient with respect to `x` (`grad` given),
/// over contiguous copies of the inputs.
fn gelu<R: CubeRuntime>(
    x: CubeTensor<R>,
    bias: Option<CubeTensor<R>>,
    grad: Option<CubeTensor<R>>,
    kind: GeluKind,
) -> CubeTensor<R> {
    let x = contiguous(x);
    let n = x.shape().num_elements();
    let (_, m) = rows_cols(&x);
    let y = empty(&x, x.shape(), x.dtype);
    let with_bias = bias.is_some();
    let bias = bias.map(contiguous).unwrap_or_else(|| x.clone());
    let backward = grad.is_some();
    let grad = grad.map(contiguous).unwrap_or_else(|| x.clone());
    gelu_kernel::launch::<R>(
        &x.client,
        elementwise_grid(n),
        CubeDim::new_1d(ELEMENTWISE_THREADS),
        x.clone().into_array_arg(),
        bias.into_array_arg(),
        grad.into_array_arg(),
        y.clone().into_array_arg(),
        n,
        m,
        with_bias,
        kind == GeluKind::Tanh,
        backward,
        x.dtype.into(),
    );
    y
}

/// SwiGLU (`grad` None: `[out]`) or its gradients (`[dgate, dup]`).
fn swiglu<R: CubeRuntime>(
    gate: CubeTensor<R>,
    up: CubeTensor<R>,
    grad: Option<CubeTensor<R>>,
) -> Vec<CubeTensor<R>> {
    let (gate, up) = (contiguous(gate), contiguous(up));
    let n = gate.shape().num_elements();
    let out = empty(&gate, gate.shape(), gate.dtype);
    let backward = grad.is_some();
    let out2 = if backward { empty(&gate, gate.shape(), gate.dtype) } else { out.clone() };
    let grad = grad.map(contiguous).unwrap_or_else(|| gate.clone());
    swiglu_kernel::launch::<R>(
        &gate.client,
        elementwise_grid(n),
        CubeDim::new_1d(ELEMENTWISE_THREADS),
        gate.clone().into_array_arg(),
        up.into_array_arg(),
        grad.into_array_arg(),
        out.clone().into_array_arg(),
        out2.clone().into_array_arg(),
        n,
        backward,
        gate.dtype.into(),
    );
    if backward {
        vec![out, out2]
    } else {
        vec![out]
    }
}

/// The kernels above for every CubeCL runtime (CUDA, HIP, wgpu).
impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> FusedActivation
    for CubeBackend<R, F, I, BT>
{
    fn fused_gelu(x: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        gelu(x, None, None, kind)
    }

    fn fused_gelu_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: GeluKind,
    ) -> FloatTensor<Self> {
        gelu(x, None, Some(grad), kind)
    }

    fn fused_bias_gelu(x: FloatTensor<Self>, bias: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        match bias.dtype == x.dtype {
            true => gelu(x, Some(bias), None, kind),
            false => bias_gelu_by_add::<Self>(x, bias, kind),
        }
    }

    /// `dx` by the kernel; `dbias`, a sum over rows, by Burn's reduction.
    fn fused_bias_gelu_backward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: GeluKind,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        with_bias_grad::<Self>(match bias.dtype == x.dtype {
            true => gelu(x, Some(bias), Some(grad), kind),
            false => bias_gelu_dx_by_add::<Self>(x, bias, grad, kind),
        })
    }

    fn fused_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        swiglu(gate, up, None).remove(0)
    }

    fn fused_swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [dgate, dup] = two(swiglu(gate, up, Some(grad)));
        (dgate, dup)
    }
}

/// Burn's fusion backend over a backend with these kernels: one custom operation per call.
impl<B: FusionBackend + FusedActivation> FusedActivation for Fusion<B> {
    fn fused_gelu(x: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        let out = vec![(x.shape.clone(), x.dtype)];
        custom_op::<B>("gelu", vec![x], out, move |i| vec![B::fused_gelu(i.float(0), kind)]).remove(0)
    }

    fn fused_gelu_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: GeluKind,
    ) -> FloatTensor<Self> {
        let out = vec![(x.shape.clone(), x.dtype)];
        custom_op::<B>("gelu_backward", vec![x, grad], out, move |i| {
            vec![B::fused_gelu_backward(i.float(0), i.float(1), kind)]
        })
        .remove(0)
    }

    fn fused_bias_gelu(x: FloatTensor<Self>, bias: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        let out = vec![(x.shape.clone(), x.dtype)];
        custom_op::<B>("bias_gelu", vec![x, bias], out, move |i| {
            vec![B::fused_bias_gelu(i.float(0), i.float(1), kind)]
        })
        .remove(0)
    }

    fn fused_bias_gelu_backward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: GeluKind,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let out = vec![(x.shape.clone(), x.dtype), (bias.shape.clone(), bias.dtype)];
        let [dx, dbias] = two(custom_op::<B>("bias_gelu_backward", vec![x, bias, grad], out, move |i| {
            let (dx, dbias) = B::fused_bias_gelu_backward(i.float(0), i.float(1), i.float(2), kind);
            vec![dx, dbias]
        }));
        (dx, dbias)
    }

    fn fused_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = vec![(gate.shape.clone(), gate.dtype)];
        custom_op::<B>("swiglu", vec![gate, up], out, |i| vec![B::fused_swiglu(i.float(0), i.float(1))])
            .remove(0)
    }

    fn fused_swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let out = vec![(gate.shape.clone(), gate.dtype), (up.shape.clone(), up.dtype)];
        let [dgate, dup] = two(custom_op::<B>("swiglu_backward", vec![gate, up, grad], out, |i| {
            let (dgate, dup) = B::fused_swiglu_backward(i.float(0), i.float(1), i.float(2));
            vec![dgate, dup]
        }));
        (dgate, dup)
    }
}
