//! Learning rate: linear warmup, then cosine decay to a floor (Loshchilov & Hutter 2017,
//! SGDR eq. 5 without restarts; nanoGPT `get_lr`), advanced once per optimizer step.

use std::f64::consts::PI;

use burn::optim::lr_scheduler::LrScheduler;
use burn::tensor::backend::Backend;

use crate::config::OptimizerConfig;

/// The schedule of [`crate::config::OptimizerConfig`], as a pure function of the optimizer step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub peak: f64,
    /// Floor reached at `decay_steps` and held after.
    pub min: f64,
    /// Warmup length in optimizer steps.
    pub warmup_steps: u64,
    /// Step at which the decay ends.
    pub decay_steps: u64,
}

impl LrSchedule {
    /// The schedule of `optimizer` (`lr`, `min_lr`, `warmup_steps`, `lr_decay_steps`), the
    /// decay ending at `max_steps` when `lr_decay_steps` is unset.
    pub fn from_config(optimizer: &OptimizerConfig, max_steps: u64) -> Self {
        Self {
            peak: optimizer.lr,
            min: optimizer.min_lr,
            warmup_steps: optimizer.warmup_steps,
            decay_steps: optimizer.lr_decay_steps.unwrap_or(max_steps),
        }
    }

    /// Learning rate of optimizer step `step` (counted from 1; step 0 is treated as step 1).
    ///
    /// - `step ≤ warmup`: `peak · step / warmup` (step 1 gets `peak/warmup`, never 0);
    /// - `warmup < step < decay_steps`: `min + ½(1 + cos(π·r))·(peak − min)` with
    ///   `r = (step − warmup)/(decay_steps − warmup)`;
    /// - `step ≥ decay_steps`: `min`.
    pub fn lr(&self, step: u64) -> f64 {
        let step = step.max(1);
        if step <= self.warmup_steps {
            return self.peak * step as f64 / self.warmup_steps as f64;
        }
        if step >= self.decay_steps {
            return self.min;
        }
        let ratio = (step - self.warmup_steps) as f64 / (self.decay_steps - self.warmup_steps) as f64;
        let coeff = 0.5 * (1.0 + (PI * ratio).cos());
        self.min + coeff * (self.peak - self.min)
    }
}

/// [`LrSchedule`] as a Burn [`LrScheduler`], for burn-train's `Learner`: each `step()` is one
/// optimizer step and returns that step's rate (the first call gives step 1's). Its record is
/// the number of steps taken, so a burn-train checkpoint resumes the schedule exactly.
///
/// Burn's own strategies call `step()` once per *micro*-batch; [`crate::learner::EmberStrategy`]
/// calls it once per optimizer step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    /// The schedule.
    pub schedule: LrSchedule,
    /// Optimizer steps taken so far.
    pub steps_taken: u64,
}

impl WarmupCosine {
    /// Before the first step.
    pub fn new(schedule: LrSchedule) -> Self {
        Self { schedule, steps_taken: 0 }
    }
}

impl LrScheduler for WarmupCosine {
    type Record<B: Backend> = usize;

    fn step(&mut self) -> f64 {
        self.steps_taken += 1;
        self.schedule.lr(self.steps_taken)
    }

    fn to_record<B: Backend>(&self) -> usize {
        self.steps_taken as usize
    }

    fn load_record<B: Backend>(mut self, record: usize) -> Self {
        self.steps_taken = record as u64;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: LrSchedule = LrSchedule { peak: 1e-3, min: 1e-4, warmup_steps: 100, decay_steps: 2000 };

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-15
    }

    #[test]
    fn warmup_starts_at_peak_over_warmup_and_reaches_peak() {
        assert!(close(S.lr(1), 1e-5));
        assert!(close(S.lr(50), 5e-4));
        assert!(close(S.lr(100), 1e-3));
    }

    #[test]
    fn cosine_is_halfway_mid_decay_and_floors_after() {
        // step 1050: r = 950/1900 = 0.5, cos(π/2) = 0 → min + (peak − min)/2 = 5.5e-4.
        assert!(close(S.lr(1050), 5.5e-4));
        assert!(close(S.lr(2000), 1e-4));
        assert!(close(S.lr(5000), 1e-4));
        assert!(S.lr(101) < 1e-3 && S.lr(101) > 0.999e-3);
    }

    #[test]
    fn the_burn_scheduler_steps_the_schedule_and_resumes_from_its_record() {
        type Flex = burn::backend::Flex;
        let mut scheduler = WarmupCosine::new(S);
        let first: Vec<f64> = (0..3).map(|_| scheduler.step()).collect();
        assert_eq!(first, vec![S.lr(1), S.lr(2), S.lr(3)]);
        let record = LrScheduler::to_record::<Flex>(&scheduler);
        assert_eq!(record, 3);
        let mut resumed = WarmupCosine::new(S).load_record::<Flex>(record);
        assert_eq!(resumed.step(), S.lr(4));
        assert_eq!(scheduler.step(), S.lr(4));
    }

    #[test]
    fn no_warmup_starts_at_peak() {
        let s = LrSchedule { warmup_steps: 0, ..S };
        assert!(close(s.lr(1), 1e-3 - 0.5 * (1.0 - (PI / 2000.0).cos()) * 9e-4));
    }
}
