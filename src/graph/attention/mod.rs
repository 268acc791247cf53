//! Scaled dot-product attention in a graph: the composite operation pattern cudnn-frontend's
//! SDPA nodes build (`CompositeSDPANode` and `CompositeSDPABackwardNode` in
//! `include/cudnn_frontend/node/scaled_dot_product_flash_attention.h`), which cuDNN's fused
//! flash-attention engines recognize.
//!
//! * `forward.rs`: [`Graph::sdpa`]; `backward.rs`: [`Graph::sdpa_backward`];
//! * `parts.rs`: the pieces both build (masks, ALiBi, dropout mask, grouped-head matmuls);
//! * `checks.rs`: the checks both open with, before the graph changes;
//! * `builder.rs`: [`Sdpa`], which declares q, k, v (and o, dO, stats) from the sizes and a
//!   buffer layout ([`SdpaLayout`]) and builds either pass.
#[cfg(doc)]
use super::Graph;
use super::TensorId;
use crate::error::{Error, Result};

mod backward;
mod builder;
mod checks;
mod forward;
mod parts;

pub use builder::{Sdpa, SdpaBackward, SdpaForward, SdpaInputs, SdpaLayout};

/// Options of [`Graph::sdpa`] and [`Graph::sdpa_backward`].
///
/// Plain data: each field is a setting, and the method of the same name sets it (by value,
/// for chaining); [`Graph::sdpa`] and [`Graph::sdpa_backward`] check the combination.
/// Defaults: scale `1/√d`, no causal mask, no sliding window, no bias, no ALiBi, inference (no
/// statistics output), no dropout, no padding mask; backward graphs accumulate dQ in f32 (not
/// [`SdpaOptions::deterministic`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct SdpaOptions {
    /// The factor applied to `Q·Kᵀ` ([`SdpaOptions::scale`]); `None`: `1/√d`.
    pub scale: Option<f64>,
    /// The causal mask and its alignment ([`SdpaOptions::causal`],
    /// [`SdpaOptions::causal_bottom_right`]); `None`: no causal mask.
    pub causal: Option<DiagonalAlignment>,
    /// The sliding window ([`SdpaOptions::sliding_window`]).
    pub sliding_window: Option<i64>,
    /// Whether the forward pass outputs the statistics ([`SdpaOptions::training`]).
    pub training: bool,
    /// Dropout ([`SdpaOptions::dropout`]).
    pub dropout: Option<SdpaDropout>,
    /// Whether the forward pass outputs the dropout mask ([`SdpaOptions::dump_dropout_mask`]).
    pub dump_dropout_mask: bool,
    /// The sequence-length tensors `(seq_len_q, seq_len_kv)` ([`SdpaOptions::padding`]).
    pub padding: Option<(TensorId, TensorId)>,
    /// The additive bias tensor ([`SdpaOptions::bias`]).
    pub bias: Option<TensorId>,
    /// The ALiBi slopes tensor ([`SdpaOptions::alibi`]).
    pub alibi: Option<TensorId>,
    /// Whether the backward pass outputs dBias ([`SdpaOptions::bias_grad`]).
    pub bias_grad: bool,
    /// Whether the backward pass takes the deterministic form
    /// ([`SdpaOptions::deterministic`]).
    pub deterministic: bool,
}

/// Where the diagonal of a causal mask ([`SdpaOptions::causal`],
/// [`SdpaOptions::causal_bottom_right`]) and of a sliding window ([`SdpaOptions::sliding_window`])
/// lies in the `s_q × s_kv` score matrix (cudnn-frontend's `DiagonalAlignment_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagonalAlignment {
    /// Query row `i` sits at key column `i` (PyTorch's `is_causal=True`).
    TopLeft,
    /// The last query row sits at the last key column: query row `i` sits at key column
    /// `i + s_kv − s_q` (with a padding mask `i + seq_len_kv[n] − seq_len_q[n]`), as when new
    /// queries attend to a key/value cache that already holds the earlier tokens (PyTorch's
    /// `causal_lower_right`).
    BottomRight,
}

/// Dropout as set on [`SdpaOptions`] with [`SdpaOptions::dropout`] (checked by
/// [`Graph::sdpa`] / [`Graph::sdpa_backward`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct SdpaDropout {
    /// The probability of dropping an attention probability.
    pub probability: f64,
    /// The seed tensor ([`Graph::rng_input`]).
    pub seed: TensorId,
    /// The offset tensor ([`Graph::rng_input`]).
    pub offset: TensorId,
}

impl SdpaOptions {
    /// The defaults: scale `1/√d`, not causal, no statistics.
    pub fn new() -> SdpaOptions {
        SdpaOptions::default()
    }
    /// The factor applied to `Q·Kᵀ` before the softmax (`attn_scale`; finite). Default `1/√d`.
    #[must_use]
    pub fn scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }
    /// Top-left aligned causal mask: query row `i` attends to key columns `j ≤ i`. `false`
    /// removes a causal mask of either alignment (the last of [`SdpaOptions::causal`] and
    /// [`SdpaOptions::causal_bottom_right`] decides).
    #[must_use]
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal.then_some(DiagonalAlignment::TopLeft);
        self
    }
    /// Bottom-right aligned causal mask ([`DiagonalAlignment::BottomRight`]): query row `i`
    /// attends to key columns `j ≤ i + s_kv − s_q` (with [`SdpaOptions::padding`],
    /// `j ≤ i + seq_len_kv[n] − seq_len_q[n]`). `false` removes a causal mask of either
    /// alignment.
    ///
    /// As cudnn-frontend's SDPA nodes require: `s_q ≤ s_kv` unless a padding mask is set (and
    /// then each entry's `seq_len_q[n] ≤ seq_len_kv[n]` is the caller's to keep: a query row
    /// with no key to attend to has no defined output), and neither [`SdpaOptions::bias`] nor
    /// [`SdpaOptions::dropout`]. [`Graph::sdpa`] and [`Graph::sdpa_backward`] refuse the other
    /// combinations with [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// use cudnn_safe::graph::{Graph, SdpaOptions};
    /// use cudnn_safe::DType;
    /// # fn main() -> cudnn_safe::Result<()> {
    /// // 16 new queries attending to 1024 cached keys and values (the last 16 are theirs).
    /// let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    /// let q = g.tensor_nchw("q", &[1, 8, 16, 64], DType::BF16)?;
    /// let k = g.tensor_nchw("k", &[1, 8, 1024, 64], DType::BF16)?;
    /// let v = g.tensor_nchw("v", &[1, 8, 1024, 64], DType::BF16)?;
    /// let out = g.sdpa(q, k, v, &SdpaOptions::new().causal_bottom_right(true))?;
    /// # let _ = out; Ok(()) }
    /// ```
    #[must_use]
    pub fn causal_bottom_right(mut self, causal: bool) -> Self {
        self.causal = causal.then_some(DiagonalAlignment::BottomRight);
        self
    }
    /// Sliding-window attention (cudnn-frontend's `diagonal_band_left_bound`): with a causal
    /// mask of either alignment, query row `i` attends only to the `window` keys ending at its
    /// diagonal, columns `j` with `d(i) − window < j ≤ d(i)` where `d(i)` is `i` (top-left) or
    /// `i + s_kv − s_q` (bottom-right; with a padding mask `i + seq_len_kv[n] − seq_len_q[n]`).
    ///
    /// `window ≥ 1`, a causal mask set, and `s_q ≤ s_kv` unless a padding mask is set (checked
    /// by [`Graph::sdpa`] and [`Graph::sdpa_backward`]).
    #[must_use]
    pub fn sliding_window(mut self, window: i64) -> Self {
        self.sliding_window = Some(window);
        self
    }
    /// An additive attention bias (cudnn-frontend's `set_bias`, PyTorch's float `attn_mask`):
    /// `S = scale · Q·Kᵀ + bias` before the masks and the softmax. `bias` is a graph input of
    /// q's data type with dimensions `[b or 1, h or 1, s_q, s_kv]` (broadcast over batch entries
    /// and heads of extent 1); `−∞` entries mask scores out (a row masked entirely has no
    /// defined output).
    ///
    /// [`Graph::sdpa_backward`] adds the same bias, and with [`SdpaOptions::bias_grad`] also
    /// outputs its gradient.
    #[must_use]
    pub fn bias(mut self, bias: TensorId) -> Self {
        self.bias = Some(bias);
        self
    }
    /// ALiBi, attention with linear biases (cudnn-frontend's `set_alibi_mask`):
    /// `S[n, i, j] += slope[i_h] · (j − i)` for head `i_h`, after the bias and before the masks,
    /// forward and backward. `slopes` is a graph input of [`Graph::alibi_slopes_input`] (f32
    /// `[1, h, 1, 1]`), bound to a device buffer of the per-head slopes: [`alibi_slopes`] gives
    /// the standard ones cudnn-frontend uses. As cudnn-frontend requires, only with a top-left
    /// causal mask ([`SdpaOptions::causal`]; [`Graph::sdpa`] and [`Graph::sdpa_backward`] refuse
    /// it otherwise).
    ///
    /// ```no_run
    /// use cudnn_safe::graph::{alibi_slopes, Args, Graph, SdpaOptions};
    /// use cudnn_safe::{cuda_context, Cudnn, DType};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    /// let q = g.tensor_nchw("q", &[2, 8, 512, 64], DType::BF16)?;
    /// let k = g.tensor_nchw("k", &[2, 8, 512, 64], DType::BF16)?;
    /// let v = g.tensor_nchw("v", &[2, 8, 512, 64], DType::BF16)?;
    /// let slopes = g.alibi_slopes_input("slopes", 8)?;
    /// let out = g.sdpa(q, k, v, &SdpaOptions::new().causal(true).alibi(slopes))?;
    /// let slopes_buf = stream.clone_htod(&alibi_slopes(8)?).unwrap();
    /// let mut args = Args::new(&cudnn);
    /// args.input(slopes, &slopes_buf)?;
    /// # let _ = out; Ok(()) }
    /// ```
    #[must_use]
    pub fn alibi(mut self, slopes: TensorId) -> Self {
        self.alibi = Some(slopes);
        self
    }
    /// Backward only, with [`SdpaOptions::bias`]: also output `dBias`
    /// ([`SdpaGrads::dbias`]), the gradient of the bias, summed over the batch: the bias must
    /// then be `[1, h, s_q, s_kv]` (the shape cudnn-frontend's tests use). The graph then
    /// writes dQ directly (no f32 accumulation scratch, [`SdpaGrads::dq_accum`] is `None`),
    /// as cudnn-frontend builds it: the engines compute dBias only in that form.
    /// [`Graph::sdpa`] ignores it.
    #[must_use]
    pub fn bias_grad(mut self, grad: bool) -> Self {
        self.bias_grad = grad;
        self
    }
    /// Backward only: the form of the backward graph cuDNN's deterministic kernels run on
    /// Hopper GPUs (cudnn-frontend's `set_deterministic_algorithm`): dQ is written directly by
    /// its matmul instead of being accumulated in f32 across thread blocks, so a rerun on the
    /// same inputs gives the same bits. [`SdpaGrads::dq_accum`] is then `None`.
    /// [`Graph::sdpa`] ignores it (the forward pass is deterministic already).
    ///
    /// Reruns give the same bits (`gpu_sdpa_deterministic_backward_repeats_bitwise` checks dQ,
    /// dK and dV). The default form promises no such thing, though it may repeat in practice,
    /// and its backward may be faster; this form is the one cudnn-frontend builds when
    /// determinism is asked for.
    #[must_use]
    pub fn deterministic(mut self, deterministic: bool) -> Self {
        self.deterministic = deterministic;
        self
    }
    /// Forward only: also output the softmax statistics (`Stats`, f32 `[b, h, s_q, 1]`, the
    /// row maximum plus the log of the row sum), which [`Graph::sdpa_backward`] reads.
    #[must_use]
    pub fn training(mut self, training: bool) -> Self {
        self.training = training;
        self
    }
    /// Dropout on the attention probabilities, as cudnn-frontend's SDPA nodes build it: each
    /// probability `P[i, j]` is kept with probability `1 − probability` and scaled by
    /// `1 / (1 − probability)`, or zeroed (`O = (P ⊙ mask / (1 − p)) · V`).
    ///
    /// The mask is drawn by cuDNN's Philox generator from `seed` and `offset`: graph inputs of
    /// [`Graph::rng_input`] (one `i64` each on the device, bound with
    /// [`Args::input_i64`](super::Args::input_i64)), so a new step needs new values, not a new
    /// graph. The same seed and offset give the same mask for the same shape: the backward graph
    /// ([`Graph::sdpa_backward`] with the same options and the same seed and offset values)
    /// regenerates the forward's mask instead of storing it. Training loops change the seed or
    /// advance the offset each step, as PyTorch advances its Philox offset.
    ///
    /// `probability` is finite with `0 ≤ probability < 1` (checked by [`Graph::sdpa`] and
    /// [`Graph::sdpa_backward`]). With 0 the mask is drawn all ones (Bernoulli probability 1) and
    /// the result is that of attention without dropout; seed and offset are still read (and
    /// [`SdpaOptions::dump_dropout_mask`] is refused: the kernels write no mask then).
    ///
    /// A different seed gives an independent mask. A different offset gives a different mask,
    /// but nearby offsets share part of Philox's stream (offset 1 instead of 0 changes only a
    /// fraction of the elements an independent mask would): advance the offset by large steps,
    /// or change the seed, per call.
    ///
    /// ```no_run
    /// use cudnn_safe::graph::{Args, Graph, PlanFilter, SdpaOptions};
    /// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let dims = [2i64, 8, 512, 64];
    /// let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    /// let q = g.tensor_nchw("q", &dims, DType::F16)?;
    /// let k = g.tensor_nchw("k", &dims, DType::F16)?;
    /// let v = g.tensor_nchw("v", &dims, DType::F16)?;
    /// let seed = g.rng_input("seed");
    /// let offset = g.rng_input("offset");
    /// let opts = SdpaOptions::new()
    ///     .causal(true)
    ///     .training(true)
    ///     .dropout(0.1, seed, offset);
    /// let out = g.sdpa(q, k, v, &opts)?;
    /// let stats = out.stats.expect("training");
    /// let og = g.build(&cudnn)?;
    /// let plan = og.plan(&cudnn, &PlanFilter::default())?;
    ///
    /// let qb = stream.alloc_zeros::<half::f16>(og.span(q)?).unwrap();
    /// let kb = stream.alloc_zeros::<half::f16>(og.span(k)?).unwrap();
    /// let vb = stream.alloc_zeros::<half::f16>(og.span(v)?).unwrap();
    /// let mut ob = stream.alloc_zeros::<half::f16>(og.span(out.o)?).unwrap();
    /// let mut sb = stream.alloc_zeros::<f32>(og.span(stats)?).unwrap();
    /// let seed_buf = stream.clone_htod(&[1234i64]).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// for step in 0..3i64 {
    ///     // A new mask per step; the backward graph reads the same values to get it again.
    ///     let offset_buf = stream.clone_htod(&[step]).unwrap();
    ///     let mut args = Args::new(&cudnn);
    ///     args.input(q, &qb)?.input(k, &kb)?.input(v, &vb)?;
    ///     args.input_i64(seed, &seed_buf)?.input_i64(offset, &offset_buf)?;
    ///     args.output(out.o, &mut ob)?.output(stats, &mut sb)?;
    ///     cudnn.execute(&plan, &args, &mut ws)?;
    /// }
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn dropout(mut self, probability: f64, seed: TensorId, offset: TensorId) -> Self {
        self.dropout = Some(SdpaDropout {
            probability,
            seed,
            offset,
        });
        self
    }
    /// Forward only, with [`SdpaOptions::dropout`]: also output the dropout mask
    /// (cudnn-frontend's `rng_dump`), f32 `[b, h, s_q, s_kv]` packed, 1 where a probability is
    /// kept and 0 where it is dropped, for checking results. [`Graph::sdpa_backward`] ignores it.
    #[must_use]
    pub fn dump_dropout_mask(mut self, dump: bool) -> Self {
        self.dump_dropout_mask = dump;
        self
    }
    /// A padding mask for batches of sequences of different lengths (cudnn-frontend's
    /// `set_padding_mask` with `seq_len_q` / `seq_len_kv`): batch entry `n` has
    /// `seq_len_q[n]` queries and `seq_len_kv[n]` keys and values; the rest of its rows and
    /// columns are padding. Query row `i` attends only to key columns `j < seq_len_kv[n]`
    /// (with [`SdpaOptions::causal`] also `j ≤ i`), and the matmuls compute only the valid part
    /// of each product (their M, N, K overrides).
    ///
    /// Both tensors are graph inputs of [`Graph::seq_len_input`] (INT32 `[b, 1, 1, 1]`; the
    /// same tensor may serve both). Their values bound what the fused kernels read, so they are
    /// bound with [`Args::lengths`](super::Args::lengths), which copies host values checked to
    /// lie in `0..=s_q` and `0..=s_kv` (a device buffer the host has not seen is refused).
    ///
    /// What the outputs hold at padding positions (rows `i ≥ seq_len_q[n]` of O, the statistics
    /// and dQ; rows `j ≥ seq_len_kv[n]` of dK and dV) is described at [`Graph::sdpa`].
    #[must_use]
    pub fn padding(mut self, seq_len_q: TensorId, seq_len_kv: TensorId) -> Self {
        self.padding = Some((seq_len_q, seq_len_kv));
        self
    }
    /// Whether the backward graph writes dQ directly (no f32 accumulation scratch).
    fn direct_dq(&self) -> bool {
        self.deterministic || (self.bias_grad && self.bias.is_some())
    }
}

/// Outputs of [`Graph::sdpa`], already marked as graph outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SdpaOutputs {
    /// The attention output `[b, h, s_q, d_v]`, of q's data type, laid out in q's memory order.
    pub o: TensorId,
    /// With [`SdpaOptions::training`]: the softmax statistics, f32 `[b, h, s_q, 1]` packed
    /// (`max_j S[i, j] + ln Σ_j exp(S[i, j] − max)` of the scaled, masked scores).
    pub stats: Option<TensorId>,
    /// With [`SdpaOptions::dump_dropout_mask`]: the dropout mask, f32 `[b, h, s_q, s_kv]`
    /// packed (1 kept, 0 dropped).
    pub dropout_mask: Option<TensorId>,
}

/// Outputs of [`Graph::sdpa_backward`], already marked as graph outputs.
///
/// Besides the gradients, the pattern writes two f32 scratch tensors the caller binds like
/// outputs (cudnn-frontend places them in its workspace): their contents after execution are
/// intermediate values, not results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SdpaGrads {
    /// Gradient with respect to q (q's dimensions, data type and memory order).
    pub dq: TensorId,
    /// Gradient with respect to k (k's original `[b, h_k, s_kv, d]` dimensions and memory order).
    pub dk: TensorId,
    /// Gradient with respect to v (v's original dimensions and memory order).
    pub dv: TensorId,
    /// With [`SdpaOptions::bias_grad`]: the bias gradient, of q's data type with the bias's
    /// dimensions `[1, h, s_q, s_kv]`, packed.
    pub dbias: Option<TensorId>,
    /// Scratch: `Σ_d dO·O` per row, f32 `[b, h, s_q, 1]` packed.
    pub softmax_sum: TensorId,
    /// Scratch: dQ accumulated in f32, `[b, h, s_q, d]` packed; `None` when dQ is written
    /// directly ([`SdpaOptions::deterministic`], [`SdpaOptions::bias_grad`]).
    pub dq_accum: Option<TensorId>,
}

/// The sizes of an attention problem: q `[b, h, s_q, d]`, k `[b, h_k, s_kv, d]`,
/// v `[b, h_v, s_kv, d_v]` (`h_k` and `h_v` divide `h`: grouped-query attention when smaller,
/// multi-query attention when 1).
#[derive(Debug, Clone, Copy)]
struct SdpaSizes {
    b: i64,
    h: i64,
    h_k: i64,
    h_v: i64,
    s_q: i64,
    s_kv: i64,
    d: i64,
    d_v: i64,
}

/// Largest head dimension accepted (what cuDNN 9's flash-attention engines document for
/// Hopper-class GPUs with f16 / bf16).
const MAX_HEAD_DIM: i64 = 128;

/// The standard ALiBi slopes for `heads` heads (Press et al.; cudnn-frontend's
/// `get_alibi_slope`): with `n` the largest power of two not above `heads`, head `i < n` gets
/// `2^(−8(i + 1)/n)` and the remaining heads `2^(−8(k + ½)/n)` for `k = 0, 1, …` (the odd
/// steps of the sequence for `2n` heads). Empty for 0 heads.
///
/// Errors: [`Error::InvalidArgument`] for more heads than a graph tensor describes
/// (`i32::MAX`, the most [`Graph::alibi_slopes_input`] accepts), before anything is allocated.
///
/// ```
/// let s = cudnn_safe::graph::alibi_slopes(8)?;
/// assert_eq!(s[0], 0.5);
/// assert_eq!(s[7], 1.0 / 256.0);
/// # Ok::<(), cudnn_safe::Error>(())
/// ```
pub fn alibi_slopes(heads: usize) -> Result<Vec<f32>> {
    if heads > i32::MAX as usize {
        return Err(Error::invalid(
            "ALiBi heads",
            "at most 2147483647 heads (cuDNN's int)",
            heads,
        ));
    }
    if heads == 0 {
        return Ok(Vec::new());
    }
    let n = 1usize << heads.ilog2();
    let steps = (0..n)
        .map(|i| (i + 1) as f64)
        .chain((0..heads - n).map(|k| k as f64 + 0.5));
    Ok(steps
        .map(|e| 2f64.powf(-8.0 * e / n as f64) as f32)
        .collect())
}

/// The attention scale: the option's (finite) or `1/√d`.
fn sdpa_scale(opts: &SdpaOptions, d: i64) -> Result<f64> {
    match opts.scale {
        Some(s) if !s.is_finite() => Err(Error::invalid(
            "attention scale",
            "a finite value",
            format!("{s}"),
        )),
        Some(s) => Ok(s),
        None => Ok(1.0 / (d as f64).sqrt()),
    }
}
