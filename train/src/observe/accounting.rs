//! Memory and FLOP accounting of a run before it starts: parameters, persistent bytes per
//! parameter, activations, FLOPs per token and per step, time per step at a given MFU, and
//! the Chinchilla token budget.
//!
//! Sources: the 6·N FLOPs per token of a training step and the 12·n_layer·d_model·seq_len
//! attention term are Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", Table 1:
//! C_forward ≈ 2N + 2·n_layer·n_ctx·d_attn, ×3 for forward + backward) and PaLM (Chowdhery et
//! al. 2022, Appendix B: 6N + 12·L·H·Q·T); the 16 bytes/parameter of mixed-precision Adam and
//! the per-layer activation count follow Rajbhandari et al. 2020 (ZeRO, §3.1) and Korthikanti
//! et al. 2022 ("Reducing Activation Recomputation", §4.1); ~20 tokens per parameter is
//! Hoffmann et al. 2022 (Chinchilla, Table 3).

use ember_model::ModelConfig;
use serde::Serialize;

use crate::config::{BackendKind, RunConfig};

/// What the persistent state is stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// fp32 weights and gradients, fp32 AdamW moments (what Ember trains in today).
    Fp32,
    /// bf16 weights and gradients, an fp32 master copy, fp32 AdamW moments.
    Bf16Mixed,
}

impl Precision {
    /// Its name on the command line: `fp32` or `bf16-mixed`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16Mixed => "bf16-mixed",
        }
    }

    /// Bytes per element of activations.
    pub fn activation_bytes(self) -> u64 {
        match self {
            Precision::Fp32 => 4,
            Precision::Bf16Mixed => 2,
        }
    }

    /// Persistent bytes per parameter, by role.
    pub fn per_param(self) -> PerParam {
        match self {
            Precision::Fp32 => PerParam { weights: 4, grads: 4, master: 0, adam_m: 4, adam_v: 4 },
            Precision::Bf16Mixed => PerParam { weights: 2, grads: 2, master: 4, adam_m: 4, adam_v: 4 },
        }
    }
}

/// Persistent bytes per parameter (ZeRO §3.1): weights, gradients, fp32 master copy (mixed
/// precision only) and the two AdamW moments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PerParam {
    /// Weights, bytes.
    pub weights: u64,
    /// Gradients, bytes.
    pub grads: u64,
    /// fp32 master weights, bytes (0 in fp32 training).
    pub master: u64,
    /// AdamW first moment, bytes.
    pub adam_m: u64,
    /// AdamW second moment, bytes.
    pub adam_v: u64,
}

impl PerParam {
    /// Total bytes per parameter (16 for both precisions).
    pub fn total(&self) -> u64 {
        self.weights + self.grads + self.master + self.adam_m + self.adam_v
    }
}

/// Tensors of `[batch, seq_len, d_model]` that one pre-norm GPT-2 layer keeps for the backward
/// pass under Burn's autodiff (no dropout), counted from Burn 0.21's ops: each LayerNorm keeps
/// its input, the centred input, the normalized input and its output (4, twice: 8); q, k, v
/// (3); the attention output before and after merging the heads (2); the MLP's up-projection
/// (4) and its GELU output (4): 21. Korthikanti et al. 2022 (§4.1) count 34 bytes per element
/// at 2 bytes each with dropout masks and fused LayerNorms: 17.
pub const GPT2_LAYER_TENSORS: u64 = 21;

/// Activation memory of one optimizer micro-step, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Activations {
    /// Retained `[batch, seq_len, d_model]`-sized tensors of one layer.
    pub per_layer: u64,
    /// The attention scores and probabilities of one layer, `2 × batch × heads × seq_len²`
    /// elements, when attention materializes them (0 otherwise).
    pub attention_per_layer: u64,
    /// Logits, their log-softmax and the gradients of both: `4 × batch × seq_len × vocab`
    /// elements.
    pub logits: u64,
    /// All layers kept: `n_layer × (per_layer + attention_per_layer) + logits`.
    pub total: u64,
    /// The backward pass's working set: the gradients of one layer's activations alive at
    /// once, `per_layer + attention_per_layer`; part of the peak, not retained.
    pub backward_working_set: u64,
    /// With activation checkpointing (one `[batch, seq_len, d_model]` input per layer kept,
    /// one layer recomputed at a time): `n_layer × batch·seq_len·d_model + per_layer +
    /// attention_per_layer + logits`.
    pub total_checkpointed: u64,
}

/// The accounting of one configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Trainable parameters.
    pub params: u64,
    /// Parameters without the learned position embeddings (Kaplan's N excludes embeddings;
    /// nanoGPT reports this count).
    pub params_without_positions: u64,
    /// Precision of the persistent state.
    pub precision: Precision,
    /// Persistent bytes per parameter.
    pub per_param: PerParam,
    /// Persistent bytes: parameters × bytes per parameter.
    pub persistent_bytes: u64,
    /// Activation bytes of one micro-batch.
    pub activations: Activations,
    /// Peak bytes per device without and with activation checkpointing: persistent +
    /// activations + the backward working set.
    pub peak_bytes: (u64, u64),
    /// Training FLOPs per token: `6·N + 12·n_layer·d_model·seq_len`.
    pub flops_per_token: u64,
    /// Tokens per optimizer step (global batch).
    pub tokens_per_step: u64,
    /// Training FLOPs per optimizer step.
    pub flops_per_step: f64,
    /// Seconds per optimizer step at `mfu` of `peak_flops` on every rank.
    pub step_seconds_at_mfu: Option<f64>,
    /// The MFU assumed (fraction of peak).
    pub mfu: f64,
    /// Peak FLOP/s of one device, when known.
    pub peak_flops: Option<f64>,
    /// Chinchilla-optimal tokens: 20 × parameters.
    pub chinchilla_tokens: u64,
    /// Optimizer steps to reach them.
    pub chinchilla_steps: u64,
}

/// The model's dimensions that the accounting needs.
#[derive(Clone, Copy, Debug)]
struct Dims {
    n_layer: u64,
    n_head: u64,
    d_model: u64,
    vocab: u64,
    positions: u64,
    /// Retained `[B, T, d]` tensors per layer.
    layer_tensors: u64,
}

fn dims(model: &ModelConfig) -> Dims {
    match model {
        ModelConfig::Gpt2(c) => Dims {
            n_layer: c.n_layer as u64,
            n_head: c.n_head as u64,
            d_model: c.d_model as u64,
            vocab: c.vocab_size as u64,
            positions: (c.block_size * c.d_model) as u64,
            layer_tensors: GPT2_LAYER_TENSORS,
        },
        ModelConfig::Llama(c) => {
            // RMSNorm input, normalized and output (3, twice), q, k, v (1 + 2·kv/d), attention
            // output before and after merging heads (2), gate, up, SiLU(gate), their product
            // (4 × d_ff/d).
            let d = c.d_model as u64;
            let kv = (c.n_kv_head * c.d_model / c.n_head) as u64;
            let ff = c.d_ff as u64;
            Dims {
                n_layer: c.n_layer as u64,
                n_head: c.n_head as u64,
                d_model: d,
                vocab: c.vocab_size as u64,
                positions: 0,
                layer_tensors: 6 + 1 + (2 * kv).div_ceil(d) + 2 + (4 * ff).div_ceil(d),
            }
        }
    }
}

/// Accounts `model` trained with micro-batches of `micro_batch` sequences of `seq_len` tokens,
/// `tokens_per_step` tokens per optimizer step, in `precision`; attention materializes its
/// `[batch, heads, seq_len, seq_len]` scores when `materialized_attention` (Burn's fused
/// attention does under autodiff). `peak_flops` (FLOP/s of one device) and `mfu` give the
/// time per step on `world_size` devices.
#[allow(clippy::too_many_arguments)]
pub fn estimate(
    model: &ModelConfig,
    micro_batch: u64,
    seq_len: u64,
    tokens_per_step: u64,
    world_size: u64,
    precision: Precision,
    materialized_attention: bool,
    peak_flops: Option<f64>,
    mfu: f64,
) -> Estimate {
    let d = dims(model);
    let params = model.num_params() as u64;
    let per_param = precision.per_param();
    let persistent_bytes = params * per_param.total();
    let bytes = precision.activation_bytes();
    let btd = micro_batch * seq_len * d.d_model * bytes;
    let per_layer = d.layer_tensors * btd;
    let attention_per_layer =
        if materialized_attention { 2 * micro_batch * d.n_head * seq_len * seq_len * bytes } else { 0 };
    let logits = 4 * micro_batch * seq_len * d.vocab * bytes;
    let total = d.n_layer * (per_layer + attention_per_layer) + logits;
    let total_checkpointed = d.n_layer * btd + per_layer + attention_per_layer + logits;
    let backward_working_set = per_layer + attention_per_layer;
    let activations = Activations {
        per_layer,
        attention_per_layer,
        logits,
        total,
        backward_working_set,
        total_checkpointed,
    };
    let flops_per_token = 6 * params + 12 * d.n_layer * d.d_model * seq_len;
    let flops_per_step = flops_per_token as f64 * tokens_per_step as f64;
    let chinchilla_tokens = 20 * params;
    Estimate {
        params,
        params_without_positions: params - d.positions,
        precision,
        per_param,
        persistent_bytes,
        activations,
        peak_bytes: (
            persistent_bytes + total + backward_working_set,
            persistent_bytes + total_checkpointed + backward_working_set,
        ),
        flops_per_token,
        tokens_per_step,
        flops_per_step,
        step_seconds_at_mfu: peak_flops.map(|peak| flops_per_step / (peak * mfu * world_size as f64)),
        mfu,
        peak_flops,
        chinchilla_tokens,
        chinchilla_steps: chinchilla_tokens.div_ceil(tokens_per_step.max(1)),
    }
}

/// [`estimate`] for a run configuration: its micro-batch, context, global batch and world size,
/// attention materialized (Burn's fused attention under autodiff).
pub fn estimate_run(config: &RunConfig, precision: Precision, peak_flops: Option<f64>, mfu: f64) -> Estimate {
    let world = config.world_size();
    estimate(
        &config.model,
        config.micro_batch_size as u64,
        config.model.block_size() as u64,
        config.tokens_per_step(world) as u64,
        world as u64,
        precision,
        true,
        peak_flops,
        mfu,
    )
}

/// The table's peak FLOP/s for the device `config` runs on: the CUDA device's model name
/// (from the driver) looked up in [`known_peak_flops`]; `None` on the CPU or for an unknown GPU.
pub fn table_peak_flops(config: &RunConfig) -> Option<f64> {
    match config.backend {
        BackendKind::Cuda => {
            super::device::gpu_model(config.device).and_then(|model| known_peak_flops(&model))
        }
        BackendKind::Flex => None,
    }
}

/// Peak dense bf16 FLOP/s (tensor cores, no sparsity) of known devices, from the vendors' data
/// sheets; `None` for an unknown name. Override with `peak_flops` in the config.
pub fn known_peak_flops(device: &str) -> Option<f64> {
    let name = device.to_ascii_lowercase().replace([' ', '-', '_'], "");
    let table: [(&str, f64); 7] = [
        ("h200", 989e12),
        ("h100", 989e12),
        ("a100", 312e12),
        ("l40s", 362e12),
        ("rtx4090", 165e12),
        ("a10", 125e12),
        ("v100", 125e12),
    ];
    table.iter().find(|(key, _)| name.contains(key)).map(|&(_, flops)| flops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_124m_needs_about_two_gigabytes_of_persistent_state() {
        let model = ModelConfig::preset("gpt2").unwrap();
        let e = estimate(&model, 1, 1024, 1024, 1, Precision::Fp32, true, None, 0.4);
        assert_eq!(e.params, 124_475_904);
        assert_eq!(e.params_without_positions, 124_475_904 - 1024 * 768);
        assert_eq!(e.per_param.total(), 16);
        assert_eq!(e.persistent_bytes, 124_475_904 * 16); // 1.99 GB
        assert!((e.persistent_bytes as f64 / 1e9 - 1.99).abs() < 0.01);
        let mixed = estimate(&model, 1, 1024, 1024, 1, Precision::Bf16Mixed, true, None, 0.4);
        assert_eq!(mixed.per_param, PerParam { weights: 2, grads: 2, master: 4, adam_m: 4, adam_v: 4 });
        assert_eq!(mixed.persistent_bytes, e.persistent_bytes);
    }

    #[test]
    fn hand_computed_small_config() {
        // shakespeare-char: 4 layers, 4 heads, d 128, context 64, vocab 66, no bias, tied.
        let mut model = ModelConfig::preset("shakespeare-char").unwrap();
        model.set_vocab_size(66);
        let e = estimate(&model, 12, 64, 768, 1, Precision::Fp32, true, Some(100e9), 0.5);
        // Parameters: 66·128 + 64·128 + 4·(2·128 + 12·128²) + 128 = 804,224.
        assert_eq!(e.params, 804_224);
        // Per layer: 21 × 12·64·128 × 4 B = 8,257,536; scores: 2 × 12·4·64² × 4 B = 1,572,864;
        // logits: 4 × 12·64·66 × 4 B = 811,008.
        assert_eq!(e.activations.per_layer, 8_257_536);
        assert_eq!(e.activations.attention_per_layer, 1_572_864);
        assert_eq!(e.activations.logits, 811_008);
        assert_eq!(e.activations.total, 4 * (8_257_536 + 1_572_864) + 811_008);
        // Checkpointed: 4 layer inputs (393,216 B each) + one layer + logits.
        assert_eq!(e.activations.total_checkpointed, 4 * 393_216 + 8_257_536 + 1_572_864 + 811_008);
        // Peak: 16 B × 804,224 + activations + one layer's gradients.
        assert_eq!(e.peak_bytes.0, 16 * 804_224 + e.activations.total + 8_257_536 + 1_572_864);
        // FLOPs/token: 6·804,224 + 12·4·128·64 = 4,825,344 + 393,216.
        assert_eq!(e.flops_per_token, 5_218_560);
        assert_eq!(e.flops_per_step, 5_218_560.0 * 768.0);
        // At 50% of 100 GFLOP/s: 4.008e9 / 5e10 = 0.0801 s.
        assert!((e.step_seconds_at_mfu.unwrap() - 5_218_560.0 * 768.0 / 5e10).abs() < 1e-12);
        assert_eq!(e.chinchilla_tokens, 16_084_480);
        assert_eq!(e.chinchilla_steps, 16_084_480_u64.div_ceil(768));
    }

    #[test]
    fn known_devices() {
        assert_eq!(known_peak_flops("NVIDIA H200"), Some(989e12));
        assert_eq!(known_peak_flops("cpu"), None);
    }
}
