//! The fused attention equals the explicit reference ([`crate::attention_reference`] on
//! `Autodiff<Flex>`): output and the gradients of q, k, v, on odd shapes, GQA, packed
//! documents, strided inputs and GPT's fused qkv entry; the composed default too.

use burn::backend::flex::{FlexTensor, Layout};
use burn::backend::Flex;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, Int, Tensor, TensorData, TensorPrimitive};

use super::{composed, flash_attention, flash_attention_qkv};
use crate::attention_reference;
use crate::ops::testing::{assert_close, randn, Ad};

const REL: f32 = 1e-5;

/// Positions within documents from per-token document ids (as [`crate::Packing`]).
fn positions_of(segments: &[u32], len: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(segments.len());
    for row in segments.chunks(len) {
        let mut start = 0;
        for (i, &s) in row.iter().enumerate() {
            if i > 0 && s != row[i - 1] {
                start = i;
            }
            out.push((i - start) as i64);
        }
    }
    out
}

/// `[B, 1, T, T]`, true where query `i` must not see key `j` (`j > i` or `j < i − pos_i`).
fn mask_of(positions: &[i64], batch: usize, len: usize) -> Tensor<Ad, 4, Bool> {
    let mut mask = Vec::with_capacity(batch * len * len);
    for b in 0..batch {
        for i in 0..len {
            let start = i as i64 - positions[b * len + i].clamp(0, i as i64);
            mask.extend((0..len).map(|j| j > i || (j as i64) < start));
        }
    }
    Tensor::from_data(TensorData::new(mask, [batch, 1, len, len]), &Default::default())
}

fn int_positions<B: burn::tensor::backend::Backend>(
    positions: &[i64],
    batch: usize,
    len: usize,
) -> Tensor<B, 2, Int> {
    Tensor::from_data(TensorData::new(positions.to_vec(), [batch, len]), &Default::default())
}

/// The oracle in the BTHD layout: heads first, kv heads repeated, explicit softmax.
fn reference(
    q: Tensor<Ad, 4>,
    k: Tensor<Ad, 4>,
    v: Tensor<Ad, 4>,
    positions: Option<&[i64]>,
) -> Tensor<Ad, 4> {
    let [batch, len, n_head, d] = q.dims();
    let n_kv = k.dims()[2];
    let rep = |x: Tensor<Ad, 4>| {
        let x = x.swap_dims(1, 2);
        x.unsqueeze_dim::<5>(2).expand([batch, n_kv, n_head / n_kv, len, d]).reshape([batch, n_head, len, d])
    };
    let mask = positions.map(|p| mask_of(p, batch, len));
    attention_reference(q.swap_dims(1, 2), rep(k), rep(v), mask, None).swap_dims(1, 2)
}

fn rms<const D: usize, B: burn::tensor::backend::Backend>(t: &Tensor<B, D>) -> f32 {
    let v: Vec<f32> = t.clone().into_data().to_vec().unwrap();
    (v.iter().map(|x| x * x).sum::<f32>() / v.len().max(1) as f32).sqrt()
}

/// Compares with an absolute floor of `floor` (the typical size of the compared quantity):
/// an element much smaller than that is a sum of typical-size terms that cancel
/// (`Σ_j p_ij·v_j`, or `dP_ij − D_i` in the gradients), whose f32 rounding is absolute — e.g.
/// dq of the first token is exactly 0 in exact arithmetic and may round to ~1e-7·|dO|·|v|.
fn close<const D: usize, B: burn::tensor::backend::Backend>(
    what: &str,
    got: Tensor<B, D>,
    want: Tensor<B, D>,
    floor: f32,
) {
    assert_close(what, got, want, REL, floor.max(1e-6));
}

/// A view `[B, T, n, D]` of columns `col..col + n·D` of a `[B, T, W]` buffer (no copy).
fn view(buf: &Tensor<Flex, 3>, col: usize, n: usize, d: usize) -> Tensor<Flex, 4> {
    let [batch, len, w] = buf.dims();
    let t: FlexTensor = buf.clone().into_primitive().tensor();
    let layout =
        Layout::new([batch, len, n, d].into(), vec![(len * w) as isize, w as isize, d as isize, 1], col);
    Tensor::from_primitive(TensorPrimitive::Float(t.with_layout(layout)))
}

#[derive(Clone, Copy)]
enum Input {
    /// Contiguous `[B, T, n, D]`.
    Contiguous,
    /// Views into one `[B, T, (H + 2·KV)·D]` buffer (GPT's `c_attn` output).
    Packed,
    /// `[B, n, T, D]` tensors with dims 1 and 2 swapped.
    Transposed,
}

/// q, k, v of the given layout (leaves of the autodiff graph).
fn inputs(shape: [usize; 5], input: Input, seed: u64) -> [Tensor<Ad, 4>; 3] {
    let [batch, len, n_head, n_kv, d] = shape;
    match input {
        Input::Contiguous => [
            randn([batch, len, n_head, d], 1.0, seed),
            randn([batch, len, n_kv, d], 1.0, seed + 1),
            randn([batch, len, n_kv, d], 1.0, seed + 2),
        ],
        Input::Transposed => [
            randn([batch, n_head, len, d], 1.0, seed).swap_dims(1, 2),
            randn([batch, n_kv, len, d], 1.0, seed + 1).swap_dims(1, 2),
            randn([batch, n_kv, len, d], 1.0, seed + 2).swap_dims(1, 2),
        ],
        Input::Packed => {
            let buf = randn([batch, len, (n_head + 2 * n_kv) * d], 1.0, seed).inner();
            [
                Tensor::from_inner(view(&buf, 0, n_head, d)),
                Tensor::from_inner(view(&buf, n_head * d, n_kv, d)),
                Tensor::from_inner(view(&buf, (n_head + n_kv) * d, n_kv, d)),
            ]
        }
    }
}

/// Fused vs reference on `shape = [batch, len, n_head, n_kv, d]`: output and input gradients
/// under autodiff, the plain Flex forward, and the composed default's forward and backward.
fn check(shape: [usize; 5], segments: Option<&[u32]>, input: Input, seed: u64) {
    let [batch, len, n_head, _, d] = shape;
    let what = |s: &str| format!("{s} {shape:?}");
    let positions = segments.map(|s| positions_of(s, len));
    let pos = || positions.as_ref().map(|p| int_positions::<Ad>(p, batch, len));
    let [q, k, v] = inputs(shape, input, seed);
    let w = randn([batch, len, n_head, d], 1.0, seed + 9);

    let (qf, kf, vf) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
    let yf = flash_attention(qf.clone(), kf.clone(), vf.clone(), pos());
    let (qr, kr, vr) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
    let yr = reference(qr.clone(), kr.clone(), vr.clone(), positions.as_deref());
    let out_floor = rms(&yr);
    close(&what("out"), yf.clone(), yr.clone(), out_floor);
    let gf = (yf * w.clone()).sum().backward();
    let gr = (yr.clone() * w.clone()).sum().backward();
    let (dq, dk, dv) = (qr.grad(&gr).unwrap(), kr.grad(&gr).unwrap(), vr.grad(&gr).unwrap());
    let g_floor = rms(&dq).max(rms(&dk)).max(rms(&dv));
    close(&what("dq"), qf.grad(&gf).unwrap(), dq.clone(), g_floor);
    close(&what("dk"), kf.grad(&gf).unwrap(), dk.clone(), g_floor);
    close(&what("dv"), vf.grad(&gf).unwrap(), dv.clone(), g_floor);

    // Without autodiff: the Flex kernel's forward.
    let pos_inner = || positions.as_ref().map(|p| int_positions::<Flex>(p, batch, len));
    let y = flash_attention(q.clone().inner(), k.clone().inner(), v.clone().inner(), pos_inner());
    close(&what("out (Flex)"), y, yr.clone().inner(), out_floor);

    // The composed default (CUDA's path): forward, and backward from its own out and lse.
    let prim = |t: Tensor<Ad, 4>| -> FloatTensor<Flex> { t.inner().into_primitive().tensor() };
    let pos_prim = || pos_inner().map(|p| p.into_primitive());
    let (out, lse) = composed::forward::<Flex>(prim(q.clone()), prim(k.clone()), prim(v.clone()), pos_prim());
    let float4 = |t| Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(t));
    close(&what("out (composed)"), float4(out.clone()), yr.inner(), out_floor);
    let (cq, ck, cv) = composed::backward::<Flex>(prim(q), prim(k), prim(v), out, lse, prim(w), pos_prim());
    close(&what("dq (composed)"), float4(cq), dq, g_floor);
    close(&what("dk (composed)"), float4(ck), dk, g_floor);
    close(&what("dv (composed)"), float4(cv), dv, g_floor);
}

#[test]
fn odd_shapes_equal_the_reference() {
    // T not a multiple of the 64-row blocks, d_head 24 (not a multiple of 16) and 64.
    check([3, 70, 5, 5, 24], None, Input::Contiguous, 1);
    check([2, 131, 3, 3, 64], None, Input::Contiguous, 2);
    check([1, 9, 2, 2, 7], None, Input::Contiguous, 3);
}

#[test]
fn one_token_equals_the_reference() {
    check([3, 1, 5, 5, 24], None, Input::Contiguous, 4);
    check([2, 1, 6, 2, 16], Some(&[0, 0]), Input::Contiguous, 5);
}

#[test]
fn grouped_query_heads_equal_the_reference() {
    check([2, 77, 6, 2, 24], None, Input::Contiguous, 6);
    check([3, 65, 6, 3, 32], None, Input::Transposed, 7);
}

#[test]
fn packed_documents_equal_the_masked_reference() {
    // Row 0: documents of 30, 1, 50 and 19 tokens; row 1: 1, 1, 98; row 2: one document.
    let len = 100;
    let mut segments = Vec::new();
    for (n, size) in [30, 1, 50, 19].into_iter().enumerate() {
        segments.extend(std::iter::repeat_n(n as u32, size));
    }
    segments.extend([0, 1]);
    segments.extend(std::iter::repeat_n(2, len - 2));
    segments.extend(std::iter::repeat_n(0, len));
    check([3, len, 4, 2, 24], Some(&segments), Input::Contiguous, 8);
    check([3, len, 3, 3, 16], Some(&segments), Input::Packed, 9);
}

#[test]
fn strided_inputs_equal_the_reference() {
    check([3, 67, 5, 5, 24], None, Input::Packed, 10);
    check([2, 70, 6, 3, 24], None, Input::Packed, 11);
    check([2, 33, 5, 5, 64], None, Input::Transposed, 12);
}

#[test]
fn fused_qkv_equals_the_reference_on_its_chunks() {
    // d_head 24: heads staged into padded scratch; 32: read in place from the projection.
    for d in [24, 32] {
        qkv_case(d);
    }
}

fn qkv_case(d: usize) {
    let (batch, len, n_head) = (3, 75, 5);
    let c = n_head * d;
    let segments: Vec<u32> = (0..batch * len).map(|n| ((n % len) / 20) as u32).collect();
    for positions in [None, Some(positions_of(&segments, len))] {
        let pos = || positions.as_ref().map(|p| int_positions::<Ad>(p, batch, len));
        let qkv = randn([batch, len, 3 * c], 1.0, 13);
        let w = randn([batch, len, n_head, d], 1.0, 14);
        let (qf, qr) = (qkv.clone().require_grad(), qkv.clone().require_grad());
        let yf = flash_attention_qkv(qf.clone(), n_head, pos());
        let part = |i: usize| {
            qr.clone().slice([0..batch, 0..len, i * c..(i + 1) * c]).reshape([batch, len, n_head, d])
        };
        let yr = reference(part(0), part(1), part(2), positions.as_deref());
        let out_floor = rms(&yr);
        close("out (qkv)", yf.clone(), yr.clone(), out_floor);
        let (gf, gr) = ((yf * w.clone()).sum().backward(), (yr * w).sum().backward());
        let dqkv = qr.grad(&gr).unwrap();
        let g_floor = rms(&dqkv);
        close("dqkv", qf.grad(&gf).unwrap(), dqkv, g_floor);
        let inner = flash_attention_qkv(
            qkv.inner(),
            n_head,
            positions.as_ref().map(|p| int_positions(p, batch, len)),
        );
        close("out (qkv, Flex)", inner, reference_qkv_inner(&qr, n_head, &positions, batch, len), out_floor);
    }
}

fn reference_qkv_inner(
    qkv: &Tensor<Ad, 3>,
    n_head: usize,
    positions: &Option<Vec<i64>>,
    batch: usize,
    len: usize,
) -> Tensor<Flex, 4> {
    let c = qkv.dims()[2] / 3;
    let d = c / n_head;
    let part =
        |i: usize| qkv.clone().slice([0..batch, 0..len, i * c..(i + 1) * c]).reshape([batch, len, n_head, d]);
    reference(part(0), part(1), part(2), positions.as_deref()).inner()
}

#[test]
fn every_instruction_set_equals_the_reference() {
    // AVX-512, AVX2+FMA and portable tiles, as far as this CPU has them.
    for isa in super::flex::Isa::available() {
        let _isa = super::flex::ForceIsa::new(Some(isa));
        check([2, 70, 4, 2, 24], None, Input::Contiguous, 20);
        check([1, 65, 2, 2, 64], Some(&[0; 65]), Input::Packed, 21);
        check([2, 3, 2, 1, 16], None, Input::Transposed, 22);
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let shape = [3, 90, 4, 2, 24];
    let [q, k, v] = inputs(shape, Input::Contiguous, 15);
    let w = randn([3, 90, 4, 24], 1.0, 16);
    let run = || {
        let (q, k, v) = (q.clone().require_grad(), k.clone().require_grad(), v.clone().require_grad());
        let y = flash_attention(q.clone(), k.clone(), v.clone(), None);
        let g = (y.clone() * w.clone()).sum().backward();
        [y.inner(), q.grad(&g).unwrap(), k.grad(&g).unwrap(), v.grad(&g).unwrap()].map(|t| t.into_data())
    };
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(run);
    let three = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap().install(run);
    assert_eq!(one, three);
}

#[test]
fn out_of_range_positions_stay_finite() {
    // Negative positions (a token sees only itself) and positions past the row start.
    let (batch, len) = (2, 70);
    let positions: Vec<i64> = (0..batch * len).map(|n| [(n % 7) as i64 - 3, 1000][n % 2]).collect();
    let [q, k, v] = inputs([batch, len, 2, 2, 16], Input::Contiguous, 17);
    let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
    let y = flash_attention(q.clone(), k.clone(), v.clone(), Some(int_positions(&positions, batch, len)));
    let yr = reference(q.clone(), k.clone(), v.clone(), Some(&positions));
    let floor = rms(&yr);
    close("out", y.clone(), yr, floor);
    let g = y.sum().backward();
    for t in [q.grad(&g).unwrap(), k.grad(&g).unwrap(), v.grad(&g).unwrap()] {
        assert!(t.into_data().to_vec::<f32>().unwrap().iter().all(|x| x.is_finite()));
    }
}

/// Peak resident memory (VmHWM) of forward + backward at long contexts, fused vs the explicit
/// path, and their times. `cargo test --release -p ember-model --lib attention_memory --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn attention_memory_and_time_at_long_contexts() {
    fn peak_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .map_or(0, |v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
    }
    fn reset_peak() {
        // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux ≥ 4.0).
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }
    let (batch, n_head, d) = (1, 12, 64);
    for len in [1024, 2048] {
        for fused in [true, false] {
            let [q, k, v] = inputs([batch, len, n_head, n_head, d], Input::Contiguous, 18);
            let w = randn([batch, len, n_head, d], 1.0, 19);
            reset_peak();
            let base = peak_kib();
            let start = std::time::Instant::now();
            let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
            let y =
                if fused { flash_attention(q.clone(), k, v, None) } else { reference(q.clone(), k, v, None) };
            let g = (y * w).sum().backward();
            let dq = q.grad(&g).unwrap().into_data();
            let secs = start.elapsed().as_secs_f64();
            println!(
                "T={len} B={batch} H={n_head} D={d} {}: {:.3} s, peak RSS +{} MiB",
                if fused { "fused" } else { "reference" },
                secs,
                (peak_kib() - base) / 1024
            );
            drop(dq);
        }
        // Inference (Flex, no autodiff): the fused forward vs Burn's attention op.
        let [q, k, v] = inputs([batch, len, n_head, n_head, d], Input::Contiguous, 18).map(|t| t.inner());
        let start = std::time::Instant::now();
        let y = flash_attention(q.clone(), k.clone(), v.clone(), None).into_data();
        let fused = start.elapsed().as_secs_f64();
        let opts = burn::tensor::ops::AttentionModuleOptions { is_causal: true, ..Default::default() };
        let (q, k, v) = (q.swap_dims(1, 2), k.swap_dims(1, 2), v.swap_dims(1, 2));
        let start = std::time::Instant::now();
        let yb = burn::tensor::module::attention(q, k, v, None, None, opts).into_data();
        println!(
            "T={len} forward only: fused {fused:.3} s, Burn's Flex attention {:.3} s",
            start.elapsed().as_secs_f64()
        );
        drop((y, yb));
    }
}

/// Forward + backward of GPT's attention from the `c_attn` output `[B, T, 3C]` to the merged
/// heads `[B, T, C]`: before (Burn's attention op under autodiff, heads transposed and merged
/// with copies), the fused op on split q, k, v, and the fused qkv entry. Best of 3.
/// `cargo test --release -p ember-model --lib gpt_attention_layer_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn gpt_attention_layer_timing() {
    let (batch, len, n_head, d) = (2, 1024, 12, 64);
    let c = n_head * d;
    let qkv = randn([batch, len, 3 * c], 1.0, 30);
    let w = randn([batch, len, c], 1.0, 31);
    let opts = burn::tensor::ops::AttentionModuleOptions { is_causal: true, ..Default::default() };
    type Path<'a> = &'a dyn Fn(Tensor<Ad, 3>) -> Tensor<Ad, 3>;
    let paths: [(&str, Path); 3] = [
        ("before: Burn attention, transposes", &|qkv| {
            let heads = |t: Tensor<Ad, 3>| t.reshape([batch, len, n_head, d]).swap_dims(1, 2);
            let mut parts = qkv.chunk(3, 2).into_iter().map(heads);
            let (q, k, v) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
            burn::tensor::module::attention(q, k, v, None, None, opts)
                .swap_dims(1, 2)
                .reshape([batch, len, c])
        }),
        ("fused, split q|k|v", &|qkv| {
            let (q, k, v) = crate::attention::split_qkv(qkv, n_head);
            flash_attention(q, k, v, None).reshape([batch, len, c])
        }),
        ("fused qkv entry", &|qkv| flash_attention_qkv(qkv, n_head, None).reshape([batch, len, c])),
    ];
    for (name, path) in paths {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let x = qkv.clone().require_grad();
            let start = std::time::Instant::now();
            let g = (path(x.clone()) * w.clone()).sum().backward();
            let dx = x.grad(&g).unwrap().into_data();
            best = best.min(start.elapsed().as_secs_f64());
            drop(dx);
        }
        println!("B={batch} T={len} H={n_head} D={d} {name}: {best:.3} s");
    }
}
