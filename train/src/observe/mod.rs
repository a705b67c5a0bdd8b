//! # observe — what a run reports about itself
//!
//! - [`metrics`]: the records of `RUN_DIR/metrics.jsonl` and their log lines;
//! - [`accounting`]: memory and FLOPs of a configuration before it runs (parameters, 16 B per
//!   parameter, activations, 6·N·T, MFU) and the GPUs' peak FLOP/s;
//! - [`events`]: the stability sentinel's event records;
//! - [`fits`]: whether a run fits in memory, checked before its model is allocated;
//! - [`device`]: device-pool memory on CUDA and wgpu, process RSS, the GPU's name;
//! - [`adapters`]: the wgpu adapters (`device = N`) and their description; [`binding`]: a
//!   run's largest buffer against an adapter's binding limit;
//! - [`shards`]: how ZeRO-1 splits the parameters over ranks;
//! - [`words`]: counts in words (`1 rank`, `2 ranks`).
//!
//! May use: [`crate::config`], [`crate::error`]. Nothing that trains.

pub mod accounting;
pub mod adapters;
pub mod binding;
pub mod device;
pub mod events;
pub mod fits;
pub mod metrics;
pub mod shards;
pub mod words;
