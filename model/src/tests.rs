//! Unit tests of the model's behaviour on the CPU backend.

use burn::backend::Flex;
use burn::module::Module;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{backend::Backend as _, Distribution, Int, Tensor, TensorData, Tolerance};

use crate::{attention_reference, Decoder, GeluKind, GptConfig};

type B = Flex;

/// Flex keeps one global RNG: tests that seed it and draw from it run one at a time, and not
/// beside the fused ops' `randn` (the same lock).
fn seeded(seed: u64) -> std::sync::MutexGuard<'static, ()> {
    let guard = crate::ops::testing::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
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
    let _seed = seeded(0); // init draws from the global RNG
    let model = tiny().init::<B>(&Default::default()).unwrap();
    let logits = model.forward(tokens(&[&[1, 2, 3, 4], &[5, 6, 7, 8]]));
    assert_eq!(logits.dims(), [2, 4, 64]);
}

#[test]
fn num_params_matches_the_config_formula_in_every_variant() {
    let _seed = seeded(0); // init draws from the global RNG
    for (bias, tie) in [(true, true), (false, true), (true, false), (false, false)] {
        let cfg = tiny().with_bias(bias).with_tie_embeddings(tie);
        let model = cfg.init::<B>(&Default::default()).unwrap();
        assert_eq!(model.num_params(), cfg.num_params(), "bias {bias} tie {tie}");
    }
    // Hand count, tiny (V 64, ctx 16, C 32, 2 layers, bias, tied):
    // wte 2048 + wpe 512 + 2·(ln 128 + attn 3168+1056 + mlp 4224+4128) + ln_f 64 = 28032.
    assert_eq!(tiny().num_params(), 28_032);
    let model = tiny().init::<B>(&Default::default()).unwrap();
    assert_eq!(model.num_params_without_positions(), 28_032 - 512);
}

#[test]
fn later_tokens_never_change_earlier_logits() {
    let _seed = seeded(0); // init draws from the global RNG
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
    let opts = AttentionModuleOptions { is_causal: true, ..Default::default() };
    let fused = attention(q.clone(), k.clone(), v.clone(), None, None, opts);
    let explicit = attention_reference(q, k, v, None, None);
    fused.into_data().assert_approx_eq::<f32>(&explicit.into_data(), Tolerance::absolute(1e-5));
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
    let full = attention_reference(q.clone(), k.clone(), v.clone(), None, None);
    let last_q = q.slice([0..1, 0..2, 5..6, 0..4]);
    let one = attention_reference(last_q, k, v, None, None);
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
    assert!(m.abs() < 1e-3 && (s - 0.02).abs() < 5e-4, "wte mean {m} std {s}");
    let (_, s) = mean_std(model.h[0].attn.c_attn.weight.val());
    assert!((s - 0.02).abs() < 5e-4, "c_attn std {s}");
    let (_, s) = mean_std(model.h[3].mlp.c_proj.weight.val());
    assert!((s - 0.005).abs() < 2e-4, "mlp.c_proj std {s}");
    let (_, s) = mean_std(model.h[3].attn.c_proj.weight.val());
    assert!((s - 0.005).abs() < 3e-4, "attn.c_proj std {s}");
    let bias: Vec<f32> = model.h[0].attn.c_attn.bias.as_ref().unwrap().val().into_data().to_vec().unwrap();
    assert!(bias.iter().all(|&x| x == 0.0));
    let gain: Vec<f32> = model.h[0].ln_1.gamma.val().into_data().to_vec().unwrap();
    assert!(gain.iter().all(|&x| x == 1.0));
    let beta: Vec<f32> = model.ln_f.beta.as_ref().unwrap().val().into_data().to_vec().unwrap();
    assert!(beta.iter().all(|&x| x == 0.0));
}

#[test]
fn same_seed_builds_identical_weights() {
    let device = Default::default();
    let build = || {
        let _seed = seeded(42);
        tiny().init::<B>(&device).unwrap().h[1].mlp.c_fc.weight.val().into_data()
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
    let erf = erf_cfg.init::<B>(&device).unwrap().load_record(tanh.clone().into_record());
    let x = tokens(&[&[3, 1, 4, 1, 5, 9]]);
    let (a, b) = (tanh.forward(x.clone()), erf.forward(x));
    let diff = (a - b).abs().max().into_scalar();
    assert!(diff > 0.0 && diff < 1e-2, "max |tanh - erf| logits = {diff}");
}

#[test]
fn gelu_tanh_matches_burns_gelu_approximate() {
    let device = Default::default();
    let x = Tensor::<B, 1>::from_floats([-3.0, -1.0, -0.1, 0.0, 0.5, 2.0, 4.0], &device);
    let ours = crate::ops::activation::gelu_tanh(x.clone()).into_data();
    let burns = burn::tensor::activation::gelu_approximate(x).into_data();
    ours.assert_approx_eq::<f32>(&burns, Tolerance::absolute(1e-6));
    // GELU(1) with the tanh form: 0.5·(1 + tanh(0.7978846·1.044715)) = 0.8411920.
    let one = crate::ops::activation::gelu_tanh(Tensor::<B, 1>::from_floats([1.0], &device)).into_scalar();
    assert!((one - 0.841_192).abs() < 1e-6, "{one}");
}

mod cache_and_llama {
    use super::{seeded, tokens, B};
    use crate::{argmax, generate, Decoder, GptConfig, LanguageModel, LlamaConfig, ModelConfig};
    use burn::module::Module;
    use burn::tensor::{Tensor, Tolerance};

    fn models() -> Vec<LanguageModel<B>> {
        let device = Default::default();
        let gpt = ModelConfig::Gpt2(GptConfig::preset("tiny").unwrap().with_tie_embeddings(false));
        let llama = ModelConfig::Llama(LlamaConfig::preset("llama-tiny").unwrap());
        vec![gpt.init(&device).unwrap(), llama.init(&device).unwrap()]
    }

    #[test]
    fn cached_forward_equals_the_last_positions_of_a_full_forward() {
        let _seed = seeded(11);
        for model in models() {
            let full = model.forward(tokens(&[&[5, 9, 2, 7, 1, 3]]));
            let mut cache = model.new_cache();
            let first = model.forward_cached(tokens(&[&[5, 9, 2, 7]]), &mut cache);
            let fifth = model.forward_cached(tokens(&[&[1]]), &mut cache);
            let sixth = model.forward_cached(tokens(&[&[3]]), &mut cache);
            assert_eq!(cache.len(), 6);
            let got = Tensor::cat(vec![first, fifth, sixth], 1);
            got.into_data().assert_approx_eq::<f32>(&full.into_data(), Tolerance::absolute(1e-5));
        }
    }

    #[test]
    fn a_multi_token_chunk_after_a_cache_equals_the_full_forward() {
        let _seed = seeded(12);
        for model in models() {
            let full = model.forward(tokens(&[&[5, 9, 2, 7, 1, 3]]));
            let mut cache = model.new_cache();
            let _ = model.forward_cached(tokens(&[&[5, 9]]), &mut cache);
            let rest = model.forward_cached(tokens(&[&[2, 7, 1, 3]]), &mut cache);
            let [_, _, v] = rest.dims();
            rest.into_data().assert_approx_eq::<f32>(
                &full.slice([0..1, 2..6, 0..v]).into_data(),
                Tolerance::absolute(1e-5),
            );
        }
    }

    #[test]
    fn greedy_generation_with_the_cache_equals_full_recomputation() {
        let _seed = seeded(13);
        let device = Default::default();
        for model in models() {
            // 30 new tokens from a 3-token prompt run past the context of 16.
            let cached = generate(&model, &[1, 2, 3], 30, true, &device, argmax);
            let full = generate(&model, &[1, 2, 3], 30, false, &device, argmax);
            assert_eq!(cached.len(), 33);
            assert_eq!(
                cached,
                full,
                "{}",
                match model {
                    LanguageModel::Gpt2(_) => "gpt2",
                    _ => "llama",
                }
            );
        }
    }

    #[test]
    fn llama_is_causal_and_counts_its_parameters() {
        let _seed = seeded(14);
        let cfg = LlamaConfig::preset("llama-tiny").unwrap();
        let model = cfg.init::<B>(&Default::default()).unwrap();
        assert_eq!(model.num_params(), cfg.num_params());
        let a = model.forward(tokens(&[&[1, 2, 3, 4, 5]]));
        let b = model.forward(tokens(&[&[1, 2, 3, 60, 61]]));
        let first3 = |t: Tensor<B, 3>| t.slice([0..1, 0..3, 0..64]).into_data();
        first3(a).assert_approx_eq::<f32>(&first3(b), Tolerance::absolute(1e-6));
    }

    #[test]
    fn grouped_query_attention_equals_mha_with_repeated_key_value_heads() {
        // 4 query heads over 2 key/value heads: query head h reads kv head h / 2. An MHA model
        // whose kv heads 0,1,2,3 are copies of GQA heads 0,0,1,1 must compute the same logits.
        let _seed = seeded(15);
        let device = Default::default();
        let gqa_cfg = LlamaConfig::preset("llama-tiny").unwrap(); // 4 heads, 2 kv heads, d_head 8
        let gqa = gqa_cfg.init::<B>(&device).unwrap();
        let mut mha = LlamaConfig { n_kv_head: 4, ..gqa_cfg.clone() }.init::<B>(&device).unwrap();
        let repeat_heads = |w: Tensor<B, 2>| {
            // [d_model, 2·8] → [d_model, 4·8] with kv heads (0, 0, 1, 1).
            let h0 = w.clone().slice([0..32, 0..8]);
            let h1 = w.slice([0..32, 8..16]);
            Tensor::cat(vec![h0.clone(), h0, h1.clone(), h1], 1)
        };
        for (g, m) in gqa.model.layers.iter().zip(mha.model.layers.iter_mut()) {
            m.self_attn.k_proj.weight =
                burn::module::Param::from_tensor(repeat_heads(g.self_attn.k_proj.weight.val()));
            m.self_attn.v_proj.weight =
                burn::module::Param::from_tensor(repeat_heads(g.self_attn.v_proj.weight.val()));
        }
        let mha = {
            // Every other parameter equal to the GQA model's.
            let mut m = mha;
            m.model.embed_tokens = gqa.model.embed_tokens.clone();
            m.model.norm = gqa.model.norm.clone();
            m.lm_head = gqa.lm_head.clone();
            for (g, l) in gqa.model.layers.iter().zip(m.model.layers.iter_mut()) {
                l.input_layernorm = g.input_layernorm.clone();
                l.post_attention_layernorm = g.post_attention_layernorm.clone();
                l.mlp = g.mlp.clone();
                l.self_attn.q_proj = g.self_attn.q_proj.clone();
                l.self_attn.o_proj = g.self_attn.o_proj.clone();
            }
            m
        };
        let x = tokens(&[&[7, 3, 9, 12, 4]]);
        mha.forward(x.clone())
            .into_data()
            .assert_approx_eq::<f32>(&gqa.forward(x).into_data(), Tolerance::absolute(1e-6));
    }
}

mod hf_weights {
    use super::{seeded, B};
    use crate::hf::{self, HfError};
    use crate::{GptConfig, LanguageModel, LlamaConfig, ModelConfig};
    use burn_store::{ModuleStore, SafetensorsStore};
    use std::path::Path;

    /// Every tensor of a safetensors file: (name, shape, dtype, bytes), sorted by name.
    fn tensors(path: &Path) -> Vec<(String, Vec<usize>, String, Vec<u8>)> {
        let mut store = SafetensorsStore::from_file(path);
        let mut out: Vec<_> = store
            .get_all_snapshots()
            .unwrap()
            .iter()
            .map(|(name, s)| {
                let data = s.to_data().unwrap();
                (name.clone(), s.shape.to_vec(), format!("{:?}", s.dtype), data.as_bytes().to_vec())
            })
            .collect();
        out.sort();
        out
    }

    fn names(path: &Path) -> Vec<(String, Vec<usize>)> {
        tensors(path).into_iter().map(|(n, s, _, _)| (n, s)).collect()
    }

    fn model(config: ModelConfig) -> LanguageModel<B> {
        config.init(&Default::default()).unwrap()
    }

    fn gpt_tiny() -> ModelConfig {
        ModelConfig::Gpt2(GptConfig::preset("tiny").unwrap())
    }

    #[test]
    fn gpt2_export_uses_hugging_face_names_and_layouts() {
        let _seed = seeded(21);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        hf::save(&model(gpt_tiny()), &path).unwrap();
        let names = names(&path);
        assert!(names.contains(&("transformer.h.1.attn.c_attn.weight".into(), vec![32, 96])), "{names:?}");
        assert!(names.contains(&("transformer.h.0.ln_1.weight".into(), vec![32])));
        assert!(names.contains(&("transformer.ln_f.bias".into(), vec![32])));
        assert!(names.contains(&("transformer.wpe.weight".into(), vec![16, 32])));
        assert!(!names.iter().any(|(n, _)| n.contains("lm_head") || n.contains("gamma")));
        assert_eq!(names.len(), 2 + 2 * 12 + 2);
    }

    #[test]
    fn export_import_export_is_bit_identical_for_both_architectures() {
        let _seed = seeded(22);
        let dir = tempfile::tempdir().unwrap();
        let llama = ModelConfig::Llama(LlamaConfig::preset("llama-tiny").unwrap());
        for (i, config) in [gpt_tiny(), llama].into_iter().enumerate() {
            let (a, b) =
                (dir.path().join(format!("a{i}.safetensors")), dir.path().join(format!("b{i}.safetensors")));
            hf::save(&model(config.clone()), &a).unwrap();
            let loaded = hf::load(model(config), &a).unwrap();
            hf::save(&loaded, &b).unwrap();
            assert_eq!(tensors(&a), tensors(&b));
            assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "byte-identical files");
        }
    }

    #[test]
    fn llama_export_uses_pytorch_linear_layout() {
        let _seed = seeded(23);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("llama.safetensors");
        hf::save(&model(ModelConfig::Llama(LlamaConfig::preset("llama-tiny").unwrap())), &path).unwrap();
        let names = names(&path);
        // llama-tiny: d_model 32, 4 heads of 8, 2 kv heads, d_ff 88, vocab 64, untied.
        for (name, shape) in [
            ("model.embed_tokens.weight", vec![64, 32]),
            ("model.layers.0.self_attn.q_proj.weight", vec![32, 32]),
            ("model.layers.0.self_attn.k_proj.weight", vec![16, 32]),
            ("model.layers.1.mlp.gate_proj.weight", vec![88, 32]),
            ("model.layers.1.mlp.down_proj.weight", vec![32, 88]),
            ("model.layers.1.input_layernorm.weight", vec![32]),
            ("model.norm.weight", vec![32]),
            ("lm_head.weight", vec![64, 32]),
        ] {
            assert!(names.contains(&(name.to_string(), shape.clone())), "{name} {shape:?} not in {names:?}");
        }
    }

    #[test]
    fn a_file_for_another_model_lists_every_mismatch() {
        let _seed = seeded(24);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("three_layers.safetensors");
        let tiny = GptConfig::preset("tiny").unwrap();
        let bigger = ModelConfig::Gpt2(GptConfig { n_layer: 3, vocab_size: 70, ..tiny.clone() });
        hf::save(&model(bigger), &path).unwrap();
        let err = hf::load(model(gpt_tiny()), &path).unwrap_err();
        let HfError::Mismatch { missing, unexpected, misshaped, .. } = &err else { panic!("{err}") };
        assert!(missing.is_empty(), "{missing:?}");
        assert_eq!(unexpected.len(), 12, "layer 2's tensors: {unexpected:?}");
        assert!(unexpected.contains(&"transformer.h.2.mlp.c_fc.bias".to_string()), "{unexpected:?}");
        assert_eq!(misshaped.len(), 1, "{misshaped:?}");
        assert!(
            misshaped[0].starts_with("transformer.wte.weight expected [64, 32], found [70, 32]"),
            "{misshaped:?}"
        );
        let text = err.to_string();
        assert!(text.contains("unexpected (12)") && text.contains("mis-shaped (1)"), "{text}");

        let err = hf::load(model(ModelConfig::Gpt2(GptConfig { n_layer: 4, ..tiny })), &path).unwrap_err();
        let HfError::Mismatch { missing, .. } = &err else { panic!("{err}") };
        assert_eq!(missing.len(), 12, "layer 3's tensors: {missing:?}");
        assert!(missing.contains(&"transformer.h.3.ln_2.weight".to_string()), "{missing:?}");
    }

    #[test]
    fn the_vocabulary_size_is_read_from_the_file() {
        let _seed = seeded(26);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v70.safetensors");
        let config = GptConfig { vocab_size: 70, ..GptConfig::preset("tiny").unwrap() };
        hf::save(&model(ModelConfig::Gpt2(config)), &path).unwrap();
        assert_eq!(hf::vocab_size(&path).unwrap(), 70);
        let llama = dir.path().join("llama.safetensors");
        hf::save(&model(ModelConfig::Llama(LlamaConfig::preset("llama-tiny").unwrap())), &llama).unwrap();
        assert_eq!(hf::vocab_size(&llama).unwrap(), 64);
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let err = hf::load(model(gpt_tiny()), Path::new("/no/such/model.safetensors")).unwrap_err();
        assert!(err.to_string().contains("/no/such/model.safetensors"), "{err}");
    }

    /// A directory is read as a Hugging Face model directory (its `model.safetensors`); one
    /// without it is said to be so, not an OS error of reading a directory as a file.
    #[test]
    fn a_directory_means_its_model_safetensors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not weights").unwrap();
        for err in [
            hf::vocab_size(dir.path()).unwrap_err(),
            hf::load(model(gpt_tiny()), dir.path()).map(|_| ()).unwrap_err(),
        ] {
            let text = err.to_string();
            assert!(
                text.contains("a directory without model.safetensors") && !text.contains("os error"),
                "{text}"
            );
        }
        let _seed = seeded(24);
        let config = GptConfig { vocab_size: 70, ..GptConfig::preset("tiny").unwrap() };
        let saved = dir.path().join(hf::WEIGHTS_FILE);
        hf::save(&model(ModelConfig::Gpt2(config.clone())), &saved).unwrap();
        assert_eq!(hf::vocab_size(dir.path()).unwrap(), 70);
        let loaded = hf::load(model(ModelConfig::Gpt2(config)), dir.path()).unwrap();
        let again = dir.path().join("again.safetensors");
        hf::save(&loaded, &again).unwrap();
        assert_eq!(std::fs::read(&saved).unwrap(), std::fs::read(&again).unwrap(), "the directory's weights");
    }

    #[test]
    fn the_pytorch_fixture_loads_and_round_trips_bit_identically() {
        let Some(shared) = std::env::var_os("EMBER_SHARED") else {
            eprintln!("skipping: EMBER_SHARED is not set");
            return;
        };
        let fixture = Path::new(&shared).join("parity/gpt2-tiny/init.safetensors");
        let _seed = seeded(25);
        // expected.json's config: vocab 64, context 16, 2 layers, 2 heads, width 32, bias.
        let config = ModelConfig::Gpt2(GptConfig::new(64, 2, 2, 32, 16));
        let loaded = hf::load(model(config), &fixture).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("export.safetensors");
        hf::save(&loaded, &out).unwrap();
        assert_eq!(tensors(&fixture), tensors(&out));
    }
}

mod packing {
    use super::{seeded, tokens, B};
    use crate::{GptConfig, LanguageModel, LlamaConfig, ModelConfig, Packing};
    use burn::tensor::{Tensor, Tolerance};

    #[test]
    fn a_document_packed_after_another_has_the_logits_it_has_alone() {
        let _seed = seeded(31);
        let device = Default::default();
        let configs = [
            ModelConfig::Gpt2(GptConfig::preset("tiny").unwrap()),
            ModelConfig::Llama(LlamaConfig::preset("llama-tiny").unwrap()),
        ];
        for config in configs {
            let model: LanguageModel<B> = config.init(&device).unwrap();
            // Row: document A (5 tokens, its EOS 63 last), then document B (4 tokens).
            let row: [i32; 9] = [4, 8, 15, 16, 63, 23, 42, 7, 9];
            let segments = [0, 0, 0, 0, 0, 1, 1, 1, 1];
            let packing = Packing::from_segments(&segments, 1, 9, &device);
            let packed = model.forward_packed(tokens(&[&row]), &packing);
            let alone_b = model.forward(tokens(&[&row[5..]]));
            let alone_a = model.forward(tokens(&[&row[..5]]));
            let v = packed.dims()[2];
            let part = |t: Tensor<B, 3>, r: std::ops::Range<usize>| t.slice([0..1, r, 0..v]).into_data();
            part(packed.clone(), 5..9)
                .assert_approx_eq::<f32>(&alone_b.into_data(), Tolerance::absolute(1e-5));
            part(packed.clone(), 0..5)
                .assert_approx_eq::<f32>(&alone_a.into_data(), Tolerance::absolute(1e-5));
            // Without packing, B would see A: its logits differ.
            let unpacked = model.forward(tokens(&[&row]));
            assert_ne!(part(unpacked, 5..9), part(packed, 5..9));
        }
    }

    #[test]
    fn packing_positions_restart_and_the_mask_is_block_diagonal_causal() {
        let device = Default::default();
        let packing = Packing::<B>::from_segments(&[0, 0, 1, 1, 1, 0, 1, 1, 2, 2], 2, 5, &device);
        let positions: Vec<i64> = packing.positions.into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(positions, vec![0, 1, 0, 1, 2, 0, 0, 1, 0, 1]);
        let mask: Vec<bool> = packing.mask.into_data().to_vec().unwrap();
        // Row 0, query 3 (segment 1): sees keys 2 and 3 only.
        assert_eq!(&mask[15..20], &[true, true, false, false, true]);
    }
}

/// `ModelConfig::param_sizes` lists the tensors `init` draws, in visiting order, for both
/// architectures (tied and untied), and sums to the parameter count without allocating GPT-2.
#[test]
fn param_sizes_are_the_models_tensors_without_drawing_them() {
    use crate::{LlamaConfig, ModelConfig};
    struct Sizes(Vec<usize>);
    impl burn::module::ModuleVisitor<B> for Sizes {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            self.0.push(param.val().shape().num_elements());
        }
    }
    let _g = seeded(3);
    for config in [
        ModelConfig::Gpt2(tiny()),
        ModelConfig::Gpt2(tiny().with_tie_embeddings(false)),
        ModelConfig::Gpt2(GptConfig::preset("shakespeare-char").unwrap()),
        ModelConfig::Llama(LlamaConfig::preset("llama-tiny").unwrap()),
    ] {
        let mut drawn = Sizes(Vec::new());
        config.init::<B>(&Default::default()).unwrap().visit(&mut drawn);
        assert_eq!(config.param_sizes().unwrap(), drawn.0, "{config:?}");
    }
    let gpt2 = ModelConfig::preset("gpt2").unwrap().param_sizes().unwrap();
    assert_eq!(gpt2.iter().sum::<usize>(), 124_475_904);
    assert_eq!(gpt2.len(), 2 + 12 * 12 + 2, "wte, wpe, 12 blocks of 12 tensors, ln_f");
}
