//! The optimizer step exists once: `ember train`'s loop, `ember bench`'s step and the
//! burn-train strategy take the same steps on the same batches, with identical losses and
//! identical weights after them.
#![cfg(feature = "burn-train")]

mod common;

use std::path::Path;
use std::sync::Arc;

use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn_train::metric::LossMetric;
use burn_train::{Learner, SupervisedTraining, TrainingStrategy};
use common::*;
use ember_data::{Batch, PreparedData, Row, SamplerState};
use ember_model::LanguageModel;
use ember_train::learner::{EmberLm, EmberStrategy, WindowBatcher};
use ember_train::observe::metrics::{read_records, Record};
use ember_train::runner::feed::Feed;
use ember_train::step::optim::AdamWGroups;
use ember_train::step::scalar;
use ember_train::step::schedule::{LrSchedule, WarmupCosine};
use ember_train::tools::bench;
use ember_train::tools::trained::{Source, Trained};
use ember_train::{train, RunConfig, RunOptions};

const STEPS: usize = 4;

/// The rows of `batch`, in order.
fn rows(batch: &Batch) -> Vec<Row> {
    (0..batch.batch_size)
        .map(|r| {
            let span = r * batch.seq_len..(r + 1) * batch.seq_len;
            Row {
                inputs: batch.inputs[span.clone()].to_vec(),
                targets: batch.targets[span].to_vec(),
                segments: None,
            }
        })
        .collect()
}

/// Burn's `DataLoader` over `rows`, in order, `batch_size` rows a batch.
fn loader<Bk: Backend>(rows: Vec<Row>, batch_size: usize) -> Arc<dyn DataLoader<Bk, Batch>> {
    DataLoaderBuilder::new(WindowBatcher).batch_size(batch_size).build(InMemDataset::new(rows))
}

/// Burn's metric log `artifacts/train/epoch-1/Loss.log`: the first field of each line.
fn burn_losses(artifacts: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(artifacts.join("train/epoch-1/Loss.log")).unwrap();
    text.lines().map(|line| line.split(',').next().unwrap().parse().unwrap()).collect()
}

#[test]
fn the_run_loop_bench_and_the_burn_train_strategy_take_the_same_step() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    // A constant learning rate (min_lr = lr, no warmup), since `ember bench` steps at the peak
    // rate; no dropout, so no step draws random numbers.
    let overrides = [
        "max_steps=4",
        "accumulation_steps=2",
        "model.dropout=0.0",
        "eval_every=0",
        "log_every=1",
        "optimizer.warmup_steps=0",
        "optimizer.min_lr=3e-3",
    ];
    let run_dir = dir.path().join("run");
    train::<B>(RunOptions::new(tiny_config(&data, &overrides), &run_dir), Vec::new(), &mut |_| {}).unwrap();

    // 1. The run loop: its logged losses and the weights of its last checkpoint.
    // The losses are f32 on the device; metrics.jsonl holds them as f64 text, which serde_json
    // reads back to within an ulp of the f64, so they are compared in f32.
    let run_losses: Vec<f32> = read_records(&run_dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::Train(t) => Some(t.loss as f32),
            Record::Eval(_) | Record::Event(_) => None,
        })
        .collect();
    assert_eq!(run_losses.len(), STEPS);
    let trained = Trained::open(Source::Run(run_dir.clone())).unwrap();
    let run_params = flat_params(&trained.load_model::<burn::backend::Flex>(&Default::default()).unwrap());

    // The batches the loop drew: its data feed, from the start.
    let config = RunConfig::load(&run_dir.join("config.toml"), &[]).unwrap();
    let prepared = Arc::new(PreparedData::open(config.data.as_ref().unwrap()).unwrap());
    let mut feed = Feed::start(prepared, &config, SamplerState::default(), 0, 1).unwrap();
    let steps: Vec<Vec<Batch>> = (0..STEPS).map(|_| feed.next_step().unwrap().0.micro_batches).collect();
    let device = Default::default();
    B::seed(&device, config.seed);
    let initial: LanguageModel<B> = config.model.init(&device).unwrap();

    // 2. `ember bench`'s step on the same batches from the same initial weights.
    let mut model = initial.clone();
    let mut optimizer = AdamWGroups::new(&config.optimizer, &model);
    let mut bench_losses = Vec::new();
    for (i, micro_batches) in steps.iter().enumerate() {
        let (next, out) =
            bench::step(model, &mut optimizer, &config, i as u64 + 1, micro_batches, &device).unwrap();
        model = next;
        bench_losses.push(scalar(out.loss) as f32);
    }
    assert_eq!(bench_losses, run_losses, "bench's losses are the run loop's, bit for bit");
    assert!(flat_params(&model.valid()) == run_params, "bench ends at the run loop's weights, bit for bit");

    // 3. The burn-train strategy, its loader giving the same micro-batches in the same order.
    let all_rows: Vec<Row> = steps.iter().flatten().flat_map(rows).collect();
    let ember_lm = EmberLm::new(initial);
    let schedule = WarmupCosine::new(LrSchedule::from_config(&config.optimizer, config.max_steps));
    let learner = Learner::new(ember_lm.clone(), AdamWGroups::new(&config.optimizer, &ember_lm), schedule);
    let artifacts = dir.path().join("burn");
    let strategy = EmberStrategy::<B>::new(device).with_grad_clip(config.optimizer.grad_clip);
    let train_loader = loader::<B>(all_rows.clone(), config.micro_batch_size);
    let valid_loader = loader::<burn::backend::Flex>(all_rows[..4].to_vec(), config.micro_batch_size);
    let result = SupervisedTraining::new(&artifacts, train_loader, valid_loader)
        .metric_train_numeric(LossMetric::<burn::backend::Flex>::new())
        .grads_accumulation(config.accumulation_steps)
        .num_epochs(1)
        .with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy)))
        .launch(learner);
    assert!(
        flat_params(&result.model.model) == run_params,
        "burn-train ends at the run loop's weights, bit for bit"
    );
    let logged = burn_losses(&artifacts);
    assert_eq!(logged.len(), STEPS);
    for (burn, run) in logged.iter().zip(&run_losses) {
        // burn-train's log holds the loss as text.
        assert!(
            (burn - *run as f64).abs() <= 1e-6 * *run as f64,
            "burn-train {logged:?} vs the run loop {run_losses:?}"
        );
    }
}
