//! Data-parallel layout: burn-collective's configuration for the replicas of this process and,
//! across processes, the addresses of its global orchestrators and data services.

use std::str::FromStr;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use burn::collective::{AllReduceStrategy, CollectiveConfig};
use burn::tensor::backend::AutodiffBackend;
use burn_communication::Address;

use super::collective::CollectivePeer;
use crate::config::{RunConfig, Strategy};
use crate::error::TrainError;

/// The burn-collective configurations of a process with `local` replicas, registered in turn
/// (see [`CollectivePeer`]): one for a single process; for several, two that differ in their
/// orchestrator (the coordinator's port and the next one) and this node's data-service port.
pub fn collective_config(config: &RunConfig, local: usize) -> Vec<CollectiveConfig> {
    let strategy = all_reduce_strategy(config.parallel.strategy);
    let base = local_config(local, config.parallel.strategy);
    let p = &config.parallel;
    if p.nodes <= 1 {
        return vec![base];
    }
    let (host, port) = (&p.coordinator.host, p.coordinator.port);
    let address = |text: String| Address::from_str(&text).expect("any text is an address");
    (0..2u16)
        .map(|round| {
            let data_port = data_port(config, round);
            base.clone()
                .with_num_nodes(p.nodes as u32)
                .with_global_address(address(format!("ws://{host}:{}", port + round)))
                .with_node_address(address(format!("ws://{}:{data_port}", p.node_address)))
                .with_data_service_port(data_port)
                .with_global_all_reduce_strategy(strategy)
        })
        .collect()
}

/// burn-collective's configuration of `local` replicas in one process, all-reducing with
/// `strategy`.
fn local_config(local: usize, strategy: Strategy) -> CollectiveConfig {
    CollectiveConfig::default()
        .with_num_devices(local)
        .with_local_all_reduce_strategy(all_reduce_strategy(strategy))
}

fn all_reduce_strategy(strategy: Strategy) -> AllReduceStrategy {
    match strategy {
        Strategy::Centralized => AllReduceStrategy::Centralized,
        Strategy::Tree => AllReduceStrategy::Tree(2),
        Strategy::Ring => AllReduceStrategy::Ring,
    }
}

/// This node's data-service port in round `round` (0 or 1): `parallel.data_port` (else the
/// coordinator's port + 2) + 2 × node rank + round.
pub fn data_port(config: &RunConfig, round: u16) -> u16 {
    let p = &config.parallel;
    let first = p.data_port.unwrap_or_else(|| p.coordinator.port.saturating_add(2));
    first.saturating_add(2 * p.node_rank as u16 + round)
}

/// A line describing the data-parallel layout of a process with `local` replicas.
pub fn describe(config: &RunConfig, local: usize) -> String {
    let p = &config.parallel;
    let nodes = if p.nodes > 1 {
        format!(
            " on each of {} processes (this is node {}; coordinator {}, this node's data service on ports {} and {})",
            p.nodes,
            p.node_rank,
            p.coordinator,
            data_port(config, 0),
            data_port(config, 1)
        )
    } else {
        String::new()
    };
    format!(
        "data parallel: {} ranks = {local} {}{nodes}; {} per optimizer step ({} strategy, timeout {} s)",
        config.world_size(),
        if local == 1 { "replica" } else { "replicas" },
        match p.shard_optimizer {
            true => "two all-reduces (the gradients, then the updated parameters of every rank's shard)",
            false => "one all-reduce",
        },
        strategy_name(config.parallel.strategy),
        p.timeout_s
    )
}

/// The strategy's name, as written in the config.
pub fn strategy_name(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Centralized => "centralized",
        Strategy::Tree => "tree",
        Strategy::Ring => "ring",
    }
}

/// What the replicas of one process share to join the collective.
#[derive(Clone)]
pub struct Group {
    /// burn-collective configurations, registered in turn ([`collective_config`]).
    pub rounds: Vec<CollectiveConfig>,
    /// Synchronizes this process's replicas between leaving and registering again.
    pub local_barrier: Arc<Barrier>,
}

impl Group {
    /// The group of a process with `local` replicas.
    pub fn new(config: &RunConfig, local: usize) -> Self {
        Self { rounds: collective_config(config, local), local_barrier: Arc::new(Barrier::new(local)) }
    }

    /// The group of `local` replicas in this process and no other (tree all-reduce), for
    /// callers without a run configuration (the burn-train strategy).
    pub fn local(local: usize) -> Self {
        Self {
            rounds: vec![local_config(local, Strategy::Tree)],
            local_barrier: Arc::new(Barrier::new(local)),
        }
    }
}

/// Joins rank `rank` to the collective on `device`.
///
/// Errors: burn-collective refuses the registration; the other ranks do not join in time.
pub fn join<B: AutodiffBackend>(
    config: &RunConfig,
    rank: usize,
    device: &B::Device,
    group: Group,
) -> Result<CollectivePeer<B>, TrainError> {
    let timeout = Duration::from_secs(config.parallel.timeout_s);
    join_group(rank, config.world_size(), device, group, timeout, config.parallel.strategy)
}

/// Joins rank `rank` of `world_size` to the collective of `group` on `device`, naming
/// `strategy` (the one `group` was configured with), waiting at most `timeout` for the others.
///
/// Errors: burn-collective refuses the registration; the other ranks do not join in time.
pub fn join_group<B: AutodiffBackend>(
    rank: usize,
    world_size: usize,
    device: &B::Device,
    group: Group,
    timeout: Duration,
    strategy: Strategy,
) -> Result<CollectivePeer<B>, TrainError> {
    let name = strategy_name(strategy).to_string();
    CollectivePeer::register(
        rank,
        world_size,
        device.clone(),
        group.rounds,
        group.local_barrier,
        timeout,
        name,
    )
}
