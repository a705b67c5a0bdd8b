//! The fused matmul equals Burn's: values and both gradients, for plain and transposed weights.

use burn::backend::Flex;
use burn::tensor::Tensor;

use crate::ops::linear::matmul;
use crate::ops::testing::{assert_close, randn, Ad};

/// `(y, dx, dw)` of `Σ (x·w) ⊙ r` through `f`.
fn run(
    f: impl Fn(Tensor<Ad, 2>, Tensor<Ad, 2>) -> Tensor<Ad, 2>,
    x: Tensor<Ad, 2>,
    w: Tensor<Ad, 2>,
    r: Tensor<Ad, 2>,
    transpose_w: bool,
) -> (Tensor<Flex, 2>, Tensor<Flex, 2>, Tensor<Flex, 2>) {
    let (x, w) = (x.require_grad(), w.require_grad());
    let wv = if transpose_w { w.clone().transpose() } else { w.clone() };
    let y = f(x.clone(), wv);
    let grads = (y.clone() * r).sum().backward();
    (y.inner(), x.grad(&grads).unwrap(), w.grad(&grads).unwrap())
}

fn check(n: usize, k: usize, m: usize, transpose_w: bool, seed: u64) {
    let x = randn([n, k], 1.0, seed);
    let w = if transpose_w { randn([m, k], 0.5, seed + 1) } else { randn([k, m], 0.5, seed + 1) };
    let r = randn([n, m], 1.0, seed + 2);
    let (y, dx, dw) = run(matmul, x.clone(), w.clone(), r.clone(), transpose_w);
    let (y0, dx0, dw0) = run(|a, b| a.matmul(b), x, w, r, transpose_w);
    let what = format!("[{n}, {k}]·[{k}, {m}] transposed {transpose_w}");
    // Sums of k products of O(1) terms: rounding is absolute, relative to their RMS (~1).
    assert_close(&format!("y {what}"), y, y0, 1e-5, 1.0);
    assert_close(&format!("dx {what}"), dx, dx0, 1e-5, 1.0);
    assert_close(&format!("dw {what}"), dw, dw0, 1e-5, 1.0);
}

#[test]
fn matmul_and_gradients_equal_burns() {
    check(37, 23, 41, false, 1);
    check(37, 23, 41, true, 4);
    // Large enough for the multi-threaded gemm.
    check(300, 200, 190, false, 7);
    check(300, 200, 190, true, 10);
    check(1, 5, 1, false, 13);
}

#[test]
fn hand_computed() {
    let device = Default::default();
    let x = Tensor::<Ad, 2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &device);
    let w = Tensor::<Ad, 2>::from_floats([[5.0, 6.0], [7.0, 8.0]], &device);
    let y = matmul(x, w).into_data().to_vec::<f32>().unwrap();
    assert_eq!(y, vec![19.0, 22.0, 43.0, 50.0]);
    // k = 0: an empty sum is 0.
    let x = Tensor::<Ad, 2>::zeros([2, 0], &device);
    let w = Tensor::<Ad, 2>::zeros([0, 3], &device);
    assert_eq!(matmul(x, w).into_data().to_vec::<f32>().unwrap(), vec![0.0; 6]);
}

/// `dy·wᵀ` reads a row-major copy of `wᵀ` (built in parallel, 16 rows per task, in 8 × 8
/// register blocks with AVX2): both paths equal Burn's transpose exactly, for sizes that leave
/// partial tasks and blocks, and for a strided view.
#[test]
fn transposed_copy_is_the_transpose() {
    use super::transpose::transposed_with;
    let paths = if crate::ops::simd::wide_instructions().is_some() { vec![false, true] } else { vec![false] };
    let check = |w: Tensor<burn::backend::Flex, 2>, what: &str| {
        let t = w.clone().into_primitive().tensor();
        let (layout, data) = (t.layout(), t.storage::<f32>());
        let [rows, cols] = [layout.shape()[0], layout.shape()[1]];
        let src = &data[layout.start_offset()..];
        let want = w.transpose().into_data().to_vec::<f32>().unwrap();
        for &blocks in &paths {
            assert_eq!(
                transposed_with(src, rows, cols, layout.strides()[0] as usize, blocks),
                want,
                "{what}, blocks {blocks}"
            );
        }
    };
    for (rows, cols) in [(203, 197), (16, 16), (1, 33), (40, 1), (24, 40), (64, 48), (9, 8), (8, 17)] {
        check(randn([rows, cols], 1.0, 20).inner(), &format!("[{rows}, {cols}]"));
    }
    // Columns 3..35 of a [30, 50] matrix: row stride 50, offset 3.
    check(randn([30, 50], 1.0, 21).inner().slice([0..30, 3..35]), "a strided view");
}

/// The products and both gradients are the same bits on any thread count (gemm's parts per
/// thread change with it), and the backward's side-by-side products equal the two computed
/// one after the other. [300, 200]·[200, 190] is large enough for the multi-threaded gemm.
#[test]
fn same_bits_on_any_thread_count_and_side_by_side() {
    use super::FusedMatmul;
    let bits = |t: Tensor<Flex, 2>| -> Vec<u32> {
        t.into_data().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    };
    let (x, w, r) = (randn([300, 200], 1.0, 30), randn([200, 190], 0.5, 31), randn([300, 190], 1.0, 32));
    let run_in = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let (y, dx, dw) = pool.install(|| run(matmul, x.clone(), w.clone(), r.clone(), false));
        (bits(y), bits(dx), bits(dw))
    };
    let one = run_in(1);
    for threads in [2, 3] {
        assert!(run_in(threads) == one, "{threads} threads differ from 1");
    }

    let prim = |t: Tensor<Ad, 2>| t.inner().into_primitive().tensor();
    let (x, w, dy) = (prim(x), prim(w), prim(r));
    let (dx, dw) = Flex::fused_matmul_backward(x.clone(), w.clone(), dy.clone(), true, true);
    let (dx, dw) = (dx.expect("dx was asked for"), dw.expect("dw was asked for"));
    let alone_dw = Flex::fused_matmul_dw(x, dy.clone(), &w);
    let alone_dx = Flex::fused_matmul_dx(dy, w);
    let tensor = |p| Tensor::<Flex, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(p));
    assert_eq!(bits(tensor(dx)), bits(tensor(alone_dx)), "dx side by side");
    assert_eq!(bits(tensor(dw)), bits(tensor(alone_dw)), "dw side by side");
}

/// `Σ_l round(a[i, l])·round(b[l, j])` in f64, and `Σ |…|` (the scale of its rounding), for
/// row-major `a` `[m, k]` and `b` `[k, n]` with `round` = bfloat16 rounding.
fn bf16_reference(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    use crate::ops::linear::bf16::bf16_round;
    let (mut sum, mut scale) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for l in 0..k {
            let x = f64::from(bf16_round(a[i * k + l]));
            for j in 0..n {
                let p = x * f64::from(bf16_round(b[l * n + j]));
                sum[i * n + j] += p;
                scale[i * n + j] += p.abs();
            }
        }
    }
    (sum, scale)
}

/// The AVX512-BF16 kernel equals the f64 sum of the bf16-rounded operands' products to f32
/// rounding (2⁻²² of Σ|products|, for up to 1,025 terms), on shapes at and past every blocking
/// edge (register tiles of 12 × 32, k pairs and blocks of 256, column blocks of 1,024), through
/// transposed views and into a column-major destination, on 1 and 2 threads with the same bits.
#[test]
fn bf16_kernel_equals_the_rounded_operands_reference() {
    use crate::ops::linear::bf16::{available, gemm, View};
    if !available() {
        eprintln!("skipping: this CPU has no AVX512-BF16 (or EMBER_BF16_MATMUL=off)");
        return;
    }
    let shapes = [(1, 1, 1), (12, 2, 32), (13, 3, 33), (25, 257, 65), (97, 513, 70), (7, 31, 1025)];
    for (seed, &(m, k, n)) in shapes.iter().enumerate() {
        let a: Vec<f32> = randn([m, k], 1.0, 40 + seed as u64).into_data().to_vec().unwrap();
        let b: Vec<f32> = randn([k, n], 1.0, 50 + seed as u64).into_data().to_vec().unwrap();
        let (want, scale) = bf16_reference(&a, &b, m, k, n);
        // The same matrices through transposed copies read as transposed views.
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let views = [
            (
                View { ptr: a.as_ptr(), rs: k as isize, cs: 1 },
                View { ptr: b.as_ptr(), rs: n as isize, cs: 1 },
            ),
            (
                View { ptr: at.as_ptr(), rs: 1, cs: m as isize },
                View { ptr: bt.as_ptr(), rs: 1, cs: k as isize },
            ),
        ];
        let mut first: Option<Vec<f32>> = None;
        for (av, bv) in views {
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut c = vec![f32::NAN; m * n];
                // SAFETY: the views cover the vectors above.
                pool.install(|| unsafe { gemm(m, n, k, av, bv, &mut c) });
                for i in 0..m * n {
                    let err = (f64::from(c[i]) - want[i]).abs();
                    assert!(
                        err <= scale[i] * 2f64.powi(-22) + 1e-30,
                        "[{m}, {k}]·[{k}, {n}] element {i}: {} vs {} (scale {})",
                        c[i],
                        want[i],
                        scale[i]
                    );
                }
                match &first {
                    None => first = Some(c),
                    Some(f) => {
                        assert!(f.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()), "bits differ")
                    }
                }
            }
        }
    }
}

/// Under `bf16-mixed` on Flex, [`matmul`] runs the kernel with its own backward: the output,
/// `dx = bf16(dy)·bf16(w)ᵀ` and `dw = bf16(x)ᵀ·bf16(dy)` (a transposed weight's gradient in
/// its layout) equal the f64 references of the rounded operands; the cast path (Burn's bf16
/// product, rounded to bf16) is within bf16 rounding of them.
#[test]
fn bf16_mixed_matmul_runs_the_kernel_with_its_own_backward() {
    use crate::precision::{autocast, Precision};
    if !crate::ops::linear::bf16::available() {
        eprintln!("skipping: this CPU has no AVX512-BF16 (or EMBER_BF16_MATMUL=off)");
        return;
    }
    let (n, k, m) = (29, 45, 70);
    for transpose_w in [false, true] {
        let x = randn([n, k], 1.0, 61);
        let w = if transpose_w { randn([m, k], 0.5, 62) } else { randn([k, m], 0.5, 62) };
        let r = randn([n, m], 1.0, 63);
        let (y, dx, dw) =
            autocast(Precision::Bf16Mixed, || run(matmul, x.clone(), w.clone(), r.clone(), transpose_w));
        let host = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().unwrap();
        let (xs, rs) = (host(x.clone().inner()), host(r.inner()));
        let wkm = host(if transpose_w { w.clone().inner().transpose() } else { w.clone().inner() });
        let tr = |v: &[f32], rows: usize, cols: usize| -> Vec<f32> {
            (0..rows * cols).map(|i| v[(i % rows) * cols + i / rows]).collect()
        };
        let close = |what: &str, got: Vec<f32>, (want, scale): (Vec<f64>, Vec<f64>)| {
            for i in 0..got.len() {
                let err = (f64::from(got[i]) - want[i]).abs();
                assert!(err <= scale[i] * 2f64.powi(-22) + 1e-30, "{what} {i}: {} vs {}", got[i], want[i]);
            }
        };
        close("y", host(y), bf16_reference(&xs, &wkm, n, k, m));
        close("dx", host(dx), bf16_reference(&rs, &tr(&wkm, k, m), n, m, k));
        let dw_km = bf16_reference(&tr(&xs, n, k), &rs, k, n, m);
        let dw = host(dw);
        let dw = if transpose_w { tr(&dw, m, k) } else { dw };
        close("dw", dw, dw_km);
    }
}
