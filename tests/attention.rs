//! Tests of scaled dot-product attention in the graph API ([`Graph::sdpa`],
//! [`Graph::sdpa_backward`]) and of the graph operations its pattern needs (index generation,
//! comparisons, binary select, transposed views).
//!
//! Host tests build the graphs and let the real cuDNN library finalize every descriptor
//! (`Graph::check`, no GPU needed), and check the typed rejections. GPU tests compare the
//! forward output and statistics and the backward gradients with an f64 reference computed from
//! the inputs as stored (bf16 / f16), on q, k, v laid out `[b, s, h, d]` in memory as
//! cudnn-frontend's samples do; outputs and scratch buffers are poisoned with NaN first. If the
//! heuristics offer no plan for a case, the GPU test fails.
mod common;

use common::*;
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{
    alibi_slopes, Args, DiagonalAlignment, Graph, OperationGraph, Plan, PlanFilter, PointwiseMode,
    Sdpa, SdpaLayout, SdpaOptions, TensorId,
};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{Cudnn, DType, DataType, Error, Workspace};
use std::sync::Arc;

// ---------------------------------------------------------------------------------------------
// Shapes, layouts and the f64 reference
// ---------------------------------------------------------------------------------------------

/// `[b, h, s, d]` stored as `[b, s, h, d]` (cudnn-frontend's samples' interleaved layout).
fn bshd(dims: [i64; 4]) -> Vec<i64> {
    let [_, h, s, d] = dims;
    vec![s * h * d, d, h * d, 1]
}

/// Attention problem sizes: `h` query heads, `h_kv` key and value heads (dividing `h`).
#[derive(Debug, Clone, Copy)]
struct Shape {
    b: usize,
    h: usize,
    h_kv: usize,
    s_q: usize,
    s_kv: usize,
    d: usize,
}

impl Shape {
    fn q(&self) -> [i64; 4] {
        [self.b, self.h, self.s_q, self.d].map(|x| x as i64)
    }
    fn kv(&self) -> [i64; 4] {
        [self.b, self.h_kv, self.s_kv, self.d].map(|x| x as i64)
    }
    fn stats(&self) -> [i64; 4] {
        [self.b, self.h, self.s_q, 1].map(|x| x as i64)
    }
    /// Elements of q (and O, dO).
    fn q_len(&self) -> usize {
        self.b * self.h * self.s_q * self.d
    }
    /// Elements of k (and v).
    fn kv_len(&self) -> usize {
        self.b * self.h_kv * self.s_kv * self.d
    }
    /// The row-major dimensions of q and of k (and v), as `usize`.
    fn layouts(&self) -> ([usize; 4], [usize; 4]) {
        let q = [self.b, self.h, self.s_q, self.d];
        (q, [self.b, self.h_kv, self.s_kv, self.d])
    }
    /// The key and value head query head `hi` reads.
    fn kv_head(&self, hi: usize) -> usize {
        hi / (self.h / self.h_kv)
    }
    /// The default scale, `1/√d`.
    fn scale(&self) -> f64 {
        1.0 / (self.d as f64).sqrt()
    }
}

/// Row-major index of `[b, h, s, d]`.
fn at(dims: [usize; 4], b: usize, h: usize, s: usize, d: usize) -> usize {
    ((b * dims[1] + h) * dims[2] + s) * dims[3] + d
}

/// Forward reference: O (logical row-major `[b, h, s_q, d]`), stats `[b, h, s_q]` and the
/// probabilities P `[b, h, s_q, s_kv]`.
struct Forward {
    o: Vec<f64>,
    stats: Vec<f64>,
    p: Vec<f64>,
}

fn reference_forward(
    sh: Shape,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    scale: f64,
    causal: bool,
) -> Forward {
    let mods = Mods {
        mask: Mask::causal(causal),
        ..Mods::default()
    };
    reference_forward_mods(sh, q, k, v, scale, &mods)
}

/// The causal mask and sliding window of a test (as set on [`SdpaOptions`]).
#[derive(Debug, Clone, Copy, Default)]
struct Mask {
    causal: Option<DiagonalAlignment>,
    window: Option<usize>,
}

impl Mask {
    fn causal(causal: bool) -> Mask {
        Mask {
            causal: causal.then_some(DiagonalAlignment::TopLeft),
            window: None,
        }
    }

    /// The options setting this mask.
    fn opts(&self) -> SdpaOptions {
        let o = match self.causal {
            None => SdpaOptions::new(),
            Some(DiagonalAlignment::TopLeft) => SdpaOptions::new().causal(true),
            Some(DiagonalAlignment::BottomRight) => SdpaOptions::new().causal_bottom_right(true),
        };
        match self.window {
            Some(w) => o.sliding_window(w as i64),
            None => o,
        }
    }

    /// Whether query row `i` sees key column `j` (`j < lkv`) in an entry of `lq` queries and
    /// `lkv` keys: `j ≤ d(i)` and `j > d(i) − window`, the diagonal `d(i)` being `i` (top-left)
    /// or `i + lkv − lq` (bottom-right).
    fn keeps(&self, i: usize, j: usize, lq: usize, lkv: usize) -> bool {
        let (i, j) = (i as i64, j as i64);
        let diag = match self.causal {
            None => return true,
            Some(DiagonalAlignment::TopLeft) => i,
            Some(DiagonalAlignment::BottomRight) => i + lkv as i64 - lq as i64,
        };
        j <= diag && self.window.map_or(true, |w| j > diag - w as i64)
    }
}

/// A bias in a reference: values (logical row-major) and its batch and head extents (each the
/// problem's or 1).
#[derive(Clone, Copy)]
struct BiasRef<'a> {
    vals: &'a [f64],
    bh: [usize; 2],
}

impl BiasRef<'_> {
    fn at(&self, sh: Shape, bi: usize, hi: usize, i: usize, j: usize) -> f64 {
        let [nb, nh] = self.bh;
        let (bi, hi) = (if nb == 1 { 0 } else { bi }, if nh == 1 { 0 } else { hi });
        self.vals[((bi * nh + hi) * sh.s_q + i) * sh.s_kv + j]
    }
}

/// What a reference applies to the scaled scores: bias, ALiBi, padding lengths, causal mask and
/// window.
#[derive(Clone, Copy, Default)]
struct Mods<'a> {
    mask: Mask,
    lens: Option<(&'a [usize], &'a [usize])>,
    bias: Option<BiasRef<'a>>,
    /// ALiBi slopes per head: `S[i, j] += slope · (j − i)`.
    alibi: Option<&'a [f64]>,
}

/// The f64 forward reference with score modifiers: `S = scale · Q·Kᵀ + bias`, masked as `mods`
/// says; rows `i ≥ seq_len_q[n]` have no probabilities (P row 0, O row 0, stats NaN).
fn reference_forward_mods(
    sh: Shape,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    scale: f64,
    mods: &Mods,
) -> Forward {
    let Shape {
        b, h, s_q, s_kv, d, ..
    } = sh;
    let (qd, kd) = sh.layouts();
    let mut stats = vec![0.0; b * h * s_q];
    let mut p = vec![0.0; b * h * s_q * s_kv];
    let mut row = vec![0.0; s_kv];
    for bi in 0..b {
        for hi in 0..h {
            let (lq, lkv) = mods.lens.map_or((s_q, s_kv), |(lq, lkv)| (lq[bi], lkv[bi]));
            for i in 0..s_q {
                if i >= lq {
                    stats[(bi * h + hi) * s_q + i] = f64::NAN;
                    continue;
                }
                let mut m = f64::NEG_INFINITY;
                for (j, r) in row.iter_mut().enumerate() {
                    *r = if j >= lkv || !mods.mask.keeps(i, j, lq, lkv) {
                        f64::NEG_INFINITY
                    } else {
                        let mut acc = 0.0;
                        for x in 0..d {
                            acc += q[at(qd, bi, hi, i, x)] * k[at(kd, bi, sh.kv_head(hi), j, x)];
                        }
                        let alibi = mods.alibi.map_or(0.0, |m| m[hi] * (j as f64 - i as f64));
                        let bias = mods.bias.map_or(0.0, |bias| bias.at(sh, bi, hi, i, j));
                        acc * scale + bias + alibi
                    };
                    m = m.max(*r);
                }
                assert!(
                    m > f64::NEG_INFINITY,
                    "a test row with nothing to attend to"
                );
                let sum: f64 = row.iter().map(|&r| (r - m).exp()).sum();
                stats[(bi * h + hi) * s_q + i] = m + sum.ln();
                for j in 0..s_kv {
                    p[((bi * h + hi) * s_q + i) * s_kv + j] = (row[j] - m).exp() / sum;
                }
            }
        }
    }
    let o = attention_output(sh, &p, None, v);
    Forward { o, stats, p }
}

/// `O = Z · V` with `Z = P`, or with dropout `(mask, c)` `Z = P ⊙ mask · c`, from the
/// probabilities P `[b, h, s_q, s_kv]` of [`reference_forward`] and the mask (same shape).
fn attention_output(sh: Shape, p: &[f64], dropout: Option<(&[f64], f64)>, v: &[f64]) -> Vec<f64> {
    let Shape {
        b, h, s_q, s_kv, d, ..
    } = sh;
    let (qd, kd) = sh.layouts();
    let mut o = vec![0.0; b * h * s_q * d];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..s_q {
                for j in 0..s_kv {
                    let at_ij = ((bi * h + hi) * s_q + i) * s_kv + j;
                    // Without dropout, `P · 1 · 1` is P exactly.
                    let (mij, c) = dropout.map_or((1.0, 1.0), |(mask, c)| (mask[at_ij], c));
                    let z = p[at_ij] * mij * c;
                    for x in 0..d {
                        o[at(qd, bi, hi, i, x)] += z * v[at(kd, bi, sh.kv_head(hi), j, x)];
                    }
                }
            }
        }
    }
    o
}

/// Analytic gradients ([`Grads`]) of `sum(O ∘ dO)` given P, with
/// `D_i = Σ_x dO[i, x]·O[i, x]` from the O the GPU reads. With dropout `(mask, c)`, with
/// `Z = P ⊙ mask · c` (what multiplied V): `dV = Zᵀ·dO`, `dZ = dO·Vᵀ`,
/// `dS = P ⊙ (c · mask ⊙ dZ − D) · scale`, `dQ = dS·K`, `dK = dSᵀ·Q`; without dropout the same
/// with `mask = 1`, `c = 1` (`Z = P`, `dS = P ⊙ (dP − D) · scale`).
fn reference_backward(
    sh: Shape,
    [q, k, v]: [&[f64]; 3],
    o: &[f64],
    d_o: &[f64],
    p: &[f64],
    dropout: Option<(&[f64], f64)>,
    scale: f64,
) -> Grads {
    let Shape {
        b, h, s_q, s_kv, d, ..
    } = sh;
    let (qd, kd) = sh.layouts();
    let mut dq = vec![0.0; q.len()];
    let mut dk = vec![0.0; k.len()];
    let mut dv = vec![0.0; v.len()];
    let mut ds_unscaled = vec![0.0; p.len()];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..s_q {
                let di: f64 = (0..d)
                    .map(|x| d_o[at(qd, bi, hi, i, x)] * o[at(qd, bi, hi, i, x)])
                    .sum();
                for j in 0..s_kv {
                    let at_ij = ((bi * h + hi) * s_q + i) * s_kv + j;
                    // Without dropout, multiplying by 1 leaves every value exact.
                    let (mij, c) = dropout.map_or((1.0, 1.0), |(mask, c)| (mask[at_ij], c));
                    let pij = p[at_ij];
                    let z = pij * mij * c;
                    let mut dz = 0.0;
                    for x in 0..d {
                        dz += d_o[at(qd, bi, hi, i, x)] * v[at(kd, bi, sh.kv_head(hi), j, x)];
                        dv[at(kd, bi, sh.kv_head(hi), j, x)] += z * d_o[at(qd, bi, hi, i, x)];
                    }
                    let dsu = pij * (c * mij * dz - di);
                    ds_unscaled[at_ij] = dsu;
                    let ds = dsu * scale;
                    for x in 0..d {
                        dq[at(qd, bi, hi, i, x)] += ds * k[at(kd, bi, sh.kv_head(hi), j, x)];
                        dk[at(kd, bi, sh.kv_head(hi), j, x)] += ds * q[at(qd, bi, hi, i, x)];
                    }
                }
            }
        }
    }
    Grads {
        dq,
        dk,
        dv,
        ds_unscaled,
    }
}

/// Reference gradients (logical row-major): dQ, dK, dV and the gradient of the scaled (and
/// biased) scores `[b, h, s_q, s_kv]`, which is dBias before the sum over the batch.
struct Grads {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    ds_unscaled: Vec<f64>,
}

// ---------------------------------------------------------------------------------------------
// Host-only tests
// ---------------------------------------------------------------------------------------------

/// Declares q of `q_dims` and k, v of `kv_dims`, stored `[b, s, h, d]`.
fn qkv_inputs(
    g: &mut Graph,
    q_dims: [i64; 4],
    kv_dims: [i64; 4],
    dtype: DType,
) -> cudnn_safe::Result<[TensorId; 3]> {
    let q = g.tensor("q", &q_dims, &bshd(q_dims), dtype)?;
    let k = g.tensor("k", &kv_dims, &bshd(kv_dims), dtype)?;
    let v = g.tensor("v", &kv_dims, &bshd(kv_dims), dtype)?;
    Ok([q, k, v])
}

/// Declares the inputs of a backward pass: q, k, v, o, dO (stored `[b, s, h, d]`) and the f32
/// statistics.
fn bwd_inputs(g: &mut Graph, sh: Shape, dtype: DType) -> cudnn_safe::Result<[TensorId; 6]> {
    let [q, k, v] = qkv_inputs(g, sh.q(), sh.kv(), dtype)?;
    let o = g.tensor("o", &sh.q(), &bshd(sh.q()), dtype)?;
    let d_o = g.tensor("dO", &sh.q(), &bshd(sh.q()), dtype)?;
    let stats = g.tensor_nchw("stats", &sh.stats(), DType::F32)?;
    Ok([q, k, v, o, d_o, stats])
}

/// A forward graph on `[b, s, h, d]`-stored inputs.
fn fwd_graph(
    dtype: DType,
    sh: Shape,
    opts: &SdpaOptions,
) -> cudnn_safe::Result<(Graph, [TensorId; 3], cudnn_safe::graph::SdpaOutputs)> {
    let mut g = Graph::new(dtype, DType::F32, DType::F32);
    let [q, k, v] = qkv_inputs(&mut g, sh.q(), sh.kv(), dtype)?;
    let out = g.sdpa(q, k, v, opts)?;
    Ok((g, [q, k, v], out))
}

/// A backward graph: inputs q, k, v, o, dO, stats.
fn bwd_graph(
    dtype: DType,
    sh: Shape,
    opts: &SdpaOptions,
) -> cudnn_safe::Result<(Graph, [TensorId; 6], cudnn_safe::graph::SdpaGrads)> {
    let mut g = Graph::new(dtype, DType::F32, DType::F32);
    let [q, k, v, o, d_o, stats] = bwd_inputs(&mut g, sh, dtype)?;
    let grads = g.sdpa_backward(q, k, v, o, d_o, stats, opts)?;
    Ok((g, [q, k, v, o, d_o, stats], grads))
}

const SMALL: Shape = Shape {
    b: 2,
    h: 3,
    h_kv: 3,
    s_q: 64,
    s_kv: 64,
    d: 64,
};

/// [`SMALL`] with 128 keys (cross attention: `s_q ≠ s_kv`).
const CROSS: Shape = Shape { s_kv: 128, ..SMALL };

/// [`SMALL`] with 128 queries and keys.
const SQUARE_128: Shape = Shape {
    s_q: 128,
    s_kv: 128,
    ..SMALL
};

#[test]
fn host_sdpa_forward_shapes_and_finalize() {
    for dtype in [DType::BF16, DType::F16] {
        for causal in [false, true] {
            for training in [false, true] {
                let sh = CROSS;
                let opts = SdpaOptions::new().causal(causal).training(training);
                let (g, [_, k, _], out) = fwd_graph(dtype, sh, &opts).unwrap();
                assert_eq!(g.dims(out.o).unwrap(), &sh.q());
                // O in q's memory order ([b, s, h, d]).
                assert_eq!(g.strides(out.o).unwrap(), bshd(sh.q()).as_slice());
                assert_eq!(g.dtype(out.o).unwrap(), dtype);
                assert!(!g.is_virtual(out.o).unwrap());
                // k is described as Kᵀ, same memory.
                assert_eq!(g.dims(k).unwrap(), &[2, 3, 64, 128]);
                let ks = bshd(sh.kv());
                assert_eq!(g.strides(k).unwrap(), &[ks[0], ks[1], ks[3], ks[2]]);
                match out.stats {
                    Some(st) => {
                        assert!(training);
                        assert_eq!(g.dims(st).unwrap(), &sh.stats());
                        assert_eq!(g.strides(st).unwrap(), &[3 * 64, 64, 1, 1]);
                        assert_eq!(g.dtype(st).unwrap(), DType::F32);
                    }
                    None => assert!(!training),
                }
                if have_cudnn() {
                    common::check_with_record(&g).unwrap_or_else(|e| {
                        panic!("{dtype} causal={causal} training={training}: {e}")
                    });
                }
            }
        }
    }
}

/// dQ, dK, dV of [`SMALL`] have the dimensions, `[b, s, h, d]` strides and data type of q, k, v;
/// the softmax sum and the dQ accumulator are f32.
fn assert_backward_outputs(g: &Graph, gr: &cudnn_safe::graph::SdpaGrads, dtype: DType) {
    for (t, dims) in [(gr.dq, SMALL.q()), (gr.dk, SMALL.kv()), (gr.dv, SMALL.kv())] {
        assert_eq!(g.dims(t).unwrap(), &dims);
        assert_eq!(g.strides(t).unwrap(), bshd(dims).as_slice());
        assert_eq!(g.dtype(t).unwrap(), dtype);
    }
    assert_eq!(g.dtype(gr.softmax_sum).unwrap(), DType::F32);
    assert_eq!(g.dtype(gr.dq_accum.unwrap()).unwrap(), DType::F32);
}

#[test]
fn host_sdpa_backward_shapes_and_finalize() {
    for dtype in [DType::BF16, DType::F16] {
        for causal in [false, true] {
            let opts = SdpaOptions::new().causal(causal);
            let (g, _, gr) = bwd_graph(dtype, SMALL, &opts).unwrap();
            assert_backward_outputs(&g, &gr, dtype);
            assert_eq!(g.dims(gr.softmax_sum).unwrap(), &SMALL.stats());
            assert_eq!(g.strides(gr.softmax_sum).unwrap(), &[3 * 64, 64, 1, 1]);
            assert_eq!(
                g.strides(gr.dq_accum.unwrap()).unwrap(),
                &[3 * 64 * 64, 64 * 64, 64, 1]
            );
            assert_eq!(g.dims(gr.dq_accum.unwrap()).unwrap(), &SMALL.q());
            if have_cudnn() {
                common::check_with_record(&g)
                    .unwrap_or_else(|e| panic!("{dtype} causal={causal}: {e}"));
            }
        }
    }
}

/// Grouped-query attention: 4 query heads, 2 key and value heads.
const GQA: Shape = Shape {
    h: 4,
    h_kv: 2,
    ..SMALL
};

/// Multi-query attention: 4 query heads, 1 key and value head.
const MQA: Shape = Shape { h_kv: 1, ..GQA };

#[test]
fn host_sdpa_grouped_heads_shapes_and_records() {
    for sh in [GQA, MQA] {
        for dtype in [DType::BF16, DType::F16] {
            let opts = SdpaOptions::new().causal(true).training(true);
            let (g, [_, k, v], out) = fwd_graph(dtype, sh, &opts).unwrap();
            assert_eq!(g.dims(out.o).unwrap(), &sh.q());
            assert_eq!(g.dims(out.stats.unwrap()).unwrap(), &sh.stats());
            let kv = sh.kv();
            assert_eq!(g.dims(k).unwrap(), &[kv[0], kv[1], kv[3], kv[2]]);
            assert_eq!(g.dims(v).unwrap(), &kv);
            assert!(g.signature().contains("gmatmul"), "{}", g.signature());
            let (gb, _, gr) = bwd_graph(dtype, sh, &SdpaOptions::new().causal(true)).unwrap();
            assert_eq!(gb.dims(gr.dq).unwrap(), &sh.q());
            for t in [gr.dk, gr.dv] {
                assert_eq!(gb.dims(t).unwrap(), &kv);
                // k's and v's memory order (a stride of a dimension of 1 is immaterial).
                let got = gb.strides(t).unwrap();
                for (i, want) in bshd(kv).into_iter().enumerate() {
                    assert!(kv[i] == 1 || got[i] == want, "{got:?} for {kv:?}");
                }
                assert_eq!(gb.dtype(t).unwrap(), dtype);
            }
            if have_cudnn() {
                for g in [&g, &gb] {
                    common::check_with_record(g).unwrap_or_else(|e| panic!("{dtype} {sh:?}: {e}"));
                }
            }
        }
    }
    // Multi-head graphs keep their plain matmuls (and their signatures).
    let (g, ..) = fwd_graph(DType::BF16, SMALL, &SdpaOptions::new()).unwrap();
    assert!(!g.signature().contains("gmatmul"));
    // Key or value heads that do not divide the query heads are refused, naming the tensor.
    for (h_k, h_v, name) in [(3, 2, "k"), (2, 3, "v")] {
        let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
        let q = g
            .tensor("q", &GQA.q(), &bshd(GQA.q()), DType::BF16)
            .unwrap();
        let kd = [2, h_k, 64, 64];
        let vd = [2, h_v, 64, 64];
        let k = g.tensor("k", &kd, &bshd(kd), DType::BF16).unwrap();
        let v = g.tensor("v", &vd, &bshd(vd), DType::BF16).unwrap();
        let r = g.sdpa(q, k, v, &SdpaOptions::new()).map(|_| ());
        assert!(mismatch(&r, name), "{r:?}");
    }
}

#[test]
fn host_sdpa_padding_graphs_and_rejections() {
    let sh = CROSS;
    for dtype in [DType::BF16, DType::F16] {
        let mut g = Graph::new(dtype, DType::F32, DType::F32);
        let [q, k, v] = qkv_inputs(&mut g, sh.q(), sh.kv(), dtype).unwrap();
        let seq_q = g.seq_len_input("seq_len_q", 2).unwrap();
        let seq_kv = g.seq_len_input("seq_len_kv", 2).unwrap();
        let opts = SdpaOptions::new().causal(true).padding(seq_q, seq_kv);
        assert_eq!(opts.padding, Some((seq_q, seq_kv)));
        g.sdpa(q, k, v, &opts.training(true)).unwrap();
        assert_eq!(g.dims(seq_q).unwrap(), &[2, 1, 1, 1]);
        assert_eq!(g.dtype(seq_q).unwrap(), DType::I32);
        // The lengths' bounds (s_q, s_kv) are part of the graph.
        let sig = g.signature();
        assert!(sig.contains("/b64;") && sig.contains("/b128;"), "{sig}");
        let (gb, ids, _) = {
            let mut g = Graph::new(dtype, DType::F32, DType::F32);
            let ids = bwd_inputs(&mut g, sh, dtype).unwrap();
            let seq_q = g.seq_len_input("seq_len_q", 2).unwrap();
            let seq_kv = g.seq_len_input("seq_len_kv", 2).unwrap();
            let [q, k, v, o, d_o, stats] = ids;
            let opts = SdpaOptions::new().padding(seq_q, seq_kv);
            let gr = g.sdpa_backward(q, k, v, o, d_o, stats, &opts).unwrap();
            (g, ids, gr)
        };
        assert_eq!(ids.len(), 6);
        if have_cudnn() {
            for g in [&g, &gb] {
                common::check_with_record(g).unwrap_or_else(|e| panic!("{dtype}: {e}"));
            }
        }
        // A record whose lengths may exceed the extents they override is refused.
        let line = g.to_json().unwrap();
        assert!(line.contains("\"bound\":64"), "{line}");
        let forged = line.replace("\"bound\":64", "\"bound\":1000");
        let r = Graph::from_json(&forged).map(|_| ());
        assert!(rejected(&r, kind!(InvalidArgument), "override"), "{r:?}");
    }
    // Rejections name the tensor: another data type, another batch, an operation's output.
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let [q, k, v] = qkv_inputs(&mut g, sh.q(), sh.kv(), DType::BF16).unwrap();
    let good = g.seq_len_input("seq_len_q", 2).unwrap();
    let wide = g.rng_input("seq_i64");
    let three = g.seq_len_input("seq_three", 3).unwrap();
    let before = g.signature();
    let r = g
        .sdpa(q, k, v, &SdpaOptions::new().padding(good, wide))
        .map(|_| ());
    assert!(rejected(&r, kind!(UnsupportedDataType), "seq_i64"), "{r:?}");
    let r = g
        .sdpa(q, k, v, &SdpaOptions::new().padding(three, good))
        .map(|_| ());
    assert!(rejected(&r, kind!(InvalidArgument), "seq_three"), "{r:?}");
    assert_eq!(
        g.signature(),
        before,
        "a rejected call leaves the graph as it was"
    );
    assert!(g.seq_len_input("none", 0).is_err());
}

#[test]
fn host_sdpa_signature_distinguishes_options() {
    let sig = |opts: SdpaOptions| fwd_graph(DType::BF16, SMALL, &opts).unwrap().0.signature();
    let base = sig(SdpaOptions::new());
    assert_ne!(base, sig(SdpaOptions::new().causal(true)));
    assert_ne!(base, sig(SdpaOptions::new().training(true)));
    assert_ne!(base, sig(SdpaOptions::new().scale(0.5)));
    // The default scale is 1/√d.
    assert_eq!(base, sig(SdpaOptions::new().scale(1.0 / 8.0)));
}

/// The error names `name` (in its message).
fn names(r: &cudnn_safe::Result<impl std::fmt::Debug>, name: &str) -> bool {
    match r {
        Err(e) => format!("{e}").contains(name) || format!("{e:?}").contains(name),
        Ok(_) => false,
    }
}

/// `r` is an error of kind `kind` naming `name`.
fn rejected(r: &cudnn_safe::Result<impl std::fmt::Debug>, kind: Kind, name: &str) -> bool {
    matches!(r, Err(e) if kind(e)) && names(r, name)
}

/// `r` is a [`Error::ShapeMismatch`] whose second argument is `b`.
fn mismatch(r: &cudnn_safe::Result<()>, b: &str) -> bool {
    matches!(r, Err(Error::ShapeMismatch { b: got, .. }) if *got == b)
}

#[test]
fn host_sdpa_rejections() {
    let opts = SdpaOptions::new();
    let sh = SMALL;
    let bf = DType::BF16;
    // Each case builds q, k, v with the given dims / dtypes / strides.
    let case = |qd: [i64; 4], kd: [i64; 4], vd: [i64; 4], types: [DType; 3], opts: &SdpaOptions| {
        let mut g = Graph::new(bf, DType::F32, DType::F32);
        let q = g.tensor("q", &qd, &bshd(qd), types[0]).unwrap();
        let k = g.tensor("k", &kd, &bshd(kd), types[1]).unwrap();
        let v = g.tensor("v", &vd, &bshd(vd), types[2]).unwrap();
        g.sdpa(q, k, v, opts).map(|_| ())
    };
    let (q, kv) = (sh.q(), sh.kv());
    // Shape mismatches name the tensor.
    let r = case(q, [2, 3, 64, 32], kv, [bf; 3], &opts);
    assert!(mismatch(&r, "k"), "{r:?}");
    let r = case(q, kv, [2, 4, 64, 64], [bf; 3], &opts);
    assert!(mismatch(&r, "v"), "{r:?}");
    let r = case(q, [1, 3, 64, 64], kv, [bf; 3], &opts);
    assert!(mismatch(&r, "k"), "{r:?}");
    // Data types: f32 anywhere, or mixed f16 / bf16.
    let r = case(q, kv, kv, [DType::F32, DType::F32, DType::F32], &opts);
    assert!(rejected(&r, kind!(UnsupportedDataType), "`q`"), "{r:?}");
    let r = case(q, kv, kv, [bf, bf, DType::F16], &opts);
    assert!(rejected(&r, kind!(UnsupportedDataType), "`v`"), "{r:?}");
    // Head dimension too large, or not a multiple of 8.
    let big = [2, 3, 64, 256];
    let r = case(big, big, big, [bf; 3], &opts);
    assert!(rejected(&r, kind!(InvalidArgument), "`q`"), "{r:?}");
    let odd = [2, 3, 64, 60];
    let r = case(odd, odd, odd, [bf; 3], &opts);
    assert!(rejected(&r, kind!(InvalidArgument), "`q`"), "{r:?}");
    // Non-finite scale.
    let r = case(q, kv, kv, [bf; 3], &SdpaOptions::new().scale(f64::NAN));
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );

    // Rank 3.
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    let q3 = g.tensor_nchw("q", &[3, 64, 64], bf).unwrap();
    let k = g.tensor("k", &kv, &bshd(kv), bf).unwrap();
    let v = g.tensor("v", &kv, &bshd(kv), bf).unwrap();
    let r = g.sdpa(q3, k, v, &opts);
    assert!(rejected(&r, kind!(InvalidArgument), "`q`"), "{r:?}");
    // Head dimension not contiguous.
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    let qs = g.tensor("q", &q, &[64 * 64 * 3, 1, 3, 3 * 64], bf).unwrap();
    let k = g.tensor("k", &kv, &bshd(kv), bf).unwrap();
    let v = g.tensor("v", &kv, &bshd(kv), bf).unwrap();
    let r = g.sdpa(qs, k, v, &opts);
    assert!(rejected(&r, kind!(InvalidArgument), "`q`"), "{r:?}");
    // k already read by another operation (its description would change under it).
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    let [qq, k, v] = qkv_inputs(&mut g, q, kv, bf).unwrap();
    let relu = g.pointwise(PointwiseMode::Relu, k, None).unwrap();
    g.mark_output(relu).unwrap();
    let r = g.sdpa(qq, k, v, &opts);
    assert!(rejected(&r, kind!(InvalidArgument), "`k`"), "{r:?}");
    // One tensor as both q and k (k is re-described as Kᵀ): refused, naming it.
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    let x = g.tensor("x", &q, &bshd(q), bf).unwrap();
    let v = g.tensor("v", &kv, &bshd(kv), bf).unwrap();
    let r = g.sdpa(x, x, v, &opts);
    assert!(rejected(&r, kind!(InvalidArgument), "`x`"), "{r:?}");
    let r = g.sdpa(x, v, v, &opts);
    assert!(rejected(&r, kind!(InvalidArgument), "`v`"), "{r:?}");
    // An f16 intermediate type.
    let mut g = Graph::new(bf, DType::F16, DType::F32);
    let [qq, k, v] = qkv_inputs(&mut g, q, kv, bf).unwrap();
    let r = g.sdpa(qq, k, v, &opts);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
    // A failed call leaves the graph without operations (which cuDNN refuses to finalize).
    if have_cudnn() {
        assert!(g.check().is_err());
    }
}

#[test]
fn host_sdpa_backward_rejections() {
    let opts = SdpaOptions::new();
    let bf = DType::BF16;
    let (q, kv, st) = (SMALL.q(), SMALL.kv(), SMALL.stats());
    let build = |stats_dims: [i64; 4], stats_type: DType, do_dims: [i64; 4]| {
        let mut g = Graph::new(bf, DType::F32, DType::F32);
        let [tq, tk, tv] = qkv_inputs(&mut g, q, kv, bf).unwrap();
        let to = g.tensor("o", &q, &bshd(q), bf).unwrap();
        let td = g.tensor("dO", &do_dims, &bshd(do_dims), bf).unwrap();
        let ts = g.tensor_nchw("stats", &stats_dims, stats_type).unwrap();
        g.sdpa_backward(tq, tk, tv, to, td, ts, &opts).map(|_| ())
    };
    assert!(build(st, DType::F32, q).is_ok());
    let r = build(st, bf, q);
    assert!(rejected(&r, kind!(UnsupportedDataType), "`stats`"), "{r:?}");
    let r = build([2, 3, 64, 2], DType::F32, q);
    assert!(mismatch(&r, "stats"), "{r:?}");
    let r = build(st, DType::F32, [2, 3, 32, 64]);
    assert!(mismatch(&r, "dO"), "{r:?}");
}

#[test]
fn host_index_compare_select_transpose() {
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[2, 4, 8], DType::F16).unwrap();
    let b = g.tensor_nchw("b", &[2, 8, 4], DType::F16).unwrap();
    let s = g.matmul(a, b).unwrap();
    // GenIndex: axis within the rank; results are INT32 and stay virtual.
    let r = g.pointwise(PointwiseMode::GenIndex { axis: 3 }, s, None);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    let row = g
        .pointwise(PointwiseMode::GenIndex { axis: 1 }, s, None)
        .unwrap();
    assert_eq!(g.dtype(row).unwrap(), DType::I32);
    let col = g
        .pointwise(PointwiseMode::GenIndex { axis: 2 }, s, None)
        .unwrap();
    let r = g.mark_output(row);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    let keep = g.pointwise(PointwiseMode::CmpGe, row, Some(col)).unwrap();
    assert!(PointwiseMode::CmpGe.is_comparison() && PointwiseMode::CmpGe.is_binary());
    let r = g.mark_output(keep);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    // The condition must be a comparison result, of x's dimensions.
    let zero = g.scalar("zero", 0.0, DType::F32).unwrap();
    let r = g.select(s, zero, s);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    let y = g.select(s, zero, keep).unwrap();
    assert_eq!(g.dims(y).unwrap(), &[2, 4, 4]);
    // Transposed view: dims and strides swapped.
    let t = g.transpose(y).unwrap();
    assert_eq!(g.dims(t).unwrap(), &[2, 4, 4]);
    assert_eq!(g.strides(t).unwrap(), &[16, 1, 4]);
    let r = g.transpose(zero);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    let z = g.pointwise(PointwiseMode::Identity, t, None).unwrap();
    g.mark_output(z).unwrap();
    if have_cudnn() {
        common::check_with_record(&g).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// GPU tests
// ---------------------------------------------------------------------------------------------

/// A device buffer for a tensor of `dims` / `strides` holding `vals` (logical row-major order)
/// at its addressed elements, [`SENTINEL`] elsewhere.
fn upload<T: DataType>(
    s: &Arc<CudaStream>,
    dims: &[i64],
    strides: &[i64],
    vals: &[T],
) -> CudaSlice<T> {
    let offs = offsets(dims, strides);
    let span = offs.iter().max().map_or(0, |&m| m + 1);
    s.clone_htod(&image(span, &offs, |i| vals[i])).unwrap()
}

/// The addressed elements of a strided device buffer, in logical order.
fn fetch<T: DataType>(
    s: &Arc<CudaStream>,
    dims: &[i64],
    strides: &[i64],
    buf: &CudaSlice<T>,
) -> Vec<T> {
    let host = download(s, buf);
    offsets(dims, strides).iter().map(|&o| host[o]).collect()
}

/// The first `max` plans of the heuristics; panics (the test fails) when there is none.
fn plans(cudnn: &Cudnn, og: &OperationGraph, max: usize) -> Vec<Plan> {
    let list = og
        .plans(cudnn, &PlanFilter::new().with_max_plans(Some(max)))
        .unwrap_or_else(|e| panic!("no plan for the attention graph: {e}"));
    assert!(!list.plans.is_empty(), "no plan: {:?}", list.skipped);
    for p in &list.plans {
        eprintln!("  plan {} ws {}", p.name(), p.workspace_size());
    }
    list.plans
}

/// Stats are f32 values computed from f32 scores (matmul accumulation, exp and log in f32):
/// 1e-3 leaves room for the engines' fast exponentials against the exact f64 reference.
const STATS_TOL: f64 = 1e-3;

/// q, k, v drawn from a test's PRNG (in that order, uniform in `[-2, 2]`) and their device
/// copies in the `[b, s, h, d]` layout.
struct Qkv<T: DataType> {
    host: [Vec<T>; 3],
    dev: [CudaSlice<T>; 3],
    /// The layout of q, k, v (and of o, dO and the gradients of the test).
    layout: SdpaLayout,
}

impl<T: DataType> Qkv<T> {
    fn random(s: &Arc<CudaStream>, sh: Shape, rng: &mut Rng) -> Qkv<T> {
        Qkv::random_in(s, sh, rng, SdpaLayout::Bshd)
    }

    /// [`Qkv::random`] with q, k, v stored in `layout`.
    fn random_in(s: &Arc<CudaStream>, sh: Shape, rng: &mut Rng, layout: SdpaLayout) -> Qkv<T> {
        let host: [Vec<T>; 3] = [
            rng.values(sh.q_len()),
            rng.values(sh.kv_len()),
            rng.values(sh.kv_len()),
        ];
        let dev = [
            upload(s, &sh.q(), &layout.strides(sh.q()), &host[0]),
            upload(s, &sh.kv(), &layout.strides(sh.kv()), &host[1]),
            upload(s, &sh.kv(), &layout.strides(sh.kv()), &host[2]),
        ];
        Qkv { host, dev, layout }
    }

    /// The values as stored, in f64.
    fn f64(&self) -> [Vec<f64>; 3] {
        self.host.each_ref().map(|v| to_f64(v))
    }

    fn bufs(&self) -> [&CudaSlice<T>; 3] {
        self.dev.each_ref()
    }
}

/// Binds q, k, v.
fn bind_qkv<'a, T: DataType>(
    args: &mut Args<'a>,
    [q, k, v]: [TensorId; 3],
    [qb, kb, vb]: [&'a CudaSlice<T>; 3],
) {
    args.input(q, qb)
        .unwrap()
        .input(k, kb)
        .unwrap()
        .input(v, vb)
        .unwrap();
}

/// Random bf16 values filling the spans of q, k, v, on the device.
fn random_spans(
    s: &Arc<CudaStream>,
    og: &OperationGraph,
    ids: [TensorId; 3],
    rng: &mut Rng,
) -> [CudaSlice<bf16>; 3] {
    ids.map(|t| {
        s.clone_htod(&rng.values::<bf16>(og.span(t).unwrap()))
            .unwrap()
    })
}

fn fwd_case<T: DataType>(sh: Shape, causal: bool, training: bool, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let opts = SdpaOptions::new().causal(causal).training(training);
    let (g, qkv, out) = fwd_graph(T::DTYPE, sh, &opts).unwrap();
    let og = g.build(&cudnn).unwrap();
    let mut rng = Rng::new(seed);
    let inputs = Qkv::<T>::random(&s, sh, &mut rng);
    let [qf, kf, vf] = inputs.f64();
    let want = reference_forward(sh, &qf, &kf, &vf, sh.scale(), causal);
    let mut ws = Workspace::new(s.clone());
    for plan in plans(&cudnn, &og, 2) {
        let mut ob = poisoned_buffer::<T>(&s, og.span(out.o).unwrap());
        let mut sb = out
            .stats
            .map(|st| poisoned_buffer::<f32>(&s, og.span(st).unwrap()));
        {
            let mut args = Args::new(&cudnn);
            bind_qkv(&mut args, qkv, inputs.bufs());
            args.output(out.o, &mut ob).unwrap();
            if let (Some(st), Some(buf)) = (out.stats, sb.as_mut()) {
                args.output(st, buf).unwrap();
            }
            cudnn.execute(&plan, &args, &mut ws).unwrap();
        }
        let what = format!(
            "sdpa {} {sh:?} causal={causal} training={training} plan {}",
            T::DTYPE,
            plan.name()
        );
        let got = fetch(&s, &sh.q(), &bshd(sh.q()), &ob);
        assert_close(&format!("{what}: O"), &got, &want.o, tol::<T>());
        if let Some(sb) = sb {
            let got = download(&s, &sb);
            assert_close(&format!("{what}: stats"), &got, &want.stats, STATS_TOL);
        }
    }
}

#[test]
fn gpu_sdpa_forward_bf16_causal_training() {
    fwd_case::<bf16>(SQUARE_128, true, true, 1);
}

#[test]
fn gpu_sdpa_forward_bf16_noncausal_inference() {
    fwd_case::<bf16>(SMALL, false, false, 2);
}

#[test]
fn gpu_sdpa_forward_f16_causal_inference() {
    fwd_case::<f16>(SMALL, true, false, 3);
}

#[test]
fn gpu_sdpa_forward_f16_noncausal_training() {
    fwd_case::<f16>(SQUARE_128, false, true, 4);
}

#[test]
fn gpu_sdpa_forward_cross_attention_bf16_and_f16() {
    // s_q ≠ s_kv, not causal.
    let sh = CROSS;
    fwd_case::<bf16>(sh, false, true, 5);
    fwd_case::<f16>(sh, false, false, 6);
}

#[test]
fn gpu_sdpa_forward_grouped_and_multi_query() {
    fwd_case::<bf16>(GQA, true, true, 31);
    fwd_case::<bf16>(MQA, false, true, 32);
    fwd_case::<f16>(GQA, false, false, 33);
    fwd_case::<f16>(MQA, true, false, 34);
}

#[test]
fn gpu_sdpa_forward_head_dim_128_bf16() {
    fwd_case::<bf16>(Shape { d: 128, ..SMALL }, true, true, 7);
}

/// The gradient outputs and scratch tensors of a backward graph, poisoned with NaN.
struct GradBufs<T: DataType> {
    dq: CudaSlice<T>,
    dk: CudaSlice<T>,
    dv: CudaSlice<T>,
    sum: CudaSlice<f32>,
    acc: Option<CudaSlice<f32>>,
    dbias: Option<CudaSlice<T>>,
}

impl<T: DataType> GradBufs<T> {
    fn poisoned(
        s: &Arc<CudaStream>,
        og: &OperationGraph,
        gr: &cudnn_safe::graph::SdpaGrads,
    ) -> Self {
        let span = |t| og.span(t).unwrap();
        GradBufs {
            dq: poisoned_buffer(s, span(gr.dq)),
            dk: poisoned_buffer(s, span(gr.dk)),
            dv: poisoned_buffer(s, span(gr.dv)),
            sum: poisoned_buffer(s, span(gr.softmax_sum)),
            acc: gr.dq_accum.map(|t| poisoned_buffer(s, span(t))),
            dbias: gr.dbias.map(|t| poisoned_buffer(s, span(t))),
        }
    }

    /// Binds every buffer to its tensor of `gr`.
    fn bind<'a>(&'a mut self, args: &mut Args<'a>, gr: &cudnn_safe::graph::SdpaGrads) {
        args.output(gr.dq, &mut self.dq).unwrap();
        args.output(gr.dk, &mut self.dk).unwrap();
        args.output(gr.dv, &mut self.dv).unwrap();
        args.output(gr.softmax_sum, &mut self.sum).unwrap();
        if let (Some(t), Some(buf)) = (gr.dq_accum, self.acc.as_mut()) {
            args.output(t, buf).unwrap();
        }
        if let (Some(t), Some(buf)) = (gr.dbias, self.dbias.as_mut()) {
            args.output(t, buf).unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Padding mask (sequences of different lengths per batch entry)
// ---------------------------------------------------------------------------------------------

/// Whether logical element `idx` of a `[b, h, s, d]` tensor lies in a valid row
/// (`s < lens[b]`).
fn valid_row(dims: [i64; 4], idx: usize, lens: &[usize]) -> bool {
    let [_, h, s, d] = dims.map(|x| x as usize);
    let row = (idx / d) % s;
    let b = idx / (d * s * h);
    row < lens[b]
}

/// What a padding position holds: the NaN poison (not written), 0, or something else (of
/// which −∞ is counted too, and the first value kept for the report).
#[derive(Debug, Default, PartialEq)]
struct Padded {
    untouched: usize,
    zero: usize,
    other: usize,
    neg_inf: usize,
    first_other: Option<f64>,
}

/// Whether every padding position was written as 0.
fn zeros(p: &Padded) -> bool {
    p.untouched == 0 && p.other == 0
}

/// Compares the valid rows of `got` with `want` and classifies the padding rows.
fn check_valid<T: DataType>(
    what: &str,
    dims: [i64; 4],
    got: &[T],
    want: &[f64],
    lens: &[usize],
    tol: f64,
) -> Padded {
    let mut padded = Padded::default();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64();
        if valid_row(dims, i, lens) {
            assert!(
                g.is_finite() && (g - w).abs() <= tol * (1.0 + w.abs()),
                "{what}: element {i}: got {g}, want {w} (tol {tol})"
            );
        } else if g.is_nan() {
            padded.untouched += 1;
        } else if g == 0.0 {
            padded.zero += 1;
        } else {
            padded.other += 1;
            padded.neg_inf += usize::from(g == f64::NEG_INFINITY);
            padded.first_other.get_or_insert(g);
        }
    }
    padded
}

/// The inputs of a backward test after a forward reference `fwd`: O as stored (0 in padding
/// rows), the statistics in f32 (0 in padding rows) and a random dO (drawn from `rng`) on the
/// device, and the f64 gradients of the reference.
struct BwdRef<T: DataType> {
    want: Grads,
    ob: CudaSlice<T>,
    dob: CudaSlice<T>,
    sb: CudaSlice<f32>,
}

impl<T: DataType> BwdRef<T> {
    fn new(s: &Arc<CudaStream>, sh: Shape, fwd: &Forward, inputs: &Qkv<T>, rng: &mut Rng) -> Self {
        let [qf, kf, vf] = inputs.f64();
        let ov: Vec<T> = fwd.o.iter().map(|&x| T::from_f64(x)).collect();
        let sv: Vec<f32> = fwd
            .stats
            .iter()
            .map(|&x| if x.is_nan() { 0.0 } else { x as f32 })
            .collect();
        let dov: Vec<T> = rng.values(sh.q_len());
        let want = reference_backward(
            sh,
            [&qf, &kf, &vf],
            &to_f64(&ov),
            &to_f64(&dov),
            &fwd.p,
            None,
            sh.scale(),
        );
        BwdRef {
            want,
            ob: upload(s, &sh.q(), &bshd(sh.q()), &ov),
            dob: upload(s, &sh.q(), &bshd(sh.q()), &dov),
            sb: s.clone_htod(&sv).unwrap(),
        }
    }
}

#[test]
fn gpu_sdpa_padding_mask_forward_and_backward() {
    let padded = |causal, lq, lkv| ModCase {
        mask: Mask::causal(causal),
        lens: Some((lq, lkv)),
        ..ModCase::default()
    };
    modified_case::<bf16>(SMALL, padded(false, &[64, 37], &[50, 64]), 41);
    modified_case::<bf16>(SMALL, padded(true, &[40, 64], &[64, 23]), 42);
    modified_case::<f16>(CROSS, padded(false, &[64, 20], &[128, 90]), 43);
    modified_case::<bf16>(GQA, padded(true, &[33, 64], &[64, 64]), 44);
}

#[test]
fn gpu_sdpa_padding_lengths_are_checked() {
    let Some((s, cudnn)) = gpu() else { return };
    let sh = SMALL;
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let [q, k, v] = qkv_inputs(&mut g, sh.q(), sh.kv(), DType::BF16).unwrap();
    let seq_q = g.seq_len_input("seq_len_q", 2).unwrap();
    let seq_kv = g.seq_len_input("seq_len_kv", 2).unwrap();
    let out = g
        .sdpa(q, k, v, &SdpaOptions::new().padding(seq_q, seq_kv))
        .unwrap();
    let og = g.build(&cudnn).unwrap();
    let plan = plans(&cudnn, &og, 1).remove(0);
    let mut rng = Rng::new(45);
    let inputs = Qkv::<bf16>::random(&s, sh, &mut rng);
    let mut ws = Workspace::new(s.clone());
    let (mut ob, before) = sentinel_buffer::<bf16>(&s, og.span(out.o).unwrap());
    let device_lengths = s.clone_htod(&[64i32, 64]).unwrap();
    for (what, lq, lkv, device) in [
        ("a length above s_kv", [64, 64], [64, 65], false),
        ("a negative length", [-1, 64], [64, 64], false),
        ("too few lengths", [64, 64], [64, 64], true),
        (
            "lengths from an unchecked device buffer",
            [64, 64],
            [64, 64],
            true,
        ),
    ] {
        let r = {
            let mut args = Args::new(&cudnn);
            bind_qkv(&mut args, [q, k, v], inputs.bufs());
            args.output(out.o, &mut ob).unwrap();
            if what == "too few lengths" {
                args.lengths(seq_q, &lq[..1]).unwrap();
                args.lengths(seq_kv, &lkv).unwrap();
            } else if device {
                args.lengths(seq_q, &lq).unwrap();
                args.input(seq_kv, &device_lengths).unwrap();
            } else {
                args.lengths(seq_q, &lq).unwrap();
                args.lengths(seq_kv, &lkv).unwrap();
            }
            cudnn.execute(&plan, &args, &mut ws)
        };
        let kind = if what == "too few lengths" {
            kind!(BufferTooSmall)
        } else {
            kind!(InvalidArgument)
        };
        assert!(matches!(&r, Err(e) if kind(e)), "{what}: {r:?}");
        assert_untouched(what, &s, &ob, &before);
    }
}

// ---------------------------------------------------------------------------------------------
// Score modifiers: bottom-right causal mask, sliding window, bias and its gradient, and the
// deterministic backward form
// ---------------------------------------------------------------------------------------------

/// A test of score modifiers: the mask, padding lengths, a bias of the given batch and head
/// extents, and what the backward graph outputs.
#[derive(Debug, Clone, Copy, Default)]
struct ModCase<'a> {
    mask: Mask,
    lens: Option<(&'a [usize], &'a [usize])>,
    bias: Option<[usize; 2]>,
    alibi: bool,
    bias_grad: bool,
    deterministic: bool,
}

impl ModCase<'_> {
    /// The options of the case (for the backward graph too), given the graph's length and
    /// bias tensors.
    fn opts(&self, mi: &ModInputs) -> SdpaOptions {
        let mut o = self.mask.opts().deterministic(self.deterministic);
        if let Some((q, kv)) = mi.padding {
            o = o.padding(q, kv);
        }
        if let Some(b) = mi.bias {
            o = o.bias(b).bias_grad(self.bias_grad);
        }
        if let Some(sl) = mi.slopes {
            o = o.alibi(sl);
        }
        o
    }

    /// Declares the length inputs and the bias (packed) of the case in `g`.
    fn inputs(&self, g: &mut Graph, sh: Shape, dtype: DType) -> ModInputs {
        let padding = self.lens.map(|_| {
            let b = sh.b as i64;
            let q = g.seq_len_input("seq_len_q", b).unwrap();
            (q, g.seq_len_input("seq_len_kv", b).unwrap())
        });
        let bias = self.bias.map(|[nb, nh]| {
            let dims = [nb, nh, sh.s_q, sh.s_kv].map(|x| x as i64);
            g.tensor_nchw("bias", &dims, dtype).unwrap()
        });
        let slopes = self
            .alibi
            .then(|| g.alibi_slopes_input("slopes", sh.h as i64).unwrap());
        ModInputs {
            padding,
            bias,
            slopes,
        }
    }

    /// Every row's key columns, as the lengths say (all of them without padding).
    fn lens_or_full(&self, sh: Shape) -> (Vec<usize>, Vec<usize>) {
        match self.lens {
            Some((q, kv)) => (q.to_vec(), kv.to_vec()),
            None => (vec![sh.s_q; sh.b], vec![sh.s_kv; sh.b]),
        }
    }
}

/// The length and bias tensors of a [`ModCase`] in one graph.
struct ModInputs {
    padding: Option<(TensorId, TensorId)>,
    bias: Option<TensorId>,
    slopes: Option<TensorId>,
}

impl ModInputs {
    /// Binds the lengths, the bias buffer and the ALiBi slopes buffer.
    fn bind<'a, T: DataType>(
        &self,
        args: &mut Args<'a>,
        lens: &(Vec<usize>, Vec<usize>),
        bias: Option<&'a CudaSlice<T>>,
        slopes: Option<&'a CudaSlice<f32>>,
    ) {
        if let (Some(t), Some(buf)) = (self.slopes, slopes) {
            args.input(t, buf).unwrap();
        }
        let i32s = |l: &[usize]| l.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        if let Some((q, kv)) = self.padding {
            args.lengths(q, &i32s(&lens.0)).unwrap();
            args.lengths(kv, &i32s(&lens.1)).unwrap();
        }
        if let (Some(t), Some(buf)) = (self.bias, bias) {
            args.input(t, buf).unwrap();
        }
    }
}

/// Forward (training) and backward graphs with the case's score modifiers against the f64
/// reference of the modified problem: O and the statistics, dQ, dK, dV (and dBias: the
/// gradient of the biased scores summed over the batch) in the valid rows, on the first two
/// plans of each graph, outputs poisoned with NaN. With a padding mask, the padding rows must
/// be written as [`Graph::sdpa`] documents: 0 in O, dQ, dK and dV, −∞ in the statistics. With
/// `deterministic`, each backward plan runs twice and the two results must agree bit for bit.
fn modified_case<T: DataType>(sh: Shape, c: ModCase, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    let inputs = Qkv::<T>::random(&s, sh, &mut rng);
    let [qf, kf, vf] = inputs.f64();
    let bias_host: Option<Vec<T>> = c
        .bias
        .map(|[nb, nh]| rng.values(nb * nh * sh.s_q * sh.s_kv));
    let bias_f64 = bias_host.as_deref().map(to_f64);
    let bias_dev = bias_host.as_deref().map(|v| s.clone_htod(v).unwrap());
    let slopes_host = c.alibi.then(|| alibi_slopes(sh.h).unwrap());
    let slopes_f64 = slopes_host.as_deref().map(to_f64);
    let slopes_dev = slopes_host.as_deref().map(|v| s.clone_htod(v).unwrap());
    let lens = c.lens_or_full(sh);
    let mods = Mods {
        mask: c.mask,
        lens: Some((&lens.0, &lens.1)),
        bias: c
            .bias
            .zip(bias_f64.as_deref())
            .map(|(bh, vals)| BiasRef { vals, bh }),
        alibi: slopes_f64.as_deref(),
    };
    let scale = sh.scale();
    let fwd = reference_forward_mods(sh, &qf, &kf, &vf, scale, &mods);
    let mut ws = Workspace::new(s.clone());
    let what = format!("sdpa {} {sh:?} {c:?}", T::DTYPE);

    // Forward.
    let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
    let [q, k, v] = qkv_inputs(&mut g, sh.q(), sh.kv(), T::DTYPE).unwrap();
    let mi = c.inputs(&mut g, sh, T::DTYPE);
    let opts = c.opts(&mi).training(true);
    let out = g.sdpa(q, k, v, &opts).unwrap();
    let st = out.stats.unwrap();
    let og = g.build(&cudnn).unwrap();
    for plan in plans(&cudnn, &og, 2) {
        let mut ob = poisoned_buffer::<T>(&s, og.span(out.o).unwrap());
        let mut sb = poisoned_buffer::<f32>(&s, og.span(st).unwrap());
        {
            let mut args = Args::new(&cudnn);
            bind_qkv(&mut args, [q, k, v], inputs.bufs());
            mi.bind(&mut args, &lens, bias_dev.as_ref(), slopes_dev.as_ref());
            args.output(out.o, &mut ob).unwrap();
            args.output(st, &mut sb).unwrap();
            cudnn.execute(&plan, &args, &mut ws).unwrap();
        }
        let w = format!("{what} forward plan {}", plan.name());
        let got = fetch(&s, &sh.q(), &bshd(sh.q()), &ob);
        let po = check_valid(
            &format!("{w}: O"),
            sh.q(),
            &got,
            &fwd.o,
            &lens.0,
            tol::<T>(),
        );
        let got = download(&s, &sb);
        let ps = check_valid(
            &format!("{w}: stats"),
            sh.stats(),
            &got,
            &fwd.stats,
            &lens.0,
            STATS_TOL,
        );
        eprintln!("{w}: padding rows of O {po:?}, of stats {ps:?}");
        let neg_inf = ps.untouched == 0 && ps.zero == 0 && ps.other == ps.neg_inf;
        assert!(zeros(&po) && neg_inf, "{w}: O {po:?}, stats {ps:?}");
    }

    // Backward, reading the reference O (0 in padding rows) and statistics (0 there).
    let BwdRef { want, ob, dob, sb } = BwdRef::new(&s, sh, &fwd, &inputs, &mut rng);
    let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
    let [q, k, v, o, d_o, stats] = bwd_inputs(&mut g, sh, T::DTYPE).unwrap();
    let mi = c.inputs(&mut g, sh, T::DTYPE);
    let gr = g
        .sdpa_backward(q, k, v, o, d_o, stats, &c.opts(&mi))
        .unwrap();
    assert_eq!(gr.dq_accum.is_none(), c.deterministic || c.bias_grad);
    assert_eq!(gr.dbias.is_some(), c.bias_grad);
    let og = g.build(&cudnn).unwrap();
    // dBias `[1, h, s_q, s_kv]`: the gradient of the biased scores summed over the batch.
    let plane = sh.h * sh.s_q * sh.s_kv;
    let dbias: Vec<f64> = (0..plane)
        .map(|x| (0..sh.b).map(|bi| want.ds_unscaled[bi * plane + x]).sum())
        .collect();
    let runs = if c.deterministic { 2 } else { 1 };
    for plan in plans(&cudnn, &og, 2) {
        let w = format!(
            "{what} backward plan {} notes {:?}",
            plan.name(),
            plan.numerical_notes()
        );
        let mut first: Option<[Vec<T>; 3]> = None;
        for run in 0..runs {
            let mut bufs = GradBufs::<T>::poisoned(&s, &og, &gr);
            {
                let mut args = Args::new(&cudnn);
                bind_qkv(&mut args, [q, k, v], inputs.bufs());
                args.input(o, &ob).unwrap().input(d_o, &dob).unwrap();
                args.input(stats, &sb).unwrap();
                mi.bind(&mut args, &lens, bias_dev.as_ref(), slopes_dev.as_ref());
                bufs.bind(&mut args, &gr);
                cudnn.execute(&plan, &args, &mut ws).unwrap();
            }
            let t = tol::<T>();
            let got_dq = fetch(&s, &sh.q(), &bshd(sh.q()), &bufs.dq);
            let pq = check_valid(&format!("{w}: dQ"), sh.q(), &got_dq, &want.dq, &lens.0, t);
            let got_dk = fetch(&s, &sh.kv(), &bshd(sh.kv()), &bufs.dk);
            let pk = check_valid(&format!("{w}: dK"), sh.kv(), &got_dk, &want.dk, &lens.1, t);
            let got_dv = fetch(&s, &sh.kv(), &bshd(sh.kv()), &bufs.dv);
            let pv = check_valid(&format!("{w}: dV"), sh.kv(), &got_dv, &want.dv, &lens.1, t);
            eprintln!("{w}: padding rows of dQ {pq:?}, dK {pk:?}, dV {pv:?}");
            assert!(
                zeros(&pq) && zeros(&pk) && zeros(&pv),
                "{w}: dQ {pq:?} dK {pk:?} dV {pv:?}"
            );
            if let Some(buf) = &bufs.dbias {
                assert_close(&format!("{w}: dBias"), &download(&s, buf), &dbias, t);
            }
            let got = [got_dq, got_dk, got_dv];
            match &first {
                None => first = Some(got),
                Some(f) => {
                    for (name, (a, b)) in ["dQ", "dK", "dV"].iter().zip(f.iter().zip(&got)) {
                        let same = a
                            .iter()
                            .zip(b)
                            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits());
                        assert!(same, "{w}: {name} of run {run} differs from run 0");
                    }
                }
            }
        }
        eprintln!("{w}: checked ({runs} run(s))");
    }
}

const BOTTOM_RIGHT: Mask = Mask {
    causal: Some(DiagonalAlignment::BottomRight),
    window: None,
};

#[test]
fn gpu_sdpa_bottom_right_causal_forward_and_backward() {
    let c = ModCase {
        mask: BOTTOM_RIGHT,
        ..ModCase::default()
    };
    // 64 queries against 128 keys: query i sees keys j ≤ i + 64.
    modified_case::<bf16>(CROSS, c, 51);
    modified_case::<f16>(CROSS, c, 52);
    // Square: the same as top-left.
    modified_case::<bf16>(SMALL, c, 53);
    modified_case::<bf16>(GQA, c, 54);
    // Per-entry lengths: the diagonal ends at each entry's last valid query and key.
    let padded = ModCase {
        lens: Some((&[40, 30], &[64, 50])),
        ..c
    };
    modified_case::<bf16>(SMALL, padded, 55);
}

#[test]
fn gpu_sdpa_sliding_window_forward_and_backward() {
    let window = |causal, w| ModCase {
        mask: Mask {
            causal: Some(causal),
            window: Some(w),
        },
        ..ModCase::default()
    };
    modified_case::<bf16>(SQUARE_128, window(DiagonalAlignment::TopLeft, 32), 61);
    modified_case::<f16>(SMALL, window(DiagonalAlignment::TopLeft, 1), 62);
    modified_case::<bf16>(CROSS, window(DiagonalAlignment::BottomRight, 48), 63);
    let padded = ModCase {
        lens: Some((&[40, 64], &[64, 64])),
        ..window(DiagonalAlignment::BottomRight, 20)
    };
    modified_case::<bf16>(SMALL, padded, 64);
}

#[test]
fn gpu_sdpa_bias_forward_and_backward() {
    let sh = SQUARE_128;
    // A per-head bias with its gradient, causal and not.
    for (causal, seed) in [(false, 71), (true, 72)] {
        let c = ModCase {
            mask: Mask::causal(causal),
            bias: Some([1, sh.h]),
            bias_grad: true,
            ..ModCase::default()
        };
        modified_case::<bf16>(sh, c, seed);
    }
    modified_case::<f16>(
        SMALL,
        ModCase {
            bias: Some([1, SMALL.h]),
            bias_grad: true,
            ..ModCase::default()
        },
        73,
    );
    // Broadcast biases without gradient: per batch entry, and one for all.
    for (bh, seed) in [([SMALL.b, 1], 74), ([1, 1], 75), ([SMALL.b, SMALL.h], 76)] {
        let c = ModCase {
            mask: Mask::causal(true),
            bias: Some(bh),
            ..ModCase::default()
        };
        modified_case::<bf16>(SMALL, c, seed);
    }
}

#[test]
fn gpu_sdpa_alibi_forward_and_backward() {
    let c = ModCase {
        mask: Mask::causal(true),
        alibi: true,
        ..ModCase::default()
    };
    // 3 heads: the slopes of the next power of two's odd steps for the third.
    modified_case::<bf16>(SQUARE_128, c, 91);
    modified_case::<f16>(GQA, c, 92);
    modified_case::<bf16>(CROSS, c, 93);
}

#[test]
fn gpu_sdpa_deterministic_backward_repeats_bitwise() {
    let c = ModCase {
        mask: Mask::causal(true),
        deterministic: true,
        ..ModCase::default()
    };
    let sh = Shape {
        s_q: 256,
        s_kv: 256,
        ..SMALL
    };
    modified_case::<bf16>(sh, c, 81);
    modified_case::<f16>(
        GQA,
        ModCase {
            mask: Mask::default(),
            ..c
        },
        82,
    );
}

#[test]
fn host_sdpa_score_modifier_graphs_and_records() {
    let bf = DType::BF16;
    let sig = |sh: Shape, c: ModCase| {
        let mut g = Graph::new(bf, DType::F32, DType::F32);
        let [q, k, v] = qkv_inputs(&mut g, sh.q(), sh.kv(), bf).unwrap();
        let mi = c.inputs(&mut g, sh, bf);
        g.sdpa(q, k, v, &c.opts(&mi).training(true)).unwrap();
        let mut gb = Graph::new(bf, DType::F32, DType::F32);
        let [q, k, v, o, d_o, stats] = bwd_inputs(&mut gb, sh, bf).unwrap();
        let mi = c.inputs(&mut gb, sh, bf);
        let gr = gb
            .sdpa_backward(q, k, v, o, d_o, stats, &c.opts(&mi))
            .unwrap();
        if let Some(db) = gr.dbias {
            assert_eq!(
                gb.dims(db).unwrap(),
                &[1, sh.h as i64, sh.s_q as i64, sh.s_kv as i64]
            );
            assert_eq!(gb.dtype(db).unwrap(), bf);
            assert!(!gb.is_virtual(db).unwrap());
        }
        assert_eq!(
            gr.dq_accum.is_none(),
            c.deterministic || c.bias_grad,
            "{c:?}"
        );
        if have_cudnn() {
            for g in [&g, &gb] {
                common::check_with_record(g).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            }
        }
        (g.signature(), gb.signature())
    };
    let br = |w| ModCase {
        mask: Mask {
            causal: Some(DiagonalAlignment::BottomRight),
            window: w,
        },
        ..ModCase::default()
    };
    let tl = |w| ModCase {
        mask: Mask {
            causal: Some(DiagonalAlignment::TopLeft),
            window: w,
        },
        ..ModCase::default()
    };
    let lens: (&[usize], &[usize]) = (&[40, 30], &[64, 50]);
    let cases = [
        (CROSS, tl(None)),
        (CROSS, br(None)),
        (SMALL, br(None)),
        (
            SMALL,
            ModCase {
                lens: Some(lens),
                ..br(None)
            },
        ),
        (CROSS, tl(Some(16))),
        (CROSS, br(Some(16))),
        (
            SMALL,
            ModCase {
                lens: Some(lens),
                ..br(Some(16))
            },
        ),
        (
            SMALL,
            ModCase {
                lens: Some(lens),
                ..tl(Some(16))
            },
        ),
        (
            SMALL,
            ModCase {
                bias: Some([1, 3]),
                ..ModCase::default()
            },
        ),
        (
            SMALL,
            ModCase {
                bias: Some([1, 3]),
                bias_grad: true,
                ..tl(None)
            },
        ),
        (
            SMALL,
            ModCase {
                bias: Some([2, 1]),
                ..tl(None)
            },
        ),
        (
            SMALL,
            ModCase {
                deterministic: true,
                ..tl(None)
            },
        ),
        (
            GQA,
            ModCase {
                deterministic: true,
                ..ModCase::default()
            },
        ),
        (
            SMALL,
            ModCase {
                alibi: true,
                ..tl(None)
            },
        ),
        (
            GQA,
            ModCase {
                alibi: true,
                bias: Some([1, 4]),
                bias_grad: true,
                ..tl(None)
            },
        ),
    ];
    let mut seen = std::collections::HashSet::new();
    for (sh, c) in cases {
        let (f, b) = sig(sh, c);
        assert!(
            seen.insert(f.clone()) || c.deterministic || c.bias_grad,
            "{c:?}: forward {f}"
        );
        assert!(seen.insert(b.clone()), "{c:?}: backward signature repeated");
    }
    // The top-left causal mask builds the graph it built before the other alignments existed.
    let (plain, _) = sig(CROSS, tl(None));
    let (g, ..) = fwd_graph(bf, CROSS, &SdpaOptions::new().causal(true).training(true)).unwrap();
    assert_eq!(plain, g.signature());
    // Option accessors; the last causal call decides the alignment.
    let o = SdpaOptions::new()
        .causal(true)
        .causal_bottom_right(true)
        .sliding_window(8);
    assert_eq!(o.causal, Some(DiagonalAlignment::BottomRight));
    assert_eq!(o.sliding_window, Some(8));
    assert!(o.causal.is_some() && o.causal(false).causal.is_none());
    assert!(SdpaOptions::new().deterministic(true).deterministic);
    // ALiBi slopes: cudnn-frontend's get_alibi_slope (powers of two; odd steps past 2^k heads).
    assert_eq!(alibi_slopes(3).unwrap(), [1.0 / 16.0, 1.0 / 256.0, 0.25]);
    let eight: Vec<f32> = (1..=8).map(|i| 2f32.powi(-i)).collect();
    assert_eq!(alibi_slopes(8).unwrap(), eight);
    assert!(alibi_slopes(0).unwrap().is_empty());
    assert!(matches!(
        alibi_slopes(usize::MAX),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn host_sdpa_score_modifier_rejections() {
    let bf = DType::BF16;
    // Each case: a forward and a backward graph with the options `f` makes from the graph's
    // bias tensor (`[1, h, s_q, s_kv]`, or `bias_dims`); both must be refused with `kind`
    // naming `name`, leaving the graph unchanged.
    let case = |sh: Shape,
                bias_dims: Option<[i64; 4]>,
                bias_type: DType,
                f: &dyn Fn(Option<TensorId>) -> SdpaOptions,
                kind: Kind,
                name: &str,
                backward_only: bool| {
        let mut g = Graph::new(bf, DType::F32, DType::F32);
        let [q, k, v] = qkv_inputs(&mut g, sh.q(), sh.kv(), bf).unwrap();
        let bias = bias_dims.map(|d| g.tensor_nchw("bias", &d, bias_type).unwrap());
        let before = g.signature();
        let r = g.sdpa(q, k, v, &f(bias)).map(|_| ());
        if backward_only {
            assert!(r.is_ok(), "forward {name}: {r:?}");
        } else {
            assert!(rejected(&r, kind, name), "forward {name}: {r:?}");
            assert_eq!(g.signature(), before);
        }
        let mut g = Graph::new(bf, DType::F32, DType::F32);
        let [q, k, v, o, d_o, stats] = bwd_inputs(&mut g, sh, bf).unwrap();
        let bias = bias_dims.map(|d| g.tensor_nchw("bias", &d, bias_type).unwrap());
        let before = g.signature();
        let r = g
            .sdpa_backward(q, k, v, o, d_o, stats, &f(bias))
            .map(|_| ());
        assert!(rejected(&r, kind, name), "backward {name}: {r:?}");
        assert_eq!(g.signature(), before);
    };
    let none = None;
    let inv = kind!(InvalidArgument);
    let causal = SdpaOptions::new().causal(true);
    let br = SdpaOptions::new().causal_bottom_right(true);
    case(
        SMALL,
        none,
        bf,
        &|_| causal.sliding_window(0),
        inv,
        "window ≥ 1",
        false,
    );
    case(
        SMALL,
        none,
        bf,
        &|_| SdpaOptions::new().sliding_window(8),
        inv,
        "causal",
        false,
    );
    // More queries than keys without padding.
    let long_q = Shape {
        s_q: 128,
        s_kv: 64,
        ..SMALL
    };
    case(long_q, none, bf, &|_| br, inv, "s_q 128 > s_kv 64", false);
    case(
        long_q,
        none,
        bf,
        &|_| causal.sliding_window(8),
        inv,
        "s_q 128",
        false,
    );
    // Bottom-right with a bias or dropout.
    let full = Some([1, 3, 64, 64]);
    case(
        SMALL,
        full,
        bf,
        &|b| br.bias(b.unwrap()),
        inv,
        "without bias",
        false,
    );
    // Bias: data type, dims, a gradient without a bias, a gradient of a broadcast bias.
    let r = kind!(UnsupportedDataType);
    case(
        SMALL,
        full,
        DType::F16,
        &|b| causal.bias(b.unwrap()),
        r,
        "`bias`",
        false,
    );
    let odd = Some([1, 2, 64, 64]);
    case(
        SMALL,
        odd,
        bf,
        &|b| causal.bias(b.unwrap()),
        inv,
        "`bias`",
        false,
    );
    let short = Some([1, 3, 64, 32]);
    case(
        SMALL,
        short,
        bf,
        &|b| causal.bias(b.unwrap()),
        inv,
        "`bias`",
        false,
    );
    case(
        SMALL,
        none,
        bf,
        &|_| causal.bias_grad(true),
        inv,
        "no bias",
        true,
    );
    let per_batch = Some([2, 1, 64, 64]);
    let grad = |b: Option<TensorId>| causal.bias(b.unwrap()).bias_grad(true);
    case(SMALL, per_batch, bf, &grad, inv, "`bias`", true);

    // ALiBi: only with a top-left causal mask, slopes f32 [1, h, 1, 1].
    let alibi_case = |causal: SdpaOptions, dims: [i64; 4], dtype: DType, what: &str| {
        let mut g = Graph::new(bf, DType::F32, DType::F32);
        let [q, k, v] = qkv_inputs(&mut g, SMALL.q(), SMALL.kv(), bf).unwrap();
        let sl = g.tensor_nchw("slopes", &dims, dtype).unwrap();
        let r = g.sdpa(q, k, v, &causal.alibi(sl)).map(|_| ());
        assert!(rejected(&r, inv, what), "{what}: {r:?}");
    };
    alibi_case(
        SdpaOptions::new(),
        [1, 3, 1, 1],
        DType::F32,
        "top-left causal",
    );
    alibi_case(br, [1, 3, 1, 1], DType::F32, "top-left causal");
    alibi_case(causal, [1, 2, 1, 1], DType::F32, "`slopes`");
    alibi_case(causal, [1, 3, 1, 1], bf, "`slopes`");
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    assert!(g.alibi_slopes_input("none", 0).is_err());

    // k (or v, backward) as the bias: the graph describes them transposed.
    // SMALL has d = s_q = s_kv: k's dimensions are those of a bias.
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    let [q, k, v] = qkv_inputs(&mut g, SMALL.q(), SMALL.kv(), bf).unwrap();
    let r = g.sdpa(q, k, v, &causal.bias(k)).map(|_| ());
    assert!(rejected(&r, inv, "`k` passed as the bias"), "{r:?}");
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    let [q, k, v, o, d_o, stats] = bwd_inputs(&mut g, SMALL, bf).unwrap();
    let r = g
        .sdpa_backward(q, k, v, o, d_o, stats, &causal.bias(v))
        .map(|_| ());
    assert!(rejected(&r, inv, "`v` passed as the bias"), "{r:?}");

    // Dropout with a bottom-right mask.
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    let [q, k, v] = qkv_inputs(&mut g, SMALL.q(), SMALL.kv(), bf).unwrap();
    let (seed, offset) = (g.rng_input("seed"), g.rng_input("offset"));
    let r = g.sdpa(q, k, v, &br.dropout(0.1, seed, offset)).map(|_| ());
    assert!(rejected(&r, inv, "dropout true"), "{r:?}");
    // A padding mask lifts the s_q ≤ s_kv rule (each entry's lengths are the caller's).
    let mut g = Graph::new(bf, DType::F32, DType::F32);
    let [q, k, v] = qkv_inputs(&mut g, long_q.q(), long_q.kv(), bf).unwrap();
    let sq = g.seq_len_input("seq_len_q", 2).unwrap();
    let skv = g.seq_len_input("seq_len_kv", 2).unwrap();
    g.sdpa(q, k, v, &br.padding(sq, skv)).unwrap();
    if have_cudnn() {
        common::check_with_record(&g).unwrap();
    }
}

/// Dropout in a backward test: the mask the forward pass drew (f64, logical order), the scale
/// `c` of kept probabilities, and the seed and offset tensors and buffers.
struct BwdDropout<'a> {
    mask: &'a [f64],
    c: f64,
    ids: [TensorId; 2],
    bufs: [&'a CudaSlice<i64>; 2],
}

/// Checks a backward graph (inputs `[q, k, v, o, dO, stats]`, then seed and offset with
/// dropout) against the analytic f64 gradients: the GPU reads O (the reference output, with
/// dropout if given) as stored and the statistics in f32; the first 2 plans run on poisoned
/// gradient buffers and dQ, dK, dV are compared.
#[allow(clippy::too_many_arguments)]
fn check_bwd<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    og: &OperationGraph,
    sh: Shape,
    causal: bool,
    [q, k, v, o, d_o, stats]: [TensorId; 6],
    gr: &cudnn_safe::graph::SdpaGrads,
    inputs: &Qkv<T>,
    dov: &[T],
    dropout: Option<BwdDropout>,
    what: &str,
) {
    let scale = sh.scale();
    let [qf, kf, vf] = inputs.f64();
    let fwd = reference_forward(sh, &qf, &kf, &vf, scale, causal);
    let mask_c = dropout.as_ref().map(|d| (d.mask, d.c));
    // The GPU reads O as stored and the statistics in f32.
    let o_ref = attention_output(sh, &fwd.p, mask_c, &vf);
    let ov: Vec<T> = o_ref.iter().map(|&x| T::from_f64(x)).collect();
    let sv: Vec<f32> = fwd.stats.iter().map(|&x| x as f32).collect();
    let Grads { dq, dk, dv, .. } = reference_backward(
        sh,
        [&qf, &kf, &vf],
        &to_f64(&ov),
        &to_f64(dov),
        &fwd.p,
        mask_c,
        scale,
    );
    let layout = inputs.layout;
    let ob = upload(s, &sh.q(), &layout.strides(sh.q()), &ov);
    let dob = upload(s, &sh.q(), &layout.strides(sh.q()), dov);
    let sb = s.clone_htod(&sv).unwrap();
    let mut ws = Workspace::new(s.clone());
    for plan in plans(cudnn, og, 2) {
        let mut bufs = GradBufs::<T>::poisoned(s, og, gr);
        {
            let mut args = Args::new(cudnn);
            bind_qkv(&mut args, [q, k, v], inputs.bufs());
            args.input(o, &ob)
                .unwrap()
                .input(d_o, &dob)
                .unwrap()
                .input(stats, &sb)
                .unwrap();
            if let Some(BwdDropout {
                ids: [seed, offset],
                bufs: [seed_b, offset_b],
                ..
            }) = dropout
            {
                args.input_i64(seed, seed_b)
                    .unwrap()
                    .input_i64(offset, offset_b)
                    .unwrap();
            }
            bufs.bind(&mut args, gr);
            cudnn.execute(&plan, &args, &mut ws).unwrap();
        }
        let what = format!("{what} plan {}", plan.name());
        // Products of stored (rounded) probabilities and gradients, summed over up to 128
        // terms (with or without dropout): T's tolerance relative to (1 + |w|).
        let t = tol::<T>();
        for (name, dims, buf, want) in [
            ("dQ", sh.q(), &bufs.dq, &dq),
            ("dK", sh.kv(), &bufs.dk, &dk),
            ("dV", sh.kv(), &bufs.dv, &dv),
        ] {
            let got = fetch(s, &dims, &layout.strides(dims), buf);
            assert_close(&format!("{what}: {name}"), &got, want, t);
        }
    }
}

fn bwd_case<T: DataType>(sh: Shape, causal: bool, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let opts = SdpaOptions::new().causal(causal);
    let (g, ids, gr) = bwd_graph(T::DTYPE, sh, &opts).unwrap();
    let og = g.build(&cudnn).unwrap();
    let mut rng = Rng::new(seed);
    let inputs = Qkv::<T>::random(&s, sh, &mut rng);
    let dov: Vec<T> = rng.values(sh.q_len());
    let what = format!("sdpa backward {} {sh:?} causal={causal}", T::DTYPE);
    check_bwd(
        &s, &cudnn, &og, sh, causal, ids, &gr, &inputs, &dov, None, &what,
    );
}

#[test]
fn gpu_sdpa_backward_grouped_and_multi_query() {
    bwd_case::<bf16>(GQA, true, 35);
    bwd_case::<bf16>(MQA, false, 36);
    bwd_case::<f16>(GQA, false, 37);
    bwd_case::<f16>(MQA, true, 38);
}

#[test]
fn gpu_sdpa_backward_bf16_causal() {
    bwd_case::<bf16>(SQUARE_128, true, 11);
}

#[test]
fn gpu_sdpa_backward_bf16_noncausal() {
    bwd_case::<bf16>(SMALL, false, 12);
}

#[test]
fn gpu_sdpa_backward_f16_causal_and_noncausal() {
    bwd_case::<f16>(SMALL, true, 13);
    bwd_case::<f16>(SMALL, false, 14);
}

#[test]
fn gpu_sdpa_backward_cross_attention_bf16() {
    bwd_case::<bf16>(CROSS, false, 15);
}

/// Whether `r` is a [`Error::BufferTooSmall`] for the argument `name`.
fn too_small<T>(r: &cudnn_safe::Result<T>, name: &str) -> bool {
    matches!(r, Err(Error::BufferTooSmall { name: n, .. }) if *n == name)
}

#[test]
fn gpu_sdpa_short_buffers_rejected_outputs_untouched() {
    let Some((s, cudnn)) = gpu() else { return };
    let opts = SdpaOptions::new().causal(true).training(true);
    let (g, qkv, out) = fwd_graph(DType::BF16, SMALL, &opts).unwrap();
    let [_, k, _] = qkv;
    let og = g.build(&cudnn).unwrap();
    let plan = plans(&cudnn, &og, 1).remove(0);
    let stats = out.stats.unwrap();
    let mut rng = Rng::new(21);
    let [qb, kb, vb] = random_spans(&s, &og, qkv, &mut rng);
    let mut ws = Workspace::new(s.clone());
    // One execution with these k, O and statistics buffers.
    let mut exec =
        |kbuf: &CudaSlice<bf16>, obuf: &mut CudaSlice<bf16>, sbuf: &mut CudaSlice<f32>| {
            let mut args = Args::new(&cudnn);
            bind_qkv(&mut args, qkv, [&qb, kbuf, &vb]);
            args.output(out.o, obuf)
                .unwrap()
                .output(stats, sbuf)
                .unwrap();
            cudnn.execute(&plan, &args, &mut ws)
        };

    // O one element short.
    let (mut short_o, short_before) = sentinel_buffer::<bf16>(&s, og.span(out.o).unwrap() - 1);
    let (mut sb, s_before) = sentinel_buffer::<f32>(&s, og.span(stats).unwrap());
    let r = exec(&kb, &mut short_o, &mut sb);
    assert!(too_small(&r, "sdpa.o"), "{r:?}");
    assert_untouched("short O", &s, &short_o, &short_before);
    assert_untouched("stats beside a short O", &s, &sb, &s_before);

    // Stats one element short.
    let (mut ob, o_before) = sentinel_buffer::<bf16>(&s, og.span(out.o).unwrap());
    let (mut short_s, ss_before) = sentinel_buffer::<f32>(&s, og.span(stats).unwrap() - 1);
    let r = exec(&kb, &mut ob, &mut short_s);
    assert!(too_small(&r, "sdpa.stats"), "{r:?}");
    assert_untouched("O beside short stats", &s, &ob, &o_before);
    assert_untouched("short stats", &s, &short_s, &ss_before);

    // k one element short (an input).
    let short_k = s.alloc_zeros::<bf16>(og.span(k).unwrap() - 1).unwrap();
    let r = exec(&short_k, &mut ob, &mut sb);
    assert!(too_small(&r, "k"), "{r:?}");
    assert_untouched("O beside a short k", &s, &ob, &o_before);
}

// ---------------------------------------------------------------------------------------------
// Dropout
// ---------------------------------------------------------------------------------------------

/// The dropout seed and offset inputs, named `seed` and `offset`.
fn seed_offset_inputs(g: &mut Graph) -> [TensorId; 2] {
    [g.rng_input("seed"), g.rng_input("offset")]
}

/// A forward graph with dropout (probability `p`, seed and offset inputs), training, the mask
/// dumped.
#[allow(clippy::type_complexity)]
fn fwd_dropout_graph(
    dtype: DType,
    sh: Shape,
    causal: bool,
    p: f64,
    dump: bool,
) -> cudnn_safe::Result<(
    Graph,
    [TensorId; 3],
    [TensorId; 2],
    cudnn_safe::graph::SdpaOutputs,
)> {
    let mut g = Graph::new(dtype, DType::F32, DType::F32);
    let [q, k, v] = qkv_inputs(&mut g, sh.q(), sh.kv(), dtype)?;
    let [seed, offset] = seed_offset_inputs(&mut g);
    let opts = SdpaOptions::new()
        .causal(causal)
        .training(true)
        .dropout(p, seed, offset)
        .dump_dropout_mask(dump);
    let out = g.sdpa(q, k, v, &opts)?;
    Ok((g, [q, k, v], [seed, offset], out))
}

/// A backward graph with dropout: inputs q, k, v, o, dO, stats, then seed and offset.
#[allow(clippy::type_complexity)]
fn bwd_dropout_graph(
    dtype: DType,
    sh: Shape,
    causal: bool,
    p: f64,
) -> cudnn_safe::Result<(
    Graph,
    [TensorId; 6],
    [TensorId; 2],
    cudnn_safe::graph::SdpaGrads,
)> {
    let mut g = Graph::new(dtype, DType::F32, DType::F32);
    let [q, k, v, o, d_o, stats] = bwd_inputs(&mut g, sh, dtype)?;
    let [seed, offset] = seed_offset_inputs(&mut g);
    let opts = SdpaOptions::new().causal(causal).dropout(p, seed, offset);
    let grads = g.sdpa_backward(q, k, v, o, d_o, stats, &opts)?;
    Ok((g, [q, k, v, o, d_o, stats], [seed, offset], grads))
}

#[test]
fn host_sdpa_dropout_options() {
    let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    let [seed, offset] = seed_offset_inputs(&mut g);
    assert_eq!(g.dims(seed).unwrap(), &[1, 1, 1, 1]);
    assert_eq!(g.strides(offset).unwrap(), &[1, 1, 1, 1]);
    assert_eq!(g.dtype(seed).unwrap(), DType::I64);
    assert!(!g.is_virtual(seed).unwrap());
    let opts = SdpaOptions::new();
    assert_eq!(opts.dropout, None);
    assert!(!opts.dump_dropout_mask);
    let opts = opts.dropout(0.25, seed, offset).dump_dropout_mask(true);
    let d = opts.dropout.expect("dropout set");
    assert_eq!(d.probability, 0.25);
    assert_eq!((d.seed, d.offset), (seed, offset));
    assert!(opts.dump_dropout_mask);
    // INT64 tensors are made by rng_input only.
    let r = g.tensor("x", &[1, 1, 1, 1], &[1, 1, 1, 1], DType::I64);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
        "{r:?}"
    );
}

#[test]
fn host_sdpa_dropout_forward_shapes_and_finalize() {
    for dtype in [DType::BF16, DType::F16] {
        for causal in [false, true] {
            for dump in [false, true] {
                for p in [0.0, 0.1] {
                    if dump && p == 0.0 {
                        // Refused (host_sdpa_dropout_rejections).
                        continue;
                    }
                    let sh = CROSS;
                    let (g, _, [seed, offset], out) =
                        fwd_dropout_graph(dtype, sh, causal, p, dump).unwrap();
                    assert_eq!(g.dims(out.o).unwrap(), &sh.q());
                    assert_eq!(g.dtype(out.o).unwrap(), dtype);
                    assert!(out.stats.is_some());
                    match out.dropout_mask {
                        Some(m) => {
                            assert!(dump);
                            assert_eq!(g.dims(m).unwrap(), &[2, 3, 64, 128]);
                            assert_eq!(g.strides(m).unwrap(), &[3 * 64 * 128, 64 * 128, 128, 1]);
                            assert_eq!(g.dtype(m).unwrap(), DType::F32);
                            assert!(!g.is_virtual(m).unwrap());
                        }
                        None => assert!(!dump),
                    }
                    // Seed and offset stay [1, 1, 1, 1] INT64 inputs.
                    for t in [seed, offset] {
                        assert_eq!(g.dtype(t).unwrap(), DType::I64);
                        assert_eq!(g.dims(t).unwrap(), &[1, 1, 1, 1]);
                    }
                    if have_cudnn() {
                        common::check_with_record(&g).unwrap_or_else(|e| {
                            panic!("{dtype} causal={causal} dump={dump} p={p}: {e}")
                        });
                    }
                }
            }
        }
    }
}

#[test]
fn host_sdpa_dropout_backward_shapes_and_finalize() {
    for dtype in [DType::BF16, DType::F16] {
        for causal in [false, true] {
            for p in [0.0, 0.2] {
                let (g, _, _, gr) = bwd_dropout_graph(dtype, SMALL, causal, p).unwrap();
                assert_backward_outputs(&g, &gr, dtype);
                if have_cudnn() {
                    common::check_with_record(&g)
                        .unwrap_or_else(|e| panic!("{dtype} causal={causal} p={p}: {e}"));
                }
            }
        }
    }
}

#[test]
fn host_sdpa_dropout_signature() {
    let sig = |p: f64, dump: bool| {
        fwd_dropout_graph(DType::BF16, SMALL, true, p, dump)
            .unwrap()
            .0
            .signature()
    };
    let plain = fwd_graph(
        DType::BF16,
        SMALL,
        &SdpaOptions::new().causal(true).training(true),
    )
    .unwrap()
    .0
    .signature();
    assert_ne!(plain, sig(0.1, false));
    assert_ne!(sig(0.1, false), sig(0.2, false));
    assert_ne!(sig(0.1, false), sig(0.1, true));
    assert_eq!(sig(0.1, false), sig(0.1, false));
}

#[test]
fn host_sdpa_dropout_rejections() {
    let bf = DType::BF16;
    let (q, kv) = (SMALL.q(), SMALL.kv());
    // The forward with dropout options made from the graph's own seed / offset tensors.
    let fwd = |make: &dyn Fn(&mut Graph) -> SdpaOptions| {
        let mut g = Graph::new(bf, DType::F32, DType::F32);
        let [tq, tk, tv] = qkv_inputs(&mut g, q, kv, bf).unwrap();
        let opts = make(&mut g);
        let r = g.sdpa(tq, tk, tv, &opts).map(|_| ());
        // A rejected call leaves k as it was (not re-described as Kᵀ).
        if r.is_err() {
            assert_eq!(g.dims(tk).unwrap(), &kv);
        }
        r
    };
    let with_p = |p: f64| {
        move |g: &mut Graph| {
            let [s, o] = seed_offset_inputs(g);
            SdpaOptions::new().dropout(p, s, o)
        }
    };
    for p in [1.0, 1.5, -0.1, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let r = fwd(&with_p(p));
        assert!(
            rejected(&r, kind!(InvalidArgument), "probability"),
            "p = {p}: {r:?}"
        );
    }
    for p in [0.0, 0.5, 0.999] {
        fwd(&with_p(p)).unwrap_or_else(|e| panic!("p = {p}: {e}"));
    }
    // No mask dump at p = 0 (the kernels write none), named.
    let r = fwd(&|g: &mut Graph| with_p(0.0)(g).dump_dropout_mask(true));
    assert!(
        rejected(&r, kind!(InvalidArgument), "probability above 0"),
        "{r:?}"
    );
    fwd(&|g: &mut Graph| with_p(0.1)(g).dump_dropout_mask(true)).unwrap();
    // A seed or offset of the wrong data type, named.
    let r = fwd(&|g: &mut Graph| {
        let s = g
            .tensor_nchw("f32_seed", &[1, 1, 1, 1], DType::F32)
            .unwrap();
        let o = g.rng_input("offset");
        SdpaOptions::new().dropout(0.1, s, o)
    });
    assert!(
        rejected(&r, kind!(UnsupportedDataType), "`f32_seed`"),
        "{r:?}"
    );
    let r = fwd(&|g: &mut Graph| {
        let s = g.rng_input("seed");
        let o = g
            .tensor_nchw("half_offset", &[1, 1, 1, 1], DType::F16)
            .unwrap();
        SdpaOptions::new().dropout(0.1, s, o)
    });
    assert!(
        rejected(&r, kind!(UnsupportedDataType), "`half_offset`"),
        "{r:?}"
    );
    // A seed of another graph.
    let mut other = Graph::new(bf, DType::F32, DType::F32);
    let foreign = other.rng_input("foreign_seed");
    let r = fwd(&|g: &mut Graph| {
        let o = g.rng_input("offset");
        SdpaOptions::new().dropout(0.1, foreign, o)
    });
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    // A mask dump without dropout.
    let r = fwd(&|_: &mut Graph| SdpaOptions::new().dump_dropout_mask(true));
    assert!(
        rejected(&r, kind!(InvalidArgument), "dump_dropout_mask"),
        "{r:?}"
    );

    // The backward pass checks the same.
    let bwd = |p: f64, seed_type: Option<DType>| {
        let mut g = Graph::new(bf, DType::F32, DType::F32);
        let [tq, tk, tv, to, td, ts] = bwd_inputs(&mut g, SMALL, bf).unwrap();
        let s = match seed_type {
            Some(t) => g.tensor_nchw("bad_seed", &[1, 1, 1, 1], t).unwrap(),
            None => g.rng_input("seed"),
        };
        let o = g.rng_input("offset");
        let opts = SdpaOptions::new().dropout(p, s, o);
        let r = g.sdpa_backward(tq, tk, tv, to, td, ts, &opts).map(|_| ());
        if r.is_err() {
            assert_eq!(g.dims(tk).unwrap(), &kv);
            assert_eq!(g.dims(tv).unwrap(), &kv);
        }
        r
    };
    for p in [1.0, f64::NAN, -0.5] {
        let r = bwd(p, None);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "p = {p}: {r:?}"
        );
    }
    let r = bwd(0.1, Some(DType::F32));
    assert!(
        rejected(&r, kind!(UnsupportedDataType), "`bad_seed`"),
        "{r:?}"
    );
    bwd(0.1, None).unwrap();
}

/// Device buffers holding one `i64` each: a dropout seed and offset.
fn seed_offset(s: &Arc<CudaStream>, seed: i64, offset: i64) -> (CudaSlice<i64>, CudaSlice<i64>) {
    (
        s.clone_htod(&[seed]).unwrap(),
        s.clone_htod(&[offset]).unwrap(),
    )
}

/// Checks a dumped mask `[b, h, s_q, s_kv]` holds only 0 and 1 where attention reads it, and
/// keeps about `1 − p` of those elements: within 6 standard deviations of the binomial count (a
/// false failure is then below 1e-8). With a causal mask, the positions `j > i` are skipped: a
/// flash-attention kernel may not visit them at all (they may keep the NaN poison), and they
/// multiply probabilities that are exactly 0. Returns the mask in f64, 0 at those positions.
fn check_mask(what: &str, mask: &[f32], p: f64, sh: Shape, causal: bool) -> Vec<f64> {
    assert_eq!(
        mask.len(),
        sh.b * sh.h * sh.s_q * sh.s_kv,
        "{what}: mask length"
    );
    let mut kept = 0usize;
    let mut read = 0usize;
    let mut out = vec![0.0; mask.len()];
    for (e, &m) in mask.iter().enumerate() {
        let (i, j) = ((e / sh.s_kv) % sh.s_q, e % sh.s_kv);
        if causal && j > i {
            continue;
        }
        assert!(m == 0.0 || m == 1.0, "{what}: mask element {e} is {m}");
        read += 1;
        kept += (m == 1.0) as usize;
        out[e] = m as f64;
    }
    let n = read as f64;
    let frac = kept as f64 / n;
    let bound = 6.0 * (p * (1.0 - p) / n).sqrt();
    assert!(
        (frac - (1.0 - p)).abs() <= bound,
        "{what}: kept fraction {frac}, expected {} ± {bound}",
        1.0 - p
    );
    out
}

/// A built forward graph with dropout (training) and its tensors.
struct DropoutFwd {
    og: OperationGraph,
    sh: Shape,
    qkv: [TensorId; 3],
    seed_offset: [TensorId; 2],
    out: cudnn_safe::graph::SdpaOutputs,
}

impl DropoutFwd {
    /// [`fwd_dropout_graph`], built; the mask is dumped when `p > 0`.
    fn build(cudnn: &Cudnn, dtype: DType, sh: Shape, causal: bool, p: f64) -> DropoutFwd {
        let (g, qkv, seed_offset, out) = fwd_dropout_graph(dtype, sh, causal, p, p > 0.0).unwrap();
        let og = g.build(cudnn).unwrap();
        DropoutFwd {
            og,
            sh,
            qkv,
            seed_offset,
            out,
        }
    }

    /// One execution: (O in logical order, stats, mask).
    fn run<T: DataType>(
        &self,
        s: &Arc<CudaStream>,
        cudnn: &Cudnn,
        plan: &Plan,
        qkv_bufs: [&CudaSlice<T>; 3],
        (sb, ob): (&CudaSlice<i64>, &CudaSlice<i64>),
    ) -> (Vec<T>, Vec<f32>, Vec<f32>) {
        let (og, sh, out) = (&self.og, self.sh, &self.out);
        let [seed, offset] = self.seed_offset;
        let mut o_buf = poisoned_buffer::<T>(s, og.span(out.o).unwrap());
        let stats = out.stats.expect("training");
        // p = 0 dumps no mask (the library refuses it): the mask is all ones by definition.
        let mask = out.dropout_mask;
        let mut st_buf = poisoned_buffer::<f32>(s, og.span(stats).unwrap());
        let mut m_buf = match mask {
            Some(m) => poisoned_buffer::<f32>(s, og.span(m).unwrap()),
            None => s
                .clone_htod(&vec![1.0f32; sh.b * sh.h * sh.s_q * sh.s_kv])
                .unwrap(),
        };
        let mut ws = Workspace::new(s.clone());
        {
            let mut args = Args::new(cudnn);
            bind_qkv(&mut args, self.qkv, qkv_bufs);
            args.input_i64(seed, sb)
                .unwrap()
                .input_i64(offset, ob)
                .unwrap();
            args.output(out.o, &mut o_buf).unwrap();
            args.output(stats, &mut st_buf).unwrap();
            if let Some(mask) = mask {
                args.output(mask, &mut m_buf).unwrap();
            }
            cudnn.execute(plan, &args, &mut ws).unwrap();
        }
        (
            fetch(s, &sh.q(), &bshd(sh.q()), &o_buf),
            download(s, &st_buf),
            download(s, &m_buf),
        )
    }
}

/// The scale cuDNN multiplies kept probabilities by, `1/(1 − p)`: a by-value f32.
fn dropout_scale(p: f64) -> f64 {
    (1.0 / (1.0 - p)) as f32 as f64
}

fn fwd_dropout_case<T: DataType>(sh: Shape, causal: bool, p: f64, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let fwd = DropoutFwd::build(&cudnn, T::DTYPE, sh, causal, p);
    let mut rng = Rng::new(seed);
    let inputs = Qkv::<T>::random(&s, sh, &mut rng);
    let [qf, kf, vf] = inputs.f64();
    let want = reference_forward(sh, &qf, &kf, &vf, sh.scale(), causal);
    let (sb, ob) = seed_offset(&s, 0x5eed_0000 + seed as i64, 7);
    let c = dropout_scale(p);
    for plan in plans(&cudnn, &fwd.og, 2) {
        let what = format!(
            "sdpa dropout {} {sh:?} causal={causal} p={p} plan {}",
            T::DTYPE,
            plan.name()
        );
        let (o, stats, mask) = fwd.run(&s, &cudnn, &plan, inputs.bufs(), (&sb, &ob));
        let mask = check_mask(&what, &mask, p, sh, causal);
        let want_o = attention_output(sh, &want.p, Some((&mask, c)), &vf);
        assert_close(&format!("{what}: O"), &o, &want_o, tol::<T>());
        // Dropout comes after the softmax: the statistics are those without dropout.
        assert_close(&format!("{what}: stats"), &stats, &want.stats, STATS_TOL);
    }
}

#[test]
fn gpu_sdpa_dropout_forward_bf16_noncausal() {
    fwd_dropout_case::<bf16>(SMALL, false, 0.2, 31);
}

#[test]
fn gpu_sdpa_dropout_forward_bf16_causal() {
    fwd_dropout_case::<bf16>(SQUARE_128, true, 0.1, 32);
}

#[test]
fn gpu_sdpa_dropout_forward_f16_causal_and_noncausal() {
    fwd_dropout_case::<f16>(SMALL, true, 0.3, 33);
    fwd_dropout_case::<f16>(CROSS, false, 0.5, 34);
}

#[test]
fn gpu_sdpa_dropout_zero_probability_is_no_dropout() {
    // p = 0: the mask is all ones and O is attention without dropout.
    fwd_dropout_case::<bf16>(SMALL, true, 0.0, 35);
    fwd_dropout_case::<f16>(SMALL, false, 0.0, 36);
}

fn bwd_dropout_case<T: DataType>(sh: Shape, causal: bool, p: f64, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    // The forward graph draws (and dumps) the mask; the backward graph regenerates it from the
    // same seed and offset values.
    let fgraph = DropoutFwd::build(&cudnn, T::DTYPE, sh, causal, p);
    let (bg, ids, bso, gr) = bwd_dropout_graph(T::DTYPE, sh, causal, p).unwrap();
    let bog = bg.build(&cudnn).unwrap();
    let mut rng = Rng::new(seed);
    let inputs = Qkv::<T>::random(&s, sh, &mut rng);
    let dov: Vec<T> = rng.values(sh.q_len());
    let (sb, ob) = seed_offset(&s, 0x0dd_5eed + seed as i64, 3 * seed as i64);
    let fplan = plans(&cudnn, &fgraph.og, 1).remove(0);
    let (_, _, mask) = fgraph.run(&s, &cudnn, &fplan, inputs.bufs(), (&sb, &ob));
    let what = format!(
        "sdpa dropout backward {} {sh:?} causal={causal} p={p}",
        T::DTYPE
    );
    let mask = check_mask(&what, &mask, p, sh, causal);
    let dropout = BwdDropout {
        mask: &mask,
        c: dropout_scale(p),
        ids: bso,
        bufs: [&sb, &ob],
    };
    check_bwd(
        &s,
        &cudnn,
        &bog,
        sh,
        causal,
        ids,
        &gr,
        &inputs,
        &dov,
        Some(dropout),
        &what,
    );
}

#[test]
fn gpu_sdpa_dropout_backward_bf16_causal() {
    bwd_dropout_case::<bf16>(SQUARE_128, true, 0.1, 41);
}

#[test]
fn gpu_sdpa_dropout_backward_bf16_noncausal() {
    bwd_dropout_case::<bf16>(SMALL, false, 0.2, 42);
}

#[test]
fn gpu_sdpa_dropout_backward_f16_causal_and_noncausal() {
    bwd_dropout_case::<f16>(SMALL, true, 0.2, 43);
    bwd_dropout_case::<f16>(SMALL, false, 0.3, 44);
}

#[test]
fn gpu_sdpa_dropout_backward_zero_probability() {
    bwd_dropout_case::<bf16>(SMALL, false, 0.0, 45);
}

#[test]
fn gpu_sdpa_dropout_same_seed_same_mask_other_seed_other_mask() {
    let Some((s, cudnn)) = gpu() else { return };
    let sh = SMALL;
    let p = 0.3;
    // p > 0: the mask is dumped.
    let fwd = DropoutFwd::build(&cudnn, DType::BF16, sh, false, p);
    let plan = plans(&cudnn, &fwd.og, 1).remove(0);
    let mut rng = Rng::new(51);
    let inputs = Qkv::<bf16>::random(&s, sh, &mut rng);
    let run = |seed: i64, offset: i64| {
        let (sb, ob) = seed_offset(&s, seed, offset);
        fwd.run(&s, &cudnn, &plan, inputs.bufs(), (&sb, &ob))
    };
    let (o1, st1, m1) = run(1234, 0);
    let (o2, st2, m2) = run(1234, 0);
    // Same seed and offset: identical mask and outputs, bit for bit.
    assert_eq!(m1, m2, "same seed and offset, different masks");
    assert!(
        o1.iter().zip(&o2).all(|(a, b)| a.to_bits() == b.to_bits()),
        "same seed and offset, different O"
    );
    assert_eq!(st1, st2);
    check_mask("seed 1234", &m1, p, sh, false);
    // Another seed: an independent mask (each element differs with probability 2p(1 − p) =
    // 0.42; a quarter of them is far below that). Another offset: another mask, but nearby
    // offsets share part of the random stream (offset 1 changed about 10 % of the elements on
    // an H200), so only "different" is asserted for them; the fractions are printed.
    for (seed, offset) in [(1235, 0), (1234, 1), (1234, 1 << 12), (1234, 1 << 20)] {
        let (o3, _, m3) = run(seed, offset);
        check_mask("other seed / offset", &m3, p, sh, false);
        let differ = m1.iter().zip(&m3).filter(|(a, b)| a != b).count();
        eprintln!(
            "  seed {seed} offset {offset}: {differ} of {} mask elements differ from seed 1234 offset 0",
            m1.len()
        );
        let least = if offset == 0 { m1.len() / 4 } else { 1 };
        assert!(
            differ >= least,
            "seed {seed} offset {offset}: only {differ} of {} mask elements differ",
            m1.len()
        );
        assert!(
            o1.iter().zip(&o3).any(|(a, b)| a.to_bits() != b.to_bits()),
            "seed {seed} offset {offset}: same O"
        );
    }
}

#[test]
fn gpu_sdpa_dropout_seed_bindings_checked() {
    let Some((s, cudnn)) = gpu() else { return };
    let sh = SMALL;
    let (g, qkv, [seed, offset], out) =
        fwd_dropout_graph(DType::BF16, sh, true, 0.1, true).unwrap();
    let [q, k, v] = qkv;
    let og = g.build(&cudnn).unwrap();
    let plan = plans(&cudnn, &og, 1).remove(0);
    let stats = out.stats.unwrap();
    let mask = out.dropout_mask.unwrap();
    let mut rng = Rng::new(61);
    let [qb, kb, vb] = random_spans(&s, &og, qkv, &mut rng);
    let (sb, ob) = seed_offset(&s, 9, 0);
    let f32_seed = s.clone_htod(&[9.0f32]).unwrap();
    let i64_q = s.alloc_zeros::<i64>(og.span(q).unwrap()).unwrap();
    let mut ws = Workspace::new(s.clone());
    let (mut o_buf, o_before) = sentinel_buffer::<bf16>(&s, og.span(out.o).unwrap());
    let (mut st_buf, st_before) = sentinel_buffer::<f32>(&s, og.span(stats).unwrap());
    let (mut m_buf, m_before) = sentinel_buffer::<f32>(&s, og.span(mask).unwrap());
    #[derive(Clone, Copy, Debug)]
    enum Case {
        F32Seed,
        I64Q,
        NoOffset,
    }
    for case in [Case::F32Seed, Case::I64Q, Case::NoOffset] {
        {
            let mut args = Args::new(&cudnn);
            match case {
                Case::I64Q => args.input_i64(q, &i64_q).unwrap(),
                _ => args.input(q, &qb).unwrap(),
            };
            args.input(k, &kb).unwrap().input(v, &vb).unwrap();
            match case {
                Case::F32Seed => args.input(seed, &f32_seed).unwrap(),
                _ => args.input_i64(seed, &sb).unwrap(),
            };
            if !matches!(case, Case::NoOffset) {
                args.input_i64(offset, &ob).unwrap();
            }
            args.output(out.o, &mut o_buf).unwrap();
            args.output(stats, &mut st_buf).unwrap();
            args.output(mask, &mut m_buf).unwrap();
            let r = cudnn.execute(&plan, &args, &mut ws);
            let ok = match case {
                Case::F32Seed => rejected(&r, kind!(UnsupportedDataType), "`seed`"),
                Case::I64Q => rejected(&r, kind!(UnsupportedDataType), "`q`"),
                Case::NoOffset => rejected(&r, kind!(InvalidArgument), "`offset`"),
            };
            assert!(ok, "{case:?}: {r:?}");
        }
        assert_untouched(&format!("{case:?}: O"), &s, &o_buf, &o_before);
        assert_untouched(&format!("{case:?}: stats"), &s, &st_buf, &st_before);
        assert_untouched(&format!("{case:?}: mask"), &s, &m_buf, &m_before);
    }
}

// ---------------------------------------------------------------------------------------------
// The Sdpa builder: q, k, v declared from sizes and a layout
// ---------------------------------------------------------------------------------------------

/// The builder for a test shape.
fn builder(sh: Shape, layout: SdpaLayout, dtype: DType) -> Sdpa {
    let [b, h, s_q, d] = sh.q();
    Sdpa::new(b, h, s_q, sh.s_kv as i64, d)
        .kv_heads(sh.h_kv as i64)
        .layout(layout)
        .dtype(dtype)
}

/// With BSHD buffers the builder builds the graphs the tests build by hand (same signature).
#[test]
fn host_sdpa_builder_graphs_match_hand_built_ones() {
    for sh in [SMALL, CROSS, GQA, MQA] {
        for causal in [false, true] {
            let opts = SdpaOptions::new().causal(causal).training(true);
            let b = builder(sh, SdpaLayout::Bshd, DType::BF16)
                .causal(causal)
                .training(true);
            let (hand, _, _) = fwd_graph(DType::BF16, sh, &opts).unwrap();
            let mut g = b.graph();
            b.forward(&mut g).unwrap();
            assert_eq!(g.signature(), hand.signature(), "{sh:?} causal={causal}");
            let (hand, _, _) = bwd_graph(DType::BF16, sh, &opts).unwrap();
            let mut g = b.graph();
            b.backward(&mut g).unwrap();
            assert_eq!(
                g.signature(),
                hand.signature(),
                "bwd {sh:?} causal={causal}"
            );
        }
    }
}

/// q, v, o, dO and the gradients have the logical `[b, h, s, d]` dimensions and the strides of
/// the layout; both passes finalize.
#[test]
fn host_sdpa_builder_layouts() {
    for layout in [SdpaLayout::Bshd, SdpaLayout::Bhsd] {
        for sh in [CROSS, GQA] {
            let b = builder(sh, layout, DType::F16).causal(true).training(true);
            let mut g = b.graph();
            let f = b.forward(&mut g).unwrap();
            for (t, dims) in [(f.q, sh.q()), (f.v, sh.kv()), (f.out.o, sh.q())] {
                assert_eq!(g.dims(t).unwrap(), &dims);
                assert_eq!(g.strides(t).unwrap(), &layout.strides(dims));
            }
            let st = f.out.stats.expect("training");
            assert_eq!(g.dims(st).unwrap(), &sh.stats());
            if have_cudnn() {
                common::check_with_record(&g).unwrap_or_else(|e| panic!("{layout:?}: {e}"));
            }
            let mut g = b.graph();
            let bw = b.backward(&mut g).unwrap();
            let gr = bw.grads;
            for (t, dims) in [
                (bw.o, sh.q()),
                (bw.d_o, sh.q()),
                (gr.dq, sh.q()),
                (gr.dk, sh.kv()),
                (gr.dv, sh.kv()),
            ] {
                assert_eq!(g.dims(t).unwrap(), &dims);
                assert_eq!(g.strides(t).unwrap(), &layout.strides(dims));
            }
            assert_eq!(g.dims(bw.stats).unwrap(), &sh.stats());
            if have_cudnn() {
                common::check_with_record(&g).unwrap_or_else(|e| panic!("{layout:?} bwd: {e}"));
            }
        }
    }
}

/// The builder creates the inputs its options need, with the shapes their makers give.
#[test]
fn host_sdpa_builder_creates_option_inputs() {
    let sh = SMALL;
    let b = builder(sh, SdpaLayout::Bhsd, DType::BF16)
        .causal(true)
        .alibi(true)
        .dropout(0.1)
        .padding(true)
        .training(true);
    let mut g = b.graph();
    let f = b.forward(&mut g).unwrap();
    let i = f.inputs;
    let (h, bsz) = (sh.h as i64, sh.b as i64);
    assert_eq!(g.dims(i.alibi_slopes.unwrap()).unwrap(), &[1, h, 1, 1]);
    for t in [i.dropout_seed.unwrap(), i.dropout_offset.unwrap()] {
        assert_eq!(g.dtype(t).unwrap(), DType::I64);
    }
    for t in [i.seq_len_q.unwrap(), i.seq_len_kv.unwrap()] {
        assert_eq!(g.dims(t).unwrap(), &[bsz, 1, 1, 1]);
        assert_eq!(g.dtype(t).unwrap(), DType::I32);
    }
    assert_eq!(i.bias, None);
    if have_cudnn() {
        common::check_with_record(&g).unwrap();
    }

    let b = builder(sh, SdpaLayout::Bshd, DType::BF16)
        .causal(true)
        .bias(1, h)
        .bias_grad(true);
    let mut g = b.graph();
    let bw = b.backward(&mut g).unwrap();
    let bias = bw.inputs.bias.expect("bias");
    assert_eq!(g.dims(bias).unwrap(), &[1, h, 64, 64]);
    let dbias = bw.grads.dbias.expect("bias gradient");
    assert_eq!(g.dims(dbias).unwrap(), &[1, h, 64, 64]);
    assert_eq!(bw.grads.dq_accum, None);
    assert_eq!(bw.inputs.alibi_slopes, None);
    if have_cudnn() {
        common::check_with_record(&g).unwrap();
    }
}

/// Sizes, heads, data types and options the builder or the graph refuse: a typed error from
/// both passes, and the graph left as it was.
#[test]
fn host_sdpa_builder_rejections() {
    let ok = builder(SMALL, SdpaLayout::Bshd, DType::BF16);
    let mut zero_seq = ok.clone();
    zero_seq.seq_kv = 0;
    let invalid = [
        ("zero batch", Sdpa::new(0, 4, 64, 64, 64)),
        ("zero kv sequence", zero_seq),
        ("kv heads not dividing", ok.clone().kv_heads(2)),
        ("zero kv heads", ok.clone().kv_heads(0)),
        ("bias extent", ok.clone().bias(3, 1)),
        ("head dim not a multiple of 8", Sdpa::new(2, 3, 64, 64, 100)),
        ("head dim above 128", Sdpa::new(2, 3, 64, 64, 256)),
        ("window without causal", ok.clone().sliding_window(4)),
        ("dropout probability", ok.clone().dropout(1.5)),
        ("alibi without causal", ok.clone().alibi(true)),
        ("non-finite scale", ok.clone().scale(f64::NAN)),
    ];
    let mut g = ok.graph();
    let before = g.signature();
    for (what, b) in invalid {
        let r = b.forward(&mut g);
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{what}: {r:?}"
        );
        let r = b.backward(&mut g);
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{what} bwd: {r:?}"
        );
        assert_eq!(g.signature(), before, "{what}: the graph changed");
    }
    for dtype in [DType::F32, DType::F64] {
        let r = ok.clone().dtype(dtype).forward(&mut g);
        assert!(
            matches!(r, Err(Error::UnsupportedDataType { .. })),
            "{dtype}: {r:?}"
        );
    }
    // Attention needs f32 intermediate and compute types: a graph of other types is refused.
    let mut h = Graph::new(DType::BF16, DType::BF16, DType::F32);
    let r = ok.forward(&mut h);
    assert!(matches!(r, Err(Error::UnsupportedDataType { .. })), "{r:?}");
    assert_eq!(
        h.signature(),
        Graph::new(DType::BF16, DType::BF16, DType::F32).signature()
    );
    // Sizes whose buffers pass cuDNN's 32-bit addressing (or i64) are refused, not wrapped.
    for huge in [
        Sdpa::new(1, 1 << 20, 1 << 20, 1 << 20, 64),
        Sdpa::new(i64::MAX, 8, 8, 8, 64),
    ] {
        let r = huge.forward(&mut g);
        assert!(
            matches!(
                r,
                Err(Error::InvalidArgument { .. } | Error::Overflow { .. })
            ),
            "{r:?}"
        );
        assert_eq!(g.signature(), before);
    }
    // The graph keeps working after a refusal.
    ok.forward(&mut g).unwrap();
}

/// A forward pass built by the builder on `layout` buffers against the f64 reference (O and
/// the statistics; the first 2 plans, outputs poisoned).
fn builder_fwd_case<T: DataType>(sh: Shape, layout: SdpaLayout, causal: bool, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let b = builder(sh, layout, T::DTYPE).causal(causal).training(true);
    let mut g = b.graph();
    let f = b.forward(&mut g).unwrap();
    let st = f.out.stats.expect("training");
    let og = g.build(&cudnn).unwrap();
    let mut rng = Rng::new(seed);
    let inputs = Qkv::<T>::random_in(&s, sh, &mut rng, layout);
    let [qf, kf, vf] = inputs.f64();
    let want = reference_forward(sh, &qf, &kf, &vf, sh.scale(), causal);
    let mut ws = Workspace::new(s.clone());
    for plan in plans(&cudnn, &og, 2) {
        let mut ob = poisoned_buffer::<T>(&s, og.span(f.out.o).unwrap());
        let mut sb = poisoned_buffer::<f32>(&s, og.span(st).unwrap());
        {
            let mut args = Args::new(&cudnn);
            bind_qkv(&mut args, [f.q, f.k, f.v], inputs.bufs());
            args.output(f.out.o, &mut ob)
                .unwrap()
                .output(st, &mut sb)
                .unwrap();
            cudnn.execute(&plan, &args, &mut ws).unwrap();
        }
        let what = format!(
            "Sdpa {layout:?} {} {sh:?} causal={causal} plan {}",
            T::DTYPE,
            plan.name()
        );
        let got = fetch(&s, &sh.q(), &layout.strides(sh.q()), &ob);
        assert_close(&format!("{what}: O"), &got, &want.o, tol::<T>());
        let got = download(&s, &sb);
        assert_close(&format!("{what}: stats"), &got, &want.stats, STATS_TOL);
    }
}

/// A backward pass built by the builder on `layout` buffers against the f64 reference.
fn builder_bwd_case<T: DataType>(sh: Shape, layout: SdpaLayout, causal: bool, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let b = builder(sh, layout, T::DTYPE).causal(causal);
    let mut g = b.graph();
    let bw = b.backward(&mut g).unwrap();
    let og = g.build(&cudnn).unwrap();
    let mut rng = Rng::new(seed);
    let inputs = Qkv::<T>::random_in(&s, sh, &mut rng, layout);
    let dov: Vec<T> = rng.values(sh.q_len());
    let ids = [bw.q, bw.k, bw.v, bw.o, bw.d_o, bw.stats];
    let what = format!(
        "Sdpa backward {layout:?} {} {sh:?} causal={causal}",
        T::DTYPE
    );
    check_bwd(
        &s, &cudnn, &og, sh, causal, ids, &bw.grads, &inputs, &dov, None, &what,
    );
}

#[test]
fn gpu_sdpa_builder_forward_bshd_and_bhsd() {
    for layout in [SdpaLayout::Bshd, SdpaLayout::Bhsd] {
        builder_fwd_case::<bf16>(SMALL, layout, false, 61);
        builder_fwd_case::<f16>(CROSS, layout, true, 62);
    }
}

#[test]
fn gpu_sdpa_builder_forward_grouped_and_multi_query() {
    for layout in [SdpaLayout::Bshd, SdpaLayout::Bhsd] {
        builder_fwd_case::<bf16>(GQA, layout, true, 63);
        builder_fwd_case::<f16>(MQA, layout, false, 64);
    }
}

#[test]
fn gpu_sdpa_builder_backward_bshd_and_bhsd() {
    for layout in [SdpaLayout::Bshd, SdpaLayout::Bhsd] {
        builder_bwd_case::<bf16>(SQUARE_128, layout, true, 65);
        builder_bwd_case::<f16>(SMALL, layout, false, 66);
    }
}

#[test]
fn gpu_sdpa_builder_backward_grouped_and_multi_query() {
    for layout in [SdpaLayout::Bshd, SdpaLayout::Bhsd] {
        builder_bwd_case::<bf16>(GQA, layout, true, 67);
        builder_bwd_case::<f16>(MQA, layout, true, 68);
    }
}
