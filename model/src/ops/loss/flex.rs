//! Cross-entropy on Flex's raw f32 buffers: rows split over rayon's threads (many rows per
//! task for a small vocabulary, one or a few for a large one), each row in two vectorized
//! passes (max, then Σ exp) forward and one pass backward.
//!
//! Deterministic: every row's value is computed by one task in a fixed order of lanes, and the
//! row losses are added in row order in f64 at the end, so the result does not depend on the
//! number of threads or how rows are split.

use std::borrow::Cow;

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, TensorMetadata};
use rayon::prelude::*;

use super::{composed, FusedCrossEntropy};
use crate::ops::flex::{contiguous_f32, from_vec, rows_per_task};
use crate::ops::simd::{exp, vectorized, Madd};

/// Elements per rayon task (at least; see [`rows_per_task`]).
const TASK_ELEMS: usize = 16 * 1024;
/// Independent accumulators per row pass: one AVX-512 register or two AVX2 ones.
const LANES: usize = 16;

/// The targets as i64 (borrowed when already contiguous i64); `None` for other int dtypes.
fn targets_i64(t: &FlexTensor) -> Option<Cow<'_, [i64]>> {
    match t.dtype() {
        DType::I64 => Some(match t.as_slice::<i64>() {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(t.to_contiguous().as_slice::<i64>().expect("contiguous i64").to_vec()),
        }),
        DType::I32 => {
            let c;
            let s = match t.as_slice::<i32>() {
                Some(s) => s,
                None => {
                    c = t.to_contiguous();
                    c.as_slice::<i32>().expect("contiguous i32")
                }
            };
            Some(Cow::Owned(s.iter().map(|&v| v as i64).collect()))
        }
        _ => None,
    }
}

/// The scored row's target as an index, or `None` for an ignored row.
///
/// # Panics
/// If a scored target is outside `0..vocab`.
#[inline(always)]
fn target_index(t: i64, ignore_index: i64, vocab: usize) -> Option<usize> {
    if t == ignore_index {
        return None;
    }
    assert!(
        (0..vocab as i64).contains(&t),
        "cross-entropy: target {t} is outside 0..{vocab} and is not the ignore index {ignore_index}"
    );
    Some(t as usize)
}

/// `max(x)`, NaN ignored (a NaN then makes the row's Σ exp NaN).
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] = if c[j] > acc[j] { c[j] } else { acc[j] };
        }
    }
    chunks.remainder().iter().chain(&acc).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// The row's `(m, log Σ exp(x − m))` with `m = max(x)`; `log Σ exp(x) = m + log Σ exp(x − m)`.
#[inline(always)]
fn row_stats(ma: Madd, x: &[f32]) -> (f32, f32) {
    let m = row_max(x);
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for j in 0..LANES {
            acc[j] += exp(ma, c[j] - m);
        }
    }
    let mut s = 0f32;
    for &v in chunks.remainder() {
        s += exp(ma, v - m);
    }
    (m, acc.iter().fold(s, |s, &a| s + a).ln())
}

impl FusedCrossEntropy for Flex {
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        ignore_index: i64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [n, v] = logits.shape().dims::<2>();
        let (Some(xs), Some(ts)) = (contiguous_f32(&logits), targets_i64(&targets)) else {
            return composed::forward::<Self>(logits, targets, ignore_index);
        };
        assert_eq!(ts.len(), n, "cross-entropy: {} targets for {n} rows", ts.len());
        if n == 0 {
            return (from_vec(vec![0.0], [1]), from_vec(Vec::new(), [0]));
        }
        assert!(v > 0, "cross-entropy: empty vocabulary");
        let rows = rows_per_task(n, v, TASK_ELEMS);
        // Per row: (m, log Σ exp(x − m)) and the row's loss (0 for an ignored row, whose
        // statistics are left 0).
        let (mut stats, mut loss) = (vec![0f32; 2 * n], vec![0f32; n]);
        stats
            .par_chunks_mut(2 * rows)
            .zip(loss.par_chunks_mut(rows))
            .zip(xs.par_chunks(rows * v).zip(ts.par_chunks(rows)))
            .for_each(|((stats, loss), (x, t))| {
                vectorized(
                    #[inline(always)]
                    |ma| {
                        for r in 0..loss.len() {
                            if let Some(t) = target_index(t[r], ignore_index, v) {
                                let row = &x[r * v..(r + 1) * v];
                                let (m, log_sum) = row_stats(ma, row);
                                (stats[2 * r], stats[2 * r + 1]) = (m, log_sum);
                                // −log softmax(x)[t] = log Σ exp(x − m) − (x[t] − m).
                                loss[r] = log_sum - (row[t] - m);
                            }
                        }
                    },
                )
            });
        let total: f64 = loss.iter().map(|&l| l as f64).sum();
        (from_vec(vec![total as f32], [1]), from_vec(stats, [n, 2]))
    }

    /// Writes into the logits' own buffer when nothing else holds it (under autodiff the
    /// logits are usually only kept for this backward), else into one new `[N, V]` buffer.
    fn fused_cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        stats: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        ignore_index: i64,
    ) -> FloatTensor<Self> {
        let [n, v] = logits.shape().dims::<2>();
        let (Some(ts), Some(ls), Some(g)) =
            (targets_i64(&targets), contiguous_f32(&stats), contiguous_f32(&grad))
        else {
            return composed::backward::<Self>(logits, targets, stats, grad, ignore_index);
        };
        if logits.dtype() != DType::F32 {
            return composed::backward::<Self>(logits, targets, stats, grad, ignore_index);
        }
        assert_eq!((ts.len(), ls.len(), g.len()), (n, 2 * n, 1), "cross-entropy backward: shapes");
        if n == 0 || v == 0 {
            return from_vec(Vec::new(), [n, v]);
        }
        let g = g[0];
        let rows = rows_per_task(n, v, TASK_ELEMS);
        let mut logits = logits;
        let offsets = logits.layout().contiguous_offsets();
        if let Some((start, end)) = offsets {
            if let Some(buf) = logits.try_storage_mut::<f32>() {
                let d = &mut buf[start..end];
                d.par_chunks_mut(rows * v).zip(ts.par_chunks(rows).zip(ls.par_chunks(2 * rows))).for_each(
                    |(d, (t, st))| {
                        vectorized(
                            #[inline(always)]
                            |ma| {
                                for (r, d) in d.chunks_exact_mut(v).enumerate() {
                                    grad_row_in_place(
                                        ma,
                                        d,
                                        target_index(t[r], ignore_index, v),
                                        st[2 * r],
                                        st[2 * r + 1],
                                        g,
                                    );
                                }
                            },
                        )
                    },
                );
                return logits;
            }
        }
        let xs = contiguous_f32(&logits).expect("f32 logits");
        // Zeroed pages from the allocator: each element is written once (ignored rows never).
        let mut out = vec![0f32; n * v];
        out.par_chunks_mut(rows * v)
            .zip(xs.par_chunks(rows * v))
            .zip(ts.par_chunks(rows).zip(ls.par_chunks(2 * rows)))
            .for_each(|((d, x), (t, st))| {
                vectorized(
                    #[inline(always)]
                    |ma| {
                        for (r, (d, x)) in d.chunks_exact_mut(v).zip(x.chunks_exact(v)).enumerate() {
                            // An ignored row stays as allocated: zeros.
                            if let Some(t) = target_index(t[r], ignore_index, v) {
                                grad_row(ma, x, d, t, st[2 * r], st[2 * r + 1], g);
                            }
                        }
                    },
                )
            });
        from_vec(out, [n, v])
    }
}

/// `d = g · (exp(x − m − log_sum) − onehot(t))` for a scored row with target `t`: the softmax
/// from the row's statistics, computed as `(x − m) − log_sum` like a log-softmax, so large
/// logits lose no precision to a rounded log-sum-exp.
#[inline(always)]
fn grad_row(ma: Madd, x: &[f32], d: &mut [f32], t: usize, m: f32, log_sum: f32, g: f32) {
    for (d, &x) in d.iter_mut().zip(x) {
        *d = g * exp(ma, (x - m) - log_sum);
    }
    d[t] = g * (exp(ma, (x[t] - m) - log_sum) - 1.0);
}

/// [`grad_row`] with `d` holding `x` on entry; an ignored row (`t` `None`) becomes 0.
#[inline(always)]
fn grad_row_in_place(ma: Madd, d: &mut [f32], t: Option<usize>, m: f32, log_sum: f32, g: f32) {
    let Some(t) = t else {
        d.fill(0.0);
        return;
    };
    let pt = exp(ma, (d[t] - m) - log_sum);
    for d in d.iter_mut() {
        *d = g * exp(ma, (*d - m) - log_sum);
    }
    d[t] = g * (pt - 1.0);
}
