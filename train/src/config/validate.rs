//! Checks of a run configuration that its types cannot express: positive counts, ranges of the
//! optimizer's numbers, a rank below the node count, and the model's own checks.

use super::schema::{RunConfig, VocabSource};

/// A value out of range: its dotted key, why, and the other keys of a check between several
/// (so that a `--set` of any of them can be named as the error's source).
#[derive(Debug)]
pub(super) struct Invalid {
    pub key: String,
    pub related: Vec<String>,
    pub message: String,
}

/// The other keys of the checks in [`RunConfig::validate_fields`] that relate several keys
/// (each of these keys has only that one check).
fn related(key: &str) -> &'static [&'static str] {
    match key {
        "parallel.data_port" => &["parallel.nodes", "parallel.coordinator"],
        "parallel.node_rank" => &["parallel.nodes"],
        "optimizer.min_lr" => &["optimizer.lr"],
        "optimizer.lr_decay_steps" => &["optimizer.warmup_steps", "max_steps"],
        _ => &[],
    }
}

impl RunConfig {
    /// The first key whose value is out of range, and why.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        self.validate_fields().map_err(|(key, message)| Invalid {
            key: key.to_string(),
            related: related(key).iter().map(|k| k.to_string()).collect(),
            message,
        })?;
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

    fn validate_fields(&self) -> Result<(), (&'static str, String)> {
        let positive = |key, v: u64| {
            if v == 0 {
                Err((key, "must be at least 1, got 0".to_string()))
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
        positive("devices", self.devices.indices(self.device).len() as u64)?;
        positive("parallel.nodes", self.parallel.nodes as u64)?;
        positive("parallel.timeout_s", self.parallel.timeout_s)?;
        if let Some(last) = self.last_data_port().filter(|&p| p > u32::from(u16::MAX)) {
            return Err((
                "parallel.data_port",
                format!(
                    "the data-service ports (parallel.data_port, default the coordinator's port + 2; two per node) would reach {last}: choose ports at most 65535 for all {} nodes",
                    self.parallel.nodes
                ),
            ));
        }
        if self.parallel.node_rank >= self.parallel.nodes {
            return Err((
                "parallel.node_rank",
                format!(
                    "must be below parallel.nodes ({}), got {}",
                    self.parallel.nodes, self.parallel.node_rank
                ),
            ));
        }
        if let Some(Err(e)) = self.tokenizer.as_deref().map(str::parse::<ember_data::TokenizerKind>) {
            return Err(("tokenizer", e.to_string()));
        }
        let o = &self.optimizer;
        let finite_pos = |key, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err((key, format!("must be a positive number, got {v}")))
            }
        };
        if let Some(peak) = self.peak_flops {
            finite_pos("peak_flops", peak)?;
        }
        finite_pos("optimizer.lr", o.lr)?;
        finite_pos("optimizer.eps", o.eps)?;
        if !(o.min_lr >= 0.0 && o.min_lr <= o.lr) {
            return Err(("optimizer.min_lr", format!("must be in [0, lr = {}], got {}", o.lr, o.min_lr)));
        }
        for (key, beta) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return Err((key, format!("must be in [0, 1), got {beta}")));
            }
        }
        for (key, v) in [("optimizer.weight_decay", o.weight_decay), ("optimizer.grad_clip", o.grad_clip)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err((key, format!("must be a number ≥ 0, got {v}")));
            }
        }
        let decay = o.lr_decay_steps.unwrap_or(self.max_steps);
        if decay < o.warmup_steps {
            return Err((
                "optimizer.lr_decay_steps",
                format!("must be ≥ warmup_steps ({}), got {decay}", o.warmup_steps),
            ));
        }
        self.sentinel.validate()
    }
}

impl RunConfig {
    /// The last data-service port of the last node when there are several: `data_port` (else
    /// the coordinator's port + 2) + 2 × (nodes − 1) + 1.
    fn last_data_port(&self) -> Option<u32> {
        let p = &self.parallel;
        let first = p.data_port.map_or(u32::from(p.coordinator.port) + 2, u32::from);
        (p.nodes > 1).then(|| first + 2 * (p.nodes as u32 - 1) + 1)
    }
}
