//! `prepare` never deletes or overwrites files that are not Ember's.

use std::path::{Path, PathBuf};

use super::check_output_dir;
use crate::prepare::replacing::Replacing;
use crate::prepare::tests::names;
use crate::{prepare, DataError, PrepareOptions, TokenizerKind};

fn write(path: &Path, bytes: &[u8]) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
    path.into()
}

fn opts(input: &Path, out: &Path) -> PrepareOptions {
    let mut o = PrepareOptions::new(TokenizerKind::Char, vec![input.into()], out.into());
    o.progress = false;
    o
}

#[test]
fn a_nanogpt_directory_is_refused_and_left_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write(&tmp.path().join("corpus.txt"), b"hello");
    let out = tmp.path().join("shakespeare_char");
    let files = [
        ("train.bin", &b"\x01\x02"[..]),
        ("val.bin", b"\x03"),
        ("tokenizer.json", b"{}"),
        ("meta.pkl", b"x"),
    ];
    for (name, bytes) in files {
        write(&out.join(name), bytes);
    }
    let err = prepare(&opts(&input, &out)).unwrap_err();
    assert!(matches!(err, DataError::OutputInUse { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&out.display().to_string()), "{msg}");
    assert!(
        msg.contains("meta.pkl, tokenizer.json, train.bin, val.bin") && msg.contains("no Ember dataset"),
        "{msg}"
    );
    // --force does not make it an Ember dataset.
    let mut forced = opts(&input, &out);
    forced.force = true;
    assert!(matches!(prepare(&forced).unwrap_err(), DataError::OutputInUse { .. }));
    for (name, bytes) in files {
        assert_eq!(std::fs::read(out.join(name)).unwrap(), bytes, "{name} changed");
    }
    assert_eq!(names(&out).len(), 4);
    assert_eq!(names(tmp.path()), ["corpus.txt", "shakespeare_char"], "no staging directory left");
    // Nor does a meta.json that says `format_version: 1` (Ember's old format listed no hashes).
    write(&out.join("meta.json"), br#"{"format_version": 1, "vocab_size": 65}"#);
    assert!(matches!(prepare(&forced).unwrap_err(), DataError::OutputInUse { .. }));
    for (name, bytes) in files {
        assert_eq!(std::fs::read(out.join(name)).unwrap(), bytes, "{name} changed");
    }
}

#[test]
fn an_ember_dataset_is_replaced_only_with_force_and_other_files_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write(&tmp.path().join("corpus.txt"), b"hello");
    let out = tmp.path().join("out");
    let mut o = opts(&input, &out);
    o.shard_tokens = 2;
    prepare(&o).unwrap(); // 6 tokens: 3 shards
    write(&out.join("notes.txt"), b"mine");
    let before = std::fs::read(out.join("meta.json")).unwrap();
    o.shard_tokens = 100;
    let msg = prepare(&o).unwrap_err().to_string();
    assert!(msg.contains("already holds an Ember dataset") && msg.contains("--force"), "{msg}");
    assert_eq!(std::fs::read(out.join("meta.json")).unwrap(), before, "refused: nothing changed");
    o.force = true;
    let s = prepare(&o).unwrap();
    assert_eq!(s.meta.shards.len(), 1);
    assert_eq!(names(&out), ["documents.bin", "meta.json", "notes.txt", "tokens-00000.bin"]);
    assert_eq!(std::fs::read(out.join("notes.txt")).unwrap(), b"mine");
}

#[test]
fn inputs_inside_the_output_directory_do_not_count_and_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    // As `ember prepare --download tinyshakespeare` leaves it.
    let input = write(&out.join("tinyshakespeare.txt"), b"to be");
    prepare(&opts(&input, &out)).unwrap();
    assert_eq!(std::fs::read(&input).unwrap(), b"to be");
    assert!(out.join("meta.json").exists());
    let mut again = opts(&input, &out);
    again.force = true;
    prepare(&again).unwrap();
    assert_eq!(std::fs::read(&input).unwrap(), b"to be");
}

/// Files that only bear Ember's names are not provably a dataset: refused even with --force,
/// with or without a damaged meta.json beside them, or when their bytes are not the ones a
/// valid meta.json lists; what an interrupted replacement leaves is named, with its hashes, by
/// its record and is replaced with --force; a hand-written record cannot claim other files.
#[test]
fn only_files_a_valid_meta_or_a_replacement_record_lists_with_their_bytes_are_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    write(&out.join("tokens-00000.bin"), b"\x00\x00");
    write(&out.join("documents.bin"), b"");
    for force in [false, true] {
        let err = check_output_dir(&out, force, &[], false).unwrap_err().to_string();
        assert!(
            err.contains("it holds documents.bin, tokens-00000.bin, which have an Ember dataset's names but no valid meta.json lists")
                && err.contains("even with --force"),
            "{err}"
        );
    }
    write(&out.join("meta.json"), b"garbage");
    assert!(check_output_dir(&out, true, &[], false).is_err(), "a damaged meta.json proves nothing");

    // A real dataset's meta.json beside files of other bytes under its names.
    let input = write(&tmp.path().join("corpus.txt"), b"hello");
    let real = tmp.path().join("real");
    prepare(&opts(&input, &real)).unwrap();
    std::fs::copy(real.join("meta.json"), out.join("meta.json")).unwrap();
    let err = check_output_dir(&out, true, &[], false).unwrap_err().to_string();
    assert!(
        err.contains("documents.bin, tokens-00000.bin are not the bytes its meta.json (or replacement record) lists (sha256 differs")
            && err.contains("even with --force"),
        "{err}"
    );
    for name in ["documents.bin", "tokens-00000.bin"] {
        std::fs::copy(real.join(name), out.join(name)).unwrap();
    }
    // A shard it does not list.
    write(&out.join("tokens-00001.bin"), b"\x00\x00");
    let err = check_output_dir(&out, true, &[], false).unwrap_err().to_string();
    assert!(err.contains("it holds tokens-00001.bin, which has an Ember dataset's names"), "{err}");
    std::fs::remove_file(out.join("tokens-00001.bin")).unwrap();
    // A meta.json edited to list a file of the user's: not an Ember name, so not claimed.
    write(&out.join("NOTE.txt"), b"mine");
    let meta = std::fs::read_to_string(real.join("meta.json")).unwrap();
    std::fs::write(out.join("meta.json"), meta.replace("\"tokens-00000.bin\"", "\"NOTE.txt\"")).unwrap();
    assert!(check_output_dir(&out, true, &[], false).is_err());
    std::fs::copy(real.join("meta.json"), out.join("meta.json")).unwrap();
    let mut replaced = check_output_dir(&out, true, &[], false).unwrap();
    replaced.sort();
    assert_eq!(replaced, [out.join("documents.bin"), out.join("meta.json"), out.join("tokens-00000.bin")]);

    // A replacement interrupted after removing the old meta.json: its record names the files.
    std::fs::remove_file(out.join("meta.json")).unwrap();
    let files = [out.join("documents.bin"), out.join("tokens-00000.bin"), real.join("meta.json")];
    let record = || {
        let hashed = files.iter().map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, crate::sha256_file(path).unwrap())
        });
        Replacing { files: hashed.collect() }
    };
    record().write(&out).unwrap();
    let err = check_output_dir(&out, false, &[], false).unwrap_err().to_string();
    assert!(
        err.contains(
            "already holds an Ember dataset (.ember-replacing.json, documents.bin, tokens-00000.bin)"
        ),
        "{err}"
    );
    let mut replaced = check_output_dir(&out, true, &[], false).unwrap();
    replaced.sort();
    assert_eq!(
        replaced,
        [out.join("documents.bin"), out.join("tokens-00000.bin")],
        "the record is rewritten"
    );
    // A record naming other bytes (or a user's file) does not make them Ember's.
    std::fs::write(out.join("tokens-00000.bin"), b"\x07\x07").unwrap();
    let err = check_output_dir(&out, true, &[], false).unwrap_err().to_string();
    assert!(err.contains("tokens-00000.bin is not the bytes"), "{err}");
    std::fs::copy(real.join("tokens-00000.bin"), out.join("tokens-00000.bin")).unwrap();
    let forged = r#"{"files": [["NOTE.txt", "0000"], ["tokenizer.json", "0000"]]}"#;
    std::fs::write(out.join(".ember-replacing.json"), forged).unwrap();
    write(&out.join("tokenizer.json"), b"{}");
    assert!(check_output_dir(&out, true, &[], false).is_err(), "documents.bin is listed by nothing now");
    record().write(&out).unwrap();
    let mut o = opts(&input, &out);
    o.force = true;
    prepare(&o).unwrap();
    assert_eq!(
        names(&out),
        ["NOTE.txt", "documents.bin", "meta.json", "tokenizer.json", "tokens-00000.bin"],
        "the user's files kept, the record gone after a whole replacement"
    );
    assert_eq!(std::fs::read(out.join("NOTE.txt")).unwrap(), b"mine");
    assert_eq!(std::fs::read(out.join("tokenizer.json")).unwrap(), b"{}");
}

#[test]
fn a_foreign_tokenizer_json_is_not_overwritten_and_a_file_is_not_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write(&tmp.path().join("corpus.txt"), b"hello");
    let out = tmp.path().join("out");
    prepare(&opts(&input, &out)).unwrap(); // char: tokenizer.json is not the dataset's
    write(&out.join("tokenizer.json"), b"{}");
    assert!(check_output_dir(&out, true, &[], false).is_ok());
    let err = check_output_dir(&out, true, &[], true).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json that is not part of its Ember dataset"), "{err}");
    let given = out.join("tokenizer.json");
    assert!(check_output_dir(&out, true, &[given], true).is_ok(), "the --tokenizer-file itself");

    let file = write(&tmp.path().join("a_file"), b"x");
    let err = prepare(&opts(&input, &file)).unwrap_err().to_string();
    assert!(err.contains("a_file: it is a file; expected a directory"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

/// A `prepare` killed mid-way leaves its staging directory beside `--out`; the next one removes
/// those of processes that are gone, and nothing else.
#[cfg(target_os = "linux")]
#[test]
fn staging_directories_of_killed_runs_are_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let input = write(&tmp.path().join("corpus.txt"), b"hello");
    // PIDs above Linux's largest (2^22) never exist.
    let dead = tmp.path().join(".ember-prepare-999999999-AbCdEf");
    let alive = tmp.path().join(format!(".ember-prepare-{}-XyZ", std::process::id()));
    let older = tmp.path().join(".ember-prepare-QwErTy");
    for dir in [&dead, &alive, &older] {
        write(&dir.join("tokens-00000.bin"), b"\x00\x00");
    }
    prepare(&opts(&input, &tmp.path().join("out"))).unwrap();
    assert!(!dead.exists(), "a dead process's staging is removed");
    assert!(alive.exists() && older.exists(), "a live process's, and other names, are kept");
}
