//! Gradient synchronization across data-parallel ranks: one all-reduce per optimizer step,
//! through Burn's collective engine (burn-collective).
//!
//! The exchanged buffer is `[∇ Σ NLL of every parameter (flattened, in module order) | Σ NLL |
//! scored tokens | stop | failed ranks | parameter-hash bytes | their squares]`, all summed:
//! - the gradients and Σ NLL are divided by the summed token count afterwards, so the update
//!   is the global batch's token mean (the count is reduced before the loss is normalized);
//! - `stop > 0` means some rank asked to stop (every rank stops after the same step);
//! - `failed ranks` is Σ (rank + 1) over ranks that hit an error: the others stop too, naming it;
//! - the 8 bytes of each rank's 64-bit parameter hash and their squares are summed: the hashes
//!   are all equal exactly when, for every byte, Σ x² · W = (Σ x)² (zero variance) — exact
//!   in f32 for up to 256 ranks.

use std::sync::{mpsc, Arc, Barrier};
use std::time::Duration;

use burn::collective::{self, CollectiveConfig, PeerId, ReduceOperation};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorPrimitive};
use ember_model::LanguageModel;

use crate::error::TrainError;

/// One rank's share of an optimizer step.
pub struct Contribution<B: AutodiffBackend> {
    /// `∇ Σ NLL` summed over this rank's micro-batches.
    pub grads: GradientsParams,
    /// `Σ NLL` (nats), `[1]`.
    pub nll_sum: Tensor<B::InnerBackend, 1>,
    /// Scored tokens of this rank's micro-batches.
    pub tokens: f64,
    /// This rank asks every rank to stop after this step.
    pub stop: bool,
    /// This rank's parameter hash, when replicas are checked at this step.
    pub param_hash: Option<u64>,
}

/// The sums over all ranks.
pub struct Exchanged<B: AutodiffBackend> {
    /// Σ over ranks of `∇ Σ NLL`.
    pub grads: GradientsParams,
    /// Σ over ranks of `Σ NLL`, `[1]`.
    pub nll_sum: Tensor<B::InnerBackend, 1>,
    /// Scored tokens of the global batch.
    pub tokens: f64,
    /// Some rank asked to stop.
    pub stop: bool,
    /// `Some(agree)` when hashes were compared in this exchange.
    pub hashes_agree: Option<bool>,
}

/// Sums contributions over data-parallel ranks.
pub trait GradSync<B: AutodiffBackend> {
    /// This rank, from 0.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Sums `local` with every other rank's (one collective call).
    ///
    /// Errors: another rank failed (named); the exchange timed out; the collective failed.
    fn exchange(
        &mut self,
        model: &LanguageModel<B>,
        local: Contribution<B>,
    ) -> Result<Exchanged<B>, TrainError>;
    /// Tells the other ranks that this rank failed, so they stop instead of waiting for it
    /// (`num_params`: the model's parameter count, the size of the exchange).
    fn abort(&mut self, num_params: usize);
    /// Gradient all-reduces done so far.
    fn all_reduce_calls(&self) -> usize;
    /// Bytes all-reduced per exchange for a model of `num_params` parameters (0 for a single
    /// worker).
    fn bytes_per_exchange(&self, num_params: usize) -> usize;
    /// The all-reduce strategy, in words.
    fn strategy(&self) -> String;
    /// Leaves the group at the end of a run (after this rank's last exchange).
    fn finish(&mut self) {}
}

/// A single worker: nothing to exchange.
pub struct Solo;

impl<B: AutodiffBackend> GradSync<B> for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn exchange(&mut self, _: &LanguageModel<B>, local: Contribution<B>) -> Result<Exchanged<B>, TrainError> {
        Ok(Exchanged {
            grads: local.grads,
            nll_sum: local.nll_sum,
            tokens: local.tokens,
            stop: local.stop,
            hashes_agree: local.param_hash.map(|_| true),
        })
    }
    fn abort(&mut self, _: usize) {}
    fn all_reduce_calls(&self) -> usize {
        0
    }
    fn bytes_per_exchange(&self, _: usize) -> usize {
        0
    }
    fn strategy(&self) -> String {
        "none (1 rank)".into()
    }
}

/// Slots after the flattened gradients: Σ NLL, tokens, stop, failed ranks, 8 hash bytes, 8
/// squares, hash present.
const EXTRAS: usize = 4 + 8 + 8 + 1;

/// A rank of a burn-collective group: local threads (one per device) and, across processes,
/// burn-collective's global orchestrator.
///
/// Across processes, burn-collective 0.21.0 hangs on the second global all-reduce (its node's
/// `SyncService` never clears the list of peers that synced; upstream issue #4549). Ember works
/// around it without patching Burn: after every global all-reduce, each rank leaves the
/// collective and registers again — a fresh node, hence a fresh sync list — alternating
/// between two orchestrators (and two data-service ports), so a rank that registers for the
/// next step never meets a node still leaving the previous one. The re-registration runs on a
/// background thread, overlapped with the next step's forward and backward passes.
pub struct CollectivePeer<B: AutodiffBackend> {
    peer: PeerId,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    strategy: String,
    calls: usize,
    /// Test-only fault injection: at this exchange (counted from 1), use this rank's own
    /// gradient instead of the reduced one, as if it had skipped the all-reduce.
    skip_at: Option<usize>,
    device: burn::tensor::Device<B::InnerBackend>,
    /// The configurations registered in turn: one (a single process) or two (several).
    rounds: Vec<CollectiveConfig>,
    /// Every local peer leaves before any registers again.
    local_barrier: Arc<Barrier>,
    /// The re-registration in flight.
    rejoin: Option<mpsc::Receiver<Result<(), String>>>,
}

impl<B: AutodiffBackend> CollectivePeer<B> {
    /// Registers rank `rank` (of `world_size`) on `device` with burn-collective using
    /// `rounds[0]`; blocks until every peer has registered (or `timeout`). `local_barrier`
    /// is shared by the peers of this process.
    ///
    /// Errors: burn-collective refuses the registration; the other peers did not register
    /// within `timeout`.
    pub fn register(
        rank: usize,
        world_size: usize,
        device: burn::tensor::Device<B::InnerBackend>,
        rounds: Vec<CollectiveConfig>,
        local_barrier: Arc<Barrier>,
        timeout: Duration,
        strategy: String,
    ) -> Result<Self, TrainError> {
        let peer = PeerId(rank as u32);
        let (config, inner) = (rounds[0].clone(), device.clone());
        let registered = background(move || {
            collective::register::<B::InnerBackend>(peer, inner, config).map_err(|e| format!("{e:?}"))
        });
        wait(registered, timeout, rank, "while joining the other ranks")?.map_err(|e| {
            TrainError::Sync(format!("rank {rank}: cannot join the collective: {}", explain(&e)))
        })?;
        let skip_at = crate::replica::test_switch("EMBER_TEST_SKIP_ALL_REDUCE", rank).map(|n| n as usize);
        Ok(Self {
            peer,
            rank,
            world_size,
            timeout,
            strategy,
            calls: 0,
            skip_at,
            device,
            rounds,
            local_barrier,
            rejoin: None,
        })
    }

    /// Waits for a re-registration in flight.
    fn rejoined(&mut self) -> Result<(), TrainError> {
        match self.rejoin.take() {
            Some(rejoin) => wait(rejoin, self.timeout, self.rank, "while registering for the next step")?
                .map_err(|e| {
                    TrainError::Sync(format!("rank {}: cannot rejoin the collective: {e}", self.rank))
                }),
            None => Ok(()),
        }
    }

    /// One all-reduce (sum) of `buffer`, failing after the timeout instead of hanging.
    fn all_reduce(
        &mut self,
        buffer: Tensor<B::InnerBackend, 1>,
    ) -> Result<Tensor<B::InnerBackend, 1>, TrainError> {
        self.rejoined()?;
        self.calls += 1;
        let (peer, primitive) = (self.peer, buffer.into_primitive().tensor());
        let reduced = background(move || {
            collective::all_reduce::<B::InnerBackend>(peer, primitive, ReduceOperation::Sum)
        });
        let reduced = wait(reduced, self.timeout, self.rank, "in the all-reduce")?.map_err(|e| {
            TrainError::Sync(format!(
                "rank {}: the all-reduce failed ({e:?}; a rank stopped or disconnected)",
                self.rank
            ))
        })?;
        if self.rounds.len() > 1 {
            // Leave and register again for the next step (see the type's documentation).
            let (peer, device, barrier) = (self.peer, self.device.clone(), self.local_barrier.clone());
            let next = self.rounds[self.calls % self.rounds.len()].clone();
            self.rejoin = Some(background(move || {
                collective::finish_collective::<B::InnerBackend>(peer).map_err(|e| format!("{e:?}"))?;
                barrier.wait();
                collective::register::<B::InnerBackend>(peer, device, next).map_err(|e| format!("{e:?}"))
            }));
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(reduced)))
    }

    fn extras(&self, tokens: f64, stop: bool, failed: bool, hash: Option<u64>) -> Tensor<B::InnerBackend, 1> {
        let mut extras =
            vec![tokens as f32, f32::from(u8::from(stop)), if failed { (self.rank + 1) as f32 } else { 0.0 }];
        let bytes = hash.map_or([0u8; 8], u64::to_le_bytes);
        extras.extend(bytes.iter().map(|&b| f32::from(b)));
        extras.extend(bytes.iter().map(|&b| f32::from(b) * f32::from(b)));
        extras.push(f32::from(u8::from(hash.is_some())));
        Tensor::from_floats(extras.as_slice(), &self.device)
    }
}

impl<B: AutodiffBackend> GradSync<B> for CollectivePeer<B> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn exchange(
        &mut self,
        model: &LanguageModel<B>,
        local: Contribution<B>,
    ) -> Result<Exchanged<B>, TrainError> {
        let flat = flatten::<B>(model, &local.grads);
        let n = flat.dims()[0];
        let extras = self.extras(local.tokens, local.stop, false, local.param_hash);
        let buffer = Tensor::cat(vec![flat.clone(), local.nll_sum.to_device(&self.device), extras], 0);
        let reduced = self.all_reduce(buffer)?;
        let tail: Vec<f32> =
            reduced.clone().slice(n..n + EXTRAS).into_data().convert::<f32>().to_vec().expect("f32");
        let (tokens, stop, failed) = (tail[1] as f64, tail[2] > 0.0, tail[3]);
        if failed > 0.0 {
            return Err(TrainError::Sync(format!(
                "rank {} stopped with an error (see its message); stopping rank {} too",
                failed.round() as usize - 1,
                self.rank
            )));
        }
        let hashes_agree = (tail[EXTRAS - 1] > 0.0).then(|| {
            let w = self.world_size as f32;
            (0..8).all(|i| {
                let (sum, sum_sq) = (tail[4 + i], tail[12 + i]);
                sum_sq * w == sum * sum
            })
        });
        let flat_global = if self.skip_at == Some(self.calls) { flat } else { reduced.clone().slice(0..n) };
        let grads = unflatten::<B>(model, flat_global);
        let nll_sum = reduced.slice(n..n + 1);
        Ok(Exchanged { grads, nll_sum, tokens, stop, hashes_agree })
    }

    fn abort(&mut self, n: usize) {
        let zeros = Tensor::<B::InnerBackend, 1>::zeros([n + 1], &self.device);
        let buffer = Tensor::cat(vec![zeros, self.extras(0.0, true, true, None)], 0);
        let _ = self.all_reduce(buffer);
    }

    fn all_reduce_calls(&self) -> usize {
        self.calls
    }

    fn bytes_per_exchange(&self, num_params: usize) -> usize {
        4 * (num_params + EXTRAS)
    }

    fn strategy(&self) -> String {
        self.strategy.clone()
    }

    fn finish(&mut self) {
        if self.rejoined().is_ok() {
            let _ = collective::finish_collective::<B::InnerBackend>(self.peer);
        }
    }
}

/// burn-collective's registration errors, with what to do about them.
fn explain(error: &str) -> String {
    if error.contains("DoubleRegister") {
        format!("{error}: the coordinator still holds a registration of a run that failed; restart `ember coordinator` (burn-collective 0.21 keeps it)")
    } else {
        error.to_string()
    }
}

/// Runs `f` on a new thread; its result arrives on the returned channel.
fn background<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// The result from `rx`, or an error naming `rank` and `what` after `timeout` (or as soon as
/// burn-collective's side gives up, e.g. a peer's connection closed).
fn wait<T>(rx: mpsc::Receiver<T>, timeout: Duration, rank: usize, what: &str) -> Result<T, TrainError> {
    rx.recv_timeout(timeout).map_err(|e| {
        TrainError::Sync(match e {
            mpsc::RecvTimeoutError::Timeout => format!(
                "rank {rank}: no answer from the other ranks within {} s ({what}; a rank stopped or disconnected)",
                timeout.as_secs()
            ),
            mpsc::RecvTimeoutError::Disconnected => {
                format!("rank {rank}: the collective failed ({what}; a rank stopped or disconnected)")
            }
        })
    })
}

/// Every gradient of `model`, flattened in module order and concatenated: `[num_params]`.
fn flatten<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    grads: &GradientsParams,
) -> Tensor<B::InnerBackend, 1> {
    struct Flatten<'a, B: AutodiffBackend>(&'a GradientsParams, Vec<Tensor<B::InnerBackend, 1>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = self
                .0
                .get::<B::InnerBackend, D>(param.id)
                .unwrap_or_else(|| Tensor::zeros(param.lazy_shape(), &param.lazy_device()));
            let numel = grad.shape().num_elements();
            self.1.push(grad.reshape([numel]));
        }
    }
    let mut visitor = Flatten::<B>(grads, Vec::new());
    model.visit(&mut visitor);
    Tensor::cat(visitor.1, 0)
}

/// The inverse of [`flatten`]: `flat` (`[num_params]`) cut back into every parameter's
/// gradient.
fn unflatten<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    flat: Tensor<B::InnerBackend, 1>,
) -> GradientsParams {
    struct Unflatten<B: AutodiffBackend> {
        flat: Tensor<B::InnerBackend, 1>,
        offset: usize,
        grads: GradientsParams,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let shape = param.lazy_shape();
            let numel = shape.num_elements();
            let piece = self.flat.clone().slice(self.offset..self.offset + numel).reshape(shape);
            self.offset += numel;
            let id: ParamId = param.id;
            self.grads.register::<B::InnerBackend, D>(id, piece);
        }
    }
    let mut visitor = Unflatten::<B> { flat, offset: 0, grads: GradientsParams::new() };
    model.visit(&mut visitor);
    visitor.grads
}

/// A 64-bit FNV-1a hash of every parameter's bytes in module order: equal on two replicas
/// exactly when their parameters are bit-identical (up to hash collisions).
pub fn param_hash<B: Backend>(model: &LanguageModel<B>) -> u64 {
    struct Hash(u64);
    impl<B: Backend> ModuleVisitor<B> for Hash {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            for &byte in param.val().into_data().as_bytes() {
                self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    let mut hash = Hash(0xcbf2_9ce4_8422_2325);
    model.visit(&mut hash);
    hash.0
}

/// A 64-bit FNV-1a hash of `text` (run settings that every rank must share).
pub fn text_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The scalar value of a `[1]` tensor.
pub fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    t.into_scalar().elem()
}
