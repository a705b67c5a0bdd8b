//! The residual add equals Burn's add: values bit for bit, and both gradients.

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorPrimitive};

use super::{residual_add, FusedAdd};
use crate::ops::testing::{randn, Ad};

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
    let (x, y) = (randn([2, 5, 7], 1.0, 6), randn([5, 7], 1.0, 7).unsqueeze::<3>());
    assert_eq!(residual_add(x.clone(), y.clone()).into_data(), (x + y).into_data());
    // The broadcast operand first: Burn's add.
    let (x, y) = (randn([1, 5, 7], 1.0, 6), randn([3, 5, 7], 1.0, 7));
    assert_eq!(residual_add(x.clone(), y.clone()).into_data(), (x + y).into_data());
}

/// Token plus position embeddings, `[batch, T, C] + [1, T, C]`: values, both gradients (the
/// position embedding's summed over the batch) bit for bit as Burn's add, the sum written over
/// the fresh token embeddings.
#[test]
fn batch_broadcast_equals_burns_add() {
    let (x, y, w) = (randn([5, 37, 129], 1.0, 8), randn([1, 37, 129], 1.0, 9), randn([5, 37, 129], 1.0, 10));
    let (xf, yf) = (x.clone().require_grad(), y.clone().require_grad());
    let (xr, yr) = (x.clone().require_grad(), y.clone().require_grad());
    let zf = residual_add(xf.clone() * 2.0, yf.clone());
    let zr = xr.clone() * 2.0 + yr.clone();
    assert_eq!(zf.clone().into_data(), zr.clone().into_data());
    let (gf, gr) = ((zf * w.clone()).sum().backward(), (zr * w).sum().backward());
    assert_eq!(xf.grad(&gf).unwrap().into_data(), xr.grad(&gr).unwrap().into_data());
    assert_eq!(yf.grad(&gf).unwrap().dims(), [1, 37, 129]);
    assert_eq!(yf.grad(&gf).unwrap().into_data(), yr.grad(&gr).unwrap().into_data());

    let x = randn([5, 37, 129], 1.0, 8).inner();
    let own = (x.clone() * 1.0).into_primitive().tensor();
    let ptr = own.bytes().as_ptr();
    let sum = Flex::fused_add(own, y.clone().inner().into_primitive().tensor());
    assert_eq!(sum.bytes().as_ptr(), ptr, "allocated instead of reusing the unshared operand");
    let want = x + y.inner();
    assert_eq!(Tensor::<Flex, 3>::from_primitive(TensorPrimitive::Float(sum)).into_data(), want.into_data());
}

/// A tensor read by two ops gets two gradient contributions; the second is added to the first
/// with the fused add (`ops::grads::register_grad!`). The sum equals Burn's bit for bit, in
/// both orders of the two ops, with a third contribution from Burn's own ops in between.
#[test]
fn a_tensor_read_twice_gets_the_sum_of_its_gradients() {
    let (x, y1, y2) = (randn([3, 41, 67], 1.0, 11), randn([3, 41, 67], 1.0, 12), randn([3, 41, 67], 1.0, 13));
    let (w1, w2) = (randn([3, 41, 67], 1.0, 14), randn([3, 41, 67], 1.0, 15));
    let grad_of_x = |fused: bool| {
        let x = x.clone().require_grad();
        let add = |a: Tensor<Ad, 3>, b: Tensor<Ad, 3>| if fused { residual_add(a, b) } else { a + b };
        let z1 = add(x.clone(), y1.clone());
        let z2 = add(y2.clone(), x.clone());
        let z3 = x.clone() * 0.5;
        let loss = (z1 * w1.clone()).sum() + (z2 * w2.clone()).sum() + z3.sum();
        x.grad(&loss.backward()).unwrap().into_data()
    };
    assert_eq!(grad_of_x(true), grad_of_x(false));
}
