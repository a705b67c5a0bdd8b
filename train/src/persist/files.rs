//! The layout of a run directory: the files a run writes beside its `checkpoints/`.

/// The resolved configuration.
pub const CONFIG: &str = "config.toml";
/// A copy of the prepared data's `meta.json` (tokenizer for sampling).
pub const DATA_META: &str = "data_meta.json";
/// One JSON record per logged step.
pub const METRICS: &str = "metrics.jsonl";
