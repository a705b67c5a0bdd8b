//! `RUN_DIR/metrics.jsonl`: one JSON object per logged step, and the matching log lines.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// A training record (`"kind": "train"`), written every `log_every` optimizer steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainRecord {
    /// Optimizer step, from 1.
    pub step: u64,
    /// Mean NLL of this step's global batch, nats/token.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Learning rate used by this step.
    pub lr: f64,
    /// Global gradient L2 norm before clipping.
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
    /// On CUDA: bytes held by live tensors in node 0's device pool at this step (`null`
    /// elsewhere); see [`super::device`].
    #[serde(default)]
    pub device_in_use_bytes: Option<u64>,
    /// On CUDA: bytes node 0's device pool has reserved from the driver.
    #[serde(default)]
    pub device_reserved_bytes: Option<u64>,
    /// The 64-bit parameter hash compared at this step (16 hex digits; `null` when not
    /// compared).
    #[serde(default)]
    pub param_hash: Option<String>,
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
    /// Mean NLL over the validation batches, nats/token.
    pub val_loss: f64,
    /// `exp(val_loss)`.
    pub val_perplexity: f64,
    /// Wall-clock seconds since the run started.
    pub elapsed_s: f64,
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
}

impl Record {
    /// The optimizer step of the record.
    pub fn step(&self) -> u64 {
        match self {
            Record::Train(r) => r.step,
            Record::Eval(r) => r.step,
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
    /// Opens (creating) `path` for appending.
    pub fn open(path: &Path) -> Result<Self, TrainError> {
        let file = OpenOptions::new().create(true).append(true).open(path).map_err(TrainError::io(path))?;
        Ok(Self { path: path.into(), file })
    }

    /// Appends one record.
    pub fn write(&mut self, record: &Record) -> Result<(), TrainError> {
        let line = serde_json::to_string(record).expect("records serialize to JSON");
        writeln!(self.file, "{line}").and_then(|_| self.file.flush()).map_err(TrainError::io(&self.path))
    }
}

/// Reads every record of a `metrics.jsonl`.
///
/// Errors: unreadable file; a line that is not a record (names the line number).
pub fn read_records(path: &Path) -> Result<Vec<Record>, TrainError> {
    let file = File::open(path).map_err(TrainError::io(path))?;
    let mut records = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(TrainError::io(path))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line).map_err(|e| TrainError::Checkpoint {
            path: path.into(),
            message: format!("line {}: not a metrics record: {e}", i + 1),
        })?;
        records.push(record);
    }
    Ok(records)
}

/// Drops the records of steps after `step` (they are redone when a run resumes from the
/// checkpoint of `step`). Atomic: writes a temporary file and renames it over `path`.
pub fn truncate_after(path: &Path, step: u64) -> Result<(), TrainError> {
    if !path.exists() {
        return Ok(());
    }
    let kept: Vec<Record> = read_records(path)?.into_iter().filter(|r| r.step() <= step).collect();
    let text: String =
        kept.iter().map(|r| serde_json::to_string(r).expect("records serialize to JSON") + "\n").collect();
    Ok(ember_data::write_atomic(path, text.as_bytes())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(step: u64) -> Record {
        Record::Train(TrainRecord {
            step,
            loss: 2.0,
            perplexity: 2f64.exp(),
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_sec: 1000.0,
            data_wait_frac: 0.001,
            sync_s: 0.0,
            allreduce_bytes: 0,
            allreduce: "none (1 rank)".into(),
            replicas_agree: None,
            param_hash: None,
            allreduce_calls: 0,
            forward_backward_s: 0.0,
            optimizer_s: 0.0,
            data_s: 0.0,
            step_sync_s: 0.0,
            eval_s: 0.0,
            checkpoint_s: 0.0,
            mfu: None,
            rss_bytes: None,
            device_in_use_bytes: None,
            device_reserved_bytes: None,
            tokens: step * 10,
            elapsed_s: step as f64,
        })
    }

    #[test]
    fn records_have_the_stable_field_names() {
        let json = serde_json::to_value(train(3)).unwrap();
        for key in ["step", "loss", "lr", "grad_norm", "tokens_per_sec"] {
            assert!(json.get(key).is_some(), "missing {key} in {json}");
        }
        assert_eq!(json["kind"], "train");
        let eval =
            Record::Eval(EvalRecord { step: 4, val_loss: 1.5, val_perplexity: 1.5f64.exp(), elapsed_s: 1.0 });
        let json = serde_json::to_value(eval).unwrap();
        assert_eq!(
            (json["kind"].as_str(), json["step"].as_u64(), json["val_loss"].as_f64()),
            (Some("eval"), Some(4), Some(1.5))
        );
    }

    #[test]
    fn truncate_after_keeps_earlier_records_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut log = MetricsLog::open(&path).unwrap();
        for step in 1..=5 {
            log.write(&train(step)).unwrap();
        }
        truncate_after(&path, 3).unwrap();
        let steps: Vec<u64> = read_records(&path).unwrap().iter().map(Record::step).collect();
        assert_eq!(steps, vec![1, 2, 3]);
    }
}
