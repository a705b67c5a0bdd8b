//! Generate text with `ember-model` and Burn alone (plus a tokenizer): load Hugging Face
//! weights, or build a random model, and decode greedily with the KV cache.
//!
//! ```sh
//! # GPT-2 124M from Hugging Face's model.safetensors (https://huggingface.co/gpt2):
//! cargo run --release -p ember-model --example generate -- --weights model.safetensors --preset gpt2 --prompt "Hello, my name is"
//! # A random model (no download): shows the API and measures decoding speed.
//! cargo run --release -p ember-model --example generate -- --random tiny --max-new-tokens 50
//! ```
//!
//! Flags: `--preset NAME` (or `--random NAME`), `--weights FILE`, `--vocab-size N` (the
//! weights' vocabulary when it differs from the preset's, e.g. 50257 for the published GPT-2
//! whose preset pads to 50304; read from the file when omitted), `--prompt TEXT`,
//! `--max-new-tokens N`, `--no-cache`.
//!
//! Models with a GPT-2-sized vocabulary use GPT-2's BPE (tiktoken-rs, offline); smaller ones
//! read and write raw bytes (the random `tiny` model gets a 256-token vocabulary).

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use ember_model::{argmax, generate, hf, ModelConfig};

/// What to run, from the command line.
struct Args {
    preset: String,
    vocab_size: Option<usize>,
    weights: Option<PathBuf>,
    prompt: String,
    max_new_tokens: usize,
    use_cache: bool,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        preset: "tiny".into(),
        vocab_size: None,
        weights: None,
        prompt: "Hello".into(),
        max_new_tokens: 20,
        use_cache: true,
    };
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--preset" | "--random" => parsed.preset = value()?,
            "--weights" => parsed.weights = Some(value()?.into()),
            "--prompt" => parsed.prompt = value()?,
            "--max-new-tokens" => {
                parsed.max_new_tokens = value()?.parse().map_err(|e| format!("--max-new-tokens: {e}"))?
            }
            "--vocab-size" => {
                parsed.vocab_size = Some(value()?.parse().map_err(|e| format!("--vocab-size: {e}"))?)
            }
            "--no-cache" => parsed.use_cache = false,
            "--help" | "-h" => return Err("usage: see the header of examples/generate.rs".into()),
            other => return Err(format!("unknown argument {other}; see the file's header for usage")),
        }
    }
    Ok(parsed)
}

/// Text ↔ token ids: GPT-2 BPE for GPT-2 vocabularies, bytes otherwise.
enum Tokenizer {
    Gpt2(tiktoken_rs::CoreBPE),
    Bytes,
}

impl Tokenizer {
    fn for_vocab(vocab_size: usize) -> Tokenizer {
        if vocab_size >= 50257 {
            Tokenizer::Gpt2(tiktoken_rs::r50k_base().expect("r50k_base is bundled"))
        } else {
            Tokenizer::Bytes
        }
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Gpt2(bpe) => bpe.encode_ordinary(text),
            Tokenizer::Bytes => text.bytes().map(u32::from).collect(),
        }
    }

    fn decode(&self, ids: &[u32]) -> String {
        match self {
            Tokenizer::Gpt2(bpe) => bpe.decode(ids).unwrap_or_else(|_| format!("{ids:?}")),
            Tokenizer::Bytes => {
                String::from_utf8_lossy(&ids.iter().map(|&t| t as u8).collect::<Vec<_>>()).into_owned()
            }
        }
    }
}

/// Builds the model, generates, and returns the text and the decoding speed (tokens/s).
fn run(args: &Args) -> Result<(String, f64), String> {
    let device = Default::default();
    let mut config = ModelConfig::preset(&args.preset).ok_or(format!("unknown preset {:?}", args.preset))?;
    if let Some(vocab) = args.vocab_size {
        config.set_vocab_size(vocab);
    } else if let Some(path) = &args.weights {
        config.set_vocab_size(hf::vocab_size(path).map_err(|e| e.to_string())?);
    } else if config.vocab_size() < 256 {
        config.set_vocab_size(256); // raw bytes
    }
    Flex::seed(&device, 0); // the random model is the same every run
    let mut model = config.init::<Flex>(&device).map_err(|e| e.to_string())?;
    if let Some(path) = &args.weights {
        model = hf::load(model, path).map_err(|e| e.to_string())?;
    }
    let tokenizer = Tokenizer::for_vocab(config.vocab_size());
    let prompt = tokenizer.encode(&args.prompt);
    let started = Instant::now();
    // Greedy decoding; only ids the tokenizer knows (GPT-2's padded vocabulary has 47 more).
    let known = if matches!(tokenizer, Tokenizer::Gpt2(_)) { 50257 } else { 256 };
    let ids = generate(&model, &prompt, args.max_new_tokens, args.use_cache, &device, |logits| {
        argmax(&logits[..known.min(logits.len())])
    });
    let speed = args.max_new_tokens as f64 / started.elapsed().as_secs_f64();
    Ok((tokenizer.decode(&ids), speed))
}

fn main() {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    match run(&args) {
        Ok((text, speed)) => {
            println!("{text}");
            eprintln!(
                "{} new tokens at {speed:.1} tokens/s (KV cache {})",
                args.max_new_tokens,
                if args.use_cache { "on" } else { "off" }
            );
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_from_a_tiny_random_model_with_and_without_the_cache() {
        let args = |extra: &[&str]| {
            let mut a = vec!["--random", "tiny", "--prompt", "Hi", "--max-new-tokens", "12"];
            a.extend_from_slice(extra);
            parse(a.into_iter().map(String::from)).unwrap()
        };
        let (cached, _) = run(&args(&[])).unwrap();
        let (full, _) = run(&args(&["--no-cache"])).unwrap();
        assert!(cached.starts_with("Hi"));
        assert_eq!(cached, full, "greedy decoding is the same with and without the cache");
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(["--bogus"].into_iter().map(String::from)).is_err());
        assert!(parse(["--max-new-tokens", "x"].into_iter().map(String::from)).is_err());
    }
}
