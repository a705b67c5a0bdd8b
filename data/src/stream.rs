//! The token stream of a prepared directory: shards memory-mapped, read as one sequence.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::{DataError, TokenDtype};

/// One memory-mapped shard.
#[derive(Debug)]
pub(crate) struct Shard {
    /// The file.
    pub path: PathBuf,
    /// Offset of its first token in the whole stream.
    pub start: u64,
    /// Tokens it holds.
    pub tokens: u64,
    /// `None` for an empty file (a zero-length mapping is not allowed).
    pub map: Option<Mmap>,
}

impl Shard {
    /// Maps `path` and checks that it holds `tokens` tokens of `dtype`.
    ///
    /// Errors: [`DataError::Io`] (cannot open or map), [`DataError::ShardSize`] (wrong size,
    /// naming the file, the expected and the actual size).
    pub fn open(path: &Path, start: u64, tokens: u64, dtype: TokenDtype) -> Result<Shard, DataError> {
        let file = File::open(path).map_err(|e| DataError::io("cannot open token shard", path, e))?;
        let actual_bytes =
            file.metadata().map_err(|e| DataError::io("cannot stat token shard", path, e))?.len();
        let expected_bytes = tokens * dtype.bytes() as u64;
        if actual_bytes != expected_bytes {
            return Err(DataError::ShardSize {
                path: path.into(),
                expected_tokens: tokens,
                expected_bytes,
                actual_bytes,
            });
        }
        let map = if actual_bytes == 0 {
            None
        } else {
            // SAFETY: the mapping is read-only; prepared files are never modified in place
            // (`prepare` replaces them by rename, which leaves an open mapping intact).
            Some(
                unsafe { Mmap::map(&file) }
                    .map_err(|e| DataError::io("cannot memory-map token shard", path, e))?,
            )
        };
        Ok(Shard { path: path.into(), start, tokens, map })
    }

    /// The shard's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// All shards of a directory, in stream order.
#[derive(Debug)]
pub(crate) struct Shards {
    pub dtype: TokenDtype,
    pub shards: Vec<Shard>,
}

impl Shards {
    /// Total tokens.
    pub fn total(&self) -> u64 {
        self.shards.last().map_or(0, |s| s.start + s.tokens)
    }

    /// Appends tokens `[start, start + n)` of the whole stream to `out`; the caller checked the
    /// range.
    fn read(&self, mut start: u64, mut n: u64, out: &mut Vec<u32>) {
        out.reserve(n as usize);
        // The last shard whose start is <= start.
        let mut k = self.shards.partition_point(|s| s.start <= start).saturating_sub(1);
        while n > 0 {
            let shard = &self.shards[k];
            let from = start - shard.start;
            let take = n.min(shard.tokens - from);
            let w = self.dtype.bytes();
            let bytes = &shard.bytes()[from as usize * w..(from + take) as usize * w];
            match self.dtype {
                TokenDtype::U16 => {
                    out.extend(bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32))
                }
                TokenDtype::U32 => {
                    out.extend(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                }
            }
            start += take;
            n -= take;
            k += 1;
        }
    }
}

/// A contiguous range of a prepared directory's token stream (e.g. the train or val split),
/// read through memory maps across shard boundaries. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TokenStream {
    shards: Arc<Shards>,
    /// Offset of this range in the whole stream.
    start: u64,
    len: u64,
}

impl TokenStream {
    /// The range `[start, start + len)` of `shards`; the caller checked it.
    pub(crate) fn new(shards: Arc<Shards>, start: u64, len: u64) -> TokenStream {
        debug_assert!(start + len <= shards.total());
        TokenStream { shards, start, len }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True if the range holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of this range's first token in the whole stream (the train split: 0; val:
    /// `train_tokens`).
    pub fn offset(&self) -> u64 {
        self.start
    }

    /// Width of one token on disk.
    pub fn dtype(&self) -> TokenDtype {
        self.shards.dtype
    }

    /// Token `i` of the range, `None` if `i >= len()`.
    pub fn get(&self, i: usize) -> Option<u32> {
        if (i as u64) >= self.len {
            return None;
        }
        let mut out = Vec::with_capacity(1);
        self.shards.read(self.start + i as u64, 1, &mut out);
        out.pop()
    }

    /// Tokens `[start, start + len)` of the range, across shard boundaries.
    ///
    /// Errors: [`DataError::InvalidBatch`] if the range exceeds `len()` (naming both).
    pub fn slice(&self, start: usize, len: usize) -> Result<Vec<u32>, DataError> {
        let mut out = Vec::with_capacity(len);
        self.read_into(start, len, &mut out)?;
        Ok(out)
    }

    /// Appends tokens `[start, start + len)` of the range to `out`.
    ///
    /// Errors: as [`TokenStream::slice`].
    pub fn read_into(&self, start: usize, len: usize, out: &mut Vec<u32>) -> Result<(), DataError> {
        match start.checked_add(len) {
            Some(end) if end as u64 <= self.len => {
                self.shards.read(self.start + start as u64, len as u64, out);
                Ok(())
            }
            _ => Err(DataError::InvalidBatch {
                reason: format!(
                    "token range {start}..{start}+{len} exceeds the stream's {} tokens",
                    self.len
                ),
            }),
        }
    }
}

/// Encodes `tokens` as little-endian `dtype`, appending to `out`. The caller guarantees every
/// token fits `dtype`.
pub(crate) fn encode_tokens_into(tokens: &[u32], dtype: TokenDtype, out: &mut Vec<u8>) {
    match dtype {
        TokenDtype::U16 => out.extend(tokens.iter().flat_map(|&t| (t as u16).to_le_bytes())),
        TokenDtype::U32 => out.extend(tokens.iter().flat_map(|&t| t.to_le_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shards of sizes `sizes` holding 0, 1, 2, … (u16, or u32 with ids + 70000).
    pub(crate) fn shards(dir: &Path, sizes: &[u64], dtype: TokenDtype) -> Arc<Shards> {
        let base = if dtype == TokenDtype::U32 { 70_000 } else { 0 };
        let mut start = 0;
        let mut out = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let toks: Vec<u32> = (start..start + n).map(|t| t as u32 + base).collect();
            let mut bytes = Vec::new();
            encode_tokens_into(&toks, dtype, &mut bytes);
            let path = dir.join(format!("s{i}.bin"));
            std::fs::write(&path, bytes).unwrap();
            out.push(Shard::open(&path, start, n, dtype).unwrap());
            start += n;
        }
        Arc::new(Shards { dtype, shards: out })
    }

    #[test]
    fn slices_cross_shard_boundaries() {
        let tmp = tempfile::tempdir().unwrap();
        let s = shards(tmp.path(), &[3, 0, 2, 4], TokenDtype::U16);
        let all = TokenStream::new(s.clone(), 0, 9);
        assert_eq!(all.slice(0, 9).unwrap(), (0..9).collect::<Vec<u32>>());
        assert_eq!(all.slice(2, 4).unwrap(), vec![2, 3, 4, 5]);
        assert_eq!(all.get(8), Some(8));
        assert_eq!(all.get(9), None);
        let val = TokenStream::new(s, 4, 5);
        assert_eq!(val.slice(0, 5).unwrap(), vec![4, 5, 6, 7, 8]);
        assert_eq!(val.offset(), 4);
        let err = val.slice(3, 3).unwrap_err();
        assert!(err.to_string().contains("3..3+3 exceeds the stream's 5 tokens"), "{err}");
    }

    #[test]
    fn u32_little_endian() {
        let tmp = tempfile::tempdir().unwrap();
        let s = shards(tmp.path(), &[2, 1], TokenDtype::U32);
        assert_eq!(std::fs::read(tmp.path().join("s0.bin")).unwrap()[..4], [0x70, 0x11, 0x01, 0x00]); // 70000
        assert_eq!(TokenStream::new(s, 0, 3).slice(0, 3).unwrap(), vec![70_000, 70_001, 70_002]);
    }

    #[test]
    fn wrong_size_names_file_and_sizes() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("t.bin");
        std::fs::write(&p, [1u8, 0, 2]).unwrap();
        let err = Shard::open(&p, 0, 2, TokenDtype::U16).unwrap_err();
        assert!(matches!(err, DataError::ShardSize { expected_bytes: 4, actual_bytes: 3, .. }), "{err:?}");
        assert!(err.to_string().contains("t.bin"), "{err}");
        let err = Shard::open(&tmp.path().join("none.bin"), 0, 2, TokenDtype::U16).unwrap_err();
        assert!(err.to_string().contains("none.bin"), "{err}");
    }
}
