//! Batch normalization: the shape-bound [`BatchNorm`] object, the owned [`BatchNormSaved`] value
//! passed from training forward to backward, and the checked launches as methods of [`Cudnn`].
use std::ffi::{c_int, c_void};
use std::fmt;
use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtrMut};
use cudnn_safe_sys as sys;

use super::launch::{
    batch_norm_backward_raw, batch_norm_inference_raw, batch_norm_training_raw, BnBackwardBufs,
};
use super::saved::check_origin_at;
use super::{check_epsilon, ffi, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::checks::opt_ptr_mut;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::{Layout, TensorDesc, MAX_DIMS};

/// Over which axes batch normalization computes its statistics (`cudnnBatchNormMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum BatchNormMode {
    /// One mean and variance per activation (`C·H·W` of them), over the batch `N`: the usual
    /// mode after fully connected layers (PyTorch's `BatchNorm1d` on `[N, C]`).
    PerActivation,
    /// One mean and variance per channel `C`, over `N` and the spatial dimensions: the usual
    /// mode after convolutions. The default.
    #[default]
    Spatial,
    /// [`Spatial`](Self::Spatial) with cuDNN's persistent kernels: may be faster (the fast NHWC
    /// half-precision path and the fused [`BatchNormOps`] need it) but, for NCHW data, may use a
    /// scaled integer reduction with a smaller range, which can turn very large finite inputs
    /// into Inf/NaN outputs where `Spatial` stays finite (NVIDIA's documentation; PyTorch avoids
    /// it for NCHW for that reason).
    SpatialPersistent,
}

impl BatchNormMode {
    pub(super) fn raw(self) -> sys::cudnnBatchNormMode_t {
        use sys::cudnnBatchNormMode_t as M;
        match self {
            BatchNormMode::PerActivation => M::CUDNN_BATCHNORM_PER_ACTIVATION,
            BatchNormMode::Spatial => M::CUDNN_BATCHNORM_SPATIAL,
            BatchNormMode::SpatialPersistent => M::CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
        }
    }
}

/// What the Ex calls compute after normalizing (`cudnnBatchNormOps_t`).
///
/// The fused forms are cuDNN's NHWC fast path: NVIDIA documents them for packed NHWC tensors in
/// [`BatchNormMode::SpatialPersistent`] mode (half precision, `C` a multiple of 4 for the
/// semi-persistent kernels). Other configurations are refused by cuDNN
/// (`CUDNN_STATUS_NOT_SUPPORTED`) before anything runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum BatchNormOps {
    /// `y = BN(x)`. The default.
    #[default]
    Bn,
    /// `y = relu(BN(x))`.
    BnRelu,
    /// `y = relu(BN(x) + z)`: the residual add of ResNet blocks fused in.
    BnAddRelu,
}

impl BatchNormOps {
    pub(super) fn raw(self) -> sys::cudnnBatchNormOps_t {
        use sys::cudnnBatchNormOps_t as O;
        match self {
            BatchNormOps::Bn => O::CUDNN_BATCHNORM_OPS_BN,
            BatchNormOps::BnRelu => O::CUDNN_BATCHNORM_OPS_BN_ACTIVATION,
            BatchNormOps::BnAddRelu => O::CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION,
        }
    }
    pub(super) fn code(self) -> u64 {
        match self {
            BatchNormOps::Bn => 0,
            BatchNormOps::BnRelu => 1,
            BatchNormOps::BnAddRelu => 2,
        }
    }
    /// Whether a ReLU follows (and backward needs `y`, `bias` and the reserve space).
    pub fn has_activation(self) -> bool {
        self != BatchNormOps::Bn
    }
    /// Whether `z` is added before the activation (and backward writes `dz`).
    pub fn has_add(self) -> bool {
        self == BatchNormOps::BnAddRelu
    }
}

/// The running mean and variance a training forward updates:
/// `running = (1 − factor)·running + factor·batch`, where the batch variance is the unbiased
/// one (divided by `m − 1`, `m` values per statistic), as in PyTorch.
///
/// `factor` is PyTorch's `momentum`; `1/(1 + n)` at the `n`-th call gives the cumulative average,
/// and the first call of a training run should use 1 (NVIDIA's advice).
pub struct RunningStats<'a, P: DataType> {
    pub(super) mean: CudaViewMut<'a, P>,
    pub(super) variance: CudaViewMut<'a, P>,
    pub(super) factor: f64,
}

impl<'a, P: DataType> RunningStats<'a, P> {
    /// The running mean and variance buffers (each laid out as [`BatchNorm::param_layout`]) and
    /// the exponential average factor (in `0..=1`, checked at launch).
    pub fn new(
        mean: &'a mut impl DeviceBufferMut<P>,
        variance: &'a mut impl DeviceBufferMut<P>,
        factor: f64,
    ) -> Self {
        RunningStats {
            mean: mean.view_mut(),
            variance: variance.view_mut(),
            factor,
        }
    }
    /// The exponential average factor.
    pub fn factor(&self) -> f64 {
        self.factor
    }
}

impl<P: DataType> fmt::Debug for RunningStats<'_, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunningStats")
            .field("len", &(self.mean.len(), self.variance.len()))
            .field("factor", &self.factor)
            .finish()
    }
}

/// Builder for a [`BatchNorm`]: mode and epsilon. Plain data; [`build`](Self::build) validates.
#[derive(Debug, Clone, Copy, PartialEq)]
#[must_use]
pub struct BatchNormBuilder {
    mode: BatchNormMode,
    epsilon: f64,
}

impl Default for BatchNormBuilder {
    fn default() -> Self {
        BatchNormBuilder {
            mode: BatchNormMode::Spatial,
            epsilon: 1e-5,
        }
    }
}

impl BatchNormBuilder {
    /// The mode (default [`BatchNormMode::Spatial`]).
    pub fn mode(mut self, mode: BatchNormMode) -> Self {
        self.mode = mode;
        self
    }
    /// Epsilon added to the variance (default `1e-5`, PyTorch's); finite and at least
    /// [`MIN_EPSILON`](super::MIN_EPSILON). The same value is used by every call of the object,
    /// as cuDNN requires of forward and backward.
    pub fn epsilon(mut self, epsilon: f64) -> Self {
        self.epsilon = epsilon;
        self
    }

    /// Validates and builds the object for inputs with layout `x` (`[N, C]`, `[N, C, L]`,
    /// `[N, C, H, W]` or `[N, C, D, H, W]`, any strides cuDNN takes; shorter ones are padded
    /// with trailing dimensions of 1, as PyTorch does, since cuDNN takes 4-D and 5-D tensors).
    /// `y`, `z`, `dy`, `dx` and `dz` share this layout; it must not overlap itself since `y`
    /// and `dx` are written through it.
    #[doc(alias = "cudnnDeriveBNTensorDescriptor")]
    pub fn build<T: NormType>(&self, x: &Layout) -> Result<BatchNorm<T>> {
        check_epsilon(self.epsilon)?;
        let rank = x.rank();
        if !(2..=5).contains(&rank) {
            return Err(Error::invalid(
                "batch-norm input rank",
                "2 to 5 dimensions (N, C, spatial...)",
                format!("{rank} dimensions {:?}", x.dims()),
            ));
        }
        x.check_output("y")?;
        let data = if rank >= 4 {
            x.clone()
        } else {
            let mut dims = x.dims().to_vec();
            let mut strides = x.strides().to_vec();
            while dims.len() < 4 {
                dims.push(1);
                strides.push(1);
            }
            Layout::strided(&dims, &strides)?
        };
        let x_desc = TensorDesc::<T>::new(data)?;
        let lib = raw::lib()?;
        let param_layout = derive_param_layout::<T::Param>(lib, &x_desc, self.mode)?;
        let expected: Vec<i64> = match self.mode {
            BatchNormMode::PerActivation => std::iter::once(1)
                .chain(x_desc.dims()[1..].iter().copied())
                .collect(),
            _ => (0..x_desc.dims().len())
                .map(|i| if i == 1 { x_desc.dims()[1] } else { 1 })
                .collect(),
        };
        if param_layout.dims() != expected.as_slice() || !param_layout.is_packed() {
            return Err(Error::invalid(
                "parameter descriptor derived by cuDNN",
                format!("packed dims {expected:?}"),
                &param_layout,
            ));
        }
        let param = TensorDesc::<T::Param>::new(param_layout)?;
        let act = raw::OwnedActivation::new(lib)?;
        // SAFETY: live activation descriptor; ReLU takes no coefficient (0 is ignored).
        unsafe {
            raw::cudnnSetActivationDescriptor(
                lib,
                act.as_ptr(),
                sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
                sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                0.0,
            )
        }?;
        Ok(BatchNorm {
            mode: self.mode,
            epsilon: self.epsilon,
            dims: x.dims().to_vec(),
            x: x_desc,
            param,
            act,
            id: raw::next_descriptor_id(),
        })
    }
}

/// Reads back the parameter descriptor `cudnnDeriveBNTensorDescriptor` derives for `x` and
/// `mode`, checking its data type is `P` (cuDNN's parameter-type rule).
fn derive_param_layout<P: DataType>(
    lib: &'static cudnn_safe_sys::Library,
    x: &TensorDesc<impl DataType>,
    mode: BatchNormMode,
) -> Result<Layout> {
    let tmp = raw::OwnedTensor::new(lib)?;
    // SAFETY: both descriptors are live; `x` is fully set.
    unsafe { ffi::cudnnDeriveBNTensorDescriptor(lib, tmp.as_ptr(), x.as_raw(), mode.raw()) }?;
    let mut dtype = sys::cudnnDataType_t(u32::MAX);
    let mut nb: c_int = 0;
    let mut dims = [0 as c_int; MAX_DIMS];
    let mut strides = [0 as c_int; MAX_DIMS];
    // SAFETY: live descriptor; the out-arrays hold `MAX_DIMS` entries, the count requested.
    unsafe {
        ffi::cudnnGetTensorNdDescriptor(
            lib,
            tmp.as_ptr(),
            MAX_DIMS as c_int,
            &mut dtype,
            &mut nb,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
        )
    }?;
    if dtype != P::DTYPE.raw() {
        return Err(Error::UnsupportedDataType {
            op: "batch normalization",
            detail: format!(
                "cuDNN derives parameter type code {} for this input, this crate expects {}",
                dtype.0,
                P::DTYPE
            ),
        });
    }
    let n = usize::try_from(nb)
        .ok()
        .filter(|n| (1..=MAX_DIMS).contains(n))
        .ok_or_else(|| {
            Error::invalid(
                "parameter descriptor derived by cuDNN",
                "1 to 8 dimensions",
                nb,
            )
        })?;
    let d: Vec<i64> = dims[..n].iter().map(|&v| i64::from(v)).collect();
    let s: Vec<i64> = strides[..n].iter().map(|&v| i64::from(v)).collect();
    Layout::strided(&d, &s)
}

/// Batch normalization for one input layout, data type and epsilon (`cudnnBatchNormalization*`).
///
/// Holds the data descriptor (shared by `x`, `y`, `z`, `dy`, `dx`, `dz`), the parameter
/// descriptor cuDNN derives for it (scale, bias, running and saved statistics, of type
/// `T::Param`) and a ReLU descriptor for the fused ops, all created once by
/// [`BatchNormBuilder::build`]; launches create nothing.
///
/// `Send`, not `Sync` (it owns cuDNN descriptors).
pub struct BatchNorm<T: NormType> {
    pub(super) mode: BatchNormMode,
    pub(super) epsilon: f64,
    pub(super) dims: Vec<i64>,
    pub(super) x: TensorDesc<T>,
    pub(super) param: TensorDesc<T::Param>,
    pub(super) act: raw::OwnedActivation,
    /// Process-unique, never reused: ties saved values and memoised sizes to this object.
    pub(super) id: u64,
}

impl<T: NormType> fmt::Debug for BatchNorm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchNorm")
            .field("dtype", &T::DTYPE)
            .field("mode", &self.mode)
            .field("epsilon", &self.epsilon)
            .field("x", self.x.layout())
            .field("param", self.param.layout())
            .finish()
    }
}

impl BatchNorm<f32> {
    /// A builder with the defaults (spatial, epsilon `1e-5`).
    pub fn builder() -> BatchNormBuilder {
        BatchNormBuilder::default()
    }
}

impl<T: NormType> BatchNorm<T> {
    /// The mode.
    pub fn mode(&self) -> BatchNormMode {
        self.mode
    }
    /// The epsilon used by every call.
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }
    /// The input dimensions as given to [`BatchNormBuilder::build`].
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }
    /// The layout of `x`, `y`, `z`, `dy`, `dx` and `dz` as handed to cuDNN (padded to 4-D).
    pub fn layout(&self) -> &Layout {
        self.x.layout()
    }
    /// The layout of scale, bias, running and saved statistics and their gradients: packed
    /// `[1, C, 1, 1(, 1)]` (spatial modes) or `[1, C, H, W(, D)]` (per activation).
    pub fn param_layout(&self) -> &Layout {
        self.param.layout()
    }
    /// Elements each parameter buffer must hold.
    pub fn param_len(&self) -> usize {
        self.param.span()
    }

    /// The activation descriptor the Ex calls take for `ops`: null without a fused
    /// activation, as NVIDIA documents.
    pub(super) fn ex_activation(&self, ops: BatchNormOps) -> sys::cudnnActivationDescriptor_t {
        if ops.has_activation() {
            self.act.as_ptr()
        } else {
            std::ptr::null_mut()
        }
    }

    /// The data descriptor for an optional tensor of the Ex calls (`z`, `dz`, `y`): null when
    /// the ops do not use it, as NVIDIA documents.
    pub(super) fn ex_data_desc(&self, used: bool) -> sys::cudnnTensorDescriptor_t {
        if used {
            self.x.as_raw()
        } else {
            std::ptr::null_mut()
        }
    }

    /// How many input values each statistic is computed from.
    fn values_per_stat(&self) -> i64 {
        let d = self.x.dims();
        match self.mode {
            BatchNormMode::PerActivation => d[0],
            _ => d
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != 1)
                .map(|(_, &v)| v)
                .product(),
        }
    }

    pub(super) fn check_training(
        &self,
        running: &Option<RunningStats<'_, T::Param>>,
    ) -> Result<()> {
        let m = self.values_per_stat();
        if m < 2 {
            return Err(Error::invalid(
                "batch-norm training input",
                "more than one value per statistic (the batch variance is undefined otherwise)",
                format!("{m} value per statistic for dims {:?}", self.dims),
            ));
        }
        if let Some(r) = running {
            if !(r.factor.is_finite() && (0.0..=1.0).contains(&r.factor)) {
                return Err(Error::invalid(
                    "exponential average factor",
                    "a value in 0..=1",
                    r.factor,
                ));
            }
        }
        Ok(())
    }

    /// Fresh (uninitialised) saved-mean and saved-inverse-variance buffers.
    pub(super) fn alloc_stats(
        &self,
        stream: &std::sync::Arc<CudaStream>,
    ) -> Result<StatsPair<T::Param>> {
        let n = self.param.span();
        // SAFETY: the buffers are only handed to cuDNN, which writes every element before the
        // saved value holding them is returned; any bit pattern is a valid f32/f64 anyway.
        let mean = unsafe { stream.alloc::<T::Param>(n) }
            .map_err(|e| Error::driver("allocating the saved mean", e))?;
        // SAFETY: as above.
        let inv = unsafe { stream.alloc::<T::Param>(n) }
            .map_err(|e| Error::driver("allocating the saved inverse variance", e))?;
        Ok((mean, inv))
    }
}

/// Saved mean and saved inverse variance, freshly allocated.
type StatsPair<P> = (CudaSlice<P>, CudaSlice<P>);

/// What a training forward saves for the backward pass: the batch mean and inverse standard
/// deviation `1/sqrt(var + ε)` (each laid out as [`BatchNorm::param_layout`], type `T::Param`),
/// and for the Ex form the reserve space cuDNN asked for.
///
/// Owned and returned by the forward call; the backward call checks that it came from the same
/// [`BatchNorm`] (hence the same mode, dims, dtype and epsilon) and that `x` (and for the fused
/// ops `y`) is the buffer the forward read (wrote). NVIDIA requires the contents of `x` (and
/// `scale`) to stay unchanged between the two calls; that is the caller's part.
pub struct BatchNormSaved<'x, T: NormType> {
    pub(super) mean: CudaSlice<T::Param>,
    pub(super) inv_variance: CudaSlice<T::Param>,
    pub(super) reserve: Option<CudaSlice<u8>>,
    pub(super) reserve_bytes: usize,
    /// `None` for the plain forward, the ops for the Ex forward.
    pub(super) ops: Option<BatchNormOps>,
    pub(super) bn: u64,
    /// Device address of the `x` the forward read; `x` stays borrowed (`'x`) while this value
    /// lives, so no other buffer can be at that address.
    pub(super) x: u64,
    /// The Ex forward's output, which its backward reads (borrowed from the forward's `y`).
    pub(super) y: Option<CudaView<'x, T>>,
    pub(super) _x: PhantomData<&'x ()>,
}

impl<T: NormType> fmt::Debug for BatchNormSaved<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchNormSaved")
            .field("len", &self.mean.len())
            .field("reserve_bytes", &self.reserve_bytes)
            .field("ops", &self.ops)
            .finish()
    }
}

impl<'x, T: NormType> BatchNormSaved<'x, T> {
    /// The saved batch mean.
    pub fn mean(&self) -> &CudaSlice<T::Param> {
        &self.mean
    }
    /// The saved inverse standard deviation `1/sqrt(var + ε)` (biased batch variance).
    ///
    /// NVIDIA calls these values intermediate results "not to be used directly by the user"
    /// whose form may depend on the mode; this crate's tests check them against that formula.
    /// Named as [`NormSaved::inv_std`](super::NormSaved::inv_std) (cuDNN's
    /// `resultSaveInvVariance`).
    #[doc(alias = "inv_variance")]
    #[doc(alias = "resultSaveInvVariance")]
    pub fn inv_std(&self) -> &CudaSlice<T::Param> {
        &self.inv_variance
    }
    /// Bytes of the reserve space (0 for the plain forward).
    pub fn reserve_bytes(&self) -> usize {
        self.reserve_bytes
    }
    /// The ops of the Ex forward that produced it, `None` for the plain forward.
    pub fn ops(&self) -> Option<BatchNormOps> {
        self.ops
    }
    /// The output `y` of [`Cudnn::batch_norm_forward_training_ex`] (which keeps it borrowed for
    /// the backward pass, whose fused activation reads it): read it through this view. `None`
    /// for the plain forward.
    pub fn y(&self) -> Option<CudaView<'_, T>> {
        self.y.as_ref().map(|y| y.slice(..))
    }
}

/// Memo-key tags for this family's size queries (first key element; cannot equal the small
/// algorithm numbers other families put there).
pub(super) const TAG_FWD_WS: u64 = u64::MAX - 0x4E_00;
pub(super) const TAG_BWD_WS: u64 = u64::MAX - 0x4E_01;
pub(super) const TAG_RESERVE: u64 = u64::MAX - 0x4E_02;

pub(super) fn mismatch(expected: &'static str, got: String) -> Error {
    Error::invalid("batch-norm saved statistics", expected, got)
}

/// Checks that `saved` belongs to `bn` and to the `x` buffer at this address (`saved` keeps the
/// forward's `x` borrowed, so an equal address is the same buffer, not a reallocation).
pub(super) fn check_origin<T: NormType>(
    bn: &BatchNorm<T>,
    saved: &BatchNormSaved<'_, T>,
    x: u64,
) -> Result<()> {
    check_origin_at(
        (
            "batch-norm saved statistics",
            "the value returned by a training forward of this BatchNorm",
            "statistics saved by another BatchNorm object",
        ),
        (saved.bn, saved.x),
        bn.id,
        x,
    )
}

impl Cudnn {
    /// Inference: `y = alpha·(scale·(x − mean)/sqrt(variance + ε) + bias) + beta·y`, with the
    /// given (running) mean and variance.
    ///
    /// `x` and `y` are laid out as [`BatchNorm::layout`]; `scale`, `bias`, `mean` and `variance`
    /// as [`BatchNorm::param_layout`], of type `T::Param`. With `beta == 0` the old contents of
    /// `y` are not read. [`BatchNormMode::SpatialPersistent`] runs as
    /// [`BatchNormMode::Spatial`] here (the same formula; the persistent kernels are a training
    /// optimization, and PyTorch too uses the spatial mode for inference).
    #[doc(alias = "cudnnBatchNormalizationForwardInference")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn batch_norm_forward_inference<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        alpha: T::Scalar,
        beta: T::Scalar,
        x: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
        scale: &impl DeviceBuffer<T::Param>,
        bias: &impl DeviceBuffer<T::Param>,
        mean: &impl DeviceBuffer<T::Param>,
        variance: &impl DeviceBuffer<T::Param>,
    ) -> Result<()> {
        let inference_mode = match bn.mode {
            BatchNormMode::SpatialPersistent => BatchNormMode::Spatial,
            m => m,
        };
        let (data, param) = (bn.x.layout(), bn.param.layout());
        self.check_tensor("x", data, x, false)?;
        self.check_tensor("y", data, y, true)?;
        self.check_tensor("scale", param, scale, false)?;
        self.check_tensor("bias", param, bias, false)?;
        self.check_tensor("mean", param, mean, false)?;
        self.check_tensor("variance", param, variance, false)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        let (sp, _gs) = scale.device_ptr(stream);
        let (bp, _gb) = bias.device_ptr(stream);
        let (mp, _gm) = mean.device_ptr(stream);
        let (vp, _gv) = variance.device_ptr(stream);
        // SAFETY: live handle and descriptors (owned by `bn`); every buffer holds its
        // descriptor's span on the handle's context and `y` does not overlap itself (checked
        // above); the parameter buffers are `T::Param`, the type cuDNN derives for `T`;
        // alpha/beta are `T::Scalar`; the guards keep the buffers alive and ordered until the
        // call is enqueued.
        unsafe {
            batch_norm_inference_raw::<T>(
                self,
                inference_mode.raw(),
                [alpha, beta],
                (bn.x.as_raw(), bn.param.as_raw()),
                [xp, yp],
                [sp, bp, mp, vp],
                bn.epsilon,
            )
        }
    }

    /// Training forward: normalizes with the batch statistics,
    /// `y = alpha·(scale·(x − μ)/sqrt(σ² + ε) + bias) + beta·y`, updates the running statistics
    /// if given, and returns the saved mean and inverse standard deviation for
    /// [`batch_norm_backward`](Self::batch_norm_backward).
    ///
    /// Without running statistics cuDNN is passed null pointers for them (allowed: "both can be
    /// NULL but only at the same time"). Each statistic must be computed from at least two
    /// values. With `beta == 0` the old contents of `y` are not read.
    #[doc(alias = "cudnnBatchNormalizationForwardTraining")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn batch_norm_forward_training<'x, T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        alpha: T::Scalar,
        beta: T::Scalar,
        x: &'x impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
        scale: &impl DeviceBuffer<T::Param>,
        bias: &impl DeviceBuffer<T::Param>,
        running: Option<RunningStats<'_, T::Param>>,
    ) -> Result<BatchNormSaved<'x, T>> {
        bn.check_training(&running)?;
        let (data, param) = (bn.x.layout(), bn.param.layout());
        self.check_tensor("x", data, x, false)?;
        self.check_tensor("y", data, y, true)?;
        self.check_tensor("scale", param, scale, false)?;
        self.check_tensor("bias", param, bias, false)?;
        let (factor, mut rmean, mut rvar) = match running {
            Some(r) => {
                self.check_tensor("running mean", param, &r.mean, true)?;
                self.check_tensor("running variance", param, &r.variance, true)?;
                (r.factor, Some(r.mean), Some(r.variance))
            }
            None => (0.0, None, None),
        };
        self.bind()?;
        let stream = self.stream();
        let (mut mean, mut inv) = bn.alloc_stats(stream)?;
        let x_addr;
        {
            let stream: &CudaStream = stream;
            let (xp, _gx) = x.device_ptr(stream);
            let (yp, _gy) = y.device_ptr_mut(stream);
            let (sp, _gs) = scale.device_ptr(stream);
            let (bp, _gb) = bias.device_ptr(stream);
            let (rmp, _grm) = opt_ptr_mut(rmean.as_mut(), stream);
            let (rvp, _grv) = opt_ptr_mut(rvar.as_mut(), stream);
            let (mp, _gm) = mean.device_ptr_mut(stream);
            let (ip, _gi) = inv.device_ptr_mut(stream);
            x_addr = xp;
            // SAFETY: live handle and descriptors (owned by `bn`); x, y, scale, bias and the
            // running statistics hold their descriptors' spans on the handle's context, outputs
            // do not overlap themselves (checked above); the running statistics are both given
            // or both null; the saved buffers were just allocated with the parameter span;
            // alpha/beta are `T::Scalar`; the guards keep every buffer alive and ordered until
            // the call is enqueued.
            unsafe {
                batch_norm_training_raw::<T>(
                    self,
                    bn.mode.raw(),
                    [alpha, beta],
                    (bn.x.as_raw(), bn.param.as_raw()),
                    [xp, yp, sp, bp],
                    (factor, rmp, rvp),
                    bn.epsilon,
                    (mp as *mut c_void, ip as *mut c_void),
                )
            }?;
        }
        Ok(BatchNormSaved {
            mean,
            inv_variance: inv,
            reserve: None,
            reserve_bytes: 0,
            ops: None,
            bn: bn.id,
            x: x_addr,
            y: None,
            _x: PhantomData,
        })
    }

    /// Backward: `dx = alpha_data·∂L/∂x + beta_data·dx`, `dscale = alpha_param·∂L/∂scale +
    /// beta_param·dscale`, `dbias = alpha_param·∂L/∂bias + beta_param·dbias`, from the
    /// statistics `saved` by [`batch_norm_forward_training`](Self::batch_norm_forward_training)
    /// (or by [`batch_norm_forward_training_ex`](Self::batch_norm_forward_training_ex) with
    /// [`BatchNormOps::Bn`]).
    ///
    /// `x` must be the buffer the forward read (checked by address; its contents must be
    /// unchanged) and `saved` must come from this `bn`; a mismatch is an
    /// [`Error::InvalidArgument`] before anything is enqueued. With a beta of 0 the old contents
    /// of the corresponding outputs are not read.
    #[doc(alias = "cudnnBatchNormalizationBackward")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn batch_norm_backward<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        saved: &BatchNormSaved<'_, T>,
        alpha_data: T::Scalar,
        beta_data: T::Scalar,
        alpha_param: T::Scalar,
        beta_param: T::Scalar,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        scale: &impl DeviceBuffer<T::Param>,
        dscale: &mut impl DeviceBufferMut<T::Param>,
        dbias: &mut impl DeviceBufferMut<T::Param>,
    ) -> Result<()> {
        if let Some(ops) = saved.ops.filter(|o| o.has_activation()) {
            return Err(mismatch(
                "statistics of a plain or BatchNormOps::Bn forward",
                format!("statistics of a {ops:?} forward (use batch_norm_backward_ex)"),
            ));
        }
        self.check_backward_bufs(bn, saved, x, dy, &*dx, scale, &*dscale, &*dbias)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (xp, _gx) = x.device_ptr(stream);
        check_origin(bn, saved, xp)?;
        // The saved values were allocated on the forward's stream: order this use with it.
        let _order = crate::stream_order::cross_use(saved.mean.stream(), stream)?;
        // SAFETY: live handle and descriptors (owned by `bn`); every buffer holds its
        // descriptor's span on the handle's context, outputs do not overlap themselves; the
        // saved statistics were written by a training forward of this `bn` on this `x`
        // (checked); scalars are `T::Scalar`; `_gx` keeps x alive and ordered.
        unsafe {
            batch_norm_backward_raw(
                self,
                bn.mode.raw(),
                [alpha_data, beta_data, alpha_param, beta_param],
                (bn.x.as_raw(), bn.param.as_raw()),
                BnBackwardBufs {
                    x: xp,
                    dy,
                    dx,
                    scale,
                    dscale,
                    dbias,
                },
                bn.epsilon,
                (&saved.mean, &saved.inv_variance),
            )
        }
    }
}

impl Cudnn {
    /// The buffers every batch-norm backward reads or writes, against `bn`'s descriptors: `x`,
    /// `dy`, `dx` of the data layout, `scale`, `dscale`, `dbias` and the saved statistics of
    /// the parameter layout.
    #[allow(clippy::too_many_arguments)] // the call's buffers
    pub(super) fn check_backward_bufs<T: NormType>(
        &self,
        bn: &BatchNorm<T>,
        saved: &BatchNormSaved<'_, T>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        dx: &impl DeviceBufferMut<T>,
        scale: &impl DeviceBuffer<T::Param>,
        dscale: &impl DeviceBufferMut<T::Param>,
        dbias: &impl DeviceBufferMut<T::Param>,
    ) -> Result<()> {
        let (data, param) = (bn.x.layout(), bn.param.layout());
        self.check_tensor("x", data, x, false)?;
        self.check_tensor("dy", data, dy, false)?;
        self.check_tensor("dx", data, dx, true)?;
        self.check_tensor("scale", param, scale, false)?;
        self.check_tensor("dscale", param, dscale, true)?;
        self.check_tensor("dbias", param, dbias, true)?;
        self.check_tensor("saved mean", param, &saved.mean, false)?;
        self.check_tensor("saved inverse variance", param, &saved.inv_variance, false)
    }
}
