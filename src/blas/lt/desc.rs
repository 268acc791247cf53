//! The cuBLASLt descriptors of one call, owned (RAII: destroyed on drop, a failure is logged),
//! and the column-major plan they describe.
use std::ffi::{c_int, c_void};
use std::fmt;
use std::mem::size_of;

use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::{result, sys};

use super::Matmul;
use crate::blas::cublaslt_error;
use crate::error::Result;

/// `cublasLtMatmulHeuristicResult_t` with its status kept as an integer: cudarc declares the
/// field as a Rust enum, and a status value it does not list would be undefined behaviour.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RawHeuristic {
    pub(super) algo: [u64; 8],
    pub(super) workspace_size: usize,
    pub(super) state: u32,
    pub(super) waves_count: f32,
    pub(super) reserved: [c_int; 4],
}

const _: () =
    assert!(size_of::<RawHeuristic>() == size_of::<sys::cublasLtMatmulHeuristicResult_t>());
const _: () = assert!(
    std::mem::align_of::<RawHeuristic>()
        == std::mem::align_of::<sys::cublasLtMatmulHeuristicResult_t>()
);
const _: () = assert!(size_of::<[u64; 8]>() == size_of::<sys::cublasLtMatmulAlgo_t>());

/// One kind of cuBLASLt descriptor: its raw handle, its attribute enum and its C calls.
pub(super) trait Kind {
    type Raw: Copy;
    type Attr;
    /// C names, for errors and logs.
    const SET: &'static str;
    const DESTROY: &'static str;
    /// # Safety
    ///
    /// `raw` is a live descriptor of this kind; `v` points to `size` readable bytes of the type
    /// `attr` takes.
    unsafe fn set(
        raw: Self::Raw,
        attr: Self::Attr,
        v: *const c_void,
        size: usize,
    ) -> std::result::Result<(), CublasError>;
    /// # Safety
    ///
    /// `raw` is a live descriptor of this kind, destroyed once.
    unsafe fn destroy(raw: Self::Raw) -> std::result::Result<(), CublasError>;
}

/// An owned cuBLASLt descriptor, destroyed on drop (a failure is logged).
pub(super) struct Desc<K: Kind>(pub(super) K::Raw);

impl<K: Kind> Desc<K> {
    /// Sets attribute `attr` to `v`. Callers pass the type the attribute takes: i32 for
    /// transposes, u32 for the epilogue and alignments, u64 for pointers and the workspace size,
    /// i64 for the aux leading dimension.
    pub(super) fn set<V: Copy>(&self, attr: K::Attr, v: &V) -> Result<()> {
        // SAFETY: live descriptor (owned by `self`); `v` points to a `V` of `size_of::<V>()`
        // bytes, the type the attribute takes (see above).
        unsafe {
            K::set(
                self.0,
                attr,
                (v as *const V).cast::<c_void>(),
                size_of::<V>(),
            )
        }
        .map_err(|e| cublaslt_error(K::SET, e))
    }
}

impl<K: Kind> Drop for Desc<K> {
    fn drop(&mut self) {
        // SAFETY: created by the kind's create call (the only way to build a `Desc`), destroyed
        // once, here.
        if let Err(e) = unsafe { K::destroy(self.0) } {
            log::warn!("{}: {e}", K::DESTROY);
        }
    }
}

/// `cublasLtMatmulDesc_t`.
pub(super) enum Op {}
/// `cublasLtMatrixLayout_t`.
pub(super) enum Layout {}
/// `cublasLtMatmulPreference_t`.
pub(super) enum Pref {}

pub(super) type OpDesc = Desc<Op>;
pub(super) type LayoutDesc = Desc<Layout>;
pub(super) type PrefDesc = Desc<Pref>;

/// Implements [`Kind`] for a descriptor kind from cudarc's `set_*` and `destroy_*` calls.
macro_rules! kind {
    ($kind:ty, $raw:ty, $attr:ty, $set:ident, $set_name:literal, $destroy:ident, $destroy_name:literal) => {
        impl Kind for $kind {
            type Raw = $raw;
            type Attr = $attr;
            const SET: &'static str = $set_name;
            const DESTROY: &'static str = $destroy_name;
            unsafe fn set(
                raw: Self::Raw,
                attr: Self::Attr,
                v: *const c_void,
                size: usize,
            ) -> std::result::Result<(), CublasError> {
                // SAFETY: the caller's contract.
                unsafe { result::$set(raw, attr, v, size) }
            }
            unsafe fn destroy(raw: Self::Raw) -> std::result::Result<(), CublasError> {
                // SAFETY: the caller's contract.
                unsafe { result::$destroy(raw) }
            }
        }
    };
}

kind!(
    Op,
    sys::cublasLtMatmulDesc_t,
    sys::cublasLtMatmulDescAttributes_t,
    set_matmul_desc_attribute,
    "cublasLtMatmulDescSetAttribute",
    destroy_matmul_desc,
    "cublasLtMatmulDescDestroy"
);
kind!(
    Layout,
    sys::cublasLtMatrixLayout_t,
    sys::cublasLtMatrixLayoutAttribute_t,
    set_matrix_layout_attribute,
    "cublasLtMatrixLayoutSetAttribute",
    destroy_matrix_layout,
    "cublasLtMatrixLayoutDestroy"
);
kind!(
    Pref,
    sys::cublasLtMatmulPreference_t,
    sys::cublasLtMatmulPreferenceAttributes_t,
    set_matmul_pref_attribute,
    "cublasLtMatmulPreferenceSetAttribute",
    destroy_matmul_pref,
    "cublasLtMatmulPreferenceDestroy"
);

impl OpDesc {
    pub(super) fn new(compute: sys::cublasComputeType_t) -> Result<Self> {
        result::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F)
            .map(Desc)
            .map_err(|e| cublaslt_error("cublasLtMatmulDescCreate", e))
    }
}

impl LayoutDesc {
    pub(super) fn new(dtype: sys::cudaDataType, rows: u64, cols: u64) -> Result<Self> {
        // Packed column-major: the leading dimension is the row count (< 2^31).
        result::create_matrix_layout(dtype, rows, cols, rows as i64)
            .map(Desc)
            .map_err(|e| cublaslt_error("cublasLtMatrixLayoutCreate", e))
    }
}

impl PrefDesc {
    pub(super) fn new(workspace_limit: usize, align: &Alignments) -> Result<Self> {
        let p = result::create_matmul_pref()
            .map(Desc)
            .map_err(|e| cublaslt_error("cublasLtMatmulPreferenceCreate", e))?;
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        p.set(
            P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &(workspace_limit as u64),
        )?;
        // cuBLASLt's "A" is our B and its "B" our A (see the module docs).
        p.set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align.b)?;
        p.set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align.a)?;
        p.set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align.d)?;
        p.set(P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align.d)?;
        Ok(p)
    }
}

/// The column-major problem cuBLASLt is given for a row-major one (see [`BlasLt`]):
/// `Dᵀ[n×m] = op(B)ᵀ · op(A)ᵀ`, so cuBLASLt's `M, N, K` are our `n, m, k`, its A is our B and its
/// B our A. Layouts are (rows, cols) of the stored column-major matrices, packed (ld = rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CuPlan {
    /// `CUBLASLT_MATMUL_DESC_TRANSA` (applies to our B).
    pub(super) trans_a: bool,
    /// `CUBLASLT_MATMUL_DESC_TRANSB` (applies to our A).
    pub(super) trans_b: bool,
    /// Layout of cuBLASLt's A: our B, stored row-major k×n (= column-major n×k) or, transposed,
    /// n×k (= column-major k×n).
    pub(super) a: (u64, u64),
    /// Layout of cuBLASLt's B: our A, stored row-major m×k (= column-major k×m) or, transposed,
    /// k×m (= column-major m×k).
    pub(super) b: (u64, u64),
    /// Layout of C and D: our row-major m×n = column-major n×m.
    pub(super) d: (u64, u64),
}

impl CuPlan {
    pub(super) fn of(op: &Matmul) -> Self {
        // Positive (checked by `Matmul::new`): `unsigned_abs` is the value.
        let (m, n, k) = (
            op.m.unsigned_abs(),
            op.n.unsigned_abs(),
            op.k.unsigned_abs(),
        );
        CuPlan {
            trans_a: op.trans_b,
            trans_b: op.trans_a,
            a: if op.trans_b { (k, n) } else { (n, k) },
            b: if op.trans_a { (m, k) } else { (k, m) },
            d: (n, m),
        }
    }
}

/// The descriptors of one call: the operation and the layouts of cuBLASLt's A (our B), B (our
/// A), D, and C when its type differs from D's (an FP8 output).
pub(super) struct Descs {
    pub(super) op: OpDesc,
    pub(super) cu_a: LayoutDesc,
    pub(super) cu_b: LayoutDesc,
    pub(super) d: LayoutDesc,
    pub(super) c: Option<LayoutDesc>,
}

/// The cuBLASLt data types of one call's matrices, in our (row-major) names.
#[derive(Debug, Clone, Copy)]
pub(super) struct MatTypes {
    pub(super) a: sys::cudaDataType,
    pub(super) b: sys::cudaDataType,
    /// C's type; `None`: D's.
    pub(super) c: Option<sys::cudaDataType>,
    pub(super) d: sys::cudaDataType,
}

impl MatTypes {
    pub(super) fn uniform(t: sys::cudaDataType) -> Self {
        MatTypes {
            a: t,
            b: t,
            c: None,
            d: t,
        }
    }
}

impl Descs {
    /// `bias` and `aux` are the device addresses set on the descriptor (0: not used by the
    /// epilogue). The heuristic reads them for their alignment only.
    pub(super) fn new(op: &Matmul, dtype: sys::cudaDataType, bias: u64, aux: u64) -> Result<Self> {
        Self::typed(op, MatTypes::uniform(dtype), bias, aux)
    }

    /// [`new`](Self::new) with a data type per matrix.
    pub(super) fn typed(op: &Matmul, types: MatTypes, bias: u64, aux: u64) -> Result<Self> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let desc = OpDesc::new(op.compute_type())?;
        let plan = CuPlan::of(op);
        // cublasOperation_t: 0 = N, 1 = T.
        desc.set(A::CUBLASLT_MATMUL_DESC_TRANSA, &i32::from(plan.trans_a))?;
        desc.set(A::CUBLASLT_MATMUL_DESC_TRANSB, &i32::from(plan.trans_b))?;
        desc.set(
            A::CUBLASLT_MATMUL_DESC_EPILOGUE,
            &(op.epilogue.raw() as u32),
        )?;
        if op.epilogue.uses_bias() {
            desc.set(A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
        }
        if op.epilogue.uses_aux() {
            desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux)?;
            desc.set(A::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &op.aux_ld())?;
        }
        // cuBLASLt's A is our B, its B our A.
        let cu_a = LayoutDesc::new(types.b, plan.a.0, plan.a.1)?;
        let cu_b = LayoutDesc::new(types.a, plan.b.0, plan.b.1)?;
        let d = LayoutDesc::new(types.d, plan.d.0, plan.d.1)?;
        let c = match types.c {
            Some(t) => Some(LayoutDesc::new(t, plan.d.0, plan.d.1)?),
            None => None,
        };
        Ok(Descs {
            op: desc,
            cu_a,
            cu_b,
            d,
            c,
        })
    }

    /// The layout of C: its own, or D's.
    pub(super) fn c(&self) -> &LayoutDesc {
        self.c.as_ref().unwrap_or(&self.d)
    }
}

/// Pointer alignments of one call, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Alignments {
    pub(super) a: u32,
    pub(super) b: u32,
    pub(super) d: u32,
    pub(super) bias: u32,
    pub(super) aux: u32,
}

impl fmt::Display for Alignments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a {}, b {}, d {}, bias {}, aux {} bytes",
            self.a, self.b, self.d, self.bias, self.aux
        )
    }
}

impl Alignments {
    pub(super) fn uniform(v: u32) -> Self {
        Alignments {
            a: v,
            b: v,
            d: v,
            bias: v,
            aux: v,
        }
    }
    pub(super) fn min(&self) -> u32 {
        self.a.min(self.b).min(self.d).min(self.bias).min(self.aux)
    }
    /// Whether every pointer is at least as aligned as in `other`.
    pub(super) fn covers(&self, other: &Alignments) -> bool {
        self.a >= other.a
            && self.b >= other.b
            && self.d >= other.d
            && self.bias >= other.bias
            && self.aux >= other.aux
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host model of cuBLASLt's column-major contract, fed the plan's descriptors and our
    /// row-major buffers, must produce our row-major product, bias broadcast and bias gradients.
    #[test]
    fn column_major_plan_computes_the_row_major_problem() {
        // cuBLASLt semantics (column-major, packed, ld = rows): element (r, c) of a stored
        // `rows×cols` matrix is at `r + c·rows`; op(X) = X or Xᵀ.
        fn at(mem: &[f64], (rows, _cols): (u64, u64), trans: bool, r: u64, c: u64) -> f64 {
            let (r, c) = if trans { (c, r) } else { (r, c) };
            mem[(r + c * rows) as usize]
        }
        let mut seed = 0x1234_5678_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 11) % 1000) as f64 / 250.0 - 2.0
        };
        for (m, n, k) in [(3u64, 5u64, 4u64), (1, 4, 2), (6, 1, 3), (2, 3, 1)] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let op = Matmul::new(m as i64, n as i64, k as i64)
                    .unwrap()
                    .with_transpose_a(ta)
                    .with_transpose_b(tb);
                let plan = CuPlan::of(&op);
                let a: Vec<f64> = (0..m * k).map(|_| next()).collect();
                let b: Vec<f64> = (0..k * n).map(|_| next()).collect();
                let bias: Vec<f64> = (0..n).map(|_| next()).collect();
                // Row-major reference.
                let op_a = |i: u64, p: u64| {
                    if ta {
                        a[(p * m + i) as usize]
                    } else {
                        a[(i * k + p) as usize]
                    }
                };
                let op_b = |p: u64, j: u64| {
                    if tb {
                        b[(j * k + p) as usize]
                    } else {
                        b[(p * n + j) as usize]
                    }
                };
                // cuBLASLt: M = rows of D = plan.d.0, N = plan.d.1, A = our B, B = our A.
                let (cm, cn) = plan.d;
                assert_eq!((cm, cn), (n, m));
                let (a_rows, a_cols) = plan.a;
                let ck = if plan.trans_a { a_rows } else { a_cols };
                assert_eq!(ck, k);
                assert_eq!(if plan.trans_b { plan.b.1 } else { plan.b.0 }, k);
                let mut d_cm = vec![0.0; (m * n) as usize];
                for i in 0..cm {
                    for j in 0..cn {
                        let mut acc = 0.0;
                        for p in 0..ck {
                            acc += at(&b, plan.a, plan.trans_a, i, p)
                                * at(&a, plan.b, plan.trans_b, p, j);
                        }
                        // BIAS: one value per row of the column-major D.
                        d_cm[(i + j * cm) as usize] = acc + bias[i as usize];
                    }
                }
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 =
                            (0..k).map(|p| op_a(i, p) * op_b(p, j)).sum::<f64>() + bias[j as usize];
                        let got = d_cm[(i * n + j) as usize];
                        assert!(
                            (got - want).abs() < 1e-12,
                            "{op}: D[{i},{j}] {got} != {want}"
                        );
                    }
                }
                // BGRADB: reduce op(cuBLASLt's B) over k, one value per column of D (cn = m).
                for j in 0..cn {
                    let got: f64 = (0..ck).map(|p| at(&a, plan.b, plan.trans_b, p, j)).sum();
                    let want: f64 = (0..k).map(|p| op_a(j, p)).sum();
                    assert!((got - want).abs() < 1e-12, "{op}: db[{j}]");
                }
                // DGELU_BGRAD: reduce D over its columns, one value per row (cm = n): the column
                // sums of our row-major D.
                for i in 0..cm {
                    let got: f64 = (0..cn).map(|j| d_cm[(i + j * cm) as usize]).sum();
                    let want: f64 = (0..m).map(|r| d_cm[(r * n + i) as usize]).sum();
                    assert!((got - want).abs() < 1e-12, "{op}: column sum {i}");
                }
            }
        }
    }
}
