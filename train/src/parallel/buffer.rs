//! The gradients of a model as one flat buffer and back: what one all-reduce carries.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use ember_model::LanguageModel;

/// Every gradient of `model`, flattened in module order and concatenated: `[num_params]`.
pub(crate) fn flatten<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    grads: &GradientsParams,
) -> Tensor<B::InnerBackend, 1> {
    struct Flatten<'a, B: AutodiffBackend>(&'a GradientsParams, Vec<Tensor<B::InnerBackend, 1>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let grad = self
                .0
                .get::<B::InnerBackend, D>(param.id)
                .unwrap_or_else(|| Tensor::zeros(param.lazy_shape(), &param.lazy_device()));
            let numel = grad.shape().num_elements();
            self.1.push(grad.reshape([numel]));
        }
    }
    let mut visitor = Flatten::<B>(grads, Vec::new());
    model.visit(&mut visitor);
    Tensor::cat(visitor.1, 0)
}

/// The inverse of [`flatten`]: `flat` (`[num_params]`) cut back into every parameter's
/// gradient.
pub(crate) fn unflatten<B: AutodiffBackend>(
    model: &LanguageModel<B>,
    flat: Tensor<B::InnerBackend, 1>,
) -> GradientsParams {
    struct Unflatten<B: AutodiffBackend> {
        flat: Tensor<B::InnerBackend, 1>,
        offset: usize,
        grads: GradientsParams,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let shape = param.lazy_shape();
            let numel = shape.num_elements();
            let piece = self.flat.clone().slice(self.offset..self.offset + numel).reshape(shape);
            self.offset += numel;
            let id: ParamId = param.id;
            self.grads.register::<B::InnerBackend, D>(id, piece);
        }
    }
    let mut visitor = Unflatten::<B> { flat, offset: 0, grads: GradientsParams::new() };
    model.visit(&mut visitor);
    visitor.grads
}
