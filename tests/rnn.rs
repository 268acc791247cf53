//! Tests of the RNN family (`cudnn_safe::rnn`): forward outputs and final states of ReLU / tanh
//! RNNs, LSTMs (with and without projection) and GRUs against the f64 CPU reference in
//! `rnn_reference`, for one and two layers, one and two directions, variable-length batches in
//! the padded sequence-major, padded batch-major and packed layouts, in f64, f32, f16 and bf16;
//! gradients (backward data and backward weights, overwrite and accumulate) against central
//! differences of the reference in f64; the PyTorch state-dict round trip; and the checks that
//! reject a call before launch (lengths beyond the maximum, a weight space of the wrong size, a
//! reserve from another call, ...), which must leave sentinel-filled outputs untouched.
//!
//! Conventions: inputs are random (seeded), rounded to the tensor type before the reference
//! sees them; outputs are poisoned with NaN before each call so that unwritten elements show;
//! padding positions of padded outputs must hold the descriptor's fill value; padding of inputs
//! holds a finite junk value the RNN must ignore.
//!
//! Host-only tests (builder and sequence-descriptor validation against the real cuDNN library)
//! run without a GPU; GPU tests print `skipping: <why>` without one (or fail when
//! `CUDNN_SAFE_REQUIRE_GPU=1`).
mod common;
mod rnn_reference;

use std::sync::Arc;

use common::*;
use rnn_reference as reference;

use cudnn_safe::conv::MathType;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::dropout::Dropout;
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::rnn::{
    BackwardData, BackwardWeights, BiasMode, CellMode, Direction, Forward, ForwardMode, InputMode,
    ParamKind, Rnn, RnnAlgo, RnnBuilder, RnnReserve, SeqDataDesc, SeqLayout, WeightGradMode,
};
use cudnn_safe::{Cudnn, DType, DataType, Error, StatusFamily, Workspace};

/// What cuDNN must write into padding positions of padded outputs (exact in every type).
const FILL: f64 = -7.5;
/// What padding positions of inputs hold: finite junk the RNN must not read.
const INPUT_JUNK: f64 = 5.25;

/// Sequence lengths as the sequence descriptors take them (dimensions are `i64`).
fn i64s(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&l| l as i64).collect()
}

/// Where value `v` of step `t` of sequence `b` is stored (host-side indices are `usize`).
fn at<T: DataType>(desc: &SeqDataDesc<T>, t: usize, b: usize, v: usize) -> Option<usize> {
    desc.offset(t as i64, b as i64, v as i64)
}

// ---------------------------------------------------------------------------------------------
// Problem description shared by the crate and the reference
// ---------------------------------------------------------------------------------------------

/// One network shape, convertible to a crate builder and to a reference configuration.
#[derive(Clone, Copy, Debug)]
struct Case {
    cell: CellMode,
    input: usize,
    hidden: usize,
    layers: usize,
    bidir: bool,
    /// 0 = no projection (LSTM only).
    proj: usize,
    bias: BiasMode,
    skip: bool,
}

impl Case {
    fn new(cell: CellMode, input: usize, hidden: usize) -> Case {
        Case {
            cell,
            input,
            hidden,
            layers: 1,
            bidir: false,
            proj: 0,
            bias: BiasMode::Double,
            skip: false,
        }
    }
    fn layers(mut self, n: usize) -> Case {
        self.layers = n;
        self
    }
    fn bidir(mut self) -> Case {
        self.bidir = true;
        self
    }
    fn proj(mut self, p: usize) -> Case {
        self.proj = p;
        self
    }
    fn bias(mut self, b: BiasMode) -> Case {
        self.bias = b;
        self
    }
    fn skip(mut self) -> Case {
        self.skip = true;
        self
    }

    fn reference(&self) -> reference::Config {
        let cell = match self.cell {
            CellMode::Relu => reference::CellKind::RnnRelu,
            CellMode::Tanh => reference::CellKind::RnnTanh,
            CellMode::Lstm => reference::CellKind::Lstm,
            CellMode::Gru => reference::CellKind::Gru,
        };
        let bias = match self.bias {
            BiasMode::NoBias => reference::BiasMode::NoBias,
            BiasMode::SingleInput => reference::BiasMode::SingleInput,
            BiasMode::SingleRecurrent => reference::BiasMode::SingleRecurrent,
            BiasMode::Double => reference::BiasMode::Double,
        };
        reference::Config::new(cell, self.input, self.hidden)
            .layers(self.layers)
            .bidirectional(self.bidir)
            .bias(bias)
            .proj(self.proj)
            .skip_input(self.skip)
    }

    fn builder<T: DataType>(&self) -> RnnBuilder<T> {
        let mut b = Rnn::<T>::builder(self.cell, self.input as i64, self.hidden as i64)
            .layers(self.layers as i64)
            .bias(self.bias);
        if self.bidir {
            b = b.bidirectional();
        }
        if self.proj > 0 {
            b = b.proj_size(self.proj as i64);
        }
        if self.skip {
            b = b.input_mode(InputMode::Skip);
        }
        // Strict fp32 arithmetic so that f32 results can be held to fp32 tolerances.
        if T::DTYPE == DType::F32 {
            b = b.math(MathType::Fma);
        }
        b
    }

    fn label(&self) -> String {
        format!(
            "{:?} in{} h{} L{}{}{}{} {:?}",
            self.cell,
            self.input,
            self.hidden,
            self.layers,
            if self.bidir { " bi" } else { "" },
            if self.proj > 0 {
                format!(" proj{}", self.proj)
            } else {
                String::new()
            },
            if self.skip { " skip" } else { "" },
            self.bias
        )
    }
}

/// The reference's parameters rounded to `T`: the tensors handed to the crate, and the values as
/// stored (what the reference must compute with).
fn rounded_params<T: DataType>(
    params: &[reference::Param],
) -> (Vec<(String, Vec<T>)>, Vec<reference::Param>) {
    let typed: Vec<(String, Vec<T>)> = params
        .iter()
        .map(|(n, _, d)| (n.clone(), d.iter().map(|&v| T::from_f64(v)).collect()))
        .collect();
    let stored = params
        .iter()
        .zip(&typed)
        .map(|((n, s, _), (_, t))| (n.clone(), s.clone(), to_f64(t)))
        .collect();
    (typed, stored)
}

fn as_state<T>(typed: &[(String, Vec<T>)]) -> Vec<(&str, &[T])> {
    typed
        .iter()
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect()
}

fn round_vec<T: DataType>(v: &[f64]) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
    let s = to_f64(&t);
    (t, s)
}

/// Sequences rounded to `T` (what the reference must see).
fn round_seqs<T: DataType>(seqs: &reference::Seqs) -> reference::Seqs {
    seqs.iter()
        .map(|s| {
            s.iter()
                .map(|v| v.iter().map(|&x| T::from_f64(x).to_f64()).collect())
                .collect()
        })
        .collect()
}

/// A device image of `seqs` laid out by `desc`; padding positions hold `junk`.
fn place<T: DataType>(desc: &SeqDataDesc<T>, seqs: &reference::Seqs, junk: f64) -> Vec<T> {
    let mut out = vec![T::from_f64(junk); desc.span()];
    for (b, seq) in seqs.iter().enumerate() {
        assert_eq!(Some(seq.len() as i64), desc.length(b as i64));
        for (t, step) in seq.iter().enumerate() {
            for (v, &x) in step.iter().enumerate() {
                out[at(desc, t, b, v).unwrap()] = T::from_f64(x);
            }
        }
    }
    out
}

/// Checks a downloaded output laid out by `desc` against `want` (valid steps) and, in padded
/// layouts, every padding position against the fill value.
fn check_seq_output<T: DataType>(
    what: &str,
    desc: &SeqDataDesc<T>,
    got: &[T],
    want: &reference::Seqs,
    tol: f64,
) {
    assert_eq!(got.len(), desc.span(), "{what}: buffer length");
    let mut picked = Vec::new();
    let mut expect = Vec::new();
    for (b, seq) in want.iter().enumerate() {
        for (t, step) in seq.iter().enumerate() {
            for (v, &w) in step.iter().enumerate() {
                picked.push(got[at(desc, t, b, v).unwrap()]);
                expect.push(w);
            }
        }
    }
    assert_close(what, &picked, &expect, tol);
    if desc.layout().is_padded() {
        for b in 0..desc.batch() {
            for t in desc.length(b).unwrap()..desc.max_len() {
                for v in 0..desc.vector_size() {
                    let g = got[desc.offset(t, b, v).unwrap()].to_f64();
                    assert_eq!(
                        g,
                        T::from_f64(FILL).to_f64(),
                        "{what}: padding at step {t} of sequence {b} (length {:?})",
                        desc.length(b)
                    );
                }
            }
        }
    }
}

/// Reads a downloaded buffer laid out by `desc` back into sequences (valid steps only).
fn extract<T: DataType>(desc: &SeqDataDesc<T>, buf: &[T]) -> reference::Seqs {
    (0..desc.batch())
        .map(|b| {
            (0..desc.length(b).unwrap())
                .map(|t| {
                    (0..desc.vector_size())
                        .map(|v| buf[desc.offset(t, b, v).unwrap()].to_f64())
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn flatten(seqs: &reference::Seqs) -> Vec<f64> {
    seqs.iter().flatten().flatten().copied().collect()
}

fn upload<T: DataType>(stream: &Arc<CudaStream>, v: &[T]) -> CudaSlice<T> {
    stream.clone_htod(v).unwrap()
}

/// Whether `e` is a cuDNN refusal of an unsupported configuration (for the bf16 cases, which
/// cuDNN may not run).
fn is_unsupported(e: &Error) -> bool {
    matches!(
        e.status().map(|s| s.family()),
        Some(StatusFamily::NotSupported | StatusFamily::BadParam)
    )
}

/// The reference parameters the network has (by name), checking that the network has no
/// parameter the reference lacks. The only reference parameters a network may lack are the
/// first layer's input biases under skip input (cuDNN decides whether it keeps them).
fn params_of_network<T: DataType>(
    rnn: &Rnn<T>,
    case: &Case,
    params: &[reference::Param],
) -> Vec<reference::Param> {
    let have = rnn.pytorch_params();
    for p in &have {
        let r = params.iter().find(|(n, _, _)| *n == p.name);
        let r = r.unwrap_or_else(|| {
            panic!(
                "{}: cuDNN has `{}`, the reference not",
                case.label(),
                p.name
            )
        });
        assert_eq!(r.1, p.shape, "{}: shape of `{}`", case.label(), p.name);
    }
    let kept: Vec<reference::Param> = params
        .iter()
        .filter(|(n, _, _)| have.iter().any(|p| p.name == *n))
        .cloned()
        .collect();
    for (n, _, _) in params
        .iter()
        .filter(|(n, _, _)| !have.iter().any(|p| p.name == *n))
    {
        assert!(
            case.skip && n.starts_with("bias_ih_l0"),
            "{}: the network lacks `{n}`",
            case.label()
        );
    }
    kept
}

/// Runs `case` forward (inference, then training without dropout, which must agree) over a
/// batch of sequences of lengths `lens` in `layout`, from random initial states (`with_states`)
/// or zeros, and checks `y` (valid steps and padding), `hy` and `cy` against the reference.
#[allow(clippy::too_many_arguments)]
fn check_forward<T: DataType>(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    case: Case,
    layout: SeqLayout,
    lens: &[usize],
    with_states: bool,
    tol: f64,
    seed: u64,
) -> Result<(), Error> {
    let rc = case.reference();
    let rnn = case
        .builder::<T>()
        .padded_io(layout.is_padded())
        .build(cudnn)?;
    assert_eq!(rnn.output_size() as usize, rc.y_width(), "{}", case.label());
    let params = reference::random_params(&rc, seed);
    let params = params_of_network(&rnn, &case, &params);
    let (typed, stored) = rounded_params::<T>(&params);
    let w = upload(stream, &rnn.weights_from_pytorch(&as_state(&typed))?);
    let max_len = *lens.iter().max().unwrap();
    let batch = lens.len();
    let lstm = case.cell == CellMode::Lstm;
    let x_seqs = round_seqs::<T>(&reference::random_input(&rc, lens, seed + 1));
    let (max_len, input, lens_d) = (max_len as i64, case.input as i64, i64s(lens));
    let x_d = SeqDataDesc::<T>::new(layout, max_len, input, &lens_d, T::from_f64(FILL))?;
    let y_d = SeqDataDesc::<T>::new(
        layout,
        max_len,
        rnn.output_size(),
        &lens_d,
        T::from_f64(FILL),
    )?;
    let x = upload(stream, &place(&x_d, &x_seqs, INPUT_JUNK));
    let (h0, c0) = reference::random_states(&rc, batch, seed + 2);
    let (h0_t, h0_s) = round_vec::<T>(&h0);
    let (c0_t, c0_s) = round_vec::<T>(&c0);
    let hx = upload(stream, &h0_t);
    let cx = lstm.then(|| upload(stream, &c0_t));
    let want = reference::forward(
        &rc,
        &stored,
        &x_seqs,
        with_states.then_some(&h0_s[..]),
        (with_states && lstm).then_some(&c0_s[..]),
    );
    let mut ws = Workspace::new(stream.clone());
    for mode in [ForwardMode::Inference, ForwardMode::Training] {
        let label = format!("{} {} {layout:?} {mode:?}", case.label(), T::DTYPE);
        let mut y = poisoned_buffer::<T>(stream, y_d.span());
        let mut hy = poisoned_buffer::<T>(stream, rnn.hidden_state_len(batch as i64));
        let mut cy = poisoned_buffer::<T>(stream, rnn.cell_state_len(batch as i64));
        let mut args = Forward::new(&x_d, &x, &y_d, &mut y, &w).hy(&mut hy);
        if with_states {
            args = args.hx(&hx);
            if let Some(cx) = &cx {
                args = args.cx(cx);
            }
        }
        if lstm {
            args = args.cy(&mut cy);
        }
        match mode {
            ForwardMode::Inference => rnn.forward_inference(cudnn, args, &mut ws)?,
            ForwardMode::Training => {
                let reserve = rnn.forward_training(cudnn, args, &mut ws)?;
                assert!(reserve.size_in_bytes() > 0, "{label}: empty reserve");
            }
        }
        check_seq_output(
            &format!("{label}: y"),
            &y_d,
            &download(stream, &y),
            &want.y,
            tol,
        );
        assert_close(
            &format!("{label}: hy"),
            &download(stream, &hy),
            &want.h_n,
            tol,
        );
        if lstm {
            assert_close(
                &format!("{label}: cy"),
                &download(stream, &cy),
                &want.c_n,
                tol,
            );
        }
    }
    Ok(())
}

/// The cell shapes every dtype runs.
fn forward_cases() -> Vec<Case> {
    vec![
        Case::new(CellMode::Relu, 3, 4),
        Case::new(CellMode::Tanh, 3, 4).layers(2).bidir(),
        Case::new(CellMode::Lstm, 3, 5).layers(2),
        Case::new(CellMode::Lstm, 4, 5).layers(2).bidir(),
        Case::new(CellMode::Lstm, 3, 6).layers(2).bidir().proj(3),
        Case::new(CellMode::Gru, 3, 4).layers(2).bidir(),
        Case::new(CellMode::Gru, 5, 3),
    ]
}

/// Variable lengths per layout (packed lengths sorted, as cuDNN requires).
fn layouts() -> Vec<(SeqLayout, Vec<usize>)> {
    vec![
        (SeqLayout::SeqMajor, vec![3, 5, 1, 4]),
        (SeqLayout::BatchMajor, vec![2, 4, 4]),
        (SeqLayout::Packed, vec![5, 3, 3, 1]),
    ]
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

#[test]
fn forward_f64_matches_reference() {
    let Some((stream, cudnn)) = gpu() else { return };
    // Many layers and steps of f64 rounding, each far below 1e-14 relative.
    let tol = 10.0 * tol::<f64>();
    for (i, case) in forward_cases().into_iter().enumerate() {
        for (j, (layout, lens)) in layouts().into_iter().enumerate() {
            let seed = 100 + 10 * i as u64 + j as u64;
            check_forward::<f64>(
                &stream,
                &cudnn,
                case,
                layout,
                &lens,
                (i + j) % 2 == 0,
                tol,
                seed,
            )
            .unwrap();
        }
    }
}

#[test]
fn forward_f64_bias_and_input_modes() {
    let Some((stream, cudnn)) = gpu() else { return };
    let tol = 10.0 * tol::<f64>();
    let cases = [
        Case::new(CellMode::Lstm, 3, 4).bias(BiasMode::NoBias),
        Case::new(CellMode::Gru, 3, 4)
            .layers(2)
            .bias(BiasMode::SingleInput),
        Case::new(CellMode::Lstm, 3, 4)
            .bidir()
            .bias(BiasMode::SingleRecurrent),
        Case::new(CellMode::Tanh, 3, 4).bias(BiasMode::SingleRecurrent),
        Case::new(CellMode::Lstm, 4, 4).layers(2).skip(),
        Case::new(CellMode::Gru, 4, 4)
            .bidir()
            .skip()
            .bias(BiasMode::NoBias),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        check_forward::<f64>(
            &stream,
            &cudnn,
            case,
            SeqLayout::SeqMajor,
            &[4, 2, 3],
            true,
            tol,
            300 + i as u64,
        )
        .unwrap();
    }
}

#[test]
fn forward_f32_matches_reference() {
    let Some((stream, cudnn)) = gpu() else { return };
    // Strict FMA arithmetic, rounded to f32 at every step of the recurrence.
    let tol = 4.0 * tol::<f32>();
    for (i, case) in forward_cases().into_iter().enumerate() {
        for (j, (layout, lens)) in layouts().into_iter().enumerate() {
            let seed = 400 + 10 * i as u64 + j as u64;
            check_forward::<f32>(
                &stream,
                &cudnn,
                case,
                layout,
                &lens,
                (i + j) % 2 == 1,
                tol,
                seed,
            )
            .unwrap();
        }
    }
}

#[test]
fn forward_f16_matches_reference() {
    let Some((stream, cudnn)) = gpu() else { return };
    // f16 storage (between layers too) with f32 arithmetic.
    let tol = tol::<f16>();
    for (i, case) in forward_cases().into_iter().enumerate() {
        let (layout, lens) = layouts().swap_remove(i % 3);
        check_forward::<f16>(
            &stream,
            &cudnn,
            case,
            layout,
            &lens,
            true,
            tol,
            500 + i as u64,
        )
        .unwrap();
    }
}

#[test]
fn forward_bf16_matches_reference_where_supported() {
    let Some((stream, cudnn)) = gpu() else { return };
    let tol = tol::<bf16>();
    for (i, case) in forward_cases().into_iter().enumerate() {
        let (layout, lens) = layouts().swap_remove(i % 3);
        match check_forward::<bf16>(
            &stream,
            &cudnn,
            case,
            layout,
            &lens,
            true,
            tol,
            600 + i as u64,
        ) {
            Ok(()) => {}
            Err(e) if is_unsupported(&e) => {
                eprintln!("bf16 RNN not run by this cuDNN ({}): {e}", case.label());
                return;
            }
            Err(e) => panic!("{}: {e}", case.label()),
        }
    }
}

/// Packed data on a network built with padded I/O enabled (the default): cuDNN documents padded
/// I/O as *permitting* the unpacked layouts; whether it still takes packed data is cuDNN's call.
/// Either it computes the right result or it refuses with a cuDNN status.
#[test]
fn packed_data_with_padded_io_enabled_is_right_or_refused() {
    let Some((stream, cudnn)) = gpu() else { return };
    let case = Case::new(CellMode::Lstm, 3, 4).layers(2);
    let rc = case.reference();
    let rnn = case.builder::<f64>().build(&cudnn).unwrap();
    assert!(rnn.padded_io());
    let params = reference::random_params(&rc, 700);
    let state: Vec<(&str, &[f64])> = params
        .iter()
        .map(|(n, _, d)| (n.as_str(), &d[..]))
        .collect();
    let w = upload(&stream, &rnn.weights_from_pytorch(&state).unwrap());
    let lens = [4, 2, 1];
    let x_seqs = reference::random_input(&rc, &lens, 701);
    let x_d = SeqDataDesc::<f64>::new(SeqLayout::Packed, 4, 3, &i64s(&lens), 0.0).unwrap();
    let y_d = SeqDataDesc::<f64>::new(SeqLayout::Packed, 4, 4, &i64s(&lens), 0.0).unwrap();
    let x = upload(&stream, &place(&x_d, &x_seqs, INPUT_JUNK));
    let mut y = poisoned_buffer::<f64>(&stream, y_d.span());
    let mut ws = Workspace::new(stream.clone());
    match rnn.forward_inference(&cudnn, Forward::new(&x_d, &x, &y_d, &mut y, &w), &mut ws) {
        Ok(()) => {
            let want = reference::forward(&rc, &params, &x_seqs, None, None);
            check_seq_output(
                "packed, padded I/O on",
                &y_d,
                &download(&stream, &y),
                &want.y,
                1e-11,
            );
        }
        Err(e) => {
            assert!(e.status().is_some(), "only cuDNN may refuse this: {e}");
            eprintln!("cuDNN refuses packed data with padded I/O enabled: {e}");
        }
    }
}

#[test]
fn dropout_applies_in_training_only() {
    let Some((stream, cudnn)) = gpu() else { return };
    let case = Case::new(CellMode::Lstm, 3, 8).layers(3);
    let rc = case.reference();
    let dropout = Dropout::new(&cudnn, 0.5, 1234).unwrap();
    let rnn = case
        .builder::<f64>()
        .dropout(dropout)
        .build(&cudnn)
        .unwrap();
    let params = reference::random_params(&rc, 800);
    let state: Vec<(&str, &[f64])> = params
        .iter()
        .map(|(n, _, d)| (n.as_str(), &d[..]))
        .collect();
    let w = upload(&stream, &rnn.weights_from_pytorch(&state).unwrap());
    let lens = [5, 3, 4];
    let x_seqs = reference::random_input(&rc, &lens, 801);
    let x_d = SeqDataDesc::<f64>::new(SeqLayout::SeqMajor, 5, 3, &i64s(&lens), FILL).unwrap();
    let y_d = SeqDataDesc::<f64>::new(SeqLayout::SeqMajor, 5, 8, &i64s(&lens), FILL).unwrap();
    let x = upload(&stream, &place(&x_d, &x_seqs, INPUT_JUNK));
    let want = reference::forward(&rc, &params, &x_seqs, None, None);
    let mut ws = Workspace::new(stream.clone());

    let mut y = poisoned_buffer::<f64>(&stream, y_d.span());
    rnn.forward_inference(&cudnn, Forward::new(&x_d, &x, &y_d, &mut y, &w), &mut ws)
        .unwrap();
    check_seq_output(
        "dropout, inference",
        &y_d,
        &download(&stream, &y),
        &want.y,
        1e-11,
    );

    let mut y = poisoned_buffer::<f64>(&stream, y_d.span());
    let _reserve = rnn
        .forward_training(&cudnn, Forward::new(&x_d, &x, &y_d, &mut y, &w), &mut ws)
        .unwrap();
    let got = extract(&y_d, &download(&stream, &y));
    let (got, want) = (flatten(&got), flatten(&want.y));
    assert!(
        got.iter().all(|v| v.is_finite()),
        "training output not finite"
    );
    let max_diff = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f64::max);
    assert!(
        max_diff > 1e-6,
        "dropout 0.5 between three layers changed nothing in training (max diff {max_diff})"
    );
}

// ---------------------------------------------------------------------------------------------
// Weight layout and the PyTorch state dict
// ---------------------------------------------------------------------------------------------

#[test]
fn weight_layout_matches_pytorch_and_round_trips() {
    let Some((stream, cudnn)) = gpu() else { return };
    let cases = [
        Case::new(CellMode::Relu, 3, 4).layers(2),
        Case::new(CellMode::Tanh, 5, 4).bidir(),
        Case::new(CellMode::Lstm, 3, 6).layers(2).bidir().proj(2),
        Case::new(CellMode::Lstm, 7, 5).layers(3),
        Case::new(CellMode::Gru, 3, 4).layers(2).bidir(),
        Case::new(CellMode::Gru, 3, 4).bias(BiasMode::NoBias),
    ];
    for (i, case) in cases.into_iter().enumerate() {
        let label = case.label();
        let rc = case.reference();
        let rnn = case.builder::<f32>().build(&cudnn).unwrap();
        // Same tensors, same shapes, same order as PyTorch.
        let names: Vec<(String, Vec<usize>)> = rnn
            .pytorch_params()
            .into_iter()
            .map(|p| (p.name, p.shape))
            .collect();
        assert_eq!(names, reference::param_shapes(&rc), "{label}");
        // Every parameter inside the space, none overlapping another, with the gate sizes.
        let len = rnn.weight_space_len();
        let mut covered = vec![false; len];
        let (g, h) = (case.cell.gate_count(), case.hidden);
        for p in rnn.weight_params() {
            assert!(p.range().end <= len, "{label}: {p:?} outside the space");
            for e in p.range() {
                assert!(
                    !std::mem::replace(&mut covered[e], true),
                    "{label}: overlap at {e}"
                );
            }
            let out = if case.proj > 0 { case.proj } else { h };
            let want = match p.kind {
                ParamKind::InputWeight => (h, rc.layer_input_size(p.layer)),
                ParamKind::RecurrentWeight => (h, out),
                ParamKind::InputBias | ParamKind::RecurrentBias => (h, 1),
                ParamKind::ProjectionWeight => (out, h),
            };
            assert_eq!((p.rows, p.cols), want, "{label}: {p:?}");
            assert_eq!(
                p.pseudo_layer,
                p.layer * rnn.directions() as usize
                    + usize::from(p.direction == Direction::Reverse)
            );
            assert!(p.lin_id < 2 * g + 1);
        }
        assert_eq!(rnn.weight_params().len(), {
            let per_dir_layer = 2 * g
                + if case.bias == BiasMode::NoBias {
                    0
                } else {
                    2 * g
                }
                + usize::from(case.proj > 0);
            per_dir_layer * case.layers * rnn.directions() as usize
        });
        // Gate lookup: the LSTM forget gate of the reverse direction, the GRU update gate.
        if case.cell == CellMode::Lstm && case.bidir {
            let p = rnn
                .param(
                    1,
                    Direction::Reverse,
                    ParamKind::RecurrentWeight,
                    cudnn_safe::rnn::Gate::Forget,
                )
                .unwrap();
            assert_eq!(p.lin_id, 5);
        }
        // Host → device → host keeps every PyTorch tensor.
        let params = reference::random_params(&rc, 900 + i as u64);
        let (typed, _) = rounded_params::<f32>(&params);
        let image = rnn.weights_from_pytorch(&as_state(&typed)).unwrap();
        assert_eq!(image.len(), len);
        let back = download(&stream, &upload(&stream, &image));
        assert_eq!(rnn.weights_to_pytorch(&back).unwrap(), typed, "{label}");
    }
}

// ---------------------------------------------------------------------------------------------
// Backward data and weights against finite differences
// ---------------------------------------------------------------------------------------------

/// Runs forward (training, then again reusing the first reserve), backward data and backward
/// weights (overwrite, then accumulate) in f64 and checks `dx`, `dhx`, `dcx` and the weight
/// gradient against central differences of the reference's weighted sum
/// `Σ y·dy + Σ hy·dhy + Σ cy·dcy`.
fn check_gradients(
    stream: &Arc<CudaStream>,
    cudnn: &Cudnn,
    case: Case,
    layout: SeqLayout,
    lens: &[usize],
    with_states: bool,
    seed: u64,
) {
    let label = format!("{} {layout:?}", case.label());
    let rc = case.reference();
    let rnn = case
        .builder::<f64>()
        .padded_io(layout.is_padded())
        .build(cudnn)
        .unwrap();
    let params = reference::random_params(&rc, seed);
    let params = params_of_network(&rnn, &case, &params);
    let state: Vec<(&str, &[f64])> = params
        .iter()
        .map(|(n, _, d)| (n.as_str(), &d[..]))
        .collect();
    let w = upload(stream, &rnn.weights_from_pytorch(&state).unwrap());
    let max_len = *lens.iter().max().unwrap();
    let batch = lens.len();
    let lstm = case.cell == CellMode::Lstm;
    let x_seqs = reference::random_input(&rc, lens, seed + 1);
    let (max_len, input, lens_d) = (max_len as i64, case.input as i64, i64s(lens));
    let x_d = SeqDataDesc::<f64>::new(layout, max_len, input, &lens_d, FILL).unwrap();
    let y_d = SeqDataDesc::<f64>::new(layout, max_len, rnn.output_size(), &lens_d, FILL).unwrap();
    let x = upload(stream, &place(&x_d, &x_seqs, INPUT_JUNK));
    let (h0, c0) = reference::random_states(&rc, batch, seed + 2);
    let hx = upload(stream, &h0);
    let cx = upload(stream, &if lstm { c0.clone() } else { vec![0.0] });
    let lw = reference::random_loss_weights(&rc, lens, seed + 3);
    // The gradient of padding outputs is zero: they are constants.
    let dy = upload(stream, &place(&y_d, &lw.wy, 0.0));
    let dhy = upload(stream, &lw.wh);
    let dcy = upload(stream, &if lstm { lw.wc.clone() } else { vec![0.0] });
    let mut ws = Workspace::new(stream.clone());

    let forward = |y: &mut CudaSlice<f64>, ws: &mut Workspace, old: Option<RnnReserve<f64>>| {
        let mut args = Forward::new(&x_d, &x, &y_d, y, &w);
        if with_states {
            args = args.hx(&hx);
            if lstm {
                args = args.cx(&cx);
            }
        }
        match old {
            None => rnn.forward_training(cudnn, args, ws).unwrap(),
            Some(old) => rnn.forward_training_reuse(cudnn, args, ws, old).unwrap(),
        }
    };
    let mut y = poisoned_buffer::<f64>(stream, y_d.span());
    let first = forward(&mut y, &mut ws, None);
    let mut reserve = forward(&mut y, &mut ws, Some(first));

    let mut dx = poisoned_buffer::<f64>(stream, x_d.span());
    let mut dhx = poisoned_buffer::<f64>(stream, rnn.hidden_state_len(batch as i64));
    let mut dcx = poisoned_buffer::<f64>(stream, rnn.cell_state_len(batch as i64));
    let mut args = BackwardData::new(&y_d, &y, &dy, &x_d, &mut dx, &w)
        .dhy(&dhy)
        .dhx(&mut dhx);
    if with_states {
        args = args.hx(&hx);
        if lstm {
            args = args.cx(&cx);
        }
    }
    if lstm {
        args = args.dcy(&dcy).dcx(&mut dcx);
    }
    rnn.backward_data(cudnn, &mut reserve, args, &mut ws)
        .unwrap();
    assert!(reserve.backward_data_done());

    let mut dw = poisoned_buffer::<f64>(stream, rnn.weight_space_len());
    let mut wargs = BackwardWeights::new(&x_d, &x, &y_d, &y, &mut dw);
    if with_states {
        wargs = wargs.hx(&hx);
    }
    rnn.backward_weights(cudnn, &mut reserve, wargs, &mut ws)
        .unwrap();
    let dw_once = download(stream, &dw);

    let h0_ref = with_states.then_some(&h0[..]);
    let c0_ref = (with_states && lstm).then_some(&c0[..]);
    let num = reference::numeric_grads(&rc, &params, &x_seqs, h0_ref, c0_ref, &lw, 1e-6);
    // Central differences with a step of 1e-6 are good to about 1e-9 here.
    let tol = 1e-7;
    let got_dx = extract(&x_d, &download(stream, &dx));
    assert_close(
        &format!("{label}: dx"),
        &flatten(&got_dx),
        &flatten(&num.x),
        tol,
    );
    assert_close(
        &format!("{label}: dhx"),
        &download(stream, &dhx),
        &num.h0,
        tol,
    );
    if lstm {
        assert_close(
            &format!("{label}: dcx"),
            &download(stream, &dcx),
            &num.c0,
            tol,
        );
    }
    let dw_torch = rnn.weights_to_pytorch(&dw_once).unwrap();
    for ((name, _, _), want) in params.iter().zip(&num.params) {
        let got = &dw_torch.iter().find(|(n, _)| n == name).unwrap().1;
        assert_close(&format!("{label}: d{name}"), got, want, tol);
    }
    // Weight-space elements outside every parameter are not gradients; the others were all
    // written (the poison is gone).
    for p in rnn.weight_params() {
        assert!(
            dw_once[p.range()].iter().all(|v| v.is_finite()),
            "{label}: {p:?}"
        );
    }

    // Accumulate: a second pass adds the same gradient.
    let mut wargs =
        BackwardWeights::new(&x_d, &x, &y_d, &y, &mut dw).mode(WeightGradMode::Accumulate);
    if with_states {
        wargs = wargs.hx(&hx);
    }
    rnn.backward_weights(cudnn, &mut reserve, wargs, &mut ws)
        .unwrap();
    let dw_twice = download(stream, &dw);
    for p in rnn.weight_params() {
        let want: Vec<f64> = dw_once[p.range()].iter().map(|v| 2.0 * v).collect();
        assert_close(
            &format!("{label}: accumulated {p:?}"),
            &dw_twice[p.range()],
            &want,
            1e-12,
        );
    }
}

#[test]
fn gradients_match_finite_differences() {
    let Some((stream, cudnn)) = gpu() else { return };
    let runs = [
        (
            Case::new(CellMode::Lstm, 3, 4).layers(2).bidir(),
            SeqLayout::SeqMajor,
            vec![4, 2, 3],
            true,
        ),
        (
            Case::new(CellMode::Gru, 3, 4).layers(2),
            SeqLayout::Packed,
            vec![4, 3, 1],
            false,
        ),
        (
            Case::new(CellMode::Tanh, 3, 4).bidir(),
            SeqLayout::BatchMajor,
            vec![3, 1, 3],
            true,
        ),
        (
            Case::new(CellMode::Relu, 3, 4),
            SeqLayout::SeqMajor,
            vec![3, 3],
            true,
        ),
        (
            Case::new(CellMode::Lstm, 3, 5).layers(2).proj(3),
            SeqLayout::BatchMajor,
            vec![3, 2],
            true,
        ),
        (
            Case::new(CellMode::Gru, 3, 4)
                .bidir()
                .bias(BiasMode::SingleRecurrent),
            SeqLayout::Packed,
            vec![3, 3, 2],
            true,
        ),
    ];
    for (i, (case, layout, lens, states)) in runs.into_iter().enumerate() {
        check_gradients(
            &stream,
            &cudnn,
            case,
            layout,
            &lens,
            states,
            1000 + 10 * i as u64,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Rejections before launch
// ---------------------------------------------------------------------------------------------

/// A small LSTM and a padded batch to misuse.
struct Fixture {
    stream: Arc<CudaStream>,
    cudnn: Cudnn,
    rnn: Rnn<f32>,
    x_d: SeqDataDesc<f32>,
    y_d: SeqDataDesc<f32>,
    x: CudaSlice<f32>,
    w: CudaSlice<f32>,
    hx: CudaSlice<f32>,
    ws: Workspace,
}

const LENS: [i64; 3] = [3, 2, 3];

fn fixture() -> Option<Fixture> {
    let (stream, cudnn) = gpu()?;
    let rnn = Rnn::<f32>::builder(CellMode::Lstm, 3, 4)
        .layers(2)
        .build(&cudnn)
        .unwrap();
    let x_d = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 3, 3, &LENS, 0.0).unwrap();
    let y_d = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 3, 4, &LENS, 0.0).unwrap();
    let mut rng = Rng::new(77);
    let x = upload(&stream, &rng.values_in::<f32>(x_d.span(), -1.0, 1.0));
    let w = upload(
        &stream,
        &rng.values_in::<f32>(rnn.weight_space_len(), -0.5, 0.5),
    );
    let hx = upload(
        &stream,
        &rng.values_in::<f32>(rnn.hidden_state_len(3), -1.0, 1.0),
    );
    let ws = Workspace::new(stream.clone());
    Some(Fixture {
        stream,
        cudnn,
        rnn,
        x_d,
        y_d,
        x,
        w,
        hx,
        ws,
    })
}

fn rejected<T: std::fmt::Debug>(r: Result<T, Error>, kind: Kind, what: &str) {
    assert!(matches!(&r, Err(e) if kind(e)), "{what}: got {r:?}");
}

#[test]
fn forward_rejects_bad_arguments_before_launch() {
    let Some(mut f) = fixture() else { return };
    let s = &f.stream;
    let (mut y, y_before) = sentinel_buffer::<f32>(s, f.y_d.span());
    let batch = f.x_d.batch();

    // A weight space one element short, or one too long.
    let short_w = upload(s, &vec![0.1f32; f.rnn.weight_space_len() - 1]);
    let r = f.rnn.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &short_w),
        &mut f.ws,
    );
    rejected(r, kind!(BufferTooSmall), "short weight space");
    let long_w = upload(s, &vec![0.1f32; f.rnn.weight_space_len() + 1]);
    let r = f.rnn.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &long_w),
        &mut f.ws,
    );
    rejected(r, kind!(InvalidArgument), "long weight space");

    // Short input, short final state.
    let short_x = upload(s, &vec![0.1f32; f.x_d.span() - 1]);
    let r = f.rnn.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &short_x, &f.y_d, &mut y, &f.w),
        &mut f.ws,
    );
    rejected(r, kind!(BufferTooSmall), "short x");
    let (mut hy, hy_before) = sentinel_buffer::<f32>(s, f.rnn.hidden_state_len(batch) - 1);
    let r = f.rnn.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &f.w).hy(&mut hy),
        &mut f.ws,
    );
    rejected(r, kind!(BufferTooSmall), "short hy");
    assert_untouched("hy", s, &hy, &hy_before);
    let short_cx = upload(s, &vec![0.1f32; f.rnn.cell_state_len(batch) - 1]);
    let r = f.rnn.forward_training(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &f.w).cx(&short_cx),
        &mut f.ws,
    );
    rejected(r, kind!(BufferTooSmall), "short cx");

    // Shapes: input width, output width, sequences that differ between x and y.
    let x_wide = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 3, 4, &LENS, 0.0).unwrap();
    let x4 = upload(s, &vec![0.1f32; x_wide.span()]);
    let r = f.rnn.forward_inference(
        &f.cudnn,
        Forward::new(&x_wide, &x4, &f.y_d, &mut y, &f.w),
        &mut f.ws,
    );
    rejected(r, kind!(ShapeMismatch), "input width");
    let y_narrow = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 3, 3, &LENS, 0.0).unwrap();
    let r = f.rnn.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &y_narrow, &mut y, &f.w),
        &mut f.ws,
    );
    rejected(r, kind!(ShapeMismatch), "output width");
    let y_other = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 3, 4, &[3, 3, 2], 0.0).unwrap();
    let r = f.rnn.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &y_other, &mut y, &f.w),
        &mut f.ws,
    );
    rejected(r, kind!(ShapeMismatch), "x and y lengths differ");
    let y_bm = SeqDataDesc::<f32>::new(SeqLayout::BatchMajor, 3, 4, &LENS, 0.0).unwrap();
    let r = f.rnn.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &y_bm, &mut y, &f.w),
        &mut f.ws,
    );
    rejected(r, kind!(ShapeMismatch), "x and y layouts differ");

    // A workspace limit below what cuDNN asks for.
    let need = f
        .rnn
        .temp_space_sizes(&f.cudnn, ForwardMode::Inference, &f.x_d)
        .unwrap();
    if need.workspace > 0 {
        let mut tiny = Workspace::new(s.clone()).with_limit(need.workspace - 1);
        let r = f.rnn.forward_inference(
            &f.cudnn,
            Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &f.w),
            &mut tiny,
        );
        rejected(r, kind!(WorkspaceLimit), "workspace limit");
    }
    assert_untouched("y", s, &y, &y_before);

    // Cell states on a GRU; padded data on a network without padded I/O.
    let gru = Rnn::<f32>::builder(CellMode::Gru, 3, 4)
        .build(&f.cudnn)
        .unwrap();
    let gw = upload(s, &vec![0.1f32; gru.weight_space_len()]);
    let cx = upload(s, &vec![0.1f32; gru.cell_state_len(batch)]);
    let r = gru.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &gw).cx(&cx),
        &mut f.ws,
    );
    rejected(r, kind!(InvalidArgument), "cx on a GRU");
    let packed_only = Rnn::<f32>::builder(CellMode::Lstm, 3, 4)
        .layers(2)
        .padded_io(false)
        .build(&f.cudnn)
        .unwrap();
    let r = packed_only.forward_inference(
        &f.cudnn,
        Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &f.w),
        &mut f.ws,
    );
    rejected(
        r,
        kind!(InvalidArgument),
        "padded layout without padded I/O",
    );
    assert_untouched("y", s, &y, &y_before);

    // The same call with good arguments runs.
    let mut hy = poisoned_buffer::<f32>(s, f.rnn.hidden_state_len(batch));
    f.rnn
        .forward_inference(
            &f.cudnn,
            Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &f.w).hy(&mut hy),
            &mut f.ws,
        )
        .unwrap();
    assert!(download(s, &hy).iter().all(|v| v.is_finite()));
}

#[test]
fn backward_rejects_foreign_and_misordered_reserves() {
    let Some(mut f) = fixture() else { return };
    let s = f.stream.clone();
    let s = &s;
    let batch = f.x_d.batch();
    let sizes = f
        .rnn
        .temp_space_sizes(&f.cudnn, ForwardMode::Training, &f.x_d)
        .unwrap();
    assert!(sizes.reserve > 0);
    assert_eq!(
        f.rnn
            .temp_space_sizes(&f.cudnn, ForwardMode::Inference, &f.x_d)
            .unwrap()
            .reserve,
        0
    );

    let mut y = poisoned_buffer::<f32>(s, f.y_d.span());
    let mut reserve = f
        .rnn
        .forward_training(
            &f.cudnn,
            Forward::new(&f.x_d, &f.x, &f.y_d, &mut y, &f.w).hx(&f.hx),
            &mut f.ws,
        )
        .unwrap();
    assert_eq!(reserve.size_in_bytes(), sizes.reserve);
    // Another call's reserve: same shapes, other descriptors.
    let x_d2 = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 3, 3, &LENS, 0.0).unwrap();
    let y_d2 = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 3, 4, &LENS, 0.0).unwrap();
    let mut y2 = poisoned_buffer::<f32>(s, y_d2.span());
    let mut other = f
        .rnn
        .forward_training(
            &f.cudnn,
            Forward::new(&x_d2, &f.x, &y_d2, &mut y2, &f.w).hx(&f.hx),
            &mut f.ws,
        )
        .unwrap();
    // Another network's reserve over the same descriptors.
    let rnn2 = Rnn::<f32>::builder(CellMode::Lstm, 3, 4)
        .layers(2)
        .build(&f.cudnn)
        .unwrap();
    let mut y3 = poisoned_buffer::<f32>(s, f.y_d.span());
    let mut foreign = rnn2
        .forward_training(
            &f.cudnn,
            Forward::new(&f.x_d, &f.x, &f.y_d, &mut y3, &f.w).hx(&f.hx),
            &mut f.ws,
        )
        .unwrap();

    let dy = upload(s, &Rng::new(5).values_in::<f32>(f.y_d.span(), -1.0, 1.0));
    let (mut dx, dx_before) = sentinel_buffer::<f32>(s, f.x_d.span());
    let (mut dw, dw_before) = sentinel_buffer::<f32>(s, f.rnn.weight_space_len());

    // Backward weights before backward data.
    let r = f.rnn.backward_weights(
        &f.cudnn,
        &mut reserve,
        BackwardWeights::new(&f.x_d, &f.x, &f.y_d, &y, &mut dw).hx(&f.hx),
        &mut f.ws,
    );
    rejected(
        r,
        kind!(InvalidArgument),
        "backward weights before backward data",
    );
    // The reserve of another call, and of another network.
    let r = f.rnn.backward_data(
        &f.cudnn,
        &mut other,
        BackwardData::new(&f.y_d, &y, &dy, &f.x_d, &mut dx, &f.w).hx(&f.hx),
        &mut f.ws,
    );
    rejected(r, kind!(InvalidArgument), "reserve of another call");
    let r = f.rnn.backward_data(
        &f.cudnn,
        &mut foreign,
        BackwardData::new(&f.y_d, &y, &dy, &f.x_d, &mut dx, &f.w).hx(&f.hx),
        &mut f.ws,
    );
    rejected(r, kind!(InvalidArgument), "reserve of another network");
    // The forward had hx; the backward must too.
    let r = f.rnn.backward_data(
        &f.cudnn,
        &mut reserve,
        BackwardData::new(&f.y_d, &y, &dy, &f.x_d, &mut dx, &f.w),
        &mut f.ws,
    );
    rejected(r, kind!(InvalidArgument), "hx missing in backward");
    // Short dy, short dhx.
    let short_dy = upload(s, &vec![0.1f32; f.y_d.span() - 1]);
    let r = f.rnn.backward_data(
        &f.cudnn,
        &mut reserve,
        BackwardData::new(&f.y_d, &y, &short_dy, &f.x_d, &mut dx, &f.w).hx(&f.hx),
        &mut f.ws,
    );
    rejected(r, kind!(BufferTooSmall), "short dy");
    let (mut dhx, dhx_before) = sentinel_buffer::<f32>(s, f.rnn.hidden_state_len(batch) - 1);
    let r = f.rnn.backward_data(
        &f.cudnn,
        &mut reserve,
        BackwardData::new(&f.y_d, &y, &dy, &f.x_d, &mut dx, &f.w)
            .hx(&f.hx)
            .dhx(&mut dhx),
        &mut f.ws,
    );
    rejected(r, kind!(BufferTooSmall), "short dhx");
    assert_untouched("dhx", s, &dhx, &dhx_before);
    assert_untouched("dx", s, &dx, &dx_before);
    assert_untouched("dw", s, &dw, &dw_before);

    // The right order runs; backward data does not run twice on one reserve.
    f.rnn
        .backward_data(
            &f.cudnn,
            &mut reserve,
            BackwardData::new(&f.y_d, &y, &dy, &f.x_d, &mut dx, &f.w).hx(&f.hx),
            &mut f.ws,
        )
        .unwrap();
    let (mut dx2, dx2_before) = sentinel_buffer::<f32>(s, f.x_d.span());
    let r = f.rnn.backward_data(
        &f.cudnn,
        &mut reserve,
        BackwardData::new(&f.y_d, &y, &dy, &f.x_d, &mut dx2, &f.w).hx(&f.hx),
        &mut f.ws,
    );
    rejected(r, kind!(InvalidArgument), "backward data twice");
    assert_untouched("dx2", s, &dx2, &dx2_before);
    // A weight gradient of the wrong size; a missing hx.
    let (mut short_dw, short_dw_before) = sentinel_buffer::<f32>(s, f.rnn.weight_space_len() - 1);
    let r = f.rnn.backward_weights(
        &f.cudnn,
        &mut reserve,
        BackwardWeights::new(&f.x_d, &f.x, &f.y_d, &y, &mut short_dw).hx(&f.hx),
        &mut f.ws,
    );
    rejected(r, kind!(BufferTooSmall), "short dweights");
    assert_untouched("short dw", s, &short_dw, &short_dw_before);
    let r = f.rnn.backward_weights(
        &f.cudnn,
        &mut reserve,
        BackwardWeights::new(&f.x_d, &f.x, &f.y_d, &y, &mut dw),
        &mut f.ws,
    );
    rejected(r, kind!(InvalidArgument), "hx missing in backward weights");
    assert_untouched("dw", s, &dw, &dw_before);
    f.rnn
        .backward_weights(
            &f.cudnn,
            &mut reserve,
            BackwardWeights::new(&f.x_d, &f.x, &f.y_d, &y, &mut dw).hx(&f.hx),
            &mut f.ws,
        )
        .unwrap();
    let got = download(s, &dw);
    for p in f.rnn.weight_params() {
        assert!(got[p.range()].iter().all(|v| v.is_finite()), "{p:?}");
    }
    assert!(download(s, &dx).iter().all(|v| v.is_finite()));
}

// ---------------------------------------------------------------------------------------------
// Host-only: validation with the real library, no GPU
// ---------------------------------------------------------------------------------------------

#[test]
fn builders_are_validated_without_a_gpu() {
    // The network, its data descriptors and its reserve move between threads.
    assert_send::<Rnn<f32>>();
    assert_send::<SeqDataDesc<f16>>();
    assert_send::<RnnReserve<f64>>();
    if !library() {
        return;
    }
    // Accepted by this crate and by cuDNN's descriptor validation.
    Rnn::<f32>::builder(CellMode::Lstm, 10, 20)
        .layers(2)
        .validate()
        .unwrap();
    Rnn::<f64>::builder(CellMode::Gru, 3, 7)
        .layers(3)
        .bidirectional()
        .validate()
        .unwrap();
    Rnn::<f32>::builder(CellMode::Lstm, 10, 20)
        .proj_size(5)
        .bidirectional()
        .validate()
        .unwrap();
    Rnn::<f16>::builder(CellMode::Tanh, 8, 8)
        .math_precision(DType::F16)
        .input_mode(InputMode::Skip)
        .validate()
        .unwrap();
    Rnn::<bf16>::builder(CellMode::Relu, 8, 16)
        .validate()
        .unwrap();
    for bias in [
        BiasMode::NoBias,
        BiasMode::SingleInput,
        BiasMode::SingleRecurrent,
    ] {
        Rnn::<f32>::builder(CellMode::Gru, 4, 4)
            .bias(bias)
            .validate()
            .unwrap();
    }
    Rnn::<f32>::builder(CellMode::Lstm, 128, 128)
        .algo(RnnAlgo::PersistStatic)
        .validate()
        .unwrap();

    let bad = |r: Result<(), Error>, kind: Kind, what: &str| rejected(r, kind, what);
    bad(
        Rnn::<f32>::builder(CellMode::Lstm, 10, 0).validate(),
        kind!(InvalidArgument),
        "hidden 0",
    );
    bad(
        Rnn::<f32>::builder(CellMode::Lstm, -1, 4).validate(),
        kind!(InvalidArgument),
        "input -1",
    );
    bad(
        Rnn::<f32>::builder(CellMode::Lstm, 4, 4)
            .layers(0)
            .validate(),
        kind!(InvalidArgument),
        "0 layers",
    );
    bad(
        Rnn::<f32>::builder(CellMode::Lstm, 4, 1 << 33).validate(),
        kind!(Overflow),
        "hidden beyond int",
    );
    bad(
        Rnn::<f32>::builder(CellMode::Gru, 4, 8)
            .proj_size(4)
            .validate(),
        kind!(InvalidArgument),
        "projection on a GRU",
    );
    bad(
        Rnn::<f32>::builder(CellMode::Lstm, 4, 8)
            .proj_size(9)
            .validate(),
        kind!(InvalidArgument),
        "projection wider than hidden",
    );
    bad(
        Rnn::<f32>::builder(CellMode::Lstm, 4, 8)
            .proj_size(4)
            .algo(RnnAlgo::PersistStatic)
            .validate(),
        kind!(InvalidArgument),
        "projection with a persistent algorithm",
    );
    bad(
        Rnn::<f32>::builder(CellMode::Lstm, 4, 8)
            .input_mode(InputMode::Skip)
            .validate(),
        kind!(InvalidArgument),
        "skip input narrower than hidden",
    );
    bad(
        Rnn::<f32>::builder(CellMode::Lstm, 4, 8)
            .math_precision(DType::F16)
            .validate(),
        kind!(UnsupportedDataType),
        "f16 arithmetic on f32 data",
    );
    bad(
        Rnn::<f64>::builder(CellMode::Lstm, 4, 8)
            .math_precision(DType::F32)
            .validate(),
        kind!(UnsupportedDataType),
        "f32 arithmetic on f64 data",
    );
    bad(
        Rnn::<i8>::builder(CellMode::Lstm, 4, 8).validate(),
        kind!(UnsupportedDataType),
        "i8 data",
    );
}

#[test]
fn sequence_descriptors_are_validated_without_a_gpu() {
    if !library() {
        return;
    }
    // Spans and offsets of the three layouts for lengths [3, 1, 2], 4 values per step.
    let sm = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 3, 4, &[3, 1, 2], -1.0).unwrap();
    assert_eq!(
        (sm.span(), sm.batch(), sm.max_len(), sm.vector_size()),
        (36, 3, 3, 4)
    );
    assert_eq!(sm.offset(2, 1, 3), Some((2 * 3 + 1) * 4 + 3));
    assert_eq!(
        (sm.is_padding(1, 1), sm.is_padding(0, 1)),
        (Some(true), Some(false))
    );
    // A sequence past the batch has no length and no padding: `None`, not a panic.
    assert_eq!((sm.length(3), sm.is_padding(0, 3)), (None, None));
    assert_eq!(sm.fill(), -1.0);
    let bm = SeqDataDesc::<f32>::new(SeqLayout::BatchMajor, 3, 4, &[3, 1, 2], 0.0).unwrap();
    assert_eq!(bm.span(), 36);
    assert_eq!(bm.offset(2, 1, 3), Some((3 + 2) * 4 + 3));
    let pk = SeqDataDesc::<f64>::new(SeqLayout::Packed, 3, 4, &[3, 2, 1], 0.0).unwrap();
    assert_eq!(pk.span(), 6 * 4);
    // Steps: t=0 holds sequences 0,1,2; t=1 holds 0,1; t=2 holds 0.
    assert_eq!(pk.offset(0, 2, 0), Some(2 * 4));
    assert_eq!(pk.offset(1, 1, 1), Some(4 * 4 + 1));
    assert_eq!(pk.offset(2, 0, 0), Some(5 * 4));
    assert_eq!(pk.offset(2, 1, 0), None);
    assert_eq!(pk.lengths().collect::<Vec<_>>(), vec![3, 2, 1]);
    // Every stored element of every layout has exactly one owner.
    for d in [&sm, &bm] {
        let mut seen = vec![false; d.span()];
        for b in 0..d.batch() {
            for t in 0..d.max_len() {
                for v in 0..d.vector_size() {
                    let o = d.offset(t, b, v).unwrap();
                    assert!(!std::mem::replace(&mut seen[o], true));
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }
    let u = SeqDataDesc::<f16>::uniform(SeqLayout::SeqMajor, 5, 2, 3).unwrap();
    assert_eq!((u.span(), u.length(1)), (30, Some(5)));

    let bad = |r: Result<SeqDataDesc<f32>, Error>, kind: Kind, what: &str| rejected(r, kind, what);
    for layout in [
        SeqLayout::SeqMajor,
        SeqLayout::BatchMajor,
        SeqLayout::Packed,
    ] {
        bad(
            SeqDataDesc::new(layout, 3, 4, &[3, 4, 1], 0.0),
            kind!(InvalidArgument),
            "length beyond the maximum",
        );
        bad(
            SeqDataDesc::new(layout, 3, 4, &[3, 0, 1], 0.0),
            kind!(InvalidArgument),
            "length 0",
        );
        bad(
            SeqDataDesc::new(layout, 3, 4, &[], 0.0),
            kind!(InvalidArgument),
            "empty batch",
        );
        bad(
            SeqDataDesc::new(layout, 3, 0, &[3], 0.0),
            kind!(InvalidArgument),
            "vector size 0",
        );
        bad(
            SeqDataDesc::new(layout, 0, 4, &[1], 0.0),
            kind!(InvalidArgument),
            "maximum length 0",
        );
        bad(
            SeqDataDesc::new(layout, 1 << 20, 1 << 12, &[1 << 20], 0.0),
            kind!(Overflow),
            "2^32 elements",
        );
    }
    bad(
        SeqDataDesc::new(SeqLayout::Packed, 3, 4, &[2, 3, 1], 0.0),
        kind!(InvalidArgument),
        "unsorted packed",
    );
    bad(
        SeqDataDesc::new(SeqLayout::Packed, 4, 4, &[3, 2, 1], 0.0),
        kind!(InvalidArgument),
        "packed shorter than max",
    );
    // Padded layouts take any order.
    SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 4, 4, &[2, 3, 1], 0.0).unwrap();
}
