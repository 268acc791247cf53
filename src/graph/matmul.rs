//! Batched matrix products of a graph.
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, Desc};
use super::{Graph, MatmulOverrides, Op, TensorId};
use crate::error::{Error, Result};

impl Graph {
    /// Batched matrix product (`CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR`): a `[B..., M, K]`
    /// times b `[B..., K, N]` gives c `[B..., M, N]` (row-major, packed). At least 3 dimensions
    /// (use a batch of 1; cuDNN's own matmul engines take rank 3, runtime-fusion engines more).
    ///
    /// Each batch dimension of a and b is equal, or 1 on one of them (broadcast: c has the
    /// larger extent). A broadcast operand is described to cuDNN with c's batch extents and
    /// stride 0 on those dimensions, which every engine reads correctly; its buffer keeps the
    /// tensor's own layout. For that it must be a graph input (not an operation's output) that
    /// no other operation reads: otherwise [`Error::InvalidArgument`] (here for an operation's
    /// output, at [`Graph::build`] / [`Graph::check`] for a second reader).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR")]
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.matmul_with(a, b, false)
    }

    /// [`Graph::matmul`], or with `grouped` a matmul of grouped heads: each batch extent of b
    /// divides a's (equal, or a group of a's heads shares one of b's, as attention's GQA and
    /// MQA read k and v), and c has a's batch extents.
    pub(crate) fn matmul_with(
        &mut self,
        a: TensorId,
        b: TensorId,
        grouped: bool,
    ) -> Result<TensorId> {
        self.matmul_over(a, b, grouped, [None; 3])
    }

    /// [`Graph::matmul_with`] with tensors giving the actual M, N and K of each batch
    /// ([`MatmulOverrides`]; checked by the caller).
    pub(crate) fn matmul_over(
        &mut self,
        a: TensorId,
        b: TensorId,
        grouped: bool,
        [m, n, k]: [Option<TensorId>; 3],
    ) -> Result<TensorId> {
        const OP: &str = "matmul";
        let (ai, bi) = (self.index(a)?, self.index(b)?);
        let (at, bt) = (&self.tensors[ai], &self.tensors[bi]);
        let (ad, bd) = (&at.dims, &bt.dims);
        let r = ad.len();
        if r < 3 || bd.len() != r || at.scalar.is_some() || bt.scalar.is_some() {
            return Err(at.shape_mismatch(
                bt,
                "matmul operands have the same rank, at least 3 ([batch..., rows, columns])",
            ));
        }
        if ad[r - 1] != bd[r - 2] {
            return Err(at.shape_mismatch(bt, "a's column count (K) equals b's row count"));
        }
        let mut dims = Vec::with_capacity(r);
        for i in 0..r - 2 {
            if grouped {
                if ad[i] % bd[i] != 0 {
                    return Err(at.shape_mismatch(
                        bt,
                        "each batch dimension of b divides a's (grouped heads)",
                    ));
                }
                dims.push(ad[i]);
                continue;
            }
            if ad[i] != bd[i] && ad[i] != 1 && bd[i] != 1 {
                return Err(at.shape_mismatch(bt, "each batch dimension of a and b is equal or 1"));
            }
            dims.push(ad[i].max(bd[i]));
        }
        for t in [at, bt].into_iter().filter(|_| !grouped) {
            let broadcast = (0..r - 2).any(|i| t.dims[i] != dims[i]);
            if broadcast && t.producer.is_some() {
                return Err(Error::invalid(
                    "matmul operand",
                    "an operand broadcast along a batch dimension is a graph input",
                    format!("`{}` {:?} is an operation's output", t.name, t.dims),
                ));
            }
        }
        dims.push(ad[r - 2]);
        dims.push(bd[r - 1]);
        let order: Vec<usize> = (0..r).collect();
        let ai = self.operand(a, None, OP)?;
        let bi = self.operand(b, None, OP)?;
        let mut over = |t: Option<TensorId>| t.map(|t| self.operand(t, None, OP)).transpose();
        let over = MatmulOverrides {
            m: over(m)?,
            n: over(n)?,
            k: over(k)?,
        };
        let c = self.output("matmul.c", dims, &order, self.ops.len())?;
        self.ops.push(Op::Matmul {
            a: ai,
            b: bi,
            c: c.index,
            grouped,
            over,
        });
        Ok(c)
    }
}

/// The operation descriptor of a matmul `c = a · b` (`abc`) with its M, N, K overrides, and the
/// matmul descriptor it refers to.
pub(super) fn matmul_desc(
    lib: &'static Library,
    [a, b, c]: [usize; 3],
    over: &MatmulOverrides,
    comp: sys::cudnnDataType_t,
    t: &[Desc],
) -> Result<(Desc, Option<Desc>)> {
    let mut m = Desc::new(lib, kind!(CUDNN_BACKEND_MATMUL_DESCRIPTOR))?;
    m.set1(attr!(CUDNN_ATTR_MATMUL_COMP_TYPE), comp)?;
    m.finalize()?;
    let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR))?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_MATMUL_ADESC), &[&t[a]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_MATMUL_BDESC), &[&t[b]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_MATMUL_CDESC), &[&t[c]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_MATMUL_DESC), &[&m])?;
    for (a, i) in [
        (
            attr!(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC),
            over.m,
        ),
        (
            attr!(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC),
            over.n,
        ),
        (
            attr!(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC),
            over.k,
        ),
    ] {
        if let Some(i) = i {
            o.set_descs(a, &[&t[i]])?;
        }
    }
    o.finalize()?;
    Ok((o, Some(m)))
}
