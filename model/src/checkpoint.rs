//! Activation checkpointing per block (Chen et al. 2016, "Training deep nets with sublinear
//! memory cost"; PyTorch's `torch.utils.checkpoint`, torchtitan's per-layer AC): the forward
//! keeps only each Transformer block's input, and the backward recomputes one block at a time
//! from it.
//!
//! Burn 0.21 deadlocks when `backward()` runs inside a custom `Backward`, so the recompute is
//! driven from outside the graph, stage by stage ([`backward_checkpointed`]):
//! 1. the whole forward on the inner backend (no graph), keeping the `n_layer` block inputs
//!    `[batch, seq_len, d_model]` and the last block's output;
//! 2. final norm, LM head and loss with a graph on the last block's output, and their backward;
//! 3. for each block in reverse: the block again with a graph on its saved input, and the
//!    backward of `Σ (output ⊙ incoming gradient)` — whose gradient with respect to the
//!    output is exactly the incoming gradient — giving the gradient of the block's input and
//!    its parameters;
//! 4. the embeddings with a graph, back-propagating the first block's input gradient.
//!
//! Every dropout mask of a stage is drawn from a seed of its own ([`crate::dropout`]), so the
//! recompute sees the masks of the first pass, and the gradients equal one backward through
//! the whole graph (`activation_checkpointing = "none"`) up to the order of a few additions.
//! The cost is one more forward of the blocks (about 4/3 of the step's time); the memory of
//! the activations drops from every block's to one block's plus the saved inputs.

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};

use crate::dropout::{enter_block, training_without_graph};
use crate::lm::LanguageModel;
use crate::packing::Packing;

/// What a training forward keeps for its backward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationCheckpointing {
    /// Every activation the backward needs (one graph over the whole model).
    #[default]
    None,
    /// Only each block's input; each block is recomputed in the backward
    /// ([`backward_checkpointed`]).
    Blocks,
}

/// The backward of `scale × loss(logits(tokens))` with per-block activation checkpointing (see
/// the module docs). `tokens` `[batch, seq_len]` (with `packing` for packed documents), `loss`
/// maps the logits `[batch, seq_len, vocab]` to a `[1]` tensor. Each stage's gradients —
/// parameters, and nothing else — are handed to `collect` as they are computed (the head's,
/// then block `n_layer − 1` down to 0, then the embeddings'); a parameter read by two stages
/// (a tied `wte`) gets one part from each, for the caller to add. Returns the loss (not
/// scaled), without a graph.
///
/// Run inside [`crate::with_dropout_seed`] when the model has dropout: its masks are drawn
/// twice.
pub fn backward_checkpointed<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    tokens: Tensor<B, 2, Int>,
    packing: Option<&Packing<B>>,
    loss: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 1>,
    scale: f64,
    mut collect: impl FnMut(B::Gradients),
) -> Tensor<B::InnerBackend, 1> {
    let decoder = model.decoder();
    let n_layer = decoder.n_layer();
    // 1. The forward without a graph: the inner model shares the parameters' buffers.
    let inner_model = model.valid();
    let inner = inner_model.decoder();
    let inner_packing = packing.map(Packing::inner);
    let mut saved: Vec<Tensor<B::InnerBackend, 3>> = Vec::with_capacity(n_layer);
    let last = training_without_graph(|| {
        let tokens = tokens.clone().inner();
        let shared = inner.block_inputs(&tokens, inner_packing.as_ref());
        let mut x = inner.embed(tokens, inner_packing.as_ref());
        for layer in 0..n_layer {
            saved.push(x.clone());
            enter_block(layer);
            x = inner.block(layer, x, &shared, inner_packing.as_ref());
        }
        x
    });
    drop(inner_model);
    // 2. Final norm, head and loss, with a graph from the last block's output.
    let x = Tensor::<B, 3>::from_inner(last).require_grad();
    let value = loss(decoder.lm_head(decoder.final_norm(x.clone())));
    let scaled = if scale == 1.0 { value.clone() } else { value.clone().mul_scalar(scale) };
    let mut grads = scaled.backward();
    let mut incoming = input_grad(&x, &mut grads);
    collect(grads);
    // 3. Each block again, last first, with a graph from its saved input.
    let shared = decoder.block_inputs(&tokens, packing);
    for layer in (0..n_layer).rev() {
        let x = Tensor::<B, 3>::from_inner(saved.pop().expect("one saved input per block")).require_grad();
        enter_block(layer);
        let y = decoder.block(layer, x.clone(), &shared, packing);
        let mut grads = (y * Tensor::from_inner(incoming)).sum().backward();
        incoming = input_grad(&x, &mut grads);
        collect(grads);
    }
    // 4. The embeddings (their dropout is stage 0 again).
    let x = decoder.embed(tokens, packing);
    collect((x * Tensor::from_inner(incoming)).sum().backward());
    value.inner()
}

/// The gradient of a stage's input `x`, taken out of `grads`.
fn input_grad<B: AutodiffBackend>(x: &Tensor<B, 3>, grads: &mut B::Gradients) -> Tensor<B::InnerBackend, 3> {
    // Every stage reads its input, so autodiff always has its gradient.
    x.grad_remove(grads).expect("a stage's output depends on its input")
}
