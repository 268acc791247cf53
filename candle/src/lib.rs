//! cuDNN-backed operations on [candle](https://crates.io/crates/candle-core) tensors, through
//! `cudnn-safe`: a candle CUDA tensor's storage is a cudarc `CudaSlice` on the device's stream,
//! and these functions hand it to cuDNN on that same stream, with every argument checked first.
//!
//! * [`conv2d`] / [`conv1d`] (drop-in for `Tensor::conv2d` / `Tensor::conv1d`) and
//!   [`conv2d_with`] (per-dimension padding, stride and dilation): forward through
//!   `cudnn-safe`'s union autotune (legacy algorithms and graph engines timed together, the
//!   decision kept per problem, and in a file with `CUDNN_SAFE_AUTOTUNE_CACHE=path`); backward
//!   (candle's autograd) through the same tuner's backward-data and backward-filter searches.
//! * [`sdpa`]: scaled dot-product attention (PyTorch's `scaled_dot_product_attention`), cuDNN's
//!   fused flash-attention kernels forward and backward for f16 and bf16: grouped-query heads,
//!   [`Causal`] masks, additive or boolean masks, strided q, k, v.
//! * [`batch_norm`] (training, with the running statistics updated in place, and inference;
//!   [`BatchNorm`] is the layer), [`layer_norm`], [`rms_norm`] (over the last dimension) and
//!   [`group_norm`], with their gradients.
//! * [`conv2d_fused`] with [`fold_batch_norm`]: an inference layer `relu(conv(x, w) + b + z)` as
//!   one cuDNN graph, channels-last.
//! * [`softmax_last_dim`]: cuDNN's softmax over the last dimension, with its gradient.
//!
//! f32, f16 and bf16 on CUDA devices. CPU tensors run candle's own implementation, so a model
//! written with these functions runs anywhere. Inputs may be strided (transposed, narrowed): their
//! strides go to cuDNN as they are; broadcast (zero-stride) inputs are copied contiguous first.
//! A bad argument is an [`Error`] naming it (inside the `candle_core::Error`: [`Error::of`]), returned before
//! anything reaches the GPU.
//!
//! Settings are process-wide ([`set_options`]): the tuner's policy and search effort, and whether
//! f32 convolutions may use TF32 tensor cores (off by default, as candle's own f32 matmul).
//!
//! ```no_run
//! use candle_core::{Device, Tensor};
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::new_cuda(0)?;
//! let x = Tensor::randn(0f32, 1.0, (8, 64, 56, 56), &dev)?;
//! let w = Tensor::randn(0f32, 0.05, (128, 64, 3, 3), &dev)?;
//! // As x.conv2d(&w, padding, stride, dilation, groups):
//! let y = cudnn_safe_candle::conv2d(&x, &w, 1, 1, 1, 1)?;
//! assert_eq!(y.dims(), &[8, 128, 56, 56]);
//! # Ok(()) }
//! ```
mod attention;
mod batch;
mod buf;
mod conv;
mod error;
mod fused;
mod norm;
mod softmax;
mod state;

pub use attention::{sdpa, Causal};
pub use batch::{batch_norm, BatchNorm};
pub use conv::{conv1d, conv2d, conv2d_with, Conv2dParams};
pub use error::{cudnn_error, Error};
pub use fused::{conv2d_fused, fold_batch_norm};
pub use norm::{group_norm, layer_norm, rms_norm};
pub use softmax::softmax_last_dim;
pub use state::{options, set_options, Options};

pub use candle_core;
pub use cudnn_safe;
