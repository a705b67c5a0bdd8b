//! Entry points of the `ember` binary — train, eval, sample, bench — each run on the
//! configured backend.

use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use ember_data::{DataView, Split};

use super::backend::{check_precision, run_on, BackendTask};
use super::bench::{bench, BenchReport};
use super::sample::{generate, SampleOptions};
use super::trained::{Source, Trained};
use crate::config::{BackendKind, RunConfig};
use crate::error::TrainError;
use crate::observe::accounting::table_peak_flops;
use crate::observe::device::describe_device;
use crate::runner::{train, RunOptions, RunSummary};
use crate::step::eval::{evaluate, Evaluation};

/// Trains (or resumes) on `options.config.backend`; `log` receives every line.
pub fn train_run(options: RunOptions, log: &mut (dyn FnMut(&str) + Send)) -> Result<RunSummary, TrainError> {
    struct Task<'a> {
        options: RunOptions,
        log: &'a mut (dyn FnMut(&str) + Send),
    }
    impl BackendTask for Task<'_> {
        type Output = RunSummary;
        fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<RunSummary, TrainError> {
            train::<B>(self.options, devices, self.log)
        }
        fn single_rank(&self) -> bool {
            self.options.config.world_size() == 1
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
    /// Batches evaluated on the training split: those asked for, at most the split's.
    pub train_batches: usize,
    /// Batches evaluated on the validation split: those asked for, at most the split's.
    pub val_batches: usize,
    /// Batches asked for per split.
    pub batches: usize,
    /// Optimizer step of the weights (0 for imported ones).
    pub step: u64,
    /// The run's `precision`, in which the forward passes ran (as in training).
    pub precision: crate::config::PrecisionKind,
}

/// Evaluates `source`'s weights on `batches` batches of each split (default: the config's
/// `eval_batches`; a split smaller than that is evaluated whole, see
/// [`crate::step::eval::eval_batches`]), on its backend unless `backend` overrides it.
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
            let loss = |split| -> Result<Evaluation, TrainError> {
                let view =
                    DataView::new(data.clone(), split, config.model.block_size(), config.document_masking)?;
                ember_model::autocast(config.precision.mode(), || {
                    evaluate(&model, &view, config.seed, self.batches, config.micro_batch_size, &device)
                })
            };
            let step = self.trained.step()?;
            let (train, val) = (loss(Split::Train)?, loss(Split::Val)?);
            Ok(EvalReport {
                train_loss: train.nats,
                val_loss: val.nats,
                train_batches: train.batches,
                val_batches: val.batches,
                batches: self.batches,
                step,
                precision: config.precision,
            })
        }
    }
    let trained = Trained::open(source)?;
    let batches = batches.unwrap_or(trained.config.eval_batches);
    let (kind, index) = (backend.unwrap_or(trained.config.backend), trained.config.device);
    check_precision(kind, trained.config.precision)?;
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

/// Benchmarks `config` on `backend` (default: the config's): `warmup` then `steps` optimizer
/// steps on random tokens. The vocabulary comes from `model.vocab_size`, the preset, or the
/// prepared `data` directory. `peak_flops` overrides the device table for the MFU. With
/// `matmul_peak`, also measures the device's f32 matmul FLOP/s ([`CPU_MATMUL_SIZE`]³ on the
/// CPU, [`CUDA_MATMUL_SIZE`]³ on CUDA, [`WGPU_MATMUL_SIZE`]³ on a wgpu GPU,
/// [`WGPU_SOFTWARE_MATMUL_SIZE`]³ on a software adapter) for the MFU against it.
///
/// Errors: an unknown vocabulary, an unusable backend.
pub fn bench_run(
    mut config: RunConfig,
    steps: usize,
    warmup: usize,
    backend: Option<BackendKind>,
    peak_flops: Option<f64>,
    matmul_peak: bool,
) -> Result<BenchReport, TrainError> {
    // The prepared data's vocabulary, else (no data) the preset's, if it has one.
    let data_vocab = config.data_vocab()?;
    config.resolve_vocab(data_vocab)?;
    struct Task {
        config: RunConfig,
        steps: usize,
        warmup: usize,
        peak_flops: Option<f64>,
        matmul_size: Option<usize>,
        name: String,
    }
    impl BackendTask for Task {
        type Output = BenchReport;
        fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<Self::Output, TrainError> {
            let device = devices.into_iter().next().expect("one device");
            let (steps, warmup, peak, matmul) = (self.steps, self.warmup, self.peak_flops, self.matmul_size);
            bench::<B>(&self.config, steps, warmup, peak, matmul, &device, self.name)
        }
    }
    let kind = backend.unwrap_or(config.backend);
    check_precision(kind, config.precision)?;
    // The run is on `kind`: its estimate models that backend's memory (`Mode::of`).
    config.backend = kind;
    let name = describe_device(kind, config.device);
    let table_peak = match kind {
        BackendKind::Cuda => table_peak_flops(&config),
        BackendKind::Flex | BackendKind::Wgpu => None,
    };
    let peak_flops = peak_flops.or(config.peak_flops).or(table_peak);
    let matmul_size = matmul_peak.then_some(match kind {
        BackendKind::Flex => CPU_MATMUL_SIZE,
        BackendKind::Cuda => CUDA_MATMUL_SIZE,
        BackendKind::Wgpu => match crate::observe::adapters::adapters().get(config.device) {
            Some(a) if a.kind == crate::observe::adapters::AdapterKind::Software => WGPU_SOFTWARE_MATMUL_SIZE,
            _ => WGPU_MATMUL_SIZE,
        },
    });
    let device = config.device;
    run_on(kind, &[device], Task { config, steps, warmup, peak_flops, matmul_size, name })
}

/// Side of `ember bench`'s peak matmul on the CPU: 2048³ (17.2 GFLOP, ~0.1 s at the ~200
/// GFLOP/s of two AVX-512 cores) is large enough for the kernel's steady state.
pub const CPU_MATMUL_SIZE: usize = 2048;
/// Side of the peak matmul on CUDA: 8192³ (1.1 TFLOP; three 268 MB operands) keeps a
/// data-centre GPU busy for tens of milliseconds per run.
pub const CUDA_MATMUL_SIZE: usize = 8192;
/// Side of the peak matmul on a wgpu GPU: 2048³ (17.2 GFLOP), a few ms on a discrete GPU.
pub const WGPU_MATMUL_SIZE: usize = 2048;
/// Side of the peak matmul on a software wgpu adapter (Mesa's lavapipe): 512³ (0.27 GFLOP).
/// At 2048³ lavapipe's ~5 GFLOP/s and the autotuner's trials took 5 minutes on 2 cores; a
/// software adapter's peak only says how slow it is.
pub const WGPU_SOFTWARE_MATMUL_SIZE: usize = 512;
