//! Scaled dot-product attention backward ([`Graph::sdpa_backward`]).
use super::parts::ScoreNames;
use super::{sdpa_scale, SdpaDropout, SdpaGrads, SdpaOptions, SdpaSizes};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{strides_in_order, Graph, PointwiseMode, TensorId};
use crate::reduce::ReduceOp;

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
        let (qi, ki, vi) = (self.index(q)?, self.index(k)?, self.index(v)?);
        let (oi, doi, si) = (self.index(o)?, self.index(d_o)?, self.index(stats)?);
        let c = self.sdpa_backward_checks([qi, ki, vi, oi, doi, si], opts)?;
        let SdpaSizes {
            b, h, s_q, s_kv, ..
        } = c.sz;
        let (pq, pkv) = self.sdpa_bind_padding(c.padding, s_q, s_kv);
        self.sdpa_transpose_input(ki);
        self.sdpa_transpose_input(vi);
        // The same mask as the forward pass (same seed, offset and shape), drawn first as
        // cudnn-frontend's backward node does.
        let mask = match c.dropout {
            Some(dr) => Some(self.sdpa_rng(OP, &dr, [b, h, s_q, s_kv])?),
            None => None,
        };
        let softmax_sum = self.sdpa_softmax_sum(d_o, o, [b, h, s_q, 1], c.dropout)?;

        // Recompute the probabilities from the statistics.
        let names = ScoreNames {
            scores: "sdpa_bwd.scores",
            scale: "sdpa_bwd.attn_scale",
            scaled: None,
            biased: "sdpa_bwd.biased_scores",
        };
        let (s, sc) = self.sdpa_scores(q, k, c.scale, c.bias, opts, c.padding, &names)?;
        let s = self.pointwise(PointwiseMode::Sub, s, Some(stats))?;
        let s = self.diagonal_masks(s, opts, c.padding, &c.sz)?;
        let e = self.pointwise(PointwiseMode::Exp, s, None)?;
        self.set_name(e, "sdpa_bwd.probabilities")?;

        // With dropout: P ⊙ mask / (1 − p), the probabilities the forward's second matmul read.
        let dropout_scale = match c.dropout {
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
        self.tensors[pt.index].dtype = c.dtype;
        let dv = self.sdpa_matmul(pt, d_o, [pkv, None, pq])?;
        let dv = self.sdpa_head_sum(dv, c.sz.h_v, c.dtype)?;
        self.set_name(dv, "sdpa_bwd.dv")?;

        let dropout = mask.zip(dropout_scale);
        let (ds, dbias) =
            self.sdpa_ds(d_o, v, [e, softmax_sum, sc], dropout, &c, opts, [pq, pkv])?;

        // dK = dSᵀ·Q
        let dst = self.transpose(ds)?;
        self.tensors[dst.index].dtype = c.dtype;
        let dk = self.sdpa_matmul(dst, q, [pkv, None, pq])?;
        let dk = self.sdpa_head_sum(dk, c.sz.h_k, c.dtype)?;
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

        self.mark_output_strided(dq, c.dtype, &c.dq_strides)?;
        self.mark_output_strided(dk, c.dtype, &c.dk_strides)?;
        self.mark_output_strided(dv, c.dtype, &c.dv_strides)?;
        Ok(SdpaGrads {
            dq,
            dk,
            dv,
            dbias,
            softmax_sum,
            dq_accum,
        })
    }

    /// The checks [`Graph::sdpa_backward`] makes before it changes the graph, on q, k, v, o,
    /// dO and stats (tensor indices).
    fn sdpa_backward_checks(
        &self,
        [qi, ki, vi, oi, doi, si]: [usize; 6],
        opts: &SdpaOptions,
    ) -> Result<BackwardChecked> {
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
        self.sdpa_masks(OP, opts, &sz)?;
        let bias = self.sdpa_bias(OP, opts, &sz, dtype, true, &[ki, vi])?;
        let like = |i: usize, dims: &[i64]| self.sdpa_strides_like(dims, &self.tensors[i].strides);
        Ok(BackwardChecked {
            dtype,
            sz,
            scale,
            dropout,
            padding,
            bias,
            dq_strides: like(qi, &[b, h, s_q, d])?,
            dk_strides: like(ki, &[b, h_k, s_kv, d])?,
            dv_strides: like(vi, &[b, h_v, s_kv, d_v])?,
        })
    }

    /// `softmax_sum = Σ_d dO·O` per row, times the inverse dropout scale `1 − p` (1 without
    /// dropout): f32 `[b, h, s_q, 1]` packed, marked as an output (scratch).
    fn sdpa_softmax_sum(
        &mut self,
        d_o: TensorId,
        o: TensorId,
        row: [i64; 4],
        dropout: Option<SdpaDropout>,
    ) -> Result<TensorId> {
        let dot = self.pointwise(PointwiseMode::Mul, d_o, Some(o))?;
        let rs = self.reduction(ReduceOp::Add, dot, &row)?;
        // Packed [b, h, s_q, 1], as cudnn-frontend sets both (not dO's memory order).
        let row_strides = [row[1] * row[2], row[2], 1, 1];
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
        Ok(softmax_sum)
    }

    /// `dS = (dO·Vᵀ − softmax_sum) · P · scale`; with dropout (`(mask, 1 / (1 − p))`)
    /// `dS = (dO·Vᵀ ⊙ mask − softmax_sum) · P / (1 − p) · scale`; with
    /// [`SdpaOptions::bias_grad`] also dBias. `[e, softmax_sum, sc]` are the recomputed
    /// probabilities, the row sums and the scale scalar; `[pq, pkv]` the padding lengths.
    #[allow(clippy::too_many_arguments)]
    fn sdpa_ds(
        &mut self,
        d_o: TensorId,
        v: TensorId,
        [e, softmax_sum, sc]: [TensorId; 3],
        dropout: Option<(TensorId, TensorId)>,
        c: &BackwardChecked,
        opts: &SdpaOptions,
        [pq, pkv]: [Option<TensorId>; 2],
    ) -> Result<(TensorId, Option<TensorId>)> {
        let mut dp = self.sdpa_matmul(d_o, v, [pq, pkv, None])?;
        self.set_name(dp, "sdpa_bwd.dp")?;
        if let Some((mask, _)) = dropout {
            dp = self.pointwise(PointwiseMode::Mul, dp, Some(mask))?;
            self.set_name(dp, "sdpa_bwd.dp_dropout")?;
        }
        let t = self.pointwise(PointwiseMode::Sub, dp, Some(softmax_sum))?;
        let mut t = self.pointwise(PointwiseMode::Mul, t, Some(e))?;
        if let Some((_, dsc)) = dropout {
            t = self.pointwise(PointwiseMode::Mul, t, Some(dsc))?;
        }
        // dBias: the gradient of the biased scores, summed over the batch (cudnn-frontend's
        // "red_dP_dBias", before the scale).
        let dbias = match c.bias {
            Some(bias) if opts.bias_grad => {
                let dims = self.tensors[bias.index].dims.clone();
                let db = self.reduction(ReduceOp::Add, t, &dims)?;
                self.set_name(db, "sdpa_bwd.dbias")?;
                let packed = strides_in_order(&dims, &[0, 1, 2, 3])?;
                self.mark_output_strided(db, c.dtype, &packed)?;
                Some(db)
            }
            _ => None,
        };
        let ds = self.pointwise(PointwiseMode::Mul, t, Some(sc))?;
        self.set_name(ds, "sdpa_bwd.ds")?;
        Ok((ds, dbias))
    }
}

/// The operation name in [`Graph::sdpa_backward`]'s errors.
const OP: &str = "scaled dot-product attention backward";

/// What [`Graph::sdpa_backward`]'s checks found, before the graph changes.
struct BackwardChecked {
    dtype: DType,
    sz: SdpaSizes,
    scale: f64,
    dropout: Option<SdpaDropout>,
    padding: Option<(TensorId, TensorId)>,
    bias: Option<TensorId>,
    dq_strides: Vec<i64>,
    dk_strides: Vec<i64>,
    dv_strides: Vec<i64>,
}
