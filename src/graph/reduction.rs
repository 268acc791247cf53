//! Reductions of a graph.
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, Desc};
#[cfg(doc)]
use super::OperationGraph;
use super::{stride_order, Graph, Op, TensorId};
use crate::error::{Error, Result};
use crate::reduce::ReduceOp;

impl Graph {
    /// A reduction (`CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR`) of x to `out_dims` (same
    /// rank; each dimension equal to x's or 1 — the dimensions of extent 1 are reduced). Laid out
    /// in x's memory order.
    ///
    /// Engines: cuDNN 9 runs reductions fused at the end of a convolution or matmul graph
    /// (e.g. NVIDIA's `matmul → gelu backward → bias-gradient reduction` pattern, the reduction's
    /// output in f32). With cuDNN 9.14, standalone f32 NCHW reduction graphs got no
    /// engine configuration from the heuristics ([`OperationGraph::plans`] then returns a typed
    /// error).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR")]
    pub fn reduction(&mut self, op: ReduceOp, x: TensorId, out_dims: &[i64]) -> Result<TensorId> {
        self.reduction_with(op, x, out_dims, false)
    }

    /// [`Graph::reduction`], or with `grouped` a reduction over groups of consecutive indices:
    /// each output dimension divides x's (a group of attention heads summed into one head, as
    /// the GQA backward pass reduces dK and dV).
    pub(crate) fn reduction_with(
        &mut self,
        op: ReduceOp,
        x: TensorId,
        out_dims: &[i64],
        grouped: bool,
    ) -> Result<TensorId> {
        const OP: &str = "reduction";
        let xi = self.index(x)?;
        let xt = &self.tensors[xi];
        let ok = xt.scalar.is_none()
            && out_dims.len() == xt.dims.len()
            && out_dims
                .iter()
                .zip(&xt.dims)
                .all(|(&o, &i)| o == i || o == 1 || (grouped && o > 0 && i % o == 0));
        if !ok {
            return Err(Error::ShapeMismatch {
                a: xt.name,
                a_dims: xt.dims.clone(),
                b: "reduction output",
                b_dims: out_dims.to_vec(),
                rule: if grouped {
                    "the output has x's rank and each dimension dividing x's"
                } else {
                    "the output has x's rank and each dimension equal to x's or 1"
                },
            });
        }
        let order = stride_order(&xt.strides);
        let xi = self.operand(x, None, OP)?;
        let y = self.output("reduction.y", out_dims.to_vec(), &order, self.ops.len())?;
        self.ops.push(Op::Reduction {
            op,
            x: xi,
            y: y.index,
        });
        Ok(y)
    }
}

pub(super) fn reduce_op(op: ReduceOp) -> sys::cudnnReduceTensorOp_t {
    use sys::cudnnReduceTensorOp_t as R;
    match op {
        ReduceOp::Add => R::CUDNN_REDUCE_TENSOR_ADD,
        ReduceOp::Mul => R::CUDNN_REDUCE_TENSOR_MUL,
        ReduceOp::Min => R::CUDNN_REDUCE_TENSOR_MIN,
        ReduceOp::Max => R::CUDNN_REDUCE_TENSOR_MAX,
        ReduceOp::AMax => R::CUDNN_REDUCE_TENSOR_AMAX,
        ReduceOp::Avg => R::CUDNN_REDUCE_TENSOR_AVG,
        ReduceOp::Norm1 => R::CUDNN_REDUCE_TENSOR_NORM1,
        ReduceOp::Norm2 => R::CUDNN_REDUCE_TENSOR_NORM2,
        _ => R::CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS,
    }
}

/// The operation descriptor of a reduction of `x` into `y` and the reduction descriptor it
/// refers to.
pub(super) fn reduction_desc(
    lib: &'static Library,
    op: ReduceOp,
    x: usize,
    y: usize,
    comp: sys::cudnnDataType_t,
    t: &[Desc],
) -> Result<(Desc, Option<Desc>)> {
    let mut r = Desc::new(lib, kind!(CUDNN_BACKEND_REDUCTION_DESCRIPTOR))?;
    r.set1(attr!(CUDNN_ATTR_REDUCTION_COMP_TYPE), comp)?;
    r.set1(attr!(CUDNN_ATTR_REDUCTION_OPERATOR), reduce_op(op))?;
    r.finalize()?;
    let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR))?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_REDUCTION_XDESC), &[&t[x]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_REDUCTION_YDESC), &[&t[y]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_REDUCTION_DESC), &[&r])?;
    o.finalize()?;
    Ok((o, Some(r)))
}
