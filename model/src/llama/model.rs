//! The Llama model: embedding, decoder layers, final RMSNorm, LM head.

use burn::module::Module;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use super::block::{rms_norm, LlamaLayer};
use super::config::LlamaConfig;
use super::rope::rope_tables;
use crate::attention::KvCache;
use crate::decoder::{new_positions, through_blocks, BlockInputs, Decoder};
use crate::error::ConfigError;
use crate::init;
use crate::ops::norm::rms_norm_module;
use crate::packing::Packing;

/// The body of a Llama model (Hugging Face `LlamaModel`, saved under `model.`).
#[derive(Module, Debug)]
pub struct LlamaBody<B: Backend> {
    /// Token embedding `[vocab_size, d_model]`.
    pub embed_tokens: Embedding<B>,
    /// Decoder layers.
    pub layers: Vec<LlamaLayer<B>>,
    /// Final RMSNorm.
    pub norm: RmsNorm<B>,
}

/// A Llama-style decoder-only Transformer (Touvron et al. 2023; Hugging Face
/// `LlamaForCausalLM`): parameter paths `model.embed_tokens`, `model.layers.{i}.self_attn.
/// q_proj`, …, `lm_head` mirror Hugging Face's.
#[derive(Module, Debug)]
pub struct Llama<B: Backend> {
    /// Embedding, layers and final norm.
    pub model: LlamaBody<B>,
    /// Untied LM head `[d_model, vocab_size]`; `None` when tied to the embedding.
    pub lm_head: Option<Linear<B>>,
    block_size: usize,
    rope_theta: f64,
    n_head: usize,
}

impl LlamaConfig {
    /// Builds a freshly initialized [`Llama`] on `device`: Linear and embedding weights
    /// ~ N(0, 0.02), RMSNorm gains 1 (Hugging Face `LlamaPreTrainedModel._init_weights`).
    ///
    /// Errors: the config fails [`LlamaConfig::validate`].
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Llama<B>, ConfigError> {
        let model = self.build(device)?;
        init::materialize(&model);
        Ok(model)
    }

    /// The model with its parameters not yet drawn (Burn draws them at first use): its
    /// shapes, without their memory.
    pub(crate) fn build<B: Backend>(&self, device: &B::Device) -> Result<Llama<B>, ConfigError> {
        self.validate()?;
        let (v, c) = (self.vocab_size, self.d_model);
        Ok(Llama {
            model: LlamaBody {
                embed_tokens: Embedding { weight: init::normal([v, c], init::INIT_STD, device) },
                layers: (0..self.n_layer).map(|_| LlamaLayer::new(self, device)).collect(),
                norm: rms_norm(self, device),
            },
            lm_head: (!self.tie_embeddings).then(|| init::linear(c, v, false, init::INIT_STD, device)),
            block_size: self.block_size,
            rope_theta: self.rope_theta,
            n_head: self.n_head,
        })
    }
}

impl<B: Backend> Decoder<B> for Llama<B> {
    fn hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3> {
        let positions = new_positions(&tokens, &cache, packing, self.block_size);
        let (cos, sin) = self.rope(positions);
        let x = self.model.embed_tokens.forward(tokens);
        let layers = &self.model.layers;
        let x = through_blocks(x, layers.len(), cache, |i, x, cache| {
            layers[i].forward(x, cos.clone(), sin.clone(), cache, packing)
        });
        self.final_norm(x)
    }

    fn embed(&self, tokens: Tensor<B, 2, Int>, _packing: Option<&Packing<B>>) -> Tensor<B, 3> {
        self.model.embed_tokens.forward(tokens)
    }

    fn block_inputs(&self, tokens: &Tensor<B, 2, Int>, packing: Option<&Packing<B>>) -> BlockInputs<B> {
        BlockInputs { rope: Some(self.rope(new_positions(tokens, &None, packing, self.block_size))) }
    }

    fn block(
        &self,
        layer: usize,
        x: Tensor<B, 3>,
        inputs: &BlockInputs<B>,
        packing: Option<&Packing<B>>,
    ) -> Tensor<B, 3> {
        let (cos, sin) = inputs.rope.clone().expect("Llama's block inputs carry the RoPE tables");
        self.model.layers[layer].forward(x, cos, sin, None, packing)
    }

    fn final_norm(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        rms_norm_module(&self.model.norm, x)
    }

    /// Hidden states `[batch, seq_len, d_model]` → logits `[batch, seq_len, vocab]`.
    fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        init::lm_logits(hidden, self.lm_head.as_ref(), &self.model.embed_tokens.weight)
    }

    fn n_layer(&self) -> usize {
        self.model.layers.len()
    }

    fn block_size(&self) -> usize {
        self.block_size
    }
}

impl<B: Backend> Llama<B> {
    /// RoPE `(cos, sin)` tables of `positions` (`[1 or batch, seq_len]`) for this model's
    /// head size and θ.
    fn rope(&self, positions: Tensor<B, 2, Int>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let d_head = self.model.embed_tokens.weight.dims()[1] / self.n_head;
        rope_tables(positions, d_head, self.rope_theta)
    }
}
