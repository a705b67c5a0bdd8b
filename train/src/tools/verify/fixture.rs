//! The files of a parity fixture (`expected.json`, `batch.json`), read with errors that name
//! the file and the field.

use std::fs;
use std::path::{Path, PathBuf};

use ember_data::Batch;
use ember_model::{GeluKind, GptConfig, LlamaConfig, ModelConfig};
use serde_json::Value;

use crate::config::OptimizerConfig;
use crate::error::TrainError;

/// A fixture's files, parsed.
pub(super) struct Fixture {
    dir: PathBuf,
    expected: Value,
    batch: Value,
}

impl Fixture {
    pub(super) fn read(dir: &Path) -> Result<Self, TrainError> {
        let json = |name: &str| -> Result<Value, TrainError> {
            let path = dir.join(name);
            let text = fs::read_to_string(&path).map_err(TrainError::io(&path))?;
            serde_json::from_str(&text)
                .map_err(|e| TrainError::BadFile { path, message: format!("invalid JSON: {e}") })
        };
        Ok(Self { dir: dir.into(), expected: json("expected.json")?, batch: json("batch.json")? })
    }

    /// `value` at the `/`-separated `pointer` of `file`, or an error naming both.
    pub(super) fn get<'a>(&'a self, file: &str, pointer: &str) -> Result<&'a Value, TrainError> {
        let root = if file == "batch.json" { &self.batch } else { &self.expected };
        root.pointer(pointer).ok_or_else(|| TrainError::BadFile {
            path: self.dir.join(file),
            message: format!("missing field {}", pointer.trim_start_matches('/').replace('/', ".")),
        })
    }

    pub(super) fn num(&self, file: &str, pointer: &str) -> Result<f64, TrainError> {
        self.get(file, pointer)?.as_f64().ok_or_else(|| self.bad(file, pointer, "a number"))
    }

    pub(super) fn nums(&self, file: &str, pointer: &str) -> Result<Vec<f64>, TrainError> {
        let array = self
            .get(file, pointer)?
            .as_array()
            .ok_or_else(|| self.bad(file, pointer, "an array of numbers"))?;
        array
            .iter()
            .map(|v| v.as_f64().ok_or_else(|| self.bad(file, pointer, "an array of numbers")))
            .collect()
    }

    pub(super) fn bad(&self, file: &str, pointer: &str, expected: &str) -> TrainError {
        TrainError::BadFile {
            path: self.dir.join(file),
            message: format!(
                "field {} must be {expected}",
                pointer.trim_start_matches('/').replace('/', ".")
            ),
        }
    }

    /// The model of `expected.json`'s `config`: gpt_ref.py's GPT-2 fields, or Hugging Face
    /// `LlamaConfig` fields with `"arch": "llama"`.
    pub(super) fn model(&self) -> Result<ModelConfig, TrainError> {
        let u = |key: &str| self.num("expected.json", &format!("/config/{key}")).map(|v| v as usize);
        let f = |key: &str| self.num("expected.json", &format!("/config/{key}"));
        let flag = |key: &str, default: bool| {
            self.get("expected.json", &format!("/config/{key}"))
                .ok()
                .and_then(Value::as_bool)
                .unwrap_or(default)
        };
        let arch = self.get("expected.json", "/config/arch").ok().and_then(Value::as_str).unwrap_or("gpt2");
        Ok(match arch {
            "llama" => ModelConfig::Llama(
                LlamaConfig::new(
                    u("vocab_size")?,
                    u("num_hidden_layers")?,
                    u("num_attention_heads")?,
                    u("num_key_value_heads")?,
                    u("hidden_size")?,
                    u("intermediate_size")?,
                    u("max_position_embeddings")?,
                )
                .with_rope_theta(f("rope_theta")?)
                .with_rms_norm_eps(f("rms_norm_eps")?)
                .with_tie_embeddings(flag("tie_word_embeddings", false)),
            ),
            _ => {
                let gelu = match self.get("expected.json", "/config/gelu").ok().and_then(Value::as_str) {
                    Some("erf") => GeluKind::Erf,
                    _ => GeluKind::Tanh,
                };
                ModelConfig::Gpt2(
                    GptConfig::new(
                        u("vocab_size")?,
                        u("n_layer")?,
                        u("n_head")?,
                        u("n_embd")?,
                        u("block_size")?,
                    )
                    .with_bias(flag("bias", true))
                    .with_dropout(f("dropout").unwrap_or(0.0))
                    .with_gelu(gelu)
                    .with_layer_norm_eps(f("layer_norm_eps").unwrap_or(1e-5))
                    .with_tie_embeddings(true),
                )
            }
        })
    }

    /// `rows` of `batch.json`'s `input_ids` / `targets` as one batch, checked against `model`:
    /// rows of one length within its context, token ids in `0..vocab_size`, targets there or
    /// `-100` (ignore_index).
    ///
    /// Errors: [`TrainError::BadFile`] naming `batch.json`, the field and what was expected.
    pub(super) fn batch(&self, rows: &[usize], model: &ModelConfig) -> Result<Batch, TrainError> {
        let matrix = |key: &str| -> Result<Vec<Vec<i64>>, TrainError> {
            let pointer = format!("/{key}");
            let rows = self
                .get("batch.json", &pointer)?
                .as_array()
                .ok_or_else(|| self.bad("batch.json", &pointer, "a matrix"))?;
            rows.iter()
                .map(|r| {
                    r.as_array()
                        .and_then(|r| r.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                        .ok_or_else(|| self.bad("batch.json", &pointer, "a matrix of integers"))
                })
                .collect()
        };
        let (inputs, targets) = (matrix("input_ids")?, matrix("targets")?);
        let seq_len = inputs.first().map_or(0, Vec::len);
        let (vocab, context) = (model.vocab_size() as i64, model.block_size());
        if seq_len == 0 || seq_len > context {
            return Err(self.bad(
                "batch.json",
                "/input_ids",
                &format!("rows of 1 to {context} tokens (block_size)"),
            ));
        }
        for (key, matrix) in [("input_ids", &inputs), ("targets", &targets)] {
            let pointer = format!("/{key}");
            if matrix.len() != inputs.len() || matrix.iter().any(|row| row.len() != seq_len) {
                let what = format!("{} rows of {seq_len} tokens, like input_ids' first row", inputs.len());
                return Err(self.bad("batch.json", &pointer, &what));
            }
            let ignore = if key == "targets" { Some(-100) } else { None };
            if let Some(v) = matrix.iter().flatten().find(|&&v| !(0..vocab).contains(&v) && Some(v) != ignore)
            {
                let allowed = if ignore.is_some() { " or -100 (ignore_index)" } else { "" };
                let what = format!("token ids in 0..{vocab} (vocab_size){allowed}, not {v}");
                return Err(self.bad("batch.json", &pointer, &what));
            }
        }
        let mut batch = Batch {
            batch_size: rows.len(),
            seq_len,
            inputs: Vec::new(),
            targets: Vec::new(),
            segments: None,
        };
        for &r in rows {
            let (Some(i), Some(t)) = (inputs.get(r), targets.get(r)) else {
                return Err(self.bad("batch.json", "/micro_batches", "sequence indices within input_ids"));
            };
            batch.inputs.extend(i.iter().map(|&v| v as u32));
            batch.targets.extend(t.iter().map(|&v| v as i32));
        }
        Ok(batch)
    }

    pub(super) fn micro_batches(&self) -> Result<Vec<Vec<usize>>, TrainError> {
        let pointer = "/micro_batches";
        let list = self
            .get("batch.json", pointer)?
            .as_array()
            .ok_or_else(|| self.bad("batch.json", pointer, "a list of index lists"))?;
        list.iter()
            .map(|mb| {
                mb.as_array()
                    .and_then(|mb| {
                        mb.iter().map(|v| v.as_u64().map(|v| v as usize)).collect::<Option<Vec<_>>>()
                    })
                    .ok_or_else(|| self.bad("batch.json", pointer, "a list of index lists"))
            })
            .collect()
    }

    pub(super) fn optimizer(&self) -> Result<(OptimizerConfig, f64, usize), TrainError> {
        let betas = self.nums("expected.json", "/optimizer/betas")?;
        if betas.len() != 2 {
            return Err(self.bad("expected.json", "/optimizer/betas", "two numbers"));
        }
        let config = OptimizerConfig {
            beta1: betas[0],
            beta2: betas[1],
            eps: self.num("expected.json", "/optimizer/eps")?,
            weight_decay: self.num("expected.json", "/optimizer/weight_decay")?,
            grad_clip: self.num("expected.json", "/optimizer/grad_clip/max_norm")?,
            ..OptimizerConfig::default()
        };
        if config.grad_clip <= 0.0 {
            return Err(self.bad(
                "expected.json",
                "/optimizer/grad_clip/max_norm",
                "positive (PyTorch's clip_grad_norm_ with max_norm 0 zeroes every gradient, while Ember's grad_clip 0 turns clipping off: the runs would not be comparable)",
            ));
        }
        let lr = self.num("expected.json", "/optimizer/lr")?;
        let steps = self.num("expected.json", "/train_full_batch/steps")? as usize;
        Ok((config, lr, steps))
    }
}
