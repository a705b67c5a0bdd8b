//! `ember bench`: optimizer steps on random tokens, timed by phase, with throughput, MFU (against
//! the spec-sheet peak and against a measured large matmul) and peak memory beside the
//! [`crate::observe::accounting`] estimate.

use std::time::{Duration, Instant};

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use ember_data::Batch;
use ember_model::LanguageModel;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::config::RunConfig;
use crate::error::TrainError;
use crate::observe::accounting::{estimate, Estimate, Mode};
use crate::observe::device::{device_memory, rss_bytes, DeviceMemory};
use crate::step::optim::AdamWGroups;
use crate::step::{scalar, train_step, Solo, StepOutput, StepSettings};

/// Mean milliseconds per optimizer step in each phase (each ended by a device sync).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Phases {
    /// Building the micro-batches (random tokens here).
    pub data_ms: f64,
    /// Forward passes (model and loss) of every micro-batch.
    pub forward_ms: f64,
    /// Backward passes (and the gradient accumulation) of every micro-batch.
    pub backward_ms: f64,
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
    /// The step's floating-point mode (`precision`: `fp32`, `bf16-mixed`, `fp16-mixed`).
    pub precision: crate::config::PrecisionKind,
    /// `activation_checkpointing`: `none` or `blocks`.
    pub checkpointing: crate::config::CheckpointingKind,
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
    /// The step's model FLOP/s: `flops_per_token × tokens/s` (PaLM, Appendix B).
    pub model_flops: f64,
    /// Model FLOPs utilization against the spec-sheet peak: `model_flops ÷ peak FLOP/s`, when
    /// the peak is known (`--peak-flops`, `peak_flops`, the GPU table).
    pub mfu: Option<f64>,
    /// The device's achievable FLOP/s, measured: one `n × n` by `n × n` f32 matmul (`n` =
    /// `matmul_size`) on the same backend, `2·n³` FLOPs ÷ the median time of
    /// [`MATMUL_REPS`] runs after [`MATMUL_WARMUP`], each ended by a device sync; `None` when
    /// skipped (`--no-matmul-peak`).
    pub matmul_flops: Option<f64>,
    /// The side `n` of the measured square matmul (`None` when skipped).
    pub matmul_size: Option<usize>,
    /// `model_flops ÷ matmul_flops`: the step's FLOP rate against what one large matmul
    /// reaches on this device and backend.
    pub mfu_vs_matmul: Option<f64>,
    /// Process resident memory before the model was built, bytes.
    pub baseline_rss_bytes: u64,
    /// Peak process resident memory, bytes (Linux `VmHWM`).
    pub peak_rss_bytes: u64,
    /// On CUDA and wgpu: the most bytes in use in the device pool at a phase boundary (after
    /// each forward pass, every activation alive, and after the backward, the gradients
    /// alive), and the bytes the pool reserved by the end (its high-water mark); `None` on the
    /// CPU.
    pub device_memory: Option<DeviceMemory>,
    /// The accounting of this configuration.
    pub estimate: Estimate,
    /// Vocabulary size of the model.
    pub vocab_size: usize,
    /// Mean loss of the last timed step (nats/token), a sanity check: ≈ ln(vocab) on random tokens.
    pub last_loss: f64,
}

/// Untimed runs of the peak matmul before the timed ones (CUDA autotunes its kernel on the
/// first).
pub const MATMUL_WARMUP: usize = 2;
/// Timed runs of the peak matmul; their median is reported.
pub const MATMUL_REPS: usize = 5;

/// Runs `warmup` and then `steps` timed optimizer steps of `config` (micro-batches, accumulation
/// steps; one device) on random tokens; `peak_flops` (FLOP/s) gives the MFU; then, with a
/// `matmul_size` `n`, measures an `n³` f32 matmul (after the memory readings, so its operands
/// do not count in the peak memory) for the MFU against it.
///
/// Errors: an unusable configuration (the vocabulary must be known: `model.vocab_size`); a
/// model and batch too large for the memory, as for training ([`TrainError::WontFit`];
/// `check_memory = false` runs anyway).
pub fn bench<B: AutodiffBackend>(
    config: &RunConfig,
    steps: usize,
    warmup: usize,
    peak_flops: Option<f64>,
    matmul_size: Option<usize>,
    device: &B::Device,
    device_name: String,
) -> Result<BenchReport, TrainError> {
    crate::observe::fits::check(config, &mut |_| {})?; // before the model is allocated
    let baseline_rss_bytes = rss_bytes("VmRSS:").unwrap_or(0);
    let mut model: LanguageModel<B> = crate::step::init::seeded_model(config, device)?;
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
    let mut phases = [Duration::ZERO; 5];
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
            let laps = [data, out.forward_time, out.backward_time, out.sync_time, out.optimizer_time];
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
        // One rank: its AdamW state is whole whatever `[parallel]` says.
        Mode { optimizer_shards: 1, ..Mode::of(config) },
        peak_flops,
        mfu_assumed,
    );
    let model_flops = estimate.flops_per_token as f64 * tokens_per_sec;
    // Read before the peak matmul allocates its operands.
    let peak_rss_bytes = rss_bytes("VmHWM:").unwrap_or(0);
    let device_memory = max_in_use.and_then(|in_use_bytes| {
        Some(DeviceMemory { in_use_bytes, reserved_bytes: device_memory(device)?.reserved_bytes })
    });
    let matmul_flops = matmul_size.map(|n| matmul_flops::<B::InnerBackend>(n, device));
    Ok(BenchReport {
        device: device_name,
        precision: config.precision,
        checkpointing: config.activation_checkpointing,
        steps,
        tokens_per_step,
        tokens_per_sec,
        ms_per_step: per_step_ms(timed),
        phases: Phases {
            data_ms: per_step_ms(phases[0]),
            forward_ms: per_step_ms(phases[1]),
            backward_ms: per_step_ms(phases[2]),
            sync_ms: per_step_ms(phases[3]),
            optimizer_ms: per_step_ms(phases[4]),
        },
        model_flops,
        mfu: peak_flops.map(|peak| model_flops / peak),
        matmul_flops,
        matmul_size: matmul_flops.and(matmul_size),
        mfu_vs_matmul: matmul_flops.map(|peak| model_flops / peak),
        baseline_rss_bytes,
        peak_rss_bytes,
        device_memory,
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
    let settings = StepSettings {
        timed: true,
        precision: config.precision.mode(),
        checkpointing: config.activation_checkpointing.mode(),
        ..StepSettings::new(step, o.lr, o.grad_clip)
    };
    train_step(model, optimizer, micro_batches, settings, &mut Solo, None, device)
}

/// The achievable FLOP/s of `device`: `C = A·B` with `A`, `B` random `[n, n]` f32 tensors
/// (uniform in [0, 1)), `2·n³` FLOPs ÷ the median of [`MATMUL_REPS`] timed runs after
/// [`MATMUL_WARMUP`] untimed ones; each run ends with a device sync while `C` is alive (so a
/// lazy backend cannot skip it). The upper bound a training step's matmuls can reach on this
/// backend, measured rather than read from a spec sheet.
pub fn matmul_flops<B: Backend>(n: usize, device: &B::Device) -> f64 {
    let a = Tensor::<B, 2>::random([n, n], Distribution::Default, device);
    let b = Tensor::<B, 2>::random([n, n], Distribution::Default, device);
    let _ = B::sync(device); // the operands exist before the clock starts
    let mut times: Vec<f64> = (0..MATMUL_WARMUP + MATMUL_REPS)
        .map(|_| {
            let started = Instant::now();
            let c = a.clone().matmul(b.clone());
            let _ = B::sync(device); // host sync: the product is computed
            let seconds = started.elapsed().as_secs_f64();
            drop(c);
            seconds
        })
        .skip(MATMUL_WARMUP)
        .collect();
    times.sort_by(f64::total_cmp);
    2.0 * (n as f64).powi(3) / times[times.len() / 2].max(1e-12)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use burn::backend::{Autodiff, Flex};

    use super::*;

    fn tiny() -> RunConfig {
        // 2 layers of 32, context 16, vocabulary 64; 2 micro-batches of 4 rows per step.
        let text = "max_steps = 5\nmicro_batch_size = 4\naccumulation_steps = 2\n[model]\npreset = \"tiny\"\nvocab_size = 64\n";
        RunConfig::from_toml_str(text, Path::new("run.toml"), &[]).unwrap()
    }

    #[test]
    fn bench_times_forward_and_backward_apart_within_the_step() {
        let config = tiny();
        let device = Default::default();
        let r = bench::<Autodiff<Flex>>(&config, 3, 1, Some(1e12), Some(64), &device, "cpu".into()).unwrap();
        let p = r.phases;
        assert!(p.forward_ms > 0.0 && p.backward_ms > 0.0, "{p:?}");
        // The phases are parts of the step: together no longer than it, and most of it.
        let parts = p.data_ms + p.forward_ms + p.backward_ms + p.sync_ms + p.optimizer_ms;
        assert!(
            parts <= r.ms_per_step * 1.0001 && parts > 0.5 * r.ms_per_step,
            "{parts} of {}: {p:?}",
            r.ms_per_step
        );
        assert_eq!(r.tokens_per_step, 2 * 4 * 16);
        assert_eq!(r.model_flops, r.estimate.flops_per_token as f64 * r.tokens_per_sec);
        assert_eq!(r.mfu, Some(r.model_flops / 1e12));
        let matmul = r.matmul_flops.unwrap();
        assert!(matmul > 0.0 && matmul.is_finite());
        assert_eq!(r.matmul_size, Some(64));
        assert_eq!(r.mfu_vs_matmul, Some(r.model_flops / matmul));
    }

    #[test]
    fn a_timed_step_splits_its_forward_backward_time_and_an_untimed_one_does_not() {
        type B = Autodiff<Flex>;
        let config = tiny();
        let device = Default::default();
        let mut model: LanguageModel<B> = config.model.init(&device).unwrap();
        let mut optimizer = AdamWGroups::new(&config.optimizer, &model);
        let rows = 4 * 16_u32;
        let batch = Batch {
            batch_size: 4,
            seq_len: 16,
            inputs: (0..rows).map(|i| i % 64).collect(),
            targets: (0..rows).map(|i| ((i + 1) % 64) as i32).collect(),
            segments: None,
        };
        let batches = [batch.clone(), batch];
        for i in 1..=3 {
            let (next, out) = step(model, &mut optimizer, &config, i, &batches, &device).unwrap();
            model = next;
            let (f, b, fb) = (out.forward_time, out.backward_time, out.forward_backward_time);
            assert!(f > Duration::ZERO && b > Duration::ZERO, "{f:?} {b:?}");
            // The pair is timed around the two passes: it holds them, and little else (the
            // first sync and the loss sum).
            assert!(f + b <= fb, "{f:?} + {b:?} > {fb:?}");
            assert!((fb - (f + b)).as_secs_f64() < 0.1 * fb.as_secs_f64() + 1e-3, "{f:?} + {b:?} vs {fb:?}");
        }
        let settings = StepSettings::new(4, 1e-3, 1.0);
        let (_, out) =
            train_step(model, &mut optimizer, &batches, settings, &mut Solo, None, &device).unwrap();
        assert_eq!(
            (out.forward_time, out.backward_time),
            (Duration::ZERO, Duration::ZERO),
            "untimed: no laps"
        );
        assert!(out.forward_backward_time > Duration::ZERO);
    }

    #[test]
    fn the_peak_matmul_can_be_skipped() {
        let r =
            bench::<Autodiff<Flex>>(&tiny(), 1, 0, None, None, &Default::default(), "cpu".into()).unwrap();
        assert_eq!((r.matmul_flops, r.matmul_size, r.mfu_vs_matmul, r.mfu), (None, None, None, None));
        assert!(r.model_flops > 0.0);
    }

    #[test]
    fn the_peak_matmul_gives_a_plausible_rate() {
        // 2 × 128³ = 4,194,304 FLOPs: on any CPU this takes between 1 µs and 1 s.
        let flops = matmul_flops::<Flex>(128, &Default::default());
        assert!((4.2e6..4.2e12).contains(&flops), "{flops}");
    }
}
