//! The convolution directions as values ([`ConvForward`], [`ConvBackwardData`],
//! [`ConvBackwardFilter`], [`ConvTranspose`], [`ConvBiasActivation`]) and the [`ConvOp`] trait:
//! typed refusals when they are built (host side: shapes and data types), typed refusals of
//! short buffers and too small a workspace with the output untouched, and every algorithm
//! cuDNN's heuristics list against a CPU f64 reference on random inputs, outputs poisoned with
//! NaN first. GPU cases skip without a GPU.
mod common;

use common::conv::{is_transform, Geometry, Ref};
use common::{
    assert_untouched, download, gpu, have_cudnn, poisoned_buffer, sentinel_buffer, to_f64, Rng,
};
use cudnn_safe::conv::{
    AlgoPerf, ConvAlgorithm, ConvBackwardData, ConvBackwardFilter, ConvBiasActivation, ConvDesc,
    ConvForward, ConvOp, ConvTranspose, FusedActivation, MathType,
};
use cudnn_safe::cudarc::driver::CudaSlice;
use cudnn_safe::{
    Cudnn, DType, DataType, Error, FilterDesc, Scalar, StatusFamily, TensorDesc, TensorFormat,
    Workspace,
};

// ---------------------------------------------------------------------------------------------
// A 2-D NCHW problem and its f64 reference
// ---------------------------------------------------------------------------------------------

/// A 2-D cross-correlation, groups 1, every tensor packed NCHW.
#[derive(Clone, Copy, Debug)]
struct Case {
    n: i64,
    c: i64,
    k: i64,
    hw: [i64; 2],
    rs: [i64; 2],
    pad: [i64; 2],
    stride: [i64; 2],
    dil: [i64; 2],
}

/// Cases with padding, stride and dilation in each combination the directions take.
const CASES: [Case; 3] = [
    Case {
        n: 2,
        c: 3,
        k: 4,
        hw: [7, 6],
        rs: [3, 3],
        pad: [1, 1],
        stride: [1, 1],
        dil: [1, 1],
    },
    Case {
        n: 1,
        c: 4,
        k: 3,
        hw: [9, 8],
        rs: [3, 2],
        pad: [1, 0],
        stride: [2, 2],
        dil: [1, 1],
    },
    Case {
        n: 2,
        c: 2,
        k: 5,
        hw: [8, 9],
        rs: [2, 3],
        pad: [2, 1],
        stride: [1, 2],
        dil: [2, 1],
    },
];

impl Case {
    fn out(&self) -> [i64; 2] {
        let o = |i: usize| {
            (self.hw[i] + 2 * self.pad[i] - self.dil[i] * (self.rs[i] - 1) - 1) / self.stride[i] + 1
        };
        [o(0), o(1)]
    }
    fn x_dims(&self) -> [i64; 4] {
        [self.n, self.c, self.hw[0], self.hw[1]]
    }
    fn w_dims(&self) -> [i64; 4] {
        [self.k, self.c, self.rs[0], self.rs[1]]
    }
    fn y_dims(&self) -> [i64; 4] {
        let o = self.out();
        [self.n, self.k, o[0], o[1]]
    }
    /// Strict arithmetic: FMA math for f32 (no TF32), cuDNN's default for f64.
    fn conv<T: DataType>(&self) -> ConvDesc {
        let math = if T::DTYPE == DType::F64 {
            MathType::Default
        } else {
            MathType::Fma
        };
        ConvDesc::builder(2)
            .pads(&self.pad)
            .strides(&self.stride)
            .dilations(&self.dil)
            .math(math)
            .build::<T>()
            .unwrap()
    }
    /// The shared convolution index arithmetic and reference for this case.
    fn geometry(&self) -> Geometry {
        Geometry {
            n: self.n,
            c: self.c,
            k: self.k,
            groups: 1,
            input: self.hw.to_vec(),
            kernel: self.rs.to_vec(),
            out: self.out().to_vec(),
            pads: self.pad.to_vec(),
            strides: self.stride.to_vec(),
            dilations: self.dil.to_vec(),
            flip: false,
        }
    }
}

fn len(dims: &[i64]) -> usize {
    dims.iter().product::<i64>() as usize
}

/// Checks `got` against `alpha·want` with the f32/f64 rounding bound: `tol·(16·(1 + |ref|) +
/// Σ|terms|)`, plus `tol` of the largest `Σ|terms|` for FFT and Winograd algorithms (their
/// rounding is spread over a transform tile).
fn assert_matches<T: DataType>(what: &str, got: &[T], want: &Ref, alpha: f64, transform: bool) {
    let tol = if T::DTYPE == DType::F64 { 1e-12 } else { 1e-5 };
    let scale = want.abs.iter().fold(0.0f64, |m, &a| m.max(a)) * alpha.abs();
    assert_eq!(got.len(), want.val.len(), "{what}: length");
    for (i, (g, (&v, &a))) in got.iter().zip(want.val.iter().zip(&want.abs)).enumerate() {
        let (g, v, a) = (g.to_f64(), alpha * v, alpha.abs() * a);
        let mut bound = tol * (16.0 * (1.0 + v.abs()) + a);
        if transform {
            bound += tol * scale;
        }
        assert!(
            g.is_finite() && (g - v).abs() <= bound,
            "{what}: element {i}: got {g}, want {v} (bound {bound})"
        );
    }
}

/// A refusal of the case by cuDNN itself (an algorithm the heuristics list but whose workspace
/// query or launch says "not supported"), or a workspace over the default limit.
fn is_refusal(e: &Error) -> bool {
    matches!(e, Error::WorkspaceLimit { .. })
        || matches!(
            e,
            Error::Cudnn { status, .. }
                if matches!(status.family(), StatusFamily::NotSupported | StatusFamily::BadParam)
        )
}

/// The algorithms the heuristics list as supported, once each (an algorithm may be listed once
/// per math type; the launch runs with the convolution's).
fn supported<A: ConvAlgorithm>(heur: &[AlgoPerf<A>]) -> Vec<A> {
    let mut algos: Vec<A> = Vec::new();
    for p in heur.iter().filter(|p| p.is_supported()) {
        if !algos.contains(&p.algo) {
            algos.push(p.algo);
        }
    }
    algos
}

/// Launches `op` with every supported algorithm its heuristics list, each into a fresh output
/// poisoned with NaN, `alpha = 1.5, beta = 0`, and checks the result against `want`. Returns how
/// many ran; at least one must.
fn every_algorithm<T: DataType, O: ConvOp<In = T, Out = T, Scalar = T::Scalar>>(
    what: &str,
    cudnn: &Cudnn,
    op: &O,
    inputs: (&CudaSlice<T>, &CudaSlice<T>),
    want: &Ref,
) -> usize {
    let stream = cudnn.stream().clone();
    let heur: Vec<AlgoPerf<O::Algo>> = op.heuristics(cudnn).unwrap();
    assert!(!heur.is_empty(), "{what}: cuDNN lists no algorithm");
    let alpha = 1.5;
    let mut ran = 0;
    for algo in supported(&heur) {
        let mut out = poisoned_buffer::<T>(&stream, op.out_len());
        let mut ws = Workspace::new(stream.clone());
        let ab = (T::Scalar::from_f64(alpha), T::Scalar::from_f64(0.0));
        match op.launch(cudnn, algo, ab, inputs, &mut ws, &mut out) {
            Ok(()) => {
                let got = download(&stream, &out);
                let what = format!("{what} {algo}");
                assert_matches(&what, &got, want, alpha, is_transform(algo));
                ran += 1;
            }
            Err(e) if is_refusal(&e) => eprintln!("{what} {algo}: refused: {e}"),
            Err(e) => panic!("{what} {algo}: {e}"),
        }
    }
    assert!(ran > 0, "{what}: no listed algorithm ran: {heur:?}");
    ran
}

/// Descriptors of a case in `T`.
struct Descs<T: DataType> {
    conv: ConvDesc,
    x: TensorDesc<T>,
    w: FilterDesc<T>,
    y: TensorDesc<T>,
}

impl<T: DataType> Descs<T> {
    fn new(case: &Case) -> Descs<T> {
        Descs {
            conv: case.conv::<T>(),
            x: TensorDesc::nchw_nd(&case.x_dims()).unwrap(),
            w: FilterDesc::new(&case.w_dims(), TensorFormat::Nchw).unwrap(),
            y: TensorDesc::nchw_nd(&case.y_dims()).unwrap(),
        }
    }
}

/// Uniform values in `[-1, 1]` rounded to `T`, on the device, with their f64 values.
fn upload<T: DataType>(cudnn: &Cudnn, rng: &mut Rng, n: usize) -> (CudaSlice<T>, Vec<f64>) {
    let host: Vec<T> = rng.values_in(n, -1.0, 1.0);
    (cudnn.stream().clone_htod(&host).unwrap(), to_f64(&host))
}

// ---------------------------------------------------------------------------------------------
// Host side: refusals when a direction is built
// ---------------------------------------------------------------------------------------------

#[test]
fn new_refuses_mismatched_shapes_naming_the_argument() {
    if !have_cudnn() {
        return;
    }
    let case = CASES[1];
    let d = Descs::<f32>::new(&case);
    // One more output row than the convolution gives.
    let mut bad = case.y_dims();
    bad[2] += 1;
    let y_bad = TensorDesc::<f32>::nchw_nd(&bad).unwrap();
    let r = ConvForward::new(&d.conv, &d.x, &d.w, &y_bad);
    assert!(
        matches!(r, Err(Error::ShapeMismatch { a: "y", .. })),
        "{r:?}"
    );
    let r = ConvBackwardData::new(&d.conv, &d.w, &y_bad, &d.x);
    assert!(
        matches!(r, Err(Error::ShapeMismatch { a: "dy", .. })),
        "{r:?}"
    );
    let r = ConvBackwardFilter::new(&d.conv, &d.x, &y_bad, &d.w);
    assert!(
        matches!(r, Err(Error::ShapeMismatch { a: "dy", .. })),
        "{r:?}"
    );
    // The transposed convolution of y gives x's dims (output padding 0 or 1 for stride 2);
    // three more rows are no output padding PyTorch accepts.
    assert!(ConvTranspose::new(&d.conv, &d.y, &d.w, &d.x).is_ok());
    let mut t_bad = case.x_dims();
    t_bad[2] += 3;
    let x_bad = TensorDesc::<f32>::nchw_nd(&t_bad).unwrap();
    let r = ConvTranspose::new(&d.conv, &d.y, &d.w, &x_bad);
    assert!(
        matches!(r, Err(Error::ShapeMismatch { a: "y", .. })),
        "{r:?}"
    );
    // A bias that is not one value per output channel.
    let fwd = ConvForward::new(&d.conv, &d.x, &d.w, &d.y).unwrap();
    let bias_bad = TensorDesc::<f32>::nchw(1, case.k + 1, 1, 1).unwrap();
    let r = ConvBiasActivation::new(fwd, &bias_bad, FusedActivation::Relu);
    assert!(
        matches!(r, Err(Error::ShapeMismatch { a: "bias", .. })),
        "{r:?}"
    );
}

#[test]
fn new_refuses_unsupported_data_types() {
    if !have_cudnn() {
        return;
    }
    let case = CASES[0];
    // i8 has a forward pass but no backward ones.
    let d = Descs::<i8>::new(&case);
    let r = ConvBackwardData::new(&d.conv, &d.w, &d.y, &d.x);
    assert!(matches!(r, Err(Error::UnsupportedDataType { .. })), "{r:?}");
    let r = ConvBackwardFilter::new(&d.conv, &d.x, &d.y, &d.w);
    assert!(matches!(r, Err(Error::UnsupportedDataType { .. })), "{r:?}");
    let r = ConvTranspose::new(&d.conv, &d.y, &d.w, &d.x);
    assert!(matches!(r, Err(Error::UnsupportedDataType { .. })), "{r:?}");
    // A bias of another type than the output.
    let f = Descs::<f32>::new(&case);
    let fwd = ConvForward::new(&f.conv, &f.x, &f.w, &f.y).unwrap();
    let bias = TensorDesc::<f64>::nchw(1, case.k, 1, 1).unwrap();
    let r = ConvBiasActivation::new(fwd, &bias, FusedActivation::Relu);
    assert!(matches!(r, Err(Error::UnsupportedDataType { .. })), "{r:?}");
}

#[test]
fn directions_hold_their_descriptors() {
    if !have_cudnn() {
        return;
    }
    let case = CASES[2];
    let d = Descs::<f32>::new(&case);
    let fwd = ConvForward::new(&d.conv, &d.x, &d.w, &d.y).unwrap();
    assert!(std::ptr::eq(fwd.conv(), &d.conv) && std::ptr::eq(fwd.y(), &d.y));
    assert_eq!(fwd.out_len(), len(&case.y_dims()));
    let bd = ConvBackwardData::new(&d.conv, &d.w, &d.y, &d.x).unwrap();
    assert!(std::ptr::eq(bd.dx(), &d.x) && std::ptr::eq(bd.dy(), &d.y));
    assert_eq!(bd.out_len(), len(&case.x_dims()));
    let bf = ConvBackwardFilter::new(&d.conv, &d.x, &d.y, &d.w).unwrap();
    assert!(std::ptr::eq(bf.dw(), &d.w) && std::ptr::eq(bf.x(), &d.x));
    assert_eq!(bf.out_len(), len(&case.w_dims()));
    // A transposed convolution whose output padding is below the stride runs backward data on
    // its own descriptors.
    let t = ConvTranspose::new(&d.conv, &d.y, &d.w, &d.x).unwrap();
    let pass = t.backward_data().expect("a pass");
    assert!(std::ptr::eq(pass.dx(), &d.x) && std::ptr::eq(pass.dy(), &d.y));
}

// ---------------------------------------------------------------------------------------------
// GPU: refusals of buffers and workspace, output untouched
// ---------------------------------------------------------------------------------------------

/// `r` is `BufferTooSmall` for `name`.
fn is_short(r: &Result<(), Error>, name: &str, required: usize) {
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: n, len, required: q })
            if *n == name && *len == required - 1 && *q == required),
        "expected BufferTooSmall for `{name}` ({} < {required}), got {r:?}",
        required - 1
    );
}

/// Each of the two inputs and the output one element short: refused, naming it, the output
/// untouched; the same through `find`.
fn short_buffers<O: ConvOp<In = f32, Out = f32, Scalar = f32>>(
    cudnn: &Cudnn,
    op: &O,
    names: [&str; 3],
    lens: [usize; 3],
) {
    let stream = cudnn.stream().clone();
    let algo = op.pick_algorithm(cudnn).unwrap();
    let mut ws = Workspace::new(stream.clone());
    let full = |n: usize| stream.clone_htod(&vec![0.5f32; n]).unwrap();
    let short = |n: usize| stream.clone_htod(&vec![0.5f32; n - 1]).unwrap();
    let (a, b) = (full(lens[0]), full(lens[1]));
    let (a_s, b_s) = (short(lens[0]), short(lens[1]));
    for which in 0..3 {
        let n = if which == 2 { lens[2] - 1 } else { lens[2] };
        let (mut out, before) = sentinel_buffer::<f32>(&stream, n);
        let inputs = match which {
            0 => (&a_s, &b),
            1 => (&a, &b_s),
            _ => (&a, &b),
        };
        let r = op.launch(cudnn, algo, (1.0, 0.0), inputs, &mut ws, &mut out);
        is_short(&r, names[which], lens[which]);
        let r = op.find(cudnn, inputs, &mut out, &mut ws).map(|_| ());
        is_short(&r, names[which], lens[which]);
        assert_untouched(names[which], &stream, &out, &before);
    }
}

#[test]
fn short_buffers_are_refused_before_launch() {
    let Some((_stream, cudnn)) = gpu() else {
        return;
    };
    let case = CASES[0];
    let d = Descs::<f32>::new(&case);
    let (x, w, y) = (
        len(&case.x_dims()),
        len(&case.w_dims()),
        len(&case.y_dims()),
    );
    let fwd = ConvForward::new(&d.conv, &d.x, &d.w, &d.y).unwrap();
    short_buffers(&cudnn, &fwd, ["x", "w", "y"], [x, w, y]);
    let bd = ConvBackwardData::new(&d.conv, &d.w, &d.y, &d.x).unwrap();
    short_buffers(&cudnn, &bd, ["w", "dy", "dx"], [w, y, x]);
    let bf = ConvBackwardFilter::new(&d.conv, &d.x, &d.y, &d.w).unwrap();
    short_buffers(&cudnn, &bf, ["x", "dy", "dw"], [x, y, w]);
}

#[test]
fn too_small_a_workspace_is_refused_before_launch() {
    let Some((stream, cudnn)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(41);
    let case = CASES[0];
    let d = Descs::<f32>::new(&case);
    let fwd = ConvForward::new(&d.conv, &d.x, &d.w, &d.y).unwrap();
    let (x, _) = upload::<f32>(&cudnn, &mut rng, len(&case.x_dims()));
    let (w, _) = upload::<f32>(&cudnn, &mut rng, len(&case.w_dims()));
    // An algorithm that needs workspace for this case (GEMM materialises im2col).
    let needs = fwd
        .heuristics(&cudnn)
        .unwrap()
        .into_iter()
        .filter(|p| p.is_supported())
        .find_map(|p| match fwd.workspace_size(&cudnn, p.algo) {
            Ok(b) if b > 0 => Some((p.algo, b)),
            _ => None,
        });
    let (algo, bytes) = needs.expect("some forward algorithm needs workspace for this case");
    let (mut y, before) = sentinel_buffer::<f32>(&stream, len(&case.y_dims()));
    let mut ws = Workspace::new(stream.clone()).with_limit(bytes - 1);
    let r = fwd.launch(&cudnn, algo, (1.0, 0.0), (&x, &w), &mut ws, &mut y);
    assert!(
        matches!(r, Err(Error::WorkspaceLimit { requested, .. }) if requested == bytes),
        "{r:?}"
    );
    assert_untouched("y", &stream, &y, &before);
    // With the limit it needs, the same call runs.
    let mut ws = Workspace::new(stream.clone()).with_limit(bytes);
    fwd.launch(&cudnn, algo, (1.0, 0.0), (&x, &w), &mut ws, &mut y)
        .unwrap();
    assert!(ws.capacity() >= bytes);
}

// ---------------------------------------------------------------------------------------------
// GPU: every listed algorithm against the f64 reference
// ---------------------------------------------------------------------------------------------

/// Forward, backward data, backward filter and the transposed convolution of every case, in
/// `T`, through every algorithm the heuristics list.
fn every_direction<T: DataType>(seed: u64) {
    let Some((_stream, cudnn)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(seed);
    for (i, case) in CASES.iter().enumerate() {
        let d = Descs::<T>::new(case);
        let (x, xf) = upload::<T>(&cudnn, &mut rng, len(&case.x_dims()));
        let (w, wf) = upload::<T>(&cudnn, &mut rng, len(&case.w_dims()));
        let (dy, dyf) = upload::<T>(&cudnn, &mut rng, len(&case.y_dims()));
        let what = |dir: &str| format!("{} case {i} {dir}", T::DTYPE);

        let fwd = ConvForward::new(&d.conv, &d.x, &d.w, &d.y).unwrap();
        let want = case.geometry().forward(&xf, &wf);
        every_algorithm(&what("forward"), &cudnn, &fwd, (&x, &w), &want);

        let bd = ConvBackwardData::new(&d.conv, &d.w, &d.y, &d.x).unwrap();
        let want = case.geometry().backward_data(&dyf, &wf);
        every_algorithm(&what("backward data"), &cudnn, &bd, (&w, &dy), &want);

        let bf = ConvBackwardFilter::new(&d.conv, &d.x, &d.y, &d.w).unwrap();
        let want = case.geometry().backward_filter(&xf, &dyf);
        every_algorithm(&what("backward filter"), &cudnn, &bf, (&x, &dy), &want);

        // The transposed convolution of dy (shaped like y) by w gives x's shape: the backward
        // data sums.
        let t = ConvTranspose::new(&d.conv, &d.y, &d.w, &d.x).unwrap();
        let want = case.geometry().backward_data(&dyf, &wf);
        let mut ran = 0;
        for algo in supported(&t.heuristics(&cudnn).unwrap()) {
            let mut out = poisoned_buffer::<T>(cudnn.stream(), len(&case.x_dims()));
            let mut ws = Workspace::new(cudnn.stream().clone());
            let ab = (T::Scalar::from_f64(1.5), T::Scalar::from_f64(0.0));
            let what = format!("{} {algo}", what("transpose"));
            match t.launch(&cudnn, algo, ab, (&dy, &w), &mut ws, &mut out) {
                Ok(()) => {
                    let got = download(cudnn.stream(), &out);
                    assert_matches(&what, &got, &want, 1.5, is_transform(algo));
                    ran += 1;
                }
                Err(e) if is_refusal(&e) => eprintln!("{what}: {e}"),
                Err(e) => panic!("{what}: {e}"),
            }
        }
        assert!(ran > 0, "{}: no algorithm ran", what("transpose"));
    }
}

#[test]
fn every_direction_and_algorithm_matches_the_reference_f32() {
    every_direction::<f32>(7);
}

#[test]
fn every_direction_and_algorithm_matches_the_reference_f64() {
    every_direction::<f64>(8);
}

#[test]
fn fused_bias_relu_matches_the_reference() {
    let Some((stream, cudnn)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(9);
    let case = CASES[0];
    let d = Descs::<f32>::new(&case);
    let (x, xf) = upload::<f32>(&cudnn, &mut rng, len(&case.x_dims()));
    let (w, wf) = upload::<f32>(&cudnn, &mut rng, len(&case.w_dims()));
    let (bias, bf) = upload::<f32>(&cudnn, &mut rng, case.k as usize);
    let bias_d = TensorDesc::<f32>::nchw(1, case.k, 1, 1).unwrap();
    let fwd = ConvForward::new(&d.conv, &d.x, &d.w, &d.y).unwrap();
    let op = ConvBiasActivation::new(fwd, &bias_d, FusedActivation::Relu).unwrap();
    // relu(conv + bias), with the bias counted among the terms of the bound.
    let plane = (case.out()[0] * case.out()[1]) as usize;
    let mut want = case.geometry().forward(&xf, &wf);
    for (i, (v, a)) in want.val.iter_mut().zip(want.abs.iter_mut()).enumerate() {
        let b = bf[(i / plane) % case.k as usize];
        *v = (*v + b).max(0.0);
        *a += b.abs();
    }
    let mut ran = 0;
    let heur = op.forward().heuristics(&cudnn).unwrap();
    for algo in supported(&heur) {
        let mut y = poisoned_buffer::<f32>(&stream, len(&case.y_dims()));
        let mut ws = Workspace::new(stream.clone());
        match op.launch(
            &cudnn,
            algo,
            (1.0, 0.0),
            (&x, &w),
            None,
            &bias,
            &mut ws,
            &mut y,
        ) {
            Ok(()) => {
                let got = download(&stream, &y);
                assert_matches(
                    &format!("fused {algo}"),
                    &got,
                    &want,
                    1.0,
                    is_transform(algo),
                );
                ran += 1;
            }
            Err(e) if is_refusal(&e) => eprintln!("fused {algo}: {e}"),
            Err(e) => panic!("fused {algo}: {e}"),
        }
    }
    assert!(ran > 0, "no fused algorithm ran");
}

// ---------------------------------------------------------------------------------------------
// The 1-D transposed convolution on 3-D [N, C, W] tensors (PyTorch's conv_transpose1d)
// ---------------------------------------------------------------------------------------------

/// A 1-D transposed convolution: `x [n, k, input]`, `w [k, c/groups, kernel]`, output
/// `[n, c, out]`.
#[derive(Clone, Copy, Debug)]
struct T1 {
    n: i64,
    k: i64,
    c: i64,
    groups: i64,
    input: i64,
    kernel: i64,
    stride: i64,
    pad: i64,
    dil: i64,
    output_padding: i64,
}

impl T1 {
    fn out(&self) -> i64 {
        (self.input - 1) * self.stride - 2 * self.pad
            + self.dil * (self.kernel - 1)
            + 1
            + self.output_padding
    }
    fn x_dims(&self) -> [i64; 3] {
        [self.n, self.k, self.input]
    }
    fn w_dims(&self) -> [i64; 3] {
        [self.k, self.c / self.groups, self.kernel]
    }
    fn y_dims(&self) -> [i64; 3] {
        [self.n, self.c, self.out()]
    }
    /// `[N, C, W]` → `[N, C, 1, W]`.
    fn four(d: [i64; 3]) -> [i64; 4] {
        [d[0], d[1], 1, d[2]]
    }
    /// Strict arithmetic (FMA math for f32, no TF32).
    fn conv(&self) -> ConvDesc {
        ConvDesc::builder(1)
            .pads(&[self.pad])
            .strides(&[self.stride])
            .dilations(&[self.dil])
            .groups(self.groups)
            .math(MathType::Fma)
            .build::<f32>()
            .unwrap()
    }
    /// The forward convolution whose backward data is this transposed convolution: its input
    /// is the transposed output (`[n, c, out]`), its output the transposed input. Its
    /// `backward_data` is the scatter sum `y[j·stride − pad + t·dil] += x[j]·w[t]`, positions
    /// outside `0..out` dropped, for every output padding.
    fn geometry(&self) -> Geometry {
        Geometry {
            n: self.n,
            c: self.c,
            k: self.k,
            groups: self.groups,
            input: vec![self.out()],
            kernel: vec![self.kernel],
            out: vec![self.input],
            pads: vec![self.pad],
            strides: vec![self.stride],
            dilations: vec![self.dil],
            flip: false,
        }
    }
}

/// Stride 2, padding 1, output padding 1 with dilation 1 and 2 and groups 1 and 2 (the output
/// padding below the stride: backward data writes y itself), plus stride 1, dilation 2, output
/// padding 1 with padding 0 and 1 (the output padding reaches the stride: backward data into
/// y's leading part, and into scratch memory).
fn t1_cases() -> Vec<T1> {
    let base = T1 {
        n: 2,
        k: 4,
        c: 6,
        groups: 1,
        input: 7,
        kernel: 3,
        stride: 2,
        pad: 1,
        dil: 1,
        output_padding: 1,
    };
    let mut cases = Vec::new();
    for dil in [1, 2] {
        for groups in [1, 2] {
            cases.push(T1 {
                dil,
                groups,
                ..base
            });
        }
    }
    for pad in [0, 1] {
        cases.push(T1 {
            stride: 1,
            dil: 2,
            pad,
            groups: 2,
            ..base
        });
    }
    cases
}

#[test]
fn conv_transpose_takes_the_3d_shapes_transpose_output_dims_returns() {
    if !have_cudnn() {
        return;
    }
    for case in t1_cases() {
        let conv = case.conv();
        let what = format!("{case:?}");
        let y_dims = conv
            .transpose_output_dims(&case.x_dims(), &case.w_dims(), &[case.output_padding])
            .unwrap();
        assert_eq!(y_dims, case.y_dims(), "{what}");
        let x = TensorDesc::<f32>::nchw_nd(&case.x_dims()).unwrap();
        let w = FilterDesc::<f32>::new(&case.w_dims(), TensorFormat::Nchw).unwrap();
        for y in [
            TensorDesc::<f32>::nchw_nd(&y_dims).unwrap(),
            TensorDesc::<f32>::nhwc_nd(&y_dims).unwrap(),
        ] {
            let t = ConvTranspose::new(&conv, &x, &w, &y)
                .unwrap_or_else(|e| panic!("{what} {:?}: {e}", y.layout()));
            // The backward-data pass has the caller's rank (checked again in debug builds when
            // it is built).
            let pass = t.backward_data().expect("a pass");
            assert_eq!(pass.dx().dims().len(), 3, "{what}");
            assert!(std::ptr::eq(pass.dy(), &x), "{what}");
        }
        // The 4-D form of the same problem is taken as before.
        let x4 = TensorDesc::<f32>::nchw_nd(&T1::four(case.x_dims())).unwrap();
        let w4 = FilterDesc::<f32>::new(&T1::four(case.w_dims()), TensorFormat::Nchw).unwrap();
        let y4 = TensorDesc::<f32>::nchw_nd(&T1::four(case.y_dims())).unwrap();
        assert!(ConvTranspose::new(&conv, &x4, &w4, &y4).is_ok(), "{what}");

        // Refusals name the argument: a y no output padding gives, a 4-D y with 3-D x and w,
        // an x whose channels are not the filter count.
        let mut long = case.y_dims();
        long[2] += case.stride.max(case.dil);
        let ys = [
            TensorDesc::<f32>::nchw_nd(&long).unwrap(),
            TensorDesc::<f32>::nchw_nd(&T1::four(case.y_dims())).unwrap(),
        ];
        // The rule's side is the output without output padding, in the caller's rank.
        let base = [case.n, case.c, case.out() - case.output_padding];
        for y_bad in &ys {
            let r = ConvTranspose::new(&conv, &x, &w, y_bad);
            assert!(
                matches!(&r, Err(Error::ShapeMismatch { a: "y", a_dims, b_dims, .. })
                    if a_dims == y_bad.dims() && b_dims[..] == base),
                "{what} y {:?}: {r:?}",
                y_bad.dims()
            );
        }
        let mut x_bad = case.x_dims();
        x_bad[1] += 1;
        let x_bad = TensorDesc::<f32>::nchw_nd(&x_bad).unwrap();
        let y = TensorDesc::<f32>::nchw_nd(&y_dims).unwrap();
        let r = ConvTranspose::new(&conv, &x_bad, &w, &y);
        assert!(
            matches!(r, Err(Error::ShapeMismatch { a: "x", b: "w", .. })),
            "{what}: {r:?}"
        );
        // A 4-D filter with a 3-D x: the ranks must agree.
        let r = ConvTranspose::new(&conv, &x, &w4, &y);
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{what}: {r:?}"
        );
    }
}

/// Every backward-data algorithm the heuristics list for each [`t1_cases`] case, f32, on 3-D
/// `[N, C, W]` tensors: outputs poisoned with NaN, `alpha = 1.5, beta = 0`, checked against the
/// f64 scatter reference; the same algorithm on the 4-D form `[N, C, 1, W]` must give the same
/// result (bit for bit when cuDNN calls the algorithm deterministic).
#[test]
fn conv_transpose_1d_on_3d_tensors_matches_the_reference_and_the_4d_form() {
    let Some((stream, cudnn)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(41);
    let alpha = 1.5;
    let ab = (alpha as f32, 0.0f32);
    for case in t1_cases() {
        let what = format!("{case:?}");
        let conv = case.conv();
        let x = TensorDesc::<f32>::nchw_nd(&case.x_dims()).unwrap();
        let w = FilterDesc::<f32>::new(&case.w_dims(), TensorFormat::Nchw).unwrap();
        let y = TensorDesc::<f32>::nchw_nd(&case.y_dims()).unwrap();
        let x4 = TensorDesc::<f32>::nchw_nd(&T1::four(case.x_dims())).unwrap();
        let w4 = FilterDesc::<f32>::new(&T1::four(case.w_dims()), TensorFormat::Nchw).unwrap();
        let y4 = TensorDesc::<f32>::nchw_nd(&T1::four(case.y_dims())).unwrap();
        let (xb, xf) = upload::<f32>(&cudnn, &mut rng, x.span());
        let (wb, wf) = upload::<f32>(&cudnn, &mut rng, w.span());
        let want = case.geometry().backward_data(&xf, &wf);
        let t = ConvTranspose::new(&conv, &x, &w, &y).unwrap();
        let t4 = ConvTranspose::new(&conv, &x4, &w4, &y4).unwrap();
        let heur = t.heuristics(&cudnn).unwrap();
        let mut ran = 0;
        for algo in supported(&heur) {
            let what = format!("{what} {algo}");
            let deterministic = heur.iter().any(|p| p.algo == algo && p.deterministic);
            let run = |op: &ConvTranspose<'_, f32>| {
                let mut out = poisoned_buffer::<f32>(&stream, y.span());
                let mut ws = Workspace::new(stream.clone());
                op.launch(&cudnn, algo, ab, (&xb, &wb), &mut ws, &mut out)
                    .map(|()| download(&stream, &out))
            };
            match (run(&t), run(&t4)) {
                (Ok(got), Ok(got4)) => {
                    assert_matches(&what, &got, &want, alpha, is_transform(algo));
                    assert_matches(
                        &format!("{what} 4-D"),
                        &got4,
                        &want,
                        alpha,
                        is_transform(algo),
                    );
                    if deterministic {
                        let bits = |v: &[f32]| v.iter().map(|g| g.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&got), bits(&got4), "{what}: 3-D and 4-D differ");
                    }
                    ran += 1;
                }
                (Err(e), Err(e4)) if is_refusal(&e) && is_refusal(&e4) => {
                    eprintln!("{what}: refused: {e}")
                }
                (r, r4) => panic!("{what}: 3-D {:?}, 4-D {:?}", r.map(|_| ()), r4.map(|_| ())),
            }
        }
        assert!(ran > 0, "{what}: no listed algorithm ran: {heur:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// FusedConv: conv + bias (+ residual) (+ ReLU) as one graph, channels-last
// ---------------------------------------------------------------------------------------------

/// `[relu](conv(x, w) + b [+ z])` in f64, every tensor channels-last (`x` `[N, H, W, C]`, `w`
/// `[K, R, S, C]`, `y` and `z` `[N, P, Q, K]`), padding `pad`, stride `stride`.
#[allow(clippy::too_many_arguments)] // the layer's tensors and geometry
fn fused_reference(
    [n, c, h, w_]: [i64; 4],
    [k, r, s]: [i64; 3],
    pad: i64,
    stride: i64,
    x: &[f64],
    w: &[f64],
    b: &[f64],
    z: Option<&[f64]>,
    relu: bool,
) -> (Vec<f64>, [i64; 4]) {
    let p = (h + 2 * pad - r) / stride + 1;
    let q = (w_ + 2 * pad - s) / stride + 1;
    let mut y = vec![0.0; (n * p * q * k) as usize];
    for ni in 0..n {
        for pi in 0..p {
            for qi in 0..q {
                for ki in 0..k {
                    let mut acc = b[ki as usize];
                    for ri in 0..r {
                        for si in 0..s {
                            let (hi, wi) = (pi * stride - pad + ri, qi * stride - pad + si);
                            if hi < 0 || hi >= h || wi < 0 || wi >= w_ {
                                continue;
                            }
                            for ci in 0..c {
                                let xv = x[(((ni * h + hi) * w_ + wi) * c + ci) as usize];
                                let wv = w[(((ki * r + ri) * s + si) * c + ci) as usize];
                                acc += xv * wv;
                            }
                        }
                    }
                    let o = (((ni * p + pi) * q + qi) * k + ki) as usize;
                    if let Some(z) = z {
                        acc += z[o];
                    }
                    y[o] = if relu { acc.max(0.0) } else { acc };
                }
            }
        }
    }
    (y, [n, k, p, q])
}

fn fused_conv_case<T: DataType>(seed: u64, tolerance: f64) {
    use cudnn_safe::conv::{Epilogue, FusedConv};
    use cudnn_safe::graph::{ConvParams, PlanCache};
    let Some((stream, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(seed);
    let mut plans = PlanCache::new();
    let mut ws = Workspace::new(stream.clone());
    // (input, filter, pad, stride, epilogue)
    let cases = [
        ([2, 16, 9, 9], [8, 3, 3], 1, 1, (true, true)),
        ([3, 8, 10, 7], [16, 3, 3], 1, 2, (false, true)),
        ([2, 32, 6, 6], [24, 1, 1], 0, 1, (true, true)),
        ([1, 16, 8, 8], [8, 1, 1], 0, 2, (false, false)),
    ];
    for (xd, [k, r, s], pad, stride, (residual, relu)) in cases {
        let what = format!("{} x {xd:?} w [{k}, {r}, {s}] pad {pad} stride {stride} residual {residual} relu {relu}", T::DTYPE);
        let params = ConvParams::new(2)
            .with_padding(&[pad, pad])
            .with_strides(&[stride, stride]);
        let epi = Epilogue { residual, relu };
        let layer = FusedConv::new(&cudnn, T::DTYPE, xd, [k, xd[1], r, s], &params, epi).unwrap();
        let (x, xv) = upload::<T>(&cudnn, &mut rng, layer.x_span());
        let (w, wv) = upload::<T>(&cudnn, &mut rng, layer.w_span());
        let (b, bv) = upload::<T>(&cudnn, &mut rng, layer.b_span());
        let (z, zv) = upload::<T>(&cudnn, &mut rng, layer.y_span());
        let (want, dims) = fused_reference(
            xd,
            [k, r, s],
            pad,
            stride,
            &xv,
            &wv,
            &bv,
            residual.then_some(&zv[..]),
            relu,
        );
        assert_eq!(layer.y_dims(), dims, "{what}");
        let mut y = poisoned_buffer::<T>(&stream, layer.y_span());
        let zarg = residual.then(|| z.as_view());
        layer
            .run(&cudnn, &mut plans, &x, &w, &b, zarg, &mut y, &mut ws)
            .unwrap();
        let got = to_f64(&download(&stream, &y));
        let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - e).abs() <= tolerance * scale,
                "{what}: y[{i}] = {g}, expected {e}"
            );
        }
        // The residual is given exactly when the epilogue has one; a short output is refused.
        let wrong_z = if residual { None } else { Some(z.as_view()) };
        let e = layer
            .run(&cudnn, &mut plans, &x, &w, &b, wrong_z, &mut y, &mut ws)
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    what: "residual `z`",
                    ..
                }
            ),
            "{what}: {e:?}"
        );
        let mut short = stream.alloc_zeros::<T>(layer.y_span() - 1).unwrap();
        let zarg = residual.then(|| z.as_view());
        let e = layer
            .run(&cudnn, &mut plans, &x, &w, &b, zarg, &mut short, &mut ws)
            .unwrap_err();
        assert!(matches!(e, Error::BufferTooSmall { .. }), "{what}: {e:?}");
    }
}

#[test]
fn fused_conv_block_matches_the_reference_f16() {
    fused_conv_case::<cudnn_safe::half::f16>(41, 1e-2);
}

#[test]
fn fused_conv_block_matches_the_reference_bf16() {
    fused_conv_case::<cudnn_safe::half::bf16>(42, 5e-2);
}

#[test]
fn fold_batch_norm_matches_batch_norm_after_the_convolution() {
    // Two 1×1 filters over 3 channels; conv then batch norm at one point, in f64 by hand.
    let w = [0.5f32, -1.0, 2.0, 1.5, 0.25, -0.75];
    let bias = [0.1f32, -0.2];
    let (gamma, beta, mean, var) = ([1.5f32, 0.5], [0.2f32, -0.1], [0.3f32, -0.4], [2.0f32, 0.5]);
    let eps = 1e-5;
    let (wf, bf) =
        cudnn_safe::norm::fold_batch_norm(&w, Some(&bias), &gamma, &beta, &mean, &var, eps)
            .unwrap();
    let x = [0.7f64, -1.3, 0.4];
    for k in 0..2 {
        let conv: f64 =
            (0..3).map(|c| f64::from(w[k * 3 + c]) * x[c]).sum::<f64>() + f64::from(bias[k]);
        let bn = f64::from(gamma[k]) * (conv - f64::from(mean[k]))
            / (f64::from(var[k]) + eps).sqrt()
            + f64::from(beta[k]);
        let folded: f64 =
            (0..3).map(|c| f64::from(wf[k * 3 + c]) * x[c]).sum::<f64>() + f64::from(bf[k]);
        assert!((bn - folded).abs() < 1e-5, "channel {k}: {bn} vs {folded}");
    }
    // Lengths that disagree are refused naming the argument.
    let e = cudnn_safe::norm::fold_batch_norm(&w, None, &gamma, &beta, &mean[..1], &var, eps)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { what: "mean", .. }),
        "{e:?}"
    );
    let e = cudnn_safe::norm::fold_batch_norm(&w[..5], None, &gamma, &beta, &mean, &var, eps)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { what: "w", .. }),
        "{e:?}"
    );
    let e = cudnn_safe::norm::fold_batch_norm(&w, None, &gamma, &beta, &mean, &[0.0, 1.0], 0.0)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { what: "var", .. }),
        "{e:?}"
    );
}
