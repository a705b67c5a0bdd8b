//! The fused norms equal Burn's `LayerNorm`/`RmsNorm` modules (differentiated by Burn's
//! autodiff): values, input and parameter gradients, on odd shapes; an f64 reference where the
//! f32 reference itself is the inaccurate side; hand-computed numbers; bit-identical parameter
//! gradients whatever the thread count.

use burn::backend::Flex;
use burn::module::{AutodiffModule, Param};
use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use burn::tensor::{Tensor, TensorData};

use crate::ops::testing::{assert_close, randn, Ad};
use crate::ops::{layer_norm, rms_norm};

const EPS: f64 = 1e-5;
/// Row counts `[3, 37]` times these row lengths: 1 (a degenerate norm), below, at and above the
/// 32 accumulator lanes, and one more than a multiple of them.
const WIDTHS: [usize; 4] = [1, 5, 384, 769];

/// A LayerNorm over `c` with random γ (around 1) and β.
fn random_layer_norm(c: usize, bias: bool, seed: u64) -> LayerNorm<Ad> {
    let mut ln = LayerNormConfig::new(c).with_bias(bias).with_epsilon(EPS).init::<Ad>(&Default::default());
    ln.gamma = Param::from_tensor(randn([c], 0.5, seed) + 1.0);
    ln.beta = bias.then(|| Param::from_tensor(randn([c], 1.0, seed + 1)));
    ln
}

fn random_rms_norm(c: usize, seed: u64) -> RmsNorm<Ad> {
    let mut norm = RmsNormConfig::new(c).with_epsilon(EPS).init::<Ad>(&Default::default());
    norm.gamma = Param::from_tensor(randn([c], 0.5, seed) + 1.0);
    norm
}

fn values<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

/// `(y, dx, dγ, dβ)` of `Σ y·w` for LayerNorm with `ln`'s parameters on `x`: fused, or Burn's
/// module. Each run starts from fresh leaves, so the two graphs share no node.
fn run_layer_norm(ln: &LayerNorm<Ad>, x: &Tensor<Ad, 3>, w: &Tensor<Ad, 3>, fused: bool) -> [Vec<f32>; 4] {
    let x = Tensor::<Ad, 3>::from_inner(x.clone().inner()).require_grad();
    let gamma = Tensor::<Ad, 1>::from_inner(ln.gamma.val().inner()).require_grad();
    let beta = ln.beta.as_ref().map(|b| Tensor::<Ad, 1>::from_inner(b.val().inner()).require_grad());
    let y = if fused {
        layer_norm(x.clone(), gamma.clone(), beta.clone(), EPS)
    } else {
        let mut module = ln.clone();
        module.gamma = Param::from_tensor(gamma.clone());
        module.beta = beta.clone().map(Param::from_tensor);
        module.forward(x.clone())
    };
    let grads = (y.clone() * w.clone()).sum().backward();
    let dbeta = beta.map(|b| values(b.grad(&grads).unwrap())).unwrap_or_default();
    [values(y), values(x.grad(&grads).unwrap()), values(gamma.grad(&grads).unwrap()), dbeta]
}

/// Fused vs Burn's module on `x`: y, dx, dγ, dβ within `rel` (with the floors explained below).
fn check_layer_norm(ln: &LayerNorm<Ad>, x: Tensor<Ad, 3>, rel: f32, what: &str) {
    let w = randn(x.dims(), 1.0, 99);
    let [fused, reference] = [true, false].map(|fused| run_layer_norm(ln, &x, &w, fused));
    // y = x̂·γ + β: near 0 it is a difference of O(1) terms, ~1e-7 absolute: floor 0.1.
    // dx is O(rstd) with the same cancellation: floor 0.1 (1e-6 absolute).
    // dγ, dβ sum 111 rows of O(1) terms: ~1e-6 absolute rounding, floor 1.
    for (i, (name, floor)) in
        [("y", 0.1), ("dx", 0.1), ("dgamma", 1.0), ("dbeta", 1.0)].into_iter().enumerate()
    {
        assert_close_vec(&format!("{what} {name}"), &fused[i], &reference[i], rel, floor);
    }
}

/// [`assert_close`] on plain values.
fn assert_close_vec(what: &str, got: &[f32], want: &[f32], rel: f32, floor: f32) {
    let t =
        |v: &[f32]| Tensor::<Flex, 1>::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default());
    assert_close(what, t(got), t(want), rel, floor);
}

#[test]
fn layer_norm_values_and_gradients_equal_burns_module() {
    for (i, &c) in WIDTHS.iter().enumerate() {
        for bias in [true, false] {
            let ln = random_layer_norm(c, bias, 10 + i as u64);
            let x = randn([3, 37, c], 2.0, 20 + i as u64) + 0.5;
            check_layer_norm(&ln, x, 1e-5, &format!("C={c} bias={bias}"));
        }
    }
}

/// `(y, dx, dγ)` of `Σ y·w` for RMSNorm with `norm`'s gain on `x`: fused, or Burn's module.
fn run_rms_norm(norm: &RmsNorm<Ad>, x: &Tensor<Ad, 3>, w: &Tensor<Ad, 3>, fused: bool) -> [Vec<f32>; 3] {
    let x = Tensor::<Ad, 3>::from_inner(x.clone().inner()).require_grad();
    let gamma = Tensor::<Ad, 1>::from_inner(norm.gamma.val().inner()).require_grad();
    let y = if fused {
        rms_norm(x.clone(), gamma.clone(), EPS)
    } else {
        let mut module = norm.clone();
        module.gamma = Param::from_tensor(gamma.clone());
        module.forward(x.clone())
    };
    let grads = (y.clone() * w.clone()).sum().backward();
    [values(y), values(x.grad(&grads).unwrap()), values(gamma.grad(&grads).unwrap())]
}

#[test]
fn rms_norm_values_and_gradients_equal_burns_module() {
    for (i, &c) in WIDTHS.iter().enumerate() {
        let norm = random_rms_norm(c, 30 + i as u64);
        let x = randn([3, 37, c], 2.0, 40 + i as u64) + 0.5;
        let w = randn([3, 37, c], 1.0, 50 + i as u64);
        let [fused, reference] = [true, false].map(|fused| run_rms_norm(&norm, &x, &w, fused));
        // C = 1: dx = rstd·dŷ·(1 − x̂²) = rstd·dŷ·ε/(x² + ε) ≈ 1e-3, where both sides cancel
        // O(rstd·dŷ) terms with ~1e-6 absolute rounding: floor 1 there, 0.1 otherwise.
        let dx_floor = if c == 1 { 1.0 } else { 0.1 };
        for (i, (name, floor)) in [("y", 0.1), ("dx", dx_floor), ("dgamma", 1.0)].into_iter().enumerate() {
            assert_close_vec(&format!("C={c} {name}"), &fused[i], &reference[i], 1e-5, floor);
        }
    }
}

#[test]
fn plain_flex_forward_equals_burns_module() {
    for (i, &c) in WIDTHS.iter().enumerate() {
        let x = randn([3, 37, c], 2.0, 60 + i as u64).inner();
        let ln = random_layer_norm(c, true, 70 + i as u64).valid();
        let y = layer_norm(x.clone(), ln.gamma.val(), ln.beta.as_ref().map(|b| b.val()), EPS);
        assert_close(&format!("layer_norm C={c}"), y, ln.forward(x.clone()), 1e-5, 0.1);
        let norm = random_rms_norm(c, 80 + i as u64).valid();
        assert_close(
            &format!("rms_norm C={c}"),
            rms_norm(x.clone(), norm.gamma.val(), EPS),
            norm.forward(x),
            1e-5,
            0.1,
        );
    }
}

/// LayerNorm in f64 from f32 inputs `[rows, c]`: `(y, dx, dγ, dβ)` for the upstream gradient `w`.
fn layer_norm_f64(x: &[f32], w: &[f32], gamma: &[f32], beta: &[f32], c: usize) -> [Vec<f64>; 4] {
    let (mut y, mut dx, mut dg, mut db) =
        (vec![0.0; x.len()], vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
    for (r, row) in x.chunks(c).enumerate() {
        let row: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        let mean = row.iter().sum::<f64>() / c as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / c as f64;
        let rstd = 1.0 / (var + EPS).sqrt();
        let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
        let dy = &w[r * c..(r + 1) * c];
        let dyhat: Vec<f64> = (0..c).map(|j| dy[j] as f64 * gamma[j] as f64).collect();
        let m1 = dyhat.iter().sum::<f64>() / c as f64;
        let m2 = (0..c).map(|j| dyhat[j] * xhat[j]).sum::<f64>() / c as f64;
        for j in 0..c {
            y[r * c + j] = xhat[j] * gamma[j] as f64 + beta[j] as f64;
            dx[r * c + j] = rstd * (dyhat[j] - m1 - xhat[j] * m2);
            dg[j] += dy[j] as f64 * xhat[j];
            db[j] += dy[j] as f64;
        }
    }
    [y, dx, dg, db]
}

fn tensor<const D: usize>(v: &[f64], shape: [usize; D]) -> Tensor<Flex, D> {
    let v: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    Tensor::from_data(TensorData::new(v, shape), &Default::default())
}

#[test]
fn layer_norm_is_accurate_for_a_large_mean() {
    // x = 1000 + N(0, 1): E[x²] − E[x]² would lose every digit of the variance in f32. The
    // inputs are f32 (spaced 6e-5 around 1000), the reference is f64 from those same inputs.
    let c = 384;
    let ln = random_layer_norm(c, true, 5);
    let x = randn([3, 37, c], 1.0, 6) + 1000.0;
    let w = randn([3, 37, c], 1.0, 7);
    // Burn's composed ops take the mean as an f32 sum of 384 values near 1000 (partial sums up
    // to 4·10⁵, ulp 0.03), off by ~2e-4, which shifts every x̂ of the row by as much: the same
    // values only to that accuracy (2e-4 absolute where |y| < 0.1).
    check_layer_norm(&ln, x.clone(), 2e-3, "mean 1000");
    let (gamma, beta) = (ln.gamma.val(), ln.beta.as_ref().unwrap().val());
    let [y, dx, dg, db] = layer_norm_f64(
        &values(x.clone()),
        &values(w.clone()),
        &values(gamma.clone()),
        &values(beta.clone()),
        c,
    );
    let xf = x.clone().require_grad();
    let yf = layer_norm(xf.clone(), gamma.clone(), Some(beta.clone()), EPS);
    assert_close("y", yf.clone().inner(), tensor(&y, [3, 37, c]), 1e-5, 0.1);
    let grads = (yf * w).sum().backward();
    assert_close("dx", xf.grad(&grads).unwrap(), tensor(&dx, [3, 37, c]), 1e-5, 0.1);
    assert_close("dgamma", gamma.grad(&grads).unwrap(), tensor(&dg, [c]), 1e-5, 1.0);
    assert_close("dbeta", beta.grad(&grads).unwrap(), tensor(&db, [c]), 1e-5, 1.0);
}

#[test]
fn norms_hand_computed() {
    // x = [1, 2, 3, 4]: mean 2.5, var 1.25, rstd = 1/√1.25001; γ = [1, 2, 3, 4],
    // β = [0.5, 0, 0, −0.5]; dy = [1, 0, 0, 0]. Values from f64 (checked by central differences).
    let dev = Default::default();
    let x = Tensor::<Ad, 2>::from_floats([[1.0, 2.0, 3.0, 4.0]], &dev).require_grad();
    let gamma = Tensor::<Ad, 1>::from_floats([1.0, 2.0, 3.0, 4.0], &dev).require_grad();
    let beta = Tensor::<Ad, 1>::from_floats([0.5, 0.0, 0.0, -0.5], &dev).require_grad();
    let dy = Tensor::<Ad, 2>::from_floats([[1.0, 0.0, 0.0, 0.0]], &dev);
    let near = |what: &str, got: Vec<f32>, want: [f64; 4]| {
        for (g, w) in got.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{what}: {got:?} vs {want:?}");
        }
    };
    let y = layer_norm(x.clone(), gamma.clone(), Some(beta.clone()), EPS);
    near("layer_norm y", values(y.clone()), [-0.841_635_42, -0.894_423_61, 1.341_635_42, 4.866_541_68]);
    let grads = (y * dy.clone()).sum().backward();
    near(
        "layer_norm dx",
        values(x.grad(&grads).unwrap()),
        [0.268_330_30, -0.357_768_37, -0.089_443_43, 0.178_881_50],
    );
    near("layer_norm dgamma", values(gamma.grad(&grads).unwrap()), [-1.341_635_42, 0.0, 0.0, 0.0]);
    near("layer_norm dbeta", values(beta.grad(&grads).unwrap()), [1.0, 0.0, 0.0, 0.0]);

    let y = rms_norm(x.clone(), gamma.clone(), EPS); // rstd = 1/√7.50001
    near("rms_norm y", values(y.clone()), [0.365_148_13, 1.460_592_51, 3.286_333_15, 5.842_370_05]);
    let grads = (y * dy).sum().backward();
    near(
        "rms_norm dx",
        values(x.grad(&grads).unwrap()),
        [0.352_976_54, -0.024_343_18, -0.036_514_76, -0.048_686_35],
    );
    near("rms_norm dgamma", values(gamma.grad(&grads).unwrap()), [0.365_148_13, 0.0, 0.0, 0.0]);
}

#[test]
fn gradients_reach_only_inputs_that_require_them() {
    let c = 7;
    let x = randn([4, c], 1.0, 1);
    let gamma = randn([c], 1.0, 2);
    // A constant γ (no grad) and no β: only x gets a gradient.
    let xg = x.clone().require_grad();
    let grads = layer_norm(xg.clone(), gamma.clone(), None, EPS).sum().backward();
    assert!(xg.grad(&grads).is_some() && gamma.grad(&grads).is_none());
    // A constant x: only γ and β get gradients (dβ = Σ rows of dy = 4).
    let (gg, bg) = (gamma.clone().require_grad(), randn([c], 1.0, 3).require_grad());
    let grads = layer_norm(x.clone(), gg.clone(), Some(bg.clone()), EPS).sum().backward();
    assert!(gg.grad(&grads).is_some());
    assert_eq!(values(bg.grad(&grads).unwrap()), vec![4.0; c]);
    let grads = rms_norm(x.clone(), gg.clone(), EPS).sum().backward();
    assert!(gg.grad(&grads).is_some() && x.grad(&grads).is_none());
    // The same parameter leaves through two graphs in turn (micro-batches, or steps): the
    // same gradients each time.
    let twice = [0, 1].map(|_| {
        let grads = layer_norm(x.clone(), gg.clone(), Some(bg.clone()), EPS).sum().backward();
        values(gg.grad(&grads).unwrap())
    });
    assert_eq!(twice[0], twice[1]);
    // Nothing requires grad: an untracked forward, same values.
    let untracked = rms_norm(x.clone(), gamma.clone(), EPS).inner();
    assert_close("untracked", untracked, rms_norm(x.inner(), gamma.inner(), EPS), 0.0, 1.0);
}

#[test]
fn non_contiguous_input_is_normalized_by_rows() {
    let c = 45;
    let ln = random_layer_norm(c, true, 8);
    let x = randn([c, 3, 19], 1.0, 9).swap_dims(0, 2); // [19, 3, 45], strided
    check_layer_norm(&ln, x, 1e-5, "transposed");
}

#[test]
fn parameter_gradients_do_not_depend_on_the_thread_count() {
    // 512 rows of 384: 7 backward chunks of 85 rows, so 1 and 2 threads split them differently.
    let c = 384;
    let x = randn([8, 64, c], 1.0, 11);
    let w = randn([8, 64, c], 1.0, 12);
    let ln = random_layer_norm(c, true, 13);
    let norm = random_rms_norm(c, 14);
    let run = || {
        let (gamma, beta) = (ln.gamma.val(), ln.beta.as_ref().unwrap().val());
        let xg = x.clone().require_grad();
        let y = layer_norm(xg.clone(), gamma.clone(), Some(beta.clone()), EPS);
        let grads = (y.clone() * w.clone()).sum().backward();
        let ln_out = [
            values(y),
            values(xg.grad(&grads).unwrap()),
            values(gamma.grad(&grads).unwrap()),
            values(beta.grad(&grads).unwrap()),
        ];
        let g = norm.gamma.val();
        let xg = x.clone().require_grad();
        let y = rms_norm(xg.clone(), g.clone(), EPS);
        let grads = (y.clone() * w.clone()).sum().backward();
        (ln_out, [values(y), values(xg.grad(&grads).unwrap()), values(g.grad(&grads).unwrap())])
    };
    let in_pool =
        |threads| rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap().install(run);
    let (one, two) = (in_pool(1), in_pool(2));
    let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (i, (a, b)) in one.0.iter().zip(&two.0).enumerate() {
        assert!(bits(a) == bits(b), "layer_norm output {i} differs between 1 and 2 threads");
    }
    for (i, (a, b)) in one.1.iter().zip(&two.1).enumerate() {
        assert!(bits(a) == bits(b), "rms_norm output {i} differs between 1 and 2 threads");
    }
}

/// The Flex kernel and the composed ops agree directly (no autodiff), backward included.
#[test]
fn flex_backward_equals_the_composed_backward() {
    use super::{composed, FusedNorm};
    let c = 100;
    let x = randn([5, 7, c], 1.5, 15).inner().into_primitive().tensor();
    let dy = randn([5, 7, c], 1.0, 16).inner().into_primitive().tensor();
    let gamma = randn([c], 1.0, 17).inner().into_primitive().tensor();
    let t = |p| Tensor::<Flex, 1>::from_primitive(burn::tensor::TensorPrimitive::Float(p)).reshape([-1]);
    let (_, mean, rstd) = Flex::fused_layer_norm_forward(x.clone(), gamma.clone(), None, EPS);
    let (_, mean_c, rstd_c) = composed::layer_norm_forward::<Flex>(x.clone(), gamma.clone(), None, EPS);
    assert_close("mean", t(mean.clone()), t(mean_c), 1e-5, 1e-2);
    assert_close("rstd", t(rstd.clone()), t(rstd_c), 1e-5, 1e-2);
    let fused =
        Flex::fused_layer_norm_backward(dy.clone(), x.clone(), gamma.clone(), mean.clone(), rstd.clone());
    let reference = composed::layer_norm_backward::<Flex>(dy.clone(), x.clone(), gamma.clone(), mean, rstd);
    assert_close("dx", t(fused.0), t(reference.0), 1e-5, 0.1);
    assert_close("dgamma", t(fused.1), t(reference.1), 1e-5, 1.0);
    assert_close("dbeta", t(fused.2), t(reference.2), 1e-5, 1.0);
    let (_, rstd) = Flex::fused_rms_norm_forward(x.clone(), gamma.clone(), EPS);
    let fused = Flex::fused_rms_norm_backward(dy.clone(), x.clone(), gamma.clone(), rstd.clone());
    let reference = composed::rms_norm_backward::<Flex>(dy, x, gamma, rstd);
    assert_close("rms dx", t(fused.0), t(reference.0), 1e-5, 0.1);
    assert_close("rms dgamma", t(fused.1), t(reference.1), 1e-5, 1.0);
}
