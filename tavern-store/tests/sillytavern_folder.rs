//! Chats written straight into a SillyTavern user folder (`FsOptions::chat_folder`): the
//! store appends to the user's real chat files in SillyTavern's layout and style, a running
//! SillyTavern's own save (a whole rewrite, renamed into place) is detected and never
//! overwritten, and the folder is remembered by the store for every later open.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tavern_core::chat::ChatLine;
use tavern_core::{CharacterName, ChatId};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::T0;
use tavern_store::error::StoreError;
use tavern_store::fs::{FsOptions, FsStore, CHAT_FOLDER_RECORD};
use tavern_store::ChatStore;

const CHAT: &str = "Seraphina - 2024-09-19@20h03m29s";

fn fixture_chat() -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/fixtures/chats")
            .join(format!("{CHAT}.jsonl")),
    )
    .expect("the real SillyTavern chat in ../shared/fixtures/chats")
}

/// A SillyTavern user folder holding the real chat where SillyTavern keeps it.
fn user_folder(dir: &Path) -> PathBuf {
    let st = dir.join("SillyTavern/data/default-user");
    std::fs::create_dir_all(st.join("chats/Seraphina")).unwrap();
    std::fs::write(
        st.join(format!("chats/Seraphina/{CHAT}.jsonl")),
        fixture_chat(),
    )
    .unwrap();
    st
}

fn line(name: &str, is_user: bool, text: &str) -> ChatLine {
    let raw = serde_json::json!({
        "name": name, "is_user": is_user, "send_date": "2026-12-03T10:00:00.000Z", "mes": text,
    });
    ChatLine::parse(&raw.to_string()).unwrap()
}

/// SillyTavern's save: the whole chat written to a temp file and renamed over the old one.
fn sillytavern_saves(path: &Path, extra: &str) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes.extend_from_slice(b"\n");
    bytes.extend_from_slice(extra.as_bytes());
    let tmp = path.with_extension("jsonl.3f2a1b");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn appends_land_in_the_users_own_chat_and_sillytavern_edits_are_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let st = user_folder(dir.path());
    let file = st.join(format!("chats/Seraphina/{CHAT}.jsonl"));
    let clock = Arc::new(ManualClock::new(T0));
    let store = FsStore::open_with(
        dir.path().join("store"),
        clock.clone(),
        FsOptions::default().with_chat_folder(&st),
    )
    .unwrap();
    let (who, chat) = (
        CharacterName::parse("Seraphina").unwrap(),
        ChatId::parse(CHAT).unwrap(),
    );
    assert_eq!(store.list_chats(&who).await.unwrap(), vec![chat.clone()]);
    let before = store.read_chat(&who, &chat).await.unwrap().unwrap();

    // Our append: the user's file, its bytes kept, one line more in SillyTavern's style.
    let ours = line("User", true, "我回来了。");
    let rev = store
        .append_lines(&who, &chat, std::slice::from_ref(&ours), &before.revision)
        .await
        .unwrap();
    let mut want = fixture_chat();
    want.extend_from_slice(b"\n");
    want.extend_from_slice(ours.raw().as_bytes());
    assert_eq!(std::fs::read(&file).unwrap(), want);

    // A running SillyTavern saves the chat with a reply of its own.
    let theirs = line("Seraphina", false, "Welcome back.").raw().to_owned();
    sillytavern_saves(&file, &theirs);
    let late = line("User", true, "written against the old revision");
    match store
        .append_lines(&who, &chat, std::slice::from_ref(&late), &rev)
        .await
    {
        Err(StoreError::Conflict { .. }) => {}
        other => panic!("a SillyTavern save must be detected, got {other:?}"),
    }
    let now = store.read_chat(&who, &chat).await.unwrap().unwrap();
    assert_eq!(
        now.lines.last().unwrap().raw(),
        theirs,
        "SillyTavern's line kept"
    );
    store
        .append_lines(&who, &chat, std::slice::from_ref(&late), &now.revision)
        .await
        .unwrap();
    let text = String::from_utf8(std::fs::read(&file).unwrap()).unwrap();
    assert!(
        text.ends_with(&format!("{theirs}\n{}", late.raw())),
        "{text}"
    );
    assert!(
        text.as_bytes().starts_with(&want),
        "nothing before was changed"
    );
    assert!(
        !text.ends_with('\n'),
        "SillyTavern's style: no trailing newline"
    );

    // Nothing of ours but the chat's lock file sits beside SillyTavern's chat, and the store's
    // own root holds no chat.
    let mut names: Vec<String> = std::fs::read_dir(file.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec![format!("{CHAT}.jsonl"), format!("{CHAT}.lock")]);
    let root_chats = dir.path().join("store/chats");
    assert_eq!(std::fs::read_dir(root_chats).unwrap().count(), 0);

    // Every later open (`tavern`, another bridge) finds the same chats without being told.
    drop(store);
    let again = FsStore::open(dir.path().join("store"), clock.clone()).unwrap();
    let read = again.read_chat(&who, &chat).await.unwrap().unwrap();
    assert_eq!(read.lines.last().unwrap().raw(), late.raw());
}

#[tokio::test]
async fn a_missing_chat_folder_is_an_error_never_a_silent_split() {
    let dir = tempfile::tempdir().unwrap();
    let st = user_folder(dir.path());
    let clock = Arc::new(ManualClock::new(T0));
    let root = dir.path().join("store");
    drop(
        FsStore::open_with(
            &root,
            clock.clone(),
            FsOptions::default().with_chat_folder(&st),
        )
        .unwrap(),
    );
    assert!(root.join(CHAT_FOLDER_RECORD).is_file());
    // The folder goes away (an unmounted drive): opening says so, naming no path.
    std::fs::rename(&st, dir.path().join("elsewhere")).unwrap();
    let err = FsStore::open(&root, clock.clone()).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, StoreError::Setup { .. }) && message.contains(CHAT_FOLDER_RECORD),
        "{message}"
    );
    assert!(!message.contains(dir.path().to_str().unwrap()), "{message}");
    // A folder that is not a directory is refused the same way.
    let not_dir = dir.path().join("file");
    std::fs::write(&not_dir, b"x").unwrap();
    let err = FsStore::open_with(
        &root,
        clock.clone(),
        FsOptions::default().with_chat_folder(&not_dir),
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::Setup { .. }), "{err}");
    // Naming the store's own root goes back to chats under it, and forgets the folder.
    FsStore::open_with(
        &root,
        clock.clone(),
        FsOptions::default().with_chat_folder(&root),
    )
    .unwrap();
    assert!(!root.join(CHAT_FOLDER_RECORD).exists());
    FsStore::open(&root, clock).unwrap();
}

/// The store check reads the chats kept in the user's folder too, and names a damaged one by
/// its place in that folder, never by an absolute path.
#[test]
fn the_check_reads_the_chats_in_the_users_folder() {
    let dir = tempfile::tempdir().unwrap();
    let st = user_folder(dir.path());
    let root = dir.path().join("store");
    let clock = Arc::new(ManualClock::new(T0));
    drop(FsStore::open_with(&root, clock, FsOptions::default().with_chat_folder(&st)).unwrap());
    let whole = tavern_store::fs::check_files(&root, |_, _| {});
    assert!(whole.problems.is_empty(), "{:?}", whole.problems);
    let files_before = whole.files;
    let chat = st.join(format!("chats/Seraphina/{CHAT}.jsonl"));
    let mut bytes = std::fs::read(&chat).unwrap();
    bytes.extend_from_slice(b"\n{not json");
    std::fs::write(&chat, bytes).unwrap();
    let damaged = tavern_store::fs::check_files(&root, |_, _| {});
    assert_eq!(damaged.files, files_before);
    let problem = damaged.problems.first().expect("the damaged line is found");
    assert!(
        problem
            .file
            .starts_with(&format!("chat folder: chats/Seraphina/{CHAT}.jsonl line")),
        "{problem:?}"
    );
    assert!(!problem.file.contains(dir.path().to_str().unwrap()));
    // A record naming a folder that is gone is a problem, not a whole store.
    std::fs::rename(&st, dir.path().join("moved")).unwrap();
    let lost = tavern_store::fs::check_files(&root, |_, _| {});
    assert_eq!(
        lost.problems[0].file, CHAT_FOLDER_RECORD,
        "{:?}",
        lost.problems
    );
}
