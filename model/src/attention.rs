//! Causal multi-head self-attention with a fused q|k|v projection (GPT-2's `attn` block).

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Tensor};

use crate::config::GptConfig;
use crate::init;

/// Causal self-attention: `softmax(Q·Kᵀ/√d_head + causal mask)·V` per head (Vaswani et al.
/// 2017, eq. 1), heads concatenated and projected back. Parameter names follow Hugging Face
/// GPT-2 (`c_attn` = q|k|v fused, `c_proj`).
#[derive(Module, Debug)]
pub struct CausalSelfAttention<B: Backend> {
    /// Fused projection `[d_model, 3·d_model]`: columns are q, then k, then v.
    pub c_attn: Linear<B>,
    /// Output projection `[d_model, d_model]`.
    pub c_proj: Linear<B>,
    attn_dropout: Dropout,
    resid_dropout: Dropout,
    n_head: usize,
}

impl<B: Backend> CausalSelfAttention<B> {
    /// Builds the block with GPT-2 initialization (see [`crate::init`]).
    pub fn new(config: &GptConfig, device: &B::Device) -> Self {
        let c = config.d_model;
        Self {
            c_attn: init::linear(c, 3 * c, config.bias, init::INIT_STD, device),
            c_proj: init::linear(
                c,
                c,
                config.bias,
                init::residual_std(config.n_layer),
                device,
            ),
            attn_dropout: DropoutConfig::new(config.dropout).init(),
            resid_dropout: DropoutConfig::new(config.dropout).init(),
            n_head: config.n_head,
        }
    }

    /// `x`: `[batch, seq_len, d_model]` → `[batch, seq_len, d_model]`.
    ///
    /// Uses Burn's fused `attention` op (backends with a flash kernel use it; under autodiff
    /// Burn 0.21 runs its fallback, which materializes `[batch, n_head, seq_len, seq_len]`).
    /// When attention dropout is active (training with `dropout > 0`) the explicit path
    /// [`attention_reference`] runs instead, because the fused op has no dropout.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, seq_len, d_model] = x.dims();
        let qkv = self.c_attn.forward(x); // [B, T, 3C]
        let heads = |t: Tensor<B, 3>| {
            t.reshape([batch, seq_len, self.n_head, d_model / self.n_head])
                .swap_dims(1, 2) // [B, H, T, Dh]
        };
        let mut qkv = qkv.chunk(3, 2).into_iter().map(heads);
        let (q, k, v) = (
            qkv.next().unwrap(),
            qkv.next().unwrap(),
            qkv.next().unwrap(),
        );

        let dropout_active = self.attn_dropout.prob > 0.0 && B::ad_enabled(&q.device());
        let y = if dropout_active {
            attention_reference(q, k, v, Some(&self.attn_dropout))
        } else {
            attention(
                q,
                k,
                v,
                None,
                None,
                AttentionModuleOptions {
                    is_causal: true,
                    ..Default::default()
                },
            )
        }; // [B, H, T, Dh]
        let y = y.swap_dims(1, 2).reshape([batch, seq_len, d_model]);
        self.resid_dropout.forward(self.c_proj.forward(y))
    }
}

/// The explicit attention path, kept as the test oracle for the fused op:
/// `softmax(Q·Kᵀ/√d_head, masked above the diagonal with −∞)·V`.
///
/// `q`: `[batch, n_head, seq_q, d_head]`, `k`, `v`: `[batch, n_head, seq_k, d_head]` with
/// `seq_k ≥ seq_q`; query `i` sits at key position `i + seq_k − seq_q` (so a KV cache works).
/// Returns `[batch, n_head, seq_q, d_head]`. Materializes the `[batch, n_head, seq_q, seq_k]`
/// scores.
pub fn attention_reference<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    dropout: Option<&Dropout>,
) -> Tensor<B, 4> {
    let [batch, n_head, seq_q, d_head] = q.dims();
    let seq_k = k.dims()[2];
    let scores = q.matmul(k.swap_dims(2, 3)) / (d_head as f64).sqrt(); // [B, H, Tq, Tk]
    let mask =
        causal_mask::<B>(seq_q, seq_k, &scores.device()).expand([batch, n_head, seq_q, seq_k]);
    let weights = softmax(scores.mask_fill(mask, f32::NEG_INFINITY), 3);
    let weights = match dropout {
        Some(dropout) => dropout.forward(weights),
        None => weights,
    };
    weights.matmul(v)
}

/// `[1, 1, seq_q, seq_k]`, true where key `j` is in the future of query `i`
/// (`j > i + seq_k − seq_q`).
fn causal_mask<B: Backend>(seq_q: usize, seq_k: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let offset = (seq_k - seq_q) as i64;
    let mask = Tensor::<B, 2, Bool>::tril_mask([seq_q, seq_k], offset, device);
    mask.unsqueeze::<4>()
}
