//! Convolution: forward through the union autotune, backward data and filter through the same
//! tuner, as candle custom operations.
use candle_core::{
    backend::BackendStorage, CpuStorage, CudaStorage, CustomOp2, DType, Layout, Shape, Tensor,
};
use cudnn_safe::conv::{ConvDesc, MathType};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{DataType, FilterDesc, Scalar, TensorDesc, TensorFormat};

use crate::buf::{output, packed, view, Elem};
use crate::error::{like, wrap, Error};
use crate::state::with_state;

/// A 2-D convolution's parameters, per spatial dimension (`[height, width]`), as cuDNN takes
/// them: symmetric zero padding, stride, dilation, and the group count.
///
/// ```
/// let p = cudnn_safe_candle::Conv2dParams::new().padding([1, 0]).stride([2, 1]);
/// assert_eq!(p, cudnn_safe_candle::Conv2dParams { padding: [1, 0], stride: [2, 1], dilation: [1, 1], groups: 1 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Zero padding on both sides of each dimension.
    pub padding: [usize; 2],
    /// Stride (at least 1).
    pub stride: [usize; 2],
    /// Dilation (at least 1).
    pub dilation: [usize; 2],
    /// Groups (at least 1; divides both channel counts).
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            padding: [0, 0],
            stride: [1, 1],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl Conv2dParams {
    /// No padding, stride and dilation 1, one group.
    pub fn new() -> Self {
        Self::default()
    }
    /// With `padding`.
    #[must_use]
    pub fn padding(mut self, padding: [usize; 2]) -> Self {
        self.padding = padding;
        self
    }
    /// With `stride`.
    #[must_use]
    pub fn stride(mut self, stride: [usize; 2]) -> Self {
        self.stride = stride;
        self
    }
    /// With `dilation`.
    #[must_use]
    pub fn dilation(mut self, dilation: [usize; 2]) -> Self {
        self.dilation = dilation;
        self
    }
    /// With `groups`.
    #[must_use]
    pub fn groups(mut self, groups: usize) -> Self {
        self.groups = groups;
        self
    }
}

const CONV2D: &str = "conv2d";
const CONV1D: &str = "conv1d";

/// `x.conv2d(w, padding, stride, dilation, groups)` through cuDNN: `x` is `[batch, c_in, h,
/// w]`, `w` is `[c_out, c_in / groups, kh, kw]`, the result `[batch, c_out, h_out, w_out]`
/// (contiguous). See [`conv2d_with`].
pub fn conv2d(
    x: &Tensor,
    w: &Tensor,
    padding: usize,
    stride: usize,
    dilation: usize,
    groups: usize,
) -> candle_core::Result<Tensor> {
    let p = Conv2dParams {
        padding: [padding; 2],
        stride: [stride; 2],
        dilation: [dilation; 2],
        groups,
    };
    conv(CONV2D, x, w, p, 4)
}

/// `x.conv1d(w, padding, stride, dilation, groups)` through cuDNN: `x` is `[batch, c_in, l]`,
/// `w` is `[c_out, c_in / groups, k]`, the result `[batch, c_out, l_out]` (run as a 2-D
/// convolution of height 1).
pub fn conv1d(
    x: &Tensor,
    w: &Tensor,
    padding: usize,
    stride: usize,
    dilation: usize,
    groups: usize,
) -> candle_core::Result<Tensor> {
    let p = Conv2dParams {
        padding: [0, padding],
        stride: [1, stride],
        dilation: [1, dilation],
        groups,
    };
    conv(CONV1D, x, w, p, 3)
}

/// A 2-D convolution (cross-correlation, as candle's and PyTorch's) with per-dimension
/// parameters. On a CUDA device: forward through the union autotune (the first call of each
/// problem searches, later calls run the decision), and in candle's autograd, backward data and
/// backward filter through the same tuner. On the CPU: candle's own `conv2d` (equal parameters
/// in both dimensions only).
///
/// Errors (before any GPU work), each naming the argument: ranks other than 4; element types
/// other than f32, f16 and bf16, or different ones; different devices; `groups` 0 or not
/// dividing both channel counts; `c_in` not `w`'s input channels × `groups`; stride or dilation
/// 0; an empty output. `x` may be strided (its strides go to cuDNN); `w` is made contiguous. A
/// batch of 0, or 0 output channels, gives an empty result of the output's shape (as PyTorch).
pub fn conv2d_with(x: &Tensor, w: &Tensor, p: &Conv2dParams) -> candle_core::Result<Tensor> {
    conv(CONV2D, x, w, *p, 4)
}

fn conv(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    p: Conv2dParams,
    rank: usize,
) -> candle_core::Result<Tensor> {
    for (arg, t) in [("x", x), ("w", w)] {
        if t.rank() != rank {
            return Err(Error::invalid(
                op,
                arg,
                format!("a tensor of rank {rank}"),
                t.dims(),
            ));
        }
        float_dtype(op, arg, t.dtype())?;
    }
    like(op, x, "x", w, "w")?;
    if p.groups == 0 {
        return Err(Error::invalid(op, "groups", "at least 1", p.groups));
    }
    if p.stride.contains(&0) {
        return Err(Error::invalid(op, "stride", "at least 1", p.stride));
    }
    if p.dilation.contains(&0) {
        return Err(Error::invalid(op, "dilation", "at least 1", p.dilation));
    }
    let (c_in, c_out, per_group) = (x.dims()[1], w.dims()[0], w.dims()[1]);
    if c_out % p.groups != 0 {
        return Err(Error::invalid(
            op,
            "w",
            format!("output channels divisible by groups = {}", p.groups),
            w.dims(),
        ));
    }
    if per_group.checked_mul(p.groups) != Some(c_in) {
        return Err(Error::invalid(
            op,
            "w",
            format!(
                "{} input channels per group (x has {c_in}, groups = {})",
                c_in / p.groups.max(1),
                p.groups
            ),
            w.dims(),
        ));
    }
    // The output's spatial sizes, as cuDNN computes them.
    let (x4, w4) = (dims4(x.dims()), dims4(w.dims()));
    let mut spatial = [0; 2];
    for (d, len) in spatial.iter_mut().enumerate() {
        *len = out_len(op, &p, d, x4[2 + d], w4[2 + d], x.dims(), w.dims())?;
    }
    if x4[0] == 0 || c_out == 0 {
        // An empty batch or no output channels: an empty result, as PyTorch's.
        let y: Vec<usize> = match rank {
            3 => vec![x4[0], c_out, spatial[1]],
            _ => vec![x4[0], c_out, spatial[0], spatial[1]],
        };
        return Tensor::zeros(y, x.dtype(), x.device());
    }
    if x.device().is_cpu() {
        return cpu_conv(op, x, w, &p);
    }
    // Zero strides (broadcast) are no layout cuDNN takes; filters are packed. A copy even where
    // candle calls the view contiguous (zero strides only on axes of extent 1, as after
    // `broadcast_left`): the strides go to cuDNN as they are.
    let x = if x.stride().contains(&0) {
        x.force_contiguous()?
    } else {
        x.clone()
    };
    let w = w.contiguous()?;
    x.apply_op2(
        &w,
        ConvOp {
            op,
            p,
            pass: Pass::Forward,
            rank,
            out: Vec::new(),
        },
    )
}

/// candle's own convolution, for tensors on the CPU.
fn cpu_conv(
    op: &'static str,
    x: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
) -> candle_core::Result<Tensor> {
    if op == CONV1D {
        return x.conv1d(w, p.padding[1], p.stride[1], p.dilation[1], p.groups);
    }
    if p.padding[0] != p.padding[1] || p.stride[0] != p.stride[1] || p.dilation[0] != p.dilation[1]
    {
        return Err(Error::invalid(
            op,
            "params",
            "equal in both dimensions on the CPU (candle's conv2d)",
            p,
        ));
    }
    x.conv2d(w, p.padding[0], p.stride[0], p.dilation[0], p.groups)
}

fn float_dtype(op: &'static str, arg: &'static str, dtype: DType) -> candle_core::Result<()> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        _ => Err(Error::dtype(op, arg, dtype)),
    }
}

/// The output length along spatial dimension `d` (cuDNN's formula), or the error naming what
/// is wrong: a zero stride or dilation, an empty kernel, padding or dilation too large to
/// compute with, or an input (with padding) shorter than the dilated kernel. Never overflows.
pub(crate) fn out_len(
    op: &'static str,
    p: &Conv2dParams,
    d: usize,
    len: usize,
    kernel: usize,
    x_dims: &[usize],
    w_dims: &[usize],
) -> candle_core::Result<usize> {
    let (pad, stride, dil) = (p.padding[d], p.stride[d], p.dilation[d]);
    if stride == 0 {
        return Err(Error::invalid(op, "stride", "at least 1", p.stride));
    }
    if dil == 0 {
        return Err(Error::invalid(op, "dilation", "at least 1", p.dilation));
    }
    if kernel == 0 {
        return Err(Error::invalid(op, "w", "a kernel of at least 1", w_dims));
    }
    let span = dil
        .checked_mul(kernel - 1)
        .and_then(|s| s.checked_add(1))
        .ok_or_else(|| {
            Error::invalid(op, "dilation", "a dilated kernel within usize", p.dilation)
        })?;
    let padded = pad
        .checked_mul(2)
        .and_then(|p2| p2.checked_add(len))
        .ok_or_else(|| Error::invalid(op, "padding", "a padded size within usize", p.padding))?;
    if padded < span {
        return Err(Error::invalid(
            op,
            "x",
            format!(
                "spatial size (with padding {:?}) at least the dilated kernel's {span}",
                p.padding
            ),
            x_dims,
        ));
    }
    Ok((padded - span) / stride + 1)
}

/// `[n, c, l]` as `[n, c, 1, l]`; 4-D as it is.
fn dims4(d: &[usize]) -> [usize; 4] {
    match *d {
        [n, c, l] => [n, c, 1, l],
        [n, c, h, w] => [n, c, h, w],
        _ => [0; 4],
    }
}

fn i64s(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&u| u as i64).collect()
}

/// A tensor's layout as cuDNN's 4-D description: its dims and strides (a 3-D `[n, c, l]` gets
/// height 1), and the element range of its storage it covers.
fn desc4<T: DataType>(l: &Layout) -> candle_core::Result<(TensorDesc<T>, std::ops::Range<usize>)> {
    let (dims, stride) = (l.dims(), l.stride());
    let (d, s) = match (dims, stride) {
        ([n, c, w], [sn, sc, sw]) => ([*n, *c, 1, *w], [*sn, *sc, *w * *sw, *sw]),
        ([n, c, h, w], [sn, sc, sh, sw]) => ([*n, *c, *h, *w], [*sn, *sc, *sh, *sw]),
        _ => {
            return Err(Error::invalid(
                "convolution",
                "layout",
                "3 or 4 dimensions",
                dims,
            ))
        }
    };
    let desc = TensorDesc::<T>::strided(&i64s(&d), &i64s(&s)).map_err(wrap)?;
    let (start, span) = (l.start_offset(), desc.span());
    Ok((desc, start..start + span))
}

/// A packed filter `[k, c, s]` or `[k, c, r, s]` as 4-D.
fn filter4<T: DataType>(dims: &[usize]) -> candle_core::Result<FilterDesc<T>> {
    FilterDesc::<T>::new(&i64s(&dims4(dims)), TensorFormat::Nchw).map_err(wrap)
}

fn conv_desc<T: DataType>(p: &Conv2dParams, allow_tf32: bool) -> cudnn_safe::Result<ConvDesc> {
    let math = if T::DTYPE == cudnn_safe::DType::F32 && !allow_tf32 {
        MathType::Fma
    } else {
        MathType::Default
    };
    ConvDesc::builder(2)
        .pads(&i64s(&p.padding))
        .strides(&i64s(&p.stride))
        .dilations(&i64s(&p.dilation))
        .groups(p.groups as i64)
        .math(math)
        .build::<T>()
}

fn one<T: DataType>() -> T::Scalar {
    T::Scalar::from_f64(1.0)
}
fn zero<T: DataType>() -> T::Scalar {
    T::Scalar::from_f64(0.0)
}

/// Which of the three convolutions a [`ConvOp`] runs, on which two arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// `y` from (x, w).
    Forward,
    /// `dx` from (dy, w).
    Data,
    /// `dw` from (x, dy).
    Filter,
}

/// One convolution pass as a candle operation of two tensors. `out` is the result's shape for
/// the gradients (x's or w's); the forward computes its own (`rank` 3 drops the height of 1).
struct ConvOp {
    op: &'static str,
    p: Conv2dParams,
    pass: Pass,
    rank: usize,
    out: Vec<usize>,
}

impl ConvOp {
    fn run<T: Elem>(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev = s1.device().clone();
        let p = self.p;
        let (result, dims) = match self.pass {
            Pass::Forward => {
                let (x_d, xr) = desc4::<T>(l1)?;
                let x = view(s1.as_cuda_slice::<T>()?, xr, self.op, "x")?;
                let w_d = filter4::<T>(l2.dims())?;
                let w = packed(s2.as_cuda_slice::<T>()?, l2, self.op, "w")?;
                with_state(&dev, |cudnn, tuner, o| {
                    let conv = conv_desc::<T>(&p, o.allow_tf32)?;
                    let y_dims = conv.output_dims(x_d.dims(), w_d.dims())?;
                    let y_d = TensorDesc::<T>::nchw_nd(&y_dims)?;
                    let mut y = output::<T>(cudnn, y_d.span(), "allocating a convolution result")?;
                    let choice = tuner.forward(
                        cudnn,
                        one::<T>(),
                        &x_d,
                        &x,
                        &w_d,
                        &w,
                        &conv,
                        zero::<T>(),
                        &y_d,
                        &mut y,
                    )?;
                    log::debug!("{}: {}", self.op, choice.describe());
                    let mut dims: Vec<usize> = y_dims.iter().map(|&d| d as usize).collect();
                    if self.rank == 3 {
                        dims.remove(2);
                    }
                    Ok((y, dims))
                })?
            }
            Pass::Data => {
                let (dy_d, dyr) = desc4::<T>(l1)?;
                let dy = view(s1.as_cuda_slice::<T>()?, dyr, self.op, "dy")?;
                let w_d = filter4::<T>(l2.dims())?;
                let w = packed(s2.as_cuda_slice::<T>()?, l2, self.op, "w")?;
                let dx_d = TensorDesc::<T>::nchw_nd(&i64s(&dims4(&self.out))).map_err(wrap)?;
                with_state(&dev, |cudnn, tuner, o| {
                    let conv = conv_desc::<T>(&p, o.allow_tf32)?;
                    let mut dx =
                        output::<T>(cudnn, dx_d.span(), "allocating a convolution result")?;
                    tuner.backward_data(
                        cudnn,
                        one::<T>(),
                        &w_d,
                        &w,
                        &dy_d,
                        &dy,
                        &conv,
                        zero::<T>(),
                        &dx_d,
                        &mut dx,
                    )?;
                    Ok((dx, self.out.clone()))
                })?
            }
            Pass::Filter => {
                let (x_d, xr) = desc4::<T>(l1)?;
                let x = view(s1.as_cuda_slice::<T>()?, xr, self.op, "x")?;
                let (dy_d, dyr) = desc4::<T>(l2)?;
                let dy = view(s2.as_cuda_slice::<T>()?, dyr, self.op, "dy")?;
                let dw_d = filter4::<T>(&self.out)?;
                with_state(&dev, |cudnn, tuner, o| {
                    let conv = conv_desc::<T>(&p, o.allow_tf32)?;
                    let mut dw =
                        output::<T>(cudnn, dw_d.span(), "allocating a convolution result")?;
                    tuner.backward_filter(
                        cudnn,
                        one::<T>(),
                        &x_d,
                        &x,
                        &dy_d,
                        &dy,
                        &conv,
                        zero::<T>(),
                        &dw_d,
                        &mut dw,
                    )?;
                    Ok((dw, self.out.clone()))
                })?
            }
        };
        Ok((CudaStorage::wrap_cuda_slice(result, dev), Shape::from(dims)))
    }
}

impl CustomOp2 for ConvOp {
    fn name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "cudnn-safe-conv-forward",
            Pass::Data => "cudnn-safe-conv-backward-data",
            Pass::Filter => "cudnn-safe-conv-backward-filter",
        }
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(Error::invalid(
            self.op,
            "device",
            "a CUDA device for the cuDNN operation (the public functions run candle's own on \
             the CPU)",
            "cpu",
        ))
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        match s1.dtype() {
            DType::F32 => self.run::<f32>(s1, l1, s2, l2),
            DType::F16 => self.run::<f16>(s1, l1, s2, l2),
            DType::BF16 => self.run::<bf16>(s1, l1, s2, l2),
            d => {
                let arg = if self.pass == Pass::Data { "dy" } else { "x" };
                Err(Error::dtype(self.op, arg, d))
            }
        }
    }

    /// The forward pass's gradients, through the same tuner (the gradients themselves have
    /// none: no second derivatives).
    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        if self.pass != Pass::Forward {
            return Err(candle_core::Error::BackwardNotSupported { op: self.name() });
        }
        let (x, w) = (a, b);
        let dy = if dy.stride().contains(&0) {
            dy.force_contiguous()?
        } else {
            dy.clone()
        };
        let grad = |pass, out: &Tensor| ConvOp {
            op: self.op,
            p: self.p,
            pass,
            rank: self.rank,
            out: out.dims().to_vec(),
        };
        let dx = dy.apply_op2(w, grad(Pass::Data, x))?;
        let dw = x.apply_op2(&dy, grad(Pass::Filter, w))?;
        Ok((Some(dx), Some(dw)))
    }
}
