//! cuBLASLt benchmarks through [`BlasLt`].
//!
//! * `lt_gemm_<mode>/<size>/{heuristic,autotune}`: square GEMMs `D = A·Bᵀ` (PyTorch's
//!   `a @ w.T`, row-major, B transposed) of size 1024, 2048, 4096 and 8192 in f32 (`f32`: strict
//!   FP32; `tf32`: `CUBLAS_COMPUTE_32F_FAST_TF32`), `f16` and `bf16` (f32 accumulation), with
//!   cuBLASLt's heuristic choice and with the autotuned one (8 candidates timed; decided before
//!   measuring). Criterion measures device time with CUDA events around `iters` calls enqueued
//!   back to back and reports throughput in FLOPs (printed as "elem/s"). Before each group a line
//!   `gemm <mode> <size>^3 <policy>: X ms, Y TFLOP/s (algo …)` gives the median of 5 event-timed
//!   batches, so the numbers survive short criterion runs.
//! * `lt_fused_bias_gelu/8192x4096x1024/{fused,unfused}_{heuristic,autotune}`: bf16
//!   `y = gelu_tanh(x[8192×1024]·W[4096×1024]ᵀ + b)` as one cuBLASLt call with
//!   [`Epilogue::BiasGelu`], against the unfused two-pass baseline: the plain matmul
//!   ([`Epilogue::None`]), then one bias+GELU pass over `y` done by cuBLASLt itself as
//!   `y ← gelu(1·y + b + Z₁·Z₂)` with `beta = 1` and zero operands `Z₁[8192×8]`, `Z₂[8×4096]` (a
//!   K = 8 matmul whose cost is reading and writing `y` once, like an elementwise kernel; the
//!   crate has no elementwise kernels). PyTorch's unfused `gelu(a @ w.T + b)` makes two such
//!   passes (add, then gelu), so this baseline is if anything faster than PyTorch's. A line
//!   `fused bias+gelu 8192x4096x1024 <policy>: fused A ms, unfused B ms (…), speedup S` gives
//!   event-timed medians, and the fused and unfused results are compared once.
//! * `lt_fp8_e4m3/<size>/{heuristic,autotune}`: square FP8 GEMMs of size 4096 and 8192
//!   ([`BlasLt::matmul_fp8`]: E4M3 × E4M3 → bf16, device scales of 1, standard-normal inputs),
//!   the shape and data of `benches/pytorch/gemm.py fp8`'s `torch._scaled_mm(a, b.t(), …,
//!   out_dtype=torch.bfloat16)`; a JSON line
//!   `{"op": "fp8_e4m3_gemm_<size>", "policy": …, "ms": …, "tflops": …}` gives the event-timed
//!   median.
//!
//! With `--warm-up-time 1 --measurement-time 3` the whole run (36 criterion benchmarks, the
//! autotunes and the event-timed lines) takes about 3 minutes on an H200. A filter argument
//! selects benchmarks as criterion does; buffers and decisions are only prepared for groups the
//! filter can select, and `--list` prepares nothing. Without a GPU or cuBLASLt it prints
//! `no GPU: <why>` and exits cleanly.
mod common;

use std::sync::Arc;

use common::{
    list_only, median_ms, normal_values, sample_size, tflops, timed_iters, values, Args, BoxResult,
};
use criterion::{Criterion, Throughput};
use cudnn_safe::blas::lt::{
    BlasLt, Choice, Element, Epilogue, EpilogueData, Fp8Scaling, Matmul, Policy,
};
use cudnn_safe::cuda_context;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::float8::F8E4M3;
use cudnn_safe::half::{bf16, f16};

/// Square sizes of the GEMM groups.
const SIZES: [i64; 4] = [1024, 2048, 4096, 8192];
/// The fused problem (torch_lt.py's first case).
const FUSED: (i64, i64, i64) = (8192, 4096, 1024);

fn describe(c: &Choice) -> String {
    format!(
        "algo {}, heuristic rank {}, {} B workspace",
        c.candidate.algo_id, c.candidate.index, c.candidate.workspace
    )
}

// ---------------------------------------------------------------------------------------------
// Square GEMMs
// ---------------------------------------------------------------------------------------------

struct Mode {
    name: &'static str,
    tf32: bool,
}

#[allow(clippy::too_many_arguments)]
fn gemm_group<T: Element>(
    c: &mut Criterion,
    args: &Args,
    stream: &Arc<CudaStream>,
    lts: &mut Handles,
    mode: &Mode,
    size: i64,
) {
    let group = format!("lt_gemm_{}/{size}", mode.name);
    let functions = ["heuristic", "autotune"];
    if !args.runs_any(&group, &functions) {
        list_only(c, &group, &functions);
        return;
    }
    let prepared = (|| -> BoxResult<_> {
        let op = Matmul::linear(size, size, size)?.with_tf32(mode.tf32);
        let scale = 1.0;
        let a = stream.clone_htod(&values::<T>(op.a_len(), scale))?;
        let b = stream.clone_htod(&values::<T>(op.b_len(), scale))?;
        let d = stream.alloc_zeros::<T>(op.d_len())?;
        Ok((op, a, b, d))
    })();
    let (op, a, b, mut d) = match prepared {
        Ok(v) => v,
        Err(e) => {
            println!("gemm {} {size}^3: skipped: {e}", mode.name);
            list_only(c, &group, &functions);
            return;
        }
    };
    let flops = op.flops();
    let mut slowest: f64 = 0.0;
    let mut ok = [false, false];
    for (i, (policy, lt)) in lts.iter_mut().enumerate() {
        // The first call decides (autotune included); the timing below reuses the decision.
        let r = (|| -> BoxResult<(Choice, f64)> {
            let choice = lt.matmul(&op, 1.0, &a, &b, 0.0, &mut d, EpilogueData::None)?;
            let ms = median_ms(stream, args.test, || {
                lt.matmul(&op, 1.0, &a, &b, 0.0, &mut d, EpilogueData::None)?;
                Ok(())
            })?;
            Ok((choice, ms))
        })();
        match r {
            Ok((choice, ms)) => {
                println!(
                    "gemm {} {size}^3 {policy}: {ms:.4} ms, {:.1} TFLOP/s ({})",
                    mode.name,
                    tflops(flops, ms),
                    describe(&choice)
                );
                slowest = slowest.max(ms);
                ok[i] = true;
            }
            Err(e) => println!("gemm {} {size}^3 {policy}: failed: {e}", mode.name),
        }
    }
    let mut g = c.benchmark_group(&group);
    g.throughput(Throughput::Elements(flops as u64));
    g.sample_size(sample_size(slowest));
    for (i, (policy, lt)) in lts.iter_mut().enumerate() {
        if !ok[i] {
            continue;
        }
        g.bench_function(*policy, |bch| {
            bch.iter_custom(|iters| {
                timed_iters(stream, iters, || {
                    lt.matmul(&op, 1.0, &a, &b, 0.0, &mut d, EpilogueData::None)?;
                    Ok(())
                })
            })
        });
    }
    g.finish();
}

fn gemms(c: &mut Criterion, args: &Args, stream: &Arc<CudaStream>, lts: &mut Handles) {
    let f32_modes = [
        Mode {
            name: "f32",
            tf32: false,
        },
        Mode {
            name: "tf32",
            tf32: true,
        },
    ];
    for mode in &f32_modes {
        for size in SIZES {
            gemm_group::<f32>(c, args, stream, lts, mode, size);
        }
    }
    let half = Mode {
        name: "f16",
        tf32: false,
    };
    for size in SIZES {
        gemm_group::<f16>(c, args, stream, lts, &half, size);
    }
    let bf = Mode {
        name: "bf16",
        tf32: false,
    };
    for size in SIZES {
        gemm_group::<bf16>(c, args, stream, lts, &bf, size);
    }
}

// ---------------------------------------------------------------------------------------------
// FP8
// ---------------------------------------------------------------------------------------------

/// Square FP8 GEMMs `D = (1·A)·(1·B)ᵀ`, E4M3 inputs, bf16 output, scales read from the device
/// (PyTorch's `torch._scaled_mm(a, b.t(), scale_a=1, scale_b=1, out_dtype=bfloat16)`).
fn fp8_group(
    c: &mut Criterion,
    args: &Args,
    stream: &Arc<CudaStream>,
    lts: &mut Handles,
    size: i64,
) {
    let group = format!("lt_fp8_e4m3/{size}");
    let functions = ["heuristic", "autotune"];
    if !args.runs_any(&group, &functions) {
        list_only(c, &group, &functions);
        return;
    }
    let prepared = (|| -> BoxResult<_> {
        let op = Matmul::linear(size, size, size)?;
        let to8 = |v: Vec<f32>| v.into_iter().map(F8E4M3::from_f32).collect::<Vec<_>>();
        // Standard-normal values rounded to E4M3, as PyTorch's `randn(...).to(float8_e4m3fn)`:
        // a power-limited GEMM's clocks depend on the data.
        let a = stream.clone_htod(&to8(normal_values::<f32>(op.a_len())))?;
        let b = stream.clone_htod(&to8(normal_values::<f32>(op.a_len() + op.b_len())
            [op.a_len()..]
            .to_vec()))?;
        let d = stream.alloc_zeros::<bf16>(op.d_len())?;
        let one = stream.clone_htod(&[1.0f32])?;
        Ok((op, a, b, d, one))
    })();
    let (op, a, b, mut d, one) = match prepared {
        Ok(v) => v,
        Err(e) => {
            println!("fp8 gemm {size}^3: skipped: {e}");
            list_only(c, &group, &functions);
            return;
        }
    };
    let scaling = || Fp8Scaling::new().with_a_scale(&one).with_b_scale(&one);
    let flops = op.flops();
    let mut slowest: f64 = 0.0;
    let mut ok = [false, false];
    for (i, (policy, lt)) in lts.iter_mut().enumerate() {
        let r = (|| -> BoxResult<(Choice, f64)> {
            let choice =
                lt.matmul_fp8(&op, 1.0, &a, &b, 0.0, &mut d, EpilogueData::None, scaling())?;
            let ms = median_ms(stream, args.test, || {
                lt.matmul_fp8(&op, 1.0, &a, &b, 0.0, &mut d, EpilogueData::None, scaling())?;
                Ok(())
            })?;
            Ok((choice, ms))
        })();
        match r {
            Ok((choice, ms)) => {
                println!(
                    "{{\"op\": \"fp8_e4m3_gemm_{size}\", \"policy\": \"{policy}\", \"ms\": {ms:.5}, \"tflops\": {:.1}, \"impl\": \"cudnn-safe\", \"choice\": \"{}\"}}",
                    tflops(flops, ms),
                    describe(&choice)
                );
                slowest = slowest.max(ms);
                ok[i] = true;
            }
            Err(e) => println!("fp8 gemm {size}^3 {policy}: failed: {e}"),
        }
    }
    let mut g = c.benchmark_group(&group);
    g.throughput(Throughput::Elements(flops as u64));
    g.sample_size(sample_size(slowest));
    for (i, (policy, lt)) in lts.iter_mut().enumerate() {
        if !ok[i] {
            continue;
        }
        g.bench_function(*policy, |bch| {
            bch.iter_custom(|iters| {
                timed_iters(stream, iters, || {
                    lt.matmul_fp8(&op, 1.0, &a, &b, 0.0, &mut d, EpilogueData::None, scaling())?;
                    Ok(())
                })
            })
        });
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------------
// Fused bias + GELU
// ---------------------------------------------------------------------------------------------

/// Buffers of the fused problem.
struct Fused {
    fused: Matmul,
    plain: Matmul,
    pass: Matmul,
    x: CudaSlice<bf16>,
    w: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    z1: CudaSlice<bf16>,
    z2: CudaSlice<bf16>,
    y: CudaSlice<bf16>,
}

impl Fused {
    fn new(stream: &Arc<CudaStream>) -> BoxResult<Self> {
        let (m, n, k) = FUSED;
        let fused = Matmul::linear(m, k, n)?.with_epilogue(Epilogue::BiasGelu);
        let plain = Matmul::linear(m, k, n)?;
        // y ← gelu(Z₁·Z₂ + 1·y + b) with Z₁, Z₂ zero: one read and one write of y.
        let pass = Matmul::new(m, n, 8)?.with_epilogue(Epilogue::BiasGelu);
        let scale = 1.0 / (k as f64).sqrt();
        Ok(Fused {
            x: stream.clone_htod(&values::<bf16>(fused.a_len(), 1.0))?,
            w: stream.clone_htod(&values::<bf16>(fused.b_len(), scale))?,
            b: stream.clone_htod(&values::<bf16>(fused.bias_len(), 0.5))?,
            z1: stream.alloc_zeros::<bf16>(pass.a_len())?,
            z2: stream.alloc_zeros::<bf16>(pass.b_len())?,
            y: stream.alloc_zeros::<bf16>(fused.d_len())?,
            fused,
            plain,
            pass,
        })
    }

    fn run_fused(&mut self, lt: &mut BlasLt) -> BoxResult<Choice> {
        let r = lt.matmul(
            &self.fused,
            1.0,
            &self.x,
            &self.w,
            0.0,
            &mut self.y,
            EpilogueData::bias(&self.b),
        )?;
        Ok(r)
    }

    fn run_plain(&mut self, lt: &mut BlasLt) -> BoxResult<Choice> {
        let r = lt.matmul(
            &self.plain,
            1.0,
            &self.x,
            &self.w,
            0.0,
            &mut self.y,
            EpilogueData::None,
        )?;
        Ok(r)
    }

    fn run_pass(&mut self, lt: &mut BlasLt) -> BoxResult<Choice> {
        let r = lt.matmul(
            &self.pass,
            1.0,
            &self.z1,
            &self.z2,
            1.0,
            &mut self.y,
            EpilogueData::bias(&self.b),
        )?;
        Ok(r)
    }

    fn run_unfused(&mut self, lt: &mut BlasLt) -> BoxResult<()> {
        self.run_plain(lt)?;
        self.run_pass(lt)?;
        Ok(())
    }
}

fn fused_bias_gelu(c: &mut Criterion, args: &Args, stream: &Arc<CudaStream>, lts: &mut Handles) {
    let (m, n, k) = FUSED;
    let group = format!("lt_fused_bias_gelu/{m}x{n}x{k}");
    let functions = [
        "fused_heuristic",
        "unfused_heuristic",
        "fused_autotune",
        "unfused_autotune",
    ];
    if !args.runs_any(&group, &functions) {
        list_only(c, &group, &functions);
        return;
    }
    let mut p = match Fused::new(stream) {
        Ok(p) => p,
        Err(e) => {
            println!("fused bias+gelu {m}x{n}x{k}: skipped: {e}");
            list_only(c, &group, &functions);
            return;
        }
    };
    let mut slowest: f64 = 0.0;
    let mut ok = [false, false];
    for (i, (policy, lt)) in lts.iter_mut().enumerate() {
        let r = (|| -> BoxResult<String> {
            // Decide every call first; check the two paths agree.
            let fc = p.run_fused(lt)?;
            let fused_y = stream.clone_dtoh(&p.y)?;
            let pc = p.run_plain(lt)?;
            let ec = p.run_pass(lt)?;
            let unfused_y = stream.clone_dtoh(&p.y)?;
            let worst = fused_y
                .iter()
                .zip(&unfused_y)
                .map(|(a, b)| (a.to_f64() - b.to_f64()).abs() / (1.0 + b.to_f64().abs()))
                .fold(0.0, f64::max);
            let fused_ms = median_ms(stream, args.test, || p.run_fused(lt).map(|_| ()))?;
            let unfused_ms = median_ms(stream, args.test, || p.run_unfused(lt))?;
            let plain_ms = median_ms(stream, args.test, || p.run_plain(lt).map(|_| ()))?;
            let pass_ms = median_ms(stream, args.test, || p.run_pass(lt).map(|_| ()))?;
            slowest = slowest.max(unfused_ms);
            Ok(format!(
                "fused bias+gelu {m}x{n}x{k} {policy}: fused {fused_ms:.4} ms, unfused {unfused_ms:.4} ms \
                 (matmul {plain_ms:.4} ms + bias+gelu pass {pass_ms:.4} ms), speedup {:.2}; \
                 gemm only {:.1} TFLOP/s, fused {:.1} TFLOP/s; fused {} / matmul {} / pass {}; \
                 max relative |fused − unfused| {worst:.2e}",
                unfused_ms / fused_ms,
                tflops(p.plain.flops(), plain_ms),
                tflops(p.fused.flops(), fused_ms),
                describe(&fc),
                describe(&pc),
                describe(&ec),
            ))
        })();
        match r {
            Ok(line) => {
                println!("{line}");
                ok[i] = true;
            }
            Err(e) => println!("fused bias+gelu {m}x{n}x{k} {policy}: failed: {e}"),
        }
    }
    let mut g = c.benchmark_group(&group);
    g.throughput(Throughput::Elements(p.fused.flops() as u64));
    g.sample_size(sample_size(slowest));
    for (i, (policy, lt)) in lts.iter_mut().enumerate() {
        if !ok[i] {
            continue;
        }
        g.bench_function(format!("fused_{policy}"), |bch| {
            bch.iter_custom(|iters| timed_iters(stream, iters, || p.run_fused(lt).map(|_| ())))
        });
        g.bench_function(format!("unfused_{policy}"), |bch| {
            bch.iter_custom(|iters| timed_iters(stream, iters, || p.run_unfused(lt)))
        });
    }
    g.finish();
}

/// The two handles every group runs, by policy name.
type Handles = [(&'static str, BlasLt); 2];

fn setup() -> cudnn_safe::Result<(Arc<CudaStream>, Handles)> {
    let ctx = cuda_context(0)?;
    let stream = ctx.default_stream();
    let heuristic = BlasLt::new(stream.clone())?
        .without_cache_file()
        .with_policy(Policy::Heuristic);
    let autotune = BlasLt::new(stream.clone())?
        .without_cache_file()
        .with_policy(Policy::Benchmark);
    Ok((stream, [("heuristic", heuristic), ("autotune", autotune)]))
}

fn main() {
    let _ = env_logger::try_init();
    let (stream, mut lts) = match setup() {
        Ok(v) => v,
        Err(e) => {
            println!("no GPU: {e}");
            return;
        }
    };
    let ctx = stream.context();
    println!(
        "cuBLASLt {} on {} (sm_{}{}), workspace limit {} MiB",
        lts[0].1.version(),
        ctx.name().unwrap_or_else(|_| "unknown GPU".into()),
        ctx.compute_capability().map(|c| c.0).unwrap_or(0),
        ctx.compute_capability().map(|c| c.1).unwrap_or(0),
        lts[0].1.workspace_limit() >> 20
    );
    let args = Args::parse();
    let mut c = Criterion::default().configure_from_args();
    fused_bias_gelu(&mut c, &args, &stream, &mut lts);
    gemms(&mut c, &args, &stream, &mut lts);
    for size in [4096, 8192] {
        fp8_group(&mut c, &args, &stream, &mut lts, size);
    }
    c.final_summary();
    common::print_libraries();
}
