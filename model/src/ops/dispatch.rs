//! Choosing a fused implementation at run time without changing the model's `B: Backend` bound.
//!
//! The model is generic over any Burn backend. The fused ops are traits over `Backend` (Burn's
//! backend-extension pattern), implemented for the backends Ember knows: Flex (raw-buffer
//! kernels), `Autodiff<B>` of those (each op with its own backward), and CUDA and wgpu (the
//! traits' generic defaults, built from Burn tensor ops, with Ember's own backward: e.g.
//! attention keeps no `[B, H, T, T]` between the passes). [`with_fused_backend!`] compares the model's
//! backend type with each of them and, on a match, hands the op to that implementation; any
//! other backend gets the composed tensor-op path, so every backend keeps working.

use std::any::Any;

/// `a` as a `T`, when `A` and `T` are the same type (checked at run time by `TypeId`).
///
/// # Panics
/// If they are different types: callers check the backend's `TypeId` first, so this
/// is a bug in the dispatch.
pub fn same<A: 'static, T: 'static>(a: A) -> T {
    let mut slot = Some(a);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<T>>() {
        Some(t) => t.take().expect("the slot is full"),
        None => {
            panic!("fused-op dispatch: {} is not {}", std::any::type_name::<A>(), std::any::type_name::<T>())
        }
    }
}

/// True if `A` and `T` are the same type.
pub fn is<A: 'static, T: 'static>() -> bool {
    std::any::TypeId::of::<A>() == std::any::TypeId::of::<T>()
}

/// `with_fused_backend!(B, FB => { fused body using FB } else { fallback })`: runs the body with
/// the type alias `FB` naming the concrete backend that `B` is, for each backend with fused ops
/// (Flex and `Autodiff<Flex>`; with the `cuda` feature also CUDA and `Autodiff<Cuda>`, with the
/// `wgpu` feature wgpu and `Autodiff<Wgpu>`), else the
/// fallback. Inside the body, move values between `B` and `FB` with [`same`].
macro_rules! with_fused_backend {
    ($B:ty, $FB:ident => $body:block else $fallback:block) => {{
        use $crate::ops::dispatch::is;
        if is::<$B, burn::backend::Flex>() {
            #[allow(dead_code)]
            type $FB = burn::backend::Flex;
            $body
        } else if is::<$B, burn::backend::Autodiff<burn::backend::Flex>>() {
            #[allow(dead_code)]
            type $FB = burn::backend::Autodiff<burn::backend::Flex>;
            $body
        } else {
            $crate::ops::dispatch::with_cuda!($B, $FB => $body else {
                $crate::ops::dispatch::with_wgpu!($B, $FB => $body else $fallback)
            })
        }
    }};
}
pub(crate) use with_fused_backend;

#[cfg(feature = "cuda")]
macro_rules! with_cuda {
    ($B:ty, $FB:ident => $body:block else $fallback:block) => {{
        if is::<$B, burn::backend::Cuda>() {
            #[allow(dead_code)]
            type $FB = burn::backend::Cuda;
            $body
        } else if is::<$B, burn::backend::Autodiff<burn::backend::Cuda>>() {
            #[allow(dead_code)]
            type $FB = burn::backend::Autodiff<burn::backend::Cuda>;
            $body
        } else $fallback
    }};
}
#[cfg(not(feature = "cuda"))]
macro_rules! with_cuda {
    ($B:ty, $FB:ident => $body:block else $fallback:block) => {
        $fallback
    };
}
pub(crate) use with_cuda;

#[cfg(feature = "wgpu")]
macro_rules! with_wgpu {
    ($B:ty, $FB:ident => $body:block else $fallback:block) => {{
        use $crate::ops::dispatch::is;
        if is::<$B, burn::backend::Wgpu>() {
            #[allow(dead_code)]
            type $FB = burn::backend::Wgpu;
            $body
        } else if is::<$B, burn::backend::Autodiff<burn::backend::Wgpu>>() {
            #[allow(dead_code)]
            type $FB = burn::backend::Autodiff<burn::backend::Wgpu>;
            $body
        } else $fallback
    }};
}
#[cfg(not(feature = "wgpu"))]
macro_rules! with_wgpu {
    ($B:ty, $FB:ident => $body:block else $fallback:block) => {
        $fallback
    };
}
pub(crate) use with_wgpu;
