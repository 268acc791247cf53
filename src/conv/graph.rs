//! The backend-graph equivalents of the three convolution directions, for the tuner's union
//! search: whether a direction's problem can be a graph, the graph, and running one of its plans
//! with the direction's buffers.
use super::{ConvBackwardData, ConvBackwardFilter, ConvForward, ConvOp};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DataType, Scalar};
use crate::error::Result;
use crate::graph::{Args, Plan};
use crate::handle::Cudnn;
use crate::tensor::TensorDesc;
use crate::tune::union::{self as gunion, ConvGraph, Ids};
use crate::workspace::Workspace;

/// A convolution direction the union search can run as a backend graph (`conv_fprop`,
/// `conv_dgrad`, `conv_wgrad`).
pub(crate) trait UnionGraph: ConvOp {
    /// Whether the graph path can express the problem ([`gunion::eligible`]).
    fn eligible(&self) -> bool;
    /// The problem as a graph.
    fn graph(&self, cudnn: &Cudnn) -> Result<ConvGraph>;
    /// Whether the graph binds the launch's inputs in the other order (backward data: the
    /// launch takes `(w, dy)`, the graph's first tensor is `dy`).
    const SWAP: bool = false;
    /// The output as a tensor descriptor (a filter's packed layout for backward filter), for
    /// [`combine`](Self::combine).
    fn out_tensor(&self) -> Result<TensorDesc<Self::Out>>;
    /// Whether [`combine`](Self::combine) can take this output: packed (added as one contiguous
    /// run), or strided with 4 or 5 dimensions (what `cudnnAddTensor` takes).
    fn can_combine(&self) -> bool {
        self.out_tensor()
            .is_ok_and(|d| d.layout().is_packed() || (4..=5).contains(&d.layout().rank()))
    }
    /// `out = alpha·scratch + beta·out` (`cudnnAddTensor`), `scratch` holding a plain result of
    /// the direction: how a call with other `alpha`/`beta` uses a graph plan, which only writes.
    fn combine(
        &self,
        cudnn: &Cudnn,
        (alpha, beta): (f64, f64),
        scratch: &impl DeviceBuffer<Self::Out>,
        out: &mut impl DeviceBufferMut<Self::Out>,
    ) -> Result<()> {
        let d = self.out_tensor()?;
        let l = d.layout();
        // A packed output is one contiguous run: added as `[len / a, a, 1, 1]`, which cuDNN's
        // elementwise kernels spread over the whole GPU whatever the dims' order.
        let d = match (0..=6)
            .rev()
            .map(|p| 1i64 << p)
            .find(|a| l.element_count() as i64 % a == 0)
        {
            Some(a) if l.is_packed() => TensorDesc::nchw(l.element_count() as i64 / a, a, 1, 1)?,
            _ => d,
        };
        let s = <Self::Out as DataType>::Scalar::from_f64;
        cudnn.add_tensor(s(alpha), &d, scratch, s(beta), &d, out)
    }
    /// Runs a plan of [`graph`](Self::graph) writing `out`, with the direction's inputs in its
    /// launch order.
    fn exec(
        &self,
        cudnn: &Cudnn,
        plan: &Plan,
        ids: Ids,
        ws: &mut Workspace,
        (a, b): (&impl DeviceBuffer<Self::In>, &impl DeviceBuffer<Self::In>),
        out: &mut impl DeviceBufferMut<Self::Out>,
    ) -> Result<()> {
        if Self::SWAP {
            exec_graph(cudnn, plan, ids, ws, (b, a, NO_BIAS), out)
        } else {
            exec_graph(cudnn, plan, ids, ws, (a, b, NO_BIAS), out)
        }
    }
}

/// Runs a union graph's `plan` writing `out`, with `a`, `b` and (for a fused forward) the bias
/// bound to the graph's tensors `ids.a`, `ids.b` and `ids.c`.
pub(crate) fn exec_graph<'a, TA: DataType, TB: DataType, TC: DataType, TO: DataType>(
    cudnn: &'a Cudnn,
    plan: &Plan,
    ids: Ids,
    ws: &mut Workspace,
    (a, b, bias): (
        &'a impl DeviceBuffer<TA>,
        &'a impl DeviceBuffer<TB>,
        Option<&'a impl DeviceBuffer<TC>>,
    ),
    out: &'a mut impl DeviceBufferMut<TO>,
) -> Result<()> {
    let mut args = Args::new(cudnn);
    args.input(ids.a, a)?.input(ids.b, b)?;
    if let (Some(c), Some(bias)) = (ids.c, bias) {
        args.input(c, bias)?;
    }
    args.output(ids.out, out)?;
    cudnn.execute(plan, &args, ws)
}

/// The bias of the union graphs that have none.
const NO_BIAS: Option<&cudarc::driver::CudaSlice<f32>> = None;

impl<X: DataType, Y: DataType<Scalar = X::Scalar>> UnionGraph for ConvForward<'_, X, Y> {
    fn eligible(&self) -> bool {
        gunion::eligible::<X, Y>(self.x().dims(), self.w(), self.conv(), self.y().dims())
    }
    fn graph(&self, cudnn: &Cudnn) -> Result<ConvGraph> {
        gunion::fprop_graph(cudnn, self.x(), self.w(), self.conv(), self.y(), None)
    }
    fn out_tensor(&self) -> Result<TensorDesc<Y>> {
        TensorDesc::strided(self.y().dims(), self.y().layout().strides())
    }
}

impl<T: DataType> UnionGraph for ConvBackwardData<'_, T> {
    const SWAP: bool = true;
    fn eligible(&self) -> bool {
        gunion::eligible::<T, T>(self.dx().dims(), self.w(), self.conv(), self.dy().dims())
    }
    fn graph(&self, cudnn: &Cudnn) -> Result<ConvGraph> {
        gunion::dgrad_graph(cudnn, self.w(), self.dy(), self.conv(), self.dx())
    }
    fn out_tensor(&self) -> Result<TensorDesc<T>> {
        TensorDesc::strided(self.dx().dims(), self.dx().layout().strides())
    }
}

impl<T: DataType> UnionGraph for ConvBackwardFilter<'_, T> {
    fn eligible(&self) -> bool {
        gunion::eligible::<T, T>(self.x().dims(), self.dw(), self.conv(), self.dy().dims())
    }
    fn graph(&self, cudnn: &Cudnn) -> Result<ConvGraph> {
        gunion::wgrad_graph(cudnn, self.x(), self.dy(), self.conv(), self.dw())
    }
    fn out_tensor(&self) -> Result<TensorDesc<T>> {
        TensorDesc::strided(self.dw().dims(), self.dw().layout().strides())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::ConvDesc;
    use crate::tensor::{FilterDesc, TensorDesc, TensorFormat};

    /// The directions answer as the tuner's former per-direction calls did: f32 packed NCHW in 2-D
    /// is a graph problem, f64 is not; only backward data binds its inputs swapped.
    #[test]
    fn eligibility_and_binding_order_per_direction() {
        let Some(()) = crate::checks::lib_or_skip() else {
            return;
        };
        fn check<T: DataType>(want: bool) {
            let conv = ConvDesc::builder(2).pads(&[1, 1]).build::<T>().unwrap();
            let x = TensorDesc::<T>::nchw(2, 8, 9, 9).unwrap();
            let w = FilterDesc::<T>::new(&[16, 8, 3, 3], TensorFormat::Nchw).unwrap();
            let y =
                TensorDesc::<T>::nchw_nd(&conv.output_dims(x.dims(), w.dims()).unwrap()).unwrap();
            let fwd = ConvForward::new(&conv, &x, &w, &y).unwrap();
            let bd = ConvBackwardData::new(&conv, &w, &y, &x).unwrap();
            let bf = ConvBackwardFilter::new(&conv, &x, &y, &w).unwrap();
            assert_eq!(
                [fwd.eligible(), bd.eligible(), bf.eligible()],
                [want; 3],
                "{}",
                T::DTYPE
            );
        }
        check::<f32>(true);
        check::<f64>(false);
        let swaps = [
            <ConvForward<'_, f32> as UnionGraph>::SWAP,
            <ConvBackwardData<'_, f32> as UnionGraph>::SWAP,
            <ConvBackwardFilter<'_, f32> as UnionGraph>::SWAP,
        ];
        assert_eq!(swaps, [false, true, false]);
    }
}
