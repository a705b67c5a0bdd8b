use std::path::Path;

use super::*;
use crate::meta::{shard_file_name, DOCUMENTS_FILE, META_FILE, PROMPTS_FILE};
use crate::{PreparedData, SftFields, Split};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
    p
}

fn opts(kind: TokenizerKind, inputs: Vec<PathBuf>, out: PathBuf, val_fraction: f64) -> PrepareOptions {
    let mut o = PrepareOptions::new(kind, inputs, out);
    o.val_fraction = val_fraction;
    o.progress = false;
    o
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The entries of `dir`, sorted.
pub(super) fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn char_two_files_in_three_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"ab\n");
    let b = write(tmp.path(), "b.txt", b"ba");
    let out = tmp.path().join("out");
    let mut o = opts(TokenizerKind::Char, vec![a.clone(), b], out.clone(), 0.1);
    o.shard_tokens = 3;
    let s = prepare(&o).unwrap();
    let m = &s.meta;
    // vocab: '\n'=0, 'a'=1, 'b'=2, EOS=3.
    assert_eq!(m.tokenizer, TokenizerSpec::Char { chars: vec!['\n', 'a', 'b'] });
    assert_eq!((m.vocab_size, m.eos_id, m.dtype, m.kind), (4, 3, TokenDtype::U16, DataKind::Pretrain));
    // stream: a b \n EOS b a EOS -> 7 = (3 + 2) + 2 documents; train = floor(7 * 0.9) = 6.
    assert_eq!((m.total_tokens, m.documents, m.train_tokens, m.val_tokens), (7, 2, 6, 1));
    assert_eq!(std::fs::read(out.join("tokens-00000.bin")).unwrap(), [1, 0, 2, 0, 0, 0]);
    assert_eq!(std::fs::read(out.join("tokens-00001.bin")).unwrap(), [3, 0, 2, 0, 1, 0]);
    assert_eq!(std::fs::read(out.join("tokens-00002.bin")).unwrap(), [3, 0]);
    assert_eq!(m.shards.iter().map(|s| s.tokens).collect::<Vec<_>>(), vec![3, 3, 1]);
    // sha256 of the 2 bytes 03 00 (Python hashlib).
    assert_eq!(m.shards[2].sha256, "9b4fb24edd6d1d8830e272398263cdbf026b97392cc35387b991dc0248a628f9");
    assert_eq!(u64s(&std::fs::read(out.join(DOCUMENTS_FILE)).unwrap()), vec![4, 7]);
    // sha256sum of "ab\n"
    assert_eq!(m.sources[0].sha256, "a63d8014dba891345b30174df2b2a57efbb65b4f9f09b98f245d1b3192277ece");
    assert_eq!((m.sources[0].bytes, m.sources[0].path.clone()), (3, a.display().to_string()));
    assert_eq!(
        names(&out),
        vec![DOCUMENTS_FILE, META_FILE, "tokens-00000.bin", "tokens-00001.bin", "tokens-00002.bin"]
    );
    assert_eq!(names(tmp.path()), vec!["a.txt", "b.txt", "out"], "no staging directory left");

    let data = PreparedData::open(&out).unwrap();
    assert_eq!(&data.meta, m);
    assert_eq!(data.stream(Split::Train).slice(0, 6).unwrap(), vec![1, 2, 0, 3, 2, 1]);
    assert_eq!(data.stream(Split::Val).slice(0, 1).unwrap(), vec![3]);
}

#[test]
fn eos_follows_every_document() {
    let tmp = tempfile::tempdir().unwrap();
    let mut lines = String::new();
    let mut doc_tokens = 0;
    let tok = Tokenizer::gpt2();
    for i in 0..40 {
        let text = format!("Document number {i}.\nIt has {} words in it{}", i % 7, "!".repeat(i % 3));
        doc_tokens += tok.encode(&text).unwrap().len() as u64;
        lines.push_str(&serde_json::json!({ "text": text }).to_string());
        lines.push('\n');
    }
    let a = write(tmp.path(), "docs.jsonl", lines.as_bytes());
    let out = tmp.path().join("out");
    let s = prepare(&opts(TokenizerKind::Gpt2, vec![a], out.clone(), 0.25)).unwrap();
    assert_eq!(s.meta.documents, 40);
    assert_eq!(s.meta.total_tokens, doc_tokens + 40, "Σ tokens = Σ document lengths + #documents");
    let data = PreparedData::open(&out).unwrap();
    let mut all = data.train.slice(0, data.train.len()).unwrap();
    all.extend(data.val.slice(0, data.val.len()).unwrap());
    assert_eq!(all.iter().filter(|&&t| t == 50256).count(), 40, "#EOS = #documents");
    for d in 0..40 {
        let r = data.document(d).unwrap();
        assert_eq!(all[r.end as usize - 1], 50256, "document {d} ends with its EOS");
    }
}

/// A corpus of several files and formats, ~200 KB.
fn mixed_corpus(dir: &Path) -> Vec<PathBuf> {
    let mut jsonl = String::new();
    for i in 0..300 {
        let text =
            format!("Entry {i}: the quick brown fox {}\njumps over the lazy dog.\n", "très ".repeat(i % 5));
        jsonl.push_str(&serde_json::json!({ "text": text }).to_string());
        jsonl.push('\n');
    }
    let mut book = String::new();
    for i in 0..3000 {
        book.push_str(&format!("Line {i} of the book, with words and numbers {}.\n", i * 37));
        if i % 10 == 0 {
            book.push_str("  Indented, trailing space \n\n");
        }
    }
    vec![
        write(dir, "in/a.jsonl", jsonl.as_bytes()),
        write(dir, "in/b/book.txt", book.as_bytes()),
        write(dir, "in/c.txt", "short\r\nfile\r\n".as_bytes()),
    ]
}

fn all_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    names(dir).into_iter().map(|n| (n.clone(), std::fs::read(dir.join(&n)).unwrap())).collect()
}

#[test]
fn output_is_byte_identical_whatever_the_thread_count_and_chunk_size() {
    let tmp = tempfile::tempdir().unwrap();
    mixed_corpus(tmp.path());
    for kind in [TokenizerKind::Gpt2, TokenizerKind::Char] {
        let mut results = Vec::new();
        for (threads, chunk_bytes) in [(1, DEFAULT_CHUNK_BYTES), (4, DEFAULT_CHUNK_BYTES), (4, 1000), (3, 1)]
        {
            let out = tmp.path().join(format!("out-{kind}-{threads}-{chunk_bytes}"));
            let mut o = opts(kind, vec![tmp.path().join("in")], out.clone(), 0.1);
            o.shard_tokens = 10_000;
            o.chunk_bytes = chunk_bytes;
            // Through a pool built here, as a caller with its own pool would.
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let s = pool.install(|| prepare(&o)).unwrap();
            assert!(s.meta.shards.len() > 1, "several shards");
            results.push(all_bytes(&out));
        }
        for r in &results[1..] {
            assert!(r == &results[0], "{kind}: outputs differ");
        }
    }
}

#[test]
fn whole_documents_equal_the_piecewise_encoding() {
    // book.txt is one 170 KB document, cut into ~64 KB pieces: its tokens must equal the
    // tokens of the whole text.
    let tmp = tempfile::tempdir().unwrap();
    let files = mixed_corpus(tmp.path());
    let out = tmp.path().join("out");
    let s = prepare(&opts(TokenizerKind::Cl100k, vec![files[1].clone()], out.clone(), 0.0)).unwrap();
    let text = std::fs::read_to_string(&files[1]).unwrap();
    let mut want = Tokenizer::cl100k().encode(&text).unwrap();
    want.push(100257);
    assert!(text.len() > 2 * chunks::PIECE_BYTES);
    assert_eq!(s.meta.dtype, TokenDtype::U32);
    let data = PreparedData::open(&out).unwrap();
    assert_eq!(data.train.slice(0, data.train.len()).unwrap(), want);
}

#[test]
fn sft_examples_prompts_and_split_at_an_example_end() {
    let tmp = tempfile::tempdir().unwrap();
    let lines = [
        r#"{"prompt":"ab","response":"c"}"#,
        r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"bb"}]}"#,
        r#"{"prompt":"","response":"cab"}"#,
    ];
    let a = write(tmp.path(), "sft.jsonl", lines.join("\n").as_bytes());
    let out = tmp.path().join("out");
    let mut o = opts(TokenizerKind::Char, vec![a], out.clone(), 0.3);
    o.input.sft = Some(SftFields::default());
    let s = prepare(&o).unwrap();
    let m = &s.meta;
    assert_eq!(m.kind, DataKind::Sft);
    // Example 2's prompt is "<|user|>\na\n<|assistant|>\n" (25 chars), response "bb".
    // Lengths with EOS: 2+1+1 = 4, 25+2+1 = 28, 0+3+1 = 4: ends 4, 32, 36.
    assert_eq!(u64s(&std::fs::read(out.join(DOCUMENTS_FILE)).unwrap()), vec![4, 32, 36]);
    let prompts: Vec<u32> = std::fs::read(out.join(PROMPTS_FILE))
        .unwrap()
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(prompts, vec![2, 25, 0]);
    assert_eq!(m.prompt_tokens, 27);
    // floor(36 * 0.7) = 25, rounded down to the end of example 0: 4.
    assert_eq!((m.total_tokens, m.train_tokens, m.val_tokens), (36, 4, 32));
    let data = PreparedData::open(&out).unwrap();
    assert_eq!(data.documents_in(Split::Train), 0..1);
    assert_eq!(data.documents_in(Split::Val), 1..3);
}

#[test]
fn reprepare_replaces_outputs_and_keeps_other_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let a = write(tmp.path(), "out/corpus.txt", b"abcd"); // as --download does
    let mut o = opts(TokenizerKind::Char, vec![a.clone()], out.clone(), 0.5);
    o.shard_tokens = 2;
    prepare(&o).unwrap();
    assert_eq!(names(&out).len(), 1 + 3 + 2, "corpus, 3 shards, documents.bin, meta.json");
    std::fs::write(&a, b"xy").unwrap();
    o.shard_tokens = 100;
    o.force = true; // replacing an Ember dataset
    let s = prepare(&o).unwrap();
    // "xy" + EOS = 3 tokens; train = floor(3 * 0.5) = 1.
    assert_eq!((s.meta.train_tokens, s.meta.val_tokens), (1, 2));
    assert_eq!(names(&out), vec!["corpus.txt", DOCUMENTS_FILE, META_FILE, &shard_file_name(0)]);
    let data = PreparedData::open(&out).unwrap();
    assert_eq!(data.val.slice(0, 2).unwrap(), vec![1, 2]);
}

/// Runs `prepare` expecting failure, and checks that no output (or staging) was created.
fn fails(o: PrepareOptions) -> DataError {
    let parent = o.out.parent().unwrap().to_path_buf();
    let before = names(&parent);
    let err = prepare(&o).unwrap_err();
    assert!(!o.out.exists(), "output dir created despite error {err}");
    assert_eq!(names(&parent), before, "staging left behind after {err}");
    err
}

#[test]
fn input_errors_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let ok = write(tmp.path(), "ok.txt", b"ok");
    let out = tmp.path().join("out");
    let missing = tmp.path().join("nope.txt");
    let err = fails(opts(TokenizerKind::Char, vec![ok.clone(), missing.clone()], out.clone(), 0.1));
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
    // An error late in the stream (second file) after tokens were written to staging.
    let bad = write(tmp.path(), "bad.jsonl", b"{\"text\":\"fine\"}\n{\"txt\":\"oops\"}\n");
    let err = fails(opts(TokenizerKind::Gpt2, vec![ok.clone(), bad.clone()], out.clone(), 0.1));
    assert!(err.to_string().contains(&format!("{}:2:", bad.display())), "{err}");
    let utf = write(tmp.path(), "utf.txt", b"ab\xffcd");
    let err = fails(opts(TokenizerKind::Gpt2, vec![utf], out.clone(), 0.1));
    assert!(matches!(err, DataError::InvalidUtf8 { offset: 2, line: 1, .. }), "{err:?}");
    let empty = write(tmp.path(), "empty.txt", b"");
    let err = fails(opts(TokenizerKind::Char, vec![empty.clone()], out.clone(), 0.1));
    assert!(matches!(err, DataError::EmptyCorpus { .. }), "{err:?}");
    let err = fails(opts(TokenizerKind::Byte, vec![empty], out.clone(), 0.1));
    assert!(matches!(err, DataError::EmptyCorpus { .. }), "{err:?}");
}

#[test]
fn option_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"ok");
    let out = tmp.path().join("out");
    for vf in [1.0, -0.1, f64::NAN] {
        let err = fails(opts(TokenizerKind::Char, vec![a.clone()], out.clone(), vf));
        assert!(err.to_string().contains("[0, 1)"), "{err}");
    }
    let err = fails(opts(TokenizerKind::Hf, vec![a.clone()], out.clone(), 0.1));
    assert!(err.to_string().contains("--tokenizer-file"), "{err}");
    let mut o = opts(TokenizerKind::Gpt2, vec![a.clone()], out.clone(), 0.1);
    o.eos_token = Some("</s>".into());
    assert!(fails(o).to_string().contains("--eos-token is only for --tokenizer hf"));
    let mut o = opts(TokenizerKind::Gpt2, vec![a], out, 0.1);
    o.shard_tokens = 0;
    assert!(matches!(fails(o), DataError::InvalidOption { .. }));
}

#[test]
fn lossy_replacements_are_counted_in_meta() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"a\xffb");
    let mut o = opts(TokenizerKind::Byte, vec![a], tmp.path().join("out"), 0.0);
    o.input.lossy = true;
    let s = prepare(&o).unwrap();
    assert_eq!(s.meta.lossy_replacements, 1);
    // a, U+FFFD (EF BF BD), b, EOS.
    let data = PreparedData::open(&tmp.path().join("out")).unwrap();
    assert_eq!(data.train.slice(0, 6).unwrap(), vec![97, 0xEF, 0xBF, 0xBD, 98, 256]);
}

#[test]
fn hf_tokenizer_is_copied_and_reloaded() {
    let tmp = tempfile::tempdir().unwrap();
    let corpus = write(tmp.path(), "c.txt", "hello world, hello there\n".repeat(30).as_bytes());
    let tok_file = tmp.path().join("tokenizer.json");
    crate::train_bpe(&crate::BpeTrainOptions {
        inputs: vec![corpus.clone()],
        input: Default::default(),
        vocab_size: 280,
        min_frequency: 2,
        out: tok_file.clone(),
    })
    .unwrap();
    let out = tmp.path().join("out");
    let mut o = opts(TokenizerKind::Hf, vec![corpus.clone()], out.clone(), 0.1);
    o.tokenizer_file = Some(tok_file.clone());
    let s = prepare(&o).unwrap();
    assert_eq!(std::fs::read(out.join(HF_TOKENIZER_FILE)).unwrap(), std::fs::read(&tok_file).unwrap());
    let TokenizerSpec::Hf { eos_id, eos_token, .. } = &s.meta.tokenizer else {
        panic!("{:?}", s.meta.tokenizer)
    };
    assert_eq!((*eos_id, eos_token.as_str()), (0, "<|endoftext|>"));
    let data = PreparedData::open(&out).unwrap();
    let tok = data.tokenizer().unwrap();
    let text = std::fs::read_to_string(&corpus).unwrap();
    let n = data.meta.total_tokens as usize;
    let all =
        [data.train.slice(0, data.train.len()).unwrap(), data.val.slice(0, data.val.len()).unwrap()].concat();
    assert_eq!(all.len(), n);
    assert_eq!(tok.decode(&all[..n - 1]).unwrap(), text);
    assert_eq!(all[n - 1], 0);
    // A replacement's record lists the new files with the hashes meta.json gives them: they
    // must be the files' own, tokenizer.json's included, or a crash mid-replacement would
    // leave files that no longer count as Ember's.
    for (name, sha) in crate::prepare::owned::listed(&s.meta) {
        assert_eq!(crate::sha256_file(&out.join(&name)).unwrap(), sha, "{name}");
    }
}

#[test]
fn tinyshakespeare_if_available() {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED not set");
        return;
    };
    let input = Path::new(&shared).join("data/tinyshakespeare.txt");
    if !input.exists() {
        eprintln!("skipping: {} does not exist", input.display());
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let s = prepare(&opts(TokenizerKind::Char, vec![input.clone()], tmp.path().join("char"), 0.1)).unwrap();
    assert_eq!(s.meta.vocab_size, 66); // 65 distinct chars + EOS
    assert_eq!(s.meta.total_tokens, 1_115_395); // 1,115,394 chars + 1 EOS
    assert_eq!(s.meta.train_tokens, 1_003_855); // floor(1,115,395 * 0.9)
    assert_eq!(s.meta.sources[0].sha256, crate::TINYSHAKESPEARE_SHA256);
    let s = prepare(&opts(TokenizerKind::Gpt2, vec![input], tmp.path().join("gpt2"), 0.1)).unwrap();
    assert_eq!(s.meta.total_tokens, 338_026); // nanoGPT's 338,025 GPT-2 tokens + 1 EOS
}
