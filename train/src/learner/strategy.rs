//! [`EmberStrategy`]: Ember's optimizer step as a burn-train `SupervisedLearningStrategy`.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

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
use ember_model::{ActivationCheckpointing, LanguageModel};

use super::model::{EmberLm, LmOutput};
use super::replicas::{join, serve, Peers, Replica, ReplicaSetup, ReplicaStats};
use crate::parallel::Group;
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
/// **Data parallelism.** With several devices ([`EmberStrategy::with_devices`], or
/// [`EmberStrategy::with_replicas`] for burn-flex replicas on the CPU), rank 0 is the learner
/// on the calling thread and ranks 1.. are copies of it (model, optimizer and scheduler), one
/// thread each. Each micro-batch the loader gives is split by rows across the replicas
/// ([`Batch::split_rows`]: contiguous, so the replicas' shares together are the
/// single-device global batch); every replica takes the step on its share, the gradients, Σ
/// NLL and scored-token counts are summed in one all-reduce per optimizer step (the exchange
/// `ember train` uses, [`crate::parallel::CollectivePeer`]), so the loss is normalized by the
/// global batch's scored tokens and the reduced gradient is clipped by its global norm on
/// every replica alike; each replica advances its own copy of the scheduler once per step and
/// applies the same update. The replicas' parameter hashes are compared in the exchange at
/// the first step and every [`EmberStrategy::with_check_every`] steps. Metrics, validation,
/// the checkpointer and early stopping see rank 0 (every replica holds the same model); a
/// resumed run starts every replica from the checkpoint. A replica that fails — its step
/// errors or panics, or the hashes differ — stops all of them, and the interrupter's message
/// names it.
///
/// A step with no scored target, or a train loader with no batch, stops
/// training through the interrupter (`Interrupter::get_message` says why; it is also logged
/// at error level) before anything is checkpointed.
#[derive(Clone, Debug)]
pub struct EmberStrategy<B: Backend> {
    /// One per replica; rank 0's (the learner's) first.
    devices: Vec<B::Device>,
    grad_clip: f64,
    checkpointing: ActivationCheckpointing,
    check_every: u64,
    timeout: Duration,
    /// Shared by the clones of this strategy, so a caller can read them after `launch`.
    stats: Arc<ReplicaStats>,
}

impl<B: Backend> EmberStrategy<B> {
    /// Trains on `device`, clipping the global gradient norm at 1.0 (nanoGPT's default).
    pub fn new(device: B::Device) -> Self {
        Self {
            devices: vec![device],
            grad_clip: 1.0,
            checkpointing: ActivationCheckpointing::None,
            check_every: 100,
            timeout: Duration::from_secs(300),
            stats: Arc::default(),
        }
    }

    /// Global-norm clip threshold; `0` turns clipping off (the norm is still reported).
    pub fn with_grad_clip(mut self, max_norm: f64) -> Self {
        self.grad_clip = max_norm;
        self
    }

    /// Activation checkpointing of the step ([`ember_model::checkpoint`]): `Blocks` keeps each
    /// block's input only and recomputes the block in the backward (default `None`).
    pub fn with_activation_checkpointing(mut self, mode: ActivationCheckpointing) -> Self {
        self.checkpointing = mode;
        self
    }

    /// One replica per device, rank 0 (the learner's) on the first (e.g. CUDA devices
    /// `[0, 1]`); an empty list keeps the current device.
    pub fn with_devices(mut self, devices: Vec<B::Device>) -> Self {
        if !devices.is_empty() {
            self.devices = devices;
        }
        self
    }

    /// `replicas` replicas on the first device (burn-flex on the CPU: one thread each); 0 is
    /// taken as 1.
    pub fn with_replicas(mut self, replicas: usize) -> Self {
        self.devices = vec![self.devices[0].clone(); replicas.max(1)];
        self
    }

    /// Compare the replicas' parameter hashes at the first step and every `steps` optimizer
    /// steps (default 100; each comparison reads every parameter once).
    pub fn with_check_every(mut self, steps: u64) -> Self {
        self.check_every = steps.max(1);
        self
    }

    /// How long a replica waits for the others in an exchange before failing (default 300 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Data-parallel replicas (1: a single device).
    pub fn replicas(&self) -> usize {
        self.devices.len()
    }

    /// All-reduces of the last `fit` (0 with one replica): one per optimizer step.
    pub fn exchanges(&self) -> usize {
        self.stats.exchanges.load(Ordering::Relaxed)
    }

    /// Optimizer steps of the last `fit` with several replicas.
    pub fn parallel_steps(&self) -> usize {
        self.stats.steps.load(Ordering::Relaxed)
    }

    /// Parameter-hash comparisons of the last `fit`, each one agreeing (a disagreement stops
    /// training).
    pub fn hash_checks(&self) -> usize {
        self.stats.hash_checks.load(Ordering::Relaxed)
    }

    /// Why the last `fit` stopped early, when this strategy stopped it (the interrupter's
    /// message; also logged at error level): e.g. `EmberStrategy stopped training: data
    /// parallel: replica 1 failed: …`.
    pub fn stop_reason(&self) -> Option<String> {
        self.stats.stop_reason.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops training through `interrupter` with `reason`, logs it and keeps it
    /// ([`EmberStrategy::stop_reason`]).
    fn stop(&self, interrupter: &Interrupter, reason: String) {
        let message = format!("EmberStrategy stopped training: {reason}");
        log::error!("{message}");
        interrupter.stop(Some(&message));
        *self.stats.stop_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
    }
}

impl<B, LR, O> SupervisedLearningStrategy<EmberComponents<B, LR, O>> for EmberStrategy<B>
where
    B: AutodiffBackend,
    LR: LrScheduler + Send + 'static,
    O: Optimizer<EmberLm<B>, B> + Send + 'static,
{
    fn fit(
        &self,
        components: TrainingComponents<EmberComponents<B, LR, O>>,
        learner: Learner<EmberComponents<B, LR, O>>,
        dataloader_train: TrainLoader<EmberComponents<B, LR, O>>,
        dataloader_valid: ValidLoader<EmberComponents<B, LR, O>>,
        starting_epoch: usize,
    ) -> (EmberLm<B>, SupervisedTrainingEventProcessor<EmberComponents<B, LR, O>>) {
        self.stats.reset();
        let world = self.devices.len();
        if world == 1 {
            return self.fit_on(
                components,
                learner,
                dataloader_train,
                dataloader_valid,
                starting_epoch,
                None,
            );
        }
        // Replicas 1.. on their own threads, each with a copy of the learner as it is now
        // (fresh, or restored from a checkpoint); rank 0 here.
        // Forget registrations a failed fit in this process may have left behind (burn-collective
        // keeps one registry per process).
        let _ = std::panic::catch_unwind(burn::collective::reset_collective::<B::InnerBackend>);
        std::thread::scope(|scope| {
            let group = Group::local(world);
            let mut replicas = Vec::with_capacity(world - 1);
            for rank in 1..world {
                let (jobs, job_receiver) = mpsc::channel();
                let (result_sender, results) = mpsc::channel();
                let setup = ReplicaSetup {
                    rank,
                    world,
                    device: self.devices[rank].clone(),
                    group: group.clone(),
                    timeout: self.timeout,
                    grad_clip: self.grad_clip,
                    checkpointing: self.checkpointing,
                };
                let copy = learner.clone();
                scope.spawn(move || serve(setup, copy, job_receiver, result_sender));
                replicas.push(Replica { jobs, results });
            }
            let peers = match join::<B>(0, world, &self.devices[0], group, self.timeout) {
                Ok(peer) => Some(Peers { peer, replicas, check_every: self.check_every, steps: 0 }),
                Err(e) => {
                    self.stop(&components.interrupter, e.to_string());
                    None
                }
            };
            self.fit_on(components, learner, dataloader_train, dataloader_valid, starting_epoch, peers)
        })
    }
}

impl<B: AutodiffBackend> EmberStrategy<B> {
    /// The epochs of [`SupervisedLearningStrategy::fit`], on one device (`peers` `None`) or as
    /// rank 0 of the replicas.
    fn fit_on<LR, O>(
        &self,
        components: TrainingComponents<EmberComponents<B, LR, O>>,
        mut learner: Learner<EmberComponents<B, LR, O>>,
        dataloader_train: TrainLoader<EmberComponents<B, LR, O>>,
        dataloader_valid: ValidLoader<EmberComponents<B, LR, O>>,
        starting_epoch: usize,
        mut peers: Option<Peers<B>>,
    ) -> (EmberLm<B>, SupervisedTrainingEventProcessor<EmberComponents<B, LR, O>>)
    where
        LR: LrScheduler + 'static,
        O: Optimizer<EmberLm<B>, B> + 'static,
    {
        let device = &self.devices[0];
        let train = dataloader_train.to_device(device);
        let valid = dataloader_valid.to_device(device);
        learner.fork(device);
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let mut early_stopping = components.early_stopping;
        let interrupter = components.interrupter;
        let accumulation = components.grad_accumulation.unwrap_or(1).max(1);
        if train.num_items() == 0 {
            self.stop(&interrupter, "the train loader has no batch".into());
        }
        for epoch in starting_epoch..=components.num_epochs {
            if interrupter.should_stop() {
                break;
            }
            let global = Progress { items_processed: epoch, items_total: components.num_epochs };
            let ranks = peers.as_mut();
            self.train_epoch(
                &mut learner,
                &train,
                accumulation,
                &global,
                &mut processor,
                &interrupter,
                ranks,
            );
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
        if let Some(peers) = peers {
            peers.finish();
        }
        (learner.model(), processor)
    }

    /// One epoch of optimizer steps of `accumulation` micro-batches each (split across the
    /// replicas of `peers`, when there are several).
    #[allow(clippy::too_many_arguments)]
    fn train_epoch<LR, O>(
        &self,
        learner: &mut Learner<EmberComponents<B, LR, O>>,
        train: &TrainLoader<EmberComponents<B, LR, O>>,
        accumulation: usize,
        global: &Progress,
        processor: &mut SupervisedTrainingEventProcessor<EmberComponents<B, LR, O>>,
        interrupter: &Interrupter,
        mut peers: Option<&mut Peers<B>>,
    ) where
        LR: LrScheduler + 'static,
        O: Optimizer<EmberLm<B>, B> + 'static,
    {
        let device = &self.devices[0];
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
            let settings = StepSettings {
                checkpointing: self.checkpointing,
                ..StepSettings::new(step, lr, self.grad_clip)
            };
            let mut target = LearnerTarget { model: Some(learner.model()), learner: &mut *learner };
            let out = match peers.as_deref_mut() {
                None => optimizer_step(&mut target, &micro_batches, settings, &mut Solo, None, device),
                Some(peers) => peers.step(&mut target, &micro_batches, settings, device, &self.stats),
            };
            let out = match out {
                Ok(out) => out,
                Err(e) => {
                    self.stop(interrupter, e.to_string());
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
pub(super) struct LearnerTarget<'a, B, LR, O>
where
    B: AutodiffBackend,
    LR: LrScheduler + 'static,
    O: Optimizer<EmberLm<B>, B> + 'static,
{
    /// The learner's model between updates; dropped while the optimizer updates it.
    pub(super) model: Option<EmberLm<B>>,
    pub(super) learner: &'a mut Learner<EmberComponents<B, LR, O>>,
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
