//! LayerNorm and RMSNorm as CubeCL kernels: one cube per row for the forward and for `dx`
//! (the row's statistics are reduced in shared memory), and a column pass for `dγ`/`dβ` that
//! sums blocks of rows into `[blocks, C]` f32 partials, then over the blocks. Formulas in the
//! parent module's docs; the composed defaults are the reference the tests compare with.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::FusedNorm;
use crate::ops::cube::fusion::custom_op;
use crate::ops::cube::{
    block_sum, contiguous, cube_index, empty, grid, row_shape, rows_cols, three, two, ROW_THREADS,
};

/// Rows summed by one cube of the `dγ`/`dβ` pass.
const ROWS_PER_BLOCK: usize = 64;

/// Forward of one row per cube: `y = (x − μ)·rstd·γ (+ β)`, `μ = 0` for RMSNorm.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn norm_forward_kernel<F: Float, G: Float>(
    x: &Array<F>,
    gamma: &Array<G>,
    beta: &Array<G>,
    y: &mut Array<F>,
    mean_out: &mut Array<f32>,
    rstd_out: &mut Array<f32>,
    rows: usize,
    cols: usize,
    eps: f32,
    #[comptime] centered: bool,
    #[comptime] has_beta: bool,
    #[define(F, G)] _dtypes: [StorageType; 2],
) {
    let row = cube_index();
    if row >= rows {
        terminate!();
    }
    let mut shared = SharedMemory::<f32>::new(ROW_THREADS as usize);
    let base = row * cols;
    let step = CUBE_DIM as usize;
    let n = f32::cast_from(cols);

    let mut mean = f32::new(0.0);
    if centered {
        let mut sum = f32::new(0.0);
        let mut c = UNIT_POS as usize;
        while c < cols {
            sum += f32::cast_from(x[base + c]);
            c += step;
        }
        mean = block_sum(sum, &mut shared) / n;
    }
    let mut squares = f32::new(0.0);
    let mut c = UNIT_POS as usize;
    while c < cols {
        let d = f32::cast_from(x[base + c]) - mean;
        squares += d * d;
        c += step;
    }
    let rstd = f32::new(1.0) / f32::sqrt(block_sum(squares, &mut shared) / n + eps);

    let mut c = UNIT_POS as usize;
    while c < cols {
        let mut v = (f32::cast_from(x[base + c]) - mean) * rstd * f32::cast_from(gamma[c]);
        if has_beta {
            v += f32::cast_from(beta[c]);
        }
        y[base + c] = F::cast_from(v);
        c += step;
    }
    if UNIT_POS == 0 {
        mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

/// `dx` of one row per cube: `rstd·(dŷ − mean(dŷ) − x̂·mean(dŷ·x̂))` with `dŷ = dy·γ`
/// (RMSNorm: no `mean(dŷ)` term and `μ = 0`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn norm_dx_kernel<F: Float, G: Float>(
    dy: &Array<F>,
    x: &Array<F>,
    gamma: &Array<G>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    dx: &mut Array<F>,
    rows: usize,
    cols: usize,
    #[comptime] centered: bool,
    #[define(F, G)] _dtypes: [StorageType; 2],
) {
    let row = cube_index();
    if row >= rows {
        terminate!();
    }
    let mut shared = SharedMemory::<f32>::new(ROW_THREADS as usize);
    let base = row * cols;
    let step = CUBE_DIM as usize;
    let n = f32::cast_from(cols);
    let mu = mean[row];
    let r = rstd[row];

    let mut sum_dxhat = f32::new(0.0);
    let mut sum_dxhat_xhat = f32::new(0.0);
    let mut c = UNIT_POS as usize;
    while c < cols {
        let dxhat = f32::cast_from(dy[base + c]) * f32::cast_from(gamma[c]);
        let xhat = (f32::cast_from(x[base + c]) - mu) * r;
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * xhat;
        c += step;
    }
    let mut mean_dxhat = f32::new(0.0);
    if centered {
        mean_dxhat = block_sum(sum_dxhat, &mut shared) / n;
    }
    let mean_dxhat_xhat = block_sum(sum_dxhat_xhat, &mut shared) / n;

    let mut c = UNIT_POS as usize;
    while c < cols {
        let dxhat = f32::cast_from(dy[base + c]) * f32::cast_from(gamma[c]);
        let xhat = (f32::cast_from(x[base + c]) - mu) * r;
        dx[base + c] = F::cast_from(r * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat));
        c += step;
    }
}

/// Per block of [`ROWS_PER_BLOCK`] rows and per column `c` (one unit each):
/// `dγ_part[block, c] = Σ dy·x̂` and `dβ_part[block, c] = Σ dy` over the block's rows.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn norm_dgamma_kernel<F: Float>(
    dy: &Array<F>,
    x: &Array<F>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    dgamma_part: &mut Array<f32>,
    dbeta_part: &mut Array<f32>,
    rows: usize,
    cols: usize,
    col_cubes: usize,
    #[comptime] rows_per_block: usize,
    #[define(F)] _dtype: StorageType,
) {
    let cube = cube_index();
    let block = cube / col_cubes;
    let c = (cube % col_cubes) * CUBE_DIM as usize + UNIT_POS as usize;
    let first = block * rows_per_block;
    if c >= cols || first >= rows {
        terminate!();
    }
    let mut last = first + rows_per_block;
    if last > rows {
        last = rows;
    }
    let mut dg = f32::new(0.0);
    let mut db = f32::new(0.0);
    for row in first..last {
        let g = f32::cast_from(dy[row * cols + c]);
        dg += g * (f32::cast_from(x[row * cols + c]) - mean[row]) * rstd[row];
        db += g;
    }
    dgamma_part[block * cols + c] = dg;
    dbeta_part[block * cols + c] = db;
}

/// The kernels' forward: `(y, mean, rstd)`; `mean` is zeros for RMSNorm (`centered` false).
fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    beta: Option<CubeTensor<R>>,
    eps: f64,
    centered: bool,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let (x, gamma) = (contiguous(x), contiguous(gamma));
    let beta = beta.map(contiguous);
    let (rows, cols) = rows_cols(&x);
    let y = empty(&x, x.shape(), x.dtype);
    let mean = empty(&x, row_shape(&x.shape()), DType::F32);
    let rstd = empty(&x, row_shape(&x.shape()), DType::F32);
    let dtypes = [x.dtype.into(), gamma.dtype.into()];
    let has_beta = beta.is_some();
    let beta = beta.unwrap_or_else(|| gamma.clone());
    norm_forward_kernel::launch::<R>(
        &x.client,
        grid(rows),
        CubeDim::new_1d(ROW_THREADS),
        x.clone().into_array_arg(),
        gamma.into_array_arg(),
        beta.into_array_arg(),
        y.clone().into_array_arg(),
        mean.clone().into_array_arg(),
        rstd.clone().into_array_arg(),
        rows,
        cols,
        eps as f32,
        centered,
        has_beta,
        dtypes,
    );
    (y, mean, rstd)
}

/// The kernels' backward: `(dx, dγ, dβ)` (`dβ` is `Σ dy`, unused by RMSNorm).
fn backward<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    dy: CubeTensor<R>,
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    mean: CubeTensor<R>,
    rstd: CubeTensor<R>,
    centered: bool,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    use burn::tensor::ops::FloatTensorOps;
    type Cb<R, F, I, BT> = CubeBackend<R, F, I, BT>;
    let (dy, x, gamma) = (contiguous(dy), contiguous(x), contiguous(gamma));
    let (mean, rstd) = (contiguous(mean), contiguous(rstd));
    let (rows, cols) = rows_cols(&x);
    let client = x.client.clone();

    let dx = empty(&x, x.shape(), x.dtype);
    norm_dx_kernel::launch::<R>(
        &client,
        grid(rows),
        CubeDim::new_1d(ROW_THREADS),
        dy.clone().into_array_arg(),
        x.clone().into_array_arg(),
        gamma.clone().into_array_arg(),
        mean.clone().into_array_arg(),
        rstd.clone().into_array_arg(),
        dx.clone().into_array_arg(),
        rows,
        cols,
        centered,
        [x.dtype.into(), gamma.dtype.into()],
    );

    let blocks = rows.div_ceil(ROWS_PER_BLOCK).max(1);
    let col_cubes = cols.div_ceil(ROW_THREADS as usize).max(1);
    let part_shape = Shape::from(vec![blocks, cols]);
    let dgamma_part = empty(&x, part_shape.clone(), DType::F32);
    let dbeta_part = empty(&x, part_shape, DType::F32);
    norm_dgamma_kernel::launch::<R>(
        &client,
        grid(blocks * col_cubes),
        CubeDim::new_1d(ROW_THREADS),
        dy.into_array_arg(),
        x.clone().into_array_arg(),
        mean.into_array_arg(),
        rstd.into_array_arg(),
        dgamma_part.clone().into_array_arg(),
        dbeta_part.clone().into_array_arg(),
        rows,
        cols,
        col_cubes,
        ROWS_PER_BLOCK,
        x.dtype.into(),
    );
    let total = |part: CubeTensor<R>| {
        let sum = Cb::<R, F, I, BT>::float_sum_dim(part, 0);
        let sum = Cb::<R, F, I, BT>::float_reshape(sum, Shape::from(vec![cols]));
        Cb::<R, F, I, BT>::float_cast(sum, gamma.dtype.into())
    };
    (dx, total(dgamma_part), total(dbeta_part))
}

/// The kernels above for every CubeCL runtime (CUDA, HIP, wgpu).
impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> FusedNorm for CubeBackend<R, F, I, BT> {
    fn fused_layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        forward(x, gamma, beta, eps, true)
    }

    fn fused_layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        backward::<R, F, I, BT>(dy, x, gamma, mean, rstd, true)
    }

    fn fused_rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (y, _mean, rstd) = forward(x, gamma, None, eps, false);
        (y, rstd)
    }

    fn fused_rms_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let mean = burn_cubecl::ops::numeric::zeros::<R>(rstd.device.clone(), rstd.shape(), DType::F32);
        let (dx, dgamma, _) = backward::<R, F, I, BT>(dy, x, gamma, mean, rstd, false);
        (dx, dgamma)
    }
}

/// Burn's fusion backend over a backend with these kernels (`burn::backend::Wgpu`, `Cuda`): each
/// call is one custom operation on the fusion stream.
impl<B: FusionBackend + FusedNorm> FusedNorm for Fusion<B> {
    fn fused_layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let stats = row_shape(&x.shape);
        let outputs = vec![(x.shape.clone(), x.dtype), (stats.clone(), DType::F32), (stats, DType::F32)];
        let has_beta = beta.is_some();
        let inputs = [Some(x), Some(gamma), beta].into_iter().flatten().collect();
        let [y, mean, rstd] = three(custom_op::<B>("layer_norm_forward", inputs, outputs, move |i| {
            let beta = has_beta.then(|| i.float(2));
            let (y, mean, rstd) = B::fused_layer_norm_forward(i.float(0), i.float(1), beta, eps);
            vec![y, mean, rstd]
        }));
        (y, mean, rstd)
    }

    fn fused_layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let outputs = vec![
            (x.shape.clone(), x.dtype),
            (gamma.shape.clone(), gamma.dtype),
            (gamma.shape.clone(), gamma.dtype),
        ];
        let inputs = vec![dy, x, gamma, mean, rstd];
        let [dx, dgamma, dbeta] = three(custom_op::<B>("layer_norm_backward", inputs, outputs, |i| {
            let (dx, dg, db) =
                B::fused_layer_norm_backward(i.float(0), i.float(1), i.float(2), i.float(3), i.float(4));
            vec![dx, dg, db]
        }));
        (dx, dgamma, dbeta)
    }

    fn fused_rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let outputs = vec![(x.shape.clone(), x.dtype), (row_shape(&x.shape), DType::F32)];
        let [y, rstd] = two(custom_op::<B>("rms_norm_forward", vec![x, gamma], outputs, move |i| {
            let (y, rstd) = B::fused_rms_norm_forward(i.float(0), i.float(1), eps);
            vec![y, rstd]
        }));
        (y, rstd)
    }

    fn fused_rms_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let outputs = vec![(x.shape.clone(), x.dtype), (gamma.shape.clone(), gamma.dtype)];
        let [dx, dgamma] = two(custom_op::<B>("rms_norm_backward", vec![dy, x, gamma, rstd], outputs, |i| {
            let (dx, dg) = B::fused_rms_norm_backward(i.float(0), i.float(1), i.float(2), i.float(3));
            vec![dx, dg]
        }));
        (dx, dgamma)
    }
}
