//! Reliability figures of the real `tavern-bridge` process (see `docs/RELIABILITY.md`): resident
//! memory over a long soak of frames for many sessions, round-trip latency with 1 and with
//! 3,000 bound sessions, and crash rounds (SIGKILL mid-write, then every acknowledged write is
//! found). Drives the executable next to this one over pipes, as a host does.
//!
//! First, in process (to count fsyncs), DSH-realistic turns as the plugin forwards them — 300
//! `assistant/chunk` events, a tool call and the final message — and prompt requests with a
//! PNG card, for the checkpoint saved per event (the behaviour before #28) beside the
//! checkpoint saved per turn, in the same run (`docs/PERFORMANCE.md`).
//!
//! `--big-store N --pg SETTINGS` (an empty database) times a bridge on PostgreSQL holding N
//! memories: handshake and first memory search, without and with the memory image.
//! With `--pg SETTINGS` (a database on a server started with
//! `-c shared_preload_libraries=pg_stat_statements`), the same turns run on PgStore instead and
//! the table counts the SQL statements PgStore sends per event (from `pg_stat_statements`: an
//! upper bound on its round trips, since pipelined statements share one), then stops.
//!
//! `--hostile-lore` runs only the table of 20 lore searches on exponential keys beside
//! `status`, `--big-assets` only the table of the largest world and card the defaults take
//! (`docs/RELIABILITY.md`).
//!
//! `cargo run --release -p tavern-dsh-adapter --features bench --bin bridge-bench`

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

type Error = Box<dyn std::error::Error>;

struct Peer {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next_id: u64,
}

impl Peer {
    fn spawn(bridge: &Path, data: &Path) -> Result<Self, Error> {
        Self::spawn_with(bridge, &["--data".as_ref(), data.as_os_str()])
    }

    fn spawn_with(bridge: &Path, args: &[&std::ffi::OsStr]) -> Result<Self, Error> {
        let mut child = Command::new(bridge)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let input = child.stdin.take().ok_or("no stdin")?;
        let output = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut p = Self {
            child,
            input,
            output,
            next_id: 1,
        };
        p.call("handshake", json!({"protocol": 1}))?;
        Ok(p)
    }

    fn send(&mut self, frame: &Value) -> Result<(), Error> {
        writeln!(self.input, "{frame}")?;
        Ok(())
    }

    fn call(&mut self, method: &str, params: Value) -> Result<Value, Error> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"id": id, "method": method, "params": params}))?;
        self.input.flush()?;
        loop {
            let mut line = String::new();
            if self.output.read_line(&mut line)? == 0 {
                return Err("the bridge closed its output".into());
            }
            let v: Value = serde_json::from_str(&line)?;
            if v["id"] == json!(id) {
                return Ok(v);
            }
        }
    }

    fn rss_kib(&self) -> Result<u64, Error> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .ok_or("no VmRSS")?;
        Ok(line.split_whitespace().nth(1).ok_or("bad VmRSS")?.parse()?)
    }

    fn close(mut self) -> Result<(), Error> {
        self.call("shutdown", json!({}))?;
        self.child.wait()?;
        Ok(())
    }
}

/// Starts a new turn of `session` (tool calls and writes are limited per turn): `turn/end` of
/// the current one, `turn/start` of the next, as the host logs them.
fn next_turn(p: &mut Peer, session: &str, seq: &mut u64, turn: &mut u64) -> Result<(), Error> {
    if *turn > 0 {
        p.send(&json!({"method": "event", "params": {"session": session, "event": {"type": "turn/end", "seq": *seq, "time": 1, "data": {"turn": *turn, "reason": {"kind": "completed"}}}}}))?;
        *seq += 1;
    }
    *turn += 1;
    p.send(&json!({"method": "event", "params": {"session": session, "event": {"type": "turn/start", "seq": *seq, "time": 1, "data": {"turn": *turn}}}}))?;
    *seq += 1;
    Ok(())
}

fn bind(p: &mut Peer, session: &str) -> Result<(), Error> {
    let r = p.call(
        "agent/created",
        json!({"agent": session, "bind": {"character": "Mira", "chatId": format!("Mira - {session}")}}),
    )?;
    if r["result"]["mounted"] != json!(true) {
        return Err(format!("{session} not mounted: {r}").into());
    }
    Ok(())
}

fn event(seq: u64, turn: u64, n: u64) -> Value {
    match seq % 6 {
        0 => json!({"type": "turn/start", "seq": seq, "time": 1, "data": {"turn": turn}}),
        1 => {
            json!({"type": "user/message", "seq": seq, "time": 1, "data": {"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": format!("message {n}")}]}})
        }
        2 => {
            json!({"type": "step/start", "seq": seq, "time": 1, "data": {"turn": turn, "step": 1}})
        }
        3 => {
            json!({"type": "assistant/message", "seq": seq, "time": 1, "data": {"turn": turn, "step": 1, "message": {"role": "assistant", "content": [{"type": "text", "text": format!("reply {n}")}]}}})
        }
        4 => json!({"type": "step/end", "seq": seq, "time": 1, "data": {"turn": turn, "step": 1}}),
        _ => {
            json!({"type": "turn/end", "seq": seq, "time": 1, "data": {"turn": turn, "reason": {"kind": "completed"}}})
        }
    }
}

/// 100,000 frames over 1,000 sessions (100 bound, 900 never bound): events, tool calls,
/// cancels for unknown calls, disposals. Returns RSS samples `(frames, KiB)`.
fn soak(bridge: &Path, dir: &Path) -> Result<Vec<(u64, u64)>, Error> {
    let mut p = Peer::spawn(bridge, &dir.join("soak"))?;
    for s in 0..100 {
        bind(&mut p, &format!("b{s}"))?;
    }
    let mut samples = vec![(0, p.rss_kib()?)];
    let mut seqs = vec![0u64; 1000];
    for n in 0..100_000u64 {
        let s = (n % 1000) as usize;
        let session = if s < 100 {
            format!("b{s}")
        } else {
            format!("u{s}")
        };
        let frame = match n % 10 {
            9 if s < 100 => {
                json!({"id": n + 10, "method": "tool/call", "params": {"tool": "variable_list", "args": {}, "callId": format!("c{n}"), "session": session}})
            }
            8 => json!({"method": "tool/cancel", "params": {"callId": format!("never-{n}")}}),
            _ => {
                let seq = seqs[s];
                seqs[s] += 1;
                json!({"method": "event", "params": {"session": session, "event": event(seq, seq / 6 + 1, n)}})
            }
        };
        p.send(&frame)?;
        if (n + 1) % 10_000 == 0 {
            // A request answered after everything before it is queued: then measure.
            p.call("status", json!({}))?;
            for s in 0..100 {
                p.call("resume", json!({"session": format!("b{s}")}))?;
            }
            samples.push((n + 1, p.rss_kib()?));
        }
    }
    p.close()?;
    Ok(samples)
}

/// Round-trip times of `tool/call variable_get` with `bound` sessions bound: `(p50, p99)` µs.
fn round_trips(bridge: &Path, dir: &Path, bound: usize) -> Result<(f64, f64), Error> {
    let mut p = Peer::spawn(bridge, &dir.join(format!("rt{bound}")))?;
    for s in 0..bound {
        bind(&mut p, &format!("s{s}"))?;
    }
    let mut times = Vec::with_capacity(2000);
    let (mut seqs, mut turns) = (vec![0u64; bound], vec![0u64; bound]);
    // Turns start before the clock runs (a turn start is projected, which writes to disk).
    for s in 0..bound {
        next_turn(&mut p, &format!("s{s}"), &mut seqs[s], &mut turns[s])?;
    }
    for s in 0..bound {
        p.call("resume", json!({"session": format!("s{s}")}))?;
    }
    for i in 0..2000 {
        let s = i % bound;
        let session = format!("s{s}");
        if i >= bound && (i / bound).is_multiple_of(20) {
            next_turn(&mut p, &session, &mut seqs[s], &mut turns[s])?;
            p.call("resume", json!({"session": session}))?;
        }
        let t = Instant::now();
        let r = p.call(
            "tool/call",
            json!({"tool": "variable_list", "args": {}, "callId": format!("rt{i}"), "session": session}),
        )?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
        if r["result"].get("error").is_some() {
            return Err(format!("call failed: {r}").into());
        }
    }
    p.close()?;
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times[times.len() * 99 / 100]))
}

/// Kill rounds: a bridge sets variables, is SIGKILLed after a varying number of acknowledged
/// writes, and a fresh bridge must find every acknowledged one. Returns (rounds, acked, lost).
fn crash_rounds(bridge: &Path, dir: &Path, rounds: u64) -> Result<(u64, u64, u64), Error> {
    let data = dir.join("crash");
    let (mut acked, mut lost) = (0u64, 0u64);
    let mut names = Vec::new();
    let (mut seq, mut turn) = (0u64, 0u64);
    for round in 0..rounds {
        let mut p = Peer::spawn(bridge, &data)?;
        if round == 0 {
            bind(&mut p, "w")?;
        } else {
            p.call("agent/created", json!({"agent": "w"}))?;
        }
        let writes = 1 + (round * 7) % 15;
        next_turn(&mut p, "w", &mut seq, &mut turn)?;
        for i in 0..writes {
            let name = format!("v{round}_{i}");
            let r = p.call(
                "tool/call",
                json!({"tool": "variable_set", "args": {"name": name, "value": i}, "callId": format!("k{round}-{i}"), "session": "w"}),
            )?;
            if r["result"]["revision"].is_string() {
                acked += 1;
                names.push(name);
            }
        }
        // One more write in flight, then the kill.
        p.send(&json!({"id": 1_000_000, "method": "tool/call", "params": {"tool": "variable_set", "args": {"name": "inflight", "value": round}, "callId": format!("x{round}"), "session": "w"}}))?;
        p.input.flush()?;
        p.child.kill()?;
        p.child.wait()?;
    }
    let mut p = Peer::spawn(bridge, &data)?;
    p.call("agent/created", json!({"agent": "w"}))?;
    for (i, name) in names.iter().enumerate() {
        if i % 30 == 0 {
            next_turn(&mut p, "w", &mut seq, &mut turn)?;
        }
        let r = p.call(
            "tool/call",
            json!({"tool": "variable_get", "args": {"name": name}, "callId": format!("check{i}"), "session": "w"}),
        )?;
        if r["result"]["error"]["code"] == json!("limit-exceeded") {
            return Err(format!("the check itself hit a limit: {r}").into());
        }
        if !r["result"]["revision"].is_string() {
            lost += 1;
        }
    }
    p.close()?;
    Ok((rounds, acked, lost))
}

/// One DSH turn as the plugin forwards it: the user's message, a step streaming 150 chunks into
/// a tool call, its result, a step streaming 150 chunks into the reply, the turn's end.
fn dsh_turn(first: u64, turn: u64) -> Vec<Value> {
    let mut seq = first;
    let mut out = Vec::new();
    let mut push = |ty: &str, data: Value| {
        out.push(json!({"type": ty, "seq": seq, "time": 1, "data": data}));
        seq += 1;
    };
    push("turn/start", json!({"turn": turn}));
    push(
        "user/message",
        json!({"role": "user", "source": {"kind": "user"}, "content": [{"type": "text", "text": format!("question {turn}")}]}),
    );
    for step in [1, 2] {
        push("step/start", json!({"turn": turn, "step": step}));
        for k in 0..150 {
            push(
                "assistant/chunk",
                json!({"turn": turn, "step": step, "delta": format!("tok{k} ")}),
            );
        }
        if step == 1 {
            push(
                "assistant/message",
                json!({"turn": turn, "step": 1, "message": {"role": "assistant", "content": [{"type": "tool-call", "toolCallId": format!("t{turn}"), "toolName": "variable_set"}]}}),
            );
            push("tool/call", json!({"turn": turn, "step": 1}));
            push(
                "tool/result",
                json!({"turn": turn, "step": 1, "toolCallId": format!("t{turn}")}),
            );
        } else {
            push(
                "assistant/message",
                json!({"turn": turn, "step": 2, "message": {"role": "assistant", "content": [{"type": "text", "text": format!("answer {turn}")}]}}),
            );
        }
        push("step/end", json!({"turn": turn, "step": step}));
    }
    push(
        "turn/end",
        json!({"turn": turn, "reason": {"kind": "completed"}}),
    );
    out
}

/// Figures of DSH-realistic turns through an in-process bridge.
struct TurnFigures {
    fsyncs_per_turn: f64,
    dir_syncs_per_turn: f64,
    lines_per_turn: f64,
    /// SQL statements PgStore sent per event (PgStore only).
    statements_per_event: f64,
    /// The most statements one event took (PgStore only).
    statements_max: u64,
    chunks_per_second: f64,
    event_p50_us: f64,
    event_p99_us: f64,
    prompt_p50_us: f64,
}

/// A two-worker runtime, as the bridge runs on this machine's two cores.
fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

fn percentile(times: &mut [f64], p: usize) -> f64 {
    times.sort_by(f64::total_cmp);
    times[(times.len() * p / 100).min(times.len() - 1)]
}

/// Counts the SQL statements every session but its own sent to one database, from
/// `pg_stat_statements` (updated as each statement ends, so a count taken after a call
/// returns includes all of the call's statements).
struct StatementCounter {
    client: tavern_store::pg::PgClient,
}

impl StatementCounter {
    async fn connect(config: &tavern_store::pg::PgConfig) -> Result<Self, Error> {
        let (client, connection) = config.connect(tavern_store::pg::NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await?;
        if let Err(e) = client
            .query_one("SELECT pg_stat_statements_reset()", &[])
            .await
        {
            return Err(format!(
                "pg_stat_statements is not loaded ({e}): start the server with \
                 -c shared_preload_libraries=pg_stat_statements"
            )
            .into());
        }
        Ok(Self { client })
    }

    /// Statements counted so far in this database, this counter's own excluded.
    async fn count(&self) -> Result<u64, Error> {
        let row = self
            .client
            .query_one(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 AND query NOT LIKE '%pg_stat_statements%'",
                &[],
            )
            .await?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }
}

/// Where the turns keep their data.
#[derive(Clone)]
enum TurnStore {
    /// FsStore in a directory (fsyncs counted).
    Files,
    /// PgStore in this database (statements counted).
    Postgres(Box<tavern_store::pg::PgConfig>),
}

/// Runs `turns` DSH turns (and 2,000 prompt requests) with the checkpoint saved per event or
/// per turn; `label` keeps runs sharing one database apart.
fn dsh_turns(
    dir: &Path,
    every_event: bool,
    turns: u64,
    kind: &TurnStore,
    label: &str,
) -> Result<TurnFigures, Error> {
    use std::sync::Arc;
    use tavern_dsh_adapter::bridge::host::BridgeHost;
    use tavern_dsh_adapter::bridge::Bridge;
    use tavern_dsh_adapter::{Runtime, RuntimeConfig};
    use tavern_store::fs::{dir_syncs_issued, syncs_issued, FsStore};
    use tavern_store::{AllStores, SystemClock};
    use tavern_tools::assets::provider::{DirAssets, Persona};

    let card = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/cards/Seraphina.v2v3.book4.png");
    let assets_dir = dir.join("assets");
    std::fs::create_dir_all(assets_dir.join("characters"))?;
    std::fs::copy(&card, assets_dir.join("characters/Seraphina.png"))
        .map_err(|e| format!("../shared/fixtures/cards/Seraphina.v2v3.book4.png is needed: {e}"))?;
    runtime()?.block_on(async {
        let clock = Arc::new(SystemClock);
        let (store, counter): (Arc<dyn AllStores>, Option<StatementCounter>) = match kind {
            TurnStore::Files => (Arc::new(FsStore::open(dir.join("store"), clock.clone())?), None),
            TurnStore::Postgres(config) => {
                let store = tavern_store::pg::PgStore::open((**config).clone(), clock.clone(), 8).await?;
                (Arc::new(store), Some(StatementCounter::connect(config).await?))
            }
        };
        let host = Arc::new(BridgeHost::default());
        let assets = Arc::new(DirAssets::new(&assets_dir, Vec::new(), Persona::default()));
        let config = RuntimeConfig {
            checkpoint_every_event: every_event,
            ..RuntimeConfig::default()
        };
        let runtime = Runtime::new(host.clone(), store.clone(), assets, clock, config);
        let bridge = Bridge::new(runtime, host);
        let call = |frame: Value| {
            let bridge = &bridge;
            async move {
                let out = bridge.handle(&frame.to_string()).await;
                match out.iter().find(|v| v.get("error").is_some()) {
                    Some(e) => Err::<Vec<Value>, Error>(format!("{e}").into()),
                    None => Ok(out),
                }
            }
        };
        call(json!({"id": 1, "method": "handshake", "params": {"protocol": 1}})).await?;
        let agent = format!("d-{label}");
        call(json!({"id": 2, "method": "agent/created", "params": {"agent": agent, "bind": {"character": "Seraphina", "chatId": format!("Seraphina - bench {label}")}}})).await?;
        let (mut syncs, mut dir_syncs, mut chunk_time, mut chunks) = (0u64, 0u64, 0f64, 0u64);
        let (mut statements, mut statements_max, mut events) = (0u64, 0u64, 0u64);
        let mut times = Vec::new();
        for turn in 1..=turns {
            for e in dsh_turn((turn - 1) * 311, turn) {
                let chunk = e["type"] == "assistant/chunk";
                if e["type"] == "tool/call" {
                    call(json!({"id": 3, "method": "tool/call", "params": {"tool": "variable_set", "args": {"name": "mood", "value": turn}, "callId": format!("t{turn}"), "session": agent}})).await?;
                }
                let counted = match &counter {
                    Some(c) => c.count().await?,
                    None => 0,
                };
                let (before, dir_before) = (syncs_issued(), dir_syncs_issued());
                let t = Instant::now();
                call(json!({"method": "event", "params": {"session": agent, "event": e}})).await?;
                let took = t.elapsed().as_secs_f64();
                syncs += syncs_issued() - before;
                dir_syncs += dir_syncs_issued() - dir_before;
                if let Some(c) = &counter {
                    let n = c.count().await? - counted;
                    statements += n;
                    statements_max = statements_max.max(n);
                }
                events += 1;
                times.push(took * 1e6);
                if chunk {
                    chunk_time += took;
                    chunks += 1;
                }
            }
        }
        let mut prompts = Vec::new();
        for i in 0..2000 {
            let t = Instant::now();
            let out = call(json!({"id": 10 + i, "method": "prompt", "params": {"agent": agent}})).await?;
            prompts.push(t.elapsed().as_secs_f64() * 1e6);
            if i == 0 && out.first().is_none_or(|r| r["result"]["text"].is_null()) {
                return Err::<TurnFigures, Error>(format!("no prompt: {out:?}").into());
            }
        }
        Ok(TurnFigures {
            fsyncs_per_turn: syncs as f64 / turns as f64,
            dir_syncs_per_turn: dir_syncs as f64 / turns as f64,
            lines_per_turn: 2.0,
            statements_per_event: statements as f64 / events.max(1) as f64,
            statements_max,
            chunks_per_second: chunks as f64 / chunk_time,
            event_p50_us: percentile(&mut times, 50),
            event_p99_us: percentile(&mut times, 99),
            prompt_p50_us: percentile(&mut prompts, 50),
        })
    })
}

/// A bridge in this process on a file store in `dir`, assets from `assets`, with agent `h1`
/// announced and bound to `character`.
async fn in_process_bridge(
    dir: &Path,
    assets: &Path,
    global_worlds: Vec<String>,
    character: &str,
) -> Result<std::sync::Arc<tavern_dsh_adapter::bridge::Bridge>, Error> {
    use std::sync::Arc;
    use tavern_dsh_adapter::bridge::host::BridgeHost;
    use tavern_dsh_adapter::bridge::Bridge;
    use tavern_dsh_adapter::{Runtime, RuntimeConfig};
    use tavern_store::fs::FsStore;
    use tavern_store::SystemClock;
    use tavern_tools::assets::provider::{DirAssets, Persona};

    let clock = Arc::new(SystemClock);
    let store = Arc::new(FsStore::open(dir.join("store"), clock.clone())?);
    let host = Arc::new(BridgeHost::default());
    let assets = Arc::new(DirAssets::new(assets, global_worlds, Persona::default()));
    let runtime = Runtime::new(host.clone(), store, assets, clock, RuntimeConfig::default());
    let bridge = Arc::new(Bridge::new(runtime, host));
    bridge
        .handle(&json!({"id": 1, "method": "handshake", "params": {"protocol": 1}}).to_string())
        .await;
    let bind = json!({"character": character, "chatId": format!("{character} - bench")});
    bridge
        .handle(
            &json!({"id": 2, "method": "agent/created", "params": {"agent": "h1", "bind": bind}})
                .to_string(),
        )
        .await;
    Ok(bridge)
}

/// This process's resident memory now and at its peak since the last [`reset_peak_rss`], KiB.
fn rss_now_and_peak() -> Result<(u64, u64), Error> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> Result<u64, Error> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| format!("no {name} in /proc/self/status"))?;
        Ok(line
            .split_whitespace()
            .nth(1)
            .ok_or("bad status line")?
            .parse()?)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Starts counting this process's peak resident memory afresh (Linux: `clear_refs` 5).
fn reset_peak_rss() -> Result<(), Error> {
    Ok(std::fs::write("/proc/self/clear_refs", "5")?)
}

/// Figures of large assets (issue 30, F7): the largest card and world the defaults take.
struct BigAssets {
    world_mib: f64,
    entries: usize,
    lore_first_ms: f64,
    lore_first_peak_mib: f64,
    lore_warm: (f64, f64),
    lore_16: (f64, f64),
    lore_peak_mib: f64,
    card_mib: f64,
    card_16: (f64, f64),
    card_peak_mib: f64,
}

/// A world of 100,000 entries (global, under the 32 MiB asset cap) searched cold, warm, and
/// 16 at once; a 30 MiB card read by 16 `tavern_character_get` at once: times and the growth
/// of this process's peak resident memory over each stage.
fn big_assets(dir: &Path) -> Result<BigAssets, Error> {
    use std::sync::Arc;
    const ENTRIES: usize = 100_000;
    let assets_dir = dir.join("assets");
    std::fs::create_dir_all(assets_dir.join("characters"))?;
    std::fs::create_dir_all(assets_dir.join("worlds"))?;
    let entries: serde_json::Map<String, Value> = (0..ENTRIES)
        .map(|i| {
            let entry = json!({"uid": i, "key": [format!("rune{i}")], "keysecondary": [],
                "content": format!("Rune {i} is carved on the {} gate; it glows when spoken aloud.", ["north", "south", "east", "west"][i % 4]),
                "constant": false, "selective": false, "disable": false, "order": 100});
            (i.to_string(), entry)
        })
        .collect();
    let world = json!({"entries": entries}).to_string();
    std::fs::write(assets_dir.join("worlds/Runes.json"), &world)?;
    // A card as large as the cap allows, less a little: one long description.
    let card_bytes = 30 * 1024 * 1024;
    let card = json!({"spec": "chara_card_v3", "spec_version": "3.0", "data": {"name": "Big",
        "first_mes": "Hello.", "description": "The keeper of many runes. ".repeat(card_bytes / 26)}});
    let card = card.to_string();
    std::fs::write(assets_dir.join("characters/Big.json"), &card)?;
    let stats = |v: &mut Vec<f64>| (percentile(v, 50), v.iter().copied().fold(0.0, f64::max));
    runtime()?.block_on(async {
        let bridge = in_process_bridge(dir, &assets_dir, vec!["Runes".into()], "Big").await?;
        let call = |bridge: Arc<tavern_dsh_adapter::bridge::Bridge>, i: usize, tool: &'static str, args: Value| async move {
            let t = Instant::now();
            let frame = json!({"id": 100 + i, "method": "tool/call", "params": {"tool": tool, "args": args, "callId": format!("c{i}"), "session": "h1"}});
            let out = bridge.handle(&frame.to_string()).await;
            let text = format!("{out:?}");
            if text.contains("\"error\"") {
                return Err::<f64, String>(format!("{tool} failed: {text}"));
            }
            Ok(t.elapsed().as_secs_f64() * 1e3)
        };
        let lore = |i: usize| json!({"query": format!("I speak rune{} and rune{} aloud", i * 7 % ENTRIES, i * 13 % ENTRIES)});
        let (base, _) = rss_now_and_peak()?;
        reset_peak_rss()?;
        let lore_first_ms = call(bridge.clone(), 0, "tavern_lore_search", lore(1)).await?;
        let (after_first, first_peak) = rss_now_and_peak()?;
        reset_peak_rss()?;
        let mut warm = Vec::new();
        for i in 1..11 {
            warm.push(call(bridge.clone(), i, "tavern_lore_search", lore(i + 1)).await?);
        }
        let at_once: Vec<_> = (0..16)
            .map(|i| tokio::spawn(call(bridge.clone(), 20 + i, "tavern_lore_search", lore(i + 20))))
            .collect();
        let mut lore_16 = Vec::new();
        for s in at_once {
            lore_16.push(s.await??);
        }
        let (after_lore, lore_peak) = rss_now_and_peak()?;
        reset_peak_rss()?;
        // A new turn: the 32 calls a turn allows are spent.
        for event in [
            json!({"type": "turn/end", "seq": 1, "time": 1, "data": {"turn": 1, "reason": {"kind": "completed"}}}),
            json!({"type": "turn/start", "seq": 2, "time": 1, "data": {"turn": 2}}),
        ] {
            bridge.handle(&json!({"method": "event", "params": {"session": "h1", "event": event}}).to_string()).await;
        }
        let at_once: Vec<_> = (0..16)
            .map(|i| tokio::spawn(call(bridge.clone(), 40 + i, "tavern_character_get", json!({"fields": ["name", "description"], "maxTokens": 200}))))
            .collect();
        let mut card_16 = Vec::new();
        for s in at_once {
            card_16.push(s.await??);
        }
        let (_, card_peak) = rss_now_and_peak()?;
        let mib = |kib: u64| kib as f64 / 1024.0;
        Ok::<BigAssets, Error>(BigAssets {
            world_mib: world.len() as f64 / 1048576.0,
            entries: ENTRIES,
            lore_first_ms,
            lore_first_peak_mib: mib(first_peak.saturating_sub(base)),
            lore_warm: stats(&mut warm),
            lore_16: stats(&mut lore_16),
            lore_peak_mib: mib(lore_peak.saturating_sub(after_first)),
            card_mib: card.len() as f64 / 1048576.0,
            card_16: stats(&mut card_16),
            card_peak_mib: mib(card_peak.saturating_sub(after_lore)),
        })
    })
}

fn big_assets_table() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let b = big_assets(dir.path())?;
    println!("| large assets (issue 30 F7) | result | note |\n|---|---|---|");
    println!(
        "| lore search in a global world of {} entries ({:.1} MiB) | first {:.0} ms (parse and index), then p50 {:.1} ms, max {:.1} ms | 10 searches; peak memory +{:.0} MiB by the first (the parsed book, kept and shared) |",
        b.entries, b.world_mib, b.lore_first_ms, b.lore_warm.0, b.lore_warm.1, b.lore_first_peak_mib
    );
    println!(
        "| 16 such searches at once | p50 {:.0} ms, max {:.0} ms | peak memory +{:.0} MiB over the warm searches (two run at a time, a slot per core) |",
        b.lore_16.0, b.lore_16.1, b.lore_peak_mib
    );
    println!(
        "| 16 `tavern_character_get` at once on a {:.0} MiB card | p50 {:.0} ms, max {:.0} ms | peak memory +{:.0} MiB |\n",
        b.card_mib, b.card_16.0, b.card_16.1, b.card_peak_mib
    );
    Ok(())
}

/// Figures of hostile lore searches beside `status`.
struct HostileLore {
    status_calm: (f64, f64),
    status_loaded: (f64, f64),
    lore: (f64, f64),
    alone: (f64, f64),
    warned: bool,
}

/// 20 lore searches at once on a card whose keys are exponential for a backtracking engine
/// (issue 30, F4), recursion feeding them the text they are slowest on, while `status` is asked
/// 200 times: `status` latency (p50, max) calm and under that load, and the searches' own.
fn hostile_lore(dir: &Path) -> Result<HostileLore, Error> {
    use std::sync::Arc;
    use tavern_dsh_adapter::bridge::Bridge;

    let keys = [
        "/(a|a)*c/",
        r"/(\w|\d)+!/",
        "/(?:a|aa)+z/",
        "/a*a*a*a*a*a*a*a*a*a*b/",
        "/(a?){28}a{28}/",
        r"/(a|a)*\1c/",
        r"/(?=a)(a|a)*\1z/",
    ];
    let mut entries: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"id": i, "keys": [k], "content": format!("entry {i}"), "enabled": true}))
        .collect();
    entries.push(json!({"id": 99, "keys": ["spark"], "content": "a".repeat(60), "enabled": true}));
    let card = json!({"spec": "chara_card_v3", "spec_version": "3.0", "data": {"name": "Hostile",
        "first_mes": "Hello.", "character_book": {"name": "Hostile", "entries": entries}}});
    let assets_dir = dir.join("assets");
    std::fs::create_dir_all(assets_dir.join("characters"))?;
    std::fs::write(assets_dir.join("characters/Hostile.json"), card.to_string())?;
    runtime()?.block_on(async {
        let bridge = in_process_bridge(dir, &assets_dir, Vec::new(), "Hostile").await?;
        let status = |bridge: Arc<Bridge>| async move {
            let t = Instant::now();
            bridge.handle(&json!({"id": 3, "method": "status", "params": {}}).to_string()).await;
            t.elapsed().as_secs_f64() * 1e6
        };
        let mut calm = Vec::new();
        for _ in 0..200 {
            calm.push(status(bridge.clone()).await);
        }
        let search = |bridge: Arc<Bridge>, i: usize| async move {
            let t = Instant::now();
            let frame = json!({"id": 100 + i, "method": "tool/call", "params": {"tool": "tavern_lore_search", "args": {"query": format!("a spark {}", "a".repeat(60))}, "callId": format!("l{i}"), "session": "h1"}});
            let out = bridge.handle(&frame.to_string()).await;
            (t.elapsed().as_secs_f64() * 1e3, out)
        };
        let mut alone = Vec::new();
        // Ten alone and twenty at once stay within the 32 tool calls a turn allows.
        for i in 0..10 {
            alone.push(search(bridge.clone(), 1000 + i).await.0);
        }
        let searches: Vec<_> = (0..20)
            .map(|i| {
                tokio::spawn(search(bridge.clone(), i))
            })
            .collect();
        let mut loaded = Vec::new();
        while searches.iter().any(|s| !s.is_finished()) && loaded.len() < 200 {
            loaded.push(status(bridge.clone()).await);
        }
        let mut lore = Vec::new();
        let mut warned = true;
        for s in searches {
            let (ms, out) = s.await?;
            lore.push(ms);
            let text = format!("{out:?}");
            warned &= text.contains("backtracking steps");
            if text.contains("\"error\"") {
                return Err::<HostileLore, Error>(format!("a lore search failed: {text}").into());
            }
        }
        let stats = |v: &mut Vec<f64>| (percentile(v, 50), v.iter().copied().fold(0.0, f64::max));
        Ok(HostileLore {
            status_calm: stats(&mut calm),
            status_loaded: stats(&mut loaded),
            lore: stats(&mut lore),
            alone: stats(&mut alone),
            warned,
        })
    })
}

fn hostile_lore_table() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let h = hostile_lore(dir.path())?;
    println!("| hostile lore (issue 30 F4) | result | note |\n|---|---|---|");
    println!(
        "| `status` while 20 hostile lore searches run | p50 {:.0} µs, max {:.0} µs | calm: p50 {:.0} µs, max {:.0} µs |",
        h.status_loaded.0, h.status_loaded.1, h.status_calm.0, h.status_calm.1
    );
    println!(
        "| one such search alone (7 exponential keys, recursion into 60 a's), 10 runs | p50 {:.1} ms, max {:.1} ms | |",
        h.alone.0, h.alone.1
    );
    println!(
        "| each of the 20 searches at once | p50 {:.1} ms, max {:.1} ms | a slot per core; the step-limited keys named in every answer: {} |\n",
        h.lore.0, h.lore.1, h.warned
    );
    Ok(())
}

/// Mira's card in a new assets folder under `root`.
fn mira_assets(root: &Path) -> Result<PathBuf, Error> {
    let assets = root.join("assets");
    std::fs::create_dir_all(assets.join("characters"))?;
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/assets/Mira.card.json"),
        assets.join("characters/Mira.json"),
    )?;
    Ok(assets)
}

/// Starts a bridge with `args`, binds a session to Mira and searches its memories: the
/// milliseconds from start to the handshake answered and to the search answered, and the
/// bridge's resident set (MiB) then. Shuts it down and waits for it to exit.
fn start_and_search(bridge: &Path, args: &[&std::ffi::OsStr]) -> Result<(f64, f64, f64), Error> {
    let started = Instant::now();
    let mut p = Peer::spawn_with(bridge, args)?;
    let handshake_ms = started.elapsed().as_secs_f64() * 1e3;
    let bound = p.call(
        "agent/created",
        json!({"agent": "s1", "bind": {"character": "Mira", "chatId": "big store"}}),
    )?;
    if bound["result"]["mounted"] != true {
        return Err(format!("binding failed: {bound}").into());
    }
    let searched = p.call(
        "tool/call",
        json!({"tool": "memory_search", "args": {"query": "lantern"}, "callId": "c1", "session": "s1"}),
    )?;
    let search_ms = started.elapsed().as_secs_f64() * 1e3;
    if !searched["result"]["items"].is_array() {
        return Err(format!("the search failed: {searched}").into());
    }
    let rss = p.rss_kib()? as f64 / 1024.0;
    p.call("shutdown", json!({}))?;
    p.child.wait()?;
    Ok((handshake_ms, search_ms, rss))
}

/// Writes `records` memories (64 scopes, varied words) into a file store at `data`; the
/// first scope is Mira's (what the benchmark's session searches, with its chat's and the
/// global scope), the others are agents' (other players').
fn write_big_store(data: &Path, records: usize) -> Result<(), Error> {
    use std::sync::Arc;
    use tavern_core::{
        AgentId, CharacterName, MemoryId, MemoryKind, MemorySource, MemoryWrite, ScopeKey,
    };
    use tavern_store::fs::FsStore;
    const WORDS: [&str; 16] = [
        "lantern", "river", "harbour", "silver", "gate", "orchard", "storm", "ember", "archive",
        "falcon", "meadow", "copper", "tide", "lichen", "beacon", "quarry",
    ];
    let store = FsStore::open(data, Arc::new(tavern_store::clock::SystemClock))?;
    let mut scopes: Vec<ScopeKey> = (1..64)
        .map(|i| AgentId::parse(format!("bench-{i}")).map(|agent| ScopeKey::Agent { agent }))
        .collect::<Result<_, _>>()?;
    scopes.insert(
        0,
        ScopeKey::Character {
            character: CharacterName::parse("Mira")?,
        },
    );
    let mut start = 0;
    while start < records {
        let end = (start + 50_000).min(records);
        let batch = (start..end)
            .map(|i| {
                let word = |k: usize| WORDS[(i / 16usize.pow(k as u32)) % 16];
                Ok(MemoryWrite {
                    id: MemoryId::parse(format!("m{i}"))?,
                    scope: scopes[i % scopes.len()].clone(),
                    kind: MemoryKind::Semantic,
                    content: format!(
                        "Record {i}: the {} by the {} keeps the {} of {}.",
                        word(0),
                        word(1),
                        word(2),
                        word(3)
                    ),
                    tags: Vec::new(),
                    importance: 0.5,
                    confidence: 0.5,
                    source: MemorySource::system(),
                    expires_at: None,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        store.import_memories(batch)?;
        start = end;
    }
    Ok(())
}

/// The bridge on a store of `records` memories: how long the host waits for the handshake
/// (the memory log is read on a thread of its own) beside how long an open that reads it
/// first takes (what the handshake waited for before), and when the first memory search is
/// answered.
fn big_store_table(bridge: &Path, records: usize) -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let wrote = Instant::now();
    write_big_store(&data, records)?;
    let wrote = wrote.elapsed().as_secs_f64();
    // The open the handshake used to wait for, in this process (page cache warm as below).
    let eager = Instant::now();
    let store = tavern_store::fs::FsStore::open(
        &data,
        std::sync::Arc::new(tavern_store::clock::SystemClock),
    )?;
    let eager_ms = eager.elapsed().as_secs_f64() * 1e3;
    if store.memory_len() != records {
        return Err(format!("{} records loaded, {records} written", store.memory_len()).into());
    }
    drop(store);
    let assets = mira_assets(dir.path())?;
    let (handshake_ms, search_ms, rss) = start_and_search(
        bridge,
        &[
            "--data".as_ref(),
            data.as_os_str(),
            "--assets".as_ref(),
            assets.as_os_str(),
        ],
    )?;
    println!("| bridge on a file store of {records} memories (written in {wrote:.0} s) | now | an open that reads the memory log first (before) |\n|---|---|---|");
    println!("| start to handshake answered | {handshake_ms:.0} ms | {eager_ms:.0} ms |");
    println!("| start to first memory search answered (waits for the log) | {search_ms:.0} ms | |");
    println!("| RSS after the search | {rss:.0} MiB | |\n");
    Ok(())
}

/// The bridge on a PostgreSQL database (`settings`, empty) of `records` memories: the
/// handshake and the first memory search of a start with `--store-image-dir` and no image yet
/// (every row read in the background, then the image saved), of the next start (the image
/// read), beside an open that reads every row first (what the handshake waited for before).
fn big_pg_table(bridge: &Path, records: usize, settings: &str) -> Result<(), Error> {
    use std::sync::Arc;
    use tavern_store::pg::{PgStore, PgTls};
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    write_big_store(&data, records)?;
    let clock = Arc::new(tavern_store::clock::SystemClock);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let config = tavern_store::pg::parse_settings(settings)?;
    rt.block_on(async {
        let files = tavern_store::fs::FsStore::open(&data, clock.clone())?;
        let target =
            PgStore::open_with_tls(config.clone(), &PgTls::default(), clock.clone(), 8).await?;
        tavern_store::copy_store(&files, &target).await?;
        Ok::<_, Error>(())
    })?;
    let eager = Instant::now();
    let store = rt.block_on(PgStore::open_with_tls(config, &PgTls::default(), clock, 8))?;
    let eager_ms = eager.elapsed().as_secs_f64() * 1e3;
    let loaded = rt.block_on(store.memory_len());
    if loaded != records {
        return Err(format!("{loaded} records loaded, {records} written").into());
    }
    drop(store);
    let assets = mira_assets(dir.path())?;
    let images = dir.path().join("images");
    println!("| bridge on PostgreSQL, {records} memories | start to handshake | start to first memory search | RSS |\n|---|---|---|---|");
    println!("| an open reading every row first (before) | {eager_ms:.0} ms | | |");
    for label in [
        "first start, no image yet (every row)",
        "next start (the image)",
    ] {
        let (handshake_ms, search_ms, rss) = start_and_search(
            bridge,
            &[
                "--store".as_ref(),
                settings.as_ref(),
                "--store-image-dir".as_ref(),
                images.as_os_str(),
                "--assets".as_ref(),
                assets.as_os_str(),
            ],
        )?;
        let image = std::fs::metadata(images.join("memory.image")).map_or("none".to_owned(), |m| {
            format!("{:.0} MiB", m.len() as f64 / 1048576.0)
        });
        println!("| {label} | {handshake_ms:.0} ms | {search_ms:.0} ms | {rss:.0} MiB | image after: {image} |");
    }
    // Holding by scope: the session's scopes alone (Mira's, a 64th of the memories).
    let bound = (records / 16).to_string();
    let (handshake_ms, search_ms, rss) = start_and_search(
        bridge,
        &[
            "--store".as_ref(),
            settings.as_ref(),
            "--store-max-loaded-memories".as_ref(),
            bound.as_ref(),
            "--assets".as_ref(),
            assets.as_os_str(),
        ],
    )?;
    println!("| holding by scope (--store-max-loaded-memories {bound}; the session's scopes hold {}) | {handshake_ms:.0} ms | {search_ms:.0} ms | {rss:.0} MiB | |", records.div_ceil(64));
    println!();
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--big-store") {
        let records: usize = args
            .get(i + 1)
            .ok_or("--big-store needs a number of records")?
            .parse()?;
        let bridge: PathBuf = std::env::current_exe()?.with_file_name("tavern-bridge");
        if !bridge.is_file() {
            return Err(
                "build tavern-bridge first (cargo build --release -p tavern-dsh-adapter)".into(),
            );
        }
        if let Some(i) = args.iter().position(|a| a == "--pg") {
            let settings = args.get(i + 1).ok_or("--pg needs connection settings")?;
            return big_pg_table(&bridge, records, settings);
        }
        return big_store_table(&bridge, records);
    }
    if args.iter().any(|a| a == "--hostile-lore") {
        return hostile_lore_table();
    }
    if args.iter().any(|a| a == "--big-assets") {
        return big_assets_table();
    }
    if let Some(i) = args.iter().position(|a| a == "--pg") {
        let settings = args.get(i + 1).ok_or("--pg needs connection settings")?;
        let config = tavern_store::pg::parse_settings(settings)?;
        return turns_table(&TurnStore::Postgres(Box::new(config)));
    }
    if args.iter().any(|a| a == "--turns-only") {
        return turns_table(&TurnStore::Files);
    }
    turns_table(&TurnStore::Files)?;
    hostile_lore_table()?;
    big_assets_table()?;
    let bridge: PathBuf = std::env::current_exe()?.with_file_name("tavern-bridge");
    if !bridge.is_file() {
        return Err(
            "build tavern-bridge first (cargo build --release -p tavern-dsh-adapter)".into(),
        );
    }
    let dir = tempfile::tempdir()?;
    println!("| measurement | result | note |\n|---|---|---|");
    let samples = soak(&bridge, dir.path())?;
    let first = samples.get(1).map_or(0, |s| s.1);
    let last = samples.last().map_or(0, |s| s.1);
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    println!(
        "| soak: 100,000 frames, 1,000 sessions (100 bound) | RSS {:.1} MiB after 10,000 frames, {:.1} MiB after 100,000 (peak {:.1}) | growth {:.1} MiB over the last 90,000 frames |",
        first as f64 / 1024.0,
        last as f64 / 1024.0,
        peak as f64 / 1024.0,
        (last as f64 - first as f64) / 1024.0
    );
    for bound in [1, 3000] {
        let (p50, p99) = round_trips(&bridge, dir.path(), bound)?;
        println!(
            "| round trip tool/call, {bound} bound sessions | p50 {p50:.0} µs, p99 {p99:.0} µs | 2,000 calls, pipes, file store |"
        );
    }
    let (rounds, acked, lost) = crash_rounds(&bridge, dir.path(), 40)?;
    println!("| SIGKILL rounds | {rounds} rounds, {acked} acknowledged writes | {lost} lost |");
    Ok(())
}

/// A table row: its name and how to show one column's figure.
type Row = (&'static str, fn(&TurnFigures) -> String);

/// The DSH-turn table: the checkpoint per event (before #28) beside per turn, same run.
fn turns_table(kind: &TurnStore) -> Result<(), Error> {
    const TURNS: u64 = 20;
    let on = match kind {
        TurnStore::Files => "",
        TurnStore::Postgres(_) => " on PgStore",
    };
    println!("| DSH turns{on} ({TURNS} × 311 events: 300 chunks, a tool call, the reply) | checkpoint per event (before) | checkpoint per turn (now) |\n|---|---|---|");
    let (before_dir, now_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let before = dsh_turns(before_dir.path(), true, TURNS, kind, "before")?;
    let now = dsh_turns(now_dir.path(), false, TURNS, kind, "now")?;
    let cost: Row = match kind {
        TurnStore::Files => (
            "fsyncs per turn, of events (of directories; lines written)",
            |f| {
                format!(
                    "{:.1} ({:.1}; {:.0})",
                    f.fsyncs_per_turn, f.dir_syncs_per_turn, f.lines_per_turn
                )
            },
        ),
        TurnStore::Postgres(_) => ("SQL statements per event (most in one event)", |f| {
            format!("{:.2} ({})", f.statements_per_event, f.statements_max)
        }),
    };
    let rows: [Row; 5] = [
        cost,
        ("chunk events per second", |f| {
            format!("{:.0}", f.chunks_per_second)
        }),
        ("p50 per event", |f| format!("{:.1} µs", f.event_p50_us)),
        ("p99 per event", |f| format!("{:.1} µs", f.event_p99_us)),
        ("prompt request p50, warm, PNG card", |f| {
            format!("{:.1} µs", f.prompt_p50_us)
        }),
    ];
    for (name, show) in rows {
        println!("| {name} | {} | {} |", show(&before), show(&now));
    }
    println!(
        "| chunk events/s, now ÷ before | | {:.1}× |\n",
        now.chunks_per_second / before.chunks_per_second
    );
    Ok(())
}
