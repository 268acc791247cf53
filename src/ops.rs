//! Element-wise tensor operations: add with broadcast, scale, set, transform.
//!
//! Each checks, before anything is enqueued: every buffer is on the handle's context and holds
//! its descriptor's span, outputs do not overlap themselves, shapes agree, and alpha/beta are
//! passed as the scalar type cuDNN reads for the tensors' dtype.
use std::ffi::c_void;

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::TensorDesc;

impl Cudnn {
    /// `c = alpha·a + beta·c`, where each dimension of `a` equals `c`'s or is 1 (broadcast, e.g.
    /// a per-channel bias `[1, C, 1, 1]` added to `[N, C, H, W]`).
    ///
    /// With `beta == 0` the old contents of `c` are not read.
    ///
    /// ```no_run
    /// # fn main() -> cudnn_safe::Result<()> {
    /// use cudnn_safe::{cuda_context, Cudnn, TensorDesc};
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let bias_d = TensorDesc::<f32>::nchw(1, 3, 1, 1)?;
    /// let y_d = TensorDesc::<f32>::nchw(2, 3, 4, 4)?;
    /// let bias = stream.clone_htod(&[1.0f32, 2.0, 3.0]).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
    /// cudnn.add_tensor(1.0, &bias_d, &bias, 1.0, &y_d, &mut y)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cudnnAddTensor")]
    pub fn add_tensor<T: DataType>(
        &self,
        alpha: T::Scalar,
        a_desc: &TensorDesc<T>,
        a: &impl DevicePtr<T>,
        beta: T::Scalar,
        c_desc: &TensorDesc<T>,
        c: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        let (ad, cd) = (a_desc.dims(), c_desc.dims());
        if ad.len() != cd.len() || ad.iter().zip(cd).any(|(&x, &y)| x != y && x != 1) {
            return Err(Error::ShapeMismatch {
                a: "a",
                a_dims: ad.to_vec(),
                b: "c",
                b_dims: cd.to_vec(),
                rule: "same rank, each dimension of a equal to c's or 1",
            });
        }
        self.check_tensor("a", a_desc.layout(), a, false)?;
        self.check_tensor("c", c_desc.layout(), c, true)?;
        self.bind()?;
        let stream: &cudarc::driver::CudaStream = self.stream();
        let (ap, _ga) = a.device_ptr(stream);
        let (cp, _gc) = c.device_ptr_mut(stream);
        // SAFETY: live handle and descriptors; `a` and `c` hold at least their descriptors' spans
        // on the handle's context (checked above); alpha/beta are `T::Scalar`, the type cuDNN
        // reads for `T`; the guards keep the buffers alive and ordered until enqueued.
        unsafe {
            raw::cudnnAddTensor(
                self.lib(),
                self.as_raw(),
                (&alpha as *const T::Scalar).cast::<c_void>(),
                a_desc.as_raw(),
                ap as *const c_void,
                (&beta as *const T::Scalar).cast::<c_void>(),
                c_desc.as_raw(),
                cp as *mut c_void,
            )
        }
    }

    /// `y = alpha·y`, in place.
    #[doc(alias = "cudnnScaleTensor")]
    pub fn scale_tensor<T: DataType>(
        &self,
        y_desc: &TensorDesc<T>,
        y: &mut impl DevicePtrMut<T>,
        alpha: T::Scalar,
    ) -> Result<()> {
        self.check_tensor("y", y_desc.layout(), y, true)?;
        self.bind()?;
        let stream: &cudarc::driver::CudaStream = self.stream();
        let (yp, _gy) = y.device_ptr_mut(stream);
        // SAFETY: live handle and descriptor; `y` holds its span on this context and is not
        // self-overlapping (checked); alpha is `T::Scalar`.
        unsafe {
            raw::cudnnScaleTensor(
                self.lib(),
                self.as_raw(),
                y_desc.as_raw(),
                yp as *mut c_void,
                (&alpha as *const T::Scalar).cast::<c_void>(),
            )
        }
    }

    /// Sets every element `y` addresses to `value`.
    ///
    /// cuDNN's documentation says the value is read as the tensor's own type, but cuDNN 9 reads
    /// it as `f32` for f16, bf16 and 8-bit tensors (measured on the H200: passing a 2-byte half
    /// made it read past the value). This crate hands cuDNN the value in the representation it
    /// reads (`f64` for f64, `i32` for i32, `f32` otherwise) from an 8-byte buffer, so no
    /// interpretation can read beyond it.
    #[doc(alias = "cudnnSetTensor")]
    pub fn set_tensor<T: DataType>(
        &self,
        y_desc: &TensorDesc<T>,
        y: &mut impl DevicePtrMut<T>,
        value: T,
    ) -> Result<()> {
        self.check_tensor("y", y_desc.layout(), y, true)?;
        let value = set_value_repr(value);
        self.bind()?;
        let stream: &cudarc::driver::CudaStream = self.stream();
        let (yp, _gy) = y.device_ptr_mut(stream);
        // SAFETY: live handle and descriptor; `y` holds its span on this context and does not
        // overlap itself (checked); the value is an 8-byte, 8-aligned host word holding the
        // representation cuDNN reads for `T` (at most 8 bytes are ever read).
        unsafe {
            raw::cudnnSetTensor(
                self.lib(),
                self.as_raw(),
                y_desc.as_raw(),
                yp as *mut c_void,
                (&value as *const u64).cast::<c_void>(),
            )
        }
    }

    /// `y = alpha·x + beta·y`, where `x` and `y` have the same dimensions but may differ in
    /// layout (e.g. NCHW ↔ NHWC) and in data type (e.g. f32 → f16).
    ///
    /// Both types must read alpha/beta as the same scalar type, which the bound
    /// `Y: DataType<Scalar = X::Scalar>` enforces (f64 converts only to and from f64).
    #[doc(alias = "cudnnTransformTensor")]
    pub fn transform_tensor<X: DataType, Y: DataType<Scalar = X::Scalar>>(
        &self,
        alpha: X::Scalar,
        x_desc: &TensorDesc<X>,
        x: &impl DevicePtr<X>,
        beta: X::Scalar,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DevicePtrMut<Y>,
    ) -> Result<()> {
        if x_desc.dims() != y_desc.dims() {
            return Err(Error::ShapeMismatch {
                a: "x",
                a_dims: x_desc.dims().to_vec(),
                b: "y",
                b_dims: y_desc.dims().to_vec(),
                rule: "transform keeps the dimensions; only layout and type change",
            });
        }
        self.check_tensor("x", x_desc.layout(), x, false)?;
        self.check_tensor("y", y_desc.layout(), y, true)?;
        self.bind()?;
        let stream: &cudarc::driver::CudaStream = self.stream();
        let (xp, _gx) = x.device_ptr(stream);
        let (yp, _gy) = y.device_ptr_mut(stream);
        // SAFETY: live handle and descriptors; both buffers hold their spans on this context;
        // `y` does not overlap itself and cannot alias `x` (`&` vs `&mut`); alpha/beta are the
        // scalar type both dtypes share.
        unsafe {
            raw::cudnnTransformTensor(
                self.lib(),
                self.as_raw(),
                (&alpha as *const X::Scalar).cast::<c_void>(),
                x_desc.as_raw(),
                xp as *const c_void,
                (&beta as *const X::Scalar).cast::<c_void>(),
                y_desc.as_raw(),
                yp as *mut c_void,
            )
        }
    }
}

/// The host word `cudnnSetTensor` reads for a `T` value: `f64` for f64, `i32` for i32, `f32` for
/// every other type (half, bfloat16, 8-bit), in the low bytes of an aligned 8-byte word.
fn set_value_repr<T: DataType>(value: T) -> u64 {
    let mut bytes = [0u8; 8];
    match T::DTYPE {
        DType::F64 => bytes.copy_from_slice(&value.to_f64().to_ne_bytes()),
        DType::I32 => bytes[..4].copy_from_slice(&(value.to_f64() as i32).to_ne_bytes()),
        _ => bytes[..4].copy_from_slice(&(value.to_f64() as f32).to_ne_bytes()),
    }
    u64::from_ne_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_values_use_the_representation_cudnn_reads() {
        let word = |v: u64| v.to_ne_bytes();
        assert_eq!(word(set_value_repr(1.5f64)), 1.5f64.to_ne_bytes());
        assert_eq!(word(set_value_repr(-7i32))[..4], (-7i32).to_ne_bytes());
        assert_eq!(
            word(set_value_repr(half::f16::from_f32(0.5)))[..4],
            0.5f32.to_ne_bytes()
        );
        assert_eq!(
            word(set_value_repr(half::bf16::from_f32(-2.0)))[..4],
            (-2.0f32).to_ne_bytes()
        );
        assert_eq!(word(set_value_repr(-5i8))[..4], (-5.0f32).to_ne_bytes());
        assert_eq!(word(set_value_repr(200u8))[..4], 200.0f32.to_ne_bytes());
        assert_eq!(word(set_value_repr(0.25f32))[..4], 0.25f32.to_ne_bytes());
    }
}
