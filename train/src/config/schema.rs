//! The schema of a run configuration: every key of the TOML file, its default and its unit.

use std::path::PathBuf;

use ember_model::ModelConfig;
use serde::{Deserialize, Serialize};

use super::sentinel::SentinelConfig;

use super::error::ConfigError;
use super::parallel::{Devices, ParallelConfig};

/// Which Burn backend runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// `burn-flex`, the pure-Rust CPU backend (default; what tests use).
    #[default]
    Flex,
    /// `burn-cuda` (needs the `cuda` cargo feature and an NVIDIA driver).
    Cuda,
    /// `burn-wgpu`: Vulkan, Metal or DX12 through CubeCL's WGSL shaders (needs the `wgpu` cargo
    /// feature and a driver; Mesa's lavapipe runs it on the CPU).
    Wgpu,
}

impl BackendKind {
    /// Its name in configs and on the command line: `flex`, `cuda` or `wgpu`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Flex => "flex",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
        }
    }
}

/// Floating-point mode of the training step (`precision`): what the forward and backward
/// passes compute in. Weights, gradients, AdamW's moments and checkpoints are f32 in every mode.
/// Written as its [`PrecisionKind::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(try_from = "String", into = "&'static str")]
pub enum PrecisionKind {
    /// Everything in f32 (default).
    #[default]
    Fp32,
    /// The matmuls (linear layers, LM head) in bfloat16 through casts of the f32 weights, as
    /// `torch.autocast(dtype=torch.bfloat16)` does; norms, softmax, the loss and the gradient
    /// norm in f32 ([`ember_model::precision`]).
    Bf16Mixed,
    /// The matmuls in IEEE half precision, f32 elsewhere, with dynamic loss scaling
    /// ([`crate::step::LossScaler`]): initial scale 2¹⁶, halved and the step skipped when the
    /// gradient overflows, doubled after 2000 finite steps in a row.
    Fp16Mixed,
}

impl PrecisionKind {
    /// Every mode, in the order error messages list them.
    pub const ALL: [PrecisionKind; 3] =
        [PrecisionKind::Fp32, PrecisionKind::Bf16Mixed, PrecisionKind::Fp16Mixed];

    /// Its name in configs and on the command line: `fp32`, `bf16-mixed` or `fp16-mixed`.
    pub fn name(self) -> &'static str {
        match self {
            PrecisionKind::Fp32 => "fp32",
            PrecisionKind::Bf16Mixed => "bf16-mixed",
            PrecisionKind::Fp16Mixed => "fp16-mixed",
        }
    }

    /// The model's autocast mode.
    pub fn mode(self) -> ember_model::Precision {
        match self {
            PrecisionKind::Fp32 => ember_model::Precision::Fp32,
            PrecisionKind::Bf16Mixed => ember_model::Precision::Bf16Mixed,
            PrecisionKind::Fp16Mixed => ember_model::Precision::Fp16Mixed,
        }
    }
}

impl TryFrom<String> for PrecisionKind {
    type Error = String;

    /// One of the [`PrecisionKind::name`]s; anything else (another string, a number, a table)
    /// is an error naming what was expected.
    fn try_from(text: String) -> Result<Self, String> {
        by_name(&PrecisionKind::ALL, PrecisionKind::name, &text)
    }
}

impl From<PrecisionKind> for &'static str {
    fn from(p: PrecisionKind) -> Self {
        p.name()
    }
}

/// What the training forward keeps for the backward (`activation_checkpointing`), written as
/// its [`CheckpointingKind::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(try_from = "String", into = "&'static str")]
pub enum CheckpointingKind {
    /// Every activation (default).
    #[default]
    None,
    /// Only each Transformer block's input; the backward recomputes one block at a time
    /// ([`ember_model::checkpoint`]): about one more forward of compute for activation memory
    /// of one block instead of all.
    Blocks,
}

impl CheckpointingKind {
    /// Every mode, in the order error messages list them.
    pub const ALL: [CheckpointingKind; 2] = [CheckpointingKind::None, CheckpointingKind::Blocks];

    /// Its name in configs: `none` or `blocks`.
    pub fn name(self) -> &'static str {
        match self {
            CheckpointingKind::None => "none",
            CheckpointingKind::Blocks => "blocks",
        }
    }

    /// The model's checkpointing mode.
    pub fn mode(self) -> ember_model::ActivationCheckpointing {
        match self {
            CheckpointingKind::None => ember_model::ActivationCheckpointing::None,
            CheckpointingKind::Blocks => ember_model::ActivationCheckpointing::Blocks,
        }
    }
}

impl TryFrom<String> for CheckpointingKind {
    type Error = String;

    /// `"none"` or `"blocks"`; anything else is an error naming what was expected.
    fn try_from(text: String) -> Result<Self, String> {
        by_name(&CheckpointingKind::ALL, CheckpointingKind::name, &text)
    }
}

impl From<CheckpointingKind> for &'static str {
    fn from(c: CheckpointingKind) -> Self {
        c.name()
    }
}

/// The one of `all` whose `name` is `text`, else an error listing the names:
/// `expected "a", "b" or "c", got "text"`.
fn by_name<T: Copy>(all: &[T], name: fn(T) -> &'static str, text: &str) -> Result<T, String> {
    all.iter().copied().find(|&t| name(t) == text).ok_or_else(|| {
        let names: Vec<String> = all.iter().map(|&t| format!("{:?}", name(t))).collect();
        let (last, rest) = names.split_last().expect("at least one name");
        let list = if rest.is_empty() { last.clone() } else { format!("{} or {last}", rest.join(", ")) };
        format!("expected {list}, got {text:?}")
    })
}

/// Optimizer and learning-rate schedule (`[optimizer]` table). Defaults are nanoGPT's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Peak learning rate, reached at the end of warmup.
    pub lr: f64,
    /// Final learning rate of the cosine decay, held after `lr_decay_steps`.
    pub min_lr: f64,
    /// Optimizer steps of linear warmup: step `s ≤ warmup_steps` uses `lr·s/warmup_steps`.
    pub warmup_steps: u64,
    /// Optimizer step at which the cosine decay reaches `min_lr`. Defaults to `max_steps`.
    pub lr_decay_steps: Option<u64>,
    /// AdamW β₁.
    pub beta1: f64,
    /// AdamW β₂.
    pub beta2: f64,
    /// AdamW ε (added to √v̂).
    pub eps: f64,
    /// Decoupled weight decay for 2-D weight matrices (embeddings included); never applied
    /// to biases or LayerNorm parameters.
    pub weight_decay: f64,
    /// Maximum global L2 norm of the gradient (0 disables clipping).
    pub grad_clip: f64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            lr: 6e-4,
            min_lr: 6e-5,
            warmup_steps: 0,
            lr_decay_steps: None,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
        }
    }
}

/// Everything a training run needs, as read from TOML. Field names are the stable interface
/// scripts rely on (`max_steps`, `eval_every`, `eval_batches`, `checkpoint_every`, `seed`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Prepared data directory (`ember prepare --out`), or a UTF-8 text file that is prepared
    /// into `RUN_DIR/data` with `tokenizer`. `--data` overrides it.
    #[serde(default)]
    pub data: Option<PathBuf>,
    /// Tokenizer (`char`, `byte`, `gpt2`, `cl100k`, `o200k`): the one that prepares `data` when
    /// it is a text file (default `char`), and, when given, the one prepared data must have
    /// been made with (a mismatch is an error). With `init_from` and no data, `gpt2` lets
    /// `ember sample --config` encode prompts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Seed of everything random: initial weights, the batches of each step, dropout.
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    /// Number of optimizer steps.
    pub max_steps: u64,
    /// Sequences per micro-batch (per forward/backward).
    pub micro_batch_size: usize,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[serde(default = "defaults::one")]
    pub accumulation_steps: usize,
    /// Evaluate every N optimizer steps (0: only at the end).
    #[serde(default = "defaults::eval_every")]
    pub eval_every: u64,
    /// Validation batches (of `micro_batch_size` sequences) per evaluation.
    #[serde(default = "defaults::eval_batches")]
    pub eval_batches: usize,
    /// Write a checkpoint every N optimizer steps (0: only at the end).
    #[serde(default)]
    pub checkpoint_every: u64,
    /// How many checkpoints to keep in `RUN_DIR/checkpoints` (the newest ones).
    #[serde(default = "defaults::keep_checkpoints")]
    pub keep_checkpoints: usize,
    /// Print a log line and append a `metrics.jsonl` record every N optimizer steps.
    #[serde(default = "defaults::one_u64")]
    pub log_every: u64,
    /// Restrict attention to each row's own documents (block-diagonal causal mask, positions
    /// restarting at every document) instead of letting packed documents see each other.
    #[serde(default)]
    pub document_masking: bool,
    /// Optimizer steps of batches built ahead on a background thread.
    #[serde(default = "defaults::prefetch_depth")]
    pub prefetch_depth: usize,
    /// Backend: `"flex"` (CPU), `"cuda"` or `"wgpu"`.
    #[serde(default)]
    pub backend: BackendKind,
    /// Floating-point mode: `"fp32"` (default), `"bf16-mixed"` or `"fp16-mixed"`.
    #[serde(default, skip_serializing_if = "defaults::is_fp32")]
    pub precision: PrecisionKind,
    /// Activation checkpointing: `"none"` (default) or `"blocks"` (keep each block's input
    /// only, recompute the block in the backward).
    #[serde(default, skip_serializing_if = "defaults::is_none")]
    pub activation_checkpointing: CheckpointingKind,
    /// Peak FLOP/s of one device for MFU (default: the table of known GPUs; none on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_flops: Option<f64>,
    /// Refuse to start, before the model is allocated, when `ember estimate`'s peak memory of
    /// the run exceeds the RAM available (`MemAvailable`, or a cgroup limit; not checked on
    /// CUDA); `false` starts anyway (`observe::fits`).
    #[serde(default = "defaults::yes", skip_serializing_if = "defaults::is_true")]
    pub check_memory: bool,
    /// Device index for CUDA (`cuda:N`) or wgpu (the N-th adapter, `wgpu:N`); the first of
    /// `devices` when there are several.
    #[serde(default)]
    pub device: usize,
    /// Data-parallel replicas in this process, one thread and one model each: a count (`2`:
    /// CUDA devices or wgpu adapters `device`, `device + 1`; on the CPU, burn-flex replicas) or
    /// CUDA device / wgpu adapter indices (`[0, 1]`).
    #[serde(default)]
    pub devices: Devices,
    /// Data parallelism across processes and its gradient exchange (`[parallel]`).
    #[serde(default)]
    pub parallel: ParallelConfig,
    /// The model (`[model]`): `arch` (`"gpt2"`, the default, or `"llama"`), a `preset` name
    /// and/or explicit fields of [`ember_model::GptConfig`] / [`ember_model::LlamaConfig`]. `vocab_size` may be
    /// omitted: see [`RunConfig::resolve_vocab`].
    pub model: ModelConfig,
    /// Hugging Face safetensors weights to start from instead of a random initialization
    /// (fine-tuning); their shapes must fit `[model]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// Optimizer and schedule (`[optimizer]`).
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// The stability sentinel (`[sentinel]`): non-finite steps and loss spikes.
    #[serde(default)]
    pub sentinel: SentinelConfig,
    /// Where the configuration was read from and what it left to the data; not part of the
    /// file.
    #[serde(skip)]
    pub origin: Origin,
}

mod defaults {
    use super::{CheckpointingKind, PrecisionKind};

    pub fn is_none(c: &CheckpointingKind) -> bool {
        *c == CheckpointingKind::None
    }
    pub fn is_fp32(p: &PrecisionKind) -> bool {
        *p == PrecisionKind::Fp32
    }
    pub fn seed() -> u64 {
        1337
    }
    pub fn one() -> usize {
        1
    }
    pub fn one_u64() -> u64 {
        1
    }
    pub fn eval_every() -> u64 {
        250
    }
    pub fn eval_batches() -> usize {
        20
    }
    pub fn prefetch_depth() -> usize {
        2
    }
    pub fn keep_checkpoints() -> usize {
        2
    }
    pub fn yes() -> bool {
        true
    }
    pub fn is_true(b: &bool) -> bool {
        *b
    }
}

/// Where a configuration came from, for error messages, and whether its vocabulary is still to
/// be taken from the data.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origin {
    /// The TOML file (for a resumed run, `RUN_DIR/config.toml`).
    pub path: PathBuf,
    /// The overrides applied over the file, in order, each with how the user gave it.
    pub overrides: Vec<Override>,
    /// How `model.vocab_size` is settled (see [`RunConfig::resolve_vocab`]).
    pub vocab: VocabSource,
}

/// One `key=value` override of a configuration file, and how the user gave it, for messages:
/// `--set max_steps=100`, or a flag that sets a key (`--nodes 2` sets `parallel.nodes=2`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    /// `key=value` (a dotted key, a TOML value; a value that is not TOML is a string).
    pub set: String,
    /// What the user typed, named in errors: `--set key=value`, or the flag.
    pub label: String,
}

impl Override {
    /// A `--set key=value` argument.
    pub fn set(arg: impl Into<String>) -> Self {
        let set = arg.into();
        Self { label: format!("--set {set}"), set }
    }

    /// A flag that sets `key=value`, named in errors as `label` (e.g. `--nodes 2`).
    pub fn flag(set: impl Into<String>, label: impl Into<String>) -> Self {
        Self { set: set.into(), label: label.into() }
    }

    /// `--set` overrides, one per `key=value` argument.
    pub fn sets(args: &[String]) -> Vec<Self> {
        args.iter().map(Self::set).collect()
    }

    /// The label as messages show it: whole up to [`Override::SHOWN`] characters, else its
    /// start and its length (a 10,000-entry `devices` list is not echoed whole).
    pub fn shown(&self) -> String {
        let chars = self.label.chars().count();
        if chars <= Self::SHOWN {
            return self.label.clone();
        }
        let start: String = self.label.chars().take(Self::SHOWN - 20).collect();
        format!("{start}… ({chars} characters)")
    }

    /// The longest label shown whole.
    pub const SHOWN: usize = 120;
}

/// The dotted parts of a `--set` key, each trimmed (`model . n_head` is `model.n_head`): how
/// an override is applied and how an error finds the override that gave a key.
pub(super) fn set_key_parts(key: &str) -> Vec<&str> {
    key.split('.').map(str::trim).collect()
}

impl Origin {
    /// Key `key` is wrong, `message` says how: an error naming the last override that gave the
    /// key (or a table above it, or a key inside it) as the user gave it, else the file.
    pub fn at(&self, key: &str, message: impl Into<String>) -> ConfigError {
        self.at_any(&[key], message)
    }

    /// `keys[0]` is wrong in a check that relates all of `keys` (e.g. `model.d_model` and
    /// `model.n_head`), `message` says how: an error naming `keys[0]` and the last override
    /// that gave it, else the last that gave one of the other keys (or a table above one), else
    /// the file.
    pub fn at_any(&self, keys: &[&str], message: impl Into<String>) -> ConfigError {
        let gives = |o: &Override, key: &str| {
            o.set.split_once('=').is_some_and(|(k, _)| {
                let k = set_key_parts(k).join(".");
                // The key itself, a table above it, or a key inside it (`--set no.such.key=1`
                // makes an unknown table `no`).
                k == key || key.starts_with(&format!("{k}.")) || k.starts_with(&format!("{key}."))
            })
        };
        let last_giving =
            |keys: &[&str]| self.overrides.iter().rev().find(|o| keys.iter().any(|key| gives(o, key)));
        let set = last_giving(&keys[..1]).or_else(|| last_giving(keys));
        let source: PathBuf = set.map_or_else(|| self.path.clone(), |o| o.shown().into());
        ConfigError::at(source, keys[0], message)
    }

    /// The configuration as given, for a check of the whole of it (memory, the model on
    /// resume): the file, then each override as given (`config.toml with --set a=1 --nodes 2`).
    pub fn described(&self) -> String {
        let sets: String = self.overrides.iter().map(|o| format!(" {}", o.shown())).collect();
        let path = self.path.display();
        if sets.is_empty() {
            path.to_string()
        } else {
            format!("{path} with{sets}")
        }
    }
}

/// Where `model.vocab_size` comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VocabSource {
    /// The config gives it (or it was resolved already).
    #[default]
    Given,
    /// The config left it out: the preset's size if it holds the data's vocabulary, else the
    /// data's (the weights' with `init_from`). Until resolved, `model.vocab_size` is 0.
    Pending {
        /// The preset's vocabulary size, if a preset was named.
        preset: Option<usize>,
    },
}

impl RunConfig {
    /// The resolved configuration as TOML (what `RUN_DIR/config.toml` holds).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a RunConfig always serializes to TOML")
    }

    /// Data-parallel ranks in all: replicas per process × processes.
    pub fn world_size(&self) -> usize {
        self.devices.count() * self.parallel.nodes
    }

    /// Sequences per optimizer step: `micro_batch_size · accumulation_steps · world_size`.
    pub fn sequences_per_step(&self, world_size: usize) -> usize {
        self.micro_batch_size * self.accumulation_steps * world_size
    }

    /// Tokens per optimizer step (every window has `block_size` scored targets).
    pub fn tokens_per_step(&self, world_size: usize) -> usize {
        self.sequences_per_step(world_size) * self.model.block_size()
    }
}
