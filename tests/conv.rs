//! GPU correctness tests for the convolution module: forward (every algorithm, every data type),
//! backward data, backward filter, backward bias, the fused conv + bias + activation, the
//! transposed convolution, the find calls, the autotuner, and the argument checks that must
//! reject a call before launch.
//!
//! References are computed on the host in `f64` from the values as stored (inputs rounded to the
//! tensor type first), on random shapes and values from a seeded PRNG (one seed per test). One
//! routine enumerates the terms of the forward sum ([`Geometry::for_each_term`]): the forward
//! reference adds `x·w` into `y`, backward data adds `dy·w` into `dx` and backward filter adds
//! `x·dy` into `dw`, over the same terms, so the three references are adjoint by construction.
//! Host data is kept in logical row-major order and reaches the device through strides computed
//! here (and compared with the descriptors' own), so the NHWC and KRSC layouts are checked too.
//!
//! Outputs are poisoned with NaN before each call that does not read them (`beta = 0`) so that
//! unwritten elements show; gaps between the elements of strided outputs hold a sentinel that
//! must survive; a rejected call must leave its whole output untouched.
//!
//! Shapes are small (N 1..=3, C and K up to 9, spatial sizes up to 10) so that the binary stays
//! quick under compute-sanitizer too.
//!
//! Without a GPU (no driver, no device, no cuDNN) every test prints `skipping: <why>` and passes,
//! unless `CUDNN_SAFE_REQUIRE_GPU=1`, when it fails instead.
mod common;

use common::conv::*;
use common::{assert_untouched, download, other_context, scalar, to_f64, Rng, SENTINEL};
use cudnn_safe::conv::{
    AlgoPerf, ConvAlgorithm, ConvBwdDataAlgo, ConvBwdFilterAlgo, ConvDesc, ConvFwdAlgo, ConvMode,
    FusedActivation, MathType,
};
use cudnn_safe::cudarc::driver::CudaSlice;
use cudnn_safe::graph::{ConvParams, Graph};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::tune::{
    Choice, FixedAlgos, Policy, SearchEffort, Source, DEFAULT_FINALISTS, DEFAULT_FINAL_SOLO_MS,
    QUICK_GRAPH_PLANS,
};
use cudnn_safe::tune::{ConvApi, GraphSearch};
use cudnn_safe::DType;
use cudnn_safe::{
    Autotuner, Cudnn, DataType, Error, FilterDesc, StatusFamily, TensorDesc, TensorFormat,
    Workspace,
};

// ---------------------------------------------------------------------------------------------
// Forward, every algorithm
// ---------------------------------------------------------------------------------------------

#[test]
fn forward_f32_fma_every_algorithm() {
    let p = fwd(MathType::Fma, FP32);
    forward_sweep::<f32, f32>(101, "forward f32 (FMA)", &F32_ANY, 6, p);
}

#[test]
fn forward_f32_tf32_every_algorithm() {
    let p = fwd(MathType::Default, TF32);
    forward_sweep::<f32, f32>(102, "forward f32 (TF32)", &F32_NCHW_2D, 4, p);
}

#[test]
fn forward_f64_every_algorithm() {
    let p = fwd(MathType::Default, FP64);
    forward_sweep::<f64, f64>(103, "forward f64", &F64_NCHW, 5, p);
}

#[test]
fn forward_f16_nhwc_every_algorithm() {
    let p = fwd(MathType::TensorOp, FP16);
    forward_sweep::<f16, f16>(104, "forward f16 NHWC", &F16_NHWC, 5, p);
}

#[test]
fn forward_f16_nchw_every_algorithm() {
    let p = fwd(MathType::TensorOp, FP16);
    forward_sweep::<f16, f16>(105, "forward f16 NCHW", &F16_NCHW, 4, p);
}

#[test]
fn forward_bf16_nhwc_every_algorithm() {
    let p = fwd(MathType::TensorOp, BF16);
    forward_sweep::<bf16, bf16>(106, "forward bf16 NHWC", &BF16_NHWC, 4, p);
}

#[test]
fn forward_i8_to_f32_nhwc_is_exact() {
    let p = Fwd {
        gen: Gen::SmallInts,
        ..fwd(MathType::Default, EXACT)
    };
    forward_sweep::<i8, f32>(107, "forward i8 -> f32 NHWC", &I8_NHWC, 4, p);
}

#[test]
fn forward_i8_to_i8_nhwc_saturates() {
    let p = Fwd {
        gen: Gen::SmallInts,
        ..fwd(MathType::Default, I8_OUT)
    };
    forward_sweep::<i8, i8>(108, "forward i8 -> i8 NHWC", &I8_NHWC, 4, p);
}

#[test]
fn forward_into_strided_output_keeps_gaps() {
    let p = Fwd {
        gaps: true,
        ..fwd(MathType::Fma, FP32)
    };
    forward_sweep::<f32, f32>(
        109,
        "forward f32 into an output with gaps",
        &F32_NCHW_2D,
        3,
        p,
    );
}

#[test]
fn forward_accumulates_with_alpha_and_beta() {
    let f32_p = Fwd {
        alpha: 1.5,
        beta: -0.75,
        ..fwd(MathType::Fma, FP32)
    };
    forward_sweep::<f32, f32>(110, "forward f32 y = 1.5·conv − 0.75·y", &F32_ANY, 3, f32_p);
    let f64_p = Fwd {
        alpha: -0.5,
        beta: 2.0,
        ..fwd(MathType::Default, FP64)
    };
    forward_sweep::<f64, f64>(111, "forward f64 y = −0.5·conv + 2·y", &F64_NCHW, 2, f64_p);
    let f16_p = Fwd {
        alpha: 0.5,
        beta: 1.0,
        ..fwd(MathType::TensorOp, FP16)
    };
    forward_sweep::<f16, f16>(
        112,
        "forward f16 NHWC y = 0.5·conv + y",
        &F16_NHWC,
        2,
        f16_p,
    );
}

// ---------------------------------------------------------------------------------------------
// Backward data and filter, every algorithm; the adjoint identity
// ---------------------------------------------------------------------------------------------

#[test]
fn backward_f32_fma_every_algorithm() {
    backward_sweep::<f32>(201, "f32 (FMA)", &F32_ANY, 5, MathType::Fma, FP32);
}

#[test]
fn backward_f64_every_algorithm() {
    backward_sweep::<f64>(202, "f64", &F64_NCHW, 4, MathType::Default, FP64);
}

#[test]
fn backward_f16_nhwc_every_algorithm() {
    backward_sweep::<f16>(203, "f16 NHWC", &F16_NHWC, 4, MathType::TensorOp, FP16);
}

#[test]
fn backward_bf16_nhwc_every_algorithm() {
    backward_sweep::<bf16>(204, "bf16 NHWC", &BF16_NHWC, 3, MathType::TensorOp, BF16);
}

/// `⟨conv(x, w), dy⟩ = ⟨x, dgrad(dy, w)⟩ = ⟨w, wgrad(x, dy)⟩` on the GPU results alone (f64), on
/// shapes with groups, dilation and stride. Tolerance 1e-10 of `Σ|x·w·dy|` over the terms.
#[test]
fn adjoint_identity_f64() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(301);
    let mut ws = Workspace::new(g.stream.clone());
    let mut worst = 0.0f64;
    let cases = 6;
    for i in 0..cases {
        let case = rng.case(&F64_NCHW, i);
        let what = format!("adjoint {}", case.short());
        let s = Setup::<f64>::new(&g, &mut rng, &case, MathType::Default, Gen::Uniform);
        let y_d = s.y_lay.desc::<f64>();
        let dyh: Vec<f64> = rng.values(s.y_lay.count());
        let dy = s.y_lay.upload(&g, &dyh);

        let fa = first_accepted(&what, |a| {
            g.cudnn
                .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, &y_d, a)
        });
        let mut y = g
            .stream
            .clone_htod(&s.y_lay.output_image::<f64>(None))
            .unwrap();
        g.cudnn
            .conv_forward(
                1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, fa, &mut ws, 0.0, &y_d, &mut y,
            )
            .unwrap_or_else(|e| panic!("{what} forward {fa}: {e}"));

        let da = first_accepted(&what, |a| {
            g.cudnn
                .conv_backward_data_workspace_size(&s.w_d, &y_d, &s.conv, &s.x_d, a)
        });
        let mut dx = g
            .stream
            .clone_htod(&s.x_lay.output_image::<f64>(None))
            .unwrap();
        g.cudnn
            .conv_backward_data(
                1.0, &s.w_d, &s.w, &y_d, &dy, &s.conv, da, &mut ws, 0.0, &s.x_d, &mut dx,
            )
            .unwrap_or_else(|e| panic!("{what} backward data {da}: {e}"));

        let fa2 = first_accepted(&what, |a| {
            g.cudnn
                .conv_backward_filter_workspace_size(&s.x_d, &y_d, &s.conv, &s.w_d, a)
        });
        let mut dw = g
            .stream
            .clone_htod(&s.w_lay.output_image::<f64>(None))
            .unwrap();
        g.cudnn
            .conv_backward_filter(
                1.0, &s.x_d, &s.x, &y_d, &dy, &s.conv, fa2, &mut ws, 0.0, &s.w_d, &mut dw,
            )
            .unwrap_or_else(|e| panic!("{what} backward filter {fa2}: {e}"));

        let y = gather(&s.y_lay, &download(&g.stream, &y));
        let dx = gather(&s.x_lay, &download(&g.stream, &dx));
        let dw = gather(&s.w_lay, &download(&g.stream, &dw));
        let dyf = to_f64(&dyh);
        let (a, b, c) = (dot(&y, &dyf), dot(&s.xf, &dx), dot(&s.wf, &dw));
        let mut scale = 0.0;
        s.geo
            .for_each_term(|xi, wi, yi| scale += (s.xf[xi] * s.wf[wi] * dyf[yi]).abs());
        let bound = 1e-10 * scale;
        for (name, u, v) in [("<y,dy> vs <x,dx>", a, b), ("<y,dy> vs <w,dw>", a, c)] {
            let err = (u - v).abs();
            assert!(
                err <= bound,
                "{what}: {name}: {u} vs {v} (difference {err:.3e}, bound {bound:.3e})"
            );
            if err > 0.0 {
                worst = worst.max(err / bound);
            }
        }
    }
    println!(
        "adjoint identity f64: {cases} shapes, <y,dy> = <x,dx> = <w,dw> within {worst:.3} of 1e-10·Σ|x·w·dy|"
    );
}

// ---------------------------------------------------------------------------------------------
// Backward bias
// ---------------------------------------------------------------------------------------------

/// `db = alpha·Σ_{n, spatial} dy + beta·db` for `dy` of `dims` in `fmt`. Returns the worst
/// error/tolerance ratio, or `None` when `may_refuse` and cuDNN refused the case (then `db` must be
/// untouched).
#[allow(clippy::too_many_arguments)]
fn bias_case<T: DataType>(
    g: &Gpu,
    rng: &mut Rng,
    dims: &[i64],
    fmt: Fmt,
    tol: Tol,
    (alpha, beta): (f64, f64),
    may_refuse: bool,
) -> Option<f64> {
    let lay = Lay::packed(dims, fmt);
    let dy_d = lay.desc::<T>();
    let mut db_dims = vec![1i64; dims.len()];
    db_dims[1] = dims[1];
    let db_lay = Lay::packed(&db_dims, Fmt::Nchw);
    let db_d = db_lay.desc::<T>();
    let dyh: Vec<T> = rng.values(lay.count());
    let dy = lay.upload(g, &dyh);
    // A 1×1 convolution's geometry: dy [N, K, spatial...].
    let sp = dims.len() - 2;
    let geo = Geometry {
        n: dims[0],
        c: dims[1],
        k: dims[1],
        groups: 1,
        input: dims[2..].to_vec(),
        kernel: vec![1; sp],
        out: dims[2..].to_vec(),
        pads: vec![0; sp],
        strides: vec![1; sp],
        dilations: vec![1; sp],
        flip: false,
    };
    let r = geo.backward_bias(&to_f64(&dyh));
    let (alpha_s, alpha) = scalar::<T>(alpha);
    let (beta_s, beta) = scalar::<T>(beta);
    let old: Option<Vec<T>> = (beta != 0.0).then(|| rng.values(db_lay.count()));
    let oldf = old.as_deref().map(to_f64);
    let before = db_lay.output_image(old.as_deref());
    let mut db = g.stream.clone_htod(&before).unwrap();
    let what = format!(
        "backward bias<{}> dy {dims:?} {fmt:?} alpha {alpha} beta {beta}",
        T::DTYPE
    );
    match g
        .cudnn
        .conv_backward_bias(alpha_s, &dy_d, &dy, beta_s, &db_d, &mut db)
    {
        Ok(()) => {}
        Err(e) if may_refuse && is_refusal(&e) => {
            assert_untouched(&what, &g.stream, &db, &before);
            println!("{what}: refused by cuDNN ({e})");
            return None;
        }
        Err(e) => panic!("{what}: {e}"),
    }
    let got = download(&g.stream, &db);
    let (want, bound) = tol.expect(&r, alpha, beta, oldf.as_deref(), false);
    Some(check(&what, &got, &before, &db_lay, &want, &bound))
}

#[test]
fn backward_bias_matches_reference() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(351);
    let mut results = Vec::new();
    let f32_cases: [(&[i64], Fmt, (f64, f64)); 4] = [
        (&[3, 5, 7, 6], Fmt::Nchw, (1.0, 0.0)),
        (&[2, 7, 4, 9], Fmt::Nhwc, (1.0, 0.0)),
        (&[2, 3, 1, 10], Fmt::Nchw, (2.0, 1.0)),
        (&[2, 4, 3, 5, 4], Fmt::Nchw, (1.0, 0.0)),
    ];
    for (dims, fmt, ab) in f32_cases {
        results.push(bias_case::<f32>(&g, &mut rng, dims, fmt, FP32, ab, false));
    }
    let f64_cases: [(&[i64], Fmt, (f64, f64)); 2] = [
        (&[3, 6, 5, 5], Fmt::Nchw, (1.0, 0.0)),
        (&[2, 3, 4, 3, 5], Fmt::Nchw, (-0.5, 0.25)),
    ];
    for (dims, fmt, ab) in f64_cases {
        results.push(bias_case::<f64>(&g, &mut rng, dims, fmt, FP64, ab, false));
    }
    let f16_cases: [(&[i64], Fmt, (f64, f64)); 2] = [
        (&[2, 8, 6, 6], Fmt::Nhwc, (1.0, 0.0)),
        (&[3, 5, 4, 7], Fmt::Nchw, (1.0, 1.0)),
    ];
    for (dims, fmt, ab) in f16_cases {
        results.push(bias_case::<f16>(&g, &mut rng, dims, fmt, FP16, ab, false));
    }
    // cuDNN does not document bf16 for this call: a refusal is accepted (output untouched).
    let bf = bias_case::<bf16>(
        &g,
        &mut rng,
        &[2, 8, 5, 5],
        Fmt::Nhwc,
        BF16,
        (1.0, 0.0),
        true,
    );
    results.push(bf);
    let ran: Vec<f64> = results.iter().flatten().copied().collect();
    let worst = ran.iter().fold(0.0f64, |m, &w| m.max(w));
    println!(
        "backward bias: {} of {} cases ran (f32, f64, f16{}; NCHW, NHWC, 3-D; beta 0 and ≠ 0); worst error {worst:.3} of the tolerance",
        ran.len(),
        results.len(),
        if bf.is_some() { ", bf16" } else { "; bf16 refused by cuDNN" }
    );
}

// ---------------------------------------------------------------------------------------------
// Fused convolution + bias + activation
// ---------------------------------------------------------------------------------------------

/// `y = act(alpha1·conv(x, w) + alpha2·z + bias)` with each of `algos` cuDNN accepts, with `z`
/// and without (then `y` is NaN-poisoned: cuDNN must not read it although the crate passes it as
/// `z` with `alpha2 = 0`).
#[allow(clippy::too_many_arguments)]
fn fused_case<X: DataType>(
    g: &Gpu,
    ws: &mut Workspace,
    rng: &mut Rng,
    case: &Case,
    math: MathType,
    tol: Tol,
    act: FusedActivation,
    algos: &[ConvFwdAlgo],
    tally: &mut Tally,
) {
    let s = Setup::<X>::new(g, rng, case, math, Gen::Uniform);
    let y_d = s.y_lay.desc::<X>();
    let mut b_dims = vec![1i64; case.x_dims().len()];
    b_dims[1] = case.k;
    let b_lay = Lay::packed(&b_dims, Fmt::Nchw);
    let b_d = b_lay.desc::<X>();
    let bh: Vec<X> = rng.values(b_lay.count());
    let bias = b_lay.upload(g, &bh);
    let zh: Vec<X> = rng.values(s.y_lay.count());
    let z = s.y_lay.upload(g, &zh);
    let r = s.geo.forward(&s.xf, &s.wf);
    let (a1_s, a1) = scalar::<X>(0.75);
    let (a2_s, a2) = scalar::<X>(-1.5);
    for with_z in [true, false] {
        // The reference with z and the bias folded in.
        let mut full = Ref::zeros(r.val.len(), r.red);
        for i in 0..r.val.len() {
            let zt = if with_z { a2 * zh[i].to_f64() } else { 0.0 };
            let bt = bh[s.geo.channel_of(i)].to_f64();
            full.val[i] = a1 * r.val[i] + zt + bt;
            full.abs[i] = a1.abs() * r.abs[i] + zt.abs() + bt.abs();
        }
        let before = s.y_lay.output_image::<X>(None);
        let what = format!("fused {act:?}<{}> {} z {with_z}", X::DTYPE, case.short());
        sweep::<ConvFwdAlgo, X>(
            g,
            &what,
            algos,
            &s.y_lay,
            &before,
            tally,
            |a| {
                g.cudnn
                    .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, &y_d, a)
            },
            |a, y| {
                g.cudnn.conv_bias_activation_forward(
                    a1_s,
                    &s.x_d,
                    &s.x,
                    &s.w_d,
                    &s.w,
                    &s.conv,
                    a,
                    ws,
                    a2_s,
                    with_z.then(|| z.as_view()),
                    &b_d,
                    &bias,
                    act,
                    &y_d,
                    y,
                )
            },
            |a| {
                let (mut want, bound) = tol.expect(&full, 1.0, 0.0, None, is_transform(a));
                if act == FusedActivation::Relu {
                    // max(0, ·) is 1-Lipschitz: the bound carries over.
                    want.iter_mut().for_each(|v| *v = v.max(0.0));
                }
                (want, bound)
            },
        );
    }
}

#[test]
fn fused_bias_relu_every_accepted_algorithm() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(401);
    let mut ws = Workspace::new(g.stream.clone());
    let mut t = Tally::default();
    for i in 0..3 {
        let case = rng.case(&F32_NCHW_2D, i);
        let relu = FusedActivation::Relu;
        fused_case::<f32>(
            &g,
            &mut ws,
            &mut rng,
            &case,
            MathType::Fma,
            FP32,
            relu,
            ConvFwdAlgo::ALL,
            &mut t,
        );
    }
    println!(
        "{}",
        t.line("fused conv+bias+relu f32 (with and without z)")
    );
    let mut t = Tally::default();
    for i in 0..2 {
        let case = rng.case(&F16_NHWC, i);
        let relu = FusedActivation::Relu;
        fused_case::<f16>(
            &g,
            &mut ws,
            &mut rng,
            &case,
            MathType::TensorOp,
            FP16,
            relu,
            ConvFwdAlgo::ALL,
            &mut t,
        );
    }
    println!(
        "{}",
        t.line("fused conv+bias+relu f16 NHWC (with and without z)")
    );
}

#[test]
fn fused_identity_runs_only_with_implicit_precomp_gemm() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(402);
    let mut ws = Workspace::new(g.stream.clone());
    let mut t = Tally::default();
    let id = FusedActivation::Identity;
    let precomp = [ConvFwdAlgo::ImplicitPrecompGemm];
    for i in 0..3 {
        let case = rng.case(&F32_NCHW_2D, i);
        fused_case::<f32>(
            &g,
            &mut ws,
            &mut rng,
            &case,
            MathType::Fma,
            FP32,
            id,
            &precomp,
            &mut t,
        );
    }

    // Any other algorithm is refused before launch, y untouched.
    let case = Case::square(2, 4, 6, 5, 3, 1, 1, 1, Fmt::Nchw);
    let s = Setup::<f32>::new(&g, &mut rng, &case, MathType::Fma, Gen::Uniform);
    let y_d = s.y_lay.desc::<f32>();
    let b_d = TensorDesc::<f32>::nchw(1, case.k, 1, 1).unwrap();
    let bias = g
        .stream
        .clone_htod(&rng.values::<f32>(case.k as usize))
        .unwrap();
    let before = vec![SENTINEL as f32; y_d.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let mut rejected = 0;
    for &a in ConvFwdAlgo::ALL {
        if a == ConvFwdAlgo::ImplicitPrecompGemm {
            continue;
        }
        let r = g.cudnn.conv_bias_activation_forward(
            1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, a, &mut ws, 0.0, None, &b_d, &bias, id, &y_d,
            &mut y,
        );
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "identity with {a}: {r:?}"
        );
        rejected += 1;
    }
    assert_untouched("fused identity, other algorithms", &g.stream, &y, &before);
    println!(
        "{}; {rejected} other algorithms rejected with InvalidArgument, y untouched",
        t.line("fused conv+bias+identity f32 IMPLICIT_PRECOMP_GEMM (with and without z)")
    );
}

// ---------------------------------------------------------------------------------------------
// Transposed convolution
// ---------------------------------------------------------------------------------------------

impl Rng {
    /// The forward convolution behind a random transposed convolution with stride 2 and output
    /// padding 1 (in the spatial dimensions that are convolved): its input has the transposed
    /// output's shape, `(in − 1)·stride − 2·pad + dilation·(k − 1) + 1 + output_padding`, and its
    /// output the transposed input's (checked).
    fn transpose_case(&mut self, spatial: usize) -> Case {
        let groups = self.range(1, 3);
        let (c, k) = (groups * self.range(1, 4), groups * self.range(1, 4));
        let sp = if spatial == 3 { 3 } else { 2 };
        let (mut fwd_in, mut t_in, mut kernel, mut pads, mut strides, mut dilations) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for d in 0..sp {
            if spatial == 1 && d == 0 {
                fwd_in.push(1);
                t_in.push(1);
                kernel.push(1);
                pads.push(0);
                strides.push(1);
                dilations.push(1);
                continue;
            }
            let ker = self.range(1, 4);
            let dil = self.range(1, 3);
            let extent = dil * (ker - 1) + 1;
            let pad = self.range(0, extent / 2 + 1);
            let tin = self.range(1, 6);
            // (tin − 1)·2 − 2·pad + dil·(ker − 1) + 1 + 1
            fwd_in.push((tin - 1) * 2 - 2 * pad + extent + 1);
            t_in.push(tin);
            kernel.push(ker);
            pads.push(pad);
            strides.push(2);
            dilations.push(dil);
        }
        let case = Case {
            spatial,
            n: self.range(1, 3),
            c,
            k,
            groups,
            input: fwd_in,
            kernel,
            pads,
            strides,
            dilations,
            mode: ConvMode::CrossCorrelation,
            fmt: Fmt::Nchw,
        };
        assert_eq!(
            case.out(),
            t_in,
            "the forward convolution maps the transposed output back to its input"
        );
        case
    }
}

/// `y = alpha·conv_transpose(x, w) + beta·y` with every backward-data algorithm cuDNN accepts,
/// for a random [`Rng::transpose_case`], checked against the backward-data reference of the
/// forward convolution (x has that convolution's output shape, y its input shape).
#[allow(clippy::too_many_arguments)]
fn transpose_case<T: DataType>(
    g: &Gpu,
    ws: &mut Workspace,
    rng: &mut Rng,
    spatial: usize,
    math: MathType,
    tol: Tol,
    (alpha, beta): (f64, f64),
    tally: &mut Tally,
) {
    let case = rng.transpose_case(spatial);
    let what = format!("conv_transpose<{}> {}", T::DTYPE, case.short());
    let conv = case.conv::<T>(math);
    let x_lay = Lay::packed(&case.y_dims(), Fmt::Nchw);
    let w_lay = Lay::packed(&case.w_dims(), Fmt::Nchw);
    let y_lay = Lay::packed(&case.x_dims(), Fmt::Nchw);
    let (x_d, w_d) = (x_lay.desc::<T>(), w_lay.filter::<T>());
    let op: Vec<i64> = vec![1; spatial];
    let y_dims = conv
        .transpose_output_dims(x_d.dims(), w_d.dims(), &op)
        .unwrap_or_else(|e| panic!("{what}: transpose_output_dims: {e}"));
    assert_eq!(y_dims, case.x_dims(), "{what}: transpose_output_dims");
    let y_d = y_lay.desc::<T>();
    let xh: Vec<T> = rng.values(x_lay.count());
    let wh: Vec<T> = rng.values(w_lay.count());
    let (x, w) = (x_lay.upload(g, &xh), w_lay.upload(g, &wh));
    let r = case.geometry().backward_data(&to_f64(&xh), &to_f64(&wh));
    let (alpha_s, alpha) = scalar::<T>(alpha);
    let (beta_s, beta) = scalar::<T>(beta);
    let old: Option<Vec<T>> = (beta != 0.0).then(|| rng.values(y_lay.count()));
    let oldf = old.as_deref().map(to_f64);
    let before = y_lay.output_image(old.as_deref());
    sweep::<ConvBwdDataAlgo, T>(
        g,
        &what,
        ConvBwdDataAlgo::ALL,
        &y_lay,
        &before,
        tally,
        |a| {
            g.cudnn
                .conv_backward_data_workspace_size(&w_d, &x_d, &conv, &y_d, a)
        },
        |a, y| {
            g.cudnn
                .conv_transpose(alpha_s, &x_d, &x, &w_d, &w, &conv, a, ws, beta_s, &y_d, y)
        },
        |a| tol.expect(&r, alpha, beta, oldf.as_deref(), is_transform(a)),
    );
}

#[test]
fn conv_transpose_stride_2_output_padding_1() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(501);
    let mut ws = Workspace::new(g.stream.clone());
    let mut t = Tally::default();
    for (spatial, ab) in [
        (2, (1.0, 0.0)),
        (1, (1.0, 0.0)),
        (2, (1.0, 0.0)),
        (2, (2.0, 0.5)),
    ] {
        transpose_case::<f32>(
            &g,
            &mut ws,
            &mut rng,
            spatial,
            MathType::Fma,
            FP32,
            ab,
            &mut t,
        );
    }
    println!(
        "{}",
        t.line("conv_transpose f32 (stride 2, output padding 1)")
    );
    let mut t = Tally::default();
    for spatial in [2, 3] {
        transpose_case::<f64>(
            &g,
            &mut ws,
            &mut rng,
            spatial,
            MathType::Default,
            FP64,
            (1.0, 0.0),
            &mut t,
        );
    }
    println!(
        "{}",
        t.line("conv_transpose f64 (stride 2, output padding 1)")
    );
}

/// A transposed convolution as PyTorch's `conv_transpose1d/2d/3d` states it, with its own
/// reference (the scatter form of the definition, not the backward-data pass the crate runs).
/// Spatial vectors are per spatial dimension of the tensors, as in [`Case`] (a 1-D case has a
/// unit height first, with pad 0, stride 1, dilation 1, output padding 0).
#[derive(Clone, Debug)]
struct TCase {
    spatial: usize,
    n: i64,
    /// Input channels: the filter count K.
    k: i64,
    /// Output channels.
    c: i64,
    groups: i64,
    input: Vec<i64>,
    kernel: Vec<i64>,
    pads: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    output_padding: Vec<i64>,
    mode: ConvMode,
    fmt: Fmt,
}

impl TCase {
    /// A 1-D case `[N, K, 1, in] → [N, C, 1, out]`.
    #[allow(clippy::too_many_arguments)]
    fn one_d(
        n: i64,
        k: i64,
        c: i64,
        input: i64,
        ker: i64,
        s: i64,
        d: i64,
        p: i64,
        op: i64,
    ) -> TCase {
        TCase {
            spatial: 1,
            n,
            k,
            c,
            groups: 1,
            input: vec![1, input],
            kernel: vec![1, ker],
            pads: vec![0, p],
            strides: vec![1, s],
            dilations: vec![1, d],
            output_padding: vec![0, op],
            mode: ConvMode::CrossCorrelation,
            fmt: Fmt::Nchw,
        }
    }
    /// `out = (in − 1)·stride − 2·pad + dilation·(k − 1) + 1 + output_padding`.
    fn out(&self) -> Vec<i64> {
        (0..self.input.len())
            .map(|i| {
                (self.input[i] - 1) * self.strides[i] - 2 * self.pads[i]
                    + self.dilations[i] * (self.kernel[i] - 1)
                    + 1
                    + self.output_padding[i]
            })
            .collect()
    }
    fn x_dims(&self) -> Vec<i64> {
        [vec![self.n, self.k], self.input.clone()].concat()
    }
    fn w_dims(&self) -> Vec<i64> {
        [vec![self.k, self.c / self.groups], self.kernel.clone()].concat()
    }
    fn y_dims(&self) -> Vec<i64> {
        [vec![self.n, self.c], self.out()].concat()
    }
    /// Values per declared spatial dimension (the builder's and `transpose_output_dims`' form).
    fn declared(&self, v: &[i64]) -> Vec<i64> {
        if self.spatial == 1 {
            v[1..].to_vec()
        } else {
            v.to_vec()
        }
    }
    fn conv<T: DataType>(&self, math: MathType) -> ConvDesc {
        ConvDesc::builder(self.spatial)
            .pads(&self.declared(&self.pads))
            .strides(&self.declared(&self.strides))
            .dilations(&self.declared(&self.dilations))
            .groups(self.groups)
            .mode(self.mode)
            .math(math)
            .build::<T>()
            .unwrap_or_else(|e| panic!("conv descriptor {self:?}: {e}"))
    }
    /// Which way the crate must map the case onto backward data, in words (for messages).
    fn kind(&self) -> &'static str {
        let dims = 0..self.input.len();
        if dims
            .clone()
            .all(|i| self.output_padding[i] < self.strides[i])
        {
            "output padding < stride"
        } else if dims.clone().all(|i| self.pads[i] < self.strides[i]) {
            "output padding ≥ stride, padding < stride"
        } else {
            "output padding ≥ stride, padding ≥ stride"
        }
    }
    fn short(&self) -> String {
        format!(
            "{}-D {:?} x{:?} w{:?} y{:?} g{} pad{:?} str{:?} dil{:?} op{:?} {:?} ({})",
            self.spatial,
            self.fmt,
            self.x_dims(),
            self.w_dims(),
            self.y_dims(),
            self.groups,
            self.pads,
            self.strides,
            self.dilations,
            self.output_padding,
            self.mode,
            self.kind()
        )
    }

    /// `y = conv_transpose(x, w)` by scattering every input element through every tap:
    /// `y[n, g·Cg + c, i·stride − pad + t·dilation] += x[n, k, i]·w[k, c, t']` for each input
    /// channel `k` of group `g = k / (K / groups)` (`Cg = C / groups`), every input position `i`
    /// and tap `t`, keeping the positions inside `y`; `t' = t`, or `kernel − 1 − t` in every
    /// spatial dimension for a true convolution. Logical row-major arrays.
    fn reference(&self, x: &[f64], w: &[f64]) -> Ref {
        let out = self.out();
        let (kg, cg) = (self.k / self.groups, self.c / self.groups);
        let ker_count: i64 = self.kernel.iter().product();
        let out_count: i64 = out.iter().product();
        let in_count: i64 = self.input.iter().product();
        let mut r = Ref::zeros(
            (self.n * self.c * out_count) as usize,
            (kg * ker_count) as usize,
        );
        let ins = all_indices(&self.input);
        let kers = all_indices(&self.kernel);
        for n in 0..self.n {
            for k in 0..self.k {
                let g = k / kg;
                for (ii, i) in ins.iter().enumerate() {
                    let xv = x[((n * self.k + k) * in_count + ii as i64) as usize];
                    for (ti, t) in kers.iter().enumerate() {
                        let mut pos = 0i64;
                        let mut inside = true;
                        for d in 0..i.len() {
                            let o =
                                i[d] * self.strides[d] - self.pads[d] + t[d] * self.dilations[d];
                            if o < 0 || o >= out[d] {
                                inside = false;
                                break;
                            }
                            pos = pos * out[d] + o;
                        }
                        if !inside {
                            continue;
                        }
                        let wt = if self.mode == ConvMode::Convolution {
                            ker_count - 1 - ti as i64
                        } else {
                            ti as i64
                        };
                        for c in 0..cg {
                            let wv = w[((k * cg + c) * ker_count + wt) as usize];
                            let yi = ((n * self.c + g * cg + c) * out_count + pos) as usize;
                            r.val[yi] += xv * wv;
                            r.abs[yi] += (xv * wv).abs();
                        }
                    }
                }
            }
        }
        r
    }
}

/// A transposed-convolution problem on the device: descriptors, inputs (host values as stored
/// and device copies) and the reference.
struct TSetup<T: DataType> {
    conv: ConvDesc,
    y_lay: Lay,
    x_d: TensorDesc<T>,
    w_d: FilterDesc<T>,
    y_d: TensorDesc<T>,
    x: CudaSlice<T>,
    w: CudaSlice<T>,
    r: Ref,
}

impl<T: DataType> TSetup<T> {
    fn new(g: &Gpu, rng: &mut Rng, case: &TCase, math: MathType) -> TSetup<T> {
        let conv = case.conv::<T>(math);
        let x_lay = Lay::packed(&case.x_dims(), case.fmt);
        let w_lay = Lay::packed(&case.w_dims(), case.fmt);
        let y_lay = Lay::packed(&case.y_dims(), case.fmt);
        let (x_d, w_d) = (x_lay.desc::<T>(), w_lay.filter::<T>());
        let dims = conv
            .transpose_output_dims(x_d.dims(), w_d.dims(), &case.declared(&case.output_padding))
            .unwrap_or_else(|e| panic!("transpose_output_dims {}: {e}", case.short()));
        assert_eq!(
            dims,
            case.y_dims(),
            "transpose_output_dims {}",
            case.short()
        );
        let xh: Vec<T> = rng.values(x_lay.count());
        let wh: Vec<T> = rng.values(w_lay.count());
        TSetup {
            r: case.reference(&to_f64(&xh), &to_f64(&wh)),
            x: x_lay.upload(g, &xh),
            w: w_lay.upload(g, &wh),
            y_d: y_lay.desc::<T>(),
            conv,
            y_lay,
            x_d,
            w_d,
        }
    }
}

/// `y = alpha·conv_transpose(x, w) + beta·y` for `case` with every backward-data algorithm
/// cuDNN accepts for the pass the crate runs, checked against the scatter reference (y
/// NaN-poisoned when `beta = 0`).
#[allow(clippy::too_many_arguments)]
fn transpose_scatter_case<T: DataType>(
    g: &Gpu,
    ws: &mut Workspace,
    rng: &mut Rng,
    case: &TCase,
    math: MathType,
    tol: Tol,
    (alpha, beta): (f64, f64),
    tally: &mut Tally,
) {
    let s = TSetup::<T>::new(g, rng, case, math);
    let (alpha_s, alpha) = scalar::<T>(alpha);
    let (beta_s, beta) = scalar::<T>(beta);
    let what = format!(
        "conv_transpose<{}> {} alpha {alpha} beta {beta}",
        T::DTYPE,
        case.short()
    );
    let old: Option<Vec<T>> = (beta != 0.0).then(|| rng.values(s.y_lay.count()));
    let oldf = old.as_deref().map(to_f64);
    let before = s.y_lay.output_image(old.as_deref());
    // The heuristics rank the pass that runs (none when no term reaches y).
    let heur = g
        .cudnn
        .conv_transpose_heuristics(&s.x_d, &s.w_d, &s.conv, &s.y_d)
        .unwrap_or_else(|e| panic!("{what}: heuristics: {e}"));
    assert!(
        heur.iter().any(|p| p.is_supported()) || s.r.abs.iter().all(|&a| a == 0.0),
        "{what}: no algorithm ranked: {heur:?}"
    );
    sweep::<ConvBwdDataAlgo, T>(
        g,
        &what,
        ConvBwdDataAlgo::ALL,
        &s.y_lay,
        &before,
        tally,
        |a| {
            g.cudnn
                .conv_transpose_workspace_size(&s.x_d, &s.w_d, &s.conv, &s.y_d, a)
        },
        |a, y| {
            g.cudnn.conv_transpose(
                alpha_s, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, a, ws, beta_s, &s.y_d, y,
            )
        },
        |a| tol.expect(&s.r, alpha, beta, oldf.as_deref(), is_transform(a)),
    );
}

/// Cases PyTorch accepts that backward data alone cannot express (output padding ≥ stride,
/// with a dilation above the stride), next to ordinary ones: 1-D, 2-D and 3-D, groups, true
/// convolution, NCHW and NHWC, `beta ≠ 0`, and a case where no term reaches `y`.
fn transpose_scatter_cases() -> Vec<(TCase, (f64, f64))> {
    let base = TCase::one_d(2, 3, 4, 5, 3, 1, 2, 1, 1);
    vec![
        // 1-D, stride 1, dilation 2, padding 1, output padding 1: F.conv_transpose1d's
        // smallest case beyond backward data.
        (base.clone(), (1.0, 0.0)),
        // 1-D NHWC, true convolution, padding 0, output padding 2 < dilation 3, accumulating.
        (
            TCase {
                fmt: Fmt::Nhwc,
                mode: ConvMode::Convolution,
                ..TCase::one_d(1, 2, 3, 6, 2, 1, 3, 0, 2)
            },
            (-0.5, 1.5),
        ),
        // 2-D, 2 groups: padding ≥ stride in one dimension, output padding ≥ stride in both.
        (
            TCase {
                spatial: 2,
                n: 1,
                k: 4,
                c: 6,
                groups: 2,
                input: vec![4, 5],
                kernel: vec![3, 2],
                pads: vec![2, 0],
                strides: vec![1, 2],
                dilations: vec![2, 3],
                output_padding: vec![1, 2],
                mode: ConvMode::CrossCorrelation,
                fmt: Fmt::Nchw,
            },
            (1.0, 0.0),
        ),
        // 2-D NCHW, padding < stride, output padding ≥ stride in both dimensions, beta ≠ 0.
        (
            TCase {
                spatial: 2,
                n: 2,
                k: 3,
                c: 2,
                groups: 1,
                input: vec![3, 4],
                kernel: vec![2, 3],
                pads: vec![1, 0],
                strides: vec![2, 1],
                dilations: vec![3, 2],
                output_padding: vec![2, 1],
                mode: ConvMode::Convolution,
                fmt: Fmt::Nchw,
            },
            (0.75, -2.0),
        ),
        // 3-D: output padding ≥ stride in two dimensions (padding ≥ stride there), < stride in
        // the third; alpha and beta.
        (
            TCase {
                spatial: 3,
                n: 1,
                k: 2,
                c: 3,
                groups: 1,
                input: vec![2, 3, 3],
                kernel: vec![2, 2, 3],
                pads: vec![1, 1, 2],
                strides: vec![1, 2, 1],
                dilations: vec![2, 1, 3],
                output_padding: vec![1, 1, 2],
                mode: ConvMode::CrossCorrelation,
                fmt: Fmt::Nchw,
            },
            (1.5, 0.5),
        ),
        // No term reaches y (height 1 at position 0; the one tap lands at −1): y = beta·y,
        // with beta = 0 on a NaN-poisoned y, then beta = 0.5.
        (
            TCase {
                spatial: 2,
                n: 2,
                k: 2,
                c: 2,
                groups: 1,
                input: vec![1, 3],
                kernel: vec![1, 2],
                pads: vec![1, 0],
                strides: vec![2, 1],
                dilations: vec![3, 1],
                output_padding: vec![2, 0],
                mode: ConvMode::CrossCorrelation,
                fmt: Fmt::Nchw,
            },
            (1.0, 0.0),
        ),
        (
            TCase {
                spatial: 2,
                n: 1,
                k: 2,
                c: 2,
                groups: 1,
                input: vec![1, 3],
                kernel: vec![1, 2],
                pads: vec![1, 0],
                strides: vec![2, 1],
                dilations: vec![3, 1],
                output_padding: vec![2, 0],
                mode: ConvMode::CrossCorrelation,
                fmt: Fmt::Nchw,
            },
            (1.0, 0.5),
        ),
        // Ordinary: output padding < stride with dilation 2, 3 groups (depthwise-like).
        (
            TCase {
                spatial: 2,
                n: 2,
                k: 3,
                c: 6,
                groups: 3,
                input: vec![3, 4],
                kernel: vec![3, 3],
                pads: vec![1, 1],
                strides: vec![2, 2],
                dilations: vec![2, 1],
                output_padding: vec![1, 1],
                mode: ConvMode::CrossCorrelation,
                fmt: Fmt::Nchw,
            },
            (1.0, 0.0),
        ),
    ]
}

#[test]
fn conv_transpose_every_output_padding_pytorch_accepts() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(502);
    let mut ws = Workspace::new(g.stream.clone());
    let mut t = Tally::default();
    for (case, ab) in transpose_scatter_cases() {
        transpose_scatter_case::<f32>(
            &g,
            &mut ws,
            &mut rng,
            &case,
            MathType::Fma,
            FP32,
            ab,
            &mut t,
        );
    }
    println!(
        "{}",
        t.line("conv_transpose f32 (scatter reference, output padding up to the dilation)")
    );
    let mut t = Tally::default();
    for (case, ab) in transpose_scatter_cases().into_iter().skip(2).take(3) {
        transpose_scatter_case::<f64>(
            &g,
            &mut ws,
            &mut rng,
            &case,
            MathType::Default,
            FP64,
            ab,
            &mut t,
        );
    }
    println!("{}", t.line("conv_transpose f64 (scatter reference)"));
}

#[test]
fn conv_transpose_half_nhwc_every_output_padding() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(503);
    let mut ws = Workspace::new(g.stream.clone());
    let cases = [
        // Output padding < stride.
        (
            TCase {
                spatial: 2,
                n: 2,
                k: 8,
                c: 8,
                groups: 1,
                input: vec![3, 4],
                kernel: vec![3, 3],
                pads: vec![1, 1],
                strides: vec![2, 2],
                dilations: vec![2, 1],
                output_padding: vec![1, 1],
                mode: ConvMode::CrossCorrelation,
                fmt: Fmt::Nhwc,
            },
            (1.0, 0.0),
        ),
        // Output padding ≥ stride, padding ≥ stride (scratch): both dimensions.
        (
            TCase {
                spatial: 2,
                n: 1,
                k: 8,
                c: 8,
                groups: 1,
                input: vec![4, 3],
                kernel: vec![2, 3],
                pads: vec![1, 2],
                strides: vec![1, 1],
                dilations: vec![2, 2],
                output_padding: vec![1, 1],
                mode: ConvMode::CrossCorrelation,
                fmt: Fmt::Nhwc,
            },
            (1.0, 0.0),
        ),
        // Output padding ≥ stride, padding < stride (a sub-tensor of y), accumulating.
        (
            TCase {
                spatial: 2,
                n: 1,
                k: 8,
                c: 8,
                groups: 1,
                input: vec![5, 4],
                kernel: vec![3, 2],
                pads: vec![0, 1],
                strides: vec![1, 2],
                dilations: vec![2, 3],
                output_padding: vec![1, 2],
                mode: ConvMode::CrossCorrelation,
                fmt: Fmt::Nhwc,
            },
            (1.0, 1.0),
        ),
    ];
    let mut t16 = Tally::default();
    let mut tb = Tally::default();
    for (case, ab) in &cases {
        transpose_scatter_case::<f16>(
            &g,
            &mut ws,
            &mut rng,
            case,
            MathType::Default,
            FP16,
            *ab,
            &mut t16,
        );
        transpose_scatter_case::<bf16>(
            &g,
            &mut ws,
            &mut rng,
            case,
            MathType::Default,
            BF16,
            (1.0, 0.0),
            &mut tb,
        );
    }
    println!(
        "{}",
        t16.line("conv_transpose f16 NHWC (scatter reference)")
    );
    println!(
        "{}",
        tb.line("conv_transpose bf16 NHWC (scatter reference)")
    );
}

#[test]
fn conv_transpose_refuses_what_pytorch_refuses_before_launch() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(504);
    let mut ws = Workspace::new(g.stream.clone());
    let mut tuner = fresh(Policy::Heuristic);
    // Stride 1, dilation 2, padding 1: output padding 0 and 1 are PyTorch's; 2 is not.
    let case = TCase::one_d(2, 3, 4, 5, 3, 1, 2, 1, 1);
    let s = TSetup::<f32>::new(&g, &mut rng, &case, MathType::Fma);
    let algo = ConvBwdDataAlgo::Algo1;
    let refused = |what: &str, r: &Result<(), Error>, ok: &dyn Fn(&Error) -> bool| {
        assert!(matches!(r, Err(e) if ok(e)), "{what}: {r:?}");
    };
    // Each refusal through the handle and through the tuner, y sentinel-filled and untouched.
    let run = |ws: &mut Workspace,
               tuner: &mut Autotuner,
               what: &str,
               x_d: &TensorDesc<f32>,
               x: &CudaSlice<f32>,
               w_d: &FilterDesc<f32>,
               y_d: &TensorDesc<f32>,
               y_len: usize,
               ok: &dyn Fn(&Error) -> bool| {
        let before = vec![SENTINEL as f32; y_len];
        let mut y = g.stream.clone_htod(&before).unwrap();
        let r = g
            .cudnn
            .conv_transpose(1.0, x_d, x, w_d, &s.w, &s.conv, algo, ws, 0.0, y_d, &mut y);
        refused(what, &r, ok);
        let r = tuner
            .conv_transpose(&g.cudnn, 1.0, x_d, x, w_d, &s.w, &s.conv, 0.0, y_d, &mut y)
            .map(|_| ());
        refused(&format!("{what} (autotuner)"), &r, ok);
        assert_untouched(what, &g.stream, &y, &before);
    };
    let y_names = |e: &Error| matches!(e, Error::ShapeMismatch { a: "y", .. });
    // Output padding 2 = dilation: refused by transpose_output_dims and by the call.
    let r = s
        .conv
        .transpose_output_dims(s.x_d.dims(), s.w_d.dims(), &[2]);
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let mut too_long = case.y_dims();
    too_long[3] += 1;
    let y_long = TensorDesc::<f32>::nchw_nd(&too_long).unwrap();
    run(
        &mut ws,
        &mut tuner,
        "output padding = dilation",
        &s.x_d,
        &s.x,
        &s.w_d,
        &y_long,
        y_long.span(),
        &y_names,
    );
    // Below the smallest size (output padding −1).
    let mut too_short = case.y_dims();
    too_short[3] -= 2;
    let y_short = TensorDesc::<f32>::nchw_nd(&too_short).unwrap();
    run(
        &mut ws,
        &mut tuner,
        "output padding −1",
        &s.x_d,
        &s.x,
        &s.w_d,
        &y_short,
        y_short.span(),
        &y_names,
    );
    // Output channels ≠ C, batch ≠ N.
    for (i, what) in [(1, "channels"), (0, "batch")] {
        let mut d = case.y_dims();
        d[i] += 1;
        let y_bad = TensorDesc::<f32>::nchw_nd(&d).unwrap();
        run(
            &mut ws,
            &mut tuner,
            what,
            &s.x_d,
            &s.x,
            &s.w_d,
            &y_bad,
            y_bad.span(),
            &y_names,
        );
    }
    // x's channels ≠ the filter count.
    let x4 = TensorDesc::<f32>::nchw(2, 4, 1, 5).unwrap();
    let x4_dev = g.stream.clone_htod(&rng.values::<f32>(x4.span())).unwrap();
    run(
        &mut ws,
        &mut tuner,
        "x channels",
        &x4,
        &x4_dev,
        &s.w_d,
        &s.y_d,
        s.y_d.span(),
        &|e| matches!(e, Error::ShapeMismatch { a: "x", b: "w", .. }),
    );
    // Short buffers are named as the transposed convolution names them.
    let short_x = g
        .stream
        .clone_htod(&rng.values::<f32>(s.x_d.span() - 1))
        .unwrap();
    run(
        &mut ws,
        &mut tuner,
        "short x",
        &s.x_d,
        &short_x,
        &s.w_d,
        &s.y_d,
        s.y_d.span(),
        &|e| matches!(e, Error::BufferTooSmall { name: "x", .. }),
    );
    run(
        &mut ws,
        &mut tuner,
        "short y",
        &s.x_d,
        &s.x,
        &s.w_d,
        &s.y_d,
        s.y_d.span() - 1,
        &|e| matches!(e, Error::BufferTooSmall { name: "y", .. }),
    );
    let before = vec![SENTINEL as f32; s.y_d.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let short_w = g
        .stream
        .clone_htod(&rng.values::<f32>(s.w_d.span() - 1))
        .unwrap();
    let r = g.cudnn.conv_transpose(
        1.0, &s.x_d, &s.x, &s.w_d, &short_w, &s.conv, algo, &mut ws, 0.0, &s.y_d, &mut y,
    );
    refused("short w", &r, &|e| {
        matches!(e, Error::BufferTooSmall { name: "w", .. })
    });
    // An output layout that overlaps itself.
    let yd = case.y_dims();
    let y_overlap = TensorDesc::<f32>::strided(&yd, &[yd[3], 1, 1, 1]).unwrap();
    let r = g.cudnn.conv_transpose(
        1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, algo, &mut ws, 0.0, &y_overlap, &mut y,
    );
    refused("overlapping y", &r, &|e| {
        matches!(e, Error::OverlappingOutput { name: "y", .. })
    });
    assert_untouched("short w, overlapping y", &g.stream, &y, &before);
    // K not divisible by the groups: refused by transpose_output_dims and by the call.
    let grouped = ConvDesc::builder(1)
        .pads(&[1])
        .dilations(&[2])
        .groups(2)
        .build::<f32>()
        .unwrap();
    let w_odd = FilterDesc::<f32>::new(&[3, 2, 1, 3], TensorFormat::Nchw).unwrap();
    let r = grouped.transpose_output_dims(s.x_d.dims(), w_odd.dims(), &[1]);
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let w_odd_dev = g
        .stream
        .clone_htod(&rng.values::<f32>(w_odd.span()))
        .unwrap();
    let r = g.cudnn.conv_transpose(
        1.0, &s.x_d, &s.x, &w_odd, &w_odd_dev, &grouped, algo, &mut ws, 0.0, &s.y_d, &mut y,
    );
    refused("K = 3 with 2 groups", &r, &|e| {
        matches!(e, Error::InvalidArgument { .. })
    });
    assert_untouched("groups", &g.stream, &y, &before);
    // A workspace below what the algorithm needs: refused before the first launch, also where
    // the call would run backward data into scratch memory and copy.
    for case in [case.clone(), transpose_scatter_cases()[2].0.clone()] {
        let s = TSetup::<f32>::new(&g, &mut rng, &case, MathType::Fma);
        let before = vec![SENTINEL as f32; s.y_d.span()];
        let mut y = g.stream.clone_htod(&before).unwrap();
        let mut none = Workspace::new(g.stream.clone()).with_limit(0);
        let mut limited = 0;
        for &a in ConvBwdDataAlgo::ALL {
            let Ok(bytes) = g
                .cudnn
                .conv_transpose_workspace_size(&s.x_d, &s.w_d, &s.conv, &s.y_d, a)
            else {
                continue;
            };
            if bytes == 0 {
                continue;
            }
            let r = g.cudnn.conv_transpose(
                1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, a, &mut none, 0.0, &s.y_d, &mut y,
            );
            refused(&format!("{a} without workspace"), &r, &|e| {
                matches!(e, Error::WorkspaceLimit { .. })
            });
            limited += 1;
        }
        assert_untouched("workspace limit", &g.stream, &y, &before);
        println!(
            "conv_transpose {}: {limited} algorithms refused for a workspace of 0 bytes",
            case.short()
        );
    }
}

#[test]
fn autotuner_conv_transpose_decides_the_backward_data_pass() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(505);
    let cases = transpose_scatter_cases();
    // Output padding < stride (the plain backward-data problem), a sub-tensor of y, scratch, and
    // no term at all.
    let picked = [&cases[7], &cases[3], &cases[2], &cases[5]];
    let mut lines = Vec::new();
    for policy in [
        Policy::Heuristic,
        Policy::Benchmark,
        Policy::Deterministic,
        Policy::Fixed(FixedAlgos::default()),
    ] {
        let mut tuner = fresh(policy);
        for (case, (alpha, beta)) in picked {
            let s = TSetup::<f32>::new(&g, &mut rng, case, MathType::Fma);
            let (alpha_s, alpha) = scalar::<f32>(*alpha);
            let (beta_s, beta) = scalar::<f32>(*beta);
            let mut choices = Vec::new();
            for call in 0..2 {
                let old: Option<Vec<f32>> = (beta != 0.0).then(|| rng.values(s.y_lay.count()));
                let oldf = old.as_deref().map(to_f64);
                let before = s.y_lay.output_image(old.as_deref());
                let mut y = g.stream.clone_htod(&before).unwrap();
                let what = format!(
                    "autotuner {} conv_transpose {} call {call}",
                    policy.name(),
                    case.short()
                );
                let c = tuner
                    .conv_transpose(
                        &g.cudnn, alpha_s, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, beta_s, &s.y_d,
                        &mut y,
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let what = format!("{what}: {} ({:?})", c.describe(), c.source);
                let transform = is_transform(c.algo) || c.api.is_graph();
                let (want, bound) = FP32.expect(&s.r, alpha, beta, oldf.as_deref(), transform);
                check(
                    &what,
                    &download(&g.stream, &y),
                    &before,
                    &s.y_lay,
                    &want,
                    &bound,
                );
                choices.push(c);
            }
            let nothing = std::ptr::eq(case, &cases[5].0);
            let expect_first = match (policy, nothing) {
                (Policy::Fixed(_), _) | (_, true) => Source::Fixed,
                (Policy::Heuristic, false) => Source::Heuristic,
                _ => Source::Benchmark,
            };
            assert_eq!(
                choices[0].source,
                expect_first,
                "{} {}",
                policy.name(),
                case.short()
            );
            if !matches!(expect_first, Source::Fixed) {
                assert_eq!(
                    choices[1].source,
                    Source::Cache,
                    "{} {}",
                    policy.name(),
                    case.short()
                );
                assert_eq!(choices[1].algo, choices[0].algo);
            }
            if let Policy::Fixed(f) = policy {
                assert_eq!(choices[0].algo, f.backward_data);
            }
            lines.push(format!(
                "{} {}: {}",
                policy.name(),
                case.kind(),
                choices[0].describe()
            ));
        }
        // The plain case's decision is the backward-data decision of the same problem.
        if !matches!(policy, Policy::Fixed(_)) {
            let s = TSetup::<f32>::new(&g, &mut rng, &picked[0].0, MathType::Fma);
            let mut dx = g.stream.alloc_zeros::<f32>(s.y_d.span()).unwrap();
            let c = tuner
                .backward_data(
                    &g.cudnn, 1.0, &s.w_d, &s.w, &s.x_d, &s.x, &s.conv, 0.0, &s.y_d, &mut dx,
                )
                .unwrap();
            assert_eq!(
                c.source,
                Source::Cache,
                "{}: backward data after conv_transpose",
                policy.name()
            );
        }
    }
    for l in lines {
        println!("autotuner conv_transpose {l}");
    }
}

// ---------------------------------------------------------------------------------------------
// Depthwise and grouped convolutions
// ---------------------------------------------------------------------------------------------

#[test]
fn depthwise_and_grouped_forward_and_backward() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(601);
    let mut ws = Workspace::new(g.stream.clone());
    let (mut f, mut d, mut w) = (Tally::default(), Tally::default(), Tally::default());
    // (C, groups, K, stride, dilation): depthwise with channel multiplier 1 and 2, then grouped.
    let shapes = [
        (6, 6, 6, 1, 1),
        (4, 4, 8, 2, 1),
        (5, 5, 5, 1, 2),
        (9, 3, 6, 1, 1),
        (8, 2, 4, 2, 1),
        (6, 3, 9, 1, 2),
    ];
    for (i, &(c, groups, k, stride, dil)) in shapes.iter().enumerate() {
        let mut case = Case::square(2, c, 7, k, 3, dil, stride, dil, Fmt::Nchw);
        case.groups = groups;
        case.fmt = if i % 2 == 0 { Fmt::Nchw } else { Fmt::Nhwc };
        forward_case::<f32, f32>(
            &g,
            &mut ws,
            &mut rng,
            &case,
            &fwd(MathType::Fma, FP32),
            &mut f,
        );
        let p = Bwd {
            math: MathType::Fma,
            tol: FP32,
            alpha: 1.0,
            beta: 0.0,
        };
        backward_case::<f32>(&g, &mut ws, &mut rng, &case, &p, &mut d, &mut w);
    }
    // 1-D depthwise.
    let case = Case {
        spatial: 1,
        n: 3,
        c: 4,
        k: 8,
        groups: 4,
        input: vec![1, 10],
        kernel: vec![1, 3],
        pads: vec![0, 1],
        strides: vec![1, 1],
        dilations: vec![1, 2],
        mode: ConvMode::Convolution,
        fmt: Fmt::Nchw,
    };
    forward_case::<f32, f32>(
        &g,
        &mut ws,
        &mut rng,
        &case,
        &fwd(MathType::Fma, FP32),
        &mut f,
    );
    let p = Bwd {
        math: MathType::Fma,
        tol: FP32,
        alpha: 1.0,
        beta: 0.0,
    };
    backward_case::<f32>(&g, &mut ws, &mut rng, &case, &p, &mut d, &mut w);
    println!("{}", f.line("depthwise/grouped forward f32"));
    println!("{}", d.line("depthwise/grouped backward data f32"));
    println!("{}", w.line("depthwise/grouped backward filter f32"));
}

// ---------------------------------------------------------------------------------------------
// Bad arguments are rejected before launch, outputs untouched
// ---------------------------------------------------------------------------------------------

/// A small f32 NCHW problem: x `[2, 4, 6, 6]`, w `[5, 4, 3, 3]`, pad 1 → y `[2, 5, 6, 6]`.
fn small(g: &Gpu, rng: &mut Rng) -> Setup<f32> {
    let case = Case::square(2, 4, 6, 5, 3, 1, 1, 1, Fmt::Nchw);
    Setup::new(g, rng, &case, MathType::Fma, Gen::Uniform)
}

/// `r` is `BufferTooSmall` for `name` with the given lengths.
fn is_short<T: std::fmt::Debug>(r: &Result<T, Error>, name: &str, len: usize, required: usize) {
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: n, len: l, required: q })
            if *n == name && *l == len && *q == required),
        "expected BufferTooSmall for `{name}` ({len} < {required}), got {r:?}"
    );
}

#[test]
fn rejects_short_buffers_before_launch() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(701);
    let mut ws = Workspace::new(g.stream.clone());
    let s = small(&g, &mut rng);
    let y_d = s.y_lay.desc::<f32>();
    let (xs, wn, ys) = (s.x_d.span(), s.w_d.span(), y_d.span());
    let gemm = ConvFwdAlgo::ImplicitGemm;
    let mut checked = 0;

    // Forward: y is a buffer one longer than its span, full of sentinels.
    let before = vec![SENTINEL as f32; ys + 1];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let x_short = g.stream.clone_htod(&rng.values::<f32>(xs - 1)).unwrap();
    let r = g.cudnn.conv_forward(
        1.0, &s.x_d, &x_short, &s.w_d, &s.w, &s.conv, gemm, &mut ws, 0.0, &y_d, &mut y,
    );
    is_short(&r, "x", xs - 1, xs);
    let w_short = g.stream.clone_htod(&rng.values::<f32>(wn - 1)).unwrap();
    let r = g.cudnn.conv_forward(
        1.0, &s.x_d, &s.x, &s.w_d, &w_short, &s.conv, gemm, &mut ws, 0.0, &y_d, &mut y,
    );
    is_short(&r, "w", wn - 1, wn);
    {
        // A view one element short of the span: the element just past it must survive too.
        let mut view = y.slice_mut(..ys - 1);
        let r = g.cudnn.conv_forward(
            1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, gemm, &mut ws, 0.0, &y_d, &mut view,
        );
        is_short(&r, "y", ys - 1, ys);
    }
    checked += 3;

    // Fused: short bias, short z.
    let relu = FusedActivation::Relu;
    let b_d = TensorDesc::<f32>::nchw(1, s.case.k, 1, 1).unwrap();
    let kb = s.case.k as usize;
    let bias = g.stream.clone_htod(&rng.values::<f32>(kb)).unwrap();
    let bias_short = g.stream.clone_htod(&rng.values::<f32>(kb - 1)).unwrap();
    let z = g.stream.clone_htod(&rng.values::<f32>(ys)).unwrap();
    let z_short = g.stream.clone_htod(&rng.values::<f32>(ys - 1)).unwrap();
    let r = g.cudnn.conv_bias_activation_forward(
        1.0,
        &s.x_d,
        &s.x,
        &s.w_d,
        &s.w,
        &s.conv,
        gemm,
        &mut ws,
        1.0,
        Some(z.as_view()),
        &b_d,
        &bias_short,
        relu,
        &y_d,
        &mut y,
    );
    is_short(&r, "bias", kb - 1, kb);
    let r = g.cudnn.conv_bias_activation_forward(
        1.0,
        &s.x_d,
        &s.x,
        &s.w_d,
        &s.w,
        &s.conv,
        gemm,
        &mut ws,
        1.0,
        Some(z_short.as_view()),
        &b_d,
        &bias,
        relu,
        &y_d,
        &mut y,
    );
    is_short(&r, "z", ys - 1, ys);
    checked += 2;
    assert_untouched("forward/fused with short buffers", &g.stream, &y, &before);

    // Backward data: short dy, short dx.
    let da = first_accepted("short dx", |a| {
        g.cudnn
            .conv_backward_data_workspace_size(&s.w_d, &y_d, &s.conv, &s.x_d, a)
    });
    let dy = g.stream.clone_htod(&rng.values::<f32>(ys)).unwrap();
    let dy_short = g.stream.clone_htod(&rng.values::<f32>(ys - 1)).unwrap();
    let dx_before = vec![SENTINEL as f32; xs];
    let mut dx = g.stream.clone_htod(&dx_before).unwrap();
    let r = g.cudnn.conv_backward_data(
        1.0, &s.w_d, &s.w, &y_d, &dy_short, &s.conv, da, &mut ws, 0.0, &s.x_d, &mut dx,
    );
    is_short(&r, "dy", ys - 1, ys);
    {
        let mut view = dx.slice_mut(..xs - 1);
        let r = g.cudnn.conv_backward_data(
            1.0, &s.w_d, &s.w, &y_d, &dy, &s.conv, da, &mut ws, 0.0, &s.x_d, &mut view,
        );
        is_short(&r, "dx", xs - 1, xs);
    }
    assert_untouched(
        "backward data with short buffers",
        &g.stream,
        &dx,
        &dx_before,
    );

    // Backward filter: short x, short dw.
    let fa = first_accepted("short dw", |a| {
        g.cudnn
            .conv_backward_filter_workspace_size(&s.x_d, &y_d, &s.conv, &s.w_d, a)
    });
    let dw_before = vec![SENTINEL as f32; wn];
    let mut dw = g.stream.clone_htod(&dw_before).unwrap();
    let r = g.cudnn.conv_backward_filter(
        1.0, &s.x_d, &x_short, &y_d, &dy, &s.conv, fa, &mut ws, 0.0, &s.w_d, &mut dw,
    );
    is_short(&r, "x", xs - 1, xs);
    {
        let mut view = dw.slice_mut(..wn - 1);
        let r = g.cudnn.conv_backward_filter(
            1.0, &s.x_d, &s.x, &y_d, &dy, &s.conv, fa, &mut ws, 0.0, &s.w_d, &mut view,
        );
        is_short(&r, "dw", wn - 1, wn);
    }
    assert_untouched(
        "backward filter with short buffers",
        &g.stream,
        &dw,
        &dw_before,
    );

    // Backward bias: short db.
    let db_before = vec![SENTINEL as f32; kb];
    let mut db = g.stream.clone_htod(&db_before).unwrap();
    {
        let mut view = db.slice_mut(..kb - 1);
        let r = g
            .cudnn
            .conv_backward_bias(1.0, &y_d, &dy, 0.0, &b_d, &mut view);
        is_short(&r, "db", kb - 1, kb);
    }
    assert_untouched("backward bias with a short db", &g.stream, &db, &db_before);
    checked += 5;
    println!("short buffers: {checked} calls rejected with BufferTooSmall, outputs untouched");
}

#[test]
fn rejects_wrong_shapes_before_launch() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(702);
    let mut ws = Workspace::new(g.stream.clone());
    let s = small(&g, &mut rng);
    let gemm = ConvFwdAlgo::ImplicitGemm;
    let y_d = s.y_lay.desc::<f32>();

    // y [2, 5, 7, 6] where [2, 5, 6, 6] is right; y with K = 4.
    let bad_hw = TensorDesc::<f32>::nchw(2, 5, 7, 6).unwrap();
    let bad_k = TensorDesc::<f32>::nchw(2, 4, 6, 6).unwrap();
    let before = vec![SENTINEL as f32; bad_hw.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    for bad in [&bad_hw, &bad_k] {
        let r = g.cudnn.conv_forward(
            1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, gemm, &mut ws, 0.0, bad, &mut y,
        );
        assert!(
            matches!(&r, Err(Error::ShapeMismatch { a: "y", .. })),
            "forward y {:?}: {r:?}",
            bad.dims()
        );
        let r = g
            .cudnn
            .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, bad, gemm);
        assert!(
            matches!(&r, Err(Error::ShapeMismatch { a: "y", .. })),
            "workspace query y {:?}: {r:?}",
            bad.dims()
        );
    }
    // Filter channels × groups ≠ input channels.
    let w3 = FilterDesc::<f32>::new(&[5, 3, 3, 3], TensorFormat::Nchw).unwrap();
    let w3_dev = g.stream.clone_htod(&rng.values::<f32>(w3.span())).unwrap();
    let r = g.cudnn.conv_forward(
        1.0, &s.x_d, &s.x, &w3, &w3_dev, &s.conv, gemm, &mut ws, 0.0, &y_d, &mut y,
    );
    assert!(
        matches!(&r, Err(Error::ShapeMismatch { a: "x", b: "w", .. })),
        "forward with w [5, 3, 3, 3]: {r:?}"
    );
    assert_untouched("forward with wrong shapes", &g.stream, &y, &before);

    // Backward passes with dy of the wrong shape.
    let dy = g
        .stream
        .clone_htod(&rng.values::<f32>(bad_hw.span()))
        .unwrap();
    let dx_before = vec![SENTINEL as f32; s.x_d.span()];
    let mut dx = g.stream.clone_htod(&dx_before).unwrap();
    let r = g.cudnn.conv_backward_data(
        1.0,
        &s.w_d,
        &s.w,
        &bad_hw,
        &dy,
        &s.conv,
        ConvBwdDataAlgo::Algo1,
        &mut ws,
        0.0,
        &s.x_d,
        &mut dx,
    );
    assert!(
        matches!(&r, Err(Error::ShapeMismatch { a: "dy", .. })),
        "backward data: {r:?}"
    );
    assert_untouched("backward data with a wrong dy", &g.stream, &dx, &dx_before);
    let dw_before = vec![SENTINEL as f32; s.w_d.span()];
    let mut dw = g.stream.clone_htod(&dw_before).unwrap();
    let r = g.cudnn.conv_backward_filter(
        1.0,
        &s.x_d,
        &s.x,
        &bad_hw,
        &dy,
        &s.conv,
        ConvBwdFilterAlgo::Algo1,
        &mut ws,
        0.0,
        &s.w_d,
        &mut dw,
    );
    assert!(
        matches!(&r, Err(Error::ShapeMismatch { a: "dy", .. })),
        "backward filter: {r:?}"
    );
    assert_untouched(
        "backward filter with a wrong dy",
        &g.stream,
        &dw,
        &dw_before,
    );
    println!("wrong shapes: forward y (2 ways), filter channels, backward dy (2 passes) rejected with ShapeMismatch");
}

#[test]
fn rejects_bias_with_wrong_dims() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(703);
    let mut ws = Workspace::new(g.stream.clone());
    let s = small(&g, &mut rng);
    let y_d = s.y_lay.desc::<f32>();
    let k = s.case.k;
    let before = vec![SENTINEL as f32; y_d.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    for dims in [[1, k + 1, 1, 1], [1, k, 1, 2], [2, k, 1, 1]] {
        let b_d = TensorDesc::<f32>::nchw_nd(&dims).unwrap();
        let bias = g.stream.clone_htod(&rng.values::<f32>(b_d.span())).unwrap();
        let r = g.cudnn.conv_bias_activation_forward(
            1.0,
            &s.x_d,
            &s.x,
            &s.w_d,
            &s.w,
            &s.conv,
            ConvFwdAlgo::ImplicitGemm,
            &mut ws,
            0.0,
            None,
            &b_d,
            &bias,
            FusedActivation::Relu,
            &y_d,
            &mut y,
        );
        assert!(
            matches!(&r, Err(Error::ShapeMismatch { a: "bias", .. })),
            "fused with bias {dims:?}: {r:?}"
        );
    }
    assert_untouched("fused with a wrong bias", &g.stream, &y, &before);

    let dy = g.stream.clone_htod(&rng.values::<f32>(y_d.span())).unwrap();
    let db_d = TensorDesc::<f32>::nchw(1, k + 1, 1, 1).unwrap();
    let db_before = vec![SENTINEL as f32; db_d.span()];
    let mut db = g.stream.clone_htod(&db_before).unwrap();
    let r = g
        .cudnn
        .conv_backward_bias(1.0, &y_d, &dy, 0.0, &db_d, &mut db);
    assert!(
        matches!(&r, Err(Error::ShapeMismatch { a: "db", .. })),
        "backward bias with db [1, K+1, 1, 1]: {r:?}"
    );
    assert_untouched("backward bias with a wrong db", &g.stream, &db, &db_before);
    println!("wrong bias dims: 3 fused calls and 1 backward-bias call rejected with ShapeMismatch");
}

#[test]
fn rejects_buffers_and_workspace_of_another_context() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(704);
    let mut ws = Workspace::new(g.stream.clone());
    let s = small(&g, &mut rng);
    let y_d = s.y_lay.desc::<f32>();
    let gemm = ConvFwdAlgo::ImplicitGemm;
    let other = other_context(g.cudnn.context());
    let os = other.default_stream();

    let before = vec![SENTINEL as f32; y_d.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let x_foreign = os.clone_htod(&rng.values::<f32>(s.x_d.span())).unwrap();
    let r = g.cudnn.conv_forward(
        1.0, &s.x_d, &x_foreign, &s.w_d, &s.w, &s.conv, gemm, &mut ws, 0.0, &y_d, &mut y,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "x", .. })),
        "foreign x: {r:?}"
    );
    let w_foreign = os.clone_htod(&rng.values::<f32>(s.w_d.span())).unwrap();
    let r = g.cudnn.conv_forward(
        1.0, &s.x_d, &s.x, &s.w_d, &w_foreign, &s.conv, gemm, &mut ws, 0.0, &y_d, &mut y,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "w", .. })),
        "foreign w: {r:?}"
    );
    let mut ws_foreign = Workspace::new(os.clone());
    for algo in [gemm, ConvFwdAlgo::Gemm] {
        if g.cudnn
            .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, &y_d, algo)
            .is_err()
        {
            continue;
        }
        let r = g.cudnn.conv_forward(
            1.0,
            &s.x_d,
            &s.x,
            &s.w_d,
            &s.w,
            &s.conv,
            algo,
            &mut ws_foreign,
            0.0,
            &y_d,
            &mut y,
        );
        assert!(
            matches!(
                r,
                Err(Error::ForeignContext {
                    name: "workspace",
                    ..
                })
            ),
            "foreign workspace with {algo}: {r:?}"
        );
    }
    assert_eq!(
        ws_foreign.capacity(),
        0,
        "a rejected call grew the workspace"
    );
    assert_untouched("forward with foreign inputs", &g.stream, &y, &before);

    // A foreign output.
    let mut y_foreign = os.clone_htod(&before).unwrap();
    let r = g.cudnn.conv_forward(
        1.0,
        &s.x_d,
        &s.x,
        &s.w_d,
        &s.w,
        &s.conv,
        gemm,
        &mut ws,
        0.0,
        &y_d,
        &mut y_foreign,
    );
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "y", .. })),
        "foreign y: {r:?}"
    );
    assert_untouched("foreign y", &os, &y_foreign, &before);

    // Backward filter with a foreign workspace.
    let dy = g.stream.clone_htod(&rng.values::<f32>(y_d.span())).unwrap();
    let dw_before = vec![SENTINEL as f32; s.w_d.span()];
    let mut dw = g.stream.clone_htod(&dw_before).unwrap();
    let fa = first_accepted("foreign workspace", |a| {
        g.cudnn
            .conv_backward_filter_workspace_size(&s.x_d, &y_d, &s.conv, &s.w_d, a)
    });
    let r = g.cudnn.conv_backward_filter(
        1.0,
        &s.x_d,
        &s.x,
        &y_d,
        &dy,
        &s.conv,
        fa,
        &mut ws_foreign,
        0.0,
        &s.w_d,
        &mut dw,
    );
    assert!(
        matches!(
            r,
            Err(Error::ForeignContext {
                name: "workspace",
                ..
            })
        ),
        "backward filter, foreign workspace: {r:?}"
    );
    assert_untouched(
        "backward filter with a foreign workspace",
        &g.stream,
        &dw,
        &dw_before,
    );
    println!("foreign context: x, w, y and workspace (forward, backward filter) rejected with ForeignContext");
}

#[test]
fn rejects_workspace_over_its_limit() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(705);
    let case = Case::square(2, 8, 12, 8, 3, 1, 1, 1, Fmt::Nchw);
    let s = Setup::<f32>::new(&g, &mut rng, &case, MathType::Fma, Gen::Uniform);
    let y_d = s.y_lay.desc::<f32>();
    let (algo, bytes) = ConvFwdAlgo::ALL
        .iter()
        .find_map(|&a| {
            let b = g
                .cudnn
                .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, &y_d, a)
                .ok()?;
            (b > 1).then_some((a, b))
        })
        .expect("some forward algorithm needs a workspace here (GEMM's im2col, FFT)");
    let mut ws = Workspace::new(g.stream.clone()).with_limit(1);
    let before = vec![SENTINEL as f32; y_d.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let r = g.cudnn.conv_forward(
        1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, algo, &mut ws, 0.0, &y_d, &mut y,
    );
    assert!(
        matches!(r, Err(Error::WorkspaceLimit { requested, limit: 1 }) if requested == bytes),
        "{algo} needing {bytes} bytes with a 1-byte limit: {r:?}"
    );
    assert_eq!(ws.capacity(), 0);
    assert_untouched("forward over the workspace limit", &g.stream, &y, &before);
    println!("workspace limit: {algo} needing {bytes} bytes refused with WorkspaceLimit under a 1-byte limit");
}

/// A case FFT and Winograd cannot do (stride 2, dilation 2) and the first of them cuDNN refuses.
fn refused_fft_or_winograd(g: &Gpu, rng: &mut Rng) -> (Setup<f32>, ConvFwdAlgo, Error) {
    let case = Case::square(2, 4, 9, 4, 3, 2, 2, 2, Fmt::Nchw);
    let s = Setup::<f32>::new(g, rng, &case, MathType::Fma, Gen::Uniform);
    let y_d = s.y_lay.desc::<f32>();
    let (algo, e) = [
        ConvFwdAlgo::Fft,
        ConvFwdAlgo::Winograd,
        ConvFwdAlgo::FftTiling,
        ConvFwdAlgo::WinogradNonfused,
    ]
    .into_iter()
    .find_map(|a| {
        g.cudnn
            .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, &y_d, a)
            .err()
            .map(|e| (a, e))
    })
    .expect("cuDNN refuses FFT and Winograd with stride 2 and dilation 2");
    (s, algo, e)
}

/// A cuDNN refusal of the case (not-supported or bad-parameter family).
fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::Cudnn { status, .. }
            if matches!(status.family(), StatusFamily::NotSupported | StatusFamily::BadParam)
    )
}

#[test]
fn manual_algorithm_cudnn_refuses_is_a_cudnn_error() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(706);
    let mut ws = Workspace::new(g.stream.clone());
    let (s, algo, e) = refused_fft_or_winograd(&g, &mut rng);
    assert!(is_refusal(&e), "workspace query for {algo}: {e:?}");
    let y_d = s.y_lay.desc::<f32>();
    let before = vec![SENTINEL as f32; y_d.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let r = g.cudnn.conv_forward(
        1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, algo, &mut ws, 0.0, &y_d, &mut y,
    );
    match &r {
        Err(e) if is_refusal(e) => {}
        other => panic!("{algo} on a stride-2, dilation-2 case: {other:?}"),
    }
    assert_untouched("refused manual algorithm", &g.stream, &y, &before);
    println!(
        "manual algorithm: {algo} on stride 2 / dilation 2 refused with {}",
        r.unwrap_err()
    );
}

#[test]
fn rejects_overlapping_outputs() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(707);
    let mut ws = Workspace::new(g.stream.clone());
    let s = small(&g, &mut rng);
    // Channels and columns share stride 1: every element but the first is written twice.
    let overlapping = |dims: &[i64]| -> Option<TensorDesc<f32>> {
        let strides = [dims[1] * dims[2] * dims[3], 1, dims[3], 1];
        match TensorDesc::<f32>::strided(dims, &strides) {
            Ok(d) => {
                assert!(!d.layout().is_non_overlapping());
                Some(d)
            }
            // If the descriptor itself is refused, no launch can be reached with it.
            Err(e) => {
                assert!(
                    matches!(e, Error::Cudnn { .. } | Error::InvalidArgument { .. }),
                    "{e:?}"
                );
                None
            }
        }
    };
    let (Some(y_d), Some(dx_d)) = (overlapping(&s.case.y_dims()), overlapping(&s.case.x_dims()))
    else {
        println!("overlapping outputs: cuDNN refuses such descriptors; nothing to launch");
        return;
    };
    let before = vec![SENTINEL as f32; s.y_lay.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let r = g.cudnn.conv_forward(
        1.0,
        &s.x_d,
        &s.x,
        &s.w_d,
        &s.w,
        &s.conv,
        ConvFwdAlgo::ImplicitGemm,
        &mut ws,
        0.0,
        &y_d,
        &mut y,
    );
    assert!(
        matches!(r, Err(Error::OverlappingOutput { name: "y", .. })),
        "forward: {r:?}"
    );
    let b_d = TensorDesc::<f32>::nchw(1, s.case.k, 1, 1).unwrap();
    let bias = g
        .stream
        .clone_htod(&rng.values::<f32>(s.case.k as usize))
        .unwrap();
    let r = g.cudnn.conv_bias_activation_forward(
        1.0,
        &s.x_d,
        &s.x,
        &s.w_d,
        &s.w,
        &s.conv,
        ConvFwdAlgo::ImplicitGemm,
        &mut ws,
        0.0,
        None,
        &b_d,
        &bias,
        FusedActivation::Relu,
        &y_d,
        &mut y,
    );
    assert!(
        matches!(r, Err(Error::OverlappingOutput { name: "y", .. })),
        "fused: {r:?}"
    );
    assert_untouched("overlapping y", &g.stream, &y, &before);

    let dy_d = s.y_lay.desc::<f32>();
    let dy = g
        .stream
        .clone_htod(&rng.values::<f32>(dy_d.span()))
        .unwrap();
    let dx_before = vec![SENTINEL as f32; s.x_lay.span()];
    let mut dx = g.stream.clone_htod(&dx_before).unwrap();
    let r = g.cudnn.conv_backward_data(
        1.0,
        &s.w_d,
        &s.w,
        &dy_d,
        &dy,
        &s.conv,
        ConvBwdDataAlgo::Algo1,
        &mut ws,
        0.0,
        &dx_d,
        &mut dx,
    );
    assert!(
        matches!(r, Err(Error::OverlappingOutput { name: "dx", .. })),
        "backward data: {r:?}"
    );
    assert_untouched("overlapping dx", &g.stream, &dx, &dx_before);
    println!("overlapping outputs: forward y, fused y and backward-data dx rejected with OverlappingOutput");
}

#[test]
fn rejects_unsupported_data_types() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(708);
    let mut ws = Workspace::new(g.stream.clone());
    let s = small(&g, &mut rng);
    let gemm = ConvFwdAlgo::ImplicitGemm;

    // f32 input with an f16 output.
    let y16_d = s.y_lay.desc::<f16>();
    let before16 = vec![f16::from_f64(SENTINEL); y16_d.span()];
    let mut y16 = g.stream.clone_htod(&before16).unwrap();
    let r = g.cudnn.conv_forward::<f32, f16>(
        1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, gemm, &mut ws, 0.0, &y16_d, &mut y16,
    );
    assert!(
        matches!(r, Err(Error::UnsupportedDataType { .. })),
        "f32 -> f16: {r:?}"
    );
    assert_untouched("f32 -> f16 forward", &g.stream, &y16, &before16);

    // The fused call with a bias of another type than the output.
    let y_d = s.y_lay.desc::<f32>();
    let before = vec![SENTINEL as f32; y_d.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let b16_d = TensorDesc::<f16>::nchw(1, s.case.k, 1, 1).unwrap();
    let b16 = g
        .stream
        .clone_htod(&rng.values::<f16>(s.case.k as usize))
        .unwrap();
    let r = g.cudnn.conv_bias_activation_forward(
        1.0,
        &s.x_d,
        &s.x,
        &s.w_d,
        &s.w,
        &s.conv,
        gemm,
        &mut ws,
        0.0,
        None,
        &b16_d,
        &b16,
        FusedActivation::Relu,
        &y_d,
        &mut y,
    );
    assert!(
        matches!(r, Err(Error::UnsupportedDataType { .. })),
        "f16 bias for f32 output: {r:?}"
    );
    assert_untouched("fused with an f16 bias", &g.stream, &y, &before);

    // Backward passes with i8 (forward-only in cuDNN).
    let case = Case::square(2, 4, 6, 4, 3, 1, 1, 1, Fmt::Nhwc);
    let conv = case.conv::<i8>(MathType::Default);
    let x_lay = Lay::packed(&case.x_dims(), Fmt::Nhwc);
    let w_lay = Lay::packed(&case.w_dims(), Fmt::Nhwc);
    let y_lay = Lay::packed(&case.y_dims(), Fmt::Nhwc);
    let (x_d, w_d, dy_d) = (x_lay.desc::<i8>(), w_lay.filter::<i8>(), y_lay.desc::<i8>());
    let x = x_lay.upload(&g, &rng.small_ints::<i8>(x_lay.count()));
    let w = w_lay.upload(&g, &rng.small_ints::<i8>(w_lay.count()));
    let dy = y_lay.upload(&g, &rng.small_ints::<i8>(y_lay.count()));
    let dx_before = vec![i8::from_f64(SENTINEL); x_d.span()];
    let mut dx = g.stream.clone_htod(&dx_before).unwrap();
    let r = g.cudnn.conv_backward_data(
        1.0,
        &w_d,
        &w,
        &dy_d,
        &dy,
        &conv,
        ConvBwdDataAlgo::Algo1,
        &mut ws,
        0.0,
        &x_d,
        &mut dx,
    );
    assert!(
        matches!(r, Err(Error::UnsupportedDataType { .. })),
        "i8 backward data: {r:?}"
    );
    assert_untouched("i8 backward data", &g.stream, &dx, &dx_before);
    let dw_before = vec![i8::from_f64(SENTINEL); w_d.span()];
    let mut dw = g.stream.clone_htod(&dw_before).unwrap();
    let r = g.cudnn.conv_backward_filter(
        1.0,
        &x_d,
        &x,
        &dy_d,
        &dy,
        &conv,
        ConvBwdFilterAlgo::Algo1,
        &mut ws,
        0.0,
        &w_d,
        &mut dw,
    );
    assert!(
        matches!(r, Err(Error::UnsupportedDataType { .. })),
        "i8 backward filter: {r:?}"
    );
    assert_untouched("i8 backward filter", &g.stream, &dw, &dw_before);
    let db_d = TensorDesc::<i8>::nchw(1, case.k, 1, 1).unwrap();
    let db_before = vec![i8::from_f64(SENTINEL); db_d.span()];
    let mut db = g.stream.clone_htod(&db_before).unwrap();
    let r = g
        .cudnn
        .conv_backward_bias(1.0, &dy_d, &dy, 0.0, &db_d, &mut db);
    assert!(
        matches!(r, Err(Error::UnsupportedDataType { .. })),
        "i8 backward bias: {r:?}"
    );
    assert_untouched("i8 backward bias", &g.stream, &db, &db_before);
    println!("unsupported types: f32 -> f16 forward, f16 bias for f32, i8 backward data/filter/bias rejected with UnsupportedDataType");
}

// ---------------------------------------------------------------------------------------------
// Find: every algorithm run and timed
// ---------------------------------------------------------------------------------------------

/// Checks a find result: at least one supported entry, times ≥ 0 and ascending among the
/// supported entries, each supported entry (with the descriptor's math type) accepted by the
/// workspace query. Returns the fastest.
fn check_find<A: ConvAlgorithm>(
    what: &str,
    perf: &[AlgoPerf<A>],
    math: MathType,
    accepted: impl Fn(A) -> bool,
) -> A {
    let sup: Vec<&AlgoPerf<A>> = perf.iter().filter(|p| p.is_supported()).collect();
    assert!(!sup.is_empty(), "{what}: no supported entry in {perf:?}");
    for p in &sup {
        assert!(
            p.time_ms >= 0.0 && p.time_ms.is_finite(),
            "{what}: supported entry with time {}: {p:?}",
            p.time_ms
        );
        if p.math == math {
            assert!(
                accepted(p.algo),
                "{what}: find ran {} but the workspace query refuses it",
                p.algo
            );
        }
    }
    for pair in sup.windows(2) {
        assert!(
            pair[0].time_ms <= pair[1].time_ms,
            "{what}: supported entries not sorted by time: {perf:?}"
        );
    }
    sup[0].algo
}

/// Checks `dev` (laid out as `lay`, written over `before`) against `alpha·r + beta·old` where
/// `old` is read from `before`.
#[allow(clippy::too_many_arguments)]
fn verify<T: DataType>(
    g: &Gpu,
    what: &str,
    lay: &Lay,
    dev: &CudaSlice<T>,
    before: &[T],
    r: &Ref,
    tol: Tol,
    (alpha, beta): (f64, f64),
    transform: bool,
) -> f64 {
    let got = download(&g.stream, dev);
    let old = (beta != 0.0).then(|| gather(lay, before));
    let (want, bound) = tol.expect(r, alpha, beta, old.as_deref(), transform);
    check(what, &got, before, lay, &want, &bound)
}

/// Find cases: 2-D NCHW and NHWC f32 with strict fp32 math.
fn find_cases(rng: &mut Rng) -> Vec<Case> {
    let nhwc = Shapes {
        fmts: &[Fmt::Nhwc],
        ..F32_NCHW_2D
    };
    vec![
        rng.case(&F32_NCHW_2D, 0),
        rng.case(&F32_NCHW_2D, 1),
        rng.case(&nhwc, 2),
    ]
}

#[test]
fn find_forward_sorted_and_fastest_correct() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(801);
    let mut ws = Workspace::new(g.stream.clone());
    let mut supported = 0;
    let mut fastest = Vec::new();
    for case in find_cases(&mut rng) {
        let s = Setup::<f32>::new(&g, &mut rng, &case, MathType::Fma, Gen::Uniform);
        let y_d = s.y_lay.desc::<f32>();
        let what = format!("forward find {}", case.short());
        let before = s.y_lay.output_image::<f32>(None);
        let mut scratch = g.stream.clone_htod(&before).unwrap();
        let perf = g
            .cudnn
            .conv_forward_find(
                &s.x_d,
                &s.x,
                &s.w_d,
                &s.w,
                &s.conv,
                &y_d,
                &mut scratch,
                &mut ws,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let best = check_find(&what, &perf, s.conv.math(), |a| {
            g.cudnn
                .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, &y_d, a)
                .is_ok()
        });
        supported += perf.iter().filter(|p| p.is_supported()).count();
        let mut y = g.stream.clone_htod(&before).unwrap();
        g.cudnn
            .conv_forward(
                1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, best, &mut ws, 0.0, &y_d, &mut y,
            )
            .unwrap_or_else(|e| panic!("{what}: fastest {best}: {e}"));
        let r = s.geo.forward(&s.xf, &s.wf);
        verify(
            &g,
            &what,
            &s.y_lay,
            &y,
            &before,
            &r,
            FP32,
            (1.0, 0.0),
            is_transform(best),
        );
        fastest.push(best);
    }
    println!(
        "find forward: 3 shapes, {supported} supported entries, sorted; fastest {fastest:?} correct"
    );
}

#[test]
fn find_backward_data_sorted_and_fastest_correct() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(802);
    let mut ws = Workspace::new(g.stream.clone());
    let mut supported = 0;
    let mut fastest = Vec::new();
    for case in find_cases(&mut rng) {
        let s = Setup::<f32>::new(&g, &mut rng, &case, MathType::Fma, Gen::Uniform);
        let dy_d = s.y_lay.desc::<f32>();
        let dyh: Vec<f32> = rng.values(s.y_lay.count());
        let dy = s.y_lay.upload(&g, &dyh);
        let what = format!("backward data find {}", case.short());
        let before = s.x_lay.output_image::<f32>(None);
        let mut scratch = g.stream.clone_htod(&before).unwrap();
        let perf = g
            .cudnn
            .conv_backward_data_find(
                &s.w_d,
                &s.w,
                &dy_d,
                &dy,
                &s.conv,
                &s.x_d,
                &mut scratch,
                &mut ws,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let best = check_find(&what, &perf, s.conv.math(), |a| {
            g.cudnn
                .conv_backward_data_workspace_size(&s.w_d, &dy_d, &s.conv, &s.x_d, a)
                .is_ok()
        });
        supported += perf.iter().filter(|p| p.is_supported()).count();
        let mut dx = g.stream.clone_htod(&before).unwrap();
        g.cudnn
            .conv_backward_data(
                1.0, &s.w_d, &s.w, &dy_d, &dy, &s.conv, best, &mut ws, 0.0, &s.x_d, &mut dx,
            )
            .unwrap_or_else(|e| panic!("{what}: fastest {best}: {e}"));
        let r = s.geo.backward_data(&to_f64(&dyh), &s.wf);
        verify(
            &g,
            &what,
            &s.x_lay,
            &dx,
            &before,
            &r,
            FP32,
            (1.0, 0.0),
            is_transform(best),
        );
        fastest.push(best);
    }
    println!(
        "find backward data: 3 shapes, {supported} supported entries, sorted; fastest {fastest:?} correct"
    );
}

#[test]
fn find_backward_filter_sorted_and_fastest_correct() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(803);
    let mut ws = Workspace::new(g.stream.clone());
    let mut supported = 0;
    let mut fastest = Vec::new();
    for case in find_cases(&mut rng) {
        let s = Setup::<f32>::new(&g, &mut rng, &case, MathType::Fma, Gen::Uniform);
        let dy_d = s.y_lay.desc::<f32>();
        let dyh: Vec<f32> = rng.values(s.y_lay.count());
        let dy = s.y_lay.upload(&g, &dyh);
        let what = format!("backward filter find {}", case.short());
        let before = s.w_lay.output_image::<f32>(None);
        let mut scratch = g.stream.clone_htod(&before).unwrap();
        let perf = g
            .cudnn
            .conv_backward_filter_find(
                &s.x_d,
                &s.x,
                &dy_d,
                &dy,
                &s.conv,
                &s.w_d,
                &mut scratch,
                &mut ws,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let best = check_find(&what, &perf, s.conv.math(), |a| {
            g.cudnn
                .conv_backward_filter_workspace_size(&s.x_d, &dy_d, &s.conv, &s.w_d, a)
                .is_ok()
        });
        supported += perf.iter().filter(|p| p.is_supported()).count();
        let mut dw = g.stream.clone_htod(&before).unwrap();
        g.cudnn
            .conv_backward_filter(
                1.0, &s.x_d, &s.x, &dy_d, &dy, &s.conv, best, &mut ws, 0.0, &s.w_d, &mut dw,
            )
            .unwrap_or_else(|e| panic!("{what}: fastest {best}: {e}"));
        let r = s.geo.backward_filter(&s.xf, &to_f64(&dyh));
        verify(
            &g,
            &what,
            &s.w_lay,
            &dw,
            &before,
            &r,
            FP32,
            (1.0, 0.0),
            is_transform(best),
        );
        fastest.push(best);
    }
    println!(
        "find backward filter: 3 shapes, {supported} supported entries, sorted; fastest {fastest:?} correct"
    );
}

// ---------------------------------------------------------------------------------------------
// Autotuner
// ---------------------------------------------------------------------------------------------

/// A tuner with `policy` and no decisions: no cache file, and whatever `CUDNN_SAFE_AUTOTUNE_CACHE`
/// may have loaded forgotten.
fn fresh(policy: Policy) -> Autotuner {
    let mut t = Autotuner::new(policy).without_cache_file();
    t.clear();
    t
}

/// An f32 (strict fp32) problem with `dy`, a bias, and the references of every direction, run
/// through an autotuner and checked.
struct Tuned {
    s: Setup<f32>,
    y_d: TensorDesc<f32>,
    dy: CudaSlice<f32>,
    b_d: TensorDesc<f32>,
    bias: CudaSlice<f32>,
    y_ref: Ref,
    dx_ref: Ref,
    dw_ref: Ref,
    /// relu(conv + bias).
    fused_ref: Ref,
}

impl Tuned {
    fn new(g: &Gpu, rng: &mut Rng, case: &Case) -> Tuned {
        let s = Setup::<f32>::new(g, rng, case, MathType::Fma, Gen::Uniform);
        let y_d = s.y_lay.desc::<f32>();
        let dyh: Vec<f32> = rng.values(s.y_lay.count());
        let dyf = to_f64(&dyh);
        let dy = s.y_lay.upload(g, &dyh);
        let b_d = TensorDesc::<f32>::nchw(1, case.k, 1, 1).unwrap();
        let bh: Vec<f32> = rng.values(case.k as usize);
        let bias = g.stream.clone_htod(&bh).unwrap();
        let y_ref = s.geo.forward(&s.xf, &s.wf);
        let mut fused_ref = y_ref.clone();
        for i in 0..fused_ref.val.len() {
            let b = f64::from(bh[s.geo.channel_of(i)]);
            fused_ref.val[i] += b;
            fused_ref.abs[i] += b.abs();
        }
        Tuned {
            dx_ref: s.geo.backward_data(&dyf, &s.wf),
            dw_ref: s.geo.backward_filter(&s.xf, &dyf),
            y_ref,
            fused_ref,
            s,
            y_d,
            dy,
            b_d,
            bias,
        }
    }

    fn what(&self, tuner: &Autotuner, dir: &str) -> String {
        format!(
            "autotuner {} {dir} {}",
            tuner.policy().name(),
            self.s.case.short()
        )
    }

    /// `y = alpha·conv(x, w) + beta·y` (random old `y` when `beta ≠ 0`), checked on success.
    fn forward(
        &self,
        g: &Gpu,
        rng: &mut Rng,
        tuner: &mut Autotuner,
        alpha: f32,
        beta: f32,
    ) -> Result<Choice<ConvFwdAlgo>, Error> {
        let s = &self.s;
        let old: Option<Vec<f32>> = (beta != 0.0).then(|| rng.values(s.y_lay.count()));
        let before = s.y_lay.output_image(old.as_deref());
        let mut y = g.stream.clone_htod(&before).unwrap();
        let c = tuner.forward(
            &g.cudnn, alpha, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, beta, &self.y_d, &mut y,
        )?;
        let what = format!("{} with {}", self.what(tuner, "forward"), c.describe());
        let ab = (f64::from(alpha), f64::from(beta));
        // A graph engine chosen by the union search may transform the data (Winograd, FFT) and
        // the choice does not carry its notes: it gets the transform allowance.
        let transform = is_transform(c.algo) || c.api.is_graph();
        verify(
            g,
            &what,
            &s.y_lay,
            &y,
            &before,
            &self.y_ref,
            FP32,
            ab,
            transform,
        );
        Ok(c)
    }

    /// `y = relu(conv(x, w) + bias)` without z (y NaN-poisoned), checked on success.
    fn fused_relu(&self, g: &Gpu, tuner: &mut Autotuner) -> Result<Choice<ConvFwdAlgo>, Error> {
        let s = &self.s;
        let before = s.y_lay.output_image::<f32>(None);
        let mut y = g.stream.clone_htod(&before).unwrap();
        let c = tuner.bias_activation_forward(
            &g.cudnn,
            1.0,
            &s.x_d,
            &s.x,
            &s.w_d,
            &s.w,
            &s.conv,
            0.0,
            None,
            &self.b_d,
            &self.bias,
            FusedActivation::Relu,
            &self.y_d,
            &mut y,
        )?;
        let what = format!("{} with {}", self.what(tuner, "fused relu"), c.describe());
        let got = download(&g.stream, &y);
        let transform = is_transform(c.algo) || c.api.is_graph();
        let (mut want, bound) = FP32.expect(&self.fused_ref, 1.0, 0.0, None, transform);
        want.iter_mut().for_each(|v| *v = v.max(0.0));
        check(&what, &got, &before, &s.y_lay, &want, &bound);
        Ok(c)
    }

    /// `dx = alpha·dgrad(dy, w) + beta·dx`, checked on success.
    fn backward_data(
        &self,
        g: &Gpu,
        rng: &mut Rng,
        tuner: &mut Autotuner,
        alpha: f32,
        beta: f32,
    ) -> Result<Choice<ConvBwdDataAlgo>, Error> {
        let s = &self.s;
        let old: Option<Vec<f32>> = (beta != 0.0).then(|| rng.values(s.x_lay.count()));
        let before = s.x_lay.output_image(old.as_deref());
        let mut dx = g.stream.clone_htod(&before).unwrap();
        let c = tuner.backward_data(
            &g.cudnn, alpha, &s.w_d, &s.w, &self.y_d, &self.dy, &s.conv, beta, &s.x_d, &mut dx,
        )?;
        let what = format!(
            "{} with {}",
            self.what(tuner, "backward data"),
            c.describe()
        );
        let ab = (f64::from(alpha), f64::from(beta));
        // A graph engine (union search) may transform the data: see `forward`.
        let transform = is_transform(c.algo) || c.api.is_graph();
        verify(
            g,
            &what,
            &s.x_lay,
            &dx,
            &before,
            &self.dx_ref,
            FP32,
            ab,
            transform,
        );
        Ok(c)
    }

    /// `dw = alpha·wgrad(x, dy) + beta·dw`, checked on success; also returns `dw`.
    fn backward_filter(
        &self,
        g: &Gpu,
        rng: &mut Rng,
        tuner: &mut Autotuner,
        alpha: f32,
        beta: f32,
    ) -> Result<(Choice<ConvBwdFilterAlgo>, Vec<f32>), Error> {
        let s = &self.s;
        let old: Option<Vec<f32>> = (beta != 0.0).then(|| rng.values(s.w_lay.count()));
        let before = s.w_lay.output_image(old.as_deref());
        let mut dw = g.stream.clone_htod(&before).unwrap();
        let c = tuner.backward_filter(
            &g.cudnn, alpha, &s.x_d, &s.x, &self.y_d, &self.dy, &s.conv, beta, &s.w_d, &mut dw,
        )?;
        let what = format!(
            "{} with {}",
            self.what(tuner, "backward filter"),
            c.describe()
        );
        let ab = (f64::from(alpha), f64::from(beta));
        // A graph engine (union search) may transform the data: see `forward`.
        let transform = is_transform(c.algo) || c.api.is_graph();
        verify(
            g,
            &what,
            &s.w_lay,
            &dw,
            &before,
            &self.dw_ref,
            FP32,
            ab,
            transform,
        );
        Ok((c, download(&g.stream, &dw)))
    }
}

/// Unwraps a tuner result with context.
fn ok<T>(what: &str, r: Result<T, Error>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A grouped, strided 2-D case for the autotuner tests.
fn tuner_case() -> Case {
    Case {
        spatial: 2,
        n: 2,
        c: 6,
        k: 4,
        groups: 2,
        input: vec![8, 7],
        kernel: vec![3, 3],
        pads: vec![1, 1],
        strides: vec![1, 2],
        dilations: vec![1, 1],
        mode: ConvMode::CrossCorrelation,
        fmt: Fmt::Nchw,
    }
}

#[test]
fn autotuner_policies_give_correct_results_and_cache_decisions() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(901);
    let t = Tuned::new(&g, &mut rng, &tuner_case());
    let mut summary = Vec::new();
    for policy in [
        Policy::Heuristic,
        Policy::Benchmark,
        Policy::Deterministic,
        Policy::Fixed(FixedAlgos::default()),
    ] {
        let name = policy.name();
        let fixed = matches!(policy, Policy::Fixed(_));
        let first = match policy {
            Policy::Heuristic => Source::Heuristic,
            Policy::Fixed(_) => Source::Fixed,
            _ => Source::Benchmark,
        };
        let again = if fixed { Source::Fixed } else { Source::Cache };
        let mut tuner = fresh(policy);
        // Each direction: the first call decides, the second is served from the cache (one more
        // hit each); a fixed policy always reports its fixed algorithm and never counts hits.
        let hits0 = tuner.stats().hits;
        let f1 = ok(name, t.forward(&g, &mut rng, &mut tuner, 1.0, 0.0));
        let f2 = ok(name, t.forward(&g, &mut rng, &mut tuner, 1.0, 0.0));
        // The fused call shares the forward decision of the same problem.
        let f3 = ok(name, t.fused_relu(&g, &mut tuner));
        let d1 = ok(name, t.backward_data(&g, &mut rng, &mut tuner, 1.0, 0.0));
        let d2 = ok(name, t.backward_data(&g, &mut rng, &mut tuner, 1.0, 0.0));
        let (w1, _) = ok(name, t.backward_filter(&g, &mut rng, &mut tuner, 1.0, 0.0));
        let (w2, _) = ok(name, t.backward_filter(&g, &mut rng, &mut tuner, 1.0, 0.0));
        for (dir, s1, s2) in [
            ("forward", f1.source, f2.source),
            ("backward data", d1.source, d2.source),
            ("backward filter", w1.source, w2.source),
        ] {
            assert_eq!(s1, first, "{name} {dir}: first call");
            assert_eq!(s2, again, "{name} {dir}: second call");
        }
        assert_eq!(f3.source, again, "{name} fused after forward");
        let stats = tuner.stats();
        if fixed {
            let d = FixedAlgos::default();
            assert_eq!(
                (f1.algo, f2.algo, f3.algo),
                (d.forward, d.forward, d.forward)
            );
            assert_eq!((d1.algo, d2.algo), (d.backward_data, d.backward_data));
            assert_eq!((w1.algo, w2.algo), (d.backward_filter, d.backward_filter));
            assert_eq!(stats.hits, hits0, "{name}: {stats:?}");
        } else {
            assert_eq!(stats.hits, hits0 + 4, "{name}: {stats:?}");
            assert_eq!(stats.misses, 3, "{name}: {stats:?}");
            assert_eq!((f1.algo, d1.algo, w1.algo), (f2.algo, d2.algo, w2.algo));
        }
        let benchmarks = if matches!(policy, Policy::Benchmark | Policy::Deterministic) {
            3
        } else {
            0
        };
        assert_eq!(stats.benchmarks, benchmarks, "{name}: {stats:?}");
        summary.push(format!("{name} {}/{}/{}", f1.algo, d1.algo, w1.algo));
    }
    println!(
        "autotuner policies ({}): forward, fused relu, backward data and filter correct; second calls from the cache",
        summary.join(", ")
    );
}

#[test]
fn autotuner_deterministic_backward_filter_is_bitwise_reproducible() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(902);
    // A long reduction (N·H·W = 300 terms per weight) so that atomics would show.
    let t = Tuned::new(
        &g,
        &mut rng,
        &Case::square(3, 4, 10, 4, 3, 1, 1, 1, Fmt::Nchw),
    );
    let mut tuner = fresh(Policy::Deterministic);
    let (c1, dw1) = ok(
        "first",
        t.backward_filter(&g, &mut rng, &mut tuner, 1.0, 0.0),
    );
    let (c2, dw2) = ok(
        "second",
        t.backward_filter(&g, &mut rng, &mut tuner, 1.0, 0.0),
    );
    assert_eq!(c1.source, Source::Benchmark);
    assert_eq!(c2.source, Source::Cache);
    assert_eq!(c1.algo, c2.algo);
    let differ = dw1
        .iter()
        .zip(&dw2)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differ,
        0,
        "deterministic {}: {differ} of {} weights differ between two runs",
        c1.algo,
        dw1.len()
    );
    println!(
        "autotuner deterministic: backward filter with {} twice, {} weights bitwise identical",
        c1.algo,
        dw1.len()
    );
}

#[test]
fn autotuner_benchmark_preserves_accumulated_outputs() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(903);
    let t = Tuned::new(&g, &mut rng, &tuner_case());
    let mut tuner = fresh(Policy::Benchmark);
    // First calls with beta = 1: the benchmark must run on scratch memory, so that the result is
    // old + gradient (checked inside against the old values).
    let (w, _) = ok("dw", t.backward_filter(&g, &mut rng, &mut tuner, 1.0, 1.0));
    assert_eq!(w.source, Source::Benchmark);
    assert_eq!(tuner.stats().benchmarks, 1);
    let f = ok("y", t.forward(&g, &mut rng, &mut tuner, 1.0, 1.0));
    assert_eq!(f.source, Source::Benchmark);
    let d = ok("dx", t.backward_data(&g, &mut rng, &mut tuner, 0.5, 1.0));
    assert_eq!(d.source, Source::Benchmark);
    assert_eq!(tuner.stats().benchmarks, 3);
    println!(
        "autotuner benchmark with beta = 1: dw += grad ({}), y += conv ({}), dx += 0.5·grad ({}) all preserved the old values",
        w.algo, f.algo, d.algo
    );
}

#[test]
fn autotuner_zero_workspace_limit() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(904);
    let t = Tuned::new(&g, &mut rng, &tuner_case());
    let s = &t.s;
    // Whether some algorithm of each direction needs no workspace here; if none does, the tuner
    // must say so with NoAlgorithm.
    let zero_fwd = ConvFwdAlgo::ALL.iter().any(|&a| {
        matches!(
            g.cudnn
                .conv_forward_workspace_size(&s.x_d, &s.w_d, &s.conv, &t.y_d, a),
            Ok(0)
        )
    });
    let zero_data = ConvBwdDataAlgo::ALL.iter().any(|&a| {
        matches!(
            g.cudnn
                .conv_backward_data_workspace_size(&s.w_d, &t.y_d, &s.conv, &s.x_d, a),
            Ok(0)
        )
    });
    let zero_filter = ConvBwdFilterAlgo::ALL.iter().any(|&a| {
        matches!(
            g.cudnn
                .conv_backward_filter_workspace_size(&s.x_d, &t.y_d, &s.conv, &s.w_d, a),
            Ok(0)
        )
    });
    let mut ran = Vec::new();
    for policy in [Policy::Heuristic, Policy::Benchmark] {
        let mut tuner = fresh(policy).with_workspace_limit(0);
        assert_eq!(tuner.workspace_limit(), 0);
        let name = policy.name();
        let mut expect = |dir: &str, zero: bool, r: Result<(String, usize), Error>| match (zero, r)
        {
            (true, Ok((algo, ws))) => {
                assert_eq!(ws, 0, "{name} {dir} with {algo}: Choice::workspace");
                ran.push(format!("{name} {dir} {algo}"));
            }
            (false, Err(Error::NoAlgorithm { .. })) => ran.push(format!("{name} {dir}: none")),
            (zero, r) => panic!("{name} {dir} (zero-workspace algorithm exists: {zero}): {r:?}"),
        };
        let f = t.forward(&g, &mut rng, &mut tuner, 1.0, 0.0);
        expect(
            "forward",
            zero_fwd,
            f.map(|c| (c.algo.to_string(), c.workspace)),
        );
        let d = t.backward_data(&g, &mut rng, &mut tuner, 1.0, 0.0);
        expect(
            "backward data",
            zero_data,
            d.map(|c| (c.algo.to_string(), c.workspace)),
        );
        let w = t.backward_filter(&g, &mut rng, &mut tuner, 1.0, 0.0);
        expect(
            "backward filter",
            zero_filter,
            w.map(|(c, _)| (c.algo.to_string(), c.workspace)),
        );
        assert_eq!(
            tuner.workspace_bytes(),
            0,
            "{name}: the tuner allocated a workspace"
        );
    }
    println!("autotuner workspace_limit(0): {}", ran.join(", "));
}

#[test]
fn autotuner_cache_file_persists_decisions() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(905);
    let t = Tuned::new(&g, &mut rng, &tuner_case());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = std::env::temp_dir().join(format!(
        "cudnn-safe-conv-test-{}-{nanos}.txt",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);

    let mut a = fresh(Policy::Benchmark).cache_file(&path);
    let ca = ok("tuner A", t.forward(&g, &mut rng, &mut a, 1.0, 0.0));
    assert_eq!(ca.source, Source::Benchmark);
    assert_eq!(a.stats().benchmarks, 1);
    assert!(path.exists(), "{} was not written", path.display());
    drop(a);

    let mut b = fresh(Policy::Benchmark).cache_file(&path);
    assert!(b.cached_decisions() >= 1);
    assert!(
        b.cached_forward(&g.cudnn, &t.s.x_d, &t.s.w_d, &t.s.conv, &t.y_d)
            .is_some(),
        "the file's decision is not found for the same problem"
    );
    let cb = ok("tuner B", t.forward(&g, &mut rng, &mut b, 1.0, 0.0));
    assert_eq!(cb.source, Source::Cache);
    assert_eq!(cb.algo, ca.algo);
    let stats = b.stats();
    assert_eq!(
        (stats.benchmarks, stats.hits, stats.misses),
        (0, 1, 0),
        "{stats:?}"
    );
    drop(b);
    let _ = std::fs::remove_file(&path);
    println!(
        "autotuner cache file: decision {} written by one tuner, used by a fresh one without benchmarking",
        ca.algo
    );
}

#[test]
fn autotuner_fixed_algorithm_that_cannot_run_is_no_algorithm() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(906);
    let (s, algo, e) = refused_fft_or_winograd(&g, &mut rng);
    assert!(matches!(e, Error::Cudnn { .. }), "{e:?}");
    let y_d = s.y_lay.desc::<f32>();
    let before = vec![SENTINEL as f32; y_d.span()];
    let mut y = g.stream.clone_htod(&before).unwrap();
    let mut tuner = fresh(Policy::Fixed(FixedAlgos {
        forward: algo,
        ..FixedAlgos::default()
    }));
    let r = tuner.forward(
        &g.cudnn, 1.0, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, 0.0, &y_d, &mut y,
    );
    assert!(
        matches!(r, Err(Error::NoAlgorithm { .. })),
        "fixed {algo}: {r:?}"
    );
    assert_untouched("fixed forward that cannot run", &g.stream, &y, &before);

    // The fused Winograd backward-filter algorithm is defined but never implemented by cuDNN.
    let wino = ConvBwdFilterAlgo::Winograd;
    let q = g
        .cudnn
        .conv_backward_filter_workspace_size(&s.x_d, &y_d, &s.conv, &s.w_d, wino);
    assert!(matches!(q, Err(Error::Cudnn { .. })), "{wino}: {q:?}");
    let dy = g.stream.clone_htod(&rng.values::<f32>(y_d.span())).unwrap();
    let dw_before = vec![SENTINEL as f32; s.w_d.span()];
    let mut dw = g.stream.clone_htod(&dw_before).unwrap();
    let mut tuner = fresh(Policy::Fixed(FixedAlgos {
        backward_filter: wino,
        ..FixedAlgos::default()
    }));
    let r = tuner.backward_filter(
        &g.cudnn, 1.0, &s.x_d, &s.x, &y_d, &dy, &s.conv, 0.0, &s.w_d, &mut dw,
    );
    assert!(
        matches!(r, Err(Error::NoAlgorithm { .. })),
        "fixed backward filter {wino}: {r:?}"
    );
    assert_untouched(
        "fixed backward filter that cannot run",
        &g.stream,
        &dw,
        &dw_before,
    );
    println!("autotuner fixed: forward {algo} and backward filter {wino} on stride 2 / dilation 2 give NoAlgorithm, outputs untouched");
}

// ---------------------------------------------------------------------------------------------
// Union autotune: legacy algorithms and graph engines searched together (forward)
// ---------------------------------------------------------------------------------------------

/// A data type, layout and math mode of the union tests, with its tolerance.
struct UnionMode {
    name: &'static str,
    fmt: Fmt,
    math: MathType,
    tol: Tol,
}

const UNION_F16: UnionMode = UnionMode {
    name: "f16 nhwc",
    fmt: Fmt::Nhwc,
    math: MathType::Default,
    tol: FP16,
};
const UNION_BF16: UnionMode = UnionMode {
    name: "bf16 nhwc",
    fmt: Fmt::Nhwc,
    math: MathType::Default,
    tol: BF16,
};
const UNION_FP32: UnionMode = UnionMode {
    name: "f32 strict",
    fmt: Fmt::Nchw,
    math: MathType::Fma,
    tol: FP32,
};
const UNION_TF32: UnionMode = UnionMode {
    name: "f32 tf32",
    fmt: Fmt::Nchw,
    math: MathType::Default,
    tol: TF32,
};

/// A padded, strided problem with channel counts tensor-core engines take (multiples of 8).
fn union_case(fmt: Fmt) -> Case {
    Case {
        strides: vec![1, 2],
        ..Case::square(2, 8, 9, 16, 3, 1, 1, 1, fmt)
    }
}

fn union_setup<T: DataType>(g: &Gpu, rng: &mut Rng, mode: &UnionMode) -> Setup<T> {
    Setup::<T>::new(g, rng, &union_case(mode.fmt), mode.math, Gen::Uniform)
}

/// `y = alpha·conv(x, w) + beta·y` through `tuner` (y NaN-poisoned when `beta = 0`, random
/// otherwise), checked against the f64 reference; returns the choice and `y`.
#[allow(clippy::too_many_arguments)]
fn union_call<T: DataType>(
    g: &Gpu,
    rng: &mut Rng,
    tuner: &mut Autotuner,
    s: &Setup<T>,
    mode: &UnionMode,
    alpha: f64,
    beta: f64,
) -> (Choice<ConvFwdAlgo>, Vec<T>) {
    let y_d = s.y_lay.desc::<T>();
    let r = s.geo.forward(&s.xf, &s.wf);
    let (alpha_s, alpha) = scalar::<T>(alpha);
    let (beta_s, beta) = scalar::<T>(beta);
    let old: Option<Vec<T>> = (beta != 0.0).then(|| rng.values(s.y_lay.count()));
    let before = s.y_lay.output_image(old.as_deref());
    let mut y = g.stream.clone_htod(&before).unwrap();
    let what = format!(
        "union {} {} (search {}) alpha {alpha} beta {beta}",
        mode.name,
        tuner.policy().name(),
        tuner.graph_search().name()
    );
    let c = tuner
        .forward(
            &g.cudnn, alpha_s, &s.x_d, &s.x, &s.w_d, &s.w, &s.conv, beta_s, &y_d, &mut y,
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let what = format!("{what}: {} ({:?})", c.describe(), c.source);
    // A graph engine may transform the data (Winograd, FFT); the choice does not carry its
    // notes, so it gets the transform allowance of the mode.
    let transform = is_transform(c.algo) || c.api.is_graph();
    verify(
        g,
        &what,
        &s.y_lay,
        &y,
        &before,
        &r,
        mode.tol,
        (alpha, beta),
        transform,
    );
    (c, download(&g.stream, &y))
}

fn union_mode_case<T: DataType>(g: &Gpu, seed: u64, mode: &UnionMode) -> String {
    let mut rng = Rng::new(seed);
    let s = union_setup::<T>(g, &mut rng, mode);
    let mut report = Vec::new();
    for search in [GraphSearch::Union, GraphSearch::Prefer, GraphSearch::Off] {
        let mut tuner = fresh(Policy::Benchmark).with_graph_search(search);
        let (first, _) = union_call(g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
        let (second, _) = union_call(g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
        assert_eq!(first.source, Source::Benchmark, "{}", mode.name);
        assert_eq!(second.source, Source::Cache, "{}", mode.name);
        assert_eq!(first.api, second.api, "{}: the cached decision", mode.name);
        assert_eq!(first.algo, second.algo, "{}", mode.name);
        let stats = tuner.stats();
        assert_eq!((stats.benchmarks, stats.hits), (1, 1), "{stats:?}");
        if search == GraphSearch::Off {
            assert_eq!(first.api, ConvApi::Legacy, "{}: search off", mode.name);
        }
        report.push(format!("{} → {}", search.name(), first.describe()));
    }
    // The heuristic policy stays legacy whatever the search mode.
    let mut tuner = fresh(Policy::Heuristic).with_graph_search(GraphSearch::Prefer);
    let (c, _) = union_call(g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
    assert_eq!(c.api, ConvApi::Legacy, "{} heuristic", mode.name);
    format!("{}: {}", mode.name, report.join(", "))
}

#[test]
fn union_benchmark_matches_reference_in_every_mode() {
    let Some(g) = gpu() else { return };
    let lines = [
        union_mode_case::<f16>(&g, 1001, &UNION_F16),
        union_mode_case::<bf16>(&g, 1002, &UNION_BF16),
        union_mode_case::<f32>(&g, 1003, &UNION_FP32),
        union_mode_case::<f32>(&g, 1004, &UNION_TF32),
    ];
    for l in lines {
        println!("union autotune {l}");
    }
}

#[test]
fn union_prefer_runs_a_graph_engine_for_half_nhwc() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1005);
    for (mode, is_bf16) in [(&UNION_F16, false), (&UNION_BF16, true)] {
        let mut tuner = fresh(Policy::Benchmark).with_graph_search(GraphSearch::Prefer);
        let c = if is_bf16 {
            let s = union_setup::<bf16>(&g, &mut rng, mode);
            union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0).0
        } else {
            let s = union_setup::<f16>(&g, &mut rng, mode);
            union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0).0
        };
        // The graph tests run conv fprop graphs of these layouts: a plan exists and must win.
        assert!(c.api.is_graph(), "{}: {}", mode.name, c.describe());
        println!("union prefer {}: {}", mode.name, c.describe());
    }
}

/// Calls with `alpha ≠ 1` or `beta ≠ 0` run the decision's graph plan too (under `Prefer`,
/// whatever its margin): the plan writes scratch memory, then `alpha·scratch + beta·y` lands in
/// `y`; the old values are kept and the result checked against the reference each time.
#[test]
fn union_accumulating_calls_compose_the_graph_plan_and_keep_old_values() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1006);
    let mode = &UNION_F16;
    let s = union_setup::<f16>(&g, &mut rng, mode);
    let mut tuner = fresh(Policy::Benchmark).with_graph_search(GraphSearch::Prefer);
    // The decision is made during an accumulating call: the benchmark (legacy and graph) runs on
    // scratch memory, then the chosen plan's result is added to the old values.
    let (acc, _) = union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 1.0);
    assert_eq!(acc.source, Source::Benchmark);
    assert!(acc.api.is_graph(), "{}", acc.describe());
    // The same decision serves a plain call with the graph engine it recorded.
    let (plain, _) = union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
    assert_eq!(plain.source, Source::Cache);
    assert_eq!(plain.api, acc.api, "{}", plain.describe());
    // Scaled and negatively accumulating calls compose it too.
    let (scaled, _) = union_call(&g, &mut rng, &mut tuner, &s, mode, 0.5, 0.0);
    assert_eq!(scaled.api, acc.api, "{}", scaled.describe());
    let (acc2, _) = union_call(&g, &mut rng, &mut tuner, &s, mode, 1.5, -0.5);
    assert_eq!(acc2.api, acc.api, "{}", acc2.describe());
    assert_eq!(tuner.stats().benchmarks, 1);
    // A tuner without the graph search accumulates on the legacy path, as before.
    let mut legacy = fresh(Policy::Benchmark).with_graph_search(GraphSearch::Off);
    let (old, _) = union_call(&g, &mut rng, &mut legacy, &s, mode, 1.0, 1.0);
    assert_eq!(old.api, ConvApi::Legacy, "{}", old.describe());
    println!(
        "union with beta ≠ 0: {} accumulated; plain call {}",
        acc.describe(),
        plain.describe()
    );
}

/// The tuner's held graph plan belongs to the handle it was built on: after that handle is
/// dropped, a new handle (often at the old address) gets the decision rebuilt on itself, never
/// the stale plan, and the result is right.
#[test]
fn union_held_plan_is_rebuilt_on_a_new_handle() {
    let Some(first) = gpu() else { return };
    let mut rng = Rng::new(1010);
    let mode = &UNION_F16;
    let s = union_setup::<f16>(&first, &mut rng, mode);
    let mut tuner = fresh(Policy::Benchmark).with_graph_search(GraphSearch::Prefer);
    let (tuned, _) = union_call(&first, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
    assert!(tuned.api.is_graph(), "{}", tuned.describe());
    let (stream, old_id) = (first.stream.clone(), first.cudnn.id());
    drop(first);
    for round in 0..3 {
        let g = Gpu {
            stream: stream.clone(),
            cudnn: Cudnn::new(stream.clone()).unwrap(),
        };
        assert_ne!(g.cudnn.id(), old_id);
        let (c, _) = union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
        assert_eq!(
            c.source,
            Source::Cache,
            "round {round}: the decision is kept"
        );
        assert_eq!(c.api, tuned.api, "round {round}");
        assert_eq!(c.algo, tuned.algo, "round {round}");
    }
    assert_eq!(tuner.stats().benchmarks, 1);
}

#[test]
fn union_graph_decision_persists_and_is_rebuilt_without_benchmark() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1007);
    let mode = &UNION_F16;
    let s = union_setup::<f16>(&g, &mut rng, mode);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = std::env::temp_dir().join(format!(
        "cudnn-safe-union-test-{}-{nanos}.txt",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);

    let mut a = fresh(Policy::Benchmark)
        .with_graph_search(GraphSearch::Prefer)
        .cache_file(&path);
    let (ca, ya) = union_call(&g, &mut rng, &mut a, &s, mode, 1.0, 0.0);
    let ConvApi::Graph(config) = ca.api.clone() else {
        panic!("prefer: {}", ca.describe());
    };
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(&format!("\tgraph={config}:")),
        "the cache file lacks the graph engine {config}:\n{text}"
    );
    drop(a);

    let mut b = fresh(Policy::Benchmark)
        .with_graph_search(GraphSearch::Prefer)
        .cache_file(&path);
    let (cb, yb) = union_call(&g, &mut rng, &mut b, &s, mode, 1.0, 0.0);
    assert_eq!(cb.source, Source::Cache);
    assert_eq!(cb.api, ca.api, "{}", cb.describe());
    assert_eq!(cb.algo, ca.algo);
    let stats = b.stats();
    assert_eq!(
        (
            stats.benchmarks,
            stats.hits,
            stats.misses,
            stats.plan_builds
        ),
        (0, 1, 0, 1),
        "{stats:?}"
    );
    // The same engine on the same inputs: the same bits.
    let differ = ya
        .iter()
        .zip(&yb)
        .filter(|(p, q)| p.to_bits() != q.to_bits())
        .count();
    assert_eq!(
        differ, 0,
        "{differ} outputs differ between the two processes' plans"
    );
    // Held plan: the next call builds nothing.
    let (cc, _) = union_call(&g, &mut rng, &mut b, &s, mode, 1.0, 0.0);
    assert_eq!(cc.api, ca.api);
    assert_eq!(b.stats().plan_builds, 1);
    drop(b);
    let _ = std::fs::remove_file(&path);
    println!(
        "union cache file: graph {config} written, rebuilt by a fresh tuner without benchmarking"
    );
}

/// A call whose buffer is not 16-byte aligned (an f32 view one element into its allocation)
/// cannot run the graph plan the union search chose: it runs the legacy ranking, and only it.
/// The decision keeps its graph engine in memory (the next aligned call runs it) and in the
/// cache file (a new tuner reading it runs it too).
#[test]
fn union_misaligned_call_falls_back_for_that_call_only() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1010);
    let mode = &UNION_FP32;
    let s = union_setup::<f32>(&g, &mut rng, mode);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = std::env::temp_dir().join(format!(
        "cudnn-safe-misaligned-test-{}-{nanos}.txt",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    // x again, one element into a longer allocation: 4 bytes off the graph's alignment.
    let image = download(&g.stream, &s.x);
    let shifted: Vec<f32> = std::iter::once(SENTINEL as f32).chain(image).collect();
    let x_off = g.stream.clone_htod(&shifted).unwrap();
    let x_view = x_off.slice(1..);
    let y_d = s.y_lay.desc::<f32>();
    let r = s.geo.forward(&s.xf, &s.wf);
    let misaligned = |tuner: &mut Autotuner| -> Choice<ConvFwdAlgo> {
        let before = s.y_lay.output_image::<f32>(None);
        let mut y = g.stream.clone_htod(&before).unwrap();
        let c = tuner
            .forward(
                &g.cudnn, 1.0, &s.x_d, &x_view, &s.w_d, &s.w, &s.conv, 0.0, &y_d, &mut y,
            )
            .unwrap_or_else(|e| panic!("misaligned x: {e}"));
        let what = format!("misaligned x: {} ({:?})", c.describe(), c.source);
        assert_eq!(c.api, ConvApi::Legacy, "{what}");
        verify(
            &g,
            &what,
            &s.y_lay,
            &y,
            &before,
            &r,
            mode.tol,
            (1.0, 0.0),
            is_transform(c.algo),
        );
        c
    };
    let tuner = || {
        fresh(Policy::Benchmark)
            .with_graph_search(GraphSearch::Prefer)
            .cache_file(&path)
    };

    let mut a = tuner();
    let (first, _) = union_call(&g, &mut rng, &mut a, &s, mode, 1.0, 0.0);
    let ConvApi::Graph(config) = first.api.clone() else {
        panic!("prefer: {}", first.describe());
    };
    let c = misaligned(&mut a);
    assert_eq!(c.source, Source::Cache);
    // The graph plan could not run this call (its legacy favourite may in turn need another
    // candidate): at least one fallback.
    assert!(a.stats().fallbacks >= 1, "{:?}", a.stats());
    let (again, _) = union_call(&g, &mut rng, &mut a, &s, mode, 1.0, 0.0);
    assert_eq!(
        (again.source, &again.api),
        (Source::Cache, &first.api),
        "{}",
        again.describe()
    );
    assert_eq!(
        (a.stats().benchmarks, a.stats().plan_builds),
        (1, 0),
        "one search, the plan still held: {:?}",
        a.stats()
    );
    assert_eq!(
        a.cached_forward_graph(&g.cudnn, &s.x_d, &s.w_d, &s.conv, &y_d),
        Some(config.clone())
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains(&format!("\tgraph={config}:")),
        "the cache file lost the graph engine {config}:\n{text}"
    );
    drop(a);

    // A new tuner reads the decision: its first call, misaligned, rebuilds the plan and runs
    // legacy; the next, aligned, runs the remembered engine; nothing is benchmarked.
    let mut b = tuner();
    let b0 = misaligned(&mut b);
    assert_eq!(b0.source, Source::Cache);
    let (b1, _) = union_call(&g, &mut rng, &mut b, &s, mode, 1.0, 0.0);
    assert_eq!(
        (b1.source, &b1.api),
        (Source::Cache, &first.api),
        "{}",
        b1.describe()
    );
    let stats = b.stats();
    assert_eq!((stats.benchmarks, stats.plan_builds), (0, 1), "{stats:?}");
    assert!(stats.fallbacks >= 1, "{stats:?}");
    drop(b);
    let mut c = tuner();
    assert_eq!(
        c.cached_forward_graph(&g.cudnn, &s.x_d, &s.w_d, &s.conv, &y_d),
        Some(config.clone())
    );
    drop(c);
    let _ = std::fs::remove_file(&path);
    println!("union with a misaligned x: legacy for that call, graph {config} kept and persisted");
}

#[test]
fn union_warm_up_replays_cached_decisions() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1009);
    let s16 = union_setup::<f16>(&g, &mut rng, &UNION_F16);
    let s32 = union_setup::<f32>(&g, &mut rng, &UNION_FP32);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = std::env::temp_dir().join(format!(
        "cudnn-safe-warm-up-test-{}-{nanos}.txt",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let tuner = |policy| {
        fresh(policy)
            .with_graph_search(GraphSearch::Prefer)
            .cache_file(&path)
    };

    // One process decides two problems (graph plans under `Prefer`) and saves them.
    let mut a = tuner(Policy::Benchmark);
    let (c16, y16) = union_call(&g, &mut rng, &mut a, &s16, &UNION_F16, 1.0, 0.0);
    let (c32, _) = union_call(&g, &mut rng, &mut a, &s32, &UNION_FP32, 1.0, 0.0);
    assert!(
        c16.api.is_graph() && c32.api.is_graph(),
        "{} / {}",
        c16.describe(),
        c32.describe()
    );
    drop(a);

    // The next warms both up at start-up: plans rebuilt and held, nothing benchmarked.
    let mut b = tuner(Policy::Benchmark);
    let warm = b.warm_up(&g.cudnn).unwrap();
    // Both plans were rebuilt before the replays, at once.
    assert_eq!(
        (warm.replayed, warm.graph, warm.skipped, warm.built),
        (2, 2, 0, 2),
        "{warm:?}"
    );
    let stats = b.stats();
    assert_eq!(
        (stats.benchmarks, stats.misses, stats.plan_builds),
        (0, 0, 2),
        "{stats:?}"
    );
    // Its first real call builds nothing more and computes the same bits.
    let (cb, yb) = union_call(&g, &mut rng, &mut b, &s16, &UNION_F16, 1.0, 0.0);
    assert_eq!(
        (cb.source, &cb.api),
        (Source::Cache, &c16.api),
        "{}",
        cb.describe()
    );
    assert_eq!(b.stats().plan_builds, 2, "{:?}", b.stats());
    assert_eq!(b.stats().benchmarks, 0);
    let differ = y16
        .iter()
        .zip(&yb)
        .filter(|(p, q)| p.to_bits() != q.to_bits())
        .count();
    assert_eq!(differ, 0, "{differ} outputs differ after the warm-up");
    // A warm-up twice replays again, building nothing (the plans are held).
    let again = b.warm_up(&g.cudnn).unwrap();
    assert_eq!(
        (again.replayed, again.built, b.stats().plan_builds),
        (2, 0, 2),
        "{again:?}"
    );
    drop(b);

    // Another policy computes other keys: nothing of the file is its own.
    let mut c = tuner(Policy::Deterministic);
    let w = c.warm_up(&g.cudnn).unwrap();
    assert_eq!((w.replayed, w.skipped), (0, 2), "{w:?}");
    assert_eq!(c.stats().plan_builds, 0);
    // A fixed policy keeps no decisions.
    let mut d = tuner(Policy::Fixed(Default::default()));
    assert_eq!(
        d.warm_up(&g.cudnn).unwrap(),
        cudnn_safe::tune::WarmUp::default()
    );
    drop((c, d));
    let _ = std::fs::remove_file(&path);
    println!(
        "autotune warm-up: 2 decisions ({}, {}) replayed in {:?}, first call served by the held plan",
        c16.describe(),
        c32.describe(),
        warm.elapsed
    );
}

#[test]
fn union_deterministic_policy_picks_deterministic_graph_plans() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1008);
    let mode = &UNION_F16;
    let s = union_setup::<f16>(&g, &mut rng, mode);
    let mut tuner = fresh(Policy::Deterministic).with_graph_search(GraphSearch::Prefer);
    let (c1, y1) = union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
    let (c2, y2) = union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
    assert_eq!(c1.api, c2.api);
    let ConvApi::Graph(config) = &c1.api else {
        panic!("deterministic prefer: {}", c1.describe());
    };
    // The same plan built through the public graph API: its notes say deterministic.
    let case = union_case(mode.fmt);
    let mut gr = Graph::new(DType::F16, DType::F32, s.conv.compute());
    let x = gr.tensor_nhwc("x", &case.x_dims(), DType::F16).unwrap();
    let w = gr.tensor_nhwc("w", &case.w_dims(), DType::F16).unwrap();
    let params = ConvParams::new(2)
        .with_padding(&case.pads)
        .with_strides(&case.strides)
        .with_dilations(&case.dilations);
    let y = gr.conv_fprop(x, w, &params).unwrap();
    gr.mark_output(y).unwrap();
    let og = gr.build(&g.cudnn).unwrap();
    let plan = og.plan_from_config(&g.cudnn, config).unwrap();
    assert!(
        plan.is_deterministic(),
        "{config}: notes {:?}",
        plan.numerical_notes()
    );
    let differ = y1
        .iter()
        .zip(&y2)
        .filter(|(p, q)| p.to_bits() != q.to_bits())
        .count();
    assert_eq!(differ, 0, "deterministic {config}: {differ} outputs differ");
    println!(
        "union deterministic: {config} (notes {:?}) twice, bitwise identical",
        plan.numerical_notes()
    );
}

// ---------------------------------------------------------------------------------------------
// Union autotune of the other calls: backward data, backward filter, fused forward
// ---------------------------------------------------------------------------------------------

/// Graph plans per heuristic mode in these tests: fewer than the default 24 (the forward tests
/// above search that many) to keep the many searches below quick.
const UNION_TEST_PLANS: usize = 8;

/// Which call a union test makes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum UnionDir {
    /// `dx = alpha·dgrad(dy, w) + beta·dx`.
    Data,
    /// `dw = alpha·wgrad(x, dy) + beta·dw`.
    Filter,
    /// `y = relu(alpha·conv(x, w) + beta·z + bias)` (`z` only when `beta ≠ 0`).
    Fused,
}

impl UnionDir {
    const ALL: [UnionDir; 3] = [UnionDir::Data, UnionDir::Filter, UnionDir::Fused];
    fn name(self) -> &'static str {
        match self {
            UnionDir::Data => "backward data",
            UnionDir::Filter => "backward filter",
            UnionDir::Fused => "fused relu",
        }
    }
}

/// A union problem of type `T` with `dy`, a bias and the references of every direction.
struct UnionProblem<T: DataType> {
    s: Setup<T>,
    y_d: TensorDesc<T>,
    dy: CudaSlice<T>,
    b_d: TensorDesc<T>,
    bias: CudaSlice<T>,
    y_ref: Ref,
    bias_f: Vec<f64>,
    dx_ref: Ref,
    dw_ref: Ref,
}

impl<T: DataType> UnionProblem<T> {
    fn new(g: &Gpu, rng: &mut Rng, mode: &UnionMode) -> UnionProblem<T> {
        let s = union_setup::<T>(g, rng, mode);
        let y_d = s.y_lay.desc::<T>();
        let dyh: Vec<T> = rng.values(s.y_lay.count());
        let dyf = to_f64(&dyh);
        let dy = s.y_lay.upload(g, &dyh);
        let b_d = TensorDesc::<T>::nchw(1, s.case.k, 1, 1).unwrap();
        let bh: Vec<T> = rng.values(s.case.k as usize);
        UnionProblem {
            bias: g.stream.clone_htod(&bh).unwrap(),
            bias_f: to_f64(&bh),
            y_ref: s.geo.forward(&s.xf, &s.wf),
            dx_ref: s.geo.backward_data(&dyf, &s.wf),
            dw_ref: s.geo.backward_filter(&s.xf, &dyf),
            s,
            y_d,
            dy,
            b_d,
        }
    }

    /// One call of `dir` through `tuner`, its output NaN-poisoned (`beta = 0`) or random old
    /// values (`beta ≠ 0`; for the fused call, a random `z` instead), checked against the f64
    /// reference; returns the choice (its algorithm by name) and the output.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        g: &Gpu,
        rng: &mut Rng,
        tuner: &mut Autotuner,
        mode: &UnionMode,
        dir: UnionDir,
        alpha: f64,
        beta: f64,
    ) -> (Choice<String>, Vec<T>) {
        let s = &self.s;
        let (alpha_s, alpha) = scalar::<T>(alpha);
        let (beta_s, beta) = scalar::<T>(beta);
        let what = format!(
            "union {} {} {} (search {}) alpha {alpha} beta {beta}",
            dir.name(),
            mode.name,
            tuner.policy().name(),
            tuner.graph_search().name()
        );
        let (lay, r) = match dir {
            UnionDir::Data => (&s.x_lay, &self.dx_ref),
            UnionDir::Filter => (&s.w_lay, &self.dw_ref),
            UnionDir::Fused => (&s.y_lay, &self.y_ref),
        };
        let old: Option<Vec<T>> = (beta != 0.0).then(|| rng.values(lay.count()));
        let (c, out, before) = match dir {
            UnionDir::Data | UnionDir::Filter => {
                let before = lay.output_image(old.as_deref());
                let mut out = g.stream.clone_htod(&before).unwrap();
                let c = if dir == UnionDir::Data {
                    named(
                        &what,
                        tuner.backward_data(
                            &g.cudnn, alpha_s, &s.w_d, &s.w, &self.y_d, &self.dy, &s.conv, beta_s,
                            &s.x_d, &mut out,
                        ),
                    )
                } else {
                    named(
                        &what,
                        tuner.backward_filter(
                            &g.cudnn, alpha_s, &s.x_d, &s.x, &self.y_d, &self.dy, &s.conv, beta_s,
                            &s.w_d, &mut out,
                        ),
                    )
                };
                (c, out, before)
            }
            UnionDir::Fused => {
                let before = lay.output_image::<T>(None);
                let mut out = g.stream.clone_htod(&before).unwrap();
                let z = old.as_ref().map(|o| lay.upload(g, o));
                let c = named(
                    &what,
                    tuner.bias_activation_forward(
                        &g.cudnn,
                        alpha_s,
                        &s.x_d,
                        &s.x,
                        &s.w_d,
                        &s.w,
                        &s.conv,
                        beta_s,
                        z.as_ref().map(|z| z.as_view()),
                        &self.b_d,
                        &self.bias,
                        FusedActivation::Relu,
                        &self.y_d,
                        &mut out,
                    ),
                );
                (c, out, before)
            }
        };
        let what = format!("{what}: {} ({:?})", c.describe(), c.source);
        // Graph engines may transform the data; their choice does not carry their notes.
        let transform = c.api.is_graph() || c.algo.contains("FFT") || c.algo.contains("WINOGRAD");
        if dir == UnionDir::Fused {
            // relu(alpha·conv + beta·z + bias), the bias and z terms added to the magnitudes.
            let mut pre = Ref {
                val: r.val.iter().map(|v| alpha * v).collect(),
                abs: r.abs.iter().map(|a| alpha.abs() * a).collect(),
                red: r.red,
            };
            for i in 0..pre.val.len() {
                let b = self.bias_f[s.geo.channel_of(i)];
                let zt = old.as_ref().map_or(0.0, |o| beta * o[i].to_f64());
                pre.val[i] += b + zt;
                pre.abs[i] += b.abs() + zt.abs();
            }
            let got = download(&g.stream, &out);
            let (mut want, bound) = mode.tol.expect(&pre, 1.0, 0.0, None, transform);
            want.iter_mut().for_each(|v| *v = v.max(0.0));
            check(&what, &got, &before, lay, &want, &bound);
        } else {
            verify(
                g,
                &what,
                lay,
                &out,
                &before,
                r,
                mode.tol,
                (alpha, beta),
                transform,
            );
        }
        (c, download(&g.stream, &out))
    }
}

/// A choice with its algorithm by name, so that choices of every direction compare alike.
fn named<A: std::fmt::Display>(what: &str, c: Result<Choice<A>, Error>) -> Choice<String> {
    let c = c.unwrap_or_else(|e| panic!("{what}: {e}"));
    Choice {
        algo: c.algo.to_string(),
        source: c.source,
        rank: c.rank,
        workspace: c.workspace,
        api: c.api,
    }
}

/// Every call kind of one mode under the three search modes: two plain calls (the second from
/// the cache, the same API), checked; `Off` and the heuristic policy stay legacy; under
/// `Prefer`, half NHWC runs a graph engine.
fn union_dirs_case<T: DataType>(g: &Gpu, seed: u64, mode: &UnionMode, half: bool) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let p = UnionProblem::<T>::new(g, &mut rng, mode);
    let mut report = Vec::new();
    for dir in UnionDir::ALL {
        let mut line = Vec::new();
        for search in [GraphSearch::Union, GraphSearch::Prefer, GraphSearch::Off] {
            let mut tuner = fresh(Policy::Benchmark)
                .with_graph_search(search)
                .with_graph_plans(UNION_TEST_PLANS);
            let (first, _) = p.call(g, &mut rng, &mut tuner, mode, dir, 1.0, 0.0);
            let (second, _) = p.call(g, &mut rng, &mut tuner, mode, dir, 1.0, 0.0);
            let what = format!("{} {} {}", mode.name, dir.name(), search.name());
            assert_eq!(first.source, Source::Benchmark, "{what}");
            assert_eq!(second.source, Source::Cache, "{what}");
            assert_eq!(first.api, second.api, "{what}: the cached decision");
            assert_eq!(first.algo, second.algo, "{what}");
            let stats = tuner.stats();
            assert_eq!((stats.benchmarks, stats.hits), (1, 1), "{what}: {stats:?}");
            match search {
                GraphSearch::Off => {
                    assert_eq!(first.api, ConvApi::Legacy, "{what}");
                    assert_eq!(stats.graph_searches, 0, "{what}: {stats:?}");
                }
                _ => assert_eq!(stats.graph_searches, 1, "{what}: {stats:?}"),
            }
            if search == GraphSearch::Prefer && half {
                // cuDNN's graph engines run dgrad, wgrad and conv → bias → ReLU on half NHWC.
                assert!(first.api.is_graph(), "{what}: {}", first.describe());
            }
            line.push(format!("{} → {}", search.name(), first.describe()));
        }
        // The heuristic policy stays legacy whatever the search mode.
        let mut tuner = fresh(Policy::Heuristic).with_graph_search(GraphSearch::Prefer);
        let (c, _) = p.call(g, &mut rng, &mut tuner, mode, dir, 1.0, 0.0);
        assert_eq!(
            c.api,
            ConvApi::Legacy,
            "{} {} heuristic",
            mode.name,
            dir.name()
        );
        report.push(format!("{} {}: {}", mode.name, dir.name(), line.join(", ")));
    }
    report
}

#[test]
fn union_backward_and_fused_match_reference_in_every_mode() {
    let Some(g) = gpu() else { return };
    let lines = [
        union_dirs_case::<f16>(&g, 1101, &UNION_F16, true),
        union_dirs_case::<bf16>(&g, 1102, &UNION_BF16, true),
        union_dirs_case::<f32>(&g, 1103, &UNION_FP32, false),
        union_dirs_case::<f32>(&g, 1104, &UNION_TF32, false),
    ];
    for l in lines.iter().flatten() {
        println!("union autotune {l}");
    }
}

/// Scaled or accumulating backward calls run the decision's graph plan (under `Prefer`) into
/// scratch memory and add it to the old values; the fused forward with a residual or
/// `alpha ≠ 1` stays legacy. Every result is checked against the reference inside `call`.
#[test]
fn union_backward_and_fused_scaled_or_accumulating_calls() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1105);
    let mode = &UNION_BF16;
    let p = UnionProblem::<bf16>::new(&g, &mut rng, mode);
    let mut report = Vec::new();
    for dir in UnionDir::ALL {
        let mut tuner = fresh(Policy::Benchmark)
            .with_graph_search(GraphSearch::Prefer)
            .with_graph_plans(UNION_TEST_PLANS);
        let composes = !matches!(dir, UnionDir::Fused);
        let api_ok = |api: &ConvApi| api.is_graph() == composes;
        // The decision is made during an accumulating call (fused: with a residual z): the
        // search runs on scratch memory (fused: on y, which the call then writes), then the call
        // keeps the old values (checked inside).
        let (acc, _) = p.call(&g, &mut rng, &mut tuner, mode, dir, 1.0, 1.0);
        assert_eq!(acc.source, Source::Benchmark, "{}", dir.name());
        assert!(api_ok(&acc.api), "{}: {}", dir.name(), acc.describe());
        // The same decision serves a plain call with the graph engine it recorded.
        let (plain, _) = p.call(&g, &mut rng, &mut tuner, mode, dir, 1.0, 0.0);
        assert_eq!(plain.source, Source::Cache, "{}", dir.name());
        assert!(plain.api.is_graph(), "{}: {}", dir.name(), plain.describe());
        let (scaled, _) = p.call(&g, &mut rng, &mut tuner, mode, dir, 0.5, 0.0);
        assert!(api_ok(&scaled.api), "{}", scaled.describe());
        let (acc2, _) = p.call(&g, &mut rng, &mut tuner, mode, dir, 1.0, -0.5);
        assert!(api_ok(&acc2.api), "{}", acc2.describe());
        assert_eq!(tuner.stats().benchmarks, 1, "{}", dir.name());
        report.push(format!(
            "{}: accumulating {}, plain {}",
            dir.name(),
            acc.describe(),
            plain.describe()
        ));
    }
    println!("union with beta ≠ 0 or alpha ≠ 1: {}", report.join("; "));
}

/// The finals' knobs: with `finalists(0)` the first pass decides (the finals time nothing);
/// with `finalists(2)` they time at most the two best plans (under `GraphSearch::Prefer` the
/// legacy favourite is not a finalist); a short `final_solo_ms` still yields a decision that
/// runs and matches the reference (checked in `call`), as the default finals do.
#[test]
fn union_finals_follow_the_tuner_knobs() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1107);
    let mode = &UNION_F16;
    let p = UnionProblem::<f16>::new(&g, &mut rng, mode);
    let mut report = Vec::new();
    for (label, finalists, solo_ms, most) in [
        ("no finals", 0, DEFAULT_FINAL_SOLO_MS, 0),
        ("two finalists, 1 ms alone", 2, 1.0, 2),
        (
            "default",
            DEFAULT_FINALISTS,
            DEFAULT_FINAL_SOLO_MS,
            DEFAULT_FINALISTS,
        ),
    ] {
        let mut tuner = fresh(Policy::Benchmark)
            .with_graph_search(GraphSearch::Prefer)
            .with_graph_plans(UNION_TEST_PLANS)
            .with_finalists(finalists)
            .with_final_solo_ms(solo_ms);
        let (first, _) = p.call(&g, &mut rng, &mut tuner, mode, UnionDir::Data, 1.0, 0.0);
        let (second, _) = p.call(&g, &mut rng, &mut tuner, mode, UnionDir::Data, 1.0, 0.0);
        assert!(first.api.is_graph(), "{label}: {}", first.describe());
        assert_eq!(first.source, Source::Benchmark, "{label}");
        assert_eq!(second.source, Source::Cache, "{label}");
        assert_eq!(second.api, first.api, "{label}: the cached decision");
        let stats = tuner.stats();
        assert_eq!(stats.graph_searches, 1, "{label}: {stats:?}");
        assert!(
            stats.finalists as usize <= most,
            "{label}: the finals timed {} candidates, at most {most} allowed",
            stats.finalists
        );
        report.push(format!(
            "{label}: {} timed in the finals, {}",
            stats.finalists,
            first.describe()
        ));
    }
    println!("union finals knobs: {}", report.join("; "));
}

/// `SearchEffort::Quick` on two forward problems of one kind (f16 NHWC): each decision runs and
/// matches the f64 reference (checked in `union_call`), the first pass decides (no finals, no
/// knob refinement), at most `QUICK_GRAPH_PLANS` heuristic plans per search plus the earlier
/// winners carried into the second, no legacy benchmark runs (half precision: the heuristics
/// rank the legacy algorithms, the union search times their first), and the
/// decisions serve later calls from the cache. Then the same two problems under the default
/// preset, whose first calls search more plans.
#[test]
fn union_quick_effort_decides_on_few_plans_and_carries_winners() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1108);
    let mode = &UNION_F16;
    let second = Case {
        strides: vec![1, 1],
        ..Case::square(2, 16, 12, 24, 3, 1, 1, 1, mode.fmt)
    };
    let problems = [
        union_setup::<f16>(&g, &mut rng, mode),
        Setup::<f16>::new(&g, &mut rng, &second, mode.math, Gen::Uniform),
    ];
    let mut plans = Vec::new();
    for effort in [SearchEffort::Quick, SearchEffort::Thorough] {
        let mut tuner = fresh(Policy::Benchmark)
            .with_effort(effort)
            .with_graph_search(GraphSearch::Prefer);
        let mut report = Vec::new();
        for (i, s) in problems.iter().enumerate() {
            let (first, _) = union_call(&g, &mut rng, &mut tuner, s, mode, 1.0, 0.0);
            assert_eq!(
                first.source,
                Source::Benchmark,
                "{} problem {i}",
                effort.name()
            );
            assert!(
                first.api.is_graph(),
                "{}: {}",
                effort.name(),
                first.describe()
            );
            let (again, _) = union_call(&g, &mut rng, &mut tuner, s, mode, 1.0, 0.0);
            assert_eq!(again.source, Source::Cache, "{} problem {i}", effort.name());
            assert_eq!(again.api, first.api, "{} problem {i}", effort.name());
            report.push(first.describe());
        }
        let st = tuner.stats();
        assert_eq!((st.graph_searches, st.benchmarks), (2, 2), "{st:?}");
        // In half precision the quick preset ranks the legacy algorithms by the heuristics:
        // no legacy benchmark runs.
        let zero = std::time::Duration::ZERO;
        assert_eq!(st.find > zero, effort == SearchEffort::Thorough, "{st:?}");
        if effort == SearchEffort::Quick {
            assert_eq!(st.finalists, 0, "quick: the first pass decides: {st:?}");
            assert!(st.carried <= 1, "one earlier winner to carry: {st:?}");
            assert!(st.carried_wins <= st.carried, "{st:?}");
            assert!(
                st.graph_plans as usize <= 2 * QUICK_GRAPH_PLANS + 1,
                "quick builds at most {QUICK_GRAPH_PLANS} heuristic plans per search (the fallback \
                 list only when heuristics A propose none) and the carried winner: {st:?}"
            );
        }
        println!(
            "union {} effort: {} (plans {}, carried {} / won {}, find {:?}, finals {:?})",
            effort.name(),
            report.join(", "),
            st.graph_plans,
            st.carried,
            st.carried_wins,
            st.find,
            st.graph_finals
        );
        plans.push(st.graph_plans);
    }
    assert!(
        plans[0] <= plans[1],
        "quick searched more plans than thorough: {plans:?}"
    );
}

/// `SearchEffort::Quick` in strict f32: the legacy benchmark runs (once) and competes with the
/// graph plans; the decision matches the reference and serves the next call from the cache.
#[test]
fn union_quick_effort_benchmarks_legacy_algorithms_in_f32() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1109);
    let mode = &UNION_FP32;
    let s = union_setup::<f32>(&g, &mut rng, mode);
    let mut tuner = fresh(Policy::Benchmark).with_effort(SearchEffort::Quick);
    let (first, _) = union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
    let (again, _) = union_call(&g, &mut rng, &mut tuner, &s, mode, 1.0, 0.0);
    assert_eq!(
        (first.source, again.source),
        (Source::Benchmark, Source::Cache)
    );
    assert_eq!(again.api, first.api);
    let st = tuner.stats();
    assert_eq!(
        (st.benchmarks, st.graph_searches, st.finalists),
        (1, 1, 0),
        "{st:?}"
    );
    assert!(st.find > std::time::Duration::ZERO, "{st:?}");
    println!("union quick f32 strict: {}", first.describe());
}

#[test]
fn union_backward_and_fused_decisions_persist_and_are_rebuilt() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1106);
    let mode = &UNION_F16;
    let p = UnionProblem::<f16>::new(&g, &mut rng, mode);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let path = std::env::temp_dir().join(format!(
        "cudnn-safe-union-dirs-test-{}-{nanos}.txt",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);

    let mut a = fresh(Policy::Benchmark)
        .with_graph_search(GraphSearch::Prefer)
        .with_graph_plans(UNION_TEST_PLANS)
        .cache_file(&path);
    let first: Vec<_> = UnionDir::ALL
        .iter()
        .map(|&dir| p.call(&g, &mut rng, &mut a, mode, dir, 1.0, 0.0))
        .collect();
    let text = std::fs::read_to_string(&path).unwrap();
    for ((c, _), dir) in first.iter().zip(UnionDir::ALL) {
        let Some(config) = c.api.config() else {
            panic!("prefer {}: {}", dir.name(), c.describe());
        };
        assert!(
            text.contains(&format!("\tgraph={config}:")),
            "the cache file lacks the {} graph engine {config}:\n{text}",
            dir.name()
        );
    }
    drop(a);

    let mut b = fresh(Policy::Benchmark)
        .with_graph_search(GraphSearch::Prefer)
        .with_graph_plans(UNION_TEST_PLANS)
        .cache_file(&path);
    for ((ca, _), dir) in first.iter().zip(UnionDir::ALL) {
        // Checked against the reference inside; engines may be nondeterministic (benchmark
        // policy), so the bits are not compared with the first tuner's.
        let (cb, _) = p.call(&g, &mut rng, &mut b, mode, dir, 1.0, 0.0);
        assert_eq!(cb.source, Source::Cache, "{}", dir.name());
        assert_eq!(cb.api, ca.api, "{}: {}", dir.name(), cb.describe());
        assert_eq!(cb.algo, ca.algo, "{}", dir.name());
    }
    let stats = b.stats();
    assert_eq!(
        (
            stats.benchmarks,
            stats.misses,
            stats.graph_searches,
            stats.plan_builds
        ),
        (0, 0, 0, 3),
        "{stats:?}"
    );
    // Held plans: the next calls build nothing.
    for dir in UnionDir::ALL {
        let (c, _) = p.call(&g, &mut rng, &mut b, mode, dir, 1.0, 0.0);
        assert!(c.api.is_graph(), "{}", c.describe());
    }
    assert_eq!(b.stats().plan_builds, 3);
    drop(b);
    let _ = std::fs::remove_file(&path);
    println!(
        "union cache file: backward data {}, backward filter {}, fused {} written, rebuilt by a fresh tuner without benchmarking",
        first[0].0.describe(),
        first[1].0.describe(),
        first[2].0.describe()
    );
}
