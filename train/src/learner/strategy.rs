//! [`EmberStrategy`]: Ember's optimizer step as a burn-train `SupervisedLearningStrategy`.

use std::time::Instant;

use burn::data::dataloader::Progress;
use burn::module::AutodiffModule;
use burn::optim::lr_scheduler::LrScheduler;
use burn::optim::{GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_train::{
    EventProcessorTraining, InferenceStep, Interrupter, Learner, LearnerEvent, LearningComponentsMarker,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainingComponents,
    TrainingItem, ValidLoader,
};
use ember_data::Batch;
use ember_model::LanguageModel;

use super::model::{EmberLm, LmOutput};
use crate::step::{optimizer_step, Solo, StepSettings, StepTarget};

/// burn-train's component types for an [`EmberLm`] with learning-rate scheduler `LR` (e.g.
/// [`crate::step::schedule::WarmupCosine`]) and optimizer `O` (e.g. [`crate::step::optim::AdamWGroups`]).
pub type EmberComponents<B, LR, O> = LearningComponentsMarker<B, LR, EmberLm<B>, O>;

/// Ember's optimizer step as a burn-train [`SupervisedLearningStrategy`]: pass it as
/// `TrainingStrategy::Custom(Arc::new(EmberStrategy::new(device)))`.
///
/// Each optimizer step takes `grads_accumulation` micro-batches (1 if unset or 0) from the train
/// loader and, as [`crate::step::optimizer_step`] does (it is that step):
/// 1. advances the learning-rate scheduler once (burn-train's loop: once per micro-batch);
/// 2. takes the gradient of Σ NLL ÷ the scored tokens of all its micro-batches — the full
///    batch's token-mean loss (burn-train's loop: the sum of per-batch means);
/// 3. clips by the global gradient norm (PyTorch `clip_grad_norm_`; Burn clips per tensor);
/// 4. steps the optimizer and drops the gradients.
///
/// The epoch's last, partial accumulation window is a step over the micro-batches it has
/// (burn-train's loop drops it). Each step is reported as one [`LmOutput`] with the step's
/// learning rate; after each epoch, the validation loader is evaluated, then burn-train's
/// checkpointer and early stopping run, as in burn-train's single-device strategy.
///
/// A step with no scored target, or a train loader with no batch, stops
/// training through the interrupter (`Interrupter::get_message` says why; it is also logged
/// at error level) before anything is checkpointed.
#[derive(Clone, Debug)]
pub struct EmberStrategy<B: Backend> {
    device: B::Device,
    grad_clip: f64,
}

impl<B: Backend> EmberStrategy<B> {
    /// Trains on `device`, clipping the global gradient norm at 1.0 (nanoGPT's default).
    pub fn new(device: B::Device) -> Self {
        Self { device, grad_clip: 1.0 }
    }

    /// Global-norm clip threshold; `0` turns clipping off (the norm is still reported).
    pub fn with_grad_clip(mut self, max_norm: f64) -> Self {
        self.grad_clip = max_norm;
        self
    }
}

impl<B, LR, O> SupervisedLearningStrategy<EmberComponents<B, LR, O>> for EmberStrategy<B>
where
    B: AutodiffBackend,
    LR: LrScheduler + 'static,
    O: Optimizer<EmberLm<B>, B> + 'static,
{
    fn fit(
        &self,
        components: TrainingComponents<EmberComponents<B, LR, O>>,
        mut learner: Learner<EmberComponents<B, LR, O>>,
        dataloader_train: TrainLoader<EmberComponents<B, LR, O>>,
        dataloader_valid: ValidLoader<EmberComponents<B, LR, O>>,
        starting_epoch: usize,
    ) -> (EmberLm<B>, SupervisedTrainingEventProcessor<EmberComponents<B, LR, O>>) {
        let train = dataloader_train.to_device(&self.device);
        let valid = dataloader_valid.to_device(&self.device);
        learner.fork(&self.device);
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let mut early_stopping = components.early_stopping;
        let interrupter = components.interrupter;
        let accumulation = components.grad_accumulation.unwrap_or(1).max(1);
        if train.num_items() == 0 {
            stop(&interrupter, "the train loader has no batch".into());
        }
        for epoch in starting_epoch..=components.num_epochs {
            let global = Progress { items_processed: epoch, items_total: components.num_epochs };
            self.train_epoch(&mut learner, &train, accumulation, &global, &mut processor, &interrupter);
            processor.process_train(LearnerEvent::EndEpoch(epoch));
            if interrupter.should_stop() {
                break;
            }
            validate::<B, LR, O>(&learner.model().valid(), &valid, &global, &mut processor, &interrupter);
            processor.process_valid(LearnerEvent::EndEpoch(epoch));
            if let Some(checkpointer) = &mut checkpointer {
                checkpointer.checkpoint(&learner, epoch, &components.event_store);
            }
            if let Some(early_stopping) = &mut early_stopping {
                if early_stopping.should_stop(epoch, &components.event_store) {
                    break;
                }
            }
        }
        (learner.model(), processor)
    }
}

impl<B: AutodiffBackend> EmberStrategy<B> {
    /// One epoch of optimizer steps of `accumulation` micro-batches each.
    fn train_epoch<LR, O>(
        &self,
        learner: &mut Learner<EmberComponents<B, LR, O>>,
        train: &TrainLoader<EmberComponents<B, LR, O>>,
        accumulation: usize,
        global: &Progress,
        processor: &mut SupervisedTrainingEventProcessor<EmberComponents<B, LR, O>>,
        interrupter: &Interrupter,
    ) where
        LR: LrScheduler + 'static,
        O: Optimizer<EmberLm<B>, B> + 'static,
    {
        let mut batches = train.iter();
        for step in 1.. {
            let started = Instant::now();
            let micro_batches: Vec<Batch> = batches.by_ref().take(accumulation).collect();
            if micro_batches.is_empty() {
                break;
            }
            let tokens = micro_batches.iter().map(|b| b.inputs.len()).sum();
            learner.lr_step();
            let lr = learner.lr_current();
            let settings = StepSettings::new(step, lr, self.grad_clip);
            let mut target = LearnerTarget { model: Some(learner.model()), learner: &mut *learner };
            let out =
                match optimizer_step(&mut target, &micro_batches, settings, &mut Solo, None, &self.device) {
                    Ok(out) => out,
                    Err(e) => {
                        stop(interrupter, e.to_string());
                        break;
                    }
                };
            let item = LmOutput::new(out.loss, Some(out.grad_norm), tokens, out.scored_tokens, started);
            let item =
                TrainingItem::new(item, batches.progress(), global.clone(), Some(step as usize), Some(lr));
            processor.process_train(LearnerEvent::ProcessedItem(item));
            if interrupter.should_stop() {
                break;
            }
        }
    }
}

/// A burn-train `Learner` as the target of Ember's optimizer step: its model is
/// differentiated, its optimizer (at its scheduler's rate) applies the gradients.
struct LearnerTarget<'a, B, LR, O>
where
    B: AutodiffBackend,
    LR: LrScheduler + 'static,
    O: Optimizer<EmberLm<B>, B> + 'static,
{
    /// The learner's model between updates; dropped while the optimizer updates it.
    model: Option<EmberLm<B>>,
    learner: &'a mut Learner<EmberComponents<B, LR, O>>,
}

impl<B, LR, O> StepTarget<B> for LearnerTarget<'_, B, LR, O>
where
    B: AutodiffBackend,
    LR: LrScheduler + 'static,
    O: Optimizer<EmberLm<B>, B> + 'static,
{
    fn model(&self) -> &LanguageModel<B> {
        &self.model.as_ref().expect("the learner's model is held between updates").model
    }

    /// burn-train's `optimizer_step` applies the learner's current rate, which is `lr`.
    fn apply(&mut self, _lr: f64, grads: GradientsParams) {
        self.model = None;
        self.learner.optimizer_step(grads);
        self.model = Some(self.learner.model());
    }
}

/// Stops training through `interrupter` with `reason`, and logs it.
fn stop(interrupter: &Interrupter, reason: String) {
    let message = format!("EmberStrategy stopped training: {reason}");
    log::error!("{message}");
    interrupter.stop(Some(&message));
}

/// Evaluates every validation batch with the inference model and reports each one.
fn validate<B, LR, O>(
    model: &EmberLm<B::InnerBackend>,
    valid: &ValidLoader<EmberComponents<B, LR, O>>,
    global: &Progress,
    processor: &mut SupervisedTrainingEventProcessor<EmberComponents<B, LR, O>>,
    interrupter: &Interrupter,
) where
    B: AutodiffBackend,
    LR: LrScheduler + 'static,
    O: Optimizer<EmberLm<B>, B> + 'static,
{
    let mut batches = valid.iter();
    let mut iteration = 0;
    while let Some(batch) = batches.next() {
        iteration += 1;
        let item =
            TrainingItem::new(model.step(batch), batches.progress(), global.clone(), Some(iteration), None);
        processor.process_valid(LearnerEvent::ProcessedItem(item));
        if interrupter.should_stop() {
            break;
        }
    }
}
