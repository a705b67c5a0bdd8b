//! Vectorized loops for the Flex kernels: a run-time choice of AVX-512 / AVX2+FMA code, and
//! `exp`, `erfc` and `tanh` written so the compiler vectorizes them (no table lookups, no
//! branches: both sides of a choice are computed and one is selected).

/// Runs `f` inside a function compiled with AVX-512 (or AVX2 and FMA) enabled when this CPU
/// has them, so the loops inlined into it use those instructions; otherwise runs it as is.
/// Mark the closure `#[inline(always)]` (and the kernels it calls), or it is not inlined into
/// the wide function and runs with the baseline instructions. Do not start rayon work inside:
/// rayon's jobs are separate functions; split the work first, then vectorize each chunk.
#[inline(always)]
pub fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports the features the function is compiled with.
            return unsafe { avx512(f) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,bmi2")]
unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,bmi2")]
unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in a part exact in f32 and the rest (Cody & Waite), for the range reduction.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding and subtracting 1.5·2²³ rounds an f32 of magnitude < 2²² to the nearest integer.
const ROUND: f32 = 12_582_912.0;

/// `eᵡ` to about 2 ulp (Cephes `expf`: `x = n·ln 2 + r`, a degree-6 polynomial for `eʳ`, `2ⁿ`
/// from the exponent bits). Below −87.3 it returns 0 (so `exp(−∞) = 0`, as a masked softmax
/// needs); above 88.3 it saturates at `e^88.3 ≈ 2·10³⁸`; NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let xc = x.clamp(-87.3, 88.3);
    let t = xc * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes' 5.0000001201e-1 rounds to 0.5 in f32
    let er = p * r * r + r + 1.0;
    // t = 1.5·2²³ + n lies in [2²³, 2²⁴), where one unit is one step of the mantissa: its bits
    // minus those of 1.5·2²³ are n (an integer op that vectorizes, unlike `as i32`, whose
    // saturating conversion compiles to one scalar instruction per lane).
    let ni = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let scale = f32::from_bits(((ni + 127) << 23) as u32);
    let y = er * scale;
    if x < -87.3 {
        0.0
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// `erfc(z)` for `z ≥ 0` with a relative error below 3·10⁻⁷ everywhere, the tail included
/// (Numerical Recipes §6.2 `erfcc`, a Chebyshev fit with fractional error < 1.2·10⁻⁷, times
/// [`exp`]'s error).
#[inline(always)]
pub fn erfc_pos(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = 0.170_872_77f32;
    p = p * t - 0.822_152_23;
    p = p * t + 1.488_515_9;
    p = p * t - 1.135_204; // 1.13520398 to f32
    p = p * t + 0.278_868_07;
    p = p * t - 0.186_288_06;
    p = p * t + 0.096_784_18;
    p = p * t + 0.374_091_96;
    p = p * t + 1.000_023_7;
    p = p * t - 1.265_512_2;
    t * exp(p - z * z)
}

/// The standard normal CDF `Φ(x) = ½·erfc(−x/√2)`, accurate in relative terms in the lower
/// tail (where GELU's output is tiny) and in absolute terms (≈10⁻⁷) elsewhere.
#[inline(always)]
pub fn normal_cdf(x: f32) -> f32 {
    let half_tail = 0.5 * erfc_pos(x.abs() * std::f32::consts::FRAC_1_SQRT_2);
    if x < 0.0 {
        half_tail
    } else {
        1.0 - half_tail
    }
}

/// `tanh(u) = sign(u)·(1 − 2/(e^{2|u|} + 1))`: absolute error ≈ 10⁻⁷.
#[inline(always)]
pub fn tanh(u: f32) -> f32 {
    let t = 1.0 - 2.0 / (exp(2.0 * u.abs()) + 1.0);
    if u < 0.0 {
        -t
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn erfc64(x: f64) -> f64 {
        // erfc by its continued fraction / series is not in std: integrate the tail numerically
        // with Simpson's rule (reference only).
        let upper = x.max(0.0) + 12.0;
        let n = 200_000;
        let h = (upper - x) / n as f64;
        let f = |t: f64| (-t * t).exp();
        let mut s = f(x) + f(upper);
        for i in 1..n {
            s += f(x + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn exp_matches_std_to_a_few_ulp() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (got, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn erfc_has_small_relative_error_in_the_tail() {
        // Far in the tail the f32 argument of exp (−z², ulp 4·10⁻⁶ at z = 6) limits the
        // accuracy; there Φ(−z·√2) < 10⁻¹⁶ and GELU's output is 0 to f32 anyway.
        for &(z, tol) in &[
            (0.0f64, 5e-7),
            (0.1, 5e-7),
            (0.5, 5e-7),
            (0.9, 5e-7),
            (1.5, 5e-7),
            (2.5, 5e-7),
            (4.0, 3e-6),
            (6.0, 5e-6),
        ] {
            let (got, want) = (erfc_pos(z as f32) as f64, erfc64(z));
            assert!(((got - want) / want).abs() < tol, "erfc({z}) = {got}, expected {want}");
        }
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        // Φ(−5) = 2.866515718791939e-7 (tables).
        assert!(((normal_cdf(-5.0) as f64 - 2.866_515_718_791_939e-7) / 2.866e-7).abs() < 5e-7);
    }

    #[test]
    fn tanh_matches_std() {
        let mut u = -12.0f32;
        while u < 12.0 {
            assert!((tanh(u) - u.tanh()).abs() < 2e-7, "tanh({u})");
            u += 0.0123;
        }
    }

    #[test]
    fn vectorized_runs_the_closure() {
        let v: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01).collect();
        let s = vectorized(
            #[inline(always)]
            || v.iter().map(|&x| exp(-x)).sum::<f32>(),
        );
        let want: f32 = v.iter().map(|&x| (-x).exp()).sum();
        assert!((s - want).abs() < 1e-4 * want);
    }
}
