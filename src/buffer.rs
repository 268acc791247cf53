//! The device buffers a launch accepts: cudarc's own allocations and views of them, through
//! traits this crate seals.
//!
//! Every check a launch makes before it enqueues work — "buffer `y` holds at least the span of
//! its descriptor", "buffer `x` lives on the handle's context", "the output does not alias an
//! input" — reads the buffer's length, stream and pointer. cudarc's `DevicePtr`, `DevicePtrMut`
//! and `DeviceSlice` are safe traits that any type may implement with any answers, so a check
//! that trusts them checks nothing. [`DeviceBuffer`] and [`DeviceBufferMut`] can only be
//! implemented here, and are implemented for exactly the types whose answers come from a real
//! allocation:
//!
//! | type | [`DeviceBuffer`] (read) | [`DeviceBufferMut`] (write) |
//! |---|---|---|
//! | [`CudaSlice<T>`] (an allocation) | ✓ | ✓ |
//! | [`CudaView<'_, T>`] (`slice.slice(a..b)`, `slice.as_view()`) | ✓ | |
//! | [`CudaViewMut<'_, T>`] (`slice.slice_mut(a..b)`, `split_at_mut`) | ✓ | ✓ |
//!
//! cudarc builds a view only from an allocation it owns, within its bounds, borrowing it for
//! the view's life, so a view's length, pointer and stream are as trustworthy as the
//! allocation's. A launch takes its inputs as `&impl DeviceBuffer<T>` and its outputs as
//! `&mut impl DeviceBufferMut<T>`; the borrow checker then rules out an output that aliases an
//! input (a `&mut` next to a `&` of the same allocation does not compile), and cudarc's events
//! (recorded through the guards of these types) order later frees and reuses after the launch.
//! Optional buffers and buffers held in a parameter struct are views
//! ([`CudaView`]/[`CudaViewMut`], from `as_view()` / `as_view_mut()`), so that `None` needs no
//! type annotation.
//!
//! A type of one's own does not compile where a buffer is expected:
//!
//! ```compile_fail,E0277
//! use cudnn_safe::cudarc::driver::{CudaStream, DevicePtr, DeviceSlice, SyncOnDrop};
//! use cudnn_safe::{Cudnn, TensorDesc};
//! use std::sync::Arc;
//!
//! /// Claims any length over any pointer: cudarc's traits allow it.
//! struct Liar(Arc<CudaStream>, u64);
//! impl DeviceSlice<f32> for Liar {
//!     fn len(&self) -> usize { 1 << 20 }
//!     fn stream(&self) -> &Arc<CudaStream> { &self.0 }
//! }
//! impl DevicePtr<f32> for Liar {
//!     fn device_ptr<'a>(&'a self, s: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
//!         (self.1, SyncOnDrop::Sync(None))
//!     }
//! }
//!
//! fn launch(cudnn: &Cudnn, d: &TensorDesc<f32>, liar: &Liar) {
//!     let mut y = cudnn.stream().alloc_zeros::<f32>(64).unwrap();
//!     let _ = cudnn.transform_tensor(1.0, d, liar, 0.0, d, &mut y);
//! }
//! ```
//!
//! An input where an output is expected does not compile:
//!
//! ```compile_fail,E0308
//! use cudnn_safe::{Cudnn, TensorDesc};
//! fn launch(cudnn: &Cudnn, d: &TensorDesc<f32>) {
//!     let x = cudnn.stream().alloc_zeros::<f32>(64).unwrap();
//!     let y = cudnn.stream().alloc_zeros::<f32>(64).unwrap();
//!     let _ = cudnn.transform_tensor(1.0, d, &x, 0.0, d, &y);
//! }
//! ```
//!
//! Nor does an output that aliases an input, whole or through views:
//!
//! ```compile_fail,E0502
//! use cudnn_safe::{Cudnn, TensorDesc};
//! fn launch(cudnn: &Cudnn, d: &TensorDesc<f32>) {
//!     let mut x = cudnn.stream().alloc_zeros::<f32>(64).unwrap();
//!     let _ = cudnn.transform_tensor(1.0, d, &x, 0.0, d, &mut x);
//! }
//! ```
//!
//! ```compile_fail,E0502
//! use cudnn_safe::{Cudnn, TensorDesc};
//! fn launch(cudnn: &Cudnn, d: &TensorDesc<f32>) {
//!     let mut x = cudnn.stream().alloc_zeros::<f32>(128).unwrap();
//!     let input = x.slice(0..64);
//!     let mut output = x.slice_mut(32..96);
//!     let _ = cudnn.transform_tensor(1.0, d, &input, 0.0, d, &mut output);
//! }
//! ```
//!
//! Disjoint parts of one allocation are fine (`split_at_mut`), as are cudarc's own types:
//!
//! ```no_run
//! use cudnn_safe::{Cudnn, TensorDesc};
//! fn launch(cudnn: &Cudnn, d: &TensorDesc<f32>) -> cudnn_safe::Result<()> {
//!     let mut x = cudnn.stream().alloc_zeros::<f32>(128).unwrap();
//!     let (input, mut output) = x.split_at_mut(64);
//!     cudnn.transform_tensor(1.0, d, &input, 0.0, d, &mut output)
//! }
//! ```
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

mod private {
    /// Implemented here only: the types whose length, pointer and stream come from a real
    /// cudarc allocation.
    pub trait Sealed {}
    impl<T> Sealed for cudarc::driver::CudaSlice<T> {}
    impl<T> Sealed for cudarc::driver::CudaView<'_, T> {}
    impl<T> Sealed for cudarc::driver::CudaViewMut<'_, T> {}
}

/// A device buffer a launch may read: [`CudaSlice`], [`CudaView`] or [`CudaViewMut`] (sealed;
/// see the [module documentation](self)).
pub trait DeviceBuffer<T>: DevicePtr<T> + private::Sealed {
    /// A view of the whole buffer (what optional arguments and parameter structs take).
    fn view(&self) -> CudaView<'_, T>;
}

/// A device buffer a launch may write: [`CudaSlice`] or [`CudaViewMut`] (sealed; see the
/// [module documentation](self)).
pub trait DeviceBufferMut<T>: DeviceBuffer<T> + DevicePtrMut<T> {
    /// A mutable view of the whole buffer.
    fn view_mut(&mut self) -> CudaViewMut<'_, T>;
}

impl<T> DeviceBuffer<T> for CudaSlice<T> {
    fn view(&self) -> CudaView<'_, T> {
        self.as_view()
    }
}

impl<T> DeviceBuffer<T> for CudaView<'_, T> {
    fn view(&self) -> CudaView<'_, T> {
        self.slice(..)
    }
}

impl<T> DeviceBuffer<T> for CudaViewMut<'_, T> {
    fn view(&self) -> CudaView<'_, T> {
        self.as_view()
    }
}

impl<T> DeviceBufferMut<T> for CudaSlice<T> {
    fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.as_view_mut()
    }
}

impl<T> DeviceBufferMut<T> for CudaViewMut<'_, T> {
    fn view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.slice_mut(..)
    }
}
