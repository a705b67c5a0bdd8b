//! Streaming input files into documents (or SFT examples), line by line, with the file and line
//! of every error. Memory: one line, plus the current document (or the current piece of it, for
//! tokenizers that allow cutting documents at line ends).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::paths::InputFormat;
use super::sft::{parse_example, string_field};
use super::InputOptions;
use crate::{DataError, SourceInfo};

/// A unit of text to tokenize, in corpus order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// A document, or a piece of one; `last` means the document ends here (the EOS follows).
    Text {
        /// The text.
        text: String,
        /// True for a document's final piece.
        last: bool,
    },
    /// One SFT example (always a whole document).
    Sft {
        /// The prompt (not scored).
        prompt: String,
        /// The response (scored, with the EOS).
        response: String,
    },
}

impl Piece {
    /// Bytes of text held.
    pub fn len(&self) -> usize {
        match self {
            Piece::Text { text, .. } => text.len(),
            Piece::Sft { prompt, response } => prompt.len() + response.len(),
        }
    }
}

/// Counters of what reading met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReadStats {
    /// Invalid UTF-8 sequences replaced by U+FFFD (with `lossy`).
    pub lossy_replacements: u64,
    /// Empty documents skipped (an empty `.txt` file, an empty piece before a separator line,
    /// a `.jsonl` text field holding `""`).
    pub empty_documents: u64,
    /// Input bytes read so far.
    pub bytes: u64,
}

/// True if a document may be cut between `before` (text so far) and `next` (the next line):
/// `before` ends with `'\n'` preceded by a non-whitespace char, and `next` starts with a
/// non-whitespace char. No pre-tokenizer regex of the tiktoken encodings matches across
/// such a point, and a lone `"\n"` piece is the same whether the text ends there or goes on, so
/// the tokens of the two sides concatenate to the tokens of the whole (see
/// `tokenizer::tests::line_splits_are_additive`). `"\r\n"` and trailing spaces are excluded:
/// `"\s+(?!\S)"` groups them differently at the end of a text.
pub(crate) fn can_split(before: &str, next: &str) -> bool {
    let Some(rest) = before.strip_suffix('\n') else { return false };
    let prev_ok = rest.chars().next_back().is_some_and(|c| !c.is_whitespace());
    let next_ok = next.chars().next().is_some_and(|c| !c.is_whitespace());
    prev_ok && next_ok
}

/// Accumulates one document's lines, cutting it into pieces of at least `piece_bytes` at
/// points where [`can_split`] allows (when `split` is on).
struct DocBuilder {
    text: String,
    pieces: usize,
}

impl DocBuilder {
    fn push_line(&mut self, line: &str, split: Option<usize>, out: &mut VecDeque<Piece>) {
        if let Some(min) = split {
            if self.text.len() >= min && can_split(&self.text, line) {
                out.push_back(Piece::Text { text: std::mem::take(&mut self.text), last: false });
                self.pieces += 1;
            }
        }
        self.text.push_str(line);
    }

    /// Ends the document; returns false (and emits nothing) if it was empty.
    fn finish(&mut self, out: &mut VecDeque<Piece>) -> bool {
        let nonempty = !self.text.is_empty() || self.pieces > 0;
        if nonempty {
            out.push_back(Piece::Text { text: std::mem::take(&mut self.text), last: true });
        }
        self.pieces = 0;
        nonempty
    }
}

/// The file being read.
struct OpenFile {
    path: PathBuf,
    format: InputFormat,
    reader: BufReader<File>,
    hasher: Sha256,
    /// Lines read (the 1-based number of the last line read).
    line: u64,
    /// Bytes read.
    offset: u64,
    /// Whether a separator line was met (an empty trailing piece after one is not counted).
    saw_separator: bool,
    doc: DocBuilder,
}

/// Reads `files` in order into [`Piece`]s.
pub(crate) struct Reader<'a> {
    files: &'a [PathBuf],
    opts: &'a InputOptions,
    /// `Some(min_bytes)`: documents may be cut at line ends into pieces of ≥ min_bytes.
    split: Option<usize>,
    next_file: usize,
    file: Option<OpenFile>,
    queue: VecDeque<Piece>,
    line_buf: Vec<u8>,
    /// What reading met so far.
    pub stats: ReadStats,
    /// Every file read to its end, in order.
    pub sources: Vec<SourceInfo>,
}

impl<'a> Reader<'a> {
    /// A reader of `files` (already resolved). `split`: see the field.
    pub fn new(files: &'a [PathBuf], opts: &'a InputOptions, split: Option<usize>) -> Self {
        Reader {
            files,
            opts,
            split,
            next_file: 0,
            file: None,
            queue: VecDeque::new(),
            line_buf: Vec::new(),
            stats: ReadStats::default(),
            sources: Vec::new(),
        }
    }

    /// The next piece, `None` after the last file.
    ///
    /// Errors: [`DataError::Io`] (unreadable file), [`DataError::InvalidUtf8`] (file, line and
    /// byte offset), [`DataError::BadLine`] (a `.jsonl` line that is not a JSON object or lacks
    /// the field), [`DataError::BadInput`] (a `.txt` file given with `sft`).
    pub fn next_piece(&mut self) -> Result<Option<Piece>, DataError> {
        loop {
            if let Some(p) = self.queue.pop_front() {
                return Ok(Some(p));
            }
            if self.file.is_none() {
                let Some(path) = self.files.get(self.next_file) else { return Ok(None) };
                self.next_file += 1;
                self.file = Some(self.open(path)?);
            }
            self.step()?;
        }
    }

    fn open(&self, path: &Path) -> Result<OpenFile, DataError> {
        let format = InputFormat::of(path);
        if self.opts.sft.is_some() && format != InputFormat::Jsonl {
            return Err(DataError::BadInput {
                given: path.display().to_string(),
                reason: "SFT examples are read from .jsonl files (prompt/response or messages per line)"
                    .into(),
            });
        }
        let file = File::open(path).map_err(|e| DataError::io("cannot read input file", path, e))?;
        Ok(OpenFile {
            path: path.to_path_buf(),
            format,
            reader: BufReader::with_capacity(1 << 20, file),
            hasher: Sha256::new(),
            line: 0,
            offset: 0,
            saw_separator: false,
            doc: DocBuilder { text: String::new(), pieces: 0 },
        })
    }

    /// Reads one line of the open file and queues what it completes; at the end of the file,
    /// finishes it and records its [`SourceInfo`].
    fn step(&mut self) -> Result<(), DataError> {
        let f = self.file.as_mut().expect("step is called with an open file");
        let mut buf = std::mem::take(&mut self.line_buf);
        buf.clear();
        let n = f
            .reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| DataError::io("cannot read input file", &f.path, e))?;
        if n == 0 {
            self.line_buf = buf;
            return self.end_file();
        }
        f.hasher.update(&buf);
        f.line += 1;
        let start = f.offset;
        f.offset += n as u64;
        self.stats.bytes += n as u64;
        let text = decode(&buf, self.opts.lossy, &f.path, f.line, start, &mut self.stats)?;
        let result = match f.format {
            InputFormat::Text => {
                let bare = text.strip_suffix('\n').map_or(&*text, |l| l.strip_suffix('\r').unwrap_or(l));
                if self.opts.doc_separator.as_deref() == Some(bare) {
                    f.saw_separator = true;
                    if !f.doc.finish(&mut self.queue) {
                        self.stats.empty_documents += 1;
                    }
                } else {
                    f.doc.push_line(&text, self.split, &mut self.queue);
                }
                Ok(())
            }
            InputFormat::Jsonl => {
                jsonl_line(f, &text, self.opts, self.split, &mut self.queue, &mut self.stats)
            }
        };
        drop(text);
        self.line_buf = buf;
        result
    }

    fn end_file(&mut self) -> Result<(), DataError> {
        let mut f = self.file.take().expect("end_file is called with an open file");
        if f.format == InputFormat::Text && !f.doc.finish(&mut self.queue) && !(f.saw_separator) {
            self.stats.empty_documents += 1; // an empty file
        }
        let sha256 = format!("{:x}", f.hasher.finalize());
        self.sources.push(SourceInfo { path: f.path.display().to_string(), bytes: f.offset, sha256 });
        Ok(())
    }
}

/// Handles one `.jsonl` line: blank lines are skipped; otherwise a JSON object whose text field
/// (or SFT fields) becomes a document.
fn jsonl_line(
    f: &mut OpenFile,
    text: &str,
    opts: &InputOptions,
    split: Option<usize>,
    queue: &mut VecDeque<Piece>,
    stats: &mut ReadStats,
) -> Result<(), DataError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(());
    }
    let bad = |reason: String| DataError::BadLine { path: f.path.clone(), line: f.line, reason };
    let value: Value = serde_json::from_str(trimmed).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(bad("expected a JSON object per line".into()));
    };
    if let Some(fields) = &opts.sft {
        let (prompt, response) = parse_example(&obj, fields).map_err(bad)?;
        queue.push_back(Piece::Sft { prompt, response });
        return Ok(());
    }
    let doc = string_field(&obj, &opts.text_field)
        .map_err(|e| bad(format!("{e}; choose the field with --text-field")))?;
    for line in doc.split_inclusive('\n') {
        f.doc.push_line(line, split, queue);
    }
    if !f.doc.finish(queue) {
        stats.empty_documents += 1;
    }
    Ok(())
}

/// `bytes` as text: borrowed if valid UTF-8; else, with `lossy`, invalid sequences replaced by
/// U+FFFD (one per maximal invalid sequence, as `String::from_utf8_lossy`) and counted;
/// without, an error naming the file, line and the byte offset in the file.
fn decode<'b>(
    bytes: &'b [u8],
    lossy: bool,
    path: &Path,
    line: u64,
    line_offset: u64,
    stats: &mut ReadStats,
) -> Result<Cow<'b, str>, DataError> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(Cow::Borrowed(s)),
        Err(e) if !lossy => Err(DataError::InvalidUtf8 {
            path: path.into(),
            line,
            offset: line_offset + e.valid_up_to() as u64,
        }),
        Err(_) => {
            stats.lossy_replacements +=
                bytes.utf8_chunks().filter(|c| !c.invalid().is_empty()).count() as u64;
            Ok(String::from_utf8_lossy(bytes))
        }
    }
}

#[cfg(test)]
mod tests;
