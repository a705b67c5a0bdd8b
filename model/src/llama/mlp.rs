//! The SwiGLU feed-forward block.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::config::LlamaConfig;
use crate::{init, ops};

/// `down_proj(SiLU(gate_proj(x)) ⊙ up_proj(x))` (Shazeer 2020, eq. 6, FFN_SwiGLU; Hugging
/// Face `LlamaMLP`): `[.., d_model] → [.., d_ff] → [.., d_model]`, no biases.
#[derive(Module, Debug)]
pub struct LlamaMlp<B: Backend> {
    /// `[d_model, d_ff]`.
    pub gate_proj: Linear<B>,
    /// `[d_model, d_ff]`.
    pub up_proj: Linear<B>,
    /// `[d_ff, d_model]`.
    pub down_proj: Linear<B>,
}

impl<B: Backend> LlamaMlp<B> {
    /// Builds the block; weights ~ N(0, 0.02).
    pub fn new(config: &LlamaConfig, device: &B::Device) -> Self {
        let (c, f) = (config.d_model, config.d_ff);
        let linear = |i, o| init::linear(i, o, false, init::INIT_STD, device);
        Self { gate_proj: linear(c, f), up_proj: linear(c, f), down_proj: linear(f, c) }
    }

    /// `x`: `[batch, seq_len, d_model]` → `[batch, seq_len, d_model]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let hidden = ops::swiglu(ops::linear(&self.gate_proj, x.clone()), ops::linear(&self.up_proj, x)); // fused
        ops::linear(&self.down_proj, hidden)
    }
}
