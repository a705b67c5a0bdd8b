//! The training semantics of issue 2, each test named after the behaviour, with hand-computed
//! values where the behaviour has one.

mod common;

use burn::module::Param;
use burn::nn::LayerNormConfig;
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend as _;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use common::*;
use ember_model::GptConfig;
use ember_train::step::forward_backward;
use ember_train::step::optim::{clip_grad_norm, AdamWGroups};
use ember_train::OptimizerConfig;

fn tiny_model(seed: u64) -> ember_model::LanguageModel<B> {
    B::seed(&Default::default(), seed);
    let config = ember_model::ModelConfig::Gpt2(GptConfig::preset("tiny").unwrap());
    config.init::<B>(&Default::default()).unwrap()
}

fn loss_of(out: &Tensor<<B as burn::tensor::backend::AutodiffBackend>::InnerBackend, 1>) -> f64 {
    out.clone().into_scalar().elem()
}

#[test]
fn fresh_model_loss_is_ln_vocab() {
    let _g = serial();
    let model = tiny_model(5);
    // 4 rows of 16 tokens spread over the vocabulary of 64.
    let inputs: Vec<u32> = (0..64u32).map(|i| (i * 37 + 11) % 64).collect();
    let targets: Vec<i32> = (0..64i32).map(|i| (i * 23 + 5) % 64).collect();
    let batch = ember_data::Batch { batch_size: 4, seq_len: 16, inputs, targets, segments: None };
    let (_, loss, scored) = forward_backward(&model, &[batch], 1, &Default::default()).unwrap();
    assert_eq!(scored, 64);
    let loss = loss_of(&loss);
    assert!((loss - 64f64.ln()).abs() < 0.15, "loss {loss} vs ln 64 = {}", 64f64.ln());
}

#[test]
fn appending_ignored_positions_changes_neither_loss_nor_gradients() {
    let _g = serial();
    let model = tiny_model(6);
    let device = Default::default();
    let short = batch(&[(&[1, 2, 3, 4, 5, 6], &[2, 3, 4, 5, 6, 7])]);
    let long = batch(&[(&[1, 2, 3, 4, 5, 6, 9, 9, 9], &[2, 3, 4, 5, 6, 7, X, X, X])]);
    let (g_short, l_short, n_short) = forward_backward(&model, &[short], 1, &device).unwrap();
    let (g_long, l_long, n_long) = forward_backward(&model, &[long], 1, &device).unwrap();
    assert_eq!((n_short, n_long), (6, 6));
    assert!((loss_of(&l_short) - loss_of(&l_long)).abs() < 1e-6);
    let diff = max_abs_diff(&flat_grads(&model, &g_short), &flat_grads(&model, &g_long));
    assert!(diff < 1e-6, "max gradient difference {diff}");
}

#[test]
fn micro_batches_of_3_and_7_scored_tokens_equal_one_batch_of_10() {
    let _g = serial();
    let model = tiny_model(7);
    let device = Default::default();
    let row_a: (&[u32], &[i32]) = (&[3, 1, 4, 1, 5, 9, 2, 6], &[X, X, X, X, X, 2, 6, 5]); // 3 scored
    let row_b: (&[u32], &[i32]) = (&[2, 7, 1, 8, 2, 8, 1, 8], &[7, 1, 8, 2, 8, 1, 8, X]); // 7 scored
    let (g_acc, l_acc, n_acc) =
        forward_backward(&model, &[batch(&[row_a]), batch(&[row_b])], 1, &device).unwrap();
    let (g_full, l_full, n_full) = forward_backward(&model, &[batch(&[row_a, row_b])], 1, &device).unwrap();
    assert_eq!((n_acc, n_full), (10, 10));
    assert!((loss_of(&l_acc) - loss_of(&l_full)).abs() < 1e-6);
    let (acc, full) = (flat_grads(&model, &g_acc), flat_grads(&model, &g_full));
    let diff = max_abs_diff(&acc, &full);
    assert!(diff < 1e-6, "max gradient difference {diff}");

    // The pitfall this guards against: the mean of per-micro-batch means weights the 3 tokens
    // of the first batch like the 7 of the second, a different loss.
    let (_, l_a, _) = forward_backward(&model, &[batch(&[row_a])], 1, &device).unwrap();
    let (_, l_b, _) = forward_backward(&model, &[batch(&[row_b])], 1, &device).unwrap();
    let mean_of_means = (loss_of(&l_a) + loss_of(&l_b)) / 2.0;
    assert!((mean_of_means - loss_of(&l_full)).abs() > 1e-4);
}

#[test]
fn a_batch_with_no_scored_token_is_an_error_not_nan() {
    let _g = serial();
    let model = tiny_model(8);
    let empty = batch(&[(&[1, 2, 3], &[X, X, X])]);
    let err = forward_backward(&model, &[empty], 4, &Default::default()).unwrap_err();
    assert!(err.to_string().contains("step 4") && err.to_string().contains("no scored tokens"), "{err}");
}

mod toys {
    use burn::module::{Module, Param};
    use burn::nn::LayerNorm;
    use burn::tensor::backend::Backend;
    use burn::tensor::Tensor;

    /// Two 1-D parameters whose loss `p·c₁ + q·c₂` has gradients `c₁`, `c₂`.
    #[derive(Module, Debug)]
    pub struct Pair<B: Backend> {
        pub p: Param<Tensor<B, 1>>,
        pub q: Param<Tensor<B, 1>>,
    }

    /// A weight matrix, a LayerNorm and a bias.
    #[derive(Module, Debug)]
    pub struct Toy<B: Backend> {
        pub weight: Param<Tensor<B, 2>>,
        pub norm: LayerNorm<B>,
        pub bias: Param<Tensor<B, 1>>,
    }
}
use toys::{Pair, Toy};

#[test]
fn clipping_uses_the_global_norm_over_all_tensors() {
    let device = Default::default();
    let pair = Pair::<B> {
        p: Param::from_tensor(Tensor::zeros([2], &device)),
        q: Param::from_tensor(Tensor::zeros([2], &device)),
    };
    let c1 = Tensor::<B, 1>::from_floats([3.0, 4.0], &device);
    let c2 = Tensor::<B, 1>::from_floats([0.0, 12.0], &device);
    let loss = (pair.p.val() * c1).sum() + (pair.q.val() * c2).sum();
    let mut grads = GradientsParams::from_grads(loss.backward(), &pair);
    let norm: f32 = clip_grad_norm::<B, _>(&pair, &mut grads, 1.0).into_scalar().elem();
    assert!((norm - 13.0).abs() < 1e-6, "reported norm {norm}");
    let got = flat_grads(&pair, &grads);
    let want = [vec![3.0 / 13.0, 4.0 / 13.0], vec![0.0, 12.0 / 13.0]];
    assert!(max_abs_diff(&got, &want) < 1e-6, "{got:?}");
}

#[test]
fn clipping_leaves_gradients_under_the_limit_alone() {
    let device = Default::default();
    let pair = Pair::<B> {
        p: Param::from_tensor(Tensor::zeros([2], &device)),
        q: Param::from_tensor(Tensor::zeros([2], &device)),
    };
    let loss = (pair.p.val() * Tensor::from_floats([0.3, 0.4], &device)).sum() + pair.q.val().sum() * 0.0;
    let mut grads = GradientsParams::from_grads(loss.backward(), &pair);
    let norm: f32 = clip_grad_norm::<B, _>(&pair, &mut grads, 1.0).into_scalar().elem();
    assert!((norm - 0.5).abs() < 1e-6);
    assert!(max_abs_diff(&flat_grads(&pair, &grads), &[vec![0.3, 0.4], vec![0.0, 0.0]]) < 1e-7);
}

#[test]
fn weight_decay_shrinks_matrices_only() {
    let device = Default::default();
    let toy = Toy::<B> {
        weight: Param::from_tensor(Tensor::ones([2, 2], &device)),
        norm: LayerNormConfig::new(2).init(&device),
        bias: Param::from_tensor(Tensor::from_floats([0.5, -0.5], &device)),
    };
    // Zero gradients for every parameter.
    let x = Tensor::<B, 2>::ones([1, 2], &device);
    let loss = (toy.weight.val().sum() + toy.norm.forward(x).sum() + toy.bias.val().sum()) * 0.0;
    let grads = GradientsParams::from_grads(loss.backward(), &toy);
    let config = OptimizerConfig { weight_decay: 0.1, ..Default::default() };
    let mut optim = AdamWGroups::new(&config, &toy);
    assert_eq!((optim.census.decayed_tensors, optim.census.no_decay_tensors), (1, 3));
    let toy = optim.step(0.1, toy, grads);
    let values = |t: Tensor<B, 2>| t.into_data().to_vec::<f32>().unwrap();
    assert_eq!(values(toy.weight.val()), vec![0.99; 4], "1.0 · (1 − 0.1·0.1)");
    assert_eq!(toy.norm.gamma.val().into_data().to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
    assert_eq!(toy.norm.beta.as_ref().unwrap().val().into_data().to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    assert_eq!(toy.bias.val().into_data().to_vec::<f32>().unwrap(), vec![0.5, -0.5]);
}

#[test]
fn gpt_census_decays_embeddings_and_weights_not_biases_or_norms() {
    let _g = serial();
    let model = tiny_model(9);
    let optim = AdamWGroups::new(&OptimizerConfig::default(), &model);
    // tiny: 2 layers. Decayed: wte, wpe + 4 matrices per layer = 10 tensors.
    // Not decayed: per layer ln_1 (γ, β), ln_2 (γ, β) and 4 biases = 8, plus ln_f (γ, β) = 18.
    assert_eq!((optim.census.decayed_tensors, optim.census.no_decay_tensors), (10, 18));
    // C = 32: 1-D elements = 2·(4·32 + 3·32 + 32 + 4·32 + 32) + 2·32 = 896.
    assert_eq!(optim.census.no_decay_params, 896);
    assert_eq!(optim.census.decayed_params + optim.census.no_decay_params, model.num_params());
}

#[test]
fn adamw_first_step_moves_each_weight_by_lr_against_the_gradient_sign() {
    // Bias-corrected Adam's first step is lr · g/(|g| + ε) = ±lr (Kingma & Ba 2015, §2).
    let device = Default::default();
    let pair = Pair::<B> {
        p: Param::from_tensor(Tensor::zeros([2], &device)),
        q: Param::from_tensor(Tensor::zeros([2], &device)),
    };
    let loss = (pair.p.val() * Tensor::from_data(TensorData::from([2.0f32, -0.5]), &device)).sum()
        + pair.q.val().sum();
    let grads = GradientsParams::from_grads(loss.backward(), &pair);
    let mut optim = AdamWGroups::new(&OptimizerConfig::default(), &pair);
    let pair = optim.step(0.01, pair, grads);
    let p = pair.p.val().into_data().to_vec::<f32>().unwrap();
    assert!((p[0] + 0.01).abs() < 1e-7 && (p[1] - 0.01).abs() < 1e-7, "{p:?}");
}
