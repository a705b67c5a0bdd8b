//! Host batches (`ember_data::Batch`) to device tensors.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use ember_data::Batch;

/// `(inputs, targets)`, both `[batch_size, seq_len]` Int tensors on `device`; targets keep
/// `ignore_index` (−100) where a position is not scored.
pub fn to_tensors<B: Backend>(batch: &Batch, device: &B::Device) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
    let shape = [batch.batch_size, batch.seq_len];
    let inputs: Vec<i32> = batch.inputs.iter().map(|&t| t as i32).collect();
    (
        Tensor::from_data(TensorData::new(inputs, shape), device),
        Tensor::from_data(TensorData::new(batch.targets.clone(), shape), device),
    )
}
