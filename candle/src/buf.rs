//! Device views of candle storage, checked to lie within it, and new result buffers.
use candle_core::backend::BackendStorage;
use candle_core::op::BackpropOp;
use candle_core::{CudaStorage, Layout, Storage, Tensor};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaView};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::DataType;

use crate::error::Error;

/// An element type the operations run, with candle's CUDA storage access.
pub(crate) trait Elem:
    DataType + candle_core::cuda::CudaDType + cudnn_safe::cudarc::driver::DeviceRepr
{
}
impl Elem for f32 {}
impl Elem for f16 {}
impl Elem for bf16 {}

/// The part `range` of a storage's slice, checked to lie within it.
pub(crate) fn view<'a, T>(
    s: &'a CudaSlice<T>,
    range: std::ops::Range<usize>,
    op: &'static str,
    arg: &'static str,
) -> candle_core::Result<CudaView<'a, T>> {
    if range.start > range.end || range.end > s.len() {
        return Err(Error::invalid(
            op,
            arg,
            format!("a layout within its storage of {} elements", s.len()),
            range,
        ));
    }
    Ok(s.slice(range))
}

/// A packed (contiguous) tensor's elements of its storage, checked to lie within it.
pub(crate) fn packed<'a, T>(
    s: &'a CudaSlice<T>,
    l: &Layout,
    op: &'static str,
    arg: &'static str,
) -> candle_core::Result<CudaView<'a, T>> {
    if !l.is_contiguous() {
        return Err(Error::invalid(op, arg, "contiguous", l.stride()));
    }
    let start = l.start_offset();
    view(s, start..start + l.shape().elem_count(), op, arg)
}

/// A new zero-filled buffer of `len` elements on the handle's stream.
pub(crate) fn output<T: Elem>(
    cudnn: &cudnn_safe::Cudnn,
    len: usize,
    what: &'static str,
) -> cudnn_safe::Result<CudaSlice<T>> {
    cudnn
        .stream()
        .alloc_zeros::<T>(len)
        .map_err(|e| cudnn_safe::Error::driver(what, e))
}

/// The CUDA slice of a candle storage.
pub(crate) fn cuda_slice<'a, T: Elem>(
    s: &'a Storage,
    op: &'static str,
    arg: &'static str,
) -> candle_core::Result<&'a CudaSlice<T>> {
    match s {
        Storage::Cuda(c) => c.as_cuda_slice::<T>(),
        _ => Err(Error::invalid(
            op,
            arg,
            "on a CUDA device",
            "another device",
        )),
    }
}

/// The CUDA device of a candle storage.
pub(crate) fn cuda_device(
    s: &Storage,
    op: &'static str,
    arg: &'static str,
) -> candle_core::Result<candle_core::CudaDevice> {
    match s {
        Storage::Cuda(c) => Ok(c.device().clone()),
        _ => Err(Error::invalid(
            op,
            arg,
            "on a CUDA device",
            "another device",
        )),
    }
}

/// A packed tensor of `dims` over a new buffer, outside autograd (a gradient).
pub(crate) fn tensor<T: Elem>(
    slice: CudaSlice<T>,
    dev: &candle_core::CudaDevice,
    dims: Vec<usize>,
) -> Tensor {
    Tensor::from_storage(
        Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, dev.clone())),
        dims,
        BackpropOp::none(),
        false,
    )
}

/// Whether a tensor's first element is 16-byte aligned (the graph engines' requirement; a new
/// allocation is).
pub(crate) fn aligned(t: &Tensor) -> bool {
    (t.layout().start_offset() * t.dtype().size_in_bytes()).is_multiple_of(16)
}

/// `t` packed row-major with a 16-byte aligned start: itself when it is, a copy otherwise
/// (gradients pass through the copy).
pub(crate) fn packed_aligned(t: &Tensor) -> candle_core::Result<Tensor> {
    if t.is_contiguous() && aligned(t) {
        Ok(t.clone())
    } else {
        t.force_contiguous()
    }
}
