//! The forward kernel: `out` and the log-sum-exp, one unit per query row (see the parent module).

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeRuntime, IntElement};

use super::{
    block_of, key_tiles, load_row, load_tile, position, positions_or_dummy, visible, zero_row, Dims, Plan,
    NEG_BIG, QUERY_BLOCK,
};
use crate::ops::cube::{contiguous, empty, grid};

/// Forward: `out` and `lse` of one query row per unit.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn attention_forward_kernel<F: Float, I: Int>(
    q: &Array<F>,
    k: &Array<F>,
    v: &Array<F>,
    positions: &Array<I>,
    out: &mut Array<F>,
    lse: &mut Array<f32>,
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
    let mut acc = Array::<f32>::new(head_dim);
    let mut pos = 0i32;
    if active {
        let base = ((b * dims.seq + i) * dims.heads + h) * head_dim;
        load_row::<F>(q, base, dims.scale, &mut q_row, head_dim, chunk);
        zero_row(&mut acc, head_dim, chunk);
        pos = position::<I>(positions, b, i, dims.seq, packed);
    }
    let mut m = f32::new(NEG_BIG);
    let mut l = f32::new(0.0);
    let mut k_tile = SharedMemory::<f32>::new(tile * head_dim);
    let mut v_tile = SharedMemory::<f32>::new(tile * head_dim);

    let tiles = key_tiles(block, dims.seq, tile);
    for t in 0..tiles {
        let first = t * tile;
        sync_cube();
        load_tile::<F>(k, &mut k_tile, b, first, kvh, dims.kv_heads, dims.seq, tile, head_dim);
        load_tile::<F>(v, &mut v_tile, b, first, kvh, dims.kv_heads, dims.seq, tile, head_dim);
        sync_cube();
        // Branch-free online softmax over the tile (FlashAttention-2's update, with masked
        // keys at probability 0): every lane runs the same instructions, whatever it sees.
        // (A version that branched on `s > m` per lane left whole rows unwritten on lavapipe
        // at T ≥ 480.)
        for r in 0..tile {
            let j = first + r;
            let seen = active && visible(i, j, pos);
            let mut s = f32::new(0.0);
            for c in 0..comptime!(head_dim / chunk) {
                #[unroll]
                for u in 0..chunk {
                    let d = c * chunk + u;
                    s += q_row[d] * k_tile[r * head_dim + d];
                }
            }
            let m_new = select(seen, f32::max(m, s), m);
            let correction = f32::exp(f32::max(m - m_new, f32::new(-80.0)));
            let p = select(seen, f32::exp(s - m_new), f32::new(0.0));
            l = l * correction + p;
            for c in 0..comptime!(head_dim / chunk) {
                #[unroll]
                for u in 0..chunk {
                    let d = c * chunk + u;
                    acc[d] = acc[d] * correction + p * v_tile[r * head_dim + d];
                }
            }
            m = m_new;
        }
    }
    if active {
        let inv = f32::new(1.0) / l;
        for c in 0..comptime!(head_dim / chunk) {
            #[unroll]
            for u in 0..chunk {
                let d = c * chunk + u;
                out[((b * dims.seq + i) * dims.heads + h) * head_dim + d] = F::cast_from(acc[d] * inv);
            }
        }
        lse[(b * dims.heads + h) * dims.seq + i] = m + f32::ln(l);
    }
}

/// The forward kernel: `(out, lse)`.
pub(super) fn forward<R: CubeRuntime, I: IntElement>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    positions: Option<CubeTensor<R>>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
    let plan = Plan::new(&q, &k);
    let (positions, packed) = positions_or_dummy::<R, I>(positions, &q);
    let d = plan.dims;
    let out = empty(&q, q.shape(), q.dtype);
    let lse = empty(&q, Shape::from(vec![d.batch, d.heads, d.seq]), DType::F32);
    attention_forward_kernel::launch::<R>(
        &q.client,
        grid(plan.cubes(false)),
        CubeDim::new_1d(QUERY_BLOCK),
        q.clone().into_array_arg(),
        k.into_array_arg(),
        v.into_array_arg(),
        positions.clone().into_array_arg(),
        out.clone().into_array_arg(),
        lse.clone().into_array_arg(),
        plan.arg(),
        plan.head_dim,
        plan.chunk,
        plan.tile,
        packed,
        [q.dtype.into(), positions.dtype.into()],
    );
    (out, lse)
}
