use super::*;
use crate::{PreparedData, Split, TokenizerSpec};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn opts(kind: TokenizerKind, inputs: Vec<PathBuf>, out: PathBuf, val_fraction: f64) -> PrepareOptions {
    PrepareOptions { tokenizer: kind, inputs, out, val_fraction }
}

#[test]
fn char_two_files() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"ab\n");
    let b = write(tmp.path(), "b.txt", b"ba");
    let out = tmp.path().join("out");
    let s = prepare(&opts(TokenizerKind::Char, vec![a.clone(), b], out.clone(), 0.1)).unwrap();
    let m = &s.meta;
    // vocab: '\n'=0, 'a'=1, 'b'=2, EOS=3.
    assert_eq!(m.tokenizer, TokenizerSpec::Char { chars: vec!['\n', 'a', 'b'] });
    assert_eq!((m.vocab_size, m.eos_id, m.dtype), (4, 3, TokenDtype::U16));
    // stream: a b \n EOS b a EOS -> N = 7 = (3 + 2) + 2 documents; n_train = floor(7 * 0.9) = 6.
    assert_eq!(m.documents, 2);
    assert_eq!((m.train_tokens, m.val_tokens), (6, 1));
    assert_eq!(std::fs::read(out.join("train.bin")).unwrap(), [1, 0, 2, 0, 0, 0, 3, 0, 2, 0, 1, 0]);
    assert_eq!(std::fs::read(out.join("val.bin")).unwrap(), [3, 0]);
    // sha256sum of "ab\n"
    assert_eq!(m.sources[0].sha256, "a63d8014dba891345b30174df2b2a57efbb65b4f9f09b98f245d1b3192277ece");
    assert_eq!(m.sources[0].bytes, 3);
    assert_eq!(m.sources[0].path, a.display().to_string());
    assert_eq!(m.sources[1].bytes, 2);

    let data = PreparedData::open(&out).unwrap();
    assert_eq!(&data.meta, m);
    let mut all = data.stream(Split::Train).slice(0, data.train.len());
    all.extend(data.stream(Split::Val).slice(0, data.val.len()));
    assert_eq!(all, vec![1, 2, 0, 3, 2, 1, 3]);
    let eos_count = all.iter().filter(|&&t| t == m.eos_id).count() as u64;
    assert_eq!(eos_count, m.documents);
    // Exactly the three outputs, no temp files left.
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 3);
}

#[test]
fn gpt2_documents_split_on_endoftext() {
    let tmp = tempfile::tempdir().unwrap();
    // pieces: "Hello world", "Hello", "" (skipped), "world"; then file 2: "Hello", "" (skipped).
    let a = write(tmp.path(), "a.txt", b"Hello world<|endoftext|>Hello<|endoftext|><|endoftext|>world");
    let b = write(tmp.path(), "b.txt", b"Hello<|endoftext|>");
    let out = tmp.path().join("out");
    let s = prepare(&opts(TokenizerKind::Gpt2, vec![a, b], out.clone(), 0.0)).unwrap();
    let m = &s.meta;
    assert_eq!(m.documents, 4);
    assert_eq!((m.vocab_size, m.eos_id, m.dtype), (50257, 50256, TokenDtype::U16));
    assert_eq!((m.train_tokens, m.val_tokens), (9, 0));
    let data = PreparedData::open(&out).unwrap();
    assert_eq!(data.train.slice(0, 9), vec![15496, 995, 50256, 15496, 50256, 6894, 50256, 15496, 50256]);
    assert!(data.val.is_empty());
}

#[test]
fn reprepare_replaces_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"abcd");
    let out = tmp.path().join("out");
    prepare(&opts(TokenizerKind::Char, vec![a.clone()], out.clone(), 0.5)).unwrap();
    std::fs::write(&a, b"xy").unwrap();
    let s = prepare(&opts(TokenizerKind::Char, vec![a], out.clone(), 0.5)).unwrap();
    // "xy" + EOS = 3 tokens; n_train = floor(3 * 0.5) = 1.
    assert_eq!((s.meta.train_tokens, s.meta.val_tokens), (1, 2));
    let data = PreparedData::open(&out).unwrap();
    assert_eq!(data.val.slice(0, 2), vec![1, 2]);
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 3);
}

/// Runs `prepare` expecting failure, and checks that no output directory was created.
fn fails(o: PrepareOptions) -> DataError {
    let err = prepare(&o).unwrap_err();
    assert!(!o.out.exists(), "output dir created despite error {err}");
    err
}

#[test]
fn missing_input_names_path() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"ok");
    let missing = tmp.path().join("nope.txt");
    let err = fails(opts(TokenizerKind::Char, vec![a, missing.clone()], tmp.path().join("out"), 0.1));
    assert!(matches!(err, DataError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");
}

#[test]
fn invalid_utf8_names_path_and_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = write(tmp.path(), "bad.txt", b"ab\xffcd");
    let err = fails(opts(TokenizerKind::Gpt2, vec![bad.clone()], tmp.path().join("out"), 0.1));
    assert!(matches!(err, DataError::InvalidUtf8 { offset: 2, .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&bad.display().to_string()) && msg.contains("offset 2"), "{msg}");
}

#[test]
fn empty_corpus() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = write(tmp.path(), "empty.txt", b"");
    let err = fails(opts(TokenizerKind::Char, vec![empty], tmp.path().join("out"), 0.1));
    assert!(matches!(err, DataError::EmptyCorpus { .. }), "{err:?}");
    let only_eos = write(tmp.path(), "eos.txt", b"<|endoftext|><|endoftext|>");
    let err = fails(opts(TokenizerKind::Gpt2, vec![only_eos], tmp.path().join("out"), 0.1));
    assert!(matches!(err, DataError::EmptyCorpus { .. }), "{err:?}");
}

#[test]
fn bad_val_fraction_and_no_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(tmp.path(), "a.txt", b"ok");
    for vf in [1.0, -0.1, f64::NAN, 2.0] {
        let err = fails(opts(TokenizerKind::Char, vec![a.clone()], tmp.path().join("out"), vf));
        assert!(matches!(err, DataError::InvalidValFraction { .. }), "{vf}: {err:?}");
        assert!(err.to_string().contains("[0, 1)"), "{err}");
    }
    let err = fails(opts(TokenizerKind::Char, vec![], tmp.path().join("out"), 0.1));
    assert!(matches!(err, DataError::NoInputs), "{err:?}");
}

#[test]
fn tinyshakespeare_char_if_available() {
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
    let s = prepare(&opts(TokenizerKind::Char, vec![input], tmp.path().join("out"), 0.1)).unwrap();
    assert_eq!(s.meta.vocab_size, 66); // 65 distinct chars + EOS
    assert_eq!(s.meta.train_tokens + s.meta.val_tokens, 1_115_395); // 1,115,394 chars + 1 EOS
    assert_eq!(s.meta.train_tokens, 1_003_855); // floor(1,115,395 * 0.9)
    assert_eq!(s.meta.sources[0].sha256, crate::TINYSHAKESPEARE_SHA256);
}
