//! The acceptance list on a second host that is not DSH ([`ChatLoopHost`]: its own log, its own
//! agent naming, its own event shape, no DSH type or JSON): binding and mounting, the kernel,
//! tools with identity from the agent, turn variables, projection exactly once, restart and
//! resume, and the context mode read back from the host's log.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use tavern_core::{
    CharacterName, ChatId, ContextMode, HostFacts, SessionBinding, SessionId, TavernArchitecture,
    TavernState,
};
use tavern_examples::chat_loop::{ChatLoopHost, Entry, Reply};
use tavern_runtime::{MountDecision, Runtime, RuntimeConfig};
use tavern_store::fs::FsStore;
use tavern_store::{ChatStore, StateStoreExt, StoreError, SystemClock};

const CONVERSATION: &str = "conv-1";

fn facts() -> HostFacts {
    HostFacts::bare("chat-loop example")
}

/// A host that offers what `agent-managed` needs, to exercise mode switches.
fn seam_facts() -> HostFacts {
    HostFacts {
        host: "chat-loop example with a context seam".into(),
        agent_context_seam: true,
        projection_aware_compaction: true,
        session_compaction_suppression: false,
    }
}

struct World {
    host: Arc<ChatLoopHost>,
    store: Arc<FsStore>,
    runtime: Runtime,
}

impl World {
    /// Opens (or, on the same folder, restarts) the host, the store and the runtime.
    fn open(dir: &Path, facts: HostFacts) -> Self {
        let clock = Arc::new(SystemClock);
        let store = Arc::new(FsStore::open(dir.join("store"), clock.clone()).unwrap());
        let host = Arc::new(ChatLoopHost::open(dir.join("host"), facts).unwrap());
        let config = RuntimeConfig {
            user_name: "Kai".into(),
            ..RuntimeConfig::default()
        };
        let assets = tavern_examples::assets().unwrap();
        let runtime = Runtime::new(host.clone(), store.clone(), assets, clock, config);
        Self {
            host,
            store,
            runtime,
        }
    }

    async fn bind(&self, conversation: &str, chat: &str, group: bool) -> SessionBinding {
        self.runtime
            .new_chat(
                &SessionId::parse(conversation).unwrap(),
                &CharacterName::parse("Mira").unwrap(),
                &ChatId::parse(chat).unwrap(),
                group,
            )
            .await
            .unwrap()
    }

    /// The chat's lines after the header as `(is_user, text)`.
    async fn chat(&self, chat: &str) -> Vec<(bool, String)> {
        let file = self
            .store
            .read_chat(
                &CharacterName::parse("Mira").unwrap(),
                &ChatId::parse(chat).unwrap(),
            )
            .await
            .unwrap()
            .expect("the chat exists");
        file.lines
            .iter()
            .skip(1)
            .map(|l| (l.is_user(), l.text().to_owned()))
            .collect()
    }
}

fn session() -> SessionId {
    SessionId::parse(CONVERSATION).unwrap()
}

#[tokio::test]
async fn a_bound_conversation_is_mounted_and_others_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), facts());
    let binding = w.bind(CONVERSATION, "Mira - first", false).await;
    assert_eq!(binding.architecture(), TavernArchitecture::AgentTavern);
    assert_eq!(
        w.host.start(&w.runtime, CONVERSATION).await.unwrap(),
        MountDecision::Mounted
    );
    let agent = ChatLoopHost::agent(CONVERSATION).unwrap();
    let mount = w.host.mount_of(&agent).expect("mounted");
    assert_eq!(mount.preset, "agent-tavern");
    assert!(mount.tools.iter().any(|t| t.name == "memory_write"));
    let forget = mount
        .tools
        .iter()
        .find(|t| t.name == "memory_forget")
        .unwrap();
    assert!(forget.writes && forget.destructive && !forget.idempotent);

    // A group chat is an `st` session, and an unbound conversation is plain: neither gets
    // anything, and their model sees no AgentTavern tools or prompt.
    w.bind("conv-group", "Mira - group", true).await;
    for plain in ["conv-group", "conv-plain"] {
        assert_eq!(
            w.host.start(&w.runtime, plain).await.unwrap(),
            MountDecision::Untouched,
            "{plain}"
        );
        assert!(w
            .host
            .mount_of(&ChatLoopHost::agent(plain).unwrap())
            .is_none());
        w.host.script([Reply::Say("plain reply".into())]);
        w.host.run_turn(&w.runtime, plain, "hello").await.unwrap();
        let request = w.host.requests().pop().unwrap();
        assert!(
            request.tools.is_empty() && request.system.is_empty(),
            "{request:?}"
        );
    }
}

#[tokio::test]
async fn the_model_sees_the_kernel_and_calls_tools_as_its_own_agent() {
    let dir = tempfile::tempdir().unwrap();
    let w = World::open(dir.path(), facts());
    w.bind(CONVERSATION, "Mira - first", false).await;
    w.host.start(&w.runtime, CONVERSATION).await.unwrap();
    w.host.script([
        Reply::Use(vec![
            (
                "memory_write".into(),
                json!({"content": "Kai carries a cracked compass", "scope": "character"}),
            ),
            (
                "variable_set".into(),
                json!({"name": "mood", "value": "wary", "scope": "turn"}),
            ),
        ]),
        Reply::Use(vec![
            ("memory_search".into(), json!({"query": "compass"})),
            (
                "variable_get".into(),
                json!({"name": "mood", "scope": "turn"}),
            ),
        ]),
        Reply::Say("*Mira eyes the compass.* \"Still pointing home?\"".into()),
    ]);
    let reply = w
        .host
        .run_turn(&w.runtime, CONVERSATION, "I show her my compass.")
        .await
        .unwrap();
    assert!(reply.contains("Still pointing home"));

    let requests = w.host.requests();
    let first = &requests[0];
    // The kernel names the character and the tools; the persona section comes first.
    assert!(first.system.contains("Mira"), "{}", first.system);
    assert!(first.system.contains("memory_search"), "{}", first.system);
    assert!(first.tools.contains(&"tavern_history_search".to_owned()));
    // The greeting was logged in this host's own log and is the model's first message.
    assert_eq!(first.messages[0].0, "assistant");
    assert!(first.messages[0].1.contains("The gate closes at moonrise"));

    // Tool results: the write landed in the character's scope, found by the search; the turn
    // variable was visible within the turn.
    let outputs: Vec<Value> = w
        .host
        .log(&session())
        .into_iter()
        .filter_map(|e| match e {
            Entry::ToolOutput { output, .. } => Some(output),
            _ => None,
        })
        .collect();
    assert_eq!(outputs.len(), 4, "{outputs:?}");
    assert!(outputs[0].get("error").is_none(), "{}", outputs[0]);
    assert!(
        outputs[2].to_string().contains("cracked compass"),
        "{}",
        outputs[2]
    );
    assert_eq!(outputs[3]["value"], "wary", "{}", outputs[3]);

    // The turn's end cleared the turn variable.
    w.host.script([
        Reply::Use(vec![(
            "variable_get".into(),
            json!({"name": "mood", "scope": "turn"}),
        )]),
        Reply::Say("Hm.".into()),
    ]);
    w.host
        .run_turn(&w.runtime, CONVERSATION, "And now?")
        .await
        .unwrap();
    let last_output = w
        .host
        .log(&session())
        .into_iter()
        .rev()
        .find_map(|e| match e {
            Entry::ToolOutput { output, .. } => Some(output),
            _ => None,
        })
        .unwrap();
    assert!(
        last_output.get("value").is_none_or(Value::is_null),
        "turn variables outlive their turn: {last_output}"
    );
}

#[tokio::test]
async fn the_chat_gets_each_message_once_across_repeats_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let w = World::open(dir.path(), facts());
        w.bind(CONVERSATION, "Mira - first", false).await;
        w.host.start(&w.runtime, CONVERSATION).await.unwrap();
        w.host.script([
            Reply::Use(vec![("tavern_character_get".into(), json!({}))]),
            Reply::Say("First answer.".into()),
        ]);
        w.host
            .run_turn(&w.runtime, CONVERSATION, "First question.")
            .await
            .unwrap();
        // The host repeats every event it ever logged (a reconnecting host does): nothing is
        // written twice.
        for entry in w.runtime.resume(&session()).await.unwrap().into_iter() {
            assert_eq!(entry.appended, 0);
        }
        // Then it logs a whole turn and crashes before telling the runtime.
        w.host.set_delivery(false);
        w.host.script([Reply::Say("Second answer.".into())]);
        w.host
            .run_turn(&w.runtime, CONVERSATION, "Second question.")
            .await
            .unwrap();
    }
    let w = World::open(dir.path(), facts());
    // Starting the agent again catches up from this host's log.
    assert_eq!(
        w.host.start(&w.runtime, CONVERSATION).await.unwrap(),
        MountDecision::Mounted
    );
    w.host.script([Reply::Say("Third answer.".into())]);
    w.host
        .run_turn(&w.runtime, CONVERSATION, "Third question.")
        .await
        .unwrap();
    let again = w.runtime.resume(&session()).await.unwrap().unwrap();
    assert_eq!(again.appended, 0, "a replay after the fact adds nothing");
    let chat = w.chat("Mira - first").await;
    let expected: Vec<(bool, String)> = vec![
        (
            false,
            "*The lantern flickers as you approach.* \"Late for a traveler, Kai. The gate closes at moonrise.\"".into(),
        ),
        (true, "First question.".into()),
        (false, "First answer.".into()),
        (true, "Second question.".into()),
        (false, "Second answer.".into()),
        (true, "Third question.".into()),
        (false, "Third answer.".into()),
    ];
    // The greeting is written with its macros substituted, as SillyTavern saves it (#29).
    assert_eq!(chat, expected, "{chat:#?}");
}

#[tokio::test]
async fn the_context_mode_follows_the_hosts_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let w = World::open(dir.path(), facts());
        w.bind(CONVERSATION, "Mira - first", false).await;
        w.host.start(&w.runtime, CONVERSATION).await.unwrap();
        // This host has no context seam: agent-managed is refused with the reason.
        let refused = w
            .runtime
            .switch_mode(&session(), ContextMode::AgentManaged)
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("agent-managed"), "{refused}");
    }
    let w = World::open(dir.path(), seam_facts());
    w.host.start(&w.runtime, CONVERSATION).await.unwrap();
    let switched = w
        .runtime
        .switch_mode(&session(), ContextMode::AgentManaged)
        .await
        .unwrap();
    assert_eq!(switched.context_mode(), Some(ContextMode::AgentManaged));
    assert!(w.host.log(&session()).iter().any(
        |e| matches!(e, Entry::PluginNote { name, .. } if name == "agent-tavern/context-mode")
    ));
    // The saved binding is lost (a crash between log and save): the log wins at the next start.
    w.store
        .update(|state: &mut TavernState| {
            let b = state.binding(&session()).cloned().unwrap();
            state.set_binding(
                session(),
                SessionBinding::AgentTavern {
                    target: b.target().clone(),
                    context_mode: ContextMode::DshNative,
                },
            );
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    w.host.start(&w.runtime, CONVERSATION).await.unwrap();
    let state = w.runtime.state().await.unwrap();
    assert_eq!(
        state.binding(&session()).unwrap().context_mode(),
        Some(ContextMode::AgentManaged)
    );
}

#[test]
fn the_second_host_knows_nothing_of_dsh() {
    let source = include_str!("../src/chat_loop.rs");
    for word in ["tavern_dsh_adapter", "dsh::", "\"type\"", "\"seq\""] {
        assert!(
            !source.contains(word),
            "the second host must not use DSH's types or envelope: {word}"
        );
    }
}
