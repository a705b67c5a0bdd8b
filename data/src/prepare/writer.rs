//! Writing a prepared directory: token shards, documents.bin and prompts.bin are streamed into
//! a staging directory beside the output, then moved into place with meta.json last.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::owned::listed;
use super::replacing::{Replacing, REPLACING_FILE};
use crate::digest::sha256_hex;
use crate::meta::{shard_file_name, Meta, DOCUMENTS_FILE, META_FILE, PROMPTS_FILE};
use crate::stream::encode_tokens_into;
use crate::{DataError, ShardInfo, TokenDtype};

/// A file being written in the staging directory, hashed as it goes.
struct HashedFile {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: Sha256,
    bytes: u64,
}

impl HashedFile {
    fn create(path: PathBuf) -> Result<HashedFile, DataError> {
        let file = File::create(&path).map_err(|e| DataError::io("cannot create", &path, e))?;
        Ok(HashedFile { path, out: BufWriter::with_capacity(1 << 20, file), hasher: Sha256::new(), bytes: 0 })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), DataError> {
        self.hasher.update(bytes);
        self.bytes += bytes.len() as u64;
        self.out.write_all(bytes).map_err(|e| DataError::io("cannot write", &self.path, e))
    }

    /// Flushes and syncs; returns the SHA-256 (lowercase hex).
    fn finish(self) -> Result<String, DataError> {
        let file =
            self.out.into_inner().map_err(|e| DataError::io("cannot write", &self.path, e.into_error()))?;
        file.sync_all().map_err(|e| DataError::io("cannot sync", &self.path, e))?;
        Ok(format!("{:x}", self.hasher.finalize()))
    }
}

/// Streams the token stream into shards of at most `shard_tokens` tokens and the document
/// index (and SFT prompt lengths) beside them, in a staging directory.
pub(crate) struct StreamWriter {
    staging: tempfile::TempDir,
    dtype: TokenDtype,
    shard_tokens: u64,
    shard: Option<(HashedFile, u64)>,
    shards: Vec<ShardInfo>,
    documents: HashedFile,
    prompts: Option<HashedFile>,
    /// Tokens written.
    pub total: u64,
    /// Documents ended (= EOS written).
    pub documents_count: u64,
    /// Prompt tokens over all SFT examples.
    pub prompt_tokens: u64,
    bytes: Vec<u8>,
}

impl StreamWriter {
    /// Creates a staging directory beside `out` (in its parent, which is created if missing),
    /// so a failed run leaves `out` untouched.
    pub fn new(
        out: &Path,
        dtype: TokenDtype,
        shard_tokens: u64,
        sft: bool,
    ) -> Result<StreamWriter, DataError> {
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(parent).map_err(|e| DataError::io("cannot create directory", parent, e))?;
        remove_dead_stagings(parent);
        let staging = tempfile::Builder::new()
            .prefix(&format!("{STAGING_PREFIX}{}-", std::process::id()))
            .tempdir_in(parent)
            .map_err(|e| DataError::io("cannot create a staging directory in", parent, e))?;
        let documents = HashedFile::create(staging.path().join(DOCUMENTS_FILE))?;
        let prompts = if sft { Some(HashedFile::create(staging.path().join(PROMPTS_FILE))?) } else { None };
        Ok(StreamWriter {
            staging,
            dtype,
            shard_tokens,
            shard: None,
            shards: Vec::new(),
            documents,
            prompts,
            total: 0,
            documents_count: 0,
            prompt_tokens: 0,
            bytes: Vec::new(),
        })
    }

    /// The staging directory.
    pub fn staging(&self) -> &Path {
        self.staging.path()
    }

    /// Appends tokens to the stream, cutting shards at `shard_tokens`.
    pub fn tokens(&mut self, mut ids: &[u32]) -> Result<(), DataError> {
        while !ids.is_empty() {
            if self.shard.is_none() {
                let path = self.staging.path().join(shard_file_name(self.shards.len()));
                self.shard = Some((HashedFile::create(path)?, 0));
            }
            let (file, n) = self.shard.as_mut().expect("opened above");
            let take = (self.shard_tokens - *n).min(ids.len() as u64) as usize;
            self.bytes.clear();
            encode_tokens_into(&ids[..take], self.dtype, &mut self.bytes);
            file.write(&self.bytes)?;
            *n += take as u64;
            self.total += take as u64;
            ids = &ids[take..];
            if *n == self.shard_tokens {
                self.close_shard()?;
            }
        }
        Ok(())
    }

    fn close_shard(&mut self) -> Result<(), DataError> {
        if let Some((file, tokens)) = self.shard.take() {
            let name = file.path.file_name().expect("shard paths have a name").to_string_lossy().into_owned();
            let sha256 = file.finish()?;
            self.shards.push(ShardInfo { file: name, tokens, sha256 });
        }
        Ok(())
    }

    /// Ends the current document (the caller has just written its EOS): records its end
    /// offset, and for SFT its prompt length in tokens.
    pub fn end_document(&mut self, prompt_tokens: Option<u32>) -> Result<(), DataError> {
        self.documents.write(&self.total.to_le_bytes())?;
        self.documents_count += 1;
        if let (Some(file), Some(p)) = (self.prompts.as_mut(), prompt_tokens) {
            file.write(&p.to_le_bytes())?;
            self.prompt_tokens += u64::from(p);
        }
        Ok(())
    }

    /// Closes every file.
    pub fn finish(mut self) -> Result<Finished, DataError> {
        self.close_shard()?;
        Ok(Finished {
            documents_sha256: self.documents.finish()?,
            prompts_sha256: self.prompts.map(HashedFile::finish).transpose()?,
            staging: self.staging,
            shards: self.shards,
        })
    }
}

/// The staged files, closed.
pub(crate) struct Finished {
    /// The staging directory (deleted on drop unless committed).
    pub staging: tempfile::TempDir,
    /// The shards, in order.
    pub shards: Vec<ShardInfo>,
    /// SHA-256 of documents.bin.
    pub documents_sha256: String,
    /// SHA-256 of prompts.bin (SFT).
    pub prompts_sha256: Option<String>,
}

/// Prefix of a staging directory's name, followed by the PID of the `prepare` that made it.
const STAGING_PREFIX: &str = ".ember-prepare-";

/// Removes the staging directories in `parent` left by `prepare` runs that were killed (a
/// process whose PID no longer exists; Linux, where `/proc` tells). Others' — a `prepare`
/// running beside this one — and directories of any other name are left alone; a failure to
/// remove one is ignored (it is only disk space).
fn remove_dead_stagings(parent: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) =
            name.strip_prefix(STAGING_PREFIX).and_then(|rest| rest.split_once('-')).map(|(p, _)| p)
        else {
            continue;
        };
        let dead = !pid.is_empty()
            && pid.bytes().all(|b| b.is_ascii_digit())
            && !Path::new("/proc").join(pid).exists();
        if dead && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Writes `meta` (as JSON) into the staging directory and moves everything into `out`:
/// if `out` does not exist, the staging directory is renamed to it (atomic); otherwise a
/// replacement record ([`Replacing`]: the name and SHA-256 of every file removed and moved
/// in) is written first, so that what a crash leaves is still provably Ember's
/// ([`super::check_output_dir`]); then `out/meta.json` is removed (so a crash leaves no
/// meta.json that disagrees with the files beside it), the previous dataset's files
/// (`replaced`), the new files are renamed in, meta.json last, and the record is removed.
/// Other files in `out` (e.g. a downloaded corpus) are kept.
///
/// Errors: [`DataError::Io`] naming the file that could not be written, removed or renamed.
pub(crate) fn commit(
    staging: tempfile::TempDir,
    out: &Path,
    meta: &Meta,
    replaced: &[(PathBuf, String)],
) -> Result<(), DataError> {
    let meta_json = meta.to_json();
    let meta_tmp = staging.path().join(META_FILE);
    {
        let mut f = HashedFile::create(meta_tmp)?;
        f.write(meta_json.as_bytes())?;
        f.finish()?;
    }
    if !out.exists() {
        let from = staging.keep();
        return std::fs::rename(&from, out).map_err(|e| {
            let _ = std::fs::remove_dir_all(&from);
            DataError::io("cannot rename the staging directory onto", out, e)
        });
    }
    let staged: Vec<std::ffi::OsString> = std::fs::read_dir(staging.path())
        .map_err(|e| DataError::io("cannot list", staging.path(), e))?
        .map(|entry| {
            entry.map(|e| e.file_name()).map_err(|e| DataError::io("cannot list", staging.path(), e))
        })
        .collect::<Result<_, _>>()?;
    // The old files' hashes as verified, the new ones' as `meta` lists them (the staged files
    // are exactly those): nothing is read again.
    let name = |path: &PathBuf| path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let removed = replaced.iter().map(|(path, sha)| (name(path), sha.clone()));
    let added = listed(meta).into_iter().chain([(META_FILE.to_string(), sha256_hex(meta_json.as_bytes()))]);
    Replacing { files: removed.chain(added).collect() }.write(out)?;
    let old_meta = out.join(META_FILE);
    let replaced: Vec<&PathBuf> = replaced.iter().map(|(path, _)| path).collect();
    if replaced.contains(&&old_meta) {
        std::fs::remove_file(&old_meta).map_err(|e| DataError::io("cannot remove old", &old_meta, e))?;
    }
    for path in replaced.into_iter().filter(|p| **p != old_meta) {
        std::fs::remove_file(path).map_err(|e| DataError::io("cannot remove old", path, e))?;
    }
    for file in staged.iter().filter(|n| *n != META_FILE) {
        let dest = out.join(file);
        std::fs::rename(staging.path().join(file), &dest)
            .map_err(|e| DataError::io("cannot rename into place", &dest, e))?;
    }
    std::fs::rename(staging.path().join(META_FILE), &old_meta)
        .map_err(|e| DataError::io("cannot rename into place", &old_meta, e))?;
    let path = out.join(REPLACING_FILE);
    std::fs::remove_file(&path).map_err(|e| DataError::io("cannot remove", &path, e))
}
