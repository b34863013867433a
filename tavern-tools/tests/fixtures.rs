//! Every real SillyTavern file in `../shared/fixtures` loads, with the properties its README
//! promises. Fails loudly when the folder is missing.

use std::path::{Path, PathBuf};

use tavern_core::chat::ChatDocument;
use tavern_tools::assets::card::{Card, CardVersion};
use tavern_tools::assets::world::WorldBook;
use tavern_tools::assets::AssetError;

fn fixtures() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures");
    assert!(
        dir.join("README.md").is_file(),
        "../shared/fixtures is missing beside the checkout ({}); these tests need the real SillyTavern files",
        dir.display()
    );
    dir
}

fn files(sub: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures().join(sub))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no fixtures in {sub}");
    v
}

fn card(name: &str) -> Result<Card, AssetError> {
    let bytes = std::fs::read(fixtures().join("cards").join(name)).unwrap();
    Card::from_bytes(name, &bytes)
}

#[test]
fn every_card_loads_or_is_reported_as_not_a_card() {
    for path in files("cards") {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let res = Card::from_bytes(&name, &std::fs::read(&path).unwrap());
        if name.starts_with("not-a-card") {
            assert_eq!(res.unwrap_err(), AssetError::NotACard(name.clone()));
        } else {
            let card = res.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!card.name().is_empty(), "{name}");
        }
    }
}

#[test]
fn card_versions_chunks_and_books_match_the_fixture_notes() {
    let sera = card("Seraphina.v2v3.book4.png").unwrap();
    assert_eq!(sera.version(), CardVersion::V3, "ccv3 wins over chara");
    assert_eq!(sera.name(), "Seraphina");
    assert_eq!(sera.linked_world(), Some("Eldoria"));
    assert_eq!(sera.embedded_book().unwrap().entries.len(), 4);

    let v2 = card("Seraphina.v2-only.png").unwrap();
    assert_eq!(v2.version(), CardVersion::V2);
    assert_eq!(v2.field("description"), sera.field("description"));

    let megumin = card("Megumin.v1.png").unwrap();
    assert_eq!(megumin.version(), CardVersion::V1);
    assert_eq!(megumin.name(), "Megumin");
    assert!(megumin.field("first_mes").is_some_and(|m| !m.is_empty()));

    let amy = card("Amy.v3-in-both-chunks.png").unwrap();
    assert_eq!(amy.version(), CardVersion::V3);

    let sakana = card("Sakana.v2.book14.png").unwrap();
    assert_eq!(sakana.embedded_book().unwrap().entries.len(), 14);

    let capo = card("CapoGPT.v2.text-before-idat.png").unwrap();
    assert_eq!(capo.version(), CardVersion::V2);

    let zh = card("menzhizhu.v3.zh.png").unwrap();
    assert_eq!(zh.version(), CardVersion::V3);
    assert!(zh
        .field("first_mes")
        .unwrap()
        .chars()
        .any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c)));
}

#[test]
fn a_png_with_a_truncated_chunk_is_an_error_not_a_crash() {
    let bytes = std::fs::read(fixtures().join("cards/Megumin.v1.png")).unwrap();
    for cut in [0, 7, 8, 20, 33, bytes.len() / 2] {
        let res = Card::from_bytes("cut.png", &bytes[..cut]);
        assert!(res.is_err(), "cut at {cut}");
    }
}

#[test]
fn every_world_loads_in_every_shape() {
    let expected = [
        ("Eldoria.json", 4),
        ("Eldoria.old-schema.json", 4),
        ("KoboldAI_Sample.json", 2),
        ("Toaru.2023.json", 18),
        ("tarot.zh.json", 9),
    ];
    let all = files("worlds");
    assert_eq!(
        all.len(),
        expected.len(),
        "a new world fixture needs an expectation here"
    );
    for (file, n) in expected {
        let bytes = std::fs::read(fixtures().join("worlds").join(file)).unwrap();
        let book = WorldBook::from_json(file, &bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(book.entries.len(), n, "{file}");
        assert!(book.entries.iter().all(|e| !e.content.is_empty()), "{file}");
    }
    let kobold = WorldBook::from_json(
        "k",
        &std::fs::read(fixtures().join("worlds/KoboldAI_Sample.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(kobold.entries[0].comment, "AAA definition");
    let tarot = WorldBook::from_json(
        "t",
        &std::fs::read(fixtures().join("worlds/tarot.zh.json")).unwrap(),
    )
    .unwrap();
    assert!(tarot.entries.iter().any(|e| e.constant) && tarot.entries.iter().any(|e| !e.constant));
    let old = WorldBook::from_json(
        "o",
        &std::fs::read(fixtures().join("worlds/Eldoria.old-schema.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        old.entries[0].keys,
        ["eldoria", "wood", "forest", "magical forest"]
    );
}

#[test]
fn every_chat_parses_and_writes_back_byte_for_byte() {
    for path in files("chats") {
        let text = std::fs::read_to_string(&path).unwrap();
        let doc = ChatDocument::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!doc.messages.is_empty());
        assert!(
            !text.ends_with('\n'),
            "the fixtures have no trailing newline"
        );
        assert_eq!(doc.to_text(), text, "{}", path.display());
        assert!(
            doc.header.is_some(),
            "{}: a character chat has its header",
            path.display()
        );
        // The file's name is a valid chat id, so it can be bound, searched and forked.
        let stem = path.file_stem().unwrap().to_str().unwrap();
        assert!(
            tavern_core::ChatId::parse(stem).is_ok(),
            "{stem:?} is a chat id"
        );
    }
    let sera = ChatDocument::parse(
        &std::fs::read_to_string(fixtures().join("chats/Seraphina - 2024-09-19@20h03m29s.jsonl"))
            .unwrap(),
    )
    .unwrap();
    assert!(
        sera.messages.iter().any(|m| !m.swipes().is_empty()),
        "swipes are read"
    );
    let megumin = ChatDocument::parse(
        &std::fs::read_to_string(fixtures().join("chats/Megumin_1673323621108.jsonl")).unwrap(),
    )
    .unwrap();
    assert!(matches!(
        megumin.messages[0].send_date(),
        Some(tavern_core::chat::SendDate::Millis(_))
    ));
    let aqua = ChatDocument::parse(
        &std::fs::read_to_string(fixtures().join("chats/Aqua_1677261616514.jsonl")).unwrap(),
    )
    .unwrap();
    assert!(
        aqua.messages.iter().any(|m| m.text().contains("\r\n")),
        "\\r\\n inside mes"
    );
}

/// A SillyTavern group chat as older releases (before 1.12) write it to
/// `group chats/<id>.jsonl`: no header line, every line a message of some member (`name`,
/// `original_avatar`, `force_avatar`, `is_name`), the user, or the narrator (`is_system`),
/// with swipes and generation info in `extra`. Shape from SillyTavern's `group-chats.js`
/// (`saveGroupChat` posts `chat` as is; `getFirstCharacterMessage` builds the greeting).
const OLD_GROUP_CHAT: &str = concat!(
    r#"{"name":"Alice","is_user":false,"is_system":false,"send_date":"May 1, 2023 12:00pm","mes":"Welcome to the tavern, everyone!","original_avatar":"Alice.png","extra":{"gen_id":1682935200000},"is_name":true,"force_avatar":"/thumbnail?type=avatar&file=Alice.png"}"#,
    "\n",
    r#"{"name":"You","is_user":true,"is_system":false,"send_date":"May 1, 2023 12:01pm","mes":"Hi Alice. Where is Bob?","extra":{},"is_name":true,"force_avatar":"User Avatars/user-default.png"}"#,
    "\n",
    r#"{"name":"Bob","is_user":false,"is_system":false,"send_date":"May 1, 2023 12:01pm","mes":"Right here!\r\nPouring ale.","original_avatar":"Bob.png","extra":{"api":"openai","model":"gpt-4"},"is_name":true,"swipe_id":1,"swipes":["Here.","Right here!\r\nPouring ale."],"swipe_info":[{},{}],"gen_started":"2023-05-01T12:01:02.000Z","gen_finished":"2023-05-01T12:01:04.000Z","force_avatar":"/thumbnail?type=avatar&file=Bob.png"}"#,
    "\n",
    r#"{"name":"System","is_user":false,"is_system":true,"send_date":"May 1, 2023 12:02pm","mes":"Bob has left the chat.","extra":{"type":"narrator","isSmallSys":true},"force_avatar":"img/five.png"}"#,
);

/// The same chat as SillyTavern 1.12+ writes it: a header holding `chat_metadata`, with
/// `user_name`/`character_name` set to `unused`.
const NEW_GROUP_HEADER: &str = r#"{"chat_metadata":{"variables":{"round":"2"},"main_chat":"Tavern night - 2023-5-1@12h00m00s"},"user_name":"unused","character_name":"unused"}"#;

#[test]
fn group_chats_round_trip_byte_for_byte_with_or_without_a_header() {
    let old = ChatDocument::parse(OLD_GROUP_CHAT).unwrap();
    assert!(old.header.is_none(), "no header line in old group chats");
    assert_eq!(old.messages.len(), 4, "the first line is a message");
    assert_eq!(old.messages[0].name(), Some("Alice"));
    assert_eq!(old.messages[2].swipes().len(), 2);
    assert!(old.messages[3].is_system());
    assert_eq!(old.to_text(), OLD_GROUP_CHAT);
    assert_eq!(old.parent_chat(), None);

    let text = format!("{NEW_GROUP_HEADER}\n{OLD_GROUP_CHAT}");
    let new = ChatDocument::parse(&text).unwrap();
    assert!(new.header.is_some());
    assert_eq!(new.messages.len(), 4);
    assert_eq!(new.to_text(), text);
    assert_eq!(new.parent_chat(), Some("Tavern night - 2023-5-1@12h00m00s"));
    // CRLF files and a trailing newline read the same; the text is written back in
    // SillyTavern's style.
    let crlf = format!("{}\r\n", OLD_GROUP_CHAT.replace('\n', "\r\n"));
    assert_eq!(
        ChatDocument::parse(&crlf).unwrap().to_text(),
        OLD_GROUP_CHAT
    );
}

#[tokio::test]
async fn a_sillytavern_data_folder_serves_cards_and_worlds_by_name_only() {
    use tavern_tools::assets::provider::{AssetProvider, DirAssets, Persona};
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("characters")).unwrap();
    std::fs::create_dir_all(dir.path().join("worlds")).unwrap();
    std::fs::copy(
        fixtures().join("cards/Seraphina.v2v3.book4.png"),
        dir.path().join("characters/Seraphina.png"),
    )
    .unwrap();
    std::fs::copy(
        fixtures().join("worlds/Eldoria.json"),
        dir.path().join("worlds/Eldoria.json"),
    )
    .unwrap();
    std::fs::write(dir.path().join("secret.json"), "{\"entries\": {}}").unwrap();
    let assets = DirAssets::new(dir.path(), vec!["Eldoria".into()], Persona::default());
    let sera = tavern_core::CharacterName::parse("Seraphina").unwrap();
    assert_eq!(
        assets.card(&sera).await.unwrap().unwrap().name(),
        "Seraphina"
    );
    assert!(assets
        .card(&tavern_core::CharacterName::parse("Nobody").unwrap())
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        assets
            .world("Eldoria")
            .await
            .unwrap()
            .unwrap()
            .entries
            .len(),
        4
    );
    for hostile in ["../secret", "..", "/etc/passwd", "Eldoria.json", ""] {
        assert!(assets.world(hostile).await.unwrap().is_none(), "{hostile}");
    }
    assert_eq!(assets.global_worlds().await, ["Eldoria"]);
    // #30 F7: a parsed book is shared, never copied per request (a 100,000-entry world was
    // cloned whole by every lore search), and so is the card's embedded book and the books'
    // lexical index.
    let (a, b) = (
        assets.world("Eldoria").await.unwrap().unwrap(),
        assets.world("Eldoria").await.unwrap().unwrap(),
    );
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert!(std::sync::Arc::ptr_eq(
        &a.lexical_index(),
        &b.lexical_index()
    ));
    let card = assets.card(&sera).await.unwrap().unwrap();
    let (e1, e2) = (card.embedded_book().unwrap(), card.embedded_book().unwrap());
    assert!(std::sync::Arc::ptr_eq(&e1, &e2));
}

#[tokio::test]
async fn a_data_folder_parses_a_card_once_per_change_and_sees_every_change() {
    use std::sync::Arc;
    use tavern_tools::assets::provider::{AssetProvider, DirAssets, Persona};
    let dir = tempfile::tempdir().unwrap();
    let characters = dir.path().join("characters");
    std::fs::create_dir_all(&characters).unwrap();
    let card = |name: &str, description: &str| {
        serde_json::json!({"spec": "chara_card_v2", "spec_version": "2.0",
            "data": {"name": name, "description": description, "first_mes": "hi"}})
        .to_string()
    };
    let mira = tavern_core::CharacterName::parse("Mira").unwrap();
    let assets = DirAssets::new(dir.path(), Vec::new(), Persona::default());
    assert!(assets.card(&mira).await.unwrap().is_none());

    // A card added after the folder was listed is found.
    std::fs::write(characters.join("Mira.json"), card("Mira", "first")).unwrap();
    let first = assets.card(&mira).await.unwrap().unwrap();
    assert_eq!(first.field("description"), Some("first"));
    // Unchanged: the same parsed card, not a new parse.
    let again = assets.card(&mira).await.unwrap().unwrap();
    assert!(Arc::ptr_eq(&first, &again));

    // Replaced (as editors and SillyTavern do: a new file renamed over the old one).
    let tmp = characters.join("Mira.json.tmp");
    std::fs::write(&tmp, card("Mira", "second, longer")).unwrap();
    std::fs::rename(&tmp, characters.join("Mira.json")).unwrap();
    let second = assets.card(&mira).await.unwrap().unwrap();
    assert_eq!(second.field("description"), Some("second, longer"));

    // Broken: the error names the card and no path; removed: gone.
    std::fs::write(characters.join("Mira.json"), "{not json").unwrap();
    let err = assets.card(&mira).await.unwrap_err().to_string();
    assert!(err.contains("Mira") && !err.contains('/'), "{err}");
    std::fs::remove_file(characters.join("Mira.json")).unwrap();
    assert!(assets.card(&mira).await.unwrap().is_none());
}

/// #30 F7: an asset larger than the limit is refused by name, never read; calls that miss the
/// cache together share one parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_over_the_size_limit_is_refused_and_concurrent_misses_parse_once() {
    use std::sync::Arc;
    use tavern_tools::assets::provider::{AssetProvider, DirAssets, Persona};
    let dir = tempfile::tempdir().unwrap();
    let characters = dir.path().join("characters");
    std::fs::create_dir_all(&characters).unwrap();
    let mira = tavern_core::CharacterName::parse("Mira").unwrap();
    let text = serde_json::json!({"spec": "chara_card_v2", "spec_version": "2.0",
        "data": {"name": "Mira", "description": "x".repeat(4000), "first_mes": "hi"}})
    .to_string();
    std::fs::write(characters.join("Mira.json"), &text).unwrap();
    let small = DirAssets::new(dir.path(), Vec::new(), Persona::default()).with_max_bytes(1024);
    let err = small.card(&mira).await.unwrap_err();
    assert!(
        matches!(err, AssetError::TooLarge { size, max: 1024, .. } if size == text.len() as u64),
        "{err}"
    );
    assert!(
        err.to_string().contains("card Mira") && !err.to_string().contains('/'),
        "{err}"
    );
    // Sixteen calls at once on a cold cache: one parsed card, shared by all.
    let assets = DirAssets::new(dir.path(), Vec::new(), Persona::default());
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let assets = assets.clone();
            let mira = mira.clone();
            tokio::spawn(async move { assets.card(&mira).await.unwrap().unwrap() })
        })
        .collect();
    let mut cards = Vec::new();
    for c in calls {
        cards.push(c.await.unwrap());
    }
    assert!(
        cards.iter().all(|c| Arc::ptr_eq(c, &cards[0])),
        "parsed more than once"
    );
}
