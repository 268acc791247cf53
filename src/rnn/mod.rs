//! Recurrent layers on cuDNN 9's RNN API (`cudnnRNNForward`, `cudnnRNNBackwardData_v8`,
//! `cudnnRNNBackwardWeights_v8`): ReLU and tanh RNNs, LSTM (with optional projection) and GRU,
//! uni- or bidirectional, any number of layers.
//!
//! The pieces:
//! * [`Rnn<T>`] — the network description ([`RnnBuilder`]): cell, sizes, layers, direction, input
//!   and bias modes, dropout between layers, math type; it knows its weight-space size and the
//!   place of every weight matrix and bias inside it ([`WeightParam`], per layer, direction and
//!   gate), and converts PyTorch `nn.LSTM` / `nn.GRU` / `nn.RNN` state dicts to and from that
//!   layout ([`Rnn::weights_from_pytorch`], [`Rnn::weights_to_pytorch`]).
//! * [`SeqDataDesc<T>`] — a batch of sequences: padded sequence-major or batch-major, or packed
//!   ([`SeqLayout`]), with per-sequence lengths and the value written into padding of outputs.
//!   It uploads the lengths to the device itself the first time a launch needs them.
//! * The launches: [`Rnn::forward_inference`], [`Rnn::forward_training`] (which returns the
//!   [`RnnReserve`] the backward calls consume), [`Rnn::backward_data`] and
//!   [`Rnn::backward_weights`]; scratch memory comes from a [`crate::Workspace`].
//!
//! # Gate order and weight layout
//!
//! cuDNN numbers the linear layers of each pseudo-layer (layer × direction, forward direction
//! first) by a *linear-layer id*; matrices are stored row-major (`rows` = gate width, `cols` =
//! input width) and the biases of the same ids are vectors of `rows` elements:
//!
//! | cell | input weights `W` (ids) | recurrent weights `R` (ids) | projection |
//! |------|-------------------------|-----------------------------|------------|
//! | ReLU / tanh RNN | 0 | 1 | — |
//! | LSTM | 0 input, 1 forget, 2 cell (g), 3 output | 4–7, same order | 8 (`[proj, hidden]`, no bias) |
//! | GRU | 0 reset, 1 update (z), 2 new (n) | 3–5, same order | — |
//!
//! This is PyTorch's gate order too (LSTM `i, f, g, o`; GRU `r, z, n`), so PyTorch's
//! `weight_ih_l{k}` of shape `[gates·hidden, input]` is the concatenation of the input matrices
//! in id order; [`Rnn::weights_from_pytorch`] copies gate block by gate block at the offsets
//! cuDNN reports, without assuming the blocks are adjacent.
//!
//! Hidden states are `[layers·directions, batch, out]` and LSTM cell states
//! `[layers·directions, batch, hidden]` (packed, layer-major, forward direction first), where
//! `out` is the projection size for a projected LSTM and the hidden size otherwise. Outputs hold
//! `directions·out` values per step: the forward direction's, then the reverse direction's.
//!
//! ```no_run
//! use cudnn_safe::rnn::{CellMode, Forward, Rnn, SeqDataDesc, SeqLayout};
//! use cudnn_safe::{cuda_context, Cudnn, Workspace};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! // 2-layer LSTM, input 16, hidden 32.
//! let rnn = Rnn::<f32>::builder(CellMode::Lstm, 16, 32).layers(2).build(&cudnn)?;
//! // Three sequences of lengths 5, 3 and 4, padded to 5 steps, sequence-major.
//! let x_d = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 5, 16, &[5, 3, 4], 0.0)?;
//! let y_d = SeqDataDesc::<f32>::new(SeqLayout::SeqMajor, 5, rnn.output_size(), &[5, 3, 4], 0.0)?;
//! let w = stream.clone_htod(&vec![0.01f32; rnn.weight_space_len()]).unwrap();
//! let x = stream.clone_htod(&vec![0.5f32; x_d.span()]).unwrap();
//! let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
//! let mut hy = stream.alloc_zeros::<f32>(rnn.hidden_state_len(3)).unwrap();
//! let mut ws = Workspace::new(stream.clone());
//! rnn.forward_inference(&cudnn, Forward::new(&x_d, &x, &y_d, &mut y, &w).hy(&mut hy), &mut ws)?;
//! # Ok(()) }
//! ```
use std::cell::{RefCell, RefMut};
use std::fmt;
use std::marker::PhantomData;

use cudnn_safe_sys as sys;

use crate::conv::MathType;
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::tensor::TensorDesc;

mod args;
mod builder;
mod data;
pub(crate) mod ffi;
mod ops;
mod params;
mod pytorch;
mod reserve;
mod settings;

pub use args::{BackwardData, BackwardWeights, Forward, ForwardMode, TempSpace, WeightGradMode};
pub use builder::RnnBuilder;
use builder::{Config, DropoutSlot};
pub use data::{SeqDataDesc, SeqLayout};
pub use params::{Gate, ParamKind, WeightParam};
pub use pytorch::PyTorchParam;
pub use reserve::RnnReserve;
pub use settings::{BiasMode, CellMode, Direction, DirectionMode, InputMode, RnnAlgo};

/// The product of a state buffer's dimensions, `usize::MAX` past `usize` or for a negative
/// dimension (a caller's batch can be anything; no buffer is that long, so a launch refuses it).
fn saturating_product(dims: [i64; 3]) -> usize {
    dims.iter()
        .try_fold(1usize, |a, &d| {
            Some(a.saturating_mul(usize::try_from(d).ok()?))
        })
        .unwrap_or(usize::MAX)
}

/// A size handed to cuDNN as an `int`, named `what` in the error: at least 1, at most
/// `i32::MAX`.
fn int_arg(what: &'static str, v: i64) -> Result<i32> {
    if v < 1 {
        return Err(Error::invalid(what, "at least 1", v));
    }
    i32::try_from(v).map_err(|_| Error::Overflow {
        what,
        detail: format!("{v} does not fit cuDNN's 32-bit int"),
    })
}

/// The hidden- and cell-state descriptors for one batch size.
pub(crate) struct StateDescs<T: DataType> {
    batch: i64,
    pub(crate) h: TensorDesc<T>,
    pub(crate) c: TensorDesc<T>,
}

/// A recurrent network: an owned `cudnnRNNDescriptor_t` with its settings, its dropout, its
/// weight-space size and the layout of its weights, for data of type `T` (f32, f64, f16, bf16).
///
/// Build one with [`Rnn::builder`]. Immutable once built; `Send` but not `Sync` (it caches the
/// state descriptors of the last batch size in a cell).
pub struct Rnn<T: DataType> {
    // Declared before the dropout so that it is destroyed first: the RNN descriptor refers to
    // the dropout descriptor.
    raw: ffi::OwnedRnn,
    dropout: DropoutSlot,
    cfg: Config,
    weight_bytes: usize,
    params: Vec<WeightParam>,
    state_descs: RefCell<Option<StateDescs<T>>>,
    _t: PhantomData<fn() -> T>,
}

impl<T: DataType> fmt::Debug for Rnn<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rnn")
            .field("dtype", &T::DTYPE)
            .field("cell", &self.cfg.cell)
            .field("input_size", &self.cfg.input_size)
            .field("hidden_size", &self.cfg.hidden_size)
            .field("proj_size", &self.cfg.proj_size)
            .field("layers", &self.cfg.layers)
            .field("direction", &self.cfg.direction)
            .field("input_mode", &self.cfg.input_mode)
            .field("bias", &self.cfg.bias)
            .field("algo", &self.cfg.algo)
            .field("math", &self.cfg.math)
            .field("math_precision", &self.cfg.math_precision)
            .field("padded_io", &self.cfg.padded_io)
            .field("weight_space_bytes", &self.weight_bytes)
            .finish()
    }
}

impl<T: DataType> Rnn<T> {
    /// A builder for a one-layer, unidirectional network of `cell`s reading `input_size` values
    /// per step with `hidden_size` hidden units, linear input, double bias, no dropout, no
    /// projection, the standard algorithm and padded I/O enabled.
    ///
    /// Sizes are dimensions, `i64` as in [`TensorDesc`] (the getters return
    /// them the same way); [`RnnBuilder::build`] refuses one below 1
    /// ([`Error::InvalidArgument`]) or above cuDNN's `i32::MAX` ([`Error::Overflow`]), naming it.
    pub fn builder(cell: CellMode, input_size: i64, hidden_size: i64) -> RnnBuilder<T> {
        RnnBuilder::new(cell, input_size, hidden_size)
    }

    /// The cell.
    pub fn cell(&self) -> CellMode {
        self.cfg.cell
    }
    /// Uni- or bidirectional.
    pub fn direction(&self) -> DirectionMode {
        self.cfg.direction
    }
    /// 1 or 2.
    pub fn directions(&self) -> i64 {
        self.cfg.direction.count() as i64
    }
    /// Stacked layers.
    pub fn layers(&self) -> i64 {
        i64::from(self.cfg.layers)
    }
    /// Values per step of the input.
    pub fn input_size(&self) -> i64 {
        i64::from(self.cfg.input_size)
    }
    /// Hidden units per layer and direction (the LSTM cell-state width).
    pub fn hidden_size(&self) -> i64 {
        i64::from(self.cfg.hidden_size)
    }
    /// Width of the hidden state and of each direction's output: the projection size of a
    /// projected LSTM, the hidden size otherwise.
    pub fn state_size(&self) -> i64 {
        i64::from(self.cfg.proj_size)
    }
    /// Whether the LSTM projects its hidden state.
    pub fn has_projection(&self) -> bool {
        self.cfg.proj_size < self.cfg.hidden_size
    }
    /// Values per step of the output: `directions · state_size`.
    pub fn output_size(&self) -> i64 {
        self.directions() * self.state_size()
    }
    /// First-layer input mode.
    pub fn input_mode(&self) -> InputMode {
        self.cfg.input_mode
    }
    /// Bias mode.
    pub fn bias_mode(&self) -> BiasMode {
        self.cfg.bias
    }
    /// Recurrence algorithm.
    pub fn algo(&self) -> RnnAlgo {
        self.cfg.algo
    }
    /// Math type.
    pub fn math(&self) -> MathType {
        self.cfg.math
    }
    /// Arithmetic precision (`mathPrec`).
    pub fn math_precision(&self) -> DType {
        self.cfg.math_precision
    }
    /// Whether padded (unpacked) sequence layouts are accepted.
    pub fn padded_io(&self) -> bool {
        self.cfg.padded_io
    }

    /// `[layers · directions, batch, state_size]`: the shape of `hx`, `hy`, `dhx`, `dhy`.
    pub fn hidden_state_dims(&self, batch: i64) -> [i64; 3] {
        [self.layers() * self.directions(), batch, self.state_size()]
    }
    /// Elements of a hidden-state buffer for `batch` sequences (`usize::MAX` when the product
    /// does not fit: no buffer is that long, so a launch refuses it).
    pub fn hidden_state_len(&self, batch: i64) -> usize {
        saturating_product(self.hidden_state_dims(batch))
    }
    /// `[layers · directions, batch, hidden_size]`: the shape of the LSTM's `cx`, `cy`, `dcx`,
    /// `dcy`.
    pub fn cell_state_dims(&self, batch: i64) -> [i64; 3] {
        [self.layers() * self.directions(), batch, self.hidden_size()]
    }
    /// Elements of an LSTM cell-state buffer for `batch` sequences (`usize::MAX` when the
    /// product does not fit).
    pub fn cell_state_len(&self, batch: i64) -> usize {
        saturating_product(self.cell_state_dims(batch))
    }

    /// Bytes of the weight space (`cudnnGetRNNWeightSpaceSize`).
    pub fn weight_space_bytes(&self) -> usize {
        self.weight_bytes
    }
    /// Elements of `T` in the weight space: the exact length of the weight (and weight-gradient)
    /// buffers the launches take.
    pub fn weight_space_len(&self) -> usize {
        self.weight_bytes / T::DTYPE.size()
    }
    /// Every weight matrix and bias, by pseudo-layer (layer-major, forward direction first),
    /// matrices in linear-id order, then biases in linear-id order.
    pub fn weight_params(&self) -> &[WeightParam] {
        &self.params
    }
    /// The parameter of `layer`, `direction`, `kind` and `gate`, if the network has it.
    pub fn param(
        &self,
        layer: usize,
        direction: Direction,
        kind: ParamKind,
        gate: Gate,
    ) -> Option<&WeightParam> {
        self.params.iter().find(|p| {
            p.layer == layer && p.direction == direction && p.kind == kind && p.gate == gate
        })
    }

    /// The raw descriptor (still owned by `self`; must not be modified or destroyed).
    pub fn as_raw(&self) -> sys::cudnnRNNDescriptor_t {
        self.raw.as_ptr()
    }
    /// Process-unique id of this network's descriptor.
    pub(crate) fn id(&self) -> u64 {
        self.raw.id()
    }

    /// The state descriptors for `batch`, created on first use and kept for the last size.
    pub(crate) fn state_descs(&self, batch: i64) -> Result<RefMut<'_, StateDescs<T>>> {
        let mut slot = self.state_descs.borrow_mut();
        let descs = match slot.take() {
            Some(s) if s.batch == batch => s,
            _ => StateDescs {
                batch,
                h: TensorDesc::<T>::nchw_nd(&self.hidden_state_dims(batch))?,
                c: TensorDesc::<T>::nchw_nd(&self.cell_state_dims(batch))?,
            },
        };
        Ok(RefMut::map(slot, |s| s.insert(descs)))
    }
}
