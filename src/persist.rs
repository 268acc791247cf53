//! Cache files: the one atomic write and the one bounded read behind every tuner and plan cache
//! ([`crate::Autotuner`], [`crate::graph::PlanCache`], the cuBLASLt tuner), with every I/O
//! failure reported as [`Error::Io`] naming the file.
//!
//! A write goes to a temporary file beside the target (same directory, so the rename cannot
//! cross file systems), is flushed to disk, then renamed over the target: readers see the old
//! file or the new one, never a part. Whatever fails, the temporary file is removed.
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The largest cache file read (64 MiB): a longer one is refused ([`Error::Io`] with
/// [`io::ErrorKind::InvalidData`]) instead of read into memory.
pub(crate) const MAX_FILE_BYTES: u64 = 64 << 20;

fn io_error(path: &Path, source: io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A name beside `path` that no other write of this process uses: `<name>.tmp<pid>-<n>`.
fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name: OsString = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp{}-{n}", std::process::id()));
    path.with_file_name(name)
}

/// Replaces the file at `path` with `contents` atomically, creating its directory if needed.
///
/// Errors: [`Error::Io`] with `path` and the operating system's error when the directory cannot
/// be created, the temporary file cannot be created, written or flushed, or the rename fails
/// (for example onto a directory). The previous file is then unchanged and the temporary file
/// is gone.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|e| io_error(path, e))?;
    let tmp = temp_path(path);
    // `create_new`: a file of that name that is not ours is never written to, nor removed.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| io_error(path, e))?;
    // From here the temporary file is ours: every failure removes it.
    let written = file.write_all(contents).and_then(|()| file.sync_all());
    drop(file);
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(io_error(path, e));
    }
    // Makes the rename itself durable. Some file systems cannot sync a directory; the new file
    // is in place all the same, so a failure here is not reported.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// The contents of the cache file at `path`, or `None` when there is none.
///
/// Errors: [`Error::Io`] with `path` when it names something other than a regular file (a
/// directory, a FIFO, ...), cannot be read, or holds more than [`MAX_FILE_BYTES`].
pub(crate) fn read(path: &Path) -> Result<Option<Vec<u8>>> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(path, e)),
    };
    if !meta.is_file() {
        // Checked before opening: opening a FIFO for reading waits for a writer.
        return Err(io_error(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
        ));
    }
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(path, e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(path, e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(io_error(
            path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("longer than {MAX_FILE_BYTES} bytes, the most a cache file may hold"),
            ),
        ));
    }
    Ok(Some(bytes))
}

/// The lines of a file's contents, numbered from 1 (`\n`-separated, a trailing `\r` removed);
/// a line that is not UTF-8 is `None`, so that a reader skips that line only.
pub(crate) fn lines(bytes: &[u8]) -> impl Iterator<Item = (usize, Option<&str>)> {
    bytes.split(|&b| b == b'\n').enumerate().map(|(i, l)| {
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        (i + 1, std::str::from_utf8(l).ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh empty directory under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cudnn-safe-persist-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_write_replaces_the_file_and_leaves_nothing_else() {
        let dir = scratch("replace");
        let path = dir.join("cache.txt");
        write_atomic(&path, b"one\n").unwrap();
        write_atomic(&path, b"two\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two\n");
        assert_eq!(entries(&dir), ["cache.txt"]);
        assert_eq!(read(&path).unwrap().as_deref(), Some(&b"two\n"[..]));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_rename_removes_the_temporary_file() {
        let dir = scratch("rename");
        // The target is a non-empty directory: the temporary file is written, the rename fails.
        let path = dir.join("cache.txt");
        fs::create_dir_all(path.join("inside")).unwrap();
        let e = write_atomic(&path, b"data").unwrap_err();
        assert!(
            matches!(&e, Error::Io { path: p, .. } if p == &path),
            "{e:?}"
        );
        let source = std::error::Error::source(&e).expect("the io error is the source");
        assert!(source.downcast_ref::<io::Error>().is_some(), "{source:?}");
        assert_eq!(entries(&dir), ["cache.txt"]);
        assert!(path.is_dir());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_that_cannot_exist_is_an_io_error() {
        let dir = scratch("nodir");
        let blocker = dir.join("file");
        fs::write(&blocker, b"x").unwrap();
        let path = blocker.join("sub").join("cache.txt");
        assert!(
            matches!(write_atomic(&path, b"data"), Err(Error::Io { path: p, .. }) if p == path)
        );
        assert_eq!(entries(&dir), ["file"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_refuse_what_is_not_a_small_regular_file() {
        let dir = scratch("read");
        assert!(matches!(read(&dir.join("absent")), Ok(None)));
        assert!(matches!(read(&dir), Err(Error::Io { .. })));
        let big = dir.join("big");
        let f = File::create(&big).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        let r = read(&big);
        assert!(
            matches!(&r, Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::InvalidData),
            "{r:?}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lines_mark_invalid_utf8_per_line() {
        let got: Vec<(usize, Option<&str>)> = lines(b"a\r\n\xff\xfe\nb").collect();
        assert_eq!(got, [(1, Some("a")), (2, None), (3, Some("b"))]);
    }
}
