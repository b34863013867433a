//! The fourteen tools through the registry, on the strict in-memory store and real cards:
//! happy paths, limits, errors, scope isolation, CAS recovery and forged ids.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use tavern_core::{
    normalize_state, AgentId, CharacterName, ChatId, SessionId, TavernState, Timestamp,
};
use tavern_store::clock::ManualClock;
use tavern_store::mem::MemStore;
use tavern_store::ChatStore;
use tavern_tools::assets::card::Card;
use tavern_tools::assets::provider::{MemAssets, Persona};
use tavern_tools::assets::world::WorldBook;
use tavern_tools::{ToolContext, ToolError, ToolLimits, ToolRegistry, ToolServices};

const T0: Timestamp = Timestamp(1_700_000_000_000);

struct Harness {
    registry: ToolRegistry,
    store: Arc<MemStore>,
    state: TavernState,
    clock: Arc<ManualClock>,
    turn: u64,
}

fn fixture(rel: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures")
        .join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("../shared/fixtures/{rel} is needed ({e})"))
}

async fn harness_with(state: serde_json::Value, limits: ToolLimits) -> Harness {
    harness_ranked(state, limits, tavern_search::RankerRef::default()).await
}

async fn harness_ranked(
    state: serde_json::Value,
    limits: ToolLimits,
    ranker: tavern_search::RankerRef,
) -> Harness {
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(MemStore::new(clock.clone()));
    let mut assets = MemAssets::default();
    let sera = Card::from_png("Seraphina", &fixture("cards/Seraphina.v2v3.book4.png")).unwrap();
    assets.cards.insert("Seraphina".into(), sera.into());
    assets.cards.insert(
        "Megumin".into(),
        Card::from_png("Megumin", &fixture("cards/Megumin.v1.png"))
            .unwrap()
            .into(),
    );
    assets.worlds.insert(
        "Eldoria".into(),
        WorldBook::from_json("Eldoria", &fixture("worlds/Eldoria.json"))
            .unwrap()
            .into(),
    );
    assets.worlds.insert(
        "tarot".into(),
        WorldBook::from_json("tarot", &fixture("worlds/tarot.zh.json"))
            .unwrap()
            .into(),
    );
    assets.global = vec!["tarot".into(), "Eldoria".into()];
    assets.persona = Persona {
        name: "白羽".into(),
        description: "A traveler with a lantern.".into(),
    };
    let mut services = services(&store, assets);
    services.ranker = ranker;
    let sera = CharacterName::parse("Seraphina").unwrap();
    let main = ChatId::parse("Seraphina - 1").unwrap();
    let lines = vec![
        r#"{"user_name":"白羽","character_name":"Seraphina","create_date":"2024-09-19@20h03m29s","chat_metadata":{"note_prompt":"Keep it gentle."}}"#.to_owned(),
        r#"{"name":"Seraphina","is_user":false,"send_date":"September 19, 2024 8:03pm","mes":"You wake in my glade, traveler."}"#.to_owned(),
        r#"{"name":"白羽","is_user":true,"send_date":"September 19, 2024 8:04pm","mes":"Where is the silver gate?"}"#.to_owned(),
        r#"{"name":"Seraphina","is_user":false,"send_date":"September 19, 2024 8:05pm","mes":"The silver gate lies north, past the river spirits. 银色大门在北方。"}"#.to_owned(),
    ];
    let parsed = |lines: Vec<String>| -> Vec<tavern_core::chat::ChatLine> {
        lines
            .iter()
            .map(|l| tavern_core::chat::ChatLine::parse(l).unwrap())
            .collect()
    };
    store
        .rewrite_chat(&sera, &main, &parsed(lines), None)
        .await
        .unwrap();
    let branch = vec![
        r#"{"user_name":"白羽","character_name":"Seraphina","create_date":"x","chat_metadata":{"main_chat":"Seraphina - 1"}}"#.to_owned(),
        r#"{"name":"白羽","is_user":true,"send_date":1,"mes":"Tell me about the lantern."}"#.to_owned(),
    ];
    store
        .rewrite_chat(
            &sera,
            &ChatId::parse("Seraphina - 2").unwrap(),
            &parsed(branch),
            None,
        )
        .await
        .unwrap();
    let (state, _) = normalize_state(&state);
    Harness {
        registry: ToolRegistry::new(services, limits),
        store,
        state,
        clock,
        turn: 1,
    }
}

fn default_state() -> Value {
    json!({"sessionBindings": {
        "s1": {"character": "Seraphina", "chatId": "Seraphina - 1", "architecture": "agent-tavern", "contextMode": "dsh-native"},
        "s2": {"character": "Seraphina", "chatId": "Seraphina - 2", "architecture": "agent-tavern", "contextMode": "dsh-native"},
        "s3": {"character": "Megumin", "chatId": "Megumin - 1", "architecture": "agent-tavern", "contextMode": "dsh-native"},
        "st1": {"character": "Seraphina", "chatId": "Seraphina - 1", "architecture": "st"},
        "g1": {"character": "Party", "chatId": "p", "group": true, "architecture": "agent-tavern"}
    }})
}

/// Every store port on `store`, with `assets`.
fn services(
    store: &Arc<MemStore>,
    assets: impl tavern_tools::assets::provider::AssetProvider + 'static,
) -> ToolServices {
    ToolServices {
        memory: store.clone(),
        variables: store.clone(),
        chats: store.clone(),
        assets: Arc::new(assets),
        history: Default::default(),
        ranker: Default::default(),
        zone: std::sync::Arc::new(tavern_core::FixedOffset(0)),
    }
}

async fn harness() -> Harness {
    harness_with(default_state(), ToolLimits::default()).await
}

impl Harness {
    async fn call(&self, session: &str, name: &str, args: Value) -> Result<Value, ToolError> {
        let ctx = ToolContext::for_session(
            &AgentId::parse(session).unwrap(),
            &SessionId::parse(session).unwrap(),
            &self.state,
            self.turn,
            &format!("call-{}-{}", self.clock_now().0, name),
            *self.registry.limits(),
            self.clock_now(),
        )?;
        self.registry.call(&ctx, name, &args).await
    }

    fn clock_now(&self) -> Timestamp {
        use tavern_store::Clock;
        self.clock.now()
    }

    async fn ok(&self, session: &str, name: &str, args: Value) -> Value {
        self.clock.advance(1);
        self.call(session, name, args)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// Replaces the header of `Seraphina - 1` (session `s1`'s chat) with `raw`.
    async fn set_main_header(&self, raw: &str) {
        let sera = CharacterName::parse("Seraphina").unwrap();
        let main = ChatId::parse("Seraphina - 1").unwrap();
        let mut lines = self
            .store
            .read_chat(&sera, &main)
            .await
            .unwrap()
            .unwrap()
            .lines;
        lines[0] = tavern_core::chat::ChatLine::parse(raw).unwrap();
        let rev = self.store.chat_revision(&sera, &main).await.unwrap();
        self.store
            .rewrite_chat(&sera, &main, &lines, rev.as_ref())
            .await
            .unwrap();
    }

    async fn err(&self, session: &str, name: &str, args: Value) -> ToolError {
        self.clock.advance(1);
        self.call(session, name, args).await.expect_err(name)
    }
}

#[tokio::test]
async fn every_tool_is_listed_with_a_closed_schema() {
    let h = harness().await;
    let names: Vec<&str> = h.registry.specs().iter().map(|s| s.name).collect();
    assert_eq!(
        names,
        [
            "tavern_character_get",
            "tavern_lore_search",
            "tavern_history_search",
            "tavern_scene_get",
            "memory_search",
            "memory_read",
            "memory_write",
            "memory_update",
            "memory_forget",
            "variable_get",
            "variable_set",
            "variable_patch",
            "variable_delete",
            "variable_list",
        ]
    );
    for spec in h.registry.specs() {
        assert_eq!(
            spec.parameters["additionalProperties"], false,
            "{}",
            spec.name
        );
        assert_eq!(spec.parameters["type"], "object");
        assert!(spec.description.len() > 30);
        for forbidden in [
            "sessionId",
            "session",
            "chatId",
            "chat",
            "character",
            "scopeId",
        ] {
            assert!(
                spec.parameters["properties"].get(forbidden).is_none(),
                "{} accepts {forbidden}",
                spec.name
            );
        }
    }
    let tools = h.registry.openai_tools();
    assert_eq!(tools.as_array().unwrap().len(), 14);
    assert_eq!(tools[0]["type"], "function");
}

#[tokio::test]
async fn character_get_reads_fields_persona_and_cuts_to_budget() {
    let h = harness().await;
    let v = h.ok("s1", "tavern_character_get", json!({})).await;
    assert_eq!(v["fields"]["name"], "Seraphina");
    assert!(v["fields"]["description"].as_str().unwrap().len() > 100);
    assert_eq!(
        v["source"],
        json!({"kind": "card", "character": "Seraphina", "spec": "v3"})
    );
    let v = h
        .ok(
            "s1",
            "tavern_character_get",
            json!({"fields": ["persona", "first_mes"], "maxTokens": 20}),
        )
        .await;
    assert_eq!(v["fields"]["persona"]["name"], "白羽");
    assert_eq!(v["truncatedFields"], json!(["first_mes"]));
    let e = h
        .err(
            "s1",
            "tavern_character_get",
            json!({"fields": ["password"]}),
        )
        .await;
    assert_eq!(e.code(), "invalid-arguments");
    assert!(e.to_string().contains("fields[0]"), "{e}");
    let e = h
        .err("s1", "tavern_character_get", json!({"maxTokens": 999_999}))
        .await;
    assert!(e.to_string().contains("maxTokens"), "{e}");
}

/// #29 item 3: personas as SillyTavern keeps them in a user folder's `settings.json` (built
/// here as SillyTavern writes it: no public one was found): a chat locked to a persona
/// (`chat_metadata.persona`) shows that persona, a chat without a lock the one selected last;
/// `{{user}}` in card text becomes the chat's persona; a changed `settings.json` is read again.
#[tokio::test]
async fn personas_come_from_settings_json_and_the_chat_lock() {
    let mut h = harness().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("characters")).unwrap();
    std::fs::write(
        dir.path().join("characters/Seraphina.png"),
        fixture("cards/Seraphina.v2v3.book4.png"),
    )
    .unwrap();
    let settings = |selected: &str| {
        json!({
            "username": "Kai",
            "user_avatar": selected,
            "power_user": {
                "personas": {"user-default.png": "白羽", "1700000000000-knight.png": "Sir Aldous"},
                "persona_descriptions": {
                    "user-default.png": {"description": "一名来自北方的旅人。", "position": 0},
                    "1700000000000-knight.png": {"description": "A knight sworn to {{char}}.", "position": 0},
                },
                "default_persona": null,
            },
        })
        .to_string()
    };
    std::fs::write(
        dir.path().join("settings.json"),
        settings("user-default.png"),
    )
    .unwrap();
    let assets = tavern_tools::assets::provider::DirAssets::new(
        dir.path(),
        Vec::new(),
        Persona {
            name: "User".into(),
            description: String::new(),
        },
    );
    h.registry = ToolRegistry::new(services(&h.store, assets), ToolLimits::default());
    let persona = |v: &Value| v["fields"]["persona"].clone();
    let ask = json!({"fields": ["persona"]});
    // Not locked: the persona selected last.
    let v = h.ok("s2", "tavern_character_get", ask.clone()).await;
    assert_eq!(
        persona(&v),
        json!({"name": "白羽", "description": "一名来自北方的旅人。"})
    );
    // Locked to the knight in the chat's header.
    h.set_main_header(
        r#"{"user_name":"Sir Aldous","character_name":"Seraphina","chat_metadata":{"persona":"1700000000000-knight.png"}}"#,
    )
    .await;
    let v = h
        .ok(
            "s1",
            "tavern_character_get",
            json!({"fields": ["persona", "description"]}),
        )
        .await;
    assert_eq!(
        persona(&v),
        json!({"name": "Sir Aldous", "description": "A knight sworn to Seraphina."})
    );
    let description = v["fields"]["description"].as_str().unwrap();
    assert!(!description.contains("{{user}}"), "{description}");
    // The other chat follows a new selection once settings.json changes.
    std::fs::write(
        dir.path().join("settings.json"),
        settings("1700000000000-knight.png"),
    )
    .unwrap();
    let v = h.ok("s2", "tavern_character_get", ask).await;
    assert_eq!(persona(&v)["name"], "Sir Aldous");
}

/// #29 item 2: lore as SillyTavern assembles it from a user folder — the chat's own book
/// (`chat_metadata.world_info`), the card's linked world, the character's extra books and the
/// global selection of `settings.json` (built as SillyTavern writes it: no public one was
/// found), each labelled with its source and each book once.
#[tokio::test]
async fn lore_reads_the_chat_book_the_extra_books_and_the_global_selection() {
    let mut h = harness().await;
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("cards/Seraphina.v2v3.book4.png", "characters/Seraphina.png"),
        ("worlds/Eldoria.json", "worlds/Eldoria.json"),
        ("worlds/tarot.zh.json", "worlds/tarot.json"),
        ("worlds/Toaru.2023.json", "worlds/Toaru.json"),
        ("worlds/KoboldAI_Sample.json", "worlds/Kobold.json"),
    ] {
        let to = dir.path().join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, fixture(from)).unwrap();
    }
    let settings = json!({"world_info_settings": {"world_info": {
        "globalSelect": ["Kobold", "Eldoria"],
        "charLore": [{"name": "Seraphina", "extraBooks": ["Toaru", "tarot", "Missing"]}],
    }}});
    std::fs::write(dir.path().join("settings.json"), settings.to_string()).unwrap();
    let assets =
        tavern_tools::assets::provider::DirAssets::new(dir.path(), Vec::new(), Persona::default());
    h.registry = ToolRegistry::new(services(&h.store, assets), ToolLimits::default());
    // The chat binds the tarot book.
    h.set_main_header(
        r#"{"user_name":"白羽","character_name":"Seraphina","chat_metadata":{"world_info":"tarot"}}"#,
    )
    .await;
    let v = h
        .ok(
            "s1",
            "tavern_lore_search",
            json!({"query": "塔罗牌 Tokiwadai AAA Eldoria", "limit": 20, "maxTokens": 4000}),
        )
        .await;
    let books: Vec<(String, String)> = v["source"]["books"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().to_owned(),
                b["source"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let pair = |n: &str, s: &str| (n.to_owned(), s.to_owned());
    assert_eq!(
        books,
        [
            pair("tarot", "chat"),
            pair("Eldoria", "card-linked"),
            pair("Toaru", "character"),
            pair("Kobold", "global"),
        ],
        "{v}"
    );
    let sources: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["source"].as_str().unwrap())
        .collect();
    for s in ["chat", "character", "global"] {
        assert!(sources.contains(&s), "{s}: {sources:?}");
    }
    // Another chat of the character, with no book of its own: the tarot book is an extra one.
    let v = h
        .ok(
            "s2",
            "tavern_lore_search",
            json!({"query": "塔罗牌", "limit": 20}),
        )
        .await;
    assert_eq!(v["source"]["books"][0]["name"], "Eldoria", "{v}");
    assert!(v["source"]["books"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["name"] == "tarot" && b["source"] == "character"));
}

/// #29 item 5: a session bound to a group's chat (as MCP mode binds one: the spec keeps a host's
/// group sessions `st`, without tools) gets what a member needs from the group file: its
/// members (names from their cards, muted ones marked), the group's author's note and its chat
/// lorebook (kept in the group file: group chats are headerless). The "Party" group file is
/// built as SillyTavern writes one (its `group-chats.js` fields); the other is a real one from a
/// user's folder, whose members' cards are not there.
#[tokio::test]
async fn a_group_session_gets_its_members_note_and_chat_book() {
    let mut h = harness().await;
    let dir = tempfile::tempdir().unwrap();
    for (from, to) in [
        ("cards/Seraphina.v2v3.book4.png", "characters/Seraphina.png"),
        ("cards/Megumin.v1.png", "characters/Megumin.png"),
        ("worlds/tarot.zh.json", "worlds/tarot.json"),
        (
            "user-folder/groups/1720882292647.json",
            "groups/1720882292647.json",
        ),
    ] {
        let to = dir.path().join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, fixture(from)).unwrap();
    }
    let party = json!({"id": "1700000000001", "name": "Party", "members": ["Seraphina.png", "Megumin.png"],
        "disabled_members": ["Megumin.png"], "chat_id": "p", "chats": ["p"],
        "chat_metadata": {"note_prompt": "Keep the party together.", "world_info": "tarot"}});
    std::fs::write(
        dir.path().join("groups/1700000000001.json"),
        party.to_string(),
    )
    .unwrap();
    let assets =
        tavern_tools::assets::provider::DirAssets::new(dir.path(), Vec::new(), Persona::default());
    h.registry = ToolRegistry::new(services(&h.store, assets), ToolLimits::default());
    let bind = |session: &str, group: &str, chat: &str| {
        let mut state = default_state();
        state["sessionBindings"][session] =
            json!({"character": group, "chatId": chat, "architecture": "agent-tavern"});
        tavern_core::normalize_state(&state).0
    };
    h.state = bind("g1", "Party", "p");
    let v = h
        .ok(
            "g1",
            "tavern_character_get",
            json!({"fields": ["group_members"]}),
        )
        .await;
    assert_eq!(
        v["fields"]["group_members"],
        json!([
            {"name": "Seraphina", "character": "Seraphina", "muted": false, "card": true},
            {"name": "Megumin", "character": "Megumin", "muted": true, "card": true},
        ])
    );
    let scene = h.ok("g1", "tavern_scene_get", json!({})).await;
    assert_eq!(scene["note"], "Keep the party together.", "{scene}");
    let lore = h
        .ok("g1", "tavern_lore_search", json!({"query": "塔罗牌"}))
        .await;
    assert_eq!(lore["source"]["books"][0]["name"], "tarot", "{lore}");
    assert_eq!(lore["source"]["books"][0]["source"], "chat");
    // The real group: eight members whose cards are elsewhere, all muted.
    h.state = bind(
        "g2",
        "ZzGroup: Conversational Real Life",
        "2024-7-22@06h24m10s",
    );
    let v = h
        .ok(
            "g2",
            "tavern_character_get",
            json!({"fields": ["group_members"]}),
        )
        .await;
    let members = v["fields"]["group_members"].as_array().unwrap();
    assert_eq!(members.len(), 8);
    // A member's card, by the name group_members gives; macros say that member.
    h.state = bind("g1", "Party", "p");
    let megumin = h
        .ok(
            "g1",
            "tavern_character_get",
            json!({"member": "megumin", "fields": ["name", "description"]}),
        )
        .await;
    assert_eq!(megumin["fields"]["name"], "Megumin", "{megumin}");
    let description = megumin["fields"]["description"].as_str().unwrap();
    assert!(
        !description.is_empty() && !description.contains("{{char}}"),
        "{description}"
    );
    let e = h
        .err("g1", "tavern_character_get", json!({"member": "Aqua"}))
        .await;
    assert_eq!(e.code(), "invalid-arguments");
    assert!(e.to_string().contains("members: Seraphina, Megumin"), "{e}");
    // Outside a group chat there are no members to name.
    let e = h
        .err("s1", "tavern_character_get", json!({"member": "Megumin"}))
        .await;
    assert!(e.to_string().contains("not a group chat"), "{e}");
    assert_eq!(
        members[1],
        json!({"name": "Tony Stark_1", "character": "Tony Stark_1", "muted": true, "card": false})
    );
}

/// #29 item 3: the Character's Note (`extensions.depth_prompt`) is served as data — its text,
/// depth and role — from a real card that has one (NarrativeWeaver, from a user's folder);
/// a card without one has no such field.
#[tokio::test]
async fn character_get_serves_the_characters_note_as_data() {
    let mut h = harness().await;
    let mut assets = MemAssets::default();
    assets.cards.insert(
        "Seraphina".into(),
        Card::from_png(
            "Seraphina",
            &fixture("user-folder/characters/NarrativeWeaver.png"),
        )
        .unwrap()
        .into(),
    );
    assets.cards.insert(
        "Megumin".into(),
        Card::from_png("Megumin", &fixture("cards/Megumin.v1.png"))
            .unwrap()
            .into(),
    );
    h.registry = ToolRegistry::new(services(&h.store, assets), ToolLimits::default());
    let ask = json!({"fields": ["name", "character_note"]});
    let v = h.ok("s1", "tavern_character_get", ask.clone()).await;
    assert_eq!(
        v["fields"]["character_note"],
        json!({"text": "asdfasdfasdfasdfsadfasdfasfsaf", "depth": 2, "role": "system"})
    );
    let none = h.ok("s3", "tavern_character_get", ask).await;
    assert!(none["fields"].get("character_note").is_none(), "{none}");
    assert_eq!(none["fields"]["name"], "Megumin");
}

/// #29 item 4: card text comes back as SillyTavern shows it to a model, macros substituted
/// with the character's and the persona's names (the real Seraphina card writes `{{char}}`
/// in its description).
#[tokio::test]
async fn character_get_substitutes_sillytavern_macros() {
    let h = harness().await;
    let raw = Card::from_png("Seraphina", &fixture("cards/Seraphina.v2v3.book4.png")).unwrap();
    assert!(raw.field("description").unwrap().contains("{{char}}"));
    let v = h
        .ok(
            "s1",
            "tavern_character_get",
            json!({"fields": ["description", "scenario", "first_mes", "alternate_greetings", "persona"], "maxTokens": 4000}),
        )
        .await;
    let text = v["fields"].to_string().to_lowercase();
    assert!(
        !text.contains("{{char}}") && !text.contains("{{user}}"),
        "{text}"
    );
    assert!(v["fields"]["description"]
        .as_str()
        .unwrap()
        .contains("Seraphina"));
}

#[tokio::test]
async fn lore_search_reads_the_linked_and_global_books() {
    let h = harness().await;
    let v = h
        .ok(
            "s1",
            "tavern_lore_search",
            json!({"query": "tell me about the forest of eldoria", "limit": 10, "maxTokens": 4000}),
        )
        .await;
    let items = v["items"].as_array().unwrap();
    assert!(!items.is_empty());
    assert_eq!(items[0]["reason"], "keyword");
    let sources: Vec<&str> = v["source"]["books"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["source"].as_str().unwrap())
        .collect();
    assert_eq!(
        sources,
        ["card-linked", "global"],
        "Eldoria's file is linked: it is the character's book (not the embedded copy), and \
         not loaded again as a global one"
    );
    let zh = h
        .ok("s1", "tavern_lore_search", json!({"query": "用塔罗牌占卜"}))
        .await;
    assert!(zh["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["book"] == "tarot"));
    let none = h
        .ok(
            "s1",
            "tavern_lore_search",
            json!({"query": "spaceship laser"}),
        )
        .await;
    assert_eq!(none["items"], json!([]));
    assert_eq!(none["sourceCount"], 0);
    let e = h
        .err(
            "s1",
            "tavern_lore_search",
            json!({"query": "x".repeat(501)}),
        )
        .await;
    assert_eq!(e.code(), "invalid-arguments");
    let small = h
        .ok(
            "s1",
            "tavern_lore_search",
            json!({"query": "eldoria forest", "maxTokens": 10}),
        )
        .await;
    assert_eq!(small["truncated"], true);
    assert_eq!(small["truncatedBy"], "max-tokens");
}

/// #29 item 2, on a real user's folder: their Seraphina card links the world "Eldoria" and
/// embeds the book it was made from; in their world file all four entries are disabled. As in
/// SillyTavern the linked file is the character's book, so none of them is served, and what is
/// served is labelled with where it came from; only with no linked file is the embedded copy
/// used (labelled `embedded`).
#[tokio::test]
async fn the_linked_world_file_wins_over_the_embedded_copy() {
    use tavern_tools::assets::provider::DirAssets;
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/user-folder");
    let search = |assets: DirAssets| async move {
        let store = Arc::new(MemStore::new(Arc::new(ManualClock::new(T0))));
        let registry = ToolRegistry::new(services(&store, assets), ToolLimits::default());
        let (state, _) = normalize_state(&json!({"sessionBindings": {"u1": {
            "character": "default_Seraphina", "chatId": "default_Seraphina - 1",
            "architecture": "agent-tavern", "contextMode": "dsh-native"}}}));
        let ctx = ToolContext::for_session(
            &AgentId::parse("u1").unwrap(),
            &SessionId::parse("u1").unwrap(),
            &state,
            1,
            "call-1",
            ToolLimits::default(),
            T0,
        )
        .unwrap();
        let query = json!({"query": "the forest of eldoria, the glade, the beasts and their magic", "limit": 20, "maxTokens": 4000});
        registry
            .call(&ctx, "tavern_lore_search", &query)
            .await
            .unwrap()
    };
    let linked = search(DirAssets::new(&folder, Vec::new(), Persona::default())).await;
    assert_eq!(
        linked["items"],
        json!([]),
        "every entry is disabled in the user's world file"
    );
    assert_eq!(
        linked["source"]["books"],
        json!([{"name": "Eldoria", "source": "card-linked", "entries": 4}])
    );
    // Without the world file (a folder with only the card), the embedded copy is the book.
    let alone = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(alone.path().join("characters")).unwrap();
    std::fs::copy(
        folder.join("characters/default_Seraphina.png"),
        alone.path().join("characters/default_Seraphina.png"),
    )
    .unwrap();
    let embedded = search(DirAssets::new(alone.path(), Vec::new(), Persona::default())).await;
    let items = embedded["items"].as_array().unwrap();
    assert!(!items.is_empty(), "{embedded}");
    assert!(items
        .iter()
        .all(|i| i["source"] == "embedded" && i["book"] == "Eldoria"));
    assert_eq!(embedded["source"]["books"][0]["source"], "embedded");
}

/// `query: ""` does what docs/TOOLS.md says: the query activates and ranks nothing, so only
/// always-on entries come back, when asked for — with what their content activates in turn
/// (SillyTavern scans constant entries' content for recursion too).
#[tokio::test]
async fn an_empty_lore_query_returns_only_always_on_entries_when_asked() {
    let h = harness().await;
    let none = h.ok("s1", "tavern_lore_search", json!({"query": ""})).await;
    assert_eq!(none["items"], json!([]));
    let constants = h
        .ok(
            "s1",
            "tavern_lore_search",
            json!({"query": "", "includeConstant": true, "limit": 20, "maxTokens": 4000}),
        )
        .await;
    let items = constants["items"].as_array().unwrap();
    let always_on: Vec<&Value> = items.iter().filter(|i| i["reason"] == "constant").collect();
    assert!(!always_on.is_empty());
    assert!(
        items
            .iter()
            .all(|i| i["reason"] == "constant" || i["reason"] == "recursion"),
        "{items:?}"
    );
    // The tarot book's always-on entries, with {{char}}/{{user}} replaced by the names.
    assert!(always_on.iter().all(|i| i["book"] == "tarot"));
    let text: String = always_on
        .iter()
        .map(|i| i["content"].as_str().unwrap())
        .collect();
    assert!(!text.contains("{{char}}") && !text.contains("{{user}}"));
    assert!(
        text.contains("Seraphina") && text.contains("白羽"),
        "{text}"
    );
}

/// Chats named as real users name them, and a headerless (older SillyTavern group) chat file:
/// history search reads every message and follows `main_chat` between such names.
#[tokio::test]
async fn history_search_reads_real_world_names_and_headerless_chats() {
    let state = json!({"sessionBindings": {
        "zh": {"character": "Seraphina", "chatId": "Branch #38 - 2024-1-5@16h52m07s", "architecture": "agent-tavern", "contextMode": "dsh-native"},
        "grp": {"character": "Seraphina", "chatId": "Party 🎲 (old group), 2023-5-1@12h00m00s", "architecture": "agent-tavern", "contextMode": "dsh-native"}
    }});
    let h = harness_with(state, ToolLimits::default()).await;
    let sera = CharacterName::parse("Seraphina").unwrap();
    let parent = ChatId::parse("七大姑 - 2024-10-05@21h59m30s").unwrap();
    h.store
        .rewrite_chat(
            &sera,
            &parent,
            &[
                tavern_core::chat::ChatLine::parse(r#"{"user_name":"白羽","character_name":"Seraphina","create_date":"2024-10-05@21h59m30s","chat_metadata":{}}"#).unwrap(),
                tavern_core::chat::ChatLine::parse(r#"{"name":"七大姑","is_user":false,"send_date":"2024-10-05@21h59m31s","mes":"银色大门在北方。"}"#).unwrap(),
            ],
            None,
        )
        .await
        .unwrap();
    h.store
        .rewrite_chat(
            &sera,
            &ChatId::parse("Branch #38 - 2024-1-5@16h52m07s").unwrap(),
            &[
                tavern_core::chat::ChatLine::parse(r#"{"user_name":"白羽","character_name":"Seraphina","create_date":"x","chat_metadata":{"main_chat":"七大姑 - 2024-10-05@21h59m30s"}}"#).unwrap(),
                tavern_core::chat::ChatLine::parse(r#"{"name":"白羽","is_user":true,"send_date":1,"mes":"然后呢？"}"#).unwrap(),
            ],
            None,
        )
        .await
        .unwrap();
    let v = h
        .ok(
            "zh",
            "tavern_history_search",
            json!({"query": "银色大门", "includeParent": true}),
        )
        .await;
    assert_eq!(v["items"][0]["chat"], "parent");
    assert_eq!(v["items"][0]["text"], "银色大门在北方。");
    let scene = h.ok("zh", "tavern_scene_get", json!({})).await;
    assert_eq!(scene["chat"]["parent"], "七大姑 - 2024-10-05@21h59m30s");

    // Every line a message: the first one is not mistaken for a header.
    h.store
        .rewrite_chat(
            &sera,
            &ChatId::parse("Party 🎲 (old group), 2023-5-1@12h00m00s").unwrap(),
            &[
                tavern_core::chat::ChatLine::parse(r#"{"name":"Seraphina","is_user":false,"is_name":true,"send_date":"May 1, 2023 12:00pm","mes":"The lanterns are lit for the party.","original_avatar":"Seraphina.png","extra":{}}"#).unwrap(),
                tavern_core::chat::ChatLine::parse(r#"{"name":"白羽","is_user":true,"is_name":true,"send_date":"May 1, 2023 12:01pm","mes":"Who else is coming?","extra":{}}"#).unwrap(),
            ],
            None,
        )
        .await
        .unwrap();
    let g = h
        .ok("grp", "tavern_history_search", json!({"query": "lanterns"}))
        .await;
    assert_eq!(g["items"][0]["index"], 0);
    assert_eq!(g["source"]["chats"][0]["messages"], 2);
}

/// A branch made as SillyTavern and our fork make one starts with copies of its parent's
/// messages: with `includeParent` each shared message comes back once (from the branch) and
/// counts once; the parent adds only what came after the branch point. A chat naming itself as
/// its parent is searched once.
#[tokio::test]
async fn a_branch_and_its_parent_share_messages_once() {
    let mut state = default_state();
    for (session, chat) in [("s4", "Seraphina - 3"), ("s5", "Seraphina - self")] {
        state["sessionBindings"][session] = json!({"character": "Seraphina", "chatId": chat, "architecture": "agent-tavern", "contextMode": "dsh-native"});
    }
    let h = harness_with(state, ToolLimits::default()).await;
    let sera = CharacterName::parse("Seraphina").unwrap();
    let parent = h
        .store
        .read_chat(&sera, &ChatId::parse("Seraphina - 1").unwrap())
        .await
        .unwrap()
        .unwrap();
    let header = |of: &str| {
        tavern_core::chat::ChatLine::parse(&format!(
            r#"{{"user_name":"白羽","character_name":"Seraphina","create_date":"x","chat_metadata":{{"main_chat":"{of}"}}}}"#
        ))
        .unwrap()
    };
    let own = tavern_core::chat::ChatLine::parse(
        r#"{"name":"白羽","is_user":true,"send_date":2,"mes":"Tell me about the lantern."}"#,
    )
    .unwrap();
    // The branch: the parent's first two messages, copied, then one of its own.
    let branch = [
        header("Seraphina - 1"),
        parent.lines[1].clone(),
        parent.lines[2].clone(),
        own,
    ];
    let id = ChatId::parse("Seraphina - 3").unwrap();
    h.store
        .rewrite_chat(&sera, &id, &branch, None)
        .await
        .unwrap();
    let v = h
        .ok(
            "s4",
            "tavern_history_search",
            json!({"query": "silver gate", "includeParent": true}),
        )
        .await;
    let mut found: Vec<(String, u64)> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["chat"].as_str().unwrap().to_owned(),
                i["index"].as_u64().unwrap(),
            )
        })
        .collect();
    found.sort();
    let want: Vec<(String, u64)> = [
        ("current", 0),
        ("current", 1),
        ("current", 2),
        ("parent", 2),
    ]
    .iter()
    .map(|(c, i)| ((*c).to_owned(), *i))
    .collect();
    assert_eq!(found, want, "{v}");
    assert_eq!(v["sourceCount"], 4, "{v}");
    assert_eq!(v["source"]["chats"][1]["messages"], 3, "{v}");
    // The parent's newest messages, after the branch point only.
    let newest = h
        .ok(
            "s4",
            "tavern_history_search",
            json!({"query": "", "includeParent": true, "limit": 10}),
        )
        .await;
    assert_eq!(newest["sourceCount"], 4, "{newest}");

    let me = ChatId::parse("Seraphina - self").unwrap();
    let lines = [header("Seraphina - self"), parent.lines[2].clone()];
    h.store
        .rewrite_chat(&sera, &me, &lines, None)
        .await
        .unwrap();
    let v = h
        .ok(
            "s5",
            "tavern_history_search",
            json!({"query": "silver gate", "includeParent": true}),
        )
        .await;
    assert_eq!(v["items"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["sourceCount"], 1, "{v}");
    assert_eq!(v["source"]["chats"].as_array().unwrap().len(), 1, "{v}");
}

#[tokio::test]
async fn history_search_finds_messages_and_the_parent_branch() {
    let h = harness().await;
    let v = h
        .ok(
            "s1",
            "tavern_history_search",
            json!({"query": "silver gate"}),
        )
        .await;
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert!(items[..2]
        .iter()
        .all(|i| i["text"].as_str().unwrap().contains("silver gate")));
    // The message before the question matches through its neighbour, at half weight: last.
    assert_eq!(items[2]["index"], 0);
    assert!(items[2]["score"].as_f64() < items[1]["score"].as_f64());
    let zh = h
        .ok("s1", "tavern_history_search", json!({"query": "银色大门"}))
        .await;
    assert_eq!(zh["items"][0]["index"], 2);
    let latest = h
        .ok(
            "s1",
            "tavern_history_search",
            json!({"query": "", "limit": 1}),
        )
        .await;
    assert_eq!(latest["items"][0]["index"], 2);
    assert_eq!(
        (latest["truncated"].clone(), latest["sourceCount"].clone()),
        (json!(true), json!(3))
    );
    let branch = h
        .ok(
            "s2",
            "tavern_history_search",
            json!({"query": "silver gate"}),
        )
        .await;
    assert_eq!(
        branch["items"],
        json!([]),
        "the branch alone has no such message"
    );
    let with_parent = h
        .ok(
            "s2",
            "tavern_history_search",
            json!({"query": "silver gate", "includeParent": true}),
        )
        .await;
    assert!(with_parent["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|i| i["chat"] == "parent"));
    assert_eq!(with_parent["items"].as_array().unwrap().len(), 3);
    let empty = h
        .ok("s3", "tavern_history_search", json!({"query": "anything"}))
        .await;
    assert_eq!(
        empty["items"],
        json!([]),
        "a chat with no file yet is empty, not an error"
    );
}

#[tokio::test]
async fn scene_get_describes_the_chat() {
    let h = harness().await;
    let v = h.ok("s1", "tavern_scene_get", json!({})).await;
    assert_eq!(v["character"], "Seraphina");
    assert_eq!(v["user"], "白羽");
    assert_eq!(v["chat"]["messageCount"], 3);
    assert_eq!(v["speakers"], json!(["Seraphina", "白羽"]));
    assert_eq!(v["note"], "Keep it gentle.");
    assert_eq!(v["contextMode"], "dsh-native");
    let b = h.ok("s2", "tavern_scene_get", json!({})).await;
    assert_eq!(b["chat"]["parent"], "Seraphina - 1");
}

/// #30 F7: a chat over the limit tools read is refused by the scene tool with the limit named,
/// before it is read.
#[tokio::test]
async fn scene_get_refuses_a_chat_over_the_read_limit() {
    use tavern_tools::history::MAX_CHAT_BYTES;
    let h = harness().await;
    let sera = CharacterName::parse("Seraphina").unwrap();
    let big = "a".repeat(usize::try_from(MAX_CHAT_BYTES).unwrap());
    let line = tavern_core::chat::ChatLine::parse(
        &json!({"name": "Seraphina", "is_user": false, "send_date": "May 8, 2023 1:56pm", "mes": big})
            .to_string(),
    )
    .unwrap();
    let id = ChatId::parse("Seraphina - 1").unwrap();
    let current = h.store.chat_revision(&sera, &id).await.unwrap();
    h.store
        .rewrite_chat(&sera, &id, &[line], current.as_ref())
        .await
        .unwrap();
    let e = h.err("s1", "tavern_scene_get", json!({})).await;
    assert_eq!(e.code(), "limit-exceeded", "{e}");
    assert!(e.to_string().contains("Seraphina - 1"), "{e}");
}

/// #29 item 4: the scene's scenario and author's note come back with SillyTavern's macros
/// substituted, as a model sees them there.
#[tokio::test]
async fn scene_get_substitutes_macros_in_the_note() {
    let h = harness().await;
    h.set_main_header(
        r#"{"user_name":"白羽","character_name":"Seraphina","chat_metadata":{"note_prompt":"Stay close to {{user}}, {{char}}. {{// hidden}}"}}"#,
    )
    .await;
    let v = h.ok("s1", "tavern_scene_get", json!({})).await;
    assert_eq!(v["note"], "Stay close to 白羽, Seraphina. ", "{v}");
}

/// A sentence encoder that records the thread of each call and prefers texts holding
/// `near` (and the query).
#[derive(Debug)]
struct ThreadRecorder {
    near: &'static str,
    query: &'static str,
    calls: std::sync::Mutex<Vec<std::thread::ThreadId>>,
    names: std::sync::Mutex<Vec<String>>,
}

impl tavern_search::Encoder for ThreadRecorder {
    fn name(&self) -> &str {
        "thread-recorder"
    }
    fn dims(&self) -> usize {
        2
    }
    fn encode(
        &self,
        texts: &[&str],
    ) -> Result<Vec<Vec<f32>>, tavern_search::sentences::EncodeError> {
        let me = std::thread::current();
        self.calls.lock().unwrap().push(me.id());
        self.names
            .lock()
            .unwrap()
            .push(me.name().unwrap_or_default().to_owned());
        Ok(texts
            .iter()
            .map(|t| {
                if *t == self.query || t.contains(self.near) {
                    vec![1.0, 0.0]
                } else {
                    vec![0.0, 1.0]
                }
            })
            .collect())
    }
}

/// A sentence ranker that records when its own, encoding `rescore` runs: no search on a
/// player's behalf may rank with it, only with what it prepared.
#[derive(Debug)]
struct Watched(
    tavern_search::SentenceRanker,
    std::sync::atomic::AtomicUsize,
);

impl tavern_search::Ranker for Watched {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn pool(&self, wanted: usize) -> usize {
        self.0.pool(wanted)
    }
    fn rescore(&self, query: &str, candidates: &mut [tavern_search::Candidate<'_>]) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.rescore(query, candidates);
    }
    fn prepares(&self) -> bool {
        self.0.prepares()
    }
    fn prepare(&self, query: &str, texts: &[&str]) -> Option<Arc<dyn tavern_search::Ranker>> {
        self.0.prepare(query, texts)
    }
    fn prepare_kept(&self, query: &str, texts: &[&str]) -> Option<Arc<dyn tavern_search::Ranker>> {
        self.0.prepare_kept(query, texts)
    }
}

/// With a sentence encoder, history, memory and lore search encode once per search, outside
/// the history cache and the store, on neither the async executor nor the CPU threads lore
/// key matching shares, and rank by what the encoder said.
#[tokio::test]
async fn searches_encode_once_off_the_executor_and_rank_by_meaning() {
    for (near, first) in [("Where is", 2), ("north", 3)] {
        let encoder = Arc::new(ThreadRecorder {
            near,
            query: "silver gate",
            calls: Default::default(),
            names: Default::default(),
        });
        let watched = Arc::new(Watched(
            tavern_search::SentenceRanker::new(encoder.clone()).with_weight(0.95),
            Default::default(),
        ));
        let ranker = tavern_search::RankerRef(watched.clone());
        let h = harness_ranked(default_state(), ToolLimits::default(), ranker).await;
        let v = h
            .ok(
                "s1",
                "tavern_history_search",
                json!({"query": "silver gate"}),
            )
            .await;
        assert_eq!(v["items"][0]["index"], first - 1, "{near}: {v}");
        let names = encoder.names.lock().unwrap().clone();
        assert_eq!(names.len(), 1, "one call, the search looked up: {names:?}");

        for text in [
            "The silver gate is closed tonight.".to_owned(),
            format!("{near}: the silver gate."),
        ] {
            h.ok("s1", "memory_write", json!({"content": text})).await;
        }
        let found = h
            .ok("s1", "memory_search", json!({"query": "silver gate"}))
            .await;
        assert!(
            found["items"][0]["content"]
                .as_str()
                .is_some_and(|c| c.contains(near)),
            "{found}"
        );
        assert_eq!(
            encoder.calls.lock().unwrap().len(),
            2,
            "one more call for memory"
        );
        // Lore: entries no key activates are ranked through the ranker.
        let lore = h
            .ok(
                "s1",
                "tavern_lore_search",
                json!({"query": "where is the silver gate of eldoria", "limit": 20}),
            )
            .await;
        assert!(!lore["items"].as_array().unwrap().is_empty());
        let calls = encoder.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 3, "one call for lore");
        let names = encoder.names.lock().unwrap().clone();
        for (call, name) in calls.iter().zip(&names) {
            assert_ne!(
                *call,
                std::thread::current().id(),
                "encoded on the executor"
            );
            assert!(
                !name.starts_with("tavern-cpu-"),
                "encoded on a CPU thread: {names:?}"
            );
        }
        assert_eq!(
            watched.1.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "a search ranked with the encoding ranker itself"
        );
        // Searched again, all kept: no more encoding.
        h.ok("s1", "memory_search", json!({"query": "silver gate"}))
            .await;
        assert_eq!(encoder.calls.lock().unwrap().len(), 3);
    }
}

#[tokio::test]
async fn memory_lifecycle_with_dedupe_conflict_recovery_and_forget() {
    let h = harness().await;
    let w = h
        .ok(
            "s1",
            "memory_write",
            json!({"content": "白羽 fears deep water.", "tags": ["fear"], "importance": 0.9}),
        )
        .await;
    assert_eq!(w["deduplicated"], false);
    assert_eq!(
        w["source"]["toolCallId"]
            .as_str()
            .map(|s| s.starts_with("call-")),
        Some(true)
    );
    assert_eq!(w["source"]["session"], "s1");
    let id = w["id"].as_str().unwrap().to_owned();
    let again = h
        .ok(
            "s1",
            "memory_write",
            json!({"content": "  白羽 FEARS deep   water. "}),
        )
        .await;
    assert_eq!(
        (again["id"].as_str(), again["deduplicated"].clone()),
        (Some(id.as_str()), json!(true))
    );

    let found = h.ok("s1", "memory_search", json!({"query": "water"})).await;
    assert_eq!(found["items"][0]["id"], id.as_str());
    assert!(found["items"][0]["score"].as_f64().unwrap() > 0.0);
    assert_eq!(
        h.ok("s1", "memory_search", json!({"query": "dragons"}))
            .await["items"],
        json!([])
    );

    let rev1 = w["revision"].as_str().unwrap().to_owned();
    let upd = h
        .ok(
            "s1",
            "memory_update",
            json!({"id": id, "revision": rev1, "content": "白羽 fears deep water and storms."}),
        )
        .await;
    let rev2 = upd["revision"].as_str().unwrap().to_owned();
    // A stale revision conflicts and says what is current; re-reading and retrying succeeds.
    let e = h
        .err(
            "s1",
            "memory_update",
            json!({"id": id, "revision": rev1, "importance": 0.1}),
        )
        .await;
    assert_eq!(e.to_json()["error"]["currentRevision"], rev2.as_str());
    let cur = h.ok("s1", "memory_read", json!({"id": id})).await;
    let retried = h
        .ok(
            "s1",
            "memory_update",
            json!({"id": id, "revision": cur["revision"], "importance": 0.1}),
        )
        .await;
    assert_eq!(retried["importance"], 0.1);
    assert_eq!(retried["content"], "白羽 fears deep water and storms.");
    assert_eq!(
        h.err(
            "s1",
            "memory_update",
            json!({"id": id, "revision": retried["revision"]})
        )
        .await
        .code(),
        "invalid-arguments"
    );

    let gone = h
        .ok(
            "s1",
            "memory_forget",
            json!({"id": id, "revision": retried["revision"]}),
        )
        .await;
    assert_eq!(gone["forgotten"], true);
    assert_eq!(
        h.err("s1", "memory_read", json!({"id": id})).await.code(),
        "not-found"
    );
    assert_eq!(
        h.ok("s1", "memory_search", json!({"query": "water"})).await["items"],
        json!([])
    );
    let audit = tavern_store::MemoryStore::memory_audit(&*h.store, &h.registry_scope("s1"), None)
        .await
        .unwrap();
    assert_eq!(audit.len(), 4, "create, two updates, forget — each audited");
    assert!(audit
        .iter()
        .all(|a| a.source.session.as_ref().map(|s| s.as_str()) == Some("s1")));
}

impl Harness {
    fn registry_scope(&self, session: &str) -> tavern_core::ScopeKey {
        let ctx = ToolContext::for_session(
            &AgentId::parse(session).unwrap(),
            &SessionId::parse(session).unwrap(),
            &self.state,
            1,
            "x",
            ToolLimits::default(),
            T0,
        )
        .unwrap();
        ctx.scope(tavern_core::Scope::Chat)
    }
}

#[tokio::test]
async fn memory_limits_and_errors() {
    let h = harness().await;
    let e = h
        .err("s1", "memory_write", json!({"content": "x".repeat(4097)}))
        .await;
    assert!(e.to_string().contains("content"), "{e}");
    let e = h
        .err(
            "s1",
            "memory_write",
            json!({"content": "ok", "importance": 2}),
        )
        .await;
    assert_eq!(e.to_json()["error"]["field"], "importance");
    let e = h
        .err(
            "s1",
            "memory_write",
            json!({"content": "ok", "tags": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}),
        )
        .await;
    assert_eq!(e.code(), "invalid-arguments");
    let e = h.err("s1", "memory_write", json!({"content": "   "})).await;
    assert_eq!(e.code(), "invalid-arguments");
    let e = h
        .err(
            "s1",
            "memory_write",
            json!({"content": "global fact", "scope": "global"}),
        )
        .await;
    assert_eq!(e.code(), "scope-denied");
    let e = h
        .err("s1", "memory_read", json!({"id": "../../etc/passwd"}))
        .await;
    assert_eq!(e.code(), "invalid-arguments");
    // The id's form is in the schema the model sees, and checked by it.
    assert!(e.to_string().contains("[A-Za-z0-9_-]"), "{e}");
    for tool in ["memory_read", "memory_update", "memory_forget"] {
        let spec = h.registry.specs().iter().find(|s| s.name == tool).unwrap();
        assert_eq!(
            spec.parameters["properties"]["id"]["pattern"], "^[A-Za-z0-9_-]{1,64}$",
            "{tool}"
        );
    }
    let e = h
        .err(
            "s1",
            "memory_forget",
            json!({"id": "m1", "revision": "r1-00000000000000000000000000000000"}),
        )
        .await;
    assert_eq!(e.code(), "not-found");
    let e = h
        .err("s1", "memory_search", json!({"query": "x", "limit": 51}))
        .await;
    assert_eq!(e.to_json()["error"]["field"], "limit");
    let e = h.err("s1", "memory_frobnicate", json!({})).await;
    assert_eq!(e.code(), "unknown-tool");
}

#[tokio::test]
async fn global_writes_and_forgetting_follow_the_settings() {
    let mut state = default_state();
    state["allowGlobalWrites"] = json!(true);
    state["requireForgetConfirmation"] = json!(true);
    let h = harness_with(state, ToolLimits::default()).await;
    let e = h
        .err(
            "s1",
            "memory_write",
            json!({"content": "shared fact", "scope": "global"}),
        )
        .await;
    assert!(e.to_string().contains("confirmation"), "{e}");
    let w = h
        .ok(
            "s1",
            "memory_write",
            json!({"content": "shared fact", "scope": "global", "confirmed": true}),
        )
        .await;
    let e = h.err("s1", "memory_forget", json!({"id": w["id"], "scope": "global", "revision": w["revision"], "confirmed": false})).await;
    assert_eq!(e.code(), "scope-denied");
    h.ok(
        "s1",
        "memory_forget",
        json!({"id": w["id"], "scope": "global", "revision": w["revision"], "confirmed": true}),
    )
    .await;
    // A global memory is visible from another character's session.
    let w = h
        .ok(
            "s1",
            "memory_write",
            json!({"content": "the moon is red", "scope": "global", "confirmed": true}),
        )
        .await;
    let seen = h
        .ok(
            "s3",
            "memory_search",
            json!({"query": "moon", "scopes": ["global"]}),
        )
        .await;
    assert_eq!(seen["items"][0]["id"], w["id"]);
}

#[tokio::test]
async fn scopes_isolate_chats_and_characters() {
    let h = harness().await;
    h.ok("s1", "memory_write", json!({"content": "chat one secret"}))
        .await;
    h.ok(
        "s1",
        "memory_write",
        json!({"content": "Seraphina-wide fact", "scope": "character"}),
    )
    .await;
    h.ok("s1", "variable_set", json!({"name": "hp", "value": 10}))
        .await;
    // Another chat with the same character: sees the character scope, not chat one's.
    let other_chat = h.ok("s2", "memory_search", json!({"query": ""})).await;
    let contents: Vec<&str> = other_chat["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["Seraphina-wide fact"]);
    assert_eq!(
        h.err("s2", "variable_get", json!({"name": "hp"}))
            .await
            .code(),
        "not-found"
    );
    // Another character sees neither.
    assert_eq!(
        h.ok("s3", "memory_search", json!({"query": ""})).await["items"],
        json!([])
    );
    assert_eq!(
        h.err("s3", "variable_get", json!({"name": "hp"}))
            .await
            .code(),
        "not-found"
    );
}

#[tokio::test]
async fn forged_ids_in_arguments_are_refused_and_reach_nothing() {
    let h = harness().await;
    let secret = h
        .ok("s1", "memory_write", json!({"content": "chat one secret"}))
        .await;
    h.ok("s1", "variable_set", json!({"name": "hp", "value": 10}))
        .await;
    for (name, args) in [
        (
            "memory_search",
            json!({"query": "secret", "sessionId": "s1"}),
        ),
        (
            "memory_search",
            json!({"query": "secret", "chatId": "Seraphina - 1"}),
        ),
        (
            "memory_read",
            json!({"id": secret["id"], "character": "Seraphina"}),
        ),
        (
            "variable_get",
            json!({"name": "hp", "scopeId": "chat:Seraphina:Seraphina - 1"}),
        ),
        (
            "variable_set",
            json!({"name": "hp", "value": 0, "session": "s1"}),
        ),
        (
            "tavern_history_search",
            json!({"query": "gate", "chat": "Seraphina - 1"}),
        ),
    ] {
        let e = h.err("s3", name, args).await;
        assert_eq!(e.code(), "invalid-arguments", "{name}");
        assert!(e.to_string().contains("is not an argument"), "{e}");
    }
    // Even a correct id names only a record within the caller's own scopes.
    assert_eq!(
        h.err("s3", "memory_read", json!({"id": secret["id"]}))
            .await
            .code(),
        "not-found"
    );
    assert_eq!(
        h.err("s2", "memory_read", json!({"id": secret["id"]}))
            .await
            .code(),
        "not-found"
    );
    // Scope kinds outside the enum are refused.
    assert_eq!(
        h.err(
            "s3",
            "variable_get",
            json!({"name": "hp", "scope": "chat:Seraphina"})
        )
        .await
        .code(),
        "invalid-arguments"
    );
}

#[tokio::test]
async fn only_agent_tavern_sessions_get_tools() {
    let h = harness().await;
    for session in ["st1", "g1", "nobody"] {
        let e = h.err(session, "memory_search", json!({"query": ""})).await;
        assert_eq!(e.code(), "unavailable", "{session}");
    }
}

#[tokio::test]
async fn variables_cas_patch_delete_list() {
    let h = harness().await;
    let a = h
        .ok(
            "s1",
            "variable_set",
            json!({"name": "basic.好感度", "value": 10}),
        )
        .await;
    let e = h
        .err(
            "s1",
            "variable_set",
            json!({"name": "basic.好感度", "value": 11}),
        )
        .await;
    assert_eq!(e.to_json()["error"]["currentRevision"], a["revision"]);
    let b = h
        .ok(
            "s1",
            "variable_set",
            json!({"name": "basic.好感度", "value": 11, "revision": a["revision"]}),
        )
        .await;
    assert_eq!(
        h.ok("s1", "variable_get", json!({"name": "basic.好感度"}))
            .await["value"],
        11
    );
    // Recover from a conflict: read the current revision, retry.
    let e = h
        .err(
            "s1",
            "variable_set",
            json!({"name": "basic.好感度", "value": 12, "revision": a["revision"]}),
        )
        .await;
    assert_eq!(e.code(), "revision-conflict");
    let cur = h
        .ok("s1", "variable_get", json!({"name": "basic.好感度"}))
        .await;
    h.ok(
        "s1",
        "variable_set",
        json!({"name": "basic.好感度", "value": 12, "revision": cur["revision"]}),
    )
    .await;
    assert_eq!(b["revision"], cur["revision"]);

    let list = h.ok("s1", "variable_list", json!({})).await;
    let scope_rev = list["scopeRevision"].clone();
    let hp_rev = list["items"][0]["revision"].clone();
    let patched = h
        .ok(
            "s1",
            "variable_patch",
            json!({"scopeRevision": scope_rev, "changes": [
                {"name": "basic.好感度", "value": 13, "revision": hp_rev},
                {"name": "当前周期", "value": {"day": 1, "phase": "dawn"}}
            ]}),
        )
        .await;
    assert_eq!(patched["items"].as_array().unwrap().len(), 2);
    // The same patch again: the scope moved on, nothing is written.
    let e = h
        .err(
            "s1",
            "variable_patch",
            json!({"scopeRevision": scope_rev, "changes": [{"name": "x", "value": 1}]}),
        )
        .await;
    assert_eq!(e.code(), "revision-conflict");
    assert_eq!(
        h.err("s1", "variable_get", json!({"name": "x"}))
            .await
            .code(),
        "not-found"
    );
    let e = h
        .err(
            "s1",
            "variable_patch",
            json!({"changes": [{"name": "x", "delete": true}]}),
        )
        .await;
    assert_eq!(e.to_json()["error"]["field"], "changes[0].revision");
    let e = h.err("s1", "variable_patch", json!({"changes": []})).await;
    assert_eq!(e.code(), "invalid-arguments");
    let e = h
        .err("s1", "variable_set", json!({"name": "1bad", "value": 1}))
        .await;
    assert_eq!(e.to_json()["error"]["field"], "name");
    let e = h
        .err(
            "s1",
            "variable_set",
            json!({"name": "big", "value": "x".repeat(40_000)}),
        )
        .await;
    assert_eq!(e.code(), "limit-exceeded");

    let day = h
        .ok("s1", "variable_get", json!({"name": "当前周期"}))
        .await;
    h.ok(
        "s1",
        "variable_delete",
        json!({"name": "当前周期", "revision": day["revision"]}),
    )
    .await;
    assert_eq!(
        h.err("s1", "variable_get", json!({"name": "当前周期"}))
            .await
            .code(),
        "not-found"
    );
    let listing = h
        .ok("s1", "variable_list", json!({"prefix": "basic."}))
        .await;
    assert_eq!(listing["total"], 1);
    assert_eq!(listing["items"][0]["preview"], "13");
    let turn = h
        .ok(
            "s1",
            "variable_set",
            json!({"name": "scratch", "value": true, "scope": "turn"}),
        )
        .await;
    assert_eq!(turn["scope"], "turn");
}

#[tokio::test]
async fn per_turn_call_and_write_limits_name_the_limit() {
    let limits = ToolLimits {
        calls_per_turn: 4,
        writes_per_turn: 2,
        ..ToolLimits::default()
    };
    let mut h = harness_with(default_state(), limits).await;
    h.ok("s1", "variable_set", json!({"name": "a", "value": 1}))
        .await;
    h.ok("s1", "variable_set", json!({"name": "b", "value": 1}))
        .await;
    let e = h
        .err("s1", "variable_set", json!({"name": "c", "value": 1}))
        .await;
    assert_eq!(e.to_json()["error"]["limit"], "writing tool calls per turn");
    h.ok("s1", "variable_get", json!({"name": "a"})).await;
    let e = h.err("s1", "variable_get", json!({"name": "a"})).await;
    assert_eq!(e.to_json()["error"]["limit"], "tool calls per turn");
    // Another session has its own budget; a new turn resets it.
    h.ok("s2", "variable_list", json!({})).await;
    h.turn = 2;
    h.ok("s1", "variable_get", json!({"name": "a"})).await;
}

#[tokio::test]
async fn a_retried_call_does_not_duplicate_a_memory() {
    let h = harness().await;
    let ctx = ToolContext::for_session(
        &AgentId::parse("s1").unwrap(),
        &SessionId::parse("s1").unwrap(),
        &h.state,
        1,
        "call-fixed",
        ToolLimits::default(),
        T0,
    )
    .unwrap();
    let a = h
        .registry
        .call(&ctx, "memory_write", &json!({"content": "written once"}))
        .await
        .unwrap();
    let b = h
        .registry
        .call(&ctx, "memory_write", &json!({"content": "written once"}))
        .await
        .unwrap();
    assert_eq!(a["id"], b["id"]);
    assert_eq!(b["deduplicated"], true);
}

#[test]
fn docs_tools_md_matches_the_schemas() {
    let limits = ToolLimits::default();
    let want = tavern_tools::docs::render(&tavern_tools::tools::specs(&limits), &limits);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/TOOLS.md");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/TOOLS.md is out of date: run `cargo run -p tavern-tools --bin tools-doc > docs/TOOLS.md`"
    );
}

/// Result schemas stay inside the JSON Schema subset hosts enforce on tool outputs (DSH rc.6:
/// `type` as one string, `properties`/`required`/boolean `additionalProperties` on objects,
/// `items` on arrays, scalar `enum`/`const`, `oneOf` of two or more, annotations; object root).
#[test]
fn result_schemas_stay_inside_the_host_output_subset() {
    fn check(node: &Value, path: &str, errors: &mut Vec<String>) {
        let Some(obj) = node.as_object() else {
            errors.push(format!("{path} is not a schema object"));
            return;
        };
        const ALLOWED: [&str; 12] = [
            "type",
            "oneOf",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "enum",
            "const",
            "description",
            "title",
            "default",
            "examples",
        ];
        for key in obj.keys() {
            if !ALLOWED.contains(&key.as_str()) {
                errors.push(format!("{path}.{key} is not in the subset"));
            }
        }
        match (obj.get("type"), obj.get("oneOf")) {
            (Some(_), Some(_)) => errors.push(format!("{path} has both type and oneOf")),
            (Some(Value::String(t)), None) => {
                let scalar =
                    ["string", "number", "integer", "boolean", "null"].contains(&t.as_str());
                for (key, ok) in [
                    ("properties", t == "object"),
                    ("required", t == "object"),
                    ("additionalProperties", t == "object"),
                    ("items", t == "array"),
                    ("enum", scalar),
                    ("const", scalar),
                ] {
                    if obj.contains_key(key) && !ok {
                        errors.push(format!("{path}.{key} not allowed on {t}"));
                    }
                }
                if ![
                    "object", "array", "string", "number", "integer", "boolean", "null",
                ]
                .contains(&t.as_str())
                {
                    errors.push(format!("{path}.type {t} unknown"));
                }
            }
            (Some(other), None) => {
                errors.push(format!("{path}.type must be one string, is {other}"))
            }
            (None, Some(Value::Array(options))) if options.len() >= 2 => {
                for (i, o) in options.iter().enumerate() {
                    check(o, &format!("{path}.oneOf[{i}]"), errors);
                }
            }
            (None, Some(_)) => errors.push(format!("{path}.oneOf needs two or more schemas")),
            (None, None) => {
                for key in [
                    "properties",
                    "required",
                    "additionalProperties",
                    "items",
                    "enum",
                    "const",
                ] {
                    if obj.contains_key(key) {
                        errors.push(format!("{path}.{key} needs a type"));
                    }
                }
            }
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                check(v, &format!("{path}.properties.{k}"), errors);
            }
        }
        if let Some(items) = obj.get("items") {
            check(items, &format!("{path}.items"), errors);
        }
        if let Some(ap) = obj.get("additionalProperties") {
            if !ap.is_boolean() {
                errors.push(format!("{path}.additionalProperties must be a boolean"));
            }
        }
    }
    let limits = ToolLimits::default();
    for spec in tavern_tools::tools::specs(&limits) {
        let mut errors = Vec::new();
        assert_eq!(spec.result["type"], "object", "{}: object root", spec.name);
        check(&spec.result, "schema", &mut errors);
        assert!(errors.is_empty(), "{}: {errors:?}", spec.name);
    }
}

/// Arguments are typed: what the code enforces is in the schema, and what the schema refuses
/// never reaches a tool (no unknown kind read as `semantic`, no missing id read as `""`, no
/// `null` for an optional argument).
#[tokio::test]
async fn typed_arguments_refuse_what_the_schema_refuses() {
    let h = harness().await;
    let spec = |name: &str| {
        h.registry
            .specs()
            .iter()
            .find(|s| s.name == name)
            .unwrap()
            .parameters
            .clone()
    };
    assert_eq!(
        spec("memory_write")["properties"]["kind"]["enum"],
        json!(["semantic", "episodic"])
    );
    assert_eq!(
        spec("variable_get")["properties"]["scope"]["enum"],
        json!(["turn", "chat", "character", "agent", "global"])
    );
    assert_eq!(
        spec("memory_read")["properties"]["scope"]["enum"],
        json!(["chat", "character", "agent", "global"])
    );
    // Names: bounded in length, checked by the server (no pattern: see
    // `variable_names_are_checked_by_the_server_with_the_core_rule`).
    assert_eq!(spec("variable_set")["properties"]["name"]["maxLength"], 64);
    assert!(spec("variable_set")["properties"]["name"]
        .get("pattern")
        .is_none());
    assert!(spec("variable_set")["properties"]["value"]
        .get("type")
        .is_none());
    // `(tool, arguments, the field the error names)`
    let cases = [
        (
            "memory_write",
            json!({"content": "x", "kind": "dream"}),
            "kind",
        ),
        (
            "memory_write",
            json!({"content": "x", "importance": "high"}),
            "importance",
        ),
        ("memory_write", json!({"content": null}), "content"),
        (
            "memory_write",
            json!({"content": "x", "scope": "turn"}),
            "scope",
        ),
        ("memory_read", json!({}), "id"),
        ("memory_read", json!({"id": ""}), "id"),
        ("variable_get", json!({"name": "1st"}), "name"),
        (
            "variable_get",
            json!({"name": "hp", "scope": "session"}),
            "scope",
        ),
        (
            "memory_search",
            json!({"query": "x", "tagMatch": "most"}),
            "tagMatch",
        ),
        (
            "tavern_character_get",
            json!({"fields": ["secrets"]}),
            "fields[0]",
        ),
    ];
    for (tool, args, field) in cases {
        match h.call("s1", tool, args.clone()).await {
            Err(ToolError::InvalidArguments { field: f, .. }) => {
                assert_eq!(f, field, "{tool} {args}")
            }
            other => panic!("{tool} {args}: {other:?}"),
        }
    }
    // `null` for an optional argument is "not given" (strict function-calling modes send them).
    let nulls = h
        .ok(
            "s1",
            "memory_search",
            json!({"query": "x", "limit": null, "tags": null, "tagMatch": null}),
        )
        .await;
    assert!(nulls["items"].is_array(), "{nulls}");
    // Names the pattern allows are what `VariableName` allows, any script included.
    for name in ["hp", "basic.好感度", "当前周期", "_x-1"] {
        let out = h
            .ok(
                "s1",
                "variable_set",
                json!({"name": name, "value": {"any": [1, "json"]}}),
            )
            .await;
        assert_eq!(out["name"], name);
        assert_eq!(out["value"], json!({"any": [1, "json"]}));
    }
}

#[tokio::test]
async fn history_search_finds_speakers_and_other_word_forms() {
    let h = harness().await;
    // "spirit" is stemmed like the message's "spirits"; the speaker's name is indexed too.
    let v = h
        .ok(
            "s1",
            "tavern_history_search",
            json!({"query": "What did Seraphina say about the spirit?", "limit": 1}),
        )
        .await;
    assert_eq!(v["items"][0]["index"], 2);
    let asked = h
        .ok(
            "s1",
            "tavern_history_search",
            json!({"query": "白羽", "limit": 1}),
        )
        .await;
    assert_eq!(asked["items"][0]["index"], 1, "{asked}");
    let limit = h
        .ok(
            "s1",
            "tavern_history_search",
            json!({"query": "gate", "limit": 50}),
        )
        .await;
    assert!(limit["items"].as_array().unwrap().len() <= 50);
    let too_many = h
        .err("s1", "memory_search", json!({"query": "gate", "limit": 51}))
        .await;
    assert!(too_many.to_string().contains("limit"), "{too_many}");
}

#[tokio::test]
async fn memory_search_finds_other_word_forms() {
    let h = harness().await;
    h.ok(
        "s1",
        "memory_write",
        json!({"content": "Kai fears deep water."}),
    )
    .await;
    let v = h
        .ok(
            "s1",
            "memory_search",
            json!({"query": "What is Kai's fear?"}),
        )
        .await;
    assert_eq!(v["items"][0]["content"], "Kai fears deep water.");
}

/// Variable names (#29 item 8): the schemas carry no pattern a client's regex engine may not
/// know (`\p{…}` broke Python's `re`, and with it every call from the official Python SDK), and
/// the server accepts exactly the names `VariableName` accepts, refusing the rest as invalid
/// arguments: every name the store can hold is reachable by the model.
#[test]
fn variable_names_are_checked_by_the_server_with_the_core_rule() {
    let limits = ToolLimits {
        calls_per_turn: usize::MAX,
        ..ToolLimits::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let h = rt.block_on(harness_with(default_state(), limits));
    for spec in h.registry.specs() {
        let text = spec.parameters.to_string();
        assert!(
            !text.contains("\\\\p{") && !text.contains("\\\\P{"),
            "{}: a pattern with a Unicode property: {text}",
            spec.name
        );
    }
    let mut names: Vec<String> = [
        "hp",
        "basic.好感度",
        "当前周期",
        "_x-1",
        "किला",
        "กิน",
        "Ⅻ",
        "1st",
        "a b",
        "-x",
        "",
        "é",
        "x\u{301}",
        "ⅻ2",
        "a/b",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    // Every 5th char of a few planes, alone and after a letter.
    for c in (0u32..0x3000)
        .chain(0xA000..0xAC00)
        .step_by(5)
        .filter_map(char::from_u32)
    {
        names.push(c.to_string());
        names.push(format!("a{c}"));
    }
    for name in names {
        let core = tavern_core::VariableName::parse(name.as_str()).is_ok();
        let served = rt.block_on(h.call("s1", "variable_get", json!({"name": name})));
        let refused = matches!(&served, Err(e) if e.code() == "invalid-arguments");
        assert_eq!(
            core,
            !refused,
            "{name:?} ({:?}): {served:?}",
            name.chars().collect::<Vec<_>>()
        );
    }
}

/// The memory id pattern in the schemas accepts exactly what `MemoryId::parse` accepts.
#[test]
fn the_memory_id_pattern_is_the_core_rule() {
    let h = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(harness());
    let spec = h
        .registry
        .specs()
        .iter()
        .find(|s| s.name == "memory_read")
        .unwrap()
        .parameters
        .clone();
    let pattern = spec["properties"]["id"]["pattern"].as_str().unwrap();
    let re = regress::Regex::with_flags(pattern, "u").unwrap();
    let mut ids: Vec<String> = [
        "m-1",
        "A_b",
        "x".repeat(64).as_str(),
        "x".repeat(65).as_str(),
        "",
        "a b",
        "é",
        "../x",
        "m.1",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for c in (0u32..0x3000).filter_map(char::from_u32) {
        ids.push(c.to_string());
        ids.push(format!("a{c}"));
    }
    for id in ids {
        let core = tavern_core::MemoryId::parse(id.as_str()).is_ok();
        assert_eq!(core, re.find(&id).is_some(), "{id:?}");
    }
}

/// #29 item 1: a listing never comes back empty while the chat has messages — when the newest
/// message alone is over the token budget (a 4,773-character Chinese message, as in real
/// chats), its start comes back marked as cut; a smaller budget cuts more, never to nothing.
#[tokio::test]
async fn a_message_over_the_budget_comes_back_cut_not_as_nothing() {
    let h = harness().await;
    let who = CharacterName::parse("Megumin").unwrap();
    let chat = ChatId::parse("Megumin - 1").unwrap();
    let long: String = "爆裂魔法是最强的魔法，"
        .chars()
        .cycle()
        .take(4773)
        .collect();
    let lines: Vec<tavern_core::chat::ChatLine> = [
        json!({"user_name": "白羽", "character_name": "Megumin", "create_date": "x", "chat_metadata": {}}),
        json!({"name": "白羽", "is_user": true, "send_date": 1, "mes": "你好。"}),
        json!({"name": "Megumin", "is_user": false, "send_date": 2, "mes": long}),
    ]
    .iter()
    .map(|v| tavern_core::chat::ChatLine::parse(&v.to_string()).unwrap())
    .collect();
    h.store
        .rewrite_chat(&who, &chat, &lines, None)
        .await
        .unwrap();
    for max_tokens in [None, Some(4000), Some(200)] {
        let mut args = json!({"query": ""});
        if let Some(t) = max_tokens {
            args["maxTokens"] = json!(t);
        }
        let v = h.ok("s3", "tavern_history_search", args).await;
        let items = v["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{max_tokens:?}: {v}");
        assert_eq!(items[0]["index"], 1, "the newest message");
        let text = items[0]["text"].as_str().unwrap();
        assert!(text.starts_with("爆裂魔法是最强的魔法"), "{text}");
        assert!(text.ends_with("of 4773 characters shown]"), "{text}");
        assert!(text.chars().count() < 4773);
        assert_eq!(v["truncatedBy"], "max-tokens", "{v}");
        let budget = max_tokens.unwrap_or(1000);
        let spent =
            tavern_core::TokenEstimator::estimate(&tavern_core::DefaultTokenEstimator, text);
        assert!(spent <= budget, "{spent} tokens over a budget of {budget}");
    }
}

/// #29 item 5: a session whose character has no card (as a group's has none) still reads the
/// persona, and a headerless chat (as SillyTavern writes group chats) dates from its first
/// message; card fields without a card are still "not found".
#[tokio::test]
async fn a_cardless_session_reads_the_persona_and_its_chat_date() {
    let state = json!({"sessionBindings": {
        "nc": {"character": "Party", "chatId": "p", "architecture": "agent-tavern", "contextMode": "dsh-native"}
    }});
    let h = harness_with(state, ToolLimits::default()).await;
    let persona = h
        .ok(
            "nc",
            "tavern_character_get",
            json!({"fields": ["persona", "group_members"]}),
        )
        .await;
    assert_eq!(persona["fields"]["persona"]["name"], "白羽", "{persona}");
    assert_eq!(persona["source"]["spec"], "none");
    assert_eq!(persona["source"]["character"], "Party");
    let e = h
        .err(
            "nc",
            "tavern_character_get",
            json!({"fields": ["description"]}),
        )
        .await;
    assert_eq!(e.code(), "not-found");
    // A group chat as SillyTavern writes it: no header, the first line a system message.
    let lines: Vec<tavern_core::chat::ChatLine> = [
        r#"{"name":"SillyTavern System","is_user":false,"is_system":true,"is_group":true,"mes":"Group chat created.","send_date":"July 13, 2024 10:51am"}"#,
        r#"{"name":"白羽","is_user":true,"send_date":"July 13, 2024 11:06am","mes":"Hello, all."}"#,
    ]
    .iter()
    .map(|l| tavern_core::chat::ChatLine::parse(l).unwrap())
    .collect();
    h.store
        .rewrite_chat(
            &CharacterName::parse("Party").unwrap(),
            &ChatId::parse("p").unwrap(),
            &lines,
            None,
        )
        .await
        .unwrap();
    let scene = h.ok("nc", "tavern_scene_get", json!({})).await;
    assert_eq!(
        scene["chat"]["createDate"], "July 13, 2024 10:51am",
        "{scene}"
    );
    assert_eq!(scene["chat"]["messageCount"], 2);
}

/// #29 item 4: `{{idle_duration}}` counts from the user's message before the chat's newest one,
/// read from SillyTavern's local-time send dates in the user's zone, and `{{time}}`/`{{date}}`
/// show the user's local time (card fields and the scene; lore reads the same values).
#[tokio::test]
async fn idle_duration_and_local_time_follow_the_chat_and_the_users_zone() {
    // 2026-12-03 15:05 UTC: 23:05 in Beijing, a Thursday.
    let clock = Arc::new(ManualClock::new(Timestamp(1_796_310_300_000)));
    let store = Arc::new(MemStore::new(clock.clone()));
    let mut assets = MemAssets::default();
    // The smallest card SillyTavern writes (spec v2), its scenario using the time macros.
    let card = json!({"spec": "chara_card_v2", "spec_version": "2.0", "data": {
        "name": "Mira", "description": "A lantern keeper.",
        "scenario": "{{user}} was away {{idle_duration}}; it is {{time}}, {{weekday}} {{date}}."}});
    assets.cards.insert(
        "Mira".into(),
        Card::from_json("Mira", card.to_string().as_bytes())
            .unwrap()
            .into(),
    );
    assets.persona = Persona {
        name: "白羽".into(),
        description: String::new(),
    };
    let mut services = services(&store, assets);
    services.zone = Arc::new(tavern_core::FixedOffset(480));
    let (mira, chat) = (
        CharacterName::parse("Mira").unwrap(),
        ChatId::parse("Mira - 1").unwrap(),
    );
    let lines: Vec<_> = [
        r#"{"user_name":"白羽","character_name":"Mira","create_date":"2026-11-30@20h00m00s","chat_metadata":{}}"#,
        // Written in Beijing on December 1 at 9:00 (01:00 UTC), 2 days 14 hours ago.
        r#"{"name":"白羽","is_user":true,"is_system":false,"send_date":"December 1, 2026 9:00am","mes":"Goodnight."}"#,
        r#"{"name":"Mira","is_user":false,"is_system":false,"send_date":"December 1, 2026 9:01am","mes":"Sleep well."}"#,
        r#"{"name":"System","is_user":false,"is_system":true,"send_date":"December 3, 2026 11:04pm","mes":"(a note)"}"#,
        // The newest message, just sent: not what idle time counts from.
        r#"{"name":"白羽","is_user":true,"is_system":false,"send_date":"December 3, 2026 11:05pm","mes":"I'm back."}"#,
    ]
    .iter()
    .map(|l| tavern_core::chat::ChatLine::parse(l).unwrap())
    .collect();
    store
        .rewrite_chat(&mira, &chat, &lines, None)
        .await
        .unwrap();
    let state = json!({"sessionBindings": {"s1": {"character": "Mira", "chatId": "Mira - 1", "architecture": "agent-tavern", "contextMode": "dsh-native"}}});
    let h = Harness {
        registry: ToolRegistry::new(services, ToolLimits::default()),
        store,
        state: normalize_state(&state).0,
        clock,
        turn: 1,
    };
    let want = "白羽 was away 3 days; it is 11:05 PM, Thursday December 3, 2026.";
    let card = h
        .ok(
            "s1",
            "tavern_character_get",
            json!({"fields": ["scenario"]}),
        )
        .await;
    assert_eq!(card["fields"]["scenario"], want, "{card}");
    let scene = h.ok("s1", "tavern_scene_get", json!({})).await;
    assert_eq!(scene["scenario"], want, "{scene}");

    // A chat with no earlier user message: SillyTavern's "just now".
    let fresh = ChatId::parse("Mira - 1").unwrap();
    let only = vec![lines[0].clone(), lines[4].clone()];
    let rev = h.store.chat_revision(&mira, &fresh).await.unwrap();
    h.store
        .rewrite_chat(&mira, &fresh, &only, rev.as_ref())
        .await
        .unwrap();
    let card = h
        .ok(
            "s1",
            "tavern_character_get",
            json!({"fields": ["scenario"]}),
        )
        .await;
    assert!(
        card["fields"]["scenario"]
            .as_str()
            .unwrap()
            .starts_with("白羽 was away just now;"),
        "{card}"
    );
}

/// Newer SillyTavern writes `"user_name": "unused"` in a chat's header: the scene names the
/// chat's persona, never "unused".
#[tokio::test]
async fn scene_user_is_the_persona_when_the_header_says_unused() {
    let h = harness().await;
    h.set_main_header(
        r#"{"user_name":"unused","character_name":"unused","create_date":"2024-09-19@20h03m29s","chat_metadata":{}}"#,
    )
    .await;
    let v = h.ok("s1", "tavern_scene_get", json!({})).await;
    assert_eq!(v["user"], "白羽", "{v}");
}
