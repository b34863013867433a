//! Properties of ids, revisions, the kernel and mode switching.

use proptest::prelude::*;
use serde_json::{json, Value};
use tavern_core::{
    render_kernel, switch_context_mode, AgentId, AgentTavernCapabilities, BindingTarget,
    CharacterName, ChatId, ContextMode, CoreError, HostFacts, IdentitySummary, KernelInput,
    MemoryId, ModeSwitchRefusal, Revision, SessionBinding, SessionId, Tag, Timestamp, TurnState,
    VariableName, WritePolicy,
};

fn assert_path_safe(s: &str) {
    assert!(
        !s.contains('/') && !s.contains('\\') && !s.contains('\0'),
        "{s:?}"
    );
    assert!(!s.contains(".."), "{s:?}");
    assert!(s != "." && !s.is_empty(), "{s:?}");
}

proptest! {
    #[test]
    fn accepted_ids_never_contain_separators_dotdot_or_nul(s in "\\PC{0,12}|[./\\\\a-z\0 ]{0,12}") {
        // Chat ids are names as users have them (`..draft` is one): no separator, NUL or
        // control character, never `.`/`..` itself; the store encodes the rest.
        if let Ok(id) = ChatId::parse(s.clone()) {
            let v = id.as_str();
            prop_assert!(!v.contains(['/', '\\', '\0']) && !v.chars().any(char::is_control), "{v:?}");
            prop_assert!(v != "." && v != ".." && !v.is_empty(), "{v:?}");
        }
        if let Ok(id) = SessionId::parse(s.clone()) { assert_path_safe(id.as_str()); }
        if let Ok(id) = AgentId::parse(s.clone()) { assert_path_safe(id.as_str()); }
        if let Ok(id) = CharacterName::parse(s.clone()) { assert_path_safe(id.as_str()); }
        if let Ok(id) = MemoryId::parse(s.clone()) { assert_path_safe(id.as_str()); }
        if let Ok(id) = VariableName::parse(s.clone()) {
            prop_assert!(!id.as_str().contains('/') && !id.as_str().contains('\0'));
        }
        if let Ok(t) = Tag::parse(s.clone()) { prop_assert!(!t.as_str().chars().any(char::is_control)); }
    }

    #[test]
    fn parse_errors_name_the_kind(s in "[/\\\\]{1,3}") {
        let err = ChatId::parse(s).unwrap_err().to_string();
        prop_assert!(err.starts_with("invalid chat id"));
    }

    #[test]
    fn revisions_are_stable_and_sensitive(
        keys in prop::collection::btree_map("[a-z]{1,3}", any::<i32>(), 1..6),
        bump in any::<usize>(),
    ) {
        let v: Value = keys.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>().into();
        let reversed: Value = keys.iter().rev().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>().into();
        let r1 = Revision::compute("t", None, &v);
        prop_assert_eq!(&r1, &Revision::compute("t", None, &reversed));
        prop_assert_eq!(Revision::parse(r1.as_str().to_owned()).unwrap(), r1.clone());
        let key = keys.keys().nth(bump % keys.len()).unwrap().clone();
        let mut changed = v.clone();
        changed[&key] = json!(i64::from(keys[&key]) + 1);
        prop_assert_ne!(r1.clone(), Revision::compute("t", None, &changed));
        prop_assert_ne!(r1.clone(), Revision::compute("u", None, &v));
        prop_assert_ne!(r1.clone(), Revision::compute("t", Some(&r1), &v));
    }

    #[test]
    fn kernel_is_byte_identical_for_identical_input(
        user in "\\PC{0,40}", persona in prop::option::of("\\PC{0,400}"), desc in "\\PC{0,400}",
        global in any::<bool>(), forget in any::<bool>(),
    ) {
        let make = || KernelInput {
            character: CharacterName::parse("Mira").unwrap(),
            identity: IdentitySummary::from_card(&json!({"name": "Mira", "description": desc.clone()})),
            user_name: user.clone(),
            persona_summary: persona.clone(),
            session: SessionId::parse("s1").unwrap(),
            binding: binding(),
            tools: vec!["memory_search".into()],
            policy: WritePolicy { allow_global_writes: global, require_forget_confirmation: forget, require_cross_character_confirmation: true },
        };
        let a = render_kernel(&make());
        let b = render_kernel(&make());
        prop_assert_eq!(a.as_bytes(), b.as_bytes());
        prop_assert!(a.chars().count() < 4000, "kernel stays small");
    }
}

fn binding() -> SessionBinding {
    SessionBinding::AgentTavern {
        target: BindingTarget {
            character: CharacterName::parse("Mira").unwrap(),
            chat_id: ChatId::parse("Mira 1").unwrap(),
            group: false,
        },
        context_mode: ContextMode::DshNative,
    }
}

fn refusal(
    r: Result<(SessionBinding, tavern_core::ContextModeEvent), CoreError>,
) -> ModeSwitchRefusal {
    match r {
        Err(CoreError::ModeSwitchRefused { reason, .. }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn mode_switch_refusals_each_say_which_rule() {
    let s = SessionId::parse("s1").unwrap();
    let rc6 = AgentTavernCapabilities::from_host(&HostFacts::bare("dsh 0.1.0-rc.6"));
    let seam = AgentTavernCapabilities::from_host(&HostFacts {
        host: "fake".into(),
        agent_context_seam: true,
        projection_aware_compaction: true,
        session_compaction_suppression: false,
    });
    let st = SessionBinding::St {
        target: binding().target().clone(),
    };
    let now = Timestamp(5);

    assert_eq!(
        refusal(switch_context_mode(
            &s,
            &st,
            ContextMode::AgentManaged,
            TurnState::Idle,
            &seam,
            now
        )),
        ModeSwitchRefusal::NotAgentTavern
    );
    assert_eq!(
        refusal(switch_context_mode(
            &s,
            &binding(),
            ContextMode::AgentManaged,
            TurnState::Running,
            &seam,
            now
        )),
        ModeSwitchRefusal::AgentBusy
    );
    let ModeSwitchRefusal::Unavailable { mode, reason } = refusal(switch_context_mode(
        &s,
        &binding(),
        ContextMode::AgentManaged,
        TurnState::Idle,
        &rc6,
        now,
    )) else {
        panic!("expected unavailable");
    };
    assert_eq!(mode, ContextMode::AgentManaged);
    assert!(reason.contains("no agent/context seam"));
    assert_eq!(
        refusal(switch_context_mode(
            &s,
            &binding(),
            ContextMode::DshNative,
            TurnState::Idle,
            &rc6,
            now
        )),
        ModeSwitchRefusal::AlreadyInMode(ContextMode::DshNative)
    );
    let err = switch_context_mode(
        &s,
        &binding(),
        ContextMode::AgentManaged,
        TurnState::Idle,
        &rc6,
        now,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "context mode switch refused for session s1: agent-managed is unavailable: dsh 0.1.0-rc.6 has no agent/context seam, so per-request history projection is impossible"
    );

    let (next, event) = switch_context_mode(
        &s,
        &binding(),
        ContextMode::AgentManaged,
        TurnState::Idle,
        &seam,
        now,
    )
    .unwrap();
    assert_eq!(next.context_mode(), Some(ContextMode::AgentManaged));
    assert_eq!(next.target(), binding().target());
    assert_eq!(
        (event.from, event.to, event.at),
        (ContextMode::DshNative, ContextMode::AgentManaged, now)
    );
    assert_eq!(
        tavern_core::ContextModeEvent::EVENT_TYPE,
        "agent-tavern/context-mode"
    );
}
