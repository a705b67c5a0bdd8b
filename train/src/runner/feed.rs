//! The data feed of a run: packed windows (or SFT rows) of the prepared data, drawn by epoch
//! and assembled on a background thread while the model computes.

use std::sync::Arc;
use std::time::Duration;

use ember_data::{
    step_producer, DataView, EpochSampler, Prefetcher, PreparedData, SamplerState, Split, StepData,
};

use crate::config::RunConfig;
use crate::error::TrainError;
use crate::observe::words::count;
use crate::step::eval::{eval_batches, require_batch};

/// Training batches of one data-parallel rank, ahead of the model.
pub struct Feed {
    prefetcher: Prefetcher<StepData>,
    /// A line describing the training rows, epochs and what an epoch drops.
    pub description: String,
}

impl Feed {
    /// Starts the feed of data-parallel rank `rank` of `world_size` at sampler state `state`:
    /// `config.accumulation_steps` micro-batches of `config.micro_batch_size` rows of the rank's
    /// shard per optimizer step, `config.prefetch_depth` steps ahead.
    ///
    /// Errors: a shard with fewer rows than a micro-batch; a sampler state that does not fit.
    pub fn start(
        data: Arc<PreparedData>,
        config: &RunConfig,
        state: SamplerState,
        rank: usize,
        world_size: usize,
    ) -> Result<Self, TrainError> {
        let seq_len = config.model.block_size();
        let train = DataView::new(data, Split::Train, seq_len, config.document_masking)?;
        let sampler = EpochSampler::new(config.seed, train.len(), rank, world_size, config.micro_batch_size)?;
        sampler.check_state(&state)?;
        let dropped = sampler.dropped();
        let description = format!(
            "train: {} of {}, {} per epoch and rank (each epoch drops {}: {} to split evenly across {}, {} of a partial batch){}",
            count(train.len(), "row"),
            count(seq_len, "token"),
            count(sampler.batches_per_epoch(), "micro-batch"),
            count(dropped.rank_remainder + dropped.partial_batch, "row"),
            dropped.rank_remainder,
            count(world_size, "rank"),
            dropped.partial_batch,
            if config.document_masking { "; document masking on" } else { "" },
        ) + &cut_note(&train, seq_len);
        let producer = step_producer(train, sampler, state, config.accumulation_steps);
        let prefetcher = Prefetcher::spawn(config.prefetch_depth, producer)?;
        Ok(Self { prefetcher, description })
    }

    /// The next optimizer step's micro-batches, the sampler state after them, and how long the
    /// training loop waited for them.
    pub fn next_step(&mut self) -> Result<(StepData, Duration), TrainError> {
        match self.prefetcher.next() {
            Some(item) => Ok(item?),
            None => Err(TrainError::Feed("the batch-building thread stopped unexpectedly".into())),
        }
    }
}

/// What a split loses to the window length: packed splits drop their last `< L` tokens; SFT
/// examples longer than `L + 1` tokens are cut (their end is never scored).
pub fn cut_note(view: &DataView, seq_len: usize) -> String {
    let mut note = String::new();
    if view.remainder_tokens() > 0 {
        let tokens = count(view.remainder_tokens(), "token");
        note += &format!(
            "; the last {tokens} (< one window) {} not used",
            if view.remainder_tokens() == 1 { "is" } else { "are" }
        );
    }
    if view.truncated_examples() > 0 {
        note += &format!(
            "; WARNING: {} longer than block_size + 1 = {} tokens and cut there (raise model.block_size to score their ends)",
            match view.truncated_examples() {
                1 => "1 example is".to_string(),
                n => format!("{n} examples are"),
            },
            seq_len + 1
        );
    }
    note
}

/// The validation rows (for [`crate::step::eval::evaluate`]).
pub fn val_view(data: Arc<PreparedData>, config: &RunConfig) -> Result<DataView, TrainError> {
    Ok(DataView::new(data, Split::Val, config.model.block_size(), config.document_masking)?)
}

/// Checks that the training split holds a micro-batch for each of the run's ranks and the
/// validation split one for evaluation, and returns a note when `config.eval_batches` is more
/// than the validation split holds: each evaluation then runs the whole split once
/// ([`crate::step::eval::eval_batches`]).
///
/// Errors: [`TrainError::SplitTooSmall`]; a split without a whole window.
pub fn check_splits(data: &Arc<PreparedData>, config: &RunConfig) -> Result<Option<String>, TrainError> {
    let (batch_size, ranks) = (config.micro_batch_size, config.world_size());
    let train =
        DataView::new(data.clone(), Split::Train, config.model.block_size(), config.document_masking)?;
    require_batch(&train, batch_size, ranks)?;
    let val = val_view(data.clone(), config)?;
    require_batch(&val, batch_size, 1)?;
    let used = eval_batches(config.eval_batches, val.len(), batch_size);
    Ok((used < config.eval_batches).then(|| {
        format!(
            "note: the val split has {} of {batch_size}, fewer than eval_batches = {}: each evaluation uses all of them, each once",
            count(used, "batch"),
            config.eval_batches,
        )
    }))
}
