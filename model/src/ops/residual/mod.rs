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
    /// `a + b`, the same shape or `b` broadcast over `a`'s first dimension (`[1, …]` to
    /// `[n, …]`); implementations may fall back to Burn's broadcasting add.
    fn fused_add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_add(a, b)
    }
}

/// CUDA: Burn's add, unchanged.
#[cfg(feature = "cuda")]
impl FusedAdd for burn::backend::Cuda {}

/// wgpu (`Fusion<CubeBackend>` over Vulkan, Metal, DX12): the same as CUDA.
#[cfg(feature = "wgpu")]
impl FusedAdd for burn::backend::Wgpu {}

/// `x + y` for the residual stream `x` and a block's branch output `y` (the same shape,
/// e.g. `[batch, seq_len, d_model]`), or for token embeddings `x` `[batch, seq_len, d_model]`
/// and position embeddings `y` `[1, seq_len, d_model]` shared by the batch; other shapes get
/// Burn's broadcasting add. The values and gradients are those of Burn's add exactly (one f32
/// addition per element; a broadcast operand's gradient is Burn's sum over the batch).
pub fn residual_add<B: Backend, const D: usize>(x: Tensor<B, D>, y: Tensor<B, D>) -> Tensor<B, D> {
    let (dx, dy) = (x.dims(), y.dims());
    let batch_broadcast = D > 1 && dy[0] == 1 && dx[1..] == dy[1..];
    if dx != dy && !batch_broadcast {
        return x + y;
    }
    let out = add_primitive::<B>(x.into_primitive().tensor(), y.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `a + b` on backend primitives of one shape: [`FusedAdd::fused_add`] where `B` has it, else
/// Burn's add.
pub(crate) fn add_primitive<B: Backend>(a: FloatTensor<B>, b: FloatTensor<B>) -> FloatTensor<B> {
    with_fused_backend!(B, FB => {
        same::<FloatTensor<FB>, FloatTensor<B>>(FB::fused_add(same(a), same(b)))
    } else {
        B::float_add(a, b)
    })
}
