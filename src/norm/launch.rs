//! The raw batch-normalization launches shared by [`BatchNorm`](super::BatchNorm) and the
//! regrouped normalizations (layer, group, instance norm): one `unsafe` call each, taking the
//! descriptors and the buffers' device addresses, whose callers check and keep the buffers.
use std::ffi::c_void;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use cudnn_safe_sys as sys;

use super::{ffi, scalar_ptr, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::error::Result;
use crate::handle::Cudnn;

/// `cudnnBatchNormalizationForwardInference` with `[alpha, beta]`, `x` and `y` described by
/// `data`, and `[scale, bias, mean, variance]` by `param`, every buffer by its device address.
///
/// # Safety
/// The handle is bound; `data` and `param` are live descriptors for `mode`; every address holds
/// its descriptor's span on the handle's context (the parameters of `T::Param`), kept alive and
/// ordered on the handle's stream by the caller until this returns; `y` overlaps no input.
pub(super) unsafe fn batch_norm_inference_raw<T: NormType>(
    cudnn: &Cudnn,
    mode: sys::cudnnBatchNormMode_t,
    [alpha, beta]: [T::Scalar; 2],
    (data, param): (sys::cudnnTensorDescriptor_t, sys::cudnnTensorDescriptor_t),
    [x, y]: [u64; 2],
    [scale, bias, mean, variance]: [u64; 4],
    epsilon: f64,
) -> Result<()> {
    // SAFETY: the caller's contract; the scalars live on this frame.
    unsafe {
        ffi::cudnnBatchNormalizationForwardInference(
            cudnn.lib(),
            cudnn.as_raw(),
            mode,
            scalar_ptr(&alpha),
            scalar_ptr(&beta),
            data,
            x as *const c_void,
            data,
            y as *mut c_void,
            param,
            scale as *const c_void,
            bias as *const c_void,
            mean as *const c_void,
            variance as *const c_void,
            epsilon,
        )
    }
}

/// `cudnnBatchNormalizationForwardTraining` with `[alpha, beta]`, `x` and `y` described by
/// `data`, the scale, bias, running statistics (`(factor, mean, variance)`, null pointers for
/// none) and saved statistics (`(mean, inverse standard deviation)`, null pointers for none)
/// by `param`.
///
/// # Safety
/// The handle is bound; `data` and `param` are live descriptors for `mode`; `[x, y, scale,
/// bias]` are device addresses and every non-null pointer holds its descriptor's span on the
/// handle's context (the parameters of `T::Param`), kept alive and ordered on the handle's
/// stream by the caller until this returns; each pair of pointers is both null or both given;
/// the outputs overlap neither themselves nor an input.
#[allow(clippy::too_many_arguments)] // mirrors the C call
pub(super) unsafe fn batch_norm_training_raw<T: NormType>(
    cudnn: &Cudnn,
    mode: sys::cudnnBatchNormMode_t,
    [alpha, beta]: [T::Scalar; 2],
    (data, param): (sys::cudnnTensorDescriptor_t, sys::cudnnTensorDescriptor_t),
    [x, y, scale, bias]: [u64; 4],
    (factor, running_mean, running_var): (f64, *mut c_void, *mut c_void),
    epsilon: f64,
    (mean, inv_std): (*mut c_void, *mut c_void),
) -> Result<()> {
    // SAFETY: the caller's contract; the scalars live on this frame.
    unsafe {
        ffi::cudnnBatchNormalizationForwardTraining(
            cudnn.lib(),
            cudnn.as_raw(),
            mode,
            scalar_ptr(&alpha),
            scalar_ptr(&beta),
            data,
            x as *const c_void,
            data,
            y as *mut c_void,
            param,
            scale as *const c_void,
            bias as *const c_void,
            factor,
            running_mean,
            running_var,
            epsilon,
            mean,
            inv_std,
        )
    }
}

/// The buffers of one `cudnnBatchNormalizationBackward` call: `x` (its device address, kept
/// alive by the caller's guard), `dy`, `dx` of the data type, the others of the parameter type.
pub(super) struct BnBackwardBufs<'a, DY, DX, S, DS, DB> {
    pub(super) x: u64,
    pub(super) dy: &'a DY,
    pub(super) dx: &'a mut DX,
    pub(super) scale: &'a S,
    pub(super) dscale: &'a mut DS,
    pub(super) dbias: &'a mut DB,
}

/// `cudnnBatchNormalizationBackward` with `alphas` = `[alpha_data, beta_data, alpha_param,
/// beta_param]`, the data buffers described by `data`, the parameters and `stats` (saved mean,
/// saved inverse standard deviation) by `param`.
///
/// # Safety
/// The handle is bound; `data` and `param` are live descriptors for `mode`; every buffer holds
/// its descriptor's span on the handle's context and the outputs overlap neither themselves nor
/// an input; `stats` were written by a training forward with the same descriptors, mode and
/// epsilon on the `x` at `bufs.x`, which the caller keeps alive and ordered on the handle's
/// stream until this returns.
pub(super) unsafe fn batch_norm_backward_raw<T, DY, DX, S, DS, DB>(
    cudnn: &Cudnn,
    mode: sys::cudnnBatchNormMode_t,
    alphas: [T::Scalar; 4],
    (data, param): (sys::cudnnTensorDescriptor_t, sys::cudnnTensorDescriptor_t),
    bufs: BnBackwardBufs<'_, DY, DX, S, DS, DB>,
    epsilon: f64,
    (mean, inv_std): (&CudaSlice<T::Param>, &CudaSlice<T::Param>),
) -> Result<()>
where
    T: NormType,
    DY: DeviceBuffer<T>,
    DX: DeviceBufferMut<T>,
    S: DeviceBuffer<T::Param>,
    DS: DeviceBufferMut<T::Param>,
    DB: DeviceBufferMut<T::Param>,
{
    let stream: &CudaStream = cudnn.stream();
    let (dyp, _gdy) = bufs.dy.device_ptr(stream);
    let (dxp, _gdx) = bufs.dx.device_ptr_mut(stream);
    let (sp, _gs) = bufs.scale.device_ptr(stream);
    let (dsp, _gds) = bufs.dscale.device_ptr_mut(stream);
    let (dbp, _gdb) = bufs.dbias.device_ptr_mut(stream);
    let (mp, _gm) = mean.device_ptr(stream);
    let (ip, _gi) = inv_std.device_ptr(stream);
    // SAFETY: the caller's contract; the guards keep every other buffer alive and ordered until
    // the call is enqueued.
    unsafe {
        batch_norm_backward_at::<T>(
            cudnn,
            mode,
            alphas,
            (data, param),
            [bufs.x, dyp, dxp],
            [sp, dsp, dbp],
            epsilon,
            [mp, ip],
        )
    }
}

/// `cudnnBatchNormalizationBackward` as [`batch_norm_backward_raw`], every buffer given by its
/// device address: `[x, dy, dx]` described by `data`, `[scale, dscale, dbias]` and
/// `[saved mean, saved inverse standard deviation]` by `param`.
///
/// # Safety
/// The handle is bound; `data` and `param` are live descriptors for `mode`; every address holds
/// its descriptor's span on the handle's context (the parameters of `T::Param`) and the outputs
/// overlap neither themselves nor an input; the saved statistics are those of a training
/// forward with the same descriptors, mode and epsilon on this `x`, or values the caller
/// chose for their effect on the formula; the caller keeps every buffer alive and ordered on
/// the handle's stream until this returns.
#[allow(clippy::too_many_arguments)] // mirrors the C call
pub(super) unsafe fn batch_norm_backward_at<T: NormType>(
    cudnn: &Cudnn,
    mode: sys::cudnnBatchNormMode_t,
    alphas: [T::Scalar; 4],
    (data, param): (sys::cudnnTensorDescriptor_t, sys::cudnnTensorDescriptor_t),
    [x, dy, dx]: [u64; 3],
    [scale, dscale, dbias]: [u64; 3],
    epsilon: f64,
    [mean, inv_std]: [u64; 2],
) -> Result<()> {
    let [alpha_data, beta_data, alpha_param, beta_param] = alphas;
    // SAFETY: the caller's contract; the scalars live on this frame.
    unsafe {
        ffi::cudnnBatchNormalizationBackward(
            cudnn.lib(),
            cudnn.as_raw(),
            mode,
            scalar_ptr(&alpha_data),
            scalar_ptr(&beta_data),
            scalar_ptr(&alpha_param),
            scalar_ptr(&beta_param),
            data,
            x as *const c_void,
            data,
            dy as *const c_void,
            data,
            dx as *mut c_void,
            param,
            scale as *const c_void,
            dscale as *mut c_void,
            dbias as *mut c_void,
            epsilon,
            mean as *const c_void,
            inv_std as *const c_void,
        )
    }
}
