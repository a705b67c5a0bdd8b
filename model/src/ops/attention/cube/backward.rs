//! The backward kernels: `Δ = rowsum(dO∘O)`, then `dQ` per query row and `dK`, `dV` per key row
//! (see the parent module).

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeRuntime, IntElement};

use super::{
    block_of, key_tiles, load_row, load_tile, position, positions_or_dummy, visible, zero_row, Dims, Plan,
    QUERY_BLOCK,
};
use crate::ops::cube::{contiguous, cube_index, empty, grid};

/// `Δ[b, h, i] = Σ_d dO·O` of one row per unit.
#[cube(launch)]
fn attention_delta_kernel<F: Float>(
    out: &Array<F>,
    dout: &Array<F>,
    delta: &mut Array<f32>,
    dims: Dims,
    #[comptime] head_dim: usize,
    #[comptime] chunk: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = cube_index() * CUBE_DIM as usize + UNIT_POS as usize; // over [B, T, H]
    if row >= dims.batch * dims.seq * dims.heads {
        terminate!();
    }
    let mut sum = f32::new(0.0);
    for c in 0..comptime!(head_dim / chunk) {
        #[unroll]
        for u in 0..chunk {
            let d = c * chunk + u;
            sum += f32::cast_from(out[row * head_dim + d]) * f32::cast_from(dout[row * head_dim + d]);
        }
    }
    let h = row % dims.heads;
    let i = (row / dims.heads) % dims.seq;
    let b = row / (dims.heads * dims.seq);
    delta[(b * dims.heads + h) * dims.seq + i] = sum;
}

/// `dQ_i = scale · Σ_j P_ij (dP_ij − Δ_i) K_j` of one query row per unit.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn attention_dq_kernel<F: Float, I: Int>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    dout: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    positions: &Array<I>,
    dq: &mut Array<F>,
    dims: Dims,
    #[comptime] head_dim: usize,
    #[comptime] chunk: usize,
    #[comptime] tile: usize,
    #[comptime] packed: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (b, h, block, inside) = block_of(dims.batch, dims.heads, dims.seq);
    if !inside {
        terminate!();
    }
    let kvh = h / (dims.heads / dims.kv_heads);
    let i = block * QUERY_BLOCK as usize + UNIT_POS as usize;
    let active = i < dims.seq;

    let mut q_row = Array::<f32>::new(head_dim);
    let mut do_row = Array::<f32>::new(head_dim);
    let mut acc = Array::<f32>::new(head_dim);
    let mut pos = 0i32;
    let mut lse_i = f32::new(0.0);
    let mut delta_i = f32::new(0.0);
    if active {
        let base = ((b * dims.seq + i) * dims.heads + h) * head_dim;
        load_row::<F>(q, base, dims.scale, &mut q_row, head_dim, chunk);
        load_row::<F>(dout, base, f32::new(1.0), &mut do_row, head_dim, chunk);
        zero_row(&mut acc, head_dim, chunk);
        pos = position::<I>(positions, b, i, dims.seq, packed);
        lse_i = lse[(b * dims.heads + h) * dims.seq + i];
        delta_i = delta[(b * dims.heads + h) * dims.seq + i];
    }
    let mut k_tile = SharedMemory::<f32>::new(tile * head_dim);
    let mut v_tile = SharedMemory::<f32>::new(tile * head_dim);
    let tiles = key_tiles(block, dims.seq, tile);
    for t in 0..tiles {
        let first = t * tile;
        sync_cube();
        load_tile::<F>(k, &mut k_tile, b, first, kvh, dims.kv_heads, dims.seq, tile, head_dim);
        load_tile::<F>(v, &mut v_tile, b, first, kvh, dims.kv_heads, dims.seq, tile, head_dim);
        sync_cube();
        if active {
            for r in 0..tile {
                let j = first + r;
                if visible(i, j, pos) {
                    let mut s = f32::new(0.0);
                    let mut dp = f32::new(0.0);
                    for c in 0..comptime!(head_dim / chunk) {
                        #[unroll]
                        for u in 0..chunk {
                            let d = c * chunk + u;
                            s += q_row[d] * k_tile[r * head_dim + d];
                            dp += do_row[d] * v_tile[r * head_dim + d];
                        }
                    }
                    let ds = f32::exp(s - lse_i) * (dp - delta_i);
                    for c in 0..comptime!(head_dim / chunk) {
                        #[unroll]
                        for u in 0..chunk {
                            let d = c * chunk + u;
                            acc[d] += ds * k_tile[r * head_dim + d];
                        }
                    }
                }
            }
        }
    }
    if active {
        let base = ((b * dims.seq + i) * dims.heads + h) * head_dim;
        for c in 0..comptime!(head_dim / chunk) {
            #[unroll]
            for u in 0..chunk {
                let d = c * chunk + u;
                dq[base + d] = F::cast_from(acc[d] * dims.scale);
            }
        }
    }
}

/// `dV_j = Σ_i P_ij dO_i` and `dK_j = scale · Σ_i P_ij (dP_ij − Δ_i) Q_i` of one key row per
/// unit, summed over the query heads of its kv head's group.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn attention_dkv_kernel<F: Float, I: Int>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    dout: &Array<F>,
    lse: &Array<f32>,
    delta: &Array<f32>,
    positions: &Array<I>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
    dims: Dims,
    #[comptime] head_dim: usize,
    #[comptime] chunk: usize,
    #[comptime] tile: usize,
    #[comptime] packed: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let (b, kvh, block, inside) = block_of(dims.batch, dims.kv_heads, dims.seq);
    if !inside {
        terminate!();
    }
    let group = dims.heads / dims.kv_heads;
    let j = block * QUERY_BLOCK as usize + UNIT_POS as usize;
    let active = j < dims.seq;

    let mut k_row = Array::<f32>::new(head_dim);
    let mut v_row = Array::<f32>::new(head_dim);
    let mut dk_acc = Array::<f32>::new(head_dim);
    let mut dv_acc = Array::<f32>::new(head_dim);
    if active {
        let base = ((b * dims.seq + j) * dims.kv_heads + kvh) * head_dim;
        load_row::<F>(k, base, dims.scale, &mut k_row, head_dim, chunk);
        load_row::<F>(v, base, f32::new(1.0), &mut v_row, head_dim, chunk);
        zero_row(&mut dk_acc, head_dim, chunk);
        zero_row(&mut dv_acc, head_dim, chunk);
    }
    let mut q_tile = SharedMemory::<f32>::new(tile * head_dim);
    let mut do_tile = SharedMemory::<f32>::new(tile * head_dim);
    let first_tile = (block * QUERY_BLOCK as usize) / tile;
    let tiles = dims.seq.div_ceil(tile);
    for g in 0..group {
        let h = kvh * group + g;
        for t in first_tile..tiles {
            let first = t * tile;
            sync_cube();
            load_tile::<F>(q, &mut q_tile, b, first, h, dims.heads, dims.seq, tile, head_dim);
            load_tile::<F>(dout, &mut do_tile, b, first, h, dims.heads, dims.seq, tile, head_dim);
            sync_cube();
            if active {
                for r in 0..tile {
                    let i = first + r;
                    if i < dims.seq {
                        let pos = position::<I>(positions, b, i, dims.seq, packed);
                        if visible(i, j, pos) {
                            let mut s = f32::new(0.0);
                            let mut dp = f32::new(0.0);
                            for c in 0..comptime!(head_dim / chunk) {
                                #[unroll]
                                for u in 0..chunk {
                                    let d = c * chunk + u;
                                    s += q_tile[r * head_dim + d] * k_row[d];
                                    dp += do_tile[r * head_dim + d] * v_row[d];
                                }
                            }
                            let row = (b * dims.heads + h) * dims.seq + i;
                            let p = f32::exp(s - lse[row]);
                            let ds = p * (dp - delta[row]);
                            for c in 0..comptime!(head_dim / chunk) {
                                #[unroll]
                                for u in 0..chunk {
                                    let d = c * chunk + u;
                                    dv_acc[d] += p * do_tile[r * head_dim + d];
                                    dk_acc[d] += ds * q_tile[r * head_dim + d];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if active {
        let base = ((b * dims.seq + j) * dims.kv_heads + kvh) * head_dim;
        for c in 0..comptime!(head_dim / chunk) {
            #[unroll]
            for u in 0..chunk {
                let d = c * chunk + u;
                dk[base + d] = F::cast_from(dk_acc[d] * dims.scale);
                dv[base + d] = F::cast_from(dv_acc[d]);
            }
        }
    }
}

/// The backward kernels: `(dq, dk, dv)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward<R: CubeRuntime, I: IntElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    out: CubeTensor<R>,
    lse: CubeTensor<R>,
    dout: CubeTensor<R>,
    positions: Option<CubeTensor<R>>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
    let (out, lse, dout) = (contiguous(out), contiguous(lse), contiguous(dout));
    let plan = Plan::new(&q, &k);
    let (positions, packed) = positions_or_dummy::<R, I>(positions, &q);
    let d = plan.dims;
    let client = q.client.clone();
    let dtypes = [q.dtype.into(), positions.dtype.into()];

    let delta = empty(&q, Shape::from(vec![d.batch, d.heads, d.seq]), DType::F32);
    let rows = d.batch * d.seq * d.heads;
    attention_delta_kernel::launch::<R>(
        &client,
        grid(rows.div_ceil(QUERY_BLOCK as usize)),
        CubeDim::new_1d(QUERY_BLOCK),
        out.into_array_arg(),
        dout.clone().into_array_arg(),
        delta.clone().into_array_arg(),
        plan.arg(),
        plan.head_dim,
        plan.chunk,
        q.dtype.into(),
    );

    let dq = empty(&q, q.shape(), q.dtype);
    attention_dq_kernel::launch::<R>(
        &client,
        grid(plan.cubes(false)),
        CubeDim::new_1d(QUERY_BLOCK),
        q.clone().into_array_arg(),
        k.clone().into_array_arg(),
        v.clone().into_array_arg(),
        dout.clone().into_array_arg(),
        lse.clone().into_array_arg(),
        delta.clone().into_array_arg(),
        positions.clone().into_array_arg(),
        dq.clone().into_array_arg(),
        plan.arg(),
        plan.head_dim,
        plan.chunk,
        plan.tile,
        packed,
        dtypes,
    );

    let dk = empty(&k, k.shape(), k.dtype);
    let dv = empty(&v, v.shape(), v.dtype);
    attention_dkv_kernel::launch::<R>(
        &client,
        grid(plan.cubes(true)),
        CubeDim::new_1d(QUERY_BLOCK),
        q.into_array_arg(),
        k.into_array_arg(),
        v.into_array_arg(),
        dout.into_array_arg(),
        lse.into_array_arg(),
        delta.into_array_arg(),
        positions.into_array_arg(),
        dk.clone().into_array_arg(),
        dv.clone().into_array_arg(),
        plan.arg(),
        plan.head_dim,
        plan.chunk,
        plan.tile,
        packed,
        dtypes,
    );
    (dq, dk, dv)
}
