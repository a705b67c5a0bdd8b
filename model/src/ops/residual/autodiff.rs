//! `Autodiff<B>` residual add: one node whose backward gives the incoming gradient to both
//! operands (summed over the dimensions an operand was broadcast over).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{broadcast_shape, Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};

use super::FusedAdd;
use crate::ops::grads::register_grad;

#[derive(Debug)]
struct AddBackward;

impl<B: FusedAdd> Backward<B, 2> for AddBackward {
    /// The operands' shapes: an operand broadcast over a dimension of size 1 gets the gradient
    /// summed over it (Burn's own `broadcast_shape`, as its add does).
    type State = (Shape, Shape);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (shape_a, shape_b) = ops.state;
        let grad = grads.consume::<B>(&ops.node);
        match ops.parents {
            [Some(a), Some(b)] => {
                register_grad!(grads, B, a, broadcast_shape::<B>(grad.clone(), &shape_a));
                register_grad!(grads, B, b, broadcast_shape::<B>(grad, &shape_b));
            }
            [Some(a), None] => register_grad!(grads, B, a, broadcast_shape::<B>(grad, &shape_a)),
            [None, Some(b)] => register_grad!(grads, B, b, broadcast_shape::<B>(grad, &shape_b)),
            [None, None] => {}
        }
    }
}

impl<B: FusedAdd, C: CheckpointStrategy> FusedAdd for Autodiff<B, C> {
    fn fused_add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        match AddBackward.prepare::<C>([a.node.clone(), b.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let shapes = (a.primitive.shape(), b.primitive.shape());
                prep.finish(shapes, B::fused_add(a.primitive, b.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_add(a.primitive, b.primitive)),
        }
    }
}
