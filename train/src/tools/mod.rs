//! # tools — what the `ember` binary offers besides training
//!
//! - [`commands`]: `ember train`, `eval`, `sample` and `bench` on the configured backend;
//! - [`backend`]: choosing the backend (`flex`, `cuda`) at run time;
//! - [`bench`](mod@bench): timed optimizer steps on random tokens (Ember's one step, phases, MFU, memory);
//! - [`verify`]: numerical parity with a PyTorch fixture;
//! - [`replay`]: one step of a run replayed from its checkpoint, micro-batch by micro-batch;
//! - [`trained`], [`sample`], [`export`]: a trained model loaded, sampled, exported.
//!
//! May use: everything before it ([`crate::runner`] and below). Nothing uses it but the CLI.

pub mod backend;
pub mod bench;
pub mod commands;
pub mod export;
pub mod replay;
pub mod sample;
pub mod trained;
pub mod verify;
