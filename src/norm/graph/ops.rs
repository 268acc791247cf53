//! The normalization operations of a graph: their tensors, checks and backend descriptors.
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::super::backend::{attr, kind, Attr, Desc};
use super::super::Graph;
use super::{names, NormMode};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Running-statistics tensors of a training batch norm (indices into `Graph::tensors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RunningIdx {
    pub(super) momentum: usize,
    pub(super) prev_mean: usize,
    pub(super) prev_var: usize,
    pub(super) next_mean: usize,
    pub(super) next_var: usize,
}

/// A `NORM_FORWARD` operation (tensor indices into `Graph::tensors`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct NormFwdOp {
    pub(super) mode: NormMode,
    pub(super) x: usize,
    pub(super) scale: usize,
    pub(super) bias: Option<usize>,
    /// `None` for batch-norm inference, which reads the inverse variance instead.
    pub(super) epsilon: Option<usize>,
    pub(super) y: usize,
    pub(super) training: bool,
    /// Outputs in the training phase; inputs for batch-norm inference.
    pub(super) mean: Option<usize>,
    pub(super) inv_var: Option<usize>,
    pub(super) running: Option<RunningIdx>,
}

/// A `NORM_BACKWARD` operation (tensor indices into `Graph::tensors`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct NormBwdOp {
    pub(super) mode: NormMode,
    pub(super) dy: usize,
    pub(super) x: usize,
    pub(super) scale: usize,
    /// `None` for RMS norm (no mean).
    pub(super) mean: Option<usize>,
    pub(super) inv_var: usize,
    pub(super) dx: usize,
    pub(super) dscale: usize,
    pub(super) dbias: Option<usize>,
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
    /// The operands cuDNN reads by value: epsilon and the running averages' momentum.
    pub(crate) fn scalar_operands(&self) -> Vec<usize> {
        self.epsilon
            .into_iter()
            .chain(self.running.map(|r| r.momentum))
            .collect()
    }

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
