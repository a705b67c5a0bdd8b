//! `ember prepare`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use ember_data::{
    check_output_dir, download_tinyshakespeare, prepare, PrepareOptions, SftFields, TokenizerKind,
    DEFAULT_SHARD_TOKENS,
};
use ember_train::observe::words::count;

/// Arguments of `ember prepare`.
#[derive(Args)]
pub struct PrepareArgs {
    /// char (the corpus's distinct characters), byte, gpt2 (r50k_base), cl100k, o200k, or hf
    /// (a Hugging Face tokenizer.json given with --tokenizer-file).
    #[arg(long)]
    tokenizer: TokenizerKind,
    /// The tokenizer.json for --tokenizer hf (e.g. from `ember tokenizer train`).
    #[arg(long, value_name = "FILE")]
    tokenizer_file: Option<PathBuf>,
    /// End-of-text token of an hf tokenizer (default: the first of <|endoftext|>, </s>,
    /// <|end_of_text|>, <eos> in its vocabulary).
    #[arg(long, value_name = "TOKEN")]
    eos_token: Option<String>,
    /// Files, directories (their .txt and .jsonl files, recursively, sorted) and globs
    /// ('data/**/*.jsonl', sorted). A .txt file is a document; a .jsonl line is one.
    #[arg(long, num_args = 1.., value_name = "PATH")]
    input: Vec<PathBuf>,
    /// Download a known corpus into DIR first (needs network): tinyshakespeare.
    #[arg(long, value_name = "NAME")]
    download: Option<String>,
    /// Output directory: new, empty, or an Ember dataset (replaced with --force). A directory
    /// of other files is refused; files that are not Ember's are never removed.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Replace the Ember dataset already in --out (its files only).
    #[arg(long)]
    force: bool,
    /// Fraction of tokens (the end of the stream) kept for validation, in [0, 1).
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    val_fraction: f64,
    /// Field of .jsonl lines holding the text.
    #[arg(long, default_value = "text")]
    text_field: String,
    /// Split .txt files into documents on lines equal to LINE.
    #[arg(long, value_name = "LINE")]
    doc_separator: Option<String>,
    /// SFT data: .jsonl lines with prompt/response fields or a messages list; prompt tokens
    /// are not scored.
    #[arg(long)]
    sft: bool,
    /// Field holding the prompt (with --sft).
    #[arg(long, default_value = "prompt", requires = "sft")]
    prompt_field: String,
    /// Field holding the response (with --sft).
    #[arg(long, default_value = "response", requires = "sft")]
    response_field: String,
    /// Replace invalid UTF-8 with U+FFFD (counted) instead of failing.
    #[arg(long)]
    lossy: bool,
    /// Maximum tokens per shard file.
    #[arg(long, allow_negative_numbers = true, default_value_t = DEFAULT_SHARD_TOKENS, value_name = "N")]
    shard_tokens: u64,
    /// Tokenizer threads (default: all cores). The output is the same for any number.
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    threads: Option<usize>,
}

/// Runs `ember prepare`.
pub fn run(args: PrepareArgs) -> anyhow::Result<()> {
    if !(0.0..1.0).contains(&args.val_fraction) {
        bail!("--val-fraction {}: expected a fraction in [0, 1), e.g. 0.1", args.val_fraction);
    }
    let mut inputs = args.input;
    match args.download.as_deref() {
        None => {}
        Some("tinyshakespeare") => {
            let dest = args.out.join("tinyshakespeare.txt");
            // Before downloading into --out: a directory of other files is refused untouched.
            let keep: Vec<PathBuf> =
                inputs.iter().chain([&dest]).chain(&args.tokenizer_file).cloned().collect();
            check_output_dir(&args.out, args.force, &keep, args.tokenizer == TokenizerKind::Hf)?;
            std::fs::create_dir_all(&args.out)
                .with_context(|| format!("cannot create {}", args.out.display()))?;
            let file = download_tinyshakespeare(&dest)?;
            out!("downloaded {} (sha256 verified)", file.display());
            inputs.push(file);
        }
        Some(other) => bail!("--download {other}: unknown corpus; known: tinyshakespeare"),
    }
    if inputs.is_empty() {
        bail!("no input: pass --input PATH... or --download tinyshakespeare");
    }
    let mut opts = PrepareOptions::new(args.tokenizer, inputs, args.out);
    opts.force = args.force;
    opts.tokenizer_file = args.tokenizer_file;
    opts.eos_token = args.eos_token;
    opts.val_fraction = args.val_fraction;
    opts.input.text_field = args.text_field;
    opts.input.doc_separator = args.doc_separator;
    opts.input.lossy = args.lossy;
    opts.input.sft = args
        .sft
        .then_some(SftFields { prompt_field: args.prompt_field, response_field: args.response_field });
    opts.shard_tokens = args.shard_tokens;
    opts.threads = args.threads;
    let summary = prepare(&opts)?;
    let m = &summary.meta;
    let what = match (opts.input.sft.is_some(), m.documents == 1) {
        (true, true) => "SFT example",
        (true, false) => "SFT examples",
        (false, true) => "document",
        (false, false) => "documents",
    };
    out!(
        "prepared {}: {} {what}, {} ({} train + {} val), vocabulary {} ({:?}), {}",
        summary.out.display(),
        m.documents,
        count(m.total_tokens, "token"),
        m.train_tokens,
        m.val_tokens,
        m.vocab_size,
        m.dtype,
        count(m.shards.len(), "shard"),
    );
    out!(
        "read {} from {} in {:.2} s: {:.2} MB/s, {:.0} tokens/s",
        count(summary.input_bytes, "byte"),
        count(m.sources.len(), "file"),
        summary.seconds,
        summary.mb_per_s(),
        summary.tokens_per_s()
    );
    if m.lossy_replacements > 0 {
        out!("replaced {} with U+FFFD (--lossy)", count(m.lossy_replacements, "invalid UTF-8 sequence"));
    }
    if m.empty_documents > 0 {
        out!("skipped {}", count(m.empty_documents, "empty document"));
    }
    Ok(())
}
