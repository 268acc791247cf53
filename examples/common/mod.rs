//! Shared by the examples: the GPU opening ("no GPU here" exit), error chains, a seeded random
//! generator, a CUDA-event timer and the loss-curve plot of the training examples.
//!
//! Included by each example with `#[path = "common/mod.rs"] mod common;` (Cargo does not build
//! `examples/common/mod.rs` as an example of its own).
// Each example uses a different part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use cudnn_safe::cudarc::driver::sys::CUevent_flags;
use cudnn_safe::cudarc::driver::{CudaEvent, CudaStream, DriverError};
use cudnn_safe::{cuda_context, Cudnn, DataType, Error, Result};

/// Wraps a cudarc driver error (allocation, copy, event) into the crate's error type.
pub fn drv(context: &'static str) -> impl Fn(DriverError) -> Error {
    move |source| Error::Driver { context, source }
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
/// `<example> needs an NVIDIA GPU: <why>` and returns `None`.
pub fn open_gpu(example: &str) -> Option<(Arc<CudaStream>, Cudnn)> {
    let opened = cuda_context(0).and_then(|ctx| {
        let stream = ctx.default_stream();
        Cudnn::new(stream.clone()).map(|cudnn| (stream, cudnn))
    });
    match opened {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("{example} needs an NVIDIA GPU: {}", chain(&e));
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

/// The end of a training run: prints the first loss against the mean of the last ten, plots
/// the curve as `<name>_loss.svg` (titled `caption` and the two losses) and says whether the
/// loss fell at least `drop` times.
pub fn training_summary(
    name: &str,
    caption: &str,
    y_desc: &str,
    curve: &[(usize, f64)],
    drop: f64,
) -> bool {
    let initial = curve.first().map_or(f64::NAN, |p| p.1);
    let tail = &curve[curve.len().saturating_sub(10)..];
    let last = tail.iter().map(|p| p.1).sum::<f64>() / tail.len() as f64;
    let (n, ratio) = (tail.len(), initial / last);
    println!(
        "training loss: {initial:.5} first, {last:.5} (mean of the last {n}), {ratio:.2}× lower"
    );
    let caption = format!("{caption}: loss {initial:.3} → {last:.4}");
    match write_loss_svg(&format!("{name}_loss.svg"), &caption, y_desc, curve) {
        Ok(path) => println!("loss curve: {}", path.display()),
        Err(e) => eprintln!("{name}: loss curve not written: {e}"),
    }
    let learned = last * drop < initial;
    if !learned {
        eprintln!("{name}: the loss did not fall at least {drop}× ({initial:.5} → {last:.5})");
    }
    learned
}

/// Draws a training-loss curve (`(step, loss)` points) as `file` (an SVG) in [`out_dir`], with
/// `caption` above it and `y_desc` naming the loss; returns the file's path.
pub fn write_loss_svg(
    file: &str,
    caption: &str,
    y_desc: &str,
    curve: &[(usize, f64)],
) -> std::result::Result<PathBuf, Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let path = out_dir()?.join(file);
    let root = SVGBackend::new(&path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let y_max = curve.iter().map(|p| p.1).fold(0.0, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0..curve.len(), 0.0..y_max)?;
    chart.configure_mesh().x_desc("step").y_desc(y_desc).draw()?;
    chart.draw_series(LineSeries::new(curve.iter().copied(), BLUE.stroke_width(2)))?;
    root.present()?;
    drop(chart);
    drop(root);
    Ok(path)
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
        Ok(Timer { stream: stream.clone(), start: event()?, end: event()? })
    }

    /// Milliseconds per call of `calls` back-to-back calls of `f` (device time between the
    /// events around them: host enqueue cost shows only where it starves the GPU).
    pub fn batch(&self, calls: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let calls = calls.max(1);
        self.start.record(&self.stream).map_err(drv("recording an event"))?;
        for _ in 0..calls {
            f()?;
        }
        self.end.record(&self.stream).map_err(drv("recording an event"))?;
        let ms = self.start.elapsed_ms(&self.end).map_err(drv("reading an event time"))?;
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
        let mut samples =
            (0..BATCHES).map(|_| self.batch(calls, f)).collect::<Result<Vec<f64>>>()?;
        samples.sort_by(f64::total_cmp);
        Ok(samples[BATCHES / 2])
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
