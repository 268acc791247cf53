//! Group and instance normalization ([`GroupNorm`]): the forward's path ([`GroupNormPath`]:
//! the crate's kernel or batch-norm calls on regrouped views), the training calls on the
//! regrouped views.
use std::fmt;

use cudarc::driver::sys::CUdeviceptr;

use super::method::NormMethod;
use super::regrouped::{regrouped_accessors, regrouped_launches, Regrouped};
use super::{packed_dims, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::error::{Error, Result};
use crate::fast::elementwise::{Elem, Outcome};
use crate::fast::group_norm::GnShape;
use crate::handle::Cudnn;
use crate::tensor::Layout;

/// Which implementation [`Cudnn::group_norm_forward`] (the forward that saves nothing) runs.
/// The training forward and the backward always run the batch-norm formulation
/// ([`GroupNorm::method`]).
///
/// The crate's kernel is one launch that reads `x` for the group statistics and again (mostly
/// from L2) to write `y` with the per-channel affine step: three passes over the tensor's bytes
/// at most, against the batch-norm formulation's four or more. It is generated CUDA compiled
/// at run time with NVRTC (once per process and element type, tenths of a second), so it needs
/// the NVRTC library at run time.
///
/// ```no_run
/// use cudnn_safe::norm::{GroupNorm, GroupNormPath, NormMethod};
/// use cudnn_safe::Layout;
/// # fn main() -> cudnn_safe::Result<()> {
/// let x = Layout::nchw_nd(&[8, 64, 32, 32])?;
/// let gn = GroupNorm::<f32>::new(&x, 32, 1e-5)?;
/// assert_eq!(gn.path(), GroupNormPath::Auto);
/// // Never compile a kernel at run time:
/// let gn = gn.with_path(GroupNormPath::BatchNorm);
/// assert_eq!(gn.path(), GroupNormPath::BatchNorm);
/// // Choosing a batch-norm formulation chooses that path too:
/// let gn = GroupNorm::<f32>::new(&x, 32, 1e-5)?.with_method(NormMethod::reductions())?;
/// assert_eq!(gn.path(), GroupNormPath::BatchNorm);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum GroupNormPath {
    /// The default: the crate's kernel for f32, f16 and bf16 when it is available (NVRTC
    /// present, the compile and load succeeded on this handle, every buffer aligned to its
    /// element size, a group of at most 2^32 − 1 elements); the batch-norm formulation
    /// otherwise, and always for f64. Why the kernel is not available is logged once per
    /// handle at debug level.
    #[default]
    Auto,
    /// Only the crate's kernel: where it is not available, [`Error::KernelUnavailable`] with
    /// the reason ([`Error::UnsupportedDataType`] for f64).
    Kernel,
    /// Only the batch-norm formulation of [`GroupNorm::method`]: nothing is compiled at run
    /// time.
    BatchNorm,
}

/// Group normalization of a packed NCHW-style tensor `[N, C, spatial...]`: the `C` channels of
/// each sample are split into `G` groups of `C/G` consecutive channels, each group (with its
/// spatial positions) is normalized, then `y = x̂·γ + β` per channel (`γ`, `β`: `C` elements of
/// type `T`). PyTorch's `group_norm`. Instance normalization is `G = C`
/// ([`GroupNorm::instance`]); layer normalization over `[C, spatial...]` is `G = 1`.
///
/// The forward that saves nothing runs the crate's own kernel by default ([`GroupNormPath`]).
/// The training forward and the backward (and the forward where the kernel is not available)
/// are computed by cuDNN as described in the [module documentation](crate::norm): batch-norm
/// statistics over the regrouped view `[1, N·G, (C/G)·H·W, 1]`, then the per-channel affine
/// map, by default ([`NormMethod::default_for_group`]) as one batch-norm inference on the
/// tensor itself; other formulations are chosen with [`with_method`](Self::with_method). The
/// input must be packed channels-first; convert channels-last data with
/// [`Cudnn::transform_tensor`](crate::Cudnn::transform_tensor) first. `Send`, not `Sync`.
pub struct GroupNorm<T: NormType> {
    core: Regrouped<T>,
    layout: Layout,
    groups: i64,
    path: GroupNormPath,
}

impl<T: NormType> fmt::Debug for GroupNorm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupNorm")
            .field("dtype", &T::DTYPE)
            .field("dims", &self.layout.dims())
            .field("groups", &self.groups)
            .field("epsilon", &self.core.epsilon)
            .field("method", &self.core.method)
            .field("path", &self.path)
            .finish()
    }
}

impl<T: NormType> GroupNorm<T> {
    /// Group normalization of a `[N, C, spatial...]` tensor (at least 2 dimensions) laid out
    /// as `x` (packed row-major, as [`Layout::nchw_nd`] builds it) in `groups` groups
    /// (`C % groups == 0`), with epsilon `epsilon` (finite, ≥ 0). Host only:
    /// [`Error::InvalidArgument`] for another layout (naming `x`), a bad rank, group count or
    /// epsilon.
    pub fn new(x: &Layout, groups: i64, epsilon: f64) -> Result<Self> {
        let dims = packed_dims("group-norm x layout", x)?;
        if dims.len() < 2 {
            return Err(Error::invalid(
                "group-norm input rank",
                "at least 2 dimensions (N, C, spatial...)",
                format!("{dims:?}"),
            ));
        }
        let (n, c) = (dims[0], dims[1]);
        if groups < 1 || c % groups != 0 {
            return Err(Error::invalid(
                "group count",
                format!("a divisor of the {c} channels"),
                groups,
            ));
        }
        let s: i64 = dims[2..].iter().product();
        Ok(GroupNorm {
            core: Regrouped::new(n, c, s, groups, epsilon, NormMethod::default_for_group())?,
            layout: x.clone(),
            groups,
            path: GroupNormPath::Auto,
        })
    }
    /// Instance normalization of a tensor laid out as `x`: one group per channel.
    pub fn instance(x: &Layout, epsilon: f64) -> Result<Self> {
        let c = x.dims().get(1).copied().unwrap_or(0);
        Self::new(x, c, epsilon)
    }
    /// The group count `G`.
    pub fn groups(&self) -> i64 {
        self.groups
    }
    /// Channels `C`: the length of `γ` and `β`.
    pub fn channels(&self) -> usize {
        self.core.features()
    }
    /// `N·G`: the length of the saved statistics.
    pub fn group_count(&self) -> usize {
        self.core.rows
    }
}

impl<T: NormType> GroupNorm<T> {
    /// Choosing a formulation ([`with_method`](Self::with_method)) chooses the batch-norm path.
    fn method_chosen(self) -> Self {
        self.with_path(GroupNormPath::BatchNorm)
    }
    /// The same normalization with its forward running `path` ([`GroupNormPath`];
    /// [`GroupNormPath::Auto`] by default). Host only.
    pub fn with_path(mut self, path: GroupNormPath) -> Self {
        self.path = path;
        self
    }
    /// The path [`Cudnn::group_norm_forward`] runs ([`GroupNormPath`]).
    pub fn path(&self) -> GroupNormPath {
        self.path
    }

    /// The forward that saves nothing, on this object's [`GroupNormPath`].
    pub(super) fn forward_default(
        &self,
        cudnn: &Cudnn,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        if self.path == GroupNormPath::BatchNorm {
            return self.core.forward(cudnn, x, gamma, beta, y);
        }
        let Some(elem) = Elem::of(T::DTYPE) else {
            if self.path == GroupNormPath::Kernel {
                return Err(Error::UnsupportedDataType {
                    op: "group-norm kernel",
                    detail: format!("{} (the kernel takes f32, f16 and bf16)", T::DTYPE),
                });
            }
            return self.core.forward(cudnn, x, gamma, beta, y);
        };
        let (full, affine) = (self.core.full_layout(), self.core.affine_layout());
        cudnn.check_tensor("x", full, x, false)?;
        cudnn.check_tensor("gamma", affine, gamma, false)?;
        cudnn.check_tensor("beta", affine, beta, false)?;
        cudnn.check_tensor("y", full, &*y, true)?;
        let dims = self.layout.dims();
        let c = dims[1] as u64;
        let shape = GnShape {
            n: dims[0] as u64,
            groups: self.groups as u64,
            cg: c / self.groups as u64,
            s: dims[2..].iter().product::<i64>() as u64,
        };
        let outcome = {
            let stream = cudnn.stream();
            let (xp, _gx) = x.device_ptr(stream);
            let (gp, _gg) = gamma.device_ptr(stream);
            let (bp, _gb) = beta.device_ptr(stream);
            let (yp, _gy) = y.device_ptr_mut(stream);
            // SAFETY: `x` and `y` were checked above to hold the packed tensor's
            // `N·C·S = n·groups·cg·s` elements of `T` (whose element type is `elem`) and `γ`,
            // `β` its `C = groups·cg`, all on the handle's context; the guards keep them alive
            // and ordered on the handle's stream until the launch is enqueued. `y` is borrowed
            // exclusively while `x`, `γ` and `β` are borrowed shared, so it overlaps none of
            // them. The epsilon was checked finite and non-negative at construction.
            unsafe {
                cudnn.group_norm_forward_fast(
                    elem,
                    [
                        xp as CUdeviceptr,
                        gp as CUdeviceptr,
                        bp as CUdeviceptr,
                        yp as CUdeviceptr,
                    ],
                    shape,
                    self.core.epsilon as f32,
                )
            }?
        };
        match outcome {
            Outcome::Launched => Ok(()),
            Outcome::Unavailable(reason) if self.path == GroupNormPath::Kernel => {
                Err(Error::KernelUnavailable {
                    op: "group-norm forward",
                    reason,
                })
            }
            Outcome::Unavailable(_) => self.core.forward(cudnn, x, gamma, beta, y),
        }
    }
}

regrouped_accessors! {
    GroupNorm, "default_for_group";
    /// The same normalization computed with another formulation ([`NormMethod`](super::NormMethod)).
    fn with_method;
    /// Workspace bytes the backward pass grows `workspace` to (the reductions of
    /// [`NormParamGrads::Reduce`](super::NormParamGrads::Reduce) and [`NormParamGrads::TwoStageReduce`](super::NormParamGrads::TwoStageReduce); 0 with
    /// [`NormParamGrads::BatchNormBackward`](super::NormParamGrads::BatchNormBackward), the default), e.g. to size a
    /// [`Workspace::with_limit`](crate::Workspace::with_limit). Queries cuDNN.
    fn backward_workspace_size;
}

regrouped_launches! {
    GroupNorm, gn;
    /// Group (or instance) normalization forward, saving nothing. `x`, `y`:
    /// [`GroupNorm::len`] elements; `γ`, `β`: [`GroupNorm::channels`]; all checked before
    /// anything is enqueued. Runs `gn`'s [`GroupNormPath`]: by default one launch of the
    /// crate's kernel (compiled at the first call of the element type in the process), else
    /// the batch-norm formulation.
    #[doc(alias = "cudnnBatchNormalizationForwardTraining")]
    fn group_norm_forward;
    /// [`group_norm_forward`](Self::group_norm_forward) that also returns `x̂` and the
    /// per-group mean and inverse standard deviation (`[N, G]`) for
    /// [`group_norm_backward`](Self::group_norm_backward).
    fn group_norm_forward_training;
    /// Group (or instance) normalization backward: writes `dx`, `dγ = Σ_{n,spatial} dy·x̂` and
    /// `dβ = Σ_{n,spatial} dy` per channel (overwriting them) from `dy` and the values `saved`
    /// by [`group_norm_forward_training`](Self::group_norm_forward_training) of this `gn` on
    /// this `x` (checked). `workspace` serves the reductions of [`NormParamGrads::Reduce`](super::NormParamGrads::Reduce)
    /// and [`NormParamGrads::TwoStageReduce`](super::NormParamGrads::TwoStageReduce), grown (within its limit) to
    /// [`GroupNorm::backward_workspace_size`] before anything is written; the default method
    /// uses none.
    #[doc(alias = "cudnnBatchNormalizationBackward")]
    fn group_norm_backward;
}
