//! Data-parallel layout: burn-collective's configuration for the replicas of this process and,
//! across processes, its global orchestrator.
//!
//! burn-collective's WebSocket servers (the orchestrator and each node's data service) listen
//! on all interfaces (`0.0.0.0`) without authentication: multi-node runs belong on a private
//! network. Ember connects to the addresses of `[parallel]`, which default to loopback.

use std::str::FromStr;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use burn::collective::{AllReduceStrategy, CollectiveConfig};
use burn::tensor::backend::AutodiffBackend;
use burn_communication::Address;

use crate::config::{RunConfig, Strategy};
use crate::error::TrainError;
use crate::sync::CollectivePeer;

/// The burn-collective configurations of a process with `local` replicas, registered in turn
/// (see [`CollectivePeer`]): one for a single process; for several, two that differ in their
/// orchestrator (the coordinator's port and the next one) and this node's data-service port.
pub fn collective_config(config: &RunConfig, local: usize) -> Vec<CollectiveConfig> {
    let strategy = all_reduce_strategy(config.parallel.strategy);
    let base = CollectiveConfig::default().with_num_devices(local).with_local_all_reduce_strategy(strategy);
    let p = &config.parallel;
    if p.nodes <= 1 {
        return vec![base];
    }
    let (host, port) = coordinator_host_port(config);
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
    let first = p.data_port.unwrap_or_else(|| coordinator_host_port(config).1.saturating_add(2));
    first.saturating_add(2 * p.node_rank as u16 + round)
}

/// The coordinator's host and (first) port, from `parallel.coordinator` (`HOST:PORT`, validated
/// with the config).
fn coordinator_host_port(config: &RunConfig) -> (String, u16) {
    let text = &config.parallel.coordinator;
    match text.rsplit_once(':') {
        Some((host, port)) => (host.to_string(), port.parse().unwrap_or(29500)),
        None => (text.clone(), 29500),
    }
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
        "data parallel: {} ranks = {local} {}{nodes}; one all-reduce per optimizer step ({} strategy, timeout {} s)",
        config.world_size(),
        if local == 1 { "replica" } else { "replicas" },
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
    let strategy = strategy_name(config.parallel.strategy).to_string();
    let timeout = Duration::from_secs(config.parallel.timeout_s);
    CollectivePeer::register(
        rank,
        config.world_size(),
        device.clone(),
        group.rounds,
        group.local_barrier,
        timeout,
        strategy,
    )
}

/// Starts burn-collective's global orchestrators in this process when it is node 0 of several
/// and `parallel.start_coordinator` is on; they serve until the process exits.
///
/// Errors: the orchestrators' runtime cannot start.
pub fn start_coordinator(config: &RunConfig) -> Result<Option<std::thread::JoinHandle<()>>, TrainError> {
    let p = &config.parallel;
    if p.nodes <= 1 || p.node_rank != 0 || !p.start_coordinator || p.coordinator_elsewhere {
        return Ok(None);
    }
    let port = coordinator_host_port(config).1;
    check_ports_free(port)?;
    Ok(Some(serve_coordinator(port)?))
}

/// The coordinator's port of `config`.
pub fn coordinator_port(config: &RunConfig) -> u16 {
    coordinator_host_port(config).1
}

/// Checks that this node's two data-service ports are free (several nodes only).
///
/// Errors: a port is taken, naming it and the key that moves it.
pub fn check_data_ports(config: &RunConfig) -> Result<(), TrainError> {
    if config.parallel.nodes <= 1 {
        return Ok(());
    }
    for round in 0..2 {
        let port = data_port(config, round);
        ensure_free(port, |e| {
            format!(
                "node {}: data-service port {port} is not free: {e} (move the ports with parallel.data_port)",
                config.parallel.node_rank
            )
        })?;
    }
    Ok(())
}

/// Checks that the orchestrators' ports `port` and `port + 1` are free (burn-collective
/// would otherwise log the failure and carry on).
///
/// Errors: a port is taken, naming it.
pub fn check_ports_free(port: u16) -> Result<(), TrainError> {
    for p in [port, port + 1] {
        ensure_free(p, |e| {
            format!(
                "cannot start the coordinator on port {p}: {e} (another coordinator or run holds it? use it with --set parallel.start_coordinator=false, or pick another --coordinator port)"
            )
        })?;
    }
    Ok(())
}

/// Binds `port` on all interfaces (as burn-collective's servers will) and lets it go again.
///
/// Errors: the port is taken, described by `message`.
fn ensure_free(port: u16, message: impl FnOnce(std::io::Error) -> String) -> Result<(), TrainError> {
    std::net::TcpListener::bind(("0.0.0.0", port)).map(drop).map_err(|e| TrainError::Sync(message(e)))
}

/// Runs burn-collective's global orchestrators on `port` and `port + 1` on a background
/// thread. burn-collective 0.21 listens on all interfaces (`0.0.0.0`) without
/// authentication: keep these ports on a private network.
///
/// Errors: the async runtime cannot start.
pub fn serve_coordinator(port: u16) -> Result<std::thread::JoinHandle<()>, TrainError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| TrainError::Sync(format!("cannot start the coordinator's runtime: {e}")))?;
    Ok(std::thread::spawn(move || {
        runtime.block_on(async {
            let second = tokio::spawn(burn_collective::start_global_orchestrator(port + 1));
            burn_collective::start_global_orchestrator(port).await;
            let _ = second.await;
        })
    }))
}
