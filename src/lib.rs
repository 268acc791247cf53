//! # cudnn-safe
//!
//! Safe, checked Rust bindings to NVIDIA cuDNN 9 (and cuBLAS), built on [`cudarc`]'s device
//! memory and streams. Where cudarc's own `cudnn` module offers `unsafe fn` launches that check no
//! buffer sizes, this crate's launches are safe functions that check first and return typed
//! errors, and it adds the graph API, attention, fused operations and an autotuner that searches
//! legacy algorithms and graph engines together.
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
//!   manual selection, and the [`Autotuner`] ([`tune`]) with PyTorch-style policies, a
//!   workspace limit, fallback and a persistent cache.
//! * Layers: [`pooling`], [`activation`], [`softmax`], [`norm`] (batch, layer, group and
//!   instance normalization), [`dropout`], [`ops`] (op-tensor) and [`reduce`], forward and
//!   backward; [`rnn`] (RNN, LSTM, GRU on the v8 API). Values a backward pass needs from its
//!   forward pass are owned values returned by the forward call.
//! * cuBLAS and cuBLASLt ([`blas`]) on cudarc's bindings, with checked GEMM and fused epilogues.
//! * The graph (backend) API ([`graph`]): a graph builder for convolutions, matmuls, pointwise
//!   operations and reductions, engine heuristics with filters, autotuned and cached plans
//!   ([`tune::plan`]), and checked execution.
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
//! let y_d = TensorDesc::<cudnn_safe::half::f16>::nhwc(2, 3, 4, 4)?;
//! let x = stream.clone_htod(&vec![1.5f32; x_d.span()])?;
//! let mut y = stream.alloc_zeros::<cudnn_safe::half::f16>(y_d.span())?;
//! cudnn.transform_tensor(1.0, &x_d, &x, 0.0, &y_d, &mut y)?;
//! # Ok(()) }
//! ```
//!
//! Layers: `cudnn-safe-sys` holds the generated bindings and the loader; `raw` (private) has
//! one function per C call; the public types here own their cuDNN objects and check every call.
//!
//! ## Conventions
//!
//! Names of configured values follow one rule across the crate:
//!
//! * **Builders** finished by a validating step take `#[must_use]` setters named after the
//!   value, `x(v)`: those finished by `build()` ([`conv::ConvBuilder`], [`TensorBuilder`], the
//!   normalization builders) and those validated by the operation they configure
//!   ([`graph::Sdpa`], [`graph::SdpaOptions`] given to [`graph::Graph::sdpa`], the RNN argument
//!   bundles given to the RNN calls).
//! * **Plain-data descriptions and handles configured before use** ([`blas::lt::Matmul`],
//!   [`graph::ConvParams`], [`graph::PlanFilter`], [`norm::NormMethod`], [`Autotuner`],
//!   [`blas::BlasLt`], [`Workspace`]) take by-value `#[must_use]` setters `with_x(v)`; a handle
//!   changes in place with `set_x(&mut self, v)` (fallible where the library is called, as
//!   [`Cudnn::set_stream`]); the getter is `x()`, or `is_x()` for a flag (or a public field).
//! * **Shapes**: dimensions and strides are `i64` (as cuDNN takes them), element counts and byte
//!   sizes `usize`. A tensor's shape and memory layout is a [`Layout`]; a family that hands a
//!   cuDNN descriptor to the library takes a [`TensorDesc`] (a `Layout` with its element type)
//!   or [`FilterDesc`], the normalization families take the `Layout` itself, and graph tensors
//!   are declared from the same dims and strides. [`Layout::pack`] and [`Layout::unpack`] move
//!   logical (NCHW-ordered) host data into any layout and back.
//! * **Cache files** are the one exception, alike on the three tuners ([`Autotuner`],
//!   [`blas::BlasLt`], [`tune::plan::PlanCache`]): `cache_file(path)`, `try_cache_file(path)`
//!   and `without_cache_file()` set the file, `cache_path()` reads it.
//!
//! ## CUDA versions
//!
//! cudarc binds one version of the CUDA driver API, chosen by exactly one feature. This crate's
//! default is `cuda-13000` (driver 580 or newer). For a CUDA 12 driver, turn the default off:
//!
//! ```toml
//! [dependencies]
//! cudnn-safe = { version = "0.1", default-features = false, features = ["cuda-12080"] } # or cuda-12060
//! ```
//!
//! If your own `cudarc` dependency already names a version, select the same feature here, or
//! `features = ["cuda-version-from-cudarc"]` (with `default-features = false`) to leave the
//! choice to it. No version, or two, stops the build with one error that says this.
//!
//! cudarc loads the CUDA libraries (driver, cuBLAS, cuBLASLt, NVRTC) at run time unless another
//! crate of the build asks it to link them, as candle-core's `cuda` feature does. Such a build
//! must enable this crate's `cudarc-dynamic-linking` feature (which asks cudarc for the same):
//! without it, it fails to compile. The CUDA libraries must then be where the linker finds them;
//! cuDNN is still loaded at run time.
//!
//! ## Logging
//!
//! The crate logs through the `log` crate (autotune decisions, fallbacks,
//! failed destroys). cuDNN's own messages are routed there too, under the target
//! `cudnn_safe::cudnn`, once a logger is installed before the first cuDNN call: cuDNN warnings at
//! `warn`, cuDNN errors at `debug` (each is also returned as an [`Error`] with the same reason),
//! cuDNN's API trace (every call with its arguments) at `trace`. With `env_logger`,
//! `RUST_LOG=cudnn_safe=debug` shows both. Setting `CUDNN_LOGLEVEL_DBG` instead keeps cuDNN's
//! own logging to `CUDNN_LOGDEST_DBG` (stderr, stdout or a file), untouched by the crate.
//!
//! ## Environment variables
//!
//! The library reads these and no others:
//!
//! | variable | default | effect |
//! |---|---|---|
//! | `CUDNN_SAFE_LIBRARY` | unset: `libcudnn.so.9`, then `libcudnn.so`, through the dynamic loader | The cuDNN library file, or the directory holding it. When set, only that location is searched, and its directory's sub-libraries are opened before any others. Read once, at the first use of cuDNN ([`sys::loader::LIBRARY_ENV`]). |
//! | `CUDNN_SAFE_AUTOTUNE_CACHE` | unset: decisions kept in memory | File from which [`Autotuner::new`] reads convolution decisions and to which it writes new ones ([`Autotuner::cache_file`] names another, [`Autotuner::without_cache_file`] none; [`tune::CACHE_ENV`]). |
//! | `CUDNN_SAFE_LT_AUTOTUNE_CACHE` | unset: decisions kept in memory | The same for [`blas::BlasLt::new`]'s cuBLASLt decisions ([`blas::lt::CACHE_ENV`]). |
//! | `CUDNN_SAFE_BUILD_THREADS` | unset: the machine's parallelism, at most [`graph::DEFAULT_MAX_BUILD_THREADS`] | Threads that finalize the plans of engines compiling at run time at once ([`graph::build_threads`]; [`graph::set_build_threads`] overrides it). Read when plans are built. |
//! | `CUDNN_SAFE_LIB_DIR` | unset: the linker's own search path | Build time, with the `link` feature only: the directory holding `libcudnn.so` for `-lcudnn`. |
//!
//! The test suites read four more:
//!
//! | variable | default | effect |
//! |---|---|---|
//! | `CUDNN_SAFE_REQUIRE_LIBRARY` | unset: tests that need libcudnn skip, saying why | `1`: they fail instead |
//! | `CUDNN_SAFE_REQUIRE_GPU` | unset: tests that need a GPU skip, saying why | `1`: they fail instead |
//! | `CUDNN_SAFE_PTXAS` | `ptxas` on `PATH` (the test skips without one) | the `ptxas` that assembles the crate's PTX in a unit test |
//! | `CUDNN_SAFE_KEEP_PTX` | unset: the test deletes its files | set: it keeps the PTX and cubins |
//!
//! Logging goes through the `log` crate (see [Logging](#logging)): `RUST_LOG` belongs to the
//! logger the program installs. CUDA's and cuDNN's own variables (`CUDA_MODULE_LOADING`,
//! `CUDNN_LOGLEVEL_DBG`) act as NVIDIA documents them. The benchmarks' knobs are documented with
//! the benchmarks in the repository (`docs/BENCHMARKS.md`).
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![warn(missing_docs)]

pub mod activation;
pub mod blas;
pub mod buffer;
pub mod capture;
mod checks;
pub mod conv;
mod cudnn_log;
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
mod stream_order;
pub mod tensor;
mod timing;
pub mod tune;
mod version;
mod workspace;

pub use activation::{ActivationDesc, ActivationMode, GeluApproximation, NanPropagation};
pub use buffer::{DeviceBuffer, DeviceBufferMut};
pub use capture::{CaptureBuffers, Captured};
pub use dropout::{Dropout, DropoutReserve};
pub use dtype::{DType, DataType, Scalar};
pub use error::{Error, LoadError, Result, Status, StatusFamily};
pub use graph::{LayerNormGrads, LayerNormOutputs};
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
pub use tune::Autotuner;
pub use version::{format_version, versions, Versions};
pub use workspace::{Workspace, MAX_WORKSPACE_BYTES};

/// Re-exports of the crates whose types appear in this API.
pub use cudarc;
/// The raw bindings and loader (for calling what this crate does not wrap yet).
pub use cudnn_safe_sys as sys;
pub use float8;
pub use half;

/// The README's example compiles as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
