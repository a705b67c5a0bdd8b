//! Every run configuration shipped in `examples/` loads and describes the model it claims.

use std::path::Path;

use ember_model::ModelConfig;
use ember_train::{BackendKind, RunConfig};

fn example(name: &str) -> RunConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
    RunConfig::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn shakespeare_char_is_nanogpts_cpu_config() {
    let c = example("shakespeare_char.toml");
    let ModelConfig::Gpt2(m) = &c.model else { panic!("a GPT-2 config") };
    assert_eq!((m.n_layer, m.n_head, m.d_model, m.block_size, m.dropout), (4, 4, 128, 64, 0.0));
    assert_eq!((c.micro_batch_size, c.max_steps, c.eval_every, c.eval_batches), (12, 2000, 250, 20));
    let o = &c.optimizer;
    assert_eq!(
        (o.lr, o.min_lr, o.warmup_steps, o.lr_decay_steps, o.beta2),
        (1e-3, 1e-4, 100, Some(2000), 0.99)
    );
    assert_eq!(c.backend, BackendKind::Flex);
}

#[test]
fn shakespeare_char_gpu_is_nanogpts_gpu_config() {
    let c = example("shakespeare_char_gpu.toml");
    let ModelConfig::Gpt2(m) = &c.model else { panic!("a GPT-2 config") };
    assert_eq!((m.n_layer, m.n_head, m.d_model, m.block_size, m.dropout), (6, 6, 384, 256, 0.2));
    assert_eq!((c.micro_batch_size, c.max_steps), (64, 5000));
    assert_eq!(c.backend, BackendKind::Cuda);
}

#[test]
fn gpt2_124m_has_a_half_million_token_batch() {
    let mut c = example("gpt2_124m.toml");
    c.resolve_vocab(Some(50257)).unwrap();
    assert_eq!(c.model.vocab_size(), 50304);
    assert_eq!(c.tokens_per_step(1), 491_520);
    assert_eq!(c.model.num_params(), 124_373_760, "124M without biases, padded vocabulary");
}

#[test]
fn tiny_char_loads() {
    assert!(matches!(example("tiny_char.toml").model, ModelConfig::Gpt2(m) if m.n_layer == 2));
}

#[test]
fn gpt2_hf_describes_the_published_weights() {
    let c = example("gpt2_hf.toml");
    assert_eq!(c.init_from.as_deref(), Some(Path::new("model.safetensors")));
    assert_eq!(c.model.vocab_size(), 50257);
    assert_eq!(c.model.num_params(), 124_439_808, "the published GPT-2 small");
}
