//! The f32 detour of reductions with bf16 on either side, which cuDNN 9.14's
//! `cudnnReduceTensor` refuses (see [`super::needs_f32_detour`]): bf16 data converted to f32
//! scratch, reduced in f32, the result converted back, all inside the caller's [`Workspace`].
use std::ffi::c_void;

use super::{query_sizes, reduce_descriptor, DescRef, ReduceOp};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::ops::{compute_type, ffi};
use crate::raw;
use crate::tensor::{Layout, TensorDesc, TensorFormat};
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};

/// Alignment of each part of a workspace shared by the f32 scratch tensors and cuDNN's own
/// reduction workspace: what `cudaMalloc` guarantees for the base, enough for any vectorised
/// access a kernel makes.
const SCRATCH_ALIGN: usize = 256;

/// Where the parts of the f32 detour lie in the workspace (byte offsets) and its total size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DetourLayout {
    /// The f32 copy of `a` (`a32_bytes` long; none when 0).
    a32: usize,
    /// The f32 result before it is converted into `c` (`c32_bytes` long; none when 0).
    c32: usize,
    /// cuDNN's reduction workspace.
    ws: usize,
    /// Bytes the workspace must hold.
    total: usize,
}

/// The parts laid end to end, each starting on a [`SCRATCH_ALIGN`] boundary; the total is
/// refused above [`MAX_WORKSPACE_BYTES`].
fn detour_layout(a32_bytes: usize, c32_bytes: usize, ws_bytes: usize) -> Result<DetourLayout> {
    let overflow = || Error::Overflow {
        what: "reduction workspace with f32 scratch",
        detail: format!(
            "{a32_bytes} + {c32_bytes} scratch bytes and {ws_bytes} bytes of cuDNN workspace"
        ),
    };
    let end = |start: usize, len: usize| {
        start
            .checked_add(len)
            .and_then(|e| e.checked_next_multiple_of(SCRATCH_ALIGN))
            .ok_or_else(overflow)
    };
    let a32 = 0;
    let c32 = end(a32, a32_bytes)?;
    let ws = end(c32, c32_bytes)?;
    let total = ws.checked_add(ws_bytes).ok_or_else(overflow)?;
    if total > MAX_WORKSPACE_BYTES {
        return Err(overflow());
    }
    Ok(DetourLayout {
        a32,
        c32,
        ws,
        total,
    })
}

/// The f32 scratch twin of a tensor: the same strides when `layout` is packed (so the
/// conversion is a straight element-wise pass), else packed channels-first.
fn scratch_desc(layout: &Layout) -> Result<TensorDesc<f32>> {
    let l = if layout.is_packed()
        && layout.is_non_overlapping()
        && !matches!(layout.format(), TensorFormat::NchwVectC { .. })
    {
        Layout::strided(layout.dims(), layout.strides())?
    } else {
        Layout::nchw_nd(layout.dims())?
    };
    TensorDesc::new(l)
}

/// Bytes of an f32 scratch tensor (0 when there is none).
fn scratch_bytes(desc: Option<&TensorDesc<f32>>) -> Result<usize> {
    desc.map_or(Ok(0), |d| {
        d.span()
            .checked_mul(std::mem::size_of::<f32>())
            .ok_or_else(|| Error::Overflow {
                what: "f32 scratch size",
                detail: format!("{} elements", d.span()),
            })
    })
}

/// Everything the f32 detour needs, decided before anything is enqueued.
struct F32Detour {
    /// The f32 reduction (compute type f32, no indices).
    desc: ffi::OwnedReduceTensor,
    /// `a` converted to f32, when `a` is bf16 (f32 and f16 data are reduced directly).
    a32: Option<TensorDesc<f32>>,
    /// The f32 result, when `c` is not f32 (it is then converted into `c`).
    c32: Option<TensorDesc<f32>>,
    /// cuDNN's workspace for reducing (`a32` or `a`) into (`c32` or `c`).
    ws_bytes: usize,
    layout: DetourLayout,
}

/// Plans the f32 detour of a reduction of `a` into `c` (types, shapes and buffers already
/// checked): the scratch descriptors, cuDNN's workspace size for the f32 reduction, and where
/// everything lies in the caller's workspace.
fn plan_f32_detour<A: DataType, C: DataType>(
    cudnn: &Cudnn,
    op: ReduceOp,
    a_desc: &TensorDesc<A>,
    c_desc: &TensorDesc<C>,
) -> Result<F32Detour> {
    let desc = reduce_descriptor(op, compute_type(DType::F32), false)?;
    let a32 = match A::DTYPE {
        DType::BF16 => Some(scratch_desc(a_desc.layout())?),
        _ => None,
    };
    let c32 = match C::DTYPE {
        DType::F32 => None,
        _ => Some(scratch_desc(c_desc.layout())?),
    };
    cudnn.bind()?;
    let src = a32.as_ref().map_or(DescRef::of(a_desc), DescRef::of);
    let dst = c32.as_ref().map_or(DescRef::of(c_desc), DescRef::of);
    let (ws_bytes, _) = query_sizes(cudnn, &desc, src, dst, false)?;
    let layout = detour_layout(
        scratch_bytes(a32.as_ref())?,
        scratch_bytes(c32.as_ref())?,
        ws_bytes,
    )?;
    Ok(F32Detour {
        desc,
        a32,
        c32,
        ws_bytes,
        layout,
    })
}

/// Workspace bytes the f32 detour of a reduction of `a` into `c` uses, in all (types, shapes
/// already checked).
pub(super) fn detour_bytes<A: DataType, C: DataType>(
    cudnn: &Cudnn,
    op: ReduceOp,
    a_desc: &TensorDesc<A>,
    c_desc: &TensorDesc<C>,
) -> Result<usize> {
    Ok(plan_f32_detour(cudnn, op, a_desc, c_desc)?.layout.total)
}

/// A reduction with bf16 on either side (see [`needs_f32_detour`](super::needs_f32_detour)), after every check of
/// [`validate`](super::validate):
///
/// 1. bf16 `a` → f32 scratch `a32` (`cudnnTransformTensor`, alpha 1, beta 0: exact);
/// 2. `cudnnReduceTensor` of `a32` (or an f32 / f16 `a` itself) in f32: into `c` with the
///    caller's alpha and beta when `c` is f32, else into f32 scratch `c32` with alpha, beta 0;
/// 3. when `c` is not f32: `c = 1·c32 + beta·c` (`cudnnTransformTensor`), so the blend with the
///    old `c` happens exactly once, in f32, and the result is rounded to `c`'s type once.
///
/// The scratch tensors and cuDNN's workspace share the caller's [`Workspace`], grown (within its
/// limit) to the total before anything is enqueued; `c` is written only by the last call.
#[allow(clippy::too_many_arguments)] // mirrors cudnnReduceTensor
pub(super) fn launch_f32_detour<A: DataType, C: DataType<Scalar = A::Scalar>>(
    cudnn: &Cudnn,
    op: ReduceOp,
    alpha: A::Scalar,
    a_desc: &TensorDesc<A>,
    a: &impl DeviceBuffer<A>,
    beta: A::Scalar,
    c_desc: &TensorDesc<C>,
    c: &mut impl DeviceBufferMut<C>,
    workspace: &mut Workspace,
) -> Result<()> {
    use crate::dtype::Scalar;
    let plan = plan_f32_detour(cudnn, op, a_desc, c_desc)?;
    workspace.prepare(plan.layout.total)?;
    let one = <A::Scalar as Scalar>::from_f64(1.0);
    let zero = <A::Scalar as Scalar>::from_f64(0.0);
    let scalar = |s: &A::Scalar| (s as *const A::Scalar).cast::<c_void>();
    let (lib, handle) = (cudnn.lib(), cudnn.as_raw());
    let stream: &cudarc::driver::CudaStream = cudnn.stream();
    let (ap, _ga) = a.device_ptr(stream);
    let (cp, _gc) = c.device_ptr_mut(stream);
    let (base, _gws) = workspace.device_ptr_mut(cudnn.stream())?;
    // Device addresses inside the workspace; integer arithmetic, never dereferenced on the host.
    let at = |offset: usize| (base as usize + offset) as *mut c_void;

    let (src_desc, src) = match &plan.a32 {
        Some(a32) => {
            // SAFETY: live handle and descriptors; `a` holds its span on the handle's context
            // (checked by `validate`); the destination is the workspace region at
            // `layout.a32`, `scratch_bytes(a32)` = 4·span(a32) bytes long, inside the
            // `layout.total` bytes `prepare` guaranteed, 256-byte aligned and disjoint from
            // the other regions and from `a` (a separate allocation); alpha/beta are f32, the
            // scalar type of bf16 and f32 tensors; the guards keep every buffer alive and
            // ordered until the call is enqueued.
            unsafe {
                raw::cudnnTransformTensor(
                    lib,
                    handle,
                    scalar(&one),
                    a_desc.as_raw(),
                    ap as *const c_void,
                    scalar(&zero),
                    a32.as_raw(),
                    at(plan.layout.a32),
                )
            }?;
            (a32.as_raw(), at(plan.layout.a32) as *const c_void)
        }
        None => (a_desc.as_raw(), ap as *const c_void),
    };
    let (dst_desc, dst, reduce_beta) = match &plan.c32 {
        Some(c32) => (c32.as_raw(), at(plan.layout.c32), zero),
        None => (c_desc.as_raw(), cp as *mut c_void, beta),
    };
    let ws = if plan.ws_bytes == 0 {
        std::ptr::null_mut()
    } else {
        at(plan.layout.ws)
    };
    // SAFETY: live handle and descriptors; the source is `a` (f32 or f16, its span on this
    // context, checked) or the `a32` scratch written above, the destination `c` (f32: its span
    // on this context and not self-overlapping, checked) or the `c32` scratch region (4·span
    // bytes inside the prepared workspace); each type pair is one cuDNN reduces (f32 or f16
    // into f32, compute type f32, no indices: null pointer, size 0); cuDNN's workspace is the
    // region at `layout.ws` holding the `ws_bytes` it asked for these descriptors, disjoint
    // from both scratch regions; alpha/beta are f32, the compute type's scalar; the guards
    // keep every buffer alive and ordered until the call is enqueued.
    unsafe {
        ffi::cudnnReduceTensor(
            lib,
            handle,
            plan.desc.as_ptr(),
            std::ptr::null_mut(),
            0,
            ws,
            plan.ws_bytes,
            scalar(&alpha),
            src_desc,
            src,
            scalar(&reduce_beta),
            dst_desc,
            dst,
        )
    }?;
    if let Some(c32) = &plan.c32 {
        // SAFETY: live handle and descriptors; the source is the `c32` scratch the reduction
        // just wrote (4·span(c32) bytes inside the prepared workspace), the destination `c`
        // holds its span on this context and does not overlap itself (checked) nor the
        // workspace (a separate allocation); alpha/beta are f32, the scalar type of every
        // non-f64 tensor; the guards keep every buffer alive and ordered until enqueued.
        unsafe {
            raw::cudnnTransformTensor(
                lib,
                handle,
                scalar(&one),
                c32.as_raw(),
                at(plan.layout.c32) as *const c_void,
                scalar(&beta),
                c_desc.as_raw(),
                cp as *mut c_void,
            )
        }?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::lib_or_skip;

    #[test]
    fn detour_parts_are_aligned_and_disjoint() {
        let l = detour_layout(480, 12, 1000).unwrap();
        assert_eq!(
            l,
            DetourLayout {
                a32: 0,
                c32: 512,
                ws: 768,
                total: 1768
            }
        );
        // No f32 copy of `a` (f32 / f16 data) or of the result (f32 `c`).
        let l = detour_layout(0, 12, 0).unwrap();
        assert_eq!((l.c32, l.ws, l.total), (0, 256, 256));
        let l = detour_layout(480, 0, 0).unwrap();
        assert_eq!((l.c32, l.ws, l.total), (512, 512, 512));
        // Exact multiples are not padded further.
        let l = detour_layout(256, 256, 7).unwrap();
        assert_eq!((l.c32, l.ws, l.total), (256, 512, 519));
        for (a, c, w) in [
            (usize::MAX, 4, 0),
            (4, 4, usize::MAX),
            (MAX_WORKSPACE_BYTES, 4, 4),
        ] {
            let e = detour_layout(a, c, w).unwrap_err();
            assert!(matches!(e, Error::Overflow { .. }), "{e}");
        }
    }

    #[test]
    fn scratch_keeps_packed_strides() {
        let Some(()) = lib_or_skip() else { return };
        let nhwc = Layout::nhwc(2, 3, 4, 5).unwrap();
        let s = scratch_desc(&nhwc).unwrap();
        assert_eq!(s.layout().strides(), nhwc.strides());
        assert_eq!(s.span(), 120);
        assert_eq!(scratch_bytes(Some(&s)).unwrap(), 480);
        assert_eq!(scratch_bytes(None).unwrap(), 0);
        // A padded layout gets a packed channels-first scratch of the same dimensions.
        let padded = Layout::strided(&[2, 3, 4, 5], &[105, 35, 7, 1]).unwrap();
        let s = scratch_desc(&padded).unwrap();
        assert_eq!(s.dims(), padded.dims());
        assert_eq!(s.layout().strides(), &[60, 20, 5, 1]);
        assert_eq!(s.size_in_bytes().unwrap(), 480);
    }
}
