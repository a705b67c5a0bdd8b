//! The model side of the burn-train interop: [`EmberLm`] (a `TrainStep`/`InferenceStep`),
//! [`WindowBatcher`] (rows into host-side batches) and [`LmOutput`], what each step reports.

use std::time::Instant;

use burn::backend::Flex;
use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, Transaction};
use burn_train::metric::{Adaptor, ItemLazy, LossInput};
use burn_train::{InferenceStep, TrainOutput, TrainStep};
use ember_data::{Batch, Row};
use ember_model::LanguageModel;

use crate::step::optim::clip_grad_norm;
use crate::step::{accumulate, batch_nll, forward_backward};

/// An Ember [`LanguageModel`] as a burn-train model. Input: one micro-batch of token rows
/// ([`Batch`], `[batch_size, seq_len]`, host-side); output: [`LmOutput`].
///
/// Under [`EmberStrategy`](super::EmberStrategy) the gradient is taken over all micro-batches of an optimizer step
/// at once. Under burn-train's default strategies each `step` is one micro-batch's token-mean
/// loss and gradient (with its gradient norm), and burn-train's loop then advances the
/// learning rate per micro-batch and averages per-batch means: use [`EmberStrategy`](super::EmberStrategy) for
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
    pub(crate) fn new(
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
