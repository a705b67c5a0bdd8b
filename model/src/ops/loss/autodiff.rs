//! `Autodiff<B>` cross-entropy: one graph node whose state is the logits and targets (shared
//! handles, no copies) and the per-row log-sum-exp statistics `[N, 2]`; its backward is the inner backend's.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, IntTensor};

use super::FusedCrossEntropy;

#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: FusedCrossEntropy> Backward<B, 1> for CrossEntropyBackward {
    /// Logits `[N, V]`, targets `[N]`, row statistics `[N, 2]`, ignore index.
    type State = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>, i64);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (logits, targets, stats, ignore_index) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::fused_cross_entropy_backward(logits, targets, stats, grad, ignore_index)
        });
    }
}

impl<B: FusedCrossEntropy, C: CheckpointStrategy> FusedCrossEntropy for Autodiff<B, C> {
    /// The sum is differentiable with respect to the logits; the returned statistics are a
    /// constant.
    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        ignore_index: i64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        match CrossEntropyBackward.prepare::<C>([logits.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (sum, stats) =
                    B::fused_cross_entropy(logits.primitive.clone(), targets.clone(), ignore_index);
                let sum = prep.finish((logits.primitive, targets, stats.clone(), ignore_index), sum);
                (sum, Self::from_inner(stats))
            }
            OpsKind::UnTracked(prep) => {
                let (sum, stats) = B::fused_cross_entropy(logits.primitive, targets, ignore_index);
                (prep.finish(sum), Self::from_inner(stats))
            }
        }
    }

    /// The inner backend's backward on the primitives (a constant: no second derivative).
    fn fused_cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        stats: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        ignore_index: i64,
    ) -> FloatTensor<Self> {
        Self::from_inner(B::fused_cross_entropy_backward(
            logits.primitive,
            targets,
            stats.primitive,
            grad.primitive,
            ignore_index,
        ))
    }
}
