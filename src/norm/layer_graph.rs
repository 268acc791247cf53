//! The graph path of [`LayerNorm`]: one fused cuDNN `NORM_FORWARD` / `NORM_BACKWARD`
//! operation per call, planned once per object and handle; both the explicit `_graph` calls
//! and the default calls' fused path ([`LayerNormPath`]) run it.
use std::fmt;
use std::marker::PhantomData;

use cudarc::driver::CudaSlice;

use super::layer::{LayerNorm, LayerNormPath};
use super::saved::{check_saved_origin, NormSaved};
use super::{first_graph_plan, install_plans, restore_plans, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::graph::{Args, TensorId};
use crate::handle::Cudnn;
use crate::workspace::Workspace;

/// The built plans of [`LayerNorm`]'s graph training path (forward in the training phase, and
/// backward) and the ids of their tensors.
pub(super) struct LayerNormTrainGraphs {
    fwd: crate::graph::Plan,
    /// Forward: x, γ, β in; y, mean, inverse standard deviation out.
    fwd_ids: [crate::graph::TensorId; 6],
    bwd: crate::graph::Plan,
    /// Backward: dy, x, γ, mean, inverse standard deviation in; dx, dγ, dβ out.
    bwd_ids: [crate::graph::TensorId; 8],
}

/// What [`Cudnn::layer_norm_forward_training_graph`] saves for
/// [`Cudnn::layer_norm_backward_graph`]: the per-row mean and inverse standard deviation
/// `1/sqrt(σ² + ε)` (biased variance) as f32, [`LayerNorm::rows`] each. Unlike [`NormSaved`](super::NormSaved)
/// no `x̂` is kept (the graph backward recomputes it from `x`), so it costs `8·rows` bytes.
///
/// The backward call checks that it came from the same normalization object and that `x` is
/// the buffer the forward read.
pub struct LayerNormGraphSaved<'x> {
    mean: CudaSlice<f32>,
    inv_std: CudaSlice<f32>,
    norm: u64,
    /// Device address of the `x` the forward read; `x` stays borrowed (`'x`) while this
    /// value lives, so no other buffer can be at that address.
    x: u64,
    _x: PhantomData<&'x ()>,
}

impl fmt::Debug for LayerNormGraphSaved<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNormGraphSaved")
            .field("rows", &self.mean.len())
            .finish()
    }
}

impl LayerNormGraphSaved<'_> {
    /// The mean of each row (PyTorch's `mean` of `native_layer_norm`, `[rows]`).
    pub fn mean(&self) -> &CudaSlice<f32> {
        &self.mean
    }
    /// `1/sqrt(σ² + ε)` of each row (PyTorch's `rstd`), ordered as [`mean`](Self::mean).
    pub fn inv_std(&self) -> &CudaSlice<f32> {
        &self.inv_std
    }
}

/// A built plan of [`LayerNorm`]'s graph formulation and the ids of its tensors.
pub(super) struct LayerNormGraph {
    plan: crate::graph::Plan,
    x: crate::graph::TensorId,
    gamma: crate::graph::TensorId,
    beta: crate::graph::TensorId,
    y: crate::graph::TensorId,
}

impl<T: NormType> LayerNorm<T> {
    /// Builds (once per object and handle) the plan of the graph formulation that
    /// [`Cudnn::layer_norm_forward_graph`] runs: one cuDNN `NORM_FORWARD` operation
    /// ([`Graph::layer_norm`](crate::graph::Graph::layer_norm), inference phase) on the rows
    /// `[rows, features, 1, 1]`, with `γ` and `β` of type `T`. The first build in a process
    /// takes seconds (cuDNN compiles the kernel at run time), hence an explicit call; later
    /// calls on the same handle return at once. f64 has no norm engine:
    /// [`Error::UnsupportedDataType`]. A configuration no engine runs:
    /// [`Error::NoAlgorithm`] or [`Error::Cudnn`].
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    pub fn build_graph_plan(&self, cudnn: &Cudnn) -> Result<()> {
        use crate::graph::Graph;
        let on_handle = |g: &LayerNormGraph| g.plan.graph.check_handle(cudnn).is_ok();
        if self.graph.borrow().as_deref().is_some_and(on_handle)
            || restore_plans(&self.graph, &self.kept_graph, on_handle)
        {
            return Ok(());
        }
        let (rows, d) = (self.core.rows as i64, self.core.features() as i64);
        let mut g = Graph::new(T::DTYPE, crate::DType::F32, crate::DType::F32);
        let x = g.tensor_nhwc("x", &[rows, d, 1, 1], T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &[1, d, 1, 1], T::DTYPE)?;
        let beta = g.tensor_nhwc("beta", &[1, d, 1, 1], T::DTYPE)?;
        let out = g.layer_norm(x, gamma, beta, self.core.epsilon, false)?;
        g.mark_output(out.y)?;
        let plan = first_graph_plan(cudnn, &g)?;
        let built = Box::new(LayerNormGraph {
            plan,
            x,
            gamma,
            beta,
            y: out.y,
        });
        install_plans(&self.graph, &self.kept_graph, built);
        Ok(())
    }

    /// Whether [`build_graph_plan`](Self::build_graph_plan) has built a plan (for some handle).
    pub fn has_graph_plan(&self) -> bool {
        self.graph.borrow().is_some()
    }

    /// Builds (once per object and handle) the two plans of the graph training path,
    /// [`Cudnn::layer_norm_forward_training_graph`] and [`Cudnn::layer_norm_backward_graph`]:
    /// one cuDNN `NORM_FORWARD` operation in the training phase and one `NORM_BACKWARD`
    /// ([`Graph::layer_norm`](crate::graph::Graph::layer_norm),
    /// [`Graph::layer_norm_backward`](crate::graph::Graph::layer_norm_backward)) on the rows
    /// `[rows, features, 1, 1]`, with `γ`, `β`, `dγ`, `dβ` of type `T` and f32 statistics
    /// (with cuDNN 9.14 and 9.19, f16/bf16 data got a backward engine only with
    /// `γ` and its gradients of the data type, or all of them f32; the data type's keeps the
    /// object's buffers). The first build in a process takes seconds (runtime compilation);
    /// later calls on the same handle return at once. f64 has no norm engine:
    /// [`Error::UnsupportedDataType`]. A configuration no engine runs: [`Error::NoAlgorithm`]
    /// or [`Error::Cudnn`].
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    pub fn build_graph_training_plans(&self, cudnn: &Cudnn) -> Result<()> {
        use crate::graph::Graph;
        let on_handle = |g: &LayerNormTrainGraphs| {
            g.fwd.graph.check_handle(cudnn).is_ok() && g.bwd.graph.check_handle(cudnn).is_ok()
        };
        if self.train.borrow().as_deref().is_some_and(on_handle)
            || restore_plans(&self.train, &self.kept_train, on_handle)
        {
            return Ok(());
        }
        let (rows, d) = (self.core.rows as i64, self.core.features() as i64);
        let first_plan = |g: &Graph| first_graph_plan(cudnn, g);
        let (x_dims, p_dims, s_dims) = ([rows, d, 1, 1], [1, d, 1, 1], [rows, 1, 1, 1]);
        let mut g = Graph::new(T::DTYPE, crate::DType::F32, crate::DType::F32);
        let x = g.tensor_nhwc("x", &x_dims, T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &p_dims, T::DTYPE)?;
        let beta = g.tensor_nhwc("beta", &p_dims, T::DTYPE)?;
        let out = g.layer_norm(x, gamma, beta, self.core.epsilon, true)?;
        let (mean, inv) = out.stats.expect("the training phase has statistics");
        g.mark_output(out.y)?;
        g.mark_output_as(mean, crate::DType::F32)?;
        g.mark_output_as(inv, crate::DType::F32)?;
        let fwd = first_plan(&g)?;
        let fwd_ids = [x, gamma, beta, out.y, mean, inv];

        let mut g = Graph::new(T::DTYPE, crate::DType::F32, crate::DType::F32);
        let dy = g.tensor_nhwc("dy", &x_dims, T::DTYPE)?;
        let x = g.tensor_nhwc("x", &x_dims, T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &p_dims, T::DTYPE)?;
        let mean = g.tensor_nhwc("mean", &s_dims, crate::DType::F32)?;
        let inv = g.tensor_nhwc("inv_std", &s_dims, crate::DType::F32)?;
        let grads = g.layer_norm_backward(dy, x, gamma, mean, inv)?;
        g.mark_output(grads.dx)?;
        g.mark_output(grads.dscale)?;
        g.mark_output(grads.dbias)?;
        let bwd = first_plan(&g)?;
        let bwd_ids = [dy, x, gamma, mean, inv, grads.dx, grads.dscale, grads.dbias];
        let built = Box::new(LayerNormTrainGraphs {
            fwd,
            fwd_ids,
            bwd,
            bwd_ids,
        });
        install_plans(&self.train, &self.kept_train, built);
        Ok(())
    }

    /// Whether [`build_graph_training_plans`](Self::build_graph_training_plans) has built the
    /// plans (for some handle).
    pub fn has_graph_training_plans(&self) -> bool {
        self.train.borrow().is_some()
    }
}

impl Cudnn {
    /// [`layer_norm_forward`](Self::layer_norm_forward) through the graph formulation: one
    /// fused cuDNN normalization kernel instead of the batch-norm-based steps. Opt-in because
    /// the plan is built on first use ([`LayerNorm::build_graph_plan`], seconds the first time
    /// in a process: runtime compilation) and kept in `ln` for later calls on this handle.
    ///
    /// Same buffers as [`layer_norm_forward`](Self::layer_norm_forward) (`x`, `y`:
    /// [`LayerNorm::len`] elements, `γ`, `β`: [`LayerNorm::features`]), all checked before
    /// anything is enqueued; `workspace` is grown (within its limit) to the plan's need.
    /// f64 is refused ([`Error::UnsupportedDataType`]): cuDNN has no f64 norm engine.
    ///
    /// ```no_run
    /// use cudnn_safe::norm::LayerNorm;
    /// use cudnn_safe::{cuda_context, Cudnn, Layout, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let ln = LayerNorm::<f32>::new(&Layout::nchw_nd(&[32768, 1024])?, 1, 1e-5)?;
    /// ln.build_graph_plan(&cudnn)?; // seconds, once
    /// let x = stream.clone_htod(&vec![0.5f32; ln.len()]).unwrap();
    /// let gamma = stream.clone_htod(&vec![1.0f32; 1024]).unwrap();
    /// let beta = stream.alloc_zeros::<f32>(1024).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(ln.len()).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// cudnn.layer_norm_forward_graph(&ln, &x, &gamma, &beta, &mut y, &mut ws)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    pub fn layer_norm_forward_graph<T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        ln.build_graph_plan(self)?;
        let cached = ln.graph.borrow();
        let g = cached.as_ref().expect("built above");
        let mut args = crate::graph::Args::new(self);
        args.input(g.x, x)?
            .input(g.gamma, gamma)?
            .input(g.beta, beta)?;
        args.output(g.y, y)?;
        self.execute(&g.plan, &args, workspace)
    }

    /// [`layer_norm_forward_training`](Self::layer_norm_forward_training) through the graph
    /// formulation: one fused cuDNN normalization kernel writes `y` and the per-row mean and
    /// inverse standard deviation, which it returns for
    /// [`layer_norm_backward_graph`](Self::layer_norm_backward_graph), instead of the
    /// batch-norm-based steps' several passes over the tensor. The plans
    /// are built on first use ([`LayerNorm::build_graph_training_plans`], seconds the first
    /// time in a process) and kept in `ln` for later calls on this handle.
    ///
    /// `x`, `y`: [`LayerNorm::len`] elements; `γ`, `β`: [`LayerNorm::features`]; all checked
    /// (span, context, `y` not overlapping an input) before anything is enqueued, and the
    /// statistics are allocated on the handle's stream. `workspace` is grown (within its limit)
    /// to the plan's need. f64 is refused ([`Error::UnsupportedDataType`]).
    ///
    /// ```no_run
    /// use cudnn_safe::norm::LayerNorm;
    /// use cudnn_safe::{cuda_context, Cudnn, Layout, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// let ln = LayerNorm::<f32>::new(&Layout::nchw_nd(&[8, 512, 1024])?, 1, 1e-5)?;
    /// ln.build_graph_training_plans(&cudnn)?; // seconds, once
    /// let x = stream.clone_htod(&vec![0.5f32; ln.len()]).unwrap();
    /// let gamma = stream.clone_htod(&vec![1.0f32; 1024]).unwrap();
    /// let beta = stream.alloc_zeros::<f32>(1024).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(ln.len()).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// let saved = cudnn.layer_norm_forward_training_graph(&ln, &x, &gamma, &beta, &mut y, &mut ws)?;
    /// let dy = stream.clone_htod(&vec![1.0f32; ln.len()]).unwrap();
    /// let mut dx = stream.alloc_zeros::<f32>(ln.len()).unwrap();
    /// let mut dgamma = stream.alloc_zeros::<f32>(1024).unwrap();
    /// let mut dbeta = stream.alloc_zeros::<f32>(1024).unwrap();
    /// cudnn.layer_norm_backward_graph(
    ///     &ln, &saved, &x, &dy, &gamma, &mut dx, &mut dgamma, &mut dbeta, &mut ws,
    /// )?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "CUDNN_NORM_FWD_TRAINING")]
    pub fn layer_norm_forward_training_graph<'x, T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        x: &'x impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<LayerNormGraphSaved<'x>> {
        ln.build_graph_training_plans(self)?;
        let cached = ln.train.borrow();
        let g = cached.as_ref().expect("built above");
        let [xi, gi, bi, yi, mi, vi] = g.fwd_ids;
        let alloc_err = |e| Error::driver("allocating layer-norm statistics", e);
        let mut mean = self
            .stream()
            .alloc_zeros::<f32>(ln.rows())
            .map_err(alloc_err)?;
        let mut inv_std = self
            .stream()
            .alloc_zeros::<f32>(ln.rows())
            .map_err(alloc_err)?;
        let x_at = {
            let (p, _guard) = x.device_ptr(self.stream());
            p
        };
        {
            let mut args = crate::graph::Args::new(self);
            args.input(xi, x)?.input(gi, gamma)?.input(bi, beta)?;
            args.output(yi, y)?
                .output(mi, &mut mean)?
                .output(vi, &mut inv_std)?;
            self.execute(&g.fwd, &args, workspace)?;
        }
        Ok(LayerNormGraphSaved {
            mean,
            inv_std,
            norm: ln.core.id,
            x: x_at,
            _x: PhantomData,
        })
    }

    /// Layer normalization backward through the graph formulation: one fused cuDNN kernel
    /// writes `dx`, `dγ = Σ_rows dy·x̂` and `dβ = Σ_rows dy` (overwriting them) from `dy`, `x`,
    /// `γ` and the statistics `saved` by
    /// [`layer_norm_forward_training_graph`](Self::layer_norm_forward_training_graph) of this
    /// `ln` on this `x` (both checked: [`Error::InvalidArgument`]), in one pass where
    /// [`layer_norm_backward`](Self::layer_norm_backward) makes several.
    ///
    /// `x`, `dy`, `dx`: [`LayerNorm::len`] elements; `γ`, `dγ`, `dβ`:
    /// [`LayerNorm::features`]; every buffer is checked (span, context, outputs not
    /// overlapping) before anything is enqueued, so a rejected call writes nothing.
    /// `workspace` is grown (within its limit) to the plan's need. An example is at
    /// [`layer_norm_forward_training_graph`](Self::layer_norm_forward_training_graph).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    pub fn layer_norm_backward_graph<T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        saved: &LayerNormGraphSaved<'_>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        check_saved_origin(
            self,
            "layer-norm saved values",
            "the value returned by a graph training forward of this LayerNorm",
            (saved.norm, saved.x),
            ln.core.id,
            x,
        )?;
        // The saved values were allocated on the forward's stream: order this use with it.
        let _order = crate::stream_order::cross_use(saved.mean.stream(), self.stream())?;
        ln.build_graph_training_plans(self)?;
        let cached = ln.train.borrow();
        let g = cached.as_ref().expect("built above");
        let [dyi, xi, gi, mi, vi, dxi, dgi, dbi] = g.bwd_ids;
        let mut args = crate::graph::Args::new(self);
        args.input(dyi, dy)?
            .input(xi, x)?
            .input(gi, gamma)?
            .input(mi, &saved.mean)?
            .input(vi, &saved.inv_std)?;
        args.output(dxi, dx)?
            .output(dgi, dgamma)?
            .output(dbi, dbeta)?;
        self.execute(&g.bwd, &args, workspace)
    }
}

/// The byte alignment the graph binds buffers at (its tensors declare 16).
const GRAPH_ALIGNMENT: u64 = 16;

/// The first `len` elements of the input `buf` where the fused path can bind them: `None` when
/// `buf` is 16-byte aligned (bound as it is), otherwise an aligned copy enqueued on the
/// handle's stream. `buf` has been checked to hold `len` elements on the handle's context.
fn aligned_input<T: DataType>(
    cudnn: &Cudnn,
    buf: &impl DeviceBuffer<T>,
    len: usize,
) -> Result<Option<CudaSlice<T>>> {
    if buf.device_ptr(cudnn.stream()).0 % GRAPH_ALIGNMENT == 0 {
        return Ok(None);
    }
    let stream = cudnn.stream();
    let err = |e| Error::driver("copying a layer-norm input to an aligned buffer", e);
    // SAFETY: the copy below writes all `len` elements before the plan reads them.
    let mut copy = unsafe { stream.alloc::<T>(len) }.map_err(err)?;
    stream
        .memcpy_dtod(&buf.view().slice(..len), &mut copy)
        .map_err(err)?;
    Ok(Some(copy))
}

/// Where the fused path writes the output `buf`: `None` when `buf` is 16-byte aligned
/// (written in place), otherwise an aligned scratch buffer of `len` elements that
/// [`copy_back`] copies into `buf` after the plan ran.
fn aligned_output<T: DataType>(
    cudnn: &Cudnn,
    buf: &impl DeviceBufferMut<T>,
    len: usize,
) -> Result<Option<CudaSlice<T>>> {
    if buf.device_ptr(cudnn.stream()).0 % GRAPH_ALIGNMENT == 0 {
        return Ok(None);
    }
    // SAFETY: the plan writes every element of its output before `copy_back` reads them.
    let tmp = unsafe { cudnn.stream().alloc::<T>(len) }
        .map_err(|e| Error::driver("allocating an aligned layer-norm output", e))?;
    Ok(Some(tmp))
}

/// Copies an output the plan wrote into aligned scratch ([`aligned_output`]) to the caller's
/// buffer, which holds at least `len` elements (checked).
fn copy_back<T: DataType>(
    cudnn: &Cudnn,
    tmp: Option<CudaSlice<T>>,
    buf: &mut impl DeviceBufferMut<T>,
    len: usize,
) -> Result<()> {
    let Some(tmp) = tmp else { return Ok(()) };
    cudnn
        .stream()
        .memcpy_dtod(&tmp, &mut buf.view_mut().slice_mut(..len))
        .map_err(|e| Error::driver("copying a layer-norm output from an aligned buffer", e))
}

/// Binds the input `buf` to `id`, or its aligned copy when there is one.
fn bind_in<'a, T: DataType>(
    args: &mut Args<'a>,
    id: TensorId,
    buf: &'a impl DeviceBuffer<T>,
    copy: &'a Option<CudaSlice<T>>,
) -> Result<()> {
    match copy {
        Some(c) => args.input(id, c)?,
        None => args.input(id, buf)?,
    };
    Ok(())
}

/// Binds the output `buf` to `id`, or its aligned scratch when there is one.
fn bind_out<'a, T: DataType>(
    args: &mut Args<'a>,
    id: TensorId,
    buf: &'a mut impl DeviceBufferMut<T>,
    tmp: &'a mut Option<CudaSlice<T>>,
) -> Result<()> {
    match tmp {
        Some(t) => args.output(id, t)?,
        None => args.output(id, buf)?,
    };
    Ok(())
}

impl<T: NormType> LayerNorm<T> {
    /// Whether a default call of one direction (`training`: the training forward and the
    /// backward; otherwise the plain forward) runs the fused graph path, building its plans on
    /// first use, as [`LayerNormPath`] documents.
    pub(super) fn fused_path(&self, cudnn: &Cudnn, training: bool) -> Result<bool> {
        let build = |ln: &Self| {
            if training {
                ln.build_graph_training_plans(cudnn)
            } else {
                ln.build_graph_plan(cudnn)
            }
        };
        let which = usize::from(training);
        match self.path {
            LayerNormPath::BatchNorm => Ok(false),
            LayerNormPath::Graph => build(self).map(|()| true),
            LayerNormPath::Auto => {
                if T::DTYPE == crate::DType::F64 || self.no_graph.get()[which] {
                    return Ok(false);
                }
                let built = if training {
                    self.has_graph_training_plans()
                } else {
                    self.has_graph_plan()
                };
                let what = if training { "training" } else { "inference" };
                match build(self) {
                    Ok(()) => {
                        if !built {
                            log::debug!(
                                "layer norm {:?} {:?} ({what}): fused graph path",
                                self.dims(),
                                T::DTYPE
                            );
                        }
                        Ok(true)
                    }
                    Err(e) => {
                        log::info!(
                            "layer norm {:?} {:?} ({what}): no fused graph plan ({e}); \
                             running the batch-norm formulation",
                            self.dims(),
                            T::DTYPE
                        );
                        let mut no = self.no_graph.get();
                        no[which] = true;
                        self.no_graph.set(no);
                        Ok(false)
                    }
                }
            }
        }
    }

    /// The checks of a forward call, before anything is built or enqueued.
    pub(super) fn check_forward_buffers(
        &self,
        cudnn: &Cudnn,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let (full, affine) = (self.core.full_layout(), self.core.affine_layout());
        cudnn.check_tensor("x", full, x, false)?;
        cudnn.check_tensor("gamma", affine, gamma, false)?;
        cudnn.check_tensor("beta", affine, beta, false)?;
        cudnn.check_tensor("y", full, y, true)
    }

    /// The plan workspace of the default forward calls, which take none, holding `need`
    /// bytes once prepared. The object keeps it, and never frees or moves an allocation while
    /// it lives: a call captured into a CUDA graph keeps pointing at valid memory. A larger
    /// need (a plan rebuilt for another handle) adds a workspace rather than growing one;
    /// other streams of the handle's context use the same memory (a workspace orders its uses
    /// across streams), another context gets one of its own.
    fn forward_workspace<'w>(
        &self,
        cudnn: &Cudnn,
        slot: &'w mut Vec<Workspace>,
        need: usize,
    ) -> &'w mut Workspace {
        let found = slot.iter().rposition(|w| {
            **w.stream().context() == **cudnn.context()
                && (w.capacity() == 0 || w.capacity() >= need)
        });
        let at = found.unwrap_or_else(|| {
            slot.push(Workspace::new(cudnn.stream().clone()));
            slot.len() - 1
        });
        &mut slot[at]
    }

    /// The default plain forward on the fused path (plan built by [`Self::fused_path`]).
    pub(super) fn forward_fused(
        &self,
        cudnn: &Cudnn,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.check_forward_buffers(cudnn, x, gamma, beta, &*y)?;
        let (n, d) = (self.len(), self.features());
        let (xc, gc, bc) = (
            aligned_input(cudnn, x, n)?,
            aligned_input(cudnn, gamma, d)?,
            aligned_input(cudnn, beta, d)?,
        );
        let mut yt = aligned_output(cudnn, &*y, n)?;
        let cached = self.graph.borrow();
        let g = cached
            .as_ref()
            .ok_or_else(|| Error::invalid("layer-norm graph plan", "built", "not built"))?;
        let mut slot = self.workspace.borrow_mut();
        let ws = self.forward_workspace(cudnn, &mut slot, g.plan.workspace_size());
        {
            let mut args = Args::new(cudnn);
            bind_in(&mut args, g.x, x, &xc)?;
            bind_in(&mut args, g.gamma, gamma, &gc)?;
            bind_in(&mut args, g.beta, beta, &bc)?;
            bind_out(&mut args, g.y, &mut *y, &mut yt)?;
            cudnn.execute(&g.plan, &args, ws)?;
        }
        copy_back(cudnn, yt, y, n)
    }

    /// The default training forward on the fused path (plans built by [`Self::fused_path`]):
    /// the saved value holds the statistics and no `x̂`.
    pub(super) fn forward_training_fused<'x>(
        &self,
        cudnn: &Cudnn,
        x: &'x impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<NormSaved<'x, T>> {
        self.check_forward_buffers(cudnn, x, gamma, beta, &*y)?;
        let (n, d, rows) = (self.len(), self.features(), self.rows());
        let (xc, gc, bc) = (
            aligned_input(cudnn, x, n)?,
            aligned_input(cudnn, gamma, d)?,
            aligned_input(cudnn, beta, d)?,
        );
        let mut yt = aligned_output(cudnn, &*y, n)?;
        let cached = self.train.borrow();
        let g = cached
            .as_ref()
            .ok_or_else(|| Error::invalid("layer-norm graph plans", "built", "not built"))?;
        let [xi, gi, bi, yi, mi, vi] = g.fwd_ids;
        let alloc_err = |e| Error::driver("allocating layer-norm statistics", e);
        // SAFETY: the plan writes both statistics of every row before the saved value is
        // returned; they are not read otherwise.
        let mut mean = unsafe { cudnn.stream().alloc::<T::Param>(rows) }.map_err(alloc_err)?;
        // SAFETY: as above.
        let mut inv_std = unsafe { cudnn.stream().alloc::<T::Param>(rows) }.map_err(alloc_err)?;
        let mut slot = self.workspace.borrow_mut();
        let ws = self.forward_workspace(cudnn, &mut slot, g.fwd.workspace_size());
        {
            let mut args = Args::new(cudnn);
            bind_in(&mut args, xi, x, &xc)?;
            bind_in(&mut args, gi, gamma, &gc)?;
            bind_in(&mut args, bi, beta, &bc)?;
            bind_out(&mut args, yi, &mut *y, &mut yt)?;
            // The statistics tensors are f32, `T::Param` of every type with a graph engine;
            // the binding checks the type.
            args.output(mi, &mut mean)?.output(vi, &mut inv_std)?;
            cudnn.execute(&g.fwd, &args, ws)?;
        }
        copy_back(cudnn, yt, y, n)?;
        let x_at = x.device_ptr(cudnn.stream()).0;
        Ok(NormSaved {
            xhat: None,
            mean,
            inv_std,
            norm: self.core.id,
            x: x_at,
            _x: PhantomData,
        })
    }

    /// The default backward of values the fused path saved.
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    pub(super) fn backward_fused(
        &self,
        cudnn: &Cudnn,
        saved: &NormSaved<'_, T>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        let (full, affine) = (self.core.full_layout(), self.core.affine_layout());
        cudnn.check_tensor("x", full, x, false)?;
        cudnn.check_tensor("dy", full, dy, false)?;
        cudnn.check_tensor("gamma", affine, gamma, false)?;
        cudnn.check_tensor("dx", full, &*dx, true)?;
        cudnn.check_tensor("dgamma", affine, &*dgamma, true)?;
        cudnn.check_tensor("dbeta", affine, &*dbeta, true)?;
        let rows = self.rows();
        cudnn.check_buffer("saved mean", &saved.mean, rows)?;
        cudnn.check_buffer("saved inverse std", &saved.inv_std, rows)?;
        cudnn.check_workspace_context(workspace)?;
        check_saved_origin(
            cudnn,
            "layer-norm saved values",
            "the value returned by a training forward of this LayerNorm",
            (saved.norm, saved.x),
            self.core.id,
            x,
        )?;
        // The saved values were allocated on the forward's stream: order this use with it.
        let _order = crate::stream_order::cross_use(saved.mean.stream(), cudnn.stream())?;
        self.build_graph_training_plans(cudnn)?;
        let (n, d) = (self.len(), self.features());
        let (xc, dyc, gc) = (
            aligned_input(cudnn, x, n)?,
            aligned_input(cudnn, dy, n)?,
            aligned_input(cudnn, gamma, d)?,
        );
        let mut dxt = aligned_output(cudnn, &*dx, n)?;
        let mut dgt = aligned_output(cudnn, &*dgamma, d)?;
        let mut dbt = aligned_output(cudnn, &*dbeta, d)?;
        let cached = self.train.borrow();
        let g = cached.as_ref().expect("built above");
        let [dyi, xi, gi, mi, vi, dxi, dgi, dbi] = g.bwd_ids;
        {
            let mut args = Args::new(cudnn);
            bind_in(&mut args, dyi, dy, &dyc)?;
            bind_in(&mut args, xi, x, &xc)?;
            bind_in(&mut args, gi, gamma, &gc)?;
            args.input(mi, &saved.mean)?.input(vi, &saved.inv_std)?;
            bind_out(&mut args, dxi, &mut *dx, &mut dxt)?;
            bind_out(&mut args, dgi, &mut *dgamma, &mut dgt)?;
            bind_out(&mut args, dbi, &mut *dbeta, &mut dbt)?;
            cudnn.execute(&g.bwd, &args, workspace)?;
        }
        copy_back(cudnn, dxt, dx, n)?;
        copy_back(cudnn, dgt, dgamma, d)?;
        copy_back(cudnn, dbt, dbeta, d)
    }
}
