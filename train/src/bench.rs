//! `ember bench`: optimizer steps on random tokens, timed by phase, with throughput, MFU and
//! peak memory beside the [`crate::accounting`] estimate.

use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use ember_data::Batch;
use ember_model::LanguageModel;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::accounting::{estimate, Estimate, Precision};
use crate::config::RunConfig;
use crate::device_memory::{device_memory, DeviceMemory};
use crate::error::TrainError;
use crate::optim::{clip_grad_norm, scale_grads, AdamWGroups};
use crate::step::accumulate;
use crate::sync::scalar;

/// Mean milliseconds per optimizer step in each phase (each ended by a device sync).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Phases {
    /// Building the micro-batches (random tokens here).
    pub data_ms: f64,
    /// Forward and backward passes of every micro-batch.
    pub forward_backward_ms: f64,
    /// Gradient exchange (0 on one device).
    pub sync_ms: f64,
    /// Clipping and the AdamW update.
    pub optimizer_ms: f64,
}

/// What `ember bench` measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Backend and device, in words.
    pub device: String,
    /// Optimizer steps timed (after the warm-up steps).
    pub steps: usize,
    /// Tokens per optimizer step.
    pub tokens_per_step: u64,
    /// Tokens per second over the timed steps.
    pub tokens_per_sec: f64,
    /// Milliseconds per optimizer step.
    pub ms_per_step: f64,
    /// The split of a step.
    pub phases: Phases,
    /// Model FLOPs utilization: `flops_per_token × tokens/s ÷ peak FLOP/s` (PaLM, Appendix B),
    /// when the peak is known.
    pub mfu: Option<f64>,
    /// Process resident memory before the model was built, bytes.
    pub baseline_rss_bytes: u64,
    /// Peak process resident memory, bytes (Linux `VmHWM`).
    pub peak_rss_bytes: u64,
    /// On CUDA: the most bytes in use in the device pool at a phase boundary (after the
    /// forward+backward, when gradients are alive), and the bytes the pool reserved by the end
    /// (its high-water mark); `None` on the CPU.
    pub device_memory: Option<DeviceMemory>,
    /// The accounting of this configuration.
    pub estimate: Estimate,
    /// Vocabulary size of the model.
    pub vocab_size: usize,
    /// Mean loss of the last timed step (nats/token), a sanity check: ≈ ln(vocab) on random tokens.
    pub last_loss: f64,
}

/// Runs `warmup` and then `steps` timed optimizer steps of `config` (micro-batches, accumulation
/// steps; one device) on random tokens; `peak_flops` (FLOP/s) gives the MFU.
///
/// Errors: an unusable configuration (the vocabulary must be known: `model.vocab_size`).
pub fn bench<B: AutodiffBackend>(
    config: &RunConfig,
    steps: usize,
    warmup: usize,
    peak_flops: Option<f64>,
    device: &B::Device,
    device_name: String,
) -> Result<BenchReport, TrainError> {
    let baseline_rss_bytes = rss_bytes("VmRSS:").unwrap_or(0);
    B::seed(device, config.seed);
    let mut model: LanguageModel<B> = config
        .model
        .init(device)
        .map_err(|e| TrainError::Backend(format!("model.{}: {}", e.field, e.message)))?;
    let mut optimizer = AdamWGroups::new(&config.optimizer, &model);
    let (vocab, seq_len) = (config.model.vocab_size(), config.model.block_size());
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let mut random_batch = || {
        let n = config.micro_batch_size * seq_len;
        Batch {
            batch_size: config.micro_batch_size,
            seq_len,
            inputs: (0..n).map(|_| rng.random_range(0..vocab as u32)).collect(),
            targets: (0..n).map(|_| rng.random_range(0..vocab as i32)).collect(),
            segments: None,
        }
    };
    let mut phases = [Duration::ZERO; 4];
    let mut max_in_use: Option<u64> = None;
    let mut last_loss = f64::NAN;
    let mut timed = Duration::ZERO;
    for step in 0..warmup + steps {
        let mut clock = Clock::<B>::new(device);
        let batches: Vec<Batch> = (0..config.accumulation_steps).map(|_| random_batch()).collect();
        let data = clock.lap();
        let (mut grads, nll, tokens) = accumulate(&model, &batches, device);
        scale_grads(&model, &mut grads, 1.0 / tokens.max(1) as f64);
        let loss = scalar(nll) / tokens.max(1) as f64;
        let forward_backward = clock.lap();
        if let Some(now) = device_memory(device) {
            max_in_use = Some(max_in_use.unwrap_or(0).max(now.in_use_bytes));
        }
        let sync = Duration::ZERO;
        clip_grad_norm(&model, &mut grads, config.optimizer.grad_clip);
        model = optimizer.step(config.optimizer.lr, model, grads);
        let optimizer_time = clock.lap();
        if step >= warmup {
            for (total, lap) in phases.iter_mut().zip([data, forward_backward, sync, optimizer_time]) {
                *total += lap;
            }
            timed += clock.total();
            last_loss = loss;
        }
    }
    let per_step_ms = |d: Duration| 1e3 * d.as_secs_f64() / steps.max(1) as f64;
    let tokens_per_step = config.tokens_per_step(1) as u64;
    let tokens_per_sec = (tokens_per_step as f64 * steps as f64) / timed.as_secs_f64().max(1e-12);
    let mfu_assumed = 0.4;
    let estimate = estimate(
        &config.model,
        config.micro_batch_size as u64,
        seq_len as u64,
        tokens_per_step,
        1,
        Precision::Fp32,
        true,
        peak_flops,
        mfu_assumed,
    );
    Ok(BenchReport {
        device: device_name,
        steps,
        tokens_per_step,
        tokens_per_sec,
        ms_per_step: per_step_ms(timed),
        phases: Phases {
            data_ms: per_step_ms(phases[0]),
            forward_backward_ms: per_step_ms(phases[1]),
            sync_ms: per_step_ms(phases[2]),
            optimizer_ms: per_step_ms(phases[3]),
        },
        mfu: peak_flops.map(|peak| estimate.flops_per_token as f64 * tokens_per_sec / peak),
        baseline_rss_bytes,
        peak_rss_bytes: rss_bytes("VmHWM:").unwrap_or(0),
        device_memory: max_in_use.and_then(|in_use_bytes| {
            Some(DeviceMemory { in_use_bytes, reserved_bytes: device_memory(device)?.reserved_bytes })
        }),
        estimate,
        vocab_size: vocab,
        last_loss,
    })
}

/// Phase timer: each lap waits for the device to finish its queued work first.
struct Clock<'a, B: AutodiffBackend> {
    device: &'a B::Device,
    start: Instant,
    last: Instant,
}

impl<'a, B: AutodiffBackend> Clock<'a, B> {
    fn new(device: &'a B::Device) -> Self {
        let now = Instant::now();
        Self { device, start: now, last: now }
    }

    fn lap(&mut self) -> Duration {
        let _ = B::sync(self.device);
        let now = Instant::now();
        let lap = now - self.last;
        self.last = now;
        lap
    }

    fn total(&self) -> Duration {
        self.last - self.start
    }
}

/// A `/proc/self/status` memory line (`VmRSS:`, `VmHWM:`) in bytes; `None` off Linux.
pub fn rss_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// The model name of NVIDIA GPU `index` from the driver's `/proc` entry (Linux), e.g.
/// `NVIDIA H200`.
pub fn gpu_model(index: usize) -> Option<String> {
    let mut dirs: Vec<_> =
        std::fs::read_dir("/proc/driver/nvidia/gpus").ok()?.flatten().map(|e| e.path()).collect();
    dirs.sort();
    let info = std::fs::read_to_string(dirs.get(index)?.join("information")).ok()?;
    let line = info.lines().find(|l| l.starts_with("Model:"))?;
    Some(line["Model:".len()..].trim().to_string())
}
