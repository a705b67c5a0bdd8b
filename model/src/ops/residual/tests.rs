//! The residual add equals Burn's add: values bit for bit, and both gradients.

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{residual_add, FusedAdd};
use crate::ops::testing::randn;

#[test]
fn values_and_gradients_equal_burns_add() {
    // More than one chunk, odd sizes.
    let (x, y, w) = (randn([3, 71, 257], 1.0, 1), randn([3, 71, 257], 1.0, 2), randn([3, 71, 257], 1.0, 3));
    let (xf, yf) = (x.clone().require_grad(), y.clone().require_grad());
    let (xr, yr) = (x.clone().require_grad(), y.clone().require_grad());
    // The branch output is a fresh tensor nothing else holds: the sum is written over it.
    let zf = residual_add(xf.clone(), yf.clone() * 2.0);
    let zr = xr.clone() + yr.clone() * 2.0;
    assert_eq!(zf.clone().into_data(), zr.clone().into_data());
    let (gf, gr) = ((zf * w.clone()).sum().backward(), (zr * w).sum().backward());
    assert_eq!(xf.grad(&gf).unwrap().into_data(), xr.grad(&gr).unwrap().into_data());
    assert_eq!(yf.grad(&gf).unwrap().into_data(), yr.grad(&gr).unwrap().into_data());
    // Both operands shared: a new buffer, same values; the operands are untouched.
    let z = residual_add(x.clone(), y.clone());
    assert_eq!(z.into_data(), (x.clone() + y.clone()).into_data());
    assert_eq!(x.into_data(), randn([3, 71, 257], 1.0, 1).into_data());
    assert_eq!(y.into_data(), randn([3, 71, 257], 1.0, 2).into_data());
}

#[test]
fn the_sum_is_written_over_an_unshared_operand() {
    let x = randn([2, 33, 65], 1.0, 4).inner();
    let own = (randn([2, 33, 65], 1.0, 5).inner() * 1.0).into_primitive().tensor();
    let ptr = own.bytes().as_ptr();
    let sum = Flex::fused_add(x.clone().into_primitive().tensor(), own);
    assert_eq!(sum.bytes().as_ptr(), ptr, "allocated instead of reusing the unshared operand");
    let want = x + randn([2, 33, 65], 1.0, 5).inner();
    assert_eq!(Tensor::<Flex, 3>::from_primitive(TensorPrimitive::Float(sum)).into_data(), want.into_data());
}

#[test]
fn other_shapes_broadcast_as_burn_does() {
    let (x, y) = (randn([2, 5, 7], 1.0, 6), randn([1, 5, 7], 1.0, 7));
    assert_eq!(residual_add(x.clone(), y.clone()).into_data(), (x + y).into_data());
}
