//! # parallel — data parallelism on burn-collective
//!
//! The step ([`crate::step`]) sums every rank's contribution through a [`GradSync`]; this
//! folder provides the implementation across replicas and processes, and what surrounds it:
//!
//! - [`collective`]: [`CollectivePeer`], one all-reduce per optimizer step carrying the
//!   gradients, Σ NLL, the exact token count, stop and failure flags and the replicas' hashes —
//!   with the re-registration workaround for burn-collective #4549 (see `README.md` here);
//! - [`layout`]: burn-collective's configuration, ports and the [`Group`] of a process;
//! - [`coordinator`]: the global orchestrators and the port checks;
//! - [`hash`]: parameter and settings hashes that tell whether the replicas agree;
//! - [`fault`]: [`FaultInjector`], a `GradSync` decorator for the tests of failure handling;
//! - `buffer`: gradients flattened into one buffer and back.
//!
//! May use: [`crate::config`], [`crate::step`] (the `GradSync` trait), [`crate::error`].

mod buffer;
pub mod collective;
pub mod coordinator;
pub mod fault;
pub mod hash;
pub mod layout;

pub use crate::step::GradSync;
pub use collective::CollectivePeer;
pub use coordinator::{check_data_ports, check_ports_free, serve_coordinator, start_coordinator};
pub use fault::{Corruption, FaultInjector, Faults};
pub use hash::{param_hash, settings_hash, text_hash};
pub use layout::{describe, join, join_group, Group};
