//! Regenerates `cudnn-sys/src/bindings.rs` from the cuDNN 9 headers.
//!
//! Usage: `cargo run --manifest-path cudnn-sys/gen/Cargo.toml -- <cudnn include dir> <cuda include dir> <output>`
//! (`cudnn-sys/regenerate.sh` downloads the headers and calls this).
//!
//! Choices that the safe crate relies on:
//! - C enums become `#[repr(transparent)]` newtypes over their integer type, so a value a newer
//!   cuDNN returns that these bindings do not list is still a valid Rust value (no UB).
//! - Functions are emitted as a dynamic-loading struct whose fields are
//!   `Result<fn, libloading::Error>`; the loader reads the fields directly, so a missing symbol
//!   is an error value and never reaches bindgen's panicking convenience methods.
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 3 {
        eprintln!("usage: cudnn-safe-sys-gen <cudnn include dir> <cuda include dir> <output .rs>");
        std::process::exit(2);
    }
    let (cudnn_inc, cuda_inc, out) = (&args[0], &args[1], PathBuf::from(&args[2]));
    let bindings = bindgen::Builder::default()
        .header_contents("wrapper.h", "#include <cudnn.h>\n")
        .clang_arg(format!("-I{cudnn_inc}"))
        .clang_arg(format!("-I{cuda_inc}"))
        .allowlist_function("cudnn.*")
        .allowlist_type("cudnn.*")
        .allowlist_var("CUDNN_.*")
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .dynamic_library_name("CudnnLib")
        .dynamic_link_require_all(false)
        .derive_default(true)
        .derive_debug(true)
        .derive_eq(true)
        .derive_hash(true)
        .generate_comments(false)
        .layout_tests(true)
        .merge_extern_blocks(true)
        .generate()
        .expect("bindgen failed");
    bindings.write_to_file(&out).expect("writing the bindings");
    eprintln!("wrote {}", out.display());
}
