//! CUDA-event timing: the one measuring loop behind every tuner (the convolution union search,
//! graph plan autotuning, cuBLASLt). Launches run back to back between two events recorded on
//! the handle's stream; a warm-up launch loads the kernel, a probe sizes the rounds, and a round
//! lasts at least a target time so that short kernels are timed over many launches.
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaStream;

use crate::error::{Error, Result};

/// Timing of candidates, for graph plans and legacy algorithms alike: one warm-up launch
/// (kernel loading, variant pack), a probe of [`PROBE`] launches, then the best of [`ROUNDS`]
/// rounds of back-to-back launches, as many per round as make it last at least [`TARGET_MS`]
/// by the probe (between 1 and [`MAX_ITERATIONS`]): a 0.02 ms kernel is timed over 15 or 16
/// launches per round, a 5 ms kernel over 1.
pub(crate) const ROUNDS: usize = 3;
/// Launches of the probe.
pub(crate) const PROBE: usize = 2;
/// Least duration of one timed round, in ms.
pub(crate) const TARGET_MS: f32 = 0.3;
/// Most launches per round.
pub(crate) const MAX_ITERATIONS: usize = 100;
/// A candidate whose probe is this many times slower than the best time so far is not timed
/// further (its probe is its time): it cannot win, and 48 candidates must stay quick to search.
pub(crate) const HOPELESS: f32 = 1.5;

/// Launches per round for a probe of `probe_ms` per launch.
#[cfg(test)]
pub(crate) fn iterations(probe_ms: f32) -> usize {
    iterations_for(probe_ms, TARGET_MS)
}

/// Launches per round of at least `target_ms` for a probe of `probe_ms` per launch.
fn iterations_for(probe_ms: f32, target_ms: f32) -> usize {
    iterations_within(probe_ms, target_ms, MAX_ITERATIONS)
}

/// Launches per round of at least `target_ms` for a probe of `probe_ms` per launch, between 1
/// and `max` (`max` when the probe measured nothing).
fn iterations_within(probe_ms: f32, target_ms: f32, max: usize) -> usize {
    if probe_ms.is_nan() || probe_ms <= 0.0 {
        return max;
    }
    ((target_ms / probe_ms).ceil() as usize).clamp(1, max)
}

/// Milliseconds per launch of `launch`, timed with CUDA events on `stream` (see
/// [`ROUNDS`]). `best` is the best time of the candidates timed before, if any.
pub(crate) fn time_ms(
    stream: &CudaStream,
    best: Option<f32>,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    batch_ms(stream, 1, &mut launch)?;
    let probe = batch_ms(stream, PROBE, &mut launch)?;
    if best.is_some_and(|b| probe > b * HOPELESS) {
        return Ok(probe);
    }
    let n = iterations_for(probe, TARGET_MS);
    fastest_round(stream, ROUNDS, n, &mut launch)
}

/// Milliseconds per launch of the fastest of `rounds` rounds (at least 1) of `n` back-to-back
/// launches each.
pub(crate) fn fastest_round(
    stream: &CudaStream,
    rounds: usize,
    n: usize,
    launch: &mut impl FnMut() -> Result<()>,
) -> Result<f32> {
    let mut fastest = f32::INFINITY;
    for _ in 0..rounds.max(1) {
        fastest = fastest.min(batch_ms(stream, n, launch)?);
    }
    Ok(fastest)
}

/// Milliseconds per launch of one batch sized by a timed launch to last about `target_ms`,
/// between `min` and `max` launches (a launch timed under a microsecond counts as one).
pub(crate) fn sized_batch_ms(
    stream: &CudaStream,
    target_ms: f32,
    (min, max): (usize, usize),
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    let once = batch_ms(stream, 1, &mut launch)?;
    let n = ((target_ms / once.max(1e-3)) as usize).clamp(min, max);
    batch_ms(stream, n, &mut launch)
}

/// Milliseconds per launch of `n` back-to-back launches, between two CUDA events on
/// `stream`.
fn batch_ms(stream: &CudaStream, n: usize, launch: &mut impl FnMut() -> Result<()>) -> Result<f32> {
    crate::capture::refuse_during_capture(
        stream,
        "timing candidates (a tuner's first decision for this problem)",
    )?;
    let event = || {
        stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| Error::driver("recording a timing event", e))
    };
    let start = event()?;
    for _ in 0..n {
        launch()?;
    }
    let end = event()?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(|e| Error::driver("timing a candidate", e))?;
    Ok(ms / n.max(1) as f32)
}

/// Median of `times` (the upper one of an even count); `None` when empty.
pub(crate) fn median(times: &[f32]) -> Option<f32> {
    let mut v = times.to_vec();
    v.sort_by(f32::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Most launches per round of [`sustained_ms`] (a 0.01 ms kernel fills a 5 ms round).
const SUSTAINED_MAX_LAUNCHES: usize = 2000;

/// Milliseconds per launch of `launch` running alone under sustained load, as a training loop
/// or a benchmark that repeats one layer sees it: after a warm-up launch and a probe, `launch`
/// runs back to back for `solo_ms` of wall clock ([`heat`]), then `rounds` rounds of at least
/// `target_ms` each are timed; the median round.
///
/// Why alone: a GPU at its power limit lowers its clocks by the power the running kernels
/// draw, so a plan that draws more runs slower once it has run for a while. Short rounds
/// interleaved between candidates time them all at the clocks the mix of them set; only a
/// candidate that runs alone for some milliseconds shows its own sustained speed (plans that
/// interleaved rounds cannot order can separate once each runs alone).
pub(crate) fn sustained_ms(
    stream: &CudaStream,
    solo_ms: f32,
    rounds: usize,
    target_ms: f32,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    batch_ms(stream, 1, &mut launch)?;
    let probe = batch_ms(stream, PROBE, &mut launch)?;
    heat(stream, solo_ms, probe, &mut launch)?;
    let n = iterations_within(probe, target_ms, SUSTAINED_MAX_LAUNCHES);
    let mut times = Vec::with_capacity(rounds.max(1));
    for _ in 0..rounds.max(1) {
        times.push(batch_ms(stream, n, &mut launch)?);
    }
    Ok(median(&times).unwrap_or(f32::NAN))
}

/// Runs `launch` back to back for about `heat_ms` of wall clock (at least one batch; none,
/// returning NaN, when `heat_ms` is not positive), in
/// batches of about [`HEAT_BATCH_MS`] by `per_launch_ms` (sized by a first launch, before the
/// batches, when that is not positive; each timed with CUDA events and
/// synchronized, so the clock measures the GPU's work rather than the enqueueing). A GPU that
/// has been idle runs its first ~0.2 s of load at higher clocks than it settles to; candidates
/// timed after this run are timed in the state a busy program sees. Returns the milliseconds
/// per launch of the last batch (a rough time: no warm-up launch, one batch).
pub(crate) fn heat(
    stream: &CudaStream,
    heat_ms: f32,
    per_launch_ms: f32,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f32> {
    if heat_ms.is_nan() || heat_ms <= 0.0 {
        return Ok(f32::NAN);
    }
    let started = std::time::Instant::now();
    let done = || started.elapsed().as_secs_f32() * 1e3 >= heat_ms;
    let per_launch_ms = if per_launch_ms > 0.0 {
        per_launch_ms
    } else {
        // No estimate: one launch (which may load the kernel: not the time returned) sizes
        // the batches.
        batch_ms(stream, 1, &mut launch)?
    };
    let batch = iterations_for(per_launch_ms, HEAT_BATCH_MS).max(1);
    loop {
        let ms = batch_ms(stream, batch, &mut launch)?;
        if done() {
            return Ok(ms);
        }
    }
}

/// GPU time of one batch of [`heat`], in ms.
pub(crate) const HEAT_BATCH_MS: f32 = 5.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sustained_rounds_keep_their_median() {
        // One fast outlier (a round timed before the clocks settled) does not decide.
        assert_eq!(median(&[0.19, 0.166, 0.19, 0.188, 0.191]), Some(0.19));
        assert_eq!(median(&[2.0, 1.0]), Some(2.0));
        assert_eq!(median(&[0.5]), Some(0.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn iterations_time_every_round_over_the_target() {
        // 0.3 / 0.02 rounds to just above 15 in f32.
        assert!((15..=16).contains(&iterations(0.02)));
        assert!(iterations(0.02) as f32 * 0.02 >= TARGET_MS - 1e-6);
        assert_eq!(iterations(5.0), 1);
        assert_eq!(iterations(1e-6), MAX_ITERATIONS);
        assert_eq!(iterations(0.0), MAX_ITERATIONS);
        assert_eq!(iterations(f32::NAN), MAX_ITERATIONS);
        assert!((3..=4).contains(&iterations(0.1)));
        assert_eq!(iterations(f32::INFINITY), 1);
    }
}
