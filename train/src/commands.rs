//! Entry points of the `ember` binary, each run on the configured backend.

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use ember_data::{PreparedData, Split, WindowSampler};

use crate::backend::{run_on, BackendTask};
use crate::config::BackendKind;
use crate::error::TrainError;
use crate::eval::evaluate;
use crate::run::{train, RunOptions, RunSummary};
use crate::sample::{generate, SampleOptions};
use crate::trained::RunInfo;

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

/// Losses of a trained run's latest checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalReport {
    /// Mean NLL on the training split, nats/token.
    pub train_loss: f64,
    /// Mean NLL on the validation split, nats/token.
    pub val_loss: f64,
    /// Batches evaluated per split.
    pub batches: usize,
    /// Optimizer step of the checkpoint.
    pub step: u64,
}

/// Evaluates `RUN_DIR`'s latest checkpoint on `batches` batches of each split (default:
/// the run's `eval_batches`), on the run's backend unless `backend` overrides it.
pub fn eval_run(
    run_dir: &Path,
    batches: Option<usize>,
    backend: Option<BackendKind>,
) -> Result<EvalReport, TrainError> {
    struct Task {
        run_dir: PathBuf,
        info: RunInfo,
        batches: usize,
    }
    impl BackendTask for Task {
        type Output = EvalReport;
        fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<EvalReport, TrainError> {
            let model = self
                .info
                .load_model::<B::InnerBackend>(&self.run_dir, &device)?;
            let config = &self.info.config;
            let data_dir = config.data.clone().unwrap_or_default();
            let data = PreparedData::open(&data_dir)?;
            let sampler = WindowSampler::new(config.seed, config.model.block_size);
            let loss = |split| {
                evaluate(
                    &model,
                    &data,
                    split,
                    &sampler,
                    self.batches,
                    config.micro_batch_size,
                    &device,
                )
            };
            let step =
                crate::checkpoint::load_state(&crate::checkpoint::latest(&self.run_dir)?)?.step;
            Ok(EvalReport {
                train_loss: loss(Split::Train)?,
                val_loss: loss(Split::Val)?,
                batches: self.batches,
                step,
            })
        }
    }
    let info = RunInfo::read(run_dir, &[])?;
    let batches = batches.unwrap_or(info.config.eval_batches);
    let (kind, index) = (backend.unwrap_or(info.config.backend), info.config.device);
    run_on(
        kind,
        index,
        Task {
            run_dir: run_dir.into(),
            info,
            batches,
        },
    )
}

/// Samples text from `RUN_DIR`'s latest checkpoint (see [`generate`]).
pub fn sample_run(
    run_dir: &Path,
    options: &SampleOptions,
    backend: Option<BackendKind>,
) -> Result<String, TrainError> {
    struct Task<'a> {
        run_dir: PathBuf,
        info: RunInfo,
        options: &'a SampleOptions,
    }
    impl BackendTask for Task<'_> {
        type Output = String;
        fn run<B: AutodiffBackend>(self, device: B::Device) -> Result<String, TrainError> {
            let model = self
                .info
                .load_model::<B::InnerBackend>(&self.run_dir, &device)?;
            generate(&model, &self.info.tokenizer()?, self.options, &device)
        }
    }
    let info = RunInfo::read(run_dir, &[])?;
    let (kind, index) = (backend.unwrap_or(info.config.backend), info.config.device);
    run_on(
        kind,
        index,
        Task {
            run_dir: run_dir.into(),
            info,
            options,
        },
    )
}
