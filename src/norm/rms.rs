//! RMS normalization as a layer object over cuDNN's fused normalization graphs.
use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use cudarc::driver::CudaSlice;

use super::saved::check_saved_origin;
use super::{first_graph_plan, install_plans, restore_plans};
use super::{packed_dims, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::error::{Error, Result};
use crate::graph::{Args, Graph, Plan, TensorId};
use crate::handle::Cudnn;
use crate::raw;
use crate::tensor::Layout;
use crate::workspace::Workspace;
use crate::DType;

/// RMS normalization over the trailing dimensions of a packed row-major tensor: each row of
/// `D` features (the product of the normalized dimensions) is scaled by its inverse root mean
/// square, `y = x · r · γ` with `r = 1/sqrt(mean(x²) + ε)` and `γ` of `D` elements of type `T`
/// (PyTorch's `torch.nn.functional.rms_norm` with `normalized_shape` = those trailing
/// dimensions; no bias, no mean subtracted).
///
/// Computed by cuDNN's fused normalization graphs (`CUDNN_RMS_NORM`: one kernel per call,
/// [`Graph::rms_norm`] and [`Graph::rms_norm_backward`] on the rows `[rows, D, 1, 1]`, with `γ`
/// and `dγ` of type `T` and an f32 `r`). The plans are built on first use or explicitly
/// ([`RmsNorm::build_plan`], [`RmsNorm::build_training_plans`]): seconds the first time in a
/// process (runtime compilation), then kept in the object for later calls on the same handle.
/// f32, f16 and bf16; f64 has no norm engine ([`Error::UnsupportedDataType`] when a plan is
/// built). `Send`, not `Sync`.
///
/// ```no_run
/// use cudnn_safe::half::bf16;
/// use cudnn_safe::norm::RmsNorm;
/// use cudnn_safe::{cuda_context, Cudnn, Layout, Workspace};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let cudnn = Cudnn::new(stream.clone())?;
/// let rn = RmsNorm::<bf16>::new(&Layout::nchw_nd(&[8, 512, 4096])?, 1, 1e-6)?;
/// rn.build_training_plans(&cudnn)?; // seconds, once per process
/// let x = stream.clone_htod(&vec![bf16::from_f32(0.5); rn.len()]).unwrap();
/// let gamma = stream.clone_htod(&vec![bf16::ONE; 4096]).unwrap();
/// let mut y = stream.alloc_zeros::<bf16>(rn.len()).unwrap();
/// let mut ws = Workspace::new(stream.clone());
/// let saved = cudnn.rms_norm_forward_training(&rn, &x, &gamma, &mut y, &mut ws)?;
/// let dy = stream.clone_htod(&vec![bf16::ONE; rn.len()]).unwrap();
/// let mut dx = stream.alloc_zeros::<bf16>(rn.len()).unwrap();
/// let mut dgamma = stream.alloc_zeros::<bf16>(4096).unwrap();
/// cudnn.rms_norm_backward(&rn, &saved, &x, &dy, &gamma, &mut dx, &mut dgamma, &mut ws)?;
/// # Ok(()) }
/// ```
#[doc(alias = "CUDNN_RMS_NORM")]
#[doc(alias = "RMSNorm")]
pub struct RmsNorm<T: NormType> {
    layout: Layout,
    normalized: usize,
    rows: usize,
    features: usize,
    epsilon: f64,
    id: u64,
    /// The inference plan, built on first use; `RefCell` keeps the object `Send` and not
    /// `Sync`.
    infer: RefCell<Option<Box<InferGraph>>>,
    /// The training plans, built on first use.
    train: RefCell<Option<Box<TrainGraphs>>>,
    /// Plan sets built for other handles, kept for the object's life (captured CUDA graphs may
    /// run them).
    // Boxed: a set moves between the current slot and this list without moving its plans.
    #[allow(clippy::vec_box)]
    kept_infer: RefCell<Vec<Box<InferGraph>>>,
    #[allow(clippy::vec_box)]
    kept_train: RefCell<Vec<Box<TrainGraphs>>>,
    _t: PhantomData<T>,
}

/// The inference plan and its tensors: x, γ in; y out.
struct InferGraph {
    plan: Plan,
    ids: [TensorId; 3],
}

/// The training plans and their tensors.
struct TrainGraphs {
    fwd: Plan,
    /// Forward: x, γ in; y, r out.
    fwd_ids: [TensorId; 4],
    bwd: Plan,
    /// Backward: dy, x, γ, r in; dx, dγ out.
    bwd_ids: [TensorId; 6],
}

/// What [`Cudnn::rms_norm_forward_training`] saves for [`Cudnn::rms_norm_backward`]: the
/// per-row inverse root mean square `r = 1/sqrt(mean(x²) + ε)` as f32, [`RmsNorm::rows`] of
/// them. The backward call checks that it came from the same object and that `x` is the
/// buffer the forward read.
pub struct RmsNormSaved<'x> {
    inv_rms: CudaSlice<f32>,
    norm: u64,
    /// Device address of the `x` the forward read; `x` stays borrowed (`'x`) while this
    /// value lives, so no other buffer can be at that address.
    x: u64,
    _x: PhantomData<&'x ()>,
}

impl fmt::Debug for RmsNormSaved<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RmsNormSaved")
            .field("rows", &self.inv_rms.len())
            .finish()
    }
}

impl RmsNormSaved<'_> {
    /// `1/sqrt(mean(x²) + ε)` of each row, in row order.
    pub fn inv_rms(&self) -> &CudaSlice<f32> {
        &self.inv_rms
    }
}

impl<T: NormType> fmt::Debug for RmsNorm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RmsNorm")
            .field("dtype", &T::DTYPE)
            .field("dims", &self.layout.dims())
            .field("normalized_dims", &self.normalized)
            .field("epsilon", &self.epsilon)
            .finish()
    }
}

impl<T: NormType> RmsNorm<T> {
    /// RMS normalization of a tensor laid out as `x` (packed row-major, as
    /// [`Layout::nchw_nd`] builds it), over its last `normalized_dims` dimensions (1 to
    /// `x.rank()`), with epsilon `epsilon` (finite, ≥ 0; PyTorch's and most models' 1e-6 is
    /// accepted: cuDNN's batch-norm minimum does not apply). Host only:
    /// [`Error::InvalidArgument`] for another layout (naming `x`), a bad `normalized_dims` or
    /// epsilon.
    pub fn new(x: &Layout, normalized_dims: usize, epsilon: f64) -> Result<Self> {
        let dims = packed_dims("RMS-norm x layout", x)?;
        if normalized_dims == 0 || normalized_dims > dims.len() {
            return Err(Error::invalid(
                "RMS-norm normalized dimensions",
                format!("1 to {} trailing dimensions", dims.len()),
                normalized_dims,
            ));
        }
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(Error::invalid(
                "RMS-norm epsilon",
                "a finite value ≥ 0",
                epsilon,
            ));
        }
        let split = dims.len() - normalized_dims;
        // Products bounded by the element count the layout validated.
        let rows: i64 = dims[..split].iter().product();
        let features: i64 = dims[split..].iter().product();
        Ok(RmsNorm {
            layout: x.clone(),
            normalized: normalized_dims,
            rows: rows as usize,
            features: features as usize,
            epsilon,
            id: raw::next_descriptor_id(),
            infer: RefCell::new(None),
            train: RefCell::new(None),
            kept_infer: RefCell::new(Vec::new()),
            kept_train: RefCell::new(Vec::new()),
            _t: PhantomData,
        })
    }
    /// The layout of `x`, `y`, `dy` and `dx`.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// The tensor dimensions.
    pub fn dims(&self) -> &[i64] {
        self.layout.dims()
    }
    /// How many trailing dimensions are normalized.
    pub fn normalized_dims(&self) -> usize {
        self.normalized
    }
    /// Elements of `x`, `y`, `dy`, `dx`.
    pub fn len(&self) -> usize {
        self.rows * self.features
    }
    /// Whether the tensor is empty (never: every dimension is at least 1).
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Rows normalized (product of the leading dimensions); also the length of the saved
    /// [`RmsNormSaved::inv_rms`].
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Features per row (product of the normalized dimensions): the length of `γ` and `dγ`.
    pub fn features(&self) -> usize {
        self.features
    }
    /// The epsilon.
    pub fn epsilon(&self) -> f64 {
        self.epsilon
    }

    /// `[rows, D, 1, 1]` and `[1, D, 1, 1]`, described channels-last as cudnn-frontend's
    /// normalization samples do (for `[.., D, 1, 1]` the same memory as row-major).
    fn shapes(&self) -> ([i64; 4], [i64; 4]) {
        let (rows, d) = (self.rows as i64, self.features as i64);
        ([rows, d, 1, 1], [1, d, 1, 1])
    }

    /// Builds (once per object and handle) the inference plan of
    /// [`Cudnn::rms_norm_forward`]: one `NORM_FORWARD` operation in the inference phase. The
    /// first build in a process takes seconds (runtime compilation). f64:
    /// [`Error::UnsupportedDataType`]; a configuration no engine runs: [`Error::NoAlgorithm`]
    /// or [`Error::Cudnn`].
    pub fn build_plan(&self, cudnn: &Cudnn) -> Result<()> {
        let on_handle = |g: &InferGraph| g.plan.graph.check_handle(cudnn).is_ok();
        if self.infer.borrow().as_deref().is_some_and(on_handle)
            || restore_plans(&self.infer, &self.kept_infer, on_handle)
        {
            return Ok(());
        }
        let (xd, pd) = self.shapes();
        let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
        let x = g.tensor_nhwc("x", &xd, T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &pd, T::DTYPE)?;
        let out = g.rms_norm(x, gamma, None, self.epsilon, false)?;
        g.mark_output(out.y)?;
        let plan = first_graph_plan(cudnn, &g)?;
        let built = Box::new(InferGraph {
            plan,
            ids: [x, gamma, out.y],
        });
        install_plans(&self.infer, &self.kept_infer, built);
        Ok(())
    }

    /// Builds (once per object and handle) the two plans of [`Cudnn::rms_norm_forward_training`]
    /// and [`Cudnn::rms_norm_backward`]: `NORM_FORWARD` in the training phase and
    /// `NORM_BACKWARD`. Errors as [`build_plan`](Self::build_plan).
    pub fn build_training_plans(&self, cudnn: &Cudnn) -> Result<()> {
        let on_handle = |g: &TrainGraphs| {
            g.fwd.graph.check_handle(cudnn).is_ok() && g.bwd.graph.check_handle(cudnn).is_ok()
        };
        if self.train.borrow().as_deref().is_some_and(on_handle)
            || restore_plans(&self.train, &self.kept_train, on_handle)
        {
            return Ok(());
        }
        let (xd, pd) = self.shapes();
        let sd = [xd[0], 1, 1, 1];
        let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
        let x = g.tensor_nhwc("x", &xd, T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &pd, T::DTYPE)?;
        let out = g.rms_norm(x, gamma, None, self.epsilon, true)?;
        let inv = out.inv_rms.expect("the training phase has statistics");
        g.mark_output(out.y)?;
        g.mark_output_as(inv, DType::F32)?;
        let fwd = first_graph_plan(cudnn, &g)?;
        let fwd_ids = [x, gamma, out.y, inv];

        let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
        let dy = g.tensor_nhwc("dy", &xd, T::DTYPE)?;
        let x = g.tensor_nhwc("x", &xd, T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &pd, T::DTYPE)?;
        let inv = g.tensor_nhwc("inv_rms", &sd, DType::F32)?;
        let grads = g.rms_norm_backward(dy, x, gamma, inv, false)?;
        g.mark_output(grads.dx)?;
        g.mark_output(grads.dscale)?;
        let bwd = first_graph_plan(cudnn, &g)?;
        let bwd_ids = [dy, x, gamma, inv, grads.dx, grads.dscale];
        let built = Box::new(TrainGraphs {
            fwd,
            fwd_ids,
            bwd,
            bwd_ids,
        });
        install_plans(&self.train, &self.kept_train, built);
        Ok(())
    }

    /// Whether [`build_plan`](Self::build_plan) has built the inference plan (for some
    /// handle).
    pub fn has_plan(&self) -> bool {
        self.infer.borrow().is_some()
    }

    /// Whether [`build_training_plans`](Self::build_training_plans) has built the training
    /// plans (for some handle).
    pub fn has_training_plans(&self) -> bool {
        self.train.borrow().is_some()
    }
}

impl Cudnn {
    /// RMS normalization forward, saving nothing (inference): `y = x · r · γ` per row. `x`,
    /// `y`: [`RmsNorm::len`] elements; `γ`: [`RmsNorm::features`]; all checked (span, context,
    /// `y` not overlapping an input) before anything is enqueued. The plan is built on first
    /// use ([`RmsNorm::build_plan`]); `workspace` is grown (within its limit) to its need.
    #[doc(alias = "CUDNN_RMS_NORM")]
    pub fn rms_norm_forward<T: NormType>(
        &self,
        rn: &RmsNorm<T>,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        rn.build_plan(self)?;
        let held = rn.infer.borrow();
        let g = held.as_ref().expect("built above");
        let [xi, gi, yi] = g.ids;
        let mut args = Args::new(self);
        args.input(xi, x)?.input(gi, gamma)?;
        args.output(yi, y)?;
        self.execute(&g.plan, &args, workspace)
    }

    /// RMS normalization forward that also returns the per-row `r` for
    /// [`rms_norm_backward`](Self::rms_norm_backward) (allocated on the handle's stream,
    /// `4·rows` bytes). Buffers and checks as [`rms_norm_forward`](Self::rms_norm_forward);
    /// the plans are built on first use ([`RmsNorm::build_training_plans`]).
    #[doc(alias = "CUDNN_RMS_NORM")]
    #[doc(alias = "CUDNN_NORM_FWD_TRAINING")]
    pub fn rms_norm_forward_training<'x, T: NormType>(
        &self,
        rn: &RmsNorm<T>,
        x: &'x impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<RmsNormSaved<'x>> {
        rn.build_training_plans(self)?;
        let held = rn.train.borrow();
        let g = held.as_ref().expect("built above");
        let [xi, gi, yi, vi] = g.fwd_ids;
        let mut inv_rms = self
            .stream()
            .alloc_zeros::<f32>(rn.rows)
            .map_err(|e| Error::driver("allocating RMS-norm statistics", e))?;
        let x_at = {
            let (p, _guard) = x.device_ptr(self.stream());
            p
        };
        {
            let mut args = Args::new(self);
            args.input(xi, x)?.input(gi, gamma)?;
            args.output(yi, y)?.output(vi, &mut inv_rms)?;
            self.execute(&g.fwd, &args, workspace)?;
        }
        Ok(RmsNormSaved {
            inv_rms,
            norm: rn.id,
            x: x_at,
            _x: PhantomData,
        })
    }

    /// RMS normalization backward: writes `dx` and `dγ = Σ_rows dy·x·r` (overwriting them)
    /// from `dy`, `x`, `γ` and the `r` `saved` by
    /// [`rms_norm_forward_training`](Self::rms_norm_forward_training) of this `rn` on this `x`
    /// (both checked: [`Error::InvalidArgument`]). `x`, `dy`, `dx`: [`RmsNorm::len`]
    /// elements; `γ`, `dγ`: [`RmsNorm::features`]; every buffer is checked before anything is
    /// enqueued, so a rejected call writes nothing. An example is at [`RmsNorm`].
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    pub fn rms_norm_backward<T: NormType>(
        &self,
        rn: &RmsNorm<T>,
        saved: &RmsNormSaved<'_>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        check_saved_origin(
            self,
            "RMS-norm saved values",
            "the value returned by a training forward of this RmsNorm",
            (saved.norm, saved.x),
            rn.id,
            x,
        )?;
        // The saved values were allocated on the forward's stream: order this use with it.
        let _order = crate::stream_order::cross_use(saved.inv_rms.stream(), self.stream())?;
        rn.build_training_plans(self)?;
        let held = rn.train.borrow();
        let g = held.as_ref().expect("built above");
        let [dyi, xi, gi, vi, dxi, dgi] = g.bwd_ids;
        let mut args = Args::new(self);
        args.input(dyi, dy)?
            .input(xi, x)?
            .input(gi, gamma)?
            .input(vi, &saved.inv_rms)?;
        args.output(dxi, dx)?.output(dgi, dgamma)?;
        self.execute(&g.bwd, &args, workspace)
    }
}
