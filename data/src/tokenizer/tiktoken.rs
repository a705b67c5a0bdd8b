//! OpenAI's BPE encodings, bundled by tiktoken-rs (fully offline): r50k_base (GPT-2),
//! cl100k_base and o200k_base.

use tiktoken_rs::CoreBPE;

/// One tiktoken encoding and the facts about its id space that tiktoken-rs does not expose.
#[derive(Debug)]
pub(crate) struct Encoding {
    /// tiktoken's name, e.g. "r50k_base".
    pub name: &'static str,
    /// The shared, lazily built BPE tables.
    pub bpe: fn() -> &'static CoreBPE,
    /// Mergeable (byte-sequence) tokens have ids `0..ranks`.
    pub ranks: u32,
    /// Special tokens (id, text); the first is `<|endoftext|>`, the EOS.
    pub specials: &'static [(u32, &'static str)],
    /// tiktoken's `n_vocab`: the largest id + 1 (ids between `ranks` and it that are not
    /// special are unused).
    pub vocab_size: usize,
}

/// GPT-2's `r50k_base`: 50,256 BPE tokens + `<|endoftext|>` = 50256.
pub(crate) static R50K: Encoding = Encoding {
    name: "r50k_base",
    bpe: tiktoken_rs::r50k_base_singleton,
    ranks: 50256,
    specials: &[(50256, "<|endoftext|>")],
    vocab_size: 50257,
};

/// `cl100k_base` (GPT-3.5/4): 100,256 BPE tokens; `<|endoftext|>` = 100257; ids
/// 100261..=100275 are unused; n_vocab 100277.
pub(crate) static CL100K: Encoding = Encoding {
    name: "cl100k_base",
    bpe: tiktoken_rs::cl100k_base_singleton,
    ranks: 100256,
    specials: &[
        (100257, "<|endoftext|>"),
        (100258, "<|fim_prefix|>"),
        (100259, "<|fim_middle|>"),
        (100260, "<|fim_suffix|>"),
        (100276, "<|endofprompt|>"),
    ],
    vocab_size: 100277,
};

/// `o200k_base` (GPT-4o): 199,998 BPE tokens; `<|endoftext|>` = 199999; ids 199998 and
/// 200000..=200017 are unused; n_vocab 200019.
pub(crate) static O200K: Encoding = Encoding {
    name: "o200k_base",
    bpe: tiktoken_rs::o200k_base_singleton,
    ranks: 199998,
    specials: &[(199999, "<|endoftext|>"), (200018, "<|endofprompt|>")],
    vocab_size: 200019,
};

impl Encoding {
    /// The `<|endoftext|>` id.
    pub fn eos_id(&self) -> u32 {
        self.specials[0].0
    }

    /// True if `id` is a BPE token or a special token of this encoding.
    pub fn knows(&self, id: u32) -> bool {
        id < self.ranks || self.specials.iter().any(|&(s, _)| s == id)
    }

    /// Encodes ordinary text (special-token text is encoded as plain text).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        (self.bpe)().encode_ordinary(text)
    }

    /// The bytes of a known id (the caller checked [`Encoding::knows`]).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        // `_decode_native_and_split` indexes a map and would panic on an unused id: `knows`
        // was checked first.
        (self.bpe)()._decode_native_and_split(vec![id]).next().unwrap_or_default()
    }

    /// Bytes of known ids, concatenated.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        (self.bpe)()._decode_native_and_split(ids.to_vec()).flatten().collect()
    }
}
