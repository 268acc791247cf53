//! Capturing a sequence of calls into a CUDA graph ([`Cudnn::capture`]): replays that compute
//! what the calls compute with each launch's inputs, buffers replaced after capture refused at
//! launch, and work a graph cannot record (a workspace growing, a tuner's first decision)
//! refused during the capture, before any CUDA call, with the stream usable afterwards. (A host
//! synchronization is refused by CUDA itself; no test makes one, so that compute-sanitizer,
//! which counts refused driver calls as errors, reports none.)
//!
//! No test here makes a stream with `new_stream` (cudarc would then order buffers by events,
//! which a capture refuses: that refusal has its own test). GPU cases skip without a GPU.
mod common;

use std::sync::Arc;

use common::{download, gpu, Rng};
use cudnn_safe::cudarc::driver::{CudaSlice, CudaStream};
use cudnn_safe::half::{bf16, f16};
use cudnn_safe::{CaptureBuffers, Captured, Cudnn, Error, TensorDesc, Workspace};

/// [`Cudnn::capture`] for these tests.
trait CaptureInTests {
    fn capture_in_test<'e, B, F>(
        &'e self,
        buffers: B,
        body: F,
    ) -> cudnn_safe::Result<Captured<'e, B>>
    where
        B: CaptureBuffers,
        F: FnMut(&Cudnn, &mut B) -> cudnn_safe::Result<()> + 'e;
}

impl CaptureInTests for Cudnn {
    fn capture_in_test<'e, B, F>(
        &'e self,
        buffers: B,
        body: F,
    ) -> cudnn_safe::Result<Captured<'e, B>>
    where
        B: CaptureBuffers,
        F: FnMut(&Cudnn, &mut B) -> cudnn_safe::Result<()> + 'e,
    {
        // SAFETY: every closure in these tests reaches device memory only through `buffers`
        // and plain borrows, which outlive the graph; none holds memory behind interior
        // mutability.
        unsafe { self.capture(buffers, body) }
    }
}

// ---------------------------------------------------------------------------------------------
// CUDA-graph capture of a sequence of calls (Cudnn::capture)
// ---------------------------------------------------------------------------------------------

/// A handle on the per-thread default stream (CUDA cannot capture the legacy default stream;
/// no test here makes a stream with `new_stream`, so cudarc orders no buffer by events), or
/// `None` without a GPU.
fn captured_gpu() -> Option<(Arc<CudaStream>, Cudnn)> {
    let (default, _) = gpu()?;
    let stream = default.context().per_thread_stream();
    Some((stream.clone(), Cudnn::new(stream).unwrap()))
}

#[test]
fn capturing_the_default_stream_is_refused_before_anything_happens() {
    let Some((_stream, cudnn)) = gpu() else {
        return;
    };
    let mut ran = false;
    let e = cudnn
        .capture_in_test((), |_, _| {
            ran = true;
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                operation: "starting a capture",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!ran);
}

/// `relu(x)·2 + 1` on the host, in f64.
fn relu_affine(x: &[f32]) -> Vec<f64> {
    x.iter()
        .map(|&v| f64::from(v).max(0.0) * 2.0 + 1.0)
        .collect()
}

#[test]
fn a_captured_sequence_replays_with_the_inputs_of_each_launch() {
    use cudnn_safe::{ActivationDesc, ActivationMode};
    let Some((stream, cudnn)) = captured_gpu() else {
        return;
    };
    let d = TensorDesc::<f32>::nchw(2, 5, 7, 3).unwrap();
    let relu = ActivationDesc::new(ActivationMode::Relu).unwrap();
    let mut rng = Rng::new(77);
    let first: Vec<f32> = (0..d.span())
        .map(|_| rng.uniform(-1.0, 1.0) as f32)
        .collect();
    let x = stream.clone_htod(&first).unwrap();
    let y = stream.clone_htod(&vec![f32::NAN; d.span()]).unwrap();
    let mut t = stream.alloc_zeros::<f32>(d.span()).unwrap();
    // Three calls: t = relu(x); y = 2·t; y += 1 (add_tensor of a tensor of ones).
    let ones = stream.clone_htod(&vec![1.0f32; d.span()]).unwrap();
    // Run once before capturing (kernels load at their first launch, which a capture refuses).
    let mut warm = stream.alloc_zeros::<f32>(d.span()).unwrap();
    cudnn
        .activation_forward(&relu, 1.0, &d, &x, 0.0, &d, &mut t)
        .unwrap();
    cudnn
        .transform_tensor(2.0, &d, &t, 0.0, &d, &mut warm)
        .unwrap();
    cudnn
        .add_tensor(1.0, &d, &ones, 1.0, &d, &mut warm)
        .unwrap();
    let mut graph = cudnn
        .capture_in_test((x, y), |cudnn, (x, y)| {
            cudnn.activation_forward(&relu, 1.0, &d, x, 0.0, &d, &mut t)?;
            cudnn.transform_tensor(2.0, &d, &t, 0.0, &d, y)?;
            cudnn.add_tensor(1.0, &d, &ones, 1.0, &d, y)
        })
        .unwrap();
    // Capturing ran nothing: the output still holds its poison.
    let before = download(&stream, &graph.buffers().1);
    assert!(
        before.iter().all(|v| v.is_nan()),
        "capture must not execute the calls"
    );
    for round in 0..3 {
        let input: Vec<f32> = (0..d.span())
            .map(|_| rng.uniform(-1.0, 1.0) as f32)
            .collect();
        let (x, y) = graph.buffers_mut();
        stream.memcpy_htod(&input, x).unwrap();
        stream.memcpy_htod(&vec![f32::NAN; d.span()], y).unwrap();
        graph.launch().unwrap();
        let got = download(&stream, &graph.buffers().1);
        for (i, (g, e)) in got.iter().zip(relu_affine(&input)).enumerate() {
            assert!(
                (f64::from(*g) - e).abs() <= 1e-6 * e.abs().max(1.0),
                "round {round}: y[{i}] = {g}, expected {e}"
            );
        }
    }
    // Replacing a captured buffer is refused before anything is launched.
    graph.buffers_mut().1 = stream.alloc_zeros::<f32>(d.span()).unwrap();
    let e = graph.launch().unwrap_err();
    assert!(matches!(e, Error::Capture { .. }), "{e:?}");
    assert!(download(&stream, &graph.buffers().1)
        .iter()
        .all(|&v| v == 0.0));
}

/// The copies and conversions of a mixed-precision training step: a same-type transform, a
/// conversion to bf16, an `add_tensor` copy.
fn copies(
    c: &Cudnn,
    (d32, d16): (&TensorDesc<f32>, &TensorDesc<bf16>),
    x: &CudaSlice<f32>,
    (same, narrow, added): (
        &mut CudaSlice<f32>,
        &mut CudaSlice<bf16>,
        &mut CudaSlice<f32>,
    ),
) -> cudnn_safe::Result<()> {
    c.transform_tensor(1.0, d32, x, 0.0, d32, same)?;
    c.transform_tensor(1.0, d32, x, 0.0, d16, narrow)?;
    c.add_tensor(1.0, d32, x, 0.0, d32, added)
}

#[test]
fn copies_and_conversions_replay_in_a_graph() {
    let Some((stream, cudnn)) = captured_gpu() else {
        return;
    };
    let d32 = TensorDesc::<f32>::nchw(64, 64, 1, 1).unwrap();
    let d16 = TensorDesc::<bf16>::nchw(64, 64, 1, 1).unwrap();
    let mut rng = Rng::new(78);
    let n = d32.span();
    let host: Vec<f32> = (0..n).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
    let x = stream.clone_htod(&host).unwrap();
    let mut same = stream.alloc_zeros::<f32>(n).unwrap();
    let mut narrow = stream.alloc_zeros::<bf16>(n).unwrap();
    let mut added = stream.alloc_zeros::<f32>(n).unwrap();
    // Once outside the capture (kernels load at their first launch).
    copies(
        &cudnn,
        (&d32, &d16),
        &x,
        (&mut same, &mut narrow, &mut added),
    )
    .unwrap();
    let mut graph = cudnn
        .capture_in_test((same, narrow, added), |c, (s, nw, a)| {
            copies(c, (&d32, &d16), &x, (s, nw, a))
        })
        .unwrap();
    {
        let (s, nw, a) = graph.buffers_mut();
        stream.memcpy_htod(&vec![f32::NAN; n], s).unwrap();
        stream.memcpy_htod(&vec![bf16::NAN; n], nw).unwrap();
        stream.memcpy_htod(&vec![f32::NAN; n], a).unwrap();
    }
    graph.launch().unwrap();
    let (s, nw, a) = graph.buffers();
    assert_eq!(download(&stream, s), host, "same-type transform");
    assert_eq!(download(&stream, a), host, "add_tensor copy");
    for (i, (g, e)) in download(&stream, nw).iter().zip(&host).enumerate() {
        let g = g.to_f32();
        assert!(
            (g - e).abs() <= e.abs() / 128.0,
            "bf16[{i}] = {g}, expected {e}"
        );
    }
}

#[test]
fn work_a_graph_cannot_record_is_an_error_during_capture() {
    let Some((stream, cudnn)) = captured_gpu() else {
        return;
    };
    // Growing a workspace.
    let mut ws = Workspace::new(stream.clone());
    let e = cudnn
        .capture_in_test((), |_, _| ws.reserve(1 << 20))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                operation: "growing a workspace",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(ws.capacity(), 0);
    // A tuner's first decision (timing candidate plans), then the same call once decided.
    use cudnn_safe::conv::{Epilogue, FusedConv};
    use cudnn_safe::graph::{ConvParams, PlanCache};
    let params = ConvParams::new(2).with_padding(&[1, 1]);
    let epi = Epilogue {
        residual: false,
        relu: true,
    };
    let layer = FusedConv::new(
        &cudnn,
        cudnn_safe::DType::F16,
        [1, 8, 8, 8],
        [8, 8, 3, 3],
        &params,
        epi,
    )
    .unwrap();
    let h = |n: usize| stream.clone_htod(&vec![f16::from_f32(0.25); n]).unwrap();
    let (x, w, b) = (h(layer.x_span()), h(layer.w_span()), h(layer.b_span()));
    let mut y = stream.alloc_zeros::<f16>(layer.y_span()).unwrap();
    let mut plans = PlanCache::new();
    let mut ws = Workspace::new(stream.clone());
    ws.reserve(256 << 20).unwrap();
    let e = cudnn
        .capture_in_test((), |cudnn, _| {
            layer.run(cudnn, &mut plans, &x, &w, &b, None, &mut y, &mut ws)
        })
        .unwrap_err();
    assert!(matches!(e, Error::Capture { .. }), "{e:?}");
    layer
        .run(&cudnn, &mut plans, &x, &w, &b, None, &mut y, &mut ws)
        .unwrap();
    let eager = download(&stream, &y);
    stream
        .memcpy_htod(&vec![f16::NAN; layer.y_span()], &mut y)
        .unwrap();
    let graph = cudnn
        .capture_in_test((), |cudnn, _| {
            layer.run(cudnn, &mut plans, &x, &w, &b, None, &mut y, &mut ws)
        })
        .unwrap();
    graph.launch().unwrap();
    drop(graph);
    assert_eq!(
        download(&stream, &y),
        eager,
        "the replay writes what the call wrote"
    );
    // The stream works normally afterwards.
    let mut z = stream.alloc_zeros::<f32>(16).unwrap();
    stream.memcpy_htod(&[1.0f32; 16], &mut z).unwrap();
    assert!(download(&stream, &z).iter().all(|&v| v == 1.0));
}

#[test]
fn capturing_while_cudarc_orders_buffers_by_events_is_refused() {
    let Some((default, _)) = gpu() else { return };
    // A context of its own, so that the streams made here do not affect the other tests.
    let ctx = common::other_context(default.context());
    let stream = ctx.new_stream().unwrap();
    let cudnn = Cudnn::new(stream).unwrap();
    let e = cudnn.capture_in_test((), |_, _| Ok(())).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                operation: "starting a capture",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_panic_during_capture_ends_the_capture() {
    let Some((stream, cudnn)) = captured_gpu() else {
        return;
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = cudnn.capture_in_test((), |_, _| -> cudnn_safe::Result<()> {
            panic!("inside the capture")
        });
    }));
    assert!(outcome.is_err());
    // Not capturing any more: ordinary work runs, and a new capture starts.
    let mut z = stream.alloc_zeros::<f32>(8).unwrap();
    stream.memcpy_htod(&[2.0f32; 8], &mut z).unwrap();
    assert!(download(&stream, &z).iter().all(|&v| v == 2.0));
    let graph = cudnn
        .capture_in_test(z, |c, z| {
            c.stream().memset_zeros(z).map_err(|e| Error::Driver {
                context: "test memset",
                source: e,
            })
        })
        .unwrap();
    graph.launch().unwrap();
    assert!(download(&stream, graph.buffers()).iter().all(|&v| v == 0.0));
}
