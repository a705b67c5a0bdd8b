//! A closed terminal ends `ember train` with its dashboard: the run stops with a checkpoint
//! and the process exits, instead of waiting for a key that can never come. The dashboard
//! runs in a pseudo-terminal whose master side this test holds and then closes (what an SSH
//! disconnect or `tmux kill-session` does to a terminal).
#![cfg(target_os = "linux")]

mod common;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// A pseudo-terminal of 120 × 40 cells: (master, slave).
fn open_pty() -> (OwnedFd, OwnedFd) {
    let (mut master, mut slave) = (-1, -1);
    let size = libc::winsize { ws_row: 40, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty(3) writes two descriptors it opened; the name buffer and termios are null.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // Not inherited by ember: a child that held the master open would never see it close.
    for fd in [master, slave] {
        // SAFETY: fcntl(2) on a descriptor just opened.
        assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }, 0);
    }
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
}

/// Keeps reading (and dropping) what ember draws on the master side, so that its writes never
/// block on a full terminal buffer, until `stop` is set. Returns the bytes read.
fn drain(master: &OwnedFd, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    let fd = master.as_raw_fd();
    std::thread::spawn(move || {
        let mut total = 0;
        let mut buffer = [0u8; 4096];
        while !stop.load(Ordering::SeqCst) {
            let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: poll(2) on one descriptor that stays open until this thread is joined.
            if unsafe { libc::poll(&mut poll, 1, 50) } > 0 && poll.revents & libc::POLLIN != 0 {
                // SAFETY: read(2) into a buffer of its length.
                let n = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
                if n <= 0 {
                    break;
                }
                total += n as usize;
            }
        }
        total
    })
}

/// The step `checkpoints/latest` names (0 before the first checkpoint).
fn latest_step(run_dir: &Path) -> u64 {
    std::fs::read_to_string(run_dir.join("checkpoints/latest"))
        .ok()
        .and_then(|s| s.trim().strip_prefix("step-").and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// Trains with the dashboard in a pseudo-terminal (as its controlling terminal when
/// `controlling`, so that closing it sends SIGHUP; else only the hang-up itself tells),
/// closes the terminal after a few steps, and checks that ember exits within seconds with a
/// checkpoint of the step it stopped at.
fn closing_the_terminal_ends_the_run(controlling: bool) {
    let dir = workdir();
    let w = dir.path();
    let run = if controlling { "hup" } else { "hangup" };
    let (master, slave) = open_pty();
    let sets = ["max_steps=100000", "eval_every=0", "log_every=1", "checkpoint_every=1000000"];
    let mut args = vec!["train", "--config", "tiny.toml", "--run-dir", run, "--tui"];
    args.extend(sets.iter().flat_map(|s| ["--set", s]));
    let mut command = Command::new(env!("CARGO_BIN_EXE_ember"));
    command
        .args(&args)
        .current_dir(w)
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        // stderr too, as in a terminal: a write to it after the hang-up fails with EIO, and
        // ratatui's own restore and drop would panic there (an abort, no checkpoint).
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    if controlling {
        // SAFETY: only setsid(2) and ioctl(2), async-signal-safe, between fork and exec.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = command.spawn().expect("ember starts");
    drop(command);
    drop(slave); // the child holds the terminal now
    let stop = Arc::new(AtomicBool::new(false));
    let reader = drain(&master, stop.clone());
    let metrics = w.join(run).join("metrics.jsonl");
    let started = Instant::now();
    while std::fs::read_to_string(&metrics).map(|m| m.lines().count()).unwrap_or(0) < 3 {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{run}: ember ended ({status}) before training");
        }
        assert!(started.elapsed() < Duration::from_secs(120), "{run}: no steps");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0, "{run}: the dashboard drew on the terminal");
    drop(master); // the terminal is gone
    let closed = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if closed.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("{run}: still running 30 s after its terminal closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = closed.elapsed();
    assert!(took < Duration::from_secs(10), "{run}: exited only after {took:?}");
    assert_eq!(status.code(), Some(0), "{run}: {status}");
    let step = latest_step(&w.join(run));
    assert!(step >= 3, "{run}: a checkpoint of the step it stopped at, got step {step}");
    // The run continues from it.
    let next = format!("max_steps={}", step + 1);
    let out = ok(&["train", "--resume", run, "--set", &next, "--no-tui"], w);
    assert!(out.contains(&format!("(step {step})")), "{out}");
}

/// The usual case: the terminal is the process's controlling terminal, and closing it sends
/// SIGHUP (a stop by signal leaves the dashboard at once).
#[test]
fn a_closed_controlling_terminal_ends_the_run_with_a_checkpoint() {
    closing_the_terminal_ends_the_run(true);
}

/// No SIGHUP (the terminal is not the controlling one): the dashboard sees the hang-up itself,
/// asks the run to stop with a checkpoint and leaves.
#[test]
fn a_hung_up_terminal_without_sighup_ends_the_run_with_a_checkpoint() {
    closing_the_terminal_ends_the_run(false);
}
