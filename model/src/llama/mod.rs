//! Llama-style models (Touvron et al. 2023) in the Hugging Face `LlamaForCausalLM` layout.

pub mod attention;
pub mod block;
pub mod config;
pub mod mlp;
pub mod model;
pub mod rope;
