//! The algorithm side of a convolution: which pass ([`ConvDirection`]), the algorithm enum of
//! each ([`ConvAlgorithm`]: [`ConvFwdAlgo`], [`ConvBwdDataAlgo`], [`ConvBwdFilterAlgo`]), cuDNN's
//! per-algorithm records ([`AlgoPerf`]) and the fused call's activation ([`FusedActivation`]).
use std::fmt;

use cudnn_safe_sys as sys;

use super::MathType;
use crate::error::{Result, Status};
#[cfg(doc)]
use crate::handle::Cudnn;
use crate::raw;

/// Which pass of a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConvDirection {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx = conv_transpose(dy, w)`.
    BackwardData,
    /// `dw = correlate(x, dy)`.
    BackwardFilter,
}

impl ConvDirection {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            ConvDirection::Forward => "forward",
            ConvDirection::BackwardData => "backward-data",
            ConvDirection::BackwardFilter => "backward-filter",
        }
    }
}

pub(super) mod sealed {
    /// Seals [`ConvAlgorithm`](super::ConvAlgorithm) and carries the C types of its direction.
    pub trait Sealed: Sized {
        /// The C algorithm enum.
        type Sys: Copy;
        /// The C perf record.
        type Perf: Copy;
        /// The C enum value.
        fn sys(self) -> Self::Sys;
        /// Converts a C perf record; `None` for an algorithm this crate does not know.
        fn perf(p: &Self::Perf) -> Option<super::AlgoPerf<Self>>;
    }
}

/// The algorithm enum of one convolution direction: [`ConvFwdAlgo`], [`ConvBwdDataAlgo`] or
/// [`ConvBwdFilterAlgo`]. Sealed.
pub trait ConvAlgorithm:
    sealed::Sealed + Copy + Eq + std::hash::Hash + fmt::Debug + fmt::Display + Send + Sync + 'static
{
    /// The direction these algorithms compute.
    const DIRECTION: ConvDirection;
    /// Every algorithm cuDNN defines for the direction, in C enum order.
    const ALL: &'static [Self];
    /// The C enum value.
    fn raw_value(self) -> u32;
    /// The algorithm for a C enum value, if this crate knows it.
    fn from_raw_value(v: u32) -> Option<Self>;
    /// cuDNN's name without the common prefix (e.g. `WINOGRAD_NONFUSED`).
    fn name(self) -> &'static str;
    /// Looks an algorithm up by [`name`](Self::name) (case-insensitive).
    fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .copied()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }
}

macro_rules! algo_enum {
    (
        $(#[$m:meta])* $name:ident, $dir:expr, $sys:ident, $perf:ident {
            $($(#[$vm:meta])* $v:ident = $raw:literal => $s:literal,)*
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $v,)* }

        impl sealed::Sealed for $name {
            type Sys = sys::$sys;
            type Perf = sys::$perf;
            fn sys(self) -> sys::$sys {
                sys::$sys(self.raw_value())
            }
            fn perf(p: &sys::$perf) -> Option<AlgoPerf<Self>> {
                Some(AlgoPerf {
                    algo: Self::from_raw_value(p.algo.0)?,
                    status: Status(p.status.0),
                    time_ms: p.time,
                    workspace: p.memory,
                    deterministic: p.determinism.0 == 1,
                    math: MathType::from_raw(p.mathType).unwrap_or_default(),
                })
            }
        }
        impl ConvAlgorithm for $name {
            const DIRECTION: ConvDirection = $dir;
            const ALL: &'static [Self] = &[$($name::$v,)*];
            fn raw_value(self) -> u32 {
                match self { $($name::$v => $raw,)* }
            }
            fn from_raw_value(v: u32) -> Option<Self> {
                match v { $($raw => Some($name::$v),)* _ => None }
            }
            fn name(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

algo_enum!(
    /// Forward convolution algorithms (`cudnnConvolutionFwdAlgo_t`).
    #[doc(alias = "cudnnConvolutionFwdAlgo_t")]
    ConvFwdAlgo, ConvDirection::Forward, cudnnConvolutionFwdAlgo_t, cudnnConvolutionFwdAlgoPerf_t {
        /// Implicit GEMM, no workspace.
        ImplicitGemm = 0 => "IMPLICIT_GEMM",
        /// Implicit GEMM with precomputed indices.
        ImplicitPrecompGemm = 1 => "IMPLICIT_PRECOMP_GEMM",
        /// Explicit im2col + GEMM.
        Gemm = 2 => "GEMM",
        /// Direct convolution.
        Direct = 3 => "DIRECT",
        /// FFT.
        Fft = 4 => "FFT",
        /// Tiled FFT.
        FftTiling = 5 => "FFT_TILING",
        /// Fused Winograd.
        Winograd = 6 => "WINOGRAD",
        /// Winograd with separate transform kernels.
        WinogradNonfused = 7 => "WINOGRAD_NONFUSED",
    }
);

algo_enum!(
    /// Backward-data algorithms (`cudnnConvolutionBwdDataAlgo_t`).
    #[doc(alias = "cudnnConvolutionBwdDataAlgo_t")]
    ConvBwdDataAlgo, ConvDirection::BackwardData, cudnnConvolutionBwdDataAlgo_t,
    cudnnConvolutionBwdDataAlgoPerf_t {
        /// Algorithm 0 (non-deterministic: atomics).
        Algo0 = 0 => "ALGO_0",
        /// Algorithm 1.
        Algo1 = 1 => "ALGO_1",
        /// FFT.
        Fft = 2 => "FFT",
        /// Tiled FFT.
        FftTiling = 3 => "FFT_TILING",
        /// Fused Winograd.
        Winograd = 4 => "WINOGRAD",
        /// Winograd with separate transform kernels.
        WinogradNonfused = 5 => "WINOGRAD_NONFUSED",
    }
);

algo_enum!(
    /// Backward-filter algorithms (`cudnnConvolutionBwdFilterAlgo_t`).
    #[doc(alias = "cudnnConvolutionBwdFilterAlgo_t")]
    ConvBwdFilterAlgo, ConvDirection::BackwardFilter, cudnnConvolutionBwdFilterAlgo_t,
    cudnnConvolutionBwdFilterAlgoPerf_t {
        /// Algorithm 0 (non-deterministic: atomics).
        Algo0 = 0 => "ALGO_0",
        /// Algorithm 1.
        Algo1 = 1 => "ALGO_1",
        /// FFT.
        Fft = 2 => "FFT",
        /// Algorithm 3 (non-deterministic).
        Algo3 = 3 => "ALGO_3",
        /// Fused Winograd (defined by cuDNN, not implemented by it: always refused).
        Winograd = 4 => "WINOGRAD",
        /// Winograd with separate transform kernels.
        WinogradNonfused = 5 => "WINOGRAD_NONFUSED",
        /// Tiled FFT.
        FftTiling = 6 => "FFT_TILING",
    }
);

/// One entry of cuDNN's algorithm list for a case (heuristic or measured): the
/// `cudnnConvolution*AlgoPerf_t` record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlgoPerf<A> {
    /// The algorithm.
    pub algo: A,
    /// Whether cuDNN supports it for this case ([`Status::SUCCESS`]) or why not.
    pub status: Status,
    /// Measured time in milliseconds (benchmark), or cuDNN's estimate/−1 (heuristic).
    pub time_ms: f32,
    /// Workspace it needs, in bytes.
    pub workspace: usize,
    /// Whether results are bitwise reproducible run to run.
    pub deterministic: bool,
    /// The math type it uses.
    pub math: MathType,
}

impl<A> AlgoPerf<A> {
    /// Whether cuDNN can run this algorithm for the case.
    pub fn is_supported(&self) -> bool {
        self.status == Status::SUCCESS
    }
}

/// The activation of the fused [`Cudnn::conv_bias_activation_forward`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FusedActivation {
    /// `max(0, ·)`.
    Relu,
    /// No activation (cuDNN supports it only with [`ConvFwdAlgo::ImplicitPrecompGemm`]).
    Identity,
}

impl FusedActivation {
    pub(crate) fn descriptor(self) -> Result<raw::OwnedActivation> {
        let lib = raw::lib()?;
        let d = raw::OwnedActivation::new(lib)?;
        let mode = match self {
            FusedActivation::Relu => sys::cudnnActivationMode_t::CUDNN_ACTIVATION_RELU,
            FusedActivation::Identity => sys::cudnnActivationMode_t::CUDNN_ACTIVATION_IDENTITY,
        };
        // SAFETY: live descriptor; valid enum values.
        unsafe {
            raw::cudnnSetActivationDescriptor(
                lib,
                d.as_ptr(),
                mode,
                sys::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                0.0,
            )
        }?;
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_tables_round_trip() {
        fn check<A: ConvAlgorithm>(count: usize) {
            assert_eq!(A::ALL.len(), count);
            for (i, a) in A::ALL.iter().enumerate() {
                assert_eq!(a.raw_value() as usize, i);
                assert_eq!(A::from_raw_value(i as u32), Some(*a));
                assert_eq!(A::from_name(&a.name().to_lowercase()), Some(*a));
            }
            assert_eq!(A::from_raw_value(count as u32), None);
        }
        check::<ConvFwdAlgo>(8);
        check::<ConvBwdDataAlgo>(6);
        check::<ConvBwdFilterAlgo>(7);
    }
}
