//! Running the `ember` binary from the CLI tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs `ember args` in `cwd`.
pub fn ember(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember")).args(args).current_dir(cwd).output().expect("ember runs")
}

/// Runs `ember args`, which must succeed; returns its stdout.
pub fn ok(args: &[&str], cwd: &Path) -> String {
    let out = ember(args, cwd);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "ember {args:?} failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    stdout.into_owned()
}

/// Runs `ember args`, which must fail with exit status 1 (an error, not a panic's 101) and
/// an `error: ` line; returns its stderr.
pub fn fails(args: &[&str], cwd: &Path) -> String {
    let out = ember(args, cwd);
    assert_eq!(out.status.code(), Some(1), "ember {args:?}: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// The (step, loss) of every training record of a run, bit for bit.
pub fn train_losses(run_dir: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "train")
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}
