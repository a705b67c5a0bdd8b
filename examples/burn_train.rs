//! Ember's optimizer step under burn-train: Burn's `SupervisedTraining` (its metrics, its
//! renderer — the TUI in a terminal —, its checkpointer) runs `ember_train::learner::EmberStrategy`,
//! so the loss is token-weighted over all micro-batches, the gradient is clipped by its global
//! norm, AdamW skips biases and norms, and the learning rate advances once per optimizer step.
//!
//! ```sh
//! cargo run --release -p ember-train --example burn_train -- path/to/corpus.txt
//! ```
//!
//! Without an argument it trains on a small generated text. Burn writes its metric logs and
//! checkpoints under `burn-train-run/` (`train/epoch-N/Loss.log`, …).

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
use ember_data::{DataView, Split};
use ember_model::{LanguageModel, ModelConfig};
use ember_train::config::OptimizerConfig;
use ember_train::learner::{EmberLm, EmberStrategy, GradNormMetric, TokensPerSecondMetric, WindowBatcher};
use ember_train::step::optim::AdamWGroups;
use ember_train::step::schedule::{LrSchedule, WarmupCosine};

mod sample_text;
use sample_text::{corpus_from_args, prepare_chars};

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
}

/// Prepares `corpus` (character-level) under `work` and returns the train and validation views
/// and a tiny GPT for them, initialized from seed 1337 with dropout off.
fn data_and_model(corpus: &Path, work: &Path) -> (DataView, DataView, LanguageModel<B>) {
    let data = prepare_chars(corpus, &work.join("data"));
    let mut config = ModelConfig::preset("tiny").expect("a preset");
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
    train: DataView,
    valid: DataView,
    setup: &Setup,
    artifacts: &Path,
) -> LearningResult<EmberLm<Flex>> {
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
    training
        .with_training_strategy(TrainingStrategy::Custom(Arc::new(
            EmberStrategy::<B>::new(device).with_grad_clip(optimizer.grad_clip),
        )))
        .launch(learner)
}

fn main() {
    let work = tempfile::tempdir().expect("a temporary directory");
    let corpus = corpus_from_args(work.path());
    let (train, valid, model) = data_and_model(&corpus, work.path());
    let setup = Setup {
        batch_size: 8,
        accumulation: 2,
        epochs: 2,
        shuffle: Some(1337),
        train_rows: None,
        resume: None,
    };
    train_with_burn(model, train, valid, &setup, Path::new("burn-train-run"));
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

    /// A prepared sample corpus (kept alive by the directory) with its views and model.
    fn fixture() -> (tempfile::TempDir, DataView, DataView, LanguageModel<B>) {
        let work = tempfile::tempdir().unwrap();
        let corpus = sample_corpus(work.path());
        let (train, valid, model) = data_and_model(&corpus, work.path());
        (work, train, valid, model)
    }

    /// Micro-batches of 4 in order, 2 per optimizer step, over the first `rows` train rows.
    fn in_order(rows: usize, epochs: usize) -> Setup {
        Setup { batch_size: 4, accumulation: 2, epochs, shuffle: None, train_rows: Some(rows), resume: None }
    }

    #[test]
    fn burn_train_with_ember_strategy_matches_ember_train_step_and_reports_burn_metrics() {
        let (work, train, valid, model) = fixture();
        // 7 micro-batches of 4 rows, 2 per step: steps of 2, 2, 2 and 1 micro-batches.
        let setup = in_order(28, 1);
        let artifacts = work.path().join("burn");
        let burn_model =
            train_with_burn(model.clone(), train.clone(), valid.clone(), &setup, &artifacts).model;

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
        let straight =
            train_with_burn(model.clone(), train.clone(), valid.clone(), &setup, &work.path().join("a"));

        let interrupted = work.path().join("b");
        let first = Setup { epochs: 1, ..setup };
        train_with_burn(model.clone(), train.clone(), valid.clone(), &first, &interrupted);
        // A fresh process would build the model anew: the checkpoint restores weights, AdamW's
        // moments (both groups) and the schedule's step.
        let second = Setup { resume: Some(1), ..setup };
        let resumed = train_with_burn(model, train, valid.clone(), &second, &interrupted);

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
}
