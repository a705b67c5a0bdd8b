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
//!
//! Activations of one micro-batch (`B` rows of `T` tokens, width `d`, `H` heads, vocabulary
//! `V`, `L` layers; see [`Activations`]): `L × (16·B·T·d + (4 + H)·B·T f32)` for GPT-2 with
//! the fused LayerNorm, attention and loss — each LayerNorm keeps its input and a mean and
//! 1/std per row, attention its output and a log-sum-exp per row and head (FlashAttention, Dao
//! et al. 2022, §3.1: the `[B, H, T, T]` probabilities are recomputed in the backward pass) —
//! plus the final norm `2·B·T·d + 2·B·T f32` and the head and loss, [`bytes_per_logit`] ×
//! `B·T·V + B·T f32` (the logits, whose gradient the fused loss writes in place, the head's
//! backward, a log-sum-exp per row; no log-softmax copy). With dropout the explicit attention
//! adds `3·B·H·T²` per layer (probabilities, dropout mask, dropped probabilities) instead of the
//! log-sum-exps, and each dropout keeps its mask (`2·B·T·d` per layer, `B·T·d` after the
//! embeddings).
//!
//! The bytes are Ember's, not a textbook's: in the mixed modes only the matmuls run in 16 bits
//! ([`ember_model::precision`]), so the weights and their gradients stay f32 (16 B/param as in
//! fp32), each matmul keeps a 16-bit copy of its weight and of its input for the backward, and
//! everything else stays f32 (see [`layer_bytes_per_row`]). With activation checkpointing
//! (`"blocks"`) the forward keeps one f32 `[B, T, d]` input per layer and the backward
//! rebuilds one layer at a time ([`Activations::total_checkpointed`]).

use ember_model::ModelConfig;
use serde::Serialize;

use super::shards::Partition;
use crate::config::{BackendKind, CheckpointingKind, PrecisionKind, RunConfig};

/// What decides a run's bytes besides its shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Mode {
    /// `precision`.
    pub precision: PrecisionKind,
    /// What training attention keeps.
    pub attention: AttentionPath,
    /// `activation_checkpointing`.
    pub checkpointing: CheckpointingKind,
    /// Ranks the AdamW state is sharded over (`[parallel] shard_optimizer`, ZeRO-1); 1 when it
    /// is replicated.
    pub optimizer_shards: u64,
    /// Whose bytes the peak predicts: the process's on the CPU, the device pool's on a GPU.
    pub memory: MemoryReading,
}

/// What the peak estimate predicts, by backend: the two differ in whether a freed gradient's
/// bytes still count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryReading {
    /// burn-flex: the process's peak RSS. The allocator keeps what the previous step freed, so
    /// every gradient's bytes count on top of every activation's (measured within −9% and +11%
    /// on burn-flex, README "`ember estimate` and `ember bench`").
    ProcessRss,
    /// CUDA, wgpu: the bytes in use in CubeCL's memory pool. At the start of the backward only
    /// the gradients made before it frees any activation exist (the LM head's and the last
    /// layer's): measured within 3% on wgpu (README, "Attention on each backend"). The pool
    /// reserves more than it uses (its pages): 25–35% more on lavapipe.
    DeviceInUse,
}

impl Mode {
    /// The mode `config` trains in.
    pub fn of(config: &RunConfig) -> Self {
        Self {
            precision: config.precision,
            attention: AttentionPath::of(&config.model),
            checkpointing: config.activation_checkpointing,
            optimizer_shards: match config.parallel.shard_optimizer {
                true => config.world_size() as u64,
                false => 1,
            },
            memory: match config.backend {
                BackendKind::Flex => MemoryReading::ProcessRss,
                BackendKind::Cuda | BackendKind::Wgpu => MemoryReading::DeviceInUse,
            },
        }
    }

    /// The matmuls run in 16 bits (bf16-mixed, fp16-mixed).
    fn mixed(&self) -> bool {
        self.precision != PrecisionKind::Fp32
    }
}

/// Bytes per parameter as Ember keeps them, by role (ZeRO §3.1's split). Ember's mixed modes
/// cast the f32 weights at each matmul instead of storing 16-bit weights next to an f32 master
/// copy, so the persistent state is 16 B/param in every mode; the textbook mixed split (2 B
/// weights + 2 B gradients + 4 B master + 8 B moments) does not apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PerParam {
    /// Weights, bytes: f32, which are also the master weights in the mixed modes.
    pub weights: u64,
    /// Gradients, bytes (f32: autodiff casts them back to the weight's dtype).
    pub grads: u64,
    /// A separate master copy, bytes: 0 in every mode of Ember.
    pub master: u64,
    /// AdamW first moment, bytes.
    pub adam_m: u64,
    /// AdamW second moment, bytes.
    pub adam_v: u64,
    /// The 16-bit copy of each matmul weight that the forward casts and the backward keeps
    /// (mixed modes; 0 in fp32): bytes per *matmul* parameter, alive during the forward and
    /// backward only, so not part of [`PerParam::total`].
    pub low_precision_copy: u64,
}

impl PerParam {
    /// Ember's bytes per parameter in `precision`.
    pub fn of(precision: PrecisionKind) -> Self {
        let copy = if precision == PrecisionKind::Fp32 { 0 } else { 2 };
        PerParam { weights: 4, grads: 4, master: 0, adam_m: 4, adam_v: 4, low_precision_copy: copy }
    }

    /// Persistent bytes per parameter: 16 in every mode (without sharding).
    pub fn total(&self) -> u64 {
        self.weights + self.grads + self.master + self.adam_m + self.adam_v
    }
}

/// Tensors of `[batch, seq_len, d_model]` that one pre-norm GPT-2 layer keeps for the backward
/// pass under Burn's autodiff (no dropout; see [`DROPOUT_MASKS_PER_LAYER`]), with Ember's fused LayerNorm, attention and GELU
/// (`ember_model::ops`): each LayerNorm keeps its input (1; plus per-row statistics, see
/// [`ROW_STATS_PER_NORM`]) and its output is kept as the next projection's input (1), twice:
/// 4; q, k, v (`c_attn`'s output, which the fused attention reads in place: 3); the attention
/// output `[B, T, H, Dh]`, which is also `c_proj`'s input (a free reshape: 1); the MLP's
/// up-projection, GELU's input (4), and the GELU output, `c_proj`'s input (4): 16. (Burn's
/// composed LayerNorm kept 4 tensors each, and its attention the output before and after
/// merging the heads: 21.) On the explicit attention path (dropout) the merged copy of the
/// heads takes the output's place: 16 too. Korthikanti et al. 2022 (§4.1) count `34·s·b·h`
/// bytes at 2 bytes per element: the same 16 tensors plus two 1-byte dropout masks.
pub const GPT2_LAYER_TENSORS: u64 = 16;

/// `[batch, seq_len, d_model]` masks a GPT-2 layer keeps when `dropout > 0`: Burn's `Dropout`
/// multiplies by a float mask and keeps it for the backward pass, after the attention output
/// projection and after the MLP (the attention weights' mask is part of
/// [`Activations::attention_per_layer`]).
pub const DROPOUT_MASKS_PER_LAYER: u64 = 2;

/// Per-row f32 statistics a fused LayerNorm keeps for its backward pass: the mean and 1/std
/// of each of the `batch × seq_len` rows (a fused RMSNorm keeps 1/rms only).
pub const ROW_STATS_PER_NORM: u64 = 2;

/// Bytes of the f32 per-row statistics (LayerNorm mean and 1/std, log-sum-exps), whatever the
/// precision of the activations.
const STAT_BYTES: u64 = 4;

/// What training attention keeps for its backward pass: the term of the activation memory
/// that decides whether long contexts fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionPath {
    /// Ember's fused attention (flash-style): keeps its output (`[B, T, H, Dh]`, the size of
    /// `[B, H, T, Dh]`) and a log-sum-exp per query row and head (`B·H·T` f32), never the
    /// `[B, H, T, T]` scores or probabilities; the backward recomputes them from q, k and the
    /// log-sum-exp, a block of rows at a time (no `T²` term is counted).
    Fused,
    /// The explicit `softmax(Q·Kᵀ/√d)·V` ([`ember_model`]'s `attention_reference`), which
    /// training runs when attention dropout is on: keeps the probabilities `[B, H, T, T]` and,
    /// with dropout, the dropout mask and the dropped probabilities too (`3 × [B, H, T, T]`).
    Materialized,
}

impl AttentionPath {
    /// The path training takes for `model`: materialized when GPT-2's attention dropout is on
    /// (the fused op has no dropout), fused otherwise.
    pub fn of(model: &ModelConfig) -> Self {
        match model {
            ModelConfig::Gpt2(c) if c.dropout > 0.0 => AttentionPath::Materialized,
            _ => AttentionPath::Fused,
        }
    }

    /// One line for `ember estimate`.
    pub fn describe(self) -> &'static str {
        match self {
            AttentionPath::Fused => {
                "fused: keeps its output [B,T,H,Dh] and a log-sum-exp per row and head [B,H,T], never [B,H,T,T]"
            }
            AttentionPath::Materialized => {
                "materialized (attention dropout > 0): keeps probabilities, dropout mask and dropped probabilities, 3 × [B,H,T,T]"
            }
        }
    }
}

/// Activation memory of one optimizer micro-step, bytes. `B` batch, `T` seq_len, `d` d_model,
/// `H` heads, `V` vocabulary, `L` layers; per-row statistics in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Activations {
    /// Retained activations of one layer: `B·T ×` [`layer_bytes_per_row`] (fp32 GPT-2:
    /// [`GPT2_LAYER_TENSORS`] (+ [`DROPOUT_MASKS_PER_LAYER`] with dropout) × `d` f32; Llama:
    /// `6·d + 2·kv + 3·d_ff` f32 — two RMSNorms' inputs and outputs, q after RoPE, k after
    /// RoPE and v at `kv = n_kv_head·d_head` wide, the attention output, SwiGLU's gate and up
    /// inputs and its output).
    pub per_layer: u64,
    /// Per-row f32 statistics of one layer: each norm's (LayerNorm: mean and 1/std, `2 × 2 ×
    /// B·T`; RMSNorm: 1/rms, `2 × B·T`) and, on the fused path, attention's log-sum-exp
    /// (`H × B·T`).
    pub row_stats_per_layer: u64,
    /// The attention probabilities of one layer, `B·H·T²` f32, on the materialized path,
    /// `3 × B·H·T²` with dropout (its mask and the dropped probabilities); 0 on the fused one.
    pub attention_per_layer: u64,
    /// The embedding dropout's f32 mask, `B·T·d` (0 without dropout).
    pub embedding_dropout: u64,
    /// The final norm: its f32 input and its output, the LM head's input (f32, or a 16-bit copy
    /// in the mixed modes), and its per-row statistics (`2 × B·T` f32 for GPT-2's LayerNorm,
    /// `B·T` for Llama's RMSNorm).
    pub final_norm: u64,
    /// The LM head and the loss: [`bytes_per_logit`] × `B·T·V`, plus the log-sum-exp of each
    /// row (`B·T` f32).
    pub logits: u64,
    /// All layers kept: `L × (per_layer + row_stats_per_layer + attention_per_layer) +
    /// embedding_dropout + final_norm + logits`.
    pub total: u64,
    /// What the backward pass holds beyond the retained activations at its peak (part of the
    /// peak, not retained). The gradients of a layer's activations take the place of the
    /// activations its backward has consumed (measured on burn-flex: peak RSS = persistent +
    /// activations within 1–4% in fp32, see the README), except the explicit attention's
    /// `[B, H, T, T]` gradients: `attention_per_layer`. Mixed modes add `16 · d_ff` bytes per row, the
    /// FFN's `d_ff`-wide gradient alive as four f32 tensors at once in its backward (the
    /// matmul's f32 product before its cast to 16 bits, the cast back, the activation's input
    /// gradient, and burn-flex's f32 conversion of its 16-bit copy for the weight gradient).
    pub backward_working_set: u64,
    /// With activation checkpointing (`"blocks"`: one f32 `[B, T, d]` input per layer kept,
    /// one layer rebuilt at a time): `L × 4·B·T·d + per_layer + row_stats_per_layer +
    /// attention_per_layer + embedding_dropout + final_norm + logits`.
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
    /// Parameters that are matmul weights (the linear layers and the LM head): those the mixed
    /// modes cast to 16 bits.
    pub matmul_params: u64,
    /// Precision, attention path and checkpointing.
    pub mode: Mode,
    /// Bytes per parameter.
    pub per_param: PerParam,
    /// Persistent bytes on one rank: parameters × [`PerParam::total`], or with ZeRO-1
    /// parameters × (weights + grads) + [`Self::optimizer_state_bytes`] (Rajbhandari et al.
    /// 2020 §5.1: the optimizer state divided over the data-parallel ranks; weights and
    /// gradients stay whole).
    pub persistent_bytes: u64,
    /// Parameters whose AdamW state the rank with the largest share keeps: all of them without
    /// sharding; with ZeRO-1 the largest share of the split by whole tensors
    /// ([`super::shards::Partition`], the split `ember train` uses), about `params / shards`.
    pub optimizer_shard_params: u64,
    /// AdamW state bytes on that rank: [`Self::optimizer_shard_params`] × (m + v).
    pub optimizer_state_bytes: u64,
    /// The 16-bit weight copies alive at the peak (mixed modes): every matmul weight's, or with
    /// checkpointing one layer's and the LM head's.
    pub low_precision_copy_bytes: u64,
    /// Activation bytes of one micro-batch.
    pub activations: Activations,
    /// With several ranks: the gradient exchange's buffers, alive after the backward pass
    /// while the gradients are — the flattened gradients and their reduced copy, 8 B/param
    /// (`parallel::collective`); 0 for one rank.
    pub exchange_bytes: u64,
    /// Peak bytes per device without and with activation checkpointing, as [`Mode::memory`]
    /// reads them: the largest of
    /// - the start of the backward pass: weights and AdamW state, the 16-bit weight copies,
    ///   every activation, the backward working set, and the gradients — all of them in a
    ///   process's RSS ([`MemoryReading::ProcessRss`]) or with gradient accumulation (the
    ///   earlier micro-batches' sum), else only those made before the backward frees any
    ///   activation (the LM head's and the last layer's matmul weights') in a device pool's
    ///   bytes in use ([`MemoryReading::DeviceInUse`]),
    /// - its end: the persistent bytes (every gradient made), the copies and the working set
    ///   (measured on wgpu: 16 B/param to the byte after the backward of a 2×128 model),
    /// - the gradient exchange: persistent + [`Self::exchange_bytes`].
    ///
    /// Each layer's backward frees that layer's activations while it makes its gradients, so
    /// the bytes in use move linearly between the first two. Measured on wgpu (CubeCL's exact
    /// in-use count) the start is the step's high point, 1.7–2.5% under this; counting every
    /// gradient there, as the device estimate did before 2026-12-04, overstated it by 4 B/param.
    pub peak_bytes: (u64, u64),
    /// The peak of the run's own checkpointing mode (one of `peak_bytes`).
    pub peak: u64,
    /// Training FLOPs per token: `6·N + 12·n_layer·d_model·seq_len`.
    pub flops_per_token: u64,
    /// Tokens per optimizer step (global batch).
    pub tokens_per_step: u64,
    /// Training FLOPs per optimizer step (model FLOPs: checkpointing's recompute not counted,
    /// as for MFU).
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

impl Estimate {
    /// Persistent bytes per parameter on the rank with the most: 16 without sharding, about
    /// `8 + 8/W` with ZeRO-1 over `W` ranks.
    pub fn persistent_per_param(&self) -> f64 {
        self.persistent_bytes as f64 / self.params.max(1) as f64
    }
}

/// The model's dimensions that the accounting needs.
#[derive(Clone, Copy, Debug)]
struct Dims {
    n_layer: u64,
    n_head: u64,
    d_model: u64,
    vocab: u64,
    positions: u64,
    /// Matmul weights of one layer, and of the LM head (`V·d`, tied or not).
    layer_matmul_params: u64,
    /// Bytes per token (row) a layer retains.
    layer_bytes: u64,
    /// Per-row f32 statistics per layer kept by its norms.
    norm_stats: u64,
    /// Per-row f32 statistics of the final norm.
    final_norm_stats: u64,
    /// Dropout is on (training keeps its masks).
    dropout: bool,
    /// The FFN's hidden width (GPT-2: `4·d_model`).
    d_ff: u64,
}

/// Bytes per token (row of `[B, T, ·]`) that one layer keeps for its backward pass.
///
/// GPT-2 (see [`GPT2_LAYER_TENSORS`]), in units of `d`: fp32 keeps 16 f32 tensors, 64 B. In
/// the mixed modes each matmul keeps a 16-bit copy of its input instead of sharing the f32
/// tensor it was cast from: LayerNorm inputs 2 × 4 B and their normalized outputs 2 × 2 B (the
/// f32 outputs die after the cast), q, k, v 3 × 4 B (the fused attention reads f32), the
/// attention output 4 B (attention's backward) + 2 B (`c_proj`'s copy), GELU's input 4 × 4 B
/// and its output 4 × 2 B: 54 B. Each dropout mask is f32 (4 B).
///
/// Llama: fp32 `4 × (6·d + 2·kv + 3·d_ff)`; mixed: RMSNorm inputs 2 × 4·d and outputs 2 × 2·d,
/// q 4·d, k and v 2 × 4·kv, the attention output 4·d + 2·d, SwiGLU's f32 gate and up inputs
/// 2 × 4·d_ff and its output 2·d_ff: `22·d + 8·kv + 10·d_ff`.
pub fn layer_bytes_per_row(model: &ModelConfig, precision: PrecisionKind) -> u64 {
    let mixed = precision != PrecisionKind::Fp32;
    match model {
        ModelConfig::Gpt2(c) => {
            let d = c.d_model as u64;
            let masks = if c.dropout > 0.0 { DROPOUT_MASKS_PER_LAYER * 4 * d } else { 0 };
            (if mixed { 54 * d } else { GPT2_LAYER_TENSORS * 4 * d }) + masks
        }
        ModelConfig::Llama(c) => {
            let (d, ff) = (c.d_model as u64, c.d_ff as u64);
            let kv = (c.n_kv_head * c.d_model / c.n_head) as u64;
            if mixed {
                22 * d + 8 * kv + 10 * ff
            } else {
                4 * (6 * d + 2 * kv + 3 * ff)
            }
        }
    }
}

/// Bytes per element of the logits `[B·T, V]` at the step's peak: the LM head and the loss.
///
/// fp32: 6 — the f32 logits (4 B; the fused loss keeps them instead of a log-softmax and writes
/// their gradient in place), and the head's backward products (measured: 2 B).
/// Mixed modes: 15 — the f32 logits (4 B, the gradient in place), the gradient's 16-bit copy
/// for the head's matmuls (2 B), burn-flex's f32 conversions of it in the two backward matmuls
/// (`dX` and `dW`, 4 + 4 B), and the rest of the head's backward (measured: 1 B).
///
/// Calibrated on burn-flex: peak RSS grew by 6.0 B (fp32) and 15.0–15.3 B (bf16-mixed) per
/// logit between vocabularies 12,576 and 50,304 at 768 rows, with and without checkpointing,
/// after the 16 B per embedding parameter (and its 2 B bf16 copy) are taken off.
pub fn bytes_per_logit(precision: PrecisionKind) -> u64 {
    if precision == PrecisionKind::Fp32 {
        6
    } else {
        15
    }
}

fn dims(model: &ModelConfig, precision: PrecisionKind) -> Dims {
    let layer_bytes = layer_bytes_per_row(model, precision);
    match model {
        ModelConfig::Gpt2(c) => Dims {
            n_layer: c.n_layer as u64,
            n_head: c.n_head as u64,
            d_model: c.d_model as u64,
            vocab: c.vocab_size as u64,
            positions: (c.block_size * c.d_model) as u64,
            // c_attn 3d², attention c_proj d², c_fc 4d², MLP c_proj 4d².
            layer_matmul_params: 12 * (c.d_model * c.d_model) as u64,
            layer_bytes,
            norm_stats: 2 * ROW_STATS_PER_NORM,
            final_norm_stats: ROW_STATS_PER_NORM,
            dropout: c.dropout > 0.0,
            d_ff: 4 * c.d_model as u64,
        },
        ModelConfig::Llama(c) => {
            let d = c.d_model as u64;
            let kv = (c.n_kv_head * c.d_model / c.n_head) as u64;
            Dims {
                n_layer: c.n_layer as u64,
                n_head: c.n_head as u64,
                d_model: d,
                vocab: c.vocab_size as u64,
                positions: 0,
                // q and o d², k and v d·kv, gate, up and down d·d_ff.
                layer_matmul_params: 2 * d * d + 2 * d * kv + 3 * d * c.d_ff as u64,
                layer_bytes,
                norm_stats: 2,
                final_norm_stats: 1,
                dropout: false,
                d_ff: c.d_ff as u64,
            }
        }
    }
}

/// Accounts `model` trained with micro-batches of `micro_batch` sequences of `seq_len` tokens,
/// `tokens_per_step` tokens per optimizer step, in `mode` (see [`Activations`] for each term).
/// `peak_flops` (FLOP/s of one device) and `mfu` give the time per step on `world_size`
/// devices.
#[allow(clippy::too_many_arguments)]
pub fn estimate(
    model: &ModelConfig,
    micro_batch: u64,
    seq_len: u64,
    tokens_per_step: u64,
    world_size: u64,
    mode: Mode,
    peak_flops: Option<f64>,
    mfu: f64,
) -> Estimate {
    let d = dims(model, mode.precision);
    let params = model.num_params() as u64;
    let per_param = PerParam::of(mode.precision);
    let optimizer_shard_params = match mode.optimizer_shards {
        0 | 1 => params,
        shards => match model.param_sizes() {
            Ok(sizes) => Partition::balanced(&sizes, shards as usize).largest() as u64,
            Err(_) => params.div_ceil(shards), // an invalid model is refused elsewhere
        },
    };
    let optimizer_state_bytes =
        optimizer_shard_params * (per_param.master + per_param.adam_m + per_param.adam_v);
    let persistent_bytes = params * (per_param.weights + per_param.grads) + optimizer_state_bytes;
    let rows = micro_batch * seq_len; // B·T
    let btd = rows * d.d_model * 4; // one f32 [B, T, d]
    let per_layer = rows * d.layer_bytes;
    let (lse_per_row, attention_per_layer) = match mode.attention {
        AttentionPath::Fused => (d.n_head, 0),
        AttentionPath::Materialized => {
            let copies = if d.dropout { 3 } else { 1 };
            (0, copies * micro_batch * d.n_head * seq_len * seq_len * 4)
        }
    };
    let embedding_dropout = if d.dropout { btd } else { 0 };
    let row_stats_per_layer = (d.norm_stats + lse_per_row) * rows * STAT_BYTES;
    let head_input = if mode.mixed() { btd / 2 } else { btd };
    let final_norm = btd + head_input + d.final_norm_stats * rows * STAT_BYTES;
    let logits = bytes_per_logit(mode.precision) * rows * d.vocab + rows * STAT_BYTES;
    let layer = per_layer + row_stats_per_layer + attention_per_layer;
    let total = d.n_layer * layer + embedding_dropout + final_norm + logits;
    let total_checkpointed = d.n_layer * btd + layer + embedding_dropout + final_norm + logits;
    let backward_working_set = attention_per_layer + if mode.mixed() { 16 * d.d_ff * rows } else { 0 };
    let head_params = d.vocab * d.d_model;
    let matmul_params = d.n_layer * d.layer_matmul_params + head_params;
    // With checkpointing a layer's copies live from its recompute to its backward only.
    let copy = |weights: u64| weights * per_param.low_precision_copy;
    let (copies_none, copies_blocks) = (copy(matmul_params), copy(d.layer_matmul_params + head_params));
    let activations = Activations {
        per_layer,
        row_stats_per_layer,
        attention_per_layer,
        embedding_dropout,
        final_norm,
        logits,
        total,
        backward_working_set,
        total_checkpointed,
    };
    let exchange_bytes = if world_size > 1 { 8 * params } else { 0 };
    let exchange = persistent_bytes + exchange_bytes;
    // The backward frees each layer's activations as it makes that layer's gradients, so the
    // step has two candidate high points: its start (every activation alive, only the LM
    // head's and the last layer's gradients made) and its end (every gradient made, the
    // activations freed). In between the sum moves linearly from one to the other. A
    // process's RSS still holds the previous step's gradients at the start (the allocator
    // keeps freed memory), a device pool's bytes in use do not.
    // With gradient accumulation every micro-batch after the first runs beside the gradients
    // the earlier ones summed.
    let grads_bytes = params * per_param.grads;
    let micro_batches_per_rank = tokens_per_step / (rows * world_size).max(1);
    let grads_at_start = match (mode.memory, micro_batches_per_rank > 1) {
        (MemoryReading::ProcessRss, _) | (MemoryReading::DeviceInUse, true) => grads_bytes,
        (MemoryReading::DeviceInUse, false) => (head_params + d.layer_matmul_params) * per_param.grads,
    };
    let start = |copies: u64, activations: u64| {
        persistent_bytes - grads_bytes + grads_at_start + copies + activations + backward_working_set
    };
    let end = |copies: u64| persistent_bytes + copies + backward_working_set;
    let peak_bytes = (
        start(copies_none, total).max(end(copies_none)).max(exchange),
        start(copies_blocks, total_checkpointed).max(end(copies_blocks)).max(exchange),
    );
    let blocks = mode.checkpointing == CheckpointingKind::Blocks;
    let flops_per_token = 6 * params + 12 * d.n_layer * d.d_model * seq_len;
    let flops_per_step = flops_per_token as f64 * tokens_per_step as f64;
    let chinchilla_tokens = 20 * params;
    Estimate {
        params,
        params_without_positions: params - d.positions,
        matmul_params,
        mode,
        per_param,
        persistent_bytes,
        optimizer_shard_params,
        optimizer_state_bytes,
        low_precision_copy_bytes: if blocks { copies_blocks } else { copies_none },
        activations,
        exchange_bytes,
        peak_bytes,
        peak: if blocks { peak_bytes.1 } else { peak_bytes.0 },
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

/// [`estimate`] for a run configuration: its micro-batch, context, global batch, world size
/// and [`Mode`] (precision, attention path, checkpointing).
pub fn estimate_run(config: &RunConfig, peak_flops: Option<f64>, mfu: f64) -> Estimate {
    let world = config.world_size();
    estimate(
        &config.model,
        config.micro_batch_size as u64,
        config.model.block_size() as u64,
        config.tokens_per_step(world) as u64,
        world as u64,
        Mode::of(config),
        peak_flops,
        mfu,
    )
}

/// The table's peak FLOP/s for the device `config` runs on: the CUDA device's model name
/// (from the driver) looked up in [`known_peak_flops`]; `None` on the CPU, on wgpu (whose adapter
/// names are not the table's) or for an unknown GPU.
pub fn table_peak_flops(config: &RunConfig) -> Option<f64> {
    match config.backend {
        BackendKind::Cuda => {
            super::device::gpu_model(config.device).and_then(|model| known_peak_flops(&model))
        }
        BackendKind::Flex | BackendKind::Wgpu => None,
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

    fn mode(precision: PrecisionKind, attention: AttentionPath) -> Mode {
        Mode {
            precision,
            attention,
            checkpointing: CheckpointingKind::None,
            optimizer_shards: 1,
            memory: MemoryReading::ProcessRss,
        }
    }

    /// The activations of `model` at shakespeare-char's shapes: 12 rows of 64 tokens.
    fn shakespeare_activations(
        model: &ModelConfig,
        precision: PrecisionKind,
        attention: AttentionPath,
    ) -> Activations {
        estimate(model, 12, 64, 768, 1, mode(precision, attention), None, 0.4).activations
    }

    #[test]
    fn gpt2_124m_needs_about_two_gigabytes_of_persistent_state() {
        let model = ModelConfig::preset("gpt2").unwrap();
        let e =
            estimate(&model, 1, 1024, 1024, 1, mode(PrecisionKind::Fp32, AttentionPath::Fused), None, 0.4);
        assert_eq!(e.params, 124_475_904);
        assert_eq!(e.params_without_positions, 124_475_904 - 1024 * 768);
        assert_eq!(e.per_param.total(), 16);
        assert_eq!(e.persistent_bytes, 124_475_904 * 16); // 1.99 GB
        assert!((e.persistent_bytes as f64 / 1e9 - 1.99).abs() < 0.01);
        let mixed = estimate(
            &model,
            1,
            1024,
            1024,
            1,
            mode(PrecisionKind::Bf16Mixed, AttentionPath::Fused),
            None,
            0.4,
        );
        // Ember's mixed modes keep f32 weights (the master copy) and f32 gradients: 16 B/param
        // as in fp32, not the textbook 2 + 2 + 4 + 8, plus a bf16 copy of each matmul weight
        // (12 layers × 12·768² + the tied head 50304·768 (the preset pads the vocabulary)) during the forward and backward.
        assert_eq!(
            mixed.per_param,
            PerParam { weights: 4, grads: 4, master: 0, adam_m: 4, adam_v: 4, low_precision_copy: 2 }
        );
        assert_eq!(mixed.persistent_bytes, e.persistent_bytes);
        assert_eq!(mixed.matmul_params, 12 * 12 * 768 * 768 + 50_304 * 768);
        assert_eq!(mixed.low_precision_copy_bytes, 2 * mixed.matmul_params);
        assert_eq!(e.low_precision_copy_bytes, 0);
        // With checkpointing only one layer's copies and the head's are alive at once.
        let blocks = Mode { checkpointing: CheckpointingKind::Blocks, ..mixed.mode };
        let mixed_blocks = estimate(&model, 1, 1024, 1024, 1, blocks, None, 0.4);
        assert_eq!(mixed_blocks.low_precision_copy_bytes, 2 * (12 * 768 * 768 + 50_304 * 768));
        assert_eq!(mixed_blocks.peak, mixed_blocks.peak_bytes.1);
        assert_eq!(mixed.peak, mixed.peak_bytes.0);
    }

    /// ZeRO-1 divides the AdamW state only, by whole tensors: GPT-2 124M on 2 ranks keeps
    /// 4 + 4 B/param plus 8 B per parameter of the larger share, about 12 B/param (1.49 GB
    /// instead of 1.99). On 8
    /// ranks the token embedding (50304 × 768 = 38.6M elements, 31% of the model) is one rank's
    /// share on its own, so that rank keeps 8 B × 38.6M of moments, not 8 B × params / 8.
    #[test]
    fn sharded_optimizer_state_is_the_largest_share_of_the_moments() {
        let model = ModelConfig::preset("gpt2").unwrap();
        let params = 124_475_904u64;
        let sharded = |shards| {
            let mode = Mode { optimizer_shards: shards, ..mode(PrecisionKind::Fp32, AttentionPath::Fused) };
            estimate(&model, 1, 128, 256, shards, mode, None, 0.4)
        };
        let (one, two, eight) = (sharded(1), sharded(2), sharded(8));
        assert_eq!(one.optimizer_state_bytes, params * 8);
        assert_eq!(one.persistent_bytes, params * 16);
        assert_eq!(one.persistent_per_param(), 16.0);
        let larger = Partition::balanced(&model.param_sizes().unwrap(), 2).largest() as u64;
        assert!(larger >= params / 2 && larger - params / 2 < 600_000, "balanced: {larger}");
        assert_eq!(two.optimizer_shard_params, larger);
        assert_eq!(two.optimizer_state_bytes, larger * 8);
        assert_eq!(two.persistent_bytes, params * 8 + larger * 8);
        assert!((two.persistent_per_param() - 12.0).abs() < 0.04, "{}", two.persistent_per_param());
        assert_eq!(eight.optimizer_shard_params, 50_304 * 768, "wte alone is the largest share");
        assert_eq!(eight.optimizer_state_bytes, 8 * 50_304 * 768);
        // Two ranks exchange the gradients: 8 B/param of buffers after the backward pass, whose
        // peak is the larger here (1 × 128 tokens of activations are 0.115 GB).
        assert_eq!(one.exchange_bytes, 0, "one rank: nothing exchanged");
        // One rank, 128 tokens, in a device pool: the end of the backward is the high point
        // (every gradient, 4 B × 124M, outweighs the activations the backward has freed by
        // then); in a process's RSS every gradient counts at the start already.
        let a = one.activations;
        assert_eq!(one.peak, params * 16 + a.total);
        let device = Mode { memory: MemoryReading::DeviceInUse, ..one.mode };
        let on_device = estimate(&model, 1, 128, 128, 1, device, None, 0.4);
        assert_eq!(on_device.peak, params * 16);
        assert_eq!(two.exchange_bytes, params * 8);
        assert_eq!(two.peak, params * 8 + larger * 8 + params * 8);
        let replicated =
            estimate(&model, 1, 128, 256, 2, mode(PrecisionKind::Fp32, AttentionPath::Fused), None, 0.4);
        assert_eq!(replicated.peak - two.peak, params * 4, "the peak falls by what the rank no longer keeps");
    }

    #[test]
    fn hand_computed_small_config() {
        // shakespeare-char: 4 layers, 4 heads, d 128, context 64, vocab 66, no bias, tied.
        let mut model = ModelConfig::preset("shakespeare-char").unwrap();
        model.set_vocab_size(66);
        assert_eq!(AttentionPath::of(&model), AttentionPath::Fused, "no dropout");
        let e = estimate(
            &model,
            12,
            64,
            768,
            1,
            mode(PrecisionKind::Fp32, AttentionPath::Fused),
            Some(100e9),
            0.5,
        );
        assert_eq!(e.mode.attention, AttentionPath::Fused);
        // Parameters: 66·128 + 64·128 + 4·(2·128 + 12·128²) + 128 = 804,224.
        assert_eq!(e.params, 804_224);
        // B·T = 12·64 = 768 rows; B·T·d = 98,304 elements = 393,216 B.
        // Per layer: 16 × 393,216 B = 6,291,456; per-row f32 statistics: (2 LayerNorms × mean
        // and 1/std + 4 heads' log-sum-exp) × 768 rows × 4 B = 24,576; no [B,H,T,T] term.
        let a = e.activations;
        assert_eq!(a.per_layer, 6_291_456);
        assert_eq!(a.row_stats_per_layer, 24_576);
        assert_eq!(a.attention_per_layer, 0);
        // Final LayerNorm: input and output 2 × 393,216 + mean and 1/std 2 × 768 × 4 = 792,576.
        assert_eq!(a.final_norm, 792_576);
        // Head and loss: 6 B per logit (bytes_per_logit) × 768·66 = 304,128, log-sum-exp 768 × 4 B.
        assert_eq!(a.logits, 307_200);
        // 4 × (6,291,456 + 24,576) + 792,576 + 307,200.
        assert_eq!(a.total, 26_363_904);
        // Checkpointed: 4 layer inputs (393,216 B each) + one layer + final norm + loss.
        assert_eq!(a.total_checkpointed, 1_572_864 + 6_316_032 + 792_576 + 307_200);
        assert_eq!(a.backward_working_set, 0, "fp32");
        // Peak RSS on the CPU: 16 B × 804,224 = 12,867,584 + activations.
        assert_eq!(e.peak_bytes.0, 12_867_584 + 26_363_904); // 39.2 MB
        assert_eq!(e.peak_bytes.1, 12_867_584 + 8_988_672);
        assert_eq!(e.peak, e.peak_bytes.0, "the run keeps every activation");
        // A device pool's bytes in use at the start of the backward: weights and moments
        // 12 B × 804,224 = 9,650,688, the gradients made first (the head's 66·128 and the last
        // layer's 12·128², 4 B each: 820,224) and the activations; its end (16 B/param:
        // 12,867,584) is lower, also with checkpointing.
        let device = Mode { memory: MemoryReading::DeviceInUse, ..e.mode };
        let on_device = estimate(&model, 12, 64, 768, 1, device, None, 0.5);
        assert_eq!(on_device.peak_bytes.0, 9_650_688 + 820_224 + 26_363_904); // 36.8 MB
        assert_eq!(on_device.peak_bytes.1, 9_650_688 + 820_224 + 8_988_672);
        // With 4 accumulation steps (3,072 tokens per step) the later micro-batches run beside
        // the summed gradients: all of them count, as in the process's RSS.
        let accumulated = estimate(&model, 12, 64, 4 * 768, 1, device, None, 0.5);
        assert_eq!(accumulated.peak_bytes, e.peak_bytes);
        // FLOPs/token: 6·804,224 + 12·4·128·64 = 4,825,344 + 393,216.
        assert_eq!(e.flops_per_token, 5_218_560);
        assert_eq!(e.flops_per_step, 5_218_560.0 * 768.0);
        // At 50% of 100 GFLOP/s: 4.008e9 / 5e10 = 0.0801 s.
        assert!((e.step_seconds_at_mfu.unwrap() - 5_218_560.0 * 768.0 / 5e10).abs() < 1e-12);
        assert_eq!(e.chinchilla_tokens, 16_084_480);
        assert_eq!(e.chinchilla_steps, 16_084_480_u64.div_ceil(768));
    }

    #[test]
    fn dropout_materializes_the_attention_probabilities_and_keeps_its_masks() {
        let gpu = ModelConfig::preset("shakespeare-char-gpu").unwrap();
        assert_eq!(AttentionPath::of(&gpu), AttentionPath::Materialized, "dropout 0.2");
        // shakespeare-char's shapes with dropout 0.2: B·T = 768 as above.
        let mut model = ModelConfig::preset("shakespeare-char").unwrap();
        model.set_vocab_size(66);
        let ModelConfig::Gpt2(c) = &mut model else { unreachable!() };
        c.dropout = 0.2;
        assert_eq!(AttentionPath::of(&model), AttentionPath::Materialized);
        let a = shakespeare_activations(&model, PrecisionKind::Fp32, AttentionPath::Materialized);
        // (16 + 2 dropout masks) × 393,216 B = 7,077,888; probabilities, their dropout mask and
        // the dropped probabilities: 3 × 12·4·64² × 4 B = 2,359,296; no log-sum-exp, so the
        // per-row statistics are the LayerNorms' only: 4 × 768 × 4 B = 12,288; the embedding
        // dropout's mask 393,216.
        assert_eq!(a.per_layer, 7_077_888);
        assert_eq!(a.attention_per_layer, 2_359_296);
        assert_eq!(a.row_stats_per_layer, 12_288);
        assert_eq!(a.embedding_dropout, 393_216);
        assert_eq!(a.total, 4 * (7_077_888 + 12_288 + 2_359_296) + 393_216 + 792_576 + 307_200);
        assert_eq!(a.backward_working_set, 2_359_296, "the attention probabilities' gradients");
        // Without dropout the explicit path keeps the probabilities once: 786,432.
        if let ModelConfig::Gpt2(c) = &mut model {
            c.dropout = 0.0;
        }
        let a = shakespeare_activations(&model, PrecisionKind::Fp32, AttentionPath::Materialized);
        assert_eq!((a.per_layer, a.attention_per_layer, a.embedding_dropout), (6_291_456, 786_432, 0));
        // bf16-mixed keeps 54 B per row and unit of d instead of 64 (layer_bytes_per_row):
        // 768 rows × 54 × 128 = 5,308,416; the f32 statistics stay; the head keeps 15 B per logit; the
        // final norm keeps its f32 input and a bf16 copy of its output: 393,216 + 196,608 +
        // 6,144.
        let mixed = shakespeare_activations(&model, PrecisionKind::Bf16Mixed, AttentionPath::Fused);
        assert_eq!(mixed.per_layer, 5_308_416);
        assert_eq!(mixed.row_stats_per_layer, 24_576);
        assert_eq!(mixed.logits, 15 * 768 * 66 + 3_072);
        assert_eq!(mixed.final_norm, 595_968);
        // Four f32 copies of the MLP's 512-wide gradient per row: 16 × 512 × 768 = 6,291,456.
        assert_eq!(mixed.backward_working_set, 6_291_456);
    }

    #[test]
    fn hand_computed_llama_with_grouped_kv_heads() {
        // llama-tiny: 2 layers, 4 heads, 2 kv heads, d 32 (d_head 8, kv 16), d_ff 88, vocab 64.
        let model = ModelConfig::preset("llama-tiny").unwrap();
        assert_eq!(AttentionPath::of(&model), AttentionPath::Fused);
        let a = estimate(&model, 2, 16, 32, 1, mode(PrecisionKind::Fp32, AttentionPath::Fused), None, 0.4)
            .activations;
        // 32 rows × (6·32 + 2·16 + 3·88 = 488) × 4 B = 62,464; statistics (2 RMSNorms' 1/rms +
        // 4 heads' log-sum-exp) × 32 × 4 B = 768.
        assert_eq!(a.per_layer, 62_464);
        assert_eq!(a.row_stats_per_layer, 768);
        // Final RMSNorm: 2 × 32·32 × 4 B + 32 × 4 B; head and loss: 6 B × 32·64 + 32 × 4 B.
        assert_eq!(a.final_norm, 8_320);
        assert_eq!(a.logits, 12_416);
        assert_eq!(a.total, 2 * (62_464 + 768) + 8_320 + 12_416); // 147,200
        assert_eq!(a.total_checkpointed, 2 * 4_096 + 63_232 + 8_320 + 12_416);
    }

    #[test]
    fn known_devices() {
        assert_eq!(known_peak_flops("NVIDIA H200"), Some(989e12));
        assert_eq!(known_peak_flops("cpu"), None);
    }
}
