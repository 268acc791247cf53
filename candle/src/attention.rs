//! Scaled dot-product attention: cuDNN's fused flash-attention engines through the graph API,
//! forward and backward, with candle's own operations where those engines do not apply.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Layout, Shape, Tensor, Var};
use cudnn_safe::cudarc::driver::CudaSlice;
use cudnn_safe::graph::{Args, Graph, OperationGraph, Plan, PlanFilter, SdpaOptions, TensorId};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::tune::Policy;

use crate::buf::{aligned, cuda_device, cuda_slice, output, tensor, view, Elem};
use crate::error::{like, same_device, Error};
use crate::state::{options, with_held, Held};

const OP: &str = "sdpa";

/// The causal mask of [`sdpa`]: which keys each query may attend to.
///
/// `true` converts to [`Causal::TopLeft`] (PyTorch's `is_causal`), `false` to [`Causal::No`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Causal {
    /// Every query attends to every key (only `mask` applies).
    #[default]
    No,
    /// Query `i` attends to keys `j ≤ i` (PyTorch's `is_causal`; the diagonal starts at the top
    /// left corner of the `s_q × s_kv` score matrix).
    TopLeft,
    /// Query `i` attends to keys `j ≤ i + s_kv − s_q` (FlashAttention's `causal`: the queries
    /// are the last `s_q` positions of the `s_kv` keys, as when decoding after a key-value
    /// cache). Equal to [`Causal::TopLeft`] when `s_q = s_kv`.
    BottomRight,
}

impl From<bool> for Causal {
    fn from(causal: bool) -> Causal {
        if causal {
            Causal::TopLeft
        } else {
            Causal::No
        }
    }
}

/// Scaled dot-product attention, `softmax(scale · q·kᵀ + mask) · v` per batch entry and head,
/// as PyTorch's `scaled_dot_product_attention(q, k, v, attn_mask, is_causal=…, scale=…)`:
///
/// * `q` `[b, h, s_q, d]`, `k` `[b, h_k, s_kv, d]`, `v` `[b, h_v, s_kv, d_v]`, one dtype, one
///   device; `h_k` and `h_v` divide `h` (grouped-query attention when smaller: query head `i`
///   reads key head `i / (h / h_k)`; 1 for multi-query attention). Any strides (e.g. `q` as
///   the `[b, s, h, d]` output of a projection, `.transpose(1, 2)`).
/// * `mask`: broadcastable to `[b, h, s_q, s_kv]`; a float tensor is added to the scaled
///   scores (`−∞` masks), a `u8` tensor keeps the scores where it is 1 (PyTorch's boolean
///   mask). It gets no gradient.
/// * `causal`: [`Causal`] (`true` is PyTorch's top-left `is_causal`), together with `mask` if
///   both are given. A query whose every key is masked has no defined result (candle's
///   operations give NaN, as PyTorch's math path does; the fused kernels need not).
/// * `scale`: usually `1 / sqrt(d)`.
///
/// Returns `[b, h, s_q, d_v]`, with the gradients of `q`, `k` and `v` in candle's autograd.
///
/// f16 and bf16 on a CUDA device with `d` and `d_v` multiples of 8 up to 128 run cuDNN's fused
/// flash-attention kernels (the score matrix is never stored; the backward pass is cuDNN's
/// fused one, deterministic under [`Policy::Deterministic`](cudnn_safe::tune::Policy)); the
/// plans are built at the first call of each problem on a thread and kept. Other cases (f32,
/// f64, other head dimensions, [`Causal::BottomRight`] with a mask or with `s_q > s_kv`, the
/// CPU, or a problem cuDNN has no engine for) run candle's matmul and softmax, with the same
/// results up to rounding.
///
/// A bad argument is an [`Error`] naming it, returned before anything runs.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
/// let dev = Device::new_cuda(0)?;
/// let (b, s, h, d) = (2, 1024, 8, 64);
/// let qkv = Tensor::randn(0f32, 1.0, (b, s, 3, h, d), &dev)?.to_dtype(DType::BF16)?;
/// let q = qkv.narrow(2, 0, 1)?.squeeze(2)?.transpose(1, 2)?; // [b, h, s, d], strided
/// let k = qkv.narrow(2, 1, 1)?.squeeze(2)?.transpose(1, 2)?;
/// let v = qkv.narrow(2, 2, 1)?.squeeze(2)?.transpose(1, 2)?;
/// let o = cudnn_safe_candle::sdpa(&q, &k, &v, None, true, 1.0 / (d as f64).sqrt())?;
/// assert_eq!(o.dims(), &[b, h, s, d]);
/// # Ok(()) }
/// ```
pub fn sdpa(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: impl Into<Causal>,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let causal = causal.into();
    let sz = check(q, k, v, mask, scale)?;
    if [sz.b, sz.h, sz.s_q, sz.d_v].contains(&0) {
        return Tensor::zeros((sz.b, sz.h, sz.s_q, sz.d_v), q.dtype(), q.device());
    }
    if !fused_applies(q, &sz, mask.is_some(), causal) {
        return composed(q, k, v, mask, causal, scale);
    }
    let (qr, kr, vr) = (ready(q)?, ready(k)?, ready(v)?);
    let bias = mask.map(|m| bias(m, &sz, q.dtype())).transpose()?;
    let training = q.track_op() || k.track_op() || v.track_op();
    let order = stride_order(qr.stride());
    let unsupported = Arc::new(AtomicBool::new(false));
    let op = Fused {
        causal,
        scale,
        training,
        bias,
        order: order.clone(),
        sz,
        stats: Mutex::new(None),
        unsupported: unsupported.clone(),
    };
    let res = if training {
        qr.apply_op3(&kr, &vr, op)
    } else {
        qr.apply_op3_no_bwd(&kr, &vr, &op)
    };
    match res {
        Ok(o) => o.permute(inverse(&order)),
        Err(e) if unsupported.load(Ordering::Relaxed) => {
            log::debug!("{OP}: candle's operations: {e}");
            composed(q, k, v, mask, causal, scale)
        }
        Err(e) => Err(e),
    }
}

/// Kept under a problem's key when cuDNN has no plan for it.
struct NoPlan;

/// The sizes of an attention problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Sizes {
    b: usize,
    h: usize,
    h_k: usize,
    h_v: usize,
    s_q: usize,
    s_kv: usize,
    d: usize,
    d_v: usize,
    /// The mask's batch and head extents (each 1 or full) when there is one.
    mask: Option<[usize; 2]>,
}

fn dims4(t: &Tensor, arg: &'static str, what: &str) -> candle_core::Result<[usize; 4]> {
    match *t.dims() {
        [a, b, c, d] => Ok([a, b, c, d]),
        _ => Err(Error::invalid(
            OP,
            arg,
            format!("4 dimensions {what}"),
            t.dims(),
        )),
    }
}

/// Every argument checked against the others.
fn check(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> candle_core::Result<Sizes> {
    let [b, h, s_q, d] = dims4(q, "q", "[batch, heads, seq_q, head_dim]")?;
    let [kb, h_k, s_kv, kd] = dims4(k, "k", "[batch, kv_heads, seq_kv, head_dim]")?;
    let [vb, h_v, vs, d_v] = dims4(v, "v", "[batch, kv_heads, seq_kv, head_dim_v]")?;
    match q.dtype() {
        DType::F16 | DType::BF16 | DType::F32 | DType::F64 => {}
        dt => return Err(Error::dtype(OP, "q", dt)),
    }
    like(OP, q, "q", k, "k")?;
    like(OP, q, "q", v, "v")?;
    if kb != b || kd != d {
        return Err(Error::invalid(
            OP,
            "k",
            format!("[{b}, kv_heads, seq_kv, {d}] (q's batch and head dimension)"),
            k.dims(),
        ));
    }
    if vb != b || vs != s_kv {
        return Err(Error::invalid(
            OP,
            "v",
            format!("[{b}, kv_heads, {s_kv}, head_dim_v] (q's batch, k's sequence)"),
            v.dims(),
        ));
    }
    for (n, arg) in [(h_k, "k"), (h_v, "v")] {
        if n == 0 || !h.is_multiple_of(n) {
            return Err(Error::invalid(
                OP,
                arg,
                format!("a head count dividing q's {h}"),
                n,
            ));
        }
    }
    if s_kv == 0 {
        return Err(Error::invalid(OP, "k", "at least one key", k.dims()));
    }
    if !scale.is_finite() {
        return Err(Error::invalid(OP, "scale", "finite", scale));
    }
    let mask = match mask {
        None => None,
        Some(m) => Some(mask_extents(m, q, [b, h, s_q, s_kv])?),
    };
    Ok(Sizes {
        b,
        h,
        h_k,
        h_v,
        s_q,
        s_kv,
        d,
        d_v,
        mask,
    })
}

/// The mask's batch and head extents, once it is checked to broadcast to the scores.
fn mask_extents(m: &Tensor, q: &Tensor, full: [usize; 4]) -> candle_core::Result<[usize; 2]> {
    match m.dtype() {
        DType::U8 | DType::F16 | DType::BF16 | DType::F32 | DType::F64 => {}
        dt => return Err(Error::dtype(OP, "mask", dt)),
    }
    same_device(OP, q, "q", m, "mask")?;
    let dims = m.dims();
    let fits = dims.len() <= 4
        && dims
            .iter()
            .rev()
            .zip(full.iter().rev())
            .all(|(&m, &f)| m == f || m == 1);
    if !fits {
        return Err(Error::invalid(
            OP,
            "mask",
            format!("broadcastable to the scores {full:?}"),
            dims,
        ));
    }
    let padded: Vec<usize> = std::iter::repeat_n(1, 4 - dims.len())
        .chain(dims.iter().copied())
        .collect();
    Ok([padded[0], padded[1]])
}

/// Whether cuDNN's fused engines take the problem: f16 or bf16 on a CUDA device, head
/// dimensions of 8 to 128 in steps of 8, and a bottom-right diagonal only without a mask and
/// with `s_q <= s_kv` (the engines take no bias with that diagonal).
fn fused_applies(q: &Tensor, sz: &Sizes, masked: bool, causal: Causal) -> bool {
    let head = |d: usize| d > 0 && d <= 128 && d.is_multiple_of(8);
    let diagonal = causal != Causal::BottomRight || (!masked && sz.s_q <= sz.s_kv);
    q.device().is_cuda()
        && matches!(q.dtype(), DType::F16 | DType::BF16)
        && head(sz.d)
        && head(sz.d_v)
        && diagonal
}

/// `t` as the fused engines read it: unit stride along the head dimension, no broadcast
/// (zero-stride) dimension, the other strides and the start 16-byte aligned. Itself when it
/// is, a packed copy otherwise.
fn ready(t: &Tensor) -> candle_core::Result<Tensor> {
    let st = t.stride();
    let vector = 16 / t.dtype().size_in_bytes();
    let fits =
        st[3] == 1 && st[..3].iter().all(|&s| s > 0 && s.is_multiple_of(vector)) && aligned(t);
    if fits {
        Ok(t.clone())
    } else {
        t.force_contiguous()
    }
}

/// The mask as the additive bias the fused engines read: `[b or 1, h or 1, s_q, s_kv]`, packed,
/// of the attention's dtype (a `u8` mask as 0 where 1 and −∞ where 0).
fn bias(m: &Tensor, sz: &Sizes, dtype: DType) -> candle_core::Result<Tensor> {
    let [mb, mh] = sz.mask.unwrap_or([1, 1]);
    let m = additive(m, dtype)?;
    m.broadcast_as((mb, mh, sz.s_q, sz.s_kv))?
        .force_contiguous()
}

/// A mask as values added to the scores, of `dtype`.
fn additive(m: &Tensor, dtype: DType) -> candle_core::Result<Tensor> {
    if m.dtype() == DType::U8 {
        let zero = Tensor::zeros(m.shape(), DType::F32, m.device())?;
        let minus = Tensor::full(f32::NEG_INFINITY, m.shape(), m.device())?;
        m.where_cond(&zero, &minus)?.to_dtype(dtype)
    } else {
        m.to_dtype(dtype)
    }
}

/// The causal mask `[s_q, s_kv]` (0 kept, −∞ masked) of `dtype`, if any.
fn causal_bias(
    causal: Causal,
    s_q: usize,
    s_kv: usize,
    dtype: DType,
    dev: &candle_core::Device,
) -> candle_core::Result<Option<Tensor>> {
    let shift = match causal {
        Causal::No => return Ok(None),
        Causal::TopLeft => 0i64,
        Causal::BottomRight => s_kv as i64 - s_q as i64,
    };
    let values: Vec<f32> = (0..s_q as i64)
        .flat_map(|i| {
            (0..s_kv as i64).map(move |j| {
                if j <= i + shift {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    let m = Tensor::from_vec(values, (s_q, s_kv), &candle_core::Device::Cpu)?;
    Ok(Some(m.to_dtype(dtype)?.to_device(dev)?))
}

/// `[b, n, s, d]` with each head repeated `times` times in place: `[b, n·times, s, d]`.
fn repeat_heads(t: &Tensor, times: usize) -> candle_core::Result<Tensor> {
    if times == 1 {
        return Ok(t.clone());
    }
    let (b, n, s, d) = t.dims4()?;
    t.unsqueeze(2)?
        .broadcast_as((b, n, times, s, d))?
        .reshape((b, n * times, s, d))
}

/// Attention as candle's matmul, softmax and matmul (the score matrix stored): what runs where
/// the fused engines do not.
fn composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: Causal,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let (h, s_q) = (q.dim(1)?, q.dim(2)?);
    let (h_k, s_kv, h_v) = (k.dim(1)?, k.dim(2)?, v.dim(1)?);
    let k = repeat_heads(k, h / h_k)?;
    let v = repeat_heads(v, h / h_v)?;
    let kt = k.transpose(2, 3)?.contiguous()?;
    let mut s = (q.contiguous()?.matmul(&kt)? * scale)?;
    if let Some(m) = mask {
        s = s.broadcast_add(&additive(m, s.dtype())?)?;
    }
    if let Some(c) = causal_bias(causal, s_q, s_kv, s.dtype(), s.device())? {
        s = s.broadcast_add(&c)?;
    }
    let p = if s.device().is_cuda() && s.dtype() != DType::F64 {
        crate::softmax_last_dim(&s)?
    } else {
        let e = s.broadcast_sub(&s.max_keepdim(3)?)?.exp()?;
        e.broadcast_div(&e.sum_keepdim(3)?)?
    };
    p.matmul(&v.contiguous()?)
}

/// The memory order of strides (slowest axis first): axes by decreasing stride, ties by
/// increasing axis index (the order the graph lays attention's outputs in).
fn stride_order(strides: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..strides.len()).collect();
    order.sort_by(|&a, &b| strides[b].cmp(&strides[a]).then(a.cmp(&b)));
    order
}

/// The permutation that takes a tensor of dims `dims[order]` back to `dims`.
fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; order.len()];
    for (j, &a) in order.iter().enumerate() {
        inv[a] = j;
    }
    inv
}

fn i64s(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&u| u as i64).collect()
}

/// The dims of a graph tensor in its memory order, after checking that its strides are packed
/// in that order (so a contiguous candle tensor of those dims is the same memory).
fn packed_order(g: &Graph, t: TensorId) -> cudnn_safe::Result<(Vec<usize>, Vec<usize>)> {
    let (dims, strides) = (g.dims(t)?.to_vec(), g.strides(t)?.to_vec());
    let as_usize: Vec<usize> = strides.iter().map(|&s| s.max(0) as usize).collect();
    let order = stride_order(&as_usize);
    let mut expect = vec![0i64; dims.len()];
    let mut acc = 1i64;
    for &a in order.iter().rev() {
        expect[a] = acc;
        acc = acc.saturating_mul(dims[a]);
    }
    let packed = dims
        .iter()
        .zip(strides.iter().zip(&expect))
        .all(|(&d, (&s, &e))| d == 1 || s == e);
    if !packed {
        return Err(cudnn_safe::Error::InvalidArgument {
            what: "attention output layout",
            expected: "strides packed in some order".into(),
            got: format!("{dims:?} with strides {strides:?}"),
        });
    }
    let mem_dims = order.iter().map(|&a| dims[a] as usize).collect();
    Ok((mem_dims, order))
}

/// A built graph, its plan and its tensors, kept per problem on a thread's handle.
struct Built {
    og: OperationGraph,
    plan: Plan,
    /// q, k, v, then the bias (if any), then the outputs.
    ids: Vec<TensorId>,
    /// The outputs' dims in memory order, and that order.
    outs: Vec<(Vec<usize>, Vec<usize>)>,
}

/// The fused forward pass as a candle operation of (q, k, v); it keeps the softmax statistics
/// for its backward pass when training.
struct Fused {
    causal: Causal,
    scale: f64,
    training: bool,
    bias: Option<Tensor>,
    /// q's memory order (the output's).
    order: Vec<usize>,
    sz: Sizes,
    stats: Mutex<Option<CudaSlice<f32>>>,
    /// Set when no plan could be built (the caller falls back to candle's operations).
    unsupported: Arc<AtomicBool>,
}

impl Fused {
    fn options(
        &self,
        g: &mut Graph,
        dtype: cudnn_safe::DType,
    ) -> cudnn_safe::Result<(SdpaOptions, Option<TensorId>)> {
        let mut opts = SdpaOptions::new().scale(self.scale);
        opts = match self.causal {
            Causal::No => opts,
            Causal::TopLeft => opts.causal(true),
            Causal::BottomRight => opts.causal_bottom_right(true),
        };
        let mut bias = None;
        if let (Some(_), Some([mb, mh])) = (&self.bias, self.sz.mask) {
            let dims = [
                mb as i64,
                mh as i64,
                self.sz.s_q as i64,
                self.sz.s_kv as i64,
            ];
            let t = g.tensor_nchw("bias", &dims, dtype)?;
            opts = opts.bias(t);
            bias = Some(t);
        }
        Ok((opts, bias))
    }

    /// A key naming everything the graph depends on.
    fn key(&self, pass: &str, dtype: DType, layouts: &[&Layout]) -> String {
        let mut key = format!(
            "{OP}-{pass}-{dtype:?}-{:?}-{:?}-{}-{}",
            self.sz,
            self.causal,
            self.scale.to_bits(),
            self.training
        );
        for l in layouts {
            key.push_str(&format!("-{:?}{:?}", l.dims(), l.stride()));
        }
        if pass == "bwd" {
            key.push_str(&format!("-{}", options().policy == Policy::Deterministic));
        }
        key
    }

    /// Builds a graph with `add` and its first heuristic plan; marks the problem unsupported
    /// (candle's operations run it) when the graph refuses the problem or cuDNN has no plan.
    /// The arguments were checked before: a refusal here is the fused graph's, not the
    /// caller's.
    fn build(
        &self,
        cudnn: &cudnn_safe::Cudnn,
        dtype: cudnn_safe::DType,
        add: impl FnOnce(&mut Graph) -> cudnn_safe::Result<(Vec<TensorId>, Vec<TensorId>)>,
    ) -> cudnn_safe::Result<Built> {
        let mut g = Graph::new(dtype, cudnn_safe::DType::F32, cudnn_safe::DType::F32);
        let planned = add(&mut g).and_then(|(ids, outs)| {
            let outs = outs
                .iter()
                .map(|&t| packed_order(&g, t))
                .collect::<cudnn_safe::Result<Vec<_>>>()?;
            let og = g.build(cudnn)?;
            let plan = og.plan(cudnn, &PlanFilter::default())?;
            Ok((og, plan, ids, outs))
        });
        match planned {
            Ok((og, plan, ids, outs)) => {
                log::debug!("{OP}: plan {}", plan.name());
                Ok(Built {
                    og,
                    plan,
                    ids,
                    outs,
                })
            }
            Err(e) => {
                self.unsupported.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn forward<T: Elem>(
        &self,
        qs: &CudaStorage,
        ql: &Layout,
        ks: &CudaStorage,
        kl: &Layout,
        vs: &CudaStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let dev = qs.device().clone();
        let dtype = T::DTYPE;
        let bias = self.bias.as_ref().map(|b| b.storage_and_layout());
        let bias_slice = match &bias {
            Some((s, l)) => Some((cuda_slice::<T>(s, OP, "mask")?, *l)),
            None => None,
        };
        let key = self.key("fwd", qs.dtype(), &[ql, kl, vl]);
        let none = format!("{key}-none");
        let (o, mem_dims) = with_held(&dev, |cudnn, held| {
            self.check_known(held, &none, "forward")?;
            let made = held.objects.get_or_make(key, || {
                self.build(cudnn, dtype, |g| {
                    let q = g.tensor("q", &i64s(ql.dims()), &i64s(ql.stride()), dtype)?;
                    let k = g.tensor("k", &i64s(kl.dims()), &i64s(kl.stride()), dtype)?;
                    let v = g.tensor("v", &i64s(vl.dims()), &i64s(vl.stride()), dtype)?;
                    let (opts, bias) = self.options(g, dtype)?;
                    let out = g.sdpa(q, k, v, &opts.training(self.training))?;
                    let mut ids = vec![q, k, v];
                    ids.extend(bias);
                    ids.push(out.o);
                    ids.extend(out.stats);
                    Ok((
                        ids,
                        [Some(out.o), out.stats].into_iter().flatten().collect(),
                    ))
                })
            });
            let built = match made {
                Ok(built) => built,
                Err(e) => return Err(self.remember(held, none, "forward", e)),
            };
            // The output is packed in q's memory order. Axes of extent 1 address nothing, so
            // their place in either order is arbitrary (their strides tie with a neighbour's).
            let o_dims = [self.sz.b, self.sz.h, self.sz.s_q, self.sz.d_v];
            let moving = |order: &[usize]| -> Vec<usize> {
                order.iter().copied().filter(|&a| o_dims[a] != 1).collect()
            };
            if moving(&built.outs[0].1) != moving(&self.order) {
                return Err(order_mismatch(&built.outs[0].1, &self.order));
            }
            let n_in = 3 + usize::from(self.bias.is_some());
            let span = |i: usize| built.og.span(built.ids[i]);
            let q = in_view(qs.as_cuda_slice::<T>(), ql, span(0)?, "q")?;
            let k = in_view(ks.as_cuda_slice::<T>(), kl, span(1)?, "k")?;
            let v = in_view(vs.as_cuda_slice::<T>(), vl, span(2)?, "v")?;
            let bias = match bias_slice {
                Some((s, l)) => Some(in_view(Ok(s), l, span(3)?, "mask")?),
                None => None,
            };
            let mut o = output::<T>(cudnn, span(n_in)?, "allocating the attention output")?;
            let mut stats = match self.training {
                true => Some(output::<f32>(
                    cudnn,
                    span(n_in + 1)?,
                    "allocating attention statistics",
                )?),
                false => None,
            };
            {
                let mut args = Args::new(cudnn);
                args.input(built.ids[0], &q)?
                    .input(built.ids[1], &k)?
                    .input(built.ids[2], &v)?;
                if let Some(b) = &bias {
                    args.input(built.ids[3], b)?;
                }
                args.output(built.ids[n_in], &mut o)?;
                if let Some(s) = stats.as_mut() {
                    args.output(built.ids[n_in + 1], s)?;
                }
                cudnn.execute(&built.plan, &args, &mut held.ws)?;
            }
            *self.stats.lock().unwrap_or_else(|p| p.into_inner()) = stats;
            Ok((o, permuted(&o_dims, &self.order)))
        })?;
        Ok((CudaStorage::wrap_cuda_slice(o, dev), Shape::from(mem_dims)))
    }

    /// dq, dk, dv from the forward's arguments, its output `o` (memory-ordered, packed) and
    /// the output's gradient `d_o` (the same).
    fn backward<T: Elem>(
        &self,
        [q, k, v]: [&Tensor; 3],
        o: &Tensor,
        d_o: &Tensor,
    ) -> candle_core::Result<[Tensor; 3]> {
        let guard = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let Some(stats) = guard.as_ref() else {
            return Err(Error::invalid(
                OP,
                "backward",
                "a forward pass run in training (an argument tracked by autograd)",
                "no saved statistics",
            ));
        };
        let dtype = T::DTYPE;
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (os, ol) = o.storage_and_layout();
        let (dos, dol) = d_o.storage_and_layout();
        let bias = self.bias.as_ref().map(|b| b.storage_and_layout());
        let bias_slice = match &bias {
            Some((s, l)) => Some((cuda_slice::<T>(s, OP, "mask")?, *l)),
            None => None,
        };
        let (qc, kc, vc) = (
            cuda_slice::<T>(&qs, OP, "q")?,
            cuda_slice::<T>(&ks, OP, "k")?,
            cuda_slice::<T>(&vs, OP, "v")?,
        );
        let (oc, doc) = (
            cuda_slice::<T>(&os, OP, "o")?,
            cuda_slice::<T>(&dos, OP, "grad")?,
        );
        let dev = cuda_device(&qs, OP, "q")?;
        // o and dO are packed in q's memory order: their logical strides follow from it.
        let o_dims = [self.sz.b, self.sz.h, self.sz.s_q, self.sz.d_v];
        let o_strides = strides_in(&o_dims, &self.order);
        for (l, arg) in [(ol, "o"), (dol, "grad")] {
            if !l.is_contiguous() || l.dims() != permuted(&o_dims, &self.order).as_slice() {
                return Err(Error::invalid(
                    OP,
                    arg,
                    "the forward output's packed layout",
                    l.dims(),
                ));
            }
        }
        let deterministic = options().policy == Policy::Deterministic;
        let key = self.key("bwd", q.dtype(), &[ql, kl, vl]);
        let none = format!("{key}-none");
        let grads = with_held(&dev, |cudnn, held| {
            self.check_known(held, &none, "backward")?;
            let made = held.objects.get_or_make(key, || {
                self.build(cudnn, dtype, |g| {
                    let q = g.tensor("q", &i64s(ql.dims()), &i64s(ql.stride()), dtype)?;
                    let k = g.tensor("k", &i64s(kl.dims()), &i64s(kl.stride()), dtype)?;
                    let v = g.tensor("v", &i64s(vl.dims()), &i64s(vl.stride()), dtype)?;
                    let (od, os) = (i64s(&o_dims), i64s(&o_strides));
                    let o = g.tensor("o", &od, &os, dtype)?;
                    let d_o = g.tensor("dO", &od, &os, dtype)?;
                    let stats_dims = [od[0], od[1], od[2], 1];
                    let stats = g.tensor_nchw("stats", &stats_dims, cudnn_safe::DType::F32)?;
                    let (opts, bias) = self.options(g, dtype)?;
                    let gr = g.sdpa_backward(
                        q,
                        k,
                        v,
                        o,
                        d_o,
                        stats,
                        &opts.deterministic(deterministic),
                    )?;
                    let mut ids = vec![q, k, v, o, d_o, stats];
                    ids.extend(bias);
                    ids.extend([gr.dq, gr.dk, gr.dv, gr.softmax_sum]);
                    ids.extend(gr.dq_accum);
                    Ok((ids, vec![gr.dq, gr.dk, gr.dv]))
                })
            });
            let built = match made {
                Ok(built) => built,
                Err(e) => return Err(self.remember(held, none, "backward", e)),
            };
            let n_in = 6 + usize::from(self.bias.is_some());
            let span = |i: usize| built.og.span(built.ids[i]);
            let q = in_view(Ok(qc), ql, span(0)?, "q")?;
            let k = in_view(Ok(kc), kl, span(1)?, "k")?;
            let v = in_view(Ok(vc), vl, span(2)?, "v")?;
            let o = in_view(Ok(oc), ol, span(3)?, "o")?;
            let d_o = in_view(Ok(doc), dol, span(4)?, "grad")?;
            let bias = match bias_slice {
                Some((s, l)) => Some(in_view(Ok(s), l, span(6)?, "mask")?),
                None => None,
            };
            let what = "allocating attention gradients";
            let mut dq = output::<T>(cudnn, span(n_in)?, what)?;
            let mut dk = output::<T>(cudnn, span(n_in + 1)?, what)?;
            let mut dv = output::<T>(cudnn, span(n_in + 2)?, what)?;
            let mut sum = output::<f32>(cudnn, span(n_in + 3)?, what)?;
            let mut accum = match built.ids.get(n_in + 4) {
                Some(_) => Some(output::<f32>(cudnn, span(n_in + 4)?, what)?),
                None => None,
            };
            {
                let mut args = Args::new(cudnn);
                args.input(built.ids[0], &q)?
                    .input(built.ids[1], &k)?
                    .input(built.ids[2], &v)?
                    .input(built.ids[3], &o)?
                    .input(built.ids[4], &d_o)?
                    .input(built.ids[5], stats)?;
                if let Some(b) = &bias {
                    args.input(built.ids[6], b)?;
                }
                args.output(built.ids[n_in], &mut dq)?
                    .output(built.ids[n_in + 1], &mut dk)?
                    .output(built.ids[n_in + 2], &mut dv)?
                    .output(built.ids[n_in + 3], &mut sum)?;
                if let Some(a) = accum.as_mut() {
                    args.output(built.ids[n_in + 4], a)?;
                }
                cudnn.execute(&built.plan, &args, &mut held.ws)?;
            }
            Ok([dq, dk, dv]
                .into_iter()
                .zip(built.outs.clone())
                .collect::<Vec<_>>())
        })?;
        let mut out = Vec::with_capacity(3);
        for (slice, (mem_dims, order)) in grads {
            out.push(tensor(slice, &dev, mem_dims).permute(inverse(&order))?);
        }
        let [dq, dk, dv]: [Tensor; 3] = out
            .try_into()
            .map_err(|_| Error::invalid(OP, "backward", "three gradients", "fewer"))?;
        Ok([dq, dk, dv])
    }
}

impl Fused {
    /// `Err` (marking the problem unsupported, so that the caller runs candle's operations)
    /// when an earlier call remembered under `none` that cuDNN has no plan for this `pass`.
    fn check_known(&self, held: &Held, none: &str, pass: &str) -> cudnn_safe::Result<()> {
        if !held.objects.contains(none) {
            return Ok(());
        }
        self.unsupported.store(true, Ordering::Relaxed);
        Err(cudnn_safe::Error::NoEngine {
            graph: format!("scaled dot-product attention {pass}"),
            detail: "an earlier call of this problem found no plan".into(),
        })
    }

    /// `e`, from building the `pass` graph; when that marked the problem unsupported, also
    /// remembered under `none` (later calls go straight to candle's operations), with one
    /// warning.
    fn remember(
        &self,
        held: &mut Held,
        none: String,
        pass: &str,
        e: cudnn_safe::Error,
    ) -> cudnn_safe::Error {
        if self.unsupported.load(Ordering::Relaxed) {
            log::warn!(
                "{OP}: no fused cuDNN {pass} plan for {:?}, candle's operations run it: {e}",
                self.sz
            );
            held.objects.insert(none, NoPlan);
        }
        e
    }

    /// dq, dk, dv by candle's autograd of [`composed`] on copies of the arguments, where cuDNN
    /// has no fused backward plan for a problem whose forward ran fused. `d_o` is the output's
    /// gradient in the forward output's memory order.
    fn composed_backward(
        &self,
        [q, k, v]: [&Tensor; 3],
        d_o: &Tensor,
    ) -> candle_core::Result<[Tensor; 3]> {
        let (qv, kv, vv) = (
            Var::from_tensor(&q.detach())?,
            Var::from_tensor(&k.detach())?,
            Var::from_tensor(&v.detach())?,
        );
        let o = composed(
            qv.as_tensor(),
            kv.as_tensor(),
            vv.as_tensor(),
            self.bias.as_ref(),
            self.causal,
            self.scale,
        )?;
        let d_o = d_o.permute(inverse(&self.order))?;
        let grads = (o * d_o)?.sum_all()?.backward()?;
        let grad = |v: &Var, arg: &'static str| {
            grads
                .get(v.as_tensor())
                .cloned()
                .ok_or_else(|| Error::invalid(OP, arg, "a gradient", "none"))
        };
        Ok([grad(&qv, "q")?, grad(&kv, "k")?, grad(&vv, "v")?])
    }
}

fn order_mismatch(got: &[usize], want: &[usize]) -> cudnn_safe::Error {
    cudnn_safe::Error::InvalidArgument {
        what: "attention output memory order",
        expected: format!("q's {want:?}"),
        got: format!("{got:?}"),
    }
}

/// Packed strides of `dims` laid out in `order` (slowest axis first).
fn strides_in(dims: &[usize], order: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; dims.len()];
    let mut acc = 1;
    for &a in order.iter().rev() {
        strides[a] = acc;
        acc *= dims[a];
    }
    strides
}

fn permuted(dims: &[usize], order: &[usize]) -> Vec<usize> {
    order.iter().map(|&a| dims[a]).collect()
}

/// The `span` elements a layout reaches from its offset, checked to lie within the storage.
fn in_view<'a, T>(
    s: candle_core::Result<&'a CudaSlice<T>>,
    l: &Layout,
    span: usize,
    arg: &'static str,
) -> cudnn_safe::Result<cudnn_safe::cudarc::driver::CudaView<'a, T>> {
    let s = s.map_err(|e| cudnn_safe::Error::InvalidArgument {
        what: "attention argument storage",
        expected: format!("the dtype of `{arg}`"),
        got: e.to_string(),
    })?;
    let start = l.start_offset();
    view(s, start..start + span, OP, arg).map_err(|e| cudnn_safe::Error::InvalidArgument {
        what: "attention argument layout",
        expected: format!("`{arg}` within its storage"),
        got: e.to_string(),
    })
}

impl CustomOp3 for Fused {
    fn name(&self) -> &'static str {
        "cudnn-safe-sdpa"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(Error::invalid(
            OP,
            "device",
            "a CUDA device for the fused operation (sdpa runs candle's own on the CPU)",
            "cpu",
        ))
    }

    fn cuda_fwd(
        &self,
        qs: &CudaStorage,
        ql: &Layout,
        ks: &CudaStorage,
        kl: &Layout,
        vs: &CudaStorage,
        vl: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        match qs.dtype() {
            DType::F16 => self.forward::<f16>(qs, ql, ks, kl, vs, vl),
            DType::BF16 => self.forward::<bf16>(qs, ql, ks, kl, vs, vl),
            d => Err(Error::dtype(OP, "q", d)),
        }
    }

    /// cuDNN's fused backward pass, from the statistics the forward kept.
    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let fused = match q.dtype() {
            DType::F16 => self.backward::<f16>([q, k, v], o, &grad),
            DType::BF16 => self.backward::<bf16>([q, k, v], o, &grad),
            d => return Err(Error::dtype(OP, "q", d)),
        };
        let [dq, dk, dv] = match fused {
            Ok(grads) => grads,
            Err(e) if self.unsupported.load(Ordering::Relaxed) => {
                log::debug!("{OP}: gradients by candle's operations: {e}");
                self.composed_backward([q, k, v], &grad)?
            }
            Err(e) => return Err(e),
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
