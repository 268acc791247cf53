//! Pointwise operations of a graph: [`PointwiseMode`], forward and backward.
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{self, attr, kind, Desc};
#[cfg(doc)]
use super::OperationGraph;
use super::{stride_order, strides_in_order, Graph, Op, TensorId};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A pointwise operation mode (`cudnnPointwiseMode_t`), with its parameters where it has some.
///
/// Unary modes read `x`; binary modes read `x` and `b` (broadcast: each dimension of one equal to
/// the other's or 1); backward modes ([`Graph::pointwise_bwd`]) read the gradient `dy` and the
/// forward input `x` and give `dx`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum PointwiseMode {
    /// `x + b`.
    Add,
    /// `x − b`.
    Sub,
    /// `x · b`.
    Mul,
    /// `x / b`.
    Div,
    /// `min(x, b)`.
    Min,
    /// `max(x, b)`.
    Max,
    /// `x ^ b`.
    Pow,
    /// `max(x, 0)`.
    Relu,
    /// `x` for `x > 0`, `slope · x` otherwise. [`Graph::pointwise`] refuses a slope other than
    /// 0: with cuDNN 9.14 a matmul epilogue with
    /// `CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE` = 0.1 returned 0 for negative inputs, i.e.
    /// the engine ignored the slope, and a safe graph must not compute something else silently.
    LeakyRelu {
        /// Slope below zero.
        slope: f64,
    },
    /// `x·Φ(x)` (exact, erf-based).
    Gelu,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh,
    /// `1 / (1 + e^−x)`.
    Sigmoid,
    /// `tanh(x)`.
    Tanh,
    /// `x · sigmoid(beta · x)` (SiLU for `beta = 1`).
    Swish {
        /// The slope inside the sigmoid.
        beta: f64,
    },
    /// `x` for `x > 0`, `alpha · (e^x − 1)` otherwise.
    Elu {
        /// Scale of the negative branch.
        alpha: f64,
    },
    /// `log(1 + e^(beta·x)) / beta`.
    Softplus {
        /// Sharpness.
        beta: f64,
    },
    /// `e^x`.
    Exp,
    /// `ln x`.
    Log,
    /// `√x`.
    Sqrt,
    /// `1 / √x`.
    Rsqrt,
    /// `−x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `1 / x`.
    Reciprocal,
    /// `erf(x)`.
    Erf,
    /// `x` (a copy, possibly converting data type or layout).
    Identity,
    /// Backward of [`PointwiseMode::Relu`]: `dy` where `x > 0`, else 0.
    ReluBwd,
    /// Backward of [`PointwiseMode::Gelu`].
    GeluBwd,
    /// Backward of [`PointwiseMode::GeluTanh`].
    GeluTanhBwd,
    /// Backward of [`PointwiseMode::Sigmoid`].
    SigmoidBwd,
    /// Backward of [`PointwiseMode::Tanh`].
    TanhBwd,
    /// Backward of [`PointwiseMode::Swish`].
    SwishBwd {
        /// The forward `beta`.
        beta: f64,
    },
    /// Backward of [`PointwiseMode::Elu`].
    EluBwd {
        /// The forward `alpha`.
        alpha: f64,
    },
    /// Backward of [`PointwiseMode::Softplus`].
    SoftplusBwd {
        /// The forward `beta`.
        beta: f64,
    },
    /// The index of each element along `axis` (`CUDNN_POINTWISE_GEN_INDEX`): x gives only the
    /// shape. The output is a virtual 32-bit integer tensor (as cudnn-frontend declares it),
    /// read by comparisons; it cannot be marked as an output.
    GenIndex {
        /// The axis whose index is generated (0 ≤ axis < rank).
        axis: i64,
    },
    /// `x == b` (`CUDNN_POINTWISE_CMP_EQ`). Comparison results are virtual boolean tensors,
    /// read as the condition of [`Graph::select`]; they cannot be marked as outputs.
    CmpEq,
    /// `x != b` (`CUDNN_POINTWISE_CMP_NEQ`), boolean as [`PointwiseMode::CmpEq`].
    CmpNeq,
    /// `x > b` (`CUDNN_POINTWISE_CMP_GT`), boolean as [`PointwiseMode::CmpEq`].
    CmpGt,
    /// `x >= b` (`CUDNN_POINTWISE_CMP_GE`), boolean as [`PointwiseMode::CmpEq`].
    CmpGe,
    /// `x < b` (`CUDNN_POINTWISE_CMP_LT`), boolean as [`PointwiseMode::CmpEq`].
    CmpLt,
    /// `x <= b` (`CUDNN_POINTWISE_CMP_LE`), boolean as [`PointwiseMode::CmpEq`].
    CmpLe,
    /// `x && b` of two boolean tensors (`CUDNN_POINTWISE_LOGICAL_AND`, e.g. two comparisons
    /// combined into one mask); boolean as [`PointwiseMode::CmpEq`].
    LogicalAnd,
}

/// How many tensors a pointwise mode reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arity {
    Unary,
    Binary,
    Backward,
}

impl PointwiseMode {
    pub(crate) fn arity(self) -> Arity {
        use PointwiseMode as P;
        match self {
            P::Add | P::Sub | P::Mul | P::Div | P::Min | P::Max | P::Pow => Arity::Binary,
            P::CmpEq | P::CmpNeq | P::CmpGt | P::CmpGe | P::CmpLt | P::CmpLe | P::LogicalAnd => {
                Arity::Binary
            }
            P::ReluBwd
            | P::GeluBwd
            | P::GeluTanhBwd
            | P::SigmoidBwd
            | P::TanhBwd
            | P::SwishBwd { .. }
            | P::EluBwd { .. }
            | P::SoftplusBwd { .. } => Arity::Backward,
            _ => Arity::Unary,
        }
    }

    /// Whether this is a backward (gradient) mode.
    pub fn is_backward(self) -> bool {
        self.arity() == Arity::Backward
    }

    /// Whether the mode reads a second operand `b`.
    pub fn is_binary(self) -> bool {
        self.arity() == Arity::Binary
    }

    /// Whether this is a comparison (its result is a boolean tensor).
    pub fn is_comparison(self) -> bool {
        use PointwiseMode as P;
        matches!(
            self,
            P::CmpEq | P::CmpNeq | P::CmpGt | P::CmpGe | P::CmpLt | P::CmpLe
        )
    }

    /// Whether the result is a boolean tensor (a comparison or [`PointwiseMode::LogicalAnd`]):
    /// it stays virtual and can be the condition of [`Graph::select`].
    pub fn gives_boolean(self) -> bool {
        self.is_comparison() || self == PointwiseMode::LogicalAnd
    }

    pub(crate) fn raw(self) -> cudnn_safe_sys::cudnnPointwiseMode_t {
        use cudnn_safe_sys::cudnnPointwiseMode_t as M;
        use PointwiseMode as P;
        match self {
            P::Add => M::CUDNN_POINTWISE_ADD,
            P::Sub => M::CUDNN_POINTWISE_SUB,
            P::Mul => M::CUDNN_POINTWISE_MUL,
            P::Div => M::CUDNN_POINTWISE_DIV,
            P::Min => M::CUDNN_POINTWISE_MIN,
            P::Max => M::CUDNN_POINTWISE_MAX,
            P::Pow => M::CUDNN_POINTWISE_POW,
            P::Relu | P::LeakyRelu { .. } => M::CUDNN_POINTWISE_RELU_FWD,
            P::Gelu => M::CUDNN_POINTWISE_GELU_FWD,
            P::GeluTanh => M::CUDNN_POINTWISE_GELU_APPROX_TANH_FWD,
            P::Sigmoid => M::CUDNN_POINTWISE_SIGMOID_FWD,
            P::Tanh => M::CUDNN_POINTWISE_TANH_FWD,
            P::Swish { .. } => M::CUDNN_POINTWISE_SWISH_FWD,
            P::Elu { .. } => M::CUDNN_POINTWISE_ELU_FWD,
            P::Softplus { .. } => M::CUDNN_POINTWISE_SOFTPLUS_FWD,
            P::Exp => M::CUDNN_POINTWISE_EXP,
            P::Log => M::CUDNN_POINTWISE_LOG,
            P::Sqrt => M::CUDNN_POINTWISE_SQRT,
            P::Rsqrt => M::CUDNN_POINTWISE_RSQRT,
            P::Neg => M::CUDNN_POINTWISE_NEG,
            P::Abs => M::CUDNN_POINTWISE_ABS,
            P::Reciprocal => M::CUDNN_POINTWISE_RECIPROCAL,
            P::Erf => M::CUDNN_POINTWISE_ERF,
            P::Identity => M::CUDNN_POINTWISE_IDENTITY,
            P::ReluBwd => M::CUDNN_POINTWISE_RELU_BWD,
            P::GeluBwd => M::CUDNN_POINTWISE_GELU_BWD,
            P::GeluTanhBwd => M::CUDNN_POINTWISE_GELU_APPROX_TANH_BWD,
            P::SigmoidBwd => M::CUDNN_POINTWISE_SIGMOID_BWD,
            P::TanhBwd => M::CUDNN_POINTWISE_TANH_BWD,
            P::SwishBwd { .. } => M::CUDNN_POINTWISE_SWISH_BWD,
            P::EluBwd { .. } => M::CUDNN_POINTWISE_ELU_BWD,
            P::SoftplusBwd { .. } => M::CUDNN_POINTWISE_SOFTPLUS_BWD,
            P::GenIndex { .. } => M::CUDNN_POINTWISE_GEN_INDEX,
            P::CmpEq => M::CUDNN_POINTWISE_CMP_EQ,
            P::CmpNeq => M::CUDNN_POINTWISE_CMP_NEQ,
            P::CmpGt => M::CUDNN_POINTWISE_CMP_GT,
            P::CmpGe => M::CUDNN_POINTWISE_CMP_GE,
            P::CmpLt => M::CUDNN_POINTWISE_CMP_LT,
            P::CmpLe => M::CUDNN_POINTWISE_CMP_LE,
            P::LogicalAnd => M::CUDNN_POINTWISE_LOGICAL_AND,
        }
    }

    /// The parameter a mode carries, as (attribute, value).
    pub(crate) fn param(self) -> Option<(backend::Attr, f64)> {
        use backend::attr;
        use PointwiseMode as P;
        match self {
            P::LeakyRelu { slope } => {
                Some((attr!(CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE), slope))
            }
            P::Swish { beta } | P::SwishBwd { beta } => {
                Some((attr!(CUDNN_ATTR_POINTWISE_SWISH_BETA), beta))
            }
            P::Elu { alpha } | P::EluBwd { alpha } => {
                Some((attr!(CUDNN_ATTR_POINTWISE_ELU_ALPHA), alpha))
            }
            P::Softplus { beta } | P::SoftplusBwd { beta } => {
                Some((attr!(CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA), beta))
            }
            _ => None,
        }
    }
}

impl Graph {
    /// A mode's parameter (slope, alpha, beta) must be finite: cuDNN would compute with an
    /// infinity or NaN, and a graph record ([`Graph::to_json`]) cannot hold one.
    pub(crate) fn check_param(mode: PointwiseMode) -> Result<()> {
        match mode.param() {
            Some((_, v)) if !v.is_finite() => Err(Error::invalid(
                "pointwise mode parameter",
                "a finite value",
                format!("{mode:?}"),
            )),
            _ => Ok(()),
        }
    }

    /// A pointwise operation (`CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR`): `y = mode(x)` for
    /// unary modes, `y = mode(x, b)` for binary ones (`b` required; same rank as x, each
    /// dimension equal or 1; or a [`Graph::scalar`]). The output has the broadcast shape, laid out
    /// in the memory order of the full-shaped operand. Backward modes go through
    /// [`Graph::pointwise_bwd`].
    ///
    /// Engines: cuDNN 9 runs pointwise operations in its runtime-fusion engines, best as the
    /// epilogue of a convolution or matmul (`conv → bias → relu`, `matmul → bias → gelu`). With
    /// cuDNN 9.14, standalone graphs of one f32 NCHW pointwise operation got no engine
    /// configuration from the heuristics ([`OperationGraph::plans`] then returns a typed error),
    /// while f16 channels-last standalone graphs (scale and shift by scalars) ran.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR")]
    pub fn pointwise(
        &mut self,
        mode: PointwiseMode,
        x: TensorId,
        b: Option<TensorId>,
    ) -> Result<TensorId> {
        const OP: &str = "pointwise";
        let xi = self.index(x)?;
        Self::check_param(mode)?;
        if let PointwiseMode::LeakyRelu { slope } = mode {
            if slope != 0.0 {
                return Err(Error::invalid(
                    "pointwise mode",
                    "LeakyRelu with slope 0 (cuDNN 9.14's engines ignored the slope on the H200)",
                    format!("slope {slope} on `{}`", self.tensors[xi].name),
                ));
            }
        }
        match (mode.arity(), b) {
            (Arity::Unary, None) | (Arity::Binary, Some(_)) => {}
            (arity, _) => {
                return Err(Error::invalid(
                    "pointwise operands",
                    match arity {
                        Arity::Unary => format!("{mode:?} reads x only (no b)"),
                        Arity::Binary => format!("{mode:?} reads x and b"),
                        Arity::Backward => {
                            format!("{mode:?} is a backward mode: use pointwise_bwd")
                        }
                    },
                    format!(
                        "x = `{}`, b = {:?}",
                        self.tensors[xi].name,
                        b.map(|b| b.uid())
                    ),
                ))
            }
        }
        if self.tensors[xi].scalar.is_some() {
            return Err(Error::invalid(
                "pointwise operand",
                "x is a tensor (only b may be a by-value scalar)",
                format!("scalar `{}`", self.tensors[xi].name),
            ));
        }
        let r = self.tensors[xi].dims.len();
        let (dims, order) = match b {
            None => (
                self.tensors[xi].dims.clone(),
                stride_order(&self.tensors[xi].strides),
            ),
            Some(b) => {
                let bi = self.index(b)?;
                let bt = &self.tensors[bi];
                let xt = &self.tensors[xi];
                if bt.scalar.is_some() {
                    (xt.dims.clone(), stride_order(&xt.strides))
                } else {
                    let ok = bt.dims.len() == r
                        && xt
                            .dims
                            .iter()
                            .zip(&bt.dims)
                            .all(|(&p, &q)| p == q || p == 1 || q == 1);
                    if !ok {
                        return Err(xt.shape_mismatch(
                            bt,
                            "pointwise operands have the same rank and each dimension equal or 1",
                        ));
                    }
                    let dims: Vec<i64> = xt
                        .dims
                        .iter()
                        .zip(&bt.dims)
                        .map(|(&p, &q)| p.max(q))
                        .collect();
                    let like = if xt.dims == dims { xt } else { bt };
                    let order = if like.dims == dims {
                        stride_order(&like.strides)
                    } else {
                        (0..r).collect()
                    };
                    (dims, order)
                }
            }
        };
        if let PointwiseMode::GenIndex { axis } = mode {
            if axis < 0 || axis >= r as i64 {
                return Err(Error::invalid(
                    "pointwise GenIndex axis",
                    format!("0 ≤ axis < {r} (x's rank)"),
                    format!("axis {axis} on `{}`", self.tensors[xi].name),
                ));
            }
        }
        // Every refusal before the graph changes: the output's packed strides (which may
        // overflow), then b (a scalar's rank may be refused) before x, whose marking as read
        // cannot fail once b's did not.
        strides_in_order(&dims, &order)?;
        let bi = match b {
            Some(b) => Some(self.operand(b, Some(r), OP)?),
            None => None,
        };
        let xi = self.operand(x, None, OP)?;
        let y = self.output("pointwise.y", dims, &order, self.ops.len())?;
        let int_operands = matches!(mode, PointwiseMode::Add | PointwiseMode::Sub)
            && self.tensors[xi].dtype == DType::I32
            && bi.is_some_and(|b| self.tensors[b].dtype == DType::I32);
        if matches!(mode, PointwiseMode::GenIndex { .. }) || int_operands {
            // cudnn-frontend declares generated indices INT32 (the comparisons read them so),
            // and the sums and differences of indices and lengths its diagonal masks shift
            // them by (computed in INT32).
            self.tensors[y.index].dtype = DType::I32;
        }
        self.ops.push(Op::Pointwise {
            mode,
            x: xi,
            b: bi,
            y: y.index,
        });
        Ok(y)
    }

    /// `x + b` with broadcast (a bias: b `[1, C, 1, 1]` on x `[N, C, H, W]`).
    pub fn bias(&mut self, x: TensorId, b: TensorId) -> Result<TensorId> {
        self.pointwise(PointwiseMode::Add, x, Some(b))
    }

    /// `x · s` with broadcast (a per-channel scale, or a [`Graph::scalar`]).
    pub fn scale(&mut self, x: TensorId, s: TensorId) -> Result<TensorId> {
        self.pointwise(PointwiseMode::Mul, x, Some(s))
    }

    /// A backward pointwise operation: `dx = mode'(x) · dy` for an activation's backward mode
    /// ([`PointwiseMode::ReluBwd`], [`PointwiseMode::GeluBwd`], ...), where `x` is the forward
    /// input. `dy` and `x` have the same dimensions; dx is laid out like dy.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR")]
    pub fn pointwise_bwd(
        &mut self,
        mode: PointwiseMode,
        dy: TensorId,
        x: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "pointwise backward";
        let (dyi, xi) = (self.index(dy)?, self.index(x)?);
        Self::check_param(mode)?;
        if !mode.is_backward() {
            return Err(Error::invalid(
                "pointwise backward mode",
                "a backward mode (ReluBwd, GeluBwd, ...)",
                format!("{mode:?}"),
            ));
        }
        let (dyt, xt) = (&self.tensors[dyi], &self.tensors[xi]);
        if dyt.dims != xt.dims || dyt.scalar.is_some() || xt.scalar.is_some() {
            return Err(dyt.shape_mismatch(xt, "dy and x have the same dimensions"));
        }
        let dims = dyt.dims.clone();
        let order = stride_order(&dyt.strides);
        let dyi = self.operand(dy, None, OP)?;
        let xi = self.operand(x, None, OP)?;
        let dx = self.output("pointwise_bwd.dx", dims, &order, self.ops.len())?;
        self.ops.push(Op::PointwiseBwd {
            mode,
            dy: dyi,
            x: xi,
            dx: dx.index,
        });
        Ok(dx)
    }
}

impl Graph {
    /// The operation descriptor of a pointwise operation (forward or backward) and the
    /// pointwise descriptor it refers to.
    pub(super) fn pointwise_desc(
        &self,
        lib: &'static Library,
        op: &Op,
        mode: PointwiseMode,
        comp: sys::cudnnDataType_t,
        t: &[Desc],
    ) -> Result<(Desc, Option<Desc>)> {
        let mut p = Desc::new(lib, kind!(CUDNN_BACKEND_POINTWISE_DESCRIPTOR))?;
        p.set1(attr!(CUDNN_ATTR_POINTWISE_MODE), mode.raw())?;
        // Comparisons compute in BOOLEAN, as cudnn-frontend's attention masks set them.
        let int_result = match op {
            Op::Pointwise { mode, y, .. } => {
                !matches!(mode, PointwiseMode::GenIndex { .. })
                    && self.tensors[*y].dtype == DType::I32
            }
            _ => false,
        };
        let prec = if mode.gives_boolean() {
            sys::cudnnDataType_t::CUDNN_DATA_BOOLEAN
        } else if int_result {
            // Index arithmetic (an attention mask's diagonal shifted by lengths)
            // computes in INT32, as cudnn-frontend sets it.
            sys::cudnnDataType_t::CUDNN_DATA_INT32
        } else {
            comp
        };
        p.set1(attr!(CUDNN_ATTR_POINTWISE_MATH_PREC), prec)?;
        if let Some((a, v)) = mode.param() {
            p.set1(a, v)?;
        }
        if let PointwiseMode::GenIndex { axis } = mode {
            p.set1(attr!(CUDNN_ATTR_POINTWISE_AXIS), axis)?;
        }
        p.finalize()?;
        let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR))?;
        o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), &[&p])?;
        match op {
            Op::Pointwise { x, b, y, .. } => {
                o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), &[&t[*x]])?;
                if let Some(b) = b {
                    o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_BDESC), &[&t[*b]])?;
                }
                o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_YDESC), &[&t[*y]])?;
            }
            Op::PointwiseBwd { dy, x, dx, .. } => {
                o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), &[&t[*x]])?;
                o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC), &[&t[*dy]])?;
                o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_DXDESC), &[&t[*dx]])?;
            }
            _ => unreachable!("matched pointwise above"),
        }
        o.finalize()?;
        Ok((o, Some(p)))
    }
}
