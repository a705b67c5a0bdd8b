//! What the machine says about itself: device memory on CUDA and wgpu (what Burn's CubeCL
//! backends hold in their memory pool — the counterparts of PyTorch's `torch.cuda.memory_allocated()`
//! and `torch.cuda.memory_reserved()`), the process's resident memory, and the GPU's model
//! name.

use std::any::Any;

use serde::Serialize;

use super::words::count;
use crate::config::BackendKind;

/// Memory of one device's pool, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Bytes held by live tensors (without padding).
    pub in_use_bytes: u64,
    /// Bytes the pool has reserved from the driver (≥ in use; a high-water mark in practice,
    /// since pages are rarely returned).
    pub reserved_bytes: u64,
}

impl DeviceMemory {
    /// The high points of two readings of one pool: the most bytes in use and the most
    /// reserved, each field apart (they may come from different readings).
    pub fn max(self, other: Self) -> Self {
        DeviceMemory {
            in_use_bytes: self.in_use_bytes.max(other.in_use_bytes),
            reserved_bytes: self.reserved_bytes.max(other.reserved_bytes),
        }
    }
}

/// The memory pool of `device` when it is a CUDA or wgpu device (in a build with that
/// feature); `None` for other devices (the CPU backend has no pool: use process RSS) or when
/// the runtime cannot say.
///
/// CubeCL keeps a pool per stream, and a stream per thread: call it from the thread that runs
/// the device's work.
pub fn device_memory<D: Any>(device: &D) -> Option<DeviceMemory> {
    let device = device as &dyn Any;
    #[cfg(feature = "cuda")]
    if let Some(cuda) = device.downcast_ref::<burn::backend::cuda::CudaDevice>() {
        use cubecl::Runtime;
        let usage = cubecl::cuda::CudaRuntime::client(cuda).memory_usage().ok()?;
        return Some(DeviceMemory { in_use_bytes: usage.bytes_in_use, reserved_bytes: usage.bytes_reserved });
    }
    #[cfg(feature = "wgpu")]
    if let Some(wgpu) = device.downcast_ref::<burn::backend::wgpu::WgpuDevice>() {
        use cubecl::Runtime;
        let usage = burn::backend::wgpu::WgpuRuntime::client(wgpu).memory_usage().ok()?;
        return Some(DeviceMemory { in_use_bytes: usage.bytes_in_use, reserved_bytes: usage.bytes_reserved });
    }
    let _ = device;
    None
}

/// The memory of every stream's pool of a wgpu `device` together: the process's whole use of
/// it, whichever threads touched it (CubeCL keeps a stream, and a pool, per thread; Burn 0.21
/// leaks one per fresh thread, Burn issue 4792). Creates the streams no thread has used yet
/// (CubeCL's `streaming.max_streams`, 128 by default), so it is a check, not a per-step
/// reading; `None` for other devices.
pub fn device_memory_all_streams<D: Any>(device: &D) -> Option<DeviceMemory> {
    #[cfg(feature = "wgpu")]
    if let Some(wgpu) = (device as &dyn Any).downcast_ref::<burn::backend::wgpu::WgpuDevice>() {
        use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        use cubecl::stream_id::StreamId;
        use cubecl::Runtime;
        let client = burn::backend::wgpu::WgpuRuntime::client(wgpu);
        let streams = u64::from(CubeClRuntimeConfig::get().streaming.max_streams.max(1));
        let mut total = DeviceMemory::default();
        for value in 0..streams {
            let usage = StreamId { value }.executes(|| client.memory_usage()).ok()?;
            total.in_use_bytes += usage.bytes_in_use;
            total.reserved_bytes += usage.bytes_reserved;
        }
        return Some(total);
    }
    let _ = device;
    None
}

/// The device of backend `kind` with index `index` in words, for logs, `ember bench` and the
/// dashboard: `cpu (burn-flex, 2 threads)` (the threads of rayon's global pool, which
/// burn-flex and the fused kernels run on: `RAYON_NUM_THREADS`, where 0 or garbage means one
/// per core — rayon's rule, so the pool is asked rather than the variable parsed),
/// `cuda:0 (NVIDIA H200)`, `wgpu:0 (llvmpipe (LLVM 15.0.6, 256 bits), Vulkan, software, runs on
/// the CPU (…))`.
pub fn describe_device(kind: BackendKind, index: usize) -> String {
    match kind {
        BackendKind::Flex => cpu_device(rayon::current_num_threads()),
        BackendKind::Cuda => {
            let model = gpu_model(index).unwrap_or_else(|| "unknown NVIDIA GPU".into());
            format!("cuda:{index} ({model})")
        }
        BackendKind::Wgpu => super::adapters::describe(index),
    }
}

/// [`describe_device`] in a few words, the kind of a wgpu adapter first (the dashboard's
/// header): `wgpu:0 software, llvmpipe (LLVM 15.0.6, 256 bits)`.
pub fn describe_device_short(kind: BackendKind, index: usize) -> String {
    match kind {
        BackendKind::Wgpu => super::adapters::short(index),
        other => describe_device(other, index),
    }
}

fn cpu_device(threads: usize) -> String {
    format!("cpu (burn-flex, {})", count(threads, "thread"))
}

/// A `/proc/self/status` memory line (`VmRSS:`, `VmHWM:`) in bytes; `None` off Linux.
pub fn rss_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// The model name of NVIDIA GPU `index` from the driver's `/proc` entry (Linux), e.g.
/// `NVIDIA H200`.
pub fn gpu_model(index: usize) -> Option<String> {
    let mut dirs: Vec<_> =
        std::fs::read_dir("/proc/driver/nvidia/gpus").ok()?.flatten().map(|e| e.path()).collect();
    dirs.sort();
    let info = std::fs::read_to_string(dirs.get(index)?.join("information")).ok()?;
    let line = info.lines().find(|l| l.starts_with("Model:"))?;
    Some(line["Model:".len()..].trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_high_point_of_two_readings_takes_each_field_apart() {
        let (a, b) = (
            DeviceMemory { in_use_bytes: 300, reserved_bytes: 512 },
            DeviceMemory { in_use_bytes: 200, reserved_bytes: 1024 },
        );
        let high = DeviceMemory { in_use_bytes: 300, reserved_bytes: 1024 };
        assert_eq!(a.max(b), high);
        assert_eq!(b.max(a), high);
        assert_eq!(a.max(a), a);
    }

    #[test]
    fn the_cpu_device_names_its_thread_count() {
        assert_eq!(cpu_device(1), "cpu (burn-flex, 1 thread)");
        assert_eq!(cpu_device(2), "cpu (burn-flex, 2 threads)");
    }

    #[test]
    fn the_cpu_backend_has_no_device_pool() {
        let device: burn::backend::flex::FlexDevice = Default::default();
        assert_eq!(device_memory(&device), None);
    }
}
