//! `[parallel]` and `devices`: how many replicas, on which devices, across which processes, and
//! the addresses they meet at ([`HostPort`], parsed once).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Replicas of a process: a count or explicit CUDA device indices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Devices {
    /// This many replicas (CUDA: devices `device..device + n`).
    Count(usize),
    /// These CUDA device indices.
    List(Vec<usize>),
}

impl Default for Devices {
    fn default() -> Self {
        Devices::Count(1)
    }
}

impl Devices {
    /// How many devices (replicas in this process), without listing them.
    pub fn count(&self) -> usize {
        match self {
            Devices::Count(n) => *n,
            Devices::List(list) => list.len(),
        }
    }

    /// Device indices, the count form starting at `first`.
    pub fn indices(&self, first: usize) -> Vec<usize> {
        match self {
            Devices::Count(n) => (first..first + n).collect(),
            Devices::List(list) => list.clone(),
        }
    }
}

/// burn-collective's all-reduce algorithms (the same result, other traffic patterns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Every rank sends to one, which reduces and sends back.
    Centralized,
    /// A binary tree reduces up and broadcasts down.
    #[default]
    Tree,
    /// Ring all-reduce (reduce-scatter then all-gather).
    Ring,
}

/// Data parallelism across processes (`[parallel]`). Every address defaults to loopback.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParallelConfig {
    /// Processes ("nodes") training together; each runs `devices` replicas.
    pub nodes: usize,
    /// This process's index among the nodes (0 writes logs, metrics and checkpoints).
    pub node_rank: usize,
    /// `HOST:PORT` of burn-collective's global orchestrators (started by node 0, or by
    /// `ember coordinator`): they listen on PORT and PORT + 1.
    pub coordinator: HostPort,
    /// Start the orchestrator in node 0's process (else run `ember coordinator`).
    pub start_coordinator: bool,
    /// The address other nodes reach this node at.
    pub node_address: String,
    /// The first data-service port of node 0 (default: the coordinator's port + 2); node r
    /// uses this + 2r and this + 2r + 1.
    pub data_port: Option<u16>,
    /// All-reduce algorithm, within a process and between nodes.
    pub strategy: Strategy,
    /// Seconds a rank waits for the others in an exchange before stopping with an error.
    pub timeout_s: u64,
    /// Compare the replicas' parameter hashes every N steps (0: at every logged step).
    pub check_every: u64,
    /// ZeRO-1: each rank keeps the AdamW moments of only its share of the parameters and
    /// updates only those; the updated parameters are gathered after each step.
    pub shard_optimizer: bool,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        Self {
            nodes: 1,
            node_rank: 0,
            coordinator: HostPort { host: "127.0.0.1".into(), port: 29500 },
            start_coordinator: true,
            node_address: "127.0.0.1".into(),
            data_port: None,
            strategy: Strategy::Tree,
            timeout_s: 300,
            check_every: 0,
            shard_optimizer: false,
        }
    }
}

/// A `HOST:PORT` address whose PORT leaves room for the next one (burn-collective's second
/// orchestrator listens on PORT + 1). Written and read as the text `HOST:PORT`; the one parser
/// of addresses in Ember (`[parallel] coordinator`, `--coordinator`, `ember coordinator --bind`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostPort {
    /// Host name or IP address.
    pub host: String,
    /// The first port (below 65534).
    pub port: u16,
}

impl FromStr for HostPort {
    type Err = String;

    /// Parses `HOST:PORT` (an IPv6 host in brackets: `[::1]:29500`).
    ///
    /// Errors: no `:`, an empty host, or a PORT that is not a number from 1 to 65533 (port 0
    /// would ask the system for any free port, which the other nodes could not know); the
    /// message names the text and what was expected.
    fn from_str(text: &str) -> Result<Self, String> {
        let expected = || format!("expected HOST:PORT (PORT from 1 to 65533), got {text:?}");
        let (host, port) = text.rsplit_once(':').ok_or_else(expected)?;
        let port = port.parse::<u16>().ok().filter(|&p| p > 0 && p < u16::MAX - 1).ok_or_else(expected)?;
        if host.is_empty() {
            return Err(expected());
        }
        Ok(HostPort { host: host.to_string(), port })
    }
}

impl TryFrom<String> for HostPort {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl From<HostPort> for String {
    fn from(address: HostPort) -> String {
        address.to_string()
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_parses_and_prints_back() {
        let a: HostPort = "10.0.0.1:29500".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("10.0.0.1", 29500));
        assert_eq!(a.to_string(), "10.0.0.1:29500");
        let v6: HostPort = "[::1]:7".parse().unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("[::1]", 7));
    }

    #[test]
    fn bad_host_port_says_what_was_expected() {
        for bad in ["29500", ":29500", "host:", "host:port", "host:0", "host:65534", "host:70000"] {
            let err = bad.parse::<HostPort>().unwrap_err();
            assert_eq!(err, format!("expected HOST:PORT (PORT from 1 to 65533), got {bad:?}"));
        }
    }
}
