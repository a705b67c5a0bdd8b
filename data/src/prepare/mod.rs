//! Tokenize a corpus once into a prepared directory (format 2: token shards, documents.bin,
//! prompts.bin for SFT, meta.json), streaming and in parallel.

mod chunks;
mod output;
mod owned;
mod progress;
mod replacing;
mod writer;

use std::path::PathBuf;
use std::time::Instant;

use crate::inputs::reader::Reader;
use crate::inputs::{resolve_inputs, InputOptions};
use crate::meta::{DataKind, FORMAT_VERSION};
use crate::tokenizer::HF_TOKENIZER_FILE;
use crate::{DataError, Meta, SourceInfo, TokenDtype, Tokenizer, TokenizerKind, TokenizerSpec};
pub(crate) use chunks::PIECE_BYTES;
use chunks::{chars_of, chunk_chars, encode_chunk, next_chunk};
pub use output::check_output_dir;
use progress::Progress;
use writer::{commit, StreamWriter};

/// Default `shard_tokens`: 100 M tokens (200 MB of u16) per shard.
pub const DEFAULT_SHARD_TOKENS: u64 = 100_000_000;

/// Default `chunk_bytes`: text tokenized in parallel per step (bounds memory).
pub const DEFAULT_CHUNK_BYTES: usize = 16 << 20;

/// What to prepare. Build with [`PrepareOptions::new`] and set fields as needed.
#[derive(Clone, Debug, PartialEq)]
pub struct PrepareOptions {
    /// Tokenizer to use (char is fitted on the inputs).
    pub tokenizer: TokenizerKind,
    /// The `tokenizer.json` for [`TokenizerKind::Hf`] (required then, refused otherwise).
    pub tokenizer_file: Option<PathBuf>,
    /// The EOS token's text for hf (default: the first of
    /// [`crate::HF_EOS_CANDIDATES`] present).
    pub eos_token: Option<String>,
    /// Files, directories and globs (see [`resolve_inputs`]).
    pub inputs: Vec<PathBuf>,
    /// Output directory; created if missing. It must be new, empty (but for the inputs) or
    /// hold an Ember dataset, which only `force` replaces (see [`check_output_dir`]).
    pub out: PathBuf,
    /// Replace an Ember dataset already in `out` (its files only; other files are kept).
    pub force: bool,
    /// Fraction of tokens, in [0, 1), that go to the val split (the end of the stream).
    pub val_fraction: f64,
    /// How files become documents or SFT examples.
    pub input: InputOptions,
    /// Maximum tokens per shard (≥ 1; default [`DEFAULT_SHARD_TOKENS`]).
    pub shard_tokens: u64,
    /// Tokenizer threads: `None` uses the current rayon pool (all cores by default).
    pub threads: Option<usize>,
    /// Bytes of text read and tokenized per parallel step (≥ 1; default
    /// [`DEFAULT_CHUNK_BYTES`]). Memory stays within a few times this; the output does not
    /// depend on it.
    pub chunk_bytes: usize,
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
}

impl PrepareOptions {
    /// Options with the defaults: no `force`, val_fraction 0.1, `text` field, no separator, strict UTF-8,
    /// pretraining, 100 M-token shards, all cores, 16 MiB chunks, progress bar on.
    pub fn new(tokenizer: TokenizerKind, inputs: Vec<PathBuf>, out: PathBuf) -> PrepareOptions {
        PrepareOptions {
            tokenizer,
            tokenizer_file: None,
            eos_token: None,
            inputs,
            out,
            force: false,
            val_fraction: 0.1,
            input: InputOptions::default(),
            shard_tokens: DEFAULT_SHARD_TOKENS,
            threads: None,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            progress: true,
        }
    }

    fn check(&self) -> Result<(), DataError> {
        let vf = self.val_fraction;
        if !(0.0..1.0).contains(&vf) {
            return Err(DataError::option("val_fraction", format!("must be a number in [0, 1), got {vf}")));
        }
        if self.shard_tokens == 0 || self.chunk_bytes == 0 || self.threads == Some(0) {
            return Err(DataError::option("shard_tokens/chunk_bytes/threads", "must be at least 1"));
        }
        match (self.tokenizer, &self.tokenizer_file) {
            (TokenizerKind::Hf, None) => Err(DataError::option(
                "tokenizer_file",
                "--tokenizer hf needs --tokenizer-file tokenizer.json",
            )),
            (TokenizerKind::Hf, Some(_)) => Ok(()),
            (kind, Some(_)) => Err(DataError::option(
                "tokenizer_file",
                format!("--tokenizer-file is only for --tokenizer hf, not {kind}"),
            )),
            (kind, None) if self.eos_token.is_some() => Err(DataError::option(
                "eos_token",
                format!("--eos-token is only for --tokenizer hf, not {kind}"),
            )),
            _ => Ok(()),
        }
    }
}

/// What `prepare` wrote, and how fast.
#[derive(Clone, Debug, PartialEq)]
pub struct PrepareSummary {
    /// The meta.json written.
    pub meta: Meta,
    /// The output directory.
    pub out: PathBuf,
    /// Input bytes tokenized.
    pub input_bytes: u64,
    /// Seconds spent reading, tokenizing and writing (the char tokenizer's first pass
    /// excluded).
    pub seconds: f64,
}

impl PrepareSummary {
    /// Input megabytes (10^6 bytes) per second of the tokenizing pass.
    pub fn mb_per_s(&self) -> f64 {
        self.input_bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }

    /// Tokens written per second of the tokenizing pass.
    pub fn tokens_per_s(&self) -> f64 {
        self.meta.total_tokens as f64 / self.seconds.max(1e-9)
    }
}

/// Tokenizes a corpus once into `opts.out` (format 2; see the crate docs).
///
/// Documents (or SFT examples) are read as a stream; chunks of about `chunk_bytes` of text are
/// tokenized in parallel on rayon (`threads`), in order, and written sequentially, so memory is
/// bounded by the chunk size (and the largest document, for hf tokenizers) and the output is
/// byte-identical whatever the number of threads. Every document is followed by the EOS id:
/// #EOS = #documents and total tokens = Σ document lengths + #documents. The stream is split
/// by position: `train_tokens = floor(total · (1 − val_fraction))` (SFT: rounded down to a
/// document end, examples are never cut). The char tokenizer reads the corpus twice (the
/// first pass collects its characters and checks every input before anything is written).
///
/// Files are written into a staging directory beside `out` and moved into place, meta.json
/// last; on error nothing in `out` changes. `out` is checked first ([`check_output_dir`]): a
/// directory of other files is refused, an Ember dataset is replaced only with `force`, and
/// files that are not Ember's are never removed.
///
/// Errors: [`DataError::OutputInUse`]; [`DataError::InvalidOption`]; input errors naming the file and line
/// ([`DataError::BadInput`], [`DataError::Io`], [`DataError::InvalidUtf8`],
/// [`DataError::BadLine`]); [`DataError::EmptyCorpus`]; tokenizer errors; output
/// [`DataError::Io`].
pub fn prepare(opts: &PrepareOptions) -> Result<PrepareSummary, DataError> {
    opts.check()?;
    let files = resolve_inputs(&opts.inputs)?;
    check_output_dir(&opts.out, opts.force, &kept_inputs(opts, &files), opts.tokenizer == TokenizerKind::Hf)?;
    match opts.threads {
        None => prepare_files(opts, &files),
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| DataError::option("threads", format!("cannot start {n} threads: {e}")))?
            .install(|| prepare_files(opts, &files)),
    }
}

/// The input files (and tokenizer file): `prepare` neither counts nor removes them when they
/// lie in the output directory.
fn kept_inputs(opts: &PrepareOptions, files: &[PathBuf]) -> Vec<PathBuf> {
    files.iter().chain(&opts.tokenizer_file).cloned().collect()
}

fn total_bytes(files: &[PathBuf]) -> u64 {
    files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum()
}

/// The tokenizer for `opts`; char is fitted on a first pass over `files`, which returns the
/// sources it read (to check that the second pass reads the same bytes).
fn build_tokenizer(
    opts: &PrepareOptions,
    files: &[PathBuf],
) -> Result<(Tokenizer, Option<Vec<SourceInfo>>), DataError> {
    let tokenizer = match opts.tokenizer {
        TokenizerKind::Char => {
            let progress = Progress::new(total_bytes(files), "scanning", opts.progress);
            let mut reader = Reader::new(files, &opts.input, Some(PIECE_BYTES));
            let mut bits: Option<Vec<u64>> = None;
            loop {
                let chunk = next_chunk(&mut reader, opts.chunk_bytes)?;
                if chunk.is_empty() {
                    break;
                }
                let b = chunk_chars(&chunk);
                match &mut bits {
                    None => bits = Some(b),
                    Some(acc) => acc.iter_mut().zip(b).for_each(|(x, y)| *x |= y),
                }
                progress.update(reader.stats.bytes, 0);
            }
            progress.finish();
            let chars = bits.as_deref().map(chars_of).unwrap_or_default();
            let tok = Tokenizer::from_spec(&TokenizerSpec::Char { chars })?;
            return Ok((tok, Some(reader.sources)));
        }
        TokenizerKind::Byte => Tokenizer::byte(),
        TokenizerKind::Gpt2 => Tokenizer::gpt2(),
        TokenizerKind::Cl100k => Tokenizer::cl100k(),
        TokenizerKind::O200k => Tokenizer::o200k(),
        TokenizerKind::Hf => {
            let file = opts.tokenizer_file.as_deref().expect("checked: hf has a tokenizer file");
            Tokenizer::from_hf_file(file, opts.eos_token.as_deref())?
        }
    };
    Ok((tokenizer, None))
}

fn prepare_files(opts: &PrepareOptions, files: &[PathBuf]) -> Result<PrepareSummary, DataError> {
    let (tokenizer, scanned) = build_tokenizer(opts, files)?;
    // Builds lazily loaded tables (tiktoken: ~0.1 s) before the throughput timer starts.
    tokenizer.encode("")?;
    let start = Instant::now();
    let dtype = TokenDtype::for_vocab(tokenizer.vocab_size());
    let sft = opts.input.sft.is_some();
    let mut out = StreamWriter::new(&opts.out, dtype, opts.shard_tokens, sft)?;
    if let Some(bytes) = tokenizer.hf_file_bytes() {
        std::fs::write(out.staging().join(HF_TOKENIZER_FILE), bytes)
            .map_err(|e| DataError::io("cannot write", out.staging().join(HF_TOKENIZER_FILE), e))?;
    }
    let split = tokenizer.splits_at_lines().then_some(PIECE_BYTES);
    let mut reader = Reader::new(files, &opts.input, split);
    let progress = Progress::new(total_bytes(files), "tokenizing", opts.progress);
    let eos = tokenizer.eos_id();
    loop {
        let chunk = next_chunk(&mut reader, opts.chunk_bytes)?;
        if chunk.is_empty() {
            break;
        }
        for piece in encode_chunk(&tokenizer, &chunk)? {
            out.tokens(&piece.ids)?;
            if let Some(prompt) = piece.end {
                out.tokens(&[eos])?;
                out.end_document(Some(prompt))?;
            }
        }
        progress.update(reader.stats.bytes, out.total);
    }
    progress.finish();
    if out.documents_count == 0 {
        return Err(DataError::EmptyCorpus { inputs: files.to_vec() });
    }
    if let Some(first) = scanned {
        if let Some((a, b)) = first.iter().zip(&reader.sources).find(|(a, b)| a != b) {
            return Err(DataError::BadInput {
                given: b.path.clone(),
                reason: format!(
                    "the file changed while it was being prepared (sha256 {} then {})",
                    a.sha256, b.sha256
                ),
            });
        }
    }
    let (total, documents, prompt_tokens) = (out.total, out.documents_count, out.prompt_tokens);
    let finished = out.finish()?;
    let mut train_tokens = ((total as f64) * (1.0 - opts.val_fraction)).floor() as u64;
    if sft {
        train_tokens = round_down_to_document_end(
            &finished.staging.path().join(crate::meta::DOCUMENTS_FILE),
            train_tokens,
        )?;
    }
    let meta = Meta {
        format_version: FORMAT_VERSION,
        kind: if sft { DataKind::Sft } else { DataKind::Pretrain },
        tokenizer: tokenizer.spec(),
        vocab_size: tokenizer.vocab_size(),
        eos_id: eos,
        dtype,
        total_tokens: total,
        documents,
        shards: finished.shards,
        shard_tokens: opts.shard_tokens,
        train_tokens,
        val_tokens: total - train_tokens,
        val_fraction: opts.val_fraction,
        documents_sha256: finished.documents_sha256,
        prompts_sha256: finished.prompts_sha256,
        prompt_tokens,
        sources: reader.sources,
        lossy_replacements: reader.stats.lossy_replacements,
        empty_documents: reader.stats.empty_documents,
    };
    // Checked again: the directory may have changed while the corpus was tokenized.
    let replaced = output::replaceable(
        &opts.out,
        opts.force,
        &kept_inputs(opts, files),
        tokenizer.hf_file_bytes().is_some(),
    )?;
    commit(finished.staging, &opts.out, &meta, &replaced)?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(PrepareSummary { meta, out: opts.out.clone(), input_bytes: reader.stats.bytes, seconds })
}

/// The largest document end (from a documents.bin, read as a stream) that is ≤ `limit`, or 0.
fn round_down_to_document_end(path: &std::path::Path, limit: u64) -> Result<u64, DataError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| DataError::io("cannot read", path, e))?;
    let mut reader = std::io::BufReader::new(file);
    let mut best = 0;
    let mut word = [0u8; 8];
    loop {
        match reader.read_exact(&mut word) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(best),
            Err(e) => return Err(DataError::io("cannot read", path, e)),
        }
        let end = u64::from_le_bytes(word);
        if end > limit {
            return Ok(best);
        }
        best = end;
    }
}

#[cfg(test)]
mod tests;
