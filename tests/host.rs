//! Host-side tests against the real cuDNN library (no GPU needed): versions, status names,
//! descriptors accepted and rejected as cuDNN does, and handle creation without a GPU.
//!
//! They skip when cuDNN cannot be loaded, unless `CUDNN_SAFE_REQUIRE_LIBRARY=1` (CI sets it and
//! points `CUDNN_SAFE_LIBRARY` at the PyPI wheel's libraries), when they fail instead.
use std::ffi::{c_char, c_int, CStr};

use cudnn_safe::sys::{self, cudnnDataType_t, cudnnStatus_t};
use cudnn_safe::*;
use half::{bf16, f16};

fn lib() -> Option<&'static sys::Library> {
    match sys::library() {
        Ok(l) => Some(l),
        Err(e) if std::env::var("CUDNN_SAFE_REQUIRE_LIBRARY").as_deref() == Ok("1") => {
            panic!("CUDNN_SAFE_REQUIRE_LIBRARY=1 but cuDNN did not load: {e}")
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

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
