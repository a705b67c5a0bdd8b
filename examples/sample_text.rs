//! The examples' text: a small generated corpus (when no file is given) and its
//! character-level preparation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ember_data::{prepare, PrepareOptions, PreparedData, TokenizerKind};

/// Writes 300 lines of repetitive English to `dir/corpus.txt` and returns its path.
pub fn sample_corpus(dir: &Path) -> PathBuf {
    let text: String =
        (0..300).map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog.\n")).collect();
    let path = dir.join("corpus.txt");
    std::fs::write(&path, text).expect("write the corpus");
    path
}

/// The corpus named by the first command-line argument, else the sample written under `dir`
/// (`custom_loop.rs`; `burn_train.rs` parses flags too).
#[allow(dead_code)]
pub fn corpus_from_args(dir: &Path) -> PathBuf {
    std::env::args().nth(1).map(Into::into).unwrap_or_else(|| sample_corpus(dir))
}

/// Prepares `corpus` with the character tokenizer into `out` and opens it.
pub fn prepare_chars(corpus: &Path, out: &Path) -> Arc<PreparedData> {
    let mut options = PrepareOptions::new(TokenizerKind::Char, vec![corpus.into()], out.into());
    options.progress = false;
    prepare(&options).expect("prepare the corpus");
    Arc::new(PreparedData::open(out).expect("open the prepared data"))
}
