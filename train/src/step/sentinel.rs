//! The stability sentinel: judges every optimizer step's loss and gradient norm before the
//! update is applied. A non-finite value skips the update (weights and both AdamW moments stay
//! as they were); a loss far above the recent ones is a spike, marked or skipped; too many
//! skipped steps in a row stop the run.
//!
//! Spike detection follows llm.c's `OutlierDetector` (`llmc/outlier_detector.h`): the z-score
//! of the loss against the mean and (population) standard deviation of a sliding window of
//! the previous losses, undefined until the window is full.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::config::{OnNonFinite, SentinelConfig, SpikeAction};
pub use crate::observe::events::Anomaly;

/// The sentinel's verdict on one step.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    /// The step's mean loss, nats/token (as read, possibly non-finite).
    pub loss: f64,
    /// The step's global gradient norm before clipping (as read, possibly non-finite).
    pub grad_norm: f64,
    /// `(loss − μ) / σ` over the window of previous losses; `None` until the window is full.
    pub zscore: Option<f64>,
    /// What was wrong, if anything.
    pub anomaly: Option<Anomaly>,
    /// The update was not applied.
    pub skipped: bool,
}

/// The sentinel's running state, saved in checkpoints so a resumed run judges as the
/// uninterrupted one would.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SentinelState {
    /// Losses of the last applied steps, oldest first (at most `spike_window`).
    pub recent_losses: VecDeque<f64>,
    /// Steps skipped since the last applied one.
    pub skipped_in_a_row: u64,
    /// Steps skipped in the whole run.
    pub skipped_steps: u64,
    /// Spikes detected in the whole run (marked or skipped).
    pub spikes: u64,
}

/// The sentinel of one replica. Every rank judges the same global loss and gradient norm, so
/// every rank reaches the same verdicts without communicating.
#[derive(Clone, Debug)]
pub struct Sentinel {
    config: SentinelConfig,
    /// The running state.
    pub state: SentinelState,
}

impl Sentinel {
    /// A sentinel with `config`, continuing from `state` (default for a new run).
    pub fn new(config: SentinelConfig, state: SentinelState) -> Self {
        Self { config, state }
    }

    /// Judges a step with mean loss `loss` (nats/token) and pre-clip gradient norm `grad_norm`,
    /// and records the verdict in the state.
    pub fn judge(&mut self, loss: f64, grad_norm: f64) -> Judgement {
        let judgement = self.verdict(loss, grad_norm);
        self.record(&judgement);
        judgement
    }

    /// The verdict [`Self::judge`] gives, without recording it.
    pub fn verdict(&self, loss: f64, grad_norm: f64) -> Judgement {
        let zscore = if loss.is_finite() { self.zscore(loss) } else { None };
        let (anomaly, skipped) = if !loss.is_finite() {
            (Some(Anomaly::NonfiniteLoss), true)
        } else if !grad_norm.is_finite() {
            (Some(Anomaly::NonfiniteGradNorm), true)
        } else if self.config.spike_zscore > 0.0 && zscore.is_some_and(|z| z > self.config.spike_zscore) {
            (Some(Anomaly::Spike), self.config.spike_action == SpikeAction::Skip)
        } else {
            (None, false)
        };
        Judgement { loss, grad_norm, zscore, anomaly, skipped }
    }

    /// Records a verdict reached elsewhere (by the device's sentinel,
    /// [`super::device_sentinel`]) in the state, as [`Self::judge`] records its own.
    pub fn record(&mut self, judgement: &Judgement) {
        let s = &mut self.state;
        if judgement.anomaly == Some(Anomaly::Spike) {
            s.spikes += 1;
        }
        if judgement.skipped {
            s.skipped_in_a_row += 1;
            s.skipped_steps += 1;
        } else {
            s.skipped_in_a_row = 0;
            if s.recent_losses.len() == self.config.spike_window {
                s.recent_losses.pop_front();
            }
            s.recent_losses.push_back(judgement.loss);
        }
    }

    /// The settings this sentinel judges by.
    pub fn config(&self) -> &SentinelConfig {
        &self.config
    }

    /// Why the run must stop after the step just judged (`judgement`), if it must:
    /// `on_nonfinite = "stop"` and a non-finite step, or `max_skipped_steps` skipped in a row.
    pub fn stop_reason(&self, judgement: &Judgement) -> Option<String> {
        let nonfinite =
            matches!(judgement.anomaly, Some(Anomaly::NonfiniteLoss | Anomaly::NonfiniteGradNorm));
        if nonfinite && self.config.on_nonfinite == OnNonFinite::Stop {
            return Some(format!(
                "a non-finite {} (sentinel.on_nonfinite = \"stop\")",
                if judgement.anomaly == Some(Anomaly::NonfiniteLoss) { "loss" } else { "gradient norm" }
            ));
        }
        let limit = self.config.max_skipped_steps;
        (self.state.skipped_in_a_row >= limit).then(|| match limit {
            1 => format!("1 step was skipped (sentinel.max_skipped_steps = {limit})"),
            _ => format!("{limit} steps in a row were skipped (sentinel.max_skipped_steps = {limit})"),
        })
    }

    /// The z-score of `loss` against the window, once it is full and its spread is not 0.
    fn zscore(&self, loss: f64) -> Option<f64> {
        let window = &self.state.recent_losses;
        if window.len() < self.config.spike_window {
            return None;
        }
        let n = window.len() as f64;
        let mean = window.iter().sum::<f64>() / n;
        let variance = window.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        (variance > 0.0).then(|| (loss - mean) / variance.sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(overrides: impl FnOnce(&mut SentinelConfig)) -> Sentinel {
        let mut config = SentinelConfig { spike_window: 4, ..SentinelConfig::default() };
        overrides(&mut config);
        Sentinel::new(config, SentinelState::default())
    }

    #[test]
    fn zscore_is_against_the_full_window_by_hand() {
        let mut s = sentinel(|c| c.spike_zscore = 3.0);
        for loss in [1.0, 2.0, 3.0] {
            assert_eq!(s.judge(loss, 1.0).zscore, None, "window not full yet");
        }
        s.judge(4.0, 1.0);
        // Window [1, 2, 3, 4]: mean 2.5, population variance 1.25, σ = 1.1180…
        let j = s.judge(6.0, 1.0);
        assert!((j.zscore.unwrap() - 3.5 / 1.25f64.sqrt()).abs() < 1e-12, "{j:?}");
        assert_eq!((j.anomaly, j.skipped), (Some(Anomaly::Spike), false), "3.13 > 3: marked, applied");
        assert_eq!(s.state.spikes, 1);
        // The marked spike entered the window: [2, 3, 4, 6].
        assert_eq!(s.state.recent_losses, [2.0, 3.0, 4.0, 6.0]);
    }

    #[test]
    fn skipped_spikes_stay_out_of_the_window_and_count_as_skipped() {
        let mut s = sentinel(|c| {
            c.spike_zscore = 1.0;
            c.spike_action = SpikeAction::Skip;
            c.max_skipped_steps = 2;
        });
        for loss in [1.0, 1.0, 1.0, 3.0] {
            s.judge(loss, 1.0);
        }
        // [1, 1, 1, 3]: mean 1.5, σ = √0.75; 10 is z ≈ 9.8.
        let j = s.judge(10.0, 1.0);
        assert!(j.skipped);
        assert_eq!(s.state.recent_losses, [1.0, 1.0, 1.0, 3.0]);
        assert_eq!(s.stop_reason(&j), None);
        let j = s.judge(10.0, 1.0);
        assert_eq!((s.state.skipped_in_a_row, s.state.skipped_steps), (2, 2));
        assert!(s.stop_reason(&j).unwrap().contains("2 steps in a row"), "{:?}", s.stop_reason(&j));
    }

    #[test]
    fn nonfinite_values_skip_and_reset_after_a_good_step() {
        let mut s = sentinel(|_| {});
        let j = s.judge(f64::NAN, 1.0);
        assert_eq!((j.anomaly, j.skipped), (Some(Anomaly::NonfiniteLoss), true));
        let j = s.judge(2.0, f64::INFINITY);
        assert_eq!((j.anomaly, j.skipped), (Some(Anomaly::NonfiniteGradNorm), true));
        assert_eq!(s.state.skipped_in_a_row, 2);
        assert_eq!(s.stop_reason(&j), None, "5 allowed in a row by default");
        let j = s.judge(2.0, 1.0);
        assert_eq!((j.anomaly, j.skipped), (None, false));
        assert_eq!((s.state.skipped_in_a_row, s.state.skipped_steps), (0, 2));
        assert!(s.state.recent_losses.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn stop_mode_stops_at_the_first_nonfinite_step() {
        let mut s = sentinel(|c| c.on_nonfinite = OnNonFinite::Stop);
        let j = s.judge(1.0, 1.0);
        assert_eq!(s.stop_reason(&j), None);
        let j = s.judge(1.0, f64::NAN);
        assert!(s.stop_reason(&j).unwrap().contains("gradient norm"));
    }

    #[test]
    fn spike_detection_off_by_default() {
        let mut s = sentinel(|_| {});
        for loss in [1.0, 1.0, 1.0, 1.1] {
            s.judge(loss, 1.0);
        }
        let j = s.judge(100.0, 1.0);
        assert!(j.zscore.unwrap() > 100.0);
        assert_eq!((j.anomaly, j.skipped), (None, false));
    }
}
