//! `Autodiff<B>` activations: one graph node per activation, whose backward calls the inner
//! backend's fused backward (instead of Burn differentiating each composed op).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;

use super::FusedActivation;
use crate::ops::grads::register_grad;
use crate::GeluKind;

#[derive(Debug)]
struct GeluBackward;

impl<B: FusedActivation> Backward<B, 1> for GeluBackward {
    /// The input and the form.
    type State = (FloatTensor<B>, GeluKind);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, kind) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| B::fused_gelu_backward(x, grad, kind));
    }
}

#[derive(Debug)]
struct BiasGeluBackward;

impl<B: FusedActivation> Backward<B, 2> for BiasGeluBackward {
    /// The input before the bias, the bias and the form (`x + bias` is recomputed).
    type State = (FloatTensor<B>, FloatTensor<B>, GeluKind);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (x, bias, kind) = ops.state;
        let grad = grads.consume::<B>(&ops.node);
        let (dx, dbias) = B::fused_bias_gelu_backward(x, bias, grad, kind);
        let [x_node, bias_node] = ops.parents;
        if let Some(node) = bias_node {
            register_grad!(grads, B, node, dbias);
        }
        if let Some(node) = x_node {
            register_grad!(grads, B, node, dx);
        }
    }
}

#[derive(Debug)]
struct SwigluBackward;

impl<B: FusedActivation> Backward<B, 2> for SwigluBackward {
    /// Both inputs.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (gate, up) = ops.state;
        let grad = grads.consume::<B>(&ops.node);
        let (dgate, dup) = B::fused_swiglu_backward(gate, up, grad);
        let [gate_node, up_node] = ops.parents;
        if let Some(node) = gate_node {
            register_grad!(grads, B, node, dgate);
        }
        if let Some(node) = up_node {
            register_grad!(grads, B, node, dup);
        }
    }
}

impl<B: FusedActivation, C: CheckpointStrategy> FusedActivation for Autodiff<B, C> {
    fn fused_gelu(x: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        match GeluBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::fused_gelu(x.primitive.clone(), kind);
                prep.finish((x.primitive, kind), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_gelu(x.primitive, kind)),
        }
    }

    fn fused_bias_gelu(x: FloatTensor<Self>, bias: FloatTensor<Self>, kind: GeluKind) -> FloatTensor<Self> {
        match BiasGeluBackward.prepare::<C>([x.node.clone(), bias.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::fused_bias_gelu(x.primitive.clone(), bias.primitive.clone(), kind);
                prep.finish((x.primitive, bias.primitive, kind), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_bias_gelu(x.primitive, bias.primitive, kind)),
        }
    }

    fn fused_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        match SwigluBackward.prepare::<C>([gate.node.clone(), up.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let y = B::fused_swiglu(gate.primitive.clone(), up.primitive.clone());
                prep.finish((gate.primitive, up.primitive), y)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::fused_swiglu(gate.primitive, up.primitive)),
        }
    }
}
