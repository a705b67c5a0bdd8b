//! Sentinel events: one `metrics.jsonl` record (`"kind": "event"`) per step the stability
//! sentinel flagged — a non-finite loss or gradient norm, or a loss spike.

use std::fmt;

use ember_data::BatchSource;
use serde::{Deserialize, Serialize};

/// What was wrong with a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Anomaly {
    /// The global batch's mean loss is NaN or ±∞.
    NonfiniteLoss,
    /// The gradient's global L2 norm is NaN or ±∞ (the loss is finite).
    NonfiniteGradNorm,
    /// The loss's z-score exceeds `sentinel.spike_zscore`.
    Spike,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Anomaly::NonfiniteLoss => "non-finite loss",
            Anomaly::NonfiniteGradNorm => "non-finite gradient norm",
            Anomaly::Spike => "loss spike",
        })
    }
}

/// What the run did about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Recorded; the update was applied.
    Marked,
    /// The update was skipped: weights and optimizer moments unchanged.
    Skipped,
    /// The update was skipped and the run stopped with a checkpoint of the last good state.
    Stopped,
}

/// An event record (`"kind": "event"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// The optimizer step, from 1.
    pub step: u64,
    /// What was wrong.
    pub event: Anomaly,
    /// What the run did.
    pub action: Action,
    /// The offending value as text (`NaN`, `inf`, `-inf`, or the spiking loss): JSON has no NaN.
    pub value: String,
    /// The step's mean loss, nats/token (`null` when not finite).
    pub loss: Option<f64>,
    /// The step's pre-clip gradient norm (`null` when not finite).
    pub grad_norm: Option<f64>,
    /// The loss's z-score against the sentinel's window (`null` before the window is full).
    pub zscore: Option<f64>,
    /// Steps skipped in a row, this one included.
    pub skipped_in_a_row: u64,
    /// Where rank 0's micro-batches of the step came from (the other ranks' rows follow from
    /// the seed; `ember replay` shows every rank's).
    pub sources: Vec<BatchSource>,
    /// Wall-clock seconds since the run started.
    pub elapsed_s: f64,
}

impl fmt::Display for EventRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "event {:>5} | {} {}", self.step, self.event, self.value)?;
        if let Some(z) = self.zscore {
            write!(f, " (z {z:.1})")?;
        }
        let rows: Vec<String> =
            self.sources.iter().map(|s| format!("epoch {} rows {:?}", s.epoch, s.rows)).collect();
        match self.action {
            Action::Marked => write!(f, " | marked")?,
            Action::Skipped => write!(f, " | skipped ({} in a row)", self.skipped_in_a_row)?,
            Action::Stopped => write!(f, " | skipped ({} in a row), stopping", self.skipped_in_a_row)?,
        }
        write!(f, " | {}", rows.join("; "))
    }
}

/// `x` as text, `NaN`/`inf`/`-inf` included.
pub fn value_text(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_stable_field_names_and_no_nan_in_json() {
        let record = EventRecord {
            step: 7,
            event: Anomaly::NonfiniteLoss,
            action: Action::Skipped,
            value: value_text(f64::NAN),
            loss: None,
            grad_norm: Some(1.5),
            zscore: None,
            skipped_in_a_row: 1,
            sources: vec![BatchSource { epoch: 0, rows: vec![3, 9] }],
            elapsed_s: 1.0,
        };
        let json = serde_json::to_string(&record).unwrap();
        assert_eq!(
            json,
            r#"{"step":7,"event":"nonfinite_loss","action":"skipped","value":"NaN","loss":null,"grad_norm":1.5,"zscore":null,"skipped_in_a_row":1,"sources":[{"epoch":0,"rows":[3,9]}],"elapsed_s":1.0}"#
        );
        assert_eq!(serde_json::from_str::<EventRecord>(&json).unwrap(), record);
        assert_eq!(value_text(f64::NEG_INFINITY), "-inf");
    }
}
