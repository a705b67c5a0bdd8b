//! Ember's optimizer step under burn-train: Burn's `SupervisedTraining` (its metrics, its
//! renderer — the TUI in a terminal —, its checkpointer) runs `ember_train::learner::EmberStrategy`,
//! so the loss is token-weighted over all micro-batches, the gradient is clipped by its global
//! norm, AdamW skips biases and norms, and the learning rate advances once per optimizer step.
//!
//! ```sh
//! cargo run --release -p ember-train --example burn_train -- [path/to/corpus.txt] [--devices N]
//! ```
//!
//! Without a corpus it trains on a small generated text. `--devices N` trains N data-parallel
//! replicas (burn-flex on threads): each micro-batch is split by rows across them, with one
//! gradient exchange per optimizer step. Burn writes its metric logs and checkpoints under
//! `burn-train-run/` (`train/epoch-N/Loss.log`, …).

use std::path::Path;
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::transform::PartialDataset;
use burn::data::dataset::Dataset;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::Backend;
use burn_train::metric::{LearningRateMetric, LossMetric};
use burn_train::{Learner, LearningResult, SupervisedTraining, TrainingStrategy};
use ember_data::{DataView, Row, Split};
use ember_model::{ActivationCheckpointing, LanguageModel, ModelConfig};
use ember_train::config::OptimizerConfig;
use ember_train::learner::{EmberLm, EmberStrategy, GradNormMetric, TokensPerSecondMetric, WindowBatcher};
use ember_train::step::optim::AdamWGroups;
use ember_train::step::schedule::{LrSchedule, WarmupCosine};

mod sample_text;
use sample_text::{prepare_chars, sample_corpus};

type B = Autodiff<Flex>;

/// What a run is made of.
struct Setup {
    /// Rows per micro-batch.
    batch_size: usize,
    /// Micro-batches per optimizer step.
    accumulation: usize,
    epochs: usize,
    /// Shuffle the train rows with this seed (`None`: in order).
    shuffle: Option<u64>,
    /// Use only the first rows of the train split.
    train_rows: Option<usize>,
    /// Resume from burn-train's checkpoint of this epoch in the artifact directory.
    resume: Option<usize>,
    /// Data-parallel replicas (burn-flex, one thread each).
    devices: usize,
    /// Activation checkpointing per block.
    checkpointing: ActivationCheckpointing,
}

/// Prepares `corpus` (character-level) under `work` and returns the train and validation views
/// and the GPT of `preset` for them, initialized from seed 1337 with dropout off.
fn data_and_model(corpus: &Path, work: &Path, preset: &str) -> (DataView, DataView, LanguageModel<B>) {
    let data = prepare_chars(corpus, &work.join("data"));
    let mut config = ModelConfig::preset(preset).expect("a preset");
    config.set_vocab_size(data.meta.vocab_size);
    if let ModelConfig::Gpt2(gpt) = &mut config {
        gpt.dropout = 0.0;
    }
    let device = Default::default();
    B::seed(&device, 1337);
    let model = config.init(&device).expect("a valid model");
    let train = DataView::new(data.clone(), Split::Train, config.block_size(), false).expect("train windows");
    let valid = DataView::new(data, Split::Val, config.block_size(), false).expect("validation windows");
    (train, valid, model)
}

/// The optimizer settings and the schedule both runs use.
fn optimizer_and_schedule(steps: u64) -> (OptimizerConfig, LrSchedule) {
    let optimizer = OptimizerConfig { lr: 3e-3, min_lr: 3e-4, warmup_steps: 3, ..Default::default() };
    let schedule = LrSchedule::from_config(&optimizer, steps);
    (optimizer, schedule)
}

/// Trains `model` under burn-train's `SupervisedTraining` with Ember's strategy; Burn's logs and
/// checkpoints go to `artifacts`.
fn train_with_burn(
    model: LanguageModel<B>,
    train: impl Dataset<Row> + 'static,
    valid: DataView,
    setup: &Setup,
    artifacts: &Path,
) -> (LearningResult<EmberLm<Flex>>, EmberStrategy<B>) {
    let rows = setup.train_rows.unwrap_or(train.len());
    let train = PartialDataset::new(train, 0, rows);
    let micro_batches = train.len().div_ceil(setup.batch_size);
    let steps = (micro_batches.div_ceil(setup.accumulation) * setup.epochs) as u64;
    let mut train_loader = DataLoaderBuilder::new(WindowBatcher).batch_size(setup.batch_size);
    if let Some(seed) = setup.shuffle {
        train_loader = train_loader.shuffle(seed);
    }
    let train_loader = train_loader.build(train);
    let valid_loader = DataLoaderBuilder::new(WindowBatcher).batch_size(setup.batch_size).build(valid);

    let (optimizer, schedule) = optimizer_and_schedule(steps);
    let model = EmberLm::new(model);
    let learner =
        Learner::new(model.clone(), AdamWGroups::new(&optimizer, &model), WarmupCosine::new(schedule));
    let device = Default::default();
    let training = SupervisedTraining::new(artifacts, train_loader, valid_loader)
        .metric_train_numeric(LossMetric::<Flex>::new())
        .metric_valid_numeric(LossMetric::<Flex>::new())
        .metric_train_numeric(LearningRateMetric::new())
        .metric_train_numeric(TokensPerSecondMetric::new())
        .metric_train_numeric(GradNormMetric::new())
        // Full precision, so a resumed run continues exactly (CompactRecorder stores f16).
        .with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new())
        .grads_accumulation(setup.accumulation)
        .num_epochs(setup.epochs)
        .summary();
    let training = match setup.resume {
        Some(epoch) => training.checkpoint(epoch),
        None => training,
    };
    // Replicas compare their parameter hashes at every step here (the default: every 100).
    let strategy = EmberStrategy::<B>::new(device)
        .with_grad_clip(optimizer.grad_clip)
        .with_replicas(setup.devices)
        .with_activation_checkpointing(setup.checkpointing)
        .with_check_every(1);
    let result =
        training.with_training_strategy(TrainingStrategy::Custom(Arc::new(strategy.clone()))).launch(learner);
    (result, strategy)
}

/// The command line.
struct Args {
    corpus: Option<std::path::PathBuf>,
    devices: usize,
    preset: String,
    epochs: usize,
    rows: Option<usize>,
}

const USAGE: &str = "usage: burn_train [CORPUS] [--devices N] [--preset NAME] [--epochs N] [--rows N]\n  CORPUS   a UTF-8 text file (default: a small generated text)\n  --devices N  data-parallel replicas (burn-flex, one thread each; default 1)\n  --preset NAME  a GPT-2 preset (default tiny)\n  --epochs N   (default 2)\n  --rows N     use the first N train rows";

/// Parses `[CORPUS] [--devices N] [--preset NAME] [--epochs N] [--rows N]`.
fn parse_args() -> Result<Args, String> {
    let mut a = Args { corpus: None, devices: 1, preset: "tiny".into(), epochs: 2, rows: None };
    let mut args = std::env::args().skip(1);
    let count = |flag: &str, value: Option<String>| -> Result<usize, String> {
        let value = value.ok_or(format!("{flag}: expected a whole number ≥ 1; {USAGE}"))?;
        value
            .parse()
            .ok()
            .filter(|&n: &usize| n >= 1)
            .ok_or(format!("{flag} {value}: expected a whole number ≥ 1"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--devices" => a.devices = count("--devices", args.next())?,
            "--epochs" => a.epochs = count("--epochs", args.next())?,
            "--rows" => a.rows = Some(count("--rows", args.next())?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--preset" => {
                let name = args.next().ok_or(format!("--preset: expected a model preset; {USAGE}"))?;
                if ember_model::GptConfig::preset(&name).is_none() {
                    return Err(format!(
                        "--preset {name:?}: expected a GPT-2 preset, e.g. tiny or shakespeare-char"
                    ));
                }
                a.preset = name;
            }
            _ if a.corpus.is_none() && !arg.starts_with('-') => {
                if !Path::new(&arg).is_file() {
                    return Err(format!("{arg}: not a readable file; expected a UTF-8 text corpus"));
                }
                a.corpus = Some(arg.into());
            }
            _ => return Err(format!("unexpected argument {arg:?}; {USAGE}")),
        }
    }
    Ok(a)
}

fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2);
    });
    let devices = args.devices;
    let work = tempfile::tempdir().expect("a temporary directory");
    let corpus = args.corpus.unwrap_or_else(|| sample_corpus(work.path()));
    let (train, valid, model) = data_and_model(&corpus, work.path(), &args.preset);
    let setup = Setup {
        batch_size: 8,
        accumulation: 2,
        epochs: args.epochs,
        shuffle: Some(1337),
        train_rows: args.rows.map(|rows| rows.min(train.len())),
        resume: None,
        devices,
        checkpointing: ActivationCheckpointing::None,
    };
    let (_, strategy) = train_with_burn(model, train, valid, &setup, Path::new("burn-train-run"));
    if let Some(reason) = strategy.stop_reason() {
        eprintln!("error: {reason}");
        std::process::exit(1);
    }
    if devices > 1 {
        println!(
            "{devices} replicas: {} optimizer steps, {} exchanges, parameter hashes compared and equal at {} steps",
            strategy.parallel_steps(),
            strategy.exchanges(),
            strategy.hash_checks()
        );
    }
    println!("metrics: burn-train-run/train, burn-train-run/valid; checkpoints (one per completed epoch): burn-train-run/checkpoint");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample_text::sample_corpus;
    use burn::module::AutodiffModule;
    use ember_data::Batch;
    use ember_train::step::{batch_nll, train_step, StepSettings};
    use ember_train::step::{scalar, Solo};

    /// Burn's metric log `artifacts/train/epoch-N/NAME.log`: the first field of each line.
    fn logged(artifacts: &Path, epoch: usize, name: &str) -> Vec<f64> {
        let path = artifacts.join(format!("train/epoch-{epoch}/{name}.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.lines().map(|line| line.split(',').next().unwrap().parse().unwrap()).collect()
    }

    /// Validation loss of `model` on the first four validation rows, nats/token.
    fn valid_loss(model: &LanguageModel<Flex>, valid: &DataView) -> f64 {
        let batch = valid.batch(&[0, 1, 2, 3]).unwrap();
        scalar(batch_nll(model, &batch, &Default::default())) / batch.scored_tokens() as f64
    }

    /// burn-flex has one global RNG: tests that seed it and draw the model's weights run one at
    /// a time, so every test starts from the same weights whatever runs beside it.
    static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A prepared sample corpus (kept alive by the directory) with its views and model.
    fn fixture() -> (tempfile::TempDir, DataView, DataView, LanguageModel<B>) {
        let work = tempfile::tempdir().unwrap();
        let corpus = sample_corpus(work.path());
        let _init = INIT.lock().unwrap_or_else(|e| e.into_inner());
        let (train, valid, model) = data_and_model(&corpus, work.path(), "tiny");
        (work, train, valid, model)
    }

    /// Micro-batches of 4 in order, 2 per optimizer step, over the first `rows` train rows.
    fn in_order(rows: usize, epochs: usize) -> Setup {
        Setup {
            batch_size: 4,
            accumulation: 2,
            epochs,
            shuffle: None,
            train_rows: Some(rows),
            resume: None,
            devices: 1,
            checkpointing: ActivationCheckpointing::None,
        }
    }

    #[test]
    fn burn_train_with_ember_strategy_matches_ember_train_step_and_reports_burn_metrics() {
        let (work, train, valid, model) = fixture();
        // 7 micro-batches of 4 rows, 2 per step: steps of 2, 2, 2 and 1 micro-batches.
        let setup = in_order(28, 1);
        let artifacts = work.path().join("burn");
        let burn_model =
            train_with_burn(model.clone(), train.clone(), valid.clone(), &setup, &artifacts).0.model;

        // The same micro-batches, in order, through Ember's own step.
        let rows: Vec<_> = (0..28).map(|i| train.get(i).unwrap()).collect();
        let micro: Vec<Batch> = rows.chunks(4).map(|rows| Batch::from_rows(rows.to_vec()).unwrap()).collect();
        let (optimizer, schedule) = optimizer_and_schedule(4);
        let mut ember = model;
        let mut adamw = AdamWGroups::new(&optimizer, &ember);
        let device = Default::default();
        let mut losses = Vec::new();
        for (step, micro_batches) in micro.chunks(2).enumerate() {
            let step = step as u64 + 1;
            let settings = StepSettings::new(step, schedule.lr(step), 1.0);
            let (next, out) =
                train_step(ember, &mut adamw, micro_batches, settings, &mut Solo, None, &device).unwrap();
            ember = next;
            losses.push(scalar(out.loss));
        }

        // One learning rate per optimizer step (burn-train's own loop: one per micro-batch).
        let lrs = logged(&artifacts, 1, "Learning_Rate");
        assert_eq!(lrs.len(), 4, "{lrs:?}");
        for (step, lr) in lrs.iter().enumerate() {
            assert!((lr - schedule.lr(step as u64 + 1)).abs() < 1e-12, "{lrs:?}");
        }
        // burn-train's LossMetric shows Ember's token-weighted loss of each step.
        let burn_losses = logged(&artifacts, 1, "Loss");
        assert_eq!(burn_losses.len(), 4);
        for (burn, ember) in burn_losses.iter().zip(&losses) {
            assert!((burn - ember).abs() < 1e-5, "{burn_losses:?} vs {losses:?}");
        }
        assert!(losses[0] > 2.5, "{losses:?}");
        // Grad norm and tokens/s are reported every step.
        assert_eq!(logged(&artifacts, 1, "Grad_Norm").len(), 4);
        let speeds = logged(&artifacts, 1, "Tokens_Per_Second");
        assert!(speeds.iter().all(|&s| s > 0.0), "{speeds:?}");
        // The trained models agree: the same validation loss.
        let burn_loss = valid_loss(&burn_model.model, &valid);
        let ember_loss = valid_loss(&ember.valid(), &valid);
        assert!((burn_loss - ember_loss).abs() < 1e-5, "{burn_loss} vs {ember_loss}");
        // burn-train's checkpointer wrote the epoch's model, optimizer and scheduler.
        for part in ["model", "optim", "scheduler"] {
            assert!(artifacts.join(format!("checkpoint/{part}-1.mpk")).exists(), "{part}");
        }
    }

    #[test]
    fn a_run_resumed_from_a_burn_train_checkpoint_ends_where_the_uninterrupted_run_does() {
        let (work, train, valid, model) = fixture();
        let setup = in_order(24, 2);
        let (straight, _) =
            train_with_burn(model.clone(), train.clone(), valid.clone(), &setup, &work.path().join("a"));

        let interrupted = work.path().join("b");
        let first = Setup { epochs: 1, ..setup };
        train_with_burn(model.clone(), train.clone(), valid.clone(), &first, &interrupted);
        // A fresh process would build the model anew: the checkpoint restores weights, AdamW's
        // moments (both groups) and the schedule's step.
        let second = Setup { resume: Some(1), ..setup };
        let (resumed, _) = train_with_burn(model, train, valid.clone(), &second, &interrupted);

        // burn-train 0.21's file logger numbers a resumed run's epochs from 1 again, so the
        // resumed epoch 2 overwrote `train/epoch-1/`.
        let straight_epoch_2 = |name| logged(&work.path().join("a"), 2, name);
        assert_eq!(logged(&interrupted, 1, "Learning_Rate"), straight_epoch_2("Learning_Rate"));
        assert_eq!(logged(&interrupted, 1, "Loss"), straight_epoch_2("Loss"));
        let (a, b) = (valid_loss(&straight.model.model, &valid), valid_loss(&resumed.model.model, &valid));
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }

    #[test]
    fn an_empty_train_split_stops_before_validating_or_checkpointing() {
        let (work, train, valid, model) = fixture();
        let artifacts = work.path().join("empty");
        train_with_burn(model, train, valid, &in_order(0, 2), &artifacts);
        assert!(!artifacts.join("checkpoint/model-1.mpk").exists());
        assert!(!artifacts.join("valid/epoch-1/Loss.log").exists());
    }
    /// Runs with several replicas register with burn-collective's one registry per process:
    /// one at a time.
    static COLLECTIVE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_collective() -> std::sync::MutexGuard<'static, ()> {
        COLLECTIVE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every parameter of `model`, flattened in module order.
    fn params(model: &EmberLm<Flex>) -> Vec<f32> {
        use burn::module::{Module, ModuleVisitor, Param};
        use burn::tensor::Tensor;
        struct Collect(Vec<f32>);
        impl ModuleVisitor<Flex> for Collect {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
                self.0.extend(param.val().into_data().to_vec::<f32>().unwrap());
            }
        }
        let mut collect = Collect(Vec::new());
        model.visit(&mut collect);
        collect.0
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    /// The train rows with the target of every position whose input id is a multiple of 3
    /// ignored: the rows, and so the replicas' halves of a micro-batch, score unequal counts.
    fn unevenly_masked(train: &DataView, rows: usize) -> burn::data::dataset::InMemDataset<Row> {
        let rows = (0..rows)
            .map(|i| {
                let mut row = train.get(i).unwrap();
                for (input, target) in row.inputs.iter().zip(row.targets.iter_mut()) {
                    if input % 3 == 0 {
                        *target = ember_data::IGNORE_INDEX;
                    }
                }
                row
            })
            .collect();
        burn::data::dataset::InMemDataset::new(rows)
    }

    /// 2 replicas × 4 rows of each micro-batch give the losses, learning rates, gradient norms
    /// and final weights of 1 device with the 8 rows, with uneven masks, and exchange once per
    /// optimizer step with equal parameter hashes at every step.
    #[test]
    fn two_replicas_equal_one_device_with_the_whole_batch() {
        let _one = one_collective();
        let (work, train, valid, model) = fixture();
        let data = unevenly_masked(&train, 32);
        let first = data.get(0).unwrap();
        assert!(first.targets.contains(&ember_data::IGNORE_INDEX) && first.targets.iter().any(|&t| t >= 0));
        // 4 micro-batches of 8 rows per epoch, 2 per step: 2 steps per epoch, 2 epochs.
        let one = Setup {
            batch_size: 8,
            accumulation: 2,
            epochs: 2,
            shuffle: Some(7),
            train_rows: None,
            resume: None,
            devices: 1,
            checkpointing: ActivationCheckpointing::None,
        };
        let two = Setup { devices: 2, ..one };
        let (single, single_strategy) = train_with_burn(
            model.clone(),
            unevenly_masked(&train, 32),
            valid.clone(),
            &one,
            &work.path().join("one"),
        );
        let (parallel, strategy) = train_with_burn(model, data, valid, &two, &work.path().join("two"));
        assert_eq!(single_strategy.exchanges(), 0, "one device exchanges nothing");
        for epoch in [1, 2] {
            let (a, b) = (
                logged(&work.path().join("one"), epoch, "Loss"),
                logged(&work.path().join("two"), epoch, "Loss"),
            );
            assert_eq!(a.len(), 2);
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-5,
                    "epoch {epoch}: losses {a:?} (1 device) vs {b:?} (2 replicas)"
                );
            }
            for name in ["Learning_Rate", "Grad_Norm"] {
                let (a, b) = (
                    logged(&work.path().join("one"), epoch, name),
                    logged(&work.path().join("two"), epoch, name),
                );
                for (x, y) in a.iter().zip(&b) {
                    assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{name}: {a:?} vs {b:?}");
                }
            }
        }
        let diff = max_diff(&params(&single.model), &params(&parallel.model));
        assert!(diff <= 1e-5, "final weights differ by {diff}");
        assert_eq!((strategy.parallel_steps(), strategy.exchanges(), strategy.hash_checks()), (4, 4, 4));
    }

    /// Resuming burn-train's epoch-1 checkpoint with 2 replicas ends at the weights of the
    /// uninterrupted 2-replica run.
    #[test]
    fn two_replicas_resumed_from_an_epoch_checkpoint_end_at_the_uninterrupted_weights() {
        let _one = one_collective();
        let (work, train, valid, model) = fixture();
        let setup = Setup { devices: 2, ..in_order(24, 2) };
        let (straight, _) =
            train_with_burn(model.clone(), train.clone(), valid.clone(), &setup, &work.path().join("a"));
        let interrupted = work.path().join("b");
        train_with_burn(
            model.clone(),
            train.clone(),
            valid.clone(),
            &Setup { epochs: 1, ..setup },
            &interrupted,
        );
        let (resumed, strategy) =
            train_with_burn(model, train, valid, &Setup { resume: Some(1), ..setup }, &interrupted);
        assert_eq!(strategy.exchanges(), 3, "epoch 2 only: 6 micro-batches of 4, 2 per step");
        let diff = max_diff(&params(&straight.model), &params(&resumed.model));
        assert!(diff <= 1e-6, "resumed weights differ by {diff}");
    }

    /// A replica whose step panics (an out-of-vocabulary token in its rows) stops every
    /// replica before anything is checkpointed, and the message names it — replica 1, or
    /// rank 0 itself (which tells the others instead of leaving them waiting).
    #[test]
    fn a_failing_replica_stops_every_replica_and_is_named() {
        let _one = one_collective();
        let (work, train, valid, model) = fixture();
        for (rank, poisoned) in [(1, 4..8), (0, 0..4)] {
            let mut rows: Vec<Row> = (0..8).map(|i| train.get(i).unwrap()).collect();
            for row in &mut rows[poisoned] {
                row.inputs[0] = 1_000_000; // this rank's half of the micro-batch
            }
            let setup = Setup {
                batch_size: 8,
                accumulation: 1,
                epochs: 2,
                shuffle: None,
                train_rows: None,
                resume: None,
                devices: 2,
                checkpointing: ActivationCheckpointing::None,
            };
            let artifacts = work.path().join(format!("failing-{rank}"));
            let data = burn::data::dataset::InMemDataset::new(rows);
            let started = std::time::Instant::now();
            let (_, strategy) = train_with_burn(model.clone(), data, valid.clone(), &setup, &artifacts);
            assert!(started.elapsed().as_secs() < 60, "no replica waits for the exchange timeout");
            assert_eq!(strategy.parallel_steps(), 0);
            assert!(!artifacts.join("checkpoint/model-1.mpk").exists());
            // (burn-train logs to the first run's experiment.log of the process; the strategy
            // keeps the reason.)
            let reason = strategy.stop_reason().unwrap_or_default();
            let expected = format!("replica {rank} failed: its step panicked: index 1000000 out of bounds");
            assert!(reason.contains(&expected), "{reason}");
        }
    }

    #[test]
    fn a_micro_batch_smaller_than_the_replicas_goes_to_the_first() {
        let _one = one_collective();
        let (work, train, valid, model) = fixture();
        let one = in_order(25, 1);
        let (single, _) =
            train_with_burn(model.clone(), train.clone(), valid.clone(), &one, &work.path().join("one"));
        let two = Setup { devices: 2, ..one };
        let (parallel, strategy) = train_with_burn(model, train, valid, &two, &work.path().join("two"));
        assert_eq!(strategy.stop_reason(), None);
        assert_eq!(strategy.parallel_steps(), 4, "7 micro-batches, 2 per step");
        assert_same_epoch_1(&work.path().join("one"), &work.path().join("two"), 4, 1e-5);
        let diff = max_diff(&params(&single.model), &params(&parallel.model));
        assert!(diff <= 1e-5, "final weights differ by {diff}");
    }

    /// The two runs logged `steps` epoch-1 losses, equal within `tolerance`.
    fn assert_same_epoch_1(a: &Path, b: &Path, steps: usize, tolerance: f64) {
        let (la, lb) = (logged(a, 1, "Loss"), logged(b, 1, "Loss"));
        assert_eq!((la.len(), lb.len()), (steps, steps));
        for (x, y) in la.iter().zip(&lb) {
            assert!((x - y).abs() <= tolerance, "{la:?} vs {lb:?}");
        }
    }

    /// Per-block activation checkpointing under burn-train, on 2 replicas: the same losses
    /// and weights as keeping every activation.
    #[test]
    fn activation_checkpointing_under_burn_train_gives_the_same_run() {
        let _one = one_collective();
        let (work, train, valid, model) = fixture();
        let none = Setup { devices: 2, ..in_order(24, 1) };
        let blocks = Setup { checkpointing: ActivationCheckpointing::Blocks, ..none };
        let (a, _) =
            train_with_burn(model.clone(), train.clone(), valid.clone(), &none, &work.path().join("none"));
        let (b, _) = train_with_burn(model, train, valid, &blocks, &work.path().join("blocks"));
        assert_same_epoch_1(&work.path().join("none"), &work.path().join("blocks"), 3, 1e-6);
        // The per-block backward adds some gradient contributions in another order (the
        // gradients agree within 1e-6: model/tests/checkpoint.rs), and AdamW's division by √v
        // magnifies those last-bit differences on coordinates whose gradient is near 0: after
        // 3 steps at lr 3e-3 the weights differed by 8.4e-7 (exp and erf as product-then-sum)
        // and 1.05e-6 (with fused multiply-adds).
        let diff = max_diff(&params(&a.model), &params(&b.model));
        assert!(diff <= 2e-6, "weights differ by {diff}");
    }
}
