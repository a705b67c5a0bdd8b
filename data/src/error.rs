//! The crate's single error type.

use std::path::PathBuf;

/// Everything that can go wrong in `ember-data`. Every message names the file, line, field or
/// argument at fault and what was expected, so it can be shown to a user as is.
#[derive(thiserror::Error, Debug)]
pub enum DataError {
    /// Reading, writing, creating or renaming `path` failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "cannot read input file".
        action: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },

    /// An input path is neither a file, a directory nor a glob that matches something.
    #[error("input {given}: {reason}")]
    BadInput {
        /// The path or pattern as given.
        given: String,
        /// What is wrong and what was expected.
        reason: String,
    },

    /// An input file is not valid UTF-8 (and `lossy` was not asked for).
    #[error("input file {path} is not valid UTF-8: invalid byte sequence at byte offset {offset} (line {line}); prepare it with `ember prepare --lossy` to replace invalid bytes with U+FFFD")]
    InvalidUtf8 {
        /// The input file.
        path: PathBuf,
        /// 1-based line number of the invalid byte.
        line: u64,
        /// Byte offset of the first invalid byte in the file.
        offset: u64,
    },

    /// A line of a `.jsonl` input is not what was expected (not JSON, a missing field, a field
    /// of the wrong type, an SFT example without an assistant message, ...).
    #[error("{path}:{line}: {reason}")]
    BadLine {
        /// The input file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong and what was expected.
        reason: String,
    },

    /// `prepare` (or tokenizer training) was given no input files.
    #[error("no input files: {reason}")]
    NoInputs {
        /// What was given, and what is accepted.
        reason: String,
    },

    /// The inputs hold no non-empty document.
    #[error("empty corpus: the input files {inputs:?} contain no non-empty document")]
    EmptyCorpus {
        /// The input files.
        inputs: Vec<PathBuf>,
    },

    /// An option has a value outside its range, or options contradict each other.
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// The option, e.g. "val_fraction" (CLI: `--val-fraction`).
        option: &'static str,
        /// The value given and what was expected.
        reason: String,
    },

    /// The char tokenizer met a character outside its vocabulary.
    #[error("character {ch:?} (U+{code:04X}) at char position {position} is not in the char tokenizer's vocabulary")]
    UnknownChar {
        /// The unknown character.
        ch: char,
        /// Its code point (for invisible characters).
        code: u32,
        /// Its 0-based position, counted in chars, in the text being encoded.
        position: usize,
    },

    /// A token id is not one of the tokenizer's ids.
    #[error(
        "token id {id} is not in the vocabulary (ids 0..{vocab_size}, minus unused ids of the encoding)"
    )]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// The tokenizer's vocabulary size.
        vocab_size: usize,
    },

    /// A tokenizer spec or tokenizer file cannot be used.
    #[error("invalid tokenizer: {reason}")]
    InvalidTokenizerSpec {
        /// What is wrong and what was expected.
        reason: String,
    },

    /// A tokenizer name is not one of the known kinds.
    #[error("unknown tokenizer {given:?}: expected one of char, byte, gpt2, cl100k, o200k, hf")]
    UnknownTokenizerKind {
        /// The rejected name.
        given: String,
    },

    /// The Hugging Face tokenizers library failed (loading, encoding, training).
    #[error("tokenizer {context}: {reason}")]
    HfTokenizer {
        /// What was being done, with the file if any.
        context: String,
        /// The library's message.
        reason: String,
    },

    /// `meta.json` is missing fields, has wrong types or is not JSON.
    #[error("invalid {path}: {source}")]
    InvalidMeta {
        /// The meta.json file.
        path: PathBuf,
        /// The serde error (names the field, line and column).
        source: serde_json::Error,
    },

    /// `meta.json` parses but contradicts itself or the files beside it.
    #[error("inconsistent {path}: {reason}")]
    InconsistentMeta {
        /// The meta.json (or index) file.
        path: PathBuf,
        /// What disagrees with what.
        reason: String,
    },

    /// `meta.json` has a `format_version` this crate cannot read.
    #[error("{path}: unsupported format_version {found}; this version of ember-data reads format_version {expected}: run `ember prepare` again on the corpus to rewrite the directory")]
    UnsupportedFormatVersion {
        /// The meta.json file.
        path: PathBuf,
        /// The version found in the file.
        found: u32,
        /// The version this crate writes and reads.
        expected: u32,
    },

    /// A token shard's size differs from what meta.json records.
    #[error("token shard {path} is {actual_bytes} bytes long but meta.json records {expected_tokens} tokens ({expected_bytes} bytes); the file is truncated or stale, run `ember prepare` again")]
    ShardSize {
        /// The shard file.
        path: PathBuf,
        /// Tokens recorded in meta.json.
        expected_tokens: u64,
        /// Bytes those tokens take.
        expected_bytes: u64,
        /// Bytes found.
        actual_bytes: u64,
    },

    /// A file's SHA-256 differs from the one meta.json records.
    #[error("{path} is corrupt or was modified: its SHA-256 is {actual}, meta.json records {expected}; run `ember prepare` again")]
    FileChecksum {
        /// The file.
        path: PathBuf,
        /// SHA-256 recorded in meta.json (lowercase hex).
        expected: String,
        /// SHA-256 of the file's bytes now.
        actual: String,
    },

    /// A split holds too few tokens (or examples) for one row.
    #[error("the {split} split holds {tokens} token{}, but {needed}; use a smaller model.block_size or more data (or a larger `ember prepare --val-fraction` for the val split)", if *tokens == 1 { "" } else { "s" })]
    StreamTooShort {
        /// "train" or "val".
        split: &'static str,
        /// Tokens in the split.
        tokens: u64,
        /// What one row needs, in words.
        needed: String,
    },

    /// Rows, indices or sizes handed to a batch builder cannot form a batch.
    #[error("invalid batch: {reason}")]
    InvalidBatch {
        /// What is wrong and what was expected.
        reason: String,
    },

    /// Sampler settings or a resumed sampler state are unusable.
    #[error("invalid sampler: {reason}")]
    InvalidSampler {
        /// What is wrong and what was expected.
        reason: String,
    },

    /// The prefetch thread died (its producer panicked).
    #[error("prefetch thread failed: {reason}")]
    Prefetch {
        /// The panic message, if any.
        reason: String,
    },

    /// `prepare` would lose files in its output directory: it is a file, it holds files that
    /// are not an Ember dataset, or it holds one and `force` was not given.
    #[error("output directory {dir}: {reason}")]
    OutputInUse {
        /// The output directory.
        dir: PathBuf,
        /// What it holds and what to do.
        reason: String,
    },

    /// The download could not be made (offline, DNS, HTTP error status, ...).
    #[error("downloading {url} failed: {reason}. If this machine is offline, download input.txt elsewhere and pass `--input` a local copy of input.txt")]
    Download {
        /// The URL.
        url: String,
        /// The HTTP client's error.
        reason: String,
    },

    /// The downloaded file's SHA-256 differs from the expected one; the file was not kept.
    #[error("downloaded {url} has SHA-256 {actual}, expected {expected}; the file was discarded (not written to {dest})")]
    ChecksumMismatch {
        /// The URL.
        url: String,
        /// Where it would have been written.
        dest: PathBuf,
        /// Expected hex digest.
        expected: String,
        /// Hex digest of what was received.
        actual: String,
    },
}

impl DataError {
    /// Builds a [`DataError::Io`] for `path`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io { action, path: path.into(), source }
    }

    /// Builds a [`DataError::InvalidOption`].
    pub(crate) fn option(option: &'static str, reason: impl Into<String>) -> Self {
        DataError::InvalidOption { option, reason: reason.into() }
    }
}
