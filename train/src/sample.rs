//! Text generation: temperature and top-k sampling from a trained model.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use ember_data::Tokenizer;
use ember_model::Gpt;
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
}

/// Generates `max_new_tokens` tokens after the prompt and returns prompt + continuation as
/// text. The context fed to the model is cropped to its last `block_size` tokens (nanoGPT
/// `generate`); each step recomputes the whole context. Only ids the tokenizer knows are
/// sampled, so a model with a padded vocabulary never emits an undecodable id.
///
/// Errors: a prompt the tokenizer cannot encode; a negative or non-finite temperature;
/// `top_k` of 0.
pub fn generate<B: Backend>(
    model: &Gpt<B>,
    tokenizer: &Tokenizer,
    options: &SampleOptions,
    device: &B::Device,
) -> Result<String, TrainError> {
    if !(options.temperature >= 0.0 && options.temperature.is_finite()) {
        return Err(TrainError::Sample(format!(
            "--temperature must be ≥ 0, got {}",
            options.temperature
        )));
    }
    if options.top_k == Some(0) {
        return Err(TrainError::Sample("--top-k must be at least 1".into()));
    }
    let mut ids = if options.prompt.is_empty() {
        vec![tokenizer.eos_id()]
    } else {
        tokenizer.encode(&options.prompt)?
    };
    let prompt_len = if options.prompt.is_empty() {
        1
    } else {
        ids.len()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
    for _ in 0..options.max_new_tokens {
        let context = &ids[ids.len().saturating_sub(model.block_size())..];
        let input: Vec<i32> = context.iter().map(|&t| t as i32).collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(input, [1, context.len()]), device);
        let logits = model.forward(tokens); // [1, T, V]
        let [_, t, v] = logits.dims();
        // A padded vocabulary (GPT-2's 50304 for 50257 tokens) has ids no tokenizer decodes:
        // sample among the tokenizer's ids only.
        let v = v.min(tokenizer.vocab_size());
        let last: Vec<f32> = logits
            .slice([0..1, t - 1..t, 0..v])
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32 logits");
        ids.push(pick(&last, options, &mut rng));
    }
    let start = if options.prompt.is_empty() {
        prompt_len
    } else {
        0
    };
    Ok(tokenizer.decode(&ids[start..])?)
}

/// Picks the next token from one row of logits.
fn pick(logits: &[f32], options: &SampleOptions, rng: &mut ChaCha8Rng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &l)| {
                if l > best.1 {
                    (i, l)
                } else {
                    best
                }
            })
            .0 as u32
    };
    if options.temperature == 0.0 {
        return argmax();
    }
    let mut scaled: Vec<f64> = logits
        .iter()
        .map(|&l| l as f64 / options.temperature)
        .collect();
    if let Some(k) = options.top_k.filter(|&k| k < scaled.len()) {
        let mut sorted = scaled.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[k - 1];
        scaled
            .iter_mut()
            .filter(|l| **l < kth)
            .for_each(|l| *l = f64::NEG_INFINITY);
    }
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled.iter().map(|l| (l - max).exp()).collect();
    match WeightedIndex::new(&weights) {
        Ok(dist) => dist.sample(rng) as u32,
        Err(_) => argmax(),
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
            assert_eq!(
                pick(&[0.0, 0.1, 0.2, 0.15], &opts(1.0, Some(1)), &mut rng),
                2
            );
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
