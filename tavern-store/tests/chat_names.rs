//! Chats of any real-world name live in `chats/<character>/<chat id>.jsonl` (SillyTavern's own
//! layout) with only what a file system refuses escaped; chats of the earlier all-escaped
//! layout are moved to these names when the store opens.

use std::sync::Arc;

use serde_json::json;
use tavern_core::chat::ChatLine;
use tavern_core::{CharacterName, ChatId};
use tavern_store::clock::ManualClock;
use tavern_store::conformance::T0;
use tavern_store::fs::FsStore;
use tavern_store::ChatStore;

fn open(dir: &tempfile::TempDir) -> FsStore {
    FsStore::open(dir.path(), Arc::new(ManualClock::new(T0))).unwrap()
}

/// `(character, chat id, file path under the root)`: real-shaped names from a SillyTavern data
/// folder, and the Windows-reserved ones that need escaping.
const CASES: &[(&str, &str, &str)] = &[
    (
        "Seraphina",
        "Seraphina - 2024-09-19@20h03m29s",
        "chats/Seraphina/Seraphina - 2024-09-19@20h03m29s.jsonl",
    ),
    (
        "七大姑",
        "七大姑 - 2024-10-05@21h59m30s",
        "chats/七大姑/七大姑 - 2024-10-05@21h59m30s.jsonl",
    ),
    (
        "Seraphina",
        "Branch #38 - 2024-1-5@16h52m07s",
        "chats/Seraphina/Branch #38 - 2024-1-5@16h52m07s.jsonl",
    ),
    (
        "Mira",
        "Mira 🌙 - Mira's day, part 2 (draft)",
        "chats/Mira/Mira 🌙 - Mira's day, part 2 (draft).jsonl",
    ),
    ("Mira", "CON", "chats/Mira/%43ON.jsonl"),
    ("Mira", "aux.txt", "chats/Mira/%61ux.txt.jsonl"),
    (
        "Mira",
        "ends with a dot.",
        "chats/Mira/ends with a dot%2E.jsonl",
    ),
    ("Mira", "50% off", "chats/Mira/50%25 off.jsonl"),
    ("Mira", ".hidden", "chats/Mira/%2Ehidden.jsonl"),
    ("Who? <A|B>", "c", "chats/Who%3F %3CA%7CB%3E/c.jsonl"),
    ("NUL", "c", "chats/%4EUL/c.jsonl"),
];

fn raw(lines: Vec<ChatLine>) -> Vec<String> {
    lines.iter().map(|l| l.raw().to_owned()).collect()
}

#[tokio::test]
async fn real_world_chat_names_are_their_own_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir);
    for (character, chat, path) in CASES {
        let ch = CharacterName::parse(*character).unwrap();
        let id = ChatId::parse(*chat).unwrap();
        let header =
            ChatLine::parse(&json!({"user_name": "You", "character_name": character}).to_string())
                .unwrap();
        s.rewrite_chat(&ch, &id, std::slice::from_ref(&header), None)
            .await
            .unwrap();
        assert!(dir.path().join(path).is_file(), "{chat:?} → {path}");
        let back = s.read_chat(&ch, &id).await.unwrap().unwrap();
        assert_eq!(back.lines, [header], "{chat:?}");
        assert!(
            s.list_chats(&ch).await.unwrap().contains(&id),
            "{chat:?} is listed"
        );
    }
    // A file SillyTavern itself wrote with that name is read as that chat.
    std::fs::write(
        dir.path()
            .join("chats/七大姑/七大姑 - 2025-01-01@00h00m00s.jsonl"),
        "{\"user_name\":\"You\"}\n{\"name\":\"七大姑\",\"mes\":\"你好\"}",
    )
    .unwrap();
    let aunt = CharacterName::parse("七大姑").unwrap();
    let id = ChatId::parse("七大姑 - 2025-01-01@00h00m00s").unwrap();
    assert_eq!(
        s.read_chat(&aunt, &id).await.unwrap().unwrap().lines.len(),
        2
    );
    assert_eq!(s.list_chats(&aunt).await.unwrap().len(), 2);
}

#[tokio::test]
async fn chats_of_the_earlier_layout_move_to_readable_names_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = dir.path().join("chats/_%4Dira");
    std::fs::create_dir_all(&legacy).unwrap();
    // `Mira` / `Mira - 2024-09-19@20h03m29s` in the old encoding.
    std::fs::write(
        legacy.join("_%4Dira%20-%202024-09-19%4020h03m29s.jsonl"),
        "{\"user_name\":\"You\"}",
    )
    .unwrap();
    std::fs::write(legacy.join("_%4Dira%20-%202024-09-19%4020h03m29s.lock"), "").unwrap();
    // A readable name already taken: the legacy file stays, with a diagnostic.
    std::fs::create_dir_all(dir.path().join("chats/Ann")).unwrap();
    std::fs::write(dir.path().join("chats/Ann/c.jsonl"), "{\"new\":true}").unwrap();
    std::fs::create_dir_all(dir.path().join("chats/_%41nn")).unwrap();
    std::fs::write(dir.path().join("chats/_%41nn/_c.jsonl"), "{\"old\":true}").unwrap();

    let s = open(&dir);
    let mira = CharacterName::parse("Mira").unwrap();
    let id = ChatId::parse("Mira - 2024-09-19@20h03m29s").unwrap();
    assert_eq!(
        raw(s.read_chat(&mira, &id).await.unwrap().unwrap().lines),
        ["{\"user_name\":\"You\"}"]
    );
    assert!(dir
        .path()
        .join("chats/Mira/Mira - 2024-09-19@20h03m29s.jsonl")
        .is_file());
    assert!(!legacy.exists(), "the emptied legacy folder is gone");
    let ann = CharacterName::parse("Ann").unwrap();
    let c = ChatId::parse("c").unwrap();
    assert_eq!(
        raw(s.read_chat(&ann, &c).await.unwrap().unwrap().lines),
        ["{\"new\":true}"]
    );
    assert!(dir.path().join("chats/_%41nn/_c.jsonl").is_file());
    let diags: Vec<String> = s
        .diagnostics()
        .into_iter()
        .map(|d| format!("{}: {}", d.file, d.message))
        .collect();
    assert!(
        diags.contains(
            &"chats/_%41nn/_c.jsonl: not moved: chats/Ann/c.jsonl already exists".to_owned()
        ),
        "{diags:?}"
    );
    // Opening again changes nothing more.
    drop(s);
    let again = open(&dir);
    assert!(again
        .diagnostics()
        .iter()
        .all(|d| !d.message.starts_with("moved")));
}
