//! Backend descriptors (`cudnnBackendDescriptor_t`): one RAII owner and one typed setter or
//! getter per C attribute type. Every `cudnnBackend*` call of the crate is in this file.
//!
//! The typed methods pair each Rust element type with the `cudnnBackendAttributeType_t` that
//! cuDNN reads or writes for it (`i64` ↔ `CUDNN_TYPE_INT64`, `f64` ↔ `CUDNN_TYPE_DOUBLE`, C
//! enums ↔ their `#[repr(transparent)]` `u32` newtypes, ...), so no caller hands cuDNN a buffer
//! whose element size differs from what the attribute type implies.
use std::ffi::c_void;
use std::ptr::NonNull;

use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use crate::error::{Error, Result, Status};

/// The C calls of the backend API.
pub(crate) mod ffi {
    #![allow(non_snake_case)] // the C names, so a search for them finds these

    use std::ffi::c_void;

    use cudnn_safe_sys as sys;

    crate::raw::raw_fns! {
        fn cudnnBackendCreateDescriptor(
            kind: sys::cudnnBackendDescriptorType_t,
            desc: *mut sys::cudnnBackendDescriptor_t,
        );
        fn cudnnBackendDestroyDescriptor(desc: sys::cudnnBackendDescriptor_t);
        fn cudnnBackendFinalize(desc: sys::cudnnBackendDescriptor_t);
        fn cudnnBackendSetAttribute(
            desc: sys::cudnnBackendDescriptor_t,
            name: sys::cudnnBackendAttributeName_t,
            kind: sys::cudnnBackendAttributeType_t,
            count: i64,
            elements: *const c_void,
        );
        fn cudnnBackendGetAttribute(
            desc: sys::cudnnBackendDescriptor_t,
            name: sys::cudnnBackendAttributeName_t,
            kind: sys::cudnnBackendAttributeType_t,
            requested: i64,
            count: *mut i64,
            elements: *mut c_void,
        );
        fn cudnnBackendExecute(
            handle: sys::cudnnHandle_t,
            plan: sys::cudnnBackendDescriptor_t,
            variant_pack: sys::cudnnBackendDescriptor_t,
        );
    }
}

/// An attribute name with its C spelling, for error messages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attr(pub sys::cudnnBackendAttributeName_t, pub &'static str);

/// `named!(Attr, cudnnBackendAttributeName_t, NAME)`: a C enum value wrapped with its spelling.
macro_rules! named {
    ($wrap:ident, $enum:ident, $name:ident) => {
        crate::graph::backend::$wrap(cudnn_safe_sys::$enum::$name, stringify!($name))
    };
}
pub(crate) use named;

/// `attr!(CUDNN_ATTR_TENSOR_UNIQUE_ID)`: the attribute and its name.
macro_rules! attr {
    ($name:ident) => {
        crate::graph::backend::named!(Attr, cudnnBackendAttributeName_t, $name)
    };
}
pub(crate) use attr;

/// A descriptor kind with its C spelling.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kind(pub sys::cudnnBackendDescriptorType_t, pub &'static str);

/// `kind!(CUDNN_BACKEND_TENSOR_DESCRIPTOR)`.
macro_rules! kind {
    ($name:ident) => {
        crate::graph::backend::named!(Kind, cudnnBackendDescriptorType_t, $name)
    };
}
pub(crate) use kind;

use sys::cudnnBackendAttributeType_t as Ty;

/// Rust element types whose memory layout is exactly that of a backend attribute type.
///
/// # Safety
/// `TYPE` is an attribute type whose C element is `Self` (same size and alignment, and every bit
/// pattern cuDNN may write into it is a valid `Self`).
pub(crate) unsafe trait AttrElem: Copy {
    const TYPE: Ty;
}

// The impls below pair each Rust type with the attribute type whose C element it is, per
// cudnn_backend.h: int64_t, double, float, bool (one byte, cuDNN writes only 0/1), the C enums
// as 4-byte `#[repr(transparent)]` newtypes of `c_uint` (any value is valid), `cudnnHandle_t`,
// `void*`, and `char`.
// SAFETY: `CUDNN_TYPE_INT64` elements are `int64_t`.
unsafe impl AttrElem for i64 {
    const TYPE: Ty = Ty::CUDNN_TYPE_INT64;
}
// SAFETY: see above.
unsafe impl AttrElem for f64 {
    const TYPE: Ty = Ty::CUDNN_TYPE_DOUBLE;
}
// SAFETY: see above.
unsafe impl AttrElem for f32 {
    const TYPE: Ty = Ty::CUDNN_TYPE_FLOAT;
}
// SAFETY: see above. cuDNN writes C `bool` values (0 or 1) only.
unsafe impl AttrElem for bool {
    const TYPE: Ty = Ty::CUDNN_TYPE_BOOLEAN;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnDataType_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_DATA_TYPE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnConvolutionMode_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_CONVOLUTION_MODE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnPointwiseMode_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_POINTWISE_MODE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnNanPropagation_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_NAN_PROPOGATION;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnReduceTensorOp_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnBackendNormMode_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_NORM_MODE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnBackendNormFwdPhase_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_NORM_FWD_PHASE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnBackendHeurMode_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_HEUR_MODE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnBackendKnobType_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_KNOB_TYPE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnBackendNumericalNote_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_NUMERICAL_NOTE;
}
// SAFETY: see above.
unsafe impl AttrElem for sys::cudnnBackendBehaviorNote_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_BEHAVIOR_NOTE;
}
// SAFETY: see above. Only set, never read back.
unsafe impl AttrElem for sys::cudnnHandle_t {
    const TYPE: Ty = Ty::CUDNN_TYPE_HANDLE;
}
// SAFETY: see above. Only set (variant-pack pointers), never read back.
unsafe impl AttrElem for *mut c_void {
    const TYPE: Ty = Ty::CUDNN_TYPE_VOID_PTR;
}
// SAFETY: see above; `u8` is C `char` here (JSON text), any byte is valid.
unsafe impl AttrElem for u8 {
    const TYPE: Ty = Ty::CUDNN_TYPE_CHAR;
}

/// An owned backend descriptor: created by `cudnnBackendCreateDescriptor`, destroyed exactly
/// once in `Drop` (which logs and never panics).
///
/// A descriptor that another refers to (a tensor of an operation, an operation of a graph, the
/// engine config of a plan) must outlive every use cuDNN makes of the reference; the owners in
/// this module keep such descriptors alive for as long as the referring one lives.
pub(crate) struct Desc {
    ptr: NonNull<c_void>,
    lib: &'static Library,
    kind: Kind,
}

// SAFETY: a backend descriptor is host memory that cuDNN reads and writes only during calls made
// through its owner (`&mut self` for setters and finalize); moving the owner to another thread is
// sound. It is not `Sync`: two threads must not call into the same descriptor at once.
unsafe impl Send for Desc {}

impl std::fmt::Debug for Desc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({:p})", self.kind.1, self.ptr)
    }
}

/// Rewrites the message of a cuDNN error (`f` gets the old one) to say what was being built;
/// other errors pass unchanged.
pub(crate) fn with_cudnn_message(e: Error, f: impl FnOnce(String) -> String) -> Error {
    match e {
        Error::Cudnn {
            status,
            function,
            message,
        } => Error::Cudnn {
            status,
            function,
            message: f(message),
        },
        other => other,
    }
}

/// Adds the attribute's name to a cuDNN error from a set or get call.
fn with_attr(e: Error, attr: Attr, kind: Kind) -> Error {
    with_cudnn_message(e, |message| {
        if message.is_empty() {
            format!("{} of {}", attr.1, kind.1)
        } else {
            format!("{} of {}: {message}", attr.1, kind.1)
        }
    })
}

impl Desc {
    /// Creates an empty descriptor of `kind`.
    pub(crate) fn new(lib: &'static Library, kind: Kind) -> Result<Desc> {
        let mut p: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the kind is a value cuDNN defines.
        unsafe { ffi::cudnnBackendCreateDescriptor(lib, kind.0, &mut p) }?;
        let ptr = NonNull::new(p).ok_or(Error::Cudnn {
            status: Status::BAD_PARAM,
            function: "cudnnBackendCreateDescriptor",
            message: format!("returned a null {}", kind.1),
        })?;
        Ok(Desc { ptr, lib, kind })
    }

    /// The raw descriptor (owned by `self`).
    pub(crate) fn as_raw(&self) -> sys::cudnnBackendDescriptor_t {
        self.ptr.as_ptr()
    }

    /// `cudnnBackendFinalize`.
    pub(crate) fn finalize(&mut self) -> Result<()> {
        // SAFETY: live descriptor owned by `self`; every descriptor it refers to is kept alive by
        // the caller (see the type's documentation).
        unsafe { ffi::cudnnBackendFinalize(self.lib, self.as_raw()) }.map_err(|e| {
            with_cudnn_message(e, |message| {
                if message.is_empty() {
                    self.kind.1.to_string()
                } else {
                    format!("{}: {message}", self.kind.1)
                }
            })
        })
    }

    /// `cudnnBackendSetAttribute` on this descriptor; errors name the attribute.
    ///
    /// # Safety
    /// `values` points to `count` readable elements of the C type `ty` denotes, and any
    /// descriptor among them outlives `self`.
    unsafe fn set_raw(
        &mut self,
        attr: Attr,
        ty: Ty,
        count: i64,
        values: *const c_void,
    ) -> Result<()> {
        // SAFETY: live descriptor owned by `self`; the caller vouches for `values`.
        unsafe { ffi::cudnnBackendSetAttribute(self.lib, self.as_raw(), attr.0, ty, count, values) }
            .map_err(|e| with_attr(e, attr, self.kind))
    }

    /// `cudnnBackendGetAttribute` on this descriptor: the number of elements the attribute
    /// holds; errors name the attribute.
    ///
    /// # Safety
    /// `out` is null with `requested` 0, or has room for `requested` elements of the C type `ty`
    /// denotes (cuDNN writes at most that many).
    unsafe fn get_raw(&self, attr: Attr, ty: Ty, requested: i64, out: *mut c_void) -> Result<i64> {
        let mut count = 0i64;
        // SAFETY: live descriptor owned by `self`; `count` is a valid `i64` to write; the
        // caller vouches for `out`.
        unsafe {
            ffi::cudnnBackendGetAttribute(
                self.lib,
                self.as_raw(),
                attr.0,
                ty,
                requested,
                &mut count,
                out,
            )
        }
        .map_err(|e| with_attr(e, attr, self.kind))?;
        Ok(count)
    }

    /// Sets an attribute to the elements of `values`, typed by [`AttrElem`].
    pub(crate) fn set<T: AttrElem>(&mut self, attr: Attr, values: &[T]) -> Result<()> {
        let count = i64::try_from(values.len()).map_err(|_| Error::Overflow {
            what: "backend attribute element count",
            detail: values.len().to_string(),
        })?;
        // SAFETY: live descriptor; `values` holds `count` elements of the C type `T::TYPE`
        // denotes (the `AttrElem` contract), readable for the duration of the call (cuDNN copies
        // them).
        unsafe { self.set_raw(attr, T::TYPE, count, values.as_ptr().cast::<c_void>()) }
    }

    /// Sets one element.
    pub(crate) fn set1<T: AttrElem>(&mut self, attr: Attr, value: T) -> Result<()> {
        self.set(attr, &[value])
    }

    /// Sets an attribute holding references to other descriptors. The caller keeps `descs`
    /// alive as long as `self` (cuDNN keeps the pointers).
    pub(crate) fn set_descs(&mut self, attr: Attr, descs: &[&Desc]) -> Result<()> {
        let raw: Vec<sys::cudnnBackendDescriptor_t> = descs.iter().map(|d| d.as_raw()).collect();
        let count = raw.len() as i64;
        // SAFETY: live descriptors; `raw` holds `count` descriptor pointers, the C element type of
        // CUDNN_TYPE_BACKEND_DESCRIPTOR; the referenced descriptors outlive `self` (caller).
        unsafe {
            self.set_raw(
                attr,
                Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                count,
                raw.as_ptr().cast::<c_void>(),
            )
        }
    }

    /// Reads up to `max` elements of an attribute.
    pub(crate) fn get<T: AttrElem>(&self, attr: Attr, max: usize, init: T) -> Result<Vec<T>> {
        let mut out = vec![init; max];
        // SAFETY: live, finalized descriptor; `out` has room for `max` elements of the C type
        // `T::TYPE` denotes (the `AttrElem` contract) and cuDNN writes at most `requested`.
        let count =
            unsafe { self.get_raw(attr, T::TYPE, max as i64, out.as_mut_ptr().cast::<c_void>()) }?;
        out.truncate(usize::try_from(count).unwrap_or(0).min(max));
        Ok(out)
    }

    /// Reads one `i64`.
    pub(crate) fn get_i64(&self, attr: Attr) -> Result<i64> {
        self.get::<i64>(attr, 1, 0)?
            .first()
            .copied()
            .ok_or_else(|| Error::Cudnn {
                status: Status::BAD_PARAM,
                function: "cudnnBackendGetAttribute",
                message: format!("{} of {} returned no element", attr.1, self.kind.1),
            })
    }

    /// The number of elements an attribute holds (a query with no buffer).
    pub(crate) fn count(&self, attr: Attr, ty: Ty) -> Result<usize> {
        // SAFETY: live descriptor; a request of 0 elements with a null buffer only writes the
        // count.
        let count = unsafe { self.get_raw(attr, ty, 0, std::ptr::null_mut()) }?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// Reads descriptor references into the pre-created descriptors `into` (cuDNN copies the
    /// referenced objects into them). Returns how many were written.
    pub(crate) fn get_descs(&self, attr: Attr, into: &mut [Desc]) -> Result<usize> {
        let mut raw: Vec<sys::cudnnBackendDescriptor_t> = into.iter().map(|d| d.as_raw()).collect();
        // SAFETY: live descriptors; `raw` holds `into.len()` live descriptors of the kind the
        // attribute yields, which cuDNN fills (it does not replace the pointers); at most
        // `requested` are written.
        let count = unsafe {
            self.get_raw(
                attr,
                Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                raw.len() as i64,
                raw.as_mut_ptr().cast::<c_void>(),
            )
        }?;
        Ok(usize::try_from(count).unwrap_or(0).min(into.len()))
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor, destroyed exactly once here.
        if let Err(e) = unsafe { ffi::cudnnBackendDestroyDescriptor(self.lib, self.as_raw()) } {
            log::warn!("cudnnBackendDestroyDescriptor({}): {e}", self.kind.1);
        }
    }
}
