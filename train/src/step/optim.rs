//! AdamW with two parameter groups (decay on 2-D weights, none on biases and norms), and
//! global-norm gradient clipping — the two pieces Burn 0.21 does not provide.

use std::fmt;
use std::marker::PhantomData;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Tensor};

use crate::config::OptimizerConfig;

/// Burn's AdamW for one module.
pub type AdamWAdaptor<M, B> = OptimizerAdaptor<AdamW, M, B>;
/// Saved state (moments and step count) of one [`AdamWAdaptor`], keyed by `ParamId`.
pub type AdamWRecord<M, B> = <AdamWAdaptor<M, B> as Optimizer<M, B>>::Record;

/// How many tensors and parameters are decayed and not (printed at start, as nanoGPT does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// 2-D weight matrices (Linear weights and embeddings): decayed.
    pub decayed_tensors: usize,
    /// Their element count.
    pub decayed_params: usize,
    /// 1-D tensors (biases, LayerNorm gains and biases): never decayed.
    pub no_decay_tensors: usize,
    /// Their element count.
    pub no_decay_params: usize,
}

impl fmt::Display for Census {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "weight decay on {} tensors ({} parameters); none on {} tensors ({} parameters)",
            self.decayed_tensors, self.decayed_params, self.no_decay_tensors, self.no_decay_params
        )
    }
}

/// AdamW (Loshchilov & Hutter 2019, Algorithm 2; PyTorch `torch.optim.AdamW`) in two groups:
/// parameters of rank ≥ 2 get decoupled weight decay `θ ← θ·(1 − lr·wd)`, rank-1 parameters
/// (biases, LayerNorm) none — nanoGPT's `configure_optimizers` rule. Burn 0.21 has no parameter
/// groups, so each group is its own Burn optimizer stepped on its share of the gradients.
///
/// It is also a Burn [`Optimizer`] (record: `(decay, no_decay)`), so burn-train's `Learner`
/// can drive it.
#[derive(Clone)]
pub struct AdamWGroups<M: AutodiffModule<B>, B: AutodiffBackend> {
    decay: AdamWAdaptor<M, B>,
    no_decay: AdamWAdaptor<M, B>,
    /// The split, for the start-of-run report.
    pub census: Census,
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> AdamWGroups<M, B> {
    /// Splits `module`'s parameters by rank and builds both optimizers from `config`
    /// (β₁, β₂, ε, weight decay; the learning rate is given at each step).
    pub fn new(config: &OptimizerConfig, module: &M) -> Self {
        let mut census = Census::default();
        module.visit(&mut ParamRanks(|_, rank, numel| {
            if rank >= 2 {
                census.decayed_tensors += 1;
                census.decayed_params += numel;
            } else {
                census.no_decay_tensors += 1;
                census.no_decay_params += numel;
            }
        }));
        let adamw = |weight_decay: f64| {
            AdamWConfig::new()
                .with_beta_1(config.beta1 as f32)
                .with_beta_2(config.beta2 as f32)
                .with_epsilon(config.eps as f32)
                .with_weight_decay(weight_decay as f32)
                .init::<B, M>()
        };
        Self { decay: adamw(config.weight_decay), no_decay: adamw(0.0), census }
    }

    /// One update with learning rate `lr`; consumes the gradients (they are reset every step).
    ///
    /// The groups are read off `module` at every step, not remembered: loading a record
    /// replaces parameter ids, and a stale split would silently decay LayerNorm gains.
    pub fn step(&mut self, lr: f64, module: M, mut grads: GradientsParams) -> M {
        let mut no_decay_ids = Vec::new();
        module.visit(&mut ParamRanks(|id, rank, _| {
            if rank < 2 {
                no_decay_ids.push(id);
            }
        }));
        let mut no_decay = GradientsParams::new();
        for id in no_decay_ids {
            if let Some(grad) = grads.remove::<B::InnerBackend, 1>(id) {
                no_decay.register(id, grad);
            }
        }
        let module = self.decay.step(lr, module, grads);
        self.no_decay.step(lr, module, no_decay)
    }
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> Optimizer<M, B> for AdamWGroups<M, B> {
    type Record = (AdamWRecord<M, B>, AdamWRecord<M, B>);

    fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        AdamWGroups::step(self, lr, module, grads)
    }

    /// Gradients from several devices (burn-train's multi-device strategy) are summed on each
    /// parameter's device, then stepped as one.
    fn step_multi(&mut self, lr: f64, module: M, mut grads: MultiGradientsParams) -> M {
        let mut merged = GradientsParams::new();
        module.visit(&mut MergeDevices::<B> { from: &mut grads, into: &mut merged, backend: PhantomData });
        AdamWGroups::step(self, lr, module, merged)
    }

    /// Both groups' state, `(decay, no_decay)`, for checkpoints.
    fn to_record(&self) -> Self::Record {
        (self.decay.to_record(), self.no_decay.to_record())
    }

    /// Restores the state saved by `to_record` (load the model first: the records are keyed
    /// by the parameters' ids).
    fn load_record(mut self, (decay, no_decay): Self::Record) -> Self {
        self.decay = self.decay.load_record(decay);
        self.no_decay = self.no_decay.load_record(no_decay);
        self
    }
}

/// Moves each parameter's summed multi-device gradient into one [`GradientsParams`].
struct MergeDevices<'a, B> {
    from: &'a mut MultiGradientsParams,
    into: &'a mut GradientsParams,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for MergeDevices<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some((grad, _)) = self.from.remove::<B::InnerBackend, D>(param.id) {
            self.into.register(param.id, grad.to_device(&param.device()));
        }
    }
}

/// Calls `f(id, rank, element count)` for every float parameter.
struct ParamRanks<F>(F);

impl<B: AutodiffBackend, F: FnMut(ParamId, usize, usize)> ModuleVisitor<B> for ParamRanks<F> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        (self.0)(param.id, D, param.lazy_shape().num_elements());
    }
}

/// Clips the gradient by its *global* L2 norm over all parameters jointly (Pascanu et al.
/// 2013, Algorithm 1; PyTorch `clip_grad_norm_`): with `n = ‖g‖₂` over every tensor,
/// every gradient is scaled by `min(1, max_norm / (n + 1e-6))`. `max_norm ≤ 0` only measures.
///
/// Returns the pre-clip norm `n` as a `[1]` tensor (no host sync). Burn's own
/// `GradientClipping::Norm` clips each tensor by its own norm, which is a different update.
pub fn clip_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> Tensor<B::InnerBackend, 1> {
    let mut sum_sq = SumOfSquares::<B> { grads, total: None };
    module.visit(&mut sum_sq);
    let norm = match sum_sq.total {
        Some(total) => total.sqrt(),
        None => Tensor::zeros([1], &Default::default()),
    };
    if max_norm > 0.0 {
        let coef = (norm.clone().add_scalar(1e-6).recip() * max_norm).clamp_max(1.0);
        module.visit(&mut Scale::<B> { grads, coef });
    }
    norm
}

struct SumOfSquares<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    total: Option<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SumOfSquares<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let sq = grad.cast(DType::F32).square().sum();
            self.total = Some(match self.total.take() {
                Some(total) => total + sq,
                None => sq,
            });
        }
    }
}

/// Multiplies every gradient by `factor` (e.g. `1 / scored tokens`).
pub fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    factor: f64,
) {
    struct MulScalar<'a>(&'a mut GradientsParams, f64);
    impl<B: AutodiffBackend> ModuleVisitor<B> for MulScalar<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.0.remove::<B::InnerBackend, D>(param.id) {
                self.0.register(param.id, grad.mul_scalar(self.1));
            }
        }
    }
    module.visit(&mut MulScalar(grads, factor));
}

struct Scale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    coef: Tensor<B::InnerBackend, 1>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let dtype = grad.dtype();
            let coef = self.coef.clone().to_device(&grad.device()).cast(dtype).reshape([1; D]);
            self.grads.register(param.id, grad * coef);
        }
    }
}
