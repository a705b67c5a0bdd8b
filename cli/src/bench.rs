//! `ember bench`: optimizer steps on random tokens, timed by phase.

use std::path::PathBuf;

use clap::Args;
use ember_train::config::BackendKind;
use ember_train::observe::words::count;
use ember_train::RunConfig;

/// Arguments of `ember bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// The run configuration (TOML).
    #[arg(long, value_name = "FILE.toml")]
    config: PathBuf,
    /// Timed optimizer steps.
    #[arg(long, allow_negative_numbers = true, default_value_t = 20)]
    steps: usize,
    /// Untimed steps first.
    #[arg(long, allow_negative_numbers = true, default_value_t = 3)]
    warmup: usize,
    /// flex (CPU), cuda or wgpu (default: the config's).
    #[arg(long, value_parser = crate::parse_backend)]
    backend: Option<BackendKind>,
    /// Peak FLOP/s of the device for MFU (default: the config's `peak_flops`, else the GPU table).
    #[arg(long, allow_negative_numbers = true, value_name = "FLOP/S")]
    peak_flops: Option<f64>,
    /// Override a config key.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Skip measuring the device's f32 matmul FLOP/s (a 2048³ matmul on the CPU and on a wgpu
    /// GPU, 8192³ on CUDA, 512³ on a software wgpu adapter; the median of 5 runs after 2
    /// warm-up runs) and the MFU against it.
    #[arg(long)]
    no_matmul_peak: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Says on stderr that the config's `data` directory is missing (the vocabulary then comes
/// from the preset or `model.vocab_size`).
pub fn warn_missing_data(config: &RunConfig) {
    if let Some(dir) = config.data.as_ref().filter(|d| !d.exists()) {
        err!(
            "warning: data {:?} not found (relative paths are relative to the current directory): the vocabulary comes from the preset or model.vocab_size",
            dir.display()
        );
    }
}

/// Runs `ember bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.steps == 0 {
        anyhow::bail!("--steps 0: time at least one step");
    }
    if let Some(peak) = args.peak_flops.filter(|p| !(p.is_finite() && *p > 0.0)) {
        anyhow::bail!("--peak-flops {peak}: expected a positive FLOP/s, e.g. 989e12");
    }
    let config = RunConfig::load(&args.config, &args.set)?;
    warn_missing_data(&config);
    let r = ember_train::tools::commands::bench_run(
        config,
        args.steps,
        args.warmup,
        args.backend,
        args.peak_flops,
        !args.no_matmul_peak,
    )?;
    if args.json {
        out!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let ph = &r.phases;
    let mb = |b: u64| b as f64 / 1e6;
    out!("device           {}", r.device);
    out!("precision        {}", r.precision.name());
    out!("checkpointing    {}", r.checkpointing.name());
    out!(
        "steps            {} timed after {} warm-up, {} each",
        r.steps,
        args.warmup,
        count(r.tokens_per_step, "token")
    );
    out!(
        "throughput       {:.0} tokens/s, {:.2} steps/s, {:.1} ms/step",
        r.tokens_per_sec,
        1e3 / r.ms_per_step,
        r.ms_per_step
    );
    out!(
        "per step         data {:.1} ms | forward {:.1} ms | backward {:.1} ms | sync {:.1} ms | optimizer {:.1} ms",
        ph.data_ms,
        ph.forward_ms,
        ph.backward_ms,
        ph.sync_ms,
        ph.optimizer_ms
    );
    out!(
        "model FLOP/s     {} ({:.3e} FLOPs/token × {:.0} tokens/s)",
        flops(r.model_flops),
        r.estimate.flops_per_token as f64,
        r.tokens_per_sec
    );
    match (r.matmul_flops, r.matmul_size, r.mfu_vs_matmul) {
        (Some(peak), Some(n), Some(mfu)) => out!(
            "matmul peak      {} measured (f32 {n}×{n}×{n}, median of {}) → MFU vs matmul {:.1}%",
            flops(peak),
            ember_train::tools::bench::MATMUL_REPS,
            100.0 * mfu
        ),
        _ => out!("matmul peak      — (skipped: --no-matmul-peak)"),
    }
    match (r.mfu, r.estimate.peak_flops) {
        (Some(mfu), Some(peak)) => {
            out!("MFU              {:.1}% of the {} spec-sheet peak", 100.0 * mfu, flops(peak))
        }
        _ => out!("MFU              — (no spec-sheet peak FLOP/s for this device: pass --peak-flops)"),
    }
    // The estimate models the process's RSS on the CPU and the pool's bytes in use on a GPU:
    // printed beside the reading it predicts.
    match r.device_memory {
        None => out!(
            "memory           peak RSS {:.1} MB, {:.1} MB above the {:.1} MB before the model; estimated {:.1} MB",
            mb(r.peak_rss_bytes),
            mb(r.peak_rss_bytes.saturating_sub(r.baseline_rss_bytes)),
            mb(r.baseline_rss_bytes),
            mb(r.estimate.peak)
        ),
        Some(device) => {
            out!(
                "memory           peak RSS {:.1} MB, {:.1} MB above the {:.1} MB before the model (host)",
                mb(r.peak_rss_bytes),
                mb(r.peak_rss_bytes.saturating_sub(r.baseline_rss_bytes)),
                mb(r.baseline_rss_bytes)
            );
            out!(
                "device memory    {:.1} MB in use at most (after a forward or the backward; estimated {:.1} MB), {:.1} MB reserved by the pool",
                mb(device.in_use_bytes),
                mb(r.estimate.peak),
                mb(device.reserved_bytes)
            );
        }
    }
    out!(
        "last loss        {:.4} nats/token (random tokens: ≈ ln(vocab) = {:.4})",
        r.last_loss,
        (r.vocab_size as f64).ln()
    );
    Ok(())
}

/// FLOP/s with an SI prefix: `183.2 GFLOP/s`.
fn flops(per_second: f64) -> String {
    let (scale, prefix) = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")]
        .into_iter()
        .find(|(scale, _)| per_second >= *scale)
        .unwrap_or((1.0, ""));
    format!("{:.1} {prefix}FLOP/s", per_second / scale)
}
