//! The training loop of one data-parallel replica; the leader (rank 0) also logs, evaluates
//! and writes checkpoints.

use std::path::Path;
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use ember_data::DataView;
use ember_model::LanguageModel;

use crate::checkpoint::{self, TrainState};
use crate::config::RunConfig;
use crate::controls::Controls;
use crate::device_memory::device_memory;
use crate::error::TrainError;
use crate::eval::evaluate;
use crate::feed::Feed;
use crate::fsutil::write_atomic;
use crate::metrics::{EvalRecord, MetricsLog, Record, TrainRecord};
use crate::optim::AdamWGroups;
use crate::run::{files, step_seed};
use crate::schedule::LrSchedule;
use crate::step::{train_step, StepSettings};
use crate::sync::{param_hash, scalar, text_hash, GradSync};

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
    /// Tokens of the global batches of this session, and the step time they took.
    pub tokens: u64,
    /// Seconds of step time in this session.
    pub step_s: f64,
    /// Wall-clock seconds of the run, all sessions.
    pub elapsed_s: f64,
}

/// Measurements between two log lines.
#[derive(Default)]
struct Interval {
    tokens: u64,
    seconds: f64,
    data_wait: Duration,
    sync: Duration,
    steps: u64,
    eval: Duration,
    checkpoint: Duration,
}

/// Trains `model` (this replica's copy, identical on every rank) from `plan.start` to
/// `max_steps` (or a stop request). When another rank fails, this one stops with an error
/// naming it; when this one fails, it tells the others.
pub fn run_replica<B: AutodiffBackend>(
    plan: &Plan<'_>,
    mut replica: Replica<B>,
    model: LanguageModel<B>,
    mut leader: Option<Leader<'_>>,
) -> Result<ReplicaReport, TrainError> {
    let num_params = model.num_params();
    let result = train_loop(plan, &mut replica, model, leader.as_mut());
    if let Err(e) = &result {
        if !matches!(e, TrainError::Sync(_)) {
            // The others are (or will be) waiting in the next exchange: let them stop too.
            replica.sync.abort(num_params);
        }
    } else {
        replica.sync.finish();
    }
    result
}

fn train_loop<B: AutodiffBackend>(
    plan: &Plan<'_>,
    r: &mut Replica<B>,
    mut model: LanguageModel<B>,
    mut leader: Option<&mut Leader<'_>>,
) -> Result<ReplicaReport, TrainError> {
    let config = plan.config;
    let mut state = plan.start.clone();
    let elapsed = |state: &TrainState| state.elapsed_s + plan.session.elapsed().as_secs_f64();
    let mut final_val_loss = None;
    let val_loss = |model: &LanguageModel<B>, val: &DataView, device: &B::Device| {
        evaluate(&model.valid(), val, config.seed, config.eval_batches, config.micro_batch_size, device)
    };
    if let Some(leader) = leader.as_deref_mut() {
        if state.step == 0 && config.eval_every > 0 {
            let record = EvalRecord::new(0, val_loss(&model, &leader.val, &r.device)?, elapsed(&state));
            final_val_loss = Some(record.val_loss);
            (leader.log)(&record.to_string());
            leader.metrics.write(&Record::Eval(record))?;
        }
    }
    let multi = r.sync.world_size() > 1;
    let bytes_per_step = r.sync.bytes_per_exchange(model.num_params());
    let strategy = r.sync.strategy();
    let (mut interval, mut session_tokens, mut session_step_s) = (Interval::default(), 0u64, 0.0f64);
    let mut stopped_early = false;
    let fail_at = test_switch("EMBER_TEST_FAIL_RANK", r.rank);
    // Settings every rank must share, compared with the parameters: a node started with
    // another batch size or schedule is caught at the first step.
    let o = &config.optimizer;
    let settings_hash = text_hash(&format!(
        "{} {} {} {} {} {} {} {} {} {} {}",
        config.micro_batch_size,
        config.accumulation_steps,
        config.model.block_size(),
        config.seed,
        config.max_steps,
        o.lr,
        o.min_lr,
        o.warmup_steps,
        o.weight_decay,
        o.grad_clip,
        r.sync.world_size()
    ));
    let flops_per_token = crate::accounting::estimate_run(
        config,
        crate::accounting::Precision::Fp32,
        None,
        1.0,
    )
    .flops_per_token as f64;
    // Tokens processed per step (every input position of the global batch, as nanoGPT counts
    // them); the loss is normalized by the scored ones, which masks can make fewer.
    let processed = config.tokens_per_step(r.sync.world_size()) as u64;
    for step in plan.start.step + 1..=config.max_steps {
        plan.controls.wait_while_paused();
        let started = Instant::now();
        if fail_at == Some(step) {
            return Err(TrainError::Feed(format!(
                "rank {}: failure injected at step {step} (EMBER_TEST_FAIL_RANK)",
                r.rank
            )));
        }
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
            param_hash: check.then(|| param_hash(&model) ^ settings_hash),
            timed: logging,
        };
        let (next, out) =
            train_step(model, &mut r.optimizer, &data.micro_batches, settings, r.sync.as_mut(), &r.device)?;
        model = next;
        if out.replicas_agree == Some(false) {
            return Err(TrainError::Sync(format!(
                "the replicas' parameters or run settings differed before step {step}: a rank diverged or was started with other settings (rank {} stops)",
                r.rank
            )));
        }
        state.step = step;
        state.sampler = data.state;
        state.tokens += processed;
        let last = step == config.max_steps || out.stop;
        let read = (logging || last).then(|| (scalar(out.loss.clone()), scalar(out.grad_norm.clone())));
        let step_s = started.elapsed().as_secs_f64();
        interval.tokens += processed;
        interval.seconds += step_s;
        interval.data_wait += data_wait;
        interval.sync += out.sync_time;
        interval.steps += 1;
        session_step_s += step_s;
        session_tokens += processed;
        if let Some(leader) = leader.as_deref_mut() {
            if let Some((loss, grad_norm)) = read {
                for (what, value) in [("loss", loss), ("grad norm", grad_norm)] {
                    if !value.is_finite() {
                        return Err(TrainError::NonFinite { step, what, value });
                    }
                }
                let device_memory = device_memory(&r.device);
                let record = TrainRecord {
                    step,
                    loss,
                    perplexity: loss.exp(),
                    lr: settings.lr,
                    grad_norm,
                    tokens_per_sec: interval.tokens as f64 / interval.seconds.max(1e-9),
                    data_wait_frac: interval.data_wait.as_secs_f64() / interval.seconds.max(1e-9),
                    sync_s: interval.sync.as_secs_f64() / interval.steps.max(1) as f64,
                    allreduce_bytes: bytes_per_step as u64,
                    allreduce: strategy.clone(),
                    replicas_agree: out.replicas_agree,
                    param_hash: settings.param_hash.map(|h| format!("{h:016x}")),
                    allreduce_calls: r.sync.all_reduce_calls() as u64,
                    forward_backward_s: out.forward_backward_time.as_secs_f64(),
                    optimizer_s: out.optimizer_time.as_secs_f64(),
                    data_s: data_wait.as_secs_f64(),
                    step_sync_s: out.sync_time.as_secs_f64(),
                    eval_s: interval.eval.as_secs_f64(),
                    checkpoint_s: interval.checkpoint.as_secs_f64(),
                    mfu: plan.peak_flops.map(|peak| {
                        flops_per_token * interval.tokens as f64
                            / interval.seconds.max(1e-9)
                            / (peak * r.sync.world_size() as f64)
                    }),
                    rss_bytes: crate::bench::rss_bytes("VmRSS:"),
                    device_in_use_bytes: device_memory.map(|m| m.in_use_bytes),
                    device_reserved_bytes: device_memory.map(|m| m.reserved_bytes),
                    tokens: state.tokens,
                    elapsed_s: elapsed(&state),
                };
                (leader.log)(&record.to_string());
                leader.metrics.write(&Record::Train(record))?;
                interval = Interval::default();
            }
            let due = |every: u64| every > 0 && step % every == 0;
            if due(config.eval_every) || last {
                let eval_started = Instant::now();
                let record =
                    EvalRecord::new(step, val_loss(&model, &leader.val, &r.device)?, elapsed(&state));
                final_val_loss = Some(record.val_loss);
                (leader.log)(&record.to_string());
                leader.metrics.write(&Record::Eval(record))?;
                interval.eval += eval_started.elapsed();
            }
            if due(config.checkpoint_every) || last || plan.controls.take_checkpoint() {
                let checkpoint_started = Instant::now();
                let mut saved = state.clone();
                saved.elapsed_s = elapsed(&state);
                saved.world_size = r.sync.world_size();
                let dir =
                    checkpoint::save(leader.run_dir, &saved, &model, &r.optimizer, config.keep_checkpoints)?;
                write_atomic(&dir.join(files::CONFIG), config.to_toml().as_bytes())?;
                (leader.log)(&format!("checkpoint {}", dir.display()));
                interval.checkpoint += checkpoint_started.elapsed();
            }
        }
        if out.stop && step < config.max_steps {
            if let Some(leader) = leader.as_deref_mut() {
                (leader.log)(&format!(
                    "stopped after step {step}; continue with `ember train --resume {}`",
                    leader.run_dir.display()
                ));
            }
            stopped_early = true;
            break;
        }
    }
    Ok(ReplicaReport {
        steps: state.step,
        stopped_early,
        final_val_loss,
        tokens: session_tokens,
        step_s: session_step_s,
        elapsed_s: elapsed(&state),
    })
}

/// A test-only fault switch: `NAME=rank:n` in the environment gives `Some(n)` on that rank.
pub(crate) fn test_switch(name: &str, rank: usize) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let (r, n) = value.split_once(':')?;
    (r.parse::<usize>().ok()? == rank).then(|| n.parse().ok()).flatten()
}

/// Whether the replicas' parameter hashes are compared at `step`: every
/// `parallel.check_every` steps, or at logged steps when it is 0.
fn check_due(config: &RunConfig, step: u64, logging: bool) -> bool {
    match config.parallel.check_every {
        0 => logging,
        every => step.is_multiple_of(every),
    }
}
