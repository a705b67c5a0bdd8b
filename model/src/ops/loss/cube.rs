//! Cross-entropy with `ignore_index` as CubeCL kernels: one cube per row. The forward finds the
//! row's max and `log Σ exp(x − max)` in one pass over the logits (each unit keeps a running
//! max and a rescaled sum, Milakov & Gimelshein 2018, "Online normalizer calculation for
//! softmax"; the cube then combines them), the backward writes `grad·(softmax − onehot)` once;
//! no `[N, V]` intermediate exists besides `dlogits` itself. Formulas in the parent module.

use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::FusedCrossEntropy;
use crate::ops::cube::fusion::custom_op;
use crate::ops::cube::{block_max, block_sum, contiguous, cube_index, empty, grid, two, ROW_THREADS};

/// A finite stand-in for `−∞` (WGSL has no infinite literals).
const NEG_BIG: f32 = -3.0e38;

/// Per row: `nll[row] = lse − x[target]` (0 for an ignored row, +inf for a target outside
/// `0..V`), `stats[row] = (max, log Σ exp(x − max))`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn cross_entropy_forward_kernel<F: Float, I: Int>(
    logits: &Array<F>,
    targets: &Array<I>,
    nll: &mut Array<f32>,
    stats: &mut Array<f32>,
    rows: usize,
    vocab: usize,
    ignore_index: i32,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let row = cube_index();
    if row >= rows {
        terminate!();
    }
    let mut shared = SharedMemory::<f32>::new(ROW_THREADS as usize);
    let base = row * vocab;
    let mut m = f32::new(NEG_BIG);
    let mut s = f32::new(0.0);
    let mut c = UNIT_POS as usize;
    while c < vocab {
        let x = f32::cast_from(logits[base + c]);
        if x > m {
            s = s * f32::exp(m - x) + f32::new(1.0);
            m = x;
        } else {
            s += f32::exp(x - m);
        }
        c += CUBE_DIM as usize;
    }
    let max = block_max(m, &mut shared);
    let log_sum = f32::ln(block_sum(s * f32::exp(m - max), &mut shared));
    if UNIT_POS == 0 {
        let target = i32::cast_from(targets[row]);
        let mut loss = f32::new(0.0);
        if target != ignore_index {
            if target >= 0 && (target as usize) < vocab {
                loss = max + log_sum - f32::cast_from(logits[base + target as usize]);
            } else {
                // +inf by overflow of a runtime value (a constant NaN or inf is a WGSL
                // shader-creation error, and the whole kernel would not run).
                loss = f32::exp(f32::new(1000.0) * f32::cast_from(vocab));
            }
        }
        nll[row] = loss;
        stats[2 * row] = max;
        stats[2 * row + 1] = log_sum;
    }
}

/// `dlogits[row, c] = grad·(exp((x − max) − log Σ) − [c = target])`, 0 on ignored rows.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn cross_entropy_backward_kernel<F: Float, I: Int>(
    logits: &Array<F>,
    targets: &Array<I>,
    stats: &Array<f32>,
    grad: &Array<f32>,
    dlogits: &mut Array<F>,
    rows: usize,
    vocab: usize,
    ignore_index: i32,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let row = cube_index();
    if row >= rows {
        terminate!();
    }
    let base = row * vocab;
    let target = i32::cast_from(targets[row]);
    let scored = target != ignore_index;
    let g = grad[0];
    let (max, log_sum) = (stats[2 * row], stats[2 * row + 1]);
    let mut c = UNIT_POS as usize;
    while c < vocab {
        let mut d = f32::new(0.0);
        if scored {
            d = f32::exp(f32::cast_from(logits[base + c]) - max - log_sum);
            if c as i32 == target {
                d -= f32::new(1.0);
            }
            d *= g;
        }
        dlogits[base + c] = F::cast_from(d);
        c += CUBE_DIM as usize;
    }
}

/// `ignore_index` as the kernels compare it: an index outside i32 never equals an i32 target.
fn ignore_i32(ignore_index: i64) -> i32 {
    i32::try_from(ignore_index).unwrap_or(i32::MIN)
}

/// The kernels above for every CubeCL runtime (CUDA, HIP, wgpu). A scored target outside
/// `0..V` makes the sum +inf (a kernel cannot panic; the stability sentinel then stops the
/// run) rather than the Flex kernel's panic.
impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> FusedCrossEntropy
    for CubeBackend<R, F, I, BT>
{
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        ignore_index: i64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (logits, targets) = (contiguous(logits), contiguous(targets));
        let [rows, vocab] = logits.shape().dims::<2>();
        let nll = empty(&logits, Shape::from(vec![rows]), DType::F32);
        let stats = empty(&logits, Shape::from(vec![rows, 2]), DType::F32);
        cross_entropy_forward_kernel::launch::<R>(
            &logits.client,
            grid(rows),
            CubeDim::new_1d(ROW_THREADS),
            logits.clone().into_array_arg(),
            targets.clone().into_array_arg(),
            nll.clone().into_array_arg(),
            stats.clone().into_array_arg(),
            rows,
            vocab,
            ignore_i32(ignore_index),
            [logits.dtype.into(), targets.dtype.into()],
        );
        let sum = Self::float_reshape(Self::float_sum(nll), Shape::from(vec![1]));
        (sum, stats)
    }

    fn fused_cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        stats: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        ignore_index: i64,
    ) -> FloatTensor<Self> {
        let (logits, targets, stats) = (contiguous(logits), contiguous(targets), contiguous(stats));
        let grad = contiguous(Self::float_cast(grad, DType::F32.into()));
        let [rows, vocab] = logits.shape().dims::<2>();
        let dlogits = empty(&logits, logits.shape(), logits.dtype);
        cross_entropy_backward_kernel::launch::<R>(
            &logits.client,
            grid(rows),
            CubeDim::new_1d(ROW_THREADS),
            logits.clone().into_array_arg(),
            targets.clone().into_array_arg(),
            stats.into_array_arg(),
            grad.into_array_arg(),
            dlogits.clone().into_array_arg(),
            rows,
            vocab,
            ignore_i32(ignore_index),
            [logits.dtype.into(), targets.dtype.into()],
        );
        dlogits
    }
}

/// Burn's fusion backend over a backend with these kernels: one custom operation per call.
impl<B: FusionBackend + FusedCrossEntropy> FusedCrossEntropy for Fusion<B> {
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        ignore_index: i64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let rows = logits.shape.to_vec()[0];
        let out = vec![(Shape::from(vec![1]), DType::F32), (Shape::from(vec![rows, 2]), DType::F32)];
        let [sum, stats] = two(custom_op::<B>("cross_entropy", vec![logits, targets], out, move |i| {
            let (sum, stats) = B::fused_cross_entropy(i.float(0), i.int(1), ignore_index);
            vec![sum, stats]
        }));
        (sum, stats)
    }

    fn fused_cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        stats: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        ignore_index: i64,
    ) -> FloatTensor<Self> {
        let out = vec![(logits.shape.clone(), logits.dtype)];
        let inputs = vec![logits, targets, stats, grad];
        custom_op::<B>("cross_entropy_backward", inputs, out, move |i| {
            vec![B::fused_cross_entropy_backward(i.float(0), i.int(1), i.float(2), i.float(3), ignore_index)]
        })
        .remove(0)
    }
}
