//! Host-side tests against the real cuDNN library (no GPU needed): versions, status names,
//! descriptors accepted and rejected as cuDNN does, and handle creation without a GPU.
//!
//! They skip when cuDNN cannot be loaded, unless `CUDNN_SAFE_REQUIRE_LIBRARY=1` (CI sets it and
//! points `CUDNN_SAFE_LIBRARY` at the PyPI wheel's libraries), when they fail instead.
mod common;

use std::ffi::{c_char, c_int, CStr};

use common::lib;
use cudnn_safe::sys::{self, cudnnDataType_t, cudnnStatus_t};
use cudnn_safe::*;
use half::{bf16, f16};

#[test]
fn versions_are_reported() {
    let Some(_) = lib() else { return };
    let v = versions().unwrap();
    assert_eq!(v.cudnn / 10000, 9);
    assert!(v.cudnn >= v.bindings, "{v}");
    assert!(v.cudart >= 12000, "{v}");
    assert!(v.all_sublibraries_ok(), "{v}");
    let text = v.to_string();
    assert!(
        text.contains(&format_version(v.cudnn)) && text.contains("libcudnn_cnn: ok"),
        "{text}"
    );
}

#[test]
fn status_names_match_cudnn() {
    let Some(l) = lib() else { return };
    let f = sys::sym!(l, cudnnGetErrorString).unwrap();
    for s in Status::all_known() {
        // SAFETY: cudnnGetErrorString returns a static NUL-terminated string for any value.
        let name = unsafe { CStr::from_ptr(f(cudnnStatus_t(s.0))) }
            .to_str()
            .unwrap();
        assert_eq!(name, s.known_name().unwrap(), "code {}", s.0);
        assert_ne!(s.family(), StatusFamily::Unknown);
    }
}

#[test]
fn descriptors_report_the_span_cudnn_computes() {
    let Some(_) = lib() else { return };
    fn check<T: DataType>(layout: Layout) {
        let d = TensorDesc::<T>::new(layout.clone()).unwrap();
        assert_eq!(
            d.size_in_bytes().unwrap(),
            d.span() * T::DTYPE.size(),
            "{:?} {layout}",
            T::DTYPE
        );
    }
    let layouts = || {
        vec![
            Layout::nchw(2, 3, 4, 5).unwrap(),
            Layout::nhwc(2, 3, 4, 5).unwrap(),
            Layout::ncdhw(2, 3, 4, 5, 6).unwrap(),
            Layout::ndhwc(2, 3, 4, 5, 6).unwrap(),
            Layout::strided(&[2, 3, 4, 5], &[100, 25, 6, 1]).unwrap(),
            Layout::nchw_nd(&[7]).unwrap(),
            Layout::nchw_nd(&[7, 3]).unwrap(),
            Layout::nchw_nd(&[2, 1, 2, 1, 2, 1, 2, 3]).unwrap(),
        ]
    };
    for l in layouts() {
        check::<f32>(l.clone());
        check::<f64>(l.clone());
        check::<f16>(l.clone());
        check::<bf16>(l.clone());
        check::<i8>(l.clone());
        check::<u8>(l.clone());
        check::<i32>(l);
    }
    check::<i8>(Layout::nchw_vect_c(2, 8, 3, 3, 4).unwrap());
    check::<i8>(Layout::nchw_vect_c(2, 64, 3, 3, 32).unwrap());
    check::<u8>(Layout::nchw_vect_c(2, 8, 3, 3, 4).unwrap());
    // Vect-C is for 8-bit types only.
    assert!(matches!(
        TensorDesc::<f32>::new(Layout::nchw_vect_c(2, 8, 3, 3, 4).unwrap()),
        Err(Error::UnsupportedDataType { .. })
    ));
    let w = FilterDesc::<f16>::new(&[16, 8, 3, 3], TensorFormat::Nhwc).unwrap();
    assert_eq!(w.size_in_bytes().unwrap(), w.span() * 2);
    assert_eq!(w.layout().strides(), &[72, 1, 24, 8]);
    let w = FilterDesc::<f32>::new(&[16, 8, 3, 3, 3], TensorFormat::Nchw).unwrap();
    assert_eq!(w.size_in_bytes().unwrap(), 16 * 8 * 27 * 4);
}

/// What cuDNN holds for a tensor descriptor: (dims, strides).
fn held_tensor(l: &sys::Library, d: sys::cudnnTensorDescriptor_t) -> (Vec<i64>, Vec<i64>) {
    let get = sys::sym!(l, cudnnGetTensorNdDescriptor).unwrap();
    let (mut dt, mut nb) = (cudnnDataType_t(99), 0 as c_int);
    let (mut dims, mut strides) = ([0 as c_int; 8], [0 as c_int; 8]);
    // SAFETY: live descriptor; both out-arrays hold the 8 entries requested.
    let st = unsafe {
        get(
            d,
            8,
            &mut dt,
            &mut nb,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
        )
    };
    assert_eq!(st.0, 0);
    let widen = |v: &[c_int]| v[..nb as usize].iter().map(|&x| i64::from(x)).collect();
    (widen(&dims), widen(&strides))
}

/// A 3-D tensor `[N, C, W]` keeps its dims in Rust and is held by cuDNN as `[N, C, 1, W]`, in
/// every layout; a 3-D filter `[K, C, S]` likewise as `[K, C, 1, S]`.
#[test]
fn three_d_descriptors_are_held_with_a_unit_height() {
    let Some(l) = lib() else { return };
    for (layout, strides4) in [
        (Layout::nchw_nd(&[2, 3, 5]).unwrap(), [15, 5, 5, 1]),
        (Layout::nhwc_nd(&[2, 3, 5]).unwrap(), [15, 1, 15, 3]),
        (
            Layout::strided(&[2, 3, 5], &[24, 8, 1]).unwrap(),
            [24, 8, 5, 1],
        ),
    ] {
        let d = TensorDesc::<f32>::new(layout.clone()).unwrap();
        assert_eq!(d.dims(), &[2, 3, 5]);
        assert_eq!(d.layout(), &layout);
        assert_eq!(d.span(), layout.span());
        assert_eq!(d.size_in_bytes().unwrap(), layout.span() * 4);
        let (dims, strides) = held_tensor(l, d.as_raw());
        assert_eq!(dims, [2, 3, 1, 5], "{layout}");
        assert_eq!(strides, strides4, "{layout}");
        let view = layout.legacy_view();
        assert_eq!((view.dims(), view.strides()), (&dims[..], &strides[..]));
    }
    // Other ranks are held as given (shorter ones padded with trailing 1s to 3).
    let d = TensorDesc::<f32>::nchw(2, 3, 4, 5).unwrap();
    assert_eq!(held_tensor(l, d.as_raw()).0, [2, 3, 4, 5]);
    let d = TensorDesc::<f32>::nchw_nd(&[7, 3]).unwrap();
    assert_eq!(held_tensor(l, d.as_raw()).0, [7, 3, 1]);

    let get = sys::sym!(l, cudnnGetFilterNdDescriptor).unwrap();
    for (format, raw_format) in [(TensorFormat::Nchw, 0), (TensorFormat::Nhwc, 1)] {
        let w = FilterDesc::<f32>::new(&[6, 4, 3], format).unwrap();
        assert_eq!(w.dims(), &[6, 4, 3]);
        assert_eq!(w.span(), 72);
        assert_eq!(w.size_in_bytes().unwrap(), 72 * 4);
        let (mut dt, mut f, mut nb) = (
            cudnnDataType_t(99),
            sys::cudnnTensorFormat_t(99),
            0 as c_int,
        );
        let mut dims = [0 as c_int; 8];
        // SAFETY: live descriptor; the out-array holds the 8 entries requested.
        let st = unsafe { get(w.as_raw(), 8, &mut dt, &mut f, &mut nb, dims.as_mut_ptr()) };
        assert_eq!(st.0, 0);
        assert_eq!(f.0, raw_format);
        assert_eq!(&dims[..nb as usize], &[6, 4, 1, 3]);
    }
    // A 1-D pooling descriptor is built (cuDNN holds it as 2-D over a unit height).
    use cudnn_safe::pooling::{PoolingDesc, PoolingMode};
    let pool = PoolingDesc::builder(PoolingMode::Max, &[3])
        .pads(&[1])
        .strides(&[2])
        .build()
        .unwrap();
    assert_eq!((pool.spatial_rank(), pool.tensor_rank()), (1, 3));
    assert_eq!(pool.output_dims(&[2, 3, 11]).unwrap(), [2, 3, 6]);
    assert!(pool.output_dims(&[2, 3, 1, 11]).is_err());
}

/// Raw `cudnnSetTensorNdDescriptor` on a fresh descriptor; returns the status.
fn raw_set(l: &sys::Library, dims: &[c_int], strides: &[c_int]) -> Status {
    let create = sys::sym!(l, cudnnCreateTensorDescriptor).unwrap();
    let set = sys::sym!(l, cudnnSetTensorNdDescriptor).unwrap();
    let destroy = sys::sym!(l, cudnnDestroyTensorDescriptor).unwrap();
    let mut d = std::ptr::null_mut();
    // SAFETY: out-pointer, then a set call with arrays of `dims.len()` entries, then destroy.
    unsafe {
        assert_eq!(create(&mut d).0, 0);
        let s = set(
            d,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            dims.len() as c_int,
            dims.as_ptr(),
            strides.as_ptr(),
        );
        destroy(d);
        Status(s.0)
    }
}

#[test]
fn invalid_layouts_are_rejected_like_cudnn_rejects_them() {
    let Some(l) = lib() else { return };
    let cases: [(&[i64], &[i64]); 3] = [
        (&[2, 0, 4, 5], &[60, 20, 5, 1]),  // zero dimension
        (&[2, -3, 4, 5], &[60, 20, 5, 1]), // negative dimension
        (&[2, 3, 4, 5], &[60, 0, 5, 1]),   // zero stride
    ];
    for (dims, strides) in cases {
        let ours = Layout::strided(dims, strides);
        assert!(
            matches!(ours, Err(Error::InvalidArgument { .. })),
            "{dims:?} {strides:?}"
        );
        let d: Vec<c_int> = dims.iter().map(|&x| x as c_int).collect();
        let s: Vec<c_int> = strides.iter().map(|&x| x as c_int).collect();
        let theirs = raw_set(l, &d, &s);
        assert_eq!(
            theirs.family(),
            StatusFamily::BadParam,
            "{dims:?} {strides:?}: {theirs}"
        );
    }
    // cuDNN 9.14 accepts a negative stride; this crate is stricter (a negative stride would
    // address memory before the pointer it is given, which no span check can bound).
    assert!(raw_set(l, &[2, 3, 4, 5], &[60, 20, -5, 1]).is_success());
    assert!(matches!(
        Layout::strided(&[2, 3, 4, 5], &[60, 20, -5, 1]),
        Err(Error::InvalidArgument { .. })
    ));
    // Accepted by both.
    assert!(raw_set(l, &[2, 3, 4, 5], &[100, 25, 6, 1]).is_success());
    assert!(Layout::strided(&[2, 3, 4, 5], &[100, 25, 6, 1]).is_ok());
    // cuDNN accepts a self-overlapping layout; this crate accepts it for inputs and refuses to
    // write through it.
    assert!(raw_set(l, &[2, 3, 4, 5], &[1, 1, 1, 1]).is_success());
    let overl = Layout::strided(&[2, 3, 4, 5], &[1, 1, 1, 1]).unwrap();
    assert!(TensorDesc::<f32>::new(overl.clone()).is_ok());
    assert!(overl.check_output("y").is_err());
}

#[test]
fn cudnn_rejections_carry_status_and_function() {
    let Some(_) = lib() else { return };
    // cuDNN has no int32 convolution filters.
    let err = FilterDesc::<i32>::new(&[8, 3, 3, 3], TensorFormat::Nchw).unwrap_err();
    match &err {
        Error::Cudnn {
            status, function, ..
        } => {
            assert_eq!(status.family(), StatusFamily::BadParam);
            assert_eq!(*function, "cudnnSetFilterNdDescriptor");
        }
        other => panic!("{other:?}"),
    }
    assert!(err
        .to_string()
        .contains("cudnnSetFilterNdDescriptor failed with CUDNN_STATUS_BAD_PARAM"));
}

#[test]
fn last_error_string_explains_a_rejection() {
    let Some(l) = lib() else { return };
    let create = sys::sym!(l, cudnnCreateTensorDescriptor).unwrap();
    let set4d = sys::sym!(l, cudnnSetTensor4dDescriptor).unwrap();
    let destroy = sys::sym!(l, cudnnDestroyTensorDescriptor).unwrap();
    let last = sys::sym!(l, cudnnGetLastErrorString).unwrap();
    let mut d = std::ptr::null_mut();
    let mut buf = [0 as c_char; 512];
    // SAFETY: out-pointer; a set call with scalar arguments; a message buffer of 512 bytes.
    let (status, msg) = unsafe {
        assert_eq!(create(&mut d).0, 0);
        let s = set4d(
            d,
            sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            0,
            3,
            4,
            5,
        );
        last(buf.as_mut_ptr(), buf.len());
        destroy(d);
        (
            s,
            CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned(),
        )
    };
    assert_eq!(Status(status.0), Status::BAD_PARAM);
    assert!(msg.contains("n <= 0") || !msg.is_empty(), "{msg:?}");
}

#[test]
fn no_gpu_gives_typed_errors() {
    let Some(l) = lib() else { return };
    match cuda_context(0) {
        Ok(ctx) => {
            // A GPU is present: the handle must come up.
            let h = Cudnn::new(ctx.default_stream()).unwrap();
            assert_eq!(h.version(), l.version());
        }
        Err(e) => {
            assert!(matches!(e, Error::NoDriver | Error::Driver { .. }), "{e:?}");
            // And cuDNN itself reports NOT_INITIALIZED when asked for a handle without a GPU.
            let create = sys::sym!(l, cudnnCreate).unwrap();
            let mut h = std::ptr::null_mut();
            // SAFETY: valid out-pointer; with no GPU no handle is created.
            let s = Status(unsafe { create(&mut h) }.0);
            assert_eq!(s, Status::NOT_INITIALIZED, "{s}");
            assert_eq!(s.family(), StatusFamily::LibraryState);
        }
    }
}

#[test]
fn descriptors_are_destroyed_once_and_may_move_threads() {
    let Some(_) = lib() else { return };
    // Many create/destroy cycles: a double destroy or a leak of cuDNN's descriptor pool shows
    // up as a failure or a crash long before this ends.
    for i in 0..5_000i64 {
        let t = TensorDesc::<f32>::nchw(1 + i % 7, 3, 4, 5).unwrap();
        let f = FilterDesc::<f16>::new(&[8, 3, 3, 3], TensorFormat::Nhwc).unwrap();
        assert_eq!(t.span() as i64, (1 + i % 7) * 60);
        drop((t, f));
    }
    // A failed set call (cuDNN rejects int32 filters) must still destroy the created descriptor.
    for _ in 0..1_000 {
        assert!(FilterDesc::<i32>::new(&[8, 3, 3, 3], TensorFormat::Nchw).is_err());
    }
    let d = TensorDesc::<bf16>::nhwc(2, 3, 4, 5).unwrap();
    let dims = std::thread::spawn(move || d.dims().to_vec())
        .join()
        .unwrap();
    assert_eq!(dims, [2, 3, 4, 5]);
}

// ---------------------------------------------------------------------------------------------
// Convolution descriptors (no GPU): parameter validation, output sizes against cuDNN's own query,
// transposed-convolution sizes.
// ---------------------------------------------------------------------------------------------

mod conv_descriptors {
    use super::lib;
    use cudnn_safe::conv::{ConvDesc, ConvMode, MathType};
    use cudnn_safe::{DType, DataType, Error, FilterDesc, TensorDesc, TensorFormat};
    use half::{bf16, f16};
    use proptest::prelude::*;

    fn is_invalid<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
        matches!(r, Err(Error::InvalidArgument { .. }))
    }

    #[test]
    fn conv_builder_rejects_bad_parameters() {
        let Some(_) = lib() else { return };
        for spatial in [0, 4, 5] {
            let r = ConvDesc::builder(spatial).build::<f32>();
            assert!(is_invalid(&r), "spatial {spatial}: {r:?}");
        }
        let bad = [
            ("stride 0", ConvDesc::builder(2).strides(&[1, 0])),
            ("negative stride", ConvDesc::builder(2).strides(&[-1, 1])),
            ("dilation 0", ConvDesc::builder(2).dilations(&[0, 1])),
            (
                "dilation 0 in 3-D",
                ConvDesc::builder(3).dilations(&[1, 1, 0]),
            ),
            ("negative pad", ConvDesc::builder(2).pads(&[1, -1])),
            ("negative pad 1-D", ConvDesc::builder(1).pads(&[-2])),
            ("groups 0", ConvDesc::builder(2).groups(0)),
            ("negative groups", ConvDesc::builder(2).groups(-3)),
            ("huge groups", ConvDesc::builder(2).groups(1 << 40)),
            ("huge pad", ConvDesc::builder(2).pads(&[1 << 33, 0])),
            ("pads too short", ConvDesc::builder(2).pads(&[1])),
            ("pads too long", ConvDesc::builder(2).pads(&[1, 1, 1])),
            ("strides too short", ConvDesc::builder(3).strides(&[1, 1])),
            (
                "dilations too long",
                ConvDesc::builder(1).dilations(&[1, 1]),
            ),
            ("1-D pads as 2-D", ConvDesc::builder(1).pads(&[0, 1])),
        ];
        for (what, b) in bad {
            let r = b.build::<f32>();
            assert!(is_invalid(&r), "{what}: {r:?}");
        }
        for compute in [DType::U8, DType::I8, DType::BF16] {
            let r = ConvDesc::builder(2).compute(compute).build::<f32>();
            assert!(
                matches!(r, Err(Error::UnsupportedDataType { .. })),
                "compute {compute}: {r:?}"
            );
        }
    }

    #[test]
    fn conv_builder_keeps_parameters_and_picks_compute_types() {
        let Some(_) = lib() else { return };
        let c = ConvDesc::builder(2)
            .pads(&[1, 2])
            .strides(&[2, 1])
            .dilations(&[1, 3])
            .groups(2)
            .mode(ConvMode::Convolution)
            .math(MathType::Fma)
            .build::<f32>()
            .unwrap();
        assert_eq!(c.spatial_rank(), 2);
        assert_eq!(c.tensor_rank(), 4);
        assert_eq!(c.pads(), &[1, 2]);
        assert_eq!(c.strides(), &[2, 1]);
        assert_eq!(c.dilations(), &[1, 3]);
        assert_eq!(c.groups(), 2);
        assert_eq!(c.mode(), ConvMode::Convolution);
        assert_eq!(c.math(), MathType::Fma);
        assert_eq!(c.compute(), DType::F32);

        // 1-D runs as 2-D over a unit height: the leading entries are the identity.
        let c = ConvDesc::builder(1)
            .pads(&[2])
            .strides(&[3])
            .dilations(&[2])
            .build::<f32>()
            .unwrap();
        assert_eq!(c.spatial_rank(), 1);
        assert_eq!(c.tensor_rank(), 4);
        assert_eq!(c.pads(), &[0, 2]);
        assert_eq!(c.strides(), &[1, 3]);
        assert_eq!(c.dilations(), &[1, 2]);

        let c = ConvDesc::builder(3).build::<f64>().unwrap();
        assert_eq!(c.tensor_rank(), 5);
        assert_eq!(c.pads(), &[0, 0, 0]);
        assert_eq!(c.strides(), &[1, 1, 1]);
        assert_eq!(c.dilations(), &[1, 1, 1]);
        assert_eq!(c.groups(), 1);
        assert_eq!(c.mode(), ConvMode::CrossCorrelation);
        assert_eq!(c.math(), MathType::Default);

        fn default_compute<T: DataType>() -> DType {
            ConvDesc::builder(2).build::<T>().unwrap().compute()
        }
        assert_eq!(default_compute::<f32>(), DType::F32);
        assert_eq!(default_compute::<f64>(), DType::F64);
        assert_eq!(default_compute::<f16>(), DType::F32);
        assert_eq!(default_compute::<bf16>(), DType::F32);
        assert_eq!(default_compute::<i8>(), DType::I32);
        assert_eq!(default_compute::<u8>(), DType::I32);
        let c = ConvDesc::builder(2)
            .compute(DType::F16)
            .build::<f16>()
            .unwrap();
        assert_eq!(c.compute(), DType::F16);
    }

    #[test]
    fn conv_output_dims_rejects_bad_shapes() {
        let Some(_) = lib() else { return };
        let plain = ConvDesc::builder(2).build::<f32>().unwrap();
        // Kernel larger than the (unpadded) input.
        let r = plain.output_dims(&[1, 3, 4, 4], &[2, 3, 5, 5]);
        assert!(is_invalid(&r), "{r:?}");
        let r = plain.output_dims(&[1, 3, 4, 9], &[2, 3, 5, 5]);
        assert!(is_invalid(&r), "one dimension too small: {r:?}");
        // ... accepted once padded.
        let padded = ConvDesc::builder(2).pads(&[1, 1]).build::<f32>().unwrap();
        assert_eq!(
            padded.output_dims(&[1, 3, 4, 4], &[2, 3, 5, 5]).unwrap(),
            [1, 2, 2, 2]
        );
        // A dilated kernel (extent 5) larger than the input.
        let dilated = ConvDesc::builder(2)
            .dilations(&[2, 1])
            .build::<f32>()
            .unwrap();
        let r = dilated.output_dims(&[1, 3, 4, 8], &[2, 3, 3, 3]);
        assert!(is_invalid(&r), "{r:?}");
        assert_eq!(
            dilated.output_dims(&[1, 3, 5, 8], &[2, 3, 3, 3]).unwrap(),
            [1, 2, 1, 6]
        );

        // Groups that do not divide the channels, or the filter count.
        let g2 = ConvDesc::builder(2).groups(2).build::<f32>().unwrap();
        let r = g2.output_dims(&[1, 3, 8, 8], &[4, 1, 3, 3]);
        assert!(
            matches!(r, Err(Error::ShapeMismatch { a: "x", b: "w", .. })),
            "C = 3, groups 2: {r:?}"
        );
        let r = g2.output_dims(&[1, 4, 8, 8], &[4, 4, 3, 3]);
        assert!(
            matches!(r, Err(Error::ShapeMismatch { .. })),
            "filter channels not C / groups: {r:?}"
        );
        let r = g2.output_dims(&[1, 4, 8, 8], &[3, 2, 3, 3]);
        assert!(is_invalid(&r), "K = 3, groups 2: {r:?}");
        assert_eq!(
            g2.output_dims(&[1, 4, 8, 8], &[6, 2, 3, 3]).unwrap(),
            [1, 6, 6, 6]
        );
        let g3 = ConvDesc::builder(2).groups(3).build::<f32>().unwrap();
        let r = g3.output_dims(&[1, 4, 8, 8], &[3, 1, 3, 3]);
        assert!(matches!(r, Err(Error::ShapeMismatch { .. })), "{r:?}");

        // Wrong ranks.
        let r = plain.output_dims(&[1, 3, 4, 4, 4], &[2, 3, 3, 3]);
        assert!(is_invalid(&r), "5-D x for a 2-D conv: {r:?}");
        let r = plain.output_dims(&[1, 3, 4, 4], &[2, 3, 3]);
        assert!(is_invalid(&r), "3-D w for a 2-D conv: {r:?}");
        let r = plain.output_dims(&[1, 3, 4], &[2, 3, 3]);
        assert!(is_invalid(&r), "3-D tensors for a 2-D conv: {r:?}");
        let c3 = ConvDesc::builder(3).build::<f32>().unwrap();
        let r = c3.output_dims(&[1, 3, 4, 4], &[2, 3, 3, 3]);
        assert!(is_invalid(&r), "4-D tensors for a 3-D conv: {r:?}");
        assert_eq!(
            c3.output_dims(&[1, 3, 4, 5, 6], &[2, 3, 3, 3, 3]).unwrap(),
            [1, 2, 2, 3, 4]
        );

        // 1-D: [N, C, 1, W] and [K, C, 1, R] only.
        let c1 = ConvDesc::builder(1)
            .pads(&[1])
            .strides(&[2])
            .build::<f32>()
            .unwrap();
        let r = c1.output_dims(&[1, 3, 2, 8], &[2, 3, 1, 3]);
        assert!(is_invalid(&r), "1-D with H = 2: {r:?}");
        let r = c1.output_dims(&[1, 3, 1, 8], &[2, 3, 2, 3]);
        assert!(is_invalid(&r), "1-D filter with R = 2 rows: {r:?}");
        // 3-D tensors and filters ([N, C, W], [K, C, S]) give 3-D output dims.
        assert_eq!(c1.output_dims(&[1, 3, 8], &[2, 3, 3]).unwrap(), [1, 2, 4]);
        let r = c1.output_dims(&[1, 3, 8], &[2, 3, 1, 3]);
        assert!(is_invalid(&r), "1-D with a 3-D x and a 4-D w: {r:?}");
        let r = c1.output_dims(&[1, 3, 1, 8], &[2, 3, 3]);
        assert!(is_invalid(&r), "1-D with a 4-D x and a 3-D w: {r:?}");
        let r = plain.output_dims(&[1, 3, 8], &[2, 3, 3]);
        assert!(is_invalid(&r), "3-D tensors for a 2-D conv: {r:?}");
        let dims = c1.output_dims(&[1, 3, 1, 8], &[2, 3, 1, 3]).unwrap();
        assert_eq!(dims, [1, 2, 1, 4]);
        let x = TensorDesc::<f32>::nchw(1, 3, 1, 8).unwrap();
        let w = FilterDesc::<f32>::new(&[2, 3, 1, 3], TensorFormat::Nchw).unwrap();
        assert_eq!(c1.cudnn_output_dims(&x, &w).unwrap(), dims);
        let x3 = TensorDesc::<f32>::nchw_nd(&[1, 3, 8]).unwrap();
        let w3 = FilterDesc::<f32>::new(&[2, 3, 3], TensorFormat::Nchw).unwrap();
        assert_eq!(c1.cudnn_output_dims(&x3, &w3).unwrap(), [1, 2, 4]);
    }

    /// The output size rule written out independently of the crate.
    fn out_size(input: i64, k: i64, pad: i64, stride: i64, dil: i64) -> i64 {
        (input + 2 * pad - dil * (k - 1) - 1) / stride + 1
    }

    /// A random valid convolution problem: spatial rank, x dims, w dims, pads, strides,
    /// dilations, groups, channels-last or not.
    #[allow(clippy::type_complexity)]
    fn problem() -> impl Strategy<
        Value = (
            usize,
            Vec<i64>,
            Vec<i64>,
            Vec<i64>,
            Vec<i64>,
            Vec<i64>,
            i64,
            bool,
        ),
    > {
        (1usize..=3)
            .prop_flat_map(|sp| {
                (
                    Just(sp),
                    (1i64..=4, 1i64..=4, 1i64..=4, 1i64..=3),
                    prop::collection::vec((1i64..=20, 1i64..=5, 0i64..=3, 1i64..=4, 1i64..=3), sp),
                    any::<bool>(),
                )
            })
            .prop_filter_map(
                "kernel larger than the padded input",
                |(sp, (n, g, cg, kg), axes, nhwc)| {
                    if axes
                        .iter()
                        .any(|&(i, k, p, _, d)| d * (k - 1) + 1 > i + 2 * p)
                    {
                        return None;
                    }
                    let (c, kk) = (g * cg, g * kg);
                    let mut x = vec![n, c];
                    let mut w = vec![kk, cg];
                    let (mut pads, mut strides, mut dils) = (vec![], vec![], vec![]);
                    if sp == 1 {
                        x.push(1);
                        w.push(1);
                    }
                    for &(i, k, p, s, d) in &axes {
                        x.push(i);
                        w.push(k);
                        pads.push(p);
                        strides.push(s);
                        dils.push(d);
                    }
                    Some((sp, x, w, pads, strides, dils, g, nhwc))
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn output_dims_agree_with_cudnn(
            (sp, x, w, pads, strides, dils, groups, nhwc) in problem(),
            convolution in any::<bool>(),
        ) {
            let Some(_) = lib() else { return Ok(()) };
            let mode = if convolution { ConvMode::Convolution } else { ConvMode::CrossCorrelation };
            let conv = ConvDesc::builder(sp)
                .pads(&pads)
                .strides(&strides)
                .dilations(&dils)
                .groups(groups)
                .mode(mode)
                .build::<f32>()
                .unwrap();
            let ours = conv.output_dims(&x, &w).unwrap();
            let (x_d, w_d) = if nhwc {
                (TensorDesc::<f32>::nhwc_nd(&x).unwrap(),
                 FilterDesc::<f32>::new(&w, TensorFormat::Nhwc).unwrap())
            } else {
                (TensorDesc::<f32>::nchw_nd(&x).unwrap(),
                 FilterDesc::<f32>::new(&w, TensorFormat::Nchw).unwrap())
            };
            let theirs = conv.cudnn_output_dims(&x_d, &w_d).unwrap();
            prop_assert_eq!(&ours, &theirs);
            // And the rule written out here.
            let first = x.len() - sp;
            prop_assert_eq!(ours[0], x[0]);
            prop_assert_eq!(ours[1], w[0]);
            if sp == 1 {
                prop_assert_eq!(ours[2], 1);
            }
            for i in 0..sp {
                let a = first + i;
                prop_assert_eq!(ours[a], out_size(x[a], w[a], pads[i], strides[i], dils[i]));
            }
        }

        #[test]
        fn transpose_output_dims_round_trip(
            (sp, x, w, pads, strides, dils, groups, _nhwc) in problem(),
            op_seed in prop::collection::vec(0i64..4, 3),
        ) {
            let Some(_) = lib() else { return Ok(()) };
            let conv = ConvDesc::builder(sp)
                .pads(&pads)
                .strides(&strides)
                .dilations(&dils)
                .groups(groups)
                .build::<f32>()
                .unwrap();
            // The forward output is the transposed convolution's input; any output padding
            // below the stride maps back to it.
            let y = conv.output_dims(&x, &w).unwrap();
            let op: Vec<i64> = (0..sp).map(|i| op_seed[i] % strides[i]).collect();
            let back = match conv.transpose_output_dims(&y, &w, &op) {
                Ok(b) => b,
                // Padding can make the transposed output empty; that must be the only reason.
                Err(Error::InvalidArgument { what, .. }) => {
                    prop_assert_eq!(what, "transposed convolution output");
                    return Ok(());
                }
                Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
            };
            prop_assert_eq!(back[0], x[0]);
            prop_assert_eq!(back[1], x[1]);
            prop_assert_eq!(conv.output_dims(&back, &w).unwrap(), y.clone());
            // With the output padding each input was given, the exact input comes back.
            let first = x.len() - sp;
            let exact: Vec<i64> = (0..sp)
                .map(|i| {
                    let a = first + i;
                    (x[a] + 2 * pads[i] - dils[i] * (w[a] - 1) - 1) % strides[i]
                })
                .collect();
            prop_assert_eq!(conv.transpose_output_dims(&y, &w, &exact).unwrap(), x);
        }
    }

    #[test]
    fn transpose_output_dims_examples() {
        let Some(_) = lib() else { return };
        // 2× up-sampling: 16×16, 3×3 kernel, stride 2, padding 1, output padding 1 → 32×32.
        let conv = ConvDesc::builder(2)
            .pads(&[1, 1])
            .strides(&[2, 2])
            .build::<f32>()
            .unwrap();
        let (x, w) = ([1i64, 8, 16, 16], [8i64, 4, 3, 3]);
        let y = conv.transpose_output_dims(&x, &w, &[1, 1]).unwrap();
        assert_eq!(y, [1, 4, 32, 32]);
        assert_eq!(conv.output_dims(&y, &w).unwrap(), x);
        let y0 = conv.transpose_output_dims(&x, &w, &[0, 0]).unwrap();
        assert_eq!(y0, [1, 4, 31, 31]);
        assert_eq!(conv.transpose_output_dims(&x, &w, &[]).unwrap(), y0);
        assert_eq!(conv.output_dims(&y0, &w).unwrap(), x);
        assert_eq!(
            conv.transpose_output_dims(&x, &w, &[1, 0]).unwrap(),
            [1, 4, 32, 31]
        );

        // Groups multiply the filter's channel count.
        let grouped = ConvDesc::builder(2)
            .pads(&[1, 1])
            .strides(&[2, 2])
            .groups(2)
            .build::<f32>()
            .unwrap();
        let y = grouped
            .transpose_output_dims(&x, &[8, 3, 3, 3], &[1, 1])
            .unwrap();
        assert_eq!(y, [1, 6, 32, 32]);
        assert_eq!(grouped.output_dims(&y, &[8, 3, 3, 3]).unwrap(), x);

        // 1-D takes one output padding (or the two of its 2-D form).
        let c1 = ConvDesc::builder(1)
            .pads(&[1])
            .strides(&[2])
            .build::<f32>()
            .unwrap();
        let (x1, w1) = ([2i64, 6, 1, 10], [6i64, 3, 1, 4]);
        let y1 = c1.transpose_output_dims(&x1, &w1, &[1]).unwrap();
        assert_eq!(y1, [2, 3, 1, 21]);
        assert_eq!(c1.transpose_output_dims(&x1, &w1, &[0, 1]).unwrap(), y1);
        assert_eq!(c1.output_dims(&y1, &w1).unwrap(), x1);
        // ... and 3-D [N, K, W] with [K, C, S] give 3-D.
        let (x13, w13) = ([2i64, 6, 10], [6i64, 3, 4]);
        let y13 = c1.transpose_output_dims(&x13, &w13, &[1]).unwrap();
        assert_eq!(y13, [2, 3, 21]);
        assert_eq!(c1.output_dims(&y13, &w13).unwrap(), x13);

        // 3-D with dilation 2 and stride 3: output padding up to 2.
        let c3 = ConvDesc::builder(3)
            .pads(&[1, 0, 2])
            .strides(&[3, 3, 3])
            .dilations(&[2, 2, 2])
            .build::<f32>()
            .unwrap();
        let (x3, w3) = ([1i64, 4, 3, 4, 5], [4i64, 2, 3, 2, 3]);
        let y3 = c3.transpose_output_dims(&x3, &w3, &[2, 1, 0]).unwrap();
        // (in − 1)·3 − 2·pad + 2·(k − 1) + 1 + op
        assert_eq!(
            y3,
            [
                1,
                2,
                2 * 3 - 2 + 4 + 1 + 2,
                3 * 3 + 2 + 1 + 1,
                4 * 3 - 4 + 4 + 1
            ]
        );
        assert_eq!(c3.output_dims(&y3, &w3).unwrap(), x3);

        // Rejections.
        let r = conv.transpose_output_dims(&x, &w, &[2, 0]);
        assert!(is_invalid(&r), "output padding = stride: {r:?}");
        let r = conv.transpose_output_dims(&x, &w, &[-1, 0]);
        assert!(is_invalid(&r), "negative output padding: {r:?}");
        let r = conv.transpose_output_dims(&x, &w, &[1, 1, 1]);
        assert!(is_invalid(&r), "three output paddings in 2-D: {r:?}");
        let r = conv.transpose_output_dims(&[1, 7, 16, 16], &w, &[1, 1]);
        assert!(
            matches!(r, Err(Error::ShapeMismatch { .. })),
            "x channels ≠ K: {r:?}"
        );
        let r = conv.transpose_output_dims(&[1, 8, 16, 16, 16], &w, &[1, 1]);
        assert!(is_invalid(&r), "rank: {r:?}");
        let pad2 = ConvDesc::builder(2).pads(&[2, 2]).build::<f32>().unwrap();
        let r = pad2.transpose_output_dims(&[1, 8, 1, 1], &[8, 4, 1, 1], &[]);
        assert!(is_invalid(&r), "empty output: {r:?}");
        let r = grouped.transpose_output_dims(&[1, 7, 16, 16], &[7, 3, 3, 3], &[1, 1]);
        assert!(is_invalid(&r), "K = 7 not divisible by 2 groups: {r:?}");
    }

    /// PyTorch's rule is `output_padding < max(stride, dilation)`: with a dilation above the
    /// stride, output paddings up to the dilation − 1 are accepted (`F.conv_transpose1d(x, w,
    /// stride=1, dilation=2, output_padding=1)` runs), one more is refused.
    #[test]
    fn transpose_output_padding_may_reach_the_dilation() {
        let Some(_) = lib() else { return };
        let c1 = ConvDesc::builder(1)
            .pads(&[1])
            .dilations(&[2])
            .build::<f32>()
            .unwrap();
        let (x, w) = ([1i64, 8, 1, 5], [8i64, 4, 1, 3]);
        // (5 − 1)·1 − 2·1 + 2·(3 − 1) + 1 + op
        assert_eq!(
            c1.transpose_output_dims(&x, &w, &[0]).unwrap(),
            [1, 4, 1, 7]
        );
        assert_eq!(
            c1.transpose_output_dims(&x, &w, &[1]).unwrap(),
            [1, 4, 1, 8]
        );
        let r = c1.transpose_output_dims(&x, &w, &[2]);
        assert!(is_invalid(&r), "output padding = dilation > stride: {r:?}");

        // Stride 2, dilation 4: output padding 3 in one dimension, the stride's bound in the
        // other (dilation 1 there).
        let c2 = ConvDesc::builder(2)
            .strides(&[2, 2])
            .dilations(&[4, 1])
            .pads(&[3, 0])
            .build::<f32>()
            .unwrap();
        let (x, w) = ([2i64, 6, 3, 4], [6i64, 1, 2, 3]);
        let y = c2.transpose_output_dims(&x, &w, &[3, 1]).unwrap();
        assert_eq!(y, [2, 1, 2 * 2 - 6 + 4 + 1 + 3, 3 * 2 + 2 + 1 + 1]);
        for bad in [[4, 0], [0, 2]] {
            let r = c2.transpose_output_dims(&x, &w, &bad);
            assert!(is_invalid(&r), "output padding {bad:?}: {r:?}");
        }
    }

    /// Dimensions outside cuDNN's `int` (negative, zero, `i64::MAX`) are refused by name, and
    /// the largest valid ones, with the largest strides and dilations, compute without
    /// overflow.
    #[test]
    fn output_dims_refuse_extreme_shapes_without_overflow() {
        let Some(_) = lib() else { return };
        let conv = ConvDesc::builder(2).build::<f32>().unwrap();
        for bad in [i64::MAX, i64::MIN, -1, 0, 1 << 31] {
            let x = [1, 1, bad, 1];
            let r = conv.output_dims(&x, &[1, 1, 1, 1]);
            assert!(is_invalid(&r), "x {x:?}: {r:?}");
            let r = conv.transpose_output_dims(&[1, 1, 1, 1], &[1, 1, bad, 1], &[]);
            assert!(is_invalid(&r), "w height {bad}: {r:?}");
        }
        let m = i64::from(i32::MAX);
        let wide = ConvDesc::builder(2)
            .strides(&[m, m])
            .dilations(&[m, m])
            .build::<f32>()
            .unwrap();
        let r = wide.transpose_output_dims(&[1, 1, m, m], &[1, 1, m, m], &[m - 1, m - 1]);
        assert!(matches!(r, Ok(_) | Err(Error::Overflow { .. })), "{r:?}");
        let r = wide.output_dims(&[1, m, m, m], &[m, m, m, m]);
        assert!(
            matches!(r, Ok(_) | Err(Error::InvalidArgument { .. })),
            "{r:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Cache files: atomic writes, `Error::Io` with the path and the operating system's error
// ---------------------------------------------------------------------------------------------

mod cache_files {
    use std::path::{Path, PathBuf};

    use cudnn_safe::graph::PlanCache;
    use cudnn_safe::tune::Policy;
    use cudnn_safe::{Autotuner, Error};

    /// A fresh empty directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cudnn-safe-host-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Names in `dir` that look like a temporary file of an atomic write.
    fn temporaries(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect()
    }

    /// `r` is `Error::Io` for `path`, whose `source()` is the operating system's error.
    fn assert_io_error(r: Result<(), Error>, path: &Path) {
        match &r {
            Err(e @ Error::Io { path: p, .. }) => {
                assert_eq!(p, path, "{e}");
                let source = std::error::Error::source(e).expect("Error::Io has a source");
                assert!(source.is::<std::io::Error>(), "{source:?}");
                assert!(e.to_string().contains(&path.display().to_string()), "{e}");
            }
            other => panic!("expected Error::Io for {}: {other:?}", path.display()),
        }
    }

    fn tuner(path: &Path) -> Autotuner {
        Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .cache_file(path)
    }

    /// Every cache's save into a directory that does not exist and cannot be created (a file
    /// took its name after the cache was opened); opening a path below a file is an
    /// `Error::Io` as well.
    #[test]
    fn saves_into_a_directory_that_cannot_exist_are_io_errors() {
        let dir = scratch("nodir");
        let path = dir.join("sub").join("cache.txt");
        let (t, plans) = (
            tuner(&path),
            PlanCache::new().try_cache_file(&path).unwrap(),
        );
        std::fs::write(dir.join("sub"), b"not a directory").unwrap();
        assert_io_error(t.save(), &path);
        assert_io_error(plans.save(), &path);
        assert_io_error(PlanCache::new().try_cache_file(&path).map(|_| ()), &path);
        assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A save whose rename fails (the cache path is a non-empty directory) leaves no temporary
    /// file behind and the directory untouched; reading such a path is an `Error::Io` too.
    #[test]
    fn failed_saves_leave_no_temporary_file() {
        let dir = scratch("rename");
        let path = dir.join("cache.txt");
        std::fs::create_dir_all(path.join("keep")).unwrap();
        let t = tuner(&path);
        assert_eq!(t.cached_decisions(), 0);
        assert_io_error(t.save(), &path);
        let r = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .try_cache_file(&path)
            .map(|_| ());
        assert_io_error(r, &path);
        assert_io_error(PlanCache::new().try_cache_file(&path).map(|_| ()), &path);
        assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));
        assert!(path.join("keep").is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A save into a read-only directory (where this process cannot write: not as root).
    #[test]
    fn saves_into_a_read_only_directory_are_io_errors() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("readonly");
        let locked = dir.join("locked");
        std::fs::create_dir_all(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
        let path = locked.join("cache.txt");
        if std::fs::write(locked.join("probe"), b"").is_ok() {
            eprintln!("skipping: the read-only directory is writable here (running as root)");
        } else {
            assert_io_error(tuner(&path).save(), &path);
            assert_io_error(
                PlanCache::new().try_cache_file(&path).unwrap().save(),
                &path,
            );
            assert!(temporaries(&locked).is_empty());
        }
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A save writes the file whole (header and entries) and nothing beside it; an unreadable
    /// file is not overwritten by a tuner that could not read it.
    #[test]
    fn saves_replace_the_file_and_keep_what_they_could_not_read() {
        let dir = scratch("replace");
        let path = dir.join("cache.txt");
        tuner(&path).save().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with('#'), "{text}");
        let plans = dir.join("plans.txt");
        PlanCache::new()
            .try_cache_file(&plans)
            .unwrap()
            .save()
            .unwrap();
        assert!(plans.is_file());
        assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));

        // Longer than a cache file may be: refused, and left as it is.
        let big = dir.join("big.txt");
        std::fs::File::create(&big)
            .unwrap()
            .set_len((64 << 20) + 1)
            .unwrap();
        let r = Autotuner::new(Policy::Benchmark)
            .without_cache_file()
            .try_cache_file(&big)
            .map(|_| ());
        assert_io_error(r, &big);
        assert_io_error(tuner(&big).save(), &big);
        assert_eq!(std::fs::metadata(&big).unwrap().len(), (64 << 20) + 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
