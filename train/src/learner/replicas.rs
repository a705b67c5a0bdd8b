//! The data-parallel replicas of an [`EmberStrategy`](super::EmberStrategy): rank 0 is the
//! burn-train `Learner` on the calling thread; ranks 1.. are copies of it (model, optimizer,
//! scheduler), one thread each, stepping in lockstep through the all-reduce `ember train` uses
//! ([`CollectivePeer`]): one exchange per optimizer step.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::Duration;

use burn::optim::lr_scheduler::LrScheduler;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use burn_train::Learner;
use ember_data::Batch;

use super::model::EmberLm;
use super::strategy::{EmberComponents, LearnerTarget};
use crate::config::Strategy;
use crate::error::TrainError;
use crate::parallel::{join_group, param_hash, CollectivePeer, Group};
use crate::step::{optimizer_step, GradSync, StepOutput, StepSettings, StepTarget};

/// What the replicas of a strategy's last `fit` did, for the caller to check.
#[derive(Debug, Default)]
pub struct ReplicaStats {
    /// All-reduces rank 0 took part in.
    pub(super) exchanges: AtomicUsize,
    /// Optimizer steps taken.
    pub(super) steps: AtomicUsize,
    /// Steps at which the replicas' parameter hashes were compared (and agreed).
    pub(super) hash_checks: AtomicUsize,
    /// Why the strategy stopped the fit, if it did.
    pub(super) stop_reason: std::sync::Mutex<Option<String>>,
}

impl ReplicaStats {
    /// Clears the counts at the start of a fit.
    pub(super) fn reset(&self) {
        for count in [&self.exchanges, &self.steps, &self.hash_checks] {
            count.store(0, Ordering::Relaxed);
        }
        *self.stop_reason.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// One optimizer step's share of a replica: its rows of each micro-batch.
pub(super) struct Job {
    /// The optimizer step within the epoch (as rank 0 numbers it).
    step: u64,
    /// This replica's rows of each of the step's micro-batches.
    micro_batches: Vec<Batch>,
    /// Compare the parameter hashes in this step's exchange.
    check: bool,
}

/// Rank 0's side of the replicas 1..N: the jobs it sends and the results it gets back.
pub(super) struct Replica {
    pub(super) jobs: Sender<Job>,
    pub(super) results: Receiver<Result<(), TrainError>>,
}

/// Rank 0 in a group of replicas: its peer in the collective and the other replicas.
pub(super) struct Peers<B: AutodiffBackend> {
    pub(super) peer: CollectivePeer<B>,
    pub(super) replicas: Vec<Replica>,
    /// Compare parameter hashes at the first step and every this many.
    pub(super) check_every: u64,
    /// Optimizer steps taken so far in this fit (across epochs).
    pub(super) steps: u64,
}

/// Each rank's rows of every micro-batch: `shares[r]` is rank `r`'s parts of the step's
/// micro-batches, in order ([`Batch::split_rows`]: contiguous rows, so the ranks' shares
/// together are the step's global batch). A micro-batch with fewer rows than there are ranks
/// (the end of an epoch) goes to the first ranks, one row each; the others have no part of it
/// and contribute nothing for it to the exchange.
fn shares(micro_batches: &[Batch], world: usize) -> Vec<Vec<Batch>> {
    let mut shares = vec![Vec::with_capacity(micro_batches.len()); world];
    for batch in micro_batches {
        let parts = batch.split_rows(world.min(batch.batch_size)).expect("1 ≤ parts ≤ rows");
        for (share, part) in shares.iter_mut().zip(parts) {
            share.push(part);
        }
    }
    shares
}

impl<B: AutodiffBackend> Peers<B> {
    /// One optimizer step of every replica on `micro_batches` (each split by rows across the
    /// replicas), with rank 0 updating `target`. Its output is rank 0's, which every replica
    /// shares: the global batch's loss, gradient norm and scored tokens.
    ///
    /// Errors: a replica failed (the error names it, with its own message), the replicas'
    /// parameters differ, the step's own errors (e.g. no scored target in the global batch).
    pub(super) fn step(
        &mut self,
        target: &mut impl StepTarget<B>,
        micro_batches: &[Batch],
        settings: StepSettings,
        device: &B::Device,
        stats: &ReplicaStats,
    ) -> Result<StepOutput<B::InnerBackend>, TrainError> {
        let mut shares = shares(micro_batches, self.replicas.len() + 1).into_iter();
        let own = shares.next().expect("rank 0's share");
        self.steps += 1;
        let check = self.steps == 1 || self.steps.is_multiple_of(self.check_every.max(1));
        for (rank, (replica, share)) in self.replicas.iter().zip(shares).enumerate() {
            let job = Job { step: settings.step, micro_batches: share, check };
            replica.jobs.send(job).map_err(|_| stopped(rank + 1))?;
        }
        let settings = StepSettings { param_hash: check.then(|| param_hash(target.model())), ..settings };
        let num_params = target.model().num_params();
        let out = guarded_step(0, &mut self.peer, num_params, |peer| {
            optimizer_step(target, &own, settings, peer, None, device)
        });
        stats.exchanges.store(self.peer.all_reduce_calls(), Ordering::Relaxed);
        // Every replica answers. A replica's own failure (not its reaction to another's, nor
        // rank 0's) is the one to report, naming it.
        let mut failures = Vec::new();
        for (rank, replica) in self.replicas.iter().enumerate() {
            if let Err(e) = replica.results.recv().unwrap_or_else(|_| Err(stopped(rank + 1))) {
                failures.push((rank + 1, e));
            }
        }
        if let Err(e @ TrainError::ReplicaFailed { .. }) = out {
            return Err(e);
        }
        let own_failure = failures.iter().position(|(_, e)| !e.is_reaction());
        let out = match (out, own_failure) {
            (_, Some(i)) => {
                return Err(match failures.swap_remove(i) {
                    (_, e @ TrainError::ReplicaFailed { .. }) => e,
                    (rank, e) => TrainError::ReplicaFailed { rank, message: e.to_string() },
                });
            }
            (Ok(out), None) => match failures.pop() {
                Some((_, e)) => return Err(e),
                None => out,
            },
            (Err(e), None) => return Err(e),
        };
        if check {
            if out.replicas_agree != Some(true) {
                return Err(TrainError::ReplicasDiffer { step: settings.step, rank: 0 });
            }
            stats.hash_checks.fetch_add(1, Ordering::Relaxed);
        }
        stats.steps.fetch_add(1, Ordering::Relaxed);
        Ok(out)
    }

    /// Ends the replicas' loops and leaves the collective.
    pub(super) fn finish(mut self) {
        drop(std::mem::take(&mut self.replicas));
        self.peer.finish();
    }
}

/// A replica that is gone (its thread ended).
fn stopped(rank: usize) -> TrainError {
    TrainError::ReplicaFailed { rank, message: "its thread ended".into() }
}

/// How a replica joins and steps.
pub(super) struct ReplicaSetup<B: AutodiffBackend> {
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) device: B::Device,
    pub(super) group: Group,
    pub(super) timeout: Duration,
    pub(super) grad_clip: f64,
    pub(super) checkpointing: ember_model::ActivationCheckpointing,
}

/// Joins rank `rank` of `world` to the local collective of `group` (tree all-reduce, as
/// [`Group::local`] configures it).
///
/// Errors: burn-collective refuses it, or the other replicas do not join in time.
pub(super) fn join<B: AutodiffBackend>(
    rank: usize,
    world: usize,
    device: &B::Device,
    group: Group,
    timeout: Duration,
) -> Result<CollectivePeer<B>, TrainError> {
    join_group(rank, world, device, group, timeout, Strategy::Tree)
}

/// The loop of replica `setup.rank`: joins the collective, then for each job advances its
/// scheduler and takes the step on its share with its own copy of the learner, reporting each
/// result. A panic in its step is reported as its failure, and the other replicas are told
/// (their exchange fails naming this rank) instead of waiting for it.
pub(super) fn serve<B, LR, O>(
    setup: ReplicaSetup<B>,
    mut learner: Learner<EmberComponents<B, LR, O>>,
    jobs: Receiver<Job>,
    results: Sender<Result<(), TrainError>>,
) where
    B: AutodiffBackend,
    LR: LrScheduler + 'static,
    O: Optimizer<EmberLm<B>, B> + 'static,
{
    learner.fork(&setup.device);
    let mut peer = match join::<B>(setup.rank, setup.world, &setup.device, setup.group, setup.timeout) {
        Ok(peer) => peer,
        Err(e) => {
            let _ = results.send(Err(e));
            return;
        }
    };
    let num_params = learner.model().model.num_params();
    while let Ok(job) = jobs.recv() {
        learner.lr_step();
        let model = learner.model();
        let param_hash = job.check.then(|| param_hash(&model.model));
        let settings = StepSettings {
            param_hash,
            checkpointing: setup.checkpointing,
            ..StepSettings::new(job.step, learner.lr_current(), setup.grad_clip)
        };
        let mut target = LearnerTarget { model: Some(model), learner: &mut learner };
        let result = guarded_step(setup.rank, &mut peer, num_params, |peer| {
            optimizer_step(&mut target, &job.micro_batches, settings, peer, None, &setup.device)
        })
        .map(|_| ());
        let failed = result.is_err();
        let _ = results.send(result);
        if failed {
            return;
        }
    }
    peer.finish();
}

/// Runs replica `rank`'s optimizer step `step` through `peer`. A panic in it is this replica's
/// failure: the others are told at once (their exchange fails naming this rank) instead of
/// waiting for it until the timeout, and it becomes [`TrainError::ReplicaFailed`].
fn guarded_step<B: AutodiffBackend>(
    rank: usize,
    peer: &mut CollectivePeer<B>,
    num_params: usize,
    step: impl FnOnce(&mut CollectivePeer<B>) -> Result<StepOutput<B::InnerBackend>, TrainError>,
) -> Result<StepOutput<B::InnerBackend>, TrainError> {
    match catch_unwind(AssertUnwindSafe(|| step(&mut *peer))) {
        Ok(out) => out,
        Err(panic) => {
            peer.abort(num_params);
            let message = format!("its step panicked: {}", panic_message(&*panic));
            Err(TrainError::ReplicaFailed { rank, message })
        }
    }
}

/// The text of a panic's payload (a `String` or `&str`; else "a panic").
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}
