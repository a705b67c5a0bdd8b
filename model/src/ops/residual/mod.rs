//! The residual connection `x + f(x)` as one op that adds in parallel, in place over the
//! branch's output (Burn 0.21's Flex `add` runs on one thread into a new buffer: a pass over
//! the residual stream per block half, with the other core idle).

mod autodiff;
mod flex;
#[cfg(test)]
mod tests;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::dispatch::{same, with_fused_backend};

/// `a + b` for tensors of one shape, as a Burn backend extension. The default is Burn's add;
/// Flex adds in parallel chunks, writing into whichever operand nothing else holds (the
/// branch's fresh output, usually), and `Autodiff<B>` records one node whose backward hands
/// the incoming gradient to both operands (∂(a + b)/∂a = ∂(a + b)/∂b = 1).
pub trait FusedAdd: Backend {
    /// `a + b`, same shape (implementations may fall back to Burn's broadcasting add).
    fn fused_add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_add(a, b)
    }
}

/// CUDA: Burn's add, unchanged.
#[cfg(feature = "cuda")]
impl FusedAdd for burn::backend::Cuda {}

/// `x + y` for the residual stream `x` and a block's branch output `y` (the same shape,
/// e.g. `[batch, seq_len, d_model]`); other shapes get Burn's broadcasting add. The values are
/// those of Burn's add exactly (one f32 addition per element).
pub fn residual_add<B: Backend, const D: usize>(x: Tensor<B, D>, y: Tensor<B, D>) -> Tensor<B, D> {
    if x.dims() != y.dims() {
        return x + y;
    }
    let (a, b) = (x.into_primitive().tensor(), y.into_primitive().tensor());
    let out = with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_add(same(a), same(b)))
    } else {
        B::float_add(a, b)
    });
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
