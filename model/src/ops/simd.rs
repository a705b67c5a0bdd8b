//! Vectorized loops for the Flex kernels: a run-time choice of AVX-512 / AVX2+FMA code, and
//! `exp`, `erfc` and `tanh` written so the compiler vectorizes them (no table lookups, no
//! branches: both sides of a choice are computed and one is selected).

/// How a vectorized loop rounds `a·b + c`. Rust never contracts `a * b + c` into a fused
/// multiply-add by itself (it would change the rounding), so the polynomials below ask for it
/// through [`Madd::madd`]: [`vectorized`] passes [`Madd::Fused`] where the code is compiled
/// with FMA (AVX2+FMA, AVX-512; always on aarch64) — a third fewer instructions for GELU's
/// erf and the softmax `exp`, which are bound by arithmetic — and [`Madd::Separate`] elsewhere,
/// where `f32::mul_add` would be a slow libm call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Madd {
    /// One fused multiply-add, rounded once.
    Fused,
    /// The product rounded, then the sum rounded.
    Separate,
}

impl Madd {
    /// The mode of code compiled for the target's baseline instructions: fused where the
    /// baseline has FMA (aarch64), else separate.
    pub const BASELINE: Madd = if cfg!(target_arch = "aarch64") { Madd::Fused } else { Madd::Separate };

    /// `a·b + c`, rounded once ([`Madd::Fused`]) or twice ([`Madd::Separate`]). The match is
    /// resolved at compile time wherever the mode is a constant (inside [`vectorized`]).
    #[inline(always)]
    pub fn madd(self, a: f32, b: f32, c: f32) -> f32 {
        match self {
            Madd::Fused => a.mul_add(b, c),
            Madd::Separate => a * b + c,
        }
    }
}

/// Runs `f` inside a function compiled with AVX-512 (or AVX2 and FMA) enabled when this CPU
/// has them, so the loops inlined into it use those instructions; otherwise runs it as is.
/// `f` receives the [`Madd`] mode those instructions make fast (a constant there, so its
/// `match` disappears). Mark the closure `#[inline(always)]` (and the kernels it calls), or it
/// is not inlined into the wide function and runs with the baseline instructions. Do not start
/// rayon work inside: rayon's jobs are separate functions; split the work first, then
/// vectorize each chunk.
#[inline(always)]
pub fn vectorized<R>(f: impl FnOnce(Madd) -> R) -> R {
    match wide_instructions() {
        // SAFETY: the CPU supports the features the function is compiled with.
        #[cfg(target_arch = "x86_64")]
        Some(Wide::Avx512) => unsafe { avx512(f) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Some(Wide::Avx2) => unsafe { avx2(f) },
        _ => f(Madd::BASELINE),
    }
}

/// The wide x86 instruction sets the Flex kernels are compiled for (with `#[target_feature]`
/// functions), each with every feature those functions enable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wide {
    /// AVX-512F, AVX-512VL, AVX2, FMA and BMI2.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2, FMA and BMI2.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// The widest [`Wide`] set this CPU has (detected at run time; `std` caches the answer), or
/// `None` (other CPUs and architectures: the kernels run with the baseline instructions).
#[inline(always)]
pub fn wide_instructions() -> Option<Wide> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512vl") && has!("avx2") && has!("fma") && has!("bmi2") {
            return Some(Wide::Avx512);
        }
        if has!("avx2") && has!("fma") && has!("bmi2") {
            return Some(Wide::Avx2);
        }
    }
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,bmi2")]
unsafe fn avx512<R>(f: impl FnOnce(Madd) -> R) -> R {
    f(Madd::Fused)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,bmi2")]
unsafe fn avx2<R>(f: impl FnOnce(Madd) -> R) -> R {
    f(Madd::Fused)
}

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in a part exact in f32 and the rest (Cody & Waite), for the range reduction.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Adding and subtracting 1.5·2²³ rounds an f32 of magnitude < 2²² to the nearest integer.
const ROUND: f32 = 12_582_912.0;

/// `eᵡ` to about 2 ulp (Cephes `expf`: `x = n·ln 2 + r`, a degree-6 polynomial for `eʳ`, `2ⁿ`
/// from the exponent bits), its multiply-adds rounded as `ma` says. Below −87.3 it returns 0
/// (so `exp(−∞) = 0`, as a masked softmax needs); above 88.3 it saturates at
/// `e^88.3 ≈ 2·10³⁸`; NaN stays NaN.
#[inline(always)]
pub fn exp(ma: Madd, x: f32) -> f32 {
    let xc = x.clamp(-87.3, 88.3);
    let t = xc * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = ma.madd(-n, LN2_LO, ma.madd(-n, LN2_HI, xc));
    let mut p = 1.987_569_1e-4f32;
    p = ma.madd(p, r, 1.398_199_9e-3);
    p = ma.madd(p, r, 8.333_452e-3);
    p = ma.madd(p, r, 4.166_579_6e-2);
    p = ma.madd(p, r, 1.666_666_5e-1);
    p = ma.madd(p, r, 0.5); // Cephes' 5.0000001201e-1 rounds to 0.5 in f32
    let er = ma.madd(p * r, r, r) + 1.0;
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
/// [`exp`]'s error); multiply-adds rounded as `ma` says.
#[inline(always)]
pub fn erfc_pos(ma: Madd, z: f32) -> f32 {
    let t = 1.0 / ma.madd(0.5, z, 1.0);
    let mut p = 0.170_872_77f32;
    p = ma.madd(p, t, -0.822_152_23);
    p = ma.madd(p, t, 1.488_515_9);
    p = ma.madd(p, t, -1.135_204); // 1.13520398 to f32
    p = ma.madd(p, t, 0.278_868_07);
    p = ma.madd(p, t, -0.186_288_06);
    p = ma.madd(p, t, 0.096_784_18);
    p = ma.madd(p, t, 0.374_091_96);
    p = ma.madd(p, t, 1.000_023_7);
    p = ma.madd(p, t, -1.265_512_2);
    t * exp(ma, ma.madd(-z, z, p))
}

/// The standard normal CDF `Φ(x) = ½·erfc(−x/√2)`, accurate in relative terms in the lower
/// tail (where GELU's output is tiny) and in absolute terms (≈10⁻⁷) elsewhere.
#[inline(always)]
pub fn normal_cdf(ma: Madd, x: f32) -> f32 {
    let half_tail = 0.5 * erfc_pos(ma, x.abs() * std::f32::consts::FRAC_1_SQRT_2);
    if x < 0.0 {
        half_tail
    } else {
        1.0 - half_tail
    }
}

/// `tanh(u) = sign(u)·(1 − 2/(e^{2|u|} + 1))`: absolute error ≈ 10⁻⁷.
#[inline(always)]
pub fn tanh(ma: Madd, u: f32) -> f32 {
    let t = 1.0 - 2.0 / (exp(ma, 2.0 * u.abs()) + 1.0);
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

    const MODES: [Madd; 2] = [Madd::Fused, Madd::Separate];

    #[test]
    fn madd_rounds_once_when_fused() {
        // (1 + 2⁻¹²)² = 1 + 2⁻¹¹ + 2⁻²⁴: the product rounds the 2⁻²⁴ away (ties to even), the
        // fused form keeps it in the difference.
        let a = 1.0 + 2f32.powi(-12);
        let c = -(1.0 + 2f32.powi(-11));
        assert_eq!(Madd::Fused.madd(a, a, c), 2f32.powi(-24));
        assert_eq!(Madd::Separate.madd(a, a, c), 0.0);
    }

    #[test]
    fn exp_matches_std_to_a_few_ulp() {
        for ma in MODES {
            let mut worst = 0f64;
            let mut x = -87.0f32;
            while x < 88.0 {
                let (got, want) = (exp(ma, x) as f64, (x as f64).exp());
                worst = worst.max(((got - want) / want).abs());
                x += 0.0137;
            }
            assert!(worst < 3e-7, "{ma:?}: worst relative error {worst}");
            assert_eq!(exp(ma, f32::NEG_INFINITY), 0.0);
            assert_eq!(exp(ma, -100.0), 0.0);
            assert_eq!(exp(ma, 0.0), 1.0);
            assert!(exp(ma, f32::NAN).is_nan());
        }
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
            for ma in MODES {
                let (got, want) = (erfc_pos(ma, z as f32) as f64, erfc64(z));
                assert!(((got - want) / want).abs() < tol, "{ma:?}: erfc({z}) = {got}, expected {want}");
            }
        }
        for ma in MODES {
            assert!((normal_cdf(ma, 0.0) - 0.5).abs() < 1e-7);
            // Φ(−5) = 2.866515718791939e-7 (tables).
            assert!(((normal_cdf(ma, -5.0) as f64 - 2.866_515_718_791_939e-7) / 2.866e-7).abs() < 5e-7);
        }
    }

    #[test]
    fn tanh_matches_std() {
        for ma in MODES {
            let mut u = -12.0f32;
            while u < 12.0 {
                assert!((tanh(ma, u) - u.tanh()).abs() < 2e-7, "{ma:?}: tanh({u})");
                u += 0.0123;
            }
        }
    }

    #[test]
    fn vectorized_runs_the_closure() {
        let v: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01).collect();
        let (s, ma) = vectorized(
            #[inline(always)]
            |ma| (v.iter().map(|&x| exp(ma, -x)).sum::<f32>(), ma),
        );
        let want: f32 = v.iter().map(|&x| (-x).exp()).sum();
        assert!((s - want).abs() < 1e-4 * want);
        // The mode fits the instructions the closure ran with: fused with AVX2+FMA or wider.
        let want = if wide_instructions().is_some() { Madd::Fused } else { Madd::BASELINE };
        assert_eq!(ma, want);
    }
}
