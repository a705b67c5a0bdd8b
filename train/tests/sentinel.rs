//! The stability sentinel in the run loop: a non-finite step at any step (logged or not) is
//! skipped with the weights and both AdamW moments bit-identical to before; skipped steps in a
//! row stop the run with a checkpoint of the last good state, which resumes; loss spikes are
//! marked or skipped; every event is a `metrics.jsonl` record naming its data; `ember replay`
//! reproduces a step's numbers.

mod common;

use std::path::Path;

use burn::tensor::backend::Backend;
use common::*;
use ember_model::LanguageModel;
use ember_train::observe::events::{Action, Anomaly, EventRecord};
use ember_train::observe::metrics::{read_records, Record, TrainRecord};
use ember_train::parallel::{Corruption, Faults};
use ember_train::persist::checkpoint;
use ember_train::step::optim::AdamWGroups;
use ember_train::step::{train_step, Solo, StepSettings};
use ember_train::tools::replay::replay_run;
use ember_train::RunConfig;
use ember_train::{train, RunOptions, TrainError};

/// Trains `options` on the CPU.
fn run(options: RunOptions) -> Result<ember_train::RunSummary, TrainError> {
    train::<B>(options, Vec::new(), &mut |_| {})
}

/// Options of a tiny run in `run_dir` with `overrides`, corrupting steps `first..=last`.
fn corrupted(
    data: &Path,
    run_dir: &Path,
    overrides: &[&str],
    corrupt: Option<(u64, u64, Corruption)>,
) -> RunOptions {
    let mut base = vec!["checkpoint_every=1", "keep_checkpoints=20", "eval_every=0"];
    base.extend_from_slice(overrides);
    let mut options = RunOptions::new(tiny_config(data, &base), run_dir);
    options.faults = Faults { corrupt, ..Faults::default() };
    options
}

fn checkpoint_file(run_dir: &Path, step: u64, name: &str) -> Vec<u8> {
    let path = run_dir.join("checkpoints").join(format!("step-{step:08}")).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The weights after one more optimizer step from checkpoint `step` on a fixed batch: equal
/// for two checkpoints exactly when their weights and AdamW state (both moments and the step
/// count) are equal. (The optimizer files themselves are not comparable byte for byte: Burn
/// writes its state map in hash order.)
fn next_weights(run_dir: &Path, step: u64) -> Vec<f32> {
    let dir = run_dir.join("checkpoints").join(format!("step-{step:08}"));
    let config = RunConfig::load(&run_dir.join("config.toml"), &[]).unwrap();
    let device = Default::default();
    let model: LanguageModel<B> =
        checkpoint::load_model(&dir, config.model.init(&device).unwrap(), &device).unwrap();
    let optimizer = AdamWGroups::new(&config.optimizer, &model);
    let mut optimizer = checkpoint::load_optimizer(&dir, optimizer, &device).unwrap();
    let row: Vec<u32> = (1..=16).collect();
    let targets: Vec<i32> = (2..=17).collect();
    let batch = batch(&[(&row, &targets)]);
    let settings = StepSettings::new(100, 1e-3, 1.0);
    <B as Backend>::seed(&device, 7);
    let (model, _) = train_step(model, &mut optimizer, &[batch], settings, &mut Solo, None, &device).unwrap();
    flat_params(&model)
}

/// Checkpoint `step`'s weights, and the weights one more step would give.
fn state(run_dir: &Path, step: u64) -> (Vec<u8>, Vec<f32>) {
    (checkpoint_file(run_dir, step, "model.mpk"), next_weights(run_dir, step))
}

fn events(run_dir: &Path) -> Vec<EventRecord> {
    let records = read_records(&run_dir.join("metrics.jsonl")).unwrap();
    records.into_iter().filter_map(|r| if let Record::Event(e) = r { Some(e) } else { None }).collect()
}

fn train_records(run_dir: &Path) -> Vec<TrainRecord> {
    let records = read_records(&run_dir.join("metrics.jsonl")).unwrap();
    records.into_iter().filter_map(|r| if let Record::Train(t) = r { Some(t) } else { None }).collect()
}

#[test]
fn a_nonfinite_gradient_at_an_unlogged_step_changes_nothing() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    let corrupt = Some((2, 2, Corruption::NanGradients));
    let summary = run(corrupted(&data, &run_dir, &["max_steps=4", "log_every=3"], corrupt)).unwrap();
    assert_eq!(summary.steps, 4);
    // Step 2 was skipped: its checkpoint holds step 1's weights and AdamW moments exactly.
    assert!(state(&run_dir, 2) == state(&run_dir, 1), "weights or moments changed");
    assert_ne!(state(&run_dir, 3).0, state(&run_dir, 2).0, "training went on after it");
    let events = events(&run_dir);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!((e.step, e.event, e.action), (2, Anomaly::NonfiniteGradNorm, Action::Skipped));
    assert_eq!((e.value.as_str(), e.grad_norm, e.skipped_in_a_row), ("NaN", None, 1));
    assert!(e.loss.is_some_and(f64::is_finite));
    // Where the step's data came from: one micro-batch of 4 rows of epoch 0.
    assert_eq!((e.sources.len(), e.sources[0].epoch, e.sources[0].rows.len()), (1, 0, 4));
    let logged: Vec<(u64, u64)> = train_records(&run_dir).iter().map(|r| (r.step, r.skipped_steps)).collect();
    assert_eq!(logged, [(3, 1), (4, 1)]);
}

#[test]
fn skipped_steps_in_a_row_stop_with_the_last_good_checkpoint_which_resumes() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    let overrides = ["max_steps=8", "sentinel.max_skipped_steps=3"];
    let corrupt = Some((2, 100, Corruption::NanLoss));
    let err = run(corrupted(&data, &run_dir, &overrides, corrupt)).unwrap_err();
    match &err {
        TrainError::Unstable { step: 4, reason, .. } => {
            assert!(reason.contains("3 steps in a row"), "{reason}")
        }
        other => panic!("expected the sentinel to stop the run at step 4, got {other}"),
    }
    assert!(err.to_string().contains("ember replay --run"), "{err}");
    assert!(state(&run_dir, 4) == state(&run_dir, 1), "the last good state is step 1's");
    let actions: Vec<(u64, Anomaly, Action)> =
        events(&run_dir).iter().map(|e| (e.step, e.event, e.action)).collect();
    assert_eq!(
        actions,
        [
            (2, Anomaly::NonfiniteLoss, Action::Skipped),
            (3, Anomaly::NonfiniteLoss, Action::Skipped),
            (4, Anomaly::NonfiniteLoss, Action::Stopped)
        ]
    );
    // The data recovers: resuming goes on from the checkpoint, past the bad batches.
    let resumed = corrupted(&data, &run_dir, &["max_steps=6"], None).resuming();
    assert_eq!(run(resumed).unwrap().steps, 6);
    let last = train_records(&run_dir).last().cloned().unwrap();
    assert_eq!((last.step, last.skipped_steps), (6, 3), "the counters resume");
}

#[test]
fn stop_mode_stops_at_the_first_nonfinite_step() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    let corrupt = Some((3, 3, Corruption::NanLoss));
    let err = run(corrupted(&data, &run_dir, &["sentinel.on_nonfinite=\"stop\""], corrupt)).unwrap_err();
    assert!(matches!(err, TrainError::Unstable { step: 3, .. }), "{err}");
    assert!(err.to_string().contains("sentinel.on_nonfinite = \"stop\""), "{err}");
    assert!(state(&run_dir, 3) == state(&run_dir, 2), "step 3 changed the state");
}

#[test]
fn loss_spikes_are_marked_or_skipped() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    for (action, skipped) in [("mark", false), ("skip", true)] {
        let run_dir = dir.path().join(action);
        let overrides = [
            "sentinel.spike_zscore=4",
            "sentinel.spike_window=3",
            &format!("sentinel.spike_action=\"{action}\""),
        ];
        let corrupt = Some((5, 5, Corruption::LossTimes(50)));
        run(corrupted(&data, &run_dir, &overrides, corrupt)).unwrap();
        let events = events(&run_dir);
        assert_eq!(events.len(), 1, "{action}: {events:?}");
        let e = &events[0];
        assert_eq!((e.step, e.event), (5, Anomaly::Spike));
        assert_eq!(e.action, if skipped { Action::Skipped } else { Action::Marked });
        assert!(e.zscore.unwrap() > 4.0 && e.loss.unwrap() > 40.0, "{e:?}");
        assert_eq!(state(&run_dir, 5) == state(&run_dir, 4), skipped, "{action}");
        let last = train_records(&run_dir).last().cloned().unwrap();
        assert_eq!((last.spikes, last.skipped_steps), (1, u64::from(skipped)));
    }
}

/// `ember replay` runs the steps in the run's precision (and, for fp16-mixed, with its loss
/// scaler from the checkpoint): the replayed loss and gradient norm equal the record's.
#[test]
fn replay_reproduces_mixed_precision_steps() {
    let _g = serial();
    for precision in ["bf16-mixed", "fp16-mixed"] {
        let dir = tempfile::tempdir().unwrap();
        let data = prepared_corpus(dir.path());
        let run_dir = dir.path().join("run");
        let set = format!("precision=\"{precision}\"");
        run(corrupted(&data, &run_dir, &["checkpoint_every=2", &set], None)).unwrap();
        let records = train_records(&run_dir);
        for step in [3, 4] {
            let report = replay_run(&run_dir, step, None, &mut |_| {}).unwrap();
            let recorded = records.iter().find(|r| r.step == step).unwrap();
            assert_eq!(recorded.loss_scale.is_some(), precision == "fp16-mixed");
            let close = |a: f64, b: f64| (a - b).abs() < 1e-6 * b.abs();
            assert!(
                close(report.loss, recorded.loss),
                "{precision} step {step}: {} vs {}",
                report.loss,
                recorded.loss
            );
            assert!(close(report.grad_norm, recorded.grad_norm), "{precision} step {step}: grad norm");
        }
    }
}

#[test]
fn replay_reproduces_a_logged_step_per_micro_batch() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    // Two accumulation steps, checkpoints every 2 steps; step 5 is replayed from step 4's,
    // step 4 from step 2's (through step 3).
    let overrides = ["checkpoint_every=2", "accumulation_steps=2", "micro_batch_size=2"];
    run(corrupted(&data, &run_dir, &overrides, None)).unwrap();
    let records = train_records(&run_dir);
    for step in [4, 5] {
        let report = replay_run(&run_dir, step, None, &mut |_| {}).unwrap();
        let recorded = records.iter().find(|r| r.step == step).unwrap();
        assert_eq!(report.from_step, if step == 4 { 2 } else { 4 });
        assert!(report.checkpoint.is_some());
        assert!(
            (report.loss - recorded.loss).abs() < 1e-6 * recorded.loss,
            "step {step}: {} vs {}",
            report.loss,
            recorded.loss
        );
        assert!((report.grad_norm - recorded.grad_norm).abs() < 1e-5 * recorded.grad_norm, "step {step}");
        assert_eq!(report.micro_batches.len(), 2);
        // The global loss is the token-weighted mean of the micro-batches'.
        let tokens: usize = report.micro_batches.iter().map(|m| m.scored_tokens).sum();
        let mean: f64 =
            report.micro_batches.iter().map(|m| m.loss * m.scored_tokens as f64).sum::<f64>() / tokens as f64;
        assert!((mean - report.loss).abs() < 1e-5, "{mean} vs {}", report.loss);
        let m = &report.micro_batches[0];
        assert_eq!((m.source.rows.len(), m.previews.len()), (2, 2));
        assert!(m.previews[0].chars().count() <= 60 && !m.previews[0].is_empty());
    }
    // Before the first checkpoint: from the run's seeded start.
    let mut lines = Vec::new();
    let report = replay_run(&run_dir, 2, None, &mut |l| lines.push(l.to_string())).unwrap();
    assert_eq!((report.checkpoint.as_ref(), report.from_step), (None, 0));
    let recorded = records.iter().find(|r| r.step == 2).unwrap();
    assert!(
        (report.loss - recorded.loss).abs() < 1e-6 * recorded.loss,
        "{} vs {}",
        report.loss,
        recorded.loss
    );
    assert!(lines.iter().any(|l| l.contains("no checkpoint before step 2")), "{lines:?}");
    let err = replay_run(&run_dir, 99, None, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("--step 99: expected a step of the run, 1 to max_steps = 6"), "{err}");
}

/// The sentinel judged on the device (`sentinel.on_device = true`: what wgpu and CUDA runs do)
/// gives the host sentinel's run: the same events naming the same data, the same skipped
/// counts, the same losses, and AdamW step counts that leave out the skipped updates (the
/// weights one more step would give are the host run's) — with the verdicts read back only at
/// logged steps.
#[test]
fn judged_on_the_device_a_run_equals_the_host_judged_one() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    // A non-finite gradient at unlogged step 2, a skipped spike at unlogged step 7.
    for (corrupt, extra, skipped) in [
        (Some((2, 2, Corruption::NanGradients)), None, [(4, 1), (8, 1)]),
        (
            Some((7, 7, Corruption::LossTimes(50))),
            Some(["sentinel.spike_zscore=4", "sentinel.spike_window=3", "sentinel.spike_action=\"skip\""]),
            [(4, 0), (8, 1)],
        ),
    ] {
        let mut runs = Vec::new();
        for on_device in [false, true] {
            let run_dir = dir.path().join(format!("{corrupt:?}-{on_device}"));
            let mut overrides = vec!["max_steps=8", "log_every=4", "checkpoint_every=8"];
            let flag = format!("sentinel.on_device={on_device}");
            overrides.push(&flag);
            overrides.extend(extra.iter().flatten());
            run(corrupted(&data, &run_dir, &overrides, corrupt)).unwrap();
            runs.push(run_dir);
        }
        let (host, device) = (&runs[0], &runs[1]);
        let strip = |mut e: EventRecord| {
            e.elapsed_s = 0.0;
            e
        };
        let (host_events, device_events): (Vec<_>, Vec<_>) =
            (events(host).into_iter().map(strip).collect(), events(device).into_iter().map(strip).collect());
        assert_eq!(host_events.len(), 1, "{corrupt:?}: {host_events:?}");
        assert_eq!(device_events.len(), 1, "{corrupt:?}: {device_events:?}");
        let (h, d) = (&host_events[0], &device_events[0]);
        assert_eq!(
            (d.step, d.event, d.action, d.skipped_in_a_row),
            (h.step, h.event, h.action, h.skipped_in_a_row)
        );
        assert_eq!(d.sources, h.sources, "{corrupt:?}: the event names the step's data");
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
        assert!(close(d.loss.unwrap(), h.loss.unwrap()), "{d:?} vs {h:?}");
        let (hr, dr) = (train_records(host), train_records(device));
        assert_eq!(hr.iter().map(|r| (r.step, r.skipped_steps)).collect::<Vec<_>>(), skipped);
        assert_eq!(dr.iter().map(|r| (r.step, r.skipped_steps)).collect::<Vec<_>>(), skipped);
        for (h, d) in hr.iter().zip(&dr) {
            assert!(close(d.loss, h.loss), "{corrupt:?} step {}: loss {} vs {}", h.step, d.loss, h.loss);
        }
        // Same weights and AdamW state at step 8: one more step gives the same weights (a step
        // count off by one would move them by far more than this).
        let (hw, dw) = (next_weights(host, 8), next_weights(device, 8));
        let worst = hw.iter().zip(&dw).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{corrupt:?}: weights one step after step 8 differ by {worst}");
    }
}

/// Judged on the device, `max_skipped_steps` in a row stop the run at the next read (here the
/// logged step 6), naming the step the rule fired at; the checkpoint holds the last good state
/// (step 1's weights, moments and step count), and the run resumes.
#[test]
fn judged_on_the_device_skipped_steps_in_a_row_stop_at_the_next_read() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    let overrides = [
        "max_steps=8",
        "sentinel.max_skipped_steps=3",
        "sentinel.on_device=true",
        "log_every=6",
        "checkpoint_every=100",
    ];
    let corrupt = Some((2, 100, Corruption::NanLoss));
    let err = run(corrupted(&data, &run_dir, &overrides, corrupt)).unwrap_err();
    // The state after step 1, from the same run stopped there.
    let first = dir.path().join("first");
    run(corrupted(&data, &first, &["max_steps=1", "checkpoint_every=100"], None)).unwrap();
    match &err {
        TrainError::Unstable { step: 6, reason, .. } => {
            assert!(reason.contains("3 steps in a row") && reason.contains("at step 4"), "{reason}")
        }
        other => panic!("expected the sentinel to stop the run at step 6, got {other}"),
    }
    // (Two runs' checkpoint files differ in their parameter ids: compare the numbers.)
    assert!(next_weights(&run_dir, 6) == next_weights(&first, 1), "the last good state is step 1's");
    let actions: Vec<(u64, Anomaly, Action)> =
        events(&run_dir).iter().map(|e| (e.step, e.event, e.action)).collect();
    assert_eq!(
        actions,
        [
            (2, Anomaly::NonfiniteLoss, Action::Skipped),
            (3, Anomaly::NonfiniteLoss, Action::Skipped),
            (4, Anomaly::NonfiniteLoss, Action::Stopped),
            (5, Anomaly::NonfiniteLoss, Action::Skipped),
            (6, Anomaly::NonfiniteLoss, Action::Skipped),
        ]
    );
    let resumed = corrupted(&data, &run_dir, &["max_steps=8", "sentinel.on_device=true"], None).resuming();
    assert_eq!(run(resumed).unwrap().steps, 8);
}
