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
}

fn assets(dir: &Path) {
    std::fs::create_dir_all(dir.join("characters")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/assets/Mira.card.json"),
        dir.join("characters/Mira.json"),
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

    p.notify("tool/cancel", json!({"callId": "c6"}));
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
    assets(&dir.path().join("assets"));
    let data = dir.path().join("data");
    let mut p = Peer::spawn(&[
        "mcp",
        "--data",
        data.to_str().unwrap(),
        "--assets",
        dir.path().join("assets").to_str().unwrap(),
        "--session",
        "mcp-1",
        "--character",
        "Mira",
        "--chat",
        "Mira - mcp",
    ]);
    let rpc = |p: &mut Peer, id: u64, method: &str, params: Value| {
        p.send_raw(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        p.recv()
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
    assert_eq!(rpc(&mut p, 6, "nope", json!({}))["error"]["code"], -32601);
    drop(p.input);
    assert!(p.child.wait().unwrap().success());
}
