//! Tests of the backend (graph) API: the host-side graph builder (shapes, layouts, validation
//! with the real cuDNN library, no GPU needed) and, on a GPU, every operation kind and fused
//! graphs against f64 CPU references, the plan filters, the workspace limit, rejected bindings
//! (outputs untouched), variant-pack reuse, autotuning and the plan cache.
//!
//! Host data is kept in logical row-major order and reaches the device through the graph's
//! strides (gaps hold a sentinel); outputs are poisoned with NaN before each execution.
//! Without a GPU every GPU test prints `skipping: <why>` and passes (unless
//! `CUDNN_SAFE_REQUIRE_GPU=1`). Host tests need the cuDNN library (`CUDNN_SAFE_LIBRARY`); without
//! it they skip too.
mod common;

use std::sync::Arc;

use common::graph_io::{fetch, poisoned, upload};
use common::{assert_untouched, download, gpu, have_cudnn, sentinel_buffer, tol, Rng};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::graph::{
    autotune, Args, ConvParams, EngineConfig, Graph, HeurMode, NumericalNote, OperationGraph, Plan,
    PlanCache, PlanFilter, PointwiseMode, TensorId,
};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::reduce::ReduceOp;
use cudnn_safe::tune;
use cudnn_safe::{Cudnn, DType, DataType, Error, Status, Workspace};

// ---------------------------------------------------------------------------------------------
// Host-only tests
// ---------------------------------------------------------------------------------------------

/// The first line of a graph plan cache file (the format's version and kind; what follows the
/// colon describes the columns).
const PLAN_FILE_HEADER: &str = "# cudnn-safe cache v2 graph:";

/// A [`PlanCache::key`] as the cache file writes it: the device, a tab, the filter and
/// signature.
fn file_key(key: &str) -> String {
    key.replacen(" | ", "\t", 1)
}

fn conv_graph(dtype: DType, nhwc: bool) -> (Graph, TensorId, TensorId, TensorId) {
    let mut g = Graph::new(dtype, DType::F32, DType::F32);
    let (x, w) = if nhwc {
        (
            g.tensor_nhwc("x", &[2, 8, 10, 9], dtype).unwrap(),
            g.tensor_nhwc("w", &[16, 8, 3, 3], dtype).unwrap(),
        )
    } else {
        (
            g.tensor_nchw("x", &[2, 8, 10, 9], dtype).unwrap(),
            g.tensor_nchw("w", &[16, 8, 3, 3], dtype).unwrap(),
        )
    };
    let y = g
        .conv_fprop(
            x,
            w,
            &ConvParams::new(2)
                .with_padding(&[1, 1])
                .with_strides(&[2, 1]),
        )
        .unwrap();
    g.mark_output(y).unwrap();
    (g, x, w, y)
}

#[test]
fn host_output_dims_and_layouts() {
    // Output extent (i + pre + post - ((k - 1)·d + 1)) / s + 1, in x's memory order.
    let (g, _, _, y) = conv_graph(DType::F16, true);
    assert_eq!(g.dims(y).unwrap(), &[2, 16, 5, 9]);
    assert_eq!(g.strides(y).unwrap(), &[5 * 9 * 16, 1, 9 * 16, 16]);
    assert_eq!(g.dtype(y).unwrap(), DType::F16);
    assert!(!g.is_virtual(y).unwrap());
    let (g, _, _, y) = conv_graph(DType::F32, false);
    assert_eq!(g.strides(y).unwrap(), &[16 * 45, 45, 9, 1]);

    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[1, 2, 9, 9], DType::F32).unwrap();
    let w = g.tensor_nchw("w", &[3, 2, 3, 3], DType::F32).unwrap();
    let p = ConvParams::new(2)
        .with_pre_padding(&[0, 2])
        .with_post_padding(&[1, 0])
        .with_dilations(&[2, 3])
        .with_strides(&[3, 1]);
    let y = g.conv_fprop(x, w, &p).unwrap();
    // h: (9 + 0 + 1 - 5) / 3 + 1 = 2; w: (9 + 2 + 0 - 7) / 1 + 1 = 5.
    assert_eq!(g.dims(y).unwrap(), &[1, 3, 2, 5]);
    assert!(g.is_virtual(y).unwrap());
    assert_eq!(g.dtype(y).unwrap(), DType::F32);

    // Backward filter of an NHWC x is KRSC.
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[2, 4, 6, 6], DType::F16).unwrap();
    let dy = g.tensor_nhwc("dy", &[2, 8, 6, 6], DType::F16).unwrap();
    let p = ConvParams::new(2).with_padding(&[1, 1]);
    let dw = g.conv_wgrad(x, dy, &[8, 4, 3, 3], &p).unwrap();
    assert_eq!(g.strides(dw).unwrap(), &[36, 1, 12, 4]);
    let w = g.tensor_nhwc("w", &[8, 4, 3, 3], DType::F16).unwrap();
    let dx = g.conv_dgrad(dy, w, &[2, 4, 6, 6], &p).unwrap();
    assert_eq!(g.strides(dx).unwrap(), &[144, 1, 24, 4]);

    // Matmul with a broadcast batch; pointwise broadcast; reduction.
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[4, 5, 6], DType::F32).unwrap();
    let b = g.tensor_nchw("b", &[1, 6, 7], DType::F32).unwrap();
    let c = g.matmul(a, b).unwrap();
    assert_eq!(g.dims(c).unwrap(), &[4, 5, 7]);
    assert_eq!(g.strides(c).unwrap(), &[35, 7, 1]);
    let bias = g.tensor_nchw("bias", &[1, 1, 7], DType::F32).unwrap();
    let cb = g.bias(c, bias).unwrap();
    assert_eq!(g.dims(cb).unwrap(), &[4, 5, 7]);
    let r = g.reduction(ReduceOp::Add, cb, &[1, 5, 1]).unwrap();
    assert_eq!(g.dims(r).unwrap(), &[1, 5, 1]);
    // Unique ids follow creation order: a, b, c, bias, cb, r.
    assert_eq!(r.uid(), 6);
}

/// A leaky ReLU slope other than 0 is refused when the graph is built (the H200's engines
/// ignored it), naming the tensor; slope 0 (plain ReLU) is accepted.
#[test]
fn host_leaky_relu_slope_is_refused() {
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[1, 8, 4, 4], DType::F16).unwrap();
    let r = g.pointwise(PointwiseMode::LeakyRelu { slope: 0.1 }, x, None);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    assert!(format!("{:?}", r.unwrap_err()).contains("`x`"));
    assert!(g
        .pointwise(PointwiseMode::LeakyRelu { slope: 0.0 }, x, None)
        .is_ok());
}

#[test]
fn host_shape_errors_name_the_tensors() {
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[2, 6, 8, 8], DType::F32).unwrap();
    let w_bad_c = g.tensor_nchw("w_bad_c", &[4, 4, 3, 3], DType::F32).unwrap();
    let w_big = g.tensor_nchw("w_big", &[4, 6, 9, 9], DType::F32).unwrap();
    let w3 = g.tensor_nchw("w3", &[4, 6, 3], DType::F32).unwrap();
    let p = ConvParams::new(2);
    let r = g.conv_fprop(x, w_bad_c, &p);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    assert!(format!("{:?}", r.unwrap_err()).contains("w_bad_c"));
    let r = g.conv_fprop(x, w_big, &p);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let r = g.conv_fprop(x, w3, &p);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    assert!(matches!(
        &g.conv_fprop(x, w_big, &ConvParams::new(3)),
        Err(cudnn_safe::Error::ShapeMismatch { .. })
    ));
    for bad in [
        ConvParams::new(2).with_padding(&[-1, 0]),
        ConvParams::new(2).with_strides(&[0, 1]),
        ConvParams::new(2).with_dilations(&[1]),
    ] {
        let r = g.conv_fprop(x, w_big, &bad);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{bad:?}: {r:?}"
        );
    }
    // Backward shapes must be consistent with the forward relation.
    let w = g.tensor_nchw("w", &[4, 6, 3, 3], DType::F32).unwrap();
    let dy = g.tensor_nchw("dy", &[2, 4, 6, 6], DType::F32).unwrap();
    assert!(g.conv_dgrad(dy, w, &[2, 6, 8, 8], &p).is_ok());
    let r = g.conv_dgrad(dy, w, &[2, 6, 9, 8], &p);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let r = g.conv_wgrad(x, dy, &[4, 6, 5, 3], &p);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );

    let a = g.tensor_nchw("a", &[2, 3, 4], DType::F32).unwrap();
    let b = g.tensor_nchw("b", &[2, 5, 6], DType::F32).unwrap();
    let r = g.matmul(a, b);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let e = format!("{:#?}", r.unwrap_err());
    assert!(e.contains("\"a\"") && e.contains("\"b\""), "{e}");
    let b2 = g.tensor_nchw("b2", &[3, 4, 6], DType::F32).unwrap();
    assert!(matches!(
        &g.matmul(a, b2),
        Err(cudnn_safe::Error::ShapeMismatch { .. })
    ));
    let m2 = g.tensor_nchw("m2", &[3, 4], DType::F32).unwrap();
    assert!(matches!(
        &g.matmul(m2, m2),
        Err(cudnn_safe::Error::ShapeMismatch { .. })
    ));

    let c = g.tensor_nchw("c", &[2, 3, 5], DType::F32).unwrap();
    let r = g.pointwise(PointwiseMode::Add, a, Some(c));
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    // Arity mistakes.
    assert!(matches!(
        &g.pointwise(PointwiseMode::Add, a, None),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.pointwise(PointwiseMode::Relu, a, Some(a)),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.pointwise(PointwiseMode::ReluBwd, a, Some(a)),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.pointwise_bwd(PointwiseMode::Relu, a, a),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.pointwise_bwd(PointwiseMode::ReluBwd, a, c),
        Err(cudnn_safe::Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        &g.reduction(ReduceOp::Add, a, &[2, 2, 1]),
        Err(cudnn_safe::Error::ShapeMismatch { .. })
    ));
    assert!(matches!(
        &g.reduction(ReduceOp::Add, a, &[2, 1]),
        Err(cudnn_safe::Error::ShapeMismatch { .. })
    ));

    // Layout and data type validation.
    assert!(matches!(
        &g.tensor("z", &[2, 3], &[0, 1], DType::F32),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.tensor("z", &[2, 0], &[1, 1], DType::F32),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.tensor("z", &[2, 3], &[1], DType::F32),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.tensor_nchw("z", &[4], DType::I8),
        Err(cudnn_safe::Error::UnsupportedDataType { .. })
    ));
    assert!(matches!(
        &g.tensor("big", &[1 << 20, 1 << 12], &[1 << 12, 1], DType::F32),
        Err(cudnn_safe::Error::Overflow { .. })
    ));

    // Ids of another graph; outputs must be operation outputs.
    let mut other = Graph::new(DType::F32, DType::F32, DType::F32);
    let o = other.tensor_nchw("o", &[2, 3, 4], DType::F32).unwrap();
    assert!(matches!(
        &g.pointwise(PointwiseMode::Add, a, Some(o)),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.dims(o),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        &g.mark_output(a),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    let mut other2 = other.clone();
    let oy = other2.pointwise(PointwiseMode::Exp, o, None).unwrap();
    assert!(matches!(
        &other2.mark_output_as(oy, DType::I32),
        Err(cudnn_safe::Error::UnsupportedDataType { .. })
    ));
    assert!(matches!(
        &other2.mark_output_strided(oy, DType::F32, &[1, 1, 1]),
        Err(cudnn_safe::Error::OverlappingOutput { .. })
    ));
    other2
        .mark_output_strided(oy, DType::F32, &[24, 8, 2])
        .unwrap();
    assert_eq!(other2.strides(oy).unwrap(), &[24, 8, 2]);
}

#[test]
fn host_scalars_take_the_rank_of_their_first_use() {
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[2, 3, 4, 5], DType::F32).unwrap();
    let s = g.scalar("s", 0.5, DType::F32).unwrap();
    assert!(g.dims(s).unwrap().is_empty());
    let y = g.scale(x, s).unwrap();
    assert_eq!(g.dims(s).unwrap(), &[1, 1, 1, 1]);
    assert_eq!(g.dims(y).unwrap(), &[2, 3, 4, 5]);
    let v = g.tensor_nchw("v", &[2, 3], DType::F32).unwrap();
    let r = g.scale(v, s);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    // A scalar is never the first operand of a pointwise operation, nor a conv or matmul input.
    assert!(matches!(
        &g.pointwise(PointwiseMode::Relu, s, None),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    let mut g2 = Graph::new(DType::F32, DType::F32, DType::F32);
    let s2 = g2.scalar("s2", 1.0, DType::F16).unwrap();
    let w = g2.tensor_nchw("w", &[1, 1, 1, 1], DType::F32).unwrap();
    assert!(g2.conv_fprop(s2, w, &ConvParams::new(2)).is_err());
    assert!(matches!(
        &g2.scalar("bad", 1.0, DType::I32),
        Err(cudnn_safe::Error::UnsupportedDataType { .. })
    ));
}

#[test]
fn host_structure_is_checked_before_cudnn() {
    if !have_cudnn() {
        return;
    }
    // No operation.
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[1, 2, 3, 4], DType::F32).unwrap();
    assert!(matches!(
        &g.check(),
        Err(cudnn_safe::Error::InvalidArgument { .. })
    ));
    // An unused input.
    let y = g.pointwise(PointwiseMode::Tanh, x, None).unwrap();
    g.mark_output(y).unwrap();
    assert!(g.check().is_ok());
    let mut g2 = g.clone();
    g2.tensor_nchw("unused", &[4], DType::F32).unwrap();
    let e = g2.check().unwrap_err();
    assert!(e.to_string().contains("unused"), "{e}");
    // An operation output neither read nor marked as an output.
    let mut g3 = g.clone();
    g3.pointwise(PointwiseMode::Exp, x, None).unwrap();
    let e = g3.check().unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    // An unused scalar.
    let mut g4 = g.clone();
    g4.scalar("lonely", 2.0, DType::F32).unwrap();
    assert!(g4.check().unwrap_err().to_string().contains("lonely"));
}

#[test]
fn host_every_operation_kind_finalizes() {
    if !have_cudnn() {
        return;
    }
    // Conv forward (NCHW f32, NHWC f16 / bf16) fused with bias and relu.
    for (dt, nhwc) in [(DType::F32, false), (DType::F16, true), (DType::BF16, true)] {
        let (g, ..) = conv_graph(dt, nhwc);
        common::check_with_record(&g).unwrap();
        let mut g = Graph::new(dt, DType::F32, DType::F32);
        let x = g.tensor_nhwc("x", &[2, 8, 6, 6], dt).unwrap();
        let w = g.tensor_nhwc("w", &[16, 8, 3, 3], dt).unwrap();
        let b = g.tensor_nhwc("b", &[1, 16, 1, 1], dt).unwrap();
        let y = g
            .conv_fprop(x, w, &ConvParams::new(2).with_padding(&[1, 1]))
            .unwrap();
        let y = g.bias(y, b).unwrap();
        let y = g.pointwise(PointwiseMode::Relu, y, None).unwrap();
        g.mark_output(y).unwrap();
        common::check_with_record(&g).unwrap();
    }
    // Backward data and filter.
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let dy = g.tensor_nchw("dy", &[2, 4, 5, 5], DType::F32).unwrap();
    let w = g.tensor_nchw("w", &[4, 3, 3, 3], DType::F32).unwrap();
    let x = g.tensor_nchw("x", &[2, 3, 5, 5], DType::F32).unwrap();
    let p = ConvParams::new(2).with_padding(&[1, 1]);
    let dx = g.conv_dgrad(dy, w, &[2, 3, 5, 5], &p).unwrap();
    let dw = g.conv_wgrad(x, dy, &[4, 3, 3, 3], &p).unwrap();
    g.mark_output(dx).unwrap();
    g.mark_output(dw).unwrap();
    common::check_with_record(&g).unwrap();
    // Matmul + bias + gelu, reduction, every pointwise mode.
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[2, 8, 16], DType::F16).unwrap();
    let b = g.tensor_nchw("b", &[2, 16, 8], DType::F16).unwrap();
    let bias = g.tensor_nchw("bias", &[1, 1, 8], DType::F16).unwrap();
    let c = g.matmul(a, b).unwrap();
    let c = g.bias(c, bias).unwrap();
    let c = g.pointwise(PointwiseMode::Gelu, c, None).unwrap();
    g.mark_output(c).unwrap();
    let r = g.reduction(ReduceOp::Max, c, &[1, 8, 1]).unwrap();
    g.mark_output_as(r, DType::F32).unwrap();
    common::check_with_record(&g).unwrap();
    // Broadcast batch on either operand: described with stride 0 on the broadcast dimension.
    for (ad, bd) in [([3i64, 8, 16], [1i64, 16, 8]), ([1, 8, 16], [3, 16, 8])] {
        let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
        let a = g.tensor_nchw("a", &ad, DType::F16).unwrap();
        let b = g.tensor_nchw("b", &bd, DType::F16).unwrap();
        let c = g.matmul(a, b).unwrap();
        assert_eq!(g.dims(c).unwrap(), &[3, 8, 8]);
        g.mark_output(c).unwrap();
        common::check_with_record(&g).unwrap_or_else(|e| panic!("broadcast {ad:?} x {bd:?}: {e}"));
    }
    for mode in UNARY.iter().chain(BINARY).chain(BACKWARD) {
        let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
        let x = g.tensor_nchw("x", &[2, 3, 4], DType::F32).unwrap();
        let y = match mode.is_backward() {
            true => {
                let dy = g.tensor_nchw("dy", &[2, 3, 4], DType::F32).unwrap();
                g.pointwise_bwd(*mode, dy, x).unwrap()
            }
            false if mode.is_binary() => {
                let b = g.tensor_nchw("b", &[1, 3, 1], DType::F32).unwrap();
                g.pointwise(*mode, x, Some(b)).unwrap()
            }
            false => g.pointwise(*mode, x, None).unwrap(),
        };
        g.mark_output(y).unwrap();
        common::check_with_record(&g).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
    }
}

#[test]
fn host_matmul_broadcast_operands() {
    // Output batch = the larger extent; an extent of 1 on either side broadcasts.
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[1, 4, 8], DType::F16).unwrap();
    let b = g.tensor_nchw("b", &[5, 8, 2], DType::F16).unwrap();
    let c = g.matmul(a, b).unwrap();
    assert_eq!(g.dims(c).unwrap(), &[5, 4, 2]);
    // Extents that are neither equal nor 1.
    let a3 = g.tensor_nchw("a3", &[3, 4, 8], DType::F16).unwrap();
    let r = g.matmul(a3, b);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    // An operation's output may not be the broadcast operand (its one descriptor would need
    // the expanded batch).
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[1, 4, 8], DType::F16).unwrap();
    let relu_a = g.pointwise(PointwiseMode::Relu, a, None).unwrap();
    let b = g.tensor_nchw("b", &[5, 8, 2], DType::F16).unwrap();
    let r = g.matmul(relu_a, b);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    // Equal batches are fine for an operation's output.
    let b1 = g.tensor_nchw("b1", &[1, 8, 2], DType::F16).unwrap();
    assert!(g.matmul(relu_a, b1).is_ok());
    if !have_cudnn() {
        return;
    }
    // A broadcast operand read by a second operation is refused before cuDNN sees it.
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[3, 4, 8], DType::F16).unwrap();
    let b = g.tensor_nchw("shared_b", &[1, 8, 2], DType::F16).unwrap();
    let c = g.matmul(a, b).unwrap();
    g.mark_output(c).unwrap();
    let rb = g.pointwise(PointwiseMode::Relu, b, None).unwrap();
    g.mark_output(rb).unwrap();
    let e = g.check().unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(e.to_string().contains("shared_b"), "{e}");
}

#[test]
fn host_types_are_send() {
    common::assert_send::<Graph>();
    common::assert_send::<OperationGraph>();
    common::assert_send::<Plan>();
    common::assert_send::<PlanCache>();
}

#[test]
fn host_signatures_and_engine_configs() {
    let (a, ..) = conv_graph(DType::F16, true);
    let (b, ..) = conv_graph(DType::F16, true);
    let (c, ..) = conv_graph(DType::F16, false);
    assert_eq!(a.signature(), b.signature());
    assert_ne!(a.signature(), c.signature());
    let scaled = |v: f64| {
        let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
        let x = g.tensor_nchw("x", &[4], DType::F32).unwrap();
        let s = g.scalar("s", v, DType::F32).unwrap();
        let y = g.scale(x, s).unwrap();
        g.mark_output(y).unwrap();
        g.signature()
    };
    assert_eq!(scaled(2.0), scaled(2.0));
    assert_ne!(scaled(2.0), scaled(3.0));

    let cfg: EngineConfig = "eng12_k2=1_k5=-3".parse().unwrap();
    assert_eq!(cfg.engine, 12);
    assert_eq!(cfg.knobs, vec![(2, 1), (5, -3)]);
    assert_eq!(cfg.to_string(), "eng12_k2=1_k5=-3");
    assert_eq!("eng7".parse::<EngineConfig>().unwrap().knobs, vec![]);
    for bad in [
        "",
        "eng",
        "engx",
        "eng-1",
        "eng1_k2",
        "eng1_kx=1",
        "eng1_2=3",
    ] {
        assert!(bad.parse::<EngineConfig>().is_err(), "{bad}");
    }
    let f = PlanFilter::new()
        .with_heuristics(&[HeurMode::B])
        .with_deterministic(true)
        .with_workspace_limit(usize::MAX);
    assert_eq!(f.workspace_limit(), cudnn_safe::MAX_WORKSPACE_BYTES);
    assert_ne!(f, PlanFilter::default());
}

// ---------------------------------------------------------------------------------------------
// References
// ---------------------------------------------------------------------------------------------

/// The pointwise modes tested, by kind.
const UNARY: &[PointwiseMode] = &[
    PointwiseMode::Relu,
    PointwiseMode::LeakyRelu { slope: 0.0 },
    PointwiseMode::Gelu,
    PointwiseMode::GeluTanh,
    PointwiseMode::Sigmoid,
    PointwiseMode::Tanh,
    PointwiseMode::Swish { beta: 1.0 },
    PointwiseMode::Elu { alpha: 0.7 },
    PointwiseMode::Softplus { beta: 1.0 },
    PointwiseMode::Exp,
    PointwiseMode::Log,
    PointwiseMode::Sqrt,
    PointwiseMode::Rsqrt,
    PointwiseMode::Neg,
    PointwiseMode::Abs,
    PointwiseMode::Reciprocal,
    PointwiseMode::Erf,
    PointwiseMode::Identity,
];
const BINARY: &[PointwiseMode] = &[
    PointwiseMode::Add,
    PointwiseMode::Sub,
    PointwiseMode::Mul,
    PointwiseMode::Div,
    PointwiseMode::Min,
    PointwiseMode::Max,
];
const BACKWARD: &[PointwiseMode] = &[
    PointwiseMode::ReluBwd,
    PointwiseMode::GeluBwd,
    PointwiseMode::GeluTanhBwd,
    PointwiseMode::SigmoidBwd,
    PointwiseMode::TanhBwd,
    PointwiseMode::SwishBwd { beta: 1.0 },
    PointwiseMode::EluBwd { alpha: 0.7 },
    PointwiseMode::SoftplusBwd { beta: 1.0 },
];

/// erf by its Maclaurin series (|x| < 5: error far below 1e-12 in f64), ±1 beyond.
fn erf(x: f64) -> f64 {
    if x.abs() >= 5.0 {
        return x.signum();
    }
    let (mut term, mut sum) = (x, x);
    for n in 1..200 {
        term *= -x * x / n as f64;
        let add = term / (2 * n + 1) as f64;
        sum += add;
        if add.abs() < 1e-17 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

const GELU_C: f64 = 0.797_884_560_802_865_4; // sqrt(2 / pi)

/// The forward value of a unary mode.
fn unary_ref(m: PointwiseMode, x: f64) -> f64 {
    use PointwiseMode as P;
    match m {
        P::Relu => x.max(0.0),
        P::LeakyRelu { slope } => {
            if x > 0.0 {
                x
            } else {
                slope * x
            }
        }
        P::Gelu => 0.5 * x * (1.0 + erf(x / 2f64.sqrt())),
        P::GeluTanh => 0.5 * x * (1.0 + (GELU_C * (x + 0.044715 * x * x * x)).tanh()),
        P::Sigmoid => sigmoid(x),
        P::Tanh => x.tanh(),
        P::Swish { beta } => x * sigmoid(beta * x),
        P::Elu { alpha } => {
            if x > 0.0 {
                x
            } else {
                alpha * (x.exp() - 1.0)
            }
        }
        P::Softplus { beta } => (1.0 + (beta * x).exp()).ln() / beta,
        P::Exp => x.exp(),
        P::Log => x.ln(),
        P::Sqrt => x.sqrt(),
        P::Rsqrt => 1.0 / x.sqrt(),
        P::Neg => -x,
        P::Abs => x.abs(),
        P::Reciprocal => 1.0 / x,
        P::Erf => erf(x),
        P::Identity => x,
        other => panic!("not unary: {other:?}"),
    }
}

fn binary_ref(m: PointwiseMode, x: f64, b: f64) -> f64 {
    use PointwiseMode as P;
    match m {
        P::Add => x + b,
        P::Sub => x - b,
        P::Mul => x * b,
        P::Div => x / b,
        P::Min => x.min(b),
        P::Max => x.max(b),
        other => panic!("not binary: {other:?}"),
    }
}

/// `dx` of a backward mode: the forward mode's derivative at `x`, times `dy`.
fn backward_ref(m: PointwiseMode, dy: f64, x: f64) -> f64 {
    use PointwiseMode as P;
    let d = match m {
        P::ReluBwd => {
            if x > 0.0 {
                1.0
            } else {
                0.0
            }
        }
        P::GeluBwd => {
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            0.5 * (1.0 + erf(x / 2f64.sqrt())) + x * pdf
        }
        P::GeluTanhBwd => {
            let t = (GELU_C * (x + 0.044715 * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044715 * x * x)
        }
        P::SigmoidBwd => sigmoid(x) * (1.0 - sigmoid(x)),
        P::TanhBwd => 1.0 - x.tanh() * x.tanh(),
        P::SwishBwd { beta } => {
            let s = sigmoid(beta * x);
            s + beta * x * s * (1.0 - s)
        }
        P::EluBwd { alpha } => {
            if x > 0.0 {
                1.0
            } else {
                alpha * x.exp()
            }
        }
        P::SoftplusBwd { beta } => sigmoid(beta * x),
        other => panic!("not backward: {other:?}"),
    };
    dy * d
}

/// 2-D convolution geometry (cross-correlation, one group), logical NCHW / KCRS indexing.
struct Conv {
    x: [i64; 4],
    w: [i64; 4],
    pad: [i64; 2],
    stride: [i64; 2],
    dil: [i64; 2],
}

impl Conv {
    fn params(&self) -> ConvParams {
        ConvParams::new(2)
            .with_padding(&self.pad)
            .with_strides(&self.stride)
            .with_dilations(&self.dil)
    }
    fn y(&self) -> [i64; 4] {
        let o = |a: usize| {
            (self.x[a + 2] + 2 * self.pad[a] - ((self.w[a + 2] - 1) * self.dil[a] + 1))
                / self.stride[a]
                + 1
        };
        [self.x[0], self.w[0], o(0), o(1)]
    }
    /// Calls `f(x_index, w_index, y_index)` (flat logical indices) for every term of the sum.
    fn for_each_term(&self, mut f: impl FnMut(usize, usize, usize)) {
        let [n, c, h, w] = self.x;
        let [k, _, r, s] = self.w;
        let [_, _, oh, ow] = self.y();
        for ni in 0..n {
            for ki in 0..k {
                for p in 0..oh {
                    for q in 0..ow {
                        let yi = ((ni * k + ki) * oh + p) * ow + q;
                        for ci in 0..c {
                            for ri in 0..r {
                                let hi = p * self.stride[0] - self.pad[0] + ri * self.dil[0];
                                if hi < 0 || hi >= h {
                                    continue;
                                }
                                for si in 0..s {
                                    let wi = q * self.stride[1] - self.pad[1] + si * self.dil[1];
                                    if wi < 0 || wi >= w {
                                        continue;
                                    }
                                    let xi = ((ni * c + ci) * h + hi) * w + wi;
                                    let fi = ((ki * c + ci) * r + ri) * s + si;
                                    f(xi as usize, fi as usize, yi as usize);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn count(d: &[i64]) -> usize {
    d.iter().product::<i64>() as usize
}

// ---------------------------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------------------------

/// Checks `got` against `want`: `|g − w| ≤ tol·(1 + |w|)`, finite.
fn check<T: DataType>(what: &str, got: &[T], want: &[f64], tol: f64) {
    common::assert_close(what, got, want, tol)
}

/// Tolerance for a plan's results stored as `T`: the type's, or TF32's (~5e-3) for f32 data on
/// tensor cores, or 1e-3 for Winograd / FFT engines (their transforms lose a few bits in f32).
fn plan_tol<T: DataType>(plan: &Plan) -> f64 {
    let mut t = tol::<T>();
    if T::DTYPE == DType::F32 {
        if plan.uses_tensor_cores() {
            t = t.max(5e-3);
        }
        let n = plan.numerical_notes();
        if n.contains(&NumericalNote::Winograd) || n.contains(&NumericalNote::Fft) {
            t = t.max(1e-3);
        }
    }
    t
}

fn values<T: DataType>(rng: &mut Rng, n: usize) -> (Vec<T>, Vec<f64>) {
    let v: Vec<T> = rng.values(n);
    let f = v.iter().map(|x| x.to_f64()).collect();
    (v, f)
}

/// Builds the graph's plans under `filter`, at most `max` of them.
fn some_plans(cudnn: &Cudnn, og: &OperationGraph, filter: PlanFilter, max: usize) -> Vec<Plan> {
    let list = og
        .plans(cudnn, &filter.with_max_plans(Some(max)))
        .unwrap_or_else(|e| panic!("no plan: {e}"));
    assert!(!list.plans.is_empty());
    for p in &list.plans {
        eprintln!(
            "  plan {} ws {} notes {:?}",
            p.name(),
            p.workspace_size(),
            p.numerical_notes()
        );
    }
    list.plans
}

/// Binds `ins` and `outs` and executes `plan`.
fn run<T: DataType>(
    cudnn: &Cudnn,
    plan: &Plan,
    ins: &[(TensorId, &CudaSlice<T>)],
    outs: &mut [(TensorId, &mut CudaSlice<T>)],
    ws: &mut Workspace,
) -> cudnn_safe::Result<()> {
    let mut args = Args::new(cudnn);
    for (t, b) in ins {
        args.input(*t, *b)?;
    }
    for (t, b) in outs.iter_mut() {
        args.output(*t, &mut **b)?;
    }
    cudnn.execute(plan, &args, ws)
}

fn conv_geometry() -> Conv {
    Conv {
        x: [2, 8, 7, 6],
        w: [8, 8, 3, 3],
        pad: [1, 1],
        stride: [1, 2],
        dil: [1, 1],
    }
}

fn input<T: DataType>(g: &mut Graph, name: &'static str, dims: &[i64], nhwc: bool) -> TensorId {
    if nhwc {
        g.tensor_nhwc(name, dims, T::DTYPE).unwrap()
    } else {
        g.tensor_nchw(name, dims, T::DTYPE).unwrap()
    }
}

// ---------------------------------------------------------------------------------------------
// GPU: convolution
// ---------------------------------------------------------------------------------------------

/// A convolution forward graph on uploaded random inputs with its f64 reference.
struct FpropFixture<T: DataType> {
    s: Arc<CudaStream>,
    cudnn: Cudnn,
    og: OperationGraph,
    ids: [TensorId; 3],
    xb: CudaSlice<T>,
    wb: CudaSlice<T>,
    want: Vec<f64>,
    ws: Workspace,
}

impl<T: DataType> FpropFixture<T> {
    fn new(geo: &Conv, nhwc: bool, seed: u64) -> Option<Self> {
        let (s, cudnn) = gpu()?;
        let mut rng = Rng::new(seed);
        let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
        let x = input::<T>(&mut g, "x", &geo.x, nhwc);
        let w = input::<T>(&mut g, "w", &geo.w, nhwc);
        let y = g.conv_fprop(x, w, &geo.params()).unwrap();
        g.mark_output(y).unwrap();
        assert_eq!(g.dims(y).unwrap(), &geo.y());
        let og = g.build(&cudnn).unwrap();
        let (xv, xf) = values::<T>(&mut rng, count(&geo.x));
        let (wv, wf) = values::<T>(&mut rng, count(&geo.w));
        let mut want = vec![0.0; count(&geo.y())];
        geo.for_each_term(|xi, fi, yi| want[yi] += xf[xi] * wf[fi]);
        let xb = upload(&s, &og, x, &xv);
        let wb = upload(&s, &og, w, &wv);
        let ws = Workspace::new(s.clone());
        Some(FpropFixture {
            s,
            cudnn,
            og,
            ids: [x, w, y],
            xb,
            wb,
            want,
            ws,
        })
    }

    /// Runs `plan` on a poisoned output and checks it against the reference.
    fn check_plan(&mut self, plan: &Plan, what: &str) {
        let [x, w, y] = self.ids;
        let mut yb = poisoned::<T>(&self.s, &self.og, y);
        run(
            &self.cudnn,
            plan,
            &[(x, &self.xb), (w, &self.wb)],
            &mut [(y, &mut yb)],
            &mut self.ws,
        )
        .unwrap();
        let got = fetch(&self.s, &self.og, y, &yb);
        check(
            &format!("conv fprop {} {what} {}", T::DTYPE, plan.name()),
            &got,
            &self.want,
            plan_tol::<T>(plan),
        );
    }
}

fn conv_fprop_case<T: DataType>(nhwc: bool, filter: PlanFilter, seed: u64) {
    let Some(mut f) = FpropFixture::<T>::new(&conv_geometry(), nhwc, seed) else {
        return;
    };
    for plan in some_plans(&f.cudnn, &f.og, filter.clone(), 3) {
        f.check_plan(&plan, "");
    }
}

/// Every knob neighbour of the first heuristic plans that builds computes the convolution
/// (against f64, output poisoned), and the heuristics' own knob values lie in the ranges the
/// engines report.
fn conv_knob_neighbours_case<T: DataType>(nhwc: bool, filter: PlanFilter, seed: u64) {
    let geo = Conv {
        x: [2, 16, 12, 10],
        w: [16, 16, 3, 3],
        pad: [1, 1],
        stride: [1, 1],
        dil: [1, 1],
    };
    let Some(mut f) = FpropFixture::<T>::new(&geo, nhwc, seed) else {
        return;
    };
    let mut checked = 0;
    for seed_plan in some_plans(&f.cudnn, &f.og, filter.clone(), 3) {
        let config = seed_plan.config().clone();
        let ranges = f.og.knob_ranges(&f.cudnn, config.engine).unwrap();
        for (k, v) in &config.knobs {
            let r = ranges.iter().find(|r| r.knob == *k);
            assert!(
                r.is_some_and(|r| r.contains(*v)),
                "{config}: knob {k} = {v} outside the engine's ranges {ranges:?}"
            );
        }
        let neighbours = f.og.knob_neighbours(&f.cudnn, &config).unwrap();
        assert!(neighbours
            .iter()
            .all(|n| n.engine == config.engine && *n != config));
        for n in neighbours.iter().take(24) {
            let Ok(plan) = f.og.plan_from_config(&f.cudnn, n) else {
                continue;
            };
            if filter
                .refuse(plan.numerical_notes(), plan.behavior_notes())
                .is_some()
                || plan.workspace_size() > filter.workspace_limit()
            {
                continue;
            }
            f.check_plan(&plan, "knob neighbour");
            checked += 1;
        }
    }
    eprintln!("{checked} knob neighbours checked");
    assert!(checked > 0, "no knob neighbour of the first plans built");
}

/// `graph::preload` opens the sub-libraries next to the loaded cuDNN and builds a plan; a plan
/// built afterwards still runs correctly.
#[test]
fn gpu_preload_opens_sub_libraries_and_builds_a_plan() {
    let Some((_s, cudnn)) = gpu() else { return };
    let p = cudnn_safe::graph::preload(&cudnn).unwrap();
    eprintln!("{p:?}");
    assert!(p.engine.starts_with("eng"), "{p:?}");
    if cfg!(target_os = "linux") {
        assert!(p.libraries > 0, "no sub-library opened: {p:?}");
    }
    // Preloading twice is harmless.
    assert!(cudnn_safe::graph::preload(&cudnn).is_ok());
    conv_fprop_case::<f32>(false, PlanFilter::new().with_no_tensor_cores(true), 63);
}

/// Plans finalized on several threads at once come back as one thread builds them: the same
/// configurations in the same order, each running correctly.
#[test]
fn gpu_plans_built_at_once_match_one_thread() {
    let Some((_s, cudnn)) = gpu() else { return };
    let (g, ..) = conv_graph(DType::F16, true);
    let og = g.build(&cudnn).unwrap();
    let filter = PlanFilter::new()
        .with_heuristics(&[HeurMode::A, HeurMode::Fallback])
        .with_max_plans(Some(6));
    let names = |threads| {
        cudnn_safe::graph::set_build_threads(threads);
        let list = og.plans(&cudnn, &filter).unwrap();
        list.plans.iter().map(|p| p.name()).collect::<Vec<_>>()
    };
    let one = names(1);
    let many = names(6);
    cudnn_safe::graph::set_build_threads(0);
    assert!(one.len() > 1, "{one:?}");
    assert_eq!(one, many);
    // The plans built at once compute what the reference does.
    conv_fprop_case::<f16>(true, PlanFilter::new(), 73);
}

#[test]
fn gpu_conv_knob_neighbours_f16_nhwc() {
    conv_knob_neighbours_case::<f16>(true, PlanFilter::new(), 61);
}

#[test]
fn gpu_conv_knob_neighbours_f32_tf32() {
    conv_knob_neighbours_case::<f32>(false, PlanFilter::new(), 62);
}

/// Engine configurations are data to check: an engine index the graph does not have, a knob
/// the engine does not have, a value outside its range or a knob chosen twice is refused with
/// `InvalidArgument` before it reaches cuDNN; a plan cache file naming one is skipped by the
/// warm-up, and the graph gets a plan from the heuristics instead.
#[test]
fn gpu_configs_outside_their_engine_are_refused() {
    let Some(mut f) = FpropFixture::<f32>::new(&conv_geometry(), false, 64) else {
        return;
    };
    let filter = PlanFilter::new();
    let good = some_plans(&f.cudnn, &f.og, filter.clone(), 1)[0]
        .config()
        .clone();
    let ranges = f.og.knob_ranges(&f.cudnn, good.engine).unwrap();
    let count = f.og.engine_count(&f.cudnn).unwrap();
    let engine = |engine| EngineConfig {
        engine,
        knobs: Vec::new(),
    };
    let mut bad = vec![
        engine(count),
        engine(-1),
        engine(i64::MAX),
        good.with_knob(u32::MAX, 0),
    ];
    for r in ranges.iter().take(2) {
        bad.push(good.with_knob(r.knob, r.max.saturating_add(r.stride.max(1))));
        bad.push(good.with_knob(r.knob, r.min.saturating_sub(1)));
        let mut twice = good.with_knob(r.knob, r.min);
        twice.knobs.push((r.knob, r.min));
        bad.push(twice);
    }
    for c in &bad {
        let r = f.og.plan_from_config(&f.cudnn, c);
        assert!(
            matches!(r, Err(Error::InvalidArgument { .. })),
            "{c}: {r:?}"
        );
    }
    let rebuilt = f.og.plan_from_config(&f.cudnn, &good).unwrap();
    f.check_plan(&rebuilt, "rebuilt from its configuration");

    let dir = std::env::temp_dir().join(format!("cudnn-safe-badcfg-{}", std::process::id()));
    let path = dir.join("plans.txt");
    std::fs::create_dir_all(&dir).unwrap();
    let key = PlanCache::key(&f.cudnn, &f.og, &filter);
    let record = f.og.graph().to_json().unwrap();
    let tampered = bad.last().unwrap();
    let line = format!("{}\t{tampered}\t{record}", file_key(&key));
    std::fs::write(&path, format!("{PLAN_FILE_HEADER}\n{line}\n")).unwrap();
    let mut cache = PlanCache::new().try_cache_file(&path).unwrap();
    let warm = cache.warm_up(&f.cudnn, &mut f.ws).unwrap();
    assert_eq!((warm.replayed, warm.skipped.len()), (0, 1), "{warm:?}");
    let plan = cache.get_or_build(&f.cudnn, &f.og, &filter).unwrap();
    assert!(!bad.contains(plan.config()), "{}", plan.config());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains(&format!("\t{tampered}\t")), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpu_conv_fprop_f32_strict() {
    // No tensor cores: strict fp32 (FMA), so the fp32 tolerance holds.
    let f = PlanFilter::new()
        .with_no_tensor_cores(true)
        .with_deterministic(true)
        .with_all_engines(true);
    conv_fprop_case::<f32>(false, f, 1);
}

#[test]
fn gpu_conv_fprop_f32_nhwc_any_engine() {
    conv_fprop_case::<f32>(true, PlanFilter::new(), 2);
}

#[test]
fn gpu_conv_fprop_f16_nhwc() {
    conv_fprop_case::<f16>(true, PlanFilter::new(), 3);
}

#[test]
fn gpu_conv_fprop_bf16_nhwc() {
    conv_fprop_case::<bf16>(true, PlanFilter::new(), 4);
}

fn conv_backward_case<T: DataType>(nhwc: bool, filter: PlanFilter, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let geo = conv_geometry();
    let yd = geo.y();
    let mut rng = Rng::new(seed);
    let (xv, xf) = values::<T>(&mut rng, count(&geo.x));
    let (wv, wf) = values::<T>(&mut rng, count(&geo.w));
    let (dyv, dyf) = values::<T>(&mut rng, count(&yd));
    let mut want_dx = vec![0.0; count(&geo.x)];
    let mut want_dw = vec![0.0; count(&geo.w)];
    geo.for_each_term(|xi, fi, yi| {
        want_dx[xi] += dyf[yi] * wf[fi];
        want_dw[fi] += xf[xi] * dyf[yi];
    });

    // Backward data.
    let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
    let dy = input::<T>(&mut g, "dy", &yd, nhwc);
    let w = input::<T>(&mut g, "w", &geo.w, nhwc);
    let dx = g.conv_dgrad(dy, w, &geo.x, &geo.params()).unwrap();
    g.mark_output(dx).unwrap();
    let og = g.build(&cudnn).unwrap();
    let dyb = upload(&s, &og, dy, &dyv);
    let wb = upload(&s, &og, w, &wv);
    let mut ws = Workspace::new(s.clone());
    for plan in some_plans(&cudnn, &og, filter.clone(), 3) {
        let mut dxb = poisoned::<T>(&s, &og, dx);
        run(
            &cudnn,
            &plan,
            &[(dy, &dyb), (w, &wb)],
            &mut [(dx, &mut dxb)],
            &mut ws,
        )
        .unwrap();
        let got = fetch(&s, &og, dx, &dxb);
        check(
            &format!("dgrad {} {}", T::DTYPE, plan.name()),
            &got,
            &want_dx,
            plan_tol::<T>(&plan),
        );
    }

    // Backward filter.
    let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
    let x = input::<T>(&mut g, "x", &geo.x, nhwc);
    let dy = input::<T>(&mut g, "dy", &yd, nhwc);
    let dw = g.conv_wgrad(x, dy, &geo.w, &geo.params()).unwrap();
    g.mark_output(dw).unwrap();
    let og = g.build(&cudnn).unwrap();
    let xb = upload(&s, &og, x, &xv);
    let dyb = upload(&s, &og, dy, &dyv);
    for plan in some_plans(&cudnn, &og, filter, 3) {
        let mut dwb = poisoned::<T>(&s, &og, dw);
        run(
            &cudnn,
            &plan,
            &[(x, &xb), (dy, &dyb)],
            &mut [(dw, &mut dwb)],
            &mut ws,
        )
        .unwrap();
        let got = fetch(&s, &og, dw, &dwb);
        check(
            &format!("wgrad {} {}", T::DTYPE, plan.name()),
            &got,
            &want_dw,
            plan_tol::<T>(&plan),
        );
    }
}

#[test]
fn gpu_conv_backward_f32_strict() {
    // Strict fp32; determinism not required (some backward engines use atomics).
    let f = PlanFilter::new()
        .with_no_tensor_cores(true)
        .with_all_engines(true);
    conv_backward_case::<f32>(false, f, 5);
}

#[test]
fn gpu_conv_backward_f16_nhwc() {
    conv_backward_case::<f16>(true, PlanFilter::new(), 6);
}

#[test]
fn gpu_conv_backward_bf16_nhwc() {
    conv_backward_case::<bf16>(true, PlanFilter::new(), 7);
}

/// conv + per-channel bias + relu as one graph, half in and out, f32 inside.
fn fused_conv_case<T: DataType>(seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let geo = conv_geometry();
    let yd = geo.y();
    let mut rng = Rng::new(seed);
    let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
    let x = input::<T>(&mut g, "x", &geo.x, true);
    let w = input::<T>(&mut g, "w", &geo.w, true);
    let b = input::<T>(&mut g, "b", &[1, geo.w[0], 1, 1], true);
    let c = g.conv_fprop(x, w, &geo.params()).unwrap();
    let cb = g.bias(c, b).unwrap();
    let y = g.pointwise(PointwiseMode::Relu, cb, None).unwrap();
    g.set_name(y, "y").unwrap();
    g.mark_output(y).unwrap();
    let og = g.build(&cudnn).unwrap();
    let (xv, xf) = values::<T>(&mut rng, count(&geo.x));
    let (wv, wf) = values::<T>(&mut rng, count(&geo.w));
    let (bv, bf) = values::<T>(&mut rng, geo.w[0] as usize);
    let mut acc = vec![0.0; count(&yd)];
    geo.for_each_term(|xi, fi, yi| acc[yi] += xf[xi] * wf[fi]);
    let plane = (yd[2] * yd[3]) as usize;
    let want: Vec<f64> = acc
        .iter()
        .enumerate()
        .map(|(i, &v)| (v + bf[(i / plane) % yd[1] as usize]).max(0.0))
        .collect();
    let (xb, wb, bb) = (
        upload(&s, &og, x, &xv),
        upload(&s, &og, w, &wv),
        upload(&s, &og, b, &bv),
    );
    let mut ws = Workspace::new(s.clone());
    for plan in some_plans(&cudnn, &og, PlanFilter::new(), 3) {
        let mut yb = poisoned::<T>(&s, &og, y);
        run(
            &cudnn,
            &plan,
            &[(x, &xb), (w, &wb), (b, &bb)],
            &mut [(y, &mut yb)],
            &mut ws,
        )
        .unwrap();
        let got = fetch(&s, &og, y, &yb);
        check(
            &format!("conv+bias+relu {} {}", T::DTYPE, plan.name()),
            &got,
            &want,
            tol::<T>(),
        );
    }
}

#[test]
fn gpu_fused_conv_bias_relu_f16() {
    fused_conv_case::<f16>(8);
}

#[test]
fn gpu_fused_conv_bias_relu_bf16() {
    fused_conv_case::<bf16>(9);
}

// ---------------------------------------------------------------------------------------------
// GPU: matmul, pointwise, reduction
// ---------------------------------------------------------------------------------------------

/// c = a·b with a `[ba, M, K]` and b `[bb, K, N]` (a batch of 1 broadcasts), optionally + bias
/// and gelu.
fn matmul_case<T: DataType>(ba: i64, bb: i64, fused: bool, seed: u64) {
    let Some((s, cudnn)) = gpu() else { return };
    let (m, k, n) = (16i64, 32i64, 24i64);
    let mut rng = Rng::new(seed);
    let mut g = Graph::new(T::DTYPE, DType::F32, DType::F32);
    let a = g.tensor_nchw("a", &[ba, m, k], T::DTYPE).unwrap();
    let b = g.tensor_nchw("b", &[bb, k, n], T::DTYPE).unwrap();
    let mut c = g.matmul(a, b).unwrap();
    assert_eq!(g.dims(c).unwrap(), &[ba.max(bb), m, n]);
    let bias = if fused {
        let bias = g.tensor_nchw("bias", &[1, 1, n], T::DTYPE).unwrap();
        c = g.bias(c, bias).unwrap();
        c = g.pointwise(PointwiseMode::Gelu, c, None).unwrap();
        Some(bias)
    } else {
        None
    };
    g.mark_output(c).unwrap();
    matmul_run::<T>(&s, &cudnn, g, a, b, bias, c, &mut rng, fused)
}

#[allow(clippy::too_many_arguments)]
fn matmul_run<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    g: Graph,
    a: TensorId,
    b: TensorId,
    bias: Option<TensorId>,
    c: TensorId,
    rng: &mut Rng,
    fused: bool,
) {
    let ad = g.dims(a).unwrap().to_vec();
    let bd = g.dims(b).unwrap().to_vec();
    let (ba, bb, m, k, n) = (
        ad[0] as usize,
        bd[0] as usize,
        ad[1] as usize,
        ad[2] as usize,
        bd[2] as usize,
    );
    let bt = ba.max(bb);
    let og = g.build(cudnn).unwrap();
    let (av, af) = values::<T>(rng, ba * m * k);
    let (bv, bf) = values::<T>(rng, bb * k * n);
    let (biasv, biasf) = values::<T>(rng, n);
    let mut want = vec![0.0; bt * m * n];
    for p in 0..bt {
        // A batch extent of 1 is the same matrix for every output batch.
        let (pa, pb) = (if ba == 1 { 0 } else { p }, if bb == 1 { 0 } else { p });
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for q in 0..k {
                    acc += af[(pa * m + i) * k + q] * bf[(pb * k + q) * n + j];
                }
                want[(p * m + i) * n + j] = if fused {
                    unary_ref(PointwiseMode::Gelu, acc + biasf[j])
                } else {
                    acc
                };
            }
        }
    }
    let ab = upload(s, &og, a, &av);
    let bb_buf = upload(s, &og, b, &bv);
    let biasb = bias.map(|t| upload(s, &og, t, &biasv));
    let mut ws = Workspace::new(s.clone());
    for plan in some_plans(cudnn, &og, PlanFilter::new(), 3) {
        let mut cb = poisoned::<T>(s, &og, c);
        let mut ins = vec![(a, &ab), (b, &bb_buf)];
        if let (Some(t), Some(buf)) = (bias, biasb.as_ref()) {
            ins.push((t, buf));
        }
        run(cudnn, &plan, &ins, &mut [(c, &mut cb)], &mut ws).unwrap();
        let got = fetch(s, &og, c, &cb);
        // K = 32 products per element: an f32 sum, rounded once to T; TF32 for f32 data.
        check(
            &format!(
                "matmul {} [{ba},..] x [{bb},..] fused={fused} {}",
                T::DTYPE,
                plan.name()
            ),
            &got,
            &want,
            matmul_tol::<T>(&plan),
        );
    }
}

/// [`plan_tol`], but at least TF32's 5e-3 for every f32 matmul plan: on the H200 (cuDNN 9.14)
/// the matmul engine `eng0` reports no tensor-core note for f32 data yet rounded its inputs
/// like TF32 (1.2e-3 relative error on an element where the 32 products cancel).
fn matmul_tol<T: DataType>(plan: &Plan) -> f64 {
    let t = plan_tol::<T>(plan);
    if T::DTYPE == DType::F32 {
        t.max(5e-3)
    } else {
        t
    }
}

#[test]
fn gpu_matmul_bias_gelu_f16() {
    matmul_case::<f16>(3, 1, true, 10);
}

#[test]
fn gpu_matmul_bias_gelu_bf16() {
    matmul_case::<bf16>(3, 1, true, 11);
}

#[test]
fn gpu_matmul_batched_f16_and_f32() {
    matmul_case::<f16>(3, 3, false, 12);
    matmul_case::<f32>(3, 3, false, 13);
}

/// A batch extent of 1 on either operand. On the H200 (cuDNN 9.14) a plain matmul engine given
/// b `[1, K, N]` as such wrote only the first output batch; the graph now describes a broadcast
/// operand with the output's batch extent and stride 0 ([`Graph::matmul`]).
#[test]
fn gpu_matmul_broadcast_batch_f16_and_f32() {
    matmul_case::<f16>(3, 1, false, 17);
    matmul_case::<f16>(1, 3, false, 18);
    matmul_case::<f32>(3, 1, false, 19);
}

/// Whether a graph's failure to get a plan is a typed error (not a panic): cuDNN's status or
/// [`Error::NoEngine`].
fn is_no_engine(e: &Error) -> bool {
    matches!(e, Error::Cudnn { .. } | Error::NoEngine { .. })
}

/// Pointwise modes that must get an engine as a matmul epilogue: matmul + bias + gelu ran on the
/// H200 (cuDNN 9.14), and relu / mul are the other common epilogues.
const EPILOGUE_REQUIRED: &[PointwiseMode] = &[
    PointwiseMode::Add,
    PointwiseMode::Mul,
    PointwiseMode::Relu,
    PointwiseMode::Gelu,
];

/// Every pointwise mode as the epilogue of a matmul (f16 in and out, f32 inside), the pattern
/// cuDNN 9's runtime-fusion engines run: `c = a·b`, then `mode(c)` for unary modes,
/// `mode(c, z)` with a per-column `z` `[1, 1, N]` for binary modes, and `mode'(x)·c` with a
/// forward input `x` `[1, M, N]` for backward modes (`c` as the incoming gradient, as in
/// NVIDIA's matmul + dgelu + dbias sample). Checked against the f64 reference of
/// matmul-then-mode.
///
/// Standalone single-pointwise f32 graphs got no engine on the H200 (cuDNN 9.14), hence the
/// matmul. Modes for which cuDNN 9.14 offers no engine in this pattern either are printed
/// ("no engine: ...") and only required to fail with a typed error, leaving the output
/// untouched; the modes of [`EPILOGUE_REQUIRED`] must run.
#[test]
fn gpu_pointwise_modes_as_matmul_epilogue_f16() {
    let Some((s, cudnn)) = gpu() else { return };
    let (m, k, n) = (16usize, 16usize, 32usize);
    let (md, kd, nd) = (m as i64, k as i64, n as i64);
    let mut rng = Rng::new(14);
    let mut ws = Workspace::new(s.clone());
    let mut failures = Vec::new();
    let mut no_engine = Vec::new();
    for &mode in UNARY.iter().chain(BINARY).chain(BACKWARD) {
        // Positive products for the modes defined on x > 0 (c in [0.16, 4]); otherwise |c| of a
        // few units (K = 16 terms in [-1, 1]²), where exp stays far below f16's maximum.
        let positive = matches!(
            mode,
            PointwiseMode::Log
                | PointwiseMode::Sqrt
                | PointwiseMode::Rsqrt
                | PointwiseMode::Reciprocal
        );
        let (lo, hi) = if positive { (0.1, 0.5) } else { (-1.0, 1.0) };
        let av: Vec<f16> = rng.values_in(m * k, lo, hi);
        let bv: Vec<f16> = rng.values_in(k * n, lo, hi);
        // Divisors away from zero.
        let zv: Vec<f16> = if mode == PointwiseMode::Div {
            rng.values_in(n, 0.5, 2.0)
        } else {
            rng.values(n)
        };
        let xv: Vec<f16> = rng.values(m * n);

        let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
        let a = g.tensor_nchw("a", &[1, md, kd], DType::F16).unwrap();
        let b = g.tensor_nchw("b", &[1, kd, nd], DType::F16).unwrap();
        let c = g.matmul(a, b).unwrap();
        let (y, other) = if mode.is_backward() {
            let x = g.tensor_nchw("x", &[1, md, nd], DType::F16).unwrap();
            (g.pointwise_bwd(mode, c, x).unwrap(), Some((x, &xv)))
        } else if mode.is_binary() {
            let z = g.tensor_nchw("z", &[1, 1, nd], DType::F16).unwrap();
            (g.pointwise(mode, c, Some(z)).unwrap(), Some((z, &zv)))
        } else {
            (g.pointwise(mode, c, None).unwrap(), None)
        };
        g.mark_output(y).unwrap();
        let og = g.build(&cudnn).unwrap();

        let mut want = Vec::with_capacity(m * n);
        for i in 0..m {
            for j in 0..n {
                let cm: f64 = (0..k)
                    .map(|q| av[i * k + q].to_f64() * bv[q * n + j].to_f64())
                    .sum();
                want.push(if mode.is_backward() {
                    backward_ref(mode, cm, xv[i * n + j].to_f64())
                } else if mode.is_binary() {
                    binary_ref(mode, cm, zv[j].to_f64())
                } else {
                    unary_ref(mode, cm)
                });
            }
        }
        let ab = upload(&s, &og, a, &av);
        let bb = upload(&s, &og, b, &bv);
        let ob = other.map(|(t, v)| (t, upload(&s, &og, t, v)));
        let mut ins = vec![(a, &ab), (b, &bb)];
        if let Some((t, buf)) = ob.as_ref() {
            ins.push((*t, buf));
        }
        let plans = match og.plans(&cudnn, &PlanFilter::new().with_max_plans(Some(1))) {
            Ok(p) => p.plans,
            Err(e) => {
                assert!(is_no_engine(&e), "{mode:?}: untyped failure {e:?}");
                // Nothing may have been written to an output no plan was built for.
                let (yb, before) = common::sentinel_buffer::<f16>(&s, og.span(y).unwrap());
                assert_untouched(&format!("{mode:?}"), &s, &yb, &before);
                eprintln!("no engine: matmul -> {mode:?}: {e}");
                no_engine.push(mode);
                continue;
            }
        };
        let mut yb = poisoned::<f16>(&s, &og, y);
        run(&cudnn, &plans[0], &ins, &mut [(y, &mut yb)], &mut ws).unwrap();
        let got = fetch(&s, &og, y, &yb);
        // The product and the mode are computed in f32 and rounded once to f16; approximate
        // transcendental intrinsics (~1e-3 relative) stay well inside f16's tolerance.
        let what = format!("matmul -> {mode:?} {}", plans[0].name());
        let r = std::panic::catch_unwind(|| check(&what, &got, &want, tol::<f16>()));
        if r.is_err() {
            failures.push(format!("{mode:?}: wrong values"));
        }
    }
    eprintln!("matmul epilogue modes without an engine on this GPU / cuDNN: {no_engine:?}");
    for m in EPILOGUE_REQUIRED {
        if no_engine.contains(m) {
            failures.push(format!("{m:?}: no engine, but matmul + {m:?} must run"));
        }
    }
    assert!(failures.is_empty(), "pointwise failures: {failures:#?}");
}

#[allow(clippy::too_many_arguments)]
/// Runs a one-operation graph (input `x`, output `y`, both `T`) with the first plan that
/// `filter` yields and checks it; `Err` with the typed error when there is no plan.
fn standalone_run<T: DataType>(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    og: &OperationGraph,
    (x, y): (TensorId, TensorId),
    xv: &[T],
    want: &[f64],
    filter: PlanFilter,
    what: &str,
) -> Result<String, Error> {
    let plans = og.plans(cudnn, &filter.with_max_plans(Some(1)))?.plans;
    let xb = upload(s, og, x, xv);
    let mut yb = poisoned::<T>(s, og, y);
    let mut ws = Workspace::new(s.clone());
    run(cudnn, &plans[0], &[(x, &xb)], &mut [(y, &mut yb)], &mut ws).unwrap();
    check(what, &fetch(s, og, y, &yb), want, tol::<T>());
    Ok(plans[0].name())
}

/// Standalone pointwise and reduction graphs (no convolution or matmul), tried with the
/// heuristics (A, fallback) and then with every engine enumerated ([`PlanFilter::with_all_engines`]).
///
/// On the H200 with cuDNN 9.14 the heuristics proposed no engine for f32 NCHW standalone
/// pointwise and reduction graphs, while f16 channels-last standalone pointwise graphs ran
/// ([`gpu_by_value_scalars`]). Every case here either runs and matches its f64 reference or
/// fails with a typed error; which did what is printed. The f16 channels-last relu must run.
#[test]
fn gpu_standalone_pointwise_and_reduction() {
    let Some((s, cudnn)) = gpu() else { return };
    let mut rng = Rng::new(16);
    let filters = [
        ("heuristics", PlanFilter::new()),
        (
            "all engines",
            PlanFilter::new()
                .with_heuristics(&[])
                .with_all_engines(true),
        ),
    ];
    let mut report = Vec::new();
    let mut record = |what: String, r: Result<String, Error>| match r {
        Ok(plan) => {
            eprintln!("{what}: ran with {plan}");
            report.push((what, true));
        }
        Err(e) => {
            assert!(is_no_engine(&e), "{what}: untyped failure {e:?}");
            eprintln!("{what}: no engine: {e}");
            report.push((what, false));
        }
    };

    // Relu, f32 NCHW / f32 NHWC / f16 NHWC.
    let dims = [2i64, 8, 3, 5];
    for (dt, nhwc) in [(DType::F32, false), (DType::F32, true), (DType::F16, true)] {
        let mut g = Graph::new(dt, DType::F32, DType::F32);
        let x = if nhwc {
            g.tensor_nhwc("x", &dims, dt).unwrap()
        } else {
            g.tensor_nchw("x", &dims, dt).unwrap()
        };
        let y = g.pointwise(PointwiseMode::Relu, x, None).unwrap();
        g.mark_output(y).unwrap();
        let og = g.build(&cudnn).unwrap();
        for (fname, f) in &filters {
            let what = format!("relu {dt} nhwc={nhwc} ({fname})");
            let r = if dt == DType::F16 {
                let (xv, xf) = values::<f16>(&mut rng, count(&dims));
                let want: Vec<f64> = xf.iter().map(|&v| v.max(0.0)).collect();
                standalone_run(&s, &cudnn, &og, (x, y), &xv, &want, f.clone(), &what)
            } else {
                let (xv, xf) = values::<f32>(&mut rng, count(&dims));
                let want: Vec<f64> = xf.iter().map(|&v| v.max(0.0)).collect();
                standalone_run(&s, &cudnn, &og, (x, y), &xv, &want, f.clone(), &what)
            };
            record(what, r);
        }
    }

    // Reductions of f32 x [4, 6, 5, 3]: NCHW partial sums as before, and the channels-last full
    // max of cudnn-frontend's standalone reduction sample.
    let dims = [4i64, 6, 5, 3];
    let (xv, xf) = values::<f32>(&mut rng, count(&dims));
    for (op, out, nhwc) in [
        (ReduceOp::Add, [1i64, 6, 1, 1], false),
        (ReduceOp::Add, [4, 6, 5, 1], false),
        (ReduceOp::Max, [1, 1, 1, 1], true),
    ] {
        let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
        let x = if nhwc {
            g.tensor_nhwc("x", &dims, DType::F32).unwrap()
        } else {
            g.tensor_nchw("x", &dims, DType::F32).unwrap()
        };
        let y = g.reduction(op, x, &out).unwrap();
        g.mark_output(y).unwrap();
        let og = g.build(&cudnn).unwrap();
        let want = reduce_ref(op, &dims, &xf, &out);
        for (fname, f) in &filters {
            let what = format!("reduce {op:?} to {out:?} nhwc={nhwc} ({fname})");
            let r = standalone_run(&s, &cudnn, &og, (x, y), &xv, &want, f.clone(), &what);
            record(what, r);
        }
    }
    eprintln!("standalone graphs (case, ran): {report:#?}");
    assert!(
        report
            .iter()
            .any(|(w, ran)| *ran && w.starts_with("relu f16 nhwc=true")),
        "an f16 channels-last standalone relu must run: {report:#?}"
    );
}

/// The f64 reference of reducing x (logical row-major `dims`) to `out` with `op` (Add or Max).
fn reduce_ref(op: ReduceOp, dims: &[i64], xf: &[f64], out: &[i64]) -> Vec<f64> {
    let init = if op == ReduceOp::Max {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let mut want = vec![init; count(out)];
    let mut i = 0;
    common::for_each_index(dims, |idx| {
        let o = idx
            .iter()
            .zip(out)
            .fold(0i64, |a, (&j, &d)| a * d + if d == 1 { 0 } else { j }) as usize;
        want[o] = if op == ReduceOp::Max {
            want[o].max(xf[i])
        } else {
            want[o] + xf[i]
        };
        i += 1;
    });
    want
}

#[test]
fn gpu_by_value_scalars() {
    let Some((s, cudnn)) = gpu() else { return };
    let dims = [2i64, 8, 3, 5];
    let mut rng = Rng::new(15);
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &dims, DType::F16).unwrap();
    let scale = g.scalar("scale", 1.5, DType::F32).unwrap();
    let shift = g.scalar("shift", -0.25, DType::F32).unwrap();
    let y = g.scale(x, scale).unwrap();
    let y = g.pointwise(PointwiseMode::Add, y, Some(shift)).unwrap();
    g.mark_output(y).unwrap();
    let og = g.build(&cudnn).unwrap();
    assert!(og.span(scale).is_err(), "a scalar takes no buffer");
    let (xv, xf) = values::<f16>(&mut rng, count(&dims));
    let want: Vec<f64> = xf.iter().map(|v| v * 1.5 - 0.25).collect();
    let xb = upload(&s, &og, x, &xv);
    let mut ws = Workspace::new(s.clone());
    let plans = some_plans(&cudnn, &og, PlanFilter::new(), 1);
    let mut yb = poisoned::<f16>(&s, &og, y);
    run(&cudnn, &plans[0], &[(x, &xb)], &mut [(y, &mut yb)], &mut ws).unwrap();
    check("x*1.5-0.25", &fetch(&s, &og, y, &yb), &want, tol::<f16>());
    // Binding a buffer to a scalar is refused.
    let junk = s.alloc_zeros::<f32>(4).unwrap();
    let mut yb2 = poisoned::<f16>(&s, &og, y);
    let mut args = Args::new(&cudnn);
    args.input(x, &xb).unwrap().output(y, &mut yb2).unwrap();
    args.input(scale, &junk).unwrap();
    let r = cudnn.execute(&plans[0], &args, &mut ws);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
}

/// Reductions fused after a matmul (f16 in, f32 inside), the pattern cuDNN 9's runtime-fusion
/// engines run (standalone reductions got no engine on the H200 with cuDNN 9.14; see
/// [`gpu_standalone_pointwise_and_reduction`]).
///
/// * Required: NVIDIA's matmul + dgelu + dbias sample: `c = a·b`, `dx = gelu_tanh'(x)·c`
///   (an f16 output), `dbias = Σ_rows dx` (f32 `[1, 1, N]`).
/// * Tried: a reduction straight after the matmul (row sums `[1, M, 1]`, column maxima
///   `[1, 1, N]`): runs and matches, or fails with a typed error (printed).
#[test]
fn gpu_reduction_after_matmul() {
    let Some((s, cudnn)) = gpu() else { return };
    let (m, k, n) = (32usize, 16usize, 64usize);
    let (md, kd, nd) = (m as i64, k as i64, n as i64);
    let mut rng = Rng::new(20);
    let mut ws = Workspace::new(s.clone());
    let av: Vec<f16> = rng.values_in(m * k, -1.0, 1.0);
    let bv: Vec<f16> = rng.values_in(k * n, -1.0, 1.0);
    let xv: Vec<f16> = rng.values(m * n);
    let cm: Vec<f64> = (0..m * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            (0..k)
                .map(|q| av[i * k + q].to_f64() * bv[q * n + j].to_f64())
                .sum()
        })
        .collect();
    // Sums are checked against the sum of the magnitudes of their terms: each term carries f32
    // (or f16-output) rounding, and a sum of mixed signs may be much smaller than its terms.
    let check_sums = |what: &str, got: &[f32], want: &[f64], mag: &[f64], tol: f64| {
        for (i, ((&g, &w), &a)) in got.iter().zip(want).zip(mag).enumerate() {
            let g = g as f64;
            assert!(
                g.is_finite() && (g - w).abs() <= tol * (1.0 + a),
                "{what}: element {i}: got {g}, want {w} (terms' magnitude {a}, tol {tol})"
            );
        }
    };

    // Matmul, dgelu, dbias.
    {
        let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
        let a = g.tensor_nchw("a", &[1, md, kd], DType::F16).unwrap();
        let b = g.tensor_nchw("b", &[1, kd, nd], DType::F16).unwrap();
        let x = g.tensor_nchw("x", &[1, md, nd], DType::F16).unwrap();
        let c = g.matmul(a, b).unwrap();
        let dx = g.pointwise_bwd(PointwiseMode::GeluTanhBwd, c, x).unwrap();
        g.mark_output(dx).unwrap();
        let dbias = g.reduction(ReduceOp::Add, dx, &[1, 1, nd]).unwrap();
        g.mark_output_as(dbias, DType::F32).unwrap();
        let og = g.build(&cudnn).unwrap();
        let dxf: Vec<f64> = (0..m * n)
            .map(|e| backward_ref(PointwiseMode::GeluTanhBwd, cm[e], xv[e].to_f64()))
            .collect();
        let sum = |f: &dyn Fn(f64) -> f64| -> Vec<f64> {
            (0..n)
                .map(|j| (0..m).map(|i| f(dxf[i * n + j])).sum())
                .collect()
        };
        let (want_db, mag_db) = (sum(&|v| v), sum(&|v: f64| v.abs()));
        let ab = upload(&s, &og, a, &av);
        let bb = upload(&s, &og, b, &bv);
        let xb = upload(&s, &og, x, &xv);
        for plan in some_plans(&cudnn, &og, PlanFilter::new(), 2) {
            let mut dxb = poisoned::<f16>(&s, &og, dx);
            let mut dbb = poisoned::<f32>(&s, &og, dbias);
            let mut args = Args::new(&cudnn);
            args.input(a, &ab).unwrap();
            args.input(b, &bb).unwrap();
            args.input(x, &xb).unwrap();
            args.output(dx, &mut dxb).unwrap();
            args.output(dbias, &mut dbb).unwrap();
            cudnn.execute(&plan, &args, &mut ws).unwrap();
            drop(args);
            let what = format!("matmul dgelu {}", plan.name());
            check(&what, &fetch(&s, &og, dx, &dxb), &dxf, tol::<f16>());
            // The reduction may sum dx before or after its rounding to f16.
            check_sums(
                &format!("{what}: dbias"),
                &fetch(&s, &og, dbias, &dbb),
                &want_db,
                &mag_db,
                tol::<f16>(),
            );
        }
    }

    // A reduction straight after the matmul.
    let mut no_engine = Vec::new();
    for (op, out) in [
        (ReduceOp::Add, [1i64, md, 1]),
        (ReduceOp::Max, [1i64, 1, nd]),
    ] {
        let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
        let a = g.tensor_nchw("a", &[1, md, kd], DType::F16).unwrap();
        let b = g.tensor_nchw("b", &[1, kd, nd], DType::F16).unwrap();
        let c = g.matmul(a, b).unwrap();
        let y = g.reduction(op, c, &out).unwrap();
        g.mark_output_as(y, DType::F32).unwrap();
        let og = g.build(&cudnn).unwrap();
        let want = reduce_ref(op, &[1, md, nd], &cm, &out);
        let mag = reduce_ref(
            op,
            &[1, md, nd],
            &cm.iter().map(|v| v.abs()).collect::<Vec<_>>(),
            &out,
        );
        let what = format!("matmul -> reduce {op:?} to {out:?}");
        let plans = match og.plans(&cudnn, &PlanFilter::new().with_max_plans(Some(2))) {
            Ok(p) => p.plans,
            Err(e) => {
                assert!(is_no_engine(&e), "{what}: untyped failure {e:?}");
                let (yb, before) = common::sentinel_buffer::<f32>(&s, og.span(y).unwrap());
                assert_untouched(&what, &s, &yb, &before);
                eprintln!("no engine: {what}: {e}");
                no_engine.push(what);
                continue;
            }
        };
        let ab = upload(&s, &og, a, &av);
        let bb = upload(&s, &og, b, &bv);
        for plan in plans {
            let mut yb = poisoned::<f32>(&s, &og, y);
            run_mixed(&cudnn, &plan, &[(a, &ab), (b, &bb)], (y, &mut yb), &mut ws).unwrap();
            // f32 sums of exact f16 products: f32 rounding only.
            check_sums(
                &format!("{what} {}", plan.name()),
                &fetch(&s, &og, y, &yb),
                &want,
                &mag,
                1e-5,
            );
        }
    }
    eprintln!("reductions straight after a matmul without an engine: {no_engine:#?}");
}

/// Binds f16 inputs and one f32 output and executes `plan`.
fn run_mixed(
    cudnn: &Cudnn,
    plan: &Plan,
    ins: &[(TensorId, &CudaSlice<f16>)],
    (y, yb): (TensorId, &mut CudaSlice<f32>),
    ws: &mut Workspace,
) -> cudnn_safe::Result<()> {
    let mut args = Args::new(cudnn);
    for (t, b) in ins {
        args.input(*t, *b)?;
    }
    args.output(y, yb)?;
    cudnn.execute(plan, &args, ws)
}
// ---------------------------------------------------------------------------------------------
// GPU: filters, workspace, rejected bindings, reuse, autotune, cache
// ---------------------------------------------------------------------------------------------

/// An f32 NCHW conv graph with its inputs uploaded and the reference output.
struct ConvCase {
    og: OperationGraph,
    x: TensorId,
    w: TensorId,
    y: TensorId,
    xb: CudaSlice<f32>,
    wb: CudaSlice<f32>,
    want: Vec<f64>,
}

fn conv_case(s: &Arc<CudaStream>, cudnn: &Cudnn, seed: u64) -> ConvCase {
    let geo = conv_geometry();
    let mut rng = Rng::new(seed);
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &geo.x, DType::F32).unwrap();
    let w = g.tensor_nchw("w", &geo.w, DType::F32).unwrap();
    let y = g.conv_fprop(x, w, &geo.params()).unwrap();
    g.set_name(y, "y").unwrap();
    g.mark_output(y).unwrap();
    let og = g.build(cudnn).unwrap();
    let (xv, xf) = values::<f32>(&mut rng, count(&geo.x));
    let (wv, wf) = values::<f32>(&mut rng, count(&geo.w));
    let mut want = vec![0.0; count(&geo.y())];
    geo.for_each_term(|xi, fi, yi| want[yi] += xf[xi] * wf[fi]);
    let xb = upload(s, &og, x, &xv);
    let wb = upload(s, &og, w, &wv);
    ConvCase {
        og,
        x,
        w,
        y,
        xb,
        wb,
        want,
    }
}

impl ConvCase {
    fn run_check(
        &self,
        s: &Arc<CudaStream>,
        cudnn: &Cudnn,
        plan: &Plan,
        ws: &mut Workspace,
        what: &str,
    ) {
        let mut yb = poisoned::<f32>(s, &self.og, self.y);
        run(
            cudnn,
            plan,
            &[(self.x, &self.xb), (self.w, &self.wb)],
            &mut [(self.y, &mut yb)],
            ws,
        )
        .unwrap();
        check(
            what,
            &fetch(s, &self.og, self.y, &yb),
            &self.want,
            plan_tol::<f32>(plan),
        );
    }
}

/// `OperationGraph::plan` builds the first plan `plans` lists; when nothing is proposed both
/// return `Error::NoEngine` naming the graph's operations.
#[test]
fn gpu_plan_is_the_first_of_plans() {
    let Some((s, cudnn)) = gpu() else { return };
    let c = conv_case(&s, &cudnn, 21);
    let f = PlanFilter::new();
    let first = c.og.plan(&cudnn, &f).unwrap();
    let list = c.og.plans(&cudnn, &f).unwrap();
    assert_eq!(first.config(), list.plans[0].config());
    // No heuristic mode and no enumeration: no configuration at all.
    let none = PlanFilter::new().with_heuristics(&[]);
    let results = [
        c.og.plan(&cudnn, &none).map(|_| ()),
        c.og.plans(&cudnn, &none).map(|_| ()),
    ];
    for r in results {
        match r {
            Err(Error::NoEngine { graph, detail }) => {
                assert_eq!(graph, "convolution forward");
                assert!(detail.contains("no engine configuration"), "{detail}");
            }
            other => panic!("expected NoEngine, got {other:?}"),
        }
    }
}

#[test]
fn gpu_filters_and_workspace_limit() {
    let Some((s, cudnn)) = gpu() else { return };
    let c = conv_case(&s, &cudnn, 20);
    let strict = PlanFilter::new()
        .with_deterministic(true)
        .with_no_tensor_cores(true)
        .with_no_down_conversion(true)
        .with_all_engines(true)
        .with_max_plans(Some(6));
    let list = c.og.plans(&cudnn, &strict).unwrap();
    assert!(!list.plans.is_empty());
    for p in &list.plans {
        assert!(p.is_deterministic() && !p.uses_tensor_cores(), "{p:?}");
        assert!(!p
            .numerical_notes()
            .contains(&NumericalNote::DownConvertInputs));
    }
    let all =
        c.og.plans(
            &cudnn,
            &PlanFilter::new()
                .with_all_engines(true)
                .with_max_plans(Some(12)),
        )
        .unwrap();
    eprintln!(
        "{} plans in all, {} strict, {} skipped; engines: {}",
        all.plans.len(),
        list.plans.len(),
        all.skipped.len(),
        c.og.engine_count(&cudnn).unwrap()
    );
    // Names are unique (duplicates between heuristics and enumeration are dropped).
    let mut names: Vec<String> = all.plans.iter().map(Plan::name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), all.plans.len());

    // A zero workspace limit keeps only plans needing none.
    match c.og.plans(
        &cudnn,
        &PlanFilter::new()
            .with_all_engines(true)
            .with_workspace_limit(0)
            .with_max_plans(Some(12)),
    ) {
        Ok(l) => {
            for p in &l.plans {
                assert_eq!(p.workspace_size(), 0);
            }
            assert!(
                l.skipped.iter().any(|s| s.reason.contains("workspace"))
                    || all.plans.iter().all(|p| p.workspace_size() == 0)
            );
        }
        Err(e) => assert!(matches!(e, Error::NoEngine { .. }), "{e}"),
    }

    // A plan that needs workspace, run with a workspace capped below it: refused, output untouched.
    let mut ws = Workspace::new(s.clone());
    match all.plans.iter().find(|p| p.workspace_size() > 0) {
        Some(p) => {
            let mut small = Workspace::new(s.clone()).with_limit(p.workspace_size() - 1);
            let (mut yb, before) = sentinel_buffer::<f32>(&s, c.og.span(c.y).unwrap());
            let r = run(
                &cudnn,
                p,
                &[(c.x, &c.xb), (c.w, &c.wb)],
                &mut [(c.y, &mut yb)],
                &mut small,
            );
            assert!(
                matches!(&r, Err(cudnn_safe::Error::WorkspaceLimit { .. })),
                "{r:?}"
            );
            assert_untouched("y", &s, &yb, &before);
            c.run_check(&s, &cudnn, p, &mut ws, "with enough workspace");
        }
        None => eprintln!("note: no plan of this graph needs workspace"),
    }
    for p in list.plans.iter().take(4) {
        c.run_check(&s, &cudnn, p, &mut ws, &format!("strict {}", p.name()));
    }
}

#[test]
fn gpu_rejected_bindings_leave_outputs_untouched() {
    let Some((s, cudnn)) = gpu() else { return };
    let c = conv_case(&s, &cudnn, 21);
    let plan = some_plans(&cudnn, &c.og, PlanFilter::new(), 1).remove(0);
    let span = c.og.span(c.y).unwrap();
    let mut ws = Workspace::new(s.clone());
    let (mut yb, before) = sentinel_buffer::<f32>(&s, span);

    // Short output, short input.
    let (mut short_y, short_before) = sentinel_buffer::<f32>(&s, span - 1);
    let r = run(
        &cudnn,
        &plan,
        &[(c.x, &c.xb), (c.w, &c.wb)],
        &mut [(c.y, &mut short_y)],
        &mut ws,
    );
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "y", .. })),
        "{r:?}"
    );
    assert_untouched("short y", &s, &short_y, &short_before);
    let short_w = s.alloc_zeros::<f32>(c.og.span(c.w).unwrap() - 1).unwrap();
    let r = run(
        &cudnn,
        &plan,
        &[(c.x, &c.xb), (c.w, &short_w)],
        &mut [(c.y, &mut yb)],
        &mut ws,
    );
    assert!(
        matches!(r, Err(Error::BufferTooSmall { name: "w", .. })),
        "{r:?}"
    );

    // Missing binding.
    let r = run(
        &cudnn,
        &plan,
        &[(c.x, &c.xb)],
        &mut [(c.y, &mut yb)],
        &mut ws,
    );
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. }))
            && format!("{r:?}").contains("`w`"),
        "{r:?}"
    );

    // Wrong data type.
    let x16 = s.alloc_zeros::<f16>(c.og.span(c.x).unwrap()).unwrap();
    {
        let mut args = Args::new(&cudnn);
        args.input(c.x, &x16)
            .unwrap()
            .input(c.w, &c.wb)
            .unwrap()
            .output(c.y, &mut yb)
            .unwrap();
        let r = cudnn.execute(&plan, &args, &mut ws);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
            "{r:?}"
        );
    }

    // An output bound as an input, an input bound as an output, a tensor bound twice.
    {
        let mut args = Args::new(&cudnn);
        args.input(c.x, &c.xb)
            .unwrap()
            .input(c.w, &c.wb)
            .unwrap()
            .input(c.y, &yb)
            .unwrap();
        let r = cudnn.execute(&plan, &args, &mut ws);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{r:?}"
        );
    }
    {
        let mut xcopy = s.clone_htod(&download(&s, &c.xb)).unwrap();
        let mut args = Args::new(&cudnn);
        args.output(c.x, &mut xcopy)
            .unwrap()
            .input(c.w, &c.wb)
            .unwrap()
            .output(c.y, &mut yb)
            .unwrap();
        let r = cudnn.execute(&plan, &args, &mut ws);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{r:?}"
        );
        let r2 = args.input(c.w, &c.wb).map(|_| ());
        assert!(
            matches!(&r2, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "bound twice: {r2:?}"
        );
    }

    // A tensor of another graph.
    let other = conv_case(&s, &cudnn, 22);
    {
        let mut args = Args::new(&cudnn);
        args.input(c.x, &c.xb)
            .unwrap()
            .input(c.w, &c.wb)
            .unwrap()
            .output(c.y, &mut yb)
            .unwrap();
        args.input(other.x, &other.xb).unwrap();
        let r = cudnn.execute(&plan, &args, &mut ws);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{r:?}"
        );
    }

    // Misaligned output (4 bytes into the buffer).
    {
        let (mut big, big_before) = sentinel_buffer::<f32>(&s, span + 1);
        {
            let mut view = big.slice_mut(1..);
            let mut args = Args::new(&cudnn);
            args.input(c.x, &c.xb)
                .unwrap()
                .input(c.w, &c.wb)
                .unwrap()
                .output(c.y, &mut view)
                .unwrap();
            let r = cudnn.execute(&plan, &args, &mut ws);
            assert!(
                matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. }))
                    && format!("{r:?}").contains("align"),
                "{r:?}"
            );
        }
        assert_untouched("misaligned y", &s, &big, &big_before);
    }

    // Another handle (same stream): the plan runs only on its own.
    let cudnn2 = Cudnn::new(s.clone()).unwrap();
    {
        let mut args = Args::new(&cudnn2);
        args.input(c.x, &c.xb)
            .unwrap()
            .input(c.w, &c.wb)
            .unwrap()
            .output(c.y, &mut yb)
            .unwrap();
        let r = cudnn2.execute(&plan, &args, &mut ws);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{r:?}"
        );
        assert!(matches!(
            &c.og.plans(&cudnn2, &PlanFilter::new()).map(|_| ()),
            Err(cudnn_safe::Error::InvalidArgument { .. })
        ));
    }
    // Args of another stream.
    let s2 = s.context().new_stream().unwrap();
    let cudnn3 = Cudnn::new(s2.clone()).unwrap();
    {
        let mut args = Args::new(&cudnn3);
        args.input(c.x, &c.xb)
            .unwrap()
            .input(c.w, &c.wb)
            .unwrap()
            .output(c.y, &mut yb)
            .unwrap();
        let r = cudnn.execute(&plan, &args, &mut ws);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{r:?}"
        );
    }
    assert_untouched("y", &s, &yb, &before);

    // And the same bindings done right work.
    c.run_check(&s, &cudnn, &plan, &mut ws, "after rejections");
}

/// A plan keeps its handle alive and is tied to it by the handle's process-unique id: after the
/// handle is dropped, a new handle (which cuDNN often creates at a freed handle's address) is
/// refused, and so is a graph or a plan cache entry of the old handle.
#[test]
fn gpu_plan_outlives_its_handle_and_refuses_a_new_one() {
    let Some((s, first)) = gpu() else { return };
    let c = conv_case(&s, &first, 41);
    let plan = some_plans(&first, &c.og, PlanFilter::new(), 1).remove(0);
    let filter = PlanFilter::new();
    let mut cache = PlanCache::new();
    cache.get_or_build(&first, &c.og, &filter).unwrap();
    let (old_id, old_raw) = (first.id(), first.as_raw() as usize);
    drop(first);

    let mut ws = Workspace::new(s.clone());
    // New handles: never the old id; not the old address either while the plan holds it.
    for round in 0..4 {
        let cudnn = Cudnn::new(s.clone()).unwrap();
        assert_ne!(cudnn.id(), old_id, "round {round}: ids are never reused");
        assert_ne!(
            cudnn.as_raw() as usize,
            old_raw,
            "round {round}: the old raw handle is still alive (held by the plan)"
        );
        let mut yb = poisoned::<f32>(&s, &c.og, c.y);
        let before = download(&s, &yb);
        {
            let mut args = Args::new(&cudnn);
            args.input(c.x, &c.xb)
                .unwrap()
                .input(c.w, &c.wb)
                .unwrap()
                .output(c.y, &mut yb)
                .unwrap();
            let r = cudnn.execute(&plan, &args, &mut ws);
            assert!(
                matches!(&r, Err(Error::InvalidArgument { what, .. }) if *what == "cuDNN handle"),
                "round {round}: {r:?}"
            );
        }
        assert_untouched("y (stale plan)", &s, &yb, &before);
        let r = c.og.plans(&cudnn, &filter).map(|_| ());
        assert!(
            matches!(&r, Err(Error::InvalidArgument { .. })),
            "graph of a dropped handle: {r:?}"
        );
        assert!(
            cache.get(&cudnn, &c.og, &filter).is_none(),
            "a cache entry of a dropped handle does not count"
        );
    }
    // Dropping the last plan and graph releases the old handle; a new handle works normally,
    // whatever address cuDNN gives it.
    drop(plan);
    drop(cache);
    let cudnn = Cudnn::new(s.clone()).unwrap();
    let c2 = conv_case(&s, &cudnn, 42);
    let plan = some_plans(&cudnn, &c2.og, PlanFilter::new(), 1).remove(0);
    c2.run_check(
        &s,
        &cudnn,
        &plan,
        &mut ws,
        "new handle after the old one is gone",
    );
    // The old graph still refuses it.
    let r = c.og.plans(&cudnn, &filter).map(|_| ());
    assert!(matches!(&r, Err(Error::InvalidArgument { .. })), "{r:?}");
}

#[test]
fn gpu_variant_pack_reused_and_rebuilt() {
    let Some((s, cudnn)) = gpu() else { return };
    let c = conv_case(&s, &cudnn, 23);
    let plan = some_plans(&cudnn, &c.og, PlanFilter::new(), 1).remove(0);
    let mut ws = Workspace::new(s.clone());
    let mut y1 = poisoned::<f32>(&s, &c.og, c.y);
    let mut y2 = poisoned::<f32>(&s, &c.og, c.y);
    let tol = plan_tol::<f32>(&plan);
    for round in 0..3 {
        // y1, y2, y1 (pointer changes each time), and twice the same in a row.
        let target = if round == 1 { &mut y2 } else { &mut y1 };
        s.memcpy_htod(&vec![f32::NAN; c.og.span(c.y).unwrap()], target)
            .unwrap();
        for _ in 0..2 {
            run(
                &cudnn,
                &plan,
                &[(c.x, &c.xb), (c.w, &c.wb)],
                &mut [(c.y, &mut *target)],
                &mut ws,
            )
            .unwrap();
        }
        check(
            &format!("round {round}"),
            &fetch(&s, &c.og, c.y, target),
            &c.want,
            tol,
        );
    }
    // New input contents at the same address: the pack is reused, the result follows the data.
    let doubled: Vec<f32> = download(&s, &c.xb).iter().map(|v| v * 2.0).collect();
    let mut xb = c.xb.clone();
    s.memcpy_htod(&doubled, &mut xb).unwrap();
    let want2: Vec<f64> = c.want.iter().map(|v| v * 2.0).collect();
    run(
        &cudnn,
        &plan,
        &[(c.x, &xb), (c.w, &c.wb)],
        &mut [(c.y, &mut y1)],
        &mut ws,
    )
    .unwrap();
    check("doubled x", &fetch(&s, &c.og, c.y, &y1), &want2, tol);
}

#[test]
fn gpu_autotune_json_and_config_rebuild() {
    let Some((s, cudnn)) = gpu() else { return };
    let c = conv_case(&s, &cudnn, 24);
    let plans = some_plans(&cudnn, &c.og, PlanFilter::new(), 4);
    let names: Vec<String> = plans.iter().map(Plan::name).collect();
    let mut ws = Workspace::new(s.clone());
    let mut scratch = poisoned::<f32>(&s, &c.og, c.y);
    let tuned = {
        let mut args = Args::new(&cudnn);
        args.input(c.x, &c.xb)
            .unwrap()
            .input(c.w, &c.wb)
            .unwrap()
            .output(c.y, &mut scratch)
            .unwrap();
        autotune(
            &cudnn,
            plans,
            &args,
            &mut ws,
            &tune::plan::Policy::new().with_rounds(2).with_iterations(3),
        )
        .unwrap()
    };
    assert!(names.contains(&tuned.plan.name()));
    assert!(!tuned.candidates.is_empty());
    assert!(tuned.candidates.windows(2).all(|t| t[0].ms <= t[1].ms));
    assert_eq!(tuned.candidates[0].name, tuned.plan.name());
    c.run_check(&s, &cudnn, &tuned.plan, &mut ws, "autotuned");

    let json = tuned.plan.json(&cudnn).unwrap();
    assert!(json.len() > 2 && json.contains('{'), "{json}");
    let rebuilt = c.og.plan_from_config(&cudnn, tuned.plan.config()).unwrap();
    assert_eq!(rebuilt.name(), tuned.plan.name());
    assert_eq!(rebuilt.workspace_size(), tuned.plan.workspace_size());
    c.run_check(&s, &cudnn, &rebuilt, &mut ws, "rebuilt from config");
    // A configuration of an engine that does not exist is an error, not a plan.
    let bogus = EngineConfig {
        engine: 1 << 40,
        knobs: vec![],
    };
    assert!(c.og.plan_from_config(&cudnn, &bogus).is_err());
}

#[test]
fn gpu_plan_cache_hits_and_persists() {
    let Some((s, cudnn)) = gpu() else { return };
    let c = conv_case(&s, &cudnn, 25);
    let filter = PlanFilter::new();
    let mut cache = PlanCache::new();
    let first = cache.get_or_build(&cudnn, &c.og, &filter).unwrap().as_raw() as usize;
    let again = cache.get_or_build(&cudnn, &c.og, &filter).unwrap().as_raw() as usize;
    assert_eq!(first, again, "a hit returns the same plan");
    assert_eq!(
        (cache.stats().hits, cache.stats().misses, cache.len()),
        (1, 1, 1)
    );
    // Another graph with the same signature hits too; another filter misses.
    // It runs with the twin's own tensor ids and buffers.
    let twin = conv_case(&s, &cudnn, 26);
    let mut ws = Workspace::new(s.clone());
    {
        let shared = cache
            .get(&cudnn, &twin.og, &filter)
            .expect("same signature hits");
        assert_eq!(shared.as_raw() as usize, first);
        twin.run_check(&s, &cudnn, shared, &mut ws, "plan shared with a twin graph");
        // Binding one tensor through both graphs' ids is refused.
        let mut yb = poisoned::<f32>(&s, &c.og, c.y);
        let mut args = Args::new(&cudnn);
        args.input(twin.x, &twin.xb)
            .unwrap()
            .input(twin.w, &twin.wb)
            .unwrap();
        args.input(c.w, &c.wb)
            .unwrap()
            .output(twin.y, &mut yb)
            .unwrap();
        let r = cudnn.execute(shared, &args, &mut ws);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "{r:?}"
        );
    }
    assert!(cache
        .get(&cudnn, &c.og, &filter.clone().with_deterministic(true))
        .is_none());
    // On another handle, the entry does not count.
    let cudnn2 = Cudnn::new(s.clone()).unwrap();
    let og2 = {
        let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
        let geo = conv_geometry();
        let x = g.tensor_nchw("x", &geo.x, DType::F32).unwrap();
        let w = g.tensor_nchw("w", &geo.w, DType::F32).unwrap();
        let y = g.conv_fprop(x, w, &geo.params()).unwrap();
        g.set_name(y, "y").unwrap();
        g.mark_output(y).unwrap();
        g.build(&cudnn2).unwrap()
    };
    assert_eq!(og2.signature(), c.og.signature());
    assert!(cache.get(&cudnn2, &og2, &filter).is_none());

    // Persistence: a new cache on the same file rebuilds the same configuration.
    let path =
        std::env::temp_dir().join(format!("cudnn-safe-graph-cache-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let name = {
        let mut persisted = PlanCache::new().try_cache_file(&path).unwrap();
        let mut ws = Workspace::new(s.clone());
        let mut scratch = poisoned::<f32>(&s, &c.og, c.y);
        let mut args = Args::new(&cudnn);
        args.input(c.x, &c.xb)
            .unwrap()
            .input(c.w, &c.wb)
            .unwrap()
            .output(c.y, &mut scratch)
            .unwrap();
        persisted
            .get_or_autotune(
                &cudnn,
                &c.og,
                &filter,
                &args,
                &mut ws,
                &tune::plan::Policy::new(),
            )
            .unwrap()
            .name()
    };
    drop(ws);
    let text = std::fs::read_to_string(&path).unwrap();
    let first = text.lines().nth(1).and_then(|l| l.split('\t').nth(2));
    assert_eq!(first, Some(name.as_str()), "{text}");
    let mut fresh = PlanCache::new().try_cache_file(&path).unwrap();
    let plan_name = fresh.get_or_build(&cudnn, &c.og, &filter).unwrap().name();
    assert_eq!(plan_name, name);
    let mut ws = Workspace::new(s.clone());
    let plan = fresh.get(&cudnn, &c.og, &filter).unwrap();
    c.run_check(&s, &cudnn, plan, &mut ws, "persisted plan");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn gpu_plan_cache_warm_up_replays_recorded_graphs() {
    let Some((s, cudnn)) = gpu() else { return };
    let path =
        std::env::temp_dir().join(format!("cudnn-safe-graph-warm-{}.txt", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let filter = PlanFilter::new();
    let c = conv_case(&s, &cudnn, 31);
    let half = conv_graph(DType::F16, true).0.build(&cudnn).unwrap();
    let name = {
        let mut cache = PlanCache::new().try_cache_file(&path).unwrap();
        let name = cache.get_or_build(&cudnn, &c.og, &filter).unwrap().name();
        cache.get_or_build(&cudnn, &half, &filter).unwrap();
        name
    };
    // Every line (after the header) carries its graph.
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    let key = PlanCache::key(&cudnn, &c.og, &filter);
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{}\t", file_key(&key))))
        .expect("the f32 graph's line");
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields.len(), 4, "{line}");
    assert_eq!(fields[2], name);
    assert_eq!(fields[3], c.og.graph().to_json().unwrap());
    // Lines the warm-up leaves alone (another GPU) or skips (a choice without its graph; a
    // recorded graph that is not its key's).
    let (_, rest) = key.split_once(" | ").unwrap();
    let other_gpu = format!("Other GPU|sm00|cudnn1\t{rest}\t{name}\t{}", fields[3]);
    let no_graph = format!(
        "{}\t{name}",
        file_key(&PlanCache::key(
            &cudnn,
            &c.og,
            &filter.clone().with_deterministic(true)
        ))
    );
    let mismatched = format!(
        "{}\t{name}\t{}",
        file_key(&PlanCache::key(
            &cudnn,
            &c.og,
            &filter.clone().with_no_tensor_cores(true)
        )),
        half.graph().to_json().unwrap()
    );
    std::fs::write(
        &path,
        format!("{text}{other_gpu}\n{no_graph}\n{mismatched}\n"),
    )
    .unwrap();

    // A new handle, as in a new process: the warm-up builds and runs the two recorded plans.
    let cudnn2 = Cudnn::new(s.clone()).unwrap();
    let mut ws = Workspace::new(s.clone());
    // Within a limit below their scratch memory, both are skipped (sizes named), nothing held.
    let mut tight = PlanCache::new().try_cache_file(&path).unwrap();
    let w = tight.warm_up_within(&cudnn2, &mut ws, 64).unwrap();
    eprintln!("{w:?}");
    assert_eq!(
        (w.replayed, w.skipped.len(), tight.len()),
        (0, 4, 0),
        "{w:?}"
    );
    let over = w
        .skipped
        .iter()
        .filter(|k| k.reason.contains("at most 64 bytes"));
    assert_eq!(over.count(), 2, "{w:?}");
    let mut fresh = PlanCache::new().try_cache_file(&path).unwrap();
    let w = fresh.warm_up(&cudnn2, &mut ws).unwrap();
    eprintln!("{w:?}");
    assert_eq!((w.replayed, w.held, w.other), (2, 0, 1), "{w:?}");
    assert!(w.building <= w.elapsed, "{w:?}");
    let reasons: Vec<&str> = w.skipped.iter().map(|k| k.reason.as_str()).collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("a recorded graph")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("another signature")),
        "{reasons:?}"
    );
    assert_eq!(fresh.len(), 2);
    assert!(ws.capacity() >= w.workspace);
    // The process's first lookup of the graph hits: no plan is built, and it computes y.
    let c2 = conv_case(&s, &cudnn2, 32);
    let plan = fresh
        .get(&cudnn2, &c2.og, &filter)
        .expect("a warmed-up plan");
    assert_eq!(plan.name(), name);
    c2.run_check(&s, &cudnn2, plan, &mut ws, "warmed-up plan");
    assert_eq!((fresh.stats().hits, fresh.stats().misses), (1, 0));
    // Held plans are not rebuilt.
    let again = fresh.warm_up(&cudnn2, &mut ws).unwrap();
    assert_eq!((again.replayed, again.held, again.skipped.len()), (0, 2, 2));
    // Lookups keep writing the graphs (the skipped choice gains its graph once it is used).
    let _ = fresh
        .get_or_build(&cudnn2, &c2.og, &filter.clone().with_deterministic(true))
        .unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let key2 = PlanCache::key(&cudnn2, &c2.og, &filter.clone().with_deterministic(true));
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{}\t", file_key(&key2))))
        .unwrap();
    assert_eq!(line.split('\t').count(), 4, "{line}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn gpu_unsupported_graph_is_a_typed_error() {
    let Some((_s, cudnn)) = gpu() else { return };
    // Two convolutions chained inside one graph: no engine fuses that.
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[1, 8, 8, 8], DType::F16).unwrap();
    let w1 = g.tensor_nhwc("w1", &[8, 8, 3, 3], DType::F16).unwrap();
    let w2 = g.tensor_nhwc("w2", &[8, 8, 3, 3], DType::F16).unwrap();
    let p = ConvParams::new(2).with_padding(&[1, 1]);
    let y1 = g.conv_fprop(x, w1, &p).unwrap();
    let y2 = g.conv_fprop(y1, w2, &p).unwrap();
    g.mark_output(y2).unwrap();
    let r = g
        .build(&cudnn)
        .and_then(|og| og.plans(&cudnn, &PlanFilter::new()).map(|_| ()));
    match r {
        Err(Error::Cudnn { status, .. }) => {
            eprintln!("rejected with {status}");
            assert_ne!(status, Status::SUCCESS);
        }
        Err(Error::NoEngine { .. }) => {}
        other => panic!("expected a typed rejection, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Layer normalization (NORM_FORWARD / NORM_BACKWARD in CUDNN_LAYER_NORM mode)
// ---------------------------------------------------------------------------------------------

const LN_N: i64 = 8;
const LN_D: i64 = 96;
const LN_EPS: f64 = 1e-5;

/// A layer-norm forward graph on x `[N, D, 1, 1]` (channels-last, as cudnn-frontend's samples)
/// of `dt`, f32 scale / bias and statistics: (graph, x, scale, bias, y, stats).
#[allow(clippy::type_complexity)]
fn ln_fwd_graph(
    dt: DType,
    training: bool,
) -> (
    Graph,
    TensorId,
    TensorId,
    TensorId,
    TensorId,
    Option<(TensorId, TensorId)>,
) {
    let mut g = Graph::new(dt, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[LN_N, LN_D, 1, 1], dt).unwrap();
    let scale = g
        .tensor_nhwc("scale", &[1, LN_D, 1, 1], DType::F32)
        .unwrap();
    let bias = g.tensor_nhwc("bias", &[1, LN_D, 1, 1], DType::F32).unwrap();
    let out = g.layer_norm(x, scale, bias, LN_EPS, training).unwrap();
    g.mark_output(out.y).unwrap();
    if let Some((m, v)) = out.stats {
        g.mark_output_as(m, DType::F32).unwrap();
        g.mark_output_as(v, DType::F32).unwrap();
    }
    (g, x, scale, bias, out.y, out.stats)
}

/// A layer-norm backward graph: dy, x of `dt`, f32 scale, statistics, dscale and dbias.
#[allow(clippy::type_complexity)]
fn ln_bwd_graph(dt: DType) -> (Graph, [TensorId; 5], cudnn_safe::graph::LayerNormGrads) {
    let mut g = Graph::new(dt, DType::F32, DType::F32);
    let dy = g.tensor_nhwc("dy", &[LN_N, LN_D, 1, 1], dt).unwrap();
    let x = g.tensor_nhwc("x", &[LN_N, LN_D, 1, 1], dt).unwrap();
    let scale = g
        .tensor_nhwc("scale", &[1, LN_D, 1, 1], DType::F32)
        .unwrap();
    let mean = g.tensor_nhwc("mean", &[LN_N, 1, 1, 1], DType::F32).unwrap();
    let inv = g
        .tensor_nhwc("inv_var", &[LN_N, 1, 1, 1], DType::F32)
        .unwrap();
    let grads = g.layer_norm_backward(dy, x, scale, mean, inv).unwrap();
    g.mark_output(grads.dx).unwrap();
    g.mark_output_as(grads.dscale, DType::F32).unwrap();
    g.mark_output_as(grads.dbias, DType::F32).unwrap();
    (g, [dy, x, scale, mean, inv], grads)
}

#[test]
fn host_layer_norm_shapes_and_finalize() {
    // Shapes of the outputs.
    let (g, x, _, _, y, stats) = ln_fwd_graph(DType::F16, true);
    assert_eq!(g.dims(y).unwrap(), &[LN_N, LN_D, 1, 1]);
    assert_eq!(g.strides(y).unwrap(), g.strides(x).unwrap());
    assert_eq!(g.dtype(y).unwrap(), DType::F16);
    let (m, v) = stats.expect("training gives statistics");
    for t in [m, v] {
        assert_eq!(g.dims(t).unwrap(), &[LN_N, 1, 1, 1]);
        assert_eq!(g.dtype(t).unwrap(), DType::F32);
        assert!(!g.is_virtual(t).unwrap());
    }
    let (gi, _, _, _, _, none) = ln_fwd_graph(DType::F32, false);
    assert!(none.is_none(), "inference gives no statistics");
    let (gb, _, grads) = ln_bwd_graph(DType::BF16);
    assert_eq!(gb.dims(grads.dx).unwrap(), &[LN_N, LN_D, 1, 1]);
    assert_eq!(gb.dims(grads.dscale).unwrap(), &[1, LN_D, 1, 1]);
    assert_eq!(gb.dims(grads.dbias).unwrap(), &[1, LN_D, 1, 1]);
    assert_ne!(g.signature(), gi.signature());

    // Shape checks name the tensors; a rejected call leaves the graph usable (no stray
    // epsilon scalar: the graph below still validates).
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nhwc("x", &[4, 16, 1, 1], DType::F32).unwrap();
    let x2 = g.tensor_nchw("x2", &[4, 16], DType::F32).unwrap();
    let s = g.tensor_nhwc("s", &[1, 16, 1, 1], DType::F32).unwrap();
    let b = g.tensor_nhwc("b", &[1, 16, 1, 1], DType::F32).unwrap();
    let s_bad = g.tensor_nhwc("s_bad", &[1, 15, 1, 1], DType::F32).unwrap();
    let s_batch = g
        .tensor_nhwc("s_batch", &[4, 16, 1, 1], DType::F32)
        .unwrap();
    let r = g.layer_norm(x, s_bad, b, 1e-5, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    assert!(format!("{:?}", r.unwrap_err()).contains("s_bad"));
    let r = g.layer_norm(x, s, s_batch, 1e-5, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    assert!(format!("{:?}", r.unwrap_err()).contains("s_batch"));
    let r = g.layer_norm(x2, s, b, 1e-5, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    for eps in [f64::NAN, -1e-5, f64::INFINITY] {
        let r = g.layer_norm(x, s, b, eps, true);
        assert!(
            matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
            "eps {eps}: {r:?}"
        );
    }
    let sc = g.scalar("sc", 1.0, DType::F32).unwrap();
    let r = g.layer_norm(x, sc, b, 1e-5, true);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let out = g.layer_norm(x, s, b, 1e-5, true).unwrap();
    let (m, v) = out.stats.unwrap();
    // Backward shape checks.
    let dy = g.tensor_nhwc("dy", &[4, 16, 1, 1], DType::F32).unwrap();
    let dy_bad = g.tensor_nhwc("dy_bad", &[4, 16, 2, 1], DType::F32).unwrap();
    let r = g.layer_norm_backward(dy_bad, x, s, m, v);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    assert!(format!("{:?}", r.unwrap_err()).contains("dy_bad"));
    let r = g.layer_norm_backward(dy, x, s, out.y, v);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let r = g.layer_norm_backward(dy, x, s_bad, m, v);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::ShapeMismatch { .. })),
        "{r:?}"
    );
    let mut other = Graph::new(DType::F32, DType::F32, DType::F32);
    let foreign = other
        .tensor_nhwc("foreign", &[4, 16, 1, 1], DType::F32)
        .unwrap();
    let r = g.layer_norm_backward(foreign, x, s, m, v);
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    // The statistics of this graph's forward feed its backward (a training step in one graph).
    let grads = g.layer_norm_backward(dy, x, s, m, v).unwrap();
    g.mark_output(out.y).unwrap();
    for t in [grads.dx, grads.dscale, grads.dbias] {
        g.mark_output(t).unwrap();
    }

    // cuDNN's own validation of the descriptors (no GPU needed).
    if !have_cudnn() {
        return;
    }
    // Unused tensors (x2, s_bad, s_batch, dy_bad, sc) make the structure check fail.
    let r = g.check();
    assert!(
        matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
        "{r:?}"
    );
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for training in [true, false] {
            let (g, ..) = ln_fwd_graph(dt, training);
            g.check()
                .unwrap_or_else(|e| panic!("layer norm {dt} training {training}: {e}"));
        }
        let (g, ..) = ln_bwd_graph(dt);
        g.check()
            .unwrap_or_else(|e| panic!("layer norm backward {dt}: {e}"));
    }
}

/// Per-row mean and inverse standard deviation `1/√(var + ε)` (biased variance) of x `[N, D]`.
fn ln_stats(xf: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let d = LN_D as usize;
    xf.chunks(d)
        .map(|row| {
            let mean = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
            (mean, 1.0 / (var + LN_EPS).sqrt())
        })
        .unzip()
}

/// f32 results of a normalization computed in f32: the statistics (one-pass or rsqrt-based in
/// the engines) lose a few bits against the f64 reference, so 1e-4 rather than fp32's 1e-5; f32
/// outputs derived from half data get 1e-3 in case an engine keeps half intermediates.
fn ln_f32_tol<T: DataType>() -> f64 {
    if T::DTYPE == DType::F32 {
        1e-4
    } else {
        1e-3
    }
}

/// Builds the graph and up to 3 plans; `None` (printed, and a typed error required) when cuDNN
/// refuses the configuration, which must not happen when `required`.
fn ln_plans(
    cudnn: &Cudnn,
    g: &Graph,
    what: &str,
    required: bool,
) -> Option<(OperationGraph, Vec<Plan>)> {
    let r = g.build(cudnn).and_then(|og| {
        og.plans(cudnn, &PlanFilter::new().with_max_plans(Some(3)))
            .map(|p| (og, p))
    });
    match r {
        Ok((og, list)) if !list.plans.is_empty() => {
            for p in &list.plans {
                eprintln!("  {what}: plan {} ws {}", p.name(), p.workspace_size());
            }
            Some((og, list.plans))
        }
        Ok(_) => {
            assert!(!required, "{what}: no plan");
            eprintln!("{what}: no plan (refused)");
            None
        }
        Err(e) => {
            assert!(is_no_engine(&e), "{what}: untyped failure {e:?}");
            assert!(!required, "{what}: {e}");
            eprintln!("{what}: refused by cuDNN: {e}");
            None
        }
    }
}

fn layer_norm_fwd_case<T: DataType>(training: bool, seed: u64, required: bool) {
    let Some((s, cudnn)) = gpu() else { return };
    let what = format!("layer norm forward {} training {training}", T::DTYPE);
    let (g, x, scale, bias, y, stats) = ln_fwd_graph(T::DTYPE, training);
    let Some((og, plans)) = ln_plans(&cudnn, &g, &what, required) else {
        return;
    };
    let mut rng = Rng::new(seed);
    let n = (LN_N * LN_D) as usize;
    // An offset keeps the mean away from 0 so that a wrong mean shows.
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let xf: Vec<f64> = xv.iter().map(|v| v.to_f64()).collect();
    let (sv, sf) = values::<f32>(&mut rng, LN_D as usize);
    let (bv, bf) = values::<f32>(&mut rng, LN_D as usize);
    let (mean, inv) = ln_stats(&xf);
    let d = LN_D as usize;
    let want_y: Vec<f64> = (0..n)
        .map(|i| (xf[i] - mean[i / d]) * inv[i / d] * sf[i % d] + bf[i % d])
        .collect();
    let xb = upload(&s, &og, x, &xv);
    let sb = upload(&s, &og, scale, &sv);
    let bb = upload(&s, &og, bias, &bv);
    let y_tol = tol::<T>().max(1e-4);
    let mut ws = Workspace::new(s.clone());
    for plan in &plans {
        let mut yb = poisoned::<T>(&s, &og, y);
        let mut mb = s.clone_htod(&vec![f32::NAN; LN_N as usize]).unwrap();
        let mut vb = s.clone_htod(&vec![f32::NAN; LN_N as usize]).unwrap();
        {
            let mut args = Args::new(&cudnn);
            args.input(x, &xb).unwrap();
            args.input(scale, &sb).unwrap();
            args.input(bias, &bb).unwrap();
            args.output(y, &mut yb).unwrap();
            if let Some((m, v)) = stats {
                args.output(m, &mut mb).unwrap();
                args.output(v, &mut vb).unwrap();
            }
            cudnn.execute(plan, &args, &mut ws).unwrap();
        }
        let name = format!("{what} {}", plan.name());
        check(
            &format!("{name} y"),
            &fetch(&s, &og, y, &yb),
            &want_y,
            y_tol,
        );
        if let Some((m, v)) = stats {
            let t = ln_f32_tol::<T>();
            check(&format!("{name} mean"), &fetch(&s, &og, m, &mb), &mean, t);
            check(&format!("{name} inv_var"), &fetch(&s, &og, v, &vb), &inv, t);
        }
    }
    // Rejected: a statistics buffer one element short is refused when bound, and executing
    // without it is refused too; y stays untouched.
    if let Some((m, v)) = stats {
        let (mut yb, before) = sentinel_buffer::<T>(&s, og.span(y).unwrap());
        let mut short = s.clone_htod(&vec![0f32; LN_N as usize - 1]).unwrap();
        let mut vb = s.clone_htod(&vec![0f32; LN_N as usize]).unwrap();
        {
            let mut args = Args::new(&cudnn);
            args.input(x, &xb).unwrap();
            args.input(scale, &sb).unwrap();
            args.input(bias, &bb).unwrap();
            args.output(y, &mut yb).unwrap();
            args.output(v, &mut vb).unwrap();
            // Spans are checked when the plan executes (a binding only records the buffer).
            let bound = args.output(m, &mut short).map(|_| ());
            let r = cudnn.execute(&plans[0], &args, &mut ws);
            if bound.is_ok() {
                assert!(
                    matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
                    "{r:?}"
                );
            } else {
                assert!(
                    matches!(&bound, Err(cudnn_safe::Error::BufferTooSmall { .. })),
                    "{bound:?}"
                );
                assert!(r.is_err(), "execution without the mean buffer");
            }
        }
        assert_untouched(&format!("{what} y"), &s, &yb, &before);
    }
}

#[test]
fn gpu_layer_norm_forward_training_f32() {
    layer_norm_fwd_case::<f32>(true, 41, false);
}

/// cudnn-frontend's own sample configuration (f16 io, f32 scale, bias and statistics).
#[test]
fn gpu_layer_norm_forward_training_f16() {
    layer_norm_fwd_case::<f16>(true, 42, true);
}

#[test]
fn gpu_layer_norm_forward_training_bf16() {
    layer_norm_fwd_case::<bf16>(true, 43, false);
}

#[test]
fn gpu_layer_norm_forward_inference_every_dtype() {
    layer_norm_fwd_case::<f32>(false, 44, false);
    layer_norm_fwd_case::<f16>(false, 45, true);
    layer_norm_fwd_case::<bf16>(false, 46, false);
}

fn layer_norm_bwd_case<T: DataType>(seed: u64, required: bool) {
    let Some((s, cudnn)) = gpu() else { return };
    let what = format!("layer norm backward {}", T::DTYPE);
    let (g, [dy, x, scale, mean, inv], grads) = ln_bwd_graph(T::DTYPE);
    let Some((og, plans)) = ln_plans(&cudnn, &g, &what, required) else {
        return;
    };
    let mut rng = Rng::new(seed);
    let (n, d) = ((LN_N * LN_D) as usize, LN_D as usize);
    let xv: Vec<T> = rng.values_in(n, -1.5, 2.5);
    let xf: Vec<f64> = xv.iter().map(|v| v.to_f64()).collect();
    let (dyv, dyf) = values::<T>(&mut rng, n);
    let (sv, sf) = values::<f32>(&mut rng, d);
    // The saved statistics as a training forward pass leaves them (f32); the reference uses
    // exactly the stored values.
    let (m64, i64_) = ln_stats(&xf);
    let mv: Vec<f32> = m64.iter().map(|&v| v as f32).collect();
    let iv: Vec<f32> = i64_.iter().map(|&v| v as f32).collect();
    let (mf, inf): (Vec<f64>, Vec<f64>) = (
        mv.iter().map(|&v| v as f64).collect(),
        iv.iter().map(|&v| v as f64).collect(),
    );
    let xhat: Vec<f64> = (0..n).map(|i| (xf[i] - mf[i / d]) * inf[i / d]).collect();
    let gv: Vec<f64> = (0..n).map(|i| dyf[i] * sf[i % d]).collect();
    let mut want_dx = vec![0.0; n];
    for (r, &inv_r) in inf.iter().enumerate() {
        let row = r * d..(r + 1) * d;
        let mg = gv[row.clone()].iter().sum::<f64>() / d as f64;
        let mgx = row.clone().map(|i| gv[i] * xhat[i]).sum::<f64>() / d as f64;
        for i in row {
            want_dx[i] = inv_r * (gv[i] - mg - xhat[i] * mgx);
        }
    }
    let mut want_ds = vec![0.0; d];
    let mut want_db = vec![0.0; d];
    for i in 0..n {
        want_ds[i % d] += dyf[i] * xhat[i];
        want_db[i % d] += dyf[i];
    }
    let dyb = upload(&s, &og, dy, &dyv);
    let xb = upload(&s, &og, x, &xv);
    let sb = upload(&s, &og, scale, &sv);
    let mb = upload(&s, &og, mean, &mv);
    let ib = upload(&s, &og, inv, &iv);
    let mut ws = Workspace::new(s.clone());
    for plan in &plans {
        let mut dxb = poisoned::<T>(&s, &og, grads.dx);
        let mut dsb = poisoned::<f32>(&s, &og, grads.dscale);
        let mut dbb = poisoned::<f32>(&s, &og, grads.dbias);
        {
            let mut args = Args::new(&cudnn);
            args.input(dy, &dyb).unwrap().input(x, &xb).unwrap();
            args.input(scale, &sb).unwrap().input(mean, &mb).unwrap();
            args.input(inv, &ib).unwrap();
            args.output(grads.dx, &mut dxb).unwrap();
            args.output(grads.dscale, &mut dsb).unwrap();
            args.output(grads.dbias, &mut dbb).unwrap();
            cudnn.execute(plan, &args, &mut ws).unwrap();
        }
        let name = format!("{what} {}", plan.name());
        let t = ln_f32_tol::<T>();
        let got = fetch(&s, &og, grads.dx, &dxb);
        check(&format!("{name} dx"), &got, &want_dx, tol::<T>().max(1e-4));
        let got = fetch(&s, &og, grads.dscale, &dsb);
        check(&format!("{name} dscale"), &got, &want_ds, t);
        let got = fetch(&s, &og, grads.dbias, &dbb);
        check(&format!("{name} dbias"), &got, &want_db, t);
    }
    // Rejected: an inv_var buffer of the wrong data type (T instead of f32) is refused before
    // anything runs; dx stays untouched.
    let (mut dxb, before) = sentinel_buffer::<T>(&s, og.span(grads.dx).unwrap());
    let wrong = s
        .clone_htod(&vec![T::from_f64(1.0); LN_N as usize])
        .unwrap();
    let mut dsb = poisoned::<f32>(&s, &og, grads.dscale);
    let mut dbb = poisoned::<f32>(&s, &og, grads.dbias);
    {
        let mut args = Args::new(&cudnn);
        args.output(grads.dx, &mut dxb).unwrap();
        // Every other tensor correctly bound: the wrong type alone must stop the execution
        // (checked when the plan executes; a binding only records the buffer).
        args.input(dy, &dyb).unwrap().input(x, &xb).unwrap();
        args.input(scale, &sb).unwrap().input(mean, &mb).unwrap();
        args.output(grads.dscale, &mut dsb).unwrap();
        args.output(grads.dbias, &mut dbb).unwrap();
        let bound = args.input(inv, &wrong).map(|_| ());
        let r = cudnn.execute(&plans[0], &args, &mut ws);
        if T::DTYPE == DType::F32 {
            // Same type as the statistics: this binding is valid, so the call runs.
            assert!(bound.is_ok() && r.is_ok(), "{what}: {bound:?} {r:?}");
        } else {
            assert!(
                matches!(&bound, Err(cudnn_safe::Error::UnsupportedDataType { .. }))
                    || matches!(&r, Err(cudnn_safe::Error::UnsupportedDataType { .. })),
                "{what}: inv_var bound to a {} buffer: {bound:?} {r:?}",
                T::DTYPE
            );
        }
    }
    if T::DTYPE != DType::F32 {
        assert_untouched(&format!("{what} dx"), &s, &dxb, &before);
    }
}

#[test]
fn gpu_layer_norm_backward_f32() {
    layer_norm_bwd_case::<f32>(51, false);
}

/// cudnn-frontend's own sample configuration (f16 dy, x, dx; f32 scale, statistics, dscale,
/// dbias).
#[test]
fn gpu_layer_norm_backward_f16() {
    layer_norm_bwd_case::<f16>(52, true);
}

#[test]
fn gpu_layer_norm_backward_bf16() {
    layer_norm_bwd_case::<bf16>(53, false);
}

// ---------------------------------------------------------------------------------------------
// CUDA graphs populated from plans (cuDNN's native CUDA-graph API, cuDNN >= 9.5)
// ---------------------------------------------------------------------------------------------

use cudnn_safe::graph::{PlanGraph, CUDA_GRAPH_NOT_SUPPORTED};

#[test]
fn host_cuda_graph_filter_status_and_send() {
    common::assert_send::<PlanGraph<'static>>();
    let f = PlanFilter::new().with_cuda_graph_native(true);
    assert_ne!(
        f,
        PlanFilter::new(),
        "the option is part of the filter (and its cache key)"
    );
    assert_eq!(f.clone().with_cuda_graph_native(false), PlanFilter::new());
    assert!(
        format!("{f:?}").contains("cuda_graph_native: true"),
        "{f:?}"
    );
    assert_eq!(CUDA_GRAPH_NOT_SUPPORTED, Status(3013));
    assert_eq!(
        CUDA_GRAPH_NOT_SUPPORTED.known_name(),
        Some("CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API")
    );
}

/// The graphs the CUDA-graph tests run finalize with the real cuDNN library (host only).
#[test]
fn host_cuda_graph_case_graphs_finalize() {
    if !have_cudnn() {
        return;
    }
    for fused in [true, false] {
        let (g, ..) = cuda_graph_conv_graph(fused);
        g.check()
            .unwrap_or_else(|e| panic!("conv graph (fused {fused}): {e}"));
    }
    for prologue in [true, false] {
        let (g, ..) = cuda_graph_matmul_graph(prologue);
        g.check()
            .unwrap_or_else(|e| panic!("matmul graph (prologue {prologue}): {e}"));
    }
}

/// A graph with f16 inputs and one f16 output, its inputs uploaded, and the f64 reference.
struct CudaGraphCase {
    what: &'static str,
    og: OperationGraph,
    ins: Vec<(TensorId, CudaSlice<f16>)>,
    y: TensorId,
    want: Vec<f64>,
}

impl CudaGraphCase {
    fn inputs(&self) -> Vec<(TensorId, &CudaSlice<f16>)> {
        self.ins.iter().map(|(t, b)| (*t, b)).collect()
    }
}

/// `y = relu(conv(x, w) + b)`, f16 NHWC (f32 inside), or the plain convolution.
/// The graph of [`cuda_graph_conv_case`]: x, w, the bias if `fused`, y.
fn cuda_graph_conv_graph(fused: bool) -> (Graph, TensorId, TensorId, Option<TensorId>, TensorId) {
    let geo = conv_geometry();
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let x = input::<f16>(&mut g, "x", &geo.x, true);
    let w = input::<f16>(&mut g, "w", &geo.w, true);
    let mut y = g.conv_fprop(x, w, &geo.params()).unwrap();
    let b = fused.then(|| input::<f16>(&mut g, "b", &[1, geo.w[0], 1, 1], true));
    if let Some(b) = b {
        y = g.bias(y, b).unwrap();
        y = g.pointwise(PointwiseMode::Relu, y, None).unwrap();
    }
    g.set_name(y, "y").unwrap();
    g.mark_output(y).unwrap();
    (g, x, w, b, y)
}

fn cuda_graph_conv_case(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    fused: bool,
    seed: u64,
) -> CudaGraphCase {
    let geo = conv_geometry();
    let yd = geo.y();
    let mut rng = Rng::new(seed);
    let (g, x, w, b, y) = cuda_graph_conv_graph(fused);
    let og = g.build(cudnn).unwrap();
    let (xv, xf) = values::<f16>(&mut rng, count(&geo.x));
    let (wv, wf) = values::<f16>(&mut rng, count(&geo.w));
    let mut want = vec![0.0; count(&yd)];
    geo.for_each_term(|xi, fi, yi| want[yi] += xf[xi] * wf[fi]);
    let mut ins = vec![(x, upload(s, &og, x, &xv)), (w, upload(s, &og, w, &wv))];
    if let Some(b) = b {
        let (bv, bf) = values::<f16>(&mut rng, geo.w[0] as usize);
        let plane = (yd[2] * yd[3]) as usize;
        for (i, v) in want.iter_mut().enumerate() {
            *v = (*v + bf[(i / plane) % yd[1] as usize]).max(0.0);
        }
        ins.push((b, upload(s, &og, b, &bv)));
    }
    CudaGraphCase {
        what: if fused {
            "conv+bias+relu f16"
        } else {
            "conv f16"
        },
        og,
        ins,
        y,
        want,
    }
}

/// Batch, M, K, N of [`cuda_graph_matmul_case`] (NVIDIA's sample's sizes).
const MATMUL_SAMPLE: (usize, usize, usize, usize) = (8, 32, 8, 16);

/// The graph of [`cuda_graph_matmul_case`]: a, b, d.
fn cuda_graph_matmul_graph(prologue: bool) -> (Graph, TensorId, TensorId, TensorId) {
    let (bt, m, k, n) = MATMUL_SAMPLE;
    let mut g = Graph::new(DType::F16, DType::F32, DType::F32);
    let a = g
        .tensor_nchw("a", &[bt as i64, m as i64, k as i64], DType::F16)
        .unwrap();
    let b = g
        .tensor_nchw("b", &[bt as i64, k as i64, n as i64], DType::F16)
        .unwrap();
    let half = g.scalar("scale", 0.5, DType::F32).unwrap();
    let two = g.scalar("bias", 2.0, DType::F32).unwrap();
    let t = if prologue {
        let sa = g.scale(a, half).unwrap();
        g.matmul(sa, b).unwrap()
    } else {
        let ab = g.matmul(a, b).unwrap();
        g.scale(ab, half).unwrap()
    };
    let d = g.pointwise(PointwiseMode::Add, t, Some(two)).unwrap();
    g.set_name(d, "d").unwrap();
    g.mark_output(d).unwrap();
    (g, a, b, d)
}

/// NVIDIA's own native CUDA-graph sample (cudnn-frontend "Cuda graphs with matmul add"):
/// `d = (a·0.5)·b + 2` (`prologue`: the scale before the matmul, as the sample has it, its
/// result an f32 virtual tensor here where the sample makes it f16), or `d = (a·b)·0.5 + 2`
/// (the same values, both pointwise operations after the matmul); f16 `[8, 32, 8]·[8, 8, 16]`,
/// f32 inside, scalars by value.
fn cuda_graph_matmul_case(
    s: &Arc<CudaStream>,
    cudnn: &Cudnn,
    prologue: bool,
    seed: u64,
) -> CudaGraphCase {
    let (bt, m, k, n) = MATMUL_SAMPLE;
    let mut rng = Rng::new(seed);
    let (g, a, b, d) = cuda_graph_matmul_graph(prologue);
    let og = g.build(cudnn).unwrap();
    let (av, af) = values::<f16>(&mut rng, bt * m * k);
    let (bv, bf) = values::<f16>(&mut rng, bt * k * n);
    let mut want = vec![0.0; bt * m * n];
    for p in 0..bt {
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k)
                    .map(|q| 0.5 * af[(p * m + i) * k + q] * bf[(p * k + q) * n + j])
                    .sum();
                want[(p * m + i) * n + j] = dot + 2.0;
            }
        }
    }
    CudaGraphCase {
        what: if prologue {
            "(a*0.5)·b+2 f16 (NVIDIA's sample)"
        } else {
            "(a·b)*0.5+2 f16"
        },
        ins: vec![(a, upload(s, &og, a, &av)), (b, upload(s, &og, b, &bv))],
        og,
        y: d,
        want,
    }
}

/// Plans of `og` whose engine supports the native CUDA-graph API (heuristics, then every
/// engine), at most `max`; empty when there is none.
fn native_plans(cudnn: &Cudnn, og: &OperationGraph, max: usize) -> Vec<Plan> {
    let filter = PlanFilter::new()
        .with_cuda_graph_native(true)
        .with_all_engines(true)
        .with_max_plans(Some(max));
    match og.plans(cudnn, &filter) {
        Ok(list) => {
            assert!(list.plans.iter().all(Plan::supports_cuda_graph));
            list.plans
        }
        Err(e) => {
            eprintln!("  no plan with native CUDA-graph support: {e}");
            Vec::new()
        }
    }
}

/// Executes `plan` with [`Cudnn::execute`], then populates a CUDA graph with it, launches it
/// twice, rebinds it to a second output ([`PlanGraph::update`]) and launches it again from
/// another thread: both
/// graph outputs must match the f64 reference, and the executed output exactly when the engine
/// is deterministic (same plan, same inputs).
fn cuda_graph_roundtrip(s: &Arc<CudaStream>, cudnn: &Cudnn, c: &CudaGraphCase, plan: &Plan) {
    let what = format!("{} {}", c.what, plan.name());
    eprintln!("  {what}: behaviour notes {:?}", plan.behavior_notes());
    assert!(plan.supports_cuda_graph(), "{what}");
    let tol = tol::<f16>();
    let ins = c.inputs();
    let mut ws = Workspace::new(s.clone());
    let mut y_exec = poisoned::<f16>(s, &c.og, c.y);
    run(cudnn, plan, &ins, &mut [(c.y, &mut y_exec)], &mut ws).unwrap();
    let executed = fetch(s, &c.og, c.y, &y_exec);
    check(&format!("{what} execute"), &executed, &c.want, tol);

    let mut y1 = poisoned::<f16>(s, &c.og, c.y);
    let mut y2 = poisoned::<f16>(s, &c.og, c.y);
    {
        let mut a1 = Args::new(cudnn);
        let mut a2 = Args::new(cudnn);
        for (t, b) in &ins {
            a1.input(*t, *b).unwrap();
            a2.input(*t, *b).unwrap();
        }
        a1.output(c.y, &mut y1).unwrap();
        a2.output(c.y, &mut y2).unwrap();
        let mut graph = cudnn.populate_cuda_graph(plan, &a1, &mut ws).unwrap();
        assert_eq!(graph.plan_name(), plan.name());
        assert_eq!(graph.workspace_size(), plan.workspace_size());
        let nodes = graph.node_count().unwrap();
        assert!(nodes >= 1, "{what}: cuDNN put no node in the graph");
        eprintln!("  {what}: {nodes} graph node(s), {graph:?}");
        graph.launch().unwrap();
        graph.launch().unwrap();
        graph.update(cudnn, &a2).unwrap();
        // The graph is `Send`: launched from another thread, then handed back.
        let graph = std::thread::scope(|sc| {
            sc.spawn(move || {
                graph.launch().unwrap();
                graph
            })
            .join()
            .unwrap()
        });
        drop(graph);
    }
    let got1 = fetch(s, &c.og, c.y, &y1);
    let got2 = fetch(s, &c.og, c.y, &y2);
    check(
        &format!("{what} graph, launched twice"),
        &got1,
        &c.want,
        tol,
    );
    check(&format!("{what} graph after update"), &got2, &c.want, tol);
    if plan.is_deterministic() {
        for (i, ((a, b), e)) in got1.iter().zip(&got2).zip(&executed).enumerate() {
            assert!(
                a.to_f64() == e.to_f64() && b.to_f64() == e.to_f64(),
                "{what}: element {i}: graph {a:?} / updated graph {b:?} vs execute {e:?}"
            );
        }
    } else {
        let exec_f64: Vec<f64> = executed.iter().map(|v| v.to_f64()).collect();
        check(&format!("{what} graph vs execute"), &got1, &exec_f64, tol);
    }
}

/// The conv + bias + ReLU graph through a CUDA graph, when an engine supports the native API
/// for it; then a plain convolution, NVIDIA's matmul sample and its epilogue-only variant (each
/// that has such an engine goes through [`cuda_graph_roundtrip`]). With cuDNN >= 9.5 at least
/// one of them must populate (NVIDIA's sample asserts support for its graph).
#[test]
fn gpu_cuda_graph_conv_bias_relu_and_fallbacks() {
    let Some((s, cudnn)) = gpu() else { return };
    if cudnn.version() < 90500 {
        eprintln!(
            "skipping: cuDNN {} has no native CUDA-graph API (9.5+)",
            cudnn.version()
        );
        return;
    }
    let cases = [
        cuda_graph_conv_case(&s, &cudnn, true, 61),
        cuda_graph_conv_case(&s, &cudnn, false, 62),
        cuda_graph_matmul_case(&s, &cudnn, true, 63),
        cuda_graph_matmul_case(&s, &cudnn, false, 63),
    ];
    let mut populated = Vec::new();
    for c in &cases {
        eprintln!("{}:", c.what);
        let plans = native_plans(&cudnn, &c.og, 2);
        for plan in &plans {
            cuda_graph_roundtrip(&s, &cudnn, c, plan);
        }
        if !plans.is_empty() {
            populated.push(c.what);
        }
    }
    eprintln!("populated CUDA graphs for: {populated:?}");
    assert!(
        !populated.is_empty(),
        "no engine supports the native CUDA-graph API for any of {:?} (cuDNN {})",
        cases.iter().map(|c| c.what).collect::<Vec<_>>(),
        cudnn.version()
    );
}

/// A plan whose engine lacks the behaviour note is refused with the typed error before cuDNN is
/// called, as are bad bindings for a supported plan; the sentinel-filled output stays untouched.
#[test]
fn gpu_cuda_graph_rejections_leave_outputs_untouched() {
    let Some((s, cudnn)) = gpu() else { return };
    let c = cuda_graph_conv_case(&s, &cudnn, true, 64);
    let ins = c.inputs();
    let span = c.og.span(c.y).unwrap();
    let mut ws = Workspace::new(s.clone());
    let all =
        c.og.plans(
            &cudnn,
            &PlanFilter::new()
                .with_all_engines(true)
                .with_max_plans(Some(16)),
        )
        .unwrap()
        .plans;
    let (native, other): (Vec<Plan>, Vec<Plan>) =
        all.into_iter().partition(Plan::supports_cuda_graph);
    eprintln!(
        "{}: {} plan(s) with native CUDA-graph support, {} without",
        c.what,
        native.len(),
        other.len()
    );
    let bind = |y: &mut CudaSlice<f16>, f: &mut dyn FnMut(&Args<'_>)| {
        let mut args = Args::new(&cudnn);
        for (t, b) in &ins {
            args.input(*t, *b).unwrap();
        }
        args.output(c.y, y).unwrap();
        f(&args);
    };
    for plan in other.iter().take(3) {
        let (mut yb, before) = sentinel_buffer::<f16>(&s, span);
        bind(&mut yb, &mut |args| {
            let r = cudnn.populate_cuda_graph(plan, args, &mut ws);
            let e = r.expect_err("a plan without the note must be refused");
            assert_eq!(e.status(), Some(CUDA_GRAPH_NOT_SUPPORTED), "{e}");
            assert!(e.to_string().contains(&plan.name()), "{e}");
            assert!(
                e.to_string()
                    .contains("CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API"),
                "{e}"
            );
        });
        assert_untouched(&format!("refused {}", plan.name()), &s, &yb, &before);
    }
    if let Some(plan) = native.first() {
        // A short output buffer.
        let (mut short, before) = sentinel_buffer::<f16>(&s, span - 1);
        {
            let mut args = Args::new(&cudnn);
            for (t, b) in &ins {
                args.input(*t, *b).unwrap();
            }
            args.output(c.y, &mut short).unwrap();
            let r = cudnn.populate_cuda_graph(plan, &args, &mut ws);
            assert!(
                matches!(&r, Err(cudnn_safe::Error::BufferTooSmall { .. })),
                "{r:?}"
            );
        }
        assert_untouched("short output", &s, &short, &before);
        // An input left unbound.
        let (mut yb, before) = sentinel_buffer::<f16>(&s, span);
        {
            let mut args = Args::new(&cudnn);
            args.input(ins[0].0, ins[0].1).unwrap();
            args.output(c.y, &mut yb).unwrap();
            let r = cudnn.populate_cuda_graph(plan, &args, &mut ws);
            assert!(
                matches!(&r, Err(cudnn_safe::Error::InvalidArgument { .. })),
                "{r:?}"
            );
        }
        assert_untouched("missing input", &s, &yb, &before);
        // A workspace limited below the plan's need.
        if plan.workspace_size() > 0 {
            let mut small = Workspace::new(s.clone()).with_limit(plan.workspace_size() - 1);
            let (mut yb, before) = sentinel_buffer::<f16>(&s, span);
            {
                let mut args = Args::new(&cudnn);
                for (t, b) in &ins {
                    args.input(*t, *b).unwrap();
                }
                args.output(c.y, &mut yb).unwrap();
                let r = cudnn.populate_cuda_graph(plan, &args, &mut small);
                assert!(
                    matches!(&r, Err(cudnn_safe::Error::WorkspaceLimit { .. })),
                    "{r:?}"
                );
            }
            assert_untouched("workspace over its limit", &s, &yb, &before);
        }
    } else {
        eprintln!(
            "  no native plan for {}: binding checks not exercised",
            c.what
        );
        assert!(!other.is_empty());
    }
}
