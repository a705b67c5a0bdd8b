//! Shared helpers of ember-train's behaviour tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use ember_data::{prepare, Batch, PrepareOptions, TokenizerKind, IGNORE_INDEX};
use ember_train::observe::metrics::{read_records, Record, TrainRecord};
use ember_train::tools::trained::{Source, Trained};
use ember_train::RunConfig;

/// The CPU training backend of the tests.
pub type B = Autodiff<Flex>;

/// Flex keeps one global RNG: tests that build models or train run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the global RNG for the duration of a test.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A batch of `rows` (inputs, targets) pairs of equal length.
pub fn batch(rows: &[(&[u32], &[i32])]) -> Batch {
    let seq_len = rows[0].0.len();
    Batch {
        batch_size: rows.len(),
        seq_len,
        inputs: rows.iter().flat_map(|r| r.0.iter().copied()).collect(),
        targets: rows.iter().flat_map(|r| r.1.iter().copied()).collect(),
        segments: None,
    }
}

/// `IGNORE_INDEX` for readability in target lists.
pub const X: i32 = IGNORE_INDEX;

/// Every gradient of `module` in `grads`, flattened, in visiting order.
pub fn flat_grads<M: AutodiffModule<B>>(module: &M, grads: &GradientsParams) -> Vec<Vec<f32>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Vec<f32>>);
    impl ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = self
                .0
                .get::<<B as AutodiffBackend>::InnerBackend, D>(param.id)
                .expect("every parameter has a gradient");
            self.1.push(grad.into_data().to_vec().unwrap());
        }
    }
    let mut collect = Collect(grads, Vec::new());
    module.visit(&mut collect);
    collect.1
}

/// Largest absolute difference between two gradient lists.
pub fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0.0, f32::max)
}

/// A small char-level corpus prepared into `dir/data`; returns the prepared directory.
pub fn prepared_corpus(dir: &Path) -> PathBuf {
    let text: String =
        (0..200).map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog.\n")).collect();
    let input = dir.join("corpus.txt");
    std::fs::write(&input, text).unwrap();
    let out = dir.join("data");
    let mut options = PrepareOptions::new(TokenizerKind::Char, vec![input], out.clone());
    options.progress = false;
    prepare(&options).unwrap();
    out
}

/// A tiny run configuration on `data` (2 layers, width 32, context 16).
pub fn tiny_config(data: &Path, overrides: &[&str]) -> RunConfig {
    let text = format!(
        "data = {:?}\nmax_steps = 6\nmicro_batch_size = 4\neval_every = 3\neval_batches = 2\n\
         checkpoint_every = 3\nlog_every = 1\n[model]\npreset = \"tiny\"\ndropout = 0.1\n\
         [optimizer]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 2\nlr_decay_steps = 6\n",
        data
    );
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    RunConfig::from_toml_str(&text, Path::new("tiny.toml"), &overrides).unwrap()
}

/// Every parameter of `model`, flattened in module order.
pub fn flat_params<Bk: Backend>(model: &ember_model::LanguageModel<Bk>) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<Bk: Backend> ModuleVisitor<Bk> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            self.0.extend(param.val().into_data().to_vec::<f32>().unwrap());
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// Every training record of the run in `run_dir`.
pub fn train_records(run_dir: &Path) -> Vec<TrainRecord> {
    read_records(&run_dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::Train(t) => Some(t),
            Record::Eval(_) | Record::Event(_) => None,
        })
        .collect()
}

/// The model of the latest checkpoint of the run in `run_dir`, on backend `Bk`.
pub fn latest_model<Bk: Backend>(run_dir: &Path) -> ember_model::LanguageModel<Bk> {
    Trained::open(Source::Run(run_dir.into())).unwrap().load_model(&Default::default()).unwrap()
}
