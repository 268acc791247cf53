//! cuDNN's own messages reach the `log` crate under the target `cudnn_safe::cudnn`, at the levels
//! the crate documents, and follow later changes of the maximum level. Host-side: needs the
//! cuDNN library, no GPU; skips without the library (fails under
//! `CUDNN_SAFE_REQUIRE_LIBRARY=1`). One test per process: the logger and cuDNN's callback are
//! process-wide.
mod common;

use std::sync::Mutex;

use cudnn_safe::sys::{self, cudnnDataType_t, cudnnTensorFormat_t};
use log::{Level, LevelFilter, Log, Metadata, Record};

const TARGET: &str = "cudnn_safe::cudnn";

/// Every record logged, as (target, level, message).
static RECORDS: Mutex<Vec<(String, Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl Log for Capture {
    fn enabled(&self, _: &Metadata) -> bool {
        true
    }
    fn log(&self, r: &Record) {
        let entry = (r.target().to_string(), r.level(), r.args().to_string());
        RECORDS.lock().unwrap().push(entry);
    }
    fn flush(&self) {}
}

static LOGGER: Capture = Capture;

/// cuDNN's records since the last call, emptying the list.
fn take_cudnn_records() -> Vec<(Level, String)> {
    RECORDS
        .lock()
        .unwrap()
        .drain(..)
        .filter(|(t, _, _)| t == TARGET)
        .map(|(_, l, m)| (l, m))
        .collect()
}

/// Sets the maximum level and lets the crate reach the library, which brings cuDNN's callback
/// in line with it.
fn set_level(level: LevelFilter) {
    log::set_max_level(level);
    cudnn_safe::versions().unwrap();
}

/// Asks cuDNN for a tensor descriptor with `n = -1` through the raw bindings (the crate's own
/// checks would refuse it before cuDNN sees it): cuDNN reports the rejection through its
/// callback, then returns `CUDNN_STATUS_BAD_PARAM`.
fn provoke_bad_param() {
    let lib = sys::library().unwrap();
    let create = sys::sym!(lib, cudnnCreateTensorDescriptor).unwrap();
    let set = sys::sym!(lib, cudnnSetTensor4dDescriptor).unwrap();
    let destroy = sys::sym!(lib, cudnnDestroyTensorDescriptor).unwrap();
    let mut desc = std::ptr::null_mut();
    // SAFETY: `desc` is a valid place for the new descriptor; creation needs no GPU.
    assert_eq!(unsafe { create(&mut desc) }.0, 0);
    // SAFETY: `desc` was created above and is live; the enum values are cuDNN's own.
    let status = unsafe {
        set(
            desc,
            cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            cudnnDataType_t::CUDNN_DATA_FLOAT,
            -1,
            2,
            3,
            4,
        )
    };
    assert_eq!(status.0, 2000, "cuDNN accepted n = -1");
    // SAFETY: created above, destroyed once.
    assert_eq!(unsafe { destroy(desc) }.0, 0);
}

#[test]
fn cudnn_messages_reach_the_log_crate_at_the_documented_levels() {
    if let Some(v) = ["CUDNN_LOGLEVEL_DBG", "CUDNN_LOGERR_DBG"]
        .iter()
        .find(|v| std::env::var_os(v).is_some())
    {
        eprintln!("skipping: {v} is set, so cuDNN keeps its own logging");
        return;
    }
    log::set_logger(&LOGGER).unwrap();
    log::set_max_level(LevelFilter::Debug);
    if let Err(e) = cudnn_safe::versions() {
        if common::library_required() {
            panic!("CUDNN_SAFE_REQUIRE_LIBRARY=1 but cuDNN did not load: {e}");
        }
        eprintln!("skipping: {e}");
        return;
    }

    // At `debug`, a cuDNN error arrives at `Debug` and the API trace (cuDNN's info channel) does
    // not arrive at all.
    take_cudnn_records();
    provoke_bad_param();
    let got = take_cudnn_records();
    let rejection = got
        .iter()
        .find(|(_, m)| m.contains("cudnnSetTensor4dDescriptor"));
    let Some((level, msg)) = rejection else {
        panic!("no cuDNN record for the rejected descriptor: {got:?}");
    };
    assert_eq!(*level, Level::Debug, "{msg}");
    assert!(msg.contains("CUDNN_STATUS_BAD_PARAM"), "{msg}");
    assert!(
        msg.lines().count() > 1,
        "every line of cuDNN's message is kept: {msg}"
    );
    assert!(got.iter().all(|(l, _)| *l == Level::Debug), "{got:?}");

    // At `warn`, cuDNN's error channel is switched off again.
    set_level(LevelFilter::Warn);
    take_cudnn_records();
    provoke_bad_param();
    let got = take_cudnn_records();
    assert!(got.is_empty(), "records below `warn` arrived: {got:?}");

    // At `trace`, every cuDNN call is traced with its arguments.
    set_level(LevelFilter::Trace);
    take_cudnn_records();
    provoke_bad_param();
    let got = take_cudnn_records();
    let traced = got
        .iter()
        .any(|(l, m)| *l == Level::Trace && m.contains("cudnnSetTensor4dDescriptor() called"));
    assert!(traced, "no API trace record: {got:?}");
    assert!(
        got.iter().any(|(l, _)| *l == Level::Debug),
        "the error channel stays on at trace: {got:?}"
    );
}
