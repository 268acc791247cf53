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
//!
//! Files: the operations' descriptors (`ops.rs`), the [`Graph`] builder methods (`build.rs`) and
//! group norm built on them (`group.rs`). This folder is compiled as `crate::graph::norm` (a
//! child of the graph module, whose tensor and op tables it extends).
use cudnn_safe_sys as sys;

use super::TensorId;

mod build;
mod group;
mod ops;

pub(crate) use ops::{NormBwdOp, NormFwdOp};

/// Outputs of [`Graph::layer_norm_backward`](super::Graph::layer_norm_backward), [`Graph::instance_norm_backward`](super::Graph::instance_norm_backward) and
/// [`Graph::batch_norm_backward`](super::Graph::batch_norm_backward): virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerNormGrads {
    /// Gradient with respect to x (x's dimensions, laid out like dy).
    pub dx: TensorId,
    /// Gradient with respect to the scale (the scale's dimensions and layout).
    pub dscale: TensorId,
    /// Gradient with respect to the bias (the scale's dimensions and layout).
    pub dbias: TensorId,
}

/// Outputs of [`Graph::layer_norm`](super::Graph::layer_norm) and [`Graph::instance_norm`](super::Graph::instance_norm): virtual until marked as
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

/// Outputs of [`Graph::rms_norm`](super::Graph::rms_norm): virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmsNormOutputs {
    /// The normalized and scaled (and shifted, with a bias) x (x's dimensions and layout).
    pub y: TensorId,
    /// Training phase only: the inverse root mean square `1 / √(mean(x²) + ε)` per row
    /// `[N, 1, ...]`, which [`Graph::rms_norm_backward`](super::Graph::rms_norm_backward) reads.
    pub inv_rms: Option<TensorId>,
}

/// Outputs of [`Graph::rms_norm_backward`](super::Graph::rms_norm_backward): virtual until marked as outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmsNormGrads {
    /// Gradient with respect to x (x's dimensions, laid out like dy).
    pub dx: TensorId,
    /// Gradient with respect to the scale (the scale's dimensions and layout).
    pub dscale: TensorId,
    /// Gradient with respect to the bias, when asked for (the scale's dimensions and layout).
    pub dbias: Option<TensorId>,
}

/// Running statistics a training batch norm ([`Graph::batch_norm`](super::Graph::batch_norm)) updates:
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

/// Outputs of [`Graph::batch_norm`](super::Graph::batch_norm) (training phase): virtual until marked as outputs.
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

/// How [`Graph::group_norm_with`](super::Graph::group_norm_with) expresses group normalization with cuDNN's normalization
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

/// Outputs of [`Graph::group_norm`](super::Graph::group_norm) and [`Graph::group_norm_with`](super::Graph::group_norm_with): virtual until marked as
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
