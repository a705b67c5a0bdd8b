//! The activations on Flex's raw f32 buffers: one pass, parallel over chunks, vectorized.

use burn::backend::Flex;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorMetadata};
use rayon::prelude::*;

use super::{bias_gelu_by_add, bias_gelu_dx_by_add, composed, with_bias_grad, FusedActivation};
use crate::ops::flex::{contiguous_f32, from_vec, map2, map2_over, rows_per_task};
use crate::ops::simd::{exp, normal_cdf, tanh, vectorized, Madd};
use crate::GeluKind;

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const INV_SQRT_2PI: f32 = 0.398_942_3;
const CHUNK: usize = 16 * 1024;

/// `grad` with `grad[i] = f(ma, x[i], grad[i])`: written over `grad` when nothing else holds it
/// (the usual incoming gradient), else in a new buffer; `Err(grad)` untouched when `x` or
/// `grad` is not f32.
fn map_grad(
    x: &FloatTensor<Flex>,
    grad: FloatTensor<Flex>,
    f: impl Fn(Madd, f32, f32) -> f32 + Sync + Copy,
) -> Result<FloatTensor<Flex>, FloatTensor<Flex>> {
    let Some(xs) = contiguous_f32(x) else { return Err(grad) };
    if grad.dtype() != DType::F32 || grad.shape() != x.shape() {
        return Err(grad);
    }
    // `f` by value (a closure without captures is `Copy`): behind a reference it would not be
    // inlined into the vectorized loop.
    map2_over(&xs, grad, f).or_else(|grad| {
        let gs = contiguous_f32(&grad).expect("f32");
        Ok(from_vec(map2(&xs, &gs, f), grad.shape()))
    })
}

/// `out[r·m + c] = f(ma, x[r·m + c] + bias[c], out[r·m + c])` over whole rows of `m =
/// bias.len()`, in parallel row chunks (the bias-then-activation of one linear layer in one
/// pass).
fn map_rows_with_bias(x: &[f32], bias: &[f32], out: &mut [f32], f: impl Fn(Madd, f32, f32) -> f32 + Sync) {
    let m = bias.len();
    assert!(m > 0 && x.len() == out.len() && x.len().is_multiple_of(m), "bias map: operand lengths");
    let chunk = rows_per_task(x.len() / m, m, CHUNK) * m;
    out.par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(|(out, x)| {
        vectorized(
            #[inline(always)]
            |ma| {
                for (out, x) in out.chunks_exact_mut(m).zip(x.chunks_exact(m)) {
                    for ((o, &x), &b) in out.iter_mut().zip(x).zip(bias) {
                        *o = f(ma, x + b, *o);
                    }
                }
            },
        )
    });
}

/// `GELU(x + bias)`, or with `grad` given `grad·GELU′(x + bias)` (written over `grad` when it
/// is a contiguous f32 buffer nothing else holds), on f32 buffers; `Err` with `grad` back when
/// an operand is not f32 or the sizes do not match (the caller takes the default path).
#[allow(clippy::type_complexity)]
fn bias_gelu(
    x: &FloatTensor<Flex>,
    bias: &FloatTensor<Flex>,
    grad: Option<FloatTensor<Flex>>,
    kind: GeluKind,
) -> Result<FloatTensor<Flex>, Option<FloatTensor<Flex>>> {
    let (Some(xs), Some(bs)) = (contiguous_f32(x), contiguous_f32(bias)) else { return Err(grad) };
    let m = bs.len();
    let shape_ok = |t: &FloatTensor<Flex>| t.dtype() == DType::F32 && t.shape() == x.shape();
    if m == 0 || x.shape().to_vec().last() != Some(&m) || !grad.as_ref().is_none_or(shape_ok) {
        return Err(grad);
    }
    let erf = kind == GeluKind::Erf;
    let Some(mut grad) = grad else {
        let mut out = vec![0.0; xs.len()]; // fresh zero pages: no pass of their own
        match erf {
            true => map_rows_with_bias(
                &xs,
                &bs,
                &mut out,
                #[inline(always)]
                |ma, z, _| gelu_erf(ma, z),
            ),
            false => map_rows_with_bias(
                &xs,
                &bs,
                &mut out,
                #[inline(always)]
                |ma, z, _| gelu_tanh(ma, z),
            ),
        }
        return Ok(from_vec(out, x.shape()));
    };
    let slope = |out: &mut [f32]| match erf {
        true => map_rows_with_bias(
            &xs,
            &bs,
            out,
            #[inline(always)]
            |ma, z, g| g * gelu_erf_slope(ma, z),
        ),
        false => map_rows_with_bias(
            &xs,
            &bs,
            out,
            #[inline(always)]
            |ma, z, g| g * gelu_tanh_slope(ma, z),
        ),
    };
    if let Some((start, end)) = grad.layout().contiguous_offsets() {
        if let Some(buf) = grad.try_storage_mut::<f32>() {
            slope(&mut buf[start..end]);
            return Ok(grad);
        }
    }
    let mut out = contiguous_f32(&grad).expect("f32").into_owned();
    slope(&mut out);
    Ok(from_vec(out, x.shape()))
}

#[inline(always)]
fn gelu_erf(ma: Madd, x: f32) -> f32 {
    x * normal_cdf(ma, x)
}

#[inline(always)]
fn gelu_erf_slope(ma: Madd, x: f32) -> f32 {
    ma.madd(x * exp(ma, -0.5 * x * x), INV_SQRT_2PI, normal_cdf(ma, x))
}

#[inline(always)]
fn gelu_tanh(ma: Madd, x: f32) -> f32 {
    0.5 * x * (1.0 + tanh(ma, SQRT_2_OVER_PI * ma.madd(0.044715 * x * x, x, x)))
}

#[inline(always)]
fn gelu_tanh_slope(ma: Madd, x: f32) -> f32 {
    let x2 = x * x;
    let t = tanh(ma, SQRT_2_OVER_PI * ma.madd(0.044715 * x2, x, x));
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x2)
}

#[inline(always)]
fn sigmoid(ma: Madd, g: f32) -> f32 {
    1.0 / (1.0 + exp(ma, -g))
}

impl FusedActivation for Flex {
    fn fused_gelu(x: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        let Some(xs) = contiguous_f32(&x) else { return composed::gelu::<Self>(x, kind) };
        let out = match kind {
            GeluKind::Erf => map2(
                &xs,
                &xs,
                #[inline(always)]
                |ma, x, _| gelu_erf(ma, x),
            ),
            GeluKind::Tanh => map2(
                &xs,
                &xs,
                #[inline(always)]
                |ma, x, _| gelu_tanh(ma, x),
            ),
        };
        from_vec(out, x.shape())
    }

    fn fused_gelu_backward(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: GeluKind,
    ) -> FloatTensor<Self> {
        let out = match kind {
            GeluKind::Erf => map_grad(
                &x,
                grad,
                #[inline(always)]
                |ma, x, g| g * gelu_erf_slope(ma, x),
            ),
            GeluKind::Tanh => map_grad(
                &x,
                grad,
                #[inline(always)]
                |ma, x, g| g * gelu_tanh_slope(ma, x),
            ),
        };
        out.unwrap_or_else(|grad| composed::gelu_backward::<Self>(x, grad, kind))
    }

    fn fused_bias_gelu(x: FloatTensor<Self>, bias: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        bias_gelu(&x, &bias, None, kind).unwrap_or_else(|_| bias_gelu_by_add::<Self>(x, bias, kind))
    }

    /// `dx` in one pass over the rows (over the incoming gradient where nothing else holds
    /// it); `dbias` by Burn's `sum_dim` over the rows, as the linear layer's bias had it.
    fn fused_bias_gelu_backward(
        x: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kind: GeluKind,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        with_bias_grad::<Self>(match bias_gelu(&x, &bias, Some(grad), kind) {
            Ok(dx) => dx,
            Err(grad) => bias_gelu_dx_by_add::<Self>(x, bias, grad.expect("given"), kind),
        })
    }

    fn fused_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let (Some(gs), Some(us)) = (contiguous_f32(&gate), contiguous_f32(&up)) else {
            return composed::swiglu::<Self>(gate, up);
        };
        from_vec(
            map2(
                &gs,
                &us,
                #[inline(always)]
                |ma, g, u| g * sigmoid(ma, g) * u,
            ),
            gate.shape(),
        )
    }

    fn fused_swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (Some(gs), Some(us), Some(ds)) =
            (contiguous_f32(&gate), contiguous_f32(&up), contiguous_f32(&grad))
        else {
            return composed::swiglu_backward::<Self>(gate, up, grad);
        };
        let n = gs.len();
        assert!(us.len() == n && ds.len() == n, "swiglu backward: operand lengths");
        let (mut dgate, mut dup) = (Vec::with_capacity(n), Vec::with_capacity(n));
        dgate.spare_capacity_mut()[..n]
            .par_chunks_mut(CHUNK)
            .zip(dup.spare_capacity_mut()[..n].par_chunks_mut(CHUNK))
            .zip(gs.par_chunks(CHUNK).zip(us.par_chunks(CHUNK)).zip(ds.par_chunks(CHUNK)))
            .for_each(|((dg, du), ((g, u), d))| {
                vectorized(
                    #[inline(always)]
                    |ma| {
                        for i in 0..dg.len() {
                            let s = sigmoid(ma, g[i]);
                            dg[i].write(d[i] * u[i] * s * (1.0 + g[i] * (1.0 - s)));
                            du[i].write(d[i] * g[i] * s);
                        }
                    },
                )
            });
        // SAFETY: the chunks cover all n elements of both, each written once.
        unsafe {
            dgate.set_len(n);
            dup.set_len(n);
        }
        let shape = gate.shape();
        (from_vec(dgate, shape.clone()), from_vec(dup, shape))
    }
}
