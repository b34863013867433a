//! The pages: each reads through the API's handlers and renders a template; each form posts
//! back here, goes through the same handlers, and redirects to the page it changed.

use askama::Template;
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, LOCATION, SET_COOKIE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

use crate::app::Api;
use crate::error::ApiError;
use crate::extract::{Body, Path, Query};
use crate::panel::ctx::{Form, PageCtx};
use crate::routes::lore;
use crate::routes::memories::{self, MemoryFilter, MemoryView};
use crate::routes::sessions::{self, Page, SessionView};
use crate::routes::settings::{self, SettingsView};
use crate::routes::variables::{self, VariableFilter};
use crate::scope::{ScopeQuery, ScopeRef};

const CSS: &str = include_str!("../../assets/panel.css");

/// Memories a page lists.
const PAGE_SIZE: usize = 20;

/// A form field's text with the line breaks it was stored with: browsers send every line
/// break of a form value (a textarea, a hidden field) as CRLF, which would make an untouched
/// text a new one.
fn lf(s: &str) -> String {
    s.replace("\r\n", "\n")
}

pub(super) fn enc(s: &str) -> String {
    serde_urlencoded::to_string([("", s)])
        .map(|q| q.trim_start_matches('=').to_owned())
        .unwrap_or_default()
        .replace('+', "%20")
}

/// Renders a template as HTML, keeping a language chosen by `?lang=` in a cookie.
pub(super) fn html<T: Template>(p: &PageCtx, status: StatusCode, page: &T) -> Response {
    let body = match page.render() {
        Ok(b) => b,
        Err(e) => return ApiError::Internal(format!("rendering failed: {e}")).into_response(),
    };
    let mut res = (status, [(CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response();
    if p.lang_from_query {
        if let Ok(v) = HeaderValue::from_str(&format!(
            "tavern_lang={}; Path=/; SameSite=Lax; Max-Age=31536000",
            p.lang.code()
        )) {
            res.headers_mut().insert(SET_COOKIE, v);
        }
    }
    res
}

fn see_other(to: &str) -> Response {
    let mut res = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        res.headers_mut().insert(LOCATION, v);
    }
    res
}

#[derive(Template)]
#[template(path = "message.html")]
struct MessagePage<'a> {
    p: &'a PageCtx,
    heading: String,
    message: String,
    back: Option<String>,
}

/// An API error as a page, with the API's status.
pub(super) fn error_page(p: &PageCtx, e: &ApiError, back: Option<String>) -> Response {
    html(
        p,
        e.status(),
        &MessagePage {
            p,
            heading: format!("{} {}", p.w.error, e.status().as_u16()),
            message: e.to_string(),
            back,
        },
    )
}

/// `/panel/assets/panel.css`.
pub async fn stylesheet() -> Response {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "max-age=3600"),
        ],
        CSS,
    )
        .into_response()
}

// ----- overview ---------------------------------------------------------------------------------

struct SessionRow {
    session: String,
    session_url: String,
    character: String,
    chat: String,
    architecture: String,
    mode: String,
    projection: String,
    pending: bool,
}

impl SessionRow {
    fn of(s: &SessionView) -> Self {
        Self {
            session: s.session.clone(),
            session_url: enc(&s.session),
            character: s.character.clone(),
            chat: s.chat.clone(),
            architecture: s.architecture.clone(),
            mode: s.context_mode.clone().unwrap_or_else(|| "—".into()),
            projection: s
                .projection
                .as_ref()
                .map_or_else(|| "—".into(), |p| p.status.clone()),
            pending: s.projection.as_ref().is_some_and(|p| p.status == "pending"),
        }
    }
}

#[derive(Template)]
#[template(path = "overview.html")]
struct Overview {
    p: PageCtx,
    sessions: Vec<SessionRow>,
    pending: usize,
}

/// `/panel/`: sessions, their architecture labels and projection health.
pub async fn overview(State(api): State<Api>, p: PageCtx) -> Response {
    let p = p.at("overview");
    let page = Page {
        limit: Some(sessions::MAX_SESSIONS_PAGE),
        offset: None,
    };
    match sessions::list(State(api), Query(page)).await {
        Ok(list) => html(
            &p,
            StatusCode::OK,
            &Overview {
                sessions: list.sessions.iter().map(SessionRow::of).collect(),
                pending: list.pending_projections,
                p: p.clone(),
            },
        ),
        Err(e) => error_page(&p, &e, None),
    }
}

#[derive(Deserialize)]
pub struct BindForm {
    session: String,
    character: String,
    chat: String,
}

/// Binds a session to an existing chat.
pub async fn bind(State(api): State<Api>, p: PageCtx, Form(f): Form<BindForm>) -> Response {
    let req = sessions::BindRequest {
        character: f.character,
        chat: f.chat,
    };
    match sessions::bind(State(api), Path(f.session.clone()), Body(req)).await {
        Ok(_) => see_other(&format!(
            "{}/panel/sessions/{}?done=saved",
            p.base,
            enc(&f.session)
        )),
        Err(e) => error_page(&p, &e, Some(format!("{}/panel", p.base))),
    }
}

// ----- one session ------------------------------------------------------------------------------

struct ModeRow {
    mode: String,
    available: bool,
    current: bool,
    reason: Option<String>,
}

struct SessionInfo {
    session: String,
    session_url: String,
    character: String,
    chat: String,
    architecture: String,
    mode: String,
    projection: String,
    pending: bool,
    pending_reason: String,
    agent_tavern: bool,
}

#[derive(Template)]
#[template(path = "session.html")]
struct SessionPage {
    p: PageCtx,
    s: SessionInfo,
    modes: Vec<ModeRow>,
    prompt: String,
    changes: Vec<ChangeRow>,
}

/// One recorded change to the settings or a session, newest first on the page.
struct ChangeRow {
    at: String,
    what: String,
    source: String,
}

fn change_rows(changes: &[sessions::ChangeView]) -> Vec<ChangeRow> {
    changes
        .iter()
        .rev()
        .map(|c| ChangeRow {
            at: time(c.at),
            what: c.what.clone(),
            source: source_words(&c.source),
        })
        .collect()
}

/// `/panel/sessions/{session}`.
pub async fn session(State(api): State<Api>, p: PageCtx, Path(id): Path<String>) -> Response {
    let p = p.at("overview");
    let view = match sessions::show(State(api.clone()), Path(id.clone())).await {
        Ok(v) => v.0,
        Err(e) => return error_page(&p, &e, Some(format!("{}/panel", p.base))),
    };
    let prompt = match sessions::prompt(State(api), Path(id)).await {
        Ok(v) => v.0.text,
        Err(e) => return error_page(&p, &e, None),
    };
    let row = SessionRow::of(&view);
    let modes = view
        .modes
        .iter()
        .map(|m| ModeRow {
            mode: m.mode.clone(),
            available: m.available,
            current: view.context_mode.as_deref() == Some(m.mode.as_str()),
            reason: m.reason.clone(),
        })
        .collect();
    let s = SessionInfo {
        pending_reason: view
            .projection
            .as_ref()
            .and_then(|p| p.pending_reason.clone())
            .unwrap_or_default(),
        agent_tavern: view.context_mode.is_some(),
        session: row.session,
        session_url: row.session_url,
        character: row.character,
        chat: row.chat,
        architecture: row.architecture,
        mode: row.mode,
        projection: row.projection,
        pending: row.pending,
    };
    html(
        &p,
        StatusCode::OK,
        &SessionPage {
            p: p.clone(),
            changes: change_rows(&view.changes),
            s,
            modes,
            prompt,
        },
    )
}

fn session_page(p: &PageCtx, session: &str, done: &str) -> String {
    format!("{}/panel/sessions/{}?done={done}", p.base, enc(session))
}

#[derive(Deserialize)]
pub struct ModeForm {
    #[serde(default)]
    mode: String,
}

/// Switches the context mode.
pub async fn switch_mode(
    State(api): State<Api>,
    p: PageCtx,
    Path(id): Path<String>,
    Form(f): Form<ModeForm>,
) -> Response {
    let req = sessions::ModeRequest { mode: f.mode };
    match sessions::switch_mode(State(api), Path(id.clone()), Body(req)).await {
        Ok(_) => see_other(&session_page(&p, &id, "saved")),
        Err(e) => error_page(&p, &e, Some(session_page(&p, &id, ""))),
    }
}

#[derive(Deserialize)]
pub struct ForkForm {
    session: String,
    chat: String,
    architecture: String,
}

/// Forks the chat into a new session.
pub async fn fork(
    State(api): State<Api>,
    p: PageCtx,
    Path(id): Path<String>,
    Form(f): Form<ForkForm>,
) -> Response {
    let new = f.session.clone();
    let req = sessions::ForkRequest {
        session: f.session,
        chat: f.chat,
        architecture: f.architecture,
    };
    match sessions::fork(State(api), Path(id.clone()), Body(req)).await {
        Ok(_) => see_other(&session_page(&p, &new, "saved")),
        Err(e) => error_page(&p, &e, Some(session_page(&p, &id, ""))),
    }
}

#[derive(Deserialize)]
pub struct Empty {}

/// Replays the host's log.
pub async fn replay(
    State(api): State<Api>,
    p: PageCtx,
    Path(id): Path<String>,
    Form(_): Form<Empty>,
) -> Response {
    match sessions::replay(State(api), Path(id.clone())).await {
        Ok(_) => see_other(&session_page(&p, &id, "replayed")),
        Err(e) => error_page(&p, &e, Some(session_page(&p, &id, ""))),
    }
}

#[derive(Deserialize)]
pub struct PromptForm {
    #[serde(default)]
    text: String,
    #[serde(default)]
    action: String,
}

/// Saves or resets the prompt.
pub async fn prompt(
    State(api): State<Api>,
    p: PageCtx,
    Path(id): Path<String>,
    Form(f): Form<PromptForm>,
) -> Response {
    let done = if f.action == "reset" {
        sessions::reset_prompt(State(api), Path(id.clone())).await
    } else {
        let req = sessions::PromptRequest { text: lf(&f.text) };
        sessions::save_prompt(State(api), Path(id.clone()), Body(req)).await
    };
    match done {
        Ok(_) => see_other(&session_page(&p, &id, "saved")),
        Err(e) => error_page(&p, &e, Some(session_page(&p, &id, ""))),
    }
}

// ----- memories ---------------------------------------------------------------------------------

/// A piece of text, marked where it matched the search.
struct Segment {
    text: String,
    mark: bool,
}

/// Splits `text` where it contains a word of `query` (case-insensitive; a run of CJK
/// characters matches by each of its characters' pairs, as the search does).
fn highlight(text: &str, query: &str) -> Vec<Segment> {
    let mut needles: Vec<String> = Vec::new();
    for word in query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let chars: Vec<char> = word.chars().collect();
        if chars.iter().any(|c| (*c as u32) >= 0x2E80) && chars.len() > 2 {
            needles.extend(chars.windows(2).map(|w| w.iter().collect::<String>()));
        } else {
            needles.push(word.to_lowercase());
        }
    }
    needles.retain(|n| !n.is_empty());
    // Bounded work per row whatever the query: each distinct word once, at most 32 of them.
    needles.sort();
    needles.dedup();
    needles.truncate(32);
    // Char-wise, so case folding never moves a byte offset.
    let chars: Vec<char> = text.chars().collect();
    let lower: Vec<char> = chars
        .iter()
        .map(|c| c.to_lowercase().next().unwrap_or(*c))
        .collect();
    let mut marked = vec![false; chars.len()];
    for n in &needles {
        let n: Vec<char> = n.chars().collect();
        if n.is_empty() || n.len() > lower.len() {
            continue;
        }
        for i in 0..=lower.len() - n.len() {
            if lower[i..i + n.len()] == n[..] {
                marked[i..i + n.len()].iter_mut().for_each(|m| *m = true);
            }
        }
    }
    let mut out: Vec<Segment> = Vec::new();
    for (c, m) in chars.into_iter().zip(marked) {
        match out.last_mut() {
            Some(seg) if seg.mark == m => seg.text.push(c),
            _ => out.push(Segment {
                text: c.to_string(),
                mark: m,
            }),
        }
    }
    out
}

fn scope_label(s: &ScopeRef) -> String {
    [
        Some(s.kind.as_str()),
        s.character.as_deref(),
        s.chat.as_deref(),
        s.agent.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(" / ")
}

fn scope_query(s: &ScopeRef) -> String {
    let mut q = vec![("scope", s.kind.clone())];
    for (k, v) in [
        ("character", &s.character),
        ("chat", &s.chat),
        ("agent", &s.agent),
    ] {
        if let Some(v) = v {
            q.push((k, v.clone()));
        }
    }
    serde_urlencoded::to_string(q).unwrap_or_default()
}

struct MemoryRow {
    id: String,
    id_url: String,
    scope: String,
    scope_query: String,
    state: String,
    segments: Vec<Segment>,
}

#[derive(Template)]
#[template(path = "memories.html")]
struct MemoriesPage {
    p: PageCtx,
    q: String,
    session: String,
    scope: String,
    character: String,
    chat: String,
    forgotten: bool,
    items: Vec<MemoryRow>,
    first: usize,
    last: usize,
    total: usize,
    prev_url: Option<String>,
    next_url: Option<String>,
}

/// The memory list's filters, as the form sends them (empty fields mean "not given").
#[derive(Debug, Default, Deserialize)]
pub struct MemoryForm {
    #[serde(default)]
    q: String,
    #[serde(default)]
    session: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    character: String,
    #[serde(default)]
    chat: String,
    #[serde(default)]
    agent: String,
    #[serde(default)]
    forgotten: Option<String>,
    #[serde(default)]
    page: Option<usize>,
}

fn some(s: &str) -> Option<String> {
    (!s.trim().is_empty()).then(|| s.trim().to_owned())
}

impl MemoryForm {
    fn scope_query(&self) -> ScopeQuery {
        ScopeQuery {
            scope: some(&self.scope),
            character: some(&self.character).filter(|_| !self.scope.is_empty()),
            chat: some(&self.chat).filter(|_| self.scope == "chat"),
            agent: some(&self.agent).filter(|_| matches!(self.scope.as_str(), "agent" | "turn")),
            session: some(&self.session),
        }
    }

    fn url(&self, base: &str, page: usize) -> String {
        let mut q: Vec<(&str, String)> = Vec::new();
        for (k, v) in [
            ("q", &self.q),
            ("session", &self.session),
            ("scope", &self.scope),
            ("character", &self.character),
            ("chat", &self.chat),
            ("agent", &self.agent),
        ] {
            if !v.is_empty() {
                q.push((k, v.clone()));
            }
        }
        if self.forgotten.is_some() {
            q.push(("forgotten", "true".into()));
        }
        q.push(("page", page.to_string()));
        format!(
            "{base}/panel/memories?{}",
            serde_urlencoded::to_string(q).unwrap_or_default()
        )
    }
}

/// `/panel/memories`: filters, search with highlighted matches, pages.
pub async fn memories(State(api): State<Api>, p: PageCtx, Query(f): Query<MemoryForm>) -> Response {
    let p = p.at("memories");
    let max_page = memories::MAX_OFFSET / PAGE_SIZE + 1;
    let page = f.page.unwrap_or(1).clamp(1, max_page);
    let filter = MemoryFilter {
        q: some(&f.q),
        kind: None,
        tag: None,
        forgotten: f.forgotten.as_ref().map(|_| true),
        expired: None,
        limit: Some(PAGE_SIZE),
        offset: Some((page - 1).saturating_mul(PAGE_SIZE)),
    };
    let found = match memories::list(State(api), Query(f.scope_query()), Query(filter)).await {
        Ok(v) => v.0,
        Err(e) => return error_page(&p, &e, Some(format!("{}/panel/memories", p.base))),
    };
    let first = found.offset.saturating_add(1);
    let last = found.offset.saturating_add(found.items.len());
    let items = found
        .items
        .iter()
        .map(|h| MemoryRow {
            id: h.memory.id.clone(),
            id_url: enc(&h.memory.id),
            scope: scope_label(&h.memory.scope),
            scope_query: scope_query(&h.memory.scope),
            state: h.memory.state.clone(),
            segments: highlight(&h.memory.content, &f.q),
        })
        .collect();
    html(
        &p,
        StatusCode::OK,
        &MemoriesPage {
            q: f.q.clone(),
            session: f.session.clone(),
            scope: f.scope.clone(),
            character: f.character.clone(),
            chat: f.chat.clone(),
            forgotten: f.forgotten.is_some(),
            items,
            first,
            last,
            total: found.total,
            prev_url: (page > 1).then(|| f.url(&p.base, page - 1)),
            next_url: (last < found.total).then(|| f.url(&p.base, page + 1)),
            p: p.clone(),
        },
    )
}

#[derive(Deserialize)]
pub struct NewMemoryForm {
    id: String,
    scope: String,
    #[serde(default)]
    character: String,
    #[serde(default)]
    chat: String,
    content: String,
}

/// Creates a memory.
pub async fn create_memory(
    State(api): State<Api>,
    p: PageCtx,
    Form(f): Form<NewMemoryForm>,
) -> Response {
    let scope = ScopeRef {
        kind: f.scope.clone(),
        character: some(&f.character).filter(|_| f.scope != "global"),
        chat: some(&f.chat).filter(|_| f.scope == "chat"),
        agent: None,
    };
    let req = memories::CreateMemory {
        scope: scope.clone(),
        id: f.id,
        kind: None,
        content: lf(&f.content),
        tags: Vec::new(),
        importance: None,
        confidence: None,
        expires_at: None,
    };
    let none = crate::routes::memories::SessionOnly { session: None };
    match memories::create(State(api), Query(none), Body(req)).await {
        Ok((_, m)) => see_other(&memory_url(&p, &m.0, "saved")),
        Err(e) => error_page(&p, &e, Some(format!("{}/panel/memories", p.base))),
    }
}

fn memory_url(p: &PageCtx, m: &MemoryView, done: &str) -> String {
    format!(
        "{}/panel/memories/{}?{}{}",
        p.base,
        enc(&m.id),
        scope_query(&m.scope),
        if done.is_empty() {
            String::new()
        } else {
            format!("&done={done}")
        }
    )
}

struct MemoryInfo {
    id: String,
    id_url: String,
    scope: String,
    scope_query: String,
    state: String,
    forgotten: bool,
    content: String,
    kind: String,
    tags: String,
    importance: f64,
    confidence: f64,
    source: String,
    chat_link: Option<String>,
    updated: String,
    revision: String,
}

struct HistoryRow {
    at: String,
    action: String,
    source: String,
    revision: String,
}

/// A memory's history row: a [`HistoryRow`] with what the version changed in the text.
struct MemoryHistoryRow {
    row: HistoryRow,
    change: Change,
    /// This version's text, when it is kept and differs from the current one (a form puts it
    /// back as a new version).
    earlier_text: Option<String>,
}

/// What a version changed in a memory's text, against the version before it.
enum Change {
    /// The first version: its whole text.
    First(String),
    /// Word by word (a CJK character is a word): kept, removed and added runs.
    Diff(Vec<DiffPart>),
    /// The text is the one before.
    Unchanged,
    /// This version's or the one before's text is no longer kept.
    NotKept,
}

/// One run of a [`Change::Diff`].
struct DiffPart {
    /// `same`, `del` or `ins`.
    tag: &'static str,
    text: String,
}

/// The change from `before` to `after`, word by word, adjacent runs of one kind merged.
fn diff(before: &str, after: &str) -> Vec<DiffPart> {
    use similar::{ChangeTag, TextDiff};
    let mut parts: Vec<DiffPart> = Vec::new();
    let diff = TextDiff::configure()
        // Bounded work on long texts: past the deadline the diff is coarser, never slower.
        .timeout(std::time::Duration::from_millis(20))
        .diff_unicode_words(before, after);
    for change in diff.iter_all_changes() {
        let tag = match change.tag() {
            ChangeTag::Equal => "same",
            ChangeTag::Delete => "del",
            ChangeTag::Insert => "ins",
        };
        match parts.last_mut() {
            Some(last) if last.tag == tag => last.text.push_str(change.value()),
            _ => parts.push(DiffPart {
                tag,
                text: change.value().to_owned(),
            }),
        }
    }
    parts
}

/// Each history entry's change against the version before it, oldest first; `(action, text
/// it set, kept the text before)` per entry (the first entry shown is the creation unless
/// older ones were left out).
fn changes(entries: &[(&str, Option<&str>, bool)]) -> Vec<Change> {
    // The text of the version before, while known.
    let mut before: Option<&str> = None;
    entries
        .iter()
        .enumerate()
        .map(|(i, &(action, text, same))| {
            let change = match (i, same, text, before) {
                (_, true, _, _) => Change::Unchanged,
                (0, false, Some(t), _) if action == "created" => Change::First(t.to_owned()),
                (_, false, Some(t), Some(b)) => Change::Diff(diff(b, t)),
                _ => Change::NotKept,
            };
            if !same {
                before = text;
            }
            change
        })
        .collect()
}

#[derive(Template)]
#[template(path = "memory.html")]
struct MemoryPage {
    p: PageCtx,
    m: MemoryInfo,
    history: Vec<MemoryHistoryRow>,
}

/// UTC `YYYY-MM-DD HH:MM:SS`.
fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = tavern_core::calendar::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn source_words(s: &memories::SourceView) -> String {
    let mut out = s.kind.clone();
    if let Some(session) = &s.session {
        out.push_str(&format!(" · {session}"));
    }
    if let Some(turn) = s.turn {
        out.push_str(&format!(" · turn {turn}"));
    }
    out
}

/// `/panel/memories/{id}`: the memory in any state, its history, edit, forget or restore.
pub async fn memory(
    State(api): State<Api>,
    p: PageCtx,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
) -> Response {
    let p = p.at("memories");
    let h = match memories::history(State(api), Path(id), Query(q)).await {
        Ok(h) => h.0,
        Err(e) => return error_page(&p, &e, Some(format!("{}/panel/memories", p.base))),
    };
    let m = &h.memory;
    let origin = h
        .entries
        .iter()
        .find(|e| e.action == "created" && e.source.session.is_some())
        .map_or(&m.source, |e| &e.source);
    let info = MemoryInfo {
        id: m.id.clone(),
        id_url: enc(&m.id),
        scope: scope_label(&m.scope),
        scope_query: scope_query(&m.scope),
        state: m.state.clone(),
        forgotten: m.state == "forgotten",
        content: m.content.clone(),
        kind: m.kind.clone(),
        tags: m.tags.join(", "),
        importance: m.importance,
        confidence: m.confidence,
        source: source_words(&m.source),
        // The chat line the memory came from — its creation's source (a later edit by the
        // user names no turn): the turn's messages when it names one, else the session.
        chat_link: origin.session.as_ref().map(|s| match origin.turn {
            Some(turn) => format!(
                "{}/panel/sessions/{}/chat?turn={turn}#turn-{turn}",
                p.base,
                enc(s)
            ),
            None => format!("{}/panel/sessions/{}", p.base, enc(s)),
        }),
        updated: time(m.updated_at),
        revision: m.revision.clone(),
    };
    let texts: Vec<(&str, Option<&str>, bool)> = h
        .entries
        .iter()
        .map(|e| (e.action.as_str(), e.content.as_deref(), e.same_text))
        .collect();
    let history = h
        .entries
        .iter()
        .zip(changes(&texts))
        .map(|(e, change)| MemoryHistoryRow {
            earlier_text: e
                .content
                .clone()
                .filter(|t| *t != m.content && m.state == "live"),
            row: HistoryRow {
                at: time(e.at),
                action: e.action.clone(),
                source: source_words(&e.source),
                revision: e.revision.clone().unwrap_or_default(),
            },
            change,
        })
        .collect();
    html(
        &p,
        StatusCode::OK,
        &MemoryPage {
            p: p.clone(),
            m: info,
            history,
        },
    )
}

#[derive(Deserialize)]
pub struct EditForm {
    revision: String,
    content: String,
    #[serde(default)]
    tags: Option<String>,
    #[serde(default)]
    importance: Option<String>,
}

#[derive(Template)]
#[template(path = "conflict.html")]
struct ConflictPage {
    p: PageCtx,
    yours: String,
    current: String,
    current_revision: String,
    action: String,
    back: String,
}

/// Edits a memory; a stale revision shows both versions to merge.
pub async fn edit_memory(
    State(api): State<Api>,
    p: PageCtx,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
    Form(f): Form<EditForm>,
) -> Response {
    let p = p.at("memories");
    let tags = f.tags.as_ref().map(|t| {
        t.split([',', '，'])
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    });
    let importance = match f
        .importance
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        Some(text) => match text.parse::<f64>() {
            Ok(v) => Some(v),
            Err(_) => {
                let e = ApiError::BadRequest(format!(
                    "importance {:?} is not a number",
                    crate::scope::excerpt(text)
                ));
                return error_page(&p, &e, None);
            }
        },
        None => None,
    };
    let req = memories::EditMemory {
        revision: f.revision,
        content: Some(lf(&f.content)),
        kind: None,
        tags,
        importance,
        confidence: None,
    };
    let scope = ScopeQuery {
        scope: q.scope.clone(),
        character: q.character.clone(),
        chat: q.chat.clone(),
        agent: q.agent.clone(),
        session: q.session.clone(),
    };
    match memories::edit(State(api.clone()), Path(id.clone()), Query(q), Body(req)).await {
        Ok(m) => see_other(&memory_url(&p, &m.0, "saved")),
        Err(ApiError::Conflict { .. }) => {
            let now = match memories::show(State(api), Path(id), Query(scope)).await {
                Ok(m) => m.0,
                Err(e) => return error_page(&p, &e, None),
            };
            let page = ConflictPage {
                yours: f.content,
                current: now.content.clone(),
                current_revision: now.revision.clone(),
                action: format!(
                    "{}/panel/memories/{}/edit?{}",
                    p.base,
                    enc(&now.id),
                    scope_query(&now.scope)
                ),
                back: memory_url(&p, &now, ""),
                p: p.clone(),
            };
            html(&p, StatusCode::CONFLICT, &page)
        }
        Err(e) => error_page(&p, &e, None),
    }
}

#[derive(Deserialize)]
pub struct RevisionForm {
    revision: String,
}

/// Forgets a memory.
pub async fn forget_memory(
    State(api): State<Api>,
    p: PageCtx,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
    Form(f): Form<RevisionForm>,
) -> Response {
    let req = memories::RevisionRequest {
        revision: f.revision,
    };
    match memories::forget(State(api), Path(id), Query(q), Body(req)).await {
        Ok(m) => see_other(&memory_url(&p, &m.0, "saved")),
        Err(e) => error_page(&p, &e, None),
    }
}

/// Restores a forgotten memory.
pub async fn restore_memory(
    State(api): State<Api>,
    p: PageCtx,
    Path(id): Path<String>,
    Query(q): Query<ScopeQuery>,
    Form(f): Form<RevisionForm>,
) -> Response {
    let req = memories::RevisionRequest {
        revision: f.revision,
    };
    match memories::restore(State(api), Path(id), Query(q), Body(req)).await {
        Ok(m) => see_other(&memory_url(&p, &m.0, "saved")),
        Err(e) => error_page(&p, &e, None),
    }
}

// ----- variables --------------------------------------------------------------------------------

struct VariableRow {
    name: String,
    name_url: String,
    kind: String,
    value: String,
    revision: String,
}

#[derive(Template)]
#[template(path = "variables.html")]
struct VariablesPage {
    p: PageCtx,
    scope: String,
    character: String,
    chat: String,
    agent: String,
    scope_query: String,
    items: Vec<VariableRow>,
    error: Option<String>,
}

/// Variables shown on one page (each with its whole value, to edit).
const VARIABLES_SHOWN: usize = 50;

/// `/panel/variables?scope=…`: a scope's variables, each a typed JSON editor.
pub async fn variables(
    State(api): State<Api>,
    p: PageCtx,
    Query(f): Query<MemoryForm>,
) -> Response {
    let p = p.at("variables");
    let mut f = f;
    if f.scope.is_empty() {
        f.scope = "global".into();
    }
    let q = f.scope_query();
    let sq = q.scope_ref();
    let mut page = VariablesPage {
        scope: f.scope.clone(),
        character: f.character.clone(),
        chat: f.chat.clone(),
        agent: f.agent.clone(),
        scope_query: scope_query(&sq),
        items: Vec::new(),
        error: None,
        p: p.clone(),
    };
    let filter = VariableFilter {
        prefix: None,
        limit: Some(VARIABLES_SHOWN),
    };
    match variables::list(State(api.clone()), Query(q.clone()), Query(filter)).await {
        Ok(list) => {
            for item in &list.0.items {
                let one = variables::show(
                    State(api.clone()),
                    Path(item.name.clone()),
                    Query(q.clone()),
                )
                .await;
                if let Ok(v) = one {
                    page.items.push(VariableRow {
                        name: item.name.clone(),
                        name_url: enc(&item.name),
                        kind: item.kind.clone(),
                        value: serde_json::to_string_pretty(&v.0.value).unwrap_or_default(),
                        revision: v.0.revision.clone(),
                    });
                }
            }
        }
        Err(e) => page.error = Some(e.to_string()),
    }
    html(&p, StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub struct VariableForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    revision: Option<String>,
}

fn json_value(text: &str) -> Result<Value, ApiError> {
    serde_json::from_str(text).map_err(|e| {
        ApiError::BadRequest(format!(
            "the value is not json ({e}); text needs quotes: \"like this\""
        ))
    })
}

fn variables_url(p: &PageCtx, q: &ScopeQuery) -> String {
    let r = q.scope_ref();
    format!("{}/panel/variables?{}&done=saved", p.base, scope_query(&r))
}

async fn set_one(api: Api, p: &PageCtx, name: String, q: ScopeQuery, f: VariableForm) -> Response {
    let value = match json_value(&f.value) {
        Ok(v) => v,
        Err(e) => return error_page(p, &e, None),
    };
    let back = variables_url(p, &q);
    let req = variables::SetVariable {
        value,
        revision: f.revision.filter(|r| !r.is_empty()),
    };
    match variables::set(State(api), Path(name), Query(q), Body(req)).await {
        Ok(_) => see_other(&back),
        Err(e) => error_page(p, &e, Some(back)),
    }
}

/// Sets a variable at its revision.
pub async fn set_variable(
    State(api): State<Api>,
    p: PageCtx,
    Path(name): Path<String>,
    Query(q): Query<ScopeQuery>,
    Form(f): Form<VariableForm>,
) -> Response {
    set_one(api, &p, name, q, f).await
}

/// Creates a variable.
pub async fn new_variable(
    State(api): State<Api>,
    p: PageCtx,
    Query(q): Query<ScopeQuery>,
    Form(f): Form<VariableForm>,
) -> Response {
    let name = f.name.clone();
    set_one(
        api,
        &p,
        name,
        q,
        VariableForm {
            revision: None,
            ..f
        },
    )
    .await
}

/// Deletes a variable at its revision.
pub async fn delete_variable(
    State(api): State<Api>,
    p: PageCtx,
    Path(name): Path<String>,
    Query(q): Query<ScopeQuery>,
    Form(f): Form<RevisionForm>,
) -> Response {
    let back = variables_url(&p, &q);
    let d = variables::DeleteQuery {
        revision: f.revision,
    };
    match variables::delete(State(api), Path(name), Query(q), Query(d)).await {
        Ok(_) => see_other(&back),
        Err(e) => error_page(&p, &e, Some(back)),
    }
}

#[derive(Template)]
#[template(path = "variable_history.html")]
struct VariableHistoryPage {
    p: PageCtx,
    name: String,
    scope: String,
    history: Vec<HistoryRow>,
    back: String,
}

/// A variable's history (it may be deleted now).
pub async fn variable_history(
    State(api): State<Api>,
    p: PageCtx,
    Path(name): Path<String>,
    Query(q): Query<ScopeQuery>,
) -> Response {
    let p = p.at("variables");
    let r = q.scope_ref();
    let back = format!("{}/panel/variables?{}", p.base, scope_query(&r));
    match variables::history(State(api), Path(name), Query(q)).await {
        Ok(h) => {
            let page = VariableHistoryPage {
                name: h.0.name.clone(),
                scope: scope_label(&r),
                history: h
                    .0
                    .entries
                    .iter()
                    .map(|e| HistoryRow {
                        at: time(e.at),
                        action: e.action.clone(),
                        source: source_words(&e.source),
                        revision: e.revision.clone().unwrap_or_default(),
                    })
                    .collect(),
                back,
                p: p.clone(),
            };
            html(&p, StatusCode::OK, &page)
        }
        Err(e) => error_page(&p, &e, Some(back)),
    }
}

// ----- lore ------------------------------------------------------------------------------------

struct LoreRow {
    book: String,
    reason: String,
    content: String,
}

#[derive(Template)]
#[template(path = "lore.html")]
struct LorePage {
    p: PageCtx,
    session: String,
    text: String,
    tested: bool,
    hits: Vec<LoreRow>,
    error: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct LoreForm {
    #[serde(default)]
    session: String,
    #[serde(default)]
    text: String,
}

/// `/panel/lore`.
pub async fn lore(p: PageCtx, Query(f): Query<LoreForm>) -> Response {
    let p = p.at("lore");
    let page = LorePage {
        session: f.session,
        text: String::new(),
        tested: false,
        hits: Vec::new(),
        error: None,
        p: p.clone(),
    };
    html(&p, StatusCode::OK, &page)
}

/// Tests a text against a session's books.
pub async fn test_lore(State(api): State<Api>, p: PageCtx, Form(f): Form<LoreForm>) -> Response {
    let p = p.at("lore");
    let mut page = LorePage {
        session: f.session.clone(),
        text: f.text.clone(),
        tested: false,
        hits: Vec::new(),
        error: None,
        p: p.clone(),
    };
    let req = lore::LoreTest {
        text: f.text,
        limit: Some(20),
    };
    match lore::test(State(api), Path(f.session), Body(req)).await {
        Ok(v) => {
            page.tested = true;
            let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            page.hits =
                v.0.get("items")
                    .and_then(Value::as_array)
                    .map(|items| {
                        items
                            .iter()
                            .map(|i| LoreRow {
                                book: s(i, "book"),
                                reason: s(i, "reason"),
                                content: s(i, "content"),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
        }
        Err(e) => page.error = Some(e.to_string()),
    }
    html(&p, StatusCode::OK, &page)
}

// ----- settings --------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "settings.html")]
struct SettingsPage {
    p: PageCtx,
    changes: Vec<ChangeRow>,
    s: SettingsView,
}

/// `/panel/settings`.
pub async fn settings(State(api): State<Api>, p: PageCtx) -> Response {
    let p = p.at("settings");
    match settings::show(State(api)).await {
        Ok(s) => html(
            &p,
            StatusCode::OK,
            &SettingsPage {
                p: p.clone(),
                changes: change_rows(&s.0.changes),
                s: s.0,
            },
        ),
        Err(e) => error_page(&p, &e, None),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettingsForm {
    default_architecture: String,
    default_context_mode: String,
    #[serde(default)]
    allow_global_writes: Option<String>,
    #[serde(default)]
    require_forget_confirmation: Option<String>,
    #[serde(default)]
    require_cross_character_confirmation: Option<String>,
}

/// Saves settings (an unchecked box is `false`).
pub async fn save_settings(
    State(api): State<Api>,
    p: PageCtx,
    Form(f): Form<SettingsForm>,
) -> Response {
    let req = settings::SettingsUpdate {
        default_architecture: Some(f.default_architecture),
        default_context_mode: Some(f.default_context_mode),
        allow_global_writes: Some(f.allow_global_writes.is_some()),
        require_forget_confirmation: Some(f.require_forget_confirmation.is_some()),
        require_cross_character_confirmation: Some(
            f.require_cross_character_confirmation.is_some(),
        ),
    };
    match settings::update(State(api), Body(req)).await {
        Ok(_) => see_other(&format!("{}/panel/settings?done=saved", p.base)),
        Err(e) => error_page(&p, &e, None),
    }
}

// ----- store check ------------------------------------------------------------------------------

#[derive(Template)]
#[template(path = "store.html")]
struct StorePage {
    p: PageCtx,
    report: Option<crate::routes::store::CheckReport>,
    error: Option<String>,
}

/// `/panel/store`: the check's button.
pub async fn store(p: PageCtx) -> Response {
    let p = p.at("store");
    let page = StorePage {
        report: None,
        error: None,
        p: p.clone(),
    };
    html(&p, StatusCode::OK, &page)
}

/// Runs the store check (read-only) and shows what it found.
pub async fn check_store(State(api): State<Api>, p: PageCtx, Form(_): Form<Empty>) -> Response {
    let p = p.at("store");
    let (report, error) = match crate::routes::store::check(State(api)).await {
        Ok(r) => (Some(r.0), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let page = StorePage {
        report,
        error,
        p: p.clone(),
    };
    html(&p, StatusCode::OK, &page)
}

// ----- login (a token in a cookie, for browsers on a token-protected server) ----------------------

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    p: PageCtx,
}

/// The sign-in form.
pub async fn login_form(p: PageCtx) -> Response {
    html(&p, StatusCode::OK, &LoginPage { p: p.clone() })
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    token: String,
}

/// Signs in: for a correct token, a new random session id in an HttpOnly, same-site cookie
/// scoped to the panel (the token itself never goes into a cookie).
pub async fn login(
    State(api): State<Api>,
    p: PageCtx,
    host: Option<axum::Extension<crate::forward::HostToken>>,
    body: axum::body::Bytes,
) -> Response {
    let f: LoginForm = serde_urlencoded::from_bytes(&body).unwrap_or(LoginForm {
        token: String::new(),
    });
    // Forwarded by a host that did not admit the caller: its token is the one to sign in with.
    let matches = match &host {
        Some(axum::Extension(token)) => crate::app::same_secret(&f.token, &token.0),
        None => api.token_matches(&f.token),
    };
    if !matches {
        return error_page(
            &p,
            &ApiError::Unauthorized,
            Some(format!("{}/panel/login", p.base)),
        );
    }
    let Some(session) = api.open_panel_session() else {
        return error_page(
            &p,
            &ApiError::Internal("no randomness for a sign-in; use the bearer token".into()),
            None,
        );
    };
    let mut res = see_other(&format!("{}/panel", p.base));
    if let Ok(v) = HeaderValue::from_str(&format!(
        "tavern_session={session}; Path={}/panel; HttpOnly; SameSite=Strict",
        p.base
    )) {
        res.headers_mut().insert(SET_COOKIE, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::highlight;

    fn marked(text: &str, q: &str) -> Vec<String> {
        highlight(text, q)
            .into_iter()
            .filter(|s| s.mark)
            .map(|s| s.text)
            .collect()
    }

    #[test]
    fn matches_are_marked_in_any_case_and_by_cjk_pairs() {
        assert_eq!(
            marked("The Silver Gate, silver again", "silver"),
            ["Silver", "silver"]
        );
        assert_eq!(marked("银色大门在北方", "大门在哪"), ["大门在"]);
        assert_eq!(marked("İstanbul ünder", "ünder"), ["ünder"]);
        assert!(marked("nothing here", "").is_empty());
        let all: String = highlight("a <b> & c", "b")
            .into_iter()
            .map(|s| s.text)
            .collect();
        assert_eq!(
            all, "a <b> & c",
            "the text is kept whole; the template escapes it"
        );
    }
}
