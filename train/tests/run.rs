//! Whole runs: reproducibility, exact resume, stopping.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use ember_train::observe::metrics::{read_records, Record};
use ember_train::Controls;
use ember_train::{train, RunConfig, RunOptions, RunSummary};

fn run(config: RunConfig, run_dir: &Path, resume: bool, controls: Arc<Controls>) -> RunSummary {
    let mut options = RunOptions::new(config, run_dir).with_controls(controls);
    options.resume = resume;
    train::<B>(options, Default::default(), &mut |_| {}).unwrap()
}

fn fresh(config: RunConfig, run_dir: &Path) -> RunSummary {
    run(config, run_dir, false, Arc::default())
}

/// (step, loss) pairs.
type Curve = Vec<(u64, f64)>;

/// (step, loss) of every training record, and (step, val_loss) of every evaluation.
fn trajectory(run_dir: &Path) -> (Curve, Curve) {
    let mut train = Vec::new();
    let mut eval = Vec::new();
    for record in read_records(&run_dir.join("metrics.jsonl")).unwrap() {
        match record {
            Record::Train(r) => train.push((r.step, r.loss)),
            Record::Eval(r) => eval.push((r.step, r.val_loss)),
            Record::Event(e) => panic!("no sentinel event expected: {e}"),
        }
    }
    (train, eval)
}

#[test]
fn same_seed_gives_identical_loss_trajectory() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    fresh(tiny_config(&data, &[]), &dir.path().join("a"));
    fresh(tiny_config(&data, &[]), &dir.path().join("b"));
    fresh(tiny_config(&data, &["seed=7"]), &dir.path().join("c"));
    let (a, b, c) = (
        trajectory(&dir.path().join("a")),
        trajectory(&dir.path().join("b")),
        trajectory(&dir.path().join("c")),
    );
    assert_eq!(a.0.len(), 6);
    assert_eq!(a, b, "same seed, same losses bit for bit");
    assert_ne!(a.0, c.0, "another seed gives other losses");
    assert!(a.0[5].1 < a.0[0].1, "the loss falls: {:?}", a.0);
}

#[test]
fn resuming_from_a_checkpoint_repeats_the_uninterrupted_run_exactly() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let straight = dir.path().join("straight");
    fresh(tiny_config(&data, &[]), &straight);

    // Stop after step 3 (its checkpoint is the latest), then resume to step 6.
    let resumed = dir.path().join("resumed");
    let summary = fresh(tiny_config(&data, &["max_steps=3"]), &resumed);
    assert_eq!(summary.steps, 3);
    let config = RunConfig::load(&resumed.join("config.toml"), &["max_steps=6".into()]).unwrap();
    let summary = run(config, &resumed, true, Arc::default());
    assert_eq!(summary.steps, 6);
    assert_eq!(trajectory(&straight), trajectory(&resumed));
}

#[test]
fn resuming_an_older_checkpoint_rewrites_the_metrics_after_it() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    fresh(tiny_config(&data, &[]), &run_dir);
    let before = trajectory(&run_dir);
    // As if the process had died after step 6's metrics but before its checkpoint was
    // complete (no manifest yet; `latest` still names step 3).
    std::fs::remove_file(run_dir.join("checkpoints/step-00000006/manifest.json")).unwrap();
    std::fs::write(run_dir.join("checkpoints/latest"), "step-00000003").unwrap();
    let config = RunConfig::load(&run_dir.join("config.toml"), &[]).unwrap();
    run(config, &run_dir, true, Arc::default());
    assert_eq!(trajectory(&run_dir), before, "steps 4–6 redone once, identically");
}

#[test]
fn a_stop_request_checkpoints_and_the_run_resumes_from_there() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    let summary = run(tiny_config(&data, &[]), &run_dir, false, Controls::stopping());
    assert!(summary.stopped_early);
    assert_eq!(summary.steps, 1);
    let latest = std::fs::read_to_string(run_dir.join("checkpoints/latest")).unwrap();
    assert_eq!(latest, "step-00000001");
    let config = RunConfig::load(&run_dir.join("config.toml"), &[]).unwrap();
    assert_eq!(run(config, &run_dir, true, Arc::default()).steps, 6);
}

#[test]
fn a_new_run_refuses_a_directory_that_holds_one() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    fresh(tiny_config(&data, &["max_steps=1"]), &run_dir);
    let options = RunOptions::new(tiny_config(&data, &[]), &run_dir);
    let err = train::<B>(options, Default::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("already holds a run") && err.contains("--resume"), "{err}");
}

#[test]
fn resuming_with_another_seed_names_the_override() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    fresh(tiny_config(&data, &["max_steps=1", "seed=7"]), &run_dir);
    let config =
        RunConfig::load(&run_dir.join("config.toml"), &["seed=8".into(), "max_steps=2".into()]).unwrap();
    let options = RunOptions::new(config, run_dir).resuming();
    let err = train::<B>(options, Default::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.starts_with("--set seed=8: key `seed`: 8 differs from the checkpoint's 7 ("), "{err}");
}

#[test]
fn resuming_with_another_model_is_an_error() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    fresh(tiny_config(&data, &["max_steps=1"]), &run_dir);
    let config = RunConfig::load(&run_dir.join("config.toml"), &["model.n_layer=3".into()]).unwrap();
    let options = RunOptions::new(config, run_dir).resuming();
    let err = train::<B>(options, Default::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(
        err.contains("model cannot change when resuming (")
            && err.contains("config.toml with --set model.n_layer=3)"),
        "names the override: {err}"
    );
    assert!(err.ends_with("model.n_layer: checkpoint 2, config 3"), "the differing key, named: {err}");
}

#[test]
fn a_run_that_stopped_before_its_first_checkpoint_can_be_started_again() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::write(
        run_dir.join("metrics.jsonl"),
        "{\"kind\":\"eval\",\"step\":0,\"val_loss\":9.0,\"val_perplexity\":1.0,\"elapsed_s\":0.0}\n",
    )
    .unwrap();
    let options = RunOptions::new(tiny_config(&data, &["max_steps=1"]), &run_dir).resuming();
    let err = train::<B>(options, Default::default(), &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("stopped before its first checkpoint"), "{err}");
    fresh(tiny_config(&data, &["max_steps=1"]), &run_dir);
    let (_, evals) = trajectory(&run_dir);
    assert_ne!(evals[0].1, 9.0, "the old metrics were replaced");
}
