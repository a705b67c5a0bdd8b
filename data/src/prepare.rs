//! Tokenize a corpus once into `train.bin`, `val.bin` and `meta.json`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::atomic::stage;
use crate::meta::{FORMAT_VERSION, META_FILE, TRAIN_FILE, VAL_FILE};
use crate::stream::encode_tokens;
use crate::tokenizer::EOS_TEXT;
use crate::{DataError, Meta, SourceInfo, TokenDtype, Tokenizer, TokenizerKind};

/// What to prepare.
#[derive(Clone, Debug, PartialEq)]
pub struct PrepareOptions {
    /// Tokenizer to use (char is fitted on the inputs).
    pub tokenizer: TokenizerKind,
    /// Input text files (UTF-8), in order.
    pub inputs: Vec<PathBuf>,
    /// Output directory; created if missing.
    pub out: PathBuf,
    /// Fraction of tokens, in [0, 1), that go to val.bin (taken from the end of the stream).
    pub val_fraction: f64,
}

/// What `prepare` wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct PrepareSummary {
    /// The meta.json written.
    pub meta: Meta,
    /// The output directory.
    pub out: PathBuf,
}

/// One read input file.
struct Source {
    info: SourceInfo,
    text: String,
}

fn read_source(path: &Path) -> Result<Source, DataError> {
    let bytes = std::fs::read(path).map_err(|e| DataError::io("cannot read input file", path, e))?;
    let sha256 = format!("{:x}", Sha256::digest(&bytes));
    let info = SourceInfo { path: path.display().to_string(), bytes: bytes.len() as u64, sha256 };
    let text = String::from_utf8(bytes)
        .map_err(|e| DataError::InvalidUtf8 { path: path.into(), offset: e.utf8_error().valid_up_to() })?;
    Ok(Source { info, text })
}

/// Splits a file's text into documents: the whole file for char; for gpt2, the pieces between
/// literal `"<|endoftext|>"` markers. Empty documents are skipped for both kinds.
fn documents(text: &str, kind: TokenizerKind) -> Vec<&str> {
    let docs: Vec<&str> = match kind {
        TokenizerKind::Char => vec![text],
        TokenizerKind::Gpt2 => text.split(EOS_TEXT).collect(),
    };
    docs.into_iter().filter(|d| !d.is_empty()).collect()
}

/// Tokenizes the corpus once and writes `out/train.bin`, `out/val.bin` and `out/meta.json`.
///
/// Documents = input files; for gpt2 a file's text is further split on the literal
/// `"<|endoftext|>"` (each piece a document). Empty documents (an empty file, or an empty piece)
/// are skipped. Each document is encoded and FOLLOWED by the EOS id, so #EOS = #documents and
/// total tokens N = sum(doc lengths) + #documents. The concatenated stream is split by token
/// position: `n_train = floor(N * (1 - val_fraction))`; train = `[..n_train]`, val = `[n_train..]`.
/// Token files are flat little-endian u16 if `vocab_size <= 65536`, else u32.
///
/// All inputs are read and checked before anything is written. The three files are written as
/// temp files in `out` first, then an old meta.json is removed and they are renamed into place,
/// meta.json last, so `out` never holds a meta.json that disagrees with its bin files.
///
/// Errors: [`DataError::NoInputs`], [`DataError::InvalidValFraction`] (not in [0, 1)),
/// [`DataError::Io`] (unreadable input, naming it; or output not writable),
/// [`DataError::InvalidUtf8`] (naming the file and byte offset), [`DataError::EmptyCorpus`].
pub fn prepare(opts: &PrepareOptions) -> Result<PrepareSummary, DataError> {
    if opts.inputs.is_empty() {
        return Err(DataError::NoInputs);
    }
    let vf = opts.val_fraction;
    if !(0.0..1.0).contains(&vf) {
        return Err(DataError::InvalidValFraction { value: vf });
    }
    let sources = opts.inputs.iter().map(|p| read_source(p)).collect::<Result<Vec<_>, _>>()?;
    let docs: Vec<&str> = sources.iter().flat_map(|s| documents(&s.text, opts.tokenizer)).collect();
    if docs.is_empty() {
        return Err(DataError::EmptyCorpus { inputs: opts.inputs.clone() });
    }
    let tokenizer = match opts.tokenizer {
        TokenizerKind::Char => Tokenizer::fit_char(docs.iter().copied()),
        TokenizerKind::Gpt2 => Tokenizer::gpt2(),
    };
    let eos = tokenizer.eos_id();
    let mut tokens: Vec<u32> = Vec::new();
    for doc in &docs {
        // Cannot fail: the char vocabulary was fitted on these very documents.
        tokens.extend(tokenizer.encode(doc)?);
        tokens.push(eos);
    }

    let n = tokens.len();
    let n_train = ((n as f64) * (1.0 - vf)).floor() as usize;
    let vocab_size = tokenizer.vocab_size();
    let dtype = TokenDtype::for_vocab(vocab_size);
    let meta = Meta {
        format_version: FORMAT_VERSION,
        tokenizer: tokenizer.spec(),
        vocab_size,
        eos_id: eos,
        dtype,
        train_tokens: n_train as u64,
        val_tokens: (n - n_train) as u64,
        documents: docs.len() as u64,
        val_fraction: vf,
        sources: sources.into_iter().map(|s| s.info).collect(),
    };
    write_outputs(&opts.out, &tokens[..n_train], &tokens[n_train..], &meta)?;
    Ok(PrepareSummary { meta, out: opts.out.clone() })
}

fn write_outputs(out: &Path, train: &[u32], val: &[u32], meta: &Meta) -> Result<(), DataError> {
    std::fs::create_dir_all(out).map_err(|e| DataError::io("cannot create output directory", out, e))?;
    let (train_path, val_path, meta_path) = (out.join(TRAIN_FILE), out.join(VAL_FILE), out.join(META_FILE));
    let train_tmp = stage(&train_path, |w| w.write_all(&encode_tokens(train, meta.dtype)))?;
    let val_tmp = stage(&val_path, |w| w.write_all(&encode_tokens(val, meta.dtype)))?;
    let meta_tmp = stage(&meta_path, |w| w.write_all(meta.to_json().as_bytes()))?;
    match std::fs::remove_file(&meta_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(DataError::io("cannot remove old", &meta_path, e)),
    }
    train_tmp.commit()?;
    val_tmp.commit()?;
    meta_tmp.commit()
}

#[cfg(test)]
mod tests;
