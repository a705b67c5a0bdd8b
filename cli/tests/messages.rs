//! Error messages name the flag or key, the value and what was expected: `--set` values of
//! the wrong type, a run directory that is a file, negative numbers given to numeric flags.

mod common;

use common::*;

/// Runs `ember args`, which clap must refuse (status 2); returns its stderr.
fn refused_by_clap(args: &[&str], cwd: &std::path::Path) -> String {
    let out = ember(args, cwd);
    assert_eq!(out.status.code(), Some(2), "ember {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_set_value_of_the_wrong_type_names_the_set_the_key_and_the_type() {
    let dir = workdir();
    let w = dir.path();
    let cases = [
        (
            "model.d_model=abc",
            "--set model.d_model=abc: key `model.d_model`: expected a non-negative integer, found \"abc\"",
        ),
        ("max_steps=-5", "--set max_steps=-5: key `max_steps`: expected a non-negative integer, found -5"),
        (
            "optimizer.lr=fast",
            "--set optimizer.lr=fast: key `optimizer.lr`: expected a number, found \"fast\"",
        ),
        // A key below the one the error names (an unknown table, a number given a table).
        (
            "model.n_layer.x=1",
            "--set model.n_layer.x=1: key `model.n_layer`: expected a non-negative integer, found map",
        ),
    ];
    for (set, message) in cases {
        let err = fails(&["train", "--config", "tiny.toml", "--set", set], w);
        assert_eq!(err.trim_end(), format!("error: {message}"));
    }
}

#[test]
fn a_data_parallel_flag_is_named_as_given_not_as_its_override() {
    let dir = workdir();
    let w = dir.path();
    let err = fails(&["train", "--config", "tiny.toml", "--nodes", "2", "--node-rank", "5"], w);
    assert_eq!(
        err.trim_end(),
        "error: --node-rank 5: key `parallel.node_rank`: must be below parallel.nodes (2), got 5"
    );
    // The wrong key's own --set is named before the flag of the key it is checked against.
    let err = fails(&["train", "--config", "tiny.toml", "--set", "parallel.node_rank=50", "--nodes", "5"], w);
    assert_eq!(
        err.trim_end(),
        "error: --set parallel.node_rank=50: key `parallel.node_rank`: must be below parallel.nodes (5), got 50"
    );
    // A --set of the same key as a flag, one digit longer, keeps its own name.
    let big = ["--set", "model.d_model=1000000", "--set", "model.n_head=1"];
    let err = fails(
        &[&["train", "--config", "tiny.toml", "--set", "devices=20", "--devices", "2"][..], &big].concat(),
        w,
    );
    assert!(
        err.starts_with("error: tiny.toml with --set devices=20 --set model.d_model=1000000 --set model.n_head=1 --devices 2: the run needs"),
        "{err}"
    );
    let err = fails(
        &[
            "train",
            "--config",
            "tiny.toml",
            "--nodes",
            "2",
            "--set",
            "parallel.node_rank=20",
            "--node-rank",
            "2",
        ],
        w,
    );
    assert_eq!(
        err.trim_end(),
        "error: --node-rank 2: key `parallel.node_rank`: must be below parallel.nodes (2), got 2"
    );
    let err = fails(
        &["train", "--config", "tiny.toml", "--set", "parallel.nodes=5", "--set", "parallel.node_rank=50"],
        w,
    );
    assert!(err.starts_with("error: --set parallel.node_rank=50: key"), "{err}");
    assert!(!w.join("runs").exists(), "nothing written");
}

#[test]
fn sizes_beyond_the_machine_are_refused_by_every_command_before_allocating() {
    let dir = workdir();
    let w = dir.path();
    let devices = "devices=4611686018427387904";
    for command in ["estimate", "bench", "train"] {
        let err = fails(&[command, "--config", "tiny.toml", "--set", devices], w);
        assert_eq!(
            err.trim_end(),
            format!("error: --set {devices}: key `devices`: 4611686018427387904 replicas in one process: at most 4096 (one per device of a machine; more machines: parallel.nodes)")
        );
    }
    let err = fails(&["train", "--config", "tiny.toml", "--devices", "5000"], w);
    assert!(err.starts_with("error: --devices 5000: key `devices`: 5000 replicas"), "{err}");
    // 12 TB of weights: ember bench checks the memory as training does.
    let wide = ["--set", "model.d_model=1000000", "--set", "model.n_head=1"];
    let err = fails(&[&["bench", "--config", "tiny.toml", "--steps", "1"][..], &wide].concat(), w);
    assert!(
        err.starts_with(
            "error: tiny.toml with --set model.d_model=1000000 --set model.n_head=1: the run needs about"
        ),
        "{err}"
    );
    assert!(!w.join("runs").exists(), "nothing written");
}

#[test]
fn a_run_directory_that_is_a_file_says_so() {
    let dir = workdir();
    let w = dir.path();
    std::fs::write(w.join("notes.txt"), "mine").unwrap();
    let err = fails(&["train", "--config", "tiny.toml", "--run-dir", "notes.txt"], w);
    assert_eq!(err.trim_end(), "error: --run-dir notes.txt is a file; expected a directory");
    let err = fails(&["train", "--config", "tiny.toml", "--run-dir", "notes.txt/run"], w);
    assert_eq!(err.trim_end(), "error: --run-dir notes.txt/run: notes.txt is a file; expected a directory");
    let err = fails(&["train", "--resume", "notes.txt"], w);
    assert_eq!(err.trim_end(), "error: --resume notes.txt is a file; expected a directory");
    let err = fails(&["train", "--resume", "nowhere"], w);
    assert_eq!(
        err.trim_end(),
        "error: --resume nowhere: no such directory: expected the --run-dir of an earlier `ember train`"
    );
    std::fs::create_dir(w.join("empty")).unwrap();
    let err = fails(&["train", "--resume", "empty"], w);
    assert_eq!(
        err.trim_end(),
        "error: --resume empty: not a run directory (it has no config.toml): expected the --run-dir of an earlier `ember train`"
    );
    std::fs::create_dir(w.join("runs")).unwrap();
    std::fs::write(w.join("runs/tiny"), "mine").unwrap();
    let err = fails(&["train", "--config", "tiny.toml"], w);
    assert_eq!(err.trim_end(), "error: the default --run-dir runs/tiny is a file; expected a directory");
    assert_eq!(std::fs::read_to_string(w.join("notes.txt")).unwrap(), "mine");
}

#[test]
fn negative_numbers_reach_the_checks_of_numeric_flags() {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    let err = fails(&["sample", "--run", "run", "--temperature", "-1"], w);
    assert_eq!(err.trim_end(), "error: --temperature -1: expected a number ≥ 0 (0 = greedy), e.g. 0.8");
    let err = fails(&["sample", "--run", "run", "--temperature", "NaN"], w);
    assert!(err.contains("--temperature NaN: expected a number ≥ 0"), "{err}");
    let err = fails(
        &["prepare", "--tokenizer", "char", "--input", "x.txt", "--out", "o", "--val-fraction", "-0.1"],
        w,
    );
    assert_eq!(err.trim_end(), "error: --val-fraction -0.1: expected a fraction in [0, 1), e.g. 0.1");
    let err = fails(&["estimate", "--config", "x.toml", "--mfu", "-0.5"], w);
    assert!(err.contains("--mfu -0.5: expected a fraction in (0, 1]"), "{err}");
    // Integer flags: the value is named, not taken for an unknown flag.
    for (args, flag) in [
        (&["sample", "--run", "run", "--top-k", "-3"][..], "'--top-k <TOP_K>'"),
        (&["sample", "--run", "run", "--max-new-tokens", "-3"], "'--max-new-tokens <MAX_NEW_TOKENS>'"),
        (&["eval", "--run", "run", "--batches", "-1"], "'--batches <BATCHES>'"),
        (&["train", "--config", "x.toml", "--devices", "-2"], "'--devices <N>'"),
    ] {
        let err = refused_by_clap(args, w);
        assert!(err.contains(&format!("invalid value '{}' for {flag}", args[args.len() - 1])), "{err}");
    }
}

/// `--tui` and `ember watch` without a terminal (a new session, so no controlling tty; stdin
/// from /dev/null, output piped): an error that says so, not ratatui's panic, and no run
/// directory created before it.
#[cfg(unix)]
#[test]
fn the_dashboard_without_a_terminal_is_an_error() {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let dir = workdir();
    let w = dir.path();
    let without_tty = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ember"));
        command.args(args).current_dir(w).stdin(Stdio::null());
        // SAFETY: setsid only detaches the child from this terminal; it runs between fork and
        // exec and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        command.output().expect("ember runs")
    };
    let expected = "error: the dashboard needs a terminal, and this one cannot be opened";
    let out = without_tty(&["train", "--config", "tiny.toml", "--run-dir", "run", "--tui"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(expected) && stderr.contains("run without --tui"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!w.join("run").exists(), "the run directory was created");
    // `ember watch` on a run: stdout is not a terminal, so plain lines (no dashboard).
    ok(&["train", "--config", "tiny.toml", "--run-dir", "done", "--no-tui"], w);
    let out = without_tty(&["watch", "done"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("step      6"), "{out:?}");
}

#[test]
fn devices_are_refused_when_listed_twice_and_a_long_list_is_not_echoed_whole() {
    let dir = workdir();
    let w = dir.path();
    let err = fails(&["train", "--config", "tiny.toml", "--set", "devices=[0, 0]"], w);
    assert_eq!(
        err.trim_end(),
        "error: --set devices=[0, 0]: key `devices`: device 0 is listed twice (entries 0 and 1): each replica needs a device of its own (several CPU replicas: a count, e.g. devices = 2)"
    );
    let list: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
    let set = format!("devices=[{}]", list.join(","));
    for command in ["train", "estimate", "bench"] {
        let err = fails(&[command, "--config", "tiny.toml", "--set", &set], w);
        assert!(err.len() < 400, "{command}: {} characters: {err}", err.len());
        assert!(
            err.starts_with("error: --set devices=[0,1,2,3,")
                && err.contains(&format!(
                    "… ({} characters): key `devices`: 10000 replicas in one process: at most 4096",
                    set.len() + 6
                )),
            "{command}: {err}"
        );
    }
    assert!(!w.join("runs").exists(), "nothing written");
}

#[test]
fn init_from_a_directory_without_weights_says_so() {
    let dir = workdir();
    let w = dir.path();
    std::fs::create_dir(w.join("junk")).unwrap();
    std::fs::write(w.join("junk/notes.txt"), "mine").unwrap();
    let err = fails(&["train", "--config", "tiny.toml", "--set", "init_from=\"junk\""], w);
    assert!(
        err.starts_with("error: --set init_from=\"junk\": key `init_from`: junk: a directory without model.safetensors: expected Hugging Face weights")
            && err.contains("ember export --run RUN_DIR --out DIR")
            && !err.contains("os error"),
        "{err}"
    );
    // A directory holding model.safetensors (as `ember export` writes it) is its weights.
    ok(&["train", "--config", "tiny.toml", "--run-dir", "first", "--set", "max_steps=2", "--no-tui"], w);
    ok(&["export", "--run", "first", "--format", "hf-gpt2", "--out", "hf"], w);
    let out = ok(
        &[
            "train",
            "--config",
            "tiny.toml",
            "--run-dir",
            "tuned",
            "--set",
            "init_from=\"hf\"",
            "--set",
            "max_steps=1",
            "--no-tui",
        ],
        w,
    );
    assert!(out.contains("initialized from hf"), "{out}");
}

#[test]
fn counts_of_one_read_in_the_singular() {
    let dir = workdir();
    let w = dir.path();
    let out = ok(
        &[
            "train",
            "--config",
            "tiny.toml",
            "--run-dir",
            "one",
            "--set",
            "model.block_size=1",
            "--set",
            "max_steps=1",
            "--no-tui",
        ],
        w,
    );
    assert!(out.contains("global batch: 4 sequences × 1 token = 4 tokens per optimizer step"), "{out}");
    assert!(out.contains(" rows of 1 token, "), "{out}");
    // "1 tokens" as a count of its own, not the tail of a bigger number such as "3741 tokens/s".
    let plural_one = out
        .match_indices("1 tokens")
        .any(|(i, _)| !out[..i].ends_with(|c: char| c.is_ascii_digit() || c == '.' || c == ','));
    assert!(!plural_one, "{out}");
    std::fs::write(w.join("a.txt"), "a").unwrap();
    let out = ok(&["prepare", "--tokenizer", "char", "--input", "a.txt", "--out", "a"], w);
    assert!(out.contains("read 1 byte from 1 file"), "{out}");
    assert!(out.contains("1 document, 2 tokens (1 train + 1 val)"), "{out}");
}

/// `--data TEXT` over a run directory whose `data/` holds a dataset prepared from another text
/// (perhaps by the user, with `ember prepare --out RUN_DIR/data`): refused, naming both, until
/// `--force`; errors about the data name `--data` as given.
#[test]
fn a_dataset_prepared_from_another_text_is_replaced_only_with_force() {
    let dir = workdir();
    let w = dir.path();
    std::fs::write(w.join("other.txt"), "ROMEO:\nAnother text entirely, of another play.\n").unwrap();
    ok(&["prepare", "--tokenizer", "char", "--input", "other.txt", "--out", "run/data"], w);
    let meta = std::fs::read(w.join("run/data/meta.json")).unwrap();
    let err =
        fails(&["train", "--config", "tiny.toml", "--run-dir", "run", "--data", "corpus.txt", "--no-tui"], w);
    assert_eq!(
        err.trim_end(),
        "error: --data corpus.txt: key `data`: run/data holds a dataset prepared from another text than corpus.txt (see its meta.json `sources`), which preparing corpus.txt would replace: pass --force to replace it, or choose another --run-dir"
    );
    assert_eq!(std::fs::read(w.join("run/data/meta.json")).unwrap(), meta, "the dataset is untouched");
    let out = ok(
        &[
            "train",
            "--config",
            "tiny.toml",
            "--run-dir",
            "run",
            "--data",
            "corpus.txt",
            "--force",
            "--set",
            "max_steps=1",
            "--no-tui",
        ],
        w,
    );
    assert!(
        out.contains("run/data was prepared from another text: preparing corpus.txt again (--force)"),
        "{out}"
    );
    let err = fails(&["train", "--config", "tiny.toml", "--run-dir", "bad", "--data", "nowhere"], w);
    assert_eq!(
        err.trim_end(),
        "error: --data nowhere: key `data`: nowhere: no such file or directory; expected a prepared data directory (`ember prepare --out DIR`) or a UTF-8 text file"
    );
}

/// A resume given a text file, of a run trained on a prepared directory: refused before the text
/// is prepared into the run directory.
#[test]
fn a_resume_on_a_text_the_run_was_not_trained_on_writes_nothing() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "max_steps=2", "--no-tui"], w);
    let err = fails(&["train", "--resume", "run", "--data", "corpus.txt", "--set", "max_steps=3"], w);
    assert_eq!(
        err.trim_end(),
        "error: --data corpus.txt: key `data`: this run was not trained on a text prepared into run/data (it holds no dataset): a run continues on its own data; resume without --data corpus.txt"
    );
    assert!(!w.join("run/data").exists(), "nothing prepared");
}
