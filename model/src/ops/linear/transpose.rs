//! A row-major f32 matrix transposed into a new row-major buffer, in parallel: the weight
//! `wᵀ` that the Flex backward's `dy·wᵀ` reads (see `flex::FusedMatmul::fused_matmul_dx`).

#[cfg(target_arch = "x86_64")]
use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::ops::simd::wide_instructions;

/// Output rows per rayon task.
const TILE: usize = 16;

/// `aᵀ` of the `[rows, cols]` matrix whose row `i` is `src[i·rs .. i·rs + cols]`, as a new
/// row-major `[cols, rows]` buffer, [`TILE`] output rows per rayon task. With AVX2 (on x86-64
/// CPUs that have it, detected at run time) each task moves 8 × 8 blocks through registers
/// (8 loads of 8 floats, 24 shuffles, 8 stores); element by element otherwise and at the
/// edges. A copy: the values are the same bits either way.
///
/// Measured on 2 vCPUs (Zen 4), the four weights of a 384-wide GPT-2 block, one thread, operands
/// cold: 1.1–1.3 ms against 2.1–2.5 ms element by element.
pub fn transposed(src: &[f32], rows: usize, cols: usize, rs: usize) -> Vec<f32> {
    transposed_with(src, rows, cols, rs, wide_instructions().is_some())
}

/// [`transposed`], with 8 × 8 register blocks only when `blocks` (tests compare both paths).
pub(super) fn transposed_with(src: &[f32], rows: usize, cols: usize, rs: usize, blocks: bool) -> Vec<f32> {
    assert!(
        rows == 0 || cols == 0 || (rows - 1) * rs + cols <= src.len(),
        "transpose: [{rows}, {cols}] with row stride {rs} is outside {} values",
        src.len()
    );
    let mut out: Vec<f32> = Vec::with_capacity(rows * cols);
    if rows * cols > 0 {
        out.spare_capacity_mut().par_chunks_mut(TILE * rows).enumerate().for_each(|(tile, dst)| {
            let j0 = tile * TILE;
            let width = dst.len() / rows;
            let mut done = 0; // source rows copied so far, for every column of the tile
            #[cfg(target_arch = "x86_64")]
            if blocks {
                // SAFETY: `blocks` is only set when the CPU has AVX2; the block reads rows
                // done..done+8 and columns j0..j0+width of `src` (inside it, asserted above)
                // and writes output rows j0..j0+width (this task's `dst`) at columns
                // done..done+8 < rows.
                done = unsafe { blocks_avx2(src, rs, j0, width, rows, dst) };
            }
            let _ = blocks;
            for i in done..rows {
                let row = &src[i * rs + j0..i * rs + j0 + width];
                for (jj, &value) in row.iter().enumerate() {
                    dst[jj * rows + i].write(value);
                }
            }
        });
    }
    // SAFETY: the tasks cover every element once: tile t writes output rows 16t..16t+width,
    // each at every column i < rows (the blocks the columns below `done`, the loop the rest).
    unsafe { out.set_len(rows * cols) };
    out
}

/// The 8 × 8 blocks of one task: source rows `0..8·⌊rows/8⌋` of columns `j0..j0 + width`,
/// when `width` is a multiple of 8 (else none). Returns the source rows done.
///
/// # Safety
/// The CPU has AVX2; `src` holds rows `0..rows` of stride `rs` up to column `j0 + width`, and
/// `dst` holds `width · rows` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn blocks_avx2(
    src: &[f32],
    rs: usize,
    j0: usize,
    width: usize,
    rows: usize,
    dst: &mut [MaybeUninit<f32>],
) -> usize {
    if !width.is_multiple_of(8) {
        return 0;
    }
    let whole = rows / 8 * 8;
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr().cast::<f32>());
    for i0 in (0..whole).step_by(8) {
        for jb in (0..width).step_by(8) {
            // SAFETY: as the function's contract (rows i0..i0+8 < rows, columns < j0+width).
            unsafe { block8x8(s.add(i0 * rs + j0 + jb), rs, d.add(jb * rows + i0), rows) };
        }
    }
    whole
}

/// Writes the transpose of the 8 × 8 block at `s` (row stride `ls`) to `d` (row stride `ld`):
/// unpack pairs of rows, shuffle pairs of pairs, swap 128-bit halves (the classic AVX
/// in-register transpose).
///
/// # Safety
/// AVX2; 8 rows of 8 floats readable at `s` and writable at `d`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn block8x8(s: *const f32, ls: usize, d: *mut f32, ld: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract.
    unsafe {
        let (r0, r1, r2, r3) = (
            _mm256_loadu_ps(s),
            _mm256_loadu_ps(s.add(ls)),
            _mm256_loadu_ps(s.add(2 * ls)),
            _mm256_loadu_ps(s.add(3 * ls)),
        );
        let (r4, r5, r6, r7) = (
            _mm256_loadu_ps(s.add(4 * ls)),
            _mm256_loadu_ps(s.add(5 * ls)),
            _mm256_loadu_ps(s.add(6 * ls)),
            _mm256_loadu_ps(s.add(7 * ls)),
        );
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
        let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
        // u0..u3 hold columns 0..3 of rows 0–3 in their low and columns 4..7 in their high
        // halves; u4..u7 the same of rows 4–7.
        let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
        let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
        let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
        let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
        for (c, (lo, hi)) in [(u0, u4), (u1, u5), (u2, u6), (u3, u7)].into_iter().enumerate() {
            _mm256_storeu_ps(d.add(c * ld), _mm256_permute2f128_ps::<0x20>(lo, hi));
            _mm256_storeu_ps(d.add((c + 4) * ld), _mm256_permute2f128_ps::<0x31>(lo, hi));
        }
    }
}
