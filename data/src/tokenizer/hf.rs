//! Hugging Face `tokenizer.json` files (the `tokenizers` crate).

use std::path::Path;

use tokenizers::PostProcessorWrapper;

use crate::DataError;

/// EOS candidates tried in order when no `--eos-token` is given.
pub const HF_EOS_CANDIDATES: [&str; 4] = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"];

/// A token's byte span `[start, end)` in the encoded text.
pub(crate) type Span = (usize, usize);

/// A loaded `tokenizer.json` with the facts Ember records about it.
pub(crate) struct HfTokenizer {
    /// The library's tokenizer, set up for Ember: special-token text is encoded as ordinary
    /// text and no post-processor runs (see [`HfTokenizer::from_bytes`]).
    pub tk: tokenizers::Tokenizer,
    /// SHA-256 of the file's bytes (lowercase hex).
    pub sha256: String,
    /// The file's bytes, for copying it into a prepared directory.
    pub bytes: Vec<u8>,
    /// The EOS token's text.
    pub eos_token: String,
    /// Its id.
    pub eos_id: u32,
    /// Largest id of the vocabulary (added tokens included) + 1.
    pub vocab_size: usize,
}

impl HfTokenizer {
    /// Reads and parses `path`; see [`HfTokenizer::from_bytes`].
    pub fn load(path: &Path, eos_token: Option<&str>) -> Result<HfTokenizer, DataError> {
        let bytes = std::fs::read(path).map_err(|e| DataError::io("cannot read tokenizer file", path, e))?;
        Self::from_bytes(bytes, eos_token, &path.display().to_string())
    }

    /// Parses a `tokenizer.json`'s bytes (`name` is used in errors).
    ///
    /// Ember encodes with `add_special_tokens = false` (it appends the EOS itself), treats the
    /// text of special tokens in the corpus as ordinary text (so a document can never contain
    /// an EOS id), and drops the post-processor: with no special tokens added it only trims
    /// offsets, which would misplace the SFT prompt boundary for whitespace tokens.
    ///
    /// EOS: `eos_token` if given, else the first of [`HF_EOS_CANDIDATES`] in the vocabulary.
    /// Errors: [`DataError::HfTokenizer`] if the file does not parse;
    /// [`DataError::InvalidTokenizerSpec`] if the EOS token is not in the vocabulary (or no
    /// candidate is), naming the file and the tokens tried.
    pub fn from_bytes(bytes: Vec<u8>, eos_token: Option<&str>, name: &str) -> Result<HfTokenizer, DataError> {
        let mut tk = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| DataError::HfTokenizer {
            context: format!("file {name} does not parse"),
            reason: e.to_string(),
        })?;
        tk.set_encode_special_tokens(true);
        tk.with_post_processor(None::<PostProcessorWrapper>);
        let (eos_token, eos_id) = match eos_token {
            Some(t) => match tk.token_to_id(t) {
                Some(id) => (t.to_string(), id),
                None => {
                    return Err(DataError::InvalidTokenizerSpec {
                        reason: format!("--eos-token {t:?} is not in the vocabulary of {name}"),
                    })
                }
            },
            None => HF_EOS_CANDIDATES
                .iter()
                .find_map(|t| tk.token_to_id(t).map(|id| (t.to_string(), id)))
                .ok_or_else(|| DataError::InvalidTokenizerSpec {
                    reason: format!(
                        "{name} has none of the end-of-text tokens {HF_EOS_CANDIDATES:?}; pass --eos-token TOKEN"
                    ),
                })?,
        };
        let vocab_size = tk.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1);
        let sha256 = crate::sha256_hex(&bytes);
        Ok(HfTokenizer { tk, sha256, bytes, eos_token, eos_id, vocab_size })
    }

    /// True if `id` names a token of the vocabulary.
    pub fn knows(&self, id: u32) -> bool {
        (id as usize) < self.vocab_size && self.tk.id_to_token(id).is_some()
    }

    /// Token ids and each token's byte span `[start, end)` in `text`.
    ///
    /// Errors: [`DataError::HfTokenizer`] if the library fails.
    pub fn encode_spans(&self, text: &str) -> Result<(Vec<u32>, Vec<Span>), DataError> {
        let enc = self.tk.encode(text, false).map_err(|e| DataError::HfTokenizer {
            context: "encoding failed".into(),
            reason: e.to_string(),
        })?;
        Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
    }

    /// Token ids of `text`.
    ///
    /// Errors: [`DataError::HfTokenizer`] if the library fails.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        let enc = self.tk.encode_fast(text, false).map_err(|e| DataError::HfTokenizer {
            context: "encoding failed".into(),
            reason: e.to_string(),
        })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes known ids (special tokens included) to text.
    ///
    /// Errors: [`DataError::HfTokenizer`] if the library fails.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        self.tk
            .decode(ids, false)
            .map_err(|e| DataError::HfTokenizer { context: "decoding failed".into(), reason: e.to_string() })
    }
}
