//! LSTM benchmarks, with the operation names and shapes of `benches/pytorch/nn_ops.py` (and of
//! `shared/gpu/reference/torch_*.py`), so the two can be read side by side.
//!
//! A 2-layer LSTM, input and hidden size 512, 100 steps, batch 64, f32, sequence-major, no
//! initial states, default math (cuDNN may use TF32 tensor cores, as PyTorch does with its
//! default `torch.backends.cudnn.allow_tf32 = True`), the standard algorithm (what PyTorch picks
//! for this shape):
//! * `lstm_2x512_T100_B64_fp32_fwd`: [`Rnn::forward_inference`] writing `y`, `hy` and `cy`
//!   (PyTorch's `lstm(xs)` under `no_grad`);
//! * `lstm_2x512_T100_B64_fp32_fwd_bwd`: [`Rnn::forward_training_reuse`] (the reserve of the
//!   previous iteration is reused, as PyTorch's caching allocator would), then
//!   [`Rnn::backward_data`] (`dy` given, `dx` computed) and [`Rnn::backward_weights`]
//!   (overwrite) — PyTorch's `lstm(xs)[0].sum().backward()` with `xs.requires_grad`.
//!
//! Before each benchmark a JSON line in the PyTorch script's format gives the per-call device
//! time from CUDA events (median of 5 batches of about 25 ms, after a warm-up call), e.g.
//! `{"op": "lstm_2x512_T100_B64_fp32_fwd", "ms": 3.1, "impl": "cudnn-safe"}`, with the PyTorch
//! figures of the issue for reference (`4.1` then `3.23` ms forward, `12.9` ms forward +
//! backward, PyTorch 2.11 on the H200). Criterion then measures the same calls with CUDA events
//! (`iter_custom`). With `RNN_BENCH_FMA=1` two more JSON lines give the same operations in
//! strict fp32 (`MathType::Fma`, PyTorch's `allow_tf32 = False`), outside criterion.
//!
//! A filter argument selects benchmarks as criterion does (ids `rnn/<op>`); data are only set up
//! when an operation is selected, and `--list` sets up nothing. Without a GPU (no driver, no
//! device, no cuDNN) it prints `no GPU: <why>` and exits cleanly.
mod common;

use std::sync::Arc;

use common::{
    exit_on_error, list_only, median_ms, print_header, print_op_error, sample_size, setup_or_skip,
    timed_iters, values, Args, BoxResult,
};
use criterion::Criterion;
use cudnn_safe::conv::MathType;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::rnn::{
    BackwardData, BackwardWeights, CellMode, Forward, Rnn, RnnReserve, SeqDataDesc, SeqLayout,
};
use cudnn_safe::{Cudnn, Workspace};

/// Criterion group of every benchmark here.
const GROUP: &str = "rnn";
const FWD: &str = "lstm_2x512_T100_B64_fp32_fwd";
const FWD_BWD: &str = "lstm_2x512_T100_B64_fp32_fwd_bwd";
/// The PyTorch figures the issue quotes for each operation (ms on the H200).
const PYTORCH_MS: [(&str, &str); 2] = [(FWD, "4.1, later 3.23"), (FWD_BWD, "12.9")];

const LAYERS: i64 = 2;
const INPUT: i64 = 512;
const HIDDEN: i64 = 512;
const STEPS: i64 = 100;
const BATCH: i64 = 64;

/// The network, its data and every buffer the two operations use.
struct Lstm {
    rnn: Rnn<f32>,
    x_d: SeqDataDesc<f32>,
    y_d: SeqDataDesc<f32>,
    x: CudaSlice<f32>,
    y: CudaSlice<f32>,
    w: CudaSlice<f32>,
    hy: CudaSlice<f32>,
    cy: CudaSlice<f32>,
    dy: CudaSlice<f32>,
    dx: CudaSlice<f32>,
    dw: CudaSlice<f32>,
    ws: Workspace,
    reserve: Option<RnnReserve<f32>>,
}

impl Lstm {
    fn new(stream: &Arc<CudaStream>, cudnn: &Cudnn, math: MathType) -> BoxResult<Lstm> {
        let rnn = Rnn::<f32>::builder(CellMode::Lstm, INPUT, HIDDEN)
            .layers(LAYERS)
            .math(math)
            .build(cudnn)?;
        let x_d = SeqDataDesc::uniform(SeqLayout::SeqMajor, STEPS, BATCH, INPUT)?;
        let y_d = SeqDataDesc::uniform(SeqLayout::SeqMajor, STEPS, BATCH, rnn.output_size())?;
        // PyTorch's initialisation range, ±1/sqrt(hidden).
        let k = 1.0 / (HIDDEN as f64).sqrt();
        Ok(Lstm {
            x: stream.clone_htod(&values::<f32>(x_d.span(), 1.0))?,
            y: stream.alloc_zeros::<f32>(y_d.span())?,
            w: stream.clone_htod(&values::<f32>(rnn.weight_space_len(), k))?,
            hy: stream.alloc_zeros::<f32>(rnn.hidden_state_len(BATCH))?,
            cy: stream.alloc_zeros::<f32>(rnn.cell_state_len(BATCH))?,
            dy: stream.clone_htod(&vec![1.0f32; y_d.span()])?,
            dx: stream.alloc_zeros::<f32>(x_d.span())?,
            dw: stream.alloc_zeros::<f32>(rnn.weight_space_len())?,
            ws: Workspace::new(stream.clone()),
            reserve: None,
            rnn,
            x_d,
            y_d,
        })
    }

    fn forward(&mut self, cudnn: &Cudnn) -> BoxResult<()> {
        let args = Forward::new(&self.x_d, &self.x, &self.y_d, &mut self.y, &self.w)
            .hy(&mut self.hy)
            .cy(&mut self.cy);
        Ok(self.rnn.forward_inference(cudnn, args, &mut self.ws)?)
    }

    fn forward_backward(&mut self, cudnn: &Cudnn) -> BoxResult<()> {
        let args = Forward::new(&self.x_d, &self.x, &self.y_d, &mut self.y, &self.w);
        let mut reserve = match self.reserve.take() {
            Some(old) => self
                .rnn
                .forward_training_reuse(cudnn, args, &mut self.ws, old)?,
            None => self.rnn.forward_training(cudnn, args, &mut self.ws)?,
        };
        self.rnn.backward_data(
            cudnn,
            &mut reserve,
            BackwardData::new(
                &self.y_d,
                &self.y,
                &self.dy,
                &self.x_d,
                &mut self.dx,
                &self.w,
            ),
            &mut self.ws,
        )?;
        self.rnn.backward_weights(
            cudnn,
            &mut reserve,
            BackwardWeights::new(&self.x_d, &self.x, &self.y_d, &self.y, &mut self.dw),
            &mut self.ws,
        )?;
        self.reserve = Some(reserve);
        Ok(())
    }
}

/// Runs one selected operation: a checked first call, the JSON line, then criterion. An
/// operation whose first call fails prints a JSON line with the error instead.
fn bench_op(
    c: &mut Criterion,
    args: &Args,
    stream: &CudaStream,
    op: &'static str,
    call: &mut dyn FnMut() -> BoxResult<()>,
) {
    let ms = match call().and_then(|()| median_ms(stream, args.test, &mut *call)) {
        Ok(ms) => ms,
        Err(e) => {
            print_op_error(op, &e);
            return;
        }
    };
    let pytorch = PYTORCH_MS
        .iter()
        .find(|(o, _)| *o == op)
        .map_or("?", |(_, ms)| ms);
    println!(
        "{{\"op\": \"{op}\", \"ms\": {ms:.4}, \"impl\": \"cudnn-safe\", \"pytorch_ms_in_issue\": \"{pytorch}\"}}"
    );
    let mut g = c.benchmark_group(GROUP);
    g.sample_size(sample_size(ms));
    g.bench_function(op, |b| {
        b.iter_custom(|iters| timed_iters(stream, iters, &mut *call))
    });
    g.finish();
}

fn run(c: &mut Criterion, args: &Args, stream: &Arc<CudaStream>, cudnn: &Cudnn) -> BoxResult<()> {
    let selected: Vec<&'static str> = [FWD, FWD_BWD]
        .into_iter()
        .filter(|op| args.runs(&format!("{GROUP}/{op}")))
        .collect();
    for op in [FWD, FWD_BWD] {
        if !selected.contains(&op) {
            list_only(c, GROUP, &[op]);
        }
    }
    if selected.is_empty() {
        return Ok(());
    }
    let mut lstm = Lstm::new(stream, cudnn, MathType::Default)?;
    println!(
        "{{\"setup\": \"LSTM {LAYERS}x{HIDDEN}, input {INPUT}, T {STEPS}, B {BATCH}, f32, math {}\", \"weight_space_bytes\": {}}}",
        lstm.rnn.math().name(),
        lstm.rnn.weight_space_bytes()
    );
    if selected.contains(&FWD) {
        bench_op(c, args, stream, FWD, &mut || lstm.forward(cudnn));
    }
    if selected.contains(&FWD_BWD) {
        bench_op(c, args, stream, FWD_BWD, &mut || {
            lstm.forward_backward(cudnn)
        });
    }
    if std::env::var("RNN_BENCH_FMA").as_deref() == Ok("1") {
        drop(lstm);
        let mut strict = Lstm::new(stream, cudnn, MathType::Fma)?;
        for (op, fwd_only) in [(FWD, true), (FWD_BWD, false)] {
            let mut call = || {
                if fwd_only {
                    strict.forward(cudnn)
                } else {
                    strict.forward_backward(cudnn)
                }
            };
            let ms = call().and_then(|()| median_ms(stream, args.test, &mut call))?;
            println!("{{\"op\": \"{op}_fma\", \"ms\": {ms:.4}, \"impl\": \"cudnn-safe\"}}");
        }
    }
    Ok(())
}

fn main() {
    let _ = env_logger::try_init();
    let Some((stream, cudnn)) = setup_or_skip() else {
        return;
    };
    print_header(&stream, &cudnn);
    let args = Args::parse();
    let mut c = Criterion::default().configure_from_args();
    let outcome = run(&mut c, &args, &stream, &cudnn);
    c.final_summary();
    exit_on_error("rnn", outcome);
}
