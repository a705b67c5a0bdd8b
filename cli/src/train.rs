//! `ember train`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::dashboard::hangup;
use anyhow::{bail, Context};
use clap::Args;
use ember_train::config::{HostPort, Override};
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
    /// With `--data TEXT`: replace RUN_DIR/data when it was prepared from another text (it may
    /// be a dataset you prepared there; without --force that is refused).
    #[arg(long)]
    force: bool,
    /// Show the dashboard even when stdout is not a terminal.
    #[arg(long, conflicts_with = "no_tui")]
    tui: bool,
    /// Plain log lines even in a terminal.
    #[arg(long)]
    no_tui: bool,
}

impl TrainArgs {
    /// `--set` overrides followed by those of the data-parallel flags, each named in errors as
    /// the user gave it (`--nodes 2`, not the `parallel.nodes=2` it sets).
    ///
    /// Errors: a `--data` path that is not UTF-8 (a config holds paths as TOML strings).
    fn overrides(&self) -> anyhow::Result<Vec<Override>> {
        let mut overrides = Override::sets(&self.set);
        if let Some(data) = &self.data {
            let Some(text) = data.to_str() else {
                bail!("--data {}: expected a UTF-8 path (the run's config.toml records it)", data.display())
            };
            let value = toml::Value::String(text.into());
            overrides.push(Override::flag(format!("data={value}"), format!("--data {text}")));
        }
        if let Some(n) = self.devices {
            overrides.push(Override::flag(format!("devices={n}"), format!("--devices {n}")));
        }
        if let Some(n) = self.nodes {
            overrides.push(Override::flag(format!("parallel.nodes={n}"), format!("--nodes {n}")));
        }
        if let Some(r) = self.node_rank {
            overrides.push(Override::flag(format!("parallel.node_rank={r}"), format!("--node-rank {r}")));
        }
        if let Some(c) = &self.coordinator {
            overrides
                .push(Override::flag(format!("parallel.coordinator=\"{c}\""), format!("--coordinator {c}")));
        }
        Ok(overrides)
    }
}

/// Runs `ember train`.
pub fn run(args: TrainArgs) -> anyhow::Result<()> {
    let overrides = args.overrides()?;
    for (flag, dir) in [("--resume", &args.resume), ("--run-dir", &args.run_dir)] {
        if let Some(dir) = dir {
            check_directory(flag, dir)?;
        }
    }
    let (config, run_dir, resume) = match (&args.config, &args.resume) {
        (Some(path), None) => {
            let config = RunConfig::load_with(path, &overrides)?;
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
            (RunConfig::load_with(&run_dir.join(files::CONFIG), &overrides)?, run_dir.clone(), true)
        }
        _ => unreachable!("clap requires exactly one of --config and --resume"),
    };
    if args.resume.is_none() && args.run_dir.is_none() {
        check_directory("the default --run-dir", &run_dir)?;
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
    let max_steps = config.max_steps;
    let mut options = RunOptions::new(config, run_dir.clone()).with_controls(controls);
    options.resume = resume;
    options.force = args.force;
    options.coordinator_elsewhere = coordinator.is_some();
    let summary = if use_tui {
        with_dashboard(options)?
    } else {
        ember_train::tools::commands::train_run(options, &mut |line| out!("{line}"))?
    };
    if summary.already_finished {
        // A requeued job that was preempted after its last checkpoint: success, nothing done.
        let step = summary.steps;
        out!(
            "{}; nothing to train (raise max_steps with --set max_steps=N to continue); run directory {} unchanged",
            if step == max_steps {
                format!("already finished at step {step} (max_steps = {max_steps})")
            } else {
                format!("already at step {step}, beyond max_steps = {max_steps}")
            },
            run_dir.display()
        );
        return Ok(());
    }
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
/// the current step with a checkpoint; a second Ctrl-C or SIGTERM exits at once, status 130)
/// and by a closed stdout (`ember train … | head -1`: the same stop, printing nothing more).
///
/// A SIGHUP never exits at once: a closed terminal sends it to the process more than once
/// (the kernel signals the session leader and the foreground group), and a hang-up after a
/// Ctrl-C is no reason to lose the checkpoint.
fn stop_controls() -> anyhow::Result<Arc<Controls>> {
    let controls = Arc::new(Controls::default());
    on_signals(controls.clone())?;
    let flag = controls.clone();
    crate::output::on_stdout_closed(move || {
        if !flag.stop.swap(true, Ordering::SeqCst) {
            err!("stdout was closed: stopping after this step with a checkpoint");
        }
    });
    Ok(controls)
}

/// A stop asked by a signal; `hang_up` for SIGHUP.
fn stop_requested(controls: &Controls, hang_up: bool) {
    let again = controls.stop.swap(true, Ordering::SeqCst);
    match (again, hang_up) {
        (true, false) => {
            err!("\nstopped again: exiting at once, without a checkpoint of this step");
            std::process::exit(130);
        }
        (true, true) => {}
        (false, _) => err!(
            "\nstop requested ({}): stopping after this step with a checkpoint; a second Ctrl-C or SIGTERM exits at once",
            if hang_up { "SIGHUP: the terminal closed" } else { "Ctrl-C or SIGTERM" }
        ),
    }
}

/// Ctrl-C, SIGTERM and SIGHUP call [`stop_requested`] on a thread of their own.
#[cfg(unix)]
fn on_signals(controls: Arc<Controls>) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("cannot install the handler of Ctrl-C, SIGTERM and SIGHUP")?;
    std::thread::Builder::new()
        .name("ember-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                stop_requested(&controls, signal == SIGHUP);
            }
        })
        .context("cannot start the thread that handles signals")?;
    Ok(())
}

/// Ctrl-C (and the console's close and termination events) call [`stop_requested`].
#[cfg(not(unix))]
fn on_signals(controls: Arc<Controls>) -> anyhow::Result<()> {
    ctrlc::set_handler(move || stop_requested(&controls, false))
        .context("cannot install the handler of Ctrl-C")
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
    let ended = Arc::new(hangup::Ended::default());
    let training = {
        let ended = ended.clone();
        std::thread::spawn(move || {
            let result = ember_train::tools::commands::train_run(options, &mut |line| {
                let _ = tx.send(line.to_string());
                let _ = log_tx.send(line.to_string());
            });
            ended.set(result.is_ok(), result.as_ref().is_ok_and(|s| s.already_finished));
            result
        })
    };
    // A terminal that hangs up while the dashboard is inside crossterm's event poll.
    let ended_early = ended.clone();
    let watchdog = hangup::Watchdog::start(controls.clone(), ended);
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
            leave: &|| ended_early.already_finished(),
        },
    );
    drop(watchdog);
    crate::dashboard::close_terminal(terminal);
    let (frames, seconds) = shown?.frames;
    for line in rx {
        out!("{line}");
    }
    let summary = training.join().map_err(|_| anyhow::anyhow!("the training thread panicked"))??;
    if summary.already_finished {
        return Ok(summary);
    }
    out!(
        "dashboard: {frames} frames, {:.2} ms each, {:.2}% of one core over {:.1} s",
        1e3 * seconds / frames.max(1) as f64,
        100.0 * seconds / summary.wall_s.max(1e-9),
        summary.wall_s
    );
    Ok(summary)
}
