//! GPU tests of the cuBLASLt matmul ([`BlasLt`]): every epilogue in f32, f16 and bf16 against
//! a host reference in f64, accumulation, the bias gradient of a linear layer, every heuristic
//! candidate, the autotune and its cache, and arguments rejected before launch.
//!
//! References are computed from the values as stored (inputs rounded to the element type first).
//! An error is measured against the magnitude of what was summed (`|alpha|·Σ|a·b| + |beta·c| +
//! |bias|`, at least 1): tolerances relative to it are f32 1e-5 (1e-3 with a GELU epilogue,
//! whose tanh cuBLASLt may approximate), TF32 5e-3, f16 1e-2, bf16 5e-2 — an error of layout or
//! transposition is of the order of the magnitude itself. Outputs the call must write (D with
//! `beta = 0`, bias gradients, aux outputs) are poisoned with NaN first.
//!
//! Without a GPU (no driver, no device, no cuBLASLt) every test prints `skipping: <why>` and
//! passes, unless `CUDNN_SAFE_REQUIRE_GPU=1`, when it fails instead.
mod common;

use std::sync::Arc;

use common::{assert_send, assert_untouched, other_context, skip_or_fail, to_f64, Rng};
use cudnn_safe::blas::lt::{
    BlasLt, Candidate, Choice, Element, Epilogue, EpilogueData, Fp8, Fp8Output, Fp8Scaling, Matmul,
    Policy, Source,
};
use cudnn_safe::cudarc::driver::CudaStream;
use cudnn_safe::float8::{F8E4M3, F8E5M2};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{cuda_context, DType, DataType, Error};

/// The device-0 default stream and a cuBLASLt handle on it (no cache file), or `None` (test
/// skipped) without a GPU.
fn gpu() -> Option<(Arc<CudaStream>, BlasLt)> {
    skip_or_fail(cuda_context(0).and_then(|ctx| {
        let stream = ctx.default_stream();
        BlasLt::new(stream.clone()).map(|lt| (stream, lt.without_cache_file()))
    }))
}

// ---------------------------------------------------------------------------------------------
// The host reference (independent of the crate under test)
// ---------------------------------------------------------------------------------------------

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;

/// tanh-approximated GELU.
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// Derivative of [`gelu`].
fn dgelu(x: f64) -> f64 {
    let t = (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
}

/// Host values of one call, as stored on the device.
struct Inputs {
    a: Vec<f64>,
    b: Vec<f64>,
    /// D before the call (read when beta ≠ 0).
    d0: Vec<f64>,
    /// The bias (input epilogues), empty otherwise.
    bias: Vec<f64>,
    /// The aux matrix (DGelu input), `m` rows of `aux_ld`, empty otherwise.
    aux: Vec<f64>,
}

/// What the call must produce, with the magnitude each value was summed from.
#[derive(Default)]
struct Expected {
    d: Vec<f64>,
    d_mag: Vec<f64>,
    /// Bias gradient (BiasGrad: length m; DGeluBiasGrad: length n).
    bias_grad: Vec<f64>,
    bias_grad_mag: Vec<f64>,
    /// GELU input stored by BiasGeluAux, dense m×n.
    aux: Vec<f64>,
    aux_mag: Vec<f64>,
}

/// `D = epilogue(alpha·op(A)·op(B) + beta·D0 + bias)` in f64, row-major.
fn reference(op: &Matmul, alpha: f64, beta: f64, x: &Inputs) -> Expected {
    let (m, n, k) = (op.m() as usize, op.n() as usize, op.k() as usize);
    let ld = op.aux_ld() as usize;
    let a_at = |i: usize, p: usize| {
        if op.is_transposed_a() {
            x.a[p * m + i]
        } else {
            x.a[i * k + p]
        }
    };
    let b_at = |p: usize, j: usize| {
        if op.is_transposed_b() {
            x.b[j * k + p]
        } else {
            x.b[p * n + j]
        }
    };
    let e = op.epilogue();
    let mut out = Expected {
        d: vec![0.0; m * n],
        d_mag: vec![0.0; m * n],
        ..Default::default()
    };
    if e == Epilogue::BiasGeluAux {
        out.aux = vec![0.0; m * n];
        out.aux_mag = vec![0.0; m * n];
    }
    for i in 0..m {
        for j in 0..n {
            let (mut acc, mut mag) = (0.0, 0.0);
            for p in 0..k {
                let v = a_at(i, p) * b_at(p, j);
                acc += v;
                mag += v.abs();
            }
            let mut v = alpha * acc;
            let mut vm = alpha.abs() * mag;
            if beta != 0.0 {
                v += beta * x.d0[i * n + j];
                vm += (beta * x.d0[i * n + j]).abs();
            }
            let with_bias = |v: f64, vm: f64| (v + x.bias[j], vm + x.bias[j].abs());
            let (y, ym) = match e {
                Epilogue::None | Epilogue::BiasGrad => (v, vm),
                Epilogue::Relu => (v.max(0.0), vm),
                Epilogue::Gelu => (gelu(v), vm),
                Epilogue::Bias => with_bias(v, vm),
                Epilogue::BiasRelu => {
                    let (s, sm) = with_bias(v, vm);
                    (s.max(0.0), sm)
                }
                Epilogue::BiasGelu => {
                    let (s, sm) = with_bias(v, vm);
                    (gelu(s), sm)
                }
                Epilogue::BiasGeluAux => {
                    let (s, sm) = with_bias(v, vm);
                    out.aux[i * n + j] = s;
                    out.aux_mag[i * n + j] = sm;
                    (gelu(s), sm)
                }
                Epilogue::DGelu | Epilogue::DGeluBiasGrad => {
                    let g = dgelu(x.aux[i * ld + j]);
                    (v * g, vm * g.abs().max(1.0))
                }
            };
            out.d[i * n + j] = y;
            out.d_mag[i * n + j] = ym;
        }
    }
    match e {
        Epilogue::BiasGrad => {
            out.bias_grad = (0..m).map(|i| (0..k).map(|p| a_at(i, p)).sum()).collect();
            out.bias_grad_mag = (0..m)
                .map(|i| (0..k).map(|p| a_at(i, p).abs()).sum())
                .collect();
        }
        Epilogue::DGeluBiasGrad => {
            out.bias_grad = (0..n)
                .map(|j| (0..m).map(|i| out.d[i * n + j]).sum())
                .collect();
            out.bias_grad_mag = (0..n)
                .map(|j| (0..m).map(|i| out.d_mag[i * n + j]).sum())
                .collect();
        }
        _ => {}
    }
    out
}

/// Tolerance relative to the magnitude, for results stored as `T`.
fn tol<T: DataType>(op: &Matmul) -> f64 {
    let gelu = matches!(
        op.epilogue(),
        Epilogue::Gelu
            | Epilogue::BiasGelu
            | Epilogue::BiasGeluAux
            | Epilogue::DGelu
            | Epilogue::DGeluBiasGrad
    );
    match T::DTYPE {
        DType::F32 if op.is_tf32() => 5e-3,
        DType::F32 if gelu => 1e-3,
        DType::F32 => 1e-5,
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        d => panic!("no tolerance for {d}"),
    }
}

fn check<T: DataType>(what: &str, got: &[T], want: &[f64], mag: &[f64], tol: f64) {
    assert!(
        got.len() >= want.len(),
        "{what}: {} < {}",
        got.len(),
        want.len()
    );
    let mut worst = (0.0f64, 0usize);
    for (i, (&w, &s)) in want.iter().zip(mag).enumerate() {
        let g = got[i].to_f64();
        assert!(g.is_finite(), "{what}: element {i} is {g} (expected {w})");
        let err = (g - w).abs() / s.max(1.0);
        if err > worst.0 {
            worst = (err, i);
        }
    }
    let (err, i) = worst;
    assert!(
        err <= tol,
        "{what}: element {i}: got {}, expected {}, error {err:.3e} of magnitude {:.3} > {tol:.1e}",
        got[i].to_f64(),
        want[i],
        mag[i]
    );
}

/// NaN of `T`.
fn nan<T: DataType>() -> T {
    T::from_f64(f64::NAN)
}

/// [`try_run_case`], failing on any error.
#[allow(clippy::too_many_arguments)]
fn run_case<T: Element>(
    stream: &Arc<CudaStream>,
    lt: &mut BlasLt,
    rng: &mut Rng,
    op: Matmul,
    alpha: f32,
    beta: f32,
    candidate: Option<&Candidate>,
    label: &str,
) -> Choice {
    try_run_case::<T>(stream, lt, rng, op, alpha, beta, candidate, label)
        .unwrap_or_else(|err| panic!("{label}: {op} {}: {err}", T::DTYPE))
}

/// Uploads random inputs for `op`, runs it (with `candidate` when given), downloads and checks
/// every output (panicking on a wrong value). D is NaN-poisoned when `beta = 0`. An error of the
/// call itself is returned.
#[allow(clippy::too_many_arguments)]
fn try_run_case<T: Element>(
    stream: &Arc<CudaStream>,
    lt: &mut BlasLt,
    rng: &mut Rng,
    op: Matmul,
    alpha: f32,
    beta: f32,
    candidate: Option<&Candidate>,
    label: &str,
) -> Result<Choice, Error> {
    let e = op.epilogue();
    let a_h: Vec<T> = rng.values(op.a_len());
    let b_h: Vec<T> = rng.values(op.b_len());
    let d_h: Vec<T> = if beta == 0.0 {
        vec![nan::<T>(); op.d_len()]
    } else {
        rng.values(op.d_len())
    };
    let bias_is_output = matches!(e, Epilogue::BiasGrad | Epilogue::DGeluBiasGrad);
    let bias_h: Vec<T> = if bias_is_output {
        vec![nan::<T>(); op.bias_len()]
    } else {
        rng.values(op.bias_len().max(1))
    };
    let aux_h: Vec<T> = match e {
        Epilogue::BiasGeluAux => vec![nan::<T>(); op.aux_len()],
        _ => rng.values(op.aux_len().max(1)),
    };
    let inputs = Inputs {
        a: to_f64(&a_h),
        b: to_f64(&b_h),
        d0: to_f64(&d_h),
        bias: if bias_is_output {
            Vec::new()
        } else {
            to_f64(&bias_h)
        },
        aux: to_f64(&aux_h),
    };
    let want = reference(&op, f64::from(alpha), f64::from(beta), &inputs);

    let a = stream.clone_htod(&a_h).unwrap();
    let b = stream.clone_htod(&b_h).unwrap();
    let mut d = stream.clone_htod(&d_h).unwrap();
    let mut bias = stream.clone_htod(&bias_h).unwrap();
    let mut aux = stream.clone_htod(&aux_h).unwrap();
    let epi = match e {
        Epilogue::None | Epilogue::Relu | Epilogue::Gelu => EpilogueData::None,
        Epilogue::Bias | Epilogue::BiasRelu | Epilogue::BiasGelu => EpilogueData::bias(&bias),
        Epilogue::BiasGrad => EpilogueData::bias_grad(&mut bias),
        Epilogue::BiasGeluAux => EpilogueData::bias_aux(&bias, &mut aux),
        Epilogue::DGelu => EpilogueData::aux(&aux),
        Epilogue::DGeluBiasGrad => EpilogueData::aux_bias_grad(&aux, &mut bias),
    };
    let what = format!("{label}: {op} {} alpha {alpha} beta {beta}", T::DTYPE);
    let choice = match candidate {
        Some(c) => lt.matmul_with_candidate(c, &op, alpha, &a, &b, beta, &mut d, epi),
        None => lt.matmul(&op, alpha, &a, &b, beta, &mut d, epi),
    }?;
    stream.synchronize().unwrap();
    let tol = tol::<T>(&op);
    let d_got = stream.clone_dtoh(&d).unwrap();
    check(&format!("{what}: d"), &d_got, &want.d, &want.d_mag, tol);
    if bias_is_output {
        let got = stream.clone_dtoh(&bias).unwrap();
        check(
            &format!("{what}: bias gradient"),
            &got,
            &want.bias_grad,
            &want.bias_grad_mag,
            tol,
        );
    }
    if e == Epilogue::BiasGeluAux {
        let got = stream.clone_dtoh(&aux).unwrap();
        let (ld, n) = (op.aux_ld() as usize, op.n() as usize);
        let dense: Vec<T> = (0..op.m() as usize)
            .flat_map(|i| got[i * ld..i * ld + n].to_vec())
            .collect();
        check(
            &format!("{what}: aux"),
            &dense,
            &want.aux,
            &want.aux_mag,
            tol,
        );
    }
    Ok(choice)
}

/// Shapes covering the four transpose combinations (dims multiples of 8, which every cuBLASLt
/// epilogue kernel supports for 16-bit types): linear (`A·Bᵀ`), plain (`A·B`), weight-gradient
/// (`Aᵀ·B`), and `Aᵀ·Bᵀ`.
fn shapes() -> Vec<Matmul> {
    vec![
        Matmul::linear(16, 40, 24).unwrap(),
        Matmul::new(24, 16, 32).unwrap(),
        Matmul::new(16, 32, 24).unwrap().with_transpose_a(true),
        Matmul::new(8, 16, 16)
            .unwrap()
            .with_transpose_a(true)
            .with_transpose_b(true),
    ]
}

/// The index in [`shapes`] of the layout an epilogue is used with in training, which must be
/// supported: forward epilogues on the linear layout, the bias gradient on the weight-gradient
/// layout (`dW = dyᵀ·x`), the GELU backward on the plain layout (`dx = dy·W`).
fn canonical_shape(e: Epilogue) -> usize {
    match e {
        Epilogue::BiasGrad => 2,
        Epilogue::DGelu | Epilogue::DGeluBiasGrad => 1,
        _ => 0,
    }
}

/// `alpha` for an epilogue: 1 where cuBLASLt's documentation leaves open whether the bias
/// gradient is scaled by alpha.
fn alpha_for(e: Epilogue) -> f32 {
    match e {
        Epilogue::BiasGrad | Epilogue::DGeluBiasGrad => 1.0,
        _ => 0.75,
    }
}

/// Runs epilogue `e` in every layout of [`shapes`]: values must be right wherever cuBLASLt runs
/// it; the canonical layout must run; elsewhere "no algorithm" is reported (cuBLASLt does not
/// document which layouts each epilogue supports) and any other error fails.
#[allow(clippy::too_many_arguments)]
fn every_layout<T: Element>(
    stream: &Arc<CudaStream>,
    lt: &mut BlasLt,
    rng: &mut Rng,
    e: Epilogue,
    alpha: f32,
    beta: f32,
    label: &str,
) {
    for (i, op) in shapes().into_iter().enumerate() {
        let op = op.with_epilogue(e);
        match try_run_case::<T>(stream, lt, rng, op, alpha, beta, None, label) {
            Ok(_) => {}
            Err(err @ Error::NoAlgorithm { .. }) if i != canonical_shape(e) => {
                eprintln!(
                    "note: {label}: {op} {}: not supported here: {err}",
                    T::DTYPE
                )
            }
            Err(err) => panic!("{label}: {op} {}: {err}", T::DTYPE),
        }
    }
}

fn every_epilogue<T: Element>(seed: u64) {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(seed);
    for e in Epilogue::ALL {
        every_layout::<T>(&stream, &mut lt, &mut rng, e, alpha_for(e), 0.0, "epilogue");
    }
}

// ---------------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------------

#[test]
fn every_epilogue_f32() {
    every_epilogue::<f32>(1);
}

#[test]
fn every_epilogue_f16() {
    every_epilogue::<f16>(2);
}

#[test]
fn every_epilogue_bf16() {
    every_epilogue::<bf16>(3);
}

#[test]
fn tf32_matches_within_tf32_tolerance() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(4);
    for e in [Epilogue::None, Epilogue::BiasGelu] {
        let op = Matmul::linear(32, 64, 48)
            .unwrap()
            .with_tf32(true)
            .with_epilogue(e);
        run_case::<f32>(&stream, &mut lt, &mut rng, op, 1.0, 0.0, None, "tf32");
    }
}

#[test]
fn odd_f32_shapes_and_all_transposes() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(5);
    for (m, n, k) in [(5, 7, 3), (1, 9, 13), (11, 1, 6), (3, 3, 1)] {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for e in [Epilogue::None, Epilogue::Bias] {
                let op = Matmul::new(m, n, k)
                    .unwrap()
                    .with_transpose_a(ta)
                    .with_transpose_b(tb)
                    .with_epilogue(e);
                // A plain f32 GEMM must run in any shape; a bias epilogue may be unsupported.
                match try_run_case::<f32>(&stream, &mut lt, &mut rng, op, 1.25, 0.0, None, "odd") {
                    Ok(_) => {}
                    Err(err @ Error::NoAlgorithm { .. }) if e != Epilogue::None => {
                        eprintln!("note: odd: {op}: not supported here: {err}")
                    }
                    Err(err) => panic!("odd: {op}: {err}"),
                }
            }
        }
    }
}

#[test]
fn beta_accumulates_into_d() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(6);
    for e in [
        Epilogue::None,
        Epilogue::Bias,
        Epilogue::BiasRelu,
        Epilogue::BiasGelu,
    ] {
        every_layout::<f32>(&stream, &mut lt, &mut rng, e, 0.5, 0.75, "beta");
        every_layout::<bf16>(&stream, &mut lt, &mut rng, e, 1.0, -1.0, "beta");
    }
}

#[test]
fn bias_gradient_of_a_linear_layer() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    // y[batch×out] = x[batch×in]·Wᵀ: dW[out×in] = dyᵀ·x and db = column sums of dy, in one call.
    let (batch, inp, out) = (48, 24, 16);
    let mut rng = Rng::new(7);
    let dy_h: Vec<f32> = rng.values(batch * out);
    let x_h: Vec<f32> = rng.values(batch * inp);
    let op = Matmul::new(out as i64, inp as i64, batch as i64)
        .unwrap()
        .with_transpose_a(true)
        .with_epilogue(Epilogue::BiasGrad);
    assert_eq!(op.bias_len(), out);
    let dy = stream.clone_htod(&dy_h).unwrap();
    let x = stream.clone_htod(&x_h).unwrap();
    let mut dw = stream.clone_htod(&vec![f32::NAN; out * inp]).unwrap();
    let mut db = stream.clone_htod(&vec![f32::NAN; out]).unwrap();
    lt.matmul(
        &op,
        1.0,
        &dy,
        &x,
        0.0,
        &mut dw,
        EpilogueData::bias_grad(&mut db),
    )
    .unwrap();
    let dw_got = stream.clone_dtoh(&dw).unwrap();
    let db_got = stream.clone_dtoh(&db).unwrap();
    for o in 0..out {
        let want: f64 = (0..batch).map(|r| f64::from(dy_h[r * out + o])).sum();
        let mag: f64 = (0..batch).map(|r| f64::from(dy_h[r * out + o]).abs()).sum();
        let got = f64::from(db_got[o]);
        assert!(
            (got - want).abs() <= 1e-5 * mag.max(1.0),
            "db[{o}] = {got}, expected {want}"
        );
        for i in 0..inp {
            let want: f64 = (0..batch)
                .map(|r| f64::from(dy_h[r * out + o]) * f64::from(x_h[r * inp + i]))
                .sum();
            let got = f64::from(dw_got[o * inp + i]);
            assert!(
                (got - want).abs() <= 1e-5 * (batch as f64) * 4.0,
                "dW[{o},{i}] = {got}, expected {want}"
            );
        }
    }
}

#[test]
fn large_bf16_linear_with_bias_gelu() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let (m, n, k) = (1024, 1024, 1024);
    let mut rng = Rng::new(8);
    let op = Matmul::linear(m as i64, k as i64, n as i64)
        .unwrap()
        .with_epilogue(Epilogue::BiasGelu);
    // Values in [-1, 1]/√k keep the GELU inputs O(1).
    let scale = 1.0 / (k as f64).sqrt();
    let gen = |rng: &mut Rng, len: usize| -> Vec<bf16> {
        (0..len)
            .map(|_| bf16::from_f64(rng.uniform(-1.0, 1.0) * scale.sqrt()))
            .collect()
    };
    let x_h = gen(&mut rng, m * k);
    let w_h = gen(&mut rng, n * k);
    let b_h: Vec<bf16> = rng.values(n);
    let x = stream.clone_htod(&x_h).unwrap();
    let w = stream.clone_htod(&w_h).unwrap();
    let b = stream.clone_htod(&b_h).unwrap();
    let mut y = stream.clone_htod(&vec![bf16::NAN; m * n]).unwrap();
    lt.matmul(&op, 1.0, &x, &w, 0.0, &mut y, EpilogueData::bias(&b))
        .unwrap();
    let y_h = stream.clone_dtoh(&y).unwrap();
    assert!(
        y_h.iter().all(|v| v.is_finite()),
        "unwritten or non-finite outputs"
    );
    for _ in 0..4000 {
        let i = (rng.next_u64() % m as u64) as usize;
        let j = (rng.next_u64() % n as u64) as usize;
        let (mut acc, mut mag) = (0.0, 0.0);
        for p in 0..k {
            let v = x_h[i * k + p].to_f64() * w_h[j * k + p].to_f64();
            acc += v;
            mag += v.abs();
        }
        let s = acc + b_h[j].to_f64();
        let want = gelu(s);
        let got = y_h[i * n + j].to_f64();
        // bf16 rounding of the output (2⁻⁸ relative) plus f32 accumulation and tanh error.
        let bound = 1e-2 * want.abs() + 2e-3 * (mag + b_h[j].to_f64().abs()).max(1.0);
        assert!(
            (got - want).abs() <= bound,
            "y[{i},{j}] = {got}, expected {want}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Algorithms: candidates, autotune, cache
// ---------------------------------------------------------------------------------------------

#[test]
fn every_heuristic_candidate_is_correct() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(9);
    let cases = [
        Matmul::linear(64, 96, 128)
            .unwrap()
            .with_epilogue(Epilogue::BiasGelu),
        Matmul::new(32, 64, 80)
            .unwrap()
            .with_epilogue(Epilogue::None),
        Matmul::new(48, 40, 64)
            .unwrap()
            .with_transpose_a(true)
            .with_epilogue(Epilogue::BiasGrad),
    ];
    for op in cases {
        let c32 = lt.candidates::<f32>(&op, 8).unwrap();
        let c16 = lt.candidates::<bf16>(&op, 8).unwrap();
        assert!(!c32.is_empty() && !c16.is_empty());
        for c in c32.iter().chain(&c16) {
            assert!(c.workspace <= lt.workspace_limit());
            assert_eq!(c.alignment(), 16);
            assert!(c.time_ms.is_none());
        }
        for w in c32.windows(2) {
            assert!(w[0].index < w[1].index);
        }
        let e = op.epilogue();
        for c in &c32 {
            let choice = run_case::<f32>(
                &stream,
                &mut lt,
                &mut rng,
                op,
                alpha_for(e),
                0.0,
                Some(c),
                "cand",
            );
            assert_eq!(choice.source, Source::Explicit);
            assert_eq!(&choice.candidate.algo_id, &c.algo_id);
        }
        for c in &c16 {
            run_case::<bf16>(
                &stream,
                &mut lt,
                &mut rng,
                op,
                alpha_for(e),
                0.0,
                Some(c),
                "cand",
            );
        }
        // A candidate is tied to its problem and element type.
        let other = Matmul::new(32, 64, 80)
            .unwrap()
            .with_epilogue(Epilogue::Relu);
        if other != op {
            let a = stream.alloc_zeros::<f32>(other.a_len()).unwrap();
            let b = stream.alloc_zeros::<f32>(other.b_len()).unwrap();
            let mut d = stream.clone_htod(&vec![7.0f32; other.d_len()]).unwrap();
            let r = lt.matmul_with_candidate(
                &c32[0],
                &other,
                1.0,
                &a,
                &b,
                0.0,
                &mut d,
                EpilogueData::None,
            );
            assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
            assert_untouched("d", &stream, &d, &vec![7.0f32; other.d_len()]);
        }
    }
}

#[test]
fn autotune_picks_a_candidate_caches_and_persists() {
    let Some((stream, lt)) = gpu() else {
        return;
    };
    drop(lt);
    let dir = std::env::temp_dir().join(format!("cudnn-safe-lt-test-{}", std::process::id()));
    let path = dir.join("lt-cache.txt");
    let _ = std::fs::remove_file(&path);
    let mut rng = Rng::new(10);
    let op = Matmul::linear(256, 128, 192)
        .unwrap()
        .with_epilogue(Epilogue::BiasGelu);

    let mut lt = BlasLt::new(stream.clone())
        .unwrap()
        .without_cache_file()
        .with_policy(Policy::Benchmark)
        .with_autotune_candidates(4)
        .cache_file(&path);
    assert_eq!(lt.autotune_candidates(), 4);
    let first = run_case::<bf16>(&stream, &mut lt, &mut rng, op, 1.0, 0.0, None, "tune 1");
    assert_eq!(first.source, Source::Benchmark);
    assert!(first.candidate.time_ms.is_some());
    assert!(first.candidate.index < 4);
    assert_eq!(lt.stats().benchmarks, 1);
    assert_eq!(lt.stats().misses, 1);

    let second = run_case::<bf16>(&stream, &mut lt, &mut rng, op, 1.0, 0.0, None, "tune 2");
    assert_eq!(second.source, Source::Cache);
    assert_eq!(second.candidate.algo_id, first.candidate.algo_id);
    assert_eq!(lt.stats().benchmarks, 1, "the second call re-tuned");
    assert_eq!(lt.stats().hits, 1);

    // beta ≠ 0 under autotune: the trials must not accumulate into D (checked by run_case).
    let acc = run_case::<f32>(&stream, &mut lt, &mut rng, op, 0.5, 1.0, None, "tune beta");
    assert_eq!(acc.source, Source::Benchmark);
    assert_eq!(lt.stats().benchmarks, 2);
    assert!(path.exists(), "cache file not written");
    drop(lt);

    let mut fresh = BlasLt::new(stream.clone())
        .unwrap()
        .without_cache_file()
        .with_policy(Policy::Benchmark)
        .with_autotune_candidates(4)
        .cache_file(&path);
    assert!(fresh.cached_decisions() >= 2);
    let third = run_case::<bf16>(&stream, &mut fresh, &mut rng, op, 1.0, 0.0, None, "tune 3");
    assert_eq!(third.source, Source::Cache);
    assert_eq!(
        fresh.stats().benchmarks,
        0,
        "the persisted decision was not reused"
    );
    assert_eq!(third.candidate.algo_id, first.candidate.algo_id);

    // The heuristic policy has its own key: deciding it does not touch the autotuned entry.
    fresh.set_policy(Policy::Heuristic);
    let h = run_case::<bf16>(&stream, &mut fresh, &mut rng, op, 1.0, 0.0, None, "heur");
    assert_eq!(h.source, Source::Heuristic);
    assert_eq!(h.candidate.index, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn workspace_limit_zero_still_runs_or_says_why() {
    let Some((stream, lt)) = gpu() else {
        return;
    };
    let mut lt = lt.with_workspace_limit(0);
    assert_eq!(lt.workspace_limit(), 0);
    let mut rng = Rng::new(11);
    for e in [Epilogue::None, Epilogue::BiasGelu] {
        let op = Matmul::linear(64, 128, 96).unwrap().with_epilogue(e);
        let cands = lt.candidates::<bf16>(&op, 8);
        match cands {
            Ok(c) => {
                assert!(c.iter().all(|c| c.workspace == 0));
                let choice =
                    run_case::<bf16>(&stream, &mut lt, &mut rng, op, 1.0, 0.0, None, "ws0");
                assert_eq!(choice.candidate.workspace, 0);
                assert_eq!(lt.workspace_bytes(), 0);
            }
            Err(err) => assert!(matches!(err, Error::NoAlgorithm { .. }), "{err}"),
        }
    }
}

#[test]
fn misaligned_views_get_suitable_algorithms_or_are_refused() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(12);
    let op = Matmul::linear(32, 64, 48)
        .unwrap()
        .with_epilogue(Epilogue::Bias);
    let a_h: Vec<bf16> = rng.values(op.a_len() + 1);
    let b_h: Vec<bf16> = rng.values(op.b_len());
    let bias_h: Vec<bf16> = rng.values(op.bias_len());
    let a = stream.clone_htod(&a_h).unwrap();
    let b = stream.clone_htod(&b_h).unwrap();
    let bias = stream.clone_htod(&bias_h).unwrap();
    // A starts one element (2 bytes) into its allocation.
    let a_view = a.slice(1..);
    let before = vec![bf16::NAN; op.d_len()];
    let mut d = stream.clone_htod(&before).unwrap();

    let cand = lt.candidates::<bf16>(&op, 1).unwrap();
    let r = lt.matmul_with_candidate(
        &cand[0],
        &op,
        1.0,
        &a_view,
        &b,
        0.0,
        &mut d,
        EpilogueData::bias(&bias),
    );
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                what: "pointer alignment",
                ..
            })
        ),
        "{r:?}"
    );
    assert_untouched("d", &stream, &d, &before);

    match lt.matmul(
        &op,
        1.0,
        &a_view,
        &b,
        0.0,
        &mut d,
        EpilogueData::bias(&bias),
    ) {
        Ok(choice) => {
            assert!(choice.candidate.alignment() <= 2);
            let inputs = Inputs {
                a: to_f64(&a_h[1..]),
                b: to_f64(&b_h),
                d0: Vec::new(),
                bias: to_f64(&bias_h),
                aux: Vec::new(),
            };
            let want = reference(&op, 1.0, 0.0, &inputs);
            let got = stream.clone_dtoh(&d).unwrap();
            check("misaligned a", &got, &want.d, &want.d_mag, tol::<bf16>(&op));
        }
        Err(e) => {
            assert!(matches!(e, Error::NoAlgorithm { .. }), "{e}");
            assert_untouched("d", &stream, &d, &before);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Rejected before launch
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_arguments_are_rejected_before_launch() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(13);
    let op = Matmul::linear(16, 24, 32)
        .unwrap()
        .with_epilogue(Epilogue::BiasGelu);
    let a = stream.clone_htod(&rng.values::<f32>(op.a_len())).unwrap();
    let b = stream.clone_htod(&rng.values::<f32>(op.b_len())).unwrap();
    let bias = stream
        .clone_htod(&rng.values::<f32>(op.bias_len()))
        .unwrap();
    let before = vec![7.0f32; op.d_len()];
    let mut d = stream.clone_htod(&before).unwrap();

    let short_a = stream.alloc_zeros::<f32>(op.a_len() - 1).unwrap();
    let r = lt.matmul(
        &op,
        1.0,
        &short_a,
        &b,
        0.0,
        &mut d,
        EpilogueData::bias(&bias),
    );
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "a", .. })),
        "{r:?}"
    );
    let short_b = stream.alloc_zeros::<f32>(op.b_len() - 1).unwrap();
    let r = lt.matmul(
        &op,
        1.0,
        &a,
        &short_b,
        0.0,
        &mut d,
        EpilogueData::bias(&bias),
    );
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "b", .. })),
        "{r:?}"
    );
    let short_bias = bias.slice(1..);
    let r = lt.matmul(
        &op,
        1.0,
        &a,
        &b,
        0.0,
        &mut d,
        EpilogueData::bias(&short_bias),
    );
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "bias", .. })),
        "{r:?}"
    );
    // Missing bias, and a bias the epilogue does not take.
    let r = lt.matmul(&op, 1.0, &a, &b, 0.0, &mut d, EpilogueData::None);
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                what: "epilogue data",
                ..
            })
        ),
        "{r:?}"
    );
    let plain = op.with_epilogue(Epilogue::None);
    let r = lt.matmul(&plain, 1.0, &a, &b, 0.0, &mut d, EpilogueData::bias(&bias));
    assert!(
        matches!(
            r,
            Err(Error::InvalidArgument {
                what: "epilogue data",
                ..
            })
        ),
        "{r:?}"
    );
    // An input bias where the epilogue writes a gradient.
    let grad = op.with_epilogue(Epilogue::BiasGrad);
    let r = lt.matmul(&grad, 1.0, &a, &b, 0.0, &mut d, EpilogueData::bias(&bias));
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    assert_untouched("d", &stream, &d, &before);

    // Short D: its own contents stay.
    let short_before = vec![7.0f32; op.d_len() - 1];
    let mut short_d = stream.clone_htod(&short_before).unwrap();
    let r = lt.matmul(
        &op,
        1.0,
        &a,
        &b,
        0.0,
        &mut short_d,
        EpilogueData::bias(&bias),
    );
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "d", .. })),
        "{r:?}"
    );
    assert_untouched("short d", &stream, &short_d, &short_before);

    // Short bias-gradient and aux outputs.
    let mut db = stream
        .clone_htod(&vec![7.0f32; grad.bias_len() - 1])
        .unwrap();
    let r = lt.matmul(
        &grad,
        1.0,
        &a,
        &b,
        0.0,
        &mut d,
        EpilogueData::bias_grad(&mut db),
    );
    assert!(
        matches!(
            r,
            Err(Error::BufferTooSmall {
                name: "bias_grad",
                ..
            })
        ),
        "{r:?}"
    );
    assert_untouched(
        "bias_grad",
        &stream,
        &db,
        &vec![7.0f32; grad.bias_len() - 1],
    );
    let fwd = op.with_epilogue(Epilogue::BiasGeluAux);
    let aux_before = vec![7.0f32; fwd.aux_len() - 1];
    let mut aux = stream.clone_htod(&aux_before).unwrap();
    let r = lt.matmul(
        &fwd,
        1.0,
        &a,
        &b,
        0.0,
        &mut d,
        EpilogueData::bias_aux(&bias, &mut aux),
    );
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "aux", .. })),
        "{r:?}"
    );
    assert_untouched("aux", &stream, &aux, &aux_before);

    // TF32 is for f32 only.
    let h = stream
        .alloc_zeros::<bf16>(op.a_len().max(op.b_len()))
        .unwrap();
    let hb = stream.alloc_zeros::<bf16>(op.bias_len()).unwrap();
    let mut hd = stream
        .clone_htod(&vec![bf16::from_f32(7.0); op.d_len()])
        .unwrap();
    let r = lt.matmul(
        &op.with_tf32(true),
        1.0,
        &h,
        &h,
        0.0,
        &mut hd,
        EpilogueData::bias(&hb),
    );
    assert!(matches!(r, Err(Error::UnsupportedDataType { .. })), "{r:?}");
    assert_untouched(
        "bf16 d",
        &stream,
        &hd,
        &vec![bf16::from_f32(7.0); op.d_len()],
    );
    assert_untouched("d", &stream, &d, &before);
    assert_eq!(lt.stats().misses, 0, "a rejected call made a decision");
}

#[test]
fn buffers_of_another_context_are_rejected() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let other = other_context(lt.context());
    let other_stream = other.default_stream();
    let mut rng = Rng::new(14);
    let op = Matmul::linear(8, 16, 24)
        .unwrap()
        .with_epilogue(Epilogue::Bias);
    let a = stream.clone_htod(&rng.values::<f32>(op.a_len())).unwrap();
    let b = stream.clone_htod(&rng.values::<f32>(op.b_len())).unwrap();
    let bias = stream
        .clone_htod(&rng.values::<f32>(op.bias_len()))
        .unwrap();
    let before = vec![7.0f32; op.d_len()];
    let mut d = stream.clone_htod(&before).unwrap();
    let fa = other_stream
        .clone_htod(&rng.values::<f32>(op.a_len()))
        .unwrap();
    let fb = other_stream
        .clone_htod(&rng.values::<f32>(op.b_len()))
        .unwrap();
    let fbias = other_stream
        .clone_htod(&rng.values::<f32>(op.bias_len()))
        .unwrap();
    let mut fd = other_stream.clone_htod(&before).unwrap();

    let r = lt.matmul(&op, 1.0, &fa, &b, 0.0, &mut d, EpilogueData::bias(&bias));
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "a", .. })),
        "{r:?}"
    );
    let r = lt.matmul(&op, 1.0, &a, &fb, 0.0, &mut d, EpilogueData::bias(&bias));
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "b", .. })),
        "{r:?}"
    );
    let r = lt.matmul(&op, 1.0, &a, &b, 0.0, &mut d, EpilogueData::bias(&fbias));
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "bias", .. })),
        "{r:?}"
    );
    assert_untouched("d", &stream, &d, &before);
    let r = lt.matmul(&op, 1.0, &a, &b, 0.0, &mut fd, EpilogueData::bias(&bias));
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "d", .. })),
        "{r:?}"
    );
    assert_untouched("foreign d", &other_stream, &fd, &before);
    let r = lt.set_stream(other_stream.clone());
    assert!(
        matches!(r, Err(Error::ForeignContext { name: "stream", .. })),
        "{r:?}"
    );
    assert!(Arc::ptr_eq(lt.stream(), &stream));
}

#[test]
fn handle_moves_to_another_thread() {
    assert_send::<BlasLt>();
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let op = Matmul::linear(8, 8, 8)
        .unwrap()
        .with_epilogue(Epilogue::Relu);
    let s = stream.clone();
    let worker = std::thread::spawn(move || {
        let mut rng = Rng::new(15);
        run_case::<f32>(&s, &mut lt, &mut rng, op, 1.0, 0.0, None, "thread");
        lt
    });
    let mut lt = worker.join().unwrap();
    let mut rng = Rng::new(16);
    run_case::<f32>(&stream, &mut lt, &mut rng, op, 1.0, 0.0, None, "back");
}

// ---------------------------------------------------------------------------------------------
// FP8 (`BlasLt::matmul_fp8`)
// ---------------------------------------------------------------------------------------------

/// The FP8 element types' conversions, for building inputs and references.
trait F8: Fp8 + Copy {
    fn from(x: f64) -> Self;
    fn to(self) -> f64;
}
impl F8 for F8E4M3 {
    fn from(x: f64) -> Self {
        F8E4M3::from_f64(x)
    }
    fn to(self) -> f64 {
        self.to_f64()
    }
}
impl F8 for F8E5M2 {
    fn from(x: f64) -> Self {
        F8E5M2::from_f64(x)
    }
    fn to(self) -> f64 {
        self.to_f64()
    }
}

/// Random FP8 values in ±4 (a spread of exponents, never all zero) and their f64 images.
fn fp8_values<F: F8>(rng: &mut Rng, n: usize) -> (Vec<F>, Vec<f64>) {
    let v: Vec<F> = (0..n).map(|_| F::from(rng.uniform(-4.0, 4.0))).collect();
    let h: Vec<f64> = v.iter().map(|x| x.to()).collect();
    assert!(h.iter().any(|&x| x != 0.0));
    (v, h)
}

/// One FP8 matmul against the f64 reference of the dequantized inputs (`sa·A`, `sb·B`), D
/// poisoned with NaN when `beta = 0`.
#[allow(clippy::too_many_arguments)]
fn fp8_case<A: F8, B: F8, O: Fp8Output>(
    stream: &Arc<CudaStream>,
    lt: &mut BlasLt,
    rng: &mut Rng,
    op: Matmul,
    (alpha, beta): (f32, f32),
    scales: Option<(f32, f32)>,
    fast_accum: bool,
) {
    let (a_h, a64) = fp8_values::<A>(rng, op.a_len());
    let (b_h, b64) = fp8_values::<B>(rng, op.b_len());
    let (sa, sb) = scales.unwrap_or((1.0, 1.0));
    let d_h: Vec<O> = if beta == 0.0 {
        vec![nan::<O>(); op.d_len()]
    } else {
        rng.values(op.d_len())
    };
    let bias_h: Vec<O::Bias> = rng.values(op.bias_len().max(1));
    let inputs = Inputs {
        a: a64.iter().map(|x| x * f64::from(sa)).collect(),
        b: b64.iter().map(|x| x * f64::from(sb)).collect(),
        d0: to_f64(&d_h),
        bias: to_f64(&bias_h),
        aux: Vec::new(),
    };
    let want = reference(&op, f64::from(alpha), f64::from(beta), &inputs);
    let a = stream.clone_htod(&a_h).unwrap();
    let b = stream.clone_htod(&b_h).unwrap();
    let mut d = stream.clone_htod(&d_h).unwrap();
    let bias = stream.clone_htod(&bias_h).unwrap();
    let (sa_d, sb_d) = (
        stream.clone_htod(&[sa]).unwrap(),
        stream.clone_htod(&[sb]).unwrap(),
    );
    let mut scaling = Fp8Scaling::new().with_fast_accum(fast_accum);
    if scales.is_some() {
        scaling = scaling.with_a_scale(&sa_d).with_b_scale(&sb_d);
    }
    let epi = if op.epilogue().uses_bias() {
        EpilogueData::bias(&bias)
    } else {
        EpilogueData::None
    };
    let what = format!(
        "fp8 {op} {}×{}→{} alpha {alpha} beta {beta} scales {scales:?} fast {fast_accum}",
        std::any::type_name::<A>(),
        std::any::type_name::<B>(),
        O::DTYPE
    );
    lt.matmul_fp8(&op, alpha, &a, &b, beta, &mut d, epi, scaling)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    stream.synchronize().unwrap();
    // Products of FP8 values are exact; Hopper's FP8 tensor cores add them with fewer
    // mantissa bits than f32 (about 1e-4 of the magnitude was seen on the H200, fast
    // accumulation or not), then the sums are rounded to the output type.
    let tol = match O::DTYPE {
        DType::F32 => 1e-3,
        _ => tol::<O>(&op),
    };
    check(
        &what,
        &stream.clone_dtoh(&d).unwrap(),
        &want.d,
        &want.d_mag,
        tol,
    );
}

#[test]
fn fp8_matmul_matches_the_dequantized_reference() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let mut rng = Rng::new(0xF8);
    let plain = (1.0, 0.0);
    for (m, k, n) in [(64, 128, 96), (37, 64, 40), (256, 512, 192)] {
        let op = Matmul::linear(m, k, n).unwrap();
        fp8_case::<F8E4M3, F8E4M3, bf16>(&stream, &mut lt, &mut rng, op, plain, None, false);
        fp8_case::<F8E4M3, F8E4M3, f16>(&stream, &mut lt, &mut rng, op, plain, None, false);
        fp8_case::<F8E4M3, F8E4M3, f32>(&stream, &mut lt, &mut rng, op, plain, None, false);
        let scales = Some((0.37, 2.5));
        fp8_case::<F8E4M3, F8E4M3, bf16>(&stream, &mut lt, &mut rng, op, plain, scales, false);
        fp8_case::<F8E4M3, F8E4M3, f32>(&stream, &mut lt, &mut rng, op, plain, scales, true);
        fp8_case::<F8E5M2, F8E4M3, bf16>(&stream, &mut lt, &mut rng, op, plain, scales, false);
        fp8_case::<F8E4M3, F8E5M2, f16>(&stream, &mut lt, &mut rng, op, plain, scales, false);
        // alpha and accumulation into D.
        fp8_case::<F8E4M3, F8E4M3, f32>(&stream, &mut lt, &mut rng, op, (0.5, 1.5), scales, false);
        for e in [
            Epilogue::Relu,
            Epilogue::Gelu,
            Epilogue::Bias,
            Epilogue::BiasRelu,
            Epilogue::BiasGelu,
        ] {
            let op = op.with_epilogue(e);
            fp8_case::<F8E4M3, F8E4M3, bf16>(&stream, &mut lt, &mut rng, op, plain, scales, false);
            fp8_case::<F8E4M3, F8E4M3, f32>(&stream, &mut lt, &mut rng, op, plain, scales, false);
        }
    }
    // The autotune times the candidates on the call's buffers and keeps the right result.
    let mut tuned = BlasLt::new(stream.clone())
        .unwrap()
        .without_cache_file()
        .with_policy(Policy::Benchmark);
    let op = Matmul::linear(128, 256, 128).unwrap();
    fp8_case::<F8E4M3, F8E4M3, bf16>(
        &stream,
        &mut tuned,
        &mut rng,
        op,
        (1.0, 0.0),
        Some((0.5, 0.25)),
        false,
    );
}

#[test]
fn fp8_matmul_rejections_leave_d_untouched() {
    let Some((stream, mut lt)) = gpu() else {
        return;
    };
    let op = Matmul::linear(32, 64, 48).unwrap();
    let a = stream.alloc_zeros::<F8E4M3>(op.a_len()).unwrap();
    let b = stream.alloc_zeros::<F8E4M3>(op.b_len()).unwrap();
    let b52 = stream.alloc_zeros::<F8E5M2>(op.b_len()).unwrap();
    let a52 = stream.alloc_zeros::<F8E5M2>(op.a_len()).unwrap();
    let before = vec![bf16::from_f64(7.0); op.d_len()];
    let mut d = stream.clone_htod(&before).unwrap();
    let none = || EpilogueData::None;
    let scaling = Fp8Scaling::new;
    let r = lt.matmul_fp8(&op, 1.0, &a52, &b52, 0.0, &mut d, none(), scaling());
    assert!(matches!(r, Err(Error::UnsupportedDataType { .. })), "{r:?}");
    let plain = Matmul::new(32, 48, 64).unwrap();
    let r = lt.matmul_fp8(&plain, 1.0, &a, &b, 0.0, &mut d, none(), scaling());
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let odd_k = Matmul::linear(32, 40, 48).unwrap();
    let r = lt.matmul_fp8(&odd_k, 1.0, &a, &b, 0.0, &mut d, none(), scaling());
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let short_a = a.slice(1..);
    let r = lt.matmul_fp8(&op, 1.0, &short_a, &b52, 0.0, &mut d, none(), scaling());
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "a", .. })),
        "{r:?}"
    );
    let empty_scale = stream.alloc_zeros::<f32>(1).unwrap();
    let empty = empty_scale.slice(1..);
    let r = lt.matmul_fp8(
        &op,
        1.0,
        &a,
        &b,
        0.0,
        &mut d,
        none(),
        scaling().with_b_scale(&empty),
    );
    assert!(
        matches!(
            r,
            Err(Error::BufferTooSmall {
                name: "b_scale",
                ..
            })
        ),
        "{r:?}"
    );
    let with_bias = op.with_epilogue(Epilogue::BiasGelu);
    let r = lt.matmul_fp8(&with_bias, 1.0, &a, &b, 0.0, &mut d, none(), scaling());
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let dgelu = op.with_epilogue(Epilogue::DGelu);
    let r = lt.matmul_fp8(&dgelu, 1.0, &a, &b, 0.0, &mut d, none(), scaling());
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    let mut short_d = stream.clone_htod(&before[1..]).unwrap();
    let r = lt.matmul_fp8(&op, 1.0, &a, &b52, 0.0, &mut short_d, none(), scaling());
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "d", .. })),
        "{r:?}"
    );
    assert_untouched("d", &stream, &d, &before);
    assert_untouched("short d", &stream, &short_d, &before[1..]);
}
