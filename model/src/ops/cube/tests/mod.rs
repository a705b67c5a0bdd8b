//! The CubeCL kernels against their composed references, on Burn's wgpu backend (over Mesa's
//! lavapipe in CI): values and every gradient, on odd shapes. Built with the `wgpu` feature;
//! without a Vulkan adapter the tests pass after printing `skipping: …` (under `CI=true` they
//! fail instead).

mod activation;
mod attention;
mod half;
mod loss;
mod norm;

use std::sync::OnceLock;

use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, Wgpu};
use burn::tensor::{Tensor, TensorData};

use crate::ops::testing::Ad;

/// Burn's autodiff wgpu backend, which the tests differentiate on.
pub type AdWgpu = Autodiff<Wgpu>;

/// The default wgpu device, or `None` (after printing why) when this machine has no adapter;
/// under `CI=true` a missing adapter fails the test instead.
pub fn device(test: &str) -> Option<WgpuDevice> {
    static FOUND: OnceLock<Result<(), String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let probe = std::panic::catch_unwind(|| {
            Tensor::<Wgpu, 1>::zeros([1], &WgpuDevice::default()).into_data();
        });
        probe.map_err(|_| {
            "no wgpu adapter (install a Vulkan driver, e.g. `apt-get install mesa-vulkan-drivers \
             libvulkan1`)"
                .to_string()
        })
    });
    match found {
        Ok(()) => Some(WgpuDevice::default()),
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => panic!("{test}: CI=true and {why}"),
        Err(why) => {
            eprintln!("skipping {test}: {why}");
            None
        }
    }
}

/// `t` (drawn on the CPU by [`crate::ops::testing::randn`]) copied to the wgpu device, as a
/// leaf that requires a gradient.
pub fn leaf<const D: usize>(t: &Tensor<Ad, D>, device: &WgpuDevice) -> Tensor<AdWgpu, D> {
    Tensor::<AdWgpu, D>::from_data(t.to_data(), device).require_grad()
}

/// The values of `t` as f32 on the host.
pub fn host<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

/// Asserts `|got − want| ≤ rel · max(|want|, floor)` element-wise, naming `what` and the worst
/// element (as [`crate::ops::testing::assert_close`], on host values).
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32, floor: f32) {
    let t = |v: &[f32]| {
        Tensor::<burn::backend::Flex, 1>::from_data(
            TensorData::new(v.to_vec(), [v.len()]),
            &Default::default(),
        )
    };
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    crate::ops::testing::assert_close(what, t(got), t(want), rel, floor);
}
