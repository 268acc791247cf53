//! [`RnnReserve`]: the reserve space of a training forward, and the checks that keep it to
//! the backward calls of the same network, descriptors and order.
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::Forward;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;

/// Where a reserve stands in the training step it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReserveState {
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
    pub(super) buf: Option<CudaSlice<u8>>,
    pub(super) bytes: usize,
    pub(super) rnn: u64,
    pub(super) x_desc: u64,
    pub(super) y_desc: u64,
    pub(super) had_hx: bool,
    pub(super) had_cx: bool,
    pub(super) state: ReserveState,
    pub(super) _t: PhantomData<fn() -> T>,
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
    pub fn size_in_bytes(&self) -> usize {
        self.bytes
    }
    /// Whether backward data has run on it (so backward weights may).
    pub fn backward_data_done(&self) -> bool {
        self.state == ReserveState::DataDone
    }
}

impl ReserveState {
    /// Whether backward data may run: only on a reserve fresh from its forward.
    pub(super) fn ready_for_data(self) -> Result<()> {
        let got = match self {
            ReserveState::Forward => return Ok(()),
            ReserveState::DataDone => "a reserve backward data already used",
            ReserveState::Failed => "a reserve whose backward-data call failed",
        };
        let expected = if self == ReserveState::DataDone {
            "a reserve fresh from a training forward (backward data runs once per forward)"
        } else {
            "a reserve fresh from a training forward"
        };
        Err(Error::invalid("RNN reserve space", expected, got))
    }

    /// Whether backward weights may run: only after a successful backward data.
    pub(super) fn ready_for_weights(self) -> Result<()> {
        let got = match self {
            ReserveState::DataDone => return Ok(()),
            ReserveState::Failed => "a reserve whose backward-data call failed",
            ReserveState::Forward => "a reserve straight from the forward",
        };
        Err(Error::invalid(
            "RNN reserve space",
            "a reserve backward data has run on (cuDNN's order: data, then weights)",
            got,
        ))
    }
}

impl<T: DataType> RnnReserve<T> {
    /// The reserve of a training forward of the network `rnn` (its id) over `args`, before the
    /// launch gives it memory.
    pub(super) fn for_forward(rnn: u64, args: &Forward<'_, T>) -> Self {
        RnnReserve {
            buf: None,
            bytes: 0,
            rnn,
            x_desc: args.x_desc.id(),
            y_desc: args.y_desc.id(),
            had_hx: args.hx.is_some(),
            had_cx: args.cx.is_some(),
            state: ReserveState::Forward,
            _t: PhantomData,
        }
    }

    /// The memory for a training forward's reserve of `bytes` bytes: `old`'s when it is large
    /// enough and on the handle's context, else a fresh allocation (none for 0 bytes).
    pub(super) fn take_buffer(
        cudnn: &Cudnn,
        bytes: usize,
        old: Option<RnnReserve<T>>,
    ) -> Result<Option<CudaSlice<u8>>> {
        let reusable = old
            .and_then(|r| r.buf)
            .filter(|b| b.len() >= bytes && **b.stream().context() == **cudnn.context());
        match reusable {
            Some(b) => Ok(Some(b)),
            None if bytes == 0 => Ok(None),
            // SAFETY: uninitialised bytes are sound for `u8` storage that only cuDNN uses: the
            // training forward writes the reserve before the backward calls read it, and it is
            // never read on the host.
            None => unsafe { cudnn.stream().alloc::<u8>(bytes) }
                .map(Some)
                .map_err(|e| Error::driver("allocating the RNN reserve space", e)),
        }
    }

    /// The stream the memory was allocated on (cloned, so that ordering a use with it does not
    /// borrow the reserve).
    pub(super) fn alloc_stream(&self) -> Option<Arc<CudaStream>> {
        self.buf.as_ref().map(|b| b.stream().clone())
    }

    /// Whether the backward calls pass the initial states the forward had: `hx`, and `cx`
    /// where the call takes it (`None`: backward weights, which takes no cell state).
    pub(super) fn check_states_match(&self, hx: bool, cx: Option<bool>) -> Result<()> {
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
        if hx != self.had_hx {
            return Err(mismatch("hx", self.had_hx));
        }
        if let Some(cx) = cx {
            if cx != self.had_cx {
                return Err(mismatch("cx", self.had_cx));
            }
        }
        Ok(())
    }
}
