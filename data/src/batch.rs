//! Rows of L+1 tokens → (inputs, targets) batches. The next-token shift lives here only.

use crate::DataError;

/// Target value that the loss must ignore (PyTorch / Hugging Face convention).
pub const IGNORE_INDEX: i32 = -100;

/// THE one place where the next-token shift happens: a window of L+1 tokens ->
/// inputs = first L, targets = last L (as `i32`, so [`IGNORE_INDEX`] can mark unscored positions).
///
/// Example: `[5, 6, 7, 8]` -> `([5, 6, 7], [6, 7, 8])`. An empty window gives two empty vectors.
/// Token ids are below 2^31 for every supported vocabulary, so the `i32` cast is lossless.
pub fn shift_window(window: &[u32]) -> (Vec<u32>, Vec<i32>) {
    if window.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let inputs = window[..window.len() - 1].to_vec();
    let targets = window[1..].iter().map(|&t| t as i32).collect();
    (inputs, targets)
}

/// One row of a batch: a packed window or an SFT example, `seq_len` positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// Input ids, `[seq_len]`.
    pub inputs: Vec<u32>,
    /// Next-token targets or [`IGNORE_INDEX`], `[seq_len]`.
    pub targets: Vec<i32>,
    /// With document masking: the index (from 0) of the document each input position belongs
    /// to within the row, `[seq_len]`; see [`Batch::segments`].
    pub segments: Option<Vec<u32>>,
}

/// A batch of `batch_size` rows of `seq_len` positions, row-major `[batch_size, seq_len]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Rows.
    pub batch_size: usize,
    /// Positions per row (L).
    pub seq_len: usize,
    /// Input ids, `batch_size * seq_len`, row-major.
    pub inputs: Vec<u32>,
    /// Target ids (or [`IGNORE_INDEX`]), `batch_size * seq_len`, row-major.
    pub targets: Vec<i32>,
    /// With document masking (else `None`): `batch_size * seq_len`, row-major, the index of
    /// the document each INPUT position belongs to within its row, counted from 0 at the
    /// row's first position. A document includes its EOS; the position after an EOS starts a
    /// new segment. Attention should stay within a segment and positions restart at 0 in each.
    pub segments: Option<Vec<u32>>,
}

impl Batch {
    /// Number of targets != [`IGNORE_INDEX`] (the positions the loss is averaged over).
    pub fn scored_tokens(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE_INDEX).count()
    }

    /// Splits the rows into `parts` contiguous batches in order — the data-parallel replicas'
    /// shares of one micro-batch — of `⌈n/parts⌉` rows for the first `n mod parts` parts and
    /// `⌊n/parts⌋` for the rest (`n` = `batch_size`); concatenated in order they are this batch.
    ///
    /// Errors: [`DataError::InvalidBatch`] when `parts` is 0 or exceeds the rows (a part would
    /// be empty), naming both counts.
    pub fn split_rows(&self, parts: usize) -> Result<Vec<Batch>, DataError> {
        let n = self.batch_size;
        if parts == 0 || parts > n {
            return Err(DataError::InvalidBatch {
                reason: format!("a batch of {n} rows cannot be split into {parts} non-empty parts"),
            });
        }
        let mut start = 0;
        let out = (0..parts)
            .map(|part| {
                let rows = n / parts + usize::from(part < n % parts);
                let span = start * self.seq_len..(start + rows) * self.seq_len;
                start += rows;
                Batch {
                    batch_size: rows,
                    seq_len: self.seq_len,
                    inputs: self.inputs[span.clone()].to_vec(),
                    targets: self.targets[span.clone()].to_vec(),
                    segments: self.segments.as_ref().map(|s| s[span].to_vec()),
                }
            })
            .collect();
        Ok(out)
    }

    /// Stacks rows into a batch.
    ///
    /// Errors: [`DataError::InvalidBatch`] if there are no rows, a row is empty, rows differ in
    /// length or in having segments (naming the row and both values).
    pub fn from_rows(rows: Vec<Row>) -> Result<Batch, DataError> {
        let Some(first) = rows.first() else {
            return Err(DataError::InvalidBatch { reason: "no rows given; need at least one".into() });
        };
        let seq_len = first.inputs.len();
        let with_segments = first.segments.is_some();
        if seq_len == 0 {
            return Err(DataError::InvalidBatch { reason: "rows must hold at least one position".into() });
        }
        for (i, r) in rows.iter().enumerate() {
            let seg_len = r.segments.as_ref().map_or(seq_len, Vec::len);
            if r.inputs.len() != seq_len || r.targets.len() != seq_len || seg_len != seq_len {
                return Err(DataError::InvalidBatch {
                    reason: format!(
                        "row {i} has {} inputs, {} targets and {seg_len} segments, expected {seq_len} like row 0",
                        r.inputs.len(),
                        r.targets.len()
                    ),
                });
            }
            if r.segments.is_some() != with_segments {
                return Err(DataError::InvalidBatch {
                    reason: format!("row {i} and row 0 disagree on having segments"),
                });
            }
        }
        let batch_size = rows.len();
        let mut inputs = Vec::with_capacity(batch_size * seq_len);
        let mut targets = Vec::with_capacity(batch_size * seq_len);
        let mut segments = with_segments.then(|| Vec::with_capacity(batch_size * seq_len));
        for r in rows {
            inputs.extend(r.inputs);
            targets.extend(r.targets);
            if let (Some(all), Some(s)) = (segments.as_mut(), r.segments) {
                all.extend(s);
            }
        }
        Ok(Batch { batch_size, seq_len, inputs, targets, segments })
    }

    /// Builds a batch (without segments) from windows of L+1 tokens each, shifted with
    /// [`shift_window`].
    ///
    /// Errors: [`DataError::InvalidBatch`] if there are no windows, a window has fewer than
    /// 2 tokens, or any window's length differs from the first's (names the window index and
    /// both lengths).
    pub fn from_windows(windows: &[Vec<u32>]) -> Result<Batch, DataError> {
        let Some(first) = windows.first() else {
            return Err(DataError::InvalidBatch { reason: "no windows given; need at least one".into() });
        };
        let window_len = first.len();
        if window_len < 2 {
            return Err(DataError::InvalidBatch {
                reason: format!("windows must hold seq_len + 1 >= 2 tokens, got {window_len}"),
            });
        }
        if let Some((i, w)) = windows.iter().enumerate().find(|(_, w)| w.len() != window_len) {
            return Err(DataError::InvalidBatch {
                reason: format!("window {i} has {} tokens, expected {window_len} like window 0", w.len()),
            });
        }
        let rows = windows
            .iter()
            .map(|w| {
                let (inputs, targets) = shift_window(w);
                Row { inputs, targets, segments: None }
            })
            .collect();
        Batch::from_rows(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shift_example() {
        assert_eq!(shift_window(&[5, 6, 7, 8]), (vec![5, 6, 7], vec![6, 7, 8]));
        assert_eq!(shift_window(&[9]), (vec![], vec![]));
        assert_eq!(shift_window(&[]), (vec![], vec![]));
    }

    #[test]
    fn from_windows_row_major() {
        let b = Batch::from_windows(&[vec![1, 2, 3], vec![7, 8, 9]]).unwrap();
        assert_eq!((b.batch_size, b.seq_len), (2, 2));
        assert_eq!(b.inputs, vec![1, 2, 7, 8]);
        assert_eq!(b.targets, vec![2, 3, 8, 9]);
        assert_eq!(b.segments, None);
        assert_eq!(b.scored_tokens(), 4);
    }

    #[test]
    fn from_rows_stacks_segments() {
        let row = |x: u32, s: Vec<u32>| Row {
            inputs: vec![x, x],
            targets: vec![1, IGNORE_INDEX],
            segments: Some(s),
        };
        let b = Batch::from_rows(vec![row(1, vec![0, 0]), row(2, vec![0, 1])]).unwrap();
        assert_eq!(b.inputs, vec![1, 1, 2, 2]);
        assert_eq!(b.segments, Some(vec![0, 0, 0, 1]));
        assert_eq!(b.scored_tokens(), 2);
        let mixed = vec![row(1, vec![0, 0]), Row { inputs: vec![1, 1], targets: vec![1, 1], segments: None }];
        assert!(Batch::from_rows(mixed).unwrap_err().to_string().contains("row 1 and row 0 disagree"));
    }

    #[test]
    fn from_windows_errors() {
        let err = Batch::from_windows(&[vec![1, 2, 3], vec![4, 5]]).unwrap_err();
        assert!(err.to_string().contains("window 1 has 2 tokens, expected 3"), "{err}");
        assert!(matches!(Batch::from_windows(&[]), Err(DataError::InvalidBatch { .. })));
        assert!(matches!(Batch::from_windows(&[vec![1]]), Err(DataError::InvalidBatch { .. })));
        assert!(matches!(Batch::from_rows(vec![]), Err(DataError::InvalidBatch { .. })));
    }
    #[test]
    fn split_rows_gives_contiguous_parts_that_concatenate_to_the_batch() {
        // 5 rows of 2 positions: parts of 2, 2 and 1 rows.
        let rows: Vec<Row> = (0..5u32)
            .map(|r| Row {
                inputs: vec![2 * r, 2 * r + 1],
                targets: vec![r as i32, IGNORE_INDEX],
                segments: Some(vec![0, r]),
            })
            .collect();
        let batch = Batch::from_rows(rows).unwrap();
        let parts = batch.split_rows(3).unwrap();
        assert_eq!(parts.iter().map(|p| p.batch_size).collect::<Vec<_>>(), [2, 2, 1]);
        assert_eq!(parts[1].inputs, [4, 5, 6, 7]);
        assert_eq!(parts[2].targets, [4, IGNORE_INDEX]);
        assert_eq!(parts[2].segments.as_deref(), Some(&[0, 4][..]));
        let joined: Vec<u32> = parts.iter().flat_map(|p| p.inputs.clone()).collect();
        assert_eq!(joined, batch.inputs);
        assert_eq!(batch.split_rows(1).unwrap(), vec![batch.clone()]);
        for parts in [0, 6] {
            let err = batch.split_rows(parts).unwrap_err().to_string();
            assert!(
                err.contains(&format!("a batch of 5 rows cannot be split into {parts} non-empty parts")),
                "{err}"
            );
        }
    }
}
