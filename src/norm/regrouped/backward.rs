//! The backward path of the regrouped normalizations: `dγ`, `dβ` by the method's reductions
//! or batch-norm calls, then `dx` by the batch-norm backward of the statistics view.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudnn_safe_sys as sys;

use super::{
    same_param_type, FeatureScratch, GradsPlan, Regrouped, Scratch, TwoStage, TwoStageScratch,
};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::Scalar;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::norm::launch::{batch_norm_backward_at, batch_norm_backward_raw, BnBackwardBufs};
use crate::norm::method::NormAffine;
use crate::norm::saved::{check_saved_origin, NormSaved};
use crate::norm::NormType;
use crate::ops::OpTensorOp;
use crate::reduce::ReduceOp;
use crate::workspace::Workspace;

impl<T: NormType> Regrouped<T> {
    /// Workspace bytes of the backward pass: the reductions of [`NormParamGrads::Reduce`] or
    /// [`NormParamGrads::TwoStageReduce`] (the larger of its two stages, which share it).
    pub(in crate::norm) fn backward_workspace_size(&self, cudnn: &Cudnn) -> Result<usize> {
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
                batch_norm_backward_at::<T>(
                    cudnn,
                    sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL,
                    [one, zero, one, zero],
                    (self.feature.as_raw(), self.feature_param.as_raw()),
                    [xp, dyp, dxp],
                    [sp, dgp, dbp],
                    0.0,
                    [mp, ip],
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

    /// `dx`, `dγ`, `dβ` from `dy` and the saved forward values.
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    pub(in crate::norm) fn backward(
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
        self.check_backward(
            cudnn, saved, x, dy, gamma, &*dx, &*dgamma, &*dbeta, workspace,
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
        let xhat = saved_xhat(saved)?;
        self.param_grads(cudnn, scratch, xhat, dy, dgamma, dbeta, workspace)?;
        let Scratch {
            ones,
            dscale,
            dbias,
            big,
            feat,
            ..
        } = scratch;
        let tmp = big.as_mut().expect("allocated by ensure_scratch(.., true)");
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
        let (xp, _gx) = x.device_ptr(cudnn.stream());
        // SAFETY: live handle and descriptors; x, the scratch dx̂ and dx hold the packed
        // element count the statistics view addresses (checked above / allocated for this
        // object); dx is a `&mut` distinct from x and from the object's scratch; the scale, the
        // discarded gradients and the saved statistics hold `R` parameters on this context;
        // the statistics were saved by this object's forward (same view and mode) on this x
        // (checked); scalars are `T::Scalar`; `_gx` keeps x alive and ordered until enqueued.
        unsafe {
            batch_norm_backward_raw(
                cudnn,
                self.view_mode,
                [one, zero, one, zero],
                (self.view.as_raw(), self.stats.as_raw()),
                BnBackwardBufs {
                    x: xp,
                    dy: &*tmp,
                    dx,
                    scale: &*ones,
                    dscale,
                    dbias,
                },
                self.epsilon,
                (&saved.mean, &saved.inv_std),
            )
        }
    }

    /// Every check of [`backward`](Self::backward) before the first launch, so a rejected call
    /// writes nothing: buffers against the descriptors, the workspace's context, and the saved
    /// values' origin.
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    fn check_backward(
        &self,
        cudnn: &Cudnn,
        saved: &NormSaved<'_, T>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &impl DeviceBufferMut<T>,
        dgamma: &impl DeviceBufferMut<T>,
        dbeta: &impl DeviceBufferMut<T>,
        workspace: &Workspace,
    ) -> Result<()> {
        let (full, affine) = (self.full.layout(), self.affine.layout());
        cudnn.check_tensor("x", full, x, false)?;
        cudnn.check_tensor("dy", full, dy, false)?;
        cudnn.check_tensor("gamma", affine, gamma, false)?;
        cudnn.check_tensor("dx", full, dx, true)?;
        cudnn.check_tensor("dgamma", affine, dgamma, true)?;
        cudnn.check_tensor("dbeta", affine, dbeta, true)?;
        cudnn.check_tensor("saved x̂", full, saved_xhat(saved)?, false)?;
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
        Ok(())
    }

    /// `out = dy·x̂` elementwise (tensor-sized buffers).
    fn dy_times_xhat(
        &self,
        cudnn: &Cudnn,
        dy: &impl DeviceBuffer<T>,
        xhat: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        cudnn.op_tensor(
            OpTensorOp::Mul,
            one,
            &self.full,
            dy,
            one,
            &self.full,
            xhat,
            zero,
            &self.full,
            out,
        )
    }

    /// `dβ = Σ dy` and `dγ = Σ dy·x̂` (over every axis but the feature one) by the method's
    /// [`GradsPlan`], using the object's tensor-sized scratch for the product.
    #[allow(clippy::too_many_arguments)] // the gradients and their inputs
    fn param_grads(
        &self,
        cudnn: &Cudnn,
        scratch: &mut Scratch<T>,
        xhat: &CudaSlice<T>,
        dy: &impl DeviceBuffer<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let one = <T::Scalar as Scalar>::from_f64(1.0);
        let zero = <T::Scalar as Scalar>::from_f64(0.0);
        let Scratch {
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
                self.dy_times_xhat(cudnn, dy, xhat, tmp)?;
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
                self.param_grads_bn(cudnn, fs, xhat, dy, tmp, dgamma, dbeta)?;
            }
            GradsPlan::TwoStage(ts) => {
                // Allocated before the first launch, so a failed allocation writes nothing.
                let t = self.ensure_two_stage_scratch(cudnn, ts, two_stage)?;
                // dβ = Σ dy; dγ = Σ dy·x̂, the product in the tensor-sized scratch.
                self.sum_two_stage(cudnn, ts, t, dy, dbeta, workspace)?;
                self.dy_times_xhat(cudnn, dy, xhat, tmp)?;
                self.sum_two_stage(cudnn, ts, t, &*tmp, dgamma, workspace)?;
            }
        }
        Ok(())
    }
}

/// The `x̂` a batch-norm formulation's training forward saved: [`Error::InvalidArgument`] for a
/// value the fused graph path saved (no `x̂`), which only that path's backward takes.
fn saved_xhat<'s, T: NormType>(saved: &'s NormSaved<'_, T>) -> Result<&'s CudaSlice<T>> {
    saved.xhat.as_ref().ok_or_else(|| {
        Error::invalid(
            "normalization saved values",
            "values saved by the batch-norm formulation's training forward (with x̂)",
            "values saved by a layer norm's fused graph path",
        )
    })
}
