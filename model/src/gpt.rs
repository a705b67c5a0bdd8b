//! The GPT model: embeddings, blocks, final LayerNorm, LM head.

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::{Dropout, DropoutConfig, Embedding, LayerNorm, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;
use burn::tensor::{Int, Tensor};

use crate::block::{layer_norm, Block};
use crate::config::{ConfigError, GptConfig};
use crate::init;

/// A GPT-2-style decoder-only Transformer (Radford et al. 2019; nanoGPT `model.py`).
///
/// Parameter paths mirror Hugging Face GPT-2 (`wte`, `wpe`, `h.{i}.attn.c_attn`, …, `ln_f`),
/// so weight import is a table. The model knows nothing of devices, ranks or data.
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    /// Token embedding `[vocab_size, d_model]`; also the LM head when tied.
    pub wte: Embedding<B>,
    /// Learned position embedding `[block_size, d_model]`.
    pub wpe: Embedding<B>,
    /// The Transformer blocks.
    pub h: Vec<Block<B>>,
    /// Final LayerNorm.
    pub ln_f: LayerNorm<B>,
    /// Untied LM head `[d_model, vocab_size]` (no bias); `None` when tied to `wte`.
    pub lm_head: Option<Linear<B>>,
    drop: Dropout,
    block_size: usize,
}

impl GptConfig {
    /// Builds a freshly initialized [`Gpt`] on `device` (GPT-2 initialization, see
    /// [`crate::init`]). Seed the backend (`B::seed`) first for reproducible weights.
    ///
    /// Errors: the config fails [`GptConfig::validate`].
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Gpt<B>, ConfigError> {
        self.validate()?;
        let (v, c) = (self.vocab_size, self.d_model);
        let model = Gpt {
            wte: Embedding {
                weight: init::normal([v, c], init::INIT_STD, device),
            },
            wpe: Embedding {
                weight: init::normal([self.block_size, c], init::INIT_STD, device),
            },
            h: (0..self.n_layer)
                .map(|_| Block::new(self, device))
                .collect(),
            ln_f: layer_norm(self, device),
            lm_head: (!self.tie_embeddings)
                .then(|| init::linear(c, v, false, init::INIT_STD, device)),
            drop: DropoutConfig::new(self.dropout).init(),
            block_size: self.block_size,
        };
        // Burn initializes parameters lazily, at first use, and a clone of an uninitialized
        // parameter draws its own values. Draw them all now, in a fixed order, so the weights
        // depend only on the backend seed set before this call.
        model.visit(&mut Materialize);
        Ok(model)
    }
}

impl<B: Backend> Gpt<B> {
    /// Logits for every position (teacher forcing).
    ///
    /// `tokens`: `[batch, seq_len]` ids in `[0, vocab_size)`, `seq_len ≤ block_size`.
    /// Returns `[batch, seq_len, vocab_size]` unnormalized logits; position `t` scores token
    /// `t + 1`.
    ///
    /// # Panics
    /// If `seq_len > block_size` (callers crop; the CLI validates before calling).
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let hidden = self.forward_hidden(tokens);
        self.lm_head(hidden)
    }

    /// The final hidden states after `ln_f`: `[batch, seq_len]` → `[batch, seq_len, d_model]`.
    pub fn forward_hidden(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [_, seq_len] = tokens.dims();
        assert!(
            seq_len <= self.block_size,
            "sequence of {seq_len} tokens is longer than the context length (block_size {})",
            self.block_size
        );
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq_len as i64, &device).unsqueeze::<2>();
        let x = self.wte.forward(tokens) + self.wpe.forward(positions); // [B, T, C] + [1, T, C]
        let x = self.drop.forward(x);
        let x = self.h.iter().fold(x, |x, block| block.forward(x));
        self.ln_f.forward(x)
    }

    /// Projects hidden states `[batch, seq_len, d_model]` to logits `[batch, seq_len, vocab]`,
    /// through `wteᵀ` when tied.
    pub fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        match &self.lm_head {
            Some(head) => head.forward(hidden),
            None => linear(hidden, self.wte.weight.val().transpose(), None),
        }
    }

    /// Context length (the most positions [`Gpt::forward`] accepts).
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of trainable parameters (a tied head counted once). Equals
    /// [`GptConfig::num_params`] of the config that built it.
    pub fn num_params(&self) -> usize {
        Module::num_params(self)
    }

    /// [`Gpt::num_params`] without the position embedding (nanoGPT's "non-embedding" count,
    /// which keeps `wte` because it is also the output layer).
    pub fn num_params_without_positions(&self) -> usize {
        self.num_params() - self.wpe.weight.val().shape().num_elements()
    }
}

/// Forces lazy parameter initialization (see [`GptConfig::init`]).
struct Materialize;

impl<B: Backend> ModuleVisitor<B> for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }
}
