//! The largest single buffer a run allocates, against a wgpu adapter's limit on one buffer
//! binding (`max_storage_buffer_binding_size`: 128 MiB on Mesa's lavapipe, 2–4 GiB on most
//! GPUs). wgpu panics on a bigger binding deep inside a kernel launch, so the run is refused
//! before its model is allocated, naming the tensor and the keys that size it.

use ember_model::ModelConfig;

use super::adapters::Adapter;
use crate::config::{BackendKind, RunConfig};
use crate::error::TrainError;

/// One tensor a run allocates: what it is, its size in bytes (f32), the keys that size it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Its name and shape, e.g. `the logits [micro_batch_size · block_size, vocab_size]`.
    pub what: String,
    /// Bytes, at 4 per element (f32).
    pub bytes: u64,
    /// The keys that make it smaller.
    pub keys: &'static str,
}

/// The largest of the tensors a training step of `config` holds at once, one micro-batch
/// (`B` rows of `T` tokens): the token embedding (and tied LM head) `[V, d]`, the logits and
/// their gradient `[B·T, V]`, the FFN's hidden activations `[B·T, d_ff]`, the FFN weights
/// `[d, d_ff]`, and the attention scores `[B, H, T, T]` that the composed attention of the GPU
/// backends materializes inside each pass.
pub fn largest_buffer(config: &RunConfig) -> Buffer {
    let (d, heads, d_ff) = match &config.model {
        ModelConfig::Gpt2(c) => (c.d_model as u64, c.n_head as u64, 4 * c.d_model as u64),
        ModelConfig::Llama(c) => (c.d_model as u64, c.n_head as u64, c.d_ff as u64),
    };
    let (v, t, b) =
        (config.model.vocab_size() as u64, config.model.block_size() as u64, config.micro_batch_size as u64);
    let f32s = |n: u64| n.saturating_mul(4);
    let all = [
        Buffer {
            what: format!("the token embedding [{v}, {d}]"),
            bytes: f32s(v * d),
            keys: "model.vocab_size, model.d_model",
        },
        Buffer {
            what: format!("the logits [{}, {v}]", b * t),
            bytes: f32s(b.saturating_mul(t).saturating_mul(v)),
            keys: "micro_batch_size (raise accumulation_steps to keep the global batch), model.block_size",
        },
        Buffer {
            what: format!("the attention scores [{b}, {heads}, {t}, {t}]"),
            bytes: f32s(b.saturating_mul(heads).saturating_mul(t).saturating_mul(t)),
            keys: "micro_batch_size (raise accumulation_steps to keep the global batch), model.block_size",
        },
        Buffer {
            what: format!("the FFN activations [{}, {d_ff}]", b * t),
            bytes: f32s(b.saturating_mul(t).saturating_mul(d_ff)),
            keys: "micro_batch_size (raise accumulation_steps to keep the global batch), model.block_size",
        },
        Buffer { what: format!("an FFN weight [{d}, {d_ff}]"), bytes: f32s(d * d_ff), keys: "model.d_model" },
    ];
    all.into_iter().max_by_key(|b| b.bytes).expect("five buffers")
}

/// Refuses a wgpu run whose largest buffer ([`largest_buffer`]) passes the adapter's binding
/// limit; other backends and unknown adapters pass (the backend reports those).
///
/// Errors: [`TrainError::Unsupported`] naming the tensor, both sizes, the adapter and the keys.
pub fn check(config: &RunConfig) -> Result<(), TrainError> {
    if config.backend != BackendKind::Wgpu {
        return Ok(());
    }
    match super::adapters::adapters().into_iter().nth(config.device) {
        Some(adapter) => check_against(config, &adapter),
        None => Ok(()),
    }
}

/// [`check`] against `adapter`.
pub fn check_against(config: &RunConfig, adapter: &Adapter) -> Result<(), TrainError> {
    let largest = largest_buffer(config);
    if largest.bytes <= adapter.max_binding_bytes {
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    Err(TrainError::Unsupported(format!(
        "{}: {} is {:.1} MiB in f32, and wgpu adapter {} ({}) binds at most {:.1} MiB per buffer; lower {}, or use backend = \"flex\"",
        config.origin.described(),
        largest.what,
        mib(largest.bytes),
        adapter.index,
        adapter,
        mib(adapter.max_binding_bytes),
        largest.keys
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::adapters::AdapterKind;

    fn lavapipe() -> Adapter {
        Adapter {
            index: 0,
            name: "llvmpipe".into(),
            api: "Vulkan".into(),
            kind: AdapterKind::Software,
            driver: String::new(),
            max_binding_bytes: 128 << 20,
        }
    }

    fn config(sets: &[&str]) -> RunConfig {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::from_toml_str(
            "backend = \"wgpu\"\nmax_steps = 1\n[model]\npreset = \"tiny\"\nvocab_size = 65\n",
            "t.toml".as_ref(),
            &sets,
        )
        .unwrap()
    }

    /// GPT-2's token embedding, 50,304 × 768 f32 = 154,533,888 B, the binding lavapipe refused.
    #[test]
    fn gpt2s_embedding_is_the_largest_buffer_and_exceeds_lavapipes_limit() {
        let gpt2 = config(&[
            "model.preset=\"gpt2\"",
            "model.vocab_size=50304",
            "micro_batch_size=1",
            "model.block_size=64",
        ]);
        let largest = largest_buffer(&gpt2);
        assert_eq!((largest.bytes, largest.what.as_str()), (154_533_888, "the token embedding [50304, 768]"));
        let err = check_against(&gpt2, &lavapipe()).unwrap_err().to_string();
        assert!(
            err.contains("147.4 MiB")
                && err.contains("at most 128.0 MiB")
                && err.contains("model.vocab_size"),
            "{err}"
        );
    }

    /// The tiny model's largest buffer: its FFN activations, 8 × 16 rows × 128 × 4 B.
    #[test]
    fn a_tiny_run_fits_and_its_activations_grow_with_the_micro_batch() {
        let tiny = config(&["micro_batch_size=8"]);
        assert_eq!(largest_buffer(&tiny).bytes, 8 * 16 * 128 * 4);
        assert!(check_against(&tiny, &lavapipe()).is_ok());
        let wide = config(&["micro_batch_size=40000"]);
        let largest = largest_buffer(&wide);
        assert_eq!(largest.bytes, 40_000 * 16 * 128 * 4);
        let err = check_against(&wide, &lavapipe()).unwrap_err().to_string();
        assert!(err.contains("micro_batch_size") && err.contains("accumulation_steps"), "{err}");
    }
}
