//! Graph (backend) API benchmarks: what [`cudnn_safe::graph`] costs and gains against the legacy
//! convolution calls in the same process.
//!
//! * **Convolution forward** on the seven reference configurations of `benches/conv.rs` (padding
//!   `r / 2`), per mode: `fp16` (f16 NHWC), `bf16` (bf16 NHWC), `tf32` (f32 NCHW, tensor cores
//!   allowed: PyTorch's `allow_tf32 = True`) and `fp32` (f32 NCHW, strict: the graph through
//!   [`PlanFilter::with_no_tensor_cores`], the legacy call with [`MathType::Fma`]); `tf32_nhwc` and
//!   `fp32_nhwc` on request. The graph side asks heuristics A then fallback for up to
//!   [`MAX_PLANS`] plans, [`autotune`]s them and times the winner; the legacy side takes the
//!   algorithm [`Cudnn::conv_forward_find`] ranks first (the math type PyTorch sets for the mode)
//!   and times the checked [`Cudnn::conv_forward`]. JSON ops
//!   `graph_conv_fwd_<mode>_<n>x<c>x<h>x<w>_k<k>_r<r>_s<s>` (with the engine configuration, plan
//!   count, build and autotune times) and `legacy_conv_fwd_…` (with the algorithm, the graph's
//!   time and `legacy_over_graph`), so they line up with PyTorch's `benchmark_tf32=True` numbers
//!   of `shared/gpu/reference/torch_baseline.py`. Both write separate outputs from the same
//!   inputs; the legacy line carries their largest difference relative to the largest output
//!   (`max_diff_rel`), a guard against comparing different computations.
//! * **Host cost** of the tiny convolution of `benches/conv.rs` (x `[1,8,4,4]` f32 NCHW, w
//!   `[8,8,3,3]`, pad 1), µs per call enqueued back to back with a synchronize every 1000 calls
//!   ([`per_call_us`], best of two rounds of 20000): `host_graph_execute_…` (a plan built once,
//!   the first of heuristic A as `shared/gpu/reference/graphconv.cu` takes it, [`Args`] bound
//!   once: the variant pack is reused), `host_graph_args_per_call_…` ([`Args`] bound afresh every
//!   call: same pointers, so the pack is still reused, but every binding takes cudarc's guards),
//!   `host_graph_cache_get_…` (a [`PlanCache::get`] lookup before every execution) and
//!   `host_legacy_conv_fwd_…` (the checked [`Cudnn::conv_forward`], `IMPLICIT_GEMM`). Targets
//!   from the raw C anchors: plan execution 6.9 µs, legacy call 25 µs, PyTorch 32.7 µs.
//! * **CUDA graph launch** of the same tiny convolution (f32 NCHW, else f16 NHWC: the first
//!   with an engine carrying the native CUDA-graph behaviour note, taken from the heuristics
//!   then every engine): `host_cudagraph_execute_…` ([`Cudnn::execute`], [`Args`] bound once)
//!   vs `host_cudagraph_launch_…` ([`PlanGraph::launch`] of the graph
//!   [`Cudnn::populate_cuda_graph`] built from the same plan), µs per call as above; the
//!   launch line carries `execute_over_launch`. Without such an engine it prints why and
//!   records nothing.
//! * **Fused conv + bias + ReLU**, f16 NHWC `32×64×56×56 → 64`, 3×3, pad 1: one graph (autotuned)
//!   vs the legacy unfused sequence (`conv_forward` with the `find` winner, `add_tensor`,
//!   in-place ReLU) vs the legacy fused `conv_bias_activation_forward` (every algorithm cuDNN
//!   accepts timed, the fastest kept), on the same inputs. Each legacy line carries its output's
//!   `max_diff_rel` against the graph's.
//! * **Layer norm** f32 `32768×1024` (`benches/pytorch/nn_ops.py`'s `layernorm_fp32_32768x1024`)
//!   through autotuned one-operation graphs: `graph_layernorm_fp32_32768x1024_fwd` (training
//!   phase: y, mean and inverse standard deviation), `…_fwd_inference` and `…_bwd` (dx, dscale,
//!   dbias), with `TB/s` from 2·N·D·4 bytes forward (as PyTorch's script) and 3·N·D·4 backward.
//!
//! * **Union autotune** (ops `union_conv_fwd_<mode>_<cfg>`, same modes and configurations as the
//!   convolution lines): the steady-state call of [`Autotuner::forward`] under
//!   [`Policy::Benchmark`], which times legacy algorithms and graph engines together and runs the
//!   faster; each line says what ran (`"source": "legacy ALGO"` or `"graph engN…"`), and a
//!   `union_conv_fwd_<mode>_geomean` line per mode gives the geometric mean, the number of graph
//!   wins and the ratio to the better of the graph and legacy lines of the same run. Under
//!   `cargo test --benches` only the tiny configuration runs.
//! * **Union autotune, backward** (ops `union_conv_bwd_<mode>_<cfg>`, same modes and
//!   configurations): one training step's backward, [`Autotuner::backward_data`] (dx from a
//!   standard-normal dy and w) then [`Autotuner::backward_filter`] (dw from x and dy), alpha 1,
//!   beta 0, both decided by one tuner set up as the forward union's (strict fp32 through the
//!   same [`MathType::Fma`] descriptor, so neither search takes tensor cores). The first step
//!   searches; `ms` is the steady-state step, `dx_ms` and `dw_ms` each direction alone, and
//!   `source_dx` / `source_dw` say what ran; a `union_conv_bwd_<mode>_geomean` line per mode
//!   gives the geometric mean and the graph wins per direction. PyTorch's counterpart:
//!   `benches/pytorch/conv.py --backward`. Under `cargo test --benches` only the tiny
//!   configuration runs.
//! * **Paired comparison with PyTorch** (with `GRAPH_BENCH_PYTORCH` set; ops
//!   `paired_conv_fwd_<mode>_<cfg>` and `…_geomean`): the union cases stay alive, several
//!   PyTorch processes (`benches/pytorch/conv.py --serve`) run their benchmark-mode search on the
//!   same cases, then rounds of timing alternate between the two sides case by case, so both
//!   are timed in the same thermal state (see [`paired`]). The convolution inputs follow
//!   PyTorch's script: standard-normal `x`, weights uniform within ±1/√fan_in.
//!
//! Device times are CUDA-event medians ([`median_ms`]: 5 batches of about 25 ms after a warm-up
//! call). Each measurement prints one JSON line (`{"op": …, "ms": …, "impl": "cudnn-safe", …}`);
//! the run ends with a comparison table of the convolutions (geometric mean of legacy/graph per
//! mode) and the table of every line. Criterion measures the same calls under ids `graph/<op>`
//! (CUDA events through `iter_custom`; wall clock for the host-cost loops).
//!
//! Environment:
//! * `GRAPH_BENCH_MODES`: comma-separated modes measured (default `fp16,bf16,tf32,fp32`; `all`
//!   adds `tf32_nhwc,fp32_nhwc`).
//! * `GRAPH_BENCH_CRITERION`: the modes whose convolutions criterion also measures (default
//!   `fp16`; `all`, `none` or a list) — the JSON lines cover every measured mode either way.
//! * `GRAPH_BENCH_PYTORCH`: the command starting a PyTorch worker, without `--serve` (for
//!   example `env -u LD_LIBRARY_PATH python3 benches/pytorch/conv.py`, run through `sh -c`);
//!   unset, no paired comparison. `GRAPH_BENCH_PYTORCH_RUNS` (default 3) PyTorch processes,
//!   `GRAPH_BENCH_ROUNDS` (default 3) rounds.
//! * `GRAPH_BENCH_PAIRED_PLANS` (default 0): with the paired comparison, also time that many
//!   of each case's fastest graph plans (a short first pass over heuristics A, B and fallback)
//!   in the same rounds, as further sides (ops `paired_plan_conv_fwd_<mode>_<cfg>`, one line
//!   per plan, and a table); the union's own pick among them, timed twice, shows the noise.
//!   `GRAPH_BENCH_PAIRED_EXTRA`: engine configurations to time that way, as
//!   `<mode>_<cfg>=<config>` items separated by `;` (such as
//!   `fp16_16x256x28x28_k512_r3_s1=eng62_k2=0_k13=1_k18=0_k25=0_k27=1_k28=1`).
//!   `GRAPH_BENCH_PAIRED_SELF=1`: also time every graph pick once more as a further side, so
//!   that each case reports the comparison's own noise (ops `paired_noise_conv_fwd_<mode>_<cfg>`
//!   and a table: the pick against itself, and PyTorch's slowest process over its fastest) and
//!   a verdict: `behind` only when the by-round ratio is below 1 by more than that same-plan
//!   noise, `ahead` when above 1 by more, `tie` otherwise; `paired_noise_conv_fwd_verdicts`
//!   lists the cases behind.
//!   `GRAPH_BENCH_PAIRED_CUDA_GRAPHS=1`: both sides also timed with their call captured in a
//!   CUDA graph, as two more sides of the same rounds (ours through [`Cudnn::capture`], each
//!   PyTorch process through `torch.cuda.CUDAGraph`), so the host's cost per call drops out
//!   (ops `paired_graph_conv_fwd_<mode>_<cfg>` and `…_geomean`, with the eager by-round ratio
//!   of the same rounds beside, and a table). The bench runs on the per-thread default stream
//!   for this: CUDA cannot capture the legacy default stream.
//! * `GRAPH_BENCH_EFFORT=both`: each union case is also searched by a second tuner with
//!   [`SearchEffort::Quick`] on its own copy of the data (the default `Thorough` one keeps
//!   heuristics B on, as above); the two picks are then timed in turns, 3 rounds each (ops
//!   `union_quick_conv_fwd_<mode>_<cfg>`: the quick pick's median, both searches' wall time, the
//!   ratio thorough/quick and the noise, the larger spread of either pick's own rounds).
//! * `GRAPH_BENCH_FINALISTS`, `GRAPH_BENCH_FINAL_SOLO_MS`: the union tuner's
//!   [`Autotuner::with_finalists`] and [`Autotuner::with_final_solo_ms`] (defaults 6 and 25 ms).
//! * `GRAPH_BENCH_CONFIGS`: comma-separated parts of configuration names (such as
//!   `16x256,32x256`); the convolution and union lines then cover only the configurations whose
//!   name contains one of them (default: all seven).
//!
//! With `--warm-up-time 1 --measurement-time 2` the default run is 21 criterion benchmarks plus
//! 28 autotuned convolution cases; building plans may compile kernels at run time (up to about a
//! second per configuration the first time), which is why progress goes to stderr. Under
//! `cargo test --benches` every measurement is one call and autotuning tries 2 plans.
//!
//! A filter argument selects benchmarks as criterion does; cases are only set up when the
//! filter can select one of their ops, and `--list` sets up nothing. Without a GPU (no driver,
//! no device, no cuDNN) it prints `no GPU: <why>` and exits cleanly.
mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use common::{
    batch_ms, enqueue_loop, exit_on_error, list_only, median_ms, normal_values, per_call_us,
    print_header, print_op_error, print_op_line, print_summary, sample_size,
    setup_per_thread_or_skip, tflops, timed_iters, values, Args, BoxResult, Summary,
};
use criterion::{Criterion, Throughput};
use cudnn_safe::conv::{
    ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvFwdAlgo, FusedActivation,
    MathType,
};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{
    autotune, Args as Bindings, ConvParams, Graph, HeurMode, OperationGraph, Plan, PlanCache,
    PlanFilter, PlanGraph, PointwiseMode, TensorId,
};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::tune::{Choice, Policy, SearchEffort};
use cudnn_safe::{
    ActivationDesc, ActivationMode, Autotuner, Cudnn, DType, DataType, FilterDesc, Layout,
    TensorDesc, TensorFormat, Workspace,
};

/// Criterion group of every benchmark here.
const GROUP: &str = "graph";
/// Plans built and autotuned per convolution case (heuristics A then fallback, in their order).
const MAX_PLANS: usize = 12;
/// Calls enqueued between two synchronizes in the host-cost loops (as `benches/conv.rs`).
const SYNC_EVERY: u64 = 1000;
/// Calls per host-cost measurement round.
const HOST_CALLS: u64 = 20_000;

// ---------------------------------------------------------------------------------------------
// Configurations and modes
// ---------------------------------------------------------------------------------------------

/// A 2-D convolution `N,C,H,W -> K` with an `R x R` kernel, stride `S` and padding `R / 2`.
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

    /// `32x64x56x56_k128_r3_s1`.
    fn name(&self) -> String {
        format!(
            "{}x{}x{}x{}_k{}_r{}_s{}",
            self.n, self.c, self.h, self.w, self.k, self.r, self.s
        )
    }

    fn x_dims(&self) -> [i64; 4] {
        [self.n, self.c, self.h, self.w]
    }

    fn w_dims(&self) -> [i64; 4] {
        [self.k, self.c, self.r, self.r]
    }

    fn params(&self) -> ConvParams {
        ConvParams::new(2)
            .with_padding(&[self.r / 2, self.r / 2])
            .with_strides(&[self.s, self.s])
    }

    fn legacy_desc<T: DataType>(&self, math: MathType) -> cudnn_safe::Result<ConvDesc> {
        ConvDesc::builder(2)
            .pads(&[self.r / 2, self.r / 2])
            .strides(&[self.s, self.s])
            .math(math)
            .build::<T>()
    }
}

/// The seven reference configurations (`benches/conv.rs`, `tools/src/conv_explorer.rs`,
/// `shared/gpu/reference/torch_baseline.py`).
const CONFIGS: [Cfg; 7] = [
    Cfg::new(32, 64, 56, 56, 128, 3, 1),
    Cfg::new(16, 256, 28, 28, 512, 3, 1),
    Cfg::new(1, 3, 224, 224, 64, 7, 2),
    Cfg::new(8, 512, 14, 14, 1024, 3, 2),
    Cfg::new(32, 256, 56, 56, 256, 3, 1),
    Cfg::new(64, 64, 56, 56, 64, 1, 1),
    Cfg::new(32, 128, 28, 28, 128, 5, 1),
];

/// The tiny convolution of the host-cost measurements (`benches/conv.rs`'s).
const TINY: Cfg = Cfg::new(1, 8, 4, 4, 8, 3, 1);
/// The fused conv + bias + ReLU case.
const FUSED: Cfg = Cfg::new(32, 64, 56, 56, 64, 3, 1);

/// A data type, layout and math mode of the convolution comparison.
#[derive(Debug, Clone, Copy)]
struct Mode {
    /// The name in ops (`fp16`, `tf32_nhwc`, ...).
    name: &'static str,
    dtype: DType,
    nhwc: bool,
    /// No tensor cores: [`PlanFilter::with_no_tensor_cores`] and [`MathType::Fma`].
    strict: bool,
    /// The legacy convolution's math type (PyTorch's choice for the mode).
    math: MathType,
}

impl Mode {
    /// Every mode, in the order they run.
    const ALL: [Mode; 6] = [
        Mode {
            name: "fp16",
            dtype: DType::F16,
            nhwc: true,
            strict: false,
            math: MathType::TensorOp,
        },
        Mode {
            name: "bf16",
            dtype: DType::BF16,
            nhwc: true,
            strict: false,
            math: MathType::TensorOp,
        },
        Mode {
            name: "tf32",
            dtype: DType::F32,
            nhwc: false,
            strict: false,
            math: MathType::Default,
        },
        Mode {
            name: "fp32",
            dtype: DType::F32,
            nhwc: false,
            strict: true,
            math: MathType::Fma,
        },
        Mode {
            name: "tf32_nhwc",
            dtype: DType::F32,
            nhwc: true,
            strict: false,
            math: MathType::Default,
        },
        Mode {
            name: "fp32_nhwc",
            dtype: DType::F32,
            nhwc: true,
            strict: true,
            math: MathType::Fma,
        },
    ];
    /// Measured unless `GRAPH_BENCH_MODES` says otherwise.
    const DEFAULT: &'static str = "fp16,bf16,tf32,fp32";

    fn filter(&self) -> PlanFilter {
        PlanFilter::new().with_no_tensor_cores(self.strict)
    }
}

/// The modes named by the environment variable `var` (`all`, `none`, or a comma-separated list;
/// `default` when unset or empty). An unknown name is reported and ignored.
fn modes_from_env(var: &str, default: &str) -> Vec<Mode> {
    let value = std::env::var(var).unwrap_or_default();
    let value = match value.trim() {
        "" => default.to_string(),
        "all" => return Mode::ALL.to_vec(),
        "none" | "0" => return Vec::new(),
        v => v.to_string(),
    };
    let mut out = Vec::new();
    for name in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match Mode::ALL.iter().find(|m| m.name == name) {
            Some(m) => out.push(*m),
            None => eprintln!(
                "{var}: unknown mode {name:?} (known: {})",
                Mode::ALL.map(|m| m.name).join(", ")
            ),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Shared state and output
// ---------------------------------------------------------------------------------------------

/// What every measurement needs: criterion, the command line, the handle, and the lines printed
/// so far (for the closing table).
struct Run<'a> {
    c: &'a mut Criterion,
    args: &'a Args,
    cudnn: &'a Cudnn,
    stream: &'a Arc<CudaStream>,
    summary: Vec<Summary>,
}

impl Run<'_> {
    /// Prints the JSON line of a measured operation and keeps it for the closing table.
    fn record(&mut self, op: &str, ms: f64, note: &str) {
        print_op_line(op, ms, None, (!note.is_empty()).then_some(note));
        self.summary.push(Summary {
            op: op.to_string(),
            ms,
            bytes: None,
        });
    }

    /// [`Run::record`] with the bytes one call reads and writes (the line gets a `TB/s`).
    fn record_bytes(&mut self, op: &str, ms: f64, bytes: f64, note: &str) {
        print_op_line(op, ms, Some(bytes), (!note.is_empty()).then_some(note));
        self.summary.push(Summary {
            op: op.to_string(),
            ms,
            bytes: Some(bytes),
        });
    }

    /// Criterion's measurement of `call` (device time from CUDA events) as `graph/<op>`.
    fn criterion_device(
        &mut self,
        op: &str,
        ms: f64,
        flops: Option<u64>,
        mut call: impl FnMut() -> BoxResult<()>,
    ) {
        let stream: &CudaStream = self.stream;
        let mut g = self.c.benchmark_group(GROUP);
        g.sample_size(sample_size(ms));
        if let Some(f) = flops {
            g.throughput(Throughput::Elements(f));
        }
        g.bench_function(op, |b| {
            b.iter_custom(|iters| timed_iters(stream, iters, &mut call))
        });
        g.finish();
    }
}

/// Registers `ops` for `--list` and filters without preparing anything (see [`list_only`]).
fn list_ops(c: &mut Criterion, ops: &[String]) {
    let names: Vec<&str> = ops.iter().map(String::as_str).collect();
    list_only(c, GROUP, &names);
}

/// The largest `|a − b|` divided by the largest `|b|`, after waiting for the stream: how far two
/// computations of the same output differ. Non-finite values give NaN.
fn max_diff_rel<T: DataType>(
    stream: &Arc<CudaStream>,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
) -> BoxResult<f64> {
    stream.synchronize()?;
    let (a, b) = (stream.clone_dtoh(a)?, stream.clone_dtoh(b)?);
    let (mut diff, mut scale) = (0.0f64, 0.0f64);
    for (&p, &q) in a.iter().zip(&b) {
        let (p, q) = (p.to_f64(), q.to_f64());
        if !(p.is_finite() && q.is_finite()) {
            return Ok(f64::NAN);
        }
        diff = diff.max((p - q).abs());
        scale = scale.max(q.abs());
    }
    Ok(diff / scale.max(f64::MIN_POSITIVE))
}

/// Whether a graph tensor's layout addresses memory as a legacy descriptor's does (same
/// dimensions and strides; the graph's layouts are all "strided", whatever their order).
fn same_layout(graph: Option<&Layout>, legacy: &Layout) -> bool {
    graph.is_some_and(|g| g.dims() == legacy.dims() && g.strides() == legacy.strides())
}

/// The largest [`max_diff_rel`] expected between two correct computations: different
/// algorithms round differently (Winograd, FFT, split reductions), and TF32 or half precision
/// round each product; above it a warning goes to stderr.
fn expected_diff(dtype: DType, strict: bool) -> f64 {
    match dtype {
        DType::F32 if strict => 1e-4,
        DType::BF16 => 5e-2,
        _ => 1e-2,
    }
}

/// Warns on stderr when `op`'s output differs from the graph's by more than `tol`.
fn warn_diff(op: &str, d: &BoxResult<f64>, tol: f64) {
    if let Ok(v) = d {
        if v.is_nan() || *v > tol {
            eprintln!(
                "graph bench: WARNING {op}: output differs from the graph's by {v:.3e} of the \
                 largest value (expected <= {tol:.0e})"
            );
        }
    }
}

/// The JSON fragment of a difference (`null` when it could not be computed).
fn diff_note(d: &BoxResult<f64>) -> String {
    match d {
        Ok(v) if v.is_finite() => format!("\"max_diff_rel\": {v:.3e}"),
        Ok(_) => "\"max_diff_rel\": \"non-finite output\"".into(),
        Err(e) => format!("\"max_diff_rel\": {:?}", format!("not computed: {e}")),
    }
}

/// Autotuning effort: a real run times every candidate 3 × 5 times; `cargo test` once.
fn autotune_options(test: bool) -> cudnn_safe::tune::plan::Policy {
    if test {
        cudnn_safe::tune::plan::Policy::new()
            .with_rounds(1)
            .with_iterations(1)
    } else {
        cudnn_safe::tune::plan::Policy::new()
    }
}

/// Plans to build and autotune per case (2 under `cargo test`).
fn max_plans(test: bool) -> usize {
    if test {
        2
    } else {
        MAX_PLANS
    }
}

/// A graph plan picked by [`autotune`], with what it took to get there.
struct Picked {
    plan: Plan,
    /// Plans built (heuristics A then fallback, up to [`max_plans`]), configurations skipped
    /// (filtered out or not finalizing) and plans that failed to execute while autotuning.
    built: usize,
    skipped: usize,
    failed: usize,
    build_s: f64,
    tune_s: f64,
    /// The winner's time in the autotune loop.
    tuned_ms: f32,
}

impl Picked {
    /// Builds the plans `filter` (capped at [`max_plans`]) yields for `og` and autotunes them on
    /// `bindings`.
    fn new(
        cudnn: &Cudnn,
        og: &OperationGraph,
        filter: PlanFilter,
        bindings: &Bindings<'_>,
        ws: &mut Workspace,
        test: bool,
    ) -> BoxResult<Picked> {
        let t = Instant::now();
        let list = og.plans(cudnn, &filter.with_max_plans(Some(max_plans(test))))?;
        let build_s = t.elapsed().as_secs_f64();
        let (built, skipped) = (list.plans.len(), list.skipped.len());
        let t = Instant::now();
        let tuned = autotune(cudnn, list.plans, bindings, ws, &autotune_options(test))?;
        let tune_s = t.elapsed().as_secs_f64();
        let tuned_ms = tuned.candidates.first().map_or(f32::NAN, |t| t.ms);
        Ok(Picked {
            failed: tuned.failed.len(),
            plan: tuned.plan,
            built,
            skipped,
            build_s,
            tune_s,
            tuned_ms,
        })
    }

    /// The JSON fragment describing the pick.
    fn note(&self) -> String {
        format!(
            "\"engine\": {:?}, \"workspace_bytes\": {}, \"plans\": {}, \"skipped\": {}, \
             \"failed\": {}, \"build_s\": {:.3}, \"autotune_s\": {:.3}, \"autotune_ms\": {:.5}",
            self.plan.name(),
            self.plan.workspace_size(),
            self.built,
            self.skipped,
            self.failed,
            self.build_s,
            self.tune_s,
            self.tuned_ms
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Convolution forward: graph (autotuned) vs legacy (find)
// ---------------------------------------------------------------------------------------------

/// One line of the closing comparison table: each side's time and pick, or why it has none.
struct Row {
    mode: &'static str,
    cfg: String,
    graph: Result<(f64, String), String>,
    legacy: Result<(f64, String), String>,
}

/// The legacy descriptors and the buffers both sides use (inputs shared, one output each).
struct ConvData<T: DataType> {
    x_d: TensorDesc<T>,
    w_d: FilterDesc<T>,
    conv: ConvDesc,
    y_d: TensorDesc<T>,
    og: OperationGraph,
    x: TensorId,
    w: TensorId,
    y: TensorId,
    xb: CudaSlice<T>,
    wb: CudaSlice<T>,
    y_graph: CudaSlice<T>,
    y_legacy: CudaSlice<T>,
    /// `2·N·K·P·Q·C·R·S`.
    flops: u64,
}

impl<T: DataType<Scalar = f32>> ConvData<T> {
    fn new(cudnn: &Cudnn, mode: &Mode, cfg: &Cfg) -> BoxResult<Self> {
        let stream = cudnn.stream();
        let [n, c, h, w] = cfg.x_dims();
        let (x_d, format) = if mode.nhwc {
            (TensorDesc::<T>::nhwc(n, c, h, w)?, TensorFormat::Nhwc)
        } else {
            (TensorDesc::<T>::nchw(n, c, h, w)?, TensorFormat::Nchw)
        };
        let w_d = FilterDesc::<T>::new(&cfg.w_dims(), format)?;
        let conv = cfg.legacy_desc::<T>(mode.math)?;
        let y_dims = conv.output_dims(x_d.dims(), w_d.dims())?;
        let y_d = if mode.nhwc {
            TensorDesc::<T>::nhwc_nd(&y_dims)?
        } else {
            TensorDesc::<T>::nchw_nd(&y_dims)?
        };

        let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
        let (x, w) = if mode.nhwc {
            (
                g.tensor_nhwc("x", &cfg.x_dims(), T::DTYPE)?,
                g.tensor_nhwc("w", &cfg.w_dims(), T::DTYPE)?,
            )
        } else {
            (
                g.tensor_nchw("x", &cfg.x_dims(), T::DTYPE)?,
                g.tensor_nchw("w", &cfg.w_dims(), T::DTYPE)?,
            )
        };
        let y = g.conv_fprop(x, w, &cfg.params())?;
        g.set_name(y, "y")?;
        g.mark_output(y)?;
        let og = g.build(cudnn)?;
        // Both sides read the same input buffers and their outputs are compared element by
        // element: the graph must lay every tensor out as the legacy descriptors do.
        for (name, graph, legacy) in [
            ("x", og.layout(x)?, x_d.layout()),
            ("w", og.layout(w)?, w_d.layout()),
            ("y", og.layout(y)?, y_d.layout()),
        ] {
            if !same_layout(graph, legacy) {
                return Err(format!(
                    "the graph lays `{name}` out as {graph:?}, the legacy descriptor as {legacy:?}"
                )
                .into());
            }
        }

        let flops = 2 * y_dims.iter().product::<i64>() * cfg.c * cfg.r * cfg.r;
        Ok(ConvData {
            // PyTorch's data in `benches/pytorch/conv.py`: `randn` inputs, `nn.Conv2d`'s own
            // weights (uniform within ±1/√fan_in).
            xb: stream.clone_htod(&normal_values::<T>(x_d.span()))?,
            wb: stream.clone_htod(&values::<T>(
                w_d.span(),
                1.0 / ((cfg.c * cfg.r * cfg.r) as f64).sqrt(),
            ))?,
            y_graph: stream.alloc_zeros::<T>(y_d.span())?,
            y_legacy: stream.alloc_zeros::<T>(y_d.span())?,
            x_d,
            w_d,
            conv,
            y_d,
            og,
            x,
            w,
            y,
            flops: flops as u64,
        })
    }
}

/// The graph side of a case: autotune, time the winner, print its line, criterion.
fn graph_conv<T: DataType<Scalar = f32>>(
    run: &mut Run,
    d: &mut ConvData<T>,
    mode: &Mode,
    op: &str,
    in_criterion: bool,
) -> BoxResult<(f64, String)> {
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let mut ws = Workspace::new(stream.clone());
    let mut b = Bindings::new(cudnn);
    b.input(d.x, &d.xb)?
        .input(d.w, &d.wb)?
        .output(d.y, &mut d.y_graph)?;
    let picked = Picked::new(cudnn, &d.og, mode.filter(), &b, &mut ws, test)?;
    let mut call = || -> BoxResult<()> {
        cudnn.execute(&picked.plan, &b, &mut ws)?;
        Ok(())
    };
    let ms = median_ms(stream, test, &mut call)?;
    run.record(
        op,
        ms,
        &format!(
            "\"TFLOP/s\": {:.1}, {}",
            tflops(d.flops as f64, ms),
            picked.note()
        ),
    );
    if in_criterion {
        run.criterion_device(op, ms, Some(d.flops), call);
    }
    Ok((ms, picked.plan.name()))
}

/// The legacy side of a case: the `find` winner, timed; its line carries the ratio to the graph
/// and the difference of the two outputs.
fn legacy_conv<T: DataType<Scalar = f32>>(
    run: &mut Run,
    d: &mut ConvData<T>,
    op: &str,
    graph: &Result<(f64, String), String>,
    tol: f64,
    in_criterion: bool,
) -> BoxResult<(f64, String)> {
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let mut ws = Workspace::new(stream.clone());
    let perf = cudnn.conv_forward_find(
        &d.x_d,
        &d.xb,
        &d.w_d,
        &d.wb,
        &d.conv,
        &d.y_d,
        &mut d.y_legacy,
        &mut ws,
    )?;
    let best = perf
        .iter()
        .find(|p| p.is_supported())
        .ok_or("conv_forward_find: no supported algorithm")?;
    let (algo, find_ms) = (best.algo, best.time_ms);
    let ConvData {
        x_d,
        w_d,
        conv,
        y_d,
        xb,
        wb,
        y_legacy,
        ..
    } = d;
    let mut call = |y: &mut CudaSlice<T>| -> BoxResult<()> {
        cudnn.conv_forward(1.0, x_d, &*xb, w_d, &*wb, conv, algo, &mut ws, 0.0, y_d, y)?;
        Ok(())
    };
    let ms = median_ms(stream, test, || call(y_legacy))?;
    let diff = match graph {
        Ok(_) => max_diff_rel(stream, y_legacy, &d.y_graph),
        Err(_) => Err("no graph output".into()),
    };
    warn_diff(op, &diff, tol);
    let ratio = match graph {
        Ok((g, _)) => format!("\"graph_ms\": {g:.5}, \"legacy_over_graph\": {:.3}", ms / g),
        Err(_) => "\"graph_ms\": null".into(),
    };
    run.record(
        op,
        ms,
        &format!(
            "\"TFLOP/s\": {:.1}, \"algo\": \"{algo}\", \"find_ms\": {find_ms:.5}, {ratio}, {}",
            tflops(d.flops as f64, ms),
            diff_note(&diff)
        ),
    );
    if in_criterion {
        run.criterion_device(op, ms, Some(d.flops), || call(y_legacy));
    }
    Ok((ms, algo.to_string()))
}

/// One configuration in one mode: the graph and the legacy side, each reporting its own error.
fn conv_case<T: DataType<Scalar = f32>>(
    run: &mut Run,
    mode: &Mode,
    cfg: &Cfg,
    in_criterion: bool,
    progress: &str,
) -> Option<Row> {
    let gop = format!("graph_conv_fwd_{}_{}", mode.name, cfg.name());
    let lop = format!("legacy_conv_fwd_{}_{}", mode.name, cfg.name());
    if !run.args.runs_any(GROUP, &[&gop, &lop]) {
        if in_criterion {
            list_ops(run.c, &[gop, lop]);
        }
        return None;
    }
    eprintln!("graph bench: {progress} {} {}", mode.name, cfg.name());
    let t = Instant::now();
    let mut d = match ConvData::<T>::new(run.cudnn, mode, cfg) {
        Ok(d) => d,
        Err(e) => {
            print_op_error(&gop, &e);
            print_op_error(&lop, &e);
            let e = e.to_string();
            return Some(Row {
                mode: mode.name,
                cfg: cfg.name(),
                graph: Err(e.clone()),
                legacy: Err(e),
            });
        }
    };
    let graph = graph_conv(run, &mut d, mode, &gop, in_criterion).map_err(|e| {
        print_op_error(&gop, &e);
        e.to_string()
    });
    let legacy = legacy_conv(
        run,
        &mut d,
        &lop,
        &graph,
        expected_diff(mode.dtype, mode.strict),
        in_criterion,
    )
    .map_err(|e| {
        print_op_error(&lop, &e);
        e.to_string()
    });
    eprintln!(
        "graph bench: {progress} done in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Some(Row {
        mode: mode.name,
        cfg: cfg.name(),
        graph,
        legacy,
    })
}

/// The configurations `GRAPH_BENCH_CONFIGS` selects from `all`: those whose name contains one of
/// its comma-separated parts (all of them when unset or empty).
fn configs_from_env(all: &[Cfg]) -> Vec<Cfg> {
    let parts: Vec<String> = std::env::var("GRAPH_BENCH_CONFIGS")
        .unwrap_or_default()
        .split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    let picked: Vec<Cfg> = all
        .iter()
        .filter(|c| parts.is_empty() || parts.iter().any(|p| c.name().contains(p.as_str())))
        .copied()
        .collect();
    if picked.is_empty() {
        eprintln!("graph bench: GRAPH_BENCH_CONFIGS={parts:?} selects no configuration");
    }
    picked
}

/// Every selected configuration in every measured mode.
fn conv_forward(run: &mut Run, rows: &mut Vec<Row>) {
    let modes = modes_from_env("GRAPH_BENCH_MODES", Mode::DEFAULT);
    let in_criterion = modes_from_env("GRAPH_BENCH_CRITERION", "fp16");
    let cfgs = configs_from_env(&CONFIGS);
    let total = modes.len() * cfgs.len();
    let mut i = 0;
    for mode in &modes {
        let crit = in_criterion.iter().any(|m| m.name == mode.name);
        for cfg in &cfgs {
            i += 1;
            let progress = format!("[{i}/{total}]");
            let row = match mode.dtype {
                DType::F16 => conv_case::<f16>(run, mode, cfg, crit, &progress),
                DType::BF16 => conv_case::<bf16>(run, mode, cfg, crit, &progress),
                _ => conv_case::<f32>(run, mode, cfg, crit, &progress),
            };
            rows.extend(row);
        }
    }
}

/// The comparison table and, per mode, the geometric mean of legacy/graph over the
/// configurations where both ran.
fn print_conv_table(rows: &[Row]) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\n{:<10} {:<26} {:>10} {:<28} {:>10} {:<22} {:>8}",
        "mode", "config", "graph ms", "graph engine", "legacy ms", "legacy algo", "leg/gr"
    );
    let cell = |side: &Result<(f64, String), String>| match side {
        Ok((ms, pick)) => (format!("{ms:.5}"), pick.clone()),
        Err(e) => ("n/a".to_string(), e.chars().take(60).collect()),
    };
    for r in rows {
        let (gms, gpick) = cell(&r.graph);
        let (lms, lpick) = cell(&r.legacy);
        let ratio = match (&r.graph, &r.legacy) {
            (Ok((g, _)), Ok((l, _))) => format!("{:.3}", l / g),
            _ => "-".into(),
        };
        println!(
            "{:<10} {:<26} {gms:>10} {gpick:<28} {lms:>10} {lpick:<22} {ratio:>8}",
            r.mode, r.cfg
        );
    }
    let mut seen: Vec<&str> = Vec::new();
    for r in rows {
        if seen.contains(&r.mode) {
            continue;
        }
        seen.push(r.mode);
        let logs: Vec<f64> = rows
            .iter()
            .filter(|q| q.mode == r.mode)
            .filter_map(|q| match (&q.graph, &q.legacy) {
                (Ok((g, _)), Ok((l, _))) => Some((l / g).ln()),
                _ => None,
            })
            .collect();
        if !logs.is_empty() {
            println!(
                "legacy/graph geomean {}: {:.3} over {} configurations",
                r.mode,
                (logs.iter().sum::<f64>() / logs.len() as f64).exp(),
                logs.len()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Host cost of a tiny convolution
// ---------------------------------------------------------------------------------------------

/// The paths whose per-call host cost is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostPath {
    /// A plan held, bindings made once.
    Execute,
    /// A plan held, bindings made at every call.
    ArgsPerCall,
    /// A [`PlanCache`] lookup at every call, bindings made once.
    CacheGet,
    /// The checked legacy [`Cudnn::conv_forward`].
    Legacy,
}

impl HostPath {
    const ALL: [HostPath; 4] = [
        HostPath::Execute,
        HostPath::ArgsPerCall,
        HostPath::CacheGet,
        HostPath::Legacy,
    ];

    fn op(self) -> String {
        let what = match self {
            HostPath::Execute => "graph_execute",
            HostPath::ArgsPerCall => "graph_args_per_call",
            HostPath::CacheGet => "graph_cache_get",
            HostPath::Legacy => "legacy_conv_fwd",
        };
        format!("host_{what}_f32_{}", TINY.name())
    }
}

/// The tiny convolution, f32 NCHW, for both APIs; the graph's plan lives in `cache`.
struct Tiny {
    og: OperationGraph,
    x: TensorId,
    w: TensorId,
    y: TensorId,
    filter: PlanFilter,
    cache: PlanCache,
    x_d: TensorDesc<f32>,
    w_d: FilterDesc<f32>,
    conv: ConvDesc,
    y_d: TensorDesc<f32>,
    xb: CudaSlice<f32>,
    wb: CudaSlice<f32>,
    y_graph: CudaSlice<f32>,
    y_legacy: CudaSlice<f32>,
    ws_graph: Workspace,
    ws_legacy: Workspace,
}

/// The legacy algorithm of the host-cost comparison (`benches/conv.rs`'s, no workspace).
const TINY_ALGO: ConvFwdAlgo = ConvFwdAlgo::ImplicitGemm;

impl Tiny {
    fn new(cudnn: &Cudnn) -> BoxResult<Tiny> {
        let stream = cudnn.stream();
        let cfg = TINY;
        let [n, c, h, w] = cfg.x_dims();
        let x_d = TensorDesc::<f32>::nchw(n, c, h, w)?;
        let w_d = FilterDesc::<f32>::new(&cfg.w_dims(), TensorFormat::Nchw)?;
        // Default math, as the reference harness (which sets no math type).
        let conv = cfg.legacy_desc::<f32>(MathType::Default)?;
        let y_d = TensorDesc::<f32>::nchw_nd(&conv.output_dims(x_d.dims(), w_d.dims())?)?;

        let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
        let x = g.tensor_nchw("x", &cfg.x_dims(), DType::F32)?;
        let wt = g.tensor_nchw("w", &cfg.w_dims(), DType::F32)?;
        let y = g.conv_fprop(x, wt, &cfg.params())?;
        g.mark_output(y)?;
        let og = g.build(cudnn)?;
        // The first plan heuristic A proposes, as `shared/gpu/reference/graphconv.cu` takes it.
        let filter = PlanFilter::new().with_heuristics(&[HeurMode::A]);
        let mut cache = PlanCache::new();
        cache.get_or_build(cudnn, &og, &filter)?;
        Ok(Tiny {
            xb: stream.clone_htod(&values::<f32>(x_d.span(), 1.0))?,
            wb: stream.clone_htod(&values::<f32>(w_d.span(), 0.05))?,
            y_graph: stream.alloc_zeros::<f32>(og.span(y)?)?,
            y_legacy: stream.alloc_zeros::<f32>(y_d.span())?,
            ws_graph: Workspace::new(stream.clone()),
            ws_legacy: Workspace::new(stream.clone()),
            og,
            x,
            w: wt,
            y,
            filter,
            cache,
            x_d,
            w_d,
            conv,
            y_d,
        })
    }

    /// The engine configuration of the cached plan.
    fn engine(&mut self, cudnn: &Cudnn) -> String {
        self.cache
            .get(cudnn, &self.og, &self.filter)
            .map_or_else(|| "none".into(), Plan::name)
    }

    /// Calls `body` with one call of `path` (checked once first, so that `body` may unwrap).
    fn with_call<R>(
        &mut self,
        cudnn: &Cudnn,
        path: HostPath,
        body: impl FnOnce(&mut dyn FnMut() -> cudnn_safe::Result<()>) -> R,
    ) -> BoxResult<R> {
        let Tiny {
            og,
            x,
            w,
            y,
            filter,
            cache,
            x_d,
            w_d,
            conv,
            y_d,
            xb,
            wb,
            y_graph,
            y_legacy,
            ws_graph,
            ws_legacy,
        } = self;
        let (x, w, y) = (*x, *w, *y);
        match path {
            HostPath::Execute => {
                let plan = cache.get(cudnn, og, filter).ok_or("no cached plan")?;
                let mut b = Bindings::new(cudnn);
                b.input(x, &*xb)?.input(w, &*wb)?.output(y, y_graph)?;
                let mut call = || cudnn.execute(plan, &b, ws_graph);
                call()?;
                Ok(body(&mut call))
            }
            HostPath::ArgsPerCall => {
                let plan = cache.get(cudnn, og, filter).ok_or("no cached plan")?;
                let mut call = || {
                    let mut b = Bindings::new(cudnn);
                    b.input(x, &*xb)?.input(w, &*wb)?.output(y, &mut *y_graph)?;
                    cudnn.execute(plan, &b, ws_graph)
                };
                call()?;
                Ok(body(&mut call))
            }
            HostPath::CacheGet => {
                let mut b = Bindings::new(cudnn);
                b.input(x, &*xb)?.input(w, &*wb)?.output(y, y_graph)?;
                let mut call = || {
                    // `ok_or_else`: the error's string must not be built on every hit.
                    let plan = cache.get(cudnn, og, filter).ok_or_else(|| {
                        cudnn_safe::Error::NoAlgorithm {
                            op: "graph plan cache",
                            detail: "the cached plan is gone".into(),
                        }
                    })?;
                    cudnn.execute(plan, &b, ws_graph)
                };
                call()?;
                Ok(body(&mut call))
            }
            HostPath::Legacy => {
                let mut call = || {
                    cudnn.conv_forward(
                        1.0,
                        x_d,
                        &*xb,
                        w_d,
                        &*wb,
                        conv,
                        TINY_ALGO,
                        ws_legacy,
                        0.0,
                        y_d,
                        &mut *y_legacy,
                    )
                };
                call()?;
                Ok(body(&mut call))
            }
        }
    }
}

/// Per-call host cost of the tiny convolution through each [`HostPath`]: JSON lines from a
/// plain measurement (best of two interleaved rounds), then criterion.
fn host_cost(run: &mut Run) -> BoxResult<()> {
    let ops: Vec<String> = HostPath::ALL.iter().map(|p| p.op()).collect();
    let names: Vec<&str> = ops.iter().map(String::as_str).collect();
    if !run.args.runs_any(GROUP, &names) {
        list_ops(run.c, &ops);
        return Ok(());
    }
    eprintln!("graph bench: host cost of {}", TINY.name());
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let s: &CudaStream = stream;
    let mut tiny = Tiny::new(cudnn)?;
    let engine = tiny.engine(cudnn);
    let n = if test { 200 } else { HOST_CALLS };
    let mut best = [f64::INFINITY; 4];
    for _ in 0..2 {
        for (path, best) in HostPath::ALL.iter().zip(&mut best) {
            let us = tiny.with_call(cudnn, *path, |call| {
                per_call_us(s, n, SYNC_EVERY, || call().unwrap())
            })?;
            *best = best.min(us);
        }
    }
    for (path, us) in HostPath::ALL.iter().zip(best) {
        let note = match path {
            HostPath::Legacy => format!("\"algo\": \"{TINY_ALGO}\""),
            _ => format!("\"engine\": {engine:?}"),
        };
        run.record(
            &path.op(),
            us / 1e3,
            &format!(
                "\"measure\": \"host wall clock\", \"us_per_call\": {us:.3}, \"calls\": {n}, \
                 \"sync_every\": {SYNC_EVERY}, {note}"
            ),
        );
    }
    let [exec, per_call, cache_get, legacy] = best;
    println!(
        "host-cost graph conv {} [{engine}]: execute {exec:.2} us/call, bindings per call \
         {per_call:.2} us/call, cache lookup per call {cache_get:.2} us/call; legacy conv_forward \
         [{TINY_ALGO}] {legacy:.2} us/call (legacy/execute = {:.2}); anchors: raw C plan 6.9, \
         raw C legacy 25.0, PyTorch 32.7 us/call; target <= 8",
        TINY.name(),
        legacy / exec
    );

    let mut g = run.c.benchmark_group(GROUP);
    for path in HostPath::ALL {
        g.bench_function(path.op(), |b| {
            b.iter_custom(|iters| {
                // Every path ran above: an error now is a bug worth a panic, as in `timed_iters`.
                tiny.with_call(cudnn, path, |call| {
                    enqueue_loop(s, iters, SYNC_EVERY, || call().unwrap())
                })
                .unwrap_or_else(|e| panic!("{e}"))
            })
        });
    }
    g.finish();
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// CUDA graph launch vs execute on the tiny convolution
// ---------------------------------------------------------------------------------------------

/// The ops of [`cuda_graph_launch`] for a data type label (`f32`, `f16`).
fn cuda_graph_ops(dtype: &str) -> [String; 2] {
    [
        format!("host_cudagraph_execute_{dtype}_{}", TINY.name()),
        format!("host_cudagraph_launch_{dtype}_{}", TINY.name()),
    ]
}

/// The tiny convolution's graph as `T` (NCHW or NHWC) and a plan whose engine supports the
/// native CUDA-graph API, if any engine does.
fn cuda_graph_tiny<T: DataType>(
    cudnn: &Cudnn,
    nhwc: bool,
) -> BoxResult<Option<(OperationGraph, [TensorId; 3], Plan)>> {
    let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
    let (x, w) = if nhwc {
        (
            g.tensor_nhwc("x", &TINY.x_dims(), T::DTYPE)?,
            g.tensor_nhwc("w", &TINY.w_dims(), T::DTYPE)?,
        )
    } else {
        (
            g.tensor_nchw("x", &TINY.x_dims(), T::DTYPE)?,
            g.tensor_nchw("w", &TINY.w_dims(), T::DTYPE)?,
        )
    };
    let y = g.conv_fprop(x, w, &TINY.params())?;
    g.mark_output(y)?;
    let og = g.build(cudnn)?;
    let filter = PlanFilter::new()
        .with_cuda_graph_native(true)
        .with_all_engines(true)
        .with_max_plans(Some(1));
    match og.plans(cudnn, &filter) {
        Ok(mut list) => {
            let plan = list.plans.swap_remove(0);
            Ok(Some((og, [x, w, y], plan)))
        }
        Err(e) => {
            eprintln!(
                "graph bench: no engine with native CUDA-graph support for the tiny conv as {} \
                 {}: {e}",
                T::DTYPE,
                if nhwc { "NHWC" } else { "NCHW" }
            );
            Ok(None)
        }
    }
}

/// Per-call host cost of the tiny convolution through [`Cudnn::execute`] and through a
/// [`PlanGraph`] of the same plan: JSON lines (best of two interleaved rounds), then criterion.
fn cuda_graph_launch(run: &mut Run) -> BoxResult<()> {
    let all: Vec<String> = ["f32", "f16"]
        .iter()
        .flat_map(|d| cuda_graph_ops(d))
        .collect();
    let names: Vec<&str> = all.iter().map(String::as_str).collect();
    if !run.args.runs_any(GROUP, &names) {
        list_ops(run.c, &all);
        return Ok(());
    }
    let (cudnn, test) = (run.cudnn, run.args.test);
    if cudnn.version() < 90500 {
        eprintln!("graph bench: cuDNN before 9.5 has no native CUDA-graph API: skipped");
        return Ok(());
    }
    eprintln!("graph bench: CUDA graph launch vs execute, {}", TINY.name());
    if let Some((og, ids, plan)) = cuda_graph_tiny::<f32>(cudnn, false)? {
        cuda_graph_measure::<f32>(run, "f32", &og, ids, &plan, test)?;
    } else if let Some((og, ids, plan)) = cuda_graph_tiny::<f16>(cudnn, true)? {
        cuda_graph_measure::<f16>(run, "f16", &og, ids, &plan, test)?;
    } else {
        println!(
            "cuda-graph launch {}: no engine supports cuDNN's native CUDA-graph API for this \
             convolution (f32 NCHW, f16 NHWC) with cuDNN {}: nothing measured",
            TINY.name(),
            cudnn.version()
        );
    }
    Ok(())
}

fn cuda_graph_measure<T: DataType>(
    run: &mut Run,
    dtype: &str,
    og: &OperationGraph,
    [x, w, y]: [TensorId; 3],
    plan: &Plan,
    test: bool,
) -> BoxResult<()> {
    let (cudnn, stream) = (run.cudnn, run.stream);
    let s: &CudaStream = stream;
    let xb = stream.clone_htod(&values::<T>(og.span(x)?, 1.0))?;
    let wb = stream.clone_htod(&values::<T>(og.span(w)?, 0.05))?;
    let mut y_exec = stream.alloc_zeros::<T>(og.span(y)?)?;
    let mut y_graph = stream.alloc_zeros::<T>(og.span(y)?)?;
    let mut ws_exec = Workspace::new(stream.clone());
    let mut ws_graph = Workspace::new(stream.clone());
    let mut be = Bindings::new(cudnn);
    be.input(x, &xb)?.input(w, &wb)?.output(y, &mut y_exec)?;
    let mut bg = Bindings::new(cudnn);
    bg.input(x, &xb)?.input(w, &wb)?.output(y, &mut y_graph)?;
    let graph: PlanGraph<'_> = cudnn.populate_cuda_graph(plan, &bg, &mut ws_graph)?;
    let nodes = graph.node_count()?;
    cudnn.execute(plan, &be, &mut ws_exec)?;
    graph.launch()?;
    let n = if test { 200 } else { HOST_CALLS };
    let mut best = [f64::INFINITY; 2];
    for _ in 0..2 {
        best[0] = best[0].min(per_call_us(s, n, SYNC_EVERY, || {
            cudnn.execute(plan, &be, &mut ws_exec).unwrap()
        }));
        best[1] = best[1].min(per_call_us(s, n, SYNC_EVERY, || graph.launch().unwrap()));
    }
    let [exec, launch] = best;
    let [op_exec, op_launch] = cuda_graph_ops(dtype);
    let engine = plan.name();
    let common = format!(
        "\"measure\": \"host wall clock\", \"calls\": {n}, \"sync_every\": {SYNC_EVERY}, \
         \"engine\": {engine:?}, \"graph_nodes\": {nodes}"
    );
    run.record(
        &op_exec,
        exec / 1e3,
        &format!("\"us_per_call\": {exec:.3}, {common}"),
    );
    run.record(
        &op_launch,
        launch / 1e3,
        &format!(
            "\"us_per_call\": {launch:.3}, \"execute_over_launch\": {:.3}, {common}",
            exec / launch
        ),
    );
    println!(
        "cuda-graph {dtype} {} [{engine}, {nodes} node(s)]: execute {exec:.2} us/call, graph \
         launch {launch:.2} us/call (execute/launch = {:.2})",
        TINY.name(),
        exec / launch
    );

    let mut g = run.c.benchmark_group(GROUP);
    g.bench_function(&op_exec, |b| {
        b.iter_custom(|iters| {
            enqueue_loop(s, iters, SYNC_EVERY, || {
                cudnn.execute(plan, &be, &mut ws_exec).unwrap()
            })
        })
    });
    g.bench_function(&op_launch, |b| {
        b.iter_custom(|iters| enqueue_loop(s, iters, SYNC_EVERY, || graph.launch().unwrap()))
    });
    g.finish();
    drop(graph);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Fused conv + bias + ReLU
// ---------------------------------------------------------------------------------------------

/// `y = relu(conv(x, w) + b)`, f16 NHWC, through one graph, the legacy unfused sequence and the
/// legacy fused call, on the same inputs.
fn fused(run: &mut Run) -> BoxResult<()> {
    let cfg = FUSED;
    let name = format!("fp16_{}", cfg.name());
    let gop = format!("graph_conv_bias_relu_{name}");
    let uop = format!("legacy_conv_bias_relu_unfused_{name}");
    let fop = format!("legacy_conv_bias_relu_fused_{name}");
    let ops = [gop.clone(), uop.clone(), fop.clone()];
    if !run.args.runs_any(GROUP, &[&gop, &uop, &fop]) {
        list_ops(run.c, &ops);
        return Ok(());
    }
    eprintln!("graph bench: fused conv + bias + relu {name}");
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let s: &CudaStream = stream;

    // Legacy descriptors; the bias is [1, K, 1, 1] (NCHW and NHWC strides describe the same
    // K contiguous values).
    let [n, c, h, w] = cfg.x_dims();
    let x_d = TensorDesc::<f16>::nhwc(n, c, h, w)?;
    let w_d = FilterDesc::<f16>::new(&cfg.w_dims(), TensorFormat::Nhwc)?;
    let conv = cfg.legacy_desc::<f16>(MathType::TensorOp)?;
    let y_d = TensorDesc::<f16>::nhwc_nd(&conv.output_dims(x_d.dims(), w_d.dims())?)?;
    let bias_d = TensorDesc::<f16>::nchw(1, cfg.k, 1, 1)?;
    let relu = ActivationDesc::new(ActivationMode::Relu)?;

    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &cfg.x_dims(), DType::F16)?;
    let wt = g.tensor_nhwc("w", &cfg.w_dims(), DType::F16)?;
    let bt = g.tensor_nhwc("b", &[1, cfg.k, 1, 1], DType::F16)?;
    let conv_out = g.conv_fprop(x, wt, &cfg.params())?;
    let biased = g.bias(conv_out, bt)?;
    let y = g.pointwise(PointwiseMode::Relu, biased, None)?;
    g.set_name(y, "y")?;
    g.mark_output(y)?;
    let og = g.build(cudnn)?;
    if !same_layout(og.layout(y)?, y_d.layout()) || og.span(bt)? != bias_d.span() {
        return Err("the graph lays y or b out unlike the legacy descriptors".into());
    }

    let xb = stream.clone_htod(&values::<f16>(x_d.span(), 1.0))?;
    let wb = stream.clone_htod(&values::<f16>(w_d.span(), 0.05))?;
    // Around zero, so that the ReLU clips about half of the outputs.
    let bb = stream.clone_htod(&values::<f16>(bias_d.span(), 0.5))?;
    let mut y_graph = stream.alloc_zeros::<f16>(y_d.span())?;
    let mut y_unfused = stream.alloc_zeros::<f16>(y_d.span())?;
    let mut y_fused = stream.alloc_zeros::<f16>(y_d.span())?;
    let flops = 2 * y_d.dims().iter().product::<i64>() as u64 * (cfg.c * cfg.r * cfg.r) as u64;

    // One graph.
    let graph_ms = (|| -> BoxResult<f64> {
        let mut ws = Workspace::new(stream.clone());
        let mut b = Bindings::new(cudnn);
        b.input(x, &xb)?
            .input(wt, &wb)?
            .input(bt, &bb)?
            .output(y, &mut y_graph)?;
        let picked = Picked::new(cudnn, &og, PlanFilter::new(), &b, &mut ws, test)?;
        let mut call = || -> BoxResult<()> {
            cudnn.execute(&picked.plan, &b, &mut ws)?;
            Ok(())
        };
        let ms = median_ms(s, test, &mut call)?;
        run.record(&gop, ms, &picked.note());
        run.criterion_device(&gop, ms, Some(flops), call);
        Ok(ms)
    })()
    .map_err(|e| {
        print_op_error(&gop, &e);
        e.to_string()
    });
    let vs_graph = |legacy_ms: f64| match &graph_ms {
        Ok(g) => format!(
            "\"graph_ms\": {g:.5}, \"legacy_over_graph\": {:.3}",
            legacy_ms / g
        ),
        Err(_) => "\"graph_ms\": null".into(),
    };
    let diff = |y: &CudaSlice<f16>| match &graph_ms {
        Ok(_) => max_diff_rel(stream, y, &y_graph),
        Err(_) => Err("no graph output".into()),
    };

    // The legacy sequence: convolution with the `find` winner, bias, in-place ReLU.
    if let Err(e) = (|| -> BoxResult<()> {
        let mut ws = Workspace::new(stream.clone());
        let perf =
            cudnn.conv_forward_find(&x_d, &xb, &w_d, &wb, &conv, &y_d, &mut y_unfused, &mut ws)?;
        let algo = perf
            .iter()
            .find(|p| p.is_supported())
            .ok_or("conv_forward_find: no supported algorithm")?
            .algo;
        let mut call = |y: &mut CudaSlice<f16>| -> BoxResult<()> {
            cudnn.conv_forward(
                1.0, &x_d, &xb, &w_d, &wb, &conv, algo, &mut ws, 0.0, &y_d, y,
            )?;
            cudnn.add_tensor(1.0, &bias_d, &bb, 1.0, &y_d, y)?;
            cudnn.activation_forward_in_place(&relu, 1.0, 0.0, &y_d, y)?;
            Ok(())
        };
        let ms = median_ms(s, test, || call(&mut y_unfused))?;
        let d = diff(&y_unfused);
        warn_diff(&uop, &d, expected_diff(DType::F16, false));
        run.record(
            &uop,
            ms,
            &format!(
                "\"algo\": \"{algo}\", \"calls\": 3, {}, {}",
                vs_graph(ms),
                diff_note(&d)
            ),
        );
        run.criterion_device(&uop, ms, Some(flops), || call(&mut y_unfused));
        Ok(())
    })() {
        print_op_error(&uop, &e);
    }

    // The legacy fused call: every algorithm cuDNN accepts, timed, the fastest kept (`find`
    // ranks plain convolutions, not the fused call).
    if let Err(e) = (|| -> BoxResult<()> {
        let mut ws = Workspace::new(stream.clone());
        let mut call = |algo: ConvFwdAlgo, y: &mut CudaSlice<f16>| -> BoxResult<()> {
            cudnn.conv_bias_activation_forward(
                1.0,
                &x_d,
                &xb,
                &w_d,
                &wb,
                &conv,
                algo,
                &mut ws,
                0.0,
                None,
                &bias_d,
                &bb,
                FusedActivation::Relu,
                &y_d,
                y,
            )?;
            Ok(())
        };
        let mut best: Option<(ConvFwdAlgo, f64)> = None;
        let mut refused = Vec::new();
        for &algo in ConvFwdAlgo::ALL {
            match call(algo, &mut y_fused)
                .and_then(|()| batch_ms(s, if test { 1 } else { 5 }, || call(algo, &mut y_fused)))
            {
                Ok(ms) if best.map_or(true, |(_, b)| ms < b) => best = Some((algo, ms)),
                Ok(_) => {}
                Err(e) => refused.push(format!("{algo}: {e}")),
            }
        }
        let Some((algo, _)) = best else {
            return Err(format!("no algorithm accepted: {}", refused.join("; ")).into());
        };
        if !refused.is_empty() {
            eprintln!(
                "graph bench: fused legacy call refused {}",
                refused.join("; ")
            );
        }
        let ms = median_ms(s, test, || call(algo, &mut y_fused))?;
        let d = diff(&y_fused);
        warn_diff(&fop, &d, expected_diff(DType::F16, false));
        run.record(
            &fop,
            ms,
            &format!(
                "\"algo\": \"{algo}\", \"algos_refused\": {}, {}, {}",
                refused.len(),
                vs_graph(ms),
                diff_note(&d)
            ),
        );
        run.criterion_device(&fop, ms, Some(flops), || call(algo, &mut y_fused));
        Ok(())
    })() {
        print_op_error(&fop, &e);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Union autotune: the Autotuner's Benchmark policy searching legacy algorithms and graph engines
// ---------------------------------------------------------------------------------------------

/// A union case kept alive after its search: the data and the tuner holding its decision, so the
/// paired comparison ([`paired`]) can time the same steady-state call again later.
struct Held<T: DataType> {
    d: ConvData<T>,
    tuner: Autotuner,
}

/// A call the paired comparison times: a held union case, or one graph plan of a case. It
/// returns the crate's error so that [`Cudnn::capture`] can record it into a CUDA graph.
trait PairedCall {
    fn call(&mut self, cudnn: &Cudnn) -> cudnn_safe::Result<()>;
}

impl<T: DataType<Scalar = f32>> Held<T> {
    /// The steady-state call: the tuner's decision (the search on the first call).
    fn forward(&mut self, cudnn: &Cudnn) -> cudnn_safe::Result<Choice<ConvFwdAlgo>> {
        let d = &mut self.d;
        self.tuner.forward(
            cudnn,
            1.0,
            &d.x_d,
            &d.xb,
            &d.w_d,
            &d.wb,
            &d.conv,
            0.0,
            &d.y_d,
            &mut d.y_legacy,
        )
    }
}

impl<T: DataType<Scalar = f32>> PairedCall for Held<T> {
    fn call(&mut self, cudnn: &Cudnn) -> cudnn_safe::Result<()> {
        self.forward(cudnn)?;
        Ok(())
    }
}

/// One graph plan of a case on its own copy of the case's data (the same values), executed
/// directly: the paired comparison's other plans (`GRAPH_BENCH_PAIRED_PLANS`).
struct PlanCall<T: DataType> {
    d: ConvData<T>,
    plan: Plan,
    ws: Workspace,
}

impl<T: DataType<Scalar = f32>> PlanCall<T> {
    /// `config` built on a new copy of the case's data.
    fn new(
        cudnn: &Cudnn,
        mode: &Mode,
        cfg: &Cfg,
        config: &cudnn_safe::graph::EngineConfig,
    ) -> BoxResult<Self> {
        let d = ConvData::<T>::new(cudnn, mode, cfg)?;
        let plan = d.og.plan_from_config(cudnn, config)?;
        Ok(PlanCall {
            d,
            plan,
            ws: Workspace::new(cudnn.stream().clone()),
        })
    }
}

impl<T: DataType<Scalar = f32>> PairedCall for PlanCall<T> {
    fn call(&mut self, cudnn: &Cudnn) -> cudnn_safe::Result<()> {
        let d = &mut self.d;
        let mut b = Bindings::new(cudnn);
        b.input(d.x, &d.xb)?
            .input(d.w, &d.wb)?
            .output(d.y, &mut d.y_graph)?;
        cudnn.execute(&self.plan, &b, &mut self.ws)?;
        Ok(())
    }
}

/// A plan timed next to a held case: its label (engine configuration, why it was chosen) and
/// its call.
type OtherPlan = (String, Box<dyn PairedCall>);

/// A union case kept for [`paired`]: mode, configuration, the held call and the other plans.
type HeldCase = (Mode, Cfg, Box<dyn PairedCall>, Vec<OtherPlan>);

/// The other plans timed next to the union's pick in [`paired`]: the `GRAPH_BENCH_PAIRED_PLANS`
/// fastest graph plans of a short first pass over heuristics A, B and fallback (up to 40
/// plans ranked by [`autotune`]: best of three rounds of ten executions), then the configurations
/// `GRAPH_BENCH_PAIRED_EXTRA` names for this case (`<mode>_<cfg>=<engine config>` items
/// separated by `;`) that are not among them. The label of the union's own pick says so: that
/// plan timed twice in the same rounds shows the noise of the comparison.
fn other_plans<T: DataType<Scalar = f32>>(
    cudnn: &Cudnn,
    mode: &Mode,
    cfg: &Cfg,
    pick: &str,
) -> BoxResult<Vec<OtherPlan>> {
    let n = count_from_env("GRAPH_BENCH_PAIRED_PLANS", 0);
    let case = format!("{}_{}", mode.name, cfg.name());
    let extra: Vec<cudnn_safe::graph::EngineConfig> = std::env::var("GRAPH_BENCH_PAIRED_EXTRA")
        .unwrap_or_default()
        .split(';')
        .filter_map(|item| item.trim().split_once('='))
        .filter(|(c, _)| *c == case)
        .map(|(_, conf)| conf.parse())
        .collect::<cudnn_safe::Result<_>>()?;
    // The union's own pick once more (`GRAPH_BENCH_PAIRED_SELF`): the same plan on its own copy
    // of the data, so that every case shows the comparison's noise. A legacy pick has no engine
    // configuration and is left out.
    let again: Option<cudnn_safe::graph::EngineConfig> = std::env::var("GRAPH_BENCH_PAIRED_SELF")
        .is_ok_and(|v| v == "1")
        .then(|| pick.parse().ok())
        .flatten();
    if n == 0 && extra.is_empty() && again.is_none() {
        return Ok(Vec::new());
    }
    let stream = cudnn.stream();
    let mut d = ConvData::<T>::new(cudnn, mode, cfg)?;
    let mut ws = Workspace::new(stream.clone());
    let mut timed = Vec::new();
    if n > 0 {
        let filter = mode
            .filter()
            .with_heuristics(&[HeurMode::A, HeurMode::B, HeurMode::Fallback])
            .with_max_plans(Some(40));
        let plans = d.og.plans(cudnn, &filter)?.plans;
        let configs: Vec<(String, cudnn_safe::graph::EngineConfig)> = plans
            .iter()
            .map(|p| (p.name(), p.config().clone()))
            .collect();
        let mut b = Bindings::new(cudnn);
        b.input(d.x, &d.xb)?
            .input(d.w, &d.wb)?
            .output(d.y, &mut d.y_graph)?;
        // The library's ranking (best of three rounds of ten executions each; a plan that fails
        // to execute is left out, as the union search leaves it out), fastest first.
        let opts = cudnn_safe::tune::plan::Policy::new()
            .with_rounds(3)
            .with_iterations(10);
        let tuned = autotune(cudnn, plans, &b, &mut ws, &opts)?;
        timed = tuned
            .candidates
            .iter()
            .filter_map(|t| {
                let config = configs.iter().find(|(name, _)| *name == t.name)?;
                Some((t.ms, config.1.clone()))
            })
            .take(n)
            .collect();
    }
    let mut out: Vec<OtherPlan> = Vec::new();
    let mut names = Vec::new();
    let labelled = timed
        .into_iter()
        .map(|(ms, c)| (format!("first pass {ms:.4}"), c))
        .chain(extra.into_iter().map(|c| ("named".to_string(), c)))
        .chain(again.map(|c| ("again".to_string(), c)));
    for (why, config) in labelled {
        let name = config.to_string();
        if names.contains(&name) {
            continue;
        }
        let tag = if name == pick {
            ", the union's pick"
        } else {
            ""
        };
        out.push((
            format!("{name} ({why}{tag})"),
            Box::new(PlanCall::<T>::new(cudnn, mode, cfg, &config)?),
        ));
        names.push(name);
    }
    Ok(out)
}

/// A union case's search: the steady-state time, the decision, the FLOP count, the held case and
/// its other plans.
type Searched<T> = (f64, Choice<ConvFwdAlgo>, u64, Held<T>, Vec<OtherPlan>);

/// What one union case measured: its time, whether a graph engine ran, and (when the paired
/// comparison asked for it) the case itself with its other plans.
type UnionOutcome = (f64, bool, Option<(Box<dyn PairedCall>, Vec<OtherPlan>)>);

/// The union cases' tuner: [`Policy::Benchmark`], no cache file, heuristics B on (the documented
/// union numbers search it: [`Autotuner::with_heuristics_b`]), and the finals' size and solo time
/// when an experiment asks for others than the defaults (`GRAPH_BENCH_FINALISTS`,
/// `GRAPH_BENCH_FINAL_SOLO_MS`).
fn union_tuner() -> Autotuner {
    let mut tuner = Autotuner::new(Policy::Benchmark)
        .without_cache_file()
        .with_heuristics_b(true);
    if let Some(n) = env_number::<usize>("GRAPH_BENCH_FINALISTS") {
        tuner = tuner.with_finalists(n);
    }
    if let Some(ms) = env_number::<f32>("GRAPH_BENCH_FINAL_SOLO_MS") {
        tuner = tuner.with_final_solo_ms(ms);
    }
    tuner
}

/// One configuration in one mode through [`Autotuner::forward`] under [`Policy::Benchmark`]
/// (union search on, no cache file): the first call decides, then the steady-state call is
/// timed as the other lines are. Returns the time, whether a graph engine ran and, with `keep`,
/// the case for [`paired`].
fn union_case<T: DataType<Scalar = f32>>(
    run: &mut Run,
    mode: &Mode,
    cfg: &Cfg,
    progress: &str,
    keep: bool,
) -> Option<Result<UnionOutcome, String>> {
    let op = format!("union_conv_fwd_{}_{}", mode.name, cfg.name());
    if !run.args.runs_any(GROUP, &[&op]) {
        return None;
    }
    eprintln!("graph bench: union {progress} {} {}", mode.name, cfg.name());
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let mut quick = None;
    let measured = (|| -> BoxResult<Searched<T>> {
        let d = ConvData::<T>::new(cudnn, mode, cfg)?;
        let flops = d.flops;
        let mut held = Held {
            d,
            tuner: union_tuner(),
        };
        let searched = Instant::now();
        let first = held.forward(cudnn)?;
        stream.synchronize()?;
        let search_s = searched.elapsed().as_secs_f64();
        let ms = median_ms(stream, test, || Ok(held.call(cudnn)?))?;
        if effort_both() && !test {
            quick = Some(quick_beside::<T>(
                cudnn, mode, cfg, &mut held, &first, search_s,
            ));
        }
        let others = if keep {
            let pick = first.describe();
            other_plans::<T>(cudnn, mode, cfg, pick.trim_start_matches("graph "))?
        } else {
            Vec::new()
        };
        Ok((ms, first, flops, held, others))
    })();
    let quick_op = format!("union_quick_conv_fwd_{}_{}", mode.name, cfg.name());
    match quick {
        Some(Ok((ms, note))) => run.record(&quick_op, ms, &note),
        Some(Err(e)) => print_op_error(&quick_op, &e),
        None => {}
    }
    match measured {
        Ok((ms, choice, flops, held, others)) => {
            run.record(
                &op,
                ms,
                &format!(
                    "\"source\": \"{}\", \"TFLOP/s\": {:.1}",
                    choice.describe(),
                    tflops(flops as f64, ms)
                ),
            );
            let held = keep.then(|| (Box::new(held) as Box<dyn PairedCall>, others));
            Some(Ok((ms, choice.api.is_graph(), held)))
        }
        Err(e) => {
            print_op_error(&op, &e);
            Some(Err(e.to_string()))
        }
    }
}

/// Whether `GRAPH_BENCH_EFFORT=both` asks for the quick search beside each union case.
fn effort_both() -> bool {
    std::env::var("GRAPH_BENCH_EFFORT").is_ok_and(|v| v.trim() == "both")
}

/// The quick search beside a held (thorough) union case: a second tuner with
/// [`SearchEffort::Quick`] on its own copy of the data searches once; then both picks are timed
/// in turns, 3 rounds each. Returns the quick pick's median and the line's notes: both picks,
/// both searches' wall time, thorough/quick (> 1: the quick pick is faster) and the noise (the
/// thorough pick's slowest round over its fastest, minus 1).
fn quick_beside<T: DataType<Scalar = f32>>(
    cudnn: &Cudnn,
    mode: &Mode,
    cfg: &Cfg,
    thorough: &mut Held<T>,
    thorough_pick: &Choice<ConvFwdAlgo>,
    thorough_s: f64,
) -> BoxResult<(f64, String)> {
    let stream = cudnn.stream();
    let d = ConvData::<T>::new(cudnn, mode, cfg)?;
    let tuner = Autotuner::new(Policy::Benchmark)
        .without_cache_file()
        .with_effort(SearchEffort::Quick);
    let mut quick = Held { d, tuner };
    let searched = Instant::now();
    let pick = quick.forward(cudnn)?;
    stream.synchronize()?;
    let quick_s = searched.elapsed().as_secs_f64();
    let (mut t, mut q) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        t.push(median_ms(stream, false, || Ok(thorough.call(cudnn)?))?);
        q.push(median_ms(stream, false, || Ok(quick.call(cudnn)?))?);
    }
    let (tm, qm) = (median(&t), median(&q));
    let spread = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
        hi / lo - 1.0
    };
    let note = format!(
        "\"source\": \"{}\", \"thorough_source\": \"{}\", \"quick_search_s\": {quick_s:.3}, \"thorough_search_s\": {thorough_s:.3}, \"thorough_ms\": {tm:.5}, \"thorough_over_quick\": {:.4}, \"noise\": {:.4}",
        pick.describe(),
        thorough_pick.describe(),
        tm / qm,
        spread(&t).max(spread(&q)),
    );
    Ok((qm, note))
}

/// Geometric mean of `v` (1 when empty).
fn geomean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len().max(1) as f64).exp()
}

/// Median of `v` (NaN when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The union group: every measured mode and configuration (the tiny one under
/// `cargo test --benches`), then per mode the geometric mean of the union times and, where the
/// graph and legacy lines of the same run exist, of their better time (`best_of_both`). With
/// `GRAPH_BENCH_PYTORCH` set, the cases stay alive for the [`paired`] comparison.
fn union(run: &mut Run, rows: &[Row]) {
    let modes = modes_from_env("GRAPH_BENCH_MODES", Mode::DEFAULT);
    let cfgs: Vec<Cfg> = if run.args.test {
        vec![TINY]
    } else {
        configs_from_env(&CONFIGS)
    };
    let pytorch = std::env::var("GRAPH_BENCH_PYTORCH")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let mut held = Vec::new();
    let total = modes.len() * cfgs.len();
    let mut i = 0;
    for mode in &modes {
        let mut times = Vec::new();
        let mut best = Vec::new();
        let mut graph_wins = 0;
        for cfg in &cfgs {
            i += 1;
            let progress = format!("[{i}/{total}]");
            let keep = pytorch.is_some();
            let r = match mode.dtype {
                DType::F16 => union_case::<f16>(run, mode, cfg, &progress, keep),
                DType::BF16 => union_case::<bf16>(run, mode, cfg, &progress, keep),
                _ => union_case::<f32>(run, mode, cfg, &progress, keep),
            };
            if let Some(Ok((ms, graph, case))) = r {
                times.push(ms);
                graph_wins += usize::from(graph);
                held.extend(case.map(|(c, others)| (*mode, *cfg, c, others)));
                let both = rows
                    .iter()
                    .find(|r| r.mode == mode.name && r.cfg == cfg.name())
                    .and_then(|r| match (&r.graph, &r.legacy) {
                        (Ok((g, _)), Ok((l, _))) => Some(g.min(*l)),
                        _ => None,
                    });
                best.extend(both);
            }
        }
        if times.is_empty() {
            continue;
        }
        let g = geomean(&times);
        let vs_best = if best.len() == times.len() {
            let b = geomean(&best);
            format!(
                "\"best_of_both_geomean_ms\": {b:.5}, \"union_over_best_of_both\": {:.3}",
                g / b
            )
        } else {
            "\"best_of_both_geomean_ms\": null".into()
        };
        println!(
            "{{\"op\": \"union_conv_fwd_{}_geomean\", \"ms\": {g:.5}, \"configs\": {}, \"graph_wins\": {graph_wins}, {vs_best}, \"impl\": \"cudnn-safe\"}}",
            mode.name,
            times.len()
        );
    }
    if let Some(cmd) = pytorch {
        if let Err(e) = paired(run, &cmd, &mut held) {
            print_op_error("paired_conv_fwd", &e);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Union autotune, backward: one training step's dx and dw through the Autotuner
// ---------------------------------------------------------------------------------------------

/// A backward union case: the forward case's data (x, w and the descriptors, whose math type
/// makes the strict fp32 search leave tensor cores out as the forward's does), a random `dy`
/// shaped like `y`, the two gradients and one tuner deciding both directions.
struct HeldBwd<T: DataType> {
    d: ConvData<T>,
    dy: CudaSlice<T>,
    dx: CudaSlice<T>,
    dw: CudaSlice<T>,
    tuner: Autotuner,
}

impl<T: DataType<Scalar = f32>> HeldBwd<T> {
    fn new(cudnn: &Cudnn, mode: &Mode, cfg: &Cfg) -> BoxResult<Self> {
        let stream = cudnn.stream();
        let d = ConvData::<T>::new(cudnn, mode, cfg)?;
        Ok(HeldBwd {
            dy: stream.clone_htod(&normal_values::<T>(d.y_d.span()))?,
            dx: stream.alloc_zeros::<T>(d.x_d.span())?,
            dw: stream.alloc_zeros::<T>(d.w_d.span())?,
            d,
            tuner: union_tuner(),
        })
    }

    /// `dx` from `dy` and `w` (the search on the first call).
    fn data(&mut self, cudnn: &Cudnn) -> BoxResult<Choice<ConvBwdDataAlgo>> {
        let d = &self.d;
        Ok(self.tuner.backward_data(
            cudnn,
            1.0,
            &d.w_d,
            &d.wb,
            &d.y_d,
            &self.dy,
            &d.conv,
            0.0,
            &d.x_d,
            &mut self.dx,
        )?)
    }

    /// `dw` from `x` and `dy` (the search on the first call).
    fn filter(&mut self, cudnn: &Cudnn) -> BoxResult<Choice<ConvBwdFilterAlgo>> {
        let d = &self.d;
        Ok(self.tuner.backward_filter(
            cudnn,
            1.0,
            &d.x_d,
            &d.xb,
            &d.y_d,
            &self.dy,
            &d.conv,
            0.0,
            &d.w_d,
            &mut self.dw,
        )?)
    }
}

/// What one backward union case measured: the step's time (dx then dw), and whether a graph
/// engine ran for dx and for dw.
type BwdOutcome = (f64, bool, bool);

/// One configuration in one mode through [`Autotuner::backward_data`] then
/// [`Autotuner::backward_filter`] (one tuner as [`union_case`]'s): the first step decides both,
/// then the steady-state step is timed, and each direction alone (`dx_ms`, `dw_ms`).
fn union_bwd_case<T: DataType<Scalar = f32>>(
    run: &mut Run,
    mode: &Mode,
    cfg: &Cfg,
    progress: &str,
) -> Option<Result<BwdOutcome, String>> {
    let op = format!("union_conv_bwd_{}_{}", mode.name, cfg.name());
    if !run.args.runs_any(GROUP, &[&op]) {
        return None;
    }
    eprintln!(
        "graph bench: union bwd {progress} {} {}",
        mode.name,
        cfg.name()
    );
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let measured = (|| -> BoxResult<(f64, String, bool, bool)> {
        let mut held = HeldBwd::<T>::new(cudnn, mode, cfg)?;
        let searched = Instant::now();
        let dx_pick = held.data(cudnn)?;
        let dw_pick = held.filter(cudnn)?;
        stream.synchronize()?;
        let search_s = searched.elapsed().as_secs_f64();
        let ms = median_ms(stream, test, || {
            held.data(cudnn)?;
            held.filter(cudnn)?;
            Ok(())
        })?;
        let dx_ms = median_ms(stream, test, || held.data(cudnn).map(drop))?;
        let dw_ms = median_ms(stream, test, || held.filter(cudnn).map(drop))?;
        // Each backward direction costs as many FLOPs as the forward.
        let flops = 2.0 * held.d.flops as f64;
        let note = format!(
            "\"dx_ms\": {dx_ms:.5}, \"dw_ms\": {dw_ms:.5}, \"source_dx\": \"{}\", \"source_dw\": \"{}\", \"search_s\": {search_s:.3}, \"TFLOP/s\": {:.1}",
            dx_pick.describe(),
            dw_pick.describe(),
            tflops(flops, ms)
        );
        Ok((ms, note, dx_pick.api.is_graph(), dw_pick.api.is_graph()))
    })();
    match measured {
        Ok((ms, note, dx_graph, dw_graph)) => {
            run.record(&op, ms, &note);
            Some(Ok((ms, dx_graph, dw_graph)))
        }
        Err(e) => {
            print_op_error(&op, &e);
            Some(Err(e.to_string()))
        }
    }
}

/// The backward union group: every measured mode and configuration (the tiny one under
/// `cargo test --benches`), then per mode the geometric mean of the step times and the number
/// of graph wins per direction.
fn union_bwd(run: &mut Run) {
    let modes = modes_from_env("GRAPH_BENCH_MODES", Mode::DEFAULT);
    let cfgs: Vec<Cfg> = if run.args.test {
        vec![TINY]
    } else {
        configs_from_env(&CONFIGS)
    };
    let total = modes.len() * cfgs.len();
    let mut i = 0;
    for mode in &modes {
        let mut times = Vec::new();
        let (mut dx_wins, mut dw_wins) = (0, 0);
        for cfg in &cfgs {
            i += 1;
            let progress = format!("[{i}/{total}]");
            let r = match mode.dtype {
                DType::F16 => union_bwd_case::<f16>(run, mode, cfg, &progress),
                DType::BF16 => union_bwd_case::<bf16>(run, mode, cfg, &progress),
                _ => union_bwd_case::<f32>(run, mode, cfg, &progress),
            };
            if let Some(Ok((ms, dx_graph, dw_graph))) = r {
                times.push(ms);
                dx_wins += usize::from(dx_graph);
                dw_wins += usize::from(dw_graph);
            }
        }
        if times.is_empty() {
            continue;
        }
        println!(
            "{{\"op\": \"union_conv_bwd_{}_geomean\", \"ms\": {:.5}, \"configs\": {}, \"graph_wins_dx\": {dx_wins}, \"graph_wins_dw\": {dw_wins}, \"impl\": \"cudnn-safe\"}}",
            mode.name,
            geomean(&times),
            times.len()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Paired comparison with PyTorch: both sides timed case by case, interleaved
// ---------------------------------------------------------------------------------------------

/// A PyTorch process serving `benches/pytorch/conv.py --serve`'s protocol.
struct Worker {
    id: usize,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// Starts `cmd --serve` through `sh -c` (so `cmd` may carry `env -u …` and arguments).
    fn start(cmd: &str, id: usize) -> BoxResult<Worker> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("{cmd} --serve"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting PyTorch worker `{cmd} --serve`: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("PyTorch worker without pipes".into());
        };
        Ok(Worker {
            id,
            child,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    /// Sends one command and returns the rest of the answer line starting with `tag`; lines
    /// starting with `{` (the worker's header) are printed as they come.
    fn ask(&mut self, command: &str, tag: &str) -> BoxResult<String> {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                return Err(format!("PyTorch worker {} ended at `{command}`", self.id).into());
            }
            let t = line.trim();
            if let Some(rest) = t.strip_prefix(tag) {
                return Ok(rest.trim().to_string());
            }
            if let Some(why) = t.strip_prefix("ERR") {
                let id = self.id;
                return Err(format!("PyTorch worker {id} at `{command}`: {}", why.trim()).into());
            }
            if t.starts_with('{') {
                println!("{t}");
            } else if !t.is_empty() {
                eprintln!("PyTorch worker {}: {t}", self.id);
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Errors here only mean the worker is gone already.
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

/// The number in the environment variable `var` (`None` when unset or unreadable).
fn env_number<N: std::str::FromStr>(var: &str) -> Option<N> {
    std::env::var(var).ok().and_then(|v| v.trim().parse().ok())
}

/// A positive count from the environment variable `var` (`default` when unset or unreadable).
fn count_from_env(var: &str, default: usize) -> usize {
    env_number(var).filter(|&n| n > 0).unwrap_or(default)
}

/// The union cases against PyTorch's benchmark mode, timed in the same thermal state.
///
/// `GRAPH_BENCH_PYTORCH_RUNS` PyTorch processes (default 3; each picks its own plans, which vary
/// from process to process) are started one after the other with `cmd --serve` and each runs
/// its search on every case before any timing starts. Then `GRAPH_BENCH_ROUNDS` rounds (default
/// 3) go through the cases; per case the Rust call and every PyTorch process are timed back to
/// back with the same rule ([`median_ms`], `timing.bench_like_rust`), the side that goes first
/// rotating from round to round. A case's ratio is PyTorch's time (the median over its
/// processes of each one's median over rounds) over ours (the median over rounds); its
/// `median_round_ratio` is the median over rounds of each round's own ratio (PyTorch's median
/// process in that round over ours in that round), which a drift of the clocks between rounds
/// does not move. Each case's other plans ([`other_plans`]) are further sides of its rounds.
/// Prints a `paired_conv_fwd_<mode>_<cfg>` line per case, a `…_geomean` line per
/// mode (with each PyTorch process's own geomean ratio and the smallest layer ratio, by both
/// rules) and a table.
fn paired(run: &mut Run, cmd: &str, held: &mut [HeldCase]) -> BoxResult<()> {
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let runs = count_from_env("GRAPH_BENCH_PYTORCH_RUNS", 3);
    let rounds = count_from_env("GRAPH_BENCH_ROUNDS", 3);
    let name = |m: &Mode, c: &Cfg| format!("{}_{}", m.name, c.name());
    let mut workers = Vec::with_capacity(runs);
    for id in 0..runs {
        let t = Instant::now();
        let mut w = Worker::start(cmd, id)?;
        for (k, (mode, cfg, _, _)) in held.iter().enumerate() {
            eprintln!(
                "graph bench: paired PyTorch run {}/{runs} search [{}/{}] {}",
                id + 1,
                k + 1,
                held.len(),
                name(mode, cfg)
            );
            let [n, c, h, wd] = cfg.x_dims();
            w.ask(
                &format!(
                    "case {} {} {n} {c} {h} {wd} {} {} {}",
                    name(mode, cfg),
                    mode.name,
                    cfg.k,
                    cfg.r,
                    cfg.s
                ),
                "OK",
            )?;
        }
        eprintln!(
            "graph bench: PyTorch run {} ready in {:.1} s",
            id + 1,
            t.elapsed().as_secs_f64()
        );
        workers.push(w);
    }
    let mut ours = vec![Vec::new(); held.len()];
    let mut theirs = vec![vec![Vec::new(); runs]; held.len()];
    // Both sides captured in CUDA graphs (`GRAPH_BENCH_PAIRED_CUDA_GRAPHS=1`): ours and each
    // PyTorch process's, per case, one time per round.
    let graphs = env_number::<u32>("GRAPH_BENCH_PAIRED_CUDA_GRAPHS").unwrap_or(0) > 0;
    let mut ours_graph: Vec<Vec<f64>> = vec![Vec::new(); held.len()];
    let mut theirs_graph = vec![vec![Vec::new(); runs]; held.len()];
    let mut graph_errors: Vec<Option<String>> = vec![None; held.len()];
    // Per case, per other plan, its time in each round.
    let mut other_ms: Vec<Vec<Vec<f64>>> = held
        .iter()
        .map(|(_, _, _, others)| vec![Vec::new(); others.len()])
        .collect();
    for round in 0..rounds {
        for (i, (mode, cfg, case, others)) in held.iter_mut().enumerate() {
            eprintln!(
                "graph bench: paired round {}/{rounds} [{}/{}] {}",
                round + 1,
                i + 1,
                ours.len(),
                name(mode, cfg)
            );
            // Sides: ours, each PyTorch process, the other plans, then with CUDA graphs ours
            // captured and each PyTorch process's captured call.
            let eager = runs + 1 + others.len();
            let sides = eager + if graphs { runs + 1 } else { 0 };
            for k in 0..sides {
                match (k + round) % sides {
                    0 => ours[i].push(median_ms(stream, test, || Ok(case.call(cudnn)?))?),
                    side if side <= runs => {
                        let ms =
                            workers[side - 1].ask(&format!("time {}", name(mode, cfg)), "MS")?;
                        theirs[i][side - 1].push(ms.parse::<f64>()?);
                    }
                    side if side < eager => {
                        let other = &mut others[side - runs - 1].1;
                        other_ms[i][side - runs - 1]
                            .push(median_ms(stream, test, || Ok(other.call(cudnn)?))?);
                    }
                    side if side == eager => {
                        if graph_errors[i].is_some() {
                            continue;
                        }
                        match captured_ms(cudnn, stream, test, case.as_mut()) {
                            Ok(ms) => ours_graph[i].push(ms),
                            Err(e) => {
                                let op = format!("paired_graph_conv_fwd_{}", name(mode, cfg));
                                print_op_error(&op, &e);
                                graph_errors[i] = Some(e.to_string());
                            }
                        }
                    }
                    side => {
                        let w = side - eager - 1;
                        let ms = workers[w].ask(&format!("graph {}", name(mode, cfg)), "MS")?;
                        theirs_graph[i][w].push(ms.parse::<f64>()?);
                    }
                }
            }
        }
    }
    drop(workers);
    // PyTorch's median process in each round (the reference of the per-round ratios).
    let pytorch_rounds = |i: usize| -> Vec<f64> {
        (0..ours[i].len())
            .map(|r| median(&theirs[i].iter().map(|v| v[r]).collect::<Vec<_>>()))
            .collect()
    };
    let median_round_ratio = |py_rounds: &[f64], v: &[f64]| -> f64 {
        median(
            &py_rounds
                .iter()
                .zip(v)
                .map(|(p, o)| p / o)
                .collect::<Vec<_>>(),
        )
    };
    let mut other_lines = Vec::new();
    for (i, (mode, cfg, _, others)) in held.iter().enumerate() {
        let py = median(&theirs[i].iter().map(|v| median(v)).collect::<Vec<_>>());
        let py_rounds = pytorch_rounds(i);
        for (k, (label, _)) in others.iter().enumerate() {
            let v = &other_ms[i][k];
            let ms = median(v);
            let list = v
                .iter()
                .map(|x| format!("{x:.5}"))
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "{{\"op\": \"paired_plan_conv_fwd_{}\", \"plan\": {label:?}, \"ms\": {ms:.5}, \"pytorch_ms\": {py:.5}, \"pytorch_over_plan\": {:.3}, \"median_round_ratio\": {:.3}, \"rounds_ms\": [{list}], \"impl\": \"cudnn-safe\"}}",
                name(mode, cfg),
                py / ms,
                median_round_ratio(&py_rounds, v)
            );
            other_lines.push(format!(
                "{:<34} {ms:>11.4} {py:>11.4} {:>7.3} {:>9.3}  {label}",
                name(mode, cfg),
                py / ms,
                median_round_ratio(&py_rounds, v)
            ));
        }
    }

    let mut table: Vec<PairedRow> = Vec::new();
    let mut by_mode: Vec<(Mode, Vec<usize>)> = Vec::new();
    for (i, (mode, cfg, _, _)) in held.iter().enumerate() {
        let ms = median(&ours[i]);
        let per_run: Vec<f64> = theirs[i].iter().map(|v| median(v)).collect();
        let py = median(&per_run);
        // Within a round both sides ran back to back, so a round's ratio is free of the drift
        // between rounds: PyTorch's median process of that round over ours of that round.
        let round_ratios: Vec<f64> = pytorch_rounds(i)
            .iter()
            .zip(&ours[i])
            .map(|(p, o)| p / o)
            .collect();
        let by_round = median(&round_ratios);
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.5}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        run.record(
            &format!("paired_conv_fwd_{}", name(mode, cfg)),
            ms,
            &format!(
                "\"pytorch_ms\": {py:.5}, \"pytorch_over_cudnn_safe\": {:.3}, \"pytorch_runs_ms\": [{}], \"rounds_ms\": [{}], \"pytorch_rounds_ms\": [{}], \"round_ratios\": [{}], \"median_round_ratio\": {by_round:.3}",
                py / ms,
                list(&per_run),
                list(&ours[i]),
                theirs[i]
                    .iter()
                    .map(|v| format!("[{}]", list(v)))
                    .collect::<Vec<_>>()
                    .join(", "),
                round_ratios
                    .iter()
                    .map(|x| format!("{x:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        table.push((name(mode, cfg), ms, py, per_run, by_round));
        match by_mode.iter_mut().find(|(m, _)| m.name == mode.name) {
            Some((_, v)) => v.push(i),
            None => by_mode.push((*mode, vec![i])),
        }
    }
    let mut geo = Vec::new();
    for (mode, idx) in &by_mode {
        let ours_g = geomean(&idx.iter().map(|&i| table[i].1).collect::<Vec<_>>());
        let py_g = geomean(&idx.iter().map(|&i| table[i].2).collect::<Vec<_>>());
        let per_run: Vec<String> = (0..runs)
            .map(|r| {
                let g = geomean(&idx.iter().map(|&i| table[i].3[r]).collect::<Vec<_>>());
                format!("{:.3}", g / ours_g)
            })
            .collect();
        let smallest = |ratio: &dyn Fn(usize) -> f64| {
            idx.iter()
                .map(|&i| (ratio(i), table[i].0.clone()))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .unwrap_or((f64::NAN, String::new()))
        };
        let (worst, worst_name) = smallest(&|i| table[i].2 / table[i].1);
        let (worst_r, worst_r_name) = smallest(&|i| table[i].4);
        let by_round_g = geomean(&idx.iter().map(|&i| table[i].4).collect::<Vec<_>>());
        println!(
            "{{\"op\": \"paired_conv_fwd_{}_geomean\", \"ms\": {ours_g:.5}, \"pytorch_ms\": {py_g:.5}, \"pytorch_over_cudnn_safe\": {:.3}, \"per_pytorch_run\": [{}], \"smallest_layer_ratio\": {worst:.3}, \"smallest_layer\": \"{worst_name}\", \"median_round_ratio_geomean\": {by_round_g:.3}, \"smallest_median_round_ratio\": {worst_r:.3}, \"smallest_median_round_layer\": \"{worst_r_name}\", \"runs\": {runs}, \"rounds\": {rounds}, \"impl\": \"cudnn-safe\"}}",
            mode.name,
            py_g / ours_g,
            per_run.join(", ")
        );
        geo.push((mode.name, ours_g, py_g, per_run, by_round_g));
    }
    println!(
        "\npaired comparison: {runs} PyTorch processes, {rounds} interleaved rounds (ms per call; ratio = PyTorch / cudnn-safe)"
    );
    println!(
        "{:<34} {:>11} {:>11} {:>7} {:>9}  PyTorch per process",
        "case", "cudnn-safe", "PyTorch", "ratio", "by round"
    );
    for (n, ms, py, per_run, by_round) in &table {
        let runs: Vec<String> = per_run.iter().map(|x| format!("{x:.4}")).collect();
        println!(
            "{n:<34} {ms:>11.4} {py:>11.4} {:>7.3} {by_round:>9.3}  {}",
            py / ms,
            runs.join(" ")
        );
    }
    for (m, ours_g, py_g, per_run, by_round_g) in &geo {
        println!(
            "{:<34} {ours_g:>11.4} {py_g:>11.4} {:>7.3} {by_round_g:>9.3}  per process {}",
            format!("{m} geomean"),
            py_g / ours_g,
            per_run.join(" ")
        );
    }
    noise_floor(held, &ours, &other_ms, &table);
    if graphs {
        let names: Vec<String> = held.iter().map(|(m, c, _, _)| name(m, c)).collect();
        paired_graphs(
            &names,
            &held.iter().map(|(m, _, _, _)| m.name).collect::<Vec<_>>(),
            &ours_graph,
            &theirs_graph,
            &table,
        );
    }
    if !other_lines.is_empty() {
        println!(
            "\nother plans of the same cases, timed in the same rounds (GRAPH_BENCH_PAIRED_PLANS)"
        );
        println!(
            "{:<34} {:>11} {:>11} {:>7} {:>9}  plan",
            "case", "plan", "PyTorch", "ratio", "by round"
        );
        for line in &other_lines {
            println!("{line}");
        }
    }
    Ok(())
}

/// Milliseconds per replay of `case` captured into a CUDA graph ([`Cudnn::capture`]; the case
/// has run before, so its tuner has decided and its workspace has grown), timed like every
/// other side ([`median_ms`]). The graph is dropped before returning.
fn captured_ms(
    cudnn: &Cudnn,
    stream: &CudaStream,
    test: bool,
    case: &mut dyn PairedCall,
) -> BoxResult<f64> {
    // SAFETY: the case reaches device memory only through borrows it holds (its buffers,
    // workspace and tuner), none behind interior mutability; the graph is dropped below.
    let graph = unsafe { cudnn.capture((), |c, _| case.call(c)) }?;
    graph.upload()?;
    let ms = median_ms(stream, test, || Ok(graph.launch()?))?;
    drop(graph);
    Ok(ms)
}

/// The paired comparison with both sides captured in CUDA graphs, so that neither side's host
/// cost per call counts: per case the median over rounds of our replay, PyTorch's median
/// process (each process's median over rounds of its `torch.cuda.CUDAGraph` replay), their
/// ratio and its by-round median, beside the eager by-round ratio of the same rounds. Prints a
/// `paired_graph_conv_fwd_<mode>_<cfg>` line per case, a `…_geomean` line per mode and a
/// table. A case whose capture failed (its error line was printed) is left out.
fn paired_graphs(
    names: &[String],
    modes: &[&str],
    ours: &[Vec<f64>],
    theirs: &[Vec<Vec<f64>>],
    table: &[PairedRow],
) {
    let mut rows: Vec<GraphRow> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if ours[i].is_empty() || theirs[i].iter().any(|v| v.len() != ours[i].len()) {
            continue;
        }
        let ms = median(&ours[i]);
        let per_run: Vec<f64> = theirs[i].iter().map(|v| median(v)).collect();
        let py = median(&per_run);
        let by_round = median(
            &(0..ours[i].len())
                .map(|r| median(&theirs[i].iter().map(|v| v[r]).collect::<Vec<_>>()) / ours[i][r])
                .collect::<Vec<_>>(),
        );
        let eager_by_round = table[i].4;
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.5}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "{{\"op\": \"paired_graph_conv_fwd_{name}\", \"ms\": {ms:.5}, \"pytorch_ms\": {py:.5}, \"pytorch_over_cudnn_safe\": {:.3}, \"median_round_ratio\": {by_round:.3}, \"eager_median_round_ratio\": {eager_by_round:.3}, \"rounds_ms\": [{}], \"pytorch_runs_ms\": [{}], \"measure\": \"both sides replay a CUDA graph of one call\", \"impl\": \"cudnn-safe\"}}",
            py / ms,
            list(&ours[i]),
            list(&per_run)
        );
        rows.push((i, ms, py, by_round, eager_by_round));
    }
    if rows.is_empty() {
        println!("paired comparison in CUDA graphs: no case was captured on both sides");
        return;
    }
    println!(
        "
paired comparison with both sides in CUDA graphs (ms per replay; ratio = PyTorch / cudnn-safe)"
    );
    println!(
        "{:<34} {:>11} {:>11} {:>7} {:>9} {:>9}",
        "case", "cudnn-safe", "PyTorch", "ratio", "by round", "eager"
    );
    for &(i, ms, py, by_round, eager) in &rows {
        println!(
            "{:<34} {ms:>11.4} {py:>11.4} {:>7.3} {by_round:>9.3} {eager:>9.3}",
            names[i],
            py / ms
        );
    }
    let mut seen: Vec<&str> = Vec::new();
    for &(i, ..) in &rows {
        if !seen.contains(&modes[i]) {
            seen.push(modes[i]);
        }
    }
    for mode in seen {
        let of: Vec<&GraphRow> = rows.iter().filter(|r| modes[r.0] == mode).collect();
        let g =
            |f: &dyn Fn(&GraphRow) -> f64| geomean(&of.iter().map(|r| f(r)).collect::<Vec<_>>());
        let (ours_g, py_g) = (g(&|r| r.1), g(&|r| r.2));
        let (by_round_g, eager_g) = (g(&|r| r.3), g(&|r| r.4));
        let (worst, worst_name) = of
            .iter()
            .map(|r| (r.3, names[r.0].as_str()))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap_or((f64::NAN, ""));
        println!(
            "{{\"op\": \"paired_graph_conv_fwd_{mode}_geomean\", \"ms\": {ours_g:.5}, \"pytorch_ms\": {py_g:.5}, \"pytorch_over_cudnn_safe\": {:.3}, \"median_round_ratio_geomean\": {by_round_g:.3}, \"eager_median_round_ratio_geomean\": {eager_g:.3}, \"smallest_median_round_ratio\": {worst:.3}, \"smallest_median_round_layer\": \"{worst_name}\", \"configs\": {}, \"impl\": \"cudnn-safe\"}}",
            py_g / ours_g,
            of.len()
        );
        println!(
            "{:<34} {ours_g:>11.4} {py_g:>11.4} {:>7.3} {by_round_g:>9.3} {eager_g:>9.3}",
            format!("{mode} geomean"),
            py_g / ours_g
        );
    }
}

/// One case of the CUDA-graph paired table: its index, our median, PyTorch's median process,
/// the by-round ratio and the eager by-round ratio.
type GraphRow = (usize, f64, f64, f64, f64);

/// One case of the paired table: name, our median, PyTorch's median process, each process's
/// median, and the median of the rounds' own ratios.
type PairedRow = (String, f64, f64, Vec<f64>, f64);

/// The comparison's own noise, per case of [`paired`]: the union's pick against the same plan
/// timed again in the same rounds (present when it is among the other plans, as
/// `GRAPH_BENCH_PAIRED_SELF=1` makes it for every graph pick), and the slowest PyTorch
/// process over the fastest (each process runs its own search, so this also holds the spread
/// of PyTorch's picks). Prints a `paired_noise_conv_fwd_<mode>_<cfg>` line per case with its
/// verdict ([`verdict`]: a case whose by-round ratio to PyTorch lies within the distance of the
/// pick from itself is a tie at this method's resolution, and only one below 1 by more is
/// `behind`), a table, and a `paired_noise_conv_fwd_verdicts` line naming the cases behind.
fn noise_floor(
    held: &[HeldCase],
    ours: &[Vec<f64>],
    other_ms: &[Vec<Vec<f64>>],
    table: &[PairedRow],
) {
    let mut rows = Vec::new();
    for (i, (_, _, _, others)) in held.iter().enumerate() {
        let (name, ms, py, per_run, by_round) = &table[i];
        let again = others
            .iter()
            .position(|(label, _)| label.contains("the union's pick"))
            .map(|k| &other_ms[i][k]);
        // Ratio convention of the table: the other side's time over ours, so 1.0 is a tie.
        let self_ratio = again.map(|v| median(v) / ms);
        let self_by_round = again.map(|v| {
            median(
                &v.iter()
                    .zip(&ours[i])
                    .map(|(a, o)| a / o)
                    .collect::<Vec<_>>(),
            )
        });
        let fastest = per_run.iter().copied().fold(f64::INFINITY, f64::min);
        let slowest = per_run.iter().copied().fold(0.0, f64::max);
        let spread = slowest / fastest;
        let opt = |x: Option<f64>| x.map_or("null".to_string(), |x| format!("{x:.3}"));
        let noise = same_plan_noise(self_ratio, self_by_round);
        let verdict = verdict(*by_round, noise);
        println!(
            "{{\"op\": \"paired_noise_conv_fwd_{name}\", \"pytorch_over_cudnn_safe\": {:.3}, \"median_round_ratio\": {by_round:.3}, \"pick_again_over_pick\": {}, \"pick_again_over_pick_by_round\": {}, \"same_plan_noise\": {}, \"verdict\": \"{verdict}\", \"pytorch_slowest_over_fastest_process\": {spread:.3}, \"impl\": \"cudnn-safe\"}}",
            py / ms,
            opt(self_ratio),
            opt(self_by_round),
            opt(noise)
        );
        rows.push((
            name.clone(),
            py / ms,
            *by_round,
            self_ratio,
            self_by_round,
            spread,
            verdict,
        ));
    }
    println!("\nnoise of the comparison: the pick against itself in the same rounds, PyTorch's processes against each other");
    println!(
        "{:<34} {:>7} {:>9} {:>12} {:>12} {:>12}  verdict",
        "case", "ratio", "by round", "pick again", "by round", "PyTorch max/min"
    );
    let opt = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
    let mut behind: Vec<String> = Vec::new();
    for (name, ratio, by_round, again, again_r, spread, verdict) in rows {
        println!(
            "{name:<34} {ratio:>7.3} {by_round:>9.3} {:>12} {:>12} {spread:>12.3}  {verdict}",
            opt(again),
            opt(again_r)
        );
        if verdict == "behind" {
            behind.push(name);
        }
    }
    println!(
        "{{\"op\": \"paired_noise_conv_fwd_verdicts\", \"behind\": [{}], \"impl\": \"cudnn-safe\"}}",
        behind
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The same-plan noise of a paired case: how far the union's pick timed again in the same
/// rounds lies from the pick itself (the larger distance from 1 of its overall and its
/// by-round ratio), or `None` when the pick was not timed again (`GRAPH_BENCH_PAIRED_SELF`).
fn same_plan_noise(again: Option<f64>, again_by_round: Option<f64>) -> Option<f64> {
    match (again, again_by_round) {
        (None, None) => None,
        (a, b) => Some(
            [a, b]
                .into_iter()
                .flatten()
                .map(|r| (r - 1.0).abs())
                .fold(0.0, f64::max),
        ),
    }
}

/// A paired case's verdict from its by-round ratio (PyTorch / cudnn-safe) and same-plan noise:
/// `behind` only when the ratio is below 1 by more than the noise, `ahead` when above 1 by
/// more than it, `tie` otherwise; without a noise figure, `behind` / `ahead` by the sign alone,
/// marked `(no noise figure)`.
fn verdict(by_round: f64, noise: Option<f64>) -> &'static str {
    match noise {
        Some(n) if by_round < 1.0 - n => "behind",
        Some(n) if by_round > 1.0 + n => "ahead",
        Some(_) => "tie",
        None if by_round < 1.0 => "behind (no noise figure)",
        None => "ahead (no noise figure)",
    }
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Layer norm: NORM_FORWARD (training and inference) and NORM_BACKWARD graphs
// ---------------------------------------------------------------------------------------------

/// Rows and row length of the layer-norm lines (`benches/pytorch/nn_ops.py`'s
/// `layernorm_fp32_32768x1024`: PyTorch 0.1025 ms forward on the H200, the crate's
/// batch-norm-based `LayerNorm` 0.499 ms).
const LN_ROWS: i64 = 32768;
const LN_COLS: i64 = 1024;

/// Layer norm f32 `32768×1024` as one-operation graphs, each autotuned: forward in the training
/// phase (y, mean and inverse standard deviation written; op `graph_layernorm_fp32_…_fwd`),
/// forward in the inference phase (`…_fwd_inference`) and backward (dx, dscale, dbias from dy, x,
/// scale and the saved statistics; `…_bwd`). Bytes as PyTorch's script counts them: x read and
/// y written (2·N·D·4) forward, dy and x read and dx written (3·N·D·4) backward. A case cuDNN
/// refuses prints its error line; the others still run.
fn layernorm(run: &mut Run) {
    let name = format!("fp32_{LN_ROWS}x{LN_COLS}");
    let fwd = format!("graph_layernorm_{name}_fwd");
    let inf = format!("graph_layernorm_{name}_fwd_inference");
    let bwd = format!("graph_layernorm_{name}_bwd");
    let ops = [fwd.clone(), inf.clone(), bwd.clone()];
    if !run.args.runs_any(GROUP, &[&fwd, &inf, &bwd]) {
        list_ops(run.c, &ops);
        return;
    }
    eprintln!("graph bench: layer norm {name}");
    let elems = (LN_ROWS * LN_COLS) as f64;
    for (op, training) in [(&fwd, true), (&inf, false)] {
        if !run.args.runs_any(GROUP, &[op]) {
            continue;
        }
        if let Err(e) = layernorm_fwd(run, op, training, 2.0 * elems * 4.0) {
            print_op_error(op, &e);
        }
    }
    if run.args.runs_any(GROUP, &[&bwd]) {
        if let Err(e) = layernorm_bwd(run, &bwd, 3.0 * elems * 4.0) {
            print_op_error(&bwd, &e);
        }
    }
}

fn layernorm_fwd(run: &mut Run, op: &str, training: bool, bytes: f64) -> BoxResult<()> {
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let s: &CudaStream = stream;
    let (n, d) = (LN_ROWS, LN_COLS);
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    // `[N, D, 1, 1]` channels-last: the rows of a row-major `[N, D]` (cudnn-frontend's layout).
    let x = g.tensor_nhwc("x", &[n, d, 1, 1], DType::F32)?;
    let scale = g.tensor_nhwc("scale", &[1, d, 1, 1], DType::F32)?;
    let bias = g.tensor_nhwc("bias", &[1, d, 1, 1], DType::F32)?;
    let out = g.layer_norm(x, scale, bias, 1e-5, training)?;
    g.mark_output(out.y)?;
    if let Some((m, v)) = out.stats {
        g.mark_output(m)?;
        g.mark_output(v)?;
    }
    let og = g.build(cudnn)?;
    let xb = stream.clone_htod(&values::<f32>(og.span(x)?, 1.0))?;
    let sb = stream.clone_htod(&values::<f32>(og.span(scale)?, 1.0))?;
    let bb = stream.clone_htod(&values::<f32>(og.span(bias)?, 0.5))?;
    let mut yb = stream.alloc_zeros::<f32>(og.span(out.y)?)?;
    let mut mb = stream.alloc_zeros::<f32>(n as usize)?;
    let mut vb = stream.alloc_zeros::<f32>(n as usize)?;
    let mut ws = Workspace::new(stream.clone());
    let mut b = Bindings::new(cudnn);
    b.input(x, &xb)?
        .input(scale, &sb)?
        .input(bias, &bb)?
        .output(out.y, &mut yb)?;
    if let Some((m, v)) = out.stats {
        b.output(m, &mut mb)?.output(v, &mut vb)?;
    }
    let picked = Picked::new(cudnn, &og, PlanFilter::new(), &b, &mut ws, test)?;
    let mut call = || -> BoxResult<()> {
        cudnn.execute(&picked.plan, &b, &mut ws)?;
        Ok(())
    };
    let ms = median_ms(s, test, &mut call)?;
    let note = format!(
        "\"phase\": \"{}\", \"pytorch_ms\": 0.1025, {}",
        if training { "training" } else { "inference" },
        picked.note()
    );
    run.record_bytes(op, ms, bytes, &note);
    run.criterion_device(op, ms, None, call);
    Ok(())
}

fn layernorm_bwd(run: &mut Run, op: &str, bytes: f64) -> BoxResult<()> {
    let (cudnn, stream, test) = (run.cudnn, run.stream, run.args.test);
    let s: &CudaStream = stream;
    let (n, d) = (LN_ROWS, LN_COLS);
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let dy = g.tensor_nhwc("dy", &[n, d, 1, 1], DType::F32)?;
    let x = g.tensor_nhwc("x", &[n, d, 1, 1], DType::F32)?;
    let scale = g.tensor_nhwc("scale", &[1, d, 1, 1], DType::F32)?;
    let mean = g.tensor_nhwc("mean", &[n, 1, 1, 1], DType::F32)?;
    let inv = g.tensor_nhwc("inv_var", &[n, 1, 1, 1], DType::F32)?;
    let grads = g.layer_norm_backward(dy, x, scale, mean, inv)?;
    for t in [grads.dx, grads.dscale, grads.dbias] {
        g.mark_output(t)?;
    }
    let og = g.build(cudnn)?;
    let dyb = stream.clone_htod(&values::<f32>(og.span(dy)?, 1.0))?;
    let xb = stream.clone_htod(&values::<f32>(og.span(x)?, 1.0))?;
    let sb = stream.clone_htod(&values::<f32>(og.span(scale)?, 1.0))?;
    // x's values are about uniform in [-1, 1]: mean ≈ 0, inverse standard deviation ≈ √3.
    let mb = stream.clone_htod(&values::<f32>(n as usize, 0.01))?;
    let ib = stream.clone_htod(&vec![1.7f32; n as usize])?;
    let mut dxb = stream.alloc_zeros::<f32>(og.span(grads.dx)?)?;
    let mut dsb = stream.alloc_zeros::<f32>(og.span(grads.dscale)?)?;
    let mut dbb = stream.alloc_zeros::<f32>(og.span(grads.dbias)?)?;
    let mut ws = Workspace::new(stream.clone());
    let mut b = Bindings::new(cudnn);
    b.input(dy, &dyb)?
        .input(x, &xb)?
        .input(scale, &sb)?
        .input(mean, &mb)?
        .input(inv, &ib)?
        .output(grads.dx, &mut dxb)?
        .output(grads.dscale, &mut dsb)?
        .output(grads.dbias, &mut dbb)?;
    let picked = Picked::new(cudnn, &og, PlanFilter::new(), &b, &mut ws, test)?;
    let mut call = || -> BoxResult<()> {
        cudnn.execute(&picked.plan, &b, &mut ws)?;
        Ok(())
    };
    let ms = median_ms(s, test, &mut call)?;
    run.record_bytes(op, ms, bytes, &picked.note());
    run.criterion_device(op, ms, None, call);
    Ok(())
}

fn main() {
    let _ = env_logger::try_init();
    // The per-thread default stream, so that the paired comparison can capture its calls into
    // CUDA graphs (CUDA cannot capture the legacy default stream).
    let Some((stream, cudnn)) = setup_per_thread_or_skip() else {
        return;
    };
    print_header(&stream, &cudnn);
    let args = Args::parse();
    let mut c = Criterion::default().configure_from_args();
    let mut run = Run {
        c: &mut c,
        args: &args,
        cudnn: &cudnn,
        stream: &stream,
        summary: Vec::new(),
    };
    let t = Instant::now();
    let mut rows = Vec::new();
    let outcome = (|| -> BoxResult<()> {
        host_cost(&mut run)?;
        cuda_graph_launch(&mut run)?;
        fused(&mut run)?;
        layernorm(&mut run);
        conv_forward(&mut run, &mut rows);
        union(&mut run, &rows);
        union_bwd(&mut run);
        Ok(())
    })();
    print_conv_table(&rows);
    print_summary(&run.summary, 60);
    eprintln!("graph bench: {:.1} s", t.elapsed().as_secs_f64());
    c.final_summary();
    exit_on_error("graph", outcome);
}
