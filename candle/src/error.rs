//! This crate's errors travel inside `candle_core::Error` (as its boxed `Cuda` error); [`Error::of`]
//! and [`cudnn_error`] find them again.
use std::fmt;

/// A refused argument or device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// `arg` is not what the operation takes.
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// The argument (`x`, `w`, `padding`, ...).
        arg: &'static str,
        /// What it must be.
        expected: String,
        /// What it was.
        got: String,
    },
    /// An element type these operations do not run (they take f32, f16 and bf16).
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// Its element type.
        dtype: candle_core::DType,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument {
                op,
                arg,
                expected,
                got,
            } => write!(f, "{op}: `{arg}` must be {expected}, got {got}"),
            Error::UnsupportedDType { op, arg, dtype } => write!(
                f,
                "{op}: `{arg}` is {dtype:?}; cuDNN runs f32, f16 and bf16 here"
            ),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// This crate's error inside `e`, if that is where `e` comes from (through candle's
    /// backtrace and context wrappers).
    ///
    /// ```
    /// # use candle_core::{Device, Tensor};
    /// let x = Tensor::zeros((1, 4, 8, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    /// let w = Tensor::zeros((2, 3, 3, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
    /// let e = cudnn_safe_candle::conv2d(&x, &w, 1, 1, 1, 1).unwrap_err();
    /// match cudnn_safe_candle::Error::of(&e) {
    ///     Some(cudnn_safe_candle::Error::InvalidArgument { arg, .. }) => assert_eq!(*arg, "w"),
    ///     other => panic!("{other:?}"),
    /// }
    /// ```
    pub fn of(e: &candle_core::Error) -> Option<&Error> {
        boxed(e)?.downcast_ref::<Error>()
    }

    pub(crate) fn dtype(
        op: &'static str,
        arg: &'static str,
        dtype: candle_core::DType,
    ) -> candle_core::Error {
        into_candle(Error::UnsupportedDType { op, arg, dtype })
    }

    pub(crate) fn invalid(
        op: &'static str,
        arg: &'static str,
        expected: impl Into<String>,
        got: impl fmt::Debug,
    ) -> candle_core::Error {
        into_candle(Error::InvalidArgument {
            op,
            arg,
            expected: expected.into(),
            got: format!("{got:?}"),
        })
    }
}

/// `t` (the argument `arg` of `op`) on the device of `r` (named `r_name`).
pub(crate) fn same_device(
    op: &'static str,
    r: &candle_core::Tensor,
    r_name: &str,
    t: &candle_core::Tensor,
    arg: &'static str,
) -> candle_core::Result<()> {
    if t.device().same_device(r.device()) {
        Ok(())
    } else {
        Err(Error::invalid(
            op,
            arg,
            format!("on {r_name}'s device {:?}", r.device().location()),
            t.device().location(),
        ))
    }
}

/// `t` (the argument `arg` of `op`) of the dtype of `r` (named `r_name`) and on its device.
pub(crate) fn like(
    op: &'static str,
    r: &candle_core::Tensor,
    r_name: &str,
    t: &candle_core::Tensor,
    arg: &'static str,
) -> candle_core::Result<()> {
    if t.dtype() != r.dtype() {
        return Err(Error::invalid(
            op,
            arg,
            format!("{r_name}'s dtype {:?}", r.dtype()),
            t.dtype(),
        ));
    }
    same_device(op, r, r_name, t, arg)
}

/// The `cudnn-safe` error inside `e` (what cuDNN or the library's checks refused), if any.
pub fn cudnn_error(e: &candle_core::Error) -> Option<&cudnn_safe::Error> {
    boxed(e)?.downcast_ref::<cudnn_safe::Error>()
}

/// The boxed error of candle's `Cuda` variant inside `e`.
fn boxed(e: &candle_core::Error) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
    match e {
        candle_core::Error::Cuda(b) => Some(&**b),
        candle_core::Error::WithBacktrace { inner, .. }
        | candle_core::Error::Context { inner, .. }
        | candle_core::Error::WithPath { inner, .. } => boxed(inner),
        _ => None,
    }
}

fn into_candle(e: impl std::error::Error + Send + Sync + 'static) -> candle_core::Error {
    candle_core::Error::Cuda(Box::new(e)).bt()
}

/// A `cudnn-safe` error as a candle error (the typed error inside: [`cudnn_error`]).
pub(crate) fn wrap(e: cudnn_safe::Error) -> candle_core::Error {
    into_candle(e)
}
