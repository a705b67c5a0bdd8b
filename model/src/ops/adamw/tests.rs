//! The AdamW kernel vs the composed update (Burn's `AdamW` order of operations) on the same
//! wgpu device, over three steps (the first without moments), with and without decay; and the
//! gated update: gated off it returns the state unchanged, after skipped updates it runs at the
//! step count less the skipped ones.

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
        time: t as u32,
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
            let (w, m, v) = adamw_update(fused.0, g.clone(), fused.1, s, None);
            fused = (w, Some((m, v)));
            let prim = |t: Tensor<Wgpu, 2>| t.into_primitive().tensor();
            let moments = reference.1.map(|(m, v): (Tensor<Wgpu, 2>, Tensor<Wgpu, 2>)| (prim(m), prim(v)));
            let (w, m, v) = composed::update::<Wgpu>(prim(reference.0), prim(g), moments, s, None);
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

#[test]
fn gated_adamw_keeps_or_updates_at_the_unskipped_step_count_on_wgpu() {
    let Some(dev) = device("gated_adamw_keeps_or_updates_at_the_unskipped_step_count_on_wgpu") else {
        return;
    };
    let on = |t: Tensor<crate::ops::testing::Ad, 2>| Tensor::<Wgpu, 2>::from_data(t.to_data(), &dev);
    let gate = |apply: f32, skipped: f32| Tensor::<Wgpu, 1>::from_floats([apply, skipped], &dev);
    let (w, g) = (on(randn([33, 17], 1.0, 400)), on(randn([33, 17], 0.1, 401)));
    let (m, v) = (on(randn([33, 17], 0.01, 402)), on(randn([33, 17], 0.001, 403)).abs());
    let moments = || Some((m.clone(), v.clone()));
    let prim = |t: Tensor<Wgpu, 2>| t.into_primitive().tensor();
    let back = |p| host(Tensor::<Wgpu, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(p)));
    for wd in [0.0, 0.1] {
        let what = |x: &str| format!("gated adamw wd={wd}: {x}");
        // Gated off: exactly the state as it was; a first step's moments are zeros.
        let (w1, m1, v1) =
            adamw_update(w.clone(), g.clone(), moments(), scalars(1e-2, wd, 5), Some(gate(0.0, 3.0)));
        assert_eq!(
            (host(w1), host(m1), host(v1)),
            (host(w.clone()), host(m.clone()), host(v.clone())),
            "{}",
            what("off")
        );
        let (w1, m1, v1) =
            adamw_update(w.clone(), g.clone(), None, scalars(1e-2, wd, 1), Some(gate(0.0, 0.0)));
        assert_eq!(host(w1), host(w.clone()), "{}", what("off, first step"));
        assert!(host(m1).iter().chain(&host(v1)).all(|x| *x == 0.0), "{}", what("first moments zero"));
        // On, nothing skipped: the ungated update bit for bit.
        let s = scalars(1e-2, wd, 5);
        let (a, b) = (
            adamw_update(w.clone(), g.clone(), moments(), s, Some(gate(1.0, 0.0))),
            adamw_update(w.clone(), g.clone(), moments(), s, None),
        );
        assert_eq!((host(a.0), host(a.1), host(a.2)), (host(b.0), host(b.1), host(b.2)), "{}", what("on"));
        // On after 2 skipped updates at time 5: the update of step 3 (corrections on the device).
        let (gated, _, _) = adamw_update(w.clone(), g.clone(), moments(), s, Some(gate(1.0, 2.0)));
        let (step_3, _, _) = adamw_update(w.clone(), g.clone(), moments(), scalars(1e-2, wd, 3), None);
        assert_close(&what("after skips vs step 3"), &host(gated.clone()), &host(step_3.clone()), 1e-6, 1.0);
        let (unskipped, _, _) = adamw_update(w.clone(), g.clone(), moments(), s, None);
        assert!(
            host(unskipped).iter().zip(host(step_3)).any(|(a, b)| (a - b).abs() > 1e-5),
            "{}",
            what("steps 3 and 5 must differ for this test to mean anything")
        );
        // The kernel equals the composed default, gated.
        let pm = Some((prim(m.clone()), prim(v.clone())));
        let (cw, _, _) = composed::update::<Wgpu>(
            prim(w.clone()),
            prim(g.clone()),
            pm,
            s,
            Some(gate(1.0, 2.0).into_primitive().tensor()),
        );
        assert_close(&what("kernel vs composed, gated"), &host(gated), &back(cw), 1e-6, 1.0);
    }
}
