//! Element-wise activations (`cudnnActivationForward` / `cudnnActivationBackward`): sigmoid,
//! ReLU, tanh, clipped ReLU, ELU, swish and GELU, forward and backward, with in-place variants
//! where cuDNN documents them.
//!
//! An [`ActivationDesc`] owns the cuDNN descriptor, built once with its mode, parameter and NaN
//! rule; every launch checks, before anything is enqueued, that the tensors agree in shape (and,
//! for the backward pass, in strides as cuDNN requires), that each buffer holds its descriptor's
//! span on the handle's context, and that outputs do not overlap themselves.
//!
//! When every tensor of a call shares one packed layout (the common case), the crate's own
//! streaming kernels run instead of cuDNN's, which stay below a device copy's bandwidth: ReLU
//! forward on `f32` (hand-written PTX), and sigmoid, tanh, swish, ELU and GELU forward and
//! backward on `f32`, `f16` and `bf16` (generated from one template and compiled at run time
//! with NVRTC). They compute what cuDNN computes, and every check runs first either way;
//! everything else goes to cuDNN (see [`Cudnn::activation_forward`] and
//! [`Cudnn::activation_backward`]). GELU, which cuDNN's activation API lacks, runs only on the
//! crate's kernels.
//!
//! ```no_run
//! use cudnn_safe::activation::{ActivationDesc, ActivationMode};
//! use cudnn_safe::{cuda_context, Cudnn, TensorDesc};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! let relu = ActivationDesc::new(ActivationMode::Relu)?;
//! let d = TensorDesc::<f32>::nchw(8, 16, 32, 32)?;
//! let x = stream.clone_htod(&vec![-0.5f32; d.span()]).unwrap();
//! let mut y = stream.alloc_zeros::<f32>(d.span()).unwrap();
//! cudnn.activation_forward(&relu, 1.0, &d, &x, 0.0, &d, &mut y)?;
//! // Backward: dx = dy · relu'(x), here written over dy in place.
//! let mut grad = stream.clone_htod(&vec![1.0f32; d.span()]).unwrap();
//! cudnn.activation_backward_in_place(&relu, 1.0, &d, &y, &d, &x, 0.0, &d, &mut grad)?;
//! # Ok(()) }
//! ```
use std::fmt;

use cudarc::driver::sys::CUdeviceptr;
use cudnn_safe_sys as sys;

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::checks::{call_grad, call_xy, require_shapes, Grad, GradArgs, NoBuffer, XyArgs};
use crate::dtype::{DType, DataType, Scalar as _};
use crate::error::{Error, Result};
use crate::fast::elementwise::{ActOp, Elem, Outcome, Saved};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::{Layout, TensorDesc};

/// The C calls this module needs beyond `raw` (declared here so `raw.rs` stays shared).
#[allow(non_snake_case)]
mod ffi {
    use cudnn_safe_sys as sys;
    use std::ffi::c_void;

    crate::raw::raw_fns! {
        fn cudnnSetActivationDescriptorSwishBeta(
            desc: sys::cudnnActivationDescriptor_t,
            swish_beta: f64,
        );
        fn cudnnActivationForward(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnActivationDescriptor_t,
            alpha: *const c_void,
            x_desc: sys::cudnnTensorDescriptor_t,
            x: *const c_void,
            beta: *const c_void,
            y_desc: sys::cudnnTensorDescriptor_t,
            y: *mut c_void,
        );
        fn cudnnActivationBackward(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnActivationDescriptor_t,
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
}

/// Whether NaN inputs propagate to the output (`cudnnNanPropagation_t`), for activations and max
/// pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NanPropagation {
    /// A NaN input gives a NaN output, as in PyTorch (`relu(NaN) = NaN`). The default, so that
    /// a diverging computation shows instead of being silently masked.
    #[default]
    Propagate,
    /// NaN inputs are not propagated (cuDNN's `CUDNN_NOT_PROPAGATE_NAN`).
    NotPropagate,
}

impl NanPropagation {
    pub(crate) fn raw(self) -> sys::cudnnNanPropagation_t {
        match self {
            NanPropagation::Propagate => sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
            NanPropagation::NotPropagate => sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
        }
    }
}

/// Which GELU: PyTorch's `gelu(x, approximate='none')` or `gelu(x, approximate='tanh')`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[doc(alias = "approximate")]
pub enum GeluApproximation {
    /// `x·Φ(x)` with the exact normal CDF `Φ(x) = (1 + erf(x/√2))/2` (PyTorch's
    /// `approximate='none'`, the default).
    #[default]
    #[doc(alias = "none")]
    Exact,
    /// `x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (PyTorch's `approximate='tanh'`).
    Tanh,
}

/// An activation function with its parameter (`cudnnActivationMode_t` plus the coefficient or
/// swish β cuDNN keeps beside it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ActivationMode {
    /// `1 / (1 + e^−x)`.
    Sigmoid,
    /// `max(0, x)`.
    Relu,
    /// `tanh(x)`.
    Tanh,
    /// `min(max(0, x), ceiling)` (ReLU6 is `ceiling = 6`). The ceiling must be finite and > 0.
    ClippedRelu {
        /// The upper clip.
        ceiling: f64,
    },
    /// `x` for `x > 0`, `alpha·(eˣ − 1)` otherwise. `alpha` must be finite.
    Elu {
        /// The negative-side scale.
        alpha: f64,
    },
    /// `x · sigmoid(beta·x)` (SiLU is `beta = 1`). `beta` must be finite.
    Swish {
        /// The sigmoid's slope.
        beta: f64,
    },
    /// GELU, `x·Φ(x)`, exact or tanh-approximated, with PyTorch's derivatives. cuDNN's
    /// activation API has no GELU: it runs only on the crate's own kernels (`f32`, `f16` and
    /// `bf16` tensors sharing one packed layout), and [`Cudnn::activation_forward`] and
    /// [`Cudnn::activation_backward`] return an error for the cases those do not cover, or
    /// where they are not available ([`Error::KernelUnavailable`]: no NVRTC library).
    #[doc(alias = "gelu")]
    Gelu {
        /// Exact or tanh approximation.
        approximate: GeluApproximation,
    },
    /// The identity. cuDNN runs it only as the activation of the fused convolution
    /// (`cudnnConvolutionBiasActivationForward` with the implicit-precomp-GEMM algorithm); its
    /// documentation says it does not work with `cudnnActivationForward` or
    /// `cudnnActivationBackward`, so [`Cudnn::activation_forward`] and
    /// [`Cudnn::activation_backward`] reject it. A descriptor can still be built.
    Identity,
}

impl ActivationMode {
    /// The mode cuDNN's descriptor holds. GELU has none: its descriptor holds the identity as
    /// a placeholder, and the crate never hands it to cuDNN (see [`ActivationDesc::as_raw`]).
    fn raw(self) -> sys::cudnnActivationMode_t {
        use sys::cudnnActivationMode_t as M;
        match self {
            ActivationMode::Sigmoid => M::CUDNN_ACTIVATION_SIGMOID,
            ActivationMode::Relu => M::CUDNN_ACTIVATION_RELU,
            ActivationMode::Tanh => M::CUDNN_ACTIVATION_TANH,
            ActivationMode::ClippedRelu { .. } => M::CUDNN_ACTIVATION_CLIPPED_RELU,
            ActivationMode::Elu { .. } => M::CUDNN_ACTIVATION_ELU,
            ActivationMode::Swish { .. } => M::CUDNN_ACTIVATION_SWISH,
            ActivationMode::Identity | ActivationMode::Gelu { .. } => M::CUDNN_ACTIVATION_IDENTITY,
        }
    }

    /// Whether cuDNN's activation calls compute this mode (all but GELU).
    fn cudnn_has(self) -> bool {
        !matches!(self, ActivationMode::Gelu { .. })
    }

    /// The crate's generated kernel for this mode, with its parameter (ELU's alpha, swish's β;
    /// 0 for the others), or `None` (ReLU, clipped ReLU, identity).
    fn generated(self) -> Option<(ActOp, f32)> {
        Some(match self {
            ActivationMode::Sigmoid => (ActOp::Sigmoid, 0.0),
            ActivationMode::Tanh => (ActOp::Tanh, 0.0),
            ActivationMode::Swish { beta } => (ActOp::Swish, beta as f32),
            ActivationMode::Elu { alpha } => (ActOp::Elu, alpha as f32),
            ActivationMode::Gelu {
                approximate: GeluApproximation::Exact,
            } => (ActOp::Gelu, 0.0),
            ActivationMode::Gelu {
                approximate: GeluApproximation::Tanh,
            } => (ActOp::GeluTanh, 0.0),
            ActivationMode::Relu
            | ActivationMode::ClippedRelu { .. }
            | ActivationMode::Identity => return None,
        })
    }

    /// The `coef` argument of `cudnnSetActivationDescriptor`: the ceiling of the clipped ReLU,
    /// ELU's alpha, 0 for the others (swish takes its β through a separate call).
    fn coef(self) -> f64 {
        match self {
            ActivationMode::ClippedRelu { ceiling } => ceiling,
            ActivationMode::Elu { alpha } => alpha,
            _ => 0.0,
        }
    }

    /// cuDNN stores any coefficient (NaN and negative ceilings included) without complaint, so
    /// the parameter is checked here.
    fn validate(self) -> Result<()> {
        match self {
            ActivationMode::ClippedRelu { ceiling } if !(ceiling.is_finite() && ceiling > 0.0) => {
                Err(Error::invalid(
                    "clipped ReLU ceiling",
                    "a finite value > 0",
                    ceiling,
                ))
            }
            ActivationMode::Elu { alpha } if !alpha.is_finite() => {
                Err(Error::invalid("ELU alpha", "a finite value", alpha))
            }
            ActivationMode::Swish { beta } if !beta.is_finite() => {
                Err(Error::invalid("swish beta", "a finite value", beta))
            }
            _ => Ok(()),
        }
    }
}

/// Builder for an [`ActivationDesc`]: the mode (with its parameter) and the NaN rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationBuilder {
    mode: ActivationMode,
    nan: NanPropagation,
}

impl ActivationBuilder {
    /// Whether NaN inputs propagate (default [`NanPropagation::Propagate`]).
    #[must_use]
    pub fn nan(mut self, nan: NanPropagation) -> Self {
        self.nan = nan;
        self
    }

    /// Validates the parameter and creates the cuDNN descriptor.
    #[doc(alias = "cudnnCreateActivationDescriptor")]
    #[doc(alias = "cudnnSetActivationDescriptor")]
    #[doc(alias = "cudnnSetActivationDescriptorSwishBeta")]
    pub fn build(&self) -> Result<ActivationDesc> {
        self.mode.validate()?;
        let lib = raw::lib()?;
        // Owned from here: dropping it destroys the descriptor if a set call fails.
        let desc = raw::OwnedActivation::new(lib)?;
        // SAFETY: live descriptor; valid enum values; `coef` is a plain double.
        unsafe {
            raw::cudnnSetActivationDescriptor(
                lib,
                desc.as_ptr(),
                self.mode.raw(),
                self.nan.raw(),
                self.mode.coef(),
            )
        }?;
        if let ActivationMode::Swish { beta } = self.mode {
            // SAFETY: live descriptor, already set to the swish mode; β is a plain double.
            unsafe { ffi::cudnnSetActivationDescriptorSwishBeta(lib, desc.as_ptr(), beta) }?;
        }
        Ok(ActivationDesc {
            raw: desc,
            mode: self.mode,
            nan: self.nan,
        })
    }
}

/// An owned activation descriptor (`cudnnActivationDescriptor_t`) with its mode and NaN rule.
///
/// Immutable once built; `Send`. The cuDNN descriptor is created once here, never per launch.
pub struct ActivationDesc {
    raw: raw::OwnedActivation,
    mode: ActivationMode,
    nan: NanPropagation,
}

impl fmt::Debug for ActivationDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActivationDesc")
            .field("mode", &self.mode)
            .field("nan", &self.nan)
            .finish()
    }
}

impl ActivationDesc {
    /// A builder for `mode`, propagating NaN.
    #[must_use]
    pub fn builder(mode: ActivationMode) -> ActivationBuilder {
        ActivationBuilder {
            mode,
            nan: NanPropagation::default(),
        }
    }

    /// The descriptor for `mode`, propagating NaN (`builder(mode).build()`).
    pub fn new(mode: ActivationMode) -> Result<Self> {
        Self::builder(mode).build()
    }

    /// The activation function and its parameter.
    pub fn mode(&self) -> ActivationMode {
        self.mode
    }
    /// The NaN rule.
    pub fn nan(&self) -> NanPropagation {
        self.nan
    }
    /// The raw descriptor, for cuDNN functions this crate does not wrap. It stays owned by
    /// `self` and must not be destroyed or modified.
    ///
    /// cuDNN has no GELU mode: the descriptor of an [`ActivationMode::Gelu`] holds
    /// `CUDNN_ACTIVATION_IDENTITY` as a placeholder, so a cuDNN function given it computes the
    /// identity, not GELU.
    pub fn as_raw(&self) -> sys::cudnnActivationDescriptor_t {
        self.raw.as_ptr()
    }

    fn check_runnable(&self) -> Result<()> {
        if self.mode == ActivationMode::Identity {
            return Err(Error::invalid(
                "activation mode",
                "Sigmoid, Relu, Tanh, ClippedRelu, Elu, Swish or Gelu (cuDNN runs Identity only \
                 inside the fused convolution, not in cudnnActivationForward/Backward)",
                "Identity",
            ));
        }
        Ok(())
    }
}

/// The floating-point types cuDNN's legacy element-wise, pooling and softmax kernels take.
pub(crate) fn check_float<T: DataType>(op: &'static str) -> Result<()> {
    match T::DTYPE {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(()),
        other => Err(Error::UnsupportedDataType {
            op,
            detail: format!("{other} (this operation takes f32, f64, f16 or bf16)"),
        }),
    }
}

/// The tensor shapes cuDNN documents for activation and softmax: "all tensor formats are
/// supported for 4 and 5 dimensions ... for more than 5 dimensions the tensors must have their
/// spatial dimensions packed". A 3-D `[N, C, W]` tensor is handed to cuDNN as 4-D
/// `[N, C, 1, W]` (see [`TensorDesc::new`]); lower ranks are not documented at all, so they are
/// refused here rather than left to cuDNN's kernels.
pub(crate) fn check_nd(what: &'static str, layout: &Layout) -> Result<()> {
    let (dims, strides) = (layout.dims(), layout.strides());
    let r = dims.len();
    if r < 3 {
        return Err(Error::invalid(
            what,
            "3 to 8 dimensions [N, C, spatial...] (give a [N, C] tensor as [N, C, 1])",
            format!("{r} dimensions {dims:?}"),
        ));
    }
    if r > 5 {
        let packed = strides[r - 1] == 1
            && (2..r - 1).all(|i| Some(strides[i]) == strides[i + 1].checked_mul(dims[i + 1]));
        if !packed {
            return Err(Error::invalid(
                what,
                "packed spatial dimensions when there are more than 5 dimensions (cuDNN's rule)",
                format!("dims {dims:?}, strides {strides:?}"),
            ));
        }
    }
    Ok(())
}

/// Whether two layouts address the same elements (same dims and strides, whatever the format
/// they were declared with).
pub(crate) fn same_layout(a: &Layout, b: &Layout) -> bool {
    a.dims() == b.dims() && a.strides() == b.strides()
}

/// Errors unless `b` has `a`'s dimensions.
pub(crate) fn same_dims(
    a: &'static str,
    a_layout: &Layout,
    b: &'static str,
    b_layout: &Layout,
    rule: &'static str,
) -> Result<()> {
    let (ad, bd) = (a_layout.dims(), b_layout.dims());
    require_shapes(ad == bd, (a, ad), (b, bd), rule)
}

/// Errors unless `b` has `a`'s strides (dims are checked separately).
fn same_strides(
    what: &'static str,
    a: &'static str,
    a_layout: &Layout,
    b: &'static str,
    b_layout: &Layout,
    rule: &'static str,
) -> Result<()> {
    if same_layout(a_layout, b_layout) {
        return Ok(());
    }
    Err(Error::invalid(
        what,
        rule,
        format!(
            "{a} strides {:?}, {b} strides {:?}",
            a_layout.strides(),
            b_layout.strides()
        ),
    ))
}

/// The layout rule of cuDNN's legacy backward calls taking `y, dy, x, dx` (activation,
/// pooling): `dy` has the strides of `y` and `dx` those of `x`; `dy_rule` and `dx_rule` state
/// it in the error. Checking it here also means no kernel ever addresses one of a pair through
/// the other's strides.
pub(crate) fn grad_strides_match(
    what: &'static str,
    y: &Layout,
    dy: &Layout,
    x: &Layout,
    dx: &Layout,
    dy_rule: &'static str,
    dx_rule: &'static str,
) -> Result<()> {
    same_strides(what, "y", y, "dy", dy, dy_rule)?;
    same_strides(what, "x", x, "dx", dx, dx_rule)
}

const SAME_DIMS: &str = "activation tensors all have the same dimensions";

/// The element count of a launch whose tensors all have one packed layout (same dimensions and
/// strides, no gaps, no overlap, in any dimension order), or `None`. For such a launch the
/// offsets of the logical elements are exactly `0..count` in every tensor, and each logical
/// element has the same offset in all of them, so an element-wise function can run over the
/// flat range `0..count` of every buffer.
fn packed_alike(layouts: &[&Layout]) -> Option<usize> {
    let (first, rest) = layouts.split_first()?;
    let alike = first.is_packed()
        && first.is_non_overlapping()
        && rest.iter().all(|l| same_layout(first, l));
    alike.then(|| first.element_count())
}

/// Whether a forward launch may run the crate's own ReLU kernel (`fast.rs`): ReLU on `f32`,
/// input and output of one packed layout. Returns the element count.
fn fast_relu<T: DataType>(act: &ActivationDesc, layouts: &[&Layout]) -> Option<usize> {
    if act.mode != ActivationMode::Relu || T::DTYPE != DType::F32 {
        return None;
    }
    packed_alike(layouts)
}

/// The kernel a launch runs, decided from the mode, the type and the layouts before any buffer
/// is touched.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    /// The crate's ReLU PTX kernel over `n` elements (forward only).
    Relu(usize),
    /// The crate's generated kernel of `op` on `elem` over `n` elements, with its parameter.
    Generated {
        op: ActOp,
        elem: Elem,
        n: usize,
        param: f32,
    },
    /// cuDNN's activation call.
    Cudnn,
}

/// The path of a forward launch over `layouts` (x and y, or the one in-place tensor): ReLU's
/// PTX kernel, the generated kernels, or cuDNN; an error for GELU where the generated kernels
/// cannot run (cuDNN has no GELU).
fn forward_path<T: DataType>(act: &ActivationDesc, layouts: &[&Layout]) -> Result<Path> {
    match fast_relu::<T>(act, layouts) {
        Some(n) => Ok(Path::Relu(n)),
        None => generated_path::<T>(act, layouts, "GELU forward"),
    }
}

/// The generated kernel for `act` on `T` tensors with `layouts` (every tensor of the call)
/// when the mode has one, the type is `f32`, `f16` or `bf16` and the layouts are one packed
/// layout; otherwise cuDNN, or for GELU an error saying why not.
fn generated_path<T: DataType>(
    act: &ActivationDesc,
    layouts: &[&Layout],
    op_name: &'static str,
) -> Result<Path> {
    let elem = Elem::of(T::DTYPE);
    if let (Some((op, param)), Some(elem), Some(n)) =
        (act.mode.generated(), elem, packed_alike(layouts))
    {
        return Ok(Path::Generated { op, elem, n, param });
    }
    if act.mode.cudnn_has() {
        return Ok(Path::Cudnn);
    }
    if elem.is_none() {
        return Err(Error::UnsupportedDataType {
            op: op_name,
            detail: format!(
                "{} (GELU runs only on cudnn-safe's own kernels, which take f32, f16 and bf16; \
                 cuDNN's activation API has no GELU)",
                T::DTYPE
            ),
        });
    }
    let shown: Vec<String> = layouts
        .iter()
        .map(|l| format!("dims {:?} strides {:?}", l.dims(), l.strides()))
        .collect();
    Err(Error::invalid(
        "GELU tensor layouts",
        "one packed layout (the same dimensions and strides, no gaps) for every tensor of the \
         call: GELU runs only on cudnn-safe's own kernels (cuDNN's activation API has none)",
        shown.join("; "),
    ))
}

impl Cudnn {
    /// `y = alpha·f(x) + beta·y`, element-wise, for the activation `f` of `act`.
    ///
    /// `x` and `y` have the same dimensions (3 to 8 of them) and may differ in strides (e.g. NCHW
    /// in, NHWC out). With `beta == 0` the old contents of `y` are not read. To overwrite the
    /// input, use [`activation_forward_in_place`](Self::activation_forward_in_place).
    ///
    /// Which kernel runs, when `x` and `y` share one packed layout (same dimensions and
    /// strides, no gaps: NCHW, NHWC, any order) — the crate's own streaming kernels, a
    /// grid-stride loop over 16-byte vectors (a scalar loop when a buffer is not 16-byte
    /// aligned, e.g. a view starting one element in):
    ///
    /// * ReLU on `f32`: a hand-written PTX kernel, JIT-compiled by the driver once per handle;
    /// * sigmoid, tanh, swish, ELU and GELU on `f32`, `f16` and `bf16`: kernels generated from
    ///   one template, computing in `f32`, compiled with NVRTC the first time a process needs
    ///   one (about a tenth to a fifth of a second each, once per activation, type and
    ///   direction) and loaded once per handle.
    ///
    /// These stream memory at close to copy speed, where cuDNN's activation kernel leaves part
    /// of the bandwidth unused. They compute what cuDNN does: `alpha`, `beta`, and the NaN rule
    /// of `act` for ReLU (`relu(NaN)` is NaN when NaN propagates, 0 otherwise); the other
    /// functions are arithmetic, so a NaN input gives a NaN output under either rule. Every
    /// other case (ReLU on other types, clipped ReLU, `f64`, differing or padded layouts), and
    /// every case where a kernel cannot be loaded (no NVRTC library, a compile or load failure:
    /// logged once at debug level and remembered by the handle), runs
    /// `cudnnActivationForward`. GELU has no cuDNN fallback: outside the cases above it
    /// returns an error, [`Error::KernelUnavailable`] when its kernel cannot be loaded.
    ///
    /// Errors: [`ActivationMode::Identity`] (cuDNN runs it only in the fused convolution),
    /// non-float types, ranks below 3, shape mismatches, short or foreign buffers, a
    /// self-overlapping `y`; for GELU also `f64`, layouts that are not one packed layout, and
    /// an unavailable kernel.
    #[doc(alias = "cudnnActivationForward")]
    #[allow(clippy::too_many_arguments)] // mirrors cuDNN's argument list
    pub fn activation_forward<T: DataType>(
        &self,
        act: &ActivationDesc,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        act.check_runnable()?;
        check_float::<T>("activation")?;
        check_nd("activation tensor", x_desc.layout())?;
        check_nd("activation tensor", y_desc.layout())?;
        same_dims("x", x_desc.layout(), "y", y_desc.layout(), SAME_DIMS)?;
        let path = forward_path::<T>(act, &[x_desc.layout(), y_desc.layout()])?;
        let args = self.xy_args(&alpha, ("x", x_desc, x), &beta, ("y", y_desc, y))?;
        // SAFETY: `args` holds `x` and `y` as `xy_args` checked them (spans on the handle's
        // context, `y` not overlapping itself); `x` is borrowed shared and `y` exclusively, so
        // they are distinct buffers; the dims agree (checked above); `path` is `forward_path`
        // of their layouts; alpha/beta are `T::Scalar`.
        unsafe { self.activation_launch::<T>(act, &args, path, alpha, beta) }
    }

    /// `xy = alpha·f(xy) + beta·xy`, in place: the activation overwrites its input.
    ///
    /// cuDNN documents in-place operation for `cudnnActivationForward` when the input and output
    /// descriptors are identical, which passing one descriptor guarantees. On a packed tensor
    /// the crate's own kernels run, as in [`activation_forward`](Self::activation_forward)
    /// (each element is read and then written by one thread, so in place is safe for them
    /// too).
    #[doc(alias = "cudnnActivationForward")]
    pub fn activation_forward_in_place<T: DataType>(
        &self,
        act: &ActivationDesc,
        alpha: T::Scalar,
        beta: T::Scalar,
        xy_desc: &TensorDesc<T>,
        xy: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        act.check_runnable()?;
        check_float::<T>("activation")?;
        check_nd("activation tensor", xy_desc.layout())?;
        let path = forward_path::<T>(act, &[xy_desc.layout()])?;
        let args = self.xy_args_in_place(&alpha, &beta, ("xy", xy_desc, xy))?;
        // SAFETY: `args` holds `xy` as input and output, checked by `xy_args_in_place` (its
        // span on the handle's context, not overlapping itself) and borrowed exclusively; one
        // descriptor for both, the in-place form cuDNN documents; `path` is `forward_path` of
        // its layout; alpha/beta are `T::Scalar`.
        unsafe { self.activation_launch::<T>(act, &args, path, alpha, beta) }
    }

    /// The launch behind both forward calls, after every check: the crate's kernel `path`
    /// names (when it loads), else `cudnnActivationForward` (for GELU, an error).
    ///
    /// # Safety
    ///
    /// `args` comes from [`Cudnn::xy_args`] or [`Cudnn::xy_args_in_place`] on this handle for
    /// `T` tensors of equal dims (so `x` and `y` are distinct buffers, or the same pointer with
    /// the same descriptor), and `path` is [`forward_path`] of their layouts.
    unsafe fn activation_launch<T: DataType>(
        &self,
        act: &ActivationDesc,
        args: &XyArgs<'_>,
        path: Path,
        alpha: T::Scalar,
        beta: T::Scalar,
    ) -> Result<()> {
        match path {
            Path::Relu(n) => {
                // SAFETY: `fast_relu` holds only for f32 tensors whose layouts are identical,
                // packed and non-overlapping, so their elements sit at offsets exactly `0..n`,
                // the same offset for the same logical element in both, and `n` equals each
                // descriptor's span, which `x` and `y` were checked to hold, on the handle's
                // context (the caller's contract). They are distinct buffers, nothing else
                // writing `x` meanwhile, or one pointer (in place: each element is read and
                // then written by one thread); the guards in `args` keep them alive and
                // ordered on the handle's stream until the launch is enqueued. For `T = f32`,
                // `T::Scalar` is `f32`, so the conversions are exact.
                let launched = unsafe {
                    self.relu_f32_fast(
                        args.x as CUdeviceptr,
                        args.y as CUdeviceptr,
                        n,
                        alpha.to_f64() as f32,
                        beta.to_f64() as f32,
                        act.nan,
                    )
                }?;
                if launched {
                    return Ok(());
                }
            }
            Path::Generated { op, elem, n, param } => {
                // SAFETY: `generated_path` gives this path only for f32, f16 or bf16 tensors
                // (`elem` is `T`'s type) whose layouts are identical, packed and
                // non-overlapping, so their elements sit at offsets exactly `0..n` in both and
                // `n` is each descriptor's span, which `x` and `y` were checked to hold on the
                // handle's context (the caller's contract). They are distinct buffers or one
                // pointer (in place); the guards in `args` keep them alive and ordered on the
                // handle's stream until the launch is enqueued. `T::Scalar` is `f32` for these
                // types, so the conversions are exact.
                let outcome = unsafe {
                    self.act_forward_fast(
                        op,
                        elem,
                        args.x as CUdeviceptr,
                        args.y as CUdeviceptr,
                        n,
                        alpha.to_f64() as f32,
                        beta.to_f64() as f32,
                        param,
                    )
                }?;
                match outcome {
                    Outcome::Launched => return Ok(()),
                    Outcome::Unavailable(reason) if !act.mode.cudnn_has() => {
                        return Err(Error::KernelUnavailable {
                            op: "GELU forward",
                            reason,
                        })
                    }
                    Outcome::Unavailable(_) => {}
                }
            }
            Path::Cudnn => {}
        }
        // `forward_path` gives GELU no other path than the crate's kernel, and that returned
        // above; checked again so the placeholder descriptor can never reach cuDNN.
        if !act.mode.cudnn_has() {
            return Err(Error::invalid(
                "activation path",
                "cudnn-safe's own kernel for GELU",
                "cuDNN",
            ));
        }
        // SAFETY: live handle and descriptors; `x` and `y` hold their descriptors' spans on the
        // handle's context and `y` does not overlap itself; they are distinct, or the same
        // pointer with the same descriptor (the in-place form cuDNN documents); the dimensions
        // agree (the caller's contract). alpha/beta point at `T::Scalar`, the type cuDNN reads
        // for `T`; the guards keep both buffers alive and ordered until enqueued.
        unsafe { call_xy!(ffi::cudnnActivationForward, self, [act.as_raw()], args) }
    }

    /// Every check of a backward call but the buffers', and its path: the crate's generated
    /// kernel when all four tensors share one packed layout (and the mode and type have one),
    /// else cuDNN (for GELU, an error).
    fn check_activation_backward<T: DataType>(
        &self,
        act: &ActivationDesc,
        y_desc: &TensorDesc<T>,
        dy_desc: &TensorDesc<T>,
        x_desc: &TensorDesc<T>,
        dx_desc: &TensorDesc<T>,
    ) -> Result<Path> {
        act.check_runnable()?;
        check_float::<T>("activation backward")?;
        check_nd("activation tensor", x_desc.layout())?;
        check_nd("activation tensor", y_desc.layout())?;
        same_dims("x", x_desc.layout(), "y", y_desc.layout(), SAME_DIMS)?;
        same_dims("y", y_desc.layout(), "dy", dy_desc.layout(), SAME_DIMS)?;
        same_dims("x", x_desc.layout(), "dx", dx_desc.layout(), SAME_DIMS)?;
        // cuDNN answers NOT_SUPPORTED when these strides differ.
        grad_strides_match(
            "activation backward layouts",
            y_desc.layout(),
            dy_desc.layout(),
            x_desc.layout(),
            dx_desc.layout(),
            "dy with the strides of y (cuDNN's rule)",
            "dx with the strides of x (cuDNN's rule)",
        )?;
        let layouts = [
            y_desc.layout(),
            dy_desc.layout(),
            x_desc.layout(),
            dx_desc.layout(),
        ];
        generated_path::<T>(act, &layouts, "GELU backward")
    }

    /// `dx = alpha·(dy ⊙ f′) + beta·dx`: the gradient of the activation, from its output `y`,
    /// the incoming gradient `dy` and its input `x`.
    ///
    /// All four tensors have the same dimensions; `dy` has the strides of `y` and `dx` those of
    /// `x` (cuDNN's rule). With `beta == 0` the old contents of `dx` are not read. To write the
    /// gradient over `dy`, use [`activation_backward_in_place`](Self::activation_backward_in_place).
    ///
    /// Which kernel runs: sigmoid, tanh, swish, ELU and GELU on `f32`, `f16` and `bf16` with all
    /// four tensors of one packed layout run the crate's generated kernels (see
    /// [`activation_forward`](Self::activation_forward)), with PyTorch's formulas, reading only
    /// what PyTorch's backward reads: `y` for sigmoid (`dy·y·(1 − y)`) and tanh
    /// (`dy·(1 − y²)`), `x` for swish (`dy·s·(1 + βx·(1 − s))`, `s = σ(βx)`), ELU (`dy` for
    /// `x > 0`, else `dy·α·eˣ`) and GELU. Everything else (ReLU, clipped ReLU, `f64`, other
    /// layouts, a kernel that cannot be loaded) runs `cudnnActivationBackward`, except GELU,
    /// which then returns an error as in the forward pass.
    #[doc(alias = "cudnnActivationBackward")]
    #[allow(clippy::too_many_arguments)] // mirrors cuDNN's argument list
    pub fn activation_backward<T: DataType>(
        &self,
        act: &ActivationDesc,
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
        let path = self.check_activation_backward(act, y_desc, dy_desc, x_desc, dx_desc)?;
        let grad = Grad::Apart(("dy", dy_desc, dy), ("dx", dx_desc, dx));
        let args = self.grad_args(&alpha, ("y", y_desc, y), ("x", x_desc, x), &beta, grad)?;
        // SAFETY: `args` holds the four buffers as `grad_args` checked them (spans on the
        // handle's context, `dx` not overlapping itself); `dx` is borrowed exclusively and the
        // others shared, so `dx` aliases none of them; dims agree and the stride pairs cuDNN
        // requires are equal (checked above); `path` is `check_activation_backward`'s for these
        // layouts; alpha/beta are `T::Scalar`.
        unsafe { self.activation_backward_launch::<T>(act, &args, path, alpha, beta) }
    }

    /// [`activation_backward`](Self::activation_backward) with the gradient written over the
    /// incoming one: `grad` holds `dy` on entry and `dx = alpha·(dy ⊙ f′) + beta·dy` on return.
    ///
    /// cuDNN documents in-place operation for `cudnnActivationBackward` when the `dy` and `dx`
    /// descriptors are identical, which passing one descriptor guarantees; with cuDNN's stride
    /// rule, `x` and `y` then have `grad`'s strides too. The crate's kernels run as in
    /// [`activation_backward`](Self::activation_backward) (each element of `grad` is read and
    /// then written by one thread).
    #[doc(alias = "cudnnActivationBackward")]
    #[allow(clippy::too_many_arguments)] // mirrors cuDNN's argument list
    pub fn activation_backward_in_place<T: DataType>(
        &self,
        act: &ActivationDesc,
        alpha: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &impl DeviceBuffer<T>,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        grad_desc: &TensorDesc<T>,
        grad: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let path = self.check_activation_backward(act, y_desc, grad_desc, x_desc, grad_desc)?;
        let grad = Grad::<T, NoBuffer<T>, _>::InPlace(("grad", grad_desc, grad));
        let args = self.grad_args(&alpha, ("y", y_desc, y), ("x", x_desc, x), &beta, grad)?;
        // SAFETY: as in `activation_backward`; `dy` and `dx` are the same pointer with the same
        // descriptor, the in-place form cuDNN documents, and `grad` cannot alias `x` or `y`.
        unsafe { self.activation_backward_launch::<T>(act, &args, path, alpha, beta) }
    }

    /// The launch behind both backward calls, after every check: the generated kernel `path`
    /// names (when it loads), else `cudnnActivationBackward` (for GELU, an error).
    ///
    /// # Safety
    ///
    /// `args` comes from [`Cudnn::grad_args`] on this handle for `T` tensors of equal dims
    /// whose stride pairs cuDNN requires are equal (so `dx` aliases neither `x` nor `y`, and is
    /// either `dy` with the same descriptor or distinct from it), and `path` is
    /// `check_activation_backward`'s for their layouts.
    unsafe fn activation_backward_launch<T: DataType>(
        &self,
        act: &ActivationDesc,
        args: &GradArgs<'_>,
        path: Path,
        alpha: T::Scalar,
        beta: T::Scalar,
    ) -> Result<()> {
        if let Path::Generated { op, elem, n, param } = path {
            let saved = match op.saved() {
                Saved::X => args.x,
                Saved::Y => args.y,
            };
            // SAFETY: `generated_path` gives this path only for f32, f16 or bf16 tensors
            // (`elem` is `T`'s type) whose four layouts are identical, packed and
            // non-overlapping, so every element sits at the same offset in `0..n` in each and
            // `n` is each descriptor's span, which every buffer was checked to hold on the
            // handle's context (the caller's contract). `dx` aliases neither `x` nor `y`, and
            // is `dy` (in place) or distinct from it; the guards in `args` keep every buffer
            // alive and ordered on the handle's stream until the launch is enqueued.
            // `T::Scalar` is `f32` for these types, so the conversions are exact.
            let outcome = unsafe {
                self.act_backward_fast(
                    op,
                    elem,
                    saved as CUdeviceptr,
                    args.dy as CUdeviceptr,
                    args.dx as CUdeviceptr,
                    n,
                    alpha.to_f64() as f32,
                    beta.to_f64() as f32,
                    param,
                )
            }?;
            match outcome {
                Outcome::Launched => return Ok(()),
                Outcome::Unavailable(reason) if !act.mode.cudnn_has() => {
                    return Err(Error::KernelUnavailable {
                        op: "GELU backward",
                        reason,
                    })
                }
                Outcome::Unavailable(_) => {}
            }
        }
        // GELU never has another path (see `generated_path`); checked again so the placeholder
        // descriptor can never reach cuDNN.
        if !act.mode.cudnn_has() {
            return Err(Error::invalid(
                "activation path",
                "cudnn-safe's own kernel for GELU",
                "cuDNN",
            ));
        }
        // SAFETY: live handle and descriptors; every buffer holds its descriptor's span on the
        // handle's context, `dx` does not overlap itself and cannot alias the inputs (`&mut` vs
        // `&`), or is `dy` with the same descriptor (the in-place form cuDNN documents); dims
        // agree and the stride pairs cuDNN requires are equal (the caller's contract).
        // alpha/beta are `T::Scalar`; the guards in `args` keep the buffers alive and ordered
        // until enqueued.
        unsafe { call_grad!(ffi::cudnnActivationBackward, self, [act.as_raw()], args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_validated_before_cudnn() {
        for bad in [
            ActivationMode::ClippedRelu { ceiling: 0.0 },
            ActivationMode::ClippedRelu { ceiling: -1.0 },
            ActivationMode::ClippedRelu { ceiling: f64::NAN },
            ActivationMode::ClippedRelu {
                ceiling: f64::INFINITY,
            },
            ActivationMode::Elu { alpha: f64::NAN },
            ActivationMode::Swish {
                beta: f64::NEG_INFINITY,
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        for good in [
            ActivationMode::Sigmoid,
            ActivationMode::Relu,
            ActivationMode::Tanh,
            ActivationMode::ClippedRelu { ceiling: 6.0 },
            ActivationMode::Elu { alpha: -0.5 },
            ActivationMode::Swish { beta: 1.0 },
            ActivationMode::Identity,
            ActivationMode::Gelu {
                approximate: GeluApproximation::Tanh,
            },
        ] {
            assert!(good.validate().is_ok(), "{good:?}");
        }
    }

    /// Which launches may run over the flat range `0..count`: identical packed layouts only.
    #[test]
    fn only_identical_packed_layouts_run_flat() {
        let nchw = Layout::nchw(2, 4, 16, 16).unwrap();
        let nhwc = Layout::nhwc(2, 4, 16, 16).unwrap();
        let ndhwc = Layout::ndhwc(2, 3, 2, 5, 7).unwrap();
        assert_eq!(packed_alike(&[&nchw, &nchw]), Some(2048));
        assert_eq!(packed_alike(&[&nhwc, &nhwc]), Some(2048));
        assert_eq!(packed_alike(&[&ndhwc]), Some(420));
        // Counts that are no multiple of 4 or 8 too: the kernel has a tail.
        let odd = Layout::nchw(1, 1, 1, 3).unwrap();
        assert_eq!(packed_alike(&[&odd, &odd]), Some(3));

        // Mixed layouts, gaps, overlap: never.
        assert_eq!(packed_alike(&[&nchw, &nhwc]), None);
        let padded = Layout::strided(&[2, 4, 16, 16], &[4 * 17 * 16, 17 * 16, 17, 1]).unwrap();
        assert_eq!(packed_alike(&[&padded, &padded]), None);
        let overlapping = Layout::strided(&[2, 4, 16, 16], &[1, 1, 1, 1]).unwrap();
        assert_eq!(packed_alike(&[&overlapping]), None);
        // Same dims, different strides that are both packed (a permutation): never.
        let cwhn = Layout::strided(&[2, 4, 16, 16], &[1, 2, 8 * 16, 8]).unwrap();
        assert!(cwhn.is_packed() && cwhn.is_non_overlapping());
        assert_eq!(packed_alike(&[&nchw, &cwhn]), None);
        assert_eq!(packed_alike(&[&cwhn, &cwhn]), Some(2048));
        assert_eq!(packed_alike(&[]), None);
    }

    /// Which launches take which kernel: ReLU forward on f32 the PTX kernel; sigmoid, tanh,
    /// swish, ELU and GELU on f32, f16 and bf16 the generated ones, forward and backward;
    /// everything else cuDNN, except GELU, which is refused where its kernels cannot run
    /// (host-only, with the real library to build the descriptors; skipped without it).
    #[test]
    fn paths_follow_mode_type_and_layout() {
        if crate::checks::lib_or_skip().is_none() {
            return;
        }
        let l = Layout::nhwc(2, 3, 4, 5).unwrap();
        let nchw = Layout::nchw(2, 3, 4, 5).unwrap();
        let relu = ActivationDesc::new(ActivationMode::Relu).unwrap();
        let relu_no_nan = ActivationDesc::builder(ActivationMode::Relu)
            .nan(NanPropagation::NotPropagate)
            .build()
            .unwrap();
        assert_eq!(fast_relu::<f32>(&relu, &[&l, &l]), Some(120));
        assert_eq!(fast_relu::<f32>(&relu_no_nan, &[&l]), Some(120));
        assert_eq!(fast_relu::<f64>(&relu, &[&l, &l]), None);
        assert_eq!(fast_relu::<half::f16>(&relu, &[&l, &l]), None);
        assert_eq!(fast_relu::<half::bf16>(&relu, &[&l, &l]), None);
        assert_eq!(fast_relu::<f32>(&relu, &[&nchw, &l]), None);
        assert_eq!(
            forward_path::<f32>(&relu, &[&l, &l]).unwrap(),
            Path::Relu(120)
        );
        // ReLU has no generated kernel: f16 forward and every backward go to cuDNN.
        assert_eq!(
            forward_path::<half::f16>(&relu, &[&l, &l]).unwrap(),
            Path::Cudnn
        );
        assert_eq!(
            generated_path::<f32>(&relu, &[&l; 4], "b").unwrap(),
            Path::Cudnn
        );
        let clipped = ActivationDesc::new(ActivationMode::ClippedRelu { ceiling: 6.0 }).unwrap();
        assert_eq!(
            forward_path::<f32>(&clipped, &[&l, &l]).unwrap(),
            Path::Cudnn
        );

        let generated = [
            (ActivationMode::Sigmoid, ActOp::Sigmoid, 0.0),
            (ActivationMode::Tanh, ActOp::Tanh, 0.0),
            (ActivationMode::Swish { beta: 1.25 }, ActOp::Swish, 1.25),
            (ActivationMode::Elu { alpha: 0.75 }, ActOp::Elu, 0.75),
            (
                ActivationMode::Gelu {
                    approximate: GeluApproximation::Exact,
                },
                ActOp::Gelu,
                0.0,
            ),
            (
                ActivationMode::Gelu {
                    approximate: GeluApproximation::Tanh,
                },
                ActOp::GeluTanh,
                0.0,
            ),
        ];
        for (mode, op, param) in generated {
            let act = ActivationDesc::new(mode).unwrap();
            let want = |elem| Path::Generated {
                op,
                elem,
                n: 120,
                param,
            };
            assert_eq!(
                forward_path::<f32>(&act, &[&l, &l]).unwrap(),
                want(Elem::F32)
            );
            assert_eq!(
                forward_path::<half::f16>(&act, &[&l]).unwrap(),
                want(Elem::F16)
            );
            assert_eq!(
                generated_path::<half::bf16>(&act, &[&l; 4], "b").unwrap(),
                want(Elem::Bf16)
            );
            let padded = Layout::strided(&[2, 3, 4, 5], &[80, 20, 5, 1]).unwrap();
            let elsewhere = [
                forward_path::<f64>(&act, &[&l, &l]),
                forward_path::<f32>(&act, &[&nchw, &l]),
                forward_path::<f32>(&act, &[&padded, &padded]),
                generated_path::<f32>(&act, &[&l, &l, &nchw, &nchw], "b"),
            ];
            for (i, p) in elsewhere.into_iter().enumerate() {
                if act.mode.cudnn_has() {
                    assert_eq!(p.unwrap(), Path::Cudnn, "{mode:?} case {i}");
                } else if i == 0 {
                    assert!(
                        matches!(&p, Err(Error::UnsupportedDataType { .. })),
                        "{mode:?}: {p:?}"
                    );
                } else {
                    assert!(
                        matches!(&p, Err(Error::InvalidArgument { .. })),
                        "{mode:?} case {i}: {p:?}"
                    );
                }
            }
        }
    }

    /// GELU's descriptor holds a placeholder mode; the crate never hands it to cuDNN.
    #[test]
    fn gelu_is_never_a_cudnn_mode() {
        for approximate in [GeluApproximation::Exact, GeluApproximation::Tanh] {
            let mode = ActivationMode::Gelu { approximate };
            assert!(!mode.cudnn_has());
            assert!(mode.validate().is_ok());
            assert_eq!(mode.coef(), 0.0);
            assert!(mode.generated().is_some());
        }
        assert_eq!(GeluApproximation::default(), GeluApproximation::Exact);
        for mode in [
            ActivationMode::Sigmoid,
            ActivationMode::Relu,
            ActivationMode::Tanh,
            ActivationMode::ClippedRelu { ceiling: 6.0 },
            ActivationMode::Elu { alpha: 1.0 },
            ActivationMode::Swish { beta: 1.0 },
            ActivationMode::Identity,
        ] {
            assert!(mode.cudnn_has(), "{mode:?}");
        }
    }

    #[test]
    fn ranks_and_packed_spatial_dims() {
        assert!(check_nd("t", &Layout::nchw_nd(&[2, 3]).unwrap()).is_err());
        // [N, C, W]: cuDNN sees [N, C, 1, W].
        assert!(check_nd("t", &Layout::nchw_nd(&[2, 3, 4]).unwrap()).is_ok());
        assert!(check_nd("t", &Layout::nhwc_nd(&[2, 3, 4]).unwrap()).is_ok());
        assert!(check_nd("t", &Layout::nchw(2, 3, 4, 5).unwrap()).is_ok());
        assert!(check_nd("t", &Layout::nhwc(2, 3, 4, 5).unwrap()).is_ok());
        assert!(check_nd("t", &Layout::ndhwc(2, 3, 4, 5, 6).unwrap()).is_ok());
        assert!(check_nd("t", &Layout::nchw_nd(&[2, 3, 2, 2, 2, 2]).unwrap()).is_ok());
        // Channels-last at rank 6: the spatial dimensions are not packed.
        assert!(check_nd("t", &Layout::nhwc_nd(&[2, 3, 2, 2, 2, 2]).unwrap()).is_err());
    }
}
