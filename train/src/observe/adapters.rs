//! The GPU adapters Burn's wgpu backend can run on (Vulkan on Linux and Windows, Metal on
//! macOS): listed in the order the graphics API enumerates them, so that `device = N` names
//! the N-th, and described in words — name, graphics API, kind, driver — so that a software
//! rasterizer (Mesa's lavapipe, "llvmpipe") is never taken for a GPU.
//!
//! Without the `wgpu` cargo feature the list is empty and [`wgpu_device`] says how to build it.

use std::fmt;

/// What kind of adapter it is (wgpu's `DeviceType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterKind {
    /// A discrete GPU.
    Discrete,
    /// A GPU integrated with the CPU.
    Integrated,
    /// A virtual GPU (a VM's or a container's).
    Virtual,
    /// A software implementation running on the CPU (Mesa's lavapipe, SwiftShader, WARP).
    Software,
    /// The driver does not say.
    Other,
}

impl AdapterKind {
    /// In one or two words: `discrete GPU`, `integrated GPU`, `virtual GPU`, `software`,
    /// `unknown kind`.
    pub fn short(self) -> &'static str {
        match self {
            AdapterKind::Software => "software",
            other => other.words(),
        }
    }

    /// In words: `discrete GPU`, `integrated GPU`, `virtual GPU`, `software (runs on the CPU)`,
    /// `unknown kind`.
    pub fn words(self) -> &'static str {
        match self {
            AdapterKind::Discrete => "discrete GPU",
            AdapterKind::Integrated => "integrated GPU",
            AdapterKind::Virtual => "virtual GPU",
            AdapterKind::Software => "software, runs on the CPU",
            AdapterKind::Other => "unknown kind",
        }
    }
}

/// One adapter: its position in the enumeration, name, graphics API, kind and driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adapter {
    /// Its index in the graphics API's enumeration (`device = index`).
    pub index: usize,
    /// The driver's name for it, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// The graphics API, e.g. `Vulkan`, `Metal`, `Dx12`.
    pub api: String,
    /// Discrete, integrated, virtual or software.
    pub kind: AdapterKind,
    /// The driver and its version when the driver says, e.g. `llvmpipe, Mesa 22.3.6 (LLVM 15.0.6)`.
    pub driver: String,
    /// The most bytes one buffer binding may hold (`max_storage_buffer_binding_size`: 128 MiB
    /// on lavapipe); a bigger tensor cannot be bound ([`super::binding`]).
    pub max_binding_bytes: u64,
}

impl fmt::Display for Adapter {
    /// `llvmpipe (LLVM 15.0.6, 256 bits), Vulkan, software, runs on the CPU (llvmpipe, Mesa 22.3.6)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, {}, {}", self.name, self.api, self.kind.words())?;
        match self.driver.is_empty() {
            true => Ok(()),
            false => write!(f, " ({})", self.driver),
        }
    }
}

/// What to install when no adapter is found (one line).
pub const INSTALL_HINT: &str = "install a Vulkan driver: your GPU vendor's, or Mesa's software one (lavapipe; Debian/Ubuntu: `apt-get install mesa-vulkan-drivers libvulkan1`)";

/// The adapters of the graphics API Burn's wgpu backend uses on this platform, in enumeration
/// order; empty without a driver (or without the `wgpu` feature).
pub fn adapters() -> Vec<Adapter> {
    #[cfg(feature = "wgpu")]
    {
        enabled::adapters()
    }
    #[cfg(not(feature = "wgpu"))]
    {
        Vec::new()
    }
}

/// Why `backend = "wgpu"` cannot run here, in words (a build without the `wgpu` feature, no
/// adapter and what to install); `None` when it can.
pub fn unavailable() -> Option<String> {
    if !cfg!(feature = "wgpu") {
        return Some("this build has no wgpu backend (build with `--features ember/wgpu`; the tests with `--features wgpu`)".into());
    }
    adapters().is_empty().then(|| format!("no Vulkan adapter: {INSTALL_HINT}"))
}

/// Adapter `index` in words for logs, `ember bench` and the dashboard:
/// `wgpu:0 (llvmpipe (LLVM 15.0.6, 256 bits), Vulkan, software, runs on the CPU (…))`, or
/// `wgpu:N (no such adapter)`.
pub fn describe(index: usize) -> String {
    match adapters().into_iter().nth(index) {
        Some(adapter) => format!("wgpu:{index} ({adapter})"),
        None => format!("wgpu:{index} (no such adapter)"),
    }
}

/// Adapter `index` in a few words, its kind first, for the dashboard's one-line header:
/// `wgpu:0 software, llvmpipe (LLVM 15.0.6, 256 bits)`, `wgpu:1 discrete GPU, NVIDIA …`.
pub fn short(index: usize) -> String {
    match adapters().into_iter().nth(index) {
        Some(adapter) => format!("wgpu:{index} {}, {}", adapter.kind.short(), adapter.name),
        None => format!("wgpu:{index} (no such adapter)"),
    }
}

#[cfg(feature = "wgpu")]
pub use enabled::wgpu_device;

#[cfg(feature = "wgpu")]
mod enabled {
    use burn::backend::wgpu::graphics::{AutoGraphicsApi, GraphicsApi};
    use burn::backend::wgpu::WgpuDevice;

    use super::{Adapter, AdapterKind, INSTALL_HINT};

    fn kind(device_type: wgpu::DeviceType) -> AdapterKind {
        match device_type {
            wgpu::DeviceType::DiscreteGpu => AdapterKind::Discrete,
            wgpu::DeviceType::IntegratedGpu => AdapterKind::Integrated,
            wgpu::DeviceType::VirtualGpu => AdapterKind::Virtual,
            wgpu::DeviceType::Cpu => AdapterKind::Software,
            wgpu::DeviceType::Other => AdapterKind::Other,
        }
    }

    /// Runs a future that native wgpu resolves at once (adapter enumeration) to completion.
    fn ready<F: std::future::Future>(future: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        let mut future = std::pin::pin!(future);
        let mut context = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(value) = future.as_mut().poll(&mut context) {
                return value;
            }
            std::thread::yield_now();
        }
    }

    /// Enumerated once per process (each Vulkan instance costs a driver load and, on Mesa
    /// without a display, two `XDG_RUNTIME_DIR` lines on stderr); the list does not change
    /// while the process runs.
    pub(super) fn adapters() -> Vec<Adapter> {
        static LISTED: std::sync::OnceLock<Vec<Adapter>> = std::sync::OnceLock::new();
        LISTED.get_or_init(enumerate).clone()
    }

    fn enumerate() -> Vec<Adapter> {
        let backend = AutoGraphicsApi::backend();
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: backend.into(),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        ready(instance.enumerate_adapters(backend.into()))
            .into_iter()
            .enumerate()
            .map(|(index, adapter)| {
                let info = adapter.get_info();
                let driver = match (info.driver.is_empty(), info.driver_info.is_empty()) {
                    (false, false) => format!("{}, {}", info.driver, info.driver_info),
                    (false, true) => info.driver.clone(),
                    (true, _) => info.driver_info.clone(),
                };
                Adapter {
                    index,
                    name: info.name,
                    api: format!("{:?}", info.backend),
                    kind: kind(info.device_type),
                    driver,
                    max_binding_bytes: adapter.limits().max_storage_buffer_binding_size,
                }
            })
            .collect()
    }

    /// The Burn device for adapter `index` of [`adapters`], and that adapter. CubeCL selects an
    /// adapter by kind and position among those of its kind (`DiscreteGpu(k)`, …; `Cpu` is the
    /// first software adapter), so the enumeration index is translated into that.
    ///
    /// Errors (one line each): no adapter at all (what to install), no adapter `index` (the
    /// ones there are), an adapter CubeCL cannot select (a second software adapter, an unknown
    /// kind).
    pub fn wgpu_device(index: usize) -> Result<(WgpuDevice, Adapter), String> {
        let all = adapters();
        if all.is_empty() {
            return Err(format!(
                "no {:?} adapter found for backend = \"wgpu\": {INSTALL_HINT}",
                AutoGraphicsApi::backend()
            ));
        }
        let Some(adapter) = all.get(index).cloned() else {
            let listed: Vec<String> = all.iter().map(|a| format!("adapter {} = {a}", a.index)).collect();
            return Err(format!(
                "there is no wgpu adapter {index}; this machine has {} ({})",
                if all.len() == 1 { "one".to_string() } else { all.len().to_string() },
                listed.join("; ")
            ));
        };
        let same_kind_before = all[..index].iter().filter(|a| a.kind == adapter.kind).count();
        let device = match adapter.kind {
            AdapterKind::Discrete => WgpuDevice::DiscreteGpu(same_kind_before),
            AdapterKind::Integrated => WgpuDevice::IntegratedGpu(same_kind_before),
            AdapterKind::Virtual => WgpuDevice::VirtualGpu(same_kind_before),
            AdapterKind::Software if same_kind_before == 0 => WgpuDevice::Cpu,
            AdapterKind::Software => {
                return Err(format!(
                    "wgpu adapter {index} ({adapter}) is a second software adapter; Burn's wgpu backend selects only the first"
                ))
            }
            AdapterKind::Other => {
                return Err(format!(
                    "wgpu adapter {index} ({adapter}) is of a kind the driver does not name; Burn's wgpu backend cannot select it by index"
                ))
            }
        };
        Ok((device, adapter))
    }
}
