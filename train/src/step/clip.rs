//! Passes over every gradient tensor between backward and AdamW: scaling by `1 / scored tokens`
//! and global-norm clipping. On burn-flex the tensors are processed in parallel (one tensor per
//! task, each with Burn's own ops, so the values equal the one-at-a-time loop bit for bit);
//! other backends queue them one after another as before.

use burn::backend::Flex;
use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};
use ember_model::ops::dispatch::is;
use rayon::prelude::*;

/// Clips the gradient by its *global* L2 norm over all parameters jointly (Pascanu et al.
/// 2013, Algorithm 1; PyTorch `clip_grad_norm_`): with `n = ‖g‖₂` over every tensor,
/// every gradient is scaled by `min(1, max_norm / (n + 1e-6))`. `max_norm ≤ 0` only measures.
///
/// `n² = Σ_tensors Σ g²` in f32: each tensor's sum is Burn's `square().sum()`, and the
/// per-tensor sums are added in module order, whatever the number of threads.
///
/// Returns the pre-clip norm `n` as a `[1]` tensor (no host sync). Burn's own
/// `GradientClipping::Norm` clips each tensor by its own norm, which is a different update.
pub fn clip_grad_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: f64,
) -> Tensor<B::InnerBackend, 1> {
    let sums = for_each_grad(module, grads, &SumOfSquares);
    let norm = match sums.into_iter().reduce(|total, sq| total + sq) {
        Some(total) => total.sqrt(),
        None => Tensor::zeros([1], &Default::default()),
    };
    if max_norm > 0.0 {
        let coef = (norm.clone().add_scalar(1e-6).recip() * max_norm).clamp_max(1.0);
        for_each_grad(module, grads, &Scale(coef));
    }
    norm
}

/// Multiplies every gradient by `factor` (e.g. `1 / scored tokens`), as Burn's `mul_scalar`.
pub fn scale_grads<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    factor: f64,
) {
    for_each_grad(module, grads, &MulScalar(factor));
}

/// One operation on a gradient tensor of any rank: returns the gradient to keep in its place
/// (`None` drops it) and a per-tensor result.
trait GradOp<B: Backend>: Sync {
    /// The per-tensor result.
    type Out: Send;
    /// Applies the operation to one parameter's gradient.
    fn apply<const D: usize>(&self, grad: Tensor<B, D>) -> (Option<Tensor<B, D>>, Self::Out);
}

/// `Σ g²` of one tensor, in f32, as a `[1]` tensor.
struct SumOfSquares;

impl<B: Backend> GradOp<B> for SumOfSquares {
    type Out = Tensor<B, 1>;
    fn apply<const D: usize>(&self, grad: Tensor<B, D>) -> (Option<Tensor<B, D>>, Tensor<B, 1>) {
        let sq = grad.clone().cast(DType::F32).square().sum();
        (Some(grad), sq)
    }
}

/// `g · coef` with `coef` a `[1]` tensor (no host sync).
struct Scale<B: Backend>(Tensor<B, 1>);

impl<B: Backend> GradOp<B> for Scale<B> {
    type Out = ();
    fn apply<const D: usize>(&self, grad: Tensor<B, D>) -> (Option<Tensor<B, D>>, ()) {
        let coef = self.0.clone().to_device(&grad.device()).cast(grad.dtype()).reshape([1; D]);
        (Some(grad * coef), ())
    }
}

/// `g · factor`.
struct MulScalar(f64);

impl<B: Backend> GradOp<B> for MulScalar {
    type Out = ();
    fn apply<const D: usize>(&self, grad: Tensor<B, D>) -> (Option<Tensor<B, D>>, ()) {
        (Some(grad.mul_scalar(self.0)), ())
    }
}

/// Puts a processed gradient back.
type Register = Box<dyn FnOnce(&mut GradientsParams) + Send>;
/// The work for one parameter's gradient.
type Job<'a, T> = Box<dyn FnOnce() -> (Register, T) + Send + 'a>;

/// Applies `op` to every parameter's gradient and returns the results in module order
/// (parameters without a gradient are skipped). burn-flex: one rayon task per tensor.
fn for_each_grad<B, M, O>(module: &M, grads: &mut GradientsParams, op: &O) -> Vec<O::Out>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: GradOp<B::InnerBackend>,
{
    let mut collect = Collect::<B, O> { grads, op, jobs: Vec::new() };
    module.visit(&mut collect);
    let jobs = collect.jobs;
    let done: Vec<(Register, O::Out)> = if is::<B::InnerBackend, Flex>() {
        jobs.into_par_iter().map(|job| job()).collect()
    } else {
        jobs.into_iter().map(|job| job()).collect()
    };
    done.into_iter()
        .map(|(register, out)| {
            register(grads);
            out
        })
        .collect()
}

/// Takes each gradient out of `grads` and wraps it, with `op`, into a [`Job`].
struct Collect<'g, 'o, B: AutodiffBackend, O: GradOp<B::InnerBackend>> {
    grads: &'g mut GradientsParams,
    op: &'o O,
    jobs: Vec<Job<'o, O::Out>>,
}

impl<'o, B: AutodiffBackend, O: GradOp<B::InnerBackend>> ModuleVisitor<B> for Collect<'_, 'o, B, O> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let id: ParamId = param.id;
        if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(id) {
            let op = self.op;
            self.jobs.push(Box::new(move || {
                let (grad, out) = op.apply(grad);
                let register: Register = Box::new(move |grads: &mut GradientsParams| {
                    if let Some(grad) = grad {
                        grads.register(id, grad);
                    }
                });
                (register, out)
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::optim::GradientsParams;
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};

    use super::*;

    type Ad = Autodiff<Flex>;

    /// Tensors of ranks 1 to 3, one larger than a parallel chunk.
    #[derive(Module, Debug)]
    struct Mixed<B: Backend> {
        big: Param<Tensor<B, 2>>,
        cube: Param<Tensor<B, 3>>,
        bias: Param<Tensor<B, 1>>,
        frozen: Param<Tensor<B, 1>>,
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        // A fixed, irregular sequence in [-1, 1): no two tensors alike.
        (0..n as u32)
            .map(|i| ((i.wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    fn param<const D: usize>(shape: [usize; D], seed: u32) -> Param<Tensor<Ad, D>> {
        let n = shape.iter().product();
        Param::from_tensor(Tensor::from_data(TensorData::new(values(n, seed), shape), &Default::default()))
    }

    fn model() -> Mixed<Ad> {
        Mixed {
            big: param([257, 301], 1),
            cube: param([3, 5, 7], 2),
            bias: param([11], 3),
            frozen: param([4], 4),
        }
    }

    /// Gradients for every parameter but `frozen`, scaled by `scale`.
    fn grads(model: &Mixed<Ad>, scale: f32) -> GradientsParams {
        let mut g = GradientsParams::new();
        let t = |n: usize, seed: u32| values(n, seed + 10).into_iter().map(|v| v * scale).collect::<Vec<_>>();
        let device = Default::default();
        g.register(
            model.big.id,
            Tensor::<Flex, 2>::from_data(TensorData::new(t(257 * 301, 1), [257, 301]), &device),
        );
        g.register(
            model.cube.id,
            Tensor::<Flex, 3>::from_data(TensorData::new(t(105, 2), [3, 5, 7]), &device),
        );
        g.register(model.bias.id, Tensor::<Flex, 1>::from_data(TensorData::new(t(11, 3), [11]), &device));
        g
    }

    /// Every gradient's values as bits, in module order (`None` where there is none).
    fn grad_bits(model: &Mixed<Ad>, grads: &GradientsParams) -> Vec<Option<Vec<u32>>> {
        struct Bits<'a>(&'a GradientsParams, Vec<Option<Vec<u32>>>);
        impl ModuleVisitor<Ad> for Bits<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
                let g = self.0.get::<Flex, D>(param.id);
                self.1.push(
                    g.map(|g| g.into_data().to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect()),
                );
            }
        }
        let mut bits = Bits(grads, Vec::new());
        model.visit(&mut bits);
        bits.1
    }

    /// The one-tensor-at-a-time loop the parallel passes replace, with Burn's ops in module
    /// order: `g · factor`, `n = √Σ_tensors sum(g²)`, then `g · min(1, max_norm / (n + 1e-6))`.
    fn sequential(model: &Mixed<Ad>, grads: &mut GradientsParams, factor: f64, max_norm: f64) -> f32 {
        // `$f` applied to each parameter's gradient, in module order.
        macro_rules! each {
            ($f:expr) => {{
                if let Some(t) = grads.remove::<Flex, 2>(model.big.id) {
                    grads.register(model.big.id, $f(t));
                }
                if let Some(t) = grads.remove::<Flex, 3>(model.cube.id) {
                    grads.register(model.cube.id, $f(t));
                }
                if let Some(t) = grads.remove::<Flex, 1>(model.bias.id) {
                    grads.register(model.bias.id, $f(t));
                }
                if let Some(t) = grads.remove::<Flex, 1>(model.frozen.id) {
                    grads.register(model.frozen.id, $f(t));
                }
            }};
        }
        each!(|t: Tensor<Flex, _>| t.mul_scalar(factor));
        let total = [
            grads.get::<Flex, 2>(model.big.id).map(|t| t.square().sum()),
            grads.get::<Flex, 3>(model.cube.id).map(|t| t.square().sum()),
            grads.get::<Flex, 1>(model.bias.id).map(|t| t.square().sum()),
        ]
        .into_iter()
        .flatten()
        .reduce(|a, b| a + b)
        .unwrap();
        let norm = total.sqrt();
        let coef: Tensor<Flex, 1> = (norm.clone().add_scalar(1e-6).recip() * max_norm).clamp_max(1.0);
        each!(|t: Tensor<Flex, _>| t * coef.clone().reshape([1; _]));
        norm.into_scalar()
    }

    /// On burn-flex the passes run in parallel over tensors; the norm and every scaled and
    /// clipped gradient equal the sequential loop bit for bit, and a parameter without a
    /// gradient stays without one.
    #[test]
    fn parallel_passes_equal_the_sequential_loop() {
        let model = model();
        for max_norm in [0.5, 1e9] {
            let (mut fast, mut slow) = (grads(&model, 3.0), grads(&model, 3.0));
            scale_grads(&model, &mut fast, 1.0 / 7.0);
            let norm = clip_grad_norm(&model, &mut fast, max_norm).into_scalar();
            let want = sequential(&model, &mut slow, 1.0 / 7.0, max_norm);
            assert_eq!(norm.to_bits(), want.to_bits(), "norm {norm} vs {want}");
            assert_eq!(grad_bits(&model, &fast), grad_bits(&model, &slow), "max_norm {max_norm}");
            assert!(grad_bits(&model, &fast)[3].is_none());
        }
    }

    /// Hand-computed: gradients (3, 4) and (12) have norm 13; clipped to 6.5 they halve.
    #[test]
    fn hand_computed_norm_and_clip() {
        #[derive(Module, Debug)]
        struct Two<B: Backend> {
            a: Param<Tensor<B, 1>>,
            b: Param<Tensor<B, 1>>,
        }
        let device = Default::default();
        let p = |v: &[f32]| Param::from_tensor(Tensor::<Ad, 1>::from_floats(v, &device));
        let model = Two { a: p(&[0.0, 0.0]), b: p(&[0.0]) };
        let mut g = GradientsParams::new();
        g.register(model.a.id, Tensor::<Flex, 1>::from_floats([3.0, 4.0], &device));
        g.register(model.b.id, Tensor::<Flex, 1>::from_floats([12.0], &device));
        let norm = clip_grad_norm(&model, &mut g, 6.5).into_scalar();
        assert_eq!(norm, 13.0);
        let a = g.get::<Flex, 1>(model.a.id).unwrap().into_data().to_vec::<f32>().unwrap();
        let b = g.get::<Flex, 1>(model.b.id).unwrap().into_data().to_vec::<f32>().unwrap();
        // coef = 6.5 / (13 + 1e-6) in f32.
        let coef = (1.0f32 / (13.0f32 + 1e-6)) * 6.5;
        assert_eq!(a, vec![3.0 * coef, 4.0 * coef]);
        assert_eq!(b, vec![12.0 * coef]);
        assert!((a[0] - 1.5).abs() < 1e-6 && (b[0] - 6.0).abs() < 1e-6);
        // max_norm 0 only measures.
        let norm = clip_grad_norm(&model, &mut g, 0.0).into_scalar();
        assert!((norm - 6.5).abs() < 1e-5);
        assert_eq!(g.get::<Flex, 1>(model.b.id).unwrap().into_data().to_vec::<f32>().unwrap(), b);
    }
}
