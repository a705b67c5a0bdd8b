//! # persist — what a run leaves on disk
//!
//! - [`files`]: the run directory's files;
//! - [`checkpoint`]: `RUN_DIR/checkpoints/step-N/` (model, both AdamW groups, `state.json`),
//!   written to a temporary directory and renamed, then `latest` replaced atomically.
//!
//! Every file that replaces another goes through [`ember_data::write_atomic`], Ember's one
//! atomic-write helper (temp file, fsync, rename).
//!
//! May use: [`crate::step`] (the optimizer's record), [`crate::error`].

pub mod checkpoint;
pub mod files;
