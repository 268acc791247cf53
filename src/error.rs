//! The crate's error type.
//!
//! cuDNN statuses are kept as a [`Status`] newtype over the raw integer: a code that a newer cuDNN
//! returns and this crate does not list still maps to a name and a [`StatusFamily`] (cuDNN 9
//! groups codes by thousands), never to undefined behaviour.
use std::fmt;
use std::path::PathBuf;

pub use cudnn_safe_sys::LoadError;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cuDNN status code (`cudnnStatus_t`), kept as its integer value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub u32);

/// The family of a cuDNN 9 status code: its thousands digit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StatusFamily {
    /// `0`: success.
    Success,
    /// `1xxx`: the library is not in a usable state (not initialized, sub-library missing, ...).
    LibraryState,
    /// `2xxx`: a parameter was wrong.
    BadParam,
    /// `3xxx`: the request is valid but not supported (shape, dtype, layout, architecture).
    NotSupported,
    /// `4xxx`: an internal error (including allocation failures inside cuDNN).
    Internal,
    /// `5xxx`: a kernel or a dependent library failed while executing.
    ExecutionFailed,
    /// Any other value.
    Unknown,
}

/// Every status name cuDNN 9.14 defines, by code. Aliases (`CUDNN_STATUS_ALLOC_FAILED` = 4003,
/// ...) are listed under their primary name only.
const STATUS_NAMES: &[(u32, &str)] = &[
    (0, "CUDNN_STATUS_SUCCESS"),
    (1001, "CUDNN_STATUS_NOT_INITIALIZED"),
    (1002, "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH"),
    (1003, "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH"),
    (1004, "CUDNN_STATUS_DEPRECATED"),
    (1005, "CUDNN_STATUS_LICENSE_ERROR"),
    (1006, "CUDNN_STATUS_RUNTIME_IN_PROGRESS"),
    (1007, "CUDNN_STATUS_RUNTIME_FP_OVERFLOW"),
    (1008, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"),
    (2000, "CUDNN_STATUS_BAD_PARAM"),
    (2001, "CUDNN_STATUS_INVALID_VALUE"),
    (2002, "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"),
    (2003, "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"),
    (2004, "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED"),
    (2005, "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND"),
    (2006, "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT"),
    (2007, "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH"),
    (2008, "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH"),
    (2009, "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES"),
    (2010, "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE"),
    (2011, "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH"),
    (2012, "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE"),
    (3000, "CUDNN_STATUS_NOT_SUPPORTED"),
    (3001, "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN"),
    (3002, "CUDNN_STATUS_NOT_SUPPORTED_SHAPE"),
    (3003, "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE"),
    (3004, "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT"),
    (3005, "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER"),
    (3006, "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART"),
    (3007, "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH"),
    (
        3008,
        "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
    ),
    (3009, "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE"),
    (
        3010,
        "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
    ),
    (3011, "CUDNN_STATUS_NOT_SUPPORTED_PADDING"),
    (3012, "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM"),
    (3013, "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API"),
    (4000, "CUDNN_STATUS_INTERNAL_ERROR"),
    (4001, "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED"),
    (4002, "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE"),
    (4003, "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"),
    (4004, "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
    (4005, "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM"),
    (4006, "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED"),
    (5000, "CUDNN_STATUS_EXECUTION_FAILED"),
    (5001, "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER"),
    (5002, "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS"),
    (5003, "CUDNN_STATUS_EXECUTION_FAILED_CUDART"),
    (5004, "CUDNN_STATUS_EXECUTION_FAILED_CURAND"),
];

impl Status {
    /// `CUDNN_STATUS_SUCCESS`.
    pub const SUCCESS: Status = Status(0);
    /// `CUDNN_STATUS_NOT_INITIALIZED`: what `cudnnCreate` returns on a machine without a GPU.
    pub const NOT_INITIALIZED: Status = Status(1001);
    /// `CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED`.
    pub const SUBLIBRARY_LOADING_FAILED: Status = Status(1008);
    /// `CUDNN_STATUS_BAD_PARAM`.
    pub const BAD_PARAM: Status = Status(2000);
    /// `CUDNN_STATUS_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: Status = Status(3000);

    /// Whether this is `CUDNN_STATUS_SUCCESS`.
    pub fn is_success(self) -> bool {
        self.0 == 0
    }

    /// The family the code belongs to (its thousands digit).
    pub fn family(self) -> StatusFamily {
        match self.0 {
            0 => StatusFamily::Success,
            1000..=1999 => StatusFamily::LibraryState,
            2000..=2999 => StatusFamily::BadParam,
            3000..=3999 => StatusFamily::NotSupported,
            4000..=4999 => StatusFamily::Internal,
            5000..=5999 => StatusFamily::ExecutionFailed,
            _ => StatusFamily::Unknown,
        }
    }

    /// The C name of a known code, or `None` for a code this crate does not list.
    pub fn known_name(self) -> Option<&'static str> {
        STATUS_NAMES
            .iter()
            .find(|(code, _)| *code == self.0)
            .map(|(_, n)| *n)
    }

    /// The C name of the code; unknown codes are named by family
    /// (`CUDNN_STATUS_NOT_SUPPORTED (unknown code 3999)`).
    pub fn name(self) -> String {
        match self.known_name() {
            Some(n) => n.to_string(),
            None => {
                let fam = match self.family() {
                    StatusFamily::Success => "CUDNN_STATUS_SUCCESS",
                    StatusFamily::LibraryState => "CUDNN_STATUS_LIBRARY_STATE",
                    StatusFamily::BadParam => "CUDNN_STATUS_BAD_PARAM",
                    StatusFamily::NotSupported => "CUDNN_STATUS_NOT_SUPPORTED",
                    StatusFamily::Internal => "CUDNN_STATUS_INTERNAL_ERROR",
                    StatusFamily::ExecutionFailed => "CUDNN_STATUS_EXECUTION_FAILED",
                    StatusFamily::Unknown => "CUDNN_STATUS_UNKNOWN",
                };
                format!("{fam} (unknown code {})", self.0)
            }
        }
    }

    /// Every code this crate knows by name.
    pub fn all_known() -> impl Iterator<Item = Status> {
        STATUS_NAMES.iter().map(|(c, _)| Status(*c))
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Everything that can go wrong in this crate.
///
/// Argument errors are returned before anything is enqueued on the GPU: when a function returns
/// one of them, no output buffer has been touched.
///
/// `Display` says what went wrong and, for set-up failures (no cuDNN, no driver, no GPU), what to
/// do about it. `Debug` (`{:?}`) prints the same text followed by its causes, as `anyhow` does, so
/// that `fn main() -> cudnn_safe::Result<()>` reports an actionable message rather than a struct
/// dump; the alternate form `{:#?}` is the structured view of the variant and its fields.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A cuDNN call returned a status other than success.
    #[error("{function} failed with {status}{}", fmt_message(.message))]
    Cudnn {
        /// The status returned.
        status: Status,
        /// The C function that returned it.
        function: &'static str,
        /// `cudnnGetLastErrorString()` right after the call (may be empty).
        message: String,
    },
    /// cuDNN could not be loaded, or lacks a function.
    #[error("{0}")]
    Load(#[from] LoadError),
    /// The CUDA driver library (`libcuda.so`) is not present: there is no NVIDIA driver here.
    #[error("no NVIDIA driver found (the CUDA driver library libcuda.so.1 could not be loaded): install the NVIDIA driver on a machine with an NVIDIA GPU, or put the directory holding libcuda.so.1 on LD_LIBRARY_PATH")]
    NoDriver,
    /// A CUDA driver call (through cudarc) failed.
    #[error("CUDA driver error in {context}: {source}{}", driver_hint(source))]
    Driver {
        /// What was being done.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A buffer holds fewer elements than its descriptor addresses.
    #[error("buffer `{name}` holds {len} elements, its descriptor needs {required}")]
    BufferTooSmall {
        /// Which argument.
        name: &'static str,
        /// Elements the buffer holds.
        len: usize,
        /// Elements the descriptor addresses (its span).
        required: usize,
    },
    /// A buffer (or stream) belongs to another CUDA context than the handle: another device, or
    /// another context on the same device.
    #[error("`{name}` belongs to a CUDA context (on device {found}) other than the handle's (on device {expected})")]
    ForeignContext {
        /// Which argument.
        name: &'static str,
        /// Device ordinal of the handle's context.
        expected: usize,
        /// Device ordinal of the buffer's context.
        found: usize,
    },
    /// An output layout addresses some element twice.
    #[error("output `{name}` has a self-overlapping layout (dims {dims:?}, strides {strides:?})")]
    OverlappingOutput {
        /// Which argument.
        name: &'static str,
        /// Its dimensions.
        dims: Vec<i64>,
        /// Its strides.
        strides: Vec<i64>,
    },
    /// A layout, shape or parameter is invalid.
    #[error("invalid {what}: expected {expected}, got {got}")]
    InvalidArgument {
        /// What was checked.
        what: &'static str,
        /// What would be valid.
        expected: String,
        /// What was given.
        got: String,
    },
    /// Two tensors that must agree do not.
    #[error("shape mismatch between `{a}` {a_dims:?} and `{b}` {b_dims:?}: {rule}")]
    ShapeMismatch {
        /// First argument.
        a: &'static str,
        /// Its dimensions.
        a_dims: Vec<i64>,
        /// Second argument.
        b: &'static str,
        /// Its dimensions.
        b_dims: Vec<i64>,
        /// The rule that was broken.
        rule: &'static str,
    },
    /// An integer computation on sizes overflowed, or a value does not fit cuDNN's `int`.
    #[error("{what} overflows: {detail}")]
    Overflow {
        /// What was being computed.
        what: &'static str,
        /// The values involved.
        detail: String,
    },
    /// A data type (or combination) this operation does not support.
    #[error("unsupported data type for {op}: {detail}")]
    UnsupportedDataType {
        /// The operation.
        op: &'static str,
        /// Which types were given.
        detail: String,
    },
    /// A workspace is smaller than the size an algorithm asked for.
    #[error("workspace holds {available} bytes, {required} are required")]
    WorkspaceTooSmall {
        /// Bytes available.
        available: usize,
        /// Bytes required.
        required: usize,
    },
    /// No algorithm could run the operation under the current policy and workspace limit.
    #[error("no {op} algorithm could run this case: {detail}")]
    NoAlgorithm {
        /// The operation (e.g. `convolution forward`).
        op: &'static str,
        /// What was tried and why each was refused.
        detail: String,
    },
    /// No engine runs a graph: [`OperationGraph::plans`](crate::graph::OperationGraph::plans)
    /// kept no plan (the heuristics proposed none, or the filter, the workspace limit or plan
    /// building refused every one).
    #[error("no engine runs the graph ({graph}): {detail}")]
    NoEngine {
        /// The graph's operations, in order (e.g. `convolution forward, pointwise`).
        graph: String,
        /// What was tried and why each was refused.
        detail: String,
    },
    /// A cuBLAS or cuBLASLt call failed.
    #[error("{library} {function} failed with {status}")]
    Blas {
        /// `"cuBLAS"` or `"cuBLASLt"`.
        library: &'static str,
        /// The C function.
        function: &'static str,
        /// The status name (e.g. `CUBLAS_STATUS_NOT_SUPPORTED`).
        status: String,
    },
    /// A CUDA library other than cuDNN (cuBLAS, cuBLASLt) could not be loaded.
    #[error("the {library} library could not be loaded (searched for {searched}); install the CUDA toolkit's {library} (e.g. `pip install nvidia-cublas`) and put it on LD_LIBRARY_PATH")]
    LibraryMissing {
        /// Which library.
        library: &'static str,
        /// The base name searched for.
        searched: &'static str,
    },
    /// An operation cuDNN has no kernel for (GELU) needs one of the crate's own, run-time
    /// compiled kernels, and it is not available here: no NVRTC library, or compiling or loading
    /// it failed (the reason says which). Nothing was enqueued.
    #[error("{op} runs only on cudnn-safe's own kernel, which is not available: {reason}")]
    KernelUnavailable {
        /// The operation (e.g. `GELU forward`).
        op: &'static str,
        /// Why the kernel is not available.
        reason: String,
    },
    /// A workspace request exceeds the configured limit.
    #[error("workspace request of {requested} bytes exceeds the limit of {limit} bytes")]
    WorkspaceLimit {
        /// Bytes requested.
        requested: usize,
        /// The limit in force.
        limit: usize,
    },
    /// Work a CUDA graph cannot record was asked for while the stream was being captured, a
    /// capture failed, or a captured graph's buffers changed ([`crate::capture`]).
    #[error("{operation}: {detail}")]
    Capture {
        /// What was about to happen.
        operation: &'static str,
        /// Why it cannot, and what to do.
        detail: String,
    },
    /// Reading or writing a file (a tuner or plan cache) failed. Nothing was replaced: a failed
    /// write leaves the previous file, and no temporary file, behind.
    #[error("reading or writing {} failed: {source}", .path.display())]
    Io {
        /// The file read or written.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

/// What to do about the driver errors a set-up step meets (empty for the others).
fn driver_hint(e: &cudarc::driver::DriverError) -> &'static str {
    use cudarc::driver::sys::CUresult;
    match e.0 {
        CUresult::CUDA_ERROR_NO_DEVICE => {
            "; no CUDA-capable GPU is visible to this process (check `nvidia-smi` and CUDA_VISIBLE_DEVICES)"
        }
        CUresult::CUDA_ERROR_INVALID_DEVICE => {
            "; there is no GPU with this ordinal (check `nvidia-smi` and CUDA_VISIBLE_DEVICES)"
        }
        CUresult::CUDA_ERROR_STUB_LIBRARY => {
            "; the libcuda.so found is the CUDA toolkit's link stub, not the driver: install the NVIDIA driver, or take the toolkit's `stubs` directory off LD_LIBRARY_PATH"
        }
        CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => {
            "; the driver library and the loaded kernel module are different versions: reboot, or reinstall the NVIDIA driver"
        }
        _ => "",
    }
}

impl fmt::Debug for Error {
    /// The `Display` text and its causes (`{:?}`), or the variant's fields (`{:#?}`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return self.fmt_fields(f);
        }
        write!(f, "{self}")?;
        let mut shown = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let text = c.to_string();
            // Variants that also print their cause in their own text (`Driver`) are not repeated.
            if !shown.contains(&text) {
                write!(f, "\n  caused by: {text}")?;
                shown.push_str(&text);
            }
            cause = c.source();
        }
        Ok(())
    }
}

impl Error {
    /// The structured `Debug` form: the variant and its fields.
    fn fmt_fields(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cudnn {
                status,
                function,
                message,
            } => f
                .debug_struct("Cudnn")
                .field("status", status)
                .field("function", function)
                .field("message", message)
                .finish(),
            Error::Load(e) => f.debug_tuple("Load").field(e).finish(),
            Error::NoDriver => f.write_str("NoDriver"),
            Error::Driver { context, source } => f
                .debug_struct("Driver")
                .field("context", context)
                .field("source", source)
                .finish(),
            Error::BufferTooSmall {
                name,
                len,
                required,
            } => f
                .debug_struct("BufferTooSmall")
                .field("name", name)
                .field("len", len)
                .field("required", required)
                .finish(),
            Error::ForeignContext {
                name,
                expected,
                found,
            } => f
                .debug_struct("ForeignContext")
                .field("name", name)
                .field("expected", expected)
                .field("found", found)
                .finish(),
            Error::OverlappingOutput {
                name,
                dims,
                strides,
            } => f
                .debug_struct("OverlappingOutput")
                .field("name", name)
                .field("dims", dims)
                .field("strides", strides)
                .finish(),
            Error::InvalidArgument {
                what,
                expected,
                got,
            } => f
                .debug_struct("InvalidArgument")
                .field("what", what)
                .field("expected", expected)
                .field("got", got)
                .finish(),
            Error::ShapeMismatch {
                a,
                a_dims,
                b,
                b_dims,
                rule,
            } => f
                .debug_struct("ShapeMismatch")
                .field("a", a)
                .field("a_dims", a_dims)
                .field("b", b)
                .field("b_dims", b_dims)
                .field("rule", rule)
                .finish(),
            Error::Overflow { what, detail } => f
                .debug_struct("Overflow")
                .field("what", what)
                .field("detail", detail)
                .finish(),
            Error::UnsupportedDataType { op, detail } => f
                .debug_struct("UnsupportedDataType")
                .field("op", op)
                .field("detail", detail)
                .finish(),
            Error::WorkspaceTooSmall {
                available,
                required,
            } => f
                .debug_struct("WorkspaceTooSmall")
                .field("available", available)
                .field("required", required)
                .finish(),
            Error::Capture { operation, detail } => f
                .debug_struct("Capture")
                .field("operation", operation)
                .field("detail", detail)
                .finish(),
            Error::NoAlgorithm { op, detail } => f
                .debug_struct("NoAlgorithm")
                .field("op", op)
                .field("detail", detail)
                .finish(),
            Error::NoEngine { graph, detail } => f
                .debug_struct("NoEngine")
                .field("graph", graph)
                .field("detail", detail)
                .finish(),
            Error::Blas {
                library,
                function,
                status,
            } => f
                .debug_struct("Blas")
                .field("library", library)
                .field("function", function)
                .field("status", status)
                .finish(),
            Error::LibraryMissing { library, searched } => f
                .debug_struct("LibraryMissing")
                .field("library", library)
                .field("searched", searched)
                .finish(),
            Error::KernelUnavailable { op, reason } => f
                .debug_struct("KernelUnavailable")
                .field("op", op)
                .field("reason", reason)
                .finish(),
            Error::WorkspaceLimit { requested, limit } => f
                .debug_struct("WorkspaceLimit")
                .field("requested", requested)
                .field("limit", limit)
                .finish(),
            Error::Io { path, source } => f
                .debug_struct("Io")
                .field("path", path)
                .field("source", source)
                .finish(),
        }
    }
}

fn fmt_message(m: &str) -> String {
    if m.is_empty() {
        String::new()
    } else {
        format!(": {m}")
    }
}

impl Error {
    /// The cuDNN status, for errors that come from a cuDNN call.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Cudnn { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Wraps a cudarc driver error with what was being done (for code mixing cudarc calls
    /// with this crate's, e.g. `stream.alloc_zeros(n).map_err(|e| Error::driver("allocating y", e))`).
    pub fn driver(context: &'static str, source: cudarc::driver::DriverError) -> Error {
        Error::Driver { context, source }
    }

    pub(crate) fn invalid(
        what: &'static str,
        expected: impl Into<String>,
        got: impl fmt::Display,
    ) -> Error {
        Error::InvalidArgument {
            what,
            expected: expected.into(),
            got: got.to_string(),
        }
    }
}

impl From<cudarc::driver::DriverError> for Error {
    /// A cudarc driver error from a call made outside this crate (`?` on cudarc results).
    fn from(source: cudarc::driver::DriverError) -> Self {
        Error::Driver {
            context: "a CUDA driver call",
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_has_its_family() {
        let mut seen = std::collections::HashSet::new();
        for s in Status::all_known() {
            assert!(seen.insert(s.0), "duplicate code {}", s.0);
            let name = s.known_name().unwrap();
            assert_eq!(s.name(), name);
            let fam = s.family();
            let expect = match s.0 / 1000 {
                0 => StatusFamily::Success,
                1 => StatusFamily::LibraryState,
                2 => StatusFamily::BadParam,
                3 => StatusFamily::NotSupported,
                4 => StatusFamily::Internal,
                5 => StatusFamily::ExecutionFailed,
                _ => unreachable!(),
            };
            assert_eq!(fam, expect, "{name}");
        }
        assert_eq!(seen.len(), 48);
    }

    #[test]
    fn unknown_codes_map_by_family() {
        assert_eq!(Status(2999).family(), StatusFamily::BadParam);
        assert_eq!(
            Status(2999).name(),
            "CUDNN_STATUS_BAD_PARAM (unknown code 2999)"
        );
        assert_eq!(Status(3100).family(), StatusFamily::NotSupported);
        assert_eq!(Status(5999).family(), StatusFamily::ExecutionFailed);
        assert_eq!(Status(1999).family(), StatusFamily::LibraryState);
        assert_eq!(Status(4999).family(), StatusFamily::Internal);
        assert_eq!(Status(7).family(), StatusFamily::Unknown);
        assert_eq!(Status(u32::MAX).family(), StatusFamily::Unknown);
        assert!(Status(u32::MAX).name().contains("unknown code"));
        // Old numbering (cuDNN 8 used small codes) is not mistaken for a known status.
        assert_eq!(Status(3).known_name(), None);
    }

    #[test]
    fn error_messages_say_what_and_how_much() {
        let e = Error::BufferTooSmall {
            name: "y",
            len: 1024,
            required: 2048,
        };
        assert_eq!(
            e.to_string(),
            "buffer `y` holds 1024 elements, its descriptor needs 2048"
        );
        let e = Error::Cudnn {
            status: Status(2000),
            function: "cudnnAddTensor",
            message: "bad dims".into(),
        };
        assert_eq!(
            e.to_string(),
            "cudnnAddTensor failed with CUDNN_STATUS_BAD_PARAM (2000): bad dims"
        );
        assert_eq!(e.status(), Some(Status::BAD_PARAM));
    }

    #[test]
    fn debug_prints_the_message_and_alternate_debug_the_fields() {
        let e = Error::BufferTooSmall {
            name: "y",
            len: 1024,
            required: 2048,
        };
        assert_eq!(format!("{e:?}"), e.to_string());
        let fields = format!("{e:#?}");
        assert!(fields.starts_with("BufferTooSmall {"), "{fields}");
        assert!(fields.contains("required: 2048"), "{fields}");
        // `fn main() -> Result<(), Error>` prints `Error: {:?}`: the advice must be in it.
        let e = Error::NoDriver;
        assert!(
            format!("{e:?}").contains("install the NVIDIA driver"),
            "{e:?}"
        );
        assert_eq!(format!("{e:#?}"), "NoDriver");
        let e = Error::Load(LoadError::NotFound { tried: vec![] });
        assert!(format!("{e:?}").contains("CUDNN_SAFE_LIBRARY"), "{e:?}");
        assert!(format!("{e:#?}").starts_with("Load("), "{e:#?}");
    }

    #[test]
    fn driver_errors_say_what_to_check() {
        // Only the hint is checked: a `DriverError`'s own text comes from libcuda, which a machine
        // without a driver does not have.
        use cudarc::driver::{sys::CUresult, DriverError};
        let hint = driver_hint(&DriverError(CUresult::CUDA_ERROR_NO_DEVICE));
        assert!(hint.contains("CUDA_VISIBLE_DEVICES"), "{hint}");
        let hint = driver_hint(&DriverError(CUresult::CUDA_ERROR_STUB_LIBRARY));
        assert!(hint.contains("install the NVIDIA driver"), "{hint}");
        assert_eq!(
            driver_hint(&DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
            ""
        );
    }
}
