//! The checked RNN launches: forward (inference and training), backward data, backward weights.
//!
//! Each checks, before anything is enqueued: the input and output sequence descriptors describe
//! the same sequences with the widths the network reads and writes; every buffer lives on the
//! handle's context and holds its descriptor's span (the weight space and its gradient exactly
//! the network's weight-space length); cell states only for LSTMs; the workspace grows (within
//! its limit) to what cuDNN asks for; and a reserve comes from a training forward of the same
//! network and descriptors, with backward data run before backward weights.
use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice,
};
use cudnn_safe_sys as sys;

use super::{ffi, CellMode, DropoutSlot, Rnn, SeqDataDesc};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::checks::{opt_ptr, opt_ptr_mut};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::stream_order::cross_use;
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};

/// Inference or training (`cudnnForwardMode_t`): training keeps what the backward calls need in
/// a reserve space and applies dropout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ForwardMode {
    /// No reserve space, no dropout.
    Inference,
    /// Fills a reserve space for the backward calls; applies dropout between layers.
    Training,
}

impl ForwardMode {
    fn raw(self) -> sys::cudnnForwardMode_t {
        match self {
            ForwardMode::Inference => sys::cudnnForwardMode_t::CUDNN_FWD_MODE_INFERENCE,
            ForwardMode::Training => sys::cudnnForwardMode_t::CUDNN_FWD_MODE_TRAINING,
        }
    }
}

/// Scratch memory sizes of one RNN problem (`cudnnGetRNNTempSpaceSizes`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TempSpace {
    /// Workspace for the call (the same for forward training and both backward calls).
    pub workspace: usize,
    /// Reserve space a training forward fills for the backward calls (0 for inference).
    pub reserve: usize,
}

/// Whether backward weights overwrites the weight gradient or adds to it
/// (`cudnnWgradMode_t`).
///
/// cuDNN's `cudnnRNNBackwardWeights_v8` documents only `CUDNN_WGRAD_MODE_ADD` as supported, so
/// both modes run in add mode; [`WeightGradMode::Overwrite`] first zeroes the gradient buffer on
/// the handle's stream (what PyTorch does: a zero-filled buffer, then add).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightGradMode {
    /// `dw = gradient`. The default.
    #[default]
    Overwrite,
    /// `dw += gradient` (for accumulating over several batches).
    Accumulate,
}

/// The buffers of a forward call: input `x`, output `y`, the weight space, and the optional
/// initial states (`hx`, LSTM `cx`; zero when absent) and final states (`hy`, LSTM `cy`; not
/// computed when absent).
///
/// `hx`/`hy` hold [`Rnn::hidden_state_len`] elements, `cx`/`cy` [`Rnn::cell_state_len`].
#[must_use]
pub struct Forward<'a, T: DataType> {
    x_desc: &'a SeqDataDesc<T>,
    x: CudaView<'a, T>,
    y_desc: &'a SeqDataDesc<T>,
    y: CudaViewMut<'a, T>,
    weights: CudaView<'a, T>,
    hx: Option<CudaView<'a, T>>,
    cx: Option<CudaView<'a, T>>,
    hy: Option<CudaViewMut<'a, T>>,
    cy: Option<CudaViewMut<'a, T>>,
}

impl<'a, T: DataType> Forward<'a, T> {
    /// `x` (described by `x_desc`, `input_size` values per step) → `y` (described by `y_desc`,
    /// `output_size` values per step) with the given weight space; no initial or final states.
    pub fn new(
        x_desc: &'a SeqDataDesc<T>,
        x: &'a impl DeviceBuffer<T>,
        y_desc: &'a SeqDataDesc<T>,
        y: &'a mut impl DeviceBufferMut<T>,
        weights: &'a impl DeviceBuffer<T>,
    ) -> Self {
        Forward {
            x_desc,
            x: x.view(),
            y_desc,
            y: y.view_mut(),
            weights: weights.view(),
            hx: None,
            cx: None,
            hy: None,
            cy: None,
        }
    }
    /// Initial hidden state (zero without it).
    pub fn hx(mut self, hx: &'a impl DeviceBuffer<T>) -> Self {
        self.hx = Some(hx.view());
        self
    }
    /// Initial LSTM cell state (zero without it).
    pub fn cx(mut self, cx: &'a impl DeviceBuffer<T>) -> Self {
        self.cx = Some(cx.view());
        self
    }
    /// Where to write the final hidden state (each sequence's state after its last step; for
    /// the reverse direction, after step 0).
    pub fn hy(mut self, hy: &'a mut impl DeviceBufferMut<T>) -> Self {
        self.hy = Some(hy.view_mut());
        self
    }
    /// Where to write the final LSTM cell state.
    pub fn cy(mut self, cy: &'a mut impl DeviceBufferMut<T>) -> Self {
        self.cy = Some(cy.view_mut());
        self
    }
}

/// The buffers of a backward-data call: the forward's output `y` and the gradient `dy` with
/// respect to it, the gradient `dx` to compute, the weight space, and the optional states:
/// the forward's initial states (`hx`, `cx` — pass them exactly when the forward had them),
/// gradients with respect to the final states (`dhy`, `dcy`; zero when absent), and where to
/// write the gradients with respect to the initial states (`dhx`, `dcx`; not computed when
/// absent).
#[must_use]
pub struct BackwardData<'a, T: DataType> {
    y_desc: &'a SeqDataDesc<T>,
    y: CudaView<'a, T>,
    dy: CudaView<'a, T>,
    x_desc: &'a SeqDataDesc<T>,
    dx: CudaViewMut<'a, T>,
    weights: CudaView<'a, T>,
    hx: Option<CudaView<'a, T>>,
    cx: Option<CudaView<'a, T>>,
    dhy: Option<CudaView<'a, T>>,
    dcy: Option<CudaView<'a, T>>,
    dhx: Option<CudaViewMut<'a, T>>,
    dcx: Option<CudaViewMut<'a, T>>,
}

impl<'a, T: DataType> BackwardData<'a, T> {
    /// `dy` (laid out as `y`, by `y_desc`) → `dx` (laid out by `x_desc`), given the forward's
    /// output `y` and the weight space.
    pub fn new(
        y_desc: &'a SeqDataDesc<T>,
        y: &'a impl DeviceBuffer<T>,
        dy: &'a impl DeviceBuffer<T>,
        x_desc: &'a SeqDataDesc<T>,
        dx: &'a mut impl DeviceBufferMut<T>,
        weights: &'a impl DeviceBuffer<T>,
    ) -> Self {
        BackwardData {
            y_desc,
            y: y.view(),
            dy: dy.view(),
            x_desc,
            dx: dx.view_mut(),
            weights: weights.view(),
            hx: None,
            cx: None,
            dhy: None,
            dcy: None,
            dhx: None,
            dcx: None,
        }
    }
    /// The initial hidden state the forward used.
    pub fn hx(mut self, hx: &'a impl DeviceBuffer<T>) -> Self {
        self.hx = Some(hx.view());
        self
    }
    /// The initial LSTM cell state the forward used.
    pub fn cx(mut self, cx: &'a impl DeviceBuffer<T>) -> Self {
        self.cx = Some(cx.view());
        self
    }
    /// Gradient with respect to the final hidden state.
    pub fn dhy(mut self, dhy: &'a impl DeviceBuffer<T>) -> Self {
        self.dhy = Some(dhy.view());
        self
    }
    /// Gradient with respect to the final LSTM cell state.
    pub fn dcy(mut self, dcy: &'a impl DeviceBuffer<T>) -> Self {
        self.dcy = Some(dcy.view());
        self
    }
    /// Where to write the gradient with respect to the initial hidden state.
    pub fn dhx(mut self, dhx: &'a mut impl DeviceBufferMut<T>) -> Self {
        self.dhx = Some(dhx.view_mut());
        self
    }
    /// Where to write the gradient with respect to the initial LSTM cell state.
    pub fn dcx(mut self, dcx: &'a mut impl DeviceBufferMut<T>) -> Self {
        self.dcx = Some(dcx.view_mut());
        self
    }
}

/// The buffers of a backward-weights call: the forward's input `x`, initial hidden state `hx`
/// (pass it exactly when the forward had it) and output `y`, and the weight-space gradient
/// `dweights` to overwrite (default) or add to.
#[must_use]
pub struct BackwardWeights<'a, T: DataType> {
    x_desc: &'a SeqDataDesc<T>,
    x: CudaView<'a, T>,
    y_desc: &'a SeqDataDesc<T>,
    y: CudaView<'a, T>,
    dweights: CudaViewMut<'a, T>,
    hx: Option<CudaView<'a, T>>,
    mode: WeightGradMode,
}

impl<'a, T: DataType> BackwardWeights<'a, T> {
    /// Weight gradient from the forward's `x` and `y` into `dweights` (overwritten).
    pub fn new(
        x_desc: &'a SeqDataDesc<T>,
        x: &'a impl DeviceBuffer<T>,
        y_desc: &'a SeqDataDesc<T>,
        y: &'a impl DeviceBuffer<T>,
        dweights: &'a mut impl DeviceBufferMut<T>,
    ) -> Self {
        BackwardWeights {
            x_desc,
            x: x.view(),
            y_desc,
            y: y.view(),
            dweights: dweights.view_mut(),
            hx: None,
            mode: WeightGradMode::Overwrite,
        }
    }
    /// The initial hidden state the forward used.
    pub fn hx(mut self, hx: &'a impl DeviceBuffer<T>) -> Self {
        self.hx = Some(hx.view());
        self
    }
    /// Overwrite (default) or accumulate.
    pub fn mode(mut self, mode: WeightGradMode) -> Self {
        self.mode = mode;
        self
    }
    /// Shorthand for `mode(WeightGradMode::Accumulate)`.
    pub fn accumulate(self) -> Self {
        self.mode(WeightGradMode::Accumulate)
    }
}

/// Where a reserve stands in the training step it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReserveState {
    /// Filled by a training forward.
    Forward,
    /// Backward data ran on it (backward weights may follow, any number of times).
    DataDone,
    /// A backward-data call on it failed: its contents are unknown.
    Failed,
}

/// The reserve space a training forward fills and the backward calls read (cuDNN's
/// `reserveSpace`), owned so that it can only reach the backward calls of the same network and
/// sequence descriptors, unchanged, in the order cuDNN requires (backward data, then backward
/// weights).
///
/// It also records whether the forward had initial states, which the backward calls must pass
/// again. `Send`.
pub struct RnnReserve<T: DataType> {
    buf: Option<CudaSlice<u8>>,
    bytes: usize,
    rnn: u64,
    x_desc: u64,
    y_desc: u64,
    had_hx: bool,
    had_cx: bool,
    state: ReserveState,
    _t: PhantomData<fn() -> T>,
}

impl<T: DataType> std::fmt::Debug for RnnReserve<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnnReserve")
            .field("bytes", &self.bytes)
            .field("state", &self.state)
            .field("had_hx", &self.had_hx)
            .field("had_cx", &self.had_cx)
            .finish()
    }
}

impl<T: DataType> RnnReserve<T> {
    /// Bytes cuDNN asked for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// Whether backward data has run on it (so backward weights may).
    pub fn backward_data_done(&self) -> bool {
        self.state == ReserveState::DataDone
    }
}

/// Checks that `buf` lives on the handle's context and holds `required` elements (exactly that
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
    vec![d.max_len() as i64, d.batch() as i64, d.vector_size() as i64]
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
                b_dims: vec![self.input_size() as i64],
                rule: "the input vector size must equal the RNN's input size",
            });
        }
        if y_desc.vector_size() != self.output_size() {
            return Err(Error::ShapeMismatch {
                a: "y",
                a_dims: seq_dims(y_desc),
                b: "rnn",
                b_dims: vec![self.output_size() as i64],
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
        self.forward_impl(cudnn, ForwardMode::Inference, args, workspace, None)
            .map(|_| ())
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
        self.forward_impl(cudnn, ForwardMode::Training, args, workspace, None)
            .map(|r| r.expect("training returns a reserve"))
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
        self.forward_impl(cudnn, ForwardMode::Training, args, workspace, Some(old))
            .map(|r| r.expect("training returns a reserve"))
    }

    fn forward_impl(
        &self,
        cudnn: &Cudnn,
        mode: ForwardMode,
        args: Forward<'_, T>,
        workspace: &mut Workspace,
        old: Option<RnnReserve<T>>,
    ) -> Result<Option<RnnReserve<T>>> {
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
        cudnn.check_workspace_context(workspace)?;
        let sizes = self.temp_space_sizes(cudnn, mode, x_desc)?;
        workspace.prepare(sizes.workspace)?;
        let states = self.state_descs(batch)?;

        // A training forward draws dropout masks from the generator states (writing them).
        let mut dropout = match (&self.dropout, mode) {
            (DropoutSlot::User(d), ForwardMode::Training) => {
                let d = d.try_borrow_mut().map_err(|_| {
                    Error::invalid("RNN dropout", "no other use in progress", "in use")
                })?;
                if **d.context() != **cudnn.context() {
                    return Err(Error::ForeignContext {
                        name: "dropout",
                        expected: cudnn.context().ordinal(),
                        found: d.context().ordinal(),
                    });
                }
                Some(d)
            }
            _ => None,
        };

        let mut reserve = match mode {
            ForwardMode::Inference => None,
            ForwardMode::Training => {
                let reusable = old.and_then(|r| r.buf).filter(|b| {
                    b.len() >= sizes.reserve && **b.stream().context() == **cudnn.context()
                });
                let buf = match reusable {
                    Some(b) => Some(b),
                    None if sizes.reserve == 0 => None,
                    None => {
                        // SAFETY: uninitialised bytes are sound for `u8` storage that only
                        // cuDNN uses: the training forward writes the reserve before the
                        // backward calls read it, and it is never read on the host.
                        Some(
                            unsafe { cudnn.stream().alloc::<u8>(sizes.reserve) }.map_err(|e| {
                                Error::driver("allocating the RNN reserve space", e)
                            })?,
                        )
                    }
                };
                Some(RnnReserve {
                    buf,
                    bytes: sizes.reserve,
                    rnn: self.id(),
                    x_desc: x_desc.id(),
                    y_desc: y_desc.id(),
                    had_hx: hx.is_some(),
                    had_cx: cx.is_some(),
                    state: ReserveState::Forward,
                    _t: PhantomData,
                })
            }
        };

        cudnn.bind()?;
        let lengths = x_desc.device_lengths(cudnn)?;
        let stream: &CudaStream = cudnn.stream();
        // The dropout states and a reused reserve may come from another stream: order their use.
        let dropout_stream = dropout.as_ref().map(|d| d.states_stream().clone());
        let reserve_stream = reserve
            .as_ref()
            .and_then(|r| r.buf.as_ref())
            .map(|b| b.stream().clone());
        {
            let _od = dropout_stream
                .as_deref()
                .map(|a| cross_use(a, stream))
                .transpose()?;
            let _or = reserve_stream
                .as_deref()
                .map(|a| cross_use(a, stream))
                .transpose()?;
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
            let (rp, _gr) = match reserve.as_mut().and_then(|r| r.buf.as_mut()) {
                Some(b) => {
                    let (p, g) = b.device_ptr_mut(stream);
                    (p as *mut c_void, Some(g))
                }
                None => (std::ptr::null_mut(), None),
            };
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
        Ok(reserve)
    }

    /// Checks that `reserve` comes from a training forward of this network over these
    /// sequence descriptors, on this handle's context.
    fn check_reserve(
        &self,
        cudnn: &Cudnn,
        reserve: &RnnReserve<T>,
        x_desc: &SeqDataDesc<T>,
        y_desc: &SeqDataDesc<T>,
    ) -> Result<()> {
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

    fn check_states_match(
        &self,
        reserve: &RnnReserve<T>,
        hx: bool,
        cx: Option<bool>,
    ) -> Result<()> {
        let mismatch = |name: &'static str, forward: bool| {
            Error::invalid(
                "RNN initial state",
                format!(
                    "`{name}` {} as in the training forward",
                    if forward { "given" } else { "absent" }
                ),
                if forward { "absent" } else { "given" },
            )
        };
        if hx != reserve.had_hx {
            return Err(mismatch("hx", reserve.had_hx));
        }
        if let Some(cx) = cx {
            if cx != reserve.had_cx {
                return Err(mismatch("cx", reserve.had_cx));
            }
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
        self.check_io(x_desc, y_desc)?;
        self.check_reserve(cudnn, reserve, x_desc, y_desc)?;
        match reserve.state {
            ReserveState::Forward => {}
            ReserveState::DataDone => {
                return Err(Error::invalid(
                    "RNN reserve space",
                    "a reserve fresh from a training forward (backward data runs once per forward)",
                    "a reserve backward data already used",
                ))
            }
            ReserveState::Failed => {
                return Err(Error::invalid(
                    "RNN reserve space",
                    "a reserve fresh from a training forward",
                    "a reserve whose backward-data call failed",
                ))
            }
        }
        for (name, given) in [
            ("cx", cx.is_some()),
            ("dcy", dcy.is_some()),
            ("dcx", dcx.is_some()),
        ] {
            self.check_cell_state(name, given)?;
        }
        self.check_states_match(reserve, hx.is_some(), Some(cx.is_some()))?;
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
        cudnn.check_workspace_context(workspace)?;
        let sizes = self.temp_space_sizes(cudnn, ForwardMode::Training, x_desc)?;
        workspace.prepare(sizes.workspace)?;
        let states = self.state_descs(batch)?;

        cudnn.bind()?;
        let lengths = x_desc.device_lengths(cudnn)?;
        let stream: &CudaStream = cudnn.stream();
        // The reserve was allocated on the forward's stream: order this use with it.
        let reserve_stream = reserve.buf.as_ref().map(|b| b.stream().clone());
        let _or = reserve_stream
            .as_deref()
            .map(|a| cross_use(a, stream))
            .transpose()?;
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
        let (rp, _gr) = match reserve.buf.as_mut() {
            Some(b) => {
                let (p, g) = b.device_ptr_mut(stream);
                (p as *mut c_void, Some(g))
            }
            None => (std::ptr::null_mut(), None),
        };
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
        self.check_io(x_desc, y_desc)?;
        self.check_reserve(cudnn, reserve, x_desc, y_desc)?;
        if reserve.state != ReserveState::DataDone {
            return Err(Error::invalid(
                "RNN reserve space",
                "a reserve backward data has run on (cuDNN's order: data, then weights)",
                if reserve.state == ReserveState::Failed {
                    "a reserve whose backward-data call failed"
                } else {
                    "a reserve straight from the forward"
                },
            ));
        }
        self.check_states_match(reserve, hx.is_some(), None)?;
        let batch = x_desc.batch();
        check_buf(cudnn, "x", x, x_desc.span(), false)?;
        check_buf(cudnn, "y", y, y_desc.span(), false)?;
        check_buf(cudnn, "dweights", dweights, self.weight_space_len(), true)?;
        check_opt(cudnn, "hx", hx, self.hidden_state_len(batch))?;
        cudnn.check_workspace_context(workspace)?;
        let sizes = self.temp_space_sizes(cudnn, ForwardMode::Training, x_desc)?;
        workspace.prepare(sizes.workspace)?;
        let states = self.state_descs(batch)?;

        cudnn.bind()?;
        let lengths = x_desc.device_lengths(cudnn)?;
        let stream: &CudaStream = cudnn.stream();
        // The reserve was allocated on the forward's stream: order this use with it.
        let reserve_stream = reserve.buf.as_ref().map(|b| b.stream().clone());
        let _or = reserve_stream
            .as_deref()
            .map(|a| cross_use(a, stream))
            .transpose()?;
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
        let (rp, _gr) = match reserve.buf.as_mut() {
            Some(b) => {
                let (p, g) = b.device_ptr_mut(stream);
                (p as *mut c_void, Some(g))
            }
            None => (std::ptr::null_mut(), None),
        };
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
