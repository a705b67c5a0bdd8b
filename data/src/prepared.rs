//! Opening a prepared directory (format 2): meta.json, the token shards, documents.bin and
//! prompts.bin, every file checked against meta.json.

use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;

use crate::meta::{DataKind, DOCUMENTS_FILE, PROMPTS_FILE};
use crate::stream::{Shard, Shards};
use crate::{DataError, Meta, TokenStream, Tokenizer};

/// Which split of a prepared directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// Stream `[0, train_tokens)`.
    Train,
    /// Stream `[train_tokens, total_tokens)`.
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

/// A memory-mapped array of little-endian fixed-width integers (documents.bin: u64,
/// prompts.bin: u32).
#[derive(Debug)]
struct IndexFile {
    map: Option<Mmap>,
    width: usize,
}

impl IndexFile {
    /// Maps `path` and checks it holds `count` entries of `width` bytes.
    fn open(path: &Path, width: usize, count: u64) -> Result<IndexFile, DataError> {
        let file = File::open(path).map_err(|e| DataError::io("cannot open index file", path, e))?;
        let bytes = file.metadata().map_err(|e| DataError::io("cannot stat index file", path, e))?.len();
        if bytes != count * width as u64 {
            return Err(DataError::InconsistentMeta {
                path: path.into(),
                reason: format!(
                    "{bytes} bytes, but meta.json records {count} document{} ({} bytes); run `ember prepare` again",
                    if count == 1 { "" } else { "s" },
                    count * width as u64
                ),
            });
        }
        // SAFETY: read-only mapping of a file `prepare` never modifies in place.
        let map = if bytes == 0 {
            None
        } else {
            Some(unsafe { Mmap::map(&file) }.map_err(|e| DataError::io("cannot memory-map", path, e))?)
        };
        Ok(IndexFile { map, width })
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    fn len(&self) -> usize {
        self.bytes().len() / self.width
    }

    /// Entry `i` (the caller checks `i < len()`).
    fn get(&self, i: usize) -> u64 {
        let b = &self.bytes()[i * self.width..(i + 1) * self.width];
        match self.width {
            4 => u64::from(u32::from_le_bytes(b.try_into().expect("4 bytes"))),
            _ => u64::from_le_bytes(b.try_into().expect("8 bytes")),
        }
    }
}

/// SHA-256 of `bytes` compared with `expected`.
fn verify(path: &Path, bytes: &[u8], expected: &str) -> Result<(), DataError> {
    let actual = crate::sha256_hex(bytes);
    if actual == expected {
        Ok(())
    } else {
        Err(DataError::FileChecksum { path: path.into(), expected: expected.into(), actual })
    }
}

/// An opened prepared directory. `Send + Sync`; share it with `Arc`.
#[derive(Debug)]
pub struct PreparedData {
    /// The directory.
    pub dir: PathBuf,
    /// Its meta.json.
    pub meta: Meta,
    /// The train split, `[0, train_tokens)` of the stream.
    pub train: TokenStream,
    /// The val split, `[train_tokens, total_tokens)`.
    pub val: TokenStream,
    documents: IndexFile,
    prompts: Option<IndexFile>,
}

impl PreparedData {
    /// Opens `dir` and verifies it: meta.json parses and is consistent; every shard has the
    /// size and SHA-256 meta.json records (hashed in parallel, ~1 s per GB per core); so do
    /// documents.bin and prompts.bin, whose entries must be increasing ends ending at
    /// `total_tokens`, and prompts shorter than their examples.
    ///
    /// Errors: [`DataError::Io`] / [`DataError::InvalidMeta`] (missing or invalid meta.json),
    /// [`DataError::UnsupportedFormatVersion`] (e.g. a format-1 directory: run `ember prepare`
    /// again), [`DataError::InconsistentMeta`], [`DataError::ShardSize`] and
    /// [`DataError::FileChecksum`] naming the file and both values.
    pub fn open(dir: &Path) -> Result<Self, DataError> {
        Self::open_with(dir, true)
    }

    /// Like [`PreparedData::open`] but checks only sizes and the index, not SHA-256s (for
    /// tools that open large corpora repeatedly).
    pub fn open_unverified(dir: &Path) -> Result<Self, DataError> {
        Self::open_with(dir, false)
    }

    fn open_with(dir: &Path, check_hashes: bool) -> Result<Self, DataError> {
        let meta = Meta::read(dir)?;
        let mut shards = Vec::with_capacity(meta.shards.len());
        let mut start = 0;
        for info in &meta.shards {
            shards.push(Shard::open(&dir.join(&info.file), start, info.tokens, meta.dtype)?);
            start += info.tokens;
        }
        let documents_path = dir.join(DOCUMENTS_FILE);
        let documents = IndexFile::open(&documents_path, 8, meta.documents)?;
        let prompts_path = dir.join(PROMPTS_FILE);
        let prompts = match meta.kind {
            DataKind::Sft => Some(IndexFile::open(&prompts_path, 4, meta.documents)?),
            DataKind::Pretrain => None,
        };
        if check_hashes {
            shards
                .par_iter()
                .zip(&meta.shards)
                .try_for_each(|(s, info)| verify(&s.path, s.bytes(), &info.sha256))?;
            verify(&documents_path, documents.bytes(), &meta.documents_sha256)?;
            if let (Some(p), Some(sha)) = (&prompts, &meta.prompts_sha256) {
                verify(&prompts_path, p.bytes(), sha)?;
            }
        }
        check_index(&documents_path, &documents, prompts.as_ref(), meta.total_tokens)?;
        let shards = Arc::new(Shards { dtype: meta.dtype, shards });
        let train = TokenStream::new(shards.clone(), 0, meta.train_tokens);
        let val = TokenStream::new(shards, meta.train_tokens, meta.val_tokens);
        Ok(PreparedData { dir: dir.into(), meta, train, val, documents, prompts })
    }

    /// The stream of `split`.
    pub fn stream(&self, split: Split) -> &TokenStream {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }

    /// The tokenizer that produced the data (an hf one is read from `dir/tokenizer.json`).
    ///
    /// Errors: as [`Tokenizer::from_spec_in`].
    pub fn tokenizer(&self) -> Result<Tokenizer, DataError> {
        Tokenizer::from_spec_in(&self.meta.tokenizer, &self.dir)
    }

    /// Number of documents (SFT: examples).
    pub fn documents(&self) -> u64 {
        self.documents.len() as u64
    }

    /// Token range `[start, end)` of document `d` in the whole stream, its EOS included;
    /// `None` if `d >= documents()`.
    pub fn document(&self, d: u64) -> Option<Range<u64>> {
        if d >= self.documents() {
            return None;
        }
        let start = if d == 0 { 0 } else { self.documents.get(d as usize - 1) };
        Some(start..self.documents.get(d as usize))
    }

    /// Leading prompt tokens of SFT example `d`; `None` for pretraining data or `d` out of range.
    pub fn prompt_tokens(&self, d: u64) -> Option<u32> {
        let p = self.prompts.as_ref()?;
        ((d as usize) < p.len()).then(|| p.get(d as usize) as u32)
    }

    /// Index of the document holding stream position `pos` (= number of document ends ≤ pos).
    pub fn document_at(&self, pos: u64) -> u64 {
        let (mut lo, mut hi) = (0usize, self.documents.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.documents.get(mid) <= pos {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo as u64
    }

    /// The documents that lie in `split`: for SFT (whose split is at a document end) exactly
    /// its examples; for pretraining, those that end in it.
    pub fn documents_in(&self, split: Split) -> Range<u64> {
        // Documents whose end is <= train_tokens are train's.
        let k = self.document_at(self.meta.train_tokens);
        match split {
            Split::Train => 0..k,
            Split::Val => k..self.documents(),
        }
    }
}

/// Checks documents.bin (strictly increasing ends, the last = `total`) and prompts.bin (each
/// prompt shorter than its example, which ends with the EOS).
fn check_index(
    path: &Path,
    documents: &IndexFile,
    prompts: Option<&IndexFile>,
    total: u64,
) -> Result<(), DataError> {
    let mut prev = 0;
    for i in 0..documents.len() {
        let end = documents.get(i);
        if end <= prev {
            return Err(DataError::InconsistentMeta {
                path: path.into(),
                reason: format!("document {i} ends at {end}, not after the previous end {prev}"),
            });
        }
        if let Some(p) = prompts {
            if p.get(i) >= end - prev {
                return Err(DataError::InconsistentMeta {
                    path: path.with_file_name(PROMPTS_FILE),
                    reason: format!(
                        "example {i} has {} prompt tokens but only {} tokens",
                        p.get(i),
                        end - prev
                    ),
                });
            }
        }
        prev = end;
    }
    if prev != total {
        return Err(DataError::InconsistentMeta {
            path: path.into(),
            reason: format!("the last document ends at {prev}, but the stream holds {total} tokens"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
