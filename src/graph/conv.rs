//! Convolution operations of a graph: [`ConvParams`] and forward, backward data and backward
//! filter.
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, Desc};
use super::{stride_order, Graph, Op, TensorId, TensorInfo};
use crate::conv::ConvMode;
use crate::error::{Error, Result};
use crate::tensor::Layout;

/// Parameters of a convolution operation (`CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR`).
///
/// One entry per spatial dimension in each list. Padding may differ before and after
/// (`pre_padding`, `post_padding`); [`ConvParams::with_padding`] sets both.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ConvParams {
    pub(crate) pre_padding: Vec<i64>,
    pub(crate) post_padding: Vec<i64>,
    pub(crate) stride: Vec<i64>,
    pub(crate) dilation: Vec<i64>,
    pub(crate) mode: ConvMode,
}

impl ConvParams {
    /// No padding, unit stride and dilation, cross-correlation, over `spatial_dims` dimensions
    /// (2 for images, 3 for volumes).
    pub fn new(spatial_dims: usize) -> ConvParams {
        ConvParams {
            pre_padding: vec![0; spatial_dims],
            post_padding: vec![0; spatial_dims],
            stride: vec![1; spatial_dims],
            dilation: vec![1; spatial_dims],
            mode: ConvMode::CrossCorrelation,
        }
    }
    /// Symmetric padding (before and after), one value per spatial dimension.
    #[must_use]
    pub fn with_padding(mut self, pad: &[i64]) -> Self {
        self.pre_padding = pad.to_vec();
        self.post_padding = pad.to_vec();
        self
    }
    /// Padding before each spatial dimension.
    #[must_use]
    pub fn with_pre_padding(mut self, pad: &[i64]) -> Self {
        self.pre_padding = pad.to_vec();
        self
    }
    /// Padding after each spatial dimension.
    #[must_use]
    pub fn with_post_padding(mut self, pad: &[i64]) -> Self {
        self.post_padding = pad.to_vec();
        self
    }
    /// Filter strides.
    #[must_use]
    pub fn with_strides(mut self, stride: &[i64]) -> Self {
        self.stride = stride.to_vec();
        self
    }
    /// Dilations.
    #[must_use]
    pub fn with_dilations(mut self, dilation: &[i64]) -> Self {
        self.dilation = dilation.to_vec();
        self
    }
    /// Cross-correlation (the default) or true convolution.
    #[must_use]
    pub fn with_mode(mut self, mode: ConvMode) -> Self {
        self.mode = mode;
        self
    }
    /// Number of spatial dimensions.
    pub fn spatial_dims(&self) -> usize {
        self.stride.len()
    }
    /// Padding before each spatial dimension.
    pub fn pre_padding(&self) -> &[i64] {
        &self.pre_padding
    }
    /// Padding after each spatial dimension.
    pub fn post_padding(&self) -> &[i64] {
        &self.post_padding
    }
    /// Filter strides.
    pub fn strides(&self) -> &[i64] {
        &self.stride
    }
    /// Dilations.
    pub fn dilations(&self) -> &[i64] {
        &self.dilation
    }
    /// The convolution mode.
    pub fn mode(&self) -> ConvMode {
        self.mode
    }

    pub(crate) fn validate(&self, op: &'static str) -> Result<()> {
        let n = self.stride.len();
        if n == 0
            || self.pre_padding.len() != n
            || self.post_padding.len() != n
            || self.dilation.len() != n
        {
            return Err(Error::invalid(
                "convolution parameters",
                format!(
                    "{op}: one padding (pre and post), stride and dilation per spatial dimension"
                ),
                format!(
                    "pre {:?}, post {:?}, stride {:?}, dilation {:?}",
                    self.pre_padding, self.post_padding, self.stride, self.dilation
                ),
            ));
        }
        if self
            .pre_padding
            .iter()
            .chain(&self.post_padding)
            .any(|&p| p < 0)
        {
            return Err(Error::invalid(
                "convolution padding",
                format!("{op}: paddings ≥ 0"),
                format!("pre {:?}, post {:?}", self.pre_padding, self.post_padding),
            ));
        }
        if self.stride.iter().chain(&self.dilation).any(|&s| s < 1) {
            return Err(Error::invalid(
                "convolution stride / dilation",
                format!("{op}: strides and dilations ≥ 1"),
                format!("stride {:?}, dilation {:?}", self.stride, self.dilation),
            ));
        }
        Ok(())
    }

    /// Output spatial extent for input `i` along axis `a`, filter extent `k`; `None` if the
    /// dilated filter does not fit the padded input.
    fn out_extent(&self, a: usize, i: i64, k: i64) -> Option<i64> {
        let padded = i
            .checked_add(self.pre_padding[a])?
            .checked_add(self.post_padding[a])?;
        let span = (k - 1).checked_mul(self.dilation[a])?.checked_add(1)?;
        if padded < span {
            return None;
        }
        Some((padded - span) / self.stride[a] + 1)
    }
}

impl Graph {
    fn conv_rank_check(
        &self,
        op: &'static str,
        a: usize,
        b: usize,
        conv: &ConvParams,
    ) -> Result<()> {
        conv.validate(op)?;
        let (ta, tb) = (&self.tensors[a], &self.tensors[b]);
        for t in [ta, tb] {
            if !(4..=5).contains(&t.dims.len()) || t.scalar.is_some() {
                return Err(Error::invalid(
                    "convolution operand rank",
                    format!("{op}: 4 or 5 dimensions ([N, C, spatial...])"),
                    format!("`{}` with dims {:?}", t.name, t.dims),
                ));
            }
        }
        if ta.dims.len() != tb.dims.len() || ta.dims.len() != conv.spatial_dims() + 2 {
            return Err(ta.shape_mismatch(tb, "convolution operands have the same rank, 2 + the number of spatial dimensions of the parameters"));
        }
        Ok(())
    }

    /// Forward output dims of x `[N, C, s...]` and w `[K, C/g, r...]`.
    fn conv_out_dims(&self, x: usize, w: usize, conv: &ConvParams) -> Result<Vec<i64>> {
        let (xt, wt) = (&self.tensors[x], &self.tensors[w]);
        let (xd, wd) = (&xt.dims, &wt.dims);
        let groups_ok = xd[1] % wd[1] == 0 && wd[0] % (xd[1] / wd[1]) == 0;
        if !groups_ok {
            return Err(xt.shape_mismatch(wt, "input channels are a multiple g of the filter's channels, and the filter count a multiple of g (groups)"));
        }
        let mut out = vec![xd[0], wd[0]];
        for a in 0..conv.spatial_dims() {
            match conv.out_extent(a, xd[a + 2], wd[a + 2]) {
                Some(e) => out.push(e),
                None => {
                    return Err(xt.shape_mismatch(
                        wt,
                        "the dilated filter fits the padded input in every spatial dimension",
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Checks that `dy` (tensor index) has the forward output shape of a convolution whose
    /// input (`probe.is_x`) or filter has the probe's dimensions, the other operand being
    /// `other`: on a probe tensor holding those dimensions, removed again.
    fn conv_grad_check(
        &mut self,
        op: &'static str,
        dy: usize,
        other: usize,
        probe: &Probe<'_>,
        conv: &ConvParams,
    ) -> Result<()> {
        let layout = Layout::nchw_nd(probe.dims)?;
        let p = self.tensors.len();
        self.tensors.push(TensorInfo {
            is_virtual: true,
            ..TensorInfo::input(
                probe.name,
                probe.dims.to_vec(),
                layout.strides().to_vec(),
                self.intermediate,
            )
        });
        let (x, w) = if probe.is_x { (p, other) } else { (other, p) };
        let fwd = self
            .conv_rank_check(op, x, w, conv)
            .and_then(|_| self.conv_out_dims(x, w, conv));
        self.tensors.pop();
        let fwd = fwd?;
        let dyt = &self.tensors[dy];
        if fwd != dyt.dims {
            return Err(Error::ShapeMismatch {
                a: dyt.name,
                a_dims: dyt.dims.clone(),
                b: probe.name,
                b_dims: probe.dims.to_vec(),
                rule: probe.rule,
            });
        }
        Ok(())
    }

    /// Convolution forward (`CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR`):
    /// `y = conv(x, w)` with x `[N, C, spatial...]` and w `[K, C/groups, filter...]` (grouped when
    /// `C` is a multiple of w's channels). Returns the virtual output `[N, K, out...]`, laid out in
    /// x's memory order.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR")]
    pub fn conv_fprop(&mut self, x: TensorId, w: TensorId, conv: &ConvParams) -> Result<TensorId> {
        const OP: &str = "convolution forward";
        let (xi, wi) = (self.index(x)?, self.index(w)?);
        self.conv_rank_check(OP, xi, wi, conv)?;
        let dims = self.conv_out_dims(xi, wi, conv)?;
        let order = stride_order(&self.tensors[xi].strides);
        let xi = self.operand(x, None, OP)?;
        let wi = self.operand(w, None, OP)?;
        let y = self.output("conv_fprop.y", dims, &order, self.ops.len())?;
        self.ops.push(Op::ConvFprop {
            x: xi,
            w: wi,
            y: y.index,
            conv: conv.clone(),
        });
        Ok(y)
    }

    /// Convolution backward data (`..._CONVOLUTION_BACKWARD_DATA_DESCRIPTOR`): the gradient with
    /// respect to the input, of dimensions `dx_dims`, from `dy` and the filter `w`. `dx_dims` must
    /// be an input shape whose forward output is `dy`'s shape. Laid out in dy's memory order.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR")]
    pub fn conv_dgrad(
        &mut self,
        dy: TensorId,
        w: TensorId,
        dx_dims: &[i64],
        conv: &ConvParams,
    ) -> Result<TensorId> {
        const OP: &str = "convolution backward data";
        let (dyi, wi) = (self.index(dy)?, self.index(w)?);
        self.conv_rank_check(OP, dyi, wi, conv)?;
        let probe = Probe {
            name: "dx",
            dims: dx_dims,
            is_x: true,
            rule: "dy has the forward output shape of dx and w",
        };
        self.conv_grad_check(OP, dyi, wi, &probe, conv)?;
        let order = stride_order(&self.tensors[dyi].strides);
        let dyi = self.operand(dy, None, OP)?;
        let wi = self.operand(w, None, OP)?;
        let dx = self.output("conv_dgrad.dx", dx_dims.to_vec(), &order, self.ops.len())?;
        self.ops.push(Op::ConvDgrad {
            dy: dyi,
            w: wi,
            dx: dx.index,
            conv: conv.clone(),
        });
        Ok(dx)
    }

    /// Convolution backward filter (`..._CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR`): the gradient
    /// with respect to the filter, of dimensions `dw_dims`, from `x` and `dy`. Laid out in x's
    /// memory order (KRSC for an NHWC x).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR")]
    pub fn conv_wgrad(
        &mut self,
        x: TensorId,
        dy: TensorId,
        dw_dims: &[i64],
        conv: &ConvParams,
    ) -> Result<TensorId> {
        const OP: &str = "convolution backward filter";
        let (xi, dyi) = (self.index(x)?, self.index(dy)?);
        self.conv_rank_check(OP, xi, dyi, conv)?;
        let probe = Probe {
            name: "dw",
            dims: dw_dims,
            is_x: false,
            rule: "dy has the forward output shape of x and dw",
        };
        self.conv_grad_check(OP, dyi, xi, &probe, conv)?;
        let order = stride_order(&self.tensors[xi].strides);
        let xi = self.operand(x, None, OP)?;
        let dyi = self.operand(dy, None, OP)?;
        let dw = self.output("conv_wgrad.dw", dw_dims.to_vec(), &order, self.ops.len())?;
        self.ops.push(Op::ConvWgrad {
            x: xi,
            dy: dyi,
            dw: dw.index,
            conv: conv.clone(),
        });
        Ok(dw)
    }
}

fn conv_mode(m: ConvMode) -> sys::cudnnConvolutionMode_t {
    match m {
        ConvMode::Convolution => sys::cudnnConvolutionMode_t::CUDNN_CONVOLUTION,
        _ => sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
    }
}

/// A convolution operation descriptor (forward, backward data or backward filter) and the
/// convolution descriptor it refers to.
pub(super) fn conv_desc(
    lib: &'static Library,
    op: &Op,
    comp: sys::cudnnDataType_t,
    t: &[Desc],
) -> Result<(Desc, Option<Desc>)> {
    let Some(([x, w, y], conv)) = op.conv_operands() else {
        return Err(Error::invalid(
            "graph operation",
            "a convolution",
            op.name(),
        ));
    };
    let mut c = Desc::new(lib, kind!(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR))?;
    c.set1(
        attr!(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS),
        conv.spatial_dims() as i64,
    )?;
    c.set1(attr!(CUDNN_ATTR_CONVOLUTION_COMP_TYPE), comp)?;
    c.set1(
        attr!(CUDNN_ATTR_CONVOLUTION_CONV_MODE),
        conv_mode(conv.mode),
    )?;
    c.set(
        attr!(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS),
        &conv.pre_padding,
    )?;
    c.set(
        attr!(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS),
        &conv.post_padding,
    )?;
    c.set(attr!(CUDNN_ATTR_CONVOLUTION_DILATIONS), &conv.dilation)?;
    c.set(attr!(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES), &conv.stride)?;
    c.finalize()?;
    // (x, w, y) here are (x, w, y), (dx, w, dy) and (x, dw, dy) respectively.
    let (kind, ax, aw, ay, aconv, aalpha, abeta) = match op {
        Op::ConvFprop { .. } => (
            kind!(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA),
        ),
        Op::ConvDgrad { .. } => (
            kind!(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA),
        ),
        _ => (
            kind!(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA),
            attr!(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA),
        ),
    };
    let mut o = Desc::new(lib, kind)?;
    o.set_descs(ax, &[&t[x]])?;
    o.set_descs(aw, &[&t[w]])?;
    o.set_descs(ay, &[&t[y]])?;
    o.set_descs(aconv, &[&c])?;
    // alpha = 1, beta = 0 as floats, as cudnn-frontend sets them for every data type.
    o.set1(aalpha, 1.0f32)?;
    o.set1(abeta, 0.0f32)?;
    o.finalize()?;
    Ok((o, Some(c)))
}

/// The gradient a backward convolution computes, checked through [`Graph::conv_grad_check`]:
/// its name, dimensions, whether it stands for the input (else the filter) and the rule an
/// error names.
struct Probe<'a> {
    name: &'static str,
    dims: &'a [i64],
    is_x: bool,
    rule: &'static str,
}
