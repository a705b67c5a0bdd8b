//! Whether a run fits in memory, checked before its model is allocated: `ember estimate`'s
//! peak (see [`super::accounting`]) against the memory available, so that a model too large
//! is refused with both numbers and the keys to change, instead of aborting the process in an
//! allocation (`memory allocation of N bytes failed`).
//!
//! On the CPU the replicas of this process share the RAM: the need is the peak per replica
//! times the replicas, and the memory available is `MemAvailable` of `/proc/meminfo` (Linux),
//! or less when a cgroup (v2) limit leaves less. On CUDA the device memory is not read (Burn
//! 0.21 exposes the memory pool's use, not the device's free memory): the check is skipped
//! with a note. Setting `check_memory = false` skips it too.

use crate::config::{BackendKind, RunConfig};
use crate::error::TrainError;

use super::accounting::estimate_run;

/// Memory a run can use, and where the number comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    /// Bytes.
    pub bytes: u64,
    /// Where it was read, e.g. `MemAvailable in /proc/meminfo`.
    pub source: String,
}

/// Bytes the run of `config` needs in this process: `ember estimate`'s peak per replica (in the
/// run's precision and checkpointing mode) times the replicas of this process.
pub fn needed_bytes(config: &RunConfig) -> u64 {
    let peak = estimate_run(config, None, 0.4).peak;
    peak.saturating_mul(config.devices.count() as u64)
}

/// The memory the run of `config` can use on this machine, when it can be read cheaply: RAM
/// for the CPU backend (Linux), nothing on CUDA.
pub fn available(config: &RunConfig) -> Option<Available> {
    match config.backend {
        BackendKind::Flex => available_ram(),
        BackendKind::Cuda => None,
    }
}

/// Refuses a run that needs more memory than is available, before anything is allocated
/// (unless `check_memory = false`, which `log` is told about when the run would not fit).
///
/// Errors: [`TrainError::WontFit`] with both numbers, the keys that size the run, and the key
/// that turns the check off.
pub fn check(config: &RunConfig, log: &mut dyn FnMut(&str)) -> Result<(), TrainError> {
    if !config.check_memory {
        // Still say so when it will not fit: an abort that follows is then explained.
        if let Some(available) = available(config) {
            if let Err(TrainError::WontFit { needed_bytes, available_bytes, .. }) =
                check_against(config, &available)
            {
                log(&format!(
                    "check_memory = false: starting although the run needs about {} of memory and {} is available ({})",
                    gb(needed_bytes),
                    gb(available_bytes),
                    available.source
                ));
            }
        }
        return Ok(());
    }
    match available(config) {
        Some(available) => check_against(config, &available),
        None => {
            let what = match config.backend {
                BackendKind::Cuda => "the CUDA device's memory is not read",
                BackendKind::Flex => "the available RAM is unknown on this system",
            };
            log(&format!(
                "memory check skipped ({what}): `ember estimate` puts this run's peak at {} per device",
                gb(needed_bytes(config))
            ));
            Ok(())
        }
    }
}

/// [`check`]'s comparison against `available`, whatever `check_memory` says.
///
/// Errors: the run needs more than `available.bytes` ([`TrainError::WontFit`]).
pub fn check_against(config: &RunConfig, available: &Available) -> Result<(), TrainError> {
    let needed = needed_bytes(config);
    if needed <= available.bytes {
        return Ok(());
    }
    let replicas = config.devices.count();
    let message = format!(
        "the run needs about {} of memory ({} parameters × 16 B for weights, gradients and AdamW, plus the activations of a micro-batch of {} × {} tokens{}; `ember estimate` shows the details) but {} is available ({}): it would abort when allocating. Make it smaller (model.n_layer, model.d_model, micro_batch_size, model.block_size{}{}) or start anyway with --set check_memory=false",
        gb(needed),
        config.model.num_params(),
        config.micro_batch_size,
        config.model.block_size(),
        if replicas > 1 { format!(", × {replicas} replicas") } else { String::new() },
        gb(available.bytes),
        available.source,
        if replicas > 1 { ", devices" } else { "" },
        if config.activation_checkpointing == crate::config::CheckpointingKind::None {
            ", or activation_checkpointing = \"blocks\" to keep one layer's activations"
        } else {
            ""
        },
    );
    Err(TrainError::WontFit {
        config: config.origin.described(),
        needed_bytes: needed,
        available_bytes: available.bytes,
        message,
    })
}

/// `12.345 GB`.
fn gb(bytes: u64) -> String {
    format!("{:.3} GB", bytes as f64 / 1e9)
}

/// `MemAvailable` of `/proc/meminfo`, lowered to what this process's cgroup (v2) limit leaves.
fn available_ram() -> Option<Available> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kb: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    let ram = Available { bytes: kb * 1024, source: "MemAvailable in /proc/meminfo".into() };
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{name}")).ok()?.trim().parse().ok()
    };
    match (read("memory.max"), read("memory.current")) {
        (Some(max), Some(current)) if max.saturating_sub(current) < ram.bytes => Some(Available {
            bytes: max.saturating_sub(current),
            source: format!(
                "the cgroup limit /sys/fs/cgroup/memory.max of {} less {} in use",
                gb(max),
                gb(current)
            ),
        }),
        _ => Some(ram),
    }
}
