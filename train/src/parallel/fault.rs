//! Fault injection for the tests of failure handling: [`FaultInjector`] wraps a rank's
//! [`GradSync`] and makes that rank fail, or skip an all-reduce, at a chosen step, or corrupts
//! the reduced values of chosen steps. The training
//! loop knows nothing of it; a run gets one only through [`crate::RunOptions::faults`].

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use ember_model::LanguageModel;

use crate::error::TrainError;
use crate::step::optim::scale_grads;
use crate::step::{Contribution, Exchanged, GradSync};

/// Faults to inject into a run, each at `(rank, optimizer step)`. None by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// This rank fails with [`TrainError::InjectedFault`] at this step instead of exchanging
    /// its gradient (the others must stop too, naming it).
    pub fail: Option<(usize, u64)>,
    /// This rank keeps its own gradient at this step instead of the reduced one, as if it had
    /// skipped the all-reduce (the replica hashes must catch it).
    pub skip_all_reduce: Option<(usize, u64)>,
    /// Every rank's reduced values are corrupted from the first to the last step given
    /// (inclusive), as a numerical blow-up or bad data would (the sentinel must catch it).
    pub corrupt: Option<(u64, u64, Corruption)>,
}

/// What [`Faults::corrupt`] does to a step's reduced values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// Σ NLL becomes NaN (a non-finite loss).
    NanLoss,
    /// Every gradient is multiplied by NaN (a non-finite gradient norm, finite loss).
    NanGradients,
    /// Σ NLL is multiplied by this factor (a loss spike; gradients unchanged).
    LossTimes(u32),
}

impl Faults {
    /// Whether any fault is set.
    pub fn any(&self) -> bool {
        self.fail.is_some() || self.skip_all_reduce.is_some() || self.corrupt.is_some()
    }
}

/// A [`GradSync`] that injects `faults` into the exchanges of the rank it wraps, and otherwise
/// passes everything through.
pub struct FaultInjector<B: AutodiffBackend> {
    inner: Box<dyn GradSync<B> + Send>,
    faults: Faults,
    /// The optimizer step of the next exchange.
    step: u64,
}

impl<B: AutodiffBackend> FaultInjector<B> {
    /// Wraps `inner`, whose next exchange is that of optimizer step `first_step`.
    pub fn new(inner: Box<dyn GradSync<B> + Send>, faults: Faults, first_step: u64) -> Self {
        Self { inner, faults, step: first_step }
    }
}

impl<B: AutodiffBackend> GradSync<B> for FaultInjector<B> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn exchange(
        &mut self,
        model: &LanguageModel<B>,
        local: Contribution<B>,
    ) -> Result<Exchanged<B>, TrainError> {
        let (rank, step) = (self.rank(), self.step);
        self.step += 1;
        if self.faults.fail == Some((rank, step)) {
            return Err(TrainError::InjectedFault { rank, step });
        }
        if self.faults.skip_all_reduce == Some((rank, step)) {
            let own = copy_grads(model, &local.grads);
            let mut reduced = self.inner.exchange(model, local)?;
            reduced.grads = own;
            return Ok(reduced);
        }
        let mut reduced = self.inner.exchange(model, local)?;
        let corrupted = self.faults.corrupt.filter(|(first, last, _)| (*first..=*last).contains(&step));
        if let Some((_, _, corruption)) = corrupted {
            match corruption {
                Corruption::NanLoss => reduced.nll_sum = reduced.nll_sum * f64::NAN,
                Corruption::NanGradients => scale_grads(model, &mut reduced.grads, f64::NAN),
                Corruption::LossTimes(factor) => reduced.nll_sum = reduced.nll_sum * f64::from(factor),
            }
        }
        Ok(reduced)
    }

    fn gather(
        &mut self,
        buffer: Tensor<B::InnerBackend, 1>,
    ) -> Result<Tensor<B::InnerBackend, 1>, TrainError> {
        self.inner.gather(buffer)
    }

    fn abort(&mut self, num_params: usize) {
        self.inner.abort(num_params);
    }

    fn all_reduce_calls(&self) -> usize {
        self.inner.all_reduce_calls()
    }

    fn bytes_per_exchange(&self, num_params: usize) -> usize {
        self.inner.bytes_per_exchange(num_params)
    }

    fn strategy(&self) -> String {
        self.inner.strategy()
    }

    fn finish(&mut self) {
        self.inner.finish();
    }
}

/// A copy of every gradient of `model` in `grads`.
fn copy_grads<B: AutodiffBackend>(model: &LanguageModel<B>, grads: &GradientsParams) -> GradientsParams {
    struct Copy<'a>(&'a GradientsParams, GradientsParams);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Copy<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.0.get::<B::InnerBackend, D>(param.id) {
                self.1.register::<B::InnerBackend, D>(param.id, grad);
            }
        }
    }
    let mut copy = Copy(grads, GradientsParams::new());
    model.visit(&mut copy);
    copy.1
}
