//! Nothing lost, nothing overwritten: one training at a time in a run directory, a resume only
//! on the run's own data, a torn metrics line survived, a model too large refused up front.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ember_data::{prepare, PrepareOptions, TokenizerKind};
use ember_train::observe::fits;
use ember_train::runner::lock::{host_name, LOCK_FILE};
use ember_train::{train, Controls, RunConfig, RunOptions, TrainError};

fn run(options: RunOptions) -> Result<Vec<String>, TrainError> {
    let mut lines = Vec::new();
    train::<B>(options, Default::default(), &mut |l| lines.push(l.to_string()))?;
    Ok(lines)
}

/// `lines` lines of the tiny corpus, from `first`, prepared with the char tokenizer in `dir`.
fn corpus(dir: &Path, first: usize, lines: usize, reversed: bool) -> PathBuf {
    let mut rows: Vec<String> = (first..first + lines)
        .map(|i| format!("Line {i:03}: the quick brown fox jumps over the lazy dog.\n"))
        .collect();
    if reversed {
        rows.reverse();
    }
    std::fs::create_dir_all(dir).unwrap();
    let input = dir.join("corpus.txt");
    std::fs::write(&input, rows.concat()).unwrap();
    let mut options = PrepareOptions::new(TokenizerKind::Char, vec![input], dir.join("data"));
    options.progress = false;
    prepare(&options).unwrap();
    dir.join("data")
}

/// The run in `run_dir` resumed on `data` for one more step.
fn resume_on(run_dir: &Path, data: &Path) -> Result<Vec<String>, TrainError> {
    let mut config = RunConfig::load(&run_dir.join("config.toml"), &["max_steps=2".into()]).unwrap();
    config.data = Some(data.to_path_buf());
    run(RunOptions::new(config, run_dir).resuming())
}

#[test]
fn a_second_training_in_the_same_directory_is_refused_and_the_first_loses_nothing() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    // The first run holds before its first step until let go.
    let controls = Arc::new(Controls::default());
    controls.pause.store(true, Ordering::SeqCst);
    let first = {
        let options =
            RunOptions::new(tiny_config(&data, &["max_steps=2"]), &run_dir).with_controls(controls.clone());
        std::thread::spawn(move || run(options))
    };
    let metrics = run_dir.join("metrics.jsonl");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(metrics.exists() && std::fs::metadata(&metrics).unwrap().len() > 0) {
        assert!(Instant::now() < deadline && !first.is_finished(), "the first run did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = std::fs::read(&metrics).unwrap();
    for resume in [false, true] {
        let mut options = RunOptions::new(tiny_config(&data, &["max_steps=2"]), &run_dir);
        options.resume = resume;
        let err = run(options).unwrap_err();
        assert!(matches!(err, TrainError::RunDirLocked { .. }), "{err}");
        let holder = format!("process {} on host {}", std::process::id(), host_name());
        let message = err.to_string();
        assert!(message.contains(&holder), "names the holder: {message}");
        assert!(message.contains(&run_dir.join(LOCK_FILE).display().to_string()), "{message}");
    }
    assert_eq!(std::fs::read(&metrics).unwrap(), before, "the first run's metrics are untouched");
    controls.pause.store(false, Ordering::SeqCst);
    first.join().unwrap().unwrap();
    assert!(!run_dir.join(LOCK_FILE).exists(), "the lock is removed when the run ends");
    // Now free: a resume takes it.
    let config = RunConfig::load(&run_dir.join("config.toml"), &["max_steps=3".into()]).unwrap();
    run(RunOptions::new(config, &run_dir).resuming()).unwrap();
}

#[test]
fn a_lock_left_by_a_dead_process_is_taken_over_with_a_warning() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    std::fs::write(run_dir.join(LOCK_FILE), "pid 999999\nhost gone-host\n").unwrap();
    let lines = run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &run_dir)).unwrap();
    let warning = lines.iter().find(|l| l.contains("process 999999 on host gone-host"));
    assert!(warning.is_some_and(|w| w.contains("taking it over")), "{lines:#?}");
}

#[test]
fn resuming_on_data_of_the_same_size_but_other_content_is_refused() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = corpus(&dir.path().join("a"), 0, 200, false);
    let other = corpus(&dir.path().join("b"), 0, 200, true);
    let run_dir = dir.path().join("run");
    run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &run_dir)).unwrap();
    let err = resume_on(&run_dir, &other).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, TrainError::DataChanged { .. }), "{message}");
    assert!(
        message.contains("the data changed since the run started: shard tokens-00000.bin sha256 was "),
        "{message}"
    );
    assert!(!message.contains("train_tokens"), "the sizes agree: {message}");
    assert!(
        message.contains(&other.join("meta.json").display().to_string()),
        "names the data now: {message}"
    );
    assert!(message.contains("data_meta.json"), "names the run's copy: {message}");
    resume_on(&run_dir, &data).unwrap(); // its own data still resumes
}

#[test]
fn resuming_on_data_of_another_size_names_the_counts() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = corpus(&dir.path().join("a"), 0, 200, false);
    let smaller = corpus(&dir.path().join("b"), 0, 150, false);
    let run_dir = dir.path().join("run");
    run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &run_dir)).unwrap();
    let message = resume_on(&run_dir, &smaller).unwrap_err().to_string();
    let was = ember_data::Meta::read(&data).unwrap();
    let now = ember_data::Meta::read(&smaller).unwrap();
    let counts = format!("train_tokens was {}, now {}", was.train_tokens, now.train_tokens);
    assert!(message.contains(&counts), "{message}");
    assert!(message.contains(&format!("val_tokens was {}, now {}", was.val_tokens, now.val_tokens)));
    assert!(!message.contains("tokenizer"), "same tokenizer, not blamed: {message}");
    // Other characters: the tokenizer's difference is named, not "char is not char".
    let shouting = dir.path().join("c");
    std::fs::create_dir_all(&shouting).unwrap();
    std::fs::write(shouting.join("corpus.txt"), "THE QUICK BROWN FOX.\n".repeat(300)).unwrap();
    let mut options =
        PrepareOptions::new(TokenizerKind::Char, vec![shouting.join("corpus.txt")], shouting.join("data"));
    options.progress = false;
    prepare(&options).unwrap();
    let message = resume_on(&run_dir, &shouting.join("data")).unwrap_err().to_string();
    assert!(message.contains("the char tokenizer's characters differ (only the run's: "), "{message}");
    assert!(message.contains("vocab_size was "), "{message}");
}

#[test]
fn a_torn_last_metrics_line_does_not_block_a_resume() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let run_dir = dir.path().join("run");
    run(RunOptions::new(tiny_config(&data, &["max_steps=2"]), &run_dir)).unwrap();
    let metrics = run_dir.join("metrics.jsonl");
    let whole = std::fs::read(&metrics).unwrap();
    let mut torn = whole.clone();
    torn.extend_from_slice(b"{\"kind\":\"train\",\"step\":3,\"loss\":3.95");
    std::fs::write(&metrics, &torn).unwrap();
    let config = RunConfig::load(&run_dir.join("config.toml"), &["max_steps=3".into()]).unwrap();
    let lines = run(RunOptions::new(config, &run_dir).resuming()).unwrap();
    let line = whole.iter().filter(|&&b| b == b'\n').count() + 1;
    let want = format!("{}: line {line}: dropped a torn last line", metrics.display());
    assert!(lines.iter().any(|l| l.starts_with(&want)), "{want} in {lines:#?}");
    let after = std::fs::read(&metrics).unwrap();
    assert!(after.starts_with(&whole), "the records before it are kept byte for byte");
    assert!(ember_train::observe::metrics::read_records(&metrics).unwrap().iter().any(|r| r.step() == 3));
}

/// A GPT-2 of about 87 billion parameters: ~1.4 TB of weights, gradients and AdamW state.
fn giant(data: &Path, overrides: &[&str]) -> RunConfig {
    let mut sets =
        vec!["model.n_layer=48", "model.n_head=96", "model.d_model=12288", "model.block_size=2048"];
    sets.extend_from_slice(overrides);
    tiny_config(data, &sets)
}

#[test]
fn a_model_too_large_for_the_memory_is_refused_before_it_is_allocated() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let start = Instant::now();
    let err = run(RunOptions::new(giant(&data, &[]), dir.path().join("run"))).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(30), "refused up front: {:?}", start.elapsed());
    let TrainError::WontFit { needed_bytes, available_bytes, .. } = &err else { panic!("{err}") };
    assert!(*needed_bytes > 1_000_000_000_000 && needed_bytes > available_bytes, "{err}");
    let message = err.to_string();
    assert!(
        message.starts_with("tiny.toml with --set model.n_layer=48 --set model.n_head=96 --set model.d_model=12288 --set model.block_size=2048: "),
        "names the file and the overrides that sized the run: {message}"
    );
    let gb = |b: &u64| format!("{:.3} GB", *b as f64 / 1e9);
    for part in
        [gb(needed_bytes), gb(available_bytes), "model.n_layer".into(), "--set check_memory=false".into()]
    {
        assert!(message.contains(&part), "{part} in {message}");
    }
    assert!(!dir.path().join("run").exists(), "nothing written for a refused run, not even its directory");
}

#[test]
fn check_memory_false_lets_a_model_too_large_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    let mut config = giant(&data, &["check_memory=false"]);
    config.resolve_vocab(Some(60)).unwrap();
    let one_gb = fits::Available { bytes: 1 << 30, source: "a test".into() };
    assert!(fits::check_against(&config, &one_gb).is_err(), "it does not fit");
    let mut notes = Vec::new();
    fits::check(&config, &mut |l| notes.push(l.to_string())).unwrap();
    if fits::available(&config).is_some() {
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with("check_memory = false: starting although the run needs about ")),
            "{notes:?}"
        );
    }
    assert!(!config.to_toml().contains("check_memory = true"), "the default is not written out");
    assert!(config.to_toml().contains("check_memory = false"), "the override is kept for --resume");
}

#[test]
fn the_main_job_and_the_test_configs_fit() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/shakespeare_char.toml");
    let mut main_job = RunConfig::load(&path, &[]).unwrap();
    main_job.resolve_vocab(Some(66)).unwrap();
    assert!(fits::needed_bytes(&main_job) < 200_000_000, "{}", fits::needed_bytes(&main_job));
    let dir = tempfile::tempdir().unwrap();
    let mut tiny = tiny_config(&dir.path().join("data"), &[]);
    tiny.resolve_vocab(Some(60)).unwrap();
    assert!(fits::needed_bytes(&tiny) < 50_000_000, "{}", fits::needed_bytes(&tiny));
    fits::check(&main_job, &mut |_| {}).unwrap();
}

#[test]
fn a_text_file_given_again_is_checked_against_the_run_dirs_prepared_copy() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let text = |name: &str, first: usize| {
        let rows: String =
            (first..first + 200).map(|i| format!("Line {i:03}: the quick brown fox.\n")).collect();
        let path = dir.path().join(name);
        std::fs::write(&path, rows).unwrap();
        path
    };
    let (a, b) = (text("a.txt", 0), text("b.txt", 500));
    let run_dir = dir.path().join("run");
    let config = |data: &Path, steps: &str| tiny_config(data, &[steps, "eval_every=0", "checkpoint_every=0"]);
    // A run on a.txt that left no checkpoint (RUN_DIR/data holds a.txt's tokens).
    run(RunOptions::new(config(&a, "max_steps=1"), &run_dir)).unwrap();
    std::fs::remove_dir_all(run_dir.join("checkpoints")).unwrap();
    // Started over with b.txt: RUN_DIR/data may be a dataset the user prepared there, so it
    // is replaced only with --force, and left as it was without.
    let before = std::fs::read(run_dir.join("data/meta.json")).unwrap();
    let err = run(RunOptions::new(config(&b, "max_steps=2"), &run_dir)).unwrap_err().to_string();
    let data_dir = run_dir.join("data").display().to_string();
    assert!(
        err.contains(&format!("{data_dir} holds a dataset prepared from another text than {}", b.display()))
            && err.contains("pass --force to replace it"),
        "{err}"
    );
    assert_eq!(std::fs::read(run_dir.join("data/meta.json")).unwrap(), before, "refused: untouched");
    let mut forced = RunOptions::new(config(&b, "max_steps=2"), &run_dir);
    forced.force = true;
    let lines = run(forced).unwrap();
    assert!(lines.iter().any(|l| l.contains("was prepared from another text: preparing")), "{lines:?}");
    let meta = ember_data::Meta::read(&run_dir.join("data")).unwrap();
    assert!(meta.sources[0].path.ends_with("b.txt"), "{:?}", meta.sources);
    // A resume given a.txt is refused: a run continues on its own data.
    let err = run(RunOptions::new(config(&a, "max_steps=3"), &run_dir).resuming()).unwrap_err().to_string();
    assert!(err.contains("a.txt is not the text") && err.contains("resume without --data"), "{err}");
    // The same text again is fine.
    run(RunOptions::new(config(&b, "max_steps=3"), &run_dir).resuming()).unwrap();
}

/// Prepared data in `dir` and `dir/run`, a run of it that stopped before its first checkpoint
/// (its checkpoints removed): (data, run directory).
fn stopped_before_its_first_checkpoint(dir: &Path) -> (PathBuf, PathBuf) {
    let data = prepared_corpus(dir);
    let run_dir = dir.join("run");
    run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &run_dir)).unwrap();
    std::fs::remove_dir_all(run_dir.join("checkpoints")).unwrap();
    (data, run_dir)
}

#[test]
fn a_new_run_replaces_only_the_files_of_an_earlier_run_without_a_checkpoint() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    // An earlier run that stopped before its first checkpoint: its files are replaced.
    let (data, run_dir) = stopped_before_its_first_checkpoint(dir.path());
    let lines = run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &run_dir)).unwrap();
    assert!(
        lines.iter().any(|l| l.contains("stopped before its first checkpoint: starting over")),
        "{lines:?}"
    );

    // The user's own config in the run directory, passed as --config RUN_DIR/config.toml.
    let mine = dir.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    let text = format!(
        "# my experiment\ndata = {data:?}\nmax_steps = 1\nmicro_batch_size = 4\n[model]\npreset = \"tiny\"\n"
    );
    std::fs::write(mine.join("config.toml"), &text).unwrap();
    let config = RunConfig::load(&mine.join("config.toml"), &[]).unwrap();
    let err = run(RunOptions::new(config, &mine)).unwrap_err();
    assert!(matches!(err, TrainError::RunDirForeign { .. }), "{err}");
    assert!(err.to_string().contains("holds config.toml, which no earlier Ember run wrote there"), "{err}");
    assert_eq!(std::fs::read_to_string(mine.join("config.toml")).unwrap(), text, "the user's config is kept");

    // A metrics.jsonl of the user's, without a config.toml.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("metrics.jsonl"), "user content\n").unwrap();
    let err = run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &other)).unwrap_err();
    assert!(err.to_string().contains("holds metrics.jsonl, which no earlier Ember run wrote there"), "{err}");
    assert_eq!(std::fs::read_to_string(other.join("metrics.jsonl")).unwrap(), "user content\n");

    // An Ember record followed by the user's text; the user's data_meta.json beside an Ember
    // config.toml: each file is judged on its own.
    let record =
        std::fs::read_to_string(run_dir.join("metrics.jsonl")).unwrap().lines().next().unwrap().to_string();
    let mixed = format!("{record}\nmy note\n");
    std::fs::write(other.join("metrics.jsonl"), &mixed).unwrap();
    let err = run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &other)).unwrap_err();
    assert!(err.to_string().contains("holds metrics.jsonl,"), "{err}");
    assert_eq!(std::fs::read_to_string(other.join("metrics.jsonl")).unwrap(), mixed);
    std::fs::remove_file(other.join("metrics.jsonl")).unwrap();
    for name in ["config.toml", "written.json"] {
        std::fs::copy(run_dir.join(name), other.join(name)).unwrap();
    }
    std::fs::write(other.join("data_meta.json"), "{\"mine\": 1}").unwrap();
    let err = run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &other)).unwrap_err();
    assert!(err.to_string().contains("holds data_meta.json, which"), "{err}");
    assert_eq!(std::fs::read_to_string(other.join("data_meta.json")).unwrap(), "{\"mine\": 1}");
}

/// Ember records the SHA-256 of the config.toml it wrote (`written.json`): a config edited
/// by hand in one value — still a valid config that Ember could have written — is the user's.
#[test]
fn an_ember_config_edited_in_one_value_is_the_users_and_kept() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (data, run_dir) = stopped_before_its_first_checkpoint(dir.path());
    let path = run_dir.join("config.toml");
    let edited = std::fs::read_to_string(&path).unwrap().replace("seed = 1337", "seed = 1338");
    assert!(edited.contains("seed = 1338"), "{edited}");
    std::fs::write(&path, &edited).unwrap();
    // Exactly what Ember writes for the edited config: only the record tells them apart.
    assert_eq!(RunConfig::load(&path, &[]).unwrap().to_toml(), edited);
    let metrics = std::fs::read(run_dir.join("metrics.jsonl")).unwrap();
    let err = run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &run_dir)).unwrap_err();
    assert!(matches!(err, TrainError::RunDirForeign { .. }), "{err}");
    assert!(
        err.to_string().contains("holds config.toml, which no earlier Ember run wrote there as it is now"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), edited, "the edit is kept");
    assert_eq!(std::fs::read(run_dir.join("metrics.jsonl")).unwrap(), metrics, "nothing else changed");
    // Put back as Ember wrote it, the run starts over.
    std::fs::write(&path, edited.replace("seed = 1338", "seed = 1337")).unwrap();
    run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &run_dir)).unwrap();
}

/// Every file of a run directory, by relative path, with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push((path.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// A requeued job resumes a run that already reached `max_steps`: it succeeds with nothing to
/// train and leaves every file byte for byte as it was, every time; raising max_steps still
/// continues. Also with several replicas.
#[test]
fn resuming_a_finished_run_succeeds_and_changes_nothing() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let data = prepared_corpus(dir.path());
    for devices in ["devices=1", "devices=2"] {
        let run_dir = dir.path().join(devices);
        run(RunOptions::new(tiny_config(&data, &["max_steps=2", devices]), &run_dir)).unwrap();
        let before = snapshot(&run_dir);
        for _ in 0..2 {
            let config = RunConfig::load(&run_dir.join("config.toml"), &[]).unwrap();
            let mut lines = Vec::new();
            let summary =
                train::<B>(RunOptions::new(config, &run_dir).resuming(), Default::default(), &mut |l| {
                    lines.push(l.to_string())
                })
                .unwrap();
            assert!(summary.already_finished && summary.steps == 2, "{devices}: {summary:?}");
            assert!(!summary.stopped_early, "{devices}");
            assert!(lines.iter().all(|l| !l.starts_with("step ")), "{devices}: nothing trained: {lines:?}");
            assert_eq!(snapshot(&run_dir), before, "{devices}: every file byte-identical");
        }
        let config = RunConfig::load(&run_dir.join("config.toml"), &["max_steps=3".into()]).unwrap();
        let summary =
            train::<B>(RunOptions::new(config, &run_dir).resuming(), Default::default(), &mut |_| {})
                .unwrap();
        assert!(!summary.already_finished && summary.steps == 3, "{devices}: {summary:?}");
    }
}

/// A job preempted before its first checkpoint and requeued (`--resume`) starts again from
/// step 0 instead of failing every time, with the records of the lost attempt dropped.
#[test]
fn resuming_a_run_without_a_checkpoint_starts_it_from_step_0() {
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let (data, run_dir) = stopped_before_its_first_checkpoint(dir.path());
    let config = RunConfig::load(&run_dir.join("config.toml"), &[]).unwrap();
    let lines = run(RunOptions::new(config, &run_dir).resuming()).unwrap();
    assert!(
        lines.iter().any(|l| l
            .ends_with("has no checkpoint yet (the run stopped before its first): starting it from step 0")),
        "{lines:?}"
    );
    let straight = dir.path().join("straight");
    run(RunOptions::new(tiny_config(&data, &["max_steps=1"]), &straight)).unwrap();
    let metrics = |d: &Path| -> Vec<(String, u64, Option<f64>)> {
        std::fs::read_to_string(d.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .map(|v| (v["kind"].to_string(), v["step"].as_u64().unwrap(), v["loss"].as_f64()))
            .collect()
    };
    assert_eq!(metrics(&run_dir), metrics(&straight), "one attempt's records, the straight run's losses");
    assert!(run_dir.join("checkpoints/step-00000001").is_dir());
}
