//! `RUN_DIR/metrics.jsonl`: one JSON object per logged step, and the matching log lines.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// A training record (`"kind": "train"`), written every `log_every` optimizer steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainRecord {
    /// Optimizer step, from 1.
    pub step: u64,
    /// Mean NLL of this step's global batch, nats/token (`null` in the file when not finite:
    /// read back as NaN).
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f64,
    /// `exp(loss)` (`null` in the file when it overflows or the loss is not finite: read back
    /// as NaN, as the validation records' are).
    #[serde(deserialize_with = "nan_if_null")]
    pub perplexity: f64,
    /// Learning rate used by this step.
    pub lr: f64,
    /// Global gradient L2 norm before clipping (`null` in the file when not finite: read back
    /// as NaN).
    #[serde(deserialize_with = "nan_if_null")]
    pub grad_norm: f64,
    /// Training throughput since the previous record: tokens / second of step time
    /// (evaluation and checkpoint time excluded).
    pub tokens_per_sec: f64,
    /// Share of the step time since the previous record spent waiting for batches (0–1);
    /// near 0 when the background feed keeps up.
    #[serde(default)]
    pub data_wait_frac: f64,
    /// Mean seconds per step in the gradient exchange since the previous record (0 for one
    /// rank), waiting for slower ranks included.
    #[serde(default)]
    pub sync_s: f64,
    /// Bytes all-reduced per optimizer step (0 for one rank).
    #[serde(default)]
    pub allreduce_bytes: u64,
    /// The all-reduce strategy (`none (1 rank)`, or burn-collective's `tree`, `ring`,
    /// `centralized` with the rank count).
    #[serde(default)]
    pub allreduce: String,
    /// Whether every replica had the same parameters when last compared at this step (`null`
    /// when not compared).
    #[serde(default)]
    pub replicas_agree: Option<bool>,
    /// Gradient all-reduces this rank-0 process has made in this session, up to this step (one
    /// per optimizer step; 0 for a single rank).
    #[serde(default)]
    pub allreduce_calls: u64,
    /// Seconds of the logged step's forward and backward passes (device-synchronized).
    #[serde(default)]
    pub forward_backward_s: f64,
    /// Seconds of the logged step's forward passes, model and loss (a device sync after each;
    /// 0 in records written before forward and backward were timed apart).
    #[serde(default)]
    pub forward_s: f64,
    /// Seconds of the logged step's backward passes and gradient accumulation (a device sync
    /// after each; 0 in older records). `forward_s + backward_s ≈ forward_backward_s`.
    #[serde(default)]
    pub backward_s: f64,
    /// Seconds of the logged step's clipping and optimizer update (device-synchronized).
    #[serde(default)]
    pub optimizer_s: f64,
    /// Seconds of the logged step's wait for data.
    #[serde(default)]
    pub data_s: f64,
    /// Seconds of the logged step's gradient exchange.
    #[serde(default)]
    pub step_sync_s: f64,
    /// Seconds spent evaluating since the previous record.
    #[serde(default)]
    pub eval_s: f64,
    /// Seconds spent writing checkpoints since the previous record.
    #[serde(default)]
    pub checkpoint_s: f64,
    /// Model FLOPs utilization over the interval (`null` when the device's peak is unknown).
    #[serde(default)]
    pub mfu: Option<f64>,
    /// Resident memory of node 0's process at this step, bytes (`null` off Linux).
    #[serde(default)]
    pub rss_bytes: Option<u64>,
    /// On CUDA and wgpu: bytes held by live tensors in node 0's device pool at this step's
    /// high point — the most of the readings after each forward pass and after the backward —
    /// (`null` elsewhere); see [`super::device`].
    #[serde(default)]
    pub device_in_use_bytes: Option<u64>,
    /// On CUDA and wgpu: bytes node 0's device pool has reserved from the driver.
    #[serde(default)]
    pub device_reserved_bytes: Option<u64>,
    /// Bytes of AdamW state (first and second moments) rank 0 holds: 8 B per parameter, or
    /// its shard's with `[parallel] shard_optimizer` (ZeRO-1).
    #[serde(default)]
    pub optimizer_state_bytes: u64,
    /// The 64-bit parameter hash compared at this step (16 hex digits; `null` when not
    /// compared).
    #[serde(default)]
    pub param_hash: Option<String>,
    /// Steps the stability sentinel skipped so far in the run (non-finite, or skipped spikes).
    #[serde(default)]
    pub skipped_steps: u64,
    /// Loss spikes the sentinel detected so far in the run.
    #[serde(default)]
    pub spikes: u64,
    /// fp16-mixed: the loss scale the next step will use; `null` in other precisions.
    #[serde(default)]
    pub loss_scale: Option<f64>,
    /// fp16-mixed: steps skipped so far because their scaled gradient overflowed.
    #[serde(default)]
    pub overflow_steps: u64,
    /// Tokens consumed by the run so far.
    pub tokens: u64,
    /// Wall-clock seconds since the run started (summed across resumes).
    pub elapsed_s: f64,
}

/// An evaluation record (`"kind": "eval"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Optimizer steps done when evaluated (0 = the initial model).
    pub step: u64,
    /// Mean NLL over the validation batches, nats/token (`null` in JSON when not finite: a
    /// diverged model, read back as NaN).
    #[serde(deserialize_with = "nan_if_null")]
    pub val_loss: f64,
    /// `exp(val_loss)` (`null` when not finite).
    #[serde(deserialize_with = "nan_if_null")]
    pub val_perplexity: f64,
    /// Wall-clock seconds since the run started.
    pub elapsed_s: f64,
}

/// A number, or NaN for the `null` that serde_json writes for a non-finite `f64`.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl EvalRecord {
    /// The record of a validation loss of `val_loss` nats/token after `step` steps.
    pub fn new(step: u64, val_loss: f64, elapsed_s: f64) -> Self {
        Self { step, val_loss, val_perplexity: val_loss.exp(), elapsed_s }
    }
}

/// One line of `metrics.jsonl`.
// One record per logged step: boxing the larger variant would save nothing that matters.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// A training step.
    Train(TrainRecord),
    /// An evaluation.
    Eval(EvalRecord),
    /// A step the stability sentinel flagged.
    Event(super::events::EventRecord),
}

impl Record {
    /// The optimizer step of the record.
    pub fn step(&self) -> u64 {
        match self {
            Record::Train(r) => r.step,
            Record::Eval(r) => r.step,
            Record::Event(r) => r.step,
        }
    }
}

impl fmt::Display for TrainRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "step {:>6} | loss {:.4} | ppl {:>8.2} | lr {:.3e} | grad norm {:.4} | {:>8.0} tok/s | data {:>4.1}% | {:>7.1} s",
            self.step,
            self.loss,
            self.perplexity,
            self.lr,
            self.grad_norm,
            self.tokens_per_sec,
            100.0 * self.data_wait_frac,
            self.elapsed_s
        )?;
        if let (Some(in_use), Some(reserved)) = (self.device_in_use_bytes, self.device_reserved_bytes) {
            write!(
                f,
                " | device {:.0} MB in use, {:.0} MB reserved",
                in_use as f64 / 1e6,
                reserved as f64 / 1e6
            )?;
        }
        if let Some(scale) = self.loss_scale {
            write!(f, " | loss scale {scale} ({} overflow steps skipped)", self.overflow_steps)?;
        }
        if self.skipped_steps > 0 || self.spikes > 0 {
            write!(f, " | sentinel: {} skipped, {} spikes", self.skipped_steps, self.spikes)?;
        }
        if self.allreduce_bytes > 0 {
            let step_s = self.sync_s.max(1e-12);
            let mb = self.allreduce_bytes as f64 / 1e6;
            write!(f, " | sync {:.1} ms/step, {mb:.2} MB {}", 1e3 * step_s, self.allreduce)?;
            let hash = self.param_hash.as_deref().unwrap_or("?");
            match self.replicas_agree {
                Some(true) => write!(f, " | params {hash} on every rank")?,
                Some(false) => write!(f, " | params {hash}: REPLICAS DIFFER")?,
                None => {}
            }
        }
        Ok(())
    }
}

impl fmt::Display for EvalRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "eval {:>6} | val loss {:.4} | val ppl {:.2} | {:.1} s",
            self.step, self.val_loss, self.val_perplexity, self.elapsed_s
        )
    }
}

/// Appends records to `metrics.jsonl`, one flushed line each.
pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    /// Opens (creating) `path` for appending (`O_APPEND`: every write lands at the end).
    pub fn open(path: &Path) -> Result<Self, TrainError> {
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(TrainError::io(path))?;
        Ok(Self { path: path.into(), file })
    }

    /// Appends one record as a whole line: the JSON and its `'\n'` in a single write.
    ///
    /// Errors: the write failed (e.g. a full disk), naming the file and keeping the OS cause.
    pub fn write(&mut self, record: &Record) -> Result<(), TrainError> {
        append_line(&mut self.file, record).map_err(TrainError::io(&self.path))
    }
}

/// Writes `record` and its newline to `out` with one `write_all` (so an `O_APPEND` file gets
/// the line in one piece, never interleaved with another writer's), then flushes.
fn append_line(out: &mut dyn Write, record: &Record) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(record).expect("records serialize to JSON");
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// One line of a metrics file: its bytes (with the `'\n'`, if any) and what they hold.
struct Line<'a> {
    bytes: &'a [u8],
    /// 1-based.
    number: usize,
    /// `None` for a blank line.
    record: Option<Result<Record, String>>,
}

impl Line<'_> {
    fn terminated(&self) -> bool {
        self.bytes.ends_with(b"\n")
    }
}

fn lines(bytes: &[u8]) -> Vec<Line<'_>> {
    bytes
        .split_inclusive(|&b| b == b'\n')
        .enumerate()
        .map(|(i, bytes)| {
            let text = bytes.strip_suffix(b"\n").unwrap_or(bytes);
            let blank = text.iter().all(u8::is_ascii_whitespace);
            let record = (!blank).then(|| serde_json::from_slice(text).map_err(|e| e.to_string()));
            Line { bytes, number: i + 1, record }
        })
        .collect()
}

/// The number of the last line, when it is torn: it does not parse as a record and lacks its
/// newline (a write of a record and its `'\n'` cut short by a crash or a full disk). Only the
/// last line may be torn; a bad line elsewhere, or a whole line that is not a record (someone
/// else's text appended), is an error.
fn torn_tail(lines: &[Line]) -> Option<usize> {
    lines.last().filter(|l| !l.terminated() && matches!(l.record, Some(Err(_)))).map(|l| l.number)
}

fn not_a_record(path: &Path, number: usize, error: &str) -> TrainError {
    TrainError::Checkpoint {
        path: path.into(),
        message: format!(
            "line {number}: not a metrics record: {error}. The file is the run's log (checkpoints do not depend on it): correct or delete that line, then resume"
        ),
    }
}

/// Whether `path` is a `metrics.jsonl` of Ember's: nothing but blank lines, or at least one
/// record and every other line blank — or, with `allow_torn`, a torn last line. An unreadable
/// file is not.
pub fn holds_only_records(path: &Path, allow_torn: bool) -> bool {
    let Ok(bytes) = std::fs::read(path) else { return false };
    let lines = lines(&bytes);
    let torn = if allow_torn { torn_tail(&lines) } else { None };
    let bad = lines.iter().any(|l| matches!(l.record, Some(Err(_))) && Some(l.number) != torn);
    let blank = lines.iter().all(|l| l.record.is_none());
    let records = lines.iter().any(|l| matches!(l.record, Some(Ok(_))));
    !bad && (blank || records)
}

/// Reads every record of a `metrics.jsonl`. A torn last line (one that does not parse: a
/// write in progress, or cut short by a crash) is skipped.
///
/// Errors: unreadable file; a line before the last that is not a record (names the line
/// number).
pub fn read_records(path: &Path) -> Result<Vec<Record>, TrainError> {
    let bytes = std::fs::read(path).map_err(TrainError::io(path))?;
    let lines = lines(&bytes);
    let torn = torn_tail(&lines);
    let mut records = Vec::new();
    for line in lines.into_iter().filter(|l| Some(l.number) != torn) {
        match line.record {
            Some(Ok(record)) => records.push(record),
            Some(Err(e)) => return Err(not_a_record(path, line.number, &e)),
            None => {}
        }
    }
    Ok(records)
}

/// Drops the records of steps after `step` (they are redone when a run resumes from the
/// checkpoint of `step`), and a torn last line (with a warning to `log` naming the file and
/// line). Every record kept keeps its original bytes; a last record without its newline gets
/// one. The file is rewritten only if something changes, atomically (temp file, fsync,
/// rename): a crash leaves the old file or the new one.
///
/// Errors: unreadable file; a line before the last that is not a record; the rewrite failed.
pub fn truncate_after(path: &Path, step: u64, log: &mut dyn FnMut(&str)) -> Result<(), TrainError> {
    let bytes = match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        read => read.map_err(TrainError::io(path))?,
    };
    let lines = lines(&bytes);
    let torn = torn_tail(&lines);
    let mut kept = Vec::with_capacity(bytes.len());
    for line in &lines {
        match &line.record {
            Some(Err(e)) if Some(line.number) == torn => log(&format!(
                "{}: line {}: dropped a torn last line (not a whole metrics record: {e}); the run was cut short while writing it",
                path.display(),
                line.number
            )),
            Some(Err(e)) => return Err(not_a_record(path, line.number, e)),
            Some(Ok(record)) if record.step() > step => {}
            Some(Ok(_)) | None => {
                kept.extend_from_slice(line.bytes);
                if !line.terminated() && line.record.is_some() {
                    kept.push(b'\n');
                }
            }
        }
    }
    if kept != bytes {
        ember_data::write_atomic(path, &kept)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
