//! The buffers of each launch ([`Forward`], [`BackwardData`], [`BackwardWeights`]) and the
//! launch settings ([`ForwardMode`], [`WeightGradMode`], [`TempSpace`]).
use cudarc::driver::{CudaView, CudaViewMut};
use cudnn_safe_sys as sys;

use super::SeqDataDesc;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::DataType;

/// The setters of a launch's optional buffers, each storing the buffer's view: `input`s take a
/// shared borrow, `output`s a mutable one.
macro_rules! optional_buffers {
    ($(input $(#[$im:meta])* $i:ident;)* $(output $(#[$om:meta])* $o:ident;)*) => {
        $(
            $(#[$im])*
            pub fn $i(mut self, $i: &'a impl DeviceBuffer<T>) -> Self {
                self.$i = Some($i.view());
                self
            }
        )*
        $(
            $(#[$om])*
            pub fn $o(mut self, $o: &'a mut impl DeviceBufferMut<T>) -> Self {
                self.$o = Some($o.view_mut());
                self
            }
        )*
    };
}

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
    pub(super) fn raw(self) -> sys::cudnnForwardMode_t {
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
/// `hx`/`hy` hold [`Rnn::hidden_state_len`](super::Rnn::hidden_state_len) elements, `cx`/`cy`
/// [`Rnn::cell_state_len`](super::Rnn::cell_state_len).
#[must_use]
pub struct Forward<'a, T: DataType> {
    pub(super) x_desc: &'a SeqDataDesc<T>,
    pub(super) x: CudaView<'a, T>,
    pub(super) y_desc: &'a SeqDataDesc<T>,
    pub(super) y: CudaViewMut<'a, T>,
    pub(super) weights: CudaView<'a, T>,
    pub(super) hx: Option<CudaView<'a, T>>,
    pub(super) cx: Option<CudaView<'a, T>>,
    pub(super) hy: Option<CudaViewMut<'a, T>>,
    pub(super) cy: Option<CudaViewMut<'a, T>>,
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
    optional_buffers! {
        input
        /// Initial hidden state (zero without it).
        hx;
        input
        /// Initial LSTM cell state (zero without it).
        cx;
        output
        /// Where to write the final hidden state (each sequence's state after its last step; for
        /// the reverse direction, after step 0).
        hy;
        output
        /// Where to write the final LSTM cell state.
        cy;
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
    pub(super) y_desc: &'a SeqDataDesc<T>,
    pub(super) y: CudaView<'a, T>,
    pub(super) dy: CudaView<'a, T>,
    pub(super) x_desc: &'a SeqDataDesc<T>,
    pub(super) dx: CudaViewMut<'a, T>,
    pub(super) weights: CudaView<'a, T>,
    pub(super) hx: Option<CudaView<'a, T>>,
    pub(super) cx: Option<CudaView<'a, T>>,
    pub(super) dhy: Option<CudaView<'a, T>>,
    pub(super) dcy: Option<CudaView<'a, T>>,
    pub(super) dhx: Option<CudaViewMut<'a, T>>,
    pub(super) dcx: Option<CudaViewMut<'a, T>>,
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
    optional_buffers! {
        input
        /// The initial hidden state the forward used.
        hx;
        input
        /// The initial LSTM cell state the forward used.
        cx;
        input
        /// Gradient with respect to the final hidden state.
        dhy;
        input
        /// Gradient with respect to the final LSTM cell state.
        dcy;
        output
        /// Where to write the gradient with respect to the initial hidden state.
        dhx;
        output
        /// Where to write the gradient with respect to the initial LSTM cell state.
        dcx;
    }
}

/// The buffers of a backward-weights call: the forward's input `x`, initial hidden state `hx`
/// (pass it exactly when the forward had it) and output `y`, and the weight-space gradient
/// `dweights` to overwrite (default) or add to.
#[must_use]
pub struct BackwardWeights<'a, T: DataType> {
    pub(super) x_desc: &'a SeqDataDesc<T>,
    pub(super) x: CudaView<'a, T>,
    pub(super) y_desc: &'a SeqDataDesc<T>,
    pub(super) y: CudaView<'a, T>,
    pub(super) dweights: CudaViewMut<'a, T>,
    pub(super) hx: Option<CudaView<'a, T>>,
    pub(super) mode: WeightGradMode,
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
    optional_buffers! {
        input
        /// The initial hidden state the forward used.
        hx;
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
