//! `ember verify`: numerical parity with a PyTorch fixture (`gpt_ref.py parity` or
//! `scripts/llama_parity.py`): initial loss and gradient norm, then 10 AdamW steps on the full
//! batch and as token-weighted accumulation over micro-batches, each beside the expected
//! number.

mod fixture;
pub mod grads;

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use ember_data::Batch;
use ember_model::{GeluKind, LanguageModel, ModelConfig};
use serde::Serialize;

use crate::config::{BackendKind, PrecisionKind};
use crate::error::TrainError;
use crate::step::optim::{clip_grad_norm, AdamWGroups};
use crate::step::{global_gradients, scalar, train_step, Solo, StepSettings};
use crate::tools::backend::{run_on, BackendTask};
use fixture::Fixture;

/// Relative tolerance of the initial loss and gradient norms (fp32).
pub const REL_TOL: f64 = 1e-5;
/// Absolute tolerance (nats) of the losses after optimizer steps (fp32).
pub const STEP_ABS_TOL: f64 = 1e-4;

/// The tolerances of one verification, by the precision Ember computes in (the fixture is
/// PyTorch's fp32).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerances {
    /// Initial loss and gradient norms, relative.
    pub rel: f64,
    /// Each parameter's gradient: largest element-wise difference ÷ the tensor's largest |value|.
    pub grad: f64,
    /// Losses after optimizer steps, nats, absolute.
    pub step_abs: f64,
}

impl Tolerances {
    /// fp32: float32 rounding of two implementations summing in different orders.
    pub const FP32: Self = Self { rel: REL_TOL, grad: REL_TOL, step_abs: STEP_ABS_TOL };
    /// bf16-mixed, from bfloat16's unit roundoff u = 2⁻⁸ ≈ 3.9e-3 (8 significant bits; the
    /// matmul operands are rounded to it): the loss and gradient norms within u relative (sums
    /// of many rounded products average their errors: measured ≤ 2.5e-4 on the three
    /// fixtures); each gradient tensor within 4u = 2⁻⁶ of its largest value (an element is a
    /// few rounded products deep: measured ≤ 8.3e-3); the losses after 10 steps within u nats
    /// (measured ≤ 2.9e-4).
    pub const BF16_MIXED: Self = Self { rel: 1.0 / 256.0, grad: 1.0 / 64.0, step_abs: 1.0 / 256.0 };

    /// The tolerances for `precision` (fp16-mixed is not verified: loss scaling makes its
    /// gradients' rounding depend on the scale).
    pub fn of(precision: PrecisionKind) -> Option<Self> {
        match precision {
            PrecisionKind::Fp32 => Some(Self::FP32),
            PrecisionKind::Bf16Mixed => Some(Self::BF16_MIXED),
            PrecisionKind::Fp16Mixed => None,
        }
    }
}

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

    fn new(name: impl Into<String>, ember: f64, expected: f64, relative: bool, tol: &Tolerances) -> Self {
        let abs = (ember - expected).abs();
        let (diff, tolerance, kind) = if relative {
            (abs / expected.abs().max(f64::MIN_POSITIVE), tol.rel, "relative")
        } else {
            (abs, tol.step_abs, "absolute")
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
    /// The parameter whose gradient differs most from the fixture's (relative to its largest
    /// value); `None` when the fixture has no per-tensor gradients.
    pub worst_gradient: Option<WorstGradient>,
}

/// The tensor of [`Report::worst_gradient`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorstGradient {
    /// Its Hugging Face name.
    pub tensor: String,
    /// Its check's `diff` (NaN when a gradient is not finite).
    pub diff: f64,
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
        match &self.worst_gradient {
            Some(w) => writeln!(
                f,
                "largest gradient difference: {} ({:.2e} of its largest |value|)",
                w.tensor, w.diff
            )?,
            None => writeln!(f, "per-tensor gradients: not checked (the fixture has no {})", grads::FILE)?,
        }
        let failed = self.checks.iter().filter(|c| !c.ok).count();
        if failed == 0 {
            write!(f, "overall: ok ({} checks)", self.checks.len())
        } else {
            write!(f, "overall: FAIL ({failed} of {} checks beyond tolerance)", self.checks.len())
        }
    }
}

/// [`verify_in`] on the backend `kind` (`flex`, or `cuda` / `wgpu` in a build with that
/// feature; its first device or adapter).
///
/// Errors: as [`verify`]; a backend this build or machine cannot run.
pub fn verify_on(kind: BackendKind, dir: &Path, precision: PrecisionKind) -> Result<Report, TrainError> {
    struct Task<'a>(&'a Path, PrecisionKind);
    impl BackendTask for Task<'_> {
        type Output = Report;
        fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<Report, TrainError> {
            verify_in::<B>(self.0, &devices[0], self.1)
        }
    }
    super::backend::check_precision(kind, precision)?;
    run_on(kind, &[0], Task(dir, precision))
}

/// The model config of the fixture in `dir` (from its `expected.json`).
///
/// Errors: unreadable or incomplete fixture files (naming the file and field).
pub fn fixture_model(dir: &Path) -> Result<ModelConfig, TrainError> {
    Fixture::read(dir)?.model()
}

/// Verifies the fixture in `dir` on backend `B`, in fp32 ([`verify_in`]).
pub fn verify<B: AutodiffBackend>(dir: &Path, device: &B::Device) -> Result<Report, TrainError> {
    verify_in::<B>(dir, device, PrecisionKind::Fp32)
}

/// Verifies the fixture in `dir` on backend `B`, Ember computing in `precision`
/// (`fp32` or `bf16-mixed`, each with its [`Tolerances`]).
///
/// Errors: unreadable or incomplete fixture files (naming the file and field); weights that
/// do not fit the fixture's config. A numerical mismatch is not an error: it is a failed
/// check in the report.
pub fn verify_in<B: AutodiffBackend>(
    dir: &Path,
    device: &B::Device,
    precision: PrecisionKind,
) -> Result<Report, TrainError> {
    let tol = Tolerances::of(precision).ok_or_else(|| {
        TrainError::Unsupported(
            "ember verify --precision: fp32 or bf16-mixed (fp16-mixed's loss scaling makes its rounding depend on the scale)"
                .into(),
        )
    })?;
    let mode = precision.mode();
    let fixture = Fixture::read(dir)?;
    let config = fixture.model()?;
    let weights = dir.join("init.safetensors");
    let fresh = || -> Result<LanguageModel<B>, TrainError> {
        let model = config.init::<B>(device).map_err(|e| TrainError::BadFile {
            path: dir.join("expected.json"),
            message: format!("config: {e}"),
        })?;
        Ok(ember_model::hf::load(model, &weights)?)
    };
    let (opt, lr, steps) = fixture.optimizer()?;
    let rows: Vec<usize> =
        (0..fixture.get("batch.json", "/input_ids")?.as_array().map_or(0, Vec::len)).collect();
    let full = vec![fixture.batch(&rows, &config)?];
    let micro: Vec<Batch> =
        fixture.micro_batches()?.iter().map(|mb| fixture.batch(mb, &config)).collect::<Result<_, _>>()?;
    let mut checks = Vec::new();

    // Initial loss and global gradient norm on the full batch.
    let model = fresh()?;
    let initial = StepSettings { precision: mode, ..StepSettings::new(0, 0.0, 0.0) };
    let global = global_gradients(&model, &full, &initial, &mut Solo, device)?;
    let (mut grads, loss, scored) = (global.grads, global.loss, global.scored_tokens);
    let norm = clip_grad_norm(&model, &mut grads, 0.0);
    checks.push(Check::new(
        "initial loss (nats/token)",
        scalar(loss),
        fixture.num("expected.json", "/initial_loss")?,
        true,
        &tol,
    ));
    checks.push(Check::new(
        "initial grad norm",
        scalar(norm),
        fixture.num("expected.json", "/initial_grad_norm")?,
        true,
        &tol,
    ));
    if let Ok(n) = fixture.num("expected.json", "/n_scored") {
        checks.push(Check::exact("scored tokens", scored, n as usize));
    }
    // Every parameter's gradient, tensor by tensor, when the fixture carries them.
    let grads_file = dir.join(grads::FILE);
    let mut worst_gradient = None;
    if grads_file.exists() {
        let per_tensor = grads::checks(&model, &grads, &grads_file, tol.grad)?;
        // NaN (a non-finite gradient on either side) ranks above every number.
        let rank = |c: &Check| if c.diff.is_nan() { f64::INFINITY } else { c.diff };
        worst_gradient = per_tensor
            .iter()
            .max_by(|a, b| rank(a).total_cmp(&rank(b)))
            .map(|c| WorstGradient { tensor: c.name.trim_start_matches("grad ").to_string(), diff: c.diff });
        checks.extend(per_tensor);
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
            let settings = StepSettings { precision: mode, ..StepSettings::new(step, lr, opt.grad_clip) };
            let (next, out) = train_step(model, &mut optimizer, batches, settings, &mut Solo, None, device)?;
            model = next;
            if step == 1 && name == "accumulated" {
                let tw = "/grad_accum/token_weighted";
                checks.push(Check::new(
                    format!("accumulated over {} micro-batches: loss", batches.len()),
                    scalar(out.loss),
                    fixture.num("expected.json", &format!("{tw}/loss"))?,
                    true,
                    &tol,
                ));
                checks.push(Check::new(
                    "accumulated: grad norm",
                    scalar(out.grad_norm),
                    fixture.num("expected.json", &format!("{tw}/grad_norm"))?,
                    true,
                    &tol,
                ));
            } else if step > 1 {
                losses.push(scalar(out.loss));
            }
        }
        let last = StepSettings { precision: mode, ..StepSettings::new(steps as u64 + 1, 0.0, 0.0) };
        let last = global_gradients(&model, batches, &last, &mut Solo, device)?.loss;
        losses.push(scalar(last));
        for (k, (ours, theirs)) in losses.iter().zip(&expected).enumerate() {
            checks.push(Check::new(
                format!("{name}: loss after step {}", k + 1),
                *ours,
                *theirs,
                false,
                &tol,
            ));
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
    Ok(Report { fixture: dir.into(), model: describe(&config), checks, ok, worst_gradient })
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
