//! Prints the GPU, the CUDA driver, the cuDNN library and its sub-libraries, then runs one
//! operation end to end (NCHW f32 → NHWC f16 transform plus a per-channel bias) and checks it
//! against the CPU.
//!
//!     cargo run --release --example info
//!
//! Exits with status 1 and a message naming what was searched when cuDNN or the GPU is
//! missing (set `CUDNN_SAFE_LIBRARY` to choose the cuDNN library file or directory).
use std::process::ExitCode;

use cudnn_safe::half::f16;
use cudnn_safe::{cuda_context, format_version, versions, Cudnn, TensorDesc};

fn run() -> cudnn_safe::Result<()> {
    let v = versions()?;
    print!("{v}");
    if !v.all_sublibraries_ok() {
        eprintln!("warning: a cuDNN sub-library is missing or mismatched (see above)");
    }

    let ctx = cuda_context(0)?;
    let drv = |e| cudnn_safe::Error::Driver { context: "querying the device", source: e };
    let (major, minor) = ctx.compute_capability().map_err(drv)?;
    let mut driver = 0;
    // SAFETY: the driver library is loaded (the context exists) and `driver` is a valid out-pointer.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    println!(
        "GPU 0: {} (sm_{major}{minor}, {:.1} GiB), CUDA driver {}.{}",
        ctx.name().map_err(drv)?,
        ctx.total_mem().map_err(drv)? as f64 / (1u64 << 30) as f64,
        driver / 1000,
        (driver % 1000) / 10
    );

    let stream = ctx.default_stream();
    let cudnn = Cudnn::new(stream.clone())?;
    println!(
        "cuDNN handle ready (cuDNN {} from {})",
        format_version(cudnn.version()),
        cudnn.library_origin()
    );

    let (n, c, h, w) = (2i64, 3i64, 4i64, 5i64);
    let x_d = TensorDesc::<f32>::nchw(n, c, h, w)?;
    let y_d = TensorDesc::<f16>::nhwc(n, c, h, w)?;
    let b_d = TensorDesc::<f16>::nhwc(1, c, 1, 1)?;
    let host_x: Vec<f32> = (0..x_d.span()).map(|i| (i as f32 * 0.37).sin()).collect();
    let host_b: Vec<f16> = (0..c).map(|i| f16::from_f32(i as f32 - 1.0)).collect();
    let x = stream.clone_htod(&host_x).map_err(drv)?;
    let bias = stream.clone_htod(&host_b).map_err(drv)?;
    let mut y = stream.alloc_zeros::<f16>(y_d.span()).map_err(drv)?;
    cudnn.transform_tensor(1.0, &x_d, &x, 0.0, &y_d, &mut y)?;
    cudnn.add_tensor(1.0, &b_d, &bias, 1.0, &y_d, &mut y)?;
    let out = stream.clone_dtoh(&y).map_err(drv)?;

    let mut max_err = 0f64;
    for ni in 0..n {
        for ci in 0..c {
            for hi in 0..h {
                for wi in 0..w {
                    let src = (((ni * c + ci) * h + hi) * w + wi) as usize;
                    let dst = (((ni * h + hi) * w + wi) * c + ci) as usize;
                    let want = host_x[src] as f64 + host_b[ci as usize].to_f64();
                    max_err = max_err.max((out[dst].to_f64() - want).abs());
                }
            }
        }
    }
    println!("transform NCHW f32 -> NHWC f16 + bias on {n}x{c}x{h}x{w}: max |error| {max_err:.2e}");
    if max_err > 1e-2 {
        return Err(cudnn_safe::Error::InvalidArgument {
            what: "GPU result",
            expected: "max error ≤ 1e-2".into(),
            got: format!("{max_err:e}"),
        });
    }
    println!("ok");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The message, then each cause it does not already show.
            eprintln!("error: {e}");
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                if !e.to_string().contains(&c.to_string()) {
                    eprintln!("  caused by: {c}");
                }
                cause = c.source();
            }
            ExitCode::FAILURE
        }
    }
}
