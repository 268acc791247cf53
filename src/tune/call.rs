//! The tuner's per-direction calls: forward, backward data and backward filter as one trait,
//! so that [`Autotuner`](super::Autotuner) decides, searches and runs each the same way. Kept
//! apart so that public convolution direction types can take these impls' place.
use super::search::{exec_plan, NO_BIAS};
use super::union::{self as gunion, ConvGraph, Ids};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::conv::{
    AlgoPerf, ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvFwdAlgo,
};
use crate::dtype::{DataType, Scalar};
use crate::error::Result;
use crate::graph::Plan;
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, TensorDesc};
use crate::workspace::Workspace;

/// One direction of a convolution call (forward, backward data or backward filter) as
/// [`Autotuner::tune`] runs it: its descriptors and inputs, with every call that writes the output
/// generic over the buffer written (the caller's output, or scratch memory when the caller's
/// contents must be kept).
pub(super) trait ConvCall {
    /// The direction's algorithms.
    type Algo: ConvAlgorithm;
    /// The output's element type.
    type Out: DataType;
    /// The type of alpha and beta.
    type Scalar: Scalar;
    /// The direction's name in logs.
    const OP: &'static str;
    /// The convolution.
    fn conv(&self) -> &ConvDesc;
    /// Elements of the output (the size of scratch memory standing in for it).
    fn out_len(&self) -> usize;
    /// cuDNN's heuristic ranking.
    fn heuristics(&self) -> Result<Vec<AlgoPerf<Self::Algo>>>;
    /// cuDNN's benchmark of every algorithm, writing `out`.
    fn find(
        &self,
        out: &mut impl DeviceBufferMut<Self::Out>,
        ws: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<Self::Algo>>>;
    /// The legacy call with `algo` and `(alpha, beta)`, writing `out`.
    fn launch(
        &self,
        algo: Self::Algo,
        alpha_beta: (Self::Scalar, Self::Scalar),
        ws: &mut Workspace,
        out: &mut impl DeviceBufferMut<Self::Out>,
    ) -> Result<()>;
    /// Whether the graph path can express the problem ([`gunion::eligible`]).
    fn eligible(&self) -> bool;
    /// The problem as a graph.
    fn graph(&self) -> Result<ConvGraph>;
    /// Runs a plan of [`ConvCall::graph`] writing `out`.
    fn exec(
        &self,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        out: &mut impl DeviceBufferMut<Self::Out>,
    ) -> Result<()>;
}

/// `y = conv(x, w)`: the handle, x, w, the convolution and y's descriptor, as the call takes them.
pub(super) struct Fwd<'a, X: DataType, Y: DataType, XB, WB>(
    pub(super) &'a Cudnn,
    pub(super) &'a TensorDesc<X>,
    pub(super) &'a XB,
    pub(super) &'a FilterDesc<X>,
    pub(super) &'a WB,
    pub(super) &'a ConvDesc,
    pub(super) &'a TensorDesc<Y>,
);

impl<X: DataType, Y: DataType<Scalar = X::Scalar>, XB: DeviceBuffer<X>, WB: DeviceBuffer<X>>
    ConvCall for Fwd<'_, X, Y, XB, WB>
{
    type Algo = ConvFwdAlgo;
    type Out = Y;
    type Scalar = X::Scalar;
    const OP: &'static str = "forward";
    fn conv(&self) -> &ConvDesc {
        self.5
    }
    fn out_len(&self) -> usize {
        self.6.span()
    }
    fn heuristics(&self) -> Result<Vec<AlgoPerf<ConvFwdAlgo>>> {
        let Fwd(cudnn, x_desc, _, w_desc, _, conv, y_desc) = *self;
        cudnn.conv_forward_heuristics(x_desc, w_desc, conv, y_desc)
    }
    fn find(
        &self,
        y: &mut impl DeviceBufferMut<Y>,
        ws: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvFwdAlgo>>> {
        let Fwd(cudnn, x_desc, x, w_desc, w, conv, y_desc) = *self;
        cudnn.conv_forward_find(x_desc, x, w_desc, w, conv, y_desc, y, ws)
    }
    fn launch(
        &self,
        algo: ConvFwdAlgo,
        (alpha, beta): (X::Scalar, X::Scalar),
        ws: &mut Workspace,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<()> {
        let Fwd(cudnn, x_desc, x, w_desc, w, conv, y_desc) = *self;
        cudnn.conv_forward(alpha, x_desc, x, w_desc, w, conv, algo, ws, beta, y_desc, y)
    }
    fn eligible(&self) -> bool {
        let Fwd(_, x_desc, _, w_desc, _, conv, y_desc) = *self;
        gunion::eligible::<X, Y>(x_desc.dims(), w_desc, conv, y_desc.dims())
    }
    fn graph(&self) -> Result<ConvGraph> {
        let Fwd(cudnn, x_desc, _, w_desc, _, conv, y_desc) = *self;
        gunion::fprop_graph(cudnn, x_desc, w_desc, conv, y_desc, None)
    }
    fn exec(
        &self,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        y: &mut impl DeviceBufferMut<Y>,
    ) -> Result<()> {
        exec_plan(self.0, plan, ids, ws, (self.2, self.4, NO_BIAS), y)
    }
}

/// `dx = backward_data(dy, w)`: the handle, w, dy, the convolution and dx's descriptor, as the
/// call takes them.
pub(super) struct Dgrad<'a, T: DataType, WB, DYB>(
    pub(super) &'a Cudnn,
    pub(super) &'a FilterDesc<T>,
    pub(super) &'a WB,
    pub(super) &'a TensorDesc<T>,
    pub(super) &'a DYB,
    pub(super) &'a ConvDesc,
    pub(super) &'a TensorDesc<T>,
);

impl<T: DataType, WB: DeviceBuffer<T>, DYB: DeviceBuffer<T>> ConvCall for Dgrad<'_, T, WB, DYB> {
    type Algo = ConvBwdDataAlgo;
    type Out = T;
    type Scalar = T::Scalar;
    const OP: &'static str = "backward-data";
    fn conv(&self) -> &ConvDesc {
        self.5
    }
    fn out_len(&self) -> usize {
        self.6.span()
    }
    fn heuristics(&self) -> Result<Vec<AlgoPerf<ConvBwdDataAlgo>>> {
        let Dgrad(cudnn, w_desc, _, dy_desc, _, conv, dx_desc) = *self;
        cudnn.conv_backward_data_heuristics(w_desc, dy_desc, conv, dx_desc)
    }
    fn find(
        &self,
        dx: &mut impl DeviceBufferMut<T>,
        ws: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvBwdDataAlgo>>> {
        let Dgrad(cudnn, w_desc, w, dy_desc, dy, conv, dx_desc) = *self;
        cudnn.conv_backward_data_find(w_desc, w, dy_desc, dy, conv, dx_desc, dx, ws)
    }
    fn launch(
        &self,
        algo: ConvBwdDataAlgo,
        (alpha, beta): (T::Scalar, T::Scalar),
        ws: &mut Workspace,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let Dgrad(cudnn, w_desc, w, dy_desc, dy, conv, dx_desc) = *self;
        cudnn.conv_backward_data(
            alpha, w_desc, w, dy_desc, dy, conv, algo, ws, beta, dx_desc, dx,
        )
    }
    fn eligible(&self) -> bool {
        let Dgrad(_, w_desc, _, dy_desc, _, conv, dx_desc) = *self;
        gunion::eligible::<T, T>(dx_desc.dims(), w_desc, conv, dy_desc.dims())
    }
    fn graph(&self) -> Result<ConvGraph> {
        let Dgrad(cudnn, w_desc, _, dy_desc, _, conv, dx_desc) = *self;
        gunion::dgrad_graph(cudnn, w_desc, dy_desc, conv, dx_desc)
    }
    fn exec(
        &self,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        dx: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        exec_plan(self.0, plan, ids, ws, (self.4, self.2, NO_BIAS), dx)
    }
}

/// `dw = backward_filter(x, dy)`: the handle, x, dy, the convolution and dw's descriptor, as the
/// call takes them.
pub(super) struct Wgrad<'a, T: DataType, XB, DYB>(
    pub(super) &'a Cudnn,
    pub(super) &'a TensorDesc<T>,
    pub(super) &'a XB,
    pub(super) &'a TensorDesc<T>,
    pub(super) &'a DYB,
    pub(super) &'a ConvDesc,
    pub(super) &'a FilterDesc<T>,
);

impl<T: DataType, XB: DeviceBuffer<T>, DYB: DeviceBuffer<T>> ConvCall for Wgrad<'_, T, XB, DYB> {
    type Algo = ConvBwdFilterAlgo;
    type Out = T;
    type Scalar = T::Scalar;
    const OP: &'static str = "backward-filter";
    fn conv(&self) -> &ConvDesc {
        self.5
    }
    fn out_len(&self) -> usize {
        self.6.span()
    }
    fn heuristics(&self) -> Result<Vec<AlgoPerf<ConvBwdFilterAlgo>>> {
        let Wgrad(cudnn, x_desc, _, dy_desc, _, conv, dw_desc) = *self;
        cudnn.conv_backward_filter_heuristics(x_desc, dy_desc, conv, dw_desc)
    }
    fn find(
        &self,
        dw: &mut impl DeviceBufferMut<T>,
        ws: &mut Workspace,
    ) -> Result<Vec<AlgoPerf<ConvBwdFilterAlgo>>> {
        let Wgrad(cudnn, x_desc, x, dy_desc, dy, conv, dw_desc) = *self;
        cudnn.conv_backward_filter_find(x_desc, x, dy_desc, dy, conv, dw_desc, dw, ws)
    }
    fn launch(
        &self,
        algo: ConvBwdFilterAlgo,
        (alpha, beta): (T::Scalar, T::Scalar),
        ws: &mut Workspace,
        dw: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let Wgrad(cudnn, x_desc, x, dy_desc, dy, conv, dw_desc) = *self;
        cudnn.conv_backward_filter(
            alpha, x_desc, x, dy_desc, dy, conv, algo, ws, beta, dw_desc, dw,
        )
    }
    fn eligible(&self) -> bool {
        let Wgrad(_, x_desc, _, dy_desc, _, conv, dw_desc) = *self;
        gunion::eligible::<T, T>(x_desc.dims(), dw_desc, conv, dy_desc.dims())
    }
    fn graph(&self) -> Result<ConvGraph> {
        let Wgrad(cudnn, x_desc, _, dy_desc, _, conv, dw_desc) = *self;
        gunion::wgrad_graph(cudnn, x_desc, dy_desc, conv, dw_desc)
    }
    fn exec(
        &self,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        dw: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        exec_plan(self.0, plan, ids, ws, (self.2, self.4, NO_BIAS), dw)
    }
}
