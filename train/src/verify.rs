//! `ember verify`: numerical parity with a PyTorch fixture (`gpt_ref.py parity` or
//! `scripts/llama_parity.py`): initial loss and gradient norm, then 10 AdamW steps on the full
//! batch and as token-weighted accumulation over micro-batches, each beside the expected
//! number.

use std::fs;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ElementConversion;
use ember_data::Batch;
use ember_model::{GeluKind, GptConfig, LanguageModel, LlamaConfig, ModelConfig};
use serde::Serialize;
use serde_json::Value;

use crate::config::OptimizerConfig;
use crate::error::TrainError;
use crate::optim::{clip_grad_norm, AdamWGroups};
use crate::step::{forward_backward, train_step, StepSettings};
use crate::sync::Solo;

/// Relative tolerance of the initial loss and gradient norms.
pub const REL_TOL: f64 = 1e-5;
/// Absolute tolerance (nats) of the losses after optimizer steps.
pub const STEP_ABS_TOL: f64 = 1e-4;

/// One number compared with the fixture's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// What was computed.
    pub name: String,
    /// Ember's value.
    pub ember: f64,
    /// The fixture's value.
    pub expected: f64,
    /// `|ember − expected|`, divided by `|expected|` for relative checks.
    pub diff: f64,
    /// The tolerance `diff` must not exceed.
    pub tolerance: f64,
    /// `"relative"`, `"absolute"` or `"exact"` (counts).
    pub kind: &'static str,
    /// Within tolerance.
    pub ok: bool,
}

impl Check {
    fn exact(name: impl Into<String>, ember: usize, expected: usize) -> Self {
        let diff = (ember as f64 - expected as f64).abs();
        Check {
            name: name.into(),
            ember: ember as f64,
            expected: expected as f64,
            diff,
            tolerance: 0.0,
            kind: "exact",
            ok: diff == 0.0,
        }
    }

    fn new(name: impl Into<String>, ember: f64, expected: f64, relative: bool) -> Self {
        let abs = (ember - expected).abs();
        let (diff, tolerance, kind) = if relative {
            (abs / expected.abs().max(f64::MIN_POSITIVE), REL_TOL, "relative")
        } else {
            (abs, STEP_ABS_TOL, "absolute")
        };
        Check { name: name.into(), ember, expected, diff, tolerance, kind, ok: diff <= tolerance }
    }
}

/// The outcome of a verification.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The fixture directory.
    pub fixture: PathBuf,
    /// The model, in words.
    pub model: String,
    /// Every comparison, in order.
    pub checks: Vec<Check>,
    /// Every check within tolerance.
    pub ok: bool,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "fixture {} ({})", self.fixture.display(), self.model)?;
        writeln!(
            f,
            "{:<40} {:>12} {:>12} {:>10} {:>13}  ",
            "check", "ember", "expected", "diff", "tolerance"
        )?;
        for c in &self.checks {
            let tol = match c.kind {
                "exact" => "exact".to_string(),
                kind => format!("{:.0e} {}", c.tolerance, &kind[..3]),
            };
            writeln!(
                f,
                "{:<40} {:>12.7} {:>12.7} {:>10.2e} {:>13}  {}",
                c.name,
                c.ember,
                c.expected,
                c.diff,
                tol,
                if c.ok { "ok" } else { "FAIL" }
            )?;
        }
        let failed = self.checks.iter().filter(|c| !c.ok).count();
        if failed == 0 {
            write!(f, "overall: ok ({} checks)", self.checks.len())
        } else {
            write!(f, "overall: FAIL ({failed} of {} checks beyond tolerance)", self.checks.len())
        }
    }
}

/// A fixture's files, parsed.
struct Fixture {
    dir: PathBuf,
    expected: Value,
    batch: Value,
}

impl Fixture {
    fn read(dir: &Path) -> Result<Self, TrainError> {
        let json = |name: &str| -> Result<Value, TrainError> {
            let path = dir.join(name);
            let text = fs::read_to_string(&path).map_err(TrainError::io(&path))?;
            serde_json::from_str(&text)
                .map_err(|e| TrainError::Checkpoint { path, message: format!("invalid JSON: {e}") })
        };
        Ok(Self { dir: dir.into(), expected: json("expected.json")?, batch: json("batch.json")? })
    }

    /// `value` at the `/`-separated `pointer` of `file`, or an error naming both.
    fn get<'a>(&'a self, file: &str, pointer: &str) -> Result<&'a Value, TrainError> {
        let root = if file == "batch.json" { &self.batch } else { &self.expected };
        root.pointer(pointer).ok_or_else(|| TrainError::Checkpoint {
            path: self.dir.join(file),
            message: format!("missing field {}", pointer.trim_start_matches('/').replace('/', ".")),
        })
    }

    fn num(&self, file: &str, pointer: &str) -> Result<f64, TrainError> {
        self.get(file, pointer)?.as_f64().ok_or_else(|| self.bad(file, pointer, "a number"))
    }

    fn nums(&self, file: &str, pointer: &str) -> Result<Vec<f64>, TrainError> {
        let array = self
            .get(file, pointer)?
            .as_array()
            .ok_or_else(|| self.bad(file, pointer, "an array of numbers"))?;
        array
            .iter()
            .map(|v| v.as_f64().ok_or_else(|| self.bad(file, pointer, "an array of numbers")))
            .collect()
    }

    fn bad(&self, file: &str, pointer: &str, expected: &str) -> TrainError {
        TrainError::Checkpoint {
            path: self.dir.join(file),
            message: format!(
                "field {} must be {expected}",
                pointer.trim_start_matches('/').replace('/', ".")
            ),
        }
    }

    /// The model of `expected.json`'s `config`: gpt_ref.py's GPT-2 fields, or Hugging Face
    /// `LlamaConfig` fields with `"arch": "llama"`.
    fn model(&self) -> Result<ModelConfig, TrainError> {
        let u = |key: &str| self.num("expected.json", &format!("/config/{key}")).map(|v| v as usize);
        let f = |key: &str| self.num("expected.json", &format!("/config/{key}"));
        let flag = |key: &str, default: bool| {
            self.get("expected.json", &format!("/config/{key}"))
                .ok()
                .and_then(Value::as_bool)
                .unwrap_or(default)
        };
        let arch = self.get("expected.json", "/config/arch").ok().and_then(Value::as_str).unwrap_or("gpt2");
        Ok(match arch {
            "llama" => ModelConfig::Llama(
                LlamaConfig::new(
                    u("vocab_size")?,
                    u("num_hidden_layers")?,
                    u("num_attention_heads")?,
                    u("num_key_value_heads")?,
                    u("hidden_size")?,
                    u("intermediate_size")?,
                    u("max_position_embeddings")?,
                )
                .with_rope_theta(f("rope_theta")?)
                .with_rms_norm_eps(f("rms_norm_eps")?)
                .with_tie_embeddings(flag("tie_word_embeddings", false)),
            ),
            _ => {
                let gelu = match self.get("expected.json", "/config/gelu").ok().and_then(Value::as_str) {
                    Some("erf") => GeluKind::Erf,
                    _ => GeluKind::Tanh,
                };
                ModelConfig::Gpt2(
                    GptConfig::new(
                        u("vocab_size")?,
                        u("n_layer")?,
                        u("n_head")?,
                        u("n_embd")?,
                        u("block_size")?,
                    )
                    .with_bias(flag("bias", true))
                    .with_dropout(f("dropout").unwrap_or(0.0))
                    .with_gelu(gelu)
                    .with_layer_norm_eps(f("layer_norm_eps").unwrap_or(1e-5))
                    .with_tie_embeddings(true),
                )
            }
        })
    }

    /// `rows` of `batch.json`'s `input_ids` / `targets` as one batch.
    fn batch(&self, rows: &[usize]) -> Result<Batch, TrainError> {
        let matrix = |key: &str| -> Result<Vec<Vec<i64>>, TrainError> {
            let pointer = format!("/{key}");
            let rows = self
                .get("batch.json", &pointer)?
                .as_array()
                .ok_or_else(|| self.bad("batch.json", &pointer, "a matrix"))?;
            rows.iter()
                .map(|r| {
                    r.as_array()
                        .and_then(|r| r.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                        .ok_or_else(|| self.bad("batch.json", &pointer, "a matrix of integers"))
                })
                .collect()
        };
        let (inputs, targets) = (matrix("input_ids")?, matrix("targets")?);
        let seq_len = inputs.first().map_or(0, Vec::len);
        let mut batch = Batch {
            batch_size: rows.len(),
            seq_len,
            inputs: Vec::new(),
            targets: Vec::new(),
            segments: None,
        };
        for &r in rows {
            let (Some(i), Some(t)) = (inputs.get(r), targets.get(r)) else {
                return Err(self.bad("batch.json", "/micro_batches", "sequence indices within input_ids"));
            };
            batch.inputs.extend(i.iter().map(|&v| v as u32));
            batch.targets.extend(t.iter().map(|&v| v as i32));
        }
        Ok(batch)
    }

    fn micro_batches(&self) -> Result<Vec<Vec<usize>>, TrainError> {
        let pointer = "/micro_batches";
        let list = self
            .get("batch.json", pointer)?
            .as_array()
            .ok_or_else(|| self.bad("batch.json", pointer, "a list of index lists"))?;
        list.iter()
            .map(|mb| {
                mb.as_array()
                    .and_then(|mb| {
                        mb.iter().map(|v| v.as_u64().map(|v| v as usize)).collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| self.bad("batch.json", pointer, "a list of index lists"))
            })
            .collect()
    }

    fn optimizer(&self) -> Result<(OptimizerConfig, f64, usize), TrainError> {
        let betas = self.nums("expected.json", "/optimizer/betas")?;
        if betas.len() != 2 {
            return Err(self.bad("expected.json", "/optimizer/betas", "two numbers"));
        }
        let config = OptimizerConfig {
            beta1: betas[0],
            beta2: betas[1],
            eps: self.num("expected.json", "/optimizer/eps")?,
            weight_decay: self.num("expected.json", "/optimizer/weight_decay")?,
            grad_clip: self.num("expected.json", "/optimizer/grad_clip/max_norm")?,
            ..OptimizerConfig::default()
        };
        if config.grad_clip <= 0.0 {
            return Err(self.bad(
                "expected.json",
                "/optimizer/grad_clip/max_norm",
                "positive (PyTorch's clip_grad_norm_ with max_norm 0 zeroes every gradient, while Ember's grad_clip 0 turns clipping off: the runs would not be comparable)",
            ));
        }
        let lr = self.num("expected.json", "/optimizer/lr")?;
        let steps = self.num("expected.json", "/train_full_batch/steps")? as usize;
        Ok((config, lr, steps))
    }
}

fn scalar<B: burn::tensor::backend::Backend>(t: burn::tensor::Tensor<B, 1>) -> f64 {
    t.into_scalar().elem()
}

/// Verifies the fixture in `dir` on backend `B`.
///
/// Errors: unreadable or incomplete fixture files (naming the file and field); weights that
/// do not fit the fixture's config. A numerical mismatch is not an error: it is a failed
/// check in the report.
pub fn verify<B: AutodiffBackend>(dir: &Path, device: &B::Device) -> Result<Report, TrainError> {
    let fixture = Fixture::read(dir)?;
    let config = fixture.model()?;
    let weights = dir.join("init.safetensors");
    let fresh = || -> Result<LanguageModel<B>, TrainError> {
        let model = config.init::<B>(device).map_err(|e| TrainError::Checkpoint {
            path: dir.join("expected.json"),
            message: format!("config: {e}"),
        })?;
        Ok(ember_model::hf::load(model, &weights)?)
    };
    let (opt, lr, steps) = fixture.optimizer()?;
    let rows: Vec<usize> =
        (0..fixture.get("batch.json", "/input_ids")?.as_array().map_or(0, Vec::len)).collect();
    let full = vec![fixture.batch(&rows)?];
    let micro: Vec<Batch> =
        fixture.micro_batches()?.iter().map(|mb| fixture.batch(mb)).collect::<Result<_, _>>()?;
    let mut checks = Vec::new();

    // Initial loss and global gradient norm on the full batch.
    let model = fresh()?;
    let (mut grads, loss, scored) = forward_backward(&model, &full, 0, device)?;
    let norm = clip_grad_norm(&model, &mut grads, 0.0);
    checks.push(Check::new(
        "initial loss (nats/token)",
        scalar(loss),
        fixture.num("expected.json", "/initial_loss")?,
        true,
    ));
    checks.push(Check::new(
        "initial grad norm",
        scalar(norm),
        fixture.num("expected.json", "/initial_grad_norm")?,
        true,
    ));
    if let Ok(n) = fixture.num("expected.json", "/n_scored") {
        checks.push(Check::exact("scored tokens", scored, n as usize));
    }

    // Weight-decay groups: the fixture lists them by name; Ember decays every 2-D tensor.
    let census = AdamWGroups::new(&opt, &model).census;
    for (what, ours, pointer) in [
        ("decayed tensors", census.decayed_tensors, "/optimizer/decay_params"),
        ("not-decayed tensors", census.no_decay_tensors, "/optimizer/no_decay_params"),
    ] {
        let expected = fixture.get("expected.json", pointer)?.as_array().map_or(0, Vec::len);
        checks.push(Check::exact(what, ours, expected));
    }

    // The two training scenarios: AdamW at a constant learning rate, global-norm clipping.
    let scenarios: [(&str, &[Batch], &str); 2] = [
        ("full batch", &full, "/train_full_batch/loss_after_step"),
        ("accumulated", &micro, "/grad_accum/token_weighted/loss_after_step"),
    ];
    for (name, batches, pointer) in scenarios {
        let expected = fixture.nums("expected.json", pointer)?;
        let mut model = fresh()?;
        let mut optimizer = AdamWGroups::new(&opt, &model);
        let mut losses = Vec::new();
        for step in 1..=steps as u64 {
            let settings = StepSettings::new(step, lr, opt.grad_clip);
            let (next, out) = train_step(model, &mut optimizer, batches, settings, &mut Solo, device)?;
            model = next;
            if step == 1 && name == "accumulated" {
                let tw = "/grad_accum/token_weighted";
                checks.push(Check::new(
                    format!("accumulated over {} micro-batches: loss", batches.len()),
                    scalar(out.loss),
                    fixture.num("expected.json", &format!("{tw}/loss"))?,
                    true,
                ));
                checks.push(Check::new(
                    "accumulated: grad norm",
                    scalar(out.grad_norm),
                    fixture.num("expected.json", &format!("{tw}/grad_norm"))?,
                    true,
                ));
            } else if step > 1 {
                losses.push(scalar(out.loss));
            }
        }
        let (_, last, _) = forward_backward(&model, batches, steps as u64 + 1, device)?;
        losses.push(scalar(last));
        for (k, (ours, theirs)) in losses.iter().zip(&expected).enumerate() {
            checks.push(Check::new(format!("{name}: loss after step {}", k + 1), *ours, *theirs, false));
        }
        if expected.len() != losses.len() {
            return Err(fixture.bad(
                "expected.json",
                pointer,
                &format!("{} losses (train_full_batch.steps)", losses.len()),
            ));
        }
    }
    let ok = checks.iter().all(|c| c.ok);
    Ok(Report { fixture: dir.into(), model: describe(&config), checks, ok })
}

fn describe(config: &ModelConfig) -> String {
    match config {
        ModelConfig::Gpt2(c) => format!(
            "gpt2: {} layers, {} heads, d_model {}, vocab {}, context {}, bias {}, gelu {}",
            c.n_layer,
            c.n_head,
            c.d_model,
            c.vocab_size,
            c.block_size,
            c.bias,
            if c.gelu == GeluKind::Erf { "erf" } else { "tanh" }
        ),
        ModelConfig::Llama(c) => format!(
            "llama: {} layers, {}/{} heads, d_model {}, d_ff {}, vocab {}, context {}, tied {}",
            c.n_layer, c.n_head, c.n_kv_head, c.d_model, c.d_ff, c.vocab_size, c.block_size, c.tie_embeddings
        ),
    }
}
