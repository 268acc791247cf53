//! The engine of layer, instance and group normalization: cuDNN batch-norm calls on regrouped
//! views of the tensor (the method and its memory cost are described in the documentation of
//! [`crate::norm`]; the alternative formulations in [`NormMethod`]). Construction, scratch and
//! the forward paths here; the backward path in `backward.rs`.
use std::cell::RefCell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};
use cudnn_safe_sys as sys;

use super::launch::{batch_norm_inference_raw, batch_norm_training_raw};
use super::method::{
    near_square, two_stage_split, FeatureLayout, NormAffine, NormMethod, NormParamGrads, NormStats,
};
use super::saved::NormSaved;
use super::{check_epsilon, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DataType, Scalar};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::ops::OpTensorOp;
use crate::raw;
use crate::tensor::{Layout, TensorDesc};

mod api;
mod backward;

pub(super) use api::{regrouped_accessors, regrouped_launches};

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
pub(super) struct Regrouped<T: NormType> {
    pub(super) epsilon: f64,
    pub(super) method: NormMethod,
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
    pub(super) rows: usize,
    pub(super) id: u64,
    /// One set per stream served, none freed while the object lives: a CUDA graph captured on
    /// one stream keeps addressing that stream's set while another stream uses its own.
    scratch: RefCell<Vec<Scratch<T>>>,
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
    pub(super) fn new(
        a: i64,
        b: i64,
        s: i64,
        g: i64,
        epsilon: f64,
        method: NormMethod,
    ) -> Result<Self> {
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
            scratch: RefCell::new(Vec::new()),
        })
    }

    /// The same normalization computed with `method`.
    pub(super) fn with_method(&self, method: NormMethod) -> Result<Self> {
        let (a, b, s, g) = self.shape;
        Regrouped::new(a, b, s, g, self.epsilon, method)
    }

    pub(super) fn len(&self) -> usize {
        self.full.span()
    }

    /// The layout of x, y, dy, dx.
    pub(in crate::norm) fn full_layout(&self) -> &Layout {
        self.full.layout()
    }

    /// The layout of γ, β and their gradients.
    pub(in crate::norm) fn affine_layout(&self) -> &Layout {
        self.affine.layout()
    }

    pub(super) fn features(&self) -> usize {
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

    /// The scratch buffers of the handle's stream, allocated there at its first use; with
    /// `big`, also the tensor-sized scratch; the feature-view vectors when the method uses that
    /// view. Per stream, not just per context: a set is only used on the stream that allocated
    /// it, and its free (there, when the object drops) follows every use. Nothing is replaced,
    /// so a captured CUDA graph never addresses freed scratch. Streams compare with their
    /// context (every context's default stream has the same null handle).
    fn ensure_scratch<'s>(
        &self,
        cudnn: &Cudnn,
        slot: &'s mut Vec<Scratch<T>>,
        big: bool,
    ) -> Result<&'s mut Scratch<T>> {
        let stream: &Arc<CudaStream> = cudnn.stream();
        let alloc_err = |e| Error::driver("allocating normalization scratch", e);
        let one = <T::Param as DataType>::from_f64(1.0);
        let at = match slot
            .iter()
            .position(|s| s.ones.stream().as_ref() == stream.as_ref())
        {
            Some(at) => at,
            None => {
                slot.push(Scratch {
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
                slot.len() - 1
            }
        };
        let s = &mut slot[at];
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
            batch_norm_training_raw::<T>(
                cudnn,
                self.view_mode,
                [one, zero],
                (self.view.as_raw(), self.stats.as_raw()),
                [xp, op, sp, bp],
                (0.0, std::ptr::null_mut(), std::ptr::null_mut()),
                self.epsilon,
                (mp, ip),
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
            batch_norm_inference_raw::<T>(
                cudnn,
                sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                [one, zero],
                (self.feature.as_raw(), self.feature_param.as_raw()),
                [xp, yp],
                [gp, bp, mp, vp],
                0.0,
            )
        }
    }

    /// `y = normalize(x)·γ + β`, without saving anything.
    pub(super) fn forward(
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
    pub(super) fn forward_training<'x>(
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
            xhat: Some(xhat),
            mean,
            inv_std,
            norm: self.id,
            x: xp,
            _x: PhantomData,
        })
    }
}
