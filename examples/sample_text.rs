//! The small generated corpus the examples train on when no file is given.

use std::path::{Path, PathBuf};

/// Writes 300 lines of repetitive English to `dir/corpus.txt` and returns its path.
pub fn sample_corpus(dir: &Path) -> PathBuf {
    let text: String =
        (0..300).map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog.\n")).collect();
    let path = dir.join("corpus.txt");
    std::fs::write(&path, text).expect("write the corpus");
    path
}

/// The corpus named by the first command-line argument, else the sample written under `dir`.
pub fn corpus_from_args(dir: &Path) -> PathBuf {
    std::env::args().nth(1).map(Into::into).unwrap_or_else(|| sample_corpus(dir))
}
