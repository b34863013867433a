//! Prints a normalized binding and the kernel contract for the bundled sample card.

use std::error::Error;

use serde_json::{json, Value};
use tavern_core::{
    normalize_state, render_kernel, CharacterName, IdentitySummary, KernelInput, SessionId,
    WritePolicy,
};

fn main() -> Result<(), Box<dyn Error>> {
    let card: Value = serde_json::from_str(include_str!("../../assets/Mira.card.json"))?;
    // A legacy dsh-tavern state: one old binding (no architecture) and one AgentTavern binding
    // written before context modes existed.
    let legacy = json!({
        "sessionBindings": {
            "old-session": {"character": "Mira", "chatId": "Mira - 2024-01-01"},
            "new-session": {"character": "Mira", "chatId": "Mira - 2026-11-30", "architecture": "agent-tavern"}
        }
    });
    let (state, diagnostics) = normalize_state(&legacy);
    println!(
        "normalized state:\n{}",
        serde_json::to_string_pretty(&state.to_json())?
    );
    for d in &diagnostics {
        println!("diagnostic {}: {}", d.path, d.message);
    }

    let session = SessionId::parse("new-session")?;
    let binding = state
        .binding(&session)
        .ok_or("the sample state binds new-session")?
        .clone();
    let kernel = render_kernel(&KernelInput {
        character: CharacterName::parse("Mira")?,
        identity: IdentitySummary::from_card(&card),
        user_name: "Kai".into(),
        persona_summary: Some("A traveler carrying a cracked compass.".into()),
        session,
        binding,
        tools: vec![
            "tavern_lore_search".into(),
            "memory_search".into(),
            "memory_write".into(),
        ],
        policy: WritePolicy::from_state(&state),
    });
    println!("\nkernel:\n{kernel}");
    Ok(())
}
