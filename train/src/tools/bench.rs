//! `ember bench`: optimizer steps on random tokens, timed by phase, with throughput, MFU and
//! peak memory beside the [`crate::observe::accounting`] estimate.

use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use ember_data::Batch;
use ember_model::LanguageModel;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::config::RunConfig;
use crate::error::TrainError;
use crate::observe::accounting::{estimate, Estimate, Precision};
use crate::observe::device::{device_memory, rss_bytes, DeviceMemory};
use crate::step::optim::AdamWGroups;
use crate::step::{scalar, train_step, Solo, StepOutput, StepSettings};

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
    let mut model: LanguageModel<B> =
        config.model.init(device).map_err(|e| config.origin.at(&format!("model.{}", e.field), e.message))?;
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
    for i in 0..warmup + steps {
        let started = Instant::now();
        let batches: Vec<Batch> = (0..config.accumulation_steps).map(|_| random_batch()).collect();
        let data = started.elapsed();
        let (next, out) = step(model, &mut optimizer, config, i as u64 + 1, &batches, device)?;
        model = next;
        if let Some(memory) = out.device_memory {
            max_in_use = Some(max_in_use.unwrap_or(0).max(memory.in_use_bytes));
        }
        if i >= warmup {
            let laps = [data, out.forward_backward_time, out.sync_time, out.optimizer_time];
            for (total, lap) in phases.iter_mut().zip(laps) {
                *total += lap;
            }
            timed += started.elapsed();
            if i + 1 == warmup + steps {
                last_loss = scalar(out.loss);
            }
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

/// `ember bench`'s optimizer step `step` of `config` on `micro_batches`: Ember's one
/// [`train_step()`], one worker, at the peak learning rate, each phase timed (it waits for the
/// device at the end of each).
///
/// Errors: as [`train_step()`].
pub fn step<B: AutodiffBackend>(
    model: LanguageModel<B>,
    optimizer: &mut AdamWGroups<LanguageModel<B>, B>,
    config: &RunConfig,
    step: u64,
    micro_batches: &[Batch],
    device: &B::Device,
) -> Result<(LanguageModel<B>, StepOutput<B::InnerBackend>), TrainError> {
    let o = &config.optimizer;
    let settings = StepSettings { timed: true, ..StepSettings::new(step, o.lr, o.grad_clip) };
    train_step(model, optimizer, micro_batches, settings, &mut Solo, None, device)
}
