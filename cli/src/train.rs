//! `ember train`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use ember_train::config::HostPort;
use ember_train::persist::files;
use ember_train::Controls;
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
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    devices: Option<usize>,
    /// Processes training together through burn-collective's orchestrator. Sets `parallel.nodes`.
    #[arg(long, allow_negative_numbers = true, value_name = "M")]
    nodes: Option<usize>,
    /// This process's index among the nodes (0 logs and checkpoints). Sets `parallel.node_rank`.
    #[arg(long, allow_negative_numbers = true, value_name = "R")]
    node_rank: Option<usize>,
    /// The orchestrator's address. Sets `parallel.coordinator`.
    #[arg(long, value_name = "HOST:PORT")]
    coordinator: Option<HostPort>,
    /// Show the dashboard even when stdout is not a terminal.
    #[arg(long, conflicts_with = "no_tui")]
    tui: bool,
    /// Plain log lines even in a terminal.
    #[arg(long)]
    no_tui: bool,
}

impl TrainArgs {
    /// `--set` overrides followed by those of the data-parallel flags.
    fn overrides(&self) -> Vec<String> {
        let mut set = self.set.clone();
        set.extend(self.flag_overrides().into_iter().map(|(set, _)| set));
        set
    }

    /// The data-parallel flags given, each as its override (`parallel.nodes=2`) and as the
    /// user wrote it (`--nodes 2`).
    fn flag_overrides(&self) -> Vec<(String, String)> {
        let mut flags = Vec::new();
        if let Some(n) = self.devices {
            flags.push((format!("devices={n}"), format!("--devices {n}")));
        }
        if let Some(n) = self.nodes {
            flags.push((format!("parallel.nodes={n}"), format!("--nodes {n}")));
        }
        if let Some(r) = self.node_rank {
            flags.push((format!("parallel.node_rank={r}"), format!("--node-rank {r}")));
        }
        if let Some(c) = &self.coordinator {
            flags.push((format!("parallel.coordinator=\"{c}\""), format!("--coordinator {c}")));
        }
        flags
    }
}

/// Runs `ember train`.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let flags = args.flag_overrides();
    train(args).map_err(|error| named_as_given(error, &flags))
}

/// An error that names a data-parallel flag by its override (`--set parallel.nodes=2: key
/// …`) names the flag as the user gave it (`--nodes 2: key …`); other errors are unchanged.
fn named_as_given(error: anyhow::Error, flags: &[(String, String)]) -> anyhow::Error {
    let text = crate::message(&error);
    let mut renamed = text.clone();
    for (set, flag) in flags {
        // Only whole arguments: `--set devices=2` is not the start of `--set devices=20`.
        for end in [":", " ", ";", ")"] {
            renamed = renamed.replace(&format!("--set {set}{end}"), &format!("{flag}{end}"));
        }
        if let Some(head) = renamed.strip_suffix(&format!("--set {set}")) {
            renamed = format!("{head}{flag}");
        }
    }
    if renamed == text {
        error
    } else {
        anyhow::anyhow!(renamed)
    }
}

/// `ember train` itself.
fn train(args: TrainArgs) -> anyhow::Result<()> {
    let overrides = args.overrides();
    for (flag, dir) in [("--resume", &args.resume), ("--run-dir", &args.run_dir)] {
        if let Some(dir) = dir {
            check_directory(flag, dir)?;
        }
    }
    let (mut config, run_dir, resume) = match (&args.config, &args.resume) {
        (Some(path), None) => {
            let config = RunConfig::load(path, &overrides)?;
            let name =
                path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "run".into());
            let run_dir = args.run_dir.clone().unwrap_or_else(|| PathBuf::from("runs").join(name));
            (config, run_dir, false)
        }
        (None, Some(run_dir)) => {
            if !run_dir.exists() {
                bail!(
                    "--resume {}: no such directory: expected the --run-dir of an earlier `ember train`",
                    run_dir.display()
                );
            }
            if !run_dir.join(files::CONFIG).is_file() {
                bail!(
                    "--resume {}: not a run directory (it has no {}): expected the --run-dir of an earlier `ember train`",
                    run_dir.display(),
                    files::CONFIG
                );
            }
            (RunConfig::load(&run_dir.join(files::CONFIG), &overrides)?, run_dir.clone(), true)
        }
        _ => unreachable!("clap requires exactly one of --config and --resume"),
    };
    if args.resume.is_none() && args.run_dir.is_none() {
        check_directory("the default --run-dir", &run_dir)?;
    }
    if let Some(data) = args.data {
        config.data = Some(data);
    }
    let controls = stop_controls()?;

    if config.parallel.node_rank == 0 {
        out!("run directory: {}", run_dir.display());
    } else {
        out!(
            "node {} of {}: node 0 writes the run directory",
            config.parallel.node_rank,
            config.parallel.nodes
        );
    }
    let coordinator = coordinator_process(&config)?;
    let several_nodes = config.parallel.nodes > 1;
    let use_tui = !several_nodes && (args.tui || (!args.no_tui && std::io::stdout().is_terminal()));
    if several_nodes && args.tui {
        out!("no dashboard with several nodes: burn-collective prints to stdout at every step; use `ember watch` on node 0's run directory");
    }
    let leads = config.parallel.node_rank == 0;
    let mut options = RunOptions::new(config, run_dir.clone()).with_controls(controls);
    options.resume = resume;
    options.coordinator_elsewhere = coordinator.is_some();
    let summary = if use_tui {
        with_dashboard(options)?
    } else {
        ember_train::tools::commands::train_run(options, &mut |line| out!("{line}"))?
    };
    let val = summary
        .final_val_loss
        .map(|v| format!("val loss {v:.4} (ppl {:.2})", v.exp()))
        .unwrap_or_else(|| "no evaluation".into());
    let line = format!(
        "{} after step {}: {val}; {:.1} s this session ({:.1} s in all), {:.0} tokens/s; {}",
        if summary.stopped_early { "stopped" } else { "done" },
        summary.steps,
        summary.wall_s,
        summary.elapsed_s,
        summary.tokens_per_sec,
        if leads {
            format!("run directory {}", run_dir.display())
        } else {
            "node 0 wrote the run directory".into()
        }
    );
    out!("{line}");
    if crate::output::stdout_closed() {
        err!("{line}");
    }
    Ok(())
}

/// The run's stop control, set by Ctrl-C, SIGTERM or SIGHUP (on any node: the run stops after
/// the current step with a checkpoint; a second signal exits at once, status 130) and by a
/// closed stdout (`ember train … | head -1`: the same stop, printing nothing more).
fn stop_controls() -> anyhow::Result<Arc<Controls>> {
    let controls = Arc::new(Controls::default());
    let flag = controls.clone();
    ctrlc::set_handler(move || {
        if flag.stop.swap(true, Ordering::SeqCst) {
            err!("\nstopped again: exiting at once, without a checkpoint of this step");
            std::process::exit(130);
        }
        err!(
            "\nstop requested (Ctrl-C, SIGTERM or SIGHUP): stopping after this step with a checkpoint; \
             a second one exits at once"
        );
    })
    .context("cannot install the handler of Ctrl-C, SIGTERM and SIGHUP")?;
    let flag = controls.clone();
    crate::output::on_stdout_closed(move || {
        if !flag.stop.swap(true, Ordering::SeqCst) {
            err!("stdout was closed: stopping after this step with a checkpoint");
        }
    });
    Ok(controls)
}

/// Refuses a run directory that is a file, or lies below one, naming `flag`; a missing one is
/// fine (training creates it).
fn check_directory(flag: &str, path: &Path) -> anyhow::Result<()> {
    for ancestor in path.ancestors().filter(|p| !p.as_os_str().is_empty()) {
        match std::fs::metadata(ancestor) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) if ancestor == path => {
                bail!("{flag} {} is a file; expected a directory", path.display())
            }
            Ok(_) => {
                bail!("{flag} {}: {} is a file; expected a directory", path.display(), ancestor.display())
            }
            Err(_) => continue,
        }
    }
    Ok(())
}

/// Node 0 of several runs burn-collective's orchestrators in a child process (`ember
/// coordinator`) in its own process group: burn-collective 0.21's orchestrator shuts down on
/// Ctrl-C, which must only stop the training (with a checkpoint), not the coordination of its
/// last steps. The child is killed when the returned guard drops.
fn coordinator_process(config: &RunConfig) -> anyhow::Result<Option<ChildGuard>> {
    let p = &config.parallel;
    if p.nodes <= 1 || p.node_rank != 0 || !p.start_coordinator {
        return Ok(None);
    }
    let port = p.coordinator.port;
    ember_train::parallel::check_ports_free(port)?;
    let exe = std::env::current_exe().context("cannot find the ember binary to start the coordinator")?;
    let mut command = std::process::Command::new(exe);
    command
        .args(["coordinator", "--bind", &port.to_string(), "--exit-with-parent"])
        .stdout(std::process::Stdio::null());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let child = command.spawn().context("cannot start `ember coordinator`")?;
    Ok(Some(ChildGuard(child)))
}

/// Kills the child process when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Trains on a background thread with the dashboard on this one; the log lines are printed
/// after the dashboard closes.
fn with_dashboard(options: RunOptions) -> anyhow::Result<ember_train::RunSummary> {
    let dashboard = crate::dashboard::for_run(&options.run_dir, Some(&options.config));
    let tail = crate::dashboard::MetricsTail::new(&options.run_dir);
    let controls = options.controls.clone();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let (log_tx, log_rx) = std::sync::mpsc::channel::<String>();
    // Before the training starts: without a terminal there is nothing to run.
    let mut terminal = crate::dashboard::open_terminal()?;
    let training = std::thread::spawn(move || {
        ember_train::tools::commands::train_run(options, &mut |line| {
            let _ = tx.send(line.to_string());
            let _ = log_tx.send(line.to_string());
        })
    });
    let finished = |_: &crate::dashboard::Dashboard| {
        training.is_finished().then(|| "finished: press any key".to_string())
    };
    let shown = crate::dashboard::run(
        &mut terminal,
        dashboard,
        crate::dashboard::Attached {
            tail,
            logs: Some(log_rx),
            controls: Some(controls),
            finished: &finished,
        },
    );
    ratatui::restore();
    let (frames, seconds) = shown?.frames;
    for line in rx {
        out!("{line}");
    }
    let summary = training.join().map_err(|_| anyhow::anyhow!("the training thread panicked"))??;
    out!(
        "dashboard: {frames} frames, {:.2} ms each, {:.2}% of one core over {:.1} s",
        1e3 * seconds / frames.max(1) as f64,
        100.0 * seconds / summary.wall_s.max(1e-9),
        summary.wall_s
    );
    Ok(summary)
}
