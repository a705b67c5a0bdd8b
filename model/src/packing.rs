//! Documents packed into one row: block-diagonal causal attention, positions restarting at
//! each document.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

/// How tokens of several documents packed into the rows of a batch see each other: a token
/// attends only to earlier tokens of its own document (a block-diagonal causal mask), and its
/// position is counted from the start of its document — so a document's logits are the same
/// wherever it is packed. (Krell et al. 2021, "Efficient sequence packing without
/// cross-contamination"; Llama 3's document masking.)
#[derive(Clone, Debug)]
pub struct Packing<B: Backend> {
    /// Position of every token within its document, `[batch, seq_len]`. Also the fused
    /// attention's document mask: query `i` sees keys `i − positions[i] ..= i`
    /// ([`crate::ops::flash_attention`]; documents are contiguous in a row).
    pub positions: Tensor<B, 2, Int>,
    /// `[batch, 1, seq_len, seq_len]`: true where query `i` must not see key `j` (a later
    /// token, or another document's). Read only by the explicit attention path
    /// ([`crate::attention_reference`]: attention dropout in training).
    pub mask: Tensor<B, 4, Bool>,
}

impl<B: Backend> Packing<B> {
    /// From `segments` (`[batch·seq_len]`, row-major): the document index of every token within
    /// its row; a new document starts wherever the index changes.
    ///
    /// # Panics
    /// If `segments.len() != batch · seq_len`.
    pub fn from_segments(segments: &[u32], batch: usize, seq_len: usize, device: &B::Device) -> Self {
        assert_eq!(segments.len(), batch * seq_len, "segments must hold batch · seq_len entries");
        let mut positions = Vec::with_capacity(batch * seq_len);
        let mut mask = Vec::with_capacity(batch * seq_len * seq_len);
        for row in segments.chunks(seq_len) {
            let mut start = 0;
            for (i, &segment) in row.iter().enumerate() {
                if i > 0 && segment != row[i - 1] {
                    start = i;
                }
                positions.push((i - start) as i32);
            }
            for (i, &query) in row.iter().enumerate() {
                mask.extend(row.iter().enumerate().map(|(j, &key)| j > i || key != query));
            }
        }
        Self {
            positions: Tensor::from_data(TensorData::new(positions, [batch, seq_len]), device),
            mask: Tensor::from_data(TensorData::new(mask, [batch, 1, seq_len, seq_len]), device),
        }
    }
}

impl<B: burn::tensor::backend::AutodiffBackend> Packing<B> {
    /// The same packing on the inner backend (no autodiff), for a forward without a graph.
    pub fn inner(&self) -> Packing<B::InnerBackend> {
        Packing { positions: self.positions.clone().inner(), mask: self.mask.clone().inner() }
    }
}

/// Token positions `[batch or 1, seq_len]`: the packed documents' own positions, or else
/// `start..start + seq_len` (after `start` cached positions) for every row.
pub fn positions<B: Backend>(
    packing: Option<&Packing<B>>,
    start: usize,
    seq_len: usize,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    match packing {
        Some(packing) => packing.positions.clone(),
        None => Tensor::<B, 1, Int>::arange(start as i64..(start + seq_len) as i64, device).unsqueeze::<2>(),
    }
}
