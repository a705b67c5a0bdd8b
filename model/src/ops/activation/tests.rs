//! The fused activations equal their composed reference: values and input gradients.

use burn::tensor::Tensor;

use super::composed;
use crate::ops::testing::{assert_close, randn, Ad};
use crate::ops::{bias_gelu, gelu, swiglu};
use crate::GeluKind;

fn reference_gelu(x: Tensor<Ad, 3>, kind: GeluKind) -> Tensor<Ad, 3> {
    match kind {
        GeluKind::Erf => burn::tensor::activation::gelu(x),
        GeluKind::Tanh => composed::gelu_tanh(x),
    }
}

#[test]
fn gelu_values_and_gradients_equal_the_composed_ops() {
    for kind in [GeluKind::Erf, GeluKind::Tanh] {
        // Odd sizes, and values out to ±9 so the tails are covered; more than one chunk.
        let x = randn([3, 61, 127], 3.0, 7);
        let w = randn([3, 61, 127], 1.0, 8);
        let xf = x.clone().require_grad();
        let xr = x.clone().require_grad();
        let yf = gelu(xf.clone(), kind);
        let yr = reference_gelu(xr.clone(), kind);
        // In the lower tail the reference computes 1 + erf(x/√2) ≈ 1 − 0.9997: ~1e-7 absolute
        // rounding, which is 1e-4 relative of an output like −6e-4 (the fused kernel uses
        // erfc there and is the more accurate side). Hence an absolute floor of 1e-6 (0.1).
        assert_close("gelu", yf.clone(), yr.clone(), 1e-5, 1e-1);
        let gf = (yf * w.clone()).sum().backward();
        let gr = (yr * w).sum().backward();
        // GELU′ = Φ(x) + x·φ(x) is a sum of O(0.1) terms that nearly cancel around x ≈ −2:
        // both sides carry ~1e-7 absolute rounding there, so the floor is 0.1.
        assert_close("dgelu/dx", xf.grad(&gf).unwrap(), xr.grad(&gr).unwrap(), 1e-5, 1e-1);
        // Without autodiff: the Flex kernel itself.
        assert_close(
            "gelu (inner)",
            gelu(x.clone().inner(), kind),
            reference_gelu(x, kind).inner(),
            1e-5,
            1e-1,
        );
    }
}

/// `GELU(x + bias)` in one pass (Flex's row kernel, and its autodiff node) equals Burn's
/// broadcasting add followed by the composed GELU: values, `dx` and `dbias`.
#[test]
fn bias_gelu_values_and_gradients_equal_the_composed_ops() {
    for kind in [GeluKind::Erf, GeluKind::Tanh] {
        // Rows of 127 (odd), 183 of them; more than one rayon chunk.
        let (x, b) = (randn([3, 61, 127], 3.0, 17), randn([127], 1.0, 18));
        let w = randn([3, 61, 127], 1.0, 19);
        let (xf, bf) = (x.clone().require_grad(), b.clone().require_grad());
        let (xr, br) = (x.clone().require_grad(), b.clone().require_grad());
        let yf = bias_gelu(xf.clone(), bf.clone(), kind);
        let yr = reference_gelu(xr.clone() + br.clone().unsqueeze::<3>(), kind);
        assert_close("bias gelu", yf.clone(), yr.clone(), 1e-5, 1e-1);
        let gf = (yf * w.clone()).sum().backward();
        let gr = (yr * w).sum().backward();
        assert_close("dbias_gelu/dx", xf.grad(&gf).unwrap(), xr.grad(&gr).unwrap(), 1e-5, 1e-1);
        assert_close("dbias_gelu/dbias", bf.grad(&gf).unwrap(), br.grad(&gr).unwrap(), 1e-5, 1.0);
        // Without autodiff: the Flex kernel itself.
        let inner = bias_gelu(x.clone().inner(), b.clone().inner(), kind);
        assert_close(
            "bias gelu (inner)",
            inner,
            reference_gelu(x.clone() + b.clone().unsqueeze::<3>(), kind).inner(),
            1e-5,
            1e-1,
        );
    }
    let x = Tensor::<Ad, 2>::from_floats([[0.5, -2.0], [1.0, 0.0]], &Default::default());
    let b = Tensor::<Ad, 1>::from_floats([0.5, 0.0], &Default::default());
    let y = bias_gelu(x, b, GeluKind::Erf).into_data().to_vec::<f32>().unwrap();
    // GELU_erf(0.5 + 0.5) = Φ(1) = 0.8413447; GELU_erf(−2) = −0.0455003; GELU_erf(1 + 0.5) =
    // 1.5·Φ(1.5) = 1.5 × 0.9331928 = 1.3997892.
    let want = [0.841_344_7, -0.045_500_26, 1.399_789_2, 0.0];
    assert!(y.iter().zip(want).all(|(y, w)| (y - w).abs() < 1e-6), "{y:?}");
}

#[test]
fn gelu_hand_computed() {
    // GELU_erf(1) = Φ(1) = 0.8413447460685429; GELU_erf(−2) = −2·Φ(−2) = −0.04550026389635842.
    let x = Tensor::<Ad, 1>::from_floats([1.0, -2.0, 0.0], &Default::default());
    let y = gelu(x, GeluKind::Erf).into_data().to_vec::<f32>().unwrap();
    let (one, minus_two) = (f64::from(y[0]), f64::from(y[1]));
    assert!((one - 0.841_344_746_068_542_9).abs() < 1e-6, "{y:?}");
    assert!((minus_two + 0.045_500_263_896_358_42).abs() < 1e-7 && y[2] == 0.0, "{y:?}");
}

#[test]
fn swiglu_values_and_gradients_equal_the_composed_ops() {
    let gate = randn([2, 33, 45], 2.0, 1);
    let up = randn([2, 33, 45], 1.0, 2);
    let w = randn([2, 33, 45], 1.0, 3);
    let (gf, uf) = (gate.clone().require_grad(), up.clone().require_grad());
    let (gr, ur) = (gate.clone().require_grad(), up.clone().require_grad());
    let yf = swiglu(gf.clone(), uf.clone());
    let yr = burn::tensor::activation::silu(gr.clone()) * ur.clone();
    assert_close("swiglu", yf.clone(), yr.clone(), 1e-5, 1e-2);
    let grads_f = (yf * w.clone()).sum().backward();
    let grads_r = (yr * w).sum().backward();
    assert_close("dswiglu/dgate", gf.grad(&grads_f).unwrap(), gr.grad(&grads_r).unwrap(), 1e-5, 1e-2);
    assert_close("dswiglu/dup", uf.grad(&grads_f).unwrap(), ur.grad(&grads_r).unwrap(), 1e-5, 1e-2);
}

#[test]
fn gelu_backward_writes_into_an_unshared_gradient() {
    use burn::backend::Flex;
    use burn::tensor::TensorPrimitive;

    use super::FusedActivation;

    let x = randn([3, 40, 70], 2.0, 11).inner();
    let g = randn([3, 40, 70], 1.0, 12).inner();
    let prim = |t: Tensor<Flex, 3>| t.into_primitive().tensor();
    let wrap = |p| Tensor::<Flex, 3>::from_primitive(TensorPrimitive::Float(p));
    for kind in [GeluKind::Erf, GeluKind::Tanh] {
        // Shared: `g` is still held here, so a new buffer.
        let shared = Flex::fused_gelu_backward(prim(x.clone()), prim(g.clone()), kind);
        // A copy of g that nothing else holds: written over.
        let own = prim(g.clone() * 1.0);
        let ptr = own.bytes().as_ptr();
        let unshared = Flex::fused_gelu_backward(prim(x.clone()), own, kind);
        assert_eq!(unshared.bytes().as_ptr(), ptr, "{kind:?}: allocated instead of reusing the gradient");
        assert_eq!(wrap(shared).into_data(), wrap(unshared).into_data(), "{kind:?}");
    }
    // g itself is untouched.
    assert_eq!(g.into_data(), randn([3, 40, 70], 1.0, 12).inner().into_data());
}

/// Φ against tabulated values of the standard normal CDF (to 16 digits), tails included:
/// relative error within 5e-7 everywhere (the fit's 1.2e-7, plus f32 rounding of `exp`'s
/// argument), where `½·(1 + erf(x/√2))` in f32 is off by 1e-7 *absolute* (0.35 relative at −5).
#[test]
fn the_composed_normal_cdf_is_relatively_accurate_in_both_tails() {
    let table = [
        (-5.0, 2.866_515_718_791_939e-7),
        (-3.0, 1.349_898_031_630_094_6e-3),
        (-1.0, 0.158_655_253_931_457_07),
        (-0.1, 0.460_172_162_722_971),
        (0.0, 0.5),
        (0.5, 0.691_462_461_274_013_1),
        (2.0, 0.977_249_868_051_820_8),
        (6.0, 0.999_999_999_013_412_4),
    ];
    let x: Vec<f32> = table.iter().map(|&(x, _)| x as f32).collect();
    let device = Default::default();
    let phi: Vec<f32> = composed::normal_cdf(Tensor::<Ad, 1>::from_floats(x.as_slice(), &device))
        .into_data()
        .to_vec()
        .unwrap();
    for (&(x, want), &got) in table.iter().zip(&phi) {
        let rel = (f64::from(got) - want).abs() / want;
        assert!(rel <= 5e-7, "Φ({x}) = {got}, expected {want}: relative error {rel:.2e}");
    }
}
