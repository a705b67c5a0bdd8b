//! `ember tokenizer train`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use ember_data::{train_bpe, BpeTrainOptions, InputOptions};
use ember_train::observe::words::count;

/// Arguments of `ember tokenizer`.
#[derive(Args)]
pub struct TokenizerArgs {
    #[command(subcommand)]
    command: TokenizerCommand,
}

#[derive(Subcommand)]
enum TokenizerCommand {
    /// Train a byte-level BPE (GPT-2 style, special token <|endoftext|>) on a corpus and save it
    /// as a Hugging Face tokenizer.json, for `ember prepare --tokenizer hf --tokenizer-file`.
    Train(TrainArgs),
}

/// Arguments of `ember tokenizer train`.
#[derive(Args)]
struct TrainArgs {
    /// Vocabulary size: 256 bytes + <|endoftext|> + merges (at least 257).
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    vocab_size: usize,
    /// Files, directories and globs, as for `ember prepare`.
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    input: Vec<PathBuf>,
    /// The tokenizer.json to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Merge only pairs seen at least this often.
    #[arg(long, allow_negative_numbers = true, default_value_t = 2)]
    min_frequency: u64,
    /// Field of .jsonl lines holding the text.
    #[arg(long, default_value = "text")]
    text_field: String,
    /// Split .txt files into documents on lines equal to LINE.
    #[arg(long, value_name = "LINE")]
    doc_separator: Option<String>,
    /// Replace invalid UTF-8 with U+FFFD instead of failing.
    #[arg(long)]
    lossy: bool,
}

/// Runs `ember tokenizer …`.
pub fn run(args: TokenizerArgs) -> anyhow::Result<()> {
    let TokenizerCommand::Train(a) = args.command;
    let summary = train_bpe(&BpeTrainOptions {
        inputs: a.input,
        input: InputOptions {
            text_field: a.text_field,
            doc_separator: a.doc_separator,
            lossy: a.lossy,
            sft: None,
        },
        vocab_size: a.vocab_size,
        min_frequency: a.min_frequency,
        out: a.out,
    })?;
    out!(
        "wrote {}: byte-level BPE, vocabulary {} (<|endoftext|> = {}), trained on {} from {}",
        summary.out.display(),
        summary.vocab_size,
        summary.eos_id,
        count(summary.input_bytes, "byte"),
        count(summary.sources.len(), "file"),
    );
    Ok(())
}
