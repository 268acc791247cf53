//! The transposed convolution (PyTorch's `conv_transpose1d/2d/3d`) on top of cuDNN's
//! backward-data pass, for every output padding PyTorch accepts.
//!
//! # The mapping, per spatial dimension
//!
//! With input size `n`, kernel `k`, stride `s`, dilation `d`, padding `p` and output padding
//! `op` (`0 ≤ op < max(s, d)`), the transposed convolution scatters
//! `y[j·s − p + t·d] += x[j]·w[t]` for `j < n`, `t < k`, keeping the positions in
//! `0..O`, `O = (n − 1)·s − 2p + d·(k − 1) + 1 + op`.
//!
//! cuDNN's backward data computes the same sums, `dx[i] = Σ_{j·s − p + t·d = i} dy[j]·w[t]`,
//! but only for a `dx` of extent `L` whose forward convolution has `dy`'s extent:
//! `⌊(L + 2p − d·(k − 1) − 1) / s⌋ + 1 = n`, i.e. `L = O − op + e` for some `0 ≤ e < s`.
//!
//! * `op < s`: `L = O`, backward data writes `y` itself ([`Route::Direct`]).
//! * `op ≥ s` (so `s < op < d` or `op = s < d`): take `e = s − 1`; backward data computes the
//!   exact sums of the leading `L = O − op + s − 1` positions. The last position any term
//!   reaches is `(n − 1)·s − p + (k − 1)·d = O − 1 − op + p`, so the positions from `L` on
//!   receive nothing when `p ≤ s − 1`: backward data runs into the leading sub-tensor of `y`
//!   (y's strides, extent `L`; [`Route::Leading`]) and the rest of `y` is `beta·y`.
//! * `op ≥ s` and `p ≥ s`: some positions from `L` on do receive terms. Backward data then runs
//!   with padding `p − q` into scratch memory whose position `i` is `y`'s `i − q`, with
//!   `q = min(op, p) − s + 1` (`0 < q ≤ p`): the relation now admits an extent of
//!   `L' = O + q − 1 − op + min(1 + op, s + q)`, which covers `y` up to `min(O, O − op + p)`,
//!   past its last reached position; the covered part is copied to `y` (`alpha` applied by
//!   backward data, `beta·y` by the copy; [`Route::Scratch`]) and the rest of `y` is `beta·y`.
//!
//! In general `q = max(0, min(op, p) − s + 1)` per dimension (0 in the first two cases), and a
//! dimension where no position of `y` receives a term makes the whole output `beta·y`
//! ([`Route::Nothing`]). A sub-tensor of `y` is not packed; it is used only when `y` is packed
//! channels-first (NCHW), the layout in which cuDNN documents backward-data outputs of any
//! strides; otherwise the second case also runs through packed scratch memory, with `q = 0`. `tests::split_matches_the_scatter_definition` checks the mapping
//! against the scatter sum over every small case.
use cudarc::driver::{CudaSlice, CudaView};

use super::{AlgoPerf, ConvBackwardData, ConvBwdDataAlgo, ConvDesc, ConvOp};
use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::{DataType, Scalar};
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::tensor::{FilterDesc, TensorDesc, TensorFormat};
use crate::workspace::Workspace;

/// How one spatial dimension of a transposed convolution maps onto a backward-data pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Split {
    /// `y`'s extent: the transposed convolution's output size `O`.
    pub(crate) out: i64,
    /// Positions of the backward-data output before `y`'s first (`q`; 0 unless scratch).
    pub(crate) shift: i64,
    /// The backward-data convolution's padding, `p − q`.
    pub(crate) pad: i64,
    /// The backward-data output's extent.
    pub(crate) extent: i64,
    /// Leading positions of `y` the backward-data output covers; the positions after them
    /// receive no term. 0 when no position of `y` receives one.
    pub(crate) covered: i64,
}

/// The mapping of one spatial dimension (see the [module documentation](self)): input size,
/// kernel, stride, dilation, padding and output padding (`0 ≤ op < max(s, d)`, checked by the
/// caller).
pub(crate) fn split(n: i64, k: i64, s: i64, d: i64, p: i64, op: i64) -> Split {
    let base = (n - 1) * s - 2 * p + d * (k - 1) + 1;
    let out = base + op;
    let q = (op.min(p) - s + 1).max(0);
    let pad = p - q;
    // The largest extent the forward relation admits with padding p − q, without reaching past
    // y's end: output padding min(op − q, s − 1) on top of the base with that padding.
    let extent = (n - 1) * s - 2 * pad + d * (k - 1) + 1 + (op - q).min(s - 1);
    let covered = out.min(extent - q).max(0);
    Split {
        out,
        shift: q,
        pad,
        extent,
        covered,
    }
}

/// `[N, C, W]` → `[N, C, 1, W]`: a 1-D problem's dims in the form cuDNN sees.
fn with_unit_height(d: &[i64]) -> Vec<i64> {
    let mut d = d.to_vec();
    d.insert(2, 1);
    d
}

/// How the backward-data pass of a [`TransposePlan`] writes `y`.
pub(crate) enum Route<T: DataType> {
    /// `op < stride` in every dimension: backward data into `y` with the caller's descriptors.
    Direct,
    /// Backward data into the leading sub-tensor `dx` of `y` (y's strides, smaller extents).
    Leading {
        /// The sub-tensor.
        dx: TensorDesc<T>,
    },
    /// Backward data into packed scratch memory, part of which is then copied to `y`.
    Scratch(Box<Scratch<T>>),
    /// No element of `y` receives a term: `y = beta·y`.
    Nothing,
}

/// The backward-data pass of [`Route::Scratch`]: the re-padded `conv` writes packed scratch
/// memory `dx`, of which the view `src` (starting at element `offset`) is copied to `y`'s
/// leading sub-tensor `dst`.
pub(crate) struct Scratch<T: DataType> {
    conv: ConvDesc,
    dx: TensorDesc<T>,
    offset: usize,
    src: TensorDesc<T>,
    dst: TensorDesc<T>,
}

/// A region of `y` that receives no term: `y = beta·y` there.
pub(crate) struct Rest<T: DataType> {
    /// Element offset of its first element in `y`.
    offset: usize,
    /// Its elements.
    count: usize,
    /// Its layout in `y` (y's strides).
    desc: TensorDesc<T>,
    /// The same dimensions packed: the zeros `y = 0 + beta·y` is computed from.
    packed: TensorDesc<T>,
}

/// A checked transposed convolution `y = alpha·conv_transpose(x, w) + beta·y` as one
/// backward-data pass ([`Route`]) plus the regions of `y` that receive no term (`rest`).
pub(crate) struct TransposePlan<T: DataType> {
    route: Route<T>,
    rest: Vec<Rest<T>>,
}

/// The device memory a [`TransposePlan`] needs besides `y`, allocated before its first launch.
pub(crate) struct TransposeMemory<T: DataType> {
    /// The backward-data output of [`Route::Scratch`].
    pub(crate) scratch: Option<CudaSlice<T>>,
    /// Zeros for `y = 0 + beta·y` on the rest, when `beta` is neither 0 nor 1.
    zeros: Option<CudaSlice<T>>,
}

impl<T: DataType> TransposePlan<T> {
    /// Checks the data type and shapes (errors name `x`, `w` and `y`) and maps the call onto
    /// backward data. Creates descriptors only when some output padding reaches the stride.
    pub(crate) fn new(
        x_desc: &TensorDesc<T>,
        w_desc: &FilterDesc<T>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<T>,
    ) -> Result<Self> {
        conv.check_backward_types("transposed convolution", T::DTYPE)?;
        let op = conv.transpose_output_padding(x_desc.dims(), w_desc.dims(), y_desc.dims())?;
        // A 1-D problem on 3-D tensors is planned in the 4-D form cuDNN sees (a unit height at
        // index 2, `Layout::legacy_view`); the descriptors built below drop it again (`flat`),
        // so that they have the caller's rank.
        let unit = y_desc.dims().len() == 3;
        let flat = |d: &[i64]| -> Vec<i64> {
            let mut d = d.to_vec();
            if unit {
                d.remove(2);
            }
            d
        };
        let given = [x_desc.dims(), w_desc.dims(), y_desc.dims()];
        let dims4 = unit.then(|| given.map(with_unit_height));
        let [xd, wd, yd]: [&[i64]; 3] = match &dims4 {
            Some([x4, w4, y4]) => [x4, w4, y4],
            None => given,
        };
        let splits: Vec<Split> = (0..op.len())
            .map(|i| {
                split(
                    xd[2 + i],
                    wd[2 + i],
                    conv.strides()[i],
                    conv.dilations()[i],
                    conv.pads()[i],
                    op[i],
                )
            })
            .collect();
        debug_assert!(splits.iter().zip(&yd[2..]).all(|(s, &o)| s.out == o));
        let direct = splits.iter().all(|s| s.shift == 0 && s.covered == s.out);
        if direct {
            return Ok(TransposePlan {
                route: Route::Direct,
                rest: Vec::new(),
            });
        }
        if splits.iter().any(|s| s.covered == 0) {
            let (yd, y_strides) = (y_desc.dims(), y_desc.layout().strides());
            return Ok(TransposePlan {
                route: Route::Nothing,
                rest: vec![Rest {
                    offset: 0,
                    count: yd.iter().product::<i64>() as usize,
                    packed: TensorDesc::nchw_nd(yd)?,
                    desc: TensorDesc::strided(yd, y_strides)?,
                }],
            });
        }
        // y's strides in the planned (4-D for 3-D y) form, for offsets, and as given, for the
        // descriptors.
        let y_view = y_desc.layout().legacy_view();
        let (y_strides, y_given) = (y_view.strides(), y_desc.layout().strides());
        let with = |f: &dyn Fn(&Split) -> i64| -> Vec<i64> {
            yd[..2]
                .iter()
                .copied()
                .chain(splits.iter().map(f))
                .collect()
        };
        let covered = with(&|s| s.covered);
        // A sub-tensor of y is not packed; cuDNN's backward-data algorithms take such an output
        // in channels-first layouts (the implicit-GEMM ones at least), so other layouts go
        // through packed scratch memory in y's own format.
        let channels_first = y_desc.layout().format() == TensorFormat::Nchw;
        let route = if channels_first && splits.iter().all(|s| s.shift == 0) {
            // covered == extent here: the sub-tensor is the whole backward-data output.
            Route::Leading {
                dx: TensorDesc::strided(&flat(&covered), y_given)?,
            }
        } else {
            let pads: Vec<i64> = splits.iter().map(|s| s.pad).collect();
            let extent = with(&|s| s.extent);
            let dx = if y_desc.layout().format() == TensorFormat::Nhwc {
                TensorDesc::<T>::nhwc_nd(&flat(&extent))?
            } else {
                TensorDesc::<T>::nchw_nd(&flat(&extent))?
            };
            let s_strides = dx.layout().legacy_view().strides().to_vec();
            let offset: i64 = splits
                .iter()
                .zip(&s_strides[2..])
                .map(|(s, st)| s.shift * st)
                .sum();
            Route::Scratch(Box::new(Scratch {
                conv: conv.with_pads(&pads)?,
                src: TensorDesc::strided(&flat(&covered), dx.layout().strides())?,
                dst: TensorDesc::strided(&flat(&covered), y_given)?,
                offset: offset as usize,
                dx,
            }))
        };
        // The positions past the covered ones, as disjoint boxes: in box i, the dimensions
        // before i are covered, dimension i is past, the ones after are whole.
        let mut rest = Vec::new();
        for (i, s) in splits.iter().enumerate() {
            if s.covered == s.out {
                continue;
            }
            let mut dims = yd.to_vec();
            for (j, t) in splits.iter().enumerate().take(i) {
                dims[2 + j] = t.covered;
            }
            dims[2 + i] = s.out - s.covered;
            rest.push(Rest {
                offset: (s.covered * y_strides[2 + i]) as usize,
                count: dims.iter().product::<i64>() as usize,
                packed: TensorDesc::nchw_nd(&flat(&dims))?,
                desc: TensorDesc::strided(&flat(&dims), y_given)?,
            });
        }
        Ok(TransposePlan { route, rest })
    }

    /// The backward-data problem `(conv, dx)` (dy is `x`), or `None` when nothing runs.
    pub(crate) fn backward<'a>(
        &'a self,
        conv: &'a ConvDesc,
        y_desc: &'a TensorDesc<T>,
    ) -> Option<(&'a ConvDesc, &'a TensorDesc<T>)> {
        match &self.route {
            Route::Direct => Some((conv, y_desc)),
            Route::Leading { dx } => Some((conv, dx)),
            Route::Scratch(s) => Some((&s.conv, &s.dx)),
            Route::Nothing => None,
        }
    }

    /// The memory the launches need besides `y` (none on the common paths), allocated now so
    /// that a failure refuses the call before anything is enqueued. Zeroed: the scratch output
    /// is overwritten by backward data, the zeros are read.
    pub(crate) fn memory(&self, cudnn: &Cudnn, beta: T::Scalar) -> Result<TransposeMemory<T>> {
        let alloc = |len: usize| {
            cudnn
                .stream()
                .alloc_zeros::<T>(len)
                .map_err(|e| Error::driver("allocating transposed-convolution scratch", e))
        };
        let scratch = match &self.route {
            Route::Scratch(s) => Some(alloc(s.dx.span())?),
            _ => None,
        };
        let b = beta.to_f64();
        let zeros = match self.rest.iter().map(|r| r.count).max() {
            Some(n) if b != 0.0 && b != 1.0 => Some(alloc(n)?),
            _ => None,
        };
        Ok(TransposeMemory { scratch, zeros })
    }

    /// After backward data ran (into `mem.scratch` with alpha applied and beta 0 on
    /// [`Route::Scratch`], else into `y`): `y = scratch + beta·y` on the covered region
    /// ([`Route::Scratch`] only), then `y = beta·y` on the rest.
    pub(crate) fn finish(
        &self,
        cudnn: &Cudnn,
        mem: &TransposeMemory<T>,
        beta: T::Scalar,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let one = T::Scalar::from_f64(1.0);
        if let (Route::Scratch(r), Some(s)) = (&self.route, &mem.scratch) {
            let view: CudaView<'_, T> = s.slice(r.offset..);
            cudnn.transform_tensor(one, &r.src, &view, beta, &r.dst, y)?;
        }
        let b = beta.to_f64();
        if b == 1.0 {
            return Ok(());
        }
        for r in &self.rest {
            let mut whole = y.view_mut();
            let mut part = whole.slice_mut(r.offset..);
            match &mem.zeros {
                // y = 0 + beta·y through the transform, which every data type supports.
                Some(z) if b != 0.0 => {
                    cudnn.transform_tensor(one, &r.packed, z, beta, &r.desc, &mut part)?
                }
                // Set, not scaled: y may hold NaN where beta = 0 promises it is not read.
                _ => cudnn.set_tensor(&r.desc, &mut part, T::from_f64(0.0))?,
            }
        }
        Ok(())
    }
}

/// Transposed convolution (a "deconvolution" / up-sampling layer, PyTorch's
/// `conv_transpose1d/2d/3d`) as a value: `y = alpha·conv_transpose(x, w) + beta·y`, computed by
/// one cuDNN backward-data pass ([`backward_data`](Self::backward_data)) plus, when an output
/// padding reaches the stride, a copy and a scaling of the positions that pass cannot address
/// (see [`Cudnn::conv_transpose`] for the shapes and routes). Launch inputs are `(x, w)`, the
/// output `y`; errors name them so.
pub struct ConvTranspose<'a, T: DataType> {
    conv: &'a ConvDesc,
    x: &'a TensorDesc<T>,
    w: &'a FilterDesc<T>,
    y: &'a TensorDesc<T>,
    plan: TransposePlan<T>,
}

impl<T: DataType> std::fmt::Debug for ConvTranspose<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvTranspose")
            .field("conv", self.conv)
            .field("x", self.x)
            .field("w", self.w)
            .field("y", self.y)
            .finish_non_exhaustive()
    }
}

impl<'a, T: DataType> ConvTranspose<'a, T> {
    /// Checks the data type and `y` against the dimensions
    /// [`ConvDesc::transpose_output_dims`] accepts (errors name `x`, `w` and `y`) and maps the
    /// call onto backward data. Creates descriptors only when some output padding reaches the
    /// stride.
    pub fn new(
        conv: &'a ConvDesc,
        x: &'a TensorDesc<T>,
        w: &'a FilterDesc<T>,
        y: &'a TensorDesc<T>,
    ) -> Result<Self> {
        let plan = TransposePlan::new(x, w, conv, y)?;
        Ok(ConvTranspose {
            conv,
            x,
            w,
            y,
            plan,
        })
    }

    /// The backward-data pass the launch runs (`dy` = `x`; `dx` = `y`, its leading part or
    /// scratch memory), or `None` when no element of `y` receives a term. Its algorithms are the
    /// ones [`launch`](Self::launch) takes.
    pub fn backward_data(&self) -> Option<ConvBackwardData<'_, T>> {
        let (conv, dx) = self.plan.backward(self.conv, self.y)?;
        // The plan built `conv` and `dx` so that dy = x is their forward output (checked by
        // `tests::split_matches_the_scatter_definition`), and checked the data type.
        debug_assert!(ConvBackwardData::new(conv, self.w, self.x, dx).is_ok());
        Some(ConvBackwardData::planned(conv, self.w, self.x, dx))
    }

    /// Workspace bytes `algo` needs (the query of [`backward_data`](Self::backward_data)'s pass;
    /// 0 when nothing runs). An algorithm that does not support the case returns cuDNN's error.
    pub fn workspace_size(&self, cudnn: &Cudnn, algo: ConvBwdDataAlgo) -> Result<usize> {
        match self.backward_data() {
            Some(op) => op.workspace_size(cudnn, algo),
            None => Ok(0),
        }
    }

    /// cuDNN's heuristic ranking of the backward-data algorithms for the pass, best first
    /// (empty when no element of `y` receives a term).
    pub fn heuristics(&self, cudnn: &Cudnn) -> Result<Vec<AlgoPerf<ConvBwdDataAlgo>>> {
        match self.backward_data() {
            Some(op) => op.heuristics(cudnn),
            None => Ok(Vec::new()),
        }
    }

    /// [`TransposePlan::memory`]: what the launch needs besides `y`, allocated before the
    /// first launch so that a failure leaves `y` untouched.
    pub(crate) fn memory(&self, cudnn: &Cudnn, beta: T::Scalar) -> Result<TransposeMemory<T>> {
        self.plan.memory(cudnn, beta)
    }

    /// [`TransposePlan::finish`]: after the backward-data pass, the copy from scratch memory
    /// and `y = beta·y` where no term lands.
    pub(crate) fn finish(
        &self,
        cudnn: &Cudnn,
        mem: &TransposeMemory<T>,
        beta: T::Scalar,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.plan.finish(cudnn, mem, beta, y)
    }

    /// Checks the buffers under the transposed convolution's names.
    pub(crate) fn check_buffers(
        &self,
        cudnn: &Cudnn,
        x: &impl DeviceBuffer<T>,
        w: &impl DeviceBuffer<T>,
        y: &impl DeviceBuffer<T>,
    ) -> Result<()> {
        cudnn.check_tensor("x", self.x.layout(), x, false)?;
        cudnn.check_buffer("w", w, self.w.span())?;
        cudnn.check_tensor("y", self.y.layout(), y, true)
    }

    /// `y = alpha·conv_transpose(x, w) + beta·y` with the backward-data algorithm `algo`. Every
    /// check (buffers, the algorithm's workspace, the memory beside `y`) runs before the first
    /// launch, so a refused call leaves `y` untouched.
    #[doc(alias = "cudnnConvolutionBackwardData")]
    pub fn launch(
        &self,
        cudnn: &Cudnn,
        algo: ConvBwdDataAlgo,
        (alpha, beta): (T::Scalar, T::Scalar),
        (x, w): (&impl DeviceBuffer<T>, &impl DeviceBuffer<T>),
        workspace: &mut Workspace,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        self.check_buffers(cudnn, x, w, y)?;
        cudnn.check_workspace_context(workspace)?;
        let backward = self.backward_data();
        if let Some(op) = &backward {
            workspace.prepare(op.workspace_size(cudnn, algo)?)?;
        }
        let mut mem = self.memory(cudnn, beta)?;
        if let Some(op) = &backward {
            match &mut mem.scratch {
                Some(s) => {
                    let zero = T::Scalar::from_f64(0.0);
                    op.launch(cudnn, algo, (alpha, zero), (w, x), workspace, s)?
                }
                None => op.launch(cudnn, algo, (alpha, beta), (w, x), workspace, y)?,
            }
        }
        self.finish(cudnn, &mem, beta, y)
    }
}

impl Cudnn {
    /// Workspace bytes `algo` needs for this transposed convolution:
    /// [`ConvTranspose::workspace_size`] (0 when no element of `y` receives a term). An
    /// algorithm that does not support the case returns cuDNN's error.
    #[doc(alias = "cudnnGetConvolutionBackwardDataWorkspaceSize")]
    pub fn conv_transpose_workspace_size<T: DataType>(
        &self,
        x_desc: &TensorDesc<T>,
        w_desc: &FilterDesc<T>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<T>,
        algo: ConvBwdDataAlgo,
    ) -> Result<usize> {
        ConvTranspose::new(conv, x_desc, w_desc, y_desc)?.workspace_size(self, algo)
    }

    /// cuDNN's heuristic ranking of the backward-data algorithms for the pass
    /// [`conv_transpose`](Self::conv_transpose) runs, best first (empty when no element of `y`
    /// receives a term): [`ConvTranspose::heuristics`].
    #[doc(alias = "cudnnGetConvolutionBackwardDataAlgorithm_v7")]
    pub fn conv_transpose_heuristics<T: DataType>(
        &self,
        x_desc: &TensorDesc<T>,
        w_desc: &FilterDesc<T>,
        conv: &ConvDesc,
        y_desc: &TensorDesc<T>,
    ) -> Result<Vec<AlgoPerf<ConvBwdDataAlgo>>> {
        ConvTranspose::new(conv, x_desc, w_desc, y_desc)?.heuristics(self)
    }

    /// Transposed convolution (a "deconvolution" / up-sampling layer, PyTorch's
    /// `conv_transpose1d/2d/3d`): `y = alpha·conv_transpose(x, w) + beta·y`, computed by cuDNN's
    /// backward-data pass with `algo`.
    ///
    /// `x` is `[N, K, in...]`, `w` is `[K, C/groups, k...]`, and `y` is `[N, C, out...]` with
    /// `out = (in − 1)·stride − 2·pad + dilation·(k − 1) + 1 + output_padding` for some
    /// `0 ≤ output_padding < max(stride, dilation)` per spatial dimension: exactly the
    /// dimensions [`ConvDesc::transpose_output_dims`] returns, every case PyTorch accepts. A 1-D
    /// convolution takes 3-D `[N, K, W]`, `[K, C/groups, S]`, `[N, C, out]` (PyTorch's
    /// `conv_transpose1d` shapes) or the same with a unit height at index 2, the form cuDNN runs
    /// either way; the results are the same.
    /// Errors name the arguments as given here (`x`, `w`, `y`); every check runs before
    /// anything is enqueued, so a refused call leaves `y` untouched.
    ///
    /// When an output padding is at least the stride (possible with a dilation above the
    /// stride), backward data cannot address `y`'s trailing positions: they receive no term and
    /// get `beta·y` unless the padding is also at least the stride. Backward data then runs into
    /// the leading part of `y` when `y` is packed NCHW and no trailing position receives a term,
    /// else into scratch memory allocated on the handle's stream for the call, whose result is
    /// added to `y`. [`conv_transpose_workspace_size`](Self::conv_transpose_workspace_size) and
    /// [`conv_transpose_heuristics`](Self::conv_transpose_heuristics) answer for that pass
    /// ([`ConvTranspose`] is the same call as a value);
    /// [`crate::Autotuner::conv_transpose`] chooses the algorithm.
    ///
    /// ```no_run
    /// use cudnn_safe::{conv::{ConvBwdDataAlgo, ConvDesc}, cuda_context, Cudnn, FilterDesc,
    ///                  TensorDesc, TensorFormat, Workspace};
    /// # fn main() -> cudnn_safe::Result<()> {
    /// let ctx = cuda_context(0)?;
    /// let stream = ctx.default_stream();
    /// let cudnn = Cudnn::new(stream.clone())?;
    /// // 2× up-sampling, 3×3 kernel, stride 2, padding 1, output padding 1: 16×16 → 32×32
    /// let conv = ConvDesc::builder(2).pads(&[1, 1]).strides(&[2, 2]).build::<f32>()?;
    /// let x_d = TensorDesc::<f32>::nchw(1, 8, 16, 16)?;
    /// let w_d = FilterDesc::<f32>::new(&[8, 4, 3, 3], TensorFormat::Nchw)?;
    /// let y_dims = conv.transpose_output_dims(x_d.dims(), w_d.dims(), &[1, 1])?;
    /// assert_eq!(y_dims, [1, 4, 32, 32]);
    /// let y_d = TensorDesc::<f32>::nchw_nd(&y_dims)?;
    /// let x = stream.clone_htod(&vec![1.0f32; x_d.span()]).unwrap();
    /// let w = stream.clone_htod(&vec![0.5f32; w_d.span()]).unwrap();
    /// let mut y = stream.alloc_zeros::<f32>(y_d.span()).unwrap();
    /// let mut ws = Workspace::new(stream.clone());
    /// cudnn.conv_transpose(1.0, &x_d, &x, &w_d, &w, &conv, ConvBwdDataAlgo::Algo1, &mut ws,
    ///                      0.0, &y_d, &mut y)?;
    /// # Ok(()) }
    /// ```
    #[doc(alias = "cudnnConvolutionBackwardData")]
    #[allow(clippy::too_many_arguments)] // mirrors the C call
    pub fn conv_transpose<T: DataType>(
        &self,
        alpha: T::Scalar,
        x_desc: &TensorDesc<T>,
        x: &impl DeviceBuffer<T>,
        w_desc: &FilterDesc<T>,
        w: &impl DeviceBuffer<T>,
        conv: &ConvDesc,
        algo: ConvBwdDataAlgo,
        workspace: &mut Workspace,
        beta: T::Scalar,
        y_desc: &TensorDesc<T>,
        y: &mut impl DeviceBufferMut<T>,
    ) -> Result<()> {
        let op = ConvTranspose::new(conv, x_desc, w_desc, y_desc)?;
        op.launch(self, algo, (alpha, beta), (x, w), workspace, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `y = alpha·scatter(x, w) + beta·old` from the definition, in 1-D.
    #[allow(clippy::too_many_arguments)]
    fn scatter(
        x: &[f64],
        w: &[f64],
        (s, d, p, op): (i64, i64, i64, i64),
        alpha: f64,
        beta: f64,
        old: &[f64],
    ) -> Vec<f64> {
        let (n, k) = (x.len() as i64, w.len() as i64);
        let out = (n - 1) * s - 2 * p + d * (k - 1) + 1 + op;
        let mut y = vec![0.0; out as usize];
        for j in 0..n {
            for t in 0..k {
                let i = j * s - p + t * d;
                if (0..out).contains(&i) {
                    y[i as usize] += x[j as usize] * w[t as usize];
                }
            }
        }
        y.iter()
            .zip(old)
            .map(|(v, o)| alpha * v + beta * o)
            .collect()
    }

    /// cuDNN's backward data in 1-D, refusing (None) an extent the forward relation rejects.
    fn backward_data(
        dy: &[f64],
        w: &[f64],
        (s, d, p): (i64, i64, i64),
        extent: i64,
    ) -> Option<Vec<f64>> {
        let (n, k) = (dy.len() as i64, w.len() as i64);
        let span = d * (k - 1) + 1;
        if extent < 1 || extent + 2 * p < span || (extent + 2 * p - span) / s + 1 != n {
            return None;
        }
        let mut dx = vec![0.0; extent as usize];
        for (i, v) in dx.iter_mut().enumerate() {
            for j in 0..n {
                for t in 0..k {
                    if j * s - p + t * d == i as i64 {
                        *v += dy[j as usize] * w[t as usize];
                    }
                }
            }
        }
        Some(dx)
    }

    /// Every small case PyTorch accepts: the split's backward-data pass plus `beta·y` on the
    /// rest gives the scatter definition's result exactly (values are small integers).
    #[test]
    fn split_matches_the_scatter_definition() {
        let mut cases = 0;
        let mut by_route = [0usize; 4];
        for n in 1..=5i64 {
            for k in 1..=4i64 {
                for s in 1..=4i64 {
                    for d in 1..=4i64 {
                        for p in 0..=7i64 {
                            for op in 0..s.max(d) {
                                let out = (n - 1) * s - 2 * p + d * (k - 1) + 1 + op;
                                if out < 1 {
                                    continue;
                                }
                                let x: Vec<f64> = (0..n).map(|j| (j * 7 % 5 + 1) as f64).collect();
                                let w: Vec<f64> = (0..k).map(|t| (t * 3 % 4 + 2) as f64).collect();
                                let old: Vec<f64> =
                                    (0..out).map(|i| (i % 3) as f64 - 5.0).collect();
                                let (alpha, beta) = (2.0, -3.0);
                                let want = scatter(&x, &w, (s, d, p, op), alpha, beta, &old);
                                let sp = split(n, k, s, d, p, op);
                                assert_eq!(sp.out, out);
                                let what = format!("n {n} k {k} s {s} d {d} p {p} op {op}: {sp:?}");
                                let mut got: Vec<f64> = old.iter().map(|o| beta * o).collect();
                                let route = if sp.covered == 0 {
                                    3
                                } else {
                                    let dx = backward_data(&x, &w, (s, d, sp.pad), sp.extent)
                                        .unwrap_or_else(|| panic!("{what}: extent refused"));
                                    assert!(sp.shift + sp.covered <= sp.extent, "{what}");
                                    for i in 0..sp.covered as usize {
                                        got[i] += alpha * dx[i + sp.shift as usize];
                                    }
                                    if sp.shift > 0 {
                                        2
                                    } else if sp.covered < out {
                                        assert_eq!(sp.covered, sp.extent, "{what}");
                                        1
                                    } else {
                                        assert_eq!(sp.extent, out, "{what}");
                                        0
                                    }
                                };
                                assert_eq!(got, want, "{what}");
                                if op < s {
                                    assert_eq!((route, sp.pad), (0, p), "{what}: op < stride");
                                }
                                by_route[route] += 1;
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
        // Every route is exercised.
        assert!(by_route.iter().all(|&c| c > 0), "{by_route:?}");
        assert!(cases > 1000, "{cases}");
    }

    /// The plan accepts exactly the output dimensions `transpose_output_dims` returns, and its
    /// rest boxes and covered region partition `y`.
    #[test]
    fn plan_agrees_with_transpose_output_dims() {
        let Some(()) = crate::checks::lib_or_skip() else {
            return;
        };
        let mut checked = 0;
        let mut routes = [0usize; 4];
        // (declared spatial dimensions, spatial dimensions of the tensors): a 1-D convolution
        // on 3-D tensors and in its 4-D form.
        for (spatial, sp) in [(1usize, 1usize), (1, 2), (2, 2), (3, 3)] {
            for (s, d, p, k, n) in [
                (1, 2, 1, 3, 4),
                (1, 3, 2, 2, 3),
                (2, 3, 0, 3, 2),
                (2, 3, 3, 2, 4),
                (1, 1, 0, 1, 1),
                (3, 2, 1, 3, 2),
                (2, 3, 1, 1, 1),
            ] {
                let conv = ConvDesc::builder(spatial)
                    .strides(&vec![s; spatial])
                    .dilations(&vec![d; spatial])
                    .pads(&vec![p; spatial])
                    .groups(2)
                    .build::<f32>()
                    .unwrap();
                let mut xd = vec![2, 4];
                let mut wd = vec![4, 3];
                for i in 0..sp {
                    let unit = spatial == 1 && sp == 2 && i == 0;
                    xd.push(if unit { 1 } else { n + i as i64 });
                    wd.push(if unit { 1 } else { k });
                }
                let x_d = TensorDesc::<f32>::nchw_nd(&xd).unwrap();
                let w_d = FilterDesc::<f32>::new(&wd, TensorFormat::Nchw).unwrap();
                for op in -1..=s.max(d) {
                    let ops = vec![op; spatial];
                    let dims = conv.transpose_output_dims(&xd, &wd, &ops);
                    let valid = (0..s.max(d)).contains(&op);
                    if !valid {
                        assert!(
                            matches!(dims, Err(Error::InvalidArgument { .. })),
                            "{dims:?}"
                        );
                    }
                    // y candidates: the accepted dims, and each spatial size ± 1 around them.
                    let mut base = xd.clone();
                    base[1] = 6;
                    for i in 0..sp {
                        let unit = spatial == 1 && sp == 2 && i == 0;
                        base[2 + i] = if unit {
                            1
                        } else {
                            (xd[2 + i] - 1) * s - 2 * p + d * (k - 1) + 1 + op
                        };
                    }
                    if base.iter().any(|&v| v < 1) {
                        assert!(dims.is_err(), "{base:?}: {dims:?}");
                        continue;
                    }
                    let y_d = if (op + spatial as i64) % 2 == 0 {
                        TensorDesc::<f32>::nchw_nd(&base).unwrap()
                    } else {
                        TensorDesc::<f32>::nhwc_nd(&base).unwrap()
                    };
                    let plan = TransposePlan::new(&x_d, &w_d, &conv, &y_d);
                    assert_eq!(plan.is_ok(), dims.is_ok(), "{base:?}: {dims:?}");
                    if let Ok(dims) = &dims {
                        assert_eq!(dims, &base);
                        let plan = plan.unwrap();
                        // Every element of y is in exactly one of the covered region and the
                        // rest boxes.
                        let y_lay = y_d.layout();
                        let mut hits = vec![0u32; y_d.span()];
                        let mut mark = |offset: usize, lay: &crate::Layout| {
                            for o in lay.offsets() {
                                hits[offset + o as usize] += 1;
                            }
                        };
                        routes[match &plan.route {
                            Route::Direct => 0,
                            Route::Leading { .. } => 1,
                            Route::Scratch(_) => 2,
                            Route::Nothing => 3,
                        }] += 1;
                        match &plan.route {
                            Route::Direct => mark(0, y_lay),
                            Route::Leading { dx } => mark(0, dx.layout()),
                            Route::Scratch(r) => {
                                assert!(r.offset + r.src.span() <= r.dx.span());
                                mark(0, r.dst.layout());
                            }
                            Route::Nothing => {}
                        }
                        for r in &plan.rest {
                            assert_eq!(r.count, r.desc.layout().element_count());
                            assert_eq!(r.packed.dims(), r.desc.dims());
                            mark(r.offset, r.desc.layout());
                        }
                        for o in y_lay.offsets() {
                            assert_eq!(hits[o as usize], 1, "{base:?} element at {o}");
                        }
                        checked += 1;
                    }
                    if !valid {
                        continue;
                    }
                    // A y no output padding gives is refused, naming y.
                    let mut off = base.clone();
                    off[sp + 1] += s.max(d);
                    let y_bad = TensorDesc::<f32>::nchw_nd(&off).unwrap();
                    let r = TransposePlan::new(&x_d, &w_d, &conv, &y_bad).map(|_| ());
                    assert!(
                        matches!(r, Err(Error::ShapeMismatch { a: "y", .. })),
                        "{off:?}: {r:?}"
                    );
                }
            }
        }
        assert!(checked > 20, "{checked}");
        assert!(routes.iter().all(|&r| r > 0), "{routes:?}");
    }
}
