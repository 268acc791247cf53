//! Layer normalization ([`LayerNorm`]): the choice of path ([`LayerNormPath`]) and the
//! batch-norm formulation on regrouped views; the fused graph path is in `layer_graph.rs`.
use std::cell::{Cell, RefCell};
use std::fmt;

use super::layer_graph::{LayerNormGraph, LayerNormTrainGraphs};
use super::method::NormMethod;
use super::regrouped::{regrouped_accessors, Regrouped};
use super::saved::NormSaved;
use super::{packed_dims, NormType};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::tensor::Layout;
use crate::workspace::Workspace;

/// Which implementation a [`LayerNorm`]'s default calls
/// ([`Cudnn::layer_norm_forward`](crate::Cudnn::layer_norm_forward),
/// [`layer_norm_forward_training`](crate::Cudnn::layer_norm_forward_training),
/// [`layer_norm_backward`](crate::Cudnn::layer_norm_backward)) run.
///
/// The fused graph path is one cuDNN normalization kernel per call (one read of `x`, one write
/// of `y`; the backward recomputes `x̂` from `x` and the saved statistics); the batch-norm
/// formulation ([`NormMethod`]) makes several passes over the tensor and saves `x̂`. Both
/// compute the same function. The graph path's plans are built on the first call of each
/// direction on a handle: cuDNN compiles the kernel at run time, which takes seconds the first
/// time in a process (later objects of the same shape and type reuse the compiled kernel).
///
/// ```no_run
/// use cudnn_safe::norm::{LayerNorm, LayerNormPath, NormMethod};
/// use cudnn_safe::Layout;
/// # fn main() -> cudnn_safe::Result<()> {
/// let x = Layout::nchw_nd(&[8, 128, 512])?;
/// let ln = LayerNorm::<f32>::new(&x, 1, 1e-5)?;
/// assert_eq!(ln.path(), LayerNormPath::Auto);
/// // Never compile a kernel at run time:
/// let ln = ln.with_path(LayerNormPath::BatchNorm);
/// assert_eq!(ln.path(), LayerNormPath::BatchNorm);
/// // Choosing a batch-norm formulation chooses that path too:
/// let ln = LayerNorm::<f32>::new(&x, 1, 1e-5)?.with_method(NormMethod::reductions())?;
/// assert_eq!(ln.path(), LayerNormPath::BatchNorm);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LayerNormPath {
    /// The default: the fused graph path whenever cuDNN builds a plan for the case (f32, f16,
    /// bf16 data, on the GPUs and versions whose normalization engines take the shape), the
    /// batch-norm formulation otherwise (always for f64, which has no graph engine). The first
    /// call of each direction decides, once per object: a plan that cannot be built is logged
    /// (`log` at info level, with cuDNN's reason) and that direction keeps the batch-norm
    /// formulation; the graph choice is logged at debug level.
    #[default]
    Auto,
    /// Only the fused graph path: a case without an engine is an error
    /// ([`Error::UnsupportedDataType`] for f64, [`Error::NoAlgorithm`] or [`Error::Cudnn`]).
    Graph,
    /// Only the batch-norm formulation of [`LayerNorm::method`]: no plan is ever built, so the
    /// first call costs no run-time compilation.
    BatchNorm,
}

/// Layer normalization over the trailing dimensions of a packed row-major tensor:
/// each row of `D` features (the product of the normalized dimensions) is normalized, then
/// `y = x̂·γ + β` with `γ`, `β` of `D` elements of type `T` (PyTorch's `layer_norm` with
/// `normalized_shape` = those trailing dimensions).
///
/// By default ([`LayerNormPath::Auto`]) each call is one fused cuDNN normalization kernel
/// (the graph path) when cuDNN has an engine for the case, as PyTorch's `layer_norm` is one
/// kernel. Otherwise, or with [`LayerNormPath::BatchNorm`], it is computed by cuDNN's
/// batch-norm calls as described in the [module documentation](crate::norm): batch-norm
/// statistics over the regrouped view `[1, rows, D, 1]`, then the affine map, by default
/// ([`NormMethod::default_for_layer`]) as one batch-norm inference on the channels-last view
/// `[1, D, rows, 1]` of the same memory, and `dγ`, `dβ` as two-stage reductions over the rows
/// ([`NormParamGrads::TwoStageReduce`](super::NormParamGrads::TwoStageReduce)); other
/// formulations of the same computation are chosen with [`with_method`](Self::with_method).
/// Built once for a shape; it owns its descriptors and a few scratch buffers (see the memory
/// note there). `Send`, not `Sync`.
///
/// ```no_run
/// use cudnn_safe::norm::LayerNorm;
/// use cudnn_safe::{cuda_context, Cudnn, Layout, Workspace};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let cudnn = Cudnn::new(stream.clone())?;
/// let ln = LayerNorm::<f32>::new(&Layout::nchw_nd(&[8, 128, 512])?, 1, 1e-5)?; // normalize the last dim
/// let x = stream.clone_htod(&vec![0.5f32; ln.len()]).unwrap();
/// let gamma = stream.clone_htod(&vec![1.0f32; 512]).unwrap();
/// let beta = stream.alloc_zeros::<f32>(512).unwrap();
/// let mut y = stream.alloc_zeros::<f32>(ln.len()).unwrap();
/// let saved = cudnn.layer_norm_forward_training(&ln, &x, &gamma, &beta, &mut y)?;
/// let dy = stream.clone_htod(&vec![1.0f32; ln.len()]).unwrap();
/// let mut dx = stream.alloc_zeros::<f32>(ln.len()).unwrap();
/// let (mut dgamma, mut dbeta) = (stream.alloc_zeros::<f32>(512).unwrap(), stream.alloc_zeros::<f32>(512).unwrap());
/// let mut ws = Workspace::new(stream.clone());
/// cudnn.layer_norm_backward(&ln, &saved, &x, &dy, &gamma, &mut dx, &mut dgamma, &mut dbeta, &mut ws)?;
/// # Ok(()) }
/// ```
pub struct LayerNorm<T: NormType> {
    pub(super) core: Regrouped<T>,
    layout: Layout,
    normalized: usize,
    /// The graph formulation's plan, built on first use
    /// ([`Cudnn::layer_norm_forward_graph`](crate::Cudnn::layer_norm_forward_graph)); `RefCell` keeps the object `Send` and not `Sync`.
    pub(super) graph: RefCell<Option<Box<LayerNormGraph>>>,
    /// The graph training path's two plans, built on first use
    /// ([`Cudnn::layer_norm_forward_training_graph`](crate::Cudnn::layer_norm_forward_training_graph)).
    pub(super) train: RefCell<Option<Box<LayerNormTrainGraphs>>>,
    /// Plan sets built for other handles, kept for the object's life (captured CUDA graphs may
    /// run them).
    // Boxed: a set moves between the current slot and this list without moving its plans.
    #[allow(clippy::vec_box)]
    pub(super) kept_graph: RefCell<Vec<Box<LayerNormGraph>>>,
    #[allow(clippy::vec_box)]
    pub(super) kept_train: RefCell<Vec<Box<LayerNormTrainGraphs>>>,
    /// Which path the default calls run.
    pub(super) path: LayerNormPath,
    /// Under [`LayerNormPath::Auto`]: the inference plan (`[0]`) or the training plans (`[1]`)
    /// could not be built, so that direction runs the batch-norm formulation.
    pub(super) no_graph: Cell<[bool; 2]>,
    /// The graph plans' workspace for the default forward calls, which take none: never
    /// freed or moved while the object lives (a larger need adds one), so captured calls stay
    /// valid.
    pub(super) workspace: RefCell<Vec<Workspace>>,
}

impl<T: NormType> fmt::Debug for LayerNorm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNorm")
            .field("dtype", &T::DTYPE)
            .field("dims", &self.layout.dims())
            .field("normalized_dims", &self.normalized)
            .field("epsilon", &self.core.epsilon)
            .field("method", &self.core.method)
            .field("path", &self.path)
            .finish()
    }
}

impl<T: NormType> LayerNorm<T> {
    /// Layer normalization of a tensor laid out as `x` (packed row-major, as
    /// [`Layout::nchw_nd`] builds it), over its last `normalized_dims` dimensions (1 to
    /// `x.rank()`), with epsilon `epsilon` (finite, ≥ 0). Host only: [`Error::InvalidArgument`]
    /// for another layout (naming `x`), a bad `normalized_dims` or epsilon.
    pub fn new(x: &Layout, normalized_dims: usize, epsilon: f64) -> Result<Self> {
        let dims = packed_dims("layer-norm x layout", x)?;
        if normalized_dims == 0 || normalized_dims > dims.len() {
            return Err(Error::invalid(
                "layer-norm normalized dimensions",
                format!("1 to {} trailing dimensions", dims.len()),
                normalized_dims,
            ));
        }
        let split = dims.len() - normalized_dims;
        // Products bounded by the element count the layout validated.
        let rows: i64 = dims[..split].iter().product();
        let features: i64 = dims[split..].iter().product();
        Ok(LayerNorm {
            core: Regrouped::new(
                rows,
                features,
                1,
                1,
                epsilon,
                NormMethod::default_for_layer(),
            )?,
            layout: x.clone(),
            normalized: normalized_dims,
            graph: RefCell::new(None),
            train: RefCell::new(None),
            kept_graph: RefCell::new(Vec::new()),
            kept_train: RefCell::new(Vec::new()),
            path: LayerNormPath::Auto,
            no_graph: Cell::new([false; 2]),
            workspace: RefCell::new(Vec::new()),
        })
    }
    /// The same normalization running `path` ([`LayerNormPath`]; [`LayerNormPath::Auto`] by
    /// default). Host only.
    pub fn with_path(mut self, path: LayerNormPath) -> Self {
        self.path = path;
        self.no_graph.set([false; 2]);
        self
    }
    /// The path the default calls run ([`LayerNormPath`]).
    pub fn path(&self) -> LayerNormPath {
        self.path
    }
    /// Choosing a formulation ([`with_method`](Self::with_method)) chooses the batch-norm path.
    fn method_chosen(self) -> Self {
        self.with_path(LayerNormPath::BatchNorm)
    }
    /// How many trailing dimensions are normalized.
    pub fn normalized_dims(&self) -> usize {
        self.normalized
    }
    /// Rows normalized (product of the leading dimensions); also the length of the saved
    /// statistics.
    pub fn rows(&self) -> usize {
        self.core.rows
    }
    /// Features per row (product of the normalized dimensions): the length of `γ` and `β`.
    pub fn features(&self) -> usize {
        self.core.features()
    }
}

regrouped_accessors! {
    LayerNorm, "default_for_layer";
    /// The same normalization computed with the batch-norm formulation `method`
    /// ([`NormMethod`]); this also sets the path to [`LayerNormPath::BatchNorm`].
    fn with_method;
    /// Workspace bytes the batch-norm formulation's backward pass grows `workspace` to (the reductions of
    /// [`NormParamGrads::TwoStageReduce`](super::NormParamGrads::TwoStageReduce), the default, and of [`NormParamGrads::Reduce`](super::NormParamGrads::Reduce); 0
    /// with [`NormParamGrads::BatchNormBackward`](super::NormParamGrads::BatchNormBackward)), e.g. to size a
    /// [`Workspace::with_limit`](crate::Workspace::with_limit). Queries cuDNN.
    fn backward_workspace_size;
}

impl Cudnn {
    /// Layer normalization forward, `y = (x − μ)/sqrt(σ² + ε)·γ + β` per row, saving nothing
    /// (for inference, or when the backward pass is not needed). `x`, `y`: [`LayerNorm::len`]
    /// elements; `γ`, `β`: [`LayerNorm::features`]; all checked before anything is built or
    /// enqueued.
    ///
    /// Runs `ln`'s [`LayerNormPath`]: by default one fused cuDNN normalization kernel, whose
    /// plan is built on the first call on a handle (seconds the first time in a process,
    /// run-time compilation; its workspace is kept by `ln`), or the batch-norm formulation
    /// where cuDNN has no engine for the case. Buffers not 16-byte aligned (views starting
    /// inside an allocation) go through aligned copies on the fused path. The plan's
    /// workspace is kept by `ln` and never freed or moved while `ln` lives, so the call can be
    /// captured ([`Cudnn::capture`](crate::Cudnn::capture)) once it has run outside a capture
    /// (the first call builds the plan and allocates).
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR")]
    #[doc(alias = "cudnnBatchNormalizationForwardTraining")]
    pub fn layer_norm_forward<T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        x: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        ln.check_forward_buffers(self, x, gamma, beta, &*y)?;
        if ln.fused_path(self, false)? {
            ln.forward_fused(self, x, gamma, beta, y)
        } else {
            ln.core.forward(self, x, gamma, beta, y)
        }
    }

    /// [`layer_norm_forward`](Self::layer_norm_forward) that also returns the per-row mean and
    /// inverse standard deviation (and, from the batch-norm formulation, `x̂`) for
    /// [`layer_norm_backward`](Self::layer_norm_backward), which runs the same path.
    /// The fused path ([`LayerNormPath`]) builds its forward and backward plans together on the
    /// first call on a handle.
    #[doc(alias = "CUDNN_NORM_FWD_TRAINING")]
    #[doc(alias = "cudnnBatchNormalizationForwardTraining")]
    pub fn layer_norm_forward_training<'x, T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        x: &'x impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        beta: &impl DeviceBuffer<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<NormSaved<'x, T>> {
        ln.check_forward_buffers(self, x, gamma, beta, &*y)?;
        if ln.fused_path(self, true)? {
            ln.forward_training_fused(self, x, gamma, beta, y)
        } else {
            ln.core.forward_training(self, x, gamma, beta, y)
        }
    }

    /// Layer normalization backward: writes `dx`, `dγ = Σ_rows dy·x̂` and `dβ = Σ_rows dy`
    /// (overwriting them) from `dy` and the values `saved` by
    /// [`layer_norm_forward_training`](Self::layer_norm_forward_training) of this `ln` on this
    /// `x` (checked), on the path that saved them: one fused kernel for the graph path, the
    /// batch-norm formulation's calls otherwise. Every buffer is checked before anything is
    /// enqueued. `workspace` is grown (within its limit) to the fused plan's need, or to
    /// [`LayerNorm::backward_workspace_size`] for the reductions of the batch-norm
    /// formulation ([`NormParamGrads::TwoStageReduce`](super::NormParamGrads::TwoStageReduce),
    /// its default, and [`NormParamGrads::Reduce`](super::NormParamGrads::Reduce)), before
    /// anything is written.
    #[doc(alias = "CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR")]
    #[doc(alias = "cudnnBatchNormalizationBackward")]
    #[doc(alias = "cudnnReduceTensor")]
    #[allow(clippy::too_many_arguments)] // the layer's inputs and outputs
    pub fn layer_norm_backward<T: NormType>(
        &self,
        ln: &LayerNorm<T>,
        saved: &NormSaved<'_, T>,
        x: &impl DeviceBuffer<T>,
        dy: &impl DeviceBuffer<T>,
        gamma: &impl DeviceBuffer<T>,
        dx: &mut impl DeviceBufferMut<T>,
        dgamma: &mut impl DeviceBufferMut<T>,
        dbeta: &mut impl DeviceBufferMut<T>,
        workspace: &mut Workspace,
    ) -> Result<()> {
        if saved.from_graph() {
            ln.backward_fused(self, saved, x, dy, gamma, dx, dgamma, dbeta, workspace)
        } else {
            ln.core
                .backward(self, saved, x, dy, gamma, dx, dgamma, dbeta, workspace)
        }
    }
}
