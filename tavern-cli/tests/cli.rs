//! Drives the real `tavern` binary on temporary data directories built from the real
//! SillyTavern files in `../shared/fixtures`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use assert_cmd::Command;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tavern_core::revision::short_digest;
use tavern_core::{
    BindingTarget, CharacterName, ChatId, ContextMode, MemoryId, MemoryKind, MemorySource,
    MemoryWrite, ScopeKey, SessionBinding, SessionId, Tag, Timestamp,
};
use tavern_store::fs::FsStore;
use tavern_store::{MemoryStore, StateStoreExt, StoreError, SystemClock};
use tavern_tools::assets::world::WorldBook;

const SERAPHINA_CHAT: &str = "Seraphina - 2024-09-19@20h03m29s";

fn fixtures() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures");
    assert!(
        dir.is_dir(),
        "../shared/fixtures is missing beside the checkout: these tests read real SillyTavern files from it"
    );
    dir
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    // Written afresh: the fixtures are read-only, their copies need not be.
    std::fs::write(to, std::fs::read(from).unwrap()).unwrap();
}

/// A SillyTavern user folder: two cards and a broken one, two worlds, two character chats and
/// a group chat listed by a group.
fn st_folder(root: &Path) -> PathBuf {
    let f = fixtures();
    let st = root.join("st");
    copy(
        &f.join("cards/Seraphina.v2v3.book4.png"),
        &st.join("characters/Seraphina.png"),
    );
    copy(
        &f.join("cards/Megumin.v1.png"),
        &st.join("characters/Megumin.png"),
    );
    copy(
        &f.join("cards/not-a-card.user-default.png"),
        &st.join("characters/Nobody.png"),
    );
    copy(
        &f.join("worlds/Eldoria.json"),
        &st.join("worlds/Eldoria.json"),
    );
    copy(
        &f.join("worlds/tarot.zh.json"),
        &st.join("worlds/tarot.zh.json"),
    );
    copy(
        &f.join(format!("chats/{SERAPHINA_CHAT}.jsonl")),
        &st.join(format!("chats/Seraphina/{SERAPHINA_CHAT}.jsonl")),
    );
    copy(
        &f.join("chats/Megumin_1673323621108.jsonl"),
        &st.join("chats/Megumin/Megumin_1673323621108.jsonl"),
    );
    std::fs::create_dir_all(st.join("group chats")).unwrap();
    std::fs::write(
        st.join("group chats/Tea Party - 2024-1-5@16h52m07s.jsonl"),
        "{\"name\":\"Alice\",\"is_user\":false,\"send_date\":1,\"mes\":\"Tea?\"}\n{\"name\":\"You\",\"is_user\":true,\"send_date\":2,\"mes\":\"请，谢谢\"}",
    )
    .unwrap();
    std::fs::create_dir_all(st.join("groups")).unwrap();
    std::fs::write(
        st.join("groups/1700000000000.json"),
        r#"{"id":"1700000000000","name":"Tea Party","members":["Alice.png"],"chats":["Tea Party - 2024-1-5@16h52m07s"]}"#,
    )
    .unwrap();
    st
}

/// What `tavern` printed and how it exited.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one json document ({e}): {}", self.stdout))
    }

    /// Exactly one line on stderr, an error naming `needle`.
    fn one_error_line(&self, needle: &str) {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one error line expected: {:?}", self.stderr);
        assert!(lines[0].starts_with("error: "), "{}", lines[0]);
        assert!(
            lines[0].contains(needle),
            "{:?} should name {needle:?}",
            lines[0]
        );
    }
}

fn tavern(data: &Path, args: &[&str]) -> Run {
    let out = Command::cargo_bin("tavern")
        .unwrap()
        .arg("--data")
        .arg(data)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn ok(data: &Path, args: &[&str]) -> Run {
    let run = tavern(data, args);
    assert_eq!(run.code, 0, "tavern {args:?} failed: {}", run.stderr);
    run
}

/// Every file under `dir` with its size and SHA-256 (to prove a command changed nothing).
fn snapshot(dir: &Path) -> BTreeMap<String, (u64, String)> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, (u64, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.map(Result::unwrap) {
            let path = e.path();
            let rel = path.strip_prefix(base).unwrap().display().to_string();
            if path.is_dir() {
                out.insert(format!("{rel}/"), (0, String::new()));
                walk(base, &path, out);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                let hash = Sha256::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                out.insert(rel, (bytes.len() as u64, hash));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn chat_scope() -> ScopeKey {
    ScopeKey::Chat {
        character: CharacterName::parse("Seraphina").unwrap(),
        chat: ChatId::parse(SERAPHINA_CHAT).unwrap(),
    }
}

fn write(id: &str, scope: ScopeKey, content: &str, tags: &[&str]) -> MemoryWrite {
    MemoryWrite {
        id: MemoryId::parse(id).unwrap(),
        scope,
        kind: MemoryKind::Semantic,
        content: content.into(),
        tags: tags.iter().map(|t| Tag::parse(*t).unwrap()).collect(),
        importance: 0.7,
        confidence: 0.9,
        source: MemorySource::tool("call-7", SessionId::parse("s1").unwrap(), 3),
        expires_at: None,
    }
}

/// Memories as a session's tools would have written them.
fn remember(data: &Path) {
    let store = FsStore::open(data, Arc::new(SystemClock)).unwrap();
    block_on(async {
        store
            .put(
                write(
                    "m-glade",
                    chat_scope(),
                    "The traveller woke in Seraphina's glade after the Shadowfang attack.",
                    &["glade"],
                ),
                None,
                false,
            )
            .await
            .unwrap();
        store
            .put(
                write(
                    "m-amber",
                    ScopeKey::Character {
                        character: CharacterName::parse("Seraphina").unwrap(),
                    },
                    "Seraphina has amber eyes and guards the forest of Eldoria.",
                    &["eyes"],
                ),
                None,
                false,
            )
            .await
            .unwrap();
        store
            .put(
                write(
                    "m-tea",
                    ScopeKey::Global,
                    "用户喜欢乌龙茶，不加糖。",
                    &["茶"],
                ),
                None,
                false,
            )
            .await
            .unwrap();
        let mut expired = write(
            "m-old",
            ScopeKey::Global,
            "An appointment that has passed.",
            &[],
        );
        expired.expires_at = Some(Timestamp(1));
        store.put(expired, None, false).await.unwrap();
    });
}

#[test]
fn import_list_search_export_and_reimport_is_idempotent() {
    let tmp = tempfile::tempdir().unwrap();
    let st = st_folder(tmp.path());
    let data = tmp.path().join("data");
    let st_arg = st.to_str().unwrap();

    // A dry run on a new data directory creates nothing.
    let dry = ok(&data, &["--json", "import-st", st_arg, "--dry-run"]).json();
    // 2 cards, 2 worlds, the group file, 3 chats.
    assert_eq!(dry["summary"]["wouldImport"], 8, "{dry}");
    assert!(
        !data.exists(),
        "a dry run must not create the data directory"
    );

    let first = ok(&data, &["--json", "import-st", st_arg]).json();
    assert_eq!(first["summary"]["imported"], 8, "{first}");
    assert_eq!(first["summary"]["invalid"], 1);
    let broken = first["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["source"] == "characters/Nobody.png")
        .unwrap();
    assert_eq!(broken["result"], "invalid");
    assert!(broken["reason"]
        .as_str()
        .unwrap()
        .contains("not a character card"));
    // Cards and worlds land where `tavern-bridge --assets DATA/assets` finds them by name.
    for f in [
        "characters/Seraphina.png",
        "characters/Megumin.png",
        "worlds/Eldoria.json",
        "worlds/tarot.zh.json",
        "groups/1700000000000.json",
    ] {
        assert!(data.join("assets").join(f).is_file(), "{f}");
    }
    assert!(!data.join("assets/characters/Nobody.png").exists());

    let chats = ok(&data, &["--json", "chat", "ls"]).json();
    let listed: Vec<(String, String)> = chats["chats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["character"].as_str().unwrap().to_owned(),
                c["chat"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            ("Megumin".into(), "Megumin_1673323621108".into()),
            ("Seraphina".into(), SERAPHINA_CHAT.into()),
            ("Tea Party".into(), "Tea Party - 2024-1-5@16h52m07s".into()),
        ]
    );
    let text = ok(&data, &["chat", "show", "Seraphina", SERAPHINA_CHAT]).stdout;
    assert!(
        text.contains("[1] Seraphina: *You wake with a start"),
        "{text}"
    );

    // The chat exported back is the file SillyTavern wrote, byte for byte.
    let out = tmp.path().join("back.jsonl");
    ok(
        &data,
        &[
            "export",
            "chat",
            "Seraphina",
            SERAPHINA_CHAT,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(fixtures().join(format!("chats/{SERAPHINA_CHAT}.jsonl"))).unwrap()
    );
    let group_out = tmp.path().join("group.jsonl");
    ok(
        &data,
        &[
            "export",
            "chat",
            "Tea Party",
            "Tea Party - 2024-1-5@16h52m07s",
            "--out",
            group_out.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read(&group_out).unwrap(),
        std::fs::read(st.join("group chats/Tea Party - 2024-1-5@16h52m07s.jsonl")).unwrap()
    );

    remember(&data);
    let all = ok(&data, &["--json", "memory", "ls"]).json();
    let ids: Vec<&str> = all["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids.len(),
        3,
        "expired memories are hidden by default: {all}"
    );
    assert!(!ids.contains(&"m-old"));
    let with_expired = ok(&data, &["--json", "memory", "ls", "--include-expired"]).json();
    let old = with_expired["memories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "m-old")
        .expect("--include-expired lists the expired memory");
    assert_eq!(old["state"], "expired");
    let scoped = ok(
        &data,
        &[
            "--json",
            "memory",
            "ls",
            "--scope",
            "chat",
            "--character",
            "Seraphina",
            "--chat",
            SERAPHINA_CHAT,
        ],
    )
    .json();
    let glade = &scoped["memories"][0];
    assert_eq!(scoped["count"], 1);
    assert_eq!(glade["id"], "m-glade");
    assert_eq!(glade["source"]["toolCallId"], "call-7");
    assert_eq!(glade["source"]["session"], "s1");
    assert!(glade["revision"].as_str().unwrap().starts_with("r1-"));
    let table = ok(&data, &["memory", "ls"]).stdout;
    assert!(
        table.contains("tool call call-7 (session s1, turn 3)"),
        "{table}"
    );

    let hits = ok(&data, &["--json", "memory", "search", "amber eyes"]).json();
    assert_eq!(hits["hits"][0]["id"], "m-amber", "{hits}");
    let tea = ok(&data, &["--json", "memory", "search", "乌龙茶"]).json();
    assert_eq!(tea["hits"][0]["id"], "m-tea", "{tea}");

    // Memories as a world book SillyTavern (and we) can load.
    let world = tmp.path().join("memories.json");
    ok(
        &data,
        &["export", "memories", "--world", world.to_str().unwrap()],
    );
    let bytes = std::fs::read(&world).unwrap();
    let book = WorldBook::from_json("memories", &bytes).unwrap();
    assert_eq!(book.entries.len(), 3);
    let amber = book
        .entries
        .iter()
        .find(|e| e.content.contains("amber eyes"))
        .unwrap();
    assert_eq!(amber.keys[0], "eyes", "tags come first: {:?}", amber.keys);
    assert!(amber
        .keys
        .iter()
        .any(|k| k == "amber" || k == "eldoria" || k == "forest"));
    assert!(!amber.keys.iter().any(|k| k == "the" || k == "and"));
    assert!(amber.comment.contains("m-amber") && amber.comment.contains("r1-"));
    assert!(amber.comment.contains("character:Seraphina") && amber.comment.contains("s1"));
    let raw: Value = serde_json::from_slice(&bytes).unwrap();
    let entry = &raw["entries"]["0"];
    for field in [
        "uid",
        "key",
        "keysecondary",
        "comment",
        "content",
        "order",
        "position",
    ] {
        assert!(entry.get(field).is_some(), "world entries carry {field}");
    }
    assert_eq!(entry["selective"], true);
    assert_eq!(entry["disable"], false);
    // An existing file is never replaced without --force.
    let again = tavern(
        &data,
        &["export", "memories", "--world", world.to_str().unwrap()],
    );
    assert_eq!(again.code, 1);
    again.one_error_line("--force");
    assert_eq!(std::fs::read(&world).unwrap(), bytes);

    // Re-importing changes nothing and says why each file is skipped.
    let before = snapshot(&data);
    let second = ok(&data, &["--json", "import-st", st_arg]).json();
    assert_eq!(second["summary"]["imported"], 0, "{second}");
    assert_eq!(second["summary"]["alreadyImported"], 8);
    assert_eq!(snapshot(&data), before);
    let text = ok(&data, &["import-st", st_arg, "--dry-run"]).stdout;
    assert!(text.contains("already-imported"), "{text}");
    assert_eq!(snapshot(&data), before);

    // A chat continued in SillyTavern since is updated by appending (#29).
    let edited = st.join(format!("chats/Seraphina/{SERAPHINA_CHAT}.jsonl"));
    let mut text = std::fs::read_to_string(&edited).unwrap();
    text.push_str("\n{\"name\":\"You\",\"is_user\":true,\"send_date\":3,\"mes\":\"later\"}");
    std::fs::write(&edited, &text).unwrap();
    let third = ok(&data, &["--json", "import-st", st_arg]).json();
    assert_eq!(third["summary"]["updated"], 1, "{third}");
    // One that diverged (an earlier line edited) is a conflict, left alone.
    let before = snapshot(&data);
    std::fs::write(&edited, text.replacen("\"mes\":\"", "\"mes\":\"edited ", 1)).unwrap();
    let fourth = ok(&data, &["--json", "import-st", st_arg]).json();
    assert_eq!(fourth["summary"]["conflict"], 1, "{fourth}");
    assert_eq!(snapshot(&data), before);
}

/// #29 item 3: a user folder's `settings.json` (built as SillyTavern writes it: no public one
/// was found) gives its personas to the import — only the persona fields are kept, never the
/// API settings and proxies beside them — and a second import finds them already there.
#[test]
fn import_st_keeps_the_personas_of_settings_json_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let st = st_folder(tmp.path());
    let data = tmp.path().join("data");
    let settings = json!({
        "username": "Kai",
        "user_avatar": "user-default.png",
        "main_api": "openai",
        "proxies": [{"name": "mine", "url": "https://proxy.example", "password": "hunter2"}],
        "power_user": {
            "personas": {"user-default.png": "白羽", "1700000000000-knight.png": "Sir Aldous"},
            "persona_descriptions": {
                "user-default.png": {"description": "一名来自北方的旅人。", "position": 0, "depth": 2, "role": 0},
            },
            "default_persona": "1700000000000-knight.png",
            "persona_description": "",
        },
    });
    std::fs::write(st.join("settings.json"), settings.to_string()).unwrap();
    let settings_item = |report: &Value| {
        report["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["kind"] == "settings")
            .unwrap()
            .clone()
    };
    let first = ok(&data, &["--json", "import-st", st.to_str().unwrap()]).json();
    let item = settings_item(&first);
    assert_eq!(item["result"], "imported", "{item}");
    assert_eq!(item["target"], "assets/settings.json");
    let kept = std::fs::read_to_string(data.join("assets/settings.json")).unwrap();
    assert!(
        kept.contains("Sir Aldous") && kept.contains("一名来自北方的旅人。"),
        "{kept}"
    );
    assert!(
        !kept.contains("hunter2") && !kept.contains("proxy") && !kept.contains("openai"),
        "{kept}"
    );
    let again = ok(&data, &["--json", "import-st", st.to_str().unwrap()]).json();
    assert_eq!(settings_item(&again)["result"], "already-imported");
    // Not an object: reported, the rest imported.
    std::fs::write(st.join("settings.json"), "[1]").unwrap();
    let bad = ok(&data, &["--json", "import-st", st.to_str().unwrap()]).json();
    let item = settings_item(&bad);
    assert_eq!(item["result"], "invalid", "{item}");
    assert!(item["reason"].as_str().unwrap().contains("settings.json"));
}

#[test]
fn bad_input_is_one_error_line_a_nonzero_exit_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let st = st_folder(tmp.path());
    let data = tmp.path().join("data");
    ok(&data, &["import-st", st.to_str().unwrap()]);
    remember(&data);
    let glade = ok(&data, &["--json", "memory", "show", "m-glade"]).json();
    let rev = glade["revision"].as_str().unwrap().to_owned();
    let stale = "r1-00000000000000000000000000000000";
    ok(
        &data,
        &["var", "set", "mood", "\"calm\"", "--scope", "global"],
    );
    let broken_json = tmp.path().join("broken.json");
    std::fs::write(&broken_json, "{\"spec\": \"chara_card_v2\", \"data\": {").unwrap();
    let nameless = tmp.path().join("nameless.json");
    std::fs::write(
        &nameless,
        r#"{"spec":"chara_card_v2","data":{"description":"x"}}"#,
    )
    .unwrap();
    let missing = tmp.path().join("no-such-folder");
    let not_st = tmp.path().join("empty");
    std::fs::create_dir_all(&not_st).unwrap();
    let not_a_card = fixtures().join("cards/not-a-card.user-default.png");
    let out = tmp.path().join("x.jsonl");

    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["import-st", missing.to_str().unwrap()],
            1,
            "no-such-folder",
        ),
        (
            vec!["import-st", not_st.to_str().unwrap()],
            1,
            "not a SillyTavern user folder",
        ),
        (
            vec!["card", "validate", not_a_card.to_str().unwrap()],
            1,
            "not a character card",
        ),
        (
            vec!["card", "validate", broken_json.to_str().unwrap()],
            1,
            "unreadable json",
        ),
        (
            vec!["card", "validate", nameless.to_str().unwrap()],
            1,
            "no name",
        ),
        (vec!["memory", "ls", "--scope", "planet"], 2, "planet"),
        (
            vec![
                "memory",
                "ls",
                "--scope",
                "chat",
                "--character",
                "Seraphina",
            ],
            2,
            "--chat",
        ),
        (
            vec!["memory", "ls", "--character", "Seraphina"],
            2,
            "--scope",
        ),
        (
            vec!["var", "ls", "--scope", "agent", "--agent", "../x"],
            2,
            "agent id",
        ),
        (vec!["memory", "show", "m-nothing"], 1, "m-nothing"),
        (
            vec!["memory", "forget", "m-glade", "--revision", stale],
            3,
            "revision conflict",
        ),
        (
            vec!["memory", "forget", "m-glade", "--revision", stale],
            3,
            "then pass --revision",
        ),
        (
            vec![
                "var",
                "set",
                "never-set",
                "1",
                "--scope",
                "global",
                "--revision",
                "r1-00000000000000000000000000000000",
            ],
            3,
            "leave out --revision to create it",
        ),
        (
            vec!["memory", "forget", "m-glade", "--revision", "nonsense"],
            2,
            "--revision",
        ),
        (
            vec!["memory", "restore", "m-glade", "--revision", &rev],
            1,
            "not forgotten",
        ),
        (
            vec!["var", "set", "mood", "{not json", "--scope", "global"],
            2,
            "not json",
        ),
        (
            vec!["var", "set", "mood", "\"x\"", "--scope", "global"],
            3,
            "revision conflict",
        ),
        (
            vec![
                "var",
                "set",
                "mood",
                "\"x\"",
                "--scope",
                "global",
                "--revision",
                stale,
            ],
            3,
            "mood",
        ),
        (
            vec!["var", "set", "9lives", "1", "--scope", "global"],
            2,
            "9lives",
        ),
        (
            vec![
                "var",
                "rm",
                "mood",
                "--revision",
                stale,
                "--scope",
                "global",
            ],
            3,
            "mood",
        ),
        (
            vec!["var", "get", "absent", "--scope", "global"],
            1,
            "absent",
        ),
        (vec!["chat", "show", "Seraphina", "nope"], 1, "nope"),
        (
            vec![
                "chat",
                "replay",
                "s1",
                "--sessions-root",
                missing.to_str().unwrap(),
            ],
            1,
            "no-such-folder",
        ),
        (
            vec![
                "export",
                "chat",
                "Seraphina",
                "nope",
                "--out",
                out.to_str().unwrap(),
            ],
            1,
            "nope",
        ),
        (vec!["memory", "frobnicate"], 2, "frobnicate"),
    ];
    for (args, code, needle) in cases {
        let before = snapshot(tmp.path());
        let run = tavern(&data, &args);
        assert_eq!(run.code, code, "tavern {args:?}: {}", run.stderr);
        run.one_error_line(needle);
        assert!(
            run.stdout.is_empty(),
            "tavern {args:?} printed {}",
            run.stdout
        );
        assert_eq!(
            snapshot(tmp.path()),
            before,
            "tavern {args:?} changed files"
        );
    }
    // Reading commands never create a store.
    let fresh = tmp.path().join("fresh");
    let run = tavern(&fresh, &["memory", "ls"]);
    assert_eq!(run.code, 1);
    run.one_error_line("no store");
    assert!(!fresh.exists());
}

#[test]
fn forget_and_restore_need_the_current_revision_and_leave_an_audit_trail() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    remember(&data);
    let shown = ok(&data, &["--json", "memory", "show", "m-amber"]).json();
    let r1 = shown["revision"].as_str().unwrap().to_owned();
    assert_eq!(shown["state"], "live");

    let forgot = ok(
        &data,
        &["--json", "memory", "forget", "m-amber", "--revision", &r1],
    )
    .json();
    let r2 = forgot["memory"]["revision"].as_str().unwrap().to_owned();
    assert_ne!(r1, r2);
    assert_eq!(forgot["memory"]["state"], "forgotten");
    let live = ok(&data, &["--json", "memory", "ls"]).json();
    assert!(
        !live.to_string().contains("m-amber"),
        "forgotten memories are hidden"
    );
    let all = ok(&data, &["--json", "memory", "ls", "--include-deleted"]).json();
    assert!(all.to_string().contains("m-amber"));

    // Forgetting twice, or restoring at the revision before the forget, changes nothing.
    let again = tavern(&data, &["memory", "forget", "m-amber", "--revision", &r2]);
    assert_eq!(again.code, 1);
    again.one_error_line("already forgotten");
    let stale = tavern(&data, &["memory", "restore", "m-amber", "--revision", &r1]);
    assert_eq!(stale.code, 3);
    stale.one_error_line(&r2);

    let restored = ok(
        &data,
        &["--json", "memory", "restore", "m-amber", "--revision", &r2],
    )
    .json();
    assert_eq!(restored["memory"]["state"], "live");
    assert_eq!(
        restored["memory"]["content"],
        "Seraphina has amber eyes and guards the forest of Eldoria."
    );
    let r3 = restored["memory"]["revision"].as_str().unwrap().to_owned();

    let history = ok(&data, &["--json", "memory", "history", "m-amber"]).json();
    let trail: Vec<(String, String, String)> = history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["revision"].as_str().unwrap().to_owned(),
                e["source"]["kind"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        trail,
        vec![
            ("created".into(), r1, "tool".into()),
            ("forgotten".into(), r2, "user".into()),
            ("restored".into(), r3, "user".into()),
        ]
    );
    let text = ok(&data, &["memory", "history", "m-amber"]).stdout;
    assert!(
        text.contains("restored") && text.contains("tool call call-7"),
        "{text}"
    );
}

#[test]
fn variables_are_typed_json_with_compare_and_set() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let scope = ["--scope", "character", "--character", "Seraphina"];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(scope.iter())
            .map(|s| (*s).to_owned())
            .collect()
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        tavern(&data, &refs)
    };
    let set = run(with(&[
        "--json",
        "var",
        "set",
        "好感度",
        r#"{"level": 3, "tags": ["kind"]}"#,
    ]));
    assert_eq!(set.code, 0, "{}", set.stderr);
    let r1 = set.json()["revision"].as_str().unwrap().to_owned();
    let got = run(with(&["--json", "var", "get", "好感度"])).json();
    assert_eq!(got["value"], json!({"level": 3, "tags": ["kind"]}));
    assert_eq!(got["revision"], r1.as_str());

    // Changing needs the current revision; the stale one changes nothing.
    let conflict = run(with(&["var", "set", "好感度", "4"]));
    assert_eq!(conflict.code, 3);
    // The line says what to pass to change it.
    conflict.one_error_line(&format!("pass --revision {r1} to change it"));
    let set2 = run(with(&[
        "--json",
        "var",
        "set",
        "好感度",
        "4",
        "--revision",
        &r1,
    ]));
    assert_eq!(set2.code, 0, "{}", set2.stderr);
    let r2 = set2.json()["revision"].as_str().unwrap().to_owned();
    let stale = run(with(&["var", "set", "好感度", "5", "--revision", &r1]));
    assert_eq!(stale.code, 3);
    assert_eq!(
        run(with(&["--json", "var", "get", "好感度"])).json()["value"],
        4
    );

    run(with(&["var", "set", "mood", "\"calm\""]));
    let listing = run(with(&["--json", "var", "ls"])).json();
    let names: Vec<&str> = listing["variables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["mood", "好感度"]);
    assert_eq!(listing["variables"][1]["type"], "number");
    assert_eq!(listing["variables"][1]["revision"], r2.as_str());
    assert!(listing["scopeRevision"]
        .as_str()
        .unwrap()
        .starts_with("r1-"));

    let rm_stale = run(with(&["var", "rm", "好感度", "--revision", &r1]));
    assert_eq!(rm_stale.code, 3);
    let rm = run(with(&["var", "rm", "好感度", "--revision", &r2]));
    assert_eq!(rm.code, 0, "{}", rm.stderr);
    let gone = run(with(&["var", "get", "好感度"]));
    assert_eq!(gone.code, 1);
    gone.one_error_line("not found");
}

/// #30 F4: `card validate` names the lore keys a search could not use as written: one that
/// does not compile, one that gives up at its step limit; real cards' keys give no warning.
#[test]
fn card_validate_warns_about_lore_keys_that_cannot_be_used() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("unused");
    let card = tmp.path().join("hostile.json");
    std::fs::write(
        &card,
        json!({"spec": "chara_card_v3", "spec_version": "3.0", "data": {"name": "Mira", "first_mes": "Hello.",
        "character_book": {"name": "Mira's book", "entries": [
            {"id": 1, "keys": [r"/(a|a)*\1c/"], "content": "slow", "enabled": true},
            {"id": 2, "keys": ["/(a/"], "content": "broken", "enabled": true},
            {"id": 3, "keys": ["/(a|a)*c/", r"/\bMira\b/i"], "content": "fine", "enabled": true}
        ]}}})
        .to_string(),
    )
    .unwrap();
    let out = ok(
        &data,
        &["--json", "card", "validate", card.to_str().unwrap()],
    )
    .json();
    let warnings: Vec<String> = serde_json::from_value(out["warnings"].clone()).unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].starts_with("entry ") && warnings[0].contains("backtracking steps"),
        "{warnings:?}"
    );
    assert!(warnings[1].contains("cannot be used"), "{warnings:?}");
    let real = ok(
        &data,
        &[
            "--json",
            "card",
            "validate",
            fixtures()
                .join("cards/Sakana.v2.book14.png")
                .to_str()
                .unwrap(),
        ],
    )
    .json();
    assert_eq!(real["warnings"], json!([]), "{real}");
}

#[test]
fn card_validate_reports_what_a_card_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("unused");
    let f = fixtures();
    let v3 = ok(
        &data,
        &[
            "--json",
            "card",
            "validate",
            f.join("cards/Seraphina.v2v3.book4.png").to_str().unwrap(),
        ],
    )
    .json();
    assert_eq!(v3["spec"], "v3");
    assert_eq!(v3["name"], "Seraphina");
    assert_eq!(v3["embeddedBook"]["entries"], 4);
    assert_eq!(v3["linkedWorld"], "Eldoria");
    assert_eq!(v3["chunks"], json!(["chara", "ccv3"]));
    let v1 = ok(
        &data,
        &[
            "card",
            "validate",
            f.join("cards/Megumin.v1.png").to_str().unwrap(),
        ],
    )
    .stdout;
    assert!(v1.contains("v1") && v1.contains("Megumin"), "{v1}");
    let book14 = ok(
        &data,
        &[
            "--json",
            "card",
            "validate",
            f.join("cards/Sakana.v2.book14.png").to_str().unwrap(),
        ],
    )
    .json();
    assert_eq!(book14["spec"], "v2");
    assert_eq!(book14["embeddedBook"]["entries"], 14);

    // A JSON card with a lone surrogate (as JavaScript writes them) is repaired, and says so.
    let lone = tmp.path().join("lone.json");
    std::fs::write(
        &lone,
        r#"{"spec":"chara_card_v3","spec_version":"3.0","data":{"name":"Mira","first_mes":"Hi \ud83d there"}}"#,
    )
    .unwrap();
    let repaired = ok(
        &data,
        &["--json", "card", "validate", lone.to_str().unwrap()],
    )
    .json();
    assert_eq!(repaired["spec"], "v3");
    assert!(
        repaired["warnings"].to_string().contains("surrogates"),
        "{repaired}"
    );
    assert!(
        !data.exists(),
        "validating a card touches no data directory"
    );
}

#[test]
fn check_finds_corrupt_lines_and_set_aside_files_without_changing_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let st = st_folder(tmp.path());
    let data = tmp.path().join("data");
    ok(&data, &["import-st", st.to_str().unwrap()]);
    remember(&data);
    ok(
        &data,
        &["var", "set", "mood", "\"calm\"", "--scope", "global"],
    );
    let r = ok(
        &data,
        &["--json", "var", "get", "mood", "--scope", "global"],
    )
    .json();
    let rev = r["revision"].as_str().unwrap().to_owned();
    ok(
        &data,
        &[
            "var",
            "set",
            "mood",
            "\"tense\"",
            "--scope",
            "global",
            "--revision",
            &rev,
        ],
    );

    let before = snapshot(&data);
    let clean = ok(&data, &["--json", "check"]).json();
    assert_eq!(clean["ok"], true, "{clean}");
    // memory.log, variables.log and three chats.
    assert_eq!(clean["files"], 5, "{clean}");
    assert_eq!(snapshot(&data), before, "check changes nothing");

    // Compaction keeps every revision chain verifiable.
    let compacted = ok(&data, &["--json", "compact"]).json();
    assert_eq!(compacted["variables"]["before"], 2);
    assert_eq!(compacted["variables"]["after"], 1);
    assert_eq!(compacted["memory"]["after"], 4);
    assert_eq!(ok(&data, &["--json", "check"]).json()["ok"], true);
    assert_eq!(
        ok(
            &data,
            &["--json", "var", "get", "mood", "--scope", "global"]
        )
        .json()["value"],
        "tense"
    );

    // One edited byte in a memory line, and a set-aside checkpoint.
    let log = data.join("memory.log");
    let text = std::fs::read_to_string(&log).unwrap();
    let damaged = text.replacen("amber eyes", "green eyes", 1);
    assert_ne!(damaged, text);
    std::fs::write(&log, &damaged).unwrap();
    std::fs::write(data.join("checkpoints/_s1.json.corrupt-1700000000000"), "{").unwrap();
    let before = snapshot(&data);
    let run = tavern(&data, &["check"]);
    assert_eq!(run.code, 4, "{}", run.stdout);
    let line = damaged
        .lines()
        .position(|l| l.contains("green eyes"))
        .unwrap()
        + 1;
    assert!(
        run.stdout.contains(&format!("memory.log line {line}")) && run.stdout.contains("checksum"),
        "{}",
        run.stdout
    );
    assert!(run
        .stdout
        .contains("checkpoints/_s1.json.corrupt-1700000000000"));
    assert!(
        !run.stdout.contains(tmp.path().to_str().unwrap()),
        "names are relative"
    );
    assert_eq!(snapshot(&data), before, "check never modifies");
    let json = tavern(&data, &["--json", "check"]);
    assert_eq!(json.code, 4);
    assert_eq!(json.json()["problems"].as_array().unwrap().len(), 2);

    // An edit that keeps the checksum right (a foreign writer) still breaks the revision chain.
    let forged: Vec<String> = text
        .lines()
        .map(|l| {
            let payload = l.split_once(' ').unwrap().1;
            if payload.contains("amber eyes") {
                let payload = payload.replacen("amber eyes", "green eyes", 1);
                format!("{} {payload}", short_digest(&[payload.as_bytes()]))
            } else {
                l.to_owned()
            }
        })
        .collect();
    std::fs::write(&log, forged.join("\n") + "\n").unwrap();
    std::fs::remove_file(data.join("checkpoints/_s1.json.corrupt-1700000000000")).unwrap();
    let run = tavern(&data, &["check"]);
    assert_eq!(run.code, 4, "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!("memory.log line {line}"))
            && run.stdout.contains("memory m-amber: revision")
            && run.stdout.contains("does not match its content"),
        "{}",
        run.stdout
    );
}

/// #30 F10: a directory, a FIFO or a link to a device where a log or the state belongs is a
/// problem `tavern check` names — without opening it (a FIFO would block, `/dev/zero` never
/// end) — not "no problems".
#[test]
fn check_names_what_is_not_a_file_where_a_file_belongs() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    drop(FsStore::open(&data, Arc::new(SystemClock)).unwrap());
    let _ = std::fs::remove_file(data.join("memory.log"));
    std::fs::create_dir(data.join("memory.log")).unwrap();
    let _ = std::fs::remove_file(data.join("variables.log"));
    let fifo = std::process::Command::new("mkfifo")
        .arg(data.join("variables.log"))
        .status()
        .unwrap();
    assert!(fifo.success());
    std::os::unix::fs::symlink("/dev/zero", data.join("state.json")).unwrap();
    let run = tavern(&data, &["--json", "check"]);
    assert_eq!(run.code, 4, "{}", run.stdout);
    let problems = run.json()["problems"].to_string();
    for (file, what) in [
        ("memory.log", "a directory"),
        ("variables.log", "a FIFO"),
        ("state.json", "a symbolic link"),
    ] {
        assert!(
            problems.contains(file) && problems.contains(what),
            "{file}: {problems}"
        );
    }
}

/// #30 F7–F9: `import-st` takes a legal 240-byte card name, never follows a link (out of the
/// folder, or to a device), and reports a file over the size limit; each of these is one line
/// of the report, and every other file is imported.
#[test]
fn import_st_reports_what_it_will_not_read_and_imports_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("default-user");
    let data = tmp.path().join("data");
    let outside = tmp.path().join("elsewhere");
    for d in ["characters", "chats/Mira", "worlds"] {
        std::fs::create_dir_all(st.join(d)).unwrap();
    }
    std::fs::create_dir_all(&outside).unwrap();
    let card = |name: &str| {
        json!({"spec": "chara_card_v3", "spec_version": "3.0", "data": {"name": name, "first_mes": "Hello."}})
            .to_string()
    };
    let long = "名".repeat(80);
    assert_eq!(long.len(), 240);
    std::fs::write(st.join(format!("characters/{long}.json")), card(&long)).unwrap();
    std::fs::write(st.join("characters/Mira.json"), card("Mira")).unwrap();
    std::fs::write(outside.join("Secret.json"), card("Secret")).unwrap();
    std::os::unix::fs::symlink(
        outside.join("Secret.json"),
        st.join("characters/Secret.json"),
    )
    .unwrap();
    std::os::unix::fs::symlink("/dev/zero", st.join("characters/Zero.png")).unwrap();
    std::fs::create_dir_all(outside.join("Theirs")).unwrap();
    std::os::unix::fs::symlink(outside.join("Theirs"), st.join("chats/Theirs")).unwrap();
    let header = r#"{"user_name":"User","character_name":"Mira","create_date":"2024-01-01@00h00m00s","chat_metadata":{}}"#;
    let line =
        r#"{"name":"Mira","is_user":false,"send_date":"2024-01-01@00h00m01s","mes":"Hello."}"#;
    std::fs::write(
        st.join("chats/Mira/small.jsonl"),
        format!("{header}\n{line}\n"),
    )
    .unwrap();
    std::fs::write(
        outside.join("Theirs/private.jsonl"),
        format!("{header}\n{line}\n"),
    )
    .unwrap();
    // Over a 1 MiB limit (sparse: nothing near that size is ever read).
    let big = std::fs::File::create(st.join("chats/Mira/huge.jsonl")).unwrap();
    big.set_len(3 << 20).unwrap();

    let st_arg = st.to_str().unwrap();
    let out = ok(
        &data,
        &["--json", "import-st", st_arg, "--max-file-mib", "1"],
    )
    .json();
    let items = out["items"].as_array().unwrap();
    let result = |source: &str| -> (String, String) {
        let item = items
            .iter()
            .find(|i| i["source"] == source)
            .unwrap_or_else(|| panic!("{source} is not in the report: {out}"));
        (
            item["result"].as_str().unwrap().to_owned(),
            item["reason"].as_str().unwrap_or_default().to_owned(),
        )
    };
    assert_eq!(result(&format!("characters/{long}.json")).0, "imported");
    assert_eq!(result("characters/Mira.json").0, "imported");
    assert_eq!(result("chats/Mira/small.jsonl").0, "imported");
    for link in [
        "characters/Secret.json",
        "characters/Zero.png",
        "chats/Theirs",
    ] {
        let (r, why) = result(link);
        assert_eq!(r, "invalid", "{link}");
        assert!(why.contains("symbolic link"), "{link}: {why}");
    }
    let (r, why) = result("chats/Mira/huge.jsonl");
    assert_eq!(r, "invalid");
    assert!(why.contains("over the 1 MiB limit"), "{why}");
    // Nothing from outside the folder reached the store or the assets.
    assert!(!data.join("assets/characters/Secret.json").exists());
    let chats = ok(&data, &["--json", "chat", "ls", "--character", "Theirs"]).json();
    assert_eq!(chats["chats"], json!([]), "{chats}");
}

/// #29 item 6: a chat continued in SillyTavern after its import is updated by appending on the
/// next import (the stored copy being where the file begins); one that diverged stays a
/// reported conflict, unchanged; a chat file outside a character folder is reported, not
/// silently passed over.
#[test]
fn import_st_appends_what_was_added_to_a_chat_since_and_reports_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("default-user");
    let data = tmp.path().join("data");
    std::fs::create_dir_all(st.join("chats/Mira")).unwrap();
    let header = r#"{"user_name":"User","character_name":"Mira","create_date":"2024-01-01@00h00m00s","chat_metadata":{}}"#;
    let line = |i: usize| {
        format!(
            r#"{{"name":"Mira","is_user":false,"send_date":"2024-01-01@00h00m0{i}s","mes":"line {i} 第{i}行"}}"#
        )
    };
    // Lines joined by newlines, none after the last: as SillyTavern writes a chat.
    let write = |name: &str, n: usize| {
        let lines: Vec<String> = std::iter::once(header.to_owned())
            .chain((0..n).map(line))
            .collect();
        std::fs::write(st.join("chats/Mira").join(name), lines.join("\n")).unwrap();
    };
    write("kept.jsonl", 2);
    write("diverged.jsonl", 2);
    let st_arg = st.to_str().unwrap();
    let first = ok(&data, &["--json", "import-st", st_arg]).json();
    assert_eq!(first["summary"]["imported"], 2, "{first}");

    // Continued in SillyTavern: three more lines. Edited in SillyTavern: a line replaced.
    write("kept.jsonl", 5);
    let mut diverged = std::fs::read_to_string(st.join("chats/Mira/diverged.jsonl")).unwrap();
    diverged = diverged.replace("line 1 第1行", "an edited line");
    std::fs::write(st.join("chats/Mira/diverged.jsonl"), &diverged).unwrap();
    std::fs::write(
        st.join("chats/loose.jsonl"),
        format!("{header}\n{}\n", line(0)),
    )
    .unwrap();

    let dry = ok(&data, &["--json", "import-st", st_arg, "--dry-run"]).json();
    assert_eq!(dry["summary"]["wouldUpdate"], 1, "{dry}");
    let second = ok(&data, &["--json", "import-st", st_arg]).json();
    let item = |source: &str| {
        second["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["source"] == source)
            .cloned()
            .unwrap_or_else(|| panic!("{source}: {second}"))
    };
    let kept = item("chats/Mira/kept.jsonl");
    assert_eq!(
        (kept["result"].clone(), kept["appended"].clone()),
        (json!("updated"), json!(3))
    );
    assert_eq!(item("chats/Mira/diverged.jsonl")["result"], "conflict");
    let loose = item("chats/loose.jsonl");
    assert!(
        loose["reason"]
            .as_str()
            .unwrap()
            .contains("outside a character folder"),
        "{loose}"
    );
    // The store's copy is now the file, byte for byte; the diverged one is as it was imported.
    let shown = ok(&data, &["chat", "show", "Mira", "kept"]).stdout;
    for i in 0..5 {
        assert!(shown.contains(&format!("line {i} 第{i}行")), "{shown}");
    }
    let exported = tmp.path().join("kept.jsonl");
    ok(
        &data,
        &[
            "export",
            "chat",
            "Mira",
            "kept",
            "--out",
            exported.to_str().unwrap(),
        ],
    );
    assert_eq!(
        std::fs::read(&exported).unwrap(),
        std::fs::read(st.join("chats/Mira/kept.jsonl")).unwrap()
    );
    let other = ok(&data, &["chat", "show", "Mira", "diverged"]).stdout;
    assert!(other.contains("line 1 第1行") && !other.contains("an edited line"));
    // A third import changes nothing.
    let third = ok(&data, &["--json", "import-st", st_arg]).json();
    assert_eq!(third["summary"]["updated"], 0, "{third}");
}

/// #29 item 7: without `--data`, `tavern` finds the store the DSH plugin writes
/// (`$DSH_HOME/agent-tavern`, `~/.dsh` by default) — after a DSH session, `tavern memory ls`
/// shows its memories; `TAVERN_DATA` says otherwise; two stores are a question, not a guess.
#[test]
fn without_data_the_dsh_plugins_store_is_found() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let xdg = tmp.path().join("xdg");
    let run = |envs: &[(&str, &Path)], args: &[&str]| {
        let mut c = Command::cargo_bin("tavern").unwrap();
        c.args(args)
            .env_remove("RUST_LOG")
            .env_remove("DSH_HOME")
            .env_remove("TAVERN_DATA")
            .env_remove("TAVERN_STORE")
            .env("HOME", &home)
            .env("XDG_DATA_HOME", &xdg);
        for (k, v) in envs {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let dsh_store = home.join(".dsh/agent-tavern");
    remember(&dsh_store);
    let (code, out, err) = run(&[], &["--json", "memory", "ls"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("m-glade"), "{out}");
    // DSH_HOME moves DSH's home, and the store with it.
    let moved = tmp.path().join("dsh-home");
    std::fs::create_dir_all(&moved).unwrap();
    std::fs::rename(&dsh_store, moved.join("agent-tavern")).unwrap();
    let (code, out, err) = run(&[("DSH_HOME", &moved)], &["--json", "memory", "ls"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("m-glade"), "{out}");
    // A per-user store as well: the user says which.
    remember(&xdg.join("agent-tavern"));
    let (code, _, err) = run(&[("DSH_HOME", &moved)], &["memory", "ls"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("two stores") && err.contains("--data"),
        "{err}"
    );
    let (code, _, err) = run(
        &[
            ("DSH_HOME", &moved),
            ("TAVERN_DATA", &moved.join("agent-tavern")),
        ],
        &["memory", "ls"],
    );
    assert_eq!(code, 0, "{err}");
}

/// #29 item 6: what an imported card or chat points at and is not there — a linked world, a
/// branch's parent chat — is a warning, not silence; what is there is not.
#[test]
fn import_st_warns_about_missing_worlds_and_parents() {
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("default-user");
    let data = tmp.path().join("data");
    for d in ["characters", "worlds", "chats/Mira"] {
        std::fs::create_dir_all(st.join(d)).unwrap();
    }
    let card = |name: &str, world: &str| {
        json!({"spec": "chara_card_v3", "spec_version": "3.0", "data": {"name": name,
            "first_mes": "Hello.", "extensions": {"world": world}}})
        .to_string()
    };
    std::fs::write(st.join("characters/Mira.json"), card("Mira", "Gone World")).unwrap();
    std::fs::write(st.join("characters/Kai.json"), card("Kai", "Eldoria")).unwrap();
    std::fs::write(st.join("worlds/Eldoria.json"), r#"{"entries": {}}"#).unwrap();
    let chat = |parent: &str| {
        format!(
            "{}\n{}",
            json!({"user_name": "User", "character_name": "Mira", "create_date": "x", "chat_metadata": {"main_chat": parent}}),
            r#"{"name":"Mira","is_user":false,"send_date":"x","mes":"Hi."}"#
        )
    };
    std::fs::write(st.join("chats/Mira/root.jsonl"), chat("")).unwrap();
    std::fs::write(st.join("chats/Mira/branch.jsonl"), chat("root")).unwrap();
    std::fs::write(st.join("chats/Mira/orphan.jsonl"), chat("deleted long ago")).unwrap();
    let run = ok(&data, &["import-st", st.to_str().unwrap()]);
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("characters/Mira.json") && w.contains("\"Gone World\"")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("chats/Mira/orphan.jsonl") && w.contains("\"deleted long ago\"")),
        "{warnings:?}"
    );
    assert!(
        !run.stderr.contains("Kai.json"),
        "Eldoria is there: {warnings:?}"
    );
    assert!(
        !run.stderr.contains("branch.jsonl"),
        "root is there: {warnings:?}"
    );
    assert_eq!(warnings.len(), 2, "{warnings:?}");
}

#[test]
fn listings_page_past_one_search_and_show_every_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let store = FsStore::open(&data, Arc::new(SystemClock)).unwrap();
    // One import: every record has the same time, so only the id breaks ties.
    let writes: Vec<MemoryWrite> = (0..250)
        .map(|i| {
            write(
                &format!("m{i:03}"),
                ScopeKey::Global,
                &format!("fact number {i}"),
                &[],
            )
        })
        .collect();
    store.import_memories(writes).unwrap();
    drop(store);
    let all = ok(&data, &["--json", "memory", "ls"]).json();
    let mut ids: Vec<&str> = all["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 250);
    ids.dedup();
    assert_eq!(ids.len(), 250, "no memory listed twice");
    let some = ok(&data, &["--json", "memory", "ls", "--limit", "120"]).json();
    assert_eq!(some["count"], 120);
    let shown = ok(&data, &["--json", "memory", "show", "m249"]).json();
    assert_eq!(shown["content"], "fact number 249");
    let world = tmp.path().join("all.json");
    ok(
        &data,
        &["export", "memories", "--world", world.to_str().unwrap()],
    );
    let book = WorldBook::from_json("all", &std::fs::read(&world).unwrap()).unwrap();
    assert_eq!(book.entries.len(), 250);
}

/// `memory search --offset` pages through more matches than one search returns: the pages
/// meet exactly, the text names the next page's offset, and an offset past the deepest is a
/// usage error.
#[test]
fn memory_search_pages_by_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let store = FsStore::open(&data, Arc::new(SystemClock)).unwrap();
    let writes: Vec<MemoryWrite> = (0..25)
        .map(|i| {
            let words = "lantern ".repeat(i % 4);
            write(
                &format!("m{i:02}"),
                ScopeKey::Global,
                &format!("fact number {i} {words}"),
                &[],
            )
        })
        .collect();
    store.import_memories(writes).unwrap();
    drop(store);
    let mut ids = Vec::new();
    for offset in ["0", "10", "20", "30"] {
        let page = ok(
            &data,
            &[
                "--json", "memory", "search", "fact", "--limit", "10", "--offset", offset,
            ],
        )
        .json();
        assert_eq!(page["offset"], offset.parse::<u64>().unwrap());
        assert_eq!(page["sourceCount"], 25);
        assert_eq!(page["truncated"], offset == "0" || offset == "10", "{page}");
        for hit in page["hits"].as_array().unwrap() {
            ids.push(hit["id"].as_str().unwrap().to_owned());
        }
    }
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!((ids.len(), sorted.len()), (25, 25), "{ids:?}");
    let page_text = |offset| {
        let args = [
            "memory", "search", "fact", "--limit", "10", "--offset", offset,
        ];
        ok(&data, &args).stdout
    };
    let middle = page_text("10");
    assert!(
        middle.contains("memories 11-20 of 25 matching shown (next page: --offset 20)"),
        "{middle}"
    );
    let last = page_text("20");
    assert!(
        last.contains("memories 21-25 of 25 matching shown\n"),
        "{last}"
    );
    let past = ok(&data, &["memory", "search", "fact", "--offset", "25"]).stdout;
    assert_eq!(past, "no memories past the first 25\n");
    let none = ok(&data, &["memory", "search", "nothing", "--offset", "5"]).stdout;
    assert_eq!(none, "no memories match\n");
    // The deepest offset is accepted; past it, a usage error.
    let deepest = ok(&data, &["memory", "search", "fact", "--offset", "10000"]).stdout;
    assert_eq!(deepest, "no memories past the first 25\n");
    let deep = tavern(&data, &["memory", "search", "fact", "--offset", "10001"]);
    assert_eq!(deep.code, 2);
    deep.one_error_line("--offset 10001: at most 10000");
}

/// Near the deepest offset, the page does not name a next one that would be refused.
#[test]
fn memory_search_names_no_page_past_the_deepest() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let store = FsStore::open(&data, Arc::new(SystemClock)).unwrap();
    let writes: Vec<MemoryWrite> = (0..10_020)
        .map(|i| {
            write(
                &format!("m{i:05}"),
                ScopeKey::Global,
                &format!("fact {i}"),
                &[],
            )
        })
        .collect();
    store.import_memories(writes).unwrap();
    drop(store);
    let args = |offset| {
        [
            "memory", "search", "fact", "--limit", "10", "--offset", offset,
        ]
    };
    let before = ok(&data, &args("9980")).stdout;
    assert!(
        before.contains("memories 9981-9990 of 10020 matching shown (next page: --offset 9990)"),
        "{before}"
    );
    let deep = ok(&data, &args("9995")).stdout;
    assert!(
        deep.contains(
            "memories 9996-10005 of 10020 matching shown (no deeper pages: narrow the search)"
        ),
        "{deep}"
    );
}

#[test]
fn chat_status_and_replay_fill_only_the_gap() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let session = SessionId::parse("s1").unwrap();
    let store = FsStore::open(&data, Arc::new(SystemClock)).unwrap();
    block_on(store.update(|state| {
        state.set_binding(
            session.clone(),
            SessionBinding::AgentTavern {
                target: BindingTarget {
                    character: CharacterName::parse("Seraphina").unwrap(),
                    chat_id: ChatId::parse("Seraphina - replayed").unwrap(),
                    group: false,
                },
                context_mode: ContextMode::DshNative,
            },
        );
        Ok::<_, StoreError>(())
    }))
    .unwrap();
    drop(store);
    let turn = |s: u64, turn: u64, said: &str, reply: &str| {
        vec![
            json!({"type": "turn/start", "seq": s, "time": 1, "data": {"turn": turn}}),
            json!({"type": "user/message", "seq": s + 1, "time": 2, "data": {"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": said}]}}),
            json!({"type": "step/start", "seq": s + 2, "time": 3, "data": {"turn": turn, "step": 1}}),
            json!({"type": "tool/call", "seq": s + 3, "time": 4, "data": {"turn": turn, "step": 1}}),
            json!({"type": "assistant/message", "seq": s + 4, "time": 5, "data": {"turn": turn, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": reply}]}}}),
            json!({"type": "step/end", "seq": s + 5, "time": 6, "data": {"turn": turn, "step": 1}}),
            json!({"type": "turn/end", "seq": s + 6, "time": 7, "data": {"turn": turn, "reason": {"kind": "completed"}}}),
        ]
    };
    let mut events = vec![json!({"type": "session", "seq": 0, "time": 0, "data": {}})];
    events.extend(turn(1, 1, "Where am I?", "In my glade."));
    let sessions = tmp.path().join("sessions");
    let log = sessions.join("profile-a/s1/session.jsonl");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    let write_log = |events: &[Value]| {
        let text: Vec<String> = events.iter().map(Value::to_string).collect();
        std::fs::write(&log, text.join("\n") + "\n").unwrap();
    };
    write_log(&events);

    let before = ok(&data, &["--json", "chat", "status", "s1"]).json();
    assert_eq!(before["sessions"][0]["status"], "none", "{before}");
    assert_eq!(before["sessions"][0]["architecture"], "agent-tavern");

    let root = sessions.to_str().unwrap();
    let first = ok(
        &data,
        &["--json", "chat", "replay", "s1", "--sessions-root", root],
    )
    .json();
    assert_eq!(first["appended"], 2, "{first}");
    assert_eq!(first["cursor"], 7);
    assert_eq!(first["status"], "ok");
    let again = ok(
        &data,
        &["--json", "chat", "replay", "s1", "--sessions-root", root],
    )
    .json();
    assert_eq!(again["appended"], 0, "nothing is written twice: {again}");
    // The host went on without us: the next replay writes just the new turn.
    events.extend(turn(8, 2, "And the beasts?", "Gone, for now."));
    write_log(&events);
    let second = ok(
        &data,
        &["--json", "chat", "replay", "s1", "--sessions-root", root],
    )
    .json();
    assert_eq!(
        second["appended"], 2,
        "a replay fills only the gap: {second}"
    );
    assert_eq!(second["cursor"], 14);

    let shown = ok(
        &data,
        &["chat", "show", "Seraphina", "Seraphina - replayed"],
    )
    .stdout;
    assert_eq!(shown.matches("Where am I?").count(), 1, "{shown}");
    assert_eq!(shown.matches("In my glade.").count(), 1, "{shown}");
    assert_eq!(shown.matches("Gone, for now.").count(), 1, "{shown}");
    let status = ok(&data, &["--json", "chat", "status"]).json();
    assert_eq!(status["sessions"][0]["session"], "s1");
    assert_eq!(status["sessions"][0]["checkpoint"]["lastCursor"], 14);
    let table = ok(&data, &["chat", "status"]).stdout;
    assert!(
        table.contains("agent-tavern/dsh-native") && table.contains("ok"),
        "{table}"
    );

    let unknown = tavern(&data, &["chat", "replay", "s2", "--sessions-root", root]);
    assert_eq!(unknown.code, 1);
    unknown.one_error_line("s2");
}

#[test]
fn every_command_has_help_and_the_exit_codes_are_documented() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let top = ok(&data, &["--help"]).stdout;
    for needle in [
        "import-st",
        "memory",
        "var",
        "chat",
        "export",
        "card",
        "check",
        "compact",
        "Exit codes",
        "3  revision conflict",
    ] {
        assert!(top.contains(needle), "--help lacks {needle}");
    }
    for cmd in [
        vec!["import-st"],
        vec!["memory", "ls"],
        vec!["memory", "search"],
        vec!["memory", "show"],
        vec!["memory", "history"],
        vec!["memory", "forget"],
        vec!["memory", "restore"],
        vec!["var", "ls"],
        vec!["var", "get"],
        vec!["var", "set"],
        vec!["var", "rm"],
        vec!["chat", "ls"],
        vec!["chat", "show"],
        vec!["chat", "status"],
        vec!["chat", "replay"],
        vec!["export", "memories"],
        vec!["export", "chat"],
        vec!["card", "validate"],
        vec!["check"],
        vec!["compact"],
    ] {
        let mut args = cmd.clone();
        args.push("--help");
        let run = ok(&data, &args);
        assert!(
            run.stdout.contains("Usage: tavern"),
            "{cmd:?}: {}",
            run.stdout
        );
    }
    assert!(!data.exists());
}

#[path = "../../tavern-search/tests/support/sentence_model.rs"]
mod sentence_model;

/// `tavern memory search` ranks as the panel and the bridge can: by words alone, or with
/// `--word-vectors` / `--sentence-encoder` (it had no ranking option, so an operator could not
/// see what the model's search by meaning finds).
#[test]
fn memory_search_ranks_by_meaning_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let store = FsStore::open(&data, Arc::new(SystemClock)).unwrap();
    // One import: the same time, so words alone break the tie by id (the camera last).
    store
        .import_memories(vec![
            write(
                "zz-camera",
                ScopeKey::Global,
                "My camera setup needs a brighter flash lens.",
                &[],
            ),
            write(
                "dinner",
                ScopeKey::Global,
                "My dinner party setup needs a bigger table.",
                &[],
            ),
            write(
                "office",
                ScopeKey::Global,
                "My home office setup needs a standing desk.",
                &[],
            ),
        ])
        .unwrap();
    drop(store);
    let ids = |extra: &[&str]| {
        let mut args = vec![
            "--json",
            "memory",
            "search",
            "photography setup accessories",
        ];
        args.extend_from_slice(extra);
        let hits = ok(&data, &args).json();
        hits["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let lexical = ids(&[]);
    assert_eq!(lexical.len(), 3, "{lexical:?}");
    assert_eq!(lexical[2], "zz-camera", "{lexical:?}");
    let vectors = tmp.path().join("vectors.txt");
    std::fs::write(
        &vectors,
        "camera 1.0 0.05 0.1\nphotography 0.95 0.0 0.15\nflash 0.9 0.1 0.0\n\
         lens 0.97 0.0 0.1\ntable 0.05 1.0 0.0\ndesk 0.1 0.95 0.1\n",
    )
    .unwrap();
    assert_eq!(
        ids(&["--word-vectors", vectors.to_str().unwrap()])[0],
        "zz-camera"
    );
    let model = sentence_model::sentence_model_dir();
    let by_meaning = ids(&["--sentence-encoder", model.to_str().unwrap()]);
    assert_eq!(by_meaning[0], "zz-camera", "{by_meaning:?}");
    // `memory search setup` with these options, as JSON or as the table.
    let setup = |json: bool, extra: &[&str]| {
        let mut args = if json { vec!["--json"] } else { vec![] };
        args.extend_from_slice(&["memory", "search", "setup"]);
        args.extend_from_slice(extra);
        ok(&data, &args)
    };
    let encoder = ["--sentence-encoder", model.to_str().unwrap()];
    // The output says how it ranked (scores by meaning are on another scale).
    let said = setup(true, &encoder).json();
    assert_eq!(
        said["ranking"], "sentence encoder read: all-MiniLM-L6-v2, weight 0.6",
        "{said}"
    );
    let table = setup(false, &encoder).stdout;
    assert!(
        table.ends_with("ranked with sentence encoder read: all-MiniLM-L6-v2, weight 0.6\n"),
        "{table}"
    );
    let plain = setup(true, &[]).json();
    assert_eq!(plain["ranking"], "ranking by words alone (BM25)", "{plain}");
    let weightless = setup(true, &[encoder[0], encoder[1], "--vector-weight", "0"]).json();
    assert_eq!(
        weightless["ranking"], plain["ranking"],
        "a weight of 0 ranks by words: {weightless}"
    );
    // A weight of 0 keeps the order of words alone.
    assert_eq!(
        ids(&[
            "--sentence-encoder",
            model.to_str().unwrap(),
            "--vector-weight",
            "0"
        ]),
        lexical
    );
    // Mistakes are one line naming the option.
    tavern(
        &data,
        &[
            "memory",
            "search",
            "setup",
            "--vector-weight",
            "-1",
            "--word-vectors",
            vectors.to_str().unwrap(),
        ],
    )
    .one_error_line("--vector-weight -1: must be within 0 and 0.95");
    tavern(
        &data,
        &["memory", "search", "setup", "--word-vectors", "no-such.txt"],
    )
    .one_error_line("--word-vectors no-such.txt");
}

/// `--data` naming a file said "no store in it yet: import a SillyTavern folder…", sending
/// the user to import into it: it is not a directory, and that is what is said.
#[test]
fn data_that_is_a_file_is_named_as_not_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("notes.txt");
    std::fs::write(&file, "x").unwrap();
    for args in [
        &["memory", "search", "x"][..],
        &["memory", "ls"][..],
        &["var", "ls", "--scope", "global"][..],
        &["check"][..],
    ] {
        let run = tavern(&file, args);
        assert_eq!(run.code, 1, "{args:?}: {}", run.stderr);
        run.one_error_line("is not a directory");
    }
}

/// What the store finds while a command runs is a warning too, not only what its open found:
/// a record changed in the memory image (one letter of its text, so that it still reads as a
/// record) is never shown — the store reads its log again and the search answers as the log
/// says — and the warning names the image, never the directory.
#[test]
fn a_record_changed_in_the_memory_image_is_a_warning_and_the_answer_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let store = FsStore::open(data, Arc::new(SystemClock)).unwrap();
    let writes = (0..40)
        .map(|i| {
            write(
                &format!("m{i}"),
                chat_scope(),
                &format!("a lantern by the river {i}"),
                &[],
            )
        })
        .collect();
    store.import_memories(writes).unwrap();
    assert!(store.save_memory_image().unwrap());
    drop(store);
    let args = [
        "memory",
        "search",
        "--scope",
        "chat",
        "--character",
        "Seraphina",
        "--chat",
        SERAPHINA_CHAT,
        "lantern river",
    ];
    // What the log alone answers (a copy of it, beside no image).
    let plain = tempfile::tempdir().unwrap();
    std::fs::copy(data.join("memory.log"), plain.path().join("memory.log")).unwrap();
    let before = ok(plain.path(), &args);
    assert!(
        before.stdout.contains("a lantern by the river"),
        "{}",
        before.stdout
    );
    assert!(!before.stderr.contains("memory.image"), "{}", before.stderr);
    // The records lie after the part an open reads: every one of them, changed.
    let path = data.join("memory.image");
    let changed = tavern_store::fs::change_unread_part(&path, b"lantern", b"lanterm").unwrap();
    assert_eq!(changed, 40);
    let after = ok(data, &args);
    assert_eq!(after.stdout, before.stdout, "answered as the log says");
    assert!(!after.stdout.contains("lanterm"), "{}", after.stdout);
    assert!(after.stderr.contains("memory.image"), "{}", after.stderr);
    assert!(after.stderr.contains("read again"), "{}", after.stderr);
    assert!(
        !after.stderr.contains(&data.display().to_string()),
        "{}",
        after.stderr
    );
}
