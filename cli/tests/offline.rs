//! The main job works offline: Tiny Shakespeare ships in the repository, byte-identical to
//! what `--download tinyshakespeare` fetches, and the README's main command uses it.

mod common;

use std::path::Path;

use common::*;

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn the_shipped_corpus_is_the_download_and_the_main_command_uses_it() {
    let corpus = repo().join("examples/data/tinyshakespeare.txt");
    assert_eq!(std::fs::metadata(&corpus).unwrap().len(), 1_115_394, "{}", corpus.display());
    let dir = tempfile::tempdir().unwrap();
    let out = ok(
        &["prepare", "--tokenizer", "char", "--input", corpus.to_str().unwrap(), "--out", "data"],
        dir.path(),
    );
    assert!(out.contains("vocabulary 66"), "{out}");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("data/meta.json")).unwrap()).unwrap();
    assert_eq!(
        meta["sources"][0]["sha256"],
        ember_data::TINYSHAKESPEARE_SHA256,
        "the file differs from the download"
    );

    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let main = readme.lines().find(|l| l.starts_with("cargo build --release && ")).expect("the main command");
    assert!(
        main.contains("prepare --tokenizer char --input examples/data/tinyshakespeare.txt --out "),
        "the main command needs no network: {main}"
    );
}
