//! The tuner of [`BlasLt`]: the policy, what a call ran ([`Choice`], [`Source`],
//! [`Candidate`]), the counters, the decision cache with its file, and the timing of candidates.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaStream, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use super::desc::{Alignments, Descs};
use super::fp8::Fp8Kind;
use super::launch::{algo_id, alignment_of, launch, Call, Ptrs};
use super::matmul::dtype_code;
use super::{BlasLt, Matmul};
use crate::blas::require_cublaslt;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::timing;
use crate::tune::{self, Format};

/// The element types of one call, as the cache keys them and the logs name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Label {
    /// A, B, C and D of one type ([`BlasLt::matmul`]).
    Uniform(DType),
    /// FP8 A and B, D of type `d` ([`BlasLt::matmul_fp8`]), with or without fast accumulation.
    Fp8 {
        a: Fp8Kind,
        b: Fp8Kind,
        d: DType,
        fast_accum: bool,
    },
}

impl Label {
    /// The key's type code: the data type's for [`Label::Uniform`] (the codes of cache files
    /// written before FP8), a code above 100 000 for FP8.
    pub(super) fn code(self) -> i64 {
        match self {
            Label::Uniform(d) => dtype_code(d),
            Label::Fp8 {
                a,
                b,
                d,
                fast_accum,
            } => {
                100_000
                    + 10_000 * a.code()
                    + 1_000 * b.code()
                    + 10 * dtype_code(d)
                    + i64::from(fast_accum)
            }
        }
    }
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Label::Uniform(d) => write!(f, "{d}"),
            Label::Fp8 {
                a,
                b,
                d,
                fast_accum,
            } => write!(
                f,
                "{a:?}×{b:?}→{d}{}",
                if *fast_accum {
                    " (fast accumulation)"
                } else {
                    ""
                }
            ),
        }
    }
}

/// Device time an autotune spends timing one candidate (after one warm-up launch), in ms.
pub(super) const AUTOTUNE_BATCH_MS: f32 = 2.0;
/// Interleaved timing rounds per autotune (each candidate's median is used).
pub(super) const AUTOTUNE_ROUNDS: usize = 3;
/// Another candidate replaces the heuristic's first only when at least 2 % faster.
pub(super) const AUTOTUNE_MARGIN: f32 = 0.98;

/// The cuBLASLt decisions' cache file (the format every tuner shares).
pub(super) const FORMAT: Format = Format {
    kind: "cublaslt",
    columns: "device<TAB>problem<TAB>algo:workspace:index:waves:ms,...<TAB>checksum",
};

/// Version of the problem-key layout (first element of every key), so that a changed layout
/// never matches old file entries.
pub(super) const KEY_FORMAT: i64 = 1;

/// How [`BlasLt`] picks an algorithm for a problem it has not seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// cuBLASLt's first heuristic choice (`cublasLtMatmulAlgoGetHeuristic`), as PyTorch does.
    #[default]
    Heuristic,
    /// Time the top heuristic candidates on the call's buffers and keep the fastest.
    Benchmark,
}

impl Policy {
    /// `"heuristic"` or `"benchmark"`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Heuristic => "heuristic",
            Policy::Benchmark => "benchmark",
        }
    }
    pub(super) fn code(self) -> i64 {
        match self {
            Policy::Heuristic => 0,
            Policy::Benchmark => 1,
        }
    }
}

/// One algorithm cuBLASLt proposed for a problem (`cublasLtMatmulHeuristicResult_t`).
///
/// It can only come from this crate (one field is private), and it stays tied to the problem
/// (shape, transposes, dtype, compute type, epilogue) it was found for:
/// [`BlasLt::matmul_with_candidate`] refuses it for any other.
#[derive(Debug, Clone, PartialEq)]
#[doc(alias = "cublasLtMatmulHeuristicResult_t")]
pub struct Candidate {
    /// Position in cuBLASLt's heuristic ranking (0 = its first choice).
    pub index: usize,
    /// Workspace bytes the algorithm needs.
    pub workspace: usize,
    /// cuBLASLt's `wavesCount` estimate (≤ 0 when it gave none).
    pub waves_count: f32,
    /// Measured ms per call ([`Policy::Benchmark`]), `None` otherwise.
    pub time_ms: Option<f32>,
    /// `CUBLASLT_ALGO_CONFIG_ID` of the algorithm (−1 if cuBLASLt did not report it).
    pub algo_id: i32,
    pub(super) algo: [u64; 8],
    pub(super) shape: [i64; 8],
    pub(super) alignment: Alignments,
}

impl Candidate {
    /// The smallest pointer alignment (bytes) the candidate was chosen for. Each pointer it runs
    /// on must be at least as aligned as the one it was chosen for (A, B, D, bias, aux).
    pub fn alignment(&self) -> u32 {
        self.alignment.min()
    }
}

/// Where the algorithm of a [`BlasLt`] call came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// cuBLASLt's heuristic, queried by this call.
    Heuristic,
    /// A benchmark (candidates timed) run by this call.
    Benchmark,
    /// The handle's cache (decided earlier in the process, or read from the cache file).
    Cache,
    /// The caller's [`Candidate`].
    Explicit,
}

/// What a [`BlasLt`] call ran.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The algorithm.
    pub candidate: Candidate,
    /// Where it came from.
    pub source: Source,
    /// Its position in the decided ranking (0 unless earlier ones were refused at launch).
    pub rank: usize,
}

/// Counters of a [`BlasLt`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Calls served from the cache.
    pub hits: u64,
    /// Decisions made (heuristic or benchmark).
    pub misses: u64,
    /// Benchmarks run (candidates timed on the call's buffers).
    pub benchmarks: u64,
    /// Times a later candidate ran because an earlier one was refused at launch.
    pub fallbacks: u64,
}

/// A ranked algorithm as the cache keeps it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Ranked {
    pub(super) algo: [u64; 8],
    pub(super) workspace: usize,
    pub(super) index: usize,
    pub(super) waves: f32,
    /// ms per call, negative when not measured.
    pub(super) ms: f32,
    pub(super) algo_id: i32,
}

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) ranked: Vec<Ranked>,
    /// Checked with `cublasLtMatmulAlgoCheck` in this process (file entries start unchecked).
    pub(super) verified: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub(super) device: Arc<str>,
    pub(super) problem: Vec<i64>,
}

impl BlasLt {
    /// Persists decisions to `path` (read now if it exists; rewritten, merged with what another
    /// process wrote meanwhile, after each new decision), in the cache-file format every tuner
    /// shares ([`crate::tune`]). Lines that do not parse or whose checksum does not match are
    /// skipped with a warning, a file of another format whole; entries of other GPUs or
    /// cuBLASLt versions are kept in the file but never used here.
    /// An algorithm read from the file is checked with `cublasLtMatmulAlgoCheck` before its first
    /// use. The file is this crate's own: the stored algorithms are cuBLASLt's opaque 64-byte
    /// descriptors, valid only for the same GPU model and cuBLASLt version (both in the key).
    ///
    /// A file that exists but cannot be read is logged and left alone: the tuner starts without
    /// its entries and [`save`](Self::save) reports the error ([`Error::Io`])
    /// instead of overwriting it. [`try_cache_file`](Self::try_cache_file) returns that error at
    /// once.
    #[must_use]
    pub fn cache_file(self, path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let loaded = tune::or_empty("cuBLASLt autotune", load_file(&path));
        self.with_loaded(path, loaded)
    }

    /// [`cache_file`](Self::cache_file), returning [`Error::Io`] (with the path and the
    /// operating system's error) when the file exists but cannot be read: not a regular file,
    /// no permission, or larger than 64 MiB. A missing file is an empty cache.
    pub fn try_cache_file(self, path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let loaded = load_file(&path)?;
        Ok(self.with_loaded(path, loaded))
    }

    pub(super) fn with_loaded(mut self, path: PathBuf, loaded: HashMap<Key, Vec<Ranked>>) -> Self {
        log::info!(
            "cuBLASLt autotune cache {}: {} entries loaded",
            path.display(),
            loaded.len()
        );
        for (k, ranked) in loaded {
            // Decisions already made in this process win over the file's.
            self.cache.entry(k).or_insert(Entry {
                ranked,
                verified: false,
            });
        }
        self.path = Some(path);
        self
    }

    /// Keeps decisions in memory only, forgetting the cache file and what was read from it.
    #[must_use]
    pub fn without_cache_file(mut self) -> Self {
        if self.path.take().is_some() {
            self.cache.clear();
        }
        self
    }
    pub(super) fn device(&mut self) -> Arc<str> {
        if let Some(d) = &self.device {
            return d.clone();
        }
        let library = format!("cublasLt{}", self.version);
        let fp: Arc<str> = tune::device_name(self.stream.context(), &library).into();
        self.device = Some(fp.clone());
        fp
    }

    pub(super) fn key(&mut self, shape: [i64; 8], align: &Alignments) -> Key {
        let mut problem = Vec::with_capacity(18);
        problem.push(KEY_FORMAT);
        problem.extend_from_slice(&shape);
        problem.extend(
            [align.a, align.b, align.d, align.bias, align.aux]
                .iter()
                .map(|&v| i64::from(v)),
        );
        problem.push(i64::try_from(self.workspace.limit()).unwrap_or(i64::MAX));
        problem.push(self.policy.code());
        // The candidate count only matters to an autotune.
        problem.push(match self.policy {
            Policy::Heuristic => 0,
            Policy::Benchmark => self.top_n as i64,
        });
        Key {
            device: self.device(),
            problem,
        }
    }

    /// The ranking for a call: from the cache, or decided now under the policy (and cached).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide<D: DeviceRepr + ValidAsZeroBits>(
        &mut self,
        label: Label,
        op: &Matmul,
        descs: &Descs,
        align: &Alignments,
        ptrs: &Ptrs,
        alpha: f32,
        beta: f32,
    ) -> Result<(Vec<Ranked>, Source, Key)> {
        let key = self.key(op.shape_code_of(label.code()), align);
        if let Some(entry) = self.cache.get(&key) {
            if entry.verified {
                self.stats.hits += 1;
                return Ok((entry.ranked.clone(), Source::Cache, key));
            }
            // Read from the file: keep the algorithms cuBLASLt still accepts for this problem.
            let checked: Vec<Ranked> = entry
                .ranked
                .iter()
                .filter_map(|r| self.algo_check(descs, r).ok())
                .filter(|r| r.workspace <= self.workspace.limit())
                .collect();
            if !checked.is_empty() {
                self.stats.hits += 1;
                self.cache.insert(
                    key.clone(),
                    Entry {
                        ranked: checked.clone(),
                        verified: true,
                    },
                );
                return Ok((checked, Source::Cache, key));
            }
            log::warn!("cuBLASLt cache entry for {op} rejected by cublasLtMatmulAlgoCheck");
        }
        self.stats.misses += 1;
        let started = Instant::now();
        let count = match self.policy {
            Policy::Heuristic => 1,
            Policy::Benchmark => self.top_n,
        };
        let mut ranked = self.heuristic(op, descs, align, count)?;
        let source = match self.policy {
            Policy::Heuristic => Source::Heuristic,
            Policy::Benchmark => {
                crate::capture::refuse_during_capture(
                    &self.stream,
                    "timing cuBLASLt algorithms (a first decision for this problem)",
                )?;
                self.stats.benchmarks += 1;
                ranked = self.autotune::<D>(label, op, descs, &ranked, ptrs, alpha, beta)?;
                Source::Benchmark
            }
        };
        let best = &ranked[0];
        log::info!(
            "cuBLASLt {op} {} {} ({:.1} ms): algo {} (heuristic rank {}){}, {} bytes of workspace; {} candidates",
            label,
            self.policy.name(),
            started.elapsed().as_secs_f64() * 1e3,
            best.algo_id,
            best.index,
            if best.ms >= 0.0 {
                format!(", {:.4} ms", best.ms)
            } else {
                String::new()
            },
            best.workspace,
            ranked.len()
        );
        self.cache.insert(
            key.clone(),
            Entry {
                ranked: ranked.clone(),
                verified: true,
            },
        );
        if self.path.is_some() {
            if let Err(e) = self.save() {
                log::warn!("cuBLASLt autotune cache not saved: {e}");
            }
        }
        Ok((ranked, source, key))
    }

    /// Times every candidate on the call's buffers (a scratch D when `beta ≠ 0`) and returns
    /// them fastest first; candidates that fail to launch are dropped.
    #[allow(clippy::too_many_arguments)] // the call's parts
    pub(super) fn autotune<D: DeviceRepr + ValidAsZeroBits>(
        &mut self,
        label: Label,
        op: &Matmul,
        descs: &Descs,
        candidates: &[Ranked],
        ptrs: &Ptrs,
        alpha: f32,
        beta: f32,
    ) -> Result<Vec<Ranked>> {
        let stream = self.stream.clone();
        // With beta ≠ 0 the trials must not accumulate into the caller's D: they run on zeroed
        // scratch memory (C = D = scratch), which reads and writes as much as the real call.
        let mut scratch = if beta != 0.0 {
            Some(
                stream
                    .alloc_zeros::<D>(op.d_len())
                    .map_err(|e| Error::driver("allocating autotune scratch memory", e))?,
            )
        } else {
            None
        };
        let (scratch_ptr, _gs) = match scratch.as_mut() {
            Some(s) => {
                let (p, g) = s.device_ptr_mut(&stream);
                (Some(p), Some(g))
            }
            None => (None, None),
        };
        let mut trial = *ptrs;
        if let Some(p) = scratch_ptr {
            if alignment_of(p) < alignment_of(ptrs.d) {
                log::warn!(
                    "cuBLASLt autotune of {op}: scratch memory less aligned than D; keeping the heuristic order untimed"
                );
                return Ok(candidates.to_vec());
            }
            trial.d = p;
        }
        // Candidates are timed in interleaved rounds and ranked by their median, so clock and
        // power-state drift on a busy GPU (large GEMMs run near the power limit) does not favour
        // whichever candidate happened to run first.
        let mut samples: Vec<Option<Vec<f32>>> = vec![Some(Vec::new()); candidates.len()];
        for _ in 0..AUTOTUNE_ROUNDS {
            for (r, slot) in candidates.iter().zip(samples.iter_mut()) {
                let Some(times) = slot else { continue };
                match self.time_one(&stream, descs, r, alpha, beta, &trial) {
                    Ok(ms) => times.push(ms),
                    Err(e) => {
                        log::info!("cuBLASLt autotune of {op}: algo {} skipped: {e}", r.algo_id);
                        *slot = None;
                    }
                }
            }
        }
        let mut timed: Vec<Ranked> = candidates
            .iter()
            .zip(samples)
            .filter_map(|(r, times)| {
                let ms = timing::median(&times?)?;
                Some(Ranked { ms, ..*r })
            })
            .collect();
        if timed.is_empty() {
            return Err(Error::NoAlgorithm {
                op: "cuBLASLt matmul",
                detail: format!("no candidate for {op} in {label} could run"),
            });
        }
        let heuristic_first = candidates[0].index;
        timed.sort_by(|x, y| x.ms.total_cmp(&y.ms));
        // The heuristic's first choice keeps its place unless another candidate is clearly
        // faster: differences under AUTOTUNE_MARGIN are within the timing noise.
        if let Some(pos) = timed.iter().position(|r| r.index == heuristic_first) {
            if timed[pos].ms * AUTOTUNE_MARGIN <= timed[0].ms {
                let first = timed.remove(pos);
                timed.insert(0, first);
            }
        }
        Ok(timed)
    }

    /// ms per launch of `r`: one event-timed warm-up launch, then a batch sized to about
    /// `AUTOTUNE_BATCH_MS` (3 to 200 launches) between two events.
    pub(super) fn time_one(
        &mut self,
        stream: &Arc<CudaStream>,
        descs: &Descs,
        r: &Ranked,
        alpha: f32,
        beta: f32,
        ptrs: &Ptrs,
    ) -> Result<f32> {
        let raw = self.raw.as_ptr();
        let ws = &mut self.workspace;
        let call = Call {
            stream,
            descs,
            alpha,
            beta,
            ptrs,
        };
        timing::sized_batch_ms(stream, AUTOTUNE_BATCH_MS, (3, 200), || {
            launch(raw, ws, &call, r)
        })
    }

    /// Writes every decision to the cache file (merged with entries another process wrote
    /// meanwhile), atomically: readers see the old file or the new one. Called after each new
    /// decision when a file is set.
    ///
    /// Errors: [`Error::Io`] (the path and the operating system's error) when the file cannot
    /// be read for the merge or cannot be written; the file is then left as it was.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let lines = self.cache.iter().map(|(k, e)| format_line(k, &e.ranked));
        FORMAT.save(path, lines, |l| parse_line(l).is_some())
    }
}

pub(super) fn candidate(r: &Ranked, shape: [i64; 8], alignment: Alignments) -> Candidate {
    Candidate {
        index: r.index,
        workspace: r.workspace,
        waves_count: r.waves,
        time_ms: (r.ms >= 0.0).then_some(r.ms),
        algo_id: r.algo_id,
        algo: r.algo,
        shape,
        alignment,
    }
}

pub(super) fn ranked_of(c: &Candidate) -> Ranked {
    Ranked {
        algo: c.algo,
        workspace: c.workspace,
        index: c.index,
        waves: c.waves_count,
        ms: c.time_ms.unwrap_or(-1.0),
        algo_id: c.algo_id,
    }
}

// ---------------------------------------------------------------------------------------------
// Cache file
// ---------------------------------------------------------------------------------------------

/// FNV-1a, 64 bits: detects edited or truncated lines (not an authentication).
pub(super) fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub(super) fn format_line(k: &Key, v: &[Ranked]) -> String {
    let body = tune::entry_line(&k.device, &k.problem, v, |r| {
        let algo: Vec<String> = r.algo.iter().map(|w| format!("{w:016x}")).collect();
        format!(
            "{}:{}:{}:{}:{}",
            algo.join("-"),
            r.workspace,
            r.index,
            r.waves,
            r.ms
        )
    });
    let sum = fnv1a(&body);
    format!("{body}\t{sum:016x}")
}

pub(super) fn parse_line(line: &str) -> Option<(Key, Vec<Ranked>)> {
    let (body, sum) = line.rsplit_once('\t')?;
    if u64::from_str_radix(sum, 16).ok()? != fnv1a(body) {
        return None;
    }
    let (device, problem, mut parts) = tune::entry_fields(body)?;
    let ranked = tune::list(parts.next()?, |c| {
        let mut f = c.split(':');
        let words: Vec<u64> = f
            .next()?
            .split('-')
            .map(|w| u64::from_str_radix(w, 16).ok())
            .collect::<Option<_>>()?;
        let algo: [u64; 8] = words.try_into().ok()?;
        let workspace = f.next()?.parse::<usize>().ok()?;
        let index = f.next()?.parse::<usize>().ok()?;
        let waves = f.next()?.parse::<f32>().ok()?;
        let ms = f.next()?.parse::<f32>().ok()?;
        if f.next().is_some() {
            return None;
        }
        Some(Ranked {
            algo,
            workspace,
            index,
            waves,
            ms,
            algo_id: -1,
        })
    })?;
    if parts.next().is_some() || problem.first() != Some(&KEY_FORMAT) {
        return None;
    }
    Some((
        Key {
            device: device.into(),
            problem,
        },
        ranked,
    ))
}

/// The entries of the cache file at `path` (none when it does not exist); unreadable lines are
/// skipped with a warning. [`Error::Io`] when the file exists but cannot be read.
pub(super) fn load_file(path: &Path) -> Result<HashMap<Key, Vec<Ranked>>> {
    let mut map = HashMap::new();
    for (k, mut v) in FORMAT.load(path, parse_line)? {
        for r in &mut v {
            r.algo_id = algo_id_if_loaded(&r.algo);
        }
        map.insert(k, v);
    }
    Ok(map)
}

/// The algorithm id of a stored descriptor, when cuBLASLt is loadable (the file may be read in
/// a process without it; the id is for logs only).
pub(super) fn algo_id_if_loaded(data: &[u64; 8]) -> i32 {
    if require_cublaslt().is_ok() {
        algo_id(data)
    } else {
        -1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_lines_round_trip_and_tampering_is_detected() {
        let key = Key {
            device: "NVIDIA H200|sm90|cublasLt130100".into(),
            problem: vec![
                KEY_FORMAT, 8, 4, 2, 0, 1, 14, 0, 36, 256, 256, 256, 256, 256,
            ],
        };
        let r = Ranked {
            algo: [1, 2, 3, u64::MAX, 5, 6, 7, 8],
            workspace: 1024,
            index: 3,
            waves: 0.5,
            ms: 0.125,
            algo_id: -1,
        };
        let line = format_line(&key, &[r, Ranked { ms: -1.0, ..r }]);
        let (k, v) = parse_line(&line).unwrap();
        assert_eq!(k, key);
        assert_eq!(v, vec![r, Ranked { ms: -1.0, ..r }]);
        let tampered = line.replacen(":1024:", ":1025:", 1);
        assert!(parse_line(&tampered).is_none());
        assert!(parse_line("garbage").is_none());
        let dir = std::env::temp_dir().join(format!("cudnn-safe-lt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lt.txt");
        std::fs::write(
            &path,
            format!("{}\n{line}\nbad line\n{tampered}\n", FORMAT.header()),
        )
        .unwrap();
        let loaded = load_file(&path).unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[&key][0].algo, r.algo);
        let _ = std::fs::remove_dir_all(&dir);
    }

    proptest::proptest! {
        /// A cache file of arbitrary bytes, or of lines as written with fields replaced by
        /// arbitrary text (the checksum made to match, so the fields are parsed): reading it
        /// skips what does not parse, without a panic, and what it keeps writes back the same.
        #[test]
        fn arbitrary_cache_files_read_without_panics(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            fields in proptest::collection::vec("[0-9a-f:.,-]{0,40}|.{0,20}", 1..5),
        ) {
            let body = fields.join("\t");
            let forged = format!("{body}\t{:016x}", fnv1a(&body));
            if let Some((k, v)) = parse_line(&forged) {
                // Compared as text: a NaN time reads back as NaN, which is not equal to itself.
                let line = format_line(&k, &v);
                let again = parse_line(&line).map(|(k, v)| format_line(&k, &v));
                proptest::prop_assert_eq!(again, Some(line));
            }
            let dir = std::env::temp_dir()
                .join(format!("cudnn-safe-lt-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("lt.txt");
            // After the header, so that the lines are read.
            let mut all = format!("{}\n", FORMAT.header()).into_bytes();
            all.extend_from_slice(&bytes);
            all.push(b'\n');
            all.extend_from_slice(forged.as_bytes());
            std::fs::write(&path, &all).unwrap();
            proptest::prop_assert!(load_file(&path).is_ok());
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
