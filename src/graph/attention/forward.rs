//! Scaled dot-product attention forward ([`Graph::sdpa`]).
use super::parts::ScoreNames;
use super::{sdpa_scale, SdpaDropout, SdpaOptions, SdpaOutputs, SdpaSizes};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, PointwiseMode, TensorId};
use crate::reduce::ReduceOp;
use crate::tensor::Layout;

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
    /// let plan = og.plan(&cudnn, &PlanFilter::default())?;
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
        let (qi, ki, vi) = (self.index(q)?, self.index(k)?, self.index(v)?);
        let c = self.sdpa_forward_checks([qi, ki, vi], opts)?;
        let SdpaSizes {
            b, h, s_q, s_kv, ..
        } = c.sz;
        let (pq, pkv) = self.sdpa_bind_padding(c.padding, s_q, s_kv);
        self.sdpa_transpose_input(ki);
        let names = ScoreNames {
            scores: "sdpa.scores",
            scale: "sdpa.attn_scale",
            scaled: Some("sdpa.scaled_scores"),
            biased: "sdpa.biased_scores",
        };
        let (s, _) = self.sdpa_scores(q, k, c.scale, c.bias, opts, c.padding, &names)?;
        let s = self.diagonal_masks(s, opts, c.padding, &c.sz)?;
        let (e, l, stats) = self.sdpa_softmax(s, [b, h, s_q, 1], opts.training)?;
        let mut p = self.pointwise(PointwiseMode::Div, e, Some(l))?;
        self.set_name(p, "sdpa.probabilities")?;
        let mut dropout_mask = None;
        if let Some(dr) = c.dropout {
            let mask;
            (p, mask) = self.sdpa_forward_dropout(p, &dr, [b, h, s_q, s_kv])?;
            if opts.dump_dropout_mask {
                self.mark_output_as(mask, DType::F32)?;
                dropout_mask = Some(mask);
            }
        }
        // cudnn-frontend: "Requirement by cudnn backend to take in bmm2 aType as i/o type."
        self.tensors[p.index].dtype = c.dtype;
        let o = self.sdpa_matmul(p, v, [pq, None, pkv])?;
        self.set_name(o, "sdpa.o")?;
        self.mark_output_strided(o, c.dtype, &c.o_strides)?;
        Ok(SdpaOutputs {
            o,
            stats,
            dropout_mask,
        })
    }

    /// The checks [`Graph::sdpa`] makes before it changes the graph.
    fn sdpa_forward_checks(
        &self,
        [qi, ki, vi]: [usize; 3],
        opts: &SdpaOptions,
    ) -> Result<ForwardChecked> {
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
        self.sdpa_masks(OP, opts, &sz)?;
        let bias = self.sdpa_bias(OP, opts, &sz, dtype, false, &[ki])?;
        match &dropout {
            None if opts.dump_dropout_mask => {
                return Err(Error::invalid(
                    "attention dropout mask output",
                    format!("{OP}: dump_dropout_mask together with dropout"),
                    "no dropout set",
                ))
            }
            // At keep-probability 1 the fused kernels skip the draw and leave the dump
            // unwritten (seen on an H200 with cuDNN 9.14 as NaN poison): refused rather than a
            // silent hole (the mask is all ones by definition).
            Some(d) if opts.dump_dropout_mask && d.probability == 0.0 => {
                return Err(Error::invalid(
                    "attention dropout mask output",
                    format!("{OP}: dump_dropout_mask with a dropout probability above 0"),
                    "probability 0 (the mask is all ones)",
                ))
            }
            _ => {}
        }
        Ok(ForwardChecked {
            dtype,
            sz,
            scale,
            padding,
            o_strides,
            dropout,
            bias,
        })
    }

    /// The softmax of scores `s` over rows `row` (`[b, h, s_q, 1]`): `E = exp(S − max)`, the
    /// row sums `l`, and the statistics `max + ln l`, marked as an f32 output in `training`.
    fn sdpa_softmax(
        &mut self,
        s: TensorId,
        row: [i64; 4],
        training: bool,
    ) -> Result<(TensorId, TensorId, Option<TensorId>)> {
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
        let stats = if training {
            self.mark_output_as(st, DType::F32)?;
            Some(st)
        } else {
            // A virtual result nothing reads: allowed here, as cudnn-frontend leaves it.
            self.tensors[st.index].consumed = true;
            None
        };
        Ok((e, l, stats))
    }

    /// Dropout on the probabilities `p` (cudnn-frontend: rng (Bernoulli 1 − p),
    /// "dropout_mask_mul", then "dropout_scale", a by-value f32 1/(1 − p)): the dropped
    /// probabilities and the mask.
    fn sdpa_forward_dropout(
        &mut self,
        p: TensorId,
        dr: &SdpaDropout,
        dims: [i64; 4],
    ) -> Result<(TensorId, TensorId)> {
        let mask = self.sdpa_rng(OP, dr, dims)?;
        let kept = self.pointwise(PointwiseMode::Mul, p, Some(mask))?;
        self.set_name(kept, "sdpa.dropped_probabilities")?;
        let ds = self.scalar(
            "sdpa.dropout_scale",
            1.0 / (1.0 - dr.probability),
            DType::F32,
        )?;
        let p = self.pointwise(PointwiseMode::Mul, kept, Some(ds))?;
        self.set_name(p, "sdpa.dropout_probabilities")?;
        Ok((p, mask))
    }
}

/// The operation name in [`Graph::sdpa`]'s errors.
const OP: &str = "scaled dot-product attention";

/// What [`Graph::sdpa`]'s checks found, before the graph changes.
struct ForwardChecked {
    dtype: DType,
    sz: SdpaSizes,
    scale: f64,
    padding: Option<(TensorId, TensorId)>,
    o_strides: Vec<i64>,
    dropout: Option<SdpaDropout>,
    bias: Option<TensorId>,
}
