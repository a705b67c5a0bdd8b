//! Memory-mapped flat token files (`train.bin`, `val.bin`).

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::{DataError, TokenDtype};

/// A memory-mapped token file (train.bin or val.bin): little-endian tokens of `dtype`, no header.
///
/// The file must not be modified while it is open (`prepare` always replaces files by rename,
/// which leaves an open mapping intact).
#[derive(Debug)]
pub struct TokenStream {
    path: PathBuf,
    dtype: TokenDtype,
    /// `None` for an empty file (a zero-length mapping is not allowed).
    map: Option<Mmap>,
}

impl TokenStream {
    /// Opens and maps `path`.
    ///
    /// Errors: [`DataError::Io`] if it cannot be opened or mapped;
    /// [`DataError::MisalignedTokenFile`] if its length is not a multiple of `dtype.bytes()`.
    pub fn open(path: &Path, dtype: TokenDtype) -> Result<Self, DataError> {
        let file = File::open(path).map_err(|e| DataError::io("cannot open token file", path, e))?;
        let bytes = file.metadata().map_err(|e| DataError::io("cannot stat token file", path, e))?.len();
        if bytes % dtype.bytes() as u64 != 0 {
            return Err(DataError::MisalignedTokenFile {
                path: path.into(),
                bytes,
                dtype_bytes: dtype.bytes(),
            });
        }
        let map = if bytes == 0 {
            None
        } else {
            // SAFETY: the mapping is read-only; the documented contract is that token files are
            // not modified in place while open (prepare replaces them by rename).
            let map = unsafe { Mmap::map(&file) }
                .map_err(|e| DataError::io("cannot memory-map token file", path, e))?;
            Some(map)
        };
        Ok(TokenStream { path: path.into(), dtype, map })
    }

    /// The file this stream maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Width of one token in the file.
    pub fn dtype(&self) -> TokenDtype {
        self.dtype
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.bytes().len() / self.dtype.bytes()
    }

    /// True if the file holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token `i`. Panics if `i >= len()` (callers check).
    pub fn get(&self, i: usize) -> u32 {
        let w = self.dtype.bytes();
        let b = &self.bytes()[i * w..(i + 1) * w];
        match self.dtype {
            TokenDtype::U16 => u16::from_le_bytes([b[0], b[1]]) as u32,
            TokenDtype::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        }
    }

    /// Tokens `start..start + len`. Panics if that range exceeds `len()` (callers check).
    pub fn slice(&self, start: usize, len: usize) -> Vec<u32> {
        let w = self.dtype.bytes();
        let b = &self.bytes()[start * w..(start + len) * w];
        match self.dtype {
            TokenDtype::U16 => b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32).collect(),
            TokenDtype::U32 => {
                b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
            }
        }
    }
}

/// Encodes `tokens` as little-endian `dtype`. Caller guarantees every token fits `dtype`.
pub(crate) fn encode_tokens(tokens: &[u32], dtype: TokenDtype) -> Vec<u8> {
    match dtype {
        TokenDtype::U16 => tokens.iter().flat_map(|&t| (t as u16).to_le_bytes()).collect(),
        TokenDtype::U32 => tokens.iter().flat_map(|&t| t.to_le_bytes()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_u16_little_endian() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.bin");
        // 1, 258 (0x0102), 65535
        std::fs::write(&p, [1u8, 0, 2, 1, 255, 255]).unwrap();
        let s = TokenStream::open(&p, TokenDtype::U16).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s.get(1), 258);
        assert_eq!(s.slice(0, 3), vec![1, 258, 65535]);
        assert_eq!(s.slice(2, 0), Vec::<u32>::new());
    }

    #[test]
    fn reads_u32_little_endian_and_roundtrips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.bin");
        let toks = [0u32, 70000, 1];
        let bytes = encode_tokens(&toks, TokenDtype::U32);
        assert_eq!(&bytes[4..8], &[0x70, 0x11, 0x01, 0x00]); // 70000 = 0x00011170
        std::fs::write(&p, bytes).unwrap();
        let s = TokenStream::open(&p, TokenDtype::U32).unwrap();
        assert_eq!(s.slice(0, 3), toks.to_vec());
    }

    #[test]
    fn empty_file_is_empty_stream() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.bin");
        std::fs::write(&p, []).unwrap();
        let s = TokenStream::open(&p, TokenDtype::U16).unwrap();
        assert!(s.is_empty());
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn misaligned_length_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.bin");
        std::fs::write(&p, [1u8, 0, 2]).unwrap();
        let err = TokenStream::open(&p, TokenDtype::U16).unwrap_err();
        assert!(matches!(err, DataError::MisalignedTokenFile { bytes: 3, dtype_bytes: 2, .. }), "{err:?}");
        assert!(err.to_string().contains("t.bin"));
    }

    #[test]
    fn missing_file_is_named() {
        let err = TokenStream::open(Path::new("/nonexistent/x.bin"), TokenDtype::U16).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/x.bin"), "{err}");
    }
}
