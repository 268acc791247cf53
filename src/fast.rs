//! The crate's own kernels, for the cases where cuDNN leaves bandwidth on the table.
//!
//! Element-wise activations stream memory, so a kernel that keeps enough 16-byte loads in
//! flight runs at copy speed, where `cudnnActivationForward` / `cudnnActivationBackward` stay
//! well below it however the tensor is described. [`Cudnn::activation_forward`] and
//! [`Cudnn::activation_backward`] (and their in-place forms) send the cases below here,
//! when every tensor of the call shares one packed layout, and everything else to cuDNN:
//!
//! * ReLU forward on `f32`: the hand-written PTX kernels of this file, JIT-compiled by the
//!   driver once per handle on first use ([`KernelCache`]).
//! * Sigmoid, tanh, swish, ELU and GELU (exact and tanh), forward and backward, on `f32`,
//!   `f16` and `bf16`: kernels generated from one CUDA C++ template (`elementwise.rs`), each
//!   activation contributing its forward and backward body, compiled with NVRTC (`nvrtc.rs`)
//!   once per process for each activation, type and direction by the first launch that needs
//!   it, and loaded once per handle.
//!
//! Should loading fail (no NVRTC library, a compile error, a driver too old for the PTX, a GPU
//! older than the target), the handle remembers it, logs it once at debug level and keeps
//! using cuDNN; GELU, which cuDNN's activation API lacks, then returns
//! [`Error::KernelUnavailable`].
//!
//! What the ReLU kernels compute, for `i` in `0..n` (and nothing outside it):
//! `y[i] = alpha·relu(x[i]) + beta·y[i]`, where `y[i]` is not read at all when `beta == 0` (so
//! NaN left in `y` does not leak), and `relu(NaN)` is NaN when NaN propagates and 0 otherwise
//! (cuDNN's `CUDNN_NOT_PROPAGATE_NAN` ReLU gives 0). The generated kernels follow the same
//! `alpha`/`beta` rule (see `elementwise.rs`).
use std::cell::OnceCell;
use std::fmt::Write as _;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::activation::NanPropagation;
use crate::error::{Error, Result};
use crate::handle::Cudnn;

pub(crate) mod elementwise;
mod nvrtc;

/// Threads per block of every kernel here (also the PTX's `.maxntid`).
pub(crate) const BLOCK: u32 = 256;

/// Elements one thread of the vector kernels handles per loop trip: one 16-byte load, so a
/// warp's access is 512 contiguous bytes (fully coalesced). A first version read 32 contiguous
/// bytes per thread (two 16-byte accesses 32 bytes apart across the warp) in a one-wave
/// grid-stride loop and stayed well below copy bandwidth.
const UNIT: u64 = 4;

/// The largest grid x dimension CUDA allows on every GPU since compute capability 3.0.
const GRID_X_LIMIT: u32 = i32::MAX as u32;

/// PTX targets tried in order. `sm_75` first: the oldest architecture CUDA 13 still compiles
/// for, so drivers that drop older targets keep accepting it; `sm_50` second, for the Maxwell
/// to Volta GPUs cuDNN 9 still runs on under CUDA 12 (a driver rejects PTX whose target is
/// newer than the GPU). The instructions used need only `sm_32` (`ld.global.nc`); the driver
/// compiles for the actual GPU, so the target does not limit the generated code.
const TARGETS: [&str; 2] = ["sm_75", "sm_50"];

/// Kernel names in the module.
const RELU: &str = "relu_f32";
const RELU_IN_PLACE: &str = "relu_f32_in_place";
const RELU_UNALIGNED: &str = "relu_f32_unaligned";

/// The PTX text of the module for `target` (e.g. `sm_75`): three kernels with the parameters
/// `(const float* x, float* y, u64 n, float alpha, float beta, u32 propagate_nan)`.
///
/// * `relu_f32`: `x` and `y` 16-byte aligned and distinct; a grid-stride loop over units of
///   4 elements (one `ld.global.nc.v4.f32` of `x`, one `st.global.v4.f32` of `y`), then the
///   last `n mod 4` elements one per thread. `.nc` (the read-only data path) is sound because
///   nothing writes `x` while the kernel runs.
/// * `relu_f32_in_place`: the same with `x == y` allowed: plain `ld.global`, since `x` is
///   written during the kernel (each element by the thread that read it, after reading it).
/// * `relu_f32_unaligned`: any 4-byte aligned `x`, `y` (also equal): one element per thread
///   per trip.
///
/// All index arithmetic is 64-bit. Selects, not branches, implement ReLU:
/// `keep = (x > 0) || (propagate && isnan(x))`, `r = keep ? x : 0`, then
/// `v = alpha·r` and, only when `beta ≠ 0` (a predicate, so the load is not issued at all
/// otherwise), `v = fma(beta, y, v)`.
pub(crate) fn relu_ptx(target: &str) -> String {
    let mut s = String::new();
    // `.version 6.3` is the first PTX ISA with `sm_75`; every driver since CUDA 10.0 reads it.
    let _ = write!(
        s,
        "// cudnn-safe: ReLU forward for packed f32 tensors.\n\
         .version 6.3\n.target {target}\n.address_size 64\n\n"
    );
    vector_kernel(&mut s, RELU, "ld.global.nc");
    vector_kernel(&mut s, RELU_IN_PLACE, "ld.global");
    scalar_kernel(&mut s, RELU_UNALIGNED);
    s
}

/// The parameter list, register declarations and prologue every kernel shares: loads the
/// parameters, converts the pointers to global addresses, sets `%prop` (propagate NaN) and
/// `%b0` (`beta == 0`, so `y` is not read), and leaves the global thread index in `%i` and the
/// grid's thread count in `%stride`.
fn prologue(s: &mut String, name: &str) {
    let _ = write!(
        s,
        ".visible .entry {name}(\n\
         \t.param .u64 p_x,\n\
         \t.param .u64 p_y,\n\
         \t.param .u64 p_n,\n\
         \t.param .f32 p_alpha,\n\
         \t.param .f32 p_beta,\n\
         \t.param .u32 p_nan\n\
         )\n\
         .maxntid {BLOCK}, 1, 1\n\
         {{\n\
         \t.reg .pred %prop, %b0, %more;\n\
         \t.reg .pred %nan<8>;\n\
         \t.reg .pred %keep<8>;\n\
         \t.reg .b32 %r<5>;\n\
         \t.reg .f32 %alpha, %beta;\n\
         \t.reg .f32 %x<8>;\n\
         \t.reg .f32 %y<8>;\n\
         \t.reg .f32 %v<8>;\n\
         \t.reg .b64 %px, %py, %n, %i, %e, %stride, %units, %off, %ax, %ay;\n\
         \n\
         \tld.param.u64 %px, [p_x];\n\
         \tld.param.u64 %py, [p_y];\n\
         \tld.param.u64 %n, [p_n];\n\
         \tld.param.f32 %alpha, [p_alpha];\n\
         \tld.param.f32 %beta, [p_beta];\n\
         \tld.param.u32 %r0, [p_nan];\n\
         \tcvta.to.global.u64 %px, %px;\n\
         \tcvta.to.global.u64 %py, %py;\n\
         \tsetp.ne.u32 %prop, %r0, 0;\n\
         \tsetp.eq.f32 %b0, %beta, 0f00000000;\n\
         \tmov.u32 %r1, %ctaid.x;\n\
         \tmov.u32 %r2, %ntid.x;\n\
         \tmov.u32 %r3, %tid.x;\n\
         \tmov.u32 %r4, %nctaid.x;\n\
         \tmul.wide.u32 %i, %r1, %r2;\n\
         \tcvt.u64.u32 %off, %r3;\n\
         \tadd.u64 %i, %i, %off;\n\
         \tmul.wide.u32 %stride, %r4, %r2;\n"
    );
}

/// `v_k = alpha·relu(x_k)` (NaN rule per `%prop`), then `v_k = fma(beta, y_k, v_k)` when
/// `beta ≠ 0`, for the registers `k` in `ks` (whose `y_k` must have been loaded under `!%b0`).
fn relu_blend(s: &mut String, ks: std::ops::Range<usize>) {
    for k in ks.clone() {
        let _ = write!(
            s,
            "\tsetp.nan.and.f32 %nan{k}, %x{k}, %x{k}, %prop;\n\
             \tsetp.gt.or.f32 %keep{k}, %x{k}, 0f00000000, %nan{k};\n\
             \tselp.f32 %v{k}, %x{k}, 0f00000000, %keep{k};\n\
             \tmul.rn.f32 %v{k}, %v{k}, %alpha;\n"
        );
    }
    for k in ks {
        let _ = writeln!(s, "\t@!%b0 fma.rn.f32 %v{k}, %beta, %y{k}, %v{k};");
    }
}

/// One element at byte offset `%off` of both tensors, loaded with `ld`.
fn one_element(s: &mut String, ld: &str) {
    let _ = write!(
        s,
        "\tadd.u64 %ax, %px, %off;\n\
         \tadd.u64 %ay, %py, %off;\n\
         \t{ld}.f32 %x0, [%ax];\n\
         \t@!%b0 ld.global.f32 %y0, [%ay];\n"
    );
    relu_blend(s, 0..1);
    s.push_str("\tst.global.f32 [%ay], %v0;\n");
}

/// A kernel over 16-byte aligned `x` and `y`: units of [`UNIT`] elements in a grid-stride loop,
/// then the `n mod 4` tail elements, element `4·units + t` for the threads `t < n mod 4` of the
/// grid (one each). Every address is `base + 4·e` for an element index `e < n`.
fn vector_kernel(s: &mut String, name: &str, ld: &str) {
    prologue(s, name);
    let _ = write!(
        s,
        "\tshr.u64 %units, %n, 2;\n\
         \tmov.u64 %e, %i;\n\
         \tsetp.lt.u64 %more, %i, %units;\n\
         \t@!%more bra $tail;\n\
         $loop:\n\
         \tshl.b64 %off, %i, 4;\n\
         \tadd.u64 %ax, %px, %off;\n\
         \tadd.u64 %ay, %py, %off;\n\
         \t{ld}.v4.f32 {{%x0, %x1, %x2, %x3}}, [%ax];\n\
         \t@!%b0 ld.global.v4.f32 {{%y0, %y1, %y2, %y3}}, [%ay];\n"
    );
    relu_blend(s, 0..4);
    s.push_str(
        "\tst.global.v4.f32 [%ay], {%v0, %v1, %v2, %v3};\n\
         \tadd.u64 %i, %i, %stride;\n\
         \tsetp.lt.u64 %more, %i, %units;\n\
         \t@%more bra $loop;\n\
         $tail:\n\
         \tshl.b64 %units, %units, 2;\n\
         \tsub.u64 %off, %n, %units;\n\
         \tsetp.lt.u64 %more, %e, %off;\n\
         \t@!%more bra $done;\n\
         \tadd.u64 %off, %units, %e;\n\
         \tshl.b64 %off, %off, 2;\n",
    );
    one_element(s, ld);
    s.push_str("$done:\n\tret;\n}\n\n");
}

/// A kernel over 4-byte aligned `x` and `y`: one element per thread per trip of a grid-stride
/// loop over `0..n`.
fn scalar_kernel(s: &mut String, name: &str) {
    prologue(s, name);
    s.push_str(
        "\tsetp.lt.u64 %more, %i, %n;\n\
         \t@!%more bra $done;\n\
         $loop:\n\
         \tshl.b64 %off, %i, 2;\n",
    );
    one_element(s, "ld.global");
    s.push_str(
        "\tadd.u64 %i, %i, %stride;\n\
         \tsetp.lt.u64 %more, %i, %n;\n\
         \t@%more bra $loop;\n\
         $done:\n\tret;\n}\n\n",
    );
}
/// The loaded kernels of one handle, with the grid limit for its GPU.
pub(crate) struct FastKernels {
    relu: CudaFunction,
    relu_in_place: CudaFunction,
    relu_unaligned: CudaFunction,
    /// Kept to synchronize before the module is unloaded (see `Drop`).
    ctx: Arc<CudaContext>,
}

impl FastKernels {
    /// JIT-compiles the module (first target the driver accepts) and looks the kernels up.
    fn load(ctx: &Arc<CudaContext>) -> std::result::Result<Self, String> {
        let mut failures = Vec::new();
        for target in TARGETS {
            let module = match ctx.load_module(Ptx::from_src(relu_ptx(target))) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("PTX for {target}: {e}"));
                    continue;
                }
            };
            let function = |name: &str| {
                module
                    .load_function(name)
                    .map_err(|e| format!("kernel {name} ({target}): {e}"))
            };
            let (relu, relu_in_place, relu_unaligned) = (
                function(RELU)?,
                function(RELU_IN_PLACE)?,
                function(RELU_UNALIGNED)?,
            );
            return Ok(FastKernels {
                relu,
                relu_in_place,
                relu_unaligned,
                ctx: Arc::clone(ctx),
            });
        }
        Err(failures.join("; "))
    }
}

/// Blocks of [`BLOCK`] threads for `work` items (units or elements) of one thread each per
/// trip: enough for one item per thread (as PyTorch's elementwise kernels launch), at most the
/// grid's x limit, at least one block; the grid-stride loops cover any remainder.
pub(crate) fn blocks(work: u64) -> u32 {
    let wanted = work.div_ceil(u64::from(BLOCK));
    u32::try_from(wanted)
        .unwrap_or(u32::MAX)
        .clamp(1, GRID_X_LIMIT)
}

impl Drop for FastKernels {
    /// Unloading a module while one of its kernels may still run is not something the CUDA
    /// documentation allows, so wait for the context first. The handle's `cudnnDestroy` (which
    /// runs before its fields drop) already synchronizes the device, so this normally returns
    /// at once. Never panics: a failure is logged.
    fn drop(&mut self) {
        if let Err(e) = self.ctx.synchronize() {
            log::warn!("synchronizing before unloading the ReLU kernels: {e}");
        }
    }
}

/// The per-handle kernel cache: each part empty until the first launch that could use it, then
/// the loaded kernels or the remembered failure (the handle then stays on cuDNN).
#[derive(Default)]
pub(crate) struct KernelCache {
    /// The ReLU PTX module: loaded, or `None` (loading failed once).
    relu: OnceCell<Option<FastKernels>>,
    /// The generated activation modules, one per (activation, element type).
    pub(crate) elementwise: elementwise::ElementwiseCache,
}

impl KernelCache {
    /// Whether any kernels were loaded (so launches from them may still be in flight).
    pub(crate) fn is_loaded(&self) -> bool {
        matches!(self.relu.get(), Some(Some(_))) || self.elementwise.any_loaded()
    }
}

// `Cudnn` is `Send` by an `unsafe impl` that assumes its fields may move between threads; keep
// this cache one of them.
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<KernelCache>();
};

/// Which kernel a launch runs, from the pointers (byte addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReluKernel {
    /// Both 16-byte aligned and distinct.
    Vector,
    /// Both 16-byte aligned and equal.
    VectorInPlace,
    /// Both 4-byte aligned, not both 16-byte aligned.
    Scalar,
}

/// The kernel for pointers `x` and `y`, or `None` when one is not even 4-byte aligned (only a
/// foreign `DevicePtr` implementation could produce that; cuDNN then gets the call).
pub(crate) fn pick_relu_kernel(x: CUdeviceptr, y: CUdeviceptr) -> Option<ReluKernel> {
    if x % 16 == 0 && y % 16 == 0 {
        Some(if x == y {
            ReluKernel::VectorInPlace
        } else {
            ReluKernel::Vector
        })
    } else if x % 4 == 0 && y % 4 == 0 {
        Some(ReluKernel::Scalar)
    } else {
        None
    }
}

impl Cudnn {
    /// The handle's kernels, loaded on first use; `None` when they could not be loaded.
    fn fast_kernels(&self) -> Option<&FastKernels> {
        self.fast
            .relu
            .get_or_init(|| match FastKernels::load(self.context()) {
                Ok(k) => Some(k),
                Err(e) => {
                    log::debug!("cudnn-safe's ReLU kernel did not load, using cuDNN: {e}");
                    None
                }
            })
            .as_ref()
    }

    /// Enqueues `y[i] = alpha·relu(x[i]) + beta·y[i]` for `i` in `0..n` on the handle's stream
    /// (`y` not read when `beta == 0`; `relu(NaN)` per `nan`). Returns `Ok(false)`, having
    /// enqueued nothing, when the kernels are not available or a pointer is not 4-byte aligned:
    /// the caller then runs cuDNN.
    ///
    /// # Safety
    ///
    /// `x` and `y` are device addresses on this handle's context, each valid for `n` `f32`
    /// elements (`x` for reads, `y` for reads and writes), and stay allocated and ordered on
    /// [`Cudnn::stream`] until this returns (the caller holds cudarc's guards). Either `x == y`
    /// (in place) or the two ranges `[x, x + 4n)` and `[y, y + 4n)` are disjoint. Nothing
    /// else may write `x` while the kernel runs.
    pub(crate) unsafe fn relu_f32_fast(
        &self,
        x: CUdeviceptr,
        y: CUdeviceptr,
        n: usize,
        alpha: f32,
        beta: f32,
        nan: NanPropagation,
    ) -> Result<bool> {
        let Some(kernel) = pick_relu_kernel(x, y) else {
            return Ok(false);
        };
        if n == 0 {
            return Ok(true);
        }
        let Some(k) = self.fast_kernels() else {
            return Ok(false);
        };
        let n = n as u64;
        let (func, blocks) = match kernel {
            ReluKernel::Vector => (&k.relu, blocks(n / UNIT)),
            ReluKernel::VectorInPlace => (&k.relu_in_place, blocks(n / UNIT)),
            ReluKernel::Scalar => (&k.relu_unaligned, blocks(n)),
        };
        let propagate = u32::from(nan == NanPropagation::Propagate);
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
            .arg(&propagate);
        // SAFETY: the arguments match the kernel's parameters one for one in type and order
        // (u64, u64, u64, f32, f32, u32; `relu_ptx`). The kernel touches exactly the elements
        // `0..n` of `x` and `y` (every address is `base + 4·e` with `e < n`: units `u <
        // n / 4` cover `4u..4u + 4`, the tail covers `4·(n / 4)..n`, the scalar loop `0..n`),
        // which the caller guarantees are valid, on this context, alive and ordered on this
        // stream. The vector kernels are picked only for 16-byte aligned pointers (their
        // `v4` accesses need it), the scalar one for 4-byte aligned ones. `ld.global.nc`
        // (`relu_f32`) is used only for `x != y`, where the caller guarantees nothing writes
        // `x` during the kernel; `x == y` takes the kernel with coherent loads, where each
        // element is read and then written by one thread only. The grid is at least one
        // block, at most the grid's x limit, of `BLOCK` threads (the PTX's `.maxntid`), no shared
        // memory.
        unsafe { launch.launch(cfg) }
            .map_err(|e| Error::driver("launching cudnn-safe's ReLU kernel", e))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::{DevicePtr, DevicePtrMut};

    #[test]
    fn kernel_choice_follows_alignment() {
        let base = 0x7f00_0000_0000u64;
        assert_eq!(
            pick_relu_kernel(base, base + 4096),
            Some(ReluKernel::Vector)
        );
        assert_eq!(
            pick_relu_kernel(base + 16, base + 16),
            Some(ReluKernel::VectorInPlace)
        );
        // A view one f32 in (`slice(1..)`): x, y or both misaligned for v4 accesses.
        for (x, y) in [(base + 4, base), (base, base + 4), (base + 8, base + 8)] {
            assert_eq!(
                pick_relu_kernel(x, y),
                Some(ReluKernel::Scalar),
                "{x:#x} {y:#x}"
            );
        }
        assert_eq!(pick_relu_kernel(base + 2, base), None);
        assert_eq!(pick_relu_kernel(base, base + 1), None);
    }

    #[test]
    fn module_text_declares_each_kernel_once() {
        for target in TARGETS {
            let ptx = relu_ptx(target);
            assert!(ptx.contains(&format!(".target {target}\n")));
            for name in [RELU, RELU_IN_PLACE, RELU_UNALIGNED] {
                assert_eq!(ptx.matches(&format!(".entry {name}(")).count(), 1, "{name}");
            }
            // The read-only path only where x is never written, and y's loads are predicated
            // on beta ≠ 0 everywhere.
            assert_eq!(ptx.matches("ld.global.nc").count(), 2); // vector body + tail of relu_f32
            let y_loads = ptx.matches("], [%ay").count() + ptx.matches(", [%ay").count();
            assert_eq!(y_loads, ptx.matches("@!%b0 ld.global").count());
            assert!(!ptx.contains('\0'));
        }
    }

    /// On a GPU, the module loads (so `activation_forward` really takes this path there) and
    /// each kernel computes the reference through `relu_f32_fast`, with the kernel forced by the
    /// pointers. Skipped without a GPU unless `CUDNN_SAFE_REQUIRE_GPU=1`.
    #[test]
    fn kernels_load_and_run_on_the_gpu() {
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
        let k = cudnn
            .fast_kernels()
            .expect("the ReLU module must load on this GPU (else cuDNN runs every ReLU)");
        assert!(blocks(u64::MAX) == GRID_X_LIMIT && blocks(0) == 1);
        let _ = k;
        let stream = cudnn.stream().clone();
        let n = 4 * 1024 + 7;
        let xs: Vec<f32> = (0..n + 1)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0 + 1.0 / 64.0)
            .collect();
        let x = stream.clone_htod(&xs).unwrap();
        for (x_off, y_off, in_place, kernel) in [
            (0, 0, false, ReluKernel::Vector),
            (1, 1, false, ReluKernel::Scalar),
            (0, 0, true, ReluKernel::VectorInPlace),
            (1, 1, true, ReluKernel::Scalar),
        ] {
            let mut y = stream.alloc_zeros::<f32>(n + 1).unwrap();
            if in_place {
                stream.memcpy_dtod(&x, &mut y).unwrap();
            }
            {
                let xv = x.slice(x_off..x_off + n);
                let mut yv = y.slice_mut(y_off..y_off + n);
                let (xp, _gx) = xv.device_ptr(&stream);
                let (yp, _gy) = yv.device_ptr_mut(&stream);
                let xp = if in_place { yp } else { xp };
                assert_eq!(pick_relu_kernel(xp, yp), Some(kernel));
                // SAFETY: both views hold `n` f32 on this context, alive and ordered by the
                // guards; distinct buffers, or the same pointer in place.
                let ran =
                    unsafe { cudnn.relu_f32_fast(xp, yp, n, 1.0, 0.0, NanPropagation::Propagate) }
                        .unwrap();
                assert!(ran);
            }
            let got = stream.clone_dtoh(&y).unwrap();
            for i in 0..n {
                let want = xs[x_off + i].max(0.0);
                assert_eq!(got[y_off + i], want, "{kernel:?} element {i}");
            }
            // The one element of `y` outside the view keeps its value.
            let outside = if y_off == 0 { n } else { 0 };
            let before = if in_place { xs[outside] } else { 0.0 };
            assert_eq!(got[outside], before, "{kernel:?} wrote outside 0..n");
        }
    }

    /// Assembles the module with `ptxas` for the GPUs the crate targets, when one is at hand
    /// (`CUDNN_SAFE_PTXAS=/path/to/ptxas`, or `ptxas` on `PATH`); skipped otherwise. Catches
    /// PTX syntax and register errors without a GPU; the driver's JIT does the same work.
    #[test]
    fn module_assembles_with_ptxas() {
        let ptxas = std::env::var("CUDNN_SAFE_PTXAS").unwrap_or_else(|_| "ptxas".into());
        if std::process::Command::new(&ptxas)
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("skipping: no ptxas (set CUDNN_SAFE_PTXAS)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("cudnn-safe-ptx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (target, archs) in [
            ("sm_75", &["sm_75", "sm_90"][..]),
            ("sm_50", &["sm_75"][..]),
        ] {
            let src = dir.join(format!("relu_{target}.ptx"));
            std::fs::write(&src, relu_ptx(target)).unwrap();
            for arch in archs {
                let out = std::process::Command::new(&ptxas)
                    .args(["-v", "--gpu-name", arch, "-o"])
                    .arg(dir.join(format!("relu_{target}_{arch}.cubin")))
                    .arg(&src)
                    .output()
                    .unwrap();
                let log = String::from_utf8_lossy(&out.stderr);
                assert!(out.status.success(), "ptxas {target} -> {arch}:\n{log}");
                assert!(
                    !log.contains("spill stores") || log.contains("0 bytes spill stores"),
                    "{log}"
                );
                eprintln!("ptxas {target} -> {arch}:\n{log}");
            }
        }
        // CUDNN_SAFE_KEEP_PTX=1 keeps the PTX and cubins for a look with nvdisasm.
        if std::env::var_os("CUDNN_SAFE_KEEP_PTX").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            eprintln!("kept {}", dir.display());
        }
    }
}
