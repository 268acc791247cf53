//! Normalizations in a graph: cuDNN's `CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR` and
//! `..._NORM_BACKWARD_DESCRIPTOR` in layer, RMS, instance and batch mode, and group
//! normalization built on layer norm over a regrouped view plus a per-channel affine step.
//!
//! The tensor sets and shapes follow cudnn-frontend's nodes (`layernorm.h`, `rmsnorm.h`,
//! `instancenorm.h`, `batchnorm.h`, `batchnorm_inference.h`, `dbn.h`):
//!
//! | mode | x | scale, bias | statistics |
//! |---|---|---|---|
//! | layer | `[N, D...]` | `[1, D...]` | mean, inv_var `[N, 1...]` |
//! | RMS | `[N, D...]` | `[1, D...]` (bias optional) | inv_var `[N, 1...]` |
//! | instance | `[N, C, spatial...]` | `[1, C, 1...]` | mean, inv_var `[N, C, 1...]` |
//! | batch | `[N, C, spatial...]` | `[1, C, 1...]` | mean, inv_var (and running mean / var) `[1, C, 1...]` |
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, Attr, Desc};
use super::{stride_order, Graph, Op, PointwiseMode, TensorId};

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType, Scalar};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::ops::OpTensorOp;
use crate::tensor::{Layout, TensorDesc};

/// Outputs of [`Graph::layer_norm_backward`], [`Graph::instance_norm_backward`] and
/// [`Graph::batch_norm_backward`]: virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerNormGrads {
    /// Gradient with respect to x (x's dimensions, laid out like dy).
    pub dx: TensorId,
    /// Gradient with respect to the scale (the scale's dimensions and layout).
    pub dscale: TensorId,
    /// Gradient with respect to the bias (the scale's dimensions and layout).
    pub dbias: TensorId,
}

/// Outputs of [`Graph::layer_norm`] and [`Graph::instance_norm`]: virtual until marked as
/// outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerNormOutputs {
    /// The normalized, scaled and shifted x (x's dimensions and layout).
    pub y: TensorId,
    /// Training phase only: the mean and inverse standard deviation `1 / √(var + ε)` (biased
    /// variance) per normalized group (`[N, 1, ...]` for layer norm, `[N, C, 1, ...]` for
    /// instance norm), which the backward operation reads.
    pub stats: Option<(TensorId, TensorId)>,
}

/// Outputs of [`Graph::rms_norm`]: virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmsNormOutputs {
    /// The normalized and scaled (and shifted, with a bias) x (x's dimensions and layout).
    pub y: TensorId,
    /// Training phase only: the inverse root mean square `1 / √(mean(x²) + ε)` per row
    /// `[N, 1, ...]`, which [`Graph::rms_norm_backward`] reads.
    pub inv_rms: Option<TensorId>,
}

/// Outputs of [`Graph::rms_norm_backward`]: virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmsNormGrads {
    /// Gradient with respect to x (x's dimensions, laid out like dy).
    pub dx: TensorId,
    /// Gradient with respect to the scale (the scale's dimensions and layout).
    pub dscale: TensorId,
    /// Gradient with respect to the bias, when asked for (the scale's dimensions and layout).
    pub dbias: Option<TensorId>,
}

/// Running statistics a training batch norm ([`Graph::batch_norm`]) updates:
/// `next = (1 − momentum) · prev + momentum · batch statistic`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormRunning {
    /// The running mean before this step, `[1, C, 1, ...]` (a graph input).
    pub mean: TensorId,
    /// The running variance before this step, `[1, C, 1, ...]` (a graph input).
    pub var: TensorId,
    /// Weight of the batch statistics, in `[0, 1]` (PyTorch's `momentum`, 0.1 by default).
    pub momentum: f64,
}

/// Outputs of [`Graph::batch_norm`] (training phase): virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchNormOutputs {
    /// The normalized, scaled and shifted x (x's dimensions and layout).
    pub y: TensorId,
    /// The batch mean per channel `[1, C, 1, ...]`.
    pub mean: TensorId,
    /// The batch inverse standard deviation `1 / √(var + ε)` per channel (biased variance).
    pub inv_var: TensorId,
    /// With [`BatchNormRunning`]: the updated running mean and variance `[1, C, 1, ...]`.
    pub running: Option<(TensorId, TensorId)>,
}

/// How [`Graph::group_norm_with`] expresses group normalization with cuDNN's normalization
/// operations (cuDNN has no group-norm engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GroupNormMethod {
    /// Instance norm (`CUDNN_INSTANCE_NORM`) on x viewed as `[N, G, C/G, S, 1]`: the groups
    /// are the instance norm's channels. The default: cuDNN 9.14 has instance-norm engines for
    /// f32, f16 and bf16 channels-last data.
    #[default]
    InstanceNormView,
    /// Layer norm (`CUDNN_LAYER_NORM`) on x viewed as `[N, G, C/G, S]`, normalizing the last
    /// two axes (the formulation of earlier versions of this crate).
    LayerNormView,
}

/// Outputs of [`Graph::group_norm`] and [`Graph::group_norm_with`]: virtual until marked as
/// outputs, plus the two constant inputs the graph needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupNormOutputs {
    /// The normalized (and, with the affine step, scaled and shifted) x, with the dimensions of
    /// the group view (`[N, G, C/G, S, 1]` or `[N, G, C/G, S]`, see [`GroupNormMethod`]) and
    /// x's memory layout (a buffer laid out like x fits it).
    pub y: TensorId,
    /// Training phase only: mean and inverse standard deviation per `(n, group)`,
    /// `[N, G, 1, 1, 1]` ([`GroupNormMethod::InstanceNormView`]) or `[N, G, 1, 1]`
    /// ([`GroupNormMethod::LayerNormView`]).
    pub stats: Option<(TensorId, TensorId)>,
    /// An f32 graph input the caller binds to a buffer of ones (the normalization's unit
    /// scale): `[1, G, 1, 1, 1]` or `[1, 1, C/G, S]`.
    pub unit_scale: TensorId,
    /// An f32 graph input the caller binds to a buffer of zeros (the normalization's zero
    /// bias), with the unit scale's dimensions.
    pub zero_bias: TensorId,
}

/// cuDNN's normalization modes (`cudnnBackendNormMode_t`) this crate lowers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(crate) enum NormMode {
    Layer,
    Rms,
    Instance,
    Batch,
}

impl NormMode {
    fn raw(self) -> sys::cudnnBackendNormMode_t {
        use sys::cudnnBackendNormMode_t as M;
        match self {
            NormMode::Layer => M::CUDNN_LAYER_NORM,
            NormMode::Rms => M::CUDNN_RMS_NORM,
            NormMode::Instance => M::CUDNN_INSTANCE_NORM,
            NormMode::Batch => M::CUDNN_BATCH_NORM,
        }
    }

    fn label(self) -> &'static str {
        match self {
            NormMode::Layer => "layer norm",
            NormMode::Rms => "RMS norm",
            NormMode::Instance => "instance norm",
            NormMode::Batch => "batch norm",
        }
    }

    /// `[1, D...]` (layer, RMS) or `[1, C, 1...]` (instance, batch) for x `[N, ...]`.
    fn param_dims(self, x: &[i64]) -> Vec<i64> {
        match self {
            NormMode::Layer | NormMode::Rms => {
                let mut p = x.to_vec();
                p[0] = 1;
                p
            }
            NormMode::Instance | NormMode::Batch => {
                let mut p = vec![1; x.len()];
                p[1] = x[1];
                p
            }
        }
    }

    /// `[N, 1...]` (layer, RMS), `[N, C, 1...]` (instance) or `[1, C, 1...]` (batch).
    fn stats_dims(self, x: &[i64]) -> Vec<i64> {
        let mut s = vec![1; x.len()];
        match self {
            NormMode::Layer | NormMode::Rms => s[0] = x[0],
            NormMode::Instance => {
                s[0] = x[0];
                s[1] = x[1];
            }
            NormMode::Batch => s[1] = x[1],
        }
        s
    }
}

/// Running-statistics tensors of a training batch norm (indices into `Graph::tensors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RunningIdx {
    momentum: usize,
    prev_mean: usize,
    prev_var: usize,
    next_mean: usize,
    next_var: usize,
}

/// A `NORM_FORWARD` operation (tensor indices into `Graph::tensors`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct NormFwdOp {
    mode: NormMode,
    x: usize,
    scale: usize,
    bias: Option<usize>,
    /// `None` for batch-norm inference, which reads the inverse variance instead.
    epsilon: Option<usize>,
    y: usize,
    training: bool,
    /// Outputs in the training phase; inputs for batch-norm inference.
    mean: Option<usize>,
    inv_var: Option<usize>,
    running: Option<RunningIdx>,
}

/// A `NORM_BACKWARD` operation (tensor indices into `Graph::tensors`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct NormBwdOp {
    mode: NormMode,
    dy: usize,
    x: usize,
    scale: usize,
    /// `None` for RMS norm (no mean).
    mean: Option<usize>,
    inv_var: usize,
    dx: usize,
    dscale: usize,
    dbias: Option<usize>,
}

/// Sets each present tensor of `tensors` (an attribute and an index into `t`, the graph's tensor
/// descriptors) on `o`, in the order given; absent ones are not set.
fn set_tensor_descs(o: &mut Desc, t: &[Desc], tensors: &[(Attr, Option<usize>)]) -> Result<()> {
    for &(a, i) in tensors {
        if let Some(i) = i {
            o.set_descs(a, &[&t[i]])?;
        }
    }
    Ok(())
}

/// Data types the norm engines take: f32, f16 and bf16 (cudnn-frontend's norm samples and tests
/// use nothing else; there is no f64 norm engine).
fn check_norm_type(g: &Graph, op: &'static str, tensors: &[usize]) -> Result<()> {
    for &i in tensors {
        let t = &g.tensors[i];
        if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(Error::UnsupportedDataType {
                op,
                detail: format!(
                    "`{}` is {} (cuDNN's normalization engines take f32, f16 or bf16)",
                    t.name, t.dtype
                ),
            });
        }
    }
    Ok(())
}

impl NormFwdOp {
    pub(crate) fn reads(&self) -> Vec<usize> {
        let mut r = vec![self.x, self.scale];
        r.extend(self.bias);
        r.extend(self.epsilon);
        if !self.training {
            r.extend(self.mean);
            r.extend(self.inv_var);
        }
        if let Some(run) = self.running {
            r.extend([run.momentum, run.prev_mean, run.prev_var]);
        }
        r
    }

    pub(crate) fn writes(&self) -> Vec<usize> {
        let mut w = vec![self.y];
        if self.training {
            w.extend(self.mean);
            w.extend(self.inv_var);
        }
        if let Some(run) = self.running {
            w.extend([run.next_mean, run.next_var]);
        }
        w
    }

    pub(crate) fn name(&self) -> &'static str {
        names(self.mode).fwd
    }

    /// The operation's part of [`Graph::signature`] (layer norm keeps its earlier spelling,
    /// so plan-cache files written before the other modes existed still match).
    pub(crate) fn signature(&self) -> String {
        let Self {
            mode,
            x,
            scale,
            bias,
            epsilon,
            y,
            training,
            mean,
            inv_var,
            running,
        } = self;
        match (mode, bias, epsilon) {
            (NormMode::Layer, Some(b), Some(e)) => {
                let stats = mean.zip(*inv_var);
                format!("ln({x},{scale},{b},{e},{y},{stats:?});")
            }
            _ => format!(
                "norm({mode:?},{x},{scale},{bias:?},{epsilon:?},{y},{training},{mean:?},{inv_var:?},{running:?});"
            ),
        }
    }

    /// The finalized operation descriptor; `t` holds the graph's tensor descriptors.
    pub(crate) fn desc(&self, g: &Graph, lib: &'static Library, t: &[Desc]) -> Result<Desc> {
        let name = self.name();
        let mut all = vec![self.x, self.scale, self.y];
        all.extend(self.bias);
        all.extend(self.mean);
        all.extend(self.inv_var);
        if let Some(r) = self.running {
            all.extend([r.prev_mean, r.prev_var, r.next_mean, r.next_var]);
        }
        check_norm_type(g, name, &all)?;
        let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR))?;
        o.set1(attr!(CUDNN_ATTR_OPERATION_NORM_FWD_MODE), self.mode.raw())?;
        let phase = if self.training {
            sys::cudnnBackendNormFwdPhase_t::CUDNN_NORM_FWD_TRAINING
        } else {
            sys::cudnnBackendNormFwdPhase_t::CUDNN_NORM_FWD_INFERENCE
        };
        o.set1(attr!(CUDNN_ATTR_OPERATION_NORM_FWD_PHASE), phase)?;
        let run = self.running;
        set_tensor_descs(
            &mut o,
            t,
            &[
                (attr!(CUDNN_ATTR_OPERATION_NORM_FWD_XDESC), Some(self.x)),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC),
                    Some(self.scale),
                ),
                (attr!(CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC), self.bias),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC),
                    self.epsilon,
                ),
                (attr!(CUDNN_ATTR_OPERATION_NORM_FWD_YDESC), Some(self.y)),
                (attr!(CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC), self.mean),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC),
                    self.inv_var,
                ),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC),
                    run.map(|r| r.momentum),
                ),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC),
                    run.map(|r| r.prev_mean),
                ),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC),
                    run.map(|r| r.prev_var),
                ),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC),
                    run.map(|r| r.next_mean),
                ),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC),
                    run.map(|r| r.next_var),
                ),
            ],
        )?;
        o.finalize()?;
        Ok(o)
    }
}

impl NormBwdOp {
    pub(crate) fn reads(&self) -> Vec<usize> {
        let mut r = vec![self.dy, self.x, self.scale];
        r.extend(self.mean);
        r.push(self.inv_var);
        r
    }

    pub(crate) fn writes(&self) -> Vec<usize> {
        let mut w = vec![self.dx, self.dscale];
        w.extend(self.dbias);
        w
    }

    pub(crate) fn name(&self) -> &'static str {
        names(self.mode).bwd
    }

    /// The operation's part of [`Graph::signature`] (layer norm keeps its earlier spelling).
    pub(crate) fn signature(&self) -> String {
        let Self {
            mode,
            dy,
            x,
            scale,
            mean,
            inv_var,
            dx,
            dscale,
            dbias,
        } = self;
        match (mode, mean, dbias) {
            (NormMode::Layer, Some(m), Some(db)) => {
                format!("lnb({dy},{x},{scale},{m},{inv_var},{dx},{dscale},{db});")
            }
            _ => format!(
                "normb({mode:?},{dy},{x},{scale},{mean:?},{inv_var},{dx},{dscale},{dbias:?});"
            ),
        }
    }

    /// The finalized operation descriptor; `t` holds the graph's tensor descriptors.
    pub(crate) fn desc(&self, g: &Graph, lib: &'static Library, t: &[Desc]) -> Result<Desc> {
        let name = self.name();
        let mut all = vec![
            self.dy,
            self.x,
            self.scale,
            self.inv_var,
            self.dx,
            self.dscale,
        ];
        all.extend(self.mean);
        all.extend(self.dbias);
        check_norm_type(g, name, &all)?;
        let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR))?;
        o.set1(attr!(CUDNN_ATTR_OPERATION_NORM_BWD_MODE), self.mode.raw())?;
        // No epsilon: cuDNN ≥ 8.9.6 takes the saved inverse variance instead (cudnn-frontend
        // sets the epsilon descriptor only for older versions).
        set_tensor_descs(
            &mut o,
            t,
            &[
                (attr!(CUDNN_ATTR_OPERATION_NORM_BWD_XDESC), Some(self.x)),
                (attr!(CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC), Some(self.dy)),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC),
                    Some(self.scale),
                ),
                (attr!(CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC), self.mean),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC),
                    Some(self.inv_var),
                ),
                (
                    attr!(CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC),
                    Some(self.dscale),
                ),
                (attr!(CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC), self.dbias),
                (attr!(CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC), Some(self.dx)),
            ],
        )?;
        o.finalize()?;
        Ok(o)
    }
}

/// The names of a mode's forward and backward operations, and those they give their scalar and
/// output tensors (they appear in errors).
struct Names {
    fwd: &'static str,
    bwd: &'static str,
    epsilon: &'static str,
    y: &'static str,
    mean: &'static str,
    inv_var: &'static str,
    dx: &'static str,
    dscale: &'static str,
    dbias: &'static str,
}

fn names(mode: NormMode) -> Names {
    match mode {
        NormMode::Layer => Names {
            fwd: "layer norm forward",
            bwd: "layer norm backward",
            epsilon: "layer_norm.epsilon",
            y: "layer_norm.y",
            mean: "layer_norm.mean",
            inv_var: "layer_norm.inv_var",
            dx: "layer_norm_bwd.dx",
            dscale: "layer_norm_bwd.dscale",
            dbias: "layer_norm_bwd.dbias",
        },
        NormMode::Rms => Names {
            fwd: "RMS norm forward",
            bwd: "RMS norm backward",
            epsilon: "rms_norm.epsilon",
            y: "rms_norm.y",
            mean: "rms_norm.mean",
            inv_var: "rms_norm.inv_rms",
            dx: "rms_norm_bwd.dx",
            dscale: "rms_norm_bwd.dscale",
            dbias: "rms_norm_bwd.dbias",
        },
        NormMode::Instance => Names {
            fwd: "instance norm forward",
            bwd: "instance norm backward",
            epsilon: "instance_norm.epsilon",
            y: "instance_norm.y",
            mean: "instance_norm.mean",
            inv_var: "instance_norm.inv_var",
            dx: "instance_norm_bwd.dx",
            dscale: "instance_norm_bwd.dscale",
            dbias: "instance_norm_bwd.dbias",
        },
        NormMode::Batch => Names {
            fwd: "batch norm forward",
            bwd: "batch norm backward",
            epsilon: "batch_norm.epsilon",
            y: "batch_norm.y",
            mean: "batch_norm.mean",
            inv_var: "batch_norm.inv_var",
            dx: "batch_norm_bwd.dx",
            dscale: "batch_norm_bwd.dscale",
            dbias: "batch_norm_bwd.dbias",
        },
    }
}

/// The shape rules, as [`Error::ShapeMismatch`] states them.
fn param_rule(mode: NormMode) -> &'static str {
    match mode {
        NormMode::Layer => "layer norm scale and bias have x's dimensions with N = 1",
        NormMode::Rms => "RMS norm scale and bias have x's dimensions with N = 1",
        NormMode::Instance => "instance norm scale and bias are [1, C, 1, ...] for x [N, C, ...]",
        NormMode::Batch => "batch norm scale and bias are [1, C, 1, ...] for x [N, C, ...]",
    }
}

fn stats_rule(mode: NormMode) -> &'static str {
    match mode {
        NormMode::Layer => "layer norm mean and inv_var are [N, 1, ...] for x [N, ...]",
        NormMode::Rms => "RMS norm inv_rms is [N, 1, ...] for x [N, ...]",
        NormMode::Instance => "instance norm mean and inv_var are [N, C, 1, ...] for x [N, C, ...]",
        NormMode::Batch => {
            "batch norm mean, inv_var and running statistics are [1, C, 1, ...] for x [N, C, ...]"
        }
    }
}

/// Shapes of a forward operation: (scale and bias dims, statistics dims).
type Shapes = (Vec<i64>, Vec<i64>);

/// A tensor's (dims, strides).
type DimsStrides = (Vec<i64>, Vec<i64>);

/// What a forward operation produced: y, mean, inverse variance, next running statistics.
type FwdOut = (
    TensorId,
    Option<TensorId>,
    Option<TensorId>,
    Option<(TensorId, TensorId)>,
);

impl Graph {
    /// `x` must be an ordinary tensor of rank 4 or 5.
    fn norm_check_x(&self, mode: NormMode, op: &'static str, xi: usize) -> Result<()> {
        let xt = &self.tensors[xi];
        if !(4..=5).contains(&xt.dims.len()) || xt.scalar.is_some() {
            let want = match mode {
                NormMode::Layer | NormMode::Rms => {
                    "x of 4 or 5 dimensions ([N, D, 1, 1] for rows of length D)"
                }
                NormMode::Instance | NormMode::Batch => {
                    "x of 4 or 5 dimensions ([N, C, spatial...])"
                }
            };
            return Err(Error::invalid(
                "normalization operand rank",
                format!("{op}: {want}"),
                format!("`{}` with dims {:?}", xt.name, xt.dims),
            ));
        }
        Ok(())
    }

    /// `t` has dimensions `want` (and is not a by-value scalar).
    fn norm_check_dims(
        &self,
        xi: usize,
        ti: usize,
        want: &[i64],
        rule: &'static str,
    ) -> Result<()> {
        let (xt, tt) = (&self.tensors[xi], &self.tensors[ti]);
        if tt.dims != want || tt.scalar.is_some() {
            return Err(xt.shape_mismatch(tt, rule));
        }
        Ok(())
    }

    fn norm_check_epsilon(mode: NormMode, epsilon: f64) -> Result<()> {
        if !epsilon.is_finite() || epsilon < 0.0 {
            return Err(Error::invalid(
                "normalization epsilon",
                format!("{}: a finite value ≥ 0", mode.label()),
                format!("{epsilon}"),
            ));
        }
        Ok(())
    }

    /// Adds a forward operation in the training phase (or the inference phase of layer, RMS
    /// and instance norm). Every check runs before the graph changes, so a rejected call
    /// leaves it as it was.
    #[allow(clippy::too_many_arguments)]
    fn norm_forward(
        &mut self,
        mode: NormMode,
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
        epsilon: f64,
        training: bool,
        running: Option<BatchNormRunning>,
        shapes: Option<Shapes>,
    ) -> Result<FwdOut> {
        let n = names(mode);
        let op = n.fwd;
        let xi = self.index(x)?;
        let si = self.index(scale)?;
        let bi = bias.map(|b| self.index(b)).transpose()?;
        self.norm_check_x(mode, op, xi)?;
        let (param, stats_dims) = shapes.unwrap_or_else(|| {
            let d = &self.tensors[xi].dims;
            (mode.param_dims(d), mode.stats_dims(d))
        });
        self.norm_check_dims(xi, si, &param, param_rule(mode))?;
        if let Some(bi) = bi {
            self.norm_check_dims(xi, bi, &param, param_rule(mode))?;
        }
        Self::norm_check_epsilon(mode, epsilon)?;
        if let Some(r) = running {
            let (mi, vi) = (self.index(r.mean)?, self.index(r.var)?);
            self.norm_check_dims(xi, mi, &stats_dims, stats_rule(mode))?;
            self.norm_check_dims(xi, vi, &stats_dims, stats_rule(mode))?;
            if !(0.0..=1.0).contains(&r.momentum) {
                return Err(Error::invalid(
                    "batch norm momentum",
                    "a value in [0, 1]",
                    format!("{}", r.momentum),
                ));
            }
        }
        let r = self.tensors[xi].dims.len();
        let dims = self.tensors[xi].dims.clone();
        let order = stride_order(&self.tensors[xi].strides);
        let eps = self.scalar(n.epsilon, epsilon, DType::F32)?;
        let xi = self.operand(x, None, op)?;
        let si = self.operand(scale, None, op)?;
        let bi = bias.map(|b| self.operand(b, None, op)).transpose()?;
        let ei = self.operand(eps, Some(r), op)?;
        let running_in = match running {
            Some(run) => {
                let m = self.scalar("batch_norm.momentum", run.momentum, DType::F32)?;
                let mi = self.operand(m, Some(r), op)?;
                let pm = self.operand(run.mean, None, op)?;
                let pv = self.operand(run.var, None, op)?;
                let p_order = stride_order(&self.tensors[pm].strides);
                Some((mi, pm, pv, p_order))
            }
            None => None,
        };
        let opi = self.ops.len();
        let y = self.output(n.y, dims, &order, opi)?;
        let mean = if training && mode != NormMode::Rms {
            Some(self.output(n.mean, stats_dims.clone(), &order, opi)?)
        } else {
            None
        };
        let inv_var = if training {
            Some(self.output(n.inv_var, stats_dims.clone(), &order, opi)?)
        } else {
            None
        };
        let (next, running) = match running_in {
            Some((mi, pm, pv, p_order)) => {
                let nm = self.output(
                    "batch_norm.next_running_mean",
                    stats_dims.clone(),
                    &p_order,
                    opi,
                )?;
                let nv = self.output("batch_norm.next_running_var", stats_dims, &p_order, opi)?;
                let idx = RunningIdx {
                    momentum: mi,
                    prev_mean: pm,
                    prev_var: pv,
                    next_mean: nm.index,
                    next_var: nv.index,
                };
                (Some((nm, nv)), Some(idx))
            }
            None => (None, None),
        };
        self.ops.push(Op::NormFwd(NormFwdOp {
            mode,
            x: xi,
            scale: si,
            bias: bi,
            epsilon: Some(ei),
            y: y.index,
            training,
            mean: mean.map(|t| t.index),
            inv_var: inv_var.map(|t| t.index),
            running,
        }));
        Ok((y, mean, inv_var, next))
    }

    /// Adds a backward operation: dx (laid out like dy), dscale and, with `with_dbias`, dbias
    /// (laid out like the scale).
    #[allow(clippy::too_many_arguments)]
    fn norm_backward(
        &mut self,
        mode: NormMode,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        mean: Option<TensorId>,
        inv_var: TensorId,
        with_dbias: bool,
    ) -> Result<(TensorId, TensorId, Option<TensorId>)> {
        let n = names(mode);
        let op = n.bwd;
        let dyi = self.index(dy)?;
        let xi = self.index(x)?;
        let si = self.index(scale)?;
        let mi = mean.map(|m| self.index(m)).transpose()?;
        let vi = self.index(inv_var)?;
        self.norm_check_x(mode, op, xi)?;
        let x_dims = self.tensors[xi].dims.clone();
        self.norm_check_dims(xi, dyi, &x_dims, "dy and x have the same dimensions")?;
        let param = mode.param_dims(&x_dims);
        let stats_dims = mode.stats_dims(&x_dims);
        let rule = match mode {
            NormMode::Layer => "layer norm scale has x's dimensions with N = 1",
            NormMode::Rms => "RMS norm scale has x's dimensions with N = 1",
            NormMode::Instance => "instance norm scale is [1, C, 1, ...] for x [N, C, ...]",
            NormMode::Batch => "batch norm scale is [1, C, 1, ...] for x [N, C, ...]",
        };
        self.norm_check_dims(xi, si, &param, rule)?;
        if let Some(mi) = mi {
            self.norm_check_dims(xi, mi, &stats_dims, stats_rule(mode))?;
        }
        self.norm_check_dims(xi, vi, &stats_dims, stats_rule(mode))?;
        let dx_order = stride_order(&self.tensors[dyi].strides);
        let p_order = stride_order(&self.tensors[si].strides);
        let dyi = self.operand(dy, None, op)?;
        let xi = self.operand(x, None, op)?;
        let si = self.operand(scale, None, op)?;
        let mi = mean.map(|m| self.operand(m, None, op)).transpose()?;
        let vi = self.operand(inv_var, None, op)?;
        let opi = self.ops.len();
        let dx = self.output(n.dx, x_dims, &dx_order, opi)?;
        let dscale = self.output(n.dscale, param.clone(), &p_order, opi)?;
        let dbias = if with_dbias {
            Some(self.output(n.dbias, param, &p_order, opi)?)
        } else {
            None
        };
        self.ops.push(Op::NormBwd(NormBwdOp {
            mode,
            dy: dyi,
            x: xi,
            scale: si,
            mean: mi,
            inv_var: vi,
            dx: dx.index,
            dscale: dscale.index,
            dbias: dbias.map(|t| t.index),
        }));
        Ok((dx, dscale, dbias))
    }

    /// A forward operation with a bias and no running statistics, its mean and inverse
    /// variance paired (layer and instance norm).
    fn norm_forward_stats(
        &mut self,
        mode: NormMode,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        epsilon: f64,
        training: bool,
    ) -> Result<LayerNormOutputs> {
        let (y, mean, inv_var, _) =
            self.norm_forward(mode, x, scale, Some(bias), epsilon, training, None, None)?;
        Ok(LayerNormOutputs {
            y,
            stats: mean.zip(inv_var),
        })
    }

    /// A backward operation reading the mean and giving dbias (layer, instance and batch norm).
    fn norm_backward_grads(
        &mut self,
        mode: NormMode,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        mean: TensorId,
        inv_var: TensorId,
    ) -> Result<LayerNormGrads> {
        let (dx, dscale, dbias) =
            self.norm_backward(mode, dy, x, scale, Some(mean), inv_var, true)?;
        Ok(LayerNormGrads {
            dx,
            dscale,
            dbias: dbias.expect("asked for dbias"),
        })
    }

    /// Layer normalization forward (`CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR`,
    /// `CUDNN_LAYER_NORM`): each row `x[n, ...]` is normalized over all its other dimensions,
    /// `y = (x − mean) · inv_var · scale + bias` with `inv_var = 1 / √(var + epsilon)` (biased
    /// variance).
    ///
    /// x is `[N, D, 1, 1]` (or any rank-4/5 `[N, ...]`); `scale` and `bias` are `[1, D, 1, 1]`
    /// (x's dimensions with N = 1). cudnn-frontend's samples describe x channels-last
    /// ([`Graph::tensor_nhwc`], strides `[D, 1, D, D]`), with f32 scale and bias also for f16 /
    /// bf16 x, and f32 statistics. `epsilon` (finite, ≥ 0) is handed to cuDNN as an f32 by-value
    /// scalar, as cudnn-frontend does.
    ///
    /// With `training`, the phase is `CUDNN_NORM_FWD_TRAINING` and the per-row mean and inverse
    /// standard deviation `[N, 1, 1, 1]` are outputs too (mark them, typically as f32, or feed
    /// them to [`Graph::layer_norm_backward`]); otherwise the phase is `CUDNN_NORM_FWD_INFERENCE`
    /// and only y is written. y has x's dimensions and memory order.
    ///
    /// Speed: give f16 / bf16 x a scale and bias of x's own type. With f32 scale and bias,
    /// cuDNN 9.14 and 9.19 offer such a layer norm one generic engine only; with scale and bias
    /// of x's type, their fused normalization engines.
    ///
    /// Data types: f32, f16 or bf16 for every tensor of the operation; [`Graph::build`] and
    /// [`Graph::check`] return [`Error::UnsupportedDataType`] for f64 (cuDNN has no f64 norm
    /// engine).
    ///
    /// ```no_run
    /// use cudnn_safe::graph::{Args, Graph, PlanFilter};
    /// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// // Rows of length 1024: half data, f32 scale, bias and statistics.
    /// let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    /// let x = g.tensor_nhwc("x", &[4096, 1024, 1, 1], DType::F16)?;
    /// let scale = g.tensor_nhwc("scale", &[1, 1024, 1, 1], DType::F32)?;
    /// let bias = g.tensor_nhwc("bias", &[1, 1024, 1, 1], DType::F32)?;
    /// let out = g.layer_norm(x, scale, bias, 1e-5, true)?;
    /// let (mean, inv_var) = out.stats.expect("training phase");
    /// g.mark_output(out.y)?;
    /// g.mark_output_as(mean, DType::F32)?;
    /// g.mark_output_as(inv_var, DType::F32)?;
    /// let og = g.build(&cudnn)?;
    /// let plan = og.plans(&cudnn, &PlanFilter::default())?.plans.remove(0);
    ///
    /// let xb = stream.alloc_zeros::<half::f16>(og.span(x)?).unwrap();
    /// let sb = stream.alloc_zeros::<f32>(og.span(scale)?).unwrap();
    /// let bb = stream.alloc_zeros::<f32>(og.span(bias)?).unwrap();
    /// let mut yb = stream.alloc_zeros::<half::f16>(og.span(out.y)?).unwrap();
    /// let mut mb = stream.alloc_zeros::<f32>(og.span(mean)?).unwrap();
    /// let mut vb = stream.alloc_zeros::<f32>(og.span(inv_var)?).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// let mut args = Args::new(&cudnn);
    /// args.input(x, &xb)?.input(scale, &sb)?.input(bias, &bb)?;
    /// args.output(out.y, &mut yb)?.output(mean, &mut mb)?.output(inv_var, &mut vb)?;
    /// cudnn.execute(&plan, &args, &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_LAYER_NORM")]
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        epsilon: f64,
        training: bool,
    ) -> Result<LayerNormOutputs> {
        self.norm_forward_stats(NormMode::Layer, x, scale, bias, epsilon, training)
    }

    /// Layer normalization backward (`CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR`,
    /// `CUDNN_LAYER_NORM`): from the gradient `dy`, the forward input `x`, the `scale` and the
    /// saved `mean` and `inv_var` of the training forward pass, the gradients dx (x's
    /// dimensions, laid out like dy), dscale and dbias (the scale's dimensions and layout).
    ///
    /// Shapes as in [`Graph::layer_norm`]: dy and x `[N, D, 1, 1]`, scale `[1, D, 1, 1]`, mean
    /// and inv_var `[N, 1, 1, 1]`. cudnn-frontend's sample binds f32 scale, statistics, dscale
    /// and dbias with f16 x, dy and dx. No epsilon is needed: inv_var already holds it.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    pub fn layer_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        mean: TensorId,
        inv_var: TensorId,
    ) -> Result<LayerNormGrads> {
        self.norm_backward_grads(NormMode::Layer, dy, x, scale, mean, inv_var)
    }

    /// RMS normalization forward (`CUDNN_RMS_NORM`): each row `x[n, ...]` is scaled by its
    /// inverse root mean square, `y = x · inv_rms · scale (+ bias)` with
    /// `inv_rms = 1 / √(mean(x²) + epsilon)`; no mean is subtracted.
    ///
    /// Shapes as in [`Graph::layer_norm`]: x `[N, D, 1, 1]` (or any rank-4/5 `[N, ...]`),
    /// `scale` and the optional `bias` `[1, D, 1, 1]`. With `training` the phase is
    /// `CUDNN_NORM_FWD_TRAINING` and `inv_rms` `[N, 1, 1, 1]` is an output too (no mean: RMS norm
    /// has none); otherwise only y is written. cudnn-frontend's samples use x `[N, D, 1, 1]`
    /// with strides `[D, 1, D, D]`, f32 statistics, and f32 or half data.
    ///
    /// ```no_run
    /// use cudnn_safe::graph::{Args, Graph, PlanFilter};
    /// use cudnn_safe::{cuda_context, Cudnn, DType, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let mut g = Graph::new(DType::BF16, DType::F32, DType::F32);
    /// let x = g.tensor_nhwc("x", &[4096, 4096, 1, 1], DType::BF16)?;
    /// let scale = g.tensor_nhwc("scale", &[1, 4096, 1, 1], DType::F32)?;
    /// let out = g.rms_norm(x, scale, None, 1e-6, true)?;
    /// let inv_rms = out.inv_rms.expect("training phase");
    /// g.mark_output(out.y)?;
    /// g.mark_output_as(inv_rms, DType::F32)?;
    /// let og = g.build(&cudnn)?;
    /// let plan = og.plans(&cudnn, &PlanFilter::default())?.plans.remove(0);
    ///
    /// let xb = stream.alloc_zeros::<half::bf16>(og.span(x)?).unwrap();
    /// let sb = stream.alloc_zeros::<f32>(og.span(scale)?).unwrap();
    /// let mut yb = stream.alloc_zeros::<half::bf16>(og.span(out.y)?).unwrap();
    /// let mut rb = stream.alloc_zeros::<f32>(og.span(inv_rms)?).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// let mut args = Args::new(&cudnn);
    /// args.input(x, &xb)?.input(scale, &sb)?;
    /// args.output(out.y, &mut yb)?.output(inv_rms, &mut rb)?;
    /// cudnn.execute(&plan, &args, &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_RMS_NORM")]
    pub fn rms_norm(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: Option<TensorId>,
        epsilon: f64,
        training: bool,
    ) -> Result<RmsNormOutputs> {
        let (y, _, inv_rms, _) =
            self.norm_forward(NormMode::Rms, x, scale, bias, epsilon, training, None, None)?;
        Ok(RmsNormOutputs { y, inv_rms })
    }

    /// RMS normalization backward (`CUDNN_RMS_NORM`): from `dy`, the forward input `x`, the
    /// `scale` and the saved `inv_rms` `[N, 1, 1, 1]` of the training forward pass, the
    /// gradients dx (laid out like dy), dscale and, with `with_dbias` (a forward pass with a
    /// bias), dbias (the scale's dimensions and layout).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_RMS_NORM")]
    pub fn rms_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        inv_rms: TensorId,
        with_dbias: bool,
    ) -> Result<RmsNormGrads> {
        let (dx, dscale, dbias) =
            self.norm_backward(NormMode::Rms, dy, x, scale, None, inv_rms, with_dbias)?;
        Ok(RmsNormGrads { dx, dscale, dbias })
    }

    /// Instance normalization forward (`CUDNN_INSTANCE_NORM`): each plane `x[n, c, ...]` is
    /// normalized over its spatial dimensions, `y = (x − mean) · inv_var · scale[c] + bias[c]`
    /// with `inv_var = 1 / √(var + epsilon)` (biased variance).
    ///
    /// x is `[N, C, spatial...]` (rank 4 or 5); `scale` and `bias` are `[1, C, 1, 1]`. With
    /// `training` the per-plane mean and inverse standard deviation `[N, C, 1, 1]` are outputs
    /// too. cudnn-frontend's tests run channels-last f16 / bf16 x, scale and bias in x's type or
    /// f32, and f32 statistics.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_INSTANCE_NORM")]
    pub fn instance_norm(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        epsilon: f64,
        training: bool,
    ) -> Result<LayerNormOutputs> {
        self.norm_forward_stats(NormMode::Instance, x, scale, bias, epsilon, training)
    }

    /// Instance normalization backward (`CUDNN_INSTANCE_NORM`): from `dy`, the forward input
    /// `x`, the `scale` `[1, C, 1, 1]` and the saved `mean` and `inv_var` `[N, C, 1, 1]`, the
    /// gradients dx (laid out like dy), dscale and dbias (the scale's dimensions and layout).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_INSTANCE_NORM")]
    pub fn instance_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        mean: TensorId,
        inv_var: TensorId,
    ) -> Result<LayerNormGrads> {
        self.norm_backward_grads(NormMode::Instance, dy, x, scale, mean, inv_var)
    }

    /// Batch normalization forward, training phase (`CUDNN_BATCH_NORM`,
    /// `CUDNN_NORM_FWD_TRAINING`): each channel `x[:, c, ...]` is normalized over the batch and
    /// spatial dimensions, `y = (x − mean) · inv_var · scale[c] + bias[c]` with
    /// `inv_var = 1 / √(var + epsilon)` (biased variance). The batch mean and inverse standard
    /// deviation `[1, C, 1, 1]` are outputs (for [`Graph::batch_norm_backward`]).
    ///
    /// With `running`, the previous running mean and variance are read and their update
    /// `(1 − momentum) · prev + momentum · batch` is written to two more outputs
    /// ([`BatchNormOutputs::running`]; bind them to other buffers than the previous statistics);
    /// the momentum is an f32 by-value scalar. cuDNN's legacy batch norm and PyTorch update the
    /// running variance with the unbiased batch variance (`· m / (m − 1)` for `m = N·spatial`
    /// elements per channel).
    ///
    /// x is `[N, C, spatial...]` (rank 4 or 5); scale, bias and the running statistics are
    /// `[1, C, 1, 1]`. cudnn-frontend's samples use channels-last f16 x with f32 scale, bias and
    /// statistics.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_BATCH_NORM")]
    pub fn batch_norm(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        epsilon: f64,
        running: Option<BatchNormRunning>,
    ) -> Result<BatchNormOutputs> {
        let (y, mean, inv_var, running) = self.norm_forward(
            NormMode::Batch,
            x,
            scale,
            Some(bias),
            epsilon,
            true,
            running,
            None,
        )?;
        Ok(BatchNormOutputs {
            y,
            mean: mean.expect("training phase"),
            inv_var: inv_var.expect("training phase"),
            running,
        })
    }

    /// Batch normalization forward, inference phase (`CUDNN_BATCH_NORM`,
    /// `CUDNN_NORM_FWD_INFERENCE`): `y = (x − mean) · inv_var · scale + bias` per channel with
    /// the given statistics `mean` and `inv_var` `[1, C, 1, 1]` (inputs; `inv_var` is
    /// `1 / √(running_var + ε)`, so no epsilon is taken, as in cudnn-frontend's
    /// `batchnorm_inference`). Returns y (x's dimensions and layout).
    ///
    /// The descriptor is set as cudnn-frontend's `BatchnormInferenceNode` sets it (mode, phase,
    /// x, mean, inverse variance, scale, bias, y; no epsilon, no running statistics), but
    /// cudnn-frontend runs batch-norm inference only fused into the pattern
    /// `batch_norm_inference → ReLU backward (PointwiseMode::ReluBwd) → batch_norm_backward`
    /// (its sample `BN_inference DRelu DBN Graph`: f16 channels-last x `[4, 32, 16, 16]`, f32
    /// scale, bias, mean and inverse variance `[1, 32, 1, 1]`, y virtual in f32, the ReLU
    /// gradient virtual in f16). A graph of this operation alone was refused by cuDNN 9.14
    /// (f32 channels-last: the heuristics' descriptor did not finalize,
    /// `CUDNN_STATUS_NOT_SUPPORTED`), so [`crate::graph::OperationGraph::plans`] may return a
    /// typed error for it; the legacy `cudnnBatchNormalizationForwardInference`
    /// ([`crate::norm`]) covers standalone inference.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_BATCH_NORM")]
    pub fn batch_norm_inference(
        &mut self,
        x: TensorId,
        scale: TensorId,
        bias: TensorId,
        mean: TensorId,
        inv_var: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "batch norm forward";
        let mode = NormMode::Batch;
        let xi = self.index(x)?;
        let (si, bi) = (self.index(scale)?, self.index(bias)?);
        let (mi, vi) = (self.index(mean)?, self.index(inv_var)?);
        self.norm_check_x(mode, OP, xi)?;
        let dims = self.tensors[xi].dims.clone();
        let param = mode.param_dims(&dims);
        self.norm_check_dims(xi, si, &param, param_rule(mode))?;
        self.norm_check_dims(xi, bi, &param, param_rule(mode))?;
        self.norm_check_dims(xi, mi, &param, stats_rule(mode))?;
        self.norm_check_dims(xi, vi, &param, stats_rule(mode))?;
        let order = stride_order(&self.tensors[xi].strides);
        let xi = self.operand(x, None, OP)?;
        let si = self.operand(scale, None, OP)?;
        let bi = self.operand(bias, None, OP)?;
        let mi = self.operand(mean, None, OP)?;
        let vi = self.operand(inv_var, None, OP)?;
        let y = self.output("batch_norm.y", dims, &order, self.ops.len())?;
        self.ops.push(Op::NormFwd(NormFwdOp {
            mode,
            x: xi,
            scale: si,
            bias: Some(bi),
            epsilon: None,
            y: y.index,
            training: false,
            mean: Some(mi),
            inv_var: Some(vi),
            running: None,
        }));
        Ok(y)
    }

    /// Batch normalization backward (`CUDNN_BATCH_NORM`): from `dy`, the forward input `x`, the
    /// `scale` and the saved batch `mean` and `inv_var` `[1, C, 1, 1]` of the training forward
    /// pass, the gradients dx (laid out like dy), dscale and dbias (the scale's dimensions and
    /// layout).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_BATCH_NORM")]
    pub fn batch_norm_backward(
        &mut self,
        dy: TensorId,
        x: TensorId,
        scale: TensorId,
        mean: TensorId,
        inv_var: TensorId,
    ) -> Result<LayerNormGrads> {
        self.norm_backward_grads(NormMode::Batch, dy, x, scale, mean, inv_var)
    }

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
        const OP: &str = "group norm";
        let xi = self.index(x)?;
        let affine_idx = match affine {
            Some((s, b)) => Some((self.index(s)?, self.index(b)?)),
            None => None,
        };
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
        let xd = self.tensors[xi].dims.clone();
        let param = NormMode::Instance.param_dims(&xd);
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
        // The spatial dimensions merge into one axis of stride `run` when each one's stride is
        // the next one's stride times its extent (extent-1 dimensions don't matter).
        let xs = self.tensors[xi].strides.clone();
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
                format!("`{}` dims {:?} strides {:?}", self.tensors[xi].name, xd, xs),
            ));
        }
        let (s, s_stride) = run.unwrap_or((1, 1));
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
        let unit_strides = super::strides_in_order(&unit_dims, &stride_order(&x_view.1))?;
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
