//! The fused cross-entropy equals the composed reference (log-softmax, gather, mask): values
//! and logit gradients, ignored rows, extreme logits, determinism, the in-place backward.

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};

use super::{composed, cross_entropy_sum, FusedCrossEntropy};
use crate::ops::testing::{assert_close, randn, Ad};

const IGNORE: i64 = -100;

/// The reference: `Σ −log_softmax(x)[t]` over scored rows, from Burn's ops on any backend.
fn reference<B: Backend>(x: Tensor<B, 2>, t: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let [n, _] = x.dims();
    let t = t.reshape([n, 1]);
    let ignored = t.clone().equal_elem(IGNORE);
    let safe = t.mask_fill(ignored.clone(), 0);
    log_softmax(x, 1).gather(1, safe).mask_fill(ignored, 0.0).sum().neg()
}

/// Targets for `n` rows of a `v`-way vocabulary: pseudo-random ids, every `ignore_every`-th
/// row (if any) ignored.
fn targets<B: Backend>(n: usize, v: usize, ignore_every: Option<usize>) -> Tensor<B, 1, Int> {
    let t: Vec<i64> = (0..n)
        .map(|i| match ignore_every {
            Some(k) if i % k == k - 1 => IGNORE,
            _ => ((i * 7919 + 13) % v) as i64,
        })
        .collect();
    Tensor::from_data(TensorData::new(t, [n]), &Default::default())
}

fn scored(t: &Tensor<Ad, 1, Int>) -> usize {
    t.clone().into_data().convert::<i64>().to_vec::<i64>().unwrap().iter().filter(|&&t| t != IGNORE).count()
}

/// Value and `d(loss · w)/dlogits` of the fused op and the reference, `w` = 1/scored (the
/// trainer's mean), compared within 1e-5 relative.
fn check(n: usize, v: usize, std: f64, ignore_every: Option<usize>, seed: u64) {
    let x = randn([n, v], std, seed);
    let t = targets::<Ad>(n, v, ignore_every);
    let w = 1.0 / scored(&t).max(1) as f32;
    let (xf, xr) = (x.clone().require_grad(), x.clone().require_grad());
    let lf = cross_entropy_sum(xf.clone(), t.clone(), IGNORE);
    let lr = reference(xr.clone(), t.clone());
    let what = format!("N={n} V={v}");
    // The total is a sum of positive terms: 1e-5 relative with no special floor.
    assert_close(&format!("loss {what}"), lf.clone(), lr.clone(), 1e-5, 1e-3);
    let gf = (lf * w).backward();
    let gr = (lr * w).backward();
    // Gradients are w·(p − onehot): entries below w·1e-2 are compared with absolute error
    // 1e-5·w·1e-2, the f32 rounding of p − 1 near p ≈ 1 on either side.
    assert_close(&format!("dlogits {what}"), xf.grad(&gf).unwrap(), xr.grad(&gr).unwrap(), 1e-5, w * 1e-2);
    // The Flex kernel itself, without autodiff.
    let inner = cross_entropy_sum(x.clone().inner(), t.clone().inner(), IGNORE);
    assert_close(&format!("loss (inner) {what}"), inner, reference(x.inner(), t.inner()), 1e-5, 1e-3);
}

#[test]
fn cross_entropy_equals_the_composed_reference_small_vocab() {
    // Many rows per task, V not a multiple of the 16 lanes, several tasks.
    check(37, 66, 2.0, Some(5), 1);
    check(1000, 66, 3.0, Some(3), 2);
    check(3, 17, 1.0, None, 3);
}

#[test]
fn cross_entropy_equals_the_composed_reference_large_vocab() {
    check(5, 50304, 2.0, Some(4), 4);
}

#[test]
fn vocab_of_one_costs_nothing() {
    // log softmax of a single logit is 0: loss 0, gradient 0.
    check(7, 1, 1.0, Some(2), 5);
    let x = randn([7, 1], 1.0, 5).require_grad();
    let l = cross_entropy_sum(x.clone(), targets::<Ad>(7, 1, None), IGNORE);
    assert_eq!(l.clone().into_scalar(), 0.0);
    let g = x.grad(&l.backward()).unwrap().into_data().to_vec::<f32>().unwrap();
    assert!(g.iter().all(|&g| g == 0.0), "{g:?}");
}

#[test]
fn all_rows_ignored_give_zero_loss_and_zero_gradient() {
    for v in [66, 50304] {
        let x = randn([4, v], 1.0, 6).require_grad();
        let t = Tensor::<Ad, 1, Int>::from_data(TensorData::new(vec![IGNORE; 4], [4]), &Default::default());
        let l = cross_entropy_sum(x.clone(), t, IGNORE);
        assert_eq!(l.clone().into_scalar(), 0.0);
        let g = x.grad(&l.backward()).unwrap().into_data().to_vec::<f32>().unwrap();
        assert!(g.iter().all(|&g| g == 0.0), "V={v}: non-zero or NaN gradient");
    }
}

#[test]
fn hand_computed_values() {
    // logits [0, ln 3]: p = [1/4, 3/4]. Targets 1 and 0: −ln(3/4) − ln(1/4) = ln(16/3); the
    // gradient is p − onehot: [1/4, −1/4] and [−3/4, 3/4].
    let ln3 = 3f32.ln();
    let x = Tensor::<Ad, 2>::from_data(
        TensorData::new(vec![0.0, ln3, 0.0, ln3, 5.0, 1.0], [3, 2]),
        &Default::default(),
    )
    .require_grad();
    let t = Tensor::<Ad, 1, Int>::from_data(TensorData::new(vec![1i64, 0, IGNORE], [3]), &Default::default());
    let l = cross_entropy_sum(x.clone(), t, IGNORE);
    assert!((l.clone().into_scalar() - (16f32 / 3.0).ln()).abs() < 1e-6);
    let g = x.grad(&l.backward()).unwrap().into_data().to_vec::<f32>().unwrap();
    let want = [0.25, -0.25, -0.75, 0.75, 0.0, 0.0];
    assert!(g.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6), "{g:?}");
}

#[test]
fn extreme_logits_do_not_overflow() {
    // Row 0: [1e4, −1e4, 0], target 0 → loss ≈ 0 (e^{−1e4} underflows); target 1 → 2·10⁴;
    // row 2 all equal 1e4 → ln 3.
    let x = Tensor::<Ad, 2>::from_data(
        TensorData::new(vec![1e4, -1e4, 0.0, 1e4, -1e4, 0.0, 1e4, 1e4, 1e4], [3, 3]),
        &Default::default(),
    )
    .require_grad();
    let t = Tensor::<Ad, 1, Int>::from_data(TensorData::new(vec![0i64, 1, 2], [3]), &Default::default());
    let l = cross_entropy_sum(x.clone(), t.clone(), IGNORE);
    let want = 2e4 + 3f32.ln();
    assert!((l.clone().into_scalar() - want).abs() <= 1e-6 * want, "{}", l.clone().into_scalar());
    let lr = reference(x.clone(), t);
    assert_close("extreme loss", l.clone(), lr, 1e-6, 1.0);
    let g = x.grad(&l.backward()).unwrap().into_data().to_vec::<f32>().unwrap();
    let want = [0.0, 0.0, 0.0, 1.0, -1.0, 0.0, 1.0 / 3.0, 1.0 / 3.0, -2.0 / 3.0];
    assert!(g.iter().zip(want).all(|(g, w)| g.is_finite() && (g - w).abs() < 1e-6), "{g:?}");
}

#[test]
fn gradient_scales_with_the_upstream_factor() {
    let x = randn([37, 66], 2.0, 7);
    let t = targets::<Ad>(37, 66, Some(4));
    let xa = x.clone().require_grad();
    let ga = xa.grad(&cross_entropy_sum(xa.clone(), t.clone(), IGNORE).backward()).unwrap();
    let xb = x.require_grad();
    let gb = xb.grad(&(cross_entropy_sum(xb.clone(), t, IGNORE) * 0.125).backward()).unwrap();
    // A power of two: exactly proportional.
    assert_eq!(gb.into_data().to_vec::<f32>().unwrap(), (ga * 0.125).into_data().to_vec::<f32>().unwrap());
}

#[test]
fn result_does_not_depend_on_the_thread_count() {
    let run = |threads: usize, n: usize, v: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let x = randn([n, v], 3.0, 8).require_grad();
            let l = cross_entropy_sum(x.clone(), targets::<Ad>(n, v, Some(3)), IGNORE);
            let value = l.clone().into_scalar();
            (value.to_bits(), x.grad(&l.backward()).unwrap().into_data().to_vec::<f32>().unwrap())
        })
    };
    for (n, v) in [(2000, 66), (9, 50304)] {
        let one = run(1, n, v);
        assert_eq!(one, run(2, n, v), "N={n} V={v}: 1 vs 2 threads");
        assert_eq!(one, run(7, n, v), "N={n} V={v}: 1 vs 7 threads");
    }
}

#[test]
fn backward_writes_into_unshared_logits() {
    let (n, v) = (6, 300);
    let x = randn([n, v], 2.0, 9).inner();
    let t = targets::<Flex>(n, v, Some(3));
    let (sum, stats) =
        Flex::fused_cross_entropy(x.clone().into_primitive().tensor(), t.clone().into_primitive(), IGNORE);
    let grad = Tensor::<Flex, 1>::from_floats([0.5], &Default::default()).into_primitive().tensor();
    let shared = Flex::fused_cross_entropy_backward(
        x.clone().into_primitive().tensor(),
        t.clone().into_primitive(),
        stats.clone(),
        grad.clone(),
        IGNORE,
    );
    // A copy of x that nothing else holds: the gradient is written over it.
    let own = (x.clone() * 1.0).into_primitive().tensor();
    let ptr = own.bytes().as_ptr();
    let unshared = Flex::fused_cross_entropy_backward(own, t.into_primitive(), stats, grad, IGNORE);
    assert_eq!(unshared.bytes().as_ptr(), ptr, "the backward allocated instead of reusing the logits");
    let wrap = |p| Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(p));
    assert_eq!(wrap(shared).into_data(), wrap(unshared).into_data());
    let _ = sum;
    // x itself is untouched by the backward that shared it.
    assert_eq!(x.into_data(), randn([n, v], 2.0, 9).inner().into_data());
}

#[test]
fn int32_and_int64_targets_agree() {
    let x = randn([11, 66], 1.0, 10).inner();
    let t32 = targets::<Flex>(11, 66, Some(4)).cast(DType::I32);
    let t64 = t32.clone().cast(DType::I64);
    assert_eq!(t64.dtype(), DType::I64);
    let a = cross_entropy_sum(x.clone(), t64, IGNORE).into_scalar();
    let b = cross_entropy_sum(x, t32, IGNORE).into_scalar();
    assert_eq!(a.to_bits(), b.to_bits());
}

#[test]
fn bf16_logits_are_computed_in_f32() {
    let x = randn([9, 66], 2.0, 11).cast(DType::BF16);
    let t = targets::<Ad>(9, 66, Some(4));
    let xf = x.clone().require_grad();
    let l = cross_entropy_sum(xf.clone(), t.clone(), IGNORE);
    assert_eq!(l.dtype(), DType::F32);
    let want = reference(x.cast(DType::F32), t);
    assert_close("bf16 loss", l.clone(), want, 1e-5, 1e-3);
    assert_eq!(xf.grad(&l.backward()).unwrap().dtype(), DType::BF16);
}

#[test]
#[should_panic(expected = "outside 0..66")]
fn out_of_range_targets_panic() {
    let x = randn([2, 66], 1.0, 12).inner();
    let t = Tensor::<Flex, 1, Int>::from_data(TensorData::new(vec![3i64, 66], [2]), &Default::default());
    let _ = cross_entropy_sum(x, t, IGNORE).into_scalar();
}

#[test]
fn composed_default_and_fallback_equal_the_reference() {
    // The trait's generic default (what CUDA runs), called on Flex directly.
    let (n, v) = (37, 66);
    let x = randn([n, v], 2.0, 13).inner();
    let t = targets::<Flex>(n, v, Some(5));
    let (sum, stats) =
        composed::forward::<Flex>(x.clone().into_primitive().tensor(), t.clone().into_primitive(), IGNORE);
    let wrap1 = |p| Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(p));
    assert_close("composed loss", wrap1(sum), reference(x.clone(), t.clone()), 1e-5, 1e-3);
    let (_, stats_fused) =
        Flex::fused_cross_entropy(x.clone().into_primitive().tensor(), t.clone().into_primitive(), IGNORE);
    // Scored rows' statistics agree (the Flex kernel leaves ignored rows' at 0).
    let scored: Vec<f32> = t
        .clone()
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap()
        .iter()
        .map(|&t| if t == IGNORE { 0.0 } else { 1.0 })
        .collect();
    let scored = Tensor::<Flex, 1>::from_floats(scored.as_slice(), &Default::default()).reshape([n, 1]);
    let wrap2 = |p| Tensor::<Flex, 2>::from_primitive(TensorPrimitive::Float(p));
    let (stats, stats_fused) = (wrap2(stats) * scored.clone(), wrap2(stats_fused) * scored);
    assert_close("row statistics", stats.clone(), stats_fused.clone(), 1e-6, 1.0);
    let (stats, stats_fused) = (stats.into_primitive().tensor(), stats_fused.into_primitive().tensor());
    let g = Tensor::<Flex, 1>::from_floats([0.25], &Default::default()).into_primitive().tensor();
    let d_composed = composed::backward::<Flex>(
        x.clone().into_primitive().tensor(),
        t.clone().into_primitive(),
        stats,
        g.clone(),
        IGNORE,
    );
    let d_fused = Flex::fused_cross_entropy_backward(
        x.clone().into_primitive().tensor(),
        t.clone().into_primitive(),
        stats_fused,
        g,
        IGNORE,
    );
    assert_close("composed dlogits", wrap2(d_composed), wrap2(d_fused), 1e-5, 0.25 * 1e-2);

    // A backend outside the dispatch list (autodiff with checkpointing) takes the
    // differentiable composed path.
    type Bc = Autodiff<Flex, BalancedCheckpointing>;
    let xc = Tensor::<Bc, 2>::from_inner(x.clone()).require_grad();
    let tc = Tensor::<Bc, 1, Int>::from_inner(t.clone());
    let lc = cross_entropy_sum(xc.clone(), tc.clone(), IGNORE);
    let xr = Tensor::<Bc, 2>::from_inner(x).require_grad();
    let lr = reference(xr.clone(), tc);
    assert_close("fallback loss", lc.clone(), lr.clone(), 1e-5, 1e-3);
    let (gc, gr) = (lc.backward(), lr.backward());
    assert_close("fallback dlogits", xc.grad(&gc).unwrap(), xr.grad(&gr).unwrap(), 1e-5, 1e-2);
}
