//! Hostile but honest use from safe code: every public host-side function that takes numbers,
//! strings or files from its caller returns a value or a typed error for any input — huge,
//! negative, zero, `i64::MAX`, empty or long slices, arbitrary text and bytes — and never
//! panics (a panic, arithmetic overflow included, fails the property with its shrunk input).
//! Where a result has an invariant (offsets inside the span, a record that reads back), it is
//! checked too.
//!
//! Properties that need cuDNN's host library skip with one line when it cannot be loaded,
//! unless `CUDNN_SAFE_REQUIRE_LIBRARY=1`, when they fail. Nothing here needs a GPU.
mod common;

use std::collections::HashSet;
use std::fmt::Debug;
use std::path::PathBuf;

use common::library;
use cudnn_safe::activation::{ActivationDesc, ActivationMode, NanPropagation};
use cudnn_safe::blas::lt::{Epilogue, Matmul};
use cudnn_safe::conv::{ConvDesc, ConvMode, MathType};
use cudnn_safe::graph::{
    alibi_slopes, BatchNormRunning, ConvParams, EngineConfig, Graph, GroupNormMethod, KnobRange,
    PlanCache, PointwiseMode, SdpaOptions, TensorId,
};
use cudnn_safe::norm::{BatchNormMode, NormMethod, RmsNorm};
use cudnn_safe::pooling::{PoolingDesc, PoolingMode};
use cudnn_safe::rnn::{
    BiasMode, CellMode, DirectionMode, InputMode, Rnn, RnnAlgo, SeqDataDesc, SeqLayout,
};
use cudnn_safe::tune::Policy;
use cudnn_safe::{
    Autotuner, BatchNorm, DType, Dropout, Error, FilterDesc, GroupNorm, LayerNorm, Layout,
    ReduceOp, TensorBuilder, TensorDesc, TensorFormat,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Runs `test` on `cases` values of `strategy` (or `PROPTEST_CASES`). proptest catches a panic
/// inside `test` and reports it, with the shrunk input, as a failure of the property.
fn check<S: Strategy>(cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: Debug,
{
    // `PROPTEST_CASES` overrides the count, for longer runs by hand.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(cases);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

const EDGE_I64: &[i64] = &[
    i64::MIN,
    i64::MIN + 1,
    -(1 << 31) - 1,
    -(1 << 31),
    -65536,
    -1,
    0,
    1,
    2,
    65535,
    65536,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    1 << 62,
    i64::MAX - 1,
    i64::MAX,
];

const EDGE_USIZE: &[usize] = &[
    0,
    1,
    2,
    65535,
    65536,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    1 << 62,
    usize::MAX - 1,
    usize::MAX,
];

const EDGE_F64: &[f64] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    1e-300,
    f64::MIN_POSITIVE,
    f64::EPSILON,
    1e300,
    f64::MAX,
    f64::MIN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
];

/// Mostly small values (so that deeper checks are reached), with the edges and any `i64`.
fn int() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => -3i64..40,
        2 => prop::sample::select(EDGE_I64),
        1 => any::<i64>(),
    ]
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..40,
        2 => prop::sample::select(EDGE_USIZE),
        1 => any::<usize>(),
    ]
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => -4.0f64..4.0,
        2 => prop::sample::select(EDGE_F64),
        1 => any::<f64>(),
    ]
}

/// Empty, short and over-long lists.
fn ints(max: usize) -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(int(), 0..=max)
}

/// Lists mostly of plausible dimensions (1..6), sometimes of anything.
fn dims(max: usize) -> impl Strategy<Value = Vec<i64>> {
    prop_oneof![
        3 => prop::collection::vec(1i64..6, 0..=max),
        1 => ints(max),
    ]
}

fn format() -> impl Strategy<Value = TensorFormat> {
    prop_oneof![
        Just(TensorFormat::Nchw),
        Just(TensorFormat::Nhwc),
        Just(TensorFormat::Strided),
        prop::sample::select(vec![4u8, 32]).prop_map(|width| TensorFormat::NchwVectC { width }),
        any::<u8>().prop_map(|width| TensorFormat::NchwVectC { width }),
    ]
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
    ])
}

/// Every layout constructor on arbitrary values; the layouts they accept, probed at arbitrary
/// indices.
#[test]
fn layouts_and_their_indices_never_panic() {
    let input = (dims(10), ints(10), ints(10), format(), any::<u8>());
    check(512, input, |(d, s, idx, fmt, width)| {
        let at = |i: usize| d.get(i).copied().unwrap_or(1);
        let mut layouts: Vec<Layout> = [
            Layout::strided(&d, &s),
            Layout::nchw_nd(&d),
            Layout::nhwc_nd(&d),
            Layout::nchw(at(0), at(1), at(2), at(3)),
            Layout::nhwc(at(0), at(1), at(2), at(3)),
            Layout::ncdhw(at(0), at(1), at(2), at(3), at(4)),
            Layout::ndhwc(at(0), at(1), at(2), at(3), at(4)),
            Layout::nchw_vect_c(at(0), at(1).saturating_mul(4), at(2), at(3), 4),
            Layout::nchw_vect_c(at(0), at(1), at(2), at(3), width),
            TensorBuilder::default()
                .dims(&d)
                .strides(&s)
                .format(fmt)
                .layout(),
            TensorBuilder::default().dims(&d).format(fmt).layout(),
        ]
        .into_iter()
        .filter_map(Result::ok)
        .collect();
        layouts.dedup();
        for l in &layouts {
            let span = l.span() as i64;
            prop_assert!(span >= 1 && span <= i64::from(i32::MAX), "{l}");
            let _ = (l.to_string(), l.check_output("y"), l.is_packed());
            // An index of the wrong length or outside the dimensions has no offset.
            let inside = idx.len() == l.rank()
                && idx.iter().zip(l.dims()).all(|(&i, &d)| (0..d).contains(&i));
            match l.offset_of(&idx) {
                Some(o) => prop_assert!(inside && (0..span).contains(&o), "{l} {idx:?} → {o}"),
                None => prop_assert!(!inside, "{l} {idx:?}"),
            }
            prop_assert_eq!(l.offset_of(&vec![0; l.rank()]), Some(0));
            let last: Vec<i64> = l.dims().iter().map(|&d| d - 1).collect();
            prop_assert!(l.offset_of(&last).is_some_and(|o| o < span));
            if l.element_count() <= 4096 {
                let offs = l.offsets();
                prop_assert_eq!(offs.len(), l.element_count());
                prop_assert!(offs.iter().all(|&o| (0..span).contains(&o)));
                if l.is_non_overlapping() {
                    prop_assert_eq!(offs.iter().collect::<HashSet<_>>().len(), offs.len());
                }
            }
        }
        Ok(())
    });
}

/// Tensor and filter descriptors, and the dropout reserve query on them.
#[test]
fn descriptors_never_panic() {
    if !library() {
        return;
    }
    let input = (dims(10), ints(10), format());
    check(256, input, |(d, s, fmt)| {
        let _ = TensorDesc::<f32>::strided(&d, &s);
        let _ = TensorDesc::<f64>::nchw_nd(&d);
        let _ = TensorDesc::<cudnn_safe::half::f16>::nhwc_nd(&d);
        let _ = TensorBuilder::default().dims(&d).format(fmt).build::<i8>();
        let _ = TensorBuilder::default().dims(&d).format(fmt).build::<u8>();
        let _ = FilterDesc::<f32>::new(&d, fmt);
        let _ = FilterDesc::<i8>::new(&d, fmt);
        if let Ok(t) = TensorDesc::<f32>::strided(&d, &s) {
            let _ = (t.size_in_bytes(), Dropout::reserve_size(&t));
        }
        Ok(())
    });
}

fn conv_mode() -> impl Strategy<Value = ConvMode> {
    prop_oneof![
        Just(ConvMode::CrossCorrelation),
        Just(ConvMode::Convolution)
    ]
}

fn math() -> impl Strategy<Value = MathType> {
    prop::sample::select(vec![
        MathType::Default,
        MathType::TensorOp,
        MathType::TensorOpAllowConversion,
        MathType::Fma,
    ])
}

/// Per-spatial-dimension parameters: the right number of small values, or anything.
fn per_dim(n: usize, lo: i64) -> impl Strategy<Value = Vec<i64>> {
    prop_oneof![
        3 => prop::collection::vec(lo..4, n),
        1 => ints(5),
    ]
}

/// The convolution descriptor and both output-shape helpers, on arbitrary parameters and
/// arbitrary tensor and filter dimensions.
#[test]
fn convolution_shapes_never_panic() {
    if !library() {
        return;
    }
    let params = prop_oneof![3 => 1usize..=3, 1 => size()].prop_flat_map(|n| {
        let k = n.min(4);
        (
            Just(n),
            per_dim(k, 0),
            per_dim(k, 1),
            per_dim(k, 1),
            prop_oneof![3 => 1i64..4, 1 => int()],
            conv_mode(),
            math(),
        )
    });
    let shapes = (dims(6), dims(6), ints(4));
    check(
        384,
        (params, shapes),
        |((n, p, s, dl, g, mode, m), (x, w, op))| {
            let Ok(conv) = ConvDesc::builder(n)
                .pads(&p)
                .strides(&s)
                .dilations(&dl)
                .groups(g)
                .mode(mode)
                .math(m)
                .build::<f32>()
            else {
                return Ok(());
            };
            // Tensors of the convolution's rank more often than not.
            let rank = conv.tensor_rank();
            let fit = |v: &[i64]| -> Vec<i64> {
                let mut v = v.to_vec();
                v.resize(rank, 1);
                v
            };
            for (x, w) in [(x.clone(), w.clone()), (fit(&x), fit(&w))] {
                if let Ok(out) = conv.output_dims(&x, &w) {
                    prop_assert_eq!(out.len(), x.len()); // 3-D in for 1-D gives 3-D
                    prop_assert!(out.iter().all(|&d| d >= 1), "{out:?}");
                }
                if let Ok(out) = conv.transpose_output_dims(&x, &w, &op) {
                    prop_assert_eq!(out.len(), x.len());
                    prop_assert!(out.iter().all(|&d| d >= 1), "{out:?}");
                }
            }
            Ok(())
        },
    );
}

fn pooling_mode() -> impl Strategy<Value = PoolingMode> {
    prop::sample::select(vec![
        PoolingMode::Max,
        PoolingMode::MaxDeterministic,
        PoolingMode::AvgIncludePadding,
        PoolingMode::AvgExcludePadding,
    ])
}

#[test]
fn pooling_shapes_never_panic() {
    if !library() {
        return;
    }
    let desc = prop_oneof![3 => 2usize..=3, 1 => 0usize..6].prop_flat_map(|n| {
        (
            pooling_mode(),
            per_dim(n, 1),
            per_dim(n, 0),
            per_dim(n, 1),
            any::<bool>(),
        )
    });
    check(
        384,
        (desc, dims(7)),
        |((mode, win, pads, strides, nan), x)| {
            let nan = if nan {
                NanPropagation::Propagate
            } else {
                NanPropagation::NotPropagate
            };
            let Ok(pool) = PoolingDesc::builder(mode, &win)
                .pads(&pads)
                .strides(&strides)
                .nan(nan)
                .build()
            else {
                return Ok(());
            };
            let mut fitted = x.clone();
            fitted.resize(pool.tensor_rank(), 1);
            for x in [x, fitted] {
                if let Ok(out) = pool.output_dims(&x) {
                    prop_assert_eq!(out.len(), pool.tensor_rank());
                    prop_assert!(out.iter().all(|&d| d >= 1), "{out:?}");
                }
            }
            Ok(())
        },
    );
}

fn activation_mode() -> impl Strategy<Value = ActivationMode> {
    prop_oneof![
        Just(ActivationMode::Sigmoid),
        Just(ActivationMode::Relu),
        Just(ActivationMode::Tanh),
        Just(ActivationMode::Identity),
        float().prop_map(|ceiling| ActivationMode::ClippedRelu { ceiling }),
        float().prop_map(|alpha| ActivationMode::Elu { alpha }),
        float().prop_map(|beta| ActivationMode::Swish { beta }),
    ]
}

fn bn_mode() -> impl Strategy<Value = BatchNormMode> {
    prop::sample::select(vec![
        BatchNormMode::PerActivation,
        BatchNormMode::Spatial,
        BatchNormMode::SpatialPersistent,
    ])
}

/// Activation descriptors and the normalization objects (layer, group, instance, RMS, batch).
#[test]
fn activation_and_normalization_objects_never_panic() {
    if !library() {
        return;
    }
    let input = (
        activation_mode(),
        dims(7),
        ints(7),
        size(),
        int(),
        float(),
        bn_mode(),
    );
    check(256, input, |(act, d, s, normalized, groups, eps, mode)| {
        let _ = ActivationDesc::new(act);
        let _ = ActivationDesc::builder(act)
            .nan(NanPropagation::NotPropagate)
            .build();
        // Every layout the inputs make, packed or not: refused or built, never a panic.
        for x in [Layout::strided(&d, &s), Layout::nchw_nd(&d)]
            .iter()
            .flatten()
        {
            if let Ok(ln) = LayerNorm::<f32>::new(x, normalized, eps) {
                prop_assert_eq!(ln.rows() * ln.features(), ln.len());
                let _ = ln.with_method(NormMethod::reductions());
            }
            let _ = LayerNorm::<cudnn_safe::half::bf16>::new(x, normalized, eps);
            if let Ok(gn) = GroupNorm::<f32>::new(x, groups, eps) {
                let _ = gn.with_method(NormMethod::default_for_layer());
            }
            let _ = GroupNorm::<cudnn_safe::half::f16>::instance(x, eps);
            if let Ok(r) = RmsNorm::<f32>::new(x, normalized, eps) {
                prop_assert_eq!(r.rows() * r.features(), r.len());
            }
        }
        for layout in [Layout::strided(&d, &s), Layout::nchw_nd(&d)]
            .into_iter()
            .flatten()
        {
            let _ = BatchNorm::builder()
                .mode(mode)
                .epsilon(eps)
                .build::<f32>(&layout);
            let _ = BatchNorm::builder().build::<cudnn_safe::half::f16>(&layout);
        }
        Ok(())
    });
}

fn seq_layout() -> impl Strategy<Value = SeqLayout> {
    prop::sample::select(vec![
        SeqLayout::SeqMajor,
        SeqLayout::BatchMajor,
        SeqLayout::Packed,
    ])
}

/// Sequence descriptors on arbitrary sizes and lengths, and their getters at arbitrary
/// positions; in every descriptor small enough to walk, the stored positions are exactly
/// `0..span`, each once.
#[test]
fn sequence_descriptors_never_panic() {
    if !library() {
        return;
    }
    let lengths = prop_oneof![
        3 => prop::collection::vec(1i64..6, 0..6).prop_map(|mut v| {
            v.sort_unstable_by(|a, b| b.cmp(a));
            v
        }),
        1 => prop::collection::vec(int(), 0..6),
    ];
    let input = (
        seq_layout(),
        prop_oneof![3 => 1i64..6, 1 => int()],
        prop_oneof![3 => 1i64..4, 1 => int()],
        lengths,
        (int(), int(), int()),
    );
    check(
        384,
        input,
        |(layout, max_len, vector, lengths, (t, b, v))| {
            // Packed lengths must start at the maximum: give the strategy's lengths a chance.
            let max_len = match (layout, lengths.first()) {
                (SeqLayout::Packed, Some(&l)) if max_len < 6 => l,
                _ => max_len,
            };
            let _ = SeqDataDesc::<f32>::uniform(layout, max_len, lengths.len() as i64, vector);
            // A valid request for millions of sequences allocates their lengths, as asked: only
            // those refused before allocating (or small ones) run here.
            let stored = max_len.checked_mul(b).and_then(|s| s.checked_mul(vector));
            if b <= 1 << 16 || stored.is_none_or(|s| s > i32::MAX as i64) {
                let _ = SeqDataDesc::<f32>::uniform(layout, max_len, b, vector);
            }
            let Ok(d) = SeqDataDesc::<f32>::new(layout, max_len, vector, &lengths, f32::NAN) else {
                return Ok(());
            };
            let _ = (d.length(b), d.is_padding(t, b), d.offset(t, b, v));
            prop_assert_eq!(d.length(d.batch()), None);
            prop_assert_eq!(d.is_padding(0, d.batch()), None);
            if d.span() <= 4096 && d.max_len() * d.batch() * d.vector_size() <= 1 << 16 {
                let mut seen = vec![false; d.span()];
                for b in 0..d.batch() {
                    for t in 0..d.max_len() {
                        for v in 0..d.vector_size() {
                            let stored = d.offset(t, b, v);
                            prop_assert_eq!(
                                stored.is_none(),
                                layout == SeqLayout::Packed && d.is_padding(t, b) == Some(true)
                            );
                            if let Some(o) = stored {
                                prop_assert!(
                                    o < d.span() && !seen[o],
                                    "{d:?} ({t}, {b}, {v}) → {o}"
                                );
                                seen[o] = true;
                            }
                        }
                    }
                }
                prop_assert!(
                    seen.iter().all(|&s| s),
                    "{d:?}: a stored position nobody owns"
                );
            }
            Ok(())
        },
    );
}

/// A packed batch whose maximum length is far past what cuDNN takes is refused, before any
/// allocation sized by that length (the storage tables are sized by the batch).
#[test]
fn huge_packed_lengths_are_refused() {
    if !library() {
        return;
    }
    for vector in [1, 8, 1 << 20] {
        let r =
            SeqDataDesc::<f32>::new(SeqLayout::Packed, 150_000_000, vector, &[150_000_000], 0.0);
        assert!(
            matches!(r, Err(Error::Overflow { .. } | Error::Cudnn { .. })),
            "{r:?}"
        );
    }
    let r = SeqDataDesc::<f32>::uniform(SeqLayout::SeqMajor, 2, i64::MAX, 1);
    assert!(matches!(r, Err(Error::Overflow { .. })), "{r:?}");
    let r = SeqDataDesc::<f32>::uniform(SeqLayout::SeqMajor, 1 << 16, 1 << 16, 1);
    assert!(matches!(r, Err(Error::Overflow { .. })), "{r:?}");
}

#[test]
fn rnn_settings_never_panic() {
    if !library() {
        return;
    }
    let cell = prop::sample::select(vec![
        CellMode::Relu,
        CellMode::Tanh,
        CellMode::Lstm,
        CellMode::Gru,
    ]);
    let modes = (
        any::<bool>(),
        prop::sample::select(vec![InputMode::Linear, InputMode::Skip]),
        prop::sample::select(vec![
            BiasMode::NoBias,
            BiasMode::SingleInput,
            BiasMode::Double,
            BiasMode::SingleRecurrent,
        ]),
        prop::sample::select(vec![
            RnnAlgo::Standard,
            RnnAlgo::PersistStatic,
            RnnAlgo::PersistStaticSmallH,
        ]),
        math(),
        proptest::option::of(dtype()),
        any::<bool>(),
    );
    let input = (
        cell,
        int(),
        int(),
        int(),
        proptest::option::of(int()),
        modes,
    );
    check(
        256,
        input,
        |(cell, input, hidden, layers, proj, (bidi, im, bias, algo, m, prec, padded))| {
            let mut b = Rnn::<f32>::builder(cell, input, hidden)
                .layers(layers)
                .direction(if bidi {
                    DirectionMode::Bidirectional
                } else {
                    DirectionMode::Unidirectional
                })
                .input_mode(im)
                .bias(bias)
                .algo(algo)
                .math(m)
                .padded_io(padded);
            if let Some(p) = proj {
                b = b.proj_size(p);
            }
            if let Some(p) = prec {
                b = b.math_precision(p);
            }
            let _ = b.validate();
            let _ = Rnn::<cudnn_safe::half::f16>::builder(cell, input, hidden)
                .layers(layers)
                .validate();
            Ok(())
        },
    );
}

fn epilogue() -> impl Strategy<Value = Epilogue> {
    prop::sample::select(vec![
        Epilogue::None,
        Epilogue::Relu,
        Epilogue::Gelu,
        Epilogue::Bias,
        Epilogue::BiasRelu,
        Epilogue::BiasGelu,
        Epilogue::BiasGrad,
        Epilogue::BiasGeluAux,
        Epilogue::DGelu,
        Epilogue::DGeluBiasGrad,
    ])
}

/// cuBLASLt problem shapes and every length they report.
#[test]
fn matmul_shapes_never_panic() {
    let input = (size(), size(), size(), epilogue(), any::<[bool; 3]>());
    check(512, input, |(m, n, k, e, [ta, tb, tf32])| {
        // Wrapping casts on purpose: huge sizes become negative dimensions, refused too.
        let (m, n, k) = (m as i64, n as i64, k as i64);
        for op in [Matmul::new(m, n, k), Matmul::linear(m, n, k)]
            .into_iter()
            .flatten()
        {
            let op = op
                .with_transpose_a(ta)
                .with_transpose_b(tb)
                .with_tf32(tf32)
                .with_epilogue(e);
            let lens = [
                op.a_len(),
                op.b_len(),
                op.d_len(),
                op.bias_len(),
                op.aux_ld() as usize,
                op.aux_len(),
            ];
            prop_assert!(lens[2] >= 1 && op.flops() > 0.0, "{lens:?}");
            let _ = (op.to_string(), op.m(), op.n(), op.k());
        }
        Ok(())
    });
}

/// Engine configurations from arbitrary text, and knob ranges with arbitrary bounds.
#[test]
fn engine_configs_and_knob_ranges_never_panic() {
    let text = prop_oneof![
        any::<String>(),
        "(eng)?-?[0-9]{0,25}(_k-?[0-9]{0,12}=-?[0-9]{0,22}){0,4}_?",
    ];
    let range = (any::<u32>(), int(), int(), int());
    check(
        512,
        (text, range, int(), size()),
        |(text, (knob, min, max, stride), around, n)| {
            if let Ok(c) = text.parse::<EngineConfig>() {
                // What reads back writes back the same.
                prop_assert_eq!(c.to_string().parse::<EngineConfig>().ok(), Some(c.clone()));
                let _ = c.knob(knob);
                let _ = c.with_knob(knob, around);
            }
            let r = KnobRange {
                knob,
                min,
                max,
                stride,
            };
            let values = r.values_near(around, n);
            prop_assert!(values.len() <= n.min(1 << 16));
            prop_assert!(values.iter().all(|&v| r.contains(v)), "{r:?} {values:?}");
            let c = EngineConfig {
                engine: 0,
                knobs: vec![(knob, around)],
            };
            prop_assert_eq!(c.check_knobs(&[r]).is_ok(), r.contains(around));
            prop_assert!(c.check_knobs(&[]).is_err());
            Ok(())
        },
    );
}

/// One step of a graph program: every builder method on operands picked among the tensors made
/// so far (by index modulo their number) with arbitrary parameters.
#[derive(Debug, Clone)]
enum Step {
    Tensor(Vec<i64>, Vec<i64>, DType),
    Packed(Vec<i64>, bool, DType),
    Scalar(f64, DType),
    Conv(usize, usize, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>),
    ConvData(usize, usize, Vec<i64>, Vec<i64>),
    ConvFilter(usize, usize, Vec<i64>, Vec<i64>),
    Matmul(usize, usize),
    Pointwise(usize, usize, f64, i64, usize, bool),
    PointwiseBwd(usize, usize, usize, f64),
    Reduction(usize, usize, Vec<i64>),
    Select(usize, usize, usize),
    Transpose(usize),
    LayerNorm(usize, usize, usize, f64, bool),
    RmsNorm(usize, usize, Option<usize>, f64, bool),
    NormBackward(usize, [usize; 4], bool),
    BatchNorm(usize, usize, usize, f64, Option<(usize, usize, f64)>),
    GroupNorm(usize, i64, Option<(usize, usize)>, f64, bool),
    Sdpa([usize; 3], f64, i64, bool, Option<usize>),
    SdpaBackward([usize; 6], f64),
    Inputs(i64, i64),
    Output(usize, Option<DType>, Option<Vec<i64>>),
    /// x, w, then forward, backward-data and backward-filter convolutions of them.
    ConvRecipe(Vec<i64>, bool, [Vec<i64>; 4]),
    /// x, scale, bias of a norm (kind) and the norm, forward then backward.
    NormRecipe(usize, Vec<i64>, i64, f64, bool),
    /// q, k, v (and optional bias, ALiBi slopes, padding, dropout) and attention.
    AttnRecipe(Vec<i64>, f64, i64, [bool; 6], f64),
    /// A reduction of a tensor to its dimensions with some axes kept (a bit mask).
    ReduceRecipe(usize, u8, usize),
}

fn step() -> impl Strategy<Value = Step> {
    let ix = || any::<usize>();
    prop_oneof![
        3 => (dims(6), ints(6), dtype()).prop_map(|(d, s, t)| Step::Tensor(d, s, t)),
        4 => (dims(6), any::<bool>(), dtype()).prop_map(|(d, c, t)| Step::Packed(d, c, t)),
        1 => (float(), dtype()).prop_map(|(v, t)| Step::Scalar(v, t)),
        2 => (ix(), ix(), per_dim(2, 0), per_dim(2, 0), per_dim(2, 1), per_dim(2, 1))
            .prop_map(|(x, w, a, b, s, d)| Step::Conv(x, w, a, b, s, d)),
        1 => (ix(), ix(), dims(6), per_dim(2, 0))
            .prop_map(|(y, w, d, p)| Step::ConvData(y, w, d, p)),
        1 => (ix(), ix(), dims(6), per_dim(2, 0))
            .prop_map(|(x, y, d, p)| Step::ConvFilter(x, y, d, p)),
        2 => (ix(), ix()).prop_map(|(a, b)| Step::Matmul(a, b)),
        3 => (ix(), ix(), float(), int(), 0usize..64, any::<bool>())
            .prop_map(|(x, b, f, i, m, two)| Step::Pointwise(x, b, f, i, m, two)),
        1 => (ix(), ix(), 0usize..16, float())
            .prop_map(|(dy, x, m, f)| Step::PointwiseBwd(dy, x, m, f)),
        2 => (ix(), 0usize..16, dims(6)).prop_map(|(x, op, d)| Step::Reduction(x, op, d)),
        1 => (ix(), ix(), ix()).prop_map(|(x, b, c)| Step::Select(x, b, c)),
        1 => ix().prop_map(Step::Transpose),
        1 => (ix(), ix(), ix(), float(), any::<bool>())
            .prop_map(|(x, s, b, e, t)| Step::LayerNorm(x, s, b, e, t)),
        1 => (ix(), ix(), proptest::option::of(ix()), float(), any::<bool>())
            .prop_map(|(x, s, b, e, t)| Step::RmsNorm(x, s, b, e, t)),
        1 => (0usize..4, any::<[usize; 4]>(), any::<bool>())
            .prop_map(|(k, o, f)| Step::NormBackward(k, o, f)),
        1 => (ix(), ix(), ix(), float(), proptest::option::of((ix(), ix(), float())))
            .prop_map(|(x, s, b, e, r)| Step::BatchNorm(x, s, b, e, r)),
        1 => (ix(), int(), proptest::option::of((ix(), ix())), float(), any::<bool>())
            .prop_map(|(x, g, a, e, t)| Step::GroupNorm(x, g, a, e, t)),
        2 => (any::<[usize; 3]>(), float(), int(), any::<bool>(), proptest::option::of(ix()))
            .prop_map(|(q, s, w, c, b)| Step::Sdpa(q, s, w, c, b)),
        1 => (any::<[usize; 6]>(), float()).prop_map(|(t, s)| Step::SdpaBackward(t, s)),
        1 => (int(), int()).prop_map(|(h, b)| Step::Inputs(h, b)),
        2 => (ix(), proptest::option::of(dtype()), proptest::option::of(ints(6)))
            .prop_map(|(t, d, s)| Step::Output(t, d, s)),
        3 => (shape(7), any::<bool>(), [per_dim(2, 0), per_dim(2, 0), per_dim(2, 1), per_dim(2, 1)])
            .prop_map(|(d, nhwc, p)| Step::ConvRecipe(d, nhwc, p)),
        3 => (0usize..7, shape(4), prop_oneof![3 => 1i64..4, 1 => int()], float(), any::<bool>())
            .prop_map(|(k, d, g, e, t)| Step::NormRecipe(k, d, g, e, t)),
        3 => (shape(5), float(), int(), any::<[bool; 6]>(), float())
            .prop_map(|(d, s, w, f, p)| Step::AttnRecipe(d, s, w, f, p)),
        2 => (ix(), any::<u8>(), 0usize..16).prop_map(|(x, m, op)| Step::ReduceRecipe(x, m, op)),
    ]
}

/// `n` small extents (1..5), now and then with an edge value among them.
fn shape(n: usize) -> impl Strategy<Value = Vec<i64>> {
    prop_oneof![
        4 => prop::collection::vec(1i64..5, n),
        1 => prop::collection::vec(prop_oneof![4 => 1i64..5, 1 => int()], n),
    ]
}

fn pointwise_mode(m: usize, f: f64, i: i64) -> PointwiseMode {
    use PointwiseMode::*;
    let modes = [
        Add,
        Sub,
        Mul,
        Div,
        Min,
        Max,
        Pow,
        Relu,
        LeakyRelu { slope: f },
        Gelu,
        GeluTanh,
        Sigmoid,
        Tanh,
        Swish { beta: f },
        Elu { alpha: f },
        Softplus { beta: f },
        Exp,
        Log,
        Sqrt,
        Rsqrt,
        Neg,
        Abs,
        Reciprocal,
        Erf,
        Identity,
        ReluBwd,
        GeluBwd,
        GeluTanhBwd,
        SigmoidBwd,
        TanhBwd,
        SwishBwd { beta: f },
        EluBwd { alpha: f },
        SoftplusBwd { beta: f },
        GenIndex { axis: i },
        CmpEq,
        CmpNeq,
        CmpGt,
        CmpGe,
        CmpLt,
        CmpLe,
        LogicalAnd,
    ];
    modes[m % modes.len()]
}

fn reduce_op(op: usize) -> ReduceOp {
    use ReduceOp::*;
    let ops = [Add, Mul, Min, Max, AMax, Avg, Norm1, Norm2, MulNoZeros];
    ops[op % ops.len()]
}

/// Runs a graph program; steps that the builder refuses are skipped (their error is typed).
fn run_program(steps: &[Step]) -> Graph {
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let mut ids: Vec<TensorId> = Vec::new();
    for step in steps {
        let pick = |i: usize| ids[i % ids.len()];
        let made: Vec<TensorId> = if ids.is_empty()
            && !matches!(
                step,
                Step::Tensor(..) | Step::Packed(..) | Step::Scalar(..) | Step::Inputs(..)
            )
            && !matches!(
                step,
                Step::ConvRecipe(..) | Step::NormRecipe(..) | Step::AttnRecipe(..)
            ) {
            continue;
        } else {
            match step {
                Step::Tensor(d, s, t) => g.tensor("t", d, s, *t).into_iter().collect(),
                Step::Packed(d, last, t) => if *last {
                    g.tensor_nhwc("nhwc", d, *t)
                } else {
                    g.tensor_nchw("nchw", d, *t)
                }
                .into_iter()
                .collect(),
                Step::Scalar(v, t) => g.scalar("s", *v, *t).into_iter().collect(),
                Step::Conv(x, w, pre, post, s, d) => {
                    let p = ConvParams::new(pre.len())
                        .with_pre_padding(pre)
                        .with_post_padding(post)
                        .with_strides(s)
                        .with_dilations(d);
                    g.conv_fprop(pick(*x), pick(*w), &p).into_iter().collect()
                }
                Step::ConvData(dy, w, dx, p) => {
                    let p = ConvParams::new(p.len()).with_padding(p);
                    g.conv_dgrad(pick(*dy), pick(*w), dx, &p)
                        .into_iter()
                        .collect()
                }
                Step::ConvFilter(x, dy, dw, p) => {
                    let p = ConvParams::new(p.len()).with_padding(p);
                    g.conv_wgrad(pick(*x), pick(*dy), dw, &p)
                        .into_iter()
                        .collect()
                }
                Step::Matmul(a, b) => g.matmul(pick(*a), pick(*b)).into_iter().collect(),
                Step::Pointwise(x, b, f, i, m, two) => {
                    let b = two.then(|| pick(*b));
                    g.pointwise(pointwise_mode(*m, *f, *i), pick(*x), b)
                        .into_iter()
                        .collect()
                }
                Step::PointwiseBwd(dy, x, m, f) => {
                    let mode = pointwise_mode(25 + m, *f, 0);
                    g.pointwise_bwd(mode, pick(*dy), pick(*x))
                        .into_iter()
                        .collect()
                }
                Step::Reduction(x, op, d) => g
                    .reduction(reduce_op(*op), pick(*x), d)
                    .into_iter()
                    .collect(),
                Step::Select(x, b, c) => {
                    g.select(pick(*x), pick(*b), pick(*c)).into_iter().collect()
                }
                Step::Transpose(x) => g.transpose(pick(*x)).into_iter().collect(),
                Step::LayerNorm(x, s, b, e, t) => g
                    .layer_norm(pick(*x), pick(*s), pick(*b), *e, *t)
                    .map(|o| [Some(o.y), o.stats.map(|s| s.0), o.stats.map(|s| s.1)])
                    .into_iter()
                    .flatten()
                    .flatten()
                    .collect(),
                Step::RmsNorm(x, s, b, e, t) => g
                    .rms_norm(pick(*x), pick(*s), b.map(pick), *e, *t)
                    .map(|o| [Some(o.y), o.inv_rms])
                    .into_iter()
                    .flatten()
                    .flatten()
                    .collect(),
                Step::NormBackward(kind, o, with_dbias) => {
                    let [a, b, c, d] = o.map(pick);
                    let e = pick(o[0] / 3);
                    let grads = match kind {
                        0 => g.layer_norm_backward(a, b, c, d, e),
                        1 => g.instance_norm_backward(a, b, c, d, e),
                        2 => g.batch_norm_backward(a, b, c, d, e),
                        _ => g.rms_norm_backward(a, b, c, d, *with_dbias).map(|r| {
                            cudnn_safe::graph::LayerNormGrads {
                                dx: r.dx,
                                dscale: r.dscale,
                                dbias: r.dbias.unwrap_or(r.dx),
                            }
                        }),
                    };
                    grads
                        .map(|r| vec![r.dx, r.dscale, r.dbias])
                        .unwrap_or_default()
                }
                Step::BatchNorm(x, s, b, e, running) => {
                    let running = running.map(|(m, v, momentum)| BatchNormRunning {
                        mean: pick(m),
                        var: pick(v),
                        momentum,
                    });
                    let (x, s, b) = (pick(*x), pick(*s), pick(*b));
                    let mut out: Vec<TensorId> = g
                        .batch_norm(x, s, b, *e, running)
                        .map(|o| vec![o.y])
                        .unwrap_or_default();
                    out.extend(g.batch_norm_inference(x, s, b, s, b));
                    out
                }
                Step::GroupNorm(x, groups, affine, e, t) => {
                    let affine = affine.map(|(s, b)| (pick(s), pick(b)));
                    let mut out: Vec<TensorId> = g
                        .group_norm_with(
                            pick(*x),
                            *groups,
                            affine,
                            *e,
                            *t,
                            GroupNormMethod::LayerNormView,
                        )
                        .map(|o| vec![o.y])
                        .unwrap_or_default();
                    if let Some((s, b)) = affine {
                        out.extend(g.group_norm(pick(*x), *groups, s, b, *e, *t).map(|o| o.y));
                    }
                    out
                }
                Step::Sdpa(qkv, scale, window, causal, bias) => {
                    let [q, k, v] = qkv.map(pick);
                    let mut opts = SdpaOptions::new()
                        .scale(*scale)
                        .sliding_window(*window)
                        .causal(*causal)
                        .training(*causal);
                    if let Some(b) = bias {
                        opts = opts.bias(pick(*b));
                    }
                    g.sdpa(q, k, v, &opts)
                        .map(|o| [Some(o.o), o.stats])
                        .into_iter()
                        .flatten()
                        .flatten()
                        .collect()
                }
                Step::SdpaBackward(t, scale) => {
                    let [q, k, v, o, d_o, stats] = t.map(pick);
                    let opts = SdpaOptions::new().scale(*scale);
                    g.sdpa_backward(q, k, v, o, d_o, stats, &opts)
                        .map(|r| vec![r.dq, r.dk, r.dv])
                        .unwrap_or_default()
                }
                Step::Inputs(heads, batch) => [
                    g.alibi_slopes_input("slopes", *heads),
                    g.seq_len_input("lengths", *batch),
                    Ok(g.rng_input("seed")),
                ]
                .into_iter()
                .flatten()
                .collect(),
                Step::ConvRecipe(d, nhwc, [pre, post, stride, dil]) => {
                    let (x_dims, w_dims) = (&d[..4], [d[4], d[1], d[5], d[6]]);
                    let make = |g: &mut Graph, name, dims: &[i64]| {
                        if *nhwc {
                            g.tensor_nhwc(name, dims, DType::F16)
                        } else {
                            g.tensor_nchw(name, dims, DType::F16)
                        }
                    };
                    let (Ok(x), Ok(w)) = (make(&mut g, "x", x_dims), make(&mut g, "w", &w_dims))
                    else {
                        continue;
                    };
                    let p = ConvParams::new(2)
                        .with_pre_padding(pre)
                        .with_post_padding(post)
                        .with_strides(stride)
                        .with_dilations(dil);
                    let mut out = vec![x, w];
                    if let Ok(y) = g.conv_fprop(x, w, &p) {
                        out.push(y);
                        out.extend(g.conv_dgrad(y, w, x_dims, &p));
                        out.extend(g.conv_wgrad(x, y, &w_dims, &p));
                    }
                    out
                }
                Step::NormRecipe(kind, d, groups, eps, training) => {
                    let c = d[1];
                    let per_channel = [1, c, 1, 1];
                    let Ok(x) = g.tensor_nhwc("x", d, DType::F16) else {
                        continue;
                    };
                    let affine = if *kind == 0 {
                        d.clone()
                    } else {
                        per_channel.to_vec()
                    };
                    let (Ok(s), Ok(b)) = (
                        g.tensor_nhwc("scale", &affine, DType::F32),
                        g.tensor_nhwc("bias", &affine, DType::F32),
                    ) else {
                        continue;
                    };
                    let mut out = vec![x, s, b];
                    let stats = match kind {
                        0 => g
                            .layer_norm(x, s, b, *eps, *training)
                            .map(|o| (o.y, o.stats)),
                        1 => g
                            .instance_norm(x, s, b, *eps, *training)
                            .map(|o| (o.y, o.stats)),
                        2 => g
                            .rms_norm(x, s, Some(b), *eps, *training)
                            .map(|o| (o.y, None)),
                        3 => g
                            .batch_norm(x, s, b, *eps, None)
                            .map(|o| (o.y, Some((o.mean, o.inv_var)))),
                        4 => g
                            .group_norm(x, *groups, s, b, *eps, *training)
                            .map(|o| (o.y, o.stats)),
                        5 => g
                            .group_norm_with(
                                x,
                                *groups,
                                None,
                                *eps,
                                *training,
                                GroupNormMethod::InstanceNormView,
                            )
                            .map(|o| (o.y, o.stats)),
                        _ => g.batch_norm_inference(x, s, b, s, b).map(|y| (y, None)),
                    };
                    if let Ok((y, stats)) = stats {
                        out.push(y);
                        if let (Some((mean, inv)), Ok(dy)) =
                            (stats, g.tensor_nhwc("dy", d, DType::F16))
                        {
                            let grads = match kind {
                                0 => g.layer_norm_backward(dy, x, s, mean, inv),
                                1 => g.instance_norm_backward(dy, x, s, mean, inv),
                                _ => g.batch_norm_backward(dy, x, s, mean, inv),
                            };
                            out.extend(grads.map(|r| r.dx));
                        }
                    }
                    out
                }
                Step::AttnRecipe(d, scale, window, flags, p) => {
                    let [causal, bottom_right, bias, alibi, padding, dropout] = *flags;
                    let (b, h) = (d[0], d[1]);
                    let (s_q, s_kv, hd) = (
                        d[2].saturating_mul(8),
                        d[3].saturating_mul(8),
                        d[4].saturating_mul(16),
                    );
                    let t = |g: &mut Graph, name, dims: [i64; 4]| {
                        g.tensor_nchw(name, &dims, DType::BF16)
                    };
                    let (Ok(q), Ok(k), Ok(v)) = (
                        t(&mut g, "q", [b, h, s_q, hd]),
                        t(&mut g, "k", [b, h, s_kv, hd]),
                        t(&mut g, "v", [b, h, s_kv, hd]),
                    ) else {
                        continue;
                    };
                    let mut opts = SdpaOptions::new()
                        .scale(*scale)
                        .causal(causal)
                        .causal_bottom_right(bottom_right)
                        .training(true);
                    if *window != 0 {
                        opts = opts.sliding_window(*window);
                    }
                    if bias {
                        if let Ok(bt) = t(&mut g, "bias", [1, h, s_q, s_kv]) {
                            opts = opts.bias(bt);
                        }
                    }
                    if alibi {
                        if let Ok(sl) = g.alibi_slopes_input("slopes", h) {
                            opts = opts.alibi(sl);
                        }
                    }
                    if padding {
                        if let (Ok(lq), Ok(lkv)) =
                            (g.seq_len_input("lq", b), g.seq_len_input("lkv", b))
                        {
                            opts = opts.padding(lq, lkv);
                        }
                    }
                    if dropout {
                        let (seed, offset) = (g.rng_input("seed"), g.rng_input("offset"));
                        opts = opts.dropout(*p, seed, offset);
                    }
                    let mut out = vec![q, k, v];
                    if let Ok(o) = g.sdpa(q, k, v, &opts) {
                        out.push(o.o);
                        if let (Some(stats), Ok(d_o)) = (o.stats, t(&mut g, "dO", [b, h, s_q, hd]))
                        {
                            if let Ok(r) = g.sdpa_backward(q, k, v, o.o, d_o, stats, &opts) {
                                out.extend([r.dq, r.dk, r.dv]);
                            }
                        }
                    }
                    out
                }
                Step::ReduceRecipe(x, mask, op) => {
                    let x = pick(*x);
                    let Ok(d) = g.dims(x) else { continue };
                    let out: Vec<i64> = d
                        .iter()
                        .enumerate()
                        .map(|(i, &e)| if mask >> (i % 8) & 1 == 1 { e } else { 1 })
                        .collect();
                    g.reduction(reduce_op(*op), x, &out).into_iter().collect()
                }
                Step::Output(t, dtype, strides) => {
                    let t = pick(*t);
                    let _ = match (dtype, strides) {
                        (_, Some(s)) => g.mark_output_strided(t, dtype.unwrap_or(DType::F16), s),
                        (Some(d), None) => g.mark_output_as(t, *d),
                        (None, None) => g.mark_output(t),
                    };
                    let _ = g.set_virtual_dtype(t, dtype.unwrap_or(DType::F32));
                    let _ = (
                        g.name(t),
                        g.dims(t),
                        g.strides(t),
                        g.dtype(t),
                        g.is_virtual(t),
                    );
                    Vec::new()
                }
            }
        };
        ids.extend(made);
    }
    g
}

/// Graphs built from arbitrary programs: no builder method panics, a graph the builder made
/// reads back from its record with the same signature, and (with the library) cuDNN's
/// validation of it returns.
#[test]
fn graph_programs_never_panic() {
    let with_library = library();
    check(384, prop::collection::vec(step(), 0..24), |steps| {
        let g = run_program(&steps);
        let _ = g.signature();
        if let Ok(line) = g.to_json() {
            let back = Graph::from_json(&line);
            prop_assert!(back.is_ok(), "{line}: {back:?}");
            prop_assert_eq!(back.unwrap().signature(), g.signature());
        }
        if with_library {
            let _ = g.check();
        }
        Ok(())
    });
}

/// JSON pointers of every number in `v`.
fn number_paths(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Number(_) => out.push(at),
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                number_paths(x, format!("{at}/{i}"), out);
            }
        }
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                number_paths(x, format!("{at}/{k}"), out);
            }
        }
        _ => {}
    }
}

/// A graph with a convolution, a matmul, pointwise operations, a reduction and a norm.
fn sample_graph() -> Graph {
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[2, 8, 6, 6], DType::F16).unwrap();
    let w = g.tensor_nhwc("w", &[4, 8, 3, 3], DType::F16).unwrap();
    let y = g
        .conv_fprop(x, w, &ConvParams::new(2).with_padding(&[1, 1]))
        .unwrap();
    let s = g.scalar("s", 0.5, DType::F32).unwrap();
    let y = g.pointwise(PointwiseMode::Mul, y, Some(s)).unwrap();
    let r = g.reduction(ReduceOp::Add, y, &[2, 4, 1, 1]).unwrap();
    g.mark_output(r).unwrap();
    let a = g.tensor_nchw("a", &[1, 4, 8], DType::F16).unwrap();
    let b = g.tensor_nchw("b", &[1, 8, 2], DType::F16).unwrap();
    let c = g.matmul(a, b).unwrap();
    g.mark_output(c).unwrap();
    let xs = g.tensor_nchw("xs", &[4, 16, 1, 1], DType::F16).unwrap();
    let gamma = g.tensor_nchw("gamma", &[1, 16, 1, 1], DType::F16).unwrap();
    let beta = g.tensor_nchw("beta", &[1, 16, 1, 1], DType::F16).unwrap();
    let n = g.layer_norm(xs, gamma, beta, 1e-5, true).unwrap();
    g.mark_output(n.y).unwrap();
    g
}

/// Graph records: arbitrary text, and a real record with arbitrary numbers (any `i64`, the
/// edges included) in arbitrary places. Reading returns a graph or a typed error; a graph read
/// back passes (or fails) cuDNN's validation without a panic.
#[test]
fn graph_records_never_panic() {
    let with_library = library();
    let line = sample_graph().to_json().unwrap();
    let record: serde_json::Value = serde_json::from_str(&line).unwrap();
    let mut paths = Vec::new();
    number_paths(&record, String::new(), &mut paths);
    let edit = prop::collection::vec(
        (
            any::<prop::sample::Index>(),
            prop_oneof![int(), any::<i64>()],
        ),
        1..5,
    );
    let text = prop_oneof![
        any::<String>(),
        Just(line.clone()).prop_flat_map(|l| {
            let n = l.len();
            (Just(l), 0..n, 0..n).prop_map(|(l, a, b)| {
                let (a, b) = (a.min(b), a.max(b));
                // Cut out a byte range (on char boundaries: the record is ASCII).
                format!("{}{}", &l[..a], &l[b..])
            })
        }),
    ];
    check(512, (edit, text), |(edits, text)| {
        let _ = Graph::from_json(&text);
        let mut v = record.clone();
        for (at, value) in edits {
            let p: &String = at.get(&paths[..]);
            *v.pointer_mut(p).unwrap() = value.into();
        }
        if let Ok(g) = Graph::from_json(&v.to_string()) {
            let _ = g.signature();
            if with_library {
                let _ = g.check();
            }
        }
        Ok(())
    });
}

/// A fresh scratch directory for this process.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("cudnn-safe-nopanic-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Lines as the tuner caches write them, with fields replaced by arbitrary text.
fn cache_bytes() -> impl Strategy<Value = Vec<u8>> {
    let field = prop_oneof![
        Just(String::new()),
        "[0-9,:.-]{0,40}",
        "eng[0-9]{1,3}(_k[0-9]{1,2}=-?[0-9]{1,20}){0,3}",
        "graph=eng[0-9]{1,3}(_k[0-9]{1,2}=-?[0-9]{1,3}){0,2}:[0-9]{1,20}:[0-9.e-]{1,8}",
        "\\{\"[a-z]{1,8}\":[0-9-]{1,20}\\}",
        any::<String>(),
    ];
    let line = prop::collection::vec(field, 1..6).prop_map(|f| f.join("\t"));
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        prop::collection::vec(line, 0..8).prop_map(|l| l.join("\n").into_bytes()),
    ]
}

/// The convolution tuner's cache file and the graph plan cache's file, holding arbitrary bytes:
/// reading keeps what parses and skips the rest, and a save rewrites a file that reads back the
/// same.
#[test]
fn cache_files_never_panic() {
    let dir = scratch("caches");
    let path = dir.join("cache.txt");
    check(256, cache_bytes(), |bytes| {
        std::fs::write(&path, &bytes).unwrap();
        let t = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .try_cache_file(&path);
        prop_assert!(t.is_ok(), "{t:?}");
        let t = t.unwrap();
        let n = t.cached_decisions();
        prop_assert!(t.save().is_ok());
        let again = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .cache_file(&path);
        prop_assert_eq!(again.cached_decisions(), n);

        std::fs::write(&path, &bytes).unwrap();
        let cache = PlanCache::new().try_cache_file(&path);
        prop_assert!(cache.is_ok(), "{cache:?}");
        prop_assert!(cache.unwrap().save().is_ok());
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn alibi_slopes_refuse_absurd_head_counts() {
    assert!(matches!(
        alibi_slopes(usize::MAX),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        alibi_slopes(1 << 31),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(alibi_slopes(5).unwrap().len(), 5);
}
