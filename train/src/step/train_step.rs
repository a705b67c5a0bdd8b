//! The optimizer step: the six steps of the training iteration in order, written once and run
//! by `ember train`'s loop, `ember bench`, `ember verify` and the burn-train strategy alike.

use std::time::{Duration, Instant};

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use ember_data::Batch;
use ember_model::dropout::stage_seed;
use ember_model::{
    autocast, backward_checkpointed, with_dropout_seed, ActivationCheckpointing, LanguageModel, Packing,
    Precision,
};

use super::adamw::with_update_gate;
use super::batch::to_tensors;
use super::device_sentinel::DeviceSentinel;
use super::loss::nll_sum;
use super::optim::{clip_grad_norm, scale_grads, AdamWGroups};
use super::sentinel::{Judgement, Sentinel};
use super::shard::gather_params;
use super::sync::{Contribution, GradSync};
use crate::error::TrainError;
use crate::observe::device::{device_memory, DeviceMemory};

/// What one optimizer step measured. Tensors stay on the device: reading them is a host sync,
/// done only at logging steps.
pub struct StepOutput<B: Backend> {
    /// Mean NLL of the global batch, nats/token: Σ NLL ÷ scored tokens of all micro-batches of
    /// all ranks.
    pub loss: Tensor<B, 1>,
    /// Global L2 norm of the (reduced) gradient before clipping.
    pub grad_norm: Tensor<B, 1>,
    /// Scored target positions in the global batch.
    pub scored_tokens: usize,
    /// Some rank asked to stop after this step (Ctrl-C, `q`): every rank stops.
    pub stop: bool,
    /// Some rank asked for a checkpoint after this step ([`StepSettings::checkpoint`]).
    pub checkpoint: bool,
    /// The parameter hashes compared in this step's exchange: `Some(true)` when every rank
    /// had the same parameters after the previous step.
    pub replicas_agree: Option<bool>,
    /// Time in the gradient exchange (including waiting for slower ranks) and, with ZeRO-1,
    /// in gathering the updated parameters.
    pub sync_time: Duration,
    /// Forward and backward passes (with a device sync when `timed`).
    pub forward_backward_time: Duration,
    /// When `timed`: the forward passes (model and loss) of the micro-batches, each ended by a
    /// device sync; zero otherwise.
    pub forward_time: Duration,
    /// When `timed`: the backward passes and the gradient accumulation, each ended by a device
    /// sync; zero otherwise. `forward_time + backward_time ≈ forward_backward_time`.
    pub backward_time: Duration,
    /// Clipping and the AdamW update (with a device sync when `timed`).
    pub optimizer_time: Duration,
    /// On CUDA and wgpu, when `timed`: the most bytes in use and reserved of the device pool's
    /// readings after each forward pass (every activation alive: the step's high point in
    /// practice, except under activation checkpointing, see `Stopwatch`) and after the backward
    /// passes (the gradients alive); `None` otherwise.
    pub device_memory: Option<DeviceMemory>,
    /// The sentinel's verdict, when the step had one (with the loss and gradient norm read
    /// back to the host).
    pub judgement: Option<Judgement>,
    /// The step's scaled gradient was not finite and the step was skipped
    /// ([`StepSettings::loss_scale`] ≠ 1 only).
    pub overflow: bool,
}

/// Per-step inputs besides the data.
#[derive(Clone, Copy, Debug)]
pub struct StepSettings {
    /// Optimizer step, from 1.
    pub step: u64,
    /// Learning rate of this step.
    pub lr: f64,
    /// Global-norm clip (0 = off).
    pub grad_clip: f64,
    /// This rank asks every rank to stop after this step.
    pub stop: bool,
    /// This rank asks for a checkpoint after this step (the dashboard's `c`): every rank
    /// learns of it in the exchange ([`StepOutput::checkpoint`]).
    pub checkpoint: bool,
    /// This rank's parameter hash (after the previous step), to compare across ranks.
    pub param_hash: Option<u64>,
    /// Wait for the device at the end of each phase, so their times are exact (costs a
    /// host sync: logging steps only).
    pub timed: bool,
    /// The forward passes' floating-point mode (the matmuls' dtype; weights, gradients and the
    /// optimizer stay f32): `[run] precision`.
    pub precision: Precision,
    /// The loss scale ([`super::LossScaler`], fp16-mixed; 1 otherwise): the backward pass runs
    /// on the mean loss per input position of the global batch times this (Σ NLL × scale ÷
    /// positions, the same factor on every rank: the scale means what it means for PyTorch's
    /// mean loss), and the gradients are divided by it again before clipping. When it is not 1,
    /// a step whose gradient is not finite is skipped (an overflow, not judged by the sentinel).
    pub loss_scale: f64,
    /// What the forward keeps for the backward: everything, or each block's input only
    /// (recomputing each block in the backward): `[run] activation_checkpointing`.
    pub checkpointing: ActivationCheckpointing,
    /// The seed of this step's dropout masks: micro-batch `i` of the global batch (rank `r`'s
    /// micro-batch `j` is `i = r · micro-batches per rank + j`) draws them from
    /// `stage_seed(dropout_seed, i)`, each stage of the model from a seed of its own
    /// ([`ember_model::dropout`]) — the same with and without checkpointing and whatever other
    /// threads draw.
    pub dropout_seed: u64,
}

impl StepSettings {
    /// Step `step` at learning rate `lr`, clipping at `grad_clip`: nothing to stop, no
    /// parameter hash to compare, phases untimed, f32 (a single worker's usual step).
    pub fn new(step: u64, lr: f64, grad_clip: f64) -> Self {
        Self {
            step,
            lr,
            grad_clip,
            stop: false,
            checkpoint: false,
            param_hash: None,
            timed: false,
            precision: Precision::Fp32,
            loss_scale: 1.0,
            checkpointing: ActivationCheckpointing::None,
            dropout_seed: step,
        }
    }
}

/// How one rank runs the forward and backward passes of its micro-batches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Passes {
    /// The matmuls' floating-point mode ([`StepSettings::precision`]).
    pub precision: Precision,
    /// Whole graph or per-block recompute ([`StepSettings::checkpointing`]).
    pub checkpointing: ActivationCheckpointing,
    /// The backward runs on Σ NLL × this ([`loss_multiplier`]).
    pub multiplier: f64,
    /// The step's dropout seed ([`StepSettings::dropout_seed`]).
    pub dropout_seed: u64,
    /// The index of this rank's first micro-batch in the global batch (rank × micro-batches
    /// per rank).
    pub first_micro_batch: usize,
}

impl Passes {
    /// f32, the whole graph, the plain Σ NLL, dropout seed 0.
    pub fn fp32() -> Self {
        Self {
            precision: Precision::Fp32,
            checkpointing: ActivationCheckpointing::None,
            multiplier: 1.0,
            dropout_seed: 0,
            first_micro_batch: 0,
        }
    }

    /// The passes of `settings`'s step on rank `rank` of `world_size`, whose micro-batches are
    /// `micro_batches` (every rank has as many).
    pub fn of_step(settings: &StepSettings, micro_batches: &[Batch], rank: usize, world_size: usize) -> Self {
        Self {
            precision: settings.precision,
            checkpointing: settings.checkpointing,
            multiplier: loss_multiplier(settings.loss_scale, micro_batches, world_size),
            dropout_seed: settings.dropout_seed,
            first_micro_batch: rank * micro_batches.len(),
        }
    }
}

/// What an optimizer step updates: the model it differentiates, and whatever applies the
/// gradients to it — Ember's [`AdamWGroups`] ([`Trainee`]), or a burn-train `Learner`'s
/// optimizer (`crate::learner`).
pub trait StepTarget<B: AutodiffBackend> {
    /// The model of the forward and backward passes.
    fn model(&self) -> &LanguageModel<B>;
    /// Applies the (clipped) gradient at learning rate `lr`, consuming it.
    fn apply(&mut self, lr: f64, grads: GradientsParams);
    /// After [`Self::apply`] (or a skipped update), makes the model whole on every rank when
    /// each rank updated only its own shard (ZeRO-1, [`super::shard`]); nothing otherwise.
    ///
    /// Errors: the exchange's (a rank failed, a timeout).
    fn gather(&mut self, _sync: &mut dyn GradSync<B>) -> Result<(), TrainError> {
        Ok(())
    }
}

/// A model with Ember's AdamW: the usual [`StepTarget`].
pub struct Trainee<'a, B: AutodiffBackend> {
    /// Always `Some` between steps; taken while the optimizer updates it, so the update owns
    /// the only reference to each parameter and can write it in place.
    model: Option<LanguageModel<B>>,
    optimizer: &'a mut AdamWGroups<LanguageModel<B>, B>,
}

impl<'a, B: AutodiffBackend> Trainee<'a, B> {
    /// `model`, to be updated by `optimizer`.
    pub fn new(model: LanguageModel<B>, optimizer: &'a mut AdamWGroups<LanguageModel<B>, B>) -> Self {
        Self { model: Some(model), optimizer }
    }

    /// The model, updated by the steps taken.
    pub fn into_model(self) -> LanguageModel<B> {
        self.model.expect("a trainee always holds its model between steps")
    }
}

impl<B: AutodiffBackend> StepTarget<B> for Trainee<'_, B> {
    fn model(&self) -> &LanguageModel<B> {
        self.model.as_ref().expect("a trainee always holds its model between steps")
    }

    fn apply(&mut self, lr: f64, grads: GradientsParams) {
        let model = self.model.take().expect("a trainee always holds its model between steps");
        self.model = Some(self.optimizer.step(lr, model, grads));
    }

    fn gather(&mut self, sync: &mut dyn GradSync<B>) -> Result<(), TrainError> {
        let Some(shard) = self.optimizer.shard() else { return Ok(()) };
        let model = self.model.take().expect("a trainee always holds its model between steps");
        self.model = Some(gather_params(model, shard, sync)?);
        Ok(())
    }
}

/// One optimizer step over this rank's `micro_batches` (one per accumulation step), updating
/// `target`. The one implementation of the step; [`train_step`] is it for a model and
/// [`AdamWGroups`].
///
/// Seed the backend before calling (dropout draws from it) to make the step reproducible.
///
/// With a `sentinel`, the step's loss and gradient norm are read back (one host read of two
/// numbers) and judged before the update: a skipped step leaves the weights and the
/// optimizer's moments exactly as they were ([`StepOutput::judgement`] says so).
///
/// Errors: as [`global_gradients`].
pub fn optimizer_step<B: AutodiffBackend>(
    target: &mut impl StepTarget<B>,
    micro_batches: &[Batch],
    settings: StepSettings,
    sync: &mut dyn GradSync<B>,
    sentinel: Option<&mut Sentinel>,
    device: &B::Device,
) -> Result<StepOutput<B::InnerBackend>, TrainError> {
    let judge = match sentinel {
        Some(sentinel) => Judge::Host(sentinel),
        None => Judge::Off,
    };
    step_judged(target, micro_batches, settings, sync, judge, device)
}

/// Who judges a step before its update.
enum Judge<'a, B: Backend> {
    /// Nobody: every update is made.
    Off,
    /// The host sentinel, from the loss and gradient norm read back.
    Host(&'a mut Sentinel),
    /// The device sentinel, which gates the update without a host read.
    Device(&'a mut DeviceSentinel<B>),
}

/// [`optimizer_step`] with any [`Judge`].
fn step_judged<B: AutodiffBackend>(
    target: &mut impl StepTarget<B>,
    micro_batches: &[Batch],
    settings: StepSettings,
    sync: &mut dyn GradSync<B>,
    judge: Judge<'_, B::InnerBackend>,
    device: &B::Device,
) -> Result<StepOutput<B::InnerBackend>, TrainError> {
    // 1. Data: the caller drew this step's micro-batches from this rank's shard.
    // 2–4. Forward, loss, backward over the micro-batches; nothing is communicated.
    // 5. Gradient sync, once per optimizer step, and normalization by the global token count.
    let global = global_gradients(target.model(), micro_batches, &settings, sync, device)?;
    let mut grads = global.grads;
    // 6. Optimizer: clip by the global norm of the reduced gradient (the same on every rank),
    //    AdamW (decay on 2-D weights only) at this step's learning rate; the gradients are
    //    consumed, so nothing carries into the next step.
    let started = Instant::now();
    let grad_norm = clip_grad_norm(target.model(), &mut grads, settings.grad_clip);
    let scaled = settings.loss_scale != 1.0;
    let (sentinel, gate) = match judge {
        Judge::Off => (None, None),
        Judge::Host(sentinel) => (Some(sentinel), None),
        Judge::Device(sentinel) => {
            assert!(!scaled, "the device sentinel does not judge loss-scaled steps (their overflow is read)");
            (None, Some(sentinel.judge(settings.step, global.loss.clone(), grad_norm.clone())))
        }
    };
    let read = (scaled || sentinel.is_some()).then(|| read_pair(&global.loss, &grad_norm));
    // A scaled step whose gradient overflowed is skipped without judging it: the scaler
    // halves the scale and the step is tried at the next one (PyTorch's GradScaler).
    let overflow = scaled && read.is_some_and(|[_, norm]| !norm.is_finite());
    let judgement = sentinel.map(|sentinel| {
        let [loss, norm] = read.expect("read when there is a sentinel");
        if overflow {
            Judgement { loss, grad_norm: norm, zscore: None, anomaly: None, skipped: true }
        } else {
            sentinel.judge(loss, norm)
        }
    });
    let judgement_skips = judgement.as_ref().is_some_and(|j| j.skipped);
    // Replicas that differed stop the run (the caller reports it): every rank saw the same
    // verdict in the exchange, so none updates or gathers.
    let replicas_differ = global.replicas_agree == Some(false);
    if !overflow && !judgement_skips && !replicas_differ {
        match gate {
            Some(gate) => with_update_gate(gate, || target.apply(settings.lr, grads)),
            None => target.apply(settings.lr, grads),
        }
    }
    if settings.timed {
        let _ = B::sync(device);
    }
    let optimizer_time = started.elapsed();
    // ZeRO-1: every rank updated its own shard; the others' are gathered (on skipped steps
    // too, so every rank takes part in the same collective calls). Counted as sync time.
    let started = Instant::now();
    if !replicas_differ {
        target.gather(sync)?;
    }
    let gather_time = started.elapsed();
    Ok(StepOutput {
        loss: global.loss,
        grad_norm,
        scored_tokens: global.scored_tokens,
        stop: global.stop,
        checkpoint: global.checkpoint,
        replicas_agree: global.replicas_agree,
        sync_time: global.sync_time + gather_time,
        forward_backward_time: global.forward_backward_time,
        forward_time: global.passes.forward,
        backward_time: global.passes.backward,
        optimizer_time,
        device_memory: global.device_memory,
        judgement,
        overflow,
    })
}

/// Two `[1]` tensors read back to the host in one transfer.
fn read_pair<B: Backend>(a: &Tensor<B, 1>, b: &Tensor<B, 1>) -> [f64; 2] {
    let data = Tensor::cat(vec![a.clone(), b.clone()], 0).into_data();
    match data.convert::<f64>().to_vec::<f64>().as_deref() {
        Ok([a, b]) => [*a, *b],
        _ => [f64::NAN, f64::NAN],
    }
}

/// [`optimizer_step`] for `model` and Ember's AdamW. Returns the updated model.
///
/// Errors: as [`global_gradients`].
pub fn train_step<B: AutodiffBackend>(
    model: LanguageModel<B>,
    optimizer: &mut AdamWGroups<LanguageModel<B>, B>,
    micro_batches: &[Batch],
    settings: StepSettings,
    sync: &mut dyn GradSync<B>,
    sentinel: Option<&mut Sentinel>,
    device: &B::Device,
) -> Result<(LanguageModel<B>, StepOutput<B::InnerBackend>), TrainError> {
    let mut trainee = Trainee::new(model, optimizer);
    let output = optimizer_step(&mut trainee, micro_batches, settings, sync, sentinel, device)?;
    Ok((trainee.into_model(), output))
}

/// [`train_step`] judged by the device sentinel `sentinel`: its verdict gates the AdamW update
/// on the device, and nothing is read back ([`StepOutput::judgement`] is `None`; the verdicts
/// come from [`DeviceSentinel::settle`]). Not for loss-scaled steps (fp16-mixed), whose
/// overflow check reads the gradient norm.
///
/// Errors: as [`global_gradients`].
///
/// # Panics
/// If `settings.loss_scale` is not 1.
pub fn train_step_judged_on_device<B: AutodiffBackend>(
    model: LanguageModel<B>,
    optimizer: &mut AdamWGroups<LanguageModel<B>, B>,
    micro_batches: &[Batch],
    settings: StepSettings,
    sync: &mut dyn GradSync<B>,
    sentinel: &mut DeviceSentinel<B::InnerBackend>,
    device: &B::Device,
) -> Result<(LanguageModel<B>, StepOutput<B::InnerBackend>), TrainError> {
    let mut trainee = Trainee::new(model, optimizer);
    let judge = Judge::Device(sentinel);
    let output = step_judged(&mut trainee, micro_batches, settings, sync, judge, device)?;
    Ok((trainee.into_model(), output))
}

/// Steps 2–4 on one rank: for each micro-batch, forward, Σ NLL over its scored targets,
/// backward; gradients summed over micro-batches. Returns `∇ Σ NLL`, `Σ NLL` (nats, `[1]`) and
/// the scored-token count — not yet divided by the global count, which only the gradient
/// exchange knows.
pub fn accumulate<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    device: &B::Device,
) -> (GradientsParams, Tensor<B::InnerBackend, 1>, usize) {
    accumulate_in(model, micro_batches, Passes::fp32(), device)
}

/// [`accumulate`] run as `passes` says: the forward passes in its precision, with or without
/// checkpointing, and the backward of Σ NLL × `passes.multiplier` (see [`loss_multiplier`]):
/// the gradient returned is `multiplier · ∇ Σ NLL`.
pub fn accumulate_in<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    passes: Passes,
    device: &B::Device,
) -> (GradientsParams, Tensor<B::InnerBackend, 1>, usize) {
    let (grads, nll, tokens, _, _) = accumulate_timed(model, micro_batches, false, passes, device);
    (grads, nll, tokens)
}

/// The factor the summed loss is multiplied by before the backward pass at loss scale
/// `loss_scale`: exactly 1 without loss scaling, else `loss_scale ÷` the input positions of the
/// global batch (`micro_batches` of this rank × `world_size`), so the scale applies to the
/// mean loss as in PyTorch and is the same on every rank.
pub fn loss_multiplier(loss_scale: f64, micro_batches: &[Batch], world_size: usize) -> f64 {
    if loss_scale == 1.0 {
        return 1.0;
    }
    let positions: usize = micro_batches.iter().map(|b| b.batch_size * b.seq_len).sum();
    loss_scale / (positions * world_size).max(1) as f64
}

/// Time of the forward passes (model and loss) and of the backward passes (with the gradient
/// accumulation) of one step's micro-batches, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PassTimes {
    /// Forward passes.
    pub forward: Duration,
    /// Backward passes.
    pub backward: Duration,
}

/// Adds the time since its last lap to a phase, after waiting for the device, and reads the
/// device's memory pool there, keeping the most bytes in use and reserved of every lap (the
/// end of a forward pass, every activation alive, is the step's high point; with activation
/// checkpointing the "forward" lap comes after the head's backward, and a block's recompute,
/// the high point there, falls between laps); does nothing (no clock read, no sync) when the
/// step is not timed.
struct Stopwatch<'a, B: Backend> {
    device: &'a B::Device,
    last: Option<Instant>,
    memory: Option<DeviceMemory>,
}

impl<'a, B: Backend> Stopwatch<'a, B> {
    /// Starts after the device has finished earlier work (the previous, untimed step's update),
    /// so the first forward is not charged with it.
    fn start(timed: bool, device: &'a B::Device) -> Self {
        if timed {
            let _ = B::sync(device); // host sync: timed (logging) steps only
        }
        Self { device, last: timed.then(Instant::now), memory: None }
    }

    fn lap(&mut self, phase: &mut Duration) {
        if let Some(last) = self.last {
            let _ = B::sync(self.device); // host sync: timed (logging) steps only
            let now = Instant::now();
            *phase += now - last;
            self.last = Some(now);
            if let Some(now) = device_memory(self.device) {
                self.memory = Some(self.memory.map_or(now, |high| high.max(now)));
            }
        }
    }
}

/// [`accumulate`], and with `timed` the forward and backward time (a device sync after each
/// pass of each micro-batch; without `timed` no sync and zero times).
fn accumulate_timed<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    timed: bool,
    passes: Passes,
    device: &B::Device,
) -> (GradientsParams, Tensor<B::InnerBackend, 1>, usize, PassTimes, Option<DeviceMemory>) {
    let mut accumulator = GradientsAccumulator::new();
    let mut nll_total: Option<Tensor<B::InnerBackend, 1>> = None;
    let mut times = PassTimes::default();
    let mut clock = Stopwatch::<B>::start(timed, device);
    let multiplier = passes.multiplier;
    for (i, batch) in micro_batches.iter().enumerate() {
        // The matmuls run in `precision` (f32 weights cast at their use, f32 elsewhere); each
        // stage of the model draws its dropout masks from a seed of its own.
        let seed = stage_seed(passes.dropout_seed, (passes.first_micro_batch + i) as u64);
        let detached = with_dropout_seed(seed, || {
            autocast(passes.precision, || match passes.checkpointing {
                ActivationCheckpointing::None => {
                    // 2. Forward: logits for every position (teacher forcing), [B, T, V]; rows
                    //    that pack several documents attend within each document only when
                    //    masking is on.
                    // 3. Loss: Σ NLL over this micro-batch's scored targets (normalized after
                    //    the sync).
                    let nll = batch_nll(model, batch, device);
                    clock.lap(&mut times.forward);
                    // 4. Backward (of Σ NLL × the loss multiplier under fp16-mixed); Burn's
                    //    accumulator sums the micro-steps' gradients.
                    let scaled =
                        if multiplier == 1.0 { nll.clone() } else { nll.clone().mul_scalar(multiplier) };
                    accumulator.accumulate(model, GradientsParams::from_grads(scaled.backward(), model));
                    nll.inner()
                }
                // 2–4 with per-block recompute: a forward without a graph, then each stage's
                // forward again and its backward, last block first; every stage's parameter
                // gradients go to the accumulator. (Forward time ends when the head's
                // gradients arrive; the blocks' recompute and backward count as backward time.)
                ActivationCheckpointing::Blocks => {
                    let (inputs, targets, packing) = batch_inputs::<B>(batch, device);
                    let mut first = true;
                    backward_checkpointed(
                        model,
                        inputs,
                        packing.as_ref(),
                        |logits| nll_sum(logits, targets),
                        multiplier,
                        |grads| {
                            if std::mem::take(&mut first) {
                                clock.lap(&mut times.forward);
                            }
                            accumulator.accumulate(model, GradientsParams::from_grads(grads, model));
                        },
                    )
                }
            })
        });
        clock.lap(&mut times.backward);
        nll_total = Some(match nll_total {
            Some(sum) => sum + detached,
            None => detached,
        });
    }
    let nll = nll_total.unwrap_or_else(|| Tensor::zeros([1], device));
    let tokens = micro_batches.iter().map(Batch::scored_tokens).sum();
    (accumulator.grads(), nll, tokens, times, clock.memory)
}

/// The gradient of the global batch's token-mean loss, identical on every rank.
pub struct GlobalGradients<B: AutodiffBackend> {
    /// `∇ (Σ NLL ÷ scored tokens)` over all micro-batches of all ranks.
    pub grads: GradientsParams,
    /// Mean NLL of the global batch, nats/token, `[1]`.
    pub loss: Tensor<B::InnerBackend, 1>,
    /// Scored target positions in the global batch.
    pub scored_tokens: usize,
    /// Some rank asked to stop after this step.
    pub stop: bool,
    /// Some rank asked for a checkpoint after this step.
    pub checkpoint: bool,
    /// `Some(true)` when the parameter hashes were compared and agreed.
    pub replicas_agree: Option<bool>,
    /// Time in the gradient exchange (including waiting for slower ranks).
    pub sync_time: Duration,
    /// Time of the forward and backward passes.
    pub forward_backward_time: Duration,
    /// When timed: the forward and the backward passes apart (zero otherwise).
    pub passes: PassTimes,
    /// On CUDA and wgpu, when timed: the most bytes in use and reserved of the device pool's
    /// readings after each forward pass and after the backward passes.
    pub device_memory: Option<DeviceMemory>,
}

/// Steps 2–5 on one rank: forward, loss and backward over this rank's `micro_batches` with
/// nothing communicated, then one exchange that sums the gradients, Σ NLL and scored-token
/// counts of every rank (plus the stop flag and parameter hashes of `settings`), and the
/// normalization by the global batch's scored tokens — all micro-steps, all ranks — so the
/// result equals the full global batch's gradient even with uneven masks. With
/// [`super::Solo`] it is the single worker's normalized gradient.
///
/// Errors: [`TrainError::NoScoredTokens`] when no target of the global batch is scored; the
/// exchange's errors (a rank failed, a timeout).
pub fn global_gradients<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    settings: &StepSettings,
    sync: &mut dyn GradSync<B>,
    device: &B::Device,
) -> Result<GlobalGradients<B>, TrainError> {
    let started = Instant::now();
    // fp16-mixed: Σ NLL × scale ÷ (input positions of the global batch); exactly 1 otherwise.
    let passes = Passes::of_step(settings, micro_batches, sync.rank(), sync.world_size());
    let multiplier = passes.multiplier;
    // When timed, the last backward lap has synced the device and read its pool.
    let (grads, nll_sum, tokens, passes, memory) =
        accumulate_timed(model, micro_batches, settings.timed, passes, device);
    let forward_backward_time = started.elapsed();
    let started = Instant::now();
    let local = Contribution {
        grads,
        nll_sum,
        tokens: tokens as u64,
        stop: settings.stop,
        checkpoint: settings.checkpoint,
        param_hash: settings.param_hash,
    };
    let global = sync.exchange(model, local)?;
    let sync_time = started.elapsed();
    let scored_tokens = global.tokens as usize;
    if scored_tokens == 0 {
        return Err(TrainError::NoScoredTokens { step: settings.step });
    }
    let mut grads = global.grads;
    // The mean over the global batch, and the loss scale undone (before clipping).
    scale_grads(model, &mut grads, 1.0 / (scored_tokens as f64 * multiplier));
    Ok(GlobalGradients {
        grads,
        loss: global.nll_sum / scored_tokens as f64,
        scored_tokens,
        stop: global.stop,
        checkpoint: global.checkpoint,
        replicas_agree: global.hashes_agree,
        sync_time,
        forward_backward_time,
        passes,
        device_memory: memory,
    })
}

/// Steps 1–4 for a single worker, normalized: the gradient and the loss (nats/token, `[1]`)
/// of Σ NLL ÷ the scored tokens of all `micro_batches` — equal to the full batch's token-mean
/// loss and its gradient — and the scored-token count: [`global_gradients`] with
/// [`super::Solo`].
///
/// Errors: [`TrainError::NoScoredTokens`] when no target of any micro-batch is scored.
pub fn forward_backward<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    micro_batches: &[Batch],
    step: u64,
    device: &B::Device,
) -> Result<(GradientsParams, Tensor<B::InnerBackend, 1>, usize), TrainError> {
    let settings = StepSettings::new(step, 0.0, 0.0);
    let global = global_gradients(model, micro_batches, &settings, &mut super::Solo, device)?;
    Ok((global.grads, global.loss, global.scored_tokens))
}

/// Σ NLL (nats) over the scored targets of `batch`: forward (with document masking when the
/// batch carries segments) and [`nll_sum`]. A `[1]` tensor.
pub fn batch_nll<B: Backend>(model: &LanguageModel<B>, batch: &Batch, device: &B::Device) -> Tensor<B, 1> {
    let (inputs, targets, packing) = batch_inputs::<B>(batch, device);
    let logits = match &packing {
        Some(packing) => model.forward_packed(inputs, packing),
        None => model.forward(inputs),
    };
    nll_sum(logits, targets)
}

/// A micro-batch on the device: inputs and targets `[batch, seq_len]`, and its documents'
/// packing.
type BatchTensors<B> = (Tensor<B, 2, burn::tensor::Int>, Tensor<B, 2, burn::tensor::Int>, Option<Packing<B>>);

/// `batch` on `device`: inputs and targets `[batch, seq_len]`, and its documents' packing
/// when it carries segments.
fn batch_inputs<B: Backend>(batch: &Batch, device: &B::Device) -> BatchTensors<B> {
    let (inputs, targets) = to_tensors::<B>(batch, device);
    let packing = batch
        .segments
        .as_ref()
        .map(|segments| Packing::from_segments(segments, batch.batch_size, batch.seq_len, device));
    (inputs, targets, packing)
}
