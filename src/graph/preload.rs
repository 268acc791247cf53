//! Start-up work that moves cuDNN's lazy one-time costs off the first call: opening its
//! sub-libraries and initializing its engines.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{ConvParams, Graph, HeurMode, PlanFilter};
use crate::dtype::DType;
use crate::error::Result;
use crate::handle::Cudnn;

/// What [`preload`] did and how long each part took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preloaded {
    /// cuDNN sub-libraries (`libcudnn_*.so*` next to the loaded `libcudnn.so`) opened.
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
/// 1. opens every cuDNN sub-library next to the loaded `libcudnn.so` (`libcudnn_graph`,
///    `libcudnn_engines_precompiled`, ...; cuDNN opens them lazily, and the first graph built
///    pays for it; Linux only, elsewhere none are opened);
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
    let libraries = open_sub_libraries();
    let open = t.elapsed();
    let t = Instant::now();
    let mut g = Graph::new(DType::F32, DType::F32, DType::F32);
    let x = g.tensor_nchw("x", &[1, 8, 4, 4], DType::F32)?;
    let w = g.tensor_nchw("w", &[8, 8, 3, 3], DType::F32)?;
    let y = g.conv_fprop(x, w, &ConvParams::new(2).padding(&[1, 1]))?;
    g.mark_output(y)?;
    let og = g.build(cudnn)?;
    let list = og.plans(
        cudnn,
        &PlanFilter::new()
            .heuristics(&[HeurMode::A, HeurMode::Fallback])
            .max_plans(Some(1)),
    )?;
    let engine = list.plans.first().map(|p| p.name()).unwrap_or_default();
    Ok(Preloaded {
        libraries,
        open,
        engine,
        engines: t.elapsed(),
    })
}

/// The path `libcudnn.so*` is mapped from in this process.
#[cfg(target_os = "linux")]
fn cudnn_path() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("libcudnn.so"))
        })
        .map(PathBuf::from)
}

/// `dlopen`s every `libcudnn_*.so*` next to the mapped libcudnn.so; how many opened.
#[cfg(target_os = "linux")]
fn open_sub_libraries() -> usize {
    use std::ffi::{c_char, c_int, c_void, CString};
    use std::os::unix::ffi::OsStrExt;
    extern "C" {
        fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    }
    const RTLD_LAZY: c_int = 1;
    let Some(dir) = cudnn_path().and_then(|p| p.parent().map(Path::to_path_buf)) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|f| {
                let f = f.to_string_lossy();
                f.starts_with("libcudnn_") && f.contains(".so")
            })
        })
        .collect();
    names.sort();
    let mut opened = 0;
    for p in names {
        let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
            continue;
        };
        // SAFETY: `c` is a NUL-terminated path that outlives the call. Opening a cuDNN
        // sub-library runs its initializers exactly as cuDNN's own `dlopen` of it would (the
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
fn open_sub_libraries() -> usize {
    0
}
