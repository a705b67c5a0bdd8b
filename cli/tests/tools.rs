//! `ember estimate`, `ember bench` and `ember watch` through the binary.

mod common;

use std::path::Path;

use common::*;

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn estimate_gives_two_gigabytes_of_persistent_state_for_gpt2_124m() {
    let dir = tempfile::tempdir().unwrap();
    let config = "max_steps = 10\nmicro_batch_size = 1\naccumulation_steps = 2\n[model]\npreset = \"gpt2\"\n";
    std::fs::write(dir.path().join("gpt2.toml"), config).unwrap();
    let e = json(&ok(&["estimate", "--config", "gpt2.toml", "--json", "--gpu", "h100"], dir.path()));
    assert_eq!(e["params"], 124_475_904);
    assert_eq!(e["persistent_bytes"], 124_475_904u64 * 16);
    // 6·N + 12·12·768·1024 FLOPs per token; 2 × 1024 tokens per step at 40% of 989 TFLOP/s.
    let per_token = 6 * 124_475_904u64 + 12 * 12 * 768 * 1024;
    assert_eq!(e["flops_per_token"], per_token);
    let step_s = e["step_seconds_at_mfu"].as_f64().unwrap();
    assert!((step_s - per_token as f64 * 2048.0 / (0.4 * 989e12)).abs() < 1e-12);
    // Fused attention and loss, one row of 1024 tokens: per layer 16 × 1024·768 × 4 B +
    // (2 LayerNorms × 2 + 12 heads) × 1024 × 4 B; final LayerNorm 2 × 3,145,728 + 2 × 4,096;
    // head and loss 6 B × 1024·50304 + 4,096.
    assert_eq!(e["mode"]["attention"], "fused");
    assert_eq!(e["mode"]["precision"], "fp32");
    assert_eq!(e["mode"]["checkpointing"], "none");
    assert_eq!(e["peak"], e["peak_bytes"][0]);
    assert_eq!(e["activations"]["attention_per_layer"], 0);
    assert_eq!(e["activations"]["total"], 12 * (50_331_648u64 + 65_536) + 6_299_648 + 309_071_872);
    let dropout =
        json(&ok(&["estimate", "--config", "gpt2.toml", "--json", "--set", "model.dropout=0.1"], dir.path()));
    assert_eq!(dropout["mode"]["attention"], "materialized");
    // 3 × 12 heads × 1024² × 4 B per layer: probabilities, dropout mask, dropped probabilities.
    assert_eq!(dropout["activations"]["attention_per_layer"], 3 * 12 * 1024 * 1024 * 4u64);
    let table = ok(&["estimate", "--config", "gpt2.toml"], dir.path());
    assert!(table.contains("attention  ") && table.contains("fused: keeps its output [B,T,H,Dh]"), "{table}");
    let table = ok(&["estimate", "--config", "gpt2.toml", "--precision", "bf16-mixed"], dir.path());
    assert!(
        table.contains(
            "16 B/param = f32 weights 4 (also the master copy) + f32 grads 4 + AdamW m 4 + v 4 → 1.992 GB"
        ),
        "{table}"
    );
    // 12 layers × 12·768² + the tied head 50304·768 = 123,568,128 matmul weights × 2 B.
    assert!(table.contains("2 B × 123568128 matmul weights") && table.contains("→ 0.247 GB"), "{table}");
    // The config's own modes: checkpointing picks the peak, a config's precision is used.
    let blocks = [
        &["estimate", "--config", "gpt2.toml", "--json"][..],
        &["--set", "activation_checkpointing=\"blocks\""],
    ]
    .concat();
    let b = json(&ok(&blocks, dir.path()));
    assert_eq!(b["mode"]["checkpointing"], "blocks");
    assert_eq!(b["peak"], b["peak_bytes"][1]);
    assert!(b["peak"].as_u64().unwrap() < e["peak"].as_u64().unwrap());
    // ZeRO-1 on 2 ranks: 4 + 4 + 8/2 B/param per rank (the preset's tensors split evenly).
    let sharded = ["--set", "devices=2", "--set", "parallel.shard_optimizer=true"];
    let z = json(&ok(&[&["estimate", "--config", "gpt2.toml", "--json"][..], &sharded].concat(), dir.path()));
    assert_eq!(z["mode"]["optimizer_shards"], 2);
    assert_eq!(z["persistent_bytes"], 124_475_904u64 * 12);
    assert_eq!(z["optimizer_state_bytes"], 124_475_904u64 * 4);
    assert_eq!(z["optimizer_shard_params"], 124_475_904u64 / 2);
    let table = ok(&[&["estimate", "--config", "gpt2.toml"][..], &sharded].concat(), dir.path());
    assert!(
        table.contains("12.00 B/param on the rank with the largest share = f32 weights 4 (also the master copy) + f32 grads 4 + AdamW m 4 + v 4 of 62237952 of the 124475904 parameters (ZeRO-1 over 2 ranks, by whole tensors) → 1.494 GB per rank, of which AdamW 0.498 GB"),
        "{table}"
    );
    let mixed = [&blocks[..], &["--set", "precision=\"fp16-mixed\""]].concat();
    assert_eq!(json(&ok(&mixed, dir.path()))["per_param"]["low_precision_copy"], 2);
    let err = fails(
        &["estimate", "--config", "gpt2.toml", "--set", "activation_checkpointing=\"layers\""],
        dir.path(),
    );
    assert!(err.contains("activation_checkpointing") && err.contains("blocks"), "{err}");
    for (flag, value) in [("--mfu", "0"), ("--mfu", "1.5"), ("--peak-flops", "0")] {
        let err = fails(&["estimate", "--config", "gpt2.toml", flag, value], dir.path());
        assert!(err.contains(&format!("{flag} {value}: expected")), "{err}");
    }
    let err = fails(&["estimate", "--config", "gpt2.toml", "--set", "peak_flops=-5"], dir.path());
    assert!(err.contains("peak_flops"), "{err}");
    let err = fails(&["estimate", "--config", "gpt2.toml", "--gpu", "tpu"], dir.path());
    assert!(err.contains("not in the table"), "{err}");
}

#[test]
fn bench_reports_its_precision() {
    let dir = workdir();
    let args = ["bench", "--config", "tiny.toml", "--steps", "1", "--warmup", "0", "--no-matmul-peak"];
    let text = ok(&[&args[..], &["--set", "precision=\"bf16-mixed\""]].concat(), dir.path());
    assert!(text.contains("precision        bf16-mixed"), "{text}");
    assert!(text.contains("checkpointing    none"), "{text}");
    let blocks = ok(&[&args[..], &["--set", "activation_checkpointing=\"blocks\""]].concat(), dir.path());
    assert!(blocks.contains("checkpointing    blocks"), "{blocks}");
}

#[test]
fn bench_reports_throughput_phases_and_a_random_token_loss() {
    let dir = workdir();
    let r =
        json(&ok(&["bench", "--config", "tiny.toml", "--steps", "3", "--warmup", "1", "--json"], dir.path()));
    assert_eq!(r["steps"], 3);
    assert_eq!(r["precision"], "fp32");
    assert_eq!(r["tokens_per_step"], 4 * 16);
    assert!(r["tokens_per_sec"].as_f64().unwrap() > 0.0);
    let (forward, backward) =
        (r["phases"]["forward_ms"].as_f64().unwrap(), r["phases"]["backward_ms"].as_f64().unwrap());
    let total = r["ms_per_step"].as_f64().unwrap();
    assert!(forward > 0.0 && backward > 0.0 && forward + backward <= total, "{r}");
    assert_eq!(r["mfu"], serde_json::Value::Null, "no peak FLOP/s on the CPU");
    // The measured 2048³ f32 matmul, and the step's FLOP/s against it.
    let model_flops = r["model_flops"].as_f64().unwrap();
    let matmul = r["matmul_flops"].as_f64().unwrap();
    assert_eq!(r["matmul_size"], 2048);
    assert!(matmul > 1e9, "{r}");
    assert!((r["mfu_vs_matmul"].as_f64().unwrap() - model_flops / matmul).abs() < 1e-12);
    // Random targets: the loss of a freshly initialized model is close to ln(vocab).
    let vocab = r["vocab_size"].as_f64().unwrap();
    assert!((r["last_loss"].as_f64().unwrap() - vocab.ln()).abs() < 0.5, "{r}");
    let with_peak = json(&ok(
        &[
            "bench",
            "--config",
            "tiny.toml",
            "--steps",
            "1",
            "--json",
            "--peak-flops",
            "1e12",
            "--no-matmul-peak",
        ],
        dir.path(),
    ));
    assert_eq!(
        (&with_peak["matmul_flops"], &with_peak["mfu_vs_matmul"]),
        (&serde_json::Value::Null, &serde_json::Value::Null)
    );
    let text = ok(
        &["bench", "--config", "tiny.toml", "--steps", "1", "--warmup", "0", "--no-matmul-peak"],
        dir.path(),
    );
    for line in [
        "| forward ",
        "| backward ",
        "matmul peak      — (skipped: --no-matmul-peak)",
        "MFU              — (no spec-sheet peak",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    let mfu = with_peak["mfu"].as_f64().unwrap();
    let expected = with_peak["estimate"]["flops_per_token"].as_f64().unwrap()
        * with_peak["tokens_per_sec"].as_f64().unwrap()
        / 1e12;
    assert!((mfu - expected).abs() < 1e-12);
}

#[test]
fn watch_prints_a_finished_run_as_plain_lines_when_not_in_a_terminal() {
    let dir = workdir();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run"], dir.path());
    let out = ok(&["watch", "run"], dir.path());
    let steps = out.lines().filter(|l| l.starts_with("step ")).count();
    assert_eq!(steps, 6, "{out}");
    assert!(out.contains("eval      6 | val loss"), "{out}");
    // Every logged step (log_every = 1) times forward and backward apart, within the pair.
    let metrics = std::fs::read_to_string(dir.path().join("run/metrics.jsonl")).unwrap();
    let train: Vec<serde_json::Value> = metrics.lines().map(json).filter(|r| r["kind"] == "train").collect();
    assert_eq!(train.len(), 6);
    for r in &train {
        let (f, b, fb) = (
            r["forward_s"].as_f64().unwrap(),
            r["backward_s"].as_f64().unwrap(),
            r["forward_backward_s"].as_f64().unwrap(),
        );
        assert!(f > 0.0 && b > 0.0 && f + b <= fb, "{r}");
    }
    let err = fails(&["watch", "nowhere"], dir.path());
    assert!(err.contains("nowhere: no such run directory"), "{err}");
    assert!(Path::new(&dir.path().join("run/metrics.jsonl")).exists());
}

#[test]
fn plot_writes_five_png_charts() {
    let dir = workdir();
    ok(&["train", "--config", "tiny.toml", "--run-dir", "run", "--set", "eval_every=3"], dir.path());
    let out = ember(&["plot", "run", "--out", "charts"], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("no TrueType font found") {
        eprintln!("skipping: no system font for the chart labels ({stderr})");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    for name in ["loss", "lr", "grad_norm", "throughput", "time"] {
        let bytes = std::fs::read(dir.path().join(format!("charts/{name}.png"))).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{name}.png is a PNG");
        assert!(bytes.len() > 5_000, "{name}.png has content ({} bytes)", bytes.len());
    }
    let err = fails(&["plot", "nowhere"], dir.path());
    assert!(err.contains("nowhere"), "{err}");
}
