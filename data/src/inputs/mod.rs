//! Reading a corpus: which files (`--input` files, directories, globs), and how each becomes
//! documents (`.txt`: a file, or pieces between separator lines; `.jsonl`: one per line) or
//! SFT examples.

mod paths;
pub(crate) mod reader;
mod sft;

pub use paths::{resolve_inputs, InputFormat};
pub use sft::SftFields;

/// How input files are read into documents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputOptions {
    /// Field of a `.jsonl` line that holds the document's text (default `"text"`).
    pub text_field: String,
    /// If set, a `.txt` file is split into documents on lines equal to this (compared without
    /// the line's `"\n"` or `"\r\n"`). A document is the lines between two separator lines,
    /// line ends included; separator lines are dropped; empty documents are skipped. Unset:
    /// a `.txt` file is one document.
    pub doc_separator: Option<String>,
    /// Replace invalid UTF-8 with U+FFFD (counted) instead of failing.
    pub lossy: bool,
    /// Read SFT examples (`.jsonl` only) with these field names instead of documents.
    pub sft: Option<SftFields>,
}

impl Default for InputOptions {
    fn default() -> Self {
        InputOptions { text_field: "text".into(), doc_separator: None, lossy: false, sft: None }
    }
}
