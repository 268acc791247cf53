//! The random Bernoulli mask of a graph (`RngNode` in cudnn-frontend's
//! `include/cudnn_frontend/node/rng.h`), as attention dropout draws it, and its integer inputs.
use cudnn_safe_sys as sys;
use cudnn_safe_sys::Library;

use super::backend::{attr, kind, AttrElem, Desc};
#[cfg(doc)]
use super::SdpaOptions;
use super::{Graph, TensorId, TensorInfo};
use crate::dtype::DType;
use crate::error::Result;

impl Graph {
    /// A graph input holding one 64-bit integer (`CUDNN_DATA_INT64`, dimensions and strides
    /// `[1, 1, 1, 1]`): the seed or the offset of an attention dropout mask
    /// ([`SdpaOptions::dropout`]). Bind a device buffer of at least one `i64` to it with
    /// [`Args::input_i64`](super::Args::input_i64); the value is read from the device at each
    /// execution, so a new seed or offset needs neither a new graph nor a new plan.
    ///
    /// cudnn-frontend's Python tests and PyTorch pass seed and offset so (INT64 device tensors
    /// `[1, 1, 1, 1]`).
    #[doc(alias = "CUDNN_ATTR_OPERATION_RNG_SEED")]
    #[doc(alias = "CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC")]
    pub fn rng_input(&mut self, name: &'static str) -> TensorId {
        self.int_input(name, 1, DType::I64)
    }

    /// A graph input of `dtype` with dimensions `[batch, 1, 1, 1]`, packed.
    pub(crate) fn int_input(&mut self, name: &'static str, batch: i64, dtype: DType) -> TensorId {
        self.push(TensorInfo::input(
            name,
            vec![batch, 1, 1, 1],
            vec![1; 4],
            dtype,
        ))
    }
}

/// The Bernoulli random mask of attention dropout (`CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR`
/// with a `CUDNN_BACKEND_RNG_DESCRIPTOR`, built as cudnn-frontend's `RngNode` does): `y[i]` is 1
/// with probability `probability`, else 0, from the Philox generator seeded by the `seed` and
/// `offset` tensors (INT64 device tensors `[1, 1, 1, 1]`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct RngOp {
    pub(crate) seed: usize,
    pub(crate) offset: usize,
    pub(crate) y: usize,
    /// The probability of a 1 (`1 − p` for dropout probability `p`).
    pub(crate) probability: f64,
}

// SAFETY: `CUDNN_TYPE_RNG_DISTRIBUTION` elements are the C enum `cudnnRngDistribution_t`, whose
// Rust binding is a `#[repr(transparent)]` newtype of `c_uint` (4 bytes, any value valid); it is
// only ever set, never read back.
unsafe impl AttrElem for sys::cudnnRngDistribution_t {
    const TYPE: sys::cudnnBackendAttributeType_t =
        sys::cudnnBackendAttributeType_t::CUDNN_TYPE_RNG_DISTRIBUTION;
}

impl RngOp {
    pub(crate) fn reads(&self) -> Vec<usize> {
        vec![self.seed, self.offset]
    }

    pub(crate) fn writes(&self) -> Vec<usize> {
        vec![self.y]
    }

    pub(crate) fn name(&self) -> &'static str {
        "rng (Bernoulli)"
    }

    pub(crate) fn signature(&self) -> String {
        format!(
            "rng({},{},{},p{:x});",
            self.seed,
            self.offset,
            self.y,
            self.probability.to_bits()
        )
    }

    /// The operation descriptor and the RNG descriptor it refers to (kept alive beside it).
    pub(crate) fn descs(&self, lib: &'static Library, t: &[Desc]) -> Result<(Desc, Option<Desc>)> {
        let mut r = Desc::new(lib, kind!(CUDNN_BACKEND_RNG_DESCRIPTOR))?;
        r.set1(
            attr!(CUDNN_ATTR_RNG_DISTRIBUTION),
            sys::cudnnRngDistribution_t::CUDNN_RNG_DISTRIBUTION_BERNOULLI,
        )?;
        r.set1(
            attr!(CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY),
            self.probability,
        )?;
        r.finalize()?;
        let mut o = Desc::new(lib, kind!(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR))?;
        o.set_descs(attr!(CUDNN_ATTR_OPERATION_RNG_YDESC), &[&t[self.y]])?;
        o.set_descs(attr!(CUDNN_ATTR_OPERATION_RNG_DESC), &[&r])?;
        // Seed and offset as tensors (not the by-value INT64 seed attribute): the device values
        // change per step without rebuilding, as cudnn-frontend's SDPA nodes pass them.
        o.set_descs(attr!(CUDNN_ATTR_OPERATION_RNG_SEED), &[&t[self.seed]])?;
        o.set_descs(
            attr!(CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC),
            &[&t[self.offset]],
        )?;
        o.finalize()?;
        Ok((o, Some(r)))
    }
}
