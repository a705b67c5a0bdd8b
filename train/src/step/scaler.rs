//! Dynamic loss scaling for `fp16-mixed` (Micikevicius et al. 2018, §3.2; PyTorch's
//! `torch.amp.GradScaler` with its defaults): the summed loss is multiplied by the scale before
//! the backward pass, so small gradients do not underflow half precision's 2⁻²⁴; the gradients
//! are divided by it again before clipping, so the clip and the reported norm see the true
//! gradient. A step whose gradient is not finite (it overflowed at this scale) is skipped —
//! weights and AdamW moments untouched — and the scale halves; after
//! [`LossScaler::GROWTH_INTERVAL`] finite steps in a row it doubles.

use serde::{Deserialize, Serialize};

use crate::config::PrecisionKind;

/// The loss scaler's state, saved in checkpoints so a resumed run scales as the uninterrupted
/// one would.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// The factor the loss is multiplied by (a power of two: scaling is exact).
    pub scale: f64,
    /// Finite steps since the scale last changed.
    pub good_steps: u64,
    /// Steps skipped because their gradient overflowed, in the whole run.
    pub overflow_steps: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self { scale: Self::INITIAL, good_steps: 0, overflow_steps: 0 }
    }
}

impl LossScaler {
    /// The first scale, 2¹⁶ (PyTorch's default).
    pub const INITIAL: f64 = 65536.0;
    /// Finite steps in a row after which the scale doubles (PyTorch's default).
    pub const GROWTH_INTERVAL: u64 = 2000;

    /// The scaler of a run in `precision`: `saved` (a checkpoint's) or a fresh one for
    /// fp16-mixed, `None` for the precisions that need no loss scaling.
    pub fn for_run(precision: PrecisionKind, saved: Option<&LossScaler>) -> Option<Self> {
        (precision == PrecisionKind::Fp16Mixed).then(|| saved.cloned().unwrap_or_default())
    }

    /// The loss scale a step uses with `scaler` ([`Self::for_run`]): 1 without one.
    pub fn scale_of(scaler: Option<&LossScaler>) -> f64 {
        scaler.map_or(1.0, |s| s.scale)
    }

    /// Records one step: `finite` false (the step was skipped) halves the scale; the
    /// [`Self::GROWTH_INTERVAL`]-th finite step in a row doubles it.
    pub fn update(&mut self, finite: bool) {
        if finite {
            self.good_steps += 1;
            if self.good_steps == Self::GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
        } else {
            self.scale /= 2.0;
            self.good_steps = 0;
            self.overflow_steps += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_on_overflow_and_doubles_after_2000_good_steps() {
        let mut s = LossScaler::default();
        assert_eq!(s.scale, 65536.0);
        s.update(false);
        assert_eq!((s.scale, s.good_steps, s.overflow_steps), (32768.0, 0, 1));
        for _ in 0..1999 {
            s.update(true);
        }
        assert_eq!((s.scale, s.good_steps), (32768.0, 1999));
        s.update(true);
        assert_eq!((s.scale, s.good_steps, s.overflow_steps), (65536.0, 0, 1));
        // An overflow resets the count of good steps.
        for _ in 0..1500 {
            s.update(true);
        }
        s.update(false);
        s.update(true);
        assert_eq!((s.scale, s.good_steps, s.overflow_steps), (32768.0, 1, 2));
    }
}
