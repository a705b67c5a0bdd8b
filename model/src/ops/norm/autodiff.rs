//! `Autodiff<B>` norms: one graph node per norm, whose state is `x` (the tensor that already
//! exists), `γ` and the per-row statistics, and whose backward calls the inner backend's fused
//! backward (instead of Burn keeping and differentiating every composed op).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;

use super::FusedNorm;
use crate::ops::grads::register_grad;

/// LayerNorm with a bias: parents `[x, γ, β]`.
#[derive(Debug)]
struct LayerNormBackward;

/// LayerNorm without a bias: parents `[x, γ]`.
#[derive(Debug)]
struct LayerNormNoBiasBackward;

/// `(x, γ, mean, rstd)`.
type LayerNormState<B> = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

/// Registers each gradient whose parent requires one (`None`: a constant, or a parameter that
/// does not require grad).
macro_rules! register {
    ($grads:expr, $parents:expr, $values:expr) => {
        for (parent, value) in $parents.into_iter().zip($values) {
            if let Some(node) = parent {
                register_grad!($grads, B, node, value);
            }
        }
    };
}

impl<B: FusedNorm> Backward<B, 3> for LayerNormBackward {
    type State = LayerNormState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, gamma, mean, rstd) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dgamma, dbeta) = B::fused_layer_norm_backward(dy, x, gamma, mean, rstd);
        register!(grads, ops.parents, [dx, dgamma, dbeta]);
    }
}

impl<B: FusedNorm> Backward<B, 2> for LayerNormNoBiasBackward {
    type State = LayerNormState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, gamma, mean, rstd) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dgamma, _) = B::fused_layer_norm_backward(dy, x, gamma, mean, rstd);
        register!(grads, ops.parents, [dx, dgamma]);
    }
}

/// RMSNorm: parents `[x, γ]`.
#[derive(Debug)]
struct RmsNormBackward;

impl<B: FusedNorm> Backward<B, 2> for RmsNormBackward {
    /// `(x, γ, rstd)`.
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, gamma, rstd) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let (dx, dgamma) = B::fused_rms_norm_backward(dy, x, gamma, rstd);
        register!(grads, ops.parents, [dx, dgamma]);
    }
}

impl<B: FusedNorm, C: CheckpointStrategy> FusedNorm for Autodiff<B, C> {
    fn fused_layer_norm(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> FloatTensor<Self> {
        let forward =
            |beta| B::fused_layer_norm_forward(x.primitive.clone(), gamma.primitive.clone(), beta, eps);
        // The statistics are computed only when a backward will use them (a tracked node).
        match beta {
            Some(beta) => {
                let nodes = [x.node.clone(), gamma.node.clone(), beta.node.clone()];
                match LayerNormBackward.prepare::<C>(nodes).compute_bound().stateful() {
                    OpsKind::Tracked(prep) => {
                        let (y, mean, rstd) = forward(Some(beta.primitive));
                        prep.finish((x.primitive, gamma.primitive, mean, rstd), y)
                    }
                    OpsKind::UnTracked(prep) => prep.finish(B::fused_layer_norm(
                        x.primitive,
                        gamma.primitive,
                        Some(beta.primitive),
                        eps,
                    )),
                }
            }
            None => match LayerNormNoBiasBackward
                .prepare::<C>([x.node.clone(), gamma.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (y, mean, rstd) = forward(None);
                    prep.finish((x.primitive, gamma.primitive, mean, rstd), y)
                }
                OpsKind::UnTracked(prep) => {
                    prep.finish(B::fused_layer_norm(x.primitive, gamma.primitive, None, eps))
                }
            },
        }
    }

    fn fused_rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        match RmsNormBackward.prepare::<C>([x.node.clone(), gamma.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (y, rstd) = B::fused_rms_norm_forward(x.primitive.clone(), gamma.primitive.clone(), eps);
                prep.finish((x.primitive, gamma.primitive, rstd), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_rms_norm(x.primitive, gamma.primitive, eps)),
        }
    }
}
