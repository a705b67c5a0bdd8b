//! What the dashboard shows, built from `metrics.jsonl` records and log lines; no drawing.

use std::collections::VecDeque;

use ember_train::observe::accounting::Estimate;
use ember_train::observe::events::EventRecord;
use ember_train::observe::metrics::{EvalRecord, Record, TrainRecord};

/// Points kept per curve; when full, every other point is dropped (the curve keeps its shape
/// at half the resolution), so memory and drawing time stay bounded for any run length.
pub const MAX_POINTS: usize = 512;

/// Log lines kept.
pub const MAX_LOG_LINES: usize = 200;

/// A curve against step (and tokens), decimated to at most [`MAX_POINTS`] points.
#[derive(Clone, Debug, Default)]
pub struct Series {
    /// `(step, tokens, value)`.
    pub points: Vec<(f64, f64, f64)>,
    /// Keep one sample in `stride`.
    stride: u64,
    seen: u64,
}

impl Series {
    /// Adds a sample (kept when it falls on the current stride).
    pub fn push(&mut self, step: f64, tokens: f64, value: f64) {
        self.stride = self.stride.max(1);
        if self.seen.is_multiple_of(self.stride) {
            self.points.push((step, tokens, value));
            if self.points.len() > MAX_POINTS {
                self.points = self.points.iter().copied().step_by(2).collect();
                self.stride *= 2;
            }
        }
        self.seen += 1;
    }

    /// `(x, value)` with x = step or tokens.
    pub fn xy(&self, by_tokens: bool) -> Vec<(f64, f64)> {
        self.points.iter().map(|&(s, t, v)| (if by_tokens { t } else { s }, v)).collect()
    }
}

/// The chart on display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// Train and validation loss.
    Loss,
    /// Learning rate.
    LearningRate,
    /// Pre-clip gradient norm.
    GradNorm,
    /// Tokens per second.
    Throughput,
}

impl View {
    /// The next view (tab / right arrow).
    pub fn next(self) -> Self {
        match self {
            View::Loss => View::LearningRate,
            View::LearningRate => View::GradNorm,
            View::GradNorm => View::Throughput,
            View::Throughput => View::Loss,
        }
    }

    /// The previous view (left arrow).
    pub fn previous(self) -> Self {
        self.next().next().next()
    }

    /// Its title.
    pub fn title(self) -> &'static str {
        match self {
            View::Loss => "loss (nats/token): train, val",
            View::LearningRate => "learning rate",
            View::GradNorm => "gradient norm (before clipping)",
            View::Throughput => "tokens/s",
        }
    }
}

/// What a key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing beyond the dashboard's own state.
    None,
    /// `q`: stop gracefully (training: after a checkpoint; watching: leave).
    Quit,
    /// `s`: checkpoint now.
    Checkpoint,
    /// `p`: pause or resume training.
    TogglePause,
}

/// The run as the dashboard knows it.
#[derive(Clone, Debug)]
pub struct Dashboard {
    /// Title: run directory and model.
    pub title: String,
    /// One line of configuration.
    pub summary: String,
    /// Optimizer steps of the run.
    pub max_steps: u64,
    /// Data-parallel ranks.
    pub world_size: usize,
    /// The accounting estimate, when the config could be read.
    pub estimate: Option<Estimate>,
    /// Training loss per logged step.
    pub loss: Series,
    /// Validation loss per evaluation.
    pub val_loss: Series,
    /// Learning rate per logged step.
    pub lr: Series,
    /// Gradient norm per logged step.
    pub grad_norm: Series,
    /// Tokens/s per logged step.
    pub throughput: Series,
    /// The newest training record.
    pub last: Option<TrainRecord>,
    /// The newest evaluation.
    pub last_eval: Option<EvalRecord>,
    /// The stability sentinel's latest event.
    pub last_event: Option<EventRecord>,
    /// Recent log lines.
    pub logs: VecDeque<String>,
    /// The chart on display.
    pub view: View,
    /// X axis in tokens instead of steps.
    pub by_tokens: bool,
    /// The key help is open.
    pub help: bool,
    /// Training is paused (`p`).
    pub paused: bool,
    /// The run ended (and how), when known.
    pub finished: Option<String>,
    /// Whether keys act on a training run (else the dashboard only watches files).
    pub controls_training: bool,
    /// Frames drawn, and the seconds spent drawing them (the dashboard's own cost).
    pub frames: (u64, f64),
}

impl Dashboard {
    /// An empty dashboard.
    pub fn new(
        title: String,
        summary: String,
        max_steps: u64,
        world_size: usize,
        estimate: Option<Estimate>,
    ) -> Self {
        Self {
            title,
            summary,
            max_steps,
            world_size,
            estimate,
            loss: Series::default(),
            val_loss: Series::default(),
            lr: Series::default(),
            grad_norm: Series::default(),
            throughput: Series::default(),
            last: None,
            last_eval: None,
            last_event: None,
            logs: VecDeque::new(),
            view: View::Loss,
            by_tokens: false,
            help: false,
            paused: false,
            finished: None,
            controls_training: false,
            frames: (0, 0.0),
        }
    }

    /// Takes one `metrics.jsonl` record.
    pub fn push(&mut self, record: Record) {
        match record {
            Record::Train(r) => {
                let (step, tokens) = (r.step as f64, r.tokens as f64);
                self.loss.push(step, tokens, r.loss);
                self.lr.push(step, tokens, r.lr);
                self.grad_norm.push(step, tokens, r.grad_norm);
                self.throughput.push(step, tokens, r.tokens_per_sec);
                self.last = Some(r);
            }
            Record::Eval(e) => {
                let tokens = self.last.as_ref().map_or(0.0, |r| r.tokens as f64);
                self.val_loss.push(e.step as f64, tokens, e.val_loss);
                self.last_eval = Some(e);
            }
            Record::Event(e) => self.last_event = Some(e),
        }
    }

    /// Takes one log line.
    pub fn log(&mut self, line: &str) {
        self.logs.push_back(line.to_string());
        while self.logs.len() > MAX_LOG_LINES {
            self.logs.pop_front();
        }
    }

    /// Acts on a key (a character, or `"tab"`, `"left"`, `"right"`, `"esc"`).
    pub fn key(&mut self, key: &str) -> Action {
        match key {
            "q" => Action::Quit,
            "s" => Action::Checkpoint,
            "p" if self.controls_training => {
                self.paused = !self.paused;
                Action::TogglePause
            }
            "tab" | "right" => {
                self.view = self.view.next();
                Action::None
            }
            "left" => {
                self.view = self.view.previous();
                Action::None
            }
            "t" => {
                self.by_tokens = !self.by_tokens;
                Action::None
            }
            "?" => {
                self.help = !self.help;
                Action::None
            }
            "esc" => {
                self.help = false;
                Action::None
            }
            _ => Action::None,
        }
    }

    /// The newest step of any record read so far.
    pub fn newest_step(&self) -> Option<u64> {
        let train = self.last.as_ref().map(|r| r.step);
        let eval = self.last_eval.as_ref().map(|e| e.step);
        train.max(eval)
    }

    /// Seconds to `max_steps` at the newest step rate, when known.
    pub fn eta_s(&self) -> Option<f64> {
        let r = self.last.as_ref()?;
        let tokens_per_step = r.tokens as f64 / r.step.max(1) as f64;
        let steps_per_s = r.tokens_per_sec / tokens_per_step.max(1.0);
        (steps_per_s > 0.0).then(|| self.max_steps.saturating_sub(r.step) as f64 / steps_per_s)
    }

    /// Optimizer steps per second at the newest record.
    pub fn steps_per_s(&self) -> Option<f64> {
        let r = self.last.as_ref()?;
        let tokens_per_step = r.tokens as f64 / r.step.max(1) as f64;
        Some(r.tokens_per_sec / tokens_per_step.max(1.0))
    }

    /// The newest step's time split: `(name, seconds)` for data wait, forward, backward,
    /// gradient sync, optimizer, and the evaluation and checkpoint time since the previous
    /// record. A record written before forward and backward were timed apart gives one
    /// `fwd+bwd` phase instead.
    pub fn phases(&self) -> Vec<(&'static str, f64)> {
        let Some(r) = &self.last else { return Vec::new() };
        let mut phases = vec![("data", r.data_s)];
        if r.forward_s > 0.0 || r.backward_s > 0.0 {
            phases.extend([("fwd", r.forward_s), ("bwd", r.backward_s)]);
        } else {
            phases.push(("fwd+bwd", r.forward_backward_s));
        }
        phases.extend([
            ("sync", r.step_sync_s),
            ("optim", r.optimizer_s),
            ("eval", r.eval_s),
            ("ckpt", r.checkpoint_s),
        ]);
        phases
    }

    /// What bounds the newest logged step: the largest of data wait, compute (forward and
    /// backward together), gradient sync and optimizer; `None` before a timed record.
    pub fn bound(&self) -> Option<&'static str> {
        let r = self.last.as_ref()?;
        let compute = if r.forward_s > 0.0 || r.backward_s > 0.0 {
            r.forward_s + r.backward_s
        } else {
            r.forward_backward_s
        };
        [("data", r.data_s), ("compute", compute), ("sync", r.step_sync_s), ("optimizer", r.optimizer_s)]
            .into_iter()
            .filter(|p| p.1 > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|p| p.0)
    }
}
