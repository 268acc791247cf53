//! Reductions of a graph.
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
