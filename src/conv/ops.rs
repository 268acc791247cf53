//! The checked convolution calls as methods of [`Cudnn`]: thin wrappers over the direction
//! values ([`ConvForward`], [`ConvBackwardData`], [`ConvBackwardFilter`],
//! [`ConvBiasActivation`]), which hold the checks and the C calls, plus the backward bias.
use std::ffi::c_void;

use cudarc::driver::{CudaStream, CudaView};

use super::direction::shape_rule;
use super::fused::check_algo;
use super::{
    AlgoPerf, ConvBackwardData, ConvBackwardFilter, ConvBiasActivation, ConvBwdDataAlgo,
    ConvBwdFilterAlgo, ConvDesc, ConvForward, ConvFwdAlgo, ConvOp, FusedActivation,
};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::{FilterDesc, TensorDesc};
use crate::workspace::Workspace;

/// The four handle methods of one direction — workspace size, heuristics, find, launch — each
/// `Direction::new(conv, ..)?` then the [`ConvOp`] method, with the C call's argument order.
macro_rules! conv_wrappers {
    (
        $op:ident [$($bounds:tt)*], $algo:ty, $in:ty, $out:ty,
        ($d0:ident: $D0:ty, $a:ident), ($d1:ident: $D1:ty, $b:ident),
        ($dout:ident: $DOut:ty, $o:ident);
        workspace_size: $(#[$ws_m:meta])* $ws:ident;
        heuristics: $(#[$heur_m:meta])* $heur:ident;
        find: $(#[$find_m:meta])* $find:ident;
        launch: $(#[$run_m:meta])* $run:ident;
    ) => {
        $(#[$ws_m])*
        pub fn $ws<$($bounds)*>(
            &self,
            $d0: &$D0,
            $d1: &$D1,
            conv: &ConvDesc,
            $dout: &$DOut,
            algo: $algo,
        ) -> Result<usize> {
            $op::new(conv, $d0, $d1, $dout)?.workspace_size(self, algo)
        }

        $(#[$heur_m])*
        pub fn $heur<$($bounds)*>(
            &self,
            $d0: &$D0,
            $d1: &$D1,
            conv: &ConvDesc,
            $dout: &$DOut,
        ) -> Result<Vec<AlgoPerf<$algo>>> {
            $op::new(conv, $d0, $d1, $dout)?.heuristics(self)
        }

        $(#[$find_m])*
        #[allow(clippy::too_many_arguments)] // mirrors the C call
        pub fn $find<$($bounds)*>(
            &self,
            $d0: &$D0,
            $a: &impl DeviceBuffer<$in>,
            $d1: &$D1,
            $b: &impl DeviceBuffer<$in>,
            conv: &ConvDesc,
            $dout: &$DOut,
            $o: &mut impl DeviceBufferMut<$out>,
            workspace: &mut Workspace,
        ) -> Result<Vec<AlgoPerf<$algo>>> {
            $op::new(conv, $d0, $d1, $dout)?.find(self, ($a, $b), $o, workspace)
        }

        $(#[$run_m])*
        #[allow(clippy::too_many_arguments)] // mirrors the C call
        pub fn $run<$($bounds)*>(
            &self,
            alpha: <$in as DataType>::Scalar,
            $d0: &$D0,
            $a: &impl DeviceBuffer<$in>,
            $d1: &$D1,
            $b: &impl DeviceBuffer<$in>,
            conv: &ConvDesc,
            algo: $algo,
            workspace: &mut Workspace,
            beta: <$in as DataType>::Scalar,
            $dout: &$DOut,
            $o: &mut impl DeviceBufferMut<$out>,
        ) -> Result<()> {
            let op = $op::new(conv, $d0, $d1, $dout)?;
            op.launch(self, algo, (alpha, beta), ($a, $b), workspace, $o)
        }
    };
}

impl Cudnn {
    conv_wrappers!(
        ConvForward [X: DataType, Y: DataType<Scalar = X::Scalar>], ConvFwdAlgo, X, Y,
        (x_desc: TensorDesc<X>, x), (w_desc: FilterDesc<X>, w),
        (y_desc: TensorDesc<Y>, y);
        workspace_size:
            /// Workspace bytes `algo` needs for this forward convolution
            /// (`cudnnGetConvolutionForwardWorkspaceSize`): [`ConvForward::new`] then
            /// [`ConvOp::workspace_size`]. An algorithm that does not support the case returns
            /// cuDNN's `NOT_SUPPORTED` error with its reason.
            #[doc(alias = "cudnnGetConvolutionForwardWorkspaceSize")]
            conv_forward_workspace_size;
        heuristics:
            /// cuDNN's heuristic ranking of every forward algorithm for this case
            /// (`cudnnGetConvolutionForwardAlgorithm_v7`), best first: [`ConvOp::heuristics`].
            /// Nothing runs on the GPU; entries whose [`status`](AlgoPerf::status) is not success
            /// are unsupported here.
            #[doc(alias = "cudnnGetConvolutionForwardAlgorithm_v7")]
            conv_forward_heuristics;
        find:
            /// Runs and times every forward algorithm on the given buffers
            /// (`cudnnFindConvolutionForwardAlgorithmEx`), fastest first: [`ConvOp::find`].
            ///
            /// **`y` is overwritten** by the trial runs: never pass a buffer whose contents you
            /// still need ([`crate::Autotuner`] uses scratch memory when accumulating with
            /// `beta ≠ 0`). The workspace is first grown to the largest size the heuristics ask
            /// for (within its limit; if that allocation fails, what it already holds is used);
            /// algorithms needing more are reported with an allocation-failure status.
            #[doc(alias = "cudnnFindConvolutionForwardAlgorithmEx")]
            conv_forward_find;
        launch:
            /// `y = alpha·conv(x, w) + beta·y` with the given algorithm
            /// (`cudnnConvolutionForward`): [`ConvForward::new`] then [`ConvOp::launch`].
            ///
            /// Types: `X` for input and filter; `Y` for the output, equal to `X` except for i8
            /// input, which may produce f32. The workspace grows (within its limit) to what the
            /// algorithm needs; an algorithm that does not support the case is refused before
            /// anything runs. With `beta == 0` the old contents of `y` are not read.
            #[doc(alias = "cudnnConvolutionForward")]
            conv_forward;
    );

    /// The fused `y = act(alpha1·conv(x, w) + alpha2·z + bias)`
    /// (`cudnnConvolutionBiasActivationForward`): [`ConvBiasActivation::launch`].
    ///
    /// `z` (optional, same layout as `y`) is the residual input; without it `alpha2` is ignored.
    /// `bias` is `[1, K, 1, 1]` (`[1, K, 1, 1, 1]` in 3-D), of `Y`'s type — f32 for i8 input.
    /// [`FusedActivation::Identity`] is supported by cuDNN only with
    /// [`ConvFwdAlgo::ImplicitPrecompGemm`]; other algorithms are refused before launch.
    #[doc(alias = "cudnnConvolutionBiasActivationForward")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_bias_activation_forward<
        X: DataType,
        Y: DataType<Scalar = X::Scalar>,
        B: DataType,
    >(
        &self,
        alpha1: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DeviceBuffer<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DeviceBuffer<X>,
        conv: &ConvDesc,
        algo: ConvFwdAlgo,
        workspace: &mut Workspace,
        alpha2: X::Scalar,
        z: Option<CudaView<'_, Y>>,
        bias_desc: &TensorDesc<B>,
        bias: &impl DeviceBuffer<B>,
        activation: FusedActivation,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<()> {
        check_algo(activation, algo)?;
        let fwd = ConvForward::new(conv, x_desc, w_desc, y_desc)?;
        let op = ConvBiasActivation::new(fwd, bias_desc, activation)?;
        op.launch(self, algo, (alpha1, alpha2), (x, w), z, bias, workspace, y)
    }

    conv_wrappers!(
        ConvBackwardData [T: DataType], ConvBwdDataAlgo, T, T,
        (w_desc: FilterDesc<T>, w), (dy_desc: TensorDesc<T>, dy),
        (dx_desc: TensorDesc<T>, dx);
        workspace_size:
            /// Workspace bytes `algo` needs for this backward-data pass: [`ConvBackwardData::new`]
            /// then [`ConvOp::workspace_size`].
            #[doc(alias = "cudnnGetConvolutionBackwardDataWorkspaceSize")]
            conv_backward_data_workspace_size;
        heuristics:
            /// cuDNN's heuristic ranking of backward-data algorithms
            /// (`cudnnGetConvolutionBackwardDataAlgorithm_v7`): [`ConvOp::heuristics`].
            #[doc(alias = "cudnnGetConvolutionBackwardDataAlgorithm_v7")]
            conv_backward_data_heuristics;
        find:
            /// Runs and times every backward-data algorithm
            /// (`cudnnFindConvolutionBackwardDataAlgorithmEx`): [`ConvOp::find`]. **`dx` is
            /// overwritten**; see [`conv_forward_find`](Self::conv_forward_find).
            #[doc(alias = "cudnnFindConvolutionBackwardDataAlgorithmEx")]
            conv_backward_data_find;
        launch:
            /// `dx = alpha·conv_transposeᵀ(dy, w) + beta·dx` (`cudnnConvolutionBackwardData`): the
            /// gradient of a forward convolution with respect to its input.
            /// [`ConvBackwardData::new`] then [`ConvOp::launch`].
            #[doc(alias = "cudnnConvolutionBackwardData")]
            conv_backward_data;
    );

    conv_wrappers!(
        ConvBackwardFilter [T: DataType], ConvBwdFilterAlgo, T, T,
        (x_desc: TensorDesc<T>, x), (dy_desc: TensorDesc<T>, dy),
        (dw_desc: FilterDesc<T>, dw);
        workspace_size:
            /// Workspace bytes `algo` needs for this backward-filter pass:
            /// [`ConvBackwardFilter::new`] then [`ConvOp::workspace_size`].
            #[doc(alias = "cudnnGetConvolutionBackwardFilterWorkspaceSize")]
            conv_backward_filter_workspace_size;
        heuristics:
            /// cuDNN's heuristic ranking of backward-filter algorithms
            /// (`cudnnGetConvolutionBackwardFilterAlgorithm_v7`): [`ConvOp::heuristics`].
            #[doc(alias = "cudnnGetConvolutionBackwardFilterAlgorithm_v7")]
            conv_backward_filter_heuristics;
        find:
            /// Runs and times every backward-filter algorithm
            /// (`cudnnFindConvolutionBackwardFilterAlgorithmEx`): [`ConvOp::find`]. **`dw` is
            /// overwritten**; see [`conv_forward_find`](Self::conv_forward_find).
            #[doc(alias = "cudnnFindConvolutionBackwardFilterAlgorithmEx")]
            conv_backward_filter_find;
        launch:
            /// `dw = alpha·correlate(x, dy) + beta·dw` (`cudnnConvolutionBackwardFilter`): the
            /// gradient of a forward convolution with respect to its filter. Use `beta = 1` to
            /// accumulate. [`ConvBackwardFilter::new`] then [`ConvOp::launch`].
            #[doc(alias = "cudnnConvolutionBackwardFilter")]
            conv_backward_filter;
    );

    /// `db = alpha·Σ dy + beta·db`, summing over every dimension but the channels
    /// (`cudnnConvolutionBackwardBias`). `db` is `[1, K, 1, 1]` (or `[1, K, 1, 1, 1]`).
    #[doc(alias = "cudnnConvolutionBackwardBias")]
    pub fn conv_backward_bias<T: DataType>(
        &self,
        alpha: T::Scalar,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        db_desc: &TensorDesc<T>,
        db: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        if !matches!(T::DTYPE, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
            return Err(Error::UnsupportedDataType {
                op: "convolution backward bias",
                detail: format!("{} (f32, f64, f16 or bf16)", T::DTYPE),
            });
        }
        let rank = dy_desc.dims().len();
        if rank < 2 {
            return Err(Error::invalid(
                "dy rank",
                "at least 2 dimensions [N, K, spatial...]",
                format!("{:?}", dy_desc.dims()),
            ));
        }
        let mut want = vec![1i64; rank];
        want[1] = dy_desc.dims()[1];
        shape_rule(
            "db",
            db_desc.dims(),
            "[1, K, 1, ...]",
            want,
            "the bias gradient has one value per channel of dy",
        )?;
        self.check_tensor("dy", dy_desc.layout(), dy, false)?;
        self.check_tensor("db", db_desc.layout(), db, true)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dbp, _gdb) = db.device_ptr_mut(stream);
        // SAFETY: live handle and descriptors; both buffers hold their spans on this context;
        // db does not overlap itself; alpha/beta are `T::Scalar`.
        unsafe {
            raw::cudnnConvolutionBackwardBias(
                self.lib(),
                self.as_raw(),
                (&alpha as *const T::Scalar).cast::<c_void>(),
                dy_desc.as_raw(),
                dyp as *const c_void,
                (&beta as *const T::Scalar).cast::<c_void>(),
                db_desc.as_raw(),
                dbp as *mut c_void,
            )
        }
    }
}
