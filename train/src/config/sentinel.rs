//! `[sentinel]`: what a run does about a non-finite loss or gradient and about loss spikes.

use serde::{Deserialize, Serialize};

/// What a non-finite loss or gradient norm does to its step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnNonFinite {
    /// The update is skipped (weights and both AdamW moments unchanged) and counted; the run
    /// stops after `max_skipped_steps` skipped steps in a row.
    #[default]
    Skip,
    /// The update is skipped and the run stops with a checkpoint of the last good state.
    Stop,
}

/// What a loss spike (z-score above `spike_zscore`) does to its step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpikeAction {
    /// Recorded in `metrics.jsonl` and counted; the update is applied.
    #[default]
    Mark,
    /// Recorded, counted, and the update skipped (as for a non-finite loss).
    Skip,
}

/// The stability sentinel's settings (`[sentinel]`).
///
/// A step's loss `x` is compared with the mean `μ` and standard deviation `σ` of the losses of
/// the last `spike_window` applied steps: `z = (x − μ) / σ` (llm.c's `OutlierDetector`, which
/// uses a window of 128). No z-score is computed before the window is full.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SentinelConfig {
    /// `"skip"` (default) or `"stop"`.
    pub on_nonfinite: OnNonFinite,
    /// Skipped steps in a row (non-finite or skipped spikes) after which the run stops with a
    /// checkpoint of the last good state; at least 1.
    pub max_skipped_steps: u64,
    /// z-score above which a step's loss is a spike; 0 turns spike detection off.
    pub spike_zscore: f64,
    /// `"mark"` (default) or `"skip"`.
    pub spike_action: SpikeAction,
    /// Losses in the running window; at least 2.
    pub spike_window: usize,
    /// Judge each step on the device, gating the AdamW update there, and read the verdicts
    /// back only at logged, checkpointed and last steps (`true`), or read each step's loss and
    /// gradient norm back and judge on the host (`false`). Unset (default): on the device on
    /// every backend but the CPU's (burn-flex, where a read costs nothing), except under
    /// fp16-mixed (whose loss scaler reads each step's gradient norm anyway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_device: Option<bool>,
}

impl Default for SentinelConfig {
    fn default() -> Self {
        Self {
            on_nonfinite: OnNonFinite::Skip,
            max_skipped_steps: 5,
            spike_zscore: 0.0,
            spike_action: SpikeAction::Mark,
            spike_window: 128,
            on_device: None,
        }
    }
}

impl SentinelConfig {
    /// The first key out of range: `(dotted key, message)`.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.max_skipped_steps == 0 {
            return Err(("sentinel.max_skipped_steps", "must be at least 1, got 0".into()));
        }
        if !(self.spike_zscore.is_finite() && self.spike_zscore >= 0.0) {
            let message = format!("must be 0 (off) or a positive z-score, got {}", self.spike_zscore);
            return Err(("sentinel.spike_zscore", message));
        }
        if self.spike_window < 2 {
            let message = format!("must be at least 2 losses, got {}", self.spike_window);
            return Err(("sentinel.spike_window", message));
        }
        Ok(())
    }
}
