//! The extended batch-normalization calls (`cudnnBatchNormalizationForwardTrainingEx`,
//! `cudnnBatchNormalizationBackwardEx`): fused ReLU and add, workspace and reserve space.
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};

use super::batch::{check_origin, mismatch, BatchNorm, BatchNormOps, BatchNormSaved, RunningStats};
use super::batch::{TAG_BWD_WS, TAG_FWD_WS, TAG_RESERVE};
use super::{ffi, scalar_ptr, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::checks::{opt_ptr, opt_ptr_mut};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::workspace::Workspace;

impl Cudnn {
    /// Workspace and reserve-space bytes of the Ex training forward for `ops`.
    fn bn_ex_forward_sizes<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        ops: BatchNormOps,
    ) -> Result<(usize, usize)> {
        let act = bn.ex_activation(ops);
        let z = bn.ex_data_desc(ops.has_add());
        let ws = self.memo_bytes([TAG_FWD_WS, bn.id, ops.code(), 0, 0], |bytes| {
            // SAFETY: live handle and descriptors; null z/activation descriptors where `ops`
            // does not use them (as NVIDIA documents); a valid out-pointer.
            unsafe {
                ffi::cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                    self.lib(),
                    self.as_raw(),
                    bn.mode.raw(),
                    ops.raw(),
                    bn.x.as_raw(),
                    z,
                    bn.x.as_raw(),
                    bn.param.as_raw(),
                    act,
                    bytes,
                )
            }
        })?;
        let reserve = self.memo_bytes([TAG_RESERVE, bn.id, ops.code(), 0, 0], |bytes| {
            // SAFETY: as above.
            unsafe {
                ffi::cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
                    self.lib(),
                    self.as_raw(),
                    bn.mode.raw(),
                    ops.raw(),
                    act,
                    bn.x.as_raw(),
                    bytes,
                )
            }
        })?;
        Ok((ws, reserve))
    }

    /// Workspace bytes of the Ex backward for `ops`.
    fn bn_ex_backward_size<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        ops: BatchNormOps,
    ) -> Result<usize> {
        let act = bn.ex_activation(ops);
        let y = bn.ex_data_desc(ops.has_activation());
        let dz = bn.ex_data_desc(ops.has_add());
        self.memo_bytes([TAG_BWD_WS, bn.id, ops.code(), 0, 0], |bytes| {
            // SAFETY: live handle and descriptors; null y/dz/activation descriptors where
            // `ops` does not use them; a valid out-pointer.
            unsafe {
                ffi::cudnnGetBatchNormalizationBackwardExWorkspaceSize(
                    self.lib(),
                    self.as_raw(),
                    bn.mode.raw(),
                    ops.raw(),
                    bn.x.as_raw(),
                    y,
                    bn.x.as_raw(),
                    dz,
                    bn.x.as_raw(),
                    bn.param.as_raw(),
                    act,
                    bytes,
                )
            }
        })
    }

    /// The checks of [`batch_norm_forward_training_ex`](Self::batch_norm_forward_training_ex)
    /// that query nothing: `z` given exactly for the add op, the running statistics, and every
    /// buffer against its descriptor.
    #[allow(clippy::too_many_arguments)] // the call's buffers
    fn check_forward_ex<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        ops: BatchNormOps,
        x: &impl DeviceBuffer<T>,
        z: Option<&CudaView<'_, T>>,
        y: &impl DeviceBufferMut<T>,
        scale: &impl DeviceBuffer<T::Param>,
        bias: &impl DeviceBuffer<T::Param>,
        running: &Option<RunningStats<'_, T::Param>>,
    ) -> Result<()> {
        if ops.has_add() != z.is_some() {
            return Err(Error::invalid(
                "batch-norm z input",
                "z exactly when ops is BatchNormOps::BnAddRelu",
                format!(
                    "ops {ops:?} with z {}",
                    if z.is_some() { "given" } else { "absent" }
                ),
            ));
        }
        bn.check_training(running)?;
        let (data, param) = (bn.x.layout(), bn.param.layout());
        self.check_tensor("x", data, x, false)?;
        if let Some(z) = z {
            self.check_tensor("z", data, z, false)?;
        }
        self.check_tensor("y", data, y, true)?;
        self.check_tensor("scale", param, scale, false)?;
        self.check_tensor("bias", param, bias, false)?;
        if let Some(r) = running {
            self.check_tensor("running mean", param, &r.mean, true)?;
            self.check_tensor("running variance", param, &r.variance, true)?;
        }
        Ok(())
    }

    /// The checks of [`batch_norm_backward_ex`](Self::batch_norm_backward_ex) that query
    /// nothing: statistics of an Ex forward, `dz` given exactly for the add op, and every buffer
    /// against its descriptor. Returns the ops the forward ran.
    #[allow(clippy::too_many_arguments)] // the call's buffers
    fn check_backward_ex<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        saved: &BatchNormSaved<'_, T>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        dz: Option<&CudaViewMut<'_, T>>,
        dx: &impl DeviceBufferMut<T>,
        scale: &impl DeviceBuffer<T::Param>,
        bias: &impl DeviceBuffer<T::Param>,
        dscale: &impl DeviceBufferMut<T::Param>,
        dbias: &impl DeviceBufferMut<T::Param>,
    ) -> Result<BatchNormOps> {
        let Some(ops) = saved.ops else {
            return Err(mismatch(
                "statistics of batch_norm_forward_training_ex (they carry the reserve space)",
                "statistics of the plain forward (use batch_norm_backward)".into(),
            ));
        };
        if ops.has_add() != dz.is_some() {
            return Err(Error::invalid(
                "batch-norm backward dz",
                "dz exactly for BnAddRelu",
                format!(
                    "ops {ops:?} with dz {}",
                    if dz.is_some() { "given" } else { "absent" }
                ),
            ));
        }
        self.check_backward_bufs(bn, saved, x, dy, dx, scale, dscale, dbias)?;
        let (data, param) = (bn.x.layout(), bn.param.layout());
        let y = saved.y.as_ref().filter(|_| ops.has_activation());
        if let Some(y) = y {
            self.check_tensor("y", data, y, false)?;
        }
        if let Some(dz) = dz {
            self.check_tensor("dz", data, dz, true)?;
        }
        self.check_tensor("bias", param, bias, false)?;
        if let Some(r) = &saved.reserve {
            self.check_buffer("reserve space", r, saved.reserve_bytes)?;
        }
        Ok(ops)
    }

    /// Bytes of workspace and of reserve space the Ex training forward needs for `ops`
    /// (`cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize`,
    /// `cudnnGetBatchNormalizationTrainingExReserveSpaceSize`). A configuration cuDNN does not
    /// support for `ops` is reported here as its `NOT_SUPPORTED` error.
    #[doc(alias = "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize")]
    #[doc(alias = "cudnnGetBatchNormalizationTrainingExReserveSpaceSize")]
    pub fn batch_norm_forward_training_ex_sizes<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        ops: BatchNormOps,
    ) -> Result<(usize, usize)> {
        self.bind()?;
        self.bn_ex_forward_sizes(bn, ops)
    }

    /// Training forward with cuDNN's extended call: `ops` picks plain BN, BN + ReLU or
    /// BN + add `z` + ReLU (`y = relu(BN(x) + z)`), the workspace enables the fast NHWC kernels,
    /// and the returned [`BatchNormSaved`] owns the reserve space the backward pass needs.
    ///
    /// `z` must be given exactly when `ops` is [`BatchNormOps::BnAddRelu`] (same layout as `x`).
    /// The workspace grows to the size cuDNN asks for (within its limit). Otherwise as
    /// [`batch_norm_forward_training`](Self::batch_norm_forward_training).
    ///
    /// ```no_run
    /// use cudnn_safe::norm::{BatchNorm, BatchNormMode, BatchNormOps};
    /// use cudnn_safe::{cuda_context, half::f16, Cudnn, Layout, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let layout = Layout::nhwc(32, 64, 28, 28)?;
    /// let bn = BatchNorm::builder().mode(BatchNormMode::SpatialPersistent).build::<f16>(&layout)?;
    /// let x = stream.alloc_zeros::<f16>(layout.span()).unwrap();
    /// let z = stream.alloc_zeros::<f16>(layout.span()).unwrap();
    /// let mut y = stream.alloc_zeros::<f16>(layout.span()).unwrap();
    /// let scale = stream.clone_htod(&[1.0f32; 64]).unwrap();
    /// let bias = stream.alloc_zeros::<f32>(64).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// let saved = cudnn.batch_norm_forward_training_ex(
    ///     &bn, BatchNormOps::BnAddRelu, 1.0, 0.0, &x, Some(z.as_view()), &mut y, &scale, &bias, None, &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cudnnBatchNormalizationForwardTrainingEx")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn batch_norm_forward_training_ex<'x, T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        ops: BatchNormOps,
        alpha: T::Scalar,
        beta: T::Scalar,
        x: &'x impl DeviceBuffer<T>,
        z: Option<CudaView<'_, T>>,
        y: &'x mut impl DeviceBufferMut<T>,
        scale: &impl DeviceBuffer<T::Param>,
        bias: &impl DeviceBuffer<T::Param>,
        running: Option<RunningStats<'_, T::Param>>,
        workspace: &mut Workspace,
    ) -> Result<BatchNormSaved<'x, T>> {
        self.check_forward_ex(bn, ops, x, z.as_ref(), &*y, scale, bias, &running)?;
        let (factor, mut rmean, mut rvar) = match running {
            Some(r) => (r.factor, Some(r.mean), Some(r.variance)),
            None => (0.0, None, None),
        };
        self.check_workspace_context(workspace)?;
        self.bind()?;
        let (ws_bytes, reserve_bytes) = self.bn_ex_forward_sizes(bn, ops)?;
        workspace.prepare(ws_bytes)?;
        let stream = self.stream();
        let (mut mean, mut inv) = bn.alloc_stats(stream)?;
        let mut reserve = alloc_reserve(stream, reserve_bytes)?;
        let x_addr;
        {
            let stream: &CudaStream = stream;
            let (xp, _gx) = x.device_ptr(stream);
            let (zp, _gz) = opt_ptr(z.as_ref(), stream);
            let (yp, _gy) = y.device_ptr_mut(stream);
            let (sp, _gs) = scale.device_ptr(stream);
            let (bp, _gb) = bias.device_ptr(stream);
            let (rmp, _grm) = opt_ptr_mut(rmean.as_mut(), stream);
            let (rvp, _grv) = opt_ptr_mut(rvar.as_mut(), stream);
            let (mp, _gm) = mean.device_ptr_mut(stream);
            let (ip, _gi) = inv.device_ptr_mut(stream);
            let (wp, _gw) = workspace.device_ptr_mut(self.stream())?;
            let (rp, _gr) = opt_ptr_mut(reserve.as_mut(), stream);
            x_addr = xp;
            let act = bn.ex_activation(ops);
            let z_desc = bn.ex_data_desc(ops.has_add());
            // SAFETY: live handle and descriptors (owned by `bn`); x, z, y, scale, bias and the
            // running statistics hold their descriptors' spans on the handle's context, outputs
            // do not overlap themselves (checked above); z and its descriptor are given exactly
            // for the add op; the workspace holds the bytes cuDNN asked for (prepared above) and
            // the reserve exactly the bytes it asked for; the saved buffers hold the parameter
            // span; alpha/beta are `T::Scalar`; the guards keep every buffer alive and ordered.
            unsafe {
                ffi::cudnnBatchNormalizationForwardTrainingEx(
                    self.lib(),
                    self.as_raw(),
                    bn.mode.raw(),
                    ops.raw(),
                    scalar_ptr(&alpha),
                    scalar_ptr(&beta),
                    bn.x.as_raw(),
                    xp as *const c_void,
                    z_desc,
                    zp,
                    bn.x.as_raw(),
                    yp as *mut c_void,
                    bn.param.as_raw(),
                    sp as *const c_void,
                    bp as *const c_void,
                    factor,
                    rmp,
                    rvp,
                    bn.epsilon,
                    mp as *mut c_void,
                    ip as *mut c_void,
                    act,
                    wp,
                    ws_bytes,
                    rp,
                    reserve_bytes,
                )
            }?;
        }
        Ok(BatchNormSaved {
            mean,
            inv_variance: inv,
            reserve,
            reserve_bytes,
            ops: Some(ops),
            bn: bn.id,
            x: x_addr,
            y: Some(DeviceBuffer::view(&*y)),
            _x: PhantomData,
        })
    }

    /// Backward of [`batch_norm_forward_training_ex`](Self::batch_norm_forward_training_ex),
    /// with the ops it ran: `dx`, `dscale`, `dbias` as in
    /// [`batch_norm_backward`](Self::batch_norm_backward), through the ReLU when fused, and for
    /// [`BatchNormOps::BnAddRelu`] also `dz` (the gradient reaching `z`, written with the data
    /// alpha/beta).
    ///
    /// The forward's output `y`, which the fused activation's gradient reads, comes from `saved`
    /// (the forward keeps it borrowed); `dz` must be given exactly for the add op; `bias` is
    /// read by the fused activation. `saved` is taken mutably because cuDNN declares the reserve
    /// space writable here.
    #[doc(alias = "cudnnBatchNormalizationBackwardEx")]
    #[doc(alias = "cudnnGetBatchNormalizationBackwardExWorkspaceSize")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn batch_norm_backward_ex<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        saved: &mut BatchNormSaved<'_, T>,
        alpha_data: T::Scalar,
        beta_data: T::Scalar,
        alpha_param: T::Scalar,
        beta_param: T::Scalar,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        mut dz: Option<CudaViewMut<'_, T>>,
        dx: &mut impl DeviceBufferMut<T>,
        scale: &impl DeviceBuffer<T::Param>,
        bias: &impl DeviceBuffer<T::Param>,
        dscale: &mut impl DeviceBufferMut<T::Param>,
        dbias: &mut impl DeviceBufferMut<T::Param>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let ops = self.check_backward_ex(
            bn,
            saved,
            x,
            dy,
            dz.as_ref(),
            &*dx,
            scale,
            bias,
            &*dscale,
            &*dbias,
        )?;
        self.check_workspace_context(workspace)?;
        self.bind()?;
        let ws_bytes = self.bn_ex_backward_size(bn, ops)?;
        workspace.prepare(ws_bytes)?;
        let stream: &CudaStream = self.stream();
        let (xp, _gx) = x.device_ptr(stream);
        check_origin(bn, saved, xp)?;
        // The saved values were allocated on the forward's stream: order this use with it.
        let _order = crate::stream_order::cross_use(saved.mean.stream(), stream)?;
        let (yp, _gy) = opt_ptr(saved.y.as_ref().filter(|_| ops.has_activation()), stream);
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dzp, _gdz) = opt_ptr_mut(dz.as_mut(), stream);
        let (dxp, _gdx) = dx.device_ptr_mut(stream);
        let (sp, _gs) = scale.device_ptr(stream);
        let (bp, _gb) = bias.device_ptr(stream);
        let (dsp, _gds) = dscale.device_ptr_mut(stream);
        let (dbp, _gdb) = dbias.device_ptr_mut(stream);
        let (mp, _gm) = saved.mean.device_ptr(stream);
        let (ip, _gi) = saved.inv_variance.device_ptr(stream);
        let (wp, _gw) = workspace.device_ptr_mut(self.stream())?;
        let reserve_bytes = saved.reserve_bytes;
        let (rp, _gr) = opt_ptr_mut(saved.reserve.as_mut(), stream);
        let act = bn.ex_activation(ops);
        let y_desc = bn.ex_data_desc(ops.has_activation());
        let dz_desc = bn.ex_data_desc(ops.has_add());
        // SAFETY: live handle and descriptors (owned by `bn`); every buffer holds its
        // descriptor's span on the handle's context, outputs do not overlap themselves; y and
        // dz (and their descriptors) are given exactly where `ops` uses them; the saved
        // statistics and reserve space come from the Ex forward of this `bn` with these ops on
        // this x, y is that forward's output (held borrowed by `saved`), and the reserve holds the bytes cuDNN asked for then; the workspace
        // holds the bytes cuDNN asked for now; scalars are `T::Scalar`; the guards keep every
        // buffer alive and ordered until the call is enqueued.
        unsafe {
            ffi::cudnnBatchNormalizationBackwardEx(
                self.lib(),
                self.as_raw(),
                bn.mode.raw(),
                ops.raw(),
                scalar_ptr(&alpha_data),
                scalar_ptr(&beta_data),
                scalar_ptr(&alpha_param),
                scalar_ptr(&beta_param),
                bn.x.as_raw(),
                xp as *const c_void,
                y_desc,
                yp,
                bn.x.as_raw(),
                dyp as *const c_void,
                dz_desc,
                dzp,
                bn.x.as_raw(),
                dxp as *mut c_void,
                bn.param.as_raw(),
                sp as *const c_void,
                bp as *const c_void,
                dsp as *mut c_void,
                dbp as *mut c_void,
                bn.epsilon,
                mp as *const c_void,
                ip as *const c_void,
                act,
                wp,
                ws_bytes,
                rp,
                reserve_bytes,
            )
        }
    }
}

/// The reserve space of an Ex training forward: `bytes` uninitialised bytes, none for 0.
fn alloc_reserve(stream: &Arc<CudaStream>, bytes: usize) -> Result<Option<CudaSlice<u8>>> {
    if bytes == 0 {
        return Ok(None);
    }
    // SAFETY: the reserve space is only handed to cuDNN (which writes it in the forward call
    // and reads it in the backward call); it is never read on the host.
    unsafe { stream.alloc::<u8>(bytes) }
        .map(Some)
        .map_err(|e| Error::driver("allocating the batch-norm reserve space", e))
}
