//! Start-up work that moves cuDNN's lazy one-time costs off the first call: opening its
//! sub-libraries and initializing its engines.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{ConvParams, Graph, HeurMode, PlanFilter};
use crate::dtype::DType;
use crate::error::Result;
use crate::handle::Cudnn;
use cudnn_safe_sys as sys;

/// What [`preload`] did and how long each part took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preloaded {
    /// cuDNN sub-libraries opened (cuDNN's own names, of the loaded major version, next to the
    /// loaded `libcudnn.so`).
    pub libraries: usize,
    /// Time spent opening them.
    pub open: Duration,
    /// The engine configuration of the plan built to initialize cuDNN's engines.
    pub engine: String,
    /// Time spent building that plan.
    pub engines: Duration,
}

/// Does at start-up what cuDNN otherwise does during the first graph call of a process:
///
/// 1. opens the cuDNN sub-libraries next to the loaded `libcudnn.so`: cuDNN's own names
///    ([`crate::sys::loader::SUB_LIBRARIES`]: `libcudnn_graph`,
///    `libcudnn_engines_precompiled`, ...) with the loaded major version's soname (`.so.9`),
///    nothing else in that directory (cuDNN opens them lazily, and the first graph built pays
///    for it; Linux only, elsewhere none are opened);
/// 2. builds (and drops) a plan of a tiny f32 convolution graph, which runs cuDNN's one-time
///    initialization of its engines (afterwards the first plan of another graph, such as one
///    from a [`PlanCache`](super::PlanCache) file, finalizes without paying for it).
///
/// [`Preloaded`] reports how long each part took. Nothing executes on the GPU. What stays for
/// the first execution of each plan is CUDA's lazy loading of its kernel (each engine
/// configuration is a kernel of its own: executing a tiny convolution, or the same engine with
/// other knobs, loads nothing the cached plan needs). [`crate::Autotuner::warm_up`] replays the
/// remembered convolution decisions at start-up, which loads exactly their kernels. A process
/// started with `CUDA_MODULE_LOADING=EAGER` loads every kernel while the sub-libraries open
/// instead (seconds of start-up), after which the first execution of any plan costs no
/// loading.
///
/// ```no_run
/// # fn f(cudnn: &cudnn_safe::Cudnn) -> cudnn_safe::Result<()> {
/// let p = cudnn_safe::graph::preload(cudnn)?;
/// println!("{} sub-libraries in {:?}, engines in {:?}", p.libraries, p.open, p.engines);
/// # Ok(()) }
/// ```
pub fn preload(cudnn: &Cudnn) -> Result<Preloaded> {
    let t = Instant::now();
    let libraries = open_sub_libraries(cudnn);
    let open = t.elapsed();
    let t = Instant::now();
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[1, 8, 4, 4], DType::F32)?;
    let w = g.tensor_nchw("w", &[8, 8, 3, 3], DType::F32)?;
    let y = g.conv_fprop(x, w, &ConvParams::new(2).with_padding(&[1, 1]))?;
    g.mark_output(y)?;
    let og = g.build(cudnn)?;
    let list = og.plans(
        cudnn,
        &PlanFilter::new()
            .with_heuristics(&[HeurMode::A, HeurMode::Fallback])
            .with_max_plans(Some(1)),
    )?;
    let engine = list.plans.first().map(|p| p.name()).unwrap_or_default();
    Ok(Preloaded {
        libraries,
        open,
        engine,
        engines: t.elapsed(),
    })
}

/// The directory of the cuDNN this crate loaded: that of the path it was opened from, or else
/// (opened by soname) the directory `libcudnn.so*` is mapped from in this process.
#[cfg(target_os = "linux")]
fn cudnn_dir(cudnn: &Cudnn) -> Option<PathBuf> {
    let origin = Path::new(cudnn.library_origin());
    if origin.is_absolute() {
        return origin.parent().map(Path::to_path_buf);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("libcudnn.so"))
        })
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
}

/// The sub-libraries of a cuDNN of major version `major` present in `dir`: each of cuDNN's own
/// names ([`sys::loader::SUB_LIBRARIES`]) with that major's soname (`libcudnn_graph.so.9`,
/// ...), in cuDNN's loading order. Nothing else in the directory is named, whatever it is
/// called.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn sub_library_paths(dir: &Path, major: usize) -> Vec<PathBuf> {
    sys::loader::SUB_LIBRARIES
        .iter()
        .map(|name| dir.join(format!("{name}.so.{major}")))
        .filter(|p| p.is_file())
        .collect()
}

/// `dlopen`s the sub-libraries of the loaded cuDNN ([`sub_library_paths`] of its directory and
/// major version); how many opened.
#[cfg(target_os = "linux")]
fn open_sub_libraries(cudnn: &Cudnn) -> usize {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::os::unix::ffi::OsStrExt;
    extern "C" {
        fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    }
    const RTLD_LAZY: c_int = 1;
    let Some(dir) = cudnn_dir(cudnn) else {
        return 0;
    };
    let mut opened = 0;
    for p in sub_library_paths(&dir, cudnn.version() / 10000) {
        let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: `c` is a NUL-terminated path that outlives the call, naming one of cuDNN's
        // own sub-libraries of the loaded major version in the loaded library's directory.
        // Opening it runs its initializers exactly as cuDNN's own `dlopen` of it would (the
        // dynamic loader then hands cuDNN this instance, matched by soname); the handle is
        // never closed, so nothing is unloaded under cuDNN.
        let h = unsafe { dlopen(c.as_ptr(), RTLD_LAZY) };
        if h.is_null() {
            log::debug!("preload: could not open {}", p.display());
        } else {
            opened += 1;
        }
    }
    opened
}

#[cfg(not(target_os = "linux"))]
fn open_sub_libraries(_cudnn: &Cudnn) -> usize {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_known_sub_libraries_of_the_major_are_named() {
        let dir = std::env::temp_dir().join(format!("cudnn-safe-preload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Empty files: nothing here is ever opened by this test, only named.
        for f in [
            "libcudnn_evil.so.9",
            "libcudnn_ops.so.9",
            "libcudnn_graph.so.9",
            "libcudnn_cnn.so.8",
            "libcudnn_adv.so",
            "libcudnn_heuristic.so.9.14.0",
            "libcudnn.so.9",
        ] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        // A directory of a known name is not a library either.
        std::fs::create_dir_all(dir.join("libcudnn_adv.so.9")).unwrap();
        let named = sub_library_paths(&dir, 9);
        assert_eq!(
            named,
            [
                dir.join("libcudnn_graph.so.9"),
                dir.join("libcudnn_ops.so.9")
            ]
        );
        assert!(named.iter().all(|p| !p.to_string_lossy().contains("evil")));
        assert_eq!(sub_library_paths(&dir, 8), [dir.join("libcudnn_cnn.so.8")]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
