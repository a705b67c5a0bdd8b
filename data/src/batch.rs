//! Windows of L+1 tokens -> (inputs, targets) batches. The next-token shift lives here only.

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

/// A batch of `batch_size` windows of `seq_len` tokens, row-major `[batch_size, seq_len]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Rows.
    pub batch_size: usize,
    /// Tokens per row (L).
    pub seq_len: usize,
    /// Input ids, `batch_size * seq_len`, row-major.
    pub inputs: Vec<u32>,
    /// Target ids (or [`IGNORE_INDEX`]), `batch_size * seq_len`, row-major.
    pub targets: Vec<i32>,
}

impl Batch {
    /// Number of targets != [`IGNORE_INDEX`] (the positions the loss is averaged over).
    pub fn scored_tokens(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE_INDEX).count()
    }

    /// Builds a batch from windows of L+1 tokens each (shifted with [`shift_window`]).
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
        let seq_len = window_len - 1;
        let mut inputs = Vec::with_capacity(windows.len() * seq_len);
        let mut targets = Vec::with_capacity(windows.len() * seq_len);
        for w in windows {
            let (x, y) = shift_window(w);
            inputs.extend(x);
            targets.extend(y);
        }
        Ok(Batch { batch_size: windows.len(), seq_len, inputs, targets })
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
        assert_eq!(b.scored_tokens(), 4);
    }

    #[test]
    fn scored_tokens_skips_ignore_index() {
        let b = Batch { batch_size: 1, seq_len: 3, inputs: vec![1, 2, 3], targets: vec![2, IGNORE_INDEX, 4] };
        assert_eq!(b.scored_tokens(), 2);
    }

    #[test]
    fn from_windows_errors() {
        let err = Batch::from_windows(&[vec![1, 2, 3], vec![4, 5]]).unwrap_err();
        assert!(err.to_string().contains("window 1 has 2 tokens, expected 3"), "{err}");
        assert!(matches!(Batch::from_windows(&[]), Err(DataError::InvalidBatch { .. })));
        assert!(matches!(Batch::from_windows(&[vec![1]]), Err(DataError::InvalidBatch { .. })));
    }
}
