//! Finding, loading and version-checking `libcudnn` at run time.
//!
//! Search order:
//! 1. The environment variable [`LIBRARY_ENV`] (`CUDNN_SAFE_LIBRARY`), naming either the library
//!    file itself or the directory that holds it (then `libcudnn.so.9` and `libcudnn.so` in that
//!    directory are tried). When it is set, *only* that location is searched: pointing the
//!    override at one cuDNN and silently getting another would defeat its purpose (for instance
//!    comparing against PyTorch on the same library file).
//! 2. Otherwise the sonames [`SONAMES`] through the dynamic loader's usual search
//!    (`LD_LIBRARY_PATH`, RUNPATH, the system cache).
//!
//! With the crate feature `link`, the binary was linked against `libcudnn` and the symbols are
//! taken from the process image instead.
//!
//! Every failure is a [`LoadError`] value; nothing here panics.
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::bindings::{CudnnLib, CUDNN_MAJOR, CUDNN_VERSION};

/// Environment variable naming the cuDNN library file, or the directory holding it.
pub const LIBRARY_ENV: &str = "CUDNN_SAFE_LIBRARY";

/// Library names tried, in order, when [`LIBRARY_ENV`] is not set.
pub const SONAMES: [&str; 2] = ["libcudnn.so.9", "libcudnn.so"];

/// The oldest cuDNN these bindings accept: the version of the headers they were generated from
/// (`MAJOR*10000 + MINOR*100 + PATCH`). NVIDIA's rule: same major, runtime minor ≥ build minor.
pub const REQUIRED_VERSION: usize = CUDNN_VERSION as usize;

/// Symbols that must exist for a library to count as cuDNN 9 at all; the rest are looked up
/// when first called and reported as [`LoadError::MissingSymbol`] then.
pub const REQUIRED_SYMBOLS: [&str; 4] = [
    "cudnnGetVersion",
    "cudnnGetCudartVersion",
    "cudnnGetErrorString",
    "cudnnGetLastErrorString",
];

/// Why cuDNN could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// No candidate could be opened; each entry is a candidate and why opening it failed.
    NotFound {
        /// `(candidate, reason)` for everything that was tried, in order.
        tried: Vec<(String, String)>,
    },
    /// The library was opened but lacks an entry point.
    MissingSymbol {
        /// The C function that is missing.
        symbol: &'static str,
        /// Where the library came from.
        library: String,
    },
    /// The library reports a major version other than the one these bindings were built for.
    WrongMajor {
        /// `cudnnGetVersion()` of the loaded library.
        found: usize,
        /// Where the library came from.
        library: String,
    },
    /// A sub-library that `libcudnn.so.9` forwards its entry points to
    /// ([`FORWARDED_SUB_LIBRARIES`]) cannot be opened: cuDNN's forwarding stub would call
    /// `abort()` at the first call into it, so the library is refused before any call.
    MissingSubLibrary {
        /// The sub-library file (`libcudnn_graph.so.9`, ...).
        name: String,
        /// Why opening it failed (the dynamic loader's message).
        reason: String,
        /// Where the main library came from.
        library: String,
    },
    /// The library is older than the headers the bindings were generated from.
    TooOld {
        /// `cudnnGetVersion()` of the loaded library.
        found: usize,
        /// [`REQUIRED_VERSION`].
        required: usize,
        /// Where the library came from.
        library: String,
    },
}

/// Formats a cuDNN 9 version number (`91400`) as `9.14.0`.
pub fn format_version(v: usize) -> String {
    format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
}

/// What to do when the cuDNN found is not one these bindings can use.
struct Install;

impl fmt::Display for Install {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Install cuDNN {} or newer within major version {CUDNN_MAJOR} (e.g. `pip install \
             nvidia-cudnn-cu13`) and set {LIBRARY_ENV} to the library file or its directory",
            format_version(REQUIRED_VERSION)
        )
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotFound { tried } => {
                write!(f, "cuDNN 9 library not found; tried")?;
                if tried.is_empty() {
                    write!(f, " nothing")?;
                }
                for (i, (what, why)) in tried.iter().enumerate() {
                    let sep = if i == 0 { ":" } else { ";" };
                    write!(f, "{sep} {what} ({why})")?;
                }
                write!(
                    f,
                    ". Install cuDNN 9 (e.g. `pip install nvidia-cudnn-cu13`, or `-cu12` for CUDA 12) \
                     and set {LIBRARY_ENV} to the library file or its directory, or put it on \
                     LD_LIBRARY_PATH"
                )
            }
            LoadError::MissingSymbol { symbol, library } => write!(
                f,
                "{library} has no symbol `{symbol}`: not cuDNN 9, or a cuDNN older than this \
                 function. {Install}"
            ),
            LoadError::WrongMajor { found, library } => write!(
                f,
                "{library} is cuDNN {}, these bindings need major version {CUDNN_MAJOR}. {Install}",
                format_version(*found)
            ),
            LoadError::MissingSubLibrary {
                name,
                reason,
                library,
            } => write!(
                f,
                "{library} was found, but its sub-library {name} cannot be opened, neither from \
                 the same directory nor through the dynamic loader's search ({reason}); cuDNN \
                 needs it for its first call. A cuDNN installation has it beside the main \
                 library. {Install}"
            ),
            LoadError::TooOld {
                found,
                required,
                library,
            } => write!(
                f,
                "{library} is cuDNN {}, older than the {} these bindings were generated from. \
                 {Install}",
                format_version(*found),
                format_version(*required)
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// A loaded, version-checked cuDNN library.
pub struct Library {
    api: CudnnLib,
    origin: String,
    version: usize,
    cudart_version: usize,
    /// The sub-libraries opened from the main library's directory ([`Library::open`]); kept
    /// open for the library's life.
    siblings: Vec<(String, libloading::Library)>,
    /// Forwarded sub-libraries found through the dynamic loader's search instead (checked
    /// before the first call), kept open for the library's life.
    searched: Vec<libloading::Library>,
}

/// The sub-libraries `libcudnn.so.9` forwards its entry points to (`cudnnGetVersion` itself is
/// in `libcudnn_graph`). Its forwarding stub calls `abort()` when it cannot open one, so each is
/// checked to open before the first call into the library ([`LoadError::MissingSubLibrary`]).
pub const FORWARDED_SUB_LIBRARIES: [&str; 4] = [
    "libcudnn_graph",
    "libcudnn_ops",
    "libcudnn_cnn",
    "libcudnn_adv",
];

/// cuDNN 9's sub-libraries, each before those that need it. `libcudnn.so.9` opens them lazily by
/// soname (`libcudnn_graph.so.9`, ...), which the dynamic loader resolves through its usual
/// search, not from `libcudnn.so.9`'s own directory.
pub const SUB_LIBRARIES: [&str; 7] = [
    "libcudnn_graph",
    "libcudnn_engines_precompiled",
    "libcudnn_engines_runtime_compiled",
    "libcudnn_heuristic",
    "libcudnn_ops",
    "libcudnn_cnn",
    "libcudnn_adv",
];

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library")
            .field("origin", &self.origin)
            .field("version", &format_version(self.version))
            .field("cudart_version", &self.cudart_version)
            .field(
                "siblings",
                &self.siblings.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field("searched_sub_libraries", &self.searched.len())
            .finish()
    }
}

impl Library {
    /// The function table. Fields are `Result`s: use [`crate::sym!`] to get a pointer or a
    /// [`LoadError::MissingSymbol`].
    pub fn api(&self) -> &CudnnLib {
        &self.api
    }
    /// Where the library was loaded from (the path or soname that was opened).
    pub fn origin(&self) -> &str {
        &self.origin
    }
    /// `cudnnGetVersion()`, e.g. `91400` for 9.14.0.
    pub fn version(&self) -> usize {
        self.version
    }
    /// `cudnnGetCudartVersion()`: the CUDA runtime version cuDNN was built against (e.g. `13000`).
    pub fn cudart_version(&self) -> usize {
        self.cudart_version
    }
    /// The sub-libraries [`Library::open`] opened from the main library's directory (paths).
    pub fn sub_libraries(&self) -> Vec<&str> {
        self.siblings.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Opens the library at `path` (a file path or a soname for the dynamic loader), checks it
    /// and returns it. This does not touch the process-wide library used by [`library`].
    ///
    /// # Safety
    /// Opening a shared library runs its initialisers: `path` must name a cuDNN library (or a
    /// library whose initialisers are sound to run); any other library is rejected afterwards
    /// by the symbol and version checks, but its initialisers have already run.
    ///
    /// When `path` names a file in a directory (not a bare soname), the cuDNN sub-libraries in
    /// that directory ([`SUB_LIBRARIES`], `<name>.so.<major>`) are opened first: `libcudnn.so`
    /// loads `libcudnn_graph` from its initializer, and the others later, by name, and the
    /// dynamic loader hands it those already loaded. Otherwise another cuDNN on the loader's
    /// search path (`LD_LIBRARY_PATH`, the system directories) supplies them — one version's
    /// front library running another's sub-libraries, which `cudnnGetVersion` then reports and
    /// whose legacy calls fail with `CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH`. A sub-library
    /// that does not open is left to cuDNN's own lookup.
    pub unsafe fn open(path: impl AsRef<Path>) -> Result<Library, LoadError> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let mut siblings = Vec::new();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            for name in SUB_LIBRARIES {
                let p = dir.join(format!("{name}.so.{CUDNN_MAJOR}"));
                if !p.exists() {
                    continue;
                }
                // SAFETY: a `libcudnn_*` library next to the cuDNN the caller named is part of
                // that cuDNN; its initialisers run exactly as they would when libcudnn.so opens
                // it. The handle is kept in the `Library`, so it stays loaded while that lives.
                if let Ok(s) = unsafe { libloading::Library::new(&p) } {
                    siblings.push((p.display().to_string(), s));
                }
            }
        }
        // SAFETY: the caller vouches that running this library's initialisers is sound.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::NotFound {
            tried: vec![(origin.clone(), short_reason(&e))],
        })?;
        Self::from_libloading(lib, origin, siblings)
    }

    /// Checks a library just opened (with the `siblings` opened from its directory) and
    /// returns it: the required symbols, the forwarded sub-libraries, then the version.
    fn from_libloading(
        lib: libloading::Library,
        origin: String,
        siblings: Vec<(String, libloading::Library)>,
    ) -> Result<Library, LoadError> {
        // SAFETY: `from_library` only resolves symbols by name and stores them as `Result`s typed
        // as in cudnn.h; a missing symbol becomes an `Err` field, checked below before any call.
        let api = unsafe { CudnnLib::from_library(lib) }.map_err(|e| LoadError::NotFound {
            tried: vec![(origin.clone(), short_reason(&e))],
        })?;
        let fields = [
            api.cudnnGetVersion.is_ok(),
            api.cudnnGetCudartVersion.is_ok(),
            api.cudnnGetErrorString.is_ok(),
            api.cudnnGetLastErrorString.is_ok(),
        ];
        if let Some(i) = fields.iter().position(|ok| !ok) {
            return Err(LoadError::MissingSymbol {
                symbol: REQUIRED_SYMBOLS[i],
                library: origin,
            });
        }
        let mut searched = Vec::new();
        for name in FORWARDED_SUB_LIBRARIES {
            let file = format!("{name}.so.{CUDNN_MAJOR}");
            let beside = siblings
                .iter()
                .any(|(p, _)| Path::new(p).file_name() == Some(file.as_ref()));
            if beside {
                continue;
            }
            // SAFETY: a cuDNN sub-library by its soname, opened as `libcudnn.so.9` itself opens
            // it at its first call (its initialisers run exactly as they would then); the handle
            // is kept in the `Library`, so it stays loaded while that lives.
            match unsafe { libloading::Library::new(&file) } {
                Ok(l) => searched.push(l),
                Err(e) => {
                    return Err(LoadError::MissingSubLibrary {
                        name: file,
                        reason: short_reason(&e),
                        library: origin,
                    })
                }
            }
        }
        let mut lib = Library {
            api,
            origin,
            version: 0,
            cudart_version: 0,
            siblings,
            searched,
        };
        let get_version = crate::sym!(lib, cudnnGetVersion)?;
        let get_cudart = crate::sym!(lib, cudnnGetCudartVersion)?;
        // SAFETY: both functions take no arguments, only read constants compiled into the library,
        // and work without a GPU; the pointers were resolved from this library and are non-null.
        let (version, cudart) = unsafe { (get_version(), get_cudart()) };
        lib.version = version;
        lib.cudart_version = cudart;
        check_version(version, &lib.origin)?;
        Ok(lib)
    }
}

/// Checks a `cudnnGetVersion()` value against the bindings: same major, not older.
pub fn check_version(found: usize, library: &str) -> Result<(), LoadError> {
    if found / 10000 != CUDNN_MAJOR as usize {
        return Err(LoadError::WrongMajor {
            found,
            library: library.to_string(),
        });
    }
    if found < REQUIRED_VERSION {
        return Err(LoadError::TooOld {
            found,
            required: REQUIRED_VERSION,
            library: library.to_string(),
        });
    }
    Ok(())
}

fn short_reason(e: &libloading::Error) -> String {
    // libloading's message repeats the path; keep dlerror's text, which says why.
    let s = e.to_string();
    match s.rsplit_once(": ") {
        Some((_, tail)) if !tail.is_empty() => tail.to_string(),
        _ => s,
    }
}

/// The candidates searched, in order, for a given value of [`LIBRARY_ENV`].
///
/// A directory yields `dir/libcudnn.so.9` and `dir/libcudnn.so`; anything else is taken as the
/// library file. `None` or an empty value yields [`SONAMES`].
pub fn candidates(override_value: Option<&OsString>) -> Vec<PathBuf> {
    match override_value.filter(|v| !v.is_empty()) {
        Some(v) => {
            let p = PathBuf::from(v);
            if p.is_dir() {
                SONAMES.iter().map(|n| p.join(n)).collect()
            } else {
                vec![p]
            }
        }
        None => SONAMES.iter().map(PathBuf::from).collect(),
    }
}

/// Tries each candidate in order and returns the first that opens and passes the checks.
///
/// A candidate that opens but fails a check (missing symbol, wrong version) stops the search
/// with that error: a wrong cuDNN found first would also be the one the dynamic loader hands
/// to anything else in the process.
///
/// # Safety
/// As [`Library::open`]: each candidate's initialisers run when it is opened.
pub unsafe fn load_from_candidates(candidates: &[PathBuf]) -> Result<Library, LoadError> {
    let mut tried = Vec::new();
    for c in candidates {
        // SAFETY: forwarded to the caller.
        match unsafe { Library::open(c) } {
            Ok(lib) => return Ok(lib),
            Err(LoadError::NotFound { tried: t }) => tried.extend(t),
            Err(other) => return Err(other),
        }
    }
    Err(LoadError::NotFound { tried })
}

#[cfg(feature = "link")]
mod linked {
    extern "C" {
        // Referencing one symbol keeps the linker from dropping -lcudnn under --as-needed.
        pub fn cudnnGetVersion() -> usize;
    }
}

#[cfg(feature = "link")]
fn load_process_library() -> Result<Library, LoadError> {
    // Taking the address (not calling) keeps the reference to libcudnn in the binary.
    let _keep = std::hint::black_box(linked::cudnnGetVersion as *const ());
    let this: libloading::Library = libloading::os::unix::Library::this().into();
    Library::from_libloading(
        this,
        "libcudnn (linked into the executable)".into(),
        Vec::new(),
    )
}

#[cfg(not(feature = "link"))]
fn load_process_library() -> Result<Library, LoadError> {
    let cands = candidates(std::env::var_os(LIBRARY_ENV).as_ref());
    // SAFETY: the candidates are cuDNN's sonames or the path the user put in LIBRARY_ENV for
    // the purpose of naming cuDNN; the process environment is trusted, as for LD_LIBRARY_PATH.
    unsafe { load_from_candidates(&cands) }
}

static LIBRARY: OnceLock<Result<Library, LoadError>> = OnceLock::new();

/// The process-wide cuDNN library, loaded and checked on first use.
///
/// The outcome of the first attempt is kept: a later change of [`LIBRARY_ENV`] has no effect in
/// the same process.
pub fn library() -> Result<&'static Library, LoadError> {
    LIBRARY
        .get_or_init(load_process_library)
        .as_ref()
        .map_err(Clone::clone)
}
