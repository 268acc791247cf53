//! The fused `y = act(alpha1·conv(x, w) + alpha2·z + bias)` as a value, [`ConvBiasActivation`]:
//! a [`ConvForward`] plus the bias descriptor and the activation.
use std::ffi::c_void;

use cudarc::driver::{CudaStream, CudaView, DevicePtr};

use super::algo::sealed::Sealed as _;
use super::direction::{self, shape_rule};
use super::{ConvAlgorithm, ConvForward, ConvFwdAlgo, ConvOp, FusedActivation};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType, Scalar};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::TensorDesc;
use crate::workspace::Workspace;

/// The fused forward convolution with bias and activation
/// (`cudnnConvolutionBiasActivationForward`): the forward convolution `fwd`, the bias
/// descriptor (`[1, K, 1, 1]`, `[1, K, 1, 1, 1]` in 3-D, of `Y`'s type — f32 for i8 input) and
/// the activation. Its algorithms are the forward ones: [`forward`](Self::forward) ranks and
/// benchmarks them.
#[derive(Debug)]
pub struct ConvBiasActivation<'a, X: DataType, Y: DataType, B: DataType> {
    fwd: ConvForward<'a, X, Y>,
    bias: &'a TensorDesc<B>,
    activation: FusedActivation,
}

impl<X: DataType, Y: DataType<Scalar = X::Scalar>, B: DataType> Clone
    for ConvBiasActivation<'_, X, Y, B>
{
    fn clone(&self) -> Self {
        *self
    }
}
impl<X: DataType, Y: DataType<Scalar = X::Scalar>, B: DataType> Copy
    for ConvBiasActivation<'_, X, Y, B>
{
}

impl<'a, X: DataType, Y: DataType<Scalar = X::Scalar>, B: DataType>
    ConvBiasActivation<'a, X, Y, B>
{
    /// Checks the bias type (`Y`'s, f32 for i8 input) and shape (one value per output channel).
    pub fn new(
        fwd: ConvForward<'a, X, Y>,
        bias: &'a TensorDesc<B>,
        activation: FusedActivation,
    ) -> Result<Self> {
        let want_bias = if X::DTYPE == DType::I8 {
            DType::F32
        } else {
            Y::DTYPE
        };
        if B::DTYPE != want_bias {
            return Err(Error::UnsupportedDataType {
                op: "fused convolution bias",
                detail: format!(
                    "bias {} with output {} (expected {want_bias})",
                    B::DTYPE,
                    Y::DTYPE
                ),
            });
        }
        let y_dims = fwd.y().dims();
        let mut want = vec![1i64; y_dims.len()];
        want[1] = y_dims[1];
        shape_rule(
            "bias",
            bias.dims(),
            "[1, K, 1, ...]",
            want,
            "the bias has one value per output channel",
        )?;
        Ok(ConvBiasActivation {
            fwd,
            bias,
            activation,
        })
    }

    /// The forward convolution.
    pub fn forward(&self) -> ConvForward<'a, X, Y> {
        self.fwd
    }
    /// The bias descriptor.
    pub fn bias(&self) -> &'a TensorDesc<B> {
        self.bias
    }
    /// The activation.
    pub fn activation(&self) -> FusedActivation {
        self.activation
    }

    /// Workspace bytes `algo` needs: the forward convolution's.
    pub fn workspace_size(&self, cudnn: &Cudnn, algo: ConvFwdAlgo) -> Result<usize> {
        check_algo(self.activation, algo)?;
        self.fwd.workspace_size(cudnn, algo)
    }

    /// `y = act(alpha1·conv(x, w) + alpha2·z + bias)` with `algo`.
    ///
    /// `z` (optional, same layout as `y`) is the residual input; without it `alpha2` is
    /// ignored. Every check runs before anything is enqueued.
    #[doc(alias = "cudnnConvolutionBiasActivationForward")]
    #[allow(clippy::too_many_arguments)] // the operands of the C call
    pub fn launch(
        &self,
        cudnn: &Cudnn,
        algo: ConvFwdAlgo,
        (alpha1, alpha2): (X::Scalar, X::Scalar),
        (x, w): (&impl DeviceBuffer<X>, &impl DeviceBuffer<X>),
        z: Option<CudaView<'_, Y>>,
        bias: &impl DeviceBuffer<B>,
        workspace: &mut Workspace,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<()> {
        check_algo(self.activation, algo)?;
        let (x_desc, w_desc, y_desc) = (self.fwd.x(), self.fwd.w(), self.fwd.y());
        cudnn.check_tensor("x", x_desc.layout(), x, false)?;
        cudnn.check_buffer("w", w, w_desc.span())?;
        cudnn.check_tensor("bias", self.bias.layout(), bias, false)?;
        if let Some(z) = &z {
            cudnn.check_tensor("z", y_desc.layout(), z, false)?;
        }
        cudnn.check_tensor("y", y_desc.layout(), y, true)?;
        cudnn.check_workspace_context(workspace)?;
        let bytes = direction::workspace_size(&self.fwd, cudnn, algo)?;
        let act = self.activation.descriptor()?;
        workspace.prepare(bytes)?;
        cudnn.bind()?;
        let stream: &CudaStream = cudnn.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (wp, _gw) = w.device_ptr(stream);
        let (bp, _gb) = bias.device_ptr(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        let zg = z.as_ref().map(|z| z.device_ptr(stream));
        // Without z, cuDNN is given y with alpha2 = 0 (z may alias y; it is not read then).
        let (zp, alpha2) = match &zg {
            Some((p, _)) => (*p as *const c_void, alpha2),
            None => (yp as *const c_void, X::Scalar::from_f64(0.0)),
        };
        let (wsp, _gws) = workspace.device_ptr_mut(cudnn.stream())?;
        let conv = self.fwd.conv();
        // SAFETY: live handle and descriptors; types and shapes checked when the forward
        // convolution and this value were built, spans and contexts above, all on this
        // context; y does not overlap itself and cannot alias x or w (`&mut`); the workspace
        // holds at least `bytes`, the size cuDNN reported for this algorithm and these
        // descriptors; alpha1/alpha2 are the scalar type cuDNN reads for `Y`; bias holds
        // [1, K, 1, 1] of the type cuDNN reads for this configuration and z (when given) holds
        // y's span on this context; both are only read; the activation descriptor lives until
        // the call returns.
        unsafe {
            raw::cudnnConvolutionBiasActivationForward(
                cudnn.lib(),
                cudnn.as_raw(),
                (&alpha1 as *const X::Scalar).cast::<c_void>(),
                x_desc.as_raw(),
                xp as *const c_void,
                w_desc.as_raw(),
                wp as *const c_void,
                conv.as_raw(),
                algo.sys(),
                wsp,
                bytes,
                (&alpha2 as *const X::Scalar).cast::<c_void>(),
                y_desc.as_raw(),
                zp,
                self.bias.as_raw(),
                bp as *const c_void,
                act.as_ptr(),
                y_desc.as_raw(),
                yp as *mut c_void,
            )
        }
    }
}

/// [`FusedActivation::Identity`] runs only with [`ConvFwdAlgo::ImplicitPrecompGemm`] in cuDNN:
/// other algorithms are refused.
pub(crate) fn check_algo(activation: FusedActivation, algo: ConvFwdAlgo) -> Result<()> {
    if activation == FusedActivation::Identity && algo != ConvFwdAlgo::ImplicitPrecompGemm {
        return Err(Error::invalid(
            "fused convolution algorithm",
            "IMPLICIT_PRECOMP_GEMM (the only one cuDNN supports with the identity activation)",
            algo.name(),
        ));
    }
    Ok(())
}
