//! A file store saves an image of its memory table (`memory.image`) and opens from it,
//! replaying only the log lines written after; a damaged image is reported and the log read
//! instead, an image of a log that was compacted or replaced since is never trusted, and every
//! way of opening yields the same records, audit trails and search scores.

use std::sync::Arc;

use tavern_core::MemoryId;
use tavern_store::clock::ManualClock;
use tavern_store::conformance::{write, T0};
use tavern_store::fs::FsStore;
use tavern_store::{MemoryQuery, MemoryStore};

#[path = "support/memories.rs"]
mod memories;

use memories::{edit, fill, scope, seen};

const IMAGE: &str = "memory.image";

fn open(dir: &std::path::Path) -> FsStore {
    FsStore::open(dir, Arc::new(ManualClock::new(T0))).unwrap()
}

/// A store filled (`fill`) and closed: it saved its image.
async fn filled() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(dir.path());
        fill(&s).await;
    }
    dir
}

fn log_lines(dir: &std::path::Path) -> u64 {
    std::fs::read_to_string(dir.join("memory.log"))
        .unwrap()
        .lines()
        .count() as u64
}

/// The store as read from its log alone: a copy of the directory without the image.
async fn from_log_alone(dir: &std::path::Path) -> String {
    let copy = tempfile::tempdir().unwrap();
    for f in ["memory.log", "variables.log"] {
        std::fs::copy(dir.join(f), copy.path().join(f)).unwrap();
    }
    let s = open(copy.path());
    assert_eq!(s.memory_lines_replayed(), log_lines(dir));
    seen(&s).await
}

#[tokio::test]
async fn a_store_opens_from_its_image_and_replays_only_what_came_after() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(dir.path());
        fill(&s).await;
        assert!(
            !dir.path().join(IMAGE).exists(),
            "saved before the store closed"
        );
    }
    // Dropped after thousands of lines: the image is saved.
    assert!(dir.path().join(IMAGE).is_file());
    {
        let s = open(dir.path());
        assert_eq!(s.memory_lines_replayed(), 0);
        // A few lines more: too few for a new image.
        edit(&s, 20..23, "later").await;
    }
    let s = open(dir.path());
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    let tail = 2 * 3 + 1;
    assert_eq!(s.memory_lines_replayed(), tail);
    assert_eq!(seen(&s).await, from_log_alone(dir.path()).await);
    // It goes on from there like any store: writes, and another image at will.
    edit(&s, 30..31, "after").await;
    assert!(s.save_memory_image().unwrap());
    assert!(!s.save_memory_image().unwrap(), "nothing new to save");
    let again = open(dir.path());
    assert_eq!(again.memory_lines_replayed(), 0);
    assert_eq!(seen(&again).await, seen(&s).await);
}

#[tokio::test]
async fn a_damaged_image_is_reported_and_the_log_read_instead() {
    let dir = filled().await;
    let image = std::fs::read(dir.path().join(IMAGE)).unwrap();
    let truth = from_log_alone(dir.path()).await;
    for damaged in memories::damaged(&image) {
        std::fs::write(dir.path().join(IMAGE), &damaged).unwrap();
        let s = open(dir.path());
        let diags = s.diagnostics();
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert_eq!(diags[0].file, IMAGE);
        assert!(diags[0].message.contains("damaged"), "{}", diags[0].message);
        assert!(!diags[0].message.contains(&*dir.path().to_string_lossy()));
        assert_eq!(s.memory_lines_replayed(), log_lines(dir.path()));
        assert_eq!(seen(&s).await, truth);
    }
    // `tavern check` finds a damaged image without opening the store.
    let saved_again = std::fs::read(dir.path().join(IMAGE)).unwrap();
    std::fs::write(dir.path().join(IMAGE), &image[..image.len() / 2]).unwrap();
    let report = tavern_store::fs::check_files(dir.path(), |_, _| {});
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert_eq!(report.problems[0].file, IMAGE);
    assert!(report.problems[0].problem.contains("damaged"), "{report:?}");
    std::fs::write(dir.path().join(IMAGE), saved_again).unwrap();
    // The open that read the log saved a good image again.
    let s = open(dir.path());
    assert!(s.diagnostics().is_empty());
    assert_eq!(s.memory_lines_replayed(), 0);
    assert_eq!(seen(&s).await, truth);
}

/// Posting lists are read where they lie in the image when a search first needs them: one
/// damaged after the open checked the rest is found then — the search answers from the index
/// rebuilt from the records, the damage is reported and the image saved again — and `tavern
/// check` finds it without opening the store.
#[tokio::test]
async fn a_posting_list_damaged_in_the_image_is_found_when_read_and_healed() {
    let dir = filled().await;
    let truth = from_log_alone(dir.path()).await;
    let mut image = std::fs::read(dir.path().join(IMAGE)).unwrap();
    let postings = memories::postings_at(&image);
    assert!(
        postings < image.len(),
        "{postings} of {} bytes checked at open",
        image.len()
    );
    for b in &mut image[postings..] {
        *b ^= 0x5a;
    }
    std::fs::write(dir.path().join(IMAGE), &image).unwrap();
    let report = tavern_store::fs::check_files(dir.path(), |_, _| {});
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert!(
        report.problems[0].problem.contains("posting list"),
        "{report:?}"
    );

    let s = open(dir.path());
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert_eq!(s.memory_lines_replayed(), 0, "opened from the image");
    assert_eq!(seen(&s).await, truth);
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].file, IMAGE);
    assert!(diags[0].message.contains("rebuilt"), "{}", diags[0].message);
    drop(s);
    // Saved again, whole: the next open reads it and meets no damage.
    assert!(tavern_store::fs::check_files(dir.path(), |_, _| {})
        .problems
        .is_empty());
    let s = open(dir.path());
    assert_eq!(s.memory_lines_replayed(), 0);
    assert_eq!(seen(&s).await, truth);
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
}

/// Records are read where they lie in the image when first needed, each checked against the
/// checksum the open took of it: a record changed in the file after the open (another program
/// writing into it) is never used — the table is read again from the log and the change
/// reported — so a read, a search and a write that would create an existing id all answer as
/// the log says.
#[tokio::test]
async fn a_record_changed_in_the_image_after_the_open_is_never_used() {
    let dir = filled().await;
    let truth = from_log_alone(dir.path()).await;
    let path = dir.path().join(IMAGE);
    let (m0, m1) = (
        MemoryId::parse("m0").unwrap(),
        MemoryId::parse("m1").unwrap(),
    );
    let expected = {
        let copy = tempfile::tempdir().unwrap();
        std::fs::copy(
            dir.path().join("memory.log"),
            copy.path().join("memory.log"),
        )
        .unwrap();
        let s = open(copy.path());
        (
            s.inspect(&m0, &scope(0)).await.unwrap(),
            s.inspect(&m1, &scope(1)).await.unwrap(),
        )
    };
    let reported = |s: &FsStore| {
        let diags = s.diagnostics();
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert_eq!(diags[0].file, IMAGE);
        assert!(diags[0].message.contains("read again"), "{diags:?}");
    };

    // A read.
    let s = open(dir.path());
    assert_eq!(s.memory_lines_replayed(), 0, "opened from the image");
    let image = memories::change_first_records(&path);
    // `tavern check` reads every record where it lies, and finds them.
    let report = tavern_store::fs::check_files(dir.path(), |_, _| {});
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert!(
        report.problems[0]
            .problem
            .contains("a record does not read back"),
        "{report:?}"
    );
    assert_eq!(s.inspect(&m0, &scope(0)).await.unwrap(), expected.0);
    reported(&s);
    assert_eq!(s.memory_lines_replayed(), log_lines(dir.path()));
    assert_eq!(seen(&s).await, truth);
    drop(s);

    // A write creating an id that exists (in a record that can no longer be read): refused
    // as the log says, not written over it.
    std::fs::write(&path, &image).unwrap();
    let s = open(dir.path());
    assert_eq!(s.memory_lines_replayed(), 0);
    memories::change_first_records(&path);
    memories::creating_m1_again_is_refused(&s).await;
    reported(&s);
    assert_eq!(s.inspect(&m1, &scope(1)).await.unwrap(), expected.1);
    assert_eq!(seen(&s).await, truth);
    drop(s);

    // A copy of every record.
    std::fs::write(&path, &image).unwrap();
    let s = open(dir.path());
    memories::change_first_records(&path);
    let target_dir = tempfile::tempdir().unwrap();
    let target = open(target_dir.path());
    tavern_store::copy_store(&s, &target).await.unwrap();
    reported(&s);
    assert_eq!(target.inspect(&m0, &scope(0)).await.unwrap(), expected.0);
    assert_eq!(target.inspect(&m1, &scope(1)).await.unwrap(), expected.1);
    assert_eq!(seen(&s).await, truth);
    drop(s);

    // A search, then a compaction: the log it writes holds every record.
    std::fs::write(&path, &image).unwrap();
    let s = open(dir.path());
    memories::change_first_records(&path);
    assert_eq!(seen(&s).await, truth);
    reported(&s);
    drop(s);
    std::fs::write(&path, &image).unwrap();
    let s = open(dir.path());
    memories::change_first_records(&path);
    s.compact().unwrap();
    reported(&s);
    drop(s);
    let s = open(dir.path());
    assert_eq!(s.inspect(&m0, &scope(0)).await.unwrap(), expected.0);
    assert_eq!(s.inspect(&m1, &scope(1)).await.unwrap(), expected.1);
}

/// A header claiming lengths no image has (beyond what a file can hold, a checked part longer
/// than the body or shorter than the anchor) is reported as damage, never read or allocated.
#[tokio::test]
async fn an_image_header_claiming_impossible_lengths_is_reported_not_read() {
    let dir = filled().await;
    let truth = from_log_alone(dir.path()).await;
    let image = std::fs::read(dir.path().join(IMAGE)).unwrap();
    let size = image.len() as u64;
    for (body, checked) in [
        (u64::MAX - 39, 1 << 40),
        (u64::MAX - 40, 1 << 40),
        (size - 40, size),
        (size - 40, 8),
    ] {
        let mut bad = image.clone();
        bad[8..16].copy_from_slice(&body.to_le_bytes());
        bad[16..24].copy_from_slice(&checked.to_le_bytes());
        std::fs::write(dir.path().join(IMAGE), &bad).unwrap();
        let s = open(dir.path());
        let diags = s.diagnostics();
        assert_eq!(diags.len(), 1, "{body} {checked}: {diags:?}");
        assert!(diags[0].message.contains("damaged"), "{diags:?}");
        assert_eq!(s.memory_lines_replayed(), log_lines(dir.path()));
        assert_eq!(seen(&s).await, truth);
    }
}

/// An image saved from a table read from a damaged one copies its posting lists never read:
/// checked first, the damage found, the index rebuilt from the records and the image saved
/// whole — with no search first.
#[tokio::test]
async fn saving_an_image_over_damaged_posting_lists_heals_first() {
    let dir = filled().await;
    let mut image = std::fs::read(dir.path().join(IMAGE)).unwrap();
    let last = image.len() - 1;
    image[last] ^= 0x5a;
    std::fs::write(dir.path().join(IMAGE), &image).unwrap();
    let s = open(dir.path());
    assert_eq!(s.memory_lines_replayed(), 0);
    edit(&s, 40..41, "one more").await;
    assert!(s.save_memory_image().unwrap());
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert!(diags[0].message.contains("rebuilt"), "{diags:?}");
    drop(s);
    assert!(tavern_store::fs::check_files(dir.path(), |_, _| {})
        .problems
        .is_empty());
    let truth = from_log_alone(dir.path()).await;
    let s = open(dir.path());
    assert_eq!(s.memory_lines_replayed(), 0);
    assert_eq!(seen(&s).await, truth);
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
}

/// An image of another format version (an older release's: the postings' layout changed) is
/// not damage: it is ignored without a diagnostic, the log read instead, and a new image of
/// this version saved.
#[tokio::test]
async fn an_image_of_another_format_version_is_ignored_and_saved_again() {
    let dir = filled().await;
    let mut image = std::fs::read(dir.path().join(IMAGE)).unwrap();
    let truth = from_log_alone(dir.path()).await;
    let version = image[7];
    image[7] = version - 1;
    std::fs::write(dir.path().join(IMAGE), &image).unwrap();
    let s = open(dir.path());
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert_eq!(s.memory_lines_replayed(), log_lines(dir.path()));
    assert_eq!(seen(&s).await, truth);
    drop(s);
    assert_eq!(std::fs::read(dir.path().join(IMAGE)).unwrap()[7], version);
    let s = open(dir.path());
    assert_eq!(s.memory_lines_replayed(), 0);
    assert_eq!(seen(&s).await, truth);
}

#[tokio::test]
async fn an_image_larger_than_its_log_could_have_is_refused_unread() {
    let dir = filled().await;
    let truth = from_log_alone(dir.path()).await;
    let log_len = std::fs::metadata(dir.path().join("memory.log"))
        .unwrap()
        .len();
    // The real image's first bytes, then (sparse) far more than an image of this log holds.
    let image = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(IMAGE))
        .unwrap();
    image.set_len(log_len * 8 + (2 << 20)).unwrap();
    drop(image);
    let s = open(dir.path());
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].file, IMAGE);
    assert!(
        diags[0]
            .message
            .contains("more than an image of this table"),
        "{}",
        diags[0].message
    );
    assert_eq!(s.memory_lines_replayed(), log_lines(dir.path()));
    assert_eq!(seen(&s).await, truth);
}

#[tokio::test]
async fn an_image_of_a_log_replaced_since_is_never_trusted() {
    let dir = filled().await;
    let old_image = std::fs::read(dir.path().join(IMAGE)).unwrap();
    {
        // One record's text changes to another of the same length, and the log is
        // compacted: same size, same first and last lines, different contents.
        let s = open(dir.path());
        let (sc, id) = (scope(0), MemoryId::parse("m2002").unwrap());
        let cur = s.inspect(&id, &sc).await.unwrap().unwrap();
        let same_length = cur.content.replace("river", "rivet");
        assert_eq!(same_length.len(), cur.content.len());
        assert_ne!(same_length, cur.content);
        s.put(write("m2002", sc, &same_length), Some(&cur.revision), false)
            .await
            .unwrap();
        s.compact().unwrap();
    }
    let report = tavern_store::fs::check_files(dir.path(), |_, _| {});
    assert!(
        report.problems.is_empty() && report.warnings.is_empty(),
        "{report:?}"
    );
    // Another process put back the image of the log before.
    std::fs::write(dir.path().join(IMAGE), &old_image).unwrap();
    let report = tavern_store::fs::check_files(dir.path(), |_, _| {});
    assert!(report.problems.is_empty(), "{report:?}");
    assert_eq!(report.warnings.len(), 1, "{report:?}");
    assert!(
        report.warnings[0].problem.contains("earlier memory.log"),
        "{report:?}"
    );
    // A stale image is not a problem: the log is read whole.
    opens_from_the_log_with_the_rivet(dir.path()).await;
}

#[tokio::test]
async fn two_handles_on_one_store_keep_their_images_true() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    fill(&a).await;
    let b = open(dir.path());
    // b writes while a's table is behind; a saves an image of what it has read.
    edit(&b, 40..42, "from b").await;
    assert!(a.save_memory_image().unwrap());
    let c = open(dir.path());
    // c read a's image and the lines b wrote after a's read.
    assert!(
        c.memory_lines_replayed() < 20,
        "{}",
        c.memory_lines_replayed()
    );
    assert_eq!(seen(&c).await, seen(&b).await);
    assert_eq!(seen(&c).await, from_log_alone(dir.path()).await);
}

#[tokio::test]
async fn an_image_is_not_trusted_for_a_log_changed_in_place_to_the_same_length() {
    let dir = filled().await;
    assert!(dir.path().join(IMAGE).is_file());
    // Another program rewrites one line in the middle: same length, valid checksum.
    let log = std::fs::read_to_string(dir.path().join("memory.log")).unwrap();
    let mut lines: Vec<String> = log.lines().map(str::to_owned).collect();
    let at = lines
        .iter()
        .position(|l| l.contains("the river spirit keeps the old bridge 2002"))
        .unwrap();
    let payload = lines[at]
        .split_once(' ')
        .unwrap()
        .1
        .replace("river", "rivet");
    lines[at] = format!(
        "{} {payload}",
        tavern_core::revision::short_digest(&[payload.as_bytes()])
    );
    let changed = lines.join("\n") + "\n";
    assert_eq!(changed.len(), log.len());
    std::fs::write(dir.path().join("memory.log"), changed).unwrap();
    opens_from_the_log_with_the_rivet(dir.path()).await;
}

/// Opening reads the whole log, reports nothing, and finds the record changed to "rivet".
async fn opens_from_the_log_with_the_rivet(dir: &std::path::Path) {
    let s = open(dir);
    assert!(s.diagnostics().is_empty(), "{:?}", s.diagnostics());
    assert_eq!(s.memory_lines_replayed(), log_lines(dir));
    let rivet = s
        .search(&MemoryQuery::new("rivet", vec![scope(0)]))
        .await
        .unwrap();
    assert_eq!(rivet.hits.len(), 1);
    assert_eq!(seen(&s).await, from_log_alone(dir).await);
}

#[tokio::test]
async fn a_handle_behind_a_compaction_saves_an_image_no_open_trusts() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    fill(&a).await;
    let b = open(dir.path());
    // b forgets records a still holds live, then compacts: a new log file.
    edit(&b, 100..130, "from b").await;
    b.compact().unwrap();
    // a has read nothing since; the image it saves reflects the bytes it read, not the file
    // now at memory.log, so no open takes it for the new log.
    assert!(a.save_memory_image().unwrap());
    drop(a);
    let c = open(dir.path());
    assert_eq!(c.memory_lines_replayed(), log_lines(dir.path()));
    assert_eq!(seen(&c).await, from_log_alone(dir.path()).await);
    let forgotten = MemoryId::parse("m102").unwrap();
    assert!(c.read(&forgotten, &scope(0)).await.unwrap().is_none());
}

/// Importance and confidence read back from the log are the numbers written (serde_json's
/// `float_roundtrip`): an open from the image and one from the log agree bit for bit.
#[tokio::test]
async fn numbers_read_from_the_log_are_the_numbers_written() {
    // Each of these reads back one ulp off without `float_roundtrip`.
    let values = [
        0.985_690_694_632_869_5_f64,
        0.1 + 0.2,
        0.333_333_333_333_333_3,
    ];
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    for (i, v) in values.iter().enumerate() {
        let mut w = write(&format!("f{i}"), scope(0), "a lantern");
        w.importance = *v;
        w.confidence = 1.0 - *v;
        s.put(w, None, false).await.unwrap();
    }
    assert!(s.save_memory_image().unwrap());
    let copy = tempfile::tempdir().unwrap();
    for f in ["memory.log", "variables.log"] {
        std::fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
    }
    let (from_image, from_log) = (open(dir.path()), open(copy.path()));
    assert_eq!(from_image.memory_lines_replayed(), 0);
    for (i, v) in values.iter().enumerate() {
        let id = MemoryId::parse(format!("f{i}")).unwrap();
        for s in [&from_image, &from_log] {
            let r = s.inspect(&id, &scope(0)).await.unwrap().unwrap();
            assert_eq!(r.importance.to_bits(), v.to_bits(), "{i}");
            assert_eq!(r.confidence.to_bits(), (1.0 - v).to_bits(), "{i}");
        }
    }
}

/// A FIFO (or any non-file) named `memory.image` is reported, never opened: an open that read
/// it would wait for a writer forever.
#[test]
fn a_fifo_named_memory_image_is_reported_not_opened() {
    let dir = tempfile::tempdir().unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join(IMAGE))
        .status()
        .unwrap();
    assert!(made.success());
    // Were it opened, the open would block until a writer came: none will (no thread waits
    // to rescue it, so a regression hangs the test run and fails CI loudly by its timeout).
    let s = open(dir.path());
    let diags = s.diagnostics();
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].file, IMAGE);
    assert!(diags[0].message.contains("not a regular file"), "{diags:?}");
    let report = tavern_store::fs::check_files(dir.path(), |_, _| {});
    assert_eq!(report.problems.len(), 1, "{report:?}");
    assert_eq!(report.problems[0].file, IMAGE);
}
