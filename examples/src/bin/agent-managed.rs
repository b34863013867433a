//! `agent-managed` on a host that has the `agent/context` seam: the mode switch is accepted,
//! every request is projected within the model's window, each projection is logged as
//! `request/projection`, and the chat keeps every line. On DSH rc.6 (no seam) the same switch
//! is refused with the reason.

use std::error::Error;

use tavern_core::{AgentId, CharacterName, ChatId, ContextMode, HostFacts, SessionId};
use tavern_dsh_adapter::fake::ModelStep;
use tavern_examples::{fresh_data_dir, World};
use tavern_store::ChatStore;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let rc6 = World::open(
        &fresh_data_dir("agent-managed-rc6")?,
        tavern_dsh_adapter::dsh::rc6_facts(),
    )?;
    let s = SessionId::parse("managed-1")?;
    let (mira, chat) = (
        CharacterName::parse("Mira")?,
        ChatId::parse("Mira - managed")?,
    );
    rc6.runtime.new_chat(&s, &mira, &chat, false).await?;
    rc6.host
        .create_agent(&rc6.runtime, &AgentId::parse(s.as_str())?)
        .await?;
    match rc6.runtime.switch_mode(&s, ContextMode::AgentManaged).await {
        Ok(_) => return Err("rc.6 has no agent/context seam; the switch must be refused".into()),
        Err(e) => println!("on dsh rc.6: {e}"),
    }

    let facts = HostFacts {
        host: "a host with agent/context".into(),
        agent_context_seam: true,
        projection_aware_compaction: true,
        session_compaction_suppression: false,
    };
    let w = World::open(&fresh_data_dir("agent-managed")?, facts)?;
    w.runtime.new_chat(&s, &mira, &chat, false).await?;
    let agent = AgentId::parse(s.as_str())?;
    w.host.create_agent(&w.runtime, &agent).await?;
    let b = w.runtime.switch_mode(&s, ContextMode::AgentManaged).await?;
    println!(
        "with the seam: switched to {}",
        b.context_mode().map_or("-", |m| m.as_str())
    );
    w.host.set_context_window(2_000);
    for i in 1..=6 {
        w.host.script([ModelStep::Reply(format!(
            "Reply {i}: {}",
            "the lanterns sway in the wind, ".repeat(8)
        ))]);
        w.host
            .run_turn(
                &w.runtime,
                &agent,
                &format!("Message {i}: {}", "tell me more about the gate, ".repeat(8)),
            )
            .await?;
        let req = w.host.requests().pop().ok_or("a request")?;
        let projection = match &req.projection {
            Some(seqs) => format!("the projection chose {} logged event(s)", seqs.len()),
            None => "no projection ran".to_string(),
        };
        println!(
            "turn {i}: window {} tokens, {} message(s) sent, {projection}",
            req.context_window,
            req.messages.len(),
        );
    }
    let logged = w
        .host
        .log(&s)
        .iter()
        .filter(|e| e["type"] == "request/projection")
        .count();
    let lines = w
        .store
        .read_chat(&mira, &chat)
        .await?
        .ok_or("chat")?
        .lines
        .len()
        - 1;
    println!("request/projection events logged: {logged}; chat lines kept: {lines}");
    Ok(())
}
