//! Whether a run fits in memory, checked before its model is allocated: `ember estimate`'s
//! peak (see [`super::accounting`]) against the memory available, so that a model too large
//! is refused with both numbers and the keys to change, instead of aborting the process in an
//! allocation (`memory allocation of N bytes failed`).
//!
//! On the CPU the replicas of this process share the RAM: the need is the peak per replica
//! plus each replica's own host memory ([`replica_overhead_bytes`]: its buffers, and a cost
//! of Burn's autodiff that grows with the square of the replicas) times the replicas, and the
//! memory available is `MemAvailable` of `/proc/meminfo` (Linux),
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
/// run's precision and checkpointing mode) times the replicas of this process, plus each
/// replica's [`replica_overhead_bytes`].
pub fn needed_bytes(config: &RunConfig) -> u64 {
    let peak = estimate_run(config, None, 0.4).peak;
    let replicas = config.devices.count() as u64;
    peak.saturating_add(replica_overhead_bytes(config)).saturating_mul(replicas)
}

/// Host memory each replica of a process takes beyond [`super::accounting`]'s peak
/// (measured, not derived; see below): [`REPLICA_FIXED_BYTES`], the epoch's row permutation
/// that its sampler draws (8 B per training row, [`ember_data::EpochSampler`]), and
/// [`REGISTRY_BYTES_PER_REPLICA`] per replica of the process for Burn autodiff's graph
/// registry, which each replica's backward pass copies whole — all replicas' nodes — while
/// the others run (`burn-autodiff` 0.21, `GraphCleaner::cleanup_orphaned_entries`): a cost
/// that grows with the square of the replicas.
///
/// Measured with the `tiny` preset on the Tiny Shakespeare corpus (58,941 training rows of 16
/// tokens, micro-batch 1), peak RSS of one step over the replicas: 64 replicas 0.57 MB each,
/// 512: 2.5 MB (4.1 MB with 6 layers), 1,024: 4.7 MB, 2,048: over 8.8 MB (stopped at 18 GB);
/// 12 layers at 256: 3.5 MB. This bound is above each of them.
pub fn replica_overhead_bytes(config: &RunConfig) -> u64 {
    let replicas = config.devices.count() as u64;
    let block = config.model.block_size().max(1) as u64;
    let rows = match config.data.as_deref().filter(|d| d.is_dir()) {
        Some(dir) => ember_data::Meta::read(dir).map_or(0, |meta| meta.train_tokens / block),
        None => 0,
    };
    let layers = config.model.n_layer() as u64;
    let registry = REGISTRY_BYTES_PER_REPLICA.saturating_add(REGISTRY_BYTES_PER_LAYER.saturating_mul(layers));
    REPLICA_FIXED_BYTES
        .saturating_add(rows.saturating_mul(8))
        .saturating_add(registry.saturating_mul(replicas))
}

/// A replica's fixed host memory: its thread's stack, gemm's packing buffer (2.1 MB reserved
/// per thread, partly touched), its data feed's prefetched batches. Measured (see
/// [`replica_overhead_bytes`]), rounded up.
pub const REPLICA_FIXED_BYTES: u64 = 1_000_000;

/// Bytes per replica of the process in each replica's copy of Burn autodiff's graph registry,
/// beyond [`REGISTRY_BYTES_PER_LAYER`]: 4.2 kB per replica measured with 2 layers.
pub const REGISTRY_BYTES_PER_REPLICA: u64 = 4_096;

/// Bytes per replica and layer in the registry copy (its nodes grow with the layers): 5.5 kB
/// per replica measured with 6 layers against 4.2 kB with 2.
pub const REGISTRY_BYTES_PER_LAYER: u64 = 400;

/// The memory the run of `config` can use on this machine, when it can be read cheaply: RAM
/// for the CPU backend (Linux), nothing on CUDA or wgpu.
pub fn available(config: &RunConfig) -> Option<Available> {
    match config.backend {
        BackendKind::Flex => available_ram(),
        BackendKind::Cuda | BackendKind::Wgpu => None,
    }
}

/// Refuses a run that needs more memory than is available, before anything is allocated
/// (unless `check_memory = false`, which `log` is told about when the run would not fit).
///
/// Errors: [`TrainError::WontFit`] with both numbers, the keys that size the run, and the key
/// that turns the check off; on wgpu, a buffer bigger than the adapter binds
/// ([`super::binding::check`]).
pub fn check(config: &RunConfig, log: &mut dyn FnMut(&str)) -> Result<(), TrainError> {
    // A hard limit of the device, whatever check_memory says.
    super::binding::check(config)?;
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
                BackendKind::Wgpu => "the wgpu adapter's memory is not read",
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
        "the run needs about {} of memory ({} parameters × 16 B for weights, gradients and AdamW, plus the activations of a micro-batch of {} × {}{}; `ember estimate` shows the details) but {} is available ({}): it would abort when allocating. Make it smaller (model.n_layer, model.d_model, micro_batch_size, model.block_size{}{}) or start anyway with --set check_memory=false",
        gb(needed),
        config.model.num_params(),
        config.micro_batch_size,
        crate::observe::words::count(config.model.block_size(), "token"),
        match replicas {
            1 => String::new(),
            n => format!(
                ", and {} for each replica's own buffers, × {n} replicas",
                gb(replica_overhead_bytes(config))
            ),
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sets: &[&str]) -> RunConfig {
        let text = "max_steps = 1\nmicro_batch_size = 1\n[model]\npreset = \"tiny\"\nvocab_size = 64\n";
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        RunConfig::from_toml_str(text, std::path::Path::new("run.toml"), &sets).unwrap()
    }

    /// n replicas need n × (peak + own), where a replica's own memory grows with the replicas
    /// (each backward's copy of Burn autodiff's graph registry holds every replica's nodes).
    #[test]
    fn each_replica_adds_its_own_memory_which_grows_with_the_replicas() {
        let one = config(&[]);
        let peak = estimate_run(&one, None, 0.4).peak;
        // tiny: 2 layers; no prepared data, so no sampler rows.
        let own =
            |n: u64| REPLICA_FIXED_BYTES + n * (REGISTRY_BYTES_PER_REPLICA + 2 * REGISTRY_BYTES_PER_LAYER);
        assert_eq!(replica_overhead_bytes(&one), 1_000_000 + 4_896);
        assert_eq!(needed_bytes(&one), peak + own(1));
        let many = config(&["devices=4096"]);
        assert_eq!(replica_overhead_bytes(&many), own(4096));
        // With several ranks the peak holds the gradient exchange's buffers too.
        let peak_many = estimate_run(&many, None, 0.4).peak;
        assert!(peak_many > peak);
        assert_eq!(needed_bytes(&many), 4096 * (peak_many + own(4096)));
        // Over 20 GB for tiny models: what a 23 GB machine could not hold (measured there).
        assert!(needed_bytes(&many) > 20_000_000_000, "{}", needed_bytes(&many));
        let deeper = config(&["devices=512", "model.n_layer=6"]);
        assert_eq!(replica_overhead_bytes(&deeper), 1_000_000 + 512 * (4_096 + 6 * 400));
    }

    /// A prepared `data` directory adds its sampler's row order: 8 B per training row.
    #[test]
    fn the_samplers_row_order_is_counted_when_the_data_is_known() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("corpus.txt");
        std::fs::write(&input, "abcdefghij".repeat(1000)).unwrap();
        let mut options = ember_data::PrepareOptions::new(
            ember_data::TokenizerKind::Char,
            vec![input],
            dir.path().join("data"),
        );
        options.progress = false;
        let summary = ember_data::prepare(&options).unwrap();
        let data = format!("data={:?}", dir.path().join("data").display().to_string());
        let with_data = config(&[&data]);
        let rows = summary.meta.train_tokens / 16; // tiny's context
        assert_eq!(replica_overhead_bytes(&with_data), replica_overhead_bytes(&config(&[])) + 8 * rows);
    }
}
