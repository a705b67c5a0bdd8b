//! Dropout (Srivastava et al. 2014) whose masks can be drawn twice: what activation
//! checkpointing needs to recompute a block exactly.
//!
//! Burn's `Dropout::forward` is active only on an autodiff backend and draws its mask from the
//! backend's random stream wherever that stream happens to be (one stream per process on
//! burn-flex, shared by every thread). Inside [`with_dropout_seed`], the decoder enters stage 0
//! before the embeddings and stage `i + 1` before block `i`, and the `k`-th mask drawn in a
//! stage comes from the backend seeded with `stage_seed(stage_seed(seed, stage), k)` under a
//! process-wide lock ([`dropout`]). Every mask is then a pure function of (seed, stage, k):
//! the same in one forward with a graph and in a forward without one followed by a recompute
//! of each block ([`crate::checkpoint`]), and the same whatever other threads (data-parallel
//! replicas in one process) draw meanwhile. The graph-free pass of checkpointing runs on the
//! inner backend with dropout kept on ([`training_without_graph`]).

use std::cell::Cell;
use std::sync::Mutex;

use burn::nn::Dropout;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

thread_local! {
    /// The seed of this thread's [`with_dropout_seed`] region.
    static SEED: Cell<Option<u64>> = const { Cell::new(None) };
    /// The seed of the current stage, and the masks drawn in it so far.
    static STAGE: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
    /// Dropout stays on without autodiff ([`training_without_graph`]).
    static TRAINING: Cell<bool> = const { Cell::new(false) };
}

/// Restores a thread-local cell when a region ends, also by a panic.
struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<Cell<T>>, T);

impl<T: Copy + 'static> Drop for Restore<T> {
    fn drop(&mut self) {
        self.0.with(|c| c.set(self.1));
    }
}

/// Runs `f` with the decoder's dropout masks drawn per stage from `seed` (see the module
/// docs); the previous seed (or none) is restored afterwards.
pub fn with_dropout_seed<R>(seed: u64, f: impl FnOnce() -> R) -> R {
    let _seed = Restore(&SEED, SEED.with(|s| s.replace(Some(seed))));
    let _stage = Restore(&STAGE, STAGE.with(|s| s.replace(None)));
    f()
}

/// Held from seeding the backend to drawing a mask: other threads' draws cannot come between.
static DRAW: Mutex<()> = Mutex::new(());

/// Holds the lock of the seeded draws: a test's own seed-then-draw cannot be split by a mask.
#[cfg(test)]
pub(crate) fn seeded_draws() -> std::sync::MutexGuard<'static, ()> {
    DRAW.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` with dropout active although the backend has no autodiff: the forward of a
/// training step that keeps no graph.
pub fn training_without_graph<R>(f: impl FnOnce() -> R) -> R {
    let _restore = Restore(&TRAINING, TRAINING.with(|t| t.replace(true)));
    f()
}

/// The seed of `stage` (0: embeddings, `i + 1`: block `i`) under `seed`: SplitMix64's
/// finalizer of `seed ^ (stage + 1)·γ` (Steele et al. 2014), so neighbouring stages draw
/// unrelated streams.
pub fn stage_seed(seed: u64, stage: u64) -> u64 {
    let mut z = seed ^ (stage + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Starts `stage`'s masks inside a [`with_dropout_seed`] region; nothing outside.
fn enter_stage(stage: u64) {
    if let Some(seed) = SEED.with(Cell::get) {
        STAGE.with(|s| s.set(Some((stage_seed(seed, stage), 0))));
    }
}

/// Starts the embeddings' masks (stage 0).
pub(crate) fn enter_embeddings() {
    enter_stage(0);
}

/// Starts block `layer`'s masks (stage `layer + 1`): the same stage in a forward with a graph,
/// in the graph-free forward and in the recompute.
pub(crate) fn enter_block(layer: usize) {
    enter_stage(layer as u64 + 1);
}

/// Whether `dropout` zeroes anything here: `prob > 0` and training (an autodiff backend, or
/// inside [`training_without_graph`]).
pub fn is_active<B: Backend>(dropout: &Dropout, device: &B::Device) -> bool {
    dropout.prob > 0.0 && (B::ad_enabled(device) || TRAINING.with(Cell::get))
}

/// `x` with each element zeroed with probability `prob` and the rest scaled by
/// `1 / (1 − prob)` when [`is_active`]; `x` itself otherwise. The same ops, in the same order,
/// as Burn's `Dropout::forward`; inside a stage (see the module docs) the mask is the stage's
/// next one, drawn from its own seed.
pub fn dropout<B: Backend, const D: usize>(dropout: &Dropout, x: Tensor<B, D>) -> Tensor<B, D> {
    let device = x.device();
    if !is_active::<B>(dropout, &device) {
        return x;
    }
    let keep = 1.0 - dropout.prob;
    let draw = |x: &Tensor<B, D>| x.random_like(Distribution::Bernoulli(keep));
    let mask = match STAGE.with(Cell::get) {
        Some((seed, drawn)) => {
            STAGE.with(|s| s.set(Some((seed, drawn + 1))));
            let _draw = DRAW.lock().unwrap_or_else(|e| e.into_inner());
            B::seed(&device, stage_seed(seed, drawn));
            draw(&x)
        }
        None => draw(&x),
    };
    (x * mask) * (1.0 / keep)
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::DropoutConfig;

    use super::*;

    #[test]
    fn stage_seeds_are_splitmix64() {
        // SplitMix64's first output for state 0 is 0xe220a8397b1dcdaf (Vigna's reference
        // splitmix64.c: the state advances by γ before the finalizer): seed 0, stage 0.
        assert_eq!(stage_seed(0, 0), 0xe220_a839_7b1d_cdaf);
        assert_ne!(stage_seed(7, 1), stage_seed(7, 2));
        assert_ne!(stage_seed(7, 1), stage_seed(8, 1));
    }

    /// Masks drawn in a stage are a function of (seed, stage): the same on the inner backend
    /// in a graph-free training pass as under autodiff, and other stages draw others.
    #[test]
    fn a_stage_draws_the_same_mask_with_and_without_a_graph() {
        let device = Default::default();
        let drop = DropoutConfig::new(0.5).init();
        let draw_ad = |stage| {
            with_dropout_seed(42, || {
                enter_stage(stage);
                dropout(&drop, Tensor::<Autodiff<Flex>, 1>::ones([64], &device)).into_data()
            })
        };
        let draw_inner = |stage| {
            with_dropout_seed(42, || {
                training_without_graph(|| {
                    enter_stage(stage);
                    dropout(&drop, Tensor::<Flex, 1>::ones([64], &device)).into_data()
                })
            })
        };
        let a = draw_ad(3);
        assert_eq!(a, draw_inner(3));
        assert_ne!(a, draw_ad(4));
        let values = a.to_vec::<f32>().unwrap();
        assert!(values.iter().all(|&v| v == 0.0 || v == 2.0), "kept values are scaled by 1/(1-p)");
        assert!(values.contains(&0.0) && values.contains(&2.0));
        // The second mask of a stage is another one.
        let two = with_dropout_seed(42, || {
            enter_stage(3);
            let ones = || Tensor::<Autodiff<Flex>, 1>::ones([64], &device);
            [dropout(&drop, ones()).into_data(), dropout(&drop, ones()).into_data()]
        });
        assert_eq!(two[0], a);
        assert_ne!(two[1], a);
        // Without autodiff and outside a training pass, dropout is the identity.
        let plain = dropout(&drop, Tensor::<Flex, 1>::ones([64], &device));
        assert_eq!(plain.into_data().to_vec::<f32>().unwrap(), vec![1.0; 64]);
    }

    /// Threads drawing at once (in-process data-parallel replicas share burn-flex's one random
    /// stream) still get each stage's masks.
    #[test]
    fn masks_do_not_depend_on_other_threads() {
        let drop = DropoutConfig::new(0.3).init();
        let masks = |seed: u64| {
            with_dropout_seed(seed, || {
                (0..20u64)
                    .map(|stage| {
                        enter_stage(stage);
                        let x = Tensor::<Autodiff<Flex>, 1>::ones([256], &Default::default());
                        dropout(&drop, x).into_data()
                    })
                    .collect::<Vec<_>>()
            })
        };
        let alone = [masks(1), masks(2)];
        let together: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4u64).map(|t| s.spawn(move || masks(1 + t % 2))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (t, got) in together.iter().enumerate() {
            assert_eq!(got, &alone[t % 2], "thread {t}");
        }
    }
}
