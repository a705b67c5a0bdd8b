//! The stability sentinel judged on the device, on wgpu (where it is the default): a step with
//! a non-finite gradient is skipped by the AdamW kernel's gate, without a host read of the
//! loss, and the run's events, skipped counts, losses and weights are those of the same run on
//! the CPU judged on the host.
//!
//! Needs a build with `--features wgpu` and a Vulkan driver (in CI: Mesa's lavapipe); elsewhere
//! it prints `skipping: …` and passes, except under `CI=true`, where it fails. Its own test
//! binary: no other test uses the device meanwhile.

mod common;

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use common::*;
use ember_train::observe::events::EventRecord;
use ember_train::observe::metrics::{read_records, Record};
use ember_train::parallel::{Corruption, Faults};
use ember_train::{run_on, BackendKind, BackendTask, RunConfig, RunOptions, TrainError};

fn wgpu_here(test: &str) -> bool {
    match ember_train::observe::adapters::unavailable() {
        None => true,
        Some(why) if std::env::var("CI").as_deref() == Ok("true") => panic!("{test}: CI=true and {why}"),
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// Trains the options on the backend `run_on` gives.
struct Train(RunOptions);

impl BackendTask for Train {
    type Output = ();
    fn run<Bk: AutodiffBackend>(self, devices: Vec<Bk::Device>) -> Result<(), TrainError> {
        ember_train::train::<Bk>(self.0, devices, &mut |_| {}).map(|_| ())
    }
    fn single_rank(&self) -> bool {
        true
    }
}

fn events(run_dir: &Path) -> Vec<EventRecord> {
    let records = read_records(&run_dir.join("metrics.jsonl")).unwrap();
    records.into_iter().filter_map(|r| if let Record::Event(e) = r { Some(e) } else { None }).collect()
}

#[test]
fn on_wgpu_the_device_sentinel_skips_as_the_cpu_host_sentinel_does() {
    if !wgpu_here("on_wgpu_the_device_sentinel_skips_as_the_cpu_host_sentinel_does") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let options = |backend: &str, run: &str| {
        let overrides = [
            &format!("backend=\"{backend}\"") as &str,
            "max_steps=8",
            "log_every=4",
            "checkpoint_every=100",
            "eval_every=0",
            "model.dropout=0.0",
        ];
        let config: RunConfig = tiny_config(&data, &overrides);
        let mut options = RunOptions::new(config, dir.path().join(run));
        options.faults = Faults { corrupt: Some((2, 2, Corruption::NanGradients)), ..Faults::default() };
        options
    };
    run_on(BackendKind::Wgpu, &[0], Train(options("wgpu", "wgpu"))).unwrap();
    ember_train::train::<B>(options("flex", "cpu"), Vec::new(), &mut |_| {}).unwrap();
    let (wgpu, cpu) = (dir.path().join("wgpu"), dir.path().join("cpu"));

    let key = |e: &EventRecord| (e.step, e.event, e.action, e.skipped_in_a_row, e.sources.clone());
    let (w, c): (Vec<_>, Vec<_>) =
        (events(&wgpu).iter().map(key).collect(), events(&cpu).iter().map(key).collect());
    assert_eq!(w.len(), 1, "one event: {w:?}");
    assert_eq!(w, c, "the same event, naming the same data");
    let (wr, cr) = (train_records(&wgpu), train_records(&cpu));
    let steps = |r: &[ember_train::observe::metrics::TrainRecord]| {
        r.iter().map(|r| (r.step, r.skipped_steps)).collect::<Vec<_>>()
    };
    assert_eq!(steps(&wr), [(4, 1), (8, 1)]);
    assert_eq!(steps(&wr), steps(&cr));
    for (w, c) in wr.iter().zip(&cr) {
        assert!(
            (w.loss - c.loss).abs() <= 1e-4 * c.loss,
            "step {}: wgpu {} vs cpu {}",
            w.step,
            w.loss,
            c.loss
        );
    }
    let (wp, cp) = (flat_params(&latest_model::<B>(&wgpu)), flat_params(&latest_model::<B>(&cpu)));
    let worst = wp.iter().zip(&cp).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-4, "weights after 8 steps differ by {worst}");
}
