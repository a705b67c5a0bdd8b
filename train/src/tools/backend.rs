//! Backend selection: `flex` (CPU) always; `cuda` when built with the `cuda` feature and a
//! driver is present; `wgpu` when built with the `wgpu` feature and a Vulkan (Metal, DX12)
//! adapter is present. Burn panics when a driver or device is missing; Ember turns that into an
//! error.

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::AutodiffBackend;

use crate::config::{BackendKind, PrecisionKind};
use crate::error::TrainError;
use crate::step::worker::on_pool_worker;

/// Work to run on whichever backend the configuration chose.
pub trait BackendTask {
    /// What the task returns.
    type Output;
    /// Runs the task on autodiff backend `B` (use `B::InnerBackend` for inference), with one
    /// device per requested index (the first one for single-device work).
    fn run<B: AutodiffBackend>(self, devices: Vec<B::Device>) -> Result<Self::Output, TrainError>;

    /// True unless the task may exchange with other ranks (a data-parallel run): only a
    /// single-rank task runs on a worker of rayon's pool ([`on_pool_worker`]).
    fn single_rank(&self) -> bool {
        true
    }
}

/// Runs `task` on `kind` with devices `indices` (CUDA device indices, wgpu adapter indices as
/// [`crate::observe::adapters::adapters`] lists them; on the CPU, one burn-flex device per
/// index). On wgpu the task runs on the calling thread, which must be the one thread that uses
/// the device for the whole task (Burn 0.21 keeps a memory pool per thread). On the CPU, a task with one device that is [`BackendTask::single_rank`]
/// runs on a worker thread of rayon's pool ([`on_pool_worker`]); the caller waits.
///
/// Errors: `cuda` or `wgpu` in a build without its feature, no usable CUDA device/driver, no
/// wgpu adapter `index`.
pub fn run_on<T: BackendTask + Send>(
    kind: BackendKind,
    indices: &[usize],
    task: T,
) -> Result<T::Output, TrainError>
where
    T::Output: Send,
{
    match kind {
        BackendKind::Flex => {
            let devices = indices.iter().map(|_| Default::default()).collect();
            match indices.len() == 1 && task.single_rank() {
                true => on_pool_worker(move || task.run::<Autodiff<Flex>>(devices)),
                false => task.run::<Autodiff<Flex>>(devices),
            }
        }
        BackendKind::Cuda => run_cuda(indices, task),
        BackendKind::Wgpu => run_wgpu(indices, task),
    }
}

/// Refuses a precision the backend cannot compute in: `bf16-mixed` on wgpu (WGSL has f16 but
/// no bfloat16), rather than falling back silently.
///
/// Errors: [`TrainError::Unsupported`] naming both and what to use instead.
pub fn check_precision(kind: BackendKind, precision: PrecisionKind) -> Result<(), TrainError> {
    match (kind, precision) {
        (BackendKind::Wgpu, PrecisionKind::Bf16Mixed) => Err(TrainError::Unsupported(
            "precision bf16-mixed on backend wgpu: WGSL has f16 but no bfloat16; use fp16-mixed (with loss scaling) or fp32 on wgpu, or bf16-mixed on flex or cuda".into(),
        )),
        _ => Ok(()),
    }
}

#[cfg(feature = "wgpu")]
fn run_wgpu<T: BackendTask>(indices: &[usize], task: T) -> Result<T::Output, TrainError> {
    use burn::backend::Wgpu;
    let mut devices = Vec::new();
    for &index in indices {
        // Which keys asked for this adapter: `device`, or `device` and `devices` together.
        let asked = match indices {
            [one] => format!("device = {one}"),
            many => format!("{} replicas on wgpu adapters {:?} (device, devices)", many.len(), many),
        };
        let (device, adapter) = crate::observe::adapters::wgpu_device(index)
            .map_err(|e| TrainError::Backend(format!("{asked}: {e}")))?;
        probe::<Wgpu>(&device).map_err(|message| {
            TrainError::Backend(format!(
                "wgpu adapter {index} ({adapter}) is not usable: {message}. Check its driver, or use backend = \"flex\""
            ))
        })?;
        devices.push(device);
    }
    task.run::<Autodiff<Wgpu>>(devices)
}

#[cfg(not(feature = "wgpu"))]
fn run_wgpu<T: BackendTask>(_indices: &[usize], _task: T) -> Result<T::Output, TrainError> {
    Err(TrainError::Backend(
        "this ember was built without wgpu support; rebuild with `cargo build --release --features ember/wgpu` (and install a Vulkan driver) or use backend = \"flex\" (`--set backend='\"flex\"'`; `ember bench` and `ember verify`: `--backend flex`)".into(),
    ))
}

#[cfg(feature = "cuda")]
fn run_cuda<T: BackendTask>(indices: &[usize], task: T) -> Result<T::Output, TrainError> {
    use burn::backend::cuda::CudaDevice;
    use burn::backend::Cuda;
    let mut devices = Vec::new();
    for &index in indices {
        let device = CudaDevice::new(index);
        probe::<Cuda>(&device).map_err(|message| {
            TrainError::Backend(format!(
                "CUDA device {index} is not usable: {message}. Check the NVIDIA driver (libcuda), NVRTC and the CUDA headers (CUDA_PATH), or use backend = \"flex\""
            ))
        })?;
        devices.push(device);
    }
    task.run::<Autodiff<Cuda>>(devices)
}

#[cfg(not(feature = "cuda"))]
fn run_cuda<T: BackendTask>(_indices: &[usize], _task: T) -> Result<T::Output, TrainError> {
    Err(TrainError::Backend(
        "this ember was built without CUDA support; rebuild with `CUDARC_CUDA_VERSION=13000 cargo build --release --features ember/cuda` or use backend = \"flex\" (`--set backend='\"flex\"'`; `ember bench` and `ember verify`: `--backend flex`)".into(),
    ))
}

/// Allocates and reads back one tensor, turning Burn's panic (no driver, no device) into an
/// error message.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn probe<B: burn::tensor::backend::Backend>(device: &B::Device) -> Result<(), String> {
    catch_panic(|| {
        burn::tensor::Tensor::<B, 1>::zeros([1], device).into_data();
    })
}

/// Runs `f`, returning its panic message as an error. The panic hook is silenced meanwhile
/// so no backtrace reaches the user.
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
fn catch_panic<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    use std::panic::{catch_unwind, set_hook, take_hook, AssertUnwindSafe};
    let hook = take_hook();
    set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(f));
    set_hook(hook);
    result.map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the backend panicked".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Answer;
    impl BackendTask for Answer {
        type Output = u32;
        fn run<B: AutodiffBackend>(self, _devices: Vec<B::Device>) -> Result<u32, TrainError> {
            Ok(42)
        }
    }

    #[test]
    fn flex_runs_the_task() {
        assert_eq!(run_on(BackendKind::Flex, &[0], Answer).unwrap(), 42);
    }

    #[test]
    fn a_panicking_backend_call_becomes_an_error() {
        let err = catch_panic(|| -> u32 { panic!("Unable to dynamically load the \"cuda\" shared library") });
        assert_eq!(err.unwrap_err(), "Unable to dynamically load the \"cuda\" shared library");
        assert_eq!(catch_panic(|| 7), Ok(7));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        let err = run_on(BackendKind::Cuda, &[0], Answer).unwrap_err().to_string();
        assert!(err.contains("built without CUDA"), "{err}");
    }

    #[cfg(not(feature = "wgpu"))]
    #[test]
    fn wgpu_without_the_feature_is_a_clear_error() {
        let err = run_on(BackendKind::Wgpu, &[0], Answer).unwrap_err().to_string();
        assert!(err.contains("built without wgpu") && err.contains("--features ember/wgpu"), "{err}");
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn a_missing_wgpu_adapter_is_an_error_naming_the_ones_there_are() {
        let err = run_on(BackendKind::Wgpu, &[7], Answer).unwrap_err().to_string();
        match crate::observe::adapters::adapters().len() {
            0 => assert!(
                err.contains("no Vulkan adapter found") && err.contains("mesa-vulkan-drivers"),
                "{err}"
            ),
            _ => assert!(
                err.starts_with("backend: device = 7: there is no wgpu adapter 7; this machine has ")
                    && err.contains("(adapter 0 = "),
                "{err}"
            ),
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_without_a_driver_is_an_error_not_a_panic() {
        // On a machine without a GPU this is an error; on a GPU machine it runs.
        match run_on(BackendKind::Cuda, &[0], Answer) {
            Ok(v) => assert_eq!(v, 42),
            Err(e) => assert!(e.to_string().contains("CUDA device 0 is not usable"), "{e}"),
        }
    }
}
