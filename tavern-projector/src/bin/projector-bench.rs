//! Projector benchmark: one table from one run.
//!
//! `cargo run --release -p tavern-projector --bin projector-bench`
//!
//! - context projection over 10,000 surface nodes (target < 1 ms), next to copying the node
//!   list (the floor any projection pays to look at every node);
//! - projecting one turn into a chat of 100 vs 10,000 messages on the file store (target: the
//!   10,000-message cost within 2× of the 100-message cost).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tavern_core::{normalize_state, CharacterName, ChatId, SessionId};
use tavern_projector::context::{project, Budget, NodeRole, ProjectionInput, SurfaceNode};
use tavern_projector::{ChatProjector, EventKind, HostEvent, ProjectorConfig};
use tavern_store::fs::FsStore;
use tavern_store::{ChatStore, SystemClock};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn surface(n: usize) -> Vec<SurfaceNode> {
    (0..n)
        .map(|i| {
            let seq = i as u64 + 1;
            let role = match i % 5 {
                0 => NodeRole::User,
                1 => NodeRole::Assistant {
                    tool_calls: vec![format!("c{i}")],
                },
                2 => NodeRole::Tool {
                    call_id: format!("c{}", i - 1),
                },
                _ => NodeRole::Assistant { tool_calls: vec![] },
            };
            SurfaceNode {
                seq,
                role,
                tokens: 20 + (i * 37) % 300,
                relevance: ((i * 7919) % 1000) as f64 / 1000.0,
                importance: ((i * 31) % 10) as f64 / 10.0,
                trusted: i % 5 != 2,
            }
        })
        .collect()
}

fn turn_events(turn: u64, first_seq: u64, time: i64) -> Vec<HostEvent> {
    use tavern_projector::event::{TurnEndReason, UserSource};
    let kinds = [
        EventKind::TurnStart { turn },
        EventKind::StepStart { turn, step: 1 },
        EventKind::UserMessage {
            source: UserSource::User,
            text: format!("message {turn} from the user"),
        },
        EventKind::AssistantMessage {
            turn,
            step: 1,
            text: format!("reply {turn} from the character"),
            has_tool_calls: false,
            interrupted: false,
        },
        EventKind::StepEnd { turn, step: 1 },
        EventKind::TurnEnd {
            turn,
            reason: TurnEndReason::Completed,
        },
    ];
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| HostEvent {
            seq: first_seq + i as u64,
            time,
            kind,
        })
        .collect()
}

/// Median time to project one turn into a chat that already has `existing` messages.
fn turn_cost(existing: usize) -> Result<Duration, Box<dyn std::error::Error>> {
    let base = std::path::Path::new("target").join("projector-bench");
    std::fs::create_dir_all(&base)?;
    let dir = tempfile::tempdir_in(&base)?;
    let store = Arc::new(FsStore::open(dir.path(), Arc::new(SystemClock))?);
    let character = CharacterName::parse("Mira")?;
    let chat = ChatId::parse("Mira - bench")?;
    let line = |v: serde_json::Value| match v {
        serde_json::Value::Object(m) => tavern_core::chat::ChatLine::from_object(m),
        _ => unreachable!("benchmark lines are objects"),
    };
    let mut lines = vec![line(
        json!({"user_name": "Kai", "character_name": "Mira", "create_date": "x", "chat_metadata": {}}),
    )];
    for i in 0..existing {
        lines.push(line(json!({"name": if i % 2 == 0 { "Kai" } else { "Mira" }, "is_user": i % 2 == 0, "send_date": i, "mes": format!("earlier message {i} with some words in it to make the line realistic")})));
    }
    rt().block_on(store.rewrite_chat(&character, &chat, &lines, None))?;
    let (state, _) = normalize_state(
        &json!({"sessionBindings": {"s1": {"character": "Mira", "chatId": "Mira - bench", "architecture": "agent-tavern", "contextMode": "dsh-native"}}}),
    );
    let session = SessionId::parse("s1")?;
    let binding = state.binding(&session).ok_or("bound")?.clone();
    let p = ChatProjector::new(
        store.clone(),
        store.clone(),
        Arc::new(SystemClock),
        ProjectorConfig::new("Kai"),
    );
    let mut times = Vec::new();
    for turn in 0..41u64 {
        let evs = turn_events(turn + 1, turn * 6, 0);
        let t = Instant::now();
        for e in evs {
            rt().block_on(p.on_event(&session, &binding, e))?;
        }
        // The first turn has no checkpoint yet and reads the chat once; measure the steady state.
        if turn > 0 {
            times.push(t.elapsed());
        }
    }
    Ok(pct(&mut times, 0.5))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = surface(10_000);
    let required: Vec<u64> = vec![9_999, 10_000];
    let input = ProjectionInput {
        nodes,
        required,
        budget: Budget {
            total: 128_000,
            kernel: 2_000,
            reply: 4_000,
            recent_share: 0.6,
        },
        surface_generation: 1,
    };
    let (mut proj, mut copy) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        std::hint::black_box(project(&input));
    }
    for _ in 0..200 {
        let t = Instant::now();
        std::hint::black_box(project(std::hint::black_box(&input)));
        proj.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(std::hint::black_box(&input.nodes).clone());
        copy.push(t.elapsed());
    }
    let included = project(&input).include.len();

    let small = turn_cost(100)?;
    let large = turn_cost(10_000)?;

    println!("| measurement | AgentTavern | reference | ratio / note |");
    println!("|---|---|---|---|");
    let (p50, c50) = (pct(&mut proj, 0.5), pct(&mut copy, 0.5));
    println!("| context projection, 10,000 nodes, p50 | {} | {} (copying the nodes) | {:.1}×; {included} included; target < 1000 µs |", us(p50), us(c50), p50.as_secs_f64() / c50.as_secs_f64());
    println!(
        "| context projection, 10,000 nodes, p99 | {} | {} | - |",
        us(pct(&mut proj, 0.99)),
        us(pct(&mut copy, 0.99))
    );
    println!("| project one turn, chat of 10,000 vs 100 messages (p50) | {} | {} | {:.2}× (target ≤ 2×) |", us(large), us(small), large.as_secs_f64() / small.as_secs_f64());
    Ok(())
}

/// The executor the store's futures run on (one thread: the store moves blocking work to
/// tokio's blocking pool itself).
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("cannot start a tokio runtime: {e}"))
    })
}
