//! FP8 matmul ([`BlasLt::matmul_fp8`]): E4M3 / E5M2 inputs with per-tensor scales, f32
//! accumulation, a bf16, f16 or f32 output, and the bias / ReLU / GELU epilogues.
use std::fmt;

use cudarc::cublaslt::sys;
use cudarc::driver::{CudaView, DevicePtr, DeviceRepr, ValidAsZeroBits};
use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};

use super::desc::{Alignments, Descs, MatTypes};
use super::launch::{alignment_of, Call, Ptrs};
use super::tune::{candidate, Label};
use super::{BlasLt, Choice, Epilogue, EpilogueData, Matmul};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
#[cfg(test)]
use crate::dtype::DType;
use crate::dtype::DataType;
use crate::error::{Error, Result};

/// The two FP8 formats ([`Fp8`] types): which one an element type is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Kind {
    /// 4 exponent bits, 3 mantissa bits, finite range ±448 (`CUDA_R_8F_E4M3`).
    E4M3,
    /// 5 exponent bits, 2 mantissa bits, range ±57344 (`CUDA_R_8F_E5M2`).
    E5M2,
}

impl Fp8Kind {
    pub(super) fn code(self) -> i64 {
        match self {
            Fp8Kind::E4M3 => 1,
            Fp8Kind::E5M2 => 2,
        }
    }
}

mod sealed {
    use cudarc::cublaslt::sys::cudaDataType;

    pub trait Fp8 {
        const KIND: super::Fp8Kind;
        fn cuda_type() -> cudaDataType;
    }
    impl Fp8 for float8::F8E4M3 {
        const KIND: super::Fp8Kind = super::Fp8Kind::E4M3;
        fn cuda_type() -> cudaDataType {
            cudaDataType::CUDA_R_8F_E4M3
        }
    }
    impl Fp8 for float8::F8E5M2 {
        const KIND: super::Fp8Kind = super::Fp8Kind::E5M2;
        fn cuda_type() -> cudaDataType {
            cudaDataType::CUDA_R_8F_E5M2
        }
    }

    pub trait Output {
        fn cuda_type() -> cudaDataType;
    }
    impl Output for f32 {
        fn cuda_type() -> cudaDataType {
            cudaDataType::CUDA_R_32F
        }
    }
    impl Output for half::f16 {
        fn cuda_type() -> cudaDataType {
            cudaDataType::CUDA_R_16F
        }
    }
    impl Output for half::bf16 {
        fn cuda_type() -> cudaDataType {
            cudaDataType::CUDA_R_16BF
        }
    }
}

/// An FP8 element type of [`BlasLt::matmul_fp8`]'s inputs: [`float8::F8E4M3`] or
/// [`float8::F8E5M2`] (sealed; the crate re-exports [`float8`](crate::float8)).
pub trait Fp8: DeviceRepr + ValidAsZeroBits + sealed::Fp8 {}
impl Fp8 for F8E4M3 {}
impl Fp8 for F8E5M2 {}

/// An output type of [`BlasLt::matmul_fp8`]: `f32`, [`struct@f16`] or [`bf16`] (sealed), with
/// the type of its bias vector: the output's own for f16 and bf16, bf16 for f32 (cuBLASLt's
/// FP8 rule).
pub trait Fp8Output: DataType + sealed::Output {
    /// The bias vector's element type.
    type Bias: DataType + sealed::Output;
}
impl Fp8Output for f32 {
    type Bias = bf16;
}
impl Fp8Output for f16 {
    type Bias = f16;
}
impl Fp8Output for bf16 {
    type Bias = bf16;
}

/// The per-tensor scales and options of an FP8 matmul: `D = epilogue(alpha·(sa·A)·(sb·B) +
/// beta·D + bias)`, with `sa`, `sb` read on the device from one-element f32 buffers (1 when
/// not given), so a scale computed on the GPU (an amax-based quantization) needs no
/// synchronization.
///
/// ```
/// use cudnn_safe::blas::lt::Fp8Scaling;
/// let s = Fp8Scaling::new().with_fast_accum(true);
/// assert!(s.fast_accum());
/// ```
#[derive(Default)]
#[must_use]
pub struct Fp8Scaling<'a> {
    a: Option<CudaView<'a, f32>>,
    b: Option<CudaView<'a, f32>>,
    fast_accum: bool,
}

impl fmt::Debug for Fp8Scaling<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fp8Scaling")
            .field("a_scale", &self.a.is_some())
            .field("b_scale", &self.b.is_some())
            .field("fast_accum", &self.fast_accum)
            .finish()
    }
}

impl<'a> Fp8Scaling<'a> {
    /// Scales 1, no fast accumulation.
    pub fn new() -> Self {
        Self::default()
    }
    /// A's dequantization scale: the first element of `scale` (`CUBLASLT_MATMUL_DESC_B_SCALE_POINTER`,
    /// cuBLASLt's B being our A).
    #[doc(alias = "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER")]
    pub fn with_a_scale(mut self, scale: &'a impl DeviceBuffer<f32>) -> Self {
        self.a = Some(scale.view());
        self
    }
    /// B's dequantization scale: the first element of `scale`.
    #[doc(alias = "CUBLASLT_MATMUL_DESC_A_SCALE_POINTER")]
    pub fn with_b_scale(mut self, scale: &'a impl DeviceBuffer<f32>) -> Self {
        self.b = Some(scale.view());
        self
    }
    /// cuBLASLt's fast accumulation (`CUBLASLT_MATMUL_DESC_FAST_ACCUM`): faster, with partial
    /// sums kept at lower precision for part of the reduction (PyTorch's
    /// `_scaled_mm(use_fast_accum=True)`). Off by default.
    #[doc(alias = "CUBLASLT_MATMUL_DESC_FAST_ACCUM")]
    pub fn with_fast_accum(mut self, yes: bool) -> Self {
        self.fast_accum = yes;
        self
    }
    /// Whether fast accumulation is asked for.
    pub fn fast_accum(&self) -> bool {
        self.fast_accum
    }
}

impl BlasLt {
    /// FP8 matmul, row-major: `D[m×n] = epilogue(alpha·(sa·A)·(sb·B)ᵀ + beta·D + bias)` with
    /// `A[m×k]` and `B[n×k]` FP8 ([`Fp8`]), f32 accumulation, `D` of type `O` ([`Fp8Output`]),
    /// `sa`, `sb` the scales of `scaling` ([`Fp8Scaling`]). The policy, cache and fallback
    /// along the ranking are those of [`matmul`](Self::matmul).
    ///
    /// The shape is that of a linear layer, the one layout cuBLASLt's FP8 kernels take:
    /// `op` must have `A` not transposed and `B` transposed ([`Matmul::linear`]: `B` is the
    /// weight `[out×in]`), `k` a multiple of 16, and no TF32. At least one input is E4M3
    /// (cuBLASLt has no E5M2 × E5M2 kernel). Epilogues: none, [`Epilogue::Relu`],
    /// [`Epilogue::Gelu`], [`Epilogue::Bias`], [`Epilogue::BiasRelu`],
    /// [`Epilogue::BiasGelu`], with a bias of `O::Bias`.
    ///
    /// Checked before anything is enqueued, like [`matmul`](Self::matmul): the layout and
    /// types above ([`Error::InvalidArgument`], [`Error::UnsupportedDataType`]), the buffers'
    /// lengths and contexts (a scale holds at least one element). Requires a GPU with FP8
    /// tensor cores (compute capability 8.9 or later); elsewhere cuBLASLt has no algorithm
    /// ([`Error::NoAlgorithm`]).
    ///
    /// ```no_run
    /// use cudnn_safe::blas::lt::{BlasLt, Epilogue, EpilogueData, Fp8Scaling, Matmul};
    /// use cudnn_safe::float8::F8E4M3;
    /// use cudnn_safe::half::bf16;
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let stream = cudnn_safe::cuda_context(0)?.default_stream();
    /// let mut lt = BlasLt::new(stream.clone())?;
    /// let op = Matmul::linear(64, 256, 128)?; // x[64×256] · W[128×256]ᵀ
    /// let x = stream.clone_htod(&vec![F8E4M3::from_f32(0.5); 64 * 256]).unwrap();
    /// let w = stream.clone_htod(&vec![F8E4M3::from_f32(0.25); 128 * 256]).unwrap();
    /// let (sx, sw) = (stream.clone_htod(&[2.0f32]).unwrap(), stream.clone_htod(&[0.5f32]).unwrap());
    /// let mut y = stream.alloc_zeros::<bf16>(64 * 128).unwrap();
    /// let scaling = Fp8Scaling::new().with_a_scale(&sx).with_b_scale(&sw);
    /// lt.matmul_fp8(&op, 1.0, &x, &w, 0.0, &mut y, EpilogueData::None, scaling)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cublasLtMatmul")]
    #[doc(alias = "CUDA_R_8F_E4M3")]
    #[doc(alias = "CUDA_R_8F_E5M2")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn matmul_fp8<A: Fp8, B: Fp8, O: Fp8Output>(
        &mut self,
        op: &Matmul,
        alpha: f32,
        a: &impl DeviceBuffer<A>,
        b: &impl DeviceBuffer<B>,
        beta: f32,
        d: &mut impl DeviceBufferMut<O>,
        mut epi: EpilogueData<'_, O::Bias>,
        scaling: Fp8Scaling<'_>,
    ) -> Result<Choice> {
        let label = Label::Fp8 {
            a: A::KIND,
            b: B::KIND,
            d: O::DTYPE,
            fast_accum: scaling.fast_accum,
        };
        check_fp8(op, label)?;
        let want = op.epilogue.data_kind();
        if epi.kind() != want {
            return Err(Error::invalid(
                "epilogue data",
                format!("{} for epilogue {}", want.name(), op.epilogue),
                epi.kind().name(),
            ));
        }
        self.check_buffer("a", a, op.a_len())?;
        self.check_buffer("b", b, op.b_len())?;
        self.check_buffer("d", &*d, op.d_len())?;
        // The epilogues check_fp8 admits take no data or a bias (its kind was checked above).
        if let EpilogueData::Bias(bias) = &epi {
            self.check_buffer("bias", bias, op.bias_len())?;
        }
        for (name, s) in [("a_scale", &scaling.a), ("b_scale", &scaling.b)] {
            if let Some(s) = s {
                self.check_buffer(name, s, 1)?;
            }
        }
        let shape = op.shape_code_of(label.code());
        self.bind()?;
        let stream = self.stream.clone();
        let (ap, _ga) = a.device_ptr(&stream);
        let (bp, _gb) = b.device_ptr(&stream);
        let (dp, _gd) = d.device_ptr_mut(&stream);
        let (bias, aux, _guards) = epi.device_ptrs(&stream);
        let (sa, _gsa) = match &scaling.a {
            Some(s) => {
                let (p, g) = s.device_ptr(&stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let (sb, _gsb) = match &scaling.b {
            Some(s) => {
                let (p, g) = s.device_ptr(&stream);
                (p, Some(g))
            }
            None => (0, None),
        };
        let ptrs = Ptrs {
            a: ap,
            b: bp,
            d: dp,
        };
        let align = Alignments {
            a: alignment_of(ap),
            b: alignment_of(bp),
            d: alignment_of(dp),
            bias: alignment_of(bias),
            aux: alignment_of(aux),
        };
        let types = MatTypes {
            a: A::cuda_type(),
            b: B::cuda_type(),
            c: None,
            d: <O as sealed::Output>::cuda_type(),
        };
        let descs = Descs::typed(op, types, bias, aux)?;
        {
            use sys::cublasLtMatmulDescAttributes_t as At;
            // cuBLASLt's A is our B and its B our A. A null scale pointer means 1.
            descs
                .op
                .set(At::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb)?;
            descs
                .op
                .set(At::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa)?;
            descs.op.set(
                At::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                &i8::from(scaling.fast_accum),
            )?;
            if op.epilogue.uses_bias() {
                let bias_type = <O::Bias as sealed::Output>::cuda_type() as i32;
                descs
                    .op
                    .set(At::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type)?;
            }
        }
        let (ranked, source, key) =
            self.decide::<O>(label, op, &descs, &align, &ptrs, alpha, beta)?;
        let call = Call {
            stream: &stream,
            descs: &descs,
            alpha,
            beta,
            ptrs: &ptrs,
        };
        let rank = self.launch_ranked(label, op, &call, &ranked, Some(&key))?;
        Ok(Choice {
            candidate: candidate(&ranked[rank], shape, align),
            source,
            rank,
        })
    }
}

/// The layout, type and epilogue rules of [`BlasLt::matmul_fp8`].
fn check_fp8(op: &Matmul, label: Label) -> Result<()> {
    let Label::Fp8 { a, b, .. } = label else {
        unreachable!("an FP8 label")
    };
    if a == Fp8Kind::E5M2 && b == Fp8Kind::E5M2 {
        return Err(Error::UnsupportedDataType {
            op: "cuBLASLt FP8 matmul",
            detail: "E5M2 × E5M2: at least one input must be E4M3".into(),
        });
    }
    if op.tf32 {
        return Err(Error::invalid(
            "FP8 matmul math",
            "no TF32 (f32 accumulation)",
            "TF32",
        ));
    }
    if op.trans_a || !op.trans_b {
        return Err(Error::invalid(
            "FP8 matmul transposes",
            "A not transposed and B transposed (D = A·Bᵀ, as Matmul::linear builds it)",
            format!(
                "A {}, B {}",
                if op.trans_a {
                    "transposed"
                } else {
                    "not transposed"
                },
                if op.trans_b {
                    "transposed"
                } else {
                    "not transposed"
                }
            ),
        ));
    }
    if op.k % 16 != 0 {
        return Err(Error::invalid(
            "FP8 matmul k",
            "a multiple of 16 (cuBLASLt's FP8 kernels read 16-byte rows)",
            op.k,
        ));
    }
    match op.epilogue {
        Epilogue::None
        | Epilogue::Relu
        | Epilogue::Gelu
        | Epilogue::Bias
        | Epilogue::BiasRelu
        | Epilogue::BiasGelu => Ok(()),
        e => Err(Error::invalid(
            "FP8 matmul epilogue",
            "none, Relu, Gelu, Bias, BiasRelu or BiasGelu",
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(a: Fp8Kind, b: Fp8Kind) -> Label {
        Label::Fp8 {
            a,
            b,
            d: DType::BF16,
            fast_accum: false,
        }
    }

    #[test]
    fn fp8_rules_are_checked_on_the_host() {
        let linear = Matmul::linear(32, 64, 48).unwrap();
        let ok = label(Fp8Kind::E4M3, Fp8Kind::E4M3);
        assert!(check_fp8(&linear, ok).is_ok());
        assert!(check_fp8(&linear, label(Fp8Kind::E5M2, Fp8Kind::E4M3)).is_ok());
        assert!(matches!(
            check_fp8(&linear, label(Fp8Kind::E5M2, Fp8Kind::E5M2)),
            Err(Error::UnsupportedDataType { .. })
        ));
        let plain = Matmul::new(32, 48, 64).unwrap();
        assert!(matches!(
            check_fp8(&plain, ok),
            Err(Error::InvalidArgument { .. })
        ));
        let odd_k = Matmul::linear(32, 40, 48).unwrap();
        assert!(matches!(
            check_fp8(&odd_k, ok),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(check_fp8(&linear.with_tf32(true), ok).is_err());
        assert!(check_fp8(&linear.with_epilogue(Epilogue::BiasGelu), ok).is_ok());
        assert!(check_fp8(&linear.with_epilogue(Epilogue::DGelu), ok).is_err());
        let fast = Label::Fp8 {
            a: Fp8Kind::E4M3,
            b: Fp8Kind::E4M3,
            d: DType::BF16,
            fast_accum: true,
        };
        assert_ne!(ok.code(), fast.code());
        assert_ne!(ok.code(), Label::Uniform(DType::BF16).code());
    }
}
