//! [`BlasLt`]: the cuBLASLt handle, its configuration and its lifetime.
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaContext, CudaStream};

use super::tune::{Entry, Key};
#[cfg(doc)]
use super::{Epilogue, Matmul};
use super::{
    Policy, Stats, CACHE_ENV, DEFAULT_AUTOTUNE_CANDIDATES, DEFAULT_WORKSPACE, MAX_CANDIDATES,
};
use crate::blas::{self, cublaslt_error, require_cublaslt};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::workspace::Workspace;

/// A cuBLASLt handle (`cublasLtHandle_t`) bound to one CUDA stream, with its workspace, its
/// algorithm policy and its decision cache. Its [`matmul`](BlasLt::matmul) computes
///
/// ```text
/// D[m×n] = epilogue(alpha · op(A) · op(B) + beta · D + bias)
/// ```
///
/// where every matrix is **row-major and densely packed** (row length = leading dimension):
///
/// * `A` is stored `m×k`, or `k×m` when [`Matmul::with_transpose_a`] is set (`op(A) = Aᵀ`);
/// * `B` is stored `k×n`, or `n×k` when [`Matmul::with_transpose_b`] is set — the usual case for a
///   weight `W[out×in]` of a linear layer: `y = x · Wᵀ` is [`Matmul::linear`];
/// * `D` is `m×n`; with `beta ≠ 0` its old contents are accumulated (C and D are the same buffer);
/// * `bias` has length `n`: `bias[j]` is added to every element of output column `j` (one bias
///   per output feature, as in `nn.Linear`).
///
/// # How the row-major problem reaches cuBLASLt
///
/// cuBLASLt is column-major. A row-major `m×n` matrix is, byte for byte, the column-major `n×m`
/// matrix `Dᵀ`, so the call computes `Dᵀ = op(B)ᵀ · op(A)ᵀ`: cuBLASLt's "A" is our `B` (with
/// `TRANSA = transpose_b`), its "B" is our `A` (with `TRANSB = transpose_a`), and its `M, N, K` are
/// our `n, m, k`. No data moves; only the descriptors change. cuBLASLt's bias vector runs along
/// the rows of its column-major `D` (length `M = n`), which are the columns of our row-major `D`:
/// the bias is per output column. [`Epilogue::BiasGrad`] is `CUBLASLT_EPILOGUE_BGRADB` — the
/// reduction of cuBLASLt's "B" (our `op(A)`) over `k` — so it writes `db[i] = Σ_k op(A)[i, k]` for
/// `i < m`: with `A = dy` stored `batch×out` and `transpose_a`, that is `db = column sums of dy`,
/// the bias gradient of a linear layer, computed alongside `dW = dyᵀ · x`.
///
/// # Algorithms
///
/// Under [`Policy::Heuristic`] (the default) the call runs cuBLASLt's first heuristic choice;
/// under [`Policy::Benchmark`] the top candidates (8 by default) are each timed on the call's own
/// buffers with CUDA events and the fastest is kept. Either decision is cached per problem (shape,
/// transposes, dtype, compute type, epilogue, pointer alignments, workspace limit, policy, GPU
/// model and cuBLASLt version) in memory and, optionally, in a file
/// ([`BlasLt::cache_file`] or `CUDNN_SAFE_LT_AUTOTUNE_CACHE`), and logged with `log::info!`.
/// With `beta ≠ 0` the autotune writes to scratch memory so the accumulated `D` is preserved.
///
/// # Alignment
///
/// cuBLASLt kernels may assume aligned pointers. Each call measures the alignment of every
/// pointer (the largest power of two dividing its address, up to 256 bytes) and passes it to the
/// heuristic (`CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES`, and the bias/aux pointers themselves,
/// which cuBLASLt inspects for alignment), so views at odd offsets get algorithms that support
/// them (possibly slower ones, or none: then [`Error::NoAlgorithm`]). Alignments are part of the
/// cache key. An explicit candidate from [`BlasLt::candidates`] assumes 16-byte alignment, which
/// every cudarc allocation has; running it on a less aligned buffer is refused before launch.
///
/// ```no_run
/// use cudnn_safe::blas::lt::{BlasLt, Epilogue, EpilogueData, Matmul};
/// use cudnn_safe::half::bf16;
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cudnn_safe::cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let mut lt = BlasLt::new(stream.clone())?;
/// // y[64×256] = gelu(x[64×128] · W[256×128]ᵀ + b[256])
/// let op = Matmul::linear(64, 128, 256)?.with_epilogue(Epilogue::BiasGelu);
/// let x = stream.clone_htod(&vec![bf16::from_f32(0.5); op.a_len()]).unwrap();
/// let w = stream.clone_htod(&vec![bf16::from_f32(0.01); op.b_len()]).unwrap();
/// let b = stream.clone_htod(&vec![bf16::from_f32(0.1); op.bias_len()]).unwrap();
/// let mut y = stream.alloc_zeros::<bf16>(op.d_len()).unwrap();
/// let choice = lt.matmul(&op, 1.0, &x, &w, 0.0, &mut y, EpilogueData::bias(&b))?;
/// println!("ran cuBLASLt algo {} ({:?})", choice.candidate.algo_id, choice.source);
/// # Ok(()) }
/// ```
///
/// Send, not `Sync`: cuBLASLt handles must not be used by two threads at once, and every call
/// updates the cache (`&mut self`).
///
/// ```no_run
/// use cudnn_safe::blas::lt::{BlasLt, Policy};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cudnn_safe::cuda_context(0)?;
/// let lt = BlasLt::new(ctx.default_stream())?
///     .with_workspace_limit(64 << 20)
///     .with_policy(Policy::Benchmark)
///     .cache_file("lt-autotune.txt");
/// println!("cuBLASLt {}", lt.version());
/// # Ok(()) }
/// ```
pub struct BlasLt {
    pub(super) raw: NonNull<sys::cublasLtContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) workspace: Workspace,
    pub(super) policy: Policy,
    pub(super) top_n: usize,
    pub(super) version: usize,
    pub(super) device: Option<Arc<str>>,
    pub(super) cache: HashMap<Key, Entry>,
    pub(super) path: Option<PathBuf>,
    pub(super) stats: Stats,
}

// SAFETY: a cuBLASLt handle may be used from any thread as long as no two threads use it at the
// same time; `BlasLt` is not `Sync` and all its launches take `&mut self`, so moving it is the
// only way to share it, and every call binds the stream's CUDA context to the calling thread
// first. The other fields (Arc<CudaStream>, the workspace's CudaSlice, plain data) are Send.
unsafe impl Send for BlasLt {}

impl fmt::Debug for BlasLt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlasLt")
            .field("device", &self.stream.context().ordinal())
            .field("version", &self.version)
            .field("policy", &self.policy)
            .field("workspace_limit", &self.workspace.limit())
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl BlasLt {
    /// Creates a cuBLASLt handle for `stream`'s context, with the default
    /// [`DEFAULT_WORKSPACE`] limit, [`Policy::Heuristic`], and the cache file named by
    /// `CUDNN_SAFE_LT_AUTOTUNE_CACHE` when that is set (read now).
    ///
    /// Without cuBLASLt this is [`Error::LibraryMissing`], never a panic.
    #[doc(alias = "cublasLtCreate")]
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        require_cublaslt()?;
        blas::bind(&stream)?;
        let h = result::create_handle().map_err(|e| cublaslt_error("cublasLtCreate", e))?;
        let raw = blas::created(h, "cuBLASLt", "cublasLtCreate")?;
        // SAFETY: a plain query of the loaded library (present, checked above).
        let version = unsafe { sys::cublasLtGetVersion() };
        let lt = BlasLt {
            raw,
            workspace: Workspace::new(stream.clone()).with_limit(DEFAULT_WORKSPACE),
            stream,
            policy: Policy::Heuristic,
            top_n: DEFAULT_AUTOTUNE_CANDIDATES,
            version,
            device: None,
            cache: HashMap::new(),
            path: None,
            stats: Stats::default(),
        };
        Ok(match std::env::var_os(CACHE_ENV) {
            Some(p) if !p.is_empty() => lt.cache_file(PathBuf::from(p)),
            _ => lt,
        })
    }

    /// Limits the workspace any algorithm may use (bytes; 0 = algorithms without workspace
    /// only). Part of the cache key.
    #[must_use]
    pub fn with_workspace_limit(mut self, bytes: usize) -> Self {
        self.set_workspace_limit(bytes);
        self
    }

    /// As [`with_workspace_limit`](Self::with_workspace_limit), in place (frees the workspace).
    pub fn set_workspace_limit(&mut self, bytes: usize) {
        self.workspace = Workspace::new(self.stream.clone()).with_limit(bytes);
    }

    /// Sets the policy for problems not decided yet.
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Changes the policy (decisions made under the other policy stay cached under their key).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// How many heuristic candidates an autotune times (clamped to 1..=64; default
    /// [`DEFAULT_AUTOTUNE_CANDIDATES`]). Part of the key.
    #[must_use]
    pub fn with_autotune_candidates(mut self, n: usize) -> Self {
        self.top_n = n.clamp(1, MAX_CANDIDATES);
        self
    }

    /// How many heuristic candidates an autotune times.
    pub fn autotune_candidates(&self) -> usize {
        self.top_n
    }

    /// Moves the handle to another stream of the same CUDA context.
    pub fn set_stream(&mut self, stream: Arc<CudaStream>) -> Result<()> {
        blas::same_context("stream", &self.stream, &stream)?;
        self.stream = stream;
        Ok(())
    }

    /// The stream operations are enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The CUDA context of the handle.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }
    /// `cublasLtGetVersion()` (e.g. `130100`).
    #[doc(alias = "cublasLtGetVersion")]
    pub fn version(&self) -> usize {
        self.version
    }
    /// The policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }
    /// The workspace limit in bytes.
    pub fn workspace_limit(&self) -> usize {
        self.workspace.limit()
    }
    /// Bytes of workspace currently allocated (grown on demand up to the limit).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.capacity()
    }
    /// Hit/miss/autotune/fallback counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }
    /// Decisions cached (all devices, including unchecked file entries).
    pub fn cached_decisions(&self) -> usize {
        self.cache.len()
    }
    /// The cache file, if any.
    pub fn cache_path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    /// Forgets every decision in memory (the file is left as it is).
    pub fn clear(&mut self) {
        self.cache.clear();
    }
    /// The raw handle, for cuBLASLt functions this crate does not wrap. It stays owned by `self`.
    pub fn as_raw(&self) -> sys::cublasLtHandle_t {
        self.raw.as_ptr()
    }

    pub(super) fn bind(&self) -> Result<()> {
        blas::bind(&self.stream)
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        if let Err(e) = self.bind() {
            log::warn!("dropping a cuBLASLt handle: {e}");
        }
        // SAFETY: the handle was created by cublasLtCreate and is destroyed exactly once; work
        // already enqueued keeps running.
        if let Err(e) = unsafe { result::destroy_handle(self.raw.as_ptr()) } {
            log::warn!("cublasLtDestroy: {e}");
        }
    }
}
