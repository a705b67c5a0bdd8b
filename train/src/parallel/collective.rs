//! Gradient synchronization across data-parallel ranks: one all-reduce per optimizer step,
//! through Burn's collective engine (burn-collective).
//!
//! The exchanged buffer is `[∇ Σ NLL of every parameter (flattened, in module order) | Σ NLL |
//! scored tokens (two 16-bit limbs) | stop | checkpoint | failed ranks | parameter-hash bytes |
//! their squares | hash present]`, all summed in f32:
//! - the gradients and Σ NLL are divided by the summed token count afterwards, so the update
//!   is the global batch's token mean (the count is reduced before the loss is normalized);
//!   the count travels as `tokens mod 2¹⁶` and `tokens div 2¹⁶`, whose sums are exact in f32
//!   for up to 256 ranks, so it arrives as an exact integer (a single f32 would round past
//!   2²⁴ tokens);
//! - `stop > 0` means some rank asked to stop (every rank stops after the same step);
//!   `checkpoint > 0` that some rank asked for a checkpoint after it;
//! - `failed ranks` is Σ (rank + 1) over ranks that hit an error: the others stop too, naming it;
//! - the 8 bytes of each rank's 64-bit parameter hash and their squares are summed: the hashes
//!   are all equal exactly when, for every byte, Σ x² · W = (Σ x)² (zero variance) — exact
//!   in f32 for up to 256 ranks.
//!
//! ZeRO-1's gathers ([`GradSync::gather`]) carry the same layout, parameters in place of the
//! gradients and nothing but the failure slot set, so a rank that fails while the others
//! gather still reaches them.

use std::sync::{mpsc, Arc, Barrier};
use std::time::Duration;

use burn::collective::{self, CollectiveConfig, PeerId, ReduceOperation};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorPrimitive};
use ember_model::LanguageModel;

use super::buffer::{flatten, unflatten};
use crate::error::TrainError;
use crate::step::{Contribution, Exchanged, GradSync};

/// Slots after the flattened gradients: Σ NLL, tokens (2 limbs), stop, checkpoint, failed
/// ranks, 8 hash bytes, 8 squares, hash present.
pub const EXTRAS: usize = 6 + 8 + 8 + 1;

/// Where the failure slot and the hash bytes are among the extras.
const FAILED: usize = 5;
const HASH: usize = 6;

/// The most scored tokens one rank may contribute to a step: two 16-bit limbs.
const MAX_TOKENS: u64 = 1 << 32;

/// A rank of a burn-collective group: local threads (one per device) and, across processes,
/// burn-collective's global orchestrator.
///
/// Across processes, burn-collective 0.21.0 hangs on the second global all-reduce (upstream
/// issue #4549): after every global all-reduce each rank leaves and registers again,
/// alternating between two orchestrators, on a background thread — see this folder's
/// README.md for why and what it costs.
pub struct CollectivePeer<B: AutodiffBackend> {
    peer: PeerId,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    strategy: String,
    calls: usize,
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
            TrainError::Exchange { rank, message: format!("cannot join the collective: {}", explain(&e)) }
        })?;
        Ok(Self {
            peer,
            rank,
            world_size,
            timeout,
            strategy,
            calls: 0,
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
                .map_err(|e| TrainError::Exchange {
                    rank: self.rank,
                    message: format!("cannot rejoin the collective: {e}"),
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
            TrainError::Exchange {
                rank: self.rank,
                message: format!("the all-reduce failed ({e:?}; a rank stopped or disconnected)"),
            }
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

    /// The extras of a reduced buffer whose payload is `n` long, read back; the error naming
    /// the failed rank when one said it failed.
    fn tail(&self, reduced: &Tensor<B::InnerBackend, 1>, n: usize) -> Result<Vec<f32>, TrainError> {
        let tail: Vec<f32> =
            reduced.clone().slice(n..n + EXTRAS).into_data().convert::<f32>().to_vec().expect("f32");
        match tail[FAILED] {
            failed if failed > 0.0 => {
                Err(TrainError::PeerFailed { rank: failed.round() as usize - 1, this_rank: self.rank })
            }
            _ => Ok(tail),
        }
    }

    /// The slots after Σ NLL: every value a small integer, so their sums are exact in f32.
    fn extras(
        &self,
        tokens: u64,
        [stop, checkpoint]: [bool; 2],
        failed: bool,
        hash: Option<u64>,
    ) -> Tensor<B::InnerBackend, 1> {
        let mut extras = vec![
            (tokens & 0xFFFF) as f32,
            (tokens >> 16) as f32,
            f32::from(u8::from(stop)),
            f32::from(u8::from(checkpoint)),
            if failed { (self.rank + 1) as f32 } else { 0.0 },
        ];
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
        if local.tokens >= MAX_TOKENS {
            return Err(TrainError::Exchange {
                rank: self.rank,
                message: format!(
                    "{} scored tokens in one step: more than the exchange carries exactly ({MAX_TOKENS}); lower micro_batch_size or accumulation_steps",
                    local.tokens
                ),
            });
        }
        let flat = flatten::<B>(model, &local.grads);
        let n = flat.dims()[0];
        let extras = self.extras(local.tokens, [local.stop, local.checkpoint], false, local.param_hash);
        let buffer = Tensor::cat(vec![flat, local.nll_sum.to_device(&self.device), extras], 0);
        let reduced = self.all_reduce(buffer)?;
        let tail = self.tail(&reduced, n)?;
        let tokens = tail[1] as u64 + ((tail[2] as u64) << 16);
        let (stop, checkpoint) = (tail[3] > 0.0, tail[4] > 0.0);
        let hashes_agree = (tail[EXTRAS - 1] > 0.0).then(|| {
            let w = self.world_size as f32;
            (0..8).all(|i| {
                let (sum, sum_sq) = (tail[HASH + i], tail[HASH + 8 + i]);
                sum_sq * w == sum * sum
            })
        });
        let grads = unflatten::<B>(model, reduced.clone().slice(0..n));
        let nll_sum = reduced.slice(n..n + 1);
        Ok(Exchanged { grads, nll_sum, tokens, stop, checkpoint, hashes_agree })
    }

    fn gather(
        &mut self,
        buffer: Tensor<B::InnerBackend, 1>,
    ) -> Result<Tensor<B::InnerBackend, 1>, TrainError> {
        let n = buffer.dims()[0];
        let zero = Tensor::zeros([1], &self.device);
        let extras = self.extras(0, [false, false], false, None);
        let reduced = self.all_reduce(Tensor::cat(vec![buffer.to_device(&self.device), zero, extras], 0))?;
        self.tail(&reduced, n)?;
        Ok(reduced.slice(0..n))
    }

    fn abort(&mut self, n: usize) {
        let zeros = Tensor::<B::InnerBackend, 1>::zeros([n + 1], &self.device);
        let buffer = Tensor::cat(vec![zeros, self.extras(0, [true, false], true, None)], 0);
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
    rx.recv_timeout(timeout).map_err(|e| TrainError::Exchange {
        rank,
        message: match e {
            mpsc::RecvTimeoutError::Timeout => format!(
                "no answer from the other ranks within {} s ({what}; a rank stopped or disconnected)",
                timeout.as_secs()
            ),
            mpsc::RecvTimeoutError::Disconnected => {
                format!("the collective failed ({what}; a rank stopped or disconnected)")
            }
        },
    })
}
