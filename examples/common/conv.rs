//! `conv_manual`'s layers, precision modes and problem set-up (random `x` and `w`, zeroed `y`).
//!
//! Included with `#[path = "common/conv.rs"] mod conv;` beside `common`.
use std::sync::Arc;

use cudnn_safe::conv::{ConvDesc, MathType};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::f16;
use cudnn_safe::{DataType, FilterDesc, Result, TensorDesc, TensorFormat};

use crate::common::{drv, Rng};

/// One forward convolution shape: input `N×C×H×W`, `K` filters of `R×R`, stride `stride`,
/// padding `R/2` (cross-correlation, as deep-learning frameworks use it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub n: i64,
    pub c: i64,
    pub h: i64,
    pub w: i64,
    pub k: i64,
    pub r: i64,
    pub stride: i64,
}

const fn cfg(n: i64, c: i64, h: i64, w: i64, k: i64, r: i64, stride: i64) -> Config {
    Config { n, c, h, w, k, r, stride }
}

/// ResNet layers: a 3×3 of the first stage, the 7×7/2 stem and a 1×1 projection.
pub const CONFIGS: [Config; 3] =
    [cfg(32, 64, 56, 56, 128, 3, 1), cfg(1, 3, 224, 224, 64, 7, 2), cfg(64, 64, 56, 56, 64, 1, 1)];

impl Config {
    /// Zero padding on each side: `R / 2` ("same" padding for odd kernels).
    pub fn pad(&self) -> i64 {
        self.r / 2
    }

    /// `32x64x56x56->128 3x3/1`.
    pub fn label(&self) -> String {
        format!(
            "{}x{}x{}x{}->{} {}x{}/{}",
            self.n, self.c, self.h, self.w, self.k, self.r, self.r, self.stride
        )
    }
}

/// A data type, memory layout and math type combination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// f32 NCHW, FMA math only: strict fp32 (PyTorch `allow_tf32 = False`).
    Fp32,
    /// f16 NHWC (filters KRSC), tensor-op math, f32 accumulation.
    Fp16,
}

impl Mode {
    /// Name used in tables and files (`fp16-nhwc`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Fp32 => "fp32-nchw",
            Mode::Fp16 => "fp16-nhwc",
        }
    }

    /// The convolution's math type.
    pub fn math(self) -> MathType {
        match self {
            Mode::Fp32 => MathType::Fma,
            Mode::Fp16 => MathType::TensorOp,
        }
    }

    /// Memory layout of tensors and filters.
    pub fn format(self) -> TensorFormat {
        match self {
            Mode::Fp32 => TensorFormat::Nchw,
            Mode::Fp16 => TensorFormat::Nhwc,
        }
    }

    /// Relative tolerance (to the largest reference magnitude) when two algorithms' results are
    /// compared: FFT and Winograd round differently from GEMM-based algorithms.
    pub fn tolerance(self) -> f64 {
        match self {
            Mode::Fp32 => 1e-3,
            Mode::Fp16 => 2e-2,
        }
    }
}

/// The data types the examples run: tied to their mode, with f32 alpha/beta.
pub trait Element: DataType<Scalar = f32> {
    /// NaN of this type, to poison outputs before a call.
    fn nan() -> Self;
}
impl Element for f32 {
    fn nan() -> Self {
        f32::NAN
    }
}
impl Element for f16 {
    fn nan() -> Self {
        f16::NAN
    }
}

/// Descriptors and device buffers of one forward convolution, with random `x` and `w`.
pub struct Problem<T: DataType> {
    pub x_d: TensorDesc<T>,
    pub w_d: FilterDesc<T>,
    pub conv: ConvDesc,
    pub y_d: TensorDesc<T>,
    pub x: CudaSlice<T>,
    pub w: CudaSlice<T>,
    pub y: CudaSlice<T>,
}

impl<T: DataType> Problem<T> {
    /// Builds the problem for `cfg` in `mode`'s layout and math type; `y` is zeroed.
    pub fn new(stream: &Arc<CudaStream>, cfg: &Config, mode: Mode, rng: &mut Rng) -> Result<Self> {
        let format = mode.format();
        let tensor = |dims: &[i64]| match format {
            TensorFormat::Nhwc => TensorDesc::<T>::nhwc_nd(dims),
            _ => TensorDesc::<T>::nchw_nd(dims),
        };
        let x_d = tensor(&[cfg.n, cfg.c, cfg.h, cfg.w])?;
        let w_d = FilterDesc::<T>::new(&[cfg.k, cfg.c, cfg.r, cfg.r], format)?;
        let conv = ConvDesc::builder(2)
            .pads(&[cfg.pad(), cfg.pad()])
            .strides(&[cfg.stride, cfg.stride])
            .math(mode.math())
            .build::<T>()?;
        let y_d = tensor(&conv.output_dims(x_d.dims(), w_d.dims())?)?;
        let upload = drv("uploading random inputs");
        let x = stream.clone_htod(&rng.values::<T>(x_d.span())).map_err(&upload)?;
        let w = stream.clone_htod(&rng.values::<T>(w_d.span())).map_err(&upload)?;
        let y = stream.alloc_zeros::<T>(y_d.span()).map_err(drv("allocating the output"))?;
        Ok(Problem { x_d, w_d, conv, y_d, x, w, y })
    }
}
