//! The panel in a real browser: Debian's chromium driven over WebDriver (fantoccini) against
//! the panel served on a real port, with JavaScript off for every flow (each write is a plain
//! form), then with it on for axe-core's accessibility check and a screenshot of each page.
//! `scripts/ensure-browser.sh` provides chromium, chromium-driver and axe-core; without them
//! these tests fail, they never skip.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{harness, harness_on, sid, Harness};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use tavern_core::HostFacts;
use tavern_projector::event::{TurnEndReason, UserSource};
use tavern_projector::EventKind;
use tavern_runtime::testkit::MemHost;

/// What the browser tests need, provided by the project's script; the path of axe.min.js.
fn browser_tools() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ensure-browser.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("scripts/ensure-browser.sh runs");
    assert!(
        out.status.success(),
        "scripts/ensure-browser.sh failed: the browser tests need chromium, chromium-driver and axe-core"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("the script prints axe.min.js's path")
            .trim(),
    )
}

/// A chromedriver on a port it chose, stopped when dropped, with its own temporary
/// directory (where Chromium makes each session's profile), removed when dropped: nothing
/// of a run is left in the machine's `/tmp`.
struct Driver {
    child: Child,
    url: String,
    _temp: tempfile::TempDir,
}

impl Driver {
    fn start() -> Self {
        let temp = tempfile::tempdir().expect("a temporary directory for chromium");
        let mut child = Command::new("chromedriver")
            .arg("--port=0")
            .env("TMPDIR", temp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts (scripts/ensure-browser.sh installs it)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // It says which port it took once it listens: that line is the readiness signal.
        let port = loop {
            let line = lines
                .next()
                .expect("chromedriver said where it listens")
                .unwrap();
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                break rest.trim_end_matches('.').trim().to_owned();
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _temp: temp,
        }
    }

    async fn browser(&self, javascript: bool) -> Client {
        let mut prefs = json!({});
        if !javascript {
            prefs["profile.managed_default_content_settings.javascript"] = json!(2);
        }
        let caps = json!({
            "goog:chromeOptions": {
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1000", "--lang=en-US", "--force-device-scale-factor=1"],
                "prefs": prefs,
            }
        });
        let caps = match caps {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves a harness's router on a loopback port; returns its base URL.
async fn serve(h: &Harness) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = h.api.router();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

struct Page<'a> {
    c: &'a Client,
    base: &'a str,
}

impl Page<'_> {
    async fn goto(&self, path: &str) {
        self.c.goto(&format!("{}{path}", self.base)).await.unwrap();
        let source = self.c.source().await.unwrap();
        assert!(
            !source.contains("<script"),
            "{path}: the panel serves no script"
        );
    }

    async fn text(&self, css: &str) -> String {
        match self.c.find(Locator::Css(css)).await {
            Ok(e) => e.text().await.unwrap(),
            Err(e) => panic!("no {css} on {}: {e}", self.c.current_url().await.unwrap()),
        }
    }

    async fn has(&self, css: &str) -> bool {
        self.c.find(Locator::Css(css)).await.is_ok()
    }

    async fn fill(&self, css: &str, value: &str) {
        let e = self.c.find(Locator::Css(css)).await.unwrap();
        e.clear().await.unwrap();
        e.send_keys(value).await.unwrap();
    }

    /// Clicks a link or submit button and waits for the next page: until the old page's root
    /// element is gone (a condition polled over WebDriver, bounded; never a sleep).
    async fn click(&self, css: &str) {
        let root = self.c.find(Locator::Css("html")).await.unwrap();
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        for _ in 0..2000 {
            match root.tag_name().await {
                // Chromium says "stale", or (mid-navigation) that the node left the document.
                Err(fantoccini::error::CmdError::Standard(e))
                    if e.error == fantoccini::error::ErrorStatus::StaleElementReference
                        || e.message.contains("does not belong to the document") =>
                {
                    return;
                }
                Err(e) => panic!("after clicking {css}: {e}"),
                Ok(_) => tokio::task::yield_now().await,
            }
        }
        panic!("clicking {css} led to no new page");
    }

    /// Ticks a box or picks a radio button (no page load).
    async fn check(&self, css: &str) {
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    async fn value(&self, css: &str) -> String {
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap()
            .unwrap_or_default()
    }
}

async fn seed(h: &Harness) -> Value {
    h.session("s1", "Seraphina - 1").await;
    let (status, m) = h
        .call(
            "POST",
            "/api/v1/memories",
            Some(
                json!({"scope": {"kind": "character", "character": "Seraphina"}, "id": "lantern",
                "content": "Kai's lantern is blue. 灯笼是蓝色的。", "tags": ["lantern"]}),
            ),
        )
        .await;
    assert_eq!(status.as_u16(), 201, "{m}");
    m
}

const LANTERN: &str = "/panel/memories/lantern?scope=character&character=Seraphina";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_corrects_and_steers_a_roleplay_in_a_real_browser_without_javascript() {
    browser_tools();
    let h = harness();
    seed(&h).await;
    let base = serve(&h).await;
    let driver = Driver::start();
    let c = driver.browser(false).await;
    let p = Page { c: &c, base: &base };

    // 1. The overview lists the session with its architecture label and projection.
    p.goto("/panel").await;
    let table = p.text("table").await;
    assert!(
        table.contains("s1") && table.contains("agent-tavern") && table.contains("Seraphina - 1"),
        "{table}"
    );

    // 2. Chinese, kept by a cookie across pages; and back.
    p.click("#switch-lang").await;
    assert_eq!(p.text("h1").await, "会话");
    p.goto("/panel/memories").await;
    assert_eq!(p.text("h1").await, "记忆");
    p.click("#switch-lang").await;
    assert_eq!(p.text("h1").await, "Memories");

    // 3. A search marks what matched.
    p.goto("/panel/memories?q=lantern").await;
    assert_eq!(p.text("mark").await, "lantern");
    p.goto(&format!("/panel/memories?q={}", "%E7%81%AF%E7%AC%BC"))
        .await;
    assert_eq!(p.text("mark").await, "灯笼");

    // 4. Edit, saved.
    p.goto(LANTERN).await;
    p.fill("#edit-content", "Kai's lantern is deep blue.").await;
    p.click("#save").await;
    assert!(p.has("#flash").await);
    assert_eq!(p.text("#content").await, "Kai's lantern is deep blue.");

    // 5. A conflict: the model (here, the API) changes the memory while the page is open;
    // the save shows both versions, nothing is lost, and the edit is applied on top.
    p.goto(LANTERN).await;
    let (_, now) = h
        .get("/api/v1/memories/lantern?scope=character&character=Seraphina")
        .await;
    let (status, _) = h
        .call(
            "PUT",
            "/api/v1/memories/lantern?scope=character&character=Seraphina",
            Some(json!({"revision": now["revision"], "content": "Kai's lantern is green now."})),
        )
        .await;
    assert_eq!(status.as_u16(), 200);
    p.fill("#edit-content", "Kai's lantern is navy blue.").await;
    p.click("#save").await;
    assert!(p.has("#conflict").await, "a conflict page");
    assert_eq!(p.text("#yours").await, "Kai's lantern is navy blue.");
    assert_eq!(p.text("#current").await, "Kai's lantern is green now.");
    p.fill("#merge", "Kai's lantern was green; now navy blue.")
        .await;
    p.click("#apply").await;
    assert_eq!(
        p.text("#content").await,
        "Kai's lantern was green; now navy blue."
    );

    // 6. Forget, then restore: it comes back whole.
    p.click("#forget").await;
    assert_eq!(p.text("#state").await, "forgotten");
    assert!(p.has("#forgotten-note").await);
    p.click("#restore").await;
    assert_eq!(p.text("#state").await, "live");
    assert_eq!(
        p.text("#content").await,
        "Kai's lantern was green; now navy blue."
    );
    let history = p.text("table").await;
    assert!(
        history.contains("forgotten") && history.contains("restored"),
        "{history}"
    );
    // The history shows what the merge changed, word by word.
    assert!(
        p.has("td.change del").await && p.has("td.change ins").await,
        "{history}"
    );
    assert!(
        history.contains("Text unchanged"),
        "forget and restore kept the text: {history}"
    );
    // An earlier text comes back from the history as a new version (the first version's).
    let (_, hist) = h
        .get("/api/v1/memories/lantern/history?scope=character&character=Seraphina")
        .await;
    let first = hist["entries"][0]["content"]
        .as_str()
        .expect("the first version's text is kept")
        .to_owned();
    p.click("button.bring-back").await;
    assert!(p.has("#flash").await);
    assert_eq!(p.text("#content").await, first);

    // 6c. A memory the model wrote links to the chat lines of the turn that wrote it.
    let gift = h
        .play_turn(
            "s1",
            1,
            "我把灯笼送给你。",
            Some("Kai gave Seraphina a lantern."),
            "Thank you for the lantern.",
        )
        .await
        .unwrap();
    p.goto(&format!(
        "/panel/memories/{gift}?scope=chat&character=Seraphina&chat=Seraphina%20-%201"
    ))
    .await;
    p.click("#source-link").await;
    assert!(p.has("#turn-1").await);
    assert_eq!(p.text("li.hit .text").await, "我把灯笼送给你。");
    let page = p.text("#chat-messages").await;
    assert!(page.contains("Thank you for the lantern."), "{page}");

    // 7. Switch the context mode at an idle boundary.
    p.goto("/panel/sessions/s1").await;
    assert_eq!(p.text("#context-mode").await, "dsh-native");
    p.check("input[value=agent-managed]").await;
    p.click("#mode-h + form button").await;
    assert_eq!(p.text("#context-mode").await, "agent-managed");

    // 8. Edit the tavern-mode prompt, braces kept; reset.
    p.fill("#prompt-text", "你是{{char}}，与{{user}}在林中相遇。")
        .await;
    p.click("button[name=action][value=save]").await;
    assert_eq!(
        p.value("#prompt-text").await,
        "你是{{char}}，与{{user}}在林中相遇。"
    );
    p.click("button[name=action][value=reset]").await;
    assert!(p.value("#prompt-text").await.contains("You are {{char}}"));
    // Each of those writes is in the session's change log, newest first, as the user's.
    let changes = p.text("#changes").await;
    let reset = changes
        .find("tavern-mode prompt reset")
        .expect("the reset is logged");
    let mode = changes
        .find("context mode dsh-native → agent-managed")
        .expect("the switch is logged");
    assert!(reset < mode, "{changes}");
    assert!(changes.contains("user"), "{changes}");

    // 9. Fork into st: a new session, labelled st.
    p.fill("#fork-h ~ form input[name=session]", "s1-st").await;
    p.fill("#fork-h ~ form input[name=chat]", "Seraphina - 1 (st)")
        .await;
    p.click("#fork-h ~ form button").await;
    assert_eq!(p.text("#architecture").await, "st");

    // 10. Variables: a typed value, a refusal that says why, a delete.
    p.goto("/panel/variables?scope=global").await;
    p.fill("#newvar-h ~ form input[name=name]", "hp").await;
    p.fill(
        "#newvar-h ~ form textarea[name=value]",
        r#"{"max": 10, "now": 7}"#,
    )
    .await;
    p.click("#newvar-h ~ form button").await;
    let section = p.text("section.variable").await;
    assert!(
        section.contains("hp") && section.contains("object"),
        "{section}"
    );
    p.click("section.variable a.history").await;
    let history = p.text("#variable-history").await;
    assert!(
        history.contains("set") && history.contains("user"),
        "{history}"
    );
    p.goto("/panel/variables?scope=global").await;
    p.fill("section.variable textarea", "not json").await;
    p.click("section.variable form button").await;
    assert!(p.text("#message").await.contains("not json"));
    p.goto("/panel/variables?scope=global").await;
    p.click("section.variable button.danger").await;
    assert!(!p.has("section.variable").await);

    // 11. The lore tester: what a text activates, from which book, why.
    p.goto("/panel/lore?session=s1").await;
    p.fill("#lore-text", "tell me about the forest of eldoria")
        .await;
    p.click("#test").await;
    let results = p.text("#lore-results").await;
    assert!(results.contains("keyword"), "{results}");

    // 12. Settings persist.
    let (_, before) = h.get("/api/v1/settings").await;
    p.goto("/panel/settings").await;
    p.check("input[name=allowGlobalWrites]").await;
    p.click("main form button").await;
    let (_, settings) = h.get("/api/v1/settings").await;
    assert_eq!(
        settings["allowGlobalWrites"],
        !before["allowGlobalWrites"].as_bool().unwrap(),
        "{settings}"
    );
    assert_eq!(
        settings["defaultArchitecture"],
        before["defaultArchitecture"]
    );

    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_projection_is_replayed_and_an_unavailable_mode_says_why() {
    browser_tools();
    // A host without the agent/context seam (DSH rc.6).
    let h = harness_on(MemHost::new(HostFacts::bare("dsh 0.1.0-rc.6")), None);
    h.session("s1", "Seraphina - 1").await;
    let s1 = sid("s1");
    h.store.fail_next("chat.append");
    let mut failed = false;
    for kind in [
        EventKind::TurnStart { turn: 1 },
        EventKind::UserMessage {
            source: UserSource::User,
            text: "Let us walk north.".into(),
        },
        EventKind::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
        },
    ] {
        let e = h.host.log(&s1, kind).unwrap();
        if !failed {
            failed = h.runtime.on_event(&s1, &e).await.is_err();
        }
    }
    assert!(failed);
    let base = serve(&h).await;
    let driver = Driver::start();
    let c = driver.browser(false).await;
    let p = Page { c: &c, base: &base };
    p.goto("/panel/sessions/s1").await;
    let reason = p.text("#reason-agent-managed").await;
    assert!(reason.contains("agent/context"), "{reason}");
    let radio = c
        .find(Locator::Css("input[value=agent-managed]"))
        .await
        .unwrap();
    assert!(
        !radio.is_enabled().await.unwrap(),
        "an unavailable mode cannot be chosen"
    );
    assert!(p.text("#projection").await.contains("pending"));
    p.click("#replay").await;
    assert!(p.has("#flash").await);
    assert_eq!(p.text("#projection").await, "ok");
    c.close().await.unwrap();
}

/// Every page, in English and Chinese, passes axe-core with no serious or critical violation;
/// each is photographed (target/panel-screenshots; `UPDATE_SCREENSHOTS=1` writes docs/).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_passes_axe_core_in_both_languages() {
    let axe = std::fs::read_to_string(browser_tools()).unwrap();
    let h = harness();
    seed(&h).await;
    h.call(
        "PUT",
        "/api/v1/variables/hp?scope=global",
        Some(json!({"value": {"max": 10}})),
    )
    .await;
    // The memory page shows an edit in its history; the chat page has a turn to mark.
    let (_, m) = h
        .get("/api/v1/memories/lantern?scope=character&character=Seraphina")
        .await;
    h.call(
        "PUT",
        "/api/v1/memories/lantern?scope=character&character=Seraphina",
        Some(json!({"revision": m["revision"], "content": "Kai's lantern is deep blue. 灯笼是深蓝色的。"})),
    )
    .await;
    h.play_turn(
        "s1",
        1,
        "我把灯笼送给你。",
        Some("Kai gave Seraphina a lantern."),
        "Thank you.",
    )
    .await;
    let base = serve(&h).await;
    let driver = Driver::start();
    let c = driver.browser(true).await;
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/panel-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let docs = std::env::var_os("UPDATE_SCREENSHOTS")
        .map(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots"));
    let pages = [
        ("overview", "/panel"),
        ("session", "/panel/sessions/s1"),
        ("chat", "/panel/sessions/s1/chat?turn=1"),
        ("memories", "/panel/memories?q=lantern"),
        ("memory", LANTERN),
        ("variables", "/panel/variables?scope=global"),
        (
            "variable-history",
            "/panel/variables/hp/history?scope=global",
        ),
        ("lore", "/panel/lore?session=s1"),
        ("settings", "/panel/settings"),
        ("store", "/panel/store"),
    ];
    let mut problems = Vec::new();
    for lang in ["en", "zh"] {
        for (name, path) in pages {
            let sep = if path.contains('?') { '&' } else { '?' };
            c.goto(&format!("{base}{path}{sep}lang={lang}"))
                .await
                .unwrap();
            let script = format!(
                "{axe}\nconst done = arguments[arguments.length - 1];\n\
                 axe.run(document, {{resultTypes: ['violations']}}).then(r => done(r.violations\
                 .filter(v => v.impact === 'serious' || v.impact === 'critical')\
                 .map(v => v.id + ': ' + v.help + ' at ' + v.nodes.map(n => n.target.join(' ')).join(', '))));"
            );
            let found = c.execute_async(&script, vec![]).await.unwrap();
            for v in found.as_array().unwrap() {
                problems.push(format!("{lang} {name}: {}", v.as_str().unwrap_or("?")));
            }
            let png = c.screenshot().await.unwrap();
            std::fs::write(shots.join(format!("{name}.{lang}.png")), &png).unwrap();
            if let Some(dir) = &docs {
                std::fs::create_dir_all(dir).unwrap();
                std::fs::write(dir.join(format!("{name}.{lang}.png")), &png).unwrap();
            }
        }
    }
    assert!(
        problems.is_empty(),
        "axe-core found:\n{}",
        problems.join("\n")
    );
    c.close().await.unwrap();
}
