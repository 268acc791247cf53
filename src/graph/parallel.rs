//! Plans finalized on several CPU threads at once.
//!
//! Finalizing the plan of an engine that compiles its kernel at run time
//! ([`BehaviorNote::RuntimeCompilation`](super::BehaviorNote::RuntimeCompilation)) takes tens to
//! hundreds of milliseconds, most of it in the compiler. The plans of one search (the candidates
//! of [`OperationGraph::plans`](super::OperationGraph::plans)) and the plans rebuilt from
//! remembered decisions ([`crate::Autotuner::warm_up`]) are independent, and cuDNN finalizes
//! plans of one operation graph with one handle from several threads at once (its frontend's
//! parallel plan build does exactly that), so this crate spreads those plans over
//! [`build_threads`] threads. Plans of precompiled engines finalize in milliseconds and are
//! built one after another on the calling thread.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;
use cudnn_safe_sys as sys;

use crate::error::{Error, Result};
use crate::handle::Cudnn;

/// 0 until [`set_build_threads`] is called.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// The most threads a default of [`build_threads`] uses.
pub const DEFAULT_MAX_BUILD_THREADS: usize = 8;

/// Sets how many CPU threads finalize execution plans at once, process-wide (`1`: one after
/// another, on the calling thread). `0` restores the default (see [`build_threads`]).
///
/// ```
/// cudnn_safe::graph::set_build_threads(4);
/// assert_eq!(cudnn_safe::graph::build_threads(), 4);
/// cudnn_safe::graph::set_build_threads(0);
/// assert!(cudnn_safe::graph::build_threads() >= 1);
/// ```
pub fn set_build_threads(n: usize) {
    THREADS.store(n, Ordering::Relaxed);
}

/// How many CPU threads finalize execution plans at once: the value of [`set_build_threads`],
/// else the environment variable `CUDNN_SAFE_BUILD_THREADS` (a positive integer), else the
/// machine's available parallelism up to [`DEFAULT_MAX_BUILD_THREADS`].
///
/// Plans of engines that compile at run time are built at once where a call needs several: the
/// candidates of one search ([`OperationGraph::plans`](super::OperationGraph::plans), every
/// tuner's search) and the remembered decisions [`crate::Autotuner::warm_up`] rebuilds. Results
/// do not depend on it: the plans come back in the order they were proposed, as one thread
/// would build them.
pub fn build_threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => default_threads(),
        n => n,
    }
}

fn default_threads() -> usize {
    let env = std::env::var("CUDNN_SAFE_BUILD_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0);
    env.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(DEFAULT_MAX_BUILD_THREADS)
    })
}

/// The raw handle, lent to the building threads.
#[derive(Clone, Copy)]
pub(crate) struct SharedHandle(sys::cudnnHandle_t);

// SAFETY: the building threads only set the handle as an execution plan's
// CUDNN_ATTR_EXECUTION_PLAN_HANDLE and finalize that plan; cuDNN supports finalizing plans with one
// handle from several threads at once (its frontend's parallel plan build shares one handle).
// `run` borrows the `Cudnn` for the whole scope, so the handle outlives every thread, and no
// execution or stream call is made with it meanwhile (the owner's thread is inside `run`).
unsafe impl Send for SharedHandle {}
// SAFETY: as above; the pointer is only read.
unsafe impl Sync for SharedHandle {}

impl SharedHandle {
    pub(crate) fn of(cudnn: &Cudnn) -> SharedHandle {
        SharedHandle(cudnn.as_raw())
    }
    pub(crate) fn raw(self) -> sys::cudnnHandle_t {
        self.0
    }
}

/// Runs `build(handle, job)` for every job and returns the results in the jobs' order: the jobs
/// `spread` picks on up to `threads` threads (each with `cudnn`'s CUDA context current), after
/// the others, which run one after another on the calling thread. With one thread, or one job
/// to spread, everything runs on the calling thread. A job whose thread panicked reports an
/// error instead (the panic does not cross into the caller).
pub(crate) fn run<J, R, F>(
    cudnn: &Cudnn,
    jobs: Vec<J>,
    threads: usize,
    spread: impl Fn(&J) -> bool,
    build: F,
) -> Vec<Result<R>>
where
    J: Send,
    R: Send,
    F: Fn(SharedHandle, J) -> Result<R> + Sync,
{
    let handle = SharedHandle::of(cudnn);
    let (mut out, mut spread_jobs) = (Vec::with_capacity(jobs.len()), Vec::new());
    for (i, job) in jobs.into_iter().enumerate() {
        if threads > 1 && spread(&job) {
            spread_jobs.push((i, job));
            out.push(None);
        } else {
            out.push(Some(build(handle, job)));
        }
    }
    let (slots, spread_jobs): (Vec<usize>, Vec<J>) = spread_jobs.into_iter().unzip();
    for (i, r) in slots
        .into_iter()
        .zip(on_threads(cudnn, spread_jobs, threads, &build))
    {
        out[i] = Some(r);
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(panicked())))
        .collect()
}

fn panicked() -> Error {
    Error::invalid("plan build", "a build that returns", "its thread panicked")
}

/// `build` for every job on up to `threads` threads; the results in the jobs' order.
fn on_threads<J, R, F>(cudnn: &Cudnn, jobs: Vec<J>, threads: usize, build: &F) -> Vec<Result<R>>
where
    J: Send,
    R: Send,
    F: Fn(SharedHandle, J) -> Result<R> + Sync,
{
    let handle = SharedHandle::of(cudnn);
    let ctx: &Arc<CudaContext> = cudnn.context();
    let bind = || {
        ctx.bind_to_thread()
            .map_err(|e| Error::driver("binding the CUDA context", e))
    };
    spread(jobs, threads, bind, |j| build(handle, j))
}

/// `build` for every job, on up to `threads` threads that each run `init` first (a job of a
/// thread whose `init` failed gets that error); the results in the jobs' order. With one worker
/// everything runs on the calling thread, without `init`; so do the jobs left when no thread
/// could be started or every worker panicked. A job that panics reports an error.
fn spread<J, R>(
    jobs: Vec<J>,
    threads: usize,
    init: impl Fn() -> Result<()> + Sync,
    build: impl Fn(J) -> Result<R> + Sync,
) -> Vec<Result<R>>
where
    J: Send,
    R: Send,
{
    let workers = threads.min(jobs.len());
    if workers <= 1 {
        return jobs.into_iter().map(build).collect();
    }
    let n = jobs.len();
    let queue: Mutex<VecDeque<(usize, J)>> = Mutex::new(jobs.into_iter().enumerate().collect());
    let done: Mutex<Vec<Option<Result<R>>>> = Mutex::new((0..n).map(|_| None).collect());
    let work = || {
        let ready = init();
        loop {
            let next = queue.lock().map(|mut q| q.pop_front());
            let Ok(Some((i, job))) = next else { break };
            let r = match &ready {
                Ok(()) => build(job),
                Err(e) => Err(Error::invalid(
                    "plan build thread",
                    "a thread ready to build",
                    e,
                )),
            };
            if let Ok(mut d) = done.lock() {
                d[i] = Some(r);
            }
        }
    };
    std::thread::scope(|s| {
        // A thread the system refuses to start is one worker fewer (the calling thread takes
        // what is left below).
        let handles: Vec<_> = (0..workers)
            .filter_map(|_| std::thread::Builder::new().spawn_scoped(s, work).ok())
            .collect();
        for h in handles {
            // A panicking job leaves its slot empty; it is reported below.
            let _ = h.join();
        }
    });
    // Jobs no worker took (none could start, or the last ones panicked): on this thread.
    while let Ok(Some((i, job))) = queue.lock().map(|mut q| q.pop_front()) {
        // As on a worker, a panicking job is reported, not propagated.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| build(job)))
            .unwrap_or_else(|_| Err(panicked()));
        if let Ok(mut d) = done.lock() {
            d[i] = Some(r);
        }
    }
    let done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    done.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(panicked())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn spread_keeps_the_jobs_order_on_many_threads() {
        let jobs: Vec<u64> = (0..64).collect();
        // Later jobs finish first: the order comes from the slots, not from completion.
        let out = spread(
            jobs,
            8,
            || Ok(()),
            |j| {
                std::thread::sleep(Duration::from_micros(200 * (64 - j)));
                Ok(j * 3)
            },
        );
        let got: Vec<u64> = out.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(got, (0..64).map(|j| j * 3).collect::<Vec<_>>());
    }

    #[test]
    fn spread_with_one_worker_runs_on_the_calling_thread() {
        let me = std::thread::current().id();
        let out = spread(
            vec![1, 2, 3],
            1,
            || panic!("init is not run"),
            |j| {
                assert_eq!(std::thread::current().id(), me);
                Ok(j)
            },
        );
        assert_eq!(
            out.into_iter().map(|r| r.unwrap()).collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }

    #[test]
    fn spread_reports_panics_and_failed_init_as_errors() {
        let calls = AtomicUsize::new(0);
        let out = spread(
            (0..16).collect::<Vec<u32>>(),
            4,
            || Ok(()),
            |j| {
                calls.fetch_add(1, Ordering::Relaxed);
                if j == 5 {
                    panic!("job 5 panics");
                }
                Ok(j)
            },
        );
        assert_eq!(out.len(), 16);
        assert!(out[5].is_err());
        for (j, r) in out.iter().enumerate().filter(|(j, _)| *j != 5) {
            // Every other job ran on a surviving thread.
            assert_eq!(*r.as_ref().unwrap(), j as u32);
        }
        assert_eq!(calls.load(Ordering::Relaxed), 16);
        // Every job panicking: each is an error, none reaches the caller.
        let out = spread(
            (0..9).collect::<Vec<u8>>(),
            3,
            || Ok(()),
            |j| -> Result<u8> { panic!("job {j} panics") },
        );
        assert!(out.iter().all(|r| r.is_err()), "{out:?}");
        let inits = AtomicUsize::new(0);
        let out = spread(
            vec![0u8; 6],
            3,
            || match inits.fetch_add(1, Ordering::Relaxed) {
                0 => Err(Error::invalid("init", "ready", "not ready")),
                _ => Ok(()),
            },
            Ok,
        );
        // The jobs of the thread that is not ready fail, naming why; the others run.
        let failed: Vec<_> = out.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(
            failed.iter().all(|e| e.to_string().contains("not ready")),
            "{failed:?}"
        );
        assert_eq!(out.iter().filter(|r| r.is_ok()).count() + failed.len(), 6);
    }
}
