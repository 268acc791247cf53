//! Normalization layers: batch normalization (cuDNN's own calls, with the fused
//! BN + add + ReLU "Ex" variant), layer, instance and group normalization computed with cuDNN's
//! batch-normalization kernels on a regrouped view of the tensor (layer norm also on cuDNN's
//! fused normalization graphs), and RMS normalization on those graphs.
//!
//! * [`BatchNorm`] is built once for an input layout (it holds the data descriptor, the parameter
//!   descriptor cuDNN derives for it and a ReLU descriptor for the fused ops), then used by
//!   [`Cudnn::batch_norm_forward_inference`](crate::Cudnn::batch_norm_forward_inference), [`Cudnn::batch_norm_forward_training`](crate::Cudnn::batch_norm_forward_training),
//!   [`Cudnn::batch_norm_backward`](crate::Cudnn::batch_norm_backward) and their `_ex` forms.
//! * Training forward calls return an owned [`BatchNormSaved`] (saved mean, inverse variance and,
//!   for the Ex form, the reserve space). The backward calls take it and check that it came from
//!   the same [`BatchNorm`] and the same `x` buffer, so the statistics of one call cannot be used
//!   with another's data.
//! * [`LayerNorm`] and [`GroupNorm`] (instance norm is [`GroupNorm::instance`]) work the same way:
//!   a shape-bound object, a training forward returning an owned [`NormSaved`], a backward that
//!   consumes it by reference.
//! * [`LayerNorm`] runs by default ([`LayerNormPath::Auto`]) on cuDNN's fused normalization
//!   graphs (one kernel per call, f32/f16/bf16; the plans are built on the first call of each
//!   direction, seconds once per process), and on the batch-norm formulation below where cuDNN
//!   has no engine for the case (f64, for one). The graph path is also callable explicitly:
//!   [`Cudnn::layer_norm_forward_graph`](crate::Cudnn::layer_norm_forward_graph) for inference,
//!   [`Cudnn::layer_norm_forward_training_graph`](crate::Cudnn::layer_norm_forward_training_graph)
//!   returning an owned [`LayerNormGraphSaved`] (per-row f32 statistics, no `x̂`) and
//!   [`Cudnn::layer_norm_backward_graph`](crate::Cudnn::layer_norm_backward_graph): one kernel
//!   per direction, where the batch-norm formulation below makes several passes over the
//!   tensor.
//! * [`RmsNorm`] (`y = x · γ / sqrt(mean(x²) + ε)`, no mean, no bias) runs only on those
//!   graphs: [`Cudnn::rms_norm_forward`](crate::Cudnn::rms_norm_forward),
//!   [`Cudnn::rms_norm_forward_training`](crate::Cudnn::rms_norm_forward_training) returning an
//!   owned [`RmsNormSaved`] (the per-row inverse RMS), and
//!   [`Cudnn::rms_norm_backward`](crate::Cudnn::rms_norm_backward).
//! * Every object is built for the [`Layout`] of its input `x`, as the rest of
//!   the crate describes tensors: `BatchNorm::builder().build(&layout)`,
//!   `LayerNorm::new(&layout, normalized_dims, ε)`, `GroupNorm::new(&layout, groups, ε)`,
//!   `GroupNorm::instance(&layout, ε)`, `RmsNorm::new(&layout, normalized_dims, ε)`. Layer,
//!   group and RMS norm address packed row-major tensors ([`Layout::nchw_nd`](crate::Layout::nchw_nd))
//!   and refuse any other layout with [`Error::InvalidArgument`]
//!   naming `x`.
//! * The graph API's normalization operations ([`Graph::layer_norm`](crate::graph::Graph::layer_norm),
//!   `rms_norm`, `instance_norm`, `batch_norm`, `group_norm` and their backward) are in
//!   this folder too (`graph/`), compiled as part of [`crate::graph`].
//!
//! Parameters (scale, bias, running and saved statistics) of batch normalization are of type
//! [`NormType::Param`]: `f32` for f16, bf16 and f32 data, `f64` for f64 data — cuDNN's rule
//! (`cudnnDeriveBNTensorDescriptor`). Layer and group normalization take their `gamma` and `beta`
//! in the data type `T`, as PyTorch does.
//!
//! ```no_run
//! use cudnn_safe::norm::{BatchNorm, BatchNormMode, RunningStats};
//! use cudnn_safe::{cuda_context, Cudnn, Layout};
//! # fn main() -> cudnn_safe::Result<()> {
//! let ctx = cuda_context(0)?;
//! let stream = ctx.default_stream();
//! let cudnn = Cudnn::new(stream.clone())?;
//! let layout = Layout::nchw(8, 16, 32, 32)?;
//! let bn = BatchNorm::builder()
//!     .mode(BatchNormMode::Spatial)
//!     .epsilon(1e-5)
//!     .build::<f32>(&layout)?;
//! let x = stream.clone_htod(&vec![0.5f32; layout.span()]).unwrap();
//! let mut y = stream.alloc_zeros::<f32>(layout.span()).unwrap();
//! let (scale, bias) = (stream.clone_htod(&[1.0f32; 16]).unwrap(), stream.alloc_zeros::<f32>(16).unwrap());
//! let mut running_mean = stream.alloc_zeros::<f32>(16).unwrap();
//! let mut running_var = stream.clone_htod(&[1.0f32; 16]).unwrap();
//! let saved = cudnn.batch_norm_forward_training(
//!     &bn, 1.0, 0.0, &x, &mut y, &scale, &bias,
//!     Some(RunningStats::new(&mut running_mean, &mut running_var, 0.1)),
//! )?;
//! let dy = stream.clone_htod(&vec![1.0f32; layout.span()]).unwrap();
//! let mut dx = stream.alloc_zeros::<f32>(layout.span()).unwrap();
//! let (mut dscale, mut dbias) = (stream.alloc_zeros::<f32>(16).unwrap(), stream.alloc_zeros::<f32>(16).unwrap());
//! cudnn.batch_norm_backward(&bn, &saved, 1.0, 0.0, 1.0, 0.0, &x, &dy, &mut dx, &scale,
//!                           &mut dscale, &mut dbias)?;
//! # Ok(()) }
//! ```
//!
//! # Layer, instance and group normalization
//!
//! All three normalize groups of consecutive elements of a packed row-major tensor and then apply
//! a per-feature (layer norm) or per-channel (group / instance norm) affine map. cuDNN has no
//! legacy call for them, so this module runs group and instance norm, and layer norm where its
//! fused graph path does not run ([`LayerNormPath`]), as:
//!
//! 1. **Statistics and `x̂`**: cuDNN's spatial batch normalization (training mode, scale 1,
//!    bias 0, no running statistics) on a *regrouped view* `[1, R, M, 1]` of the same memory,
//!    where each of the `R` "channels" of the view is one normalized group of `M` consecutive
//!    elements. It yields `x̂ = (x − μ)/sqrt(σ² + ε)` (biased variance) and the per-group mean
//!    and `1/sqrt(σ² + ε)`.
//! 2. **Affine**: `y = x̂·γ + β` as one batch-norm inference on the *feature view* — the
//!    tensor seen with the `B` features (layer norm) or channels (group norm) as batch-norm
//!    channels — with scale `γ`, bias `β`, mean 0, variance 1, epsilon 0.
//! 3. **Backward**: `dγ = Σ dy·x̂` and `dβ = Σ dy` — for a group norm from one batch-norm
//!    backward on the feature view with `x = x̂`, saved mean 0 and inverse standard deviation
//!    1; for a layer norm as two `cudnnReduceTensor` calls each through partial sums
//!    ([`NormParamGrads::TwoStageReduce`]: the rows split as `S1·S2`, `S2` summed first), the
//!    product `dy·x̂` from [`Cudnn::op_tensor`](crate::Cudnn::op_tensor); `dx̂ = dy·γ` as in step 2; then cuDNN's
//!    batch-norm backward on the regrouped view with `dy = dx̂` gives `dx`.
//!
//! The feature view of a layer norm is the channels-last `[1, D, rows, 1]`, of a group norm the
//! packed tensor itself: the fastest of the views tried ([`NormMethod::default_for_layer`],
//! [`NormMethod::default_for_group`], which say why).
//!
//! Memory: a training forward of this formulation returns a [`NormSaved`] holding `x̂` (as many
//! elements of `T` as `x`) and two statistics per group (`T::Param`; the fused layer-norm path
//! saves only the statistics); the plain forward ([`Cudnn::layer_norm_forward`](crate::Cudnn::layer_norm_forward),
//! [`Cudnn::group_norm_forward`](crate::Cudnn::group_norm_forward)) and the backward pass use one scratch tensor of `x`'s size,
//! kept by the normalization object and reused. The objects also keep small constant/scratch
//! vectors: four of `R` parameters (scale 1, bias 0, and the discarded per-group gradients of
//! step 3) and four of `B` (mean 0, variance 1, and `γ`, `β` or their gradients converted
//! between f16/bf16 and f32); with the two-stage sums, the partial sums (`S1·B` parameters for
//! a layer norm, `N·C` for a group norm) and, for f16/bf16, `B` more for the sums before their
//! conversion. The backward pass of the two-stage sums (the layer-norm default) and of the
//! one-call reductions uses the caller's [`Workspace`](crate::Workspace)
//! ([`LayerNorm::backward_workspace_size`]): for bf16 data, which cuDNN reduces through f32,
//! it holds an f32 copy of the tensor.
//!
//! ## Other formulations
//!
//! The same computation can be put together from other cuDNN calls, set per object with
//! [`LayerNorm::with_method`] / [`GroupNorm::with_method`] (`benches/norm.rs` times each):
//!
//! * [`NormMethod::reductions`], the first formulation: step 2 with [`Cudnn::op_tensor`](crate::Cudnn::op_tensor)
//!   (multiply by `γ` broadcast) and [`Cudnn::add_tensor`](crate::Cudnn::add_tensor) (add `β`) — in place in `y` for
//!   the plain forward, which then needs no scratch tensor — and `dγ`, `dβ` with
//!   [`Cudnn::reduce_tensor`](crate::Cudnn::reduce_tensor), using the caller's workspace
//!   ([`LayerNorm::backward_workspace_size`]).
//! * [`NormStats`]: the view and mode of step 1 — `[1, R, M, 1]` (default), `[1, R, 1, M]`, a
//!   near-square `[1, R, H, W]`, or the persistent spatial mode.
//! * [`NormAffine`], [`NormParamGrads`]: each of steps 2 and 3 as batch-norm calls or as
//!   op-tensor / reductions (in one call or two per sum).
//! * [`FeatureLayout`]: whether the feature view is described channels-first (the tensor as
//!   it is) or, for a layer norm, channels-last (`[1, D, rows, 1]`, the same memory).
//!
//! ## Saved values keep their input borrowed
//!
//! A training forward's saved value ([`BatchNormSaved`], [`NormSaved`], [`LayerNormGraphSaved`],
//! [`RmsNormSaved`]) borrows the `x` it was computed from for as long as it lives (and the Ex
//! batch-norm forward's also borrows its output `y`, read through [`BatchNormSaved::y`]): the
//! backward pass needs that `x` unchanged, so it can be neither freed (and another tensor
//! allocated at its address) nor written while the saved value exists. The backward call also
//! checks that the `x` it is given is that buffer ([`Error::InvalidArgument`] otherwise).
//!
//! ```compile_fail,E0505
//! use cudnn_safe::norm::RmsNorm;
//! use cudnn_safe::{Cudnn, Workspace};
//! fn step(cudnn: &Cudnn, rn: &RmsNorm<f32>, ws: &mut Workspace) -> cudnn_safe::Result<()> {
//!     let s = cudnn.stream();
//!     let x = s.alloc_zeros::<f32>(rn.len()).unwrap();
//!     let gamma = s.alloc_zeros::<f32>(rn.features()).unwrap();
//!     let mut y = s.alloc_zeros::<f32>(rn.len()).unwrap();
//!     let saved = cudnn.rms_norm_forward_training(rn, &x, &gamma, &mut y, ws)?;
//!     drop(x); // freed while `saved` needs it: does not compile
//!     let other = s.alloc_zeros::<f32>(rn.len()).unwrap();
//!     let (dy, mut dx) = (s.alloc_zeros::<f32>(rn.len()).unwrap(), s.alloc_zeros(rn.len()).unwrap());
//!     let mut dgamma = s.alloc_zeros::<f32>(rn.features()).unwrap();
//!     cudnn.rms_norm_backward(rn, &saved, &other, &dy, &gamma, &mut dx, &mut dgamma, ws)
//! }
//! ```
//!
//! ```compile_fail,E0502
//! use cudnn_safe::norm::BatchNorm;
//! use cudnn_safe::{Cudnn, Layout};
//! fn step(cudnn: &Cudnn, bn: &BatchNorm<f32>, layout: &Layout) -> cudnn_safe::Result<()> {
//!     let s = cudnn.stream();
//!     let mut x = s.alloc_zeros::<f32>(layout.span()).unwrap();
//!     let mut y = s.alloc_zeros::<f32>(layout.span()).unwrap();
//!     let (scale, bias) = (s.alloc_zeros::<f32>(8).unwrap(), s.alloc_zeros::<f32>(8).unwrap());
//!     let saved = cudnn.batch_norm_forward_training(bn, 1.0, 0.0, &x, &mut y, &scale, &bias, None)?;
//!     s.memset_zeros(&mut x).unwrap(); // written while `saved` needs it: does not compile
//!     let (dy, mut dx) = (s.alloc_zeros::<f32>(layout.span()).unwrap(), s.alloc_zeros(layout.span()).unwrap());
//!     let (mut ds, mut db) = (s.alloc_zeros::<f32>(8).unwrap(), s.alloc_zeros::<f32>(8).unwrap());
//!     cudnn.batch_norm_backward(bn, &saved, 1.0, 0.0, 1.0, 0.0, &x, &dy, &mut dx, &scale, &mut ds, &mut db)
//! }
//! ```
use std::cell::RefCell;
use std::ffi::c_void;

use half::{bf16, f16};

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::tensor::Layout;

mod batch;
mod batch_ex;
mod ffi;
mod fold;
mod group;
mod launch;
mod layer;
mod layer_graph;
mod method;
mod regrouped;
mod rms;
mod saved;

pub use batch::{
    BatchNorm, BatchNormBuilder, BatchNormMode, BatchNormOps, BatchNormSaved, RunningStats,
};
pub use fold::fold_batch_norm;
pub use group::GroupNorm;
pub use layer::{LayerNorm, LayerNormPath};
pub use layer_graph::LayerNormGraphSaved;
pub use method::{FeatureLayout, NormAffine, NormMethod, NormParamGrads, NormStats};
pub use rms::{RmsNorm, RmsNormSaved};
pub use saved::NormSaved;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A data type cuDNN normalizes, with the type of its parameters and statistics.
///
/// Sealed: `f32`, `f64`, [`half::f16`] and [`half::bf16`]. `Param` is `f32` except for `f64`
/// data, as `cudnnDeriveBNTensorDescriptor` decides; alpha/beta for data and for parameters are
/// then of the same scalar type.
pub trait NormType: DataType + sealed::Sealed {
    /// Type of scale, bias, running and saved statistics of batch normalization.
    type Param: DataType<Scalar = <Self as DataType>::Scalar>;
}

impl NormType for f32 {
    type Param = f32;
}
impl NormType for f64 {
    type Param = f64;
}
impl NormType for f16 {
    type Param = f32;
}
impl NormType for bf16 {
    type Param = f32;
}

/// Smallest epsilon cuDNN accepts (`CUDNN_BN_MIN_EPSILON`, 0 since cuDNN 7.5).
pub const MIN_EPSILON: f64 = cudnn_safe_sys::CUDNN_BN_MIN_EPSILON;

/// Rejects an epsilon cuDNN would refuse or that makes the result meaningless.
fn check_epsilon(epsilon: f64) -> Result<()> {
    if epsilon.is_finite() && epsilon >= MIN_EPSILON {
        Ok(())
    } else {
        Err(Error::invalid(
            "normalization epsilon",
            format!("a finite value ≥ CUDNN_BN_MIN_EPSILON ({MIN_EPSILON})"),
            epsilon,
        ))
    }
}

/// The dimensions of `x` when it is packed row-major (channels-first, as
/// [`Layout::nchw_nd`] builds it), the only layout the layer, group and RMS norms address;
/// [`Error::InvalidArgument`] naming `what` (the argument) for any other layout. Strides of
/// extent-1 dimensions address nothing and are not compared.
fn packed_dims<'a>(what: &'static str, x: &'a Layout) -> Result<&'a [i64]> {
    let (dims, strides) = (x.dims(), x.strides());
    // The layout's constructor bounded the element count, so the products cannot overflow.
    let mut expected = 1i64;
    for (&d, &s) in dims.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return Err(Error::invalid(
                what,
                "a packed row-major layout (Layout::nchw_nd); convert others with \
                 Cudnn::transform_tensor first",
                x,
            ));
        }
        expected *= d;
    }
    Ok(dims)
}

/// A host pointer to an alpha/beta scalar, as cuDNN takes it.
fn scalar_ptr<S>(s: &S) -> *const c_void {
    (s as *const S).cast::<c_void>()
}

/// Makes the plan set in `kept` built for the handle `on_handle` accepts the current one in
/// `slot` (the current one moves to `kept`); whether one was found. With [`install_plans`]:
/// plan sets an object builds per cuDNN handle are never dropped while it lives (a CUDA graph
/// captured with a set runs its kernels at every replay), and a handle used again gets its set
/// back instead of a new build.
fn restore_plans<G>(
    slot: &RefCell<Option<Box<G>>>,
    kept: &RefCell<Vec<Box<G>>>,
    on_handle: impl Fn(&G) -> bool,
) -> bool {
    let mut kept = kept.borrow_mut();
    let Some(at) = kept.iter().position(|g| on_handle(g)) else {
        return false;
    };
    let found = kept.swap_remove(at);
    if let Some(old) = slot.borrow_mut().replace(found) {
        kept.push(old);
    }
    true
}

/// Makes `new` the current plan set in `slot`, keeping the one it replaces in `kept`
/// ([`restore_plans`]).
fn install_plans<G>(slot: &RefCell<Option<Box<G>>>, kept: &RefCell<Vec<Box<G>>>, new: Box<G>) {
    if let Some(old) = slot.borrow_mut().replace(new) {
        kept.borrow_mut().push(old);
    }
}

/// The first plan cuDNN's heuristics build for `g` (a normalization graph: its engines are
/// few and the heuristics' first is the fused one), or [`Error::NoEngine`] naming the graph.
fn first_graph_plan(cudnn: &Cudnn, g: &crate::graph::Graph) -> Result<crate::graph::Plan> {
    g.build(cudnn)?
        .plan(cudnn, &crate::graph::PlanFilter::new())
}
