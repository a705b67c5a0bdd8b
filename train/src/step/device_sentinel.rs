//! The stability sentinel on the device: the verdict on each step is computed from the
//! all-reduced loss and gradient norm as tensor operations, and gates the AdamW update there
//! ([`super::adamw::with_update_gate`]), so a step needs no host read of its loss. The host
//! reads the verdicts later, several steps at once ([`DeviceSentinel::settle`]: at logged,
//! checkpointed and last steps), and records them in the host [`Sentinel`] — which stays the
//! state a checkpoint saves.
//!
//! The rules are the host sentinel's ([`super::sentinel`]; spikes by llm.c's
//! `OutlierDetector`: the z-score of the loss against the mean and population standard
//! deviation of the last `spike_window` applied losses), in f32 on the device. A stop rule that
//! fires (`on_nonfinite = "stop"`, `max_skipped_steps` in a row) latches: every later step is
//! gated off too until the host reads the verdicts and stops the run, so the weights are those
//! of the last applied update, as with the host sentinel.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::record::AdaptorRecord;
use burn::optim::Optimizer;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

use super::adamw::FusedAdamW;
use super::optim::{AdamWGroups, AdamWRecord};
use super::sentinel::{Anomaly, Judgement, Sentinel, SentinelState};
use crate::config::{OnNonFinite, SentinelConfig, SpikeAction};

/// Numbers kept per step for the host: loss, gradient norm, z-score, whether there is one,
/// the anomaly (0 none, 1 non-finite loss, 2 non-finite gradient norm, 3 spike), skipped.
const VERDICT: usize = 6;

/// The sentinel's state as `[1]` (and `[spike_window]`) f32 tensors on the device, and the
/// verdicts not yet read.
pub struct DeviceSentinel<B: Backend> {
    config: SentinelConfig,
    /// `[spike_window]`: the losses of the last applied steps, oldest first; meaningful once
    /// `filled` is `spike_window`.
    window: Tensor<B, 1>,
    /// `[1]`: applied losses in the window (at most `spike_window`).
    filled: Tensor<B, 1>,
    /// `[1]`: steps skipped since the last applied one.
    in_a_row: Tensor<B, 1>,
    /// `[1]`: 1 once a stop rule fired; every later update is gated off.
    stopped: Tensor<B, 1>,
    /// `[1]`: updates gated off since the last [`Self::settle`] (AdamW's step counts include
    /// them until then).
    skipped: Tensor<B, 1>,
    /// Steps judged since the last settle, with their `[VERDICT]` numbers.
    pending: Vec<(u64, Tensor<B, 1>)>,
    /// A settled step already gave a stop reason.
    stop_seen: bool,
}

/// A verdict read back from the device.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    /// The optimizer step.
    pub step: u64,
    /// The verdict, as the host sentinel would have given it.
    pub judgement: Judgement,
    /// The sentinel's skipped-in-a-row count after this step.
    pub skipped_in_a_row: u64,
    /// A stop rule fired at this step (the first such step of the run only).
    pub stop_reason: Option<String>,
}

impl<B: Backend> DeviceSentinel<B> {
    /// A device sentinel with `config`, continuing from the host state `state` (a new run's is
    /// the default), on `device`.
    pub fn new(config: SentinelConfig, state: &SentinelState, device: &B::Device) -> Self {
        let w = config.spike_window;
        let mut window = vec![0f32; w];
        let recent: Vec<f32> = state.recent_losses.iter().rev().take(w).rev().map(|&x| x as f32).collect();
        window[w - recent.len()..].copy_from_slice(&recent);
        let one = |x: f32| Tensor::<B, 1>::from_floats([x], device);
        Self {
            window: Tensor::from_floats(window.as_slice(), device),
            filled: one(recent.len() as f32),
            in_a_row: one(state.skipped_in_a_row as f32),
            stopped: one(0.0),
            skipped: one(0.0),
            pending: Vec::new(),
            stop_seen: false,
            config,
        }
    }

    /// Judges optimizer step `step` from its mean loss and pre-clip gradient norm (`[1]`
    /// tensors, identical on every rank) without reading them, and returns the gate of its
    /// update (`[apply, skipped before it]`, ember-model's `UpdateGate`).
    pub fn judge(&mut self, step: u64, loss: Tensor<B, 1>, grad_norm: Tensor<B, 1>) -> Tensor<B, 1> {
        let c = &self.config;
        let w = c.spike_window;
        let flag = |t: Tensor<B, 1, burn::tensor::Bool>| t.float();
        let finite_loss = flag(loss.clone().is_finite());
        let finite_norm = flag(grad_norm.clone().is_finite());
        let both_finite = finite_loss.clone() * finite_norm.clone();
        // The z-score against the window (population σ), where it is full and spread.
        let mean = self.window.clone().sum().div_scalar(w as f32);
        let variance = (self.window.clone() - mean.clone().expand([w])).square().sum().div_scalar(w as f32);
        let full = flag(self.filled.clone().greater_equal_elem(w as f32));
        let has_z = full * flag(variance.clone().greater_elem(0.0)) * finite_loss.clone();
        let no_z = has_z.clone().equal_elem(0.0);
        let zscore = ((loss.clone() - mean) / variance.sqrt()).mask_fill(no_z, 0.0);
        let spike = match c.spike_zscore > 0.0 {
            true => {
                has_z.clone() * flag(zscore.clone().greater_elem(c.spike_zscore as f32)) * both_finite.clone()
            }
            false => zscore.zeros_like(),
        };
        let anomaly = (finite_loss.clone().neg().add_scalar(1.0))
            + (finite_loss.clone() * finite_norm.clone().neg().add_scalar(1.0)).mul_scalar(2.0)
            + spike.clone().mul_scalar(3.0);
        let spike_skips = match c.spike_action {
            SpikeAction::Skip => spike,
            SpikeAction::Mark => spike.zeros_like(),
        };
        // Skipped: a non-finite value, a skipped spike, or a stop rule fired before.
        let judged_ok = both_finite * spike_skips.neg().add_scalar(1.0);
        let apply = judged_ok * self.stopped.clone().neg().add_scalar(1.0);
        let skip = apply.clone().neg().add_scalar(1.0);
        let gate = Tensor::cat(vec![apply.clone(), self.skipped.clone()], 0);
        // The state after the step.
        self.in_a_row = (self.in_a_row.clone().add_scalar(1.0)) * skip.clone();
        let mut stop_now = flag(self.in_a_row.clone().greater_equal_elem(c.max_skipped_steps as f32));
        if c.on_nonfinite == OnNonFinite::Stop {
            stop_now = stop_now.max_pair(finite_loss.clone().neg().add_scalar(1.0));
            stop_now = stop_now.max_pair(finite_norm.neg().add_scalar(1.0));
        }
        self.stopped = self.stopped.clone().max_pair(stop_now);
        let shifted = Tensor::cat(vec![self.window.clone().slice(1..w), loss.clone()], 0);
        let applied = apply.clone().equal_elem(1.0).expand([w]);
        self.window = self.window.clone().mask_where(applied, shifted);
        self.filled = (self.filled.clone() + apply).clamp_max(w as f32);
        self.skipped = self.skipped.clone() + skip.clone();
        let verdict = Tensor::cat(vec![loss, grad_norm, zscore, has_z, anomaly, skip], 0);
        self.pending.push((step, verdict));
        gate
    }

    /// Steps judged and not yet read.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Reads the verdicts of the steps judged since the last call (one host read), records
    /// them in `host` (the state checkpoints save) in order, and returns them. The updates they
    /// gated off are no longer counted as skipped on the device; take them off AdamW's step
    /// counts with [`uncount_skipped`] (the count is `skipped_updates` of the result).
    pub fn settle(&mut self, host: &mut Sentinel) -> Vec<Settled> {
        if self.pending.is_empty() {
            return Vec::new();
        }
        let (steps, verdicts): (Vec<u64>, Vec<Tensor<B, 1>>) =
            std::mem::take(&mut self.pending).into_iter().unzip();
        let device = verdicts[0].device();
        let values =
            Tensor::cat(verdicts, 0).into_data().convert::<f64>().to_vec::<f64>().unwrap_or_default();
        self.skipped = Tensor::zeros([1], &device);
        let mut settled = Vec::with_capacity(steps.len());
        for (step, v) in steps.into_iter().zip(values.chunks_exact(VERDICT)) {
            let anomaly = match v[4] as u8 {
                1 => Some(Anomaly::NonfiniteLoss),
                2 => Some(Anomaly::NonfiniteGradNorm),
                3 => Some(Anomaly::Spike),
                _ => None,
            };
            let zscore = (v[3] == 1.0).then_some(v[2]);
            let judgement = Judgement { loss: v[0], grad_norm: v[1], zscore, anomaly, skipped: v[5] == 1.0 };
            host.record(&judgement);
            let stop_reason = if self.stop_seen { None } else { host.stop_reason(&judgement) };
            self.stop_seen |= stop_reason.is_some();
            settled.push(Settled {
                step,
                judgement,
                skipped_in_a_row: host.state.skipped_in_a_row,
                stop_reason,
            });
        }
        settled
    }
}

/// Updates gated off among `settled`.
pub fn skipped_updates(settled: &[Settled]) -> u64 {
    settled.iter().filter(|s| s.judgement.skipped).count() as u64
}

/// Takes `skipped` gated-off updates off the step count of every parameter's AdamW state in
/// `optimizer` (Burn's state counted them: the host could not know), so the counts are those
/// of the updates made, as the host sentinel's skipped steps leave them. `module` names the
/// parameters (their ids and ranks).
pub fn uncount_skipped<M: AutodiffModule<B>, B: AutodiffBackend>(
    optimizer: &mut AdamWGroups<M, B>,
    module: &M,
    skipped: u64,
) {
    if skipped == 0 {
        return;
    }
    let (mut decay, mut no_decay) = optimizer.to_record();
    module.visit(&mut Uncount::<M, B> { records: [&mut decay, &mut no_decay], skipped: skipped as usize });
    *optimizer = optimizer.clone().load_record((decay, no_decay));
}

/// Rewrites the step count of each visited parameter's record.
struct Uncount<'a, M: AutodiffModule<B>, B: AutodiffBackend> {
    records: [&'a mut AdamWRecord<M, B>; 2],
    skipped: usize,
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> ModuleVisitor<B> for Uncount<'_, M, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        for records in self.records.iter_mut() {
            if let Some(record) = records.remove(&param.id) {
                let mut state = record.into_state::<D>();
                state.momentum.time = state.momentum.time.saturating_sub(self.skipped);
                records.insert(param.id, AdaptorRecord::<FusedAdamW, B>::from_state::<D>(state));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    /// The device's verdicts equal the host sentinel's on a sequence with a spike, non-finite
    /// values and a stop, for each rule set.
    #[test]
    fn device_verdicts_equal_the_host_sentinels() {
        let device = Default::default();
        let losses = [3.0, 2.9, 2.95, 2.8, 2.85, 9.0, f64::NAN, 2.7, 2.75, 2.6, f64::INFINITY, 2.5, 2.55];
        let norms = [1.0, 1.1, 0.9, 1.0, f64::NAN, 1.0, 1.0, 1.2, 1.0, 1.0, 1.0, 1.0, 1.0];
        let configs = [
            SentinelConfig { spike_window: 3, ..Default::default() },
            SentinelConfig { spike_window: 3, spike_zscore: 3.0, ..Default::default() },
            SentinelConfig {
                spike_window: 4,
                spike_zscore: 2.0,
                spike_action: SpikeAction::Skip,
                max_skipped_steps: 2,
                ..Default::default()
            },
            SentinelConfig { spike_window: 2, on_nonfinite: OnNonFinite::Stop, ..Default::default() },
        ];
        for config in configs {
            let mut host = Sentinel::new(config.clone(), SentinelState::default());
            let mut on_device =
                DeviceSentinel::<Flex>::new(config.clone(), &SentinelState::default(), &device);
            let mut mirror = Sentinel::new(config.clone(), SentinelState::default());
            let (mut want, mut gates) = (Vec::new(), Vec::new());
            let mut host_stopped = false;
            let mut first = Vec::new();
            for (i, (&loss, &norm)) in losses.iter().zip(&norms).enumerate() {
                let one = |x: f64| Tensor::<Flex, 1>::from_floats([x as f32], &device);
                gates.push(on_device.judge(i as u64 + 1, one(loss), one(norm)));
                // The host judges f32-rounded values, as the device holds them.
                let mut j = host.verdict(loss as f32 as f64, norm as f32 as f64);
                j.skipped |= host_stopped; // latched on the device
                host.record(&j);
                host_stopped |= host.stop_reason(&j).is_some();
                want.push(j);
                if i == 6 {
                    // Settling part-way changes nothing.
                    first = on_device.settle(&mut mirror);
                    assert_eq!(first.len(), 7);
                }
            }
            let settled = on_device.settle(&mut mirror);
            let got: Vec<&Judgement> = settled.iter().map(|s| &s.judgement).collect();
            let got: Vec<&Judgement> = first.iter().map(|s| &s.judgement).chain(got).collect();
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!((g.anomaly, g.skipped), (w.anomaly, w.skipped), "{config:?}: {g:?} vs {w:?}");
                match (g.zscore, w.zscore) {
                    (Some(a), Some(b)) => assert!((a - b).abs() < 1e-3 * b.abs().max(1.0), "{a} vs {b}"),
                    (a, b) => assert_eq!(a.is_some(), b.is_some(), "{config:?} z {a:?} vs {b:?}"),
                }
            }
            // Gate i: apply = not skipped; skipped-before = gated-off updates since the settle.
            let mut since = 0.0;
            for (i, gate) in gates.into_iter().enumerate() {
                if i == 7 {
                    since = 0.0;
                }
                let g = gate.into_data().to_vec::<f32>().unwrap();
                assert_eq!(g, [if want[i].skipped { 0.0 } else { 1.0 }, since], "{config:?} step {}", i + 1);
                since += f32::from(want[i].skipped);
            }
            let stops = first.iter().chain(&settled).filter(|s| s.stop_reason.is_some()).count();
            assert_eq!(stops, usize::from(host_stopped), "{config:?}: one stop, where the host stops");
            assert_eq!(
                mirror.state.skipped_steps,
                want.iter().filter(|j| j.skipped).count() as u64,
                "{config:?}"
            );
        }
    }
}
