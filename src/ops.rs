//! Element-wise tensor operations: add with broadcast, scale, set, transform, and the binary and
//! unary op-tensor family (`cudnnOpTensor`: add, multiply, min, max, sqrt, not).
//!
//! Each checks, before anything is enqueued: every buffer is on the handle's context and holds
//! its descriptor's span, outputs do not overlap themselves, shapes agree, and alpha/beta are
//! passed as the scalar type cuDNN reads for the tensors' dtype.
use std::ffi::c_void;

use cudnn_safe_sys as sys;

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::checks::{broadcasts_to, call_xy, require_shapes, scalar_ptr, Arg, ArgMut, NoBuffer};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::{TensorDesc, TensorFormat};

/// The C calls of the op-tensor and reduction families (`reduce.rs` uses the latter), declared
/// here as their own.
pub(crate) mod ffi {
    #![allow(non_snake_case)] // the C names, so a search for them finds these

    use std::ffi::c_void;

    use cudnn_safe_sys as sys;

    crate::raw::raw_fns! {
        fn cudnnCreateOpTensorDescriptor(desc: *mut sys::cudnnOpTensorDescriptor_t);
        fn cudnnDestroyOpTensorDescriptor(desc: sys::cudnnOpTensorDescriptor_t);
        fn cudnnSetOpTensorDescriptor(
            desc: sys::cudnnOpTensorDescriptor_t,
            op: sys::cudnnOpTensorOp_t,
            compute_type: sys::cudnnDataType_t,
            nan: sys::cudnnNanPropagation_t,
        );
        fn cudnnOpTensor(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnOpTensorDescriptor_t,
            alpha1: *const c_void,
            a_desc: sys::cudnnTensorDescriptor_t,
            a: *const c_void,
            alpha2: *const c_void,
            b_desc: sys::cudnnTensorDescriptor_t,
            b: *const c_void,
            beta: *const c_void,
            c_desc: sys::cudnnTensorDescriptor_t,
            c: *mut c_void,
        );
        fn cudnnCreateReduceTensorDescriptor(desc: *mut sys::cudnnReduceTensorDescriptor_t);
        fn cudnnDestroyReduceTensorDescriptor(desc: sys::cudnnReduceTensorDescriptor_t);
        fn cudnnSetReduceTensorDescriptor(
            desc: sys::cudnnReduceTensorDescriptor_t,
            op: sys::cudnnReduceTensorOp_t,
            compute_type: sys::cudnnDataType_t,
            nan: sys::cudnnNanPropagation_t,
            indices: sys::cudnnReduceTensorIndices_t,
            indices_type: sys::cudnnIndicesType_t,
        );
        fn cudnnGetReductionIndicesSize(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnReduceTensorDescriptor_t,
            a_desc: sys::cudnnTensorDescriptor_t,
            c_desc: sys::cudnnTensorDescriptor_t,
            bytes: *mut usize,
        );
        fn cudnnGetReductionWorkspaceSize(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnReduceTensorDescriptor_t,
            a_desc: sys::cudnnTensorDescriptor_t,
            c_desc: sys::cudnnTensorDescriptor_t,
            bytes: *mut usize,
        );
        fn cudnnReduceTensor(
            handle: sys::cudnnHandle_t,
            desc: sys::cudnnReduceTensorDescriptor_t,
            indices: *mut c_void,
            indices_bytes: usize,
            workspace: *mut c_void,
            workspace_bytes: usize,
            alpha: *const c_void,
            a_desc: sys::cudnnTensorDescriptor_t,
            a: *const c_void,
            beta: *const c_void,
            c_desc: sys::cudnnTensorDescriptor_t,
            c: *mut c_void,
        );
    }

    crate::raw::owned_descriptor!(
        /// An owned `cudnnOpTensorDescriptor_t`.
        OwnedOpTensor,
        sys::cudnnOpTensorDescriptor_t,
        cudnnCreateOpTensorDescriptor,
        cudnnDestroyOpTensorDescriptor
    );

    crate::raw::owned_descriptor!(
        /// An owned `cudnnReduceTensorDescriptor_t`.
        OwnedReduceTensor,
        sys::cudnnReduceTensorDescriptor_t,
        cudnnCreateReduceTensorDescriptor,
        cudnnDestroyReduceTensorDescriptor
    );
}

/// The operation of [`Cudnn::op_tensor`] (`cudnnOpTensorOp_t`), applied to `alpha1·a` and
/// `alpha2·b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpTensorOp {
    /// `alpha1·a + alpha2·b`.
    Add,
    /// `alpha1·a · alpha2·b`.
    Mul,
    /// `min(alpha1·a, alpha2·b)`.
    Min,
    /// `max(alpha1·a, alpha2·b)`.
    Max,
    /// `sqrt(alpha1·a)`: unary, `b` is not read.
    Sqrt,
    /// `1 − alpha1·a` (cuDNN's "negation", a logical not for values in `[0, 1]`): unary, `b` is
    /// not read.
    Not,
}

impl OpTensorOp {
    /// Every operation, for tests and exhaustive loops.
    pub const ALL: [OpTensorOp; 6] = [
        OpTensorOp::Add,
        OpTensorOp::Mul,
        OpTensorOp::Min,
        OpTensorOp::Max,
        OpTensorOp::Sqrt,
        OpTensorOp::Not,
    ];

    /// Whether the operation reads only `a` (`Sqrt`, `Not`).
    pub fn is_unary(self) -> bool {
        matches!(self, OpTensorOp::Sqrt | OpTensorOp::Not)
    }

    fn raw(self) -> sys::cudnnOpTensorOp_t {
        use sys::cudnnOpTensorOp_t as O;
        match self {
            OpTensorOp::Add => O::CUDNN_OP_TENSOR_ADD,
            OpTensorOp::Mul => O::CUDNN_OP_TENSOR_MUL,
            OpTensorOp::Min => O::CUDNN_OP_TENSOR_MIN,
            OpTensorOp::Max => O::CUDNN_OP_TENSOR_MAX,
            OpTensorOp::Sqrt => O::CUDNN_OP_TENSOR_SQRT,
            OpTensorOp::Not => O::CUDNN_OP_TENSOR_NOT,
        }
    }
}

/// Most dimensions `cudnnOpTensor` takes (NVIDIA: "all tensor formats up to dimension five").
pub const OP_TENSOR_MAX_DIMS: usize = 5;

/// The compute type of element-wise ops and reductions: `double` for f64 data, `float`
/// otherwise (what cuDNN requires for every same-type combination it supports).
pub(crate) fn compute_type(dtype: DType) -> sys::cudnnDataType_t {
    if dtype == DType::F64 {
        sys::cudnnDataType_t::CUDNN_DATA_DOUBLE
    } else {
        sys::cudnnDataType_t::CUDNN_DATA_FLOAT
    }
}

/// Creates and sets an op-tensor descriptor for `op` on `T` data (host only; no GPU needed).
fn op_tensor_descriptor<T: DataType>(op: OpTensorOp) -> Result<ffi::OwnedOpTensor> {
    let lib = raw::lib()?;
    let desc = ffi::OwnedOpTensor::new(lib)?;
    // SAFETY: live descriptor; the op, compute type and NaN option are values cuDNN defines.
    unsafe {
        ffi::cudnnSetOpTensorDescriptor(
            lib,
            desc.as_ptr(),
            op.raw(),
            compute_type(T::DTYPE),
            sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
        )
    }?;
    Ok(desc)
}

/// The data types `cudnnOpTensor` runs with all three tensors of one type.
fn check_op_tensor_dtype<T: DataType>() -> Result<()> {
    match T::DTYPE {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::I8 => Ok(()),
        d => Err(Error::UnsupportedDataType {
            op: "op tensor",
            detail: format!("{d} (cudnnOpTensor takes f32, f64, f16, bf16 or i8 tensors)"),
        }),
    }
}

/// cuDNN's shape rule for `cudnnOpTensor`: `a` has `c`'s dimensions; each dimension of `b` is
/// `c`'s or 1; at most [`OP_TENSOR_MAX_DIMS`] dimensions; no vectorised (`NCHW_VECT_C`) layout.
pub(crate) fn check_op_tensor_shapes<T: DataType>(
    a_desc: &TensorDesc<T>,
    b_desc: &TensorDesc<T>,
    c_desc: &TensorDesc<T>,
) -> Result<()> {
    let cd = c_desc.dims();
    if cd.len() > OP_TENSOR_MAX_DIMS {
        return Err(Error::invalid(
            "op tensor rank",
            format!("at most {OP_TENSOR_MAX_DIMS} dimensions"),
            format!("{} dimensions {cd:?}", cd.len()),
        ));
    }
    for (name, d) in [("a", a_desc), ("b", b_desc), ("c", c_desc)] {
        if let TensorFormat::NchwVectC { .. } = d.layout().format() {
            return Err(Error::invalid(
                "op tensor layout",
                "a layout other than NCHW_VECT_C",
                format!("`{name}` is NCHW_VECT_C"),
            ));
        }
    }
    let (ad, bd) = (a_desc.dims(), b_desc.dims());
    let rule = "a has c's dimensions (only b broadcasts)";
    require_shapes(ad == cd, ("a", ad), ("c", cd), rule)?;
    let rule = "same rank, each dimension of b equal to c's or 1";
    require_shapes(broadcasts_to(bd, cd), ("b", bd), ("c", cd), rule)
}

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
        a: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        c_desc: &TensorDesc<T>,
        c: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let (ad, cd) = (a_desc.dims(), c_desc.dims());
        let rule = "same rank, each dimension of a equal to c's or 1";
        require_shapes(broadcasts_to(ad, cd), ("a", ad), ("c", cd), rule)?;
        let args = self.xy_args(&alpha, ("a", a_desc, a), &beta, ("c", c_desc, c))?;
        // SAFETY: live handle and descriptors; `a` and `c` hold at least their descriptors' spans
        // on the handle's context, `c` does not overlap itself (checked by `xy_args`); each
        // dimension of `a` is `c`'s or 1 (checked above); alpha/beta are `T::Scalar`, the type
        // cuDNN reads for `T`; the guards in `args` keep the buffers alive and ordered until
        // enqueued.
        unsafe { call_xy!(raw::cudnnAddTensor, self, [], args) }
    }

    /// `y = alpha·y`, in place.
    #[doc(alias = "cudnnScaleTensor")]
    pub fn scale_tensor<T: DataType>(
        &self,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
        alpha: T::Scalar,
    ) -> Result<()> {
        let (yp, _gy) = self.y_arg(("y", y_desc, y))?;
        // SAFETY: live handle and descriptor; `y` holds its span on this context and is not
        // self-overlapping (checked by `y_arg`); alpha is `T::Scalar`; the guard keeps `y` alive
        // and ordered until enqueued.
        unsafe {
            raw::cudnnScaleTensor(
                self.lib(),
                self.as_raw(),
                y_desc.as_raw(),
                yp,
                scalar_ptr(&alpha),
            )
        }
    }

    /// Sets every element `y` addresses to `value`.
    ///
    /// cuDNN's documentation says the value is read as the tensor's own type, but cuDNN 9 reads
    /// it as `f32` for f16, bf16 and 8-bit tensors (a 2-byte half passed as documented made it
    /// read past the value). This crate hands cuDNN the value in the representation it
    /// reads (`f64` for f64, `i32` for i32, `f32` otherwise) from an 8-byte buffer, so no
    /// interpretation can read beyond it.
    #[doc(alias = "cudnnSetTensor")]
    pub fn set_tensor<T: DataType>(
        &self,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
        value: T,
    ) -> Result<()> {
        let value = set_value_repr(value);
        let (yp, _gy) = self.y_arg(("y", y_desc, y))?;
        // SAFETY: live handle and descriptor; `y` holds its span on this context and does not
        // overlap itself (checked by `y_arg`); the value is an 8-byte, 8-aligned host word
        // holding the representation cuDNN reads for `T` (at most 8 bytes are ever read); the
        // guard keeps `y` alive and ordered until enqueued.
        unsafe {
            raw::cudnnSetTensor(
                self.lib(),
                self.as_raw(),
                y_desc.as_raw(),
                yp,
                scalar_ptr(&value),
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
        x: &impl DeviceBuffer<X>,
        beta: X::Scalar,
        y_desc: &TensorDesc<Y>,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<()> {
        let (xd, yd) = (x_desc.dims(), y_desc.dims());
        let rule = "transform keeps the dimensions; only layout and type change";
        require_shapes(xd == yd, ("x", xd), ("y", yd), rule)?;
        let args = self.xy_args(&alpha, ("x", x_desc, x), &beta, ("y", y_desc, y))?;
        // SAFETY: live handle and descriptors; both buffers hold their spans on this context;
        // `y` does not overlap itself (checked by `xy_args`) and cannot alias `x` (`&` vs
        // `&mut`); the dims agree (checked above); alpha/beta are the scalar type both dtypes
        // share.
        unsafe { call_xy!(raw::cudnnTransformTensor, self, [], args) }
    }
}

impl Cudnn {
    /// `c = op(alpha1·a, alpha2·b) + beta·c`, element-wise, with `b` broadcast.
    ///
    /// cuDNN's rule (checked here first): `a` has exactly `c`'s dimensions; each dimension of `b`
    /// equals `c`'s or is 1, and where it is 1 the same `b` value is used along that dimension
    /// (e.g. a per-channel `[1, C, 1, 1]` scale applied to `[N, C, H, W]`). `a` does not
    /// broadcast. At most [`OP_TENSOR_MAX_DIMS`] (5) dimensions; any strides, so NCHW, NHWC and
    /// mixed layouts work; `NCHW_VECT_C` is rejected.
    ///
    /// [`OpTensorOp::Sqrt`] and [`OpTensorOp::Not`] are unary: `b` is not read (but is still
    /// checked, as it is handed to cuDNN); [`Cudnn::op_tensor_unary`] takes no `b`.
    ///
    /// Data types: f32, f16, bf16 and i8 computed in f32, f64 in f64 (the descriptor's compute
    /// type); alpha1, alpha2 and beta are `T::Scalar`. NaNs propagate through min and max. With
    /// `beta == 0` the old contents of `c` are not read.
    ///
    /// ```no_run
    /// # fn main() -> cudnn_safe::Result<()> {
    /// use cudnn_safe::{cuda_context, ops::OpTensorOp, Cudnn, TensorDesc};
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let x_d = TensorDesc::<f32>::nhwc(2, 3, 4, 4)?;
    /// let s_d = TensorDesc::<f32>::nchw(1, 3, 1, 1)?;
    /// let x = stream.clone_htod(&vec![1.5f32; x_d.span()]).unwrap();
    /// let s = stream.clone_htod(&[0.5f32, 2.0, 4.0]).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(x_d.span()).unwrap();
    /// // y = x · s, per channel
    /// cudnn.op_tensor(OpTensorOp::Mul, 1.0, &x_d, &x, 1.0, &s_d, &s, 0.0, &x_d, &mut y)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cudnnOpTensor")]
    #[doc(alias = "cudnnSetOpTensorDescriptor")]
    #[allow(clippy::too_many_arguments)] // mirrors cudnnOpTensor
    pub fn op_tensor<T: DataType>(
        &self,
        op: OpTensorOp,
        alpha1: T::Scalar,
        a_desc: &TensorDesc<T>,
        a: &impl DeviceBuffer<T>,
        alpha2: T::Scalar,
        b_desc: &TensorDesc<T>,
        b: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        c_desc: &TensorDesc<T>,
        c: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let a = FirstOperand::Tensor(("a", a_desc, a));
        self.op_tensor_launch(
            op,
            alpha1,
            a,
            alpha2,
            ("b", b_desc, b),
            beta,
            ("c", c_desc, c),
        )
    }

    /// `c = op(alpha1·c, alpha2·b) + beta·c`, in place: `c` is both the first operand and the
    /// destination.
    ///
    /// cuDNN documents this aliasing for `cudnnOpTensor` (its one restriction is that when `B`
    /// is the destination, `A` must be too; here `b` is a separate, shared borrow). `c` is read
    /// whatever `beta` is, so it must hold the operand. Rules otherwise as [`Cudnn::op_tensor`].
    #[doc(alias = "cudnnOpTensor")]
    #[allow(clippy::too_many_arguments)] // mirrors cudnnOpTensor
    pub fn op_tensor_inplace<T: DataType>(
        &self,
        op: OpTensorOp,
        alpha1: T::Scalar,
        alpha2: T::Scalar,
        b_desc: &TensorDesc<T>,
        b: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        c_desc: &TensorDesc<T>,
        c: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let a = FirstOperand::<T, NoBuffer<T>>::Output;
        self.op_tensor_launch(
            op,
            alpha1,
            a,
            alpha2,
            ("b", b_desc, b),
            beta,
            ("c", c_desc, c),
        )
    }

    /// The checked launch behind [`op_tensor`](Self::op_tensor) and
    /// [`op_tensor_inplace`](Self::op_tensor_inplace).
    #[allow(clippy::too_many_arguments)] // mirrors cudnnOpTensor
    fn op_tensor_launch<T: DataType, A: DeviceBuffer<T>>(
        &self,
        op: OpTensorOp,
        alpha1: T::Scalar,
        a: FirstOperand<'_, T, A>,
        alpha2: T::Scalar,
        (b_name, b_desc, b): Arg<'_, T, impl DeviceBuffer<T>>,
        beta: T::Scalar,
        (c_name, c_desc, c): ArgMut<'_, T, impl DeviceBufferMut<T>>,
    ) -> Result<()> {
        check_op_tensor_dtype::<T>()?;
        let a_desc = match &a {
            FirstOperand::Tensor((_, a_desc, _)) => *a_desc,
            FirstOperand::Output => c_desc,
        };
        check_op_tensor_shapes(a_desc, b_desc, c_desc)?;
        if let FirstOperand::Tensor((name, a_desc, a)) = &a {
            self.check_tensor(name, a_desc.layout(), *a, false)?;
        }
        self.check_tensor(b_name, b_desc.layout(), b, false)?;
        self.check_tensor(c_name, c_desc.layout(), c, true)?;
        let desc = op_tensor_descriptor::<T>(op)?;
        self.bind()?;
        let stream: &cudarc::driver::CudaStream = self.stream();
        let (ap, _ga) = match &a {
            FirstOperand::Tensor((_, _, a)) => {
                let (p, g) = a.device_ptr(stream);
                (Some(p as *const c_void), Some(g))
            }
            FirstOperand::Output => (None, None),
        };
        let (bp, _gb) = b.device_ptr(stream);
        let (cp, _gc) = c.device_ptr_mut(stream);
        // In place, `A` is `C`: the same buffer and descriptor.
        let ap = ap.unwrap_or(cp as *const c_void);
        // SAFETY: live handle and descriptors; `a` (when apart), `b` and `c` hold their
        // descriptors' spans on the handle's context (checked); `c` does not overlap itself and
        // cannot alias `a` or `b` (`&` vs `&mut`), or `A` is `C` with the same descriptor, which
        // cuDNN supports (each element of C is computed from the same element of A); shapes
        // follow cuDNN's broadcast rule (checked); the scalars are `T::Scalar`, the type the
        // compute type implies; the guards keep the buffers alive and ordered until the call is
        // enqueued.
        unsafe {
            ffi::cudnnOpTensor(
                self.lib(),
                self.as_raw(),
                desc.as_ptr(),
                scalar_ptr(&alpha1),
                a_desc.as_raw(),
                ap,
                scalar_ptr(&alpha2),
                b_desc.as_raw(),
                bp as *const c_void,
                scalar_ptr(&beta),
                c_desc.as_raw(),
                cp as *mut c_void,
            )
        }
    }

    /// `c = op(alpha·a) + beta·c` for the unary operations ([`OpTensorOp::Sqrt`],
    /// [`OpTensorOp::Not`]); `a` has `c`'s dimensions. A binary `op` is rejected with
    /// [`Error::InvalidArgument`].
    ///
    /// cuDNN's call always takes a `B` tensor; it is given `a` again (and not read).
    #[doc(alias = "cudnnOpTensor")]
    #[allow(clippy::too_many_arguments)] // mirrors cudnnOpTensor
    pub fn op_tensor_unary<T: DataType>(
        &self,
        op: OpTensorOp,
        alpha: T::Scalar,
        a_desc: &TensorDesc<T>,
        a: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        c_desc: &TensorDesc<T>,
        c: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        if !op.is_unary() {
            return Err(Error::invalid(
                "unary op-tensor operation",
                "OpTensorOp::Sqrt or OpTensorOp::Not",
                format!("{op:?}"),
            ));
        }
        self.op_tensor(op, alpha, a_desc, a, alpha, a_desc, a, beta, c_desc, c)
    }
}

/// The first operand `A` of an op-tensor launch: a tensor of its own, or the output `C`.
enum FirstOperand<'a, T: DataType, A> {
    /// A separate input.
    Tensor(Arg<'a, T, A>),
    /// `C` itself (in place).
    Output,
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
    use crate::checks::lib_or_skip;

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

    #[test]
    fn op_tensor_ops_map_to_distinct_c_values() {
        let mut seen: Vec<u32> = OpTensorOp::ALL.iter().map(|o| o.raw().0).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), OpTensorOp::ALL.len());
        assert!(OpTensorOp::Sqrt.is_unary() && OpTensorOp::Not.is_unary());
        assert!(!OpTensorOp::Add.is_unary() && !OpTensorOp::Max.is_unary());
    }

    #[test]
    fn compute_type_is_double_only_for_f64() {
        assert_eq!(
            compute_type(DType::F64),
            sys::cudnnDataType_t::CUDNN_DATA_DOUBLE
        );
        for d in [DType::F32, DType::F16, DType::BF16, DType::I8] {
            assert_eq!(compute_type(d), sys::cudnnDataType_t::CUDNN_DATA_FLOAT);
        }
        assert!(check_op_tensor_dtype::<f32>().is_ok());
        assert!(check_op_tensor_dtype::<half::bf16>().is_ok());
        assert!(matches!(
            check_op_tensor_dtype::<i32>(),
            Err(Error::UnsupportedDataType { .. })
        ));
        assert!(matches!(
            check_op_tensor_dtype::<u8>(),
            Err(Error::UnsupportedDataType { .. })
        ));
    }

    #[test]
    fn cudnn_accepts_every_op_tensor_descriptor() {
        let Some(()) = lib_or_skip() else { return };
        for op in OpTensorOp::ALL {
            op_tensor_descriptor::<f32>(op).unwrap();
            op_tensor_descriptor::<f64>(op).unwrap();
            op_tensor_descriptor::<half::f16>(op).unwrap();
            op_tensor_descriptor::<half::bf16>(op).unwrap();
            op_tensor_descriptor::<i8>(op).unwrap();
        }
    }

    #[test]
    fn op_tensor_shape_rule() {
        let Some(()) = lib_or_skip() else { return };
        let c = TensorDesc::<f32>::nchw(2, 3, 4, 5).unwrap();
        let c_nhwc = TensorDesc::<f32>::nhwc(2, 3, 4, 5).unwrap();
        let bias = TensorDesc::<f32>::nchw(1, 3, 1, 1).unwrap();
        let row = TensorDesc::<f32>::nchw(2, 1, 4, 1).unwrap();
        // b broadcasts along any set of dimensions, in any layout.
        check_op_tensor_shapes(&c, &bias, &c).unwrap();
        check_op_tensor_shapes(&c, &row, &c).unwrap();
        check_op_tensor_shapes(&c_nhwc, &c, &c).unwrap();
        // a does not broadcast.
        let e = check_op_tensor_shapes(&bias, &c, &c).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { a: "a", .. }), "{e}");
        // b with a dimension neither c's nor 1, or another rank.
        let bad = TensorDesc::<f32>::nchw(1, 2, 1, 1).unwrap();
        let e = check_op_tensor_shapes(&c, &bad, &c).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { a: "b", .. }), "{e}");
        let r3 = TensorDesc::<f32>::nchw_nd(&[2, 3, 4]).unwrap();
        let e = check_op_tensor_shapes(&c, &r3, &c).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { a: "b", .. }), "{e}");
        // Up to 5 dimensions.
        let d5 = TensorDesc::<f32>::nchw_nd(&[2, 3, 2, 2, 2]).unwrap();
        check_op_tensor_shapes(&d5, &d5, &d5).unwrap();
        let d6 = TensorDesc::<f32>::nchw_nd(&[2, 3, 2, 2, 2, 2]).unwrap();
        let e = check_op_tensor_shapes(&d6, &d6, &d6).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        // No vectorised layouts.
        let v = TensorDesc::<i8>::new(crate::Layout::nchw_vect_c(1, 4, 2, 2, 4).unwrap()).unwrap();
        let e = check_op_tensor_shapes(&v, &v, &v).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
}
