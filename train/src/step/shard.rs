//! ZeRO-1: the AdamW state sharded across data-parallel ranks (Rajbhandari et al. 2020, "ZeRO:
//! Memory Optimizations Toward Training Trillion Parameter Models", stage 1, `P_os`).
//!
//! Every rank keeps the whole model and computes the whole (reduced) gradient, as without
//! sharding; each parameter tensor's AdamW moments live on one rank only, its *owner*
//! ([`Partition`]), which alone updates that tensor. After the update the owners' new values
//! are gathered ([`gather_params`]) so every rank holds the whole model again for the next
//! forward. A checkpoint gathers the moments on every rank ([`gather_optimizer_state`]), so its
//! files are those of an unsharded run and resume at any world size, sharded or not.
//!
//! burn-collective 0.21 has all-reduce, reduce and broadcast but no reduce-scatter or
//! all-gather. The gradients are therefore all-reduced as without sharding (each rank then
//! drops what it does not own), and the gather is a second all-reduce of a `[num_params]`
//! buffer in which each rank fills the parameters it owns and −0.0 elsewhere: `x + (−0.0) = x`
//! for every f32 `x` (−0.0 included), so every rank receives the owners' values bit for bit.
//! That is twice the traffic of an unsharded step (a reduce-scatter plus an all-gather would
//! cost one all-reduce's worth).

use std::collections::HashSet;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::record::AdaptorRecord;
use burn::optim::{AdamWState, AdaptiveMomentumState, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

use super::optim::{AdamWGroups, AdamWRecord, ParamRanks};
use super::sync::GradSync;
use crate::error::TrainError;
pub use crate::observe::shards::Partition;

/// This rank's share of the optimizer state: rank `rank` of `world_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptimizerShard {
    /// This rank, from 0.
    pub rank: usize,
    /// Number of data-parallel ranks.
    pub world_size: usize,
}

impl OptimizerShard {
    /// The ids of `module`'s parameters whose state this rank keeps and which it updates
    /// (read off the module each time: loading a record replaces the ids).
    pub fn owned_ids<B: Backend, M: burn::module::Module<B>>(&self, module: &M) -> HashSet<ParamId> {
        let partition = Partition::of(module, self.world_size);
        let mut owned = HashSet::new();
        let mut index = 0;
        module.visit(&mut ParamRanks(|id, _, _| {
            if partition.owners[index] == self.rank {
                owned.insert(id);
            }
            index += 1;
        }));
        owned
    }
}

/// Each rank's updated parameters gathered on every rank: after a sharded update, `module`
/// holds this rank's own parameters up to date and the others stale; the result holds every
/// owner's values (one [`GradSync::gather`]). The own tensors are kept; the others are copied
/// out of the gathered buffer, so no rank keeps more than one copy of the weights.
///
/// Errors: the exchange's (a rank failed, a timeout).
pub fn gather_params<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: M,
    shard: OptimizerShard,
    sync: &mut dyn GradSync<B>,
) -> Result<M, TrainError> {
    let owned = shard.owned_ids(&module);
    struct Fill<'a, B: AutodiffBackend> {
        owned: &'a HashSet<ParamId>,
        pieces: Vec<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Fill<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val().inner();
            let n = value.shape().num_elements();
            self.pieces.push(match self.owned.contains(&param.id) {
                true => value.reshape([n]),
                false => Tensor::full([n], -0.0f32, &value.device()),
            });
        }
    }
    let mut fill = Fill::<B> { owned: &owned, pieces: Vec::new() };
    module.visit(&mut fill);
    let gathered = sync.gather(Tensor::cat(fill.pieces, 0))?;
    struct Take<'a, B: AutodiffBackend> {
        owned: &'a HashSet<ParamId>,
        gathered: Tensor<B::InnerBackend, 1>,
        offset: usize,
    }
    impl<B: AutodiffBackend> ModuleMapper<B> for Take<'_, B> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, value, mapper) = param.consume();
            let shape = value.shape();
            let n = shape.num_elements();
            let range = self.offset..self.offset + n;
            self.offset += n;
            if self.owned.contains(&id) {
                return Param::from_mapped_value(id, value, mapper);
            }
            let require_grad = value.is_require_grad();
            // `× 1` copies the slice into a buffer of its own (exact for every value).
            let piece = self.gathered.clone().slice(range).mul_scalar(1.0).reshape(shape);
            Param::from_mapped_value(id, Tensor::from_inner(piece).set_require_grad(require_grad), mapper)
        }
    }
    Ok(module.map(&mut Take::<B> { owned: &owned, gathered, offset: 0 }))
}

/// The whole AdamW state (every rank's shard) on every rank, for a checkpoint: `optimizer`
/// holds this rank's shard of `module`'s state; the result holds every parameter's, as an
/// unsharded optimizer would. Three [`GradSync::gather`]s, one after the other so that at most
/// one buffer is being built at a time: the step counts (f32, exact below 2²⁴ steps; only each
/// tensor's first slot is read), the first moments, the second moments.
///
/// Errors: the exchange's (a rank failed, a timeout).
pub fn gather_optimizer_state<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    optimizer: &AdamWGroups<M, B>,
    sync: &mut dyn GradSync<B>,
) -> Result<AdamWGroups<M, B>, TrainError> {
    let (decay, no_decay) = optimizer.to_record();
    let records = [&decay, &no_decay];
    let time = gather_part(module, records, Part::Time, sync)?;
    // Each tensor's count, from its first slot (P values read back, not the buffer).
    let mut firsts = Vec::new();
    let mut offset = 0;
    module.visit(&mut ParamRanks(|_, _, n: usize| {
        firsts.push(match n {
            0 => Tensor::zeros([1], &time.device()), // an empty tensor has no state
            _ => time.clone().slice(offset..offset + 1),
        });
        offset += n;
    }));
    drop(time);
    let counts: Vec<f32> = match firsts.is_empty() {
        true => Vec::new(),
        false => Tensor::cat(firsts, 0).into_data().convert::<f32>().to_vec().expect("f32"),
    };
    let m = gather_part(module, records, Part::FirstMoment, sync)?;
    let v = gather_part(module, records, Part::SecondMoment, sync)?;
    // Rebuilt per parameter, in the group its rank puts it in (as `AdamWGroups::step` does).
    struct Rebuild<M: AutodiffModule<B>, B: AutodiffBackend> {
        counts: Vec<f32>,
        m: Tensor<B::InnerBackend, 1>,
        v: Tensor<B::InnerBackend, 1>,
        index: usize,
        offset: usize,
        records: (AdamWRecord<M, B>, AdamWRecord<M, B>),
    }
    impl<M: AutodiffModule<B>, B: AutodiffBackend> ModuleVisitor<B> for Rebuild<M, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let shape = param.lazy_shape();
            let n = shape.num_elements();
            let range = self.offset..self.offset + n;
            let time = self.counts[self.index] as usize;
            (self.offset, self.index) = (self.offset + n, self.index + 1);
            if n == 0 || time == 0 {
                return; // no state yet (before the first step)
            }
            let piece =
                |t: &Tensor<B::InnerBackend, 1>| t.clone().slice(range.clone()).reshape(shape.clone());
            let momentum = AdaptiveMomentumState {
                time,
                moment_1: piece(&self.m),
                moment_2: piece(&self.v),
                max_moment_2: None,
            };
            let record = AdaptorRecord::from_state::<D>(AdamWState { momentum });
            let group = if D >= 2 { &mut self.records.0 } else { &mut self.records.1 };
            group.insert(param.id, record);
        }
    }
    let mut rebuild = Rebuild::<M, B> { counts, m, v, index: 0, offset: 0, records: Default::default() };
    module.visit(&mut rebuild);
    Ok(optimizer.clone().load_record(rebuild.records))
}

/// One part of every parameter's AdamW state.
#[derive(Clone, Copy)]
enum Part {
    /// The step count, repeated over the tensor's slots.
    Time,
    /// `m`.
    FirstMoment,
    /// `v`.
    SecondMoment,
}

/// `part` of every parameter's state in `records`, flattened in module order with −0.0 where
/// this rank holds none, gathered over the ranks: `[num_params]`.
fn gather_part<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    records: [&AdamWRecord<M, B>; 2],
    part: Part,
    sync: &mut dyn GradSync<B>,
) -> Result<Tensor<B::InnerBackend, 1>, TrainError> {
    struct Fill<'a, M: AutodiffModule<B>, B: AutodiffBackend> {
        records: [&'a AdamWRecord<M, B>; 2],
        part: Part,
        pieces: Vec<Tensor<B::InnerBackend, 1>>,
    }
    impl<M: AutodiffModule<B>, B: AutodiffBackend> ModuleVisitor<B> for Fill<'_, M, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let n = param.lazy_shape().num_elements();
            let device = param.lazy_device();
            self.pieces.push(match (momentum::<M, B, D>(self.records, param.id), self.part) {
                (None, _) => Tensor::full([n], -0.0f32, &device),
                (Some(s), Part::Time) => Tensor::full([n], s.time as f32, &device),
                (Some(s), Part::FirstMoment) => s.moment_1.reshape([n]),
                (Some(s), Part::SecondMoment) => s.moment_2.reshape([n]),
            });
        }
    }
    let mut fill = Fill::<M, B> { records, part, pieces: Vec::new() };
    module.visit(&mut fill);
    sync.gather(Tensor::cat(fill.pieces, 0))
}

/// Parameter `id`'s AdamW moments in either group's record, if it has any.
fn momentum<M: AutodiffModule<B>, B: AutodiffBackend, const D: usize>(
    records: [&AdamWRecord<M, B>; 2],
    id: ParamId,
) -> Option<AdaptiveMomentumState<B::InnerBackend, D>> {
    let state = records.iter().find_map(|r| r.get(&id)).cloned()?;
    Some(state.into_state::<D>().momentum)
}

/// Bytes of AdamW state (`m` and `v`, f32 or as stored) that `optimizer` holds for `module`:
/// what this rank really keeps — all of the model's 8 B/param unsharded, its shard's with
/// ZeRO-1.
pub fn optimizer_state_bytes<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    optimizer: &AdamWGroups<M, B>,
) -> usize {
    let (decay, no_decay) = optimizer.to_record();
    struct Count<'a, M: AutodiffModule<B>, B: AutodiffBackend> {
        records: [&'a AdamWRecord<M, B>; 2],
        bytes: usize,
    }
    impl<M: AutodiffModule<B>, B: AutodiffBackend> ModuleVisitor<B> for Count<'_, M, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(s) = momentum::<M, B, D>(self.records, param.id) {
                let bytes = |t: &Tensor<B::InnerBackend, D>| t.shape().num_elements() * t.dtype().size();
                self.bytes += bytes(&s.moment_1) + bytes(&s.moment_2);
                self.bytes += s.max_moment_2.as_ref().map_or(0, bytes);
            }
        }
    }
    let mut count = Count::<M, B> { records: [&decay, &no_decay], bytes: 0 };
    module.visit(&mut count);
    count.bytes
}
