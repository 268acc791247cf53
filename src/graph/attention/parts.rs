//! The pieces of the attention patterns: score masks, ALiBi, the dropout mask, grouped-head
//! matmuls and reductions, and attention's graph inputs.
use super::{DiagonalAlignment, SdpaDropout, SdpaOptions, SdpaSizes};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::rng::RngOp;
#[cfg(doc)]
use crate::graph::{alibi_slopes, Args};
use crate::graph::{strides_in_order, Graph, Op, PointwiseMode, TensorId, TensorInfo};
use crate::reduce::ReduceOp;

impl Graph {
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
    pub(super) fn diagonal_masks(
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
        if let Some(w) = opts.sliding_window {
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
    pub(super) fn alibi(&mut self, s: TensorId, slopes: TensorId) -> Result<TensorId> {
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
    /// [`Args::input`]. `heads` is q's number of heads, at least 1.
    #[doc(alias = "alibi_mask")]
    pub fn alibi_slopes_input(&mut self, name: &'static str, heads: i64) -> Result<TensorId> {
        if heads < 1 {
            return Err(Error::invalid(
                "ALiBi slopes input",
                "at least 1 head",
                format!("`{name}` with {heads} heads"),
            ));
        }
        Ok(self.push(TensorInfo::input(
            name,
            vec![1, heads, 1, 1],
            vec![heads, 1, 1, 1],
            DType::F32,
        )))
    }

    /// A by-value INT32 scalar (a sequence extent or a window in index arithmetic).
    pub(super) fn int_scalar(&mut self, name: &'static str, value: i64) -> TensorId {
        self.push(TensorInfo::scalar(name, value as f64, DType::I32))
    }

    /// A matmul of attention: grouped ([`Graph::matmul_with`]) when b (k or v, or a view of
    /// them) has fewer heads than a, plain otherwise (the same graph as before grouped heads
    /// existed, so plans and cache keys of multi-head graphs stay as they were).
    ///
    /// `over` are the tensors giving the actual M, N and K of each batch entry (the padding
    /// mask's sequence lengths), if any.
    pub(super) fn sdpa_matmul(
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
    pub(super) fn sdpa_head_sum(
        &mut self,
        t: TensorId,
        heads: i64,
        dtype: DType,
    ) -> Result<TensorId> {
        let mut dims = self.tensors[t.index].dims.clone();
        if dims[1] == heads {
            return Ok(t);
        }
        self.tensors[t.index].dtype = dtype;
        dims[1] = heads;
        self.reduction_with(ReduceOp::Add, t, &dims, true)
    }

    /// The dropout mask `[b, h, s_q, s_kv]` (packed row-major, as cudnn-frontend sets it): a
    /// Bernoulli draw with probability `1 − p` from the seed and offset.
    pub(super) fn sdpa_rng(
        &mut self,
        op: &'static str,
        d: &SdpaDropout,
        dims: [i64; 4],
    ) -> Result<TensorId> {
        let seed = self.operand(d.seed, None, op)?;
        let offset = self.operand(d.offset, None, op)?;
        let strides = strides_in_order(&dims, &[0, 1, 2, 3])?;
        let y = self.push(TensorInfo::written(
            "sdpa.dropout_mask",
            dims.to_vec(),
            strides,
            self.intermediate,
            self.ops.len(),
        ));
        self.ops.push(Op::Rng(RngOp {
            seed,
            offset,
            y: y.index,
            probability: 1.0 - d.probability,
        }));
        Ok(y)
    }

    /// Records that `t`'s values bound extents of at most `bound` (the smallest bound when
    /// several attention graphs read it).
    pub(super) fn set_bound(&mut self, t: TensorId, bound: i64) {
        let info = &mut self.tensors[t.index];
        info.bound = Some(info.bound.map_or(bound, |b| b.min(bound)));
    }

    /// The padding mask on scores `s` `[b, h, s_q, s_kv]`: `−∞` where row `i ≥ seq_len_q[n]`
    /// or column `j ≥ seq_len_kv[n]` (cudnn-frontend's `padding_mask` score modifier:
    /// row and column indices, two `<` comparisons, a logical and, a binary select).
    pub(super) fn padding_mask(
        &mut self,
        s: TensorId,
        sq: TensorId,
        skv: TensorId,
    ) -> Result<TensorId> {
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

    /// A graph input holding one 32-bit sequence length per batch entry (`CUDNN_DATA_INT32`,
    /// dimensions `[batch, 1, 1, 1]`, packed): `seq_len_q` or `seq_len_kv` of an attention
    /// padding mask ([`SdpaOptions::padding`]), bound with
    /// [`Args::lengths`]. `batch` is at least 1.
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

    /// Records the bounds of the padding lengths (`s_q`, `s_kv`); returns them as the M, N or K
    /// overrides of the matmuls (`None` without padding).
    pub(super) fn sdpa_bind_padding(
        &mut self,
        padding: Option<(TensorId, TensorId)>,
        s_q: i64,
        s_kv: i64,
    ) -> (Option<TensorId>, Option<TensorId>) {
        if let Some((sq, skv)) = padding {
            self.set_bound(sq, s_q);
            self.set_bound(skv, s_kv);
        }
        (padding.map(|p| p.0), padding.map(|p| p.1))
    }

    /// The scores both passes start from: `S = matmul(Q, Kᵀ) · scale`, plus the bias, ALiBi and
    /// the padding mask when set (k already re-described as Kᵀ). Returns S and the scale scalar.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sdpa_scores(
        &mut self,
        q: TensorId,
        k: TensorId,
        scale: f64,
        bias: Option<TensorId>,
        opts: &SdpaOptions,
        padding: Option<(TensorId, TensorId)>,
        names: &ScoreNames,
    ) -> Result<(TensorId, TensorId)> {
        let (pq, pkv) = (padding.map(|p| p.0), padding.map(|p| p.1));
        let s = self.sdpa_matmul(q, k, [pq, pkv, None])?;
        self.set_name(s, names.scores)?;
        let sc = self.scalar(names.scale, scale, DType::F32)?;
        let mut s = self.pointwise(PointwiseMode::Mul, s, Some(sc))?;
        if let Some(name) = names.scaled {
            self.set_name(s, name)?;
        }
        if let Some(bias) = bias {
            s = self.pointwise(PointwiseMode::Add, s, Some(bias))?;
            self.set_name(s, names.biased)?;
        }
        if let Some(slopes) = opts.alibi {
            s = self.alibi(s, slopes)?;
        }
        if let Some((sq, skv)) = padding {
            s = self.padding_mask(s, sq, skv)?;
        }
        Ok((s, sc))
    }
}

/// The names one pass gives the tensors of [`Graph::sdpa_scores`] (they appear in errors and
/// graph records).
pub(super) struct ScoreNames {
    pub(super) scores: &'static str,
    pub(super) scale: &'static str,
    pub(super) scaled: Option<&'static str>,
    pub(super) biased: &'static str,
}
