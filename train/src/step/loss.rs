//! Next-token cross-entropy as a token sum, so the caller can divide by the scored-token
//! count of the whole global batch.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};
use ember_data::IGNORE_INDEX;
use ember_model::ops::cross_entropy_sum;

/// Σ −log p(target) over scored positions, in nats: `logits` `[batch, seq_len, vocab]`,
/// `targets` `[batch, seq_len]` (ids, or [`IGNORE_INDEX`] for positions that are not scored).
/// Returns a `[1]` tensor.
///
/// Log-softmax runs in f32 whatever the model's dtype. Ignored positions contribute exactly 0
/// (and, to the caller, are not counted). The mean is *not* taken here: Burn 0.21's
/// `CrossEntropyLoss` divides by all positions, pads included, which biases the loss low and
/// makes accumulated gradients differ from the full batch's. Divide by the number of scored
/// tokens of the global batch instead (PyTorch: `F.cross_entropy(..., ignore_index=-100,
/// reduction="sum")`).
///
/// Computed by [`cross_entropy_sum`] (fused on Flex and under autodiff: no `[N, V]`
/// log-softmax is built or kept; only each position's log-sum-exp is saved for the backward).
pub fn nll_sum<B: Backend>(logits: Tensor<B, 3>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
    let [batch, seq_len, vocab] = logits.dims();
    let n = batch * seq_len;
    cross_entropy_sum(logits.reshape([n, vocab]), targets.reshape([n]), i64::from(IGNORE_INDEX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    type B = Flex;

    fn logits(values: Vec<f32>, shape: [usize; 3]) -> Tensor<B, 3> {
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }

    fn targets(values: Vec<i32>, shape: [usize; 2]) -> Tensor<B, 2, Int> {
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }

    #[test]
    fn uniform_logits_cost_ln_vocab_per_token() {
        let nll = nll_sum(logits(vec![0.0; 2 * 3 * 5], [2, 3, 5]), targets(vec![0, 1, 2, 3, 4, 0], [2, 3]));
        let expected = 6.0 * (5f32).ln();
        assert!((nll.into_scalar() - expected).abs() < 1e-5);
    }

    #[test]
    fn hand_computed_two_class_loss() {
        // logits [0, ln 3]: p = [1/4, 3/4]. Targets 1 and 0: −ln(3/4) − ln(1/4) = ln(16/3).
        let nll =
            nll_sum(logits(vec![0.0, 3f32.ln(), 0.0, 3f32.ln()], [1, 2, 2]), targets(vec![1, 0], [1, 2]));
        assert!((nll.into_scalar() - (16.0f32 / 3.0).ln()).abs() < 1e-6);
    }

    #[test]
    fn ignored_positions_contribute_nothing() {
        let l = logits(vec![0.3, -1.0, 2.0, 0.5, 0.1, 0.2], [1, 2, 3]);
        let all = nll_sum(l.clone(), targets(vec![2, IGNORE_INDEX], [1, 2])).into_scalar();
        let first_only = nll_sum(l.slice([0..1, 0..1, 0..3]), targets(vec![2], [1, 1])).into_scalar();
        assert_eq!(all, first_only);
    }
}
