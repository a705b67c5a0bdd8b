//! The residual add on Flex's raw f32 buffers: parallel chunks, in place when an operand is
//! unshared.

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, TensorMetadata};

use super::FusedAdd;
use crate::ops::flex::{contiguous_f32, from_vec, map2, map2_over};

/// `target + other` written over `target` when it is a contiguous f32 buffer nothing else
/// holds; `Err(target)` otherwise.
fn add_into(target: FlexTensor, other: &FlexTensor) -> Result<FlexTensor, FlexTensor> {
    match contiguous_f32(other) {
        Some(other) => map2_over(
            &other,
            target,
            #[inline(always)]
            |o, t| t + o,
        ),
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
        let out = map2(
            &xs,
            &ys,
            #[inline(always)]
            |x, y| x + y,
        );
        from_vec(out, a.shape())
    }
}
