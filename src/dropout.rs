//! Dropout: a [`Dropout`] owns cuDNN's dropout descriptor and the random-number-generator states
//! it draws masks from; [`Cudnn::dropout_forward`] returns the mask of that call as a
//! [`DropoutReserve`], which [`Cudnn::dropout_backward`] borrows.
//!
//! Forward computes `y = x / (1 − p)` where the element is kept and `y = 0` where it is dropped,
//! each element dropped with probability `p`; backward computes `dx = dy / (1 − p)` on the same
//! kept elements and `dx = 0` elsewhere.
//!
//! Data types: f32, f64 and f16. cuDNN 9.14 refuses bf16 dropout (`CUDNN_STATUS_NOT_SUPPORTED`),
//! so bf16 tensors are rejected with [`Error::UnsupportedDataType`] before launch.
//!
//! Reproducibility: the states are initialised from the seed when the [`Dropout`] is created, and
//! every forward call draws from them and leaves them advanced (cuDNN updates the generator states
//! in place), so successive forwards on one `Dropout` draw fresh masks, and two `Dropout`s created
//! with the same seed draw the same sequence of masks for the same sequence of shapes.
//!
//! ```no_run
//! use cudnn_safe::{cuda_context, dropout::Dropout, Cudnn, TensorDesc};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! let mut dropout = Dropout::new(&cudnn, 0.25, 42)?;
//! let d = TensorDesc::<f32>::nchw(4, 8, 16, 16)?;
//! let x = stream.clone_htod(&vec![1.0f32; d.span()]).unwrap();
//! let mut y = stream.alloc_zeros::<f32>(d.span()).unwrap();
//! let reserve = cudnn.dropout_forward(&mut dropout, &d, &x, &d, &mut y)?;
//! // ... later, with the gradient of y:
//! let dy = stream.clone_htod(&vec![1.0f32; d.span()]).unwrap();
//! let mut dx = stream.alloc_zeros::<f32>(d.span()).unwrap();
//! cudnn.dropout_backward(&dropout, &reserve, &d, &dy, &d, &mut dx)?;
//! # Ok(()) }
//! ```
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DevicePtrMut};
use cudnn_safe_sys as sys;

use crate::activation::same_dims;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::{same_context, Cudnn};
use crate::stream_order::cross_use;
use crate::tensor::{Layout, TensorDesc};

/// The C calls of this family, declared here (not in `raw.rs`) as the family's own.
mod ffi {
    #![allow(non_snake_case)] // the C names, so a search for them finds these

    use std::ffi::{c_ulonglong, c_void};

    use cudnn_safe_sys as sys;

    crate::raw::raw_fns! {
        fn cudnnCreateDropoutDescriptor(desc: *mut sys::cudnnDropoutDescriptor_t);
        fn cudnnDestroyDropoutDescriptor(desc: sys::cudnnDropoutDescriptor_t);
        fn cudnnDropoutGetStatesSize(handle: sys::cudnnHandle_t, bytes: *mut usize);
        fn cudnnDropoutGetReserveSpaceSize(x_desc: sys::cudnnTensorDescriptor_t, bytes: *mut usize);
        fn cudnnSetDropoutDescriptor(
            desc: sys::cudnnDropoutDescriptor_t,
            handle: sys::cudnnHandle_t,
            dropout: f32,
            states: *mut c_void,
            state_bytes: usize,
            seed: c_ulonglong,
        );
        fn cudnnDropoutForward(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnDropoutDescriptor_t,
            x_desc: sys::cudnnTensorDescriptor_t,
            x: *const c_void,
            y_desc: sys::cudnnTensorDescriptor_t,
            y: *mut c_void,
            reserve: *mut c_void,
            reserve_bytes: usize,
        );
        fn cudnnDropoutBackward(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnDropoutDescriptor_t,
            dy_desc: sys::cudnnTensorDescriptor_t,
            dy: *const c_void,
            dx_desc: sys::cudnnTensorDescriptor_t,
            dx: *mut c_void,
            reserve: *mut c_void,
            reserve_bytes: usize,
        );
    }

    crate::raw::owned_descriptor!(
        /// An owned `cudnnDropoutDescriptor_t`.
        OwnedDropout,
        sys::cudnnDropoutDescriptor_t,
        cudnnCreateDropoutDescriptor,
        cudnnDestroyDropoutDescriptor
    );
}

/// cuDNN's "no dropout": a descriptor of probability 0 without states, as PyTorch sets it up
/// (`set_no_dropout`) for a network that does not train with dropout.
pub(crate) struct NoDropout(ffi::OwnedDropout);

impl NoDropout {
    /// Creates and sets the descriptor on `cudnn` (bound by the caller).
    pub(crate) fn new(cudnn: &Cudnn) -> Result<Self> {
        let lib = cudnn.lib();
        let d = ffi::OwnedDropout::new(lib)?;
        // SAFETY: live descriptor and handle; probability 0 with no state buffer (null, 0
        // bytes) is the documented "no dropout" setup (PyTorch's `set_no_dropout`): nothing is
        // read or written through the null pointer.
        unsafe {
            ffi::cudnnSetDropoutDescriptor(
                lib,
                d.as_ptr(),
                cudnn.as_raw(),
                0.0,
                std::ptr::null_mut(),
                0,
                0,
            )
        }?;
        Ok(NoDropout(d))
    }

    /// The raw descriptor (still owned by `self`).
    pub(crate) fn as_raw(&self) -> sys::cudnnDropoutDescriptor_t {
        self.0.as_ptr()
    }
}

/// A dropout layer's configuration and random-number-generator state (`cudnnDropoutDescriptor_t`
/// plus the device buffer of generator states it points to).
///
/// The states live on the CUDA context of the handle that created the `Dropout`; a launch on a
/// handle of another context is rejected with [`Error::ForeignContext`]. Forward calls advance
/// the states, hence take `&mut Dropout` (cuDNN forbids two concurrent forwards on one state).
///
/// `Send`, not `Sync`.
pub struct Dropout {
    desc: ffi::OwnedDropout,
    /// Written by the initialisation kernel and by every forward; the descriptor holds its
    /// address, so it must live (and not move on the device) as long as the descriptor: both are
    /// owned here and dropped together.
    states: CudaSlice<u8>,
    probability: f32,
    seed: u64,
    forwards: u64,
}

impl fmt::Debug for Dropout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dropout")
            .field("probability", &self.probability)
            .field("seed", &self.seed)
            .field("state_bytes", &self.states.len())
            .field("forwards", &self.forwards)
            .finish()
    }
}

/// Rejects probabilities outside `[0, 1)` (and NaN): `p = 1` would scale kept elements by
/// `1 / 0`.
fn check_probability(probability: f32) -> Result<()> {
    if (0.0..1.0).contains(&probability) {
        Ok(())
    } else {
        Err(Error::invalid(
            "dropout probability",
            "0 ≤ p < 1",
            probability,
        ))
    }
}

/// Dropout scales by `1 / (1 − p)`, which only makes sense for floating-point data; bf16 is
/// refused by cuDNN 9.14's dropout (`CUDNN_STATUS_NOT_SUPPORTED`), so it
/// is rejected here with a typed error before anything is allocated or enqueued.
fn check_dtype<T: DataType>(op: &'static str) -> Result<()> {
    match T::DTYPE {
        DType::F32 | DType::F64 | DType::F16 => Ok(()),
        DType::BF16 => Err(Error::UnsupportedDataType {
            op,
            detail: "bf16 (cuDNN's dropout does not support bfloat16: convert to f32 with \
                     Cudnn::transform_tensor, or use f16)"
                .into(),
        }),
        d => Err(Error::UnsupportedDataType {
            op,
            detail: format!("{d} (dropout takes f32, f64 or f16)"),
        }),
    }
}

impl Dropout {
    /// Creates the descriptor, allocates the generator states (`cudnnDropoutGetStatesSize` bytes)
    /// on the handle's stream and initialises them from `seed` (`cudnnSetDropoutDescriptor`,
    /// which launches an initialisation kernel on that stream).
    ///
    /// `probability` is the chance that an element is dropped: `0 ≤ p < 1`, else
    /// [`Error::InvalidArgument`].
    #[doc(alias = "cudnnCreateDropoutDescriptor")]
    #[doc(alias = "cudnnDropoutGetStatesSize")]
    #[doc(alias = "cudnnSetDropoutDescriptor")]
    pub fn new(cudnn: &Cudnn, probability: f32, seed: u64) -> Result<Dropout> {
        check_probability(probability)?;
        let lib = cudnn.lib();
        cudnn.bind()?;
        let mut bytes = 0usize;
        // SAFETY: live handle and a valid out-pointer.
        unsafe { ffi::cudnnDropoutGetStatesSize(lib, cudnn.as_raw(), &mut bytes) }?;
        if bytes > crate::MAX_WORKSPACE_BYTES {
            return Err(Error::Overflow {
                what: "dropout state size",
                detail: format!("cuDNN asked for {bytes} bytes"),
            });
        }
        // Never allocate zero bytes: the descriptor needs a valid (non-null) state address.
        let states = cudnn
            .stream()
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| Error::driver("allocating dropout states", e))?;
        let mut dropout = Dropout {
            desc: ffi::OwnedDropout::new(lib)?,
            states,
            probability,
            seed,
            forwards: 0,
        };
        dropout.initialise(cudnn, bytes)?;
        Ok(dropout)
    }

    /// (Re)initialises the states from `self.seed` with `self.probability`.
    fn initialise(&mut self, cudnn: &Cudnn, bytes: usize) -> Result<()> {
        let stream: &cudarc::driver::CudaStream = cudnn.stream();
        let alloc = self.states.stream().clone();
        let _order = cross_use(&alloc, stream)?;
        let (sp, _gs) = self.states.device_ptr_mut(stream);
        // SAFETY: live descriptor and handle (bound above by the caller); `states` holds at least
        // `bytes` bytes (the size cuDNN asked for) on the handle's context, and is owned by
        // `self` beside the descriptor that keeps its address, so it outlives every use; the
        // guard orders the initialisation kernel before later uses and frees.
        unsafe {
            ffi::cudnnSetDropoutDescriptor(
                self.desc.lib(),
                self.desc.as_ptr(),
                cudnn.as_raw(),
                self.probability,
                sp as *mut c_void,
                bytes,
                self.seed,
            )
        }
    }

    /// Re-seeds the generator: the states are initialised again from `seed`, so the next
    /// forward draws the mask a fresh `Dropout::new(cudnn, p, seed)` would.
    #[doc(alias = "cudnnSetDropoutDescriptor")]
    pub fn reseed(&mut self, cudnn: &Cudnn, seed: u64) -> Result<()> {
        self.check_context(cudnn)?;
        cudnn.bind()?;
        let previous = self.seed;
        self.seed = seed;
        let bytes = self.state_bytes(cudnn)?;
        let r = self.initialise(cudnn, bytes);
        match r {
            Ok(()) => self.forwards = 0,
            Err(_) => self.seed = previous,
        }
        r
    }

    fn state_bytes(&self, cudnn: &Cudnn) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: live handle and a valid out-pointer.
        unsafe { ffi::cudnnDropoutGetStatesSize(cudnn.lib(), cudnn.as_raw(), &mut bytes) }?;
        if bytes > self.states.len() {
            // The handle is on the same context as the one the states were sized for, so cuDNN
            // asks for the same size; anything else must not reach the GPU.
            return Err(Error::BufferTooSmall {
                name: "dropout states",
                len: self.states.len(),
                required: bytes,
            });
        }
        Ok(bytes)
    }

    /// Bytes of mask a forward over `x_desc` draws (`cudnnDropoutGetReserveSpaceSize`): the size
    /// of the [`DropoutReserve`] it returns. A host-side query; no GPU needed.
    #[doc(alias = "cudnnDropoutGetReserveSpaceSize")]
    pub fn reserve_size<T: DataType>(x_desc: &TensorDesc<T>) -> Result<usize> {
        reserve_bytes(x_desc)
    }

    /// The probability that an element is dropped.
    pub fn probability(&self) -> f32 {
        self.probability
    }

    /// The seed the states were (last) initialised from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many forward calls have drawn from the states since they were (re)initialised.
    pub fn forwards(&self) -> u64 {
        self.forwards
    }

    /// Size of the generator states in bytes.
    pub fn state_bytes_allocated(&self) -> usize {
        self.states.len()
    }

    /// The raw descriptor (still owned by `self`), e.g. for an RNN descriptor.
    #[allow(dead_code)] // used by the RNN family
    pub(crate) fn as_raw(&self) -> sys::cudnnDropoutDescriptor_t {
        self.desc.as_ptr()
    }

    /// The CUDA context the states live on.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        self.states.stream().context()
    }

    /// The states buffer, for callers that launch work drawing from the generator (an RNN
    /// forward in training): taking its `device_ptr_mut` guard orders that work with the
    /// states' initialisation and later frees.
    #[allow(dead_code)] // used by the RNN family
    pub(crate) fn states_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.states
    }

    /// The stream the states were allocated on.
    #[allow(dead_code)] // used by the RNN family
    pub(crate) fn states_stream(&self) -> &Arc<cudarc::driver::CudaStream> {
        self.states.stream()
    }

    /// A process-unique id (never reused), so a reserve can name the dropout it came from.
    fn id(&self) -> u64 {
        self.desc.id()
    }

    /// Errors unless the dropout lives on `cudnn`'s context.
    pub(crate) fn check_context(&self, cudnn: &Cudnn) -> Result<()> {
        same_context("dropout", cudnn.context(), self.context())
    }
}

/// The mask drawn by one [`Cudnn::dropout_forward`] call (cuDNN's reserve space), which the
/// matching [`Cudnn::dropout_backward`] reads.
///
/// It remembers the [`Dropout`] it came from, the layout and data type of the forward input, so
/// a backward call with another dropout, another shape or dtype is rejected with a typed error
/// before anything is enqueued.
pub struct DropoutReserve {
    buf: CudaSlice<u8>,
    dropout_id: u64,
    call: u64,
    x_layout: Layout,
    dtype: DType,
}

impl fmt::Debug for DropoutReserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DropoutReserve")
            .field("dims", &self.x_layout.dims())
            .field("dtype", &self.dtype)
            .field("call", &self.call)
            .field("bytes", &self.buf.len())
            .finish()
    }
}

impl DropoutReserve {
    /// Dimensions of the forward input.
    pub fn dims(&self) -> &[i64] {
        self.x_layout.dims()
    }
    /// Layout of the forward input.
    pub fn layout(&self) -> &Layout {
        &self.x_layout
    }
    /// Data type of the forward input.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Which forward call of its [`Dropout`] drew this mask (1 for the first after creation or
    /// re-seeding).
    pub fn call(&self) -> u64 {
        self.call
    }
    /// Size in bytes (`cudnnDropoutGetReserveSpaceSize` of the forward input).
    pub fn size_in_bytes(&self) -> usize {
        self.buf.len()
    }
}

/// `cudnnDropoutGetReserveSpaceSize` for a tensor descriptor (a host-side query).
fn reserve_bytes<T: DataType>(desc: &TensorDesc<T>) -> Result<usize> {
    let lib = crate::raw::lib()?;
    let mut bytes = 0usize;
    // SAFETY: live descriptor and a valid out-pointer.
    unsafe { ffi::cudnnDropoutGetReserveSpaceSize(lib, desc.as_raw(), &mut bytes) }?;
    if bytes > crate::MAX_WORKSPACE_BYTES {
        return Err(Error::Overflow {
            what: "dropout reserve size",
            detail: format!("cuDNN asked for {bytes} bytes"),
        });
    }
    Ok(bytes)
}

impl Cudnn {
    /// Dropout forward: `y = x / (1 − p)` where kept, `0` where dropped; returns the mask.
    ///
    /// `x` and `y` have the same dimensions (their strides may differ, e.g. NCHW in, NHWC out).
    /// The mask is drawn from `dropout`'s generator states, which this call advances (hence
    /// `&mut`). The returned [`DropoutReserve`] (`cudnnDropoutGetReserveSpaceSize(x)` bytes,
    /// allocated on the handle's stream) is what [`Cudnn::dropout_backward`] needs.
    ///
    /// Data types: f32, f64 and f16. Others are rejected with [`Error::UnsupportedDataType`]
    /// before anything is enqueued — bf16 included: cuDNN 9.14's `cudnnDropoutForward` refuses
    /// bfloat16 (`CUDNN_STATUS_NOT_SUPPORTED`); convert bf16 data to f32 with
    /// [`Cudnn::transform_tensor`] first.
    #[doc(alias = "cudnnDropoutForward")]
    #[doc(alias = "cudnnDropoutGetReserveSpaceSize")]
    pub fn dropout_forward<T: DataType>(
        &self,
        dropout: &mut Dropout,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<DropoutReserve> {
        check_dtype::<T>("dropout forward")?;
        same_dims(
            "x",
            x_desc.layout(),
            "y",
            y_desc.layout(),
            "dropout keeps the dimensions",
        )?;
        dropout.check_context(self)?;
        self.check_tensor("x", x_desc.layout(), x, false)?;
        self.check_tensor("y", y_desc.layout(), y, true)?;
        self.bind()?;
        let bytes = reserve_bytes(x_desc)?;
        // Zero-filled so no uninitialised device memory is ever exposed; at least one byte so
        // the pointer handed to cuDNN is never null.
        let mut buf = self
            .stream()
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| Error::driver("allocating the dropout reserve", e))?;
        {
            let stream: &cudarc::driver::CudaStream = self.stream();
            let (xp, _gx) = x.device_ptr(stream);
            let (yp, _gy) = y.device_ptr_mut(stream);
            let (rp, _gr) = buf.device_ptr_mut(stream);
            // The descriptor holds the states' address; these guards order the draw after the
            // states' initialisation (or previous draw) and before any later free.
            let alloc = dropout.states.stream().clone();
            let _order = cross_use(&alloc, stream)?;
            let (_sp, _gs) = dropout.states.device_ptr_mut(stream);
            // SAFETY: live handle and descriptors; the dropout descriptor was initialised with
            // states it owns on this context (checked); `x` and `y` hold their spans on this
            // context, `y` does not overlap itself and cannot alias `x` (`&` vs `&mut`); the
            // reserve holds the `bytes` cuDNN asked for `x_desc`; the guards keep every buffer
            // alive and ordered until the kernel is enqueued. `&mut Dropout` rules out a
            // concurrent forward on the same states.
            unsafe {
                ffi::cudnnDropoutForward(
                    self.lib(),
                    self.as_raw(),
                    dropout.desc.as_ptr(),
                    x_desc.as_raw(),
                    xp as *const c_void,
                    y_desc.as_raw(),
                    yp as *mut c_void,
                    rp as *mut c_void,
                    bytes,
                )
            }?;
        }
        dropout.forwards += 1;
        Ok(DropoutReserve {
            buf,
            dropout_id: dropout.id(),
            call: dropout.forwards,
            x_layout: x_desc.layout().clone(),
            dtype: T::DTYPE,
        })
    }

    /// Dropout backward: `dx = dy / (1 − p)` where the forward kept the element, `0` elsewhere.
    ///
    /// `reserve` must come from a forward on this same `dropout`, with `dy` and `dx` of that
    /// forward's dimensions and dtype (any non-overlapping strides for `dx`, any strides for
    /// `dy`). Anything else is rejected ([`Error::InvalidArgument`] for a reserve of another
    /// dropout, [`Error::ShapeMismatch`] for other dimensions, [`Error::UnsupportedDataType`]
    /// for another dtype, or for a type dropout does not take: f32, f64 and f16 only, as for
    /// [`Cudnn::dropout_forward`]) before anything is enqueued.
    ///
    /// The mask holds one bit per logical element (cuDNN sizes it from the element count alone:
    /// a padded layout needs no more reserve than a packed one), so it pairs elements by logical
    /// index, whatever the layouts of `x`, `y`, `dy` and `dx`.
    #[doc(alias = "cudnnDropoutBackward")]
    pub fn dropout_backward<T: DataType>(
        &self,
        dropout: &Dropout,
        reserve: &DropoutReserve,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        dx_desc: &TensorDesc<T>,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        check_dtype::<T>("dropout backward")?;
        if reserve.dropout_id != dropout.id() {
            return Err(Error::invalid(
                "dropout reserve",
                "the reserve returned by a forward on this same Dropout",
                "a reserve from another Dropout",
            ));
        }
        if reserve.dtype != T::DTYPE {
            return Err(Error::UnsupportedDataType {
                op: "dropout backward",
                detail: format!(
                    "the reserve was drawn for {} data, dy is {}",
                    reserve.dtype,
                    T::DTYPE
                ),
            });
        }
        same_dims(
            "dy",
            dy_desc.layout(),
            "reserve (forward x)",
            reserve.layout(),
            "dy has the dimensions of the forward input",
        )?;
        same_dims(
            "dx",
            dx_desc.layout(),
            "dy",
            dy_desc.layout(),
            "dropout backward keeps the dimensions",
        )?;
        dropout.check_context(self)?;
        self.check_tensor("dy", dy_desc.layout(), dy, false)?;
        self.check_tensor("dx", dx_desc.layout(), dx, true)?;
        self.bind()?;
        // What cuDNN will read for `dy_desc`; equal to what the forward allocated since the
        // element counts agree, but compared so that a mismatch can never read past the reserve.
        let bytes = reserve_bytes(dy_desc)?;
        self.check_buffer("dropout reserve", &reserve.buf, bytes)?;
        let stream: &cudarc::driver::CudaStream = self.stream();
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dxp, _gdx) = dx.device_ptr_mut(stream);
        let _order = cross_use(reserve.buf.stream(), stream)?;
        let (rp, _gr) = reserve.buf.device_ptr(stream);
        // SAFETY: live handle and descriptors; `dy`, `dx` hold their spans on this context, `dx`
        // does not overlap itself and cannot alias `dy`; the reserve holds at least the bytes
        // cuDNN reads for `dy_desc` and was written by a forward on this dropout with the same
        // dimensions. cuDNN only reads the reserve in backward (it is an input there), so the
        // pointer from a shared borrow may be passed as `*mut`. Guards keep buffers alive and
        // ordered until enqueued.
        unsafe {
            ffi::cudnnDropoutBackward(
                self.lib(),
                self.as_raw(),
                dropout.desc.as_ptr(),
                dy_desc.as_raw(),
                dyp as *const c_void,
                dx_desc.as_raw(),
                dxp as *mut c_void,
                rp as *mut c_void,
                bytes,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probability_must_be_in_zero_one() {
        assert!(check_probability(0.0).is_ok());
        assert!(check_probability(0.5).is_ok());
        assert!(check_probability(0.999).is_ok());
        for p in [1.0, 1.5, -0.1, f32::NAN, f32::INFINITY] {
            assert!(
                matches!(check_probability(p), Err(Error::InvalidArgument { .. })),
                "{p} accepted"
            );
        }
    }

    #[test]
    fn only_float_types() {
        assert!(check_dtype::<f32>("t").is_ok());
        assert!(check_dtype::<f64>("t").is_ok());
        assert!(check_dtype::<half::f16>("t").is_ok());
        let e = check_dtype::<half::bf16>("dropout forward").unwrap_err();
        assert!(
            matches!(&e, Error::UnsupportedDataType { op: "dropout forward", detail } if detail.contains("bf16")),
            "{e:?}"
        );
        assert!(matches!(
            check_dtype::<i8>("t"),
            Err(Error::UnsupportedDataType { .. })
        ));
        assert!(matches!(
            check_dtype::<i32>("t"),
            Err(Error::UnsupportedDataType { .. })
        ));
    }
}
