//! Entry points of the `ember` binary, each run on the configured backend.

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use std::sync::Arc;

use ember_data::{DataView, Split};

use crate::backend::{run_on, BackendTask};
use crate::config::BackendKind;
use crate::error::TrainError;
use crate::eval::evaluate;
use crate::run::{train, RunOptions, RunSummary};
use crate::sample::{generate, SampleOptions};
use crate::trained::{Source, Trained};

/// Trains (or resumes) on `options.config.backend`; `log` receives every line.
pub fn train_run(options: RunOptions, log: &mut dyn FnMut(&str)) -> Result<RunSummary, TrainError> {
    struct Task<'a> {
        options: RunOptions,
        log: &'a mut dyn FnMut(&str),
    }
    impl BackendTask for Task<'_> {
        type Output = RunSummary;
        fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<RunSummary, TrainError> {
            train::<B>(self.options, devices, self.log)
        }
    }
    let backend = options.config.backend;
    let indices = options.config.devices.indices(options.config.device);
    run_on(backend, &indices, Task { options, log })
}

/// Losses of a trained model.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalReport {
    /// Mean NLL on the training split, nats/token.
    pub train_loss: f64,
    /// Mean NLL on the validation split, nats/token.
    pub val_loss: f64,
    /// Batches evaluated per split.
    pub batches: usize,
    /// Optimizer step of the weights (0 for imported ones).
    pub step: u64,
}

/// Evaluates `source`'s weights on `batches` batches of each split (default: the config's
/// `eval_batches`), on its backend unless `backend` overrides it.
pub fn eval_run(
    source: Source,
    batches: Option<usize>,
    backend: Option<BackendKind>,
) -> Result<EvalReport, TrainError> {
    struct Task {
        trained: Trained,
        batches: usize,
    }
    impl BackendTask for Task {
        type Output = EvalReport;
        fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<EvalReport, TrainError> {
            let device = devices.into_iter().next().expect("one device");
            let model = self.trained.load_model::<B::InnerBackend>(&device)?;
            let config = &self.trained.config;
            let data = Arc::new(self.trained.data()?);
            let loss = |split| -> Result<f64, TrainError> {
                let view =
                    DataView::new(data.clone(), split, config.model.block_size(), config.document_masking)?;
                evaluate(&model, &view, config.seed, self.batches, config.micro_batch_size, &device)
            };
            let step = self.trained.step()?;
            Ok(EvalReport {
                train_loss: loss(Split::Train)?,
                val_loss: loss(Split::Val)?,
                batches: self.batches,
                step,
            })
        }
    }
    let trained = Trained::open(source)?;
    let batches = batches.unwrap_or(trained.config.eval_batches);
    let (kind, index) = (backend.unwrap_or(trained.config.backend), trained.config.device);
    run_on(kind, &[index], Task { trained, batches })
}

/// Samples text from `source`'s weights (see [`generate`]).
pub fn sample_run(
    source: Source,
    options: &SampleOptions,
    backend: Option<BackendKind>,
) -> Result<String, TrainError> {
    struct Task<'a> {
        trained: Trained,
        options: &'a SampleOptions,
    }
    impl BackendTask for Task<'_> {
        type Output = String;
        fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<String, TrainError> {
            let device = devices.into_iter().next().expect("one device");
            let model = self.trained.load_model::<B::InnerBackend>(&device)?;
            generate(&model, &self.trained.tokenizer()?, self.options, &device)
        }
    }
    let trained = Trained::open(source)?;
    let (kind, index) = (backend.unwrap_or(trained.config.backend), trained.config.device);
    run_on(kind, &[index], Task { trained, options })
}

/// Weight formats of `ember export`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// Hugging Face `GPT2LMHeadModel` safetensors.
    HfGpt2,
    /// Hugging Face `LlamaForCausalLM` safetensors.
    HfLlama,
}

impl std::str::FromStr for ExportFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hf-gpt2" => Ok(ExportFormat::HfGpt2),
            "hf-llama" => Ok(ExportFormat::HfLlama),
            other => Err(format!("unknown format {other:?}; expected hf-gpt2 or hf-llama")),
        }
    }
}

/// Writes the latest checkpoint of `run_dir` to `out` in `format` (CPU; no GPU needed), and
/// the matching Hugging Face `config.json` beside it (so `from_pretrained(dir)` works).
/// Returns the paths written.
///
/// Errors: a format of another architecture than the run's; no checkpoint; an unwritable
/// `out`.
pub fn export_run(run_dir: &Path, format: ExportFormat, out: &Path) -> Result<Vec<PathBuf>, TrainError> {
    let trained = Trained::open(Source::Run(run_dir.into()))?;
    let arch = trained.config.model.arch();
    let wanted = match format {
        ExportFormat::HfGpt2 => "gpt2",
        ExportFormat::HfLlama => "llama",
    };
    if arch != wanted {
        return Err(TrainError::Checkpoint {
            path: run_dir.into(),
            message: format!("the run's model is {arch:?}; export it with --format hf-{arch}"),
        });
    }
    let model = trained.load_model::<burn::backend::Flex>(&Default::default())?;
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(TrainError::io(parent))?;
    }
    ember_model::hf::save(&model, out)?;
    let config_json = out.with_file_name("config.json");
    let text = serde_json::to_string_pretty(&hf_config(&trained.config.model)).expect("JSON");
    crate::fsutil::write_atomic(&config_json, text.as_bytes())?;
    Ok(vec![out.into(), config_json])
}

/// The Hugging Face `config.json` of a model (`GPT2Config` / `LlamaConfig` field names).
/// A GPT-2 without biases has no Hugging Face equivalent (`GPT2LMHeadModel` always has them).
pub fn hf_config(config: &ember_model::ModelConfig) -> serde_json::Value {
    match config {
        ember_model::ModelConfig::Gpt2(c) => serde_json::json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "vocab_size": c.vocab_size,
            "n_positions": c.block_size,
            "n_ctx": c.block_size,
            "n_embd": c.d_model,
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "activation_function": if c.gelu == ember_model::GeluKind::Erf { "gelu" } else { "gelu_new" },
            "layer_norm_epsilon": c.layer_norm_eps,
            "resid_pdrop": c.dropout,
            "embd_pdrop": c.dropout,
            "attn_pdrop": c.dropout,
            "tie_word_embeddings": c.tie_embeddings,
            "torch_dtype": "float32",
        }),
        ember_model::ModelConfig::Llama(c) => serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": c.vocab_size,
            "hidden_size": c.d_model,
            "intermediate_size": c.d_ff,
            "num_hidden_layers": c.n_layer,
            "num_attention_heads": c.n_head,
            "num_key_value_heads": c.n_kv_head,
            "max_position_embeddings": c.block_size,
            "rope_theta": c.rope_theta,
            "rms_norm_eps": c.rms_norm_eps,
            "tie_word_embeddings": c.tie_embeddings,
            "hidden_act": "silu",
            "attention_bias": false,
            "mlp_bias": false,
            "torch_dtype": "float32",
        }),
    }
}

/// Benchmarks `config` on `backend` (default: the config's): `warmup` then `steps` optimizer
/// steps on random tokens. The vocabulary comes from `model.vocab_size`, the preset, or the
/// prepared `data` directory. `peak_flops` overrides the device table for the MFU.
///
/// Errors: an unknown vocabulary, an unusable backend.
pub fn bench_run(
    mut config: crate::RunConfig,
    steps: usize,
    warmup: usize,
    backend: Option<BackendKind>,
    peak_flops: Option<f64>,
) -> Result<crate::bench::BenchReport, TrainError> {
    // The prepared data's vocabulary, else (no data) the preset's, if it has one.
    let data_vocab = config.data_vocab()?;
    config.resolve_vocab(data_vocab).map_err(|(key, message)| crate::config::ConfigError::Key {
        path: config.data.clone().unwrap_or_default(),
        key,
        message,
    })?;
    if config.model.vocab_size() == 0 {
        return Err(crate::config::ConfigError::Key {
            path: "config".into(),
            key: "model.vocab_size".into(),
            message: "unknown: set it (--set model.vocab_size=N) or point `data` at a prepared directory"
                .into(),
        }
        .into());
    }
    struct Task {
        config: crate::RunConfig,
        steps: usize,
        warmup: usize,
        peak_flops: Option<f64>,
        name: String,
    }
    impl BackendTask for Task {
        type Output = crate::bench::BenchReport;
        fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<Self::Output, TrainError> {
            let device = devices.into_iter().next().expect("one device");
            crate::bench::bench::<B>(
                &self.config,
                self.steps,
                self.warmup,
                self.peak_flops,
                &device,
                self.name,
            )
        }
    }
    let kind = backend.unwrap_or(config.backend);
    let (name, table_peak) = match kind {
        BackendKind::Flex => (format!("cpu (burn-flex, {} threads)", rayon_threads()), None),
        BackendKind::Cuda => {
            let model = crate::bench::gpu_model(config.device).unwrap_or_else(|| "unknown NVIDIA GPU".into());
            (format!("cuda:{} ({model})", config.device), crate::accounting::table_peak_flops(&config))
        }
    };
    let peak_flops = peak_flops.or(config.peak_flops).or(table_peak);
    let device = config.device;
    run_on(kind, &[device], Task { config, steps, warmup, peak_flops, name })
}

fn rayon_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
