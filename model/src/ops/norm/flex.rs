//! LayerNorm and RMSNorm on Flex's raw f32 buffers: rows in parallel (rayon), each row in a few
//! vectorized passes. Row sums run in [`LANES`] independent accumulators (lane `j` adds elements
//! `j, j + LANES, …`), added in order at the end: the adds map onto vector registers without
//! reordering any floating-point operation, so the result does not depend on the instruction set.
//!
//! `dγ`/`dβ` sum over rows. The rows are cut into chunks whose size depends on `C` only; each
//! chunk sums its rows in order into its own partial `[C]`, and the partials are added in chunk
//! order, so the result is bit-identical whatever the number of threads (Ember compares resumed
//! and straight runs, and replicas, bit for bit).

use std::borrow::Cow;
use std::mem::MaybeUninit;

use burn::backend::Flex;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};
use rayon::prelude::*;

use super::{composed, FusedNorm};
use crate::ops::flex::{contiguous_f32, from_vec, rows_per_task};
use crate::ops::simd::vectorized;

/// Independent accumulators per row sum: 2 AVX-512 or 4 AVX2 registers, enough to hide the
/// add latency.
const LANES: usize = 32;
/// Elements per forward task (see [`rows_per_task`]).
const TASK_ELEMS: usize = 16 * 1024;
/// Elements per backward chunk, rounded to whole rows: fixed, so that the order of the `dγ`/`dβ`
/// sums does not depend on the thread count.
const CHUNK_ELEMS: usize = 32 * 1024;

/// The lanes added in order. (A pairwise tree here made LLVM re-vectorize the accumulation
/// loop two lanes wide; 32 partial sums in order cost at most a few ulp more.)
#[inline(always)]
fn lanes_total(acc: [f32; LANES]) -> f32 {
    acc.iter().sum()
}

// The row sums, one function each: written as `acc[j] += …` over `[f32; LANES]` blocks so
// that LLVM keeps the accumulators in vector registers (a generic version with a closure
// returning `[f32; K]` was left scalar, with the accumulators spilled to the stack).

/// `Σx`.
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let (full, tail) = x.as_chunks::<LANES>();
    let mut acc = [0f32; LANES];
    for x in full {
        for j in 0..LANES {
            acc[j] += x[j];
        }
    }
    lanes_total(acc) + tail.iter().sum::<f32>()
}

/// `(Σ(x − m), Σ(x − m)²)`.
#[inline(always)]
fn centered_sums(x: &[f32], m: f32) -> (f32, f32) {
    let (full, tail) = x.as_chunks::<LANES>();
    let (mut s1, mut s2) = ([0f32; LANES], [0f32; LANES]);
    for x in full {
        for j in 0..LANES {
            let d = x[j] - m;
            s1[j] += d;
            s2[j] += d * d;
        }
    }
    let (mut t1, mut t2) = (0f32, 0f32);
    for &x in tail {
        let d = x - m;
        t1 += d;
        t2 += d * d;
    }
    (lanes_total(s1) + t1, lanes_total(s2) + t2)
}

/// `Σx²`.
#[inline(always)]
fn sum_sq(x: &[f32]) -> f32 {
    let (full, tail) = x.as_chunks::<LANES>();
    let mut acc = [0f32; LANES];
    for x in full {
        for j in 0..LANES {
            acc[j] += x[j] * x[j];
        }
    }
    lanes_total(acc) + tail.iter().map(|x| x * x).sum::<f32>()
}

/// LayerNorm backward's `(Σdŷ, Σdŷ·(x − mean), Σ(x − mean))`, `dŷ = dy·γ`.
#[inline(always)]
fn layer_norm_grad_sums(dy: &[f32], x: &[f32], gamma: &[f32], mean: f32) -> (f32, f32, f32) {
    let n = x.len();
    let ((dy_full, dy_tail), (x_full, x_tail)) = (dy[..n].as_chunks::<LANES>(), x.as_chunks::<LANES>());
    let (g_full, g_tail) = gamma[..n].as_chunks::<LANES>();
    let (mut s_dyhat, mut s_dyhat_xc, mut s_xc) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
    for ((dy, x), g) in dy_full.iter().zip(x_full).zip(g_full) {
        for j in 0..LANES {
            let (dyhat, xc) = (dy[j] * g[j], x[j] - mean);
            s_dyhat[j] += dyhat;
            s_dyhat_xc[j] += dyhat * xc;
            s_xc[j] += xc;
        }
    }
    let (mut t_dyhat, mut t_dyhat_xc, mut t_xc) = (0f32, 0f32, 0f32);
    for ((dy, x), g) in dy_tail.iter().zip(x_tail).zip(g_tail) {
        let (dyhat, xc) = (dy * g, x - mean);
        t_dyhat += dyhat;
        t_dyhat_xc += dyhat * xc;
        t_xc += xc;
    }
    (lanes_total(s_dyhat) + t_dyhat, lanes_total(s_dyhat_xc) + t_dyhat_xc, lanes_total(s_xc) + t_xc)
}

/// RMSNorm backward's `Σdŷ·x`, `dŷ = dy·γ`.
#[inline(always)]
fn rms_norm_grad_sum(dy: &[f32], x: &[f32], gamma: &[f32]) -> f32 {
    let n = x.len();
    let ((dy_full, dy_tail), (x_full, x_tail)) = (dy[..n].as_chunks::<LANES>(), x.as_chunks::<LANES>());
    let (g_full, g_tail) = gamma[..n].as_chunks::<LANES>();
    let mut acc = [0f32; LANES];
    for ((dy, x), g) in dy_full.iter().zip(x_full).zip(g_full) {
        for j in 0..LANES {
            acc[j] += dy[j] * g[j] * x[j];
        }
    }
    let tail = dy_tail.iter().zip(x_tail).zip(g_tail).map(|((dy, x), g)| dy * g * x).sum::<f32>();
    lanes_total(acc) + tail
}

/// One LayerNorm row: writes `y`, returns `(mean, rstd)`. The mean is refined in a second pass
/// (Chan, Golub & LeVeque 1983, "corrected two-pass"): with `m₀ = Σx/C`, `d = Σ(x − m₀)/C`,
/// `var = Σ(x − m₀)²/C − d²`, and `y` uses `(x − m₀) − d`, all accurate when `|mean| ≫ std`.
#[inline(always)]
fn layer_norm_row(
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    y: &mut [MaybeUninit<f32>],
) -> (f32, f32) {
    let c = x.len() as f32;
    let m0 = sum(x) / c;
    let (s1, s2) = centered_sums(x, m0);
    let d = s1 / c;
    let rstd = 1.0 / ((s2 / c - d * d).max(0.0) + eps).sqrt();
    let n = x.len();
    let (gamma, y) = (&gamma[..n], &mut y[..n]);
    match beta {
        Some(beta) => {
            let beta = &beta[..n];
            for i in 0..n {
                y[i].write(((x[i] - m0) - d) * rstd * gamma[i] + beta[i]);
            }
        }
        None => {
            for i in 0..n {
                y[i].write(((x[i] - m0) - d) * rstd * gamma[i]);
            }
        }
    }
    (m0 + d, rstd)
}

/// One LayerNorm row's backward: writes `dx`, adds `dy·x̂` to `dgamma` and `dy` to `dbeta`.
/// `r = mean(x − mean)` is the saved f32 mean's rounding error, so `x̂ = (x − mean − r)·rstd`
/// is centred as precisely as in the forward; `mean(dŷ·x̂) = rstd·(Σdŷ·(x − mean) − r·Σdŷ)/C`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn layer_norm_backward_row(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: f32,
    rstd: f32,
    dx: &mut [MaybeUninit<f32>],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let n = x.len();
    let c = n as f32;
    let (s_dyhat, s_dyhat_xc, s_xc) = layer_norm_grad_sums(dy, x, gamma, mean);
    let r = s_xc / c;
    let mean_dyhat = s_dyhat / c;
    let mean_dyhat_xhat = rstd * (s_dyhat_xc - r * s_dyhat) / c;
    let (dy, gamma, dx, dgamma, dbeta) =
        (&dy[..n], &gamma[..n], &mut dx[..n], &mut dgamma[..n], &mut dbeta[..n]);
    for i in 0..n {
        let xhat = ((x[i] - mean) - r) * rstd;
        dx[i].write(rstd * (dy[i] * gamma[i] - mean_dyhat - xhat * mean_dyhat_xhat));
        dgamma[i] += dy[i] * xhat;
        dbeta[i] += dy[i];
    }
}

/// One RMSNorm row: writes `y = x·rstd·γ`, returns `rstd`.
#[inline(always)]
fn rms_norm_row(x: &[f32], gamma: &[f32], eps: f32, y: &mut [MaybeUninit<f32>]) -> f32 {
    let n = x.len();
    let rstd = 1.0 / (sum_sq(x) / n as f32 + eps).sqrt();
    let (gamma, y) = (&gamma[..n], &mut y[..n]);
    for i in 0..n {
        y[i].write(x[i] * rstd * gamma[i]);
    }
    rstd
}

/// One RMSNorm row's backward: writes `dx`, adds `dy·x̂` to `dgamma`.
#[inline(always)]
fn rms_norm_backward_row(
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    rstd: f32,
    dx: &mut [MaybeUninit<f32>],
    dgamma: &mut [f32],
) {
    let n = x.len();
    let mean_dyhat_xhat = rstd * rms_norm_grad_sum(dy, x, gamma) / n as f32;
    let (dy, gamma, dx, dgamma) = (&dy[..n], &gamma[..n], &mut dx[..n], &mut dgamma[..n]);
    for i in 0..n {
        let xhat = x[i] * rstd;
        dx[i].write(rstd * (dy[i] * gamma[i] - xhat * mean_dyhat_xhat));
        dgamma[i] += dy[i] * xhat;
    }
}

/// `(C, rows, stats shape [rows.., 1])` of `x`, or `None` for an input the kernels skip
/// (rank 0 or `C = 0`).
fn layout(x: &FloatTensor<Flex>) -> Option<(usize, usize, Shape)> {
    let mut shape = x.shape();
    let rank = shape.num_dims();
    let c = *shape.last()?;
    if c == 0 {
        return None;
    }
    let rows = shape.num_elements() / c;
    shape[rank - 1] = 1;
    Some((c, rows, shape))
}

fn check_param(what: &str, p: &[f32], c: usize) {
    assert_eq!(p.len(), c, "norm: {what} has {} values for rows of {c}", p.len());
}

/// `Σ_k partials[k]` over chunks in order: `partials` holds `n` blocks of `width` values.
fn sum_chunks(partials: &[f32], width: usize) -> Vec<f32> {
    let mut total = vec![0f32; width];
    vectorized(
        #[inline(always)]
        |_| {
            for part in partials.chunks_exact(width) {
                for (t, &p) in total.iter_mut().zip(part) {
                    *t += p;
                }
            }
        },
    );
    total
}

/// The f32 contents of `beta`, or `Err(())` when it is there but not f32.
fn beta_f32(beta: &Option<FloatTensor<Flex>>) -> Result<Option<Cow<'_, [f32]>>, ()> {
    match beta {
        Some(b) => contiguous_f32(b).map(Some).ok_or(()),
        None => Ok(None),
    }
}

impl FusedNorm for Flex {
    fn fused_layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (Some((c, rows, stats)), Some(xs), Some(gs), Ok(bs)) =
            (layout(&x), contiguous_f32(&x), contiguous_f32(&gamma), beta_f32(&beta))
        else {
            return composed::layer_norm_forward::<Self>(x, gamma, beta, eps);
        };
        check_param("gamma", &gs, c);
        if let Some(bs) = &bs {
            check_param("beta", bs, c);
        }
        let (gs, bs, eps) = (&gs[..], bs.as_deref(), eps as f32);
        let (mut y, mut mean, mut rstd) = (Vec::with_capacity(xs.len()), vec![0f32; rows], vec![0f32; rows]);
        let task = rows_per_task(rows, c, TASK_ELEMS);
        y.spare_capacity_mut()[..xs.len()]
            .par_chunks_mut(task * c)
            .zip(xs.par_chunks(task * c))
            .zip(mean.par_chunks_mut(task).zip(rstd.par_chunks_mut(task)))
            .for_each(|((y, x), (mean, rstd))| {
                vectorized(
                    #[inline(always)]
                    |_| {
                        for (i, (x, y)) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)).enumerate() {
                            (mean[i], rstd[i]) = layer_norm_row(x, gs, bs, eps, y);
                        }
                    },
                )
            });
        // SAFETY: the row loop above wrote every element of every row.
        unsafe { y.set_len(xs.len()) };
        (from_vec(y, x.shape()), from_vec(mean, stats.clone()), from_vec(rstd, stats))
    }

    fn fused_layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (Some((c, rows, _)), Some(dys), Some(xs), Some(gs), Some(ms), Some(rs)) = (
            layout(&x),
            contiguous_f32(&dy),
            contiguous_f32(&x),
            contiguous_f32(&gamma),
            contiguous_f32(&mean),
            contiguous_f32(&rstd),
        ) else {
            return composed::layer_norm_backward::<Self>(dy, x, gamma, mean, rstd);
        };
        check_param("gamma", &gs, c);
        assert_eq!((dys.len(), ms.len(), rs.len()), (xs.len(), rows, rows), "layer_norm backward: shapes");
        let gs = &gs[..];
        let chunk = (CHUNK_ELEMS / c).max(1); // rows per chunk: depends on C only
        let mut dx = Vec::with_capacity(xs.len());
        let mut partials = vec![0f32; rows.div_ceil(chunk) * 2 * c]; // per chunk: dγ [C], dβ [C]
        dx.spare_capacity_mut()[..xs.len()]
            .par_chunks_mut(chunk * c)
            .zip(dys.par_chunks(chunk * c).zip(xs.par_chunks(chunk * c)))
            .zip(ms.par_chunks(chunk).zip(rs.par_chunks(chunk)))
            .zip(partials.par_chunks_mut(2 * c))
            .for_each(|(((dx, (dy, x)), (mean, rstd)), part)| {
                let (dgamma, dbeta) = part.split_at_mut(c);
                vectorized(
                    #[inline(always)]
                    |_| {
                        let rows = dx.chunks_exact_mut(c).zip(dy.chunks_exact(c).zip(x.chunks_exact(c)));
                        for (i, (dx, (dy, x))) in rows.enumerate() {
                            layer_norm_backward_row(dy, x, gs, mean[i], rstd[i], dx, dgamma, dbeta);
                        }
                    },
                )
            });
        // SAFETY: the row loop above wrote every element of every row.
        unsafe { dx.set_len(xs.len()) };
        let sums = sum_chunks(&partials, 2 * c);
        let (dgamma, dbeta) = (sums[..c].to_vec(), sums[c..].to_vec());
        (from_vec(dx, x.shape()), from_vec(dgamma, [c]), from_vec(dbeta, [c]))
    }

    fn fused_rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (Some((c, rows, stats)), Some(xs), Some(gs)) =
            (layout(&x), contiguous_f32(&x), contiguous_f32(&gamma))
        else {
            return composed::rms_norm_forward::<Self>(x, gamma, eps);
        };
        check_param("gamma", &gs, c);
        let (gs, eps) = (&gs[..], eps as f32);
        let (mut y, mut rstd) = (Vec::with_capacity(xs.len()), vec![0f32; rows]);
        let task = rows_per_task(rows, c, TASK_ELEMS);
        let out = &mut y.spare_capacity_mut()[..xs.len()];
        out.par_chunks_mut(task * c).zip(xs.par_chunks(task * c)).zip(rstd.par_chunks_mut(task)).for_each(
            |((y, x), rstd)| {
                vectorized(
                    #[inline(always)]
                    |_| {
                        for (i, (x, y)) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)).enumerate() {
                            rstd[i] = rms_norm_row(x, gs, eps, y);
                        }
                    },
                )
            },
        );
        // SAFETY: the row loop above wrote every element of every row.
        unsafe { y.set_len(xs.len()) };
        (from_vec(y, x.shape()), from_vec(rstd, stats))
    }

    fn fused_rms_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (Some((c, rows, _)), Some(dys), Some(xs), Some(gs), Some(rs)) = (
            layout(&x),
            contiguous_f32(&dy),
            contiguous_f32(&x),
            contiguous_f32(&gamma),
            contiguous_f32(&rstd),
        ) else {
            return composed::rms_norm_backward::<Self>(dy, x, gamma, rstd);
        };
        check_param("gamma", &gs, c);
        assert_eq!((dys.len(), rs.len()), (xs.len(), rows), "rms_norm backward: shapes");
        let gs = &gs[..];
        let chunk = (CHUNK_ELEMS / c).max(1);
        let mut dx = Vec::with_capacity(xs.len());
        let mut partials = vec![0f32; rows.div_ceil(chunk) * c]; // per chunk: dγ [C]
        dx.spare_capacity_mut()[..xs.len()]
            .par_chunks_mut(chunk * c)
            .zip(dys.par_chunks(chunk * c).zip(xs.par_chunks(chunk * c)))
            .zip(rs.par_chunks(chunk))
            .zip(partials.par_chunks_mut(c))
            .for_each(|(((dx, (dy, x)), rstd), dgamma)| {
                vectorized(
                    #[inline(always)]
                    |_| {
                        let rows = dx.chunks_exact_mut(c).zip(dy.chunks_exact(c).zip(x.chunks_exact(c)));
                        for (i, (dx, (dy, x))) in rows.enumerate() {
                            rms_norm_backward_row(dy, x, gs, rstd[i], dx, dgamma);
                        }
                    },
                )
            });
        // SAFETY: the row loop above wrote every element of every row.
        unsafe { dx.set_len(xs.len()) };
        (from_vec(dx, x.shape()), from_vec(sum_chunks(&partials, c), [c]))
    }
}
