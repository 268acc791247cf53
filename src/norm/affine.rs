//! Layer, instance and group normalization, computed by cuDNN on regrouped views (the method
//! and its memory cost are described in the documentation of [`crate::norm`]; the alternative
//! formulations in [`NormMethod`]).
use std::cell::RefCell;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};
use cudnn_safe_sys as sys;

use super::method::{
    near_square, two_stage_split, FeatureLayout, NormAffine, NormMethod, NormParamGrads, NormStats,
};
use super::{check_epsilon, ffi, scalar_ptr, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DataType, Scalar};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::ops::OpTensorOp;
use crate::raw;
use crate::reduce::ReduceOp;
use crate::tensor::{Layout, TensorDesc};
use crate::workspace::Workspace;

/// Where the view's batch-norm writes the per-group mean and inverse standard deviation.
type StatsMut<'a, P> = (&'a mut CudaSlice<P>, &'a mut CudaSlice<P>);

/// Constant and scratch vectors of the feature view (`B` parameters each), for the methods
/// that run batch-norm calls on it.
struct FeatureScratch<P> {
    /// Mean 0 / bias 0.
    zeros: CudaSlice<P>,
    /// Variance 1 / scale 1 / inverse standard deviation 1.
    ones: CudaSlice<P>,
    /// `γ` and `β` converted to the parameter type (forward), or `dγ` and `dβ` before their
    /// conversion to the data type (backward), when the data type is not its own parameter
    /// type (f16, bf16).
    first: CudaSlice<P>,
    second: CudaSlice<P>,
}

/// Scratch of [`NormParamGrads::TwoStageReduce`].
struct TwoStageScratch<P> {
    /// The partial sums of the first reduction.
    partial: CudaSlice<P>,
    /// The per-feature sums in the parameter type, converted into `dγ` / `dβ` afterwards,
    /// when the data type is not its own parameter type (f16, bf16).
    sums: Option<CudaSlice<P>>,
}

/// Device buffers a regrouped normalization keeps between calls.
struct Scratch<T: NormType> {
    /// Scale 1 for the `R` groups of the view.
    ones: CudaSlice<T::Param>,
    /// Bias 0 for the `R` groups.
    zeros: CudaSlice<T::Param>,
    /// Discarded per-group scale and bias gradients of the view's backward.
    dscale: CudaSlice<T::Param>,
    dbias: CudaSlice<T::Param>,
    /// One tensor of `x`'s size for the backward pass and for the plain forward of
    /// [`NormAffine::BatchNormInference`] (allocated at the first call that needs it).
    big: Option<CudaSlice<T>>,
    /// Present when the method uses the feature view.
    feat: Option<FeatureScratch<T::Param>>,
    /// Present when the parameter gradients are summed in two stages.
    two_stage: Option<TwoStageScratch<T::Param>>,
}

/// The descriptors of the two-stage sums of [`NormParamGrads::TwoStageReduce`] (dimensions
/// from [`two_stage_split`]; every one packed, over the memory of the tensor, of the partial
/// sums scratch and of the `B`-element gradients).
struct TwoStage<T: NormType> {
    /// The tensor as the first reduction reads it.
    data: TensorDesc<T>,
    /// The partial sums, in the parameter type.
    partial: TensorDesc<T::Param>,
    /// The per-feature sums in the parameter type (written by the second reduction when `T`
    /// is not its own parameter type).
    sums: TensorDesc<T::Param>,
    /// The same dimensions in `T`: `dγ`, `dβ`.
    out: TensorDesc<T>,
}

impl<T: NormType> TwoStage<T> {
    fn new(a: i64, b: i64, s: i64) -> Result<Option<Self>> {
        let Some([data, partial, sums]) = two_stage_split(a, b, s) else {
            return Ok(None);
        };
        Ok(Some(TwoStage {
            data: TensorDesc::new(packed(&data)?)?,
            partial: TensorDesc::new(packed(&partial)?)?,
            sums: TensorDesc::new(packed(&sums)?)?,
            out: TensorDesc::new(packed(&sums)?)?,
        }))
    }
}

/// How a backward call computes `dγ`, `dβ` ([`Regrouped::grads_plan`]).
enum GradsPlan<'a, T: NormType> {
    Reduce,
    BatchNorm,
    TwoStage(&'a TwoStage<T>),
}

/// Whether `T` is its own parameter type (f32, f64): `γ`, `β` and their gradients are then
/// handed to the batch-norm calls of the feature view as they are.
fn same_param_type<T: NormType>() -> bool {
    T::DTYPE == <T::Param as DataType>::DTYPE
}

/// The shared machinery: a packed `[A, B, S, 1]` tensor (`A` batch rows, `B` affine features,
/// `S` spatial positions) whose `R = A·G` groups of `M = B·S/G` consecutive elements are
/// normalized, then scaled by a `[1, B, 1, 1]` affine map.
struct Regrouped<T: NormType> {
    epsilon: f64,
    method: NormMethod,
    /// `(A, B, S, G)`, to rebuild with another method.
    shape: (i64, i64, i64, i64),
    /// `[A, B, S, 1]`: x, y, dy, dx, x̂.
    full: TensorDesc<T>,
    /// `[1, B, 1, 1]`: gamma, beta and their gradients.
    affine: TensorDesc<T>,
    /// The same memory as `R` batch-norm statistics ([`NormStats`]).
    view: TensorDesc<T>,
    /// The batch-norm mode of `view`.
    view_mode: sys::cudnnBatchNormMode_t,
    /// `[1, R, 1, 1]` of `T::Param`: the view's batch-norm parameters and statistics.
    stats: TensorDesc<T::Param>,
    /// The same memory with the `B` features as batch-norm channels ([`FeatureLayout`]).
    feature: TensorDesc<T>,
    /// The views of [`NormParamGrads::TwoStageReduce`], when that is the method and the
    /// tensor has a two-stage split.
    two_stage: Option<TwoStage<T>>,
    /// `[1, B, 1, 1]` of `T::Param`: the feature view's batch-norm parameters.
    feature_param: TensorDesc<T::Param>,
    rows: usize,
    id: u64,
    scratch: RefCell<Option<Scratch<T>>>,
}

fn packed(dims: &[i64]) -> Result<Layout> {
    Layout::nchw_nd(dims)
}

/// The statistics view of `rows` groups of `m` consecutive elements, and its batch-norm mode.
fn stats_view(stats: NormStats, rows: i64, m: i64) -> Result<(Layout, sys::cudnnBatchNormMode_t)> {
    use sys::cudnnBatchNormMode_t as Mode;
    Ok(match stats {
        NormStats::SpatialColumn => (packed(&[1, rows, m, 1])?, Mode::CUDNN_BATCHNORM_SPATIAL),
        NormStats::SpatialRow => (packed(&[1, rows, 1, m])?, Mode::CUDNN_BATCHNORM_SPATIAL),
        NormStats::SpatialSquare => {
            let (h, w) = near_square(m);
            (packed(&[1, rows, h, w])?, Mode::CUDNN_BATCHNORM_SPATIAL)
        }
        NormStats::SpatialPersistent => (
            packed(&[1, rows, m, 1])?,
            Mode::CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
        ),
    })
}

impl<T: NormType> Regrouped<T> {
    /// `a` rows of `b` features by `s` positions, in `g` groups per row (`b % g == 0`).
    fn new(a: i64, b: i64, s: i64, g: i64, epsilon: f64, method: NormMethod) -> Result<Self> {
        check_epsilon(epsilon)?;
        let full = TensorDesc::<T>::new(packed(&[a, b, s, 1])?)?;
        let rows = a.checked_mul(g).ok_or_else(|| Error::Overflow {
            what: "normalization groups",
            detail: format!("{a} rows × {g} groups"),
        })?;
        // `b·s` fits: it is at most the element count validated above.
        let m = b * s / g;
        let (view, view_mode) = stats_view(method.stats, rows, m)?;
        // Element (i, f) of a layer norm (S = 1) sits at i·B + f, as (h = i, c = f) of a packed
        // channels-last [1, B, A, 1].
        let feature = match method.feature_layout {
            FeatureLayout::ChannelsLast if s == 1 => Layout::nhwc(1, b, a, 1)?,
            _ => full.layout().clone(),
        };
        let two_stage = match method.param_grads {
            NormParamGrads::TwoStageReduce => TwoStage::new(a, b, s)?,
            _ => None,
        };
        Ok(Regrouped {
            epsilon,
            method,
            shape: (a, b, s, g),
            affine: TensorDesc::<T>::new(packed(&[1, b, 1, 1])?)?,
            view: TensorDesc::<T>::new(view)?,
            view_mode,
            stats: TensorDesc::<T::Param>::new(packed(&[1, rows, 1, 1])?)?,
            feature: TensorDesc::<T>::new(feature)?,
            two_stage,
            feature_param: TensorDesc::<T::Param>::new(packed(&[1, b, 1, 1])?)?,
            full,
            rows: rows as usize,
            id: raw::next_descriptor_id(),
            scratch: RefCell::new(None),
        })
    }

    /// The same normalization computed with `method`.
    fn with_method(&self, method: NormMethod) -> Result<Self> {
        let (a, b, s, g) = self.shape;
        Regrouped::new(a, b, s, g, self.epsilon, method)
    }

    fn len(&self) -> usize {
        self.full.span()
    }
    fn features(&self) -> usize {
        self.affine.span()
    }

    /// How the parameter gradients are computed: the method's choice, except that
    /// * a batch norm over one value per feature (a single-row layer norm) is not asked of
    ///   cuDNN — its training calls want at least two values per statistic — and the
    ///   reductions (then plain copies) are used;
    /// * two-stage sums without a split ([`two_stage_split`]: prime or few rows) are one
    ///   reduction each.
    fn grads_plan(&self) -> GradsPlan<'_, T> {
        let (a, _, s, _) = self.shape;
        match self.method.param_grads {
            _ if a * s < 2 => GradsPlan::Reduce,
            NormParamGrads::BatchNormBackward => GradsPlan::BatchNorm,
            NormParamGrads::TwoStageReduce => match &self.two_stage {
                Some(ts) => GradsPlan::TwoStage(ts),
                None => GradsPlan::Reduce,
            },
            _ => GradsPlan::Reduce,
        }
    }

    /// Workspace bytes of the backward pass: the reductions of [`NormParamGrads::Reduce`] or
    /// [`NormParamGrads::TwoStageReduce`] (the larger of its two stages, which share it).
    fn backward_workspace_size(&self, cudnn: &Cudnn) -> Result<usize> {
        match self.grads_plan() {
            GradsPlan::BatchNorm => Ok(0),
            // A "reduction" over nothing (one row, no spatial extent) is a copy that needs no
            // workspace, and cuDNN refuses to size it.
            GradsPlan::Reduce if self.full.dims() == self.affine.dims() => Ok(0),
            GradsPlan::Reduce => {
                cudnn.reduce_workspace_size(ReduceOp::Add, &self.full, &self.affine)
            }
            GradsPlan::TwoStage(ts) => {
                let first =
                    cudnn.reduce_workspace_size_into(ReduceOp::Add, &ts.data, &ts.partial)?;
                let second = if same_param_type::<T>() {
                    cudnn.reduce_workspace_size_into(ReduceOp::Add, &ts.partial, &ts.out)?
                } else {
                    cudnn.reduce_workspace_size(ReduceOp::Add, &ts.partial, &ts.sums)?
                };
                Ok(first.max(second))
            }
        }
    }

    /// The scratch buffers, (re)allocated on the handle's stream when missing or on another
    /// context; with `big`, also the tensor-sized scratch; the feature-view vectors when the
    /// method uses that view.
    fn ensure_scratch<'s>(
        &self,
        cudnn: &Cudnn,
        slot: &'s mut Option<Scratch<T>>,
        big: bool,
    ) -> Result<&'s mut Scratch<T>> {
        let foreign = slot
            .as_ref()
            // Per stream, not just per context: scratch is then only used on the stream that
            // allocated it, and its free (there) follows every use.
            .is_some_and(|s| s.ones.stream().cu_stream() != cudnn.stream().cu_stream());
        let stream: &Arc<CudaStream> = cudnn.stream();
        let alloc_err = |e| Error::driver("allocating normalization scratch", e);
        let one = <T::Param as DataType>::from_f64(1.0);
        if slot.is_none() || foreign {
            *slot = Some(Scratch {
                ones: stream
                    .clone_htod(&vec![one; self.rows])
                    .map_err(alloc_err)?,
                zeros: stream.alloc_zeros(self.rows).map_err(alloc_err)?,
                dscale: stream.alloc_zeros(self.rows).map_err(alloc_err)?,
                dbias: stream.alloc_zeros(self.rows).map_err(alloc_err)?,
                big: None,
                feat: None,
                two_stage: None,
            });
        }
        let s = slot.as_mut().expect("filled above");
        if big && s.big.is_none() {
            // SAFETY: scratch that every call using it writes in full (x̂ in the plain forward;
            // `dy·x̂` or the discarded data gradient, then `dy·γ`, in the backward pass) before
            // reading it; never read on the host.
            let b = unsafe { stream.alloc::<T>(self.len()) }.map_err(alloc_err)?;
            s.big = Some(b);
        }
        if self.method.uses_feature_view() && s.feat.is_none() {
            let n = self.features();
            s.feat = Some(FeatureScratch {
                zeros: stream.alloc_zeros(n).map_err(alloc_err)?,
                ones: stream.clone_htod(&vec![one; n]).map_err(alloc_err)?,
                first: stream.alloc_zeros(n).map_err(alloc_err)?,
                second: stream.alloc_zeros(n).map_err(alloc_err)?,
            });
        }
        Ok(s)
    }

    /// The scratch of the two-stage sums (allocated at the first backward call that needs
    /// it, on the stream of the other scratch buffers: `s` comes from
    /// [`ensure_scratch`](Self::ensure_scratch)).
    fn ensure_two_stage_scratch<'s>(
        &self,
        cudnn: &Cudnn,
        ts: &TwoStage<T>,
        s: &'s mut Option<TwoStageScratch<T::Param>>,
    ) -> Result<&'s mut TwoStageScratch<T::Param>> {
        let alloc_err = |e| Error::driver("allocating normalization scratch", e);
        Ok(match s {
            Some(t) => t,
            slot @ None => {
                let stream: &Arc<CudaStream> = cudnn.stream();
                let sums = if same_param_type::<T>() {
                    None
                } else {
                    Some(stream.alloc_zeros(ts.sums.span()).map_err(alloc_err)?)
                };
                slot.insert(TwoStageScratch {
                    partial: stream.alloc_zeros(ts.partial.span()).map_err(alloc_err)?,
                    sums,
                })
            }
        })
    }

    /// `dst = Σ src` over every axis but the features, as two reductions through the partial
    /// sums (see [`NormParamGrads::TwoStageReduce`]): `src` holds the packed element count
    /// (checked by the caller, or the object's scratch), `dst` the `B` features (checked);
    /// the workspace was grown to [`backward_workspace_size`](Self::backward_workspace_size)
    /// before the first launch. Each reduction checks its own buffers again.
    fn sum_two_stage(
        &self,
        cudnn: &Cudnn,
        ts: &TwoStage<T>,
        scratch: &mut TwoStageScratch<T::Param>,
        src: &impl DeviceBuffer<T>,
        dst: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        let add = ReduceOp::Add;
        let TwoStageScratch { partial, sums } = scratch;
        cudnn.reduce_tensor_into(
            add,
            one,
            &ts.data,
            src,
            zero,
            &ts.partial,
            partial,
            workspace,
        )?;
        match sums {
            None => cudnn.reduce_tensor_into(
                add,
                one,
                &ts.partial,
                &*partial,
                zero,
                &ts.out,
                dst,
                workspace,
            ),
            // f16 / bf16: the sums in f32, rounded once to the data type.
            Some(sums) => {
                cudnn.reduce_tensor(
                    add,
                    one,
                    &ts.partial,
                    &*partial,
                    zero,
                    &ts.sums,
                    sums,
                    workspace,
                )?;
                cudnn.transform_tensor(one, &ts.sums, &*sums, zero, &ts.out, dst)
            }
        }
    }

    /// Common checks of a forward call.
    fn check_forward(
        &self,
        cudnn: &Cudnn,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &impl DeviceSlice<T>,
    ) -> Result<()> {
        cudnn.check_tensor("x", self.full.layout(), x, false)?;
        cudnn.check_tensor("gamma", self.affine.layout(), gamma, false)?;
        cudnn.check_tensor("beta", self.affine.layout(), beta, false)?;
        cudnn.check_tensor("y", self.full.layout(), y, true)
    }

    /// Batch-norm training forward on the statistics view: writes `x̂` to `out` and, when
    /// given, the per-group mean and inverse standard deviation. `ones` and `zeros` are the
    /// object's `R`-element scale and bias.
    fn normalize(
        &self,
        cudnn: &Cudnn,
        ones: &CudaSlice<T::Param>,
        zeros: &CudaSlice<T::Param>,
        x: &impl DeviceBuffer<T>,
        out: &mut impl DeviceBufferMut<T>,
        stats: Option<StatsMut<'_, T::Param>>,
    ) -> Result<()> {
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        cudnn.bind()?;
        let stream: &CudaStream = cudnn.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (op, _go) = out.device_ptr_mut(stream);
        let (sp, _gs) = ones.device_ptr(stream);
        let (bp, _gb) = zeros.device_ptr(stream);
        let (mp, ip, _gm, _gi) = match stats {
            Some((m, i)) => {
                let (mp, gm) = m.device_ptr_mut(stream);
                let (ip, gi) = i.device_ptr_mut(stream);
                (mp as *mut c_void, ip as *mut c_void, Some(gm), Some(gi))
            }
            None => (std::ptr::null_mut(), std::ptr::null_mut(), None, None),
        };
        // SAFETY: live handle and descriptors; `x` and `out` hold the element count of the
        // packed tensor (checked by the caller, or allocated for this object), which every
        // statistics view addresses exactly (a reshape or a permutation of it); `out` is a
        // `&mut` so it cannot alias `x`; the scale/bias buffers hold `R` parameters (allocated
        // for this object) on this context, the statistics too when given (else both null, as
        // cuDNN allows); no running statistics (null pair); scalars are `T::Scalar`; the
        // guards keep every buffer alive and ordered until the call is enqueued.
        unsafe {
            ffi::cudnnBatchNormalizationForwardTraining(
                cudnn.lib(),
                cudnn.as_raw(),
                self.view_mode,
                scalar_ptr(&one),
                scalar_ptr(&zero),
                self.view.as_raw(),
                xp as *const c_void,
                self.view.as_raw(),
                op as *mut c_void,
                self.stats.as_raw(),
                sp as *const c_void,
                bp as *const c_void,
                0.0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                self.epsilon,
                mp,
                ip,
            )
        }
    }

    /// `out = src·γ + β` per feature (`out = src·γ` without `β`) in one batch-norm inference
    /// on the feature view: scale `γ`, bias `β`, mean 0, variance 1, epsilon 0, so that
    /// `γ·(src − 0)/sqrt(1 + 0) + β` is the affine map. `src` and `out` are tensor-sized
    /// (checked by the caller or owned by this object), `γ` and `β` feature-sized (checked).
    fn affine_bn(
        &self,
        cudnn: &Cudnn,
        fs: &mut FeatureScratch<T::Param>,
        src: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: Option<&impl DeviceBuffer<T>>,
        out: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        let same = same_param_type::<T>();
        if !same {
            let FeatureScratch { first, second, .. } = &mut *fs;
            cudnn.transform_tensor(one, &self.affine, gamma, zero, &self.feature_param, first)?;
            if let Some(b) = beta {
                cudnn.transform_tensor(one, &self.affine, b, zero, &self.feature_param, second)?;
            }
        }
        cudnn.bind()?;
        let stream: &CudaStream = cudnn.stream();
        let (xp, _gx) = src.device_ptr(stream);
        let (yp, _gy) = out.device_ptr_mut(stream);
        let (gp, _gg) = if same {
            gamma.device_ptr(stream)
        } else {
            fs.first.device_ptr(stream)
        };
        let (bp, _gb) = match beta {
            Some(b) if same => b.device_ptr(stream),
            Some(_) => fs.second.device_ptr(stream),
            None => fs.zeros.device_ptr(stream),
        };
        let (mp, _gm) = fs.zeros.device_ptr(stream);
        let (vp, _gv) = fs.ones.device_ptr(stream);
        // SAFETY: live handle and descriptors; `src` and `out` hold the packed element count,
        // which the feature view addresses exactly (the packed tensor itself, or the same
        // memory described channels-last); `out` is a `&mut` distinct from `src`; scale, bias,
        // mean and variance hold `B` values of `T::Param` on this context: `γ`/`β` themselves
        // when `T` is its own parameter type (same dtype, so the same bytes; their `B`-element
        // span was checked), else their conversions above, or the object's constant vectors;
        // epsilon 0 is cuDNN's minimum; scalars are `T::Scalar`; the guards keep every buffer
        // alive and ordered until the call is enqueued.
        unsafe {
            ffi::cudnnBatchNormalizationForwardInference(
                cudnn.lib(),
                cudnn.as_raw(),
                sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                scalar_ptr(&one),
                scalar_ptr(&zero),
                self.feature.as_raw(),
                xp as *const c_void,
                self.feature.as_raw(),
                yp as *mut c_void,
                self.feature_param.as_raw(),
                gp as *const c_void,
                bp as *const c_void,
                mp as *const c_void,
                vp as *const c_void,
                0.0,
            )
        }
    }

    /// `dγ = Σ dy·x̂` and `dβ = Σ dy` per feature from one batch-norm backward on the feature
    /// view with `x = x̂`, saved mean 0 and saved inverse standard deviation 1: its scale
    /// gradient is `Σ dy·(x̂ − 0)·1` and its bias gradient `Σ dy`. Its data gradient goes to
    /// `discard` (tensor-sized scratch) and is not used.
    #[allow(clippy::too_many_arguments)] // the gradients and their scratch
    fn param_grads_bn(
        &self,
        cudnn: &Cudnn,
        fs: &mut FeatureScratch<T::Param>,
        xhat: &CudaSlice<T>,
        dy: &impl DeviceBuffer<T>,
        discard: &mut CudaSlice<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        let same = same_param_type::<T>();
        {
            cudnn.bind()?;
            let stream: &CudaStream = cudnn.stream();
            let FeatureScratch {
                zeros,
                ones,
                first,
                second,
            } = &mut *fs;
            let (xp, _gx) = xhat.device_ptr(stream);
            let (dyp, _gdy) = dy.device_ptr(stream);
            let (dxp, _gdx) = discard.device_ptr_mut(stream);
            let (sp, _gs) = ones.device_ptr(stream);
            let (mp, _gm) = zeros.device_ptr(stream);
            let (ip, _gi) = ones.device_ptr(stream);
            let (dgp, _gdg) = if same {
                dgamma.device_ptr_mut(stream)
            } else {
                first.device_ptr_mut(stream)
            };
            let (dbp, _gdb) = if same {
                dbeta.device_ptr_mut(stream)
            } else {
                second.device_ptr_mut(stream)
            };
            // SAFETY: live handle and descriptors; x̂, dy and the discarded gradient hold the
            // packed element count the feature view addresses (checked by the caller or owned
            // by this object); the discarded gradient is the object's scratch, distinct from
            // every caller buffer; the scale and the saved statistics are the object's `B`
            // constants, the gradients `B` values of `T::Param` on this context (`dγ`/`dβ`
            // themselves when `T` is its own parameter type: same bytes, `B`-element span
            // checked; else the object's scratch, converted below); `dγ` and `dβ` are distinct
            // `&mut`s; scalars are `T::Scalar`; the guards keep every buffer alive and ordered
            // until the call is enqueued.
            unsafe {
                ffi::cudnnBatchNormalizationBackward(
                    cudnn.lib(),
                    cudnn.as_raw(),
                    sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                    scalar_ptr(&one),
                    scalar_ptr(&zero),
                    scalar_ptr(&one),
                    scalar_ptr(&zero),
                    self.feature.as_raw(),
                    xp as *const c_void,
                    self.feature.as_raw(),
                    dyp as *const c_void,
                    self.feature.as_raw(),
                    dxp as *mut c_void,
                    self.feature_param.as_raw(),
                    sp as *const c_void,
                    dgp as *mut c_void,
                    dbp as *mut c_void,
                    0.0,
                    mp as *const c_void,
                    ip as *const c_void,
                )
            }?;
        }
        if !same {
            let tp = &self.feature_param;
            cudnn.transform_tensor(one, tp, &fs.first, zero, &self.affine, dgamma)?;
            cudnn.transform_tensor(one, tp, &fs.second, zero, &self.affine, dbeta)?;
        }
        Ok(())
    }

    /// `y = normalize(x)·γ + β`, without saving anything.
    fn forward(
        &self,
        cudnn: &Cudnn,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.check_forward(cudnn, x, gamma, beta, y)?;
        let mut slot = self.scratch.borrow_mut();
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        match self.method.affine {
            NormAffine::OpTensor => {
                let s = self.ensure_scratch(cudnn, &mut slot, false)?;
                self.normalize(cudnn, &s.ones, &s.zeros, x, y, None)?;
                cudnn.op_tensor_inplace(
                    OpTensorOp::Mul,
                    one,
                    one,
                    &self.affine,
                    gamma,
                    zero,
                    &self.full,
                    y,
                )?;
                cudnn.add_tensor(one, &self.affine, beta, one, &self.full, y)
            }
            NormAffine::BatchNormInference => {
                let s = self.ensure_scratch(cudnn, &mut slot, true)?;
                let Scratch {
                    ones,
                    zeros,
                    big,
                    feat,
                    ..
                } = s;
                let xhat = big.as_mut().expect("allocated by ensure_scratch(.., true)");
                let fs = feat.as_mut().expect("allocated for this method");
                self.normalize(cudnn, ones, zeros, x, xhat, None)?;
                self.affine_bn(cudnn, fs, &*xhat, gamma, Some(beta), y)
            }
        }
    }

    /// The forward that also returns `x̂` and the statistics for the backward pass.
    fn forward_training<'x>(
        &self,
        cudnn: &Cudnn,
        x: &'x impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<NormSaved<'x, T>> {
        self.check_forward(cudnn, x, gamma, beta, y)?;
        let mut slot = self.scratch.borrow_mut();
        let scratch = self.ensure_scratch(cudnn, &mut slot, false)?;
        let stream = cudnn.stream();
        let alloc_err = |e| Error::driver("allocating normalization saved values", e);
        // SAFETY: cuDNN writes every element of x̂ (and of both statistics, below) in the
        // normalization before the saved value is returned; they are never read otherwise.
        let mut xhat = unsafe { stream.alloc::<T>(self.len()) }.map_err(alloc_err)?;
        // SAFETY: as above.
        let mut mean = unsafe { stream.alloc::<T::Param>(self.rows) }.map_err(alloc_err)?;
        // SAFETY: as above.
        let mut inv_std = unsafe { stream.alloc::<T::Param>(self.rows) }.map_err(alloc_err)?;
        self.normalize(
            cudnn,
            &scratch.ones,
            &scratch.zeros,
            x,
            &mut xhat,
            Some((&mut mean, &mut inv_std)),
        )?;
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        match self.method.affine {
            NormAffine::OpTensor => {
                cudnn.op_tensor(
                    OpTensorOp::Mul,
                    one,
                    &self.full,
                    &xhat,
                    one,
                    &self.affine,
                    gamma,
                    zero,
                    &self.full,
                    y,
                )?;
                cudnn.add_tensor(one, &self.affine, beta, one, &self.full, y)?;
            }
            NormAffine::BatchNormInference => {
                let fs = scratch.feat.as_mut().expect("allocated for this method");
                self.affine_bn(cudnn, fs, &xhat, gamma, Some(beta), y)?;
            }
        }
        let (xp, _gx) = x.device_ptr(cudnn.stream());
        Ok(NormSaved {
            xhat,
            mean,
            inv_std,
            norm: self.id,
            x: xp,
            _x: PhantomData,
        })
    }

    /// `dx`, `dγ`, `dβ` from `dy` and the saved forward values.
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    fn backward(
        &self,
        cudnn: &Cudnn,
        saved: &NormSaved<'_, T>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        // Every check before the first launch, so a rejected call writes nothing.
        let (full, affine) = (self.full.layout(), self.affine.layout());
        cudnn.check_tensor("x", full, x, false)?;
        cudnn.check_tensor("dy", full, dy, false)?;
        cudnn.check_tensor("gamma", affine, gamma, false)?;
        cudnn.check_tensor("dx", full, dx, true)?;
        cudnn.check_tensor("dgamma", affine, dgamma, true)?;
        cudnn.check_tensor("dbeta", affine, dbeta, true)?;
        cudnn.check_tensor("saved x̂", full, &saved.xhat, false)?;
        cudnn.check_tensor("saved mean", self.stats.layout(), &saved.mean, false)?;
        cudnn.check_tensor(
            "saved inverse std",
            self.stats.layout(),
            &saved.inv_std,
            false,
        )?;
        let ws_ctx = workspace.stream().context();
        if **ws_ctx != **cudnn.context() {
            return Err(Error::ForeignContext {
                name: "workspace",
                expected: cudnn.context().ordinal(),
                found: ws_ctx.ordinal(),
            });
        }
        check_saved_origin(
            cudnn,
            "normalization saved values",
            "the value returned by a training forward of this normalization object",
            (saved.norm, saved.x),
            self.id,
            x,
        )?;
        // The saved values were allocated on the forward's stream: order this use with it.
        let _order = crate::stream_order::cross_use(saved.mean.stream(), cudnn.stream())?;
        // Grown (within its limit) before the first launch, so a workspace limit too small
        // for the reductions fails before anything is written.
        workspace.prepare(self.backward_workspace_size(cudnn)?)?;
        let mut slot = self.scratch.borrow_mut();
        let scratch = self.ensure_scratch(cudnn, &mut slot, true)?;
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        let Scratch {
            ones,
            dscale,
            dbias,
            big,
            feat,
            two_stage,
            ..
        } = scratch;
        let tmp = big.as_mut().expect("allocated by ensure_scratch(.., true)");
        match self.grads_plan() {
            GradsPlan::Reduce => {
                // dβ = Σ dy; dγ = Σ dy·x̂ (over every axis but the feature one).
                cudnn.reduce_tensor(
                    ReduceOp::Add,
                    one,
                    &self.full,
                    dy,
                    zero,
                    &self.affine,
                    dbeta,
                    workspace,
                )?;
                cudnn.op_tensor(
                    OpTensorOp::Mul,
                    one,
                    &self.full,
                    dy,
                    one,
                    &self.full,
                    &saved.xhat,
                    zero,
                    &self.full,
                    tmp,
                )?;
                cudnn.reduce_tensor(
                    ReduceOp::Add,
                    one,
                    &self.full,
                    &*tmp,
                    zero,
                    &self.affine,
                    dgamma,
                    workspace,
                )?;
            }
            GradsPlan::BatchNorm => {
                let fs = feat.as_mut().expect("allocated for this method");
                self.param_grads_bn(cudnn, fs, &saved.xhat, dy, tmp, dgamma, dbeta)?;
            }
            GradsPlan::TwoStage(ts) => {
                // Allocated before the first launch, so a failed allocation writes nothing.
                let t = self.ensure_two_stage_scratch(cudnn, ts, two_stage)?;
                // dβ = Σ dy; dγ = Σ dy·x̂, the product in the tensor-sized scratch.
                self.sum_two_stage(cudnn, ts, t, dy, dbeta, workspace)?;
                cudnn.op_tensor(
                    OpTensorOp::Mul,
                    one,
                    &self.full,
                    dy,
                    one,
                    &self.full,
                    &saved.xhat,
                    zero,
                    &self.full,
                    tmp,
                )?;
                self.sum_two_stage(cudnn, ts, t, &*tmp, dgamma, workspace)?;
            }
        }
        // dx̂ = dy·γ, then the normalization's own backward on the statistics view.
        match self.method.affine {
            NormAffine::OpTensor => cudnn.op_tensor(
                OpTensorOp::Mul,
                one,
                &self.full,
                dy,
                one,
                &self.affine,
                gamma,
                zero,
                &self.full,
                tmp,
            )?,
            NormAffine::BatchNormInference => {
                let fs = feat.as_mut().expect("allocated for this method");
                self.affine_bn(cudnn, fs, dy, gamma, None::<&CudaSlice<T>>, tmp)?;
            }
        }
        cudnn.bind()?;
        let stream: &CudaStream = cudnn.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (tp, _gt) = tmp.device_ptr(stream);
        let (dxp, _gdx) = dx.device_ptr_mut(stream);
        let (sp, _gs) = ones.device_ptr(stream);
        let (dsp, _gds) = dscale.device_ptr_mut(stream);
        let (dbp, _gdb) = dbias.device_ptr_mut(stream);
        let (mp, _gm) = saved.mean.device_ptr(stream);
        let (ip, _gi) = saved.inv_std.device_ptr(stream);
        // SAFETY: live handle and descriptors; x, the scratch dx̂ and dx hold the packed
        // element count the statistics view addresses (checked above / allocated for this
        // object); dx is a `&mut` distinct from x and from the object's scratch; the scale, the
        // discarded gradients and the saved statistics hold `R` parameters on this context;
        // the statistics were saved by this object's forward (same view and mode) on this x
        // (checked); scalars are `T::Scalar`; the guards keep every buffer alive and ordered
        // until enqueued.
        unsafe {
            ffi::cudnnBatchNormalizationBackward(
                cudnn.lib(),
                cudnn.as_raw(),
                self.view_mode,
                scalar_ptr(&one),
                scalar_ptr(&zero),
                scalar_ptr(&one),
                scalar_ptr(&zero),
                self.view.as_raw(),
                xp as *const c_void,
                self.view.as_raw(),
                tp as *const c_void,
                self.view.as_raw(),
                dxp as *mut c_void,
                self.stats.as_raw(),
                sp as *const c_void,
                dsp as *mut c_void,
                dbp as *mut c_void,
                self.epsilon,
                mp as *const c_void,
                ip as *const c_void,
            )
        }
    }
}

/// The first plan cuDNN's heuristics build for `g` (a normalization graph: its engines are
/// few and the heuristics' first is the fused one), or [`Error::NoAlgorithm`] naming `op`.
pub(super) fn first_graph_plan(
    cudnn: &Cudnn,
    g: &crate::graph::Graph,
    op: &'static str,
) -> Result<crate::graph::Plan> {
    let og = g.build(cudnn)?;
    og.plans(cudnn, &crate::graph::PlanFilter::new().max_plans(Some(1)))?
        .plans
        .into_iter()
        .next()
        .ok_or_else(|| Error::NoAlgorithm {
            op,
            detail: "cuDNN built no plan for the normalization graph".into(),
        })
}

/// Checks that saved values (`(object id, x address)` as the training forward recorded them)
/// came from the training forward of the object `id` on the buffer `x`: [`Error::InvalidArgument`]
/// naming `what` otherwise.
pub(super) fn check_saved_origin<T: DataType>(
    cudnn: &Cudnn,
    what: &'static str,
    expected: &'static str,
    (norm, x_at): (u64, u64),
    id: u64,
    x: &impl DeviceBuffer<T>,
) -> Result<()> {
    if norm != id {
        return Err(Error::invalid(
            what,
            expected,
            "values saved by another object",
        ));
    }
    let (xp, _guard) = x.device_ptr(cudnn.stream());
    if xp != x_at {
        return Err(Error::invalid(
            what,
            "x to be the buffer the training forward read",
            format!("x at {xp:#x}, the forward read x at {x_at:#x}"),
        ));
    }
    Ok(())
}

/// What a layer / group normalization training forward saves for the backward pass: the
/// normalized input `x̂` (`x`'s element count, type `T`) and, per normalized group, the mean and
/// the inverse standard deviation `1/sqrt(σ² + ε)` (biased variance), of type `T::Param`.
///
/// The backward call checks that it came from the same normalization object and that `x` is the
/// buffer the forward read.
pub struct NormSaved<'x, T: NormType> {
    xhat: CudaSlice<T>,
    mean: CudaSlice<T::Param>,
    inv_std: CudaSlice<T::Param>,
    norm: u64,
    /// Device address of the `x` the forward read; `x` stays borrowed (`'x`) while this
    /// value lives, so no other buffer can be at that address.
    x: u64,
    _x: PhantomData<&'x ()>,
}

impl<T: NormType> fmt::Debug for NormSaved<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NormSaved")
            .field("elements", &self.xhat.len())
            .field("groups", &self.mean.len())
            .finish()
    }
}

impl<T: NormType> NormSaved<'_, T> {
    /// The normalized input `x̂ = (x − μ)/sqrt(σ² + ε)`, laid out as `x`.
    pub fn xhat(&self) -> &CudaSlice<T> {
        &self.xhat
    }
    /// The mean of each normalized group (row-major over the batch and group indices, like
    /// PyTorch's `[N, G]` for group norm and `[rows]` for layer norm).
    pub fn mean(&self) -> &CudaSlice<T::Param> {
        &self.mean
    }
    /// `1/sqrt(σ² + ε)` of each group (PyTorch's `rstd`), ordered as [`mean`](Self::mean).
    pub fn inv_std(&self) -> &CudaSlice<T::Param> {
        &self.inv_std
    }
}

/// Layer normalization over the trailing dimensions of a packed row-major tensor:
/// each row of `D` features (the product of the normalized dimensions) is normalized, then
/// `y = x̂·γ + β` with `γ`, `β` of `D` elements of type `T` (PyTorch's `layer_norm` with
/// `normalized_shape` = those trailing dimensions).
///
/// Computed by cuDNN as described in the [module documentation](crate::norm): batch-norm
/// statistics over the regrouped view `[1, rows, D, 1]`, then the affine map, by default
/// ([`NormMethod::default_for_layer`]) as one batch-norm inference on the channels-last view
/// `[1, D, rows, 1]` of the same memory, and `dγ`, `dβ` as two-stage reductions over the rows
/// ([`NormParamGrads::TwoStageReduce`]); other formulations of the same computation are chosen
/// with [`with_method`](Self::with_method).
/// Built once for a shape; it owns its descriptors and a few scratch buffers (see the memory
/// note there). `Send`, not `Sync`.
///
/// ```no_run
/// use cudnn_safe::norm::{LayerNorm, NormMethod};
/// use cudnn_safe::{cuda_context, Cudnn, Workspace};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let cudnn = Cudnn::new(stream.clone())?;
/// let ln = LayerNorm::<f32>::new(&[8, 128, 512], 1, 1e-5)? // normalize the last dim
///     .with_method(NormMethod::reductions())?; // optional: another formulation
/// let x = stream.clone_htod(&vec![0.5f32; ln.len()]).unwrap();
/// let gamma = stream.clone_htod(&vec![1.0f32; 512]).unwrap();
/// let beta = stream.alloc_zeros::<f32>(512).unwrap();
/// let mut y = stream.alloc_zeros::<f32>(ln.len()).unwrap();
/// let saved = cudnn.layer_norm_forward_training(&ln, &x, &gamma, &beta, &mut y)?;
/// let dy = stream.clone_htod(&vec![1.0f32; ln.len()]).unwrap();
/// let mut dx = stream.alloc_zeros::<f32>(ln.len()).unwrap();
/// let (mut dgamma, mut dbeta) = (stream.alloc_zeros::<f32>(512).unwrap(), stream.alloc_zeros::<f32>(512).unwrap());
/// let mut ws = Workspace::new(stream.clone());
/// cudnn.layer_norm_backward(&ln, &saved, &x, &dy, &gamma, &mut dx, &mut dgamma, &mut dbeta, &mut ws)?;
/// # Ok(()) }
/// ```
pub struct LayerNorm<T: NormType> {
    core: Regrouped<T>,
    dims: Vec<i64>,
    normalized: usize,
    /// The graph formulation's plan, built on first use
    /// ([`Cudnn::layer_norm_forward_graph`]); `RefCell` keeps the object `Send` and not `Sync`.
    graph: RefCell<Option<Box<LayerNormGraph>>>,
    /// The graph training path's two plans, built on first use
    /// ([`Cudnn::layer_norm_forward_training_graph`]).
    train: RefCell<Option<Box<LayerNormTrainGraphs>>>,
}

/// The built plans of [`LayerNorm`]'s graph training path (forward in the training phase, and
/// backward) and the ids of their tensors.
struct LayerNormTrainGraphs {
    fwd: crate::graph::Plan,
    /// Forward: x, γ, β in; y, mean, inverse standard deviation out.
    fwd_ids: [crate::graph::TensorId; 6],
    bwd: crate::graph::Plan,
    /// Backward: dy, x, γ, mean, inverse standard deviation in; dx, dγ, dβ out.
    bwd_ids: [crate::graph::TensorId; 8],
}

/// What [`Cudnn::layer_norm_forward_training_graph`] saves for
/// [`Cudnn::layer_norm_backward_graph`]: the per-row mean and inverse standard deviation
/// `1/sqrt(σ² + ε)` (biased variance) as f32, [`LayerNorm::rows`] each. Unlike [`NormSaved`]
/// no `x̂` is kept (the graph backward recomputes it from `x`), so it costs `8·rows` bytes.
///
/// The backward call checks that it came from the same normalization object and that `x` is
/// the buffer the forward read.
pub struct LayerNormGraphSaved<'x> {
    mean: CudaSlice<f32>,
    inv_std: CudaSlice<f32>,
    norm: u64,
    /// Device address of the `x` the forward read; `x` stays borrowed (`'x`) while this
    /// value lives, so no other buffer can be at that address.
    x: u64,
    _x: PhantomData<&'x ()>,
}

impl fmt::Debug for LayerNormGraphSaved<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNormGraphSaved")
            .field("rows", &self.mean.len())
            .finish()
    }
}

impl LayerNormGraphSaved<'_> {
    /// The mean of each row (PyTorch's `mean` of `native_layer_norm`, `[rows]`).
    pub fn mean(&self) -> &CudaSlice<f32> {
        &self.mean
    }
    /// `1/sqrt(σ² + ε)` of each row (PyTorch's `rstd`), ordered as [`mean`](Self::mean).
    pub fn inv_std(&self) -> &CudaSlice<f32> {
        &self.inv_std
    }
}

/// A built plan of [`LayerNorm`]'s graph formulation and the ids of its tensors.
struct LayerNormGraph {
    plan: crate::graph::Plan,
    x: crate::graph::TensorId,
    gamma: crate::graph::TensorId,
    beta: crate::graph::TensorId,
    y: crate::graph::TensorId,
}

impl<T: NormType> fmt::Debug for LayerNorm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNorm")
            .field("dtype", &T::DTYPE)
            .field("dims", &self.dims)
            .field("normalized_dims", &self.normalized)
            .field("epsilon", &self.core.epsilon)
            .field("method", &self.core.method)
            .finish()
    }
}

impl<T: NormType> LayerNorm<T> {
    /// Layer normalization of a packed tensor with dimensions `dims`, over its last
    /// `normalized_dims` dimensions (1 to `dims.len()`), with epsilon `epsilon` (finite, ≥ 0).
    pub fn new(dims: &[i64], normalized_dims: usize, epsilon: f64) -> Result<Self> {
        packed(dims)?;
        if normalized_dims == 0 || normalized_dims > dims.len() {
            return Err(Error::invalid(
                "layer-norm normalized dimensions",
                format!("1 to {} trailing dimensions", dims.len()),
                normalized_dims,
            ));
        }
        let split = dims.len() - normalized_dims;
        // Products bounded by the element count `packed` validated.
        let rows: i64 = dims[..split].iter().product();
        let features: i64 = dims[split..].iter().product();
        Ok(LayerNorm {
            core: Regrouped::new(
                rows,
                features,
                1,
                1,
                epsilon,
                NormMethod::default_for_layer(),
            )?,
            dims: dims.to_vec(),
            normalized: normalized_dims,
            graph: RefCell::new(None),
            train: RefCell::new(None),
        })
    }
    /// The tensor dimensions.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }
    /// Elements of `x`, `y`, `dy`, `dx`.
    pub fn len(&self) -> usize {
        self.core.len()
    }
    /// Whether the tensor is empty (never: every dimension is at least 1).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Rows normalized (product of the leading dimensions); also the length of the saved
    /// statistics.
    pub fn rows(&self) -> usize {
        self.core.rows
    }
    /// Features per row (product of the normalized dimensions): the length of `γ` and `β`.
    pub fn features(&self) -> usize {
        self.core.features()
    }
    /// The epsilon.
    pub fn epsilon(&self) -> f64 {
        self.core.epsilon
    }
    /// The formulation used (by default [`NormMethod::default_for_layer`]).
    pub fn method(&self) -> NormMethod {
        self.core.method
    }
    /// The same normalization computed with another formulation ([`NormMethod`]): every
    /// method gives the same result up to rounding; they differ in speed. Rebuilds the
    /// descriptors (host only); saved values of the old object do not fit the new one.
    pub fn with_method(self, method: NormMethod) -> Result<Self> {
        Ok(Self {
            core: self.core.with_method(method)?,
            ..self
        })
    }
    /// Workspace bytes the backward pass grows `workspace` to (the reductions of
    /// [`NormParamGrads::TwoStageReduce`], the default, and of [`NormParamGrads::Reduce`]; 0
    /// with [`NormParamGrads::BatchNormBackward`]), e.g. to size a
    /// [`Workspace::with_limit`]. Queries cuDNN.
    #[doc(alias = "cudnnGetReductionWorkspaceSize")]
    pub fn backward_workspace_size(&self, cudnn: &Cudnn) -> Result<usize> {
        self.core.backward_workspace_size(cudnn)
    }

    /// Builds (once per object and handle) the plan of the graph formulation that
    /// [`Cudnn::layer_norm_forward_graph`] runs: one cuDNN `NORM_FORWARD` operation
    /// ([`Graph::layer_norm`](crate::graph::Graph::layer_norm), inference phase) on the rows
    /// `[rows, features, 1, 1]`, with `γ` and `β` of type `T`. The first build in a process
    /// takes seconds (cuDNN compiles the kernel at run time), hence an explicit call; later
    /// calls on the same handle return at once. f64 has no norm engine:
    /// [`Error::UnsupportedDataType`]. A configuration no engine runs:
    /// [`Error::NoAlgorithm`] or [`Error::Cudnn`].
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    pub fn build_graph_plan(&self, cudnn: &Cudnn) -> Result<()> {
        use crate::graph::Graph;
        if let Some(g) = self.graph.borrow().as_ref() {
            if g.plan.graph.check_handle(cudnn).is_ok() {
                return Ok(());
            }
        }
        let (rows, d) = (self.core.rows as i64, self.core.features() as i64);
        let mut g = Graph::new(T::DTYPE, crate::DType::F32, crate::DType::F32);
        let x = g.tensor_nhwc("x", &[rows, d, 1, 1], T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &[1, d, 1, 1], T::DTYPE)?;
        let beta = g.tensor_nhwc("beta", &[1, d, 1, 1], T::DTYPE)?;
        let out = g.layer_norm(x, gamma, beta, self.core.epsilon, false)?;
        g.mark_output(out.y)?;
        let plan = first_graph_plan(cudnn, &g, "layer norm (graph)")?;
        *self.graph.borrow_mut() = Some(Box::new(LayerNormGraph {
            plan,
            x,
            gamma,
            beta,
            y: out.y,
        }));
        Ok(())
    }

    /// Whether [`build_graph_plan`](Self::build_graph_plan) has built a plan (for some handle).
    pub fn has_graph_plan(&self) -> bool {
        self.graph.borrow().is_some()
    }

    /// Builds (once per object and handle) the two plans of the graph training path,
    /// [`Cudnn::layer_norm_forward_training_graph`] and [`Cudnn::layer_norm_backward_graph`]:
    /// one cuDNN `NORM_FORWARD` operation in the training phase and one `NORM_BACKWARD`
    /// ([`Graph::layer_norm`](crate::graph::Graph::layer_norm),
    /// [`Graph::layer_norm_backward`](crate::graph::Graph::layer_norm_backward)) on the rows
    /// `[rows, features, 1, 1]`, with `γ`, `β`, `dγ`, `dβ` of type `T` and f32 statistics
    /// (with cuDNN 9.14 and 9.19, f16/bf16 data got a backward engine only with
    /// `γ` and its gradients of the data type, or all of them f32; the data type's keeps the
    /// object's buffers). The first build in a process takes seconds (runtime compilation);
    /// later calls on the same handle return at once. f64 has no norm engine:
    /// [`Error::UnsupportedDataType`]. A configuration no engine runs: [`Error::NoAlgorithm`]
    /// or [`Error::Cudnn`].
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    pub fn build_graph_training_plans(&self, cudnn: &Cudnn) -> Result<()> {
        use crate::graph::Graph;
        if let Some(g) = self.train.borrow().as_ref() {
            if g.fwd.graph.check_handle(cudnn).is_ok() && g.bwd.graph.check_handle(cudnn).is_ok() {
                return Ok(());
            }
        }
        let (rows, d) = (self.core.rows as i64, self.core.features() as i64);
        let first_plan = |g: &Graph| first_graph_plan(cudnn, g, "layer norm training (graph)");
        let (x_dims, p_dims, s_dims) = ([rows, d, 1, 1], [1, d, 1, 1], [rows, 1, 1, 1]);
        let mut g = Graph::new(T::DTYPE, crate::DType::F32, crate::DType::F32);
        let x = g.tensor_nhwc("x", &x_dims, T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &p_dims, T::DTYPE)?;
        let beta = g.tensor_nhwc("beta", &p_dims, T::DTYPE)?;
        let out = g.layer_norm(x, gamma, beta, self.core.epsilon, true)?;
        let (mean, inv) = out.stats.expect("the training phase has statistics");
        g.mark_output(out.y)?;
        g.mark_output_as(mean, crate::DType::F32)?;
        g.mark_output_as(inv, crate::DType::F32)?;
        let fwd = first_plan(&g)?;
        let fwd_ids = [x, gamma, beta, out.y, mean, inv];

        let mut g = Graph::new(T::DTYPE, crate::DType::F32, crate::DType::F32);
        let dy = g.tensor_nhwc("dy", &x_dims, T::DTYPE)?;
        let x = g.tensor_nhwc("x", &x_dims, T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &p_dims, T::DTYPE)?;
        let mean = g.tensor_nhwc("mean", &s_dims, crate::DType::F32)?;
        let inv = g.tensor_nhwc("inv_std", &s_dims, crate::DType::F32)?;
        let grads = g.layer_norm_backward(dy, x, gamma, mean, inv)?;
        g.mark_output(grads.dx)?;
        g.mark_output(grads.dscale)?;
        g.mark_output(grads.dbias)?;
        let bwd = first_plan(&g)?;
        let bwd_ids = [dy, x, gamma, mean, inv, grads.dx, grads.dscale, grads.dbias];
        *self.train.borrow_mut() = Some(Box::new(LayerNormTrainGraphs {
            fwd,
            fwd_ids,
            bwd,
            bwd_ids,
        }));
        Ok(())
    }

    /// Whether [`build_graph_training_plans`](Self::build_graph_training_plans) has built the
    /// plans (for some handle).
    pub fn has_graph_training_plans(&self) -> bool {
        self.train.borrow().is_some()
    }
}

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
/// [`Cudnn::transform_tensor`] first. `Send`, not `Sync`.
pub struct GroupNorm<T: NormType> {
    core: Regrouped<T>,
    dims: Vec<i64>,
    groups: i64,
}

impl<T: NormType> fmt::Debug for GroupNorm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupNorm")
            .field("dtype", &T::DTYPE)
            .field("dims", &self.dims)
            .field("groups", &self.groups)
            .field("epsilon", &self.core.epsilon)
            .field("method", &self.core.method)
            .finish()
    }
}

impl<T: NormType> GroupNorm<T> {
    /// Group normalization of a packed `[N, C, spatial...]` tensor (at least 2 dimensions) in
    /// `groups` groups (`C % groups == 0`), with epsilon `epsilon` (finite, ≥ 0).
    pub fn new(dims: &[i64], groups: i64, epsilon: f64) -> Result<Self> {
        packed(dims)?;
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
            dims: dims.to_vec(),
            groups,
        })
    }
    /// Instance normalization: one group per channel.
    pub fn instance(dims: &[i64], epsilon: f64) -> Result<Self> {
        let c = dims.get(1).copied().unwrap_or(0);
        Self::new(dims, c, epsilon)
    }
    /// The tensor dimensions.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }
    /// Elements of `x`, `y`, `dy`, `dx`.
    pub fn len(&self) -> usize {
        self.core.len()
    }
    /// Whether the tensor is empty (never: every dimension is at least 1).
    pub fn is_empty(&self) -> bool {
        false
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
    /// The epsilon.
    pub fn epsilon(&self) -> f64 {
        self.core.epsilon
    }
    /// The formulation used (by default [`NormMethod::default_for_group`]).
    pub fn method(&self) -> NormMethod {
        self.core.method
    }
    /// The same normalization computed with another formulation ([`NormMethod`]): every
    /// method gives the same result up to rounding; they differ in speed. Rebuilds the
    /// descriptors (host only); saved values of the old object do not fit the new one.
    pub fn with_method(self, method: NormMethod) -> Result<Self> {
        Ok(Self {
            core: self.core.with_method(method)?,
            ..self
        })
    }
    /// Workspace bytes the backward pass grows `workspace` to (the reductions of
    /// [`NormParamGrads::Reduce`] and [`NormParamGrads::TwoStageReduce`]; 0 with
    /// [`NormParamGrads::BatchNormBackward`], the default), e.g. to size a
    /// [`Workspace::with_limit`]. Queries cuDNN.
    #[doc(alias = "cudnnGetReductionWorkspaceSize")]
    pub fn backward_workspace_size(&self, cudnn: &Cudnn) -> Result<usize> {
        self.core.backward_workspace_size(cudnn)
    }
}

impl Cudnn {
    /// Layer normalization forward, `y = (x − μ)/sqrt(σ² + ε)·γ + β` per row, saving nothing
    /// (for inference, or when the backward pass is not needed). `x`, `y`: [`LayerNorm::len`]
    /// elements; `γ`, `β`: [`LayerNorm::features`].
    #[doc(alias = "cudnnBatchNormalizationForwardTraining")]
    pub fn layer_norm_forward<T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        ln.core.forward(self, x, gamma, beta, y)
    }

    /// [`layer_norm_forward`](Self::layer_norm_forward) through the graph formulation: one
    /// fused cuDNN normalization kernel instead of the batch-norm-based steps. Opt-in because
    /// the plan is built on first use ([`LayerNorm::build_graph_plan`], seconds the first time
    /// in a process: runtime compilation) and kept in `ln` for later calls on this handle.
    ///
    /// Same buffers as [`layer_norm_forward`](Self::layer_norm_forward) (`x`, `y`:
    /// [`LayerNorm::len`] elements, `γ`, `β`: [`LayerNorm::features`]), all checked before
    /// anything is enqueued; `workspace` is grown (within its limit) to the plan's need.
    /// f64 is refused ([`Error::UnsupportedDataType`]): cuDNN has no f64 norm engine.
    ///
    /// ```no_run
    /// use cudnn_safe::norm::LayerNorm;
    /// use cudnn_safe::{cuda_context, Cudnn, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let ln = LayerNorm::<f32>::new(&[32768, 1024], 1, 1e-5)?;
    /// ln.build_graph_plan(&cudnn)?; // seconds, once
    /// let x = stream.clone_htod(&vec![0.5f32; ln.len()]).unwrap();
    /// let gamma = stream.clone_htod(&vec![1.0f32; 1024]).unwrap();
    /// let beta = stream.alloc_zeros::<f32>(1024).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(ln.len()).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// cudnn.layer_norm_forward_graph(&ln, &x, &gamma, &beta, &mut y, &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    pub fn layer_norm_forward_graph<T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        ln.build_graph_plan(self)?;
        let cached = ln.graph.borrow();
        let g = cached.as_ref().expect("built above");
        let mut args = crate::graph::Args::new(self);
        args.input(g.x, x)?
            .input(g.gamma, gamma)?
            .input(g.beta, beta)?;
        args.output(g.y, y)?;
        self.execute(&g.plan, &args, workspace)
    }

    /// [`layer_norm_forward`](Self::layer_norm_forward) that also returns `x̂` and the per-row
    /// mean and inverse standard deviation for [`layer_norm_backward`](Self::layer_norm_backward).
    pub fn layer_norm_forward_training<'x, T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        x: &'x impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<NormSaved<'x, T>> {
        ln.core.forward_training(self, x, gamma, beta, y)
    }

    /// [`layer_norm_forward_training`](Self::layer_norm_forward_training) through the graph
    /// formulation: one fused cuDNN normalization kernel writes `y` and the per-row mean and
    /// inverse standard deviation, which it returns for
    /// [`layer_norm_backward_graph`](Self::layer_norm_backward_graph), instead of the
    /// batch-norm-based steps' several passes over the tensor. The plans
    /// are built on first use ([`LayerNorm::build_graph_training_plans`], seconds the first
    /// time in a process) and kept in `ln` for later calls on this handle.
    ///
    /// `x`, `y`: [`LayerNorm::len`] elements; `γ`, `β`: [`LayerNorm::features`]; all checked
    /// (span, context, `y` not overlapping an input) before anything is enqueued, and the
    /// statistics are allocated on the handle's stream. `workspace` is grown (within its limit)
    /// to the plan's need. f64 is refused ([`Error::UnsupportedDataType`]).
    ///
    /// ```no_run
    /// use cudnn_safe::norm::LayerNorm;
    /// use cudnn_safe::{cuda_context, Cudnn, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let ln = LayerNorm::<f32>::new(&[8, 512, 1024], 1, 1e-5)?;
    /// ln.build_graph_training_plans(&cudnn)?; // seconds, once
    /// let x = stream.clone_htod(&vec![0.5f32; ln.len()]).unwrap();
    /// let gamma = stream.clone_htod(&vec![1.0f32; 1024]).unwrap();
    /// let beta = stream.alloc_zeros::<f32>(1024).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(ln.len()).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// let saved = cudnn.layer_norm_forward_training_graph(&ln, &x, &gamma, &beta, &mut y, &mut ws)?;
    /// let dy = stream.clone_htod(&vec![1.0f32; ln.len()]).unwrap();
    /// let mut dx = stream.alloc_zeros::<f32>(ln.len()).unwrap();
    /// let mut dgamma = stream.alloc_zeros::<f32>(1024).unwrap();
    /// let mut dbeta = stream.alloc_zeros::<f32>(1024).unwrap();
    /// cudnn.layer_norm_backward_graph(
    ///     &ln, &saved, &x, &dy, &gamma, &mut dx, &mut dgamma, &mut dbeta, &mut ws,
    /// )?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_NORM_FWD_TRAINING")]
    pub fn layer_norm_forward_training_graph<'x, T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        x: &'x impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<LayerNormGraphSaved<'x>> {
        ln.build_graph_training_plans(self)?;
        let cached = ln.train.borrow();
        let g = cached.as_ref().expect("built above");
        let [xi, gi, bi, yi, mi, vi] = g.fwd_ids;
        let alloc_err = |e| Error::driver("allocating layer-norm statistics", e);
        let mut mean = self
            .stream()
            .alloc_zeros::<f32>(ln.rows())
            .map_err(alloc_err)?;
        let mut inv_std = self
            .stream()
            .alloc_zeros::<f32>(ln.rows())
            .map_err(alloc_err)?;
        let x_at = {
            let (p, _guard) = x.device_ptr(self.stream());
            p
        };
        {
            let mut args = crate::graph::Args::new(self);
            args.input(xi, x)?.input(gi, gamma)?.input(bi, beta)?;
            args.output(yi, y)?
                .output(mi, &mut mean)?
                .output(vi, &mut inv_std)?;
            self.execute(&g.fwd, &args, workspace)?;
        }
        Ok(LayerNormGraphSaved {
            mean,
            inv_std,
            norm: ln.core.id,
            x: x_at,
            _x: PhantomData,
        })
    }

    /// Layer normalization backward through the graph formulation: one fused cuDNN kernel
    /// writes `dx`, `dγ = Σ_rows dy·x̂` and `dβ = Σ_rows dy` (overwriting them) from `dy`, `x`,
    /// `γ` and the statistics `saved` by
    /// [`layer_norm_forward_training_graph`](Self::layer_norm_forward_training_graph) of this
    /// `ln` on this `x` (both checked: [`Error::InvalidArgument`]), in one pass where
    /// [`layer_norm_backward`](Self::layer_norm_backward) makes several.
    ///
    /// `x`, `dy`, `dx`: [`LayerNorm::len`] elements; `γ`, `dγ`, `dβ`:
    /// [`LayerNorm::features`]; every buffer is checked (span, context, outputs not
    /// overlapping) before anything is enqueued, so a rejected call writes nothing.
    /// `workspace` is grown (within its limit) to the plan's need. An example is at
    /// [`layer_norm_forward_training_graph`](Self::layer_norm_forward_training_graph).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    pub fn layer_norm_backward_graph<T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        saved: &LayerNormGraphSaved<'_>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        check_saved_origin(
            self,
            "layer-norm saved values",
            "the value returned by a graph training forward of this LayerNorm",
            (saved.norm, saved.x),
            ln.core.id,
            x,
        )?;
        // The saved values were allocated on the forward's stream: order this use with it.
        let _order = crate::stream_order::cross_use(saved.mean.stream(), self.stream())?;
        ln.build_graph_training_plans(self)?;
        let cached = ln.train.borrow();
        let g = cached.as_ref().expect("built above");
        let [dyi, xi, gi, mi, vi, dxi, dgi, dbi] = g.bwd_ids;
        let mut args = crate::graph::Args::new(self);
        args.input(dyi, dy)?
            .input(xi, x)?
            .input(gi, gamma)?
            .input(mi, &saved.mean)?
            .input(vi, &saved.inv_std)?;
        args.output(dxi, dx)?
            .output(dgi, dgamma)?
            .output(dbi, dbeta)?;
        self.execute(&g.bwd, &args, workspace)
    }

    /// Layer normalization backward: writes `dx`, `dγ = Σ_rows dy·x̂` and `dβ = Σ_rows dy`
    /// (overwriting them) from `dy` and the values `saved` by
    /// [`layer_norm_forward_training`](Self::layer_norm_forward_training) of this `ln` on this
    /// `x` (checked). `workspace` serves the reductions of the default
    /// [`NormParamGrads::TwoStageReduce`] and of [`NormParamGrads::Reduce`], grown (within its
    /// limit) to [`LayerNorm::backward_workspace_size`] before anything is written.
    #[doc(alias = "cudnnBatchNormalizationBackward")]
    #[doc(alias = "cudnnReduceTensor")]
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    pub fn layer_norm_backward<T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        saved: &NormSaved<'_, T>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        ln.core
            .backward(self, saved, x, dy, gamma, dx, dgamma, dbeta, workspace)
    }

    /// Group (or instance) normalization forward, saving nothing. `x`, `y`:
    /// [`GroupNorm::len`] elements; `γ`, `β`: [`GroupNorm::channels`].
    #[doc(alias = "cudnnBatchNormalizationForwardTraining")]
    pub fn group_norm_forward<T: NormType>(
        &self,
        gn: &GroupNorm<T>,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        gn.core.forward(self, x, gamma, beta, y)
    }

    /// [`group_norm_forward`](Self::group_norm_forward) that also returns `x̂` and the
    /// per-group mean and inverse standard deviation (`[N, G]`) for
    /// [`group_norm_backward`](Self::group_norm_backward).
    pub fn group_norm_forward_training<'x, T: NormType>(
        &self,
        gn: &GroupNorm<T>,
        x: &'x impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<NormSaved<'x, T>> {
        gn.core.forward_training(self, x, gamma, beta, y)
    }

    /// Group (or instance) normalization backward: writes `dx`, `dγ = Σ_{n,spatial} dy·x̂` and
    /// `dβ = Σ_{n,spatial} dy` per channel (overwriting them) from `dy` and the values `saved`
    /// by [`group_norm_forward_training`](Self::group_norm_forward_training) of this `gn` on
    /// this `x` (checked). `workspace` serves the reductions of [`NormParamGrads::Reduce`]
    /// and [`NormParamGrads::TwoStageReduce`], grown (within its limit) to
    /// [`GroupNorm::backward_workspace_size`] before anything is written; the default method
    /// uses none.
    #[doc(alias = "cudnnBatchNormalizationBackward")]
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    pub fn group_norm_backward<T: NormType>(
        &self,
        gn: &GroupNorm<T>,
        saved: &NormSaved<'_, T>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        gn.core
            .backward(self, saved, x, dy, gamma, dx, dgamma, dbeta, workspace)
    }
}
