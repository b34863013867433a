//! `tavern` on PostgreSQL (`--store`) against a throwaway cluster the test starts: a file store
//! holding real SillyTavern chats (imported with `import-st`) and memories is copied into an
//! empty database and back into a new data directory, byte for byte, each copy verified;
//! commands work on the database; a database that is not empty is refused; `check` reads it;
//! the password never appears in any output.

#[path = "../../tavern-store/tests/support/pg.rs"]
mod pg;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use assert_cmd::Command;
use serde_json::Value;
use tavern_core::{CharacterName, MemoryKind, MemorySource, MemoryWrite, ScopeKey, Tag};
use tavern_store::fs::FsStore;
use tavern_store::{MemoryStore, SystemClock};

const CHAT: &str = "Seraphina - 2024-09-19@20h03m29s";

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one json document ({e}): {}", self.stdout))
    }
}

fn tavern(args: &[&str]) -> Run {
    let out = Command::cargo_bin("tavern")
        .unwrap()
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("TAVERN_STORE")
        .output()
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn ok(args: &[&str]) -> Run {
    let run = tavern(args);
    assert_eq!(run.code, 0, "tavern {args:?} failed: {}", run.stderr);
    run
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A data directory with a real SillyTavern chat imported and memories written.
fn file_store(root: &Path) -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures");
    assert!(
        fixtures.is_dir(),
        "../shared/fixtures is missing beside the checkout"
    );
    let st = root.join("st/chats/Seraphina");
    std::fs::create_dir_all(&st).unwrap();
    std::fs::write(
        st.join(format!("{CHAT}.jsonl")),
        std::fs::read(fixtures.join(format!("chats/{CHAT}.jsonl"))).unwrap(),
    )
    .unwrap();
    let data = root.join("a");
    ok(&["--data", s(&data), "import-st", s(&root.join("st"))]);
    let store = FsStore::open(&data, Arc::new(SystemClock)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        for (id, scope, text) in [
            (
                "m-amber",
                ScopeKey::Character {
                    character: CharacterName::parse("Seraphina").unwrap(),
                },
                "Seraphina has amber eyes and guards the forest of Eldoria.",
            ),
            ("m-tea", ScopeKey::Global, "用户喜欢乌龙茶，不加糖。"),
        ] {
            let w = MemoryWrite {
                id: tavern_core::MemoryId::parse(id).unwrap(),
                scope,
                kind: MemoryKind::Semantic,
                content: text.into(),
                tags: vec![Tag::parse("fact").unwrap()],
                importance: 0.5,
                confidence: 0.9,
                source: MemorySource::system(),
                expires_at: None,
            };
            store.put(w, None, false).await.unwrap();
        }
    });
    data
}

/// A new empty database of the test cluster, and its settings as a command line takes them.
fn fresh_database() -> (tavern_store::pg::PgConfig, String) {
    let cluster = pg::cluster();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = rt.block_on(cluster.fresh_database());
    let settings = cluster.settings(config.get_dbname().unwrap());
    (config, settings)
}

#[test]
fn a_file_store_moves_into_postgres_and_back_verified() {
    let (config, settings) = fresh_database();
    let tmp = tempfile::tempdir().unwrap();
    let a = file_store(tmp.path());

    let moved = ok(&["--data", s(&a), "--json", "copy", "--to-store", &settings]).json();
    assert_eq!(moved["verified"], true, "{moved}");
    assert_eq!(moved["memories"], 2, "{moved}");
    assert_eq!(moved["chats"], 1, "{moved}");

    // Commands on the database (the data directory then only holds assets).
    let assets_only = tmp.path().join("assets-only");
    let found = ok(&[
        "--data",
        s(&assets_only),
        "--store",
        &settings,
        "--json",
        "memory",
        "search",
        "amber eyes",
        "--scope",
        "character",
        "--character",
        "Seraphina",
    ])
    .json();
    assert!(found.to_string().contains("m-amber"), "{found}");
    let chats = ok(&["--store", &settings, "--json", "chat", "ls"]).json();
    assert!(chats.to_string().contains(CHAT), "{chats}");
    let checked = ok(&["--store", &settings, "check"]);
    assert!(
        checked.stdout.contains("checked the database (2 memories"),
        "{}",
        checked.stdout
    );
    // `check` reads every chat line: one made unreadable in the database is reported.
    let rt2 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let corrupt = |sql: &'static str| {
        rt2.block_on(async {
            let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
            let task = tokio::spawn(conn);
            client.batch_execute(sql).await.unwrap();
            drop(client);
            let _ = task.await;
        })
    };
    corrupt("UPDATE chat_lines SET line = line || ' ' WHERE n = 0");
    corrupt("CREATE TABLE saved AS SELECT * FROM chat_lines WHERE n = 2");
    corrupt("UPDATE chat_lines SET line = '{not json' WHERE n = 2");
    let bad = tavern(&["--store", &settings, "check"]);
    assert_eq!(bad.code, 4, "{}{}", bad.stdout, bad.stderr);
    assert!(bad.stdout.contains(CHAT), "{}", bad.stdout);
    corrupt(
        "UPDATE chat_lines l SET line = s.line FROM saved s WHERE l.n = 2 AND s.chat = l.chat; \
         UPDATE chat_lines SET line = rtrim(line, ' ') WHERE n = 0; DROP TABLE saved",
    );
    ok(&["--store", &settings, "check"]);

    // Compaction: the copy holds a snapshot per memory already; compacting it again writes a
    // reset row and the two snapshots, and everything reads as before.
    let compact = ok(&["--store", &settings, "--json", "compact"]).json();
    assert_eq!(compact["memory"]["after"], 3, "{compact}");
    let text = ok(&["--store", &settings, "compact"]).stdout;
    assert!(text.contains("memory_ops: 3 -> 3 rows"), "{text}");
    let after = ok(&["--store", &settings, "--json", "chat", "ls"]).json();
    assert_eq!(after, chats);

    // A database that is not empty is refused, and stays as it was.
    let again = tavern(&["--data", s(&a), "copy", "--to-store", &settings]);
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert!(again.stderr.contains("empty store"), "{}", again.stderr);

    // Back into a new data directory: the chat file byte for byte, the same memories.
    let b = tmp.path().join("b");
    let back = ok(&["--store", &settings, "--json", "copy", "--to-data", s(&b)]).json();
    assert_eq!(back, moved);
    let chat = |d: &Path| std::fs::read(d.join(format!("chats/Seraphina/{CHAT}.jsonl"))).unwrap();
    assert_eq!(chat(&a), chat(&b));
    let ls = |d: &Path| ok(&["--data", s(d), "--json", "memory", "ls"]).json();
    assert_eq!(ls(&a), ls(&b));
    // And a data directory that holds a store is not a target either.
    let refused = tavern(&["--store", &settings, "copy", "--to-data", s(&b)]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
}

#[test]
fn the_password_never_appears_and_bad_settings_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("nowhere");
    let settings = format!(
        "host={} user=kai password=hunter2 dbname=x",
        socket.display()
    );
    let run = tavern(&["--store", &settings, "memory", "ls"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(!run.stderr.contains("hunter2") && !run.stdout.contains("hunter2"));
    let run = tavern(&["--store", "postgres://kai:hunter2@[bad", "memory", "ls"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("--store: invalid postgres settings"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("hunter2"));
    // The option at fault is named; its value never is, nor an unknown name as typed (it
    // may be a piece of a password: here one with an unescaped `@` and `?`).
    for (settings, named) in [
        ("host=/tmp port=hunter2", "invalid value for option `port`"),
        (
            "host=/tmp passwrd=hunter2",
            "an unknown option (did you mean `password`?)",
        ),
        (
            "host=/tmp sslmode=hunter2",
            "invalid value for option `sslmode` (sslmode takes disable, prefer or require",
        ),
        (
            "postgres://kai:hun@ter?hunter2=1@db/tavern",
            "an unknown option (known: host",
        ),
    ] {
        let run = tavern(&["--store", settings, "memory", "ls"]);
        assert_eq!(run.code, 2, "{}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        assert!(run.stderr.contains(named), "{settings}: {}", run.stderr);
        assert!(!run.stderr.contains("hunter2"), "{}", run.stderr);
    }
    // The password from a file, for the copy's target too.
    let pw = tmp.path().join("pw");
    std::fs::write(&pw, "hunter2\n").unwrap();
    let run = tavern(&[
        "--store",
        &format!("host={} user=kai dbname=x", socket.display()),
        "--store-password-file",
        s(&pw),
        "memory",
        "ls",
    ]);
    assert_eq!(run.code, 1);
    assert!(!run.stderr.contains("hunter2"), "{}", run.stderr);
    let missing = tavern(&[
        "--store",
        "host=/tmp user=kai",
        "--store-password-file",
        s(&tmp.path().join("none")),
        "memory",
        "ls",
    ]);
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("--store-password-file"),
        "{}",
        missing.stderr
    );
    // Named by its option, not by its path.
    assert!(
        !missing.stderr.contains(s(tmp.path())),
        "{}",
        missing.stderr
    );
    // An empty TAVERN_STORE is no database: the data directory is used.
    let empty = Command::cargo_bin("tavern")
        .unwrap()
        .args(["--data", s(&tmp.path().join("nothing")), "memory", "ls"])
        .env("TAVERN_STORE", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8(empty.stderr).unwrap();
    assert!(stderr.contains("no store in"), "{stderr}");
    // A target database that cannot be reached is named as the target.
    let target = tavern(&[
        "--data",
        s(&tmp.path().join("nothing")),
        "copy",
        "--to-store",
        &format!("host={} user=kai dbname=x", socket.display()),
    ]);
    assert_eq!(target.code, 1, "{}", target.stderr);
    let two = tavern(&["copy"]);
    assert_eq!(two.code, 2, "{}", two.stderr);
}

#[test]
fn tls_is_used_when_the_settings_require_it_and_the_ca_is_trusted() {
    let cluster = pg::cluster();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = rt.block_on(cluster.fresh_database());
    let tls = cluster.tcp_settings(config.get_dbname().unwrap(), "require");
    let ca = cluster.ca_file();
    let checked = ok(&["--store", &tls, "--store-ca-file", s(&ca), "check"]);
    assert!(
        checked.stdout.contains("checked the database"),
        "{}",
        checked.stdout
    );
    let untrusted = tavern(&["--store", &tls, "check"]);
    assert_eq!(untrusted.code, 1, "{}", untrusted.stderr);
    assert!(
        untrusted.stderr.contains("certificate"),
        "{}",
        untrusted.stderr
    );
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let bad = tavern(&["--store", &tls, "--store-ca-file", s(&junk), "check"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--store-ca-file"), "{}", bad.stderr);
}

#[test]
fn a_memory_image_dir_spares_the_next_run_reading_every_memory() {
    let (config, settings) = fresh_database();
    let tmp = tempfile::tempdir().unwrap();
    // Enough memories for an image to be worth saving (4,096 rows read at open).
    let data = tmp.path().join("a");
    let writes = (0..5000)
        .map(|i| MemoryWrite {
            id: tavern_core::MemoryId::parse(format!("m{i}")).unwrap(),
            scope: ScopeKey::Global,
            kind: MemoryKind::Semantic,
            content: format!("记忆 {i}: the lantern number {i} hangs by the gate"),
            tags: Vec::new(),
            importance: 0.5,
            confidence: 0.9,
            source: MemorySource::system(),
            expires_at: None,
        })
        .collect();
    FsStore::open(&data, Arc::new(SystemClock))
        .unwrap()
        .import_memories(writes)
        .unwrap();
    ok(&["--data", s(&data), "copy", "--to-store", &settings]);

    let images = tmp.path().join("images");
    let search = |extra: &[&str]| {
        let mut args = vec!["--store", &settings, "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[
            "memory",
            "search",
            "lantern number 4321",
            "--scope",
            "global",
        ]);
        tavern(&args)
    };
    // What was found and how well it matched (the score also weighs recency: the clock moves
    // between runs).
    let found = |run: &Run| {
        assert_eq!(run.code, 0, "{}", run.stderr);
        let json = run.json();
        let hits: Vec<(String, String, f64)> = json["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                let text = |k: &str| h[k].as_str().unwrap().to_owned();
                (
                    text("id"),
                    text("revision"),
                    h["relevance"].as_f64().unwrap(),
                )
            })
            .collect();
        (hits, json["sourceCount"].clone())
    };
    let plain = found(&search(&[]));
    assert_eq!(plain.0[0].0, "m4321", "{plain:?}");
    assert_eq!(plain.1, 5000);
    let first = found(&search(&["--store-image-dir", s(&images)]));
    assert!(images.join("memory.image").is_file());
    let second = found(&search(&["--store-image-dir", s(&images)]));
    assert_eq!(first, plain);
    assert_eq!(second, plain);
    // Holding memories by scope (here far fewer than the scope searched holds) answers alike;
    // it and an image directory are refused together.
    let by_scope = found(&search(&["--store-max-loaded-memories", "10"]));
    assert_eq!(by_scope, plain);
    let both = search(&[
        "--store-max-loaded-memories",
        "10",
        "--store-image-dir",
        s(&images),
    ]);
    assert_ne!(both.code, 0);
    assert!(both.stderr.contains("--store-image-dir"), "{}", both.stderr);

    // A damaged image is a warning naming the file (never its directory), and the answer
    // is the same: a bit flipped in the middle of what an open reads (the 40-byte header says
    // how much that is; records and postings lie after it, read when needed).
    let path = images.join("memory.image");
    let mut bytes = std::fs::read(&path).unwrap();
    let checked = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    let middle = 40 + checked / 2;
    bytes[middle] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let damaged = search(&["--store-image-dir", s(&images)]);
    assert_eq!(found(&damaged), plain);
    assert!(
        damaged.stderr.contains("memory.image"),
        "{}",
        damaged.stderr
    );
    assert!(damaged.stderr.contains("damaged"), "{}", damaged.stderr);
    assert!(!damaged.stderr.contains(s(&images)), "{}", damaged.stderr);

    // Without --store it is refused.
    let alone = tavern(&[
        "--data",
        s(&data),
        "--store-image-dir",
        s(&images),
        "memory",
        "ls",
    ]);
    assert_ne!(alone.code, 0);
    assert!(alone.stderr.contains("--store"), "{}", alone.stderr);

    // `check` reads every row, and with --store-image-dir reads the image as a host would
    // and compares the two.
    let check = |extra: &[&str]| {
        let mut args = vec!["--store", &settings, "--json"];
        args.extend_from_slice(extra);
        args.push("check");
        tavern(&args)
    };
    let image_state = |run: &Run| run.json()["memoryImage"].clone();
    let agrees = check(&["--store-image-dir", s(&images)]);
    assert_eq!(agrees.code, 0, "{}{}", agrees.stdout, agrees.stderr);
    assert_eq!(image_state(&agrees), "agrees");
    assert_eq!(agrees.json()["memories"], 5000, "every row was read");
    let none = check(&["--store-image-dir", s(&tmp.path().join("no images"))]);
    assert_eq!(image_state(&none), "absent");
    assert!(
        !tmp.path().join("no images").exists(),
        "check saves no image"
    );
    // A row deleted by hand: the image's anchor (the last row) cannot see it; the check does.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
        let task = tokio::spawn(conn);
        let deleted = client
            .execute("DELETE FROM memory_ops WHERE id = 'm17'", &[])
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        drop(client);
        let _ = task.await;
    });
    let differs = check(&["--store-image-dir", s(&images)]);
    assert_eq!(differs.code, 4, "{}{}", differs.stdout, differs.stderr);
    assert_eq!(image_state(&differs), "bad");
    let problems = differs.json()["problems"].to_string();
    assert!(
        problems.contains("memory.image") && problems.contains("differ from those of the rows"),
        "{problems}"
    );
    assert!(!differs.stdout.contains(s(&images)), "{}", differs.stdout);
    let rows_alone = check(&[]);
    assert_eq!(rows_alone.code, 0, "{}", rows_alone.stdout);
    assert_eq!(rows_alone.json()["memories"], 4999);
    assert_eq!(image_state(&rows_alone), Value::Null);
    assert_eq!(differs.json()["memories"], 4999, "every row was read");
    // After a compaction the image is of rows that are gone: stale, not a problem, and the
    // check leaves it as it was (it never writes an image).
    ok(&["--store", &settings, "compact"]);
    let before = std::fs::read(images.join("memory.image")).unwrap();
    let stale = check(&["--store-image-dir", s(&images)]);
    assert_eq!(stale.code, 0, "{}{}", stale.stdout, stale.stderr);
    assert_eq!(image_state(&stale), "stale");
    assert_eq!(std::fs::read(images.join("memory.image")).unwrap(), before);
    // A host's open reads every row and saves a current image, which the check then reads.
    assert_eq!(found(&search(&["--store-image-dir", s(&images)])).1, 4999);
    assert_ne!(std::fs::read(images.join("memory.image")).unwrap(), before);
    let text = ok(&[
        "--store",
        &settings,
        "--store-image-dir",
        s(&images),
        "check",
    ]);
    assert!(
        text.stdout
            .contains("memory.image: read, and it agrees with every row"),
        "{}",
        text.stdout
    );
    // A damaged image is a problem naming the file, never its directory, and stays as it was.
    let good = std::fs::read(images.join("memory.image")).unwrap();
    let mut bytes = good.clone();
    // In the part an open reads (the header says how long it is: 40 bytes of header first).
    let checked = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    let middle = 40 + checked / 2;
    bytes[middle] ^= 1;
    std::fs::write(images.join("memory.image"), &bytes).unwrap();
    let damaged = check(&["--store-image-dir", s(&images)]);
    assert_eq!(damaged.code, 4, "{}{}", damaged.stdout, damaged.stderr);
    assert_eq!(image_state(&damaged), "bad");
    let problems = damaged.json()["problems"].to_string();
    assert!(
        problems.contains("memory.image") && problems.contains("damaged"),
        "{problems}"
    );
    assert!(!damaged.stdout.contains(s(&images)), "{}", damaged.stdout);
    assert_eq!(std::fs::read(images.join("memory.image")).unwrap(), bytes);
    // The posting lists lie after that part, read only when a search needs them: the check
    // reads them all.
    let mut bytes = good;
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(images.join("memory.image"), &bytes).unwrap();
    let damaged = check(&["--store-image-dir", s(&images)]);
    assert_eq!(damaged.code, 4, "{}{}", damaged.stdout, damaged.stderr);
    assert_eq!(image_state(&damaged), "bad");
    let problems = damaged.json()["problems"].to_string();
    assert!(problems.contains("posting list"), "{problems}");
    // Something there that cannot be read as an image is not "absent" (which would say all
    // is well): it is a problem too.
    std::fs::remove_file(images.join("memory.image")).unwrap();
    std::fs::create_dir(images.join("memory.image")).unwrap();
    let unreadable = check(&["--store-image-dir", s(&images)]);
    assert_eq!(
        unreadable.code, 4,
        "{}{}",
        unreadable.stdout, unreadable.stderr
    );
    assert_eq!(image_state(&unreadable), "bad");
    let problems = unreadable.json()["problems"].to_string();
    assert!(problems.contains("memory.image"), "{problems}");
    assert!(
        !unreadable.stdout.contains(s(&images)),
        "{}",
        unreadable.stdout
    );
    // Nor is a link to nothing (which `Path::exists` calls absent).
    std::fs::remove_dir(images.join("memory.image")).unwrap();
    std::os::unix::fs::symlink("gone/memory.image", images.join("memory.image")).unwrap();
    let dangling = check(&["--store-image-dir", s(&images)]);
    assert_eq!(dangling.code, 4, "{}{}", dangling.stdout, dangling.stderr);
    assert_eq!(image_state(&dangling), "bad");
    let problems = dangling.json()["problems"].to_string();
    assert!(problems.contains("not a regular file"), "{problems}");
}
