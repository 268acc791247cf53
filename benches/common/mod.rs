//! Helpers shared by the benchmark binaries (each uses a subset, hence the `dead_code`
//! allowance). Use from a bench with `mod common; use common::*;`.
//!
//! * Setup: [`setup_cudnn`] opens device 0's default stream and a cuDNN handle on it;
//!   [`setup_or_skip`] prints `no GPU: <why>` when it fails, and the bench returns.
//!   [`setup_cudnn_per_thread`] and [`setup_per_thread_or_skip`] do the same on the per-thread
//!   default stream, which [`Cudnn::capture`] can record.
//! * Selection: [`Args`] reads the parts of criterion's command line that decide whether a
//!   benchmark runs, so that a bench prepares data (and autotune decisions) only for groups
//!   criterion will run; [`list_only`] registers a group without preparing anything.
//! * Device time from CUDA events: [`event_ms`] (one batch), [`batch_ms`] (per call),
//!   [`median_ms`] (median of [`BATCHES`] batches of about [`BATCH_MS`] each, for the lines a
//!   bench prints itself), [`timed_iters`] (criterion's `iter_custom` measurement) and
//!   [`sample_size`] (a criterion sample count that fits slow problems).
//! * Host time: [`enqueue_loop`] and [`per_call_us`] time back-to-back enqueues with a wall clock.
//! * Data: [`values`] (deterministic inputs) and [`tflops`].
//! * Output: [`print_header`] (the opening JSON line), [`print_op_line`] / [`print_op_error`]
//!   (one JSON line per operation), [`print_summary`] (the closing table of [`Summary`] rows)
//!   and [`exit_on_error`].
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use cudnn_safe::cudarc::driver::sys::CUevent_flags;
use cudnn_safe::cudarc::driver::CudaStream;
use cudnn_safe::{cuda_context, Cudnn, DataType};

/// What a bench's fallible preparation and timed closures return.
pub type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Batches [`median_ms`] takes the median of.
pub const BATCHES: usize = 5;
/// Device milliseconds [`median_ms`] aims at per batch.
pub const BATCH_MS: f64 = 25.0;
/// Default wall-clock milliseconds [`median_ms`] runs the call back to back before timing
/// (`BENCH_HEAT_MS` overrides): on an H200 a compute-bound kernel runs up to 17 % faster in the
/// first ~0.2 s of load than once the clocks have settled, so a line timed right after an idle
/// moment (a Python script's first calls) and one timed after an autotuning search would not
/// compare. Both the Rust lines and `benches/pytorch/timing.py` time the settled state.
pub const HEAT_MS: f64 = 500.0;

/// [`HEAT_MS`], or `BENCH_HEAT_MS` from the environment.
pub fn heat_ms() -> f64 {
    std::env::var("BENCH_HEAT_MS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .unwrap_or(HEAT_MS)
}

/// The device-0 default stream and a cuDNN handle on it.
pub fn setup_cudnn() -> cudnn_safe::Result<(Arc<CudaStream>, Cudnn)> {
    let ctx = cuda_context(0)?;
    let stream = ctx.default_stream();
    let cudnn = Cudnn::new(stream.clone())?;
    Ok((stream, cudnn))
}

// ---------------------------------------------------------------------------------------------
// What criterion will run
// ---------------------------------------------------------------------------------------------

/// The parts of the command line that `Criterion::configure_from_args` acts on and that decide
/// whether a benchmark runs, so that data and autotune decisions are only prepared for groups
/// criterion will run.
#[derive(Clone, Debug, Default)]
pub struct Args {
    /// `--list`: criterion only lists the benchmarks.
    pub list: bool,
    /// `cargo test --benches` or `--test`: criterion runs each benchmark once.
    pub test: bool,
    /// `--ignored`: criterion runs nothing.
    pub ignored: bool,
    /// `--exact`: the filter names one benchmark id exactly.
    pub exact: bool,
    /// The first positional argument.
    pub filter: Option<String>,
}

impl Args {
    /// criterion's options that take a value (a filter is the first other positional).
    const WITH_VALUE: &'static [&'static str] = &[
        "-c",
        "--color",
        "--colour",
        "-s",
        "--save-baseline",
        "-b",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--format",
        "--profile-time",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--plotting-backend",
        "--output-format",
    ];

    /// The process's command line.
    pub fn parse() -> Args {
        Args::parse_from(std::env::args().skip(1))
    }

    /// `args` (without the program name).
    pub fn parse_from(args: impl IntoIterator<Item = String>) -> Args {
        let mut a = Args::default();
        let (mut bench, mut test) = (false, false);
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--list" => a.list = true,
                "--test" => test = true,
                "--bench" => bench = true,
                "--ignored" => a.ignored = true,
                "--exact" => a.exact = true,
                s if Self::WITH_VALUE.contains(&s) => {
                    it.next();
                }
                s if s.starts_with('-') => {}
                s => {
                    if a.filter.is_none() {
                        a.filter = Some(s.to_string());
                    }
                }
            }
        }
        // criterion's rule: `cargo bench` passes --bench; without it (cargo test) it tests.
        a.test = !bench || test;
        a
    }

    /// Whether criterion will run the benchmark `id` (`group/function`). Errs towards yes: a
    /// filter using regex syntax counts as selecting everything (criterion matches a regex).
    pub fn runs(&self, id: &str) -> bool {
        if self.list || self.ignored {
            return false;
        }
        match &self.filter {
            None => true,
            Some(f) if self.exact => id == f,
            Some(f) if f.contains(|ch: char| "\\.+*?()|[]{}^$".contains(ch)) => true,
            Some(f) => id.contains(f.as_str()),
        }
    }

    /// Whether criterion will run any of `group/function` for `functions`.
    pub fn runs_any(&self, group: &str, functions: &[&str]) -> bool {
        functions.iter().any(|f| self.runs(&format!("{group}/{f}")))
    }
}

/// Registers a group's benchmarks without preparing anything: criterion only lists them
/// (`--list`) or filters them out, and never calls the closures.
pub fn list_only(c: &mut Criterion, group: &str, functions: &[&str]) {
    let mut g = c.benchmark_group(group);
    for f in functions {
        g.bench_function(*f, |b| b.iter(|| ()));
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------------
// Device time (CUDA events)
// ---------------------------------------------------------------------------------------------

/// Device milliseconds of `calls` calls enqueued back to back on `stream`, from CUDA events
/// recorded before and after (waits for the second event).
pub fn event_ms(
    stream: &CudaStream,
    calls: usize,
    mut call: impl FnMut() -> BoxResult<()>,
) -> BoxResult<f64> {
    // `record_event(None)` creates events without timing; elapsed_ms needs timing events.
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags)?;
    for _ in 0..calls {
        call()?;
    }
    let end = stream.record_event(flags)?;
    Ok(f64::from(start.elapsed_ms(&end)?))
}

/// Device milliseconds per call over `calls` back-to-back calls ([`event_ms`] / `calls`).
pub fn batch_ms(
    stream: &CudaStream,
    calls: usize,
    call: impl FnMut() -> BoxResult<()>,
) -> BoxResult<f64> {
    Ok(event_ms(stream, calls, call)? / calls as f64)
}

/// Median device milliseconds per call over [`BATCHES`] batches sized to about [`BATCH_MS`]
/// each (3 to 500 calls), after one warm-up call that also sizes the batches and [`heat_ms`] of
/// such batches untimed (the settled clock state). Under `cargo test` (`test`, see
/// [`Args::test`]) one batch of one call.
pub fn median_ms(
    stream: &CudaStream,
    test: bool,
    mut call: impl FnMut() -> BoxResult<()>,
) -> BoxResult<f64> {
    let once = event_ms(stream, 1, &mut call)?;
    let (batches, calls) = if test {
        (1, 1)
    } else {
        (
            BATCHES,
            ((BATCH_MS / once.max(1e-3)) as usize).clamp(3, 500),
        )
    };
    if !test {
        let heat = Instant::now();
        while heat.elapsed().as_secs_f64() * 1e3 < heat_ms() {
            event_ms(stream, calls, &mut call)?;
        }
    }
    let mut v = Vec::with_capacity(batches);
    for _ in 0..batches {
        v.push(batch_ms(stream, calls, &mut call)?);
    }
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

/// Criterion's measurement for `iters` calls (`b.iter_custom(|iters| timed_iters(..))`): device
/// time from CUDA events. Panics on an error, as criterion's closures cannot return one.
pub fn timed_iters(
    stream: &CudaStream,
    iters: u64,
    mut call: impl FnMut() -> BoxResult<()>,
) -> Duration {
    let ms = event_ms(stream, iters as usize, &mut call).unwrap_or_else(|e| panic!("{e}"));
    Duration::from_secs_f64(ms / 1e3)
}

/// The most samples (10 to 100) whose smallest linear sampling plan (1 + 2 + … + n
/// iterations of `ms` each) fits in 2 s, so that criterion does not stretch a short
/// measurement for slow problems.
pub fn sample_size(ms: f64) -> usize {
    let iters = 2000.0 / ms.max(1e-4);
    let n = ((1.0 + 8.0 * iters).sqrt() - 1.0) / 2.0;
    (n as usize).clamp(10, 100)
}

// ---------------------------------------------------------------------------------------------
// Host time (wall clock)
// ---------------------------------------------------------------------------------------------

/// Enqueues `iters` calls back to back, synchronizing `stream` after every `sync_every` calls
/// (0: never in between, to bound the queue of long loops) and at the end; the wall time.
pub fn enqueue_loop(
    stream: &CudaStream,
    iters: u64,
    sync_every: u64,
    mut call: impl FnMut(),
) -> Duration {
    let t = Instant::now();
    for i in 0..iters {
        call();
        if sync_every != 0 && i % sync_every == sync_every - 1 {
            stream.synchronize().unwrap();
        }
    }
    stream.synchronize().unwrap();
    t.elapsed()
}

/// Microseconds per call of [`enqueue_loop`] over `n` calls, after `n / 20` warm-up calls.
pub fn per_call_us(stream: &CudaStream, n: u64, sync_every: u64, mut call: impl FnMut()) -> f64 {
    enqueue_loop(stream, n / 20, sync_every, &mut call);
    enqueue_loop(stream, n, sync_every, &mut call).as_secs_f64() * 1e6 / n as f64
}

// ---------------------------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------------------------

/// `n` deterministic values in `[-scale, scale]`, non-constant and almost never zero.
pub fn values<T: DataType>(n: usize, scale: f64) -> Vec<T> {
    (0..n as u64)
        .map(|i| {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            T::from_f64(scale * ((h % 2001) as f64 / 1000.0 - 1.0))
        })
        .collect()
}

/// `n` deterministic standard-normal values (Box–Muller over SplitMix64): the
/// distribution of PyTorch's `randn`, for inputs of a line compared with a PyTorch line (a
/// tensor-core kernel's power draw, and so its clocks under sustained load, depend on the data).
pub fn normal_values<T: DataType>(n: usize) -> Vec<T> {
    // SplitMix64: consecutive indices give independent-looking uniforms in (0, 1).
    let unit = |i: u64| {
        let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n as u64)
        .map(|i| {
            let (u1, u2) = (unit(2 * i), unit(2 * i + 1));
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            T::from_f64(z)
        })
        .collect()
}

/// TFLOP/s of `flops` floating-point operations in `ms` milliseconds.
pub fn tflops(flops: f64, ms: f64) -> f64 {
    flops / (ms * 1e-3) / 1e12
}

// ---------------------------------------------------------------------------------------------
// Output: JSON lines and the closing summary
// ---------------------------------------------------------------------------------------------

/// [`setup_cudnn`], or `None` after printing `no GPU: <why>` (the bench then returns, so that
/// `cargo bench` on a machine without a GPU ends cleanly).
pub fn setup_or_skip() -> Option<(Arc<CudaStream>, Cudnn)> {
    match setup_cudnn() {
        Ok(v) => Some(v),
        Err(e) => {
            println!("no GPU: {e}");
            None
        }
    }
}

/// [`setup_cudnn`] on device 0's per-thread default stream instead: the stream
/// [`Cudnn::capture`] records (CUDA cannot capture the legacy default stream).
pub fn setup_cudnn_per_thread() -> cudnn_safe::Result<(Arc<CudaStream>, Cudnn)> {
    let ctx = cuda_context(0)?;
    let stream = ctx.per_thread_stream();
    let cudnn = Cudnn::new(stream.clone())?;
    Ok((stream, cudnn))
}

/// [`setup_cudnn_per_thread`], or `None` after printing `no GPU: <why>` (as
/// [`setup_or_skip`]).
pub fn setup_per_thread_or_skip() -> Option<(Arc<CudaStream>, Cudnn)> {
    match setup_cudnn_per_thread() {
        Ok(v) => Some(v),
        Err(e) => {
            println!("no GPU: {e}");
            None
        }
    }
}

/// The JSON line that opens a bench's output: the cuDNN version, the GPU and the implementation.
pub fn print_header(stream: &CudaStream, cudnn: &Cudnn) {
    let gpu = stream
        .context()
        .name()
        .unwrap_or_else(|_| "unknown GPU".into());
    println!(
        "{{\"cudnn\": {}, \"gpu\": {gpu:?}, \"impl\": \"cudnn-safe\"}}",
        cudnn.version()
    );
}

/// The JSON line of an operation whose first call failed (it is not measured).
pub fn print_op_error(op: &str, e: &dyn std::fmt::Display) {
    println!("{{\"op\": \"{op}\", \"error\": {:?}}}", e.to_string());
}

/// The JSON line of a measured operation: median `ms`, the bandwidth when the bytes it moves
/// are known, and `note` (extra JSON fields, e.g. `"method": "reduce"`).
pub fn print_op_line(op: &str, ms: f64, bytes: Option<f64>, note: Option<&str>) {
    let bandwidth = bytes.map_or_else(String::new, |b| {
        format!(", \"TB/s\": {:.3}", tb_per_s(b, ms))
    });
    let note = note.map_or_else(String::new, |n| format!(", {n}"));
    println!("{{\"op\": \"{op}\", \"ms\": {ms:.5}{bandwidth}{note}, \"impl\": \"cudnn-safe\"}}");
}

/// TB/s of `bytes` moved in `ms` milliseconds.
pub fn tb_per_s(bytes: f64, ms: f64) -> f64 {
    bytes / ms / 1e9
}

/// One measured operation, for the table [`print_summary`] prints at the end.
#[derive(Clone, Debug)]
pub struct Summary {
    /// The operation's name (its criterion id within the group).
    pub op: String,
    /// Median device milliseconds per call.
    pub ms: f64,
    /// Bytes one call reads and writes, when known.
    pub bytes: Option<f64>,
}

/// A table of `summary` (nothing when empty), the op column `op_width` characters wide.
pub fn print_summary(summary: &[Summary], op_width: usize) {
    if summary.is_empty() {
        return;
    }
    println!(
        "\n{:<op_width$} {:>10} {:>8}",
        "op (cudnn-safe)", "ms", "TB/s"
    );
    for s in summary {
        let tb = s
            .bytes
            .map_or_else(|| "-".to_string(), |b| format!("{:.3}", tb_per_s(b, s.ms)));
        println!("{:<op_width$} {:>10.5} {:>8}", s.op, s.ms, tb);
    }
}

/// The JSON line naming the cuDNN and cuBLAS library files this process has mapped (from
/// `/proc/self/maps`; an empty list elsewhere), printed as a bench ends, when every library it
/// used is loaded: a comparison with PyTorch's `timing.py` footer then shows both sides' files.
pub fn print_libraries() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut files: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|f| {
            let name = f.rsplit('/').next().unwrap_or(f);
            name.starts_with("libcudnn") || name.starts_with("libcublas")
        })
        .collect();
    files.sort_unstable();
    files.dedup();
    println!("{{\"libraries\": {files:?}, \"impl\": \"cudnn-safe\"}}");
}

/// Ends a bench: names the library files it ran ([`print_libraries`]); an error from its run is
/// printed as `<bench> bench: <e>` and exits with status 1, so that a script running the
/// benches notices.
pub fn exit_on_error(bench: &str, outcome: BoxResult<()>) {
    print_libraries();
    if let Err(e) = outcome {
        eprintln!("{bench} bench: {e}");
        std::process::exit(1);
    }
}
