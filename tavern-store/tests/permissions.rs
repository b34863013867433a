//! A store file this process may not use is a configuration problem, reported as such and
//! never set aside (issue 30, F5: a log left `root:root 0600` by a compaction run as root was
//! renamed aside and the store came up empty); a compaction keeps its log's owner and mode.
//! Run as root (as CI is), the unprivileged side is `nobody`, through `runuser`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::MemoryStore;

const WRITER: &str = env!("CARGO_BIN_EXE_tavern-store-writer");

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn nobody() -> (u32, u32) {
    let out = Command::new("id").args(["-u", "nobody"]).output().unwrap();
    let uid = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let out = Command::new("id").args(["-g", "nobody"]).output().unwrap();
    (
        uid,
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap(),
    )
}

fn agent() -> tavern_core::ScopeKey {
    tavern_core::ScopeKey::Agent {
        agent: tavern_core::AgentId::parse("a1").unwrap(),
    }
}

/// A store with three memories, in a directory everyone may enter and write (so that only
/// the log's own mode stands in the way).
fn store_with_memories(dir: &Path) -> std::path::PathBuf {
    let root = dir.join("store");
    let s = FsStore::open(&root, Arc::new(ManualClock::new(T0))).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for i in 0..3 {
        rt.block_on(s.put(
            write(&format!("m{i}"), agent(), "the silver gate"),
            None,
            false,
        ))
        .unwrap();
    }
    drop(s);
    for p in [dir, root.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    root
}

fn memories(root: &Path) -> usize {
    FsStore::open(root, Arc::new(ManualClock::new(T0)))
        .unwrap()
        .memory_len()
}

#[test]
fn a_log_this_process_may_not_read_is_reported_and_never_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let root = store_with_memories(dir.path());
    let log = root.join("memory.log");
    let before = std::fs::read(&log).unwrap();
    let mut run = if is_root() {
        // The log stays root's, 0600: what `tavern compact` run as root used to leave.
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--", WRITER]);
        c
    } else {
        std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o000)).unwrap();
        Command::new(WRITER)
    };
    let out = run.arg(&root).args(["put", "x", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the store opened without its log");
    assert!(
        stderr.contains("no access to memory.log") && stderr.contains("nothing was set aside"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(root.to_str().unwrap()),
        "no absolute path: {stderr}"
    );
    // The log is where it was, as it was; nothing was renamed aside.
    assert_eq!(std::fs::read(&log).unwrap(), before);
    let aside: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .collect();
    assert!(aside.is_empty(), "{aside:?}");
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(memories(&root), 3);
}

#[test]
fn compaction_keeps_the_logs_owner_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let root = store_with_memories(dir.path());
    let log = root.join("memory.log");
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o640)).unwrap();
    let owner = if is_root() {
        // The log belongs to the user the bridge runs as; the operator compacts as root.
        let (uid, gid) = nobody();
        std::os::unix::fs::chown(&log, Some(uid), Some(gid)).unwrap();
        (uid, gid)
    } else {
        let m = std::fs::metadata(&log).unwrap();
        (m.uid(), m.gid())
    };
    let s = FsStore::open(&root, Arc::new(ManualClock::new(T0))).unwrap();
    let report = s.compact().unwrap();
    assert_eq!(report.memory.0, 3);
    drop(s);
    let m = std::fs::metadata(&log).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!((m.uid(), m.gid()), owner);
    assert_eq!(memories(&root), 3);
}
