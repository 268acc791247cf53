//! cuDNN's own log messages, routed into the `log` crate.
//!
//! cuDNN reports through one process-wide callback (`cudnnSetCallback`); no environment variable
//! is needed for it. Whenever this crate reaches the library it compares the `log` crate's
//! current maximum level with the channels it enabled last time and, when they differ, installs
//! [`callback`] with the channels that level can show. Without a logger (`log::max_level()` is
//! `Off`) nothing is installed and cuDNN's own default logging stays in charge.
//!
//! | cuDNN severity | `log` level | why |
//! |---|---|---|
//! | `CUDNN_SEV_FATAL` | `Error` | the library cannot continue |
//! | `CUDNN_SEV_WARNING` | `Warn` | |
//! | `CUDNN_SEV_ERROR` | `Debug` | each one is also the status of the call it describes, which this crate returns as an [`Error`](crate::Error) carrying the same reason; probing (autotuning, support queries) provokes many that are handled |
//! | `CUDNN_SEV_INFO` | `Trace` | one record per cuDNN call with its arguments (the API trace) |
//!
//! When `CUDNN_LOGLEVEL_DBG` (or cuDNN 8's `CUDNN_LOGINFO_DBG`, `CUDNN_LOGWARN_DBG`,
//! `CUDNN_LOGERR_DBG`) is set, the user has asked for cuDNN's own logging to its own destination
//! (`CUDNN_LOGDEST_DBG`), and the callback is left alone.
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudnn_safe_sys::{self as sys, sym, Library};
use log::{Level, LevelFilter};

/// The `log` target of cuDNN's own messages.
pub(crate) const TARGET: &str = "cudnn_safe::cudnn";

/// `CUDNN_SEV_ERROR_EN`, `CUDNN_SEV_WARNING_EN`, `CUDNN_SEV_INFO_EN` (cudnn_graph.h: one bit per
/// severity, at the severity's value).
const ERROR_EN: u32 = 1 << sys::cudnnSeverity_t::CUDNN_SEV_ERROR.0;
const WARNING_EN: u32 = 1 << sys::cudnnSeverity_t::CUDNN_SEV_WARNING.0;
const INFO_EN: u32 = 1 << sys::cudnnSeverity_t::CUDNN_SEV_INFO.0;

/// The mask installed last; `NEVER` until a logger first asked for something.
static INSTALLED: AtomicU32 = AtomicU32::new(NEVER);
const NEVER: u32 = u32::MAX;
/// Serializes installs (cudnnSetCallback is process-wide state).
static INSTALL: Mutex<()> = Mutex::new(());

/// The environment variables with which a user asks for cuDNN's own logging.
const CUDNN_LOG_ENV: [&str; 4] = [
    "CUDNN_LOGLEVEL_DBG",
    "CUDNN_LOGINFO_DBG",
    "CUDNN_LOGWARN_DBG",
    "CUDNN_LOGERR_DBG",
];

/// The cuDNN channels whose records the `log` crate's current maximum level can show.
fn wanted_mask(max: LevelFilter) -> u32 {
    match max {
        LevelFilter::Off | LevelFilter::Error => 0,
        LevelFilter::Warn | LevelFilter::Info => WARNING_EN,
        LevelFilter::Debug => WARNING_EN | ERROR_EN,
        LevelFilter::Trace => WARNING_EN | ERROR_EN | INFO_EN,
    }
}

/// Installs or updates the callback when the `log` level asks for other channels than those
/// enabled; called each time the crate reaches the library (two relaxed loads when nothing
/// changed).
pub(crate) fn sync(lib: &Library) {
    let want = wanted_mask(log::max_level());
    let have = INSTALLED.load(Ordering::Relaxed);
    if have == want || (have == NEVER && want == 0) {
        return;
    }
    static CUDNN_OWN_LOGGING: OnceLock<bool> = OnceLock::new();
    if *CUDNN_OWN_LOGGING
        .get_or_init(|| CUDNN_LOG_ENV.iter().any(|v| std::env::var_os(v).is_some()))
    {
        return;
    }
    let Ok(set_callback) = sym!(lib, cudnnSetCallback) else {
        INSTALLED.store(want, Ordering::Relaxed);
        return;
    };
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(PoisonError::into_inner);
    if INSTALLED.load(Ordering::Relaxed) == want {
        return;
    }
    // SAFETY: `cudnnSetCallback` only stores the mask, the user pointer and the function pointer
    // in cuDNN's process-wide state; it needs no GPU. `callback` has exactly the C signature of
    // `cudnnCallback_t`, is a plain function that lives as long as the process, never unwinds
    // and ignores `udata`, so a null `udata` is fine.
    let status = unsafe { set_callback(want, std::ptr::null_mut(), Some(callback)) };
    // Remembered even on failure, so that a refusal is not retried on every call.
    INSTALLED.store(want, Ordering::Relaxed);
    if status.0 != 0 {
        log::debug!("cudnnSetCallback failed with status {}", status.0);
    }
}

/// The `log` level of a cuDNN severity (see the module documentation).
fn level(sev: sys::cudnnSeverity_t) -> Level {
    match sev {
        sys::cudnnSeverity_t::CUDNN_SEV_FATAL => Level::Error,
        sys::cudnnSeverity_t::CUDNN_SEV_WARNING => Level::Warn,
        sys::cudnnSeverity_t::CUDNN_SEV_ERROR => Level::Debug,
        _ => Level::Trace,
    }
}

/// The most lines read from one message: a guard against a message whose end marker is missing.
const MAX_LINES: usize = 512;

/// The lines of a cuDNN log message, joined by newlines.
///
/// # Safety
/// `msg` is null or points to a message in cuDNN's documented format: lines, each terminated by
/// a NUL byte, and an empty line (a second NUL) after the last.
unsafe fn message_text(msg: *const c_char) -> String {
    let mut text = String::new();
    let mut line = msg;
    if line.is_null() {
        return text;
    }
    for _ in 0..MAX_LINES {
        // SAFETY: `line` is the start of a line of the message or of its closing empty line (the
        // caller's contract, and the step below), so it points to a NUL-terminated string that
        // lives for this call.
        let bytes = unsafe { CStr::from_ptr(line) }.to_bytes();
        if bytes.is_empty() {
            break;
        }
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(String::from_utf8_lossy(bytes).trim_end());
        // SAFETY: one past this line's NUL is the next line or the closing NUL, inside the
        // same message.
        line = unsafe { line.add(bytes.len() + 1) };
    }
    text
}

/// The function cuDNN calls with each message of an enabled channel.
///
/// It never unwinds into cuDNN: a panic (from a logger, say) is caught and dropped.
unsafe extern "C" fn callback(
    sev: sys::cudnnSeverity_t,
    _udata: *mut c_void,
    _dbg: *const sys::cudnnDebug_t,
    msg: *const c_char,
) {
    let _ = std::panic::catch_unwind(|| {
        let level = level(sev);
        if !log::log_enabled!(target: TARGET, level) {
            return;
        }
        // SAFETY: cuDNN passes its message in the format `message_text` documents (or null),
        // valid for the duration of this call.
        let text = unsafe { message_text(msg) };
        log::log!(target: TARGET, level, "{text}");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_follow_the_log_level() {
        assert_eq!(wanted_mask(LevelFilter::Off), 0);
        assert_eq!(wanted_mask(LevelFilter::Error), 0);
        assert_eq!(wanted_mask(LevelFilter::Warn), 1 << 2);
        assert_eq!(wanted_mask(LevelFilter::Debug), (1 << 1) | (1 << 2));
        assert_eq!(
            wanted_mask(LevelFilter::Trace),
            (1 << 1) | (1 << 2) | (1 << 3)
        );
        assert_eq!(level(sys::cudnnSeverity_t::CUDNN_SEV_ERROR), Level::Debug);
        assert_eq!(level(sys::cudnnSeverity_t(77)), Level::Trace);
    }

    #[test]
    fn messages_are_split_at_nul_and_end_at_the_empty_line() {
        let msg = b"CuDNN (v91400) function cudnnFoo() called:\0    Error: BAD_PARAM  \0\0tail\0\0";
        // SAFETY: `msg` is in cuDNN's message format and outlives the call.
        let text = unsafe { message_text(msg.as_ptr().cast()) };
        assert_eq!(
            text,
            "CuDNN (v91400) function cudnnFoo() called:\n    Error: BAD_PARAM"
        );
        // SAFETY: null is allowed.
        assert_eq!(unsafe { message_text(std::ptr::null()) }, "");
        // SAFETY: an empty message is its closing NUL alone.
        assert_eq!(unsafe { message_text(c"".as_ptr()) }, "");
    }
}
