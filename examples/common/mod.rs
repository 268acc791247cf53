//! Shared by the examples: the GPU opening ("no GPU here" exit), error chains, a seeded random
//! generator, a CUDA-event timer, and the trained parameters and the loss (and accuracy) plots of
//! the training examples.
//!
//! Included by each example with `#[path = "common/mod.rs"] mod common;` (Cargo does not build
//! `examples/common/mod.rs` as an example of its own).
// Each example uses a different part of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use cudnn_safe::cudarc::driver::sys::CUevent_flags;
use cudnn_safe::cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DriverError};
use cudnn_safe::{cuda_context, Cudnn, DataType, Error, Result, TensorDesc};

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

/// Draws per-epoch curves as `file` (an SVG) in [`out_dir`]: the training loss on the left axis
/// and the held-out accuracy in percent on the right one, with `caption` above; returns the
/// file's path.
pub fn write_loss_accuracy_svg(
    file: &str,
    caption: &str,
    loss: &[(usize, f64)],
    accuracy: &[(usize, f64)],
) -> std::result::Result<PathBuf, Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let path = out_dir()?.join(file);
    let root = SVGBackend::new(&path, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let epochs = loss.iter().chain(accuracy).map(|p| p.0).max().unwrap_or(0) + 1;
    let loss_max = loss.iter().map(|p| p.1).filter(|v| v.is_finite()).fold(0.0, f64::max) * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .right_y_label_area_size(56)
        .build_cartesian_2d(0..epochs, 0.0..loss_max.max(f64::MIN_POSITIVE))?
        .set_secondary_coord(0..epochs, 0.0..100.0);
    chart.configure_mesh().x_desc("epoch").y_desc("training loss").draw()?;
    chart.configure_secondary_axes().y_desc("held-out accuracy (%)").draw()?;
    chart
        .draw_series(LineSeries::new(loss.iter().copied(), BLUE.stroke_width(2)))?
        .label("training loss")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    chart
        .draw_secondary_series(LineSeries::new(accuracy.iter().copied(), RED.stroke_width(2)))?
        .label("held-out accuracy")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
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

    /// Uniform in `0..n` (`n ≥ 1`), by remainder: the bias, below `n / 2⁶⁴`, does not matter
    /// for the sizes the examples draw.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `len` weights for a layer of `fan_in` inputs per output, He-uniform:
    /// `U(±√(6 / fan_in))`, variance `2 / fan_in` (for ReLU networks).
    pub fn he_uniform(&mut self, len: usize, fan_in: usize) -> Vec<f32> {
        let a = (6.0 / fan_in as f64).sqrt();
        (0..len).map(|_| (a * self.signed_unit()) as f32).collect()
    }

    /// Shuffles `v` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// A trained f32 tensor on the device with its gradient and momentum, updated by SGD with
/// momentum through cuDNN's `c ← alpha·a + beta·c` on a flat `[1, len, 1, 1]` view.
pub struct Param {
    pub value: CudaSlice<f32>,
    pub grad: CudaSlice<f32>,
    pub velocity: CudaSlice<f32>,
    flat: TensorDesc<f32>,
}

impl Param {
    /// A parameter holding `init`, with zero gradient and momentum.
    pub fn new(stream: &Arc<CudaStream>, init: &[f32]) -> Result<Param> {
        let zeros = || stream.alloc_zeros::<f32>(init.len()).map_err(drv("allocating"));
        let value = stream.clone_htod(init).map_err(drv("uploading a parameter"))?;
        let flat = TensorDesc::nchw(1, init.len() as i64, 1, 1)?;
        Ok(Param { value, grad: zeros()?, velocity: zeros()?, flat })
    }

    /// `v ← momentum·v + grad; value ← value − lr·v` (PyTorch's SGD with momentum), as two
    /// `cudnnAddTensor`.
    pub fn sgd(&mut self, cudnn: &Cudnn, lr: f32, momentum: f32) -> Result<()> {
        let d = &self.flat;
        cudnn.add_tensor(1.0, d, &self.grad, momentum, d, &mut self.velocity)?;
        cudnn.add_tensor(-lr, d, &self.velocity, 1.0, d, &mut self.value)
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
