//! `ember train` killed with SIGKILL at random moments, and over the file-size limit: the
//! run always resumes from its newest complete checkpoint.

mod common;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ember_train::persist::checkpoint;

/// The step `checkpoints/latest` names (0 before the first checkpoint).
fn latest_step(run_dir: &Path) -> u64 {
    fs::read_to_string(run_dir.join("checkpoints/latest"))
        .ok()
        .and_then(|s| s.trim().strip_prefix("step-").and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

fn temp_entries(run_dir: &Path) -> Vec<String> {
    fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect()
}

/// `ember args` in `w` with stdout and stderr to files (a full pipe would block it).
fn spawn(args: &[&str], w: &Path, round: usize) -> Child {
    let out = fs::File::create(w.join(format!("round{round}.log"))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .current_dir(w)
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap()
}

#[test]
fn kill_9_at_random_moments_never_breaks_resume() {
    let dir = workdir();
    let w = dir.path();
    let run_dir = w.join("run");
    let mut seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    println!("seed {seed}");
    let mut random = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let first = [
        "train",
        "--config",
        "tiny.toml",
        "--run-dir",
        "run",
        "--set",
        "max_steps=100000",
        "--set",
        "checkpoint_every=1",
        "--set",
        "eval_every=1000",
        "--set",
        "log_every=1000",
    ];
    let mut killed_mid_checkpoint = 0;
    let rounds = 12;
    for round in 0..rounds {
        let args: &[&str] = if round == 0 { &first } else { &["train", "--resume", "run"] };
        let mut child = spawn(args, w, round);
        // Let it write a few checkpoints past the one it started from, then kill it at a
        // random moment.
        let (start, wanted) = (latest_step(&run_dir), 2 + random(3));
        let deadline = Instant::now() + Duration::from_secs(20);
        while latest_step(&run_dir) < start + wanted {
            if let Some(status) = child.try_wait().unwrap() {
                let log = fs::read_to_string(w.join(format!("round{round}.log"))).unwrap();
                panic!("round {round}: ember exited ({status}) before being killed:\n{log}");
            }
            assert!(Instant::now() < deadline, "round {round}: no progress past step {start}");
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_micros(random(20_000)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if temp_entries(&run_dir).iter().any(|n| n.starts_with(".tmp-step-")) {
            killed_mid_checkpoint += 1;
        }
        let (newest, skipped) = checkpoint::newest_verified(&run_dir).unwrap();
        assert!(skipped.is_empty(), "round {round}: only complete step-* directories: {skipped:?}");
        let newest_step: u64 =
            newest.file_name().unwrap().to_str().unwrap()["step-".len()..].parse().unwrap();
        assert!(newest_step >= latest_step(&run_dir) && newest_step >= start + wanted, "round {round}");
        if round > 0 {
            let log = fs::read_to_string(w.join(format!("round{round}.log"))).unwrap();
            assert!(log.contains("resumed from"), "round {round}:\n{log}");
        }
    }
    println!("killed in the middle of a checkpoint {killed_mid_checkpoint} times out of {rounds}");
    let (newest, _) = checkpoint::newest_verified(&run_dir).unwrap();
    let step: u64 = newest.file_name().unwrap().to_str().unwrap()["step-".len()..].parse().unwrap();
    let out = ok(&["train", "--resume", "run", "--set", &format!("max_steps={}", step + 2)], w);
    assert!(out.contains(&format!("(step {step})")), "{out}");
    assert!(temp_entries(&run_dir).is_empty(), "{:?}", temp_entries(&run_dir));
    let eval = ok(&["eval", "--run", "run"], w);
    assert!(eval.starts_with(&format!("step {}: train loss ", step + 2)), "{eval}");
}

#[test]
fn a_write_over_the_file_size_limit_is_an_error_and_keeps_the_previous_checkpoint() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "max_steps=3"], w);
    let model_size = fs::metadata(w.join("run/checkpoints/step-00000003/model.mpk")).unwrap().len();
    let limit = model_size / 2;
    let mut command = Command::new(env!("CARGO_BIN_EXE_ember"));
    command.args(["train", "--resume", "run", "--set", "max_steps=6"]).current_dir(w);
    // SAFETY: only setrlimit (async-signal-safe) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let rlim = libc::rlimit { rlim_cur: limit as libc::rlim_t, rlim_max: libc::RLIM_INFINITY };
            match libc::setrlimit(libc::RLIMIT_FSIZE, &rlim) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Without ignoring SIGXFSZ, the process would be killed by it, silently (no exit code).
    assert_eq!(out.status.code(), Some(1), "{:?}\n{stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.starts_with("error: cannot write checkpoint file "), "{stderr}");
    assert!(
        stderr.contains("/model.mpk: File too large (os error 27); step-00000006 was not saved; the earlier checkpoints are untouched and checkpoints/latest still names step-00000003: raise the file-size limit (`ulimit -f`), then continue with `ember train --resume run`"),
        "{stderr}"
    );
    let run_dir = w.join("run");
    assert!(temp_entries(&run_dir).is_empty(), "{:?}", temp_entries(&run_dir));
    assert_eq!(latest_step(&run_dir), 3);
    assert!(ok(&["eval", "--run", "run"], w).starts_with("step 3: "));
    let out = ok(&["train", "--resume", "run", "--set", "max_steps=6"], w);
    assert!(out.contains("resumed from") && out.contains("(step 3)"), "{out}");
    assert_eq!(latest_step(&run_dir), 6);
}

/// A scheduler that requeues a preempted job runs the same command until it exits 0. Killed
/// right after each checkpoint, the last one included, the run ends with the weights of the
/// uninterrupted run, and a requeue of the finished run succeeds without changing a byte.
#[test]
fn a_run_killed_after_each_checkpoint_and_requeued_until_it_succeeds_ends_with_the_straight_runs_weights() {
    let dir = workdir();
    let w = dir.path();
    let sets = ["--set", "max_steps=6", "--set", "checkpoint_every=1", "--set", "keep_checkpoints=10"];
    fn start<'a>(run: &'a str, sets: &[&'a str]) -> Vec<&'a str> {
        [&["train", "--config", "tiny.toml", "--run-dir", run, "--no-tui"][..], sets].concat()
    }
    ok(&start("straight", &sets), w);
    let requeue = ["train", "--resume", "requeued", "--no-tui"];
    let run_dir = w.join("requeued");
    let mut finished_rounds = 0;
    for round in 0..20 {
        let args: Vec<&str> = if round == 0 { start("requeued", &sets) } else { requeue.to_vec() };
        let mut child = spawn(&args, w, round);
        let from = latest_step(&run_dir);
        // Killed as soon as it has written its next checkpoint (the last one too).
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if latest_step(&run_dir) > from {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                break None;
            }
            assert!(Instant::now() < deadline, "round {round}: no checkpoint after step {from}");
            std::thread::sleep(Duration::from_millis(1));
        };
        let log = fs::read_to_string(w.join(format!("round{round}.log"))).unwrap();
        match status {
            None => {}
            Some(status) if status.success() => {
                finished_rounds += 1;
                if log.contains("already finished at step 6 (max_steps = 6)") {
                    break;
                }
            }
            Some(status) => panic!("round {round}: {status}\n{log}"),
        }
    }
    assert!(finished_rounds >= 1, "the requeued job succeeded");
    assert_eq!(latest_step(&run_dir), 6);
    // Requeued again and again after it finished: exit 0, nothing changes.
    let snapshot = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                match path.is_dir() {
                    true => stack.push(path),
                    false => files.push((path.display().to_string(), fs::read(&path).unwrap())),
                }
            }
        }
        files.sort();
        files
    };
    let before = snapshot(&run_dir);
    for _ in 0..2 {
        let out = ok(&requeue, w);
        assert!(out.contains("already finished at step 6 (max_steps = 6)"), "{out}");
        assert!(snapshot(&run_dir) == before, "a finished run's files are byte-identical after a requeue");
    }
    // The weights (exported: a Burn record also holds random parameter ids) and every logged
    // loss of the uninterrupted run.
    let weights = |run: &str| {
        ok(&["export", "--run", run, "--format", "hf-gpt2", "--out", &format!("{run}-hf")], w);
        fs::read(w.join(format!("{run}-hf/model.safetensors"))).unwrap()
    };
    assert!(weights("requeued") == weights("straight"), "the final weights are the uninterrupted run's");
    assert_eq!(train_losses(&run_dir), train_losses(&w.join("straight")));
}
