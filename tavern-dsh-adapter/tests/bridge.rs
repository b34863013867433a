//! The sidecar, driven from the host side over real pipes: handshake, agent creation, prompt
//! text, tool calls with host identity, cancellation, event notifications feeding the
//! projector, malformed frames, orderly shutdown; and MCP mode for one fixed binding.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{json, Value};

const BRIDGE: &str = env!("CARGO_BIN_EXE_tavern-bridge");

struct Peer {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Peer {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(BRIDGE)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            input,
            output,
        }
    }

    /// Closes the bridge's input (how an MCP client ends) and waits for it to exit cleanly.
    fn close(self) {
        let Self {
            mut child, input, ..
        } = self;
        drop(input);
        assert!(child.wait().unwrap().success());
    }

    fn send_raw(&mut self, line: &str) {
        writeln!(self.input, "{line}").unwrap();
        self.input.flush().unwrap();
    }

    fn recv(&mut self) -> Value {
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad frame {line:?}: {e}"))
    }

    /// Sends a request and returns its response, skipping `log` notifications.
    fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send_raw(&json!({"id": id, "method": method, "params": params}).to_string());
        loop {
            let f = self.recv();
            if f.get("id") == Some(&json!(id)) {
                return f;
            }
            assert_eq!(f["method"], "log", "unexpected frame {f}");
        }
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send_raw(&json!({"method": method, "params": params}).to_string());
    }

    fn send_bytes(&mut self, bytes: &[u8]) {
        self.input.write_all(bytes).unwrap();
        self.input.write_all(b"\n").unwrap();
        self.input.flush().unwrap();
    }

    /// The next frame that is not a `log` notification.
    fn recv_reply(&mut self) -> Value {
        loop {
            let f = self.recv();
            if f["method"] != "log" {
                return f;
            }
        }
    }

    /// Starts a bridge on fresh data with the example card, handshaken, with `agents`
    /// announced and bound to chats of Mira.
    fn ready(dir: &Path, extra: &[&str], agents: &[&str]) -> Self {
        assets(&dir.join("assets"));
        let (data, assets_dir) = (dir.join("data"), dir.join("assets"));
        let mut args = vec![
            "--data",
            data.to_str().unwrap(),
            "--assets",
            assets_dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut p = Self::spawn(&args);
        assert_eq!(
            p.call(1, "handshake", json!({"protocol": 1}))["result"]["protocol"],
            1
        );
        for a in agents {
            let bound = p.call(
                2,
                "agent/created",
                json!({"agent": a, "bind": {"character": "Mira", "chatId": format!("Mira - {a}")}}),
            );
            assert_eq!(bound["result"]["mounted"], true, "{bound}");
        }
        p
    }

    /// Ends the session and waits for the process to exit successfully.
    fn finish(mut self) {
        let bye = self.call(999, "shutdown", json!({}));
        assert_eq!(bye["result"]["ok"], true);
        assert!(self.child.wait().unwrap().success());
    }
}

fn assets(dir: &Path) {
    std::fs::create_dir_all(dir.join("characters")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/assets/Mira.card.json"),
        dir.join("characters/Mira.json"),
    )
    .unwrap();
}

/// The name of the group [`add_real_group`] adds.
const REAL_GROUP: &str = "ZzGroup: Conversational Real Life";

/// Adds a real SillyTavern group file (named [`REAL_GROUP`]) to an assets folder.
fn add_real_group(assets: &Path) {
    let groups = assets.join("groups");
    std::fs::create_dir_all(&groups).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/fixtures/user-folder/groups/1720882292647.json"),
        groups.join("1720882292647.json"),
    )
    .unwrap();
}

fn ev(seq: u64, ty: &str, data: Value) -> Value {
    json!({"type": ty, "seq": seq, "time": 1_700_000_000_000u64 + seq, "data": data})
}

#[test]
fn the_bridge_serves_a_whole_session_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    assets(&dir.path().join("assets"));
    let data = dir.path().join("data");
    let mut p = Peer::spawn(&[
        "--data",
        data.to_str().unwrap(),
        "--assets",
        dir.path().join("assets").to_str().unwrap(),
        "--user",
        "Kai",
    ]);

    // Nothing is served before the handshake.
    assert_eq!(
        p.call(0, "status", json!({}))["error"]["code"],
        "handshake-required"
    );
    let hs = p.call(
        1,
        "handshake",
        json!({"protocol": 1, "host": "dsh", "hostVersion": "0.1.0-rc.6"}),
    );
    assert_eq!(hs["result"]["protocol"], 1);
    assert_eq!(hs["result"]["tools"].as_array().unwrap().len(), 14);
    assert!(hs["result"]["tools"][0]["outputSchema"].is_object());
    assert_eq!(
        hs["result"]["capabilities"]["managed"]["status"],
        "unavailable"
    );
    assert_eq!(
        p.call(2, "handshake", json!({"protocol": 9}))["error"]["code"],
        "unsupported-protocol"
    );

    // Malformed frames get an error frame and the bridge keeps serving.
    for bad in ["not json", "[1,2]", "{\"id\": 5}"] {
        p.send_raw(bad);
        let f = p.recv();
        assert_eq!(f["error"]["code"], "bad-frame", "{bad}: {f}");
    }
    assert_eq!(
        p.call(3, "frobnicate", json!({}))["error"]["code"],
        "unknown-method"
    );
    assert_eq!(
        p.call(4, "agent/created", json!({"agent": "../x"}))["error"]["code"],
        "invalid-params"
    );

    let bound = p.call(
        5,
        "chat/bind",
        json!({"session": "s1", "character": "Mira", "chatId": "Mira - bridge"}),
    );
    assert_eq!(
        bound["result"],
        json!({"architecture": "agent-tavern", "contextMode": "dsh-native"})
    );
    p.call(
        6,
        "chat/bind",
        json!({"session": "s2", "character": "Mira", "chatId": "Mira - other"}),
    );
    assert_eq!(
        p.call(7, "agent/created", json!({"agent": "s1"}))["result"]["mounted"],
        true
    );
    assert_eq!(
        p.call(8, "agent/created", json!({"agent": "plain"}))["result"]["mounted"],
        false
    );
    let auto = p.call(
        81,
        "agent/created",
        json!({"agent": "fresh-1", "bind": {"character": "Mira", "chatId": "Mira - fresh-1"}}),
    );
    assert_eq!(
        auto["result"]["mounted"], true,
        "an unbound session is bound on creation"
    );
    let prompt = p.call(9, "prompt", json!({"agent": "s1"}));
    let text = prompt["result"]["text"].as_str().unwrap();
    assert!(
        text.contains("You are Mira") && text.contains("{{char}}"),
        "persona literal, kernel present: {text}"
    );
    assert_eq!(
        p.call(10, "prompt", json!({"agent": "plain"}))["result"]["text"],
        Value::Null
    );

    // One turn as DSH logs it; the tool call carries the host's session id.
    p.notify("agent/status", json!({"agent": "s1", "status": "running"}));
    let turn = [
        ev(0, "turn/start", json!({"turn": 1})),
        ev(1, "step/start", json!({"turn": 1, "step": 1})),
        ev(
            2,
            "user/message",
            json!({"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": "Remember my name is Kai."}]}),
        ),
        ev(
            3,
            "assistant/message",
            json!({"turn": 1, "step": 1, "message": {"role": "assistant", "content": [{"type": "tool-call", "id": "c1", "name": "memory_write"}]}}),
        ),
        ev(
            4,
            "tool/call",
            json!({"turn": 1, "step": 1, "callId": "c1", "name": "memory_write", "arguments": {"content": "The traveler is Kai."}}),
        ),
    ];
    for e in &turn {
        p.notify("event", json!({"session": "s1", "event": e}));
    }
    let wrote = p.call(11, "tool/call", json!({"tool": "memory_write", "args": {"content": "The traveler is Kai."}, "callId": "c1", "session": "s1"}));
    assert_eq!(wrote["result"]["deduplicated"], false);
    let rest = [
        ev(
            5,
            "tool/result",
            json!({"turn": 1, "step": 1, "message": {"role": "tool", "toolCallId": "c1", "content": [{"type": "text", "text": wrote["result"].to_string()}]}}),
        ),
        ev(6, "step/end", json!({"turn": 1, "step": 1})),
        ev(7, "step/start", json!({"turn": 1, "step": 2})),
        ev(
            8,
            "assistant/message",
            json!({"turn": 1, "step": 2, "message": {"role": "assistant", "content": [{"type": "text", "text": "I will remember, Kai."}]}}),
        ),
        ev(9, "step/end", json!({"turn": 1, "step": 2})),
        ev(
            10,
            "turn/end",
            json!({"turn": 1, "reason": {"kind": "completed"}}),
        ),
    ];
    for e in &rest {
        p.notify("event", json!({"session": "s1", "event": e}));
    }
    p.notify("agent/status", json!({"agent": "s1", "status": "idle"}));

    // Tool calls come only from agents the host announced.
    let stranger = p.call(120, "tool/call", json!({"tool": "memory_search", "args": {"query": "Kai"}, "callId": "c20", "session": "s2"}));
    assert_eq!(stranger["error"]["code"], "unknown-agent", "{stranger}");
    p.call(121, "agent/created", json!({"agent": "s2"}));
    // Forged identity in arguments is refused; another session cannot see s1's memory.
    let forged = p.call(12, "tool/call", json!({"tool": "memory_search", "args": {"query": "Kai", "sessionId": "s1"}, "callId": "c2", "session": "s2"}));
    assert_eq!(forged["result"]["error"]["code"], "invalid-arguments");
    let other = p.call(
        13,
        "tool/call",
        json!({"tool": "memory_search", "args": {"query": "Kai"}, "callId": "c3", "session": "s2"}),
    );
    assert_eq!(other["result"]["items"], json!([]));
    let own = p.call(
        14,
        "tool/call",
        json!({"tool": "memory_search", "args": {"query": "Kai"}, "callId": "c4", "session": "s1"}),
    );
    assert_eq!(own["result"]["items"][0]["content"], "The traveler is Kai.");
    let plain = p.call(15, "tool/call", json!({"tool": "memory_search", "args": {"query": "Kai"}, "callId": "c5", "session": "plain"}));
    assert_eq!(plain["result"]["error"]["code"], "unavailable");

    p.notify("tool/cancel", json!({"callId": "c6", "session": "s1"}));
    let cancelled = p.call(16, "tool/call", json!({"tool": "variable_set", "args": {"name": "x", "value": 1}, "callId": "c6", "session": "s1"}));
    assert!(cancelled["result"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("cancelled"));
    assert!(
        p.call(
            17,
            "tool/call",
            json!({"tool": "variable_get", "args": {"name": "x"}, "callId": "c7", "session": "s1"})
        )["result"]["error"]["code"]
            == "not-found"
    );

    // The management API through the same bridge, as the plugin forwards DSH's web requests:
    // the user sees the model's memory, corrects it, and the model reads the correction.
    let api = |p: &mut Peer, id: u64, method: &str, path: &str, body: Option<Value>| {
        let mut params = json!({"method": method, "path": path});
        if let Some(b) = body {
            params["contentType"] = json!("application/json");
            params["body"] = json!(b.to_string());
        }
        let r = p.call(id, "api/request", params)["result"].clone();
        let body: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap_or(Value::Null);
        (r["status"].as_u64().unwrap(), body)
    };
    let (status, page) = api(&mut p, 30, "GET", "/api/v1/memories?session=s1&q=Kai", None);
    assert_eq!(status, 200, "{page}");
    let mem = page["items"][0]["memory"].clone();
    assert_eq!(mem["content"], "The traveler is Kai.");
    assert_eq!(mem["source"]["kind"], "tool");
    let q = format!(
        "scope={}&character={}&chat={}&session=s1",
        mem["scope"]["kind"].as_str().unwrap(),
        mem["scope"]["character"].as_str().unwrap_or(""),
        mem["scope"]["chat"]
            .as_str()
            .unwrap_or("")
            .replace(' ', "%20")
    );
    let (status, fixed) = api(
        &mut p,
        31,
        "PUT",
        &format!("/api/v1/memories/{}?{q}", mem["id"].as_str().unwrap()),
        Some(
            json!({"revision": mem["revision"], "content": "The traveler is Kai, a cartographer."}),
        ),
    );
    assert_eq!(status, 200, "{fixed}");
    assert_eq!(fixed["source"]["kind"], "user");
    let seen = p.call(
        32,
        "tool/call",
        json!({"tool": "memory_search", "args": {"query": "Kai"}, "callId": "c8", "session": "s1"}),
    );
    assert_eq!(
        seen["result"]["items"][0]["content"],
        "The traveler is Kai, a cartographer."
    );
    let (status, session) = api(&mut p, 33, "GET", "/api/v1/sessions/s1", None);
    assert_eq!(status, 200);
    assert_eq!(session["projection"]["status"], "ok", "{session}");
    let (status, refused) = api(
        &mut p,
        34,
        "POST",
        "/api/v1/sessions/s1/mode",
        Some(json!({"mode": "agent-managed"})),
    );
    assert_eq!(status, 409);
    assert_eq!(refused["error"]["rule"], "unavailable");

    assert!(p.call(
        18,
        "mode/switch",
        json!({"session": "s1", "mode": "agent-managed"})
    )["error"]["message"]
        .as_str()
        .unwrap()
        .contains("agent/context"));
    assert_eq!(
        p.call(19, "status", json!({}))["result"]["pending"],
        json!([])
    );
    assert_eq!(p.call(20, "shutdown", json!({}))["result"]["ok"], true);
    assert!(p.child.wait().unwrap().success());

    // The chat was projected: the user line and the final reply, once each.
    let chat = std::fs::read_dir(data.join("chats"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .find(|p| {
            p.to_string_lossy().contains("bridge") && p.extension().is_some_and(|e| e == "jsonl")
        })
        .unwrap();
    let text = std::fs::read_to_string(chat).unwrap();
    let mes: Vec<String> = text
        .lines()
        .skip(1)
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["mes"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        mes[1..],
        ["Remember my name is Kai.", "I will remember, Kai."],
        "after the greeting"
    );
}

#[test]
fn mcp_mode_serves_one_fixed_binding() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = mcp_peer(dir.path());
    let rpc = |p: &mut Peer, id: u64, method: &str, params: Value| {
        p.send_raw(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        // Notifications (log messages) may come in between.
        loop {
            let f = p.recv();
            if f["id"] == json!(id) {
                return f;
            }
            assert!(f.get("id").is_none(), "an answer to another request: {f}");
        }
    };
    let init = rpc(
        &mut p,
        1,
        "initialize",
        json!({"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}),
    );
    assert_eq!(init["result"]["serverInfo"]["name"], "agent-tavern");
    p.send_raw(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string());
    let tools = rpc(&mut p, 2, "tools/list", json!({}));
    assert_eq!(tools["result"]["tools"].as_array().unwrap().len(), 14);
    assert!(tools["result"]["tools"][0]["inputSchema"]["additionalProperties"] == false);
    let w = rpc(
        &mut p,
        3,
        "tools/call",
        json!({"name": "memory_write", "arguments": {"content": "MCP remembers."}}),
    );
    assert_eq!(w["result"]["isError"], false);
    let forged = rpc(
        &mut p,
        4,
        "tools/call",
        json!({"name": "memory_search", "arguments": {"query": "x", "sessionId": "other"}}),
    );
    assert_eq!(forged["result"]["isError"], true);
    assert!(forged["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("invalid-arguments"));
    let found = rpc(
        &mut p,
        5,
        "tools/call",
        json!({"name": "memory_search", "arguments": {"query": "remembers"}}),
    );
    let inner: Value =
        serde_json::from_str(found["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(inner["items"][0]["content"], "MCP remembers.");
    assert_eq!(
        found["result"]["structuredContent"], inner,
        "the result is structured, and the same as its text"
    );
    assert_eq!(rpc(&mut p, 6, "nope", json!({}))["error"]["code"], -32601);
    // An unknown tool is a protocol error, not a tool result.
    let unknown = rpc(
        &mut p,
        7,
        "tools/call",
        json!({"name": "nope", "arguments": {}}),
    );
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    // A batch is refused with -32600; the session goes on.
    p.send_raw(r#"[{"jsonrpc": "2.0", "id": 8, "method": "ping"}]"#);
    let batch = p.recv();
    assert_eq!(batch["error"]["code"], -32600, "{batch}");
    // No per-turn limit in MCP mode: 200 calls in a row are all served.
    for i in 0..200u64 {
        let r = rpc(
            &mut p,
            100 + i,
            "tools/call",
            json!({"name": "variable_list", "arguments": {}}),
        );
        assert_eq!(r["result"]["isError"], false, "call {i}: {r}");
    }
    drop(p.input);
    assert!(p.child.wait().unwrap().success());
}

fn mcp_peer(dir: &std::path::Path) -> Peer {
    mcp_peer_with(dir, &[])
}

/// [`mcp_peer`] with `extra` arguments.
fn mcp_peer_with(dir: &std::path::Path, extra: &[&str]) -> Peer {
    assets(&dir.join("assets"));
    let (data, assets) = (dir.join("data"), dir.join("assets"));
    let mut args = vec![
        "mcp",
        "--data",
        data.to_str().unwrap(),
        "--assets",
        assets.to_str().unwrap(),
        "--session",
        "mcp-1",
        "--character",
        "Mira",
        "--chat",
        "Mira - mcp",
    ];
    args.extend_from_slice(extra);
    Peer::spawn(&args)
}

/// The answer to request `id`, skipping notifications.
fn mcp_answer(p: &mut Peer, id: u64) -> Value {
    loop {
        let f = p.recv();
        if f["id"] == json!(id) {
            return f;
        }
        assert!(f.get("id").is_none(), "an answer to another request: {f}");
    }
}

/// The MCP handshake: `initialize` (answered), then `notifications/initialized`.
fn mcp_handshake(p: &mut Peer) {
    p.send_raw(INIT);
    mcp_answer(p, 1);
    p.send_raw(r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#);
}

/// Calls tool `name` with `arguments` as request `id`; its answer.
fn mcp_tool(p: &mut Peer, id: u64, name: &str, arguments: Value) -> Value {
    p.send_raw(
        &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": name, "arguments": arguments}})
        .to_string(),
    );
    mcp_answer(p, id)
}

/// #29 item 3: a folder-less setup's persona comes from `--user` and `--persona-description`
/// (the plugin's `user` and `personaDescription` settings).
#[test]
fn the_persona_of_a_folder_less_setup_comes_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Peer::spawn(&[
        "mcp",
        "--data",
        dir.path().join("data").to_str().unwrap(),
        "--user",
        "白羽",
        "--persona-description",
        "一名来自北方的旅人。",
        "--session",
        "mcp-1",
        "--character",
        "Mira",
        "--chat",
        "Mira - mcp",
    ]);
    mcp_handshake(&mut p);
    let r = mcp_tool(
        &mut p,
        2,
        "tavern_character_get",
        json!({"fields": ["persona"]}),
    );
    assert_eq!(
        r["result"]["structuredContent"]["fields"]["persona"],
        json!({"name": "白羽", "description": "一名来自北方的旅人。"}),
        "{r}"
    );
}

/// #30 F7: `--max-asset-mib` caps what is read from `--assets`: a card over it is refused by
/// name with the limit, unread.
#[test]
fn a_card_over_the_asset_limit_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    assets(&dir.path().join("assets"));
    let big = json!({"spec": "chara_card_v2", "spec_version": "2.0", "data": {"name": "Mira",
        "first_mes": "Hello.", "description": "x".repeat(2 * 1024 * 1024)}});
    std::fs::write(
        dir.path().join("assets/characters/Mira.json"),
        big.to_string(),
    )
    .unwrap();
    let (data, assets_dir) = (dir.path().join("data"), dir.path().join("assets"));
    let args = [
        "mcp",
        "--data",
        data.to_str().unwrap(),
        "--assets",
        assets_dir.to_str().unwrap(),
        "--max-asset-mib",
        "1",
        "--session",
        "mcp-1",
        "--character",
        "Mira",
        "--chat",
        "Mira - mcp",
    ];
    // A new chat of it is refused at start, naming the card and the limit (a chat made
    // without its card would have no greeting for good).
    let without_data: Vec<&str> = std::iter::once("mcp")
        .chain(args[3..].iter().copied())
        .collect();
    let refused = refused_start(dir.path(), &without_data);
    assert!(
        refused.contains(r#"--character "Mira": "#) && refused.contains("1048576"),
        "{refused}"
    );
    assert!(!refused.contains(dir.path().to_str().unwrap()), "{refused}");
    // A chat that exists is continued, and the tool names the card over the limit.
    let chats = dir.path().join("data/chats/Mira");
    std::fs::create_dir_all(&chats).unwrap();
    std::fs::write(
        chats.join("Mira - mcp.jsonl"),
        r#"{"user_name":"User","character_name":"Mira","create_date":"2024-09-19@20h03m29s","chat_metadata":{}}"#,
    )
    .unwrap();
    let mut p = Peer::spawn(&args);
    mcp_handshake(&mut p);
    let r = mcp_tool(&mut p, 2, "tavern_character_get", json!({}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("Mira") && text.contains("1048576"), "{text}");
    assert!(!text.contains(dir.path().to_str().unwrap()), "{text}");
}

const INIT: &str = r#"{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}"#;

/// #30 F15: JSON-RPC's codes for bad parameters, a notification or request before
/// `initialize` that leaves the session able to start, and lone surrogates read as the bridge
/// reads them.
#[test]
fn mcp_mode_answers_bad_messages_by_the_json_rpc_book() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = mcp_peer(dir.path());
    // Before initialize: a notification is ignored, a request refused; neither ends the server.
    p.send_raw(r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#);
    p.send_raw(r#"{"jsonrpc": "2.0", "id": 90, "method": "ping"}"#);
    let early = mcp_answer(&mut p, 90);
    assert_eq!(early["error"]["code"], -32600, "{early}");
    p.send_raw(INIT);
    let init = mcp_answer(&mut p, 1);
    assert_eq!(
        init["result"]["serverInfo"]["name"], "agent-tavern",
        "{init}"
    );
    p.send_raw(r#"{"jsonrpc": "2.0", "method": "notifications/initialized"}"#);
    for (id, params) in [
        (2, "null"),
        (3, r#"{"name": "variable_list", "arguments": [1]}"#),
    ] {
        p.send_raw(&format!(
            r#"{{"jsonrpc": "2.0", "id": {id}, "method": "tools/call", "params": {params}}}"#
        ));
        let bad = mcp_answer(&mut p, id);
        assert_eq!(bad["error"]["code"], -32602, "{params}: {bad}");
    }
    p.send_raw(
        r#"{"jsonrpc": "2.0", "id": 4, "method": "logging/setLevel", "params": {"level": "loud"}}"#,
    );
    assert_eq!(mcp_answer(&mut p, 4)["error"]["code"], -32602);
    // A lone surrogate escape (half an emoji, as JavaScript writes it) is read as U+FFFD.
    p.send_raw(r#"{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "memory_write", "arguments": {"content": "half \ud83d an emoji"}}}"#);
    let written = mcp_answer(&mut p, 5);
    assert_eq!(written["result"]["isError"], false, "{written}");
    let found = mcp_tool(&mut p, 6, "memory_search", json!({"query": "emoji"}));
    assert_eq!(
        found["result"]["structuredContent"]["items"][0]["content"],
        "half \u{fffd} an emoji"
    );
    p.close();
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// #30 F6: a client that sends and never reads is stopped being read once a bounded number of
/// answers wait, instead of growing the server (before: 189 MB after 1M pings).
#[test]
fn mcp_mode_stops_reading_a_client_that_does_not_read() {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    let dir = tempfile::tempdir().unwrap();
    let mut p = mcp_peer(dir.path());
    mcp_handshake(&mut p);
    let before = rss_kib(p.child.id());
    // From here on nothing is read. Write pings until the pipe refuses more: the server has
    // stopped reading. Before, it read (and queued an answer to) every one of them.
    let flags = fcntl_getfl(&p.input).unwrap();
    fcntl_setfl(&p.input, flags | OFlags::NONBLOCK).unwrap();
    let mut sent = 0u64;
    let refused = loop {
        let line = format!(
            "{{\"jsonrpc\": \"2.0\", \"id\": {}, \"method\": \"ping\"}}\n",
            1000 + sent
        );
        match std::io::Write::write(&mut p.input, line.as_bytes()) {
            Ok(n) if n == line.len() => sent += 1,
            // A partial line or a full pipe: the server is not keeping up, by design.
            Ok(_) => break true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
            Err(e) => panic!("{e}"),
        }
        if sent > 1_000_000 {
            break false;
        }
    };
    assert!(
        refused,
        "the server read 1,000,000 pings that nobody read the answers of"
    );
    let after = rss_kib(p.child.id());
    assert!(
        after < before + 32 * 1024,
        "the server grew from {before} KiB to {after} KiB after {sent} unread pings"
    );
    // It is still serving: reading the answers (in any order) lets it go on to the rest.
    fcntl_setfl(&p.input, flags).unwrap();
    let mut answered = std::collections::HashSet::new();
    while answered.len() < 100 {
        let f = p.recv();
        if let Some(id) = f["id"].as_u64() {
            assert_eq!(f["result"], json!({}), "{f}");
            answered.insert(id);
        }
    }
    let _ = p.child.kill();
    let _ = p.child.wait();
}

/// A bad byte, a lone surrogate, an oversized frame or a late cancel in one frame never takes
/// the bridge down or poisons what follows.
#[test]
fn hostile_frames_get_answers_and_the_session_continues() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Peer::ready(dir.path(), &["--max-frame-bytes", "2048"], &["s1", "s2"]);

    // Invalid UTF-8: an error frame for that frame, with its id.
    p.send_bytes(b"{\"id\": 7, \"method\": \"status\", \"params\": {\"x\": \"\xff\xfe\"}}");
    let bad = p.recv_reply();
    assert_eq!(
        (bad["id"].clone(), bad["error"]["code"].clone()),
        (json!(7), json!("bad-frame")),
        "{bad}"
    );

    // A frame over the limit: answered with its id, skipped, never held whole.
    let big = format!(
        r#"{{"id": 8, "method": "status", "params": {{"pad": "{}"}}}}"#,
        "x".repeat(10_000)
    );
    p.send_raw(&big);
    let refused = p.recv_reply();
    assert_eq!(refused["id"], 8);
    assert_eq!(refused["error"]["code"], "frame-too-large");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("2048"));

    // Lone surrogates (half an emoji, as Node writes it) in a request and in an event: read as
    // U+FFFD, answered with the request's id, and projection goes on.
    p.send_raw(r#"{"id": 9, "method": "tool/call", "params": {"tool": "memory_write", "args": {"content": "Kai likes \ud83d cats"}, "callId": "c-sur", "session": "s1"}}"#);
    let wrote = p.recv_reply();
    assert_eq!(wrote["id"], 9, "{wrote}");
    assert_eq!(wrote["result"]["content"], "Kai likes \u{fffd} cats");
    p.notify(
        "event",
        json!({"session": "s1", "event": ev(0, "turn/start", json!({"turn": 1}))}),
    );
    p.send_raw(r#"{"method": "event", "params": {"session": "s1", "event": {"type": "user/message", "seq": 1, "time": 1, "data": {"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": "half \ude00 emoji"}]}}}}"#);
    for (seq, ty, data) in [
        (2, "step/start", json!({"turn": 1, "step": 1})),
        (
            3,
            "assistant/message",
            json!({"turn": 1, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": "after it"}]}}),
        ),
        (4, "step/end", json!({"turn": 1, "step": 1})),
        (
            5,
            "turn/end",
            json!({"turn": 1, "reason": {"kind": "completed"}}),
        ),
    ] {
        p.notify(
            "event",
            json!({"session": "s1", "event": ev(seq, ty, data)}),
        );
    }
    // A request on the session's queue is answered after every earlier frame of the session.
    let resumed = p.call(100, "resume", json!({"session": "s1"}));
    assert_eq!(resumed["result"]["appended"], 0, "{resumed}");
    let status = p.call(10, "status", json!({}));
    assert_eq!(status["result"]["pending"], json!([]), "{status}");
    let chat = std::fs::read_to_string(dir.path().join("data/chats/Mira/Mira - s1.jsonl")).unwrap();
    assert!(
        chat.contains("half \u{fffd} emoji") && chat.contains("after it"),
        "{chat}"
    );

    // An event that cannot be read is reported in `status`, never skipped silently.
    let unreadable = p.call(
        101,
        "event",
        json!({"session": "s1", "event": {"type": "user/message", "time": 1, "data": {}}}),
    );
    assert_eq!(unreadable["error"]["code"], "projection", "{unreadable}");
    p.notify(
        "event",
        json!({"session": "s1", "event": ev(7, "turn/start", json!({"turn": 2}))}),
    );
    p.call(102, "resume", json!({"session": "s1"}));
    let status = p.call(103, "status", json!({}));
    let pending = &status["result"]["pending"][0];
    assert_eq!(pending["session"], "s1", "{status}");
    assert_eq!(pending["pendingCursor"], 6);
    assert!(
        pending["error"].as_str().unwrap().contains("without a seq"),
        "{pending}"
    );

    // A cancel that comes after its call finished is ignored; the id can be used again.
    let first = p.call(11, "tool/call", json!({"tool": "variable_set", "args": {"name": "hp", "value": 1}, "callId": "again", "session": "s1"}));
    assert_eq!(first["result"]["value"], 1);
    let late = p.call(12, "tool/cancel", json!({"callId": "again"}));
    assert_eq!(late["result"]["cancelled"], "already-finished");
    let reuse = p.call(
        13,
        "tool/call",
        json!({"tool": "variable_list", "args": {}, "callId": "again", "session": "s2"}),
    );
    assert!(reuse["result"].get("error").is_none(), "{reuse}");

    // Disposed agents are not served.
    p.call(14, "agent/disposed", json!({"agent": "s2"}));
    let gone = p.call(
        15,
        "tool/call",
        json!({"tool": "variable_list", "args": {}, "callId": "c-gone", "session": "s2"}),
    );
    assert_eq!(gone["error"]["code"], "unknown-agent");
    p.finish();
}

/// One session's slow call does not stall another session: here the slow call reads a card
/// from a FIFO that nobody writes until the other session has been answered.
#[test]
fn a_slow_session_does_not_stall_another() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Peer::ready(dir.path(), &[], &["fast"]);
    // A new chat needs its card: Slow's is there when the chat starts.
    let fifo = dir.path().join("assets/characters/Slow.json");
    let card = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/assets/Mira.card.json");
    std::fs::copy(&card, &fifo).unwrap();
    let bound = p.call(
        3,
        "chat/bind",
        json!({"session": "slow", "character": "Slow", "chatId": "Slow - 1"}),
    );
    assert!(bound.get("result").is_some(), "{bound}");
    p.call(4, "agent/created", json!({"agent": "slow"}));
    // Then the card file becomes a FIFO: reading it waits for a writer.
    std::fs::remove_file(&fifo).unwrap();
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo is needed for this test");
    p.send_raw(&json!({"id": 5, "method": "tool/call", "params": {"tool": "tavern_character_get", "args": {}, "callId": "c-slow", "session": "slow"}}).to_string());
    p.send_raw(&json!({"id": 6, "method": "tool/call", "params": {"tool": "variable_list", "args": {}, "callId": "c-fast", "session": "fast"}}).to_string());
    let first = p.recv_reply();
    assert_eq!(
        first["id"], 6,
        "the fast session is answered while the slow one waits: {first}"
    );
    // Now let the slow read finish.
    std::fs::write(&fifo, std::fs::read(&card).unwrap()).unwrap();
    let second = p.recv_reply();
    assert_eq!(second["id"], 5, "{second}");
    p.finish();
}

/// A new chat over `chat/bind` or the plugin's `character` setting (`agent/created` with a
/// binding) must find its card under `--assets`: a mistyped name was bound, for good, to a chat
/// with no card, greeting or description. Refused by name, nothing bound or written; the same
/// session then binds to the right name; a group's name is told apart.
#[test]
fn a_new_chat_of_a_character_without_a_card_is_refused_over_the_host_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Peer::ready(dir.path(), &[], &[]);
    const GROUP: &str = REAL_GROUP;
    add_real_group(&dir.path().join("assets"));
    let no_card = "no card of that name among the assets";
    for (id, method, params, said) in [
        (
            3,
            "chat/bind",
            json!({"session": "t1", "character": "mira", "chatId": "mira - 1"}),
            format!(r#"no new chat of "mira": {no_card}"#),
        ),
        (
            4,
            "agent/created",
            json!({"agent": "t1", "bind": {"character": "Mirra", "chatId": "Mirra - t1"}}),
            format!(r#"no new chat of "Mirra": {no_card}"#),
        ),
        (
            5,
            "chat/bind",
            json!({"session": "t1", "character": GROUP, "chatId": "g - 1"}),
            format!(r#"no new chat of "{GROUP}": it is a group"#),
        ),
        (
            6,
            "chat/bind",
            json!({"session": "t1", "character": "Nobody", "chatId": "n - 1", "group": true}),
            r#"no new chat of "Nobody": no group of that name"#.to_owned(),
        ),
    ] {
        let refused = p.call(id, method, params);
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&said), "{refused}");
        assert!(!message.contains(dir.path().to_str().unwrap()), "{refused}");
    }
    for name in ["mira", "Mirra", GROUP, "Nobody"] {
        assert!(!dir.path().join("data/chats").join(name).exists(), "{name}");
    }
    // Nothing was bound: the session starts the chat of the card's own name.
    let bound = p.call(
        7,
        "agent/created",
        json!({"agent": "t1", "bind": {"character": "Mira", "chatId": "Mira - t1"}}),
    );
    assert_eq!(bound["result"]["mounted"], true, "{bound}");
    // Bound already: that is what it is told, whatever the name.
    let again = p.call(
        8,
        "chat/bind",
        json!({"session": "t1", "character": "mira", "chatId": "mira - 2"}),
    );
    let message = again["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("conflict for session t1"), "{again}");
    // A group's chat by its group's name.
    let group = p.call(
        9,
        "chat/bind",
        json!({"session": "g1", "character": GROUP, "chatId": "g - 1", "group": true}),
    );
    assert!(group.get("result").is_some(), "{group}");
    // A chat that exists is continued though its card is gone.
    let card = dir.path().join("assets/characters/Gone.json");
    std::fs::copy(dir.path().join("assets/characters/Mira.json"), &card).unwrap();
    let first = p.call(
        10,
        "chat/bind",
        json!({"session": "c1", "character": "Gone", "chatId": "Gone - 1"}),
    );
    assert!(first.get("result").is_some(), "{first}");
    std::fs::remove_file(&card).unwrap();
    let later = p.call(
        11,
        "chat/bind",
        json!({"session": "c2", "character": "Gone", "chatId": "Gone - 1"}),
    );
    assert!(later.get("result").is_some(), "{later}");
    let new = p.call(
        12,
        "chat/bind",
        json!({"session": "c3", "character": "Gone", "chatId": "Gone - 2"}),
    );
    assert!(new.get("error").is_some(), "{new}");
    p.finish();
}

/// A SillyTavern user continues their own chat from the host (#29): the bridge binds the
/// session to the existing chat (nothing written at binding: no greeting, no header), writes
/// the turn into the user's folder where SillyTavern keeps it, and a mistyped chat id is an
/// error naming the nearest chat, never a new chat.
#[test]
fn a_session_continues_an_existing_sillytavern_chat_in_the_users_folder() {
    const CHAT: &str = "Seraphina - 2024-09-19@20h03m29s";
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures");
    let st = dir.path().join("SillyTavern/data/default-user");
    std::fs::create_dir_all(st.join("characters")).unwrap();
    std::fs::create_dir_all(st.join("chats/default_Seraphina")).unwrap();
    std::fs::copy(
        fixtures.join("user-folder/characters/default_Seraphina.png"),
        st.join("characters/default_Seraphina.png"),
    )
    .unwrap();
    let file = st.join(format!("chats/default_Seraphina/{CHAT}.jsonl"));
    let original = std::fs::read(fixtures.join(format!("chats/{CHAT}.jsonl"))).unwrap();
    std::fs::write(&file, &original).unwrap();
    let data = dir.path().join("data");
    let mut p = Peer::spawn(&[
        "--data",
        data.to_str().unwrap(),
        "--assets",
        st.to_str().unwrap(),
        "--chat-folder",
        st.to_str().unwrap(),
    ]);
    p.call(1, "handshake", json!({"protocol": 1}));

    let typo = p.call(
        2,
        "agent/created",
        json!({"agent": "s0", "bind": {"character": "default_Seraphina", "chatId": "Seraphina - 2024-09-19@20h03m29", "existing": true}}),
    );
    let message = typo["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no chat") && message.contains(&format!("nearest: {CHAT}")),
        "{typo}"
    );
    let bound = p.call(
        3,
        "agent/created",
        json!({"agent": "s1", "bind": {"character": "default_Seraphina", "chatId": CHAT, "existing": true}}),
    );
    assert_eq!(bound["result"]["mounted"], true, "{bound}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        original,
        "binding writes nothing into a continued chat"
    );

    // The model reads the chat's own history.
    let history = p.call(
        4,
        "tool/call",
        json!({"tool": "tavern_history_search", "args": {"query": ""}, "callId": "c1", "session": "s1"}),
    );
    let last: Value = serde_json::from_str(
        std::str::from_utf8(&original)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    let head: String = last["mes"].as_str().unwrap().chars().take(40).collect();
    assert!(
        history["result"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["text"].as_str().unwrap().contains(&head)),
        "{history}"
    );

    let turn = [
        ev(0, "turn/start", json!({"turn": 1})),
        ev(1, "step/start", json!({"turn": 1, "step": 1})),
        ev(
            2,
            "user/message",
            json!({"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": "我从村子回来了。"}]}),
        ),
        ev(
            3,
            "assistant/message",
            json!({"turn": 1, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": "Welcome back to the glade."}]}}),
        ),
        ev(4, "step/end", json!({"turn": 1, "step": 1})),
        ev(
            5,
            "turn/end",
            json!({"turn": 1, "reason": {"kind": "completed"}}),
        ),
    ];
    for e in &turn {
        p.notify("event", json!({"session": "s1", "event": e}));
    }
    p.notify("agent/status", json!({"agent": "s1", "status": "idle"}));
    assert_eq!(
        p.call(5, "status", json!({}))["result"]["pending"],
        json!([])
    );
    p.finish();

    let text = std::fs::read(&file).unwrap();
    assert!(
        text.starts_with(&original),
        "every byte the chat had is kept"
    );
    let added: Vec<Value> = std::str::from_utf8(&text[original.len()..])
        .unwrap()
        .strip_prefix('\n')
        .unwrap()
        .split('\n')
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(added.len(), 2, "{added:?}");
    assert_eq!(added[0]["is_user"], true);
    assert_eq!(added[0]["mes"], "我从村子回来了。");
    assert_eq!(added[1]["mes"], "Welcome back to the glade.");
    assert_eq!(
        added[1]["name"], last["name"],
        "the reply is the character's"
    );
    assert!(
        !data.join("chats").read_dir().unwrap().any(|_| true),
        "no chat under --data"
    );
    assert!(
        !st.join("chats/default_Seraphina/Seraphina - 2024-09-19@20h03m29.jsonl")
            .exists(),
        "a mistyped chat id creates nothing"
    );
}

/// `{{time}}` shows the user's local time: `--utc-offset local` (the default) follows the
/// system's zone (`TZ`), a fixed offset overrides it, and a bad value is refused at start.
#[test]
fn time_macros_follow_the_users_zone() {
    let dir = tempfile::tempdir().unwrap();
    let assets_dir = dir.path().join("assets");
    std::fs::create_dir_all(assets_dir.join("characters")).unwrap();
    let card = json!({"spec": "chara_card_v2", "spec_version": "2.0",
        "data": {"name": "Mira", "description": "", "scenario": "{{time}}"}});
    std::fs::write(assets_dir.join("characters/Mira.json"), card.to_string()).unwrap();
    // The minutes past midnight `{{time}}` shows, for a bridge in `tz` with `extra` flags.
    let shown = |n: usize, tz: &str, extra: &[&str]| -> i64 {
        let data = dir.path().join(format!("data-{n}"));
        let mut args = vec![
            "--data",
            data.to_str().unwrap(),
            "--assets",
            assets_dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut child = Command::new(BRIDGE)
            .args(&args)
            .env("TZ", tz)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut p = Peer {
            input: child.stdin.take().unwrap(),
            output: BufReader::new(child.stdout.take().unwrap()),
            child,
        };
        p.call(1, "handshake", json!({"protocol": 1}));
        p.call(
            2,
            "agent/created",
            json!({"agent": "s1", "bind": {"character": "Mira", "chatId": "Mira - 1"}}),
        );
        let got = p.call(
            3,
            "tool/call",
            json!({"tool": "tavern_character_get", "args": {"fields": ["scenario"]}, "callId": "c1", "session": "s1"}),
        );
        p.finish();
        let text = got["result"]["fields"]["scenario"]
            .as_str()
            .unwrap()
            .to_owned();
        let (clock, half) = text.split_once(' ').unwrap();
        let (h, m) = clock.split_once(':').unwrap();
        let h: i64 = h.parse::<i64>().unwrap() % 12 + if half == "PM" { 12 } else { 0 };
        h * 60 + m.parse::<i64>().unwrap()
    };
    let apart = |a: i64, b: i64| (b - a).rem_euclid(24 * 60);
    let utc = shown(1, "UTC", &[]);
    // Kathmandu is UTC+5:45 all year; a minute may turn between the two bridges.
    let kathmandu = shown(2, "Asia/Kathmandu", &[]);
    assert!(
        matches!(apart(utc, kathmandu), 345 | 346),
        "{utc} vs {kathmandu}"
    );
    let fixed = shown(3, "Asia/Kathmandu", &["--utc-offset", "-03:00"]);
    assert!(matches!(apart(fixed, utc), 180 | 181), "{utc} vs {fixed}");

    let bad = Command::new(BRIDGE)
        .args([
            "--data",
            dir.path().join("d").to_str().unwrap(),
            "--utc-offset",
            "Mars/Olympus",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--utc-offset \"Mars/Olympus\""), "{err}");
}

/// The panel's store page inside DSH: the bridge serving `--data` checks that file store
/// (read-only) and names a damaged line by its store-relative file, never an absolute path.
#[test]
fn the_panels_store_check_runs_in_the_bridge_and_names_damage() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut p = Peer::spawn(&["--data", data.to_str().unwrap()]);
    let hello = p.call(1, "handshake", json!({"protocol": 1}));
    assert!(hello.get("result").is_some(), "{hello}");
    let check = |p: &mut Peer, id: u64| {
        let r = p.call(
            id,
            "api/request",
            json!({"method": "GET", "path": "/api/v1/store/check"}),
        )["result"]
            .clone();
        let body: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
        (r["status"].as_u64().unwrap(), body)
    };
    let (status, whole) = check(&mut p, 2);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["ok"], true, "{whole}");
    // A bit flipped in a logged memory (a bad disk): the check finds the line.
    let log = data.join("memory.log");
    let line = "0123456789abcdef {\"put\":{}}\n";
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .unwrap()
        .write_all(line.as_bytes())
        .unwrap();
    let (status, damaged) = check(&mut p, 3);
    assert_eq!(status, 200, "{damaged}");
    assert_eq!(damaged["ok"], false, "{damaged}");
    let file = damaged["problems"][0]["file"].as_str().unwrap();
    assert!(file.starts_with("memory.log line"), "{damaged}");
    assert!(
        !damaged.to_string().contains(dir.path().to_str().unwrap()),
        "no absolute path: {damaged}"
    );
    assert_eq!(p.call(4, "shutdown", json!({}))["result"]["ok"], true);
    assert!(p.child.wait().unwrap().success());
}

/// A bridge on a large store must answer the host's handshake at once: the memory log (seconds
/// at a million records) is read on a thread of its own. Here another process holds the log's
/// lock, so reading it cannot finish: the handshake, the binding and a variable call are
/// answered anyway, a memory search waits, and once the lock is let go it finds the record.
#[test]
fn the_handshake_does_not_wait_for_the_memory_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Peer::ready(dir.path(), &[], &["s1"]);
    let wrote = p.call(3, "tool/call", json!({"tool": "memory_write", "args": {"content": "The traveler is Kai."}, "callId": "c1", "session": "s1"}));
    assert_eq!(wrote["result"]["deduplicated"], false, "{wrote}");
    p.finish();

    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path().join("data/memory.log.lock"))
        .unwrap();
    lock.lock().unwrap();
    // If the bridge waited for the log, nothing below would be answered: fail instead of
    // hanging (the watchdog ends the bridge, so the next read sees its output closed).
    let (done, watchdog) = std::sync::mpsc::channel::<()>();
    let mut p = Peer::ready_with_watchdog(dir.path(), watchdog);
    p.send_raw(&json!({"id": 10, "method": "tool/call", "params": {"tool": "memory_search", "args": {"query": "Kai"}, "callId": "c2", "session": "s1"}}).to_string());
    // Another session's call (a session's frames are served in order) is answered while the
    // search waits: `call` fails on any other reply first.
    let set = p.call(11, "tool/call", json!({"tool": "variable_set", "args": {"name": "x", "value": 1}, "callId": "c3", "session": "s2"}));
    assert!(set["result"]["revision"].is_string(), "{set}");
    drop(lock);
    let found = p.recv_reply();
    assert_eq!(found["id"], 10, "{found}");
    assert_eq!(
        found["result"]["items"][0]["content"],
        "The traveler is Kai."
    );
    p.finish();
    drop(done);
}

impl Peer {
    /// [`Peer::ready`] on the data a previous bridge left in `dir` (agents `s1`, `s2`), with
    /// the bridge killed if
    /// `watchdog` is neither dropped nor sent to within two minutes.
    fn ready_with_watchdog(dir: &Path, watchdog: std::sync::mpsc::Receiver<()>) -> Self {
        let p = Self::spawn(&[
            "--data",
            dir.join("data").to_str().unwrap(),
            "--assets",
            dir.join("assets").to_str().unwrap(),
        ]);
        let pid = p.child.id().to_string();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                watchdog.recv_timeout(std::time::Duration::from_secs(120))
            {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
        });
        let mut p = p;
        assert_eq!(
            p.call(1, "handshake", json!({"protocol": 1}))["result"]["protocol"],
            1
        );
        for a in ["s1", "s2"] {
            let bound = p.call(
                2,
                "agent/created",
                json!({"agent": a, "bind": {"character": "Mira", "chatId": format!("Mira - {a}")}}),
            );
            assert_eq!(bound["result"]["mounted"], true, "{bound}");
        }
        p
    }
}

/// Word vectors for the tests below: cameras on one axis, furniture on the other.
const VECTORS: &str = "\
camera 1.0 0.05 0.1
photography 0.95 0.0 0.15
flash 0.9 0.1 0.0
lens 0.97 0.0 0.1
table 0.05 1.0 0.0
desk 0.1 0.95 0.1
dinner 0.0 0.8 0.3
";

/// The memories a search for "accessories for my photography setup" ranks, through a bridge
/// started with `extra` arguments: their contents in the order found.
fn photography_search(extra: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let vectors = dir.path().join("vectors.txt");
    std::fs::write(&vectors, VECTORS).unwrap();
    let extra: Vec<&str> = extra
        .iter()
        .map(|a| {
            if *a == "VECTORS" {
                vectors.to_str().unwrap()
            } else {
                a
            }
        })
        .collect();
    let mut p = mcp_peer_with(dir.path(), &extra);
    mcp_handshake(&mut p);
    // Each shares one word with the query and is as long as the others: lexically they tie,
    // and the newest comes first.
    let memories = [
        "My camera setup needs a brighter flash lens.",
        "My dinner party setup needs a bigger table.",
        "My home office setup needs a standing desk.",
    ];
    for (i, m) in memories.iter().enumerate() {
        let id = 2 + i as u64;
        p.send_raw(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "memory_write", "arguments": {"content": m}}})
            .to_string(),
        );
        assert_eq!(mcp_answer(&mut p, id)["result"]["isError"], false);
    }
    p.send_raw(
        &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "memory_search",
            "arguments": {"query": "Any accessories for my photography setup?"}}})
        .to_string(),
    );
    let found = mcp_answer(&mut p, 9);
    drop(p.input);
    assert!(p.child.wait().unwrap().success());
    found["result"]["structuredContent"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["content"].as_str().unwrap().to_owned())
        .collect()
}

/// #34: `--word-vectors` ranks by meaning as well as words, through the same seam memory,
/// history and lore search share.
#[test]
fn word_vectors_rank_what_the_query_means_first() {
    // Lexically the three tie on words and the newest comes first; written within one
    // millisecond their generated ids break the tie, so only the sets are compared.
    let lexical = photography_search(&[]);
    assert_eq!(lexical.len(), 3, "{lexical:?}");
    let by_meaning = photography_search(&["--word-vectors", "VECTORS"]);
    assert!(by_meaning[0].contains("camera"), "{by_meaning:?}");
    let weightless = photography_search(&["--word-vectors", "VECTORS", "--vector-weight", "0"]);
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(sorted(weightless), sorted(lexical));
}

/// The bridge started on a store under `dir` with `args`, which it must refuse: its stderr.
fn refused_start(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(BRIDGE)
        .args(["--data", dir.join("data").to_str().unwrap()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8(out.stderr).unwrap()
}

#[path = "../../tavern-search/tests/support/sentence_model.rs"]
mod sentence_model;

/// #34: `--sentence-encoder` ranks by what whole sentences mean, with the real
/// all-MiniLM-L6-v2, encoding outside the store's locks; its mistakes stop the bridge with one
/// line naming them.
#[test]
fn a_sentence_encoder_ranks_what_the_query_means_first() {
    let model = sentence_model::sentence_model_dir();
    let model = model.to_str().unwrap();
    let by_meaning = photography_search(&["--sentence-encoder", model]);
    assert!(by_meaning[0].contains("camera"), "{by_meaning:?}");
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let weightless = photography_search(&["--sentence-encoder", model, "--vector-weight", "0"]);
    assert_eq!(sorted(weightless), sorted(by_meaning));

    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| refused_start(dir.path(), args);
    let empty = dir.path().join("no-model-here");
    std::fs::create_dir(&empty).unwrap();
    let err = run(&["--sentence-encoder", empty.to_str().unwrap()]);
    assert!(
        err.contains("--sentence-encoder")
            && err.contains("no-model-here")
            && err.contains("config.json"),
        "{err}"
    );
    // A model that reads but computes nothing (its weights overwritten past the header):
    // refused at start, not a silent fall back to words.
    let damaged = dir.path().join("damaged-model");
    std::fs::create_dir(&damaged).unwrap();
    for file in std::fs::read_dir(model).unwrap() {
        let file = file.unwrap().path();
        if file.is_file() {
            std::fs::copy(&file, damaged.join(file.file_name().unwrap())).unwrap();
        }
    }
    let weights = damaged.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[header..].fill(0xff);
    std::fs::write(&weights, bytes).unwrap();
    let err = run(&["--sentence-encoder", damaged.to_str().unwrap()]);
    assert!(
        err.contains("damaged-model: the model gives no usable vector"),
        "{err}"
    );
    assert!(!err.contains("sentence encoder failed"), "said once: {err}");
    let both = run(&["--sentence-encoder", model, "--word-vectors", "v.txt"]);
    assert!(
        both.contains("--word-vectors") && both.contains("--sentence-encoder"),
        "{both}"
    );
    let alone = run(&["--vector-weight", "0.5"]);
    assert!(
        alone.contains("--vector-weight 0.5: it needs --word-vectors or --sentence-encoder"),
        "{alone}"
    );
}

#[test]
fn bad_word_vectors_stop_the_bridge_with_one_line_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "camera 1 0\nlens 1\n").unwrap();
    let run = |args: &[&str]| refused_start(dir.path(), args);
    let err = run(&["--word-vectors", bad.to_str().unwrap()]);
    assert!(
        err.contains("--word-vectors")
            && err.contains("word vectors line 2: 1 numbers where the first vector has 2"),
        "{err}"
    );
    let missing = run(&["--word-vectors", "no-such-vectors.txt"]);
    assert!(
        missing.contains("no-such-vectors.txt") && missing.contains("cannot be read"),
        "{missing}"
    );
    let good = dir.path().join("good.txt");
    std::fs::write(&good, VECTORS).unwrap();
    let good = good.to_str().unwrap();
    let flag = format!("--word-vectors={good}");
    for (args, refused) in [
        (
            vec!["--word-vectors", good, "--vector-weight", "2"],
            "--vector-weight 2",
        ),
        // As the DSH plugin passes it: a negative weight rides in its flag.
        (
            vec![flag.as_str(), "--vector-weight=-0.2"],
            "--vector-weight -0.2",
        ),
        // As a person types it: the negative number is the flag's value, not another flag.
        (
            vec!["--word-vectors", good, "--vector-weight", "-0.2"],
            "--vector-weight -0.2",
        ),
    ] {
        let err = run(&args);
        assert!(
            err.contains(&format!("{refused}: must be within 0 and 0.95")),
            "{args:?}: {err}"
        );
    }
}

/// `mcp --session` alone used to start and then answer every memory, variable and tavern call
/// with "not bound to a tavern chat" (nothing over MCP can bind it); and a session bound to
/// one chat served it even when another was named. Both are refused at start, by name; a
/// session bound by an earlier start is served without naming its chat again.
#[test]
fn an_mcp_session_must_be_bound_to_the_chat_it_names() {
    let dir = tempfile::tempdir().unwrap();
    assets(&dir.path().join("assets"));
    let assets_dir = dir.path().join("assets");
    let assets_dir = assets_dir.to_str().unwrap();
    // A file where the data folder should be is named as such.
    std::fs::write(dir.path().join("data-file"), "x").unwrap();
    let file = Command::new(BRIDGE)
        .args(["--data", dir.path().join("data-file").to_str().unwrap()])
        .args(["mcp", "--session", "mcp-1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!file.status.success());
    let said = String::from_utf8(file.stderr).unwrap();
    assert!(said.contains("data-file: not a directory"), "{said}");
    let unbound = refused_start(dir.path(), &["mcp", "--session", "mcp-1"]);
    assert!(
        unbound.contains("--session mcp-1 is not bound to a chat yet")
            && unbound.contains("--character NAME --chat ID"),
        "{unbound}"
    );
    assert_eq!(unbound.matches("not bound").count(), 1, "{unbound}");

    // Bound by a start that names the chat, and a memory written there…
    let mut p = mcp_peer(dir.path());
    mcp_handshake(&mut p);
    let wrote = mcp_tool(
        &mut p,
        2,
        "memory_write",
        json!({"content": "Mira keeps a brass compass.", "kind": "semantic"}),
    );
    assert!(
        wrote["result"]["structuredContent"]["error"].is_null(),
        "{wrote}"
    );
    p.close();

    // …another chat under the same session is refused, naming both.
    let other = refused_start(
        dir.path(),
        &[
            "mcp",
            "--assets",
            assets_dir,
            "--session",
            "mcp-1",
            "--character",
            "Mira",
            "--chat",
            "Mira - elsewhere",
        ],
    );
    assert!(
        other.contains(r#"--session mcp-1 is bound to chat "Mira - mcp" of "Mira", not "Mira - elsewhere" of "Mira": leave out --character and --chat"#),
        "{other}"
    );

    // The session alone now serves its chat: the memory is found.
    let data = dir.path().join("data");
    let mut p = Peer::spawn(&[
        "mcp",
        "--data",
        data.to_str().unwrap(),
        "--assets",
        assets_dir,
        "--session",
        "mcp-1",
    ]);
    mcp_handshake(&mut p);
    let found = mcp_tool(&mut p, 2, "memory_search", json!({"query": "compass"}));
    assert!(found.to_string().contains("brass compass"), "{found}");
    p.close();

    // A store whose new sessions default to `st` (SillyTavern's pipeline, which MCP does not
    // have): the session MCP binds is agent-tavern all the same, so its tools work; a session
    // bound as `st` elsewhere is refused by name.
    let store =
        tavern_store::fs::FsStore::open(&data, std::sync::Arc::new(tavern_store::SystemClock))
            .unwrap();
    let st_target = tavern_core::BindingTarget {
        character: tavern_core::CharacterName::parse("Mira").unwrap(),
        chat_id: tavern_core::ChatId::parse("Mira - st").unwrap(),
        group: false,
    };
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(tavern_store::StateStoreExt::update(
            &store,
            |s: &mut tavern_core::TavernState| {
                s.default_architecture = tavern_core::TavernArchitecture::St;
                s.set_binding(
                    tavern_core::SessionId::parse("st-1").unwrap(),
                    tavern_core::SessionBinding::St {
                        target: st_target.clone(),
                    },
                );
                Ok::<(), tavern_store::StoreError>(())
            },
        ))
        .unwrap();
    drop(store);
    // A character --assets has no card of: refused before anything is bound (a typo, or the
    // name a card shows instead of its file's), and so is a group (a real SillyTavern one).
    add_real_group(&dir.path().join("assets"));
    for (character, said) in [
        (
            "mira",
            r#"--character "mira": no card of that name under --assets"#,
        ),
        (
            REAL_GROUP,
            r#"--character "ZzGroup: Conversational Real Life" is a group"#,
        ),
    ] {
        let refused = refused_start(
            dir.path(),
            &[
                "mcp",
                "--assets",
                assets_dir,
                "--session",
                "typo-1",
                "--character",
                character,
                "--chat",
                "x - 1",
            ],
        );
        assert!(refused.contains(said), "{refused}");
        assert!(!data.join("chats").join(character).exists(), "{character}");
    }
    // A chat that exists is the player's to continue, even when its card cannot be read.
    std::fs::write(
        dir.path().join("assets/characters/Broken.json"),
        "{not json",
    )
    .unwrap();
    // `mcp` for session broken-1 with Broken's chat `chat`.
    let broken = |chat: &'static str| {
        [
            "mcp",
            "--assets",
            assets_dir,
            "--session",
            "broken-1",
            "--character",
            "Broken",
            "--chat",
            chat,
        ]
    };
    let broken_new = refused_start(dir.path(), &broken("Broken - new"));
    assert!(
        broken_new.contains(r#"--character "Broken": "#),
        "{broken_new}"
    );
    std::fs::create_dir_all(data.join("chats/Broken")).unwrap();
    let old_chat = data.join("chats/Broken/Broken - old.jsonl");
    let header = r#"{"user_name":"User","character_name":"Broken","create_date":"2024-09-19@20h03m29s","chat_metadata":{}}"#;
    std::fs::write(&old_chat, header).unwrap();
    let mut args = vec!["--data", data.to_str().unwrap()];
    args.extend_from_slice(&broken("Broken - old"));
    let mut p = Peer::spawn(&args);
    mcp_handshake(&mut p);
    p.close();
    assert_eq!(
        std::fs::read_to_string(&old_chat).unwrap(),
        header,
        "continued as it was"
    );
    let st = refused_start(
        dir.path(),
        &["mcp", "--assets", assets_dir, "--session", "st-1"],
    );
    assert!(
        st.contains(r#"--session st-1 is bound to chat "Mira - st" of "Mira" as a SillyTavern (st) session, which MCP cannot serve"#),
        "{st}"
    );
    let mut p = Peer::spawn(&[
        "mcp",
        "--data",
        data.to_str().unwrap(),
        "--assets",
        assets_dir,
        "--session",
        "mcp-2",
        "--character",
        "Mira",
        "--chat",
        "Mira - mcp 2",
    ]);
    mcp_handshake(&mut p);
    let set = mcp_tool(
        &mut p,
        2,
        "variable_set",
        json!({"name": "mood", "value": 1}),
    );
    assert!(
        set["result"]["structuredContent"]["error"].is_null(),
        "{set}"
    );
}

/// Problems the store finds while the bridge serves are logged as they come, not only at open:
/// here every record of the memory image was changed on disk after the image was saved, so the
/// first memory search finds a record unlike its image, answers from the log (read again) and
/// the bridge says so on stderr — naming `memory.image`, never the data directory — while it
/// serves, and at exit when the session's last call found it.
#[test]
fn problems_the_store_finds_while_serving_are_logged() {
    use std::sync::Arc;
    use tavern_store::fs::FsStore;
    use tavern_store::SystemClock;

    let dir = tempfile::tempdir().unwrap();
    let mut p = Peer::ready(dir.path(), &[], &["s1"]);
    // Fewer than a turn's writing calls may be.
    for i in 0..12u64 {
        let wrote = p.call(
            3 + i,
            "tool/call",
            json!({"tool": "memory_write", "args": {"content": format!("A lantern by the river {i}.")},
                "callId": format!("c{i}"), "session": "s1"}),
        );
        assert_eq!(wrote["result"]["deduplicated"], false, "{wrote}");
    }
    p.finish();
    let data = dir.path().join("data");
    let store = FsStore::open(&data, Arc::new(SystemClock)).unwrap();
    assert!(store.save_memory_image().unwrap());
    drop(store);
    // The records lie after the part an open reads: every one of them, changed.
    let image = data.join("memory.image");
    let changed = tavern_store::fs::change_unread_part(&image, b"lantern", b"lanterm").unwrap();
    assert_eq!(changed, 12);

    // While serving: the line comes before the bridge is asked to stop.
    let (mut p, lines) = bridge_with_stderr(&data, &dir.path().join("assets"));
    search_lanterns(&mut p);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let warning = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains("memory.image") && line.contains("read again") => break line,
            Ok(_) => continue,
            Err(e) => panic!("no warning of the changed image while serving ({e})"),
        }
    };
    assert!(
        !warning.contains(dir.path().to_str().unwrap()),
        "no absolute path: {warning}"
    );
    p.finish();
    // Found by the session's last call, just before it ends: said before the bridge exits.
    let (mut p, lines) = bridge_with_stderr(&data, &dir.path().join("assets"));
    search_lanterns(&mut p);
    p.finish();
    let said: Vec<String> = lines.iter().collect();
    assert!(
        said.iter()
            .any(|l| l.contains("memory.image") && l.contains("read again")),
        "{said:?}"
    );
}

/// A bridge on `data` and `assets`, handshaken with agent `s1` bound to a chat of Mira, and
/// the lines of its stderr as they come (the channel ends when the bridge exits).
fn bridge_with_stderr(data: &Path, assets: &Path) -> (Peer, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(BRIDGE)
        .args(["--data", data.to_str().unwrap()])
        .args(["--assets", assets.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (said, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if said.send(line).is_err() {
                break;
            }
        }
    });
    let input = child.stdin.take().unwrap();
    let output = BufReader::new(child.stdout.take().unwrap());
    let mut p = Peer {
        child,
        input,
        output,
    };
    assert_eq!(
        p.call(1, "handshake", json!({"protocol": 1}))["result"]["protocol"],
        1
    );
    let bound = p.call(
        2,
        "agent/created",
        json!({"agent": "s1", "bind": {"character": "Mira", "chatId": "Mira - s1"}}),
    );
    assert_eq!(bound["result"]["mounted"], true, "{bound}");
    (p, lines)
}

/// Searches session `s1`'s memories for the lanterns: found as the log says them.
fn search_lanterns(p: &mut Peer) {
    let found = p.call(
        3,
        "tool/call",
        json!({"tool": "memory_search", "args": {"query": "lantern river"}, "callId": "s", "session": "s1"}),
    );
    let items = found["result"]["items"].as_array().unwrap();
    assert!(!items.is_empty(), "{found}");
    assert!(
        items
            .iter()
            .all(|i| i["content"].as_str().unwrap().contains("lantern")),
        "answered as the log says: {found}"
    );
}
