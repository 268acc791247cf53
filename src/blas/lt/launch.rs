//! The launch path: checks, pointers and alignments, the heuristic query, and
//! `cublasLtMatmul` with fallback along the ranking.
use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::sync::Arc;

use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaStream, DeviceSlice};

use super::desc::{Alignments, Descs, PrefDesc, RawHeuristic};
use super::tune::{candidate, ranked_of, Key, Label, Ranked};
#[cfg(doc)]
use super::Policy;
use super::{
    BlasLt, Candidate, Choice, Element, EpilogueData, Matmul, Source, CANDIDATE_ALIGNMENT,
    MAX_ALIGNMENT, MAX_CANDIDATES,
};
use crate::blas::cublaslt_error;
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::workspace::Workspace;

/// Alignment in bytes of a device address: the largest power of two dividing it, at most 256.
pub(super) fn alignment_of(ptr: u64) -> u32 {
    if ptr == 0 {
        MAX_ALIGNMENT
    } else {
        (1u64 << ptr.trailing_zeros().min(8)) as u32
    }
}

/// What every launch of one call shares: the stream, the descriptors, the scalars and the
/// addresses of A, B and D.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) descs: &'a Descs,
    pub(super) alpha: f32,
    pub(super) beta: f32,
    pub(super) ptrs: &'a Ptrs,
}

/// Device addresses of A, B and D (the bias and aux addresses live in the descriptor).
#[derive(Clone, Copy)]
pub(super) struct Ptrs {
    pub(super) a: u64,
    pub(super) b: u64,
    pub(super) d: u64,
}

impl BlasLt {
    /// Checks that `buf` lives on this handle's context and holds at least `required` elements.
    pub(super) fn check_buffer<T, B: DeviceSlice<T> + ?Sized>(
        &self,
        name: &'static str,
        buf: &B,
        required: usize,
    ) -> Result<()> {
        crate::blas::check_buffer(&self.stream, name, buf, required)
    }

    /// Everything that can be checked without touching a pointer.
    pub(super) fn check_call<T: Element>(
        &self,
        op: &Matmul,
        a: &impl DeviceSlice<T>,
        b: &impl DeviceSlice<T>,
        d: &impl DeviceSlice<T>,
        epi: &EpilogueData<'_, T>,
    ) -> Result<()> {
        if op.tf32 && T::DTYPE != DType::F32 {
            return Err(Error::UnsupportedDataType {
                op: "cuBLASLt matmul",
                detail: format!("TF32 math applies to f32 only, the data is {}", T::DTYPE),
            });
        }
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
        self.check_buffer("d", d, op.d_len())?;
        let (bias_len, aux_len) = (op.bias_len(), op.aux_len());
        match epi {
            EpilogueData::None => {}
            EpilogueData::Bias(bias) => self.check_buffer("bias", bias, bias_len)?,
            EpilogueData::BiasGrad(db) => self.check_buffer("bias_grad", db, bias_len)?,
            EpilogueData::BiasAux { bias, aux } => {
                self.check_buffer("bias", bias, bias_len)?;
                self.check_buffer("aux", aux, aux_len)?;
            }
            EpilogueData::Aux(aux) => self.check_buffer("aux", aux, aux_len)?,
            EpilogueData::AuxBiasGrad { aux, bias_grad } => {
                self.check_buffer("aux", aux, aux_len)?;
                self.check_buffer("bias_grad", bias_grad, bias_len)?;
            }
        }
        Ok(())
    }

    /// `D = epilogue(alpha·op(A)·op(B) + beta·D + bias)` (`cublasLtMatmul`) with the algorithm
    /// the policy picks (cached per problem), all row-major (see [`BlasLt`]).
    ///
    /// Checked before anything is enqueued: TF32 only with f32; `epi` is the variant the
    /// epilogue takes; `a`, `b`, `d` hold at least [`a_len`](Matmul::a_len),
    /// [`b_len`](Matmul::b_len), [`d_len`](Matmul::d_len) elements, the bias and aux buffers
    /// [`bias_len`](Matmul::bias_len) and [`aux_len`](Matmul::aux_len); every buffer is on
    /// the handle's context. With `beta = 0`, `D` is not read (it may hold NaN).
    ///
    /// An algorithm cuBLASLt refuses at launch is dropped from the cached ranking and the next
    /// one runs. Under [`Policy::Benchmark`] the first call of a problem writes `D` (or a
    /// scratch copy when `beta ≠ 0`) and the epilogue outputs several times while timing.
    #[doc(alias = "cublasLtMatmul")]
    #[doc(alias = "cublasLtMatmulAlgoGetHeuristic")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn matmul<T: Element>(
        &mut self,
        op: &Matmul,
        alpha: f32,
        a: &impl DeviceBuffer<T>,
        b: &impl DeviceBuffer<T>,
        beta: f32,
        d: &mut impl DeviceBufferMut<T>,
        epi: EpilogueData<'_, T>,
    ) -> Result<Choice> {
        self.run(op, alpha, a, b, beta, d, epi, None)
    }

    /// As [`matmul`](Self::matmul) with a given candidate (from [`candidates`](Self::candidates)
    /// or an earlier [`Choice`]); no decision is made or cached. Refused before launch when
    /// the candidate was found for another problem, when a pointer is less aligned than
    /// [`Candidate::alignment`], when cuBLASLt's `cublasLtMatmulAlgoCheck` refuses the algorithm
    /// for this call, or when its workspace exceeds the limit. The workspace is the larger of
    /// [`Candidate::workspace`] and what that check reports, whatever the field was set to.
    #[doc(alias = "cublasLtMatmul")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn matmul_with_candidate<T: Element>(
        &mut self,
        candidate: &Candidate,
        op: &Matmul,
        alpha: f32,
        a: &impl DeviceBuffer<T>,
        b: &impl DeviceBuffer<T>,
        beta: f32,
        d: &mut impl DeviceBufferMut<T>,
        epi: EpilogueData<'_, T>,
    ) -> Result<Choice> {
        self.run(op, alpha, a, b, beta, d, epi, Some(candidate))
    }

    /// cuBLASLt's top `count` (1..=64) heuristic candidates for `op` with element type `T`,
    /// under the workspace limit, assuming every pointer is aligned to
    /// [`CANDIDATE_ALIGNMENT`] bytes. Nothing runs on the GPU. Fewer may come back; none is
    /// [`Error::NoAlgorithm`].
    #[doc(alias = "cublasLtMatmulAlgoGetHeuristic")]
    pub fn candidates<T: Element>(&mut self, op: &Matmul, count: usize) -> Result<Vec<Candidate>> {
        if op.tf32 && T::DTYPE != DType::F32 {
            return Err(Error::UnsupportedDataType {
                op: "cuBLASLt matmul",
                detail: format!("TF32 math applies to f32 only, the data is {}", T::DTYPE),
            });
        }
        self.bind()?;
        let align = Alignments::uniform(CANDIDATE_ALIGNMENT);
        // The heuristic reads the bias and aux pointers for their alignment only (it never
        // dereferences them): an address aligned to exactly 16 bytes stands for "16-aligned".
        let fake = u64::from(CANDIDATE_ALIGNMENT);
        let descs = Descs::new(op, T::cuda_type(), fake, fake)?;
        let ranked = self.heuristic(op, &descs, &align, count.clamp(1, MAX_CANDIDATES))?;
        let shape = op.shape_code_of(Label::Uniform(T::DTYPE).code());
        Ok(ranked.iter().map(|r| candidate(r, shape, align)).collect())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn run<T: Element>(
        &mut self,
        op: &Matmul,
        alpha: f32,
        a: &impl DeviceBuffer<T>,
        b: &impl DeviceBuffer<T>,
        beta: f32,
        d: &mut impl DeviceBufferMut<T>,
        mut epi: EpilogueData<'_, T>,
        explicit: Option<&Candidate>,
    ) -> Result<Choice> {
        self.check_call(op, a, b, &*d, &epi)?;
        let label = Label::Uniform(T::DTYPE);
        let shape = op.shape_code_of(label.code());
        if let Some(c) = explicit {
            self.check_candidate(label, c, op, shape)?;
        }
        self.bind()?;
        // The guards below borrow this local stream, not `self`, so the cache and the
        // workspace stay mutable while they are alive. Taking the pointers only records cudarc's
        // stream-ordering events: nothing is enqueued that touches memory.
        let stream = self.stream.clone();
        let (ap, _ga) = a.device_ptr(&stream);
        let (bp, _gb) = b.device_ptr(&stream);
        let (dp, _gd) = d.device_ptr_mut(&stream);
        let (bias, aux, _guards) = epi.device_ptrs(&stream);
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
        if let Some(c) = explicit {
            if !align.covers(&c.alignment) {
                return Err(Error::invalid(
                    "pointer alignment",
                    format!("at least what the candidate assumes: {}", c.alignment),
                    align,
                ));
            }
        }
        let descs = Descs::new(op, T::cuda_type(), bias, aux)?;
        let (ranked, source, key, chosen_for) = match explicit {
            // `Candidate::workspace` is a public field, and the candidate may come from another
            // GPU or cuBLASLt: cuBLASLt checks the algorithm against this call's descriptors
            // and says what workspace it needs (the larger of that and the record is used).
            Some(c) => {
                let r = self.algo_check(&descs, &ranked_of(c))?;
                if r.workspace > self.workspace.limit() {
                    return Err(Error::WorkspaceLimit {
                        requested: r.workspace,
                        limit: self.workspace.limit(),
                    });
                }
                (vec![r], Source::Explicit, None, c.alignment)
            }
            None => {
                let (r, s, k) = self.decide::<T>(label, op, &descs, &align, &ptrs, alpha, beta)?;
                (r, s, Some(k), align)
            }
        };
        let call = Call {
            stream: &stream,
            descs: &descs,
            alpha,
            beta,
            ptrs: &ptrs,
        };
        let rank = self.launch_ranked(label, op, &call, &ranked, key.as_ref())?;
        Ok(Choice {
            candidate: candidate(&ranked[rank], shape, chosen_for),
            source,
            rank,
        })
    }

    /// Refuses an explicit candidate found for another problem or needing more workspace than
    /// the limit.
    pub(super) fn check_candidate(
        &self,
        label: Label,
        c: &Candidate,
        op: &Matmul,
        shape: [i64; 8],
    ) -> Result<()> {
        if c.shape != shape {
            return Err(Error::invalid(
                "matmul candidate",
                format!("one found for {op} in {label}"),
                format!("one found for problem {:?}", c.shape),
            ));
        }
        if c.workspace > self.workspace.limit() {
            return Err(Error::WorkspaceLimit {
                requested: c.workspace,
                limit: self.workspace.limit(),
            });
        }
        Ok(())
    }

    /// Launches the first algorithm of `ranked` cuBLASLt accepts and returns its rank. Algorithms
    /// cuBLASLt refuses are dropped from the cache entry under `key`; one whose workspace could
    /// not be allocated is skipped.
    pub(super) fn launch_ranked(
        &mut self,
        label: Label,
        op: &Matmul,
        call: &Call<'_>,
        ranked: &[Ranked],
        key: Option<&Key>,
    ) -> Result<usize> {
        let mut failures = Vec::new();
        let mut refused = Vec::new();
        for (rank, r) in ranked.iter().enumerate() {
            match launch(self.raw.as_ptr(), &mut self.workspace, call, r) {
                Ok(()) => {
                    if rank > 0 {
                        self.stats.fallbacks += 1;
                        log::warn!(
                            "cuBLASLt {op} {label}: fell back to algo {} (rank {rank}) after {}",
                            r.algo_id,
                            failures.join("; ")
                        );
                    }
                    if let (Some(key), false) = (key, refused.is_empty()) {
                        if let Some(e) = self.cache.get_mut(key) {
                            e.ranked.retain(|x| !refused.contains(&x.algo));
                        }
                    }
                    return Ok(rank);
                }
                Err(e @ Error::Blas { .. }) => {
                    // cuBLASLt refused the algorithm (nothing was enqueued): drop it.
                    refused.push(r.algo);
                    failures.push(format!("algo {}: {e}", r.algo_id));
                }
                // The workspace could not grow: an algorithm needing less may still run.
                Err(
                    e @ (Error::WorkspaceLimit { .. }
                    | Error::WorkspaceTooSmall { .. }
                    | Error::Driver { .. }),
                ) => failures.push(format!("algo {}: {e}", r.algo_id)),
                Err(e) => return Err(e),
            }
        }
        Err(Error::NoAlgorithm {
            op: "cuBLASLt matmul",
            detail: format!("{op} in {label}: {}", failures.join("; ")),
        })
    }

    /// Up to `count` supported algorithms from `cublasLtMatmulAlgoGetHeuristic`, best first.
    pub(super) fn heuristic(
        &self,
        op: &Matmul,
        descs: &Descs,
        align: &Alignments,
        count: usize,
    ) -> Result<Vec<Ranked>> {
        let pref = PrefDesc::new(self.workspace.limit(), align)?;
        let mut raw = vec![RawHeuristic::default(); count];
        let mut returned: c_int = 0;
        // SAFETY: live handle, descriptors and preference; `raw` holds `count` (≤ 64) records of
        // the C struct's size and alignment (asserted at compile time), whose status field is a
        // plain integer here; `returned` is a valid out-pointer.
        let status = unsafe {
            sys::cublasLtMatmulAlgoGetHeuristic(
                self.raw.as_ptr(),
                descs.op.0,
                descs.cu_a.0,
                descs.cu_b.0,
                descs.c().0,
                descs.d.0,
                pref.0,
                count as c_int,
                raw.as_mut_ptr()
                    .cast::<sys::cublasLtMatmulHeuristicResult_t>(),
                &mut returned,
            )
        };
        let no_algo = || Error::NoAlgorithm {
            op: "cuBLASLt matmul",
            detail: format!(
                "cuBLASLt's heuristic has no algorithm for {op} with a workspace limit of {} bytes \
                 and pointer alignments {align}",
                self.workspace.limit(),
            ),
        };
        match status.result() {
            Ok(()) => {}
            Err(e) if e.0 == sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => {
                return Err(no_algo())
            }
            Err(e) => return Err(cublaslt_error("cublasLtMatmulAlgoGetHeuristic", e)),
        }
        let n = (returned.max(0) as usize).min(count);
        let ranked: Vec<Ranked> = raw[..n]
            .iter()
            .enumerate()
            .filter(|(_, h)| h.state == 0 && h.workspace_size <= self.workspace.limit())
            .map(|(index, h)| Ranked {
                algo: h.algo,
                workspace: h.workspace_size,
                index,
                waves: h.waves_count,
                ms: -1.0,
                algo_id: algo_id(&h.algo),
            })
            .collect();
        if ranked.is_empty() {
            return Err(no_algo());
        }
        Ok(ranked)
    }

    /// `cublasLtMatmulAlgoCheck`: whether `r` is valid for these descriptors, with the workspace
    /// it needs.
    #[doc(alias = "cublasLtMatmulAlgoCheck")]
    pub(super) fn algo_check(&self, descs: &Descs, r: &Ranked) -> Result<Ranked> {
        let algo = sys::cublasLtMatmulAlgo_t { data: r.algo };
        let mut out = RawHeuristic::default();
        // SAFETY: live handle and descriptors; `algo` is a 64-byte algorithm descriptor this
        // crate stored (checksummed in the file) for the same GPU model and cuBLASLt version,
        // which cuBLASLt validates here; `out` has the C result struct's layout (status kept as
        // an integer).
        let status = unsafe {
            sys::cublasLtMatmulAlgoCheck(
                self.raw.as_ptr(),
                descs.op.0,
                descs.cu_a.0,
                descs.cu_b.0,
                descs.c().0,
                descs.d.0,
                &algo,
                (&mut out as *mut RawHeuristic).cast::<sys::cublasLtMatmulHeuristicResult_t>(),
            )
        };
        status
            .result()
            .map_err(|e| cublaslt_error("cublasLtMatmulAlgoCheck", e))?;
        if out.state != 0 {
            return Err(Error::Blas {
                library: "cuBLASLt",
                function: "cublasLtMatmulAlgoCheck",
                status: format!("state {}", out.state),
            });
        }
        Ok(Ranked {
            workspace: r.workspace.max(out.workspace_size),
            ..*r
        })
    }
}

/// `CUBLASLT_ALGO_CONFIG_ID` of an algorithm, or −1.
pub(super) fn algo_id(data: &[u64; 8]) -> i32 {
    let algo = sys::cublasLtMatmulAlgo_t { data: *data };
    let mut id: i32 = -1;
    let mut written = 0usize;
    // SAFETY: `algo` is an algorithm descriptor cuBLASLt returned; `id` is an i32 out-buffer of
    // the size passed (the attribute is an int32), `written` a valid out-pointer.
    let status = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            &algo,
            sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_ID,
            (&mut id as *mut i32).cast::<c_void>(),
            size_of::<i32>(),
            &mut written,
        )
    };
    if status.result().is_ok() && written == size_of::<i32>() {
        id
    } else {
        -1
    }
}

/// Enqueues one `cublasLtMatmul` with algorithm `r` (growing the workspace to what it needs).
pub(super) fn launch(
    handle: sys::cublasLtHandle_t,
    workspace: &mut Workspace,
    call: &Call<'_>,
    r: &Ranked,
) -> Result<()> {
    let Call {
        stream,
        descs,
        alpha,
        beta,
        ptrs,
    } = *call;
    workspace.prepare(r.workspace)?;
    let (wsp, _gws) = workspace.device_ptr_mut(stream)?;
    let algo = sys::cublasLtMatmulAlgo_t { data: r.algo };
    // SAFETY: live handle and descriptors built for this call's shape, transposes and dtype;
    // every buffer was checked to hold at least what its layout addresses (and the bias/aux
    // vectors what the epilogue reads or writes) and to live on the handle's context, and the
    // cudarc guards that produced the pointers are alive in the caller until after this call is
    // enqueued; D does not alias A, B or an epilogue input (exclusive borrow); the algorithm came
    // from cuBLASLt's heuristic for these descriptors with pointer alignments no larger than the
    // actual ones (or was checked by cublasLtMatmulAlgoCheck / tied to this problem); the
    // workspace holds at least `r.workspace` bytes; alpha/beta are f32, the scale type.
    unsafe {
        result::matmul(
            handle,
            descs.op.0,
            (&alpha as *const f32).cast::<c_void>(),
            (&beta as *const f32).cast::<c_void>(),
            ptrs.b as *const c_void,
            descs.cu_a.0,
            ptrs.a as *const c_void,
            descs.cu_b.0,
            ptrs.d as *const c_void,
            descs.c().0,
            ptrs.d as *mut c_void,
            descs.d.0,
            &algo,
            wsp,
            r.workspace,
            stream.cu_stream().cast(),
        )
    }
    .map_err(|e| cublaslt_error("cublasLtMatmul", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_largest_power_of_two_up_to_256() {
        assert_eq!(alignment_of(0x1000), 256);
        assert_eq!(alignment_of(0x1010), 16);
        assert_eq!(alignment_of(0x1002), 2);
        assert_eq!(alignment_of(0x1001), 1);
        assert_eq!(alignment_of(0), 256);
    }
}
