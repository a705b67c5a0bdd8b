//! A resumed run continues on the data it started on: the run's copy of its data's
//! `meta.json` (`RUN_DIR/data_meta.json`) against the data given now — tokenizer, vocabulary,
//! kind, train/val token counts, and the sha256 of every shard and of the document index.

use std::fs;
use std::path::Path;

use ember_data::{Meta, PreparedData, TokenizerSpec};

use crate::error::TrainError;
use crate::persist::files;

/// Shards whose sha256 differ that are named one by one; the rest are counted.
const SHARDS_NAMED: usize = 3;

/// Checks that `data` is the data the run in `run_dir` started on.
///
/// Errors: `RUN_DIR/data_meta.json` unreadable or invalid; [`TrainError::DataChanged`] naming
/// every difference, `KEY was A, now B`.
pub(super) fn check_same_data(run_dir: &Path, data: &PreparedData) -> Result<(), TrainError> {
    let path = run_dir.join(files::DATA_META);
    let bytes = fs::read(&path).map_err(TrainError::io(&path))?;
    let saved: Meta = serde_json::from_slice(&bytes).map_err(|e| TrainError::Checkpoint {
        path: path.clone(),
        message: format!("invalid data metadata: {e}"),
    })?;
    let differences = differences(&saved, &data.meta);
    if differences.is_empty() {
        return Ok(());
    }
    Err(TrainError::DataChanged {
        saved: path,
        now: data.dir.join(ember_data::META_FILE),
        differences: differences.join("; "),
    })
}

/// What differs between the run's data `was` and the data `now`, as `KEY was A, now B`.
pub fn differences(was: &Meta, now: &Meta) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(tokenizer) = tokenizer_difference(&was.tokenizer, &now.tokenizer) {
        out.push(tokenizer);
    }
    let field = |out: &mut Vec<String>, key: &str, was: String, now: String| {
        if was != now {
            out.push(format!("{key} was {was}, now {now}"));
        }
    };
    let kind = |m: &Meta| format!("{:?}", m.kind).to_lowercase();
    field(&mut out, "vocab_size", was.vocab_size.to_string(), now.vocab_size.to_string());
    field(&mut out, "kind", kind(was), kind(now));
    field(&mut out, "train_tokens", was.train_tokens.to_string(), now.train_tokens.to_string());
    field(&mut out, "val_tokens", was.val_tokens.to_string(), now.val_tokens.to_string());
    field(&mut out, "number of shards", was.shards.len().to_string(), now.shards.len().to_string());
    let changed: Vec<_> = was.shards.iter().zip(&now.shards).filter(|(a, b)| a.sha256 != b.sha256).collect();
    for (a, b) in changed.iter().take(SHARDS_NAMED) {
        field(&mut out, &format!("shard {} sha256", a.file), short(&a.sha256), short(&b.sha256));
    }
    if changed.len() > SHARDS_NAMED {
        out.push(format!("and {} more shards' sha256", changed.len() - SHARDS_NAMED));
    }
    let documents = format!("{} sha256", ember_data::DOCUMENTS_FILE);
    field(&mut out, &documents, short(&was.documents_sha256), short(&now.documents_sha256));
    let prompts = |m: &Meta| m.prompts_sha256.as_deref().map_or("(none)".into(), short);
    field(&mut out, &format!("{} sha256", ember_data::PROMPTS_FILE), prompts(was), prompts(now));
    out
}

/// A sha256 shortened to its first 12 hex digits and `…`.
fn short(sha256: &str) -> String {
    match sha256.get(..12) {
        Some(head) if sha256.len() > 12 => format!("{head}…"),
        _ => sha256.to_string(),
    }
}

fn tokenizer_difference(was: &TokenizerSpec, now: &TokenizerSpec) -> Option<String> {
    if was == now {
        return None;
    }
    let describe = |spec: &TokenizerSpec| match spec {
        TokenizerSpec::Char { chars } => format!("char ({} characters)", chars.len()),
        TokenizerSpec::Hf { sha256, .. } => format!("hf (tokenizer.json sha256 {})", short(sha256)),
        other => other.kind().to_string(),
    };
    Some(match (was, now) {
        (TokenizerSpec::Char { chars: a }, TokenizerSpec::Char { chars: b }) => {
            let only = |x: &[char], y: &[char]| x.iter().filter(|c| !y.contains(c)).collect::<String>();
            format!(
                "the char tokenizer's characters differ (only the run's: {:?}; only the data's now: {:?})",
                only(a, b),
                only(b, a)
            )
        }
        _ => format!("tokenizer was {}, now {}", describe(was), describe(now)),
    })
}
