//! Launch checks and pointer helpers shared by several layer families (convolution,
//! normalization, reduction, RNN, and the legacy element-wise, pooling and softmax calls), kept
//! in one place so every family refuses the same inputs with the same errors.
//!
//! cuDNN's legacy calls end with one of two argument runs: `alpha, x_desc, x, beta, y_desc, y`
//! (`y = alpha·op(x) + beta·y`: [`XyArgs`]) or `alpha, y_desc, y, dy_desc, dy, x_desc, x, beta,
//! dx_desc, dx` (a gradient: [`GradArgs`]). [`Cudnn::xy_args`] and [`Cudnn::grad_args`] run the
//! buffer checks of such a call, bind the handle and take the device addresses, in that order,
//! so nothing is enqueued before every check passed; [`call_xy!`] and [`call_grad!`] pass the
//! run to the C function. Everything is inlined: no allocation or lock per launch.
use std::ffi::c_void;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use cudnn_safe_sys as sys;

use crate::buffer::{DeviceBuffer, DeviceBufferMut};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::handle::Cudnn;
use crate::tensor::TensorDesc;
use crate::workspace::{Workspace, MAX_WORKSPACE_BYTES};

/// `alpha` or `beta` as the untyped pointer cuDNN's legacy calls take.
pub(crate) fn scalar_ptr<S>(s: &S) -> *const c_void {
    (s as *const S).cast()
}

/// The checked argument run `alpha, x_desc, x, beta, y_desc, y` of a legacy
/// `y = alpha·op(x) + beta·y` call; the guards keep both buffers alive and ordered on the
/// handle's stream until it is dropped, after the call is enqueued.
pub(crate) struct XyArgs<'a> {
    pub(crate) alpha: *const c_void,
    pub(crate) x_desc: sys::cudnnTensorDescriptor_t,
    pub(crate) x: *const c_void,
    pub(crate) beta: *const c_void,
    pub(crate) y_desc: sys::cudnnTensorDescriptor_t,
    pub(crate) y: *mut c_void,
    _guards: [Option<SyncOnDrop<'a>>; 2],
}

/// The checked argument run `alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx` of a
/// legacy backward call (in place, `dy` and `dx` are one buffer); the guards keep the buffers
/// alive and ordered until it is dropped.
pub(crate) struct GradArgs<'a> {
    pub(crate) alpha: *const c_void,
    pub(crate) y_desc: sys::cudnnTensorDescriptor_t,
    pub(crate) y: *const c_void,
    pub(crate) dy_desc: sys::cudnnTensorDescriptor_t,
    pub(crate) dy: *const c_void,
    pub(crate) x_desc: sys::cudnnTensorDescriptor_t,
    pub(crate) x: *const c_void,
    pub(crate) beta: *const c_void,
    pub(crate) dx_desc: sys::cudnnTensorDescriptor_t,
    pub(crate) dx: *mut c_void,
    _guards: [Option<SyncOnDrop<'a>>; 4],
}

/// A tensor argument: its name in errors, descriptor and buffer.
pub(crate) type Arg<'a, T, B> = (&'static str, &'a TensorDesc<T>, &'a B);
/// An output tensor argument.
pub(crate) type ArgMut<'a, T, B> = (&'static str, &'a TensorDesc<T>, &'a mut B);

/// The unused `dy` buffer type of a [`Grad::InPlace`].
pub(crate) type NoBuffer<T> = cudarc::driver::CudaSlice<T>;

/// The gradient being written: `dy` read and `dx` written, or one buffer holding `dy` on entry
/// and `dx` on return.
pub(crate) enum Grad<'a, T: DataType, Dy, Dx> {
    /// Separate `dy` (read) and `dx` (written).
    Apart(Arg<'a, T, Dy>, ArgMut<'a, T, Dx>),
    /// `dy` and `dx` in one buffer with one descriptor.
    InPlace(ArgMut<'a, T, Dx>),
}

/// `$f(lib, handle, lead..., alpha, x_desc, x, beta, y_desc, y)` with the run of an
/// [`XyArgs`]; used inside the caller's `unsafe` block, whose `SAFETY` comment covers it.
macro_rules! call_xy {
    ($f:path, $cudnn:expr, [$($lead:expr),*], $a:expr) => {
        $f(
            $cudnn.lib(), $cudnn.as_raw(), $($lead,)*
            $a.alpha, $a.x_desc, $a.x, $a.beta, $a.y_desc, $a.y,
        )
    };
}
pub(crate) use call_xy;

/// `$f(lib, handle, lead..., alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx)` with
/// the run of a [`GradArgs`]; used inside the caller's `unsafe` block.
macro_rules! call_grad {
    ($f:path, $cudnn:expr, [$($lead:expr),*], $a:expr) => {
        $f(
            $cudnn.lib(), $cudnn.as_raw(), $($lead,)*
            $a.alpha, $a.y_desc, $a.y, $a.dy_desc, $a.dy, $a.x_desc, $a.x, $a.beta, $a.dx_desc,
            $a.dx,
        )
    };
}
pub(crate) use call_grad;

impl Cudnn {
    /// Checks that `ws` lives on this handle's context: its memory would be a wild pointer for
    /// a kernel launched on another one.
    pub(crate) fn check_workspace_context(&self, ws: &Workspace) -> Result<()> {
        let ctx = ws.stream().context();
        if **ctx != **self.context() {
            return Err(Error::ForeignContext {
                name: "workspace",
                expected: self.context().ordinal(),
                found: ctx.ordinal(),
            });
        }
        Ok(())
    }

    /// A workspace size from the handle's memo under `key`, or asked of cuDNN through `query`
    /// and remembered; an absurd answer (over [`MAX_WORKSPACE_BYTES`]) is refused, not memoised.
    pub(crate) fn memo_bytes(
        &self,
        key: [u64; 5],
        query: impl FnOnce(&mut usize) -> Result<()>,
    ) -> Result<usize> {
        if let Some(b) = self.ws_memo().borrow().get(&key) {
            return Ok(b);
        }
        let mut bytes = 0usize;
        query(&mut bytes)?;
        if bytes > MAX_WORKSPACE_BYTES {
            return Err(Error::WorkspaceLimit {
                requested: bytes,
                limit: MAX_WORKSPACE_BYTES,
            });
        }
        self.ws_memo().borrow_mut().put(key, bytes);
        Ok(bytes)
    }
}

impl Cudnn {
    /// Checks input `x` and output `y` (each holding its descriptor's span on the handle's
    /// context, `y` not overlapping itself), binds the handle, and returns the argument run of
    /// `y = alpha·op(x) + beta·y`. Shape rules are the caller's, checked before.
    pub(crate) fn xy_args<'a, X: DataType, Y: DataType, S>(
        &'a self,
        alpha: &'a S,
        (x_name, x_desc, x): Arg<'a, X, impl DeviceBuffer<X>>,
        beta: &'a S,
        (y_name, y_desc, y): ArgMut<'a, Y, impl DeviceBufferMut<Y>>,
    ) -> Result<XyArgs<'a>> {
        self.check_tensor(x_name, x_desc.layout(), x, false)?;
        self.check_tensor(y_name, y_desc.layout(), y, true)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (xp, gx) = x.device_ptr(stream);
        let (yp, gy) = y.device_ptr_mut(stream);
        Ok(XyArgs {
            alpha: scalar_ptr(alpha),
            x_desc: x_desc.as_raw(),
            x: xp as *const c_void,
            beta: scalar_ptr(beta),
            y_desc: y_desc.as_raw(),
            y: yp as *mut c_void,
            _guards: [Some(gx), Some(gy)],
        })
    }

    /// Checks output `y` (its span on the handle's context, not overlapping itself), binds the
    /// handle and returns its device address with the stream-ordering guard: the one-tensor
    /// calls (`cudnnSetTensor`, `cudnnScaleTensor`).
    pub(crate) fn y_arg<'a, T: DataType>(
        &'a self,
        (name, desc, y): ArgMut<'a, T, impl DeviceBufferMut<T>>,
    ) -> Result<(*mut c_void, SyncOnDrop<'a>)> {
        self.check_tensor(name, desc.layout(), y, true)?;
        self.bind()?;
        let (p, g) = y.device_ptr_mut(self.stream());
        Ok((p as *mut c_void, g))
    }

    /// [`xy_args`](Self::xy_args) for an in-place call: `xy` (checked as an output) is both
    /// `x` and `y`, with one descriptor.
    pub(crate) fn xy_args_in_place<'a, T: DataType, S>(
        &'a self,
        alpha: &'a S,
        beta: &'a S,
        (name, desc, xy): ArgMut<'a, T, impl DeviceBufferMut<T>>,
    ) -> Result<XyArgs<'a>> {
        self.check_tensor(name, desc.layout(), xy, true)?;
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (p, g) = xy.device_ptr_mut(stream);
        Ok(XyArgs {
            alpha: scalar_ptr(alpha),
            x_desc: desc.as_raw(),
            x: p as *const c_void,
            beta: scalar_ptr(beta),
            y_desc: desc.as_raw(),
            y: p as *mut c_void,
            _guards: [Some(g), None],
        })
    }

    /// Checks the buffers of a backward call (`y`, `dy`, `x` read, `dx` written; in place, one
    /// buffer for `dy` and `dx`, checked as an output), binds the handle, and returns the
    /// argument run. Shape and stride rules are the caller's, checked before.
    #[allow(clippy::type_complexity)] // the four tensor arguments
    pub(crate) fn grad_args<'a, T: DataType, S, Dy: DeviceBuffer<T>, Dx: DeviceBufferMut<T>>(
        &'a self,
        alpha: &'a S,
        (y_name, y_desc, y): Arg<'a, T, impl DeviceBuffer<T>>,
        (x_name, x_desc, x): Arg<'a, T, impl DeviceBuffer<T>>,
        beta: &'a S,
        grad: Grad<'a, T, Dy, Dx>,
    ) -> Result<GradArgs<'a>> {
        self.check_tensor(y_name, y_desc.layout(), y, false)?;
        match &grad {
            Grad::Apart((dy_name, dy_desc, dy), (dx_name, dx_desc, dx)) => {
                self.check_tensor(dy_name, dy_desc.layout(), *dy, false)?;
                self.check_tensor(x_name, x_desc.layout(), x, false)?;
                self.check_tensor(dx_name, dx_desc.layout(), &**dx, true)?;
            }
            Grad::InPlace((name, desc, buf)) => {
                self.check_tensor(x_name, x_desc.layout(), x, false)?;
                self.check_tensor(name, desc.layout(), &**buf, true)?;
            }
        }
        self.bind()?;
        let stream: &CudaStream = self.stream();
        let (yp, gy) = y.device_ptr(stream);
        let (xp, gx) = x.device_ptr(stream);
        let (dy_desc, dyp, gdy, dx_desc, dxp, gdx) = match grad {
            Grad::Apart((_, dy_desc, dy), (_, dx_desc, dx)) => {
                let (dyp, gdy) = dy.device_ptr(stream);
                let (dxp, gdx) = dx.device_ptr_mut(stream);
                (dy_desc, dyp, Some(gdy), dx_desc, dxp, gdx)
            }
            Grad::InPlace((_, desc, buf)) => {
                let (p, g) = buf.device_ptr_mut(stream);
                (desc, p, None, desc, p, g)
            }
        };
        Ok(GradArgs {
            alpha: scalar_ptr(alpha),
            y_desc: y_desc.as_raw(),
            y: yp as *const c_void,
            dy_desc: dy_desc.as_raw(),
            dy: dyp as *const c_void,
            x_desc: x_desc.as_raw(),
            x: xp as *const c_void,
            beta: scalar_ptr(beta),
            dx_desc: dx_desc.as_raw(),
            dx: dxp as *mut c_void,
            _guards: [Some(gy), Some(gx), gdy, Some(gdx)],
        })
    }
}

/// Errors with [`Error::ShapeMismatch`] between `a` and `b`, stating `rule`, unless `ok`.
pub(crate) fn require_shapes(
    ok: bool,
    (a, a_dims): (&'static str, &[i64]),
    (b, b_dims): (&'static str, &[i64]),
    rule: &'static str,
) -> Result<()> {
    if ok {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        a,
        a_dims: a_dims.to_vec(),
        b,
        b_dims: b_dims.to_vec(),
        rule,
    })
}

/// Whether `small` has `big`'s rank and each of its dimensions is `big`'s or 1: cuDNN's
/// broadcast rule (and, read the other way, its reduction rule).
pub(crate) fn broadcasts_to(small: &[i64], big: &[i64]) -> bool {
    small.len() == big.len() && small.iter().zip(big).all(|(&s, &b)| s == b || s == 1)
}

/// The device address of an optional input (null when absent) and its stream-ordering guard.
pub(crate) fn opt_ptr<'a, T, B: DevicePtr<T>>(
    buf: Option<&'a B>,
    stream: &'a CudaStream,
) -> (*const c_void, Option<SyncOnDrop<'a>>) {
    match buf {
        Some(b) => {
            let (p, g) = b.device_ptr(stream);
            (p as *const c_void, Some(g))
        }
        None => (std::ptr::null(), None),
    }
}

/// The device address of an optional output (null when absent) and its stream-ordering guard.
pub(crate) fn opt_ptr_mut<'a, T, B: DevicePtrMut<T>>(
    buf: Option<&'a mut B>,
    stream: &'a CudaStream,
) -> (*mut c_void, Option<SyncOnDrop<'a>>) {
    match buf {
        Some(b) => {
            let (p, g) = b.device_ptr_mut(stream);
            (p as *mut c_void, Some(g))
        }
        None => (std::ptr::null_mut(), None),
    }
}

/// For unit tests that need the real library but no GPU: the library loaded, or `None` (test
/// skipped, with a line saying why) where cuDNN cannot be loaded; with
/// `CUDNN_SAFE_REQUIRE_LIBRARY=1` a missing library fails the test instead.
#[cfg(test)]
pub(crate) fn lib_or_skip() -> Option<()> {
    match crate::raw::lib() {
        Ok(_) => Some(()),
        Err(e) if std::env::var("CUDNN_SAFE_REQUIRE_LIBRARY").as_deref() == Ok("1") => {
            panic!("CUDNN_SAFE_REQUIRE_LIBRARY=1 but cuDNN did not load: {e}")
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rule() {
        assert!(broadcasts_to(&[1, 3, 1, 1], &[2, 3, 4, 5]));
        assert!(broadcasts_to(&[2, 3, 4, 5], &[2, 3, 4, 5]));
        assert!(broadcasts_to(&[1, 1, 1], &[7, 8, 9]));
        assert!(
            !broadcasts_to(&[1, 2, 1, 1], &[2, 3, 4, 5]),
            "2 is neither 3 nor 1"
        );
        assert!(!broadcasts_to(&[1, 3, 1], &[2, 3, 4, 5]), "another rank");
        assert!(
            !broadcasts_to(&[2, 3, 4, 6], &[2, 3, 4, 5]),
            "larger than the target"
        );
    }

    #[test]
    fn shape_errors_name_both_tensors_and_the_rule() {
        assert!(require_shapes(true, ("a", &[1]), ("c", &[2]), "rule").is_ok());
        let e = require_shapes(false, ("b", &[1, 2]), ("c", &[3, 4]), "the rule").unwrap_err();
        assert!(
            matches!(
                &e,
                Error::ShapeMismatch { a: "b", a_dims, b: "c", b_dims, rule: "the rule" }
                    if a_dims == &[1, 2] && b_dims == &[3, 4]
            ),
            "{e:?}"
        );
    }
}
