//! What every page needs from its request: the language, the path prefix the panel is served
//! under (DSH mounts it at `/agent-tavern`), the CSRF token, a flash message; and the form
//! extractor that refuses a write without the token.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{ACCEPT_LANGUAGE, CONTENT_TYPE, COOKIE};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::app::Api;
use crate::error::ApiError;
use crate::panel::i18n::{Lang, Words};

/// The header a forwarding host sets to the prefix the panel is served under.
pub const BASE_HEADER: &str = "x-tavern-base";

/// The page's context.
#[derive(Debug, Clone)]
pub struct PageCtx {
    /// The language.
    pub lang: Lang,
    /// Its words.
    pub w: &'static Words,
    /// The prefix every link starts with (`""` or `/agent-tavern`).
    pub base: String,
    /// The CSRF token forms carry.
    pub csrf: String,
    /// A message about the last write.
    pub flash: Option<String>,
    /// Which navigation entry is current.
    pub nav: &'static str,
    /// This page in the other language.
    pub lang_url: String,
    /// Whether `?lang=` chose the language (then the choice is kept in a cookie).
    pub lang_from_query: bool,
}

/// A cookie's value.
pub fn cookie<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts
        .headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The forwarding prefix, if it is a plain path (anything else is ignored).
pub fn base_of(parts: &Parts) -> String {
    parts
        .headers
        .get(BASE_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|b| {
            b.len() <= 64
                && b.starts_with('/')
                && b.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"/-_".contains(&c))
        })
        .map(|b| b.trim_end_matches('/').to_owned())
        .unwrap_or_default()
}

impl FromRequestParts<Api> for PageCtx {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or("");
        let asked = query_param(query, "lang");
        let lang = Lang::choose(
            asked,
            cookie(parts, "tavern_lang"),
            parts
                .headers
                .get(ACCEPT_LANGUAGE)
                .and_then(|v| v.to_str().ok()),
        );
        let w = lang.words();
        let flash = match query_param(query, "done") {
            Some("saved") => Some(w.saved.to_owned()),
            Some("replayed") => Some(w.replayed.to_owned()),
            _ => None,
        };
        let base = base_of(parts);
        let kept: Vec<&str> = query
            .split('&')
            .filter(|kv| !kv.is_empty() && !kv.starts_with("lang=") && !kv.starts_with("done="))
            .collect();
        // Inside the nested router the URI lost its `/panel` prefix; the original has it.
        let path = parts
            .extensions
            .get::<axum::extract::OriginalUri>()
            .map_or_else(|| parts.uri.path().to_owned(), |u| u.0.path().to_owned());
        let mut lang_url = format!("{base}{path}?");
        for kv in kept {
            lang_url.push_str(kv);
            lang_url.push('&');
        }
        lang_url.push_str("lang=");
        lang_url.push_str(lang.other().code());
        Ok(Self {
            lang,
            w,
            base,
            csrf: api.csrf_token().to_owned(),
            flash,
            nav: "",
            lang_url,
            lang_from_query: asked.is_some_and(|a| a == lang.code()),
        })
    }
}

impl PageCtx {
    /// The same context for a navigation entry.
    pub fn at(mut self, nav: &'static str) -> Self {
        self.nav = nav;
        self
    }
}

#[derive(Deserialize)]
struct CsrfField {
    #[serde(default)]
    csrf: String,
}

/// A form body (`application/x-www-form-urlencoded`) that carried the CSRF token.
#[derive(Debug)]
pub struct Form<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Api> for Form<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, api: &Api) -> Result<Self, ApiError> {
        let is_form = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
        if !is_form {
            return Err(ApiError::UnsupportedMediaType(
                "a panel form is application/x-www-form-urlencoded".into(),
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, api)
            .await
            .map_err(|_| ApiError::TooLarge {
                limit: "request body bytes".into(),
                max: crate::MAX_BODY_BYTES,
                actual: crate::MAX_BODY_BYTES + 1,
            })?;
        let invalid = |e: serde_urlencoded::de::Error| {
            ApiError::BadRequest(format!(
                "invalid form: {}",
                crate::scope::excerpt(&e.to_string())
            ))
        };
        let token: CsrfField = serde_urlencoded::from_bytes(&bytes).map_err(invalid)?;
        let want = api.csrf_token().as_bytes();
        if token.csrf.len() != want.len() || !bool::from(token.csrf.as_bytes().ct_eq(want)) {
            return Err(ApiError::Csrf);
        }
        serde_urlencoded::from_bytes(&bytes)
            .map(Self)
            .map_err(invalid)
    }
}
