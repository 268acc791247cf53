//! [`Matmul`]: the description of one row-major cuBLASLt matmul problem.
use std::fmt;

use cudarc::cublaslt::sys;

use super::epilogue::DataKind;
use super::Epilogue;
use crate::blas::to_c_int;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One row-major matmul problem: shape, transposes, epilogue and compute type. Plain data with
/// by-value `with_*` setters; the dimensions are validated by the constructors.
///
/// Dimensions are `i64`, as everywhere in [`blas`](crate::blas); element counts (`*_len`) are
/// `usize`.
///
/// ```
/// use cudnn_safe::blas::lt::{Epilogue, Matmul};
/// // nn.Linear(in=1024, out=4096) on a batch of 8192, bias and GELU fused:
/// let op = Matmul::linear(8192, 1024, 4096)?.with_epilogue(Epilogue::BiasGelu);
/// assert_eq!((op.m(), op.n(), op.k()), (8192, 4096, 1024));
/// assert!(op.is_transposed_b());
/// assert_eq!(op.epilogue(), Epilogue::BiasGelu);
/// assert_eq!(op.bias_len(), 4096);
/// assert!(Matmul::new(0, 4, 4).is_err());
/// # Ok::<(), cudnn_safe::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Matmul {
    /// In `1..=i32::MAX` (checked by `new`), so every product below fits `i64`.
    pub(super) m: i64,
    pub(super) n: i64,
    pub(super) k: i64,
    pub(super) trans_a: bool,
    pub(super) trans_b: bool,
    pub(super) epilogue: Epilogue,
    pub(super) tf32: bool,
}

impl Matmul {
    /// `D[m×n] = A[m×k] · B[k×n]`, no epilogue, strict f32 math.
    ///
    /// Errors: [`Error::InvalidArgument`] naming `m`, `n` or `k` when it is below 1,
    /// [`Error::Overflow`] when it exceeds cuBLASLt's 32-bit `int` or a matrix's element count
    /// does not fit `usize`.
    pub fn new(m: i64, n: i64, k: i64) -> Result<Self> {
        Self::named(["m", "n", "k"], m, n, k)
    }

    /// The forward pass of a linear layer, `y[batch×out] = x[batch×in] · W[out×in]ᵀ`:
    /// `m = batch`, `n = out_features`, `k = in_features`, `B` (the weight) transposed. Errors
    /// as in [`new`](Self::new), naming `batch`, `in_features` or `out_features`.
    pub fn linear(batch: i64, in_features: i64, out_features: i64) -> Result<Self> {
        Ok(Self::named(
            ["batch", "out_features", "in_features"],
            batch,
            out_features,
            in_features,
        )?
        .with_transpose_b(true))
    }

    /// [`new`](Self::new) with the caller's names for `m`, `n`, `k` in its errors.
    fn named(names: [&'static str; 3], m: i64, n: i64, k: i64) -> Result<Self> {
        let dim = |what: &'static str, v: i64| -> Result<i64> {
            if v < 1 {
                return Err(Error::invalid(what, "a dimension ≥ 1", v));
            }
            to_c_int(what, v)?;
            Ok(v)
        };
        let op = Matmul {
            m: dim(names[0], m)?,
            n: dim(names[1], n)?,
            k: dim(names[2], k)?,
            trans_a: false,
            trans_b: false,
            epilogue: Epilogue::None,
            tf32: false,
        };
        // Every length below is a product of two dims (< 2^62) or the aux span (< 2^63): they
        // fit i64; check usize (32-bit targets), so that the `*_len` getters need no check.
        for (what, v) in [
            ("a", op.m * op.k),
            ("b", op.k * op.n),
            ("d", op.m * op.n),
            ("aux", op.aux_span()),
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

    /// `A` is stored `k×m` and used transposed.
    #[must_use]
    pub fn with_transpose_a(mut self, yes: bool) -> Self {
        self.trans_a = yes;
        self
    }
    /// `B` is stored `n×k` and used transposed (a weight `W[out×in]`).
    #[must_use]
    pub fn with_transpose_b(mut self, yes: bool) -> Self {
        self.trans_b = yes;
        self
    }
    /// The epilogue.
    #[must_use]
    pub fn with_epilogue(mut self, e: Epilogue) -> Self {
        self.epilogue = e;
        self
    }
    /// For f32 only: let cuBLASLt use TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`,
    /// PyTorch's `allow_tf32`), about 10 mantissa bits per product. Refused for f16/bf16.
    #[must_use]
    pub fn with_tf32(mut self, yes: bool) -> Self {
        self.tf32 = yes;
        self
    }

    /// Rows of `D` and of `op(A)`.
    pub fn m(&self) -> i64 {
        self.m
    }
    /// Columns of `D` and of `op(B)`.
    pub fn n(&self) -> i64 {
        self.n
    }
    /// The reduced dimension.
    pub fn k(&self) -> i64 {
        self.k
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
    pub fn epilogue(&self) -> Epilogue {
        self.epilogue
    }
    /// Whether TF32 is allowed.
    pub fn is_tf32(&self) -> bool {
        self.tf32
    }
    /// Elements `A` must hold: `m·k`.
    pub fn a_len(&self) -> usize {
        len(self.m * self.k)
    }
    /// Elements `B` must hold: `k·n`.
    pub fn b_len(&self) -> usize {
        len(self.k * self.n)
    }
    /// Elements `D` must hold: `m·n`.
    pub fn d_len(&self) -> usize {
        len(self.m * self.n)
    }
    /// Elements of the bias buffer the epilogue uses: `m` for [`Epilogue::BiasGrad`] (one per row
    /// of `D`), `n` for the others (one per column), 0 when it uses none.
    pub fn bias_len(&self) -> usize {
        match self.epilogue.data_kind() {
            DataKind::None | DataKind::Aux => 0,
            DataKind::BiasGrad => len(self.m),
            _ => len(self.n),
        }
    }
    /// Row length (elements) of the aux matrix of the GELU epilogues, its leading dimension: `n`
    /// rounded up to a multiple of 8 (cuBLASLt requires the aux leading dimension to be
    /// divisible by 8).
    pub fn aux_ld(&self) -> i64 {
        (self.n + 7) / 8 * 8
    }
    pub(super) fn aux_span(&self) -> i64 {
        self.m * self.aux_ld()
    }
    /// Elements the aux matrix must hold: `m·aux_ld` (0 when the epilogue uses none). Element
    /// `(i, j)` of the GELU input is at `i·aux_ld + j`; the `aux_ld − n` padding elements of each
    /// row are not part of the result. (Full rows are required, although cuBLASLt addresses only
    /// `(m − 1)·aux_ld + n`, so that no kernel's row-wise access can leave the buffer.)
    pub fn aux_len(&self) -> usize {
        if self.epilogue.uses_aux() {
            len(self.aux_span())
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
    /// The problem as the cache keys it, `types` coding the element types
    /// ([`Label::code`](super::tune::Label::code)).
    pub(super) fn shape_code_of(&self, types: i64) -> [i64; 8] {
        [
            self.m,
            self.n,
            self.k,
            i64::from(self.trans_a),
            i64::from(self.trans_b),
            types,
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

/// An element count (or a factor of one) `Matmul::new` checked to fit `usize`: positive and
/// within range, so the conversion cannot fail.
fn len(v: i64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
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
        assert_eq!(op.with_epilogue(Epilogue::Bias).bias_len(), 5);
        assert_eq!(op.with_epilogue(Epilogue::BiasGrad).bias_len(), 3);
        assert_eq!(op.with_epilogue(Epilogue::DGeluBiasGrad).bias_len(), 5);
        assert_eq!(op.aux_ld(), 8);
        assert_eq!(op.with_epilogue(Epilogue::DGelu).aux_len(), 3 * 8);
        assert_eq!(op.aux_len(), 0);
        let lin = Matmul::linear(4, 6, 9).unwrap();
        assert_eq!((lin.m(), lin.n(), lin.k()), (4, 9, 6));
        assert!(lin.is_transposed_b() && !lin.is_transposed_a());
    }
}
