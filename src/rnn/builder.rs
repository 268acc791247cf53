//! [`RnnBuilder`]: the checked settings of a network, its dropout, and the descriptor build.
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use cudnn_safe_sys as sys;

use super::int_arg;
use super::params::query_params;
use super::{ffi, BiasMode, CellMode, DirectionMode, InputMode, Rnn, RnnAlgo};
use crate::conv::MathType;
use crate::dropout::{Dropout, NoDropout};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;

/// What dropout the RNN applies between layers: the caller's, or cuDNN's "none" (probability
/// 0 without states, as PyTorch sets it up when it does not train).
///
/// The caller's dropout sits in a cell because a training forward draws from (writes) its
/// generator states, which takes the states' write guard while the network is shared.
pub(super) enum DropoutSlot {
    User(RefCell<Dropout>),
    Off(NoDropout),
}

impl DropoutSlot {
    pub(super) fn as_raw(&self) -> sys::cudnnDropoutDescriptor_t {
        match self {
            DropoutSlot::User(d) => d.borrow().as_raw(),
            DropoutSlot::Off(d) => d.as_raw(),
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
pub(super) struct Config {
    pub(super) cell: CellMode,
    pub(super) input_size: i32,
    pub(super) hidden_size: i32,
    pub(super) proj_size: i32,
    pub(super) layers: i32,
    pub(super) direction: DirectionMode,
    pub(super) input_mode: InputMode,
    pub(super) bias: BiasMode,
    pub(super) algo: RnnAlgo,
    pub(super) math: MathType,
    pub(super) math_precision: DType,
    pub(super) padded_io: bool,
}

/// By-value builder setters: `set` stores the value, `some` stores `Some(value)`.
macro_rules! setters {
    ($($(#[$m:meta])* $kind:ident $name:ident: $ty:ty;)*) => {
        $(setters!(@one $(#[$m])* $kind $name: $ty);)*
    };
    (@one $(#[$m:meta])* set $name:ident: $ty:ty) => {
        $(#[$m])*
        pub fn $name(mut self, $name: $ty) -> Self {
            self.$name = $name;
            self
        }
    };
    (@one $(#[$m:meta])* some $name:ident: $ty:ty) => {
        $(#[$m])*
        pub fn $name(mut self, $name: $ty) -> Self {
            self.$name = Some($name);
            self
        }
    };
}

impl<T: DataType> RnnBuilder<T> {
    /// The defaults [`Rnn::builder`] documents.
    pub(super) fn new(cell: CellMode, input_size: i64, hidden_size: i64) -> Self {
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

    setters! {
        /// Number of stacked layers (default 1).
        set layers: i64;
        /// Uni- (default) or bidirectional.
        set direction: DirectionMode;
        /// LSTM only: project the hidden state to `proj_size` (< hidden size) values, as PyTorch's
        /// `nn.LSTM(proj_size=...)`. Equal to the hidden size means no projection.
        some proj_size: i64;
        /// Linear (default) or skip input in the first layer.
        set input_mode: InputMode;
        /// Bias vectors used by the cell formulas (default [`BiasMode::Double`], as PyTorch).
        set bias: BiasMode;
        /// Recurrence algorithm (default [`RnnAlgo::Standard`]).
        set algo: RnnAlgo;
        /// Math type. Default: [`MathType::TensorOp`] for f16/bf16 data and [`MathType::Default`]
        /// otherwise, as PyTorch (for f32 data `Default` lets cuDNN use TF32 tensor cores; use
        /// [`MathType::Fma`] for strict fp32).
        some math: MathType;
        /// Precision of the internal arithmetic (`mathPrec`). Default: f64 for f64 data, f32
        /// otherwise (PyTorch's choice for f16/bf16). f16 data may also compute in f16.
        some math_precision: DType;
        /// Whether padded (unpacked) sequence layouts are allowed (`CUDNN_RNN_PADDED_IO_ENABLED`,
        /// default `true`). PyTorch disables it for packed input; with it disabled only
        /// [`SeqLayout::Packed`](super::SeqLayout::Packed) data is accepted.
        set padded_io: bool;
        /// Dropout applied to the outputs of every layer but the last, in training forward passes.
        /// The RNN owns it from now on. Without one the RNN uses no dropout.
        some dropout: Dropout;
    }
    /// Shorthand for `direction(DirectionMode::Bidirectional)`.
    pub fn bidirectional(self) -> Self {
        self.direction(DirectionMode::Bidirectional)
    }

    /// Every check that needs neither a GPU nor cuDNN, returning the settings handed to cuDNN.
    fn config(&self) -> Result<Config> {
        if !matches!(T::DTYPE, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
            return Err(Error::UnsupportedDataType {
                op: "RNN",
                detail: format!("{} (cuDNN RNNs take f32, f64, f16 or bf16)", T::DTYPE),
            });
        }
        let input_size = int_arg("RNN input size", self.input_size)?;
        let hidden_size = int_arg("RNN hidden size", self.hidden_size)?;
        let layers = int_arg("RNN layer count", self.layers)?;
        let proj_size = match self.proj_size {
            None => hidden_size,
            Some(p) => {
                let p = int_arg("LSTM projection size", p)?;
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
                d.check_context(cudnn)?;
                DropoutSlot::User(RefCell::new(d))
            }
            None => DropoutSlot::Off(NoDropout::new(cudnn)?),
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
