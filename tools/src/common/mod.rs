//! Shared by the tools: the seven benchmark configurations, the four precision modes,
//! problem setup with random inputs, a CUDA-event timer, option parsing with `--help` and the
//! "no GPU here" exit.
//!
//! Included by each tool with `#[path = "common/mod.rs"] mod common;`.
// Each tool uses a different part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use cudnn_safe::conv::{ConvDesc, MathType};
use cudnn_safe::cudarc::driver::sys::CUevent_flags;
use cudnn_safe::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DriverError};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{
    cuda_context, Cudnn, DataType, Error, FilterDesc, Result, TensorDesc, TensorFormat,
};

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

impl Config {
    /// Zero padding on each side: `R / 2` ("same" padding for odd kernels).
    pub fn pad(&self) -> i64 {
        self.r / 2
    }

    /// Output height and width.
    pub fn out_hw(&self) -> (i64, i64) {
        let out = |i: i64| (i + 2 * self.pad() - self.r) / self.stride + 1;
        (out(self.h), out(self.w))
    }

    /// `32x64x56x56->128 3x3/1`.
    pub fn label(&self) -> String {
        format!(
            "{}x{}x{}x{}->{} {}x{}/{}",
            self.n, self.c, self.h, self.w, self.k, self.r, self.r, self.stride
        )
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

/// Wraps a cudarc driver error (allocation, copy, event) into the crate's error type.
pub fn drv(context: &'static str) -> impl Fn(DriverError) -> Error {
    move |source| Error::Driver { context, source }
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

/// `e`'s message followed by each of its causes that the message does not already show, one
/// `caused by:` line each: what `main` prints for an error.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let line = c.to_string();
        if !text.contains(&line) {
            text.push_str("\n  caused by: ");
            text.push_str(&line);
        }
        cause = c.source();
    }
    text
}

/// Opens device 0 and a cuDNN handle on its default stream, or prints
/// `<tool> needs an NVIDIA GPU: <why>` and returns `None`.
pub fn open_gpu(tool: &str) -> Option<(Arc<CudaStream>, Cudnn)> {
    let opened = cuda_context(0).and_then(|ctx| {
        let stream = ctx.default_stream();
        Cudnn::new(stream.clone()).map(|cudnn| (stream, cudnn))
    });
    match opened {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("{tool} needs an NVIDIA GPU: {}", chain(&e));
            None
        }
    }
}

/// The GPU's name and compute capability, for headers (`NVIDIA H200 (sm_90)`).
pub fn device_line(stream: &CudaStream) -> String {
    let ctx = stream.context();
    let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
    match ctx.compute_capability() {
        Ok((major, minor)) => format!("{name} (sm_{major}{minor})"),
        Err(_) => name,
    }
}

/// Where output files go: `$CUDNN_SAFE_OUT_DIR` if set, else the current directory.
pub fn out_dir() -> std::io::Result<PathBuf> {
    let dir = std::env::var_os("CUDNN_SAFE_OUT_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// xorshift64* PRNG: deterministic inputs without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[-1, 1)`.
    pub fn signed_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// `n` values uniform in `[-1, 1)`, rounded to `T`.
    pub fn values<T: DataType>(&mut self, n: usize) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.signed_unit())).collect()
    }
}

/// The data types the tools run: tied to their mode, with f32 alpha/beta.
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
impl Element for bf16 {
    fn nan() -> Self {
        bf16::NAN
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
        let x = stream
            .clone_htod(&rng.values::<T>(x_d.span()))
            .map_err(&upload)?;
        let w = stream
            .clone_htod(&rng.values::<T>(w_d.span()))
            .map_err(&upload)?;
        let y = stream
            .alloc_zeros::<T>(y_d.span())
            .map_err(drv("allocating the output"))?;
        Ok(Problem {
            x_d,
            w_d,
            conv,
            y_d,
            x,
            w,
            y,
        })
    }
}

/// Warm-up calls before timing (their time is ignored).
const WARMUP_CALLS: usize = 3;
/// Timed batches; the median batch's per-call time is reported.
const BATCHES: usize = 5;
/// Calls per batch are chosen so a batch lasts about this long, within `1..=MAX_BATCH_CALLS`.
const TARGET_BATCH_MS: f64 = 5.0;
const MAX_BATCH_CALLS: usize = 10;

/// Times GPU work with a pair of CUDA events recorded on a stream.
pub struct Timer {
    stream: Arc<CudaStream>,
    start: CudaEvent,
    end: CudaEvent,
}

impl Timer {
    pub fn new(stream: &Arc<CudaStream>) -> Result<Timer> {
        let ctx = stream.context();
        // cudarc creates events with CU_EVENT_DISABLE_TIMING when no flags are given, and such
        // events cannot be used with `elapsed_ms`: ask for the default (timing) flags explicitly.
        let event = || {
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv("creating a timing event"))
        };
        Ok(Timer {
            stream: stream.clone(),
            start: event()?,
            end: event()?,
        })
    }

    /// Milliseconds per call of `calls` back-to-back calls of `f` (device time between the
    /// events around them: host enqueue cost shows only where it starves the GPU).
    pub fn batch(&self, calls: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let calls = calls.max(1);
        self.start
            .record(&self.stream)
            .map_err(drv("recording an event"))?;
        for _ in 0..calls {
            f()?;
        }
        self.end
            .record(&self.stream)
            .map_err(drv("recording an event"))?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(drv("reading an event time"))?;
        Ok(f64::from(ms) / calls as f64)
    }

    /// Median per-call time of `f` in ms: [`WARMUP_CALLS`] warm-up calls (the first may load
    /// kernels lazily), one timed probe call, then [`BATCHES`] batches sized from the probe so
    /// that slow algorithms do not stretch the run.
    pub fn per_call_ms(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        self.batch(WARMUP_CALLS, f)?;
        let estimate = self.batch(1, f)?;
        let calls = if estimate > 0.0 {
            ((TARGET_BATCH_MS / estimate).ceil() as usize).clamp(1, MAX_BATCH_CALLS)
        } else {
            MAX_BATCH_CALLS
        };
        let mut samples = (0..BATCHES)
            .map(|_| self.batch(calls, f))
            .collect::<Result<Vec<f64>>>()?;
        samples.sort_by(f64::total_cmp);
        Ok(samples[BATCHES / 2])
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

/// `1.5 MiB`-style byte counts.
pub fn bytes(n: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
