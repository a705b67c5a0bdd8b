//! `ember estimate`: the memory and FLOP accounting of a config, as a table.

use std::path::PathBuf;

use clap::Args;
use ember_train::observe::accounting::{estimate_run, known_peak_flops, Estimate, MemoryReading};
use ember_train::observe::fits;
use ember_train::observe::words::count;
use ember_train::{BackendKind, CheckpointingKind, PrecisionKind, RunConfig};

/// Arguments of `ember estimate`.
#[derive(Args)]
pub struct EstimateArgs {
    /// The run configuration (TOML).
    #[arg(long, value_name = "FILE.toml")]
    config: PathBuf,
    /// Override a config key, e.g. --set micro_batch_size=32.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Precision to account for instead of the config's `precision`: fp32, bf16-mixed or
    /// fp16-mixed (as Ember trains in it: f32 weights and gradients, 16-bit matmuls).
    #[arg(long, value_parser = parse_precision)]
    precision: Option<PrecisionKind>,
    /// Model FLOPs utilization assumed for the time per step.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.4)]
    mfu: f64,
    /// Peak FLOP/s of one device (default: `peak_flops` of the config, else `--gpu`'s table entry).
    #[arg(long, allow_negative_numbers = true, value_name = "FLOP/S")]
    peak_flops: Option<f64>,
    /// A GPU name to look up in the table of peak FLOP/s (e.g. h100, a100).
    #[arg(long, value_name = "NAME")]
    gpu: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_precision(s: &str) -> Result<PrecisionKind, String> {
    PrecisionKind::try_from(s.to_string())
}

/// Runs `ember estimate`.
pub fn run(args: EstimateArgs) -> anyhow::Result<()> {
    if !(args.mfu > 0.0 && args.mfu <= 1.0) {
        anyhow::bail!("--mfu {}: expected a fraction in (0, 1], e.g. 0.4", args.mfu);
    }
    if let Some(peak) = args.peak_flops.filter(|p| !(p.is_finite() && *p > 0.0)) {
        anyhow::bail!("--peak-flops {peak}: expected a positive FLOP/s, e.g. 989e12");
    }
    let mut config = RunConfig::load(&args.config, &args.set)?;
    if let Some(precision) = args.precision {
        config.precision = precision;
    }
    // A run the backend refuses has no estimate either.
    ember_train::tools::backend::check_precision(config.backend, config.precision)?;
    crate::bench::warn_missing_data(&config);
    config.resolve_vocab(config.data_vocab()?)?;
    let peak =
        args.peak_flops.or(config.peak_flops).or_else(|| args.gpu.as_deref().and_then(known_peak_flops));
    if let (Some(gpu), None) = (&args.gpu, peak) {
        anyhow::bail!(
            "--gpu {gpu:?}: not in the table (h200, h100, a100, l40s, rtx 4090, a10, v100); pass --peak-flops"
        );
    }
    let e = estimate_run(&config, peak, args.mfu);
    if args.json {
        out!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        out!("{}", table(&e, &config));
    }
    Ok(())
}

fn gb(bytes: u64) -> String {
    format!("{:.3} GB", bytes as f64 / 1e9)
}

fn table(e: &Estimate, config: &RunConfig) -> String {
    let p = &e.per_param;
    let a = &e.activations;
    let rows: Vec<(String, String)> = vec![
        (
            "parameters".into(),
            format!("{} ({} without position embeddings)", e.params, e.params_without_positions),
        ),
        (
            format!("persistent, {}", e.mode.precision.name()),
            match e.mode.optimizer_shards {
                1 => format!(
                    "{} B/param = f32 weights {} (also the master copy) + f32 grads {} + AdamW m {} + v {} → {}",
                    p.total(),
                    p.weights,
                    p.grads,
                    p.adam_m,
                    p.adam_v,
                    gb(e.persistent_bytes)
                ),
                w => format!(
                    "{:.2} B/param on the rank with the largest share = f32 weights {} (also the master copy) + f32 grads {} + AdamW m {} + v {} of {} of the {} parameters (ZeRO-1 over {w} ranks, by whole tensors) → {} per rank, of which AdamW {}",
                    e.persistent_per_param(),
                    p.weights,
                    p.grads,
                    p.adam_m,
                    p.adam_v,
                    e.optimizer_shard_params,
                    e.params,
                    gb(e.persistent_bytes),
                    gb(e.optimizer_state_bytes)
                ),
            },
        ),
        (
            "16-bit weight copies".into(),
            match p.low_precision_copy {
                0 => "none (fp32)".into(),
                b => format!(
                    "{b} B × {} matmul weights, cast in the forward and kept for the backward{} → {}",
                    e.low_precision_copy_bytes / b,
                    match e.mode.checkpointing {
                        CheckpointingKind::Blocks => {
                            format!(
                                " (checkpointing: one layer's and the head's of the {} at a time)",
                                e.matmul_params
                            )
                        }
                        CheckpointingKind::None => String::new(),
                    },
                    gb(e.low_precision_copy_bytes)
                ),
            },
        ),
        ("attention".into(), e.mode.attention.describe().into()),
        (
            "activations per layer".into(),
            format!(
                "{} retained [B,T,d] + {} per-row f32 statistics{}",
                gb(a.per_layer),
                gb(a.row_stats_per_layer),
                match a.attention_per_layer {
                    0 => String::new(),
                    probabilities => format!(" + {} attention probabilities [B,H,T,T]", gb(probabilities)),
                }
            ),
        ),
        ("final norm".into(), gb(a.final_norm)),
        ("embedding dropout".into(), format!("{} (its mask)", gb(a.embedding_dropout))),
        (
            "logits and loss".into(),
            format!("{} (logits and their gradient, log-sum-exp per row)", gb(a.logits)),
        ),
        (
            "activations".into(),
            format!("{} ({} with activation checkpointing)", gb(a.total), gb(a.total_checkpointed)),
        ),
        (
            "gradient exchange".into(),
            match e.exchange_bytes {
                0 => "none (1 rank)".into(),
                b => format!("{} (the flattened gradients and their reduced copy, 8 B/param, after the backward pass)", gb(b)),
            },
        ),
        (
            "peak per device".into(),
            format!(
                "{}; {}",
                match e.mode.checkpointing {
                    CheckpointingKind::None => {
                        format!(
                            "{} ({} with activation_checkpointing = \"blocks\")",
                            gb(e.peak),
                            gb(e.peak_bytes.1)
                        )
                    }
                    CheckpointingKind::Blocks => {
                        format!("{} with checkpointing ({} without)", gb(e.peak), gb(e.peak_bytes.0))
                    }
                },
                match e.mode.memory {
                    MemoryReading::ProcessRss => {
                        "as the process's RSS counts it on the CPU (every gradient beside every activation)"
                    }
                    MemoryReading::DeviceInUse => {
                        "bytes in use in the device pool (at the start of the backward; the pool reserves more)"
                    }
                }
            ),
        ),
        (
            "this process (CPU)".into(),
            match config.backend {
                BackendKind::Flex => {
                    let (replicas, own) = (config.devices.count(), fits::replica_overhead_bytes(config));
                    format!(
                        "{} = {} × ({} + {} of the replica's own: its sampler's row order, gemm's scratch, and a copy of Burn autodiff's graph registry at each backward, which grows with the replicas) — what `ember train` checks against the RAM",
                        gb(fits::needed_bytes(config)),
                        count(replicas, "replica"),
                        gb(e.peak),
                        gb(own)
                    )
                }
                BackendKind::Cuda => "— (CUDA: the peak is per device)".into(),
                BackendKind::Wgpu => "— (wgpu: the peak is per device)".into(),
            },
        ),
        (
            "FLOPs per token".into(),
            format!("{:.4e} (6·N + 12·layers·d_model·seq_len)", e.flops_per_token as f64),
        ),
        (
            "tokens per step".into(),
            format!(
                "{} (micro-batch {} × accumulation {} × {} × {})",
                e.tokens_per_step,
                config.micro_batch_size,
                config.accumulation_steps,
                count(config.world_size(), "rank"),
                count(config.model.block_size(), "token")
            ),
        ),
        ("FLOPs per step".into(), format!("{:.4e}", e.flops_per_step)),
        (
            format!("time per step at {:.0}% MFU", 100.0 * e.mfu),
            match (e.step_seconds_at_mfu, e.peak_flops) {
                (Some(s), Some(peak)) => format!("{:.4} s (peak {:.3e} FLOP/s per device)", s, peak),
                _ => "— (give --peak-flops or --gpu)".into(),
            },
        ),
        (
            "Chinchilla budget".into(),
            format!(
                "{} tokens (20 per parameter) = {}; this config runs {}",
                e.chinchilla_tokens,
                count(e.chinchilla_steps, "step"),
                config.max_steps
            ),
        ),
    ];
    // The embedding dropout's mask exists only with dropout.
    let rows: Vec<_> =
        rows.into_iter().filter(|(k, _)| k != "embedding dropout" || a.embedding_dropout > 0).collect();
    let width = rows.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    rows.iter().map(|(k, v)| format!("{k:<width$}  {v}")).collect::<Vec<_>>().join("\n")
}
