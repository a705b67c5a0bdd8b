//! Device memory stays flat over a long run on wgpu. Burn 0.21 leaks a CubeCL memory pool for
//! every fresh thread that touches a device (Burn issue 4792: burn-train's data loader spawns
//! worker threads each epoch). Ember's feed and prefetch threads hand the training thread host
//! tokens only, and evaluation runs on the training thread, so the device's memory — every
//! stream's pool together, whichever thread used it — is the same at the end of each epoch.
//!
//! Needs a build with `--features wgpu` and a Vulkan driver (in CI: Mesa's lavapipe); elsewhere
//! it prints `skipping: …` and passes, except under `CI=true`, where it fails. Its own test
//! binary: no other test uses the device meanwhile.

mod common;

use std::sync::{Arc, Mutex};

use burn::tensor::backend::AutodiffBackend;
use ember_data::{prepare, PrepareOptions, TokenizerKind};
use ember_train::observe::device::{device_memory_all_streams, DeviceMemory};
use ember_train::{run_on, BackendKind, BackendTask, RunConfig, RunOptions, TrainError};

fn wgpu_here(test: &str) -> bool {
    let missing = ember_train::observe::adapters::unavailable();
    match missing {
        None => true,
        Some(why) if std::env::var("CI").as_deref() == Ok("true") => panic!("{test}: CI=true and {why}"),
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// What the run's log said, and the device memory at the end of each epoch.
#[derive(Default)]
struct Seen {
    per_epoch: Option<u64>,
    at_epoch_end: Vec<(u64, DeviceMemory)>,
    evaluations: usize,
}

/// Trains `options` on the first wgpu adapter, reading every stream's pool from the training
/// thread whenever the log says an epoch's last step is done.
struct Watched {
    options: RunOptions,
    seen: Arc<Mutex<Seen>>,
    /// Afterwards, touch the device once from a fresh thread (the control: the reading must see
    /// that thread's pool).
    control: bool,
}

impl BackendTask for Watched {
    type Output = Option<(DeviceMemory, DeviceMemory)>;
    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<Self::Output, TrainError> {
        let device = devices[0].clone();
        let seen = self.seen.clone();
        let mut log = |line: &str| {
            let mut seen = seen.lock().unwrap();
            if let Some(rest) =
                line.split(" micro-batches per epoch").next().filter(|_| line.starts_with("train: "))
            {
                seen.per_epoch = rest.rsplit(' ').next().and_then(|n| n.parse().ok());
            }
            if line.starts_with("eval ") {
                seen.evaluations += 1;
            }
            let step = line
                .strip_prefix("step ")
                .and_then(|s| s.split('|').next())
                .and_then(|s| s.trim().parse::<u64>().ok());
            if let (Some(step), Some(k)) = (step, seen.per_epoch) {
                if step % k == 0 {
                    let memory =
                        device_memory_all_streams(&device).expect("a wgpu device reports its memory");
                    seen.at_epoch_end.push((step, memory));
                }
            }
        };
        ember_train::train::<B>(self.options, devices.clone(), &mut log)?;
        if !self.control {
            return Ok(None);
        }
        let before = device_memory_all_streams(&device).unwrap();
        let fresh = device.clone();
        std::thread::spawn(move || {
            burn::tensor::Tensor::<B, 2>::ones([256, 256], &fresh).into_data();
        })
        .join()
        .unwrap();
        Ok(Some((before, device_memory_all_streams(&device).unwrap())))
    }
    fn single_rank(&self) -> bool {
        true
    }
}

#[test]
fn device_memory_is_flat_over_three_epochs_with_evaluations_between() {
    if !wgpu_here("device_memory_is_flat_over_three_epochs_with_evaluations_between") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text: String =
        (0..60).map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog.\n")).collect();
    std::fs::write(dir.path().join("corpus.txt"), text).unwrap();
    let mut prep = PrepareOptions::new(
        TokenizerKind::Char,
        vec![dir.path().join("corpus.txt")],
        dir.path().join("data"),
    );
    prep.progress = false;
    prepare(&prep).unwrap();
    // At most 24 micro-batches of 8 per epoch (2,970 train tokens, windows of 16): 75 steps
    // cover three epochs; an evaluation every 10 steps falls inside each.
    let config = format!(
        "data = {:?}\nbackend = \"wgpu\"\nmax_steps = 75\nmicro_batch_size = 8\neval_every = 10\neval_batches = 2\n\
         checkpoint_every = 1000\nlog_every = 1\n[model]\npreset = \"tiny\"\n[optimizer]\nlr = 3e-3\nwarmup_steps = 2\n",
        dir.path().join("data")
    );
    let config = RunConfig::from_toml_str(&config, std::path::Path::new("wgpu.toml"), &[]).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let task = Watched {
        options: RunOptions::new(config, dir.path().join("run")),
        seen: seen.clone(),
        control: true,
    };
    let (before, after) = run_on(BackendKind::Wgpu, &[0], task).unwrap().unwrap();

    let seen = seen.lock().unwrap();
    let k = seen.per_epoch.expect("the run says its micro-batches per epoch");
    assert!(seen.at_epoch_end.len() >= 3, "{k} steps per epoch, 75 steps: {:?}", seen.at_epoch_end);
    assert!(seen.evaluations >= 7, "{} evaluations", seen.evaluations);
    let first = seen.at_epoch_end[0].1;
    eprintln!("device memory at the end of each epoch ({k} steps): {:?}", seen.at_epoch_end);
    assert!(first.in_use_bytes > 0 && first.reserved_bytes >= first.in_use_bytes, "{first:?}");
    for &(step, memory) in &seen.at_epoch_end[1..3] {
        assert_eq!(memory.in_use_bytes, first.in_use_bytes, "in use at step {step}, against step {k}");
        assert_eq!(memory.reserved_bytes, first.reserved_bytes, "reserved at step {step}, against step {k}");
    }
    // The control: one tensor made on a fresh thread shows up in the reading as a pool of its own.
    assert!(after.reserved_bytes > before.reserved_bytes, "before {before:?}, after {after:?}");
}
