//! The crate's element-wise activation kernels, forward and backward, generated from one CUDA
//! C++ template ([`TEMPLATE`]) and compiled at run time with NVRTC (`nvrtc.rs`).
//!
//! Each activation ([`ActOp`]) contributes two bodies in `float`: the forward `f(x, p)` and the
//! backward `dy·f′` from `dy`, the parameter `p` (ELU's alpha, swish's β; unused by the others)
//! and one saved tensor, the input `x` or the output `y` ([`Saved`]), as PyTorch's backward reads
//! it. The template turns them into two kernels per direction and element type (f32, f16, bf16,
//! loaded and stored as their bits and converted with `cvt` or bit operations, so no header is
//! needed):
//!
//! * `act_<op>_<type>_fwd_vec`: `y[i] = alpha·f(x[i]) + beta·y[i]`, one 16-byte vector of each
//!   tensor per thread per trip of a grid-stride loop, then the last `n mod V` elements one per
//!   thread (`V` = 4 for f32, 8 for f16 and bf16); every pointer 16-byte aligned;
//! * `act_<op>_<type>_fwd`: the same one element per thread per trip, any element-aligned
//!   pointers (a view starting one element into a buffer);
//! * `act_<op>_<type>_bwd_vec` and `_bwd`: `dx[i] = alpha·g(s[i], dy[i]) + beta·dx[i]` likewise,
//!   `s` being `x` or `y`.
//!
//! `y` (or `dx`) is not read when `beta == 0`, so NaN left there does not leak. Indexing is
//! 64-bit. Each element is read and then written by one thread, so in place (`x == y`,
//! `dy == dx`) is sound; the kernels use plain loads, no read-only path, for that reason.
//!
//! One module per (activation, element type, direction) is compiled, once per process and GPU
//! architecture, by the first launch that needs it, and loaded once per handle
//! ([`ElementwiseCache`]); a failure to compile or load is remembered the same way. (Compiling
//! all 36 up front would take seconds; one takes a tenth to a fifth of a second.)
use std::cell::OnceCell;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::nvrtc::{self, Image};
use super::{blocks, BLOCK};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;

/// An activation the template covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ActOp {
    /// `1 / (1 + e^−x)`; backward from `y`: `dy·y·(1 − y)`.
    Sigmoid,
    /// `tanh x`; backward from `y`: `dy·(1 − y²)`.
    Tanh,
    /// `x·σ(p·x)`; backward from `x`: `dy·s·(1 + p·x·(1 − s))`, `s = σ(p·x)`.
    Swish,
    /// `x` for `x > 0`, else `p·(eˣ − 1)`; backward from `x`: `dy` for `x > 0`, else `dy·p·eˣ`.
    Elu,
    /// `x·Φ(x)` with the exact normal CDF (erf); backward from `x`: `dy·(Φ(x) + x·φ(x))`.
    Gelu,
    /// PyTorch's `gelu(x, approximate='tanh')`: `x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`;
    /// backward from `x`, PyTorch's formula.
    GeluTanh,
}

/// Which tensor a backward kernel reads beside `dy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Saved {
    /// The forward's input `x`.
    X,
    /// The forward's output `y`.
    Y,
}

impl ActOp {
    /// Every activation, in the order of their cache slots.
    pub(crate) const ALL: [ActOp; 6] = [
        ActOp::Sigmoid,
        ActOp::Tanh,
        ActOp::Swish,
        ActOp::Elu,
        ActOp::Gelu,
        ActOp::GeluTanh,
    ];

    /// The name in kernel names.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ActOp::Sigmoid => "sigmoid",
            ActOp::Tanh => "tanh",
            ActOp::Swish => "swish",
            ActOp::Elu => "elu",
            ActOp::Gelu => "gelu",
            ActOp::GeluTanh => "gelu_tanh",
        }
    }

    /// The tensor the backward reads beside `dy` (as PyTorch's backward does).
    pub(crate) fn saved(self) -> Saved {
        match self {
            ActOp::Sigmoid | ActOp::Tanh => Saved::Y,
            ActOp::Swish | ActOp::Elu | ActOp::Gelu | ActOp::GeluTanh => Saved::X,
        }
    }

    /// The forward body: statements in `float x` and `float p` ending in `return f(x);`.
    fn forward(self) -> &'static str {
        match self {
            ActOp::Sigmoid => "return 1.0f / (1.0f + expf(-x));",
            ActOp::Tanh => "return tanhf(x);",
            ActOp::Swish => "return x / (1.0f + expf(-p * x));",
            ActOp::Elu => "return x > 0.0f ? x : p * expm1f(x);",
            ActOp::Gelu => "return 0.5f * x * (1.0f + erff(x * K_SQRT1_2));",
            ActOp::GeluTanh => {
                "const float inner = K_SQRT_2_OVER_PI * (x + K_GELU_KAPPA * x * x * x);\n\
                 \x20   return 0.5f * x * (1.0f + tanhf(inner));"
            }
        }
    }

    /// The backward body: statements in `float dy`, `float p` and the saved `float x` or
    /// `float y` ([`Self::saved`]), ending in `return dy·f′;`.
    fn backward(self) -> &'static str {
        match self {
            ActOp::Sigmoid => "return dy * (1.0f - y) * y;",
            ActOp::Tanh => "return dy * (1.0f - y * y);",
            ActOp::Swish => {
                "const float s = 1.0f / (1.0f + expf(-p * x));\n\
                 \x20   return dy * s * (1.0f + p * x * (1.0f - s));"
            }
            ActOp::Elu => "return x > 0.0f ? dy : dy * p * expf(x);",
            ActOp::Gelu => {
                "const float cdf = 0.5f * (1.0f + erff(x * K_SQRT1_2));\n\
                 \x20   const float pdf = K_INV_SQRT_2PI * expf(-0.5f * x * x);\n\
                 \x20   return dy * (cdf + x * pdf);"
            }
            ActOp::GeluTanh => {
                "const float x2 = x * x;\n\
                 \x20   const float t = tanhf(K_SQRT_2_OVER_PI * (x + K_GELU_KAPPA * x2 * x));\n\
                 \x20   const float left = 0.5f * x;\n\
                 \x20   const float right = 1.0f + t;\n\
                 \x20   const float dright = (1.0f - t * t) * K_SQRT_2_OVER_PI\n\
                 \x20       * (1.0f + 3.0f * K_GELU_KAPPA * x2);\n\
                 \x20   return dy * (0.5f * right + left * dright);"
            }
        }
    }
}

/// An element type the template covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Elem {
    F32,
    F16,
    Bf16,
}

impl Elem {
    /// Every element type, in the order of their cache slots.
    pub(crate) const ALL: [Elem; 3] = [Elem::F32, Elem::F16, Elem::Bf16];

    /// The element type of `dtype`, if the template covers it.
    pub(crate) fn of(dtype: DType) -> Option<Elem> {
        match dtype {
            DType::F32 => Some(Elem::F32),
            DType::F16 => Some(Elem::F16),
            DType::BF16 => Some(Elem::Bf16),
            _ => None,
        }
    }

    /// The name in kernel names.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::F16 => "f16",
            Elem::Bf16 => "bf16",
        }
    }

    /// The template's conversion struct.
    fn traits(self) -> &'static str {
        match self {
            Elem::F32 => "F32",
            Elem::F16 => "F16",
            Elem::Bf16 => "BF16",
        }
    }

    /// Bytes per element.
    pub(crate) fn size(self) -> u64 {
        match self {
            Elem::F32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }

    /// Elements per 16-byte vector.
    pub(crate) fn per_vector(self) -> u64 {
        16 / self.size()
    }
}

/// The direction of a module (each module holds one direction's two kernels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Dir {
    Forward,
    Backward,
}

impl Dir {
    const ALL: [Dir; 2] = [Dir::Forward, Dir::Backward];
    fn suffix(self) -> &'static str {
        match self {
            Dir::Forward => "fwd",
            Dir::Backward => "bwd",
        }
    }
}

/// The name of the kernel of `op` on `elem` in direction `dir`: `act_<op>_<type>_<fwd|bwd>`,
/// with `_vec` for the 16-byte vector one.
pub(crate) fn kernel_name(op: ActOp, elem: Elem, dir: Dir, vector: bool) -> String {
    let vec = if vector { "_vec" } else { "" };
    format!("act_{}_{}_{}{vec}", op.name(), elem.name(), dir.suffix())
}

/// The module's key in the process-wide compile cache (and its name in NVRTC's messages).
fn module_key(op: ActOp, elem: Elem, dir: Dir) -> String {
    format!("{}.cu", kernel_name(op, elem, dir, false))
}

/// The CUDA C++ shared by every module: element conversions, the 16-byte vector, and the
/// forward and backward loops as templates over an element type `D` and an activation `Op`.
/// [`source`] appends the activation's `struct Op` and one direction's two `extern "C"` entry
/// points.
pub(crate) const TEMPLATE: &str = r#"// cudnn-safe: element-wise activation kernels (generated; see src/fast/elementwise.rs).
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define K_SQRT1_2 0.70710678118654752440f
#define K_INV_SQRT_2PI 0.39894228040143267794f
#define K_SQRT_2_OVER_PI 0.79788456080286535588f
#define K_GELU_KAPPA 0.044715f

// Element types: the stored bits R and their conversions to and from float (round to nearest
// even, NaN kept NaN).
struct F32 {
  typedef float R;
  static __device__ __forceinline__ float load(R v) { return v; }
  static __device__ __forceinline__ R store(float f) { return f; }
};
struct F16 {
  typedef u16 R;
  static __device__ __forceinline__ float load(R v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
  }
  static __device__ __forceinline__ R store(float f) {
    R v;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(v) : "f"(f));
    return v;
  }
};
struct BF16 {
  typedef u16 R;
  static __device__ __forceinline__ float load(R v) { return __uint_as_float(((u32)v) << 16); }
  static __device__ __forceinline__ R store(float f) {
#if __CUDA_ARCH__ >= 800
    R v;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(v) : "f"(f));
    return v;
#else
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (R)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (R)(u >> 16);
#endif
  }
};

// 16 bytes: one vector load or store, seen as 16 / sizeof(R) elements.
template <class R> union Pack {
  uint4 v;
  R e[16 / sizeof(R)];
};

template <class D, class Op>
__device__ __forceinline__ void forward_vec(const typename D::R* x, typename D::R* y, u64 n,
                                            float alpha, float beta, float p) {
  typedef typename D::R R;
  const int V = 16 / sizeof(R);
  const u64 units = n / V;
  const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const bool blend = beta != 0.0f;
  for (u64 u = t; u < units; u += stride) {
    Pack<R> a, o, r;
    a.v = reinterpret_cast<const uint4*>(x)[u];
    if (blend) o.v = reinterpret_cast<const uint4*>(y)[u];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = alpha * Op::fwd(D::load(a.e[k]), p);
      if (blend) v = fmaf(beta, D::load(o.e[k]), v);
      r.e[k] = D::store(v);
    }
    reinterpret_cast<uint4*>(y)[u] = r.v;
  }
  const u64 done = units * V;
  if (t < n - done) {
    const u64 i = done + t;
    float v = alpha * Op::fwd(D::load(x[i]), p);
    if (blend) v = fmaf(beta, D::load(y[i]), v);
    y[i] = D::store(v);
  }
}

template <class D, class Op>
__device__ __forceinline__ void forward_scalar(const typename D::R* x, typename D::R* y, u64 n,
                                               float alpha, float beta, float p) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const bool blend = beta != 0.0f;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = alpha * Op::fwd(D::load(x[i]), p);
    if (blend) v = fmaf(beta, D::load(y[i]), v);
    y[i] = D::store(v);
  }
}

template <class D, class Op>
__device__ __forceinline__ void backward_vec(const typename D::R* s, const typename D::R* dy,
                                             typename D::R* dx, u64 n, float alpha, float beta,
                                             float p) {
  typedef typename D::R R;
  const int V = 16 / sizeof(R);
  const u64 units = n / V;
  const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const bool blend = beta != 0.0f;
  for (u64 u = t; u < units; u += stride) {
    Pack<R> a, g, o, r;
    a.v = reinterpret_cast<const uint4*>(s)[u];
    g.v = reinterpret_cast<const uint4*>(dy)[u];
    if (blend) o.v = reinterpret_cast<const uint4*>(dx)[u];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = alpha * Op::bwd(D::load(a.e[k]), D::load(g.e[k]), p);
      if (blend) v = fmaf(beta, D::load(o.e[k]), v);
      r.e[k] = D::store(v);
    }
    reinterpret_cast<uint4*>(dx)[u] = r.v;
  }
  const u64 done = units * V;
  if (t < n - done) {
    const u64 i = done + t;
    float v = alpha * Op::bwd(D::load(s[i]), D::load(dy[i]), p);
    if (blend) v = fmaf(beta, D::load(dx[i]), v);
    dx[i] = D::store(v);
  }
}

template <class D, class Op>
__device__ __forceinline__ void backward_scalar(const typename D::R* s, const typename D::R* dy,
                                                typename D::R* dx, u64 n, float alpha,
                                                float beta, float p) {
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const bool blend = beta != 0.0f;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = alpha * Op::bwd(D::load(s[i]), D::load(dy[i]), p);
    if (blend) v = fmaf(beta, D::load(dx[i]), v);
    dx[i] = D::store(v);
  }
}
"#;

/// The forward part of a module: the activation's forward body as `struct Op`, then the two
/// forward entry points. `$`-names are substituted by [`source`].
const FORWARD_ENTRIES: &str = r#"
// $OP forward on $ELEM.
struct Op {
  static __device__ __forceinline__ float fwd(float x, float p) {
    $BODY
  }
};

extern "C" __global__ void __launch_bounds__($BLOCK)
$NAME_vec(const $D::R* x, $D::R* y, u64 n, float alpha, float beta, float p) {
  forward_vec<$D, Op>(x, y, n, alpha, beta, p);
}
extern "C" __global__ void __launch_bounds__($BLOCK)
$NAME(const $D::R* x, $D::R* y, u64 n, float alpha, float beta, float p) {
  forward_scalar<$D, Op>(x, y, n, alpha, beta, p);
}
"#;

/// The backward part of a module, likewise; `$SAVED` names the tensor the body reads.
const BACKWARD_ENTRIES: &str = r#"
// $OP backward on $ELEM.
struct Op {
  static __device__ __forceinline__ float bwd(float $SAVED, float dy, float p) {
    $BODY
  }
};

extern "C" __global__ void __launch_bounds__($BLOCK)
$NAME_vec(const $D::R* s, const $D::R* dy, $D::R* dx, u64 n, float alpha, float beta,
          float p) {
  backward_vec<$D, Op>(s, dy, dx, n, alpha, beta, p);
}
extern "C" __global__ void __launch_bounds__($BLOCK)
$NAME(const $D::R* s, const $D::R* dy, $D::R* dx, u64 n, float alpha, float beta, float p) {
  backward_scalar<$D, Op>(s, dy, dx, n, alpha, beta, p);
}
"#;

/// The complete CUDA C++ source of the module of `op` on `elem` in direction `dir`:
/// [`TEMPLATE`], then the direction's entries with the activation's body, the element type and
/// the kernel name `act_<op>_<type>_<fwd|bwd>` substituted. (Only the direction's templates
/// are instantiated, so a module compiles in about half the time of one with both.)
pub(crate) fn source(op: ActOp, elem: Elem, dir: Dir) -> String {
    let (entries, body) = match dir {
        Dir::Forward => (FORWARD_ENTRIES, op.forward()),
        Dir::Backward => (BACKWARD_ENTRIES, op.backward()),
    };
    let saved = match op.saved() {
        Saved::X => "x",
        Saved::Y => "y",
    };
    let entries = entries
        .replace("$BODY", body)
        .replace("$SAVED", saved)
        .replace("$NAME", &kernel_name(op, elem, dir, false))
        .replace("$OP", op.name())
        .replace("$ELEM", elem.name())
        .replace("$BLOCK", &BLOCK.to_string())
        .replace("$D", elem.traits());
    let mut s = String::with_capacity(TEMPLATE.len() + entries.len());
    s.push_str(TEMPLATE);
    s.push_str(&entries);
    s
}

/// One loaded module: one direction's kernels.
pub(crate) struct ActModule {
    /// One element per thread per trip, element-aligned pointers.
    scalar: CudaFunction,
    /// One 16-byte vector per thread per trip, 16-byte aligned pointers.
    vector: CudaFunction,
}

/// Cache slots, one per (activation, element type, direction).
const SLOTS: usize = ActOp::ALL.len() * Elem::ALL.len() * Dir::ALL.len();

fn slot(op: ActOp, elem: Elem, dir: Dir) -> usize {
    let o = ActOp::ALL.iter().position(|&a| a == op).unwrap_or(0);
    let e = Elem::ALL.iter().position(|&a| a == elem).unwrap_or(0);
    let d = Dir::ALL.iter().position(|&a| a == dir).unwrap_or(0);
    (o * Elem::ALL.len() + e) * Dir::ALL.len() + d
}

/// The modules of one handle: each slot empty until the first launch of its activation, type
/// and direction, then the loaded module or the reason it is not available (remembered: the
/// handle then stays on cuDNN for it, or reports the reason for GELU).
pub(crate) struct ElementwiseCache([OnceCell<std::result::Result<ActModule, String>>; SLOTS]);

impl Default for ElementwiseCache {
    fn default() -> Self {
        ElementwiseCache(std::array::from_fn(|_| OnceCell::new()))
    }
}

impl ElementwiseCache {
    /// Whether any module was loaded (so launches from it may still be in flight).
    pub(crate) fn any_loaded(&self) -> bool {
        self.0.iter().any(|c| matches!(c.get(), Some(Ok(_))))
    }
}

/// What a launch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The kernel was enqueued.
    Launched,
    /// Nothing was enqueued, for this reason (no NVRTC, compilation or loading failed, a
    /// pointer not aligned to the element size).
    Unavailable(String),
}

/// The kernel for the pointers of one launch (byte addresses): the vector kernel (`true`) when
/// every one is 16-byte aligned, the scalar one when every one is aligned to the element size,
/// `None` otherwise.
pub(crate) fn pick_vector(ptrs: &[CUdeviceptr], elem: Elem) -> Option<bool> {
    if ptrs.iter().all(|p| p % 16 == 0) {
        Some(true)
    } else if ptrs.iter().all(|p| p % elem.size() == 0) {
        Some(false)
    } else {
        None
    }
}

impl Cudnn {
    /// The handle's module for `op` on `elem` in direction `dir`: compiled (once per process)
    /// and loaded (once per handle) on first use; the reason when it is not available.
    fn act_module(&self, op: ActOp, elem: Elem, dir: Dir) -> std::result::Result<&ActModule, &str> {
        let cell = &self.fast.elementwise.0[slot(op, elem, dir)];
        cell.get_or_init(|| {
            let loaded = self.load_act_module(op, elem, dir);
            if let Err(e) = &loaded {
                let then = if matches!(op, ActOp::Gelu | ActOp::GeluTanh) {
                    "GELU fails with this reason"
                } else {
                    "using cuDNN"
                };
                log::debug!(
                    "cudnn-safe's {} {} kernels for {} are not available ({e}); {then}",
                    op.name(),
                    dir.suffix(),
                    elem.name(),
                );
            }
            loaded
        })
        .as_ref()
        .map_err(String::as_str)
    }

    fn load_act_module(
        &self,
        op: ActOp,
        elem: Elem,
        dir: Dir,
    ) -> std::result::Result<ActModule, String> {
        let ctx = self.context();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("reading the GPU's compute capability: {e}"))?;
        let cc = major * 10 + minor;
        let key = module_key(op, elem, dir);
        let (image, took) = nvrtc::compile_cached(&key, cc, || source(op, elem, dir))?;
        log::debug!("{key} for compute capability {cc}: NVRTC took {took:?}");
        let ptx = match &*image {
            Image::Cubin(bytes) => Ptx::from_binary(bytes.clone()),
            Image::Ptx(text) => Ptx::from_src(text.clone()),
        };
        let module = ctx
            .load_module(ptx)
            .map_err(|e| format!("loading {key}: {e}"))?;
        let function = |vector: bool| {
            let name = kernel_name(op, elem, dir, vector);
            module
                .load_function(&name)
                .map_err(|e| format!("kernel {name}: {e}"))
        };
        Ok(ActModule {
            scalar: function(false)?,
            vector: function(true)?,
        })
    }

    /// The kernel of `op` on `elem` in direction `dir` for `ptrs`, and the blocks for `n`
    /// elements; the reason when there is none.
    fn act_kernel(
        &self,
        op: ActOp,
        elem: Elem,
        dir: Dir,
        ptrs: &[CUdeviceptr],
        n: u64,
    ) -> std::result::Result<(&CudaFunction, u32), String> {
        let vector = pick_vector(ptrs, elem)
            .ok_or_else(|| format!("a pointer is not aligned to {} bytes", elem.size()))?;
        let module = self.act_module(op, elem, dir).map_err(str::to_string)?;
        Ok(if vector {
            (&module.vector, blocks(n / elem.per_vector()))
        } else {
            (&module.scalar, blocks(n))
        })
    }

    /// Enqueues `y[i] = alpha·f(x[i]) + beta·y[i]` for `i` in `0..n` on the handle's stream
    /// with the kernel of `op` on `elem` (`y` not read when `beta == 0`; `param` is ELU's
    /// alpha or swish's β). [`Outcome::Unavailable`], with nothing enqueued, when the kernels
    /// are not available or a pointer is not aligned to the element size.
    ///
    /// # Safety
    ///
    /// `x` and `y` are device addresses on this handle's context, each valid for `n` elements
    /// of `elem` (`x` for reads, `y` for reads and writes), alive and ordered on
    /// [`Cudnn::stream`] until this returns (the caller holds cudarc's guards). Either `x == y`
    /// (in place) or the two ranges are disjoint.
    #[allow(clippy::too_many_arguments)] // the kernel's parameters
    pub(crate) unsafe fn act_forward_fast(
        &self,
        op: ActOp,
        elem: Elem,
        x: CUdeviceptr,
        y: CUdeviceptr,
        n: usize,
        alpha: f32,
        beta: f32,
        param: f32,
    ) -> Result<Outcome> {
        let n = n as u64;
        let (func, blocks) = match self.act_kernel(op, elem, Dir::Forward, &[x, y], n) {
            Ok(k) => k,
            Err(why) => return Ok(Outcome::Unavailable(why)),
        };
        if n == 0 {
            return Ok(Outcome::Launched);
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = self.stream();
        let mut launch = stream.launch_builder(func);
        launch
            .arg(&x)
            .arg(&y)
            .arg(&n)
            .arg(&alpha)
            .arg(&beta)
            .arg(&param);
        // SAFETY: the arguments match the kernel's parameters one for one in type and order
        // (two pointers, u64, three floats; `ENTRIES`). The kernel touches exactly the elements
        // `0..n` of `x` and `y` (units `u < n / V` cover `V·u..V·u + V`, the tail
        // `V·(n / V)..n`, the scalar loop `0..n`), which the caller guarantees are valid, on
        // this context, alive and ordered on this stream. The vector kernel is picked only when
        // both pointers are 16-byte aligned (its `uint4` accesses need it), the scalar one when
        // they are aligned to the element size. Each element is read and then written by one
        // thread with plain loads, so `x == y` is sound. The grid is at least one block, at
        // most the grid's x limit, of `BLOCK` threads (the kernels' `__launch_bounds__`), no
        // shared memory.
        unsafe { launch.launch(cfg) }
            .map_err(|e| Error::driver("launching cudnn-safe's activation kernel", e))?;
        Ok(Outcome::Launched)
    }

    /// Enqueues `dx[i] = alpha·dy[i]·f′ + beta·dx[i]` for `i` in `0..n` with the kernel of `op`
    /// on `elem`, `s` being the tensor [`ActOp::saved`] names (`x` or `y`); otherwise as
    /// [`Self::act_forward_fast`].
    ///
    /// # Safety
    ///
    /// `s`, `dy` and `dx` are device addresses on this handle's context, each valid for `n`
    /// elements of `elem` (`s` and `dy` for reads, `dx` for reads and writes), alive and
    /// ordered on [`Cudnn::stream`] until this returns. `dx` is disjoint from `s`, and either
    /// equal to `dy` (in place) or disjoint from it.
    #[allow(clippy::too_many_arguments)] // the kernel's parameters
    pub(crate) unsafe fn act_backward_fast(
        &self,
        op: ActOp,
        elem: Elem,
        s: CUdeviceptr,
        dy: CUdeviceptr,
        dx: CUdeviceptr,
        n: usize,
        alpha: f32,
        beta: f32,
        param: f32,
    ) -> Result<Outcome> {
        let n = n as u64;
        let (func, blocks) = match self.act_kernel(op, elem, Dir::Backward, &[s, dy, dx], n) {
            Ok(k) => k,
            Err(why) => return Ok(Outcome::Unavailable(why)),
        };
        if n == 0 {
            return Ok(Outcome::Launched);
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = self.stream();
        let mut launch = stream.launch_builder(func);
        launch
            .arg(&s)
            .arg(&dy)
            .arg(&dx)
            .arg(&n)
            .arg(&alpha)
            .arg(&beta)
            .arg(&param);
        // SAFETY: as in `act_forward_fast`: the arguments match the kernel's parameters (three
        // pointers, u64, three floats); it touches exactly the elements `0..n` of `s`, `dy` and
        // `dx`, valid, on this context, alive and ordered (the caller's contract); the vector
        // kernel only for 16-byte aligned pointers, the scalar one for element-aligned ones;
        // `dx == dy` is sound because each element is read and then written by one thread with
        // plain loads, and `dx` never overlaps `s` otherwise.
        unsafe { launch.launch(cfg) }
            .map_err(|e| Error::driver("launching cudnn-safe's activation kernel", e))?;
        Ok(Outcome::Launched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_names_its_two_kernels_once() {
        for op in ActOp::ALL {
            for elem in Elem::ALL {
                for dir in Dir::ALL {
                    let src = source(op, elem, dir);
                    for vector in [false, true] {
                        let name = kernel_name(op, elem, dir, vector);
                        assert_eq!(
                            src.matches(&format!("\n{name}(")).count(),
                            1,
                            "{name} in\n{src}"
                        );
                    }
                    // Only this direction's kernels.
                    let other = match dir {
                        Dir::Forward => Dir::Backward,
                        Dir::Backward => Dir::Forward,
                    };
                    assert!(!src.contains(&kernel_name(op, elem, other, false)));
                    // Every placeholder substituted; the body and the element type are in.
                    assert!(!src.contains('$'), "{src}");
                    let (body, call, param) = match dir {
                        Dir::Forward => (op.forward(), "forward_vec", "float x, float p"),
                        Dir::Backward => (
                            op.backward(),
                            "backward_vec",
                            match op.saved() {
                                Saved::X => "float x, float dy, float p",
                                Saved::Y => "float y, float dy, float p",
                            },
                        ),
                    };
                    assert!(src.contains(body), "{op:?} {dir:?}");
                    assert!(src.contains(&format!("{call}<{}, Op>", elem.traits())));
                    assert!(src.contains(param), "{op:?} {dir:?}");
                    assert!(src.contains(&format!("__launch_bounds__({BLOCK})")));
                    assert!(!src.contains('\0'));
                    // No header: nothing but libnvrtc is needed.
                    assert!(!src.contains("#include"));
                }
            }
        }
    }

    /// The bodies read only what they are given: the backward of an op that saves `y` never
    /// names `x`, and the reverse.
    #[test]
    fn backward_bodies_read_only_the_saved_tensor() {
        let names = |body: &str, v: char| {
            body.char_indices().any(|(i, c)| {
                let before = body[..i].chars().next_back();
                let after = body[i + c.len_utf8()..].chars().next();
                let ident = |o: Option<char>| o.is_some_and(|c| c.is_alphanumeric() || c == '_');
                c == v && !ident(before) && !ident(after)
            })
        };
        for op in ActOp::ALL {
            let (reads, not) = match op.saved() {
                Saved::X => ('x', 'y'),
                Saved::Y => ('y', 'x'),
            };
            assert!(names(op.backward(), reads), "{op:?}");
            assert!(!names(op.backward(), not), "{op:?}");
            assert!(
                names(op.forward(), 'x') && !names(op.forward(), 'y'),
                "{op:?}"
            );
        }
    }

    #[test]
    fn slots_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for op in ActOp::ALL {
            for elem in Elem::ALL {
                for dir in Dir::ALL {
                    assert!(seen.insert(slot(op, elem, dir)));
                    assert!(slot(op, elem, dir) < SLOTS);
                }
            }
        }
        assert_eq!(seen.len(), SLOTS);
    }

    #[test]
    fn kernel_choice_follows_alignment() {
        let base = 0x7f00_0000_0000u64;
        assert_eq!(pick_vector(&[base, base + 4096], Elem::F32), Some(true));
        assert_eq!(pick_vector(&[base, base, base + 16], Elem::F16), Some(true));
        // A view one element in.
        assert_eq!(pick_vector(&[base + 4, base], Elem::F32), Some(false));
        assert_eq!(
            pick_vector(&[base, base + 2, base], Elem::Bf16),
            Some(false)
        );
        // Not element-aligned (only a foreign buffer type could give this).
        assert_eq!(pick_vector(&[base + 2, base], Elem::F32), None);
        assert_eq!(pick_vector(&[base, base + 1], Elem::F16), None);
    }

    /// With NVRTC at hand (`LD_LIBRARY_PATH` holding libnvrtc.so.12 or .13 and its builtins;
    /// no GPU needed), every module compiles for the architectures the crate is measured on
    /// and holds its two kernels; the time each took is printed (`--nocapture`). Skipped
    /// without NVRTC, unless `CUDNN_SAFE_REQUIRE_NVRTC=1`.
    #[test]
    fn every_module_compiles_with_nvrtc() {
        if let Err(why) = nvrtc::version() {
            assert!(
                std::env::var("CUDNN_SAFE_REQUIRE_NVRTC").as_deref() != Ok("1"),
                "CUDNN_SAFE_REQUIRE_NVRTC=1 but {why}"
            );
            eprintln!("skipping: {why}");
            return;
        }
        for cc in [90, 80] {
            let mut total = std::time::Duration::ZERO;
            for op in ActOp::ALL {
                for elem in Elem::ALL {
                    for dir in Dir::ALL {
                        let key = module_key(op, elem, dir);
                        let start = std::time::Instant::now();
                        let image = nvrtc::compile(&source(op, elem, dir), &key, cc)
                            .unwrap_or_else(|e| panic!("{key} sm_{cc}: {e}"));
                        let took = start.elapsed();
                        total += took;
                        eprintln!("sm_{cc} {key:<28} {took:?}");
                        let Image::Cubin(bytes) = image else {
                            panic!("sm_{cc} should give a CUBIN")
                        };
                        for vector in [false, true] {
                            let name = kernel_name(op, elem, dir, vector);
                            let found = bytes
                                .windows(name.len() + 1)
                                .any(|w| w[..name.len()] == *name.as_bytes() && w[name.len()] == 0);
                            assert!(found, "{name} not in the CUBIN");
                        }
                    }
                }
            }
            eprintln!("sm_{cc}: all {SLOTS} modules in {total:?}");
        }
    }

    /// On a GPU, every module compiles and loads (so the activation calls really take these
    /// kernels there, rather than falling back to cuDNN), and a launch of each direction runs,
    /// vector and scalar. Skipped without a GPU unless `CUDNN_SAFE_REQUIRE_GPU=1`.
    #[test]
    fn every_module_loads_and_launches_on_the_gpu() {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let opened = crate::cuda_context(0).and_then(|ctx| Cudnn::new(ctx.default_stream()));
        let cudnn = match opened {
            Ok(c) => c,
            Err(e) if std::env::var("CUDNN_SAFE_REQUIRE_GPU").as_deref() == Ok("1") => {
                panic!("CUDNN_SAFE_REQUIRE_GPU=1 but no usable GPU: {e}")
            }
            Err(e) => {
                eprintln!("skipping: {e}");
                return;
            }
        };
        let start = std::time::Instant::now();
        for op in ActOp::ALL {
            for elem in Elem::ALL {
                for dir in Dir::ALL {
                    if let Err(e) = cudnn.act_module(op, elem, dir) {
                        panic!("{op:?} {elem:?} {dir:?} did not load: {e}");
                    }
                }
            }
        }
        eprintln!(
            "{SLOTS} modules compiled and loaded in {:?}",
            start.elapsed()
        );
        assert!(cudnn.fast.is_loaded());
        // sigmoid on f32, n = 4·64 + 3, at offsets 0 (vector) and 1 (scalar).
        let stream = cudnn.stream().clone();
        let n = 259usize;
        let xs: Vec<f32> = (0..n + 1).map(|i| (i as f32 - 130.0) / 40.0).collect();
        let x = stream.clone_htod(&xs).unwrap();
        for off in [0usize, 1] {
            let mut y = stream.alloc_zeros::<f32>(n + 1).unwrap();
            let mut dx = stream.alloc_zeros::<f32>(n + 1).unwrap();
            {
                let (xv, mut yv) = (x.slice(off..off + n), y.slice_mut(off..off + n));
                let (xp, _gx) = xv.device_ptr(&stream);
                let (yp, _gy) = yv.device_ptr_mut(&stream);
                // SAFETY: both views hold `n` f32 on this context, distinct allocations, alive
                // and ordered by the guards.
                let fwd = unsafe {
                    cudnn.act_forward_fast(ActOp::Sigmoid, Elem::F32, xp, yp, n, 1.0, 0.0, 0.0)
                };
                assert_eq!(fwd.unwrap(), Outcome::Launched);
            }
            {
                // dx = dy·y·(1 − y) with dy = x, read from `y` as saved.
                let (yv, xv) = (y.slice(off..off + n), x.slice(off..off + n));
                let mut dxv = dx.slice_mut(off..off + n);
                let (yp, _gy) = yv.device_ptr(&stream);
                let (xp, _gx) = xv.device_ptr(&stream);
                let (dxp, _gdx) = dxv.device_ptr_mut(&stream);
                // SAFETY: three views of `n` f32 on this context; `dx` is its own allocation;
                // the guards keep them alive and ordered.
                let bwd = unsafe {
                    cudnn.act_backward_fast(
                        ActOp::Sigmoid,
                        Elem::F32,
                        yp,
                        xp,
                        dxp,
                        n,
                        1.0,
                        0.0,
                        0.0,
                    )
                };
                assert_eq!(bwd.unwrap(), Outcome::Launched);
            }
            let (got_y, got_dx) = (
                stream.clone_dtoh(&y).unwrap(),
                stream.clone_dtoh(&dx).unwrap(),
            );
            for i in 0..n {
                let v = f64::from(xs[off + i]);
                let s = 1.0 / (1.0 + (-v).exp());
                let (gy, gdx) = (f64::from(got_y[off + i]), f64::from(got_dx[off + i]));
                assert!(
                    (gy - s).abs() < 1e-6,
                    "offset {off} element {i}: y {gy}, want {s}"
                );
                let want_dx = v * f64::from(got_y[off + i]) * (1.0 - f64::from(got_y[off + i]));
                assert!(
                    (gdx - want_dx).abs() < 1e-6,
                    "offset {off} element {i}: dx {gdx}"
                );
            }
            let outside = if off == 0 { n } else { 0 };
            assert_eq!(
                (got_y[outside], got_dx[outside]),
                (0.0, 0.0),
                "offset {off}"
            );
        }
    }
}
