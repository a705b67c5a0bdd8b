//! Checks of a run configuration that its types cannot express: positive counts, ranges of the
//! optimizer's numbers, a rank below the node count, and the model's own checks.

use ember_model::ModelConfig;

use super::parallel::Devices;
use super::schema::{BackendKind, PrecisionKind, RunConfig, VocabSource};

/// A run whose rough memory bound ([`RunConfig::check_magnitude`]) passes this many bytes
/// (1 EiB) is refused: no machine holds it, and sums of such sizes would wrap around in the
/// integer arithmetic of the memory accounting and of model construction.
const MAX_BYTES: f64 = (1u64 << 60) as f64;

/// The most replicas one process drives (`devices`): more devices than any one machine holds.
const MAX_REPLICAS: usize = 4096;

/// A value out of range: its dotted key, why, and the other keys whose values made this
/// check fail (so that a `--set` of any of them can be named as the error's source).
#[derive(Debug)]
pub(super) struct Invalid {
    pub key: String,
    pub related: Vec<String>,
    pub message: String,
}

impl Invalid {
    /// `key` alone is wrong.
    fn new(key: &str, message: String) -> Self {
        Self { key: key.to_string(), related: Vec::new(), message }
    }

    /// `key` is wrong given the values of `related`.
    fn given(key: &str, related: &[&str], message: String) -> Self {
        Self { key: key.to_string(), related: related.iter().map(|k| k.to_string()).collect(), message }
    }
}

impl From<(&'static str, String)> for Invalid {
    fn from((key, message): (&'static str, String)) -> Self {
        Self::new(key, message)
    }
}

impl RunConfig {
    /// The first key whose value is out of range, and why. Call it before
    /// `optimizer.lr_decay_steps` is given its default (`max_steps`), so its check can tell.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        self.validate_fields()?;
        self.check_magnitude()?;
        let mut probe = self.model.clone();
        if self.origin.vocab != VocabSource::Given {
            probe.set_vocab_size(1); // not known before the data is
        }
        probe.validate().map_err(|e| Invalid {
            key: format!("model.{}", e.field),
            related: e.also.map(|k| format!("model.{k}")).into_iter().collect(),
            message: e.message,
        })
    }

    fn validate_fields(&self) -> Result<(), Invalid> {
        let positive = |key, v: u64| {
            if v == 0 {
                Err(Invalid::new(key, "must be at least 1, got 0".to_string()))
            } else {
                Ok(())
            }
        };
        positive("max_steps", self.max_steps)?;
        positive("micro_batch_size", self.micro_batch_size as u64)?;
        positive("accumulation_steps", self.accumulation_steps as u64)?;
        positive("eval_batches", self.eval_batches as u64)?;
        positive("log_every", self.log_every)?;
        positive("keep_checkpoints", self.keep_checkpoints as u64)?;
        positive("prefetch_depth", self.prefetch_depth as u64)?;
        positive("devices", self.devices.count() as u64)?;
        for (key, path, expected) in [
            ("data", &self.data, "a prepared data directory or a UTF-8 text file"),
            ("init_from", &self.init_from, "Hugging Face weights (a directory or a .safetensors file)"),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(Invalid::new(key, format!("expected {expected}, got an empty path")));
            }
        }
        if self.devices.count() > MAX_REPLICAS {
            return Err(Invalid::new(
                "devices",
                format!(
                    "{} replicas in one process: at most {MAX_REPLICAS} (one per device of a machine; more machines: parallel.nodes)",
                    self.devices.count()
                ),
            ));
        }
        if let Devices::List(list) = &self.devices {
            // Each replica owns its device; on the CPU a list's entries are still devices.
            for (i, device) in list.iter().enumerate() {
                if let Some(first) = list[..i].iter().position(|d| d == device) {
                    return Err(Invalid::new(
                        "devices",
                        format!(
                            "device {device} is listed twice (entries {first} and {i}): each replica needs a device of its own (several CPU replicas: a count, e.g. devices = {})",
                            list.len()
                        ),
                    ));
                }
            }
        }
        if self.backend == BackendKind::Wgpu && self.precision == PrecisionKind::Bf16Mixed {
            return Err(Invalid::given(
                "precision",
                &["backend"],
                "bf16-mixed needs bfloat16 and the wgpu backend has no bfloat16 (WGSL has f16 only): use precision = \"fp16-mixed\" (with loss scaling) or \"fp32\" on wgpu".into(),
            ));
        }
        positive("parallel.nodes", self.parallel.nodes as u64)?;
        positive("parallel.timeout_s", self.parallel.timeout_s)?;
        if let Some(last) = self.last_data_port().filter(|&p| p > u64::from(u16::MAX)) {
            // The coordinator's port counts only when data_port is not given.
            let related: &[&str] = match self.parallel.data_port {
                Some(_) => &["parallel.nodes"],
                None => &["parallel.nodes", "parallel.coordinator"],
            };
            return Err(Invalid::given(
                "parallel.data_port",
                related,
                format!(
                    "the data-service ports (parallel.data_port, default the coordinator's port + 2; two per node) would reach {last}: choose ports at most 65535 for all {} nodes",
                    self.parallel.nodes
                ),
            ));
        }
        if self.parallel.node_rank >= self.parallel.nodes {
            return Err(Invalid::given(
                "parallel.node_rank",
                &["parallel.nodes"],
                format!(
                    "must be below parallel.nodes ({}), got {}",
                    self.parallel.nodes, self.parallel.node_rank
                ),
            ));
        }
        if let Some(Err(e)) = self.tokenizer.as_deref().map(str::parse::<ember_data::TokenizerKind>) {
            return Err(Invalid::new("tokenizer", e.to_string()));
        }
        let o = &self.optimizer;
        let finite_pos = |key, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Invalid::new(key, format!("must be a positive number, got {v}")))
            }
        };
        if let Some(peak) = self.peak_flops {
            finite_pos("peak_flops", peak)?;
        }
        finite_pos("optimizer.lr", o.lr)?;
        finite_pos("optimizer.eps", o.eps)?;
        if !(o.min_lr >= 0.0 && o.min_lr <= o.lr) {
            // Above lr, lr counts too; below 0 (or NaN), min_lr alone is wrong.
            let related: &[&str] = if o.min_lr > o.lr { &["optimizer.lr"] } else { &[] };
            let message = format!("must be in [0, lr = {}], got {}", o.lr, o.min_lr);
            return Err(Invalid::given("optimizer.min_lr", related, message));
        }
        for (key, beta) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(Invalid::new(key, format!("must be in [0, 1), got {beta}")));
            }
        }
        for (key, v) in [("optimizer.weight_decay", o.weight_decay), ("optimizer.grad_clip", o.grad_clip)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Invalid::new(key, format!("must be a number ≥ 0, got {v}")));
            }
        }
        let decay = o.lr_decay_steps.unwrap_or(self.max_steps);
        if decay < o.warmup_steps {
            let warmup = o.warmup_steps;
            return Err(match o.lr_decay_steps {
                Some(_) => Invalid::given(
                    "optimizer.lr_decay_steps",
                    &["optimizer.warmup_steps"],
                    format!("must be ≥ warmup_steps ({warmup}), got {decay}"),
                ),
                None => Invalid::given(
                    "optimizer.lr_decay_steps",
                    &["optimizer.warmup_steps", "max_steps"],
                    format!("must be ≥ warmup_steps ({warmup}), got {decay} (not given: it defaults to max_steps)"),
                ),
            });
        }
        Ok(self.sentinel.validate()?)
    }
}

impl RunConfig {
    /// Refuses sizes beyond any machine: a rough bound on the run's bytes — 16 per parameter,
    /// and per token of a micro-batch, 40·d + 2·d_ff + 4·n_head·T values per layer and 8·V
    /// for the logits, 4 bytes each — computed in f64, so nothing wraps, must stay under
    /// [`MAX_BYTES`], as must the tokens of an optimizer step. The error names the largest of
    /// the sizes (the likely typo) and its source.
    fn check_magnitude(&self) -> Result<(), Invalid> {
        let f = |x: usize| x as f64;
        let (vocab, layers, heads, d, ff, block) = match &self.model {
            ModelConfig::Gpt2(m) => {
                (m.vocab_size, m.n_layer, m.n_head, m.d_model, 4.0 * f(m.d_model), m.block_size)
            }
            ModelConfig::Llama(m) => (m.vocab_size, m.n_layer, m.n_head, m.d_model, f(m.d_ff), m.block_size),
        };
        let (v, l, d_f, t) = (f(vocab), f(layers), f(d), f(block));
        let params = (2.0 * v + t) * d_f + l * (12.0 * d_f * d_f + 3.0 * d_f * ff);
        let tokens = f(self.micro_batch_size) * t;
        let activations = tokens * (l * (40.0 * d_f + 2.0 * ff + 4.0 * f(heads) * t) + 8.0 * v) * 4.0;
        let bytes = 16.0 * params + activations;
        let ranks = f(self.devices.count()) * f(self.parallel.nodes);
        let step_tokens = tokens * f(self.accumulation_steps) * ranks;
        if bytes < MAX_BYTES && step_tokens < MAX_BYTES {
            return Ok(());
        }
        let mut sizes = vec![
            ("model.vocab_size", vocab),
            ("model.n_layer", layers),
            ("model.n_head", heads),
            ("model.d_model", d),
            ("model.block_size", block),
            ("micro_batch_size", self.micro_batch_size),
            ("accumulation_steps", self.accumulation_steps),
            ("parallel.nodes", self.parallel.nodes),
        ];
        if let ModelConfig::Llama(m) = &self.model {
            sizes.push(("model.d_ff", m.d_ff));
        }
        sizes.sort_by_key(|&(_, value)| std::cmp::Reverse(value));
        // Name what is out of reach: the bytes, the tokens per step, or both.
        let what = match (bytes >= MAX_BYTES, step_tokens >= MAX_BYTES) {
            (true, true) => format!("about {bytes:.1e} bytes and {step_tokens:.1e} tokens per step"),
            (true, false) => format!("about {bytes:.1e} bytes"),
            (false, _) => format!("{step_tokens:.1e} tokens per step"),
        };
        let message = format!(
            "the run would need {what}, far beyond any machine; {} = {} is the largest size",
            sizes[0].0, sizes[0].1
        );
        Err(Invalid::new(sizes[0].0, message))
    }

    /// The last data-service port of the last node when there are several: `data_port` (else
    /// the coordinator's port + 2) + 2 × (nodes − 1) + 1.
    fn last_data_port(&self) -> Option<u64> {
        let p = &self.parallel;
        let first = p.data_port.map_or(u64::from(p.coordinator.port) + 2, u64::from);
        (p.nodes > 1).then(|| first.saturating_add(2u64.saturating_mul(p.nodes as u64 - 1)).saturating_add(1))
    }
}
