//! The main example: a single-character AgentTavern session on the fake AgentLoop, on the
//! embedded file store in `examples/data/tavern-session/` (emptied at the start of each run).
//!
//! Over four turns the scripted model searches lore, writes and updates a memory, sets and
//! patches variables, and hits and recovers from a revision conflict; the chat is projected to
//! SillyTavern JSONL. Then the runtime is restarted, the session resumed and a fifth turn
//! played. A summary shows that nothing was lost or duplicated.

use std::collections::HashSet;
use std::error::Error;

use serde_json::{json, Value};
use tavern_core::{AgentId, CharacterName, ChatId, SessionId};
use tavern_dsh_adapter::fake::{ModelRequest, ModelStep, ToolCallPlan, TurnReport};
use tavern_examples::{fresh_data_dir, World};
use tavern_store::{
    ChatStore, CheckpointStatus, CheckpointStore, MemoryQuery, MemoryStore, VariableStore,
};

const SESSION: &str = "mira-session-1";
const CHAT: &str = "Mira - 2026-11-30@20h00m00s";

fn show(report: &TurnReport, user: &str) {
    println!("\n── turn {} ──", report.turn);
    println!("Kai:  {user}");
    for r in &report.tool_results {
        let brief = match r.get("error") {
            Some(e) => format!(
                "error {} ({})",
                e["code"].as_str().unwrap_or("?"),
                e["message"].as_str().unwrap_or("")
            ),
            None => {
                let s = r.to_string();
                if s.chars().count() > 110 {
                    format!("{}…", s.chars().take(110).collect::<String>())
                } else {
                    s
                }
            }
        };
        println!("      tool → {brief}");
    }
    println!("Mira: {}", report.reply.as_deref().unwrap_or("(no reply)"));
}

/// The revision of the newest tool result that set variable `name`.
fn revision_of(req: &ModelRequest, name: &str) -> Value {
    req.tool_results()
        .iter()
        .rev()
        .find(|r| r["name"] == name)
        .map(|r| r["revision"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = fresh_data_dir("tavern-session")?;
    println!("AgentTavern main example — data in {}", dir.display());
    println!(
        "The model here is scripted: no model is called. Each turn plays tool calls and a reply\n\
         written in this example, so every run shows the same memories, variables, a revision\n\
         conflict and its recovery. With DSH, the same tools are offered to a real model."
    );
    let session = SessionId::parse(SESSION)?;
    let agent = AgentId::parse(SESSION)?;
    let mira = CharacterName::parse("Mira")?;
    let chat = ChatId::parse(CHAT)?;

    {
        let w = World::open(&dir, tavern_dsh_adapter::dsh::rc6_facts())?;
        let binding = w.runtime.new_chat(&session, &mira, &chat, false).await?;
        println!(
            "binding: {} / {}",
            binding.architecture(),
            binding.context_mode().map_or("-", |m| m.as_str())
        );
        w.host.create_agent(&w.runtime, &agent).await?;

        let user = "Good evening. I'm Kai — is this the Silver Gate?";
        w.host.script([
            ModelStep::Tools(vec![ToolCallPlan::new("tavern_lore_search", json!({"query": "silver gate"}))]),
            ModelStep::Tools(vec![ToolCallPlan::new("memory_write", json!({"content": "Kai arrived at the Silver Gate at dusk.", "kind": "episodic", "tags": ["arrival"]}))]),
            ModelStep::Reply("It is. The gate closes at moonrise — you made it just in time, Kai.".into()),
        ]);
        show(&w.host.run_turn(&w.runtime, &agent, user).await?, user);

        let user = "I'm afraid of the river spirits.";
        w.host.script([
            ModelStep::Tools(vec![
                ToolCallPlan::new("memory_write", json!({"content": "Kai fears the river spirits.", "importance": 0.8, "tags": ["fear"]})),
                ToolCallPlan::new("variable_set", json!({"name": "trust", "value": 1})),
                ToolCallPlan::new("variable_set", json!({"name": "当前周期", "value": {"day": 1, "phase": "dusk"}})),
            ]),
            ModelStep::Reply("Then stay near the lantern. The spirits never cross its light.".into()),
        ]);
        show(&w.host.run_turn(&w.runtime, &agent, user).await?, user);

        let user = "Do you remember what I fear?";
        w.host.script([
            ModelStep::Tools(vec![ToolCallPlan::new("memory_search", json!({"query": "fear river spirits", "limit": 3}))]),
            ModelStep::ToolsWith(Box::new(|req: &ModelRequest| {
                let hit = req.tool_results().last().map(|r| r["items"][0].clone()).unwrap_or(Value::Null);
                vec![ToolCallPlan::new("memory_update", json!({"id": hit["id"], "revision": hit["revision"], "content": "Kai fears the river spirits, but trusts Mira's lantern."}))]
            })),
            ModelStep::Reply("The river spirits. But you trust my lantern now, I think.".into()),
        ]);
        show(&w.host.run_turn(&w.runtime, &agent, user).await?, user);

        let user = "Then let me help you light the lamps.";
        w.host.script([
            // Raise trust with the revision read in turn 2 …
            ModelStep::ToolsWith(Box::new(|req: &ModelRequest| vec![ToolCallPlan::new("variable_set", json!({"name": "trust", "value": 2, "revision": revision_of(req, "trust")}))])),
            // … then patch with a revision that is now stale: a conflict naming the current one.
            ModelStep::ToolsWith(Box::new(|req: &ModelRequest| {
                let stale = req.tool_results().iter().find(|r| r["name"] == "trust").map(|r| r["revision"].clone()).unwrap_or(Value::Null);
                vec![ToolCallPlan::new("variable_patch", json!({"changes": [{"name": "trust", "value": 3, "revision": stale}, {"name": "lamps_lit", "value": true}]}))]
            })),
            // Recover: read the current revision and retry.
            ModelStep::Tools(vec![ToolCallPlan::new("variable_get", json!({"name": "trust"}))]),
            ModelStep::ToolsWith(Box::new(|req: &ModelRequest| {
                let current = req.tool_results().last().map(|r| r["revision"].clone()).unwrap_or(Value::Null);
                vec![ToolCallPlan::new("variable_patch", json!({"changes": [{"name": "trust", "value": 3, "revision": current}, {"name": "lamps_lit", "value": true}]}))]
            })),
            ModelStep::Reply("Thank you. Hold the taper steady — there, the first lamp is lit.".into()),
        ]);
        show(&w.host.run_turn(&w.runtime, &agent, user).await?, user);
        println!("\n(the runtime, host and store are dropped: a restart)");
    }

    let w = World::open(&dir, tavern_dsh_adapter::dsh::rc6_facts())?;
    w.host.create_agent(&w.runtime, &agent).await?;
    let resumed = w.runtime.resume(&session).await?;
    println!(
        "resumed from the checkpoint: {} line(s) re-projected",
        resumed.map_or(0, |o| o.appended)
    );
    let user = "Good night, Mira.";
    w.host.script([
        ModelStep::Tools(vec![ToolCallPlan::new(
            "memory_search",
            json!({"query": "Kai"}),
        )]),
        ModelStep::Reply("Good night, Kai. I will remember you came at dusk.".into()),
    ]);
    show(&w.host.run_turn(&w.runtime, &agent, user).await?, user);

    // ── summary ────────────────────────────────────────────────────────────────────
    let file = w
        .store
        .read_chat(&mira, &chat)
        .await?
        .ok_or("the chat exists")?;
    let mut keys = HashSet::new();
    let mut duplicates = 0;
    println!(
        "\n── SillyTavern chat ({} lines incl. header) ──",
        file.lines.len()
    );
    for line in file.lines.iter().skip(1) {
        if let Some(seq) = line
            .extra()
            .and_then(|e| e.get("agentTavern"))
            .and_then(|at| at.get("eventSeq"))
            .and_then(Value::as_u64)
        {
            if !keys.insert(seq) {
                duplicates += 1;
            }
        }
        println!(
            "{:>5}: {}",
            line.name().unwrap_or("?"),
            line.text().chars().take(70).collect::<String>()
        );
    }
    let chat_scope = tavern_core::ScopeKey::Chat {
        character: mira.clone(),
        chat: chat.clone(),
    };
    let memories = w
        .store
        .search(&MemoryQuery::new("", vec![chat_scope.clone()]))
        .await?;
    println!("\n── memories ({}) ──", memories.source_count);
    for h in &memories.hits {
        println!(
            "  {} [{}] {}",
            h.record.id, h.record.revision, h.record.content
        );
    }
    let vars = w.store.list(&chat_scope, "", 20).await?;
    println!("── variables ({}) ──", vars.total);
    for v in &vars.items {
        println!("  {} = {}", v.name, v.preview);
    }
    let cp = w
        .store
        .load_checkpoint(&session)
        .await?
        .ok_or("a checkpoint exists")?;
    let log = w.host.log(&session);
    println!("── summary ──");
    println!(
        "  host log: {} events, turns: {}",
        log.len(),
        log.iter().filter(|e| e["type"] == "turn/start").count()
    );
    let projection = match (cp.status, cp.last_cursor, cp.pending_cursor) {
        (CheckpointStatus::Ok, Some(last), _) => {
            format!("up to date (host events 0 to {last} are in the chat)")
        }
        (CheckpointStatus::Ok, None, _) => "up to date (no host event yet)".to_string(),
        (_, _, pending) => format!(
            "waiting at host event {} (a replay of the host's log fills it)",
            pending.map_or_else(|| "?".to_string(), |p| p.to_string())
        ),
    };
    println!("  projection: {projection}");
    println!(
        "  projected lines: {} (duplicates: {duplicates})",
        keys.len()
    );
    if duplicates > 0 || keys.len() != 10 {
        return Err(format!(
            "expected 10 projected lines and no duplicates, got {} and {duplicates}",
            keys.len()
        )
        .into());
    }
    println!("  ok: 5 turns, 10 projected lines, nothing lost or duplicated across the restart");
    Ok(())
}
