//! The operations a [`Graph`](super::Graph) holds, by tensor index.
use super::{norm, rng, ConvParams, PointwiseMode};
use crate::reduce::ReduceOp;

/// Tensors (indices into `Graph::tensors`) whose values give a matmul's actual M, N or K per
/// batch (`CUDNN_ATTR_OPERATION_MATMUL_GEMM_{M,N,K}_OVERRIDE_DESC`; INT32 `[b, 1, 1, 1]`,
/// attention's sequence lengths): cuDNN computes only that part of each product.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct MatmulOverrides {
    pub(crate) m: Option<usize>,
    pub(crate) n: Option<usize>,
    pub(crate) k: Option<usize>,
}

impl MatmulOverrides {
    pub(crate) fn tensors(&self) -> impl Iterator<Item = usize> {
        [self.m, self.n, self.k].into_iter().flatten()
    }
}

/// One operation of a graph (tensor indices into `Graph::tensors`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) enum Op {
    ConvFprop {
        x: usize,
        w: usize,
        y: usize,
        conv: ConvParams,
    },
    ConvDgrad {
        dy: usize,
        w: usize,
        dx: usize,
        conv: ConvParams,
    },
    ConvWgrad {
        x: usize,
        dy: usize,
        dw: usize,
        conv: ConvParams,
    },
    Matmul {
        a: usize,
        b: usize,
        c: usize,
        /// Grouped heads (attention's GQA/MQA): b's batch extents divide a's and c has a's;
        /// described to cuDNN as is, without broadcast views.
        #[serde(default)]
        grouped: bool,
        /// Tensors holding the actual M, N or K of each batch (attention's sequence lengths).
        #[serde(default)]
        over: MatmulOverrides,
    },
    Pointwise {
        mode: PointwiseMode,
        x: usize,
        b: Option<usize>,
        y: usize,
    },
    PointwiseBwd {
        mode: PointwiseMode,
        dy: usize,
        x: usize,
        dx: usize,
    },
    Reduction {
        op: ReduceOp,
        x: usize,
        y: usize,
    },
    /// `y = cond ? x : b` (`CUDNN_POINTWISE_BINARY_SELECT`, cond through `..._POINTWISE_TDESC`).
    Select {
        x: usize,
        b: usize,
        cond: usize,
        y: usize,
    },
    /// `y` is x with its last two dimensions swapped (`CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR`).
    Transpose {
        x: usize,
        y: usize,
    },
    /// Bernoulli random mask (`CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR`, `attention.rs`).
    Rng(rng::RngOp),
    /// Layer, RMS, instance or batch norm forward (`norm.rs`).
    NormFwd(norm::NormFwdOp),
    /// Layer, RMS, instance or batch norm backward (`norm.rs`).
    NormBwd(norm::NormBwdOp),
}

impl Op {
    /// The tensors the operation reads (with repetition if it reads one twice).
    pub(crate) fn reads(&self) -> Vec<usize> {
        match *self {
            Op::ConvFprop { x, w, .. } => vec![x, w],
            Op::ConvDgrad { dy, w, .. } => vec![dy, w],
            Op::ConvWgrad { x, dy, .. } => vec![x, dy],
            Op::Matmul { a, b, over, .. } => [a, b].into_iter().chain(over.tensors()).collect(),
            Op::Pointwise { x, b, .. } => std::iter::once(x).chain(b).collect(),
            Op::PointwiseBwd { dy, x, .. } => vec![dy, x],
            Op::Reduction { x, .. } => vec![x],
            Op::Select { x, b, cond, .. } => vec![x, b, cond],
            Op::Transpose { x, .. } => vec![x],
            Op::Rng(ref r) => r.reads(),
            Op::NormFwd(ref n) => n.reads(),
            Op::NormBwd(ref n) => n.reads(),
        }
    }

    /// A convolution's (x, w, y) — (dx, w, dy) for backward data, (x, dw, dy) for backward
    /// filter — and its parameters; `None` for other operations.
    pub(crate) fn conv_operands(&self) -> Option<([usize; 3], &ConvParams)> {
        match self {
            Op::ConvFprop { x, w, y, conv } => Some(([*x, *w, *y], conv)),
            Op::ConvDgrad { dy, w, dx, conv } => Some(([*dx, *w, *dy], conv)),
            Op::ConvWgrad { x, dy, dw, conv } => Some(([*x, *dw, *dy], conv)),
            _ => None,
        }
    }

    /// The tensors the operation writes.
    pub(crate) fn writes(&self) -> Vec<usize> {
        match *self {
            Op::ConvFprop { y, .. } => vec![y],
            Op::ConvDgrad { dx, .. } => vec![dx],
            Op::ConvWgrad { dw, .. } => vec![dw],
            Op::Matmul { c, .. } => vec![c],
            Op::Pointwise { y, .. } | Op::Select { y, .. } | Op::Transpose { y, .. } => vec![y],
            Op::PointwiseBwd { dx, .. } => vec![dx],
            Op::Reduction { y, .. } => vec![y],
            Op::Rng(ref r) => r.writes(),
            Op::NormFwd(ref n) => n.writes(),
            Op::NormBwd(ref n) => n.writes(),
        }
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::ConvFprop { .. } => "convolution forward",
            Op::ConvDgrad { .. } => "convolution backward data",
            Op::ConvWgrad { .. } => "convolution backward filter",
            Op::Matmul { .. } => "matmul",
            Op::Pointwise { .. } => "pointwise",
            Op::PointwiseBwd { .. } => "pointwise backward",
            Op::Reduction { .. } => "reduction",
            Op::Select { .. } => "binary select",
            Op::Transpose { .. } => "transpose",
            Op::Rng(r) => r.name(),
            Op::NormFwd(n) => n.name(),
            Op::NormBwd(n) => n.name(),
        }
    }
}
