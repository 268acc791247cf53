//! Pure-Rust f64 CPU reference for RNN (tanh / ReLU), LSTM (with optional projection) and GRU,
//! the independent oracle of the RNN GPU tests. It uses only `std`, never the crate under test.
//!
//! # Semantics
//!
//! PyTorch's `nn.RNN` / `nn.LSTM` (incl. `proj_size`) / `nn.GRU`, which are cuDNN's formulas and
//! gate orders (PyTorch hands its parameters to cuDNN chunk by chunk), plus two cuDNN options:
//!
//! * gates (rows of every matrix / bias, in blocks of `H`): LSTM `i, f, g, o`; GRU `r, z, n`;
//!   RNN a single block. With `gi = W_ih·x + b_ih` and `gh = W_hh·h + b_hh` per block:
//!   - RNN:  `h' = act(gi + gh)` (act = tanh or max(0, ·)).
//!   - LSTM: `i,f,o = σ(gi + gh)`, `g = tanh(gi + gh)`, `c' = f⊙c + i⊙g`, `m = o⊙tanh(c')`,
//!     `h' = m`, or `h' = W_hr·m` (size `P`) with a projection; `c'` keeps size `H`.
//!   - GRU:  `r,z = σ(gi + gh)`, `n = tanh(gi_n + r⊙gh_n)` (the bias `b_hn` stays inside the
//!     `r⊙(…)`, cuDNN's and PyTorch's variant), `h' = (1-z)⊙n + z⊙h`.
//! * [`BiasMode`] (`cudnnRNNBiasMode_t`): `NoBias`, `SingleInput` (only `b_ih`), `SingleRecurrent`
//!   (only `b_hh`), `Double` (both). An absent bias is zero in the formulas above.
//! * `skip_input` (`CUDNN_SKIP_INPUT`): cuDNN documents "no operation is performed at the input of
//!   the first recurrent layer; the input's leading dimension must equal the hidden size". This
//!   reference implements that as: layer 0 (both directions) has no `weight_ih`, and
//!   `gi = x + b_ih` for *every* gate block (as if `W_ih` were the identity per block). The input
//!   bias `b_ih` of layer 0 is kept when the bias mode has one (TensorFlow's CudnnRNN canonical
//!   conversion also lists every bias in skip mode). If the GPU shows cuDNN drops it, remove
//!   `bias_ih_l0*` from the parameter list: [`forward`] treats any absent bias as zero.
//! * Layers: input of layer `k > 0` is `[forward output, reverse output]` of layer `k-1`
//!   (size `D·Hout`); no dropout.
//! * Variable lengths (packed-sequence semantics, which cuDNN's unpacked/padded I/O shares): the
//!   forward direction runs `t = 0 .. len_b`, its final state is the one after `t = len_b - 1`;
//!   the reverse direction runs `t = len_b-1 ..= 0` starting from its own `h0` slot, its final
//!   state is the one after `t = 0`. Padding steps do not exist here.
//!
//! Notation: `H` hidden size, `P` projection size (0 = none, LSTM only), `Hout = P` or `H`,
//! `Hr = Hout` (width of `W_hh`), `D` = 1 or 2 directions, `L` layers, `B` batch, `G` gates (1/4/3).
//!
//! # API (use with a path, e.g. `use rnn_reference as reference;`, not a glob import)
//!
//! * [`Config`] (`Config::new(CellKind::Lstm, input, hidden)` + `layers`, `bidirectional`,
//!   `bias(BiasMode::…)`, `proj`, `skip_input` setters; `gates`, `dirs`, `out_size`, `y_width`,
//!   `layer_input_size`, `h_len(batch)`, `c_len(batch)`). [`XorShift`] is the seeded PRNG.
//! * Parameters in PyTorch state-dict layout, a `Vec<Param>` = `(name, shape, row-major data)`:
//!   `weight_ih_l{k}{sfx}` `[G·H, in_k]`, `weight_hh_l{k}{sfx}` `[G·H, Hr]`, `bias_ih_l{k}{sfx}`
//!   `[G·H]`, `bias_hh_l{k}{sfx}` `[G·H]`, `weight_hr_l{k}{sfx}` `[P, H]`, `sfx` = `""` or
//!   `"_reverse"`, `in_0 = input_size`, `in_k = D·Hout`. Order: layer, direction, then the
//!   order just listed (PyTorch's). [`param_shapes`], [`random_params`] (uniform `±1/sqrt(H)`).
//! * Data: `x[b][t][i]` (`Seqs`, `len_b ≥ 1` may differ per `b`); `h0`/`h_n` flat
//!   `[L·D][B][Hout]`, `c0`/`c_n` flat `[L·D][B][H]` (LSTM only, empty otherwise), the layout of
//!   cuDNN's `hx`/`cx`. [`random_input`], [`random_states`], [`pad`] / [`unpad`] between `Seqs`
//!   and padded seq-major `[T][B][w]` or batch-major `[B][T][w]` buffers.
//! * [`forward`] → [`Output`] `{ y: y[b][t][D·Hout] (forward half first), h_n, c_n }`.
//! * Gradients by central differences of [`weighted_sum`] `= Σ y·wy + Σ h_n·wh + Σ c_n·wc`
//!   ([`LossWeights`], [`random_loss_weights`]): with `wy = dy`, `wh = dhy`, `wc = dcy`, the
//!   derivatives are cuDNN's `dx`, `dhx`, `dcx` and `dw`. [`finite_difference`] for one
//!   [`Target`] entry, [`numeric_grads`] for all of them ([`Grads`]), [`central_difference`] for
//!   any scalar function. Step `eps ≈ 1e-6` gives ~1e-9 accuracy in f64, except within `eps` of
//!   a ReLU kink (unlikely with random data).
//!
//! Misuse (wrong shapes, unknown parameter names, missing weights) panics with a message: this
//! is test code.
#![allow(dead_code)]

use std::collections::HashMap;

/// The recurrent cell (`cudnnRNNMode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellKind {
    /// `h' = tanh(W_ih x + b_ih + W_hh h + b_hh)` (`CUDNN_RNN_TANH`).
    RnnTanh,
    /// `h' = max(0, W_ih x + b_ih + W_hh h + b_hh)` (`CUDNN_RNN_RELU`).
    RnnRelu,
    /// LSTM, gates `i, f, g, o` (`CUDNN_LSTM`).
    Lstm,
    /// GRU, gates `r, z, n` (`CUDNN_GRU`).
    Gru,
}

/// Which bias vectors exist (`cudnnRNNBiasMode_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BiasMode {
    /// No bias (`CUDNN_RNN_NO_BIAS`).
    NoBias,
    /// Only `b_ih` (`CUDNN_RNN_SINGLE_INP_BIAS`).
    SingleInput,
    /// Only `b_hh` (`CUDNN_RNN_SINGLE_REC_BIAS`).
    SingleRecurrent,
    /// `b_ih` and `b_hh` (`CUDNN_RNN_DOUBLE_BIAS`, PyTorch's `bias=True`).
    Double,
}

impl BiasMode {
    fn has_input(self) -> bool {
        matches!(self, BiasMode::SingleInput | BiasMode::Double)
    }
    fn has_recurrent(self) -> bool {
        matches!(self, BiasMode::SingleRecurrent | BiasMode::Double)
    }
}

/// Shape of the network. Build with [`Config::new`] and the setters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub cell: CellKind,
    pub input_size: usize,
    pub hidden_size: usize,
    /// 0 = no projection; LSTM only, `< hidden_size` like PyTorch.
    pub proj_size: usize,
    pub num_layers: usize,
    pub bidirectional: bool,
    pub bias: BiasMode,
    /// `CUDNN_SKIP_INPUT`; needs `input_size == hidden_size`.
    pub skip_input: bool,
}

impl Config {
    /// One unidirectional layer, double bias, no projection, linear input.
    pub fn new(cell: CellKind, input_size: usize, hidden_size: usize) -> Config {
        Config {
            cell,
            input_size,
            hidden_size,
            proj_size: 0,
            num_layers: 1,
            bidirectional: false,
            bias: BiasMode::Double,
            skip_input: false,
        }
    }
    pub fn layers(mut self, n: usize) -> Config {
        self.num_layers = n;
        self
    }
    pub fn bidirectional(mut self, on: bool) -> Config {
        self.bidirectional = on;
        self
    }
    pub fn bias(mut self, mode: BiasMode) -> Config {
        self.bias = mode;
        self
    }
    pub fn proj(mut self, p: usize) -> Config {
        self.proj_size = p;
        self
    }
    pub fn skip_input(mut self, on: bool) -> Config {
        self.skip_input = on;
        self
    }

    /// Panics on a configuration neither cuDNN nor PyTorch accepts.
    pub fn validate(&self) {
        assert!(
            self.input_size > 0 && self.hidden_size > 0,
            "empty sizes: {self:?}"
        );
        assert!(self.num_layers > 0, "num_layers must be ≥ 1: {self:?}");
        if self.proj_size > 0 {
            assert!(
                self.cell == CellKind::Lstm,
                "projection is LSTM only: {self:?}"
            );
            assert!(
                self.proj_size < self.hidden_size,
                "proj_size must be < hidden_size"
            );
        }
        if self.skip_input {
            assert!(
                self.input_size == self.hidden_size,
                "skip input needs input == hidden"
            );
        }
    }
    /// `G`: 1, 4 or 3 gate blocks.
    pub fn gates(&self) -> usize {
        match self.cell {
            CellKind::RnnTanh | CellKind::RnnRelu => 1,
            CellKind::Lstm => 4,
            CellKind::Gru => 3,
        }
    }
    /// `D`: 1 or 2.
    pub fn dirs(&self) -> usize {
        if self.bidirectional {
            2
        } else {
            1
        }
    }
    /// `Hout`: width of `h` (and of each direction's half of `y`).
    pub fn out_size(&self) -> usize {
        if self.proj_size > 0 {
            self.proj_size
        } else {
            self.hidden_size
        }
    }
    /// Width of one `y[b][t]`: `D·Hout`.
    pub fn y_width(&self) -> usize {
        self.dirs() * self.out_size()
    }
    /// Input width of layer `k`.
    pub fn layer_input_size(&self, k: usize) -> usize {
        if k == 0 {
            self.input_size
        } else {
            self.y_width()
        }
    }
    /// Element count of `h0` / `h_n`: `L·D·B·Hout`.
    pub fn h_len(&self, batch: usize) -> usize {
        self.num_layers * self.dirs() * batch * self.out_size()
    }
    /// Element count of `c0` / `c_n`: `L·D·B·H` for LSTM, 0 otherwise.
    pub fn c_len(&self, batch: usize) -> usize {
        if self.cell == CellKind::Lstm {
            self.num_layers * self.dirs() * batch * self.hidden_size
        } else {
            0
        }
    }
}

/// One named parameter tensor: `(name, shape, row-major data)`.
pub type Param = (String, Vec<usize>, Vec<f64>);

/// A batch of sequences: `seqs[b][t][i]`.
pub type Seqs = Vec<Vec<Vec<f64>>>;

fn suffix(dir: usize) -> &'static str {
    if dir == 0 {
        ""
    } else {
        "_reverse"
    }
}

/// Names and shapes of every parameter `cfg` has, in PyTorch's order. Biases absent from the
/// bias mode and layer 0's `weight_ih` under `skip_input` are not listed.
pub fn param_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    cfg.validate();
    let (g, h) = (cfg.gates(), cfg.hidden_size);
    let mut out = Vec::new();
    for k in 0..cfg.num_layers {
        for dir in 0..cfg.dirs() {
            let sfx = suffix(dir);
            if !(k == 0 && cfg.skip_input) {
                out.push((
                    format!("weight_ih_l{k}{sfx}"),
                    vec![g * h, cfg.layer_input_size(k)],
                ));
            }
            out.push((format!("weight_hh_l{k}{sfx}"), vec![g * h, cfg.out_size()]));
            if cfg.bias.has_input() {
                out.push((format!("bias_ih_l{k}{sfx}"), vec![g * h]));
            }
            if cfg.bias.has_recurrent() {
                out.push((format!("bias_hh_l{k}{sfx}"), vec![g * h]));
            }
            if cfg.proj_size > 0 {
                out.push((format!("weight_hr_l{k}{sfx}"), vec![cfg.proj_size, h]));
            }
        }
    }
    out
}

/// xorshift64* PRNG (splitmix64-seeded), so that the reference needs nothing outside `std`.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        XorShift((z ^ (z >> 31)) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }
    /// `n` values uniform in `[lo, hi)`.
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Every parameter of `cfg` ([`param_shapes`] order), uniform in `±1/sqrt(H)` like PyTorch.
pub fn random_params(cfg: &Config, seed: u64) -> Vec<Param> {
    let mut rng = XorShift::new(seed);
    let k = 1.0 / (cfg.hidden_size as f64).sqrt();
    param_shapes(cfg)
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product();
            (name, shape, rng.vec(n, -k, k))
        })
        .collect()
}

/// A batch of `lens.len()` sequences of `input_size` values uniform in `[-1, 1)`.
pub fn random_input(cfg: &Config, lens: &[usize], seed: u64) -> Seqs {
    let mut rng = XorShift::new(seed);
    lens.iter()
        .map(|&n| (0..n).map(|_| rng.vec(cfg.input_size, -1.0, 1.0)).collect())
        .collect()
}

/// Random `(h0, c0)` in `[-1, 1)` for a batch of `batch`; `c0` is empty unless LSTM.
pub fn random_states(cfg: &Config, batch: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = XorShift::new(seed);
    let h0 = rng.vec(cfg.h_len(batch), -1.0, 1.0);
    let c0 = rng.vec(cfg.c_len(batch), -1.0, 1.0);
    (h0, c0)
}

/// Flattens `seqs` (each step `width` wide) into a padded buffer of `max_len` steps:
/// seq-major `[T][B][width]` or batch-major `[B][T][width]`; missing steps hold `fill`.
pub fn pad(
    seqs: &[Vec<Vec<f64>>],
    width: usize,
    max_len: usize,
    batch_major: bool,
    fill: f64,
) -> Vec<f64> {
    let batch = seqs.len();
    let mut out = vec![fill; max_len * batch * width];
    for (b, seq) in seqs.iter().enumerate() {
        assert!(seq.len() <= max_len, "sequence {b} longer than max_len");
        for (t, step) in seq.iter().enumerate() {
            assert_eq!(step.len(), width, "step ({b}, {t}) width");
            let row = if batch_major {
                b * max_len + t
            } else {
                t * batch + b
            };
            out[row * width..][..width].copy_from_slice(step);
        }
    }
    out
}

/// Inverse of [`pad`]: reads the first `lens[b]` steps of every sequence out of a padded buffer.
pub fn unpad(
    flat: &[f64],
    lens: &[usize],
    width: usize,
    max_len: usize,
    batch_major: bool,
) -> Seqs {
    let batch = lens.len();
    assert!(
        flat.len() >= max_len * batch * width,
        "padded buffer too short"
    );
    lens.iter()
        .enumerate()
        .map(|(b, &n)| {
            (0..n)
                .map(|t| {
                    let row = if batch_major {
                        b * max_len + t
                    } else {
                        t * batch + b
                    };
                    flat[row * width..][..width].to_vec()
                })
                .collect()
        })
        .collect()
}

/// Result of [`forward`].
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    /// `y[b][t]`, `D·Hout` wide (forward direction's `Hout` first), `t < len_b`.
    pub y: Seqs,
    /// Final hidden states, `[L·D][B][Hout]`.
    pub h_n: Vec<f64>,
    /// Final cell states, `[L·D][B][H]` (LSTM), empty otherwise.
    pub c_n: Vec<f64>,
}

/// One direction of one layer, borrowed out of the parameter list; absent biases are `None`.
struct DirParams<'a> {
    w_ih: Option<&'a [f64]>,
    w_hh: &'a [f64],
    b_ih: Option<&'a [f64]>,
    b_hh: Option<&'a [f64]>,
    w_hr: Option<&'a [f64]>,
}

/// Checks every given parameter against [`param_shapes`] and indexes them by name. Weights are
/// required; biases may be left out (then zero), so that a bias cuDNN turns out not to have can
/// be dropped without touching the reference.
fn index_params<'a>(cfg: &Config, params: &'a [Param]) -> HashMap<&'a str, &'a [f64]> {
    let expected: HashMap<String, Vec<usize>> = param_shapes(cfg).into_iter().collect();
    let mut map = HashMap::new();
    for (name, shape, data) in params {
        let want = expected
            .get(name)
            .unwrap_or_else(|| panic!("parameter {name} does not exist for {cfg:?}"));
        assert_eq!(shape, want, "shape of {name}");
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "data length of {name}"
        );
        assert!(
            map.insert(name.as_str(), data.as_slice()).is_none(),
            "{name} given twice"
        );
    }
    for name in expected.keys() {
        assert!(
            name.starts_with("bias_") || map.contains_key(name.as_str()),
            "weight {name} missing"
        );
    }
    map
}

fn dir_params<'a>(map: &HashMap<&'a str, &'a [f64]>, k: usize, dir: usize) -> DirParams<'a> {
    let sfx = suffix(dir);
    let get = |what: &str| map.get(format!("{what}_l{k}{sfx}").as_str()).copied();
    DirParams {
        w_ih: get("weight_ih"),
        w_hh: get("weight_hh").expect("weight_hh checked present"),
        b_ih: get("bias_ih"),
        b_hh: get("bias_hh"),
        w_hr: get("weight_hr"),
    }
}

/// `w · v` for a row-major `w` of `v.len()` columns.
fn matvec(w: &[f64], v: &[f64]) -> Vec<f64> {
    w.chunks_exact(v.len())
        .map(|row| row.iter().zip(v).map(|(a, b)| a * b).sum())
        .collect()
}

fn add(acc: &mut [f64], b: Option<&[f64]>) {
    if let Some(b) = b {
        acc.iter_mut().zip(b).for_each(|(a, b)| *a += b);
    }
}

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// One time step of one direction: `(h', c')` from `(x, h, c)`.
fn step(
    cfg: &Config,
    p: &DirParams,
    skip: bool,
    x: &[f64],
    h: &[f64],
    c: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let hs = cfg.hidden_size;
    let rows = cfg.gates() * hs;
    let mut gi = if skip {
        (0..rows).map(|r| x[r % hs]).collect()
    } else {
        matvec(p.w_ih.expect("weight_ih checked present"), x)
    };
    add(&mut gi, p.b_ih);
    let mut gh = matvec(p.w_hh, h);
    add(&mut gh, p.b_hh);
    match cfg.cell {
        CellKind::RnnTanh => (
            (0..hs).map(|j| (gi[j] + gh[j]).tanh()).collect(),
            Vec::new(),
        ),
        CellKind::RnnRelu => (
            (0..hs).map(|j| (gi[j] + gh[j]).max(0.0)).collect(),
            Vec::new(),
        ),
        CellKind::Lstm => {
            let pre = |g: usize, j: usize| gi[g * hs + j] + gh[g * hs + j];
            let mut c_new = vec![0.0; hs];
            let mut m = vec![0.0; hs];
            for j in 0..hs {
                let (i, f) = (sigmoid(pre(0, j)), sigmoid(pre(1, j)));
                let (g, o) = (pre(2, j).tanh(), sigmoid(pre(3, j)));
                c_new[j] = f * c[j] + i * g;
                m[j] = o * c_new[j].tanh();
            }
            let h_new = match p.w_hr {
                Some(w_hr) => matvec(w_hr, &m),
                None => m,
            };
            (h_new, c_new)
        }
        CellKind::Gru => {
            let h_new = (0..hs)
                .map(|j| {
                    let r = sigmoid(gi[j] + gh[j]);
                    let z = sigmoid(gi[hs + j] + gh[hs + j]);
                    let n = (gi[2 * hs + j] + r * gh[2 * hs + j]).tanh();
                    (1.0 - z) * n + z * h[j]
                })
                .collect();
            (h_new, Vec::new())
        }
    }
}

/// Runs the network on `x` (`x[b][t][i]`, `len_b ≥ 1`) from `h0` / `c0` (zeros when `None`;
/// `c0` must be `None` or empty unless LSTM).
pub fn forward(
    cfg: &Config,
    params: &[Param],
    x: &[Vec<Vec<f64>>],
    h0: Option<&[f64]>,
    c0: Option<&[f64]>,
) -> Output {
    cfg.validate();
    let map = index_params(cfg, params);
    let batch = x.len();
    assert!(batch > 0, "empty batch");
    for (b, seq) in x.iter().enumerate() {
        assert!(!seq.is_empty(), "sequence {b} is empty");
        for (t, step) in seq.iter().enumerate() {
            assert_eq!(step.len(), cfg.input_size, "x[{b}][{t}] width");
        }
    }
    let (hout, hs, dirs) = (cfg.out_size(), cfg.hidden_size, cfg.dirs());
    let h0 = h0.map_or_else(|| vec![0.0; cfg.h_len(batch)], <[f64]>::to_vec);
    assert_eq!(h0.len(), cfg.h_len(batch), "h0 length");
    let c0 = match c0 {
        Some(c0) if !c0.is_empty() => c0.to_vec(),
        _ => vec![0.0; cfg.c_len(batch)],
    };
    assert_eq!(c0.len(), cfg.c_len(batch), "c0 length (LSTM only)");
    let is_lstm = cfg.cell == CellKind::Lstm;

    let mut h_n = vec![0.0; h0.len()];
    let mut c_n = vec![0.0; c0.len()];
    let mut layer_in: Seqs = x.to_vec();
    for k in 0..cfg.num_layers {
        let mut layer_out: Seqs = layer_in
            .iter()
            .map(|seq| vec![vec![0.0; dirs * hout]; seq.len()])
            .collect();
        for dir in 0..dirs {
            let p = dir_params(&map, k, dir);
            let skip = k == 0 && cfg.skip_input;
            for b in 0..batch {
                let slot = (k * dirs + dir) * batch + b;
                let mut h = h0[slot * hout..][..hout].to_vec();
                let mut c = if is_lstm {
                    c0[slot * hs..][..hs].to_vec()
                } else {
                    Vec::new()
                };
                let len = layer_in[b].len();
                let order: Vec<usize> = if dir == 0 {
                    (0..len).collect()
                } else {
                    (0..len).rev().collect()
                };
                for t in order {
                    let (h_new, c_new) = step(cfg, &p, skip, &layer_in[b][t], &h, &c);
                    layer_out[b][t][dir * hout..][..hout].copy_from_slice(&h_new);
                    h = h_new;
                    c = c_new;
                }
                h_n[slot * hout..][..hout].copy_from_slice(&h);
                if is_lstm {
                    c_n[slot * hs..][..hs].copy_from_slice(&c);
                }
            }
        }
        layer_in = layer_out;
    }
    Output {
        y: layer_in,
        h_n,
        c_n,
    }
}

/// Weights of the scalar [`weighted_sum`]; shaped like an [`Output`] (`wc` empty unless LSTM).
/// They play the part of cuDNN's `dy`, `dhy`, `dcy`.
#[derive(Clone, Debug, PartialEq)]
pub struct LossWeights {
    pub wy: Seqs,
    pub wh: Vec<f64>,
    pub wc: Vec<f64>,
}

/// Random loss weights in `[-1, 1)` for sequences of lengths `lens`.
pub fn random_loss_weights(cfg: &Config, lens: &[usize], seed: u64) -> LossWeights {
    let mut rng = XorShift::new(seed);
    let wy = lens
        .iter()
        .map(|&n| (0..n).map(|_| rng.vec(cfg.y_width(), -1.0, 1.0)).collect())
        .collect();
    let wh = rng.vec(cfg.h_len(lens.len()), -1.0, 1.0);
    let wc = rng.vec(cfg.c_len(lens.len()), -1.0, 1.0);
    LossWeights { wy, wh, wc }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "dot lengths");
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// `Σ y·wy + Σ h_n·wh + Σ c_n·wc`: the scalar whose derivatives are the RNN backward outputs.
pub fn weighted_sum(out: &Output, w: &LossWeights) -> f64 {
    assert_eq!(out.y.len(), w.wy.len(), "batch of wy");
    let mut s = 0.0;
    for (ys, ws) in out.y.iter().zip(&w.wy) {
        assert_eq!(ys.len(), ws.len(), "sequence length of wy");
        s += ys.iter().zip(ws).map(|(y, w)| dot(y, w)).sum::<f64>();
    }
    s + dot(&out.h_n, &w.wh) + dot(&out.c_n, &w.wc)
}

/// `(f(x0 + eps) - f(x0 - eps)) / (2·eps)`.
pub fn central_difference(mut f: impl FnMut(f64) -> f64, x0: f64, eps: f64) -> f64 {
    (f(x0 + eps) - f(x0 - eps)) / (2.0 * eps)
}

/// One differentiable entry of the problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Element `elem` (row-major) of `params[index]`.
    Param { index: usize, elem: usize },
    /// `x[b][t][i]`.
    X { b: usize, t: usize, i: usize },
    /// `h0[idx]` (flat `[L·D][B][Hout]`).
    H0(usize),
    /// `c0[idx]` (flat `[L·D][B][H]`, LSTM).
    C0(usize),
}

/// A mutable copy of everything [`forward`] reads, with `h0` / `c0` materialised (zeros for
/// `None`) so that their entries can be perturbed.
struct Problem {
    cfg: Config,
    params: Vec<Param>,
    x: Seqs,
    h0: Vec<f64>,
    c0: Vec<f64>,
}

impl Problem {
    fn new(
        cfg: &Config,
        params: &[Param],
        x: &[Vec<Vec<f64>>],
        h0: Option<&[f64]>,
        c0: Option<&[f64]>,
    ) -> Problem {
        let batch = x.len();
        let h0 = h0.map_or_else(|| vec![0.0; cfg.h_len(batch)], <[f64]>::to_vec);
        let c0 = match c0 {
            Some(c0) if !c0.is_empty() => c0.to_vec(),
            _ => vec![0.0; cfg.c_len(batch)],
        };
        Problem {
            cfg: *cfg,
            params: params.to_vec(),
            x: x.to_vec(),
            h0,
            c0,
        }
    }
    fn entry(&mut self, target: Target) -> &mut f64 {
        match target {
            Target::Param { index, elem } => &mut self.params[index].2[elem],
            Target::X { b, t, i } => &mut self.x[b][t][i],
            Target::H0(idx) => &mut self.h0[idx],
            Target::C0(idx) => &mut self.c0[idx],
        }
    }
    fn loss(&self, w: &LossWeights) -> f64 {
        let out = forward(
            &self.cfg,
            &self.params,
            &self.x,
            Some(&self.h0),
            Some(&self.c0),
        );
        weighted_sum(&out, w)
    }
    /// Central difference at `target`, restoring the entry afterwards.
    fn derivative(&mut self, w: &LossWeights, target: Target, eps: f64) -> f64 {
        let x0 = *self.entry(target);
        let d = central_difference(
            |v| {
                *self.entry(target) = v;
                self.loss(w)
            },
            x0,
            eps,
        );
        *self.entry(target) = x0;
        d
    }
}

/// d [`weighted_sum`] / d `target`, by a central difference of step `eps`.
#[allow(clippy::too_many_arguments)]
pub fn finite_difference(
    cfg: &Config,
    params: &[Param],
    x: &[Vec<Vec<f64>>],
    h0: Option<&[f64]>,
    c0: Option<&[f64]>,
    w: &LossWeights,
    target: Target,
    eps: f64,
) -> f64 {
    Problem::new(cfg, params, x, h0, c0).derivative(w, target, eps)
}

/// Every derivative of [`weighted_sum`], shaped like the inputs: what cuDNN's backward passes
/// return (`dw` per parameter, `dx`, `dhx`, `dcx`).
#[derive(Clone, Debug, PartialEq)]
pub struct Grads {
    /// Same order and lengths as the parameter list given.
    pub params: Vec<Vec<f64>>,
    pub x: Seqs,
    pub h0: Vec<f64>,
    /// Empty unless LSTM.
    pub c0: Vec<f64>,
}

/// All derivatives by central differences (two forward passes per entry: keep problems small).
pub fn numeric_grads(
    cfg: &Config,
    params: &[Param],
    x: &[Vec<Vec<f64>>],
    h0: Option<&[f64]>,
    c0: Option<&[f64]>,
    w: &LossWeights,
    eps: f64,
) -> Grads {
    let mut pb = Problem::new(cfg, params, x, h0, c0);
    let mut grads = Grads {
        params: params.iter().map(|p| vec![0.0; p.2.len()]).collect(),
        x: x.iter()
            .map(|s| s.iter().map(|v| vec![0.0; v.len()]).collect())
            .collect(),
        h0: vec![0.0; pb.h0.len()],
        c0: vec![0.0; pb.c0.len()],
    };
    for (index, g) in grads.params.iter_mut().enumerate() {
        for (elem, v) in g.iter_mut().enumerate() {
            *v = pb.derivative(w, Target::Param { index, elem }, eps);
        }
    }
    for (b, seq) in grads.x.iter_mut().enumerate() {
        for (t, step) in seq.iter_mut().enumerate() {
            for (i, v) in step.iter_mut().enumerate() {
                *v = pb.derivative(w, Target::X { b, t, i }, eps);
            }
        }
    }
    for (idx, v) in grads.h0.iter_mut().enumerate() {
        *v = pb.derivative(w, Target::H0(idx), eps);
    }
    for (idx, v) in grads.c0.iter_mut().enumerate() {
        *v = pb.derivative(w, Target::C0(idx), eps);
    }
    grads
}

// Checks of the reference itself; they need no GPU and run wherever the includer is compiled.

/// A parameter list from `(name, data)` pairs, shapes taken from [`param_shapes`].
#[cfg(test)]
fn named(cfg: &Config, values: &[(&str, &[f64])]) -> Vec<Param> {
    let shapes: HashMap<String, Vec<usize>> = param_shapes(cfg).into_iter().collect();
    values
        .iter()
        .map(|(name, data)| (name.to_string(), shapes[*name].clone(), data.to_vec()))
        .collect()
}

#[cfg(test)]
fn assert_near(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn reference_lstm_one_step_by_hand() {
    let cfg = Config::new(CellKind::Lstm, 1, 1);
    let params = named(
        &cfg,
        &[
            ("weight_ih_l0", &[0.5, -0.3, 0.8, 0.1]),
            ("weight_hh_l0", &[0.2, 0.4, -0.6, 0.7]),
            ("bias_ih_l0", &[0.1, 0.2, -0.1, 0.05]),
            ("bias_hh_l0", &[0.0, -0.1, 0.3, 0.2]),
        ],
    );
    let out = forward(
        &cfg,
        &params,
        &[vec![vec![0.7]]],
        Some(&[0.3]),
        Some(&[-0.5]),
    );
    // Pre-activations (x = 0.7, h = 0.3): i 0.51, f 0.01, g 0.58, o 0.53;
    // c = σ(0.01)·(-0.5) + σ(0.51)·tanh(0.58), h = σ(0.53)·tanh(c), evaluated separately.
    let (c, h) = (0.075_314_754_865_086_99, 0.047_319_928_946_812_14);
    assert_near(&out.c_n, &[c], 1e-14, "c_n");
    assert_near(&out.h_n, &[h], 1e-14, "h_n");
    assert_near(&out.y[0][0], &[h], 1e-14, "y");
}

#[test]
fn reference_gru_formula() {
    let cfg = Config::new(CellKind::Gru, 1, 1);
    let params = named(
        &cfg,
        &[
            ("weight_ih_l0", &[0.6, -0.4, 0.9]),
            ("weight_hh_l0", &[0.3, 0.5, -0.7]),
            ("bias_ih_l0", &[0.1, -0.2, 0.05]),
            ("bias_hh_l0", &[-0.15, 0.25, 0.4]),
        ],
    );
    let out = forward(&cfg, &params, &[vec![vec![-0.8]]], Some(&[0.6]), None);
    assert!(out.c_n.is_empty());
    // r = σ(-0.35), z = σ(0.67), n = tanh(-0.67 + r·(-0.42 + 0.4)), h' = (1-z)·n + z·0.6.
    assert_near(&out.h_n, &[0.197_056_058_114_364_47], 1e-14, "h_n");
    // The other GRU variant, n = tanh(W_in x + b_in + W_hn (r⊙h) + b_hn), gives 0.2558…:
    // the reference must not be computing that one.
    assert!((out.h_n[0] - 0.255_870_211_518_438_14).abs() > 1e-2);
}

#[test]
fn reference_bidirectional_final_state_positions() {
    let lens = [5, 2, 3];
    let cfgs = [
        Config::new(CellKind::RnnTanh, 3, 4),
        Config::new(CellKind::RnnRelu, 3, 4),
        Config::new(CellKind::Gru, 3, 4),
        Config::new(CellKind::Lstm, 3, 4),
        Config::new(CellKind::Lstm, 3, 4).proj(2),
    ];
    for (n, cfg) in cfgs.iter().enumerate() {
        let cfg = cfg.layers(2).bidirectional(true);
        let params = random_params(&cfg, 10 + n as u64);
        let x = random_input(&cfg, &lens, 20 + n as u64);
        let (h0, c0) = random_states(&cfg, lens.len(), 30 + n as u64);
        let out = forward(&cfg, &params, &x, Some(&h0), Some(&c0));
        let hout = cfg.out_size();
        let top = cfg.num_layers - 1;
        for (b, &len) in lens.iter().enumerate() {
            assert_eq!(out.y[b].len(), len);
            let fwd = &out.h_n[((top * 2) * lens.len() + b) * hout..][..hout];
            let rev = &out.h_n[((top * 2 + 1) * lens.len() + b) * hout..][..hout];
            assert_eq!(
                fwd,
                &out.y[b][len - 1][..hout],
                "{cfg:?}: forward h_n of {b}"
            );
            assert_eq!(rev, &out.y[b][0][hout..], "{cfg:?}: reverse h_n of {b}");
            assert_ne!(fwd, rev);
        }
    }
}

#[test]
fn reference_variable_lengths() {
    let lens = [5, 3];
    for cell in [CellKind::Lstm, CellKind::Gru, CellKind::RnnTanh] {
        let cfg = Config::new(cell, 3, 4).bidirectional(true);
        let params = random_params(&cfg, 1);
        let x = random_input(&cfg, &lens, 2);
        let (h0, c0) = random_states(&cfg, lens.len(), 3);
        let out = forward(&cfg, &params, &x, Some(&h0), Some(&c0));
        let (hout, hs) = (cfg.out_size(), cfg.hidden_size);

        // The short sequence alone (batch of one, its own state slots) gives the same results:
        // nothing leaks between batch entries and padding steps do not exist.
        let pick = |v: &[f64], w: usize| -> Vec<f64> {
            if v.is_empty() {
                return Vec::new();
            }
            (0..2)
                .flat_map(|slot| v[(slot * 2 + 1) * w..][..w].to_vec())
                .collect()
        };
        let (h0_1, c0_1) = (pick(&h0, hout), pick(&c0, hs));
        let alone = forward(&cfg, &params, &x[1..], Some(&h0_1), Some(&c0_1));
        assert_eq!(alone.y[0], out.y[1], "{cell:?}: y");
        assert_eq!(alone.h_n, pick(&out.h_n, hout), "{cell:?}: h_n");
        assert_eq!(alone.c_n, pick(&out.c_n, hs), "{cell:?}: c_n");

        // The reverse direction starts at the last valid step: its output there is one step
        // from its h0 slot on x[1][2] alone.
        let last = vec![x[1][2].clone()];
        let one = forward(&cfg, &params, &[last], Some(&h0_1), Some(&c0_1));
        assert_eq!(
            one.y[0][0][hout..],
            out.y[1][2][hout..],
            "{cell:?}: reverse start"
        );
        assert_ne!(out.y[1][2][hout..], out.y[0][2][hout..]);
    }
}

#[test]
fn reference_projection_shapes() {
    let cfg = Config::new(CellKind::Lstm, 3, 5)
        .proj(2)
        .layers(2)
        .bidirectional(true);
    let want: Vec<(String, Vec<usize>)> = [
        ("weight_ih_l0", vec![20, 3]),
        ("weight_hh_l0", vec![20, 2]),
        ("bias_ih_l0", vec![20]),
        ("bias_hh_l0", vec![20]),
        ("weight_hr_l0", vec![2, 5]),
        ("weight_ih_l0_reverse", vec![20, 3]),
        ("weight_hh_l0_reverse", vec![20, 2]),
        ("bias_ih_l0_reverse", vec![20]),
        ("bias_hh_l0_reverse", vec![20]),
        ("weight_hr_l0_reverse", vec![2, 5]),
        ("weight_ih_l1", vec![20, 4]),
        ("weight_hh_l1", vec![20, 2]),
        ("bias_ih_l1", vec![20]),
        ("bias_hh_l1", vec![20]),
        ("weight_hr_l1", vec![2, 5]),
        ("weight_ih_l1_reverse", vec![20, 4]),
        ("weight_hh_l1_reverse", vec![20, 2]),
        ("bias_ih_l1_reverse", vec![20]),
        ("bias_hh_l1_reverse", vec![20]),
        ("weight_hr_l1_reverse", vec![2, 5]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    assert_eq!(param_shapes(&cfg), want);
    let lens = [4, 1, 2];
    let x = random_input(&cfg, &lens, 5);
    let out = forward(&cfg, &random_params(&cfg, 4), &x, None, None);
    assert!(out.y.iter().flatten().all(|v| v.len() == 4));
    assert_eq!(out.h_n.len(), 2 * 2 * 3 * 2);
    assert_eq!(out.c_n.len(), 2 * 2 * 3 * 5);
    let names: Vec<String> = param_shapes(&cfg.bias(BiasMode::NoBias))
        .into_iter()
        .map(|p| p.0)
        .collect();
    assert!(names.iter().all(|n| !n.starts_with("bias_")) && names.len() == 12);
}

#[test]
fn reference_finite_differences_exact_on_linear() {
    assert!((central_difference(|v| 3.0 * v - 2.0, 0.4, 0.25) - 3.0).abs() < 1e-14);

    // One LSTM step from h0 = 0: y and h_n are W_hr·m with m independent of W_hr, and c_n does
    // not depend on W_hr, so the loss is linear in W_hr and even a coarse step is exact.
    let lens = [1, 1];
    let cfg = Config::new(CellKind::Lstm, 3, 4).proj(2);
    let params = random_params(&cfg, 7);
    let x = random_input(&cfg, &lens, 8);
    let c0 = random_states(&cfg, 2, 9).1;
    let w = random_loss_weights(&cfg, &lens, 10);
    let grads = numeric_grads(&cfg, &params, &x, None, Some(&c0), &w, 0.25);
    // m = the output of the same cell without projection (W_hh·0 = 0 whatever its width).
    let plain = Config::new(CellKind::Lstm, 3, 4);
    let plain_params: Vec<Param> = params
        .iter()
        .filter(|p| p.0 != "weight_hr_l0")
        .map(|p| match p.0.as_str() {
            "weight_hh_l0" => (p.0.clone(), vec![16, 4], vec![0.5; 64]),
            _ => p.clone(),
        })
        .collect();
    let m = forward(&plain, &plain_params, &x, None, Some(&c0)).y;
    let mut want = vec![0.0; 2 * 4];
    for (b, m_b) in m.iter().enumerate() {
        for p in 0..2 {
            for (j, m_bj) in m_b[0].iter().enumerate() {
                want[p * 4 + j] += (w.wy[b][0][p] + w.wh[b * 2 + p]) * m_bj;
            }
        }
    }
    let idx = params.iter().position(|p| p.0 == "weight_hr_l0").unwrap();
    assert_near(&grads.params[idx], &want, 1e-12, "d/dW_hr");
}

#[test]
fn reference_finite_difference_matches_analytic_tanh() {
    // h = tanh(a·x + b·h0 + c + d): dL/dx = w·(1 - h²)·a, dL/dh0 = w·(1 - h²)·b.
    let cfg = Config::new(CellKind::RnnTanh, 1, 1);
    let (a, bw, bi, bh) = (0.9, -0.6, 0.2, -0.1);
    let params = named(
        &cfg,
        &[
            ("weight_ih_l0", &[a]),
            ("weight_hh_l0", &[bw]),
            ("bias_ih_l0", &[bi]),
            ("bias_hh_l0", &[bh]),
        ],
    );
    let (x, h0) = (vec![vec![vec![0.4]]], [0.7]);
    let h = (a * 0.4 + bw * 0.7 + bi + bh).tanh();
    let w = LossWeights {
        wy: vec![vec![vec![1.5]]],
        wh: vec![-0.5],
        wc: vec![],
    };
    let dh = (1.5 - 0.5) * (1.0 - h * h);
    let fd = |t| finite_difference(&cfg, &params, &x, Some(&h0), None, &w, t, 1e-6);
    assert!((fd(Target::X { b: 0, t: 0, i: 0 }) - dh * a).abs() < 1e-9);
    assert!((fd(Target::H0(0)) - dh * bw).abs() < 1e-9);
    assert!((fd(Target::Param { index: 2, elem: 0 }) - dh).abs() < 1e-9);
}

#[test]
fn reference_skip_input_is_identity_input_matrix() {
    let cfg = Config::new(CellKind::Lstm, 3, 3)
        .skip_input(true)
        .layers(2)
        .bidirectional(true);
    assert!(param_shapes(&cfg)
        .iter()
        .all(|p| !p.0.starts_with("weight_ih_l0")));
    let linear = cfg.skip_input(false);
    let params = random_params(&cfg, 11);
    let mut linear_params = params.clone();
    let eye: Vec<f64> = (0..12 * 3)
        .map(|e| if (e / 3) % 3 == e % 3 { 1.0 } else { 0.0 })
        .collect();
    for name in ["weight_ih_l0", "weight_ih_l0_reverse"] {
        linear_params.push((name.to_string(), vec![12, 3], eye.clone()));
    }
    let lens = [3, 2];
    let x = random_input(&cfg, &lens, 12);
    let (h0, c0) = random_states(&cfg, 2, 13);
    let skip = forward(&cfg, &params, &x, Some(&h0), Some(&c0));
    let lin = forward(&linear, &linear_params, &x, Some(&h0), Some(&c0));
    assert_eq!(skip, lin);
}

#[test]
fn reference_bias_modes() {
    let lens = [3, 2];
    let double = Config::new(CellKind::Lstm, 2, 3);
    let single = double.bias(BiasMode::SingleInput);
    let params = random_params(&double, 14);
    let x = random_input(&double, &lens, 15);
    let get = |n: &str| params.iter().find(|p| p.0 == n).unwrap().2.clone();
    // LSTM adds both biases before every nonlinearity, so one combined input bias is the same.
    let summed: Vec<f64> = get("bias_ih_l0")
        .iter()
        .zip(get("bias_hh_l0"))
        .map(|(a, b)| a + b)
        .collect();
    let single_params: Vec<Param> = params
        .iter()
        .filter(|p| p.0 != "bias_hh_l0")
        .map(|p| {
            if p.0 == "bias_ih_l0" {
                (p.0.clone(), p.1.clone(), summed.clone())
            } else {
                p.clone()
            }
        })
        .collect();
    let a = forward(&double, &params, &x, None, None);
    let b = forward(&single, &single_params, &x, None, None);
    assert_near(&a.h_n, &b.h_n, 1e-14, "h_n");
    assert_near(&a.c_n, &b.c_n, 1e-14, "c_n");

    // GRU keeps b_hn inside r⊙(…): moving it to the input bias changes the result.
    let gru = Config::new(CellKind::Gru, 2, 3);
    let rec = gru.bias(BiasMode::SingleRecurrent);
    let gp = random_params(&rec, 16);
    let as_input: Vec<Param> = gp
        .iter()
        .map(|p| (p.0.replace("bias_hh", "bias_ih"), p.1.clone(), p.2.clone()))
        .collect();
    let r1 = forward(&rec, &gp, &x, None, None);
    let r2 = forward(&gru.bias(BiasMode::SingleInput), &as_input, &x, None, None);
    assert!(r1
        .h_n
        .iter()
        .zip(&r2.h_n)
        .any(|(a, b)| (a - b).abs() > 1e-6));
    // An omitted bias is zero.
    let zeroed: Vec<Param> = gp
        .iter()
        .cloned()
        .chain([("bias_ih_l0".to_string(), vec![9], vec![0.0; 9])])
        .collect();
    assert_eq!(forward(&gru, &zeroed, &x, None, None), r1);
}
