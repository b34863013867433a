//! Durable file primitives: atomic replace (temp + fsync + rename + directory fsync), setting
//! corrupt files aside, and IO errors that name files relative to the store root.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::StoreError;

/// Wraps an IO error with the operation and the root-relative file name. The cause keeps
/// only the operating system's description: some errors (temporary files, `fs-err`) carry
/// the absolute path in their message, and no message may show one.
pub(crate) fn io_err(op: &'static str, rel: &str) -> impl FnOnce(std::io::Error) -> StoreError {
    let file = rel.to_owned();
    move |e| {
        // This process may not use the file (its owner or mode): configuration, not damage.
        if matches!(e.raw_os_error(), Some(1 | 13)) {
            return StoreError::Access {
                file,
                reason: pathless(&e).to_string(),
            };
        }
        StoreError::Io {
            op,
            file,
            source: pathless(&e),
        }
    }
}

/// The same error without any path: the OS error code's own text, or just the kind.
pub(crate) fn pathless(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.kind().to_string()),
    }
}

/// Opens `path` for reading only if it is a regular file: `None` when it is anything else (a
/// FIFO, a device, a directory, a symbolic link). The open itself never blocks (a FIFO opened
/// without a writer would) and what is checked is the very file opened, so nothing swapped in
/// between a check and the open is ever read.
pub(crate) fn open_regular(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        // O_NOFOLLOW on a symbolic link; a socket, which cannot be opened.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(file.metadata()?.is_file().then_some(file))
}

/// Whether `rel` exists as something other than a regular file (a directory, a FIFO, a
/// device): such a thing is never opened for reading, which could block forever.
pub(crate) fn is_special(root: &Path, rel: &str) -> bool {
    std::fs::symlink_metadata(under(root, rel)).is_ok_and(|m| !m.is_file())
}

/// A file path under the root from root-relative parts.
pub(crate) fn under(root: &Path, rel: &str) -> PathBuf {
    let mut p = root.to_path_buf();
    for part in rel.split('/') {
        p.push(part);
    }
    p
}

/// fsyncs the file store has issued in this process.
static SYNCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many fsyncs (of files and directories) the file store has issued in this process: what
/// benchmarks count durable writes by.
pub fn syncs_issued() -> u64 {
    SYNCS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Directory fsyncs among them.
static DIR_SYNCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many of [`syncs_issued`] were of directories (making a rename or a new file durable).
pub fn dir_syncs_issued() -> u64 {
    DIR_SYNCS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts one fsync (see [`syncs_issued`]).
pub(crate) fn count_sync() {
    SYNCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// fsyncs a directory so a rename or a new file in it survives a crash.
pub(crate) fn sync_dir(dir: &Path, rel: &str) -> Result<(), StoreError> {
    count_sync();
    DIR_SYNCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync directory", rel))
}

/// Creates a directory (and parents) durably.
pub(crate) fn ensure_dir(root: &Path, rel: &str) -> Result<PathBuf, StoreError> {
    let dir = under(root, rel);
    if !dir.is_dir() {
        fs_err::create_dir_all(&dir).map_err(|e| StoreError::Io {
            op: "create directory",
            file: rel.to_owned(),
            source: pathless(&e),
        })?;
        if let Some(parent) = dir.parent() {
            sync_dir(parent, rel)?;
        }
    }
    Ok(dir)
}

/// How old a temporary file of ours must be before it is taken for the leftover of an
/// interrupted write: a younger one may belong to another process writing right now.
const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// What [`write_atomic`]'s temporary files are named from.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

/// Removes the temporary files [`write_atomic_as`] left in `dir` when it was interrupted (a
/// process killed between creating the file and renaming it), older than an hour; returns
/// their names. Only names starting with `prefix` (ours): other programs' (SillyTavern's
/// write-file-atomic) are left alone.
pub(crate) fn remove_stale_temps(dir: &Path, prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(prefix) {
            continue;
        }
        let old = entry
            .metadata()
            .ok()
            .filter(std::fs::Metadata::is_file)
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_TEMP_AGE);
        if old && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// Replaces `rel` with `bytes` atomically and durably: a crash leaves the old or the new
/// content, never a mix.
pub(crate) fn write_atomic(root: &Path, rel: &str, bytes: &[u8]) -> Result<(), StoreError> {
    write_atomic_as(root, rel, bytes, TEMP_PREFIX)
}

/// [`write_atomic`] with the temporary file named from `prefix` (which starts with
/// [`TEMP_PREFIX`]): one a sweep of a shared directory can tell apart.
pub(crate) fn write_atomic_as(
    root: &Path,
    rel: &str,
    bytes: &[u8],
    prefix: &str,
) -> Result<(), StoreError> {
    let path = under(root, rel);
    let dir = path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.to_path_buf());
    let mut tmp = tempfile::Builder::new()
        .prefix(prefix)
        .tempfile_in(&dir)
        .map_err(io_err("create temporary file for", rel))?;
    tmp.write_all(bytes).map_err(io_err("write", rel))?;
    keep_owner_and_mode(&path, tmp.as_file(), rel)?;
    count_sync();
    tmp.as_file().sync_all().map_err(io_err("fsync", rel))?;
    tmp.persist(&path).map_err(|e| StoreError::Io {
        op: "rename into place",
        file: rel.to_owned(),
        source: pathless(&e.error),
    })?;
    sync_dir(&dir, rel)
}

/// Gives a replacement the mode and owner of the file it replaces, so that a compaction run by
/// another user (root, typically) leaves a log its owner can still read.
fn keep_owner_and_mode(path: &Path, tmp: &std::fs::File, rel: &str) -> Result<(), StoreError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(old) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    tmp.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))
        .map_err(io_err("set the mode of", rel))?;
    let ours = tmp.metadata().map_err(io_err("stat", rel))?;
    if (ours.uid(), ours.gid()) != (old.uid(), old.gid()) {
        // Only a privileged process can give a file away; one that is not writes what it owns
        // (it could not otherwise have replaced the file in this directory's name).
        match std::os::unix::fs::fchown(tmp, Some(old.uid()), Some(old.gid())) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(1) => {}
            Err(e) => return Err(io_err("set the owner of", rel)(e)),
        }
    }
    Ok(())
}

/// Reads a file, `None` if it does not exist.
///
/// # Errors
/// IO failures; [`StoreError::Corrupt`] when `rel` is not a regular file (never opened, so a
/// FIFO cannot block the store).
pub(crate) fn read_optional(root: &Path, rel: &str) -> Result<Option<Vec<u8>>, StoreError> {
    // Checked on the very file opened: nothing swapped in after a check is ever read.
    match open_regular(&under(root, rel)) {
        Ok(Some(mut file)) => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes).map_err(io_err("read", rel))?;
            Ok(Some(bytes))
        }
        Ok(None) => Err(StoreError::Corrupt {
            file: rel.to_owned(),
            reason: "not a regular file".into(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", rel)(e)),
    }
}

/// Moves a corrupt file aside (`<name>.corrupt-<ms>`) so it is kept for inspection but no
/// longer read; returns the new relative name.
pub(crate) fn set_aside(root: &Path, rel: &str, now_ms: i64) -> Result<String, StoreError> {
    let new_rel = format!("{rel}.corrupt-{now_ms}");
    std::fs::rename(under(root, rel), under(root, &new_rel)).map_err(io_err("set aside", rel))?;
    if let Some(parent) = under(root, rel).parent() {
        sync_dir(parent, rel)?;
    }
    Ok(new_rel)
}

/// Removes a file durably; `false` if it did not exist.
pub(crate) fn remove(root: &Path, rel: &str) -> Result<bool, StoreError> {
    let path = under(root, rel);
    match std::fs::remove_file(&path) {
        Ok(()) => {
            if let Some(parent) = path.parent() {
                sync_dir(parent, rel)?;
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("remove", rel)(e)),
    }
}

/// What identifies one version of a file without reading it: device, inode, birth time (where
/// the file system keeps one), length, modification and change times. Files here are replaced
/// atomically (a new inode each time) or appended to (a new length), so a cache keyed by the
/// stamp sees every change, also one made by another process; the birth time tells a reused
/// inode from the file that had it. Times are only as fine as the file system's clock, so a
/// same-length rewrite in place within one tick keeps the stamp (chat digests also compare
/// the file's end for that reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp([i128; 6]);

impl FileStamp {
    /// Whether device and inode match (always, where the platform has no inodes) and the
    /// birth times, where known: the same file, perhaps grown or changed, not a new one put in
    /// its place.
    pub fn same_node(&self, other: &Self) -> bool {
        self.0[..2] == other.0[..2] && self.0[5] == other.0[5]
    }

    /// The file's length when stamped.
    pub fn len(&self) -> u64 {
        u64::try_from(self.0[2]).unwrap_or(0)
    }

    /// Whether the file was empty when stamped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stamp as numbers, to write down ([`FileStamp::from_parts`] reads them back).
    pub(crate) fn parts(&self) -> [i128; 6] {
        self.0
    }

    /// A stamp written down by [`FileStamp::parts`].
    pub(crate) fn from_parts(parts: [i128; 6]) -> Self {
        Self(parts)
    }
}

/// Nanoseconds since the epoch of a file time, 0 where there is none.
fn nanos(time: std::io::Result<std::time::SystemTime>) -> i128 {
    time.ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
}

/// The stamp of a file's metadata.
#[cfg(unix)]
pub fn stamp_of(meta: &std::fs::Metadata) -> FileStamp {
    use std::os::unix::fs::MetadataExt;
    FileStamp([
        i128::from(meta.dev()),
        i128::from(meta.ino()),
        i128::from(meta.len()),
        i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        nanos(meta.created()),
    ])
}

/// The stamp of a file's metadata.
#[cfg(not(unix))]
pub fn stamp_of(meta: &std::fs::Metadata) -> FileStamp {
    FileStamp([
        0,
        0,
        i128::from(meta.len()),
        nanos(meta.modified()),
        0,
        nanos(meta.created()),
    ])
}

/// The stamp of `rel`, `None` if it does not exist.
pub(crate) fn stamp(root: &Path, rel: &str) -> Result<Option<FileStamp>, StoreError> {
    match std::fs::metadata(under(root, rel)) {
        Ok(m) => Ok(Some(stamp_of(&m))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("stat", rel)(e)),
    }
}

/// An advisory lock held until dropped: exclusive for writers, shared for readers. Serializes
/// writers across threads *and* processes sharing the root.
#[must_use = "the lock is released when the guard is dropped"]
pub(crate) struct FileLock(std::fs::File);

impl FileLock {
    /// The locked file (open for reading and writing).
    pub(crate) fn file(&self) -> &std::fs::File {
        &self.0
    }

    pub(crate) fn acquire(root: &Path, rel: &str, exclusive: bool) -> Result<Self, StoreError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(under(root, rel))
            .map_err(io_err("open lock", rel))?;
        if exclusive {
            file.lock().map_err(io_err("lock", rel))?;
        } else {
            file.lock_shared().map_err(io_err("lock", rel))?;
        }
        Ok(Self(file))
    }
}

#[cfg(test)]
mod tests {
    use super::open_regular;

    #[test]
    fn only_a_regular_file_is_opened_and_nothing_else_blocks_or_opens() {
        let dir = tempfile::tempdir().unwrap();
        let p = |name: &str| dir.path().join(name);
        std::fs::write(p("file"), b"x").unwrap();
        assert!(open_regular(&p("file")).unwrap().is_some());
        std::os::unix::fs::symlink(p("file"), p("link")).unwrap();
        assert!(open_regular(&p("link")).unwrap().is_none());
        std::fs::create_dir(p("dir")).unwrap();
        assert!(open_regular(&p("dir")).unwrap().is_none());
        // Opening a FIFO without a writer would block: it must come back at once.
        let made = std::process::Command::new("mkfifo")
            .arg(p("fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        assert!(open_regular(&p("fifo")).unwrap().is_none());
        let _listener = std::os::unix::net::UnixListener::bind(p("socket")).unwrap();
        assert!(open_regular(&p("socket")).unwrap().is_none());
        let missing = open_regular(&p("missing")).unwrap_err();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
    }
}
