//! Activation checkpointing per block equals one backward through the whole graph: every
//! parameter gradient and the loss, with dropout on (GPT-2: embedding, attention and residual
//! dropout) and packed documents, for both architectures.
//!
//! Its own test binary: Flex keeps one global RNG, and these tests re-seed it per stage, so
//! nothing else may draw from it meanwhile (the tests here take `LOCK`).

use std::collections::HashMap;
use std::sync::Mutex;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use ember_model::ops::cross_entropy_sum;
use ember_model::{
    autocast, backward_checkpointed, with_dropout_seed, GptConfig, LanguageModel, LlamaConfig, ModelConfig,
    Packing, Precision,
};

type Ad = Autodiff<Flex>;

static LOCK: Mutex<()> = Mutex::new(());

/// Parameter gradients by id, summed over the stages' gradient sets.
#[derive(Default)]
struct Grads(HashMap<ParamId, Vec<f32>>);

impl Grads {
    fn add(&mut self, model: &LanguageModel<Ad>, grads: &<Ad as AutodiffBackend>::Gradients) {
        struct Visit<'a>(&'a <Ad as AutodiffBackend>::Gradients, &'a mut HashMap<ParamId, Vec<f32>>);
        impl ModuleVisitor<Ad> for Visit<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
                if let Some(g) = param.val().grad(self.0) {
                    let g = g.into_data().to_vec::<f32>().unwrap();
                    match self.1.get_mut(&param.id) {
                        Some(sum) => sum.iter_mut().zip(g).for_each(|(s, x)| *s += x),
                        None => {
                            self.1.insert(param.id, g);
                        }
                    }
                }
            }
        }
        model.visit(&mut Visit(grads, &mut self.0));
    }
}

fn tokens(batch: usize, seq: usize, vocab: usize) -> Tensor<Ad, 2, Int> {
    let ids: Vec<i32> = (0..batch * seq).map(|i| ((i * 7 + 3) % vocab) as i32).collect();
    Tensor::from_data(TensorData::new(ids, [batch, seq]), &Default::default())
}

/// The summed NLL of `logits` `[batch, seq, vocab]` against `targets`.
fn loss(logits: Tensor<Ad, 3>, targets: Tensor<Ad, 2, Int>) -> Tensor<Ad, 1> {
    let [b, t, v] = logits.dims();
    cross_entropy_sum(logits.reshape([b * t, v]), targets.reshape([b * t]), -100)
}

/// (loss, gradients) of one backward through the whole graph, and of the checkpointed one.
fn both(
    model: &LanguageModel<Ad>,
    seed: Option<u64>,
    packing: Option<&Packing<Ad>>,
    precision: Precision,
) -> [(f32, Grads); 2] {
    let (batch, seq, vocab) = (2, 12, 64);
    let inputs = tokens(batch, seq, vocab);
    let targets = tokens(batch, seq, vocab).add_scalar(1).remainder_scalar(vocab as i32);
    let in_region = |f: &mut dyn FnMut() -> (f32, Grads)| match seed {
        Some(seed) => with_dropout_seed(seed, || autocast(precision, &mut *f)),
        None => autocast(precision, f),
    };
    let full = in_region(&mut || {
        let logits = match packing {
            Some(p) => model.forward_packed(inputs.clone(), p),
            None => model.forward(inputs.clone()),
        };
        let value = loss(logits, targets.clone());
        let mut grads = Grads::default();
        grads.add(model, &value.clone().mul_scalar(0.5).backward());
        (value.into_scalar(), grads)
    });
    let checkpointed = in_region(&mut || {
        let mut grads = Grads::default();
        let value = backward_checkpointed(
            model,
            inputs.clone(),
            packing,
            |logits| loss(logits, targets.clone()),
            0.5,
            |g| grads.add(model, &g),
        );
        (value.into_scalar(), grads)
    });
    [full, checkpointed]
}

/// Largest |a − b| over all gradients ÷ largest |b|.
fn max_rel(a: &Grads, b: &Grads) -> f32 {
    assert_eq!(a.0.len(), b.0.len(), "the same parameters have gradients");
    let (mut diff, mut scale) = (0f32, 0f32);
    for (id, want) in &b.0 {
        let got = &a.0[id];
        for (g, w) in got.iter().zip(want) {
            diff = diff.max((g - w).abs());
            scale = scale.max(w.abs());
        }
    }
    diff / scale
}

fn gpt(dropout: f64, tied: bool) -> LanguageModel<Ad> {
    let config = GptConfig { dropout, tie_embeddings: tied, ..GptConfig::preset("tiny").unwrap() };
    ModelConfig::Gpt2(config).init::<Ad>(&Default::default()).unwrap()
}

#[test]
fn gpt_blocks_equal_one_backward_with_dropout_and_packing() {
    let _lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    Flex::seed(&Default::default(), 5);
    for tied in [true, false] {
        let model = gpt(0.2, tied);
        let segments: Vec<u32> = (0..24).map(|i| if i % 12 < 5 { 0 } else { 1 }).collect();
        let packing = Packing::from_segments(&segments, 2, 12, &Default::default());
        for packing in [None, Some(&packing)] {
            let [(l_full, g_full), (l_ckpt, g_ckpt)] = both(&model, Some(99), packing, Precision::Fp32);
            assert_eq!(l_full, l_ckpt, "the same masks give the same loss");
            let rel = max_rel(&g_ckpt, &g_full);
            assert!(rel <= 1e-6, "tied {tied}, packed {}: gradients differ by {rel:e}", packing.is_some());
            // The masks were on: without dropout the loss differs.
            let [(l_plain, _), _] = both(&gpt_without_dropout(&model), Some(99), packing, Precision::Fp32);
            assert_ne!(l_full, l_plain);
        }
    }
}

/// Without per-stage seeds the recompute draws other masks: what the seeds are for (and proof
/// that the comparison above can fail).
#[test]
fn without_stage_seeds_the_recompute_draws_other_masks() {
    let _lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    Flex::seed(&Default::default(), 6);
    let model = gpt(0.2, true);
    let [(_, g_full), (_, g_ckpt)] = both(&model, None, None, Precision::Fp32);
    assert!(max_rel(&g_ckpt, &g_full) > 1e-3);
}

#[test]
fn llama_blocks_equal_one_backward_in_fp32_and_bf16() {
    let _lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    Flex::seed(&Default::default(), 7);
    let config = LlamaConfig { vocab_size: 64, ..LlamaConfig::preset("llama-tiny").unwrap() };
    let model = ModelConfig::Llama(config).init::<Ad>(&Default::default()).unwrap();
    let segments: Vec<u32> = (0..24).map(|i| (i % 12 >= 7) as u32).collect();
    let packing = Packing::from_segments(&segments, 2, 12, &Default::default());
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let [(l_full, g_full), (l_ckpt, g_ckpt)] = both(&model, Some(3), Some(&packing), precision);
        assert_eq!(l_full, l_ckpt);
        let rel = max_rel(&g_ckpt, &g_full);
        assert!(rel <= 1e-6, "{precision:?}: gradients differ by {rel:e}");
    }
}

/// `model` with its dropout off (the same weights).
fn gpt_without_dropout(model: &LanguageModel<Ad>) -> LanguageModel<Ad> {
    let LanguageModel::Gpt2(inner) = model else { unreachable!("a GPT-2 model") };
    let fresh = gpt(0.0, inner.lm_head.is_none());
    fresh.load_record(model.clone().into_record())
}
