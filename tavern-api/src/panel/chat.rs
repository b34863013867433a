//! The chat page: a session's messages a page at a time, opened at the turn a memory came from
//! (`?turn=N#turn-N`, that turn's messages marked) or at any offset, with older/newer links.

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::ctx::PageCtx;
use super::pages::{enc, error_page, html};
use crate::app::Api;
use crate::extract::{Path, Query};
use crate::routes::chat::{self, ChatQuery, MessageView};

/// Messages a page shows.
const PAGE: usize = 30;

struct Row {
    m: MessageView,
    /// One of the asked turn's messages.
    hit: bool,
    /// The asked turn's first message (the `#turn-N` anchor).
    first_of_turn: bool,
}

#[derive(Template)]
#[template(path = "chat.html")]
struct ChatPage {
    p: PageCtx,
    session: String,
    session_url: String,
    character: String,
    chat: String,
    turn: Option<u64>,
    /// The first message's number (SillyTavern's, from 0), for the list's numbering.
    first_index: usize,
    from: usize,
    to: usize,
    total: usize,
    rows: Vec<Row>,
    older: Option<String>,
    newer: Option<String>,
}

/// A session's chat.
pub async fn page(
    State(api): State<Api>,
    p: PageCtx,
    Path(session): Path<String>,
    Query(q): Query<ChatQuery>,
) -> Response {
    let p = p.at("overview");
    let session_url = enc(&session);
    let back = Some(format!("{}/panel/sessions/{session_url}", p.base));
    let turn = q.turn;
    let asked = ChatQuery {
        turn: q.turn,
        offset: q.offset,
        limit: Some(q.limit.unwrap_or(PAGE)),
    };
    let page = match chat::chat(State(api), Path(session.clone()), Query(asked)).await {
        Ok(page) => page.0,
        Err(e) => return error_page(&p, &e, back),
    };
    let shown = page.messages.len();
    let size = q.limit.unwrap_or(PAGE);
    let link = |offset: usize| {
        format!(
            "{}/panel/sessions/{session_url}/chat?offset={offset}&limit={size}",
            p.base
        )
    };
    let older = (page.offset > 0).then(|| link(page.offset.saturating_sub(size)));
    let newer = (page.offset + shown < page.total).then(|| link(page.offset + shown));
    let first = page.turn_messages.first().copied();
    let hits: std::collections::HashSet<usize> = page.turn_messages.iter().copied().collect();
    let rows = page
        .messages
        .into_iter()
        .map(|m| Row {
            hit: hits.contains(&m.index),
            first_of_turn: Some(m.index) == first,
            m,
        })
        .collect();
    let body = ChatPage {
        session: page.session,
        session_url,
        character: page.character,
        chat: page.chat,
        turn,
        first_index: page.offset,
        from: page.offset + usize::from(shown > 0),
        to: page.offset + shown,
        total: page.total,
        rows,
        older,
        newer,
        p: p.clone(),
    };
    html(&p, StatusCode::OK, &body)
}
