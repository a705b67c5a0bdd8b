//! What the machine says about itself: device memory on CUDA (what Burn's CUDA backend holds
//! in its CubeCL memory pool — the counterparts of PyTorch's `torch.cuda.memory_allocated()`
//! and `torch.cuda.memory_reserved()`), the process's resident memory, and the GPU's model
//! name.

use std::any::Any;

use serde::Serialize;

/// Memory of one device's pool, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Bytes held by live tensors (without padding).
    pub in_use_bytes: u64,
    /// Bytes the pool has reserved from the driver (≥ in use; a high-water mark in practice,
    /// since pages are rarely returned).
    pub reserved_bytes: u64,
}

/// The memory pool of `device` when it is a CUDA device (in a build with the `cuda` feature);
/// `None` for other devices (the CPU backend has no pool: use process RSS) or when the
/// runtime cannot say.
///
/// CubeCL keeps a pool per stream: call it from the thread that runs the device's work.
pub fn device_memory<D: Any>(device: &D) -> Option<DeviceMemory> {
    #[cfg(feature = "cuda")]
    {
        use burn::backend::cuda::CudaDevice;
        use cubecl::cuda::CudaRuntime;
        use cubecl::Runtime;
        let cuda = (device as &dyn Any).downcast_ref::<CudaDevice>()?;
        let usage = CudaRuntime::client(cuda).memory_usage().ok()?;
        Some(DeviceMemory { in_use_bytes: usage.bytes_in_use, reserved_bytes: usage.bytes_reserved })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        None
    }
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
    fn the_cpu_backend_has_no_device_pool() {
        let device: burn::backend::flex::FlexDevice = Default::default();
        assert_eq!(device_memory(&device), None);
    }
}
