//! cudnn-safe-candle against float64 references on random inputs: convolution forward and
//! backward (every dtype, strides, padding, dilation, groups, 1-D, strided inputs), softmax,
//! attention (GQA, causal alignments, masks, strided views) forward and backward, layer and RMS
//! norm forward and backward, and the fused inference convolution with batch-norm folding.
//! GPU tests skip without a GPU (`Device::new_cuda(0)` fails), and fail instead with
//! `CUDNN_SAFE_REQUIRE_GPU=1`. Argument checks and the CPU path run everywhere.
use candle_core::{DType, Device, Tensor, Var, D};
use cudnn_safe_candle::{
    conv1d, conv2d, conv2d_fused, conv2d_with, fold_batch_norm, layer_norm, rms_norm, sdpa,
    softmax_last_dim, Causal, Conv2dParams, Error,
};

fn cuda() -> Option<Device> {
    // RUST_LOG=cudnn_safe_candle=debug shows the plans (and any fallback to candle's operations).
    let _ = env_logger::builder().is_test(true).try_init();
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("CUDNN_SAFE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("CUDNN_SAFE_REQUIRE_GPU=1 but no CUDA device: {e}")
        }
        Err(e) => {
            eprintln!(
                "skipping: no CUDA device ({})",
                e.to_string().lines().next().unwrap_or("")
            );
            None
        }
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// A random tensor of `dims` in `dtype` on `dev`, and the same (rounded) values in f64 on the CPU.
fn random(dims: &[usize], dtype: DType, dev: &Device, seed: u64) -> (Tensor, Tensor) {
    let n = dims.iter().product();
    let t = Tensor::from_vec(values(n, seed), dims, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let reference = t.to_dtype(DType::F64).unwrap();
    (t.to_device(dev).unwrap(), reference)
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// ‖a − b‖ / ‖b‖ (NaN when anything is not finite).
fn rel_l2(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let (a, b) = (flat(a), flat(b));
    if a.iter().chain(&b).any(|v| !v.is_finite()) {
        return f64::NAN;
    }
    let d: f64 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum();
    let r: f64 = b.iter().map(|y| y * y).sum();
    (d / r.max(f64::MIN_POSITIVE)).sqrt()
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    }
}

/// A convolution case: x and w dims and the parameters (equal in both dimensions, so candle's
/// CPU convolution in f64 is the reference).
struct Case {
    x: [usize; 4],
    w: [usize; 4],
    padding: usize,
    stride: usize,
    dilation: usize,
    groups: usize,
}

const CASES: &[Case] = &[
    Case {
        x: [2, 3, 17, 13],
        w: [5, 3, 3, 3],
        padding: 1,
        stride: 1,
        dilation: 1,
        groups: 1,
    },
    Case {
        x: [3, 8, 15, 16],
        w: [6, 4, 3, 3],
        padding: 2,
        stride: 2,
        dilation: 2,
        groups: 2,
    },
    Case {
        x: [1, 6, 9, 11],
        w: [6, 1, 5, 5],
        padding: 2,
        stride: 1,
        dilation: 1,
        groups: 6,
    },
    Case {
        x: [4, 16, 7, 7],
        w: [32, 16, 1, 1],
        padding: 0,
        stride: 1,
        dilation: 1,
        groups: 1,
    },
    Case {
        x: [2, 4, 12, 10],
        w: [8, 4, 4, 2],
        padding: 0,
        stride: 3,
        dilation: 1,
        groups: 1,
    },
];

/// `y = conv(x, w)` for case `c` by its definition in f64, and the gradients of `Σ y ⊙ g`:
/// `dx` and `dw`.
fn reference_conv(c: &Case, x: &Tensor, w: &Tensor, g: &Tensor) -> (Tensor, Tensor, Tensor) {
    let (xv, wv, gv) = (flat(x), flat(w), flat(g));
    let [n, ci, h, wd] = c.x;
    let [k, cg, kh, kw] = c.w;
    let (oh, ow) = (g.dims()[2], g.dims()[3]);
    let kg = k / c.groups;
    let (mut y, mut dx, mut dw) = (
        vec![0.0; n * k * oh * ow],
        vec![0.0; xv.len()],
        vec![0.0; wv.len()],
    );
    for b in 0..n {
        for o in 0..k {
            let group = o / kg;
            for (p, q) in (0..oh).flat_map(|p| (0..ow).map(move |q| (p, q))) {
                let yi = ((b * k + o) * oh + p) * ow + q;
                for cc in 0..cg {
                    let ch = group * cg + cc;
                    for (r, t) in (0..kh).flat_map(|r| (0..kw).map(move |t| (r, t))) {
                        let ih = (p * c.stride + r * c.dilation) as i64 - c.padding as i64;
                        let iw = (q * c.stride + t * c.dilation) as i64 - c.padding as i64;
                        if ih < 0 || iw < 0 || ih >= h as i64 || iw >= wd as i64 {
                            continue;
                        }
                        let xi = ((b * ci + ch) * h + ih as usize) * wd + iw as usize;
                        let wi = ((o * cg + cc) * kh + r) * kw + t;
                        y[yi] += xv[xi] * wv[wi];
                        dx[xi] += gv[yi] * wv[wi];
                        dw[wi] += gv[yi] * xv[xi];
                    }
                }
            }
        }
    }
    let t = |v: Vec<f64>, d: &[usize]| Tensor::from_vec(v, d, &Device::Cpu).unwrap();
    (t(y, g.dims()), t(dx, &c.x), t(dw, &c.w))
}

#[test]
fn conv2d_forward_and_backward_match_f64_in_every_dtype() {
    let Some(dev) = cuda() else { return };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (i, c) in CASES.iter().enumerate() {
            let seed = 10 * i as u64;
            let (x, x64) = random(&c.x, dtype, &dev, seed);
            let (w, w64) = random(&c.w, dtype, &dev, seed + 1);
            // Forward and backward on the GPU: loss = Σ y ⊙ g.
            let xv = Var::from_tensor(&x).unwrap();
            let wv = Var::from_tensor(&w).unwrap();
            let y = conv2d(
                xv.as_tensor(),
                wv.as_tensor(),
                c.padding,
                c.stride,
                c.dilation,
                c.groups,
            )
            .unwrap();
            let (g, g64) = random(y.dims(), dtype, &dev, seed + 2);
            let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
            // The reference: a direct f64 convolution and its gradients (candle's own CPU
            // backward mis-shapes dx for some strided, dilated, grouped cases).
            let (yr, dxr, dwr) = reference_conv(c, &x64, &w64, &g64);
            let tol = tolerance(dtype);
            let what = format!("{dtype:?} case {i} x {:?} w {:?}", c.x, c.w);
            let e = rel_l2(&y, &yr);
            assert!(e <= tol, "{what}: y error {e:e}");
            let dx = grads.get(xv.as_tensor()).expect("dx");
            let dw = grads.get(wv.as_tensor()).expect("dw");
            assert_eq!(dx.dtype(), dtype);
            let e = rel_l2(dx, &dxr);
            assert!(e <= tol, "{what}: dx error {e:e}");
            // dw sums over the batch and the output pixels: allow for the accumulation.
            let e = rel_l2(dw, &dwr);
            assert!(e <= 2.0 * tol, "{what}: dw error {e:e}");
        }
    }
}

#[test]
fn conv2d_takes_strided_inputs_and_per_dimension_parameters() {
    let Some(dev) = cuda() else { return };
    // x stored as [n, h, c, w] and viewed as [n, c, h, w]: strides go to cuDNN as they are.
    let (stored, stored64) = random(&[2, 9, 4, 11], DType::F32, &dev, 5);
    let x = stored.transpose(1, 2).unwrap();
    let x64 = stored64.transpose(1, 2).unwrap();
    assert!(!x.is_contiguous());
    let (w, w64) = random(&[3, 4, 3, 2], DType::F32, &dev, 6);
    let y = conv2d(&x, &w, 1, 1, 1, 1).unwrap();
    let yr = x64.conv2d(&w64, 1, 1, 1, 1).unwrap();
    let e = rel_l2(&y, &yr);
    assert!(e <= 1e-5, "strided x: {e:e}");
    // A narrowed view (a storage offset).
    let xn = x.narrow(0, 1, 1).unwrap();
    let y = conv2d(&xn, &w, 0, 1, 1, 1).unwrap();
    let yr = x64
        .narrow(0, 1, 1)
        .unwrap()
        .conv2d(&w64, 0, 1, 1, 1)
        .unwrap();
    assert!(rel_l2(&y, &yr) <= 1e-5);
    // A batch axis of extent 1 made by `broadcast_left` (stride 0, which candle calls
    // contiguous): copied packed for cuDNN, the gradient reaching the unbatched tensor.
    let (img, img64) = random(&[4, 9, 11], DType::F32, &dev, 8);
    let (iv, iv64) = (
        Var::from_tensor(&img).unwrap(),
        Var::from_tensor(&img64).unwrap(),
    );
    let xb = iv.as_tensor().broadcast_left(1).unwrap();
    assert_eq!(xb.stride()[0], 0);
    let y = conv2d(&xb, &w, 1, 1, 1, 1).unwrap();
    let yr = iv64
        .as_tensor()
        .unsqueeze(0)
        .unwrap()
        .conv2d(&w64, 1, 1, 1, 1)
        .unwrap();
    let e = rel_l2(&y, &yr);
    assert!(e <= 1e-5, "broadcast x: {e:e}");
    let grads = y.sum_all().unwrap().backward().unwrap();
    let grads_r = yr.sum_all().unwrap().backward().unwrap();
    let e = rel_l2(
        grads.get(iv.as_tensor()).unwrap(),
        grads_r.get(iv64.as_tensor()).unwrap(),
    );
    assert!(e <= 1e-5, "broadcast x, dx: {e:e}");
    // The same in 1-D: `[c, l]` broadcast to `[1, c, l]`.
    let (seq, seq64) = random(&[4, 30], DType::F32, &dev, 9);
    let (w1, w164) = random(&[3, 4, 5], DType::F32, &dev, 10);
    let y = conv1d(&seq.broadcast_left(1).unwrap(), &w1, 2, 1, 1, 1).unwrap();
    let yr = seq64
        .unsqueeze(0)
        .unwrap()
        .conv1d(&w164, 2, 1, 1, 1)
        .unwrap();
    let e = rel_l2(&y, &yr);
    assert!(e <= 1e-5, "broadcast 1-D x: {e:e}");
    // Per-dimension padding, stride and dilation: the reference pads by hand and subsamples.
    let p = Conv2dParams::new()
        .padding([2, 0])
        .stride([1, 2])
        .dilation([2, 1]);
    let (x, x64) = random(&[1, 4, 10, 9], DType::F32, &dev, 7);
    let y = conv2d_with(&x, &w, &p).unwrap();
    let padded = x64.pad_with_zeros(2, 2, 2).unwrap();
    // Dilation 2 in height: the kernel's rows spread out (zeros between them).
    let wd = {
        let rows: Vec<Tensor> = (0..3)
            .flat_map(|r| {
                let row = w64.narrow(2, r, 1).unwrap();
                if r < 2 {
                    vec![row.clone(), row.zeros_like().unwrap()]
                } else {
                    vec![row]
                }
            })
            .collect();
        Tensor::cat(&rows, 2).unwrap()
    };
    let full = padded.conv2d(&wd, 0, 1, 1, 1).unwrap();
    // Stride 2 in width: every second column.
    let cols: Vec<u32> = (0..full.dim(3).unwrap() as u32).step_by(2).collect();
    let n = cols.len();
    let cols = Tensor::from_vec(cols, n, &Device::Cpu).unwrap();
    let yr = full.index_select(&cols, 3).unwrap();
    assert_eq!(y.dims(), yr.dims());
    let e = rel_l2(&y, &yr);
    assert!(e <= 1e-5, "per-dimension parameters: {e:e}");
}

#[test]
fn conv1d_matches_f64_forward_and_backward() {
    let Some(dev) = cuda() else { return };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (x, x64) = random(&[3, 6, 40], dtype, &dev, 11);
        let (w, w64) = random(&[4, 3, 5], dtype, &dev, 12);
        let xv = Var::from_tensor(&x).unwrap();
        let y = conv1d(xv.as_tensor(), &w, 2, 2, 1, 2).unwrap();
        let yr = x64.conv1d(&w64, 2, 2, 1, 2).unwrap();
        assert_eq!(y.dims(), yr.dims());
        let tol = tolerance(dtype);
        let e = rel_l2(&y, &yr);
        assert!(e <= tol, "{dtype:?} conv1d: {e:e}");
        let grads = y.sum_all().unwrap().backward().unwrap();
        let xr = Var::from_tensor(&x64).unwrap();
        let gr = xr
            .as_tensor()
            .conv1d(&w64, 2, 2, 1, 2)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let e = rel_l2(
            grads.get(xv.as_tensor()).unwrap(),
            gr.get(xr.as_tensor()).unwrap(),
        );
        assert!(e <= tol, "{dtype:?} conv1d dx: {e:e}");
    }
}

#[test]
fn softmax_matches_f64_forward_and_backward() {
    let Some(dev) = cuda() else { return };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (x, x64) = random(&[5, 7, 33], dtype, &dev, 21);
        let x = (x * 4.0).unwrap();
        let x64 = (x64 * 4.0).unwrap();
        let xv = Var::from_tensor(&x).unwrap();
        let y = softmax_last_dim(xv.as_tensor()).unwrap();
        let m = x64.max_keepdim(D::Minus1).unwrap();
        let ex = x64.broadcast_sub(&m).unwrap().exp().unwrap();
        let yr = ex
            .broadcast_div(&ex.sum_keepdim(D::Minus1).unwrap())
            .unwrap();
        let tol = tolerance(dtype);
        assert!(rel_l2(&y, &yr) <= tol, "{dtype:?} softmax");
        let (g, g64) = random(y.dims(), dtype, &dev, 22);
        let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
        let dot = (&yr * &g64).unwrap().sum_keepdim(D::Minus1).unwrap();
        let dxr = (&yr * g64.broadcast_sub(&dot).unwrap()).unwrap();
        let e = rel_l2(grads.get(xv.as_tensor()).unwrap(), &dxr);
        assert!(e <= 2.0 * tol, "{dtype:?} softmax dx: {e:e}");
        // A transposed input is made contiguous first.
        let t = x.transpose(0, 1).unwrap();
        let yt = softmax_last_dim(&t).unwrap();
        assert!(rel_l2(&yt, &yr.transpose(0, 1).unwrap()) <= tol);
    }
}

/// The argument named by this crate's error inside `r`.
fn refused(r: candle_core::Result<Tensor>) -> &'static str {
    let e = r.expect_err("refused");
    match Error::of(&e) {
        Some(Error::InvalidArgument { arg, .. }) => arg,
        Some(Error::UnsupportedDType { arg, .. }) => arg,
        other => panic!("not this crate's error: {other:?} ({e})"),
    }
}

#[test]
fn bad_arguments_are_refused_naming_them_on_any_device() {
    let mut devices = vec![Device::Cpu];
    if let Some(d) = cuda() {
        devices.push(d);
    }
    for dev in &devices {
        let x = Tensor::zeros((2, 4, 8, 8), DType::F32, dev).unwrap();
        let w = Tensor::zeros((6, 2, 3, 3), DType::F32, dev).unwrap();
        assert_eq!(refused(conv2d(&x, &w, 1, 1, 1, 1)), "w"); // 2 input channels, x has 4
        assert_eq!(refused(conv2d(&x, &w, 1, 1, 1, 0)), "groups");
        assert_eq!(refused(conv2d(&x, &w, 1, 0, 1, 2)), "stride");
        assert_eq!(refused(conv2d(&x, &w, 1, 1, 0, 2)), "dilation");
        assert_eq!(refused(conv2d(&x, &w, 1, 1, 1, 4)), "w"); // 6 outputs, 4 groups
        let w16 = w.to_dtype(DType::F16).unwrap();
        assert_eq!(refused(conv2d(&x, &w16, 1, 1, 1, 2)), "w");
        let xi = x.to_dtype(DType::U32).unwrap();
        assert_eq!(refused(conv2d(&xi, &w, 1, 1, 1, 2)), "x");
        let x3 = Tensor::zeros((2, 4, 8), DType::F32, dev).unwrap();
        assert_eq!(refused(conv2d(&x3, &w, 1, 1, 1, 2)), "x");
        let big = Tensor::zeros((6, 2, 11, 11), DType::F32, dev).unwrap();
        assert_eq!(refused(conv2d(&x, &big, 1, 1, 1, 2)), "x"); // kernel larger than x
        assert_eq!(refused(softmax_last_dim(&xi)), "x");
        // Good arguments run (on the CPU, candle's own convolution).
        let y = conv2d(&x, &w, 1, 1, 1, 2).unwrap();
        assert_eq!(y.dims(), &[2, 6, 8, 8]);
    }
}

#[test]
fn cpu_tensors_run_candles_own_operations() {
    let (x, _) = random(&[2, 3, 9, 9], DType::F32, &Device::Cpu, 31);
    let (w, _) = random(&[4, 3, 3, 3], DType::F32, &Device::Cpu, 32);
    let y = conv2d(&x, &w, 1, 2, 1, 1).unwrap();
    let want = x.conv2d(&w, 1, 2, 1, 1).unwrap();
    assert_eq!(flat(&y), flat(&want));
    let p = softmax_last_dim(&x).unwrap();
    let sums = flat(&p.sum_keepdim(D::Minus1).unwrap());
    assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-5), "{sums:?}");
    // Unequal parameters have no CPU implementation: refused, naming them.
    let p = Conv2dParams::new().padding([1, 0]);
    assert_eq!(refused(conv2d_with(&x, &w, &p)), "params");
}

#[test]
fn the_f64_reference_agrees_with_candles_cpu_convolution() {
    for (i, c) in CASES.iter().enumerate() {
        let (x, _) = random(&c.x, DType::F64, &Device::Cpu, 40 + i as u64);
        let (w, _) = random(&c.w, DType::F64, &Device::Cpu, 50 + i as u64);
        let xv = Var::from_tensor(&x).unwrap();
        let wv = Var::from_tensor(&w).unwrap();
        let y = xv
            .as_tensor()
            .conv2d(wv.as_tensor(), c.padding, c.stride, c.dilation, c.groups)
            .unwrap();
        let (g, _) = random(y.dims(), DType::F64, &Device::Cpu, 60 + i as u64);
        let (yr, dxr, dwr) = reference_conv(c, &x, &w, &g);
        assert!(rel_l2(&y, &yr) < 1e-12, "case {i}");
        // candle's own backward where its shapes come out right (stride 1).
        if c.stride == 1 {
            let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
            assert!(
                rel_l2(grads.get(xv.as_tensor()).unwrap(), &dxr) < 1e-12,
                "case {i} dx"
            );
            assert!(
                rel_l2(grads.get(wv.as_tensor()).unwrap(), &dwr) < 1e-12,
                "case {i} dw"
            );
        }
    }
}

/// An attention case: sizes, mask, causal alignment, and whether q, k, v are strided views of
/// `[b, s, h, d]` tensors (as after a projection) rather than packed `[b, h, s, d]`.
#[derive(Debug, Clone, Copy)]
struct Attn {
    b: usize,
    h: usize,
    h_kv: usize,
    s_q: usize,
    s_kv: usize,
    d: usize,
    d_v: usize,
    causal: Causal,
    mask: Mask,
    bshd: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mask {
    None,
    /// Additive float values `[1, h, s_q, s_kv]`.
    Float,
    /// A u8 keep-mask `[b, 1, s_q, s_kv]` (column 0 always kept).
    Bool,
}

const ATTN: &[Attn] = &[
    Attn {
        b: 2,
        h: 4,
        h_kv: 4,
        s_q: 33,
        s_kv: 33,
        d: 64,
        d_v: 64,
        causal: Causal::TopLeft,
        mask: Mask::None,
        bshd: false,
    },
    Attn {
        b: 1,
        h: 8,
        h_kv: 2,
        s_q: 17,
        s_kv: 40,
        d: 64,
        d_v: 64,
        causal: Causal::BottomRight,
        mask: Mask::None,
        bshd: true,
    },
    Attn {
        b: 2,
        h: 2,
        h_kv: 1,
        s_q: 24,
        s_kv: 50,
        d: 32,
        d_v: 32,
        causal: Causal::TopLeft,
        mask: Mask::Float,
        bshd: true,
    },
    Attn {
        b: 3,
        h: 2,
        h_kv: 2,
        s_q: 9,
        s_kv: 31,
        d: 128,
        d_v: 128,
        causal: Causal::No,
        mask: Mask::Bool,
        bshd: false,
    },
    // The bottom-right diagonal with a mask: the fused engines take no bias with that
    // diagonal, candle's operations run it.
    Attn {
        b: 2,
        h: 2,
        h_kv: 2,
        s_q: 16,
        s_kv: 24,
        d: 64,
        d_v: 64,
        causal: Causal::BottomRight,
        mask: Mask::Float,
        bshd: false,
    },
    // Head dimension 20: not a multiple of 8, candle's operations run it.
    Attn {
        b: 2,
        h: 2,
        h_kv: 2,
        s_q: 12,
        s_kv: 12,
        d: 20,
        d_v: 20,
        causal: Causal::TopLeft,
        mask: Mask::None,
        bshd: false,
    },
];

/// A random attention argument `[b, n, s, d]` (a transposed `[b, s, n, d]` one when `bshd`),
/// the f64 copy alike, and the variables to take gradients of.
fn attn_arg(
    c: &Attn,
    n: usize,
    s: usize,
    d: usize,
    dtype: DType,
    dev: &Device,
    seed: u64,
) -> (Var, Tensor, Var, Tensor) {
    let dims = if c.bshd {
        [c.b, s, n, d]
    } else {
        [c.b, n, s, d]
    };
    let (t, r) = random(&dims, dtype, dev, seed);
    let (tv, rv) = (Var::from_tensor(&t).unwrap(), Var::from_tensor(&r).unwrap());
    let view = |v: &Var| {
        if c.bshd {
            v.as_tensor().transpose(1, 2).unwrap()
        } else {
            v.as_tensor().clone()
        }
    };
    let (x, xr) = (view(&tv), view(&rv));
    (tv, x, rv, xr)
}

/// The mask of a case, in `dtype` (u8 for a keep-mask), on `dev`, and as additive f64 values
/// on the CPU.
fn attn_mask(c: &Attn, dtype: DType, dev: &Device) -> Option<(Tensor, Tensor)> {
    match c.mask {
        Mask::None => None,
        Mask::Float => {
            let (m, r) = random(&[1, c.h, c.s_q, c.s_kv], dtype, dev, 77);
            Some((m, r))
        }
        Mask::Bool => {
            let n = c.b * c.s_q * c.s_kv;
            let keep: Vec<u8> = values(n, 78)
                .iter()
                .enumerate()
                .map(|(i, v)| u8::from(i % c.s_kv == 0 || *v > -0.3))
                .collect();
            let add: Vec<f64> = keep
                .iter()
                .map(|&k| if k == 1 { 0.0 } else { f64::NEG_INFINITY })
                .collect();
            let dims = [c.b, 1, c.s_q, c.s_kv];
            let m = Tensor::from_vec(keep, &dims, &Device::Cpu)
                .unwrap()
                .to_device(dev)
                .unwrap();
            Some((m, Tensor::from_vec(add, &dims, &Device::Cpu).unwrap()))
        }
    }
}

/// Attention in f64 on the CPU: each query head's key and value heads gathered by index, the
/// mask added, the causal mask applied element by element, softmax, and the product.
fn reference_attention(
    c: &Attn,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Tensor {
    let group = |n: usize| {
        let idx: Vec<u32> = (0..c.h).map(|i| (i / (c.h / n)) as u32).collect();
        Tensor::new(idx, &Device::Cpu).unwrap()
    };
    let k = k
        .contiguous()
        .unwrap()
        .index_select(&group(c.h_kv), 1)
        .unwrap();
    let v = v
        .contiguous()
        .unwrap()
        .index_select(&group(c.h_kv), 1)
        .unwrap();
    let kt = k.transpose(2, 3).unwrap().contiguous().unwrap();
    let mut s = (q.contiguous().unwrap().matmul(&kt).unwrap() * scale).unwrap();
    if let Some(m) = mask {
        s = s.broadcast_add(m).unwrap();
    }
    let shift = match c.causal {
        Causal::BottomRight => Some(c.s_kv as i64 - c.s_q as i64),
        Causal::TopLeft => Some(0),
        _ => None,
    };
    if let Some(shift) = shift {
        let keep: Vec<f64> = (0..c.s_q as i64)
            .flat_map(|i| {
                (0..c.s_kv as i64).map(move |j| {
                    if j <= i + shift {
                        0.0
                    } else {
                        f64::NEG_INFINITY
                    }
                })
            })
            .collect();
        let m = Tensor::from_vec(keep, (c.s_q, c.s_kv), &Device::Cpu).unwrap();
        s = s.broadcast_add(&m).unwrap();
    }
    let e = s
        .broadcast_sub(&s.max_keepdim(3).unwrap())
        .unwrap()
        .exp()
        .unwrap();
    let p = e.broadcast_div(&e.sum_keepdim(3).unwrap()).unwrap();
    p.matmul(&v.contiguous().unwrap()).unwrap()
}

#[test]
fn sdpa_matches_f64_forward_and_backward() {
    let Some(dev) = cuda() else { return };
    for (i, c) in ATTN.iter().enumerate() {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let seed = 100 + 10 * i as u64;
            let (qv, q, qrv, qr) = attn_arg(c, c.h, c.s_q, c.d, dtype, &dev, seed);
            let (kv, k, krv, kr) = attn_arg(c, c.h_kv, c.s_kv, c.d, dtype, &dev, seed + 1);
            let (vv, v, vrv, vr) = attn_arg(c, c.h_kv, c.s_kv, c.d_v, dtype, &dev, seed + 2);
            let mask = attn_mask(c, dtype, &dev);
            let scale = 1.0 / (c.d as f64).sqrt();
            let o = sdpa(&q, &k, &v, mask.as_ref().map(|m| &m.0), c.causal, scale).unwrap();
            let or = reference_attention(c, &qr, &kr, &vr, mask.as_ref().map(|m| &m.1), scale);
            let tol = tolerance(dtype).max(1e-4);
            let e = rel_l2(&o, &or);
            assert!(e <= tol, "case {i} {dtype:?} o: {e:e}");
            let (g, gr) = random(o.dims(), dtype, &dev, seed + 3);
            let grads = (&o * &g).unwrap().sum_all().unwrap().backward().unwrap();
            let grads_r = (&or * &gr).unwrap().sum_all().unwrap().backward().unwrap();
            for (name, a, b) in [("dq", &qv, &qrv), ("dk", &kv, &krv), ("dv", &vv, &vrv)] {
                let got = grads.get(a.as_tensor()).unwrap();
                let want = grads_r.get(b.as_tensor()).unwrap();
                let e = rel_l2(got, want);
                assert!(e <= 2.0 * tol, "case {i} {dtype:?} {name}: {e:e}");
            }
        }
    }
}

#[test]
fn sdpa_on_the_cpu_matches_the_reference() {
    for (i, c) in ATTN.iter().enumerate() {
        let dev = Device::Cpu;
        let (_, q, _, qr) = attn_arg(c, c.h, c.s_q, c.d, DType::F64, &dev, 200 + i as u64);
        let (_, k, _, kr) = attn_arg(c, c.h_kv, c.s_kv, c.d, DType::F64, &dev, 210 + i as u64);
        let (_, v, _, vr) = attn_arg(c, c.h_kv, c.s_kv, c.d_v, DType::F64, &dev, 220 + i as u64);
        let mask = attn_mask(c, DType::F64, &dev);
        let o = sdpa(&q, &k, &v, mask.as_ref().map(|m| &m.0), c.causal, 0.3).unwrap();
        let or = reference_attention(c, &qr, &kr, &vr, mask.as_ref().map(|m| &m.1), 0.3);
        assert!(rel_l2(&o, &or) < 1e-12, "case {i}");
    }
}

/// q, k and v as views of one packed `[b, s, 3, h, d]` projection (narrow, squeeze, transpose),
/// with axes of extent 1 (one head, one query, one batch entry), whose strides tie with a
/// neighbour's: forward and the gradient of the projection against f64.
#[test]
fn sdpa_takes_packed_qkv_views_with_axes_of_extent_one() {
    let Some(dev) = cuda() else { return };
    let d = 64;
    for (i, &(b, h, s)) in [(2usize, 1usize, 24usize), (1, 1, 16), (2, 4, 1), (1, 2, 9)]
        .iter()
        .enumerate()
    {
        let c = Attn {
            b,
            h,
            h_kv: h,
            s_q: s,
            s_kv: s,
            d,
            d_v: d,
            causal: Causal::TopLeft,
            mask: Mask::None,
            bshd: false,
        };
        for dtype in [DType::F16, DType::BF16] {
            let seed = 1500 + 10 * i as u64;
            let (qkv, qkv64) = random(&[b, s, 3, h, d], dtype, &dev, seed);
            let (var, var64) = (
                Var::from_tensor(&qkv).unwrap(),
                Var::from_tensor(&qkv64).unwrap(),
            );
            let part = |t: &Tensor, j: usize| {
                t.narrow(2, j, 1)
                    .unwrap()
                    .squeeze(2)
                    .unwrap()
                    .transpose(1, 2)
                    .unwrap()
            };
            let (t, r) = (var.as_tensor(), var64.as_tensor());
            let scale = 1.0 / (d as f64).sqrt();
            let o = sdpa(&part(t, 0), &part(t, 1), &part(t, 2), None, true, scale).unwrap();
            let or = reference_attention(&c, &part(r, 0), &part(r, 1), &part(r, 2), None, scale);
            assert_eq!(o.dims(), &[b, h, s, d]);
            let tol = tolerance(dtype);
            let what = format!("b {b} h {h} s {s} {dtype:?}");
            let e = rel_l2(&o, &or);
            assert!(e <= tol, "{what} o: {e:e}");
            let (g, gr) = random(o.dims(), dtype, &dev, seed + 1);
            let grads = (&o * &g).unwrap().sum_all().unwrap().backward().unwrap();
            let grads_r = (&or * &gr).unwrap().sum_all().unwrap().backward().unwrap();
            let e = rel_l2(grads.get(t).unwrap(), grads_r.get(r).unwrap());
            assert!(e <= 2.0 * tol, "{what} dqkv: {e:e}");
        }
    }
}

/// Layer norm (with beta) or RMS norm (without) in f64 over the last dimension.
fn reference_norm(x: &Tensor, g: &Tensor, b: Option<&Tensor>, eps: f64) -> Tensor {
    let n = *x.dims().last().unwrap() as f64;
    match b {
        Some(b) => {
            let mean = (x.sum_keepdim(D::Minus1).unwrap() / n).unwrap();
            let c = x.broadcast_sub(&mean).unwrap();
            let var = (c.sqr().unwrap().sum_keepdim(D::Minus1).unwrap() / n).unwrap();
            let inv = ((var + eps).unwrap().sqrt().unwrap()).recip().unwrap();
            c.broadcast_mul(&inv)
                .unwrap()
                .broadcast_mul(g)
                .unwrap()
                .broadcast_add(b)
                .unwrap()
        }
        None => {
            let ms = (x.sqr().unwrap().sum_keepdim(D::Minus1).unwrap() / n).unwrap();
            let inv = ((ms + eps).unwrap().sqrt().unwrap()).recip().unwrap();
            x.broadcast_mul(&inv).unwrap().broadcast_mul(g).unwrap()
        }
    }
}

#[test]
fn layer_and_rms_norm_match_f64_forward_and_backward() {
    let Some(dev) = cuda() else { return };
    for dims in [[3usize, 5, 96], [2, 7, 77], [1, 4, 1024]] {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for layer in [true, false] {
                let f = dims[2];
                let (x, xr) = random(&dims, dtype, &dev, 300);
                let (g, gr) = random(&[f], dtype, &dev, 301);
                let (b, br) = random(&[f], dtype, &dev, 302);
                let vars: Vec<Var> = [&x, &g, &b]
                    .iter()
                    .map(|t| Var::from_tensor(t).unwrap())
                    .collect();
                let rvars: Vec<Var> = [&xr, &gr, &br]
                    .iter()
                    .map(|t| Var::from_tensor(t).unwrap())
                    .collect();
                let eps = 1e-5f32;
                let y = if layer {
                    layer_norm(
                        vars[0].as_tensor(),
                        vars[1].as_tensor(),
                        vars[2].as_tensor(),
                        eps,
                    )
                } else {
                    rms_norm(vars[0].as_tensor(), vars[1].as_tensor(), eps)
                }
                .unwrap();
                let bias = layer.then(|| rvars[2].as_tensor());
                let yr = reference_norm(
                    rvars[0].as_tensor(),
                    rvars[1].as_tensor(),
                    bias,
                    f64::from(eps),
                );
                let tol = tolerance(dtype);
                let what = if layer { "layer_norm" } else { "rms_norm" };
                let e = rel_l2(&y, &yr);
                assert!(e <= tol, "{what} {dims:?} {dtype:?} y: {e:e}");
                let (dy, dyr) = random(&dims, dtype, &dev, 303);
                let grads = (&y * &dy).unwrap().sum_all().unwrap().backward().unwrap();
                let grads_r = (&yr * &dyr).unwrap().sum_all().unwrap().backward().unwrap();
                let n = if layer { 3 } else { 2 };
                for (j, name) in ["dx", "dgamma", "dbeta"].iter().enumerate().take(n) {
                    let got = grads.get(vars[j].as_tensor()).unwrap();
                    let want = grads_r.get(rvars[j].as_tensor()).unwrap();
                    let e = rel_l2(got, want);
                    assert!(e <= 2.0 * tol, "{what} {dims:?} {dtype:?} {name}: {e:e}");
                }
            }
        }
    }
}

/// Inputs with no elements (no rows, or rows of no features; a convolution's empty batch or no
/// output channels) give empty results of the right shape, as PyTorch's, on every device.
#[test]
fn empty_inputs_give_empty_results() {
    let devices: Vec<Device> = std::iter::once(Device::Cpu).chain(cuda()).collect();
    for dev in &devices {
        for dims in [&[0usize, 8][..], &[3, 0], &[2, 0, 5]] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let x = Tensor::zeros(dims, dtype, dev).unwrap();
                let f = *dims.last().unwrap();
                let g = Tensor::ones(f, dtype, dev).unwrap();
                let b = Tensor::zeros(f, dtype, dev).unwrap();
                let what = format!("{dev:?} {dims:?} {dtype:?}");
                let y = layer_norm(&x, &g, &b, 1e-5).expect(&what);
                assert_eq!(y.dims(), x.dims(), "layer_norm {what}");
                let y = rms_norm(&x, &g, 1e-5).expect(&what);
                assert_eq!(y.dims(), x.dims(), "rms_norm {what}");
                let y = softmax_last_dim(&x).expect(&what);
                assert_eq!(y.dims(), x.dims(), "softmax_last_dim {what}");
            }
        }
        // Convolution of an empty batch, or with no output channels.
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let x = Tensor::zeros((0, 4, 9, 9), dtype, dev).unwrap();
            let w = Tensor::ones((6, 2, 3, 3), dtype, dev).unwrap();
            let y = conv2d(&x, &w, 1, 2, 1, 2).unwrap();
            assert_eq!(y.dims(), &[0, 6, 5, 5], "{dev:?} {dtype:?}");
            let (x1, _) = random(&[2, 4, 9, 9], dtype, dev, 1700);
            let w0 = Tensor::ones((0, 4, 3, 3), dtype, dev).unwrap();
            let y = conv2d(&x1, &w0, 0, 1, 1, 1).unwrap();
            assert_eq!(y.dims(), &[2, 0, 7, 7], "{dev:?} {dtype:?}");
            // The fused inference layer alike (its graph takes no empty tensor).
            let b6 = Tensor::zeros(6, dtype, dev).unwrap();
            let p = Conv2dParams::new().padding([1, 1]).stride([2, 2]).groups(2);
            let y = conv2d_fused(&x, &w, &b6, None, true, &p).unwrap();
            assert_eq!(y.dims(), &[0, 6, 5, 5], "{dev:?} {dtype:?} fused");
            let x3 = Tensor::zeros((0, 4, 20), dtype, dev).unwrap();
            let w3 = Tensor::ones((3, 4, 5), dtype, dev).unwrap();
            let y = conv1d(&x3, &w3, 2, 1, 1, 1).unwrap();
            assert_eq!(y.dims(), &[0, 3, 20], "{dev:?} {dtype:?}");
        }
    }
}

#[test]
fn norms_and_softmax_agree_with_candle_nn() {
    let Some(dev) = cuda() else { return };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (x, _) = random(&[4, 9, 256], dtype, &dev, 400);
        let (g, _) = random(&[256], dtype, &dev, 401);
        let (b, _) = random(&[256], dtype, &dev, 402);
        let tol = tolerance(dtype);
        let ln = layer_norm(&x, &g, &b, 1e-5).unwrap();
        let want = candle_nn::ops::layer_norm(&x, &g, &b, 1e-5).unwrap();
        assert!(rel_l2(&ln, &want) <= tol, "{dtype:?} layer_norm");
        let rn = rms_norm(&x, &g, 1e-6).unwrap();
        let want = candle_nn::ops::rms_norm(&x, &g, 1e-6).unwrap();
        assert!(rel_l2(&rn, &want) <= tol, "{dtype:?} rms_norm");
        let sm = softmax_last_dim(&x).unwrap();
        let want = candle_nn::ops::softmax_last_dim(&x).unwrap();
        assert!(rel_l2(&sm, &want) <= tol, "{dtype:?} softmax");
    }
}

#[test]
fn attention_and_norm_arguments_are_refused_naming_them() {
    let mut devices = vec![Device::Cpu];
    if let Some(d) = cuda() {
        devices.push(d);
    }
    for dev in &devices {
        let z = |dims: &[usize], dt: DType| Tensor::zeros(dims, dt, dev).unwrap();
        let bf = DType::BF16;
        let (q, k, v) = (
            z(&[2, 4, 8, 64], bf),
            z(&[2, 2, 10, 64], bf),
            z(&[2, 2, 10, 64], bf),
        );
        assert!(sdpa(&q, &k, &v, None, true, 0.125).is_ok());
        assert_eq!(
            refused(sdpa(&z(&[2, 4, 64], bf), &k, &v, None, true, 0.1)),
            "q"
        );
        assert_eq!(
            refused(sdpa(
                &q,
                &z(&[2, 3, 10, 64], bf),
                &z(&[2, 3, 10, 64], bf),
                None,
                true,
                0.1
            )),
            "k"
        );
        assert_eq!(
            refused(sdpa(&q, &z(&[2, 2, 10, 32], bf), &v, None, true, 0.1)),
            "k"
        );
        assert_eq!(
            refused(sdpa(&q, &k, &z(&[2, 2, 11, 64], bf), None, true, 0.1)),
            "v"
        );
        assert_eq!(
            refused(sdpa(
                &q,
                &k.to_dtype(DType::F16).unwrap(),
                &v,
                None,
                true,
                0.1
            )),
            "k"
        );
        assert_eq!(
            refused(sdpa(&q, &k, &v, Some(&z(&[3, 1, 8, 10], bf)), false, 0.1)),
            "mask"
        );
        assert_eq!(
            refused(sdpa(&q, &k, &v, Some(&z(&[8, 10], DType::U32)), false, 0.1)),
            "mask"
        );
        assert_eq!(refused(sdpa(&q, &k, &v, None, false, f64::NAN)), "scale");
        let qi = z(&[2, 4, 8, 64], DType::U32);
        assert_eq!(refused(sdpa(&qi, &qi, &qi, None, false, 0.1)), "q");
        let x = z(&[3, 16], DType::F32);
        let (g, b) = (z(&[16], DType::F32), z(&[16], DType::F32));
        assert_eq!(
            refused(layer_norm(&x, &z(&[15], DType::F32), &b, 1e-5)),
            "gamma"
        );
        assert_eq!(
            refused(layer_norm(&x, &g, &z(&[16], DType::F16), 1e-5)),
            "beta"
        );
        assert_eq!(refused(layer_norm(&x, &g, &b, -1.0)), "eps");
        assert_eq!(refused(rms_norm(&z(&[3, 16], DType::U32), &g, 1e-5)), "x");
        assert_eq!(
            refused(rms_norm(&x, &z(&[16, 1], DType::F32), 1e-5)),
            "gamma"
        );
        assert!(rms_norm(&x, &g, 1e-6).is_ok());
    }
}

#[test]
fn conv2d_fused_matches_f64_with_bias_residual_and_relu() {
    let Some(dev) = cuda() else { return };
    for (i, c) in CASES.iter().enumerate() {
        for dtype in [DType::F16, DType::BF16, DType::F32] {
            let seed = 500 + 10 * i as u64;
            let (x, x64) = random(&c.x, dtype, &dev, seed);
            let (w, w64) = random(&c.w, dtype, &dev, seed + 1);
            let (b, b64) = random(&[c.w[0]], dtype, &dev, seed + 2);
            let p = Conv2dParams::new()
                .padding([c.padding; 2])
                .stride([c.stride; 2])
                .dilation([c.dilation; 2])
                .groups(c.groups);
            let conv = x64
                .conv2d(&w64, c.padding, c.stride, c.dilation, c.groups)
                .unwrap();
            let (z, z64) = random(conv.dims(), dtype, &dev, seed + 3);
            let biased = conv
                .broadcast_add(&b64.reshape((1, (), 1, 1)).unwrap())
                .unwrap();
            let tol = tolerance(dtype);
            for (residual, relu) in [(false, false), (true, true), (false, true)] {
                let y = conv2d_fused(&x, &w, &b, residual.then_some(&z), relu, &p).unwrap();
                let mut want = biased.clone();
                if residual {
                    want = (want + &z64).unwrap();
                }
                if relu {
                    want = want.relu().unwrap();
                }
                let e = rel_l2(&y, &want);
                assert!(
                    e <= tol,
                    "case {i} {dtype:?} residual {residual} relu {relu}: {e:e}"
                );
            }
        }
    }
}

#[test]
fn conv2d_fused_chains_channels_last_and_folds_batch_norm() {
    let Some(dev) = cuda() else { return };
    let dtype = DType::F16;
    let (x, x64) = random(&[2, 16, 12, 12], dtype, &dev, 600);
    let (w, w64) = random(&[16, 16, 3, 3], dtype, &dev, 601);
    let (g, g64) = random(&[16], DType::F32, &dev, 602);
    let (beta, beta64) = random(&[16], DType::F32, &dev, 603);
    let (mean, mean64) = random(&[16], DType::F32, &dev, 604);
    let (v, v64) = random(&[16], DType::F32, &dev, 605);
    let (var, var64) = (
        (v.abs().unwrap() + 0.5).unwrap(),
        (v64.abs().unwrap() + 0.5).unwrap(),
    );
    let (g, beta, mean, var) = [g, beta, mean, var]
        .map(|t| t.to_dtype(dtype).unwrap())
        .into();
    let (wf, bf) = fold_batch_norm(&w, None, &g, &beta, &mean, &var, 1e-5).unwrap();
    let p = Conv2dParams::new().padding([1, 1]);
    // Two layers: the first one's channels-last output feeds the second as it is.
    let y1 = conv2d_fused(&x, &wf, &bf, None, true, &p).unwrap();
    assert_eq!(y1.stride(), &[12 * 12 * 16, 1, 12 * 16, 16]);
    let y2 = conv2d_fused(&y1, &wf, &bf, Some(&x), true, &p).unwrap();
    // f64: conv, batch norm, relu; again with the residual.
    let bn = |t: &Tensor| {
        let sh = |u: &Tensor| {
            u.to_dtype(DType::F64)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .reshape((1, 16, 1, 1))
                .unwrap()
        };
        let (g, b, m, v) = (sh(&g64), sh(&beta64), sh(&mean64), sh(&var64));
        t.broadcast_sub(&m)
            .unwrap()
            .broadcast_div(&(v + 1e-5).unwrap().sqrt().unwrap())
            .unwrap()
            .broadcast_mul(&g)
            .unwrap()
            .broadcast_add(&b)
            .unwrap()
    };
    let r1 = bn(&x64.conv2d(&w64, 1, 1, 1, 1).unwrap()).relu().unwrap();
    let r2 = (bn(&r1.conv2d(&w64, 1, 1, 1, 1).unwrap()) + &x64)
        .unwrap()
        .relu()
        .unwrap();
    let tol = 2.0 * tolerance(dtype);
    assert!(rel_l2(&y1, &r1) <= tol, "layer 1: {:e}", rel_l2(&y1, &r1));
    assert!(rel_l2(&y2, &r2) <= tol, "layer 2: {:e}", rel_l2(&y2, &r2));
}

#[test]
fn conv2d_fused_arguments_are_refused_naming_them() {
    let mut devices = vec![Device::Cpu];
    if let Some(d) = cuda() {
        devices.push(d);
    }
    for dev in &devices {
        let z = |dims: &[usize]| Tensor::zeros(dims, DType::F16, dev).unwrap();
        let (x, w, b) = (z(&[2, 8, 9, 9]), z(&[4, 8, 3, 3]), z(&[4]));
        let p = Conv2dParams::new();
        assert_eq!(
            conv2d_fused(&x, &w, &b, None, true, &p).unwrap().dims(),
            &[2, 4, 7, 7]
        );
        assert_eq!(
            refused(conv2d_fused(&x, &w, &z(&[5]), None, true, &p)),
            "bias"
        );
        assert_eq!(
            refused(conv2d_fused(&x, &z(&[4, 7, 3, 3]), &b, None, true, &p)),
            "w"
        );
        assert_eq!(
            refused(conv2d_fused(&x, &w, &b, Some(&z(&[2, 4, 9, 9])), true, &p)),
            "residual"
        );
        assert_eq!(
            refused(conv2d_fused(&z(&[2, 8, 9]), &w, &b, None, true, &p)),
            "x"
        );
        let wf = w.to_dtype(DType::F32).unwrap();
        assert_eq!(refused(conv2d_fused(&x, &wf, &b, None, true, &p)), "w");
        assert_eq!(
            refused(conv2d_fused(&x, &w, &b, None, true, &p.stride([0, 1]))),
            "stride"
        );
        let big = z(&[4, 8, 11, 11]);
        assert_eq!(refused(conv2d_fused(&x, &big, &b, None, true, &p)), "x");
    }
}

#[test]
fn views_starting_mid_vector_run_like_packed_tensors() {
    let Some(dev) = cuda() else { return };
    let dtype = DType::BF16;
    let tol = tolerance(dtype);
    // q, k, v: the last 64 of 72 values per row (start 4 elements in: not 16-byte aligned).
    let view = |seed| {
        let (t, r) = random(&[2, 4, 40, 72], dtype, &dev, seed);
        (t.narrow(3, 4, 64).unwrap(), r.narrow(3, 4, 64).unwrap())
    };
    let ((q, qr), (k, kr), (v, vr)) = (view(700), view(701), view(702));
    let c = Attn {
        b: 2,
        h: 4,
        h_kv: 4,
        s_q: 40,
        s_kv: 40,
        d: 64,
        d_v: 64,
        causal: Causal::TopLeft,
        mask: Mask::None,
        bshd: false,
    };
    let o = sdpa(&q, &k, &v, None, true, 0.125).unwrap();
    let or = reference_attention(&c, &qr, &kr, &vr, None, 0.125);
    assert!(rel_l2(&o, &or) <= tol, "sdpa: {:e}", rel_l2(&o, &or));
    // Rows 1.. of a [4, 101] tensor: starts 101 elements in.
    let (x, xr) = random(&[4, 101], dtype, &dev, 703);
    let (g, gr) = random(&[101], dtype, &dev, 704);
    let (b, br) = random(&[101], dtype, &dev, 705);
    let (x, xr) = (x.narrow(0, 1, 3).unwrap(), xr.narrow(0, 1, 3).unwrap());
    let y = rms_norm(&x, &g, 1e-6).unwrap();
    assert!(
        rel_l2(&y, &reference_norm(&xr, &gr, None, 1e-6)) <= tol,
        "rms_norm"
    );
    let y = layer_norm(&x, &g, &b, 1e-5).unwrap();
    assert!(
        rel_l2(&y, &reference_norm(&xr, &gr, Some(&br), 1e-5)) <= tol,
        "layer_norm"
    );
    // A channels-last convolution input that starts mid-vector.
    let (xs, xs64) = random(&[1 + 2 * 8 * 9 * 9], dtype, &dev, 706);
    let x = xs
        .narrow(0, 1, 2 * 8 * 9 * 9)
        .unwrap()
        .reshape((2, 9, 9, 8))
        .unwrap()
        .permute((0, 3, 1, 2))
        .unwrap();
    let x64 = xs64
        .narrow(0, 1, 2 * 8 * 9 * 9)
        .unwrap()
        .reshape((2, 9, 9, 8))
        .unwrap()
        .permute((0, 3, 1, 2))
        .unwrap();
    let (w, w64) = random(&[8, 8, 3, 3], dtype, &dev, 707);
    let (b, b64) = random(&[8], dtype, &dev, 708);
    let y = conv2d_fused(&x, &w, &b, None, false, &Conv2dParams::new()).unwrap();
    let want = x64
        .contiguous()
        .unwrap()
        .conv2d(&w64, 0, 1, 1, 1)
        .unwrap()
        .broadcast_add(&b64.reshape((1, 8, 1, 1)).unwrap())
        .unwrap();
    assert!(rel_l2(&y, &want) <= tol, "conv2d_fused");
}

/// Group norm in f64: mean and biased variance over each group of consecutive channels.
fn reference_group_norm(x: &Tensor, groups: usize, g: &Tensor, b: &Tensor, eps: f64) -> Tensor {
    let dims = x.dims().to_vec();
    let xg = x.reshape((dims[0], groups, ())).unwrap();
    let n = xg.dim(2).unwrap() as f64;
    let mean = (xg.sum_keepdim(2).unwrap() / n).unwrap();
    let c = xg.broadcast_sub(&mean).unwrap();
    let var = (c.sqr().unwrap().sum_keepdim(2).unwrap() / n).unwrap();
    let y = c
        .broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
        .unwrap();
    let mut per_channel = vec![1; dims.len()];
    per_channel[1] = dims[1];
    y.reshape(dims.as_slice())
        .unwrap()
        .broadcast_mul(&g.reshape(per_channel.as_slice()).unwrap())
        .unwrap()
        .broadcast_add(&b.reshape(per_channel.as_slice()).unwrap())
        .unwrap()
}

#[test]
fn group_norm_matches_f64_forward_and_backward() {
    let devices: Vec<Device> = std::iter::once(Device::Cpu).chain(cuda()).collect();
    for dev in &devices {
        for (dims, groups) in [
            (vec![2usize, 6, 5, 7], 3usize),
            (vec![3, 8, 9], 8),
            (vec![2, 32, 4, 4], 1),
            // Ranks 5 and 6: positions folded to one dimension.
            (vec![1, 6, 2, 3, 4], 2),
            (vec![2, 4, 2, 1, 3, 2], 2),
        ] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let c = dims[1];
                let (x, xr) = random(&dims, dtype, dev, 800);
                let (g, gr) = random(&[c], dtype, dev, 801);
                let (b, br) = random(&[c], dtype, dev, 802);
                let vars: Vec<Var> = [&x, &g, &b]
                    .iter()
                    .map(|t| Var::from_tensor(t).unwrap())
                    .collect();
                let rvars: Vec<Var> = [&xr, &gr, &br]
                    .iter()
                    .map(|t| Var::from_tensor(t).unwrap())
                    .collect();
                let y = cudnn_safe_candle::group_norm(
                    vars[0].as_tensor(),
                    groups,
                    vars[1].as_tensor(),
                    vars[2].as_tensor(),
                    1e-5,
                )
                .unwrap();
                let yr = reference_group_norm(
                    rvars[0].as_tensor(),
                    groups,
                    rvars[1].as_tensor(),
                    rvars[2].as_tensor(),
                    1e-5,
                );
                let tol = tolerance(dtype).max(1e-4);
                let e = rel_l2(&y, &yr);
                assert!(e <= tol, "{dev:?} {dims:?}/{groups} {dtype:?} y: {e:e}");
                let (dy, dyr) = random(&dims, dtype, dev, 803);
                let grads = (&y * &dy).unwrap().sum_all().unwrap().backward().unwrap();
                let grads_r = (&yr * &dyr).unwrap().sum_all().unwrap().backward().unwrap();
                for (j, name) in ["dx", "dgamma", "dbeta"].iter().enumerate() {
                    let got = grads.get(vars[j].as_tensor()).unwrap();
                    let want = grads_r.get(rvars[j].as_tensor()).unwrap();
                    let e = rel_l2(got, want);
                    assert!(
                        e <= 2.0 * tol,
                        "{dev:?} {dims:?}/{groups} {dtype:?} {name}: {e:e}"
                    );
                }
            }
        }
        let z = |d: &[usize]| Tensor::zeros(d, DType::F32, dev).unwrap();
        let (x, g) = (z(&[2, 6, 4]), z(&[6]));
        assert_eq!(
            refused(cudnn_safe_candle::group_norm(&x, 4, &g, &g, 1e-5)),
            "groups"
        );
        assert_eq!(
            refused(cudnn_safe_candle::group_norm(&x, 0, &g, &g, 1e-5)),
            "groups"
        );
        assert_eq!(
            refused(cudnn_safe_candle::group_norm(&x, 3, &z(&[4]), &g, 1e-5)),
            "gamma"
        );
        assert_eq!(
            refused(cudnn_safe_candle::group_norm(&z(&[6]), 3, &g, &g, 1e-5)),
            "x"
        );
    }
}

#[test]
fn absurd_sizes_are_refused_not_overflowed() {
    let devices: Vec<Device> = std::iter::once(Device::Cpu).chain(cuda()).collect();
    for dev in &devices {
        let z = |dims: &[usize]| Tensor::zeros(dims, DType::F16, dev).unwrap();
        let (x, w, b) = (z(&[1, 8, 9, 9]), z(&[8, 8, 3, 3]), z(&[8]));
        let huge = usize::MAX / 2 + 1;
        let p = Conv2dParams::new().padding([huge, 0]);
        assert_eq!(refused(conv2d_with(&x, &w, &p)), "padding");
        assert_eq!(
            refused(conv2d_fused(&x, &w, &b, None, false, &p)),
            "padding"
        );
        let p = Conv2dParams::new().dilation([usize::MAX, 1]);
        assert_eq!(refused(conv2d_with(&x, &w, &p)), "dilation");
        assert_eq!(
            refused(conv2d_fused(&x, &w, &b, None, false, &p)),
            "dilation"
        );
        let p = Conv2dParams::new().groups(usize::MAX);
        assert_eq!(refused(conv2d_with(&x, &w, &p)), "w");
        assert_eq!(refused(conv2d_fused(&x, &w, &b, None, false, &p)), "w");
        let empty = z(&[8, 8, 0, 3]);
        assert_eq!(refused(conv2d_with(&x, &empty, &Conv2dParams::new())), "w");
        assert_eq!(
            refused(conv2d_fused(
                &x,
                &empty,
                &b,
                None,
                false,
                &Conv2dParams::new()
            )),
            "w"
        );
        let scalar = Tensor::new(1f32, dev).unwrap();
        let e = fold_batch_norm(&scalar, None, &b, &b, &b, &b, 1e-5).unwrap_err();
        assert!(
            matches!(Error::of(&e), Some(Error::InvalidArgument { arg: "w", .. })),
            "{e}"
        );
    }
}

/// The f64 batch norm: y, and the updated running statistics when training.
#[allow(clippy::type_complexity)]
fn reference_batch_norm(
    x: &Tensor,
    running: Option<(&Tensor, &Tensor)>,
    wb: Option<(&Tensor, &Tensor)>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> (Tensor, Option<(Tensor, Tensor)>) {
    let dims = x.dims().to_vec();
    let c = dims[1];
    let mut per = vec![1; dims.len()];
    per[1] = c;
    let axes: Vec<usize> = (0..dims.len()).filter(|&i| i != 1).collect();
    let m = (x.elem_count() / c) as f64;
    let (mean, var, updated) = if training {
        let mean = (x.sum_keepdim(axes.as_slice()).unwrap() / m).unwrap();
        let var = (x
            .broadcast_sub(&mean)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_keepdim(axes.as_slice())
            .unwrap()
            / m)
            .unwrap();
        let updated = running.map(|(rm, rv)| {
            let (bm, bv) = (
                mean.detach().flatten_all().unwrap(),
                var.detach().flatten_all().unwrap(),
            );
            (
                ((rm * (1.0 - momentum)).unwrap() + (bm * momentum).unwrap()).unwrap(),
                ((rv * (1.0 - momentum)).unwrap() + (bv * (momentum * m / (m - 1.0))).unwrap())
                    .unwrap(),
            )
        });
        (mean, var, updated)
    } else {
        let (rm, rv) = running.unwrap();
        (
            rm.reshape(per.as_slice()).unwrap(),
            rv.reshape(per.as_slice()).unwrap(),
            None,
        )
    };
    let mut y = x
        .broadcast_sub(&mean)
        .unwrap()
        .broadcast_div(&(var + eps).unwrap().sqrt().unwrap())
        .unwrap();
    if let Some((w, b)) = wb {
        y = y
            .broadcast_mul(&w.reshape(per.as_slice()).unwrap())
            .unwrap()
            .broadcast_add(&b.reshape(per.as_slice()).unwrap())
            .unwrap();
    }
    (y, updated)
}

#[test]
fn batch_norm_matches_f64_with_running_statistics_and_gradients() {
    let devices: Vec<Device> = std::iter::once(Device::Cpu).chain(cuda()).collect();
    // (dims, channels-last storage, f32 parameters whatever x's dtype, affine)
    let cases: &[(&[usize], bool, bool, bool)] = &[
        (&[4, 6, 5, 7], false, false, true),
        (&[4, 6, 5, 7], true, false, true),
        (&[3, 8, 5, 4], true, true, true),
        (&[5, 3], false, false, true),
        (&[2, 4, 9], false, true, false),
        (&[2, 3, 2, 3, 4], false, false, true),
        (&[2, 3, 2, 2, 2, 3], false, false, true),
    ];
    let (momentum, eps) = (0.3, 1e-4);
    for dev in &devices {
        for &(dims, channels_last, f32_params, affine) in cases {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let what = format!("{dev:?} {dims:?} cl={channels_last} {dtype:?}");
                let c = dims[1];
                let pdtype = if f32_params { DType::F32 } else { dtype };
                let (x, xr) = if channels_last {
                    // Stored [n, h, w, c]: the logical [n, c, h, w] is a permuted view.
                    let nhwc = [dims[0], dims[2], dims[3], dims[1]];
                    let (x, xr) = random(&nhwc, dtype, dev, 900);
                    (
                        x.permute((0, 3, 1, 2)).unwrap(),
                        xr.permute((0, 3, 1, 2)).unwrap(),
                    )
                } else {
                    random(dims, dtype, dev, 900)
                };
                let (w, wr) = random(&[c], pdtype, dev, 901);
                let (b, br) = random(&[c], pdtype, dev, 902);
                let (rm, rmr) = random(&[c], pdtype, dev, 903);
                let (rv0, _) = random(&[c], DType::F64, dev, 904);
                let rv = (rv0.abs().unwrap() + 0.5)
                    .unwrap()
                    .to_dtype(pdtype)
                    .unwrap();
                let rvr = rv
                    .to_device(&Device::Cpu)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap();
                let vars: Vec<Var> = [&x, &w, &b]
                    .iter()
                    .map(|t| Var::from_tensor(t).unwrap())
                    .collect();
                let rvars: Vec<Var> = [&xr, &wr, &br]
                    .iter()
                    .map(|t| Var::from_tensor(t).unwrap())
                    .collect();
                let (xv, wv, bv) = (
                    vars[0].as_tensor(),
                    vars[1].as_tensor(),
                    vars[2].as_tensor(),
                );
                let (xrv, wrv, brv) = (
                    rvars[0].as_tensor(),
                    rvars[1].as_tensor(),
                    rvars[2].as_tensor(),
                );
                let xv = if channels_last {
                    // A Var is packed: give the operation the channels-last view again.
                    let t = xv.permute((0, 2, 3, 1)).unwrap().contiguous().unwrap();
                    t.permute((0, 3, 1, 2)).unwrap()
                } else {
                    xv.clone()
                };
                let tol = tolerance(dtype).max(1e-4);
                // Training: batch statistics, running statistics updated in place.
                let (rm_run, rv_run) = (rm.copy().unwrap(), rv.copy().unwrap());
                let y = cudnn_safe_candle::batch_norm(
                    &xv,
                    Some((&rm_run, &rv_run)),
                    affine.then_some(wv),
                    affine.then_some(bv),
                    true,
                    momentum,
                    eps,
                )
                .unwrap();
                let (yr, updated) = reference_batch_norm(
                    xrv,
                    Some((&rmr, &rvr)),
                    affine.then_some((wrv, brv)),
                    true,
                    momentum,
                    eps,
                );
                assert_eq!(y.dims(), dims, "{what}");
                let e = rel_l2(&y, &yr);
                assert!(e <= tol, "{what} training y: {e:e}");
                let (nm, nv) = updated.unwrap();
                let ptol = tolerance(pdtype).max(1e-4);
                let e = rel_l2(&rm_run, &nm);
                assert!(e <= ptol, "{what} running mean: {e:e}");
                let e = rel_l2(&rv_run, &nv);
                assert!(e <= ptol, "{what} running var: {e:e}");
                let (dy, dyr) = random(dims, dtype, dev, 905);
                let grads = (&y * &dy).unwrap().sum_all().unwrap().backward().unwrap();
                let grads_r = (&yr * &dyr).unwrap().sum_all().unwrap().backward().unwrap();
                let names: &[&str] = if affine {
                    &["dx", "dweight", "dbias"]
                } else {
                    &["dx"]
                };
                for (j, name) in names.iter().enumerate() {
                    let got = grads.get(vars[j].as_tensor()).unwrap();
                    let want = grads_r.get(rvars[j].as_tensor()).unwrap();
                    let e = rel_l2(got, want);
                    assert!(e <= 2.0 * tol, "{what} {name}: {e:e}");
                }
                // Inference by the running statistics: untracked (cuDNN's inference kernel on
                // a GPU) and tracked (candle's operations, with gradients).
                let (yr, _) = reference_batch_norm(
                    xrv,
                    Some((&rmr, &rvr)),
                    affine.then_some((wrv, brv)),
                    false,
                    momentum,
                    eps,
                );
                let (xd, wd, bd) = (xv.detach(), wv.detach(), bv.detach());
                let y = cudnn_safe_candle::batch_norm(
                    &xd,
                    Some((&rm, &rv)),
                    affine.then_some(&wd),
                    affine.then_some(&bd),
                    false,
                    momentum,
                    eps,
                )
                .unwrap();
                let e = rel_l2(&y, &yr);
                assert!(e <= tol, "{what} inference y: {e:e}");
                let y = cudnn_safe_candle::batch_norm(
                    &xv,
                    Some((&rm, &rv)),
                    affine.then_some(wv),
                    affine.then_some(bv),
                    false,
                    momentum,
                    eps,
                )
                .unwrap();
                let e = rel_l2(&y, &yr);
                assert!(e <= tol, "{what} tracked inference y: {e:e}");
                let g = (&y * &dy).unwrap().sum_all().unwrap().backward().unwrap();
                let gr = (&yr * &dyr).unwrap().sum_all().unwrap().backward().unwrap();
                let e = rel_l2(g.get(vars[0].as_tensor()).unwrap(), gr.get(xrv).unwrap());
                assert!(e <= 2.0 * tol, "{what} inference dx: {e:e}");
            }
        }
    }
}

#[test]
fn batch_norm_agrees_with_candle_nn_and_refuses_bad_arguments() {
    use candle_core::ModuleT;
    let devices: Vec<Device> = std::iter::once(Device::Cpu).chain(cuda()).collect();
    for dev in &devices {
        let c = 16;
        let (x, _) = random(&[8, c, 6, 6], DType::F32, dev, 950);
        let (w, _) = random(&[c], DType::F32, dev, 951);
        let (b, _) = random(&[c], DType::F32, dev, 952);
        let zeros = Tensor::zeros(c, DType::F32, dev).unwrap();
        let ones = Tensor::ones(c, DType::F32, dev).unwrap();
        let theirs = candle_nn::BatchNorm::new_with_momentum(
            c,
            zeros.copy().unwrap(),
            ones.copy().unwrap(),
            w.clone(),
            b.clone(),
            1e-5,
            0.2,
        )
        .unwrap();
        let ours = cudnn_safe_candle::BatchNorm::new(
            zeros.copy().unwrap(),
            ones.copy().unwrap(),
            Some((w.clone(), b.clone())),
            1e-5,
            0.2,
        )
        .unwrap();
        for step in 0..3 {
            let x = (&x + step as f64).unwrap();
            let (a, e) = (
                ours.forward_t(&x, true).unwrap(),
                theirs.forward_t(&x, true).unwrap(),
            );
            assert!(rel_l2(&a, &e) <= 1e-5, "{dev:?} step {step} training");
            for (a, e, name) in [
                (ours.running_mean(), theirs.running_mean(), "mean"),
                (ours.running_var(), theirs.running_var(), "var"),
            ] {
                assert!(rel_l2(a, e) <= 1e-5, "{dev:?} step {step} running {name}");
            }
            let (a, e) = (
                ours.forward_t(&x, false).unwrap(),
                theirs.forward_t(&x, false).unwrap(),
            );
            assert!(rel_l2(&a, &e) <= 1e-5, "{dev:?} step {step} inference");
        }
        let bn = |x: &Tensor,
                  r: Option<(&Tensor, &Tensor)>,
                  w: Option<&Tensor>,
                  b: Option<&Tensor>,
                  t: bool,
                  m: f64,
                  e: f64| cudnn_safe_candle::batch_norm(x, r, w, b, t, m, e);
        let r = Some((&zeros, &ones));
        let short = Tensor::zeros(c - 1, DType::F32, dev).unwrap();
        let wide = Tensor::zeros(c, DType::F64, dev).unwrap();
        let strided = Tensor::zeros((c, 2), DType::F32, dev)
            .unwrap()
            .narrow(1, 0, 1)
            .unwrap()
            .squeeze(1)
            .unwrap();
        // Running statistics that share memory with each other or with an input: one storage
        // holding x and, right after it, room for one statistic.
        let n_x = x.elem_count();
        let (all, _) = random(&[n_x + c], DType::F32, dev, 953);
        let x_in = all.narrow(0, 0, n_x).unwrap().reshape(x.dims()).unwrap();
        let after = all.narrow(0, n_x, c).unwrap();
        let into_x = all.narrow(0, n_x - 3, c).unwrap();
        let before = flat(&all);
        let cases = [
            (
                bn(&x, Some((&zeros, &zeros)), None, None, true, 0.1, 1e-5),
                "running_var",
            ),
            (
                bn(&x_in, Some((&into_x, &ones)), None, None, true, 0.1, 1e-5),
                "running_mean",
            ),
            (
                bn(&x, Some((&zeros, &w)), Some(&w), Some(&b), true, 0.1, 1e-5),
                "running_var",
            ),
            (
                bn(&x, Some((&b, &ones)), Some(&w), Some(&b), true, 0.1, 1e-5),
                "running_mean",
            ),
            (
                bn(&x, Some((&short, &ones)), None, None, true, 0.1, 1e-5),
                "running_mean",
            ),
            (
                bn(&x, Some((&zeros, &wide)), None, None, true, 0.1, 1e-5),
                "running_var",
            ),
            (
                bn(&x, Some((&strided, &ones)), None, None, true, 0.1, 1e-5),
                "running_mean",
            ),
            (bn(&x, r, Some(&w), None, true, 0.1, 1e-5), "bias"),
            (bn(&x, r, Some(&wide), Some(&b), true, 0.1, 1e-5), "weight"),
            (bn(&x, None, None, None, false, 0.1, 1e-5), "running_mean"),
            (bn(&x, r, None, None, true, 1.5, 1e-5), "momentum"),
            (bn(&x, r, None, None, true, 0.1, -1.0), "eps"),
            (bn(&x, r, None, None, true, 0.1, f64::NAN), "eps"),
            (
                bn(
                    &x.narrow(0, 0, 1)
                        .unwrap()
                        .narrow(2, 0, 1)
                        .unwrap()
                        .narrow(3, 0, 1)
                        .unwrap(),
                    r,
                    None,
                    None,
                    true,
                    0.1,
                    1e-5,
                ),
                "x",
            ),
            (bn(&zeros, r, None, None, true, 0.1, 1e-5), "x"),
            (
                bn(
                    &x.to_dtype(DType::U8).unwrap(),
                    r,
                    None,
                    None,
                    true,
                    0.1,
                    1e-5,
                ),
                "x",
            ),
        ];
        for (i, (r, arg)) in cases.into_iter().enumerate() {
            assert_eq!(refused(r), arg, "{dev:?} case {i}");
        }
        assert_eq!(flat(&all), before, "{dev:?}: a refused call wrote");
        // A statistic right after x in the same storage shares no element with it.
        let var = Tensor::ones(c, DType::F32, dev).unwrap();
        bn(&x_in, Some((&after, &var)), None, None, true, 0.1, 1e-5).unwrap();
        assert_ne!(flat(&after), before[n_x..].to_vec(), "{dev:?}: not updated");
        assert_eq!(flat(&all)[..n_x], before[..n_x], "{dev:?}: x changed");
        // The layer: f32 statistics with bf16 parameters (for bf16 inputs) are accepted; a
        // statistic that is not [c] is refused by name.
        let bf = Tensor::ones(c, DType::BF16, dev).unwrap();
        let layer = cudnn_safe_candle::BatchNorm::new(
            zeros.copy().unwrap(),
            ones.copy().unwrap(),
            Some((bf.clone(), bf.clone())),
            1e-5,
            0.1,
        )
        .unwrap();
        let xb = x.to_dtype(DType::BF16).unwrap();
        assert_eq!(layer.forward_t(&xb, true).unwrap().dtype(), DType::BF16);
        assert!(flat(layer.running_var()).iter().all(|&v| v != 1.0));
        let e = cudnn_safe_candle::BatchNorm::new(
            Tensor::zeros((c, 1), DType::F32, dev).unwrap(),
            ones.clone(),
            None,
            1e-5,
            0.1,
        )
        .unwrap_err();
        assert!(
            matches!(
                Error::of(&e),
                Some(Error::InvalidArgument {
                    arg: "running_mean",
                    ..
                })
            ),
            "{e}"
        );
        // Refused calls leave the running statistics as they were.
        assert_eq!(flat(&zeros), vec![0.0; c]);
        assert_eq!(flat(&ones), vec![1.0; c]);
    }
}
