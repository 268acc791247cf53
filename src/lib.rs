//! # cudnn-safe
//!
//! Safe, checked Rust bindings to NVIDIA cuDNN 9, built on [cudarc](https://docs.rs/cudarc)'s
//! device memory and streams.
//!
//! * cuDNN is loaded at run time (no CUDA or cuDNN needed to build). A missing or wrong library
//!   is an [`Error::Load`] naming what was searched, never a panic. Set `CUDNN_SAFE_LIBRARY` to the
//!   library file or its directory to choose one.
//! * Every launch is a safe function that checks first: each buffer holds at least the span of
//!   its descriptor and lives on the handle's CUDA context, outputs do not overlap themselves,
//!   shapes agree, dtypes are tied by the type system and alpha/beta are the scalar type cuDNN
//!   reads. A failed check returns an error before anything is enqueued.
//! * Errors carry the cuDNN status, the C function and `cudnnGetLastErrorString`.
//! * Convolution ([`conv`]): every direction and legacy algorithm, heuristic / benchmark /
//!   manual selection, and the [`Autotuner`] with PyTorch-style policies, a workspace limit,
//!   fallback and a persistent cache.
//! * Layers: [`pooling`], [`activation`], [`softmax`], [`norm`] (batch, layer, group and
//!   instance normalization), [`dropout`], [`ops`] (op-tensor) and [`reduce`], forward and
//!   backward; [`rnn`] (RNN, LSTM, GRU on the v8 API). Values a backward pass needs from its
//!   forward pass are owned values returned by the forward call.
//! * cuBLAS and cuBLASLt ([`blas`]) on cudarc's bindings, with checked GEMM and fused epilogues.
//! * The graph (backend) API ([`graph`]): a graph builder for convolutions, matmuls, pointwise
//!   operations and reductions, engine heuristics with filters, autotuned and cached plans, and
//!   checked execution.
//!
//! ```no_run
//! use cudnn_safe::{cuda_context, Cudnn, TensorDesc};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//!
//! // NCHW f32 -> NHWC f16
//! let x_d = TensorDesc::<f32>::nchw(2, 3, 4, 4)?;
//! let y_d = TensorDesc::<half::f16>::nhwc(2, 3, 4, 4)?;
//! let x = stream.clone_htod(&vec![1.5f32; x_d.span()]).unwrap();
//! let mut y = stream.alloc_zeros::<half::f16>(y_d.span()).unwrap();
//! cudnn.transform_tensor(1.0, &x_d, &x, 0.0, &y_d, &mut y)?;
//! # Ok(()) }
//! ```
//!
//! Layers: `cudnn-safe-sys` holds the generated bindings and the loader; `raw` (private) has
//! one function per C call; the public types here own their cuDNN objects and check every call.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs)]

pub mod activation;
mod autotune;
pub mod blas;
pub mod buffer;
mod checks;
pub mod conv;
pub mod dropout;
pub mod dtype;
pub mod error;
mod fast;
pub mod graph;
mod handle;
pub mod norm;
pub mod ops;
mod persist;
pub mod pooling;
mod raw;
pub mod reduce;
pub mod rnn;
pub mod softmax;
pub mod tensor;
mod version;
mod workspace;

pub use activation::{ActivationDesc, ActivationMode, NanPropagation};
pub use autotune::{
    Autotuner, Candidate, Choice, FixedAlgos, Policy, Source, TunerStats, WarmUp, CACHE_ENV,
    DEFAULT_FINALISTS, DEFAULT_FINAL_SOLO_MS, DEFAULT_GRAPH_PLANS, DEFAULT_REFINE_KNOBS,
};
pub use buffer::{DeviceBuffer, DeviceBufferMut};
pub use dropout::{Dropout, DropoutReserve};
pub use dtype::{DType, DataType, Scalar};
pub use error::{Error, LoadError, Result, Status, StatusFamily};
pub use graph::{ConvApi, GraphSearch, LayerNormGrads, LayerNormOutputs};
pub use handle::{cuda_context, Cudnn};
pub use norm::{
    BatchNorm, BatchNormMode, BatchNormOps, GroupNorm, LayerNorm, NormMethod, NormType,
};
pub use ops::OpTensorOp;
pub use pooling::{PoolingDesc, PoolingMode};
pub use reduce::ReduceOp;
pub use rnn::{Rnn, SeqDataDesc};
pub use softmax::{SoftmaxAlgorithm, SoftmaxMode};
pub use tensor::{FilterDesc, Layout, TensorBuilder, TensorDesc, TensorFormat};
pub use version::{format_version, versions, Versions};
pub use workspace::{Workspace, MAX_WORKSPACE_BYTES};

/// Re-exports of the crates whose types appear in this API.
pub use cudarc;
/// The raw bindings and loader (for calling what this crate does not wrap yet).
pub use cudnn_safe_sys as sys;
pub use half;

/// The README's example compiles as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
