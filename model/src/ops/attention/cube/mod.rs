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
//! that fits the device's shared memory (as the device reports it: 16 for `d_head` = 128 at
//! 16 KiB, WebGPU's default, 32 at 32 KiB). Any `T`
//! works (tiles past the end are masked); `d_head` is a compile-time constant of the kernel, at
//! most [`MAX_HEAD_DIM`] (wider heads take the composed default).

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

mod backward;
mod forward;

use super::FusedAttention;
use crate::ops::cube::fusion::custom_op;
use crate::ops::cube::{contiguous, cube_index, empty, three, two};
use backward::backward;
use forward::forward;

/// Query rows per cube (forward and `dQ`) and key rows per cube (`dK`, `dV`): one unit each.
pub(super) const QUERY_BLOCK: u32 = 32;

/// A finite stand-in for `−∞` (WGSL has no infinite literals).
pub(super) const NEG_BIG: f32 = -3.0e38;

/// The sizes every kernel needs, as launch arguments.
#[derive(CubeType, CubeLaunch, Clone, Copy)]
pub(super) struct Dims {
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    scale: f32,
}

/// Whether query `i` (at position `pos` in its document) sees key `j`: `i − clamp(pos, 0, i) ≤ j ≤ i`.
#[cube]
pub(super) fn visible(i: usize, j: usize, pos: i32) -> bool {
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
pub(super) fn position<I: Int>(
    positions: &Array<I>,
    b: usize,
    t: usize,
    seq: usize,
    #[comptime] packed: bool,
) -> i32 {
    let mut pos = t as i32;
    if packed {
        pos = i32::cast_from(positions[b * seq + t]);
    }
    pos
}

/// `(b, head, block, inside)` of this cube in a grid over `[batch, heads, ⌈T / QUERY_BLOCK⌉]`
/// ([`Plan::cubes`]); `inside` is false for the grid's spare cubes, which must return.
#[cube]
pub(super) fn block_of(batch: usize, heads: usize, seq: usize) -> (usize, usize, usize, bool) {
    let blocks = seq.div_ceil(QUERY_BLOCK as usize);
    let cube = cube_index();
    (cube / (blocks * heads), (cube / blocks) % heads, cube % blocks, cube < batch * heads * blocks)
}

/// The key tiles the queries of `block` see under causality: those up to its last query.
#[cube]
pub(super) fn key_tiles(block: usize, seq: usize, #[comptime] tile: usize) -> usize {
    let mut last = (block + 1) * QUERY_BLOCK as usize;
    if last > seq {
        last = seq;
    }
    last.div_ceil(tile)
}

/// `row[d] = src[base + d] · scale` for each of the `head_dim` elements of one unit's row, in
/// unrolled runs of `chunk` (see [`Plan::chunk`]).
#[cube]
pub(super) fn load_row<F: Float>(
    src: &Array<F>,
    base: usize,
    scale: f32,
    row: &mut Array<f32>,
    #[comptime] head_dim: usize,
    #[comptime] chunk: usize,
) {
    for c in 0..comptime!(head_dim / chunk) {
        #[unroll]
        for u in 0..chunk {
            let d = c * chunk + u;
            row[d] = f32::cast_from(src[base + d]) * scale;
        }
    }
}

/// Zeros the `head_dim` elements of one unit's accumulator row, in unrolled runs of `chunk`.
#[cube]
pub(super) fn zero_row(row: &mut Array<f32>, #[comptime] head_dim: usize, #[comptime] chunk: usize) {
    for c in 0..comptime!(head_dim / chunk) {
        #[unroll]
        for u in 0..chunk {
            row[c * chunk + u] = f32::new(0.0);
        }
    }
}

/// Loads rows `first..first + tile` of head `head` of a `[B, T, heads, D]` tensor into `tile`
/// (`tile · D` f32; rows past `T` are zeros), with every unit of a cube of [`QUERY_BLOCK`]
/// units, each taking `⌈tile · D / QUERY_BLOCK⌉` elements in unrolled runs of up to
/// [`UNROLLED`] (see [`Plan::chunk`] on loop iterations).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_tile<F: Float>(
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
    let per_unit = comptime!((rows * head_dim).div_ceil(QUERY_BLOCK as usize));
    let step = comptime!(per_unit.min(UNROLLED));
    for c in 0..comptime!(per_unit.div_ceil(step)) {
        #[unroll]
        for u in 0..step {
            let idx = (c * step + u) * QUERY_BLOCK as usize + UNIT_POS as usize;
            if idx < rows * head_dim {
                let r = idx / head_dim;
                let d = idx % head_dim;
                let t = first + r;
                let mut value = f32::new(0.0);
                if t < seq {
                    value = f32::cast_from(src[((b * seq + t) * heads + head) * head_dim + d]);
                }
                tile[idx] = value;
            }
        }
    }
}

/// The most statements a kernel's loop over a row's `d_head` elements (or over a tile's load)
/// runs unrolled; see [`Plan::chunk`].
pub(super) const UNROLLED: usize = 64;

/// The launch-time shapes of q `[B, T, H, D]` and k `[B, T, KV, D]`, the tile size, and the
/// width of the unrolled chunks of the loops over `d_head`.
pub(super) struct Plan {
    pub(super) dims: DimsValues,
    pub(super) head_dim: usize,
    pub(super) tile: usize,
    /// The loops over `d_head` run as `d_head / chunk` iterations of `chunk` unrolled steps:
    /// `chunk` is the largest divisor of `d_head` up to [`UNROLLED`] (64 for `d_head` 64 and
    /// 128, 48 for 48 and 96, 7 for 7). At `d_head` ≤ 64 the loops are whole, so the per-row
    /// arrays can live in registers on a GPU. And Mesa's lavapipe (llvmpipe) ends every loop
    /// of a kernel invocation once the invocation has run 65,535 loop iterations in all
    /// (`LP_MAX_TGSI_LOOP_ITERATIONS`, "shared between every loop in a shader") without an
    /// error, so a loop step per element made the forward silently wrong there from
    /// `T · d_head` ≈ 31,000 on (T = 480 at 6 heads of 64). Now each key (forward, `dQ`) or
    /// query of the group (`dK`, `dV`) costs `2 · d_head / chunk + 1` iterations, and each tile
    /// load `2 · ⌈tile · d_head / (32 · 64)⌉`: lavapipe computes up to T ≈ 21,000 at `d_head`
    /// 64 (`dK`/`dV`: T · group), and ≈ 3,800 at 512. GPUs have no such limit.
    pub(super) chunk: usize,
}

/// [`Dims`] on the host.
#[derive(Clone, Copy)]
pub(super) struct DimsValues {
    pub(super) batch: usize,
    pub(super) seq: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
}

impl Plan {
    pub(super) fn new<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>) -> Self {
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
        let chunk = (1..=UNROLLED.min(head_dim)).rev().find(|c| head_dim % c == 0).unwrap_or(1);
        Plan { dims: DimsValues { batch, seq, heads, kv_heads }, head_dim, tile, chunk }
    }

    pub(super) fn arg<R: CubeRuntime>(&self) -> DimsLaunch<R> {
        let d = self.dims;
        DimsLaunch::new(d.batch, d.seq, d.heads, d.kv_heads, 1.0 / (self.head_dim as f32).sqrt())
    }

    /// Cubes of one unit per query row (per key row for `kv` true).
    pub(super) fn cubes(&self, kv: bool) -> usize {
        let d = self.dims;
        let heads = if kv { d.kv_heads } else { d.heads };
        d.batch * heads * d.seq.div_ceil(QUERY_BLOCK as usize)
    }
}

/// `positions` contiguous, or a one-element stand-in when the rows are single documents.
pub(super) fn positions_or_dummy<R: CubeRuntime, I: IntElement>(
    positions: Option<CubeTensor<R>>,
    like: &CubeTensor<R>,
) -> (CubeTensor<R>, bool) {
    match positions {
        Some(p) => (contiguous(p), true),
        None => (empty(like, Shape::from(vec![1]), I::dtype()), false),
    }
}

/// The largest head size the kernels take: each unit keeps two to four rows of `d_head` f32
/// in private memory (registers or, when they spill, a GPU's local memory). Larger heads take
/// the composed default, which is exact (and materializes the scores in its forward). The
/// kernels give the composed values at 1024 too (tested on lavapipe, 2026-12-04; the wrong
/// numbers a review once saw there were lavapipe's loop limit, see [`Plan::chunk`]).
pub(super) const MAX_HEAD_DIM: usize = 512;

/// Whether the kernels take heads of q `[B, T, H, D]`: `D` at most [`MAX_HEAD_DIM`] (then a
/// tile of at least one row always fits the shared memory of any device, 4 KiB).
fn kernel_takes<R: CubeRuntime>(q: &CubeTensor<R>) -> bool {
    q.shape().dims::<4>()[3] <= MAX_HEAD_DIM
}

/// The kernels above for every CubeCL runtime (CUDA, HIP, wgpu), for heads up to
/// [`MAX_HEAD_DIM`]; the `qkv` entries keep the trait's defaults (q, k and v are sliced out of
/// `qkv` and made contiguous).
impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> FusedAttention
    for CubeBackend<R, F, I, BT>
{
    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        if !kernel_takes(&q) {
            return super::composed::attention::<Self>(q, k, v, positions);
        }
        forward::<R, I>(q, k, v, positions).0
    }

    fn fused_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !kernel_takes(&q) {
            return super::composed::forward::<Self>(q, k, v, positions);
        }
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
        if !kernel_takes(&q) {
            return super::composed::backward::<Self>(q, k, v, out, lse, dout, positions);
        }
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
