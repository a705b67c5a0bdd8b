//! Device memory on CUDA: what Burn's CUDA backend holds in its CubeCL memory pool — the
//! counterparts of PyTorch's `torch.cuda.memory_allocated()` (in use) and
//! `torch.cuda.memory_reserved()` (reserved from the driver).

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_backend_has_no_device_pool() {
        let device: burn::backend::flex::FlexDevice = Default::default();
        assert_eq!(device_memory(&device), None);
    }
}
