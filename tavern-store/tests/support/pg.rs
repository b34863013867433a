//! A throwaway PostgreSQL cluster for tests: started once per test process from the system's
//! PostgreSQL 15 binaries on a temporary directory, reachable only over a unix socket in it,
//! one fresh database per test, stopped (and its directory removed) when the test process
//! ends — by a watchdog that waits for the end of a pipe the test process holds, so the
//! cluster is stopped even when the process is killed.
//!
//! The server also listens on a free loopback TCP port with TLS on (a certificate for
//! 127.0.0.1 from a throwaway CA made with `openssl`), for the TLS tests.
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
    port: u16,
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

/// Starts the server of the cluster in `data`, listening on a unix socket in `root` and on
/// loopback (`postgresql.conf`).
fn pg_ctl_start(as_nobody: bool, root: &Path, data: &Path) {
    let mut start = pg_command(as_nobody, "pg_ctl");
    start
        .arg("-D")
        .arg(data)
        .arg("-l")
        .arg(root.join("server.log"))
        .arg("-o")
        .arg(format!(
            "-k {} -c fsync=off -c max_connections=200",
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
        let has_openssl = Command::new("openssl")
            .arg("version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !initdb.exists() || !has_openssl {
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
        let port = free_port();
        make_certificates(&root, as_nobody);
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        writeln!(
            conf,
            "listen_addresses = '127.0.0.1'\nport = {port}\nssl = on\n\
             ssl_cert_file = '{root}/server.crt'\nssl_key_file = '{root}/server.key'",
            root = root.display()
        )
        .unwrap();
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
            port,
            as_nobody,
            next_db: AtomicU32::new(0),
            watchdog: Mutex::new(Some((child, stdin))),
        }
    }

    /// The directory of the server's unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.root
    }

    /// The server's port (its socket is `.s.PGSQL.<port>`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Settings for database `dbname` of this cluster (over the unix socket).
    pub fn config(&self, dbname: &str) -> PgConfig {
        let mut c = PgConfig::new();
        c.host_path(&self.root)
            .port(self.port)
            .user("postgres")
            .dbname(dbname);
        c
    }

    /// `key=value` settings for database `dbname`, as a program's command line takes them.
    pub fn settings(&self, dbname: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={dbname}",
            self.root.display(),
            self.port
        )
    }

    /// `key=value` settings for database `dbname` over loopback TCP with `sslmode`.
    pub fn tcp_settings(&self, dbname: &str, sslmode: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname={dbname} sslmode={sslmode}",
            self.port
        )
    }

    /// The PEM file of the CA that signed the server's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.root.join("ca.crt")
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

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A throwaway CA and a server certificate for 127.0.0.1 signed by it, in `root` (the key
/// readable by the server's user only, as PostgreSQL requires).
fn make_certificates(root: &Path, as_nobody: bool) {
    let script = r#"set -e
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -keyout ca.key -out ca.crt -subj "/CN=tavern test ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout server.key -out server.csr -subj "/CN=127.0.0.1"
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.crt
chmod 600 server.key
"#;
    let mut c = Command::new("sh");
    c.args(["-c", script]).current_dir(root);
    run(c, "openssl (test certificates)");
    if as_nobody {
        let mut c = Command::new("chown");
        c.arg("nobody").arg(root.join("server.key"));
        run(c, "chown of the server key to nobody");
    }
}

fn tokio_postgres_nt() -> tavern_store::pg::NoTls {
    tavern_store::pg::NoTls
}
