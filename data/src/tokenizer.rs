//! Tokenizers: a fitted character vocabulary, or GPT-2's BPE (tiktoken's `r50k_base`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tiktoken_rs::CoreBPE;

use crate::DataError;

/// The text that the EOS id decodes to, for both tokenizer kinds.
pub const EOS_TEXT: &str = "<|endoftext|>";

/// GPT-2's end-of-text id (the last id of `r50k_base`).
pub const GPT2_EOS_ID: u32 = 50256;

/// GPT-2's vocabulary size (50256 BPE tokens + EOS).
pub const GPT2_VOCAB_SIZE: usize = 50257;

/// Which tokenizer, as stored in meta.json and in run dirs
/// (serde, internally tagged `"kind"`: `"char"` | `"gpt2"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TokenizerSpec {
    /// Character-level: `chars[i]` has id `i`; EOS is id `chars.len()`.
    /// `chars` must be sorted and distinct.
    Char {
        /// The vocabulary, sorted and distinct.
        chars: Vec<char>,
    },
    /// GPT-2 BPE (`r50k_base`), EOS = 50256.
    Gpt2,
}

/// The tokenizer kind chosen on the command line: `"char"` or `"gpt2"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// Character-level, vocabulary fitted on the corpus.
    Char,
    /// GPT-2 BPE.
    Gpt2,
}

impl FromStr for TokenizerKind {
    type Err = DataError;

    /// Parses `"char"` or `"gpt2"` (exactly; lowercase).
    /// Errors: [`DataError::UnknownTokenizerKind`] for anything else.
    fn from_str(s: &str) -> Result<Self, DataError> {
        match s {
            "char" => Ok(TokenizerKind::Char),
            "gpt2" => Ok(TokenizerKind::Gpt2),
            _ => Err(DataError::UnknownTokenizerKind { given: s.to_string() }),
        }
    }
}

impl fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TokenizerKind::Char => "char",
            TokenizerKind::Gpt2 => "gpt2",
        })
    }
}

#[derive(Clone)]
enum Inner {
    /// Sorted, distinct vocabulary; id = index, EOS = len.
    Char(Vec<char>),
    Gpt2(&'static CoreBPE),
}

/// A ready-to-use tokenizer (char or GPT-2). Cheap to clone for GPT-2 (shared tables).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Inner,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Char(chars) => f.debug_struct("Tokenizer::Char").field("chars", chars).finish(),
            Inner::Gpt2(_) => f.write_str("Tokenizer::Gpt2"),
        }
    }
}

impl Tokenizer {
    /// Rebuilds a tokenizer from its stored spec.
    ///
    /// Errors: [`DataError::InvalidTokenizerSpec`] if a char list is not sorted and distinct
    /// (ids would be ambiguous), or holds more chars than a `u32` id can number.
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Tokenizer, DataError> {
        match spec {
            TokenizerSpec::Gpt2 => Ok(Tokenizer::gpt2()),
            TokenizerSpec::Char { chars } => {
                if let Some(w) = chars.windows(2).find(|w| w[0] >= w[1]) {
                    return Err(DataError::InvalidTokenizerSpec {
                        reason: format!(
                            "char vocabulary must be sorted and distinct, but {:?} comes before {:?}",
                            w[0], w[1]
                        ),
                    });
                }
                if u32::try_from(chars.len()).is_err() {
                    return Err(DataError::InvalidTokenizerSpec {
                        reason: format!("char vocabulary has {} chars, more than u32 ids allow", chars.len()),
                    });
                }
                Ok(Tokenizer { inner: Inner::Char(chars.clone()) })
            }
        }
    }

    /// Fits a char tokenizer: vocabulary = sorted distinct chars of all `texts`, then EOS as
    /// the last id (= number of distinct chars).
    pub fn fit_char<'a>(texts: impl IntoIterator<Item = &'a str>) -> Tokenizer {
        let set: std::collections::BTreeSet<char> = texts.into_iter().flat_map(str::chars).collect();
        Tokenizer { inner: Inner::Char(set.into_iter().collect()) }
    }

    /// GPT-2's tokenizer (tiktoken `r50k_base`, bundled offline): EOS = 50256, vocab size 50257.
    pub fn gpt2() -> Tokenizer {
        Tokenizer { inner: Inner::Gpt2(tiktoken_rs::r50k_base_singleton()) }
    }

    /// The spec to store in meta.json / run dirs; `from_spec(&t.spec())` rebuilds `t`.
    pub fn spec(&self) -> TokenizerSpec {
        match &self.inner {
            Inner::Char(chars) => TokenizerSpec::Char { chars: chars.clone() },
            Inner::Gpt2(_) => TokenizerSpec::Gpt2,
        }
    }

    /// Number of ids, EOS included (char: distinct chars + 1; GPT-2: 50257).
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Char(chars) => chars.len() + 1,
            Inner::Gpt2(_) => GPT2_VOCAB_SIZE,
        }
    }

    /// The end-of-text id (char: number of distinct chars; GPT-2: 50256).
    pub fn eos_id(&self) -> u32 {
        match &self.inner {
            // from_spec checked that the length fits in u32; fit_char's chars are distinct
            // Unicode scalars (< 2^21), so the cast is lossless.
            Inner::Char(chars) => chars.len() as u32,
            Inner::Gpt2(_) => GPT2_EOS_ID,
        }
    }

    /// Encodes ordinary text: special tokens such as `"<|endoftext|>"` are NOT parsed (they are
    /// encoded as plain text). Never emits the EOS id.
    ///
    /// Errors (char only): [`DataError::UnknownChar`] naming the char and its char position.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match &self.inner {
            Inner::Gpt2(bpe) => Ok(bpe.encode_ordinary(text)),
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
        }
    }

    /// Decodes ids to text; EOS decodes to `"<|endoftext|>"` for both kinds. For GPT-2, byte
    /// sequences that are not valid UTF-8 (e.g. a multi-byte char cut between tokens) become
    /// U+FFFD, so partial generations always decode.
    ///
    /// Errors: [`DataError::TokenOutOfRange`] for an id >= `vocab_size()`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        let vocab_size = self.vocab_size();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(DataError::TokenOutOfRange { id, vocab_size });
        }
        match &self.inner {
            Inner::Char(chars) => Ok(ids
                .iter()
                .map(|&id| chars.get(id as usize).map_or(EOS_TEXT.to_string(), char::to_string))
                .collect()),
            Inner::Gpt2(bpe) => {
                // All ids are < 50257, so each is a BPE token or the EOS special token.
                let bytes: Vec<u8> = bpe._decode_native_and_split(ids.to_vec()).flatten().collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_fit_encode_decode() {
        let t = Tokenizer::fit_char(["hello"]);
        assert_eq!(t.spec(), TokenizerSpec::Char { chars: vec!['e', 'h', 'l', 'o'] });
        assert_eq!(t.vocab_size(), 5);
        assert_eq!(t.eos_id(), 4);
        assert_eq!(t.encode("hole").unwrap(), vec![1, 3, 2, 0]);
        assert_eq!(t.decode(&[1, 3, 2, 0]).unwrap(), "hole");
        assert_eq!(t.decode(&[1, 0, 4]).unwrap(), "he<|endoftext|>");
    }

    #[test]
    fn char_fit_over_several_texts() {
        let t = Tokenizer::fit_char(["ba", "ca"]);
        assert_eq!(t.spec(), TokenizerSpec::Char { chars: vec!['a', 'b', 'c'] });
        assert_eq!(t.encode("cab").unwrap(), vec![2, 0, 1]);
    }

    #[test]
    fn char_unknown_char_is_named() {
        let t = Tokenizer::fit_char(["hello"]);
        let err = t.encode("hez").unwrap_err();
        assert!(matches!(err, DataError::UnknownChar { ch: 'z', position: 2, .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("'z'") && msg.contains("position 2"), "{msg}");
    }

    #[test]
    fn char_decode_out_of_range() {
        let t = Tokenizer::fit_char(["hello"]);
        let err = t.decode(&[0, 5]).unwrap_err();
        assert!(matches!(err, DataError::TokenOutOfRange { id: 5, vocab_size: 5 }), "{err:?}");
    }

    #[test]
    fn char_spec_roundtrip_and_validation() {
        let t = Tokenizer::fit_char(["hello"]);
        let back = Tokenizer::from_spec(&t.spec()).unwrap();
        assert_eq!(back.spec(), t.spec());
        let bad = TokenizerSpec::Char { chars: vec!['b', 'a'] };
        assert!(matches!(Tokenizer::from_spec(&bad), Err(DataError::InvalidTokenizerSpec { .. })));
        let dup = TokenizerSpec::Char { chars: vec!['a', 'a'] };
        assert!(matches!(Tokenizer::from_spec(&dup), Err(DataError::InvalidTokenizerSpec { .. })));
    }

    #[test]
    fn spec_serde_is_tagged() {
        let json = serde_json::to_string(&TokenizerSpec::Char { chars: vec!['a', 'b'] }).unwrap();
        assert_eq!(json, r#"{"kind":"char","chars":["a","b"]}"#);
        assert_eq!(serde_json::to_string(&TokenizerSpec::Gpt2).unwrap(), r#"{"kind":"gpt2"}"#);
        let back: TokenizerSpec = serde_json::from_str(r#"{"kind":"gpt2"}"#).unwrap();
        assert_eq!(back, TokenizerSpec::Gpt2);
    }

    #[test]
    fn gpt2_known_ids() {
        let t = Tokenizer::gpt2();
        assert_eq!(t.encode("Hello world").unwrap(), vec![15496, 995]);
        assert_eq!(t.eos_id(), 50256);
        assert_eq!(t.vocab_size(), 50257);
        assert_eq!(t.decode(&[15496, 995, 50256]).unwrap(), "Hello world<|endoftext|>");
        // Special tokens are not parsed by encode: the literal is ordinary text.
        assert!(!t.encode("<|endoftext|>").unwrap().contains(&50256));
        assert!(matches!(
            t.decode(&[50257]),
            Err(DataError::TokenOutOfRange { id: 50257, vocab_size: 50257 })
        ));
        assert_eq!(Tokenizer::from_spec(&TokenizerSpec::Gpt2).unwrap().spec(), TokenizerSpec::Gpt2);
    }

    #[test]
    fn gpt2_decode_of_a_split_multibyte_char_is_lossy_not_an_error() {
        let t = Tokenizer::gpt2();
        // "🙂" is 4 UTF-8 bytes (F0 9F 99 82), split by r50k_base over two byte-level tokens.
        let ids = t.encode("🙂").unwrap();
        assert_eq!(ids, vec![8582, 25081]);
        assert_eq!(t.decode(&ids).unwrap(), "🙂");
        // The first token alone is an incomplete UTF-8 sequence: decodes to U+FFFD, not an error.
        assert_eq!(t.decode(&ids[..1]).unwrap(), "\u{FFFD}");
    }

    #[test]
    fn kind_parse_and_display() {
        assert_eq!("char".parse::<TokenizerKind>().unwrap(), TokenizerKind::Char);
        assert_eq!("gpt2".parse::<TokenizerKind>().unwrap(), TokenizerKind::Gpt2);
        assert_eq!(TokenizerKind::Gpt2.to_string(), "gpt2");
        assert_eq!(TokenizerKind::Char.to_string(), "char");
        let err = "bpe".parse::<TokenizerKind>().unwrap_err();
        assert!(err.to_string().contains("\"bpe\""), "{err}");
    }
}
