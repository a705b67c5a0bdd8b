//! `ember prepare`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use ember_data::{download_tinyshakespeare, prepare, PrepareOptions, TokenizerKind};

/// Arguments of `ember prepare`.
#[derive(Args)]
pub struct PrepareArgs {
    /// Tokenizer: char (vocabulary = the corpus's distinct characters) or gpt2 (r50k_base BPE).
    #[arg(long)]
    tokenizer: TokenizerKind,
    /// Text files; each is a document (gpt2: also split on <|endoftext|>).
    #[arg(long, num_args = 1.., value_name = "FILE")]
    input: Vec<PathBuf>,
    /// Download a known corpus into DIR first (needs network): tinyshakespeare.
    #[arg(long, value_name = "NAME")]
    download: Option<String>,
    /// Output directory.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Fraction of tokens (the end of the stream) kept for validation.
    #[arg(long, default_value_t = 0.1)]
    val_fraction: f64,
}

/// Runs `ember prepare`.
pub fn run(args: PrepareArgs) -> anyhow::Result<()> {
    let mut inputs = args.input;
    match args.download.as_deref() {
        None => {}
        Some("tinyshakespeare") => {
            std::fs::create_dir_all(&args.out)
                .with_context(|| format!("cannot create {}", args.out.display()))?;
            let file = download_tinyshakespeare(&args.out.join("tinyshakespeare.txt"))?;
            out!("downloaded {} (sha256 verified)", file.display());
            inputs.push(file);
        }
        Some(other) => bail!("--download {other}: unknown corpus; known: tinyshakespeare"),
    }
    if inputs.is_empty() {
        bail!("no input: pass --input FILE... or --download tinyshakespeare");
    }
    let summary = prepare(&PrepareOptions {
        tokenizer: args.tokenizer,
        inputs,
        out: args.out,
        val_fraction: args.val_fraction,
    })?;
    let m = &summary.meta;
    out!(
        "prepared {}: {} documents, vocabulary {} ({:?} tokens), {} train + {} val tokens",
        summary.out.display(),
        m.documents,
        m.vocab_size,
        m.dtype,
        m.train_tokens,
        m.val_tokens
    );
    Ok(())
}
