//! Drives a file store from a separate process, for the crash and multi-process tests and the
//! benchmark: `tavern-store-writer <root> put <prefix> <count>` creates memories and prints
//! `ack <i>` after each acknowledged write; `tavern-store-writer <root> incr <name> <count>`
//! increments a global variable with CAS retries, printing `ack <i>` after each success;
//! `tavern-store-writer <root> image <prefix> <rounds>` imports [`IMAGE_BATCH`] memories a
//! round (`ack <last i>` once acknowledged), then prints `saving`, saves the memory image and
//! prints `saved` (a test kills it in the middle of a save).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::json;
use tavern_core::{
    AgentId, MemoryId, MemoryKind, MemorySource, MemoryWrite, ScopeKey, VariableName,
};
use tavern_store::fs::FsStore;
use tavern_store::{MemoryStore, StoreError, SystemClock, VariableStore};

/// Memories a round of `image` mode imports before saving the image.
const IMAGE_BATCH: u64 = 4_000;

fn write(name: &str, i: u64, agent: &ScopeKey) -> Result<MemoryWrite, String> {
    Ok(MemoryWrite {
        id: MemoryId::parse(format!("{name}-{i}")).map_err(|e| e.to_string())?,
        scope: agent.clone(),
        kind: MemoryKind::Episodic,
        content: format!("record {i} written by {name} 记录"),
        tags: Vec::new(),
        importance: 0.5,
        confidence: 0.5,
        source: MemorySource::system(),
        expires_at: None,
    })
}

fn say(out: &mut impl Write, line: &str) -> Result<(), String> {
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())
}

fn run(args: &[String]) -> Result<(), String> {
    let [root, mode, name, count] = args else {
        return Err(
            "usage: tavern-store-writer <root> put|incr|image <prefix|name> <count>".into(),
        );
    };
    let count: u64 = count.parse().map_err(|e| format!("bad count: {e}"))?;
    let store = FsStore::open(root, Arc::new(SystemClock)).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let agent = ScopeKey::Agent {
        agent: AgentId::parse("writer").map_err(|e| e.to_string())?,
    };
    if mode == "image" {
        for round in 0..count {
            let first = round * IMAGE_BATCH;
            let writes = (first..first + IMAGE_BATCH)
                .map(|i| write(name, i, &agent))
                .collect::<Result<Vec<_>, _>>()?;
            store.import_memories(writes).map_err(|e| e.to_string())?;
            say(&mut out, &format!("ack {}", first + IMAGE_BATCH - 1))?;
            say(&mut out, "saving")?;
            store.save_memory_image().map_err(|e| e.to_string())?;
            say(&mut out, "saved")?;
        }
        return Ok(());
    }
    for i in 0..count {
        match mode.as_str() {
            "put" => {
                let write = write(name, i, &agent)?;
                rt().block_on(store.put(write, None, false))
                    .map_err(|e| e.to_string())?;
            }
            "incr" => {
                let var = VariableName::parse(name.as_str()).map_err(|e| e.to_string())?;
                loop {
                    let cur = rt()
                        .block_on(store.get(&ScopeKey::Global, &var))
                        .map_err(|e| e.to_string())?;
                    let n = cur.as_ref().and_then(|r| r.value.as_i64()).unwrap_or(0);
                    let res = rt().block_on(store.set(
                        &ScopeKey::Global,
                        &var,
                        json!(n + 1),
                        cur.as_ref().map(|r| &r.revision),
                        MemorySource::system(),
                    ));
                    match res {
                        Ok(_) => break,
                        Err(StoreError::Conflict { .. }) => continue,
                        Err(e) => return Err(e.to_string()),
                    }
                }
            }
            other => return Err(format!("unknown mode {other}")),
        }
        say(&mut out, &format!("ack {i}"))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tavern-store-writer: {e}");
            ExitCode::FAILURE
        }
    }
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
