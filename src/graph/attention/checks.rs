//! The checks [`Graph::sdpa`] and [`Graph::sdpa_backward`] make before they change the graph.
use super::{DiagonalAlignment, SdpaDropout, SdpaOptions, SdpaSizes, MAX_HEAD_DIM};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{stride_order, strides_in_order, Graph, TensorId};
use crate::tensor::Layout;

/// [`Error::InvalidArgument`] for a setting of `op` that breaks a rule.
fn refusal(op: &'static str, what: &'static str, want: String, got: String) -> Error {
    Error::invalid(what, format!("{op}: {want}"), got)
}

impl Graph {
    /// Checks the causal alignment, the sliding window and ALiBi of `opts` against the problem
    /// (see their [`SdpaOptions`] methods), before the graph is changed.
    pub(super) fn sdpa_masks(
        &self,
        op: &'static str,
        opts: &SdpaOptions,
        sz: &SdpaSizes,
    ) -> Result<()> {
        let padded = opts.padding.is_some();
        let refuse = |what, want, got| Err(refusal(op, what, want, got));
        if let Some(w) = opts.sliding_window {
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
        if (bottom_right || opts.sliding_window.is_some()) && !padded && sz.s_q > sz.s_kv {
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
        Ok(())
    }

    /// Checks the bias of `opts` (and with `backward` its gradient), before the graph is
    /// changed; returns the bias tensor. `transposed` are the operands the graph re-describes
    /// transposed (k, and v for the backward pass), which the bias may not be.
    pub(super) fn sdpa_bias(
        &self,
        op: &'static str,
        opts: &SdpaOptions,
        sz: &SdpaSizes,
        dtype: DType,
        backward: bool,
        transposed: &[usize],
    ) -> Result<Option<TensorId>> {
        let refuse = |what, want, got| Err(refusal(op, what, want, got));
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
    pub(super) fn sdpa_operand(
        &self,
        op: &'static str,
        i: usize,
        dtype: DType,
    ) -> Result<Vec<i64>> {
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
    pub(super) fn sdpa_dims(
        &self,
        a: usize,
        b: usize,
        want: &[i64],
        rule: &'static str,
    ) -> Result<()> {
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
    pub(super) fn sdpa_qkv(
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

    /// The head dimension `d` of tensor `i` is at most 128 and a multiple of 8.
    pub(super) fn sdpa_head_dim(&self, op: &'static str, i: usize) -> Result<()> {
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
    pub(super) fn sdpa_types(&self, op: &'static str) -> Result<()> {
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
    pub(super) fn sdpa_check_unread(&self, op: &'static str, i: usize) -> Result<()> {
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
    pub(super) fn sdpa_distinct(&self, op: &'static str, i: usize, others: &[usize]) -> Result<()> {
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
    pub(super) fn sdpa_transpose_input(&mut self, i: usize) {
        let t = &mut self.tensors[i];
        t.dims.swap(2, 3);
        t.strides.swap(2, 3);
    }

    /// Strides for `dims` packed in the memory order of tensor `like`.
    pub(super) fn sdpa_strides_like(&self, dims: &[i64], like: &[i64]) -> Result<Vec<i64>> {
        strides_in_order(dims, &stride_order(like))
    }

    /// Checks the dropout of `opts` (probability, seed and offset tensors) and the mask's
    /// dimensions `[b, h, s_q, s_kv]`, before the graph is changed.
    pub(super) fn sdpa_dropout(
        &self,
        op: &'static str,
        opts: &SdpaOptions,
        mask_dims: &[i64; 4],
    ) -> Result<Option<SdpaDropout>> {
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
        if opts.dump_dropout_mask {
            Layout::strided(mask_dims, &packed)?;
        }
        Ok(Some(d))
    }

    /// The sequence-length tensors of [`SdpaOptions::padding`], checked: graph inputs of
    /// [`Graph::seq_len_input`] for batch `b` (INT32 `[b, 1, 1, 1]`). Changes nothing.
    pub(super) fn sdpa_padding(
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
    pub(super) fn sdpa_int_input(
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
}
