//! Autoregressive generation, with or without a KV cache.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::lm::LanguageModel;

/// Extends `prompt` (at least one token) by `max_new_tokens` tokens; `next` picks each token
/// from the logits of the last position (a host vector of `vocab_size` f32). Returns prompt +
/// new tokens.
///
/// With `use_cache`, the prompt is run once and each new token costs one position of
/// compute ([`LanguageModel::forward_cached`]); without, every step recomputes the whole
/// context (nanoGPT's `generate`). Both see the same context, cropped to the last
/// `block_size` tokens: once the sequence outgrows the context, positions shift, so the
/// cached path re-runs the cropped context from scratch at that step. The two paths give
/// the same logits up to float rounding (tested: greedy decoding is token-for-token equal).
pub fn generate<B: Backend>(
    model: &LanguageModel<B>,
    prompt: &[u32],
    max_new_tokens: usize,
    use_cache: bool,
    device: &B::Device,
    mut next: impl FnMut(&[f32]) -> u32,
) -> Vec<u32> {
    assert!(!prompt.is_empty(), "generation needs at least one prompt token");
    let block_size = model.block_size();
    let mut ids = prompt.to_vec();
    let mut cache = model.new_cache();
    for _ in 0..max_new_tokens {
        let n = ids.len();
        let logits = if use_cache && n <= block_size {
            // The cache holds ids[..cache.len()]: the whole prompt runs first, then one token.
            model.forward_cached(tokens(&ids[cache.len()..], device), &mut cache)
        } else {
            model.forward(tokens(&ids[n.saturating_sub(block_size)..], device))
        };
        let [_, t, v] = logits.dims();
        let last: Vec<f32> =
            logits.slice([0..1, t - 1..t, 0..v]).into_data().convert::<f32>().to_vec().expect("f32 logits");
        ids.push(next(&last));
    }
    ids
}

fn tokens<B: Backend>(ids: &[u32], device: &B::Device) -> Tensor<B, 2, Int> {
    let data: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Tensor::from_data(TensorData::new(data, [1, ids.len()]), device)
}

/// Index of the largest logit (greedy decoding).
pub fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &l)| if l > best.1 { (i, l) } else { best })
        .0 as u32
}
