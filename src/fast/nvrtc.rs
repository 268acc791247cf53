//! NVRTC, the CUDA run-time compiler, for the crate's generated kernels (`fast::elementwise`).
//!
//! cudarc loads `libnvrtc` at its first call and panics when it is missing, so every entry point
//! here first checks, once per process, that the library can be opened and is NVRTC 12 or newer
//! (every function used here exists from 11.2 on); otherwise it returns the reason as an error,
//! never a panic. Compilation needs nothing but the library itself (and the
//! `libnvrtc-builtins` beside it, which NVRTC loads on its own): the sources include no
//! header.
//!
//! A source is compiled to a CUBIN for the GPU's own architecture when this NVRTC knows it (no
//! driver JIT at load time, and no PTX newer than the driver can read); for a GPU newer than
//! every architecture NVRTC knows, to PTX for the newest one below it, which the driver
//! compiles at load time. Results are kept for the process ([`compile_cached`]), so a second
//! handle, or a handle on a second GPU of the same kind, reuses them.
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::nvrtc::sys;

/// A compiled module, in the form the driver's `cuModuleLoadData` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Image {
    /// Machine code for the GPU's own architecture.
    Cubin(Vec<u8>),
    /// PTX text for an older virtual architecture (the driver JIT-compiles it).
    Ptx(String),
}

/// Whether cudarc can open an NVRTC library (cudarc panics at its first NVRTC call otherwise).
#[cfg(not(feature = "cudarc-dynamic-linking"))]
fn library_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen NVRTC by its usual names (the same list,
    // in the same order, that cudarc's loader then uses) and closes it again; NVRTC's
    // initialisers are sound to run.
    unsafe { sys::is_culib_present() }
}

/// Whether cudarc can reach NVRTC: always, when it is linked (a process without it does not
/// start).
#[cfg(feature = "cudarc-dynamic-linking")]
fn library_present() -> bool {
    true
}

/// The oldest NVRTC used: `nvrtcGetCUBIN` came with 11.1 and `nvrtcGetSupportedArchs` with 11.2;
/// CUDA 12 is the oldest toolkit the crate builds for.
const MIN_MAJOR: c_int = 12;

/// NVRTC's `(major, minor)` version, checked once per process: an error saying why when the
/// library is missing or older than 12.0.
pub(crate) fn version() -> Result<(i32, i32), String> {
    static VERSION: OnceLock<Result<(i32, i32), String>> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            if !library_present() {
                return Err(
                    "the NVRTC library (libnvrtc.so) could not be loaded; put the \
                            directory holding it (e.g. the `nvidia-cuda-nvrtc` wheel's lib/) on \
                            LD_LIBRARY_PATH"
                        .into(),
                );
            }
            let (mut major, mut minor) = (0 as c_int, 0 as c_int);
            // SAFETY: the library is present (checked above), so cudarc's loader finds it;
            // `nvrtcVersion` exists in every NVRTC and writes two ints through valid pointers.
            let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
            if status != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(format!("nvrtcVersion failed with {status:?}"));
            }
            if major < MIN_MAJOR {
                return Err(format!(
                    "NVRTC {major}.{minor} is too old (12.0 or newer is needed)"
                ));
            }
            Ok((major, minor))
        })
        .clone()
}

/// The real architectures this NVRTC compiles for (e.g. `[75, 80, 86, 89, 90, ...]`).
fn supported_archs() -> Result<Vec<i32>, String> {
    version()?;
    let mut n: c_int = 0;
    // SAFETY: NVRTC ≥ 12 is loaded (`version`), which has this function; `n` is a valid
    // out-pointer.
    let status = unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) };
    check(status, "nvrtcGetNumSupportedArchs")?;
    let mut archs = vec![0 as c_int; usize::try_from(n).unwrap_or(0)];
    if !archs.is_empty() {
        // SAFETY: `archs` holds the `n` ints NVRTC said it will write.
        let status = unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
        check(status, "nvrtcGetSupportedArchs")?;
    }
    Ok(archs)
}

/// The NVRTC target for a GPU of compute capability `cc` (`major·10 + minor`): the real
/// architecture `sm_<cc>` when NVRTC has it in `supported`, else the virtual architecture of
/// the newest supported one below `cc` (PTX for the driver to compile), else `None` (a GPU
/// older than every architecture this NVRTC knows).
pub(crate) fn target(cc: i32, supported: &[i32]) -> Option<(String, bool)> {
    if supported.contains(&cc) {
        return Some((format!("sm_{cc}"), true));
    }
    let below = supported.iter().copied().filter(|&a| a < cc).max()?;
    Some((format!("compute_{below}"), false))
}

fn check(status: sys::nvrtcResult, function: &str) -> Result<(), String> {
    if status == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(format!("{function} failed with {status:?}"))
    }
}

/// An NVRTC program, destroyed on drop (a failure there is ignored: nothing could be done).
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `nvrtcCreateProgram` and is destroyed once, here.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    /// The compile log (warnings or errors), or what went wrong reading it.
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: live program; `size` is a valid out-pointer.
        let status = unsafe { sys::nvrtcGetProgramLogSize(self.0, &mut size) };
        if let Err(e) = check(status, "nvrtcGetProgramLogSize") {
            return e;
        }
        let mut buf = vec![0 as c_char; size.max(1)];
        // SAFETY: live program; `buf` holds the `size` bytes (terminator included) NVRTC said
        // the log takes.
        let status = unsafe { sys::nvrtcGetProgramLog(self.0, buf.as_mut_ptr()) };
        if let Err(e) = check(status, "nvrtcGetProgramLog") {
            return e;
        }
        *buf.last_mut().unwrap_or(&mut 0) = 0;
        // SAFETY: `buf` is NUL-terminated (its last byte set to 0 just above).
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .trim()
            .to_string()
    }
}

/// Compiles CUDA C++ `src` (no headers) for a GPU of compute capability `cc` (`major·10 +
/// minor`), naming it `name` in messages. Errors carry NVRTC's log.
pub(crate) fn compile(src: &str, name: &str, cc: i32) -> Result<Image, String> {
    let supported = supported_archs()?;
    let Some((arch, real)) = target(cc, &supported) else {
        return Err(format!(
            "this NVRTC knows no architecture at or below sm_{cc} (it knows {supported:?})"
        ));
    };
    let c_src = CString::new(src).map_err(|_| format!("{name}: source holds a NUL byte"))?;
    let c_name = CString::new(name).map_err(|_| format!("{name}: name holds a NUL byte"))?;
    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC is loaded (`supported_archs` checked it); `raw` is a valid out-pointer;
    // source and name are NUL-terminated and outlive the program (dropped at the end of this
    // function, after `prog`); no headers (count 0, null arrays).
    let status = unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            c_src.as_ptr(),
            c_name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(status, "nvrtcCreateProgram")?;
    let prog = Program(raw);
    let options: Vec<CString> = [format!("--gpu-architecture={arch}"), "--std=c++14".into()]
        .into_iter()
        .map(|o| CString::new(o).unwrap_or_default())
        .collect();
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: live program; `option_ptrs` holds `options.len()` NUL-terminated strings that
    // live until the call returns. The statuses NVRTC returns for these options are all in the
    // binding's enum (the codes it lacks belong to precompiled-header and time-trace options,
    // not used).
    let status = unsafe {
        sys::nvrtcCompileProgram(prog.0, option_ptrs.len() as c_int, option_ptrs.as_ptr())
    };
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!(
            "compiling {name} for {arch} failed with {status:?}: {}",
            prog.log()
        ));
    }
    let mut size = 0usize;
    if real {
        // SAFETY: compiled program for a real architecture, so it has a CUBIN; `size` is a
        // valid out-pointer.
        let status = unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) };
        check(status, "nvrtcGetCUBINSize")?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds the `size` bytes NVRTC said the CUBIN takes.
        let status = unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) };
        check(status, "nvrtcGetCUBIN")?;
        Ok(Image::Cubin(cubin))
    } else {
        // SAFETY: compiled program; `size` is a valid out-pointer.
        let status = unsafe { sys::nvrtcGetPTXSize(prog.0, &mut size) };
        check(status, "nvrtcGetPTXSize")?;
        let mut ptx = vec![0 as c_char; size.max(1)];
        // SAFETY: `ptx` holds the `size` bytes (terminator included) NVRTC said the PTX takes.
        let status = unsafe { sys::nvrtcGetPTX(prog.0, ptx.as_mut_ptr()) };
        check(status, "nvrtcGetPTX")?;
        *ptx.last_mut().unwrap_or(&mut 0) = 0;
        // SAFETY: `ptx` is NUL-terminated (its last byte set to 0 just above).
        let text = unsafe { CStr::from_ptr(ptx.as_ptr()) };
        Ok(Image::Ptx(text.to_string_lossy().into_owned()))
    }
}

/// One compiled module of the process-wide cache, with the time NVRTC took.
pub(crate) type Compiled = Result<(Arc<Image>, Duration), String>;

/// [`compile`], once per process for each `(key, cc)`: the first call compiles (and remembers a
/// failure too), later ones return the same result. `key` must identify `src`.
pub(crate) fn compile_cached(key: &str, cc: i32, src: impl FnOnce() -> String) -> Compiled {
    static CACHE: OnceLock<Mutex<HashMap<(String, i32), Compiled>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    // A panic while holding the lock (none is expected) leaves a usable map: take it anyway.
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    map.entry((key.to_string(), cc))
        .or_insert_with(|| {
            let start = Instant::now();
            compile(&src(), key, cc).map(|image| (Arc::new(image), start.elapsed()))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_prefers_the_gpus_own_architecture() {
        let archs = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(target(90, &archs), Some(("sm_90".into(), true)));
        assert_eq!(target(75, &archs), Some(("sm_75".into(), true)));
        // A GPU newer than NVRTC: PTX for the newest architecture below it.
        assert_eq!(target(130, &archs), Some(("compute_120".into(), false)));
        assert_eq!(target(87, &archs), Some(("compute_86".into(), false)));
        // Older than everything NVRTC knows (CUDA 13 dropped Maxwell to Volta).
        assert_eq!(target(70, &archs), None);
        assert_eq!(target(90, &[]), None);
    }

    /// Without NVRTC the entry points answer with a reason, never a panic; with it, a trivial
    /// program compiles (to a CUBIN for the newest architecture it knows).
    #[test]
    fn missing_or_present_nvrtc_never_panics() {
        match version() {
            Err(why) => {
                eprintln!("no NVRTC here: {why}");
                assert!(compile("", "empty.cu", 90).is_err());
            }
            Ok((major, minor)) => {
                eprintln!("NVRTC {major}.{minor}");
                let archs = supported_archs().unwrap();
                let newest = *archs.iter().max().unwrap();
                let image = compile(
                    "extern \"C\" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }",
                    "trivial.cu",
                    newest,
                )
                .unwrap();
                assert!(matches!(&image, Image::Cubin(b) if b.starts_with(b"\x7fELF")));
                let err = compile("this is not C++", "broken.cu", newest).unwrap_err();
                assert!(err.contains("broken.cu") && err.contains("error"), "{err}");
            }
        }
    }
}
