//! Entry points of the `ember` binary, each run on the configured backend.

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use ember_data::{Split, WindowSampler};

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
        fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<RunSummary, TrainError> {
            train::<B>(self.options, device, self.log)
        }
    }
    let (backend, index) = (options.config.backend, options.config.device);
    run_on(backend, index, Task { options, log })
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
        fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<EvalReport, TrainError> {
            let model = self.trained.load_model::<B::InnerBackend>(&device)?;
            let config = &self.trained.config;
            let data = self.trained.data()?;
            let sampler = WindowSampler::new(config.seed, config.model.block_size());
            let loss = |split| {
                evaluate(&model, &data, split, &sampler, self.batches, config.micro_batch_size, &device)
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
    run_on(kind, index, Task { trained, batches })
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
        fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<String, TrainError> {
            let model = self.trained.load_model::<B::InnerBackend>(&device)?;
            generate(&model, &self.trained.tokenizer()?, self.options, &device)
        }
    }
    let trained = Trained::open(source)?;
    let (kind, index) = (backend.unwrap_or(trained.config.backend), trained.config.device);
    run_on(kind, index, Task { trained, options })
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

/// Writes the latest checkpoint of `run_dir` to `out` in `format` (CPU; no GPU needed).
///
/// Errors: a format of another architecture than the run's; no checkpoint; an unwritable
/// `out`.
pub fn export_run(run_dir: &Path, format: ExportFormat, out: &Path) -> Result<PathBuf, TrainError> {
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
    ember_model::hf::save(&model, out)?;
    Ok(out.into())
}
