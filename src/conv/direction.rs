//! The three convolution directions as values — [`ConvForward`], [`ConvBackwardData`],
//! [`ConvBackwardFilter`] — and the trait over them, [`ConvOp`].
//!
//! A direction holds references to its descriptors, checked against each other once, when it is
//! built (data types against cuDNN's configurations, shapes against the convolution's
//! output-size rule). Its workspace query, heuristic ranking, benchmark and launch are written
//! once, here, for all three: every launch still checks each buffer against its descriptor's
//! span and the handle's context, outputs for self-overlap, the workspace's context and the
//! size cuDNN reports for the chosen algorithm (growing the workspace within its limit), before
//! anything is enqueued.
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;

use cudarc::driver::CudaStream;
use cudnn_safe_sys::{self as sys, Library};

use super::algo::sealed::Sealed;
use super::{AlgoPerf, ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvFwdAlgo};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DataType, Scalar};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::{FilterDesc, TensorDesc};
use crate::workspace::Workspace;

/// One direction of a convolution: its descriptors, checked against each other when it was
/// built, and the four things cuDNN does with them. Implemented by [`ConvForward`],
/// [`ConvBackwardData`] and [`ConvBackwardFilter`]; sealed.
///
/// The two inputs are passed in the C call's order: `(x, w)` forward, `(w, dy)` backward data,
/// `(x, dy)` backward filter. Every call checks its buffers before anything is enqueued
/// (spans, the handle's context, output self-overlap, the workspace's context and size).
pub trait ConvOp: OpSealed {
    /// The direction's algorithm enum.
    type Algo: ConvAlgorithm;
    /// Element type of the two inputs.
    type In: DataType;
    /// Element type of the output.
    type Out: DataType;
    /// The type of alpha and beta (f64 for f64 data, f32 otherwise).
    type Scalar: Scalar;
    /// The convolution.
    fn conv(&self) -> &ConvDesc;
    /// Elements of the output buffer the launch needs (its descriptor's span): the size of
    /// scratch memory standing in for the output.
    fn out_len(&self) -> usize;
    /// Workspace bytes `algo` needs (`cudnnGetConvolution*WorkspaceSize`). An algorithm that
    /// does not support the case returns cuDNN's `NOT_SUPPORTED` error with its reason.
    fn workspace_size(&self, cudnn: &Cudnn, algo: Self::Algo) -> Result<usize>;
    /// cuDNN's heuristic ranking of every algorithm (`cudnnGetConvolution*Algorithm_v7`), best
    /// first. Nothing runs on the GPU; entries whose [`status`](AlgoPerf::status) is not
    /// success are unsupported here.
    fn heuristics(&self, cudnn: &Cudnn) -> Result<Vec<AlgoPerf<Self::Algo>>>;
    /// The first supported algorithm of [`heuristics`](Self::heuristics);
    /// [`Error::NoAlgorithm`] when cuDNN supports none.
    fn pick_algorithm(&self, cudnn: &Cudnn) -> Result<Self::Algo> {
        let ranked = self.heuristics(cudnn)?;
        match ranked.iter().find(|p| p.is_supported()) {
            Some(p) => Ok(p.algo),
            None => Err(Error::NoAlgorithm {
                op: <Self::Algo as ConvAlgorithm>::DIRECTION.name(),
                detail: format!(
                    "cuDNN's heuristics list {} algorithms, none supported",
                    ranked.len()
                ),
            }),
        }
    }
    /// Runs and times every algorithm on the given buffers (`cudnnFindConvolution*AlgorithmEx`),
    /// fastest first.
    ///
    /// **`out` is overwritten** by the trial runs: never pass a buffer whose contents you still
    /// need. The workspace is first grown to the largest size the heuristics ask for (within
    /// its limit; if that allocation fails, what it already holds is used); algorithms needing
    /// more are reported with an allocation-failure status.
    fn find(
        &self,
        cudnn: &Cudnn,
        inputs: (&impl DeviceBuffer<Self::In>, &impl DeviceBuffer<Self::In>),
        out: &mut impl DeviceBufferMut<Self::Out>,
        workspace: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<Self::Algo>>>;
    /// `out = alpha·op(inputs) + beta·out` with `algo` (`cudnnConvolutionForward`,
    /// `cudnnConvolutionBackwardData`, `cudnnConvolutionBackwardFilter`). The workspace grows
    /// (within its limit) to what the algorithm needs; an algorithm that does not support the
    /// case is refused before anything runs. With `beta == 0` the old contents of `out` are not
    /// read.
    fn launch(
        &self,
        cudnn: &Cudnn,
        algo: Self::Algo,
        alpha_beta: (Self::Scalar, Self::Scalar),
        inputs: (&impl DeviceBuffer<Self::In>, &impl DeviceBuffer<Self::In>),
        workspace: &mut Workspace,
        out: &mut impl DeviceBufferMut<Self::Out>,
    ) -> Result<()>;
}

mod private {
    /// Seals [`ConvOp`](super::ConvOp).
    pub trait OpSealed {}
}
use private::OpSealed;

/// A descriptor of a convolution operand: a tensor (strided; checked for self-overlap when
/// written) or a filter (always packed).
pub(crate) trait Operand<T: DataType> {
    /// The C descriptor type.
    type Raw: Copy;
    /// The live C descriptor.
    fn raw(&self) -> Self::Raw;
    /// The identity the workspace-size memo keys on.
    fn id(&self) -> u64;
    /// Checks a buffer for this operand under `name`.
    fn check(
        &self,
        cudnn: &Cudnn,
        name: &'static str,
        buf: &impl DeviceBuffer<T>,
        output: bool,
    ) -> Result<()>;
}

impl<T: DataType> Operand<T> for TensorDesc<T> {
    type Raw = sys::cudnnTensorDescriptor_t;
    fn raw(&self) -> Self::Raw {
        self.as_raw()
    }
    fn id(&self) -> u64 {
        TensorDesc::id(self)
    }
    fn check(
        &self,
        cudnn: &Cudnn,
        name: &'static str,
        buf: &impl DeviceBuffer<T>,
        output: bool,
    ) -> Result<()> {
        cudnn.check_tensor(name, self.layout(), buf, output)
    }
}

impl<T: DataType> Operand<T> for FilterDesc<T> {
    type Raw = sys::cudnnFilterDescriptor_t;
    fn raw(&self) -> Self::Raw {
        self.as_raw()
    }
    fn id(&self) -> u64 {
        FilterDesc::id(self)
    }
    /// Filters are packed, so a written one cannot overlap itself: the span and context suffice.
    fn check(
        &self,
        cudnn: &Cudnn,
        name: &'static str,
        buf: &impl DeviceBuffer<T>,
        _output: bool,
    ) -> Result<()> {
        cudnn.check_buffer(name, buf, self.span())
    }
}

type Raw<K, D> = <D as Operand<<K as ConvOp>::In>>::Raw;
type R0<K> = Raw<K, <K as Kernel>::D0>;
type R1<K> = Raw<K, <K as Kernel>::D1>;
type ROut<K> = <<K as Kernel>::DOut as Operand<<K as ConvOp>::Out>>::Raw;
type AlgoSys<K> = <<K as ConvOp>::Algo as Sealed>::Sys;
type PerfSys<K> = <<K as ConvOp>::Algo as Sealed>::Perf;
type Handle = sys::cudnnHandle_t;
type ConvRaw = sys::cudnnConvolutionDescriptor_t;
type MaxCountFn = unsafe fn(&Library, Handle, *mut c_int) -> Result<()>;
type WorkspaceFn<K> = unsafe fn(
    &Library,
    Handle,
    R0<K>,
    R1<K>,
    ConvRaw,
    ROut<K>,
    AlgoSys<K>,
    *mut usize,
) -> Result<()>;
type HeuristicsFn<K> = unsafe fn(
    &Library,
    Handle,
    R0<K>,
    R1<K>,
    ConvRaw,
    ROut<K>,
    c_int,
    *mut c_int,
    *mut PerfSys<K>,
) -> Result<()>;
type FindFn<K> = unsafe fn(
    &Library,
    Handle,
    R0<K>,
    *const c_void,
    R1<K>,
    *const c_void,
    ConvRaw,
    ROut<K>,
    *mut c_void,
    c_int,
    *mut c_int,
    *mut PerfSys<K>,
    *mut c_void,
    usize,
) -> Result<()>;
type RunFn<K> = unsafe fn(
    &Library,
    Handle,
    *const c_void,
    R0<K>,
    *const c_void,
    R1<K>,
    *const c_void,
    ConvRaw,
    AlgoSys<K>,
    *mut c_void,
    usize,
    *const c_void,
    ROut<K>,
    *mut c_void,
) -> Result<()>;

/// What the shared code of the three directions needs of each: its operand descriptors and its
/// four C entry points, whose signatures differ only in the descriptor and enum types.
pub(crate) trait Kernel: ConvOp {
    /// The first input's descriptor type.
    type D0: Operand<Self::In>;
    /// The second input's descriptor type.
    type D1: Operand<Self::In>;
    /// The output's descriptor type.
    type DOut: Operand<Self::Out>;
    /// The first input, the second and the output, as errors name them.
    const NAMES: [&'static str; 3];
    /// `cudnnGetConvolution*AlgorithmMaxCount`.
    const MAX_COUNT: MaxCountFn;
    /// `cudnnGetConvolution*WorkspaceSize`.
    const WORKSPACE: WorkspaceFn<Self>;
    /// `cudnnGetConvolution*Algorithm_v7`.
    const HEURISTICS: HeuristicsFn<Self>;
    /// `cudnnFindConvolution*AlgorithmEx`.
    const FIND: FindFn<Self>;
    /// `cudnnConvolutionForward` / `BackwardData` / `BackwardFilter`.
    const RUN: RunFn<Self>;
    /// The convolution, the two inputs' descriptors and the output's.
    fn operands(&self) -> (&ConvDesc, &Self::D0, &Self::D1, &Self::DOut);
}

/// The descriptors of the C call in its order, as raw handles.
fn raw_operands<K: Kernel>(op: &K) -> (R0<K>, R1<K>, ConvRaw, ROut<K>) {
    let (conv, d0, d1, dout) = op.operands();
    (d0.raw(), d1.raw(), conv.as_raw(), dout.raw())
}

/// How many perf records to ask for: cuDNN's count, at least the algorithms this crate knows.
fn max_count<K: Kernel>(cudnn: &Cudnn) -> usize {
    let known = <K::Algo as ConvAlgorithm>::ALL.len();
    let mut n: c_int = 0;
    // SAFETY: live handle and a valid out-pointer.
    match unsafe { K::MAX_COUNT(cudnn.lib(), cudnn.as_raw(), &mut n) } {
        Ok(()) => (n.max(0) as usize).clamp(known, 64),
        Err(_) => known,
    }
}

/// Reads up to `count` perf records through `call` (which fills a zeroed array and reports how
/// many it wrote) and converts the ones this crate knows.
fn collect_perf<A: Sealed>(
    count: usize,
    call: impl FnOnce(c_int, *mut c_int, *mut A::Perf) -> Result<()>,
) -> Result<Vec<AlgoPerf<A>>> {
    // SAFETY: the perf structs are plain C data (integers, a float, C-enum newtypes over
    // integers); all-zero bytes are a valid value of each.
    let mut buf: Vec<A::Perf> =
        vec![unsafe { MaybeUninit::<A::Perf>::zeroed().assume_init() }; count];
    let mut returned: c_int = 0;
    call(count as c_int, &mut returned, buf.as_mut_ptr())?;
    let n = (returned.max(0) as usize).min(count);
    Ok(buf[..n].iter().filter_map(A::perf).collect())
}

/// Checks the two inputs and the output of a launch or benchmark under the direction's names,
/// then the workspace's context.
fn check_buffers<K: Kernel>(
    op: &K,
    cudnn: &Cudnn,
    (a, b): (&impl DeviceBuffer<K::In>, &impl DeviceBuffer<K::In>),
    out: &impl DeviceBuffer<K::Out>,
    workspace: &Workspace,
) -> Result<()> {
    let (_, d0, d1, dout) = op.operands();
    let [n0, n1, nout] = K::NAMES;
    d0.check(cudnn, n0, a, false)?;
    d1.check(cudnn, n1, b, false)?;
    dout.check(cudnn, nout, out, true)?;
    cudnn.check_workspace_context(workspace)
}

/// [`ConvOp::workspace_size`], memoised per algorithm and descriptor ids.
pub(crate) fn workspace_size<K: Kernel>(op: &K, cudnn: &Cudnn, algo: K::Algo) -> Result<usize> {
    let (conv, d0, d1, dout) = op.operands();
    let tag = <K::Algo as ConvAlgorithm>::DIRECTION as u64;
    let key = [
        (tag << 32) | algo.raw_value() as u64,
        d0.id(),
        d1.id(),
        conv.id(),
        dout.id(),
    ];
    cudnn.memo_bytes(key, |bytes| {
        cudnn.bind()?;
        let (r0, r1, rc, rout) = raw_operands(op);
        // SAFETY: live handle and descriptors; a valid out-pointer.
        unsafe {
            K::WORKSPACE(
                cudnn.lib(),
                cudnn.as_raw(),
                r0,
                r1,
                rc,
                rout,
                algo.sys(),
                bytes,
            )
        }
    })
}

/// [`ConvOp::heuristics`].
pub(crate) fn heuristics<K: Kernel>(op: &K, cudnn: &Cudnn) -> Result<Vec<AlgoPerf<K::Algo>>> {
    cudnn.bind()?;
    let count = max_count::<K>(cudnn);
    let (r0, r1, rc, rout) = raw_operands(op);
    collect_perf::<K::Algo>(count, |req, ret, perf| {
        // SAFETY: live handle and descriptors; `perf` holds `req` records.
        unsafe {
            K::HEURISTICS(
                cudnn.lib(),
                cudnn.as_raw(),
                r0,
                r1,
                rc,
                rout,
                req,
                ret,
                perf,
            )
        }
    })
}

/// [`ConvOp::find`].
pub(crate) fn find<K: Kernel>(
    op: &K,
    cudnn: &Cudnn,
    (a, b): (&impl DeviceBuffer<K::In>, &impl DeviceBuffer<K::In>),
    out: &mut impl DeviceBufferMut<K::Out>,
    workspace: &mut Workspace,
) -> Result<Vec<AlgoPerf<K::Algo>>> {
    check_buffers(op, cudnn, (a, b), out, workspace)?;
    let heur = heuristics(op, cudnn)?;
    grow_for_find(
        workspace,
        heur.iter().map(|p| (p.is_supported(), p.workspace)),
    );
    let count = max_count::<K>(cudnn);
    cudnn.bind()?;
    let stream: &CudaStream = cudnn.stream();
    let (ap, _ga) = a.device_ptr(stream);
    let (bp, _gb) = b.device_ptr(stream);
    let (op_, _gout) = out.device_ptr_mut(stream);
    let ws_bytes = workspace.capacity();
    let (wsp, _gws) = workspace.device_ptr_mut(cudnn.stream())?;
    let (r0, r1, rc, rout) = raw_operands(op);
    collect_perf::<K::Algo>(count, |req, ret, perf| {
        // SAFETY: live handle and descriptors; both inputs and the output hold their spans on
        // this context (checked), the output does not overlap itself (checked; filters are
        // packed); the workspace pointer addresses `ws_bytes` bytes (or is null with 0);
        // `perf` holds `req` records.
        unsafe {
            K::FIND(
                cudnn.lib(),
                cudnn.as_raw(),
                r0,
                ap as *const c_void,
                r1,
                bp as *const c_void,
                rc,
                rout,
                op_ as *mut c_void,
                req,
                ret,
                perf,
                wsp,
                ws_bytes,
            )
        }
    })
}

/// [`ConvOp::launch`].
pub(crate) fn launch<K: Kernel>(
    op: &K,
    cudnn: &Cudnn,
    algo: K::Algo,
    (alpha, beta): (K::Scalar, K::Scalar),
    (a, b): (&impl DeviceBuffer<K::In>, &impl DeviceBuffer<K::In>),
    workspace: &mut Workspace,
    out: &mut impl DeviceBufferMut<K::Out>,
) -> Result<()> {
    check_buffers(op, cudnn, (a, b), out, workspace)?;
    let bytes = workspace_size(op, cudnn, algo)?;
    workspace.prepare(bytes)?;
    cudnn.bind()?;
    let stream: &CudaStream = cudnn.stream();
    let (ap, _ga) = a.device_ptr(stream);
    let (bp, _gb) = b.device_ptr(stream);
    let (outp, _gout) = out.device_ptr_mut(stream);
    let (wsp, _gws) = workspace.device_ptr_mut(cudnn.stream())?;
    let (r0, r1, rc, rout) = raw_operands(op);
    // SAFETY: live handle and descriptors; types and shapes checked when `op` was built, spans
    // and contexts above; the output does not overlap itself (checked; filters are packed) and
    // cannot alias an input (`&mut`); the workspace holds at least `bytes`, the size cuDNN
    // reported for this algorithm and these descriptors; alpha/beta are the scalar type cuDNN
    // reads for the output (`ConvOp::Scalar`).
    unsafe {
        K::RUN(
            cudnn.lib(),
            cudnn.as_raw(),
            (&alpha as *const K::Scalar).cast::<c_void>(),
            r0,
            ap as *const c_void,
            r1,
            bp as *const c_void,
            rc,
            algo.sys(),
            wsp,
            bytes,
            (&beta as *const K::Scalar).cast::<c_void>(),
            rout,
            outp as *mut c_void,
        )
    }
}

/// Grows the workspace for a find call to the largest size a supported algorithm asks for
/// (within the limit). An allocation failure is not fatal: find then runs with what the
/// workspace already holds and reports the algorithms that needed more as unsupported.
fn grow_for_find(workspace: &mut Workspace, needs: impl Iterator<Item = (bool, usize)>) {
    let want = needs
        .filter(|&(ok, bytes)| ok && workspace.allows(bytes))
        .map(|(_, bytes)| bytes)
        .max()
        .unwrap_or(0);
    if let Err(e) = workspace.reserve(want) {
        log::warn!(
            "convolution find: workspace of {want} bytes not available ({e}); using {} bytes",
            workspace.capacity()
        );
    }
}

/// `a` must have the dimensions `expected` (`b`, by `rule`).
pub(crate) fn shape_rule(
    a: &'static str,
    a_dims: &[i64],
    b: &'static str,
    expected: Vec<i64>,
    rule: &'static str,
) -> Result<()> {
    if a_dims == expected.as_slice() {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        a,
        a_dims: a_dims.to_vec(),
        b,
        b_dims: expected,
        rule,
    })
}

/// Checks the output-size rule shared by the three directions: `out` (named `name`) has the
/// dimensions of the forward convolution of `input` by `filter`.
fn forward_shape(
    conv: &ConvDesc,
    input: &[i64],
    filter: &[i64],
    (name, by, rule): (&'static str, &'static str, &'static str),
    out: &[i64],
) -> Result<()> {
    let (dims, len) = conv.output_dims_array(input, filter)?;
    if out == &dims[..len] {
        return Ok(());
    }
    shape_rule(name, out, by, dims[..len].to_vec(), rule)
}

/// Implements [`ConvOp`] for a direction type by the shared functions above.
macro_rules! conv_op {
    ($ty:ident<$lt:lifetime, $($g:ident),*> where [$($bounds:tt)*],
     algo: $algo:ty, in: $in:ty, out: $out:ty,
     operands: ($d0:ident: $D0:ty, $d1:ident: $D1:ty, $of:ident: $DOut:ty),
     raw: [$count:ident, $ws:ident, $heur:ident, $find:ident, $run:ident]) => {
        impl<$lt, $($bounds)*> OpSealed for $ty<$lt, $($g),*> {}
        impl<$lt, $($bounds)*> $ty<$lt, $($g),*> {
            #[doc = concat!("The descriptor of `", stringify!($d0), "`.")]
            pub fn $d0(&self) -> &$lt $D0 {
                self.$d0
            }
            #[doc = concat!("The descriptor of `", stringify!($d1), "`.")]
            pub fn $d1(&self) -> &$lt $D1 {
                self.$d1
            }
            #[doc = concat!("The descriptor of `", stringify!($of), "` (the output).")]
            pub fn $of(&self) -> &$lt $DOut {
                self.$of
            }
        }
        impl<$lt, $($bounds)*> Kernel for $ty<$lt, $($g),*> {
            type D0 = $D0;
            type D1 = $D1;
            type DOut = $DOut;
            const NAMES: [&'static str; 3] = [stringify!($d0), stringify!($d1), stringify!($of)];
            const MAX_COUNT: MaxCountFn = raw::$count;
            const WORKSPACE: WorkspaceFn<Self> = raw::$ws;
            const HEURISTICS: HeuristicsFn<Self> = raw::$heur;
            const FIND: FindFn<Self> = raw::$find;
            const RUN: RunFn<Self> = raw::$run;
            fn operands(&self) -> (&ConvDesc, &$D0, &$D1, &$DOut) {
                (self.conv, self.$d0, self.$d1, self.$of)
            }
        }
        impl<$lt, $($bounds)*> ConvOp for $ty<$lt, $($g),*> {
            type Algo = $algo;
            type In = $in;
            type Out = $out;
            type Scalar = <$in as DataType>::Scalar;
            fn conv(&self) -> &ConvDesc {
                self.conv
            }
            fn out_len(&self) -> usize {
                self.$of.span()
            }
            fn workspace_size(&self, cudnn: &Cudnn, algo: $algo) -> Result<usize> {
                workspace_size(self, cudnn, algo)
            }
            fn heuristics(&self, cudnn: &Cudnn) -> Result<Vec<AlgoPerf<$algo>>> {
                heuristics(self, cudnn)
            }
            fn find(
                &self,
                cudnn: &Cudnn,
                inputs: (&impl DeviceBuffer<$in>, &impl DeviceBuffer<$in>),
                out: &mut impl DeviceBufferMut<$out>,
                workspace: &mut Workspace,
            ) -> Result<Vec<AlgoPerf<$algo>>> {
                find(self, cudnn, inputs, out, workspace)
            }
            fn launch(
                &self,
                cudnn: &Cudnn,
                algo: $algo,
                alpha_beta: (Self::Scalar, Self::Scalar),
                inputs: (&impl DeviceBuffer<$in>, &impl DeviceBuffer<$in>),
                workspace: &mut Workspace,
                out: &mut impl DeviceBufferMut<$out>,
            ) -> Result<()> {
                launch(self, cudnn, algo, alpha_beta, inputs, workspace, out)
            }
        }
        impl<$lt, $($bounds)*> Clone for $ty<$lt, $($g),*> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<$lt, $($bounds)*> Copy for $ty<$lt, $($g),*> {}
    };
}

/// `y = conv(x, w)`: the forward convolution of `x` by the filter `w` (`ConvForward { conv, x,
/// w, y }`, as cudarc names it).
///
/// `X` is the type of input and filter, `Y` the output's: equal to `X` except for i8 input,
/// which may produce f32. Launch inputs are `(x, w)`, the output `y`.
///
/// ```no_run
/// use cudnn_safe::{conv::{ConvDesc, ConvForward, ConvOp}, cuda_context, Cudnn, FilterDesc,
///                  TensorDesc, TensorFormat, Workspace};
/// # fn main() -> cudnn_safe::Result<()> {
/// let stream = cuda_context(0)?.default_stream();
/// let cudnn = Cudnn::new(stream.clone())?;
/// let x_d = TensorDesc::<f32>::nchw(8, 16, 32, 32)?;
/// let w_d = FilterDesc::<f32>::new(&[32, 16, 3, 3], TensorFormat::Nchw)?;
/// let conv = ConvDesc::builder(2).pads(&[1, 1]).build::<f32>()?;
/// let y_d = TensorDesc::<f32>::nchw_nd(&conv.output_dims(x_d.dims(), w_d.dims())?)?;
/// let fwd = ConvForward::new(&conv, &x_d, &w_d, &y_d)?;
/// let x = stream.clone_htod(&vec![0.5f32; x_d.span()]).unwrap();
/// let w = stream.clone_htod(&vec![0.1f32; w_d.span()]).unwrap();
/// let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
/// let mut ws = Workspace::new(stream.clone());
/// let algo = fwd.pick_algorithm(&cudnn)?;
/// fwd.launch(&cudnn, algo, (1.0, 0.0), (&x, &w), &mut ws, &mut y)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ConvForward<'a, X: DataType, Y: DataType = X> {
    conv: &'a ConvDesc,
    x: &'a TensorDesc<X>,
    w: &'a FilterDesc<X>,
    y: &'a TensorDesc<Y>,
}

impl<'a, X: DataType, Y: DataType<Scalar = X::Scalar>> ConvForward<'a, X, Y> {
    /// Checks the data types against cuDNN's forward configurations and `y` against the
    /// convolution's output dimensions of `x` and `w`.
    pub fn new(
        conv: &'a ConvDesc,
        x: &'a TensorDesc<X>,
        w: &'a FilterDesc<X>,
        y: &'a TensorDesc<Y>,
    ) -> Result<Self> {
        conv.check_forward_types(X::DTYPE, Y::DTYPE)?;
        let rule = (
            "y",
            "conv(x, w)",
            "y must have the convolution's output dimensions",
        );
        forward_shape(conv, x.dims(), w.dims(), rule, y.dims())?;
        Ok(ConvForward { conv, x, w, y })
    }
}

conv_op!(ConvForward<'a, X, Y> where [X: DataType, Y: DataType<Scalar = X::Scalar>],
algo: ConvFwdAlgo, in: X, out: Y,
operands: (x: TensorDesc<X>, w: FilterDesc<X>, y: TensorDesc<Y>),
raw: [
    cudnnGetConvolutionForwardAlgorithmMaxCount,
    cudnnGetConvolutionForwardWorkspaceSize,
    cudnnGetConvolutionForwardAlgorithm_v7,
    cudnnFindConvolutionForwardAlgorithmEx,
    cudnnConvolutionForward
]);

/// `dx = backward_data(dy, w)`: the gradient of a forward convolution with respect to its
/// input (`dx = conv_transposeᵀ(dy, w)`). Launch inputs are `(w, dy)`, the output `dx`.
#[derive(Debug)]
pub struct ConvBackwardData<'a, T: DataType> {
    conv: &'a ConvDesc,
    w: &'a FilterDesc<T>,
    dy: &'a TensorDesc<T>,
    dx: &'a TensorDesc<T>,
}

impl<'a, T: DataType> ConvBackwardData<'a, T> {
    /// Checks the data type (floating point, with the forward pass's compute-type rules) and
    /// `dy` against the convolution's output dimensions of `dx` and `w`.
    pub fn new(
        conv: &'a ConvDesc,
        w: &'a FilterDesc<T>,
        dy: &'a TensorDesc<T>,
        dx: &'a TensorDesc<T>,
    ) -> Result<Self> {
        conv.check_backward_types("convolution backward data", T::DTYPE)?;
        let rule = (
            "dy",
            "conv(dx, w)",
            "dy must have the forward output dimensions of dx",
        );
        forward_shape(conv, dx.dims(), w.dims(), rule, dy.dims())?;
        Ok(ConvBackwardData { conv, w, dy, dx })
    }
    /// The pass of a transposed convolution's plan, which built `conv` and `dx` so that `dy` is
    /// their forward output and checked the data type.
    pub(crate) fn planned(
        conv: &'a ConvDesc,
        w: &'a FilterDesc<T>,
        dy: &'a TensorDesc<T>,
        dx: &'a TensorDesc<T>,
    ) -> Self {
        ConvBackwardData { conv, w, dy, dx }
    }
}

conv_op!(ConvBackwardData<'a, T> where [T: DataType],
algo: ConvBwdDataAlgo, in: T, out: T,
operands: (w: FilterDesc<T>, dy: TensorDesc<T>, dx: TensorDesc<T>),
raw: [
    cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
    cudnnGetConvolutionBackwardDataWorkspaceSize,
    cudnnGetConvolutionBackwardDataAlgorithm_v7,
    cudnnFindConvolutionBackwardDataAlgorithmEx,
    cudnnConvolutionBackwardData
]);

/// `dw = backward_filter(x, dy)`: the gradient of a forward convolution with respect to its
/// filter (`dw = correlate(x, dy)`; launch with `beta = 1` to accumulate). Launch inputs are
/// `(x, dy)`, the output `dw`.
#[derive(Debug)]
pub struct ConvBackwardFilter<'a, T: DataType> {
    conv: &'a ConvDesc,
    x: &'a TensorDesc<T>,
    dy: &'a TensorDesc<T>,
    dw: &'a FilterDesc<T>,
}

impl<'a, T: DataType> ConvBackwardFilter<'a, T> {
    /// Checks the data type (floating point, with the forward pass's compute-type rules) and
    /// `dy` against the convolution's output dimensions of `x` and `dw`.
    pub fn new(
        conv: &'a ConvDesc,
        x: &'a TensorDesc<T>,
        dy: &'a TensorDesc<T>,
        dw: &'a FilterDesc<T>,
    ) -> Result<Self> {
        conv.check_backward_types("convolution backward filter", T::DTYPE)?;
        let rule = (
            "dy",
            "conv(x, dw)",
            "dy must have the forward output dimensions of x and dw",
        );
        forward_shape(conv, x.dims(), dw.dims(), rule, dy.dims())?;
        Ok(ConvBackwardFilter { conv, x, dy, dw })
    }
}

conv_op!(ConvBackwardFilter<'a, T> where [T: DataType],
algo: ConvBwdFilterAlgo, in: T, out: T,
operands: (x: TensorDesc<T>, dy: TensorDesc<T>, dw: FilterDesc<T>),
raw: [
    cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
    cudnnGetConvolutionBackwardFilterWorkspaceSize,
    cudnnGetConvolutionBackwardFilterAlgorithm_v7,
    cudnnFindConvolutionBackwardFilterAlgorithmEx,
    cudnnConvolutionBackwardFilter
]);
