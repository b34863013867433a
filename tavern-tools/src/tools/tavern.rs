//! The read-only tavern tools: `tavern_character_get`, `tavern_lore_search`,
//! `tavern_history_search`, `tavern_scene_get`.

use std::sync::Arc;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tavern_core::chat::{ChatDocument, ChatLine, SendDate};
use tavern_core::macros;
use tavern_core::{ChatId, DefaultTokenEstimator, TokenEstimator};

use super::{any_value, fit, macro_head, rounded, Listing, TruncatedBy};
use crate::assets::card::{Card, CARD_TEXT_FIELDS};
use crate::assets::provider::Persona;
use crate::assets::world::WorldBook;
use crate::context::ToolContext;
use crate::error::ToolError;
use crate::history::{ChatSources, HistoryItem};
use crate::lore::{self, LoreContext, LoreOptions, LoreSource};
use crate::registry::ToolServices;
use crate::tool::TypedTool;

const DEFAULT_FIELDS: [&str; 4] = ["name", "description", "personality", "scenario"];

fn object_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object"})
}

// --- argument types ------------------------------------------------------------------------

/// A field `tavern_character_get` serves: the card's text fields, and `alternate_greetings`,
/// `tags`, `persona`, `group_members`, `character_note` (the card's Character's Note,
/// `extensions.depth_prompt`: its text, depth and role, as data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Field {
    Name,
    Description,
    Personality,
    Scenario,
    FirstMes,
    MesExample,
    CreatorNotes,
    SystemPrompt,
    PostHistoryInstructions,
    Nickname,
    AlternateGreetings,
    Tags,
    Persona,
    GroupMembers,
    CharacterNote,
}

impl Field {
    fn label(self) -> &'static str {
        match self {
            Self::Name => "name",
            Self::Description => "description",
            Self::Personality => "personality",
            Self::Scenario => "scenario",
            Self::FirstMes => "first_mes",
            Self::MesExample => "mes_example",
            Self::CreatorNotes => "creator_notes",
            Self::SystemPrompt => "system_prompt",
            Self::PostHistoryInstructions => "post_history_instructions",
            Self::Nickname => "nickname",
            Self::AlternateGreetings => "alternate_greetings",
            Self::Tags => "tags",
            Self::Persona => "persona",
            Self::GroupMembers => "group_members",
            Self::CharacterNote => "character_note",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct CharacterArgs {
    /// Which fields (default name, description, personality, scenario).
    #[schemars(length(min = 1, max = 15))]
    fields: Option<Vec<Field>>,
    max_tokens: Option<usize>,
    /// In a group chat: read this member's card instead (a `name` or `character` from
    /// `group_members`).
    #[schemars(length(min = 1, max = 200))]
    member: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct LoreArgs {
    /// Text to activate lore with (keys are matched in it) and words to rank by; an empty
    /// string activates and ranks nothing: only always-on entries come back (when
    /// includeConstant is set), with the entries their content activates.
    query: String,
    limit: Option<usize>,
    max_tokens: Option<usize>,
    /// Also return always-on (constant) entries.
    #[serde(default)]
    include_constant: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct HistoryArgs {
    /// Words to look for in the chat history; an empty string lists the most recent.
    query: String,
    limit: Option<usize>,
    max_tokens: Option<usize>,
    /// Also search the chat this one was branched from (its messages after those this chat copied).
    #[serde(default)]
    include_parent: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct SceneArgs {
    max_tokens: Option<usize>,
}

// --- result types --------------------------------------------------------------------------

/// Card fields as asked for.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CharacterOut {
    /// The fields, by name.
    #[schemars(schema_with = "object_schema")]
    fields: Map<String, Value>,
    /// Fields cut (text) or left out (lists) to fit the token budget.
    truncated_fields: Vec<&'static str>,
    /// The card.
    source: CardSource,
}

/// Which card the fields come from.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct CardSource {
    /// Always `card`.
    kind: &'static str,
    character: String,
    /// `v1`, `v2` or `v3`; `none` when only the persona or the group's members were asked
    /// and no card was read (a group session has none).
    spec: &'static str,
}

/// Why a lore entry is in the result.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LoreReason {
    Keyword,
    Recursion,
    Lexical,
    Constant,
}

/// One lore entry.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct LoreItem {
    book: String,
    /// `chat`, `embedded`, `card-linked`, `character` or `global`.
    source: &'static str,
    uid: i64,
    comment: String,
    keys: Vec<String>,
    content: String,
    reason: LoreReason,
    score: f64,
}

/// The books searched.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct LoreSources {
    /// Always `lore`.
    kind: &'static str,
    books: Vec<BookOut>,
}

/// A book searched.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct BookOut {
    name: String,
    source: &'static str,
    entries: usize,
}

/// Lore search results.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct LoreOut {
    #[serde(flatten)]
    listing: Listing<LoreItem, LoreSources>,
    /// Keys that could not be used as regular expressions.
    warnings: Vec<String>,
    /// Entries skipped because the same entry came earlier from another book.
    duplicates: usize,
}

/// The chat in a scene.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SceneChat {
    id: String,
    message_count: usize,
    #[schemars(schema_with = "any_value")]
    create_date: Value,
    #[schemars(schema_with = "any_value")]
    last_message_date: Value,
    /// The chat this one was branched from.
    parent: Option<String>,
}

/// The current scene.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SceneOut {
    character: String,
    user: String,
    chat: SceneChat,
    /// Recent speakers, latest first.
    speakers: Vec<String>,
    scenario: String,
    /// The chat's author's note.
    note: String,
    architecture: &'static str,
    context_mode: &'static str,
    turn: u64,
    now: i64,
    truncated_fields: Vec<&'static str>,
}

/// A seed for `{{random}}` from a call id: the same call draws the same.
fn seed_of(call_id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    call_id.hash(&mut h);
    h.finish()
}

/// What SillyTavern's time macros read for this call: the user's offset from UTC now, and
/// when the user wrote before the chat's newest message (`{{idle_duration}}`), from the chat's
/// cached history index (the one `tavern_history_search` keeps up to date incrementally).
async fn macro_times(
    svc: &ToolServices,
    ctx: &ToolContext,
) -> (i32, Option<tavern_core::Timestamp>) {
    let offset = svc.zone.minutes_at(ctx.now());
    let target = ctx.binding().target();
    let zone = svc.zone.clone();
    let last = svc
        .history
        .with_index(
            &*svc.chats,
            &target.character,
            &target.chat_id,
            move |index, _| index.previous_user_message(&*zone),
        )
        .await
        .ok()
        .flatten()
        .flatten();
    (offset, last)
}

async fn card(svc: &ToolServices, ctx: &ToolContext) -> Result<Arc<Card>, ToolError> {
    let character = &ctx.binding().target().character;
    svc.assets
        .card(character)
        .await
        .map_err(|e| ToolError::Unavailable {
            reason: e.to_string(),
        })?
        .ok_or_else(|| ToolError::NotFound {
            what: format!("card of {character}"),
        })
}

/// The current chat, or `None` when it has no file yet.
async fn chat(
    svc: &ToolServices,
    ctx: &ToolContext,
    id: &ChatId,
) -> Result<Option<ChatDocument>, ToolError> {
    let character = &ctx.binding().target().character;
    // Too large, and it is not read at all (its revision says how large it is).
    let bytes = svc
        .chats
        .chat_revision(character, id)
        .await?
        .and_then(|r| r.content())
        .map_or(0, |c| c.bytes);
    if bytes > crate::history::MAX_CHAT_BYTES {
        return Err(ToolError::LimitExceeded {
            limit: format!("chat bytes a tool reads (chat {id})"),
            max: usize::try_from(crate::history::MAX_CHAT_BYTES).unwrap_or(usize::MAX),
            actual: usize::try_from(bytes).unwrap_or(usize::MAX),
        });
    }
    let Some(file) = svc.chats.read_chat(character, id).await? else {
        return Ok(None);
    };
    ChatDocument::from_lines(file.lines)
        .map(Some)
        .map_err(|e| ToolError::Unavailable {
            reason: format!("chat {id} is unreadable: {e}"),
        })
}

/// The session's group: the group its chat is filed under, for a session bound to a group's
/// chat (group chats are `st` sessions for a host; a session of MCP mode, say, bound to a
/// group's chat is one whose "character" names a group and no card). `None` otherwise.
async fn session_group(
    svc: &ToolServices,
    ctx: &ToolContext,
) -> Result<Option<Arc<crate::assets::group::Group>>, ToolError> {
    let target = ctx.binding().target();
    if !target.group
        && svc
            .assets
            .card(&target.character)
            .await
            .ok()
            .flatten()
            .is_some()
    {
        return Ok(None);
    }
    svc.assets
        .group(target.character.as_str())
        .await
        .map_err(|e| ToolError::Unavailable {
            reason: e.to_string(),
        })
}

/// The group's members as the model needs them: each one's name (from its card, when the
/// card is there), character id and whether the group has it muted. `[]` outside a group.
async fn group_members(svc: &ToolServices, ctx: &ToolContext) -> Result<Value, ToolError> {
    use crate::assets::group::Group;
    let Some(group) = session_group(svc, ctx).await? else {
        return Ok(json!([]));
    };
    let mut out = Vec::with_capacity(group.members.len());
    for avatar in &group.members {
        let character = Group::member_character(avatar);
        let card = match tavern_core::CharacterName::parse(character) {
            Ok(name) => svc.assets.card(&name).await.ok().flatten(),
            Err(_) => None,
        };
        out.push(json!({
            "name": card.as_ref().map_or(character, |c| c.name()),
            "character": character,
            "muted": group.disabled.contains(avatar),
            "card": card.is_some(),
        }));
    }
    Ok(json!(out))
}

/// The card of `member` of the session's group (its display name or character id, in any
/// case), as `group_members` lists them.
async fn member_card(
    svc: &ToolServices,
    ctx: &ToolContext,
    member: &str,
) -> Result<Arc<Card>, ToolError> {
    use crate::assets::group::Group;
    let invalid = |reason: String| ToolError::InvalidArguments {
        field: "member".into(),
        reason,
    };
    let Some(group) = session_group(svc, ctx).await? else {
        return Err(invalid("this chat is not a group chat".into()));
    };
    let mut names = Vec::new();
    for avatar in &group.members {
        let character = Group::member_character(avatar);
        let Ok(id) = tavern_core::CharacterName::parse(character) else {
            continue;
        };
        let card = svc.assets.card(&id).await.ok().flatten();
        let name = card.as_ref().map_or(character, |c| c.name()).to_owned();
        if name.eq_ignore_ascii_case(member) || character.eq_ignore_ascii_case(member) {
            return card.ok_or_else(|| ToolError::NotFound {
                what: format!("card of group member {character}"),
            });
        }
        names.push(name);
    }
    Err(invalid(format!(
        "{member:?} is not a member of this group (members: {})",
        names.join(", ")
    )))
}

/// The first line of the session's chat (its header, when it has one): `None` when there is
/// no chat or it cannot be read — the header only refines what a tool shows.
async fn chat_head(svc: &ToolServices, ctx: &ToolContext) -> Option<ChatLine> {
    let target = ctx.binding().target();
    svc.chats
        .read_chat_head(&target.character, &target.chat_id)
        .await
        .ok()
        .flatten()
}

/// The persona of the session's chat: the one its header locks it to
/// (`chat_metadata.persona`), else the user's default, as SillyTavern picks it. Only the
/// chat's first line is read.
pub(crate) async fn chat_persona(svc: &ToolServices, ctx: &ToolContext) -> Persona {
    let head = chat_head(svc, ctx).await;
    svc.assets
        .chat_persona(crate::assets::personas::persona_lock(head.as_ref()))
        .await
}

fn send_date_json(line: &ChatLine) -> Value {
    match line.send_date() {
        Some(SendDate::Millis(ms)) => json!(ms),
        Some(SendDate::Text(t)) => json!(t),
        None => Value::Null,
    }
}

/// `tavern_character_get`.
pub(crate) struct CharacterGet;

#[async_trait]
impl TypedTool for CharacterGet {
    type Args = CharacterArgs;
    type Output = CharacterOut;
    const NAME: &'static str = "tavern_character_get";
    const DESCRIPTION: &'static str = "Read fields of the current character's card (in a group chat, a member's with `member`), the user's persona or the group members. Long fields are cut to the token budget and listed in truncatedFields.";
    const WRITES: bool = false;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: CharacterArgs,
    ) -> Result<CharacterOut, ToolError> {
        let budget = a.max_tokens.unwrap_or(ctx.limits().default_tokens);
        let wanted: Vec<&'static str> = match &a.fields {
            Some(f) => f.iter().map(|f| f.label()).collect(),
            None => DEFAULT_FIELDS.to_vec(),
        };
        // The persona and the group's members need no card (a group session has none).
        let needs_card = wanted
            .iter()
            .any(|f| !matches!(*f, "persona" | "group_members"));
        let found = match &a.member {
            Some(member) => member_card(svc, ctx, member).await,
            None => card(svc, ctx).await,
        };
        let card = match found {
            Ok(card) => Some(card),
            Err(e) if needs_card || a.member.is_some() => return Err(e),
            Err(_) => None,
        };
        let mut left = budget;
        let mut fields = Map::new();
        let mut cut = Vec::new();
        let persona = chat_persona(svc, ctx).await;
        let target = ctx.binding().target();
        let chat = target.chat_id.to_string();
        // SillyTavern's macros, as it substitutes them before the model sees card text.
        let seed = seed_of(ctx.call_id());
        let (utc_offset_minutes, last_user_message) = macro_times(svc, ctx).await;
        let mut macros = match &card {
            Some(card) => card.macros(&persona, &chat, ctx.now(), seed),
            None => macros::MacroContext {
                character: target.character.as_str(),
                user: &persona.name,
                persona: &persona.description,
                description: "",
                scenario: "",
                personality: "",
                now: ctx.now(),
                utc_offset_minutes: 0,
                last_user_message: None,
                chat: &chat,
                seed,
            },
        };
        macros.utc_offset_minutes = utc_offset_minutes;
        macros.last_user_message = last_user_message;
        let sub = |text: &str| macros::substitute(text, &macros);
        let members = if wanted.contains(&"group_members") {
            group_members(svc, ctx).await?
        } else {
            Value::Null
        };
        for f in wanted {
            // A card field is cut to a head before its macros are substituted: what can fit
            // the budget left is far shorter (a quarter token a character at least, and
            // macros grow a text by a bounded amount), so a 30 MiB field costs a call what a
            // short one does. What was left out marks the field as cut.
            let head_chars = left.saturating_add(1).saturating_mul(16);
            let mut head_cut = false;
            let value = match (f, &card) {
                ("group_members", _) => members.clone(),
                ("persona", _) => {
                    json!({"name": persona.name, "description": sub(&persona.description)})
                }
                ("alternate_greetings", Some(card)) => {
                    let greetings = card.alternate_greetings();
                    // Whole or not at all: plainly too long ones are not substituted at all.
                    let raw: usize = greetings.iter().map(|g| g.len()).sum();
                    if raw > head_chars.saturating_mul(4) {
                        cut.push(f);
                        continue;
                    }
                    json!(greetings.iter().map(|g| sub(g)).collect::<Vec<_>>())
                }
                ("tags", Some(card)) => json!(card.tags()),
                ("character_note", Some(card)) => {
                    // As SillyTavern reads it: no note, or an empty one, is none.
                    let note = card.data().pointer("/extensions/depth_prompt");
                    let text = note
                        .and_then(|n| n.get("prompt"))
                        .and_then(Value::as_str)
                        .filter(|t| !t.trim().is_empty());
                    match text {
                        Some(text) if text.len() <= head_chars.saturating_mul(4) => json!({
                            "text": sub(text),
                            "depth": note.and_then(|n| n.get("depth")).and_then(Value::as_u64).unwrap_or(4),
                            "role": note.and_then(|n| n.get("role")).and_then(Value::as_str).unwrap_or("system"),
                        }),
                        Some(_) => {
                            cut.push(f);
                            continue;
                        }
                        None => continue,
                    }
                }
                (text, Some(card)) if CARD_TEXT_FIELDS.contains(&text) => {
                    let (head, long) = macro_head(card.field(text).unwrap_or(""), head_chars);
                    head_cut = long;
                    json!(sub(head))
                }
                _ => continue,
            };
            match value {
                // Text fields are cut at a character boundary and listed as cut.
                Value::String(text) => {
                    let (kept, was_cut) = fit(&text, left);
                    left = left.saturating_sub(DefaultTokenEstimator.estimate(&kept));
                    if was_cut || head_cut {
                        cut.push(f);
                    }
                    fields.insert(f.into(), json!(kept));
                }
                // Structured fields come whole or not at all.
                other => {
                    let tokens = DefaultTokenEstimator.estimate(&other.to_string());
                    if tokens <= left {
                        left -= tokens;
                        fields.insert(f.into(), other);
                    } else {
                        cut.push(f);
                    }
                }
            }
        }
        Ok(CharacterOut {
            fields,
            truncated_fields: cut,
            source: CardSource {
                kind: "card",
                character: card
                    .as_ref()
                    .map_or_else(|| target.character.to_string(), |c| c.name().to_owned()),
                spec: card.as_ref().map_or("none", |c| c.version().as_str()),
            },
        })
    }
}

/// `tavern_lore_search`.
pub(crate) struct LoreSearch;

#[async_trait]
impl TypedTool for LoreSearch {
    type Args = LoreArgs;
    type Output = LoreOut;
    const NAME: &'static str = "tavern_lore_search";
    const DESCRIPTION: &'static str = "Search the world lore (the character's book — the world file the card links, or the book embedded in the card when there is no such file — and the globally active books) as SillyTavern activates it. Entries whose keys appear in the query come first, then entries their content activates in turn, then entries that match its words.";
    const WRITES: bool = false;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: LoreArgs,
    ) -> Result<LoreOut, ToolError> {
        let l = ctx.limits();
        let mut books = Vec::new();
        let card = card(svc, ctx).await.ok();
        let linked = card
            .as_ref()
            .and_then(|c| c.linked_world().map(str::to_owned));
        let unavailable = |e: crate::assets::AssetError| ToolError::Unavailable {
            reason: e.to_string(),
        };
        // As SillyTavern assembles it (`getSortedEntries`): the chat's own book first, unless
        // it is globally active; the card's linked world file is the character's book (the
        // user's edits — disabled entries, new ones — live there), the book embedded in the
        // card only the copy that file was made from, used when no such file exists; then the
        // character's extra books and the global ones. A book comes once, from its first
        // source; a missing one is skipped, as SillyTavern skips it.
        let globals = svc.assets.global_worlds().await;
        let target = ctx.binding().target();
        let head = chat_head(svc, ctx).await;
        // A group's chats are headerless: its chat lorebook is in the group file.
        let group = session_group(svc, ctx).await?;
        let chat_book = head
            .as_ref()
            .and_then(|h| h.object().get("chat_metadata")?.get("world_info")?.as_str())
            .or_else(|| group.as_ref()?.chat_metadata.get("world_info")?.as_str())
            .filter(|n| !n.trim().is_empty() && !globals.iter().any(|g| g == n))
            .map(str::to_owned);
        let mut taken: Vec<String> = Vec::new();
        if let Some(name) = &chat_book {
            if let Some(book) = svc.assets.world(name).await.map_err(unavailable)? {
                books.push((LoreSource::Chat, book));
                taken.push(name.clone());
            }
        }
        let linked_book = match &linked {
            Some(name) if taken.contains(name) => None,
            Some(name) => svc.assets.world(name).await.map_err(unavailable)?,
            None => None,
        };
        match (linked_book, &linked) {
            (Some(book), Some(name)) => {
                books.push((LoreSource::CardLinked, book));
                taken.push(name.clone());
            }
            _ if linked.as_ref().is_some_and(|n| taken.contains(n)) => {}
            _ => {
                if let Some(book) = card.as_deref().and_then(Card::embedded_book) {
                    books.push((LoreSource::Embedded, book));
                }
            }
        }
        let extras = svc.assets.character_worlds(&target.character).await;
        for (source, names) in [
            (LoreSource::CharacterExtra, extras),
            (LoreSource::Global, globals),
        ] {
            for name in names {
                if taken.contains(&name) {
                    continue;
                }
                if let Some(book) = svc.assets.world(&name).await.map_err(unavailable)? {
                    books.push((source, book));
                    taken.push(name);
                }
            }
        }
        let opts = LoreOptions {
            include_constant: a.include_constant,
            limit: a.limit.unwrap_or(l.default_results),
            max_tokens: a.max_tokens.unwrap_or(l.default_tokens),
            ..LoreOptions::default()
        };
        let character = &ctx.binding().target().character;
        let persona = chat_persona(svc, ctx).await;
        // Values copied for the search (it runs off this task): no more of each than a
        // macro could ever use.
        let field = |name: &str| {
            macros::value_head(card.as_ref().and_then(|c| c.field(name)).unwrap_or("")).to_owned()
        };
        let (utc_offset_minutes, last_user_message) = macro_times(svc, ctx).await;
        let who = LoreContext {
            character: card
                .as_ref()
                .map_or(character.as_str(), |c| c.name())
                .to_owned(),
            user: persona.name,
            character_ids: std::iter::once(character.to_string())
                .chain(card.as_ref().map(|c| c.name().to_owned()))
                .collect(),
            tags: card
                .as_ref()
                .map(|c| c.tags().into_iter().map(str::to_owned).collect())
                .unwrap_or_default(),
            macros: lore::MacroValues {
                persona: persona.description,
                description: field("description"),
                scenario: field("scenario"),
                personality: field("personality"),
                now_ms: ctx.now().0,
                utc_offset_minutes,
                last_user_ms: last_user_message.map(|t| t.0),
                chat: ctx.binding().target().chat_id.to_string(),
            },
        };
        let (query, mut ranker) = (a.query, svc.ranker.clone());
        let books = Arc::new(books);
        if ranker.prepares() && query.trim().is_empty() {
            // Constant entries only: nothing for a ranker to read.
            ranker = tavern_search::RankerRef::default();
        } else if ranker.prepares() {
            // A ranker that encodes must not do it on the CPU threads, whose every job is
            // bounded in time: a lexical pass there finds what it will be handed, it encodes
            // that on the blocking pool, and the search proper only looks up.
            let gatherer = Arc::new(tavern_search::Gatherer::new(ranker.clone()));
            let first_pass = tavern_search::RankerRef(gatherer.clone());
            let (b, q, o, w) = (books.clone(), query.clone(), opts, who.clone());
            // The gatherer only needs to be handed the texts: the answer is not shaped.
            crate::cpu::run_bounded(move || {
                lore::search_ranked(&b, &q, &o, &w, &first_pass);
            })
            .await?;
            ranker = tavern_store::prepared_ranker(&ranker, &query, gatherer.take_texts()).await;
        }
        // Key matching is CPU work bounded in time: off the executor, a few at a time.
        crate::cpu::run_bounded(move || lore_out(&books, &query, &opts, &who, &ranker)).await
    }
}

/// Searches `books` and shapes the answer (owned, so it can leave the blocking pool).
fn lore_out(
    books: &[(LoreSource, Arc<WorldBook>)],
    query: &str,
    opts: &LoreOptions,
    who: &LoreContext,
    ranker: &tavern_search::RankerRef,
) -> LoreOut {
    let res = lore::search_ranked(books, query, opts, who, ranker);
    let items = res
        .hits
        .iter()
        .map(|h| LoreItem {
            book: h.book.to_owned(),
            source: h.source.as_str(),
            uid: h.entry.uid,
            comment: h.entry.comment.clone(),
            keys: h.entry.keys.clone(),
            content: h.content.clone(),
            reason: match h.reason.label() {
                "keyword" => LoreReason::Keyword,
                "recursion" => LoreReason::Recursion,
                "constant" => LoreReason::Constant,
                _ => LoreReason::Lexical,
            },
            score: rounded(h.score),
        })
        .collect();
    LoreOut {
        listing: Listing {
            items,
            source_count: res.source_count,
            truncated: res.truncated,
            truncated_by: res.truncated_by.map(TruncatedBy::from),
            source: LoreSources {
                kind: "lore",
                books: books
                    .iter()
                    .map(|(s, b)| BookOut {
                        name: b.name.clone(),
                        source: s.as_str(),
                        entries: b.entries.len(),
                    })
                    .collect(),
            },
        },
        warnings: res.warnings.clone(),
        duplicates: res.duplicates,
    }
}

/// `tavern_history_search`.
pub(crate) struct HistorySearch;

#[async_trait]
impl TypedTool for HistorySearch {
    type Args = HistoryArgs;
    type Output = Listing<HistoryItem, ChatSources>;
    const NAME: &'static str = "tavern_history_search";
    const DESCRIPTION: &'static str = "Search earlier messages of this chat (and, if asked, the chat it was branched from). An empty query returns the latest messages.";
    const WRITES: bool = false;
    const WIDE_LIMIT: bool = true;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: HistoryArgs,
    ) -> Result<Self::Output, ToolError> {
        let l = ctx.limits();
        let args = crate::history::HistoryArgs {
            query: a.query,
            limit: a.limit.unwrap_or(l.default_results),
            max_tokens: a.max_tokens.unwrap_or(l.default_tokens),
            include_parent: a.include_parent,
        };
        crate::history::search(svc, ctx, &args).await
    }
}

/// `tavern_scene_get`.
pub(crate) struct SceneGet;

#[async_trait]
impl TypedTool for SceneGet {
    type Args = SceneArgs;
    type Output = SceneOut;
    const NAME: &'static str = "tavern_scene_get";
    const DESCRIPTION: &'static str = "Read the current scene: who is speaking, the chat's size and dates, the scenario and the author's note.";
    const WRITES: bool = false;

    async fn run(
        &self,
        svc: &ToolServices,
        ctx: &ToolContext,
        a: SceneArgs,
    ) -> Result<SceneOut, ToolError> {
        let budget = a.max_tokens.unwrap_or(ctx.limits().default_tokens);
        let target = ctx.binding().target();
        let doc = chat(svc, ctx, &target.chat_id).await?;
        let card = card(svc, ctx).await.ok();
        let persona = chat_persona(svc, ctx).await;
        let header = doc
            .as_ref()
            .and_then(|d| d.header.as_ref())
            .map(|h| h.object().clone())
            .unwrap_or_default();
        let messages = doc.as_ref().map_or(&[][..], |d| &d.messages[..]);
        let mut speakers: Vec<String> = Vec::new();
        for m in messages.iter().rev().take(20) {
            if let Some(n) = m.name() {
                if !speakers.iter().any(|s| s == n) {
                    speakers.push(n.to_owned());
                }
            }
        }
        let half = budget / 2;
        // Macros substituted as SillyTavern shows the text to a model (#29 item 4), on a
        // budget-sized head of it.
        let chat_name = target.chat_id.to_string();
        let seed = seed_of(ctx.call_id());
        let (utc_offset_minutes, last_user_message) = macro_times(svc, ctx).await;
        let shown = |text: &str, tokens: usize| -> (String, bool) {
            let (head, long) = macro_head(text, tokens.saturating_add(1).saturating_mul(16));
            let text = match &card {
                Some(c) => {
                    let mut m = c.macros(&persona, &chat_name, ctx.now(), seed);
                    m.utc_offset_minutes = utc_offset_minutes;
                    m.last_user_message = last_user_message;
                    macros::substitute(head, &m)
                }
                None => head.to_owned(),
            };
            let (kept, cut) = fit(&text, tokens);
            (kept, cut || long)
        };
        let (scenario, s_cut) = shown(
            card.as_ref()
                .and_then(|c| c.field("scenario"))
                .unwrap_or(""),
            half,
        );
        // A group keeps its chat metadata (the author's note) in its group file: its chats
        // are headerless.
        let group = session_group(svc, ctx).await.ok().flatten();
        let note_raw = header
            .get("chat_metadata")
            .and_then(|m| m.get("note_prompt"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .or_else(|| {
                group
                    .as_ref()
                    .and_then(|g| g.chat_metadata.get("note_prompt"))
                    .and_then(Value::as_str)
            })
            .unwrap_or("");
        let (note, n_cut) = shown(note_raw, budget - half);
        let cut: Vec<&'static str> = [("scenario", s_cut), ("note", n_cut)]
            .into_iter()
            .filter(|c| c.1)
            .map(|c| c.0)
            .collect();
        // Newer SillyTavern writes `"user_name": "unused"` in headers: the persona decides.
        let user = header
            .get("user_name")
            .and_then(Value::as_str)
            .filter(|n| !n.trim().is_empty() && *n != "unused")
            .map_or(persona.name.clone(), str::to_owned);
        Ok(SceneOut {
            character: target.character.to_string(),
            user,
            chat: SceneChat {
                id: target.chat_id.to_string(),
                message_count: messages.len(),
                // Headerless chats (SillyTavern's group chats) date from their first message.
                create_date: header
                    .get("create_date")
                    .cloned()
                    .or_else(|| messages.first().map(send_date_json))
                    .unwrap_or(Value::Null),
                last_message_date: messages.last().map(send_date_json).unwrap_or(Value::Null),
                parent: doc
                    .as_ref()
                    .and_then(ChatDocument::parent_chat)
                    .map(str::to_owned),
            },
            speakers,
            scenario,
            note,
            architecture: ctx.binding().architecture().as_str(),
            context_mode: ctx.context_mode().as_str(),
            turn: ctx.turn(),
            now: ctx.now().0,
            truncated_fields: cut,
        })
    }
}
