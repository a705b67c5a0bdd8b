//! burn-collective's global orchestrators (the "coordinator" of a multi-node run) and the
//! ports its servers need.
//!
//! burn-collective's WebSocket servers (the orchestrator and each node's data service) listen
//! on all interfaces (`0.0.0.0`) without authentication: multi-node runs belong on a private
//! network. Ember connects to the addresses of `[parallel]`, which default to loopback.

use crate::config::RunConfig;
use crate::error::TrainError;

use super::layout::data_port;

/// Starts burn-collective's global orchestrators in this process when it is node 0 of several
/// and `parallel.start_coordinator` is on, unless the caller runs them `elsewhere` (the CLI
/// starts them in a child process); they serve until the process exits.
///
/// Errors: the orchestrators' runtime cannot start.
pub fn start_coordinator(
    config: &RunConfig,
    elsewhere: bool,
) -> Result<Option<std::thread::JoinHandle<()>>, TrainError> {
    let p = &config.parallel;
    if p.nodes <= 1 || p.node_rank != 0 || !p.start_coordinator || elsewhere {
        return Ok(None);
    }
    let port = p.coordinator.port;
    check_ports_free(port)?;
    Ok(Some(serve_coordinator(port)?))
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
    std::net::TcpListener::bind(("0.0.0.0", port)).map(drop).map_err(|e| TrainError::Network(message(e)))
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
        .map_err(|e| TrainError::Network(format!("cannot start the coordinator's runtime: {e}")))?;
    Ok(std::thread::spawn(move || {
        runtime.block_on(async {
            let second = tokio::spawn(burn_collective::start_global_orchestrator(port + 1));
            burn_collective::start_global_orchestrator(port).await;
            let _ = second.await;
        })
    }))
}
