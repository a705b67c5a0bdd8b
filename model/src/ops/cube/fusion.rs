//! Ember's CubeCL kernels on Burn's fusion backend (`Fusion<CubeBackend<R, ..>>`, what
//! `burn::backend::Wgpu` and `burn::backend::Cuda` are): each kernel call is registered on the
//! fusion stream as one custom operation (Burn's `OperationIr::Custom` route, as burn-vision's
//! cube ops use it), so it runs in order with the tensor ops around it. When the stream reaches
//! it, the inputs are resolved into the inner backend's tensors, the inner backend's fused op
//! runs (the `CubeBackend` kernels), and its outputs are bound to the ids handed out here.

use std::marker::PhantomData;
use std::sync::Arc;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};

/// The fusion runtime's tensor handle of the inner backend `B`.
type Handle<B> = <<B as FusionBackend>::FusionRuntime as FusionRuntime>::FusionHandle;

/// The inputs of a custom operation as the inner backend's tensors, in registration order.
pub struct Inputs<'a, B: FusionBackend> {
    handles: &'a mut HandleContainer<Handle<B>>,
    irs: &'a [TensorIr],
}

impl<B: FusionBackend> Inputs<'_, B> {
    /// Input `i` as a float tensor of `B`.
    pub fn float(&mut self, i: usize) -> FloatTensor<B> {
        self.handles.get_float_tensor::<B>(&self.irs[i])
    }

    /// Input `i` as an int tensor of `B`.
    pub fn int(&mut self, i: usize) -> IntTensor<B> {
        self.handles.get_int_tensor::<B>(&self.irs[i])
    }
}

/// What runs when the stream reaches the operation: the inner backend's op on the resolved
/// inputs, returning the outputs in the order they were declared.
type Run<B> = dyn Fn(&mut Inputs<'_, B>) -> Vec<FloatTensor<B>> + Send + Sync;

/// One registered custom operation.
struct Custom<B: FusionBackend> {
    desc: CustomOpIr,
    run: Arc<Run<B>>,
    _backend: PhantomData<B>,
}

impl<B: FusionBackend> std::fmt::Debug for Custom<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ember::{}", self.desc.id)
    }
}

impl<B: FusionBackend> Operation<B::FusionRuntime> for Custom<B> {
    fn execute(&self, handles: &mut HandleContainer<Handle<B>>) {
        let outputs = {
            let mut inputs = Inputs::<B> { handles, irs: &self.desc.inputs };
            (self.run)(&mut inputs)
        };
        assert_eq!(outputs.len(), self.desc.outputs.len(), "{}: wrong number of outputs", self.desc.id);
        for (ir, tensor) in self.desc.outputs.iter().zip(outputs) {
            handles.register_float_tensor::<B>(&ir.id, tensor);
        }
    }
}

/// Registers `run` as the custom operation `name` on the stream of `inputs` (float or int
/// tensors of `Fusion<B>`), declaring float outputs of the given shapes and dtypes, and returns
/// the outputs (computed lazily, in stream order, like every fusion op).
///
/// # Panics
/// If `inputs` is empty (the operation needs a stream and a client), or, when the stream runs,
/// if `run` returns a number of outputs other than `outputs.len()`.
pub fn custom_op<B: FusionBackend>(
    name: &'static str,
    inputs: Vec<FusionTensor<B::FusionRuntime>>,
    outputs: Vec<(Shape, DType)>,
    run: impl Fn(&mut Inputs<'_, B>) -> Vec<FloatTensor<B>> + Send + Sync + 'static,
) -> Vec<FusionTensor<B::FusionRuntime>> {
    let client = inputs.first().expect("custom_op: no input").client.clone();
    let streams = OperationStreams::with_inputs(&inputs);
    let outputs: Vec<TensorIr> = outputs
        .into_iter()
        .map(|(shape, dtype)| TensorIr::uninit(client.create_empty_handle(), shape, dtype))
        .collect();
    let inputs: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(name, &inputs, &outputs);
    let op = Custom::<B> { desc: desc.clone(), run: Arc::new(run), _backend: PhantomData };
    client.register(streams, OperationIr::Custom(desc), op)
}
