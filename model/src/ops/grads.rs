//! Registering a gradient contribution in Burn's autodiff `Gradients`.
//!
//! A tensor read by two ops receives two gradient contributions: the residual stream `x` in
//! `x + f(norm(x))` gets one from the residual add and one from the norm, twice per block.
//! Burn's `Gradients::register` sums them with the inner backend's `float_add`, which on Flex
//! runs on one thread into a fresh buffer while the other core waits. [`register_grad!`] takes
//! the contribution already there and sums with [`FusedAdd`](super::FusedAdd) instead (parallel,
//! written over an unshared operand); the values are Burn's exactly (f32 addition commutes).

/// `register_grad!(grads, B, node, grad)`: adds `grad` (a `FloatTensor<B>`) to the gradient of
/// the graph node `node` (a parent of an `Ops`), registering it when it is the first
/// contribution. A macro because Burn 0.21 does not export the node type by name.
macro_rules! register_grad {
    ($grads:expr, $B:ty, $node:expr, $grad:expr) => {{
        let node = $node;
        let grad: burn::tensor::ops::FloatTensor<$B> = $grad;
        // `Gradients` looks a gradient up by an autodiff tensor, but only reads its node's id.
        let earlier = {
            let key = burn::tensor::ops::FloatTensor::<burn::backend::Autodiff<$B>> {
                primitive: grad.clone(),
                node: node.clone(),
                rc: std::sync::Arc::new(node.id),
            };
            $grads.remove::<$B>(&key)
        };
        let sum = match earlier {
            Some(earlier) => $crate::ops::residual::add_primitive::<$B>(grad, earlier),
            None => grad,
        };
        $grads.register::<$B>(node.id, sum);
    }};
}
pub(crate) use register_grad;
