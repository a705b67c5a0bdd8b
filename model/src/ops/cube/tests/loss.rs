//! The cross-entropy kernels vs the composed default on the same wgpu device: the summed NLL
//! and `dlogits`, with ignored rows, a row set that is all `ignore_index`, and large logits.

use burn::tensor::{Int, Tensor, TensorData};

use super::{assert_close, device, host, leaf, AdWgpu};
use crate::ops::cross_entropy_sum;
use crate::ops::loss::composed;
use crate::ops::testing::randn;

const IGNORE: i64 = -100;

/// `(loss, dlogits)` of `cross_entropy_sum·3` on wgpu, fused or composed.
fn run(
    logits: &Tensor<crate::ops::testing::Ad, 2>,
    targets: &[i64],
    fused: bool,
    dev: &burn::backend::wgpu::WgpuDevice,
) -> [Vec<f32>; 2] {
    let x = leaf(logits, dev);
    let t = Tensor::<AdWgpu, 1, Int>::from_data(TensorData::new(targets.to_vec(), [targets.len()]), dev);
    let loss = if fused {
        cross_entropy_sum(x.clone(), t, IGNORE)
    } else {
        composed::cross_entropy_sum(x.clone(), t, IGNORE)
    };
    let grads = (loss.clone() * 3.0).sum().backward();
    [host(loss), host(x.grad(&grads).unwrap())]
}

#[test]
fn cube_cross_entropy_equals_the_composed_default_on_wgpu() {
    let Some(dev) = device("cube_cross_entropy_equals_the_composed_default_on_wgpu") else { return };
    let (rows, vocab) = (67, 301);
    for (scale, what) in [(3.0, "σ=3"), (3000.0, "σ=3000")] {
        let logits = randn([rows, vocab], scale, 31);
        // Every fifth row ignored; targets spread over the vocabulary, the last class included.
        let targets: Vec<i64> = (0..rows)
            .map(|r| if r % 5 == 2 { IGNORE } else { ((r * 37) % vocab) as i64 })
            .chain([])
            .collect();
        let mut targets = targets;
        targets[rows - 1] = vocab as i64 - 1;
        let (fused, reference) = (run(&logits, &targets, true, &dev), run(&logits, &targets, false, &dev));
        assert_close(&format!("loss {what}"), &fused[0], &reference[0], 1e-5, 1e-3);
        assert_close(&format!("dlogits {what}"), &fused[1], &reference[1], 1e-5, 3e-2);
    }
    // Every row ignored: loss 0, dlogits 0.
    let logits = randn([5, 33], 1.0, 32);
    let [loss, dlogits] = run(&logits, &[IGNORE; 5], true, &dev);
    assert_eq!(loss, vec![0.0]);
    assert!(dlogits.iter().all(|&d| d == 0.0), "all-ignored dlogits not 0: {dlogits:?}");
}
