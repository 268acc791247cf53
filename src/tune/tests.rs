//! The tuner's unit tests: knobs, the cache file, keys, the warm-up's key reading, graph
//! refusals.
use std::collections::HashMap;
use std::sync::Arc;

use super::autotuner::MAX_FINAL_SOLO_MS;
use super::cache::{decode, format_line, parse_line, Entry, GraphPick};
use super::key::{
    dtype_code, format_code, format_from_code, kind_of, problem_key, with_search, Key, KeyProblem,
};
use super::policy::MAX_CARRIED;
use super::search::{final_ms, is_graph_only_refusal, legacy_hopeless, remember_winner};
use super::*;
use crate::conv::{ConvDesc, ConvDirection, ConvFwdAlgo, ConvMode, MathType};
use crate::dtype::{DType, DataType};
use crate::error::Error;
use crate::graph::EngineConfig;
use crate::tensor::{FilterDesc, TensorDesc, TensorFormat};

fn key(device: &str, problem: Vec<i64>) -> Key {
    Key::new(device.into(), problem)
}

fn pick(config: &str, workspace: usize, ms: f32) -> GraphPick {
    GraphPick {
        config: Arc::new(config.parse().unwrap()),
        workspace,
        ms,
    }
}

#[test]
fn finals_knobs_take_sane_values() {
    let t = Autotuner::new(Policy::Benchmark).without_cache_file();
    assert_eq!(
        (t.finalists, t.final_solo_ms),
        (DEFAULT_FINALISTS, DEFAULT_FINAL_SOLO_MS)
    );
    let t = t.with_finalists(0).with_final_solo_ms(100.0);
    assert_eq!((t.finalists, t.final_solo_ms), (0, 100.0));
    for (asked, kept) in [
        (-1.0, 0.0),
        (f32::NAN, 0.0),
        (f32::INFINITY, MAX_FINAL_SOLO_MS),
        (0.5, 0.5),
    ] {
        let t = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .with_final_solo_ms(asked);
        assert_eq!(t.final_solo_ms, kept, "final_solo_ms({asked})");
    }
}

#[test]
fn finals_keep_the_mean_of_their_sweeps() {
    // Two sweeps in opposite orders: a drift of the clocks weighs on every finalist alike.
    assert_eq!(final_ms(&[0.25, 0.75]), Some(0.5));
    assert_eq!(final_ms(&[0.5]), Some(0.5));
    assert_eq!(final_ms(&[]), None);
}

#[test]
fn cache_lines_round_trip_and_bad_lines_are_skipped() {
    let dir = std::env::temp_dir().join(format!("cudnn-safe-tune-{}", std::process::id()));
    let path = dir.join("cache.txt");
    let _ = std::fs::remove_file(&path);
    let mut t = Autotuner::new(Policy::Benchmark)
        .without_cache_file()
        .cache_file(&path);
    assert_eq!(t.cached_decisions(), 0);
    let k = key("GPU X|sm90|cudnn91400", vec![0, 1, 2, -3]);
    t.cache.insert(
        k.clone(),
        Arc::new(Entry::legacy(vec![(7, 1024, 0.25), (1, 0, 0.5)])),
    );
    let graph_key = key("GPU X|sm90|cudnn91400", vec![0, 1, 2, -4]);
    let p = pick("eng12_k2=1_k5=0", 4096, 0.125);
    t.cache.insert(
        graph_key.clone(),
        Arc::new(Entry {
            ranking: vec![(1, 0, 0.5)],
            graph: Some(p.clone()),
        }),
    );
    t.save().unwrap();
    let mut text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\tgraph=eng12_k2=1_k5=0:4096:0.125\n"),
        "{text}"
    );
    // A line as written before the union search (three fields) still reads; a bad graph
    // field makes the line unreadable.
    text.push_str("garbage line\nGPU\t1,x\t1:2:3\nGPU Y\t5,6\t1:0:0.5\n");
    text.push_str("GPU Z\t5,6\t1:0:0.5\tgraph=engX:1:1\n");
    std::fs::write(&path, text).unwrap();
    let t2 = Autotuner::new(Policy::Benchmark).cache_file(&path);
    assert_eq!(t2.cached_decisions(), 3);
    assert_eq!(
        *t2.cache[&k],
        Entry::legacy(vec![(7, 1024, 0.25), (1, 0, 0.5)])
    );
    assert_eq!(t2.cache[&graph_key].graph, Some(p));
    let old = key("GPU Y", vec![5, 6]);
    assert_eq!(*t2.cache[&old], Entry::legacy(vec![(1, 0, 0.5)]));
    let r: Vec<Candidate<ConvFwdAlgo>> = decode(&t2.cache[&k].ranking);
    assert_eq!(r[0].algo, ConvFwdAlgo::WinogradNonfused);
    assert_eq!(r[1].algo, ConvFwdAlgo::ImplicitPrecompGemm);
    let first: Option<Candidate<ConvFwdAlgo>> = t2.cache[&k].first();
    assert_eq!(first.map(|c| c.algo), Some(ConvFwdAlgo::WinogradNonfused));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn graph_picks_of_every_call_kind_round_trip() {
    // Backward-data (1), backward-filter (2) and fused (16, 17) decisions with graph engines,
    // under the union (no suffix) and prefer (-2) search modes: one line each, read back
    // equal.
    let dev = "GPU X|sm90|cudnn91400";
    let entries = [
        (
            key(dev, vec![1, 2, 2, 0, 8, 1]),
            Entry {
                ranking: vec![(1, 0, 0.5), (0, 0, 0.75)],
                graph: Some(pick("eng9_k3=2", 0, 0.0625)),
            },
        ),
        (
            key(dev, vec![2, 2, 2, 0, 8, 1, -2]),
            Entry {
                ranking: vec![(1, 128, 0.5)],
                graph: Some(pick("eng0", 1 << 20, 1.5)),
            },
        ),
        (
            key(dev, vec![16, 2, 2, 0, 8, 1, 2, 1, 4, 1, 1, 4, 1, 1, 1]),
            Entry {
                ranking: vec![(1, 0, 0.5)],
                graph: Some(pick("eng4_k1=0_k2=3_k11=-1", 64, 0.03125)),
            },
        ),
        (
            key(dev, vec![17, 2, 2, 0, 8, 1]),
            Entry::legacy(vec![(1, 0, -1.0)]),
        ),
    ];
    for (k, e) in &entries {
        let line = format_line(k, e);
        let (k2, e2) = parse_line(&line).unwrap_or_else(|| panic!("unreadable: {line}"));
        assert_eq!(&k2, k, "{line}");
        assert_eq!(k2.hash, k.hash, "{line}");
        assert_eq!(&e2, e, "{line}");
    }
}

#[test]
fn keys_hash_once_and_compare_whole() {
    let a = key("GPU", vec![1, 2, 3]);
    let b = key("GPU", vec![1, 2, 3]);
    let c = key("GPU", vec![1, 2, 4]);
    let d = key("GPU 2", vec![1, 2, 3]);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, d);
    let mut m = HashMap::new();
    m.insert(a.clone(), 1);
    assert_eq!(m.get(&b), Some(&1));
    assert_eq!(m.get(&c), None);
    // A key with a forged hash still compares its fields.
    let forged = Key {
        hash: a.hash,
        ..c.clone()
    };
    assert_ne!(forged, a);
}

#[test]
fn search_modes_mark_keys_under_the_benchmark_policies_only() {
    let base = vec![0, 5];
    assert_eq!(
        with_search(base.clone(), Policy::Benchmark, GraphSearch::Union),
        base
    );
    assert_eq!(
        with_search(base.clone(), Policy::Deterministic, GraphSearch::Off),
        vec![0, 5, -1]
    );
    assert_eq!(
        with_search(base.clone(), Policy::Benchmark, GraphSearch::Prefer),
        vec![0, 5, -2]
    );
    assert_eq!(
        with_search(base.clone(), Policy::Heuristic, GraphSearch::Prefer),
        base
    );
}

#[test]
fn graph_plan_cap_is_configurable() {
    let t = Autotuner::new(Policy::Benchmark).without_cache_file();
    assert_eq!(t.graph_plans(), DEFAULT_GRAPH_PLANS);
    assert_eq!(DEFAULT_GRAPH_PLANS, 24);
    assert!(t.union_on());
    let t = t.with_graph_plans(4);
    assert_eq!(t.graph_plans(), 4);
    assert_eq!(t.with_graph_plans(0).graph_plans(), 1);
    let t = Autotuner::new(Policy::Benchmark).without_cache_file();
    assert_eq!(t.refine_knobs(), DEFAULT_REFINE_KNOBS);
    assert_eq!(t.with_refine_knobs(0).refine_knobs(), 0);
    let t = Autotuner::new(Policy::Benchmark).without_cache_file();
    assert!(!t.heuristics_b());
    assert!(t.with_heuristics_b(true).heuristics_b());
    let off = Autotuner::new(Policy::Benchmark)
        .without_cache_file()
        .with_graph_search(GraphSearch::Off);
    assert!(!off.union_on());
    let heuristic = Autotuner::new(Policy::Heuristic).without_cache_file();
    assert!(!heuristic.union_on());
    assert_eq!(heuristic.stats(), Stats::default());
}

/// Rebuilds the descriptors of a decoded key and computes the key again.
fn rekey<T: DataType>(p: &KeyProblem, policy: Policy, limit: usize, g: GraphSearch) -> Vec<i64> {
    p.key(&p.descriptors::<T>().unwrap(), policy, limit, g)
}

#[test]
fn warm_up_reads_problems_back_from_their_keys() {
    let Some(()) = crate::checks::lib_or_skip() else {
        return;
    };
    use half::f16;
    // A grouped, strided, dilated f16 NHWC problem with an odd layout for b.
    let conv = ConvDesc::builder(2)
        .pads(&[1, 2])
        .strides(&[2, 1])
        .dilations(&[1, 2])
        .groups(2)
        .mode(ConvMode::Convolution)
        .math(MathType::TensorOp)
        .build::<f16>()
        .unwrap();
    let x = TensorDesc::<f16>::nhwc(2, 8, 9, 10).unwrap();
    let w = FilterDesc::<f16>::new(&[16, 4, 3, 3], TensorFormat::Nhwc).unwrap();
    let y_dims = conv.output_dims(x.dims(), w.dims()).unwrap();
    let y = TensorDesc::<f16>::nchw_nd(&y_dims).unwrap();
    for dir in [
        ConvDirection::Forward,
        ConvDirection::BackwardData,
        ConvDirection::BackwardFilter,
    ] {
        for (policy, g) in [
            (Policy::Benchmark, GraphSearch::Union),
            (Policy::Benchmark, GraphSearch::Prefer),
            (Policy::Deterministic, GraphSearch::Off),
            (Policy::Heuristic, GraphSearch::Union),
        ] {
            let key = with_search(
                problem_key(
                    dir,
                    (x.layout(), DType::F16),
                    &w,
                    (y.layout(), DType::F16),
                    &conv,
                    policy,
                    1 << 20,
                ),
                policy,
                g,
            );
            let p = KeyProblem::decode(&key).unwrap_or_else(|| panic!("{dir:?}: {key:?}"));
            assert_eq!(p.dir, dir);
            assert_eq!(
                (p.a_t, p.b_t, p.compute),
                (DType::F16, DType::F16, DType::F32)
            );
            assert_eq!(
                (p.math, p.mode, p.groups),
                (MathType::TensorOp, ConvMode::Convolution, 2)
            );
            assert_eq!(
                (p.pads.as_slice(), p.strides.as_slice()),
                (&[1, 2][..], &[2, 1][..])
            );
            assert_eq!(p.a_strides, x.layout().strides());
            assert_eq!(p.w_format, TensorFormat::Nhwc);
            assert_eq!(p.b_dims, y_dims);
            assert_eq!(
                rekey::<f16>(&p, policy, 1 << 20, g),
                key,
                "{dir:?} {policy:?} {g:?}"
            );
            // Another policy or limit computes another key: not replayed by that tuner.
            assert_ne!(rekey::<f16>(&p, policy, 1 << 21, g), key);
        }
    }
}

/// The keys of a problem in every direction, after checking that each decodes to descriptors
/// equal to the originals (tensors are keyed by dims and strides, what cuDNN is handed, so they
/// come back strided).
fn round_trip<T: DataType>(conv: &ConvDesc, x: &TensorDesc<T>, w: &FilterDesc<T>) -> Vec<Vec<i64>> {
    let y = TensorDesc::<T>::nchw_nd(&conv.output_dims(x.dims(), w.dims()).unwrap()).unwrap();
    let mut keys = Vec::new();
    for dir in [
        ConvDirection::Forward,
        ConvDirection::BackwardData,
        ConvDirection::BackwardFilter,
    ] {
        let (policy, g) = (Policy::Benchmark, GraphSearch::Prefer);
        let key = super::key::call_key(dir, (x, w, &y), conv, (policy, 1 << 20, g));
        let p = KeyProblem::decode(&key).unwrap_or_else(|| panic!("{dir:?}: {key:?}"));
        assert_eq!((p.dir, p.a_t, p.b_t), (dir, T::DTYPE, T::DTYPE));
        let descs = p.descriptors::<T>().unwrap();
        let (c2, x2, w2, y2) = &descs;
        // Debug shows every parameter: spatial rank, the lists cuDNN is handed, groups,
        // mode, math and compute type.
        assert_eq!(format!("{c2:?}"), format!("{conv:?}"), "{dir:?} {key:?}");
        for (got, want) in [(x2, x), (y2, &y)] {
            assert_eq!(
                (got.dims(), got.layout().strides()),
                (want.dims(), want.layout().strides())
            );
        }
        assert_eq!((w2.dims(), w2.format()), (w.dims(), w.format()));
        assert_eq!(p.key(&descs, policy, 1 << 20, g), key, "{dir:?}");
        keys.push(key);
    }
    keys
}

#[test]
fn keys_of_1d_2d_and_3d_problems_round_trip() {
    let Some(()) = crate::checks::lib_or_skip() else {
        return;
    };
    let nchw = TensorFormat::Nchw;
    let conv1 = || {
        ConvDesc::builder(1)
            .pads(&[2])
            .strides(&[2])
            .dilations(&[3])
            .groups(2)
    };
    let conv1 = conv1().mode(ConvMode::Convolution).build::<f32>().unwrap();
    // The 1-D problem as [N, C, 1, W] and as [N, C, W], and as [N, C, W] channels-last.
    let x4 = TensorDesc::<f32>::nchw_nd(&[2, 8, 1, 50]).unwrap();
    let w4 = FilterDesc::<f32>::new(&[6, 4, 1, 5], nchw).unwrap();
    let four = round_trip(&conv1, &x4, &w4);
    let x3 = TensorDesc::<f32>::nchw_nd(&[2, 8, 50]).unwrap();
    let w3 = FilterDesc::<f32>::new(&[6, 4, 5], nchw).unwrap();
    let three = round_trip(&conv1, &x3, &w3);
    let x3l = TensorDesc::<f32>::nhwc_nd(&[2, 8, 50]).unwrap();
    let w3l = FilterDesc::<f32>::new(&[6, 4, 5], TensorFormat::Nhwc).unwrap();
    round_trip(&conv1, &x3l, &w3l);
    for (a, b) in four.iter().zip(&three) {
        assert_ne!(a, b, "the 3-D and 4-D forms of a 1-D problem");
    }
    // [.., spatial 1, rank 4, pad 2, stride 2, dilation 3, ..]: the declared values.
    assert_eq!(four[0][7..12], [1, 4, 2, 2, 3]);
    assert_eq!(three[0][7..12], [1, 3, 2, 2, 3]);

    let conv2 = ConvDesc::builder(2)
        .pads(&[1, 2])
        .strides(&[2, 1])
        .dilations(&[1, 2]);
    let conv2 = conv2.math(MathType::TensorOp).build::<half::f16>().unwrap();
    let x = TensorDesc::<half::f16>::nhwc(2, 8, 9, 10).unwrap();
    let w = FilterDesc::<half::f16>::new(&[16, 8, 3, 3], TensorFormat::Nhwc).unwrap();
    round_trip(&conv2, &x, &w);

    let conv3 = ConvDesc::builder(3)
        .pads(&[1, 0, 1])
        .strides(&[1, 2, 1])
        .groups(2);
    let conv3 = conv3.build::<half::bf16>().unwrap();
    let x = TensorDesc::<half::bf16>::strided(&[1, 4, 5, 6, 7], &[1000, 210, 42, 7, 1]).unwrap();
    let w = FilterDesc::<half::bf16>::new(&[8, 2, 3, 3, 3], nchw).unwrap();
    round_trip(&conv3, &x, &w);

    // A 2-D key as this version has always written it (cache files stay valid).
    let conv = ConvDesc::builder(2).pads(&[1, 1]).build::<f32>().unwrap();
    let x = TensorDesc::<f32>::nchw(1, 2, 3, 3).unwrap();
    let w = FilterDesc::<f32>::new(&[4, 2, 3, 3], nchw).unwrap();
    let y = TensorDesc::<f32>::nchw(1, 4, 3, 3).unwrap();
    let (a, b) = ((x.layout(), DType::F32), (y.layout(), DType::F32));
    let f = dtype_code(DType::F32);
    assert_eq!(
        problem_key(
            ConvDirection::Forward,
            a,
            &w,
            b,
            &conv,
            Policy::Heuristic,
            0
        ),
        [
            0, f, f, f, 0, 0, 1, 2, 4, 1, 1, 1, 1, 1, 1, 1, 2, 3, 3, 18, 9, 3, 1, 0, 4, 2, 3, 3, 1,
            4, 3, 3, 36, 9, 3, 1, 0, 0
        ]
    );
}

#[test]
fn warm_up_leaves_keys_it_cannot_read() {
    // [dir, a, b, compute, math, mode, groups, spatial 1, rank 3, pad, stride, dilation,
    //  a dims ×3, a strides ×3, filter format, w dims ×3, b dims ×3, b strides ×3, policy, limit]:
    // the forward f32 1-D convolution of [1, 4, 8] by [2, 4, 3] with padding 1.
    let f32c = dtype_code(DType::F32);
    let good: Vec<i64> = vec![
        0, f32c, f32c, f32c, 0, 0, 1, 1, 3, 1, 1, 1, 1, 4, 8, 32, 8, 1, 0, 2, 4, 3, 1, 2, 8, 16, 8,
        1, 2, 0,
    ];
    if crate::checks::lib_or_skip().is_some() {
        let conv = ConvDesc::builder(1).pads(&[1]).build::<f32>().unwrap();
        let x = TensorDesc::<f32>::nchw_nd(&[1, 4, 8]).unwrap();
        let w = FilterDesc::<f32>::new(&[2, 4, 3], TensorFormat::Nchw).unwrap();
        let y = TensorDesc::<f32>::nchw_nd(&[1, 2, 8]).unwrap();
        let (a, b) = ((x.layout(), DType::F32), (y.layout(), DType::F32));
        let computed = problem_key(
            ConvDirection::Forward,
            a,
            &w,
            b,
            &conv,
            Policy::Deterministic,
            0,
        );
        assert_eq!(computed, good, "the key problem_key writes");
    }
    let p = KeyProblem::decode(&good).expect("a plain forward key");
    assert_eq!((p.spatial, p.w_dims.as_slice()), (1, &[2, 4, 3][..]));
    assert_eq!(
        (p.pads.as_slice(), p.strides.as_slice()),
        (&[1][..], &[1][..])
    );
    assert_eq!(p.b_strides, [16, 8, 1]);
    let mut suffixed = good.clone();
    suffixed.push(-1);
    assert!(KeyProblem::decode(&suffixed).is_some());
    let mut fused = good.clone();
    fused[0] = 17;
    assert_eq!(
        KeyProblem::decode(&fused),
        None,
        "fused bias-activation keys"
    );
    assert_eq!(KeyProblem::decode(&good[..good.len() - 1]), None, "short");
    let mut long = suffixed.clone();
    long.push(0);
    assert_eq!(KeyProblem::decode(&long), None, "long");
    let mut rank = good.clone();
    rank[8] = 4;
    assert_eq!(KeyProblem::decode(&rank), None, "rank 4 with 3-D lists");
    rank[8] = 5;
    assert_eq!(
        KeyProblem::decode(&rank),
        None,
        "a 1-D rank neither 3 nor 4"
    );
    let mut spatial = good.clone();
    spatial[7] = 2;
    assert_eq!(KeyProblem::decode(&spatial), None, "rank not spatial + 2");
    let mut dtype = good.clone();
    dtype[1] = dtype_code(DType::F64);
    assert_eq!(KeyProblem::decode(&dtype), None, "f64 is not replayed");
    let mut math = good.clone();
    math[4] = 9;
    assert_eq!(KeyProblem::decode(&math), None, "unknown math type");
    assert_eq!(KeyProblem::decode(&[]), None);
    assert_eq!(
        format_from_code(format_code(TensorFormat::NchwVectC { width: 32 })),
        Some(TensorFormat::NchwVectC { width: 32 })
    );
    assert_eq!(format_from_code(2), None, "filters are never strided");
}

/// A graph plan refused for one call's buffers (a view off the graph's 16-byte alignment)
/// leaves the decision's graph engine in memory and in the cache file; a refusal of the plan
/// itself drops it from both; an argument error leaves the decision and is returned.
#[test]
fn only_a_refused_plan_loses_its_graph_decision() {
    let dir = std::env::temp_dir().join(format!("cudnn-safe-tune-align-{}", std::process::id()));
    let path = dir.join("cache.txt");
    let _ = std::fs::remove_file(&path);
    let mut t = Autotuner::new(Policy::Benchmark)
        .without_cache_file()
        .cache_file(&path);
    let k = Arc::new(key("GPU X|sm90|cudnn91400", vec![0, 1, 2, 3]));
    let p = pick("eng12_k2=1_k5=0", 4096, 0.125);
    t.cache.insert(
        (*k).clone(),
        Arc::new(Entry {
            ranking: vec![(1, 0, 0.5)],
            graph: Some(p.clone()),
        }),
    );
    t.save().unwrap();
    let graph_in_file = || {
        let fresh = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .cache_file(&path);
        fresh.cache.get(&*k).and_then(|e| e.graph.clone())
    };
    assert_eq!(graph_in_file(), Some(p.clone()));

    let misaligned = Error::invalid("graph buffer alignment", "16 bytes", "address 0x4");
    assert!(is_graph_only_refusal(&misaligned));
    let r = t.graph_failed(&k, "forward", &p.config, misaligned);
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert_eq!(t.cache[&*k].graph, Some(p.clone()));
    assert_eq!(graph_in_file(), Some(p.clone()));
    assert_eq!(t.stats().fallbacks, 1);

    let short = Error::BufferTooSmall {
        name: "y",
        len: 1,
        required: 2,
    };
    let r = t.graph_failed(&k, "forward", &p.config, short);
    assert!(matches!(r, Err(Error::BufferTooSmall { .. })), "{r:?}");
    assert_eq!(t.cache[&*k].graph, Some(p.clone()));

    let refused = Error::Cudnn {
        status: crate::Status::NOT_SUPPORTED,
        function: "cudnnBackendExecute",
        message: String::new(),
    };
    let r = t.graph_failed(&k, "forward", &p.config, refused);
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert_eq!(t.cache[&*k].graph, None);
    assert_eq!(t.cache[&*k].ranking, vec![(1, 0, 0.5)]);
    assert_eq!(graph_in_file(), None);
    assert_eq!(t.stats().fallbacks, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tuner_is_send() {
    fn send<T: Send>() {}
    send::<Autotuner>();
    send::<Choice<ConvFwdAlgo>>();
}

#[test]
fn policies_have_distinct_codes() {
    let all = [
        Policy::Heuristic,
        Policy::Benchmark,
        Policy::Deterministic,
        Policy::Fixed(FixedAlgos::default()),
    ];
    let codes: std::collections::HashSet<i64> = all.iter().map(|p| p.code()).collect();
    assert_eq!(codes.len(), all.len());
}

#[test]
fn search_effort_presets_set_their_knobs() {
    let t = Autotuner::new(Policy::Benchmark).without_cache_file();
    assert_eq!(t.effort(), SearchEffort::Thorough);
    assert_eq!(
        (t.graph_plans(), t.refine_knobs(), t.finalists()),
        (DEFAULT_GRAPH_PLANS, DEFAULT_REFINE_KNOBS, DEFAULT_FINALISTS)
    );
    let q = t.with_effort(SearchEffort::Quick);
    assert_eq!(q.effort(), SearchEffort::Quick);
    assert_eq!(
        (q.graph_plans(), q.refine_knobs(), q.finalists()),
        (QUICK_GRAPH_PLANS, 0, 0)
    );
    assert_eq!(q.effort.find_runs(), 1);
    assert!(q.effort.carries_winners() && !q.effort.every_source());
    // A knob set after the preset overrides it; the preset set again restores its values.
    let q = q.with_finalists(2);
    assert_eq!((q.effort(), q.finalists()), (SearchEffort::Quick, 2));
    let t = q.with_effort(SearchEffort::Thorough);
    assert_eq!(t.finalists(), DEFAULT_FINALISTS);
    assert_eq!(t.effort.find_runs(), 2);
    assert!(!t.effort.carries_winners() && t.effort.every_source());
    for e in [SearchEffort::Thorough, SearchEffort::Quick] {
        assert_eq!(e.name().parse::<SearchEffort>().unwrap(), e);
    }
    let err = "fast".parse::<SearchEffort>().unwrap_err();
    assert!(err.to_string().contains("search effort"), "{err}");
}

#[test]
fn winners_are_remembered_most_recent_last_and_capped() {
    let c = |i: usize| Arc::new(format!("eng{i}_k2=1").parse::<EngineConfig>().unwrap());
    let mut won = Vec::new();
    for i in 0..MAX_CARRIED + 2 {
        remember_winner(&mut won, &c(i));
    }
    let names: Vec<String> = won.iter().map(|c| c.to_string()).collect();
    let want: Vec<String> = (2..MAX_CARRIED + 2).map(|i| c(i).to_string()).collect();
    assert_eq!(names, want, "the oldest leave first");
    // A winner again moves to the end and is not held twice.
    remember_winner(&mut won, &c(3));
    assert_eq!(won.len(), MAX_CARRIED);
    assert_eq!(won.last().unwrap().to_string(), c(3).to_string());
    assert_eq!(won.iter().filter(|w| ***w == *c(3)).count(), 1);
}

#[test]
fn problem_kinds_are_the_key_head() {
    let k = key("dev", vec![1, 2, 2, 0, 1, 7, 8, 9]);
    assert_eq!(kind_of(&k), [1, 2, 2, 0, 1]);
    let short = key("dev", vec![2, 3]);
    assert_eq!(kind_of(&short), [2, 3, -1, -1, -1]);
}

#[test]
fn only_a_far_slower_legacy_favourite_skips_its_timing() {
    // bf16 backward data: ALGO_0 at 6.8 ms per launch against a 0.011 ms graph plan.
    assert!(legacy_hopeless(Some(0.011), 6.8));
    // Close calls, a failed warm-up (NaN) or no plan timed: the legacy favourite is timed.
    assert!(!legacy_hopeless(Some(0.1), 0.29));
    assert!(!legacy_hopeless(Some(0.1), f32::NAN));
    assert!(!legacy_hopeless(None, 6.8));
    assert!(!legacy_hopeless(Some(0.0), 6.8));
}
