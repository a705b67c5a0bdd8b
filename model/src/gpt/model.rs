//! The GPT model: embeddings, blocks, final LayerNorm, LM head.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Embedding, LayerNorm, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use super::block::{layer_norm, Block};
use super::config::GptConfig;
use crate::attention::KvCache;
use crate::decoder::{new_positions, through_blocks, BlockInputs, Decoder};
use crate::dropout::dropout;
use crate::error::ConfigError;
use crate::init;
use crate::ops::norm::layer_norm_module;
use crate::ops::residual_add;
use crate::packing::Packing;

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
    /// `ln_f`'s ε (`GptConfig::layer_norm_eps`), a constant like `block_size`.
    ln_eps: f64,
}

impl GptConfig {
    /// Builds a freshly initialized [`Gpt`] on `device` (GPT-2 initialization, see
    /// [`crate::init`]). Seed the backend (`B::seed`) first for reproducible weights.
    ///
    /// Errors: the config fails [`GptConfig::validate`].
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Gpt<B>, ConfigError> {
        let model = self.build(device)?;
        init::materialize(&model);
        Ok(model)
    }

    /// The model with its parameters not yet drawn (Burn draws them at first use): its
    /// shapes, without their memory.
    pub(crate) fn build<B: Backend>(&self, device: &B::Device) -> Result<Gpt<B>, ConfigError> {
        self.validate()?;
        let (v, c) = (self.vocab_size, self.d_model);
        Ok(Gpt {
            wte: Embedding { weight: init::normal([v, c], init::INIT_STD, device) },
            wpe: Embedding { weight: init::normal([self.block_size, c], init::INIT_STD, device) },
            h: (0..self.n_layer).map(|_| Block::new(self, device)).collect(),
            ln_f: layer_norm(self, device),
            lm_head: (!self.tie_embeddings).then(|| init::linear(c, v, false, init::INIT_STD, device)),
            drop: DropoutConfig::new(self.dropout).init(),
            block_size: self.block_size,
            ln_eps: self.layer_norm_eps,
        })
    }
}

impl<B: Backend> Decoder<B> for Gpt<B> {
    fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3> {
        let positions = new_positions(&tokens, &cache, packing, self.block_size);
        let x = self.embed_at(tokens, positions);
        let x = through_blocks(x, self.h.len(), cache, |i, x, cache| self.h[i].forward(x, cache, packing));
        self.final_norm(x)
    }

    fn embed(&self, tokens: Tensor<B, 2, Int>, packing: Option<&Packing<B>>) -> Tensor<B, 3> {
        let positions = new_positions(&tokens, &None, packing, self.block_size);
        self.embed_at(tokens, positions)
    }

    fn block_inputs(&self, _tokens: &Tensor<B, 2, Int>, _packing: Option<&Packing<B>>) -> BlockInputs<B> {
        BlockInputs { rope: None }
    }

    fn block(
        &self,
        layer: usize,
        x: Tensor<B, 3>,
        _inputs: &BlockInputs<B>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3> {
        self.h[layer].forward(x, None, packing)
    }

    fn final_norm(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        layer_norm_module(&self.ln_f, x, self.ln_eps)
    }

    /// Projects hidden states `[batch, seq_len, d_model]` to logits `[batch, seq_len, vocab]`,
    /// through `wteᵀ` when tied.
    fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        init::lm_logits(hidden, self.lm_head.as_ref(), &self.wte.weight)
    }

    fn n_layer(&self) -> usize {
        self.h.len()
    }

    fn block_size(&self) -> usize {
        self.block_size
    }
}

impl<B: Backend> Gpt<B> {
    /// Token plus position embeddings of `tokens` at `positions` (`[1 or batch, seq_len]`),
    /// then dropout (stage 0 of [`crate::dropout`]): `[batch, seq_len, d_model]`.
    fn embed_at(&self, tokens: Tensor<B, 2, Int>, positions: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let x = residual_add(self.wte.forward(tokens), self.wpe.forward(positions)); // [B, T, C] + [1 or B, T, C]
        crate::dropout::enter_embeddings();
        dropout(&self.drop, x)
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
