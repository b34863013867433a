//! File-store chat revisions are digests of the file's bytes, whoever wrote them: checked
//! against the bytes on disk after every step of random histories that mix two stores on one
//! folder (each with its own cache) with other programs appending, renaming a new file over
//! the chat (SillyTavern's save) and rewriting it in place.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use tavern_core::chat::ChatLine;
use tavern_core::chat_digest::ChatDigest;
use tavern_core::{CharacterName, ChatId};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::T0;
use tavern_store::fs::FsStore;
use tavern_store::{ChatChange, ChatRevision, ChatStore, StoreError};

fn open(root: &Path) -> FsStore {
    FsStore::open(root, Arc::new(ManualClock::new(T0))).unwrap()
}

fn names() -> (CharacterName, ChatId) {
    (
        CharacterName::parse("Mira").unwrap(),
        ChatId::parse("Mira - 2026-12-01@10h00m00s").unwrap(),
    )
}

fn path(root: &Path) -> PathBuf {
    root.join("chats/Mira/Mira - 2026-12-01@10h00m00s.jsonl")
}

fn line(i: usize, text: &str) -> ChatLine {
    ChatLine::parse(&serde_json::json!({ "name": "Kai", "mes": format!("{text} {i}") }).to_string())
        .unwrap()
}

fn on_disk(root: &Path) -> ChatRevision {
    ChatRevision::of_content(&ChatDigest::of_bytes(&std::fs::read(path(root)).unwrap()))
}

fn parsed(root: &Path) -> Vec<String> {
    std::fs::read_to_string(path(root))
        .unwrap()
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// One step of a history.
#[derive(Debug, Clone)]
enum Step {
    /// A store (0 or 1) appends lines at the revision it reads first.
    StoreAppend(usize, usize),
    /// A store appends at a revision from before the last change (must conflict if stale).
    StaleAppend(usize),
    /// A store rewrites the chat to its first `n` lines.
    StoreRewrite(usize, usize),
    /// Another program appends lines (`\r\n` line ends when the flag is set).
    ExternalAppend(usize, bool),
    /// SillyTavern saves: a new file renamed over the chat, with its lines plus `n` more.
    RenameOver(usize),
    /// Another program rewrites the file in place, changing its last line.
    InPlace,
    /// Another program touches the file (new times, same bytes).
    Touch,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..2usize, 1..4usize).prop_map(|(s, n)| Step::StoreAppend(s, n)),
        (0..2usize).prop_map(Step::StaleAppend),
        (0..2usize, 1..3usize).prop_map(|(s, n)| Step::StoreRewrite(s, n)),
        (1..3usize, any::<bool>()).prop_map(|(n, crlf)| Step::ExternalAppend(n, crlf)),
        (0..3usize).prop_map(Step::RenameOver),
        Just(Step::InPlace),
        Just(Step::Touch),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// After every step, both stores give the digest of the bytes on disk as the revision, and
    /// what each reads since the revision it last saw brings it to the lines on disk.
    #[test]
    fn revisions_follow_the_bytes_on_disk(steps in proptest::collection::vec(step(), 1..14)) {
        let rt = runtime();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let stores = [open(root), open(root)];
        let (ch, id) = names();
        let mut counter = 0usize;
        let first = [line(0, "hello")];
        let r0 = rt.block_on(stores[0].rewrite_chat(&ch, &id, &first, None)).unwrap();
        prop_assert_eq!(&r0, &on_disk(root));
        // What each store last read: revision and lines.
        let mut seen: Vec<(ChatRevision, Vec<String>)> = vec![(r0.clone(), parsed(root)); 2];
        let mut previous = r0;
        for step in steps {
            counter += 1;
            let before = on_disk(root);
            match step {
                Step::StoreAppend(s, n) => {
                    let at = rt.block_on(stores[s].chat_revision(&ch, &id)).unwrap().unwrap();
                    let lines: Vec<ChatLine> = (0..n).map(|i| line(counter * 10 + i, "append")).collect();
                    let next = rt.block_on(stores[s].append_lines(&ch, &id, &lines, &at)).unwrap();
                    prop_assert_eq!(&next, &on_disk(root));
                }
                Step::StaleAppend(s) => {
                    let result = rt.block_on(stores[s].append_lines(&ch, &id, &[line(counter, "stale")], &previous));
                    if previous == before {
                        prop_assert_eq!(result.unwrap(), on_disk(root));
                    } else {
                        prop_assert!(matches!(result, Err(StoreError::Conflict { .. })), "{result:?}");
                        prop_assert_eq!(&before, &on_disk(root));
                    }
                }
                Step::StoreRewrite(s, n) => {
                    let at = rt.block_on(stores[s].chat_revision(&ch, &id)).unwrap().unwrap();
                    let lines: Vec<ChatLine> = parsed(root).iter().take(n).map(|l| ChatLine::parse(l).unwrap()).collect();
                    let next = rt.block_on(stores[s].rewrite_chat(&ch, &id, &lines, Some(&at))).unwrap();
                    prop_assert_eq!(&next, &on_disk(root));
                    prop_assert_eq!(next, ChatRevision::of_lines(&lines));
                }
                Step::ExternalAppend(n, crlf) => {
                    let end = if crlf { "\r\n" } else { "\n" };
                    let mut f = std::fs::OpenOptions::new().append(true).open(path(root)).unwrap();
                    for i in 0..n {
                        write!(f, "{end}{}", line(counter * 10 + i, "external").raw()).unwrap();
                    }
                }
                Step::RenameOver(n) => {
                    let mut text = std::fs::read_to_string(path(root)).unwrap();
                    for i in 0..n {
                        text.push('\n');
                        text.push_str(line(counter * 10 + i, "saved").raw());
                    }
                    let tmp = root.join("chats/Mira/.st-save.tmp");
                    std::fs::write(&tmp, text).unwrap();
                    std::fs::rename(&tmp, path(root)).unwrap();
                }
                Step::InPlace => {
                    let mut lines = parsed(root);
                    let last = lines.len() - 1;
                    lines[last] = line(counter, "edited").raw().to_owned();
                    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(path(root)).unwrap();
                    f.write_all(lines.join("\n").as_bytes()).unwrap();
                }
                Step::Touch => {
                    let f = std::fs::OpenOptions::new().append(true).open(path(root)).unwrap();
                    f.set_modified(std::time::SystemTime::now()).unwrap();
                }
            }
            let now = on_disk(root);
            if now != before {
                previous = before;
            }
            for (s, store) in stores.iter().enumerate() {
                prop_assert_eq!(rt.block_on(store.chat_revision(&ch, &id)).unwrap(), Some(now.clone()));
                let (since, lines) = &seen[s];
                let change = rt.block_on(store.read_chat_since(&ch, &id, since)).unwrap().unwrap();
                let caught_up: Vec<String> = match change {
                    ChatChange::Unchanged => {
                        prop_assert_eq!(since, &now);
                        lines.clone()
                    }
                    ChatChange::Appended { lines: new, revision } => {
                        prop_assert_eq!(&revision, &now);
                        lines.iter().cloned().chain(new.iter().map(|l| l.raw().to_owned())).collect()
                    }
                    ChatChange::Whole(file) => {
                        prop_assert_eq!(&file.revision, &now);
                        file.lines.iter().map(|l| l.raw().to_owned()).collect()
                    }
                };
                prop_assert_eq!(&caught_up, &parsed(root));
                seen[s] = (now.clone(), caught_up);
            }
        }
    }
}

/// A store opened later (nothing remembered) reads a long chat that SillyTavern saved with one
/// more line since a persisted revision as an append, and then another process's append too.
#[test]
fn a_new_process_reads_growth_since_a_persisted_revision_as_an_append() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let (ch, id) = names();
    let first: Vec<ChatLine> = (0..400).map(|i| line(i, "a long chat line")).collect();
    let r1 = {
        let store = open(dir.path());
        rt.block_on(store.rewrite_chat(&ch, &id, &first, None))
            .unwrap()
    };
    assert!(std::fs::metadata(path(dir.path())).unwrap().len() > 8192);
    // SillyTavern saves the chat with one more line (a new file renamed over it).
    let added = line(400, "saved by SillyTavern");
    let mut text = std::fs::read_to_string(path(dir.path())).unwrap();
    text.push('\n');
    text.push_str(added.raw());
    let tmp = dir.path().join("chats/Mira/tmp");
    std::fs::write(&tmp, &text).unwrap();
    std::fs::rename(&tmp, path(dir.path())).unwrap();
    let later = open(dir.path());
    let r2 = match rt
        .block_on(later.read_chat_since(&ch, &id, &r1))
        .unwrap()
        .unwrap()
    {
        ChatChange::Appended { lines, revision } => {
            assert_eq!(lines, std::slice::from_ref(&added));
            revision
        }
        other => panic!("expected an append, got {other:?}"),
    };
    assert_eq!(r2, on_disk(dir.path()));
    // Another process appends; this one extends its digest over the new line.
    let other = open(dir.path());
    let more = line(401, "from another process");
    rt.block_on(other.append_lines(&ch, &id, std::slice::from_ref(&more), &r2))
        .unwrap();
    assert_eq!(
        rt.block_on(later.read_chat_since(&ch, &id, &r2)).unwrap(),
        Some(ChatChange::Appended {
            lines: vec![more],
            revision: on_disk(dir.path()),
        })
    );
}

/// A chat well over 4 KiB whose first line holds the typo "teh".
fn long_chat() -> Vec<ChatLine> {
    let mut lines = vec![line(0, "typo teh")];
    lines.extend((1..200).map(|i| line(i, "a long chat line")));
    lines
}

/// A store in a new folder holding [`long_chat`], with a runtime, and the chat's revision.
fn long_chat_store() -> (
    tokio::runtime::Runtime,
    tempfile::TempDir,
    FsStore,
    ChatRevision,
) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let (ch, id) = names();
    let store = open(dir.path());
    let r1 = rt
        .block_on(store.rewrite_chat(&ch, &id, &long_chat(), None))
        .unwrap();
    (rt, dir, store, r1)
}

/// The store's revision is the bytes on disk, and what changed since `r1` is the whole chat
/// (its earlier content changed, so nothing may read as an append).
fn assert_read_whole_since(
    rt: &tokio::runtime::Runtime,
    store: &FsStore,
    root: &Path,
    r1: &ChatRevision,
) {
    let (ch, id) = names();
    assert_eq!(
        rt.block_on(store.chat_revision(&ch, &id)).unwrap(),
        Some(on_disk(root))
    );
    let change = rt
        .block_on(store.read_chat_since(&ch, &id, r1))
        .unwrap()
        .unwrap();
    assert!(matches!(change, ChatChange::Whole(_)), "{change:?}");
}

/// Fixes the typo in place (same length, same inode), as an editor writing in place does, and
/// sets the modification time far from now (a later clock tick, without waiting for one).
fn fix_typo_in_place(root: &Path) {
    use std::io::{Seek, SeekFrom};
    let bytes = std::fs::read(path(root)).unwrap();
    let at = bytes.windows(3).position(|w| w == b"teh").unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path(root))
        .unwrap();
    f.seek(SeekFrom::Start(at as u64)).unwrap();
    f.write_all(b"the").unwrap();
    f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000))
        .unwrap();
}

/// An edit in place before the last 4 KiB (same length, same inode) changes the revision and
/// is never read as "unchanged" (found in review: a remembered version was extended by
/// nothing).
#[test]
fn an_edit_in_place_before_the_last_4k_changes_the_revision() {
    let (rt, dir, store, r1) = long_chat_store();
    assert!(std::fs::metadata(path(dir.path())).unwrap().len() > 8192);
    fix_typo_in_place(dir.path());
    assert_ne!(on_disk(dir.path()), r1, "the bytes changed");
    assert_read_whole_since(&rt, &store, dir.path(), &r1);
}

/// An edit in place before the last 4 KiB plus an appended line is not an append (found in
/// review: the old last 4 KiB were unchanged, so the growth was taken for an append).
#[test]
fn an_edit_in_place_plus_an_append_is_not_an_append() {
    let (rt, dir, store, r1) = long_chat_store();
    let (ch, id) = names();
    fix_typo_in_place(dir.path());
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path(dir.path()))
        .unwrap();
    write!(f, "\n{}", line(500, "new").raw()).unwrap();
    drop(f);
    match rt
        .block_on(store.read_chat_since(&ch, &id, &r1))
        .unwrap()
        .unwrap()
    {
        ChatChange::Whole(file) => assert_eq!(file.revision, on_disk(dir.path())),
        other => panic!("earlier content changed, yet: {other:?}"),
    }
}

/// SillyTavern's saves (temp + rename) that edit an early message and add one are not appends,
/// also where the file system gives the new file the inode of a version two saves back (ext4
/// does; found in review).
#[test]
fn sillytavern_saves_that_edit_an_early_message_are_not_appends() {
    let (rt, dir, store, r1) = long_chat_store();
    let (ch, id) = names();
    let save = |text: &str| {
        let tmp = dir.path().join("chats/Mira/save.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path(dir.path())).unwrap();
    };
    let v1 = std::fs::read_to_string(path(dir.path())).unwrap();
    let v2 = format!("{v1}\n{}", line(300, "reply").raw());
    save(&v2);
    assert_eq!(
        rt.block_on(store.chat_revision(&ch, &id)).unwrap(),
        Some(on_disk(dir.path()))
    );
    let v3 = format!(
        "{}\n{}",
        v2.replacen("teh", "the", 1),
        line(301, "more").raw()
    );
    save(&v3);
    assert_read_whole_since(&rt, &store, dir.path(), &r1);
}

/// This process's own appends are followed back: what it appended since an earlier revision is
/// read as an append of exactly those lines.
#[test]
fn own_appends_read_back_as_appends() {
    let (rt, dir, store, r1) = long_chat_store();
    let (ch, id) = names();
    let mut at = r1.clone();
    let added: Vec<ChatLine> = (0..5).map(|i| line(600 + i, "turn")).collect();
    for l in &added {
        at = rt
            .block_on(store.append_lines(&ch, &id, std::slice::from_ref(l), &at))
            .unwrap();
    }
    assert_eq!(
        rt.block_on(store.read_chat_since(&ch, &id, &r1)).unwrap(),
        Some(ChatChange::Appended {
            lines: added,
            revision: on_disk(dir.path()),
        })
    );
}

/// Appends made by another process are taken from the record it leaves next to the chat: this
/// process reads only the appended lines, never the whole chat again.
#[test]
fn another_process_appends_are_read_without_reading_the_chat_again() {
    let (rt, dir, writer, r1) = long_chat_store();
    let (ch, id) = names();
    let reader = open(dir.path());
    let whole = |s: &FsStore| s.chat_whole_reads();
    assert_eq!(
        rt.block_on(reader.chat_revision(&ch, &id)).unwrap(),
        Some(r1.clone())
    );
    let read_once = whole(&reader);
    let added: Vec<ChatLine> = (0..3)
        .map(|i| line(700 + i, "from the other one"))
        .collect();
    let mut at = r1.clone();
    for l in &added {
        at = rt
            .block_on(writer.append_lines(&ch, &id, std::slice::from_ref(l), &at))
            .unwrap();
    }
    assert_eq!(
        rt.block_on(reader.chat_revision(&ch, &id)).unwrap(),
        Some(on_disk(dir.path()))
    );
    assert_eq!(
        rt.block_on(reader.read_chat_since(&ch, &id, &r1)).unwrap(),
        Some(ChatChange::Appended {
            lines: added.clone(),
            revision: on_disk(dir.path()),
        })
    );
    // And it appends on top, at the revision it learned, for the first one to follow.
    let more = line(800, "reply");
    let r5 = rt
        .block_on(reader.append_lines(&ch, &id, std::slice::from_ref(&more), &at))
        .unwrap();
    assert_eq!(whole(&reader), read_once, "no whole read to keep up");
    let writer_reads = whole(&writer);
    assert_eq!(
        rt.block_on(writer.read_chat_since(&ch, &id, &at)).unwrap(),
        Some(ChatChange::Appended {
            lines: vec![more],
            revision: r5,
        })
    );
    assert_eq!(whole(&writer), writer_reads);
    // A torn or edited record is not believed: the file is read whole, the answer still right.
    let lock = dir
        .path()
        .join("chats/Mira/Mira - 2026-12-01@10h00m00s.lock");
    let record = std::fs::read_to_string(&lock).unwrap();
    let entry = record.lines().nth(1).unwrap();
    let edited = entry.replacen(|c: char| c.is_ascii_digit(), "9", 1);
    assert_ne!(edited, entry);
    std::fs::write(&lock, record.replacen(entry, &edited, 1)).unwrap();
    let fresh = open(dir.path());
    assert_eq!(
        rt.block_on(fresh.chat_revision(&ch, &id)).unwrap(),
        Some(on_disk(dir.path()))
    );
    assert_eq!(whole(&fresh), 1);
}

/// A rewrite empties the append record (no version recorded before describes the rewritten
/// chat), and a lock path that is a FIFO is neither read (it would wait for a writer) nor
/// written.
#[test]
fn records_are_cleared_by_a_rewrite_and_never_read_from_a_fifo() {
    let (rt, dir, store, r1) = long_chat_store();
    let (ch, id) = names();
    let lock = dir
        .path()
        .join("chats/Mira/Mira - 2026-12-01@10h00m00s.lock");
    let r2 = rt
        .block_on(store.append_lines(&ch, &id, &[line(900, "x")], &r1))
        .unwrap();
    assert!(std::fs::metadata(&lock).unwrap().len() > 0);
    rt.block_on(store.rewrite_chat(&ch, &id, &long_chat(), Some(&r2)))
        .unwrap();
    assert_eq!(std::fs::metadata(&lock).unwrap().len(), 0);

    std::fs::remove_file(&lock).unwrap();
    let status = std::process::Command::new("mkfifo")
        .arg(&lock)
        .status()
        .unwrap();
    assert!(status.success());
    let other = open(dir.path());
    assert_eq!(
        rt.block_on(other.chat_revision(&ch, &id)).unwrap(),
        Some(on_disk(dir.path()))
    );
}
