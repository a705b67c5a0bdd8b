//! Raw-buffer helpers for the Flex kernels: reading an f32 tensor as a slice, building a
//! tensor from a `Vec`, and splitting work over rayon's threads.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};

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
