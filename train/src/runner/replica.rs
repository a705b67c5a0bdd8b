//! The training loop of one data-parallel replica; the leader (rank 0) also logs, evaluates
//! and writes checkpoints.

use std::path::Path;
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use ember_data::{splitmix64, DataView};
use ember_model::LanguageModel;

use super::controls::Controls;
use super::feed::Feed;
use super::judge::{Judges, Verdict};
use super::meter::{Logged, Meter};
use crate::config::RunConfig;
use crate::error::TrainError;
use crate::observe::events::{value_text, Action, EventRecord};
use crate::observe::metrics::{EvalRecord, MetricsLog, Record};
use crate::parallel::{param_hash, settings_hash};
use crate::persist::checkpoint::{self, TrainState};
use crate::step::eval::evaluate;
use crate::step::optim::AdamWGroups;
use crate::step::schedule::LrSchedule;
use crate::step::shard::{gather_optimizer_state, optimizer_state_bytes};
use crate::step::{scalar, Anomaly, GradSync, LossScaler, StepOutput, StepSettings};

/// One model replica and everything it trains with.
pub struct Replica<B: AutodiffBackend> {
    /// Data-parallel rank, from 0.
    pub rank: usize,
    /// Its device.
    pub device: B::Device,
    /// Its optimizer (identical state on every rank).
    pub optimizer: AdamWGroups<LanguageModel<B>, B>,
    /// Its shard of the training data.
    pub feed: Feed,
    /// Its link to the other ranks.
    pub sync: Box<dyn GradSync<B> + Send>,
}

/// What only rank 0 does: report, evaluate, checkpoint, and listen for a stop request.
pub struct Leader<'a> {
    /// Receives every log line.
    pub log: &'a mut dyn FnMut(&str),
    /// `RUN_DIR/metrics.jsonl`.
    pub metrics: MetricsLog,
    /// The validation rows.
    pub val: DataView,
    /// The run directory.
    pub run_dir: &'a Path,
}

/// The shared, read-only part of a run.
pub struct Plan<'a> {
    /// The resolved configuration.
    pub config: &'a RunConfig,
    /// The learning-rate schedule.
    pub schedule: LrSchedule,
    /// Where the run starts (the checkpoint's state, or step 0).
    pub start: TrainState,
    /// When this session started.
    pub session: Instant,
    /// Stop requests of this process (Ctrl-C): any rank's stops every rank.
    pub controls: &'a Controls,
    /// Peak FLOP/s of one device, for MFU (config `peak_flops`, else the GPU table).
    pub peak_flops: Option<f64>,
}

/// How a replica's session ended.
pub struct ReplicaReport {
    /// Optimizer steps completed.
    pub steps: u64,
    /// Stopped before `max_steps`.
    pub stopped_early: bool,
    /// Last validation loss (rank 0).
    pub final_val_loss: Option<f64>,
    /// Tokens of the global batches of this session.
    pub tokens: u64,
    /// Seconds of step time in this session.
    pub step_s: f64,
    /// Wall-clock seconds of the run, all sessions.
    pub elapsed_s: f64,
    /// The stability sentinel stopped the run after this step, for this reason.
    pub unstable: Option<(u64, String)>,
}

/// The backend seed of step `step`'s dropout: SplitMix64 of (seed, step) mixed, so the random
/// draws of a step do not depend on how many steps ran before it in this process.
pub fn step_seed(seed: u64, step: u64) -> u64 {
    // splitmix64 adds the golden gamma before mixing; the mix of (seed, step) is
    // `seed ^ step·gamma`, so the gamma is taken off first.
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    splitmix64((seed ^ step.wrapping_mul(GAMMA)).wrapping_sub(GAMMA))
}

/// Trains `model` (this replica's copy, identical on every rank) from `plan.start` to
/// `max_steps` (or a stop request). When another rank fails, this one stops with an error
/// naming it; when this one fails, it tells the others.
pub fn run_replica<B: AutodiffBackend>(
    plan: &Plan<'_>,
    mut replica: Replica<B>,
    model: LanguageModel<B>,
    leader: Option<Leader<'_>>,
) -> Result<ReplicaReport, TrainError> {
    let num_params = model.num_params();
    let result = train_loop(plan, &mut replica, model, leader);
    match &result {
        // The others are (or will be) waiting in the next exchange: let them stop too.
        Err(e) if !e.is_reaction() => replica.sync.abort(num_params),
        Err(_) => {}
        Ok(_) => replica.sync.finish(),
    }
    result
}

fn train_loop<B: AutodiffBackend>(
    plan: &Plan<'_>,
    r: &mut Replica<B>,
    mut model: LanguageModel<B>,
    mut leader: Option<Leader<'_>>,
) -> Result<ReplicaReport, TrainError> {
    let config = plan.config;
    let mut state = plan.start.clone();
    let mut final_val_loss = None;
    if let (Some(leader), true) = (leader.as_mut(), state.step == 0 && config.eval_every > 0) {
        final_val_loss = Some(leader.evaluate(plan, &model, &r.device, 0, &state)?);
    }
    let mut meter = Meter::new(config, plan.peak_flops, r.sync.as_ref(), model.num_params());
    // Settings every rank must share, compared with the parameters: a node started with
    // another batch size or schedule is caught at the first step.
    let settings_hash = settings_hash(config);
    let multi = r.sync.world_size() > 1;
    let mut stopped_early = false;
    let mut unstable = None;
    // fp16-mixed: the loss scaler, continued from the checkpoint.
    let mut scaler = LossScaler::for_run(config.precision, plan.start.loss_scaler.as_ref());
    // Every rank judges the same global loss and gradient norm: the same verdicts everywhere
    // (on the device, read back at logged, checkpointed and last steps).
    let mut judges = Judges::<B>::new(&config.sentinel, &plan.start.sentinel, scaler.is_some(), &r.device);
    for step in plan.start.step + 1..=config.max_steps {
        plan.controls.wait_while_paused();
        let started = Instant::now();
        // 1. Data: this rank's micro-batches of this step, built ahead on the feed's thread.
        let (data, data_wait) = r.feed.next_step()?;
        B::seed(&r.device, step_seed(config.seed, step));
        let logging = step % config.log_every == 0 || step == config.max_steps;
        let check = multi && (step == plan.start.step + 1 || check_due(config, step, logging));
        let settings = StepSettings {
            step,
            lr: plan.schedule.lr(step),
            grad_clip: config.optimizer.grad_clip,
            stop: plan.controls.stop_requested(),
            // The dashboard's checkpoint request, taken by the leader only (the replicas of a
            // process share its controls); every rank learns of it in the exchange.
            checkpoint: leader.is_some() && plan.controls.take_checkpoint(),
            param_hash: check.then(|| param_hash(&model) ^ settings_hash),
            timed: logging,
            precision: config.precision.mode(),
            loss_scale: LossScaler::scale_of(scaler.as_ref()),
            checkpointing: config.activation_checkpointing.mode(),
            dropout_seed: step_seed(config.seed, step),
        };
        // 2–6. Forward, loss, backward, gradient sync, clip and AdamW.
        let (next, out) = judges.step(
            model,
            &mut r.optimizer,
            &data.micro_batches,
            settings,
            r.sync.as_mut(),
            &data.sources,
            &r.device,
        )?;
        model = next;
        if out.replicas_agree == Some(false) {
            return Err(TrainError::ReplicasDiffer { step, rank: r.rank });
        }
        state.step = step;
        state.sampler = data.state;
        state.tokens += meter.processed;
        if let Some(scaler) = scaler.as_mut() {
            scaler.update(!out.overflow);
        }
        state.loss_scaler = scaler.clone();
        // The verdicts known now (judged on the device: read at logged, checkpointed and
        // last steps, for every step since the last read).
        let due_now = due(config.checkpoint_every, step) || out.checkpoint;
        let read = logging || due_now || step == config.max_steps || out.stop;
        let verdicts = judges.verdicts(step, &out, &data.sources, read, &model, &mut r.optimizer);
        state.sentinel = judges.host.state.clone();
        let stop_reason = verdicts.iter().find_map(|v| {
            let (at, reason) = (v.settled.step, v.settled.stop_reason.as_ref()?);
            Some(match at == step {
                true => reason.clone(),
                false => format!("{reason}, at step {at} (judged on the device; the updates of steps {} to {step} were skipped until its verdicts were read)", at + 1),
            })
        });
        let last = step == config.max_steps || out.stop || stop_reason.is_some();
        // Every rank knows when a checkpoint is written: with ZeRO-1 each takes part in
        // gathering the whole optimizer state for it.
        let checkpoint = due_now || last;
        let whole_state = match (checkpoint, r.optimizer.shard()) {
            (true, Some(_)) => Some(gather_optimizer_state(&model, &r.optimizer, r.sync.as_mut())?),
            _ => None,
        };
        meter.step(started.elapsed().as_secs_f64(), data_wait, &out);
        if let Some(leader) = leader.as_mut() {
            let done = StepDone {
                step,
                lr: settings.lr,
                param_hash: settings.param_hash,
                out: &out,
                data_wait,
                last,
                verdicts: &verdicts,
                checkpoint,
                optimizer: whole_state.as_ref().unwrap_or(&r.optimizer),
            };
            if let Some(val_loss) = leader.after_step(plan, &mut meter, done, &state, &model, r)? {
                final_val_loss = Some(val_loss);
            }
        }
        if let Some(reason) = stop_reason {
            unstable = Some((step, reason));
            stopped_early = true;
            break;
        }
        if out.stop && step < config.max_steps {
            if let Some(leader) = leader.as_mut() {
                let nodes = match config.parallel.nodes {
                    1 => String::new(),
                    n => format!(" --nodes {n} --node-rank R --coordinator {}` on every node (R: its rank; each node needs this checkpoint in its run directory", config.parallel.coordinator),
                };
                let close = if nodes.is_empty() { "`" } else { ")" };
                (leader.log)(&format!(
                    "stopped after step {step}; continue with `ember train --resume {}{nodes}{close}",
                    leader.run_dir.display()
                ));
            }
            stopped_early = true;
            break;
        }
    }
    let (tokens, step_s) = meter.session();
    Ok(ReplicaReport {
        steps: state.step,
        stopped_early,
        final_val_loss,
        tokens,
        step_s,
        elapsed_s: plan.elapsed(&state),
        unstable,
    })
}

impl Plan<'_> {
    /// Wall-clock seconds of the run at `state`, all sessions.
    fn elapsed(&self, state: &TrainState) -> f64 {
        state.elapsed_s + self.session.elapsed().as_secs_f64()
    }
}

/// A finished optimizer step, as the leader sees it.
struct StepDone<'a, B: AutodiffBackend> {
    step: u64,
    lr: f64,
    param_hash: Option<u64>,
    out: &'a StepOutput<B::InnerBackend>,
    data_wait: Duration,
    /// The run's last step (`max_steps`, a stop request, or the sentinel's stop).
    last: bool,
    /// The sentinel's verdicts known after this step: this step's, or on the device those of
    /// the steps since the last read (none between reads).
    verdicts: &'a [Verdict],
    /// A checkpoint is written after this step.
    checkpoint: bool,
    /// The whole optimizer state (with ZeRO-1: gathered from every rank's shard).
    optimizer: &'a AdamWGroups<LanguageModel<B>, B>,
}

impl Leader<'_> {
    /// What rank 0 does after a step: log and record it when due (a host sync, so only at
    /// logged steps), evaluate and checkpoint when due. Returns the validation loss when it
    /// evaluated.
    ///
    /// Errors: I/O errors of the run directory.
    fn after_step<B: AutodiffBackend>(
        &mut self,
        plan: &Plan<'_>,
        meter: &mut Meter,
        done: StepDone<'_, B>,
        state: &TrainState,
        model: &LanguageModel<B>,
        replica: &Replica<B>,
    ) -> Result<Option<f64>, TrainError> {
        let (config, step) = (plan.config, done.step);
        for verdict in done.verdicts.iter().filter(|v| v.settled.judgement.anomaly.is_some()) {
            let record = event_record(verdict, plan.elapsed(state));
            let replay = format!("ember replay --run {} --step {}", self.run_dir.display(), record.step);
            (self.log)(&format!("{record} | replay: {replay}"));
            self.metrics.write(&Record::Event(record))?;
        }
        let judgement = done.verdicts.iter().find(|v| v.settled.step == step).map(|v| &v.settled.judgement);
        if let (true, Some(scaler)) = (done.out.overflow, state.loss_scaler.as_ref()) {
            (self.log)(&format!(
                "step {step:6} | gradient overflow in fp16: step skipped, loss scale halved to {}",
                scaler.scale
            ));
        }
        let skipped = judgement.is_some_and(|j| j.skipped);
        // A skipped step's record is its event; the next logged step has the interval's rates.
        if (step % config.log_every == 0 || done.last) && !skipped {
            let (loss, grad_norm) = match judgement {
                Some(j) => (j.loss, j.grad_norm),
                None => (scalar(done.out.loss.clone()), scalar(done.out.grad_norm.clone())),
            };
            let logged = Logged::<B> {
                step,
                loss,
                grad_norm,
                lr: done.lr,
                out: done.out,
                data_wait: done.data_wait,
                param_hash: done.param_hash,
                tokens: state.tokens,
                elapsed_s: plan.elapsed(state),
                sentinel: &state.sentinel,
                scaler: state.loss_scaler.as_ref(),
                optimizer_state_bytes: optimizer_state_bytes(model, &replica.optimizer),
            };
            let record = meter.record(logged, replica.sync.all_reduce_calls());
            (self.log)(&record.to_string());
            self.metrics.write(&Record::Train(record))?;
        }
        let mut val_loss = None;
        if due(config.eval_every, step) || done.last {
            let started = Instant::now();
            val_loss = Some(self.evaluate(plan, model, &replica.device, step, state)?);
            meter.eval(started.elapsed());
        }
        if done.checkpoint {
            let started = Instant::now();
            self.checkpoint(plan, state, model, done.optimizer, replica.sync.world_size())?;
            meter.checkpoint(started.elapsed());
        }
        Ok(val_loss)
    }

    /// Evaluates `model` (without autodiff, dropout off), logs and records the validation loss
    /// after `step` steps, and returns it.
    fn evaluate<B: AutodiffBackend>(
        &mut self,
        plan: &Plan<'_>,
        model: &LanguageModel<B>,
        device: &B::Device,
        step: u64,
        state: &TrainState,
    ) -> Result<f64, TrainError> {
        let c = plan.config;
        let loss = ember_model::autocast(c.precision.mode(), || {
            evaluate(&model.valid(), &self.val, c.seed, c.eval_batches, c.micro_batch_size, device)
        })?
        .nats;
        let record = EvalRecord::new(step, loss, plan.elapsed(state));
        (self.log)(&record.to_string());
        self.metrics.write(&Record::Eval(record))?;
        Ok(loss)
    }

    /// Writes the checkpoint of `state` (trained by `world_size` ranks) with the config.
    fn checkpoint<B: AutodiffBackend>(
        &mut self,
        plan: &Plan<'_>,
        state: &TrainState,
        model: &LanguageModel<B>,
        optimizer: &AdamWGroups<LanguageModel<B>, B>,
        world_size: usize,
    ) -> Result<(), TrainError> {
        let saved = TrainState { elapsed_s: plan.elapsed(state), world_size, ..state.clone() };
        // The config is one of the checkpoint's files: complete before `latest` moves.
        let config = plan.config.to_toml();
        let dir =
            checkpoint::save(self.run_dir, &saved, model, optimizer, &config, plan.config.keep_checkpoints)?;
        (self.log)(&format!("checkpoint {}", dir.display()));
        Ok(())
    }
}

/// The event record of a step the sentinel flagged.
fn event_record(verdict: &Verdict, elapsed_s: f64) -> EventRecord {
    let (v, j) = (&verdict.settled, &verdict.settled.judgement);
    let value = match j.anomaly {
        Some(Anomaly::NonfiniteGradNorm) => j.grad_norm,
        _ => j.loss,
    };
    let action = match (j.skipped, v.stop_reason.is_some()) {
        (false, _) => Action::Marked,
        (true, false) => Action::Skipped,
        (true, true) => Action::Stopped,
    };
    EventRecord {
        step: v.step,
        event: j.anomaly.expect("only flagged steps have events"),
        action,
        value: value_text(value),
        loss: j.loss.is_finite().then_some(j.loss),
        grad_norm: j.grad_norm.is_finite().then_some(j.grad_norm),
        zscore: j.zscore,
        skipped_in_a_row: v.skipped_in_a_row,
        sources: verdict.sources.clone(),
        elapsed_s,
    }
}

/// Whether something done every `every` steps (0: never) is due at `step`.
fn due(every: u64, step: u64) -> bool {
    every > 0 && step.is_multiple_of(every)
}

/// Whether the replicas' parameter hashes are compared at `step`: every
/// `parallel.check_every` steps, or at logged steps when it is 0.
fn check_due(config: &RunConfig, step: u64, logging: bool) -> bool {
    match config.parallel.check_every {
        0 => logging,
        every => step.is_multiple_of(every),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_seed_is_splitmix64_of_seed_and_step() {
        // f(seed ^ step·γ) with f SplitMix64's finalizer, computed in Python: the draws of the
        // hand-written mix this replaced, so earlier checkpoints keep their dropout masks.
        assert_eq!(step_seed(1337, 1), 0x4e7c_45e4_4322_f88d);
        assert_eq!(step_seed(1337, 2000), 0xfe65_3c06_0ada_828d);
        assert_eq!(step_seed(0, 0), 0);
        assert_eq!(step_seed(u64::MAX, 7), 0x8bde_40ab_8762_3c48);
        assert_ne!(step_seed(1337, 1), step_seed(1337, 2));
    }
}
