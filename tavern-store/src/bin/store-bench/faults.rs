//! `store-bench --backend postgres --pg SETTINGS --faults`: what one host's trouble costs the
//! others (issue 30, F1–F3). Three hosts (PgStore instances with their own pools, as three
//! processes) write and read without pause on one database; host A reaches it through a fault
//! proxy. The throughput of B and C in each fault window is printed beside their calm
//! throughput in the same run, with how long the stuck host took to work again:
//!
//! Each host has a writer and a reader of its own variable, both without pause.
//!
//! - calm;
//! - A's connections black-holed (a frozen server or half-open network, as A sees it);
//! - A cut off mid-write, just after the message with its `LOCK TABLE` reached the server;
//! - host D cut off between a `LOCK TABLE` and its `COMMIT` (the last resort of a write that
//!   lost every race: D decides under the lock at once, `unlocked_attempts: 0`);
//! - a psql-like session holding `variable_ops`' lock for one second.
//!
//! SETTINGS must reach the server over its unix socket (`host=<socket dir>`): the proxy
//! listens beside it.

#[path = "../../../tests/support/proxy.rs"]
mod proxy;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::*;
use tavern_store::pg::{NoTls, PgConfig, PgLimits, PgStore, PgTls};
use tokio_postgres::config::Host;

type Rows = Vec<[String; 4]>;

/// Writes a second each host offers (a player's turn writes a few variables).
const WRITES: u32 = 20;
/// Reads a second each host offers.
const READS: u32 = 100;

/// One finished call: when it started and ended, whether it wrote, whether it succeeded.
#[derive(Clone, Copy)]
struct Call {
    start: Instant,
    end: Instant,
    write: bool,
    ok: bool,
}

/// A host under load: its workers' calls, and the switch that stops them.
struct Load {
    calls: Arc<Mutex<Vec<Call>>>,
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Two tasks on `store`, each offering a steady load (ticks missed while a call hangs are
    /// skipped, not made up): one writing a variable in its own scope `WRITES` times a second
    /// (every write goes through the table lock), one reading it `READS` times a second.
    fn start(store: &PgStore, host: &str) -> Self {
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let scope = ScopeKey::Agent {
            agent: AgentId::parse(host).unwrap_or_else(|e| panic!("{e}")),
        };
        let workers = [true, false]
            .into_iter()
            .map(|write| {
                let (store, calls, stop) = (store.clone(), calls.clone(), stop.clone());
                let scope = scope.clone();
                rt().spawn(async move {
                    let name = VariableName::parse("n").unwrap_or_else(|e| panic!("{e}"));
                    let per_second = if write { WRITES } else { READS };
                    let mut pace = tokio::time::interval(Duration::from_secs(1) / per_second);
                    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    let mut i = 0u64;
                    // The revision the next write expects: the last one written, or read after
                    // a failure (a write whose answer was lost may have landed).
                    let mut rev = None;
                    let mut stale = false;
                    while !stop.load(Ordering::Relaxed) {
                        pace.tick().await;
                        i += 1;
                        let start = Instant::now();
                        let ok = if write {
                            if stale {
                                if let Ok(found) = store.get(&scope, &name).await {
                                    rev = found.map(|r| r.revision);
                                }
                            }
                            let written = store
                                .set(
                                    &scope,
                                    &name,
                                    json!(i),
                                    rev.as_ref(),
                                    MemorySource::system(),
                                )
                                .await;
                            stale = written.is_err();
                            written.map(|r| rev = Some(r.revision)).is_ok()
                        } else {
                            store.get(&scope, &name).await.is_ok()
                        };
                        let end = Instant::now();
                        calls.lock().unwrap_or_else(|e| e.into_inner()).push(Call {
                            start,
                            end,
                            write,
                            ok,
                        });
                    }
                })
            })
            .collect();
        Self {
            calls,
            stop,
            workers,
        }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Tells the workers to stop after their current call.
    fn halt(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Stops the workers; a call past its limits ends within `call_timeout`.
    fn stop(self) {
        self.halt();
        for w in self.workers {
            let _ = rt().block_on(w);
        }
    }
}

/// Successful writes and reads per second that ended in `[from, to)`, over `hosts`, and the
/// longest read among them.
fn rates(hosts: &[&Load], from: Instant, to: Instant) -> (f64, f64, Duration) {
    let secs = to.duration_since(from).as_secs_f64();
    let (mut w, mut r, mut longest) = (0u64, 0u64, Duration::ZERO);
    for h in hosts {
        for c in h.calls() {
            if c.ok && c.end >= from && c.end < to {
                if c.write {
                    w += 1;
                } else {
                    r += 1;
                    longest = longest.max(c.end.duration_since(c.start));
                }
            }
        }
    }
    (w as f64 / secs, r as f64 / secs, longest)
}

/// How long after `fault` the host's first write started after it succeeded, and how many of
/// its calls failed after it.
fn recovery(host: &Load, fault: Instant) -> (Option<Duration>, usize) {
    let calls = host.calls();
    let back = calls
        .iter()
        .filter(|c| c.write && c.ok && c.start > fault)
        .map(|c| c.end.duration_since(fault))
        .min();
    let failed = calls.iter().filter(|c| !c.ok && c.end > fault).count();
    (back, failed)
}

fn pct(x: f64, calm: f64) -> String {
    if calm > 0.0 {
        format!("{:.0} %", 100.0 * x / calm)
    } else {
        "-".into()
    }
}

/// Runs the fault windows, `window` each; `settings` name a database over a unix socket.
pub fn run(settings: &str, window: Duration) -> Result<Rows, Box<dyn std::error::Error>> {
    let config: PgConfig = settings.parse()?;
    let socket_dir: PathBuf = config
        .get_hosts()
        .iter()
        .find_map(|h| match h {
            Host::Unix(p) => Some(p.clone()),
            _ => None,
        })
        .ok_or("--faults needs SETTINGS with host=<socket dir> (the proxy listens beside it)")?;
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let limits = PgLimits {
        lock_timeout: Duration::from_secs(2),
        idle_in_transaction: Duration::from_secs(2),
        call_timeout: Duration::from_secs(3),
        ..PgLimits::default()
    };
    let clock: Arc<dyn tavern_store::clock::Clock> = Arc::new(SystemClock);
    let open = |config: PgConfig, limits: PgLimits| {
        rt().block_on(PgStore::open_with_limits(
            config,
            &PgTls::default(),
            clock.clone(),
            4,
            limits,
        ))
    };
    // The same database through a proxy (a fresh config: `host_path` adds a host).
    let via = |proxy: &proxy::Proxy| {
        let mut c = PgConfig::new();
        c.host_path(proxy.host_dir()).port(port);
        if let Some(user) = config.get_user() {
            c.user(user);
        }
        if let Some(db) = config.get_dbname() {
            c.dbname(db);
        }
        if let Some(password) = config.get_password() {
            c.password(password);
        }
        c
    };
    let proxy_a = rt().block_on(proxy::Proxy::start(&socket_dir, port));
    let proxy_d = rt().block_on(proxy::Proxy::start(&socket_dir, port));
    let a = open(via(&proxy_a), limits)?;
    let b = open(config.clone(), limits)?;
    let c = open(config.clone(), limits)?;
    eprintln!(
        "limits: lock_timeout {:?}, idle_in_transaction {:?}, call_timeout {:?}; windows of {window:?}",
        limits.lock_timeout, limits.idle_in_transaction, limits.call_timeout
    );
    let load_a = Load::start(&a, "a");
    let load_b = Load::start(&b, "b");
    let load_c = Load::start(&c, "c");
    let others = [&load_b, &load_c];
    let mut rows = Rows::new();
    let wait = |d: Duration| rt().block_on(async { tokio::time::sleep(d).await });

    // Calm.
    wait(Duration::from_secs(1));
    let from = Instant::now();
    wait(window);
    let (calm_w, calm_r, longest) = rates(&others, from, Instant::now());
    rows.push([
        format!(
            "calm (offered: {} writes/s, {} reads/s)",
            2 * WRITES,
            2 * READS
        ),
        format!(
            "{calm_w:.0} writes/s, {calm_r:.0} reads/s (longest read {:.1} ms)",
            longest.as_secs_f64() * 1e3
        ),
        "100 %".into(),
        "-".into(),
    ]);
    let stuck = |host: &Load, fault: Instant| match recovery(host, fault) {
        (Some(back), failed) => format!(
            "writing again after {:.2} s ({failed} calls failed)",
            back.as_secs_f64()
        ),
        (None, failed) => format!("not writing again ({failed} calls failed)"),
    };
    let mut fault_row = |what: &str, from: Instant, stuck: String| {
        let (w, r, longest) = rates(&others, from, Instant::now());
        let row = [
            what.into(),
            format!(
                "{w:.0} writes/s, {r:.0} reads/s (longest read {:.1} ms)",
                longest.as_secs_f64() * 1e3
            ),
            format!("writes {}, reads {}", pct(w, calm_w), pct(r, calm_r)),
            stuck,
        ];
        eprintln!("{}", row.join(" | "));
        rows.push(row);
    };

    // A's connections black-holed.
    let fault = Instant::now();
    proxy_a.freeze_all();
    wait(window);
    fault_row("A's connections black-holed", fault, stuck(&load_a, fault));

    // A cut off mid-write.
    proxy_a.freeze_after_lock();
    rt().block_on(async {
        tokio::time::timeout(Duration::from_secs(10), proxy_a.frozen_on_trap()).await
    })
    .map_err(|_| "A never wrote through its proxy")?;
    let fault = Instant::now();
    proxy_a.disarm();
    wait(window);
    fault_row("A cut off mid-write", fault, stuck(&load_a, fault));

    // D cut off between a lock and its commit.
    let d = open(
        via(&proxy_d),
        PgLimits {
            unlocked_attempts: 0,
            ..limits
        },
    )?;
    proxy_d.freeze_before_commit();
    let load_d = Load::start(&d, "d");
    rt().block_on(async {
        tokio::time::timeout(Duration::from_secs(20), proxy_d.frozen_on_trap()).await
    })
    .map_err(|_| "D never took the locked path")?;
    let fault = Instant::now();
    proxy_d.disarm();
    // D stops its load (the cut-off call ends within `call_timeout`); a fresh write through D
    // is tried until one succeeds: the server must first end the cut-off session.
    load_d.halt();
    let retry = {
        let d = d.clone();
        rt().spawn(async move {
            let scope = ScopeKey::Agent {
                agent: AgentId::parse("d-retry").unwrap_or_else(|e| panic!("{e}")),
            };
            let name = VariableName::parse("n").unwrap_or_else(|e| panic!("{e}"));
            // Bounded: a store that never writes again is a finding, not a hang.
            let deadline = fault + Duration::from_secs(30);
            let mut failed = 0;
            loop {
                // Against what is there now: an earlier try whose answer was lost may have
                // written.
                let written = match d.get(&scope, &name).await {
                    Ok(current) => {
                        let rev = current.map(|r| r.revision);
                        d.set(
                            &scope,
                            &name,
                            json!(failed),
                            rev.as_ref(),
                            MemorySource::system(),
                        )
                        .await
                        .map(|_| ())
                    }
                    Err(e) => Err(e),
                };
                match written {
                    Ok(()) => return Some((fault.elapsed(), failed)),
                    Err(_) if Instant::now() < deadline => failed += 1,
                    Err(_) => return None,
                }
            }
        })
    };
    wait(window);
    let back = rt().block_on(retry)?;
    fault_row(
        "D cut off between LOCK TABLE and COMMIT (last resort)",
        fault,
        match back {
            Some((back, failed)) => format!(
                "writing again after {:.2} s ({failed} writes failed before)",
                back.as_secs_f64()
            ),
            None => "not writing again within 30 s".into(),
        },
    );
    load_d.stop();

    // Another session holds variable_ops' lock for a second.
    let holder = rt().block_on(async {
        let (client, conn) = config.connect(NoTls).await?;
        rt().spawn(conn);
        Ok::<_, tokio_postgres::Error>(client)
    })?;
    let from = Instant::now();
    rt().block_on(async {
        holder
            .batch_execute("BEGIN; LOCK TABLE variable_ops IN EXCLUSIVE MODE")
            .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        holder.batch_execute("COMMIT").await
    })?;
    wait(window.saturating_sub(Duration::from_secs(1)));
    fault_row(
        "variable_ops locked by another session for 1 s",
        from,
        "-".into(),
    );

    for load in [load_a, load_b, load_c] {
        load.stop();
    }
    Ok(rows)
}
