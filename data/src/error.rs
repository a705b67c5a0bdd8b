//! The crate's single error type.

use std::path::PathBuf;

/// Everything that can go wrong in `ember-data`. Every message names the file, field or
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

    /// An input file is not valid UTF-8.
    #[error("input file {path} is not valid UTF-8: invalid byte sequence at byte offset {offset}")]
    InvalidUtf8 {
        /// The input file.
        path: PathBuf,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },

    /// `prepare` was given no input files.
    #[error("no input files given: pass at least one text file to tokenize")]
    NoInputs,

    /// The inputs hold no non-empty document.
    #[error("empty corpus: the input files {inputs:?} contain no text to tokenize")]
    EmptyCorpus {
        /// The input files, as given.
        inputs: Vec<PathBuf>,
    },

    /// `val_fraction` is not a number in [0, 1).
    #[error("val_fraction must be a number in [0, 1), got {value}")]
    InvalidValFraction {
        /// The rejected value.
        value: f64,
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

    /// A token id is not below the vocabulary size.
    #[error("token id {id} is out of range: the vocabulary has {vocab_size} ids (0..{vocab_size})")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// The tokenizer's vocabulary size.
        vocab_size: usize,
    },

    /// A tokenizer spec cannot be used (e.g. a char list that is not sorted and distinct).
    #[error("invalid tokenizer spec: {reason}")]
    InvalidTokenizerSpec {
        /// What is wrong and what was expected.
        reason: String,
    },

    /// A tokenizer name is not "char" or "gpt2".
    #[error("unknown tokenizer {given:?}: expected \"char\" or \"gpt2\"")]
    UnknownTokenizerKind {
        /// The rejected name.
        given: String,
    },

    /// `meta.json` is missing fields, has wrong types or is not JSON.
    #[error("invalid {path}: {source}")]
    InvalidMeta {
        /// The meta.json file.
        path: PathBuf,
        /// The serde error (names the field, line and column).
        source: serde_json::Error,
    },

    /// `meta.json` parses but contradicts itself (e.g. dtype too small for the vocabulary).
    #[error("inconsistent {path}: {reason}")]
    InconsistentMeta {
        /// The meta.json file.
        path: PathBuf,
        /// What disagrees with what.
        reason: String,
    },

    /// `meta.json` has a `format_version` this crate cannot read.
    #[error("{path}: unsupported format_version {found}, this version of ember-data reads format_version {expected}; re-run `prepare`")]
    UnsupportedFormatVersion {
        /// The meta.json file.
        path: PathBuf,
        /// The version found in the file.
        found: u32,
        /// The version this crate writes and reads.
        expected: u32,
    },

    /// A token file's length is not a multiple of the token size.
    #[error("token file {path} is {bytes} bytes long, which is not a multiple of {dtype_bytes} (the size of one token); the file is truncated or corrupt")]
    MisalignedTokenFile {
        /// The .bin file.
        path: PathBuf,
        /// Its length in bytes.
        bytes: u64,
        /// Bytes per token.
        dtype_bytes: usize,
    },

    /// A token file holds a different number of tokens than meta.json records.
    #[error("token file {path} holds {actual} tokens but meta.json records {expected}; the file is truncated or stale, re-run `prepare`")]
    TokenCountMismatch {
        /// The .bin file.
        path: PathBuf,
        /// Token count recorded in meta.json.
        expected: u64,
        /// Token count found in the file.
        actual: u64,
    },

    /// A split holds too few tokens for one window of `seq_len + 1` tokens.
    #[error("the {split} split holds {tokens} tokens, but one window needs seq_len + 1 = {needed}; use a shorter seq_len or more data (or a larger val_fraction for the val split)")]
    StreamTooShort {
        /// "train" or "val".
        split: &'static str,
        /// Tokens in the split.
        tokens: usize,
        /// Tokens needed (seq_len + 1).
        needed: usize,
    },

    /// Windows handed to [`crate::Batch::from_windows`] (or sampler settings) cannot form a batch.
    #[error("invalid batch: {reason}")]
    InvalidBatch {
        /// What is wrong and what was expected.
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
}
