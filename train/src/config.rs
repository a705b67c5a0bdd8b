//! The run configuration: one TOML file (`examples/*.toml`), `--set key=value` overrides,
//! and validation whose errors name the file and the key.

use std::path::{Path, PathBuf};

use ember_model::{GptConfig, LlamaConfig, ModelConfig};
use serde::{Deserialize, Serialize};

/// Which Burn backend runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// `burn-flex`, the pure-Rust CPU backend (default; what tests use).
    #[default]
    Flex,
    /// `burn-cuda` (needs the `cuda` cargo feature and an NVIDIA driver).
    Cuda,
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

/// Replicas of a process: a count or explicit CUDA device indices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Devices {
    /// This many replicas (CUDA: devices `device..device + n`).
    Count(usize),
    /// These CUDA device indices.
    List(Vec<usize>),
}

impl Default for Devices {
    fn default() -> Self {
        Devices::Count(1)
    }
}

impl Devices {
    /// Device indices, the count form starting at `first`.
    pub fn indices(&self, first: usize) -> Vec<usize> {
        match self {
            Devices::Count(n) => (first..first + n).collect(),
            Devices::List(list) => list.clone(),
        }
    }
}

/// burn-collective's all-reduce algorithms (the same result, other traffic patterns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Every rank sends to one, which reduces and sends back.
    Centralized,
    /// A binary tree reduces up and broadcasts down.
    #[default]
    Tree,
    /// Ring all-reduce (reduce-scatter then all-gather).
    Ring,
}

/// Data parallelism across processes (`[parallel]`). Every address defaults to loopback.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParallelConfig {
    /// Processes ("nodes") training together; each runs `devices` replicas.
    pub nodes: usize,
    /// This process's index among the nodes (0 writes logs, metrics and checkpoints).
    pub node_rank: usize,
    /// `HOST:PORT` of burn-collective's global orchestrators (started by node 0, or by
    /// `ember coordinator`): they listen on PORT and PORT + 1.
    pub coordinator: String,
    /// Start the orchestrator in node 0's process (else run `ember coordinator`).
    pub start_coordinator: bool,
    /// The address other nodes reach this node at.
    pub node_address: String,
    /// The first data-service port of node 0 (default: the coordinator's port + 2); node r
    /// uses this + 2r and this + 2r + 1.
    pub data_port: Option<u16>,
    /// All-reduce algorithm, within a process and between nodes.
    pub strategy: Strategy,
    /// Seconds a rank waits for the others in an exchange before stopping with an error.
    pub timeout_s: u64,
    /// Compare the replicas' parameter hashes every N steps (0: at every logged step).
    pub check_every: u64,
    /// Set when the caller runs the orchestrators itself (the CLI starts a child process),
    /// so node 0 does not start them in-process; never saved.
    #[serde(skip)]
    pub coordinator_elsewhere: bool,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        Self {
            nodes: 1,
            node_rank: 0,
            coordinator: "127.0.0.1:29500".into(),
            start_coordinator: true,
            node_address: "127.0.0.1".into(),
            data_port: None,
            strategy: Strategy::Tree,
            timeout_s: 300,
            check_every: 0,
            coordinator_elsewhere: false,
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
    /// Backend: `"flex"` (CPU) or `"cuda"`.
    #[serde(default)]
    pub backend: BackendKind,
    /// Peak FLOP/s of one device for MFU (default: the table of known GPUs; none on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_flops: Option<f64>,
    /// Device index for CUDA (`cuda:N`); the first of `devices` when there are several.
    #[serde(default)]
    pub device: usize,
    /// Data-parallel replicas in this process, one thread and one model each: a count (`2`:
    /// CUDA devices `device`, `device + 1`; on the CPU, burn-flex replicas) or CUDA device
    /// indices (`[0, 1]`).
    #[serde(default)]
    pub devices: Devices,
    /// Data parallelism across processes and its gradient exchange (`[parallel]`).
    #[serde(default)]
    pub parallel: ParallelConfig,
    /// The model (`[model]`): `arch` (`"gpt2"`, the default, or `"llama"`), a `preset` name
    /// and/or explicit fields of [`GptConfig`] / [`LlamaConfig`]. `vocab_size` may be
    /// omitted: see [`RunConfig::resolve_vocab`].
    pub model: ModelConfig,
    /// Hugging Face safetensors weights to start from instead of a random initialization
    /// (fine-tuning); their shapes must fit `[model]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    /// Optimizer and schedule (`[optimizer]`).
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// The preset's vocabulary size when `model.vocab_size` was omitted (see
    /// [`RunConfig::resolve_vocab`]); not part of the file.
    #[serde(skip)]
    pub preset_vocab: Option<usize>,
}

mod defaults {
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
}

/// A configuration problem, naming the file and key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {error}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{path}: not valid TOML: {message}")]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A key is unknown, missing, or has a bad value.
    #[error("{path}: key `{key}`: {message}")]
    Key {
        /// The config file (or `--set` for an override).
        path: PathBuf,
        /// Dotted key, e.g. `optimizer.lr`.
        key: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// A `--set` argument is not `key=value`.
    #[error("--set {arg}: {message}")]
    Set {
        /// The argument as given.
        arg: String,
        /// What was expected.
        message: String,
    },
}

/// Value of `model.vocab_size` meaning "take it from the prepared data".
const VOCAB_FROM_DATA: usize = 0;

impl RunConfig {
    /// Reads `path`, applies `overrides` (`key=value`, dotted keys, TOML values; a value that
    /// is not TOML is taken as a string), resolves the model preset, and validates.
    ///
    /// Errors: unreadable file, bad TOML, unknown key, missing key, bad value, unknown preset —
    /// each naming the file and the key.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| ConfigError::Read { path: path.into(), error })?;
        Self::from_toml_str(&text, path, overrides)
    }

    /// Like [`RunConfig::load`] from TOML text; `path` only names the source in errors.
    pub fn from_toml_str(text: &str, path: &Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Syntax {
            path: path.into(),
            message: e.to_string(),
        })?;
        for arg in overrides {
            apply_override(&mut table, arg)?;
        }
        // A bad value set with --set is reported as such, not as the file's.
        let key_err = |key: &str, message: String| {
            let set = overrides.iter().rev().find(|arg| {
                arg.split_once('=')
                    .is_some_and(|(k, _)| k.trim() == key || key.starts_with(&format!("{}.", k.trim())))
            });
            ConfigError::Key {
                path: set.map_or_else(|| path.into(), |arg| format!("--set {arg}").into()),
                key: key.into(),
                message: message.lines().next().unwrap_or_default().trim().to_string(),
            }
        };
        let (model, preset_vocab) = match table.remove("model") {
            Some(toml::Value::Table(model)) => resolve_model(model).map_err(|(k, m)| key_err(&k, m))?,
            Some(_) => return Err(key_err("model", "must be a table ([model])".into())),
            None => return Err(key_err("model", "missing: add a [model] table".into())),
        };
        table.insert("model".into(), toml::Value::Table(model));
        let mut config: RunConfig =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let key = e.path().to_string();
                key_err(if key == "." { "(top level)" } else { &key }, e.inner().to_string())
            })?;
        if config.optimizer.lr_decay_steps.is_none() {
            config.optimizer.lr_decay_steps = Some(config.max_steps);
        }
        config.preset_vocab = preset_vocab;
        config.validate().map_err(|(k, m)| key_err(&k, m))?;
        Ok(config)
    }

    /// The resolved configuration as TOML (what `RUN_DIR/config.toml` holds).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a RunConfig always serializes to TOML")
    }

    /// Sets `model.vocab_size` when the config left it out: the preset's (e.g. GPT-2's padded
    /// 50304) if it holds the data's vocabulary, else the prepared data's own size. Checks
    /// that an explicit one is large enough.
    ///
    /// Errors: an explicit `model.vocab_size` smaller than the data's vocabulary.
    pub fn resolve_vocab(&mut self, data_vocab: usize) -> Result<(), (String, String)> {
        if self.model.vocab_size() == VOCAB_FROM_DATA {
            self.model.set_vocab_size(match self.preset_vocab {
                Some(preset) if preset >= data_vocab => preset,
                _ => data_vocab,
            });
        } else if self.model.vocab_size() < data_vocab {
            return Err((
                "model.vocab_size".into(),
                format!(
                    "{} is smaller than the prepared data's vocabulary ({data_vocab} tokens)",
                    self.model.vocab_size()
                ),
            ));
        }
        Ok(())
    }

    /// The vocabulary size of the prepared directory `data` names, or 0 when `data` is not a
    /// directory (unset, missing, or a text file not prepared yet).
    ///
    /// Errors: the directory is not valid prepared data.
    pub fn data_vocab(&self) -> Result<usize, ember_data::DataError> {
        match self.data.as_deref().filter(|d| d.is_dir()) {
            Some(dir) => Ok(ember_data::PreparedData::open(dir)?.meta.vocab_size),
            None => Ok(0),
        }
    }

    /// With `init_from` and no explicit `model.vocab_size`, the model takes the weights'
    /// vocabulary (the published GPT-2 has 50257 rows, while the `gpt2` preset pads to 50304).
    /// Call before [`RunConfig::resolve_vocab`].
    ///
    /// Errors: the weights cannot be read.
    pub fn adopt_weights_vocab(&mut self) -> Result<(), ember_model::hf::HfError> {
        if let (Some(path), VOCAB_FROM_DATA) = (&self.init_from, self.model.vocab_size()) {
            self.model.set_vocab_size(ember_model::hf::vocab_size(path)?);
        }
        Ok(())
    }

    /// Data-parallel ranks in all: replicas per process × processes.
    pub fn world_size(&self) -> usize {
        self.devices.indices(self.device).len() * self.parallel.nodes
    }

    /// Sequences per optimizer step: `micro_batch_size · accumulation_steps · world_size`.
    pub fn sequences_per_step(&self, world_size: usize) -> usize {
        self.micro_batch_size * self.accumulation_steps * world_size
    }

    /// Tokens per optimizer step (every window has `block_size` scored targets).
    pub fn tokens_per_step(&self, world_size: usize) -> usize {
        self.sequences_per_step(world_size) * self.model.block_size()
    }

    fn validate(&self) -> Result<(), (String, String)> {
        self.validate_fields().map_err(|(key, message)| (key.to_string(), message))?;
        let mut probe = self.model.clone();
        if probe.vocab_size() == VOCAB_FROM_DATA {
            probe.set_vocab_size(1);
        }
        probe.validate().map_err(|e| (format!("model.{}", e.field), e.message))
    }

    fn validate_fields(&self) -> Result<(), (&'static str, String)> {
        let positive = |key, v: u64| {
            if v == 0 {
                Err((key, "must be at least 1, got 0".to_string()))
            } else {
                Ok(())
            }
        };
        positive("max_steps", self.max_steps)?;
        positive("micro_batch_size", self.micro_batch_size as u64)?;
        positive("accumulation_steps", self.accumulation_steps as u64)?;
        positive("eval_batches", self.eval_batches as u64)?;
        positive("log_every", self.log_every)?;
        positive("keep_checkpoints", self.keep_checkpoints as u64)?;
        positive("prefetch_depth", self.prefetch_depth as u64)?;
        positive("devices", self.devices.indices(self.device).len() as u64)?;
        positive("parallel.nodes", self.parallel.nodes as u64)?;
        positive("parallel.timeout_s", self.parallel.timeout_s)?;
        if self.parallel.node_rank >= self.parallel.nodes {
            return Err((
                "parallel.node_rank",
                format!(
                    "must be below parallel.nodes ({}), got {}",
                    self.parallel.nodes, self.parallel.node_rank
                ),
            ));
        }
        let port = self.parallel.coordinator.rsplit_once(':').and_then(|(host, port)| {
            port.parse::<u16>().ok().filter(|&p| !host.is_empty() && p < u16::MAX - 1)
        });
        if port.is_none() {
            return Err((
                "parallel.coordinator",
                format!("expected HOST:PORT (PORT below 65534), got {:?}", self.parallel.coordinator),
            ));
        }
        if let Some(Err(e)) = self.tokenizer.as_deref().map(str::parse::<ember_data::TokenizerKind>) {
            return Err(("tokenizer", e.to_string()));
        }
        let o = &self.optimizer;
        let finite_pos = |key, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err((key, format!("must be a positive number, got {v}")))
            }
        };
        if let Some(peak) = self.peak_flops {
            finite_pos("peak_flops", peak)?;
        }
        finite_pos("optimizer.lr", o.lr)?;
        finite_pos("optimizer.eps", o.eps)?;
        if !(o.min_lr >= 0.0 && o.min_lr <= o.lr) {
            return Err(("optimizer.min_lr", format!("must be in [0, lr = {}], got {}", o.lr, o.min_lr)));
        }
        for (key, beta) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err((key, format!("must be in [0, 1), got {beta}")));
            }
        }
        for (key, v) in [("optimizer.weight_decay", o.weight_decay), ("optimizer.grad_clip", o.grad_clip)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err((key, format!("must be a number ≥ 0, got {v}")));
            }
        }
        let decay = o.lr_decay_steps.unwrap_or(self.max_steps);
        if decay < o.warmup_steps {
            return Err((
                "optimizer.lr_decay_steps",
                format!("must be ≥ warmup_steps ({}), got {decay}", o.warmup_steps),
            ));
        }
        Ok(())
    }
}

/// Builds the `[model]` table: the preset's fields (if `preset` is given) or the
/// architecture's defaults, overlaid with the explicit keys; unknown keys are errors. An
/// omitted `vocab_size` becomes [`VOCAB_FROM_DATA`], and the preset's is returned beside the
/// table. Returns `(key, message)` on error.
fn resolve_model(mut user: toml::Table) -> Result<(toml::Table, Option<usize>), (String, String)> {
    let arch = match user.remove("arch") {
        None => None,
        Some(toml::Value::String(arch)) if arch == "gpt2" || arch == "llama" => Some(arch),
        Some(other) => {
            return Err(("model.arch".into(), format!("expected \"gpt2\" or \"llama\", got {other}")))
        }
    };
    let mut model = match user.remove("preset") {
        None => arch_defaults(arch.as_deref().unwrap_or("gpt2")),
        Some(toml::Value::String(name)) => match ModelConfig::preset(&name) {
            Some(preset) => {
                if arch.as_deref().is_some_and(|a| a != preset.arch()) {
                    return Err((
                        "model.arch".into(),
                        format!(
                            "{:?} contradicts preset {name:?}, which is {:?}",
                            arch.unwrap(),
                            preset.arch()
                        ),
                    ));
                }
                table_of(&preset)
            }
            None => {
                return Err((
                    "model.preset".into(),
                    format!("unknown preset {name:?}; expected one of {:?}", ember_model::lm::preset_names()),
                ))
            }
        },
        Some(other) => return Err(("model.preset".into(), format!("expected a string, got {other}"))),
    };
    let arch = model["arch"].as_str().expect("every model table has an arch").to_string();
    let reference = table_of(&reference_config(&arch));
    let explicit_vocab = user.contains_key("vocab_size");
    for (key, value) in user {
        if !reference.contains_key(&key) {
            let known: Vec<&str> = reference.keys().map(String::as_str).filter(|k| *k != "arch").collect();
            return Err((
                format!("model.{key}"),
                format!("unknown key for arch {arch:?}; expected `arch`, `preset` or one of {known:?}"),
            ));
        }
        model.insert(key, value);
    }
    let mut preset_vocab = None;
    if !explicit_vocab {
        preset_vocab = model.get("vocab_size").and_then(toml::Value::as_integer).map(|v| v as usize);
        model.insert("vocab_size".into(), toml::Value::Integer(VOCAB_FROM_DATA as i64));
    }
    Ok((model, preset_vocab))
}

/// A complete config of `arch`, whose keys are the ones `[model]` accepts.
fn reference_config(arch: &str) -> ModelConfig {
    match arch {
        "llama" => ModelConfig::Llama(LlamaConfig::new(1, 1, 1, 1, 2, 1, 1)),
        _ => ModelConfig::Gpt2(GptConfig::new(1, 1, 1, 1, 1)),
    }
}

/// Burn's `Config` derive does not apply its defaults when deserializing: start from them,
/// leaving out the sizes that have none.
fn arch_defaults(arch: &str) -> toml::Table {
    let mut defaults = table_of(&reference_config(arch));
    for required in ["vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "block_size"] {
        defaults.remove(required);
    }
    defaults
}

fn table_of(config: &ModelConfig) -> toml::Table {
    toml::Table::try_from(config).expect("a model config serializes to a TOML table")
}

/// Applies one `key=value` override to the raw TOML table.
fn apply_override(table: &mut toml::Table, arg: &str) -> Result<(), ConfigError> {
    let set_err = |message: &str| ConfigError::Set { arg: arg.into(), message: message.into() };
    let (key, raw) = arg.split_once('=').ok_or_else(|| set_err("expected key=value, e.g. max_steps=100"))?;
    let key = key.trim();
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(set_err("empty key; expected a dotted key such as optimizer.lr"));
    }
    // A TOML value if it parses as one (numbers, booleans, quoted strings, arrays), else a string.
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().expect("split yields at least one part");
    let mut node = table;
    for part in parts {
        let entry = node.entry(part).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = entry.as_table_mut().ok_or_else(|| set_err(&format!("`{part}` is not a table")))?;
    }
    node.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
max_steps = 10
micro_batch_size = 2
[model]
preset = "tiny"
n_layer = 3
[optimizer]
lr = 1e-3
"#;

    fn load(text: &str, overrides: &[&str]) -> Result<RunConfig, ConfigError> {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        RunConfig::from_toml_str(text, Path::new("run.toml"), &overrides)
    }

    #[test]
    fn preset_fields_are_overlaid_by_explicit_keys() {
        let mut c = load(BASE, &[]).unwrap();
        let ModelConfig::Gpt2(m) = &c.model else { panic!("tiny is a GPT-2 preset") };
        assert_eq!((m.n_layer, m.d_model), (3, 32));
        c.resolve_vocab(50).unwrap();
        assert_eq!(c.model.vocab_size(), 64, "the preset's vocabulary holds the data's");
        assert_eq!(c.optimizer.lr_decay_steps, Some(10));
        assert_eq!(c.seed, 1337);
    }

    #[test]
    fn set_overrides_stable_keys_and_nested_ones() {
        let c = load(
            BASE,
            &[
                "max_steps=7",
                "seed=3",
                "eval_every=2",
                "eval_batches=4",
                "checkpoint_every=5",
                "optimizer.lr=0.01",
                "model.dropout=0.1",
            ],
        )
        .unwrap();
        assert_eq!((c.max_steps, c.seed, c.eval_every, c.eval_batches, c.checkpoint_every), (7, 3, 2, 4, 5));
        assert_eq!(c.optimizer.lr, 0.01);
        assert!(matches!(&c.model, ModelConfig::Gpt2(m) if m.dropout == 0.1));
    }

    #[test]
    fn unknown_top_level_key_names_file_and_key() {
        let err = load(&format!("max_step = 3\n{BASE}"), &[]).unwrap_err().to_string();
        assert!(err.starts_with("run.toml: "), "{err}");
        assert!(err.contains("unknown field `max_step`"), "{err}");
    }

    #[test]
    fn unknown_model_and_optimizer_keys_are_errors() {
        let err = load(BASE, &["model.n_heads=2"]).unwrap_err().to_string();
        assert!(err.contains("key `model.n_heads`: unknown key for arch \"gpt2\""), "{err}");
        let err = load(BASE, &["optimizer.learning_rate=2"]).unwrap_err().to_string();
        assert!(err.contains("optimizer") && err.contains("learning_rate"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let err = load(BASE, &["micro_batch_size=\"four\""]).unwrap_err().to_string();
        assert!(err.contains("key `micro_batch_size`"), "{err}");
        let err = load(BASE, &["model.n_head=5"]).unwrap_err().to_string();
        assert!(err.contains("key `model.d_model`") && err.contains("divisible by n_head (5)"), "{err}");
        let err = load(BASE, &["optimizer.min_lr=1"]).unwrap_err().to_string();
        assert!(err.contains("key `optimizer.min_lr`"), "{err}");
        let err = load(BASE, &["model.preset=\"gpt9\""]).unwrap_err().to_string();
        assert!(err.contains("key `model.preset`") && err.contains("gpt9"), "{err}");
        let err = load("max_steps = 1\nmicro_batch_size = 1\n", &[]).unwrap_err().to_string();
        assert!(err.contains("key `model`: missing"), "{err}");
    }

    #[test]
    fn malformed_set_and_toml_are_errors() {
        assert!(matches!(load(BASE, &["max_steps"]), Err(ConfigError::Set { .. })));
        assert!(matches!(load("max_steps = = 3", &[]), Err(ConfigError::Syntax { .. })));
    }

    #[test]
    fn vocab_comes_from_data_when_omitted() {
        let text = "max_steps = 1\nmicro_batch_size = 1\n[model]\nn_layer = 1\nn_head = 1\nd_model = 8\nblock_size = 4\n";
        let mut c = load(text, &[]).unwrap();
        c.resolve_vocab(66).unwrap();
        assert_eq!(c.model.vocab_size(), 66);
        let ModelConfig::Gpt2(m) = &c.model else { panic!("gpt2 is the default arch") };
        assert_eq!((m.dropout, m.bias, m.tie_embeddings), (0.0, true, true), "Burn's defaults");
        let err =
            load("max_steps = 1\nmicro_batch_size = 1\n[model]\nn_layer = 1\n", &[]).unwrap_err().to_string();
        assert!(err.contains("key `model`") && err.contains("missing field"), "{err}");
        let mut small = load(BASE, &["model.vocab_size=10"]).unwrap();
        assert!(small.resolve_vocab(66).is_err());
        let mut preset_too_small = load(BASE, &[]).unwrap();
        preset_too_small.resolve_vocab(66).unwrap();
        assert_eq!(preset_too_small.model.vocab_size(), 66, "data's vocabulary when the preset's is smaller");
        let mut gpt2 = load(BASE, &["model.preset=\"gpt2\""]).unwrap();
        gpt2.resolve_vocab(50257).unwrap();
        assert_eq!(gpt2.model.vocab_size(), 50304, "GPT-2's padded vocabulary");
    }

    #[test]
    fn resolved_config_round_trips_through_toml() {
        let mut c = load(BASE, &[]).unwrap();
        c.resolve_vocab(64).unwrap();
        c.preset_vocab = None;
        let again = RunConfig::from_toml_str(&c.to_toml(), Path::new("config.toml"), &[]).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn tokens_per_step_counts_all_micro_batches() {
        let c = load(BASE, &["accumulation_steps=4"]).unwrap();
        assert_eq!(c.sequences_per_step(1), 8);
        assert_eq!(c.tokens_per_step(2), 2 * 4 * 2 * 16);
    }

    #[test]
    fn llama_models_come_from_a_preset_or_explicit_fields() {
        let c = load(BASE, &["model.preset=\"llama-tiny\"", "model.n_layer=3"]).unwrap();
        let ModelConfig::Llama(m) = &c.model else { panic!("llama-tiny is a Llama preset") };
        assert_eq!((m.n_layer, m.n_head, m.n_kv_head), (3, 4, 2));
        let text = "max_steps = 1\nmicro_batch_size = 1\n[model]\narch = \"llama\"\nn_layer = 1\nn_head = 2\nn_kv_head = 1\nd_model = 8\nd_ff = 16\nblock_size = 4\n";
        let c = load(text, &[]).unwrap();
        assert!(matches!(&c.model, ModelConfig::Llama(m) if m.rope_theta == 10000.0 && !m.tie_embeddings));
        let err = load(BASE, &["model.n_kv_head=1"]).unwrap_err().to_string();
        assert!(err.contains("key `model.n_kv_head`: unknown key for arch \"gpt2\""), "{err}");
        let err = load(BASE, &["model.arch=\"llama\""]).unwrap_err().to_string();
        assert!(err.contains("contradicts preset \"tiny\""), "{err}");
    }
}
