//! Which files of a prepared directory are provably Ember's: those its valid `meta.json` lists
//! (each with the SHA-256 it records) and those the record of an interrupted replacement names
//! ([`super::replacing`]) — only under an Ember dataset's file names, and, before anything is
//! removed, only while their bytes are the ones listed.

use std::path::Path;

use super::replacing::{Replacing, REPLACING_FILE};
use crate::digest::sha256_file;
use crate::meta::{Meta, DOCUMENTS_FILE, META_FILE, PROMPTS_FILE};
use crate::tokenizer::{TokenizerSpec, HF_TOKENIZER_FILE};

/// `tokens-NNNNN.bin`: a token shard (a name only Ember uses).
pub(crate) fn is_shard(name: &str) -> bool {
    name.strip_prefix("tokens-")
        .and_then(|n| n.strip_suffix(".bin"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `name` is the name of a file of an Ember dataset, or of the replacement record.
pub(crate) fn has_ember_name(name: &str) -> bool {
    is_shard(name)
        || [META_FILE, DOCUMENTS_FILE, PROMPTS_FILE, HF_TOKENIZER_FILE, REPLACING_FILE].contains(&name)
}

/// Whether `name` is used by Ember alone (shards, the indexes, the record): such a file that
/// nothing valid lists is refused, not taken for somebody else's ordinary file.
pub(crate) fn only_ember_uses(name: &str) -> bool {
    is_shard(name) || [DOCUMENTS_FILE, PROMPTS_FILE, REPLACING_FILE].contains(&name)
}

/// The files a directory's `meta.json` and replacement record account for.
pub(crate) struct Owned {
    /// (name, the SHA-256 its bytes must have; `None`: known by name alone — a valid
    /// `meta.json` itself, the record itself).
    entries: Vec<(String, Option<String>)>,
}

impl Owned {
    /// What `out`'s valid `meta.json` and replacement record list, under Ember's names only.
    pub(crate) fn in_dir(out: &Path) -> Self {
        let mut entries = meta_entries(out);
        if let Some(record) = Replacing::read(out) {
            entries.push((REPLACING_FILE.into(), None));
            entries.extend(record.files.iter().map(|(name, sha)| (name.clone(), Some(sha.clone()))));
        }
        entries.retain(|(name, _)| has_ember_name(name));
        Self { entries }
    }

    /// Whether `name` is listed.
    pub(crate) fn claims(&self, name: &str) -> bool {
        self.entries.iter().any(|(n, _)| n == name)
    }

    /// The SHA-256 of `out/name` when it is listed with the bytes it has now (reads the file
    /// to hash it; one known by name alone is hashed as it is).
    pub(crate) fn verified(&self, out: &Path, name: &str) -> Option<String> {
        let mut hashes = self.entries.iter().filter(|(n, _)| n == name).map(|(_, sha)| sha.as_deref());
        let actual = sha256_file(&out.join(name)).ok()?;
        hashes.any(|sha| sha.is_none_or(|sha| sha == actual)).then_some(actual)
    }
}

/// The files `out/meta.json` lists, if it is a valid Ember `meta.json` — a whole [`Meta`] of
/// this format whose counts agree: itself (known by its validity), and [`listed`]. A format-1
/// `meta.json` proves nothing ([`Meta::read`] refuses it: it recorded no hashes, and its
/// `train.bin`, `val.bin` are nanoGPT's names as well).
fn meta_entries(out: &Path) -> Vec<(String, Option<String>)> {
    let Ok(meta) = Meta::read(out) else { return Vec::new() };
    let listed = listed(&meta).into_iter().map(|(name, sha)| (name, Some(sha)));
    std::iter::once((META_FILE.to_string(), None)).chain(listed).collect()
}

/// Every file `meta` lists with its SHA-256, `meta.json` aside: its shards, `documents.bin`,
/// `prompts.bin` (SFT) and an hf `tokenizer.json` — what a dataset's own meta.json proves, and
/// what a replacement moves in.
pub(crate) fn listed(meta: &Meta) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> =
        meta.shards.iter().map(|s| (s.file.clone(), s.sha256.clone())).collect();
    files.push((DOCUMENTS_FILE.into(), meta.documents_sha256.clone()));
    if let Some(sha) = &meta.prompts_sha256 {
        files.push((PROMPTS_FILE.into(), sha.clone()));
    }
    if let TokenizerSpec::Hf { file, sha256, .. } = &meta.tokenizer {
        files.push((file.clone(), sha256.clone()));
    }
    files
}
