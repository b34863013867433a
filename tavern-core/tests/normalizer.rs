//! Data-driven normalizer cases (`data/normalizer_cases.json`) and normalizer properties.

use proptest::prelude::*;
use serde_json::{json, Value};
use tavern_core::{
    normalize_state, BindingTarget, CharacterName, ChatId, ContextMode, SessionBinding, SessionId,
    TavernArchitecture, TavernState,
};

#[test]
fn every_documented_rule_holds() {
    let cases: Vec<Value> =
        serde_json::from_str(include_str!("data/normalizer_cases.json")).unwrap();
    assert!(cases.len() >= 12);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let (state, diags) = normalize_state(&case["input"]);
        let out = state.to_json();
        assert_eq!(
            out["sessionBindings"], case["expect"],
            "case {name}: bindings"
        );
        let got: Vec<String> = diags
            .iter()
            .map(|d| format!("{}: {}", d.path, d.message))
            .collect();
        let want: Vec<String> = case["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_owned())
            .collect();
        assert_eq!(got, want, "case {name}: diagnostics");
        if let Some(extra) = case.get("expectExtra") {
            for (k, v) in extra.as_object().unwrap() {
                assert_eq!(&out[k], v, "case {name}: extra field {k}");
            }
        }
        let (again, diags2) = normalize_state(&out);
        assert_eq!(again, state, "case {name}: idempotent");
        assert!(
            diags2.is_empty(),
            "case {name}: second pass is clean: {diags2:?}"
        );
    }
}

#[test]
fn defaults_affect_only_new_sessions_and_groups_are_st() {
    let legacy = json!({"sessionBindings": {"old": {"character": "A", "chatId": "c"}}});
    let (mut state, _) = normalize_state(&legacy);
    assert_eq!(state.default_architecture, TavernArchitecture::AgentTavern);
    assert_eq!(state.default_context_mode, ContextMode::DshNative);
    let old = SessionId::parse("old").unwrap();
    assert_eq!(
        state.binding(&old).unwrap().architecture(),
        TavernArchitecture::St
    );

    let target = |group| BindingTarget {
        character: CharacterName::parse("A").unwrap(),
        chat_id: ChatId::parse("new").unwrap(),
        group,
    };
    let fresh = SessionBinding::new_for_chat(target(false), &state);
    assert_eq!(fresh.architecture(), TavernArchitecture::AgentTavern);
    assert_eq!(fresh.context_mode(), Some(ContextMode::DshNative));
    assert_eq!(
        SessionBinding::new_for_chat(target(true), &state).architecture(),
        TavernArchitecture::St
    );
    state.set_binding(SessionId::parse("new").unwrap(), fresh);
    assert_eq!(
        state.binding(&old).unwrap().architecture(),
        TavernArchitecture::St
    );
}

#[test]
fn renaming_a_chat_keeps_architecture_and_mode() {
    let input = json!({"sessionBindings": {
        "s1": {"character": "A", "chatId": "c", "architecture": "agent-tavern", "contextMode": "agent-managed", "x": 1},
        "s2": {"character": "B", "chatId": "c", "architecture": "st"}
    }});
    let (mut state, _) = normalize_state(&input);
    let changed = state.rename_chat(
        &CharacterName::parse("A").unwrap(),
        &ChatId::parse("c").unwrap(),
        &ChatId::parse("c2").unwrap(),
    );
    assert_eq!(changed, 1);
    let out = state.to_json();
    assert_eq!(
        out["sessionBindings"]["s1"],
        json!({"character": "A", "chatId": "c2", "architecture": "agent-tavern", "contextMode": "agent-managed", "x": 1})
    );
    assert_eq!(out["sessionBindings"]["s2"]["chatId"], "c");
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-z -]{0,8}".prop_map(Value::from),
        prop_oneof![
            Just("st"),
            Just("agent-tavern"),
            Just("dsh-native"),
            Just("agent-managed"),
            Just("A"),
            Just(" ")
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("character".to_owned()),
                    Just("chatId".to_owned()),
                    Just("group".to_owned()),
                    Just("architecture".to_owned()),
                    Just("contextMode".to_owned()),
                    Just("sessionBindings".to_owned()),
                    Just("defaultArchitecture".to_owned()),
                    "[a-z./]{1,5}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_binding() -> impl Strategy<Value = Value> {
    (
        prop::option::of(prop_oneof![
            Just(json!("Seraphina")),
            Just(json!("  ")),
            Just(json!("门之主")),
            Just(json!(7))
        ]),
        prop::option::of(prop_oneof![
            Just(json!("chat 1")),
            Just(json!("../x")),
            Just(json!(""))
        ]),
        prop::option::of(prop_oneof![
            Just(json!(true)),
            Just(json!(false)),
            Just(json!("x"))
        ]),
        prop::option::of(prop_oneof![
            Just(json!("st")),
            Just(json!("agent-tavern")),
            Just(json!("?"))
        ]),
        prop::option::of(prop_oneof![
            Just(json!("dsh-native")),
            Just(json!("agent-managed")),
            Just(json!(null)),
            Just(json!(1))
        ]),
        prop::option::of(arb_json()),
    )
        .prop_map(|(c, chat, g, a, m, extra)| {
            let mut o = serde_json::Map::new();
            for (k, v) in [
                ("character", c),
                ("chatId", chat),
                ("group", g),
                ("architecture", a),
                ("contextMode", m),
                ("note", extra),
            ] {
                if let Some(v) = v {
                    o.insert(k.into(), v);
                }
            }
            Value::Object(o)
        })
}

fn check_idempotent(input: &Value) -> TavernState {
    let (state, _) = normalize_state(input);
    let (again, diags) = normalize_state(&state.to_json());
    assert_eq!(again, state);
    assert!(diags.is_empty(), "{diags:?}");
    state
}

proptest! {
    #[test]
    fn arbitrary_json_never_panics_and_normalizes_idempotently(v in arb_json()) {
        check_idempotent(&v);
    }

    #[test]
    fn binding_shaped_json_normalizes_idempotently(
        bindings in prop::collection::btree_map("[a-z0-9.]{1,4}", arb_binding(), 0..5),
        default_arch in prop::option::of(prop_oneof![Just(json!("st")), Just(json!("agent-tavern")), Just(json!(0))]),
    ) {
        let mut o = serde_json::Map::new();
        o.insert("sessionBindings".into(), Value::Object(bindings.into_iter().collect()));
        if let Some(a) = default_arch { o.insert("defaultArchitecture".into(), a); }
        let state = check_idempotent(&Value::Object(o));
        for entry in state.bindings.values() {
            // No group binding is agent-tavern, no st binding has a mode.
            let b = &entry.binding;
            prop_assert!(!(b.target().group && b.architecture() == TavernArchitecture::AgentTavern));
            prop_assert_eq!(b.context_mode().is_some(), b.architecture() == TavernArchitecture::AgentTavern);
        }
    }
}

/// The operator's change log: readable entries kept (the newest `MAX_STATE_CHANGES`), an
/// unreadable one dropped with a diagnostic naming it, a log that is not a list ignored — and
/// what comes out normalizes to itself.
#[test]
fn the_change_log_keeps_the_newest_readable_changes() {
    let change = |i: usize| {
        json!({"at": 1_700_000_000_000_i64 + i as i64, "what": format!("change {i}"),
               "session": "s1", "source": {"kind": "user"}})
    };
    let per = tavern_core::MAX_CHANGES_PER_SUBJECT;
    let mut items: Vec<Value> = (0..per + 5).map(change).collect();
    items.insert(3, json!({"what": "no time, no source"}));
    items.insert(4, json!({"what": "x".repeat(100_000)}));
    let (state, diags) = normalize_state(&json!({"changes": items}));
    assert_eq!(
        state.changes.len(),
        per,
        "one session keeps its newest {per}"
    );
    assert_eq!(state.changes[0].what, "change 5", "the oldest went first");
    let last = format!("change {}", per + 4);
    assert_eq!(state.changes.last().unwrap().what, last);
    assert_eq!(diags.len(), 2, "{diags:?}");
    assert_eq!(diags[0].path, "/changes/3");
    assert_eq!(diags[1].message, "1 more unreadable changes dropped");
    assert!(diags.iter().all(|d| d.message.len() < 400), "{diags:?}");
    let session = SessionId::parse("s1").unwrap();
    assert_eq!(state.changes_of(&session).count(), state.changes.len());
    check_idempotent(&state.to_json());
    let (ignored, diags) = normalize_state(&json!({"changes": {"what": "x"}}));
    assert!(ignored.changes.is_empty());
    assert_eq!(diags[0].path, "/changes");
    // Many sessions: each keeps its own newest, the whole log stays within its bound, and a
    // busy session does not push the settings' changes out.
    let mut many = TavernState::default();
    let settings: tavern_core::StateChange =
        serde_json::from_value(json!({"at": 1, "what": "settings", "source": {"kind": "user"}}))
            .unwrap();
    many.record_change(settings);
    for i in 0..1000 {
        let mut c: tavern_core::StateChange = serde_json::from_value(change(i)).unwrap();
        c.session = Some(SessionId::parse(format!("s{}", i % 5)).unwrap());
        many.record_change(c);
    }
    assert_eq!(many.changes.len(), 1 + 5 * per);
    assert!(many.changes.iter().any(|c| c.what == "settings"));
    for i in 0..1000 {
        let mut c: tavern_core::StateChange = serde_json::from_value(change(i)).unwrap();
        c.session = Some(SessionId::parse(format!("t{i}")).unwrap());
        many.record_change(c);
    }
    assert_eq!(many.changes.len(), tavern_core::MAX_STATE_CHANGES);
    // A very long description is cut, so one change cannot grow the state without bound.
    let mut state = TavernState::default();
    let mut long: tavern_core::StateChange = serde_json::from_value(change(1)).unwrap();
    long.what = "字".repeat(10_000);
    state.record_change(long);
    assert_eq!(state.changes[0].what.chars().count(), 300);
}
