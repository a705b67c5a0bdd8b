//! # persist — what a run leaves on disk
//!
//! - [`files`]: the run directory's files;
//! - [`checkpoint`]: `RUN_DIR/checkpoints/step-N/` (model, both AdamW groups, `state.json`,
//!   `config.toml`, and `manifest.json` with every file's size and SHA-256, written last),
//!   written to a temporary directory, fsync'd and renamed, then `latest` replaced
//!   atomically; loading takes the newest checkpoint that verifies against its manifest;
//! - [`manifest`]: the manifest and the checks of a checkpoint against it;
//! - [`recover`]: choosing the checkpoint to load, cleaning up interrupted ones, pruning;
//! - [`written`]: `written.json`, the SHA-256 of the run files Ember wrote, so that only
//!   those are ever replaced by a new run.
//!
//! Every file that replaces another goes through [`ember_data::write_atomic`], Ember's one
//! atomic-write helper (temp file, fsync, rename); a checkpoint's files are new files in a
//! new directory, each fsync'd, and the directory is renamed whole.
//!
//! May use: [`crate::step`] (the optimizer's record), [`crate::error`].

pub mod checkpoint;
pub(crate) mod durable;
pub mod files;
pub mod manifest;
pub mod recover;
pub mod written;
