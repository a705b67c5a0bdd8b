//! [`Meter`]: a replica's timings between two log lines, turned into the `metrics.jsonl`
//! record of a logged step — throughput, the time split, MFU, memory.

use std::time::Duration;

use burn::tensor::backend::AutodiffBackend;

use crate::config::RunConfig;
use crate::observe::accounting::estimate_run;
use crate::observe::device::rss_bytes;
use crate::observe::metrics::TrainRecord;
use crate::step::{GradSync, LossScaler, SentinelState, StepOutput};

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

/// What a logged step reports besides the meter's own sums.
pub(super) struct Logged<'a, B: AutodiffBackend> {
    /// Optimizer step.
    pub step: u64,
    /// Its loss (nats/token) and pre-clip gradient norm, read back from the device.
    pub loss: f64,
    /// Pre-clip global gradient norm.
    pub grad_norm: f64,
    /// Its learning rate.
    pub lr: f64,
    /// The step's output (phase times, replica agreement).
    pub out: &'a StepOutput<B::InnerBackend>,
    /// The step's wait for data.
    pub data_wait: Duration,
    /// The parameter hash compared at this step.
    pub param_hash: Option<u64>,
    /// Tokens of the run so far.
    pub tokens: u64,
    /// Seconds of the run so far, all sessions.
    pub elapsed_s: f64,
    /// The sentinel's counters so far.
    pub sentinel: &'a SentinelState,
    /// fp16-mixed: the loss scaler after this step.
    pub scaler: Option<&'a LossScaler>,
    /// Bytes of AdamW state this rank holds.
    pub optimizer_state_bytes: usize,
}

/// Sums a replica's step times, data waits and exchange times between log lines, and the
/// session's tokens and step time.
pub(super) struct Meter {
    interval: Interval,
    session_tokens: u64,
    session_step_s: f64,
    /// Tokens processed per step: every input position of the global batch, as nanoGPT counts
    /// them (the loss is normalized by the scored ones, which masks can make fewer).
    pub processed: u64,
    flops_per_token: f64,
    peak_flops: Option<f64>,
    world_size: usize,
    bytes_per_step: u64,
    strategy: String,
}

impl Meter {
    /// A meter for `config`'s steps exchanged through `sync`; `peak_flops` (FLOP/s of one
    /// device) gives the MFU.
    pub fn new<B: AutodiffBackend>(
        config: &RunConfig,
        peak_flops: Option<f64>,
        sync: &dyn GradSync<B>,
        num_params: usize,
    ) -> Self {
        let world_size = sync.world_size();
        Self {
            interval: Interval::default(),
            session_tokens: 0,
            session_step_s: 0.0,
            processed: config.tokens_per_step(world_size) as u64,
            flops_per_token: estimate_run(config, None, 1.0).flops_per_token as f64,
            peak_flops,
            world_size,
            // ZeRO-1 gathers the updated parameters in a second exchange of the same size.
            bytes_per_step: (sync.bytes_per_exchange(num_params)
                * if config.parallel.shard_optimizer { 2 } else { 1 }) as u64,
            strategy: sync.strategy(),
        }
    }

    /// Adds an optimizer step that took `step_s` seconds, `data_wait` of them waiting for data.
    pub fn step<B: burn::tensor::backend::Backend>(
        &mut self,
        step_s: f64,
        data_wait: Duration,
        out: &StepOutput<B>,
    ) {
        let i = &mut self.interval;
        i.tokens += self.processed;
        i.seconds += step_s;
        i.data_wait += data_wait;
        i.sync += out.sync_time;
        i.steps += 1;
        self.session_step_s += step_s;
        self.session_tokens += self.processed;
    }

    /// Adds time spent evaluating.
    pub fn eval(&mut self, time: Duration) {
        self.interval.eval += time;
    }

    /// Adds time spent writing a checkpoint.
    pub fn checkpoint(&mut self, time: Duration) {
        self.interval.checkpoint += time;
    }

    /// Tokens and seconds of step time in this session.
    pub fn session(&self) -> (u64, f64) {
        (self.session_tokens, self.session_step_s)
    }

    /// The record of a logged step, from the interval since the previous one (then reset).
    /// MFU = FLOPs per token × tokens/s ÷ (peak FLOP/s × ranks) (PaLM, Appendix B).
    pub fn record<B: AutodiffBackend>(
        &mut self,
        logged: Logged<'_, B>,
        all_reduce_calls: usize,
    ) -> TrainRecord {
        let i = std::mem::take(&mut self.interval);
        let seconds = i.seconds.max(1e-9);
        let tokens_per_sec = i.tokens as f64 / seconds;
        let out = logged.out;
        TrainRecord {
            step: logged.step,
            loss: logged.loss,
            perplexity: logged.loss.exp(),
            lr: logged.lr,
            grad_norm: logged.grad_norm,
            tokens_per_sec,
            data_wait_frac: i.data_wait.as_secs_f64() / seconds,
            sync_s: i.sync.as_secs_f64() / i.steps.max(1) as f64,
            allreduce_bytes: self.bytes_per_step,
            allreduce: self.strategy.clone(),
            replicas_agree: out.replicas_agree,
            param_hash: logged.param_hash.map(|h| format!("{h:016x}")),
            allreduce_calls: all_reduce_calls as u64,
            forward_backward_s: out.forward_backward_time.as_secs_f64(),
            forward_s: out.forward_time.as_secs_f64(),
            backward_s: out.backward_time.as_secs_f64(),
            optimizer_s: out.optimizer_time.as_secs_f64(),
            data_s: logged.data_wait.as_secs_f64(),
            step_sync_s: out.sync_time.as_secs_f64(),
            eval_s: i.eval.as_secs_f64(),
            checkpoint_s: i.checkpoint.as_secs_f64(),
            mfu: self
                .peak_flops
                .map(|peak| self.flops_per_token * tokens_per_sec / (peak * self.world_size as f64)),
            rss_bytes: rss_bytes("VmRSS:"),
            device_in_use_bytes: out.device_memory.map(|m| m.in_use_bytes),
            device_reserved_bytes: out.device_memory.map(|m| m.reserved_bytes),
            optimizer_state_bytes: logged.optimizer_state_bytes as u64,
            skipped_steps: logged.sentinel.skipped_steps,
            spikes: logged.sentinel.spikes,
            loss_scale: logged.scaler.map(|s| s.scale),
            overflow_steps: logged.scaler.map_or(0, |s| s.overflow_steps),
            tokens: logged.tokens,
            elapsed_s: logged.elapsed_s,
        }
    }
}
