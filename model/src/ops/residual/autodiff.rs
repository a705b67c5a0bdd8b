//! `Autodiff<B>` residual add: one node whose backward gives the incoming gradient to both
//! operands.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;

use super::FusedAdd;

#[derive(Debug)]
struct AddBackward;

impl<B: FusedAdd> Backward<B, 2> for AddBackward {
    /// Nothing: the derivative of a sum is 1 for both operands.
    type State = ();

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        match ops.parents {
            [Some(a), Some(b)] => {
                grads.register::<B>(a.id, grad.clone());
                grads.register::<B>(b.id, grad);
            }
            [Some(a), None] => grads.register::<B>(a.id, grad),
            [None, Some(b)] => grads.register::<B>(b.id, grad),
            [None, None] => {}
        }
    }
}

impl<B: FusedAdd, C: CheckpointStrategy> FusedAdd for Autodiff<B, C> {
    fn fused_add(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        match AddBackward.prepare::<C>([a.node.clone(), b.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((), B::fused_add(a.primitive, b.primitive)),
            OpsKind::UnTracked(prep) => prep.finish(B::fused_add(a.primitive, b.primitive)),
        }
    }
}
