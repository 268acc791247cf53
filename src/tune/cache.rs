//! The one cache-file format of every tuner: convolution decisions ([`Autotuner`]), graph plans
//! ([`PlanCache`](super::plan::PlanCache)) and cuBLASLt algorithms.
//!
//! A file starts with a versioned header naming its kind and columns, then holds one entry per
//! line, its fields separated by tabs, the first two naming the device and the problem:
//!
//! ```text
//! # cudnn-safe cache v2 conv: device<TAB>problem key<TAB>algo:workspace_bytes:ms,...[<TAB>graph=...]
//! NVIDIA H200|sm90|cudnn91400<TAB>0,2,2,0,...<TAB>1:0:0.052,0:0:0.061
//! ```
//!
//! Reads are bounded ([`persist::read`]); a file of another version or kind (an older release's
//! file included) is skipped with a warning, and the next save replaces it. A save merges with
//! what another process wrote meanwhile (the file's entries for other problems are kept; this
//! process's entries win for the same device and problem) and replaces the file atomically.
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use super::key::Key;
use super::{Autotuner, Candidate};
use crate::conv::ConvAlgorithm;
use crate::error::Result;
use crate::graph::EngineConfig;
use crate::handle::Cudnn;
use crate::persist;
use cudarc::driver::CudaContext;

/// The version of the format, in every header.
pub(crate) const VERSION: u32 = 2;

/// One kind of cache file: its name in the header and the description of its columns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Format {
    /// The kind: `conv`, `graph` or `cublaslt`.
    pub(crate) kind: &'static str,
    /// What the columns hold, for a reader of the file.
    pub(crate) columns: &'static str,
}

impl Format {
    fn prefix(&self) -> String {
        format!("# cudnn-safe cache v{VERSION} {}:", self.kind)
    }

    /// The first line of a file of this format.
    pub(crate) fn header(&self) -> String {
        format!("{} {}", self.prefix(), self.columns)
    }

    /// The entry lines of a file's contents, numbered from 1, comments and blank lines left
    /// out; `None` when the first line is not this format's header. A line that is not UTF-8
    /// is `None` (unreadable).
    fn entries<'b>(
        &self,
        bytes: &'b [u8],
    ) -> Option<impl Iterator<Item = (usize, Option<&'b str>)> + 'b> {
        let mut lines = persist::lines(bytes);
        let (_, first) = lines.next()?;
        first?.starts_with(&self.prefix()).then_some(())?;
        Some(lines.filter(|(_, l)| !l.is_some_and(|l| l.starts_with('#') || l.trim().is_empty())))
    }

    /// The entries of the file at `path`, each line read by `parse` (none when there is no
    /// file). A line `parse` cannot read is skipped with a warning; a file of another version
    /// or kind is skipped whole, with a warning.
    ///
    /// Errors: [`Error::Io`](crate::Error::Io) when the file exists but cannot be read (not a
    /// regular file, no permission, larger than [`persist::MAX_FILE_BYTES`]).
    pub(crate) fn load<T>(
        &self,
        path: &Path,
        mut parse: impl FnMut(&str) -> Option<T>,
    ) -> Result<Vec<T>> {
        let Some(bytes) = persist::read(path)? else {
            return Ok(Vec::new());
        };
        let Some(lines) = self.entries(&bytes) else {
            if !bytes.is_empty() {
                log::warn!(
                    "{} cache {}: not a v{VERSION} {} cache file (an older or unknown format); \
                     its entries are skipped and the next save replaces it",
                    self.kind,
                    path.display(),
                    self.kind
                );
            }
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (no, line) in lines {
            match line.and_then(&mut parse) {
                Some(v) => out.push(v),
                None => log::warn!(
                    "{} cache {}:{no}: unreadable line skipped",
                    self.kind,
                    path.display()
                ),
            }
        }
        Ok(out)
    }

    /// Writes `lines` (entries formatted as [`Format::load`]'s `parse` reads them) to the file at
    /// `path`, merged with the entries the file holds now that `valid` accepts: a line of the
    /// file whose device and problem (its first two fields) no line of `lines` has is kept.
    /// Atomic: readers see the old file or the new one.
    ///
    /// Errors: [`Error::Io`](crate::Error::Io) with the path when the file cannot be read for
    /// the merge or cannot be written; the file is then left as it was.
    pub(crate) fn save(
        &self,
        path: &Path,
        lines: impl IntoIterator<Item = String>,
        valid: impl Fn(&str) -> bool,
    ) -> Result<()> {
        let mut all: BTreeMap<String, String> = BTreeMap::new();
        let existing = persist::read(path)?.unwrap_or_default();
        if let Some(old) = self.entries(&existing) {
            for (_, line) in old {
                if let Some(l) = line.filter(|l| valid(l)) {
                    all.insert(entry_key(l).to_string(), l.to_string());
                }
            }
        }
        for l in lines {
            all.insert(entry_key(&l).to_string(), l);
        }
        let mut text = self.header();
        text.push('\n');
        for l in all.values() {
            text.push_str(l);
            text.push('\n');
        }
        persist::write_atomic(path, text.as_bytes())
    }
}

/// The device and problem of an entry line: its first two fields.
fn entry_key(line: &str) -> &str {
    let end = line
        .match_indices('\t')
        .nth(1)
        .map_or(line.len(), |(i, _)| i);
    &line[..end]
}

/// What a `cache_file` builder starts with: the entries read, or none when the file cannot be
/// read (logged; the caller's `save` then reports the error instead of overwriting the file).
pub(crate) fn or_empty<T: Default>(kind: &str, loaded: Result<T>) -> T {
    loaded.unwrap_or_else(|e| {
        log::warn!("{kind} cache not read: {e}");
        T::default()
    })
}

/// The device part of every cache key: GPU name, compute capability and the library that
/// decided (`library`, e.g. `cudnn91400`), with no tab or newline (the file's separators).
pub(crate) fn device_name(ctx: &CudaContext, library: &str) -> String {
    // The driver is asked directly: `CudaContext::name` and `compute_capability` first return
    // (and clear) any error cudarc recorded earlier on the context, which would turn a key into
    // `device0|sm00` for one call and the real name for the next.
    let dev = ctx.cu_device();
    let name = cudarc::driver::result::device::get_name(dev)
        .unwrap_or_else(|_| format!("device{}", ctx.ordinal()));
    let attr = |a| {
        // SAFETY: `dev` is the device of a live context; the attribute is a plain integer query.
        unsafe { cudarc::driver::result::device::get_attribute(dev, a) }.unwrap_or(0)
    };
    use cudarc::driver::sys::CUdevice_attribute as A;
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    format!("{name}|sm{major}{minor}|{library}").replace(['\t', '\n'], " ")
}

/// [`device_name`] of a cuDNN handle's GPU and cuDNN version.
pub(crate) fn cudnn_device(cudnn: &Cudnn) -> String {
    device_name(cudnn.context(), &format!("cudnn{}", cudnn.version()))
}

/// The fields of an entry line: its device (not empty), its problem (comma-separated integers,
/// at least one) and the fields after them.
pub(crate) fn entry_fields(line: &str) -> Option<(&str, Vec<i64>, std::str::Split<'_, char>)> {
    let mut parts = line.split('\t');
    let device = parts.next().filter(|d| !d.is_empty())?;
    let problem = list(parts.next()?, |s| s.parse::<i64>().ok())?;
    Some((device, problem, parts))
}

/// The comma-separated items of a field, each read by `item` (at least one); `None` when one
/// does not read.
pub(crate) fn list<T>(field: &str, item: impl FnMut(&str) -> Option<T>) -> Option<Vec<T>> {
    let v = field.split(',').map(item).collect::<Option<Vec<T>>>()?;
    (!v.is_empty()).then_some(v)
}

/// The first fields of an entry line as [`entry_fields`] reads them, and `items` joined as a
/// list: `device<TAB>problem<TAB>item,item,...`.
pub(crate) fn entry_line<T>(
    device: &str,
    problem: &[i64],
    items: impl IntoIterator<Item = T>,
    item: impl Fn(T) -> String,
) -> String {
    let problem: Vec<String> = problem.iter().map(i64::to_string).collect();
    let items: Vec<String> = items.into_iter().map(item).collect();
    format!("{device}\t{}\t{}", problem.join(","), items.join(","))
}

/// The convolution decisions' file.
pub(crate) const CONV: Format = Format {
    kind: "conv",
    columns: "device<TAB>problem key<TAB>algo:workspace_bytes:ms,...\
              [<TAB>graph=<engine config>:workspace_bytes:ms]",
};

/// The decisions in the convolution cache file at `path` (none when it does not exist).
pub(crate) fn load_file(path: &Path) -> Result<HashMap<Key, Entry>> {
    Ok(CONV.load(path, parse_line)?.into_iter().collect())
}

impl Autotuner {
    /// Writes every decision to the cache file (merging with entries another process wrote
    /// meanwhile), atomically: readers see the old file or the new one. Called automatically
    /// after each new decision when a file is set.
    ///
    /// Errors: [`Error::Io`](crate::Error::Io) (the path and the operating system's error) when
    /// the file cannot be read for the merge or cannot be written; the file is then left as it
    /// was.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let lines = self.cache.iter().map(|(k, v)| format_line(k, v));
        CONV.save(path, lines, |l| parse_line(l).is_some())
    }
}

pub(super) type Ranking = Vec<(u32, usize, f32)>;

/// The graph engine a union search chose: what is persisted of it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GraphPick {
    pub(super) config: Arc<EngineConfig>,
    pub(super) workspace: usize,
    pub(super) ms: f32,
}

/// A cached decision: the legacy ranking (never empty), and the graph engine that beat its first
/// candidate, if a union search found one. Shared (`Arc`) between the cache and the recent
/// calls, so that a repeated call copies nothing.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Entry {
    pub(super) ranking: Ranking,
    pub(super) graph: Option<GraphPick>,
}

impl Entry {
    pub(super) fn legacy(ranking: Ranking) -> Entry {
        Entry {
            ranking,
            graph: None,
        }
    }
    /// The first legacy candidate.
    pub(super) fn first<A: ConvAlgorithm>(&self) -> Option<Candidate<A>> {
        let &(a, workspace, time_ms) = self.ranking.first()?;
        Some(Candidate {
            algo: A::from_raw_value(a)?,
            workspace,
            time_ms,
        })
    }
}

pub(super) fn encode<A: ConvAlgorithm>(r: &[Candidate<A>]) -> Ranking {
    r.iter()
        .map(|c| (c.algo.raw_value(), c.workspace, c.time_ms))
        .collect()
}

pub(super) fn decode<A: ConvAlgorithm>(r: &Ranking) -> Vec<Candidate<A>> {
    r.iter()
        .filter_map(|&(a, workspace, time_ms)| {
            Some(Candidate {
                algo: A::from_raw_value(a)?,
                workspace,
                time_ms,
            })
        })
        .collect()
}

pub(super) fn parse_line(line: &str) -> Option<(Key, Entry)> {
    let (device, problem, mut parts) = entry_fields(line)?;
    let ranking = list(parts.next()?, |c| {
        let mut f = c.split(':');
        let a = f.next()?.parse::<u32>().ok()?;
        let ws = f.next()?.parse::<usize>().ok()?;
        let ms = f.next()?.parse::<f32>().ok()?;
        Some((a, ws, ms))
    })?;
    // Optional (files written before the union search have none): the graph engine chosen.
    let graph = match parts.next() {
        None => None,
        Some(g) => {
            let mut f = g.strip_prefix("graph=")?.rsplitn(3, ':');
            let ms = f.next()?.parse::<f32>().ok()?;
            let workspace = f.next()?.parse::<usize>().ok()?;
            let config = f.next()?.parse::<EngineConfig>().ok()?;
            Some(GraphPick {
                config: Arc::new(config),
                workspace,
                ms,
            })
        }
    };
    if parts.next().is_some() {
        return None;
    }
    Some((Key::new(device.into(), problem), Entry { ranking, graph }))
}

/// One line of the cache file: what [`parse_line`] reads.
pub(super) fn format_line(k: &Key, v: &Entry) -> String {
    let line = entry_line(&k.device, &k.problem, &v.ranking, |(a, ws, ms)| {
        format!("{a}:{ws}:{ms}")
    });
    match &v.graph {
        Some(g) => format!("{line}\tgraph={}:{}:{}", g.config, g.workspace, g.ms),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: Format = Format {
        kind: "test",
        columns: "device<TAB>problem<TAB>value",
    };

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cudnn-safe-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("cache.txt")
    }

    fn read(path: &Path) -> Vec<(String, String)> {
        TEST.load(path, |l| {
            let (k, v) = l.rsplit_once('\t')?;
            Some((k.to_string(), v.to_string()))
        })
        .unwrap()
    }

    #[test]
    fn files_of_another_version_or_kind_are_skipped_and_replaced() {
        let path = scratch("format");
        for old in [
            "# cudnn-safe autotune cache v1: device<TAB>problem key<TAB>...\nGPU\t1,2\t1:0:0.5\n",
            "# cudnn-safe cache v1 test: device<TAB>problem<TAB>value\nGPU\tp\tv\n",
            "# cudnn-safe cache v2 conv: device<TAB>problem<TAB>value\nGPU\tp\tv\n",
            "eng0\tGPU sm90 cudnn91400 | filter | signature\t{}\n",
            "",
        ] {
            std::fs::write(&path, old).unwrap();
            assert_eq!(read(&path), [], "{old}");
            TEST.save(&path, ["GPU\tq\tw".to_string()], |_| true)
                .unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            assert_eq!(
                text,
                "# cudnn-safe cache v2 test: device<TAB>problem<TAB>value\nGPU\tq\tw\n"
            );
            assert_eq!(read(&path), [("GPU\tq".to_string(), "w".to_string())]);
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn saves_merge_with_what_another_process_wrote() {
        let path = scratch("merge");
        // Another process wrote two entries and a line nobody reads.
        TEST.save(
            &path,
            ["GPU\ta\tother".to_string(), "GPU\tb\tother".to_string()],
            |_| true,
        )
        .unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("a line without fields\n# a comment\n\n");
        std::fs::write(&path, text).unwrap();
        // This process decided b (again) and c: its entries win, a is kept, the bad line goes.
        let valid = |l: &str| l.split('\t').count() == 3;
        TEST.save(
            &path,
            ["GPU\tc\tmine".to_string(), "GPU\tb\tmine".to_string()],
            valid,
        )
        .unwrap();
        let got = read(&path);
        let want = [("a", "other"), ("b", "mine"), ("c", "mine")]
            .map(|(k, v)| (format!("GPU\t{k}"), v.to_string()));
        assert_eq!(got, want);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn entry_keys_are_the_first_two_fields() {
        assert_eq!(entry_key("dev\tkey\tvalue\tmore"), "dev\tkey");
        assert_eq!(entry_key("dev\tkey"), "dev\tkey");
        assert_eq!(entry_key("dev"), "dev");
    }
}
