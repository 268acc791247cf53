//! Argument checks of the cuBLAS calls: pure functions, nothing here touches the GPU.
use std::ffi::c_int;

use cudarc::cublas::sys;

use super::Transpose;
use crate::blas::to_c_int;
use crate::error::{Error, Result};

/// How a matrix is laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// BLAS convention: element (i, j) at `i + j·ld`.
    Col,
    /// C convention: element (i, j) at `i·ld + j`.
    Row,
}

/// A dimension: non-negative and within cuBLAS's 32-bit `int`.
pub(super) fn dim(what: &'static str, v: i64) -> Result<c_int> {
    if v < 0 {
        return Err(Error::invalid(what, "a dimension ≥ 0", v));
    }
    to_c_int(what, v)
}

pub(super) fn overflow(what: &'static str, detail: String) -> Error {
    Error::Overflow { what, detail }
}

/// A stored matrix operand: its stored shape, leading dimension and span.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mat {
    pub(super) name: &'static str,
    pub(super) rows: i64,
    pub(super) cols: i64,
    pub(super) ld: c_int,
    pub(super) order: Order,
    /// Elements from the first addressed to the last, plus one (0 for an empty matrix).
    pub(super) span: i64,
}

impl Mat {
    /// Checks `ld` against the stored `rows × cols` matrix (which `dim` already checked).
    pub(super) fn new(
        name: &'static str,
        ld_name: &'static str,
        rows: i64,
        cols: i64,
        ld: i64,
        order: Order,
    ) -> Result<Mat> {
        let (inner, outer, word) = match order {
            Order::Col => (rows, cols, "row count (column-major)"),
            Order::Row => (cols, rows, "column count (row-major)"),
        };
        let min = inner.max(1);
        if ld < min {
            return Err(Error::invalid(
                ld_name,
                format!("≥ {min}: `{name}` is stored as {rows}×{cols}, so {ld_name} must cover its {word}"),
                ld,
            ));
        }
        let ld_c = to_c_int(ld_name, ld)?;
        let span = if rows == 0 || cols == 0 {
            0
        } else {
            (outer - 1)
                .checked_mul(ld)
                .and_then(|v| v.checked_add(inner))
                .ok_or_else(|| {
                    overflow(
                        name,
                        format!("span of a {rows}×{cols} matrix with {ld_name} {ld}"),
                    )
                })?
        };
        Ok(Mat {
            name,
            rows,
            cols,
            ld: ld_c,
            order,
            span,
        })
    }

    /// Elements `batch` matrices `stride` apart address: `stride·(batch − 1) + span`.
    pub(super) fn batched_span(
        &self,
        stride_name: &'static str,
        stride: i64,
        batch: i64,
    ) -> Result<i64> {
        if stride < 0 {
            return Err(Error::invalid(stride_name, "a stride ≥ 0", stride));
        }
        if batch == 0 || self.span == 0 {
            return Ok(0);
        }
        (batch - 1)
            .checked_mul(stride)
            .and_then(|v| v.checked_add(self.span))
            .ok_or_else(|| {
                overflow(
                    self.name,
                    format!("span of {batch} matrices {stride_name} {stride} apart"),
                )
            })
    }

    /// The output rule for a strided batch: no element written by two matrices. Matrix `i + 1`
    /// may start before matrix `i` ends when they interleave without meeting (a `[m, batch, n]`
    /// row-major output: `ld = batch·n`, stride `n`). `stride` and `batch` are those
    /// [`batched_span`](Self::batched_span) accepted, which bounds the sums below.
    pub(super) fn check_output_stride(&self, stride: i64, batch: i64) -> Result<()> {
        if batch <= 1 || self.span == 0 || stride >= self.span {
            return Ok(());
        }
        let (outer, inner) = match self.order {
            Order::Col => (self.cols, self.rows),
            Order::Row => (self.rows, self.cols),
        };
        let (dims, strides) = ([batch, outer, inner], [stride, i64::from(self.ld), 1]);
        if crate::tensor::strides_non_overlapping(&dims, &strides) {
            return Ok(());
        }
        Err(Error::OverlappingOutput {
            name: self.name,
            dims: dims.to_vec(),
            strides: strides.to_vec(),
        })
    }
}

/// A span (already non-negative) as a buffer length.
pub(super) fn span_len(name: &'static str, span: i64) -> Result<usize> {
    usize::try_from(span).map_err(|_| overflow(name, format!("span {span} elements")))
}

/// The arguments of one column-major `cublasGemmEx`-family call, checked and narrowed.
#[derive(Debug, Clone, Copy)]
pub(super) struct ColCall {
    pub(super) transa: sys::cublasOperation_t,
    pub(super) transb: sys::cublasOperation_t,
    pub(super) m: c_int,
    pub(super) n: c_int,
    pub(super) k: c_int,
    pub(super) lda: c_int,
    pub(super) ldb: c_int,
    pub(super) ldc: c_int,
    /// Row-major problem: the caller's `b` is cuBLAS's first operand and `a` its second.
    pub(super) swapped: bool,
}

/// A checked GEMM problem, in the caller's layout.
#[derive(Debug, Clone, Copy)]
pub(super) struct GemmShape {
    pub(super) a: Mat,
    pub(super) b: Mat,
    pub(super) c: Mat,
    pub(super) call: ColCall,
    pub(super) empty: bool,
}

impl GemmShape {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        order: Order,
        transa: Transpose,
        transb: Transpose,
        m: i64,
        n: i64,
        k: i64,
        lda: i64,
        ldb: i64,
        ldc: i64,
    ) -> Result<GemmShape> {
        let (mc, nc, kc) = (dim("m", m)?, dim("n", n)?, dim("k", k)?);
        let (ar, ac) = transa.stored(m, k);
        let (br, bc) = transb.stored(k, n);
        let a = Mat::new("a", "lda", ar, ac, lda, order)?;
        let b = Mat::new("b", "ldb", br, bc, ldb, order)?;
        let c = Mat::new("c", "ldc", m, n, ldc, order)?;
        // A row-major X is the column-major Xᵀ with the same leading dimension, so
        // C = op(A)·op(B) in row-major is Cᵀ = op(B)ᵀ·op(A)ᵀ in column-major: swap the operands
        // and m with n; each operand keeps its own transpose flag.
        let call = match order {
            Order::Col => ColCall {
                transa: transa.raw(),
                transb: transb.raw(),
                m: mc,
                n: nc,
                k: kc,
                lda: a.ld,
                ldb: b.ld,
                ldc: c.ld,
                swapped: false,
            },
            Order::Row => ColCall {
                transa: transb.raw(),
                transb: transa.raw(),
                m: nc,
                n: mc,
                k: kc,
                lda: b.ld,
                ldb: a.ld,
                ldc: c.ld,
                swapped: true,
            },
        };
        Ok(GemmShape {
            a,
            b,
            c,
            call,
            empty: m == 0 || n == 0,
        })
    }
}

/// A checked GEMV problem.
#[derive(Debug, Clone, Copy)]
pub(super) struct GemvShape {
    pub(super) a: Mat,
    pub(super) m: c_int,
    pub(super) n: c_int,
    /// Elements of x and y (`n` and `m`, or `m` and `n` when transposed).
    pub(super) x_count: c_int,
    pub(super) y_count: c_int,
    pub(super) incx: c_int,
    pub(super) incy: c_int,
    pub(super) x_span: i64,
    pub(super) y_span: i64,
}

pub(super) fn inc(what: &'static str, v: i64) -> Result<c_int> {
    if v < 1 {
        return Err(Error::invalid(what, "an increment ≥ 1", v));
    }
    to_c_int(what, v)
}

/// `1 + (count − 1)·inc` elements (0 when `count` is 0).
pub(super) fn vec_span(name: &'static str, count: i64, inc: c_int) -> Result<i64> {
    if count == 0 {
        return Ok(0);
    }
    (count - 1)
        .checked_mul(i64::from(inc))
        .and_then(|v| v.checked_add(1))
        .ok_or_else(|| overflow(name, format!("span of {count} elements {inc} apart")))
}

impl GemvShape {
    pub(super) fn new(
        trans: Transpose,
        m: i64,
        n: i64,
        lda: i64,
        incx: i64,
        incy: i64,
    ) -> Result<Self> {
        let (mc, nc) = (dim("m", m)?, dim("n", n)?);
        let a = Mat::new("a", "lda", m, n, lda, Order::Col)?;
        let (incx, incy) = (inc("incx", incx)?, inc("incy", incy)?);
        let (x_count, y_count) = match trans {
            Transpose::No => (nc, mc),
            Transpose::Yes => (mc, nc),
        };
        Ok(GemvShape {
            a,
            m: mc,
            n: nc,
            x_count,
            y_count,
            incx,
            incy,
            x_span: vec_span("x", x_count.into(), incx)?,
            y_span: vec_span("y", y_count.into(), incy)?,
        })
    }
}

impl GemvShape {
    /// The GEMM that computes this GEMV (for the types cuBLAS has no GEMV for):
    /// `yᵀ (1×ny, ld incy) = xᵀ (1×nx, ld incx) · op(A)ᵀ`, a column-major GEMM with M = 1 where
    /// x and y are one-row matrices whose columns are `inc` apart, x first and A second.
    pub(super) fn as_gemm(&self, trans: Transpose) -> ColCall {
        ColCall {
            transa: sys::cublasOperation_t::CUBLAS_OP_N,
            transb: trans.flip().raw(),
            m: 1,
            n: self.y_count,
            k: self.x_count,
            lda: self.incx,
            ldb: self.a.ld,
            ldc: self.incy,
            swapped: false,
        }
    }
}

/// Errors of `linear`'s shape check speak of x, w, y and the features, not of a, b, c.
pub(super) fn rename_linear(e: Error, batch: i64, in_features: i64, out_features: i64) -> Error {
    let rename = |what: &'static str| match what {
        "m" => "batch",
        "n" => "out_features",
        "k" => "in_features",
        other => other,
    };
    match e {
        Error::InvalidArgument {
            what,
            expected,
            got,
        } => Error::InvalidArgument {
            what: rename(what),
            expected,
            got,
        },
        Error::Overflow { what, detail } => Error::Overflow {
            what: rename(what),
            detail: format!(
                "{detail} (batch {batch}, in_features {in_features}, out_features {out_features})"
            ),
        },
        other => other,
    }
}

/// Output matrices starting at `starts`, each `bytes` long, must not overlap.
pub(super) fn check_disjoint_outputs(starts: &[u64], bytes: u64) -> Result<()> {
    let mut order: Vec<usize> = (0..starts.len()).collect();
    order.sort_by_key(|&i| starts[i]);
    for w in order.windows(2) {
        let (i, j) = (w[0], w[1]);
        if starts[i].saturating_add(bytes) > starts[j] {
            return Err(Error::invalid(
                "c",
                "pairwise disjoint output matrices",
                format!("c[{i}] and c[{j}] overlap"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_invalid(r: &Result<impl std::fmt::Debug>, name: &str) -> bool {
        matches!(r, Err(Error::InvalidArgument { what, .. }) if *what == name)
    }

    #[test]
    fn batched_outputs_may_interleave_but_not_meet() {
        let overlapping = |r: Result<()>| matches!(r, Err(Error::OverlappingOutput { .. }));
        // Row-major 2×3 matrices stored as [m, batch, n] = [2, 2, 3]: ld 6, stride 3.
        let c = Mat::new("c", "ldc", 2, 3, 6, Order::Row).unwrap();
        assert_eq!(c.span, 9);
        c.check_output_stride(3, 2).unwrap();
        // A third matrix 3 apart reaches row 0 of the first's second row: refused.
        assert!(overlapping(c.check_output_stride(3, 3)));
        // Stride 2 puts matrix 1's row 0 over matrix 0's; stride 0 broadcasts the output.
        assert!(overlapping(c.check_output_stride(2, 2)));
        assert!(overlapping(c.check_output_stride(0, 2)));
        // Column-major 3×2 with ld 6, stride 3: columns interleave.
        let c = Mat::new("c", "ldc", 3, 2, 6, Order::Col).unwrap();
        c.check_output_stride(3, 2).unwrap();
        assert!(overlapping(c.check_output_stride(1, 2)));
        // Packed matrices: the stride must cover one.
        let c = Mat::new("c", "ldc", 3, 2, 3, Order::Col).unwrap();
        c.check_output_stride(6, 4).unwrap();
        assert!(overlapping(c.check_output_stride(5, 2)));
    }

    #[test]
    fn column_major_shapes_and_spans() {
        let s =
            GemmShape::new(Order::Col, Transpose::No, Transpose::Yes, 4, 5, 3, 6, 7, 4).unwrap();
        // a stored 4×3, ld 6: 6·2 + 4; b stored 5×3 (n×k), ld 7: 7·2 + 5; c 4×5, ld 4.
        assert_eq!((s.a.rows, s.a.cols, s.a.span), (4, 3, 16));
        assert_eq!((s.b.rows, s.b.cols, s.b.span), (5, 3, 19));
        assert_eq!(s.c.span, 20);
        assert!(!s.call.swapped && !s.empty);
        assert_eq!((s.call.m, s.call.n, s.call.k), (4, 5, 3));
    }

    #[test]
    fn row_major_swaps_operands() {
        // Row-major a 4×3 (ld 3), b 3×5 (ld 5), c 4×5 (ld 5).
        let s = GemmShape::new(Order::Row, Transpose::No, Transpose::No, 4, 5, 3, 3, 5, 5).unwrap();
        assert_eq!((s.a.span, s.b.span, s.c.span), (12, 15, 20));
        assert!(s.call.swapped);
        assert_eq!((s.call.m, s.call.n, s.call.k), (5, 4, 3));
        assert_eq!((s.call.lda, s.call.ldb, s.call.ldc), (5, 3, 5));
        // ld covers columns in row-major: lda 2 < 3 columns.
        let r = GemmShape::new(Order::Row, Transpose::No, Transpose::No, 4, 5, 3, 2, 5, 5);
        assert!(is_invalid(&r, "lda"), "{r:?}");
        // Transposed row-major a is stored k×m = 3×4: lda must be ≥ 4.
        let r = GemmShape::new(Order::Row, Transpose::Yes, Transpose::No, 4, 5, 3, 3, 5, 5);
        assert!(is_invalid(&r, "lda"), "{r:?}");
    }

    #[test]
    fn leading_dimensions_and_dims_are_checked() {
        let ok = |ta, tb, lda, ldb, ldc| {
            GemmShape::new(Order::Col, ta, tb, 4, 5, 3, lda, ldb, ldc).map(|_| ())
        };
        assert!(ok(Transpose::No, Transpose::No, 4, 3, 4).is_ok());
        assert!(is_invalid(
            &ok(Transpose::No, Transpose::No, 3, 3, 4),
            "lda"
        ));
        assert!(is_invalid(
            &ok(Transpose::Yes, Transpose::No, 2, 3, 4),
            "lda"
        ));
        assert!(ok(Transpose::Yes, Transpose::No, 3, 3, 4).is_ok());
        assert!(is_invalid(
            &ok(Transpose::No, Transpose::No, 4, 2, 4),
            "ldb"
        ));
        assert!(is_invalid(
            &ok(Transpose::No, Transpose::Yes, 4, 4, 4),
            "ldb"
        ));
        assert!(is_invalid(
            &ok(Transpose::No, Transpose::No, 4, 3, 3),
            "ldc"
        ));
        // ld 0 is refused even for empty matrices.
        let r = GemmShape::new(Order::Col, Transpose::No, Transpose::No, 0, 0, 0, 0, 1, 1);
        assert!(is_invalid(&r, "lda"), "{r:?}");
        let e = GemmShape::new(Order::Col, Transpose::No, Transpose::No, 0, 5, 3, 1, 3, 1).unwrap();
        assert!(e.empty && e.a.span == 0 && e.c.span == 0);
        let r = GemmShape::new(Order::Col, Transpose::No, Transpose::No, -1, 5, 3, 4, 3, 4);
        assert!(is_invalid(&r, "m"), "{r:?}");
        let big = c_int::MAX as i64 + 1;
        let r = GemmShape::new(
            Order::Col,
            Transpose::No,
            Transpose::No,
            4,
            5,
            big,
            4,
            big,
            4,
        );
        assert!(matches!(r, Err(Error::Overflow { what: "k", .. })), "{r:?}");
        let r = GemmShape::new(Order::Col, Transpose::No, Transpose::No, 4, 5, 3, big, 3, 4);
        assert!(
            matches!(r, Err(Error::Overflow { what: "lda", .. })),
            "{r:?}"
        );
    }

    #[test]
    fn batched_spans_and_output_strides() {
        let s = GemmShape::new(Order::Col, Transpose::No, Transpose::No, 4, 5, 3, 6, 3, 4).unwrap();
        assert_eq!(s.c.span, 20);
        assert_eq!(s.c.batched_span("stride_c", 25, 3).unwrap(), 70);
        assert_eq!(s.a.batched_span("stride_a", 0, 3).unwrap(), s.a.span);
        assert_eq!(s.a.batched_span("stride_a", 7, 0).unwrap(), 0);
        assert!(is_invalid(&s.a.batched_span("stride_a", -1, 3), "stride_a"));
        assert!(matches!(
            s.c.batched_span("stride_c", i64::MAX / 2, 4),
            Err(Error::Overflow { what: "c", .. })
        ));
        assert!(s.c.check_output_stride(20, 3).is_ok());
        assert!(s.c.check_output_stride(0, 1).is_ok());
        let r = s.c.check_output_stride(19, 2);
        match r {
            Err(Error::OverlappingOutput {
                name,
                dims,
                strides,
            }) => {
                assert_eq!(name, "c");
                assert_eq!(dims, vec![2, 5, 4]);
                assert_eq!(strides, vec![19, 4, 1]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gemv_shapes() {
        let s = GemvShape::new(Transpose::No, 4, 3, 5, 2, 3).unwrap();
        assert_eq!((s.x_count, s.y_count), (3, 4));
        assert_eq!((s.x_span, s.y_span, s.a.span), (5, 10, 14));
        let t = GemvShape::new(Transpose::Yes, 4, 3, 4, 1, 1).unwrap();
        assert_eq!((t.x_count, t.y_count, t.x_span, t.y_span), (4, 3, 4, 3));
        assert!(is_invalid(
            &GemvShape::new(Transpose::No, 4, 3, 4, 0, 1),
            "incx"
        ));
        assert!(is_invalid(
            &GemvShape::new(Transpose::No, 4, 3, 4, 1, -2),
            "incy"
        ));
        assert!(is_invalid(
            &GemvShape::new(Transpose::No, 4, 3, 3, 1, 1),
            "lda"
        ));
    }

    #[test]
    fn outputs_must_be_disjoint() {
        assert!(check_disjoint_outputs(&[0, 100, 200], 100).is_ok());
        assert!(check_disjoint_outputs(&[200, 0, 100], 100).is_ok());
        let r = check_disjoint_outputs(&[200, 0, 150], 100);
        assert!(is_invalid(&r, "c"), "{r:?}");
        let r = check_disjoint_outputs(&[64, 64], 8);
        assert!(is_invalid(&r, "c"), "{r:?}");
    }

    /// Reference BLAS `gemm` on the host, column-major, as cuBLAS defines it.
    #[allow(clippy::too_many_arguments)]
    fn host_gemm(
        ta: sys::cublasOperation_t,
        tb: sys::cublasOperation_t,
        m: c_int,
        n: c_int,
        k: c_int,
        a: &[f64],
        lda: c_int,
        b: &[f64],
        ldb: c_int,
        c: &mut [f64],
        ldc: c_int,
    ) {
        let n_op = sys::cublasOperation_t::CUBLAS_OP_N;
        let (lda, ldb, ldc) = (lda as usize, ldb as usize, ldc as usize);
        for j in 0..n as usize {
            for i in 0..m as usize {
                let mut s = 0.0;
                for l in 0..k as usize {
                    let av = if ta == n_op {
                        a[i + l * lda]
                    } else {
                        a[l + i * lda]
                    };
                    let bv = if tb == n_op {
                        b[l + j * ldb]
                    } else {
                        b[j + l * ldb]
                    };
                    s += av * bv;
                }
                c[i + j * ldc] = s;
            }
        }
    }

    /// Small integers, so that every sum is exact.
    fn fill(len: usize, seed: u64) -> Vec<f64> {
        (0..len as u64)
            .map(|i| ((i * 7 + seed * 13) % 11) as f64 - 5.0)
            .collect()
    }

    #[test]
    fn row_major_swap_matches_a_row_major_product() {
        for ta in [Transpose::No, Transpose::Yes] {
            for tb in [Transpose::No, Transpose::Yes] {
                let (m, n, k) = (5i64, 3i64, 4i64);
                let (ar, ac) = ta.stored(m, k);
                let (br, bc) = tb.stored(k, n);
                let (lda, ldb, ldc) = (ac + 2, bc + 1, n + 3);
                let a = fill((ar * lda) as usize, 1);
                let b = fill((br * ldb) as usize, 2);
                let s = GemmShape::new(Order::Row, ta, tb, m, n, k, lda, ldb, ldc).unwrap();
                assert_eq!(s.a.span, lda * (ar - 1) + ac);
                let mut c = vec![f64::NAN; s.c.span as usize];
                let call = s.call;
                let (first, second) = if call.swapped { (&b, &a) } else { (&a, &b) };
                host_gemm(
                    call.transa,
                    call.transb,
                    call.m,
                    call.n,
                    call.k,
                    first,
                    call.lda,
                    second,
                    call.ldb,
                    &mut c,
                    call.ldc,
                );
                for i in 0..m {
                    for j in 0..n {
                        let mut want = 0.0;
                        for l in 0..k {
                            let av = match ta {
                                Transpose::No => a[(i * lda + l) as usize],
                                Transpose::Yes => a[(l * lda + i) as usize],
                            };
                            let bv = match tb {
                                Transpose::No => b[(l * ldb + j) as usize],
                                Transpose::Yes => b[(j * ldb + l) as usize],
                            };
                            want += av * bv;
                        }
                        assert_eq!(c[(i * ldc + j) as usize], want, "{ta:?} {tb:?} ({i}, {j})");
                    }
                }
            }
        }
    }

    #[test]
    fn half_gemv_as_one_row_gemm_matches_gemv() {
        // What `gemv` passes to cublasGemmEx for f16/bf16, run through the host BLAS.
        for trans in [Transpose::No, Transpose::Yes] {
            let (m, n, lda, incx, incy) = (4i64, 3i64, 6i64, 2i64, 3i64);
            let s = GemvShape::new(trans, m, n, lda, incx, incy).unwrap();
            let a = fill(s.a.span as usize, 3);
            let x = fill(s.x_span as usize, 4);
            let mut y = vec![f64::NAN; s.y_span as usize];
            let call = s.as_gemm(trans);
            assert!(!call.swapped);
            host_gemm(
                call.transa,
                call.transb,
                call.m,
                call.n,
                call.k,
                &x,
                call.lda,
                &a,
                call.ldb,
                &mut y,
                call.ldc,
            );
            for i in 0..i64::from(s.y_count) {
                let mut want = 0.0;
                for j in 0..i64::from(s.x_count) {
                    let av = match trans {
                        Transpose::No => a[(i + j * lda) as usize],
                        Transpose::Yes => a[(j + i * lda) as usize],
                    };
                    want += av * x[(j * incx) as usize];
                }
                assert_eq!(y[(i * incy) as usize], want, "{trans:?} y[{i}]");
            }
        }
    }

    #[test]
    fn linear_errors_name_features() {
        let e = rename_linear(Error::invalid("k", "a dimension ≥ 0", -3), 2, -3, 4);
        assert!(matches!(
            e,
            Error::InvalidArgument {
                what: "in_features",
                ..
            }
        ));
    }
}
