//! A bfloat16 matmul for `bf16-mixed` on the CPU: both operands rounded to bf16 (round to
//! nearest even, as `torch.autocast` and `vcvtneps2bf16` do) while they are packed, products
//! summed in f32 by AVX512-BF16's `vdpbf16ps` (two bf16 products per f32 lane and instruction:
//! twice the f32 FMA's), f32 out. Goto & van de Geijn's blocking (ACM TOMS 34(3), 2008): `KC`
//! rows of the shared dimension at a time, `B` packed in panels of `NR` columns, `A` in tiles of
//! `MR` rows, an `MR × NR` register tile per microkernel call. `vdpbf16ps` multiplies *pairs*
//! of the shared dimension, so each packed 32-bit word holds two consecutive `k` of one row
//! (`A`) or column (`B`), and an odd `k` is padded with a zero.
//!
//! Only on x86-64 CPUs with AVX512-BF16 (AMD Zen 4 and later, Intel Cooper Lake and Sapphire
//! Rapids and later); [`available`] says so, and callers keep their f32-converting path
//! elsewhere. `EMBER_BF16_MATMUL=off` turns it off (to compare the two paths).

use std::cell::Cell;
use std::sync::OnceLock;

use rayon::prelude::*;

/// Rows of `A` per register tile (12 × 2 accumulators of 16 lanes + 2 `B` vectors + 1
/// broadcast: 27 of the 32 vector registers).
const MR: usize = 12;
/// Columns of `B` per register tile: two vectors of 16 f32 lanes.
const NR: usize = 32;
/// Rows of the shared dimension per block: a `B` panel is `KC × NR` bf16 = 16 KiB (L1).
const KC: usize = 256;
/// Rows of `A` per parallel task, at most: a packed `A` block is `MC × KC` bf16 = 48 KiB (L2).
const MC: usize = 96;
/// Columns of `B` per packed block: `KC × NC` bf16 = 512 KiB (L2/L3).
const NC: usize = 1024;

/// True when this CPU runs the kernel (AVX-512F and AVX512-BF16) and `EMBER_BF16_MATMUL` is
/// not `off`.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let off = std::env::var("EMBER_BF16_MATMUL").is_ok_and(|v| v == "off");
        !off && cpu_has_bf16()
    })
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_bf16() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_bf16() -> bool {
    false
}

/// A strided f32 matrix view: element `(r, c)` at `ptr + r·rs + c·cs`.
#[derive(Clone, Copy, Debug)]
pub struct View {
    /// The first element.
    pub ptr: *const f32,
    /// Row stride, in elements.
    pub rs: isize,
    /// Column stride, in elements.
    pub cs: isize,
}

// SAFETY: a view is only read, and the caller keeps its buffer alive for the call.
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        Self { rs: self.cs, cs: self.rs, ..self }
    }
}

/// The destination, shared by the tasks (each writes its own rows).
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: tasks write disjoint rows.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The destination's element `i` (a method, so closures capture the whole `Out`).
    ///
    /// # Safety
    /// `i` inside the destination.
    unsafe fn at(&self, i: usize) -> *mut f32 {
        self.0.add(i)
    }
}

/// `x` rounded to bfloat16 (nearest, ties to even), as its 16 bits; NaN stays a (quiet) NaN.
/// Branch-free (a select for NaN), so the packing loops vectorize.
#[inline(always)]
pub fn bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
    if x.is_nan() {
        0x7FC0
    } else {
        rounded
    }
}

/// `x` rounded to bfloat16, as an f32.
pub fn bf16_round(x: f32) -> f32 {
    f32::from_bits(bf16_bits(x) << 16)
}

/// The word of two consecutive elements of the shared dimension: `lo | hi << 16`, rounded.
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | bf16_bits(hi) << 16
}

/// `out[i] = pair(lo[i], hi[i])` for two runs of the shared dimension's consecutive elements
/// (`hi` absent past an odd end: its half is 0).
#[inline(always)]
fn pairs_of_runs(lo: &[f32], hi: Option<&[f32]>, out: &mut [u32]) {
    match hi {
        Some(hi) => out.iter_mut().zip(lo.iter().zip(hi)).for_each(|(w, (&l, &h))| *w = pair(l, h)),
        None => out.iter_mut().zip(lo).for_each(|(w, &l)| *w = pair(l, 0.0)),
    }
}

thread_local! {
    /// This thread's packed `A` block, kept between calls (no allocation per product).
    static PACKED_A: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
    /// The calling thread's packed `B` block.
    static PACKED_B: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
}

/// The words of `len` consecutive elements `src[0], src[step], …` of the shared dimension
/// (`len` odd: the last word's high half 0) into `out[0], out[stride], …`.
///
/// # Safety
/// `src` valid for `len` elements at `step`; `out` for `len.div_ceil(2)` at `stride`.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16"))]
#[inline]
unsafe fn pairs_of(src: *const f32, step: isize, len: usize, out: *mut u32, stride: usize) {
    let full = len / 2;
    if step == 1 {
        let mut q = 0;
        // 32 elements at a time: `vcvtne2ps2bf16` rounds them (nearest even, NaN quiet,
        // subnormals to zero, as autocast's oneDNN kernels do) into 32 bf16 = 16 words of
        // consecutive pairs.
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::*;
            while q + 16 <= full {
                let lo = _mm512_loadu_ps(src.add(2 * q));
                let hi = _mm512_loadu_ps(src.add(2 * q + 16));
                let words: [u32; 16] = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                for (i, w) in words.into_iter().enumerate() {
                    *out.add((q + i) * stride) = w;
                }
                q += 16;
            }
        }
        let s = std::slice::from_raw_parts(src, len);
        for q in q..full {
            *out.add(q * stride) = pair(s[2 * q], s[2 * q + 1]);
        }
    } else {
        for q in 0..full {
            *out.add(q * stride) =
                pair(*src.offset(2 * q as isize * step), *src.offset((2 * q + 1) as isize * step));
        }
    }
    if len % 2 == 1 {
        *out.add(full * stride) = pair(*src.offset((len - 1) as isize * step), 0.0);
    }
}

/// One panel of `B`: columns `c0..c0 + cols` (`cols ≤ NR`) of rows `k0..k0 + kc`, as
/// `[k pair][NR]` words, zero past the last column.
///
/// # Safety
/// The view covers those rows and columns; the CPU has the kernel's features.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16"))]
unsafe fn pack_b_panel(b: View, k0: usize, kc: usize, c0: usize, cols: usize, panel: &mut [u32]) {
    let pairs = kc.div_ceil(2);
    if b.cs == 1 {
        // Rows contiguous: two rows' `cols` elements give one row of words.
        for q in 0..pairs {
            let r = k0 + 2 * q;
            let words = &mut panel[q * NR..(q + 1) * NR];
            let row =
                |r: usize| std::slice::from_raw_parts(b.ptr.offset(r as isize * b.rs + c0 as isize), cols);
            pairs_of_runs(row(r), (2 * q + 1 < kc).then(|| row(r + 1)), &mut words[..cols]);
            words[cols..].fill(0);
        }
    } else {
        // Columns contiguous (a transposed weight) or strided: one column at a time.
        for j in 0..NR {
            match j < cols {
                true => pairs_of(
                    b.ptr.offset(k0 as isize * b.rs + (c0 + j) as isize * b.cs),
                    b.rs,
                    kc,
                    panel.as_mut_ptr().add(j),
                    NR,
                ),
                false => (0..pairs).for_each(|q| panel[q * NR + j] = 0),
            }
        }
    }
}

/// One tile of `A`: rows `r0..r0 + rows` (`rows ≤ MR`) of columns `k0..k0 + kc`, as
/// `[row][k pair]` words, zero past the last row.
///
/// # Safety
/// As [`pack_b_panel`].
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16"))]
unsafe fn pack_a_tile(a: View, r0: usize, rows: usize, k0: usize, kc: usize, tile: &mut [u32]) {
    let pairs = kc.div_ceil(2);
    if a.rs == 1 && a.cs != 1 {
        // Columns contiguous (a transposed activation, the weight gradient's `xᵀ`): two
        // columns' `rows` elements give one word per row. 16 pairs at a time in vectors, the
        // rest one by one.
        let mut first = 0;
        #[cfg(target_arch = "x86_64")]
        while first + 16 <= kc / 2 {
            pack_a_transposed_16(a, r0, rows, k0 + 2 * first, first, pairs, tile);
            first += 16;
        }
        for q in first..pairs {
            let c = k0 + 2 * q;
            let col =
                |c: usize| std::slice::from_raw_parts(a.ptr.offset(c as isize * a.cs + r0 as isize), rows);
            let mut words = [0u32; MR];
            pairs_of_runs(col(c), (2 * q + 1 < kc).then(|| col(c + 1)), &mut words[..rows]);
            for (i, &w) in words.iter().enumerate() {
                tile[i * pairs + q] = w;
            }
        }
    } else {
        for i in 0..MR {
            match i < rows {
                true => pairs_of(
                    a.ptr.offset((r0 + i) as isize * a.rs + k0 as isize * a.cs),
                    a.cs,
                    kc,
                    tile.as_mut_ptr().add(i * pairs),
                    1,
                ),
                false => tile[i * pairs..(i + 1) * pairs].fill(0),
            }
        }
    }
}

/// Pairs `q0..q0 + 16` of an `A` tile whose columns are contiguous (`a.rs == 1`), starting at
/// column `c` of the shared dimension: each pair's two columns (`rows ≤ MR` elements each) are
/// rounded by `vcvtneps2bf16` into one vector of words, one lane per row; the 16 × 16 block of
/// words is then read back by row (gathers) and stored as 16 consecutive words of each row.
///
/// # Safety
/// As [`pack_b_panel`]; columns `c..c + 32` and rows `r0..r0 + rows` inside `A`, and the tile
/// holds `MR` rows of `pairs ≥ q0 + 16` words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_a_transposed_16(
    a: View,
    r0: usize,
    rows: usize,
    c: usize,
    q0: usize,
    pairs: usize,
    tile: &mut [u32],
) {
    use std::arch::x86_64::*;
    debug_assert!(rows <= MR && q0 + 16 <= pairs && tile.len() >= MR * pairs);
    let mask = ((1u32 << rows) - 1) as u16;
    let mut block = [0u32; 256]; // [pair][row]
    let widen = |x: __m512| -> __m512i {
        // SAFETY (transmute): __m256bh and __m256i are both 32 bytes of lanes.
        _mm512_cvtepu16_epi32(std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x)))
    };
    for q in 0..16 {
        let col0 = a.ptr.offset((c + 2 * q) as isize * a.cs + r0 as isize);
        let lo = widen(_mm512_maskz_loadu_ps(mask, col0));
        let hi = widen(_mm512_maskz_loadu_ps(mask, col0.offset(a.cs)));
        _mm512_storeu_si512(
            block.as_mut_ptr().add(q * 16).cast(),
            _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi)),
        );
    }
    let by_pair = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    for i in 0..MR {
        let offsets = _mm512_add_epi32(by_pair, _mm512_set1_epi32(i as i32));
        let row = _mm512_i32gather_epi32::<4>(offsets, block.as_ptr().cast());
        _mm512_storeu_si512(tile.as_mut_ptr().add(i * pairs + q0).cast(), row);
    }
}

/// `B[k0.., n0..]` (`kc × nc`) into panels of `NR` columns, `[panel][k pair][NR]` words.
fn pack_b(b: View, k0: usize, kc: usize, n0: usize, nc: usize, out: &mut [u32]) {
    let pairs = kc.div_ceil(2);
    out.par_chunks_mut(pairs * NR).enumerate().for_each(|(p, panel)| {
        let c0 = n0 + p * NR;
        // SAFETY: the panel's columns and rows are inside B; `available()` was checked.
        unsafe { pack_b_panel(b, k0, kc, c0, NR.min(n0 + nc - c0), panel) }
    });
}

/// `A[m0.., k0..]` (`mc × kc`) into tiles of `MR` rows, `[tile][row][k pair]` words.
fn pack_a(a: View, m0: usize, mc: usize, k0: usize, kc: usize, out: &mut [u32]) {
    let pairs = kc.div_ceil(2);
    for (t, tile) in out.chunks_exact_mut(pairs * MR).enumerate() {
        let r0 = m0 + t * MR;
        // SAFETY: as in `pack_b`.
        unsafe { pack_a_tile(a, r0, MR.min(m0 + mc - r0), k0, kc, tile) }
    }
}

/// One `MR × NR` tile of `C` (`ldc` elements per row): the sum over `pairs` packed `k` pairs
/// of `A`'s tile times `B`'s panel, written (or added, `add`) to its first `rows × cols`.
///
/// # Safety
/// The CPU has AVX-512F and AVX512-BF16; `a` holds `pairs × MR` words, `b` `pairs × NR`, and
/// `c` is valid for `rows` rows of `cols` elements at stride `ldc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    pairs: usize,
    a: *const u32,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    add: bool,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for q in 0..pairs {
        // SAFETY (transmutes): __m512i and __m512bh are both 64 bytes of lanes.
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(q * NR).cast()));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(q * NR + 16).cast()));
        for (i, acc) in acc.iter_mut().enumerate() {
            let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i * pairs + q) as i32));
            acc[0] = _mm512_dpbf16_ps(acc[0], ai, b0);
            acc[1] = _mm512_dpbf16_ps(acc[1], ai, b1);
        }
    }
    let mask = |n: usize| if n >= 16 { 0xFFFF } else { ((1u32 << n) - 1) as u16 };
    let (m0, m1) = (mask(cols), mask(cols.saturating_sub(16)));
    for (i, acc) in acc.iter().enumerate().take(rows) {
        let p = c.add(i * ldc);
        let (mut v0, mut v1) = (acc[0], acc[1]);
        if add {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, p));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, p.add(16)));
        }
        _mm512_mask_storeu_ps(p, m0, v0);
        _mm512_mask_storeu_ps(p.add(16), m1, v1);
    }
}

/// Not reached: [`available`] is false off x86-64.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(_: usize, _: *const u32, _: *const u32, _: *mut f32, _: usize, _: usize, _: usize, _: bool) {
    unreachable!("the bf16 matmul runs only where `available()`")
}

/// `C = bf16(A)·bf16(B)` for `A` `[m, k]` and `B` `[k, n]` (strided views), `C` row-major
/// `[m, n]`, summed in f32. Parallel over blocks of `A`'s rows on rayon's pool; within a
/// block the sum over `k` runs in blocks of `KC` in order, so the result does not depend on
/// the thread count.
///
/// # Panics
/// If `c.len() != m·n` or the kernel is not [`available`].
///
/// # Safety
/// `a` and `b` view `m × k` and `k × n` matrices inside live buffers.
pub unsafe fn gemm(m: usize, n: usize, k: usize, a: View, b: View, c: &mut [f32]) {
    assert_eq!(c.len(), m * n, "bf16 gemm: destination of {} for {m} × {n}", c.len());
    assert!(available(), "bf16 gemm: this CPU has no AVX512-BF16");
    if k == 0 || m == 0 || n == 0 {
        c.fill(0.0);
        return;
    }
    let out = Out(c.as_mut_ptr());
    let threads = rayon::current_num_threads();
    // Enough row blocks for every thread twice over, at most MC rows each.
    let mc = MC.min(m.div_ceil(2 * threads).div_ceil(MR) * MR).max(MR);
    // Taken out of the thread-local for the call (and put back): while this thread waits in
    // the parallel part, rayon may run another product on it (`rayon::join` of a backward's two
    // products), which then packs into a buffer of its own.
    let mut packed_b = PACKED_B.take();
    for k0 in (0..k).step_by(KC) {
        let kc = KC.min(k - k0);
        let pairs = kc.div_ceil(2);
        for n0 in (0..n).step_by(NC) {
            let nc = NC.min(n - n0);
            let panels = nc.div_ceil(NR);
            packed_b.resize(panels * pairs * NR, 0);
            pack_b(b, k0, kc, n0, nc, &mut packed_b);
            let packed_b = &packed_b;
            (0..m.div_ceil(mc)).into_par_iter().for_each(|block| {
                let m0 = block * mc;
                let rows_here = mc.min(m - m0);
                let tiles = rows_here.div_ceil(MR);
                let mut packed_a = PACKED_A.take();
                packed_a.resize(tiles * pairs * MR, 0);
                pack_a(a, m0, rows_here, k0, kc, &mut packed_a);
                for p in 0..panels {
                    let cols = NR.min(nc - p * NR);
                    for t in 0..tiles {
                        let rows = MR.min(rows_here - t * MR);
                        // SAFETY: the packed blocks hold `pairs` words per row/column of each
                        // tile/panel; the destination tile starts inside C's rows m0.. of this
                        // task and spans rows × cols of it.
                        tile(
                            pairs,
                            packed_a.as_ptr().add(t * pairs * MR),
                            packed_b.as_ptr().add(p * pairs * NR),
                            out.at((m0 + t * MR) * n + n0 + p * NR),
                            n,
                            rows,
                            cols,
                            k0 > 0,
                        );
                    }
                }
                PACKED_A.set(packed_a);
            });
        }
    }
    PACKED_B.set(packed_b);
}
