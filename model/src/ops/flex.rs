//! Raw-buffer helpers for the Flex kernels: reading an f32 tensor as a slice, building a
//! tensor from a `Vec`, splitting work over rayon's threads, and element-wise maps.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use rayon::prelude::*;

use crate::ops::simd::{vectorized, Madd};

/// Elements per rayon task of the element-wise maps.
const MAP_CHUNK: usize = 16 * 1024;

/// The tensor's values in row-major order: borrowed when it is contiguous, else copied.
/// `None` unless its dtype is f32 (the kernels are f32; other dtypes take the composed path).
pub fn contiguous_f32(t: &FlexTensor) -> Option<std::borrow::Cow<'_, [f32]>> {
    if t.dtype() != DType::F32 {
        return None;
    }
    Some(match t.as_slice::<f32>() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => {
            std::borrow::Cow::Owned(t.to_contiguous().as_slice::<f32>().expect("contiguous f32").to_vec())
        }
    })
}

/// A contiguous f32 tensor of `shape` holding `values`.
///
/// # Panics
/// If `values.len()` is not the shape's element count.
pub fn from_vec(values: Vec<f32>, shape: impl Into<Shape>) -> FlexTensor {
    let shape = shape.into();
    assert_eq!(values.len(), shape.num_elements(), "values for shape {shape:?}");
    FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(shape), DType::F32)
}

/// Rows per rayon task so each task has at least `min_elems` elements (about 16 K keeps the
/// scheduling cost under a percent) while every thread gets work.
pub fn rows_per_task(rows: usize, row_len: usize, min_elems: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let by_size = min_elems.div_ceil(row_len.max(1)).max(1);
    let by_threads = rows.div_ceil(threads * 4).max(1);
    by_size.max(by_threads).min(rows.max(1))
}

/// `out[i] = f(ma, a[i], b[i])` over equal-length slices, in parallel chunks, into a new buffer
/// that is written once (never zeroed first); `ma` is the [`Madd`] mode of the instructions the
/// loop runs with (see [`vectorized`]). Pass `f` marked `#[inline(always)]`: otherwise
/// it stays a call per element, compiled without the wide instructions (GELU's backward was
/// a quarter of a training step that way).
pub fn map2(a: &[f32], b: &[f32], f: impl Fn(Madd, f32, f32) -> f32 + Sync) -> Vec<f32> {
    let n = a.len();
    assert_eq!(n, b.len(), "map2: operand lengths");
    let mut out = Vec::with_capacity(n);
    out.spare_capacity_mut()[..n]
        .par_chunks_mut(MAP_CHUNK)
        .zip(a.par_chunks(MAP_CHUNK))
        .zip(b.par_chunks(MAP_CHUNK))
        .for_each(|((o, a), b)| {
            vectorized(
                #[inline(always)]
                |ma| {
                    for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                        o.write(f(ma, a, b));
                    }
                },
            )
        });
    // SAFETY: the chunks above cover all n elements, each written once.
    unsafe { out.set_len(n) };
    out
}

/// `b[i] = f(ma, a[i], b[i])` in place, in parallel chunks (as [`map2`]).
pub fn map2_in_place(a: &[f32], b: &mut [f32], f: impl Fn(Madd, f32, f32) -> f32 + Sync) {
    assert_eq!(a.len(), b.len(), "map2: operand lengths");
    b.par_chunks_mut(MAP_CHUNK).zip(a.par_chunks(MAP_CHUNK)).for_each(|(b, a)| {
        vectorized(
            #[inline(always)]
            |ma| {
                for (b, &a) in b.iter_mut().zip(a) {
                    *b = f(ma, a, *b);
                }
            },
        )
    });
}

/// `target` with `target[i] = f(ma, a[i], target[i])`, written over `target` when it is a
/// contiguous f32 buffer nothing else holds (e.g. a fresh gradient or branch output);
/// `Err(target)` untouched otherwise. `a` has `target`'s element count.
pub fn map2_over(
    a: &[f32],
    mut target: FlexTensor,
    f: impl Fn(Madd, f32, f32) -> f32 + Sync,
) -> Result<FlexTensor, FlexTensor> {
    if target.dtype() != DType::F32 {
        return Err(target);
    }
    let Some((start, end)) = target.layout().contiguous_offsets() else { return Err(target) };
    match target.try_storage_mut::<f32>() {
        Some(buf) => {
            map2_in_place(a, &mut buf[start..end], f);
            Ok(target)
        }
        None => Err(target),
    }
}
