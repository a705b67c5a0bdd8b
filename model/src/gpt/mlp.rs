//! The position-wise feed-forward block: `c_proj(GELU(c_fc(x)))` with a 4× hidden width.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::config::{GeluKind, GptConfig};
use crate::dropout::dropout;
use crate::{init, ops};

/// GPT-2's MLP (Radford et al. 2018 §3.1; Vaswani et al. 2017 eq. 2 with GELU):
/// `[batch, seq_len, d_model] → [.., 4·d_model] → GELU → [.., d_model]`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// Up projection `[d_model, 4·d_model]`.
    pub c_fc: Linear<B>,
    /// Down projection `[4·d_model, d_model]` (a residual output: scaled init).
    pub c_proj: Linear<B>,
    dropout: Dropout,
    exact_gelu: bool,
}

impl<B: Backend> Mlp<B> {
    /// Builds the block with GPT-2 initialization (see [`crate::init`]).
    pub fn new(config: &GptConfig, device: &B::Device) -> Self {
        let c = config.d_model;
        Self {
            c_fc: init::linear(c, 4 * c, config.bias, init::INIT_STD, device),
            c_proj: init::linear(4 * c, c, config.bias, init::residual_std(config.n_layer), device),
            dropout: DropoutConfig::new(config.dropout).init(),
            exact_gelu: config.gelu == GeluKind::Erf,
        }
    }

    /// `x`: `[batch, seq_len, d_model]` → `[batch, seq_len, d_model]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let kind = if self.exact_gelu { GeluKind::Erf } else { GeluKind::Tanh };
        let h = ops::linear_gelu(&self.c_fc, x, kind); // bias and GELU fused: one pass, its own backward
        dropout(&self.dropout, ops::linear(&self.c_proj, h))
    }
}
