//! cudnn-safe-candle against float64 references on random inputs: convolution forward and
//! backward (every dtype, strides, padding, dilation, groups, 1-D, strided inputs) and softmax.
//! GPU tests skip without a GPU (`Device::new_cuda(0)` fails), and fail instead with
//! `CUDNN_SAFE_REQUIRE_GPU=1`. Argument checks and the CPU path run everywhere.
use candle_core::{DType, Device, Tensor, Var, D};
use cudnn_safe_candle::{conv1d, conv2d, conv2d_with, softmax_last_dim, Conv2dParams, Error};

fn cuda() -> Option<Device> {
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
