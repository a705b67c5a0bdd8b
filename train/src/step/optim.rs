//! AdamW with two parameter groups (decay on 2-D weights, none on biases and norms) — with
//! global-norm clipping ([`super::clip`]), the pieces Burn 0.21 does not provide. The update itself
//! is [`FusedAdamW`](super::adamw::FusedAdamW): one in-place pass per parameter tensor.

use std::fmt;
use std::marker::PhantomData;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, MultiGradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

use super::adamw::FusedAdamW;
pub use super::clip::{clip_grad_norm, scale_grads};
use super::shard::OptimizerShard;
use crate::config::OptimizerConfig;

/// Ember's fused AdamW for one module, in Burn's adaptor (which walks the module and keeps the
/// per-parameter state).
pub type AdamWAdaptor<M, B> = OptimizerAdaptor<FusedAdamW, M, B>;
/// Saved state (moments and step count) of one [`AdamWAdaptor`], keyed by `ParamId`. Its
/// per-parameter state is Burn's `AdamWState`, so it is saved and loaded exactly as the record
/// of Burn's `OptimizerAdaptor<AdamW, _, _>` (checkpoints written before the fused update load).
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
/// groups, so each group is its own optimizer stepped on its share of the gradients. Each
/// parameter tensor is updated in one pass ([`FusedAdamW`]: in place on burn-flex), with the
/// numbers of Burn's `AdamW`.
///
/// It is also a Burn [`Optimizer`] (record: `(decay, no_decay)`), so burn-train's `Learner`
/// can drive it.
#[derive(Clone)]
pub struct AdamWGroups<M: AutodiffModule<B>, B: AutodiffBackend> {
    decay: AdamWAdaptor<M, B>,
    no_decay: AdamWAdaptor<M, B>,
    /// The split, for the start-of-run report.
    pub census: Census,
    /// ZeRO-1: the share of the parameters this rank updates (`None`: all of them).
    shard: Option<OptimizerShard>,
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
        let adamw = |weight_decay: f64| -> AdamWAdaptor<M, B> {
            FusedAdamW {
                beta_1: config.beta1 as f32,
                beta_2: config.beta2 as f32,
                epsilon: config.eps as f32,
                weight_decay: weight_decay as f32,
            }
            .into()
        };
        Self { decay: adamw(config.weight_decay), no_decay: adamw(0.0), census, shard: None }
    }

    /// ZeRO-1 ([`super::shard`]): this optimizer keeps state for and updates only the
    /// parameters `shard` owns; the others' gradients are dropped at each step. Call
    /// [`Self::keep_own`] after loading a whole record.
    pub fn sharded(mut self, shard: OptimizerShard) -> Self {
        self.shard = Some(shard);
        self
    }

    /// The share of the parameters this optimizer updates (`None`: all of them).
    pub fn shard(&self) -> Option<OptimizerShard> {
        self.shard
    }

    /// Drops the state of `module`'s parameters this rank does not own (after loading a
    /// checkpoint's whole state into a sharded optimizer); unsharded, nothing changes.
    pub fn keep_own(self, module: &M) -> Self {
        let Some(shard) = self.shard else { return self };
        let owned = shard.owned_ids(module);
        let (mut decay, mut no_decay) = self.to_record();
        decay.retain(|id, _| owned.contains(id));
        no_decay.retain(|id, _| owned.contains(id));
        self.load_record((decay, no_decay))
    }

    /// One update with learning rate `lr`; consumes the gradients (they are reset every step).
    ///
    /// The groups are read off `module` at every step, not remembered: loading a record
    /// replaces parameter ids, and a stale split would silently decay LayerNorm gains.
    pub fn step(&mut self, lr: f64, module: M, mut grads: GradientsParams) -> M {
        if let Some(shard) = self.shard {
            // ZeRO-1: only the own parameters are updated (and get state).
            let owned = shard.owned_ids(&module);
            let mut keep = KeepOwned::<B> {
                owned: &owned,
                from: &mut grads,
                into: GradientsParams::new(),
                backend: PhantomData,
            };
            module.visit(&mut keep);
            grads = keep.into;
        }
        let no_decay = take_no_decay::<B, M>(&module, &mut grads);
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

/// Moves the gradients of `module`'s rank-1 parameters (biases, norm gains: the no-decay
/// group) out of `grads` into their own [`GradientsParams`]; the rank ≥ 2 ones stay.
fn take_no_decay<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
) -> GradientsParams {
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
    no_decay
}

/// Moves the gradients of the parameters in `owned` out of `from` into their own
/// [`GradientsParams`].
struct KeepOwned<'a, B> {
    owned: &'a std::collections::HashSet<ParamId>,
    from: &'a mut GradientsParams,
    into: GradientsParams,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for KeepOwned<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.owned.contains(&param.id) {
            if let Some(grad) = self.from.remove::<B::InnerBackend, D>(param.id) {
                self.into.register(param.id, grad);
            }
        }
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

/// Calls `f(id, rank, element count)` for every float parameter, in module order.
pub(super) struct ParamRanks<F>(pub(super) F);

impl<B: Backend, F: FnMut(ParamId, usize, usize)> ModuleVisitor<B> for ParamRanks<F> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        (self.0)(param.id, D, param.lazy_shape().num_elements());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use burn::backend::{Autodiff, Flex};
    use burn::module::Module;
    use burn::optim::{AdamW, AdamWConfig, AdamWState};
    use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
    use burn::tensor::backend::Backend;
    use burn::tensor::TensorData;
    use ember_data::Batch;
    use ember_model::ModelConfig;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::step::adamw::fused_stats;
    use crate::step::{train_step, Solo, StepSettings};

    type Ad = Autodiff<Flex>;

    /// Both groups, odd sizes; `big` is larger than two parallel chunks of the fused update.
    #[derive(Module, Debug)]
    struct Odd<B: Backend> {
        big: Param<Tensor<B, 2>>,
        matrix: Param<Tensor<B, 2>>,
        cube: Param<Tensor<B, 3>>,
        bias: Param<Tensor<B, 1>>,
        gain: Param<Tensor<B, 1>>,
    }

    fn uniform<const D: usize>(shape: [usize; D], scale: f32, rng: &mut ChaCha8Rng) -> TensorData {
        let n = shape.iter().product();
        TensorData::new((0..n).map(|_| scale * rng.random_range(-1.0f32..1.0)).collect::<Vec<_>>(), shape)
    }

    fn odd() -> Odd<Ad> {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let device = Default::default();
        let p2 =
            |shape, rng: &mut _| Param::from_tensor(Tensor::from_data(uniform(shape, 1.0, rng), &device));
        Odd {
            big: p2([131, 257], &mut rng),
            matrix: p2([7, 13], &mut rng),
            cube: Param::from_tensor(Tensor::from_data(uniform([3, 5, 7], 1.0, &mut rng), &device)),
            bias: Param::from_tensor(Tensor::from_data(uniform([37], 1.0, &mut rng), &device)),
            gain: Param::from_tensor(Tensor::from_data(uniform([3], 1.0, &mut rng), &device)),
        }
    }

    /// Random gradients (scale 0.1) for every parameter of `module`, the same for the same seed.
    fn random_grads<M: AutodiffModule<Ad>>(module: &M, seed: u64) -> GradientsParams {
        struct Random(GradientsParams, ChaCha8Rng);
        impl ModuleVisitor<Ad> for Random {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
                let shape: [usize; D] = param.shape().dims();
                let g = Tensor::<Flex, D>::from_data(uniform(shape, 0.1, &mut self.1), &Default::default());
                self.0.register(param.id, g);
            }
        }
        let mut random = Random(GradientsParams::new(), ChaCha8Rng::seed_from_u64(seed));
        module.visit(&mut random);
        random.0
    }

    /// The update before the fused one: two of Burn's `AdamW`, split as [`AdamWGroups::step`] does.
    struct BurnGroups<M: AutodiffModule<Ad>> {
        decay: OptimizerAdaptor<AdamW, M, Ad>,
        no_decay: OptimizerAdaptor<AdamW, M, Ad>,
    }

    impl<M: AutodiffModule<Ad>> BurnGroups<M> {
        fn new(config: &OptimizerConfig) -> Self {
            let adamw = |weight_decay: f64| {
                AdamWConfig::new()
                    .with_beta_1(config.beta1 as f32)
                    .with_beta_2(config.beta2 as f32)
                    .with_epsilon(config.eps as f32)
                    .with_weight_decay(weight_decay as f32)
                    .init::<Ad, M>()
            };
            Self { decay: adamw(config.weight_decay), no_decay: adamw(0.0) }
        }

        fn step(&mut self, lr: f64, module: M, mut grads: GradientsParams) -> M {
            let no_decay = take_no_decay::<Ad, M>(&module, &mut grads);
            let module = self.decay.step(lr, module, grads);
            self.no_decay.step(lr, module, no_decay)
        }
    }

    fn config() -> OptimizerConfig {
        OptimizerConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, ..Default::default() }
    }

    /// Every float parameter's values as bits, in visiting order.
    fn weight_bits<M: AutodiffModule<Ad>>(module: &M) -> Vec<Vec<u32>> {
        struct Bits(Vec<Vec<u32>>);
        impl ModuleVisitor<Ad> for Bits {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
                let v = param.val().to_data().to_vec::<f32>().unwrap();
                self.0.push(v.into_iter().map(f32::to_bits).collect());
            }
        }
        let mut bits = Bits(Vec::new());
        module.visit(&mut bits);
        bits.0
    }

    /// Every parameter's `(step count, m, v)` in a record of either update, as bits.
    fn state_bits<O>(
        record: &<OptimizerAdaptor<O, Odd<Ad>, Ad> as Optimizer<Odd<Ad>, Ad>>::Record,
        model: &Odd<Ad>,
    ) -> Vec<(usize, Vec<u32>, Vec<u32>)>
    where
        O: burn::optim::SimpleOptimizer<
            Flex,
            State<1> = AdamWState<Flex, 1>,
            State<2> = AdamWState<Flex, 2>,
            State<3> = AdamWState<Flex, 3>,
        >,
    {
        fn bits<const D: usize>(s: AdamWState<Flex, D>) -> (usize, Vec<u32>, Vec<u32>) {
            let b = |t: Tensor<Flex, D>| {
                t.to_data().to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
            };
            (s.momentum.time, b(s.momentum.moment_1), b(s.momentum.moment_2))
        }
        let get = |id: ParamId| record.get(&id).cloned().expect("a state for every parameter of the group");
        let mut out = Vec::new();
        for id in [model.big.id, model.matrix.id] {
            if record.contains_key(&id) {
                out.push(bits::<2>(get(id).into_state::<2>()));
            }
        }
        if record.contains_key(&model.cube.id) {
            out.push(bits::<3>(get(model.cube.id).into_state::<3>()));
        }
        for id in [model.bias.id, model.gain.id] {
            if record.contains_key(&id) {
                out.push(bits::<1>(get(id).into_state::<1>()));
            }
        }
        out
    }

    /// Five steps of [`AdamWGroups`] and of the two Burn `AdamW` it replaced, from the same
    /// weights with the same gradients (weight decay on): bit-identical weights, moments and
    /// step counts in both groups. Then the Burn update's record, written as a checkpoint
    /// writes it, loads into a fresh [`AdamWGroups`], which continues exactly as both do.
    #[test]
    fn groups_equal_burn_adamw_groups_and_load_their_records() {
        let device = Default::default();
        let model = odd();
        let mut burn = BurnGroups::new(&config());
        let mut fused = AdamWGroups::new(&config(), &model);
        assert_eq!((fused.census.decayed_tensors, fused.census.no_decay_tensors), (3, 2));
        let (mut a, mut b) = (model.clone(), model);
        let check = |a: &Odd<Ad>,
                     b: &Odd<Ad>,
                     burn: &BurnGroups<Odd<Ad>>,
                     fused: &AdamWGroups<Odd<Ad>, Ad>,
                     what: &str| {
            assert_eq!(weight_bits(a), weight_bits(b), "{what}: weights");
            let (fused_decay, fused_no_decay) = fused.to_record();
            assert_eq!(
                state_bits(&burn.decay.to_record(), a),
                state_bits(&fused_decay, b),
                "{what}: decay group"
            );
            assert_eq!(
                state_bits(&burn.no_decay.to_record(), a),
                state_bits(&fused_no_decay, b),
                "{what}: no-decay group"
            );
            assert_eq!(state_bits(&fused_decay, b).len(), 3);
            assert_eq!(state_bits(&fused_no_decay, b).len(), 2);
        };
        for step in 1..=3u64 {
            let lr = 1e-2 / step as f64;
            let g = random_grads(&a, step);
            a = burn.step(lr, a, g);
            let g = random_grads(&b, step);
            b = fused.step(lr, b, g);
            check(&a, &b, &burn, &fused, &format!("step {step}"));
        }
        assert_ne!(weight_bits(&a), weight_bits(&odd()), "the steps changed the weights");

        // A checkpoint of the Burn update, loaded into the fused one.
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        let bytes = |r| Recorder::<Ad>::record(&recorder, r, ()).unwrap();
        let (decay, no_decay) = (bytes(burn.decay.to_record()), bytes(burn.no_decay.to_record()));
        let loaded = AdamWGroups::new(&config(), &a).load_record((
            Recorder::<Ad>::load(&recorder, decay, &device).unwrap(),
            Recorder::<Ad>::load(&recorder, no_decay, &device).unwrap(),
        ));
        let (mut resumed, mut c) = (loaded, a.clone());
        check(&a, &c, &burn, &resumed, "loaded");
        for step in 4..=5u64 {
            let lr = 1e-2 / step as f64;
            let g = random_grads(&a, step);
            a = burn.step(lr, a, g);
            let g = random_grads(&b, step);
            b = fused.step(lr, b, g);
            let g = random_grads(&c, step);
            c = resumed.step(lr, c, g);
            check(&a, &b, &burn, &fused, &format!("step {step}"));
            check(&a, &c, &burn, &resumed, &format!("resumed, step {step}"));
        }
    }

    /// In Ember's step (forward, backward, clip, AdamW) on burn-flex, every parameter's weight
    /// and moments are updated in their own buffers from the second step on: Burn's adaptor
    /// hands the optimizer the only reference to each. (The first step allocates the moments.)
    #[test]
    fn train_steps_update_in_place() {
        let device = Default::default();
        <Ad as Backend>::seed(&device, 5);
        let model = ModelConfig::preset("tiny").unwrap().init::<Ad>(&device).unwrap();
        let mut optimizer = AdamWGroups::new(&OptimizerConfig::default(), &model);
        let tensors = optimizer.census.decayed_tensors + optimizer.census.no_decay_tensors;
        let batch = Batch {
            batch_size: 2,
            seq_len: 16,
            inputs: (0..32).map(|i| (i * 7 % 64) as u32).collect(),
            targets: (0..32).map(|i| (i * 7 + 7) % 64).collect(),
            segments: None,
        };
        let mut model = Some(model);
        for step in 1..=3u64 {
            let before = fused_stats();
            let settings = StepSettings::new(step, 1e-3, 1.0);
            let (next, _) = train_step(
                model.take().unwrap(),
                &mut optimizer,
                std::slice::from_ref(&batch),
                settings,
                &mut Solo,
                None,
                &device,
            )
            .unwrap();
            model = Some(next);
            let after = fused_stats();
            assert_eq!(after.generic, before.generic, "burn-flex f32 takes the fused path");
            if step > 1 {
                assert_eq!(after.copied, before.copied, "step {step}: no buffer copied");
                assert_eq!(
                    after.in_place - before.in_place,
                    tensors as u64,
                    "step {step}: every tensor in place"
                );
            }
        }
    }

    /// Time of `AdamWGroups::step` on the 6-layer, 384-wide GPT (`shakespeare-char-gpu`,
    /// 10.65 M parameters) with random gradients, against the two Burn `AdamW` it replaced.
    /// Not a benchmark (no idle machine); run with
    /// `cargo test --release -p ember-train --lib adamw_step_time -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing; prints, asserts nothing about time"]
    fn adamw_step_time() {
        let device = Default::default();
        let model = ModelConfig::preset("shakespeare-char-gpu").unwrap().init::<Ad>(&device).unwrap();
        let params = model.num_params();
        let rounds = 5;
        let steps = 10;
        let mut fused = AdamWGroups::new(&config(), &model);
        let mut burn = BurnGroups::new(&config());
        let (mut a, mut b) = (model.clone(), model);
        // First steps allocate the moments; not timed.
        let (ga, gb) = (random_grads(&a, 0), random_grads(&b, 0));
        a = burn.step(1e-3, a, ga);
        b = fused.step(1e-3, b, gb);
        let (mut a, mut b) = (Some(a), Some(b));
        let stats_before = fused_stats();
        let (mut t_burn, mut t_fused) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let (mut burn_ms, mut fused_ms) = (0.0, 0.0);
            for s in 0..steps {
                let seed = (round * steps + s + 1) as u64;
                let g = random_grads(a.as_ref().unwrap(), seed);
                let started = Instant::now();
                a = Some(burn.step(1e-3, a.take().unwrap(), g));
                burn_ms += started.elapsed().as_secs_f64() * 1e3;
                let g = random_grads(b.as_ref().unwrap(), seed);
                let started = Instant::now();
                b = Some(fused.step(1e-3, b.take().unwrap(), g));
                fused_ms += started.elapsed().as_secs_f64() * 1e3;
            }
            t_burn.push(burn_ms / steps as f64);
            t_fused.push(fused_ms / steps as f64);
        }
        let (a, b) = (a.unwrap(), b.unwrap());
        eprintln!("{params} parameters; ms per step, mean of {steps} alternating steps, {rounds} rounds:");
        eprintln!("  Burn AdamW x2 (before): {t_burn:.1?}");
        eprintln!("  fused AdamWGroups (after): {t_fused:.1?}");
        let stats = fused_stats();
        eprintln!(
            "  fused: {} tensors updated in place, {} buffers copied",
            stats.in_place - stats_before.in_place,
            stats.copied - stats_before.copied
        );
        assert_eq!(weight_bits(&a), weight_bits(&b), "both updates gave the same weights");
    }
}
