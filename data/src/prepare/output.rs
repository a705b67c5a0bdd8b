//! Where `prepare` may write: a new or empty directory, or one holding a provable Ember dataset
//! (which only `force` replaces) — never a directory of someone else's files, nor files that
//! merely bear Ember's names. Only Ember's own files are ever removed.

use std::path::{Path, PathBuf};

use super::writer::{Replacing, REPLACING_FILE};
use crate::meta::{Meta, DOCUMENTS_FILE, META_FILE, PROMPTS_FILE};
use crate::tokenizer::HF_TOKENIZER_FILE;
use crate::DataError;

/// Names listed in an error before "and N more".
const LISTED: usize = 8;

/// Checks that `prepare` may write into `out` and returns the files of the Ember dataset it
/// would replace there (to be removed just before the new files move in).
///
/// - `out` missing, or holding nothing but files in `keep` (the inputs, e.g. a corpus
///   downloaded into `out`): allowed.
/// - `out` holds a provable Ember dataset: files that a valid Ember `meta.json` lists, or that
///   the record of an interrupted replacement (`.ember-replacing.json`, see
///   [`super::writer::commit`]) names: allowed with `force`, which replaces that dataset's
///   files and keeps every other file.
/// - Files that merely have an Ember dataset's names (`tokens-00000.bin`, `documents.bin`)
///   that nothing valid lists, even beside a damaged `meta.json`: refused, with or without
///   `force` — they may be anybody's.
/// - Anything else (e.g. nanoGPT's `train.bin`, `val.bin`, `meta.pkl`): refused, naming the
///   files found; nothing is written or removed.
///
/// `writes_tokenizer` says the new dataset has a `tokenizer.json` (hf): one already in `out`
/// that is neither the previous dataset's nor in `keep` is refused rather than overwritten.
///
/// Errors: [`DataError::OutputInUse`] naming `out`, the files and what to do.
pub fn check_output_dir(
    out: &Path,
    force: bool,
    keep: &[PathBuf],
    writes_tokenizer: bool,
) -> Result<Vec<PathBuf>, DataError> {
    let refuse = |reason: String| DataError::OutputInUse { dir: out.into(), reason };
    match std::fs::metadata(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DataError::io("cannot inspect output directory", out, e)),
        Ok(m) if !m.is_dir() => return Err(refuse("it is a file; expected a directory".into())),
        Ok(_) => {}
    }
    let keep: Vec<PathBuf> =
        keep.iter().map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())).collect();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(out).map_err(|e| DataError::io("cannot list", out, e))? {
        let entry = entry.map_err(|e| DataError::io("cannot list", out, e))?;
        let path = std::fs::canonicalize(entry.path()).unwrap_or_else(|_| entry.path());
        if !keep.contains(&path) {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    // What is provably Ember's: listed by a valid meta.json, or by a replacement's record.
    let mut owned: Vec<String> = ember_meta(out).map(|meta| owned_by_meta(&meta)).unwrap_or_default();
    if let Some(record) = Replacing::read(out) {
        owned.extend(record.names().map(String::from));
    }
    let ours: Vec<String> = names.iter().filter(|n| owned.contains(n)).cloned().collect();
    let lookalikes: Vec<String> = names
        .iter()
        .filter(|n| !owned.contains(n))
        .filter(|n| is_shard(n) || [DOCUMENTS_FILE, PROMPTS_FILE, REPLACING_FILE].contains(&n.as_str()))
        .cloned()
        .collect();
    if !lookalikes.is_empty() {
        return Err(refuse(format!(
            "it holds {}, which {} an Ember dataset's names but no valid meta.json lists: not \
             provably an Ember dataset, so nothing was written or removed, even with --force; \
             remove {} yourself if {} yours to discard, or choose another directory",
            list(&lookalikes),
            if lookalikes.len() == 1 { "has" } else { "have" },
            if lookalikes.len() == 1 { "it" } else { "them" },
            if lookalikes.len() == 1 { "it is" } else { "they are" },
        )));
    }
    if ours.is_empty() {
        return Err(refuse(format!(
            "it is not empty and holds no Ember dataset (found {}); nothing was written or \
             removed: choose a new or empty directory",
            list(&names)
        )));
    }
    if !force {
        return Err(refuse(format!(
            "it already holds an Ember dataset ({}); pass --force to replace it (files that are \
             not Ember's are kept)",
            list(&ours)
        )));
    }
    if writes_tokenizer
        && names.iter().any(|n| n == HF_TOKENIZER_FILE)
        && !ours.iter().any(|n| n == HF_TOKENIZER_FILE)
    {
        return Err(refuse(format!(
            "it holds a {HF_TOKENIZER_FILE} that is not part of its Ember dataset and would be \
             overwritten; move it away or choose another directory"
        )));
    }
    // The record goes with the dataset it describes (a new one is written for this replacement).
    Ok(ours.into_iter().filter(|n| n != REPLACING_FILE).map(|n| out.join(n)).collect())
}

/// `out/meta.json`, if it is a valid Ember `meta.json`: of this format, a whole [`Meta`] whose
/// counts agree; of format 1, an object with `format_version` 1 (its files are known by name).
fn ember_meta(out: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read(out.join(META_FILE)).ok()?;
    let meta: serde_json::Value = serde_json::from_slice(&text).ok()?;
    match meta.get("format_version")?.as_u64()? {
        1 => Some(meta),
        _ => Meta::read(out).is_ok().then_some(meta),
    }
}

/// The files an Ember `meta.json` accounts for: itself, its shards and indexes, an hf
/// tokenizer's `tokenizer.json`, and format 1's `train.bin` / `val.bin`.
fn owned_by_meta(meta: &serde_json::Value) -> Vec<String> {
    let mut owned: Vec<String> = [META_FILE, DOCUMENTS_FILE, PROMPTS_FILE].map(String::from).to_vec();
    let shards = meta.get("shards").and_then(|s| s.as_array()).into_iter().flatten();
    owned.extend(shards.filter_map(|s| s.get("file")?.as_str().map(String::from)));
    if meta.pointer("/tokenizer/kind").and_then(|k| k.as_str()) == Some("hf") {
        owned.push(HF_TOKENIZER_FILE.into());
    }
    if meta.get("format_version").and_then(|v| v.as_u64()) == Some(1) {
        owned.extend(["train.bin".into(), "val.bin".into()]);
    }
    owned
}

/// `tokens-NNNNN.bin`: a token shard (a name only Ember uses).
fn is_shard(name: &str) -> bool {
    name.strip_prefix("tokens-")
        .and_then(|n| n.strip_suffix(".bin"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `a, b, c` or `a, b, … and N more`.
fn list(names: &[String]) -> String {
    let shown = names.iter().take(LISTED).cloned().collect::<Vec<_>>().join(", ");
    match names.len().saturating_sub(LISTED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

#[cfg(test)]
#[path = "output_tests.rs"]
mod tests;
