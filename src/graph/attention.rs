//! Scaled dot-product attention in a graph: the composite operation pattern cudnn-frontend's
//! SDPA nodes build (`CompositeSDPANode` and `CompositeSDPABackwardNode` in
//! `include/cudnn_frontend/node/scaled_dot_product_flash_attention.h`), which cuDNN's fused
//! flash-attention engines recognize; plus the general graph operations that pattern needs
//! (binary select, a transposed view), and the random Bernoulli mask of attention dropout
//! (`RngNode` in `include/cudnn_frontend/node/rng.h`).
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, AttrElem, Desc};
use super::{stride_order, strides_in_order, Graph, Op, PointwiseMode, TensorId, TensorInfo};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::reduce::ReduceOp;
use crate::tensor::Layout;

/// Options of [`Graph::sdpa`] and [`Graph::sdpa_backward`].
///
/// Defaults: scale `1/√d`, no causal mask, no sliding window, no bias, no ALiBi, inference (no
/// statistics output), no dropout, no padding mask; backward graphs accumulate dQ in f32 (not
/// [`SdpaOptions::deterministic`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SdpaOptions {
    scale: Option<f64>,
    causal: Option<DiagonalAlignment>,
    window: Option<i64>,
    training: bool,
    dropout: Option<Dropout>,
    dump_mask: bool,
    padding: Option<(TensorId, TensorId)>,
    bias: Option<TensorId>,
    alibi: Option<TensorId>,
    bias_grad: bool,
    deterministic: bool,
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

/// Dropout as set on [`SdpaOptions`] (checked by [`Graph::sdpa`] / [`Graph::sdpa_backward`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Dropout {
    probability: f64,
    seed: TensorId,
    offset: TensorId,
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
        self.window = Some(window);
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
    /// let plan = og.plans(&cudnn, &PlanFilter::default())?.plans.remove(0);
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
        self.dropout = Some(Dropout {
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
        self.dump_mask = dump;
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
    /// The sequence-length tensors set with [`SdpaOptions::padding`], if any.
    pub fn padding_inputs(&self) -> Option<(TensorId, TensorId)> {
        self.padding
    }
    /// The dropout probability set with [`SdpaOptions::dropout`], if any.
    pub fn dropout_probability(&self) -> Option<f64> {
        self.dropout.map(|d| d.probability)
    }
    /// The seed and offset tensors set with [`SdpaOptions::dropout`], if any.
    pub fn dropout_inputs(&self) -> Option<(TensorId, TensorId)> {
        self.dropout.map(|d| (d.seed, d.offset))
    }
    /// Whether [`Graph::sdpa`] outputs the dropout mask.
    pub fn dumps_dropout_mask(&self) -> bool {
        self.dump_mask
    }
    /// The scale set with [`SdpaOptions::scale`], if any.
    pub fn scale_value(&self) -> Option<f64> {
        self.scale
    }
    /// Whether a causal mask (of either alignment) is applied.
    pub fn is_causal(&self) -> bool {
        self.causal.is_some()
    }
    /// The alignment of the causal mask, if any.
    pub fn causal_alignment(&self) -> Option<DiagonalAlignment> {
        self.causal
    }
    /// The sliding window set with [`SdpaOptions::sliding_window`], if any.
    pub fn window(&self) -> Option<i64> {
        self.window
    }
    /// The bias tensor set with [`SdpaOptions::bias`], if any.
    pub fn bias_input(&self) -> Option<TensorId> {
        self.bias
    }
    /// The ALiBi slopes tensor set with [`SdpaOptions::alibi`], if any.
    pub fn alibi_input(&self) -> Option<TensorId> {
        self.alibi
    }
    /// Whether [`Graph::sdpa_backward`] outputs the bias gradient.
    pub fn has_bias_grad(&self) -> bool {
        self.bias_grad
    }
    /// Whether [`Graph::sdpa_backward`] builds the deterministic form.
    pub fn is_deterministic(&self) -> bool {
        self.deterministic
    }
    /// Whether the backward graph writes dQ directly (no f32 accumulation scratch).
    fn direct_dq(&self) -> bool {
        self.deterministic || (self.bias_grad && self.bias.is_some())
    }
    /// Whether [`Graph::sdpa`] outputs the statistics.
    pub fn is_training(&self) -> bool {
        self.training
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

impl Graph {
    /// Whether tensor `i` is the result of a comparison (boolean for cuDNN) or a 32-bit integer
    /// result ([`PointwiseMode::GenIndex`], or index arithmetic): such tensors stay virtual.
    pub(crate) fn index_or_boolean(&self, i: usize) -> bool {
        let int = self.tensors[i].dtype == DType::I32;
        self.tensors[i].producer.is_some_and(|p| {
            matches!(self.ops[p], Op::Pointwise { mode, y, .. }
                if y == i && (mode.gives_boolean() || int))
        })
    }

    /// Per tensor: whether cuDNN is told it holds booleans (the outputs of comparisons).
    pub(crate) fn boolean_tensors(&self) -> Vec<bool> {
        let mut b = vec![false; self.tensors.len()];
        for op in &self.ops {
            if let Op::Pointwise { mode, y, .. } = *op {
                if mode.gives_boolean() {
                    b[y] = true;
                }
            }
        }
        b
    }

    /// Whether tensor `i` is the (boolean) result of a comparison.
    fn is_boolean(&self, i: usize) -> bool {
        self.tensors[i].producer.is_some_and(|p| {
            matches!(self.ops[p], Op::Pointwise { mode, y, .. } if y == i && mode.gives_boolean())
        })
    }

    /// Binary select (`CUDNN_POINTWISE_BINARY_SELECT`): `y = cond ? x : b` element-wise, where
    /// `cond` is the result of a comparison ([`PointwiseMode::CmpGe`], ...) with x's
    /// dimensions, and `b` a tensor of x's rank (each dimension equal to x's or 1) or a
    /// [`Graph::scalar`]. y has x's dimensions and memory order.
    ///
    /// cudnn-frontend's attention masks are built this way: `select(scores, −∞, row ≥ col)`.
    #[doc(alias = "CUDNN_POINTWISE_BINARY_SELECT")]
    pub fn select(&mut self, x: TensorId, b: TensorId, cond: TensorId) -> Result<TensorId> {
        const OP: &str = "binary select";
        let (xi, bi, ci) = (self.index(x)?, self.index(b)?, self.index(cond)?);
        let (xt, bt, ct) = (&self.tensors[xi], &self.tensors[bi], &self.tensors[ci]);
        if xt.scalar.is_some() {
            return Err(Error::invalid(
                "binary select operand",
                "x is a tensor (only b may be a by-value scalar)",
                format!("scalar `{}`", xt.name),
            ));
        }
        if !self.is_boolean(ci) {
            return Err(Error::invalid(
                "binary select condition",
                "a boolean result (a comparison such as CmpGe, or LogicalAnd)",
                format!("`{}`", ct.name),
            ));
        }
        if ct.dims != xt.dims {
            return Err(xt.shape_mismatch(ct, "the select condition has x's dimensions"));
        }
        let r = xt.dims.len();
        if bt.scalar.is_none() {
            let ok = bt.dims.len() == r
                && bt
                    .dims
                    .iter()
                    .zip(&xt.dims)
                    .all(|(&p, &q)| p == q || p == 1);
            if !ok {
                return Err(
                    xt.shape_mismatch(bt, "b has x's rank, each dimension equal to x's or 1")
                );
            }
        }
        let dims = xt.dims.clone();
        let order = stride_order(&xt.strides);
        let xi = self.operand(x, None, OP)?;
        let bi = self.operand(b, Some(r), OP)?;
        let ci = self.operand(cond, None, OP)?;
        let y = self.output("select.y", dims, &order, self.ops.len())?;
        self.ops.push(Op::Select {
            x: xi,
            b: bi,
            cond: ci,
            y: y.index,
        });
        Ok(y)
    }

    /// A transposed view (`CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR`): y is x with its last
    /// two dimensions and strides swapped (the same elements, no data movement), virtual, of
    /// x's data type. x has rank ≥ 3 and is not a scalar.
    ///
    /// cudnn-frontend's attention backward reads `Pᵀ`, `dSᵀ` and `K` (from `Kᵀ`) so.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR")]
    pub fn transpose(&mut self, x: TensorId) -> Result<TensorId> {
        const OP: &str = "transpose";
        let xi = self.index(x)?;
        let xt = &self.tensors[xi];
        let r = xt.dims.len();
        if r < 3 || xt.scalar.is_some() {
            return Err(Error::invalid(
                "transpose operand",
                "a tensor of rank ≥ 3",
                format!("`{}` with dims {:?}", xt.name, xt.dims),
            ));
        }
        let (mut dims, mut strides) = (xt.dims.clone(), xt.strides.clone());
        dims.swap(r - 2, r - 1);
        strides.swap(r - 2, r - 1);
        let dtype = xt.dtype;
        let xi = self.operand(x, None, OP)?;
        let op = self.ops.len();
        let y = self.push(TensorInfo {
            name: "transpose.y",
            dims,
            strides,
            dtype,
            is_virtual: true,
            scalar: None,
            bound: None,
            producer: Some(op),
            consumed: false,
        });
        self.ops.push(Op::Transpose { x: xi, y: y.index });
        Ok(y)
    }

    /// The causal mask and the sliding window of `opts` on scores `s` (cudnn-frontend's
    /// `sliding_window_mask`: one composite `DiagonalBandMask` node each, as it builds them for
    /// cuDNN before 9.21):
    ///
    /// - right bound (causal): `keep = CMP_GE(row', col)` with `row' = row` (top-left) or
    ///   `row + s_kv − s_q` (bottom-right; INT32 arithmetic, by the padding lengths when set);
    /// - left bound (window `w`): `keep = CMP_GT(col', row)` with `col' = col + w` (top-left,
    ///   an f32 scalar), `col + (w − s_kv + s_q)` (bottom-right, fixed lengths, f32) or
    ///   `col + w − seq_len_kv + seq_len_q` (bottom-right with padding, INT32);
    ///
    /// each followed by `select(s, −∞, keep)`, with its own generated indices.
    fn diagonal_masks(
        &mut self,
        mut s: TensorId,
        opts: &SdpaOptions,
        padding: Option<(TensorId, TensorId)>,
        sz: &SdpaSizes,
    ) -> Result<TensorId> {
        let Some(align) = opts.causal else {
            return Ok(s);
        };
        let bottom_right = align == DiagonalAlignment::BottomRight;
        // The lengths a bottom-right diagonal is shifted by: the padding tensors, or INT32
        // scalars of the full extents.
        let lengths = |g: &mut Graph| -> Result<(TensorId, TensorId)> {
            Ok(match padding {
                Some(p) => p,
                None => (
                    g.int_scalar("sdpa.s_q", sz.s_q),
                    g.int_scalar("sdpa.s_kv", sz.s_kv),
                ),
            })
        };
        {
            let mut row = self.pointwise(PointwiseMode::GenIndex { axis: 2 }, s, None)?;
            self.set_name(row, "sdpa.row_index")?;
            let col = self.pointwise(PointwiseMode::GenIndex { axis: 3 }, s, None)?;
            self.set_name(col, "sdpa.col_index")?;
            if bottom_right {
                let (sq, skv) = lengths(self)?;
                row = self.pointwise(PointwiseMode::Add, row, Some(skv))?;
                row = self.pointwise(PointwiseMode::Sub, row, Some(sq))?;
                self.set_name(row, "sdpa.row_diagonal")?;
            }
            let keep = self.pointwise(PointwiseMode::CmpGe, row, Some(col))?;
            self.set_name(keep, "sdpa.causal_keep")?;
            let ninf = self.scalar("sdpa.neg_inf", f64::NEG_INFINITY, DType::F32)?;
            s = self.select(s, ninf, keep)?;
            self.set_name(s, "sdpa.masked_scores")?;
        }
        if let Some(w) = opts.window {
            let row = self.pointwise(PointwiseMode::GenIndex { axis: 2 }, s, None)?;
            self.set_name(row, "sdpa.window_row_index")?;
            let mut col = self.pointwise(PointwiseMode::GenIndex { axis: 3 }, s, None)?;
            self.set_name(col, "sdpa.window_col_index")?;
            match (bottom_right, padding) {
                (false, _) => {
                    let ws = self.scalar("sdpa.window", w as f64, DType::F32)?;
                    col = self.pointwise(PointwiseMode::Add, col, Some(ws))?;
                }
                (true, None) => {
                    let shift = (w - sz.s_kv + sz.s_q) as f64;
                    let ws = self.scalar("sdpa.window", shift, DType::F32)?;
                    col = self.pointwise(PointwiseMode::Add, col, Some(ws))?;
                }
                (true, Some((sq, skv))) => {
                    let ws = self.int_scalar("sdpa.window", w);
                    col = self.pointwise(PointwiseMode::Add, col, Some(ws))?;
                    col = self.pointwise(PointwiseMode::Sub, col, Some(skv))?;
                    col = self.pointwise(PointwiseMode::Add, col, Some(sq))?;
                }
            }
            self.set_name(col, "sdpa.window_col_diagonal")?;
            let keep = self.pointwise(PointwiseMode::CmpGt, col, Some(row))?;
            self.set_name(keep, "sdpa.window_keep")?;
            let ninf = self.scalar("sdpa.window_neg_inf", f64::NEG_INFINITY, DType::F32)?;
            s = self.select(s, ninf, keep)?;
            self.set_name(s, "sdpa.windowed_scores")?;
        }
        Ok(s)
    }

    /// ALiBi on scores `s` (cudnn-frontend's `alibi_mask`): `col − row` of generated indices
    /// (INT32), times the per-head slopes, added to the scores.
    fn alibi(&mut self, s: TensorId, slopes: TensorId) -> Result<TensorId> {
        let row = self.pointwise(PointwiseMode::GenIndex { axis: 2 }, s, None)?;
        self.set_name(row, "sdpa.alibi_row_index")?;
        let col = self.pointwise(PointwiseMode::GenIndex { axis: 3 }, s, None)?;
        self.set_name(col, "sdpa.alibi_col_index")?;
        let dist = self.pointwise(PointwiseMode::Sub, col, Some(row))?;
        let lin = self.pointwise(PointwiseMode::Mul, dist, Some(slopes))?;
        self.set_name(lin, "sdpa.alibi_bias")?;
        let y = self.pointwise(PointwiseMode::Add, s, Some(lin))?;
        self.set_name(y, "sdpa.alibi_scores")?;
        Ok(y)
    }

    /// A graph input for the per-head slopes of [`SdpaOptions::alibi`]: f32 `[1, heads, 1, 1]`,
    /// packed; bind a device buffer of `heads` slopes (e.g. [`alibi_slopes`]) with
    /// [`Args::input`](super::Args::input). `heads` is q's number of heads, at least 1.
    #[doc(alias = "alibi_mask")]
    pub fn alibi_slopes_input(&mut self, name: &'static str, heads: i64) -> Result<TensorId> {
        if heads < 1 {
            return Err(Error::invalid(
                "ALiBi slopes input",
                "at least 1 head",
                format!("`{name}` with {heads} heads"),
            ));
        }
        Ok(self.push(TensorInfo {
            name,
            dims: vec![1, heads, 1, 1],
            strides: vec![heads, 1, 1, 1],
            dtype: DType::F32,
            is_virtual: false,
            scalar: None,
            bound: None,
            producer: None,
            consumed: false,
        }))
    }

    /// A by-value INT32 scalar (a sequence extent or a window in index arithmetic).
    fn int_scalar(&mut self, name: &'static str, value: i64) -> TensorId {
        self.push(TensorInfo {
            name,
            dims: Vec::new(),
            strides: Vec::new(),
            dtype: DType::I32,
            is_virtual: false,
            scalar: Some(value as f64),
            bound: None,
            producer: None,
            consumed: false,
        })
    }

    /// Checks the score modifiers of `opts` against the problem, before the graph is changed:
    /// the causal alignment, the sliding window and the bias (see their [`SdpaOptions`]
    /// methods); with `backward`, also the bias gradient. `transposed` are the operands the
    /// graph re-describes transposed (k, and v for the backward pass), which the bias may not
    /// be. Returns the bias tensor.
    fn sdpa_modifiers(
        &self,
        op: &'static str,
        opts: &SdpaOptions,
        sz: &SdpaSizes,
        dtype: DType,
        backward: bool,
        transposed: &[usize],
    ) -> Result<Option<TensorId>> {
        let padded = opts.padding.is_some();
        let refuse = |what: &'static str, want: String, got: String| {
            Err(Error::invalid(what, format!("{op}: {want}"), got))
        };
        if let Some(w) = opts.window {
            if w < 1 {
                return refuse(
                    "attention sliding window",
                    "a window ≥ 1".into(),
                    format!("{w}"),
                );
            }
            if opts.causal.is_none() {
                return refuse(
                    "attention sliding window",
                    "a causal mask with the window (causal or causal_bottom_right)".into(),
                    "no causal mask".into(),
                );
            }
        }
        let bottom_right = opts.causal == Some(DiagonalAlignment::BottomRight);
        if (bottom_right || opts.window.is_some()) && !padded && sz.s_q > sz.s_kv {
            return refuse(
                "attention diagonal mask",
                "s_q ≤ s_kv for a bottom-right causal mask or a sliding window (or a padding \
                 mask)"
                    .into(),
                format!("s_q {} > s_kv {}", sz.s_q, sz.s_kv),
            );
        }
        if bottom_right && (opts.bias.is_some() || opts.dropout.is_some()) {
            return refuse(
                "attention diagonal mask",
                "a bottom-right causal mask without bias or dropout (as cuDNN's engines support \
                 it)"
                .into(),
                format!(
                    "bias {}, dropout {}",
                    opts.bias.is_some(),
                    opts.dropout.is_some()
                ),
            );
        }
        if let Some(slopes) = opts.alibi {
            if opts.causal != Some(DiagonalAlignment::TopLeft) {
                return refuse(
                    "attention ALiBi",
                    "a top-left causal mask with ALiBi (as cuDNN's engines support it)".into(),
                    format!("causal mask {:?}", opts.causal),
                );
            }
            let t = &self.tensors[self.index(slopes)?];
            let want = [1, sz.h, 1, 1];
            if t.dtype != DType::F32 || t.scalar.is_some() || t.producer.is_some() || t.dims != want
            {
                return refuse(
                    "attention ALiBi slopes",
                    format!("an f32 graph input {want:?} (Graph::alibi_slopes_input)"),
                    format!("`{}`: {} with dims {:?}", t.name, t.dtype, t.dims),
                );
            }
        }
        let Some(bias) = opts.bias else {
            if backward && opts.bias_grad {
                return refuse(
                    "attention bias gradient",
                    "bias_grad together with bias".into(),
                    "no bias set".into(),
                );
            }
            return Ok(None);
        };
        let bi = self.index(bias)?;
        let t = &self.tensors[bi];
        if transposed.contains(&bi) {
            return refuse(
                "attention bias",
                "a tensor of its own, not k or v (the graph describes them transposed; bind \
                 one buffer to two tensors instead)"
                    .into(),
                format!("`{}` passed as the bias too", t.name),
            );
        }
        if t.dtype != dtype {
            return Err(Error::UnsupportedDataType {
                op,
                detail: format!("bias `{}` is {} (q's type {dtype})", t.name, t.dtype),
            });
        }
        let SdpaSizes {
            b, h, s_q, s_kv, ..
        } = *sz;
        let dims_ok = t.dims.len() == 4
            && (t.dims[0] == b || t.dims[0] == 1)
            && (t.dims[1] == h || t.dims[1] == 1)
            && t.dims[2..] == [s_q, s_kv];
        if t.scalar.is_some() || t.producer.is_some() || !dims_ok {
            return refuse(
                "attention bias",
                format!(
                    "a graph input [b or 1, h or 1, s_q, s_kv] = [{b}|1, {h}|1, {s_q}, {s_kv}]"
                ),
                format!("`{}` with dims {:?}", t.name, t.dims),
            );
        }
        if backward && opts.bias_grad && t.dims != [1, h, s_q, s_kv] {
            return refuse(
                "attention bias gradient",
                format!("a bias [1, h, s_q, s_kv] = [1, {h}, {s_q}, {s_kv}] for its gradient"),
                format!("`{}` with dims {:?}", t.name, t.dims),
            );
        }
        Ok(Some(bias))
    }

    /// Checks one attention operand: a graph input of rank 4, f16 or bf16, with a unit stride
    /// along the head dimension; returns its dims.
    fn sdpa_operand(&self, op: &'static str, i: usize, dtype: DType) -> Result<Vec<i64>> {
        let t = &self.tensors[i];
        if t.scalar.is_some() || t.producer.is_some() || t.dims.len() != 4 {
            return Err(Error::invalid(
                "attention operand",
                format!("{op}: a graph input tensor of rank 4 ([b, h, s, d])"),
                format!("`{}` with dims {:?}", t.name, t.dims),
            ));
        }
        if !matches!(t.dtype, DType::F16 | DType::BF16) || t.dtype != dtype {
            return Err(Error::UnsupportedDataType {
                op,
                detail: format!(
                    "`{}` is {} (q, k, v, o and dO are all f16 or all bf16; q is {dtype})",
                    t.name, t.dtype
                ),
            });
        }
        if t.strides[3] != 1 {
            return Err(Error::invalid(
                "attention operand layout",
                format!("{op}: stride 1 along the head dimension (the last)"),
                format!("`{}` with strides {:?}", t.name, t.strides),
            ));
        }
        Ok(t.dims.clone())
    }

    /// `t` must have dimensions `want`.
    fn sdpa_dims(&self, a: usize, b: usize, want: &[i64], rule: &'static str) -> Result<()> {
        let (at, bt) = (&self.tensors[a], &self.tensors[b]);
        if bt.dims != want {
            return Err(at.shape_mismatch(bt, rule));
        }
        Ok(())
    }

    /// The checks [`Graph::sdpa`] and [`Graph::sdpa_backward`] open with, in this order: f32
    /// intermediate and compute types; q, k, v and then `more` (o and dO) attention operands
    /// of q's data type; k `[b, h, s_kv, d]` for q `[b, h, s_q, d]`; v `[b, h, s_kv, d_v]`.
    /// Returns q's data type and the sizes.
    fn sdpa_qkv(
        &self,
        op: &'static str,
        [qi, ki, vi]: [usize; 3],
        more: &[usize],
    ) -> Result<(DType, SdpaSizes)> {
        self.sdpa_types(op)?;
        let dtype = self.tensors[qi].dtype;
        let qd = self.sdpa_operand(op, qi, dtype)?;
        let kd = self.sdpa_operand(op, ki, dtype)?;
        let vd = self.sdpa_operand(op, vi, dtype)?;
        for &i in more {
            self.sdpa_operand(op, i, dtype)?;
        }
        let (b, h, s_q, d) = (qd[0], qd[1], qd[2], qd[3]);
        let (h_k, s_kv) = (kd[1], kd[2]);
        let (h_v, d_v) = (vd[1], vd[3]);
        let rule = "k is [b, h_k, s_kv, d] for q [b, h, s_q, d], h_k dividing h";
        if h % h_k != 0 {
            return Err(self.tensors[qi].shape_mismatch(&self.tensors[ki], rule));
        }
        self.sdpa_dims(qi, ki, &[b, h_k, s_kv, d], rule)?;
        let rule = "v is [b, h_v, s_kv, d_v] for q [b, h, s_q, d] and k [b, h_k, s_kv, d], h_v \
                    dividing h";
        if h % h_v != 0 {
            return Err(self.tensors[qi].shape_mismatch(&self.tensors[vi], rule));
        }
        self.sdpa_dims(ki, vi, &[b, h_v, s_kv, d_v], rule)?;
        Ok((
            dtype,
            SdpaSizes {
                b,
                h,
                h_k,
                h_v,
                s_q,
                s_kv,
                d,
                d_v,
            },
        ))
    }

    /// A matmul of attention: grouped ([`Graph::matmul_with`]) when b (k or v, or a view of
    /// them) has fewer heads than a, plain otherwise (the same graph as before grouped heads
    /// existed, so plans and cache keys of multi-head graphs stay as they were).
    ///
    /// `over` are the tensors giving the actual M, N and K of each batch entry (the padding
    /// mask's sequence lengths), if any.
    fn sdpa_matmul(
        &mut self,
        a: TensorId,
        b: TensorId,
        over: [Option<TensorId>; 3],
    ) -> Result<TensorId> {
        let grouped = self.tensors[a.index].dims[..2] != self.tensors[b.index].dims[..2];
        self.matmul_over(a, b, grouped, over)
    }

    /// A gradient `[b, h, s_kv, x]` of all `h` query heads summed into `heads` heads (each the
    /// sum of its group of `h / heads` consecutive query heads), as cudnn-frontend's backward
    /// node reduces dK and dV for grouped-query attention; `t` itself when `heads` is `h`. The
    /// full-head gradient is declared of the data type `dtype`, as cudnn-frontend declares it.
    fn sdpa_head_sum(&mut self, t: TensorId, heads: i64, dtype: DType) -> Result<TensorId> {
        let mut dims = self.tensors[t.index].dims.clone();
        if dims[1] == heads {
            return Ok(t);
        }
        self.tensors[t.index].dtype = dtype;
        dims[1] = heads;
        self.reduction_with(ReduceOp::Add, t, &dims, true)
    }

    /// The head dimension `d` of tensor `i` is at most 128 and a multiple of 8.
    fn sdpa_head_dim(&self, op: &'static str, i: usize) -> Result<()> {
        let t = &self.tensors[i];
        let d = t.dims[3];
        if d > MAX_HEAD_DIM || d % 8 != 0 {
            return Err(Error::invalid(
                "attention head dimension",
                format!("{op}: d ≤ {MAX_HEAD_DIM} and a multiple of 8"),
                format!("`{}` with dims {:?}", t.name, t.dims),
            ));
        }
        Ok(())
    }

    /// f32 intermediate and compute types, as cudnn-frontend's SDPA requires.
    fn sdpa_types(&self, op: &'static str) -> Result<()> {
        if self.intermediate != DType::F32 || self.compute != DType::F32 {
            return Err(Error::UnsupportedDataType {
                op,
                detail: format!(
                    "graph intermediate {} and compute {} (attention needs f32 for both)",
                    self.intermediate, self.compute
                ),
            });
        }
        Ok(())
    }

    /// `t` (k or v) is re-described as its transposed view `[b, h, d, s]`; it must not be read
    /// by any operation yet (they would see the new description).
    fn sdpa_check_unread(&self, op: &'static str, i: usize) -> Result<()> {
        let t = &self.tensors[i];
        if t.consumed {
            return Err(Error::invalid(
                "attention operand",
                format!(
                    "{op}: k (and v for the backward pass) read by no other operation \
                     (the graph describes it transposed)"
                ),
                format!("`{}` is already read by an operation", t.name),
            ));
        }
        Ok(())
    }

    /// Tensor `i` (k or v, re-described transposed) is none of `others`: one tensor cannot be
    /// both Kᵀ and Q (bind one buffer to two tensors to attend a sequence to itself).
    fn sdpa_distinct(&self, op: &'static str, i: usize, others: &[usize]) -> Result<()> {
        if others.contains(&i) {
            return Err(Error::invalid(
                "attention operand",
                format!(
                    "{op}: k (and v for the backward pass) a tensor of its own, not also another \
                     operand (create one tensor per operand; they may be bound to one buffer)"
                ),
                format!("`{}` passed twice", self.tensors[i].name),
            ));
        }
        Ok(())
    }

    /// Swaps the last two dims and strides of an input (same buffer, same span).
    fn sdpa_transpose_input(&mut self, i: usize) {
        let t = &mut self.tensors[i];
        t.dims.swap(2, 3);
        t.strides.swap(2, 3);
    }

    /// Strides for `dims` packed in the memory order of tensor `like`.
    fn sdpa_strides_like(&self, dims: &[i64], like: &[i64]) -> Result<Vec<i64>> {
        strides_in_order(dims, &stride_order(like))
    }

    /// Checks the dropout of `opts` (probability, seed and offset tensors) and the mask's
    /// dimensions `[b, h, s_q, s_kv]`, before the graph is changed.
    fn sdpa_dropout(
        &self,
        op: &'static str,
        opts: &SdpaOptions,
        mask_dims: &[i64; 4],
    ) -> Result<Option<Dropout>> {
        let Some(d) = opts.dropout else {
            return Ok(None);
        };
        let p = d.probability;
        if !(p.is_finite() && (0.0..1.0).contains(&p)) {
            return Err(Error::invalid(
                "attention dropout probability",
                format!("{op}: a finite probability with 0 ≤ p < 1"),
                format!("{p}"),
            ));
        }
        for (what, t) in [("dropout seed", d.seed), ("dropout offset", d.offset)] {
            self.sdpa_int_input(op, what, t, DType::I64, 1, "Graph::rng_input")?;
        }
        // A dumped mask is a real tensor: it must fit cuDNN's 32-bit addressing. Undumped it
        // stays virtual (never in memory), like the scores, and may pass 2^31 elements.
        let packed = strides_in_order(mask_dims, &[0, 1, 2, 3])?;
        if opts.dump_mask {
            Layout::strided(mask_dims, &packed)?;
        }
        Ok(Some(d))
    }

    /// The dropout mask `[b, h, s_q, s_kv]` (packed row-major, as cudnn-frontend sets it): a
    /// Bernoulli draw with probability `1 − p` from the seed and offset.
    fn sdpa_rng(&mut self, op: &'static str, d: &Dropout, dims: [i64; 4]) -> Result<TensorId> {
        let seed = self.operand(d.seed, None, op)?;
        let offset = self.operand(d.offset, None, op)?;
        let strides = strides_in_order(&dims, &[0, 1, 2, 3])?;
        let y = self.push(TensorInfo {
            name: "sdpa.dropout_mask",
            dims: dims.to_vec(),
            strides,
            dtype: self.intermediate,
            is_virtual: true,
            scalar: None,
            bound: None,
            producer: Some(self.ops.len()),
            consumed: false,
        });
        self.ops.push(Op::Rng(RngOp {
            seed,
            offset,
            y: y.index,
            probability: 1.0 - d.probability,
        }));
        Ok(y)
    }

    /// The sequence-length tensors of [`SdpaOptions::padding`], checked: graph inputs of
    /// [`Graph::seq_len_input`] for batch `b` (INT32 `[b, 1, 1, 1]`). Changes nothing.
    fn sdpa_padding(
        &self,
        op: &'static str,
        opts: &SdpaOptions,
        b: i64,
    ) -> Result<Option<(TensorId, TensorId)>> {
        let Some((sq, skv)) = opts.padding else {
            return Ok(None);
        };
        for (what, t) in [("padding seq_len_q", sq), ("padding seq_len_kv", skv)] {
            self.sdpa_int_input(op, what, t, DType::I32, b, "Graph::seq_len_input")?;
        }
        Ok(Some((sq, skv)))
    }

    /// Checks an integer input of attention (a dropout seed or offset, a padding length
    /// tensor): of `dtype`, a graph input (not a scalar, not an operation's output) of
    /// dimensions `[batch, 1, 1, 1]` packed, as `maker` creates it.
    fn sdpa_int_input(
        &self,
        op: &'static str,
        what: &str,
        t: TensorId,
        dtype: DType,
        batch: i64,
        maker: &str,
    ) -> Result<()> {
        let t = &self.tensors[self.index(t)?];
        if t.dtype != dtype {
            return Err(Error::UnsupportedDataType {
                op,
                detail: format!(
                    "{what} `{}` is {} (a {dtype} tensor of {maker})",
                    t.name, t.dtype
                ),
            });
        }
        if t.scalar.is_some()
            || t.producer.is_some()
            || t.dims != [batch, 1, 1, 1]
            || t.strides != [1, 1, 1, 1]
        {
            return Err(Error::invalid(
                "attention integer input",
                format!("{op}: the {what} is a graph input [{batch}, 1, 1, 1] of {maker}"),
                format!("`{}` with dims {:?}", t.name, t.dims),
            ));
        }
        Ok(())
    }

    /// Records that `t`'s values bound extents of at most `bound` (the smallest bound when
    /// several attention graphs read it).
    fn set_bound(&mut self, t: TensorId, bound: i64) {
        let info = &mut self.tensors[t.index];
        info.bound = Some(info.bound.map_or(bound, |b| b.min(bound)));
    }

    /// The padding mask on scores `s` `[b, h, s_q, s_kv]`: `−∞` where row `i ≥ seq_len_q[n]`
    /// or column `j ≥ seq_len_kv[n]` (cudnn-frontend's `padding_mask` score modifier:
    /// row and column indices, two `<` comparisons, a logical and, a binary select).
    fn padding_mask(&mut self, s: TensorId, sq: TensorId, skv: TensorId) -> Result<TensorId> {
        let row = self.pointwise(PointwiseMode::GenIndex { axis: 2 }, s, None)?;
        self.set_name(row, "sdpa.padding_row_index")?;
        let col = self.pointwise(PointwiseMode::GenIndex { axis: 3 }, s, None)?;
        self.set_name(col, "sdpa.padding_col_index")?;
        let row_ok = self.pointwise(PointwiseMode::CmpLt, row, Some(sq))?;
        let col_ok = self.pointwise(PointwiseMode::CmpLt, col, Some(skv))?;
        let keep = self.pointwise(PointwiseMode::LogicalAnd, row_ok, Some(col_ok))?;
        self.set_name(keep, "sdpa.padding_keep")?;
        let ninf = self.scalar("sdpa.padding_neg_inf", f64::NEG_INFINITY, DType::F32)?;
        let y = self.select(s, ninf, keep)?;
        self.set_name(y, "sdpa.padded_scores")?;
        Ok(y)
    }

    /// A graph input holding one 64-bit integer (`CUDNN_DATA_INT64`, dimensions and strides
    /// `[1, 1, 1, 1]`): the seed or the offset of an attention dropout mask
    /// ([`SdpaOptions::dropout`]). Bind a device buffer of at least one `i64` to it with
    /// [`Args::input_i64`](super::Args::input_i64); the value is read from the device at each
    /// execution, so a new seed or offset needs neither a new graph nor a new plan.
    ///
    /// cudnn-frontend's Python tests and PyTorch pass seed and offset so (INT64 device tensors
    /// `[1, 1, 1, 1]`).
    #[doc(alias = "CUDNN_ATTR_OPERATION_RNG_SEED")]
    #[doc(alias = "CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC")]
    pub fn rng_input(&mut self, name: &'static str) -> TensorId {
        self.int_input(name, 1, DType::I64)
    }

    /// A graph input holding one 32-bit sequence length per batch entry (`CUDNN_DATA_INT32`,
    /// dimensions `[batch, 1, 1, 1]`, packed): `seq_len_q` or `seq_len_kv` of an attention
    /// padding mask ([`SdpaOptions::padding`]), bound with
    /// [`Args::lengths`](super::Args::lengths). `batch` is at least 1.
    #[doc(alias = "seq_len_q")]
    #[doc(alias = "seq_len_kv")]
    pub fn seq_len_input(&mut self, name: &'static str, batch: i64) -> Result<TensorId> {
        if batch < 1 {
            return Err(Error::invalid(
                "sequence length input",
                "a batch of at least 1",
                format!("`{name}` with batch {batch}"),
            ));
        }
        Ok(self.int_input(name, batch, DType::I32))
    }

    /// A graph input of `dtype` with dimensions `[batch, 1, 1, 1]`, packed.
    fn int_input(&mut self, name: &'static str, batch: i64, dtype: DType) -> TensorId {
        self.push(TensorInfo {
            name,
            dims: vec![batch, 1, 1, 1],
            strides: vec![1; 4],
            dtype,
            is_virtual: false,
            scalar: None,
            bound: None,
            producer: None,
            consumed: false,
        })
    }
}

/// The Bernoulli random mask of attention dropout (`CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR`
/// with a `CUDNN_BACKEND_RNG_DESCRIPTOR`, built as cudnn-frontend's `RngNode` does): `y[i]` is 1
/// with probability `probability`, else 0, from the Philox generator seeded by the `seed` and
/// `offset` tensors (INT64 device tensors `[1, 1, 1, 1]`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct RngOp {
    seed: usize,
    offset: usize,
    y: usize,
    /// The probability of a 1 (`1 − p` for dropout probability `p`).
    probability: f64,
}

// SAFETY: `CUDNN_TYPE_RNG_DISTRIBUTION` elements are the C enum `cudnnRngDistribution_t`, whose
// Rust binding is a `#[repr(transparent)]` newtype of `c_uint` (4 bytes, any value valid); it is
// only ever set, never read back.
unsafe impl AttrElem for sys::cudnnRngDistribution_t {
    const TYPE: sys::cudnnBackendAttributeType_t =
        sys::cudnnBackendAttributeType_t::CUDNN_TYPE_RNG_DISTRIBUTION;
}

impl RngOp {
    pub(crate) fn reads(&self) -> Vec<usize> {
        vec![self.seed, self.offset]
    }

    pub(crate) fn writes(&self) -> Vec<usize> {
        vec![self.y]
    }

    pub(crate) fn name(&self) -> &'static str {
        "rng (Bernoulli)"
    }

    pub(crate) fn signature(&self) -> String {
        format!(
            "rng({},{},{},p{:x});",
            self.seed,
            self.offset,
            self.y,
            self.probability.to_bits()
        )
    }

    /// The operation descriptor and the RNG descriptor it refers to (kept alive beside it).
    pub(crate) fn descs(&self, lib: &'static Library, t: &[Desc]) -> Result<(Desc, Option<Desc>)> {
        let mut r = Desc::new(lib, kind!(CUDNN_BACKEND_RNG_DESCRIPTOR))?;
        r.set1(
            attr!(CUDNN_ATTR_RNG_DISTRIBUTION),
            sys::cudnnRngDistribution_t::CUDNN_RNG_DISTRIBUTION_BERNOULLI,
        )?;
        r.set1(
            attr!(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY),
            self.probability,
        )?;
        r.finalize()?;
        let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR))?;
        o.set_descs(attr!(CUDNN_ATTR_OPERATION_RNG_YDESC), &[&t[self.y]])?;
        o.set_descs(attr!(CUDNN_ATTR_OPERATION_RNG_DESC), &[&r])?;
        // Seed and offset as tensors (not the by-value INT64 seed attribute): the device values
        // change per step without rebuilding, as cudnn-frontend's SDPA nodes pass them.
        o.set_descs(attr!(CUDNN_ATTR_OPERATION_RNG_SEED), &[&t[self.seed]])?;
        o.set_descs(
            attr!(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC),
            &[&t[self.offset]],
        )?;
        o.finalize()?;
        Ok((o, Some(r)))
    }
}

impl Graph {
    /// Scaled dot-product attention forward, `O = softmax(scale · Q·Kᵀ + mask) · V`, as the
    /// pattern of operations cuDNN's fused flash-attention engines run (the composite pattern of
    /// cudnn-frontend's `CompositeSDPANode`):
    ///
    /// 1. `S = matmul(Q, Kᵀ)` (f32 `[b, h, s_q, s_kv]`), `S = S · scale` (by-value f32 scalar);
    ///    with [`SdpaOptions::bias`] `S = S + bias`; with [`SdpaOptions::padding`] the padding
    ///    mask (below);
    /// 2. causal: `row = GEN_INDEX(S, axis 2)`, `col = GEN_INDEX(S, axis 3)` (INT32),
    ///    `keep = CMP_GE(row, col)` (BOOLEAN), `S = BINARY_SELECT(S, −∞, keep)`; bottom-right
    ///    aligned ([`SdpaOptions::causal_bottom_right`]) `row` is first shifted by
    ///    `s_kv − s_q` in INT32; with [`SdpaOptions::sliding_window`] a second mask of the same
    ///    kind keeps `col + window > row` (both as cudnn-frontend's diagonal band masks);
    /// 3. softmax: `m = reduce_max(S)` `[b, h, s_q, 1]`, `E = exp(S − m)`, `l = reduce_add(E)`,
    ///    `Stats = m + ln l` (an f32 output in training, virtual otherwise, as cudnn-frontend
    ///    builds it), `P = E / l` (declared of q's data type, as cudnn-frontend declares the
    ///    first operand of the second matmul);
    /// 4. with [`SdpaOptions::dropout`] (probability `p`): `mask = RNG(seed, offset)` (Bernoulli
    ///    with probability `1 − p`, f32 `[b, h, s_q, s_kv]`, an output with
    ///    [`SdpaOptions::dump_dropout_mask`]), `P = P · mask · (1 / (1 − p))` (a by-value f32
    ///    scalar), declared of q's data type instead;
    /// 5. `O = matmul(P, V)`.
    ///
    /// q is `[b, h, s_q, d]`, k `[b, h_k, s_kv, d]`, v `[b, h_v, s_kv, d_v]`: graph inputs, all
    /// f16 or all bf16, with unit stride along the head dimension (any other strides, e.g. the
    /// interleaved `[b, s, h, d]` memory order cudnn-frontend's samples use:
    /// strides `[s·h·d, d, h·d, 1]`). `d` and `d_v` are at most 128 and multiples of 8. The
    /// graph's intermediate and compute types must be f32.
    ///
    /// `h_k` and `h_v` divide `h`: equal to it for multi-head attention, smaller for
    /// grouped-query attention (query head `i` reads key and value head `i / (h / h_k)` and
    /// `i / (h / h_v)`), 1 for multi-query attention. The matmuls reading k and v then take
    /// them as they are (cudnn-frontend's GQA description, which the fused engines recognize).
    ///
    /// With [`SdpaOptions::padding`] the scaled scores get the padding mask (`−∞` outside rows
    /// `i < seq_len_q[n]` and columns `j < seq_len_kv[n]`) before the causal mask, and the
    /// matmuls compute only the valid part of each batch entry (M, N, K overrides from the
    /// lengths). cuDNN 9.14's kernels write the padding rows rather than leave
    /// them: O rows `i ≥ seq_len_q[n]` are 0 and their statistics `−∞`; in
    /// [`Graph::sdpa_backward`] dQ rows `i ≥ seq_len_q[n]` and dK, dV rows `j ≥ seq_len_kv[n]`
    /// are 0 (`gpu_sdpa_padding_mask_forward_and_backward` checks this). A batch entry with
    /// `seq_len_kv[n] = 0` and `seq_len_q[n] > 0` has nothing to attend to.
    ///
    /// Kᵀ is how cuDNN reads k: the graph re-describes `k` as its transposed view
    /// `[b, h, d, s_kv]` (the same buffer and span; [`Graph::dims`] reports the new dimensions),
    /// so k must not be read by another operation.
    ///
    /// O is marked as an output of q's data type laid out in q's memory order; Stats (training)
    /// and the dropout mask (when dumped) as f32 outputs. The dropout probability, seed and
    /// offset are checked here (see [`SdpaOptions::dropout`]).
    ///
    /// ```no_run
    /// use cudnn_safe::graph::{Args, Graph, PlanFilter, SdpaOptions};
    /// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let (b, h, s, d) = (2i64, 8i64, 1024i64, 64i64);
    /// // [b, h, s, d] tensors stored as [b, s, h, d].
    /// let strides = [s * h * d, d, h * d, 1];
    /// let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    /// let q = g.tensor("q", &[b, h, s, d], &strides, DType::BF16)?;
    /// let k = g.tensor("k", &[b, h, s, d], &strides, DType::BF16)?;
    /// let v = g.tensor("v", &[b, h, s, d], &strides, DType::BF16)?;
    /// let out = g.sdpa(q, k, v, &SdpaOptions::new().causal(true).training(true))?;
    /// let stats = out.stats.expect("training");
    /// let og = g.build(&cudnn)?;
    /// let plan = og.plans(&cudnn, &PlanFilter::default())?.plans.remove(0);
    ///
    /// let qb = stream.alloc_zeros::<half::bf16>(og.span(q)?).unwrap();
    /// let kb = stream.alloc_zeros::<half::bf16>(og.span(k)?).unwrap();
    /// let vb = stream.alloc_zeros::<half::bf16>(og.span(v)?).unwrap();
    /// let mut ob = stream.alloc_zeros::<half::bf16>(og.span(out.o)?).unwrap();
    /// let mut sb = stream.alloc_zeros::<f32>(og.span(stats)?).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// let mut args = Args::new(&cudnn);
    /// args.input(q, &qb)?.input(k, &kb)?.input(v, &vb)?;
    /// args.output(out.o, &mut ob)?.output(stats, &mut sb)?;
    /// cudnn.execute(&plan, &args, &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "scaled_dot_product_attention")]
    #[doc(alias = "flash_attention")]
    #[doc(alias = "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR")]
    #[doc(alias = "CUDNN_POINTWISE_GEN_INDEX")]
    pub fn sdpa(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        opts: &SdpaOptions,
    ) -> Result<SdpaOutputs> {
        const OP: &str = "scaled dot-product attention";
        let (qi, ki, vi) = (self.index(q)?, self.index(k)?, self.index(v)?);
        let (dtype, sz) = self.sdpa_qkv(OP, [qi, ki, vi], &[])?;
        let SdpaSizes {
            b,
            h,
            s_q,
            s_kv,
            d,
            d_v,
            ..
        } = sz;
        self.sdpa_head_dim(OP, qi)?;
        self.sdpa_head_dim(OP, vi)?;
        self.sdpa_check_unread(OP, ki)?;
        self.sdpa_distinct(OP, ki, &[qi, vi])?;
        let scale = sdpa_scale(opts, d)?;
        let padding = self.sdpa_padding(OP, opts, b)?;
        let o_strides = self.sdpa_strides_like(&[b, h, s_q, d_v], &self.tensors[qi].strides)?;
        Layout::strided(&[b, h, s_q, d_v], &o_strides)?;
        let dropout = self.sdpa_dropout(OP, opts, &[b, h, s_q, s_kv])?;
        let bias = self.sdpa_modifiers(OP, opts, &sz, dtype, false, &[ki])?;
        match &dropout {
            None if opts.dump_mask => {
                return Err(Error::invalid(
                    "attention dropout mask output",
                    format!("{OP}: dump_dropout_mask together with dropout"),
                    "no dropout set",
                ))
            }
            // At keep-probability 1 the fused kernels skip the draw and leave the dump
            // unwritten (seen on an H200 with cuDNN 9.14 as NaN poison): refused rather than a
            // silent hole (the mask is all ones by definition).
            Some(d) if opts.dump_mask && d.probability == 0.0 => {
                return Err(Error::invalid(
                    "attention dropout mask output",
                    format!("{OP}: dump_dropout_mask with a dropout probability above 0"),
                    "probability 0 (the mask is all ones)",
                ))
            }
            _ => {}
        }

        if let Some((sq, skv)) = padding {
            self.set_bound(sq, s_q);
            self.set_bound(skv, s_kv);
        }
        let (pq, pkv) = (padding.map(|p| p.0), padding.map(|p| p.1));
        self.sdpa_transpose_input(ki);
        let s = self.sdpa_matmul(q, k, [pq, pkv, None])?;
        self.set_name(s, "sdpa.scores")?;
        let sc = self.scalar("sdpa.attn_scale", scale, DType::F32)?;
        let mut s = self.pointwise(PointwiseMode::Mul, s, Some(sc))?;
        self.set_name(s, "sdpa.scaled_scores")?;
        if let Some(bias) = bias {
            s = self.pointwise(PointwiseMode::Add, s, Some(bias))?;
            self.set_name(s, "sdpa.biased_scores")?;
        }
        if let Some(slopes) = opts.alibi {
            s = self.alibi(s, slopes)?;
        }
        if let Some((sq, skv)) = padding {
            s = self.padding_mask(s, sq, skv)?;
        }
        s = self.diagonal_masks(s, opts, padding, &sz)?;
        let row = [b, h, s_q, 1];
        let m = self.reduction(ReduceOp::Max, s, &row)?;
        self.set_name(m, "sdpa.row_max")?;
        let sub = self.pointwise(PointwiseMode::Sub, s, Some(m))?;
        let e = self.pointwise(PointwiseMode::Exp, sub, None)?;
        self.set_name(e, "sdpa.exp")?;
        let l = self.reduction(ReduceOp::Add, e, &row)?;
        self.set_name(l, "sdpa.row_sum")?;
        // cudnn-frontend's flash-attention softmax always computes the statistics ("As this is
        // flash attention": `has_stats(true)` in v1.14, a virtual Stats tensor for inference),
        // so the engines see the same pattern in both phases.
        let ln = self.pointwise(PointwiseMode::Log, l, None)?;
        let st = self.pointwise(PointwiseMode::Add, m, Some(ln))?;
        self.set_name(st, "sdpa.stats")?;
        let stats = if opts.training {
            self.mark_output_as(st, DType::F32)?;
            Some(st)
        } else {
            // A virtual result nothing reads: allowed here, as cudnn-frontend leaves it.
            self.tensors[st.index].consumed = true;
            None
        };
        let mut p = self.pointwise(PointwiseMode::Div, e, Some(l))?;
        self.set_name(p, "sdpa.probabilities")?;
        let mut dropout_mask = None;
        if let Some(dr) = dropout {
            // cudnn-frontend: rng (Bernoulli 1 − p), "dropout_mask_mul", then "dropout_scale"
            // (a by-value f32 1/(1 − p)).
            let mask = self.sdpa_rng(OP, &dr, [b, h, s_q, s_kv])?;
            let kept = self.pointwise(PointwiseMode::Mul, p, Some(mask))?;
            self.set_name(kept, "sdpa.dropped_probabilities")?;
            let ds = self.scalar(
                "sdpa.dropout_scale",
                1.0 / (1.0 - dr.probability),
                DType::F32,
            )?;
            p = self.pointwise(PointwiseMode::Mul, kept, Some(ds))?;
            self.set_name(p, "sdpa.dropout_probabilities")?;
            if opts.dump_mask {
                self.mark_output_as(mask, DType::F32)?;
                dropout_mask = Some(mask);
            }
        }
        // cudnn-frontend: "Requirement by cudnn backend to take in bmm2 aType as i/o type."
        self.tensors[p.index].dtype = dtype;
        let o = self.sdpa_matmul(p, v, [pq, None, pkv])?;
        self.set_name(o, "sdpa.o")?;
        self.mark_output_strided(o, dtype, &o_strides)?;
        Ok(SdpaOutputs {
            o,
            stats,
            dropout_mask,
        })
    }
}

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

impl Graph {
    /// Scaled dot-product attention backward: dQ, dK and dV from q, k, v, the forward output
    /// `o`, its gradient `d_o` and the forward statistics `stats` (of [`Graph::sdpa`] with
    /// [`SdpaOptions::training`]), with the same options (scale, causal) as the forward pass.
    /// The pattern is cudnn-frontend's `CompositeSDPABackwardNode` (cuDNN ≥ 9.6, no dP
    /// workspace):
    ///
    /// 0. with [`SdpaOptions::dropout`] (probability `p`): `mask = RNG(seed, offset)` as in
    ///    [`Graph::sdpa`]: with the same seed and offset values it is the forward's mask;
    /// 1. `softmax_sum = reduce_add(dO · O) · c` with `c = 1` (`1 − p` with dropout) (f32
    ///    `[b, h, s_q, 1]`, a real tensor);
    /// 2. `S = matmul(Q, Kᵀ) · scale` (`+ bias`, padding mask) `− Stats`, causal mask and
    ///    sliding window as in [`Graph::sdpa`], `E = exp(S)` (the recomputed probabilities);
    /// 3. `dV = matmul(Pᵀ, dO)` with `P = E` (`P = E · mask · (1 / (1 − p))` with dropout; `Pᵀ`
    ///    a transposed view declared of q's type);
    /// 4. `dP = matmul(dO, Vᵀ)` (`· mask` with dropout), `dS = (dP − softmax_sum) · E · scale`
    ///    (`· (1 / (1 − p))` before `scale` with dropout); with [`SdpaOptions::bias_grad`]
    ///    `dBias = reduce_add(dS / scale)` over the batch;
    /// 5. `dK = matmul(dSᵀ, Q)` (`dSᵀ` a transposed view of q's type);
    /// 6. `dQ_accum = matmul(dS, K)` (K the transposed view of Kᵀ; f32, a real tensor),
    ///    `dQ = identity(dQ_accum)`; with [`SdpaOptions::deterministic`] or
    ///    [`SdpaOptions::bias_grad`] `dQ = matmul(dS, K)` directly.
    ///
    /// Shapes and data types as in [`Graph::sdpa`] (grouped-query and multi-query attention
    /// included); `o` and `d_o` are `[b, h, s_q, d_v]` of q's type, `stats` f32
    /// `[b, h, s_q, 1]`. Dropout (probability, seed and offset) is checked as in
    /// [`Graph::sdpa`]; [`SdpaOptions::dump_dropout_mask`] is ignored here. k and v are
    /// re-described as their transposed views `Kᵀ`, `Vᵀ` (so neither may be read by another
    /// operation). dQ, dK and dV are outputs of q's type with the dimensions and memory order of
    /// q, k and v; with fewer key or value heads than query heads (`h_k` or `h_v` below `h`),
    /// dK and dV are computed for all `h` query heads (virtual, of q's type) and each group of
    /// `h / h_k` (`h / h_v`) consecutive heads is summed by a reduction, as cudnn-frontend's
    /// backward node does. [`SdpaGrads`] also names the two f32 scratch tensors the caller
    /// binds.
    #[doc(alias = "scaled_dot_product_attention_backward")]
    #[doc(alias = "flash_attention_backward")]
    #[allow(clippy::too_many_arguments)]
    pub fn sdpa_backward(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        o: TensorId,
        d_o: TensorId,
        stats: TensorId,
        opts: &SdpaOptions,
    ) -> Result<SdpaGrads> {
        const OP: &str = "scaled dot-product attention backward";
        let (qi, ki, vi) = (self.index(q)?, self.index(k)?, self.index(v)?);
        let (oi, doi, si) = (self.index(o)?, self.index(d_o)?, self.index(stats)?);
        let (dtype, sz) = self.sdpa_qkv(OP, [qi, ki, vi], &[oi, doi])?;
        let SdpaSizes {
            b,
            h,
            h_k,
            h_v,
            s_q,
            s_kv,
            d,
            d_v,
        } = sz;
        self.sdpa_dims(
            qi,
            oi,
            &[b, h, s_q, d_v],
            "o is [b, h, s_q, d_v] for q [b, h, s_q, d] and v [b, h, s_kv, d_v]",
        )?;
        self.sdpa_dims(oi, doi, &[b, h, s_q, d_v], "dO has o's dimensions")?;
        let st = &self.tensors[si];
        if st.scalar.is_some() || st.producer.is_some() || st.dtype != DType::F32 {
            return Err(Error::UnsupportedDataType {
                op: OP,
                detail: format!(
                    "stats `{}` is {} (an f32 graph input [b, h, s_q, 1])",
                    st.name, st.dtype
                ),
            });
        }
        self.sdpa_dims(
            qi,
            si,
            &[b, h, s_q, 1],
            "stats is [b, h, s_q, 1] for q [b, h, s_q, d]",
        )?;
        self.sdpa_head_dim(OP, qi)?;
        self.sdpa_head_dim(OP, vi)?;
        self.sdpa_check_unread(OP, ki)?;
        self.sdpa_check_unread(OP, vi)?;
        self.sdpa_distinct(OP, ki, &[qi, vi, oi, doi])?;
        self.sdpa_distinct(OP, vi, &[qi, oi, doi])?;
        let scale = sdpa_scale(opts, d)?;
        let dropout = self.sdpa_dropout(OP, opts, &[b, h, s_q, s_kv])?;
        let padding = self.sdpa_padding(OP, opts, b)?;
        let bias = self.sdpa_modifiers(OP, opts, &sz, dtype, true, &[ki, vi])?;
        let dq_strides = self.sdpa_strides_like(&[b, h, s_q, d], &self.tensors[qi].strides)?;
        let dk_strides = self.sdpa_strides_like(&[b, h_k, s_kv, d], &self.tensors[ki].strides)?;
        let dv_strides = self.sdpa_strides_like(&[b, h_v, s_kv, d_v], &self.tensors[vi].strides)?;

        if let Some((sq, skv)) = padding {
            self.set_bound(sq, s_q);
            self.set_bound(skv, s_kv);
        }
        let (pq, pkv) = (padding.map(|p| p.0), padding.map(|p| p.1));
        self.sdpa_transpose_input(ki);
        self.sdpa_transpose_input(vi);
        // The same mask as the forward pass (same seed, offset and shape), drawn first as
        // cudnn-frontend's backward node does.
        let mask = match dropout {
            Some(dr) => Some(self.sdpa_rng(OP, &dr, [b, h, s_q, s_kv])?),
            None => None,
        };
        let row = [b, h, s_q, 1];
        // softmax_sum = Σ_d dO·O (times the inverse dropout scale, 1 without dropout).
        let dot = self.pointwise(PointwiseMode::Mul, d_o, Some(o))?;
        let rs = self.reduction(ReduceOp::Add, dot, &row)?;
        // Packed [b, h, s_q, 1], as cudnn-frontend sets both (not dO's memory order).
        let row_strides = [h * s_q, s_q, 1, 1];
        self.tensors[rs.index].strides = row_strides.to_vec();
        let inv = match dropout {
            Some(dr) => self.scalar(
                "sdpa_bwd.dropout_scale_inv",
                1.0 - dr.probability,
                DType::F32,
            )?,
            None => self.scalar("sdpa_bwd.one", 1.0, DType::F32)?,
        };
        let softmax_sum = self.pointwise(PointwiseMode::Mul, rs, Some(inv))?;
        self.set_name(softmax_sum, "sdpa_bwd.softmax_sum")?;
        self.mark_output_strided(softmax_sum, DType::F32, &row_strides)?;

        // Recompute the probabilities from the statistics.
        let s = self.sdpa_matmul(q, k, [pq, pkv, None])?;
        self.set_name(s, "sdpa_bwd.scores")?;
        let sc = self.scalar("sdpa_bwd.attn_scale", scale, DType::F32)?;
        let mut s = self.pointwise(PointwiseMode::Mul, s, Some(sc))?;
        if let Some(bias) = bias {
            s = self.pointwise(PointwiseMode::Add, s, Some(bias))?;
            self.set_name(s, "sdpa_bwd.biased_scores")?;
        }
        if let Some(slopes) = opts.alibi {
            s = self.alibi(s, slopes)?;
        }
        if let Some((sq, skv)) = padding {
            s = self.padding_mask(s, sq, skv)?;
        }
        let s = self.pointwise(PointwiseMode::Sub, s, Some(stats))?;
        let s = self.diagonal_masks(s, opts, padding, &sz)?;
        let e = self.pointwise(PointwiseMode::Exp, s, None)?;
        self.set_name(e, "sdpa_bwd.probabilities")?;

        // With dropout: P ⊙ mask / (1 − p), the probabilities the forward's second matmul read.
        let dropout_scale = match dropout {
            Some(dr) => Some(self.scalar(
                "sdpa_bwd.dropout_scale",
                1.0 / (1.0 - dr.probability),
                DType::F32,
            )?),
            None => None,
        };
        let mut pd = e;
        if let (Some(mask), Some(dsc)) = (mask, dropout_scale) {
            let kept = self.pointwise(PointwiseMode::Mul, e, Some(mask))?;
            pd = self.pointwise(PointwiseMode::Mul, kept, Some(dsc))?;
            self.set_name(pd, "sdpa_bwd.dropout_probabilities")?;
        }

        // dV = Pᵀ·dO
        let pt = self.transpose(pd)?;
        self.tensors[pt.index].dtype = dtype;
        let dv = self.sdpa_matmul(pt, d_o, [pkv, None, pq])?;
        let dv = self.sdpa_head_sum(dv, h_v, dtype)?;
        self.set_name(dv, "sdpa_bwd.dv")?;

        // dS = (dO·Vᵀ − softmax_sum) · P · scale; with dropout
        // dS = (dO·Vᵀ ⊙ mask − softmax_sum) · P / (1 − p) · scale.
        let mut dp = self.sdpa_matmul(d_o, v, [pq, pkv, None])?;
        self.set_name(dp, "sdpa_bwd.dp")?;
        if let Some(mask) = mask {
            dp = self.pointwise(PointwiseMode::Mul, dp, Some(mask))?;
            self.set_name(dp, "sdpa_bwd.dp_dropout")?;
        }
        let t = self.pointwise(PointwiseMode::Sub, dp, Some(softmax_sum))?;
        let mut t = self.pointwise(PointwiseMode::Mul, t, Some(e))?;
        if let Some(dsc) = dropout_scale {
            t = self.pointwise(PointwiseMode::Mul, t, Some(dsc))?;
        }
        // dBias: the gradient of the biased scores, summed over the batch (cudnn-frontend's
        // "red_dP_dBias", before the scale).
        let dbias = match bias {
            Some(bias) if opts.bias_grad => {
                let dims = self.tensors[bias.index].dims.clone();
                let db = self.reduction(ReduceOp::Add, t, &dims)?;
                self.set_name(db, "sdpa_bwd.dbias")?;
                let packed = strides_in_order(&dims, &[0, 1, 2, 3])?;
                self.mark_output_strided(db, dtype, &packed)?;
                Some(db)
            }
            _ => None,
        };
        let ds = self.pointwise(PointwiseMode::Mul, t, Some(sc))?;
        self.set_name(ds, "sdpa_bwd.ds")?;

        // dK = dSᵀ·Q
        let dst = self.transpose(ds)?;
        self.tensors[dst.index].dtype = dtype;
        let dk = self.sdpa_matmul(dst, q, [pkv, None, pq])?;
        let dk = self.sdpa_head_sum(dk, h_k, dtype)?;
        self.set_name(dk, "sdpa_bwd.dk")?;

        // dQ = dS·K: accumulated in f32 then converted, or (deterministic, dBias) written by
        // the matmul itself, as cudnn-frontend's dP-workspace form.
        let kv = self.transpose(k)?;
        let (dq, dq_accum) = if opts.direct_dq() {
            let dq = self.sdpa_matmul(ds, kv, [pq, None, pkv])?;
            (dq, None)
        } else {
            let dq_accum = self.sdpa_matmul(ds, kv, [pq, None, pkv])?;
            self.set_name(dq_accum, "sdpa_bwd.dq_accum")?;
            self.mark_output_as(dq_accum, DType::F32)?;
            let dq = self.pointwise(PointwiseMode::Identity, dq_accum, None)?;
            (dq, Some(dq_accum))
        };
        self.set_name(dq, "sdpa_bwd.dq")?;

        self.mark_output_strided(dq, dtype, &dq_strides)?;
        self.mark_output_strided(dk, dtype, &dk_strides)?;
        self.mark_output_strided(dv, dtype, &dv_strides)?;
        Ok(SdpaGrads {
            dq,
            dk,
            dv,
            dbias,
            softmax_sum,
            dq_accum,
        })
    }
}
