//! Tensor reductions (`cudnnReduceTensor`): sum, product, min, max, absolute max, mean, L1 and
//! L2 norms over any set of dimensions, optionally with the index of the selected element for
//! min / max / absolute max.
//!
//! The dimensions reduced are those where the output `c` has extent 1 and the input `a` does
//! not: `a = [N, C, H, W]` into `c = [1, C, 1, 1]` reduces over N, H and W (per-channel), into
//! `[N, 1, 1, 1]` over C, H and W (per-sample).
//!
//! Data types: f32, f16 and bf16 in any pair (computed in f32), f64 with f64. cuDNN 9.14 does
//! not reduce bf16 itself, so a pair with bf16 converts through f32 scratch kept in the caller's
//! [`Workspace`] (see [`Cudnn::reduce_tensor`]).
//!
//! ```no_run
//! use cudnn_safe::{cuda_context, reduce::ReduceOp, Cudnn, TensorDesc, Workspace};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! let x_d = TensorDesc::<f32>::nchw(8, 16, 32, 32)?;
//! let mean_d = TensorDesc::<f32>::nchw(1, 16, 1, 1)?;
//! let x = stream.clone_htod(&vec![0.5f32; x_d.span()]).unwrap();
//! let mut mean = stream.alloc_zeros::<f32>(mean_d.span()).unwrap();
//! let mut ws = Workspace::new(stream.clone());
//! cudnn.reduce_tensor(ReduceOp::Avg, 1.0, &x_d, &x, 0.0, &mean_d, &mut mean, &mut ws)?;
//! # Ok(()) }
//! ```
use std::ffi::c_void;
use std::marker::PhantomData;

use cudnn_safe_sys as sys;

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::checks::{broadcasts_to, require_shapes};
use crate::dtype::{DType, DataType};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::ops::{compute_type, ffi};
use crate::raw;
use crate::tensor::{TensorDesc, TensorFormat};
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};

mod detour;
use detour::{detour_bytes, launch_f32_detour};

/// The reduction of [`Cudnn::reduce_tensor`] (`cudnnReduceTensorOp_t`), over the elements of
/// each reduced slice of `a`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum ReduceOp {
    /// Sum.
    Add,
    /// Product.
    Mul,
    /// Minimum (indices available).
    Min,
    /// Maximum (indices available).
    Max,
    /// Maximum absolute value, `max |a|` (indices available).
    AMax,
    /// Mean.
    Avg,
    /// L1 norm, `Σ |a|`.
    Norm1,
    /// L2 norm, `sqrt(Σ a²)`.
    Norm2,
    /// Product of the non-zero elements (zeros are skipped; cuDNN's `MUL_NO_ZEROS`).
    MulNoZeros,
}

impl ReduceOp {
    /// Every reduction, for tests and exhaustive loops.
    pub const ALL: [ReduceOp; 9] = [
        ReduceOp::Add,
        ReduceOp::Mul,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::AMax,
        ReduceOp::Avg,
        ReduceOp::Norm1,
        ReduceOp::Norm2,
        ReduceOp::MulNoZeros,
    ];

    /// Whether cuDNN can report the index of the selected element (min, max, absolute max).
    pub fn has_indices(self) -> bool {
        matches!(self, ReduceOp::Min | ReduceOp::Max | ReduceOp::AMax)
    }

    fn raw(self) -> sys::cudnnReduceTensorOp_t {
        use sys::cudnnReduceTensorOp_t as R;
        match self {
            ReduceOp::Add => R::CUDNN_REDUCE_TENSOR_ADD,
            ReduceOp::Mul => R::CUDNN_REDUCE_TENSOR_MUL,
            ReduceOp::Min => R::CUDNN_REDUCE_TENSOR_MIN,
            ReduceOp::Max => R::CUDNN_REDUCE_TENSOR_MAX,
            ReduceOp::AMax => R::CUDNN_REDUCE_TENSOR_AMAX,
            ReduceOp::Avg => R::CUDNN_REDUCE_TENSOR_AVG,
            ReduceOp::Norm1 => R::CUDNN_REDUCE_TENSOR_NORM1,
            ReduceOp::Norm2 => R::CUDNN_REDUCE_TENSOR_NORM2,
            ReduceOp::MulNoZeros => R::CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS,
        }
    }
}

/// An owned, set reduction descriptor (host only; no GPU needed).
fn reduce_descriptor(
    op: ReduceOp,
    compute: sys::cudnnDataType_t,
    indices: bool,
) -> Result<ffi::OwnedReduceTensor> {
    let lib = raw::lib()?;
    let desc = ffi::OwnedReduceTensor::new(lib)?;
    let flag = if indices {
        sys::cudnnReduceTensorIndices_t::CUDNN_REDUCE_TENSOR_FLATTENED_INDICES
    } else {
        sys::cudnnReduceTensorIndices_t::CUDNN_REDUCE_TENSOR_NO_INDICES
    };
    // SAFETY: live descriptor; every value is one cuDNN defines. 32-bit indices are the only
    // type cuDNN implements (and what the `u32` index buffers of this API hold).
    unsafe {
        ffi::cudnnSetReduceTensorDescriptor(
            lib,
            desc.as_ptr(),
            op.raw(),
            compute,
            sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
            flag,
            sys::cudnnIndicesType_t::CUDNN_32BIT_INDICES,
        )
    }?;
    Ok(desc)
}

/// The (input, output) type pairs this API reduces: f64 only with f64 (computed in f64);
/// otherwise f32, f16 and bf16 in any pair, computed in f32 (pairs with bf16 through the f32
/// detour of [`needs_f32_detour`]).
fn check_reduce_dtypes<A: DataType, C: DataType>() -> Result<sys::cudnnDataType_t> {
    let float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
    match (A::DTYPE, C::DTYPE) {
        (DType::F64, DType::F64) => Ok(compute_type(DType::F64)),
        (a, c) if float(a) && float(c) => Ok(compute_type(DType::F32)),
        (a, c) => Err(Error::UnsupportedDataType {
            op: "reduce tensor",
            detail: format!(
                "{a} into {c} (reductions take f64 into f64, or f32/f16/bf16 into \
                 f32/f16/bf16 computed in f32)"
            ),
        }),
    }
}

/// Whether a (validated) type pair involves bf16, which `cudnnReduceTensor` refuses with
/// `CUDNN_STATUS_NOT_SUPPORTED` in cuDNN 9.14 (bf16 into bf16 and bf16 into f32 alike; NVIDIA
/// documents half, int8, float and double only). Such a reduction converts
/// bf16 data to f32 scratch with `cudnnTransformTensor`, reduces f32 (or f16) into f32, and
/// converts the result back: see [`launch_f32_detour`].
fn needs_f32_detour<A: DataType, C: DataType>() -> bool {
    A::DTYPE == DType::BF16 || C::DTYPE == DType::BF16
}

/// cuDNN's shape rule: `c` has `a`'s rank and each dimension of `c` is `a`'s or 1; no
/// vectorised (`NCHW_VECT_C`) layout.
pub(crate) fn check_reduce_shapes<A: DataType, C: DataType>(
    a_desc: &TensorDesc<A>,
    c_desc: &TensorDesc<C>,
) -> Result<()> {
    let (ad, cd) = (a_desc.dims(), c_desc.dims());
    let rule = "same rank, each dimension of c equal to a's or 1 (1 = reduced)";
    require_shapes(broadcasts_to(cd, ad), ("a", ad), ("c", cd), rule)?;
    for (name, l) in [("a", a_desc.layout()), ("c", c_desc.layout())] {
        if let TensorFormat::NchwVectC { .. } = l.format() {
            return Err(Error::invalid(
                "reduce tensor layout",
                "a layout other than NCHW_VECT_C",
                format!("`{name}` is NCHW_VECT_C"),
            ));
        }
    }
    Ok(())
}

/// A size answered by cuDNN, refused when absurd (see [`MAX_WORKSPACE_BYTES`]).
fn sane_bytes(what: &'static str, bytes: usize) -> Result<usize> {
    if bytes > MAX_WORKSPACE_BYTES {
        return Err(Error::Overflow {
            what,
            detail: format!("cuDNN asked for {bytes} bytes"),
        });
    }
    Ok(bytes)
}

/// A tensor descriptor's raw handle borrowed from the [`TensorDesc`] that owns it, so it stays
/// live as long as this value exists (whatever the element type).
#[derive(Clone, Copy)]
struct DescRef<'a> {
    raw: sys::cudnnTensorDescriptor_t,
    _owner: PhantomData<&'a ()>,
}

impl<'a> DescRef<'a> {
    fn of<T: DataType>(desc: &'a TensorDesc<T>) -> Self {
        DescRef {
            raw: desc.as_raw(),
            _owner: PhantomData,
        }
    }
}

/// Byte sizes cuDNN asks for one reduction of `a` into `c`: (workspace, indices).
fn query_sizes(
    cudnn: &Cudnn,
    desc: &ffi::OwnedReduceTensor,
    a_desc: DescRef<'_>,
    c_desc: DescRef<'_>,
    indices: bool,
) -> Result<(usize, usize)> {
    let mut ws = 0usize;
    // SAFETY: live handle and descriptors (the tensor descriptors are borrowed from their
    // owners for the duration of this call); a valid out-pointer.
    unsafe {
        ffi::cudnnGetReductionWorkspaceSize(
            cudnn.lib(),
            cudnn.as_raw(),
            desc.as_ptr(),
            a_desc.raw,
            c_desc.raw,
            &mut ws,
        )
    }?;
    let mut idx = 0usize;
    if indices {
        // SAFETY: as above.
        unsafe {
            ffi::cudnnGetReductionIndicesSize(
                cudnn.lib(),
                cudnn.as_raw(),
                desc.as_ptr(),
                a_desc.raw,
                c_desc.raw,
                &mut idx,
            )
        }?;
    }
    Ok((
        sane_bytes("reduction workspace size", ws)?,
        sane_bytes("reduction indices size", idx)?,
    ))
}

/// Elements of 32-bit indices that cover `bytes`.
fn index_elements(bytes: usize) -> usize {
    bytes.div_ceil(std::mem::size_of::<u32>())
}

/// Every check of a reduction that needs no cuDNN query, in the order the launch runs them;
/// returns the compute type.
#[allow(clippy::too_many_arguments)] // the launch's arguments
fn validate<A: DataType, C: DataType, I: DeviceBufferMut<u32>>(
    cudnn: &Cudnn,
    op: ReduceOp,
    a_desc: &TensorDesc<A>,
    a: &impl DeviceBuffer<A>,
    c_desc: &TensorDesc<C>,
    c: &impl DeviceBufferMut<C>,
    indices: Option<&I>,
    workspace: &Workspace,
) -> Result<sys::cudnnDataType_t> {
    let compute = check_reduce_dtypes::<A, C>()?;
    check_reduce_shapes(a_desc, c_desc)?;
    if indices.is_some() {
        check_indices_request::<A>(op)?;
    }
    cudnn.check_tensor("a", a_desc.layout(), a, false)?;
    cudnn.check_tensor("c", c_desc.layout(), c, true)?;
    cudnn.check_workspace_context(workspace)?;
    Ok(compute)
}

/// Indices exist for min, max and absolute max only, and (as ONNX Runtime found, converting
/// f16 input to f32 before asking cuDNN for indices) for f32 and f64 data only.
fn check_indices_request<A: DataType>(op: ReduceOp) -> Result<()> {
    if !op.has_indices() {
        return Err(Error::invalid(
            "reduction with indices",
            "ReduceOp::Min, Max or AMax (cuDNN reports indices only for those)",
            format!("{op:?}"),
        ));
    }
    if !matches!(A::DTYPE, DType::F32 | DType::F64) {
        return Err(Error::UnsupportedDataType {
            op: "reduce tensor with indices",
            detail: format!("{} (indices are computed for f32 and f64 data)", A::DTYPE),
        });
    }
    Ok(())
}

/// Whether `c` has `a`'s dimensions, so nothing is reduced. cuDNN refuses that case with
/// `CUDNN_STATUS_BAD_PARAM` (ONNX Runtime PR #6490, nnabla PR #115); it is computed here
/// without `cudnnReduceTensor` where the result is a plain copy or an absolute value.
fn reduces_nothing<A: DataType, C: DataType>(a: &TensorDesc<A>, c: &TensorDesc<C>) -> bool {
    a.dims() == c.dims()
}

/// The reductions whose one-element result is the element itself.
fn is_copy_on_one_element(op: ReduceOp) -> bool {
    matches!(
        op,
        ReduceOp::Add | ReduceOp::Avg | ReduceOp::Min | ReduceOp::Max | ReduceOp::Mul
    )
}

/// The reductions whose one-element result is the element's absolute value.
fn is_abs_on_one_element(op: ReduceOp) -> bool {
    matches!(op, ReduceOp::AMax | ReduceOp::Norm1 | ReduceOp::Norm2)
}

/// Index 0 for every output of a reduction over one element.
fn zero_indices<I: DeviceBufferMut<u32>>(
    cudnn: &Cudnn,
    indices: &mut I,
    count: usize,
) -> Result<()> {
    cudnn.check_buffer("indices", indices, count)?;
    cudnn
        .stream()
        .memcpy_htod(&vec![0u32; count], indices)
        .map_err(|e| Error::driver("writing reduction indices", e))
}

/// `c = alpha·|a| + beta·c` for same-shaped `a` and `c`, as `max(alpha·a, −alpha·a)` (or `min`
/// for a negative alpha) through `cudnnOpTensor`.
#[allow(clippy::too_many_arguments)] // the launch's arguments
fn abs_copy<T: DataType>(
    cudnn: &Cudnn,
    alpha: T::Scalar,
    a_desc: &TensorDesc<T>,
    a: &impl DeviceBuffer<T>,
    beta: T::Scalar,
    c_desc: &TensorDesc<T>,
    c: &mut impl DeviceBufferMut<T>,
) -> Result<()> {
    use crate::dtype::Scalar;
    use crate::ops::OpTensorOp;
    let a64 = alpha.to_f64();
    let op = if a64 >= 0.0 {
        OpTensorOp::Max
    } else {
        OpTensorOp::Min
    };
    let neg = <T::Scalar as Scalar>::from_f64(-a64);
    cudnn.op_tensor(op, alpha, a_desc, a, neg, a_desc, a, beta, c_desc, c)
}

/// Workspace bytes a reduction of `a` into `c` uses: 0 where nothing is reduced and the result
/// is computed without `cudnnReduceTensor` (`abs_handled`: also for absolute max and the norms),
/// the f32 detour's total with bf16, else what `cudnnGetReductionWorkspaceSize` asks for.
fn workspace_requirement<A: DataType, C: DataType>(
    cudnn: &Cudnn,
    op: ReduceOp,
    a_desc: &TensorDesc<A>,
    c_desc: &TensorDesc<C>,
    abs_handled: bool,
) -> Result<usize> {
    let compute = check_reduce_dtypes::<A, C>()?;
    check_reduce_shapes(a_desc, c_desc)?;
    if reduces_nothing(a_desc, c_desc)
        && (is_copy_on_one_element(op) || (abs_handled && is_abs_on_one_element(op)))
    {
        return Ok(0);
    }
    if needs_f32_detour::<A, C>() {
        return detour_bytes(cudnn, op, a_desc, c_desc);
    }
    let desc = reduce_descriptor(op, compute, false)?;
    cudnn.bind()?;
    Ok(query_sizes(
        cudnn,
        &desc,
        DescRef::of(a_desc),
        DescRef::of(c_desc),
        false,
    )?
    .0)
}

impl Cudnn {
    /// The checked launch behind every public reduction.
    #[allow(clippy::too_many_arguments)] // mirrors cudnnReduceTensor
    fn launch_reduce<A: DataType, C: DataType<Scalar = A::Scalar>, I: DeviceBufferMut<u32>>(
        &self,
        op: ReduceOp,
        alpha: A::Scalar,
        a_desc: &TensorDesc<A>,
        a: &impl DeviceBuffer<A>,
        beta: A::Scalar,
        c_desc: &TensorDesc<C>,
        c: &mut impl DeviceBufferMut<C>,
        indices: Option<&mut I>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let cudnn = self;
        let idx = indices.as_deref();
        let compute = validate(cudnn, op, a_desc, a, c_desc, c, idx, workspace)?;
        if reduces_nothing(a_desc, c_desc) && is_copy_on_one_element(op) {
            let count = c_desc.layout().element_count();
            if let Some(idx) = indices.as_deref() {
                cudnn.check_buffer("indices", idx, count)?;
            }
            cudnn.transform_tensor(alpha, a_desc, a, beta, c_desc, c)?;
            if let Some(idx) = indices {
                zero_indices(cudnn, idx, count)?;
            }
            return Ok(());
        }
        if needs_f32_detour::<A, C>() {
            // Unreachable with indices (`validate` allows them for f32 / f64 data of one type
            // only), but an indices buffer must never be left unwritten silently.
            if indices.is_some() {
                return Err(Error::UnsupportedDataType {
                    op: "reduce tensor with indices",
                    detail: format!(
                        "{} into {} (indices are computed for f32 and f64 data)",
                        A::DTYPE,
                        C::DTYPE
                    ),
                });
            }
            return launch_f32_detour(cudnn, op, alpha, a_desc, a, beta, c_desc, c, workspace);
        }
        let desc = reduce_descriptor(op, compute, indices.is_some())?;
        cudnn.bind()?;
        let (ws_bytes, idx_bytes) = query_sizes(
            cudnn,
            &desc,
            DescRef::of(a_desc),
            DescRef::of(c_desc),
            indices.is_some(),
        )?;
        if let Some(idx) = indices.as_deref() {
            cudnn.check_buffer("indices", idx, index_elements(idx_bytes))?;
        }
        workspace.prepare(ws_bytes)?;
        let stream: &cudarc::driver::CudaStream = cudnn.stream();
        let (ap, _ga) = a.device_ptr(stream);
        let (cp, _gc) = c.device_ptr_mut(stream);
        let (ip, _gi) = match indices {
            Some(idx) => {
                let (p, g) = idx.device_ptr_mut(stream);
                (p as *mut c_void, Some(g))
            }
            None => (std::ptr::null_mut(), None),
        };
        let (wsp, _gws) = workspace.device_ptr_mut(cudnn.stream())?;
        // SAFETY: live handle and descriptors; `a` and `c` hold their spans on the handle's context
        // and `c` does not overlap itself (checked) nor alias `a` (`&` vs `&mut`); the shapes follow
        // cuDNN's reduction rule and the dtypes a supported pair with the matching compute type
        // (checked); the indices buffer (when asked for) holds at least the `idx_bytes` cuDNN
        // reported, on this context, else the pointer is null with size 0 and the descriptor asks
        // for no indices; the workspace holds at least the `ws_bytes` cuDNN reported (`prepare`);
        // alpha/beta are `A::Scalar` (= `C::Scalar`), the compute type's scalar; the guards keep
        // every buffer alive and ordered until the call is enqueued.
        unsafe {
            ffi::cudnnReduceTensor(
                cudnn.lib(),
                cudnn.as_raw(),
                desc.as_ptr(),
                ip,
                idx_bytes,
                wsp,
                ws_bytes,
                (&alpha as *const A::Scalar).cast::<c_void>(),
                a_desc.as_raw(),
                ap as *const c_void,
                (&beta as *const A::Scalar).cast::<c_void>(),
                c_desc.as_raw(),
                cp as *mut c_void,
            )
        }
    }
}

/// The "no indices" type argument of [`Cudnn::launch_reduce`].
type NoIndices = cudarc::driver::CudaSlice<u32>;

impl Cudnn {
    /// `c = alpha·reduce(a) + beta·c`: each dimension of `c` equals `a`'s or is 1, and the
    /// dimensions where `c` is 1 (and `a` is not) are reduced.
    ///
    /// Any strides (NCHW, NHWC, padded) up to 8 dimensions. Data types: f32, f16 and bf16
    /// computed in f32, f64 in f64; alpha and beta are `T::Scalar`. The workspace grows (within
    /// its limit) to [`Cudnn::reduce_workspace_size`], else [`Error::WorkspaceLimit`] before
    /// anything is enqueued. NaNs propagate. With `beta == 0` the old contents of `c` are not
    /// read.
    ///
    /// bf16: cuDNN 9.14's `cudnnReduceTensor` refuses bfloat16 (`CUDNN_STATUS_NOT_SUPPORTED`),
    /// so bf16 data take a detour through f32 scratch held in `workspace` (no allocation per
    /// call): `a` is converted to f32 ([`Cudnn::transform_tensor`], exact), reduced in f32 into
    /// an f32 result, which is converted into `c` as `c = result + beta·c` — the blend with
    /// the old `c` happens once, in f32, and the result is rounded to bf16 once. The workspace
    /// then also holds `4 · (elements of a + elements of c)` bytes (see
    /// [`Cudnn::reduce_workspace_size`]).
    ///
    /// A "reduction" that reduces nothing (`c` with `a`'s dimensions), which cuDNN refuses with
    /// `CUDNN_STATUS_BAD_PARAM`, is computed without it: a scaled copy
    /// ([`Cudnn::transform_tensor`]) for add, mean, min, max and product, a scaled absolute
    /// value ([`Cudnn::op_tensor`], at most 5 dimensions) for absolute max and the norms.
    /// [`ReduceOp::MulNoZeros`] over single elements is left to cuDNN (and its error).
    #[doc(alias = "cudnnReduceTensor")]
    #[doc(alias = "cudnnSetReduceTensorDescriptor")]
    #[allow(clippy::too_many_arguments)] // mirrors cudnnReduceTensor
    pub fn reduce_tensor<T: DataType>(
        &self,
        op: ReduceOp,
        alpha: T::Scalar,
        a_desc: &TensorDesc<T>,
        a: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        c_desc: &TensorDesc<T>,
        c: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        if reduces_nothing(a_desc, c_desc) && is_abs_on_one_element(op) {
            let none = None::<&NoIndices>;
            validate(self, op, a_desc, a, c_desc, c, none, workspace)?;
            return abs_copy(self, alpha, a_desc, a, beta, c_desc, c);
        }
        self.reduce_tensor_into(op, alpha, a_desc, a, beta, c_desc, c, workspace)
    }

    /// [`Cudnn::reduce_tensor`] from one element type into another, e.g. an f16 or bf16
    /// activation into f32 statistics (computed in f32). f64 pairs only with f64; f32, f16 and
    /// bf16 pair in any way; other types are rejected with [`Error::UnsupportedDataType`].
    ///
    /// A pair with bf16 on either side takes the f32 detour described at
    /// [`Cudnn::reduce_tensor`]: a bf16 `a` is converted to f32 scratch first; a result that is
    /// not f32 is reduced into f32 scratch and converted into `c` (with the beta blend) last.
    /// The workspace needed is [`Cudnn::reduce_workspace_size_into`].
    ///
    /// A reduction over single elements (`c` with `a`'s dimensions) is a scaled copy for add,
    /// mean, min, max and product; the other operations are left to cuDNN, which refuses them.
    #[doc(alias = "cudnnReduceTensor")]
    #[allow(clippy::too_many_arguments)] // mirrors cudnnReduceTensor
    pub fn reduce_tensor_into<A: DataType, C: DataType<Scalar = A::Scalar>>(
        &self,
        op: ReduceOp,
        alpha: A::Scalar,
        a_desc: &TensorDesc<A>,
        a: &impl DeviceBuffer<A>,
        beta: A::Scalar,
        c_desc: &TensorDesc<C>,
        c: &mut impl DeviceBufferMut<C>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let none = None::<&mut NoIndices>;
        self.launch_reduce(op, alpha, a_desc, a, beta, c_desc, c, none, workspace)
    }

    /// [`Cudnn::reduce_tensor`] for [`ReduceOp::Min`], [`ReduceOp::Max`] or
    /// [`ReduceOp::AMax`], also writing for each output element the index of the selected
    /// element within its reduced slice.
    ///
    /// The indices are 32-bit, relative to the reduced slice and flattened (NVIDIA: "not
    /// absolute indices but relative to the dimensions being reduced ... not coordinate
    /// tuples"): the row-major position over the reduced dimensions in logical order, whatever
    /// `a`'s memory layout, e.g. `h·W + w` when reducing `[N, C, H, W]` into `[N, C, 1, 1]`;
    /// they are stored one per element of `c`, for a packed channels-first `c` in its memory
    /// (= logical row-major) order; cuDNN does not document the order for other layouts of
    /// `c`. On ties any of the tied elements may be reported; a reduction over single elements
    /// reports 0.
    ///
    /// f32 and f64 data only (cuDNN computes no indices for half types: ONNX Runtime converts
    /// them to f32 first); others are rejected with [`Error::UnsupportedDataType`]. `indices`
    /// holds at least [`Cudnn::reduce_indices_len`] elements, else [`Error::BufferTooSmall`];
    /// an `op` other than min / max / absolute max is rejected with [`Error::InvalidArgument`];
    /// all before anything is enqueued.
    #[doc(alias = "cudnnReduceTensor")]
    #[doc(alias = "cudnnGetReductionIndicesSize")]
    #[allow(clippy::too_many_arguments)] // mirrors cudnnReduceTensor
    pub fn reduce_tensor_with_indices<T: DataType>(
        &self,
        op: ReduceOp,
        alpha: T::Scalar,
        a_desc: &TensorDesc<T>,
        a: &impl DeviceBuffer<T>,
        beta: T::Scalar,
        c_desc: &TensorDesc<T>,
        c: &mut impl DeviceBufferMut<T>,
        indices: &mut impl DeviceBufferMut<u32>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        if reduces_nothing(a_desc, c_desc) && is_abs_on_one_element(op) {
            validate(self, op, a_desc, a, c_desc, c, Some(&*indices), workspace)?;
            let count = c_desc.layout().element_count();
            self.check_buffer("indices", indices, count)?;
            abs_copy(self, alpha, a_desc, a, beta, c_desc, c)?;
            return zero_indices(self, indices, count);
        }
        let idx = Some(indices);
        self.launch_reduce(op, alpha, a_desc, a, beta, c_desc, c, idx, workspace)
    }

    /// Workspace bytes [`Cudnn::reduce_tensor`] uses for this reduction: what
    /// `cudnnGetReductionWorkspaceSize` asks for; for bf16 data, the whole f32 detour (the f32
    /// copies of `a` and of the result, each rounded up to 256 bytes, plus cuDNN's workspace
    /// for the f32 reduction); 0 where nothing is reduced (`c` has `a`'s dimensions).
    ///
    /// A [`Workspace`] whose limit is at least this never fails the launch with
    /// [`Error::WorkspaceLimit`].
    #[doc(alias = "cudnnGetReductionWorkspaceSize")]
    pub fn reduce_workspace_size<T: DataType>(
        &self,
        op: ReduceOp,
        a_desc: &TensorDesc<T>,
        c_desc: &TensorDesc<T>,
    ) -> Result<usize> {
        workspace_requirement(self, op, a_desc, c_desc, true)
    }

    /// [`Cudnn::reduce_workspace_size`] for [`Cudnn::reduce_tensor_into`] (e.g. bf16 data into
    /// f32 statistics, which includes the f32 copy of `a`).
    #[doc(alias = "cudnnGetReductionWorkspaceSize")]
    pub fn reduce_workspace_size_into<A: DataType, C: DataType>(
        &self,
        op: ReduceOp,
        a_desc: &TensorDesc<A>,
        c_desc: &TensorDesc<C>,
    ) -> Result<usize> {
        workspace_requirement(self, op, a_desc, c_desc, false)
    }

    /// How many `u32` elements the `indices` buffer of [`Cudnn::reduce_tensor_with_indices`]
    /// must hold (`cudnnGetReductionIndicesSize`, in elements).
    #[doc(alias = "cudnnGetReductionIndicesSize")]
    pub fn reduce_indices_len<T: DataType>(
        &self,
        op: ReduceOp,
        a_desc: &TensorDesc<T>,
        c_desc: &TensorDesc<T>,
    ) -> Result<usize> {
        let compute = check_reduce_dtypes::<T, T>()?;
        check_reduce_shapes(a_desc, c_desc)?;
        check_indices_request::<T>(op)?;
        let desc = reduce_descriptor(op, compute, true)?;
        self.bind()?;
        Ok(index_elements(
            query_sizes(self, &desc, DescRef::of(a_desc), DescRef::of(c_desc), true)?.1,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::lib_or_skip;

    #[test]
    fn ops_map_to_distinct_c_values() {
        let mut seen: Vec<u32> = ReduceOp::ALL.iter().map(|o| o.raw().0).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), ReduceOp::ALL.len());
        let with: Vec<ReduceOp> = ReduceOp::ALL
            .into_iter()
            .filter(|o| o.has_indices())
            .collect();
        assert_eq!(with, [ReduceOp::Min, ReduceOp::Max, ReduceOp::AMax]);
    }

    #[test]
    fn dtype_pairs() {
        use half::{bf16, f16};
        let double = sys::cudnnDataType_t::CUDNN_DATA_DOUBLE;
        let float = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
        assert_eq!(check_reduce_dtypes::<f64, f64>().unwrap(), double);
        assert_eq!(check_reduce_dtypes::<f32, f32>().unwrap(), float);
        assert_eq!(check_reduce_dtypes::<f16, f32>().unwrap(), float);
        assert_eq!(check_reduce_dtypes::<bf16, bf16>().unwrap(), float);
        for r in [
            check_reduce_dtypes::<f64, f32>(),
            check_reduce_dtypes::<f32, f64>(),
            check_reduce_dtypes::<i8, f32>(),
            check_reduce_dtypes::<i32, i32>(),
        ] {
            assert!(matches!(r, Err(Error::UnsupportedDataType { .. })), "{r:?}");
        }
    }

    #[test]
    fn bf16_pairs_take_the_f32_detour() {
        use half::{bf16, f16};
        assert!(needs_f32_detour::<bf16, bf16>());
        assert!(needs_f32_detour::<bf16, f32>());
        assert!(needs_f32_detour::<f32, bf16>());
        assert!(needs_f32_detour::<f16, bf16>());
        assert!(!needs_f32_detour::<f32, f32>());
        assert!(!needs_f32_detour::<f16, f32>());
        assert!(!needs_f32_detour::<f16, f16>());
        assert!(!needs_f32_detour::<f64, f64>());
    }

    #[test]
    fn index_elements_round_up() {
        assert_eq!(index_elements(0), 0);
        assert_eq!(index_elements(4), 1);
        assert_eq!(index_elements(5), 2);
        assert_eq!(index_elements(64), 16);
    }

    #[test]
    fn cudnn_accepts_every_reduce_descriptor() {
        let Some(()) = lib_or_skip() else { return };
        for op in ReduceOp::ALL {
            for compute in [
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                sys::cudnnDataType_t::CUDNN_DATA_DOUBLE,
            ] {
                reduce_descriptor(op, compute, false).unwrap();
                if op.has_indices() {
                    reduce_descriptor(op, compute, true).unwrap();
                }
            }
        }
    }

    #[test]
    fn reduce_shape_rule() {
        let Some(()) = lib_or_skip() else { return };
        let a = TensorDesc::<f32>::nchw(2, 3, 4, 5).unwrap();
        let a_nhwc = TensorDesc::<f32>::nhwc(2, 3, 4, 5).unwrap();
        for dims in [
            [1, 3, 1, 1],
            [2, 1, 1, 1],
            [1, 1, 1, 1],
            [2, 3, 4, 1],
            [2, 3, 4, 5],
        ] {
            let c = TensorDesc::<f32>::nchw_nd(&dims).unwrap();
            check_reduce_shapes(&a, &c).unwrap();
            check_reduce_shapes(&a_nhwc, &c).unwrap();
        }
        let bad = TensorDesc::<f32>::nchw(1, 2, 1, 1).unwrap();
        let e = check_reduce_shapes(&a, &bad).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let r3 = TensorDesc::<f32>::nchw_nd(&[1, 3, 1]).unwrap();
        let e = check_reduce_shapes(&a, &r3).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        // c larger than a along a dimension is not a reduction.
        let big = TensorDesc::<f32>::nchw(2, 3, 4, 6).unwrap();
        assert!(check_reduce_shapes(&a, &big).is_err());
    }
}
