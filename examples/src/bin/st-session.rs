//! An `st` session is left untouched: AgentTavern mounts no preset, kernel or tools on it,
//! projects none of its events, and lets SillyTavern-only actions through.

use std::error::Error;

use tavern_core::{AgentId, CharacterName, ChatId, SessionId, TavernArchitecture, TavernState};
use tavern_dsh_adapter::fake::ModelStep;
use tavern_dsh_adapter::{MountDecision, StAction};
use tavern_examples::{fresh_data_dir, World};
use tavern_store::{ChatStore, StateStoreExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let dir = fresh_data_dir("st-session")?;
    let w = World::open(&dir, tavern_dsh_adapter::dsh::rc6_facts())?;
    // This user keeps new chats on the SillyTavern pipeline.
    w.store
        .update(|s: &mut TavernState| {
            s.default_architecture = TavernArchitecture::St;
            Ok::<_, tavern_store::StoreError>(())
        })
        .await?;
    let session = SessionId::parse("st-session-1")?;
    let (mira, chat) = (CharacterName::parse("Mira")?, ChatId::parse("Mira - st")?);
    let binding = w.runtime.new_chat(&session, &mira, &chat, false).await?;
    let agent = AgentId::parse(session.as_str())?;
    let decision = w.host.create_agent(&w.runtime, &agent).await?;
    let mounted = match decision {
        MountDecision::Mounted => "AgentTavern mounted its kernel and tools",
        MountDecision::Untouched => "AgentTavern left the session untouched",
    };
    println!("binding: {}; {mounted}", binding.architecture());
    w.host.script([ModelStep::Reply(
        "(a reply from the host's plain loop)".into(),
    )]);
    w.host.run_turn(&w.runtime, &agent, "hello").await?;
    let request = w.host.requests().pop().ok_or("one request")?;
    println!("tools offered to the model: {}", request.tools.len());
    println!(
        "kernel in the system prompt: {}",
        request.system.contains("AgentTavern")
    );
    println!(
        "chat file written by AgentTavern: {}",
        w.store.read_chat(&mira, &chat).await?.is_some()
    );
    w.runtime.check_st_action(&session, StAction::Swipe).await?;
    println!("swipe allowed for the st session: yes");
    if !request.tools.is_empty() || request.system.contains("AgentTavern") {
        return Err("an st session must see nothing of AgentTavern".into());
    }
    Ok(())
}
