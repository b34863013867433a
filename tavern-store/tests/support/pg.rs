//! A throwaway PostgreSQL cluster for tests: started once per test process from the system's
//! PostgreSQL 15 binaries on a temporary directory, reachable only over a unix socket in it,
//! one fresh database per test, stopped (and its directory removed) when the test process
//! ends — by a watchdog that waits for the end of a pipe the test process holds, so the
//! cluster is stopped even when the process is killed.
//!
//! Missing binaries fail the test with what to install; nothing is skipped.
#![allow(dead_code, clippy::unwrap_used, clippy::missing_panics_doc)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tavern_store::clock::Clock;
use tavern_store::pg::{PgConfig, PgStore};

/// Where Debian's `postgresql-15` package puts the server programs.
pub const BIN: &str = "/usr/lib/postgresql/15/bin";

/// The running cluster of this test process.
pub struct Cluster {
    root: PathBuf,
    data: PathBuf,
    as_nobody: bool,
    next_db: AtomicU32,
    /// The watchdog's stdin: closed when this process ends, which stops the cluster.
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The cluster of this test process, started on first use.
pub fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(Cluster::start)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs a PostgreSQL program (as `nobody` when we are root: the server refuses root).
fn pg_command(as_nobody: bool, program: &str) -> Command {
    let path = Path::new(BIN).join(program);
    if as_nobody {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

/// Starts the server of the cluster in `data`, listening on a unix socket in `root` only.
fn pg_ctl_start(as_nobody: bool, root: &Path, data: &Path) {
    let mut start = pg_command(as_nobody, "pg_ctl");
    start
        .arg("-D")
        .arg(data)
        .arg("-l")
        .arg(root.join("server.log"))
        .arg("-o")
        .arg(format!(
            "-k {} -c listen_addresses='' -c fsync=off -c max_connections=200",
            root.display()
        ))
        .args(["-w", "start"]);
    run(start, "pg_ctl start");
}

fn run(mut c: Command, what: &str) {
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Cluster {
    fn start() -> Self {
        let initdb = Path::new(BIN).join("initdb");
        if !initdb.exists() {
            // The test suite installs what it needs: Debian's PostgreSQL server programs.
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ensure-postgres.sh");
            let mut install = Command::new("bash");
            install.arg(&script);
            run(install, "scripts/ensure-postgres.sh");
        }
        assert!(
            initdb.exists(),
            "PostgreSQL 15 server programs are missing ({} not found) after \
             scripts/ensure-postgres.sh: the PostgreSQL tests need them",
            initdb.display()
        );
        let as_nobody = is_root();
        let root = tempfile::Builder::new()
            .prefix("tavern-pg-")
            .tempdir()
            .unwrap()
            .keep();
        if as_nobody {
            run(
                {
                    let mut c = Command::new("chown");
                    c.arg("nobody").arg(&root);
                    c
                },
                "chown of the cluster directory to nobody",
            );
        }
        let data = root.join("data");
        let mut init = pg_command(as_nobody, "initdb");
        init.arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync");
        run(init, "initdb");
        // The watchdog first, so a failing start is cleaned up too.
        let script = format!(
            "cat >/dev/null; {stop} -D '{data}' stop -m immediate >/dev/null 2>&1; rm -rf '{root}'",
            stop = if as_nobody {
                format!("runuser -u nobody -- {BIN}/pg_ctl")
            } else {
                format!("{BIN}/pg_ctl")
            },
            data = data.display(),
            root = root.display(),
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start the cluster watchdog");
        let stdin = child.stdin.take().expect("watchdog stdin");
        pg_ctl_start(as_nobody, &root, &data);
        Self {
            root,
            data,
            as_nobody,
            next_db: AtomicU32::new(0),
            watchdog: Mutex::new(Some((child, stdin))),
        }
    }

    /// Settings for database `dbname` of this cluster (over the unix socket).
    pub fn config(&self, dbname: &str) -> PgConfig {
        let mut c = PgConfig::new();
        c.host_path(&self.root).user("postgres").dbname(dbname);
        c
    }

    /// `key=value` settings for database `dbname`, as a program's command line takes them.
    pub fn settings(&self, dbname: &str) -> String {
        format!("host={} user=postgres dbname={dbname}", self.root.display())
    }

    /// Creates a new empty database and returns its settings.
    pub async fn fresh_database(&self) -> PgConfig {
        let name = format!("t{}", self.next_db.fetch_add(1, Ordering::SeqCst));
        let (client, conn) = self
            .config("postgres")
            .connect(tokio_postgres_nt())
            .await
            .unwrap();
        let task = tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        drop(client);
        let _ = task.await;
        self.config(&name)
    }

    /// Opens a [`PgStore`] (its own pool) on a database of this cluster.
    pub async fn open(&self, config: &PgConfig, clock: Arc<dyn Clock>) -> PgStore {
        PgStore::open(config.clone(), clock, 8).await.unwrap()
    }

    /// Stops the server (fast shutdown: sessions are cut off), keeping its data.
    pub fn stop_server(&self) {
        let mut stop = pg_command(self.as_nobody, "pg_ctl");
        stop.arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"]);
        run(stop, "pg_ctl stop");
    }

    /// Starts the server again after [`Cluster::stop_server`].
    pub fn start_server(&self) {
        pg_ctl_start(self.as_nobody, &self.root, &self.data);
    }

    /// Stops the cluster now (normally the watchdog does it when the process ends).
    pub fn stop(&self) {
        if let Some((mut child, mut stdin)) = self.watchdog.lock().unwrap().take() {
            let _ = stdin.flush();
            drop(stdin);
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tokio_postgres_nt() -> tavern_store::pg::NoTls {
    tavern_store::pg::NoTls
}
