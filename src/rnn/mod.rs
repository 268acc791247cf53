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
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::marker::PhantomData;

use cudarc::driver::DevicePtr;
use cudnn_safe_sys as sys;

use crate::conv::MathType;
use crate::dropout::Dropout;
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::TensorDesc;

mod data;
mod ops;
mod pytorch;

pub use data::{SeqDataDesc, SeqLayout};
pub use ops::{
    BackwardData, BackwardWeights, Forward, ForwardMode, RnnReserve, TempSpace, WeightGradMode,
};
pub use pytorch::PyTorchParam;

/// The C calls of this family and the owners of its descriptors.
pub(crate) mod ffi {
    #![allow(non_snake_case)]
    use std::ffi::{c_int, c_ulonglong, c_void};

    use cudnn_safe_sys as sys;

    crate::raw::raw_fns! {
        fn cudnnCreateRNNDescriptor(desc: *mut sys::cudnnRNNDescriptor_t);
        fn cudnnDestroyRNNDescriptor(desc: sys::cudnnRNNDescriptor_t);
        fn cudnnSetRNNDescriptor_v8(
            desc: sys::cudnnRNNDescriptor_t,
            algo: sys::cudnnRNNAlgo_t,
            cell_mode: sys::cudnnRNNMode_t,
            bias_mode: sys::cudnnRNNBiasMode_t,
            dir_mode: sys::cudnnDirectionMode_t,
            input_mode: sys::cudnnRNNInputMode_t,
            data_type: sys::cudnnDataType_t,
            math_prec: sys::cudnnDataType_t,
            math_type: sys::cudnnMathType_t,
            input_size: i32,
            hidden_size: i32,
            proj_size: i32,
            num_layers: i32,
            dropout: sys::cudnnDropoutDescriptor_t,
            aux_flags: u32,
        );
        fn cudnnCreateRNNDataDescriptor(desc: *mut sys::cudnnRNNDataDescriptor_t);
        fn cudnnDestroyRNNDataDescriptor(desc: sys::cudnnRNNDataDescriptor_t);
        fn cudnnSetRNNDataDescriptor(
            desc: sys::cudnnRNNDataDescriptor_t,
            data_type: sys::cudnnDataType_t,
            layout: sys::cudnnRNNDataLayout_t,
            max_seq_length: c_int,
            batch_size: c_int,
            vector_size: c_int,
            seq_length_array: *const c_int,
            padding_fill: *mut c_void,
        );
        fn cudnnGetRNNWeightSpaceSize(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnRNNDescriptor_t,
            bytes: *mut usize,
        );
        fn cudnnGetRNNWeightParams(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnRNNDescriptor_t,
            pseudo_layer: i32,
            weight_space_size: usize,
            weight_space: *const c_void,
            lin_layer_id: i32,
            m_desc: sys::cudnnTensorDescriptor_t,
            m_addr: *mut *mut c_void,
            b_desc: sys::cudnnTensorDescriptor_t,
            b_addr: *mut *mut c_void,
        );
        fn cudnnGetRNNTempSpaceSizes(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnRNNDescriptor_t,
            mode: sys::cudnnForwardMode_t,
            x_desc: sys::cudnnRNNDataDescriptor_t,
            workspace_bytes: *mut usize,
            reserve_bytes: *mut usize,
        );
        fn cudnnRNNForward(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnRNNDescriptor_t,
            mode: sys::cudnnForwardMode_t,
            dev_seq_lengths: *const i32,
            x_desc: sys::cudnnRNNDataDescriptor_t,
            x: *const c_void,
            y_desc: sys::cudnnRNNDataDescriptor_t,
            y: *mut c_void,
            h_desc: sys::cudnnTensorDescriptor_t,
            hx: *const c_void,
            hy: *mut c_void,
            c_desc: sys::cudnnTensorDescriptor_t,
            cx: *const c_void,
            cy: *mut c_void,
            weight_space_size: usize,
            weight_space: *const c_void,
            workspace_size: usize,
            workspace: *mut c_void,
            reserve_size: usize,
            reserve: *mut c_void,
        );
        fn cudnnRNNBackwardData_v8(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnRNNDescriptor_t,
            dev_seq_lengths: *const i32,
            y_desc: sys::cudnnRNNDataDescriptor_t,
            y: *const c_void,
            dy: *const c_void,
            x_desc: sys::cudnnRNNDataDescriptor_t,
            dx: *mut c_void,
            h_desc: sys::cudnnTensorDescriptor_t,
            hx: *const c_void,
            dhy: *const c_void,
            dhx: *mut c_void,
            c_desc: sys::cudnnTensorDescriptor_t,
            cx: *const c_void,
            dcy: *const c_void,
            dcx: *mut c_void,
            weight_space_size: usize,
            weight_space: *const c_void,
            workspace_size: usize,
            workspace: *mut c_void,
            reserve_size: usize,
            reserve: *mut c_void,
        );
        fn cudnnRNNBackwardWeights_v8(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnRNNDescriptor_t,
            add_grad: sys::cudnnWgradMode_t,
            dev_seq_lengths: *const i32,
            x_desc: sys::cudnnRNNDataDescriptor_t,
            x: *const c_void,
            h_desc: sys::cudnnTensorDescriptor_t,
            hx: *const c_void,
            y_desc: sys::cudnnRNNDataDescriptor_t,
            y: *const c_void,
            weight_space_size: usize,
            dweight_space: *mut c_void,
            workspace_size: usize,
            workspace: *mut c_void,
            reserve_size: usize,
            reserve: *mut c_void,
        );
        fn cudnnGetTensorNdDescriptor(
            desc: sys::cudnnTensorDescriptor_t,
            nb_dims_requested: c_int,
            data_type: *mut sys::cudnnDataType_t,
            nb_dims: *mut c_int,
            dims: *mut c_int,
            strides: *mut c_int,
        );
        fn cudnnCreateDropoutDescriptor(desc: *mut sys::cudnnDropoutDescriptor_t);
        fn cudnnDestroyDropoutDescriptor(desc: sys::cudnnDropoutDescriptor_t);
        fn cudnnSetDropoutDescriptor(
            desc: sys::cudnnDropoutDescriptor_t,
            handle: sys::cudnnHandle_t,
            dropout: f32,
            states: *mut c_void,
            state_bytes: usize,
            seed: c_ulonglong,
        );
    }

    crate::raw::owned_descriptor!(
        /// An owned `cudnnRNNDescriptor_t`.
        OwnedRnn,
        sys::cudnnRNNDescriptor_t,
        cudnnCreateRNNDescriptor,
        cudnnDestroyRNNDescriptor
    );
    crate::raw::owned_descriptor!(
        /// An owned `cudnnRNNDataDescriptor_t`.
        OwnedRnnData,
        sys::cudnnRNNDataDescriptor_t,
        cudnnCreateRNNDataDescriptor,
        cudnnDestroyRNNDataDescriptor
    );
    crate::raw::owned_descriptor!(
        /// An owned `cudnnDropoutDescriptor_t` set to probability 0 (no states).
        OwnedNoDropout,
        sys::cudnnDropoutDescriptor_t,
        cudnnCreateDropoutDescriptor,
        cudnnDestroyDropoutDescriptor
    );
}

/// The recurrent cell (`cudnnRNNMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CellMode {
    /// `h' = relu(W·x + b_W + R·h + b_R)` (PyTorch `nn.RNN(nonlinearity="relu")`).
    Relu,
    /// `h' = tanh(W·x + b_W + R·h + b_R)` (PyTorch `nn.RNN`).
    Tanh,
    /// Long short-term memory without peepholes (PyTorch `nn.LSTM`), gates `i, f, g, o`.
    Lstm,
    /// Gated recurrent unit (PyTorch `nn.GRU`), gates `r, z, n`, with
    /// `n = tanh(W_n·x + b_Wn + r ⊙ (R_n·h + b_Rn))`.
    Gru,
}

impl CellMode {
    fn raw(self) -> sys::cudnnRNNMode_t {
        match self {
            CellMode::Relu => sys::cudnnRNNMode_t::CUDNN_RNN_RELU,
            CellMode::Tanh => sys::cudnnRNNMode_t::CUDNN_RNN_TANH,
            CellMode::Lstm => sys::cudnnRNNMode_t::CUDNN_LSTM,
            CellMode::Gru => sys::cudnnRNNMode_t::CUDNN_GRU,
        }
    }

    /// Gates per cell: 1 for the plain RNNs, 4 for LSTM, 3 for GRU.
    pub fn gate_count(self) -> usize {
        match self {
            CellMode::Relu | CellMode::Tanh => 1,
            CellMode::Lstm => 4,
            CellMode::Gru => 3,
        }
    }

    /// The gate of linear-layer index `g` (`0..gate_count()`), in cuDNN's (and PyTorch's) order.
    pub fn gate(self, g: usize) -> Option<Gate> {
        let gates: &[Gate] = match self {
            CellMode::Relu | CellMode::Tanh => &[Gate::Hidden],
            CellMode::Lstm => &[Gate::Input, Gate::Forget, Gate::Cell, Gate::Output],
            CellMode::Gru => &[Gate::Reset, Gate::Update, Gate::New],
        };
        gates.get(g).copied()
    }

    /// Short name (`"relu"`, `"tanh"`, `"lstm"`, `"gru"`).
    pub fn name(self) -> &'static str {
        match self {
            CellMode::Relu => "relu",
            CellMode::Tanh => "tanh",
            CellMode::Lstm => "lstm",
            CellMode::Gru => "gru",
        }
    }
}

/// One direction or both (`cudnnDirectionMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DirectionMode {
    /// Left to right only. The default.
    #[default]
    Unidirectional,
    /// Both directions; their outputs are concatenated per step (forward first).
    Bidirectional,
}

impl DirectionMode {
    fn raw(self) -> sys::cudnnDirectionMode_t {
        match self {
            DirectionMode::Unidirectional => sys::cudnnDirectionMode_t::CUDNN_UNIDIRECTIONAL,
            DirectionMode::Bidirectional => sys::cudnnDirectionMode_t::CUDNN_BIDIRECTIONAL,
        }
    }
    /// 1 or 2.
    pub fn count(self) -> usize {
        match self {
            DirectionMode::Unidirectional => 1,
            DirectionMode::Bidirectional => 2,
        }
    }
}

/// Which way a pseudo-layer runs through the sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// From the first step to the last.
    Forward,
    /// From each sequence's last step to its first (PyTorch's `_reverse` parameters).
    Reverse,
}

/// What the first layer does with its input (`cudnnRNNInputMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InputMode {
    /// A learned matrix `W` maps the input to the gates (PyTorch's only mode). The default.
    #[default]
    Linear,
    /// No input matrix in the first layer: the input is added as is, so its width must equal
    /// the hidden size.
    Skip,
}

impl InputMode {
    fn raw(self) -> sys::cudnnRNNInputMode_t {
        match self {
            InputMode::Linear => sys::cudnnRNNInputMode_t::CUDNN_LINEAR_INPUT,
            InputMode::Skip => sys::cudnnRNNInputMode_t::CUDNN_SKIP_INPUT,
        }
    }
}

/// Which bias vectors the cell formulas use (`cudnnRNNBiasMode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BiasMode {
    /// No biases (PyTorch `bias=False`).
    NoBias,
    /// One bias on the input GEMM (`b_W` only).
    SingleInput,
    /// Both `b_W` and `b_R` (PyTorch's `bias_ih` and `bias_hh`). The default.
    #[default]
    Double,
    /// One bias on the recurrent GEMM (`b_R` only).
    SingleRecurrent,
}

impl BiasMode {
    fn raw(self) -> sys::cudnnRNNBiasMode_t {
        match self {
            BiasMode::NoBias => sys::cudnnRNNBiasMode_t::CUDNN_RNN_NO_BIAS,
            BiasMode::SingleInput => sys::cudnnRNNBiasMode_t::CUDNN_RNN_SINGLE_INP_BIAS,
            BiasMode::Double => sys::cudnnRNNBiasMode_t::CUDNN_RNN_DOUBLE_BIAS,
            BiasMode::SingleRecurrent => sys::cudnnRNNBiasMode_t::CUDNN_RNN_SINGLE_REC_BIAS,
        }
    }
    fn has_input_bias(self) -> bool {
        matches!(self, BiasMode::SingleInput | BiasMode::Double)
    }
    fn has_recurrent_bias(self) -> bool {
        matches!(self, BiasMode::SingleRecurrent | BiasMode::Double)
    }
}

/// How cuDNN schedules the recurrence (`cudnnRNNAlgo_t`).
///
/// The persistent kernels are faster for some small problems (PyTorch picks
/// [`RnnAlgo::PersistStaticSmallH`] for fp16/fp32 cells of hidden size ≤ 192 and padded input);
/// they do not take projections, and cuDNN rejects the cases they cannot run at the first launch
/// or workspace query. `CUDNN_RNN_ALGO_PERSIST_DYNAMIC`, which needs a per-batch-size build
/// step, is not offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RnnAlgo {
    /// The general algorithm. The default.
    #[default]
    Standard,
    /// Persistent kernels keeping the recurrent weights on chip.
    PersistStatic,
    /// Persistent kernels specialised for small hidden sizes.
    PersistStaticSmallH,
}

impl RnnAlgo {
    fn raw(self) -> sys::cudnnRNNAlgo_t {
        match self {
            RnnAlgo::Standard => sys::cudnnRNNAlgo_t::CUDNN_RNN_ALGO_STANDARD,
            RnnAlgo::PersistStatic => sys::cudnnRNNAlgo_t::CUDNN_RNN_ALGO_PERSIST_STATIC,
            RnnAlgo::PersistStaticSmallH => {
                sys::cudnnRNNAlgo_t::CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H
            }
        }
    }
}

/// A gate of a recurrent cell (or the plain RNN's single transform, or the LSTM projection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Gate {
    /// The only transform of a ReLU / tanh RNN.
    Hidden,
    /// LSTM input gate `i`.
    Input,
    /// LSTM forget gate `f`.
    Forget,
    /// LSTM cell candidate `g` (cuDNN's "new memory gate" `c'`).
    Cell,
    /// LSTM output gate `o`.
    Output,
    /// GRU reset gate `r`.
    Reset,
    /// GRU update gate `z`.
    Update,
    /// GRU new gate `n` (cuDNN's `h'`).
    New,
    /// The LSTM projection `h_proj = W_hr·h` (not a gate; linear-layer id 8).
    Projection,
}

/// Which kind of parameter a [`WeightParam`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParamKind {
    /// A matrix applied to the layer's input (`W`, PyTorch `weight_ih`).
    InputWeight,
    /// A matrix applied to the previous hidden state (`R`, PyTorch `weight_hh`).
    RecurrentWeight,
    /// A bias of the input GEMM (`b_W`, PyTorch `bias_ih`).
    InputBias,
    /// A bias of the recurrent GEMM (`b_R`, PyTorch `bias_hh`).
    RecurrentBias,
    /// The LSTM projection matrix (PyTorch `weight_hr`).
    ProjectionWeight,
}

impl ParamKind {
    /// Whether this is a bias vector.
    pub fn is_bias(self) -> bool {
        matches!(self, ParamKind::InputBias | ParamKind::RecurrentBias)
    }
}

/// Where one weight matrix or bias vector lives in the weight space
/// (from `cudnnGetRNNWeightParams`).
///
/// A matrix is `rows × cols`, row-major (`rows` = gate width, `cols` = input width); a bias is
/// a vector of `rows` elements (`cols == 1`). `offset` counts elements of `T` from the start of
/// the weight space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WeightParam {
    /// Physical layer (0 is the one reading the input).
    pub layer: usize,
    /// Direction of the pseudo-layer.
    pub direction: Direction,
    /// cuDNN's pseudo-layer index: `layer · directions + (0 forward | 1 reverse)`.
    pub pseudo_layer: usize,
    /// cuDNN's linear-layer id (see the [module docs](self)).
    pub lin_id: usize,
    /// Matrix or bias, input or recurrent.
    pub kind: ParamKind,
    /// The gate it belongs to.
    pub gate: Gate,
    /// Offset in elements from the start of the weight space.
    pub offset: usize,
    /// Rows of the matrix, or the bias length.
    pub rows: usize,
    /// Columns of the matrix (1 for a bias).
    pub cols: usize,
}

impl WeightParam {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }
    /// Whether it holds no element (never the case for a parameter cuDNN reports).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The elements of the weight space it occupies.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// What dropout the RNN applies between layers: the caller's, or cuDNN's "none" (probability
/// 0 without states, as PyTorch sets it up when it does not train).
///
/// The caller's dropout sits in a cell because a training forward draws from (writes) its
/// generator states, which takes the states' write guard while the network is shared.
enum DropoutSlot {
    User(RefCell<Dropout>),
    Off(ffi::OwnedNoDropout),
}

impl DropoutSlot {
    fn as_raw(&self) -> sys::cudnnDropoutDescriptor_t {
        match self {
            DropoutSlot::User(d) => d.borrow().as_raw(),
            DropoutSlot::Off(d) => d.as_ptr(),
        }
    }
}

/// Builder for an [`Rnn`]: plain data (plus the dropout it will own); [`RnnBuilder::build`]
/// validates and asks cuDNN for the weight layout.
#[must_use]
pub struct RnnBuilder<T: DataType> {
    cell: CellMode,
    input_size: i64,
    hidden_size: i64,
    layers: i64,
    direction: DirectionMode,
    proj_size: Option<i64>,
    input_mode: InputMode,
    bias: BiasMode,
    algo: RnnAlgo,
    math: Option<MathType>,
    math_precision: Option<DType>,
    padded_io: bool,
    dropout: Option<Dropout>,
    _t: PhantomData<fn() -> T>,
}

impl<T: DataType> fmt::Debug for RnnBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RnnBuilder")
            .field("dtype", &T::DTYPE)
            .field("cell", &self.cell)
            .field("input_size", &self.input_size)
            .field("hidden_size", &self.hidden_size)
            .field("layers", &self.layers)
            .field("direction", &self.direction)
            .field("proj_size", &self.proj_size)
            .field("input_mode", &self.input_mode)
            .field("bias", &self.bias)
            .field("algo", &self.algo)
            .field("math", &self.math)
            .field("math_precision", &self.math_precision)
            .field("padded_io", &self.padded_io)
            .field("dropout", &self.dropout.is_some())
            .finish()
    }
}

/// The checked settings of an RNN (what `cudnnSetRNNDescriptor_v8` receives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Config {
    cell: CellMode,
    input_size: i32,
    hidden_size: i32,
    proj_size: i32,
    layers: i32,
    direction: DirectionMode,
    input_mode: InputMode,
    bias: BiasMode,
    algo: RnnAlgo,
    math: MathType,
    math_precision: DType,
    padded_io: bool,
}

/// The product of a state buffer's dimensions, `usize::MAX` past `usize` (a caller's batch can
/// be anything).
fn saturating_product(dims: [usize; 3]) -> usize {
    dims.iter().fold(1usize, |a, &d| a.saturating_mul(d))
}

fn size_arg(what: &'static str, v: i64) -> Result<i32> {
    if v < 1 {
        return Err(Error::invalid(what, "at least 1", v));
    }
    i32::try_from(v).map_err(|_| Error::Overflow {
        what,
        detail: format!("{v} does not fit cuDNN's 32-bit int"),
    })
}

impl<T: DataType> RnnBuilder<T> {
    /// Number of stacked layers (default 1).
    pub fn layers(mut self, layers: i64) -> Self {
        self.layers = layers;
        self
    }
    /// Uni- (default) or bidirectional.
    pub fn direction(mut self, direction: DirectionMode) -> Self {
        self.direction = direction;
        self
    }
    /// Shorthand for `direction(DirectionMode::Bidirectional)`.
    pub fn bidirectional(self) -> Self {
        self.direction(DirectionMode::Bidirectional)
    }
    /// LSTM only: project the hidden state to `proj_size` (< hidden size) values, as PyTorch's
    /// `nn.LSTM(proj_size=...)`. Equal to the hidden size means no projection.
    pub fn proj_size(mut self, proj_size: i64) -> Self {
        self.proj_size = Some(proj_size);
        self
    }
    /// Linear (default) or skip input in the first layer.
    pub fn input_mode(mut self, mode: InputMode) -> Self {
        self.input_mode = mode;
        self
    }
    /// Bias vectors used by the cell formulas (default [`BiasMode::Double`], as PyTorch).
    pub fn bias(mut self, bias: BiasMode) -> Self {
        self.bias = bias;
        self
    }
    /// Recurrence algorithm (default [`RnnAlgo::Standard`]).
    pub fn algo(mut self, algo: RnnAlgo) -> Self {
        self.algo = algo;
        self
    }
    /// Math type. Default: [`MathType::TensorOp`] for f16/bf16 data and [`MathType::Default`]
    /// otherwise, as PyTorch (for f32 data `Default` lets cuDNN use TF32 tensor cores; use
    /// [`MathType::Fma`] for strict fp32).
    pub fn math(mut self, math: MathType) -> Self {
        self.math = Some(math);
        self
    }
    /// Precision of the internal arithmetic (`mathPrec`). Default: f64 for f64 data, f32
    /// otherwise (PyTorch's choice for f16/bf16). f16 data may also compute in f16.
    pub fn math_precision(mut self, precision: DType) -> Self {
        self.math_precision = Some(precision);
        self
    }
    /// Whether padded (unpacked) sequence layouts are allowed (`CUDNN_RNN_PADDED_IO_ENABLED`,
    /// default `true`). PyTorch disables it for packed input; with it disabled only
    /// [`SeqLayout::Packed`] data is accepted.
    pub fn padded_io(mut self, enabled: bool) -> Self {
        self.padded_io = enabled;
        self
    }
    /// Dropout applied to the outputs of every layer but the last, in training forward passes.
    /// The RNN owns it from now on. Without one the RNN uses no dropout.
    pub fn dropout(mut self, dropout: Dropout) -> Self {
        self.dropout = Some(dropout);
        self
    }

    /// Every check that needs neither a GPU nor cuDNN, returning the settings handed to cuDNN.
    fn config(&self) -> Result<Config> {
        if !matches!(T::DTYPE, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
            return Err(Error::UnsupportedDataType {
                op: "RNN",
                detail: format!("{} (cuDNN RNNs take f32, f64, f16 or bf16)", T::DTYPE),
            });
        }
        let input_size = size_arg("RNN input size", self.input_size)?;
        let hidden_size = size_arg("RNN hidden size", self.hidden_size)?;
        let layers = size_arg("RNN layer count", self.layers)?;
        let proj_size = match self.proj_size {
            None => hidden_size,
            Some(p) => {
                let p = size_arg("LSTM projection size", p)?;
                if p > hidden_size {
                    return Err(Error::invalid(
                        "LSTM projection size",
                        format!("at most the hidden size {hidden_size}"),
                        p,
                    ));
                }
                if p < hidden_size && self.cell != CellMode::Lstm {
                    return Err(Error::invalid(
                        "RNN projection",
                        "a projection only on LSTM cells",
                        format!("projection size {p} on a {} cell", self.cell.name()),
                    ));
                }
                if p < hidden_size && self.algo != RnnAlgo::Standard {
                    return Err(Error::invalid(
                        "RNN algorithm",
                        "RnnAlgo::Standard for a projected LSTM (cuDNN's rule)",
                        format!("{:?}", self.algo),
                    ));
                }
                p
            }
        };
        if self.input_mode == InputMode::Skip && input_size != hidden_size {
            return Err(Error::invalid(
                "RNN skip input",
                format!("an input size equal to the hidden size {hidden_size}"),
                format!("input size {input_size}"),
            ));
        }
        let math_precision = match (T::DTYPE, self.math_precision) {
            (DType::F64, None | Some(DType::F64)) => DType::F64,
            (DType::F32 | DType::BF16, None | Some(DType::F32)) => DType::F32,
            (DType::F16, None | Some(DType::F32)) => DType::F32,
            (DType::F16, Some(DType::F16)) => DType::F16,
            (d, Some(p)) => {
                return Err(Error::UnsupportedDataType {
                    op: "RNN math precision",
                    detail: format!(
                        "{p} arithmetic on {d} data (cuDNN takes f64 for f64, f32 for f32 and \
                         bf16, f32 or f16 for f16)"
                    ),
                })
            }
            (d, None) => unreachable!("data type {d} was checked above"),
        };
        let math = self.math.unwrap_or(match T::DTYPE {
            DType::F16 | DType::BF16 => MathType::TensorOp,
            _ => MathType::Default,
        });
        Ok(Config {
            cell: self.cell,
            input_size,
            hidden_size,
            proj_size,
            layers,
            direction: self.direction,
            input_mode: self.input_mode,
            bias: self.bias,
            algo: self.algo,
            math,
            math_precision,
            padded_io: self.padded_io,
        })
    }

    /// Checks the settings without a GPU: this crate's rules, then cuDNN's own validation of
    /// the descriptor (on a throw-away descriptor without dropout). [`build`](Self::build) runs
    /// the same checks.
    pub fn validate(&self) -> Result<()> {
        let cfg = self.config()?;
        let lib = raw::lib()?;
        let desc = ffi::OwnedRnn::new(lib)?;
        set_descriptor::<T>(lib, &desc, &cfg, std::ptr::null_mut())
    }

    /// Validates, creates the descriptor, and reads the weight-space size and the place of each
    /// weight matrix and bias (which needs the handle, hence the GPU).
    #[doc(alias = "cudnnCreateRNNDescriptor")]
    #[doc(alias = "cudnnSetRNNDescriptor_v8")]
    #[doc(alias = "cudnnGetRNNWeightSpaceSize")]
    #[doc(alias = "cudnnGetRNNWeightParams")]
    pub fn build(self, cudnn: &Cudnn) -> Result<Rnn<T>> {
        let cfg = self.config()?;
        let lib = cudnn.lib();
        cudnn.bind()?;
        let dropout = match self.dropout {
            Some(d) => {
                if **d.context() != **cudnn.context() {
                    return Err(Error::ForeignContext {
                        name: "dropout",
                        expected: cudnn.context().ordinal(),
                        found: d.context().ordinal(),
                    });
                }
                DropoutSlot::User(RefCell::new(d))
            }
            None => {
                let d = ffi::OwnedNoDropout::new(lib)?;
                // SAFETY: live descriptor and handle; probability 0 with no state buffer (null,
                // 0 bytes) is the documented "no dropout" setup (PyTorch's `set_no_dropout`):
                // nothing is read or written through the null pointer.
                unsafe {
                    ffi::cudnnSetDropoutDescriptor(
                        lib,
                        d.as_ptr(),
                        cudnn.as_raw(),
                        0.0,
                        std::ptr::null_mut(),
                        0,
                        0,
                    )
                }?;
                DropoutSlot::Off(d)
            }
        };
        let desc = ffi::OwnedRnn::new(lib)?;
        set_descriptor::<T>(lib, &desc, &cfg, dropout.as_raw())?;
        let mut bytes = 0usize;
        // SAFETY: live handle and descriptor; a valid out-pointer.
        unsafe { ffi::cudnnGetRNNWeightSpaceSize(lib, cudnn.as_raw(), desc.as_ptr(), &mut bytes) }?;
        let elem = T::DTYPE.size();
        if bytes == 0 || bytes % elem != 0 || bytes > crate::MAX_WORKSPACE_BYTES {
            return Err(Error::invalid(
                "RNN weight-space size reported by cuDNN",
                format!("a positive multiple of {elem} bytes"),
                format!("{bytes} bytes"),
            ));
        }
        let params = query_params::<T>(cudnn, &desc, &cfg, bytes)?;
        Ok(Rnn {
            raw: desc,
            dropout,
            cfg,
            weight_bytes: bytes,
            params,
            state_descs: RefCell::new(None),
            _t: PhantomData,
        })
    }
}

/// `cudnnSetRNNDescriptor_v8` with the checked settings.
fn set_descriptor<T: DataType>(
    lib: &'static sys::Library,
    desc: &ffi::OwnedRnn,
    cfg: &Config,
    dropout: sys::cudnnDropoutDescriptor_t,
) -> Result<()> {
    let aux = if cfg.padded_io {
        sys::CUDNN_RNN_PADDED_IO_ENABLED
    } else {
        sys::CUDNN_RNN_PADDED_IO_DISABLED
    };
    // SAFETY: live RNN descriptor; every enum is a valid value; sizes are validated positive
    // `int`s; the dropout descriptor is live and outlives the RNN descriptor (the `Rnn` owns it
    // and drops it last), or null on the throw-away descriptor of `validate`, which cuDNN
    // accepts and which is never used for a launch.
    unsafe {
        ffi::cudnnSetRNNDescriptor_v8(
            lib,
            desc.as_ptr(),
            cfg.algo.raw(),
            cfg.cell.raw(),
            cfg.bias.raw(),
            cfg.direction.raw(),
            cfg.input_mode.raw(),
            T::DTYPE.raw(),
            cfg.math_precision.raw(),
            cfg.math.raw(),
            cfg.input_size,
            cfg.hidden_size,
            cfg.proj_size,
            cfg.layers,
            dropout,
            aux,
        )
    }
}

/// Number of elements a tensor descriptor cuDNN filled in describes (0 for an empty one).
fn described_elements(lib: &'static sys::Library, desc: &raw::OwnedTensor) -> Result<usize> {
    let mut dt = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let mut nb: c_int = 0;
    let mut dims = [0 as c_int; crate::tensor::MAX_DIMS];
    let mut strides = [0 as c_int; crate::tensor::MAX_DIMS];
    // SAFETY: live descriptor; `dims` and `strides` hold the `MAX_DIMS` entries requested.
    unsafe {
        ffi::cudnnGetTensorNdDescriptor(
            lib,
            desc.as_ptr(),
            dims.len() as c_int,
            &mut dt,
            &mut nb,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
        )
    }?;
    let nb = (nb.max(0) as usize).min(dims.len());
    if nb == 0 {
        return Ok(0);
    }
    Ok(dims[..nb]
        .iter()
        .map(|&d| d.max(0) as usize)
        .product::<usize>())
}

/// Asks cuDNN where each weight matrix and bias lives, against a scratch weight space of the
/// right size (cuDNN computes addresses inside the buffer it is given; it reads nothing).
fn query_params<T: DataType>(
    cudnn: &Cudnn,
    desc: &ffi::OwnedRnn,
    cfg: &Config,
    bytes: usize,
) -> Result<Vec<WeightParam>> {
    let lib = cudnn.lib();
    let stream = cudnn.stream();
    let space = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| Error::driver("allocating a scratch RNN weight space", e))?;
    let (base, _guard) = space.device_ptr(stream);
    let elem = T::DTYPE.size();
    let m_desc = raw::OwnedTensor::new(lib)?;
    let dirs = cfg.direction.count();
    let gates = cfg.cell.gate_count();
    let (hidden, out) = (cfg.hidden_size as usize, cfg.proj_size as usize);
    let projected = out < hidden;
    let mut params = Vec::new();

    // Reads one parameter: `Ok(None)` when cuDNN reports no such parameter.
    let query = |pseudo: usize, lin: usize, bias: bool| -> Result<Option<(usize, usize)>> {
        let mut addr: *mut c_void = std::ptr::null_mut();
        let (md, ma, bd, ba): (
            sys::cudnnTensorDescriptor_t,
            *mut *mut c_void,
            sys::cudnnTensorDescriptor_t,
            *mut *mut c_void,
        ) = if bias {
            (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                m_desc.as_ptr(),
                &mut addr as *mut *mut c_void,
            )
        } else {
            (
                m_desc.as_ptr(),
                &mut addr as *mut *mut c_void,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        // SAFETY: live handle, RNN and tensor descriptors; `base` addresses `bytes` bytes of
        // device memory that stays allocated (and is only used for address arithmetic by this
        // host function); the out-pointers are valid, the unused pair is null as documented
        // (PyTorch queries matrices and biases the same way).
        unsafe {
            ffi::cudnnGetRNNWeightParams(
                lib,
                cudnn.as_raw(),
                desc.as_ptr(),
                pseudo as i32,
                bytes,
                base as *const c_void,
                lin as i32,
                md,
                ma,
                bd,
                ba,
            )
        }?;
        if addr.is_null() {
            return Ok(None);
        }
        // An absent parameter may also come back as an empty descriptor.
        let n = described_elements(lib, &m_desc)?;
        if n == 0 {
            return Ok(None);
        }
        let off = (addr as u64).checked_sub(base).map(|o| o as usize);
        match off {
            Some(o) if o % elem == 0 && o + n * elem <= bytes => Ok(Some((o / elem, n))),
            _ => Err(Error::invalid(
                "RNN weight parameter reported by cuDNN",
                format!("{} elements inside the {bytes}-byte weight space", n),
                format!(
                    "pseudo-layer {pseudo}, linear id {lin}, address offset {:?}",
                    (addr as u64).checked_sub(base)
                ),
            )),
        }
    };

    for pseudo in 0..cfg.layers as usize * dirs {
        let layer = pseudo / dirs;
        let direction = if pseudo % dirs == 0 {
            Direction::Forward
        } else {
            Direction::Reverse
        };
        let in_cols = if layer == 0 {
            cfg.input_size as usize
        } else {
            dirs * out
        };
        let mut matrices: Vec<(usize, ParamKind, Gate, usize, usize)> = Vec::new();
        if !(layer == 0 && cfg.input_mode == InputMode::Skip) {
            for g in 0..gates {
                let gate = cfg.cell.gate(g).expect("gate index in range");
                matrices.push((g, ParamKind::InputWeight, gate, hidden, in_cols));
            }
        }
        for g in 0..gates {
            let gate = cfg.cell.gate(g).expect("gate index in range");
            matrices.push((gates + g, ParamKind::RecurrentWeight, gate, hidden, out));
        }
        if projected {
            matrices.push((
                2 * gates,
                ParamKind::ProjectionWeight,
                Gate::Projection,
                out,
                hidden,
            ));
        }
        for (lin, kind, gate, rows, cols) in matrices {
            let Some((offset, n)) = query(pseudo, lin, false)? else {
                return Err(Error::invalid(
                    "RNN weight layout reported by cuDNN",
                    format!("a {rows}×{cols} matrix for linear id {lin}"),
                    format!("none for pseudo-layer {pseudo}"),
                ));
            };
            if n != rows * cols {
                return Err(Error::invalid(
                    "RNN weight layout reported by cuDNN",
                    format!("a {rows}×{cols} matrix for linear id {lin}"),
                    format!("{n} elements for pseudo-layer {pseudo}"),
                ));
            }
            params.push(WeightParam {
                layer,
                direction,
                pseudo_layer: pseudo,
                lin_id: lin,
                kind,
                gate,
                offset,
                rows,
                cols,
            });
        }
        if cfg.bias != BiasMode::NoBias {
            // Biases are looked up for every id and kept where cuDNN has one, so the single-bias
            // modes are described by cuDNN itself; the count is checked below.
            let mut found = 0;
            for lin in 0..2 * gates {
                let present = match query(pseudo, lin, true) {
                    Ok(p) => p,
                    Err(Error::Cudnn { .. }) => None,
                    Err(e) => return Err(e),
                };
                let Some((offset, n)) = present else { continue };
                if n != hidden {
                    return Err(Error::invalid(
                        "RNN bias layout reported by cuDNN",
                        format!("{hidden} elements for linear id {lin}"),
                        format!("{n} for pseudo-layer {pseudo}"),
                    ));
                }
                let kind = if lin < gates {
                    ParamKind::InputBias
                } else {
                    ParamKind::RecurrentBias
                };
                params.push(WeightParam {
                    layer,
                    direction,
                    pseudo_layer: pseudo,
                    lin_id: lin,
                    kind,
                    gate: cfg.cell.gate(lin % gates).expect("gate index in range"),
                    offset,
                    rows: hidden,
                    cols: 1,
                });
                found += 1;
            }
            let expected = gates
                * (usize::from(cfg.bias.has_input_bias())
                    + usize::from(cfg.bias.has_recurrent_bias()));
            // Without an input matrix (skip input), the first layer may or may not keep its
            // input biases; either is described faithfully by what cuDNN reports.
            let without_input = expected - gates * usize::from(cfg.bias.has_input_bias());
            let skipped = layer == 0 && cfg.input_mode == InputMode::Skip;
            if found != expected && !(skipped && found == without_input) {
                return Err(Error::invalid(
                    "RNN bias layout reported by cuDNN",
                    format!(
                        "{expected} bias vectors per pseudo-layer for {:?}",
                        cfg.bias
                    ),
                    format!("{found} for pseudo-layer {pseudo}"),
                ));
            }
        }
    }
    Ok(params)
}

/// The hidden- and cell-state descriptors for one batch size.
pub(crate) struct StateDescs<T: DataType> {
    batch: usize,
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
    pub fn builder(cell: CellMode, input_size: i64, hidden_size: i64) -> RnnBuilder<T> {
        RnnBuilder {
            cell,
            input_size,
            hidden_size,
            layers: 1,
            direction: DirectionMode::Unidirectional,
            proj_size: None,
            input_mode: InputMode::Linear,
            bias: BiasMode::Double,
            algo: RnnAlgo::Standard,
            math: None,
            math_precision: None,
            padded_io: true,
            dropout: None,
            _t: PhantomData,
        }
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
    pub fn directions(&self) -> usize {
        self.cfg.direction.count()
    }
    /// Stacked layers.
    pub fn layers(&self) -> usize {
        self.cfg.layers as usize
    }
    /// Values per step of the input.
    pub fn input_size(&self) -> usize {
        self.cfg.input_size as usize
    }
    /// Hidden units per layer and direction (the LSTM cell-state width).
    pub fn hidden_size(&self) -> usize {
        self.cfg.hidden_size as usize
    }
    /// Width of the hidden state and of each direction's output: the projection size of a
    /// projected LSTM, the hidden size otherwise.
    pub fn state_size(&self) -> usize {
        self.cfg.proj_size as usize
    }
    /// Whether the LSTM projects its hidden state.
    pub fn has_projection(&self) -> bool {
        self.cfg.proj_size < self.cfg.hidden_size
    }
    /// Values per step of the output: `directions · state_size`.
    pub fn output_size(&self) -> usize {
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
    pub fn hidden_state_dims(&self, batch: usize) -> [usize; 3] {
        [self.layers() * self.directions(), batch, self.state_size()]
    }
    /// Elements of a hidden-state buffer for `batch` sequences (`usize::MAX` when the product
    /// does not fit: no buffer is that long, so a launch refuses it).
    pub fn hidden_state_len(&self, batch: usize) -> usize {
        saturating_product(self.hidden_state_dims(batch))
    }
    /// `[layers · directions, batch, hidden_size]`: the shape of the LSTM's `cx`, `cy`, `dcx`,
    /// `dcy`.
    pub fn cell_state_dims(&self, batch: usize) -> [usize; 3] {
        [self.layers() * self.directions(), batch, self.hidden_size()]
    }
    /// Elements of an LSTM cell-state buffer for `batch` sequences (`usize::MAX` when the
    /// product does not fit).
    pub fn cell_state_len(&self, batch: usize) -> usize {
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
    pub(crate) fn state_descs(&self, batch: usize) -> Result<std::cell::Ref<'_, StateDescs<T>>> {
        let fresh = !matches!(&*self.state_descs.borrow(), Some(s) if s.batch == batch);
        if fresh {
            let dims = |d: [usize; 3]| d.map(|v| v as i64);
            let h = TensorDesc::<T>::nchw_nd_exact(&dims(self.hidden_state_dims(batch)))?;
            let c = TensorDesc::<T>::nchw_nd_exact(&dims(self.cell_state_dims(batch)))?;
            *self.state_descs.borrow_mut() = Some(StateDescs { batch, h, c });
        }
        Ok(std::cell::Ref::map(self.state_descs.borrow(), |s| {
            s.as_ref().expect("state descriptors were just set")
        }))
    }
}
