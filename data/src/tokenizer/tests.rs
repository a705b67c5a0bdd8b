use super::*;
use crate::inputs::reader::can_split;

#[test]
fn char_fit_encode_decode() {
    let t = Tokenizer::fit_char(["hello"]);
    assert_eq!(t.spec(), TokenizerSpec::Char { chars: vec!['e', 'h', 'l', 'o'] });
    assert_eq!(t.vocab_size(), 5);
    assert_eq!(t.eos_id(), 4);
    assert_eq!(t.encode("hole").unwrap(), vec![1, 3, 2, 0]);
    assert_eq!(t.decode(&[1, 3, 2, 0]).unwrap(), "hole");
    assert_eq!(t.decode(&[1, 0, 4]).unwrap(), "he<|endoftext|>");
    assert_eq!(t.token_bytes(4).unwrap(), b"<|endoftext|>");
}

#[test]
fn char_unknown_char_and_bad_ids_are_named() {
    let t = Tokenizer::fit_char(["hello"]);
    let err = t.encode("hez").unwrap_err();
    assert!(matches!(err, DataError::UnknownChar { ch: 'z', position: 2, .. }), "{err:?}");
    assert!(err.to_string().contains("'z'") && err.to_string().contains("position 2"), "{err}");
    let err = t.decode(&[0, 5]).unwrap_err();
    assert!(matches!(err, DataError::TokenOutOfRange { id: 5, vocab_size: 5 }), "{err:?}");
}

#[test]
fn char_spec_roundtrip_and_validation() {
    let t = Tokenizer::fit_char(["hello"]);
    assert_eq!(Tokenizer::from_spec(&t.spec()).unwrap().spec(), t.spec());
    for chars in [vec!['b', 'a'], vec!['a', 'a']] {
        let err = Tokenizer::from_spec(&TokenizerSpec::Char { chars }).unwrap_err();
        assert!(matches!(err, DataError::InvalidTokenizerSpec { .. }), "{err:?}");
    }
}

#[test]
fn byte_tokenizer() {
    let t = Tokenizer::byte();
    assert_eq!((t.vocab_size(), t.eos_id()), (257, 256));
    assert_eq!(t.encode("hé").unwrap(), vec![104, 0xC3, 0xA9]);
    assert_eq!(t.decode(&[104, 0xC3, 0xA9, 256]).unwrap(), "hé<|endoftext|>");
    assert_eq!(t.decode(&[0xC3]).unwrap(), "\u{FFFD}");
    assert_eq!(t.token_bytes(0xC3).unwrap(), vec![0xC3]);
    assert!(matches!(t.decode(&[257]), Err(DataError::TokenOutOfRange { id: 257, vocab_size: 257 })));
}

#[test]
fn spec_serde_is_tagged() {
    let json = serde_json::to_string(&TokenizerSpec::Char { chars: vec!['a', 'b'] }).unwrap();
    assert_eq!(json, r#"{"kind":"char","chars":["a","b"]}"#);
    for (spec, text) in [
        (TokenizerSpec::Byte, r#"{"kind":"byte"}"#),
        (TokenizerSpec::Gpt2, r#"{"kind":"gpt2"}"#),
        (TokenizerSpec::Cl100k, r#"{"kind":"cl100k"}"#),
        (TokenizerSpec::O200k, r#"{"kind":"o200k"}"#),
    ] {
        assert_eq!(serde_json::to_string(&spec).unwrap(), text);
        assert_eq!(serde_json::from_str::<TokenizerSpec>(text).unwrap(), spec);
        assert_eq!(Tokenizer::from_spec(&spec).unwrap().spec(), spec);
    }
}

#[test]
fn gpt2_known_ids() {
    let t = Tokenizer::gpt2();
    assert_eq!(t.encode("Hello world").unwrap(), vec![15496, 995]);
    assert_eq!((t.eos_id(), t.vocab_size()), (50256, 50257));
    assert_eq!(t.decode(&[15496, 995, 50256]).unwrap(), "Hello world<|endoftext|>");
    // Special tokens are not parsed by encode: the literal is ordinary text.
    assert!(!t.encode("<|endoftext|>").unwrap().contains(&50256));
    assert!(matches!(t.decode(&[50257]), Err(DataError::TokenOutOfRange { id: 50257, .. })));
    assert_eq!(t.token_bytes(995).unwrap(), b" world");
}

#[test]
fn gpt2_split_multibyte_char_decodes_lossy() {
    let t = Tokenizer::gpt2();
    // "🙂" is 4 UTF-8 bytes (F0 9F 99 82), split by r50k_base over two byte-level tokens.
    let ids = t.encode("🙂").unwrap();
    assert_eq!(ids, vec![8582, 25081]);
    assert_eq!(t.decode(&ids).unwrap(), "🙂");
    assert_eq!(t.decode(&ids[..1]).unwrap(), "\u{FFFD}");
    let bytes = [t.token_bytes(8582).unwrap(), t.token_bytes(25081).unwrap()].concat();
    assert_eq!(bytes, "🙂".as_bytes());
}

#[test]
fn cl100k_and_o200k_known_ids_and_unused_ids() {
    let t = Tokenizer::cl100k();
    assert_eq!(t.encode("Hello world").unwrap(), vec![9906, 1917]);
    assert_eq!((t.eos_id(), t.vocab_size()), (100257, 100277));
    assert_eq!(t.decode(&[9906, 100276]).unwrap(), "Hello<|endofprompt|>");
    assert!(matches!(t.decode(&[100261]), Err(DataError::TokenOutOfRange { id: 100261, .. })));
    let t = Tokenizer::o200k();
    assert_eq!(t.encode("Hello world").unwrap(), vec![13225, 2375]);
    assert_eq!((t.eos_id(), t.vocab_size()), (199999, 200019));
    assert_eq!(t.decode(&[199999]).unwrap(), "<|endoftext|>");
    assert!(t.token_bytes(199998).is_err());
    assert!(t.decode(&[200005]).is_err());
}

#[test]
fn prompt_boundary_counts_a_straddling_token_as_response() {
    let t = Tokenizer::gpt2();
    // " world" straddles "Hello wor" | "ld": only "Hello" is prompt.
    assert_eq!(t.encode_prompt_response("Hello wor", "ld").unwrap(), (vec![15496, 995], 1));
    // "Hello " | "world": the space is in the prompt, but the token " world" is not wholly.
    assert_eq!(t.encode_prompt_response("Hello ", "world").unwrap(), (vec![15496, 995], 1));
    assert_eq!(t.encode_prompt_response("Hello world", "!").unwrap(), (vec![15496, 995, 0], 2));
    assert_eq!(t.encode_prompt_response("", "Hello").unwrap(), (vec![15496], 0));
    let c = Tokenizer::fit_char(["abc"]);
    assert_eq!(c.encode_prompt_response("ab", "ca").unwrap(), (vec![0, 1, 2, 0], 2));
}

#[test]
fn kind_parse_and_display() {
    for name in ["char", "byte", "gpt2", "cl100k", "o200k", "hf"] {
        assert_eq!(name.parse::<TokenizerKind>().unwrap().to_string(), name);
    }
    let err = "bpe".parse::<TokenizerKind>().unwrap_err();
    assert!(err.to_string().contains("\"bpe\"") && err.to_string().contains("o200k"), "{err}");
}

/// Texts whose lines mix the cases that make pre-tokenizer regexes differ at a text's end:
/// trailing spaces, "\r\n", blank lines, indentation, digits, punctuation, contractions,
/// non-ASCII letters and marks. Deterministic (a small LCG).
fn tricky_texts() -> Vec<String> {
    let lines = [
        "Hello world\n",
        "  indented line\n",
        "trailing spaces  \n",
        "crlf line\r\n",
        "\n",
        " \n",
        "\t\ttab\n",
        "123456 7890\n",
        "!!! ???\n",
        "don't we'll\n",
        "'s 're\n",
        "café ÄÖÜ\n",
        "中文字符\n",
        "😀 emoji\n",
        "x\n",
        "a.b,c\n",
        "MixedCASE words\n",
        "e\u{301}\n",
        "end",
        " start with space\n",
        "...\n",
    ];
    let mut state: u64 = 12345;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    (0..150).map(|_| (0..8).map(|_| lines[next() % lines.len()]).collect()).collect()
}

#[test]
fn line_splits_are_additive() {
    for tok in [Tokenizer::gpt2(), Tokenizer::cl100k(), Tokenizer::o200k(), Tokenizer::byte()] {
        for text in tricky_texts() {
            let whole = tok.encode(&text).unwrap();
            for (p, _) in text.char_indices().skip(1) {
                if can_split(&text[..p], &text[p..]) {
                    let mut parts = tok.encode(&text[..p]).unwrap();
                    parts.extend(tok.encode(&text[p..]).unwrap());
                    assert_eq!(parts, whole, "{tok:?} split at {p} of {text:?}");
                }
            }
        }
    }
}

#[test]
fn can_split_rule() {
    assert!(can_split("ab\n", "c"));
    assert!(!can_split("ab \n", "c"), "trailing space");
    assert!(!can_split("ab\r\n", "c"), "CRLF");
    assert!(!can_split("ab\n", " c"), "next line starts with a space");
    assert!(!can_split("ab\n\n", "c"), "blank line before");
    assert!(!can_split("ab", "c"), "not at a line end");
    assert!(!can_split("\n", "c"), "nothing before the newline");
}

/// A tokenizer.json with a WordLevel model and no EOS candidate.
const WORD_LEVEL: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
"model":{"type":"WordLevel","vocab":{"a":0,"b":1,"[UNK]":2},"unk_token":"[UNK]"}}"#;

#[test]
fn hf_eos_is_given_or_found_or_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("wl.json");
    std::fs::write(&path, WORD_LEVEL).unwrap();
    let err = Tokenizer::from_hf_file(&path, None).unwrap_err();
    assert!(err.to_string().contains("wl.json") && err.to_string().contains("--eos-token"), "{err}");
    let err = Tokenizer::from_hf_file(&path, Some("<eos>")).unwrap_err();
    assert!(err.to_string().contains("\"<eos>\" is not in the vocabulary"), "{err}");
    let t = Tokenizer::from_hf_file(&path, Some("b")).unwrap();
    assert_eq!((t.eos_id(), t.vocab_size()), (1, 3));
    assert_eq!(t.encode("a b a").unwrap(), vec![0, 1, 0]);
    // The spec rebuilds it from the directory holding tokenizer.json, and refuses another file.
    std::fs::write(tmp.path().join(HF_TOKENIZER_FILE), WORD_LEVEL).unwrap();
    let spec = t.spec();
    assert!(matches!(Tokenizer::from_spec(&spec), Err(DataError::InvalidTokenizerSpec { .. })));
    assert_eq!(Tokenizer::from_spec_in(&spec, tmp.path()).unwrap().spec(), spec);
    std::fs::write(tmp.path().join(HF_TOKENIZER_FILE), WORD_LEVEL.replace("\"b\":1", "\"c\":1")).unwrap();
    let err = Tokenizer::from_spec_in(&spec, tmp.path()).unwrap_err();
    assert!(matches!(err, DataError::FileChecksum { .. }), "{err:?}");
    std::fs::write(&path, "{not json").unwrap();
    let err = Tokenizer::from_hf_file(&path, None).unwrap_err();
    assert!(matches!(err, DataError::HfTokenizer { .. }) && err.to_string().contains("wl.json"), "{err}");
}

#[test]
fn tinyshakespeare_piecewise_equals_whole_if_available() {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED not set");
        return;
    };
    let path = std::path::Path::new(&shared).join("data/tinyshakespeare.txt");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("skipping: cannot read {}", path.display());
        return;
    };
    let tok = Tokenizer::gpt2();
    let whole = tok.encode(&text).unwrap();
    // nanoGPT's prepare.py: 301,966 train + 36,059 val = 338,025 GPT-2 tokens.
    assert_eq!(whole.len(), 338_025);
    let mut pieces = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices('\n') {
        let p = i + 1;
        if p - start >= 4096 && p < text.len() && can_split(&text[start..p], &text[p..]) {
            pieces.extend(tok.encode(&text[start..p]).unwrap());
            start = p;
        }
    }
    pieces.extend(tok.encode(&text[start..]).unwrap());
    assert_eq!(pieces, whole);
}
