//! `ember train`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use ember_train::run::files;
use ember_train::{RunConfig, RunOptions};

/// Arguments of `ember train`.
#[derive(Args)]
pub struct TrainArgs {
    /// The run configuration (TOML; see examples/).
    #[arg(long, value_name = "FILE.toml", required_unless_present = "resume", conflicts_with = "resume")]
    config: Option<PathBuf>,
    /// Continue the run in RUN_DIR from its latest checkpoint.
    #[arg(long, value_name = "RUN_DIR")]
    resume: Option<PathBuf>,
    /// Prepared data directory, or a text file to prepare (overrides `data`).
    #[arg(long, value_name = "DIR|FILE")]
    data: Option<PathBuf>,
    /// Run directory (default: runs/<config name>).
    #[arg(long, value_name = "DIR", conflicts_with = "resume")]
    run_dir: Option<PathBuf>,
    /// Override a config key, e.g. --set max_steps=100 --set optimizer.lr=3e-4.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Data-parallel replicas in this process, one thread each (CUDA: devices `device`..;
    /// CPU: burn-flex replicas). Sets `devices`.
    #[arg(long, value_name = "N")]
    devices: Option<usize>,
    /// Processes training together through burn-collective's orchestrator. Sets `parallel.nodes`.
    #[arg(long, value_name = "M")]
    nodes: Option<usize>,
    /// This process's index among the nodes (0 logs and checkpoints). Sets `parallel.node_rank`.
    #[arg(long, value_name = "R")]
    node_rank: Option<usize>,
    /// The orchestrator's address. Sets `parallel.coordinator`.
    #[arg(long, value_name = "HOST:PORT")]
    coordinator: Option<String>,
}

impl TrainArgs {
    /// `--set` overrides followed by those of the data-parallel flags.
    fn overrides(&self) -> Vec<String> {
        let mut set = self.set.clone();
        set.extend(self.devices.map(|n| format!("devices={n}")));
        set.extend(self.nodes.map(|n| format!("parallel.nodes={n}")));
        set.extend(self.node_rank.map(|r| format!("parallel.node_rank={r}")));
        set.extend(self.coordinator.as_ref().map(|c| format!("parallel.coordinator={c:?}")));
        set
    }
}

/// Runs `ember train`.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let overrides = args.overrides();
    let (mut config, run_dir, resume) = match (&args.config, &args.resume) {
        (Some(path), None) => {
            let config = RunConfig::load(path, &overrides)?;
            let name =
                path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
            let run_dir = args.run_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(name));
            (config, run_dir, false)
        }
        (None, Some(run_dir)) => {
            (RunConfig::load(&run_dir.join(files::CONFIG), &overrides)?, run_dir.clone(), true)
        }
        _ => unreachable!("clap requires exactly one of --config and --resume"),
    };
    if let Some(data) = args.data {
        config.data = Some(data);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            eprintln!("\ninterrupted again: exiting without a checkpoint");
            std::process::exit(130);
        }
        eprintln!("\nstopping after this step with a checkpoint (Ctrl-C again to abort)");
    })
    .context("cannot install the Ctrl-C handler")?;

    out!("run directory: {}", run_dir.display());
    let summary = ember_train::commands::train_run(
        RunOptions { config, run_dir: run_dir.clone(), resume, stop },
        &mut |line| out!("{line}"),
    )?;
    let val = summary
        .final_val_loss
        .map(|v| format!("val loss {v:.4} (ppl {:.2})", v.exp()))
        .unwrap_or_else(|| "no evaluation".into());
    out!(
        "{} after step {}: {val}; {:.1} s this session ({:.1} s in all), {:.0} tokens/s; run directory {}",
        if summary.stopped_early { "stopped" } else { "done" },
        summary.steps,
        summary.wall_s,
        summary.elapsed_s,
        summary.tokens_per_sec,
        run_dir.display()
    );
    Ok(())
}
