//! Group normalization in a graph: layer or instance norm over a group view of the same
//! memory plus a per-channel affine step, and that step on its own for unfused graphs.
use super::super::{stride_order, Graph, PointwiseMode, TensorId};
use super::{DimsStrides, GroupNormMethod, GroupNormOutputs, NormMode};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType, Scalar};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::ops::OpTensorOp;
use crate::tensor::{Layout, TensorDesc};

impl Graph {
    /// Group normalization forward with a per-channel affine step, in the default formulation
    /// ([`GroupNormMethod::InstanceNormView`]): the channels of x `[N, C, spatial...]` fall into
    /// `groups` groups of `C/G` consecutive channels; each `(n, group)` is normalized over its
    /// channels and spatial positions, then scaled and shifted per channel:
    /// `y = (x − mean) · inv_var · scale[c] + bias[c]` (biased variance, as PyTorch's
    /// `group_norm`). Same as [`Graph::group_norm_with`] with `Some((scale, bias))` and the
    /// default method; see there for the view, the extra inputs and the rules.
    ///
    /// ```no_run
    /// use cudnn_safe::graph::{Args, Graph, PlanFilter};
    /// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    /// let x = g.tensor_nchw("x", &[8, 64, 32, 32], DType::F32)?;
    /// let gamma = g.tensor_nchw("gamma", &[1, 64, 1, 1], DType::F32)?;
    /// let beta = g.tensor_nchw("beta", &[1, 64, 1, 1], DType::F32)?;
    /// let out = g.group_norm(x, 32, gamma, beta, 1e-5, false)?;
    /// g.mark_output(out.y)?;
    /// let og = g.build(&cudnn)?;
    /// let plan = og.plans(&cudnn, &PlanFilter::default())?.plans.remove(0);
    ///
    /// let xb = stream.alloc_zeros::<f32>(og.span(x)?).unwrap();
    /// let gb = stream.alloc_zeros::<f32>(og.span(gamma)?).unwrap();
    /// let bb = stream.alloc_zeros::<f32>(og.span(beta)?).unwrap();
    /// let ones = stream.clone_htod(&vec![1f32; og.span(out.unit_scale)?]).unwrap();
    /// let zeros = stream.alloc_zeros::<f32>(og.span(out.zero_bias)?).unwrap();
    /// let mut yb = stream.alloc_zeros::<f32>(og.span(out.y)?).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// let mut args = Args::new(&cudnn);
    /// args.input(x, &xb)?.input(gamma, &gb)?.input(beta, &bb)?;
    /// args.input(out.unit_scale, &ones)?.input(out.zero_bias, &zeros)?;
    /// args.output(out.y, &mut yb)?;
    /// cudnn.execute(&plan, &args, &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CUDNN_INSTANCE_NORM")]
    #[doc(alias = "GroupNorm")]
    pub fn group_norm(
        &mut self,
        x: TensorId,
        groups: i64,
        scale: TensorId,
        bias: TensorId,
        epsilon: f64,
        training: bool,
    ) -> Result<GroupNormOutputs> {
        self.group_norm_with(
            x,
            groups,
            Some((scale, bias)),
            epsilon,
            training,
            GroupNormMethod::default(),
        )
    }

    /// Group normalization forward in a chosen formulation, with or without the per-channel
    /// affine step (`affine = Some((scale, bias))`, both `[1, C, 1, 1]`).
    ///
    /// cuDNN has no group-norm engine (`CUDNN_GROUP_NORM` exists in the enum, but
    /// cudnn-frontend has no node for it), so the graph normalizes a view of the same memory
    /// (`S` is the product of the spatial extents):
    /// - [`GroupNormMethod::InstanceNormView`]: x seen as `[N, G, C/G, S, 1]` (packed NCHW:
    ///   strides `[C·S, (C/G)·S, S, 1, 1]`) normalized by instance norm, statistics
    ///   `[N, G, 1, 1, 1]`, unit scale and zero bias `[1, G, 1, 1, 1]`;
    /// - [`GroupNormMethod::LayerNormView`]: x seen as `[N, G, C/G, S]` normalized by layer
    ///   norm over `C/G` and `S`, statistics `[N, G, 1, 1]`, unit scale and zero bias
    ///   `[1, 1, C/G, S]`.
    ///
    /// The unit scale and zero bias ([`GroupNormOutputs::unit_scale`],
    /// [`GroupNormOutputs::zero_bias`]) are f32 graph inputs the caller binds to buffers of
    /// ones and zeros. With `affine`, a pointwise multiplication by `scale` and an addition of
    /// `bias`, both seen as `[1, G, C/G, 1(, 1)]`, follow in the same graph.
    ///
    /// No view change is needed between the operations: x, `scale` and `bias` are described to
    /// cuDNN in the group view from the start (their strides say where each element lives, so
    /// buffers laid out as declared still fit). For that x, `scale` and `bias` must be graph
    /// inputs that no other operation reads, and x's spatial dimensions must form one strided
    /// run (true for packed NCHW and NHWC); otherwise [`Error::InvalidArgument`]. After the call
    /// [`Graph::dims`] of x, `scale` and `bias` report the view. y has the view's dimensions and
    /// x's memory layout; the statistics follow x's memory order.
    ///
    /// Whether an engine fuses the operations depends on the cuDNN version, the layout and the
    /// formulation ([`crate::graph::OperationGraph::plans`] says so with a typed error): with
    /// cuDNN 9.14 the fused layer-norm view with the affine step (NCHW f32) got no
    /// engine configuration. When no fused graph is offered, normalize without `affine` (mark
    /// y as an output) and apply the affine step afterwards with
    /// [`Cudnn::group_norm_affine`](crate::Cudnn::group_norm_affine) on the same buffer.
    #[doc(alias = "CUDNN_INSTANCE_NORM")]
    #[doc(alias = "CUDNN_LAYER_NORM")]
    #[doc(alias = "GroupNorm")]
    pub fn group_norm_with(
        &mut self,
        x: TensorId,
        groups: i64,
        affine: Option<(TensorId, TensorId)>,
        epsilon: f64,
        training: bool,
        method: GroupNormMethod,
    ) -> Result<GroupNormOutputs> {
        let xi = self.index(x)?;
        let affine_idx = match affine {
            Some((s, b)) => Some((self.index(s)?, self.index(b)?)),
            None => None,
        };
        self.group_norm_check(xi, affine_idx, groups, epsilon)?;
        let xd = self.tensors[xi].dims.clone();
        let xs = self.tensors[xi].strides.clone();
        let (s, s_stride) = spatial_run(&xd, &xs, self.tensors[xi].name)?;
        let c = xd[1];
        let cg = c / groups;
        let five = method == GroupNormMethod::InstanceNormView;
        // The instance-norm view appends a unit axis so that the instance norm's "spatial"
        // axes are `C/G` and `S`; its stride repeats S's (1 for packed NCHW, as a packed 5-D
        // tensor has).
        let mut x_view = (
            vec![xd[0], groups, cg, s],
            vec![xs[0], cg * xs[1], xs[1], s_stride],
        );
        if five {
            x_view.0.push(1);
            x_view.1.push(s_stride);
        }
        let param_view = |strides: &[i64]| {
            let sc = strides[1];
            let mut v = (vec![1, groups, cg, 1], vec![c * sc, cg * sc, sc, sc]);
            if five {
                v.0.push(1);
                v.1.push(sc);
            }
            v
        };
        let views: Vec<(usize, DimsStrides)> = match affine_idx {
            Some((si, bi)) => {
                let s_view = param_view(&self.tensors[si].strides);
                let b_view = param_view(&self.tensors[bi].strides);
                vec![(xi, x_view.clone()), (si, s_view), (bi, b_view)]
            }
            None => vec![(xi, x_view.clone())],
        };
        for (_, (d, st)) in &views {
            Layout::strided(d, st)?;
        }
        let (unit_dims, stats_shapes) = if five {
            (vec![1, groups, 1, 1, 1], None)
        } else {
            let unit = vec![1, 1, cg, s];
            (unit.clone(), Some((unit, vec![xd[0], groups, 1, 1])))
        };
        let unit_strides = super::super::strides_in_order(&unit_dims, &stride_order(&x_view.1))?;
        Layout::strided(&unit_dims, &unit_strides)?;
        // Every check passed: describe the operands in the group view.
        for (i, (d, st)) in views {
            self.tensors[i].dims = d;
            self.tensors[i].strides = st;
        }
        let unit_scale = self.tensor(
            "group_norm.unit_scale",
            &unit_dims,
            &unit_strides,
            DType::F32,
        )?;
        let zero_bias = self.tensor(
            "group_norm.zero_bias",
            &unit_dims,
            &unit_strides,
            DType::F32,
        )?;
        let mode = if five {
            NormMode::Instance
        } else {
            NormMode::Layer
        };
        let (xhat, mean, inv_var, _) = self.norm_forward(
            mode,
            x,
            unit_scale,
            Some(zero_bias),
            epsilon,
            training,
            None,
            stats_shapes,
        )?;
        let y = match affine {
            Some((scale, bias)) => {
                let scaled = self.pointwise(PointwiseMode::Mul, xhat, Some(scale))?;
                self.pointwise(PointwiseMode::Add, scaled, Some(bias))?
            }
            None => xhat,
        };
        self.set_name(y, "group_norm.y")?;
        Ok(GroupNormOutputs {
            y,
            stats: mean.zip(inv_var),
            unit_scale,
            zero_bias,
        })
    }

    /// The checks of [`Graph::group_norm_with`] before the graph changes: distinct operands,
    /// x's rank, scale and bias `[1, C, 1, ...]`, operands that are graph inputs no other
    /// operation reads, `groups` dividing `C`, and epsilon.
    fn group_norm_check(
        &self,
        xi: usize,
        affine_idx: Option<(usize, usize)>,
        groups: i64,
        epsilon: f64,
    ) -> Result<()> {
        const OP: &str = "group norm";
        if let Some((si, bi)) = affine_idx {
            if xi == si || xi == bi || si == bi {
                return Err(Error::invalid(
                    "group norm operands",
                    "three distinct tensors x, scale and bias",
                    format!(
                        "`{}`, `{}`, `{}`",
                        self.tensors[xi].name, self.tensors[si].name, self.tensors[bi].name
                    ),
                ));
            }
        }
        self.norm_check_x(NormMode::Instance, OP, xi)?;
        let xd = &self.tensors[xi].dims;
        let param = NormMode::Instance.param_dims(xd);
        const RULE: &str = "group norm scale and bias are [1, C, 1, ...] for x [N, C, ...]";
        let mut operands = vec![xi];
        if let Some((si, bi)) = affine_idx {
            self.norm_check_dims(xi, si, &param, RULE)?;
            self.norm_check_dims(xi, bi, &param, RULE)?;
            operands.extend([si, bi]);
        }
        for &i in &operands {
            let t = &self.tensors[i];
            if t.producer.is_some() || t.consumed {
                return Err(Error::invalid(
                    "group norm operand",
                    "a graph input no other operation reads (it is described in the group view)",
                    format!("`{}`", t.name),
                ));
            }
        }
        let c = xd[1];
        if groups < 1 || c % groups != 0 {
            return Err(Error::invalid(
                "group norm groups",
                format!("a divisor of the channel count {c}"),
                format!("{groups} groups for `{}`", self.tensors[xi].name),
            ));
        }
        Self::norm_check_epsilon(NormMode::Instance, epsilon)?;
        Ok(())
    }
}

/// The spatial dimensions of x (dims `xd`, strides `xs`, named `name`) as one strided run:
/// `(extent, stride)`, `(1, 1)` without spatial extent; [`Error::InvalidArgument`] when they
/// do not merge.
fn spatial_run(xd: &[i64], xs: &[i64], name: &str) -> Result<(i64, i64)> {
    // The spatial dimensions merge into one axis of stride `run` when each one's stride is
    // the next one's stride times its extent (extent-1 dimensions don't matter).
    let mut run: Option<(i64, i64)> = None; // (extent so far, stride of the innermost)
    let mut mergeable = true;
    for a in (2..xd.len()).rev() {
        if xd[a] == 1 {
            continue;
        }
        run = match run {
            None => Some((xd[a], xs[a])),
            Some((ext, inner)) => {
                if xs[a] != inner * ext {
                    mergeable = false;
                }
                Some((ext * xd[a], inner))
            }
        };
    }
    if !mergeable {
        return Err(Error::invalid(
            "group norm input layout",
            "spatial dimensions of x that form one strided run (as in packed NCHW or NHWC)",
            format!("`{}` dims {:?} strides {:?}", name, xd, xs),
        ));
    }
    Ok(run.unwrap_or((1, 1)))
}

impl Cudnn {
    /// The per-channel affine step of an unfused group norm, in place:
    /// `y[n, c, ...] = y[n, c, ...] · scale[c] + bias[c]`, as two `cudnnOpTensor` calls
    /// ([`Cudnn::op_tensor_inplace`] with [`OpTensorOp::Mul`], then [`OpTensorOp::Add`]).
    ///
    /// Use it when no engine fuses the affine step with the normalization: build
    /// [`Graph::group_norm_with`] with `affine = None`, mark its y as an output bound to a
    /// buffer laid out like x, execute, then call this with `y_desc` describing that buffer in
    /// x's declared shape `[N, C, spatial...]` and layout (the group view addresses the same
    /// elements), and `param_desc` `[1, C, 1, ...]` for `scale` and `bias` (of y's type:
    /// `cudnnOpTensor` takes one data type).
    ///
    /// Checks as [`Cudnn::op_tensor_inplace`] (spans, context, non-overlapping output), plus
    /// `param_desc` of dimensions `[1, C, 1, ...]` for y `[N, C, ...]`
    /// ([`Error::ShapeMismatch`] otherwise), before anything is enqueued.
    ///
    /// ```no_run
    /// use cudnn_safe::{cuda_context, Cudnn, TensorDesc};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let y_desc = TensorDesc::<f32>::nchw(8, 64, 32, 32)?;
    /// let p_desc = TensorDesc::<f32>::nchw(1, 64, 1, 1)?;
    /// // y holds the group-normalized x (a `group_norm_with(.., None, ..)` graph's output).
    /// let mut y = stream.alloc_zeros::<f32>(8 * 64 * 32 * 32).unwrap();
    /// let gamma = stream.clone_htod(&vec![1f32; 64]).unwrap();
    /// let beta = stream.alloc_zeros::<f32>(64).unwrap();
    /// cudnn.group_norm_affine(&y_desc, &mut y, &p_desc, &gamma, &beta)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cudnnOpTensor")]
    #[doc(alias = "GroupNorm")]
    pub fn group_norm_affine<T: DataType>(
        &self,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
        param_desc: &TensorDesc<T>,
        scale: &impl DeviceBuffer<T>,
        bias: &impl DeviceBuffer<T>,
    ) -> Result<()> {
        let yd = y_desc.dims();
        let pd = param_desc.dims();
        let ok = yd.len() >= 2 && pd == NormMode::Instance.param_dims(yd);
        if !ok {
            return Err(Error::ShapeMismatch {
                a: "y",
                a_dims: yd.to_vec(),
                b: "scale/bias",
                b_dims: pd.to_vec(),
                rule: "group norm scale and bias are [1, C, 1, ...] for y [N, C, ...]",
            });
        }
        // Both launches are checked before the first is enqueued: they check the same buffers
        // against the same descriptors, so the second can only fail where the first did.
        self.check_tensor("scale", param_desc.layout(), scale, false)?;
        self.check_tensor("bias", param_desc.layout(), bias, false)?;
        self.check_tensor("y", y_desc.layout(), y, true)?;
        let one = T::Scalar::from_f64(1.0);
        let zero = T::Scalar::from_f64(0.0);
        self.op_tensor_inplace(
            OpTensorOp::Mul,
            one,
            one,
            param_desc,
            scale,
            zero,
            y_desc,
            y,
        )?;
        self.op_tensor_inplace(OpTensorOp::Add, one, one, param_desc, bias, zero, y_desc, y)
    }
}
