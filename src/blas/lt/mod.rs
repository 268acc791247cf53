//! cuBLASLt matmul with fused epilogues, heuristic candidates and an autotune over them, in the
//! row-major shapes users of `nn.Linear` think in. The public documentation (row-major ↔
//! column-major mapping, bias direction, bias gradient, alignment) is on [`BlasLt`].
//!
//! The module is the namespace: `lt::Matmul`, `lt::Policy`, `lt::CACHE_ENV`, as ash writes
//! `khr::Swapchain`.
//!
//! ```
//! use cudnn_safe::blas::lt::{self, Epilogue};
//! let op = lt::Matmul::linear(8, 16, 32)?.with_epilogue(Epilogue::Bias);
//! assert_eq!(op.bias_len(), 32);
//! assert_eq!(lt::CACHE_ENV, "CUDNN_SAFE_LT_AUTOTUNE_CACHE");
//! # Ok::<(), cudnn_safe::Error>(())
//! ```

mod desc;
mod epilogue;
mod fp8;
mod handle;
mod launch;
mod matmul;
mod tune;

pub use epilogue::{Epilogue, EpilogueData};
pub use fp8::{Fp8, Fp8Kind, Fp8Output, Fp8Scaling};
pub use handle::BlasLt;
pub use matmul::Matmul;
pub use tune::{Candidate, Choice, Policy, Source, Stats};

use crate::dtype::DataType;
use half::{bf16, f16};

/// Environment variable naming the cuBLASLt autotune cache file read by [`BlasLt::new`].
pub const CACHE_ENV: &str = "CUDNN_SAFE_LT_AUTOTUNE_CACHE";

/// Workspace limit of a new [`BlasLt`]: 32 MiB, NVIDIA's recommendation for Hopper (PyTorch uses
/// the same on sm90).
pub const DEFAULT_WORKSPACE: usize = 32 << 20;

/// Candidates an autotune times by default.
pub const DEFAULT_AUTOTUNE_CANDIDATES: usize = 8;

/// The alignment (bytes) [`BlasLt::candidates`] assumes for every pointer.
pub const CANDIDATE_ALIGNMENT: u32 = 16;

/// Most alignment passed to cuBLASLt (its default assumption).
pub(super) const MAX_ALIGNMENT: u32 = 256;

/// Most candidates one heuristic query returns.
pub(super) const MAX_CANDIDATES: usize = 64;

mod sealed {
    use cudarc::cublaslt::sys::cudaDataType;

    /// Seals [`super::Element`] and carries its cuBLASLt data type out of the public API.
    pub trait Sealed {
        fn cuda_type() -> cudaDataType;
    }
    impl Sealed for f32 {
        fn cuda_type() -> cudaDataType {
            cudaDataType::CUDA_R_32F
        }
    }
    impl Sealed for half::f16 {
        fn cuda_type() -> cudaDataType {
            cudaDataType::CUDA_R_16F
        }
    }
    impl Sealed for half::bf16 {
        fn cuda_type() -> cudaDataType {
            cudaDataType::CUDA_R_16BF
        }
    }
}

/// An element type [`BlasLt`] multiplies: `f32`, [`struct@f16`] or [`bf16`] (sealed). All three
/// use f32 accumulation (`CUBLAS_COMPUTE_32F`, or `32F_FAST_TF32` for f32 with
/// [`Matmul::with_tf32`]) and f32 `alpha`/`beta`; the bias and aux buffers have the element type.
pub trait Element: DataType + sealed::Sealed {}

impl Element for f32 {}
impl Element for f16 {}
impl Element for bf16 {}
