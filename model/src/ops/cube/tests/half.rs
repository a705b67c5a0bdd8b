//! The kernels on f16 tensors (fp16-mixed's dtype on wgpu): they read f16, compute and
//! accumulate in f32 and round each output once, so they must equal the composed f32 reference
//! on the same f16-rounded inputs to within one f16 rounding: half a unit in the last place,
//! 2⁻¹¹ ≈ 4.9e-4 relative, plus f32 noise — bound 1e-3 (one f16 spacing, 2⁻¹⁰), with the same
//! absolute floors as the f32 tests.

use burn::module::Param;
use burn::nn::LayerNormConfig;
use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};

use super::{assert_close, device, host, AdWgpu};
use crate::ops::testing::{randn, Ad};
use crate::ops::{activation, attention, flash_attention, gelu, layer_norm};
use crate::GeluKind;

/// Bound: one f16 spacing (see the module docs).
const REL: f32 = 1e-3;

/// `t` on the device as an f16 leaf, and as the f32 leaf of the same (f16-rounded) values.
fn leaves<const D: usize>(
    t: &Tensor<Ad, D>,
    dev: &burn::backend::wgpu::WgpuDevice,
) -> (Tensor<AdWgpu, D>, Tensor<AdWgpu, D>) {
    let half = Tensor::<AdWgpu, D>::from_data(t.to_data(), dev).cast(DType::F16);
    let full = half.clone().cast(DType::F32);
    (half.detach().require_grad(), full.detach().require_grad())
}

#[test]
fn cube_kernels_in_f16_equal_the_f32_reference_within_one_f16_rounding() {
    let Some(dev) = device("cube_kernels_in_f16_equal_the_f32_reference_within_one_f16_rounding") else {
        return;
    };
    // Upstream gradients f16-representable, so that both sides get the same dy.
    let w = |shape: [usize; 3], seed| {
        Tensor::<AdWgpu, 3>::from_data(randn(shape, 1.0, seed).to_data(), &dev)
            .cast(DType::F16)
            .cast(DType::F32)
    };

    // LayerNorm: the composed reference is Burn's module in f32.
    let c = 48;
    let (x16, x32) = leaves(&randn([2, 67, c], 2.0, 201), &dev);
    let (g16, g32) = leaves(&(randn([c], 0.5, 202) + 1.0), &dev);
    let (b16, b32) = leaves(&randn([c], 1.0, 203), &dev);
    let wy = w([2, 67, c], 204);
    let y16 = layer_norm(x16.clone(), g16.clone(), Some(b16.clone()), 1e-5);
    assert_eq!(y16.dtype(), DType::F16, "layer_norm keeps f16");
    let grads16 = (y16.clone().cast(DType::F32) * wy.clone()).sum().backward();
    let mut ln = LayerNormConfig::new(c).with_epsilon(1e-5).init::<AdWgpu>(&dev);
    ln.gamma = Param::from_tensor(g32.clone());
    ln.beta = Some(Param::from_tensor(b32.clone()));
    let y32 = ln.forward(x32.clone());
    let grads32 = (y32.clone() * wy).sum().backward();
    assert_close("f16 layer_norm y", &host(y16), &host(y32), REL, 0.1);
    assert_close(
        "f16 layer_norm dx",
        &host(x16.grad(&grads16).unwrap()),
        &host(x32.grad(&grads32).unwrap()),
        REL,
        0.1,
    );
    assert_close(
        "f16 layer_norm dgamma",
        &host(g16.grad(&grads16).unwrap()),
        &host(g32.grad(&grads32).unwrap()),
        REL,
        1.0,
    );

    // GELU (erf), then SwiGLU, against the composed defaults in f32.
    let (x16, x32) = leaves(&randn([3, 67, 41], 3.0, 205), &dev);
    let (u16, u32) = leaves(&randn([3, 67, 41], 1.0, 206), &dev);
    let wy = w([3, 67, 41], 207);
    let prim = |t: &Tensor<AdWgpu, 3>| t.clone().into_primitive().tensor();
    let wrap = |t| Tensor::<AdWgpu, 3>::from_primitive(TensorPrimitive::Float(t));
    let y16 = gelu(x16.clone(), GeluKind::Erf);
    let grads16 = (y16.clone().cast(DType::F32) * wy.clone()).sum().backward();
    let y32 = wrap(activation::composed::gelu::<AdWgpu>(prim(&x32), GeluKind::Erf));
    let grads32 = (y32.clone() * wy.clone()).sum().backward();
    assert_close("f16 gelu y", &host(y16), &host(y32), REL, 0.1);
    let dx = |x: &Tensor<AdWgpu, 3>, g| host(x.grad(g).unwrap());
    assert_close("f16 gelu dx", &dx(&x16, &grads16), &dx(&x32, &grads32), REL, 0.1);
    let (x16, x32) = (x16.detach().require_grad(), x32.detach().require_grad());
    let y16 = crate::ops::swiglu(x16.clone(), u16.clone());
    let grads16 = (y16.clone().cast(DType::F32) * wy.clone()).sum().backward();
    let y32 = wrap(activation::composed::swiglu::<AdWgpu>(prim(&x32), prim(&u32)));
    let grads32 = (y32.clone() * wy).sum().backward();
    assert_close("f16 swiglu y", &host(y16), &host(y32), REL, 0.1);
    assert_close("f16 swiglu dgate", &dx(&x16, &grads16), &dx(&x32, &grads32), REL, 0.1);
    assert_close("f16 swiglu dup", &dx(&u16, &grads16), &dx(&u32, &grads32), REL, 0.1);

    // Attention with packed documents against the composed default in f32.
    let (bt, t, h, d) = (2, 67, 2, 32);
    let (q16, q32) = leaves(&randn([bt, t, h, d], 1.0, 208), &dev);
    let (k16, k32) = leaves(&randn([bt, t, h, d], 1.0, 209), &dev);
    let (v16, v32) = leaves(&randn([bt, t, h, d], 1.0, 210), &dev);
    let wo = Tensor::<AdWgpu, 4>::from_data(randn([bt, t, h, d], 1.0, 211).to_data(), &dev)
        .cast(DType::F16)
        .cast(DType::F32);
    let positions: Vec<i64> = [20, 47, 33, 34].iter().flat_map(|&n| 0..n as i64).collect();
    let pos = || Tensor::<AdWgpu, 2, Int>::from_data(TensorData::new(positions.clone(), [bt, t]), &dev);
    let o16 = flash_attention(q16.clone(), k16.clone(), v16.clone(), Some(pos()));
    let grads16 = (o16.clone().cast(DType::F32) * wo.clone()).sum().backward();
    let p4 = |x: &Tensor<AdWgpu, 4>| x.clone().into_primitive().tensor();
    let o32 = Tensor::<AdWgpu, 4>::from_primitive(TensorPrimitive::Float(attention::composed::attention::<
        AdWgpu,
    >(
        p4(&q32),
        p4(&k32),
        p4(&v32),
        Some(pos().into_primitive()),
    )));
    let grads32 = (o32.clone() * wo).sum().backward();
    let rms = |v: &[f32]| (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
    let (o16, o32) = (host(o16), host(o32));
    assert_close("f16 attention out", &o16, &o32, REL, rms(&o32));
    for (name, a, b) in [("dq", &q16, &q32), ("dk", &k16, &k32), ("dv", &v16, &v32)] {
        let (g16, g32) = (host(a.grad(&grads16).unwrap()), host(b.grad(&grads32).unwrap()));
        // The backward's Δ_i = dO_i·O_i reads the saved output, rounded to f16 (as FlashAttention
        // does in fp16), and dS = P∘(dP − Δ) cancels: O's rounding (2⁻¹¹ relative) reaches the
        // gradients amplified about tenfold. Bound 1e-2 of the tensor's RMS (5.9e-3 measured).
        assert_close(&format!("f16 attention {name}"), &g16, &g32, 10.0 * REL, rms(&g32));
    }
}
