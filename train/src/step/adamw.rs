//! Fused AdamW: one pass per parameter tensor that reads the gradient and updates the first
//! moment `m`, the second moment `v` and the weight together, in place.
//!
//! The update is AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization",
//! Algorithm 2) as PyTorch's `torch.optim.AdamW` computes it (`amsgrad=False`,
//! `maximize=False`), with Burn 0.21's `burn::optim::AdamW` order of operations, so that both
//! give the same numbers bit for bit. With step `t` counted from 1 and every value rounded to
//! f32 after each operation:
//!
//! ```text
//! m ← β₁·m + (1 − β₁)·g                 (t = 1: m ← (1 − β₁)·g)
//! v ← β₂·v + (1 − β₂)·g²                (t = 1: v ← (1 − β₂)·g²)
//! δ ← (m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε)
//! θ ← θ·(1 − lr·λ) − lr·δ               (no decay factor when lr·λ = 0)
//! ```
//!
//! ε is added to the bias-corrected `√v̂`, as PyTorch does (not inside the square root). The
//! state is Burn's own [`AdamWState`] / [`AdaptiveMomentumState`] (step count, `m`, `v`), so a
//! [`FusedAdamW`] inside Burn's [`OptimizerAdaptor`](burn::optim::adaptor::OptimizerAdaptor)
//! saves and loads exactly the records Burn's `AdamW` does.
//!
//! On burn-flex with f32 tensors (detected at run time) the weight, `m` and `v` buffers are
//! updated in place — in parallel over chunks (rayon) in loops the compiler vectorizes — when
//! this update owns them; a buffer shared with another tensor (a model clone, a record taken
//! for a checkpoint) is copied first, never written through. Every other backend goes through
//! ember-model's `adamw_update`: one CubeCL kernel per tensor on wgpu and CUDA, else the same
//! formula as Burn tensor operations.
//!
//! Inside [`with_update_gate`] every update is gated by a decision on the device (the device
//! sentinel's, [`super::device_sentinel`]): made or not without a host read, and after gated-off
//! updates run at the step count less those (ember-model's `UpdateGate`).

use std::any::Any;
use std::cell::{Cell, RefCell};

use burn::backend::flex::FlexTensor;
use burn::optim::{AdamWState, AdaptiveMomentumState, SimpleOptimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use ember_model::ops::dispatch::{is, same};
use ember_model::ops::simd::vectorized;
use ember_model::ops::{adamw_update, AdamWScalars};
use rayon::prelude::*;

/// Elements per parallel chunk of the in-place update (64 KiB of each of the four streams).
const CHUNK: usize = 1 << 14;

/// AdamW hyper-parameters for one parameter group, as a Burn [`SimpleOptimizer`] whose state
/// is Burn's [`AdamWState`] (see the [module](self) for the formula).
///
/// The learning rate is given at each step. The fields have Burn's `AdamWConfig` types (f32),
/// so the scalars of the update round as they do in Burn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedAdamW {
    /// β₁, the decay of the first moment.
    pub beta_1: f32,
    /// β₂, the decay of the second moment.
    pub beta_2: f32,
    /// ε, added to `√v̂`.
    pub epsilon: f32,
    /// λ, the decoupled weight decay (`θ ← θ·(1 − lr·λ)`); 0 for none.
    pub weight_decay: f32,
}

/// How this thread's [`FusedAdamW`] updates went since it started: the buffers updated in
/// place, those copied first because they were shared or strided, and the tensors that took
/// the generic (Burn tensor operations) path. For tests and measurements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FusedStats {
    /// Parameter tensors whose weight, `m` and `v` were all updated in their own buffers
    /// (a first step's new moments count as their own).
    pub in_place: u64,
    /// Buffers (weight, `m` or `v`) copied before the update: shared or not contiguous.
    pub copied: u64,
    /// Parameter tensors updated with Burn tensor operations (not burn-flex f32).
    pub generic: u64,
}

thread_local! {
    static STATS: Cell<FusedStats> = const { Cell::new(FusedStats { in_place: 0, copied: 0, generic: 0 }) };
}

thread_local! {
    /// The gate of this thread's updates while [`with_update_gate`] runs: a boxed `Tensor<B, 1>`
    /// of the optimizer's backend.
    static GATE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Runs `f` (optimizer steps on backend `B`, the autodiff backend's inner one) with every
/// [`FusedAdamW`] update gated by `gate`, `[apply, skipped]` (ember-model's `UpdateGate`: made
/// when `apply` is 1, else the weight and both moments unchanged; `skipped` updates were gated
/// off since the step counts were last corrected). Burn's state still counts the update
/// (`time + 1`): the caller takes the skipped ones off once it has read them
/// ([`super::device_sentinel::uncount_skipped`]).
pub fn with_update_gate<B: Backend, R>(gate: Tensor<B, 1>, f: impl FnOnce() -> R) -> R {
    /// Puts the previous gate back, also when `f` panics.
    struct Restore(Option<Box<dyn Any>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            GATE.with(|g| *g.borrow_mut() = previous);
        }
    }
    let _restore = Restore(GATE.with(|g| g.replace(Some(Box::new(gate)))));
    f()
}

/// The gate set by [`with_update_gate`] for backend `B`, if any.
fn update_gate<B: Backend>() -> Option<Tensor<B, 1>> {
    GATE.with(|g| g.borrow().as_ref().and_then(|t| t.downcast_ref::<Tensor<B, 1>>().cloned()))
}

/// This thread's [`FusedStats`] so far.
pub fn fused_stats() -> FusedStats {
    STATS.with(Cell::get)
}

fn count(f: impl FnOnce(&mut FusedStats)) {
    STATS.with(|s| {
        let mut stats = s.get();
        f(&mut stats);
        s.set(stats);
    });
}

/// The scalars of one update at step `t` (ember-model's [`AdamWScalars`], with the types and
/// so the rounding Burn uses: f32 factors, the learning rate and `lr·λ` in f64) and `t` itself.
#[derive(Clone, Copy, Debug)]
struct Scalars {
    update: AdamWScalars,
    /// The step count `t` after this update (from 1).
    time: usize,
}

impl FusedAdamW {
    fn scalars(&self, lr: f64, time: usize) -> Scalars {
        let t = time as i32;
        let update = AdamWScalars {
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            factor_1: 1.0 - self.beta_1,
            factor_2: 1.0 - self.beta_2,
            correction_1: 1f32 - self.beta_1.powi(t),
            correction_2: 1f32 - self.beta_2.powi(t),
            epsilon: self.epsilon,
            lr,
            decay_rate: lr * (self.weight_decay as f64),
            time: time as u32,
        };
        Scalars { update, time }
    }
}

impl<B: Backend> SimpleOptimizer<B> for FusedAdamW {
    type State<const D: usize> = AdamWState<B, D>;

    /// One AdamW update of `tensor` with `grad`; `state` is `None` at the first step.
    fn step<const D: usize>(
        &self,
        lr: f64,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        let time = state.as_ref().map_or(0, |s| s.momentum.time) + 1;
        let s = self.scalars(lr, time);
        let f32_only = tensor.dtype() == DType::F32
            && grad.dtype() == DType::F32
            && state.as_ref().is_none_or(|st| {
                st.momentum.moment_1.dtype() == DType::F32 && st.momentum.moment_2.dtype() == DType::F32
            });
        let gate = update_gate::<B>();
        let (tensor, momentum) = if gate.is_none() && f32_only && is::<B::FloatTensorPrimitive, FlexTensor>()
        {
            step_flex(&s, tensor, grad, state.map(|st| st.momentum))
        } else {
            count(|c| c.generic += 1);
            step_tensors(&s, tensor, grad, state.map(|st| st.momentum), gate)
        };
        (tensor, Some(AdamWState { momentum }))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        state.momentum = state.momentum.to_device(device);
        state
    }
}

/// The update on any backend through ember-model's [`adamw_update`]: one CubeCL kernel per
/// tensor on Burn's CubeCL backends (wgpu, CUDA), Burn tensor operations in the order of Burn
/// 0.21's `AdamW` elsewhere; gated by `gate` when there is one.
fn step_tensors<B: Backend, const D: usize>(
    s: &Scalars,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    state: Option<AdaptiveMomentumState<B, D>>,
    gate: Option<Tensor<B, 1>>,
) -> (Tensor<B, D>, AdaptiveMomentumState<B, D>) {
    // (`max_moment_2`, AMSGrad's, is never set by Ember; an old record's is carried as is.)
    let (moments, max_moment_2) = match state {
        Some(st) => (Some((st.moment_1, st.moment_2)), st.max_moment_2),
        None => (None, None),
    };
    let (updated, moment_1, moment_2) = adamw_update(tensor, grad, moments, s.update, gate);
    (updated, AdaptiveMomentumState { time: s.time, moment_1, moment_2, max_moment_2 })
}

/// The in-place update on burn-flex f32 tensors (`B::FloatTensorPrimitive` is [`FlexTensor`]).
fn step_flex<B: Backend, const D: usize>(
    s: &Scalars,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    state: Option<AdaptiveMomentumState<B, D>>,
) -> (Tensor<B, D>, AdaptiveMomentumState<B, D>) {
    let mut weight = tensor.into_primitive().tensor();
    let grad = grad.into_primitive().tensor();
    let n = flex(&mut weight).layout().num_elements();
    let grad_flex = flex_ref(&grad);
    assert_eq!(grad_flex.layout().num_elements(), n, "AdamW: gradient and parameter sizes differ");
    let contiguous_grad;
    let g: &[f32] = match grad_flex.as_slice::<f32>() {
        Some(g) => g,
        None => {
            contiguous_grad = grad_flex.to_contiguous();
            &contiguous_grad.storage::<f32>()[..n]
        }
    };

    let mut copied = 0;
    // (`max_moment_2`, AMSGrad's, is never set by Ember; an old record's is carried as is.)
    let (mut moment_1, mut moment_2, max_moment_2, first) = match state {
        Some(st) => (
            st.moment_1.into_primitive().tensor(),
            st.moment_2.into_primitive().tensor(),
            st.max_moment_2,
            false,
        ),
        None => {
            let shape = flex(&mut weight).layout().shape().clone();
            let zeros = || -> B::FloatTensorPrimitive { same(FlexTensor::zeros(shape.clone(), DType::F32)) };
            (zeros(), zeros(), None, true)
        }
    };
    let w = writable(flex(&mut weight), n, &mut copied);
    let m = writable(flex(&mut moment_1), n, &mut copied);
    let v = writable(flex(&mut moment_2), n, &mut copied);
    if copied == 0 {
        count(|c| c.in_place += 1);
    } else {
        count(|c| c.copied += copied);
    }
    update(&s.update, first, w, g, m, v);

    let tensor = |p: B::FloatTensorPrimitive| Tensor::<B, D>::from_primitive(TensorPrimitive::Float(p));
    let momentum = AdaptiveMomentumState {
        time: s.time,
        moment_1: tensor(moment_1),
        moment_2: tensor(moment_2),
        max_moment_2,
    };
    (tensor(weight), momentum)
}

/// The [`FlexTensor`] behind a float primitive `P` (checked by the caller: `P` is `FlexTensor`).
fn flex<P: 'static>(p: &mut P) -> &mut FlexTensor {
    (p as &mut dyn Any).downcast_mut::<FlexTensor>().expect("the float primitive is FlexTensor")
}

fn flex_ref<P: 'static>(p: &P) -> &FlexTensor {
    (p as &dyn Any).downcast_ref::<FlexTensor>().expect("the float primitive is FlexTensor")
}

/// `t`'s `n` f32 elements as one contiguous buffer that only `t` owns, copying it first (and
/// counting the copy in `copied`) when it is shared, strided, offset or oversized.
fn writable<'a>(t: &'a mut FlexTensor, n: usize, copied: &mut u64) -> &'a mut [f32] {
    assert_eq!(t.layout().num_elements(), n, "AdamW: a moment's size differs from its parameter's");
    let whole = t.layout().contiguous_offsets() == Some((0, n)) && t.bytes().len() == n * 4;
    if !whole {
        *t = t.to_contiguous();
    }
    if !whole || !t.is_unique() {
        *copied += 1;
    }
    // Copy-on-write: a no-op when `t` owns its buffer, a copy when it is shared.
    &mut t.storage_mut::<f32>()[..n]
}

/// One AdamW update of `w`, `m`, `v` with gradient `g`, over chunks in parallel when large.
fn update(s: &AdamWScalars, first: bool, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    // Compiled for AVX-512/AVX2 when the CPU has them (wider, same rounding: no FMA contraction).
    let run = |w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]| {
        vectorized(
            #[inline(always)]
            |_| match (first, s.decay_rate != 0.0) {
                (true, true) => kernel::<true, true>(s, w, g, m, v),
                (true, false) => kernel::<true, false>(s, w, g, m, v),
                (false, true) => kernel::<false, true>(s, w, g, m, v),
                (false, false) => kernel::<false, false>(s, w, g, m, v),
            },
        )
    };
    if w.len() >= 2 * CHUNK {
        w.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .for_each(|(((w, g), m), v)| run(w, g, m, v));
    } else {
        run(w, g, m, v);
    }
}

/// The element-wise update, with Burn's operations in Burn's order (each rounded to f32, no
/// fused multiply-add), so its results equal Burn's `AdamW` bit for bit. Branch-free in the
/// loop, which the compiler vectorizes (`vsqrtps`, `vdivps`).
#[inline(always)]
fn kernel<const FIRST: bool, const DECAY: bool>(
    s: &AdamWScalars,
    w: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    let (b1, b2, f1, f2) = (s.beta_1, s.beta_2, s.factor_1, s.factor_2);
    let (c1, c2, eps) = (s.correction_1, s.correction_2, s.epsilon);
    let lr = s.lr as f32;
    let keep = (1.0 - s.decay_rate) as f32;
    let n = w.len();
    let (g, m, v) = (&g[..n], &mut m[..n], &mut v[..n]);
    for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let (mi, vi) =
            if FIRST { (g * f1, (g * g) * f2) } else { (*m * b1 + g * f1, *v * b2 + (g * g) * f2) };
        *m = mi;
        *v = vi;
        let delta = (mi / c1) / ((vi / c2).sqrt() + eps);
        let decayed = if DECAY { *w * keep } else { *w };
        *w = decayed - delta * lr;
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::optim::{AdamW, AdamWConfig};
    use burn::tensor::{Distribution, TensorData};

    use super::*;

    fn burn_adamw(wd: f32) -> AdamW {
        AdamWConfig::new().with_beta_1(0.9).with_beta_2(0.95).with_epsilon(1e-8).with_weight_decay(wd).build()
    }

    fn fused(wd: f32) -> FusedAdamW {
        FusedAdamW { beta_1: 0.9, beta_2: 0.95, epsilon: 1e-8, weight_decay: wd }
    }

    fn bits<const D: usize>(t: &Tensor<Flex, D>) -> Vec<u32> {
        t.to_data().to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
    }

    /// A deep copy (its own buffer), so the fused update may own it.
    fn copy<const D: usize>(t: &Tensor<Flex, D>) -> Tensor<Flex, D> {
        Tensor::from_data(t.to_data(), &Default::default())
    }

    fn assert_same<const D: usize>(
        what: &str,
        (w_a, s_a): &(Tensor<Flex, D>, Option<AdamWState<Flex, D>>),
        (w_b, s_b): &(Tensor<Flex, D>, Option<AdamWState<Flex, D>>),
    ) {
        let (s_a, s_b) = (&s_a.as_ref().unwrap().momentum, &s_b.as_ref().unwrap().momentum);
        assert_eq!(s_a.time, s_b.time, "{what}: step count");
        assert_eq!(bits(w_a), bits(w_b), "{what}: weights");
        assert_eq!(bits(&s_a.moment_1), bits(&s_b.moment_1), "{what}: first moment");
        assert_eq!(bits(&s_a.moment_2), bits(&s_b.moment_2), "{what}: second moment");
    }

    /// Five steps of Burn's `AdamW` and of [`FusedAdamW`] (in place, and through the generic
    /// path) from the same weights with the same random gradients: bit-identical weights,
    /// moments and step counts after every step. `strided` starts from a transposed weight and
    /// feeds transposed gradients (non-contiguous buffers).
    fn compare<const D: usize>(shape: [usize; D], wd: f32, strided: bool) {
        let device = Default::default();
        Flex::seed(&device, 7 + shape.iter().sum::<usize>() as u64);
        let random = |std: f64| {
            if strided {
                // `shape`, laid out transposed: not contiguous.
                let mut transposed = shape;
                transposed.swap(0, D - 1);
                Tensor::<Flex, D>::random(transposed, Distribution::Normal(0.0, std), &device)
                    .swap_dims(0, D - 1)
            } else {
                Tensor::<Flex, D>::random(shape, Distribution::Normal(0.0, std), &device)
            }
        };
        let start = random(1.0);
        let (burn, fused_opt) = (burn_adamw(wd), fused(wd));
        let mut reference = (copy(&start), None);
        let mut in_place = (if strided { start.clone() } else { copy(&start) }, None);
        let mut generic = (copy(&start), None);
        for step in 1..=5 {
            let lr = 1e-3 * step as f64;
            let grad = random(0.1);
            let before = fused_stats();
            reference = SimpleOptimizer::step(&burn, lr, reference.0, copy(&grad), reference.1);
            in_place = SimpleOptimizer::step(&fused_opt, lr, in_place.0, grad.clone(), in_place.1);
            let after = fused_stats();
            if !strided {
                assert_eq!(after.in_place, before.in_place + 1, "step {step}: updated in place");
                assert_eq!(after.copied, before.copied, "step {step}: nothing copied");
            }
            let s = fused_opt.scalars(lr, step);
            let (w, momentum) = step_tensors(
                &s,
                generic.0,
                copy(&grad),
                generic.1.map(|st: AdamWState<Flex, D>| st.momentum),
                None,
            );
            generic = (w, Some(AdamWState { momentum }));
            assert_same(&format!("{shape:?} wd {wd} step {step} fused"), &reference, &in_place);
            assert_same(&format!("{shape:?} wd {wd} step {step} generic"), &reference, &generic);
        }
    }

    #[test]
    fn fused_adamw_equals_burn_adamw_bit_for_bit() {
        for wd in [0.1, 0.0] {
            compare([131, 257], wd, false); // > 2 chunks: the parallel path
            compare([7, 13], wd, false);
            compare([37], wd, false);
            compare([3], wd, false);
            compare([3, 5, 7], wd, false);
        }
    }

    #[test]
    fn strided_weights_and_gradients_are_updated_like_burn() {
        compare([13, 7], 0.1, true);
        compare([129, 300], 0.1, true);
    }

    /// w = 1, g = 0.5, lr = 0.1, β = (0.9, 0.95), ε = 1e-8, λ = 0.1, by hand (in exact
    /// arithmetic; the f32 results agree to 1e-6 relative):
    /// step 1: m = 0.05, v = 0.0125, m̂ = 0.5, v̂ = 0.25, δ = 0.5/(0.5 + 1e-8) = 0.99999998,
    ///         w = 1·(1 − 0.01) − 0.1·δ = 0.890000002;
    /// step 2 (same g): m = 0.095, v = 0.024375, m̂ = 0.095/0.19 = 0.5, v̂ = 0.024375/0.0975 = 0.25,
    ///         w = 0.890000002·0.99 − 0.1·δ = 0.781100004.
    #[test]
    fn hand_computed_steps() {
        let device = Default::default();
        let opt = fused(0.1);
        let t = |x: f32| Tensor::<Flex, 1>::from_data(TensorData::new(vec![x; 3], [3]), &device);
        let first = |v: &Tensor<Flex, 1>| v.to_data().to_vec::<f32>().unwrap()[0];
        for path in ["fused", "generic"] {
            let mut w = t(1.0);
            let mut state: Option<AdamWState<Flex, 1>> = None;
            for (step, (want_w, want_m, want_v)) in
                [(0.890000002, 0.05, 0.0125), (0.781100004, 0.095, 0.024375)].into_iter().enumerate()
            {
                (w, state) = if path == "fused" {
                    SimpleOptimizer::step(&opt, 0.1, w, t(0.5), state)
                } else {
                    let s = opt.scalars(0.1, step + 1);
                    let (w, momentum) = step_tensors(&s, w, t(0.5), state.map(|st| st.momentum), None);
                    (w, Some(AdamWState { momentum }))
                };
                let st = &state.as_ref().unwrap().momentum;
                assert_eq!(st.time, step + 1);
                // Within f32 rounding: 1 − β₁ is 0.100000024 in f32, so m is 0.050000012.
                let close = |got: f32, want: f64| (got as f64 - want).abs() <= 1e-6 * want.abs();
                assert!(close(first(&w), want_w), "{path} step {}: w {} want {want_w}", step + 1, first(&w));
                assert!(close(first(&st.moment_1), want_m), "{path}: m {}", first(&st.moment_1));
                assert!(close(first(&st.moment_2), want_v), "{path}: v {}", first(&st.moment_2));
            }
        }
    }

    /// A weight or moment buffer shared with another tensor (a model clone, a record taken for
    /// a checkpoint) is copied, never written through.
    #[test]
    fn shared_buffers_are_copied_not_written() {
        let device = Default::default();
        let opt = fused(0.1);
        let w = Tensor::<Flex, 2>::random([64, 600], Distribution::Normal(0.0, 1.0), &device);
        let g = Tensor::<Flex, 2>::random([64, 600], Distribution::Normal(0.0, 0.1), &device);
        let (w, state) = SimpleOptimizer::step(&opt, 0.01, w, g.clone(), None);
        let (w_kept, state_kept) = (w.clone(), state.clone());
        let (w_bits, m_bits) = (bits(&w), bits(&state.as_ref().unwrap().momentum.moment_1));
        let before = fused_stats();
        let (w2, state2) = SimpleOptimizer::step(&opt, 0.01, w, g, state);
        assert_eq!(fused_stats().copied, before.copied + 3, "weight, m and v were shared");
        assert_eq!(bits(&w_kept), w_bits);
        assert_eq!(bits(&state_kept.unwrap().momentum.moment_1), m_bits);
        assert_ne!(bits(&w2), w_bits);
        assert_ne!(bits(&state2.unwrap().momentum.moment_1), m_bits);
    }
}
