//! Causal flash attention as CubeCL kernels (FlashAttention-2, Dao 2023, Algorithms 1 and 2),
//! forward and backward, with packed documents (per-token positions, no `[T, T]` mask) and
//! grouped-query attention. No `[B, H, T, T]` buffer exists: the forward keeps the output and
//! each row's log-sum-exp, the backward recomputes the scores tile by tile.
//!
//! - Forward: a cube per (batch, head, block of [`QUERY_BLOCK`] queries), one unit per query row
//!   holding `q` and its output accumulator (`d_head` f32 each); key and value tiles are loaded
//!   into shared memory by the whole cube, and each unit runs an online softmax over them.
//! - Backward: `Δ_i = dO_i·O_i` (one unit per row); `dQ` as the forward (one unit per query row,
//!   K and V tiles shared); `dK` and `dV` with one unit per key row, looping over the query
//!   heads of its group and the query tiles at or after it (Q and dO tiles shared). Two passes
//!   instead of FlashAttention-2's atomic `dQ` updates: every gradient element has one writer,
//!   so results are deterministic.
//!
//! Tiles hold `tile · d_head` f32 for two tensors: `tile` is the largest power of two up to 32
//! that fits the device's shared memory (16 for `d_head` = 128 under WebGPU's 16 KiB). Any `T`
//! works (tiles past the end are masked); `d_head` is a compile-time constant of the kernel.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::FusedAttention;
use crate::ops::cube::fusion::custom_op;
use crate::ops::cube::{contiguous, cube_index, empty, grid, three, two};

/// Query rows per cube (forward and `dQ`) and key rows per cube (`dK`, `dV`): one unit each.
const QUERY_BLOCK: u32 = 32;

/// A finite stand-in for `−∞` (WGSL has no infinite literals).
const NEG_BIG: f32 = -3.0e38;

/// The sizes every kernel needs, as launch arguments.
#[derive(CubeType, CubeLaunch, Clone, Copy)]
struct Dims {
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    scale: f32,
}

/// Whether query `i` (at position `pos` in its document) sees key `j`: `i − clamp(pos, 0, i) ≤ j ≤ i`.
#[cube]
fn visible(i: usize, j: usize, pos: i32) -> bool {
    let mut back = 0usize;
    if pos > 0 {
        back = pos as usize;
    }
    if back > i {
        back = i;
    }
    j <= i && j + back >= i
}

/// The position of token `t` of batch row `b` within its document; `t` itself when the rows
/// are single documents (then [`visible`] is plain causality).
#[cube]
fn position<I: Int>(positions: &Array<I>, b: usize, t: usize, seq: usize, #[comptime] packed: bool) -> i32 {
    let mut pos = t as i32;
    if packed {
        pos = i32::cast_from(positions[b * seq + t]);
    }
    pos
}

/// Loads rows `first..first + tile` of head `head` of a `[B, T, heads, D]` tensor into `tile`
/// (`tile · D` f32; rows past `T` are zeros), with every unit of the cube.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_tile<F: Float>(
    src: &Array<F>,
    tile: &mut SharedMemory<f32>,
    b: usize,
    first: usize,
    head: usize,
    heads: usize,
    seq: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
) {
    let mut idx = UNIT_POS as usize;
    while idx < rows * head_dim {
        let r = idx / head_dim;
        let d = idx % head_dim;
        let t = first + r;
        let mut value = f32::new(0.0);
        if t < seq {
            value = f32::cast_from(src[((b * seq + t) * heads + head) * head_dim + d]);
        }
        tile[idx] = value;
        idx += CUBE_DIM as usize;
    }
}

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
    #[comptime] tile: usize,
    #[comptime] packed: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let blocks = dims.seq.div_ceil(QUERY_BLOCK as usize);
    let cube = cube_index();
    if cube >= dims.batch * dims.heads * blocks {
        terminate!();
    }
    let block = cube % blocks;
    let h = (cube / blocks) % dims.heads;
    let b = cube / (blocks * dims.heads);
    let kvh = h / (dims.heads / dims.kv_heads);
    let i = block * QUERY_BLOCK as usize + UNIT_POS as usize;
    let active = i < dims.seq;

    let mut q_row = Array::<f32>::new(head_dim);
    let mut acc = Array::<f32>::new(head_dim);
    let mut pos = 0i32;
    if active {
        for d in 0..head_dim {
            q_row[d] = f32::cast_from(q[((b * dims.seq + i) * dims.heads + h) * head_dim + d]) * dims.scale;
            acc[d] = f32::new(0.0);
        }
        pos = position::<I>(positions, b, i, dims.seq, packed);
    }
    let mut m = f32::new(NEG_BIG);
    let mut l = f32::new(0.0);
    let mut k_tile = SharedMemory::<f32>::new(tile * head_dim);
    let mut v_tile = SharedMemory::<f32>::new(tile * head_dim);

    let mut last = (block + 1) * QUERY_BLOCK as usize;
    if last > dims.seq {
        last = dims.seq;
    }
    let tiles = last.div_ceil(tile);
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
                    for d in 0..head_dim {
                        s += q_row[d] * k_tile[r * head_dim + d];
                    }
                    if s > m {
                        let correction = f32::exp(m - s);
                        l = l * correction + f32::new(1.0);
                        for d in 0..head_dim {
                            acc[d] = acc[d] * correction + v_tile[r * head_dim + d];
                        }
                        m = s;
                    } else {
                        let p = f32::exp(s - m);
                        l += p;
                        for d in 0..head_dim {
                            acc[d] += p * v_tile[r * head_dim + d];
                        }
                    }
                }
            }
        }
    }
    if active {
        let inv = f32::new(1.0) / l;
        for d in 0..head_dim {
            out[((b * dims.seq + i) * dims.heads + h) * head_dim + d] = F::cast_from(acc[d] * inv);
        }
        lse[(b * dims.heads + h) * dims.seq + i] = m + f32::ln(l);
    }
}

/// `Δ[b, h, i] = Σ_d dO·O` of one row per unit.
#[cube(launch)]
fn attention_delta_kernel<F: Float>(
    out: &Array<F>,
    dout: &Array<F>,
    delta: &mut Array<f32>,
    dims: Dims,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = cube_index() * CUBE_DIM as usize + UNIT_POS as usize; // over [B, T, H]
    if row >= dims.batch * dims.seq * dims.heads {
        terminate!();
    }
    let mut sum = f32::new(0.0);
    for d in 0..head_dim {
        sum += f32::cast_from(out[row * head_dim + d]) * f32::cast_from(dout[row * head_dim + d]);
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
    #[comptime] tile: usize,
    #[comptime] packed: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let blocks = dims.seq.div_ceil(QUERY_BLOCK as usize);
    let cube = cube_index();
    if cube >= dims.batch * dims.heads * blocks {
        terminate!();
    }
    let block = cube % blocks;
    let h = (cube / blocks) % dims.heads;
    let b = cube / (blocks * dims.heads);
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
        for d in 0..head_dim {
            q_row[d] = f32::cast_from(q[base + d]) * dims.scale;
            do_row[d] = f32::cast_from(dout[base + d]);
            acc[d] = f32::new(0.0);
        }
        pos = position::<I>(positions, b, i, dims.seq, packed);
        lse_i = lse[(b * dims.heads + h) * dims.seq + i];
        delta_i = delta[(b * dims.heads + h) * dims.seq + i];
    }
    let mut k_tile = SharedMemory::<f32>::new(tile * head_dim);
    let mut v_tile = SharedMemory::<f32>::new(tile * head_dim);
    let mut last = (block + 1) * QUERY_BLOCK as usize;
    if last > dims.seq {
        last = dims.seq;
    }
    let tiles = last.div_ceil(tile);
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
                    for d in 0..head_dim {
                        s += q_row[d] * k_tile[r * head_dim + d];
                        dp += do_row[d] * v_tile[r * head_dim + d];
                    }
                    let ds = f32::exp(s - lse_i) * (dp - delta_i);
                    for d in 0..head_dim {
                        acc[d] += ds * k_tile[r * head_dim + d];
                    }
                }
            }
        }
    }
    if active {
        let base = ((b * dims.seq + i) * dims.heads + h) * head_dim;
        for d in 0..head_dim {
            dq[base + d] = F::cast_from(acc[d] * dims.scale);
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
    #[comptime] tile: usize,
    #[comptime] packed: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let blocks = dims.seq.div_ceil(QUERY_BLOCK as usize);
    let cube = cube_index();
    if cube >= dims.batch * dims.kv_heads * blocks {
        terminate!();
    }
    let block = cube % blocks;
    let kvh = (cube / blocks) % dims.kv_heads;
    let b = cube / (blocks * dims.kv_heads);
    let group = dims.heads / dims.kv_heads;
    let j = block * QUERY_BLOCK as usize + UNIT_POS as usize;
    let active = j < dims.seq;

    let mut k_row = Array::<f32>::new(head_dim);
    let mut v_row = Array::<f32>::new(head_dim);
    let mut dk_acc = Array::<f32>::new(head_dim);
    let mut dv_acc = Array::<f32>::new(head_dim);
    if active {
        let base = ((b * dims.seq + j) * dims.kv_heads + kvh) * head_dim;
        for d in 0..head_dim {
            k_row[d] = f32::cast_from(k[base + d]) * dims.scale;
            v_row[d] = f32::cast_from(v[base + d]);
            dk_acc[d] = f32::new(0.0);
            dv_acc[d] = f32::new(0.0);
        }
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
                            for d in 0..head_dim {
                                s += q_tile[r * head_dim + d] * k_row[d];
                                dp += do_tile[r * head_dim + d] * v_row[d];
                            }
                            let row = (b * dims.heads + h) * dims.seq + i;
                            let p = f32::exp(s - lse[row]);
                            let ds = p * (dp - delta[row]);
                            for d in 0..head_dim {
                                dv_acc[d] += p * do_tile[r * head_dim + d];
                                dk_acc[d] += ds * q_tile[r * head_dim + d];
                            }
                        }
                    }
                }
            }
        }
    }
    if active {
        let base = ((b * dims.seq + j) * dims.kv_heads + kvh) * head_dim;
        for d in 0..head_dim {
            dk[base + d] = F::cast_from(dk_acc[d] * dims.scale);
            dv[base + d] = F::cast_from(dv_acc[d]);
        }
    }
}

/// The launch-time shapes of q `[B, T, H, D]` and k `[B, T, KV, D]`, and the tile size.
struct Plan {
    dims: DimsValues,
    head_dim: usize,
    tile: usize,
}

/// [`Dims`] on the host.
#[derive(Clone, Copy)]
struct DimsValues {
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
}

impl Plan {
    fn new<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>) -> Self {
        let [batch, seq, heads, head_dim] = q.shape().dims::<4>();
        let kv_heads = k.shape().dims::<4>()[2];
        assert!(
            kv_heads > 0 && heads % kv_heads == 0,
            "attention: n_head {heads} is not a multiple of n_kv_head {kv_heads}"
        );
        let shared = q.client.properties().hardware.max_shared_memory_size;
        let mut tile = 32;
        while tile > 1 && 2 * tile * head_dim * 4 > shared {
            tile /= 2;
        }
        Plan { dims: DimsValues { batch, seq, heads, kv_heads }, head_dim, tile }
    }

    fn arg<R: CubeRuntime>(&self) -> DimsLaunch<R> {
        let d = self.dims;
        DimsLaunch::new(d.batch, d.seq, d.heads, d.kv_heads, 1.0 / (self.head_dim as f32).sqrt())
    }

    /// Cubes of one unit per query row (per key row for `kv` true).
    fn cubes(&self, kv: bool) -> usize {
        let d = self.dims;
        let heads = if kv { d.kv_heads } else { d.heads };
        d.batch * heads * d.seq.div_ceil(QUERY_BLOCK as usize)
    }
}

/// `positions` contiguous, or a one-element stand-in when the rows are single documents.
fn positions_or_dummy<R: CubeRuntime, I: IntElement>(
    positions: Option<CubeTensor<R>>,
    like: &CubeTensor<R>,
) -> (CubeTensor<R>, bool) {
    match positions {
        Some(p) => (contiguous(p), true),
        None => (empty(like, Shape::from(vec![1]), I::dtype()), false),
    }
}

/// The forward kernel: `(out, lse)`.
fn forward<R: CubeRuntime, I: IntElement>(
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
        plan.tile,
        packed,
        [q.dtype.into(), positions.dtype.into()],
    );
    (out, lse)
}

/// The backward kernels: `(dq, dk, dv)`.
#[allow(clippy::too_many_arguments)]
fn backward<R: CubeRuntime, I: IntElement>(
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
        plan.tile,
        packed,
        dtypes,
    );
    (dq, dk, dv)
}

/// The kernels above for every CubeCL runtime (CUDA, HIP, wgpu); the `qkv` entries keep the
/// trait's defaults (q, k and v are sliced out of `qkv` and made contiguous).
impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> FusedAttention
    for CubeBackend<R, F, I, BT>
{
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        forward::<R, I>(q, k, v, positions).0
    }

    fn fused_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        forward::<R, I>(q, k, v, positions)
    }

    fn fused_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        backward::<R, I>(q, k, v, out, lse, dout, positions)
    }
}

/// Burn's fusion backend over a backend with these kernels: one custom operation per call.
impl<B: FusionBackend + FusedAttention> FusedAttention for Fusion<B> {
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        Self::fused_attention_forward(q, k, v, positions).0
    }

    fn fused_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let dims = q.shape.to_vec();
        let lse = Shape::from(vec![dims[0], dims[2], dims[1]]);
        let outputs = vec![(q.shape.clone(), q.dtype), (lse, DType::F32)];
        let packed = positions.is_some();
        let inputs = [Some(q), Some(k), Some(v), positions].into_iter().flatten().collect();
        let [out, lse] = two(custom_op::<B>("attention_forward", inputs, outputs, move |i| {
            let positions = packed.then(|| i.int(3));
            let (out, lse) = B::fused_attention_forward(i.float(0), i.float(1), i.float(2), positions);
            vec![out, lse]
        }));
        (out, lse)
    }

    fn fused_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let outputs =
            vec![(q.shape.clone(), q.dtype), (k.shape.clone(), k.dtype), (v.shape.clone(), v.dtype)];
        let packed = positions.is_some();
        let inputs = [Some(q), Some(k), Some(v), Some(out), Some(lse), Some(dout), positions];
        let inputs = inputs.into_iter().flatten().collect();
        let [dq, dk, dv] = three(custom_op::<B>("attention_backward", inputs, outputs, move |i| {
            let positions = packed.then(|| i.int(6));
            let (dq, dk, dv) = B::fused_attention_backward(
                i.float(0),
                i.float(1),
                i.float(2),
                i.float(3),
                i.float(4),
                i.float(5),
                positions,
            );
            vec![dq, dk, dv]
        }));
        (dq, dk, dv)
    }
}
