//! Ember's step under burn-train: [`EmberStrategy`] is a burn-train
//! [`SupervisedLearningStrategy`], so a Burn user's `SupervisedTraining` (metrics, renderer,
//! checkpointer, interrupter, early stopping) runs Ember's optimizer step — token-weighted
//! loss over all micro-batches, global-norm clipping, one learning-rate step per optimizer
//! step — instead of burn-train's own loop, which steps the learning rate per micro-batch,
//! averages per-batch means and drops a partial accumulation window (see `ember_train`'s
//! crate docs).
//!
//! The pieces: [`EmberLm`] (the model as a burn-train `TrainStep`/`InferenceStep`),
//! [`WindowBatcher`] (Ember's rows into host-side [`Batch`]es for Burn's `DataLoader`),
//! [`LmOutput`] (what each step reports) and two numeric metrics burn-train lacks,
//! [`TokensPerSecondMetric`] and [`GradNormMetric`]. Loss and learning rate use burn-train's
//! own `LossMetric` and `LearningRateMetric`. `examples/burn_train.rs` shows it end to end.
//!
//! Single device; data-parallel runs go through `ember train` ([`crate::parallel`]).

use std::sync::Arc;
use std::time::Instant;

use burn::backend::Flex;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::Progress;
use burn::module::{AutodiffModule, Module};
use burn::optim::lr_scheduler::LrScheduler;
use burn::optim::Optimizer;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, Transaction};
use burn_train::metric::{
    format_float, Adaptor, ItemLazy, LossInput, Metric, MetricAttributes, MetricMetadata, MetricName,
    Numeric, NumericAttributes, NumericEntry, SerializedEntry,
};
use burn_train::{
    EventProcessorTraining, InferenceStep, Interrupter, Learner, LearnerEvent, LearningComponentsMarker,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainOutput, TrainStep,
    TrainingComponents, TrainingItem, ValidLoader,
};
use ember_data::{Batch, Row};
use ember_model::LanguageModel;

use crate::optim::clip_grad_norm;
use crate::step::{accumulate, batch_nll, forward_backward};

/// An Ember [`LanguageModel`] as a burn-train model. Input: one micro-batch of token rows
/// ([`Batch`], `[batch_size, seq_len]`, host-side); output: [`LmOutput`].
///
/// Under [`EmberStrategy`] the gradient is taken over all micro-batches of an optimizer step
/// at once. Under burn-train's default strategies each `step` is one micro-batch's token-mean
/// loss and gradient (with its gradient norm), and burn-train's loop then advances the
/// learning rate per micro-batch and averages per-batch means: use [`EmberStrategy`] for
/// Ember's semantics.
#[derive(Module, Debug)]
pub struct EmberLm<B: Backend> {
    /// The wrapped model.
    pub model: LanguageModel<B>,
}

impl<B: Backend> EmberLm<B> {
    /// Wraps `model`.
    pub fn new(model: LanguageModel<B>) -> Self {
        Self { model }
    }

    fn device(&self) -> B::Device {
        self.devices().into_iter().next().unwrap_or_default()
    }
}

impl<B: AutodiffBackend> TrainStep for EmberLm<B> {
    type Input = Batch;
    type Output = LmOutput<B::InnerBackend>;

    /// Mean NLL over the batch's scored targets (nats/token), its gradient and the gradient's
    /// global norm. A batch with no scored target contributes a zero gradient and a loss of 0.
    fn step(&self, batch: Batch) -> TrainOutput<LmOutput<B::InnerBackend>> {
        let started = Instant::now();
        let device = self.device();
        let micro_batches = std::slice::from_ref(&batch);
        let (mut grads, loss, scored_tokens) = match forward_backward(&self.model, micro_batches, 0, &device)
        {
            Ok(normalized) => normalized,
            Err(_) => accumulate(&self.model, micro_batches, &device),
        };
        let norm = clip_grad_norm(self, &mut grads, 0.0);
        let item = LmOutput::new(loss, Some(norm), batch.inputs.len(), scored_tokens, started);
        TrainOutput { grads, item }
    }
}

impl<B: Backend> InferenceStep for EmberLm<B> {
    type Input = Batch;
    type Output = LmOutput<B>;

    /// Mean NLL over the batch's scored targets, nats/token (0 when none is scored).
    fn step(&self, batch: Batch) -> LmOutput<B> {
        let started = Instant::now();
        let scored_tokens = batch.scored_tokens();
        let nll = batch_nll(&self.model, &batch, &self.device());
        LmOutput::new(nll / scored_tokens.max(1) as f64, None, batch.inputs.len(), scored_tokens, started)
    }
}

/// Stacks Ember's rows (from [`ember_data::DataView`], which is a Burn `Dataset<Row>`) into a
/// host-side [`Batch`] for Burn's `DataLoaderBuilder`; tensors are made on the model's device
/// in the step.
///
/// # Panics
/// When rows differ in length or in having document segments: Burn's `Batcher` has no error
/// channel. Rows of one `DataView` always agree.
#[derive(Clone, Copy, Debug, Default)]
pub struct WindowBatcher;

impl<B: Backend> Batcher<B, Row, Batch> for WindowBatcher {
    fn batch(&self, rows: Vec<Row>, _device: &B::Device) -> Batch {
        Batch::from_rows(rows).unwrap_or_else(|e| panic!("WindowBatcher: {e}"))
    }
}

/// What one step reports to burn-train's metrics. Tensors stay on the device until burn-train
/// syncs the item ([`ItemLazy`]), off the training thread.
pub struct LmOutput<B: Backend> {
    /// Mean NLL over the step's scored targets, nats/token, `[1]`.
    pub loss: Tensor<B, 1>,
    /// Global L2 norm of the gradient before clipping, `[1]` (`None` in evaluation).
    pub grad_norm: Option<Tensor<B, 1>>,
    /// Input positions processed (every position of every row), tokens.
    pub tokens: usize,
    /// Scored target positions (the loss's denominator).
    pub scored_tokens: usize,
    /// When the step started fetching its data.
    pub started: Instant,
}

impl<B: Backend> LmOutput<B> {
    fn new(
        loss: Tensor<B, 1>,
        grad_norm: Option<Tensor<B, 1>>,
        tokens: usize,
        scored_tokens: usize,
        started: Instant,
    ) -> Self {
        Self { loss, grad_norm, tokens, scored_tokens, started }
    }
}

/// [`LmOutput`] read back to the host: what the metrics adapt.
#[derive(Clone, Debug, PartialEq)]
pub struct LmStats {
    /// Mean NLL, nats/token.
    pub loss: f64,
    /// Pre-clip global gradient norm (training only).
    pub grad_norm: Option<f64>,
    /// Input positions processed, tokens.
    pub tokens: usize,
    /// Scored target positions.
    pub scored_tokens: usize,
    /// Wall time from the start of the step to the sync, seconds.
    pub seconds: f64,
}

impl<B: Backend> ItemLazy for LmOutput<B> {
    type ItemSync = LmStats;

    /// One host read for both scalars (a device sync).
    fn sync(self) -> LmStats {
        let mut transaction = Transaction::default().register(self.loss);
        if let Some(norm) = self.grad_norm.clone() {
            transaction = transaction.register(norm);
        }
        let data = transaction.execute();
        let scalar = |i: usize| -> Option<f64> { data.get(i)?.iter::<f64>().next() };
        LmStats {
            loss: scalar(0).unwrap_or(f64::NAN),
            grad_norm: self.grad_norm.as_ref().and(scalar(1)),
            tokens: self.tokens,
            scored_tokens: self.scored_tokens,
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

/// For burn-train's `LossMetric::<Flex>` — `Flex` whatever the training backend, since the
/// synced stats live on the host: the loss repeated once per scored token, so the
/// metric's epoch value (a mean weighted by the input's length) is the token-weighted mean
/// over the epoch, Σ NLL ÷ Σ scored tokens, as Ember reports it.
impl Adaptor<LossInput<Flex>> for LmStats {
    fn adapt(&self) -> LossInput<Flex> {
        let weight = self.scored_tokens.max(1);
        LossInput::new(Tensor::full([weight], self.loss.elem::<f32>(), &Default::default()))
    }
}

/// Input of [`TokensPerSecondMetric`].
#[derive(Clone, Copy, Debug)]
pub struct TokensInput {
    /// Tokens processed by the step.
    pub tokens: usize,
    /// Its wall time, seconds.
    pub seconds: f64,
}

impl Adaptor<TokensInput> for LmStats {
    fn adapt(&self) -> TokensInput {
        TokensInput { tokens: self.tokens, seconds: self.seconds }
    }
}

/// Input of [`GradNormMetric`]: the pre-clip global gradient norm.
#[derive(Clone, Copy, Debug)]
pub struct GradNormInput(pub Option<f64>);

impl Adaptor<GradNormInput> for LmStats {
    fn adapt(&self) -> GradNormInput {
        GradNormInput(self.grad_norm)
    }
}

/// Throughput in tokens/s (input positions per second, as nanoGPT counts them). The step value
/// is the step's tokens ÷ its wall time, from fetching its data to reading its loss back; the
/// epoch value is Σ tokens ÷ Σ seconds.
#[derive(Clone, Default)]
pub struct TokensPerSecondMetric {
    current: f64,
    tokens: usize,
    seconds: f64,
}

impl TokensPerSecondMetric {
    /// No steps yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Metric for TokensPerSecondMetric {
    type Input = TokensInput;

    fn name(&self) -> MetricName {
        Arc::new("Tokens Per Second".to_string())
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes { unit: Some("tok/s".into()), higher_is_better: true }.into()
    }

    fn update(&mut self, input: &TokensInput, _: &MetricMetadata) -> SerializedEntry {
        self.current = rate(input.tokens, input.seconds);
        self.tokens += input.tokens;
        self.seconds += input.seconds;
        let epoch = rate(self.tokens, self.seconds);
        SerializedEntry::new(
            format!("epoch {} tok/s - batch {} tok/s", format_float(epoch, 0), format_float(self.current, 0)),
            NumericEntry::Aggregated { aggregated_value: self.current, count: 1 }.serialize(),
        )
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl Numeric for TokensPerSecondMetric {
    fn value(&self) -> NumericEntry {
        NumericEntry::Value(self.current)
    }

    fn running_value(&self) -> NumericEntry {
        NumericEntry::Value(rate(self.tokens, self.seconds))
    }
}

fn rate(tokens: usize, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// The pre-clip global L2 norm of the gradient (PyTorch `clip_grad_norm_`'s return value):
/// the step value, and its mean over the epoch's steps.
#[derive(Clone, Default)]
pub struct GradNormMetric {
    current: f64,
    sum: f64,
    steps: usize,
}

impl GradNormMetric {
    /// No steps yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Metric for GradNormMetric {
    type Input = GradNormInput;

    fn name(&self) -> MetricName {
        Arc::new("Grad Norm".to_string())
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes { unit: None, higher_is_better: false }.into()
    }

    fn update(&mut self, input: &GradNormInput, _: &MetricMetadata) -> SerializedEntry {
        if let Some(norm) = input.0 {
            self.current = norm;
            self.sum += norm;
            self.steps += 1;
        }
        let mean = self.sum / self.steps.max(1) as f64;
        SerializedEntry::new(
            format!("epoch {} - batch {}", format_float(mean, 3), format_float(self.current, 3)),
            NumericEntry::Aggregated { aggregated_value: self.current, count: 1 }.serialize(),
        )
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl Numeric for GradNormMetric {
    fn value(&self) -> NumericEntry {
        NumericEntry::Value(self.current)
    }

    fn running_value(&self) -> NumericEntry {
        NumericEntry::Value(self.sum / self.steps.max(1) as f64)
    }
}

/// burn-train's component types for an [`EmberLm`] with learning-rate scheduler `LR` (e.g.
/// [`crate::schedule::WarmupCosine`]) and optimizer `O` (e.g. [`crate::optim::AdamWGroups`]).
pub type EmberComponents<B, LR, O> = LearningComponentsMarker<B, LR, EmberLm<B>, O>;

/// Ember's optimizer step as a burn-train [`SupervisedLearningStrategy`]: pass it as
/// `TrainingStrategy::Custom(Arc::new(EmberStrategy::new(device)))`.
///
/// Each optimizer step takes `grads_accumulation` micro-batches (1 if unset or 0) from the train
/// loader and, as [`crate::step::train_step`] does:
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
            let model = learner.model();
            let (mut grads, loss, scored_tokens) =
                match forward_backward(&model.model, &micro_batches, step, &self.device) {
                    Ok(step) => step,
                    Err(e) => {
                        stop(interrupter, e.to_string());
                        break;
                    }
                };
            let grad_norm = clip_grad_norm(&model, &mut grads, self.grad_clip);
            learner.optimizer_step(grads);
            let item = LmOutput::new(loss, Some(grad_norm), tokens, scored_tokens, started);
            let item =
                TrainingItem::new(item, batches.progress(), global.clone(), Some(step as usize), Some(lr));
            processor.process_train(LearnerEvent::ProcessedItem(item));
            if interrupter.should_stop() {
                break;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata() -> MetricMetadata {
        let progress = Progress { items_processed: 1, items_total: 1 };
        MetricMetadata { progress: progress.clone(), global_progress: progress, iteration: Some(1), lr: None }
    }

    #[test]
    fn tokens_per_second_is_the_steps_rate_and_the_epochs_total_rate() {
        let mut metric = TokensPerSecondMetric::new();
        metric.update(&TokensInput { tokens: 1000, seconds: 0.5 }, &metadata());
        assert_eq!(metric.value().current(), 2000.0);
        metric.update(&TokensInput { tokens: 1000, seconds: 1.5 }, &metadata());
        assert_eq!(metric.value().current(), 1000.0 / 1.5);
        // Σ tokens ÷ Σ seconds = 2000 / 2, not the mean of the two rates (1333.3).
        assert_eq!(metric.running_value().current(), 1000.0);
        metric.clear();
        assert_eq!(metric.running_value().current(), 0.0);
    }

    #[test]
    fn grad_norm_is_the_steps_norm_and_the_epochs_mean_ignoring_evaluation() {
        let mut metric = GradNormMetric::new();
        metric.update(&GradNormInput(Some(2.0)), &metadata());
        metric.update(&GradNormInput(None), &metadata());
        metric.update(&GradNormInput(Some(1.0)), &metadata());
        assert_eq!(metric.value().current(), 1.0);
        assert_eq!(metric.running_value().current(), 1.5);
    }

    #[test]
    fn an_output_syncs_to_its_loss_norm_and_token_counts() {
        type B = burn::backend::Flex;
        let device = Default::default();
        let batch = Batch {
            batch_size: 2,
            seq_len: 3,
            inputs: vec![1, 2, 3, 4, 5, 6],
            targets: vec![2, 3, -100, 5, 6, 7],
            segments: None,
        };
        let output = LmOutput::<B>::new(
            Tensor::from_floats([2.5], &device),
            Some(Tensor::from_floats([0.75], &device)),
            batch.inputs.len(),
            batch.scored_tokens(),
            Instant::now(),
        );
        let stats = output.sync();
        assert_eq!((stats.loss, stats.grad_norm, stats.tokens, stats.scored_tokens), (2.5, Some(0.75), 6, 5));
        let tokens: TokensInput = stats.adapt();
        assert_eq!(tokens.tokens, 6);
    }
}
