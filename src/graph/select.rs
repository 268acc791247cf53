//! General graph operations: binary select and a transposed view (attention's masks and
//! backward pass are built from them), and which tensors hold booleans or indices.
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, Desc};
#[cfg(doc)]
use super::PointwiseMode;
use super::{stride_order, Graph, Op, TensorId, TensorInfo};
use crate::dtype::DType;
use crate::error::{Error, Result};

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
        // b first: a scalar's rank may be refused, and nothing is marked read before that.
        let bi = self.operand(b, Some(r), OP)?;
        let xi = self.operand(x, None, OP)?;
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
        let y = self.push(TensorInfo::written("transpose.y", dims, strides, dtype, op));
        self.ops.push(Op::Transpose { x: xi, y: y.index });
        Ok(y)
    }
}

/// The operation descriptor of a binary select `y = cond ? x : b` (`[x, b, cond, y]`) and the
/// pointwise descriptor it refers to.
pub(super) fn select_desc(
    lib: &'static Library,
    [x, b, cond, y]: [usize; 4],
    comp: sys::cudnnDataType_t,
    t: &[Desc],
) -> Result<(Desc, Option<Desc>)> {
    let mut p = Desc::new(lib, kind!(CUDNN_BACKEND_POINTWISE_DESCRIPTOR))?;
    p.set1(
        attr!(CUDNN_ATTR_POINTWISE_MODE),
        sys::cudnnPointwiseMode_t::CUDNN_POINTWISE_BINARY_SELECT,
    )?;
    p.set1(attr!(CUDNN_ATTR_POINTWISE_MATH_PREC), comp)?;
    p.finalize()?;
    let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR))?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), &[&p])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), &[&t[x]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_BDESC), &[&t[b]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_TDESC), &[&t[cond]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_POINTWISE_YDESC), &[&t[y]])?;
    o.finalize()?;
    Ok((o, Some(p)))
}

/// The operation descriptor of a transposed view `y` of `x` (a reshape).
pub(super) fn transpose_desc(
    lib: &'static Library,
    x: usize,
    y: usize,
    t: &[Desc],
) -> Result<(Desc, Option<Desc>)> {
    let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR))?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_RESHAPE_XDESC), &[&t[x]])?;
    o.set_descs(attr!(CUDNN_ATTR_OPERATION_RESHAPE_YDESC), &[&t[y]])?;
    o.finalize()?;
    Ok((o, None))
}
