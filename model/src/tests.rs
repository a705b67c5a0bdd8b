//! Unit tests of the model's behaviour on the CPU backend.

use burn::backend::Flex;
use burn::module::Module;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{backend::Backend as _, Distribution, Int, Tensor, TensorData, Tolerance};

use crate::{attention_reference, GeluKind, GptConfig};

type B = Flex;

/// Flex keeps one global RNG: tests that seed it and draw from it run one at a time.
static SEED_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeded(seed: u64) -> std::sync::MutexGuard<'static, ()> {
    let guard = SEED_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    B::seed(&Default::default(), seed);
    guard
}

fn tiny() -> GptConfig {
    GptConfig::preset("tiny").unwrap()
}

fn tokens(rows: &[&[i32]]) -> Tensor<B, 2, Int> {
    let (b, t) = (rows.len(), rows[0].len());
    let flat: Vec<i32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_data(TensorData::new(flat, [b, t]), &Default::default())
}

#[test]
fn forward_maps_tokens_to_logits_of_every_position() {
    let model = tiny().init::<B>(&Default::default()).unwrap();
    let logits = model.forward(tokens(&[&[1, 2, 3, 4], &[5, 6, 7, 8]]));
    assert_eq!(logits.dims(), [2, 4, 64]);
}

#[test]
fn num_params_matches_the_config_formula_in_every_variant() {
    for (bias, tie) in [(true, true), (false, true), (true, false), (false, false)] {
        let cfg = tiny().with_bias(bias).with_tie_embeddings(tie);
        let model = cfg.init::<B>(&Default::default()).unwrap();
        assert_eq!(
            model.num_params(),
            cfg.num_params(),
            "bias {bias} tie {tie}"
        );
    }
    // Hand count, tiny (V 64, ctx 16, C 32, 2 layers, bias, tied):
    // wte 2048 + wpe 512 + 2·(ln 128 + attn 3168+1056 + mlp 4224+4128) + ln_f 64 = 28032.
    assert_eq!(tiny().num_params(), 28_032);
    let model = tiny().init::<B>(&Default::default()).unwrap();
    assert_eq!(model.num_params_without_positions(), 28_032 - 512);
}

#[test]
fn later_tokens_never_change_earlier_logits() {
    let model = tiny().init::<B>(&Default::default()).unwrap();
    let a = model.forward(tokens(&[&[1, 2, 3, 4, 5]]));
    let b = model.forward(tokens(&[&[1, 2, 3, 9, 9]]));
    let first3 = |t: Tensor<B, 3>| t.slice([0..1, 0..3, 0..64]).into_data();
    first3(a.clone()).assert_approx_eq::<f32>(&first3(b.clone()), Tolerance::absolute(1e-6));
    let last = |t: Tensor<B, 3>| t.slice([0..1, 4..5, 0..64]).into_data();
    assert_ne!(last(a), last(b));
}

#[test]
fn fused_attention_equals_the_explicit_softmax_path() {
    let device = Default::default();
    let _seed = seeded(7);
    let shape = [2, 3, 11, 8];
    let q = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let k = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let v = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let opts = AttentionModuleOptions {
        is_causal: true,
        ..Default::default()
    };
    let fused = attention(q.clone(), k.clone(), v.clone(), None, None, opts);
    let explicit = attention_reference(q, k, v, None);
    fused
        .into_data()
        .assert_approx_eq::<f32>(&explicit.into_data(), Tolerance::absolute(1e-5));
}

#[test]
fn reference_attention_with_fewer_queries_aligns_them_to_the_last_keys() {
    // A query at the last position of a KV cache sees every key: equal to the last row of the
    // full computation.
    let device = Default::default();
    let _seed = seeded(3);
    let shape = [1, 2, 6, 4];
    let q = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let k = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let v = Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), &device);
    let full = attention_reference(q.clone(), k.clone(), v.clone(), None);
    let last_q = q.slice([0..1, 0..2, 5..6, 0..4]);
    let one = attention_reference(last_q, k, v, None);
    one.into_data().assert_approx_eq::<f32>(
        &full.slice([0..1, 0..2, 5..6, 0..4]).into_data(),
        Tolerance::absolute(1e-6),
    );
}

fn mean_std(t: Tensor<B, 2>) -> (f64, f64) {
    let v: Vec<f32> = t.into_data().to_vec().unwrap();
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn gpt2_initialization_scales_residual_projections() {
    let device = Default::default();
    let _seed = seeded(0);
    let cfg = GptConfig::new(512, 8, 4, 128, 64); // residual std 0.02/√16 = 0.005
    let model = cfg.init::<B>(&device).unwrap();
    let (m, s) = mean_std(model.wte.weight.val());
    assert!(
        m.abs() < 1e-3 && (s - 0.02).abs() < 5e-4,
        "wte mean {m} std {s}"
    );
    let (_, s) = mean_std(model.h[0].attn.c_attn.weight.val());
    assert!((s - 0.02).abs() < 5e-4, "c_attn std {s}");
    let (_, s) = mean_std(model.h[3].mlp.c_proj.weight.val());
    assert!((s - 0.005).abs() < 2e-4, "mlp.c_proj std {s}");
    let (_, s) = mean_std(model.h[3].attn.c_proj.weight.val());
    assert!((s - 0.005).abs() < 3e-4, "attn.c_proj std {s}");
    let bias: Vec<f32> = model.h[0]
        .attn
        .c_attn
        .bias
        .as_ref()
        .unwrap()
        .val()
        .into_data()
        .to_vec()
        .unwrap();
    assert!(bias.iter().all(|&x| x == 0.0));
    let gain: Vec<f32> = model.h[0].ln_1.gamma.val().into_data().to_vec().unwrap();
    assert!(gain.iter().all(|&x| x == 1.0));
    let beta: Vec<f32> = model
        .ln_f
        .beta
        .as_ref()
        .unwrap()
        .val()
        .into_data()
        .to_vec()
        .unwrap();
    assert!(beta.iter().all(|&x| x == 0.0));
}

#[test]
fn same_seed_builds_identical_weights() {
    let device = Default::default();
    let build = || {
        let _seed = seeded(42);
        tiny().init::<B>(&device).unwrap().h[1]
            .mlp
            .c_fc
            .weight
            .val()
            .into_data()
    };
    assert_eq!(build(), build());
}

#[test]
fn erf_and_tanh_gelu_give_close_but_different_logits() {
    let device = Default::default();
    let _seed = seeded(1);
    let tanh = tiny().init::<B>(&device).unwrap();
    let erf_cfg = tiny().with_gelu(GeluKind::Erf);
    // Same weights, other activation: load tanh's record into an erf-configured model.
    let erf = erf_cfg
        .init::<B>(&device)
        .unwrap()
        .load_record(tanh.clone().into_record());
    let x = tokens(&[&[3, 1, 4, 1, 5, 9]]);
    let (a, b) = (tanh.forward(x.clone()), erf.forward(x));
    let diff = (a - b).abs().max().into_scalar();
    assert!(
        diff > 0.0 && diff < 1e-2,
        "max |tanh - erf| logits = {diff}"
    );
}

#[test]
fn gelu_tanh_matches_burns_gelu_approximate() {
    let device = Default::default();
    let x = Tensor::<B, 1>::from_floats([-3.0, -1.0, -0.1, 0.0, 0.5, 2.0, 4.0], &device);
    let ours = crate::mlp::gelu_tanh(x.clone()).into_data();
    let burns = burn::tensor::activation::gelu_approximate(x).into_data();
    ours.assert_approx_eq::<f32>(&burns, Tolerance::absolute(1e-6));
    // GELU(1) with the tanh form: 0.5·(1 + tanh(0.7978846·1.044715)) = 0.8411920.
    let one = crate::mlp::gelu_tanh(Tensor::<B, 1>::from_floats([1.0], &device)).into_scalar();
    assert!((one - 0.841_192).abs() < 1e-6, "{one}");
}
