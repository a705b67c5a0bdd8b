//! Fused training ops, each with its own backward: a trait per op family (Burn's
//! backend-extension pattern) with a generic default made of Burn tensor ops, a fast Flex
//! implementation on raw buffers, and an `Autodiff<B>` implementation whose backward calls the
//! inner backend's fused backward. The functions here take Burn tensors of any backend and
//! dispatch at run time (see [`dispatch`]); a backend without fused ops gets the same math as
//! composed tensor ops.

pub mod activation;
pub mod adamw;
pub mod attention;
#[cfg(feature = "cube")]
pub(crate) mod cube;
pub mod dispatch;
pub mod flex;
mod grads;
pub mod linear;
pub mod loss;
pub mod norm;
pub mod residual;
pub mod simd;

pub use activation::{bias_gelu, gelu, swiglu, FusedActivation};
pub use adamw::{adamw_update, AdamWScalars, FusedAdamWUpdate, UpdateGate};
pub use attention::{flash_attention, flash_attention_qkv, FusedAttention};
pub use linear::{linear, linear_gelu};
pub use loss::{cross_entropy_sum, FusedCrossEntropy};
pub use norm::{layer_norm, rms_norm, FusedNorm};
pub use residual::{residual_add, FusedAdd};
#[cfg(test)]
pub mod testing;
