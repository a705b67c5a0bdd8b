//! `Autodiff<B>` matmul: one node whose backward calls the inner backend's fused products.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;

use super::FusedMatmul;
use crate::ops::grads::register_grad;

#[derive(Debug)]
struct MatmulBackward;

impl<B: FusedMatmul> Backward<B, 2> for MatmulBackward {
    /// Both inputs (the existing tensors, no copies).
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, w) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let [x_node, w_node] = ops.parents;
        let (dx, dw) = B::fused_matmul_backward(x, w, dy, x_node.is_some(), w_node.is_some());
        if let (Some(node), Some(dw)) = (w_node, dw) {
            register_grad!(grads, B, node, dw);
        }
        if let (Some(node), Some(dx)) = (x_node, dx) {
            register_grad!(grads, B, node, dx);
        }
    }
}

#[derive(Debug)]
struct MatmulBf16Backward;

impl<B: FusedMatmul> Backward<B, 2> for MatmulBf16Backward {
    /// Both f32 inputs (the existing tensors: no 16-bit copies are kept).
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, w) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let [x_node, w_node] = ops.parents;
        let (dx, dw) = B::fused_matmul_bf16_backward(x, w, dy, x_node.is_some(), w_node.is_some());
        if let (Some(node), Some(dw)) = (w_node, dw) {
            register_grad!(grads, B, node, dw);
        }
        if let (Some(node), Some(dx)) = (x_node, dx) {
            register_grad!(grads, B, node, dx);
        }
    }
}

impl<B: FusedMatmul, C: CheckpointStrategy> FusedMatmul for Autodiff<B, C> {
    fn fused_matmul_bf16(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match MatmulBf16Backward.prepare::<C>([x.node.clone(), w.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::fused_matmul_bf16(x.primitive.clone(), w.primitive.clone());
                prep.finish((x.primitive, w.primitive), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_matmul_bf16(x.primitive, w.primitive)),
        }
    }

    fn fused_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match MatmulBackward.prepare::<C>([x.node.clone(), w.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::fused_matmul(x.primitive.clone(), w.primitive.clone());
                prep.finish((x.primitive, w.primitive), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_matmul(x.primitive, w.primitive)),
        }
    }
}
