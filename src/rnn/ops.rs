//! The checked RNN launches: forward (inference and training), backward data, backward weights.
//!
//! Each checks, before anything is enqueued: the input and output sequence descriptors describe
//! the same sequences with the widths the network reads and writes; every buffer lives on the
//! handle's context and holds its descriptor's span (the weight space and its gradient exactly
//! the network's weight-space length); cell states only for LSTMs; the workspace grows (within
//! its limit) to what cuDNN asks for; and a reserve comes from a training forward of the same
//! network and descriptors, with backward data run before backward weights.
use std::cell::RefMut;
use std::ffi::c_void;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};
use cudnn_safe_sys as sys;

use super::reserve::ReserveState;
use super::{
    ffi, BackwardData, BackwardWeights, CellMode, DropoutSlot, Forward, ForwardMode, Rnn,
    RnnReserve, SeqDataDesc, StateDescs, TempSpace, WeightGradMode,
};
use crate::checks::{opt_ptr, opt_ptr_mut};
use crate::dropout::Dropout;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::stream_order::cross_use_opt;
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};

/// many when `exact`).
fn check_buf<T, B: DeviceSlice<T> + ?Sized>(
    cudnn: &Cudnn,
    name: &'static str,
    buf: &B,
    required: usize,
    exact: bool,
) -> Result<()> {
    cudnn.check_buffer(name, buf, required)?;
    if exact && buf.len() != required {
        return Err(Error::InvalidArgument {
            what: "weight-space length",
            expected: format!("exactly {required} elements (the RNN's weight space) in `{name}`"),
            got: format!("{} elements", buf.len()),
        });
    }
    Ok(())
}

fn check_opt<T, B: DeviceSlice<T> + ?Sized>(
    cudnn: &Cudnn,
    name: &'static str,
    buf: Option<&B>,
    required: usize,
) -> Result<()> {
    match buf {
        Some(b) => check_buf(cudnn, name, b, required, false),
        None => Ok(()),
    }
}

fn seq_dims<T: DataType>(d: &SeqDataDesc<T>) -> Vec<i64> {
    vec![d.max_len(), d.batch(), d.vector_size()]
}

/// Memo tags for `Cudnn`'s workspace-size cache: far above any convolution algorithm number
/// (the first key word of the convolution entries), so the two families never collide.
const MEMO_WORKSPACE: u64 = 0x524E_4E5F_5753_0000;
const MEMO_RESERVE: u64 = 0x524E_4E5F_5253_0000;

impl<T: DataType> Rnn<T> {
    /// Checks that `x_desc` and `y_desc` describe the same sequences, with this network's input
    /// and output widths, in a layout the network accepts.
    fn check_io(&self, x_desc: &SeqDataDesc<T>, y_desc: &SeqDataDesc<T>) -> Result<()> {
        if x_desc.vector_size() != self.input_size() {
            return Err(Error::ShapeMismatch {
                a: "x",
                a_dims: seq_dims(x_desc),
                b: "rnn",
                b_dims: vec![self.input_size()],
                rule: "the input vector size must equal the RNN's input size",
            });
        }
        if y_desc.vector_size() != self.output_size() {
            return Err(Error::ShapeMismatch {
                a: "y",
                a_dims: seq_dims(y_desc),
                b: "rnn",
                b_dims: vec![self.output_size()],
                rule: "the output vector size must equal directions × (projection or hidden) size",
            });
        }
        if x_desc.layout() != y_desc.layout()
            || x_desc.max_len() != y_desc.max_len()
            || x_desc.raw_lengths() != y_desc.raw_lengths()
        {
            return Err(Error::ShapeMismatch {
                a: "x",
                a_dims: seq_dims(x_desc),
                b: "y",
                b_dims: seq_dims(y_desc),
                rule: "x and y must describe the same sequences (layout, maximum length, lengths)",
            });
        }
        if x_desc.layout().is_padded() && !self.padded_io() {
            return Err(Error::invalid(
                "RNN sequence layout",
                "SeqLayout::Packed (the RNN was built with padded_io(false))",
                format!("{:?}", x_desc.layout()),
            ));
        }
        Ok(())
    }

    fn check_cell_state(&self, name: &'static str, given: bool) -> Result<()> {
        if given && self.cell() != CellMode::Lstm {
            return Err(Error::invalid(
                "RNN cell state",
                "cell states only for LSTM cells",
                format!("`{name}` for a {} cell", self.cell().name()),
            ));
        }
        Ok(())
    }

    /// What every launch does once its buffers are checked: the workspace on the handle's
    /// context and grown to what cuDNN asks for, and the state descriptors of the batch.
    fn prepare(
        &self,
        cudnn: &Cudnn,
        mode: ForwardMode,
        x_desc: &SeqDataDesc<T>,
        workspace: &mut Workspace,
    ) -> Result<(TempSpace, RefMut<'_, StateDescs<T>>)> {
        cudnn.check_workspace_context(workspace)?;
        let sizes = self.temp_space_sizes(cudnn, mode, x_desc)?;
        workspace.prepare(sizes.workspace)?;
        Ok((sizes, self.state_descs(x_desc.batch())?))
    }

    /// The network's own dropout, borrowed for a training forward, which draws masks from (so
    /// writes) its generator states; `None` in inference or without a dropout.
    fn training_dropout(
        &self,
        cudnn: &Cudnn,
        mode: ForwardMode,
    ) -> Result<Option<RefMut<'_, Dropout>>> {
        let (DropoutSlot::User(d), ForwardMode::Training) = (&self.dropout, mode) else {
            return Ok(None);
        };
        let d = d
            .try_borrow_mut()
            .map_err(|_| Error::invalid("RNN dropout", "no other use in progress", "in use"))?;
        d.check_context(cudnn)?;
        Ok(Some(d))
    }

    /// Workspace and reserve sizes cuDNN asks for to run this network on `x_desc`'s sequences
    /// (memoised per handle).
    #[doc(alias = "cudnnGetRNNTempSpaceSizes")]
    pub fn temp_space_sizes(
        &self,
        cudnn: &Cudnn,
        mode: ForwardMode,
        x_desc: &SeqDataDesc<T>,
    ) -> Result<TempSpace> {
        let m = mode.raw().0 as u64;
        let kw = [MEMO_WORKSPACE | m, self.id(), x_desc.id(), 0, 0];
        let kr = [MEMO_RESERVE | m, self.id(), x_desc.id(), 0, 0];
        {
            let memo = cudnn.ws_memo().borrow();
            if let (Some(workspace), Some(reserve)) = (memo.get(&kw), memo.get(&kr)) {
                return Ok(TempSpace { workspace, reserve });
            }
        }
        cudnn.bind()?;
        let (mut workspace, mut reserve) = (0usize, 0usize);
        // SAFETY: live handle and descriptors; valid out-pointers.
        unsafe {
            ffi::cudnnGetRNNTempSpaceSizes(
                cudnn.lib(),
                cudnn.as_raw(),
                self.as_raw(),
                mode.raw(),
                x_desc.as_raw(),
                &mut workspace,
                &mut reserve,
            )
        }?;
        if mode == ForwardMode::Inference {
            reserve = 0;
        }
        for bytes in [workspace, reserve] {
            if bytes > MAX_WORKSPACE_BYTES {
                return Err(Error::WorkspaceLimit {
                    requested: bytes,
                    limit: MAX_WORKSPACE_BYTES,
                });
            }
        }
        let mut memo = cudnn.ws_memo().borrow_mut();
        memo.put(kw, workspace);
        memo.put(kr, reserve);
        Ok(TempSpace { workspace, reserve })
    }

    /// Runs the network over `x` in inference mode (no dropout, no reserve), writing `y` and,
    /// when asked, the final states.
    ///
    /// In padded layouts the padding of `y` (steps past each sequence's length) is set to the
    /// fill value of `y_desc`.
    ///
    /// ```no_run
    /// # fn main() -> cudnn_safe::Result<()> {
    /// use cudnn_safe::rnn::{CellMode, Forward, Rnn, SeqDataDesc, SeqLayout};
    /// use cudnn_safe::{cuda_context, Cudnn, Workspace};
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let rnn = Rnn::<f32>::builder(CellMode::Gru, 4, 8).bidirectional().build(&cudnn)?;
    /// let x_d = SeqDataDesc::<f32>::uniform(SeqLayout::BatchMajor, 10, 2, 4)?;
    /// let y_d = SeqDataDesc::<f32>::uniform(SeqLayout::BatchMajor, 10, 2, rnn.output_size())?;
    /// let w = stream.clone_htod(&vec![0.1f32; rnn.weight_space_len()]).unwrap();
    /// let x = stream.clone_htod(&vec![1.0f32; x_d.span()]).unwrap();
    /// let h0 = stream.alloc_zeros::<f32>(rnn.hidden_state_len(2)).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// rnn.forward_inference(&cudnn, Forward::new(&x_d, &x, &y_d, &mut y, &w).hx(&h0), &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cudnnRNNForward")]
    pub fn forward_inference(
        &self,
        cudnn: &Cudnn,
        args: Forward<'_, T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        self.forward_impl(cudnn, args, workspace, None)
    }

    /// Runs the network over `x` in training mode (dropout between layers if the network has
    /// one) and returns the reserve space the backward calls need.
    #[doc(alias = "cudnnRNNForward")]
    pub fn forward_training(
        &self,
        cudnn: &Cudnn,
        args: Forward<'_, T>,
        workspace: &mut Workspace,
    ) -> Result<RnnReserve<T>> {
        self.forward_training_impl(cudnn, args, workspace, None)
    }

    /// [`forward_training`](Self::forward_training) reusing the memory of an earlier step's
    /// reserve (which is consumed: it can no longer reach a backward call) when it is large
    /// enough and on the handle's context.
    #[doc(alias = "cudnnRNNForward")]
    pub fn forward_training_reuse(
        &self,
        cudnn: &Cudnn,
        args: Forward<'_, T>,
        workspace: &mut Workspace,
        old: RnnReserve<T>,
    ) -> Result<RnnReserve<T>> {
        self.forward_training_impl(cudnn, args, workspace, Some(old))
    }

    fn forward_training_impl(
        &self,
        cudnn: &Cudnn,
        args: Forward<'_, T>,
        workspace: &mut Workspace,
        old: Option<RnnReserve<T>>,
    ) -> Result<RnnReserve<T>> {
        let mut reserve = RnnReserve::for_forward(self.id(), &args);
        self.forward_impl(cudnn, args, workspace, Some((&mut reserve, old)))?;
        Ok(reserve)
    }

    /// The forward launch; `training` is the reserve to fill (given its memory here, `old`'s
    /// when it can be reused) for a training forward, `None` for inference.
    fn forward_impl(
        &self,
        cudnn: &Cudnn,
        args: Forward<'_, T>,
        workspace: &mut Workspace,
        training: Option<(&mut RnnReserve<T>, Option<RnnReserve<T>>)>,
    ) -> Result<()> {
        let mode = match training {
            Some(_) => ForwardMode::Training,
            None => ForwardMode::Inference,
        };
        let Forward {
            x_desc,
            x,
            y_desc,
            mut y,
            weights,
            hx,
            cx,
            mut hy,
            mut cy,
        } = args;
        let (x, y, weights) = (&x, &mut y, &weights);
        let (hx, cx, hy, cy) = (hx.as_ref(), cx.as_ref(), hy.as_mut(), cy.as_mut());
        self.check_io(x_desc, y_desc)?;
        self.check_cell_state("cx", cx.is_some())?;
        self.check_cell_state("cy", cy.is_some())?;
        let batch = x_desc.batch();
        let (h_len, c_len) = (self.hidden_state_len(batch), self.cell_state_len(batch));
        check_buf(cudnn, "x", x, x_desc.span(), false)?;
        check_buf(cudnn, "y", y, y_desc.span(), false)?;
        check_buf(cudnn, "weights", weights, self.weight_space_len(), true)?;
        check_opt(cudnn, "hx", hx, h_len)?;
        check_opt(cudnn, "cx", cx, c_len)?;
        check_opt(cudnn, "hy", hy.as_deref(), h_len)?;
        check_opt(cudnn, "cy", cy.as_deref(), c_len)?;
        let (sizes, states) = self.prepare(cudnn, mode, x_desc, workspace)?;
        let mut dropout = self.training_dropout(cudnn, mode)?;
        let mut reserve = match training {
            None => None,
            Some((r, old)) => {
                r.buf = RnnReserve::take_buffer(cudnn, sizes.reserve, old)?;
                r.bytes = sizes.reserve;
                Some(r)
            }
        };

        cudnn.bind()?;
        let lengths = x_desc.device_lengths(cudnn)?;
        let stream: &CudaStream = cudnn.stream();
        // The dropout states and a reused reserve may come from another stream: order their use.
        let dropout_stream = dropout.as_ref().map(|d| d.states_stream().clone());
        let reserve_stream = reserve.as_ref().and_then(|r| r.alloc_stream());
        {
            let _od = cross_use_opt(dropout_stream.as_deref(), stream)?;
            let _or = cross_use_opt(reserve_stream.as_deref(), stream)?;
            let _gd = dropout
                .as_mut()
                .map(|d| d.states_mut().device_ptr_mut(stream).1);
            let (lp, _gl) = lengths.device_ptr(stream);
            let (xp, _gx) = x.device_ptr(stream);
            let (yp, _gy) = y.device_ptr_mut(stream);
            let (wp, _gw) = weights.device_ptr(stream);
            let (hxp, _ghx) = opt_ptr(hx, stream);
            let (cxp, _gcx) = opt_ptr(cx, stream);
            let (hyp, _ghy) = opt_ptr_mut(hy, stream);
            let (cyp, _gcy) = opt_ptr_mut(cy, stream);
            let (wsp, _gws) = workspace.device_ptr_mut(cudnn.stream())?;
            let (rp, _gr) = opt_ptr_mut(reserve.as_mut().and_then(|r| r.buf.as_mut()), stream);
            // SAFETY: live handle and descriptors (the RNN descriptor's dropout descriptor is
            // owned by `self`, its states write-guarded for training); x and y describe the same
            // sequences with the RNN's input and output widths (checked), and every buffer is on
            // the handle's context and holds its descriptor's span (x, y), the state shape (hx,
            // cx, hy, cy; cell states only for LSTM) or exactly the weight space; outputs are
            // `&mut` borrows distinct from the inputs; the sequence lengths are an int32 device
            // array of `batch` entries equal to the descriptors' lengths; the workspace holds
            // what cuDNN asked for and the reserve (training) at least its size; every guard
            // lives until the call is enqueued.
            unsafe {
                ffi::cudnnRNNForward(
                    cudnn.lib(),
                    cudnn.as_raw(),
                    self.as_raw(),
                    mode.raw(),
                    lp as *const i32,
                    x_desc.as_raw(),
                    xp as *const c_void,
                    y_desc.as_raw(),
                    yp as *mut c_void,
                    states.h.as_raw(),
                    hxp,
                    hyp,
                    states.c.as_raw(),
                    cxp,
                    cyp,
                    self.weight_space_bytes(),
                    wp as *const c_void,
                    sizes.workspace,
                    wsp,
                    sizes.reserve,
                    rp,
                )
            }?;
        }
        Ok(())
    }

    /// The checks both backward calls start with: [`check_io`](Self::check_io), and that
    /// `reserve` comes from a training forward of this network over these sequence descriptors,
    /// on this handle's context.
    fn check_backward(
        &self,
        cudnn: &Cudnn,
        reserve: &RnnReserve<T>,
        x_desc: &SeqDataDesc<T>,
        y_desc: &SeqDataDesc<T>,
    ) -> Result<()> {
        self.check_io(x_desc, y_desc)?;
        if reserve.rnn != self.id()
            || reserve.x_desc != x_desc.id()
            || reserve.y_desc != y_desc.id()
        {
            return Err(Error::invalid(
                "RNN reserve space",
                "the reserve returned by a training forward of this RNN with these x and y \
                 descriptors",
                "a reserve from another RNN or other sequence descriptors",
            ));
        }
        if let Some(b) = &reserve.buf {
            check_buf(cudnn, "reserve", b, reserve.bytes, false)?;
        }
        Ok(())
    }

    /// Gradients with respect to the input (`dx`) and, when asked, the initial states, from the
    /// gradient `dy` of the output (and of the final states, if given). Consumes the reserve's
    /// first backward step: call it once per training forward, before
    /// [`backward_weights`](Self::backward_weights).
    ///
    /// `y`, `hx` and `cx` must be the ones the training forward used and produced (cuDNN reads
    /// them; this is not checked beyond their sizes and presence).
    #[doc(alias = "cudnnRNNBackwardData_v8")]
    pub fn backward_data(
        &self,
        cudnn: &Cudnn,
        reserve: &mut RnnReserve<T>,
        args: BackwardData<'_, T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let BackwardData {
            y_desc,
            y,
            dy,
            x_desc,
            mut dx,
            weights,
            hx,
            cx,
            dhy,
            dcy,
            mut dhx,
            mut dcx,
        } = args;
        let (y, dy, dx, weights) = (&y, &dy, &mut dx, &weights);
        let (hx, cx, dhy, dcy) = (hx.as_ref(), cx.as_ref(), dhy.as_ref(), dcy.as_ref());
        let (dhx, dcx) = (dhx.as_mut(), dcx.as_mut());
        self.check_backward(cudnn, reserve, x_desc, y_desc)?;
        reserve.state.ready_for_data()?;
        for (name, given) in [
            ("cx", cx.is_some()),
            ("dcy", dcy.is_some()),
            ("dcx", dcx.is_some()),
        ] {
            self.check_cell_state(name, given)?;
        }
        reserve.check_states_match(hx.is_some(), Some(cx.is_some()))?;
        let batch = x_desc.batch();
        let (h_len, c_len) = (self.hidden_state_len(batch), self.cell_state_len(batch));
        check_buf(cudnn, "y", y, y_desc.span(), false)?;
        check_buf(cudnn, "dy", dy, y_desc.span(), false)?;
        check_buf(cudnn, "dx", dx, x_desc.span(), false)?;
        check_buf(cudnn, "weights", weights, self.weight_space_len(), true)?;
        check_opt(cudnn, "hx", hx, h_len)?;
        check_opt(cudnn, "cx", cx, c_len)?;
        check_opt(cudnn, "dhy", dhy, h_len)?;
        check_opt(cudnn, "dcy", dcy, c_len)?;
        check_opt(cudnn, "dhx", dhx.as_deref(), h_len)?;
        check_opt(cudnn, "dcx", dcx.as_deref(), c_len)?;
        let (sizes, states) = self.prepare(cudnn, ForwardMode::Training, x_desc, workspace)?;

        cudnn.bind()?;
        let lengths = x_desc.device_lengths(cudnn)?;
        let stream: &CudaStream = cudnn.stream();
        // The reserve was allocated on the forward's stream: order this use with it.
        let reserve_stream = reserve.alloc_stream();
        let _or = cross_use_opt(reserve_stream.as_deref(), stream)?;
        let (lp, _gl) = lengths.device_ptr(stream);
        let (yp, _gy) = y.device_ptr(stream);
        let (dyp, _gdy) = dy.device_ptr(stream);
        let (dxp, _gdx) = dx.device_ptr_mut(stream);
        let (wp, _gw) = weights.device_ptr(stream);
        let (hxp, _ghx) = opt_ptr(hx, stream);
        let (cxp, _gcx) = opt_ptr(cx, stream);
        let (dhyp, _gdhy) = opt_ptr(dhy, stream);
        let (dcyp, _gdcy) = opt_ptr(dcy, stream);
        let (dhxp, _gdhx) = opt_ptr_mut(dhx, stream);
        let (dcxp, _gdcx) = opt_ptr_mut(dcx, stream);
        let (wsp, _gws) = workspace.device_ptr_mut(cudnn.stream())?;
        let reserve_bytes = reserve.bytes;
        let (rp, _gr) = opt_ptr_mut(reserve.buf.as_mut(), stream);
        // SAFETY: live handle and descriptors; x and y describe the same sequences with the
        // RNN's widths, the reserve comes from a training forward of this RNN over these
        // descriptors and has not been through backward data yet (checked); every buffer is on
        // the handle's context and holds its span, its state shape (cell states only for LSTM)
        // or exactly the weight space; outputs are distinct `&mut` borrows; the lengths are an
        // int32 device array of `batch` entries; the workspace holds what cuDNN asked for and
        // the reserve its recorded size; guards live until the call is enqueued.
        let result = unsafe {
            ffi::cudnnRNNBackwardData_v8(
                cudnn.lib(),
                cudnn.as_raw(),
                self.as_raw(),
                lp as *const i32,
                y_desc.as_raw(),
                yp as *const c_void,
                dyp as *const c_void,
                x_desc.as_raw(),
                dxp as *mut c_void,
                states.h.as_raw(),
                hxp,
                dhyp,
                dhxp,
                states.c.as_raw(),
                cxp,
                dcyp,
                dcxp,
                self.weight_space_bytes(),
                wp as *const c_void,
                sizes.workspace,
                wsp,
                reserve_bytes,
                rp,
            )
        };
        reserve.state = if result.is_ok() {
            ReserveState::DataDone
        } else {
            ReserveState::Failed
        };
        result
    }

    /// The gradient of the loss with respect to the weight space, written into (or added to)
    /// `dweights`. Needs [`backward_data`](Self::backward_data) to have run on the reserve
    /// first (cuDNN keeps intermediate results there); may run several times on one reserve.
    ///
    /// `x`, `hx` and `y` must be the ones of the training forward.
    #[doc(alias = "cudnnRNNBackwardWeights_v8")]
    pub fn backward_weights(
        &self,
        cudnn: &Cudnn,
        reserve: &mut RnnReserve<T>,
        args: BackwardWeights<'_, T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let BackwardWeights {
            x_desc,
            x,
            y_desc,
            y,
            mut dweights,
            hx,
            mode,
        } = args;
        let (x, y, dweights, hx) = (&x, &y, &mut dweights, hx.as_ref());
        self.check_backward(cudnn, reserve, x_desc, y_desc)?;
        reserve.state.ready_for_weights()?;
        reserve.check_states_match(hx.is_some(), None)?;
        let batch = x_desc.batch();
        check_buf(cudnn, "x", x, x_desc.span(), false)?;
        check_buf(cudnn, "y", y, y_desc.span(), false)?;
        check_buf(cudnn, "dweights", dweights, self.weight_space_len(), true)?;
        check_opt(cudnn, "hx", hx, self.hidden_state_len(batch))?;
        let (sizes, states) = self.prepare(cudnn, ForwardMode::Training, x_desc, workspace)?;

        cudnn.bind()?;
        let lengths = x_desc.device_lengths(cudnn)?;
        let stream: &CudaStream = cudnn.stream();
        // The reserve was allocated on the forward's stream: order this use with it.
        let reserve_stream = reserve.alloc_stream();
        let _or = cross_use_opt(reserve_stream.as_deref(), stream)?;
        let (lp, _gl) = lengths.device_ptr(stream);
        let (xp, _gx) = x.device_ptr(stream);
        let (yp, _gy) = y.device_ptr(stream);
        let (dwp, _gdw) = dweights.device_ptr_mut(stream);
        if mode == WeightGradMode::Overwrite {
            // SAFETY: `dwp` addresses exactly `weight_space_bytes` bytes on the handle's context
            // (checked above), kept alive and ordered by its guard; all-zero bytes are a valid
            // value of every element type; the memset is enqueued on the handle's stream, before
            // the accumulation below.
            unsafe {
                cudarc::driver::result::memset_d8_async(
                    dwp,
                    0,
                    self.weight_space_bytes(),
                    stream.cu_stream(),
                )
            }
            .map_err(|e| Error::driver("zeroing the weight gradient", e))?;
        }
        let (hxp, _ghx) = opt_ptr(hx, stream);
        let (wsp, _gws) = workspace.device_ptr_mut(cudnn.stream())?;
        let reserve_bytes = reserve.bytes;
        let (rp, _gr) = opt_ptr_mut(reserve.buf.as_mut(), stream);
        // SAFETY: live handle and descriptors; x and y describe the same sequences with the
        // RNN's widths; the reserve comes from a training forward of this RNN over these
        // descriptors and backward data has run on it (checked); every buffer is on the
        // handle's context and holds its span, the hidden-state shape or exactly the weight
        // space (dweights, the only output, a distinct `&mut` borrow); the lengths are an int32
        // device array of `batch` entries; the workspace holds what cuDNN asked for; guards
        // live until the call is enqueued.
        unsafe {
            ffi::cudnnRNNBackwardWeights_v8(
                cudnn.lib(),
                cudnn.as_raw(),
                self.as_raw(),
                sys::cudnnWgradMode_t::CUDNN_WGRAD_MODE_ADD,
                lp as *const i32,
                x_desc.as_raw(),
                xp as *const c_void,
                states.h.as_raw(),
                hxp,
                y_desc.as_raw(),
                yp as *const c_void,
                self.weight_space_bytes(),
                dwp as *mut c_void,
                sizes.workspace,
                wsp,
                reserve_bytes,
                rp,
            )
        }
    }
}
