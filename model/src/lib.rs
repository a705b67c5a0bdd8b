//! # ember-model
//!
//! GPT-2-style decoder-only Transformers for [Burn](https://burn.dev), generic over any
//! `B: Backend`, with Hugging Face-compatible parameter paths.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Int, Tensor};
//! use ember_model::GptConfig;
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
pub mod block;
pub mod config;
pub mod gpt;
pub mod init;
pub mod mlp;

pub use attention::{attention_reference, CausalSelfAttention};
pub use block::Block;
pub use config::{ConfigError, GeluKind, GptConfig, PRESETS};
pub use gpt::Gpt;
pub use mlp::Mlp;

#[cfg(test)]
mod tests;
