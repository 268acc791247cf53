//! Inference convolution layers as one cuDNN graph each: `relu(conv(x, w) + b + z)`, channels-
//! last, and batch-norm folding for them.
use candle_core::{DType, Layout, Tensor};
use cudnn_safe::conv::{Epilogue, FusedConv};
use cudnn_safe::graph::{ConvParams, PlanFilter};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::tune::SearchEffort;

use crate::buf::{aligned, cuda_device, cuda_slice, output, packed_aligned, tensor, view, Elem};
use crate::conv::Conv2dParams;
use crate::error::{like, Error};
use crate::state::{options, with_held};

const OP: &str = "conv2d_fused";

/// An inference convolution layer, `y = [relu](conv2d(x, w) + bias [+ residual])`, as one
/// cuDNN graph (the convolution with its bias, residual add and ReLU as the epilogue), for a
/// network whose batch norms are folded into its convolutions ([`fold_batch_norm`]). The plan
/// is timed at the first call of each shape on a thread and kept: the heuristics' first four
/// plans under [`SearchEffort::Quick`] (the default [`Options`](crate::Options)), all of them
/// under [`SearchEffort::Thorough`]. Where no engine runs the graph (channel counts the fused
/// kernels do not take, e.g. 3 input channels), the layer runs as separate operations.
///
/// `x` `[n, c, h, w]`, `w` `[k, c / groups, r, s]`, `bias` `[k]`, `residual` of the output's
/// shape, one dtype. The graph runs channels-last (NHWC): the result is `[n, k, h', w']` stored
/// channels-last (strides `[h'·w'·k, 1, w'·k, k]`), which the next layer reads as it is; an
/// argument stored otherwise is copied channels-last first (`x.permute((0, 2, 3, 1))` of an
/// NHWC tensor is free). f16 and bf16 on a CUDA device without autograd run the fused graph;
/// f32 (whose TF32 setting [`set_options`](crate::set_options) governs), arguments tracked by
/// autograd and the CPU run [`conv2d_with`](crate::conv2d_with) and candle's operations, with
/// the same results up to rounding.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
/// use cudnn_safe_candle::{conv2d_fused, Conv2dParams};
/// let dev = Device::new_cuda(0)?;
/// let x = Tensor::randn(0f32, 1.0, (32, 64, 56, 56), &dev)?.to_dtype(DType::F16)?;
/// let w = Tensor::randn(0f32, 0.05, (64, 64, 3, 3), &dev)?.to_dtype(DType::F16)?;
/// let b = Tensor::zeros(64, DType::F16, &dev)?;
/// let p = Conv2dParams::new().padding([1, 1]);
/// let y = conv2d_fused(&x, &w, &b, Some(&x), true, &p)?; // a ResNet block's last layer
/// assert_eq!(y.dims(), &[32, 64, 56, 56]);
/// # Ok(()) }
/// ```
pub fn conv2d_fused(
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    residual: Option<&Tensor>,
    relu: bool,
    p: &Conv2dParams,
) -> candle_core::Result<Tensor> {
    let y_dims = check(x, w, bias, residual, p)?;
    let tracked = [Some(x), Some(w), Some(bias), residual]
        .into_iter()
        .flatten()
        .any(Tensor::track_op);
    // An empty result (no batch, or no output channels) has no graph to run.
    let fused = x.device().is_cuda()
        && matches!(x.dtype(), DType::F16 | DType::BF16)
        && !y_dims.contains(&0);
    if fused && !tracked {
        let (xc, wc) = (channels_last(x)?, channels_last(w)?);
        let bc = packed_aligned(bias)?;
        let zc = residual.map(channels_last).transpose()?;
        let y = match x.dtype() {
            DType::F16 => run::<f16>(&xc, &wc, &bc, zc.as_ref(), relu, p, &y_dims)?,
            DType::BF16 => run::<bf16>(&xc, &wc, &bc, zc.as_ref(), relu, p, &y_dims)?,
            d => return Err(Error::dtype(OP, "x", d)),
        };
        if let Some(y) = y {
            return y.permute((0, 3, 1, 2));
        }
    }
    let mut y = crate::conv2d_with(x, w, p)?.broadcast_add(&bias.reshape((1, (), 1, 1))?)?;
    if let Some(z) = residual {
        y = (y + z)?;
    }
    if relu {
        y.relu()
    } else {
        Ok(y)
    }
}

/// Kept under a graph's key when no engine runs it: later calls go straight to the separate
/// operations.
struct NoEngine;

/// Checks the arguments; returns the output's dims.
fn check(
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    residual: Option<&Tensor>,
    p: &Conv2dParams,
) -> candle_core::Result<[usize; 4]> {
    let dims4 = |t: &Tensor, arg| match *t.dims() {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(Error::invalid(OP, arg, "4 dimensions", t.dims())),
    };
    let [n, c, h, wd] = dims4(x, "x")?;
    let [k, cg, r, s] = dims4(w, "w")?;
    match x.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => {}
        d => return Err(Error::dtype(OP, "x", d)),
    }
    for (t, arg) in [(w, "w"), (bias, "bias")]
        .into_iter()
        .chain(residual.map(|z| (z, "residual")))
    {
        like(OP, x, "x", t, arg)?;
    }
    if p.groups == 0 {
        return Err(Error::invalid(OP, "groups", "at least 1", p.groups));
    }
    if cg.checked_mul(p.groups) != Some(c) || k % p.groups != 0 {
        return Err(Error::invalid(
            OP,
            "w",
            format!(
                "[k, {} / {} groups, r, s] with k a multiple of the groups",
                c, p.groups
            ),
            w.dims(),
        ));
    }
    if bias.dims() != [k] {
        return Err(Error::invalid(
            OP,
            "bias",
            format!("[{k}] (w's output channels)"),
            bias.dims(),
        ));
    }
    let out = |d: usize, len: usize, kernel: usize| {
        crate::conv::out_len(OP, p, d, len, kernel, x.dims(), w.dims())
    };
    let y = [n, k, out(0, h, r)?, out(1, wd, s)?];
    if let Some(z) = residual {
        if z.dims() != y {
            return Err(Error::invalid(
                OP,
                "residual",
                format!("the output's {y:?}"),
                z.dims(),
            ));
        }
    }
    Ok(y)
}

/// Whether `l` is `[n, c, h, w]` stored channels-last and packed.
fn is_channels_last(l: &Layout) -> bool {
    let (d, s) = (l.dims(), l.stride());
    d.len() == 4 && {
        let want = [d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]];
        (0..4).all(|i| d[i] == 1 || s[i] == want[i])
    }
}

/// `t` `[n, c, h, w]` stored channels-last with a 16-byte aligned start: itself when it is, a
/// copy otherwise.
pub(crate) fn channels_last(t: &Tensor) -> candle_core::Result<Tensor> {
    if is_channels_last(t.layout()) && aligned(t) {
        Ok(t.clone())
    } else {
        t.permute((0, 2, 3, 1))?
            .force_contiguous()?
            .permute((0, 3, 1, 2))
    }
}

/// The graph on packed channels-last arguments; the result as `[n, h', w', k]`, or `None` when
/// no cuDNN engine runs the graph (channel counts the fused kernels do not take).
fn run<T: Elem>(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    z: Option<&Tensor>,
    relu: bool,
    p: &Conv2dParams,
    y_dims: &[usize; 4],
) -> candle_core::Result<Option<Tensor>> {
    let (xs, xl) = x.storage_and_layout();
    let (ws, wl) = w.storage_and_layout();
    let (bs, bl) = b.storage_and_layout();
    let zs = z.map(|z| z.storage_and_layout());
    let dev = cuda_device(&xs, OP, "x")?;
    let packed = |s, l: &Layout, arg| {
        let start = l.start_offset();
        view(
            cuda_slice::<T>(s, OP, arg)?,
            start..start + l.shape().elem_count(),
            OP,
            arg,
        )
    };
    let xv = packed(&xs, xl, "x")?;
    let wv = packed(&ws, wl, "w")?;
    let bv = packed(&bs, bl, "bias")?;
    let zv = match &zs {
        Some((s, l)) => Some(packed(s, l, "residual")?),
        None => None,
    };
    let i64s = |d: &[usize]| -> [i64; 4] { [d[0] as i64, d[1] as i64, d[2] as i64, d[3] as i64] };
    let params = ConvParams::new(2)
        .with_padding(&[p.padding[0] as i64, p.padding[1] as i64])
        .with_strides(&[p.stride[0] as i64, p.stride[1] as i64])
        .with_dilations(&[p.dilation[0] as i64, p.dilation[1] as i64]);
    let epi = Epilogue {
        residual: z.is_some(),
        relu,
    };
    let key = format!(
        "{OP}-{:?}-{:?}-{:?}-{p:?}-{epi:?}",
        T::DTYPE,
        xl.dims(),
        wl.dims()
    );
    let (xd, wd) = (i64s(xl.dims()), i64s(wl.dims()));
    let quick = options().effort == SearchEffort::Quick;
    let y = with_held(&dev, |cudnn, held| {
        let none = format!("{key}-no-engine");
        if held.objects.contains(&none) {
            return Ok(None);
        }
        let made = held.objects.get_or_make(key, || {
            let layer = FusedConv::new(cudnn, T::DTYPE, xd, wd, &params, epi)?;
            // A quick search times the heuristics' first few plans, not all of them.
            Ok(match quick {
                true => layer.with_filter(PlanFilter::default().with_max_plans(Some(QUICK_PLANS))),
                false => layer,
            })
        });
        let layer = match made {
            Ok(layer) => layer,
            // cuDNN refusing the graph itself (a status of the "not supported" family when it
            // is built) is the same verdict as no engine running it.
            Err(e) if not_supported(&e) => {
                log::debug!("{OP}: separate operations for {xd:?} * {wd:?}: {e}");
                held.objects.insert(none, NoEngine);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let mut y = output::<T>(cudnn, layer.y_span(), "allocating a convolution result")?;
        match layer.run(
            cudnn,
            &mut held.plans,
            &xv,
            &wv,
            &bv,
            zv,
            &mut y,
            &mut held.ws,
        ) {
            Ok(()) => Ok(Some(y)),
            Err(e) if not_supported(&e) => {
                log::debug!("{OP}: separate operations for {xd:?} * {wd:?}: {e}");
                held.objects.insert(none, NoEngine);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    })?;
    let [n, k, h, wo] = *y_dims;
    Ok(y.map(|y| tensor(y, &dev, vec![n, h, wo, k])))
}

/// Whether `e` is cuDNN saying it does not take the graph (no engine, or a status of the
/// "not supported" family), rather than a failure the caller must see.
fn not_supported(e: &cudnn_safe::Error) -> bool {
    match e {
        cudnn_safe::Error::NoEngine { .. } => true,
        cudnn_safe::Error::Cudnn { status, .. } => {
            status.family() == cudnn_safe::StatusFamily::NotSupported
        }
        _ => false,
    }
}

/// Plans a [`SearchEffort::Quick`] search times per fused layer.
const QUICK_PLANS: usize = 4;

/// A convolution followed by an inference batch norm as one convolution: `w' = w · γ / σ`,
/// `b' = (b − μ) · γ / σ + β` per output channel, with `σ = sqrt(var + eps)` (the conv's own
/// bias `b` is 0 when `None`). The result feeds [`conv2d_fused`]. Computed in f32 and returned
/// in w's dtype.
///
/// ```
/// use candle_core::{Device, Tensor};
/// # fn main() -> candle_core::Result<()> {
/// let dev = Device::Cpu;
/// let w = Tensor::ones((2, 1, 1, 1), candle_core::DType::F32, &dev)?;
/// let gamma = Tensor::new(&[2f32, 1.0], &dev)?;
/// let beta = Tensor::new(&[0f32, 1.0], &dev)?;
/// let mean = Tensor::new(&[1f32, 0.0], &dev)?;
/// let var = Tensor::new(&[3f32, 0.0], &dev)?;
/// let (w2, b2) = cudnn_safe_candle::fold_batch_norm(&w, None, &gamma, &beta, &mean, &var, 1.0)?;
/// assert_eq!(w2.flatten_all()?.to_vec1::<f32>()?, [1.0, 1.0]);
/// assert_eq!(b2.to_vec1::<f32>()?, [-1.0, 1.0]);
/// # Ok(()) }
/// ```
pub fn fold_batch_norm(
    w: &Tensor,
    conv_bias: Option<&Tensor>,
    gamma: &Tensor,
    beta: &Tensor,
    mean: &Tensor,
    var: &Tensor,
    eps: f64,
) -> candle_core::Result<(Tensor, Tensor)> {
    const OP: &str = "fold_batch_norm";
    let Some(&k) = w.dims().first() else {
        return Err(Error::invalid(
            OP,
            "w",
            "at least one dimension [k, ...]",
            w.dims(),
        ));
    };
    for (t, arg) in [
        (gamma, "gamma"),
        (beta, "beta"),
        (mean, "mean"),
        (var, "var"),
    ]
    .into_iter()
    .chain(conv_bias.map(|b| (b, "conv_bias")))
    {
        if t.dims() != [k] {
            return Err(Error::invalid(
                OP,
                arg,
                format!("[{k}] (w's output channels)"),
                t.dims(),
            ));
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::invalid(OP, "eps", "finite and at least 0", eps));
    }
    let f = |t: &Tensor| t.to_dtype(DType::F32);
    let scale = f(gamma)?.div(&(f(var)? + eps)?.sqrt()?)?;
    let shape: Vec<usize> = std::iter::once(k)
        .chain(std::iter::repeat_n(1, w.rank() - 1))
        .collect();
    let w2 = f(w)?
        .broadcast_mul(&scale.reshape(shape)?)?
        .to_dtype(w.dtype())?;
    let b = match conv_bias {
        Some(b) => f(b)?,
        None => Tensor::zeros(k, DType::F32, w.device())?,
    };
    let b2 = ((b - f(mean)?)? * &scale)?
        .add(&f(beta)?)?
        .to_dtype(w.dtype())?;
    Ok((w2, b2))
}
