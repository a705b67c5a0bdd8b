//! [`DataView`]: the rows of one split: packed windows for pretraining, one example per row
//! for SFT.
//!
//! **Packed windows.** Window `k` of a split of `n` tokens with context `L` is the split's
//! tokens `[k·L, k·L + L + 1)`: consecutive windows share one token, so every token of the split
//! but the first is a target exactly once, across documents and shard ends. There are
//! `(n − 1) / L` windows; the last `(n − 1) mod L` tokens are not targets of any window
//! ([`DataView::remainder_tokens`]).
//!
//! **SFT rows.** Row `i` is example `i` of the split (prompt + response + EOS), truncated to
//! `L + 1` tokens ([`DataView::truncated_examples`] counts those) and right-padded with the EOS
//! id to `L + 1`, then shifted. Target `j` (predicting row token `j + 1`) is scored iff
//! `prompt ≤ j + 1 < real_len`, where `real_len` is the example's length after truncation:
//! prompt tokens and padding get [`IGNORE_INDEX`]. The mask comes from these lengths, never
//! from token ids, so the real EOS stays scored although the pad id is also the EOS.
//!
//! **Document masking.** With `document_masking`, every row carries segments (see
//! [`Batch::segments`]): a document includes its EOS, and the position after an EOS starts a
//! new segment. The target at an EOS position is the first token of the next document; it
//! stays scored, as in nanoGPT and Megatron-LM: the model sees the EOS, so predicting "a new
//! document starts with this token" is a well-posed task (it learns document openings), and
//! dropping it would make the scored-token count depend on the masking setting. Targets are
//! therefore identical with and without document masking; only attention and positions change.

use std::sync::Arc;

use crate::batch::{shift_window, Row};
use crate::meta::DataKind;
use crate::{Batch, DataError, PreparedData, Split, IGNORE_INDEX};

/// The rows of one split of a prepared directory, built on demand. Cheap to clone;
/// `Send + Sync`.
#[derive(Clone, Debug)]
pub struct DataView {
    data: Arc<PreparedData>,
    split: Split,
    seq_len: usize,
    document_masking: bool,
    rows: usize,
    /// SFT: index of the split's first example.
    first_example: u64,
    remainder_tokens: u64,
    truncated: u64,
}

impl DataView {
    /// The rows of `split` with `seq_len` (L) positions each. With `document_masking`, batches
    /// carry [`Batch::segments`].
    ///
    /// Errors: [`DataError::InvalidBatch`] if `seq_len` is 0; [`DataError::StreamTooShort`] if
    /// the split holds no full row (fewer than L + 1 tokens, or no SFT example).
    pub fn new(
        data: Arc<PreparedData>,
        split: Split,
        seq_len: usize,
        document_masking: bool,
    ) -> Result<Self, DataError> {
        if seq_len == 0 {
            return Err(DataError::InvalidBatch { reason: "seq_len must be at least 1".into() });
        }
        let n = data.stream(split).len() as u64;
        let (rows, first_example, remainder_tokens, truncated) = match data.meta.kind {
            DataKind::Pretrain => {
                let rows = n.saturating_sub(1) / seq_len as u64;
                (rows, 0, n.saturating_sub(1) - rows * seq_len as u64, 0)
            }
            DataKind::Sft => {
                let examples = data.documents_in(split);
                let truncated = examples
                    .clone()
                    .filter(|&d| data.document(d).is_some_and(|r| r.end - r.start > seq_len as u64 + 1))
                    .count() as u64;
                (examples.end - examples.start, examples.start, 0, truncated)
            }
        };
        if rows == 0 {
            let needed = match data.meta.kind {
                DataKind::Pretrain => format!("one window needs seq_len + 1 = {} tokens", seq_len + 1),
                DataKind::Sft => "an SFT split needs at least one example".into(),
            };
            return Err(DataError::StreamTooShort { split: split.name(), tokens: n, needed });
        }
        Ok(DataView {
            data,
            split,
            seq_len,
            document_masking,
            rows: rows as usize,
            first_example,
            remainder_tokens,
            truncated,
        })
    }

    /// Number of rows: windows (pretraining) or examples (SFT).
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Always false: a view holds at least one row.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Positions per row (L).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The split.
    pub fn split(&self) -> Split {
        self.split
    }

    /// Whether rows carry segments.
    pub fn document_masking(&self) -> bool {
        self.document_masking
    }

    /// The prepared data.
    pub fn data(&self) -> &Arc<PreparedData> {
        &self.data
    }

    /// Pretraining: tokens at the end of the split that no window predicts, `(n − 1) mod L`.
    pub fn remainder_tokens(&self) -> u64 {
        self.remainder_tokens
    }

    /// SFT: examples of the split longer than L + 1 tokens, cut to L + 1.
    pub fn truncated_examples(&self) -> u64 {
        self.truncated
    }

    /// Row `index`.
    ///
    /// Errors: [`DataError::InvalidBatch`] if `index >= len()`.
    pub fn row(&self, index: usize) -> Result<Row, DataError> {
        if index >= self.rows {
            return Err(DataError::InvalidBatch {
                reason: format!(
                    "row {index} is out of range: the {} split has {} rows",
                    self.split, self.rows
                ),
            });
        }
        match self.data.meta.kind {
            DataKind::Pretrain => self.window(index),
            DataKind::Sft => self.example(index),
        }
    }

    /// A batch of the rows `indices`, in that order.
    ///
    /// Errors: [`DataError::InvalidBatch`] if `indices` is empty or one is out of range.
    pub fn batch(&self, indices: &[usize]) -> Result<Batch, DataError> {
        let rows = indices.iter().map(|&i| self.row(i)).collect::<Result<Vec<_>, _>>()?;
        Batch::from_rows(rows)
    }

    fn window(&self, k: usize) -> Result<Row, DataError> {
        let l = self.seq_len;
        let window = self.data.stream(self.split).slice(k * l, l + 1)?;
        let (inputs, targets) = shift_window(&window);
        let segments = self.document_masking.then(|| {
            // Stream position of the window's first token; the document of each input position
            // relative to the first one's.
            let start = self.data.stream(self.split).offset() + (k * l) as u64;
            let first = self.data.document_at(start);
            let mut doc = first;
            let mut end = self.data.document(doc).map_or(u64::MAX, |r| r.end);
            (0..l as u64)
                .map(|i| {
                    while start + i >= end {
                        doc += 1;
                        end = self.data.document(doc).map_or(u64::MAX, |r| r.end);
                    }
                    (doc - first) as u32
                })
                .collect()
        });
        Ok(Row { inputs, targets, segments })
    }

    fn example(&self, i: usize) -> Result<Row, DataError> {
        let d = self.first_example + i as u64;
        let range = self.data.document(d).expect("rows index the split's examples");
        let prompt = self.data.prompt_tokens(d).unwrap_or(0) as usize;
        let l = self.seq_len;
        let real_len = ((range.end - range.start) as usize).min(l + 1);
        // Positions are relative to the whole stream; the split's stream starts at its offset.
        let stream = self.data.stream(self.split);
        let mut window = stream.slice((range.start - stream.offset()) as usize, real_len)?;
        window.resize(l + 1, self.data.meta.eos_id); // right padding with the EOS id
        let (inputs, mut targets) = shift_window(&window);
        for (j, t) in targets.iter_mut().enumerate() {
            if j + 1 < prompt || j + 1 >= real_len {
                *t = IGNORE_INDEX;
            }
        }
        // One document, then padding (after the EOS) as a second segment.
        let segments = self.document_masking.then(|| (0..l).map(|p| u32::from(p >= real_len)).collect());
        Ok(Row { inputs, targets, segments })
    }
}

#[cfg(test)]
mod tests;
