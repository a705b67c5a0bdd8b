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

    /// Whether `out/name` is listed with the bytes it has now (reads the file to hash it).
    pub(crate) fn verifies(&self, out: &Path, name: &str) -> bool {
        let hashes: Vec<Option<&str>> =
            self.entries.iter().filter(|(n, _)| n == name).map(|(_, sha)| sha.as_deref()).collect();
        if hashes.contains(&None) {
            return !hashes.is_empty();
        }
        let Ok(actual) = sha256_file(&out.join(name)) else { return false };
        hashes.contains(&Some(actual.as_str()))
    }
}

/// The files `out/meta.json` lists, if it is a valid Ember `meta.json`: of this format, a whole
/// [`Meta`] whose counts agree (itself, its shards, `documents.bin`, `prompts.bin` and an hf
/// `tokenizer.json`, each with its SHA-256). A format-1 `meta.json` proves nothing (it
/// recorded no hashes, and `train.bin`, `val.bin` are nanoGPT's names as well).
fn meta_entries(out: &Path) -> Vec<(String, Option<String>)> {
    let Ok(text) = std::fs::read(out.join(META_FILE)) else { return Vec::new() };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&text) else { return Vec::new() };
    match json.get("format_version").and_then(|v| v.as_u64()) {
        // Format 1 listed no hashes and its file names are nanoGPT's too: nothing provable.
        Some(1) => Vec::new(),
        Some(_) => match Meta::read(out) {
            Ok(meta) => {
                let mut entries: Vec<(String, Option<String>)> = vec![(META_FILE.into(), None)];
                entries.extend(meta.shards.iter().map(|s| (s.file.clone(), Some(s.sha256.clone()))));
                entries.push((DOCUMENTS_FILE.into(), Some(meta.documents_sha256.clone())));
                if let Some(sha) = &meta.prompts_sha256 {
                    entries.push((PROMPTS_FILE.into(), Some(sha.clone())));
                }
                if let TokenizerSpec::Hf { file, sha256, .. } = &meta.tokenizer {
                    entries.push((file.clone(), Some(sha256.clone())));
                }
                entries
            }
            Err(_) => Vec::new(),
        },
        None => Vec::new(),
    }
}
