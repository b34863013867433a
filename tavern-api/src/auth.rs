//! Who may call: a bearer token when the server has one (required for any non-loopback
//! address), otherwise only requests that name a loopback host, so a web page elsewhere
//! cannot reach a local server by pointing its own name at 127.0.0.1 (DNS rebinding).

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, HOST};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::app::Api;
use crate::error::ApiError;

/// The middleware every route runs behind.
pub(crate) async fn admit(State(api): State<Api>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    // The sign-in page is how a browser gets the token into its cookie.
    let sign_in = path == "/panel/login";
    if let Err(e) = same_site(&request) {
        return e.into_response();
    }
    match check(&api, &request) {
        Ok(()) => next.run(request).await,
        Err(ApiError::Unauthorized) if sign_in => next.run(request).await,
        Err(ApiError::Unauthorized)
            if path.starts_with("/panel") && request.method() == axum::http::Method::GET =>
        {
            let (parts, _) = request.into_parts();
            let to = format!("{}/panel/login", crate::panel::base_of(&parts));
            let mut res = axum::http::StatusCode::SEE_OTHER.into_response();
            if let Ok(v) = axum::http::HeaderValue::from_str(&to) {
                res.headers_mut().insert(axum::http::header::LOCATION, v);
            }
            res
        }
        Err(e) => e.into_response(),
    }
}

/// Refuses what a page on another site can make a browser send to this server: a request a
/// browser marks cross-site, one whose `Origin` is not this host, and any write that is not
/// JSON (or, under `/panel`, a form — which carries the CSRF token). A page may send
/// `text/plain` or a form anywhere without asking first; JSON it cannot.
fn same_site(request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if text("sec-fetch-site") == Some("cross-site") {
        return Err(ApiError::CrossSite(
            "the browser marked it cross-site".into(),
        ));
    }
    if let Some(origin) = text("origin") {
        let host = text("host").unwrap_or("");
        let origin_host = origin.split("://").nth(1).unwrap_or("");
        if origin == "null" || !origin_host.eq_ignore_ascii_case(host) {
            return Err(ApiError::CrossSite(format!(
                "origin {:?} is not this server",
                crate::scope::excerpt(origin)
            )));
        }
    }
    let method = request.method();
    if method != axum::http::Method::GET && method != axum::http::Method::HEAD {
        let kind = text("content-type")
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let form = kind == "application/x-www-form-urlencoded"
            && request.uri().path().starts_with("/panel");
        if kind != "application/json" && !form {
            return Err(ApiError::UnsupportedMediaType(
                "a write must be application/json (the panel's forms: urlencoded)".into(),
            ));
        }
    }
    Ok(())
}

fn check(api: &Api, request: &Request) -> Result<(), ApiError> {
    // A forwarded request the host did not admit signs in with the host's token.
    let host_token = request
        .extensions()
        .get::<crate::forward::HostToken>()
        .map(|t| t.0.as_str());
    match host_token.or(api.config().token.as_deref()) {
        Some(token) => {
            let bearer = request
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            // A browser cannot send a bearer header with a link or a form: the panel's sign-in
            // gives it a random session id in an HttpOnly, same-site cookie instead — never
            // the token — and that cookie opens the panel only, not the JSON API.
            let panel = request.uri().path().starts_with("/panel");
            let signed_in = panel
                && request
                    .headers()
                    .get_all(axum::http::header::COOKIE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(';'))
                    .filter_map(|kv| kv.trim().strip_prefix("tavern_session="))
                    .any(|id| api.panel_session_matches(id));
            if signed_in || bearer.is_some_and(|t| crate::app::same_secret(t, token)) {
                Ok(())
            } else {
                Err(ApiError::Unauthorized)
            }
        }
        None => {
            let host = request
                .headers()
                .get(HOST)
                .and_then(|v| v.to_str().ok())
                .or_else(|| request.uri().host())
                .unwrap_or("");
            if is_loopback_name(host) {
                Ok(())
            } else {
                Err(ApiError::ForbiddenHost(host.chars().take(80).collect()))
            }
        }
    }
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
pub fn is_loopback_name(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    name.eq_ignore_ascii_case("localhost")
        || name == "::1"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::is_loopback_name;

    #[test]
    fn loopback_names_with_and_without_ports() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.1.2.3:9",
            "[::1]:80",
            "[::1]",
        ] {
            assert!(is_loopback_name(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example",
            "localhost.evil.example",
            "10.0.0.1:80",
            "128.0.0.1",
            "[::2]:1",
            "localhost:http",
        ] {
            assert!(!is_loopback_name(bad), "{bad}");
        }
    }
}
