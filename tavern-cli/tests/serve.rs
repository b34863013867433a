//! `tavern serve` as a user runs it: the real binary on a real port, driven over a plain TCP
//! socket, stopped by SIGTERM like a service manager stops it; what was written through the API
//! is then on disk for `tavern memory ls`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

fn tavern() -> Command {
    Command::new(assert_cmd::cargo::cargo_bin("tavern"))
}

/// A running server and the address it announced.
struct Server {
    child: Child,
    addr: String,
    /// The line announcing the address (and the ranker read).
    announced: String,
}

/// A data directory with an empty store in it (as a first session leaves one).
fn data_dir(at: &std::path::Path) {
    tavern_store::fs::FsStore::open(at, std::sync::Arc::new(tavern_store::SystemClock)).unwrap();
}

impl Server {
    fn start(data: &std::path::Path, extra: &[&str]) -> Self {
        data_dir(data);
        let mut child = tavern()
            .args(["--data"])
            .arg(data)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The announcement is the readiness signal: it is printed once the port is bound.
        let mut line = String::new();
        BufReader::new(child.stderr.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("no address announced: {line:?}"))
            .to_owned();
        Self {
            child,
            addr,
            announced: line,
        }
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        if let Some(token) = auth {
            req.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(&body);
        stream.write_all(req.as_bytes()).unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        let (head, payload) = raw.split_once("\r\n\r\n").unwrap();
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        let json = if payload.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(payload).unwrap_or_else(|e| panic!("{e}: {payload}"))
        };
        (status, json)
    }

    /// Stops it as a service manager does and returns what it printed on stdout.
    fn stop(self) -> String {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success(), "exit {:?}", out.status);
        String::from_utf8(out.stdout).unwrap()
    }
}

#[test]
fn memories_written_through_the_api_are_on_disk_after_a_graceful_stop() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let (status, created) = server.request(
        "POST",
        "/api/v1/memories",
        None,
        Some(&json!({"scope": {"kind": "global"}, "id": "lantern", "content": "灯笼挂在北门。"})),
    );
    assert_eq!(status, 201, "{created}");
    let (status, page) = server.request("GET", "/api/v1/memories?scope=global", None, None);
    assert_eq!(status, 200);
    assert_eq!(page["items"][0]["memory"]["id"], "lantern");
    let (status, doc) = server.request("GET", "/api/v1/openapi.json", None, None);
    assert_eq!(status, 200);
    assert!(doc["paths"]["/api/v1/memories"].is_object());
    // Sessions are the host's: none is bound in a fresh store.
    let (status, _) = server.request("GET", "/api/v1/sessions/s1", None, None);
    assert_eq!(status, 404);
    let out = server.stop();
    assert!(out.contains("stopped serving"), "{out}");

    let ls = tavern()
        .args(["--data"])
        .arg(dir.path())
        .args(["--json", "memory", "ls", "--scope", "global"])
        .output()
        .unwrap();
    assert!(ls.status.success());
    let listed: Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert!(listed.to_string().contains("灯笼挂在北门"), "{listed}");
}

#[test]
fn with_a_token_every_request_must_carry_it() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "k7Qm2vX9pL4sT8wZ\n").unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--token-file", token_file.to_str().unwrap()],
    );
    let (status, body) = server.request("GET", "/api/v1/settings", None, None);
    assert_eq!(status, 401, "{body}");
    let (status, _) = server.request("GET", "/api/v1/settings", Some("k7Qm2vX9pL4sT8wY"), None);
    assert_eq!(status, 401);
    let (status, body) = server.request("GET", "/api/v1/settings", Some("k7Qm2vX9pL4sT8wZ"), None);
    assert_eq!(status, 200, "{body}");
    server.stop();
}

#[test]
fn other_addresses_need_a_token_and_short_tokens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = tavern()
        .args(["--data"])
        .arg(dir.path())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a loopback address") && err.contains("--token-file"),
        "{err}"
    );
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "short\n").unwrap();
    let out = tavern()
        .args(["--data"])
        .arg(dir.path())
        .args(["serve", "--listen", "0.0.0.0:0", "--token-file"])
        .arg(&token_file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16 characters"));
}

#[test]
fn the_store_check_says_whether_the_data_is_whole_and_names_the_damaged_file() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let (status, created) = server.request(
        "POST",
        "/api/v1/memories",
        None,
        Some(&json!({"scope": {"kind": "global"}, "id": "bell", "content": "钟声在午夜响起。"})),
    );
    assert_eq!(status, 201, "{created}");
    let (status, whole) = server.request("GET", "/api/v1/store/check", None, None);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["ok"], true, "{whole}");
    // Damage in the middle of the log, where no torn write can be: a flipped byte.
    let log = dir.path().join("memory.log");
    let mut bytes = std::fs::read(&log).unwrap();
    let at = bytes.iter().position(|b| *b == b'{').unwrap() + 5;
    bytes[at] ^= 0x20;
    std::fs::write(&log, bytes).unwrap();
    let (status, damaged) = server.request("GET", "/api/v1/store/check", None, None);
    assert_eq!(status, 200);
    assert_eq!(damaged["ok"], false, "{damaged}");
    let file = damaged["problems"][0]["file"].as_str().unwrap();
    assert!(file.starts_with("memory.log"), "{damaged}");
    assert!(
        !damaged.to_string().contains(dir.path().to_str().unwrap()),
        "no absolute path"
    );
    server.stop();
}

#[path = "../../tavern-search/tests/support/sentence_model.rs"]
mod sentence_model;

/// The panel's memory search through `tavern serve --word-vectors` (and
/// `--sentence-encoder`): what the query means
/// comes first among memories that tie on words (#34).
#[test]
fn the_panels_search_ranks_by_meaning_with_word_vectors() {
    let vectors = "camera 1.0 0.05 0.1\nphotography 0.95 0.0 0.15\nflash 0.9 0.1 0.0\n\
                   lens 0.97 0.0 0.1\ntable 0.05 1.0 0.0\ndesk 0.1 0.95 0.1\n";
    let search = |extra: &[&str], dir: &std::path::Path, ranking: &str| {
        let server = Server::start(&dir.join("data"), extra);
        // The operator sees which ranker was read (the bridge logs the same words).
        assert!(server.announced.contains(ranking), "{}", server.announced);
        for (id, content) in [
            // Last by id and oldest: last lexically however a tie on time is broken.
            ("zz-camera", "My camera setup needs a brighter flash lens."),
            ("dinner", "My dinner party setup needs a bigger table."),
            ("office", "My home office setup needs a standing desk."),
        ] {
            let body = json!({"scope": {"kind": "global"}, "id": id, "content": content});
            let (status, created) = server.request("POST", "/api/v1/memories", None, Some(&body));
            assert_eq!(status, 201, "{created}");
        }
        let (status, page) = server.request(
            "GET",
            "/api/v1/memories?scope=global&q=photography%20setup%20accessories",
            None,
            None,
        );
        assert_eq!(status, 200, "{page}");
        server.stop();
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["memory"]["id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let (lexical_dir, vectors_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let lexical = search(&[], lexical_dir.path(), "ranking by words alone (BM25)");
    assert_eq!(lexical.len(), 3);
    assert_eq!(lexical[2], "zz-camera", "{lexical:?}");
    let file = vectors_dir.path().join("vectors.txt");
    std::fs::write(&file, vectors).unwrap();
    let ranked = search(
        &["--word-vectors", file.to_str().unwrap()],
        vectors_dir.path(),
        "word vectors read: 6 words of 3 dimensions",
    );
    assert_eq!(ranked[0], "zz-camera", "{ranked:?}");
    // The real sentence encoder, through the same panel search (encoded outside the store).
    let model = sentence_model::sentence_model_dir();
    let encoder_dir = tempfile::tempdir().unwrap();
    let ranked = search(
        &["--sentence-encoder", model.to_str().unwrap()],
        encoder_dir.path(),
        "sentence encoder read: all-MiniLM-L6-v2",
    );
    assert_eq!(ranked[0], "zz-camera", "{ranked:?}");

    let bad = tavern()
        .args(["--data"])
        .arg(vectors_dir.path().join("data"))
        .args(["serve", "--listen", "127.0.0.1:0", "--word-vectors"])
        .arg(vectors_dir.path().join("missing.txt"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8(bad.stderr).unwrap();
    assert!(
        err.contains("--word-vectors") && err.contains("cannot be read"),
        "{err}"
    );
}
