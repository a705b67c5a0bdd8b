//! Attention on Flex's raw f32 buffers, FlashAttention-2 style (Dao 2023, Algorithms 1 and 2).
//!
//! Forward: one rayon task per (batch, query head); per task the kv head's Kᵀ, scaled by
//! `1/√d`, is staged once into scratch (transposed [`L`] rows at a time), then query blocks of
//! [`BR`] rows sweep key blocks of [`BC`] keys with the online softmax (running maximum `m`,
//! sum `ℓ`, unnormalized output rescaled by `exp(m_old − m_new)`), saving `out = acc/ℓ` and
//! `lse = m + log ℓ`.
//!
//! Backward: one task per (batch, kv head), which owns dK and dV of that head and dQ of the
//! query heads reading it (so every output element is written by exactly one task, in a fixed
//! order: results do not depend on the thread count). Per query head it sweeps key blocks
//! (outer) and query blocks (inner), recomputing `P = exp(S − lse)` and accumulating
//! `dV += Pᵀ·dO`, `dK += dSᵀ·Q`, `dQ += dS·K` with `dS = P ∘ (dO·Vᵀ − D)`.
//!
//! Every product is a small matrix product `C (+)= A·B` ([`gemm()`]): A is read element by element
//! with any strides ([`Strided`]: a transposed block is the same buffer with its strides
//! swapped, so Pᵀ and dSᵀ are never copied), B row by row in whole vectors. Q, K, V, dO and O
//! are read in place from the caller's tensors (e.g. GPT's `[B, T, 3·C]` projection) wherever
//! their rows are contiguous — as right operands only when `d_head` is a multiple of [`L`] —
//! else copied into padded scratch; only Kᵀ and Vᵀ are always staged. The products run in
//! register tiles: 8 rows × 32 columns with AVX-512 intrinsics, 4 × 16 with AVX2 and FMA, or
//! 4 × 16 left to the compiler elsewhere ([`Isa`], detected at run time; each task is compiled
//! once per instruction set through `#[target_feature]` entry points, which is what
//! [`crate::ops::simd::vectorized`] does for closures). Each step of a tile is an axpy of a
//! row of B, so no sum is reordered: every element is accumulated in order of the inner index.
//! The row operations (maximum, `exp`, sums) use lane-wise accumulators and
//! [`crate::ops::simd::exp`] so the compiler vectorizes them.
//!
//! The diagonal blocks (query block = key block, a lower triangle under the causal mask) run
//! in strips of [`STRIP`] rows, each product only as wide or as deep as the strip's last row
//! needs ([`block_product`], [`Triangle`]); the skipped products are exact
//! zeros at the ends of the sums, so the values are those of the whole block.
//!
//! Scratch is per task, O(T·D) plus a few `BR × BC` blocks, allocated once per rayon job and
//! reused across its tasks. The outputs are never zeroed: the tasks write every element
//! ([`Output`]).

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, TensorMetadata};
use rayon::prelude::*;

use super::{composed, FusedAttention};
use crate::ops::flex::from_vec;
use crate::ops::simd::{exp, wide_instructions, Madd, Wide};

/// Query rows per block.
const BR: usize = 64;
/// Keys per block.
const BC: usize = 64;
/// Floats per vector lane group: scratch rows are padded to a multiple of it.
const L: usize = 16;

/// `n` rounded up to a multiple of `m`.
fn pad(n: usize, m: usize) -> usize {
    n.div_ceil(m) * m
}

/// A read-only strided view of a 4-D f32 tensor `[batch, seq, head, d]`.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    offset: usize,
    strides: [usize; 4],
}

impl<'a> View<'a> {
    /// The view of `t` (whose strides are non-negative: see [`readable`]).
    fn of(t: &'a FlexTensor) -> Self {
        let layout = t.layout();
        let s = layout.strides();
        Self::new(
            t.storage::<f32>(),
            layout.start_offset(),
            [s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize],
        )
    }

    fn new(data: &'a [f32], offset: usize, strides: [usize; 4]) -> Self {
        Self { data, offset, strides }
    }

    /// Head `(b, h)` as a `[len, ·]` row-major matrix `(values, leading dimension)`: read in
    /// place when `in_place` and its `d` values are contiguous, else copied into `scratch`
    /// (rows of `dp`, whose padding columns are left as they are).
    fn head<'s>(
        &self,
        (b, h): (usize, usize),
        (len, d, dp): (usize, usize, usize),
        in_place: bool,
        scratch: &'s mut [f32],
    ) -> (&'s [f32], usize)
    where
        'a: 's,
    {
        if in_place && self.strides[3] == 1 {
            let base = self.offset + b * self.strides[0] + h * self.strides[2];
            return (&self.data[base..], self.strides[1]);
        }
        for t in 0..len {
            self.read(b, t, h, &mut scratch[t * dp..t * dp + d]);
        }
        (scratch, dp)
    }

    /// Row `(b, t, h)`'s `d` values: borrowed when contiguous, else copied into `scratch`.
    #[inline(always)]
    fn row<'s>(&self, (b, t, h): (usize, usize, usize), d: usize, scratch: &'s mut [f32]) -> &'s [f32]
    where
        'a: 's,
    {
        if self.strides[3] == 1 {
            let base = self.offset + b * self.strides[0] + t * self.strides[1] + h * self.strides[2];
            return &self.data[base..base + d];
        }
        self.read(b, t, h, &mut scratch[..d]);
        &scratch[..d]
    }

    /// Head `(b, h)` transposed and scaled: `dst[dd·ld + t] = scale · x[b, t, h, dd]`. Rows
    /// are read [`L`] at a time into `block` (`[L, d]`), so each written line of `dst` is
    /// filled at once (a row-by-row scatter missed the cache on every store).
    fn stage_transposed(
        &self,
        (b, h): (usize, usize),
        (len, d): (usize, usize),
        scale: f32,
        block: &mut [f32],
        (dst, ld): (&mut [f32], usize),
    ) {
        for t0 in (0..len).step_by(L) {
            let n = L.min(len - t0);
            for r in 0..n {
                self.read(b, t0 + r, h, &mut block[r * d..(r + 1) * d]);
            }
            for dd in 0..d {
                let out = &mut dst[dd * ld + t0..dd * ld + t0 + n];
                for (r, o) in out.iter_mut().enumerate() {
                    *o = block[r * d + dd] * scale;
                }
            }
        }
    }

    /// Copies the `dst.len()` values of row `(b, t, h)` into `dst`.
    #[inline(always)]
    fn read(&self, b: usize, t: usize, h: usize, dst: &mut [f32]) {
        let base = self.offset + b * self.strides[0] + t * self.strides[1] + h * self.strides[2];
        let s = self.strides[3];
        if s == 1 {
            dst.copy_from_slice(&self.data[base..base + dst.len()]);
        } else {
            for (i, x) in dst.iter_mut().enumerate() {
                *x = self.data[base + i * s];
            }
        }
    }
}

/// A write-only view of a 4-D f32 output buffer `[batch, seq, head, d]` shared by the rayon
/// tasks. Each task writes a disjoint set of rows (see the module docs).
#[derive(Clone, Copy)]
struct Writer {
    ptr: *mut f32,
    len: usize,
    offset: usize,
    strides: [usize; 4],
}

// SAFETY: the tasks sharing a `Writer` write disjoint elements (each output row belongs to one
// task), and the buffer outlives the parallel loop that writes it.
unsafe impl Send for Writer {}
unsafe impl Sync for Writer {}

/// An output buffer of `len` f32 that the tasks fill completely — every element of every
/// output row is written by exactly one task (see the module docs) — so it is never zeroed
/// first (zeroing an output the size of the activations costs as much as a pass over it, on
/// the calling thread).
struct Output {
    buf: Vec<f32>,
    len: usize,
}

impl Output {
    fn new(len: usize) -> Self {
        Self { buf: Vec::with_capacity(len), len }
    }

    /// A writer over the whole buffer (several writers may share it: derive them with
    /// [`Writer::at`]).
    fn writer(&mut self, offset: usize, strides: [usize; 4]) -> Writer {
        Writer { ptr: self.buf.spare_capacity_mut().as_mut_ptr().cast(), len: self.len, offset, strides }
    }

    /// The filled buffer.
    ///
    /// # Safety
    /// Every one of the `len` elements has been written through a writer.
    unsafe fn into_vec(mut self) -> Vec<f32> {
        // SAFETY: the caller's guarantee; `len` is within the capacity.
        unsafe { self.buf.set_len(self.len) };
        self.buf
    }
}

impl Writer {
    /// The same buffer at another offset and strides.
    fn at(self, offset: usize, strides: [usize; 4]) -> Self {
        Self { offset, strides, ..self }
    }

    /// Writes `scale · src` into row `(b, t, h)` (its `d` values are contiguous).
    ///
    /// # Safety
    /// No other thread accesses that row during the parallel loop.
    #[inline(always)]
    unsafe fn write(&self, b: usize, t: usize, h: usize, src: &[f32], scale: f32) {
        let base = self.offset + b * self.strides[0] + t * self.strides[1] + h * self.strides[2];
        debug_assert!(self.strides[3] == 1 && base + src.len() <= self.len);
        // SAFETY: in bounds (the strides describe the buffer) and not shared (the caller); the
        // memory may be uninitialized, so it is written through `MaybeUninit`, never read.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(self.ptr.add(base).cast::<std::mem::MaybeUninit<f32>>(), src.len())
        };
        for (d, &s) in dst.iter_mut().zip(src) {
            d.write(s * scale);
        }
    }
}

/// Sizes shared by the kernels.
#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    len: usize,
    n_head: usize,
    n_kv: usize,
    d: usize,
    /// `d` padded to a multiple of [`L`].
    dp: usize,
    /// `len` padded to a multiple of [`BR`] and [`BC`].
    tp: usize,
    scale: f32,
}

impl Dims {
    fn new(batch: usize, len: usize, n_head: usize, n_kv: usize, d: usize) -> Self {
        assert!(
            n_kv > 0 && n_head.is_multiple_of(n_kv),
            "attention: {n_head} query heads over {n_kv} kv heads"
        );
        let dp = pad(d.max(1), L);
        Self {
            batch,
            len,
            n_head,
            n_kv,
            d,
            dp,
            tp: pad(len.max(1), BR.max(BC)),
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    fn rep(&self) -> usize {
        self.n_head / self.n_kv
    }

    /// Whether a head's rows can be a product's right operand in place: the kernels read
    /// whole vectors of [`L`] columns, so `d` must be a multiple of it.
    fn b_in_place(&self) -> bool {
        self.d == self.dp
    }

    /// The keys of block `j0` inside the sequence.
    fn keys(&self, j0: usize) -> usize {
        BC.min(self.len - j0)
    }
}

/// `t` with non-negative strides (a copy only for flipped views).
fn readable(t: FlexTensor) -> FlexTensor {
    if t.layout().strides().iter().all(|&s| s >= 0) {
        t
    } else {
        t.to_contiguous()
    }
}

fn dims4(t: &FlexTensor) -> [usize; 4] {
    let s = t.shape();
    assert_eq!(s.num_dims(), 4, "attention: expected a 4-D tensor, got {s:?}");
    [s[0], s[1], s[2], s[3]]
}

/// The first key each query sees, `i − clamp(pos_i, 0, i)`, `[batch · len]` row-major.
fn starts(positions: IntTensor<Flex>, batch: usize, len: usize) -> Vec<u32> {
    let pos = positions.into_data().convert::<i64>().to_vec::<i64>().expect("positions as i64");
    assert_eq!(pos.len(), batch * len, "attention: positions must be [batch, seq] = [{batch}, {len}]");
    pos.iter().enumerate().map(|(n, &p)| (n % len - (p.max(0) as usize).min(n % len)) as u32).collect()
}

/// A register-tiled `C (+)= A·B` for one instruction set (see [`gemm()`]).
trait Kernel {
    /// How the tiles round a multiply-add: fused where the instruction set has FMA, so
    /// [`Kernel::madd`] and the row operations' `exp` round as the products do.
    const MADD: Madd;

    /// `a·b + c`, rounded as the products' accumulation is.
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        Self::MADD.madd(a, b, c)
    }

    /// [`gemm()`] on raw pointers (A with its row and column strides).
    ///
    /// # Safety
    /// The bounds [`gemm()`] asserts hold, and the CPU has the kernel's instruction set.
    unsafe fn gemm<const ACC: bool>(
        mnk: (usize, usize, usize),
        a: (*const f32, usize, usize),
        b: (*const f32, usize),
        c: (*mut f32, usize),
    );
}

/// A matrix operand read element by element: `A[i][p] = data[i·rs + p·cs]` (a transposed
/// block is the same buffer with the strides swapped: no transpose is copied).
#[derive(Clone, Copy)]
struct Strided<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl<'a> Strided<'a> {
    /// Row-major with leading dimension `ld`.
    fn rows(data: &'a [f32], ld: usize) -> Self {
        Self { data, rs: ld, cs: 1 }
    }

    /// The transpose of a row-major block with leading dimension `ld`.
    fn transposed(data: &'a [f32], ld: usize) -> Self {
        Self { data, rs: 1, cs: ld }
    }

    /// The sub-matrix from element `(i, p)` on.
    fn at(self, i: usize, p: usize) -> Self {
        Self { data: &self.data[i * self.rs + p * self.cs..], ..self }
    }
}

/// The first contents of the `BR × BC` score buffers, whose entries past a diagonal strip's
/// width are never computed: NaN in tests, so a stale entry that reached an output would show
/// there (the kernels must mask or overwrite them), 0 otherwise.
const STALE: f32 = if cfg!(test) { f32::NAN } else { 0.0 };

/// Rows per strip of a diagonal block (see [`block_product`]).
const STRIP: usize = 8;

// The diagonal block of a causal attention (query block i0 = key block j0) is a lower
// triangle: its row r sees keys 0..=r of it. Computed as a whole block, about half of its
// products would be discarded, so it runs in strips of STRIP rows, each as wide (scores) or
// as deep (products with P or dS) as its last row needs. Only products with an exact 0 of the
// mask are skipped, at the end (or start) of each element's sum over the inner index, so
// every sum keeps its order and every element its value.
const _: () = assert!(BR == BC, "the diagonal blocks need square blocks");

/// The strips `(r0, h)` of `rows` rows.
#[inline(always)]
fn strips(rows: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..rows).step_by(STRIP).map(move |r0| (r0, STRIP.min(rows - r0)))
}

/// Which product of a diagonal block its strips compute (see [`block_product`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Triangle {
    /// `C = A·B` where row `r` needs columns `0..=r` only (Q·Kᵀ, dO·Vᵀ): each strip computes
    /// the columns up to its last row (rounded up to [`L`]) and leaves the rest of `C` as it
    /// was. Nothing reads those stale entries: `exp_row` selects 0 over them (P), and dS's
    /// products read, strip by strip, only columns their rows' strips computed (dS).
    Columns,
    /// `C += A·B` with `A[r][p] = 0` for `p > r` (P·V, dS·K): each strip sums over `p` up to
    /// its last row only.
    Lower,
    /// `C += A·B` with `A[r][p] = 0` for `p < r` (Pᵀ·dO, dSᵀ·Q): each strip sums over `p` from
    /// its first row on.
    Upper,
}

/// [`gemm()`] of one block (`=` for [`Triangle::Columns`], `+=` otherwise), in strips shaped
/// by `part` when the block is `diagonal`.
#[inline(always)]
fn block_product<K: Kernel>(
    (diagonal, part): (bool, Triangle),
    (m, n, k): (usize, usize, usize),
    a: Strided<'_>,
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) {
    if !diagonal {
        return match part {
            Triangle::Columns => gemm::<K, false>((m, n, k), a, (b, ldb), (c, ldc)),
            Triangle::Lower | Triangle::Upper => gemm::<K, true>((m, n, k), a, (b, ldb), (c, ldc)),
        };
    }
    for (r0, h) in strips(if part == Triangle::Upper { m.min(k) } else { m }) {
        let c = (&mut c[r0 * ldc..], ldc);
        match part {
            Triangle::Columns => gemm::<K, false>((h, pad(r0 + h, L).min(n), k), a.at(r0, 0), (b, ldb), c),
            Triangle::Lower => gemm::<K, true>((h, n, (r0 + h).min(k)), a.at(r0, 0), (b, ldb), c),
            Triangle::Upper => gemm::<K, true>((h, n, k - r0), a.at(r0, r0), (&b[r0 * ldb..], ldb), c),
        }
    }
}

/// `C[m × n] = A·B` (or `+=` with `ACC`): `A[m × k]` with any strides, `B[k × n]` row-major
/// with leading dimension `ldb`, `C` with `ldc`, `n` a multiple of [`L`]. Every element is
/// summed over `p = 0..k` in order (one multiply-add per step), whatever the tiling, so the
/// result does not depend on the blocking or the thread count.
#[inline(always)]
fn gemm<K: Kernel, const ACC: bool>(
    (m, n, k): (usize, usize, usize),
    a: Strided<'_>,
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) {
    assert!(
        n.is_multiple_of(L)
            && m > 0
            && k > 0
            && (m - 1) * a.rs + (k - 1) * a.cs < a.data.len()
            && (k - 1) * ldb + n <= b.len()
            && (m - 1) * ldc + n <= c.len(),
        "gemm: {m}×{n}×{k} out of bounds"
    );
    // SAFETY: every element the kernel reads or writes is inside the asserted bounds; the
    // caller runs `K` only where the CPU has its instructions (see `Isa`).
    unsafe {
        K::gemm::<ACC>((m, n, k), (a.data.as_ptr(), a.rs, a.cs), (b.as_ptr(), ldb), (c.as_mut_ptr(), ldc))
    }
}

/// Any CPU: 4 × 16 tiles left to the compiler's vectorizer (fused multiply-add on aarch64).
#[derive(Clone, Copy)]
struct Portable;

impl Portable {
    #[inline(always)]
    unsafe fn tile<const ACC: bool, const MR: usize>(
        (i, j, k): (usize, usize, usize),
        (a, ars, acs): (*const f32, usize, usize),
        (b, ldb): (*const f32, usize),
        (c, ldc): (*mut f32, usize),
    ) {
        let mut acc = [[0f32; L]; MR];
        for (r, acc) in acc.iter_mut().enumerate() {
            for (x, acc) in acc.iter_mut().enumerate() {
                // SAFETY (all accesses): inside the bounds `gemm` asserted.
                *acc = if ACC { unsafe { *c.add((i + r) * ldc + j + x) } } else { 0.0 };
            }
        }
        for p in 0..k {
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = unsafe { *a.add((i + r) * ars + p * acs) };
                for (x, acc) in acc.iter_mut().enumerate() {
                    *acc = Self::madd(av, unsafe { *b.add(p * ldb + j + x) }, *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (x, &acc) in acc.iter().enumerate() {
                unsafe { *c.add((i + r) * ldc + j + x) = acc };
            }
        }
    }
}

impl Kernel for Portable {
    const MADD: Madd = Madd::BASELINE;

    #[inline(always)]
    unsafe fn gemm<const ACC: bool>(
        (m, n, k): (usize, usize, usize),
        a: (*const f32, usize, usize),
        b: (*const f32, usize),
        c: (*mut f32, usize),
    ) {
        for j in (0..n).step_by(L) {
            let mut i = 0;
            while i + 4 <= m {
                unsafe { Self::tile::<ACC, 4>((i, j, k), a, b, c) };
                i += 4;
            }
            for i in i..m {
                unsafe { Self::tile::<ACC, 1>((i, j, k), a, b, c) };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! Register tiles with explicit AVX-512 and AVX2+FMA intrinsics (the compiler's
    //! vectorizer does not reliably keep large tiles in registers).
    use std::arch::x86_64::*;

    use super::{Kernel, Madd, L};

    /// AVX-512: tiles of 8 rows × 32 columns (16 accumulators of AVX-512's 32 registers).
    #[derive(Clone, Copy)]
    pub(super) struct Avx512;

    impl Avx512 {
        #[inline(always)]
        unsafe fn tile<const ACC: bool, const MR: usize, const NV: usize>(
            (i, j, k): (usize, usize, usize),
            (a, ars, acs): (*const f32, usize, usize),
            (b, ldb): (*const f32, usize),
            (c, ldc): (*mut f32, usize),
        ) {
            // SAFETY (all accesses): inside the bounds `gemm` asserted; AVX-512F present.
            unsafe {
                let mut acc = [[_mm512_setzero_ps(); NV]; MR];
                if ACC {
                    for (r, acc) in acc.iter_mut().enumerate() {
                        for (v, acc) in acc.iter_mut().enumerate() {
                            *acc = _mm512_loadu_ps(c.add((i + r) * ldc + j + 16 * v));
                        }
                    }
                }
                for p in 0..k {
                    let mut bv = [_mm512_setzero_ps(); NV];
                    for (v, bv) in bv.iter_mut().enumerate() {
                        *bv = _mm512_loadu_ps(b.add(p * ldb + j + 16 * v));
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let av = _mm512_set1_ps(*a.add((i + r) * ars + p * acs));
                        for (acc, &bv) in acc.iter_mut().zip(&bv) {
                            *acc = _mm512_fmadd_ps(av, bv, *acc);
                        }
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    for (v, &acc) in acc.iter().enumerate() {
                        _mm512_storeu_ps(c.add((i + r) * ldc + j + 16 * v), acc);
                    }
                }
            }
        }

        #[inline(always)]
        unsafe fn column<const ACC: bool, const NV: usize>(
            (m, j, k): (usize, usize, usize),
            a: (*const f32, usize, usize),
            b: (*const f32, usize),
            c: (*mut f32, usize),
        ) {
            let mut i = 0;
            // SAFETY: as `tile`.
            unsafe {
                while i + 8 <= m {
                    Self::tile::<ACC, 8, NV>((i, j, k), a, b, c);
                    i += 8;
                }
                if i + 4 <= m {
                    Self::tile::<ACC, 4, NV>((i, j, k), a, b, c);
                    i += 4;
                }
                for i in i..m {
                    Self::tile::<ACC, 1, NV>((i, j, k), a, b, c);
                }
            }
        }
    }

    impl Kernel for Avx512 {
        const MADD: Madd = Madd::Fused;

        #[inline(always)]
        unsafe fn gemm<const ACC: bool>(
            (m, n, k): (usize, usize, usize),
            a: (*const f32, usize, usize),
            b: (*const f32, usize),
            c: (*mut f32, usize),
        ) {
            let mut j = 0;
            // SAFETY: as `tile`.
            unsafe {
                while j + 2 * L <= n {
                    Self::column::<ACC, 2>((m, j, k), a, b, c);
                    j += 2 * L;
                }
                if j < n {
                    Self::column::<ACC, 1>((m, j, k), a, b, c);
                }
            }
        }
    }

    /// AVX2 and FMA: tiles of 4 rows × 16 columns (8 accumulators of AVX2's 16 registers).
    #[derive(Clone, Copy)]
    pub(super) struct Avx2;

    impl Avx2 {
        #[inline(always)]
        unsafe fn tile<const ACC: bool, const MR: usize>(
            (i, j, k): (usize, usize, usize),
            (a, ars, acs): (*const f32, usize, usize),
            (b, ldb): (*const f32, usize),
            (c, ldc): (*mut f32, usize),
        ) {
            // SAFETY (all accesses): inside the bounds `gemm` asserted; AVX2 and FMA present.
            unsafe {
                let mut acc = [[_mm256_setzero_ps(); 2]; MR];
                if ACC {
                    for (r, acc) in acc.iter_mut().enumerate() {
                        for (v, acc) in acc.iter_mut().enumerate() {
                            *acc = _mm256_loadu_ps(c.add((i + r) * ldc + j + 8 * v));
                        }
                    }
                }
                for p in 0..k {
                    let b0 = _mm256_loadu_ps(b.add(p * ldb + j));
                    let b1 = _mm256_loadu_ps(b.add(p * ldb + j + 8));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let av = _mm256_set1_ps(*a.add((i + r) * ars + p * acs));
                        acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    for (v, &acc) in acc.iter().enumerate() {
                        _mm256_storeu_ps(c.add((i + r) * ldc + j + 8 * v), acc);
                    }
                }
            }
        }
    }

    impl Kernel for Avx2 {
        const MADD: Madd = Madd::Fused;

        #[inline(always)]
        unsafe fn gemm<const ACC: bool>(
            (m, n, k): (usize, usize, usize),
            a: (*const f32, usize, usize),
            b: (*const f32, usize),
            c: (*mut f32, usize),
        ) {
            // SAFETY: as `tile`.
            unsafe {
                for j in (0..n).step_by(L) {
                    let mut i = 0;
                    while i + 4 <= m {
                        Self::tile::<ACC, 4>((i, j, k), a, b, c);
                        i += 4;
                    }
                    for i in i..m {
                        Self::tile::<ACC, 1>((i, j, k), a, b, c);
                    }
                }
            }
        }
    }
}

/// The largest of `x` (−∞ if empty).
#[inline(always)]
fn max_of(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; L];
    let mut chunks = x.chunks_exact(L);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a = a.max(v);
        }
    }
    let tail = chunks.remainder().iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    acc.iter().fold(tail, |a, &v| a.max(v))
}

/// The keys `[cs, ce)` of block `j0` that query `i` (first key `start`) sees, relative to
/// `j0`; empty when `cs ≥ ce`.
#[inline(always)]
fn visible(i: usize, start: usize, j0: usize) -> (usize, usize) {
    if i < j0 {
        return (0, 0);
    }
    (start.max(j0) - j0, (i + 1).min(j0 + BC) - j0)
}

/// `row[c] = exp(row[c] − shift)` for `c` in `[cs, ce)`, 0 elsewhere (multiply-adds rounded as
/// `ma` says); returns the sum. A fully visible block (most of them) takes a loop without the
/// mask.
#[inline(always)]
fn exp_row(ma: Madd, row: &mut [f32], cs: usize, ce: usize, shift: f32) -> f32 {
    let mut acc = [0f32; L];
    if cs == 0 && ce >= row.len() {
        for chunk in row.chunks_exact_mut(L) {
            for (v, a) in chunk.iter_mut().zip(acc.iter_mut()) {
                let p = exp(ma, *v - shift);
                *v = p;
                *a += p;
            }
        }
    } else {
        // 32-bit lane indices: the compare fills a whole vector (64-bit ones half of it).
        let (cs, ce) = (cs as u32, ce as u32);
        for (n, chunk) in row.chunks_exact_mut(L).enumerate() {
            for (x, (v, a)) in chunk.iter_mut().zip(acc.iter_mut()).enumerate() {
                let c = (n * L + x) as u32;
                let p = if c >= cs && c < ce { exp(ma, *v - shift) } else { 0.0 };
                *v = p;
                *a += p;
            }
        }
    }
    acc.iter().sum()
}

/// Scratch of one forward task.
struct ForwardScratch {
    /// K of the kv head scaled by `1/√d`, transposed: `[dp, tp]`.
    kt: Vec<f32>,
    /// V and Q of the head when they cannot be read in place: `[tp, dp]`.
    v: Vec<f32>,
    q: Vec<f32>,
    /// Scores, then probabilities: `[BR, BC]`.
    s: Vec<f32>,
    /// Unnormalized output: `[BR, dp]`.
    acc: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    /// [`L`] rows being transposed: `[L, d]`.
    block: Vec<f32>,
}

impl ForwardScratch {
    fn new(dims: &Dims) -> Self {
        let (dp, tp) = (dims.dp, dims.tp);
        Self {
            kt: vec![0.0; dp * tp],
            v: vec![0.0; tp * dp],
            q: vec![0.0; tp * dp],
            s: vec![STALE; BR * BC],
            acc: vec![0.0; BR * dp],
            m: vec![0.0; BR],
            l: vec![0.0; BR],
            block: vec![0.0; L * dp],
        }
    }
}

/// The inputs of one attention call.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    q: View<'a>,
    k: View<'a>,
    v: View<'a>,
    /// First key of each query, `[batch · len]`; `None`: 0.
    starts: Option<&'a [u32]>,
    dims: Dims,
}

impl Inputs<'_> {
    #[inline(always)]
    fn start(&self, b: usize, i: usize) -> usize {
        self.starts.map_or(0, |s| s[b * self.dims.len + i] as usize)
    }
}

/// Forward of query head `h` in batch `b` (FlashAttention-2 Algorithm 1): writes its rows of
/// `out` and `lse`. Q and V are read in place where their layout allows; the scale `1/√d`
/// is folded into the staged Kᵀ.
#[inline(always)]
fn forward_task<K: Kernel>(
    x: &Inputs<'_>,
    (b, h): (usize, usize),
    s: &mut ForwardScratch,
    (out, lse): (Writer, Writer),
) {
    let Dims { len, d, dp, tp, scale, .. } = x.dims;
    let g = h / x.dims.rep();
    x.k.stage_transposed((b, g), (len, d), scale, &mut s.block, (&mut s.kt, tp));
    let (q, ldq) = x.q.head((b, h), (len, d, dp), true, &mut s.q);
    let (v, ldv) = x.v.head((b, g), (len, d, dp), x.dims.b_in_place(), &mut s.v);
    for i0 in (0..len).step_by(BR) {
        let rows = BR.min(len - i0);
        let lo = (i0..i0 + rows).map(|i| x.start(b, i)).min().unwrap_or(0);
        s.m[..rows].fill(f32::NEG_INFINITY);
        s.l[..rows].fill(0.0);
        s.acc[..rows * dp].fill(0.0);
        for j0 in (lo / BC * BC..i0 + rows).step_by(BC) {
            let diagonal = j0 == i0;
            block_product::<K>(
                (diagonal, Triangle::Columns),
                (rows, BC, d),
                Strided::rows(&q[i0 * ldq..], ldq),
                (&s.kt[j0..], tp),
                (&mut s.s, BC),
            );
            for r in 0..rows {
                let i = i0 + r;
                let (cs, ce) = visible(i, x.start(b, i), j0);
                let row = &mut s.s[r * BC..(r + 1) * BC];
                if cs >= ce {
                    row.fill(0.0);
                    continue;
                }
                let m_new = s.m[r].max(max_of(&row[cs..ce]));
                let alpha = exp(K::MADD, s.m[r] - m_new);
                let sum = exp_row(K::MADD, row, cs, ce, m_new);
                s.l[r] = s.l[r] * alpha + sum;
                s.m[r] = m_new;
                if alpha != 1.0 {
                    for a in &mut s.acc[r * dp..(r + 1) * dp] {
                        *a *= alpha;
                    }
                }
            }
            // The probabilities of keys past the sequence are 0: only the keys inside it count.
            let kn = x.dims.keys(j0);
            block_product::<K>(
                (diagonal, Triangle::Lower),
                (rows, dp, kn),
                Strided::rows(&s.s, BC),
                (&v[j0 * ldv..], ldv),
                (&mut s.acc, dp),
            );
        }
        for r in 0..rows {
            let l = s.l[r];
            // Every row sees its own key, so ℓ ≥ 1; the guard keeps a degenerate row finite.
            let (inv, lse_r) = if l > 0.0 { (1.0 / l, s.m[r] + l.ln()) } else { (0.0, f32::INFINITY) };
            // SAFETY: row (b, i, h) of `out` and (b, h, i) of `lse` belong to this task alone.
            unsafe {
                out.write(b, i0 + r, h, &s.acc[r * dp..r * dp + d], inv);
                lse.write(b, h, i0 + r, &[lse_r], 1.0);
            }
        }
    }
}

/// Scratch of one backward task.
struct BackwardScratch {
    /// K scaled by `1/√d` and transposed `[dp, tp]`, V transposed `[dp, tp]`.
    kt: Vec<f32>,
    vt: Vec<f32>,
    /// K `[tp, dp]` when it cannot be read in place.
    k: Vec<f32>,
    /// dK (unscaled) and dV of the kv head: `[tp, dp]`.
    dk: Vec<f32>,
    dv: Vec<f32>,
    /// Per query head: Q and dO when they cannot be read in place, dQ (unscaled) `[tp, dp]`;
    /// lse and `D = rowsum(dO ∘ O)` `[tp]`.
    q: Vec<f32>,
    dout: Vec<f32>,
    dq: Vec<f32>,
    lse: Vec<f32>,
    delta: Vec<f32>,
    /// P and dP then dS: `[BR, BC]` (read transposed in place for `Pᵀ·dO` and `dSᵀ·Q`).
    p: Vec<f32>,
    ds: Vec<f32>,
    row: Vec<f32>,
    /// [`L`] rows being transposed: `[L, d]`.
    block: Vec<f32>,
    /// The least first key of each query block.
    block_start: Vec<usize>,
}

impl BackwardScratch {
    fn new(dims: &Dims) -> Self {
        let (dp, tp) = (dims.dp, dims.tp);
        let big = || vec![0f32; dp * tp];
        Self {
            kt: big(),
            k: big(),
            vt: big(),
            dk: big(),
            dv: big(),
            q: big(),
            dout: big(),
            dq: big(),
            lse: vec![0.0; tp],
            delta: vec![0.0; tp],
            p: vec![STALE; BR * BC],
            ds: vec![STALE; BR * BC],
            row: vec![0.0; dp],
            block: vec![0.0; L * dp],
            block_start: vec![0; tp / BR],
        }
    }
}

/// The saved forward and the incoming gradient.
#[derive(Clone, Copy)]
struct Saved<'a> {
    out: View<'a>,
    dout: View<'a>,
    /// `[batch, n_head, len]` contiguous.
    lse: &'a [f32],
}

/// Where the backward writes dq, dk, dv.
#[derive(Clone, Copy)]
struct Grads {
    dq: Writer,
    dk: Writer,
    dv: Writer,
}

/// Backward of kv head `g` in batch `b` and the query heads that read it (FlashAttention-2
/// Algorithm 2): writes their rows of dq, dk, dv. Q, K, dO and O are read in place where
/// their layout allows; Kᵀ (scaled by `1/√d`, as in the forward) and Vᵀ are staged.
#[inline(always)]
fn backward_task<K: Kernel>(
    x: &Inputs<'_>,
    saved: &Saved<'_>,
    (b, g): (usize, usize),
    s: &mut BackwardScratch,
    grads: Grads,
) {
    let Dims { len, n_head, d, dp, tp, scale, .. } = x.dims;
    let rep = x.dims.rep();
    let in_place = x.dims.b_in_place();
    x.k.stage_transposed((b, g), (len, d), scale, &mut s.block, (&mut s.kt, tp));
    x.v.stage_transposed((b, g), (len, d), 1.0, &mut s.block, (&mut s.vt, tp));
    let (k, ldk) = x.k.head((b, g), (len, d, dp), in_place, &mut s.k);
    s.dk[..len * dp].fill(0.0);
    s.dv[..len * dp].fill(0.0);
    for (n, lo) in s.block_start.iter_mut().enumerate() {
        *lo = (n * BR..len.min((n + 1) * BR)).map(|i| x.start(b, i)).min().unwrap_or(usize::MAX);
    }
    for h in g * rep..(g + 1) * rep {
        let (q, ldq) = x.q.head((b, h), (len, d, dp), in_place, &mut s.q);
        let (dout, ldo) = saved.dout.head((b, h), (len, d, dp), in_place, &mut s.dout);
        for i in 0..len {
            // dO's row from the head matrix above (in place or already copied), O's as it lies.
            let dout_i = &dout[i * ldo..i * ldo + d];
            let out_i = saved.out.row((b, i, h), d, &mut s.row);
            // In the order and with the rounding of the dP product, so dP_ii − D_i is exactly 0
            // where O_i = v_i (a token that sees only itself), as in exact arithmetic.
            s.delta[i] = dout_i.iter().zip(out_i).fold(0.0, |acc, (&a, &o)| K::madd(a, o, acc));
            s.lse[i] = saved.lse[(b * n_head + h) * len + i];
        }
        s.dq[..len * dp].fill(0.0);
        for j0 in (0..len).step_by(BC) {
            let last_key = (j0 + BC).min(len) - 1;
            let kn = x.dims.keys(j0);
            for i0 in (j0 / BR * BR..len).step_by(BR) {
                if s.block_start[i0 / BR] > last_key {
                    continue;
                }
                let rows = BR.min(len - i0);
                let diagonal = i0 == j0;
                // P = exp(Q·Kᵀ/√d − lse) on the visible keys, 0 elsewhere.
                block_product::<K>(
                    (diagonal, Triangle::Columns),
                    (rows, BC, d),
                    Strided::rows(&q[i0 * ldq..], ldq),
                    (&s.kt[j0..], tp),
                    (&mut s.p, BC),
                );
                for r in 0..rows {
                    let i = i0 + r;
                    let (cs, ce) = visible(i, x.start(b, i), j0);
                    exp_row(K::MADD, &mut s.p[r * BC..(r + 1) * BC], cs, ce, s.lse[i]);
                }
                // dV += Pᵀ·dO (the keys inside the sequence).
                block_product::<K>(
                    (diagonal, Triangle::Upper),
                    (kn, dp, rows),
                    Strided::transposed(&s.p, BC),
                    (&dout[i0 * ldo..], ldo),
                    (&mut s.dv[j0 * dp..], dp),
                );
                // dS = P ∘ (dO·Vᵀ − D)
                block_product::<K>(
                    (diagonal, Triangle::Columns),
                    (rows, BC, d),
                    Strided::rows(&dout[i0 * ldo..], ldo),
                    (&s.vt[j0..], tp),
                    (&mut s.ds, BC),
                );
                for r in 0..rows {
                    let delta = s.delta[i0 + r];
                    let (p, ds) = (&s.p[r * BC..(r + 1) * BC], &mut s.ds[r * BC..(r + 1) * BC]);
                    for (ds, &p) in ds.iter_mut().zip(p) {
                        *ds = p * (*ds - delta);
                    }
                }
                // dK += dSᵀ·Q, dQ += dS·K (both scaled by 1/√d when written).
                block_product::<K>(
                    (diagonal, Triangle::Upper),
                    (kn, dp, rows),
                    Strided::transposed(&s.ds, BC),
                    (&q[i0 * ldq..], ldq),
                    (&mut s.dk[j0 * dp..], dp),
                );
                block_product::<K>(
                    (diagonal, Triangle::Lower),
                    (rows, dp, kn),
                    Strided::rows(&s.ds, BC),
                    (&k[j0 * ldk..], ldk),
                    (&mut s.dq[i0 * dp..], dp),
                );
            }
        }
        for i in 0..len {
            // SAFETY: query head h belongs to this task's kv head alone.
            unsafe { grads.dq.write(b, i, h, &s.dq[i * dp..i * dp + d], scale) };
        }
    }
    for j in 0..len {
        // SAFETY: kv head g of batch b is this task's.
        unsafe {
            grads.dk.write(b, j, g, &s.dk[j * dp..j * dp + d], scale);
            grads.dv.write(b, j, g, &s.dv[j * dp..j * dp + d], 1.0);
        }
    }
}

/// The instruction set the kernels run with, detected once per call on the calling thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    /// AVX-512F (with VL, AVX2, FMA, BMI2): [`x86::Avx512`] tiles.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2, FMA and BMI2 ([`Wide::Avx2`]): [`x86::Avx2`] tiles.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Anything else: [`Portable`].
    Portable,
}

impl Isa {
    /// The best this CPU has (or the test override).
    fn detect() -> Self {
        #[cfg(test)]
        if let Some(isa) = FORCE_ISA.with(|f| f.get()) {
            return isa;
        }
        match wide_instructions() {
            #[cfg(target_arch = "x86_64")]
            Some(Wide::Avx512) => Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            Some(Wide::Avx2) => Isa::Avx2,
            _ => Isa::Portable,
        }
    }

    /// Every instruction set this CPU can run.
    #[cfg(test)]
    pub(super) fn available() -> Vec<Self> {
        let best = {
            let _none = ForceIsa::new(None);
            Self::detect()
        };
        #[cfg(target_arch = "x86_64")]
        {
            match best {
                Isa::Avx512 => vec![Isa::Avx512, Isa::Avx2, Isa::Portable],
                Isa::Avx2 => vec![Isa::Avx2, Isa::Portable],
                Isa::Portable => vec![Isa::Portable],
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            vec![best]
        }
    }
}

#[cfg(test)]
thread_local! {
    static FORCE_ISA: std::cell::Cell<Option<Isa>> = const { std::cell::Cell::new(None) };
}

/// Tests: makes the kernels started from this thread use `isa` while the guard lives.
#[cfg(test)]
pub(super) struct ForceIsa(Option<Isa>);

#[cfg(test)]
impl ForceIsa {
    pub(super) fn new(isa: Option<Isa>) -> Self {
        Self(FORCE_ISA.with(|f| f.replace(isa)))
    }
}

#[cfg(test)]
impl Drop for ForceIsa {
    fn drop(&mut self) {
        FORCE_ISA.with(|f| f.set(self.0));
    }
}

#[cfg(target_arch = "x86_64")]
mod entry {
    //! The tasks compiled with each x86 instruction set enabled (everything they call is
    //! `#[inline(always)]`, so the whole loop nest uses those instructions).
    use super::x86::{Avx2, Avx512};
    use super::{backward_task, forward_task, BackwardScratch, ForwardScratch, Grads, Inputs, Saved, Writer};

    /// # Safety
    /// The CPU has AVX-512F, AVX-512VL, AVX2, FMA and BMI2; as [`forward_task`] otherwise.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,bmi2")]
    pub(super) unsafe fn forward_avx512(
        x: &Inputs<'_>,
        bh: (usize, usize),
        s: &mut ForwardScratch,
        out: (Writer, Writer),
    ) {
        forward_task::<Avx512>(x, bh, s, out)
    }

    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn forward_avx2(
        x: &Inputs<'_>,
        bh: (usize, usize),
        s: &mut ForwardScratch,
        out: (Writer, Writer),
    ) {
        forward_task::<Avx2>(x, bh, s, out)
    }

    /// # Safety
    /// As [`forward_avx512`].
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,bmi2")]
    pub(super) unsafe fn backward_avx512(
        x: &Inputs<'_>,
        saved: &Saved<'_>,
        bg: (usize, usize),
        s: &mut BackwardScratch,
        grads: Grads,
    ) {
        backward_task::<Avx512>(x, saved, bg, s, grads)
    }

    /// # Safety
    /// As [`forward_avx2`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn backward_avx2(
        x: &Inputs<'_>,
        saved: &Saved<'_>,
        bg: (usize, usize),
        s: &mut BackwardScratch,
        grads: Grads,
    ) {
        backward_task::<Avx2>(x, saved, bg, s, grads)
    }
}

/// `(out [B, T, H, D], lse [B, H, T])` contiguous.
fn forward(x: Inputs<'_>) -> (Vec<f32>, Vec<f32>) {
    let Dims { batch, len, n_head, d, .. } = x.dims;
    let mut out = Output::new(batch * len * n_head * d);
    let mut lse = Output::new(batch * n_head * len);
    let out_w = out.writer(0, [len * n_head * d, n_head * d, d, 1]);
    // lse as a [B, H, T, 1] buffer: "row" (b, h, t) of one value.
    let lse_w = lse.writer(0, [n_head * len, len, 1, 1]);
    let isa = Isa::detect();
    (0..batch * n_head).into_par_iter().for_each_init(
        || ForwardScratch::new(&x.dims),
        |s, task| {
            let bh = (task / n_head, task % n_head);
            match isa {
                // SAFETY: `Isa::detect` found these instructions.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { entry::forward_avx512(&x, bh, s, (out_w, lse_w)) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { entry::forward_avx2(&x, bh, s, (out_w, lse_w)) },
                Isa::Portable => forward_task::<Portable>(&x, bh, s, (out_w, lse_w)),
            }
        },
    );
    // SAFETY: the tasks cover every (b, h), and each writes all its rows of out and lse.
    unsafe { (out.into_vec(), lse.into_vec()) }
}

/// Runs the backward tasks, writing into `grads`' buffers.
fn backward(x: Inputs<'_>, saved: Saved<'_>, grads: Grads) {
    let Dims { batch, n_kv, .. } = x.dims;
    let isa = Isa::detect();
    (0..batch * n_kv).into_par_iter().for_each_init(
        || BackwardScratch::new(&x.dims),
        |s, task| {
            let bg = (task / n_kv, task % n_kv);
            match isa {
                // SAFETY: `Isa::detect` found these instructions.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { entry::backward_avx512(&x, &saved, bg, s, grads) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { entry::backward_avx2(&x, &saved, bg, s, grads) },
                Isa::Portable => backward_task::<Portable>(&x, &saved, bg, s, grads),
            }
        },
    );
}

fn is_f32(ts: &[&FlexTensor]) -> bool {
    ts.iter().all(|t| t.dtype() == DType::F32)
}

/// q, k, v views of a contiguous `[B, T, 3·H·D]` buffer, and the sizes.
fn qkv_views(data: &[f32], shape: [usize; 3], n_head: usize) -> (View<'_>, View<'_>, View<'_>, Dims) {
    let [batch, len, c3] = shape;
    assert!(c3.is_multiple_of(3 * n_head), "attention: qkv width {c3} is not 3 × {n_head} heads");
    let (c, d) = (c3 / 3, c3 / 3 / n_head);
    let strides = [len * c3, c3, d, 1];
    let view = |offset| View::new(data, offset, strides);
    (view(0), view(c), view(2 * c), Dims::new(batch, len, n_head, n_head, d))
}

fn qkv_shape(qkv: &FlexTensor) -> [usize; 3] {
    let s = qkv.shape();
    assert_eq!(s.num_dims(), 3, "attention: qkv must be [batch, seq, 3·d_model], got {s:?}");
    [s[0], s[1], s[2]]
}

impl FusedAttention for Flex {
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
        if !is_f32(&[&q, &k, &v]) {
            return composed::forward::<Self>(q, k, v, positions);
        }
        let (q, k, v) = (readable(q), readable(k), readable(v));
        let [batch, len, n_head, d] = dims4(&q);
        let [_, _, n_kv, _] = dims4(&k);
        assert_eq!(dims4(&k), [batch, len, n_kv, d], "attention: k must be [batch, seq, n_kv_head, d_head]");
        assert_eq!(dims4(&v), dims4(&k), "attention: v must have k's shape");
        let dims = Dims::new(batch, len, n_head, n_kv, d);
        let starts = positions.map(|p| starts(p, batch, len));
        let x = Inputs { q: View::of(&q), k: View::of(&k), v: View::of(&v), starts: starts.as_deref(), dims };
        let (out, lse) = forward(x);
        (from_vec(out, [batch, len, n_head, d]), from_vec(lse, [batch, n_head, len]))
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
        if !is_f32(&[&q, &k, &v, &out, &lse, &dout]) {
            return composed::backward::<Self>(q, k, v, out, lse, dout, positions);
        }
        let (q, k, v, out, dout) = (readable(q), readable(k), readable(v), readable(out), readable(dout));
        let lse = lse.to_contiguous();
        let [batch, len, n_head, d] = dims4(&q);
        let [_, _, n_kv, _] = dims4(&k);
        let dims = Dims::new(batch, len, n_head, n_kv, d);
        let starts = positions.map(|p| starts(p, batch, len));
        let x = Inputs { q: View::of(&q), k: View::of(&k), v: View::of(&v), starts: starts.as_deref(), dims };
        let saved = Saved {
            out: View::of(&out),
            dout: View::of(&dout),
            lse: lse.as_slice::<f32>().expect("contiguous"),
        };
        let mut dq = Output::new(batch * len * n_head * d);
        let mut dk = Output::new(batch * len * n_kv * d);
        let mut dv = Output::new(batch * len * n_kv * d);
        let grads = Grads {
            dq: dq.writer(0, [len * n_head * d, n_head * d, d, 1]),
            dk: dk.writer(0, [len * n_kv * d, n_kv * d, d, 1]),
            dv: dv.writer(0, [len * n_kv * d, n_kv * d, d, 1]),
        };
        backward(x, saved, grads);
        // SAFETY: the tasks cover every (b, kv head) and write all rows of dk, dv and of the
        // query heads' dq.
        let (dq, dk, dv) = unsafe { (dq.into_vec(), dk.into_vec(), dv.into_vec()) };
        (
            from_vec(dq, [batch, len, n_head, d]),
            from_vec(dk, [batch, len, n_kv, d]),
            from_vec(dv, [batch, len, n_kv, d]),
        )
    }

    fn fused_attention_qkv(
        qkv: FloatTensor<Self>,
        n_head: usize,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        Self::fused_attention_qkv_forward(qkv, n_head, positions).0
    }

    fn fused_attention_qkv_forward(
        qkv: FloatTensor<Self>,
        n_head: usize,
        positions: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        if !is_f32(&[&qkv]) {
            let (q, k, v) = composed::split_qkv::<Self>(qkv, n_head);
            return composed::forward::<Self>(q, k, v, positions);
        }
        let shape = qkv_shape(&qkv);
        let qkv = qkv.to_contiguous();
        let data = qkv.as_slice::<f32>().expect("contiguous");
        let (q, k, v, dims) = qkv_views(data, shape, n_head);
        let starts = positions.map(|p| starts(p, dims.batch, dims.len));
        let (out, lse) = forward(Inputs { q, k, v, starts: starts.as_deref(), dims });
        let Dims { batch, len, d, .. } = dims;
        (from_vec(out, [batch, len, n_head, d]), from_vec(lse, [batch, n_head, len]))
    }

    fn fused_attention_qkv_backward(
        qkv: FloatTensor<Self>,
        n_head: usize,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        positions: Option<IntTensor<Self>>,
    ) -> FloatTensor<Self> {
        if !is_f32(&[&qkv, &out, &lse, &dout]) {
            let (q, k, v) = composed::split_qkv::<Self>(qkv, n_head);
            let (dq, dk, dv) = composed::backward::<Self>(q, k, v, out, lse, dout, positions);
            return composed::merge_qkv::<Self>(dq, dk, dv);
        }
        let shape = qkv_shape(&qkv);
        let (qkv, out, dout, lse) = (qkv.to_contiguous(), readable(out), readable(dout), lse.to_contiguous());
        let data = qkv.as_slice::<f32>().expect("contiguous");
        let (q, k, v, dims) = qkv_views(data, shape, n_head);
        let starts = positions.map(|p| starts(p, dims.batch, dims.len));
        let saved = Saved {
            out: View::of(&out),
            dout: View::of(&dout),
            lse: lse.as_slice::<f32>().expect("contiguous"),
        };
        let [batch, len, c3] = shape;
        let c = c3 / 3;
        let mut dqkv = Output::new(batch * len * c3);
        let strides = [len * c3, c3, dims.d, 1];
        let dq = dqkv.writer(0, strides);
        let grads = Grads { dq, dk: dq.at(c, strides), dv: dq.at(2 * c, strides) };
        backward(Inputs { q, k, v, starts: starts.as_deref(), dims }, saved, grads);
        // SAFETY: dq, dk and dv rows of every (b, t, head) cover the whole [B, T, 3·H·D].
        from_vec(unsafe { dqkv.into_vec() }, shape)
    }
}

#[cfg(test)]
mod diagonal_tests {
    //! The strips of a diagonal block against the whole-block products, bit for bit.
    use super::*;

    /// Deterministic values in (−1, 1), with an exact 0 where `zero(i, p)`.
    fn matrix(rows: usize, cols: usize, seed: u32, zero: impl Fn(usize, usize) -> bool) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..rows * cols)
            .map(|n| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                if zero(n / cols, n % cols) {
                    0.0
                } else {
                    (state % 2001) as f32 / 1000.0 - 1.0
                }
            })
            .collect()
    }

    fn check<K: Kernel>() {
        // A full 64-row block and a short last one (rows = keys = 37: its sequence ends there).
        for rows in [BR, 37] {
            let (n, k) = (2 * L, 24);
            // Scores: the strips compute at least columns 0..=r of row r, and the same bits.
            let a = matrix(rows, k, 1, |_, _| false);
            let b = matrix(k, BC, 2, |_, _| false);
            let (mut full, mut strip) = (vec![0f32; BR * BC], vec![f32::NAN; BR * BC]);
            gemm::<K, false>((rows, BC, k), Strided::rows(&a, k), (&b, BC), (&mut full, BC));
            block_product::<K>(
                (true, Triangle::Columns),
                (rows, BC, k),
                Strided::rows(&a, k),
                (&b, BC),
                (&mut strip, BC),
            );
            for r in 0..rows {
                assert_eq!(full[r * BC..=r * BC + r], strip[r * BC..=r * BC + r], "scores row {r}");
            }
            // C += A·B with A lower triangular (P, dS) and with Aᵀ upper triangular (Pᵀ, dSᵀ).
            let p = matrix(rows, BC, 3, |r, c| c > r);
            let v = matrix(rows, n, 4, |_, _| false);
            let c0 = matrix(rows, n, 5, |_, _| false);
            let cases = [
                (Triangle::Lower, Strided::rows(&p, BC), "lower"),
                (Triangle::Upper, Strided::transposed(&p, BC), "upper"),
            ];
            for (triangle, a, name) in cases {
                let (mut full, mut strip) = (c0.clone(), c0.clone());
                gemm::<K, true>((rows, n, rows), a, (&v, n), (&mut full, n));
                block_product::<K>((true, triangle), (rows, n, rows), a, (&v, n), (&mut strip, n));
                assert_eq!(full, strip, "{name} product, {rows} rows");
            }
        }
    }

    #[test]
    fn diagonal_strips_equal_the_whole_block() {
        for isa in Isa::available() {
            match isa {
                // SAFETY: `Isa::available` lists only instruction sets this CPU has.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { avx512_check() },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { avx2_check() },
                Isa::Portable => check::<Portable>(),
            }
        }
    }

    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_check() {
        check::<x86::Avx2>();
    }

    /// # Safety
    /// The CPU has AVX-512F, AVX-512VL, AVX2, FMA and BMI2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,bmi2")]
    unsafe fn avx512_check() {
        check::<x86::Avx512>();
    }
}
