//! Several `ember train` processes joined through burn-collective's orchestrator on
//! 127.0.0.1 (loopback only): they train the Shakespeare CPU config as one process with the
//! whole global batch does, and a node that disappears stops the other within the timeout.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The Shakespeare corpus prepared (character level) in a new work directory, or `None`
/// (test skipped) without `EMBER_SHARED`.
fn shakespeare() -> Option<tempfile::TempDir> {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED is not set (the Tiny Shakespeare corpus lives there)");
        return None;
    };
    let corpus = PathBuf::from(shared).join("data/tinyshakespeare.txt");
    let dir = tempfile::tempdir().unwrap();
    ok(
        &["prepare", "--tokenizer", "char", "--input", corpus.to_str().unwrap(), "--out", "prepared"],
        dir.path(),
    );
    Some(dir)
}

fn example_config() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/shakespeare_char.toml")
        .to_string_lossy()
        .into_owned()
}

/// A coordinator port with the 5 ports after it free on 127.0.0.1 (two orchestrators, two
/// data-service ports per node).
fn free_ports() -> u16 {
    let base = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    (0..200u16)
        .map(|i| 20000 + (base.wrapping_mul(7).wrapping_add(i * 37)) % 40000)
        .find(|&p| (p..p + 6).all(|q| TcpListener::bind(("0.0.0.0", q)).is_ok()))
        .expect("6 free ports")
}

/// Starts node `rank` of 2.
fn node(dir: &Path, rank: usize, port: u16, extra: &[&str]) -> Child {
    let coordinator = format!("127.0.0.1:{port}");
    let run_dir = format!("runs/node{rank}");
    let rank = rank.to_string();
    let config = example_config();
    let mut args = vec!["train", "--config", &config, "--data", "prepared", "--run-dir", &run_dir];
    args.extend(["--nodes", "2", "--node-rank", &rank, "--coordinator", &coordinator]);
    args.extend(extra);
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(&args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ember starts")
}

/// Arguments of a run that trains until stopped, logging every step, with `timeout`.
fn endless_run(timeout: &str) -> [&str; 8] {
    ["--set", "max_steps=100000", "--set", "eval_every=0", "--set", "log_every=1", "--set", timeout]
}

/// Waits (up to 2 minutes) until `metrics` holds `n` records.
fn wait_for_records(metrics: &Path, n: usize) {
    let started = Instant::now();
    while std::fs::read_to_string(metrics).map(|m| m.lines().count()).unwrap_or(0) < n {
        assert!(started.elapsed() < Duration::from_secs(120), "the nodes did not start training");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn two_processes_match_one_process_with_twice_the_micro_batch() {
    let Some(dir) = shakespeare() else { return };
    let w = dir.path();
    let steps = ["--set", "max_steps=50", "--set", "eval_every=0", "--set", "log_every=1"];
    let port = free_ports();
    let nodes: Vec<Child> = (0..2).map(|rank| node(w, rank, port, &steps)).collect();
    for (rank, child) in nodes.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "node {rank} failed\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let config = example_config();
    let mut single = vec!["train", "--config", &config, "--data", "prepared", "--run-dir", "runs/single"];
    single.extend(steps);
    single.extend(["--set", "micro_batch_size=24"]);
    ok(&single, w);
    let (two, one) = (train_losses(&w.join("runs/node0")), train_losses(&w.join("runs/single")));
    assert_eq!(two.len(), 50);
    for ((step, a), (_, b)) in two.iter().zip(&one) {
        assert!((a - b).abs() <= 1e-4, "step {step}: loss {a} (2 processes × 12) vs {b} (1 process × 24)");
    }
    // Node 0 writes the run; node 1 writes nothing but its log.
    assert!(w.join("runs/node0/checkpoints/latest").exists());
    assert!(!w.join("runs/node1/metrics.jsonl").exists());
}

/// ZeRO-1 across two processes: each node keeps half the AdamW state and they train as one
/// process with two replicas and replicated state does (20 steps; losses within 1e-6 and the
/// same validation loss at the end); the last step's checkpoint, gathered from both nodes,
/// continues in one process.
#[test]
fn two_processes_sharding_the_optimizer_state_match_two_replicas_replicating_it() {
    let Some(dir) = shakespeare() else { return };
    let w = dir.path();
    let steps = ["--set", "max_steps=20", "--set", "eval_every=20", "--set", "log_every=1"];
    let sharded = [&steps[..], &["--set", "parallel.shard_optimizer=true"]].concat();
    let port = free_ports();
    let nodes: Vec<Child> = (0..2).map(|rank| node(w, rank, port, &sharded)).collect();
    let mut logs = Vec::new();
    for (rank, child) in nodes.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "node {rank} failed\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        logs.push(stdout);
    }
    assert!(logs[0].contains("optimizer state: sharded over 2 ranks (ZeRO-1)"), "{}", logs[0]);
    let config = example_config();
    let mut replicated = vec![
        "train",
        "--config",
        &config,
        "--data",
        "prepared",
        "--run-dir",
        "runs/replicated",
        "--devices",
        "2",
    ];
    replicated.extend(steps);
    ok(&replicated, w);
    let (a, b) = (train_losses(&w.join("runs/node0")), train_losses(&w.join("runs/replicated")));
    assert_eq!(a.len(), 20);
    for ((step, x), (_, y)) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-6, "step {step}: loss {x} (2 nodes, sharded) vs {y} (2 replicas)");
    }
    let val = |run: &str| {
        let text = std::fs::read_to_string(w.join(run).join("metrics.jsonl")).unwrap();
        let evals: Vec<f64> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["kind"] == "eval" && v["step"] == 20)
            .map(|v| v["val_loss"].as_f64().unwrap())
            .collect();
        evals[0]
    };
    let (x, y) = (val("runs/node0"), val("runs/replicated"));
    assert!((x - y).abs() <= 1e-6, "val loss {x} (sharded) vs {y} (replicated)");
    let more = ["train", "--resume", "runs/node0", "--set", "max_steps=22", "--set", "parallel.nodes=1"];
    let out = ok(&more, w);
    assert!(out.contains("step     22 | loss"), "{out}");
}

#[test]
fn a_node_that_disappears_stops_the_other_within_the_timeout() {
    let Some(dir) = shakespeare() else { return };
    let w = dir.path();
    let port = free_ports();
    let extra = endless_run("parallel.timeout_s=5");
    let node0 = node(w, 0, port, &extra);
    let mut node1 = node(w, 1, port, &extra);
    // Let them train a few steps, then kill node 1.
    wait_for_records(&w.join("runs/node0/metrics.jsonl"), 3);
    node1.kill().unwrap();
    let killed = Instant::now();
    let out = node0.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "node 0 stops with an error\n{stderr}");
    assert!(stderr.contains("rank 0: ") && stderr.contains("a rank stopped or disconnected)"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(killed.elapsed() < Duration::from_secs(30), "stopped after {:?}", killed.elapsed());
    let _ = node1.wait();
}

#[test]
fn ctrl_c_on_any_node_stops_every_node_with_a_checkpoint() {
    let Some(dir) = shakespeare() else { return };
    let w = dir.path();
    let port = free_ports();
    let extra = endless_run("parallel.timeout_s=20");
    let node0 = node(w, 0, port, &extra);
    let node1 = node(w, 1, port, &extra);
    wait_for_records(&w.join("runs/node0/metrics.jsonl"), 3);
    // Ctrl-C on node 1 (not the one that writes checkpoints).
    let status = Command::new("kill").args(["-INT", &node1.id().to_string()]).status().unwrap();
    assert!(status.success());
    for (rank, child) in [node0, node1].into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "node {rank}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("stopped after step"), "node {rank}: {stdout}");
    }
    assert!(w.join("runs/node0/checkpoints/latest").exists());
}

#[test]
fn a_node_started_with_another_batch_size_is_stopped_at_the_first_step() {
    nodes_with_other_settings_stop_at_the_first_step(&["--set", "micro_batch_size=6"]);
}

/// Only one node shards the optimizer state: both stop with the settings error, not in the
/// gather the other node never joins.
#[test]
fn a_node_started_with_sharding_among_nodes_without_it_is_stopped_at_the_first_step() {
    nodes_with_other_settings_stop_at_the_first_step(&["--set", "parallel.shard_optimizer=true"]);
}

/// Node 1 runs with `other` settings: both nodes stop after the first exchange, naming it.
fn nodes_with_other_settings_stop_at_the_first_step(other: &[&str]) {
    let Some(dir) = shakespeare() else { return };
    let w = dir.path();
    let port = free_ports();
    let common = ["--set", "max_steps=20", "--set", "eval_every=0", "--set", "parallel.timeout_s=20"];
    let node0 = node(w, 0, port, &common);
    let node1 = node(w, 1, port, &[&common[..], other].concat());
    for (rank, child) in [node0, node1].into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "node {rank}: {stderr}");
        assert!(
            stderr.contains("parameters or run settings differed before step 1"),
            "node {rank}: {stderr}"
        );
    }
}

/// A multi-node job requeued after its last checkpoint: every node finds its run finished,
/// exits 0 without joining the others, and leaves its run directory as it was.
#[test]
fn requeued_nodes_of_a_finished_run_all_exit_0_without_training() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "runs/done", "--no-tui"], w);
    for rank in 0..2 {
        // Each node holds the checkpoint in its own run directory.
        let status =
            Command::new("cp").args(["-r", "runs/done", &format!("runs/node{rank}")]).current_dir(w).status();
        assert!(status.unwrap().success());
    }
    let before = std::fs::read(w.join("runs/node0/metrics.jsonl")).unwrap();
    let coordinator = format!("127.0.0.1:{}", free_ports());
    let nodes: Vec<Child> = (0..2)
        .map(|rank| {
            let (run_dir, rank) = (format!("runs/node{rank}"), rank.to_string());
            Command::new(env!("CARGO_BIN_EXE_ember"))
                .args(["train", "--resume", &run_dir, "--nodes", "2", "--node-rank", &rank])
                .args(["--coordinator", &coordinator, "--no-tui"])
                .current_dir(w)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in nodes.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "node {rank}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("already finished at step 6 (max_steps = 6)"), "node {rank}: {stdout}");
    }
    assert_eq!(std::fs::read(w.join("runs/node0/metrics.jsonl")).unwrap(), before);
}
