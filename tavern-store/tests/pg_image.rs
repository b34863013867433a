//! A PostgreSQL store keeps an image of its memory mirror in a local directory
//! (`PgOptions::memory_image_dir`) and opens from it, fetching only the rows written after;
//! a damaged image is reported and the database read instead; an image of a table compacted
//! since, or of another database, is never trusted; and every way of opening yields the same
//! records, audit trails and search scores as reading every row.

#[path = "support/memories.rs"]
mod memories;
#[path = "support/pg.rs"]
mod pg_support;

use std::path::Path;
use std::sync::Arc;

use memories::{edit, fill, scope, seen};
use tavern_core::{MemoryId, MemorySource};
use tavern_store::clock::{Clock, ManualClock};
use tavern_store::conformance::T0;
use tavern_store::fs::FsStore;
use tavern_store::pg::{PgConfig, PgOptions, PgStore, PgTls};
use tavern_store::{copy_store, MemoryStore};

const IMAGE: &str = "memory.image";

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::new(T0))
}

async fn open(config: &PgConfig, images: Option<&Path>) -> PgStore {
    open_with(config, images, PgOptions::default()).await
}

async fn open_with(config: &PgConfig, images: Option<&Path>, mut options: PgOptions) -> PgStore {
    options.memory_image_dir = images.map(Path::to_path_buf);
    PgStore::open_with_options(config.clone(), &PgTls::default(), clock(), options)
        .await
        .unwrap()
}

/// A fresh database holding the 5,000 memories of `memories::fill`, copied in from a file
/// store (one bulk load), and the number of its memory rows.
async fn filled_database() -> (PgConfig, u64) {
    let config = pg_support::cluster().fresh_database().await;
    let files = tempfile::tempdir().unwrap();
    let source = FsStore::open(files.path(), clock()).unwrap();
    fill(&source).await;
    let target = open(&config, None).await;
    copy_store(&source, &target).await.unwrap();
    let rows = open(&config, None).await.memory_rows_replayed().await;
    assert!(rows >= 5000, "{rows}");
    (config, rows)
}

/// The memories as read from every row of the database, with no image.
async fn from_rows_alone(config: &PgConfig, rows: u64) -> String {
    let s = open(config, None).await;
    assert_eq!(s.memory_rows_replayed().await, rows);
    seen(&s).await
}

/// On a multi-threaded runtime (as `tavern-bridge` runs), where saving hands the worker's
/// other tasks over while it encodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_opens_from_the_image_and_fetches_only_the_rows_after_it() {
    let (config, rows) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    let dir = images.path().join("not yet made");
    let first = open(&config, Some(&dir)).await;
    assert_eq!(first.memory_rows_replayed().await, rows);
    // Thousands of rows read: the image was saved at open (its directory made).
    assert!(dir.join(IMAGE).is_file());
    assert!(!first.save_memory_image().await.unwrap(), "nothing new");
    // Another process (no image of its own) writes on.
    let other = open(&config, None).await;
    edit(&other, 20..23, "later").await;
    let tail = 2 * 3 + 1;

    let second = open(&config, Some(&dir)).await;
    assert!(
        second.diagnostics().is_empty(),
        "{:?}",
        second.diagnostics()
    );
    assert_eq!(second.memory_rows_replayed().await, tail);
    let truth = from_rows_alone(&config, rows + tail).await;
    assert_eq!(seen(&second).await, truth);
    // The first process catches up like any other; every process agrees.
    assert_eq!(seen(&first).await, truth);
    // It goes on from there, and saves again at will.
    edit(&second, 30..31, "after").await;
    assert!(second.save_memory_image().await.unwrap());
    let third = open(&config, Some(&dir)).await;
    assert_eq!(third.memory_rows_replayed().await, 0);
    assert_eq!(seen(&third).await, seen(&second).await);
}

#[tokio::test]
async fn a_damaged_image_is_reported_and_the_database_read_instead() {
    let (config, rows) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    drop(open(&config, Some(images.path())).await);
    let path = images.path().join(IMAGE);
    let image = std::fs::read(&path).unwrap();
    let truth = from_rows_alone(&config, rows).await;
    for damaged in memories::damaged(&image) {
        std::fs::write(&path, &damaged).unwrap();
        let s = open(&config, Some(images.path())).await;
        let diags = s.diagnostics();
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert_eq!(diags[0].file, IMAGE);
        assert!(diags[0].message.contains("damaged"), "{}", diags[0].message);
        assert!(!diags[0].message.contains(&*images.path().to_string_lossy()));
        assert_eq!(s.memory_rows_replayed().await, rows);
        assert_eq!(seen(&s).await, truth);
    }
    // A file far larger than an image of this table can be is refused unread.
    std::fs::write(&path, &image).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let s = open(&config, Some(images.path())).await;
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert!(diags[0].message.contains("more than an image"), "{diags:?}");
    assert_eq!(s.memory_rows_replayed().await, rows);
    drop(s);
    // The last open that read the database saved a good image again.
    let s = open(&config, Some(images.path())).await;
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert_eq!(s.memory_rows_replayed().await, 0);
    assert_eq!(seen(&s).await, truth);
}

/// Posting lists are read where they lie in the image when a search first needs them: one
/// damaged after the open is found then; the search answers from the index rebuilt from the
/// records, the damage is reported and the image saved again.
#[tokio::test]
async fn a_posting_list_damaged_in_the_image_is_found_when_read_and_healed() {
    let (config, rows) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    drop(open(&config, Some(images.path())).await);
    let path = images.path().join(IMAGE);
    let mut image = std::fs::read(&path).unwrap();
    let truth = from_rows_alone(&config, rows).await;
    let postings = memories::postings_at(&image);
    assert!(postings < image.len());
    for b in &mut image[postings..] {
        *b ^= 0x5a;
    }
    std::fs::write(&path, &image).unwrap();
    let s = open(&config, Some(images.path())).await;
    assert_eq!(s.memory_rows_replayed().await, 0, "opened from the image");
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert_eq!(seen(&s).await, truth);
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].file, IMAGE);
    assert!(diags[0].message.contains("rebuilt"), "{}", diags[0].message);
    assert_ne!(std::fs::read(&path).unwrap(), image, "saved again");
    drop(s);
    let s = open(&config, Some(images.path())).await;
    assert_eq!(s.memory_rows_replayed().await, 0);
    assert_eq!(seen(&s).await, truth);
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
}

/// A record changed in the image after the open (another program writing into the file) is
/// never used: the mirror is read again from the rows (never from an image again in that
/// process) and the change reported, so a read and a write creating an existing id answer as
/// the database says.
#[tokio::test]
async fn a_record_changed_in_the_image_after_the_open_is_never_used() {
    let (config, rows) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    drop(open(&config, Some(images.path())).await);
    let path = images.path().join(IMAGE);
    let truth = from_rows_alone(&config, rows).await;
    let (m0, m1) = (
        MemoryId::parse("m0").unwrap(),
        MemoryId::parse("m1").unwrap(),
    );
    let plain = open(&config, None).await;
    let expected = (
        plain.inspect(&m0, &scope(0)).await.unwrap(),
        plain.inspect(&m1, &scope(1)).await.unwrap(),
    );
    let reported = |s: &PgStore| {
        let diags = s.diagnostics();
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert_eq!(diags[0].file, IMAGE);
        assert!(diags[0].message.contains("read again"), "{diags:?}");
    };

    let s = open(&config, Some(images.path())).await;
    assert_eq!(s.memory_rows_replayed().await, 0, "opened from the image");
    let image = memories::change_first_records(&path);
    assert_eq!(s.inspect(&m0, &scope(0)).await.unwrap(), expected.0);
    reported(&s);
    assert_eq!(s.memory_rows_replayed().await, rows);
    assert_eq!(seen(&s).await, truth);
    drop(s);

    std::fs::write(&path, &image).unwrap();
    let s = open(&config, Some(images.path())).await;
    assert_eq!(s.memory_rows_replayed().await, 0);
    memories::change_first_records(&path);
    memories::creating_m1_again_is_refused(&s).await;
    reported(&s);
    assert_eq!(s.inspect(&m1, &scope(1)).await.unwrap(), expected.1);
    assert_eq!(seen(&s).await, truth);
}

#[tokio::test]
async fn an_image_of_a_table_compacted_since_or_of_another_database_is_never_trusted() {
    let (config, rows) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    drop(open(&config, Some(images.path())).await);
    let path = images.path().join(IMAGE);
    let old = std::fs::read(&path).unwrap();

    // Another process forgets a memory the image holds live, then compacts: the row the image
    // ends at is gone.
    let other = open(&config, None).await;
    let (sc, id) = (scope(1), MemoryId::parse("m4999").unwrap());
    let cur = other.inspect(&id, &sc).await.unwrap().unwrap();
    assert!(cur.deleted_at.is_none());
    other
        .forget(&id, &sc, &cur.revision, MemorySource::system())
        .await
        .unwrap();
    let report = other.compact().await.unwrap();
    let s = open(&config, Some(images.path())).await;
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert_eq!(s.memory_rows_replayed().await, report.memory.1);
    assert!(s
        .inspect(&id, &sc)
        .await
        .unwrap()
        .unwrap()
        .deleted_at
        .is_some());
    assert_eq!(seen(&s).await, seen(&other).await);
    drop(s);
    // A process that compacts with an image directory saves the compacted table's image.
    let own = tempfile::tempdir().unwrap();
    let compacting = open(&config, Some(own.path())).await;
    compacting.compact().await.unwrap();
    let after = open(&config, Some(own.path())).await;
    assert_eq!(after.memory_rows_replayed().await, 0);
    assert_eq!(seen(&after).await, seen(&other).await);

    // Another database with other memories, opened with this database's image: its own rows.
    std::fs::write(&path, &old).unwrap();
    let elsewhere = pg_support::cluster().fresh_database().await;
    let few = open(&elsewhere, None).await;
    edit_fresh(&few).await;
    let s = open(&elsewhere, Some(images.path())).await;
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert_eq!(s.memory_rows_replayed().await, 2);
    assert_eq!(seen(&s).await, seen(&few).await);
    // Its own m4999, not the one the image holds.
    let mine = s.inspect(&id, &sc).await.unwrap().unwrap();
    assert_eq!(mine.content, "elsewhere");
    assert_eq!(mine, few.inspect(&id, &sc).await.unwrap().unwrap());
    assert!(rows > 2);
}

/// Two memories in a fresh store.
async fn edit_fresh(s: &PgStore) {
    for i in [4999, 1] {
        let w = tavern_store::conformance::write(&format!("m{i}"), scope(i % 2), "elsewhere");
        s.put(w, None, false).await.unwrap();
    }
}

#[tokio::test]
async fn a_fifo_named_memory_image_is_reported_not_opened() {
    let config = pg_support::cluster().fresh_database().await;
    let images = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(images.path().join(IMAGE))
        .status()
        .unwrap();
    assert!(made.success());
    // Were it opened, the open would block until a writer came: none will.
    let s = open(&config, Some(images.path())).await;
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].file, IMAGE);
    assert!(diags[0].message.contains("not a regular file"), "{diags:?}");
}

#[tokio::test]
async fn a_deferred_open_reads_the_image_at_the_first_memory_call_whichever_it_is() {
    let (config, rows) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    drop(open(&config, Some(images.path())).await);
    let other = open(&config, None).await;
    edit(&other, 20..23, "later").await;
    let tail = 2 * 3 + 1;
    let truth = from_rows_alone(&config, rows + tail).await;

    let deferred = |images| {
        open_with(
            &config,
            images,
            PgOptions::default().with_deferred_memory_load(),
        )
    };
    // Nothing read at open.
    let s = deferred(Some(images.path())).await;
    assert!(!s.memories_loaded());
    assert_eq!(s.memory_rows_replayed().await, 0);
    assert_eq!(s.memory_len().await, 0);
    // A write first: decided on the image and the rows after it, so a memory the image holds
    // is known (a create over it is refused) and the write lands after the rest.
    let taken = tavern_store::conformance::write("m10", scope(0), "again");
    assert!(s.put(taken, None, false).await.is_err());
    assert!(s.memories_loaded());
    assert_eq!(s.memory_rows_replayed().await, tail);
    assert_eq!(seen(&s).await, truth);
    // A search first, then `load_memories` (a no-op but for catching up).
    let s = deferred(Some(images.path())).await;
    assert_eq!(seen(&s).await, truth);
    s.load_memories().await.unwrap();
    assert_eq!(s.memory_rows_replayed().await, tail);
    // Without an image, `load_memories` reads every row.
    let s = deferred(None).await;
    s.load_memories().await.unwrap();
    assert!(s.memories_loaded());
    assert_eq!(s.memory_rows_replayed().await, rows + tail);
    assert_eq!(seen(&s).await, truth);
}

#[tokio::test]
async fn an_image_of_another_store_with_the_same_object_ids_and_last_row_is_never_trusted() {
    let (config, rows) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    drop(open(&config, Some(images.path())).await);
    let before = from_rows_alone(&config, rows).await;
    // What another store looks like when a cluster is made again from scratch (the same
    // object ids) and filled alike but for one earlier record: the same database and table,
    // the same last row, another history — and another identity token, made with its schema.
    let (client, conn) = config.connect(tavern_store::pg::NoTls).await.unwrap();
    let task = tokio::spawn(conn);
    client
        .batch_execute(
            "UPDATE memory_ops SET op = replace(op::text, 'lantern', 'beacon')::json
             WHERE seq = (SELECT min(seq) + 1 FROM memory_ops);
             UPDATE store_identity SET token = 'another store'",
        )
        .await
        .unwrap();
    drop(client);
    let _ = task.await;
    let s = open(&config, Some(images.path())).await;
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert_eq!(s.memory_rows_replayed().await, rows);
    let truth = from_rows_alone(&config, rows).await;
    assert_ne!(truth, before, "the other store differs in what a user sees");
    assert_eq!(seen(&s).await, truth);
}

/// `with_read_only_memory_image` reads an image but never writes one: not at an open that had
/// to read every row, nor when asked; and the store says whether it began from the image.
#[tokio::test]
async fn a_read_only_image_is_read_and_never_written() {
    let (config, rows) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    let path = images.path().join(IMAGE);
    let read_only = || PgOptions::default().with_read_only_memory_image();

    let s = open_with(&config, Some(images.path()), read_only()).await;
    assert_eq!(s.memory_rows_replayed().await, rows);
    assert!(!s.memory_image_read().await);
    assert!(!path.exists(), "an open that read every row saved nothing");
    edit(&s, 40..41, "changed").await;
    assert!(!s.save_memory_image().await.unwrap());
    assert!(!path.exists(), "nor did asking");
    drop(s);

    let host = open(&config, Some(images.path())).await;
    assert!(!host.memory_image_read().await);
    assert!(path.is_file());
    let image = std::fs::read(&path).unwrap();
    edit(&host, 41..42, "later").await;
    let s = open_with(&config, Some(images.path()), read_only()).await;
    assert!(s.memory_image_read().await);
    assert!(s.memory_rows_replayed().await < rows);
    assert_eq!(seen(&s).await, seen(&host).await);
    assert!(!s.save_memory_image().await.unwrap());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        image,
        "the image is untouched"
    );
}

/// A process killed while saving an image leaves a temporary file as large as the image: the
/// next open removes it once it is older than an hour (a younger one may be another process's
/// save in progress), and says so without naming the directory; a read-only open leaves it, and
/// no open touches another program's files.
#[tokio::test]
async fn the_temporary_file_of_a_killed_save_is_removed_by_the_next_open() {
    let (config, _) = filled_database().await;
    let images = tempfile::tempdir().unwrap();
    let hour_and_a_bit = std::time::Duration::from_secs(3700);
    let leftover = |name: &str, age: std::time::Duration| {
        let path = images.path().join(name);
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(1 << 20).unwrap();
        file.set_modified(std::time::SystemTime::now() - age)
            .unwrap();
        path
    };
    let old = leftover(".tmp-memory.image-killed", hour_and_a_bit);
    let young = leftover(".tmp-memory.image-saving", std::time::Duration::ZERO);
    // The directory is the operator's: another program's files stay, whatever their names.
    let foreign = leftover(".tmp-notes", hour_and_a_bit);
    let other = leftover("notes.tmp", hour_and_a_bit);

    let read_only = PgOptions::default().with_read_only_memory_image();
    let s = open_with(&config, Some(images.path()), read_only).await;
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert!(old.exists());
    drop(s);

    let s = open(&config, Some(images.path())).await;
    assert!(!old.exists());
    assert!(young.exists() && foreign.exists() && other.exists());
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].file, ".tmp-memory.image-killed");
    assert!(
        diags[0].message.contains("interrupted image save"),
        "{diags:?}"
    );
    assert!(!diags[0].message.contains(&*images.path().to_string_lossy()));
    assert!(images.path().join(IMAGE).is_file());
}
