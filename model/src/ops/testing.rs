//! Test helpers shared by the fused ops' tests: random tensors and close-enough comparisons.

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Distribution, Tensor};

/// The autodiff CPU backend the tests differentiate on.
pub type Ad = Autodiff<Flex>;

/// burn-flex has one global RNG. The unit tests that seed it and draw from it hold this lock
/// (`randn` for its seed-and-draw, the model tests for their whole run), so a test running
/// beside them cannot change what they draw.
pub static TEST_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A tensor of `shape` with N(0, std²) entries from a fixed seed (the same tensor whatever
/// other tests draw meanwhile).
pub fn randn<const D: usize>(shape: [usize; D], std: f64, seed: u64) -> Tensor<Ad, D> {
    let _tests = TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
    let _masks = crate::dropout::seeded_draws();
    <Flex as burn::tensor::backend::Backend>::seed(&Default::default(), seed);
    Tensor::random(shape, Distribution::Normal(0.0, std), &Default::default())
}

/// Asserts `|got − want| ≤ rel · max(|want|, floor)` element-wise, naming `what` and the worst
/// element. `floor` keeps elements near 0 from demanding more than f32 can give: below it the
/// bound is absolute (`rel · floor`); the tests use 1e-2, i.e. 1e-7 absolute near zero, where
/// e.g. Burn's `erf` rounds `GELU(−6)` to −0 while the fused kernel gives −6·Φ(−6) = −6·10⁻⁹.
pub fn assert_close<const D: usize, B: burn::tensor::backend::Backend>(
    what: &str,
    got: Tensor<B, D>,
    want: Tensor<B, D>,
    rel: f32,
    floor: f32,
) {
    assert_eq!(got.dims(), want.dims(), "{what}: shapes differ");
    let got = got.into_data().to_vec::<f32>().unwrap();
    let want = want.into_data().to_vec::<f32>().unwrap();
    let mut worst = (0usize, 0f32);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let err = (g - w).abs() / w.abs().max(floor);
        assert!(!err.is_nan() || (g.is_nan() && w.is_nan()), "{what}[{i}]: {g} vs {w}");
        if err > worst.1 {
            worst = (i, err);
        }
    }
    let i = worst.0;
    assert!(
        worst.1 <= rel,
        "{what}[{i}]: {} vs {} (relative error {:e} > {rel:e})",
        got[i],
        want[i],
        worst.1
    );
}
