//! Shared by the tools: the seven benchmark configurations, the four precision modes,
//! problem setup with random inputs, option parsing with `--help` and cuDNN's refusals; the
//! GPU opening ("no GPU here" exit), error chains, random inputs, the CUDA-event timer and the
//! convolution problem come from the examples' helpers, compiled here as they are.
//!
//! Included by each tool with `#[path = "common/mod.rs"] mod common;`.
// Each tool uses a different part of this module.
#![allow(dead_code)]

use std::process::ExitCode;
use std::sync::Arc;

use cudnn_safe::conv::{ConvDesc, MathType};
use cudnn_safe::cudarc::driver::CudaStream;
use cudnn_safe::half::bf16;
use cudnn_safe::{DataType, Error, Result, TensorFormat};

// The examples' helpers (`examples/common/`), one copy for both packages. Each tool uses a
// different part of them, and `conv` resolves its `crate::common::{drv, Rng}` through the
// re-exports below. `rustfmt::skip`: the examples' own rustfmt.toml formats these files.
#[path = "../../../examples/common/conv.rs"]
#[rustfmt::skip]
mod conv;
#[path = "../../../examples/common/mod.rs"]
#[rustfmt::skip]
mod shared;

// Not every tool uses every helper.
#[allow(unused_imports)]
pub use conv::{Config, Element, Problem};
#[allow(unused_imports)]
pub use shared::{bytes, chain, device_line, drv, open_gpu, out_dir, Rng, Timer};

const fn cfg(n: i64, c: i64, h: i64, w: i64, k: i64, r: i64, stride: i64) -> Config {
    Config {
        n,
        c,
        h,
        w,
        k,
        r,
        stride,
    }
}

/// The seven ResNet-like layers the convolution tools run (the same set the lead compares with PyTorch).
pub const CONFIGS: [Config; 7] = [
    cfg(32, 64, 56, 56, 128, 3, 1),
    cfg(16, 256, 28, 28, 512, 3, 1),
    cfg(1, 3, 224, 224, 64, 7, 2),
    cfg(8, 512, 14, 14, 1024, 3, 2),
    cfg(32, 256, 56, 56, 256, 3, 1),
    cfg(64, 64, 56, 56, 64, 1, 1),
    cfg(32, 128, 28, 28, 128, 5, 1),
];

// The examples' `Config` (its `pad` and `label` included), with what the tools add.
impl Config {
    /// Output height and width.
    pub fn out_hw(&self) -> (i64, i64) {
        let out = |i: i64| (i + 2 * self.pad() - self.r) / self.stride + 1;
        (out(self.h), out(self.w))
    }

    /// Floating-point operations of one forward pass (2 per multiply-add).
    pub fn flops(&self) -> f64 {
        let (p, q) = self.out_hw();
        2.0 * (self.n * self.k * p * q * self.c * self.r * self.r) as f64
    }
}

/// A data type, memory layout and math type combination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// f32 NCHW, FMA math only: strict fp32 (PyTorch `allow_tf32 = False`).
    Fp32,
    /// f32 NCHW, default math: cuDNN may use TF32 tensor cores (PyTorch's cuDNN default).
    Tf32,
    /// f16 NHWC (filters KRSC), tensor-op math, f32 accumulation.
    Fp16,
    /// bf16 NHWC (filters KRSC), tensor-op math, f32 accumulation.
    Bf16,
}

impl Mode {
    /// Every mode, in the order the tools run them.
    pub const ALL: [Mode; 4] = [Mode::Fp32, Mode::Tf32, Mode::Fp16, Mode::Bf16];

    /// Name used in tables and files (`fp16-nhwc`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Fp32 => "fp32-nchw",
            Mode::Tf32 => "tf32-nchw",
            Mode::Fp16 => "fp16-nhwc",
            Mode::Bf16 => "bf16-nhwc",
        }
    }

    /// Name used on the command line (`fp16`).
    pub fn key(self) -> &'static str {
        match self {
            Mode::Fp32 => "fp32",
            Mode::Tf32 => "tf32",
            Mode::Fp16 => "fp16",
            Mode::Bf16 => "bf16",
        }
    }

    /// Parses a [`key`](Self::key) (case-insensitive).
    pub fn from_key(s: &str) -> Option<Mode> {
        Mode::ALL
            .into_iter()
            .find(|m| m.key().eq_ignore_ascii_case(s.trim()))
    }

    /// The convolution's math type.
    pub fn math(self) -> MathType {
        match self {
            Mode::Fp32 => MathType::Fma,
            Mode::Tf32 => MathType::Default,
            Mode::Fp16 | Mode::Bf16 => MathType::TensorOp,
        }
    }

    /// Memory layout of tensors and filters.
    pub fn format(self) -> TensorFormat {
        match self {
            Mode::Fp32 | Mode::Tf32 => TensorFormat::Nchw,
            Mode::Fp16 | Mode::Bf16 => TensorFormat::Nhwc,
        }
    }

    /// Relative tolerance (to the largest reference magnitude) when two algorithms' results are
    /// compared: FFT and Winograd round differently from GEMM-based algorithms.
    pub fn tolerance(self) -> f64 {
        match self {
            Mode::Fp32 => 1e-3,
            Mode::Tf32 => 1e-2,
            Mode::Fp16 => 2e-2,
            Mode::Bf16 => 5e-2,
        }
    }
}

/// The tool's options parsed from `args` by `parse`; `--help` / `-h` prints `usage` and
/// gives the exit code to return (success), a parse error prints it with `usage` and gives
/// exit code 2.
pub fn options<O>(
    tool: &str,
    usage: &str,
    args: &[String],
    parse: impl FnOnce(&[String]) -> std::result::Result<O, String>,
) -> std::result::Result<O, ExitCode> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{usage}");
        return Err(ExitCode::SUCCESS);
    }
    parse(args).map_err(|e| {
        eprintln!("{tool}: {e}\n{usage}");
        ExitCode::from(2)
    })
}

/// bf16 joins the examples' element types (f32 and f16).
impl Element for bf16 {
    fn nan() -> Self {
        bf16::NAN
    }
}

impl<T: DataType> Problem<T> {
    /// Builds the problem for `cfg` in `mode`'s layout and math type; `y` is zeroed. The
    /// examples' [`Problem::new`] builds it in the layout of `mode` (the same random `x` and
    /// `w`); TF32 then gets its own convolution descriptor, with the default math type.
    pub fn in_mode(
        stream: &Arc<CudaStream>,
        cfg: &Config,
        mode: Mode,
        rng: &mut Rng,
    ) -> Result<Self> {
        let layout = match mode.format() {
            TensorFormat::Nhwc => conv::Mode::Fp16,
            _ => conv::Mode::Fp32,
        };
        let mut p = Problem::new(stream, cfg, layout, rng)?;
        if p.conv.math() != mode.math() {
            p.conv = ConvDesc::builder(2)
                .pads(p.conv.pads())
                .strides(p.conv.strides())
                .math(mode.math())
                .build::<T>()?;
        }
        Ok(p)
    }
}

/// What cuDNN (or this crate) said when it refused a call: the status name for cuDNN errors,
/// the whole message otherwise.
pub fn refusal(e: &Error) -> String {
    match e.status() {
        Some(s) => s.name(),
        None => e.to_string(),
    }
}
