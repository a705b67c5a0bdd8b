//! Loading, overriding and checking run configurations.

use std::path::Path;

use ember_model::ModelConfig;

use super::*;

const BASE: &str = r#"
max_steps = 10
micro_batch_size = 2
[model]
preset = "tiny"
n_layer = 3
[optimizer]
lr = 1e-3
"#;

fn load(text: &str, overrides: &[&str]) -> Result<RunConfig, ConfigError> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    RunConfig::from_toml_str(text, Path::new("run.toml"), &overrides)
}

#[test]
fn preset_fields_are_overlaid_by_explicit_keys() {
    let mut c = load(BASE, &[]).unwrap();
    let ModelConfig::Gpt2(m) = &c.model else { panic!("tiny is a GPT-2 preset") };
    assert_eq!((m.n_layer, m.d_model), (3, 32));
    c.resolve_vocab(Some(50)).unwrap();
    assert_eq!(c.model.vocab_size(), 64, "the preset's vocabulary holds the data's");
    assert_eq!(c.optimizer.lr_decay_steps, Some(10));
    assert_eq!(c.seed, 1337);
}

#[test]
fn set_overrides_stable_keys_and_nested_ones() {
    let c = load(
        BASE,
        &[
            "max_steps=7",
            "seed=3",
            "eval_every=2",
            "eval_batches=4",
            "checkpoint_every=5",
            "optimizer.lr=0.01",
            "model.dropout=0.1",
        ],
    )
    .unwrap();
    assert_eq!((c.max_steps, c.seed, c.eval_every, c.eval_batches, c.checkpoint_every), (7, 3, 2, 4, 5));
    assert_eq!(c.optimizer.lr, 0.01);
    assert!(matches!(&c.model, ModelConfig::Gpt2(m) if m.dropout == 0.1));
}

#[test]
fn unknown_top_level_key_names_file_and_key() {
    let err = load(&format!("max_step = 3\n{BASE}"), &[]).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: "), "{err}");
    assert!(err.contains("unknown field `max_step`"), "{err}");
    // Set with --set, an unknown table names the --set, however deep its key.
    for set in ["no.such.key=1", " no . such = 1", "model.no.such=1"] {
        let err = load(BASE, &[set]).unwrap_err().to_string();
        assert!(err.starts_with(&format!("--set {set}: key `")), "{err}");
    }
}

#[test]
fn unknown_model_and_optimizer_keys_are_errors() {
    let err = load(BASE, &["model.n_heads=2"]).unwrap_err().to_string();
    assert!(err.contains("key `model.n_heads`: unknown key for arch \"gpt2\""), "{err}");
    let err = load(BASE, &["optimizer.learning_rate=2"]).unwrap_err().to_string();
    assert!(err.contains("optimizer") && err.contains("learning_rate"), "{err}");
}

#[test]
fn bad_values_name_the_key() {
    let err = load(BASE, &["micro_batch_size=\"four\""]).unwrap_err().to_string();
    assert!(err.contains("key `micro_batch_size`"), "{err}");
    let err = load(BASE, &["model.n_head=5"]).unwrap_err().to_string();
    assert!(err.contains("key `model.d_model`") && err.contains("divisible by n_head (5)"), "{err}");
    let err = load(BASE, &["optimizer.min_lr=1"]).unwrap_err().to_string();
    assert!(err.contains("key `optimizer.min_lr`"), "{err}");
    let err = load(BASE, &["model.preset=\"gpt9\""]).unwrap_err().to_string();
    assert!(err.contains("key `model.preset`") && err.contains("gpt9"), "{err}");
    let err = load("max_steps = 1\nmicro_batch_size = 1\n", &[]).unwrap_err().to_string();
    assert!(err.contains("key `model`: missing"), "{err}");
}

/// A check between two keys names the key it is about, and as its source the `--set` that gave
/// either key; a key of such a check that nobody set leaves the file as the source.
#[test]
fn a_set_breaking_a_check_between_two_keys_is_named() {
    let err = load(BASE, &["model.n_head=5"]).unwrap_err().to_string();
    assert!(
        err.starts_with("--set model.n_head=5: key `model.d_model`: must be divisible by n_head (5)"),
        "{err}"
    );
    let err = load(BASE, &["optimizer.lr=1e-5", "optimizer.min_lr=1e-4"]).unwrap_err().to_string();
    assert!(err.starts_with("--set optimizer.min_lr=1e-4: key `optimizer.min_lr`"), "{err}");
    let err = load(BASE, &["optimizer.lr=1e-5", "seed=3"]).unwrap_err().to_string();
    assert!(
        err.starts_with("--set optimizer.lr=1e-5: key `optimizer.min_lr`: must be in [0, lr = 0.00001]"),
        "{err}"
    );
    let err = load(BASE, &["optimizer.warmup_steps=20"]).unwrap_err().to_string();
    assert!(err.starts_with("--set optimizer.warmup_steps=20: key `optimizer.lr_decay_steps`"), "{err}");
    let text = BASE.replace("[model]", "[model]\nd_model = 33");
    let err = load(&text, &["seed=3"]).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: key `model.d_model`: must be divisible by n_head"), "{err}");
    // A key that only counts in some cases is named only then: max_steps stands in for an
    // unset lr_decay_steps, the coordinator's port for an unset data_port, lr for a min_lr
    // above it (a negative min_lr is wrong whatever lr is).
    let err = load(BASE, &["optimizer.warmup_steps=5", "max_steps=4"]).unwrap_err().to_string();
    assert!(err.starts_with("--set max_steps=4: key `optimizer.lr_decay_steps`"), "{err}");
    assert!(err.ends_with("got 4 (not given: it defaults to max_steps)"), "{err}");
    let decay = BASE.replace("lr = 1e-3", "lr = 1e-3\nwarmup_steps = 5\nlr_decay_steps = 4");
    let err = load(&decay, &["max_steps=500"]).unwrap_err().to_string();
    assert!(
        err.starts_with("run.toml: key `optimizer.lr_decay_steps`: must be ≥ warmup_steps (5), got 4"),
        "{err}"
    );
    let negative = BASE.replace("lr = 1e-3", "lr = 1e-3\nmin_lr = -1e-4");
    let err = load(&negative, &["optimizer.lr=5e-3"]).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: key `optimizer.min_lr`"), "{err}");
    let ports = format!("{BASE}[parallel]\nnodes = 2\ndata_port = 65534\n");
    let err = load(&ports, &["parallel.coordinator=\"127.0.0.1:29500\""]).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: key `parallel.data_port`"), "{err}");
    let err = load(&ports, &["parallel.nodes=3"]).unwrap_err().to_string();
    assert!(err.starts_with("--set parallel.nodes=3: key `parallel.data_port`"), "{err}");
    // Spaces around the dots of a --set key: read as the key, and named.
    let err = load(BASE, &["model . n_head=5"]).unwrap_err().to_string();
    assert!(
        err.starts_with("--set model . n_head=5: key `model.d_model`: must be divisible by n_head (5)"),
        "{err}"
    );
}

/// Sizes beyond any machine are an error naming the largest size, not a wrapped sum and a
/// panic later (2⁶² layers made the parameter count wrap and model init panic); a large but
/// real run passes.
#[test]
fn sizes_beyond_any_machine_are_refused() {
    let err = load(BASE, &["model.n_layer=4611686018427387904"]).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "--set model.n_layer=4611686018427387904: key `model.n_layer`: the run would need about"
        ),
        "{err}"
    );
    let err = load(BASE, &["micro_batch_size=9223372036854775807"]).unwrap_err().to_string();
    assert!(err.contains("key `micro_batch_size`") && err.contains("far beyond any machine"), "{err}");
    let huge = BASE.replace("n_layer = 3", "n_layer = 3\nvocab_size = 4611686018427387904");
    let err = load(&huge, &["micro_batch_size=4"]).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: key `model.vocab_size`"), "{err}");
    let big =
        "max_steps = 1\nmicro_batch_size = 512\naccumulation_steps = 64\n[model]\npreset = \"gpt2-xl\"\n";
    load(big, &["model.block_size=8192"]).unwrap();
}

#[test]
fn malformed_set_and_toml_are_errors() {
    assert!(matches!(load(BASE, &["max_steps"]), Err(ConfigError::Set { .. })));
    assert!(matches!(load("max_steps = = 3", &[]), Err(ConfigError::Syntax { .. })));
}

#[test]
fn vocab_comes_from_data_when_omitted() {
    let text = "max_steps = 1\nmicro_batch_size = 1\n[model]\nn_layer = 1\nn_head = 1\nd_model = 8\nblock_size = 4\n";
    let mut c = load(text, &[]).unwrap();
    c.resolve_vocab(Some(66)).unwrap();
    assert_eq!(c.model.vocab_size(), 66);
    let ModelConfig::Gpt2(m) = &c.model else { panic!("gpt2 is the default arch") };
    assert_eq!((m.dropout, m.bias, m.tie_embeddings), (0.0, true, true), "Burn's defaults");
    let err =
        load("max_steps = 1\nmicro_batch_size = 1\n[model]\nn_layer = 1\n", &[]).unwrap_err().to_string();
    assert!(err.contains("key `model`") && err.contains("missing field"), "{err}");
    let mut small = load(BASE, &["model.vocab_size=10"]).unwrap();
    assert!(small.resolve_vocab(Some(66)).is_err());
    let mut preset_too_small = load(BASE, &[]).unwrap();
    preset_too_small.resolve_vocab(Some(66)).unwrap();
    assert_eq!(preset_too_small.model.vocab_size(), 66, "data's vocabulary when the preset's is smaller");
    let mut gpt2 = load(BASE, &["model.preset=\"gpt2\""]).unwrap();
    gpt2.resolve_vocab(Some(50257)).unwrap();
    assert_eq!(gpt2.model.vocab_size(), 50304, "GPT-2's padded vocabulary");
}

#[test]
fn resolved_config_round_trips_through_toml() {
    let mut c = load(BASE, &[]).unwrap();
    c.resolve_vocab(Some(64)).unwrap();
    let again = RunConfig::from_toml_str(&c.to_toml(), Path::new("config.toml"), &[]).unwrap();
    assert_eq!(again.origin.path, Path::new("config.toml"), "the config keeps its source");
    c.origin.path = again.origin.path.clone();
    assert_eq!(c, again);
}

#[test]
fn tokens_per_step_counts_all_micro_batches() {
    let c = load(BASE, &["accumulation_steps=4"]).unwrap();
    assert_eq!(c.sequences_per_step(1), 8);
    assert_eq!(c.tokens_per_step(2), 2 * 4 * 2 * 16);
}

#[test]
fn llama_models_come_from_a_preset_or_explicit_fields() {
    let c = load(BASE, &["model.preset=\"llama-tiny\"", "model.n_layer=3"]).unwrap();
    let ModelConfig::Llama(m) = &c.model else { panic!("llama-tiny is a Llama preset") };
    assert_eq!((m.n_layer, m.n_head, m.n_kv_head), (3, 4, 2));
    let text = "max_steps = 1\nmicro_batch_size = 1\n[model]\narch = \"llama\"\nn_layer = 1\nn_head = 2\nn_kv_head = 1\nd_model = 8\nd_ff = 16\nblock_size = 4\n";
    let c = load(text, &[]).unwrap();
    assert!(matches!(&c.model, ModelConfig::Llama(m) if m.rope_theta == 10000.0 && !m.tie_embeddings));
    let err = load(BASE, &["model.n_kv_head=1"]).unwrap_err().to_string();
    assert!(err.contains("key `model.n_kv_head`: unknown key for arch \"gpt2\""), "{err}");
    let err = load(BASE, &["model.arch=\"llama\""]).unwrap_err().to_string();
    assert!(err.contains("contradicts preset \"tiny\""), "{err}");
}

#[test]
fn a_bad_key_in_the_file_names_the_file_the_key_and_what_was_expected() {
    let err = load(&BASE.replace("lr = 1e-3", "lr = \"fast\""), &[]).unwrap_err().to_string();
    assert_eq!(err, "run.toml: key `optimizer.lr`: expected a number, found \"fast\"");
    let err = load(&BASE.replace("n_layer = 3", "n_layers = 3"), &[]).unwrap_err().to_string();
    assert!(
        err.starts_with("run.toml: key `model.n_layers`: unknown key for arch \"gpt2\"; expected `arch`, `preset` or one of"),
        "{err}"
    );
}

#[test]
fn a_bad_set_names_the_argument_the_key_and_what_was_expected() {
    let err = load(BASE, &["accumulation_steps=0"]).unwrap_err().to_string();
    assert_eq!(err, "--set accumulation_steps=0: key `accumulation_steps`: must be at least 1, got 0");
    let err = load(BASE, &["optimizer.beta2=1.5"]).unwrap_err().to_string();
    assert_eq!(err, "--set optimizer.beta2=1.5: key `optimizer.beta2`: must be in [0, 1), got 1.5");
}

#[test]
fn a_bad_host_port_names_the_key_and_the_expected_form() {
    let err = load(BASE, &["parallel.coordinator=\"10.0.0.1\""]).unwrap_err().to_string();
    assert_eq!(
        err,
        "--set parallel.coordinator=\"10.0.0.1\": key `parallel.coordinator`: expected HOST:PORT (PORT from 1 to 65533), got \"10.0.0.1\""
    );
    let text = BASE.replace("[optimizer]", "[parallel]\ncoordinator = \"host:99999\"\n[optimizer]");
    let err = load(&text, &[]).unwrap_err().to_string();
    assert_eq!(
        err,
        "run.toml: key `parallel.coordinator`: expected HOST:PORT (PORT from 1 to 65533), got \"host:99999\""
    );
    let ok = load(BASE, &["parallel.coordinator=\"10.0.0.1:4000\""]).unwrap();
    assert_eq!((ok.parallel.coordinator.host.as_str(), ok.parallel.coordinator.port), ("10.0.0.1", 4000));
}

#[test]
fn a_vocabulary_smaller_than_the_datas_names_the_file_and_both_sizes() {
    let mut c = load(&BASE.replace("n_layer = 3", "n_layer = 3\nvocab_size = 10"), &[]).unwrap();
    let err = c.resolve_vocab(Some(66)).unwrap_err().to_string();
    assert_eq!(
        err,
        "run.toml: key `model.vocab_size`: 10 is smaller than the prepared data's vocabulary (66 tokens)"
    );
    let mut unknown =
        load("max_steps = 1\nmicro_batch_size = 1\n[model]\nn_layer = 1\nn_head = 1\nd_model = 8\nblock_size = 4\n", &[])
            .unwrap();
    let err = unknown.resolve_vocab(None).unwrap_err().to_string();
    assert!(err.starts_with("run.toml: key `model.vocab_size`: unknown"), "{err}");
}

#[test]
fn data_ports_past_65535_are_an_error_naming_the_key() {
    let err = load(BASE, &["parallel.nodes=2", "parallel.coordinator=\"h:65533\""]).unwrap_err().to_string();
    assert!(err.contains("key `parallel.data_port`") && err.contains("would reach 65538"), "{err}");
    let err = load(BASE, &["parallel.nodes=2", "parallel.data_port=65534"]).unwrap_err().to_string();
    assert!(err.starts_with("--set parallel.data_port=65534: key `parallel.data_port`"), "{err}");
    assert!(load(BASE, &["parallel.nodes=2", "parallel.data_port=65532"]).is_ok(), "65532..=65535");
}

#[test]
fn a_missing_required_key_is_named() {
    let err = load("micro_batch_size = 1\n[model]\npreset = \"tiny\"\n", &[]).unwrap_err().to_string();
    assert_eq!(err, "run.toml: key `max_steps`: missing: this key is required");
}

#[test]
fn a_value_set_on_the_command_line_is_blamed_on_the_set_even_after_loading() {
    let mut c = load(BASE, &["model.vocab_size=5"]).unwrap();
    let err = c.resolve_vocab(Some(66)).unwrap_err().to_string();
    assert_eq!(
        err,
        "--set model.vocab_size=5: key `model.vocab_size`: 5 is smaller than the prepared data's vocabulary (66 tokens)"
    );
}

#[test]
fn precision_and_checkpointing_take_their_strings_only() {
    let mut c = load(BASE, &["precision=\"bf16-mixed\"", "activation_checkpointing=\"blocks\""]).unwrap();
    c.resolve_vocab(Some(50)).unwrap();
    assert_eq!(
        (c.precision, c.activation_checkpointing),
        (PrecisionKind::Bf16Mixed, CheckpointingKind::Blocks)
    );
    // Written back and read again: the same modes.
    let again = RunConfig::from_toml_str(&c.to_toml(), Path::new("config.toml"), &[]).unwrap();
    assert_eq!((again.precision, again.activation_checkpointing), (c.precision, c.activation_checkpointing));
    let cases = [
        ("precision=3", "key `precision`: expected a string, found 3"),
        (
            "precision=\"bf16\"",
            r#"key `precision`: expected "fp32", "bf16-mixed" or "fp16-mixed", got "bf16""#,
        ),
        ("activation_checkpointing=true", "key `activation_checkpointing`: expected a string, found true"),
        (
            "activation_checkpointing={blocks={}}",
            "key `activation_checkpointing`: expected a string, found map",
        ),
        ("activation_checkpointing=\"Blocks\"", r#"expected "none" or "blocks", got "Blocks""#),
    ];
    for (set, expected) in cases {
        let err = load(BASE, &[set]).unwrap_err().to_string();
        assert!(err.contains(expected), "{set}: {err}");
    }
}

/// An override given by a flag carries the flag's name into every message: a check of its key,
/// a check between it and another key, the whole config's description, a malformed override.
#[test]
fn a_flag_override_is_named_as_the_user_gave_it() {
    let load_with =
        |overrides: &[Override]| RunConfig::from_toml_str_with(BASE, Path::new("run.toml"), overrides);
    let nodes = Override::flag("parallel.nodes=2", "--nodes 2");
    let rank = Override::flag("parallel.node_rank=5", "--node-rank 5");
    let err = load_with(&[nodes.clone(), rank]).unwrap_err().to_string();
    assert_eq!(err, "--node-rank 5: key `parallel.node_rank`: must be below parallel.nodes (2), got 5");
    // The wrong key's own --set comes before the flag of the key it is checked against.
    let err = load_with(&[Override::set("parallel.node_rank=7"), nodes.clone()]).unwrap_err().to_string();
    assert!(err.starts_with("--set parallel.node_rank=7: key `parallel.node_rank`"), "{err}");
    let config = load_with(&[Override::set("seed=3"), nodes]).unwrap();
    assert_eq!(config.origin.described(), "run.toml with --set seed=3 --nodes 2");
    let err = load_with(&[Override::flag("devices", "--devices")]).unwrap_err().to_string();
    assert_eq!(err, "--devices: expected key=value, e.g. max_steps=100");
    // A label over 120 characters is cut, with its length.
    let long = Override::set(format!("devices=[{}]", vec!["0"; 100].join(",")));
    let shown = long.shown();
    // "--set " + "devices=[" + 100 zeros and 99 commas + "]"
    assert!(shown.starts_with("--set devices=[0,0,") && shown.ends_with("0… (215 characters)"), "{shown}");
    assert_eq!(shown.chars().count(), 100 + "… (215 characters)".chars().count());
}
