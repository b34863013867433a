//! The store benchmark: one run, one table, each number next to its reference measured in the
//! same run on the same machine.
//!
//! `cargo run --release -p tavern-store --features bench --bin store-bench [-- --records N
//! --queries Q --puts P --work DIR --json --keep]`
//!
//! - search p50/p99 over a reproducible corpus of mixed Chinese/English memories, against
//!   tantivy under our analyzer (`tantivy_ref.rs`) and SQLite FTS5 (bundled, bm25, trigram
//!   tokenizer) on the same corpus and queries, the three taking turns per query, with
//!   recall@10 of each against the records the generator planted for each query;
//! - search p50 again after 100 records were edited and 100 forgotten (a store in use), beside
//!   tantivy's unchanged index, with the time per durable edit or forget;
//! - build time of each index;
//! - durable CAS `put` throughput against a bare write-temp + fsync + rename + dir-fsync loop;
//! - 8 concurrent writers: updates acknowledged vs found afterwards;
//! - the time to save the memory image (`FsStore::save_memory_image`) and its size;
//! - open + first query and the resident set after every query, ours and tantivy's, each in a
//!   fresh process (`child.rs`); ours from its image, and again from the log alone (a copy of
//!   the store without its image: what every open cost before images).
//!
//! `--json` prints one document instead of the table: `records`, `searchP50RatioTantivy`,
//! `searchP50RatioFts5`, `recallAt10`, `coldOpenMs`, `rssMiB` and the rest (`docs/PERFORMANCE.md`).
//!
//! `… --features bench,postgres --bin store-bench -- --backend postgres --pg SETTINGS` compares
//! PgStore with FsStore instead (`postgres.rs`; SETTINGS name an empty database); with
//! `--faults [--seconds S]` it measures what one host's trouble costs the others (`faults.rs`).

use std::collections::HashSet;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tavern_core::{
    AgentId, MemoryId, MemoryKind, MemorySource, MemoryWrite, ScopeKey, VariableName,
};
use tavern_store::fs::FsStore;
use tavern_store::{MemoryQuery, MemoryStore, StoreError, SystemClock, VariableStore};

/// SplitMix64: tiny, deterministic, good enough for corpus generation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const SYLLABLES: [&str; 24] = [
    "ka", "lo", "mi", "ren", "sa", "tor", "vel", "an", "dor", "el", "fin", "gar", "hal", "is",
    "jun", "ko", "lum", "mor", "nel", "or", "pa", "qu", "ris", "tha",
];
const COMMON_ZH: &str = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严";

fn english_word(rng: &mut Rng) -> String {
    let n = 1 + rng.below(3);
    (0..n)
        .map(|_| SYLLABLES[rng.below(SYLLABLES.len())])
        .collect()
}

struct Corpus {
    records: Vec<(String, String)>,
    queries: Vec<(String, HashSet<String>)>,
}

/// Generates `n` records; each of `q` queries has a unique planted topic (an invented English
/// word or a 4-character Chinese phrase) in 5 records, which are its relevant set.
fn corpus(n: usize, q: usize) -> Corpus {
    let mut rng = Rng(0x5EED_7A7E_0000_0001);
    let zh: Vec<char> = COMMON_ZH.chars().collect();
    let mut records: Vec<(String, String)> = (0..n)
        .map(|i| {
            let text = if i % 2 == 0 {
                (0..(8 + rng.below(20)))
                    .map(|_| english_word(&mut rng))
                    .collect::<Vec<_>>()
                    .join(" ")
            } else {
                (0..(12 + rng.below(30)))
                    .map(|_| zh[rng.below(zh.len())])
                    .collect()
            };
            (format!("m{i}"), text)
        })
        .collect();
    let mut queries = Vec::with_capacity(q);
    let mut used = HashSet::new();
    for k in 0..q {
        let topic = loop {
            let t = if k % 2 == 0 {
                format!("zx{}q{}", english_word(&mut rng), k)
            } else {
                // Rare-ish phrase from the same alphabet; uniqueness checked below.
                (0..4).map(|_| zh[rng.below(zh.len())]).collect()
            };
            if used.insert(t.clone()) {
                break t;
            }
        };
        let mut relevant = HashSet::new();
        for _ in 0..5 {
            let idx = rng.below(n);
            let (id, text) = &mut records[idx];
            if k % 2 == 0 {
                text.push(' ');
                text.push_str(&topic);
            } else {
                let cut = text
                    .char_indices()
                    .nth(text.chars().count() / 2)
                    .map_or(0, |c| c.0);
                text.insert_str(cut, &topic);
            }
            relevant.insert(id.clone());
        }
        let noise = if k % 2 == 0 {
            english_word(&mut rng)
        } else {
            zh[rng.below(zh.len())].to_string()
        };
        queries.push((format!("{topic} {noise}"), relevant));
    }
    Corpus { records, queries }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// Records edited, and others forgotten, before searching again.
const EDITS: usize = 100;

fn recall(got: &[String], relevant: &HashSet<String>) -> f64 {
    let hit = got.iter().filter(|id| relevant.contains(*id)).count();
    hit as f64 / relevant.len().min(10) as f64
}

fn scope() -> ScopeKey {
    ScopeKey::Agent {
        agent: AgentId::parse("bench").expect("valid literal"),
    }
}

fn write_for(id: &str, text: &str) -> Result<MemoryWrite, Box<dyn std::error::Error>> {
    Ok(MemoryWrite {
        id: MemoryId::parse(id)?,
        scope: scope(),
        kind: MemoryKind::Semantic,
        content: text.to_owned(),
        tags: Vec::new(),
        importance: 0.5,
        confidence: 0.5,
        source: MemorySource::system(),
        expires_at: None,
    })
}

/// FTS5 query: each term quoted (trigram needs 3+ characters) and OR-ed.
fn fts_query(text: &str) -> String {
    text.split_whitespace()
        .filter(|t| t.chars().count() >= 3)
        .map(|t| format!("\"{}\"", t.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(" OR ")
}

fn arg(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

mod child;
#[cfg(feature = "postgres")]
mod faults;
#[cfg(feature = "postgres")]
mod postgres;
mod tantivy_ref;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    match value("--backend").map(String::as_str) {
        None | Some("file") => {}
        #[cfg(feature = "postgres")]
        Some("postgres") => {
            let settings = value("--pg")
                .ok_or("--backend postgres needs --pg SETTINGS naming an empty database")?;
            if args.iter().any(|a| a == "--faults") {
                let window = Duration::from_secs(arg(&args, "--seconds", 10) as u64);
                let rows = faults::run(settings, window)?;
                println!("| window | hosts B and C | of calm | the stuck host |");
                println!("|---|---|---|---|");
                for r in rows {
                    println!("| {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
                }
                return Ok(());
            }
            let rows = postgres::run(
                settings,
                arg(&args, "--records", 10_000),
                arg(&args, "--queries", 500),
                arg(&args, "--puts", 500),
            )?;
            println!("| measurement | PgStore | FsStore / server floor | ratio / note |");
            println!("|---|---|---|---|");
            for r in rows {
                println!("| {} | {} | {} | {} |", r[0], r[1], r[2], r[3]);
            }
            return Ok(());
        }
        Some(other) => {
            return Err(format!(
                "unknown --backend {other} (file, or postgres with the postgres feature)"
            )
            .into())
        }
    }
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let usage = "--child needs ENGINE DIR QUERIES";
        let engine = args.get(i + 1).ok_or(usage)?;
        let dir = args.get(i + 2).ok_or(usage)?;
        let queries = args.get(i + 3).ok_or(usage)?;
        let path = std::path::Path::new;
        return child::run(engine, path(dir), path(queries));
    }
    let n = arg(&args, "--records", 100_000);
    let q = arg(&args, "--queries", 1_000);
    let puts = arg(&args, "--puts", 500);
    let as_json = args.iter().any(|a| a == "--json");
    // `--work DIR`: where the indexes are written (default `target/store-bench`).
    let base = value("--work").map_or_else(
        || std::path::Path::new("target").join("store-bench"),
        std::path::PathBuf::from,
    );
    std::fs::create_dir_all(&base)?;
    let work = tempfile::tempdir_in(&base)?;
    // `--keep` leaves the data behind for profiling the cold open.
    let (work_path, _guard) = if args.iter().any(|a| a == "--keep") {
        (work.keep(), None)
    } else {
        (work.path().to_path_buf(), Some(work))
    };
    let mut rows: Vec<[String; 5]> = Vec::new();
    let mut doc = serde_json::Map::new();
    doc.insert("records".into(), json!(n));
    doc.insert("queries".into(), json!(q));

    eprintln!("generating {n} records and {q} queries…");
    let corpus = corpus(n, q);
    let queries_file = work_path.join("queries.txt");
    let mut lines = String::new();
    for (text, _) in &corpus.queries {
        lines.push_str(text);
        lines.push('\n');
    }
    std::fs::write(&queries_file, lines)?;

    // --- build the three indexes ----------------------------------------------------------
    eprintln!("building tavern-store…");
    let root = work_path.as_path().join("tavern");
    let clock = Arc::new(SystemClock);
    let store = FsStore::open(&root, clock.clone())?;
    let t = Instant::now();
    for chunk in corpus.records.chunks(10_000) {
        let writes = chunk
            .iter()
            .map(|(id, text)| write_for(id, text))
            .collect::<Result<Vec<_>, _>>()?;
        store.import_memories(writes)?;
    }
    let import_time = t.elapsed();

    eprintln!("building SQLite FTS5…");
    let db = rusqlite::Connection::open(work_path.as_path().join("fts.db"))?;
    db.execute_batch(
        "CREATE VIRTUAL TABLE m USING fts5(id UNINDEXED, content, tokenize='trigram');",
    )?;
    let t = Instant::now();
    {
        let tx = db.unchecked_transaction()?;
        {
            let mut ins = tx.prepare("INSERT INTO m(id, content) VALUES (?1, ?2)")?;
            for (id, text) in &corpus.records {
                ins.execute((id, text))?;
            }
        }
        tx.commit()?;
    }
    let fts_build = t.elapsed();

    eprintln!("building tantivy…");
    let tantivy_dir = work_path.join("tantivy");
    let t = Instant::now();
    tantivy_ref::build(&tantivy_dir, &corpus.records)?;
    let tantivy_build = t.elapsed();
    let secs = |d: Duration| d.as_secs_f64();
    rows.push([
        format!("build index ({n} records)"),
        format!("{:.2} s (bulk import, durable)", secs(import_time)),
        format!("{:.2} s (one commit, 2 threads)", secs(tantivy_build)),
        format!("{:.2} s (one transaction)", secs(fts_build)),
        format!("{:.2}× tantivy", secs(import_time) / secs(tantivy_build)),
    ]);
    doc.insert(
        "buildSeconds".into(),
        json!({"ours": secs(import_time), "tantivy": secs(tantivy_build), "fts5": secs(fts_build)}),
    );
    doc.insert(
        "buildRatioTantivy".into(),
        json!(secs(import_time) / secs(tantivy_build)),
    );

    // --- search ---------------------------------------------------------------------------
    eprintln!("searching…");
    let reference = tantivy_ref::Reference::open(&tantivy_dir)?;
    let scopes = vec![scope()];
    let mut stmt = db.prepare("SELECT id FROM m WHERE m MATCH ?1 ORDER BY bm25(m) LIMIT 10")?;
    // Per engine (ours, tantivy, FTS5): latencies, recall sum, recall sum per language.
    let mut times: [Vec<Duration>; 3] = Default::default();
    let mut recalls = [0.0f64; 3];
    let mut by_lang = [[0.0f64; 2]; 3];
    // Warm all three once so none pays first-touch costs in the measurement.
    for (text, _) in corpus.queries.iter().take(20) {
        rt().block_on(store.search(&MemoryQuery::new(text.clone(), scopes.clone())))?;
        reference.search(text)?;
        stmt.query_map([fts_query(text)], |r| r.get::<_, String>(0))?
            .count();
    }
    for (k, (text, relevant)) in corpus.queries.iter().enumerate() {
        // The engines take turns going first, so none always follows the same one.
        for turn in 0..3 {
            let engine = (k + turn) % 3;
            let t = Instant::now();
            let ids: Vec<String> = match engine {
                0 => {
                    let query = MemoryQuery::new(text.clone(), scopes.clone());
                    let res = rt().block_on(store.search(&query))?;
                    let elapsed = t.elapsed();
                    times[0].push(elapsed);
                    res.hits.iter().map(|h| h.record.id.to_string()).collect()
                }
                1 => {
                    let found = reference.search(text)?;
                    times[1].push(t.elapsed());
                    found
                        .into_iter()
                        .map(|i| corpus.records[i].0.clone())
                        .collect()
                }
                _ => {
                    let found = stmt
                        .query_map([fts_query(text)], |r| r.get::<_, String>(0))?
                        .collect::<Result<Vec<_>, _>>()?;
                    times[2].push(t.elapsed());
                    found
                }
            };
            let r = recall(&ids, relevant);
            recalls[engine] += r;
            by_lang[engine][k % 2] += r;
        }
    }
    for t in &mut times {
        t.sort();
    }
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1e3);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    for (label, key, p) in [
        ("search p50", "searchP50Ms", 0.5),
        ("search p99", "searchP99Ms", 0.99),
    ] {
        let [a, b, c] = [0, 1, 2].map(|e| percentile(&times[e], p));
        rows.push([
            format!("{label} ({q} queries)"),
            ms(a),
            ms(b),
            ms(c),
            format!(
                "{:.2}× tantivy, {:.2}× FTS5 (lower is faster)",
                ratio(a, b),
                ratio(a, c)
            ),
        ]);
        let f = |d: Duration| d.as_secs_f64() * 1e3;
        doc.insert(
            key.into(),
            json!({"ours": f(a), "tantivy": f(b), "fts5": f(c)}),
        );
        if p == 0.5 {
            doc.insert("searchP50RatioTantivy".into(), json!(ratio(a, b)));
            doc.insert("searchP50RatioFts5".into(), json!(ratio(a, c)));
        }
    }
    let recall_of = |e: usize| recalls[e] / q.max(1) as f64;
    rows.push([
        "recall@10 of planted records".into(),
        format!("{:.3}", recall_of(0)),
        format!("{:.3}", recall_of(1)),
        format!("{:.3}", recall_of(2)),
        "higher is better".into(),
    ]);
    doc.insert("recallAt10".into(), json!(recall_of(0)));
    doc.insert("recallAt10Tantivy".into(), json!(recall_of(1)));
    doc.insert("recallAt10Fts5".into(), json!(recall_of(2)));
    let half = (q as f64 / 2.0).max(1.0);
    let lang = |e: usize| format!("{:.3} / {:.3}", by_lang[e][0] / half, by_lang[e][1] / half);
    rows.push([
        "recall@10 English / Chinese queries".into(),
        lang(0),
        lang(1),
        lang(2),
        "-".into(),
    ]);
    drop(stmt);
    drop(db);

    // --- search after edits ------------------------------------------------------------------
    // A store in use has records edited and forgotten since it was opened: their old postings
    // linger until a compaction, and every posting of a query's terms must be checked.
    eprintln!("editing and forgetting {EDITS} records each, then searching again…");
    let planted: HashSet<&String> = corpus.queries.iter().flat_map(|(_, r)| r).collect();
    let mut unplanted = corpus
        .records
        .iter()
        .step_by(97)
        .filter(|(id, _)| !planted.contains(id));
    let edit_start = Instant::now();
    for forget in [false, true] {
        for (id, text) in unplanted.by_ref().take(EDITS) {
            let id = MemoryId::parse(id)?;
            let current = rt()
                .block_on(store.inspect(&id, &scope()))?
                .ok_or("an edited record is missing")?;
            if forget {
                rt().block_on(store.forget(
                    &id,
                    &scope(),
                    &current.revision,
                    MemorySource::system(),
                ))?;
            } else {
                let edit = write_for(id.as_str(), &format!("{text} edited"))?;
                rt().block_on(store.put(edit, Some(&current.revision), false))?;
            }
        }
    }
    let edit_ms = edit_start.elapsed().as_secs_f64() * 1e3 / (2 * EDITS) as f64;
    let mut after: [Vec<Duration>; 2] = Default::default();
    let mut recall_after = 0.0;
    for (k, (text, relevant)) in corpus.queries.iter().enumerate() {
        for turn in 0..2 {
            let t = Instant::now();
            if (k + turn) % 2 == 0 {
                let query = MemoryQuery::new(text.clone(), scopes.clone());
                let res = rt().block_on(store.search(&query))?;
                after[0].push(t.elapsed());
                let ids: Vec<String> = res.hits.iter().map(|h| h.record.id.to_string()).collect();
                recall_after += recall(&ids, relevant);
            } else {
                reference.search(text)?;
                after[1].push(t.elapsed());
            }
        }
    }
    for t in &mut after {
        t.sort();
    }
    let (a, b) = (percentile(&after[0], 0.5), percentile(&after[1], 0.5));
    rows.push([
        format!("search p50 after {EDITS} edits + {EDITS} forgets"),
        ms(a),
        ms(b),
        "-".into(),
        format!(
            "{:.2}× tantivy (its index unchanged); recall@10 {:.3}; {edit_ms:.2} ms per durable edit or forget",
            ratio(a, b),
            recall_after / q.max(1) as f64
        ),
    ]);
    doc.insert("searchP50AfterEditsRatioTantivy".into(), json!(ratio(a, b)));
    drop(reference);

    // --- durable put throughput --------------------------------------------------------------
    let t = Instant::now();
    for i in 0..puts {
        rt().block_on(store.put(
            write_for(&format!("p{i}"), "durable put with cas")?,
            None,
            false,
        ))?;
    }
    let ours_rate = puts as f64 / t.elapsed().as_secs_f64();
    let floor_dir = work_path.as_path().join("floor");
    std::fs::create_dir_all(&floor_dir)?;
    let t = Instant::now();
    for i in 0..puts {
        let tmp = floor_dir.join(format!(".tmp{i}"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(b"{\"content\":\"durable put with cas\"}")?;
        f.sync_all()?;
        std::fs::rename(&tmp, floor_dir.join(format!("r{i}.json")))?;
        std::fs::File::open(&floor_dir)?.sync_all()?;
    }
    let floor_rate = puts as f64 / t.elapsed().as_secs_f64();
    rows.push([
        format!("durable put ({puts} writes)"),
        format!("{ours_rate:.0} /s"),
        "-".into(),
        format!("{floor_rate:.0} /s (temp+fsync+rename+dir fsync)"),
        format!("{:.2}× the floor (target ≥ 0.5×)", ours_rate / floor_rate),
    ]);
    doc.insert("durablePutsPerSecond".into(), json!(ours_rate));
    doc.insert("durablePutFloorPerSecond".into(), json!(floor_rate));

    // --- the memory image the next open reads ----------------------------------------------
    let t = Instant::now();
    let saved = store.save_memory_image()?;
    let image_time = t.elapsed();
    let image_mib =
        std::fs::metadata(root.join("memory.image")).map_or(0.0, |m| m.len() as f64 / 1048576.0);
    let log_mib =
        std::fs::metadata(root.join("memory.log")).map_or(0.0, |m| m.len() as f64 / 1048576.0);
    rows.push([
        "save the memory image".into(),
        format!(
            "{:.0} ms ({image_mib:.0} MiB; the log {log_mib:.0} MiB)",
            image_time.as_secs_f64() * 1e3
        ),
        "-".into(),
        "-".into(),
        if saved {
            "written once, read by every open".into()
        } else {
            "not written".into()
        },
    ]);
    doc.insert("imageSaveMs".into(), json!(image_time.as_secs_f64() * 1e3));
    doc.insert("imageMiB".into(), json!(image_mib));

    // --- 8 concurrent writers --------------------------------------------------------------
    let (acked, found) = cas_writers(&[Arc::new(store)], 50)?;
    rows.push([
        "8 concurrent CAS writers".into(),
        format!("{acked} acknowledged, {found} found"),
        "-".into(),
        "-".into(),
        format!("{} lost", acked as i64 - found),
    ]);
    doc.insert("casLost".into(), json!(acked as i64 - found));

    // --- cold open and footprint, each engine in its own process ---------------------------
    eprintln!("opening each index in a fresh process…");
    let ours = child::spawn("ours", &root, &queries_file)?;
    let theirs = child::spawn("tantivy", &tantivy_dir, &queries_file)?;
    // The same store without its image: what every open cost before images.
    let log_alone = work_path.join("log-alone");
    std::fs::create_dir_all(&log_alone)?;
    for f in ["memory.log", "variables.log"] {
        std::fs::copy(root.join(f), log_alone.join(f))?;
    }
    let rebuilt = child::spawn("ours", &log_alone, &queries_file)?;
    rows.push([
        format!("open + first query ({n} records, page cache warm)"),
        format!("{:.1} ms", ours.cold_open_ms),
        format!("{:.1} ms", theirs.cold_open_ms),
        "-".into(),
        format!(
            "{:.0}× tantivy; {:.3}× reading the log alone ({:.0} ms)",
            ours.cold_open_ms / theirs.cold_open_ms,
            ours.cold_open_ms / rebuilt.cold_open_ms,
            rebuilt.cold_open_ms
        ),
    ]);
    rows.push([
        format!("RSS after open + {q} queries"),
        format!("{:.0} MiB", ours.rss_mib),
        format!("{:.0} MiB", theirs.rss_mib),
        "-".into(),
        format!(
            "{:.1}× tantivy; {:.0} MiB opened from the log alone",
            ours.rss_mib / theirs.rss_mib,
            rebuilt.rss_mib
        ),
    ]);
    doc.insert("coldOpenMs".into(), json!(ours.cold_open_ms));
    doc.insert("coldOpenMsTantivy".into(), json!(theirs.cold_open_ms));
    doc.insert("coldOpenMsFromLog".into(), json!(rebuilt.cold_open_ms));
    doc.insert("rssMiB".into(), json!(ours.rss_mib));
    doc.insert("rssMiBTantivy".into(), json!(theirs.rss_mib));

    if as_json {
        println!("{}", serde_json::Value::Object(doc));
    } else {
        println!("| measurement | tavern-store (file) | tantivy (our analyzer) | SQLite FTS5 | ratio / note |");
        println!("|---|---|---|---|---|");
        for r in rows {
            println!("| {} | {} | {} | {} | {} |", r[0], r[1], r[2], r[3], r[4]);
        }
    }
    Ok(())
}

/// Eight writers, spread over `stores` in turn, each adding one to the global `counter`
/// `per_writer` times with CAS (retrying conflicts): increments acknowledged, and the value
/// found afterwards through the first store.
fn cas_writers(
    stores: &[Arc<dyn VariableStore>],
    per_writer: u64,
) -> Result<(u64, i64), Box<dyn std::error::Error>> {
    let name = VariableName::parse("counter")?;
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let name = name.clone();
            rt().spawn(async move {
                let mut acked = 0u64;
                for _ in 0..per_writer {
                    loop {
                        let cur = store.get(&ScopeKey::Global, &name).await?;
                        let v = cur.as_ref().and_then(|r| r.value.as_i64()).unwrap_or(0);
                        let rev = cur.as_ref().map(|r| &r.revision);
                        match store
                            .set(
                                &ScopeKey::Global,
                                &name,
                                json!(v + 1),
                                rev,
                                MemorySource::system(),
                            )
                            .await
                        {
                            Ok(_) => break,
                            Err(StoreError::Conflict { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    acked += 1;
                }
                Ok::<u64, StoreError>(acked)
            })
        })
        .collect();
    let mut acked = 0;
    for h in handles {
        acked += rt().block_on(h).map_err(|_| "writer task panicked")??;
    }
    let found = rt()
        .block_on(stores[0].get(&ScopeKey::Global, &name))?
        .and_then(|r| r.value.as_i64())
        .unwrap_or(0);
    Ok((acked, found))
}

/// The executor the store's futures run on: two workers, as many as the machine has cores;
/// the store moves its blocking work to tokio's blocking pool itself.
fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start a tokio runtime: {e}"))
    })
}
