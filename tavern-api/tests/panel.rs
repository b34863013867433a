//! The panel's rules without a browser: forms need the CSRF token, a token-protected server
//! signs browsers in with a cookie, a forwarding host's prefix is kept in every link and
//! redirect, and what users wrote is shown escaped.

mod common;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::{harness, harness_on, Harness};
use http_body_util::BodyExt;
use serde_json::json;
use tavern_runtime::testkit::MemHost;
use tower::ServiceExt;

struct Answer {
    status: StatusCode,
    location: Option<String>,
    cookie: Option<String>,
    body: String,
}

async fn send(h: &Harness, req: Request<Body>) -> Answer {
    let res = h.api.router().oneshot(req).await.unwrap();
    let header = |name| {
        res.headers()
            .get(name)
            .map(|v: &axum::http::HeaderValue| v.to_str().unwrap().to_owned())
    };
    let (location, cookie) = (header(header::LOCATION), header(header::SET_COOKIE));
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        location,
        cookie,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

fn get(uri: &str) -> axum::http::request::Builder {
    Request::get(uri).header(header::HOST, "127.0.0.1:7300")
}

fn form(uri: &str, body: &str) -> Request<Body> {
    Request::post(uri)
        .header(header::HOST, "127.0.0.1:7300")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// The CSRF token from a page's form.
fn csrf(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with the token")
        + 19;
    page[at..at + 64].to_owned()
}

#[tokio::test]
async fn forms_without_the_token_are_refused_and_write_nothing() {
    let h = harness();
    let page = send(&h, get("/panel/memories").body(Body::empty()).unwrap()).await;
    assert_eq!(page.status, StatusCode::OK);
    let token = csrf(&page.body);
    for body in [
        "id=planted&scope=global&content=x".to_owned(),
        "csrf=0000&id=planted&scope=global&content=x".to_owned(),
        format!("csrf={}&id=planted&scope=global&content=x", "f".repeat(64)),
    ] {
        let a = send(&h, form("/panel/memories/new", &body)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{body}");
        assert!(a.body.contains("\"csrf\""), "{}", a.body);
    }
    let (_, listed) = h.get("/api/v1/memories?scope=global").await;
    assert_eq!(listed["total"], 0, "nothing was written");
    // JSON is not a form.
    let json_body = Request::post("/panel/memories/new")
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(format!("{{\"csrf\":\"{token}\"}}")))
        .unwrap();
    assert_eq!(
        send(&h, json_body).await.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    // With the token: created, and redirected to the new memory.
    let a = send(
        &h,
        form(
            "/panel/memories/new",
            &format!("csrf={token}&id=lamp&scope=global&content=%E7%81%AF"),
        ),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(
        a.location.as_deref(),
        Some("/panel/memories/lamp?scope=global&done=saved")
    );
    let (_, m) = h.get("/api/v1/memories/lamp?scope=global").await;
    assert_eq!(m["content"], "灯");
    assert_eq!(m["source"]["kind"], "user");
}

/// A GET of `path` with one `Cookie` header.
async fn with_cookie(h: &Harness, path: &str, cookie: &str) -> Answer {
    send(
        h,
        get(path)
            .header(header::COOKIE, cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await
}

#[tokio::test]
async fn a_token_server_signs_browsers_in_with_an_http_only_cookie() {
    let h = harness_on(MemHost::capable(), Some("k7Qm2vX9pL4sT8wZ"));
    let a = send(&h, get("/panel/memories").body(Body::empty()).unwrap()).await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert_eq!(a.location.as_deref(), Some("/panel/login"));
    let a = send(&h, get("/panel/login").body(Body::empty()).unwrap()).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.body.contains("type=\"password\""));
    let wrong = send(&h, form("/panel/login", "token=k7Qm2vX9pL4sT8wY")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(wrong.cookie.is_none());
    let right = send(&h, form("/panel/login", "token=k7Qm2vX9pL4sT8wZ")).await;
    assert_eq!(right.status, StatusCode::SEE_OTHER);
    let cookie = right.cookie.unwrap();
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && cookie.contains("Path=/panel;"),
        "{cookie}"
    );
    // A random session id, never the token.
    assert!(!cookie.contains("k7Qm2vX9pL4sT8wZ"), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_owned();
    assert!(
        pair.starts_with("tavern_session=") && pair.len() > 64,
        "{pair}"
    );
    let a = with_cookie(&h, "/panel/memories", &pair).await;
    assert_eq!(a.status, StatusCode::OK);
    // The JSON API without a token still answers 401, not a redirect — with the panel's
    // cookie too: it opens the panel only.
    let a = send(&h, get("/api/v1/settings").body(Body::empty()).unwrap()).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    let a = with_cookie(&h, "/api/v1/settings", &pair).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    // The token itself in a cookie opens nothing; a made-up session neither.
    for forged in [
        "tavern_token=k7Qm2vX9pL4sT8wZ",
        "tavern_session=k7Qm2vX9pL4sT8wZ",
    ] {
        let a = with_cookie(&h, "/panel/memories", forged).await;
        assert_eq!(a.status, StatusCode::SEE_OTHER, "{forged}");
    }
    // Sign-ins are bounded: the oldest is signed out past the limit.
    for _ in 0..tavern_api::MAX_PANEL_SESSIONS {
        let again = send(&h, form("/panel/login", "token=k7Qm2vX9pL4sT8wZ")).await;
        assert_eq!(again.status, StatusCode::SEE_OTHER);
    }
    let a = with_cookie(&h, "/panel/memories", &pair).await;
    assert_eq!(
        a.status,
        StatusCode::SEE_OTHER,
        "the first sign-in was dropped"
    );
}

#[tokio::test]
async fn a_forwarding_hosts_prefix_is_in_every_link_and_redirect() {
    let h = harness();
    let page = h
        .api
        .forward(tavern_api::Forwarded {
            method: "GET".into(),
            path_and_query: "/panel/memories".into(),
            content_type: None,
            body: Vec::new(),
            base: "/agent-tavern".into(),
            cookie: Some("tavern_lang=zh".into()),
            accept_language: None,
            sign_in_token: None,
        })
        .await;
    assert_eq!(page.status, 200);
    let html = String::from_utf8(page.body).unwrap();
    assert!(
        html.contains("href=\"/agent-tavern/panel/memories\""),
        "nav links keep the prefix"
    );
    assert!(html.contains("action=\"/agent-tavern/panel/memories/new\""));
    assert!(
        html.contains("<h1>记忆</h1>"),
        "the language cookie is read"
    );
    assert!(
        !html.contains("href=\"/panel/"),
        "no link escapes the prefix"
    );
    let token = csrf(&html);
    let made = h
        .api
        .forward(tavern_api::Forwarded {
            method: "POST".into(),
            path_and_query: "/panel/memories/new".into(),
            content_type: Some("application/x-www-form-urlencoded".into()),
            body: format!("csrf={token}&id=m1&scope=global&content=x").into_bytes(),
            base: "/agent-tavern".into(),
            cookie: None,
            accept_language: None,
            sign_in_token: None,
        })
        .await;
    assert_eq!(made.status, 303);
    assert_eq!(
        made.location.as_deref(),
        Some("/agent-tavern/panel/memories/m1?scope=global&done=saved")
    );
}

#[tokio::test]
async fn what_users_and_models_wrote_is_shown_escaped() {
    let h = harness();
    let (status, _) = h
        .call(
            "POST",
            "/api/v1/memories",
            Some(json!({"scope": {"kind": "global"}, "id": "xss",
                "content": "<script>alert(1)</script> & <b>bold</b>"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    for uri in [
        "/panel/memories?q=alert",
        "/panel/memories/xss?scope=global",
    ] {
        let a = send(&h, get(uri).body(Body::empty()).unwrap()).await;
        assert_eq!(a.status, StatusCode::OK);
        assert!(!a.body.contains("<script>"), "{uri}");
        assert!(
            a.body.contains("&#60;script&#62;") || a.body.contains("&lt;script&gt;"),
            "{uri}"
        );
    }
    // The history's diff of an edit is escaped too, and shows what went and what came.
    let (_, m) = h.get("/api/v1/memories/xss?scope=global").await;
    let (status, _) = h
        .call(
            "PUT",
            "/api/v1/memories/xss?scope=global",
            Some(json!({"revision": m["revision"],
                "content": "<script>alert(2)</script> & <b>bold</b>"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let page = send(
        &h,
        get("/panel/memories/xss?scope=global")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert!(!page.body.contains("<script>"), "{}", page.body);
    assert!(
        page.body.contains("<del>1</del><ins>2</ins>"),
        "{}",
        page.body
    );
    assert!(page.body.contains("First text"), "{}", page.body);
    let missing = send(
        &h,
        get("/panel/memories/nope?scope=global")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing.body.contains("<h1>Error 404</h1>"),
        "{}",
        missing.body
    );
}

struct Damaged;

#[async_trait::async_trait]
impl tavern_api::routes::store::StoreCheck for Damaged {
    async fn check(&self) -> Result<tavern_api::routes::store::CheckReport, String> {
        Ok(tavern_api::routes::store::CheckReport {
            ok: false,
            problems: vec![tavern_api::routes::store::CheckFinding {
                file: "memory.log:3".into(),
                problem: "checksum mismatch".into(),
            }],
            warnings: Vec::new(),
        })
    }
}

#[tokio::test]
async fn the_store_page_runs_the_servers_check_and_shows_what_it_found() {
    let mut h = harness();
    h.api = h.api.clone().with_store_check(std::sync::Arc::new(Damaged));
    let page = send(&h, get("/panel/store").body(Body::empty()).unwrap()).await;
    assert_eq!(page.status, StatusCode::OK);
    let token = csrf(&page.body);
    let ran = send(&h, form("/panel/store", &format!("csrf={token}"))).await;
    assert_eq!(ran.status, StatusCode::OK);
    assert!(
        ran.body.contains("memory.log:3") && ran.body.contains("checksum mismatch"),
        "{}",
        ran.body
    );
    assert!(ran.body.contains("The store has damage"));
    let refused = send(&h, form("/panel/store", "csrf=nope")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
}

/// A host with a token of its own (DSH's `routeToken`) forwards panel requests it could not
/// admit — a browser sends no bearer header with a link — naming that token: the panel asks
/// for it on its sign-in page, and the session cookie it then gives opens the panel (only).
#[tokio::test]
async fn a_browser_signs_in_through_a_host_that_has_a_token() {
    let h = harness();
    let forward = |method: &str, path: &str, body: &str, cookie: Option<String>| {
        let form = (method == "POST").then(|| "application/x-www-form-urlencoded".to_owned());
        tavern_api::Forwarded {
            method: method.into(),
            path_and_query: path.into(),
            content_type: form,
            body: body.as_bytes().to_vec(),
            base: "/agent-tavern".into(),
            cookie,
            accept_language: None,
            sign_in_token: Some("route-s3cret".into()),
        }
    };
    let first = h.api.forward(forward("GET", "/panel", "", None)).await;
    assert_eq!(first.status, 303);
    assert_eq!(first.location.as_deref(), Some("/agent-tavern/panel/login"));
    let form = h
        .api
        .forward(forward("GET", "/panel/login", "", None))
        .await;
    assert_eq!(form.status, 200);
    let wrong = h
        .api
        .forward(forward("POST", "/panel/login", "token=guess", None))
        .await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.set_cookie.is_none());
    let ok = h
        .api
        .forward(forward("POST", "/panel/login", "token=route-s3cret", None))
        .await;
    assert_eq!(ok.status, 303, "{}", String::from_utf8_lossy(&ok.body));
    let cookie = ok.set_cookie.expect("a session cookie");
    assert!(cookie.contains("Path=/agent-tavern/panel"), "{cookie}");
    assert!(
        cookie.contains("HttpOnly") && !cookie.contains("route-s3cret"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let page = h
        .api
        .forward(forward("GET", "/panel/memories", "", Some(session.clone())))
        .await;
    assert_eq!(page.status, 200);
    // The cookie opens the panel, not the JSON API; a made-up session opens nothing.
    let api = h
        .api
        .forward(forward("GET", "/api/v1/sessions", "", Some(session)))
        .await;
    assert_eq!(api.status, 401);
    let forged = h
        .api
        .forward(forward(
            "GET",
            "/panel/memories",
            "",
            Some("tavern_session=0123456789abcdef".into()),
        ))
        .await;
    assert_eq!(forged.status, 303);
    // A request the host admitted (its bearer token checked) needs no sign-in.
    let mut admitted = forward("GET", "/api/v1/sessions", "", None);
    admitted.sign_in_token = None;
    assert_eq!(h.api.forward(admitted).await.status, 200);
}

/// Browsers send a form value's line breaks as CRLF: an edit (or an earlier text brought back)
/// keeps the text's own line breaks, so bringing back a multi-line text restores it exactly.
#[tokio::test]
async fn a_multi_line_text_comes_back_from_a_form_unchanged() {
    let h = harness();
    let (status, m) = h
        .call(
            "POST",
            "/api/v1/memories",
            Some(json!({"scope": {"kind": "global"}, "id": "poem", "content": "first line\nsecond line"})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, m2) = h
        .call(
            "PUT",
            "/api/v1/memories/poem?scope=global",
            Some(json!({"revision": m["revision"], "content": "one line"})),
        )
        .await;
    let page = send(
        &h,
        get("/panel/memories/poem?scope=global")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert!(page.body.contains("class=\"bring-back\""), "{}", page.body);
    let body = serde_urlencoded::to_string([
        ("csrf", csrf(&page.body)),
        ("revision", m2["revision"].as_str().unwrap().to_owned()),
        ("content", "first line\r\nsecond line".to_owned()),
    ])
    .unwrap();
    let done = send(&h, form("/panel/memories/poem/edit?scope=global", &body)).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    let (_, back) = h.get("/api/v1/memories/poem?scope=global").await;
    assert_eq!(back["content"], "first line\nsecond line");
    // The text that came back is the first one again: its history says so, no diff of CRs.
    let (_, hist) = h.get("/api/v1/memories/poem/history?scope=global").await;
    assert_eq!(
        hist["entries"][2]["content"], "first line\nsecond line",
        "{hist}"
    );
}
