//! LayerNorm and RMSNorm kernels vs Burn's `LayerNorm`/`RmsNorm` modules on the same wgpu
//! device (differentiated by Burn's autodiff): `y`, `dx`, `dγ`, `dβ` within 1e-5 relative.

use burn::module::Param;
use burn::nn::{LayerNormConfig, RmsNormConfig};
use burn::tensor::Tensor;

use super::{assert_close, device, host, leaf, AdWgpu};
use crate::ops::testing::randn;
use crate::ops::{layer_norm, rms_norm};

const EPS: f64 = 1e-5;
/// Rows `[2, 67]` (an odd count) times these widths: a degenerate norm, below, at and above
/// one cube of 128 units, and one past a multiple of it.
const WIDTHS: [usize; 4] = [1, 48, 128, 257];

/// Floors (see `ops/norm/tests.rs`): y and dx are differences of O(1) terms, dγ and dβ sums
/// over 134 rows.
const FLOORS: [(&str, f32); 4] = [("y", 0.1), ("dx", 0.1), ("dgamma", 1.0), ("dbeta", 1.0)];

#[test]
fn cube_layer_norm_equals_burns_module_on_wgpu() {
    let Some(dev) = device("cube_layer_norm_equals_burns_module_on_wgpu") else { return };
    for (i, &c) in WIDTHS.iter().enumerate() {
        for bias in [true, false] {
            let seed = 10 * i as u64;
            let x = randn([2, 67, c], 2.0, seed);
            let g = randn([c], 0.5, seed + 1) + 1.0;
            let b = randn([c], 1.0, seed + 2);
            let w = Tensor::<AdWgpu, 3>::from_data(randn([2, 67, c], 1.0, seed + 3).to_data(), &dev);
            let run = |fused: bool| {
                let (x, g) = (leaf(&x, &dev), leaf(&g, &dev));
                let b = bias.then(|| leaf(&b, &dev));
                let y = if fused {
                    layer_norm(x.clone(), g.clone(), b.clone(), EPS)
                } else {
                    let mut ln =
                        LayerNormConfig::new(c).with_bias(bias).with_epsilon(EPS).init::<AdWgpu>(&dev);
                    ln.gamma = Param::from_tensor(g.clone());
                    ln.beta = b.clone().map(Param::from_tensor);
                    ln.forward(x.clone())
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let db = b.map(|b| host(b.grad(&grads).unwrap())).unwrap_or_default();
                [host(y), host(x.grad(&grads).unwrap()), host(g.grad(&grads).unwrap()), db]
            };
            let (fused, reference) = (run(true), run(false));
            for (k, (name, floor)) in FLOORS.into_iter().enumerate() {
                let what = format!("layer_norm C={c} bias={bias} {name}");
                assert_close(&what, &fused[k], &reference[k], 1e-5, floor);
            }
        }
    }
}

#[test]
fn cube_rms_norm_equals_burns_module_on_wgpu() {
    let Some(dev) = device("cube_rms_norm_equals_burns_module_on_wgpu") else { return };
    // Not C = 1: there dx = rstd·dŷ·(1 − x̂²) cancels to ~ε/x² of terms of size rstd, which
    // both sides round differently (a degenerate norm; LayerNorm's C = 1 gives dx = 0 exactly).
    for (i, &c) in WIDTHS.iter().enumerate().skip(1) {
        let seed = 100 + 10 * i as u64;
        let x = randn([2, 67, c], 2.0, seed);
        let g = randn([c], 0.5, seed + 1) + 1.0;
        let w = Tensor::<AdWgpu, 3>::from_data(randn([2, 67, c], 1.0, seed + 3).to_data(), &dev);
        let run = |fused: bool| {
            let (x, g) = (leaf(&x, &dev), leaf(&g, &dev));
            let y = if fused {
                rms_norm(x.clone(), g.clone(), EPS)
            } else {
                let mut norm = RmsNormConfig::new(c).with_epsilon(EPS).init::<AdWgpu>(&dev);
                norm.gamma = Param::from_tensor(g.clone());
                norm.forward(x.clone())
            };
            let grads = (y.clone() * w.clone()).sum().backward();
            [host(y), host(x.grad(&grads).unwrap()), host(g.grad(&grads).unwrap())]
        };
        let (fused, reference) = (run(true), run(false));
        for (k, (name, floor)) in FLOORS.into_iter().take(3).enumerate() {
            assert_close(&format!("rms_norm C={c} {name}"), &fused[k], &reference[k], 1e-5, floor);
        }
    }
}
