//! Softmax over the last dimension.
use candle_core::{
    backend::BackendStorage, CpuStorage, CudaStorage, CustomOp1, DType, Layout, Shape, Tensor, D,
};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{DataType, Scalar, SoftmaxAlgorithm, SoftmaxMode, TensorDesc};

use crate::error::{wrap, Error};
use crate::state::with_state;

const OP: &str = "softmax_last_dim";

/// `softmax(x)` over the last dimension (as `candle_nn::ops::softmax_last_dim`): cuDNN's
/// accurate softmax on a CUDA device, with its gradient in candle's autograd; candle's own ops
/// on the CPU. f32, f16 and bf16; a non-contiguous `x` is made contiguous first.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// let dev = candle_core::Device::new_cuda(0)?;
/// let x = candle_core::Tensor::randn(0f32, 1.0, (4, 1000), &dev)?;
/// let p = cudnn_safe_candle::softmax_last_dim(&x)?;
/// # Ok(()) }
/// ```
pub fn softmax_last_dim(x: &Tensor) -> candle_core::Result<Tensor> {
    match x.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => {}
        d => return Err(Error::dtype(OP, "x", d)),
    }
    if x.rank() == 0 {
        return Err(Error::invalid(OP, "x", "at least one dimension", x.dims()));
    }
    if x.elem_count() == 0 {
        return x.zeros_like();
    }
    if x.device().is_cpu() {
        let m = x.max_keepdim(D::Minus1)?;
        let e = x.broadcast_sub(&m)?.exp()?;
        return e.broadcast_div(&e.sum_keepdim(D::Minus1)?);
    }
    x.contiguous()?.apply_op1(Softmax)
}

struct Softmax;

impl Softmax {
    fn run<T: DataType + candle_core::cuda::CudaDType + cudnn_safe::cudarc::driver::DeviceRepr>(
        &self,
        s: &CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let n = l.shape().elem_count();
        let cols = l.dims().last().copied().unwrap_or(1);
        let rows = n / cols.max(1);
        if !l.is_contiguous() {
            return Err(Error::invalid(OP, "x", "contiguous", l.stride()));
        }
        let dev = s.device().clone();
        let all = s.as_cuda_slice::<T>()?;
        let range = l.start_offset()..l.start_offset() + n;
        if range.end > all.len() {
            return Err(Error::invalid(
                OP,
                "x",
                format!("a layout within its storage of {} elements", all.len()),
                range,
            ));
        }
        let x = all.slice(range);
        // [rows, cols] as [rows, cols, 1, 1]: channel mode normalizes over cols per row.
        let d = TensorDesc::<T>::nchw(rows as i64, cols as i64, 1, 1).map_err(wrap)?;
        let y = with_state(&dev, |cudnn, _, _| {
            let mut y = cudnn
                .stream()
                .alloc_zeros::<T>(n)
                .map_err(|e| cudnn_safe::Error::driver("allocating the softmax output", e))?;
            cudnn.softmax_forward(
                SoftmaxAlgorithm::Accurate,
                SoftmaxMode::Channel,
                T::Scalar::from_f64(1.0),
                &d,
                &x,
                T::Scalar::from_f64(0.0),
                &d,
                &mut y,
            )?;
            Ok(y)
        })?;
        Ok((CudaStorage::wrap_cuda_slice(y, dev), l.shape().clone()))
    }
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "cudnn-safe-softmax-last-dim"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(Error::invalid(
            OP,
            "device",
            "a CUDA device for the cuDNN operation (softmax_last_dim runs candle's own on the CPU)",
            "cpu",
        ))
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        match s.dtype() {
            DType::F32 => self.run::<f32>(s, l),
            DType::F16 => self.run::<f16>(s, l),
            DType::BF16 => self.run::<bf16>(s, l),
            d => Err(Error::dtype(OP, "x", d)),
        }
    }

    /// dx = y ⊙ (g − Σ g ⊙ y) over the last dimension.
    fn bwd(&self, _x: &Tensor, y: &Tensor, g: &Tensor) -> candle_core::Result<Option<Tensor>> {
        let dot = (g * y)?.sum_keepdim(D::Minus1)?;
        Ok(Some((y * g.broadcast_sub(&dot)?)?))
    }
}
