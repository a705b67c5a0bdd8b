use super::*;
use crate::meta::{shard_file_name, META_FILE};
use crate::{prepare, PrepareOptions, TokenizerKind};

/// Prepares "abcd" + "ef" (char, val_fraction 0.4, 3-token shards): stream a b c d EOS e f EOS
/// = 0 1 2 3 6 4 5 6 (8 tokens), train floor(8 * 0.6) = 4, shards of 3, 3, 2.
fn prepared() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a.txt");
    let b = tmp.path().join("b.txt");
    std::fs::write(&a, "abcd").unwrap();
    std::fs::write(&b, "ef").unwrap();
    let out = tmp.path().join("out");
    let mut opts = PrepareOptions::new(TokenizerKind::Char, vec![a, b], out.clone());
    opts.val_fraction = 0.4;
    opts.shard_tokens = 3;
    opts.progress = false;
    let s = prepare(&opts).unwrap();
    assert_eq!((s.meta.train_tokens, s.meta.val_tokens), (4, 4));
    (tmp, out)
}

#[test]
fn opens_splits_and_documents() {
    let (_tmp, out) = prepared();
    let d = PreparedData::open(&out).unwrap();
    assert_eq!(d.stream(Split::Train).slice(0, 4).unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(d.stream(Split::Val).slice(0, 4).unwrap(), vec![6, 4, 5, 6]);
    assert_eq!(Split::Val.to_string(), "val");
    assert_eq!(d.documents(), 2);
    assert_eq!((d.document(0), d.document(1), d.document(2)), (Some(0..5), Some(5..8), None));
    assert_eq!([0, 4, 5, 7].map(|p| d.document_at(p)), [0, 0, 1, 1]);
    // Document 0 ends (at 5) after train_tokens (4): it is in neither split's document range
    // for train, which holds the documents ending by position 4.
    assert_eq!(d.documents_in(Split::Train), 0..0);
    assert_eq!(d.documents_in(Split::Val), 0..2);
    assert_eq!(d.prompt_tokens(0), None);
    assert_eq!(d.tokenizer().unwrap().decode(&[4, 5]).unwrap(), "ef");
}

#[test]
fn corrupt_shard_is_refused_naming_it_and_both_hashes() {
    let (_tmp, out) = prepared();
    let shard = out.join(shard_file_name(1));
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&shard, &bytes).unwrap();
    let meta = Meta::read(&out).unwrap();
    let err = PreparedData::open(&out).unwrap_err();
    let DataError::FileChecksum { expected, actual, .. } = &err else { panic!("{err:?}") };
    assert_eq!(expected, &meta.shards[1].sha256);
    let msg = err.to_string();
    assert!(
        msg.contains(&shard.display().to_string()) && msg.contains(expected) && msg.contains(actual.as_str()),
        "{msg}"
    );
    // Sizes are still right, so the unverified open succeeds.
    assert!(PreparedData::open_unverified(&out).is_ok());
}

#[test]
fn truncated_shard_and_index_are_refused() {
    let (_tmp, out) = prepared();
    let shard = out.join(shard_file_name(2));
    std::fs::write(&shard, [4u8, 0]).unwrap(); // 1 token instead of 2
    let err = PreparedData::open(&out).unwrap_err();
    assert!(matches!(err, DataError::ShardSize { expected_bytes: 4, actual_bytes: 2, .. }), "{err:?}");
    assert!(err.to_string().contains(&shard.display().to_string()), "{err}");

    let (_tmp, out) = prepared();
    std::fs::write(out.join(DOCUMENTS_FILE), 5u64.to_le_bytes()).unwrap();
    let err = PreparedData::open(&out).unwrap_err();
    assert!(
        err.to_string().contains("documents.bin") && err.to_string().contains("records 2 documents"),
        "{err}"
    );
}

#[test]
fn format_1_directory_says_run_prepare_again() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join(META_FILE),
        r#"{"format_version":1,"tokenizer":{"kind":"gpt2"},"vocab_size":50257,"eos_id":50256,"dtype":"u16",
           "train_tokens":9,"val_tokens":1,"documents":1,"val_fraction":0.1,"sources":[]}"#,
    )
    .unwrap();
    let err = PreparedData::open(tmp.path()).unwrap_err();
    assert!(matches!(err, DataError::UnsupportedFormatVersion { found: 1, .. }), "{err:?}");
    assert!(err.to_string().contains("run `ember prepare` again"), "{err}");
}

#[test]
fn missing_files_are_named() {
    let (tmp, out) = prepared();
    std::fs::remove_file(out.join(shard_file_name(0))).unwrap();
    let msg = PreparedData::open(&out).unwrap_err().to_string();
    assert!(msg.contains("tokens-00000.bin"), "{msg}");
    let msg = PreparedData::open(tmp.path()).unwrap_err().to_string();
    assert!(msg.contains("meta.json"), "{msg}");
}
