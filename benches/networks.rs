//! Whole-network inference: the ResNets of the `resnet` example (`examples/common/resnet.rs`,
//! included here as it is), each forward captured once into a CUDA graph ([`Cudnn::capture`])
//! and replayed, as the example does and as `benches/pytorch/resnet.py time` does for PyTorch:
//!
//! * `resnet50_fp16_b32_cudagraph`, `resnet50_bf16_b32_cudagraph`, `resnet18_fp16_b32_cudagraph`
//!   and `resnet50_fp16_b1_cudagraph`: channels-last, 224×224 images, random weights
//!   (`Tensors::random`), batch norm folded into each convolution, each
//!   convolution with its bias, residual add and ReLU one cuDNN graph, the classifier one cuBLASLt
//!   matmul with a bias epilogue.
//!
//! Per case, untimed: the network is built, its first forward chooses each graph's plan through
//! a [`PlanCache`] ([`MAX_PLANS`] candidates timed per graph, the example's `--max-plans`
//! default), then one forward is captured and the graph uploaded. A JSON line in the PyTorch
//! script's format then gives the device time of one replay from CUDA events (median of 5
//! batches of about 25 ms, after a warm-up), e.g.
//! `{"op": "resnet50_fp16_b32_cudagraph", "ms": …, "ips": …, "impl": "cudnn-safe", …}`,
//! and criterion measures one [`Captured::launch`] per iteration with CUDA events
//! (`iter_custom`, waiting for the last replay to finish). The one [`PlanCache`], cuBLASLt
//! handle and workspace serve all cases, as in the example.
//!
//! A filter argument selects benchmarks as criterion does (ids `networks/<op>`); a network is
//! only built when its case is selected, and `--list` builds nothing. A case that fails prints
//! a JSON line with the error, the others still run, and the bench then exits with status 1.
//! Without a GPU (no driver, no device, no cuDNN) it prints `no GPU: <why>` and exits cleanly.
//!
//! [`Captured::launch`]: cudnn_safe::capture::Captured::launch
mod common;
// The example's network code, one copy for both packages. `rustfmt::skip`: the examples' own
// rustfmt.toml formats it.
#[path = "../examples/common/resnet.rs"]
#[rustfmt::skip]
mod resnet;

use std::sync::Arc;
use std::time::Instant;

use common::{
    exit_on_error, list_only, median_ms, print_header, print_op_error, sample_size,
    setup_per_thread_or_skip, timed_iters, values, Args, BoxResult,
};
use criterion::Criterion;
use cudnn_safe::blas::lt::{BlasLt, Element};
use cudnn_safe::cudarc::driver::CudaStream;
use cudnn_safe::graph::PlanCache;
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{Cudnn, Workspace};
use resnet::{Arch, Context, ResNet, Tensors};

/// Criterion group of every benchmark here.
const GROUP: &str = "networks";
/// Candidate plans timed per cuDNN graph at the first forward (the example's `--max-plans`).
const MAX_PLANS: usize = 4;
/// The seed of the random weights.
const WEIGHTS_SEED: u64 = 7;
/// Values in one `3×224×224` image.
const IMAGE: usize = 3 * 224 * 224;
/// Distinct images, cycled over the batch (as the example cycles the weight file's 8).
const IMAGES: usize = 8;

#[derive(Debug, Clone, Copy)]
enum Precision {
    Fp16,
    Bf16,
}

/// One network, element type and batch size.
struct Case {
    arch: Arch,
    precision: Precision,
    batch: i64,
}

const CASES: [Case; 4] = [
    Case {
        arch: Arch::ResNet50,
        precision: Precision::Fp16,
        batch: 32,
    },
    Case {
        arch: Arch::ResNet50,
        precision: Precision::Bf16,
        batch: 32,
    },
    Case {
        arch: Arch::ResNet18,
        precision: Precision::Fp16,
        batch: 32,
    },
    Case {
        arch: Arch::ResNet50,
        precision: Precision::Fp16,
        batch: 1,
    },
];

impl Case {
    /// The example's case name with the PyTorch script's suffix:
    /// `resnet50_fp16_b32_cudagraph`.
    fn op(&self) -> String {
        let t = match self.precision {
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        };
        format!("{}_{t}_b{}_cudagraph", self.arch.name(), self.batch)
    }
}

/// What every case shares: the handle and what a forward uses besides the network.
struct Shared<'a> {
    stream: &'a Arc<CudaStream>,
    cudnn: &'a Cudnn,
    lt: BlasLt,
    plans: PlanCache,
    ws: Workspace,
}

/// Builds `case`'s network, runs its first forward (plan choice), captures one forward, prints
/// the JSON line and runs criterion on the replay.
fn bench_case<T: Element>(
    c: &mut Criterion,
    args: &Args,
    sh: &mut Shared<'_>,
    case: &Case,
    op: &str,
) -> BoxResult<()> {
    let (stream, cudnn) = (sh.stream, sh.cudnn);
    // SplitMix64 over a counter: uniform values in [-1, 1).
    let mut state = WEIGHTS_SEED;
    let mut unit = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as f64 / u64::MAX as f64 * 2.0 - 1.0
    };
    let weights = Tensors::random(case.arch, &mut unit);
    let images = values::<f32>(IMAGES * IMAGE, 1.0);
    let n = case.batch as usize;
    let nchw: Vec<f32> = (0..n)
        .flat_map(|i| images[(i % IMAGES) * IMAGE..][..IMAGE].iter().copied())
        .collect();
    // The example's "first forward" time: network built, plans chosen, first run finished.
    let start = Instant::now();
    let mut cx = Context {
        cudnn,
        lt: &mut sh.lt,
        plans: &mut sh.plans,
        ws: &mut sh.ws,
    };
    // As the example: the stem reads 3 channels; engines that need more get them zero-padded.
    let mut attempt = None;
    for cp in [3, 4, 8] {
        let net = ResNet::<T>::new(cudnn, case.arch, case.batch, cp, MAX_PLANS, &weights)?;
        let x = stream.clone_htod(&resnet::to_input::<T>(&nchw, n, cp as usize))?;
        let mut scratch = net.scratch(stream)?;
        let mut logits = stream.alloc_zeros::<T>(net.logits_len())?;
        match net.forward(&mut cx, &x, &mut scratch, &mut logits) {
            Ok(()) => {
                attempt = Some((net, x, scratch, logits));
                break;
            }
            Err(e) if cp < 8 => {
                eprintln!("networks bench: {op}: with {cp} input channels: {e}; padding the input")
            }
            Err(e) => return Err(e.into()),
        }
    }
    let (net, x, mut scratch, logits) = attempt.ok_or("no input layout ran")?;
    stream.synchronize()?;
    // An error cudarc recorded instead of returning (a failed event or free) would not show
    // otherwise.
    stream.context().check_err()?;
    let first_s = start.elapsed().as_secs_f64();

    // Every plan is chosen and the workspace grown: one forward captured, the input and the
    // logits travelling with the graph.
    // SAFETY: the closure reaches device memory through `buffers`, `&mut` borrows and shared
    // borrows of the network, which holds none behind interior mutability; all outlive the graph.
    let graph = unsafe {
        cudnn.capture((x, logits), |_, (x, logits)| {
            net.forward(&mut cx, x, &mut scratch, logits)
        })
    }?;
    graph.upload()?;
    let mut replay = || -> BoxResult<()> { Ok(graph.launch()?) };
    let ms = replay().and_then(|()| median_ms(stream, args.test, &mut replay))?;
    let ips = case.batch as f64 / ms * 1e3;
    println!(
        "{{\"op\": \"{op}\", \"ms\": {ms:.4}, \"ips\": {ips:.0}, \"impl\": \"cudnn-safe\", \
         \"first_s\": {first_s:.3}, \"in_channels\": {}, \"max_plans\": {MAX_PLANS}}}",
        net.in_channels
    );
    let mut g = c.benchmark_group(GROUP);
    g.sample_size(sample_size(ms));
    g.bench_function(op, |b| {
        b.iter_custom(|iters| timed_iters(stream, iters, &mut replay))
    });
    g.finish();
    Ok(())
}

fn run(c: &mut Criterion, args: &Args, stream: &Arc<CudaStream>, cudnn: &Cudnn) -> BoxResult<()> {
    let selected: Vec<(&Case, String)> = CASES
        .iter()
        .map(|case| (case, case.op()))
        .filter(|(_, op)| {
            let runs = args.runs(&format!("{GROUP}/{op}"));
            if !runs {
                list_only(c, GROUP, &[op.as_str()]);
            }
            runs
        })
        .collect();
    if selected.is_empty() {
        return Ok(());
    }
    let mut sh = Shared {
        stream,
        cudnn,
        lt: BlasLt::new(stream.clone())?,
        plans: PlanCache::new(),
        ws: Workspace::new(stream.clone()),
    };
    let mut failed = 0;
    for (case, op) in &selected {
        let outcome = match case.precision {
            Precision::Fp16 => bench_case::<f16>(c, args, &mut sh, case, op),
            Precision::Bf16 => bench_case::<bf16>(c, args, &mut sh, case, op),
        };
        if let Err(e) = outcome {
            print_op_error(op, &e);
            failed += 1;
        }
    }
    match failed {
        0 => Ok(()),
        n => Err(format!(
            "{n} of {} cases failed (see their JSON lines)",
            selected.len()
        )
        .into()),
    }
}

fn main() {
    let _ = env_logger::try_init();
    // The per-thread default stream: `Cudnn::capture` refuses the legacy default stream.
    let Some((stream, cudnn)) = setup_per_thread_or_skip() else {
        return;
    };
    print_header(&stream, &cudnn);
    let args = Args::parse();
    let mut c = Criterion::default().configure_from_args();
    let outcome = run(&mut c, &args, &stream, &cudnn);
    c.final_summary();
    exit_on_error("networks", outcome);
}
