//! A fault-injecting proxy in front of the test cluster's unix socket: clients connect to its
//! own socket (as to a server), and each connection is forwarded byte for byte until the test
//! freezes it. A frozen connection forwards nothing more in either direction and never closes
//! — a frozen server, a black-holed network or a host cut off, as the server or the client
//! sees it. New connections after a freeze work normally unless [`Proxy::freeze_new`] is set.
#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

/// Where a link freezes itself in what the client sends, once armed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trap {
    None,
    /// Just before the client's next simple-query `COMMIT` reaches the server.
    BeforeCommit,
    /// Just after the whole message holding the client's next `LOCK TABLE` reached it.
    AfterLock,
}

/// One forwarded connection's switch.
struct Link {
    frozen: AtomicBool,
    trap: Mutex<Trap>,
    /// How many links froze themselves on a trap (shared by all links).
    froze: Arc<watch::Sender<usize>>,
}

/// A running proxy; dropped, it stops accepting (frozen links stay frozen).
pub struct Proxy {
    dir: tempfile::TempDir,
    port: u16,
    links: Arc<Mutex<Vec<Arc<Link>>>>,
    armed: Arc<Mutex<Trap>>,
    froze: Arc<watch::Sender<usize>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Where the simple-query `COMMIT` message starts in `buf` (`Q`, length 11, `COMMIT\0`).
fn commit_at(buf: &[u8]) -> Option<usize> {
    const MSG: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";
    buf.windows(MSG.len()).position(|w| w == MSG)
}

/// Where the simple-query message holding `LOCK TABLE` in `buf` ends: the nearest `Q` before
/// it whose length reaches past it and whose text ends in NUL there.
fn after_lock(buf: &[u8]) -> Option<usize> {
    let lock = buf.windows(10).position(|w| w == b"LOCK TABLE")?;
    (0..lock).rev().find_map(|q| {
        let len = u32::from_be_bytes(buf.get(q + 1..q + 5)?.try_into().ok()?) as usize;
        let end = q + 1 + len;
        (buf[q] == b'Q' && end > lock && end <= buf.len() && buf[end - 1] == 0).then_some(end)
    })
}

async fn pump(
    mut from: tokio::net::unix::OwnedReadHalf,
    mut to: tokio::net::unix::OwnedWriteHalf,
    link: Arc<Link>,
    client_side: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if link.frozen.load(Ordering::SeqCst) {
            // Hold the connection open, forwarding nothing, until the test process ends.
            std::future::pending::<()>().await;
        }
        let chunk = &buf[..n];
        let trap = *link.trap.lock().unwrap();
        let cut = match trap {
            _ if !client_side => None,
            Trap::None => None,
            Trap::BeforeCommit => commit_at(chunk),
            Trap::AfterLock => after_lock(chunk),
        };
        if let Some(at) = cut {
            let _ = to.write_all(&chunk[..at]).await;
            link.frozen.store(true, Ordering::SeqCst);
            link.froze.send_modify(|n| *n += 1);
            std::future::pending::<()>().await;
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    /// A proxy for the server whose socket is `.s.PGSQL.<port>` in `server_dir`.
    pub async fn start(server_dir: &Path, port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join(format!(".s.PGSQL.{port}"))).unwrap();
        let server: PathBuf = server_dir.join(format!(".s.PGSQL.{port}"));
        let links: Arc<Mutex<Vec<Arc<Link>>>> = Arc::default();
        let armed = Arc::new(Mutex::new(Trap::None));
        let froze = Arc::new(watch::channel(0usize).0);
        let accept = {
            let (links, armed, froze) = (links.clone(), armed.clone(), froze.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(upstream) = UnixStream::connect(&server).await else {
                        continue;
                    };
                    let link = Arc::new(Link {
                        frozen: AtomicBool::new(false),
                        trap: Mutex::new(*armed.lock().unwrap()),
                        froze: froze.clone(),
                    });
                    links.lock().unwrap().push(link.clone());
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = upstream.into_split();
                    tokio::spawn(pump(cr, sw, link.clone(), true));
                    tokio::spawn(pump(sr, cw, link, false));
                }
            })
        };
        Self {
            dir,
            port,
            links,
            armed,
            froze,
            accept,
        }
    }

    /// The directory to give as the settings' `host` (the port stays the server's).
    pub fn host_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Freezes every connection made so far.
    pub fn freeze_all(&self) {
        for link in self.links.lock().unwrap().iter() {
            link.frozen.store(true, Ordering::SeqCst);
        }
    }

    fn arm(&self, trap: Trap) {
        *self.armed.lock().unwrap() = trap;
        for link in self.links.lock().unwrap().iter() {
            *link.trap.lock().unwrap() = trap;
        }
    }

    /// Every connection made so far (and every later one) freezes just before its next
    /// `COMMIT` reaches the server: a host cut off between its lock and its commit.
    pub fn freeze_before_commit(&self) {
        self.arm(Trap::BeforeCommit);
    }

    /// Every connection made so far (and every later one) freezes just after the message
    /// with its next `LOCK TABLE` reached the server: a host cut off mid-write, as early as
    /// the server can see it.
    pub fn freeze_after_lock(&self) {
        self.arm(Trap::AfterLock);
    }

    /// Disarms the traps: connections from now on are forwarded normally (frozen ones stay
    /// frozen).
    pub fn disarm(&self) {
        self.arm(Trap::None);
    }

    /// Waits until some connection froze itself on a trap.
    pub async fn frozen_on_trap(&self) {
        let mut seen = self.froze.subscribe();
        seen.wait_for(|n| *n > 0).await.unwrap();
    }
}
