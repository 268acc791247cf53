//! Light on purpose: a default build needs no CUDA and no cuDNN on the machine, because cuDNN
//! is loaded at run time. Only the opt-in `link` feature asks the linker for libcudnn.
//!
//! It also checks that exactly one CUDA version is selected. cudarc compiles before this crate,
//! and with no version it panics in its build script, with two it fails with hundreds of errors
//! about its own bindings; a `compile_error!` in this crate would never be reached. A build
//! script error is reported as soon as this script has run, before cudarc's compilation starts
//! on a fresh build.

/// This crate's CUDA version features: the name and what it selects.
const CUDA_FEATURES: [(&str, &str); 4] = [
    ("cuda-13000", "cudarc's CUDA 13.0 bindings"),
    ("cuda-12080", "cudarc's CUDA 12.8 bindings"),
    ("cuda-12060", "cudarc's CUDA 12.6 bindings"),
    (
        "cuda-version-from-cudarc",
        "no version here: your own cudarc dependency selects it",
    ),
];

fn feature_enabled(name: &str) -> bool {
    let var = format!("CARGO_FEATURE_{}", name.to_uppercase().replace('-', "_"));
    std::env::var_os(var).is_some()
}

/// One error line for Cargo (several `cargo::error` lines would each read as an error).
fn cuda_selection_error() -> Option<String> {
    let on: Vec<&str> = CUDA_FEATURES
        .iter()
        .map(|(name, _)| *name)
        .filter(|n| feature_enabled(n))
        .collect();
    let how =
        "in Cargo.toml keep the default (`cudnn-safe = \"0.1\"`, CUDA 13) or turn it off and \
               pick one: `cudnn-safe = { version = \"0.1\", default-features = false, features = \
               [\"cuda-12080\"] }` (CUDA 12.8; also cuda-12060, or cuda-version-from-cudarc when \
               your own cudarc dependency names the version)";
    match on.as_slice() {
        [] => Some(format!(
            "no CUDA version selected (default features are off and none of {} is \
             on); {how}",
            CUDA_FEATURES.map(|(n, _)| n).join(", ")
        )),
        [one] => {
            let env = std::env::var("CUDARC_CUDA_VERSION").ok();
            match env {
                Some(v)
                    if *one != "cuda-version-from-cudarc"
                        && Some(v.as_str()) != one.strip_prefix("cuda-") =>
                {
                    Some(format!(
                        "CUDARC_CUDA_VERSION={v} is set and the feature {one} selects \
                     {}; cudarc would then compile two versions' bindings. Unset \
                     CUDARC_CUDA_VERSION, or use `default-features = false, features = \
                     [\"cuda-version-from-cudarc\"]`",
                        CUDA_FEATURES
                            .iter()
                            .find(|(n, _)| n == one)
                            .map_or("", |(_, d)| d)
                    ))
                }
                _ => None,
            }
        }
        several => Some(format!(
            "the features {} are on together, but cudarc binds one CUDA version only (the \
             default feature cuda-13000 stays on unless `default-features = false`); {how}",
            several.join(" and ")
        )),
    }
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=CUDNN_SAFE_LIB_DIR");
    println!("cargo::rerun-if-env-changed=CUDARC_CUDA_VERSION");
    println!("cargo::rustc-check-cfg=cfg(cudnn_safe_linked)");
    if let Some(msg) = cuda_selection_error() {
        println!("cargo::error={msg}");
        return;
    }
    if std::env::var_os("CARGO_FEATURE_LINK").is_some() {
        if let Some(dir) = std::env::var_os("CUDNN_SAFE_LIB_DIR") {
            println!("cargo::rustc-link-search=native={}", dir.to_string_lossy());
        }
        println!("cargo::rustc-link-lib=dylib=cudnn");
        println!("cargo::rustc-cfg=cudnn_safe_linked");
    }
}
