//! Group and instance normalization ([`GroupNorm`]), batch-norm calls on regrouped views.
use std::fmt;

use super::method::NormMethod;
use super::regrouped::{regrouped_accessors, regrouped_launches, Regrouped};
use super::{packed_dims, NormType};
use crate::error::{Error, Result};
use crate::tensor::Layout;

/// Group normalization of a packed NCHW-style tensor `[N, C, spatial...]`: the `C` channels of
/// each sample are split into `G` groups of `C/G` consecutive channels, each group (with its
/// spatial positions) is normalized, then `y = x̂·γ + β` per channel (`γ`, `β`: `C` elements of
/// type `T`). PyTorch's `group_norm`. Instance normalization is `G = C`
/// ([`GroupNorm::instance`]); layer normalization over `[C, spatial...]` is `G = 1`.
///
/// Computed by cuDNN as described in the [module documentation](crate::norm): batch-norm
/// statistics over the regrouped view `[1, N·G, (C/G)·H·W, 1]`, then the per-channel affine
/// map, by default ([`NormMethod::default_for_group`]) as one batch-norm inference on the
/// tensor itself; other formulations are chosen with [`with_method`](Self::with_method). The input must be packed channels-first; convert channels-last data with
/// [`Cudnn::transform_tensor`](crate::Cudnn::transform_tensor) first. `Send`, not `Sync`.
pub struct GroupNorm<T: NormType> {
    core: Regrouped<T>,
    layout: Layout,
    groups: i64,
}

impl<T: NormType> fmt::Debug for GroupNorm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupNorm")
            .field("dtype", &T::DTYPE)
            .field("dims", &self.layout.dims())
            .field("groups", &self.groups)
            .field("epsilon", &self.core.epsilon)
            .field("method", &self.core.method)
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
    /// Nothing else depends on the method.
    fn method_chosen(self) -> Self {
        self
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
    /// [`GroupNorm::len`] elements; `γ`, `β`: [`GroupNorm::channels`].
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
