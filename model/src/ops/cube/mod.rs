//! Ember's fused ops as CubeCL kernels (`#[cube]`): one source for every runtime of Burn's
//! `CubeBackend<R, ..>` (CUDA, HIP/ROCm, wgpu over Vulkan/Metal/DX12), dispatched like the Flex
//! kernels. Each op folder (`norm/`, `activation/`, `loss/`, `attention/`) has a `cube.rs` with
//! its kernels and the `CubeBackend` implementation of its trait; [`fusion`] lifts every one of
//! them onto Burn's fusion backend (`burn::backend::Wgpu`, `burn::backend::Cuda`), and the
//! composed tensor-op defaults stay beside them as the reference the tests compare with.
//!
//! Conventions of the kernels here: inputs are made contiguous first and read as flat arrays;
//! statistics and every accumulation are f32 whatever the tensors' dtype (f32, f16, bf16 on
//! CUDA: the element types are chosen at launch, `#[define]`); reductions over a row use a
//! cube-wide tree in shared memory (no plane/subgroup operations: CubeCL turns those off on
//! CPU adapters such as lavapipe); no `-inf` literal (WGSL rejects it), `-3.0e38` instead.

pub mod fusion;

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

/// Threads of a cube that reduces a row (a power of two, as [`block_sum`] requires).
pub const ROW_THREADS: u32 = 128;

/// Threads of a cube of an element-wise kernel.
pub const ELEMENTWISE_THREADS: u32 = 256;

/// The most cubes along one axis of a launch grid (WebGPU's and CUDA's y/z limit).
const MAX_GRID_AXIS: u32 = 65_535;

/// A grid of `cubes` cubes (over x, and y when x is full): kernels recover their cube number
/// with [`cube_index`] and must return when it is `cubes` or more.
pub fn grid(cubes: usize) -> CubeCount {
    let cubes = cubes.max(1) as u32;
    if cubes <= MAX_GRID_AXIS {
        CubeCount::Static(cubes, 1, 1)
    } else {
        CubeCount::Static(MAX_GRID_AXIS, cubes.div_ceil(MAX_GRID_AXIS), 1)
    }
}

/// A grid of element-wise cubes of [`ELEMENTWISE_THREADS`] for `n` elements.
pub fn elementwise_grid(n: usize) -> CubeCount {
    grid(n.div_ceil(ELEMENTWISE_THREADS as usize))
}

/// `t` with a contiguous row-major layout (a copy only when it is not already).
pub fn contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    into_contiguous(t)
}

/// A new contiguous tensor of `shape` and `dtype` on `like`'s device (uninitialized).
pub fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape, dtype: DType) -> CubeTensor<R> {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// `shape` with its last dimension replaced by 1: the shape of per-row statistics.
pub fn row_shape(shape: &Shape) -> Shape {
    let mut dims = shape.to_vec();
    if let Some(last) = dims.last_mut() {
        *last = 1;
    }
    Shape::from(dims)
}

/// `(rows, cols)` of `t` seen as a matrix over its last dimension.
pub fn rows_cols<R: CubeRuntime>(t: &CubeTensor<R>) -> (usize, usize) {
    let dims = t.shape().to_vec();
    let cols = dims.last().copied().unwrap_or(1);
    (dims.iter().product::<usize>() / cols.max(1), cols)
}

/// The two outputs of a custom operation.
pub fn two<T>(v: Vec<T>) -> [T; 2] {
    v.try_into().unwrap_or_else(|_| unreachable!("declared two outputs"))
}

/// The three outputs of a custom operation.
pub fn three<T>(v: Vec<T>) -> [T; 3] {
    v.try_into().unwrap_or_else(|_| unreachable!("declared three outputs"))
}

/// The number of this cube in a [`grid`].
#[cube]
pub fn cube_index() -> usize {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize
}

/// The element this unit handles in an element-wise [`grid`].
#[cube]
pub fn element_index() -> usize {
    cube_index() * CUBE_DIM as usize + UNIT_POS as usize
}

/// The sum of `value` over the cube's units, returned to every unit (a tree in `shared`, one
/// f32 per unit; `CUBE_DIM` a power of two). Every unit of the cube must call it.
#[cube]
pub fn block_sum(value: f32, shared: &mut SharedMemory<f32>) -> f32 {
    let unit = UNIT_POS as usize;
    shared[unit] = value;
    sync_cube();
    let mut stride = (CUBE_DIM / 2) as usize;
    while stride > 0 {
        if unit < stride {
            shared[unit] = shared[unit] + shared[unit + stride];
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

/// The maximum of `value` over the cube's units, as [`block_sum`].
#[cube]
pub fn block_max(value: f32, shared: &mut SharedMemory<f32>) -> f32 {
    let unit = UNIT_POS as usize;
    shared[unit] = value;
    sync_cube();
    let mut stride = (CUBE_DIM / 2) as usize;
    while stride > 0 {
        if unit < stride {
            shared[unit] = f32::max(shared[unit], shared[unit + stride]);
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

#[cfg(all(test, feature = "wgpu"))]
pub(crate) mod tests;
