//! Softmax and log-softmax (`cudnnSoftmaxForward` / `cudnnSoftmaxBackward`) over the channels of
//! each position or over everything but the batch.
//!
//! Each launch checks, before anything is enqueued: float element type, 3 to 8 dimensions (a
//! `[N, C]` matrix goes in as `[N, C, 1]`; cuDNN sees a 3-D `[N, C, W]` as `[N, C, 1, W]`),
//! equal dimensions for every tensor, each buffer holding its descriptor's span on the handle's
//! context, and no self-overlapping output.
//!
//! One combination is refused although cuDNN accepts it: `f64` tensors with 5 or more
//! dimensions in a channels-last order (NDHWC). cuDNN 9.14's
//! `cudnnSoftmaxForward` returned success for such a tensor while leaving elements of the
//! output unwritten, so a safe call cannot pass it on (see [`Cudnn::softmax_forward`]).
//!
//! ```no_run
//! use cudnn_safe::softmax::{SoftmaxAlgorithm, SoftmaxMode};
//! use cudnn_safe::{cuda_context, Cudnn, TensorDesc};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! // Log-probabilities of 10 classes for a batch of 32.
//! let d = TensorDesc::<f32>::nchw(32, 10, 1, 1)?;
//! let logits = stream.clone_htod(&vec![0.1f32; d.span()]).unwrap();
//! let mut logp = stream.alloc_zeros::<f32>(d.span()).unwrap();
//! cudnn.softmax_forward(SoftmaxAlgorithm::Log, SoftmaxMode::Channel, 1.0, &d, &logits,
//!                       0.0, &d, &mut logp)?;
//! # Ok(()) }
//! ```
use std::ffi::c_void;

use cudnn_safe_sys as sys;

use crate::activation::{check_float, check_nd, same_dims};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::checks::{call_xy, scalar_ptr};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::tensor::{Layout, TensorDesc};

/// The C calls of this family (declared here so `raw.rs` stays shared).
#[allow(non_snake_case)]
mod ffi {
    use cudnn_safe_sys as sys;
    use std::ffi::c_void;

    crate::raw::raw_fns! {
        fn cudnnSoftmaxForward(
            handle: sys::cudnnHandle_t,
            algo: sys::cudnnSoftmaxAlgorithm_t,
            mode: sys::cudnnSoftmaxMode_t,
            alpha: *const c_void,
            x_desc: sys::cudnnTensorDescriptor_t,
            x: *const c_void,
            beta: *const c_void,
            y_desc: sys::cudnnTensorDescriptor_t,
            y: *mut c_void,
        );
        fn cudnnSoftmaxBackward(
            handle: sys::cudnnHandle_t,
            algo: sys::cudnnSoftmaxAlgorithm_t,
            mode: sys::cudnnSoftmaxMode_t,
            alpha: *const c_void,
            y_desc: sys::cudnnTensorDescriptor_t,
            y: *const c_void,
            dy_desc: sys::cudnnTensorDescriptor_t,
            dy: *const c_void,
            beta: *const c_void,
            dx_desc: sys::cudnnTensorDescriptor_t,
            dx: *mut c_void,
        );
    }
}

/// Which softmax is computed, and how (`cudnnSoftmaxAlgorithm_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SoftmaxAlgorithm {
    /// `eˣ / Σ eˣ` without subtracting the maximum first: fastest, but overflows for large
    /// inputs (beyond ~88 in f32, ~11 in f16).
    Fast,
    /// `eˣ⁻ᵐᵃˣ / Σ eˣ⁻ᵐᵃˣ`: the maximum is subtracted first, so no input overflows. The default.
    #[default]
    Accurate,
    /// Log-softmax, `x − max − log Σ eˣ⁻ᵐᵃˣ`.
    Log,
}

impl SoftmaxAlgorithm {
    fn raw(self) -> sys::cudnnSoftmaxAlgorithm_t {
        use sys::cudnnSoftmaxAlgorithm_t as A;
        match self {
            SoftmaxAlgorithm::Fast => A::CUDNN_SOFTMAX_FAST,
            SoftmaxAlgorithm::Accurate => A::CUDNN_SOFTMAX_ACCURATE,
            SoftmaxAlgorithm::Log => A::CUDNN_SOFTMAX_LOG,
        }
    }
}

/// Over which elements each softmax is normalized (`cudnnSoftmaxMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SoftmaxMode {
    /// One softmax per image `n`, over all of `C, (D,) H, W` together.
    Instance,
    /// One softmax per image and spatial position, over the channels `C` (for a `[N, C, 1, 1]`
    /// tensor: per row of an `N × C` matrix, PyTorch's `softmax(dim=1)`). The default.
    #[default]
    Channel,
}

impl SoftmaxMode {
    fn raw(self) -> sys::cudnnSoftmaxMode_t {
        match self {
            SoftmaxMode::Instance => sys::cudnnSoftmaxMode_t::CUDNN_SOFTMAX_MODE_INSTANCE,
            SoftmaxMode::Channel => sys::cudnnSoftmaxMode_t::CUDNN_SOFTMAX_MODE_CHANNEL,
        }
    }
}

const SAME_DIMS: &str = "softmax tensors all have the same dimensions";

/// Whether `layout` stores the channels of a tensor with 5 or more dimensions inside its
/// spatial dimensions (NDHWC, or C between D and H, ...): some spatial dimension of size > 1
/// has a larger stride than a channel dimension of size > 1. Dimensions of size 1 are ignored,
/// as they do not change which elements are addressed.
fn channels_inside_spatial(layout: &Layout) -> bool {
    let (dims, strides) = (layout.dims(), layout.strides());
    dims.len() >= 5
        && dims[1] > 1
        && (2..dims.len()).any(|k| dims[k] > 1 && strides[k] > strides[1])
}

/// Refuses the combination cuDNN was seen to get wrong: cuDNN 9.14's
/// `cudnnSoftmaxForward` (Fast algorithm, Channel mode) returned success on an `f64`
/// `[2, 3, 2, 3, 2]` NDHWC tensor but left output elements unwritten, while f32, f16 and bf16
/// with the same layout, f64 with 4-D NHWC and 5-D NCDHW layouts, and f64 NDHWC in Instance
/// mode (all with the Fast algorithm) were right. The run stopped there, so whether the
/// Accurate and Log algorithms share the fault is not known: every algorithm and mode, forward
/// and backward, is refused for `f64` with a 5-D (or wider) channels-last layout, as a safe call
/// must never report success over an output it did not write.
fn check_f64_channels_last<T: DataType>(
    op: &'static str,
    tensors: &[(&'static str, &Layout)],
) -> Result<()> {
    if T::DTYPE != DType::F64 {
        return Ok(());
    }
    match tensors.iter().find(|(_, l)| channels_inside_spatial(l)) {
        None => Ok(()),
        Some((name, l)) => Err(Error::UnsupportedDataType {
            op,
            detail: format!(
                "f64 with {name} in a channels-last layout of 5 or more dimensions ({l}): \
                 cuDNN 9.14 was seen to leave softmax outputs unwritten for it; use a \
                 channels-first (NCDHW) layout or f32"
            ),
        }),
    }
}

impl Cudnn {
    /// `y = alpha·softmax(x) + beta·y` (or log-softmax for [`SoftmaxAlgorithm::Log`]).
    ///
    /// `x` and `y` have the same dimensions, 3 to 8 of them (`[N, C, W]`, `[N, C, H, W]`,
    /// `[N, C, D, H, W]`, ...; more than 5 only with packed spatial dimensions, cuDNN's rule),
    /// in any layouts. With `beta == 0` the old contents of `y` are not read.
    ///
    /// Errors: besides shape, buffer and type errors, [`Error::UnsupportedDataType`] for `f64`
    /// tensors of 5 or more dimensions in a channels-last layout, which cuDNN 9.14 was seen to
    /// leave partly unwritten.
    #[doc(alias = "cudnnSoftmaxForward")]
    #[allow(clippy::too_many_arguments)] // mirrors cuDNN's argument list
    pub fn softmax_forward<T: DataType>(
        &self,
        algo: SoftmaxAlgorithm,
        mode: SoftmaxMode,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        check_float::<T>("softmax")?;
        check_nd("softmax tensor", x_desc.layout())?;
        check_nd("softmax tensor", y_desc.layout())?;
        same_dims("x", x_desc.layout(), "y", y_desc.layout(), SAME_DIMS)?;
        check_f64_channels_last::<T>("softmax", &[("x", x_desc.layout()), ("y", y_desc.layout())])?;
        let args = self.xy_args(&alpha, ("x", x_desc, x), &beta, ("y", y_desc, y))?;
        // SAFETY: live handle and descriptors; valid enum values; `x` and `y` hold their
        // descriptors' spans on the handle's context, `y` does not overlap itself and cannot
        // alias `x` (`&mut` vs `&`) (checked by `xy_args`); the dims agree (checked above);
        // alpha/beta are `T::Scalar`, the type cuDNN reads for `T`; the guards in `args` keep
        // the buffers alive and ordered until enqueued.
        unsafe {
            call_xy!(
                ffi::cudnnSoftmaxForward,
                self,
                [algo.raw(), mode.raw()],
                args
            )
        }
    }

    /// `dx = alpha·softmax′(dy) + beta·dx`, from the forward's output `y` and the incoming
    /// gradient `dy`: `dx = y ⊙ (dy − Σ dy ⊙ y)` for [`SoftmaxAlgorithm::Fast`] and
    /// [`SoftmaxAlgorithm::Accurate`], `dx = dy − e^y ⊙ Σ dy` for [`SoftmaxAlgorithm::Log`]
    /// (`y` being the log-probabilities), the sums running over what `mode` normalizes.
    ///
    /// `y`, `dy` and `dx` have the same dimensions. With `beta == 0` the old contents of `dx`
    /// are not read. `f64` tensors of 5 or more dimensions in a channels-last layout are
    /// refused as in [`softmax_forward`](Self::softmax_forward).
    #[doc(alias = "cudnnSoftmaxBackward")]
    #[allow(clippy::too_many_arguments)] // mirrors cuDNN's argument list
    pub fn softmax_backward<T: DataType>(
        &self,
        algo: SoftmaxAlgorithm,
        mode: SoftmaxMode,
        alpha: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        dx_desc: &TensorDesc<T>,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        check_float::<T>("softmax backward")?;
        check_nd("softmax tensor", y_desc.layout())?;
        check_nd("softmax tensor", dy_desc.layout())?;
        check_nd("softmax tensor", dx_desc.layout())?;
        same_dims("y", y_desc.layout(), "dy", dy_desc.layout(), SAME_DIMS)?;
        same_dims("y", y_desc.layout(), "dx", dx_desc.layout(), SAME_DIMS)?;
        check_f64_channels_last::<T>(
            "softmax backward",
            &[
                ("y", y_desc.layout()),
                ("dy", dy_desc.layout()),
                ("dx", dx_desc.layout()),
            ],
        )?;
        self.check_tensor("y", y_desc.layout(), y, false)?;
        self.check_tensor("dy", dy_desc.layout(), dy, false)?;
        self.check_tensor("dx", dx_desc.layout(), dx, true)?;
        self.bind()?;
        let stream: &cudarc::driver::CudaStream = self.stream();
        let (yp, _gy) = y.device_ptr(stream);
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dxp, _gdx) = dx.device_ptr_mut(stream);
        // SAFETY: live handle and descriptors; valid enum values; every buffer holds its
        // descriptor's span on the handle's context, `dx` does not overlap itself and cannot
        // alias the inputs (`&mut` vs `&`); the dims agree (checked above); alpha/beta are
        // `T::Scalar`; the guards keep the buffers alive and ordered until enqueued.
        unsafe {
            ffi::cudnnSoftmaxBackward(
                self.lib(),
                self.as_raw(),
                algo.raw(),
                mode.raw(),
                scalar_ptr(&alpha),
                y_desc.as_raw(),
                yp as *const c_void,
                dy_desc.as_raw(),
                dyp as *const c_void,
                scalar_ptr(&beta),
                dx_desc.as_raw(),
                dxp as *mut c_void,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_channels_last_5d_is_refused_before_launch() {
        let ndhwc = Layout::ndhwc(2, 3, 2, 3, 2).unwrap();
        let ncdhw = Layout::ncdhw(2, 3, 2, 3, 2).unwrap();
        let nhwc = Layout::nhwc(2, 3, 3, 2).unwrap();
        assert!(channels_inside_spatial(&ndhwc));
        assert!(!channels_inside_spatial(&ncdhw));
        assert!(
            !channels_inside_spatial(&nhwc),
            "4-D NHWC passed on the GPU"
        );
        // C between D and H.
        let mixed = Layout::strided(&[2, 3, 2, 3, 2], &[36, 6, 18, 2, 1]).unwrap();
        assert!(channels_inside_spatial(&mixed));
        // Padded channels-first keeps C outside the spatial dimensions.
        let padded = Layout::strided(&[2, 3, 2, 3, 2], &[144, 36, 12, 3, 1]).unwrap();
        assert!(!channels_inside_spatial(&padded));
        // Size-1 dimensions address nothing new: these are channels-first in effect.
        assert!(!channels_inside_spatial(
            &Layout::ndhwc(4, 10, 1, 1, 1).unwrap()
        ));
        assert!(!channels_inside_spatial(
            &Layout::ndhwc(4, 1, 2, 3, 2).unwrap()
        ));

        let refused = check_f64_channels_last::<f64>("softmax", &[("x", &ncdhw), ("y", &ndhwc)]);
        assert!(
            matches!(&refused, Err(Error::UnsupportedDataType { op: "softmax", detail })
                if detail.contains("y in a channels-last layout")),
            "{refused:?}"
        );
        assert!(check_f64_channels_last::<f64>("softmax", &[("x", &ncdhw), ("y", &nhwc)]).is_ok());
        for ok in [
            check_f64_channels_last::<f32>("softmax", &[("x", &ndhwc)]),
            check_f64_channels_last::<half::f16>("softmax", &[("x", &ndhwc)]),
            check_f64_channels_last::<half::bf16>("softmax", &[("x", &ndhwc)]),
        ] {
            assert!(ok.is_ok(), "{ok:?}");
        }
    }
}
