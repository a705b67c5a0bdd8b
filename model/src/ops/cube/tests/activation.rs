//! GELU (erf, tanh; with a bias added first too) and SwiGLU kernels vs the composed defaults on the same wgpu device
//! (differentiated by Burn's autodiff): values and input gradients within 1e-5 relative.

use burn::tensor::{Tensor, TensorPrimitive};

use super::{assert_close, device, host, leaf, AdWgpu};
use crate::ops::activation::composed;
use crate::ops::testing::randn;
use crate::ops::{bias_gelu, gelu, swiglu};
use crate::GeluKind;

/// A composed op on autodiff primitives, back as a tensor.
fn wrap(t: burn::tensor::ops::FloatTensor<AdWgpu>) -> Tensor<AdWgpu, 3> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

#[test]
fn cube_gelu_equals_the_composed_default_on_wgpu() {
    let Some(dev) = device("cube_gelu_equals_the_composed_default_on_wgpu") else { return };
    // 3·67·41 = 8,241 elements: not a multiple of a cube; σ = 3 reaches both tails.
    let x = randn([3, 67, 41], 3.0, 7);
    let w = Tensor::<AdWgpu, 3>::from_data(randn([3, 67, 41], 1.0, 8).to_data(), &dev);
    for kind in [GeluKind::Erf, GeluKind::Tanh] {
        let run = |fused: bool| {
            let x = leaf(&x, &dev);
            let y = if fused {
                gelu(x.clone(), kind)
            } else {
                wrap(composed::gelu::<AdWgpu>(x.clone().into_primitive().tensor(), kind))
            };
            let grads = (y.clone() * w.clone()).sum().backward();
            [host(y), host(x.grad(&grads).unwrap())]
        };
        let (fused, reference) = (run(true), run(false));
        // GELU(x) vanishes in the left tail: floor 1e-2 (1e-7 absolute). Its slope Φ(x) + x·φ(x)
        // is there a difference of O(0.1) terms, rounded by both sides: floor 0.1.
        assert_close(&format!("gelu {kind:?} y"), &fused[0], &reference[0], 1e-5, 1e-2);
        assert_close(&format!("gelu {kind:?} dx"), &fused[1], &reference[1], 1e-5, 0.1);
    }
}

/// GELU with a bias (GPT-2's `c_fc` with `bias = true`): the kernel against Burn's
/// broadcasting add and the composed GELU, values and the gradients of `x` and of the bias.
#[test]
fn cube_bias_gelu_equals_the_composed_default_on_wgpu() {
    let Some(dev) = device("cube_bias_gelu_equals_the_composed_default_on_wgpu") else { return };
    // Rows of 41 (not a multiple of a cube), 201 of them for the bias gradient's sum.
    let (x, b) = (randn([3, 67, 41], 3.0, 27), randn([41], 1.0, 28));
    let w = Tensor::<AdWgpu, 3>::from_data(randn([3, 67, 41], 1.0, 29).to_data(), &dev);
    for kind in [GeluKind::Erf, GeluKind::Tanh] {
        let run = |fused: bool| {
            let (x, b) = (leaf(&x, &dev), leaf(&b, &dev));
            let y = if fused {
                bias_gelu(x.clone(), b.clone(), kind)
            } else {
                let pre = composed::add_bias::<AdWgpu>(
                    x.clone().into_primitive().tensor(),
                    b.clone().into_primitive().tensor(),
                );
                wrap(composed::gelu::<AdWgpu>(pre, kind))
            };
            let grads = (y.clone() * w.clone()).sum().backward();
            [host(y), host(x.grad(&grads).unwrap()), host(b.grad(&grads).unwrap())]
        };
        let (fused, reference) = (run(true), run(false));
        assert_close(&format!("bias gelu {kind:?} y"), &fused[0], &reference[0], 1e-5, 1e-2);
        assert_close(&format!("bias gelu {kind:?} dx"), &fused[1], &reference[1], 1e-5, 0.1);
        // A sum of 201 slopes: the floor is the dx floor times the rows' √201 ≈ 14 rounding spread.
        assert_close(&format!("bias gelu {kind:?} dbias"), &fused[2], &reference[2], 1e-5, 1.0);
    }
}

#[test]
fn cube_swiglu_equals_the_composed_default_on_wgpu() {
    let Some(dev) = device("cube_swiglu_equals_the_composed_default_on_wgpu") else { return };
    let (g, u) = (randn([3, 67, 41], 3.0, 17), randn([3, 67, 41], 1.0, 18));
    let w = Tensor::<AdWgpu, 3>::from_data(randn([3, 67, 41], 1.0, 19).to_data(), &dev);
    let run = |fused: bool| {
        let (g, u) = (leaf(&g, &dev), leaf(&u, &dev));
        let y = if fused {
            swiglu(g.clone(), u.clone())
        } else {
            let (gp, up) = (g.clone().into_primitive().tensor(), u.clone().into_primitive().tensor());
            wrap(composed::swiglu::<AdWgpu>(gp, up))
        };
        let grads = (y.clone() * w.clone()).sum().backward();
        [host(y), host(g.grad(&grads).unwrap()), host(u.grad(&grads).unwrap())]
    };
    let (fused, reference) = (run(true), run(false));
    // dgate's factor 1 + g·(1 − σ(g)) crosses 0 near g = −1.28 (a difference of O(1) terms):
    // floor 0.1 for the gradients.
    for (k, (name, floor)) in [("y", 1e-2), ("dgate", 0.1), ("dup", 0.1)].into_iter().enumerate() {
        assert_close(&format!("swiglu {name}"), &fused[k], &reference[k], 1e-5, floor);
    }
}
