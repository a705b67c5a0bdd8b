//! Epoch-based sampling that resumes exactly: every epoch is a permutation of the rows drawn
//! from `(seed, epoch)`, split into disjoint equal parts for the data-parallel ranks.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::DataError;

/// One output of SplitMix64 from state `x` (Steele, Lea & Flood 2014; Vigna's reference constants).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Where a rank is in the sampling: save it with every checkpoint, resume from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SamplerState {
    /// The current epoch (from 0).
    pub epoch: u64,
    /// Batches this rank has consumed in the current epoch.
    pub cursor: u64,
}

/// Rows an epoch leaves out, so that every rank runs the same number of full batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// `n_items − world_size · per_rank`: the end of each epoch's permutation, on no rank.
    pub rank_remainder: usize,
    /// `per_rank mod batch_size`: the end of each rank's part, less than one batch.
    pub partial_batch: usize,
}

/// Draws batches of row indices, epoch after epoch, for rank `rank` of `world_size`.
///
/// Epoch `e` is a permutation of `0..n_items`: `(0..n_items)` shuffled with rand 0.9's
/// `SliceRandom::shuffle` (Fisher–Yates) driven by `ChaCha8Rng::seed_from_u64(mix)` with
/// `mix = splitmix64(splitmix64(seed) ^ e)` (see [`EpochSampler::epoch_seed`]). Rank `r` takes
/// every `world_size`-th index from `r`: `perm[r], perm[r + W], …` — `per_rank = n_items / W`
/// of them (PyTorch's `DistributedSampler` layout), so the ranks' parts are disjoint and equal,
/// and the union of the ranks' batches at a step is the batch a single rank with `W ×
/// batch_size` would draw at that step. Its batches are consecutive runs of `batch_size`
/// indices of that part; a final partial batch is dropped ([`EpochSampler::dropped`]). After
/// the last full batch the state moves to `(epoch + 1, 0)`.
///
/// The indices depend only on `(seed, n_items, rank, world_size, batch_size)` and the state,
/// so a sampler rebuilt from a saved [`SamplerState`] continues exactly where the saved one was.
#[derive(Clone, Debug)]
pub struct EpochSampler {
    seed: u64,
    n_items: usize,
    rank: usize,
    world_size: usize,
    batch_size: usize,
    /// This rank's part of one epoch's permutation, reused for every batch of the epoch.
    cache: Option<(u64, Vec<usize>)>,
}

impl EpochSampler {
    /// A sampler of `n_items` rows (e.g. [`crate::DataView::len`]).
    ///
    /// Errors: [`DataError::InvalidSampler`] if `world_size` or `batch_size` is 0, `rank >=
    /// world_size`, or a rank gets fewer than `batch_size` rows (naming the numbers).
    pub fn new(
        seed: u64,
        n_items: usize,
        rank: usize,
        world_size: usize,
        batch_size: usize,
    ) -> Result<Self, DataError> {
        let bad = |reason: String| Err(DataError::InvalidSampler { reason });
        if world_size == 0 || batch_size == 0 {
            return bad(format!(
                "world_size ({world_size}) and batch_size ({batch_size}) must be at least 1"
            ));
        }
        if rank >= world_size {
            return bad(format!("rank {rank} is not below world_size {world_size}"));
        }
        let per_rank = n_items / world_size;
        if per_rank < batch_size {
            return bad(format!(
                "each of the {world_size} ranks gets {per_rank} of the {n_items} rows, fewer than one batch of \
                 {batch_size}; use a smaller batch, fewer ranks or more data"
            ));
        }
        Ok(EpochSampler { seed, n_items, rank, world_size, batch_size, cache: None })
    }

    /// Rows per rank and epoch: `n_items / world_size`.
    pub fn per_rank(&self) -> usize {
        self.n_items / self.world_size
    }

    /// Full batches per rank and epoch: `per_rank / batch_size` (≥ 1).
    pub fn batches_per_epoch(&self) -> u64 {
        (self.per_rank() / self.batch_size) as u64
    }

    /// Rows each epoch leaves out.
    pub fn dropped(&self) -> Dropped {
        Dropped {
            rank_remainder: self.n_items - self.world_size * self.per_rank(),
            partial_batch: self.per_rank() % self.batch_size,
        }
    }

    /// The rows sampled (`n_items`).
    pub fn n_items(&self) -> usize {
        self.n_items
    }

    /// The ChaCha8 seed of epoch `epoch`: `splitmix64(splitmix64(seed) ^ epoch)`.
    pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
        splitmix64(splitmix64(seed) ^ epoch)
    }

    /// The whole permutation of epoch `epoch` (all ranks).
    pub fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut perm: Vec<usize> = (0..self.n_items).collect();
        perm.shuffle(&mut ChaCha8Rng::seed_from_u64(Self::epoch_seed(self.seed, epoch)));
        perm
    }

    /// Checks that `state` can come from this sampler (its cursor is below
    /// [`EpochSampler::batches_per_epoch`]).
    ///
    /// Errors: [`DataError::InvalidSampler`] naming both numbers (e.g. a checkpoint resumed
    /// with a larger batch size or a smaller dataset).
    pub fn check_state(&self, state: &SamplerState) -> Result<(), DataError> {
        if state.cursor >= self.batches_per_epoch() {
            return Err(DataError::InvalidSampler {
                reason: format!(
                    "state cursor {} (epoch {}) is not below the {} batches of an epoch; the data or batch \
                     size differ from the run that saved it",
                    state.cursor,
                    state.epoch,
                    self.batches_per_epoch()
                ),
            });
        }
        Ok(())
    }

    /// The next batch of `batch_size` row indices, and advances `state` past it.
    ///
    /// Errors: as [`EpochSampler::check_state`].
    pub fn next(&mut self, state: &mut SamplerState) -> Result<Vec<usize>, DataError> {
        self.check_state(state)?;
        if self.cache.as_ref().is_none_or(|(e, _)| *e != state.epoch) {
            let part: Vec<usize> = self
                .permutation(state.epoch)
                .into_iter()
                .skip(self.rank)
                .step_by(self.world_size)
                .take(self.per_rank())
                .collect();
            self.cache = Some((state.epoch, part));
        }
        let part = &self.cache.as_ref().expect("filled above").1;
        let start = state.cursor as usize * self.batch_size;
        let batch = part[start..start + self.batch_size].to_vec();
        state.cursor += 1;
        if state.cursor == self.batches_per_epoch() {
            *state = SamplerState { epoch: state.epoch + 1, cursor: 0 };
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `steps` batches from `state` with a fresh sampler.
    fn run(
        rank: usize,
        world: usize,
        mut state: SamplerState,
        steps: usize,
    ) -> (Vec<Vec<usize>>, SamplerState) {
        let mut s = EpochSampler::new(7, 24, rank, world, 4).unwrap();
        let batches = (0..steps).map(|_| s.next(&mut state).unwrap()).collect();
        (batches, state)
    }

    #[test]
    fn splitmix64_reference_value() {
        // First output of Vigna's splitmix64.c seeded with 0.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn three_epochs_each_item_once_per_epoch() {
        let (batches, state) = run(0, 1, SamplerState::default(), 18);
        assert_eq!(state, SamplerState { epoch: 3, cursor: 0 }, "24 / 4 = 6 batches per epoch");
        let epochs: Vec<Vec<usize>> = batches.chunks(6).map(|c| c.concat()).collect();
        for e in &epochs {
            let mut sorted = e.clone();
            sorted.sort();
            assert_eq!(sorted, (0..24).collect::<Vec<_>>());
        }
        assert_ne!(epochs[0], epochs[1]);
        assert_ne!(epochs[1], epochs[2]);
        assert_eq!(epochs[0], EpochSampler::new(7, 24, 0, 1, 4).unwrap().permutation(0));
    }

    #[test]
    fn resuming_mid_epoch_and_at_epoch_boundary_is_exact() {
        for world in [1, 2] {
            for rank in 0..world {
                let (full, _) = run(rank, world, SamplerState::default(), 18);
                for stop in [9, 12] {
                    let (head, saved) = run(rank, world, SamplerState::default(), stop);
                    // The state goes through JSON, as in a checkpoint.
                    let saved: SamplerState =
                        serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap();
                    let (tail, _) = run(rank, world, saved, 18 - stop);
                    assert_eq!([head, tail].concat(), full, "world {world} rank {rank} stop {stop}");
                }
            }
        }
        // 24 / 4 = 6 batches per epoch with one rank: step 12 is the start of epoch 2.
        assert_eq!(run(0, 1, SamplerState::default(), 12).1, SamplerState { epoch: 2, cursor: 0 });
        assert_eq!(run(0, 1, SamplerState::default(), 9).1, SamplerState { epoch: 1, cursor: 3 });
    }

    #[test]
    fn two_ranks_take_disjoint_halves_covering_every_item() {
        // 12 rows per rank = 3 batches per epoch; 18 steps = 6 epochs.
        let (r0, s0) = run(0, 2, SamplerState::default(), 18);
        let (r1, _) = run(1, 2, SamplerState::default(), 18);
        assert_eq!(s0, SamplerState { epoch: 6, cursor: 0 });
        for e in 0..6 {
            let a = r0[e * 3..e * 3 + 3].concat();
            let b = r1[e * 3..e * 3 + 3].concat();
            let mut all = [a.clone(), b.clone()].concat();
            all.sort();
            assert_eq!(all, (0..24).collect::<Vec<_>>(), "epoch {e}");
            let perm = EpochSampler::new(7, 24, 0, 2, 4).unwrap().permutation(e as u64);
            let strided = |r: usize| perm.iter().copied().skip(r).step_by(2).collect::<Vec<_>>();
            assert_eq!((a, b), (strided(0), strided(1)));
        }
    }

    #[test]
    fn ranks_together_draw_the_single_rank_batch_of_the_global_size() {
        // 2 ranks × batch 4 at each step = 1 rank × batch 8 at that step (as sets), over 9
        // steps (3 epochs), so W ranks × B equals 1 rank × W·B.
        let mut one = EpochSampler::new(7, 26, 0, 1, 8).unwrap();
        let mut ranks: Vec<EpochSampler> =
            (0..2).map(|r| EpochSampler::new(7, 26, r, 2, 4).unwrap()).collect();
        assert_eq!(one.batches_per_epoch(), ranks[0].batches_per_epoch());
        let (mut s1, mut s2) = (SamplerState::default(), [SamplerState::default(); 2]);
        for step in 0..9 {
            let mut want = one.next(&mut s1).unwrap();
            let mut got: Vec<usize> = (0..2).flat_map(|r| ranks[r].next(&mut s2[r]).unwrap()).collect();
            want.sort();
            got.sort();
            assert_eq!(got, want, "step {step}");
            assert_eq!(s2[0], s1);
        }
    }

    #[test]
    fn remainders_are_dropped_and_reported() {
        // 26 rows, 3 ranks: per_rank 8, 2 rows on no rank; batch 3: 2 batches, 2 rows dropped.
        let mut s = EpochSampler::new(1, 26, 2, 3, 3).unwrap();
        assert_eq!(s.batches_per_epoch(), 2);
        assert_eq!(s.dropped(), Dropped { rank_remainder: 2, partial_batch: 2 });
        let mut st = SamplerState::default();
        let got = [s.next(&mut st).unwrap(), s.next(&mut st).unwrap()].concat();
        let perm = s.permutation(0);
        assert_eq!(got, [2, 5, 8, 11, 14, 17].map(|i| perm[i]).to_vec(), "every third index from 2");
        assert_eq!(st, SamplerState { epoch: 1, cursor: 0 });
    }

    #[test]
    fn epoch_seed_is_pinned() {
        // splitmix64(splitmix64(7) ^ 1), from a 6-line Python splitmix64.
        assert_eq!(EpochSampler::epoch_seed(7, 1), 0x3d41_bf49_5cd3_075f);
        // Regression pin of rand 0.9's shuffle with ChaCha8: a change would break resumption
        // of runs saved before it.
        assert_eq!(EpochSampler::new(7, 24, 0, 1, 4).unwrap().permutation(0)[..6], [22, 11, 3, 20, 19, 15]);
    }

    #[test]
    fn errors_not_panics() {
        let err = EpochSampler::new(1, 7, 0, 2, 4).unwrap_err();
        assert!(err.to_string().contains("gets 3 of the 7 rows, fewer than one batch of 4"), "{err}");
        assert!(EpochSampler::new(1, 8, 2, 2, 1).unwrap_err().to_string().contains("rank 2"));
        assert!(EpochSampler::new(1, 8, 0, 0, 1).is_err());
        let mut s = EpochSampler::new(1, 8, 0, 1, 4).unwrap();
        let err = s.next(&mut SamplerState { epoch: 0, cursor: 2 }).unwrap_err();
        assert!(err.to_string().contains("cursor 2 (epoch 0) is not below the 2 batches"), "{err}");
    }
}
