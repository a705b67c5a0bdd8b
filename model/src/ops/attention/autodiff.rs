//! `Autodiff<B>` attention: one graph node whose state is the inputs (the tensors themselves,
//! no copies), the output and the per-row log-sum-exp — nothing of size `T²` — and whose
//! backward calls the inner backend's fused backward.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};

use super::FusedAttention;
use crate::ops::grads::register_grad;

#[derive(Debug)]
struct AttentionBackward;

/// What the backward of [`FusedAttention::fused_attention`] keeps.
#[derive(Debug, Clone)]
struct AttentionState<B: FusedAttention> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    positions: Option<IntTensor<B>>,
}

impl<B: FusedAttention> Backward<B, 3> for AttentionBackward {
    type State = AttentionState<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let AttentionState { q, k, v, out, lse, positions } = ops.state;
        let dout = grads.consume::<B>(&ops.node);
        let (dq, dk, dv) = B::fused_attention_backward(q, k, v, out, lse, dout, positions);
        for (node, grad) in ops.parents.into_iter().zip([dq, dk, dv]) {
            if let Some(node) = node {
                register_grad!(grads, B, node, grad);
            }
        }
    }
}

#[derive(Debug)]
struct AttentionQkvBackward;

/// What the backward of [`FusedAttention::fused_attention_qkv`] keeps.
#[derive(Debug, Clone)]
struct AttentionQkvState<B: FusedAttention> {
    qkv: FloatTensor<B>,
    n_head: usize,
    out: FloatTensor<B>,
    lse: FloatTensor<B>,
    positions: Option<IntTensor<B>>,
}

impl<B: FusedAttention> Backward<B, 1> for AttentionQkvBackward {
    type State = AttentionQkvState<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let AttentionQkvState { qkv, n_head, out, lse, positions } = ops.state;
        let dout = grads.consume::<B>(&ops.node);
        if let [Some(node)] = ops.parents {
            let dqkv = B::fused_attention_qkv_backward(qkv, n_head, out, lse, dout, positions);
            register_grad!(grads, B, node, dqkv);
        }
    }
}

impl<B: FusedAttention, C: CheckpointStrategy> FusedAttention for Autodiff<B, C> {
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
        match AttentionBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, lse) = B::fused_attention_forward(
                    q.primitive.clone(),
                    k.primitive.clone(),
                    v.primitive.clone(),
                    positions.clone(),
                );
                let state = AttentionState {
                    q: q.primitive,
                    k: k.primitive,
                    v: v.primitive,
                    out: out.clone(),
                    lse,
                    positions,
                };
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::fused_attention(q.primitive, k.primitive, v.primitive, positions))
            }
        }
    }

    fn fused_attention_qkv(
        qkv: FloatTensor<Self>,
        n_head: usize,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        match AttentionQkvBackward.prepare::<C>([qkv.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, lse) =
                    B::fused_attention_qkv_forward(qkv.primitive.clone(), n_head, positions.clone());
                let state =
                    AttentionQkvState { qkv: qkv.primitive, n_head, out: out.clone(), lse, positions };
                prep.finish(state, out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_attention_qkv(qkv.primitive, n_head, positions)),
        }
    }
}
