//! The residual add on Flex's raw f32 buffers: parallel chunks, in place when an operand is
//! unshared.

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, TensorMetadata};

use super::FusedAdd;
use crate::ops::flex::{contiguous_f32, from_vec, map2, map2_in_place, map2_over};

/// `target + other` written over `target` when it is a contiguous f32 buffer nothing else
/// holds; `Err(target)` otherwise.
fn add_into(target: FlexTensor, other: &FlexTensor) -> Result<FlexTensor, FlexTensor> {
    match contiguous_f32(other) {
        Some(other) => map2_over(
            &other,
            target,
            #[inline(always)]
            |_, o, t| t + o,
        ),
        None => Err(target),
    }
}

/// `a + b` for `b` of shape `[1, …]` broadcast over `a`'s first dimension `[n, …]`, written over
/// `a` (one batch row at a time, each in parallel chunks) when it is a contiguous f32 buffer
/// nothing else holds; `Err(a)` otherwise.
fn add_broadcast_into(mut a: FlexTensor, b: &FlexTensor) -> Result<FlexTensor, FlexTensor> {
    let (Some(b), Some((start, end))) = (contiguous_f32(b), a.layout().contiguous_offsets()) else {
        return Err(a);
    };
    match a.try_storage_mut::<f32>() {
        Some(buf) if !b.is_empty() => {
            for row in buf[start..end].chunks_mut(b.len()) {
                map2_in_place(
                    &b,
                    row,
                    #[inline(always)]
                    |_, b, a| a + b,
                );
            }
            Ok(a)
        }
        _ => Err(a),
    }
}

/// True when `b` is `[1, …]` and `a` is `[n, …]` with the same trailing dimensions.
fn broadcasts_over_first(a: &FlexTensor, b: &FlexTensor) -> bool {
    let (sa, sb) = (a.shape(), b.shape());
    sa.num_dims() == sb.num_dims() && sa.num_dims() > 1 && sb[0] == 1 && sa[1..] == sb[1..]
}

impl FusedAdd for Flex {
    fn fused_add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        if a.dtype() != DType::F32 || b.dtype() != DType::F32 {
            return Self::float_add(a, b);
        }
        if broadcasts_over_first(&a, &b) {
            return match add_broadcast_into(a, &b) {
                Ok(sum) => sum,
                Err(a) => Self::float_add(a, b),
            };
        }
        if a.shape() != b.shape() {
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
        let out = map2(
            &xs,
            &ys,
            #[inline(always)]
            |_, x, y| x + y,
        );
        from_vec(out, a.shape())
    }
}
