//! What survives a stop: SIGTERM and SIGHUP act like Ctrl-C (checkpoint at the current step,
//! exit 0, `--resume` continues), a second Ctrl-C or SIGTERM exits at once (a second SIGHUP, as
//! a closed terminal sends, does not), and a closed stdout
//! (`ember train … | head -1`) stops the run with a checkpoint instead of ending it silently.
#![cfg(unix)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Starts a tiny run that trains until stopped, logging every step, with no periodic
/// checkpoint (only a stop writes one).
fn endless(w: &Path, run: &str) -> Child {
    let sets = ["max_steps=100000", "eval_every=0", "log_every=1", "checkpoint_every=1000000"];
    let mut args = vec!["train", "--config", "tiny.toml", "--run-dir", run, "--no-tui"];
    args.extend(sets.iter().flat_map(|s| ["--set", s]));
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(&args)
        .current_dir(w)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ember starts")
}

/// Reads stdout until the first step's log line; returns the reader (still open).
fn after_first_step(child: &mut Child) -> BufReader<ChildStdout> {
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("step ") {
        line.clear();
        assert!(lines.read_line(&mut line).unwrap() > 0, "ember ended before its first step");
    }
    lines
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

/// K of the "stopped after step K" line in `text`.
fn stopped_step(text: &str) -> u64 {
    let rest = text.split("stopped after step ").nth(1).unwrap_or_else(|| panic!("no stop line in {text}"));
    rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// The step of the run's latest checkpoint, as `ember eval` reports it.
fn checkpoint_step(w: &Path, run: &str) -> u64 {
    let out = ok(&["eval", "--run", run, "--batches", "1"], w);
    out.strip_prefix("step ").and_then(|r| r.split(':').next()).unwrap().parse().unwrap()
}

#[test]
fn sigterm_and_sighup_checkpoint_the_current_step_exit_0_and_resume() {
    let dir = workdir();
    let w = dir.path();
    for (run, sig) in [("term", libc::SIGTERM), ("hup", libc::SIGHUP)] {
        let mut child = endless(w, run);
        let mut lines = after_first_step(&mut child);
        signal(&child, sig);
        if sig == libc::SIGHUP {
            // A closed terminal sends SIGHUP more than once: never an exit without checkpoint.
            std::thread::sleep(Duration::from_millis(50));
            signal(&child, libc::SIGHUP);
        }
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut lines, &mut rest).unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{run}: {rest}\n{stderr}");
        assert!(stderr.contains("stopping after this step with a checkpoint"), "{stderr}");
        let step = stopped_step(&rest);
        assert!((1..100000).contains(&step), "{rest}");
        assert_eq!(checkpoint_step(w, run), step, "{run}: the checkpoint is the stop's");
        let next = (step + 2).to_string();
        ok(&["train", "--resume", run, "--set", &format!("max_steps={next}"), "--no-tui"], w);
        let steps: Vec<u64> = train_losses(&w.join(run)).into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps[steps.len() - 2..], [step + 1, step + 2], "{run}: resumed after step {step}");
    }
}

#[test]
fn a_second_signal_exits_at_once_without_a_checkpoint() {
    let dir = workdir();
    let w = dir.path();
    let mut child = endless(w, "run");
    let mut lines = after_first_step(&mut child);
    // Two different signals: two of the same kind may merge into one while pending.
    signal(&child, libc::SIGTERM);
    signal(&child, libc::SIGINT);
    let sent = Instant::now();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut lines, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(sent.elapsed() < Duration::from_secs(20), "took {:?}", sent.elapsed());
    assert_eq!(out.status.code(), Some(130), "{rest}\n{stderr}");
    assert!(stderr.contains("exiting at once"), "{stderr}");
    assert!(!rest.contains("stopped after step"), "{rest}");
}

#[test]
fn a_closed_stdout_stops_the_run_with_a_checkpoint() {
    let dir = workdir();
    let w = dir.path();
    let mut child = endless(w, "run");
    drop(after_first_step(&mut child)); // `| head -1`
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("stdout was closed: stopping after this step with a checkpoint"), "{stderr}");
    let step = stopped_step(&stderr);
    assert_eq!(checkpoint_step(w, "run"), step);
}

/// `ember train … 2>&1 | head`: stdout and stderr both closed. The stop's messages to stderr
/// are dropped instead of panicking mid-step, and the run still ends with a checkpoint.
#[test]
fn closed_stdout_and_stderr_still_stop_the_run_with_a_checkpoint() {
    let dir = workdir();
    let w = dir.path();
    let mut child = endless(w, "run");
    drop(child.stderr.take()); // stderr's reader gone from the start
    drop(after_first_step(&mut child)); // then stdout's
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!((1..100000).contains(&checkpoint_step(w, "run")));
}
