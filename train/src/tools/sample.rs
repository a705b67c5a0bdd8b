//! Text generation: temperature and top-k sampling from a trained model.

use burn::tensor::backend::Backend;
use ember_data::Tokenizer;
use ember_model::{argmax, LanguageModel};
use rand::distr::weighted::WeightedIndex;
use rand::distr::Distribution;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::error::TrainError;

/// How to sample.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOptions {
    /// Text to continue; empty starts from the end-of-text token.
    pub prompt: String,
    /// Tokens to generate.
    pub max_new_tokens: usize,
    /// Softmax temperature; `0` picks the most likely token (greedy).
    pub temperature: f64,
    /// Sample only among the `k` most likely tokens (`None`: all).
    pub top_k: Option<usize>,
    /// Seed of the sampling RNG (ChaCha8): same seed, same text.
    pub seed: u64,
    /// Reuse keys and values of earlier positions (KV cache) instead of recomputing the
    /// whole context for every token. Same tokens either way.
    pub use_cache: bool,
}

/// Generates `max_new_tokens` tokens after the prompt and returns prompt + continuation as
/// text (see [`ember_model::generate()`] for the context handling). Only ids the tokenizer
/// knows are sampled, so a model with a padded vocabulary never emits an undecodable id.
///
/// Errors: a prompt the tokenizer cannot encode; a negative or non-finite temperature;
/// `top_k` of 0.
pub fn generate<B: Backend>(
    model: &LanguageModel<B>,
    tokenizer: &Tokenizer,
    options: &SampleOptions,
    device: &B::Device,
) -> Result<String, TrainError> {
    if !(options.temperature >= 0.0 && options.temperature.is_finite()) {
        return Err(TrainError::Sample(format!("--temperature must be ≥ 0, got {}", options.temperature)));
    }
    if options.top_k == Some(0) {
        return Err(TrainError::Sample("--top-k must be at least 1".into()));
    }
    let prompt = if options.prompt.is_empty() {
        vec![tokenizer.eos_id()]
    } else {
        tokenizer.encode(&options.prompt)?
    };
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
    let vocab = tokenizer.vocab_size();
    // A padded vocabulary (GPT-2's 50304 for 50257 tokens) has ids no tokenizer decodes.
    let next = |logits: &[f32]| pick(&logits[..vocab.min(logits.len())], options, &mut rng);
    let ids = ember_model::generate(model, &prompt, options.max_new_tokens, options.use_cache, device, next);
    let start = if options.prompt.is_empty() { 1 } else { 0 };
    Ok(tokenizer.decode(&ids[start..])?)
}

/// Picks the next token from one row of logits: greedy at temperature 0, else a draw from
/// `softmax(logits / temperature)` restricted to the `top_k` largest (nanoGPT `generate`).
fn pick(logits: &[f32], options: &SampleOptions, rng: &mut ChaCha8Rng) -> u32 {
    if options.temperature == 0.0 {
        return argmax(logits);
    }
    let mut scaled: Vec<f64> = logits.iter().map(|&l| l as f64 / options.temperature).collect();
    if let Some(k) = options.top_k.filter(|&k| k < scaled.len()) {
        let mut sorted = scaled.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[k - 1];
        scaled.iter_mut().filter(|l| **l < kth).for_each(|l| *l = f64::NEG_INFINITY);
    }
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled.iter().map(|l| (l - max).exp()).collect();
    match WeightedIndex::new(&weights) {
        Ok(dist) => dist.sample(rng) as u32,
        Err(_) => argmax(logits),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(temperature: f64, top_k: Option<usize>) -> SampleOptions {
        SampleOptions {
            prompt: String::new(),
            max_new_tokens: 0,
            temperature,
            top_k,
            seed: 0,
            use_cache: true,
        }
    }

    #[test]
    fn zero_temperature_is_greedy() {
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(pick(&[0.1, 3.0, -1.0], &opts(0.0, None), &mut rng), 1);
    }

    #[test]
    fn top_1_always_picks_the_argmax() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for _ in 0..50 {
            assert_eq!(pick(&[0.0, 0.1, 0.2, 0.15], &opts(1.0, Some(1)), &mut rng), 2);
        }
    }

    #[test]
    fn top_k_never_picks_outside_the_k_best() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let t = pick(&[5.0, 0.0, 4.9, 0.0, 0.0], &opts(5.0, Some(2)), &mut rng);
            assert!(t == 0 || t == 2, "picked {t}");
        }
    }
}
