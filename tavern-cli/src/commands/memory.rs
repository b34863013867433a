//! `tavern memory ls|search|show|history|forget|restore`.

use std::sync::Arc;

use serde_json::{json, Value};
use tavern_core::{MemoryId, MemoryRecord, MemoryWrite, ScopeKey, Timestamp};
use tavern_store::{AllStores, Clock, MemoryHit, MemoryQuery, MemorySearchExt, SystemClock};

use crate::cli::{MemoryCommand, MemoryFilter};
use crate::output::{excerpt, source, table, time};
use crate::{backend, CliError, Context, Report};

/// Hits per page when listing (the store's most per search).
const PAGE: usize = 100;
/// The deepest `memory search --offset` (the HTTP API's too: deeper pages would order every
/// match).
const MAX_OFFSET: usize = tavern_api::routes::memories::MAX_OFFSET;

/// Runs a memory command.
///
/// # Errors
/// Usage errors before anything is opened; store failures; a stale revision is a conflict.
pub async fn run(ctx: &Context, command: MemoryCommand) -> Result<Report, CliError> {
    match command {
        MemoryCommand::Ls {
            scope,
            filter,
            limit,
        } => {
            let scope = scope.resolve()?;
            let stores = backend::open(ctx, false).await?.stores();
            ls(&*stores, scope, &filter, limit).await
        }
        MemoryCommand::Search {
            query,
            scope,
            filter,
            limit,
            offset,
            ranking,
        } => {
            let scope = scope.resolve()?;
            if !(1..=PAGE).contains(&limit) {
                return Err(CliError::Usage(format!(
                    "--limit {limit}: must be from 1 to {PAGE}"
                )));
            }
            if offset > MAX_OFFSET {
                return Err(CliError::Usage(format!(
                    "--offset {offset}: at most {MAX_OFFSET}; narrow the search instead"
                )));
            }
            // Read before the store opens, so a bad file stops at once.
            let ranker = ranking.open().await?;
            let stores = backend::open(ctx, false).await?.stores();
            search(&*stores, &query, scope, &filter, (limit, offset), ranker).await
        }
        MemoryCommand::Show { id, scope } => {
            let (id, scope) = (memory_id(&id)?, scope.resolve()?);
            let stores = backend::open(ctx, false).await?.stores();
            let record = find(&*stores, &id, scope.as_ref()).await?;
            Ok(show(&record, now()))
        }
        MemoryCommand::History { id, scope } => {
            let (id, scope) = (memory_id(&id)?, scope.resolve()?);
            let stores = backend::open(ctx, false).await?.stores();
            history(&stores, &id, scope.as_ref()).await
        }
        MemoryCommand::Forget {
            id,
            revision,
            scope,
        } => {
            let (id, rev, scope) = (
                memory_id(&id)?,
                super::revision(&revision)?,
                scope.resolve()?,
            );
            let stores = backend::open(ctx, false).await?.stores();
            let record = find(&*stores, &id, scope.as_ref()).await?;
            if record.deleted_at.is_some() {
                return Err(CliError::Failed(format!(
                    "memory {id} is already forgotten (revision {}); `tavern memory restore` brings it back",
                    record.revision
                )));
            }
            let after = stores
                .forget(&id, &record.scope, &rev, super::user_source())
                .await?;
            Ok(changed("forgot", &record, &after))
        }
        MemoryCommand::Restore {
            id,
            revision,
            scope,
        } => {
            let (id, rev, scope) = (
                memory_id(&id)?,
                super::revision(&revision)?,
                scope.resolve()?,
            );
            let stores = backend::open(ctx, false).await?.stores();
            let record = find(&*stores, &id, scope.as_ref()).await?;
            if record.deleted_at.is_none() {
                return Err(CliError::Failed(format!(
                    "memory {id} is not forgotten (revision {})",
                    record.revision
                )));
            }
            let write = MemoryWrite {
                id: record.id.clone(),
                scope: record.scope.clone(),
                kind: record.kind,
                content: record.content.clone(),
                tags: record.tags.clone(),
                importance: record.importance,
                confidence: record.confidence,
                source: super::user_source(),
                expires_at: record.expires_at,
            };
            let after = stores.put(write, Some(&rev), true).await?;
            Ok(changed("restored", &record, &after))
        }
    }
}

fn now() -> Timestamp {
    SystemClock.now()
}

fn memory_id(id: &str) -> Result<MemoryId, CliError> {
    MemoryId::parse(id).map_err(|e| CliError::Usage(e.to_string()))
}

/// `live`, `forgotten` or `expired`.
pub fn state(record: &MemoryRecord, now: Timestamp) -> &'static str {
    if record.deleted_at.is_some() {
        "forgotten"
    } else if record.is_expired(now) {
        "expired"
    } else {
        "live"
    }
}

/// A record as JSON, with its state.
pub fn record_json(record: &MemoryRecord, now: Timestamp) -> Value {
    let mut v = serde_json::to_value(record).unwrap_or(Value::Null);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("state".into(), state(record, now).into());
    }
    v
}

/// Every record in `scopes` (all scopes when empty) that the filter admits, newest first, at
/// most `limit`, paging through the store's search.
///
/// # Errors
/// Store failures.
pub async fn list(
    stores: &dyn AllStores,
    scopes: Vec<ScopeKey>,
    filter: &MemoryFilter,
    limit: Option<usize>,
) -> Result<Vec<MemoryHit>, CliError> {
    let mut out = Vec::new();
    loop {
        let want = limit.map_or(PAGE, |l| l.saturating_sub(out.len()).min(PAGE));
        if want == 0 {
            break;
        }
        let q = MemoryQuery {
            include_deleted: filter.include_deleted,
            include_expired: filter.include_expired,
            limit: want,
            offset: out.len(),
            ..MemoryQuery::new("", scopes.clone())
        };
        let page = stores.search(&q).await?;
        let more = page.truncated && !page.hits.is_empty();
        out.extend(page.hits);
        if !more {
            break;
        }
    }
    Ok(out)
}

/// The record `id` (forgotten and expired ones included), in `scope` or wherever it is.
///
/// # Errors
/// [`CliError::NotFound`]; [`CliError::Usage`] when the id is in several scopes and no scope
/// was given.
pub async fn find(
    stores: &dyn AllStores,
    id: &MemoryId,
    scope: Option<&ScopeKey>,
) -> Result<MemoryRecord, CliError> {
    // With a scope the record is one lookup, in whatever state it is.
    if let Some(scope) = scope {
        return stores
            .inspect(id, scope)
            .await?
            .ok_or_else(|| CliError::NotFound(format!("memory {id} not found in scope {scope}")));
    }
    let all = MemoryFilter {
        include_deleted: true,
        include_expired: true,
    };
    let scopes = scope.cloned().into_iter().collect();
    let mut found: Vec<MemoryRecord> = list(stores, scopes, &all, None)
        .await?
        .into_iter()
        .map(|h| h.record)
        .filter(|r| &r.id == id)
        .collect();
    match found.len() {
        0 => Err(CliError::NotFound(match scope {
            Some(s) => format!("memory {id} not found in scope {s}"),
            None => format!("memory {id} not found"),
        })),
        1 => Ok(found.remove(0)),
        _ => Err(CliError::Usage(format!(
            "memory {id} exists in several scopes ({}); name one with --scope",
            found
                .iter()
                .map(|r| r.scope.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn row(r: &MemoryRecord, now: Timestamp) -> Vec<String> {
    vec![
        r.id.to_string(),
        r.scope.to_string(),
        state(r, now).to_owned(),
        r.revision.to_string(),
        time(r.updated_at),
        r.expires_at.map_or_else(|| "-".to_owned(), time),
        source(&r.source),
        excerpt(&r.content, 60),
    ]
}

const HEADERS: [&str; 8] = [
    "ID", "SCOPE", "STATE", "REVISION", "UPDATED", "EXPIRES", "SOURCE", "CONTENT",
];

async fn ls(
    stores: &dyn AllStores,
    scope: Option<ScopeKey>,
    filter: &MemoryFilter,
    limit: Option<usize>,
) -> Result<Report, CliError> {
    let now = now();
    let hits = list(stores, scope.into_iter().collect(), filter, limit).await?;
    let rows: Vec<Vec<String>> = hits.iter().map(|h| row(&h.record, now)).collect();
    let text = if rows.is_empty() {
        "no memories\n".to_owned()
    } else {
        table(&HEADERS, &rows)
    };
    let json = json!({
        "memories": hits.iter().map(|h| record_json(&h.record, now)).collect::<Vec<_>>(),
        "count": hits.len(),
    });
    Ok(Report::new(text, json))
}

async fn search(
    stores: &dyn AllStores,
    query: &str,
    scope: Option<ScopeKey>,
    filter: &MemoryFilter,
    (limit, offset): (usize, usize),
    (ranker, ranked_by): (tavern_search::RankerRef, String),
) -> Result<Report, CliError> {
    let rescored = ranker.get().rescores();
    let now = now();
    let q = MemoryQuery {
        include_deleted: filter.include_deleted,
        include_expired: filter.include_expired,
        limit,
        offset,
        ranker,
        ..MemoryQuery::new(query, scope.into_iter().collect())
    };
    // A ranker that encodes does it before the search, with no lock held (as the panel's).
    let result = stores.search_prepared(&q).await?;
    let rows: Vec<Vec<String>> = result
        .hits
        .iter()
        .map(|h| {
            let mut r = vec![format!("{:.3}", h.score)];
            r.extend(row(&h.record, now));
            r
        })
        .collect();
    let mut text = if rows.is_empty() {
        "no memories match\n".to_owned()
    } else {
        let mut headers = vec!["SCORE"];
        headers.extend(HEADERS);
        table(&headers, &rows)
    };
    let shown = offset + result.hits.len();
    if result.hits.is_empty() && offset > 0 && result.source_count > 0 {
        text = format!(
            "no memories past the first {}\n",
            offset.min(result.source_count)
        );
    } else if !result.hits.is_empty() && (offset > 0 || result.truncated) {
        text.push_str(&format!(
            "memories {}-{shown} of {} matching shown",
            offset + 1,
            result.source_count
        ));
        if result.truncated && shown <= MAX_OFFSET {
            text.push_str(&format!(" (next page: --offset {shown})"));
        } else if result.truncated {
            text.push_str(" (no deeper pages: narrow the search)");
        }
        text.push('\n');
    }
    // Scores by meaning are on another scale than words alone: say which one this is.
    if rescored && !result.hits.is_empty() {
        text.push_str(&format!("ranked with {ranked_by}\n"));
    }
    let json = json!({
        "query": query,
        // What ranked these hits: a weight of 0 leaves words alone.
        "ranking": if rescored { ranked_by.as_str() } else { "ranking by words alone (BM25)" },
        "hits": result.hits.iter().map(|h| {
            let mut v = record_json(&h.record, now);
            v["score"] = json!(h.score);
            v["relevance"] = json!(h.relevance);
            v
        }).collect::<Vec<_>>(),
        "offset": offset,
        "sourceCount": result.source_count,
        "truncated": result.truncated,
    });
    Ok(Report::new(text, json))
}

fn show(r: &MemoryRecord, now: Timestamp) -> Report {
    let opt = |t: Option<Timestamp>| t.map_or_else(|| "-".to_owned(), time);
    let tags = r.tags.iter().map(|t| t.as_str()).collect::<Vec<_>>();
    let text = format!(
        "id:           {}\nscope:        {}\nstate:        {}\nrevision:     {}\nkind:         {}\ntags:         {}\nimportance:   {}\nconfidence:   {}\nsource:       {}\ncreated:      {}\nupdated:      {}\naccessed:     {}\nexpires:      {}\nforgotten:    {}\n\n{}\n",
        r.id,
        r.scope,
        state(r, now),
        r.revision,
        r.kind.as_str(),
        if tags.is_empty() { "-".to_owned() } else { tags.join(", ") },
        r.importance,
        r.confidence,
        source(&r.source),
        time(r.created_at),
        time(r.updated_at),
        opt(r.last_accessed_at),
        opt(r.expires_at),
        opt(r.deleted_at),
        r.content,
    );
    Report::new(text, record_json(r, now))
}

async fn history(
    stores: &Arc<dyn AllStores>,
    id: &MemoryId,
    scope: Option<&ScopeKey>,
) -> Result<Report, CliError> {
    let record = find(&**stores, id, scope).await?;
    let entries = stores.memory_audit(&record.scope, Some(id)).await?;
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                time(e.at),
                serde_json::to_value(e.action)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                e.revision
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), ToString::to_string),
                source(&e.source),
            ]
        })
        .collect();
    let text = format!(
        "memory {} in scope {}\n{}",
        record.id,
        record.scope,
        table(&["AT", "ACTION", "REVISION", "SOURCE"], &rows)
    );
    let json = json!({
        "id": record.id,
        "scope": record.scope,
        "entries": entries,
    });
    Ok(Report::new(text, json))
}

fn changed(verb: &str, before: &MemoryRecord, after: &MemoryRecord) -> Report {
    let hint = if verb == "forgot" {
        format!(
            "; `tavern memory restore {} --revision {}` brings it back",
            after.id, after.revision
        )
    } else {
        String::new()
    };
    let text = format!(
        "{verb} memory {} in scope {} (revision {} -> {}){hint}\n",
        after.id, after.scope, before.revision, after.revision
    );
    let json = json!({
        "action": verb,
        "memory": record_json(after, now()),
        "previousRevision": before.revision,
    });
    Report::new(text, json)
}
