//! Library versions: what was loaded, what it was built with, and the sub-library checks.
use std::fmt;

use cudnn_safe_sys::loader::REQUIRED_VERSION;

use crate::error::Result;
use crate::raw;

pub use cudnn_safe_sys::loader::format_version;

/// Versions of the loaded cuDNN and the state of its sub-libraries. Host-only: works without a
/// GPU.
#[derive(Debug)]
#[non_exhaustive]
pub struct Versions {
    /// Where `libcudnn` was loaded from.
    pub library: String,
    /// `cudnnGetVersion()` (e.g. `91400`).
    pub cudnn: usize,
    /// `cudnnGetCudartVersion()`: the CUDA runtime cuDNN was built against (e.g. `13000`).
    pub cudart: usize,
    /// The cuDNN version these bindings were generated from.
    pub bindings: usize,
    /// `cudnn{Graph,Ops,Cnn,Adv}VersionCheck`, by sub-library name (`graph`, `ops`, `cnn`, `adv`).
    pub sublibraries: Vec<(&'static str, Result<()>)>,
}

impl Versions {
    /// Whether every sub-library loaded and matched.
    pub fn all_sublibraries_ok(&self) -> bool {
        self.sublibraries.iter().all(|(_, r)| r.is_ok())
    }
}

/// Loads cuDNN if needed and reports its versions.
#[doc(alias = "cudnnGetVersion")]
#[doc(alias = "cudnnGetCudartVersion")]
#[doc(alias = "cudnnOpsVersionCheck")]
#[doc(alias = "cudnnGraphVersionCheck")]
pub fn versions() -> Result<Versions> {
    let lib = raw::lib()?;
    Ok(Versions {
        library: lib.origin().to_string(),
        cudnn: lib.version(),
        cudart: lib.cudart_version(),
        bindings: REQUIRED_VERSION,
        sublibraries: raw::sublibrary_checks(lib),
    })
}

impl fmt::Display for Versions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "cuDNN {} from {}",
            format_version(self.cudnn),
            self.library
        )?;
        writeln!(
            f,
            "  built against CUDA runtime {}.{}; bindings generated from cuDNN {}",
            self.cudart / 1000,
            (self.cudart % 1000) / 10,
            format_version(self.bindings)
        )?;
        for (name, r) in &self.sublibraries {
            match r {
                Ok(()) => writeln!(f, "  libcudnn_{name}: ok")?,
                Err(e) => writeln!(f, "  libcudnn_{name}: {e}")?,
            }
        }
        Ok(())
    }
}
