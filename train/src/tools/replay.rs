//! `ember replay --run DIR --step S`: restores the newest checkpoint before step `S` (or the
//! run's seeded start when there is none), replays
//! the run deterministically up to `S` (the same data order, dropout seeds and sentinel
//! verdicts), and reports `S`'s loss and gradient norm for each micro-batch in f32 with the
//! rows it was built from and their text — to tell bad data from bad numerics.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use ember_data::{Batch, BatchSource, PreparedData, Tokenizer};
use ember_model::LanguageModel;

use super::backend::{run_on, BackendTask};
use super::trained::{Source, Trained};
use crate::config::{BackendKind, RunConfig};
use crate::error::TrainError;
use crate::observe::words::count;
use crate::persist::checkpoint::{self, TrainState, CHECKPOINT_VERSION};
use crate::persist::recover;
use crate::runner::feed::Feed;
use crate::runner::step_seed;
use crate::step::optim::{clip_grad_norm, AdamWGroups};
use crate::step::schedule::LrSchedule;
use crate::step::{
    accumulate_in, scalar, train_step, Contribution, Exchanged, GradSync, Judgement, LossScaler, Passes,
    Sentinel, StepSettings,
};

/// One micro-batch of the replayed step.
#[derive(Clone, Debug, PartialEq)]
pub struct MicroBatchReport {
    /// The data-parallel rank that drew it.
    pub rank: usize,
    /// Its accumulation step on that rank, from 0.
    pub micro_step: usize,
    /// Where its rows came from.
    pub source: BatchSource,
    /// Scored target positions.
    pub scored_tokens: usize,
    /// Its own mean NLL, nats/token (f32 computation).
    pub loss: f64,
    /// L2 norm of the gradient of its own mean NLL.
    pub grad_norm: f64,
    /// The start of each row's text, in row order.
    pub previews: Vec<String>,
}

/// What `ember replay` found.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayReport {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The step replayed.
    pub step: u64,
    /// The checkpoint the replay started from (`None`: the run's start, no checkpoint before
    /// the step verifying).
    pub checkpoint: Option<PathBuf>,
    /// Its step.
    pub from_step: u64,
    /// Data-parallel ranks of the run (their micro-batches are replayed in one process).
    pub world_size: usize,
    /// The step's learning rate.
    pub lr: f64,
    /// The global batch's mean loss, nats/token.
    pub loss: f64,
    /// The global gradient's pre-clip L2 norm.
    pub grad_norm: f64,
    /// The sentinel's verdict on the step (with the run's settings and state).
    pub judgement: Judgement,
    /// Every micro-batch of every rank.
    pub micro_batches: Vec<MicroBatchReport>,
}

/// Replays `run_dir` up to `step` on its backend (or `backend`); `log` receives progress lines.
///
/// Errors: not a run directory; `step` outside `1..=max_steps`; no verified checkpoint before
/// `step`; data that is not the run's.
pub fn replay_run(
    run_dir: &Path,
    step: u64,
    backend: Option<BackendKind>,
    log: &mut (dyn FnMut(&str) + Send),
) -> Result<ReplayReport, TrainError> {
    struct Task<'a> {
        trained: Trained,
        run_dir: &'a Path,
        step: u64,
        log: &'a mut (dyn FnMut(&str) + Send),
    }
    impl BackendTask for Task<'_> {
        type Output = ReplayReport;
        fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<ReplayReport, TrainError> {
            let device = devices.into_iter().next().expect("one device");
            replay::<B>(&self.trained, self.run_dir, self.step, &device, self.log)
        }
    }
    let trained = Trained::open_logged(Source::Run(run_dir.into()), &mut |_| {})?;
    if step == 0 || step > trained.config.max_steps {
        return Err(TrainError::Replay(format!(
            "--step {step}: expected a step of the run, 1 to max_steps = {}",
            trained.config.max_steps
        )));
    }
    let (kind, index) = (backend.unwrap_or(trained.config.backend), trained.config.device);
    super::backend::check_precision(kind, trained.config.precision)?;
    run_on(kind, &[index], Task { trained, run_dir, step, log })
}

fn replay<B: AutodiffBackend>(
    trained: &Trained,
    run_dir: &Path,
    target: u64,
    device: &B::Device,
    log: &mut dyn FnMut(&str),
) -> Result<ReplayReport, TrainError> {
    let config = &trained.config;
    let data = Arc::new(trained.data()?);
    let tokenizer = trained.tokenizer()?;
    let init = |device: &B::Device| {
        config.model.init::<B>(device).map_err(|e| config.origin.at(&format!("model.{}", e.field), e.message))
    };
    let start = match recover::newest_before(run_dir, target, log) {
        Ok(dir) => Some(dir),
        Err(e) => {
            log(&format!("{e}: replaying from the start (the seeded initial weights)"));
            None
        }
    };
    let (mut model, mut optimizer, state): (LanguageModel<B>, _, _) = match &start {
        Some(dir) => {
            let state = checkpoint::load_state(dir)?;
            let model = checkpoint::load_model(dir, init(device)?, device)?;
            let optimizer = AdamWGroups::new(&config.optimizer, &model);
            (model, checkpoint::load_optimizer(dir, optimizer, device)?, state)
        }
        None => {
            // As the run began: weights from the seed (or `init_from`), step 0, no moments.
            let mut model = crate::step::init::seeded_model(config, device)?;
            if let Some(path) = &config.init_from {
                model = ember_model::hf::load(model, path)?;
            }
            let optimizer = AdamWGroups::new(&config.optimizer, &model);
            (model, optimizer, initial_state(config, &data))
        }
    };
    check_data(&data, state.data_tokens, config)?;
    let world_size = state.world_size;
    let mut feeds = (0..world_size)
        .map(|rank| Feed::start(data.clone(), config, state.sampler, rank, world_size))
        .collect::<Result<Vec<_>, _>>()?;
    let mut sentinel = Sentinel::new(config.sentinel.clone(), state.sentinel.clone());
    // For fp16-mixed, the loss scaler as it was at the checkpoint.
    let mut scaler = LossScaler::for_run(config.precision, state.loss_scaler.as_ref());
    let schedule = LrSchedule::from_config(&config.optimizer, config.max_steps);
    log(&format!(
        "replaying from {} (step {}) to step {target} ({})",
        start.as_ref().map_or("the start".into(), |dir| dir.display().to_string()),
        state.step,
        count(world_size, "rank"),
    ));
    for step in state.step + 1..target {
        let mut ranks = Vec::with_capacity(world_size);
        for feed in &mut feeds {
            ranks.push(feed.next_step()?.0.micro_batches);
        }
        // The step as the run took it: precision, loss scale, checkpointing, dropout seed.
        let settings = run_settings(config, step, schedule.lr(step), scaler.as_ref());
        // Ranks 1.. first, each from the step's seed (as every rank seeds its own device).
        let mut others = Vec::new();
        for (rank, batches) in ranks.iter().enumerate().skip(1) {
            B::seed(device, step_seed(config.seed, step));
            let passes = Passes::of_step(&settings, batches, rank, world_size);
            let (grads, nll_sum, tokens) = accumulate_in(&model, batches, passes, device);
            others.push((grads, nll_sum, tokens as u64));
        }
        B::seed(device, step_seed(config.seed, step));
        let mut sync = Gathered { others, world_size };
        let (next, out) =
            train_step(model, &mut optimizer, &ranks[0], settings, &mut sync, Some(&mut sentinel), device)?;
        model = next;
        if let Some(scaler) = scaler.as_mut() {
            scaler.update(!out.overflow);
        }
    }
    // Step `target`: each micro-batch on its own, then the global batch.
    let mut micro_batches = Vec::new();
    let mut total = GradientsAccumulator::new();
    let (mut nll, mut tokens) = (0.0, 0usize);
    // The run's loss multiplier at this step (1 unless fp16-mixed; every rank's micro-batches
    // have one size, so one factor).
    let mut multiplier = 1.0;
    let settings = run_settings(config, target, schedule.lr(target), scaler.as_ref());
    for (rank, feed) in feeds.iter_mut().enumerate() {
        let (data, _) = feed.next_step()?;
        B::seed(device, step_seed(config.seed, target));
        let passes = Passes::of_step(&settings, &data.micro_batches, rank, world_size);
        multiplier = passes.multiplier;
        for (micro_step, (batch, source)) in data.micro_batches.iter().zip(data.sources).enumerate() {
            // Micro-batch `micro_step` alone, with the dropout stream it had in the step.
            let passes = Passes { first_micro_batch: passes.first_micro_batch + micro_step, ..passes };
            let (mut grads, nll_sum, scored) =
                accumulate_in(&model, std::slice::from_ref(batch), passes, device);
            let nll_sum = scalar(nll_sum);
            let norm = grad_norm(&model, &mut grads, scored as f64 * multiplier);
            total.accumulate(&model, grads);
            nll += nll_sum;
            tokens += scored;
            micro_batches.push(MicroBatchReport {
                rank,
                micro_step,
                source,
                scored_tokens: scored,
                loss: nll_sum / scored.max(1) as f64,
                grad_norm: norm,
                previews: previews(batch, &tokenizer),
            });
        }
    }
    let loss = nll / tokens.max(1) as f64;
    let grad_norm = grad_norm(&model, &mut total.grads(), tokens as f64 * multiplier);
    let judgement = sentinel.judge(loss, grad_norm);
    Ok(ReplayReport {
        run_dir: run_dir.into(),
        step: target,
        checkpoint: start,
        from_step: state.step,
        world_size,
        lr: schedule.lr(target),
        loss,
        grad_norm,
        judgement,
        micro_batches,
    })
}

/// The settings `ember train` gave step `step` of the run of `config` (at learning rate `lr`,
/// with the loss scaler as it was then).
fn run_settings(config: &RunConfig, step: u64, lr: f64, scaler: Option<&LossScaler>) -> StepSettings {
    StepSettings {
        precision: config.precision.mode(),
        loss_scale: LossScaler::scale_of(scaler),
        checkpointing: config.activation_checkpointing.mode(),
        dropout_seed: step_seed(config.seed, step),
        ..StepSettings::new(step, lr, config.optimizer.grad_clip)
    }
}

/// The L2 norm of `∇ Σ NLL ÷ tokens`, given `grads = multiplier · ∇ Σ NLL` and `divisor =
/// tokens · multiplier` (measured, not changed).
fn grad_norm<B: AutodiffBackend>(model: &LanguageModel<B>, grads: &mut GradientsParams, divisor: f64) -> f64 {
    scalar(clip_grad_norm(model, grads, 0.0)) / divisor.max(f64::MIN_POSITIVE)
}

/// The state a run starts from: step 0, the data's first epoch, as many ranks as configured.
fn initial_state(config: &RunConfig, data: &PreparedData) -> TrainState {
    TrainState {
        version: CHECKPOINT_VERSION,
        step: 0,
        tokens: 0,
        elapsed_s: 0.0,
        seed: config.seed,
        sampler: Default::default(),
        data_tokens: (data.meta.train_tokens, data.meta.total_tokens - data.meta.train_tokens),
        world_size: config.world_size(),
        sentinel: Default::default(),
        loss_scaler: None,
    }
}

/// The data must be the run's: the same token counts as the checkpoint's.
fn check_data(data: &PreparedData, saved: (u64, u64), config: &RunConfig) -> Result<(), TrainError> {
    let now = (data.meta.train_tokens, data.meta.total_tokens - data.meta.train_tokens);
    if now != saved {
        return Err(TrainError::Replay(format!(
            "the prepared data {} has {now:?} train/val tokens, the run's checkpoint {saved:?}: replay needs the run's data (`data` in {})",
            data.dir.display(),
            config.origin.path.display()
        )));
    }
    Ok(())
}

/// The first 60 characters of each row's text, control characters escaped.
fn previews(batch: &Batch, tokenizer: &Tokenizer) -> Vec<String> {
    (0..batch.batch_size)
        .map(|row| {
            let ids = &batch.inputs[row * batch.seq_len..][..batch.seq_len.min(64)];
            let text = tokenizer.decode(ids).unwrap_or_else(|e| format!("(cannot decode: {e})"));
            let escaped = text.chars().flat_map(|c| match c.is_control() {
                true => c.escape_debug().collect::<Vec<_>>(),
                false => vec![c],
            });
            escaped.take(60).collect()
        })
        .collect()
}

/// The other ranks' contributions, computed beforehand in this process, added to rank 0's.
struct Gathered<B: AutodiffBackend> {
    others: Vec<(GradientsParams, Tensor<B::InnerBackend, 1>, u64)>,
    world_size: usize,
}

impl<B: AutodiffBackend> GradSync<B> for Gathered<B> {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn exchange(
        &mut self,
        model: &LanguageModel<B>,
        local: Contribution<B>,
    ) -> Result<Exchanged<B>, TrainError> {
        let mut grads = GradientsAccumulator::new();
        grads.accumulate(model, local.grads);
        let (mut nll_sum, mut tokens) = (local.nll_sum, local.tokens);
        for (g, nll, t) in self.others.drain(..) {
            grads.accumulate(model, g);
            nll_sum = nll_sum + nll;
            tokens += t;
        }
        Ok(Exchanged {
            grads: grads.grads(),
            nll_sum,
            tokens,
            stop: false,
            checkpoint: false,
            hashes_agree: None,
        })
    }

    /// Replay updates every parameter on rank 0 (sharding the optimizer state changes no
    /// number), so nothing is gathered.
    fn gather(&mut self, _: Tensor<B::InnerBackend, 1>) -> Result<Tensor<B::InnerBackend, 1>, TrainError> {
        Err(TrainError::Exchange { rank: 0, message: "a replay does not shard the optimizer state".into() })
    }

    fn abort(&mut self, _: usize) {}

    fn all_reduce_calls(&self) -> usize {
        0
    }

    fn bytes_per_exchange(&self, _: usize) -> usize {
        0
    }

    fn strategy(&self) -> String {
        format!("{} ranks replayed in one process", self.world_size)
    }
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "step {} of {} (replayed from {}, step {}; {}; f32)",
            self.step,
            self.run_dir.display(),
            self.checkpoint.as_ref().map_or("the start".into(), |dir| dir.display().to_string()),
            self.from_step,
            count(self.world_size, "rank"),
        )?;
        let j = &self.judgement;
        write!(
            f,
            "global batch: loss {:.6} | grad norm {:.6} | lr {:.3e}",
            self.loss, self.grad_norm, self.lr
        )?;
        if let Some(z) = j.zscore {
            write!(f, " | z-score {z:.2}")?;
        }
        match (j.anomaly, j.skipped) {
            (Some(a), true) => writeln!(f, " | sentinel: {a}, skipped")?,
            (Some(a), false) => writeln!(f, " | sentinel: {a}, marked")?,
            (None, _) => writeln!(f, " | sentinel: ok")?,
        }
        for m in &self.micro_batches {
            writeln!(
                f,
                "rank {} micro-batch {}: loss {:.6} | grad norm {:.6} | {} | epoch {} rows {:?}",
                m.rank,
                m.micro_step,
                m.loss,
                m.grad_norm,
                crate::observe::words::count(m.scored_tokens, "scored token"),
                m.source.epoch,
                m.source.rows
            )?;
            for (row, text) in m.source.rows.iter().zip(&m.previews) {
                writeln!(f, "    row {row:>8}: \"{text}\"")?;
            }
        }
        Ok(())
    }
}
