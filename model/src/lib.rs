//! # ember-model
//!
//! Decoder-only Transformers for [Burn](https://burn.dev), generic over any `B: Backend`:
//! GPT-2 ([`Gpt`]) and Llama-style ([`Llama`]) models with Hugging Face-compatible parameter
//! paths, safetensors import/export ([`hf`]), a KV cache and generation ([`generate()`]).
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Int, Tensor};
//! use ember_model::{Decoder, GptConfig};
//!
//! let device = Default::default();
//! let model = GptConfig::preset("tiny").unwrap().init::<Flex>(&device).unwrap();
//! let tokens = Tensor::<Flex, 2, Int>::from_ints([[1, 2, 3], [4, 5, 6]], &device);
//! let logits = model.forward(tokens); // [batch 2, seq_len 3, vocab 64]
//! assert_eq!(logits.dims(), [2, 3, 64]);
//! ```
//!
//! The crate depends on Burn only: no data, training or CLI code.
#![warn(missing_docs)]

pub mod attention;
pub mod checkpoint;
pub mod decoder;
pub mod dropout;
pub mod error;
pub mod generate;
pub mod gpt;
pub mod hf;
pub mod init;
pub mod llama;
pub mod lm;
pub mod ops;
pub mod packing;
pub mod precision;

pub use attention::{attention_reference, causal_attention, KvCache};
pub use checkpoint::{backward_checkpointed, ActivationCheckpointing};
pub use decoder::{BlockInputs, Decoder};
pub use dropout::with_dropout_seed;
pub use error::ConfigError;
pub use generate::{argmax, generate};
pub use gpt::config::{GeluKind, GptConfig, PRESETS};
pub use gpt::model::Gpt;
pub use llama::config::{LlamaConfig, LLAMA_PRESETS};
pub use llama::model::Llama;
pub use lm::{LanguageModel, ModelConfig};
pub use packing::Packing;
pub use precision::{autocast, Precision};

#[cfg(test)]
mod tests;
