//! [`LanguageModel`]: one type for every architecture, chosen by [`ModelConfig`].

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};
use serde::{Deserialize, Serialize};

use crate::attention::KvCache;
use crate::decoder::Decoder;
use crate::error::ConfigError;
use crate::gpt::config::GptConfig;
use crate::gpt::model::Gpt;
use crate::llama::config::LlamaConfig;
use crate::llama::model::Llama;

/// The element count of each float parameter tensor of `module`, in module visiting order
/// (`Module::visit`); parameters not yet drawn stay undrawn (their lazy shapes are read).
pub fn param_sizes<B: Backend, M: Module<B>>(module: &M) -> Vec<usize> {
    struct Sizes(Vec<usize>);
    impl<B: Backend> burn::module::ModuleVisitor<B> for Sizes {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            self.0.push(param.lazy_shape().num_elements());
        }
    }
    let mut sizes = Sizes(Vec::new());
    module.visit(&mut sizes);
    sizes.0
}

/// The configuration of any supported architecture, tagged by `arch` in files
/// (`arch = "gpt2"` or `arch = "llama"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "arch")]
pub enum ModelConfig {
    /// GPT-2.
    #[serde(rename = "gpt2")]
    Gpt2(GptConfig),
    /// Llama-style.
    #[serde(rename = "llama")]
    Llama(LlamaConfig),
}

/// Names accepted by [`ModelConfig::preset`].
pub fn preset_names() -> Vec<&'static str> {
    crate::gpt::config::PRESETS.iter().chain(crate::llama::config::LLAMA_PRESETS).copied().collect()
}

impl ModelConfig {
    /// A named preset of either architecture (see [`GptConfig::preset`],
    /// [`LlamaConfig::preset`]); `None` if unknown.
    pub fn preset(name: &str) -> Option<ModelConfig> {
        GptConfig::preset(name)
            .map(ModelConfig::Gpt2)
            .or_else(|| LlamaConfig::preset(name).map(ModelConfig::Llama))
    }

    /// Builds a freshly initialized model (seed the backend first).
    ///
    /// Errors: the config is invalid (the field is named).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<LanguageModel<B>, ConfigError> {
        Ok(match self {
            ModelConfig::Gpt2(c) => LanguageModel::Gpt2(c.init(device)?),
            ModelConfig::Llama(c) => LanguageModel::Llama(c.init(device)?),
        })
    }

    /// The element count of each parameter tensor, in module visiting order (`Module::visit`),
    /// without allocating them: the model is built with its parameters not yet drawn.
    ///
    /// Errors: the config is invalid (the field is named).
    pub fn param_sizes(&self) -> Result<Vec<usize>, ConfigError> {
        type Shapes = burn::backend::Flex;
        let device = Default::default();
        Ok(match self {
            ModelConfig::Gpt2(c) => param_sizes(&c.build::<Shapes>(&device)?),
            ModelConfig::Llama(c) => param_sizes(&c.build::<Shapes>(&device)?),
        })
    }

    /// Checks the configuration (see the architectures' `validate`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            ModelConfig::Gpt2(c) => c.validate(),
            ModelConfig::Llama(c) => c.validate(),
        }
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.vocab_size,
            ModelConfig::Llama(c) => c.vocab_size,
        }
    }

    /// Sets the vocabulary size.
    pub fn set_vocab_size(&mut self, vocab_size: usize) {
        match self {
            ModelConfig::Gpt2(c) => c.vocab_size = vocab_size,
            ModelConfig::Llama(c) => c.vocab_size = vocab_size,
        }
    }

    /// Context length.
    pub fn block_size(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.block_size,
            ModelConfig::Llama(c) => c.block_size,
        }
    }

    /// Transformer blocks.
    pub fn n_layer(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.n_layer,
            ModelConfig::Llama(c) => c.n_layer,
        }
    }

    /// Parameter count of the model it builds.
    pub fn num_params(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.num_params(),
            ModelConfig::Llama(c) => c.num_params(),
        }
    }

    /// The `arch` tag: `"gpt2"` or `"llama"`.
    pub fn arch(&self) -> &'static str {
        match self {
            ModelConfig::Gpt2(_) => "gpt2",
            ModelConfig::Llama(_) => "llama",
        }
    }
}

/// A decoder-only language model of any supported architecture.
// The variants are large structs of tensor handles, built once per run: boxing them would
// change the module paths Burn records and saves.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum LanguageModel<B: Backend> {
    /// GPT-2.
    Gpt2(Gpt<B>),
    /// Llama-style.
    Llama(Llama<B>),
}

impl<B: Backend> LanguageModel<B> {
    /// The architecture's model, as the shared decoder skeleton.
    pub fn decoder(&self) -> &dyn Decoder<B> {
        match self {
            LanguageModel::Gpt2(m) => m,
            LanguageModel::Llama(m) => m,
        }
    }

    /// Logits for every position: `tokens` `[batch, seq_len]` → `[batch, seq_len, vocab]`
    /// (position `t` scores token `t + 1`); see [`Decoder::forward`].
    ///
    /// # Panics
    /// If `seq_len > block_size`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.decoder().forward(tokens)
    }

    /// Logits of rows packing several documents (see [`crate::Packing`],
    /// [`Decoder::forward_packed`]).
    pub fn forward_packed(&self, tokens: Tensor<B, 2, Int>, packing: &crate::Packing<B>) -> Tensor<B, 3> {
        self.decoder().forward_packed(tokens, packing)
    }

    /// Incremental decoding (see [`Decoder::forward_cached`]).
    pub fn forward_cached(&self, tokens: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Tensor<B, 3> {
        self.decoder().forward_cached(tokens, cache)
    }

    /// An empty KV cache.
    pub fn new_cache(&self) -> KvCache<B> {
        self.decoder().new_cache()
    }

    /// Context length.
    pub fn block_size(&self) -> usize {
        self.decoder().block_size()
    }

    /// Number of trainable parameters (a tied head counted once).
    pub fn num_params(&self) -> usize {
        Module::num_params(self)
    }
}
