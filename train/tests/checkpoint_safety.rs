//! Crash-safe, verified checkpoints: a checkpoint is complete before `latest` names it; a
//! process killed at any stage of writing one leaves the earlier ones loadable; damaged files
//! are named and skipped; a write that fails (a file-size limit) keeps the previous checkpoint.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::*;
use ember_train::persist::checkpoint;
use ember_train::tools::trained::{Source, Trained};
use ember_train::{train, RunConfig, RunOptions, RunSummary, TrainError};
use sha2::Digest as _;

/// A run of the tiny config to step 4 with checkpoints at steps 2 and 4.
fn base_run(dir: &Path) -> PathBuf {
    let data = prepared_corpus(dir);
    let run_dir = dir.join("base");
    let config = tiny_config(&data, &["max_steps=4", "checkpoint_every=2", "eval_every=2"]);
    train::<B>(RunOptions::new(config, &run_dir), Default::default(), &mut |_| {}).unwrap();
    run_dir
}

/// Resumes `run_dir` to `max_steps`; returns the summary (or error) and the log lines.
fn resume(run_dir: &Path, max_steps: u64) -> (Result<RunSummary, TrainError>, Vec<String>) {
    let overrides = [format!("max_steps={max_steps}")];
    let config = RunConfig::load(&run_dir.join("config.toml"), &overrides).unwrap();
    let mut lines = Vec::new();
    let options = RunOptions::new(config, run_dir).resuming();
    let result = train::<B>(options, Default::default(), &mut |l| lines.push(l.to_string()));
    (result, lines)
}

/// The step of the checkpoint `ember eval` / `sample` / `export` would load, and their log.
fn trained_step(run_dir: &Path) -> Result<(u64, Vec<String>), TrainError> {
    let mut lines = Vec::new();
    let trained = Trained::open_logged(Source::Run(run_dir.into()), &mut |l| lines.push(l.to_string()))?;
    trained.load_model::<burn::backend::Flex>(&Default::default())?;
    Ok((trained.step()?, lines))
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn ckpt(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join("checkpoints").join(name)
}

fn leftovers(run_dir: &Path) -> Vec<String> {
    fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect()
}

/// Flips `n` bytes in the middle of `path`.
fn flip_bytes(path: &Path, n: usize) {
    let mut bytes = fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + n] {
        *b ^= 0xff;
    }
    fs::write(path, bytes).unwrap();
}

#[test]
fn every_file_of_a_checkpoint_is_in_its_manifest() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = base_run(dir.path());
    let step4 = ckpt(&run_dir, "step-00000004");
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(step4.join("manifest.json")).unwrap()).unwrap();
    let files = manifest["files"].as_array().unwrap();
    let names: Vec<&str> = files.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["model.mpk", "optim_decay.mpk", "optim_no_decay.mpk", "state.json", "config.toml"]);
    for f in files {
        let bytes = fs::read(step4.join(f["name"].as_str().unwrap())).unwrap();
        assert_eq!(f["bytes"].as_u64().unwrap(), bytes.len() as u64);
        let hex: String = sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(f["sha256"].as_str().unwrap(), hex, "{}", f["name"]);
    }
    assert_eq!(manifest["step"], 4);
    assert_eq!(fs::read_to_string(run_dir.join("checkpoints/latest")).unwrap(), "step-00000004");
    assert!(leftovers(&run_dir).is_empty(), "{:?}", leftovers(&run_dir));
}

/// The state on disk after a kill at each stage of writing step 4's checkpoint (step 2's
/// complete), and the step resume and eval must then load.
#[test]
fn resume_and_eval_load_the_newest_complete_checkpoint_after_a_kill_at_any_stage() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let base = base_run(dir.path());
    const TMP: &str = ".tmp-step-00000004-99999";
    type Stage = (&'static str, fn(&Path), u64, Option<&'static str>);
    let stages: [Stage; 7] = [
        ("files half written", |r| {
            fs::rename(ckpt(r, "step-00000004"), ckpt(r, TMP)).unwrap();
            fs::remove_file(ckpt(r, TMP).join("manifest.json")).unwrap();
            let model = ckpt(r, TMP).join("model.mpk");
            let len = fs::metadata(&model).unwrap().len();
            fs::OpenOptions::new().write(true).open(&model).unwrap().set_len(len / 2).unwrap();
            fs::write(ckpt(r, "latest"), "step-00000002").unwrap();
        }, 2, None),
        ("manifest written, directory not renamed", |r| {
            fs::rename(ckpt(r, "step-00000004"), ckpt(r, TMP)).unwrap();
            fs::write(ckpt(r, "latest"), "step-00000002").unwrap();
        }, 2, None),
        ("renamed, latest not moved", |r| {
            fs::write(ckpt(r, "latest"), "step-00000002").unwrap();
        }, 4, Some("checkpoints/latest names step-00000002; using step-00000004, a newer complete checkpoint")),
        ("renamed, latest's temp file written but not renamed", |r| {
            fs::write(ckpt(r, "latest"), "step-00000002").unwrap();
            fs::write(ckpt(r, ".tmpAbC123"), "step-00000004").unwrap();
        }, 4, Some("checkpoints/latest names step-00000002; using step-00000004, a newer complete checkpoint")),
        ("no latest at all", |r| fs::remove_file(ckpt(r, "latest")).unwrap(), 4, None),
        // An earlier Ember wrote the config after moving `latest`: killed in between.
        ("latest names a directory without its config or manifest", |r| {
            fs::remove_file(ckpt(r, "step-00000004").join("config.toml")).unwrap();
            fs::remove_file(ckpt(r, "step-00000004").join("manifest.json")).unwrap();
        }, 2, Some("skipped checkpoints/step-00000004: incomplete (no manifest.json: the run stopped while writing it); using step-00000002")),
        ("latest names a directory that is not there", |r| {
            fs::write(ckpt(r, "latest"), "step-00000006").unwrap();
        }, 4, Some("checkpoints/latest names step-00000006, which is missing; using step-00000004")),
    ];
    for (i, (stage, make, expected, skip_line)) in stages.into_iter().enumerate() {
        let run_dir = dir.path().join(format!("stage{i}"));
        copy_dir(&base, &run_dir);
        make(&run_dir);
        let (step, lines) = trained_step(&run_dir).unwrap_or_else(|e| panic!("{stage}: eval: {e}"));
        assert_eq!(step, expected, "{stage}: eval loads the newest complete checkpoint");
        assert_eq!(lines.first().map(String::as_str), skip_line, "{stage}: {lines:?}");
        let had_leftovers = !leftovers(&run_dir).is_empty();
        let (result, lines) = resume(&run_dir, 6);
        let summary = result.unwrap_or_else(|e| panic!("{stage}: resume: {e}"));
        assert_eq!(summary.steps, 6, "{stage}");
        let resumed = format!("step {expected})");
        assert!(
            lines.iter().any(|l| l.starts_with("resumed from") && l.ends_with(&resumed)),
            "{stage}: {lines:?}"
        );
        if let Some(skip_line) = skip_line {
            assert!(lines.iter().any(|l| l == skip_line), "{stage}: {lines:?}");
        }
        if had_leftovers {
            assert!(lines.iter().any(|l| l.starts_with("removed checkpoints/.tmp")), "{stage}: {lines:?}");
        }
        assert!(leftovers(&run_dir).is_empty(), "{stage}: {:?}", leftovers(&run_dir));
        assert_eq!(fs::read_to_string(ckpt(&run_dir, "latest")).unwrap(), "step-00000006", "{stage}");
    }
}

#[test]
fn damaged_files_are_named_skipped_and_never_loaded() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = base_run(dir.path());
    // 16 flipped bytes: Burn would load them as weights (and eval would report NaN or junk).
    flip_bytes(&ckpt(&run_dir, "step-00000004").join("model.mpk"), 16);
    let (step, lines) = trained_step(&run_dir).unwrap();
    assert_eq!(step, 2);
    assert_eq!(
        lines,
        ["skipped checkpoints/step-00000004: model.mpk is damaged (sha256 differs from manifest.json); using step-00000002"]
    );
    // Loading the damaged checkpoint directly names the file.
    let config = RunConfig::load(&run_dir.join("config.toml"), &[]).unwrap();
    let model = config.model.init::<burn::backend::Flex>(&Default::default()).unwrap();
    let err = checkpoint::load_model(&ckpt(&run_dir, "step-00000004"), model, &Default::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.ends_with("step-00000004: model.mpk is damaged (sha256 differs from manifest.json)"),
        "{err}"
    );

    // A truncated file in the older one too: nothing loads, and the error lists both.
    let optim = ckpt(&run_dir, "step-00000002").join("optim_decay.mpk");
    let len = fs::metadata(&optim).unwrap().len();
    fs::OpenOptions::new().write(true).open(&optim).unwrap().set_len(len - 100).unwrap();
    let err = trained_step(&run_dir).err().unwrap().to_string();
    let expected = format!(
        "no checkpoint can be loaded: checkpoints/step-00000004: model.mpk is damaged (sha256 differs from manifest.json); checkpoints/step-00000002: optim_decay.mpk is damaged (size {} bytes differs from manifest.json's {len})",
        len - 100
    );
    assert!(err.contains(&expected), "{err}");
    assert!(!err.contains("0.14"), "no misleading advice about Burn's format: {err}");
    let err = resume(&run_dir, 6).0.err().unwrap().to_string();
    assert!(err.contains(&expected), "{err}");
}

#[test]
fn a_checkpoint_of_an_earlier_ember_is_refused_with_advice() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = base_run(dir.path());
    fs::remove_dir_all(ckpt(&run_dir, "step-00000002")).unwrap();
    let step4 = ckpt(&run_dir, "step-00000004");
    fs::remove_file(step4.join("manifest.json")).unwrap();
    let state =
        fs::read_to_string(step4.join("state.json")).unwrap().replace("\"version\": 3", "\"version\": 2");
    fs::write(step4.join("state.json"), state).unwrap();
    let err = trained_step(&run_dir).err().unwrap().to_string();
    assert!(
        err.contains("step-00000004: written by an earlier Ember (checkpoint version 2, without manifest.json), so it cannot be verified; continue that run with the Ember version that wrote it"),
        "{err}"
    );
}

/// Child side of [`a_failed_write_keeps_the_previous_checkpoint_and_latest`]: with a
/// file-size limit too small for `model.mpk`, resuming must fail with the cause and path.
#[test]
fn fsize_limited_resume_child() {
    let Ok(run_dir) = std::env::var("EMBER_TEST_FSIZE_RUN") else { return };
    let run_dir = PathBuf::from(run_dir);
    let config = RunConfig::load(&run_dir.join("config.toml"), &["max_steps=4".into()]).unwrap();
    let limit: u64 = std::env::var("EMBER_TEST_FSIZE_LIMIT").unwrap().parse().unwrap();
    // SAFETY: plain libc calls on this (single-test) child process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let rlim = libc::rlimit { rlim_cur: limit as libc::rlim_t, rlim_max: limit as libc::rlim_t };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &rlim), 0);
    }
    let err = train::<B>(RunOptions::new(config, &run_dir).resuming(), Default::default(), &mut |_| {})
        .expect_err("a model.mpk over the limit cannot be written");
    println!("CHILD ERROR: {err}");
}

#[test]
fn a_failed_write_keeps_the_previous_checkpoint_and_latest() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    let config = tiny_config(&data, &["max_steps=2", "checkpoint_every=2", "eval_every=2"]);
    train::<B>(RunOptions::new(config, &run_dir), Default::default(), &mut |_| {}).unwrap();
    let model_size = fs::metadata(ckpt(&run_dir, "step-00000002").join("model.mpk")).unwrap().len();
    let metrics_size = fs::metadata(run_dir.join("metrics.jsonl")).unwrap().len();
    let limit = model_size / 2;
    assert!(limit > 4 * metrics_size, "the limit only stops the checkpoint: {limit} vs {metrics_size}");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["fsize_limited_resume_child", "--exact", "--nocapture", "--test-threads=1"])
        .env("EMBER_TEST_FSIZE_RUN", &run_dir)
        .env("EMBER_TEST_FSIZE_LIMIT", limit.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let err = stdout
        .split("CHILD ERROR: ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("no error from the child: {out:?}"));
    let tmp_model = "checkpoints/.tmp-step-00000004-";
    assert!(err.starts_with("cannot write checkpoint file ") && err.contains(tmp_model), "{err}");
    assert!(err.contains("/model.mpk: File too large (os error 27); step-00000004 was not saved; the earlier checkpoints are untouched and checkpoints/latest still names step-00000002: raise the file-size limit (`ulimit -f`), then continue with `ember train --resume "), "{err}");
    assert!(leftovers(&run_dir).is_empty(), "the temp directory is removed: {:?}", leftovers(&run_dir));
    assert!(!ckpt(&run_dir, "step-00000004").exists());
    assert_eq!(fs::read_to_string(ckpt(&run_dir, "latest")).unwrap(), "step-00000002");
    let (found, skipped) = checkpoint::newest_verified(&run_dir).unwrap();
    assert_eq!((found, skipped), (ckpt(&run_dir, "step-00000002"), vec![]));
    let (result, lines) = resume(&run_dir, 4);
    assert_eq!(result.unwrap().steps, 4, "{lines:?}");
}

#[test]
fn a_renamed_checkpoint_directory_is_not_taken_for_another_step() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = base_run(dir.path());
    // Renamed above the newest: its files verify, but it is step 2's, not step 9's.
    fs::rename(ckpt(&run_dir, "step-00000002"), ckpt(&run_dir, "step-00000009")).unwrap();
    let (step, lines) = trained_step(&run_dir).unwrap();
    assert_eq!(step, 4);
    assert_eq!(
        lines,
        ["skipped checkpoints/step-00000009: manifest.json is damaged (it is step 2's, but the directory is named step-00000009); using step-00000004"]
    );
}
