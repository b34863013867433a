//! A host's `tool/cancel` is answered, and the cancelled call's answer sent, while the call is
//! stuck in an operation that blocks its thread (a frozen disk, a stalled network file
//! system): the call does not hold the host's request hostage until the operation returns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tavern_core::CharacterName;
use tavern_dsh_adapter::bridge::host::BridgeHost;
use tavern_dsh_adapter::bridge::Bridge;
use tavern_dsh_adapter::{Runtime, RuntimeConfig};
use tavern_store::mem::MemStore;
use tavern_store::SystemClock;
use tavern_tools::assets::card::Card;
use tavern_tools::assets::provider::{AssetProvider, Persona};
use tavern_tools::assets::world::WorldBook;
use tavern_tools::assets::AssetError;

/// Assets whose card read blocks its thread, once armed, until released.
struct FrozenAssets {
    armed: AtomicBool,
    entered: Mutex<mpsc::Sender<()>>,
    release: Mutex<mpsc::Receiver<()>>,
}

#[async_trait]
impl AssetProvider for FrozenAssets {
    async fn card(&self, character: &CharacterName) -> Result<Option<Arc<Card>>, AssetError> {
        if self.armed.load(Ordering::SeqCst) {
            // As a file read on a frozen disk does: the thread itself waits.
            tokio::task::block_in_place(|| {
                let _ = self.entered.lock().unwrap().send(());
                let _ = self.release.lock().unwrap().recv();
            });
        }
        let card = json!({"spec": "chara_card_v2", "spec_version": "2.0", "data": {"name": character.as_str(), "first_mes": ""}});
        Card::from_json(character.as_str(), card.to_string().as_bytes()).map(|c| Some(Arc::new(c)))
    }

    async fn world(&self, _name: &str) -> Result<Option<Arc<WorldBook>>, AssetError> {
        Ok(None)
    }

    async fn global_worlds(&self) -> Vec<String> {
        Vec::new()
    }

    async fn persona(&self) -> Persona {
        Persona::default()
    }
}

async fn answer(bridge: &Bridge, frame: Value) -> Value {
    let out = bridge.handle(&frame.to_string()).await;
    out.into_iter()
        .find(|f| f.get("id") == frame.get("id"))
        .unwrap_or_else(|| panic!("no answer to {frame}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_is_answered_while_the_call_blocks_its_thread() {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let assets = Arc::new(FrozenAssets {
        armed: AtomicBool::new(false),
        entered: Mutex::new(entered_tx),
        release: Mutex::new(release_rx),
    });
    let clock = Arc::new(SystemClock);
    let host = Arc::new(BridgeHost::default());
    let runtime = Runtime::new(
        host.clone(),
        Arc::new(MemStore::new(clock.clone())),
        assets.clone(),
        clock,
        RuntimeConfig::default(),
    );
    let bridge = Arc::new(Bridge::new(runtime, host));
    answer(
        &bridge,
        json!({"id": 1, "method": "handshake", "params": {"protocol": 1}}),
    )
    .await;
    let created = answer(&bridge, json!({"id": 2, "method": "agent/created", "params": {"agent": "s1", "bind": {"character": "Mira", "chatId": "Mira - 1"}}})).await;
    assert_eq!(created["result"]["mounted"], true, "{created}");

    assets.armed.store(true, Ordering::SeqCst);
    let caller = bridge.clone();
    let call = tokio::spawn(async move {
        answer(&caller, json!({"id": 3, "method": "tool/call", "params": {"tool": "tavern_character_get", "args": {}, "callId": "c1", "session": "s1"}})).await
    });
    // The call is inside the blocking read now.
    tokio::task::spawn_blocking(move || entered_rx.recv())
        .await
        .unwrap()
        .unwrap();
    let cancel = answer(
        &bridge,
        json!({"id": 4, "method": "tool/cancel", "params": {"callId": "c1"}}),
    )
    .await;
    assert_eq!(cancel["result"]["cancelled"], "aborted", "{cancel}");
    // The call answers as cancelled while its read is still blocked (the bound only turns a
    // hang into a failure).
    let cancelled = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the cancelled call answered while its read was blocked")
        .unwrap();
    assert_eq!(
        cancelled["result"]["error"]["code"], "unavailable",
        "{cancelled}"
    );
    assert!(cancelled.to_string().contains("cancelled"), "{cancelled}");
    release_tx.send(()).unwrap();

    // The bridge serves the session as before.
    assets.armed.store(false, Ordering::SeqCst);
    let again = answer(&bridge, json!({"id": 5, "method": "tool/call", "params": {"tool": "tavern_character_get", "args": {}, "callId": "c2", "session": "s1"}})).await;
    assert_eq!(again["result"]["fields"]["name"], "Mira", "{again}");
}
