//! `meta.json`: what a prepared-data directory holds and how to read its token files.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{DataError, TokenizerSpec};

/// The `format_version` this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// File name of the metadata in a prepared-data directory.
pub const META_FILE: &str = "meta.json";
/// File name of the training tokens in a prepared-data directory.
pub const TRAIN_FILE: &str = "train.bin";
/// File name of the validation tokens in a prepared-data directory.
pub const VAL_FILE: &str = "val.bin";

/// Width of one token in a `.bin` file (always little-endian, no header).
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

/// One input file of the corpus, for provenance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// The path as given to `prepare`.
    pub path: String,
    /// File size in bytes.
    pub bytes: u64,
    /// SHA-256 of the file's bytes, lowercase hex.
    pub sha256: String,
}

/// Contents of `meta.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Layout version; [`FORMAT_VERSION`] (1).
    pub format_version: u32,
    /// The tokenizer that produced the token files.
    pub tokenizer: TokenizerSpec,
    /// Number of token ids, EOS included.
    pub vocab_size: usize,
    /// End-of-text id; follows every document.
    pub eos_id: u32,
    /// Width of one token in train.bin / val.bin.
    pub dtype: TokenDtype,
    /// Tokens in train.bin.
    pub train_tokens: u64,
    /// Tokens in val.bin.
    pub val_tokens: u64,
    /// Documents in the corpus (= number of EOS tokens).
    pub documents: u64,
    /// Fraction of tokens (by position, at the end of the stream) in val.bin.
    pub val_fraction: f64,
    /// The input files, in order.
    pub sources: Vec<SourceInfo>,
}

impl Meta {
    /// Reads and checks `dir/meta.json`.
    ///
    /// Errors: [`DataError::Io`] if it cannot be read, [`DataError::InvalidMeta`] (with the serde
    /// error) if it does not parse, [`DataError::UnsupportedFormatVersion`], and
    /// [`DataError::InconsistentMeta`] if tokenizer, vocab_size, eos_id and dtype disagree.
    pub fn read(dir: &Path) -> Result<Meta, DataError> {
        let path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| DataError::io("cannot read prepared-data metadata", &path, e))?;
        // Check the version first so an old/new layout is reported as such, not as a field error.
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
    fn check(&self, path: &Path) -> Result<(), DataError> {
        let bad = |reason: String| Err(DataError::InconsistentMeta { path: PathBuf::from(path), reason });
        let tokenizer = crate::Tokenizer::from_spec(&self.tokenizer)
            .map_err(|e| DataError::InconsistentMeta { path: path.into(), reason: e.to_string() })?;
        if tokenizer.vocab_size() != self.vocab_size {
            return bad(format!(
                "vocab_size is {} but the tokenizer has {} ids",
                self.vocab_size,
                tokenizer.vocab_size()
            ));
        }
        if tokenizer.eos_id() != self.eos_id {
            return bad(format!(
                "eos_id is {} but the tokenizer's EOS id is {}",
                self.eos_id,
                tokenizer.eos_id()
            ));
        }
        if self.dtype == TokenDtype::U16 && self.vocab_size > 1 << 16 {
            return bad(format!("dtype u16 cannot hold ids of a {}-token vocabulary", self.vocab_size));
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

    fn sample() -> Meta {
        Meta {
            format_version: FORMAT_VERSION,
            tokenizer: TokenizerSpec::Char { chars: vec!['a', 'b'] },
            vocab_size: 3,
            eos_id: 2,
            dtype: TokenDtype::U16,
            train_tokens: 9,
            val_tokens: 1,
            documents: 2,
            val_fraction: 0.1,
            sources: vec![SourceInfo { path: "a.txt".into(), bytes: 4, sha256: "00".into() }],
        }
    }

    #[test]
    fn dtype_widths() {
        assert_eq!(TokenDtype::U16.bytes(), 2);
        assert_eq!(TokenDtype::U32.bytes(), 4);
        assert_eq!(TokenDtype::for_vocab(65536), TokenDtype::U16);
        assert_eq!(TokenDtype::for_vocab(65537), TokenDtype::U32);
        assert_eq!(serde_json::to_string(&TokenDtype::U32).unwrap(), "\"u32\"");
    }

    #[test]
    fn roundtrip_through_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(META_FILE), sample().to_json()).unwrap();
        assert_eq!(Meta::read(dir.path()).unwrap(), sample());
    }

    #[test]
    fn rejects_other_format_version() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = sample();
        m.format_version = 2;
        std::fs::write(dir.path().join(META_FILE), m.to_json()).unwrap();
        let err = Meta::read(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::UnsupportedFormatVersion { found: 2, expected: 1, .. }), "{err:?}");
    }

    #[test]
    fn rejects_inconsistent_vocab() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = sample();
        m.vocab_size = 4;
        std::fs::write(dir.path().join(META_FILE), m.to_json()).unwrap();
        let err = Meta::read(dir.path()).unwrap_err();
        assert!(matches!(err, DataError::InconsistentMeta { .. }), "{err:?}");
        assert!(err.to_string().contains("vocab_size is 4"), "{err}");
    }

    #[test]
    fn missing_field_names_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(META_FILE), r#"{"format_version": 1}"#).unwrap();
        let msg = Meta::read(dir.path()).unwrap_err().to_string();
        assert!(msg.contains(META_FILE) && msg.contains("tokenizer"), "{msg}");
    }

    #[test]
    fn missing_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let msg = Meta::read(dir.path()).unwrap_err().to_string();
        assert!(msg.contains(&dir.path().join(META_FILE).display().to_string()), "{msg}");
    }
}
