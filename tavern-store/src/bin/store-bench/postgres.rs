//! `store-bench --backend postgres --pg SETTINGS`: PgStore beside FsStore on the same corpus
//! and queries, put throughput beside a bare `INSERT` + commit loop on the same server (the
//! floor), 8 CAS writers across two stores with their own pools (as two processes have), and how
//! soon a write acknowledged through one store is found by a search through the other.

use super::*;
use tavern_store::pg::{NoTls, PgConfig, PgOptions, PgStore, PgTls, SESSION_SETTINGS};
use tavern_store::Transfer;

type Rows = Vec<[String; 4]>;

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// Runs one search in a task on the runtime's workers (where a bridge runs its tool calls, and
/// where the connection's own task runs beside it) and times it there.
fn in_task<S: MemoryStore + Clone + 'static>(
    store: &S,
    query: &MemoryQuery,
) -> Result<(tavern_store::MemorySearchResult, Duration), Box<dyn std::error::Error>> {
    let (store, query) = (store.clone(), query.clone());
    let (found, took) = rt().block_on(rt().spawn(async move {
        let t = Instant::now();
        let found = store.search(&query).await;
        (found, t.elapsed())
    }))?;
    Ok((found?, took))
}

/// Runs the comparison; `settings` name an empty database.
pub fn run(
    settings: &str,
    n: usize,
    q: usize,
    puts: usize,
) -> Result<Rows, Box<dyn std::error::Error>> {
    let mut rows = Rows::new();
    let config: PgConfig = settings.parse()?;
    let clock: Arc<dyn tavern_store::clock::Clock> = Arc::new(SystemClock);
    let a = rt().block_on(PgStore::open(config.clone(), clock.clone(), 8))?;
    let b = rt().block_on(PgStore::open(config.clone(), clock.clone(), 8))?;
    if rt().block_on(a.memory_len()) > 0 {
        return Err("--pg must name an empty database".into());
    }
    let work = tempfile::tempdir()?;
    let fs = FsStore::open(work.path(), clock)?;

    eprintln!("generating {n} records and {q} queries…");
    let corpus = corpus(n, q);
    let writes = corpus
        .records
        .iter()
        .map(|(id, text)| write_for(id, text))
        .collect::<Result<Vec<_>, _>>()?;
    fs.import_memories(writes)?;
    // The very records FsStore holds (ids, times, revisions): equal data, so equal rankings
    // are expected hit for hit, ties included.
    let t = Instant::now();
    rt().block_on(async { a.load_tables(fs.dump_tables().await?).await })?;
    rows.push([
        format!("load ({n} records)"),
        format!(
            "{:.2} s (FsStore's records, one transaction)",
            t.elapsed().as_secs_f64()
        ),
        "(bulk import)".into(),
        "-".into(),
    ]);
    // Statistics now, as a deployment has them after its first minutes: otherwise autovacuum
    // analyzes the freshly loaded table in the middle of the timings below.
    rt().block_on(async {
        let (client, conn) = config.connect(NoTls).await?;
        let task = tokio::spawn(conn);
        client.batch_execute("VACUUM ANALYZE").await?;
        drop(client);
        let _ = task.await;
        Ok::<_, tavern_store::pg::PgError>(())
    })?;

    // --- opening: every row read, or the image and the rows after it ------------------------
    let images = tempfile::tempdir()?;
    let open = |dir: Option<&std::path::Path>| {
        let mut options = PgOptions::default();
        options.memory_image_dir = dir.map(std::path::Path::to_path_buf);
        let t = Instant::now();
        let store = rt().block_on(PgStore::open_with_options(
            config.clone(),
            &PgTls::default(),
            Arc::new(SystemClock),
            options,
        ))?;
        let took = t.elapsed();
        let replayed = rt().block_on(store.memory_rows_replayed());
        drop(store);
        Ok::<_, Box<dyn std::error::Error>>((took, replayed))
    };
    let (from_rows, all) = open(None)?;
    // Reads every row and saves the image.
    let (with_save, _) = open(Some(images.path()))?;
    let (from_image, tail) = open(Some(images.path()))?;
    let image_mib = std::fs::metadata(images.path().join("memory.image"))?.len() as f64 / 1048576.0;
    rows.push([
        format!("open, this process ({n} records)"),
        format!(
            "{} from --store-image-dir ({tail} rows fetched; image {image_mib:.0} MiB)",
            ms(from_image)
        ),
        format!("{} every row ({all})", ms(from_rows)),
        format!(
            "{:.2}×; the first open with the directory saved it: {}",
            from_image.as_secs_f64() / from_rows.as_secs_f64(),
            ms(with_save)
        ),
    ]);

    // --- search: the same engine, so the same hits; the cost is the catch-up round trip ---
    let scopes = vec![scope()];
    let (mut pg_t, mut fs_t) = (Vec::new(), Vec::new());
    let (mut pg_r, mut fs_r, mut same) = (0.0, 0.0, 0usize);
    for (text, relevant) in &corpus.queries {
        let query = MemoryQuery::new(text.clone(), scopes.clone());
        // Each timed in a task on the runtime's workers, as a bridge runs a tool call.
        let (theirs, took) = in_task(&b, &query)?;
        pg_t.push(took);
        let (ours, took) = in_task(&fs, &query)?;
        fs_t.push(took);
        let ids = |r: &tavern_store::MemorySearchResult| -> Vec<String> {
            r.hits.iter().map(|h| h.record.id.to_string()).collect()
        };
        pg_r += recall(&ids(&theirs), relevant);
        fs_r += recall(&ids(&ours), relevant);
        same += usize::from(ids(&theirs) == ids(&ours));
    }
    pg_t.sort();
    fs_t.sort();
    // The part of a read no store can skip: one round trip asking for rows it has not seen.
    // In a task too, as the searches were.
    let settings = config.clone();
    let trips = rt().block_on(rt().spawn(async move {
        let (client, conn) = settings.connect(NoTls).await?;
        let task = tokio::spawn(conn);
        // Planned as PgStore's connections plan it.
        client.batch_execute(SESSION_SETTINGS).await?;
        let select = client
            .prepare("SELECT seq, op::text, reset, scope FROM memory_ops WHERE seq > $1 ORDER BY seq LIMIT 2000")
            .await?;
        let last: i64 = client
            .query_one("SELECT coalesce(max(seq), 0) FROM memory_ops", &[])
            .await?
            .get(0);
        // And the least any statement costs: `SELECT 1`, prepared, on the same connection.
        let one = client.prepare("SELECT 1").await?;
        let (mut trips, mut ones) = (Vec::with_capacity(q), Vec::with_capacity(q));
        for _ in 0..q {
            let t = Instant::now();
            client.query(&select, &[&last]).await?;
            trips.push(t.elapsed());
            let t = Instant::now();
            client.query(&one, &[]).await?;
            ones.push(t.elapsed());
        }
        drop(client);
        let _ = task.await;
        trips.sort();
        ones.sort();
        Ok::<_, tavern_store::pg::PgError>((trips, ones))
    }))??;
    let (trips, ones) = trips;
    for (label, p) in [("search p50", 0.5), ("search p99", 0.99)] {
        let (x, y) = (percentile(&pg_t, p), percentile(&fs_t, p));
        rows.push([
            format!("{label} ({q} queries)"),
            ms(x),
            ms(y),
            format!(
                "{:.2}× (target ≤ 2×); one round trip alone {} (`SELECT 1` {})",
                x.as_secs_f64() / y.as_secs_f64(),
                ms(percentile(&trips, p)),
                ms(percentile(&ones, p))
            ),
        ]);
    }
    rows.push([
        "recall@10; same hits in the same order".into(),
        format!("{:.3}", pg_r / q as f64),
        format!("{:.3}", fs_r / q as f64),
        format!("{same}/{q} identical"),
    ]);

    // --- durable put vs the server's commit floor -------------------------------------------
    // The two take turns, a round of each at a time, so a busy moment of the machine weighs on
    // both alike (measured one after the other, the ratio moved by a third between runs).
    let (floor_client, floor_task, insert) = rt().block_on(async {
        let (client, conn) = config.connect(NoTls).await?;
        let task = tokio::spawn(conn);
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, body text)",
            )
            .await?;
        // Prepared once: the floor is one round trip and one durable commit per row.
        let insert = client
            .prepare("INSERT INTO bench_floor (body) VALUES ($1)")
            .await?;
        Ok::<_, tavern_store::pg::PgError>((client, task, insert))
    })?;
    const ROUND: usize = 50;
    let (mut ours_t, mut floor_t, mut done) = (Duration::ZERO, Duration::ZERO, 0);
    while done < puts {
        let n = ROUND.min(puts - done);
        let writes = (done..done + n)
            .map(|i| write_for(&format!("p{i}"), "durable put with cas"))
            .collect::<Result<Vec<_>, _>>()?;
        let t = Instant::now();
        rt().block_on(async {
            for w in writes {
                a.put(w, None, false).await?;
            }
            Ok::<_, tavern_store::StoreError>(())
        })?;
        ours_t += t.elapsed();
        let t = Instant::now();
        rt().block_on(async {
            for _ in 0..n {
                floor_client
                    .execute(&insert, &[&"durable put with cas"])
                    .await?;
            }
            Ok::<_, tavern_store::pg::PgError>(())
        })?;
        floor_t += t.elapsed();
        done += n;
    }
    let ours = puts as f64 / ours_t.as_secs_f64();
    let floor = puts as f64 / floor_t.as_secs_f64();
    rt().block_on(async {
        floor_client.batch_execute("DROP TABLE bench_floor").await?;
        drop(floor_client);
        let _ = floor_task.await;
        Ok::<_, tavern_store::pg::PgError>(())
    })?;
    rows.push([
        format!("durable put ({puts} writes)"),
        format!("{ours:.0} /s"),
        format!("{floor:.0} /s (prepared INSERT, autocommit)"),
        format!("{:.2}× (target ≥ 0.5×)", ours / floor),
    ]);

    // --- 8 CAS writers across two stores --------------------------------------------------
    let (acked, found) = cas_writers(&[Arc::new(a.clone()), Arc::new(b.clone())], 25)?;
    rows.push([
        "8 CAS writers over 2 stores".into(),
        format!("{acked} acknowledged"),
        format!("{found} found"),
        format!("{} lost", acked as i64 - found),
    ]);

    // --- visibility: acknowledged in A → found by a search in B ----------------------------
    let mut lag = Vec::new();
    let mut missed = 0;
    for i in 0..50 {
        let text = format!("visibility probe {i} 可见性");
        rt().block_on(a.put(write_for(&format!("v{i}"), &text)?, None, false))?;
        let t = Instant::now();
        let found = rt().block_on(b.search(&MemoryQuery::new(text, vec![scope()])))?;
        lag.push(t.elapsed());
        missed += usize::from(
            !found
                .hits
                .iter()
                .any(|h| h.record.id.as_str() == format!("v{i}")),
        );
    }
    lag.sort();
    rows.push([
        "write in A → found by search in B (50)".into(),
        format!("p50 {}", ms(percentile(&lag, 0.5))),
        "-".into(),
        format!("{missed} not found by the first search"),
    ]);
    Ok(rows)
}
