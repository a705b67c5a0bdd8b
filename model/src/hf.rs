//! Hugging Face safetensors weights in and out (`model.safetensors`), through burn-store.
//!
//! | architecture | Hugging Face names | layout |
//! | --- | --- | --- |
//! | GPT-2 (`GPT2LMHeadModel`) | `[transformer.]wte.weight`, `h.{i}.ln_1.weight/bias`, `h.{i}.attn.c_attn.weight/bias`, …, `ln_f.weight/bias` | `Conv1D` weights `[in, out]`, as Burn's `Linear`; head tied to `wte` (an untied `lm_head.weight` is `[out, in]`) |
//! | Llama (`LlamaForCausalLM`) | `model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, …, `model.norm.weight`, `lm_head.weight` | PyTorch `Linear` `[out, in]`: transposed |
//!
//! LayerNorm/RMSNorm `weight`/`bias` are Burn's `gamma`/`beta`. GPT-2's `attn.bias` and
//! `attn.masked_bias` buffers (causal masks) are ignored, and so is an `lm_head.weight` when
//! the head is tied. Half-precision files are converted to f32 on load.

use std::fmt;
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, TensorData};
use burn_store::{ModuleAdapter, ModuleSnapshot, ModuleStore, SafetensorsStore, TensorSnapshot};

use crate::lm::LanguageModel;

/// Why weights could not be read or written.
#[derive(Debug, Clone, PartialEq)]
pub enum HfError {
    /// The file could not be read, parsed or written.
    Store {
        /// The safetensors file.
        path: PathBuf,
        /// burn-store's message.
        message: String,
    },
    /// The file does not fit the model: every missing, unexpected and mis-shaped tensor,
    /// by its Hugging Face name.
    Mismatch {
        /// The safetensors file.
        path: PathBuf,
        /// Tensors the model needs that the file lacks.
        missing: Vec<String>,
        /// Tensors in the file the model has no place for.
        unexpected: Vec<String>,
        /// Tensors whose shape (or dtype) differs: `name: expected …, found …`.
        misshaped: Vec<String>,
    },
}

impl fmt::Display for HfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HfError::Store { path, message } => write!(f, "{}: {message}", path.display()),
            HfError::Mismatch { path, missing, unexpected, misshaped } => {
                write!(f, "{}: the weights do not fit the model", path.display())?;
                for (what, list) in
                    [("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)]
                {
                    if !list.is_empty() {
                        write!(f, "\n  {what} ({}): {}", list.len(), list.join(", "))?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for HfError {}

/// Regex rewrites from Hugging Face names to Burn paths (applied in order).
fn to_burn_names(model: &LanguageModel<impl Backend>) -> &'static [(&'static str, &'static str)] {
    match model {
        LanguageModel::Gpt2(_) => &[
            (r"^transformer\.", ""),
            (r"^(h\.\d+\.ln_[12]|ln_f)\.weight$", "$1.gamma"),
            (r"^(h\.\d+\.ln_[12]|ln_f)\.bias$", "$1.beta"),
        ],
        LanguageModel::Llama(_) => &[(r"^(.*(?:layernorm|\.norm))\.weight$", "$1.gamma")],
    }
}

/// Regex rewrites from Burn paths back to Hugging Face names.
fn to_hf_names(model: &LanguageModel<impl Backend>) -> &'static [(&'static str, &'static str)] {
    match model {
        LanguageModel::Gpt2(_) => &[
            (r"^(h\.\d+\.ln_[12]|ln_f)\.gamma$", "$1.weight"),
            (r"^(h\.\d+\.ln_[12]|ln_f)\.beta$", "$1.bias"),
            (r"^(wte|wpe|h|ln_f)\.", "transformer.$1."),
        ],
        LanguageModel::Llama(_) => &[(r"^(.*)\.gamma$", "$1.weight")],
    }
}

/// The Hugging Face name of a Burn path (the inverse of [`to_burn_names`]), for messages.
fn hf_name(model: &LanguageModel<impl Backend>, burn_path: &str) -> String {
    let norm = burn_path.replace(".gamma", ".weight").replace(".beta", ".bias");
    match model {
        LanguageModel::Gpt2(_) if ["wte.", "wpe.", "h.", "ln_f."].iter().any(|p| norm.starts_with(p)) => {
            format!("transformer.{norm}")
        }
        _ => norm,
    }
}

/// Tensors the file may hold that the model ignores.
fn ignorable(model: &LanguageModel<impl Backend>, burn_path: &str) -> bool {
    let tied = match model {
        LanguageModel::Gpt2(m) => m.lm_head.is_none(),
        LanguageModel::Llama(m) => m.lm_head.is_none(),
    };
    let mask_buffer = burn_path.ends_with(".attn.bias") || burn_path.ends_with(".attn.masked_bias");
    (tied && burn_path == "lm_head.weight") || mask_buffer || burn_path.ends_with("rotary_emb.inv_freq")
}

/// Transposes PyTorch `Linear` weights (`[out, in]` ↔ Burn's `[in, out]`) and converts
/// half-precision tensors to f32 when loading.
#[derive(Clone)]
struct Layout {
    /// Transpose every Linear weight (Llama) or only the untied GPT-2 `lm_head`.
    all_linear: bool,
    to_f32: bool,
}

impl ModuleAdapter for Layout {
    fn adapt(&self, snapshot: &TensorSnapshot) -> TensorSnapshot {
        let path = snapshot.full_path();
        let is_linear_weight = path.ends_with("weight")
            && snapshot.shape.len() == 2
            && snapshot.module_type().as_deref() == Some("Struct:Linear");
        let transpose = is_linear_weight && (self.all_linear || path == "lm_head.weight");
        let cast = self.to_f32 && matches!(snapshot.dtype, DType::F16 | DType::BF16 | DType::F64);
        if !transpose && !cast {
            return snapshot.clone();
        }
        let data_fn = snapshot.clone_data_fn();
        let shape: Vec<usize> = snapshot.shape.to_vec();
        let out_shape = if transpose { vec![shape[1], shape[0]] } else { shape.clone() };
        let dtype = if cast { DType::F32 } else { snapshot.dtype };
        TensorSnapshot::from_closure(
            std::rc::Rc::new(move || {
                let mut data = data_fn()?;
                if cast {
                    data = data.convert::<f32>();
                }
                Ok(if transpose { transpose_2d(data, &shape) } else { data })
            }),
            dtype,
            out_shape.into(),
            snapshot.path_stack.clone().unwrap_or_default(),
            snapshot.container_stack.clone().unwrap_or_default(),
            snapshot.tensor_id.unwrap_or_default(),
        )
    }

    fn clone_box(&self) -> Box<dyn ModuleAdapter> {
        Box::new(self.clone())
    }
}

/// `[rows, cols]` → `[cols, rows]`, element by element (any dtype).
fn transpose_2d(data: TensorData, shape: &[usize]) -> TensorData {
    let (rows, cols) = (shape[0], shape[1]);
    let size = data.dtype.size();
    let bytes = data.as_bytes();
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (src, dst) = ((r * cols + c) * size, (c * rows + r) * size);
            out[dst..dst + size].copy_from_slice(&bytes[src..src + size]);
        }
    }
    TensorData::from_bytes_vec(out, vec![cols, rows], data.dtype)
}

fn store_err(path: &Path) -> impl Fn(burn_store::SafetensorsStoreError) -> HfError + '_ {
    move |e| HfError::Store { path: path.into(), message: e.to_string() }
}

/// The safetensors file of Hugging Face weights at `path`: the file itself, or a directory's
/// `model.safetensors` (as `ember export` and Hugging Face's `save_pretrained` write it).
///
/// Errors: nothing at `path`; a directory without `model.safetensors` (e.g. an Ember run
/// directory: export its weights first); something that is neither a file nor a directory.
pub fn weights_file(path: &Path) -> Result<PathBuf, HfError> {
    let error = |message: &str| HfError::Store { path: path.into(), message: message.into() };
    match std::fs::metadata(path) {
        Err(_) => Err(error("no such file")),
        Ok(m) if m.is_file() => Ok(path.into()),
        Ok(m) if m.is_dir() => {
            let file = path.join(WEIGHTS_FILE);
            match file.is_file() {
                true => Ok(file),
                false => Err(error(
                    "a directory without model.safetensors: expected Hugging Face weights, a .safetensors file or a directory holding model.safetensors (to start from an Ember run, write its weights with `ember export --run RUN_DIR --out DIR` and use DIR)",
                )),
            }
        }
        Ok(_) => Err(error("not a regular file: expected Hugging Face weights (a .safetensors file or a directory holding model.safetensors)")),
    }
}

/// The weights' file name in a Hugging Face model directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// Loads Hugging Face weights from `path` (a safetensors file, or a directory holding
/// `model.safetensors`: see [`weights_file`]) into `model` (which fixes the architecture and
/// the shapes). Every tensor of the model must be in the file.
///
/// Errors: no weights at `path` ([`weights_file`]); an unreadable file; [`HfError::Mismatch`] listing each missing, unexpected and
/// mis-shaped tensor by its Hugging Face name.
pub fn load<B: Backend>(mut model: LanguageModel<B>, path: &Path) -> Result<LanguageModel<B>, HfError> {
    let file = weights_file(path)?;
    let path = file.as_path();
    let mut store = to_burn_names(&model)
        .iter()
        .fold(SafetensorsStore::from_file(path), |s, (from, to)| s.with_key_remapping(*from, *to))
        .with_from_adapter(Layout { all_linear: matches!(model, LanguageModel::Llama(_)), to_f32: true })
        .allow_partial(true)
        .validate(false);
    let result = match &mut model {
        LanguageModel::Gpt2(m) => m.load_from(&mut store),
        LanguageModel::Llama(m) => m.load_from(&mut store),
    }
    .map_err(store_err(path))?;
    let missing: Vec<String> = result.missing.iter().map(|(p, _)| hf_name(&model, p)).collect();
    let unexpected: Vec<String> =
        result.unused.iter().filter(|p| !ignorable(&model, p)).map(|p| hf_name(&model, p)).collect();
    let misshaped: Vec<String> = result
        .errors
        .iter()
        .map(|e| match e {
            burn_store::ApplyError::ShapeMismatch { path, expected, found } => {
                format!(
                    "{} expected {:?}, found {:?}",
                    hf_name(&model, path),
                    expected.to_vec(),
                    found.to_vec()
                )
            }
            other => other.to_string(),
        })
        .collect();
    if missing.is_empty() && unexpected.is_empty() && misshaped.is_empty() {
        Ok(model)
    } else {
        Err(HfError::Mismatch { path: path.into(), missing, unexpected, misshaped })
    }
}

/// Writes `model`'s weights to `path` in the Hugging Face layout of its architecture (the
/// inverse of [`load`]; `metadata` `{"format": "pt"}` as `transformers` writes it).
///
/// Errors: the file cannot be written.
pub fn save<B: Backend>(model: &LanguageModel<B>, path: &Path) -> Result<(), HfError> {
    let mut store = to_hf_names(model)
        .iter()
        .fold(SafetensorsStore::from_file(path), |s, (from, to)| s.with_key_remapping(*from, *to))
        .clear_metadata()
        .metadata("format", "pt")
        .overwrite(true)
        .with_to_adapter(Layout { all_linear: matches!(model, LanguageModel::Llama(_)), to_f32: false });
    match model {
        LanguageModel::Gpt2(m) => m.save_into(&mut store),
        LanguageModel::Llama(m) => m.save_into(&mut store),
    }
    .map_err(store_err(path))
}

/// Every float tensor of `model`, named as in Hugging Face files (`transformer.h.0.attn.c_attn.weight`)
/// but kept in Burn's layout (Linear weights `[in, out]`), in the model's order. Two models of
/// one config give the same names in the same order, so their tensors can be compared by name
/// (`ember verify` compares gradients this way).
///
/// Errors: [`HfError::Store`] (naming `model`) if a tensor's data cannot be read back.
pub fn named_tensors<B: Backend>(model: &LanguageModel<B>) -> Result<Vec<(String, TensorData)>, HfError> {
    let snapshots = match model {
        LanguageModel::Gpt2(m) => m.collect(None, None, true),
        LanguageModel::Llama(m) => m.collect(None, None, true),
    };
    snapshots
        .into_iter()
        .map(|s| {
            let data = s.to_data().map_err(|e| HfError::Store {
                path: PathBuf::from("model"),
                message: format!("{}: {e:?}", s.full_path()),
            })?;
            Ok((hf_name(model, &s.full_path()), data))
        })
        .collect()
}

/// The vocabulary size of Hugging Face weights: the rows of their token embedding
/// (`[transformer.]wte.weight` for GPT-2, `model.embed_tokens.weight` for Llama). Lets a caller
/// build a model that fits a file (the published GPT-2 has 50257 rows; Ember's `gpt2` preset
/// pads to 50304).
///
/// Errors: an unreadable file, or one without a token embedding.
pub fn vocab_size(path: &Path) -> Result<usize, HfError> {
    let file = weights_file(path)?;
    let path = file.as_path();
    let mut store = SafetensorsStore::from_file(path);
    for name in ["transformer.wte.weight", "wte.weight", "model.embed_tokens.weight"] {
        if let Some(snapshot) = store.get_snapshot(name).map_err(store_err(path))? {
            return Ok(snapshot.shape[0]);
        }
    }
    Err(HfError::Store {
        path: path.into(),
        message: "no token embedding (transformer.wte.weight or model.embed_tokens.weight)".into(),
    })
}
