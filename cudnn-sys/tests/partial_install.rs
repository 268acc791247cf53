//! A cuDNN main library whose sub-libraries are missing (a partial copy, a `stubs/` directory on
//! the search path) is refused with `LoadError::MissingSubLibrary` before any call: cuDNN's
//! forwarding stub would call `abort()` at its first call (`cudnnGetVersion` lives in
//! `libcudnn_graph`). A test binary of its own, so that no other test has loaded the real
//! sub-libraries into the process first.
use std::path::PathBuf;

use cudnn_safe_sys::loader::{self, LoadError};
use cudnn_safe_sys::Library;

#[test]
fn a_main_library_without_its_sub_libraries_is_refused_not_aborted() {
    let Some(v) = std::env::var_os(loader::LIBRARY_ENV).filter(|v| !v.is_empty()) else {
        eprintln!("skipping: {} is not set", loader::LIBRARY_ENV);
        return;
    };
    let Some(main) = loader::candidates(Some(&v))
        .into_iter()
        .find(|c| c.is_file())
    else {
        assert_ne!(
            std::env::var("CUDNN_SAFE_REQUIRE_LIBRARY").as_deref(),
            Ok("1"),
            "{} names no cuDNN file",
            loader::LIBRARY_ENV
        );
        eprintln!("skipping: {} names no cuDNN file", loader::LIBRARY_ENV);
        return;
    };
    let dir: PathBuf =
        std::env::temp_dir().join(format!("cudnn-safe-partial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lone = dir.join("libcudnn.so.9");
    std::fs::copy(&main, &lone).unwrap();
    // SAFETY: a copy of the cuDNN main library the environment names.
    let opened = unsafe { Library::open(&lone) };
    // Whether the dynamic loader's search finds a graph sub-library of its own (a cuDNN
    // installed system-wide), asked after the open so that the open saw the process as it was.
    // SAFETY: a cuDNN sub-library by its soname, as the main library opens it.
    let on_search_path = unsafe { libloading::Library::new("libcudnn_graph.so.9") }.is_ok();
    match opened {
        Err(LoadError::MissingSubLibrary { name, library, .. }) => {
            assert_eq!(name, "libcudnn_graph.so.9");
            assert_eq!(library, lone.display().to_string());
            let msg = LoadError::MissingSubLibrary {
                name,
                reason: String::new(),
                library,
            }
            .to_string();
            assert!(msg.contains("libcudnn_graph.so.9") && msg.contains(loader::LIBRARY_ENV));
        }
        Ok(lib) => assert!(
            on_search_path,
            "opened {lib:?} although no graph sub-library is on the search path"
        ),
        Err(e) => panic!("{e}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
