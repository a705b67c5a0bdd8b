//! `meta.json`: what a prepared-data directory holds and how to read its files.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{DataError, TokenizerSpec};

/// The `format_version` this crate writes and reads.
pub const FORMAT_VERSION: u32 = 2;

/// File name of the metadata in a prepared-data directory.
pub const META_FILE: &str = "meta.json";
/// File name of the document index: u64 LE cumulative end offsets (tokens, exclusive).
pub const DOCUMENTS_FILE: &str = "documents.bin";
/// File name of the SFT prompt lengths: u32 LE per example.
pub const PROMPTS_FILE: &str = "prompts.bin";

/// File name of token shard `index`: `tokens-00000.bin`, `tokens-00001.bin`, …
pub fn shard_file_name(index: usize) -> String {
    format!("tokens-{index:05}.bin")
}

/// Width of one token in a shard (always little-endian, no header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// 2 bytes per token; used when `vocab_size <= 65536`.
    U16,
    /// 4 bytes per token.
    U32,
}

impl TokenDtype {
    /// Bytes per token: 2 or 4.
    pub fn bytes(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }

    /// The narrowest dtype that holds every id below `vocab_size`: U16 if `vocab_size <= 65536`.
    pub fn for_vocab(vocab_size: usize) -> TokenDtype {
        if vocab_size <= 1 << 16 {
            TokenDtype::U16
        } else {
            TokenDtype::U32
        }
    }
}

/// What the documents are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataKind {
    /// Plain documents, packed into windows for pretraining.
    Pretrain,
    /// SFT examples (prompt + response + EOS), one per row, prompt tokens unscored.
    Sft,
}

/// One input file of the corpus, for provenance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// The path as resolved from `--input`.
    pub path: String,
    /// File size in bytes.
    pub bytes: u64,
    /// SHA-256 of the file's bytes, lowercase hex.
    pub sha256: String,
}

/// One token shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File name in the directory (`tokens-00000.bin`).
    pub file: String,
    /// Tokens it holds.
    pub tokens: u64,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
}

/// Contents of `meta.json` (format 2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Layout version; [`FORMAT_VERSION`] (2).
    pub format_version: u32,
    /// Pretraining documents or SFT examples.
    pub kind: DataKind,
    /// The tokenizer that produced the tokens.
    pub tokenizer: TokenizerSpec,
    /// Number of token ids (largest id + 1), EOS included.
    pub vocab_size: usize,
    /// End-of-text id; follows every document.
    pub eos_id: u32,
    /// Width of one token in the shards.
    pub dtype: TokenDtype,
    /// Tokens in the whole stream (all shards).
    pub total_tokens: u64,
    /// Documents (= EOS tokens = entries of documents.bin; SFT: examples).
    pub documents: u64,
    /// The shards, in stream order; each holds at most `shard_tokens` tokens.
    pub shards: Vec<ShardInfo>,
    /// The `--shard-tokens` limit the shards were cut with.
    pub shard_tokens: u64,
    /// Train split: stream `[0, train_tokens)`; val: `[train_tokens, total_tokens)`.
    /// `floor(total_tokens * (1 - val_fraction))`, for SFT rounded down to a document end.
    pub train_tokens: u64,
    /// `total_tokens - train_tokens`.
    pub val_tokens: u64,
    /// The requested validation fraction.
    pub val_fraction: f64,
    /// SHA-256 of documents.bin.
    pub documents_sha256: String,
    /// SHA-256 of prompts.bin (SFT only).
    pub prompts_sha256: Option<String>,
    /// Prompt tokens over all SFT examples (0 for pretraining).
    pub prompt_tokens: u64,
    /// The input files, in order.
    pub sources: Vec<SourceInfo>,
    /// Invalid UTF-8 sequences replaced by U+FFFD (`--lossy`).
    pub lossy_replacements: u64,
    /// Empty documents skipped.
    pub empty_documents: u64,
}

impl Meta {
    /// Reads and checks `dir/meta.json`.
    ///
    /// Errors: [`DataError::Io`] if it cannot be read, [`DataError::InvalidMeta`] (with the serde
    /// error) if it does not parse, [`DataError::UnsupportedFormatVersion`] for another
    /// format_version (a format-1 directory: run `ember prepare` again), and
    /// [`DataError::InconsistentMeta`] if counts, tokenizer, vocab_size, eos_id and dtype disagree.
    pub fn read(dir: &Path) -> Result<Meta, DataError> {
        let path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| DataError::io("cannot read prepared-data metadata", &path, e))?;
        // The version first, so an old/new layout is reported as such, not as a field error.
        #[derive(Deserialize)]
        struct Version {
            format_version: u32,
        }
        let version: Version = serde_json::from_str(&text)
            .map_err(|source| DataError::InvalidMeta { path: path.clone(), source })?;
        if version.format_version != FORMAT_VERSION {
            return Err(DataError::UnsupportedFormatVersion {
                path,
                found: version.format_version,
                expected: FORMAT_VERSION,
            });
        }
        let meta: Meta = serde_json::from_str(&text)
            .map_err(|source| DataError::InvalidMeta { path: path.clone(), source })?;
        meta.check(&path)?;
        Ok(meta)
    }

    /// Checks that the fields agree with each other; `path` is only used in the error.
    pub fn check(&self, path: &Path) -> Result<(), DataError> {
        let bad = |reason: String| Err(DataError::InconsistentMeta { path: PathBuf::from(path), reason });
        if let TokenizerSpec::Char { .. } = &self.tokenizer {
            crate::Tokenizer::from_spec(&self.tokenizer)
                .map_err(|e| DataError::InconsistentMeta { path: path.into(), reason: e.to_string() })?;
        }
        let (vocab, eos) = (self.tokenizer.vocab_size(), self.tokenizer.eos_id());
        if vocab != self.vocab_size {
            return bad(format!("vocab_size is {} but the tokenizer has {vocab} ids", self.vocab_size));
        }
        if eos != self.eos_id {
            return bad(format!("eos_id is {} but the tokenizer's EOS id is {eos}", self.eos_id));
        }
        if self.dtype == TokenDtype::U16 && self.vocab_size > 1 << 16 {
            return bad(format!("dtype u16 cannot hold ids of a {}-token vocabulary", self.vocab_size));
        }
        let shard_sum: u64 = self.shards.iter().map(|s| s.tokens).sum();
        if shard_sum != self.total_tokens {
            return bad(format!(
                "the shards hold {shard_sum} tokens but total_tokens is {}",
                self.total_tokens
            ));
        }
        if self.train_tokens + self.val_tokens != self.total_tokens {
            return bad(format!(
                "train_tokens {} + val_tokens {} != total_tokens {}",
                self.train_tokens, self.val_tokens, self.total_tokens
            ));
        }
        if (self.kind == DataKind::Sft) != self.prompts_sha256.is_some() {
            return bad(format!(
                "kind {:?} and prompts_sha256 {:?} disagree",
                self.kind, self.prompts_sha256
            ));
        }
        Ok(())
    }

    /// Serializes as pretty JSON with a trailing newline.
    pub(crate) fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("Meta has only JSON-representable fields");
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A consistent meta: "ab" with a char tokenizer, one document, one shard.
    pub(crate) fn sample() -> Meta {
        Meta {
            format_version: FORMAT_VERSION,
            kind: DataKind::Pretrain,
            tokenizer: TokenizerSpec::Char { chars: vec!['a', 'b'] },
            vocab_size: 3,
            eos_id: 2,
            dtype: TokenDtype::U16,
            total_tokens: 3,
            documents: 1,
            shards: vec![ShardInfo { file: shard_file_name(0), tokens: 3, sha256: "00".into() }],
            shard_tokens: 100,
            train_tokens: 2,
            val_tokens: 1,
            val_fraction: 0.1,
            documents_sha256: "00".into(),
            prompts_sha256: None,
            prompt_tokens: 0,
            sources: vec![SourceInfo { path: "a.txt".into(), bytes: 2, sha256: "00".into() }],
            lossy_replacements: 0,
            empty_documents: 0,
        }
    }

    #[test]
    fn dtype_widths_and_names() {
        assert_eq!(TokenDtype::U16.bytes(), 2);
        assert_eq!(TokenDtype::U32.bytes(), 4);
        assert_eq!(TokenDtype::for_vocab(65536), TokenDtype::U16);
        assert_eq!(TokenDtype::for_vocab(65537), TokenDtype::U32);
        assert_eq!(serde_json::to_string(&TokenDtype::U32).unwrap(), "\"u32\"");
        assert_eq!(serde_json::to_string(&DataKind::Sft).unwrap(), "\"sft\"");
        assert_eq!(shard_file_name(12), "tokens-00012.bin");
    }

    #[test]
    fn roundtrip_through_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(META_FILE), sample().to_json()).unwrap();
        assert_eq!(Meta::read(dir.path()).unwrap(), sample());
    }

    #[test]
    fn format_version_1_says_to_prepare_again() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(META_FILE), r#"{"format_version": 1, "train_tokens": 5}"#).unwrap();
        let err = Meta::read(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::UnsupportedFormatVersion { found: 1, expected: 2, .. }), "{err:?}");
        assert!(err.to_string().contains("run `ember prepare` again"), "{err}");
    }

    #[test]
    fn rejects_inconsistent_fields() {
        let dir = tempfile::tempdir().unwrap();
        type Case = (fn(&mut Meta), &'static str);
        let cases: [Case; 4] = [
            (|m| m.vocab_size = 4, "vocab_size is 4"),
            (|m| m.total_tokens = 4, "the shards hold 3 tokens"),
            (|m| m.val_tokens = 2, "train_tokens 2 + val_tokens 2 != total_tokens 3"),
            (|m| m.kind = DataKind::Sft, "prompts_sha256"),
        ];
        for (edit, want) in cases {
            let mut m = sample();
            edit(&mut m);
            std::fs::write(dir.path().join(META_FILE), m.to_json()).unwrap();
            let err = Meta::read(dir.path()).unwrap_err();
            assert!(matches!(err, DataError::InconsistentMeta { .. }), "{err:?}");
            assert!(err.to_string().contains(want), "{err} lacks {want}");
        }
    }

    #[test]
    fn missing_field_names_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(META_FILE), r#"{"format_version": 2}"#).unwrap();
        let msg = Meta::read(dir.path()).unwrap_err().to_string();
        assert!(msg.contains(META_FILE) && msg.contains("missing field"), "{msg}");
    }

    #[test]
    fn missing_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let msg = Meta::read(dir.path()).unwrap_err().to_string();
        assert!(msg.contains(&dir.path().join(META_FILE).display().to_string()), "{msg}");
    }
}
