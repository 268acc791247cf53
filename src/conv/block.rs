//! `y = relu(conv(x, w) + b + z)` as one cuDNN graph: the convolution layer of a network whose
//! batch norm is folded into its weights ([`crate::norm::fold_batch_norm`]), with the residual
//! add and the ReLU as the convolution's epilogue.
use cudarc::driver::CudaView;

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::graph::{
    Args, ConvParams, Graph, OperationGraph, PlanCache, PlanFilter, PointwiseMode, TensorId,
};
use crate::handle::Cudnn;
use crate::tune::plan::Policy;
use crate::workspace::Workspace;

/// What follows the convolution and its bias in a [`FusedConv`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// Adds a residual `z` of the output's shape (a ResNet block's skip connection).
    pub residual: bool,
    /// Applies ReLU last.
    pub relu: bool,
}

/// One convolution layer as one cuDNN graph, channels-last:
/// `y = [relu](conv(x, w) + b [+ z])`, with `f32` accumulation and intermediates.
///
/// The graph is built once ([`FusedConv::new`]); [`run`](FusedConv::run) picks its plan through
/// a [`PlanCache`] — the cached or persisted choice, or else the fastest of the filter's
/// plans timed on the call's own buffers ([`PlanCache::get_or_autotune`]) — and executes it.
/// Layers of the same shape share one cached plan.
///
/// ```no_run
/// use cudnn_safe::conv::{Epilogue, FusedConv};
/// use cudnn_safe::graph::{ConvParams, PlanCache};
/// use cudnn_safe::half::f16;
/// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let cudnn = Cudnn::new(stream.clone())?;
/// // 3×3, 64 → 64 channels, padding 1, plus the skip connection and ReLU.
/// let epi = Epilogue { residual: true, relu: true };
/// let params = ConvParams::new(2).with_padding(&[1, 1]);
/// let layer = FusedConv::new(&cudnn, DType::F16, [32, 64, 56, 56], [64, 64, 3, 3], &params, epi)?;
/// let alloc = |n| stream.alloc_zeros::<f16>(n);
/// let (x, w, b) = (alloc(layer.x_span())?, alloc(layer.w_span())?, alloc(layer.b_span())?);
/// let (z, mut y) = (alloc(layer.y_span())?, alloc(layer.y_span())?);
/// let (mut plans, mut ws) = (PlanCache::new(), Workspace::new(stream.clone()));
/// layer.run(&cudnn, &mut plans, &x, &w, &b, Some(z.as_view()), &mut y, &mut ws)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FusedConv {
    og: OperationGraph,
    x: TensorId,
    w: TensorId,
    b: TensorId,
    z: Option<TensorId>,
    y: TensorId,
    y_dims: Vec<i64>,
    epilogue: Epilogue,
    filter: PlanFilter,
    policy: Policy,
}

impl FusedConv {
    /// Builds the graph on `cudnn`: `x` `[N, C, H, W]` and `w` `[K, C/groups, R, S]` (dims in
    /// that order, stored channels-last), bias `[1, K, 1, 1]`, `z` and `y` of the output's
    /// shape, every tensor of `dtype`. Shapes are checked here; [`Error::NoEngine`] comes from
    /// the first [`run`](Self::run) when no engine runs the graph.
    pub fn new(
        cudnn: &Cudnn,
        dtype: DType,
        x: [i64; 4],
        w: [i64; 4],
        params: &ConvParams,
        epilogue: Epilogue,
    ) -> Result<FusedConv> {
        if params.spatial_dims() != 2 {
            return Err(Error::invalid(
                "convolution parameters",
                "2 spatial dimensions (a [N, C, H, W] input)",
                format!("{} spatial dimensions", params.spatial_dims()),
            ));
        }
        let mut g = Graph::new(dtype, DType::F32, DType::F32);
        let xt = g.tensor_nhwc("x", &x, dtype)?;
        let wt = g.tensor_nhwc("w", &w, dtype)?;
        let bt = g.tensor_nhwc("b", &[1, w[0], 1, 1], dtype)?;
        let mut t = g.conv_fprop(xt, wt, params)?;
        t = g.bias(t, bt)?;
        let y_dims = g.dims(t)?.to_vec();
        let z = if epilogue.residual {
            let zt = g.tensor_nhwc("z", &y_dims, dtype)?;
            t = g.pointwise(PointwiseMode::Add, t, Some(zt))?;
            Some(zt)
        } else {
            None
        };
        if epilogue.relu {
            t = g.pointwise(PointwiseMode::Relu, t, None)?;
        }
        g.set_name(t, "y")?;
        g.mark_output_as(t, dtype)?;
        Ok(FusedConv {
            og: g.build(cudnn)?,
            x: xt,
            w: wt,
            b: bt,
            z,
            y: t,
            y_dims,
            epilogue,
            filter: PlanFilter::default(),
            policy: Policy::default(),
        })
    }

    /// Which plans a first [`run`](Self::run) times (default: [`PlanFilter::default`]; a
    /// `with_max_plans` bound makes the first call cheaper).
    #[must_use]
    pub fn with_filter(mut self, filter: PlanFilter) -> Self {
        self.filter = filter;
        self
    }

    /// How a first [`run`](Self::run) times the plans (default: [`Policy::default`]).
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// What follows the convolution and its bias.
    pub fn epilogue(&self) -> Epilogue {
        self.epilogue
    }

    /// The output's dims, `[N, K, P, Q]`.
    pub fn y_dims(&self) -> &[i64] {
        &self.y_dims
    }

    /// Elements the input buffer must hold.
    pub fn x_span(&self) -> usize {
        self.span(self.x)
    }

    /// Elements the filter buffer must hold.
    pub fn w_span(&self) -> usize {
        self.span(self.w)
    }

    /// Elements the bias buffer must hold (`K`).
    pub fn b_span(&self) -> usize {
        self.span(self.b)
    }

    /// Elements the output (and residual) buffer must hold.
    pub fn y_span(&self) -> usize {
        self.span(self.y)
    }

    fn span(&self, t: TensorId) -> usize {
        // Every tensor here is bound to a buffer, so its span exists.
        self.og.span(t).unwrap_or(0)
    }

    /// The built graph (for its signature, or to choose plans directly).
    pub fn graph(&self) -> &OperationGraph {
        &self.og
    }

    /// Executes `y = [relu](conv(x, w) + b [+ z])` on the handle's stream with the plan `plans`
    /// holds for this graph — chosen now, by timing the filter's plans on these buffers, when
    /// it holds none (which grows `ws` as the plans need; not possible during a
    /// [capture](crate::capture)).
    ///
    /// `z` must be given exactly when the epilogue has a residual. Every buffer is checked
    /// ([`Cudnn::execute`]): its data type, its length against the tensor's span, its context.
    #[allow(clippy::too_many_arguments)] // the graph's five tensors, the plan cache, the workspace
    pub fn run<T: DataType>(
        &self,
        cudnn: &Cudnn,
        plans: &mut PlanCache,
        x: &impl DeviceBuffer<T>,
        w: &impl DeviceBuffer<T>,
        b: &impl DeviceBuffer<T>,
        z: Option<CudaView<'_, T>>,
        y: &mut impl DeviceBufferMut<T>,
        ws: &mut Workspace,
    ) -> Result<()> {
        let mut args = Args::new(cudnn);
        args.input(self.x, x)?.input(self.w, w)?.input(self.b, b)?;
        match (self.z, z.as_ref()) {
            (Some(id), Some(z)) => {
                args.input(id, z)?;
            }
            (None, None) => {}
            (expected, _) => {
                return Err(Error::invalid(
                    "residual `z`",
                    if expected.is_some() {
                        "a buffer (the epilogue adds a residual)"
                    } else {
                        "None (the epilogue has no residual)"
                    },
                    if expected.is_some() {
                        "None"
                    } else {
                        "a buffer"
                    },
                ))
            }
        }
        args.output(self.y, y)?;
        let plan = plans.get_or_autotune(cudnn, &self.og, &self.filter, &args, ws, &self.policy)?;
        cudnn.execute(plan, &args, ws)
    }
}
