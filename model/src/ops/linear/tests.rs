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
