//! GPT-2 parameter initialization (Radford et al. 2019, §2.3; nanoGPT `_init_weights`):
//! weights ~ N(0, 0.02), residual output projections ~ N(0, 0.02/√(2·n_layer)), biases 0,
//! LayerNorm gain 1 and bias 0.

use burn::module::{Initializer, Param};
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// Standard deviation of GPT-2's weight initialization.
pub const INIT_STD: f64 = 0.02;

/// Standard deviation for the output projections that write into the residual stream
/// (`attn.c_proj`, `mlp.c_proj`): `0.02 / √(2·n_layer)`, because each block adds two of them.
pub fn residual_std(n_layer: usize) -> f64 {
    INIT_STD / (2.0 * n_layer as f64).sqrt()
}

/// A `[d_input, d_output]` Linear with weights ~ N(0, `std`) and, if `bias`, a zero bias.
/// (Burn's `LinearConfig` draws the bias from the same initializer as the weight.)
pub fn linear<B: Backend>(
    d_input: usize,
    d_output: usize,
    bias: bool,
    std: f64,
    device: &B::Device,
) -> Linear<B> {
    Linear {
        weight: normal([d_input, d_output], std, device),
        bias: bias.then(|| Initializer::Zeros.init([d_output], device)),
    }
}

/// A parameter of `shape` drawn from N(0, `std`).
pub fn normal<B: Backend>(shape: [usize; 2], std: f64, device: &B::Device) -> Param<Tensor<B, 2>> {
    Initializer::Normal { mean: 0.0, std }.init(shape, device)
}

/// Draws every lazily initialized parameter of `module` now, in visiting order.
///
/// Burn initializes parameters at first use, and a clone of an uninitialized parameter draws
/// its own values; materializing right after construction makes the weights depend only on
/// the backend seed set before it.
pub fn materialize<B: Backend, M: burn::module::Module<B>>(module: &M) {
    struct Materialize;
    impl<B: Backend> burn::module::ModuleVisitor<B> for Materialize {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    module.visit(&mut Materialize);
}

/// Logits `[batch, seq_len, vocab]` of hidden states `[batch, seq_len, d_model]`: through an
/// untied `head` (`[d_model, vocab]`), or through `embeddingᵀ` (`embedding` is
/// `[vocab, d_model]`) when tied.
///
/// The tied transpose stays a strided view: `burn::tensor::module::linear(h, Eᵀ)` reshapes the
/// transposed weight, which on burn-flex copies the whole `[vocab, d_model]` matrix at every
/// call (it was most of a 124M model's decoding time).
pub fn lm_logits<B: Backend>(
    hidden: Tensor<B, 3>,
    head: Option<&Linear<B>>,
    embedding: &Param<Tensor<B, 2>>,
) -> Tensor<B, 3> {
    // On the `[batch·seq_len, d_model]` view: one matmul, and one for the weight gradient
    // (see [`crate::ops::linear`]).
    match head {
        Some(head) => crate::ops::linear(head, hidden),
        None => {
            let [batch, seq_len, d_model] = hidden.dims();
            let logits = crate::ops::linear::matmul(
                hidden.reshape([batch * seq_len, d_model]),
                embedding.val().transpose(),
            );
            let vocab = logits.dims()[1];
            logits.reshape([batch, seq_len, vocab])
        }
    }
}
