//! What the regrouped normalizations' training forward saves for the backward pass, and the
//! check that saved values come from the same object and input buffer.
use std::fmt;
use std::marker::PhantomData;

use cudarc::driver::CudaSlice;

use super::NormType;
use crate::buffer::DeviceBuffer;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;

/// Checks that saved values (`(object id, x address)` as the training forward recorded them)
/// came from the training forward of the object `id` on the buffer `x`: [`Error::InvalidArgument`]
/// naming `what` otherwise.
pub(super) fn check_saved_origin<T: DataType>(
    cudnn: &Cudnn,
    what: &'static str,
    expected: &'static str,
    saved: (u64, u64),
    id: u64,
    x: &impl DeviceBuffer<T>,
) -> Result<()> {
    let (xp, _guard) = x.device_ptr(cudnn.stream());
    check_origin_at(
        (what, expected, "values saved by another object"),
        saved,
        id,
        xp,
    )
}

/// Checks that saved values (`(object id, x address)` as the training forward recorded them)
/// came from the object `id` and the `x` at device address `x` (the saved value keeps the
/// forward's `x` borrowed, so an equal address is the same buffer, not a reallocation).
/// `(what, expected, other)` name the error: `other` is what a value of another object is.
pub(super) fn check_origin_at(
    (what, expected, other): (&'static str, &'static str, &'static str),
    (norm, x_at): (u64, u64),
    id: u64,
    x: u64,
) -> Result<()> {
    if norm != id {
        return Err(Error::invalid(what, expected, other));
    }
    if x != x_at {
        return Err(Error::invalid(
            what,
            "x to be the buffer the training forward read",
            format!("x at {x:#x}, the forward read x at {x_at:#x}"),
        ));
    }
    Ok(())
}

/// What a layer / group normalization training forward saves for the backward pass: per
/// normalized group, the mean and the inverse standard deviation `1/sqrt(σ² + ε)` (biased
/// variance), of type `T::Param`, and, from the batch-norm formulation, the normalized input
/// `x̂` (`x`'s element count, type `T`). A [`LayerNorm`](super::LayerNorm) on its fused graph
/// path ([`LayerNormPath`](super::LayerNormPath)) saves no `x̂`: its backward kernel recomputes
/// it from `x`, so the saved value costs `2·rows` parameters instead of a tensor.
///
/// The backward call checks that it came from the same normalization object and that `x` is the
/// buffer the forward read, and runs the path that saved it.
pub struct NormSaved<'x, T: NormType> {
    /// `None` when the fused graph path saved the value.
    pub(super) xhat: Option<CudaSlice<T>>,
    pub(super) mean: CudaSlice<T::Param>,
    pub(super) inv_std: CudaSlice<T::Param>,
    pub(super) norm: u64,
    /// Device address of the `x` the forward read; `x` stays borrowed (`'x`) while this
    /// value lives, so no other buffer can be at that address.
    pub(super) x: u64,
    pub(super) _x: PhantomData<&'x ()>,
}

impl<T: NormType> fmt::Debug for NormSaved<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NormSaved")
            .field("xhat", &self.xhat.as_ref().map(|x| x.len()))
            .field("groups", &self.mean.len())
            .finish()
    }
}

impl<T: NormType> NormSaved<'_, T> {
    /// The normalized input `x̂ = (x − μ)/sqrt(σ² + ε)`, laid out as `x`, when the batch-norm
    /// formulation saved it; `None` from a [`LayerNorm`](super::LayerNorm)'s fused graph path,
    /// which keeps only the statistics.
    pub fn xhat(&self) -> Option<&CudaSlice<T>> {
        self.xhat.as_ref()
    }
    /// Whether the fused graph path saved this value (its backward runs that path too).
    pub fn from_graph(&self) -> bool {
        self.xhat.is_none()
    }
    /// The mean of each normalized group (row-major over the batch and group indices, like
    /// PyTorch's `[N, G]` for group norm and `[rows]` for layer norm).
    pub fn mean(&self) -> &CudaSlice<T::Param> {
        &self.mean
    }
    /// `1/sqrt(σ² + ε)` of each group (PyTorch's `rstd`), ordered as [`mean`](Self::mean).
    pub fn inv_std(&self) -> &CudaSlice<T::Param> {
        &self.inv_std
    }
}
