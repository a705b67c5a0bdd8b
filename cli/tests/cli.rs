//! The `ember` binary used as a user would: separate processes, files on disk.

mod common;

use common::*;
use std::path::{Path, PathBuf};

fn losses(run_dir: PathBuf) -> Vec<(u64, String, f64)> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let kind = v["kind"].as_str().unwrap().to_string();
            let loss = v.get("loss").or_else(|| v.get("val_loss")).unwrap().as_f64().unwrap();
            (v["step"].as_u64().unwrap(), kind, loss)
        })
        .collect()
}

#[test]
fn six_steps_equal_three_steps_then_resume_in_a_new_process() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "straight"], w);
    ok(&["train", "--config", "tiny.toml", "--run-dir", "split", "--set", "max_steps=3"], w);
    let resumed = ok(&["train", "--resume", "split", "--set", "max_steps=6"], w);
    assert!(resumed.contains("resumed from"), "{resumed}");
    let (straight, split) = (losses(w.join("straight")), losses(w.join("split")));
    assert_eq!(straight.iter().filter(|r| r.1 == "train").count(), 6);
    assert_eq!(straight, split, "bit-identical losses after resuming");
}

/// fp16-mixed (half-precision matmuls, dynamic loss scaling): the loss scaler's state is in
/// the checkpoint, so a resumed run's losses and loss scales equal the straight run's bit for
/// bit; each record carries the scale.
#[test]
fn fp16_mixed_resumes_exactly_with_its_loss_scale() {
    let dir = workdir();
    let w = dir.path();
    let fp16 = ["--set", "precision=\"fp16-mixed\""];
    let run = |args: &[&str]| ok(&[args, &fp16[..]].concat(), w);
    let out = run(&["train", "--config", "tiny.toml", "--run-dir", "straight"]);
    assert!(out.contains("precision: fp16-mixed") && out.contains("| loss scale 65536"), "{out}");
    run(&["train", "--config", "tiny.toml", "--run-dir", "split", "--set", "max_steps=3"]);
    let state = std::fs::read_to_string(w.join("split/checkpoints/step-00000003/state.json")).unwrap();
    assert!(state.contains("\"loss_scaler\"") && state.contains("\"good_steps\": 3"), "{state}");
    run(&["train", "--resume", "split", "--set", "max_steps=6"]);
    let scales = |run_dir: &str| -> Vec<(u64, f64, f64)> {
        std::fs::read_to_string(w.join(run_dir).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter(|v| v["kind"] == "train")
            .map(|v| {
                (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap(), v["loss_scale"].as_f64().unwrap())
            })
            .collect()
    };
    let straight = scales("straight");
    assert_eq!(straight.len(), 6);
    assert!(straight.iter().all(|r| r.2 == 65536.0));
    assert_eq!(straight, scales("split"));
}

#[test]
fn train_prints_the_batch_the_census_and_one_line_per_step() {
    let dir = workdir();
    let out = ok(
        &[
            "train",
            "--config",
            "tiny.toml",
            "--run-dir",
            "run",
            "--set",
            "max_steps=2",
            "--set",
            "accumulation_steps=2",
        ],
        dir.path(),
    );
    assert!(out.contains("global batch: 8 sequences × 16 tokens = 128 tokens per optimizer step"), "{out}");
    assert!(out.contains("weight decay on 10 tensors"), "{out}");
    assert!(out.contains("step      1 | loss ") && out.contains("step      2 | loss "), "{out}");
    assert!(out.contains("eval      2 | val loss"), "{out}");
}

#[test]
fn eval_and_sample_use_the_latest_checkpoint() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "max_steps=2"], w);
    let eval = ok(&["eval", "--run", "run"], w);
    assert!(eval.starts_with("step 2: train loss ") && eval.contains("val loss"), "{eval}");
    assert!(eval.trim_end().ends_with("batches each, fp32"), "the precision is named: {eval}");
    // More batches than a split has: the whole split once, said so, and its loss is the loss
    // of exactly that many batches.
    let out = ember(&["eval", "--run", "run", "--batches", "100000"], w);
    let (all, note) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let val = |eval: &str| eval.split("val loss ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    let counts: Vec<&str> = all.split(" over ").nth(1).unwrap().split(' ').collect();
    assert!(out.status.success() && counts[1] == "train" && counts[4] == "val", "{all}");
    assert!(
        note.contains(&format!("the val split has {} batches, fewer than the 100000 asked for", counts[3])),
        "{note}"
    );
    let exact = ok(&["eval", "--run", "run", "--batches", counts[3]], w);
    assert_eq!(val(&all), val(&exact), "{all} vs {exact}");
    let bf16 = ["--run-dir", "bf16", "--set", "max_steps=1", "--set", "precision=\"bf16-mixed\""];
    ok(&[&["train", "--config", "tiny.toml"][..], &bf16].concat(), w);
    let eval = ok(&["eval", "--run", "bf16"], w);
    assert!(eval.trim_end().ends_with("batches each, bf16-mixed"), "{eval}");
    let args = ["sample", "--run", "run", "--prompt", "ALICE:", "--max-new-tokens", "40", "--seed", "3"];
    let a = ok(&args, w);
    assert!(a.starts_with("ALICE:"), "{a}");
    // One character per generated token (the end-of-text token prints as one marker).
    let generated = a.trim_end_matches('\n').replace("<|endoftext|>", "¶");
    assert_eq!(generated.chars().count(), "ALICE:".len() + 40, "{a:?}");
    assert_eq!(a, ok(&args, w), "same seed, same text");
    let greedy = ["sample", "--run", "run", "--prompt", "A", "--max-new-tokens", "10", "--temperature", "0"];
    assert_eq!(ok(&greedy, w), ok(&greedy, w));
}

/// A validation split smaller than one micro-batch is an error naming the split, before any
/// step; eval_batches above the split's batches is a note and the run goes on.
#[test]
fn a_val_split_smaller_than_a_batch_is_named() {
    let dir = workdir();
    let w = dir.path();
    let err =
        fails(&["train", "--config", "tiny.toml", "--run-dir", "big", "--set", "micro_batch_size=100"], w);
    assert!(err.contains("the val split has ") && err.contains("fewer than one batch of 100"), "{err}");
    assert!(!w.join("big/metrics.jsonl").exists() || train_losses(&w.join("big")).is_empty(), "no step ran");
    let out = ok(
        &[
            "train",
            "--config",
            "tiny.toml",
            "--run-dir",
            "many",
            "--set",
            "max_steps=1",
            "--set",
            "eval_batches=1000",
        ],
        w,
    );
    assert!(
        out.contains("note: the val split has ") && out.contains("fewer than eval_batches = 1000"),
        "{out}"
    );
    // A resume refused for it leaves the run directory as it was, and resumes after.
    let read = |f: &str| std::fs::read(w.join("many").join(f)).unwrap();
    let (config, metrics) = (read("config.toml"), read("metrics.jsonl"));
    let err =
        fails(&["train", "--resume", "many", "--set", "max_steps=2", "--set", "micro_batch_size=100"], w);
    assert!(err.contains("the val split has "), "{err}");
    assert_eq!((read("config.toml"), read("metrics.jsonl")), (config, metrics), "the run is untouched");
    ok(&["train", "--resume", "many", "--set", "max_steps=2"], w);
}

#[test]
fn config_errors_name_the_file_and_the_key() {
    let dir = workdir();
    let w = dir.path();
    std::fs::write(w.join("typo.toml"), CONFIG.replace("max_steps", "max_step")).unwrap();
    let err = fails(&["train", "--config", "typo.toml"], w);
    assert!(err.contains("typo.toml") && err.contains("unknown field `max_step`"), "{err}");
    let err = fails(&["train", "--config", "tiny.toml", "--set", "model.n_head=3"], w);
    assert!(
        err.contains("--set model.n_head=3: key `model.d_model`: must be divisible by n_head (3)"),
        "{err}"
    );
    let err = fails(&["train", "--config", "tiny.toml", "--set", "optimizer.lr=-1"], w);
    assert!(err.contains("key `optimizer.lr`"), "{err}");
}

#[test]
fn bad_addresses_and_vocabularies_say_what_was_expected() {
    let dir = workdir();
    let w = dir.path();
    let out = ember(&["train", "--config", "tiny.toml", "--coordinator", "10.0.0.1"], w);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a usage error: {stderr}");
    assert!(
        stderr.contains(
            "'--coordinator <HOST:PORT>': expected HOST:PORT (PORT from 1 to 65533), got \"10.0.0.1\""
        ),
        "{stderr}"
    );
    std::fs::write(w.join("net.toml"), format!("{CONFIG}[parallel]\ncoordinator = \"head-node\"\n")).unwrap();
    let err = fails(&["train", "--config", "net.toml"], w);
    assert!(
        err.contains(
            "net.toml: key `parallel.coordinator`: expected HOST:PORT (PORT from 1 to 65533), got \"head-node\""
        ),
        "{err}"
    );
    let err = fails(&["coordinator", "--bind", "65535"], w);
    assert!(err.contains("--bind \"65535\": expected [HOST:]PORT (PORT from 1 to 65533)"), "{err}");
    let err = fails(&["train", "--config", "tiny.toml", "--set", "model.vocab_size=5"], w);
    assert!(
        err.contains("--set model.vocab_size=5: key `model.vocab_size`: 5 is smaller than the prepared data's vocabulary ("),
        "{err}"
    );
    let out = ember(&["eval", "--run", "no-run", "--batches", "0"], w);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batches 0: expected at least 1"), "{out:?}");
}

#[test]
fn missing_inputs_are_errors_not_panics() {
    let dir = workdir();
    let w = dir.path();
    let err = fails(&["prepare", "--tokenizer", "char", "--input", "nope.txt", "--out", "x"], w);
    assert!(err.contains("nope.txt"), "{err}");
    let err = fails(&["train", "--config", "tiny.toml", "--data", "missing-dir"], w);
    assert!(err.contains("missing-dir"), "{err}");
    let err = fails(&["train", "--resume", "no-such-run"], w);
    assert!(err.contains("no-such-run"), "{err}");
    let err = fails(&["sample", "--run", "no-such-run"], w);
    assert!(err.contains("not a run directory"), "{err}");
}

#[test]
fn a_prompt_outside_the_vocabulary_is_an_error() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "max_steps=1"], w);
    let err = fails(&["sample", "--run", "run", "--prompt", "Zebra€"], w);
    assert!(err.contains('€') || err.contains('Z'), "{err}");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn asking_for_cuda_in_a_cpu_build_is_a_clear_error() {
    let dir = workdir();
    let err = fails(&["train", "--config", "tiny.toml", "--set", "backend=\"cuda\""], dir.path());
    assert!(err.contains("built without CUDA support"), "{err}");
}

#[test]
fn a_text_file_as_data_is_prepared_into_the_run() {
    let dir = workdir();
    let w = dir.path();
    ok(
        &[
            "train",
            "--config",
            "tiny.toml",
            "--data",
            "corpus.txt",
            "--run-dir",
            "run",
            "--set",
            "max_steps=1",
        ],
        w,
    );
    assert!(w.join("run/data/meta.json").exists());
    let config = std::fs::read_to_string(w.join("run/config.toml")).unwrap();
    assert!(config.contains("run/data"), "the resolved config names the prepared directory: {config}");
}

/// Exports `run`'s weights as `format` and checks that they, loaded through a config's
/// `init_from` (with `config` as the rest of it), evaluate and sample exactly like the run.
fn exported_weights_equal_the_run(w: &Path, config: &str, run: &str, format: &str) {
    let file = format!("{run}.safetensors");
    let out = ok(&["export", "--run", run, "--format", format, "--out", &file], w);
    assert!(out.contains(&format!("wrote {file}")), "{out}");
    let hf_config = std::fs::read_to_string(w.join("config.json")).unwrap();
    let architecture = if format == "hf-gpt2" { "GPT2LMHeadModel" } else { "LlamaForCausalLM" };
    assert!(hf_config.contains(architecture), "{hf_config}");
    std::fs::write(w.join("from_hf.toml"), format!("init_from = {file:?}\n{config}")).unwrap();
    let strip_step = |text: String| text.split_once(':').map(|(_, rest)| rest.to_string()).unwrap_or(text);
    let (from_run, from_file) =
        (ok(&["eval", "--run", run], w), ok(&["eval", "--config", "from_hf.toml"], w));
    assert_eq!(strip_step(from_run), strip_step(from_file));
    let greedy = ["--prompt", "ALICE", "--max-new-tokens", "5", "--temperature", "0"];
    let sample = |source: [&str; 2]| ok(&[&["sample"][..], &source, &greedy].concat(), w);
    assert_eq!(sample(["--run", run]), sample(["--config", "from_hf.toml"]));
}

#[test]
fn exported_gpt2_weights_reload_and_start_a_new_run_where_the_old_one_ended() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "max_steps=3"], w);
    exported_weights_equal_the_run(w, CONFIG, "run", "hf-gpt2");
    let err = fails(&["export", "--run", "run", "--format", "hf-llama", "--out", "x.safetensors"], w);
    assert!(err.contains("--format hf-gpt2"), "{err}");

    // Fine-tuning from the exported file: the new run's step-0 evaluation equals the old run's last.
    let init = "init_from=\"run.safetensors\"";
    ok(&["train", "--config", "tiny.toml", "--run-dir", "tuned", "--set", "max_steps=1", "--set", init], w);
    let evals = |run: &str| -> Vec<(u64, f64)> {
        losses(w.join(run)).into_iter().filter(|r| r.1 == "eval").map(|r| (r.0, r.2)).collect()
    };
    let (old, new) = (evals("run"), evals("tuned"));
    assert_eq!(old.last().unwrap().1, new[0].1, "old {old:?} new {new:?}");
    assert_eq!(new[0].0, 0);
}

#[test]
fn sampling_with_and_without_the_kv_cache_gives_the_same_text() {
    let dir = workdir();
    let w = dir.path();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "max_steps=2"], w);
    // 40 tokens run past the context of 16.
    let args = ["sample", "--run", "run", "--prompt", "ALICE:", "--max-new-tokens", "40", "--seed", "5"];
    let cached = ok(&args, w);
    let mut full_args = args.to_vec();
    full_args.push("--no-cache");
    assert_eq!(cached, ok(&full_args, w));
}

#[test]
fn verify_passes_on_the_pytorch_fixture_and_fails_on_a_tampered_one() {
    let Some(shared) = std::env::var_os("EMBER_SHARED") else {
        eprintln!("skipping: EMBER_SHARED is not set");
        return;
    };
    let fixture = Path::new(&shared).join("parity/gpt2-tiny");
    let dir = tempfile::tempdir().unwrap();
    let out = ok(&["verify", "--fixture", fixture.to_str().unwrap()], dir.path());
    assert!(out.contains("initial loss") && out.contains("overall: ok"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["verify", "--fixture", fixture.to_str().unwrap(), "--json"], dir.path()))
            .unwrap();
    assert_eq!(json["ok"], true);
    assert!(json["checks"].as_array().unwrap().len() >= 25);

    let tampered = dir.path().join("tampered");
    std::fs::create_dir(&tampered).unwrap();
    for name in ["init.safetensors", "batch.json"] {
        std::fs::copy(fixture.join(name), tampered.join(name)).unwrap();
    }
    let expected = std::fs::read_to_string(fixture.join("expected.json")).unwrap();
    std::fs::write(
        tampered.join("expected.json"),
        expected.replace("\"initial_loss\": 4.17", "\"initial_loss\": 4.27"),
    )
    .unwrap();
    let out = ember(&["verify", "--fixture", "tampered"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("FAIL"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of "), "{out:?}");
}

#[test]
fn a_llama_model_trains_resumes_exports_and_reloads() {
    let dir = workdir();
    let w = dir.path();
    // llama-tiny has no dropout key: the GPT-2 config's dropout line goes.
    let config = CONFIG.replace("preset = \"tiny\"\ndropout = 0.1", "preset = \"llama-tiny\"");
    std::fs::write(w.join("llama.toml"), &config).unwrap();
    ok(&["train", "--config", "llama.toml", "--run-dir", "straight"], w);
    ok(&["train", "--config", "llama.toml", "--run-dir", "split", "--set", "max_steps=3"], w);
    ok(&["train", "--resume", "split", "--set", "max_steps=6"], w);
    assert_eq!(losses(w.join("straight")), losses(w.join("split")), "bit-identical resume");
    let out = ok(&["train", "--config", "llama.toml", "--run-dir", "run", "--set", "max_steps=2"], w);
    assert!(out.contains("model: llama with"), "{out}");
    exported_weights_equal_the_run(w, &config, "run", "hf-llama");
}
