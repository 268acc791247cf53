//! Group normalization forward as one generated kernel ([`GroupNorm`](crate::norm::GroupNorm)'s
//! default path, [`GroupNormPath`](crate::norm::GroupNormPath)).
//!
//! One block per `(n, group)`: the group's `C/G · S` elements are contiguous in a packed
//! `[N, C, spatial...]` tensor. The block reads them once for their moments (per-thread
//! running moments merged pairwise, Chan et al.'s update, all in `float`), then reads them again
//! (from L2 for groups of a few hundred KiB) and writes `y = (x − μ)·rstd·γ[c] + β[c]`, where
//! `rstd = rsqrt(σ² + ε)` with the biased variance, as PyTorch's `group_norm`. cuDNN's
//! batch-norm formulation makes four passes over the tensor for the same result.
//!
//! The source is the shared element types ([`super::elementwise::TYPES`]) and [`GN_TEMPLATE`],
//! compiled with NVRTC once per process and element type, loaded once per handle.
use std::cell::OnceCell;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::elementwise::{Elem, Outcome, TYPES};
use super::nvrtc::{self, Image};
use crate::error::{Error, Result};
use crate::handle::Cudnn;

/// Threads per block (a multiple of 32, at most 32 warps: the moments are merged across warps
/// by one warp).
pub(crate) const GN_BLOCK: u32 = 512;

/// The largest grid x dimension CUDA allows: one block per group.
const GRID_X_LIMIT: u64 = i32::MAX as u64;

/// The kernel's CUDA C++ after [`TYPES`]; `$BLOCK` is [`GN_BLOCK`], `$D` the element type's
/// struct and `$NAME` the kernel name.
pub(crate) const GN_TEMPLATE: &str = r#"
// Count, mean and sum of squared deviations of a set of values.
struct Moments {
  float n, mean, m2;
};

// The moments of the union of two sets (Chan, Golub and LeVeque).
__device__ __forceinline__ Moments merge(Moments a, Moments b) {
  if (b.n == 0.0f) return a;
  if (a.n == 0.0f) return b;
  Moments r;
  r.n = a.n + b.n;
  const float d = b.mean - a.mean;
  const float f = b.n / r.n;
  r.mean = fmaf(d, f, a.mean);
  r.m2 = a.m2 + b.m2 + d * d * a.n * f;
  return r;
}

__device__ __forceinline__ Moments shfl_xor(Moments m, int lane) {
  Moments o;
  o.n = __shfl_xor_sync(0xffffffffu, m.n, lane);
  o.mean = __shfl_xor_sync(0xffffffffu, m.mean, lane);
  o.m2 = __shfl_xor_sync(0xffffffffu, m.m2, lane);
  return o;
}

// The moments of the whole block, in every thread (blockDim.x == $BLOCK).
__device__ __forceinline__ Moments block_moments(Moments m) {
  __shared__ Moments warps[$BLOCK / 32];
  __shared__ Moments total;
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) m = merge(m, shfl_xor(m, k));
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[w] = m;
  __syncthreads();
  if (w == 0) {
    Moments r = {0.0f, 0.0f, 0.0f};
    if (lane < $BLOCK / 32) r = warps[lane];
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) r = merge(r, shfl_xor(r, k));
    if (lane == 0) total = r;
  }
  __syncthreads();
  return total;
}

// Block `blockIdx.x` normalizes group `blockIdx.x % groups` of sample `blockIdx.x / groups`:
// the `cg * s` elements from `blockIdx.x * cg * s`, channel `c0 + i / s` for element `i`.
// `vector`: x and y 16-byte aligned and `s` a multiple of the elements per 16 bytes, so every
// 16-byte vector lies in one channel.
template <class D>
__device__ __forceinline__ void group_norm_fwd(const typename D::R* x,
                                               const typename D::R* gamma,
                                               const typename D::R* beta, typename D::R* y,
                                               u32 cg, u32 s, u32 groups, float eps,
                                               u32 vector) {
  typedef typename D::R R;
  const int V = 16 / sizeof(R);
  const u32 len = cg * s;
  const u64 group = blockIdx.x;
  const R* xg = x + group * (u64)len;
  R* yg = y + group * (u64)len;
  const u32 c0 = (u32)(group % groups) * cg;
  Moments m = {0.0f, 0.0f, 0.0f};
  if (vector) {
    const u32 units = len / V;
    for (u32 u = threadIdx.x; u < units; u += $BLOCK) {
      Pack<R> a;
      a.v = reinterpret_cast<const uint4*>(xg)[u];
      float v[16 / sizeof(R)];
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[k] = D::load(a.e[k]);
        sum += v[k];
      }
      const float mu = sum * (1.0f / V);
      float q = 0.0f;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float d = v[k] - mu;
        q = fmaf(d, d, q);
      }
      const Moments part = {(float)V, mu, q};
      m = merge(m, part);
    }
  } else {
    for (u32 i = threadIdx.x; i < len; i += $BLOCK) {
      const float v = D::load(xg[i]);
      m.n += 1.0f;
      const float d = v - m.mean;
      m.mean += d / m.n;
      m.m2 = fmaf(d, v - m.mean, m.m2);
    }
  }
  m = block_moments(m);
  const float mean = m.mean;
  const float rstd = rsqrtf(fmaxf(m.m2 / m.n, 0.0f) + eps);
  if (vector) {
    const u32 units = len / V;
    for (u32 u = threadIdx.x; u < units; u += $BLOCK) {
      const u32 c = c0 + (u * V) / s;
      const float a = rstd * D::load(gamma[c]);
      const float b = D::load(beta[c]);
      Pack<R> in, out;
      in.v = reinterpret_cast<const uint4*>(xg)[u];
#pragma unroll
      for (int k = 0; k < V; ++k) out.e[k] = D::store(fmaf(D::load(in.e[k]) - mean, a, b));
      reinterpret_cast<uint4*>(yg)[u] = out.v;
    }
  } else {
    for (u32 i = threadIdx.x; i < len; i += $BLOCK) {
      const u32 c = c0 + i / s;
      const float a = rstd * D::load(gamma[c]);
      yg[i] = D::store(fmaf(D::load(xg[i]) - mean, a, D::load(beta[c])));
    }
  }
}

extern "C" __global__ void __launch_bounds__($BLOCK)
$NAME(const $D::R* x, const $D::R* gamma, const $D::R* beta, $D::R* y, u32 cg, u32 s,
      u32 groups, float eps, u32 vector) {
  group_norm_fwd<$D>(x, gamma, beta, y, cg, s, groups, eps, vector);
}
"#;

/// The kernel's name for `elem`: `group_norm_fwd_<type>`.
pub(crate) fn kernel_name(elem: Elem) -> String {
    format!("group_norm_fwd_{}", elem.name())
}

/// The complete CUDA C++ source of the module for `elem`.
pub(crate) fn source(elem: Elem) -> String {
    let body = GN_TEMPLATE
        .replace("$NAME", &kernel_name(elem))
        .replace("$BLOCK", &GN_BLOCK.to_string())
        .replace("$D", elem.traits());
    let mut s = String::with_capacity(TYPES.len() + body.len());
    s.push_str(TYPES);
    s.push_str(&body);
    s
}

/// The shape of one launch: `n·groups` blocks of `cg·s` elements (`cg` channels of `s`
/// positions), `groups` groups per sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GnShape {
    pub(crate) n: u64,
    pub(crate) groups: u64,
    pub(crate) cg: u64,
    pub(crate) s: u64,
}

impl GnShape {
    /// The grid and the kernel's 32-bit parameters `(blocks, cg, s, groups)`, or why the shape
    /// does not fit them: a group of more than `u32::MAX` elements, more channels than that, or
    /// more groups than a grid has blocks.
    fn launch_dims(self) -> std::result::Result<(u32, u32, u32, u32), String> {
        let blocks = self
            .n
            .checked_mul(self.groups)
            .filter(|&b| b <= GRID_X_LIMIT);
        let fits = |v: Option<u64>| v.filter(|&l| l <= u64::from(u32::MAX));
        let len = fits(self.cg.checked_mul(self.s));
        let channels = fits(self.cg.checked_mul(self.groups));
        match (blocks, len.and(channels)) {
            (Some(b), Some(_)) if b > 0 => Ok((
                b as u32,
                self.cg as u32,
                self.s as u32,
                // `groups ≤ blocks ≤ i32::MAX`.
                self.groups as u32,
            )),
            (None, _) => Err(format!(
                "{} × {} groups exceed a grid's {GRID_X_LIMIT} blocks",
                self.n, self.groups
            )),
            _ => Err(format!(
                "a group of {} × {} elements or {} × {} channels exceed 2^32",
                self.cg, self.s, self.groups, self.cg
            )),
        }
    }
}

/// The modules of one handle, one per element type: empty until the first launch on that
/// type, then the kernel or the reason it is not available (remembered).
#[derive(Default)]
pub(crate) struct GroupNormCache([OnceCell<std::result::Result<CudaFunction, String>>; 3]);

impl GroupNormCache {
    /// Whether any module was loaded (so launches from it may still be in flight).
    pub(crate) fn any_loaded(&self) -> bool {
        self.0.iter().any(|c| matches!(c.get(), Some(Ok(_))))
    }
}

/// Whether a launch on these pointers takes the vector loop (`Some(true)`), the scalar one
/// (`Some(false)`), or neither (a pointer not aligned to the element size).
pub(crate) fn pick_vector(
    data: [CUdeviceptr; 2],
    params: [CUdeviceptr; 2],
    s: u64,
    elem: Elem,
) -> Option<bool> {
    let size = elem.size();
    if data.iter().chain(&params).any(|p| p % size != 0) {
        return None;
    }
    Some(data.iter().all(|p| p % 16 == 0) && s % elem.per_vector() == 0)
}

impl Cudnn {
    /// The handle's group-norm kernel for `elem`, compiled (once per process) and loaded (once
    /// per handle) on first use; the reason when it is not available.
    fn group_norm_kernel(&self, elem: Elem) -> std::result::Result<&CudaFunction, &str> {
        let i = Elem::ALL.iter().position(|&e| e == elem).unwrap_or(0);
        self.fast.group_norm.0[i]
            .get_or_init(|| {
                let loaded = self.load_group_norm_kernel(elem);
                if let Err(e) = &loaded {
                    log::debug!(
                        "cudnn-safe's group-norm kernel for {} is not available ({e})",
                        elem.name()
                    );
                }
                loaded
            })
            .as_ref()
            .map_err(String::as_str)
    }

    fn load_group_norm_kernel(&self, elem: Elem) -> std::result::Result<CudaFunction, String> {
        let ctx = self.context();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("reading the GPU's compute capability: {e}"))?;
        let cc = major * 10 + minor;
        let name = kernel_name(elem);
        let key = format!("{name}.cu");
        let (image, took) = nvrtc::compile_cached(&key, cc, || source(elem))?;
        log::debug!("{key} for compute capability {cc}: NVRTC took {took:?}");
        let ptx = match &*image {
            Image::Cubin(bytes) => Ptx::from_binary(bytes.clone()),
            Image::Ptx(text) => Ptx::from_src(text.clone()),
        };
        let module = ctx
            .load_module(ptx)
            .map_err(|e| format!("loading {key}: {e}"))?;
        module
            .load_function(&name)
            .map_err(|e| format!("kernel {name}: {e}"))
    }

    /// Enqueues group normalization forward of a packed `[n, groups·cg, s]` tensor `x` into `y`
    /// (per-channel `γ`, `β` of `groups·cg` elements; epsilon `eps`) with the crate's kernel
    /// for `elem`. [`Outcome::Unavailable`], with nothing enqueued, when the kernel is not
    /// available (no NVRTC, compilation or loading failed), a pointer is not aligned to the
    /// element size, or the shape exceeds the kernel's 32-bit group size or the grid.
    ///
    /// # Safety
    ///
    /// `x` and `y` are device addresses on this handle's context valid for `n·groups·cg·s`
    /// elements of `elem` (`x` for reads, `y` for writes), `gamma` and `beta` for `groups·cg`
    /// reads, all alive and ordered on [`Cudnn::stream`] until this returns (the caller holds
    /// cudarc's guards). `y` does not overlap `x`, `gamma` or `beta`.
    pub(crate) unsafe fn group_norm_forward_fast(
        &self,
        elem: Elem,
        [x, gamma, beta, y]: [CUdeviceptr; 4],
        shape: GnShape,
        eps: f32,
    ) -> Result<Outcome> {
        let (blocks, cg, s, groups) = match shape.launch_dims() {
            Ok(d) => d,
            Err(why) => return Ok(Outcome::Unavailable(why)),
        };
        let Some(vector) = pick_vector([x, y], [gamma, beta], shape.s, elem) else {
            return Ok(Outcome::Unavailable(format!(
                "a pointer is not aligned to {} bytes",
                elem.size()
            )));
        };
        let func = match self.group_norm_kernel(elem) {
            Ok(f) => f,
            Err(why) => return Ok(Outcome::Unavailable(why.to_string())),
        };
        let vector = u32::from(vector);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (GN_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream().launch_builder(func);
        launch
            .arg(&x)
            .arg(&gamma)
            .arg(&beta)
            .arg(&y)
            .arg(&cg)
            .arg(&s)
            .arg(&groups)
            .arg(&eps)
            .arg(&vector);
        // SAFETY: the arguments match the kernel's parameters one for one in type and order
        // (four pointers, four u32, one float, one u32; `GN_TEMPLATE`). Block `b < n·groups`
        // reads and writes elements `b·cg·s .. (b + 1)·cg·s` of `x` and `y` (all within the
        // `n·groups·cg·s` the caller guarantees; `cg·s` fits u32, checked, and the offset is
        // computed in 64 bits) and reads `γ`, `β` at channels `(b % groups)·cg + i / s <
        // groups·cg`. The vector loop runs only with `x` and `y` 16-byte aligned and `s` a
        // multiple of the elements per 16 bytes, so every group starts 16-byte aligned and
        // its `uint4` accesses stay inside it; otherwise every pointer is element-aligned
        // (checked). `y` overlaps no input (the caller's contract), so the second read of `x`
        // sees the input. The grid is `1..=i32::MAX` blocks (checked) of `GN_BLOCK` threads
        // (the kernel's `__launch_bounds__`), with static shared memory only.
        unsafe { launch.launch(cfg) }
            .map_err(|e| Error::driver("launching cudnn-safe's group-norm kernel", e))?;
        Ok(Outcome::Launched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_dims_refuse_what_the_kernel_cannot_index() {
        let ok = GnShape {
            n: 32,
            groups: 32,
            cg: 8,
            s: 3136,
        };
        assert_eq!(ok.launch_dims(), Ok((1024, 8, 3136, 32)));
        let big_group = GnShape { s: 1 << 30, ..ok };
        assert!(big_group.launch_dims().unwrap_err().contains("exceed 2^32"));
        let many = GnShape {
            n: 1 << 27,
            groups: 32,
            cg: 1,
            s: 1,
        };
        assert!(many.launch_dims().unwrap_err().contains("blocks"));
    }

    #[test]
    fn vector_loop_needs_aligned_data_and_whole_vectors_per_channel() {
        let params = [0x1000, 0x2002];
        assert_eq!(
            pick_vector([0x1000, 0x2000], params, 8, Elem::F16),
            Some(true)
        );
        assert_eq!(
            pick_vector([0x1000, 0x2000], params, 4, Elem::F16),
            Some(false)
        );
        assert_eq!(
            pick_vector([0x1004, 0x2000], [0x1000, 0x2000], 4, Elem::F32),
            Some(false)
        );
        assert_eq!(
            pick_vector([0x1000, 0x2000], params, 4, Elem::F32),
            None,
            "γ or β not aligned to 4 bytes"
        );
    }

    /// Every element type's module compiles with NVRTC when it is there (sm_90 and sm_80) and
    /// holds its kernel; skipped without NVRTC unless `CUDNN_SAFE_REQUIRE_NVRTC=1`.
    #[test]
    fn group_norm_modules_compile_with_nvrtc() {
        if let Err(why) = nvrtc::version() {
            assert!(
                std::env::var("CUDNN_SAFE_REQUIRE_NVRTC").as_deref() != Ok("1"),
                "CUDNN_SAFE_REQUIRE_NVRTC=1 but {why}"
            );
            eprintln!("skipping: {why}");
            return;
        }
        for cc in [90, 80] {
            for elem in Elem::ALL {
                let name = kernel_name(elem);
                let image = nvrtc::compile(&source(elem), &name, cc)
                    .unwrap_or_else(|e| panic!("{name} sm_{cc}: {e}"));
                let Image::Cubin(bytes) = image else {
                    panic!("sm_{cc} should give a CUBIN")
                };
                let found = bytes
                    .windows(name.len() + 1)
                    .any(|w| w[..name.len()] == *name.as_bytes() && w[name.len()] == 0);
                assert!(found, "{name} not in the sm_{cc} CUBIN");
            }
        }
    }
}
