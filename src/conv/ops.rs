//! The checked convolution calls, as methods of [`Cudnn`].
//!
//! Every launch checks, before anything is enqueued: data types against cuDNN's supported
//! configurations, shapes against the convolution's output-size rule, each buffer against its
//! descriptor's span and the handle's context, outputs for self-overlap, and the workspace
//! against the size cuDNN reports for the chosen algorithm (growing it within its limit).
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;

use cudarc::driver::{CudaStream, CudaView, DevicePtr};

use super::{
    AlgoPerf, ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvDirection,
    ConvFwdAlgo, FusedActivation,
};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType, Scalar};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::{FilterDesc, TensorDesc};
use crate::workspace::Workspace;

fn shape_rule(
    a: &'static str,
    a_dims: &[i64],
    b: &'static str,
    expected: Vec<i64>,
    rule: &'static str,
) -> Result<()> {
    if a_dims == expected.as_slice() {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        a,
        a_dims: a_dims.to_vec(),
        b,
        b_dims: expected,
        rule,
    })
}

/// Reads up to `count` perf records through `call` (which fills a zeroed array and reports how
/// many it wrote) and converts the ones this crate knows.
fn collect_perf<S: Copy, A>(
    count: usize,
    call: impl FnOnce(c_int, *mut c_int, *mut S) -> Result<()>,
    convert: impl Fn(&S) -> Option<AlgoPerf<A>>,
) -> Result<Vec<AlgoPerf<A>>> {
    // SAFETY: the perf structs are plain C data (integers, a float, C-enum newtypes over
    // integers); all-zero bytes are a valid value of each.
    let mut buf: Vec<S> = vec![unsafe { MaybeUninit::<S>::zeroed().assume_init() }; count];
    let mut returned: c_int = 0;
    call(count as c_int, &mut returned, buf.as_mut_ptr())?;
    let n = (returned.max(0) as usize).min(count);
    Ok(buf[..n].iter().filter_map(convert).collect())
}

impl Cudnn {
    fn max_count(&self, direction: ConvDirection, known: usize) -> usize {
        let mut n: c_int = 0;
        let f = match direction {
            ConvDirection::Forward => raw::cudnnGetConvolutionForwardAlgorithmMaxCount,
            ConvDirection::BackwardData => raw::cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
            ConvDirection::BackwardFilter => {
                raw::cudnnGetConvolutionBackwardFilterAlgorithmMaxCount
            }
        };
        // SAFETY: live handle and a valid out-pointer.
        match unsafe { f(self.lib(), self.as_raw(), &mut n) } {
            Ok(()) => (n.max(0) as usize).clamp(known, 64),
            Err(_) => known,
        }
    }

    // ----- forward ----------------------------------------------------------------------------

    fn check_forward<X: DataType, Y: DataType>(
        &self,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
    ) -> Result<()> {
        conv.check_forward_types(X::DTYPE, Y::DTYPE)?;
        let expected = conv.output_dims(x_desc.dims(), w_desc.dims())?;
        shape_rule(
            "y",
            y_desc.dims(),
            "conv(x, w)",
            expected,
            "y must have the convolution's output dimensions",
        )
    }

    /// Workspace bytes `algo` needs for this forward convolution
    /// (`cudnnGetConvolutionForwardWorkspaceSize`). An algorithm that does not support the case
    /// returns cuDNN's `NOT_SUPPORTED` error with its reason.
    #[doc(alias = "cudnnGetConvolutionForwardWorkspaceSize")]
    pub fn conv_forward_workspace_size<X: DataType, Y: DataType>(
        &self,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
        algo: ConvFwdAlgo,
    ) -> Result<usize> {
        self.check_forward(x_desc, w_desc, conv, y_desc)?;
        self.forward_workspace_bytes(x_desc, w_desc, conv, y_desc, algo)
    }

    /// The workspace query behind [`Self::conv_forward_workspace_size`], for callers that
    /// already checked the arguments (memoised per descriptor ids).
    fn forward_workspace_bytes<X: DataType, Y: DataType>(
        &self,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
        algo: ConvFwdAlgo,
    ) -> Result<usize> {
        let key = [
            algo.raw_value() as u64,
            x_desc.id(),
            w_desc.id(),
            conv.id(),
            y_desc.id(),
        ];
        self.memo_bytes(key, |bytes| {
            self.bind()?;
            // SAFETY: live handle and descriptors; a valid out-pointer.
            unsafe {
                raw::cudnnGetConvolutionForwardWorkspaceSize(
                    self.lib(),
                    self.as_raw(),
                    x_desc.as_raw(),
                    w_desc.as_raw(),
                    conv.as_raw(),
                    y_desc.as_raw(),
                    algo.raw(),
                    bytes,
                )
            }
        })
    }

    /// cuDNN's heuristic ranking of every forward algorithm for this case
    /// (`cudnnGetConvolutionForwardAlgorithm_v7`), best first. Nothing runs on the GPU; entries
    /// whose [`status`](AlgoPerf::status) is not success are unsupported here.
    #[doc(alias = "cudnnGetConvolutionForwardAlgorithm_v7")]
    pub fn conv_forward_heuristics<X: DataType, Y: DataType>(
        &self,
        x_desc: &TensorDesc<X>,
        w_desc: &FilterDesc<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
    ) -> Result<Vec<AlgoPerf<ConvFwdAlgo>>> {
        self.check_forward(x_desc, w_desc, conv, y_desc)?;
        self.bind()?;
        let count = self.max_count(ConvDirection::Forward, ConvFwdAlgo::ALL.len());
        collect_perf(
            count,
            |req, ret, perf| {
                // SAFETY: live handle and descriptors; `perf` holds `req` records.
                unsafe {
                    raw::cudnnGetConvolutionForwardAlgorithm_v7(
                        self.lib(),
                        self.as_raw(),
                        x_desc.as_raw(),
                        w_desc.as_raw(),
                        conv.as_raw(),
                        y_desc.as_raw(),
                        req,
                        ret,
                        perf,
                    )
                }
            },
            AlgoPerf::<ConvFwdAlgo>::from_sys,
        )
    }

    /// Runs and times every forward algorithm on the given buffers
    /// (`cudnnFindConvolutionForwardAlgorithmEx`), fastest first.
    ///
    /// **`y` is overwritten** by the trial runs: never pass a buffer whose contents you still
    /// need ([`crate::Autotuner`] uses scratch memory when accumulating with `beta ≠ 0`). The
    /// workspace is first grown to the largest size the heuristics ask for (within its limit;
    /// if that allocation fails, what it already holds is used); algorithms needing more are
    /// reported with an allocation-failure status.
    #[doc(alias = "cudnnFindConvolutionForwardAlgorithmEx")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_forward_find<X: DataType, Y: DataType>(
        &self,
        x_desc: &TensorDesc<X>,
        x: &impl DeviceBuffer<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DeviceBuffer<X>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DeviceBufferMut<Y>,
        workspace: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvFwdAlgo>>> {
        self.check_forward(x_desc, w_desc, conv, y_desc)?;
        self.check_tensor("x", x_desc.layout(), x, false)?;
        self.check_buffer("w", w, w_desc.span())?;
        self.check_tensor("y", y_desc.layout(), y, true)?;
        self.check_workspace_context(workspace)?;
        let heur = self.conv_forward_heuristics(x_desc, w_desc, conv, y_desc)?;
        grow_for_find(
            workspace,
            heur.iter().map(|p| (p.is_supported(), p.workspace)),
        );
        let count = self.max_count(ConvDirection::Forward, ConvFwdAlgo::ALL.len());
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (wp, _gw) = w.device_ptr(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        let ws_bytes = workspace.capacity();
        let (wsp, _gws) = workspace.device_ptr_mut(self.stream())?;
        collect_perf(
            count,
            |req, ret, perf| {
                // SAFETY: live handle and descriptors; x, w, y hold their spans on this context
                // (checked), y does not overlap itself; the workspace pointer addresses
                // `ws_bytes` bytes (or is null with 0); `perf` holds `req` records.
                unsafe {
                    raw::cudnnFindConvolutionForwardAlgorithmEx(
                        self.lib(),
                        self.as_raw(),
                        x_desc.as_raw(),
                        xp as *const c_void,
                        w_desc.as_raw(),
                        wp as *const c_void,
                        conv.as_raw(),
                        y_desc.as_raw(),
                        yp as *mut c_void,
                        req,
                        ret,
                        perf,
                        wsp,
                        ws_bytes,
                    )
                }
            },
            AlgoPerf::<ConvFwdAlgo>::from_sys,
        )
    }

    /// `y = alpha·conv(x, w) + beta·y` with the given algorithm (`cudnnConvolutionForward`).
    ///
    /// Types: `X` for input and filter; `Y` for the output, equal to `X` except for i8 input,
    /// which may produce f32. The workspace grows (within its limit) to what the algorithm
    /// needs; an algorithm that does not support the case is refused before anything runs.
    /// With `beta == 0` the old contents of `y` are not read.
    #[doc(alias = "cudnnConvolutionForward")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_forward<X: DataType, Y: DataType<Scalar = X::Scalar>>(
        &self,
        alpha: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DeviceBuffer<X>,
        w_desc: &FilterDesc<X>,
        w: &impl DeviceBuffer<X>,
        conv: &ConvDesc,
        algo: ConvFwdAlgo,
        workspace: &mut Workspace,
        beta: X::Scalar,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<()> {
        self.check_forward(x_desc, w_desc, conv, y_desc)?;
        self.check_tensor("x", x_desc.layout(), x, false)?;
        self.check_buffer("w", w, w_desc.span())?;
        self.check_tensor("y", y_desc.layout(), y, true)?;
        self.check_workspace_context(workspace)?;
        let bytes = self.forward_workspace_bytes(x_desc, w_desc, conv, y_desc, algo)?;
        workspace.prepare(bytes)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (wp, _gw) = w.device_ptr(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        let (wsp, _gws) = workspace.device_ptr_mut(self.stream())?;
        // SAFETY: live handle and descriptors; types, shapes and spans checked above, all on
        // this context; y does not overlap itself and cannot alias x or w (`&mut`); the
        // workspace holds at least `bytes`, the size cuDNN reported for this algorithm and
        // these descriptors; alpha/beta are the scalar type cuDNN reads for `Y`.
        unsafe {
            raw::cudnnConvolutionForward(
                self.lib(),
                self.as_raw(),
                (&alpha as *const X::Scalar).cast::<c_void>(),
                x_desc.as_raw(),
                xp as *const c_void,
                w_desc.as_raw(),
                wp as *const c_void,
                conv.as_raw(),
                algo.raw(),
                wsp,
                bytes,
                (&beta as *const X::Scalar).cast::<c_void>(),
                y_desc.as_raw(),
                yp as *mut c_void,
            )
        }
    }

    /// The fused `y = act(alpha1·conv(x, w) + alpha2·z + bias)`
    /// (`cudnnConvolutionBiasActivationForward`).
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
        if activation == FusedActivation::Identity && algo != ConvFwdAlgo::ImplicitPrecompGemm {
            return Err(Error::invalid(
                "fused convolution algorithm",
                "IMPLICIT_PRECOMP_GEMM (the only one cuDNN supports with the identity activation)",
                algo.name(),
            ));
        }
        self.check_forward(x_desc, w_desc, conv, y_desc)?;
        let mut want = vec![1i64; y_desc.dims().len()];
        want[1] = y_desc.dims()[1];
        shape_rule(
            "bias",
            bias_desc.dims(),
            "[1, K, 1, ...]",
            want,
            "the bias has one value per output channel",
        )?;
        self.check_tensor("x", x_desc.layout(), x, false)?;
        self.check_buffer("w", w, w_desc.span())?;
        self.check_tensor("bias", bias_desc.layout(), bias, false)?;
        if let Some(z) = &z {
            self.check_tensor("z", y_desc.layout(), z, false)?;
        }
        self.check_tensor("y", y_desc.layout(), y, true)?;
        self.check_workspace_context(workspace)?;
        let bytes = self.forward_workspace_bytes(x_desc, w_desc, conv, y_desc, algo)?;
        let act = activation.descriptor()?;
        workspace.prepare(bytes)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
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
        let (wsp, _gws) = workspace.device_ptr_mut(self.stream())?;
        // SAFETY: as `conv_forward`, plus: bias holds [1, K, 1, 1] of the type cuDNN reads for
        // this configuration and z (when given) holds y's span on this context; both are only
        // read; the activation descriptor lives until the call returns.
        unsafe {
            raw::cudnnConvolutionBiasActivationForward(
                self.lib(),
                self.as_raw(),
                (&alpha1 as *const X::Scalar).cast::<c_void>(),
                x_desc.as_raw(),
                xp as *const c_void,
                w_desc.as_raw(),
                wp as *const c_void,
                conv.as_raw(),
                algo.raw(),
                wsp,
                bytes,
                (&alpha2 as *const X::Scalar).cast::<c_void>(),
                y_desc.as_raw(),
                zp,
                bias_desc.as_raw(),
                bp as *const c_void,
                act.as_ptr(),
                y_desc.as_raw(),
                yp as *mut c_void,
            )
        }
    }

    // ----- backward data ----------------------------------------------------------------------

    fn check_backward_data<T: DataType>(
        &self,
        w_desc: &FilterDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
        dx_desc: &TensorDesc<T>,
    ) -> Result<()> {
        conv.check_backward_types("convolution backward data", T::DTYPE)?;
        let expected = conv.output_dims(dx_desc.dims(), w_desc.dims())?;
        shape_rule(
            "dy",
            dy_desc.dims(),
            "conv(dx, w)",
            expected,
            "dy must have the forward output dimensions of dx",
        )
    }

    /// Workspace bytes `algo` needs for this backward-data pass.
    #[doc(alias = "cudnnGetConvolutionBackwardDataWorkspaceSize")]
    pub fn conv_backward_data_workspace_size<T: DataType>(
        &self,
        w_desc: &FilterDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
        dx_desc: &TensorDesc<T>,
        algo: ConvBwdDataAlgo,
    ) -> Result<usize> {
        self.check_backward_data(w_desc, dy_desc, conv, dx_desc)?;
        self.backward_data_workspace_bytes(w_desc, dy_desc, conv, dx_desc, algo)
    }

    /// The workspace query behind [`Self::conv_backward_data_workspace_size`], for callers that
    /// already checked the arguments (memoised per descriptor ids).
    fn backward_data_workspace_bytes<T: DataType>(
        &self,
        w_desc: &FilterDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
        dx_desc: &TensorDesc<T>,
        algo: ConvBwdDataAlgo,
    ) -> Result<usize> {
        let key = [
            (1 << 32) | algo.raw_value() as u64,
            w_desc.id(),
            dy_desc.id(),
            conv.id(),
            dx_desc.id(),
        ];
        self.memo_bytes(key, |bytes| {
            self.bind()?;
            // SAFETY: live handle and descriptors; a valid out-pointer.
            unsafe {
                raw::cudnnGetConvolutionBackwardDataWorkspaceSize(
                    self.lib(),
                    self.as_raw(),
                    w_desc.as_raw(),
                    dy_desc.as_raw(),
                    conv.as_raw(),
                    dx_desc.as_raw(),
                    algo.raw(),
                    bytes,
                )
            }
        })
    }

    /// cuDNN's heuristic ranking of backward-data algorithms
    /// (`cudnnGetConvolutionBackwardDataAlgorithm_v7`).
    #[doc(alias = "cudnnGetConvolutionBackwardDataAlgorithm_v7")]
    pub fn conv_backward_data_heuristics<T: DataType>(
        &self,
        w_desc: &FilterDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
        dx_desc: &TensorDesc<T>,
    ) -> Result<Vec<AlgoPerf<ConvBwdDataAlgo>>> {
        self.check_backward_data(w_desc, dy_desc, conv, dx_desc)?;
        self.bind()?;
        let count = self.max_count(ConvDirection::BackwardData, ConvBwdDataAlgo::ALL.len());
        collect_perf(
            count,
            |req, ret, perf| {
                // SAFETY: live handle and descriptors; `perf` holds `req` records.
                unsafe {
                    raw::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                        self.lib(),
                        self.as_raw(),
                        w_desc.as_raw(),
                        dy_desc.as_raw(),
                        conv.as_raw(),
                        dx_desc.as_raw(),
                        req,
                        ret,
                        perf,
                    )
                }
            },
            AlgoPerf::<ConvBwdDataAlgo>::from_sys,
        )
    }

    /// Runs and times every backward-data algorithm (`cudnnFindConvolutionBackwardDataAlgorithmEx`).
    /// **`dx` is overwritten**; see [`conv_forward_find`](Self::conv_forward_find).
    #[doc(alias = "cudnnFindConvolutionBackwardDataAlgorithmEx")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_backward_data_find<T: DataType>(
        &self,
        w_desc: &FilterDesc<T>,
        w: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        dx_desc: &TensorDesc<T>,
        dx: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvBwdDataAlgo>>> {
        self.check_backward_data(w_desc, dy_desc, conv, dx_desc)?;
        self.check_buffer("w", w, w_desc.span())?;
        self.check_tensor("dy", dy_desc.layout(), dy, false)?;
        self.check_tensor("dx", dx_desc.layout(), dx, true)?;
        self.check_workspace_context(workspace)?;
        let heur = self.conv_backward_data_heuristics(w_desc, dy_desc, conv, dx_desc)?;
        grow_for_find(
            workspace,
            heur.iter().map(|p| (p.is_supported(), p.workspace)),
        );
        let count = self.max_count(ConvDirection::BackwardData, ConvBwdDataAlgo::ALL.len());
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (wp, _gw) = w.device_ptr(stream);
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dxp, _gdx) = dx.device_ptr_mut(stream);
        let ws_bytes = workspace.capacity();
        let (wsp, _gws) = workspace.device_ptr_mut(self.stream())?;
        collect_perf(
            count,
            |req, ret, perf| {
                // SAFETY: live handle and descriptors; buffers hold their spans on this context
                // (checked), dx does not overlap itself; the workspace holds `ws_bytes`.
                unsafe {
                    raw::cudnnFindConvolutionBackwardDataAlgorithmEx(
                        self.lib(),
                        self.as_raw(),
                        w_desc.as_raw(),
                        wp as *const c_void,
                        dy_desc.as_raw(),
                        dyp as *const c_void,
                        conv.as_raw(),
                        dx_desc.as_raw(),
                        dxp as *mut c_void,
                        req,
                        ret,
                        perf,
                        wsp,
                        ws_bytes,
                    )
                }
            },
            AlgoPerf::<ConvBwdDataAlgo>::from_sys,
        )
    }

    /// `dx = alpha·conv_transposeᵀ(dy, w) + beta·dx` (`cudnnConvolutionBackwardData`): the
    /// gradient of a forward convolution with respect to its input.
    #[doc(alias = "cudnnConvolutionBackwardData")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_backward_data<T: DataType>(
        &self,
        alpha: T::Scalar,
        w_desc: &FilterDesc<T>,
        w: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        algo: ConvBwdDataAlgo,
        workspace: &mut Workspace,
        beta: T::Scalar,
        dx_desc: &TensorDesc<T>,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.check_backward_data(w_desc, dy_desc, conv, dx_desc)?;
        self.check_buffer("w", w, w_desc.span())?;
        self.check_tensor("dy", dy_desc.layout(), dy, false)?;
        self.check_tensor("dx", dx_desc.layout(), dx, true)?;
        self.check_workspace_context(workspace)?;
        let bytes = self.backward_data_workspace_bytes(w_desc, dy_desc, conv, dx_desc, algo)?;
        workspace.prepare(bytes)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (wp, _gw) = w.device_ptr(stream);
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dxp, _gdx) = dx.device_ptr_mut(stream);
        let (wsp, _gws) = workspace.device_ptr_mut(self.stream())?;
        // SAFETY: live handle and descriptors; types, shapes and spans checked, all on this
        // context; dx does not overlap itself and cannot alias the inputs; the workspace holds
        // the bytes cuDNN reported for this algorithm; alpha/beta are `T::Scalar`.
        unsafe {
            raw::cudnnConvolutionBackwardData(
                self.lib(),
                self.as_raw(),
                (&alpha as *const T::Scalar).cast::<c_void>(),
                w_desc.as_raw(),
                wp as *const c_void,
                dy_desc.as_raw(),
                dyp as *const c_void,
                conv.as_raw(),
                algo.raw(),
                wsp,
                bytes,
                (&beta as *const T::Scalar).cast::<c_void>(),
                dx_desc.as_raw(),
                dxp as *mut c_void,
            )
        }
    }

    // ----- backward filter --------------------------------------------------------------------

    fn check_backward_filter<T: DataType>(
        &self,
        x_desc: &TensorDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
        dw_desc: &FilterDesc<T>,
    ) -> Result<()> {
        conv.check_backward_types("convolution backward filter", T::DTYPE)?;
        let expected = conv.output_dims(x_desc.dims(), dw_desc.dims())?;
        shape_rule(
            "dy",
            dy_desc.dims(),
            "conv(x, dw)",
            expected,
            "dy must have the forward output dimensions of x and dw",
        )
    }

    /// Workspace bytes `algo` needs for this backward-filter pass.
    #[doc(alias = "cudnnGetConvolutionBackwardFilterWorkspaceSize")]
    pub fn conv_backward_filter_workspace_size<T: DataType>(
        &self,
        x_desc: &TensorDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
        dw_desc: &FilterDesc<T>,
        algo: ConvBwdFilterAlgo,
    ) -> Result<usize> {
        self.check_backward_filter(x_desc, dy_desc, conv, dw_desc)?;
        self.backward_filter_workspace_bytes(x_desc, dy_desc, conv, dw_desc, algo)
    }

    /// The workspace query behind [`Self::conv_backward_filter_workspace_size`], for callers that
    /// already checked the arguments (memoised per descriptor ids).
    fn backward_filter_workspace_bytes<T: DataType>(
        &self,
        x_desc: &TensorDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
        dw_desc: &FilterDesc<T>,
        algo: ConvBwdFilterAlgo,
    ) -> Result<usize> {
        let key = [
            (2 << 32) | algo.raw_value() as u64,
            x_desc.id(),
            dy_desc.id(),
            conv.id(),
            dw_desc.id(),
        ];
        self.memo_bytes(key, |bytes| {
            self.bind()?;
            // SAFETY: live handle and descriptors; a valid out-pointer.
            unsafe {
                raw::cudnnGetConvolutionBackwardFilterWorkspaceSize(
                    self.lib(),
                    self.as_raw(),
                    x_desc.as_raw(),
                    dy_desc.as_raw(),
                    conv.as_raw(),
                    dw_desc.as_raw(),
                    algo.raw(),
                    bytes,
                )
            }
        })
    }

    /// cuDNN's heuristic ranking of backward-filter algorithms
    /// (`cudnnGetConvolutionBackwardFilterAlgorithm_v7`).
    #[doc(alias = "cudnnGetConvolutionBackwardFilterAlgorithm_v7")]
    pub fn conv_backward_filter_heuristics<T: DataType>(
        &self,
        x_desc: &TensorDesc<T>,
        dy_desc: &TensorDesc<T>,
        conv: &ConvDesc,
        dw_desc: &FilterDesc<T>,
    ) -> Result<Vec<AlgoPerf<ConvBwdFilterAlgo>>> {
        self.check_backward_filter(x_desc, dy_desc, conv, dw_desc)?;
        self.bind()?;
        let count = self.max_count(ConvDirection::BackwardFilter, ConvBwdFilterAlgo::ALL.len());
        collect_perf(
            count,
            |req, ret, perf| {
                // SAFETY: live handle and descriptors; `perf` holds `req` records.
                unsafe {
                    raw::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                        self.lib(),
                        self.as_raw(),
                        x_desc.as_raw(),
                        dy_desc.as_raw(),
                        conv.as_raw(),
                        dw_desc.as_raw(),
                        req,
                        ret,
                        perf,
                    )
                }
            },
            AlgoPerf::<ConvBwdFilterAlgo>::from_sys,
        )
    }

    /// Runs and times every backward-filter algorithm
    /// (`cudnnFindConvolutionBackwardFilterAlgorithmEx`). **`dw` is overwritten**; see
    /// [`conv_forward_find`](Self::conv_forward_find).
    #[doc(alias = "cudnnFindConvolutionBackwardFilterAlgorithmEx")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_backward_filter_find<T: DataType>(
        &self,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        dw_desc: &FilterDesc<T>,
        dw: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvBwdFilterAlgo>>> {
        self.check_backward_filter(x_desc, dy_desc, conv, dw_desc)?;
        self.check_tensor("x", x_desc.layout(), x, false)?;
        self.check_tensor("dy", dy_desc.layout(), dy, false)?;
        self.check_buffer("dw", dw, dw_desc.span())?;
        self.check_workspace_context(workspace)?;
        let heur = self.conv_backward_filter_heuristics(x_desc, dy_desc, conv, dw_desc)?;
        grow_for_find(
            workspace,
            heur.iter().map(|p| (p.is_supported(), p.workspace)),
        );
        let count = self.max_count(ConvDirection::BackwardFilter, ConvBwdFilterAlgo::ALL.len());
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dwp, _gdw) = dw.device_ptr_mut(stream);
        let ws_bytes = workspace.capacity();
        let (wsp, _gws) = workspace.device_ptr_mut(self.stream())?;
        collect_perf(
            count,
            |req, ret, perf| {
                // SAFETY: live handle and descriptors; buffers hold their spans on this context
                // (checked); filters are packed so dw cannot overlap itself; the workspace holds
                // `ws_bytes`.
                unsafe {
                    raw::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        self.lib(),
                        self.as_raw(),
                        x_desc.as_raw(),
                        xp as *const c_void,
                        dy_desc.as_raw(),
                        dyp as *const c_void,
                        conv.as_raw(),
                        dw_desc.as_raw(),
                        dwp as *mut c_void,
                        req,
                        ret,
                        perf,
                        wsp,
                        ws_bytes,
                    )
                }
            },
            AlgoPerf::<ConvBwdFilterAlgo>::from_sys,
        )
    }

    /// `dw = alpha·correlate(x, dy) + beta·dw` (`cudnnConvolutionBackwardFilter`): the gradient
    /// of a forward convolution with respect to its filter. Use `beta = 1` to accumulate.
    #[doc(alias = "cudnnConvolutionBackwardFilter")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_backward_filter<T: DataType>(
        &self,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        dy_desc: &TensorDesc<T>,
        dy: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        algo: ConvBwdFilterAlgo,
        workspace: &mut Workspace,
        beta: T::Scalar,
        dw_desc: &FilterDesc<T>,
        dw: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.check_backward_filter(x_desc, dy_desc, conv, dw_desc)?;
        self.check_tensor("x", x_desc.layout(), x, false)?;
        self.check_tensor("dy", dy_desc.layout(), dy, false)?;
        self.check_buffer("dw", dw, dw_desc.span())?;
        self.check_workspace_context(workspace)?;
        let bytes = self.backward_filter_workspace_bytes(x_desc, dy_desc, conv, dw_desc, algo)?;
        workspace.prepare(bytes)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dwp, _gdw) = dw.device_ptr_mut(stream);
        let (wsp, _gws) = workspace.device_ptr_mut(self.stream())?;
        // SAFETY: live handle and descriptors; types, shapes and spans checked, all on this
        // context; dw is packed and cannot alias the inputs; the workspace holds the bytes
        // cuDNN reported for this algorithm; alpha/beta are `T::Scalar`.
        unsafe {
            raw::cudnnConvolutionBackwardFilter(
                self.lib(),
                self.as_raw(),
                (&alpha as *const T::Scalar).cast::<c_void>(),
                x_desc.as_raw(),
                xp as *const c_void,
                dy_desc.as_raw(),
                dyp as *const c_void,
                conv.as_raw(),
                algo.raw(),
                wsp,
                bytes,
                (&beta as *const T::Scalar).cast::<c_void>(),
                dw_desc.as_raw(),
                dwp as *mut c_void,
            )
        }
    }

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
        let mut want = vec![1i64; dy_desc.dims().len()];
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

/// Grows the workspace for a find call to the largest size a supported algorithm asks for
/// (within the limit). An allocation failure is not fatal: find then runs with what the
/// workspace already holds and reports the algorithms that needed more as unsupported.
fn grow_for_find(workspace: &mut Workspace, needs: impl Iterator<Item = (bool, usize)>) {
    let want = needs
        .filter(|&(ok, bytes)| ok && workspace.allows(bytes))
        .map(|(_, bytes)| bytes)
        .max()
        .unwrap_or(0);
    if let Err(e) = workspace.reserve(want) {
        log::warn!(
            "convolution find: workspace of {want} bytes not available ({e}); using {} bytes",
            workspace.capacity()
        );
    }
}
