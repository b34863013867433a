//! Cold open and footprint, measured in a fresh process per engine (`--child ENGINE DIR
//! QUERIES`): the time from opening the index the parent just wrote (page cache warm) to the
//! answer of its first query, then the resident set after all the queries — what a host that
//! restarts pays, without the parent's corpus and other engines in the same address space.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use tavern_store::fs::FsStore;
use tavern_store::{MemoryQuery, MemoryStore, SystemClock};

use crate::{rt, scope, tantivy_ref};

/// What a child measured.
pub struct Measured {
    /// Open + first query, in milliseconds.
    pub cold_open_ms: f64,
    /// Resident set after open + every query, in MiB.
    pub rss_mib: f64,
}

/// Runs this program as a child measuring `engine` (`ours` or `tantivy`) on `dir`.
pub fn spawn(
    engine: &str,
    dir: &Path,
    queries: &Path,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let out = Command::new(std::env::current_exe()?)
        .arg("--child")
        .arg(engine)
        .arg(dir)
        .arg(queries)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "the {engine} child failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let number = |key: &str| {
        doc[key]
            .as_f64()
            .ok_or_else(|| format!("the {engine} child printed no {key}: {doc}"))
    };
    Ok(Measured {
        cold_open_ms: number("coldOpenMs")?,
        rss_mib: number("rssMiB")?,
    })
}

/// The child's side: open, first query, the rest, then one JSON line on stdout.
pub fn run(engine: &str, dir: &Path, queries: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(queries)?;
    let queries: Vec<&str> = text.lines().collect();
    let first = queries.first().copied().unwrap_or("bench");
    let cold_open_ms;
    match engine {
        "ours" => {
            let t = Instant::now();
            let store = FsStore::open(dir, Arc::new(SystemClock))?;
            let scopes = vec![scope()];
            rt().block_on(store.search(&MemoryQuery::new(first, scopes.clone())))?;
            cold_open_ms = t.elapsed().as_secs_f64() * 1e3;
            for q in &queries {
                rt().block_on(store.search(&MemoryQuery::new(*q, scopes.clone())))?;
            }
            report(cold_open_ms)?;
            drop(store);
        }
        "tantivy" => {
            let t = Instant::now();
            let reference = tantivy_ref::Reference::open(dir)?;
            reference.search(first)?;
            cold_open_ms = t.elapsed().as_secs_f64() * 1e3;
            for q in &queries {
                reference.search(q)?;
            }
            report(cold_open_ms)?;
            drop(reference);
        }
        other => return Err(format!("unknown engine {other} (ours, tantivy)").into()),
    }
    Ok(())
}

/// Prints the measurement while the engine is still open (its memory still resident).
fn report(cold_open_ms: f64) -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "{}",
        json!({"coldOpenMs": cold_open_ms, "rssMiB": rss_mib()?})
    );
    Ok(())
}

/// This process's resident set (`VmRSS` of `/proc/self/status`), in MiB.
fn rss_mib() -> Result<f64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .ok_or("no VmRSS in /proc/self/status")?;
    Ok(kib / 1024.0)
}
