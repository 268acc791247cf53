//! Layer normalization ([`LayerNorm`]) and its default path, batch-norm calls on regrouped
//! views; the graph path is in `layer_graph.rs`.
use std::cell::RefCell;
use std::fmt;

use super::layer_graph::{LayerNormGraph, LayerNormTrainGraphs};
use super::method::NormMethod;
use super::regrouped::{regrouped_accessors, regrouped_launches, Regrouped};
use super::{packed_dims, NormType};
use crate::error::{Error, Result};
use crate::tensor::Layout;

/// Layer normalization over the trailing dimensions of a packed row-major tensor:
/// each row of `D` features (the product of the normalized dimensions) is normalized, then
/// `y = x̂·γ + β` with `γ`, `β` of `D` elements of type `T` (PyTorch's `layer_norm` with
/// `normalized_shape` = those trailing dimensions).
///
/// Computed by cuDNN as described in the [module documentation](crate::norm): batch-norm
/// statistics over the regrouped view `[1, rows, D, 1]`, then the affine map, by default
/// ([`NormMethod::default_for_layer`]) as one batch-norm inference on the channels-last view
/// `[1, D, rows, 1]` of the same memory, and `dγ`, `dβ` as two-stage reductions over the rows
/// ([`NormParamGrads::TwoStageReduce`](super::NormParamGrads::TwoStageReduce)); other formulations of the same computation are chosen
/// with [`with_method`](Self::with_method).
/// Built once for a shape; it owns its descriptors and a few scratch buffers (see the memory
/// note there). `Send`, not `Sync`.
///
/// ```no_run
/// use cudnn_safe::norm::{LayerNorm, NormMethod};
/// use cudnn_safe::{cuda_context, Cudnn, Layout, Workspace};
/// # fn main() -> cudnn_safe::Result<()> {
/// let ctx = cuda_context(0)?;
/// let stream = ctx.default_stream();
/// let cudnn = Cudnn::new(stream.clone())?;
/// let ln = LayerNorm::<f32>::new(&Layout::nchw_nd(&[8, 128, 512])?, 1, 1e-5)? // normalize the last dim
///     .with_method(NormMethod::reductions())?; // optional: another formulation
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
}

impl<T: NormType> fmt::Debug for LayerNorm<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerNorm")
            .field("dtype", &T::DTYPE)
            .field("dims", &self.layout.dims())
            .field("normalized_dims", &self.normalized)
            .field("epsilon", &self.core.epsilon)
            .field("method", &self.core.method)
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
        })
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
    /// Workspace bytes the backward pass grows `workspace` to (the reductions of
    /// [`NormParamGrads::TwoStageReduce`](super::NormParamGrads::TwoStageReduce), the default, and of [`NormParamGrads::Reduce`](super::NormParamGrads::Reduce); 0
    /// with [`NormParamGrads::BatchNormBackward`](super::NormParamGrads::BatchNormBackward)), e.g. to size a
    /// [`Workspace::with_limit`](crate::Workspace::with_limit). Queries cuDNN.
    fn backward_workspace_size;
}

regrouped_launches! {
    LayerNorm, ln;
    /// Layer normalization forward, `y = (x − μ)/sqrt(σ² + ε)·γ + β` per row, saving nothing
    /// (for inference, or when the backward pass is not needed). `x`, `y`: [`LayerNorm::len`]
    /// elements; `γ`, `β`: [`LayerNorm::features`].
    #[doc(alias = "cudnnBatchNormalizationForwardTraining")]
    fn layer_norm_forward;
    /// [`layer_norm_forward`](Self::layer_norm_forward) that also returns `x̂` and the per-row
    /// mean and inverse standard deviation for [`layer_norm_backward`](Self::layer_norm_backward).
    fn layer_norm_forward_training;
    /// Layer normalization backward: writes `dx`, `dγ = Σ_rows dy·x̂` and `dβ = Σ_rows dy`
    /// (overwriting them) from `dy` and the values `saved` by
    /// [`layer_norm_forward_training`](Self::layer_norm_forward_training) of this `ln` on this
    /// `x` (checked). `workspace` serves the reductions of the default
    /// [`NormParamGrads::TwoStageReduce`](super::NormParamGrads::TwoStageReduce) and of [`NormParamGrads::Reduce`](super::NormParamGrads::Reduce), grown (within its
    /// limit) to [`LayerNorm::backward_workspace_size`] before anything is written.
    #[doc(alias = "cudnnBatchNormalizationBackward")]
    #[doc(alias = "cudnnReduceTensor")]
    fn layer_norm_backward;
}
