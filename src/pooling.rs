//! 2-D and 3-D pooling (`cudnnPoolingForward` / `cudnnPoolingBackward`): max (plain and
//! deterministic) and average (counting or not counting the padding).
//!
//! A [`PoolingDesc`] is built once by a validating [`PoolingBuilder`] (window, padding, strides,
//! NaN rule) and owns the cuDNN descriptor. [`PoolingDesc::output_dims`] computes the output
//! shape in Rust with cuDNN's rule, `out = (in + 2·pad − window) / stride + 1`; every launch
//! checks the tensors against it (and the backward stride rules) before anything is enqueued.
//!
//! cuDNN itself accepts negative paddings and paddings as large as the window (windows lying
//! wholly in the padding, whose max or exclusive average is undefined); the builder refuses
//! both: `0 ≤ pad < window`, which guarantees every window overlaps the input.
//!
//! A 1-D pooling (a window of one dimension) takes `[N, C, W]` tensors; cuDNN runs it as a 2-D
//! one over `[N, C, 1, W]` with a window height of 1 (see [`TensorDesc::new`]).
//!
//! ```no_run
//! use cudnn_safe::pooling::{PoolingDesc, PoolingMode};
//! use cudnn_safe::{cuda_context, Cudnn, TensorDesc};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! // 3×3 max pooling, stride 2, padding 1 (ResNet's stem).
//! let pool = PoolingDesc::builder(PoolingMode::Max, &[3, 3])
//!     .pads(&[1, 1])
//!     .strides(&[2, 2])
//!     .build()?;
//! let x_d = TensorDesc::<f32>::nhwc(8, 64, 112, 112)?;
//! let dims = pool.output_dims(x_d.dims())?; // [8, 64, 56, 56]
//! let y_d = TensorDesc::<f32>::nhwc(dims[0], dims[1], dims[2], dims[3])?;
//! let x = stream.clone_htod(&vec![0.5f32; x_d.span()]).unwrap();
//! let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
//! cudnn.pooling_forward(&pool, 1.0, &x_d, &x, 0.0, &y_d, &mut y)?;
//! # Ok(()) }
//! ```
use std::ffi::c_int;
use std::fmt;

use cudnn_safe_sys as sys;

pub use crate::activation::NanPropagation;
use crate::activation::{check_float, grad_strides_match, same_dims};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::checks::{call_grad, call_xy, Grad};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::TensorDesc;

/// The C calls of this family (declared here so `raw.rs` stays shared).
#[allow(non_snake_case)]
mod ffi {
    use cudnn_safe_sys as sys;
    use std::ffi::{c_int, c_void};

    crate::raw::raw_fns! {
        fn cudnnCreatePoolingDescriptor(desc: *mut sys::cudnnPoolingDescriptor_t);
        fn cudnnDestroyPoolingDescriptor(desc: sys::cudnnPoolingDescriptor_t);
        fn cudnnSetPoolingNdDescriptor(
            desc: sys::cudnnPoolingDescriptor_t,
            mode: sys::cudnnPoolingMode_t,
            nan: sys::cudnnNanPropagation_t,
            nb_dims: c_int,
            window: *const c_int,
            padding: *const c_int,
            stride: *const c_int,
        );
        fn cudnnPoolingForward(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnPoolingDescriptor_t,
            alpha: *const c_void,
            x_desc: sys::cudnnTensorDescriptor_t,
            x: *const c_void,
            beta: *const c_void,
            y_desc: sys::cudnnTensorDescriptor_t,
            y: *mut c_void,
        );
        fn cudnnPoolingBackward(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnPoolingDescriptor_t,
            alpha: *const c_void,
            y_desc: sys::cudnnTensorDescriptor_t,
            y: *const c_void,
            dy_desc: sys::cudnnTensorDescriptor_t,
            dy: *const c_void,
            x_desc: sys::cudnnTensorDescriptor_t,
            x: *const c_void,
            beta: *const c_void,
            dx_desc: sys::cudnnTensorDescriptor_t,
            dx: *mut c_void,
        );
    }

    crate::raw::owned_descriptor!(
        /// An owned `cudnnPoolingDescriptor_t`.
        OwnedPooling,
        sys::cudnnPoolingDescriptor_t,
        cudnnCreatePoolingDescriptor,
        cudnnDestroyPoolingDescriptor
    );
}

/// How a window is reduced (`cudnnPoolingMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PoolingMode {
    /// The maximum of the window. cuDNN's backward pass for this mode may be non-deterministic
    /// where windows overlap; use [`PoolingMode::MaxDeterministic`] for reproducible gradients.
    Max,
    /// The maximum of the window, with a deterministic backward pass.
    MaxDeterministic,
    /// The average over the whole window, padding counted (as zeros): the divisor is always the
    /// window's size (PyTorch's `count_include_pad=True`).
    AvgIncludePadding,
    /// The average over the window's elements inside the input: the divisor is the number of
    /// those elements (PyTorch's `count_include_pad=False`).
    AvgExcludePadding,
}

impl PoolingMode {
    fn raw(self) -> sys::cudnnPoolingMode_t {
        use sys::cudnnPoolingMode_t as M;
        match self {
            PoolingMode::Max => M::CUDNN_POOLING_MAX,
            PoolingMode::MaxDeterministic => M::CUDNN_POOLING_MAX_DETERMINISTIC,
            PoolingMode::AvgIncludePadding => M::CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
            PoolingMode::AvgExcludePadding => M::CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
        }
    }

    /// Whether this is one of the two max modes.
    pub fn is_max(self) -> bool {
        matches!(self, PoolingMode::Max | PoolingMode::MaxDeterministic)
    }
}

/// Builder for a [`PoolingDesc`]; plain data, validated by [`build`](Self::build).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolingBuilder {
    mode: PoolingMode,
    window: Vec<i64>,
    pads: Vec<i64>,
    strides: Vec<i64>,
    nan: NanPropagation,
}

impl PoolingBuilder {
    /// Symmetric padding per spatial dimension (default 0); each must satisfy
    /// `0 ≤ pad < window`.
    #[must_use]
    pub fn pads(mut self, pads: &[i64]) -> Self {
        self.pads = pads.to_vec();
        self
    }
    /// Window strides per spatial dimension (default: the window size, i.e. non-overlapping
    /// windows, as PyTorch's pooling defaults to).
    #[must_use]
    pub fn strides(mut self, strides: &[i64]) -> Self {
        self.strides = strides.to_vec();
        self
    }
    /// Whether NaN inputs propagate through the max modes (default
    /// [`NanPropagation::Propagate`]).
    #[must_use]
    pub fn nan(mut self, nan: NanPropagation) -> Self {
        self.nan = nan;
        self
    }

    /// Validates the parameters and creates the cuDNN descriptor.
    ///
    /// Errors: a window of other than 1, 2 or 3 dimensions; pads or strides of another length;
    /// a window or stride < 1; a pad < 0 or ≥ its window; values beyond cuDNN's `int`.
    #[doc(alias = "cudnnCreatePoolingDescriptor")]
    #[doc(alias = "cudnnSetPoolingNdDescriptor")]
    pub fn build(&self) -> Result<PoolingDesc> {
        let n = self.window.len();
        if !(1..=3).contains(&n) {
            return Err(Error::invalid(
                "pooling window",
                "1, 2 or 3 spatial dimensions",
                format!("{n} dimensions {:?}", self.window),
            ));
        }
        let per_dim = |v: &[i64], what: &'static str, default: &[i64]| -> Result<Vec<i64>> {
            let v = if v.is_empty() { default } else { v };
            if v.len() != n {
                return Err(Error::invalid(
                    what,
                    format!("{n} values (one per spatial dimension of the window)"),
                    format!("{v:?}"),
                ));
            }
            Ok(v.to_vec())
        };
        let in_int = |v: i64, min: i64| v >= min && v <= i64::from(c_int::MAX);
        let window = self.window.clone();
        if let Some(bad) = window.iter().find(|&&w| !in_int(w, 1)) {
            return Err(Error::invalid(
                "pooling window",
                "sizes in 1..=2147483647",
                format!("{bad} in {window:?}"),
            ));
        }
        let pads = per_dim(&self.pads, "pooling padding", &vec![0; n])?;
        let strides = per_dim(&self.strides, "pooling stride", &window)?;
        if let Some(bad) = strides.iter().find(|&&s| !in_int(s, 1)) {
            return Err(Error::invalid(
                "pooling stride",
                "strides in 1..=2147483647",
                format!("{bad} in {strides:?}"),
            ));
        }
        for (i, (&p, &w)) in pads.iter().zip(&window).enumerate() {
            if p < 0 || p >= w {
                return Err(Error::invalid(
                    "pooling padding",
                    format!(
                        "0 ≤ pad < window in every dimension, so that every window overlaps the \
                         input (dimension {i} has window {w})"
                    ),
                    format!("{p} in {pads:?}"),
                ));
            }
        }
        let lib = raw::lib()?;
        // Owned from here: dropping it destroys the descriptor if the set call fails.
        let desc = ffi::OwnedPooling::new(lib)?;
        // A 1-D pooling runs as a 2-D one over the unit height of its tensors' cuDNN view.
        let unit = |v: &[i64], h: c_int| {
            let mut c: Vec<c_int> = v.iter().map(|&x| x as c_int).collect();
            if n == 1 {
                c.insert(0, h);
            }
            c
        };
        let (w, p, s) = (unit(&window, 1), unit(&pads, 0), unit(&strides, 1));
        // SAFETY: live descriptor; valid enum values; the three arrays hold `nb_dims` values
        // each (2 or 3), validated to fit `int`.
        unsafe {
            ffi::cudnnSetPoolingNdDescriptor(
                lib,
                desc.as_ptr(),
                self.mode.raw(),
                self.nan.raw(),
                w.len() as c_int,
                w.as_ptr(),
                p.as_ptr(),
                s.as_ptr(),
            )
        }?;
        Ok(PoolingDesc {
            raw: desc,
            mode: self.mode,
            nan: self.nan,
            window,
            pads,
            strides,
        })
    }
}

/// An owned pooling descriptor (`cudnnPoolingDescriptor_t`) with its parameters.
///
/// Immutable once built; `Send`. Build one with [`PoolingDesc::builder`]; the cuDNN descriptor
/// is created once there, never per launch.
pub struct PoolingDesc {
    raw: ffi::OwnedPooling,
    mode: PoolingMode,
    nan: NanPropagation,
    window: Vec<i64>,
    pads: Vec<i64>,
    strides: Vec<i64>,
}

impl fmt::Debug for PoolingDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolingDesc")
            .field("mode", &self.mode)
            .field("window", &self.window)
            .field("pads", &self.pads)
            .field("strides", &self.strides)
            .field("nan", &self.nan)
            .finish()
    }
}

impl PoolingDesc {
    /// A builder for `mode` over a window of 1, 2 or 3 spatial dimensions (`[w]`, `[h, w]` or
    /// `[d, h, w]`), with no padding, strides equal to the window, propagating NaN.
    #[must_use]
    pub fn builder(mode: PoolingMode, window: &[i64]) -> PoolingBuilder {
        PoolingBuilder {
            mode,
            window: window.to_vec(),
            pads: Vec::new(),
            strides: Vec::new(),
            nan: NanPropagation::default(),
        }
    }

    /// How windows are reduced.
    pub fn mode(&self) -> PoolingMode {
        self.mode
    }
    /// The NaN rule of the max modes.
    pub fn nan(&self) -> NanPropagation {
        self.nan
    }
    /// Window size per spatial dimension.
    pub fn window(&self) -> &[i64] {
        &self.window
    }
    /// Padding per spatial dimension.
    pub fn pads(&self) -> &[i64] {
        &self.pads
    }
    /// Strides per spatial dimension.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }
    /// Number of spatial dimensions (1, 2 or 3).
    pub fn spatial_rank(&self) -> usize {
        self.window.len()
    }
    /// Rank of the tensors it takes: 3 (`N, C, W`), 4 (`N, C, H, W`) or 5 (`N, C, D, H, W`).
    pub fn tensor_rank(&self) -> usize {
        self.window.len() + 2
    }
    /// The raw descriptor, for cuDNN functions this crate does not wrap. It stays owned by
    /// `self` and must not be destroyed or modified.
    pub fn as_raw(&self) -> sys::cudnnPoolingDescriptor_t {
        self.raw.as_ptr()
    }

    /// Output size along spatial dimension `i` for an input of size `input`, or the error for a
    /// window larger than the padded input.
    fn out_size(&self, i: usize, input: i64) -> Result<i64> {
        let padded = input + 2 * self.pads[i];
        if self.window[i] > padded {
            return Err(Error::invalid(
                "pooling window",
                format!(
                    "a window ≤ the padded input in spatial dimension {i} ({input} + 2·{} = {padded})",
                    self.pads[i]
                ),
                self.window[i],
            ));
        }
        Ok((padded - self.window[i]) / self.strides[i] + 1)
    }

    fn check_x_dims(&self, x_dims: &[i64]) -> Result<()> {
        if x_dims.len() != self.tensor_rank() {
            return Err(Error::invalid(
                "pooling input rank",
                format!(
                    "{} dimensions (N, C and {} spatial) for this {}-D pooling",
                    self.tensor_rank(),
                    self.spatial_rank(),
                    self.spatial_rank()
                ),
                format!("{} dimensions {x_dims:?}", x_dims.len()),
            ));
        }
        if let Some(bad) = x_dims.iter().find(|&&d| d < 1 || d > i64::from(c_int::MAX)) {
            return Err(Error::invalid(
                "pooling input dimension",
                "dimensions in 1..=2147483647",
                format!("{bad} in {x_dims:?}"),
            ));
        }
        Ok(())
    }

    /// Output dimensions `[N, C, out...]` for an input of dimensions `x_dims` (`[N, C, in...]`),
    /// with `out = (in + 2·pad − window) / stride + 1` per spatial dimension (cuDNN's
    /// `cudnnGetPoolingNdForwardOutputDim`, computed here without a call).
    ///
    /// Errors: a rank other than [`tensor_rank`](Self::tensor_rank), a dimension < 1, or a
    /// window larger than the padded input.
    #[doc(alias = "cudnnGetPoolingNdForwardOutputDim")]
    pub fn output_dims(&self, x_dims: &[i64]) -> Result<Vec<i64>> {
        self.check_x_dims(x_dims)?;
        let mut out = vec![x_dims[0], x_dims[1]];
        for (i, &d) in x_dims[2..].iter().enumerate() {
            out.push(self.out_size(i, d)?);
        }
        Ok(out)
    }

    /// Checks `y_dims` against [`output_dims`](Self::output_dims) of `x_dims` without
    /// allocating (launches run this on every call).
    fn check_output_dims(&self, x_dims: &[i64], y_dims: &[i64]) -> Result<()> {
        self.check_x_dims(x_dims)?;
        let mut ok = y_dims.len() == x_dims.len() && y_dims[..2] == x_dims[..2];
        for (i, &d) in x_dims[2..].iter().enumerate() {
            let out = self.out_size(i, d)?;
            ok = ok && y_dims[2 + i] == out;
        }
        if ok {
            return Ok(());
        }
        Err(Error::ShapeMismatch {
            a: "y",
            a_dims: y_dims.to_vec(),
            b: "expected",
            b_dims: self.output_dims(x_dims)?,
            rule: "the pooling output has N and C of x and (in + 2·pad − window) / stride + 1 \
                   in each spatial dimension",
        })
    }
}

impl Cudnn {
    /// `y = alpha·pool(x) + beta·y`.
    ///
    /// `x` is `[N, C, H, W]` (`[N, C, W]` for a 1-D pooling, `[N, C, D, H, W]` for a 3-D one) in
    /// any layout, `y` has [`PoolingDesc::output_dims`] of it. With `beta == 0` the old contents
    /// of `y` are not read.
    ///
    /// Errors: non-float types, a rank not matching the pooling, a `y` of the wrong shape, short
    /// or foreign buffers, a self-overlapping `y`.
    #[doc(alias = "cudnnPoolingForward")]
    #[allow(clippy::too_many_arguments)] // mirrors cuDNN's argument list
    pub fn pooling_forward<T: DataType>(
        &self,
        pool: &PoolingDesc,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        check_float::<T>("pooling")?;
        pool.check_output_dims(x_desc.dims(), y_desc.dims())?;
        let args = self.xy_args(&alpha, ("x", x_desc, x), &beta, ("y", y_desc, y))?;
        // SAFETY: live handle and descriptors; `x` and `y` hold their descriptors' spans on the
        // handle's context, `y` does not overlap itself and cannot alias `x` (`&mut` vs `&`)
        // (checked by `xy_args`); `y`'s dims are the pooling's output dims of `x`'s (checked
        // above), so the kernel addresses nothing beyond either descriptor; alpha/beta are
        // `T::Scalar`, the type cuDNN reads for `T`; the guards in `args` keep the buffers
        // alive and ordered until enqueued.
        unsafe { call_xy!(ffi::cudnnPoolingForward, self, [pool.as_raw()], args) }
    }

    /// `dx = alpha·pool′(dy) + beta·dx`: the gradient of [`pooling_forward`](Self::pooling_forward)
    /// with respect to `x`, from the forward's input `x`, its output `y` and the incoming
    /// gradient `dy`.
    ///
    /// The max modes route each `dy` to the position of its window's maximum (found by
    /// comparing `x` with `y`, so `y` must be the forward's output); the average modes spread it
    /// evenly over the window. `dy` has the dims and strides of `y`, `dx` those of `x` (cuDNN's
    /// rule). With `beta == 0` the old contents of `dx` are not read.
    #[doc(alias = "cudnnPoolingBackward")]
    #[allow(clippy::too_many_arguments)] // mirrors cuDNN's argument list
    pub fn pooling_backward<T: DataType>(
        &self,
        pool: &PoolingDesc,
        alpha: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        dx_desc: &TensorDesc<T>,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        check_float::<T>("pooling backward")?;
        pool.check_output_dims(x_desc.dims(), y_desc.dims())?;
        same_dims(
            "y",
            y_desc.layout(),
            "dy",
            dy_desc.layout(),
            "dy has the dims of y",
        )?;
        same_dims(
            "x",
            x_desc.layout(),
            "dx",
            dx_desc.layout(),
            "dx has the dims of x",
        )?;
        // cuDNN answers BAD_PARAM when a pair differs in dims or strides.
        grad_strides_match(
            "pooling backward layouts",
            y_desc.layout(),
            dy_desc.layout(),
            x_desc.layout(),
            dx_desc.layout(),
            "dy with the dims and strides of y (cuDNN's rule)",
            "dx with the dims and strides of x (cuDNN's rule)",
        )?;
        let grad = Grad::Apart(("dy", dy_desc, dy), ("dx", dx_desc, dx));
        let args = self.grad_args(&alpha, ("y", y_desc, y), ("x", x_desc, x), &beta, grad)?;
        // SAFETY: live handle and descriptors; every buffer holds its descriptor's span on the
        // handle's context; `dx` does not overlap itself and cannot alias the inputs (`&mut` vs
        // `&`) (checked by `grad_args`); `y`'s dims are the pooling output of `x`'s, `dy` has
        // `y`'s layout and `dx` has `x`'s (checked above); alpha/beta are `T::Scalar`; the
        // guards in `args` keep the buffers alive and ordered until enqueued.
        unsafe { call_grad!(ffi::cudnnPoolingBackward, self, [pool.as_raw()], args) }
    }
}
