//! The residual add on Flex's raw f32 buffers: parallel chunks, in place when an operand is
//! unshared.

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, TensorMetadata};
use rayon::prelude::*;

use super::FusedAdd;
use crate::ops::flex::{contiguous_f32, from_vec};
use crate::ops::simd::vectorized;

/// Elements per rayon task.
const CHUNK: usize = 32 * 1024;

/// `acc[i] += other[i]`, in parallel chunks.
fn add_in_place(acc: &mut [f32], other: &[f32]) {
    acc.par_chunks_mut(CHUNK).zip(other.par_chunks(CHUNK)).for_each(|(acc, other)| {
        vectorized(
            #[inline(always)]
            || {
                for (a, &o) in acc.iter_mut().zip(other) {
                    *a += o;
                }
            },
        )
    });
}

/// `target + other` written over `target` when it is a contiguous f32 buffer nothing else
/// holds; `Err(target)` otherwise.
fn add_into(mut target: FlexTensor, other: &FlexTensor) -> Result<FlexTensor, FlexTensor> {
    let Some((start, end)) = target.layout().contiguous_offsets() else { return Err(target) };
    let Some(other) = contiguous_f32(other) else { return Err(target) };
    match target.try_storage_mut::<f32>() {
        Some(buf) => {
            add_in_place(&mut buf[start..end], &other);
            Ok(target)
        }
        None => Err(target),
    }
}

impl FusedAdd for Flex {
    fn fused_add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        if a.shape() != b.shape() || a.dtype() != DType::F32 || b.dtype() != DType::F32 {
            return Self::float_add(a, b);
        }
        // f32 addition commutes exactly: either operand may take the sum.
        let b = match add_into(b, &a) {
            Ok(sum) => return sum,
            Err(b) => b,
        };
        let a = match add_into(a, &b) {
            Ok(sum) => return sum,
            Err(a) => a,
        };
        let (Some(xs), Some(ys)) = (contiguous_f32(&a), contiguous_f32(&b)) else {
            return Self::float_add(a, b);
        };
        let n = xs.len();
        let mut out = Vec::with_capacity(n);
        out.spare_capacity_mut()[..n]
            .par_chunks_mut(CHUNK)
            .zip(xs.par_chunks(CHUNK).zip(ys.par_chunks(CHUNK)))
            .for_each(|(o, (x, y))| {
                vectorized(
                    #[inline(always)]
                    || {
                        for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                            o.write(x + y);
                        }
                    },
                )
            });
        // SAFETY: the chunks cover all n elements, each written once.
        unsafe { out.set_len(n) };
        from_vec(out, a.shape())
    }
}
