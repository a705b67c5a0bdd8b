//! Tokenizers: fitted characters, raw bytes, OpenAI's BPE encodings (tiktoken-rs, offline) and
//! any Hugging Face `tokenizer.json`.

mod hf;
mod spec;
mod tiktoken;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

pub use hf::HF_EOS_CANDIDATES;
pub use spec::{TokenizerKind, TokenizerSpec, HF_TOKENIZER_FILE};

use crate::DataError;
use hf::HfTokenizer;
use tiktoken::Encoding;

/// The text that the EOS id of the char and byte tokenizers decodes to (and the EOS of the
/// tiktoken encodings).
pub const EOS_TEXT: &str = "<|endoftext|>";

/// GPT-2's end-of-text id (the last id of `r50k_base`).
pub const GPT2_EOS_ID: u32 = 50256;

/// GPT-2's vocabulary size (50256 BPE tokens + EOS).
pub const GPT2_VOCAB_SIZE: usize = 50257;

#[derive(Clone)]
enum Inner {
    /// Sorted, distinct vocabulary; id = index, EOS = len.
    Char(Arc<Vec<char>>),
    /// Ids 0..=255 are bytes, 256 is EOS.
    Byte,
    Tiktoken(&'static Encoding),
    Hf(Arc<HfTokenizer>),
}

/// A ready-to-use tokenizer. Cheap to clone (tables are shared); `Send + Sync`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Inner,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Char(chars) => f.debug_struct("Tokenizer::Char").field("chars", chars).finish(),
            Inner::Byte => f.write_str("Tokenizer::Byte"),
            Inner::Tiktoken(e) => write!(f, "Tokenizer::Tiktoken({})", e.name),
            Inner::Hf(h) => write!(f, "Tokenizer::Hf(sha256 {}, eos {:?})", h.sha256, h.eos_token),
        }
    }
}

impl Tokenizer {
    /// Rebuilds a self-contained tokenizer (char, byte, gpt2, cl100k, o200k) from its spec.
    ///
    /// Errors: [`DataError::InvalidTokenizerSpec`] if a char list is not sorted and distinct,
    /// or for an `hf` spec, whose vocabulary lives in a file: use [`Tokenizer::from_spec_in`].
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Tokenizer, DataError> {
        let inner = match spec {
            TokenizerSpec::Char { chars } => {
                if let Some(w) = chars.windows(2).find(|w| w[0] >= w[1]) {
                    return Err(DataError::InvalidTokenizerSpec {
                        reason: format!(
                            "char vocabulary must be sorted and distinct, but {:?} comes before {:?}",
                            w[0], w[1]
                        ),
                    });
                }
                Inner::Char(Arc::new(chars.clone()))
            }
            TokenizerSpec::Byte => Inner::Byte,
            TokenizerSpec::Gpt2 => Inner::Tiktoken(&tiktoken::R50K),
            TokenizerSpec::Cl100k => Inner::Tiktoken(&tiktoken::CL100K),
            TokenizerSpec::O200k => Inner::Tiktoken(&tiktoken::O200K),
            TokenizerSpec::Hf { file, .. } => {
                return Err(DataError::InvalidTokenizerSpec {
                    reason: format!(
                        "an hf tokenizer needs its {file}: load it with Tokenizer::from_spec_in(spec, dir) \
                         from the directory that holds it (the prepared data directory)"
                    ),
                })
            }
        };
        Ok(Tokenizer { inner })
    }

    /// Rebuilds any tokenizer from its spec; an `hf` spec's file is read from `dir` (a prepared
    /// data directory, or a run directory holding a copy) and must match the spec exactly.
    ///
    /// Errors: those of [`Tokenizer::from_spec`]; for `hf`: [`DataError::Io`] if `dir/file`
    /// cannot be read, [`DataError::FileChecksum`] if its SHA-256 differs from the spec's,
    /// [`DataError::InconsistentMeta`] if its EOS id or vocabulary size differ.
    pub fn from_spec_in(spec: &TokenizerSpec, dir: &Path) -> Result<Tokenizer, DataError> {
        let TokenizerSpec::Hf { file, sha256, eos_token, eos_id, vocab_size } = spec else {
            return Tokenizer::from_spec(spec);
        };
        let path = dir.join(file);
        let bytes =
            std::fs::read(&path).map_err(|e| DataError::io("cannot read tokenizer file", &path, e))?;
        let actual = crate::sha256_hex(&bytes);
        if &actual != sha256 {
            return Err(DataError::FileChecksum { path, expected: sha256.clone(), actual });
        }
        let hf = HfTokenizer::from_bytes(bytes, Some(eos_token), &path.display().to_string())?;
        if hf.eos_id != *eos_id || hf.vocab_size != *vocab_size {
            return Err(DataError::InconsistentMeta {
                path,
                reason: format!(
                    "the spec records eos_id {eos_id} and vocab_size {vocab_size}, the file gives {} and {}",
                    hf.eos_id, hf.vocab_size
                ),
            });
        }
        Ok(Tokenizer { inner: Inner::Hf(Arc::new(hf)) })
    }

    /// Fits a char tokenizer: vocabulary = sorted distinct chars of all `texts`, then EOS as
    /// the last id (= number of distinct chars).
    pub fn fit_char<'a>(texts: impl IntoIterator<Item = &'a str>) -> Tokenizer {
        let set: std::collections::BTreeSet<char> = texts.into_iter().flat_map(str::chars).collect();
        Tokenizer { inner: Inner::Char(Arc::new(set.into_iter().collect())) }
    }

    /// The byte tokenizer: ids 0..=255 are the UTF-8 bytes of the text, EOS = 256, vocab 257.
    pub fn byte() -> Tokenizer {
        Tokenizer { inner: Inner::Byte }
    }

    /// GPT-2's tokenizer (tiktoken `r50k_base`, bundled offline): EOS = 50256, vocab size 50257.
    pub fn gpt2() -> Tokenizer {
        Tokenizer { inner: Inner::Tiktoken(&tiktoken::R50K) }
    }

    /// tiktoken `cl100k_base`: EOS `<|endoftext|>` = 100257, vocab size 100277.
    pub fn cl100k() -> Tokenizer {
        Tokenizer { inner: Inner::Tiktoken(&tiktoken::CL100K) }
    }

    /// tiktoken `o200k_base`: EOS `<|endoftext|>` = 199999, vocab size 200019.
    pub fn o200k() -> Tokenizer {
        Tokenizer { inner: Inner::Tiktoken(&tiktoken::O200K) }
    }

    /// A Hugging Face tokenizer from a `tokenizer.json`. EOS: `eos_token`, else the first of
    /// [`HF_EOS_CANDIDATES`] in its vocabulary. Encoding never adds special tokens (no BOS)
    /// and treats special-token text in the input as ordinary text.
    ///
    /// Errors: [`DataError::Io`] (unreadable file), [`DataError::HfTokenizer`] (does not
    /// parse), [`DataError::InvalidTokenizerSpec`] (no EOS token found).
    pub fn from_hf_file(path: &Path, eos_token: Option<&str>) -> Result<Tokenizer, DataError> {
        Ok(Tokenizer { inner: Inner::Hf(Arc::new(HfTokenizer::load(path, eos_token)?)) })
    }

    /// The bytes of the `tokenizer.json` an hf tokenizer was loaded from (`None` for others).
    pub fn hf_file_bytes(&self) -> Option<&[u8]> {
        match &self.inner {
            Inner::Hf(h) => Some(&h.bytes),
            _ => None,
        }
    }

    /// The spec to store in meta.json / run dirs; `from_spec_in(&t.spec(), dir)` rebuilds `t`
    /// (for hf, with the file saved as `dir/tokenizer.json`).
    pub fn spec(&self) -> TokenizerSpec {
        match &self.inner {
            Inner::Char(chars) => TokenizerSpec::Char { chars: chars.to_vec() },
            Inner::Byte => TokenizerSpec::Byte,
            Inner::Tiktoken(e) if std::ptr::eq(*e, &tiktoken::R50K) => TokenizerSpec::Gpt2,
            Inner::Tiktoken(e) if std::ptr::eq(*e, &tiktoken::CL100K) => TokenizerSpec::Cl100k,
            Inner::Tiktoken(_) => TokenizerSpec::O200k,
            Inner::Hf(h) => TokenizerSpec::Hf {
                file: HF_TOKENIZER_FILE.into(),
                sha256: h.sha256.clone(),
                eos_token: h.eos_token.clone(),
                eos_id: h.eos_id,
                vocab_size: h.vocab_size,
            },
        }
    }

    /// Number of ids, EOS included: the largest id + 1 (char: distinct chars + 1; byte: 257;
    /// gpt2: 50257; cl100k: 100277; o200k: 200019; hf: from the file).
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Char(chars) => chars.len() + 1,
            Inner::Byte => 257,
            Inner::Tiktoken(e) => e.vocab_size,
            Inner::Hf(h) => h.vocab_size,
        }
    }

    /// The end-of-text id, appended after every document.
    pub fn eos_id(&self) -> u32 {
        match &self.inner {
            // Distinct Unicode scalars number < 2^21, so the cast is lossless.
            Inner::Char(chars) => chars.len() as u32,
            Inner::Byte => 256,
            Inner::Tiktoken(e) => e.eos_id(),
            Inner::Hf(h) => h.eos_id,
        }
    }

    /// True if encoding is additive across a split just after a `'\n'` that follows a
    /// non-whitespace char and precedes one: `encode(a + b) == encode(a) ++ encode(b)`. Holds
    /// for char and byte trivially and for the tiktoken encodings, whose pre-tokenizer regexes
    /// never match across such a point (tested); not assumed for arbitrary hf files.
    pub(crate) fn splits_at_lines(&self) -> bool {
        !matches!(self.inner, Inner::Hf(_))
    }

    /// Encodes ordinary text: special tokens such as `"<|endoftext|>"` are NOT parsed (they are
    /// encoded as plain text), so the result never holds the EOS id (except for an hf file
    /// whose EOS is an ordinary token of its vocabulary).
    ///
    /// Errors: [`DataError::UnknownChar`] (char: names the char and its char position);
    /// [`DataError::HfTokenizer`] if the hf library fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match &self.inner {
            Inner::Char(chars) => text
                .chars()
                .enumerate()
                .map(|(position, ch)| {
                    chars.binary_search(&ch).map(|i| i as u32).map_err(|_| DataError::UnknownChar {
                        ch,
                        code: ch as u32,
                        position,
                    })
                })
                .collect(),
            Inner::Byte => Ok(text.bytes().map(u32::from).collect()),
            Inner::Tiktoken(e) => Ok(e.encode(text)),
            Inner::Hf(h) => h.encode(text),
        }
    }

    /// Encodes an SFT example jointly: `ids = encode(prompt + response)`, and the number of
    /// leading ids that belong to the prompt: the longest prefix of tokens whose bytes all lie
    /// within the prompt's bytes. A token that straddles the boundary (a BPE merge across it)
    /// counts as response. Spans come from the tokens' bytes (char, byte, tiktoken: their
    /// bytes concatenate to the text) or from the library's byte offsets (hf).
    ///
    /// Example (gpt2): prompt `"Hello wor"`, response `"ld"` → ids `[15496, 995]`
    /// ("Hello", " world"), prompt tokens 1.
    ///
    /// Errors: as [`Tokenizer::encode`].
    pub fn encode_prompt_response(
        &self,
        prompt: &str,
        response: &str,
    ) -> Result<(Vec<u32>, usize), DataError> {
        let text = format!("{prompt}{response}");
        let boundary = prompt.len();
        if let Inner::Hf(h) = &self.inner {
            let (ids, spans) = h.encode_spans(&text)?;
            let n = spans.iter().take_while(|&&(_, end)| end <= boundary).count();
            return Ok((ids, n));
        }
        let ids = self.encode(&text)?;
        let mut end = 0;
        let mut n = 0;
        for &id in &ids {
            end += self.token_len(id);
            if end > boundary {
                break;
            }
            n += 1;
        }
        Ok((ids, n))
    }

    /// Byte length of a known non-hf token (used for the SFT prompt boundary).
    fn token_len(&self, id: u32) -> usize {
        match &self.inner {
            Inner::Char(chars) => chars.get(id as usize).map_or(EOS_TEXT.len(), |c| c.len_utf8()),
            Inner::Byte => 1,
            Inner::Tiktoken(e) => e.token_bytes(id).len(),
            Inner::Hf(_) => 0,
        }
    }

    fn check_id(&self, id: u32) -> Result<(), DataError> {
        let known = match &self.inner {
            Inner::Char(_) | Inner::Byte => (id as usize) < self.vocab_size(),
            Inner::Tiktoken(e) => e.knows(id),
            Inner::Hf(h) => h.knows(id),
        };
        if known {
            Ok(())
        } else {
            Err(DataError::TokenOutOfRange { id, vocab_size: self.vocab_size() })
        }
    }

    /// The bytes token `id` stands for: char: its UTF-8; byte: the byte; tiktoken: its bytes
    /// (special tokens: their text); EOS of char and byte: `"<|endoftext|>"`. For hf, the text
    /// of the token decoded alone, so a byte-level token holding part of a multi-byte char
    /// gives U+FFFD's bytes.
    ///
    /// Errors: [`DataError::TokenOutOfRange`] for an id the vocabulary does not have.
    pub fn token_bytes(&self, id: u32) -> Result<Vec<u8>, DataError> {
        self.check_id(id)?;
        Ok(match &self.inner {
            Inner::Char(chars) => {
                chars.get(id as usize).map_or(EOS_TEXT.into(), |c| c.to_string().into_bytes())
            }
            Inner::Byte => match u8::try_from(id) {
                Ok(b) => vec![b],
                Err(_) => EOS_TEXT.as_bytes().to_vec(),
            },
            Inner::Tiktoken(e) => e.token_bytes(id),
            Inner::Hf(h) => h.decode(&[id])?.into_bytes(),
        })
    }

    /// Decodes ids to text; the EOS decodes to `"<|endoftext|>"` (hf: its token's text). Byte
    /// sequences that are not valid UTF-8 (e.g. a multi-byte char cut between tokens) become
    /// U+FFFD, so partial generations always decode.
    ///
    /// Errors: [`DataError::TokenOutOfRange`] for an id the vocabulary does not have.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        for &id in ids {
            self.check_id(id)?;
        }
        match &self.inner {
            Inner::Char(chars) => Ok(ids
                .iter()
                .map(|&id| chars.get(id as usize).map_or(EOS_TEXT.to_string(), char::to_string))
                .collect()),
            Inner::Byte => {
                let mut bytes = Vec::with_capacity(ids.len());
                for &id in ids {
                    match u8::try_from(id) {
                        Ok(b) => bytes.push(b),
                        Err(_) => bytes.extend_from_slice(EOS_TEXT.as_bytes()),
                    }
                }
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Inner::Tiktoken(e) => Ok(String::from_utf8_lossy(&e.decode_bytes(ids)).into_owned()),
            Inner::Hf(h) => h.decode(ids),
        }
    }
}

/// Loads a `tokenizer.json`'s bytes as Ember will (EOS from the candidates).
///
/// Errors: as [`Tokenizer::from_hf_file`].
pub(crate) fn check_hf_json(bytes: &[u8]) -> Result<Tokenizer, DataError> {
    let hf = HfTokenizer::from_bytes(bytes.to_vec(), None, "the trained tokenizer")?;
    Ok(Tokenizer { inner: Inner::Hf(Arc::new(hf)) })
}

#[cfg(test)]
mod tests;
