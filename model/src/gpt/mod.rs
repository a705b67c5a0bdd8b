//! GPT-2 (Radford et al. 2019), as nanoGPT and Hugging Face `GPT2LMHeadModel` define it.

pub mod attention;
pub mod block;
pub mod config;
pub mod mlp;
pub mod model;
