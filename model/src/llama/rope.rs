//! Rotary position embeddings in the Hugging Face layout (`rotate_half`).

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// `cos` and `sin` tables `[rows, len, 1, d_head]` for `positions` (`[rows, len]`; `rows` is
/// the batch, or 1 for positions shared by every row) (Su et al. 2021, RoFormer eq. 34;
/// Hugging Face `LlamaRotaryEmbedding`): `inv_freq[j] = 1 / θ^(2j/d_head)`, angle
/// `p·inv_freq[j]`, the `d_head/2` angles repeated twice (`cat(freqs, freqs)`), in f32 as the
/// reference computes them.
pub fn rope_tables<B: Backend>(
    positions: Tensor<B, 2, Int>,
    d_head: usize,
    theta: f64,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let half = d_head / 2;
    let inv_freq: Vec<f32> =
        (0..d_head).map(|j| 1.0 / (theta as f32).powf((2 * (j % half)) as f32 / d_head as f32)).collect();
    let device = positions.device();
    let inv_freq = Tensor::<B, 3>::from_data(TensorData::new(inv_freq, [1, 1, d_head]), &device);
    let angles = positions.float().unsqueeze_dim::<3>(2) * inv_freq; // [rows, len, d_head]
    (angles.clone().cos().unsqueeze_dim(2), angles.sin().unsqueeze_dim(2))
}

/// Applies RoPE to `x` `[batch, len, heads, d_head]` (tables `[batch or 1, len, 1, d_head]`,
/// broadcast over the heads): `x·cos + rotate_half(x)·sin`, where
/// `rotate_half([x₁, x₂]) = [−x₂, x₁]` over the two halves of the head. This is Hugging
/// Face's layout; Burn's `RotaryEncoding` rotates interleaved pairs `(x₀, x₁), (x₂, x₃)…`,
/// which gives different results on the same weights.
pub fn apply_rope<B: Backend>(x: Tensor<B, 4>, cos: Tensor<B, 4>, sin: Tensor<B, 4>) -> Tensor<B, 4> {
    let [batch, len, heads, d_head] = x.dims();
    let half = d_head / 2;
    let x1 = x.clone().slice([0..batch, 0..len, 0..heads, 0..half]);
    let x2 = x.clone().slice([0..batch, 0..len, 0..heads, half..d_head]);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    x * cos + rotated * sin
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn rotate_half_layout_on_a_hand_example() {
        // d_head 4, θ = 10000: inv_freq = [1, 0.01]; at position 1 the angles are [1, 0.01, 1, 0.01].
        let device = Default::default();
        let (cos, sin) = rope_tables::<Flex>(Tensor::from_ints([[1]], &device), 4, 10000.0);
        let x = Tensor::<Flex, 4>::from_floats([[[[1.0, 2.0, 3.0, 4.0]]]], &device);
        let y: Vec<f32> = apply_rope(x, cos, sin).into_data().to_vec().unwrap();
        let (c1, s1, c2, s2) = (1f32.cos(), 1f32.sin(), 0.01f32.cos(), 0.01f32.sin());
        // [x0·c − x2·s, x1·c' − x3·s', x2·c + x0·s, x3·c' + x1·s']
        let want = [1.0 * c1 - 3.0 * s1, 2.0 * c2 - 4.0 * s2, 3.0 * c1 + 1.0 * s1, 4.0 * c2 + 2.0 * s2];
        for (a, b) in y.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{y:?} vs {want:?}");
        }
    }

    #[test]
    fn position_zero_is_the_identity() {
        let device = Default::default();
        let (cos, sin) = rope_tables::<Flex>(Tensor::from_ints([[0]], &device), 6, 10000.0);
        let x = Tensor::<Flex, 4>::from_floats([[[[1.0, -2.0, 3.0, 0.5, 7.0, -1.0]]]], &device);
        assert_eq!(apply_rope(x.clone(), cos, sin).into_data(), x.into_data());
    }
}
