//! The AdamW kernel vs the composed update (Burn's `AdamW` order of operations) on the same
//! wgpu device, over three steps (the first without moments), with and without decay.

use burn::backend::Wgpu;
use burn::tensor::Tensor;

use super::{adamw_update, composed, AdamWScalars};
use crate::ops::cube::tests::{assert_close, device, host};
use crate::ops::testing::randn;

fn scalars(lr: f64, wd: f64, t: i32) -> AdamWScalars {
    let (beta_1, beta_2) = (0.9f32, 0.95f32);
    AdamWScalars {
        beta_1,
        beta_2,
        factor_1: 1.0 - beta_1,
        factor_2: 1.0 - beta_2,
        correction_1: 1.0 - beta_1.powi(t),
        correction_2: 1.0 - beta_2.powi(t),
        epsilon: 1e-8,
        lr,
        decay_rate: lr * wd,
    }
}

#[test]
fn cube_adamw_equals_the_composed_update_on_wgpu() {
    let Some(dev) = device("cube_adamw_equals_the_composed_update_on_wgpu") else { return };
    let on = |t: Tensor<crate::ops::testing::Ad, 2>| Tensor::<Wgpu, 2>::from_data(t.to_data(), &dev);
    for wd in [0.0, 0.1] {
        let w0 = on(randn([67, 41], 1.0, 300));
        let (mut fused, mut reference) = ((w0.clone(), None), (w0, None));
        for step in 1..=3 {
            let g = on(randn([67, 41], 0.1, 300 + step as u64));
            let s = scalars(1e-2, wd, step);
            let (w, m, v) = adamw_update(fused.0, g.clone(), fused.1, s);
            fused = (w, Some((m, v)));
            let prim = |t: Tensor<Wgpu, 2>| t.into_primitive().tensor();
            let moments = reference.1.map(|(m, v): (Tensor<Wgpu, 2>, Tensor<Wgpu, 2>)| (prim(m), prim(v)));
            let (w, m, v) = composed::update::<Wgpu>(prim(reference.0), prim(g), moments, s);
            let t = |p| Tensor::<Wgpu, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(p));
            reference = (t(w), Some((t(m), t(v))));
            let (fm, fv) = fused.1.clone().unwrap();
            let (rm, rv) = reference.1.clone().unwrap();
            let what = |x: &str| format!("adamw wd={wd} step {step} {x}");
            assert_close(&what("weight"), &host(fused.0.clone()), &host(reference.0.clone()), 1e-6, 1.0);
            assert_close(&what("m"), &host(fm), &host(rm), 1e-6, 1e-3);
            assert_close(&what("v"), &host(fv), &host(rv), 1e-6, 1e-5);
        }
    }
}
