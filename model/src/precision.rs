//! Mixed precision as PyTorch's `torch.autocast` does it for linear layers: inside
//! [`autocast`], every matmul of the model (the linear layers and the LM head, through
//! [`crate::ops::linear::matmul`]) casts its two operands to the low-precision dtype and its
//! result back to f32. Everything else — embeddings, the residual stream, norms and their
//! statistics, attention's softmax, GELU/SwiGLU, the loss — stays in f32, and so do the
//! parameters: they are the f32 master weights, cast at their use. Burn's `cast` is
//! differentiable, so each weight's gradient reaches the optimizer in f32 (NVIDIA's
//! mixed-precision recipe, Micikevicius et al. 2018, minus loss scaling, which is the training
//! loop's job).

use std::cell::Cell;

use burn::tensor::DType;

/// The floating-point mode of a training step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Everything in f32.
    #[default]
    Fp32,
    /// Matmuls in bfloat16 (8-bit mantissa: relative spacing 2⁻⁷ near 1), f32 elsewhere.
    Bf16Mixed,
    /// Matmuls in IEEE half (10-bit mantissa, largest finite 65504), f32 elsewhere; needs loss
    /// scaling against gradient underflow.
    Fp16Mixed,
}

impl Precision {
    /// The dtype matmuls run in: `None` for f32.
    pub fn matmul_dtype(self) -> Option<DType> {
        match self {
            Precision::Fp32 => None,
            Precision::Bf16Mixed => Some(DType::BF16),
            Precision::Fp16Mixed => Some(DType::F16),
        }
    }
}

thread_local! {
    /// The matmul dtype of the [`autocast`] region this thread is in.
    static MATMUL_DTYPE: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Runs `f` with this thread's matmuls in `precision` (nothing changes for
/// [`Precision::Fp32`]), restoring the previous mode afterwards, also when `f` panics. Burn
/// builds the backward of a cast as the cast back, so a backward pass run inside or outside
/// the region gives f32 gradients either way.
pub fn autocast<R>(precision: Precision, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            MATMUL_DTYPE.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(MATMUL_DTYPE.with(|d| d.replace(precision.matmul_dtype())));
    f()
}

/// The dtype this thread's matmuls run in (`None`: f32, outside any low-precision
/// [`autocast`] region).
pub fn matmul_dtype() -> Option<DType> {
    MATMUL_DTYPE.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{DType, Int, Tensor};

    use super::*;
    use crate::ops::linear::matmul;
    use crate::{Decoder, GptConfig};

    type Ad = Autodiff<Flex>;

    /// Hand-computed: 1 + 2⁻⁹ is exact in f32 but rounds to 1 in bfloat16 (spacing 2⁻⁷ near 1)
    /// and is exact in half (spacing 2⁻¹⁰); the product comes back as f32.
    #[test]
    fn matmuls_round_their_operands_to_the_autocast_dtype() {
        let device = Default::default();
        let x = || Tensor::<Ad, 2>::from_floats([[1.0 + 1.0 / 512.0]], &device);
        let w = || Tensor::<Ad, 2>::from_floats([[3.0]], &device);
        let at = |p: Precision| autocast(p, || matmul(x(), w()));
        let f32 = at(Precision::Fp32).into_scalar();
        assert_eq!(f32, 3.0 * (1.0 + 1.0 / 512.0));
        let bf16 = at(Precision::Bf16Mixed);
        assert_eq!(bf16.dtype(), DType::F32);
        assert_eq!(bf16.into_scalar(), 3.0);
        assert_eq!(at(Precision::Fp16Mixed).into_scalar(), f32);
        // Outside any region: f32 again.
        assert_eq!(matmul(x(), w()).into_scalar(), f32);
    }

    /// The region ends with `autocast`, also when its closure panics, and nests.
    #[test]
    fn the_mode_is_restored() {
        autocast(Precision::Bf16Mixed, || {
            assert_eq!(matmul_dtype(), Some(DType::BF16));
            autocast(Precision::Fp32, || assert_eq!(matmul_dtype(), None));
            assert_eq!(matmul_dtype(), Some(DType::BF16));
        });
        assert_eq!(matmul_dtype(), None);
        let caught = std::panic::catch_unwind(|| autocast(Precision::Fp16Mixed, || panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(matmul_dtype(), None);
    }

    /// Every parameter's gradient as f32 values, in visiting order.
    fn grads<M: Module<Ad>>(model: &M, grads: &<Ad as AutodiffBackend>::Gradients) -> Vec<(DType, Vec<f32>)> {
        struct Collect<'a>(&'a <Ad as AutodiffBackend>::Gradients, Vec<(DType, Vec<f32>)>);
        impl ModuleVisitor<Ad> for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
                let g = param.val().grad(self.0).expect("every parameter has a gradient");
                self.1.push((g.dtype(), g.into_data().convert::<f32>().to_vec().unwrap()));
            }
        }
        let mut c = Collect(grads, Vec::new());
        model.visit(&mut c);
        c.1
    }

    /// GPT tiny under bf16-mixed: the parameters stay f32, every gradient arrives in f32, and
    /// logits and gradients are those of f32 up to bfloat16's rounding of the matmul operands
    /// (relative spacing 2⁻⁷ ≈ 0.8%; measured: logits 0.3%, gradients 0.2–1% RMS), not equal.
    #[test]
    fn bf16_mixed_gives_f32_gradients_close_to_fp32() {
        let device = Default::default();
        let model = GptConfig::preset("tiny").unwrap().init::<Ad>(&device).unwrap();
        let tokens = Tensor::<Ad, 2, Int>::from_ints([[1, 5, 9, 13, 2, 7], [3, 3, 8, 60, 11, 0]], &device);
        let run = |p: Precision| {
            let logits = autocast(p, || model.forward(tokens.clone()));
            assert_eq!(logits.dtype(), DType::F32);
            let values = logits.clone().into_data().to_vec::<f32>().unwrap();
            let g = (logits.clone() * logits).mean().backward();
            (values, grads(&model, &g))
        };
        let (l32, g32) = run(Precision::Fp32);
        let (l16, g16) = run(Precision::Bf16Mixed);
        let rel = |a: &[f32], b: &[f32]| {
            let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
            let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
            (d / n).sqrt()
        };
        let logits_rel = rel(&l16, &l32);
        assert!(logits_rel > 1e-5 && logits_rel < 1e-2, "logits {logits_rel}");
        for ((d16, a), (d32, b)) in g16.iter().zip(&g32) {
            assert_eq!((*d16, *d32), (DType::F32, DType::F32));
            let r = rel(a, b);
            assert!(r < 3e-2, "gradient relative difference {r}");
        }
    }
}
