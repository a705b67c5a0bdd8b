//! What identifies a tokenizer: [`TokenizerSpec`] (stored in meta.json and run dirs) and
//! [`TokenizerKind`] (chosen on the command line).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::tiktoken;
use crate::DataError;

/// File name of a Hugging Face tokenizer copied into a prepared-data directory.
pub const HF_TOKENIZER_FILE: &str = "tokenizer.json";

/// Which tokenizer, as stored in meta.json and in run dirs (serde, internally tagged `"kind"`:
/// `"char"` | `"byte"` | `"gpt2"` | `"cl100k"` | `"o200k"` | `"hf"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TokenizerSpec {
    /// Character-level: `chars[i]` has id `i`; EOS is id `chars.len()`.
    /// `chars` must be sorted and distinct.
    Char {
        /// The vocabulary, sorted and distinct.
        chars: Vec<char>,
    },
    /// Bytes: ids 0..=255, EOS 256.
    Byte,
    /// GPT-2 BPE (tiktoken `r50k_base`), EOS 50256, vocab 50257.
    Gpt2,
    /// tiktoken `cl100k_base`, EOS 100257, vocab 100277.
    Cl100k,
    /// tiktoken `o200k_base`, EOS 199999, vocab 200019.
    O200k,
    /// A Hugging Face `tokenizer.json`, kept beside meta.json as `file`.
    Hf {
        /// File name relative to the directory holding the spec ([`HF_TOKENIZER_FILE`]).
        file: String,
        /// SHA-256 of the file (lowercase hex); a different file is refused.
        sha256: String,
        /// The EOS token's text, e.g. `"<|endoftext|>"`.
        eos_token: String,
        /// The EOS token's id.
        eos_id: u32,
        /// Largest id + 1, added tokens included.
        vocab_size: usize,
    },
}

impl TokenizerSpec {
    /// The kind of this spec.
    pub fn kind(&self) -> TokenizerKind {
        match self {
            TokenizerSpec::Char { .. } => TokenizerKind::Char,
            TokenizerSpec::Byte => TokenizerKind::Byte,
            TokenizerSpec::Gpt2 => TokenizerKind::Gpt2,
            TokenizerSpec::Cl100k => TokenizerKind::Cl100k,
            TokenizerSpec::O200k => TokenizerKind::O200k,
            TokenizerSpec::Hf { .. } => TokenizerKind::Hf,
        }
    }

    /// Vocabulary size (largest id + 1), known without loading any file.
    pub fn vocab_size(&self) -> usize {
        match self {
            TokenizerSpec::Char { chars } => chars.len() + 1,
            TokenizerSpec::Byte => 257,
            TokenizerSpec::Gpt2 => tiktoken::R50K.vocab_size,
            TokenizerSpec::Cl100k => tiktoken::CL100K.vocab_size,
            TokenizerSpec::O200k => tiktoken::O200K.vocab_size,
            TokenizerSpec::Hf { vocab_size, .. } => *vocab_size,
        }
    }

    /// EOS id, known without loading any file.
    pub fn eos_id(&self) -> u32 {
        match self {
            TokenizerSpec::Char { chars } => chars.len() as u32,
            TokenizerSpec::Byte => 256,
            TokenizerSpec::Gpt2 => tiktoken::R50K.eos_id(),
            TokenizerSpec::Cl100k => tiktoken::CL100K.eos_id(),
            TokenizerSpec::O200k => tiktoken::O200K.eos_id(),
            TokenizerSpec::Hf { eos_id, .. } => *eos_id,
        }
    }
}

/// The tokenizer kind chosen on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenizerKind {
    /// Character-level, vocabulary fitted on the corpus.
    Char,
    /// Raw UTF-8 bytes.
    Byte,
    /// GPT-2 BPE (`r50k_base`).
    Gpt2,
    /// `cl100k_base`.
    Cl100k,
    /// `o200k_base`.
    O200k,
    /// A Hugging Face `tokenizer.json` (needs a file).
    Hf,
}

impl TokenizerKind {
    /// The command-line name: `"char"`, `"byte"`, `"gpt2"`, `"cl100k"`, `"o200k"` or `"hf"`.
    pub fn name(self) -> &'static str {
        match self {
            TokenizerKind::Char => "char",
            TokenizerKind::Byte => "byte",
            TokenizerKind::Gpt2 => "gpt2",
            TokenizerKind::Cl100k => "cl100k",
            TokenizerKind::O200k => "o200k",
            TokenizerKind::Hf => "hf",
        }
    }
}

impl FromStr for TokenizerKind {
    type Err = DataError;

    /// Parses a command-line name (exactly; lowercase).
    /// Errors: [`DataError::UnknownTokenizerKind`] for anything else.
    fn from_str(s: &str) -> Result<Self, DataError> {
        [
            TokenizerKind::Char,
            TokenizerKind::Byte,
            TokenizerKind::Gpt2,
            TokenizerKind::Cl100k,
            TokenizerKind::O200k,
            TokenizerKind::Hf,
        ]
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| DataError::UnknownTokenizerKind { given: s.to_string() })
    }
}

impl fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
