//! [`Matmul`]: the description of one row-major cuBLASLt matmul problem.
use std::fmt;

use cudarc::cublaslt::sys;

use super::epilogue::DataKind;
use super::Epilogue;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One row-major matmul problem: shape, transposes, epilogue and compute type. Plain data with
/// by-value setters; the dimensions are validated by the constructors.
///
/// ```
/// use cudnn_safe::blas::lt::{Epilogue, Matmul};
/// // nn.Linear(in=1024, out=4096) on a batch of 8192, bias and GELU fused:
/// let op = Matmul::linear(8192, 1024, 4096).unwrap().epilogue(Epilogue::BiasGelu);
/// assert_eq!((op.m(), op.n(), op.k()), (8192, 4096, 1024));
/// assert!(op.is_transposed_b());
/// assert_eq!(op.bias_len(), 4096);
/// assert!(Matmul::new(0, 4, 4).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Matmul {
    pub(super) m: u64,
    pub(super) n: u64,
    pub(super) k: u64,
    pub(super) trans_a: bool,
    pub(super) trans_b: bool,
    pub(super) epilogue: Epilogue,
    pub(super) tf32: bool,
}

impl Matmul {
    /// `D[m×n] = A[m×k] · B[k×n]`, no epilogue, strict f32 math. Each dimension must be in
    /// `1..=i32::MAX`, and every matrix's element count must fit `usize`.
    pub fn new(m: usize, n: usize, k: usize) -> Result<Self> {
        let dim = |what: &'static str, v: usize| -> Result<u64> {
            if v == 0 {
                return Err(Error::invalid(what, "at least 1", v));
            }
            if v > i32::MAX as usize {
                return Err(Error::Overflow {
                    what,
                    detail: format!("{v} exceeds i32::MAX, cuBLASLt's limit for a dimension"),
                });
            }
            Ok(v as u64)
        };
        let op = Matmul {
            m: dim("matmul dimension m", m)?,
            n: dim("matmul dimension n", n)?,
            k: dim("matmul dimension k", k)?,
            trans_a: false,
            trans_b: false,
            epilogue: Epilogue::None,
            tf32: false,
        };
        // Every length below is a product of two dims (< 2^62) or the aux span: they fit u64;
        // check usize (32-bit targets).
        for (what, v) in [
            ("matrix A", op.m * op.k),
            ("matrix B", op.k * op.n),
            ("matrix D", op.m * op.n),
            ("aux matrix", op.aux_span()),
        ] {
            if usize::try_from(v).is_err() {
                return Err(Error::Overflow {
                    what,
                    detail: format!("{v} elements do not fit usize"),
                });
            }
        }
        Ok(op)
    }

    /// The forward pass of a linear layer, `y[batch×out] = x[batch×in] · W[out×in]ᵀ`:
    /// `m = batch`, `n = out_features`, `k = in_features`, `B` (the weight) transposed.
    pub fn linear(batch: usize, in_features: usize, out_features: usize) -> Result<Self> {
        Ok(Self::new(batch, out_features, in_features)?.transpose_b(true))
    }

    /// `A` is stored `k×m` and used transposed.
    #[must_use]
    pub fn transpose_a(mut self, yes: bool) -> Self {
        self.trans_a = yes;
        self
    }
    /// `B` is stored `n×k` and used transposed (a weight `W[out×in]`).
    #[must_use]
    pub fn transpose_b(mut self, yes: bool) -> Self {
        self.trans_b = yes;
        self
    }
    /// The epilogue.
    #[must_use]
    pub fn epilogue(mut self, e: Epilogue) -> Self {
        self.epilogue = e;
        self
    }
    /// For f32 only: let cuBLASLt use TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`,
    /// PyTorch's `allow_tf32`), about 10 mantissa bits per product. Refused for f16/bf16.
    #[must_use]
    pub fn tf32(mut self, yes: bool) -> Self {
        self.tf32 = yes;
        self
    }

    /// Rows of `D` and of `op(A)`.
    pub fn m(&self) -> usize {
        self.m as usize
    }
    /// Columns of `D` and of `op(B)`.
    pub fn n(&self) -> usize {
        self.n as usize
    }
    /// The reduced dimension.
    pub fn k(&self) -> usize {
        self.k as usize
    }
    /// Whether `A` is stored `k×m`.
    pub fn is_transposed_a(&self) -> bool {
        self.trans_a
    }
    /// Whether `B` is stored `n×k`.
    pub fn is_transposed_b(&self) -> bool {
        self.trans_b
    }
    /// The epilogue.
    pub fn get_epilogue(&self) -> Epilogue {
        self.epilogue
    }
    /// Whether TF32 is allowed.
    pub fn is_tf32(&self) -> bool {
        self.tf32
    }
    /// Elements `A` must hold: `m·k`.
    pub fn a_len(&self) -> usize {
        (self.m * self.k) as usize
    }
    /// Elements `B` must hold: `k·n`.
    pub fn b_len(&self) -> usize {
        (self.k * self.n) as usize
    }
    /// Elements `D` must hold: `m·n`.
    pub fn d_len(&self) -> usize {
        (self.m * self.n) as usize
    }
    /// Elements of the bias buffer the epilogue uses: `m` for [`Epilogue::BiasGrad`] (one per row
    /// of `D`), `n` for the others (one per column), 0 when it uses none.
    pub fn bias_len(&self) -> usize {
        match self.epilogue.data_kind() {
            DataKind::None | DataKind::Aux => 0,
            DataKind::BiasGrad => self.m as usize,
            _ => self.n as usize,
        }
    }
    /// Row length (elements) of the aux matrix of the GELU epilogues: `n` rounded up to a
    /// multiple of 8 (cuBLASLt requires the aux leading dimension to be divisible by 8).
    pub fn aux_ld(&self) -> usize {
        self.aux_ld_u64() as usize
    }
    pub(super) fn aux_ld_u64(&self) -> u64 {
        self.n.div_ceil(8) * 8
    }
    pub(super) fn aux_span(&self) -> u64 {
        self.m * self.aux_ld_u64()
    }
    /// Elements the aux matrix must hold: `m·aux_ld` (0 when the epilogue uses none). Element
    /// `(i, j)` of the GELU input is at `i·aux_ld + j`; the `aux_ld − n` padding elements of each
    /// row are not part of the result. (Full rows are required, although cuBLASLt addresses only
    /// `(m − 1)·aux_ld + n`, so that no kernel's row-wise access can leave the buffer.)
    pub fn aux_len(&self) -> usize {
        if self.epilogue.uses_aux() {
            self.aux_span() as usize
        } else {
            0
        }
    }
    /// Floating-point operations of the product (`2·m·n·k`).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// The problem as integers (without pointer alignments): part of every cache key and the
    /// identity a [`Candidate`] is tied to.
    pub(super) fn shape_code(&self, dtype: DType) -> [i64; 8] {
        [
            self.m as i64,
            self.n as i64,
            self.k as i64,
            i64::from(self.trans_a),
            i64::from(self.trans_b),
            dtype_code(dtype),
            i64::from(self.tf32),
            self.epilogue.code(),
        ]
    }

    pub(super) fn compute_type(&self) -> sys::cublasComputeType_t {
        if self.tf32 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        }
    }
}

impl fmt::Display for Matmul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}x{}x{} ({}·{}{}{})",
            self.m,
            self.n,
            self.k,
            if self.trans_a { "Aᵀ" } else { "A" },
            if self.trans_b { "Bᵀ" } else { "B" },
            if self.epilogue == Epilogue::None {
                String::new()
            } else {
                format!(", {}", self.epilogue)
            },
            if self.tf32 { ", tf32" } else { "" }
        )
    }
}

pub(super) fn dtype_code(d: DType) -> i64 {
    match d {
        DType::F32 => 0,
        DType::F16 => 2,
        DType::BF16 => 14,
        _ => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_are_validated() {
        assert!(Matmul::new(0, 1, 1).is_err());
        assert!(Matmul::new(1, 0, 1).is_err());
        assert!(Matmul::new(1, 1, 0).is_err());
        assert!(matches!(
            Matmul::new(1 << 31, 1, 1),
            Err(Error::Overflow { .. })
        ));
        let op = Matmul::new(3, 5, 7).unwrap();
        assert_eq!((op.a_len(), op.b_len(), op.d_len()), (21, 35, 15));
        assert_eq!(op.bias_len(), 0);
        assert_eq!(op.epilogue(Epilogue::Bias).bias_len(), 5);
        assert_eq!(op.epilogue(Epilogue::BiasGrad).bias_len(), 3);
        assert_eq!(op.epilogue(Epilogue::DGeluBiasGrad).bias_len(), 5);
        assert_eq!(op.aux_ld(), 8);
        assert_eq!(op.epilogue(Epilogue::DGelu).aux_len(), 3 * 8);
        assert_eq!(op.aux_len(), 0);
        let lin = Matmul::linear(4, 6, 9).unwrap();
        assert_eq!((lin.m(), lin.n(), lin.k()), (4, 9, 6));
        assert!(lin.is_transposed_b() && !lin.is_transposed_a());
    }
}
