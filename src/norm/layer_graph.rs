//! The graph path of [`LayerNorm`]: one fused cuDNN `NORM_FORWARD` / `NORM_BACKWARD`
//! operation per call, planned once per object and handle.
use std::fmt;
use std::marker::PhantomData;

use cudarc::driver::CudaSlice;

use super::layer::LayerNorm;
use super::saved::check_saved_origin;
use super::{first_graph_plan, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::error::{Error, Result};
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
        if let Some(g) = self.graph.borrow().as_ref() {
            if g.plan.graph.check_handle(cudnn).is_ok() {
                return Ok(());
            }
        }
        let (rows, d) = (self.core.rows as i64, self.core.features() as i64);
        let mut g = Graph::new(T::DTYPE, crate::DType::F32, crate::DType::F32);
        let x = g.tensor_nhwc("x", &[rows, d, 1, 1], T::DTYPE)?;
        let gamma = g.tensor_nhwc("gamma", &[1, d, 1, 1], T::DTYPE)?;
        let beta = g.tensor_nhwc("beta", &[1, d, 1, 1], T::DTYPE)?;
        let out = g.layer_norm(x, gamma, beta, self.core.epsilon, false)?;
        g.mark_output(out.y)?;
        let plan = first_graph_plan(cudnn, &g)?;
        *self.graph.borrow_mut() = Some(Box::new(LayerNormGraph {
            plan,
            x,
            gamma,
            beta,
            y: out.y,
        }));
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
        if let Some(g) = self.train.borrow().as_ref() {
            if g.fwd.graph.check_handle(cudnn).is_ok() && g.bwd.graph.check_handle(cudnn).is_ok() {
                return Ok(());
            }
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
        *self.train.borrow_mut() = Some(Box::new(LayerNormTrainGraphs {
            fwd,
            fwd_ids,
            bwd,
            bwd_ids,
        }));
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
