//! Opening a prepared-data directory (meta.json + train.bin + val.bin).

use std::fmt;
use std::path::{Path, PathBuf};

use crate::meta::{TRAIN_FILE, VAL_FILE};
use crate::{DataError, Meta, TokenStream};

/// Which token stream of a prepared-data directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// train.bin
    Train,
    /// val.bin
    Val,
}

impl Split {
    /// `"train"` or `"val"`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An opened prepared-data directory.
#[derive(Debug)]
pub struct PreparedData {
    /// The directory.
    pub dir: PathBuf,
    /// Its meta.json.
    pub meta: Meta,
    /// train.bin, mapped.
    pub train: TokenStream,
    /// val.bin, mapped.
    pub val: TokenStream,
}

impl PreparedData {
    /// Opens `dir`: reads meta.json, maps train.bin and val.bin and checks their sizes.
    ///
    /// Errors: missing/invalid meta.json ([`DataError::Io`] / [`DataError::InvalidMeta`] naming
    /// the file and the serde error), [`DataError::UnsupportedFormatVersion`],
    /// [`DataError::InconsistentMeta`], a missing bin file ([`DataError::Io`]), and bin file sizes
    /// that disagree with meta's token counts ([`DataError::MisalignedTokenFile`] /
    /// [`DataError::TokenCountMismatch`], naming the file and both numbers).
    pub fn open(dir: &Path) -> Result<Self, DataError> {
        let meta = Meta::read(dir)?;
        let open = |name: &str, expected: u64| -> Result<TokenStream, DataError> {
            let path = dir.join(name);
            let stream = TokenStream::open(&path, meta.dtype)?;
            let actual = stream.len() as u64;
            if actual != expected {
                return Err(DataError::TokenCountMismatch { path, expected, actual });
            }
            Ok(stream)
        };
        let train = open(TRAIN_FILE, meta.train_tokens)?;
        let val = open(VAL_FILE, meta.val_tokens)?;
        Ok(PreparedData { dir: dir.into(), meta, train, val })
    }

    /// The stream of `split`.
    pub fn stream(&self, split: Split) -> &TokenStream {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{prepare, PrepareOptions, TokenizerKind};

    /// Prepares "abcd" (char, val_fraction 0.4): 5 tokens, train 3 (floor(5 * 0.6)), val 2.
    fn prepared() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("in.txt");
        std::fs::write(&input, "abcd").unwrap();
        let opts = PrepareOptions {
            tokenizer: TokenizerKind::Char,
            inputs: vec![input],
            out: tmp.path().join("out"),
            val_fraction: 0.4,
        };
        let s = prepare(&opts).unwrap();
        assert_eq!((s.meta.train_tokens, s.meta.val_tokens), (3, 2));
        tmp
    }

    #[test]
    fn opens_and_selects_streams() {
        let tmp = prepared();
        let d = PreparedData::open(&tmp.path().join("out")).unwrap();
        assert_eq!(d.stream(Split::Train).slice(0, 3), vec![0, 1, 2]);
        assert_eq!(d.stream(Split::Val).slice(0, 2), vec![3, 4]);
        assert_eq!(Split::Val.to_string(), "val");
    }

    #[test]
    fn truncated_bin_names_file_and_both_counts() {
        let tmp = prepared();
        let out = tmp.path().join("out");
        let train = out.join(TRAIN_FILE);
        std::fs::write(&train, [0u8, 0, 1, 0]).unwrap(); // 2 tokens instead of 3
        let err = PreparedData::open(&out).unwrap_err();
        assert!(matches!(err, DataError::TokenCountMismatch { expected: 3, actual: 2, .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains(&train.display().to_string())
                && msg.contains("holds 2")
                && msg.contains("records 3"),
            "{msg}"
        );
    }

    #[test]
    fn half_token_is_misaligned() {
        let tmp = prepared();
        let out = tmp.path().join("out");
        std::fs::write(out.join(VAL_FILE), [3u8, 0, 4]).unwrap();
        let err = PreparedData::open(&out).unwrap_err();
        assert!(matches!(err, DataError::MisalignedTokenFile { bytes: 3, .. }), "{err:?}");
    }

    #[test]
    fn missing_bin_and_meta_are_named() {
        let tmp = prepared();
        let out = tmp.path().join("out");
        std::fs::remove_file(out.join(VAL_FILE)).unwrap();
        let msg = PreparedData::open(&out).unwrap_err().to_string();
        assert!(msg.contains(VAL_FILE), "{msg}");
        let msg = PreparedData::open(tmp.path()).unwrap_err().to_string();
        assert!(msg.contains("meta.json"), "{msg}");
    }

    #[test]
    fn invalid_meta_json_names_file() {
        let tmp = prepared();
        let out = tmp.path().join("out");
        std::fs::write(out.join("meta.json"), "{not json").unwrap();
        let err = PreparedData::open(&out).unwrap_err();
        assert!(matches!(err, DataError::InvalidMeta { .. }), "{err:?}");
        assert!(err.to_string().contains("meta.json"), "{err}");
    }
}
