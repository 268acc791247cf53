//! One function per cuDNN C call, turning the status into a [`Result`]. Almost all FFI `unsafe`
//! in the crate lives here; callers state why their arguments satisfy each call's contract.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_void};

use cudnn_safe_sys as sys;
use cudnn_safe_sys::{sym, Library};

use crate::error::{Error, Result, Status};

/// The process-wide cuDNN library (and cuDNN's log routed to the `log` crate's current level).
pub(crate) fn lib() -> Result<&'static Library> {
    let lib = cudnn_safe_sys::library()?;
    crate::cudnn_log::sync(lib);
    Ok(lib)
}

/// Turns a status into a `Result`, capturing `cudnnGetLastErrorString` on failure.
pub(crate) fn check(
    lib: &Library,
    status: sys::cudnnStatus_t,
    function: &'static str,
) -> Result<()> {
    if status.0 == 0 {
        return Ok(());
    }
    Err(Error::Cudnn {
        status: Status(status.0),
        function,
        message: last_error_string(lib),
    })
}

/// `cudnnGetLastErrorString`: the last error message recorded on this thread (may be empty).
pub(crate) fn last_error_string(lib: &Library) -> String {
    let Ok(f) = sym!(lib, cudnnGetLastErrorString) else {
        return String::new();
    };
    let mut buf = [0u8; 1024];
    // SAFETY: cudnnGetLastErrorString writes at most `max_size` bytes, NUL included, into the
    // buffer we own for the duration of the call.
    unsafe { f(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).trim().to_string()
}

macro_rules! raw_fns {
    ($( fn $name:ident ( $($a:ident : $t:ty),* $(,)? ); )*) => { $(
        #[doc = concat!("`", stringify!($name), "`, status checked.")]
        ///
        /// # Safety
        /// The arguments satisfy the C function's contract: handles and descriptors are live,
        /// pointers are valid for the reads and writes the descriptors imply, host pointers to
        /// scalars point to the type cuDNN reads for these tensors.
        #[allow(clippy::too_many_arguments)] // mirrors the C signature
        pub(crate) unsafe fn $name(
            lib: &cudnn_safe_sys::Library,
            $($a: $t),*
        ) -> crate::error::Result<()> {
            let f = cudnn_safe_sys::sym!(lib, $name)?;
            // SAFETY: forwarded to the caller, see `# Safety` above.
            let status = unsafe { f($($a),*) };
            crate::raw::check(lib, status, stringify!($name))
        }
    )* };
}
/// Family modules declare the C calls they need with `crate::raw::raw_fns! { ... }`.
pub(crate) use raw_fns;

raw_fns! {
    fn cudnnCreate(handle: *mut sys::cudnnHandle_t);
    fn cudnnDestroy(handle: sys::cudnnHandle_t);
    fn cudnnSetStream(handle: sys::cudnnHandle_t, stream: sys::cudaStream_t);
    fn cudnnCreateTensorDescriptor(desc: *mut sys::cudnnTensorDescriptor_t);
    fn cudnnDestroyTensorDescriptor(desc: sys::cudnnTensorDescriptor_t);
    fn cudnnSetTensorNdDescriptor(
        desc: sys::cudnnTensorDescriptor_t,
        data_type: sys::cudnnDataType_t,
        nb_dims: c_int,
        dims: *const c_int,
        strides: *const c_int,
    );
    fn cudnnSetTensorNdDescriptorEx(
        desc: sys::cudnnTensorDescriptor_t,
        format: sys::cudnnTensorFormat_t,
        data_type: sys::cudnnDataType_t,
        nb_dims: c_int,
        dims: *const c_int,
    );
    fn cudnnGetTensorSizeInBytes(desc: sys::cudnnTensorDescriptor_t, size: *mut usize);
    fn cudnnCreateFilterDescriptor(desc: *mut sys::cudnnFilterDescriptor_t);
    fn cudnnDestroyFilterDescriptor(desc: sys::cudnnFilterDescriptor_t);
    fn cudnnSetFilterNdDescriptor(
        desc: sys::cudnnFilterDescriptor_t,
        data_type: sys::cudnnDataType_t,
        format: sys::cudnnTensorFormat_t,
        nb_dims: c_int,
        dims: *const c_int,
    );
    fn cudnnGetFilterSizeInBytes(desc: sys::cudnnFilterDescriptor_t, size: *mut usize);
    fn cudnnAddTensor(
        handle: sys::cudnnHandle_t,
        alpha: *const c_void,
        a_desc: sys::cudnnTensorDescriptor_t,
        a: *const c_void,
        beta: *const c_void,
        c_desc: sys::cudnnTensorDescriptor_t,
        c: *mut c_void,
    );
    fn cudnnScaleTensor(
        handle: sys::cudnnHandle_t,
        y_desc: sys::cudnnTensorDescriptor_t,
        y: *mut c_void,
        alpha: *const c_void,
    );
    fn cudnnSetTensor(
        handle: sys::cudnnHandle_t,
        y_desc: sys::cudnnTensorDescriptor_t,
        y: *mut c_void,
        value: *const c_void,
    );
    fn cudnnTransformTensor(
        handle: sys::cudnnHandle_t,
        alpha: *const c_void,
        x_desc: sys::cudnnTensorDescriptor_t,
        x: *const c_void,
        beta: *const c_void,
        y_desc: sys::cudnnTensorDescriptor_t,
        y: *mut c_void,
    );

    // Convolution (libcudnn_cnn) and the activation descriptor its fused form takes.
    fn cudnnCreateConvolutionDescriptor(desc: *mut sys::cudnnConvolutionDescriptor_t);
    fn cudnnDestroyConvolutionDescriptor(desc: sys::cudnnConvolutionDescriptor_t);
    fn cudnnSetConvolutionNdDescriptor(
        desc: sys::cudnnConvolutionDescriptor_t,
        array_length: c_int,
        pads: *const c_int,
        strides: *const c_int,
        dilations: *const c_int,
        mode: sys::cudnnConvolutionMode_t,
        compute_type: sys::cudnnDataType_t,
    );
    fn cudnnSetConvolutionMathType(
        desc: sys::cudnnConvolutionDescriptor_t,
        math: sys::cudnnMathType_t,
    );
    fn cudnnSetConvolutionGroupCount(desc: sys::cudnnConvolutionDescriptor_t, groups: c_int);
    fn cudnnGetConvolutionNdForwardOutputDim(
        desc: sys::cudnnConvolutionDescriptor_t,
        x_desc: sys::cudnnTensorDescriptor_t,
        w_desc: sys::cudnnFilterDescriptor_t,
        nb_dims: c_int,
        out: *mut c_int,
    );
    fn cudnnCreateActivationDescriptor(desc: *mut sys::cudnnActivationDescriptor_t);
    fn cudnnDestroyActivationDescriptor(desc: sys::cudnnActivationDescriptor_t);
    fn cudnnSetActivationDescriptor(
        desc: sys::cudnnActivationDescriptor_t,
        mode: sys::cudnnActivationMode_t,
        nan: sys::cudnnNanPropagation_t,
        coef: f64,
    );
    fn cudnnGetConvolutionForwardAlgorithmMaxCount(handle: sys::cudnnHandle_t, count: *mut c_int);
    fn cudnnGetConvolutionBackwardDataAlgorithmMaxCount(
        handle: sys::cudnnHandle_t,
        count: *mut c_int,
    );
    fn cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(
        handle: sys::cudnnHandle_t,
        count: *mut c_int,
    );
    fn cudnnGetConvolutionForwardAlgorithm_v7(
        handle: sys::cudnnHandle_t,
        x_desc: sys::cudnnTensorDescriptor_t,
        w_desc: sys::cudnnFilterDescriptor_t,
        conv: sys::cudnnConvolutionDescriptor_t,
        y_desc: sys::cudnnTensorDescriptor_t,
        requested: c_int,
        returned: *mut c_int,
        perf: *mut sys::cudnnConvolutionFwdAlgoPerf_t,
    );
    fn cudnnGetConvolutionBackwardDataAlgorithm_v7(
        handle: sys::cudnnHandle_t,
        w_desc: sys::cudnnFilterDescriptor_t,
        dy_desc: sys::cudnnTensorDescriptor_t,
        conv: sys::cudnnConvolutionDescriptor_t,
        dx_desc: sys::cudnnTensorDescriptor_t,
        requested: c_int,
        returned: *mut c_int,
        perf: *mut sys::cudnnConvolutionBwdDataAlgoPerf_t,
    );
    fn cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        handle: sys::cudnnHandle_t,
        x_desc: sys::cudnnTensorDescriptor_t,
        dy_desc: sys::cudnnTensorDescriptor_t,
        conv: sys::cudnnConvolutionDescriptor_t,
        dw_desc: sys::cudnnFilterDescriptor_t,
        requested: c_int,
        returned: *mut c_int,
        perf: *mut sys::cudnnConvolutionBwdFilterAlgoPerf_t,
    );
    fn cudnnFindConvolutionForwardAlgorithmEx(
        handle: sys::cudnnHandle_t,
        x_desc: sys::cudnnTensorDescriptor_t,
        x: *const c_void,
        w_desc: sys::cudnnFilterDescriptor_t,
        w: *const c_void,
        conv: sys::cudnnConvolutionDescriptor_t,
        y_desc: sys::cudnnTensorDescriptor_t,
        y: *mut c_void,
        requested: c_int,
        returned: *mut c_int,
        perf: *mut sys::cudnnConvolutionFwdAlgoPerf_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
    );
    fn cudnnFindConvolutionBackwardDataAlgorithmEx(
        handle: sys::cudnnHandle_t,
        w_desc: sys::cudnnFilterDescriptor_t,
        w: *const c_void,
        dy_desc: sys::cudnnTensorDescriptor_t,
        dy: *const c_void,
        conv: sys::cudnnConvolutionDescriptor_t,
        dx_desc: sys::cudnnTensorDescriptor_t,
        dx: *mut c_void,
        requested: c_int,
        returned: *mut c_int,
        perf: *mut sys::cudnnConvolutionBwdDataAlgoPerf_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
    );
    fn cudnnFindConvolutionBackwardFilterAlgorithmEx(
        handle: sys::cudnnHandle_t,
        x_desc: sys::cudnnTensorDescriptor_t,
        x: *const c_void,
        dy_desc: sys::cudnnTensorDescriptor_t,
        dy: *const c_void,
        conv: sys::cudnnConvolutionDescriptor_t,
        dw_desc: sys::cudnnFilterDescriptor_t,
        dw: *mut c_void,
        requested: c_int,
        returned: *mut c_int,
        perf: *mut sys::cudnnConvolutionBwdFilterAlgoPerf_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
    );
    fn cudnnGetConvolutionForwardWorkspaceSize(
        handle: sys::cudnnHandle_t,
        x_desc: sys::cudnnTensorDescriptor_t,
        w_desc: sys::cudnnFilterDescriptor_t,
        conv: sys::cudnnConvolutionDescriptor_t,
        y_desc: sys::cudnnTensorDescriptor_t,
        algo: sys::cudnnConvolutionFwdAlgo_t,
        bytes: *mut usize,
    );
    fn cudnnGetConvolutionBackwardDataWorkspaceSize(
        handle: sys::cudnnHandle_t,
        w_desc: sys::cudnnFilterDescriptor_t,
        dy_desc: sys::cudnnTensorDescriptor_t,
        conv: sys::cudnnConvolutionDescriptor_t,
        dx_desc: sys::cudnnTensorDescriptor_t,
        algo: sys::cudnnConvolutionBwdDataAlgo_t,
        bytes: *mut usize,
    );
    fn cudnnGetConvolutionBackwardFilterWorkspaceSize(
        handle: sys::cudnnHandle_t,
        x_desc: sys::cudnnTensorDescriptor_t,
        dy_desc: sys::cudnnTensorDescriptor_t,
        conv: sys::cudnnConvolutionDescriptor_t,
        dw_desc: sys::cudnnFilterDescriptor_t,
        algo: sys::cudnnConvolutionBwdFilterAlgo_t,
        bytes: *mut usize,
    );
    fn cudnnConvolutionForward(
        handle: sys::cudnnHandle_t,
        alpha: *const c_void,
        x_desc: sys::cudnnTensorDescriptor_t,
        x: *const c_void,
        w_desc: sys::cudnnFilterDescriptor_t,
        w: *const c_void,
        conv: sys::cudnnConvolutionDescriptor_t,
        algo: sys::cudnnConvolutionFwdAlgo_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        beta: *const c_void,
        y_desc: sys::cudnnTensorDescriptor_t,
        y: *mut c_void,
    );
    fn cudnnConvolutionBiasActivationForward(
        handle: sys::cudnnHandle_t,
        alpha1: *const c_void,
        x_desc: sys::cudnnTensorDescriptor_t,
        x: *const c_void,
        w_desc: sys::cudnnFilterDescriptor_t,
        w: *const c_void,
        conv: sys::cudnnConvolutionDescriptor_t,
        algo: sys::cudnnConvolutionFwdAlgo_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        alpha2: *const c_void,
        z_desc: sys::cudnnTensorDescriptor_t,
        z: *const c_void,
        bias_desc: sys::cudnnTensorDescriptor_t,
        bias: *const c_void,
        act: sys::cudnnActivationDescriptor_t,
        y_desc: sys::cudnnTensorDescriptor_t,
        y: *mut c_void,
    );
    fn cudnnConvolutionBackwardData(
        handle: sys::cudnnHandle_t,
        alpha: *const c_void,
        w_desc: sys::cudnnFilterDescriptor_t,
        w: *const c_void,
        dy_desc: sys::cudnnTensorDescriptor_t,
        dy: *const c_void,
        conv: sys::cudnnConvolutionDescriptor_t,
        algo: sys::cudnnConvolutionBwdDataAlgo_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        beta: *const c_void,
        dx_desc: sys::cudnnTensorDescriptor_t,
        dx: *mut c_void,
    );
    fn cudnnConvolutionBackwardFilter(
        handle: sys::cudnnHandle_t,
        alpha: *const c_void,
        x_desc: sys::cudnnTensorDescriptor_t,
        x: *const c_void,
        dy_desc: sys::cudnnTensorDescriptor_t,
        dy: *const c_void,
        conv: sys::cudnnConvolutionDescriptor_t,
        algo: sys::cudnnConvolutionBwdFilterAlgo_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        beta: *const c_void,
        dw_desc: sys::cudnnFilterDescriptor_t,
        dw: *mut c_void,
    );
    fn cudnnConvolutionBackwardBias(
        handle: sys::cudnnHandle_t,
        alpha: *const c_void,
        dy_desc: sys::cudnnTensorDescriptor_t,
        dy: *const c_void,
        beta: *const c_void,
        db_desc: sys::cudnnTensorDescriptor_t,
        db: *mut c_void,
    );
}

/// The sub-library version checks, each loading its sub-library (`libcudnn_graph`, `_ops`,
/// `_cnn`, `_adv`) and comparing its version with the shim's.
pub(crate) fn sublibrary_checks(lib: &Library) -> Vec<(&'static str, Result<()>)> {
    fn run(
        lib: &Library,
        f: std::result::Result<unsafe extern "C" fn() -> sys::cudnnStatus_t, sys::LoadError>,
        name: &'static str,
    ) -> Result<()> {
        let f = f?;
        // SAFETY: the version checks take no arguments and only load and query sub-libraries.
        let status = unsafe { f() };
        check(lib, status, name)
    }
    vec![
        (
            "graph",
            run(
                lib,
                sym!(lib, cudnnGraphVersionCheck),
                "cudnnGraphVersionCheck",
            ),
        ),
        (
            "ops",
            run(lib, sym!(lib, cudnnOpsVersionCheck), "cudnnOpsVersionCheck"),
        ),
        (
            "cnn",
            run(lib, sym!(lib, cudnnCnnVersionCheck), "cudnnCnnVersionCheck"),
        ),
        (
            "adv",
            run(lib, sym!(lib, cudnnAdvVersionCheck), "cudnnAdvVersionCheck"),
        ),
    ]
}

/// Declares an owning wrapper for one kind of legacy cuDNN descriptor: created by `$create`,
/// destroyed exactly once by `$destroy` in `Drop` (which logs and never panics), `Send`.
/// Descriptor types of the public API hold one of these and add their own validation.
macro_rules! owned_descriptor {
    ($(#[$m:meta])* $name:ident, $ptr:ty, $create:ident, $destroy:ident) => {
        $(#[$m])*
        pub(crate) struct $name {
            ptr: std::ptr::NonNull<<$ptr as crate::raw::Pointee>::Target>,
            lib: &'static cudnn_safe_sys::Library,
            id: u64,
        }

        impl $name {
            pub(crate) fn new(lib: &'static cudnn_safe_sys::Library) -> crate::error::Result<Self> {
                let mut p: $ptr = std::ptr::null_mut();
                // SAFETY: `p` is a valid out-pointer for the new descriptor.
                unsafe { $create(lib, &mut p) }?;
                let ptr = std::ptr::NonNull::new(p).ok_or(crate::error::Error::Cudnn {
                    status: crate::error::Status::BAD_PARAM,
                    function: stringify!($create),
                    message: "returned a null descriptor".into(),
                })?;
                Ok($name { ptr, lib, id: crate::raw::next_descriptor_id() })
            }
            /// A process-unique id (never reused), for memoising per-descriptor queries.
            #[allow(dead_code)] // not every descriptor kind is memoised
            pub(crate) fn id(&self) -> u64 {
                self.id
            }
            pub(crate) fn as_ptr(&self) -> $ptr {
                self.ptr.as_ptr()
            }
            #[allow(dead_code)] // not every descriptor kind needs it
            pub(crate) fn lib(&self) -> &'static cudnn_safe_sys::Library {
                self.lib
            }
        }

        // SAFETY: a descriptor is host memory that cuDNN reads during calls and writes only in
        // set calls made while the owner holds it exclusively, and in `Drop`; moving it to
        // another thread is sound.
        unsafe impl Send for $name {}

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created by the matching create call, destroyed exactly once here.
                if let Err(e) = unsafe { $destroy(self.lib, self.ptr.as_ptr()) } {
                    log::warn!(concat!(stringify!($destroy), ": {}"), e);
                }
            }
        }
    };
}

/// Family modules declare their descriptor owners with `crate::raw::owned_descriptor!(...)`,
/// after declaring the create/destroy calls with [`raw_fns`].
pub(crate) use owned_descriptor;

/// A fresh id for a descriptor. Ids are never reused (unlike addresses), so a memo keyed by ids
/// can never confuse a dropped descriptor with a new one.
pub(crate) fn next_descriptor_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Maps a raw descriptor pointer type to the struct it points to.
pub(crate) trait Pointee {
    type Target;
}
impl<T> Pointee for *mut T {
    type Target = T;
}

owned_descriptor!(
    /// An owned `cudnnTensorDescriptor_t`.
    OwnedTensor,
    sys::cudnnTensorDescriptor_t,
    cudnnCreateTensorDescriptor,
    cudnnDestroyTensorDescriptor
);
owned_descriptor!(
    /// An owned `cudnnFilterDescriptor_t`.
    OwnedFilter,
    sys::cudnnFilterDescriptor_t,
    cudnnCreateFilterDescriptor,
    cudnnDestroyFilterDescriptor
);
owned_descriptor!(
    /// An owned `cudnnConvolutionDescriptor_t`.
    OwnedConv,
    sys::cudnnConvolutionDescriptor_t,
    cudnnCreateConvolutionDescriptor,
    cudnnDestroyConvolutionDescriptor
);
owned_descriptor!(
    /// An owned `cudnnActivationDescriptor_t`.
    OwnedActivation,
    sys::cudnnActivationDescriptor_t,
    cudnnCreateActivationDescriptor,
    cudnnDestroyActivationDescriptor
);
