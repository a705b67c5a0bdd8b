//! The products on Flex through the `gemm` crate (Burn's own Flex matmul kernel), writing into
//! fresh, uninitialized `Vec`s.

use burn::backend::flex::{FlexTensor, Layout};
use burn::backend::Flex;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{Bytes, DType, Shape};

use super::transpose::transposed;
use super::{bf16, bf16_backward_by_casts, bf16_by_casts, one_after_the_other, FusedMatmul};

/// Burn-flex's threshold for a multi-threaded gemm (m·n·k).
const PARALLEL: usize = 192 * 192 * 192;

/// gemm's tasks per thread of the pool in a multi-threaded product.
///
/// gemm splits a product statically into as many parts as it is told threads. With one part
/// per core, the product ends when the slower core does (on a shared host one vCPU often runs
/// behind); with two per core, rayon hands the parts out as cores free up. gemm's blocking
/// (kc, mc, nc) does not depend on the count, so every element is summed in the same order:
/// the same bits (tested). Measured on 2 vCPUs, the four forward products of a GPT-2 block
/// (batch·T = 2048, width 384): 23.7–24.8 ms against 25.0–25.7 ms with one part per core
/// (sums of medians of 20; 8 parts per core: 25.4–26.2).
const TASKS_PER_THREAD: usize = 2;

/// A 2-D f32 operand: base pointer (at its offset), row and column strides, shape.
pub(super) struct Operand<'a> {
    data: &'a [f32],
    offset: usize,
    rs: isize,
    cs: isize,
    rows: usize,
    cols: usize,
}

impl<'a> Operand<'a> {
    /// `None` unless `t` is a 2-D f32 tensor with non-negative strides.
    pub(super) fn of(t: &'a FlexTensor) -> Option<Self> {
        let layout = t.layout();
        if t.dtype() != DType::F32 || layout.num_dims() != 2 || !layout.has_positive_strides() {
            return None;
        }
        let s = layout.strides();
        Some(Self {
            data: t.storage::<f32>(),
            offset: layout.start_offset(),
            rs: s[0],
            cs: s[1],
            rows: layout.shape()[0],
            cols: layout.shape()[1],
        })
    }

    /// The transposed view (no copy).
    fn t(self) -> Self {
        Self { rs: self.cs, cs: self.rs, rows: self.cols, cols: self.rows, ..self }
    }

    fn ptr(&self) -> *const f32 {
        // In bounds: `offset` is the view's first element.
        self.data[self.offset..].as_ptr()
    }
}

/// `a·b` into a new `[a.rows, b.cols]` tensor, column-major when `col_major` (so a gradient
/// can take its weight's layout), else row-major.
fn product(a: &Operand, b: &Operand, col_major: bool) -> FlexTensor {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "matmul: inner dimensions {k} and {} differ", b.rows);
    let len = m * n;
    let mut out: Vec<f32> = Vec::with_capacity(len);
    let (dst_rs, dst_cs) = if col_major { (1, m as isize) } else { (n as isize, 1) };
    if k == 0 {
        out.resize(len, 0.0);
    } else if len > 0 {
        let parallelism = if m * n * k >= PARALLEL {
            gemm::Parallelism::Rayon(TASKS_PER_THREAD * rayon::current_num_threads())
        } else {
            gemm::Parallelism::None
        };
        // SAFETY: `out` has capacity for m·n elements, all written by gemm (read_dst = false:
        // the destination is never read); the operands' pointers and strides describe views
        // inside their buffers (checked by Flex's layouts).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.as_mut_ptr(),
                dst_cs,
                dst_rs,
                false,
                a.ptr(),
                a.cs,
                a.rs,
                b.ptr(),
                b.cs,
                b.rs,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
            out.set_len(len);
        }
    }
    let layout = if col_major {
        Layout::new(Shape::new([m, n]), vec![1, m as isize], 0)
    } else {
        Layout::contiguous(Shape::new([m, n]))
    };
    FlexTensor::new(Bytes::from_elems(out), layout, DType::F32)
}

/// `bf16(a)·bf16(b)` summed in f32 by the AVX512-BF16 kernel ([`bf16::gemm`]) into a new f32
/// tensor, column-major when `col_major` (computed as `bf16(b)ᵀ·bf16(a)ᵀ` row-major).
fn product_bf16(a: &Operand, b: &Operand, col_major: bool) -> FlexTensor {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(k, b.rows, "matmul: inner dimensions {k} and {} differ", b.rows);
    let view = |o: &Operand| bf16::View { ptr: o.ptr(), rs: o.rs, cs: o.cs };
    let mut out = vec![0.0f32; m * n]; // fresh zero pages: no pass of their own
                                       // SAFETY: the views describe the operands inside their buffers (Flex's layouts).
    unsafe {
        match col_major {
            false => bf16::gemm(m, n, k, view(a), view(b), &mut out),
            true => bf16::gemm(n, m, k, view(b).t(), view(a).t(), &mut out),
        }
    }
    let layout = match col_major {
        true => Layout::new(Shape::new([m, n]), vec![1, m as isize], 0),
        false => Layout::contiguous(Shape::new([m, n])),
    };
    FlexTensor::new(Bytes::from_elems(out), layout, DType::F32)
}

/// True when `t`'s columns are contiguous (a transposed view, e.g. an embedding tied as the
/// LM head): its gradient is written the same way.
fn column_major(t: &FlexTensor) -> bool {
    let s = t.layout().strides();
    s.len() == 2 && s[0] == 1 && s[1] != 1
}

impl FusedMatmul for Flex {
    /// The AVX512-BF16 kernel where the CPU has it (operands rounded while packed, no bf16
    /// copies), else Burn's casts.
    fn fused_matmul_bf16(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match (bf16::available(), Operand::of(&x), Operand::of(&w)) {
            (true, Some(a), Some(b)) => product_bf16(&a, &b, false),
            _ => bf16_by_casts::<Self>(x, w),
        }
    }

    /// `bf16(dy)·bf16(w)ᵀ` and `bf16(x)ᵀ·bf16(dy)` by the kernel, side by side when both are
    /// wanted; the weight gradient keeps the weight's layout.
    fn fused_matmul_bf16_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        want_dx: bool,
        want_dw: bool,
    ) -> (Option<FloatTensor<Self>>, Option<FloatTensor<Self>>) {
        let (Some(xo), Some(wo), Some(dyo), true) =
            (Operand::of(&x), Operand::of(&w), Operand::of(&dy), bf16::available())
        else {
            return bf16_backward_by_casts::<Self>(x, w, dy, want_dx, want_dw);
        };
        let col_major = column_major(&w);
        let dx = || want_dx.then(|| product_bf16(&dyo, &wo.t(), false));
        let dw = || want_dw.then(|| product_bf16(&xo.t(), &dyo, col_major));
        let (dx, dw) = rayon::join(dx, dw);
        (dx, dw)
    }

    fn fused_matmul(x: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match (Operand::of(&x), Operand::of(&w)) {
            (Some(a), Some(b)) => product(&a, &b, false),
            _ => Self::float_matmul(x, w),
        }
    }

    fn fused_matmul_dx(dy: FloatTensor<Self>, w: FloatTensor<Self>) -> FloatTensor<Self> {
        match (Operand::of(&dy), Operand::of(&w)) {
            (Some(a), Some(b)) if b.cs == 1 && a.rows * b.rows * b.cols >= PARALLEL => {
                // For `dy·wᵀ` gemm would read `wᵀ` with strided columns, and it packs such an
                // operand into its panel layout on the calling thread before the parallel part
                // starts (`gemm-common` 0.19, `do_prepack_lhs`): ~1 ms of one busy core per
                // weight. With `wᵀ` row-major it takes the same path as the forward `x·w`,
                // whose packing is parallel. The values are unchanged: packing copies, and the
                // sums run over k in the same order.
                let wt = transposed(&b.data[b.offset..], b.rows, b.cols, b.rs as usize);
                product(
                    &a,
                    &Operand { data: &wt, offset: 0, rs: b.rows as isize, cs: 1, rows: b.cols, cols: b.rows },
                    false,
                )
            }
            (Some(a), Some(b)) => product(&a, &b.t(), false),
            _ => Self::float_matmul(dy, Self::float_swap_dims(w, 0, 1)),
        }
    }

    fn fused_matmul_dw(
        x: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        w: &FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match (Operand::of(&x), Operand::of(&dy)) {
            (Some(a), Some(b)) => product(&a.t(), &b, column_major(w)),
            _ => Self::float_matmul(Self::float_swap_dims(x, 0, 1), dy),
        }
    }

    /// `xᵀ·dy` and `dy·wᵀ` side by side (`rayon::join`), each still split over the cores by
    /// gemm, when both are wanted and large enough for a multi-threaded gemm.
    ///
    /// One after the other, each product ends with one core waiting for the other's half
    /// (gemm splits a product statically, and on a shared host one vCPU often runs slower);
    /// side by side, a core that finishes its part of one product takes on the other's. The
    /// two products have the same FLOP count (2·n·k·m). Measured on 2 vCPUs, the four
    /// products of a GPT-2 block's backward (batch·T = 2048, width 384, operands cold) took
    /// 55–59 ms against 65–67 ms one after the other (medians of 20). Each product is the same
    /// computation either way, so the values are the same bits (tested).
    fn fused_matmul_backward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        want_dx: bool,
        want_dw: bool,
    ) -> (Option<FloatTensor<Self>>, Option<FloatTensor<Self>>) {
        let large = {
            let (x_shape, w_shape) = (x.layout().shape(), w.layout().shape());
            x_shape.num_dims() == 2
                && w_shape.num_dims() == 2
                && x_shape[0] * x_shape[1] * w_shape[1] >= PARALLEL
        };
        if !(want_dx && want_dw && large) {
            return one_after_the_other::<Self>(x, w, dy, want_dx, want_dw);
        }
        let dy_for_dx = dy.clone();
        let (dw, dx) =
            rayon::join(|| Self::fused_matmul_dw(x, dy, &w), || Self::fused_matmul_dx(dy_for_dx, w.clone()));
        (Some(dx), Some(dw))
    }
}
