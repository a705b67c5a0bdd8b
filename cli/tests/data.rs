//! The data pipeline through the `ember` binary: epochs that resume exactly, SFT masking,
//! document masking, multi-file JSONL corpora, tokenizer checks.

mod common;

use common::*;

/// A tiny GPT over 16-token windows with dropout (so resuming must restore the RNG too).
fn config(extra: &str) -> String {
    format!(
        "data = \"prepared\"\nmax_steps = 18\nmicro_batch_size = 4\neval_every = 0\neval_batches = 1\n\
         log_every = 1\n{extra}\n[model]\npreset = \"tiny\"\ndropout = 0.1\n\
         [optimizer]\nlr = 3e-3\nwarmup_steps = 2\nlr_decay_steps = 18\n"
    )
}

#[test]
fn epochs_resume_exactly_after_a_mid_epoch_or_an_epoch_boundary_stop() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    // 481 characters + EOS = 482 tokens; val fraction 0.2 → 385 train tokens = 24 windows
    // of 16 (+1) tokens, and 97 val tokens = 6 windows.
    let text: String = "To be, or not to be, that is the question.\n".repeat(12).chars().take(481).collect();
    std::fs::write(w.join("corpus.txt"), text).unwrap();
    ok(
        &[
            "prepare",
            "--tokenizer",
            "char",
            "--input",
            "corpus.txt",
            "--out",
            "prepared",
            "--val-fraction",
            "0.2",
        ],
        w,
    );
    std::fs::write(w.join("run.toml"), config("")).unwrap();

    let out = ok(&["train", "--config", "run.toml", "--run-dir", "straight"], w);
    assert!(out.contains("train: 24 rows of 16 tokens, 6 micro-batches per epoch"), "{out}");
    let straight = train_losses(&w.join("straight"));
    assert_eq!(straight.len(), 18, "18 steps = 3 epochs of 6 batches");
    for stop in ["9", "12"] {
        let run = format!("stop{stop}");
        ok(&["train", "--config", "run.toml", "--run-dir", &run, "--set", &format!("max_steps={stop}")], w);
        ok(&["train", "--resume", &run, "--set", "max_steps=18"], w);
        assert_eq!(
            train_losses(&w.join(&run)),
            straight,
            "stopped after step {stop}, resumed in a new process"
        );
    }
}

#[test]
fn sft_data_trains_and_a_batch_with_nothing_to_score_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    let lines: String = (0..40)
        .map(|i| format!("{{\"prompt\": \"Q{i}+1?\\n\", \"response\": \"A: {}\"}}\n", i + 1))
        .collect();
    std::fs::write(w.join("sft.jsonl"), lines).unwrap();
    let out =
        ok(&["prepare", "--tokenizer", "char", "--sft", "--input", "sft.jsonl", "--out", "prepared"], w);
    assert!(out.contains("40 "), "{out}");
    std::fs::write(w.join("run.toml"), config("").replace("max_steps = 18", "max_steps = 3")).unwrap();
    let out = ok(&["train", "--config", "run.toml", "--run-dir", "sft"], w);
    assert!(out.contains("step      3 | loss"), "{out}");

    // Prompts longer than the 16-token context leave nothing to score (16 examples: the val
    // half holds at least one batch of 4, which is checked before the first step).
    let long: String = (0..16)
        .map(|i| {
            format!("{{\"prompt\": \"{}\", \"response\": \"ok\"}}\n", "a very long question ".repeat(2 + i))
        })
        .collect();
    std::fs::write(w.join("long.jsonl"), long).unwrap();
    ok(
        &[
            "prepare",
            "--tokenizer",
            "char",
            "--sft",
            "--input",
            "long.jsonl",
            "--out",
            "long",
            "--val-fraction",
            "0.5",
        ],
        w,
    );
    let err = fails(&["train", "--config", "run.toml", "--run-dir", "long", "--data", "long"], w);
    assert!(err.contains("no scored tokens"), "{err}");
}

#[test]
fn a_multi_file_jsonl_corpus_trains_with_document_masking() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    std::fs::create_dir(w.join("corpus")).unwrap();
    for f in 0..3 {
        let lines: String = (0..30)
            .map(|i| format!("{{\"text\": \"Document {f}.{i} says hello to the world.\"}}\n"))
            .collect();
        std::fs::write(w.join(format!("corpus/part-{f}.jsonl")), lines).unwrap();
    }
    let out = ok(&["prepare", "--tokenizer", "gpt2", "--input", "corpus", "--out", "prepared"], w);
    assert!(out.contains("90 documents"), "{out}");
    let masked = config("document_masking = true").replace("max_steps = 18", "max_steps = 4");
    std::fs::write(w.join("masked.toml"), &masked).unwrap();
    let out = ok(&["train", "--config", "masked.toml", "--run-dir", "masked"], w);
    assert!(out.contains("document masking on"), "{out}");
    std::fs::write(w.join("plain.toml"), masked.replace("document_masking = true", "")).unwrap();
    ok(&["train", "--config", "plain.toml", "--run-dir", "plain"], w);
    // The same rows, attended to differently: documents packed in a row no longer see each other.
    let (m, p) = (train_losses(&w.join("masked")), train_losses(&w.join("plain")));
    assert_eq!(m.len(), 4);
    assert_ne!(m[0].1, p[0].1);
}

#[test]
fn data_tokenized_otherwise_than_the_config_or_the_run_says_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    std::fs::write(w.join("corpus.txt"), "abcdefghij klmnop qrstuvwxyz\n".repeat(40)).unwrap();
    ok(&["prepare", "--tokenizer", "char", "--input", "corpus.txt", "--out", "prepared"], w);
    ok(&["prepare", "--tokenizer", "byte", "--input", "corpus.txt", "--out", "bytes"], w);
    std::fs::write(
        w.join("run.toml"),
        config("tokenizer = \"gpt2\"").replace("max_steps = 18", "max_steps = 2"),
    )
    .unwrap();
    let err = fails(&["train", "--config", "run.toml"], w);
    assert!(err.contains("key `tokenizer`") && err.contains("\"char\""), "{err}");
    std::fs::write(w.join("run.toml"), config("").replace("max_steps = 18", "max_steps = 2")).unwrap();
    ok(&["train", "--config", "run.toml", "--run-dir", "run"], w);
    let err = fails(&["train", "--resume", "run", "--set", "max_steps=4", "--data", "bytes"], w);
    assert!(err.contains("tokenizer"), "{err}");
}
