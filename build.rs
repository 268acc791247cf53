//! Light on purpose: a default build needs no CUDA and no cuDNN on the machine, because cuDNN
//! is loaded at run time. Only the opt-in `link` feature asks the linker for libcudnn.
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=CUDNN_SAFE_LIB_DIR");
    println!("cargo::rustc-check-cfg=cfg(cudnn_safe_linked)");
    if std::env::var_os("CARGO_FEATURE_LINK").is_some() {
        if let Some(dir) = std::env::var_os("CUDNN_SAFE_LIB_DIR") {
            println!("cargo::rustc-link-search=native={}", dir.to_string_lossy());
        }
        println!("cargo::rustc-link-lib=dylib=cudnn");
        println!("cargo::rustc-cfg=cudnn_safe_linked");
    }
}
