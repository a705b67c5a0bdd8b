//! How the run loop judges its steps: the host sentinel, which reads every step's loss and
//! gradient norm back, or the device sentinel, which gates each update on the device and is
//! read only at logged, checkpointed and last steps (`[sentinel] on_device`).

use burn::backend::flex::FlexTensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use ember_data::{Batch, BatchSource};
use ember_model::ops::dispatch::is;
use ember_model::LanguageModel;

use crate::config::SentinelConfig;
use crate::error::TrainError;
use crate::step::device_sentinel::{skipped_updates, uncount_skipped};
use crate::step::optim::AdamWGroups;
use crate::step::{
    train_step, train_step_judged_on_device, DeviceSentinel, GradSync, Sentinel, SentinelState, Settled,
    StepOutput, StepSettings,
};

/// Verdicts read back after a device sentinel's queue holds this many steps, whatever else.
const MAX_PENDING: usize = 1024;

/// A step's verdict with where its data came from.
pub struct Verdict {
    /// The verdict.
    pub settled: Settled,
    /// Rank 0's micro-batches of that step.
    pub sources: Vec<BatchSource>,
}

/// The run loop's sentinel: the host one (whose state checkpoints save) and, when steps are
/// judged on the device, the device one.
pub struct Judges<B: AutodiffBackend> {
    /// The host sentinel: judges each step, or records the device's verdicts.
    pub host: Sentinel,
    device: Option<DeviceSentinel<B::InnerBackend>>,
    /// Device mode: the data sources of the steps judged and not yet read.
    sources: Vec<(u64, Vec<BatchSource>)>,
}

/// Whether a run with `config` on backend `B` judges its steps on the device: `on_device` when
/// set, else on every backend but burn-flex; never for loss-scaled (fp16-mixed) runs.
pub fn judged_on_device<B: Backend>(config: &SentinelConfig, loss_scaled: bool) -> bool {
    !loss_scaled && config.on_device.unwrap_or(!is::<B::FloatTensorPrimitive, FlexTensor>())
}

impl<B: AutodiffBackend> Judges<B> {
    /// The sentinel of a run with `config`, continuing from `state`; `loss_scaled`: the run
    /// has a loss scaler (fp16-mixed).
    pub fn new(
        config: &SentinelConfig,
        state: &SentinelState,
        loss_scaled: bool,
        device: &B::Device,
    ) -> Self {
        let on_device = judged_on_device::<B::InnerBackend>(config, loss_scaled);
        Self {
            host: Sentinel::new(config.clone(), state.clone()),
            device: on_device.then(|| DeviceSentinel::new(config.clone(), state, device)),
            sources: Vec::new(),
        }
    }

    /// One optimizer step of `model` (see [`train_step`]), judged by this sentinel; `sources`
    /// are its data's.
    ///
    /// Errors: the step's.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        model: LanguageModel<B>,
        optimizer: &mut AdamWGroups<LanguageModel<B>, B>,
        micro_batches: &[Batch],
        settings: StepSettings,
        sync: &mut dyn GradSync<B>,
        sources: &[BatchSource],
        device: &B::Device,
    ) -> Result<(LanguageModel<B>, StepOutput<B::InnerBackend>), TrainError> {
        match self.device.as_mut() {
            Some(judge) => {
                self.sources.push((settings.step, sources.to_vec()));
                train_step_judged_on_device(model, optimizer, micro_batches, settings, sync, judge, device)
            }
            None => train_step(model, optimizer, micro_batches, settings, sync, Some(&mut self.host), device),
        }
    }

    /// The verdicts known after step `step`, `out` (whose data came from `sources`): the host
    /// sentinel's of this step, or — on the device, when `due` (or the queue is long) — those of
    /// every step since the last read, in order, with AdamW's step counts corrected for the
    /// updates gated off (`optimizer`, whose parameters are `model`'s). Empty otherwise.
    pub fn verdicts(
        &mut self,
        step: u64,
        out: &StepOutput<B::InnerBackend>,
        sources: &[BatchSource],
        due: bool,
        model: &LanguageModel<B>,
        optimizer: &mut AdamWGroups<LanguageModel<B>, B>,
    ) -> Vec<Verdict> {
        let Some(judge) = self.device.as_mut() else {
            let judgement = out.judgement.clone().expect("the host sentinel judges every step");
            let settled = Settled {
                step,
                skipped_in_a_row: self.host.state.skipped_in_a_row,
                stop_reason: self.host.stop_reason(&judgement),
                judgement,
            };
            return vec![Verdict { settled, sources: sources.to_vec() }];
        };
        if !due && judge.pending() < MAX_PENDING {
            return Vec::new();
        }
        let settled = judge.settle(&mut self.host);
        uncount_skipped(optimizer, model, skipped_updates(&settled));
        let mut sources = std::mem::take(&mut self.sources).into_iter();
        settled
            .into_iter()
            .map(|settled| {
                let step_sources =
                    sources.find(|(s, _)| *s == settled.step).map(|(_, v)| v).unwrap_or_default();
                Verdict { settled, sources: step_sources }
            })
            .collect()
    }
}
