//! The network's settings: cell, direction, input and bias modes, algorithm.
use cudnn_safe_sys as sys;

use super::Gate;

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
    pub(super) fn raw(self) -> sys::cudnnRNNMode_t {
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
    pub(super) fn raw(self) -> sys::cudnnDirectionMode_t {
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
    pub(super) fn raw(self) -> sys::cudnnRNNInputMode_t {
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
    pub(super) fn raw(self) -> sys::cudnnRNNBiasMode_t {
        match self {
            BiasMode::NoBias => sys::cudnnRNNBiasMode_t::CUDNN_RNN_NO_BIAS,
            BiasMode::SingleInput => sys::cudnnRNNBiasMode_t::CUDNN_RNN_SINGLE_INP_BIAS,
            BiasMode::Double => sys::cudnnRNNBiasMode_t::CUDNN_RNN_DOUBLE_BIAS,
            BiasMode::SingleRecurrent => sys::cudnnRNNBiasMode_t::CUDNN_RNN_SINGLE_REC_BIAS,
        }
    }
    pub(super) fn has_input_bias(self) -> bool {
        matches!(self, BiasMode::SingleInput | BiasMode::Double)
    }
    pub(super) fn has_recurrent_bias(self) -> bool {
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
    pub(super) fn raw(self) -> sys::cudnnRNNAlgo_t {
        match self {
            RnnAlgo::Standard => sys::cudnnRNNAlgo_t::CUDNN_RNN_ALGO_STANDARD,
            RnnAlgo::PersistStatic => sys::cudnnRNNAlgo_t::CUDNN_RNN_ALGO_PERSIST_STATIC,
            RnnAlgo::PersistStaticSmallH => {
                sys::cudnnRNNAlgo_t::CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H
            }
        }
    }
}
