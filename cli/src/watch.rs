//! `ember watch RUN_DIR`: the dashboard of a run in progress or finished, from its files.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;
use ember_train::persist::files;

use crate::dashboard::{self, Attached, MetricsTail};

/// Arguments of `ember watch`.
#[derive(Args)]
pub struct WatchArgs {
    /// The run directory (its `metrics.jsonl` and `config.toml`).
    #[arg(value_name = "RUN_DIR")]
    run_dir: PathBuf,
}

/// Runs `ember watch`: the dashboard in a terminal, else the records as plain lines.
pub fn run(args: WatchArgs) -> anyhow::Result<()> {
    let metrics = args.run_dir.join(files::METRICS);
    if !args.run_dir.is_dir() {
        anyhow::bail!("{}: no such run directory", args.run_dir.display());
    }
    if !std::io::stdout().is_terminal() {
        if !metrics.exists() {
            anyhow::bail!("{}: no metrics yet (the run has not logged a step)", metrics.display());
        }
        for record in MetricsTail::new(&args.run_dir).poll() {
            match record {
                ember_train::observe::metrics::Record::Train(r) => out!("{r}"),
                ember_train::observe::metrics::Record::Eval(e) => out!("{e}"),
                ember_train::observe::metrics::Record::Event(e) => out!("{e}"),
            }
        }
        return Ok(());
    }
    let board = dashboard::for_run(&args.run_dir, None);
    let mut terminal = dashboard::open_terminal()?;
    // Finished when the newest record reached max_steps; idle when nothing was written for a
    // minute (a stopped or crashed run).
    let finished = |d: &dashboard::Dashboard| {
        let last = d.newest_step()?;
        if d.max_steps > 0 && last >= d.max_steps {
            return Some(format!("finished at step {last}"));
        }
        let age = std::fs::metadata(&metrics).ok()?.modified().ok()?.elapsed().ok()?;
        (age.as_secs() >= 60)
            .then(|| format!("idle: no new step for {} s (stopped at step {last}?)", age.as_secs()))
    };
    let shown = dashboard::run(
        &mut terminal,
        board,
        Attached {
            tail: MetricsTail::new(&args.run_dir),
            logs: None,
            controls: None,
            finished: &finished,
            leave: &|| false,
        },
    );
    crate::dashboard::close_terminal(terminal);
    shown?;
    Ok(())
}
