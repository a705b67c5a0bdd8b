//! `ember prepare --out` and `ember export --out` never delete or overwrite files that are
//! not theirs, replace their own only with `--force`, and a failed export leaves the previous
//! model whole.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// nanoGPT's data/shakespeare_char after its prepare.py.
const NANOGPT: [(&str, &[u8]); 4] = [
    ("train.bin", b"\x01\x00\x02\x00"),
    ("val.bin", b"\x03\x00"),
    ("meta.pkl", b"pickle"),
    ("tokenizer.json", b"{}"),
];

fn put(dir: &Path, files: &[(&str, &[u8])]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

fn unchanged(dir: &Path, files: &[(&str, &[u8])]) {
    for (name, bytes) in files {
        assert_eq!(std::fs::read(dir.join(name)).unwrap(), *bytes, "{name} changed");
    }
}

fn prepare<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["prepare", "--tokenizer", "char", "--input", "corpus.txt", "--out", out];
    args.extend(extra);
    args
}

fn export(out: &str, force: bool) -> Vec<&str> {
    let mut args = vec!["export", "--run", "run", "--format", "hf-gpt2", "--out", out];
    args.extend(force.then_some("--force"));
    args
}

#[test]
fn prepare_refuses_a_directory_of_other_files_and_replaces_a_dataset_only_with_force() {
    let dir = workdir(); // corpus.txt, prepared/ (an Ember dataset)
    let w = dir.path();
    put(&w.join("nano"), &NANOGPT);
    for extra in [&[][..], &["--force"]] {
        let err = fails(&prepare("nano", extra), w);
        assert!(
            err.contains("output directory nano: it is not empty and holds no Ember dataset (found meta.pkl, tokenizer.json, train.bin, val.bin)"),
            "{err}"
        );
    }
    // --download checks before downloading (no network needed to be refused).
    let err = fails(&["prepare", "--tokenizer", "char", "--download", "tinyshakespeare", "--out", "nano"], w);
    assert!(err.contains("holds no Ember dataset"), "{err}");
    unchanged(&w.join("nano"), &NANOGPT);
    assert_eq!(std::fs::read_dir(w.join("nano")).unwrap().count(), 4, "nothing added");

    std::fs::write(w.join("prepared/README"), "my notes").unwrap();
    let err = fails(&prepare("prepared", &[]), w);
    assert!(err.contains("output directory prepared: it already holds an Ember dataset (documents.bin, meta.json, tokens-00000.bin); pass --force to replace it"), "{err}");
    let out = ok(&prepare("prepared", &["--force"]), w);
    assert!(out.contains("prepared prepared:"), "{out}");
    assert_eq!(std::fs::read_to_string(w.join("prepared/README")).unwrap(), "my notes");
}

#[test]
fn export_writes_the_hugging_face_layout_and_overwrites_only_with_force() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "max_steps=2"], w);
    let out = ok(&export("hf", false), w);
    assert_eq!(out, "wrote hf/model.safetensors\nwrote hf/config.json\n");
    let config = std::fs::read_to_string(w.join("hf/config.json")).unwrap();
    assert!(config.contains("GPT2LMHeadModel"), "{config}");
    // Nothing but the two files (no temp file left).
    let mut names: Vec<String> = std::fs::read_dir(w.join("hf"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["config.json", "model.safetensors"]);

    let err = fails(&export("hf", false), w);
    assert!(
        err.contains(
            "--out hf: hf/model.safetensors and hf/config.json already exist; pass --force to overwrite"
        ),
        "{err}"
    );
    ok(&export("hf", true), w);

    // An unrelated config.json beside the output is not overwritten (directory or file form).
    put(&w.join("mine"), &[("config.json", b"{\"mine\": 1}")]);
    let err = fails(&export("mine", false), w);
    assert!(err.contains("--out mine: mine/config.json already exists; pass --force"), "{err}");
    let err = fails(&export("mine/weights.safetensors", false), w);
    assert!(err.contains("mine/config.json already exists"), "{err}");
    unchanged(&w.join("mine"), &[("config.json", b"{\"mine\": 1}")]);
    assert_eq!(std::fs::read_dir(w.join("mine")).unwrap().count(), 1, "nothing written");
    std::fs::write(w.join("a_file"), "x").unwrap();
    let err = fails(&export("a_file", false), w);
    assert!(err.contains("--out a_file: is a file; expected a directory"), "{err}");
}

#[cfg(unix)]
#[test]
fn a_failed_export_leaves_the_previous_model_whole() {
    use std::os::unix::process::CommandExt;
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "max_steps=2"], w);
    ok(&["export", "--run", "run", "--format", "hf-gpt2", "--out", "hf"], w);
    let before = std::fs::read(w.join("hf/model.safetensors")).unwrap();
    // A file-size limit of half the model: writing the weights fails part way.
    let limit = before.len() as libc::rlim_t / 2;
    let mut command = Command::new(env!("CARGO_BIN_EXE_ember"));
    command.args(["export", "--run", "run", "--format", "hf-gpt2", "--out", "hf", "--force"]).current_dir(w);
    // SAFETY: only setrlimit(2), async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let rlim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
            match libc::setrlimit(libc::RLIMIT_FSIZE, &rlim) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
    let out = command.output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    let after = std::fs::read(w.join("hf/model.safetensors")).unwrap();
    assert!(after == before, "the old model was damaged: {} bytes, {} before", after.len(), before.len());
    if out.status.code() == Some(1) {
        // Reported as an error (SIGXFSZ ignored): the temp file was removed.
        assert_eq!(std::fs::read_dir(w.join("hf")).unwrap().count(), 2, "{out:?}");
    }
}
