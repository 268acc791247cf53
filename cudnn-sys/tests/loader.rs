//! Loader failure paths. None of these needs cuDNN on the machine.
use std::path::PathBuf;

use cudnn_safe_sys::loader::{self, check_version, LoadError, REQUIRED_VERSION, SONAMES};
use cudnn_safe_sys::Library;

#[test]
fn empty_search_path_lists_nothing_tried() {
    // SAFETY: nothing is opened.
    let err = unsafe { loader::load_from_candidates(&[]) }.unwrap_err();
    assert_eq!(err, LoadError::NotFound { tried: vec![] });
    assert!(err.to_string().contains("tried nothing"), "{err}");
}

#[test]
fn empty_directory_override_names_every_candidate() {
    let dir = std::env::temp_dir().join(format!("cudnn-safe-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cands = loader::candidates(Some(&dir.clone().into_os_string()));
    assert_eq!(
        cands,
        SONAMES.iter().map(|n| dir.join(n)).collect::<Vec<_>>()
    );
    // SAFETY: the candidates do not exist, so nothing is opened.
    let err = unsafe { loader::load_from_candidates(&cands) }.unwrap_err();
    let LoadError::NotFound { tried } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(tried.len(), 2);
    let msg = err.to_string();
    for c in &cands {
        assert!(msg.contains(&c.display().to_string()), "{msg}");
    }
    assert!(msg.contains(loader::LIBRARY_ENV), "{msg}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn override_file_and_default_sonames() {
    let f = std::ffi::OsString::from("/opt/x/libcudnn.so.9.14.0");
    assert_eq!(
        loader::candidates(Some(&f)),
        vec![PathBuf::from("/opt/x/libcudnn.so.9.14.0")]
    );
    let defaults: Vec<PathBuf> = SONAMES.iter().map(PathBuf::from).collect();
    assert_eq!(loader::candidates(None), defaults);
    assert_eq!(loader::candidates(Some(&"".into())), defaults);
    assert_eq!(SONAMES, ["libcudnn.so.9", "libcudnn.so"]);
}

#[test]
fn a_library_without_cudnn_symbols_is_a_missing_symbol_error() {
    // libc is on every Linux machine and has no cuDNN entry points.
    // SAFETY: libc is already loaded in this process; opening it again runs no initialisers.
    let err = unsafe { Library::open("libc.so.6") }.unwrap_err();
    assert_eq!(
        err,
        LoadError::MissingSymbol {
            symbol: "cudnnGetVersion",
            library: "libc.so.6".into()
        }
    );
    assert!(err.to_string().contains("cudnnGetVersion"));
}

#[test]
fn version_rules() {
    assert!(check_version(REQUIRED_VERSION, "x").is_ok());
    assert!(check_version(91900, "x").is_ok()); // newer minor: fine
    assert!(matches!(
        check_version(90100, "x"),
        Err(LoadError::TooOld { found: 90100, .. })
    ));
    assert!(matches!(
        check_version(8907, "x"),
        Err(LoadError::WrongMajor { .. })
    ));
    assert!(matches!(
        check_version(100000, "x"),
        Err(LoadError::WrongMajor { .. })
    ));
    let e = check_version(90100, "libcudnn.so.9")
        .unwrap_err()
        .to_string();
    assert!(e.contains("9.1.0") && e.contains("9.14.0"), "{e}");
    assert_eq!(loader::format_version(91400), "9.14.0");
}

/// With `CUDNN_SAFE_LIBRARY` naming a cuDNN directory (as CI does), the library opens the
/// sub-libraries of that directory, so that no other cuDNN on the search path supplies them.
#[test]
fn a_library_in_a_directory_opens_its_own_sub_libraries() {
    let Some(v) = std::env::var_os(loader::LIBRARY_ENV).filter(|v| !v.is_empty()) else {
        eprintln!("skipping: {} is not set", loader::LIBRARY_ENV);
        return;
    };
    let cands = loader::candidates(Some(&v));
    // SAFETY: the path the environment names for cuDNN, as the process-wide loader opens it.
    let lib = match unsafe { loader::load_from_candidates(&cands) } {
        Ok(l) => l,
        Err(e) => {
            if std::env::var("CUDNN_SAFE_REQUIRE_LIBRARY").as_deref() == Ok("1") {
                panic!("cuDNN not loadable: {e}");
            }
            eprintln!("skipping: {e}");
            return;
        }
    };
    let dir = PathBuf::from(lib.origin())
        .parent()
        .expect("a path in a directory")
        .to_path_buf();
    let subs = lib.sub_libraries();
    assert!(
        subs.iter()
            .all(|s| PathBuf::from(s).parent() == Some(dir.as_path())),
        "{subs:?} not all in {}",
        dir.display()
    );
    let graph = dir.join("libcudnn_graph.so.9");
    if graph.exists() {
        assert!(
            subs.contains(&graph.display().to_string().as_str()),
            "{subs:?} lacks {}",
            graph.display()
        );
    }
    assert!(format!("{lib:?}").contains("siblings"));
}
