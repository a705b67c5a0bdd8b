//! Mixed precision in Ember's step: f32 master weights under bf16 matmuls, and the step's
//! forward actually running in the configured precision.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use ember_data::Batch;
use ember_model::ops::linear::matmul;
use ember_model::{autocast, ModelConfig, Precision};

use super::optim::AdamWGroups;
use super::{scalar, train_step, Solo, StepSettings};
use crate::config::OptimizerConfig;

type Ad = Autodiff<Flex>;

#[derive(Module, Debug)]
struct One<B: Backend> {
    w: Param<Tensor<B, 1>>,
}

/// The hand-computed case: a weight of 1.0 whose AdamW update is 1e-4 per step
/// (learning rate 1e-4, a constant gradient: m̂/√v̂ = 1) ends at 0.999 after 10 steps under
/// bf16-mixed, because the update lands on the f32 master weight. The forward rounds the weight
/// to bfloat16 (still 1.0: the spacing of bfloat16 near 1 is 2⁻⁷), so a bf16 weight would
/// never move: 1 − 1e-4 rounds back to 1.
#[test]
fn f32_master_weights_take_updates_that_bf16_cannot_hold() {
    let device = Default::default();
    let opt = OptimizerConfig { weight_decay: 0.0, eps: 1e-8, ..Default::default() };
    let mut model = One { w: Param::from_tensor(Tensor::<Ad, 1>::from_floats([1.0], &device)) };
    let mut optimizer = AdamWGroups::new(&opt, &model);
    for _ in 0..10 {
        // loss = w · 3 through a matmul, in bf16: ∂loss/∂w = 3 (exact in bfloat16).
        let loss = autocast(Precision::Bf16Mixed, || {
            let x = Tensor::<Ad, 2>::from_floats([[3.0]], &device);
            matmul(x, model.w.val().reshape([1, 1])).sum()
        });
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        assert_eq!(grads.get::<Flex, 1>(model.w.id).unwrap().dtype(), DType::F32);
        model = optimizer.step(1e-4, model, grads);
    }
    let w = model.w.val().into_scalar();
    assert_eq!(model.w.val().dtype(), DType::F32);
    assert!((w - 0.999).abs() < 1e-6, "w = {w}");
    // Pure bf16 storage: 1 − 1e-4 is not representable and rounds to 1.
    let bf16 = Tensor::<Flex, 1>::from_floats([1.0], &device).cast(DType::BF16).sub_scalar(1e-4);
    assert_eq!(bf16.cast(DType::F32).into_scalar(), 1.0);
}

/// The step's forward runs in `StepSettings::precision`: one step of GPT tiny gives a loss and
/// gradient norm within bfloat16's rounding of f32's (here ~1e-3 relative), but not equal.
#[test]
fn the_step_runs_in_its_precision() {
    let device = Default::default();
    let batch = batch();
    // One initialization for both runs (other tests draw from the backend's RNG meanwhile).
    <Ad as Backend>::seed(&device, 5);
    let initial = ModelConfig::preset("tiny").unwrap().init::<Ad>(&device).unwrap();
    let run = |precision: Precision| {
        let model = initial.clone();
        let mut optimizer = AdamWGroups::new(&OptimizerConfig::default(), &model);
        let settings = StepSettings { precision, ..StepSettings::new(1, 1e-3, 1.0) };
        let (_, out) = train_step(
            model,
            &mut optimizer,
            std::slice::from_ref(&batch),
            settings,
            &mut Solo,
            None,
            &device,
        )
        .unwrap();
        (scalar(out.loss), scalar(out.grad_norm))
    };
    let (l32, n32) = run(Precision::Fp32);
    let (l16, n16) = run(Precision::Bf16Mixed);
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs();
    assert!(rel(l16, l32) > 0.0 && rel(l16, l32) < 1e-2, "loss {l16} vs {l32}");
    assert!(rel(n16, n32) > 0.0 && rel(n16, n32) < 2e-2, "grad norm {n16} vs {n32}");
}

/// Every float parameter's values as bits, in visiting order.
fn bits<M: Module<Ad>>(model: &M) -> Vec<Vec<u32>> {
    use burn::module::ModuleVisitor;
    struct Bits(Vec<Vec<u32>>);
    impl ModuleVisitor<Ad> for Bits {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
            let v = param.val().to_data().convert::<f32>().to_vec::<f32>().unwrap();
            self.0.push(v.into_iter().map(f32::to_bits).collect());
        }
    }
    let mut b = Bits(Vec::new());
    model.visit(&mut b);
    b.0
}

fn batch() -> Batch {
    Batch {
        batch_size: 2,
        seq_len: 16,
        inputs: (0..32).map(|i| (i * 5 % 64) as u32).collect(),
        targets: (0..32).map(|i| (i * 5 + 3) % 64).collect(),
        segments: None,
    }
}

/// fp16 overflow: at a loss scale of 2¹⁰⁰ the half-precision backward overflows, so the step
/// is skipped — the weights and both AdamW moments stay bit for bit as they were — and is
/// reported as an overflow (not judged by the sentinel); the scaler then halves its scale.
#[test]
fn an_overflowing_fp16_step_changes_nothing() {
    use crate::config::SentinelConfig;
    use crate::step::{LossScaler, Sentinel};
    let device = Default::default();
    <Ad as Backend>::seed(&device, 9);
    let model = ModelConfig::preset("tiny").unwrap().init::<Ad>(&device).unwrap();
    let mut optimizer = AdamWGroups::new(&OptimizerConfig::default(), &model);
    // One ordinary step first, so the moments exist.
    let settings = StepSettings {
        precision: Precision::Fp16Mixed,
        loss_scale: 1024.0,
        ..StepSettings::new(1, 1e-3, 1.0)
    };
    let (model, out) =
        train_step(model, &mut optimizer, &[batch()], settings, &mut Solo, None, &device).unwrap();
    assert!(!out.overflow);
    let moments_bytes = |o: &AdamWGroups<ember_model::LanguageModel<Ad>, Ad>| {
        use burn::optim::Optimizer;
        use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        // Each parameter's state on its own, in id order (the records are hash maps, whose
        // serialized order varies).
        let (decay, no_decay) = o.to_record();
        let mut states: Vec<(String, Vec<u8>)> = decay
            .into_iter()
            .chain(no_decay)
            .map(|(id, state)| (id.to_string(), Recorder::<Ad>::record(&recorder, state, ()).unwrap()))
            .collect();
        states.sort();
        states
    };
    let (weights, moments) = (bits(&model), moments_bytes(&optimizer));
    let mut sentinel = Sentinel::new(SentinelConfig::default(), Default::default());
    let settings = StepSettings { loss_scale: 2f64.powi(100), step: 2, ..settings };
    let (model, out) =
        train_step(model, &mut optimizer, &[batch()], settings, &mut Solo, Some(&mut sentinel), &device)
            .unwrap();
    assert!(out.overflow);
    assert!(!scalar(out.grad_norm).is_finite());
    let judgement = out.judgement.unwrap();
    assert!(judgement.skipped && judgement.anomaly.is_none());
    assert_eq!(sentinel.state, Default::default(), "an overflow is not the sentinel's");
    assert_eq!(bits(&model), weights, "weights unchanged");
    assert!(moments_bytes(&optimizer) == moments, "moments and step count unchanged");
    let mut scaler = LossScaler { scale: 2f64.powi(100), good_steps: 7, overflow_steps: 0 };
    scaler.update(!out.overflow);
    assert_eq!((scaler.scale, scaler.good_steps, scaler.overflow_steps), (2f64.powi(99), 0, 1));
}

/// The gradients are unscaled before clipping: in f32 a loss scale of 2¹⁰ gives the pre-clip
/// norm and the clipped update of the unscaled step (1e-6 relative: only the rounding of the
/// scale ÷ positions factor), with a clip that bites; in fp16-mixed the norm is f32's within
/// half precision's rounding (spacing 2⁻¹⁰).
#[test]
fn gradients_are_unscaled_before_clipping() {
    let device = Default::default();
    <Ad as Backend>::seed(&device, 11);
    let initial = ModelConfig::preset("tiny").unwrap().init::<Ad>(&device).unwrap();
    let run = |precision: Precision, loss_scale: f64| {
        let model = initial.clone();
        let mut optimizer = AdamWGroups::new(&OptimizerConfig::default(), &model);
        let settings = StepSettings { precision, loss_scale, ..StepSettings::new(1, 1e-2, 0.1) };
        let (model, out) =
            train_step(model, &mut optimizer, &[batch()], settings, &mut Solo, None, &device).unwrap();
        let weights: Vec<f32> = bits(&model).concat().into_iter().map(f32::from_bits).collect();
        (scalar(out.grad_norm), weights)
    };
    let (norm, weights) = run(Precision::Fp32, 1.0);
    assert!(norm > 0.1, "the clip at 0.1 bites (norm {norm})");
    let (norm_scaled, weights_scaled) = run(Precision::Fp32, 1024.0);
    assert!((norm_scaled - norm).abs() <= 1e-6 * norm, "{norm_scaled} vs {norm}");
    let worst = weights.iter().zip(&weights_scaled).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= 1e-6, "updates differ by {worst}");
    let (norm16, _) = run(Precision::Fp16Mixed, 1024.0);
    assert!((norm16 - norm).abs() <= 1e-2 * norm, "fp16-mixed {norm16} vs {norm}");
}
