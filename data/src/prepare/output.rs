//! Where `prepare` may write: a new or empty directory, or one holding a provable Ember dataset
//! (which only `force` replaces) — never a directory of someone else's files, nor files that
//! merely bear Ember's names. Only Ember's own files are ever removed.

use std::path::{Path, PathBuf};

use super::owned::{only_ember_uses, Owned};
use super::replacing::REPLACING_FILE;
use crate::tokenizer::HF_TOKENIZER_FILE;
use crate::DataError;

/// Names listed in an error before "and N more".
const LISTED: usize = 8;

/// Checks that `prepare` may write into `out` and returns the files of the Ember dataset it
/// would replace there (to be removed just before the new files move in).
///
/// - `out` missing, or holding nothing but files in `keep` (the inputs, e.g. a corpus
///   downloaded into `out`): allowed.
/// - `out` holds a provable Ember dataset: files under Ember's names that a valid Ember
///   `meta.json` lists, or that the record of an interrupted replacement
///   (`.ember-replacing.json`, see [`super::replacing`]) names, each with the bytes listed
///   (SHA-256, checked with `force` before anything is removed): allowed with `force`, which
///   replaces that dataset's files and keeps every other file.
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
    let replaced = replaceable(out, force, keep, writes_tokenizer)?;
    Ok(replaced.into_iter().map(|(path, _)| path).collect())
}

/// [`check_output_dir`], each file to replace with its SHA-256 as verified (what the
/// replacement's record lists).
pub(crate) fn replaceable(
    out: &Path,
    force: bool,
    keep: &[PathBuf],
    writes_tokenizer: bool,
) -> Result<Vec<(PathBuf, String)>, DataError> {
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
    let owned = Owned::in_dir(out);
    let ours: Vec<String> = names.iter().filter(|n| owned.claims(n)).cloned().collect();
    let lookalikes: Vec<String> =
        names.iter().filter(|n| !owned.claims(n) && only_ember_uses(n)).cloned().collect();
    let not_ours = |what: String| {
        refuse(format!(
            "{what}: not provably an Ember dataset, so nothing was written or removed, even with \
             --force; remove them yourself if they are yours to discard, or choose another directory"
        ))
    };
    if !lookalikes.is_empty() {
        return Err(not_ours(format!(
            "it holds {}, which {} an Ember dataset's names but no valid meta.json lists",
            list(&lookalikes),
            if lookalikes.len() == 1 { "has" } else { "have" },
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
    // Before anything is removed: each file's bytes are the ones listed (a file of the user's
    // under an Ember name, or a dataset damaged since, is not replaced).
    let verified: Vec<Option<String>> = ours.iter().map(|n| owned.verified(out, n)).collect();
    let differ: Vec<String> =
        ours.iter().zip(&verified).filter(|(_, sha)| sha.is_none()).map(|(n, _)| n.clone()).collect();
    if !differ.is_empty() {
        return Err(not_ours(format!(
            "{} not the bytes its meta.json (or replacement record) lists (sha256 differs: a \
             file of yours under an Ember name, or a dataset damaged since it was prepared)",
            match differ.len() {
                1 => format!("{} is", differ[0]),
                _ => format!("{} are", list(&differ)),
            }
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
    Ok(ours
        .into_iter()
        .zip(verified.into_iter().flatten())
        .filter(|(n, _)| n != REPLACING_FILE)
        .map(|(n, sha)| (out.join(n), sha))
        .collect())
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
