//! Convolution benchmarks.
//!
//! * `conv_host_cost/{safe,raw_c,tuner_fixed,tuner_benchmark}`: the host cost of enqueueing one
//!   tiny convolution (x `[1,8,4,4]` f32 NCHW, w `[8,8,3,3]`, pad 1, `IMPLICIT_GEMM`, no
//!   workspace) through the checked [`Cudnn::conv_forward`], through the raw C
//!   `cudnnConvolutionForward` on the same handle, descriptors and buffers (what
//!   `shared/gpu/reference/overhead.cu` measures), and through an [`Autotuner`] with
//!   `Policy::Fixed(IMPLICIT_GEMM)` and with `Policy::Benchmark` (decided before measuring, so
//!   every call is a cache hit). Calls are enqueued back to back, with a stream synchronize every
//!   1000 calls to bound the queue. Afterwards a line `host-cost-ratio ...` gives safe/raw and
//!   tuner/raw from a plain `Instant` measurement of 20000 calls per path.
//! * `forward_policy/<mode>/<config>/{heuristic,benchmark,deterministic,raw_best}`: the forward
//!   convolution on the seven reference configurations, in strict fp32 (f32 NCHW,
//!   `MathType::Fma`) and fp16 NHWC (`MathType::TensorOp`), with the algorithm each autotune
//!   policy picks (decided before measuring) and, as the reference, the raw C call with the
//!   algorithm `conv_forward_find` ranks first. One iteration is one call plus a stream
//!   synchronize; throughput is in FLOPs (criterion prints them as "elem/s"). Before each group
//!   a line `policy-vs-raw <config> <mode>: ...` gives the per-call device time of every variant
//!   from CUDA events (median of 5 batches of 20 calls) and `benchmark/raw`.
//!
//! fp16 is controlled by `CONV_BENCH_FP16`: unset or `1` runs only `benchmark` and `raw_best`
//! under criterion (the `policy-vs-raw` line still times all four), `all` runs all four, `0`
//! skips fp16. With `--warm-up-time 1 --measurement-time 3` the default set is 46 criterion
//! benchmarks, about 4 minutes on an H200 including the autotune decisions.
//!
//! A filter argument selects benchmarks as criterion does; data and autotune decisions are only
//! set up for groups the filter can select, and `--list` sets up nothing. Without a GPU (no
//! driver, no device, no cuDNN) it prints `no GPU: <why>` and exits cleanly.
mod common;

use std::ffi::c_void;

use common::{
    batch_ms, enqueue_loop, list_only, per_call_us, sample_size, setup_or_skip, values, Args,
    BoxResult,
};
use criterion::{Criterion, Throughput};
use cudnn_safe::conv::{ConvAlgorithm, ConvDesc, ConvFwdAlgo, MathType};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use cudnn_safe::half::f16;
use cudnn_safe::sys;
use cudnn_safe::tune::{Choice, FixedAlgos, Policy};
use cudnn_safe::{Autotuner, Cudnn, DataType, FilterDesc, TensorDesc, TensorFormat, Workspace};

/// `cudnnConvolutionForward` as the loaded library exports it.
type ConvForwardFn = unsafe extern "C" fn(
    sys::cudnnHandle_t,
    *const c_void,
    sys::cudnnTensorDescriptor_t,
    *const c_void,
    sys::cudnnFilterDescriptor_t,
    *const c_void,
    sys::cudnnConvolutionDescriptor_t,
    sys::cudnnConvolutionFwdAlgo_t,
    *mut c_void,
    usize,
    *const c_void,
    sys::cudnnTensorDescriptor_t,
    *mut c_void,
) -> sys::cudnnStatus_t;

/// Calls enqueued between two synchronizes in the host-cost loops.
const SYNC_EVERY: u64 = 1000;
/// Calls per path in the `host-cost-ratio` measurement.
const RATIO_CALLS: u64 = 20_000;
/// CUDA-event timing of the `policy-vs-raw` lines: median of `BATCHES` batches of `CALLS`.
const BATCHES: usize = 5;
const CALLS: usize = 20;

// ---------------------------------------------------------------------------------------------
// Problems and the raw C call
// ---------------------------------------------------------------------------------------------

/// A 2-D convolution `N,C,H,W -> K` with a `R x R` kernel, stride `S` and padding `R / 2`.
#[derive(Debug, Clone, Copy)]
struct Cfg {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    k: i64,
    r: i64,
    s: i64,
}

impl Cfg {
    const fn new(n: i64, c: i64, h: i64, w: i64, k: i64, r: i64, s: i64) -> Cfg {
        Cfg {
            n,
            c,
            h,
            w,
            k,
            r,
            s,
        }
    }
    fn name(&self) -> String {
        format!(
            "{}x{}x{}x{}_k{}_{}x{}_s{}",
            self.n, self.c, self.h, self.w, self.k, self.r, self.r, self.s
        )
    }
}

/// The seven reference configurations.
const CONFIGS: [Cfg; 7] = [
    Cfg::new(32, 64, 56, 56, 128, 3, 1),
    Cfg::new(16, 256, 28, 28, 512, 3, 1),
    Cfg::new(1, 3, 224, 224, 64, 7, 2),
    Cfg::new(8, 512, 14, 14, 1024, 3, 2),
    Cfg::new(32, 256, 56, 56, 256, 3, 1),
    Cfg::new(64, 64, 56, 56, 64, 1, 1),
    Cfg::new(32, 128, 28, 28, 128, 5, 1),
];

/// Descriptors and buffers of one forward convolution, all on the handle's stream.
struct Problem<T: DataType> {
    x_d: TensorDesc<T>,
    w_d: FilterDesc<T>,
    conv: ConvDesc,
    y_d: TensorDesc<T>,
    x: CudaSlice<T>,
    w: CudaSlice<T>,
    y: CudaSlice<T>,
    /// `2·N·K·P·Q·C·R·S`.
    flops: u64,
}

impl<T: DataType<Scalar = f32>> Problem<T> {
    fn new(cudnn: &Cudnn, cfg: &Cfg, math: MathType, nhwc: bool) -> BoxResult<Self> {
        let stream = cudnn.stream();
        let (x_d, format) = if nhwc {
            (
                TensorDesc::<T>::nhwc(cfg.n, cfg.c, cfg.h, cfg.w)?,
                TensorFormat::Nhwc,
            )
        } else {
            (
                TensorDesc::<T>::nchw(cfg.n, cfg.c, cfg.h, cfg.w)?,
                TensorFormat::Nchw,
            )
        };
        let w_d = FilterDesc::<T>::new(&[cfg.k, cfg.c, cfg.r, cfg.r], format)?;
        let conv = ConvDesc::builder(2)
            .pads(&[cfg.r / 2, cfg.r / 2])
            .strides(&[cfg.s, cfg.s])
            .math(math)
            .build::<T>()?;
        let y_dims = conv.output_dims(x_d.dims(), w_d.dims())?;
        let y_d = if nhwc {
            TensorDesc::<T>::nhwc_nd(&y_dims)?
        } else {
            TensorDesc::<T>::nchw_nd(&y_dims)?
        };
        let x = stream.clone_htod(&values::<T>(x_d.span(), 1.0))?;
        let w = stream.clone_htod(&values::<T>(w_d.span(), 0.05))?;
        let y = stream.alloc_zeros::<T>(y_d.span())?;
        let flops = 2 * y_dims.iter().product::<i64>() * cfg.c * cfg.r * cfg.r;
        Ok(Problem {
            x_d,
            w_d,
            conv,
            y_d,
            x,
            w,
            y,
            flops: flops as u64,
        })
    }

    /// The checked call.
    fn safe(
        &mut self,
        cudnn: &Cudnn,
        algo: ConvFwdAlgo,
        ws: &mut Workspace,
    ) -> cudnn_safe::Result<()> {
        cudnn.conv_forward(
            1.0,
            &self.x_d,
            &self.x,
            &self.w_d,
            &self.w,
            &self.conv,
            algo,
            ws,
            0.0,
            &self.y_d,
            &mut self.y,
        )
    }

    /// The call through an autotuner.
    fn tuned(
        &mut self,
        cudnn: &Cudnn,
        tuner: &mut Autotuner,
    ) -> cudnn_safe::Result<Choice<ConvFwdAlgo>> {
        tuner.forward(
            cudnn,
            1.0,
            &self.x_d,
            &self.x,
            &self.w_d,
            &self.w,
            &self.conv,
            0.0,
            &self.y_d,
            &mut self.y,
        )
    }
}

/// The raw C `cudnnConvolutionForward` on a [`Problem`], with every argument resolved up front
/// so that a timed call is the bare C call. It holds the cudarc guards of the buffers and the
/// borrows of the handle, problem and workspace, so every pointer stays valid while it lives.
struct RawFwd<'a> {
    f: ConvForwardFn,
    handle: sys::cudnnHandle_t,
    x_d: sys::cudnnTensorDescriptor_t,
    x: *const c_void,
    w_d: sys::cudnnFilterDescriptor_t,
    w: *const c_void,
    conv: sys::cudnnConvolutionDescriptor_t,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    ws: *mut c_void,
    ws_bytes: usize,
    y_d: sys::cudnnTensorDescriptor_t,
    y: *mut c_void,
    alpha: f32,
    beta: f32,
    _guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> RawFwd<'a> {
    /// Checks what the checked call would (types, shapes, algorithm support, buffer spans and
    /// workspace size), then takes the pointers. The buffers were allocated on the handle's
    /// stream ([`Problem::new`], [`raw_workspace`]), so they are on its context.
    fn bind<T: DataType<Scalar = f32>>(
        f: ConvForwardFn,
        cudnn: &'a Cudnn,
        p: &'a mut Problem<T>,
        algo: ConvFwdAlgo,
        ws: Option<&'a mut CudaSlice<u8>>,
    ) -> BoxResult<Self> {
        let ws_bytes = cudnn.conv_forward_workspace_size(&p.x_d, &p.w_d, &p.conv, &p.y_d, algo)?;
        let have = ws.as_ref().map_or(0, |b| b.len());
        if have < ws_bytes {
            return Err(format!("{algo} needs {ws_bytes} bytes of workspace, {have} given").into());
        }
        for (name, len, span) in [
            ("x", p.x.len(), p.x_d.span()),
            ("w", p.w.len(), p.w_d.span()),
            ("y", p.y.len(), p.y_d.span()),
        ] {
            if len < span {
                return Err(format!("{name} holds {len} elements, needs {span}").into());
            }
        }
        let Problem {
            x_d,
            w_d,
            conv,
            y_d,
            x,
            w,
            y,
            ..
        } = p;
        let stream: &'a CudaStream = cudnn.stream();
        let (xp, gx) = x.device_ptr(stream);
        let (wp, gw) = w.device_ptr(stream);
        let (yp, gy) = y.device_ptr_mut(stream);
        let mut guards = vec![gx, gw, gy];
        let wsp = match ws {
            Some(b) if ws_bytes > 0 => {
                let (p, g) = b.device_ptr_mut(stream);
                guards.push(g);
                p as *mut c_void
            }
            _ => std::ptr::null_mut(),
        };
        Ok(RawFwd {
            f,
            handle: cudnn.as_raw(),
            x_d: x_d.as_raw(),
            x: xp as *const c_void,
            w_d: w_d.as_raw(),
            w: wp as *const c_void,
            conv: conv.as_raw(),
            algo: sys::cudnnConvolutionFwdAlgo_t(algo.raw_value()),
            ws: wsp,
            ws_bytes,
            y_d: y_d.as_raw(),
            y: yp as *mut c_void,
            alpha: 1.0,
            beta: 0.0,
            _guards: guards,
        })
    }

    /// Enqueues `y = conv(x, w)` and returns cuDNN's status.
    ///
    /// # Safety
    ///
    /// The handle's CUDA context must be current on the calling thread. Every checked call
    /// makes it current, and this program never makes another context current.
    unsafe fn enqueue(&self) -> sys::cudnnStatus_t {
        // SAFETY: the handle, descriptors and buffers are borrowed by `self` and alive; `bind`
        // checked types, shapes and algorithm support (workspace query), the buffer spans and
        // that the workspace holds the `ws_bytes` cuDNN asks for; all buffers are on the
        // handle's context, which the caller guarantees is current; y is packed, so it does not
        // overlap itself, and `&mut` kept it distinct from x and w; alpha/beta are f32, what
        // cuDNN reads for f32 and f16 tensors.
        unsafe {
            (self.f)(
                self.handle,
                (&self.alpha as *const f32).cast::<c_void>(),
                self.x_d,
                self.x,
                self.w_d,
                self.w,
                self.conv,
                self.algo,
                self.ws,
                self.ws_bytes,
                (&self.beta as *const f32).cast::<c_void>(),
                self.y_d,
                self.y,
            )
        }
    }
}

fn check(status: sys::cudnnStatus_t) {
    assert_eq!(
        status.0, 0,
        "cudnnConvolutionForward returned status {}",
        status.0
    );
}

/// A workspace of `bytes` on the handle's stream (`None` for 0).
fn raw_workspace(cudnn: &Cudnn, bytes: usize) -> BoxResult<Option<CudaSlice<u8>>> {
    Ok(if bytes == 0 {
        None
    } else {
        Some(cudnn.stream().alloc_zeros::<u8>(bytes)?)
    })
}

/// A tuner that decides afresh: no cache file, and nothing loaded from one (`Autotuner::new`
/// reads `CUDNN_SAFE_AUTOTUNE_CACHE`, and `without_cache_file` keeps what it loaded).
fn fresh_tuner(policy: Policy) -> Autotuner {
    let mut t = Autotuner::new(policy).without_cache_file();
    t.clear();
    t
}

// ---------------------------------------------------------------------------------------------
// Host cost
// ---------------------------------------------------------------------------------------------

/// Per-call host cost of a tiny convolution: the checked call, the raw C call, and the
/// autotuner with a fixed algorithm and with a cached benchmark decision.
fn host_cost(c: &mut Criterion, args: &Args, cudnn: &Cudnn, fwd: ConvForwardFn) -> BoxResult<()> {
    const GROUP: &str = "conv_host_cost";
    const NAMES: [&str; 4] = ["safe", "raw_c", "tuner_fixed", "tuner_benchmark"];
    const ALGO: ConvFwdAlgo = ConvFwdAlgo::ImplicitGemm;
    if !args.runs_any(GROUP, &NAMES) {
        list_only(c, GROUP, &NAMES);
        return Ok(());
    }
    let stream: &CudaStream = cudnn.stream();
    // Default math, as the reference harness (which sets no math type).
    let cfg = Cfg::new(1, 8, 4, 4, 8, 3, 1);
    let mut p = Problem::<f32>::new(cudnn, &cfg, MathType::Default, false)?;
    let mut ws = Workspace::new(cudnn.stream().clone());
    let mut fixed = fresh_tuner(Policy::Fixed(FixedAlgos {
        forward: ALGO,
        ..FixedAlgos::default()
    }));
    let mut bench = fresh_tuner(Policy::Benchmark);
    // The reference passes no workspace; IMPLICIT_GEMM needs none, but follow what cuDNN asks.
    let mut raw_ws = raw_workspace(
        cudnn,
        cudnn.conv_forward_workspace_size(&p.x_d, &p.w_d, &p.conv, &p.y_d, ALGO)?,
    )?;
    // Every path once, and the benchmark decision made before anything is measured.
    p.safe(cudnn, ALGO, &mut ws)?;
    p.tuned(cudnn, &mut fixed)?;
    let bench_algo = p.tuned(cudnn, &mut bench)?.algo;
    drop(RawFwd::bind(fwd, cudnn, &mut p, ALGO, raw_ws.as_mut())?);
    stream.synchronize()?;

    let mut g = c.benchmark_group(GROUP);
    g.bench_function("safe", |b| {
        b.iter_custom(|iters| {
            enqueue_loop(stream, iters, SYNC_EVERY, || {
                p.safe(cudnn, ALGO, &mut ws).unwrap()
            })
        })
    });
    g.bench_function("raw_c", |b| {
        let raw = RawFwd::bind(fwd, cudnn, &mut p, ALGO, raw_ws.as_mut()).unwrap();
        b.iter_custom(|iters| {
            enqueue_loop(stream, iters, SYNC_EVERY, || {
                // SAFETY: `raw` was bound by the checked `bind`; the checked calls above made
                // the handle's context current on this thread, and nothing changes it.
                check(unsafe { raw.enqueue() })
            })
        })
    });
    g.bench_function("tuner_fixed", |b| {
        b.iter_custom(|iters| {
            enqueue_loop(stream, iters, SYNC_EVERY, || {
                p.tuned(cudnn, &mut fixed).unwrap();
            })
        })
    });
    g.bench_function("tuner_benchmark", |b| {
        b.iter_custom(|iters| {
            enqueue_loop(stream, iters, SYNC_EVERY, || {
                p.tuned(cudnn, &mut bench).unwrap();
            })
        })
    });
    g.finish();

    // The same four paths timed plainly, best of two rounds, so the ratios do not depend on
    // how much criterion output survives.
    let n = if args.test { 200 } else { RATIO_CALLS };
    let mut best = [f64::INFINITY; 4];
    for _ in 0..2 {
        {
            let raw = RawFwd::bind(fwd, cudnn, &mut p, ALGO, raw_ws.as_mut())?;
            let us = per_call_us(stream, n, SYNC_EVERY, || {
                // SAFETY: as in the `raw_c` benchmark: bound by `bind`, context current.
                check(unsafe { raw.enqueue() })
            });
            best[0] = best[0].min(us);
        }
        let us = per_call_us(stream, n, SYNC_EVERY, || {
            p.safe(cudnn, ALGO, &mut ws).unwrap()
        });
        best[1] = best[1].min(us);
        let us = per_call_us(stream, n, SYNC_EVERY, || {
            p.tuned(cudnn, &mut fixed).unwrap();
        });
        best[2] = best[2].min(us);
        let us = per_call_us(stream, n, SYNC_EVERY, || {
            p.tuned(cudnn, &mut bench).unwrap();
        });
        best[3] = best[3].min(us);
    }
    let [raw, safe, tf, tb] = best;
    println!(
        "host-cost-ratio conv_forward 1x8x4x4 w8x8x3x3 {ALGO}: raw C {raw:.2} us/call, \
         safe {safe:.2} us/call (safe/raw = {:.3}), tuner fixed {tf:.2} us/call \
         (tuner/raw = {:.3}), tuner benchmark {tb:.2} us/call [{bench_algo}] \
         (tuner-benchmark/raw = {:.3}); {n} calls each, sync every {SYNC_EVERY}, best of 2",
        safe / raw,
        tf / raw,
        tb / raw,
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Forward by policy
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Heuristic,
    Benchmark,
    Deterministic,
    RawBest,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::Heuristic,
        Variant::Benchmark,
        Variant::Deterministic,
        Variant::RawBest,
    ];
    fn name(self) -> &'static str {
        match self {
            Variant::Heuristic => "heuristic",
            Variant::Benchmark => "benchmark",
            Variant::Deterministic => "deterministic",
            Variant::RawBest => "raw_best",
        }
    }
}

/// A data type, layout and math mode.
struct Mode {
    name: &'static str,
    math: MathType,
    nhwc: bool,
}

/// One variant of a configuration: its tuner (none for the raw C reference), the algorithm
/// it runs (or why it cannot), and its CUDA-event time.
struct Arm {
    variant: Variant,
    tuner: Option<Autotuner>,
    algo: Result<ConvFwdAlgo, String>,
    ms: Result<f64, String>,
}

/// One CUDA-event batch of `calls` calls of `arm` (see [`batch_ms`]).
fn arm_batch<T: DataType<Scalar = f32>>(
    cudnn: &Cudnn,
    fwd: ConvForwardFn,
    p: &mut Problem<T>,
    arm: &mut Arm,
    raw_ws: Option<&mut CudaSlice<u8>>,
    calls: usize,
) -> BoxResult<f64> {
    let algo = arm.algo.clone()?;
    let stream: &CudaStream = cudnn.stream();
    match arm.tuner.as_mut() {
        Some(tuner) => batch_ms(stream, calls, || {
            p.tuned(cudnn, tuner)?;
            Ok(())
        }),
        None => {
            let raw = RawFwd::bind(fwd, cudnn, p, algo, raw_ws)?;
            batch_ms(stream, calls, || {
                // SAFETY: `raw` was bound by the checked `bind`; the checked calls made before
                // it made the handle's context current on this thread, and nothing changes it.
                match unsafe { raw.enqueue() } {
                    s if s.0 == 0 => Ok(()),
                    s => Err(format!("cudnnConvolutionForward returned status {}", s.0).into()),
                }
            })
        }
    }
}

fn policy_config<T: DataType<Scalar = f32>>(
    c: &mut Criterion,
    args: &Args,
    cudnn: &Cudnn,
    fwd: ConvForwardFn,
    mode: &Mode,
    cfg: &Cfg,
    in_criterion: &[Variant],
) {
    let group = format!("forward_policy/{}/{}", mode.name, cfg.name());
    let names: Vec<&str> = in_criterion.iter().map(|v| v.name()).collect();
    if !args.runs_any(&group, &names) {
        list_only(c, &group, &names);
        return;
    }
    let label = format!("{} {}", cfg.name(), mode.name);
    let stream: &CudaStream = cudnn.stream();
    let mut p = match Problem::<T>::new(cudnn, cfg, mode.math, mode.nhwc) {
        Ok(p) => p,
        Err(e) => {
            println!("policy-vs-raw {label}: skipped: {e}");
            return;
        }
    };

    // Decisions first: each tuner's first call decides (a benchmark runs `find`), and the raw
    // reference takes the algorithm `conv_forward_find` ranks first.
    let mut arms: Vec<Arm> = [Policy::Heuristic, Policy::Benchmark, Policy::Deterministic]
        .into_iter()
        .zip(Variant::ALL)
        .map(|(policy, variant)| {
            let mut tuner = fresh_tuner(policy);
            let algo = p
                .tuned(cudnn, &mut tuner)
                .map(|ch| ch.algo)
                .map_err(|e| e.to_string());
            Arm {
                variant,
                tuner: Some(tuner),
                algo,
                ms: Err("not run".into()),
            }
        })
        .collect();
    let mut raw_ws: Option<CudaSlice<u8>> = None;
    let raw_algo = (|| -> BoxResult<ConvFwdAlgo> {
        let mut ws = Workspace::new(cudnn.stream().clone());
        let perf = cudnn.conv_forward_find(
            &p.x_d, &p.x, &p.w_d, &p.w, &p.conv, &p.y_d, &mut p.y, &mut ws,
        )?;
        drop(ws);
        let best = perf
            .iter()
            .find(|a| a.is_supported())
            .ok_or("conv_forward_find: no supported algorithm")?;
        let bytes = cudnn
            .conv_forward_workspace_size(&p.x_d, &p.w_d, &p.conv, &p.y_d, best.algo)?
            .max(best.workspace);
        raw_ws = raw_workspace(cudnn, bytes)?;
        Ok(best.algo)
    })()
    .map_err(|e| e.to_string());
    arms.push(Arm {
        variant: Variant::RawBest,
        tuner: None,
        algo: raw_algo,
        ms: Err("not run".into()),
    });
    if let Err(e) = stream.synchronize() {
        println!("policy-vs-raw {label}: skipped: {e}");
        return;
    }

    // Device time per call of every variant from CUDA events: one warm-up batch of one call,
    // then `batches` batches of `calls`, the variants taking turns so that clock drift does
    // not favour one of them; the median batch counts.
    let (batches, calls) = if args.test { (1, 1) } else { (BATCHES, CALLS) };
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    for round in 0..=batches {
        for (arm, samples) in arms.iter_mut().zip(&mut samples) {
            if round > 0 && samples.is_empty() {
                continue; // failed in warm-up
            }
            let n = if round == 0 { 1 } else { calls };
            match arm_batch(cudnn, fwd, &mut p, arm, raw_ws.as_mut(), n) {
                Ok(ms) if round > 0 => samples.push(ms),
                Ok(_) => samples.push(f64::NAN), // warm-up marker, dropped below
                Err(e) => {
                    arm.ms = Err(e.to_string());
                    samples.clear();
                }
            }
        }
    }
    for (arm, samples) in arms.iter_mut().zip(&mut samples) {
        samples.retain(|v| !v.is_nan());
        samples.sort_by(f64::total_cmp);
        if let Some(&median) = samples.get(samples.len() / 2) {
            arm.ms = Ok(median);
        }
    }
    let part = |arm: &Arm| match (&arm.ms, &arm.algo) {
        (Ok(ms), Ok(algo)) => format!("{ms:.4} ms ({algo})"),
        (Err(e), _) => format!("n/a ({e})"),
        (Ok(_), Err(e)) => format!("n/a ({e})"),
    };
    let ratio = match (&arms[1].ms, &arms[3].ms) {
        (Ok(b), Ok(r)) => format!("{:.3}", b / r),
        _ => "n/a".into(),
    };
    println!(
        "policy-vs-raw {label}: heuristic {}, benchmark {}, deterministic {}, raw-best {}, \
         benchmark/raw = {ratio}",
        part(&arms[0]),
        part(&arms[1]),
        part(&arms[2]),
        part(&arms[3]),
    );

    let slowest = arms
        .iter()
        .filter_map(|a| a.ms.as_ref().ok().copied())
        .fold(0.0, f64::max);
    let mut g = c.benchmark_group(&group);
    g.throughput(Throughput::Elements(p.flops));
    g.sample_size(sample_size(slowest));
    for arm in arms
        .iter_mut()
        .filter(|a| in_criterion.contains(&a.variant))
    {
        let Ok(algo) = arm.algo else { continue };
        match arm.tuner.as_mut() {
            Some(tuner) => g.bench_function(arm.variant.name(), |b| {
                b.iter(|| {
                    p.tuned(cudnn, tuner).unwrap();
                    stream.synchronize().unwrap();
                })
            }),
            None => g.bench_function(arm.variant.name(), |b| {
                let raw = RawFwd::bind(fwd, cudnn, &mut p, algo, raw_ws.as_mut()).unwrap();
                b.iter(|| {
                    // SAFETY: `raw` was bound by the checked `bind`; the checked calls above
                    // made the handle's context current on this thread, and nothing changes it.
                    check(unsafe { raw.enqueue() });
                    stream.synchronize().unwrap();
                })
            }),
        };
    }
    g.finish();
}

/// The fp16 variants run under criterion, from `CONV_BENCH_FP16` (`None`: skip fp16).
fn fp16_variants() -> Option<&'static [Variant]> {
    const DEFAULT: &[Variant] = &[Variant::Benchmark, Variant::RawBest];
    match std::env::var("CONV_BENCH_FP16").as_deref() {
        Err(_) | Ok("") | Ok("1") | Ok("on") | Ok("yes") | Ok("true") => Some(DEFAULT),
        Ok("all") => Some(&Variant::ALL),
        Ok("0") | Ok("off") | Ok("no") | Ok("false") => None,
        Ok(other) => {
            eprintln!("CONV_BENCH_FP16={other:?} not understood (0, 1 or all); using 1");
            Some(DEFAULT)
        }
    }
}

fn forward_policy(c: &mut Criterion, args: &Args, cudnn: &Cudnn, fwd: ConvForwardFn) {
    let fp32 = Mode {
        name: "fp32",
        math: MathType::Fma,
        nhwc: false,
    };
    for cfg in &CONFIGS {
        policy_config::<f32>(c, args, cudnn, fwd, &fp32, cfg, &Variant::ALL);
    }
    if let Some(variants) = fp16_variants() {
        let fp16 = Mode {
            name: "fp16",
            math: MathType::TensorOp,
            nhwc: true,
        };
        for cfg in &CONFIGS {
            policy_config::<f16>(c, args, cudnn, fwd, &fp16, cfg, variants);
        }
    }
}

fn main() {
    let _ = env_logger::try_init();
    let Some((_stream, cudnn)) = setup_or_skip() else {
        return;
    };
    let fwd: ConvForwardFn =
        match sys::library().and_then(|lib| sys::sym!(lib, cudnnConvolutionForward)) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("cudnnConvolutionForward not available: {e}");
                std::process::exit(1);
            }
        };
    let args = Args::parse();
    let mut c = Criterion::default().configure_from_args();
    if let Err(e) = host_cost(&mut c, &args, &cudnn, fwd) {
        println!("host-cost-ratio: skipped: {e}");
    }
    forward_policy(&mut c, &args, &cudnn, fwd);
    c.final_summary();
    common::print_libraries();
}
