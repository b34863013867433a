//! `retrieval-bench FILE [--json]`: recall of `memory_search` and `tavern_history_search` on a
//! LongMemEval file (JSON or gzip'd JSON; see [`longmemeval`]) or a LoCoMo-format file (long multi-session conversations with questions whose evidence turns are
//! annotated), beside a plain BM25 reference computed here on the same texts; then query
//! latency, index build time, and history search latency on chats of 100 and 10,000 messages.
//! See `docs/PERFORMANCE.md`.
//!
//! Each conversation is loaded both ways into a file store in a temporary directory: one
//! memory per turn (`speaker: text`, with the shared image's caption) in the chat scope of a
//! session bound to the conversation, and one SillyTavern chat (speaker A as the user, speaker B
//! as the character, each session's turns sent at its date). Every question with well-formed
//! evidence is asked through the tool registry, as a model would (`limit` 50, the largest
//! `maxTokens`). Recall@k is the share of a question's evidence turns among the first k
//! results, averaged over questions.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod longmemeval;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tavern_core::calendar::{civil_from_days, days_from_civil, MONTHS};
use tavern_core::chat::ChatLine;
use tavern_core::{
    normalize_state, AgentId, CharacterName, ChatId, MemoryId, MemoryKind, MemorySource,
    MemoryWrite, Scope, SessionId, TavernState, Timestamp,
};
use tavern_search::{raw_tokens, stopwords::is_stop_word, Encoder as _, RankerRef, VectorRanker};
use tavern_store::clock::ManualClock;
use tavern_store::fs::FsStore;
use tavern_store::{ChatStore, MemoryStore};
use tavern_tools::assets::provider::MemAssets;
use tavern_tools::{ToolContext, ToolLimits, ToolRegistry, ToolServices};

const KS: [usize; 4] = [5, 10, 25, 50];
const CATEGORIES: [(u64, &str); 5] = [
    (1, "multi-hop"),
    (2, "temporal"),
    (3, "open-domain"),
    (4, "single-hop"),
    (5, "adversarial"),
];
const METHODS: [&str; 3] = ["memory_search", "tavern_history_search", "bm25_reference"];

type Result<T> = std::result::Result<T, String>;

/// One dialog turn.
struct Turn {
    dia_id: String,
    speaker: String,
    /// The text as stored: the turn's text plus the caption of a shared image.
    text: String,
    /// Epoch milliseconds of the turn (its session's date, one minute per turn).
    at: i64,
}

struct Question {
    text: String,
    category: u64,
    evidence: Vec<String>,
}

struct Conversation {
    id: String,
    speaker_a: String,
    speaker_b: String,
    turns: Vec<Turn>,
    questions: Vec<Question>,
}

/// LoCoMo's `1:56 pm on 8 May, 2023` as epoch milliseconds.
fn parse_locomo_date(text: &str) -> Option<i64> {
    let (time, date) = text.split_once(" on ")?;
    let mut t = time.split_whitespace();
    let (h, m) = t.next()?.split_once(':')?;
    let (mut h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    match t.next()?.to_ascii_lowercase().as_str() {
        "pm" if h != 12 => h += 12,
        "am" if h == 12 => h = 0,
        _ => {}
    }
    let mut d = date.split([' ', ',']).filter(|w| !w.is_empty());
    let day: u32 = d.next()?.parse().ok()?;
    let month_word = d.next()?.trim();
    let month = u32::try_from(
        MONTHS
            .iter()
            .position(|n| n.eq_ignore_ascii_case(month_word))?
            + 1,
    )
    .ok()?;
    let year: i64 = d.next()?.parse().ok()?;
    Some((days_from_civil(year, month, day) * 1440 + h * 60 + m) * 60_000)
}

/// SillyTavern's `send_date` text: `May 8, 2023 1:56pm`.
fn st_date(ms: i64) -> String {
    let minutes = ms.div_euclid(60_000);
    let (y, m, d) = civil_from_days(minutes.div_euclid(1440));
    let (h, min) = (minutes.rem_euclid(1440) / 60, minutes.rem_euclid(60));
    let (h12, ampm) = match h {
        0 => (12, "am"),
        1..=11 => (h, "am"),
        12 => (12, "pm"),
        _ => (h - 12, "pm"),
    };
    let name = MONTHS[(m as usize).saturating_sub(1) % 12];
    format!("{name} {d}, {y} {h12}:{min:02}{ampm}")
}

/// Reads the conversations; returns them and how many evidence entries were malformed
/// (not a dialog id of the conversation) and skipped.
fn load(data: &Value) -> Result<(Vec<Conversation>, usize, usize)> {
    let items = data.as_array().ok_or("expected a JSON array")?;
    let (mut out, mut malformed, mut dropped) = (Vec::new(), 0, 0);
    for item in items {
        let conv = &item["conversation"];
        let speaker_a = conv["speaker_a"].as_str().ok_or("no speaker_a")?.to_owned();
        let speaker_b = conv["speaker_b"].as_str().ok_or("no speaker_b")?.to_owned();
        let mut sessions: Vec<(u64, &Vec<Value>, i64)> = Vec::new();
        for (key, value) in conv.as_object().ok_or("conversation is not an object")? {
            let Some(n) = key.strip_prefix("session_").and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Some(turns) = value.as_array() else {
                continue;
            };
            let date = conv[format!("{key}_date_time")]
                .as_str()
                .and_then(parse_locomo_date)
                .ok_or_else(|| format!("{key}: no readable date"))?;
            sessions.push((n, turns, date));
        }
        sessions.sort_by_key(|s| s.0);
        let mut turns = Vec::new();
        for (_, session, start) in sessions {
            for (i, t) in session.iter().enumerate() {
                let mut text = t["text"].as_str().unwrap_or("").to_owned();
                if let Some(c) = t["blip_caption"].as_str() {
                    text.push_str(&format!(" [shares {c}]"));
                }
                turns.push(Turn {
                    dia_id: t["dia_id"].as_str().unwrap_or("").to_owned(),
                    speaker: t["speaker"].as_str().unwrap_or("").to_owned(),
                    text,
                    at: start + i as i64 * 60_000,
                });
            }
        }
        let ids: std::collections::HashSet<&str> =
            turns.iter().map(|t| t.dia_id.as_str()).collect();
        let mut questions = Vec::new();
        for qa in item["qa"].as_array().ok_or("no qa")? {
            let mut evidence = Vec::new();
            for e in qa["evidence"].as_array().into_iter().flatten() {
                match e.as_str().filter(|e| ids.contains(e)) {
                    Some(e) if !evidence.iter().any(|x| x == e) => evidence.push(e.to_owned()),
                    Some(_) => {}
                    None => malformed += 1,
                }
            }
            if evidence.is_empty() {
                dropped += 1;
                continue;
            }
            questions.push(Question {
                text: qa["question"].as_str().unwrap_or("").to_owned(),
                category: qa["category"].as_u64().unwrap_or(0),
                evidence,
            });
        }
        out.push(Conversation {
            id: item["sample_id"].as_str().unwrap_or("conv").to_owned(),
            speaker_a,
            speaker_b,
            turns,
            questions,
        });
    }
    Ok((out, malformed, dropped))
}

/// The memory text of a turn.
fn memory_text(t: &Turn) -> String {
    format!("{}: {}", t.speaker, t.text)
}

/// The plain BM25 reference: stop words (the shared list) and a crude suffix-stripping
/// stemmer over the same word tokens, k1 = 1.2, b = 0.75, no other weighting.
struct Reference {
    docs: Vec<HashMap<String, f64>>,
    len: Vec<f64>,
    df: HashMap<String, f64>,
    avg: f64,
}

fn crude_stem(word: &str) -> String {
    for suffix in ["ing", "ed", "es", "s"] {
        if let Some(stem) = word.strip_suffix(suffix) {
            if stem.len() >= 3 {
                return stem.to_owned();
            }
        }
    }
    word.to_owned()
}

fn reference_tokens(text: &str) -> Vec<String> {
    raw_tokens(text)
        .into_iter()
        .filter(|t| !is_stop_word(t))
        .map(|t| crude_stem(&t))
        .collect()
}

impl Reference {
    fn new(texts: &[String]) -> Self {
        let mut docs = Vec::new();
        let mut len = Vec::new();
        let mut df: HashMap<String, f64> = HashMap::new();
        for text in texts {
            let mut tf: HashMap<String, f64> = HashMap::new();
            let tokens = reference_tokens(text);
            len.push(tokens.len() as f64);
            for t in tokens {
                *tf.entry(t).or_default() += 1.0;
            }
            for t in tf.keys() {
                *df.entry(t.clone()).or_default() += 1.0;
            }
            docs.push(tf);
        }
        let avg = len.iter().sum::<f64>() / len.len().max(1) as f64;
        Self { docs, len, df, avg }
    }

    fn search(&self, query: &str, k: usize) -> Vec<usize> {
        let mut q = reference_tokens(query);
        q.sort();
        q.dedup();
        let n = self.docs.len() as f64;
        let mut scored: Vec<(f64, usize)> = Vec::new();
        for (i, doc) in self.docs.iter().enumerate() {
            let mut s = 0.0;
            for t in &q {
                if let Some(tf) = doc.get(t) {
                    let df = self.df[t];
                    let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                    s += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * self.len[i] / self.avg));
                }
            }
            if s > 0.0 {
                scored.push((s, i));
            }
        }
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().take(k).map(|(_, i)| i).collect()
    }
}

/// Recall sums per method and category (`0` = overall) and k.
#[derive(Default)]
struct Recall {
    sum: BTreeMap<(usize, u64, usize), f64>,
    count: BTreeMap<u64, usize>,
}

impl Recall {
    fn add(&mut self, method: usize, category: u64, evidence: &[String], ranked: &[String]) {
        for k in KS {
            let top = &ranked[..ranked.len().min(k)];
            let found = evidence.iter().filter(|e| top.contains(e)).count();
            let r = found as f64 / evidence.len() as f64;
            for c in [0, category] {
                *self.sum.entry((method, c, k)).or_default() += r;
            }
        }
    }

    fn count(&mut self, category: u64) {
        *self.count.entry(0).or_default() += 1;
        *self.count.entry(category).or_default() += 1;
    }

    fn percent(&self, method: usize, category: u64, k: usize) -> f64 {
        let n = self.count.get(&category).copied().unwrap_or(0).max(1) as f64;
        let v = self.sum.get(&(method, category, k)).copied().unwrap_or(0.0) / n * 100.0;
        (v * 10.0).round() / 10.0
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort();
    let i = ((samples.len() - 1) as f64 * p).round() as usize;
    samples[i].as_secs_f64() * 1000.0
}

struct Bench {
    registry: ToolRegistry,
    state: TavernState,
    store: Arc<FsStore>,
    clock: Arc<ManualClock>,
    turn: u64,
}

impl Bench {
    async fn call(&mut self, session: &str, tool: &str, args: Value) -> Result<Value> {
        self.turn += 1;
        let ctx = ToolContext::for_session(
            &AgentId::parse(session).map_err(|e| e.to_string())?,
            &SessionId::parse(session).map_err(|e| e.to_string())?,
            &self.state,
            self.turn,
            &format!("q{}", self.turn),
            *self.registry.limits(),
            tavern_store::Clock::now(self.clock.as_ref()),
        )
        .map_err(|e| e.to_string())?;
        self.registry
            .call(&ctx, tool, &args)
            .await
            .map_err(|e| format!("{tool}: {e}"))
    }
}

fn session_of(conv: &Conversation) -> String {
    format!("s-{}", conv.id)
}

fn line(value: &Value) -> Result<ChatLine> {
    ChatLine::parse(&value.to_string()).map_err(|e| e.to_string())
}

fn new_bench(root: &std::path::Path, bindings: Value, ranker: &RankerRef) -> Result<Bench> {
    let clock = Arc::new(ManualClock::new(Timestamp(1_700_000_000_000)));
    let store = Arc::new(FsStore::open(root, clock.clone()).map_err(|e| e.to_string())?);
    let (state, _) = normalize_state(&json!({ "sessionBindings": bindings }));
    let services = ToolServices {
        memory: store.clone(),
        variables: store.clone(),
        chats: store.clone(),
        assets: Arc::new(MemAssets::default()),
        history: Default::default(),
        ranker: ranker.clone(),
        zone: std::sync::Arc::new(tavern_core::FixedOffset(0)),
    };
    let limits = ToolLimits::default();
    Ok(Bench {
        registry: ToolRegistry::new(services, limits),
        state,
        store,
        clock,
        turn: 0,
    })
}

struct Report {
    recall: Recall,
    latency: [Vec<Duration>; 3],
    memory_open: Duration,
    memory_records: usize,
    history_build: Vec<Duration>,
    questions: usize,
    malformed: usize,
    dropped: usize,
}

async fn run_locomo(
    convs: &[Conversation],
    malformed: usize,
    dropped: usize,
    ranker: &RankerRef,
) -> Result<Report> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut bindings = serde_json::Map::new();
    for c in convs {
        bindings.insert(
            session_of(c),
            json!({"character": c.speaker_b, "chatId": c.id, "architecture": "agent-tavern", "contextMode": "dsh-native"}),
        );
    }
    let bindings = Value::Object(bindings);
    let bench = new_bench(dir.path(), bindings.clone(), ranker)?;
    // Load: memories through the memory port, chats through the chat port.
    for c in convs {
        let session = session_of(c);
        let ctx = ToolContext::for_session(
            &AgentId::parse(&session).map_err(|e| e.to_string())?,
            &SessionId::parse(&session).map_err(|e| e.to_string())?,
            &bench.state,
            0,
            "load",
            ToolLimits::default(),
            Timestamp(0),
        )
        .map_err(|e| e.to_string())?;
        for t in &c.turns {
            bench.clock.set(Timestamp(t.at));
            let write = MemoryWrite {
                id: MemoryId::parse(t.dia_id.replace(':', "_")).map_err(|e| e.to_string())?,
                scope: ctx.scope(Scope::Chat),
                kind: MemoryKind::Episodic,
                content: memory_text(t),
                tags: Vec::new(),
                importance: 0.5,
                confidence: 0.8,
                source: MemorySource::system(),
                expires_at: None,
            };
            bench
                .store
                .put(write, None, false)
                .await
                .map_err(|e| e.to_string())?;
        }
        let mut lines = vec![line(&json!({
            "user_name": c.speaker_a, "character_name": c.speaker_b,
            "create_date": c.turns.first().map_or(String::new(), |t| st_date(t.at)),
            "chat_metadata": {},
        }))?];
        for t in &c.turns {
            lines.push(line(&json!({
                "name": t.speaker, "is_user": t.speaker == c.speaker_a,
                "send_date": st_date(t.at), "mes": t.text,
            }))?);
        }
        let character = CharacterName::parse(&c.speaker_b).map_err(|e| e.to_string())?;
        let chat = ChatId::parse(&c.id).map_err(|e| e.to_string())?;
        bench
            .store
            .rewrite_chat(&character, &chat, &lines, None)
            .await
            .map_err(|e| e.to_string())?;
    }
    bench.clock.set(Timestamp(2_000_000_000_000));
    // Memory index build: opening the store replays the log and indexes every record.
    let memory_records = bench.store.memory_len();
    drop(bench);
    let started = Instant::now();
    let mut bench = new_bench(dir.path(), bindings, ranker)?;
    let memory_open = started.elapsed();
    bench.clock.set(Timestamp(2_000_000_000_000));

    let mut report = Report {
        recall: Recall::default(),
        latency: [Vec::new(), Vec::new(), Vec::new()],
        memory_open,
        memory_records,
        history_build: Vec::new(),
        questions: 0,
        malformed,
        dropped,
    };
    let max_tokens = ToolLimits::default().max_tokens;
    for c in convs {
        let session = session_of(c);
        // The first history query builds the chat's index.
        let started = Instant::now();
        bench
            .call(
                &session,
                "tavern_history_search",
                json!({"query": "hello", "limit": 1}),
            )
            .await?;
        report.history_build.push(started.elapsed());
        let texts: Vec<String> = c.turns.iter().map(memory_text).collect();
        let reference = Reference::new(&texts);
        for q in &c.questions {
            report.questions += 1;
            report.recall.count(q.category);
            let args = json!({"query": q.text, "limit": 50, "maxTokens": max_tokens});
            let started = Instant::now();
            let mem = bench.call(&session, "memory_search", args.clone()).await?;
            report.latency[0].push(started.elapsed());
            let ranked: Vec<String> = mem["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["id"].as_str().map(|id| id.replace('_', ":")))
                .collect();
            report.recall.add(0, q.category, &q.evidence, &ranked);

            let started = Instant::now();
            let hist = bench.call(&session, "tavern_history_search", args).await?;
            report.latency[1].push(started.elapsed());
            let ranked: Vec<String> = hist["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["index"].as_u64())
                .filter_map(|i| c.turns.get(i as usize).map(|t| t.dia_id.clone()))
                .collect();
            report.recall.add(1, q.category, &q.evidence, &ranked);

            let started = Instant::now();
            let top = reference.search(&q.text, 50);
            report.latency[2].push(started.elapsed());
            let ranked: Vec<String> = top.iter().map(|i| c.turns[*i].dia_id.clone()).collect();
            report.recall.add(2, q.category, &q.evidence, &ranked);
        }
    }
    Ok(report)
}

/// History search latency on chats of `sizes` messages through the registry: the file's turns
/// in order (repeated as needed, speaker A as the user, B as the character), its questions as
/// queries; the first query (which builds the index), p50 of warm queries, and p50 of a query
/// right after one appended message.
/// History search latency on one chat size.
struct HistoryLatency {
    messages: usize,
    build_ms: f64,
    p50_ms: f64,
    p50_after_append_ms: f64,
    /// p50 of each window of [`WINDOW`] warm queries, in the order asked.
    window_p50_ms: Vec<f64>,
    /// Messages and bytes of JSON a warm query returns, on average: a longer chat has more
    /// matches to fill a page with, so part of its extra cost is a bigger answer.
    items: f64,
    bytes: f64,
}

/// Rounds of warm history queries (each asks every question once on every chat size).
const LATENCY_ROUNDS: usize = 7;

/// Questions per window in which the chat sizes' p50s are compared: a few milliseconds of
/// queries. This shared machine switches between a fast and a slow state, one about 1.8×
/// the other, within tens of milliseconds (a window's 100-message p50 ranged 37–88 µs in
/// one run). A p50 over a whole run is then a median of two states' mixture, which lands
/// between them wherever the mix puts it; a ratio of two such p50s moved by a tenth or
/// more from run to run. Within a window both sizes run under one state.
const WINDOW: usize = 50;

/// Per window, the large chat's p50 over the small one's: the median, and the middle half
/// (first and third quartile), over how many windows.
fn window_ratios(small: &HistoryLatency, large: &HistoryLatency) -> (f64, f64, f64, usize) {
    let mut ratios: Vec<f64> = small
        .window_p50_ms
        .iter()
        .zip(&large.window_p50_ms)
        .map(|(s, l)| l / s)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let at = |q: usize| ratios.get(ratios.len() * q / 4).copied().unwrap_or(0.0);
    (at(2), at(1), at(3), ratios.len())
}

async fn history_latency(
    convs: &[Conversation],
    sizes: &[usize],
    ranker: &RankerRef,
) -> Result<Vec<HistoryLatency>> {
    let turns: Vec<(&Conversation, &Turn)> = convs
        .iter()
        .flat_map(|c| c.turns.iter().map(move |t| (c, t)))
        .collect();
    let questions: Vec<&str> = convs
        .iter()
        .flat_map(|c| c.questions.iter().map(|q| q.text.as_str()))
        .collect();
    if turns.is_empty() || questions.is_empty() {
        return Ok(Vec::new());
    }
    let message = |i: usize| -> Result<ChatLine> {
        let (c, t) = turns[i % turns.len()];
        line(
            &json!({"name": t.speaker, "is_user": t.speaker == c.speaker_a,
            "send_date": st_date(t.at), "mes": t.text}),
        )
    };
    struct Chat {
        size: usize,
        bench: Bench,
        _dir: tempfile::TempDir,
        revision: tavern_store::ChatRevision,
        build: f64,
        warm: Vec<Duration>,
        after_append: Vec<Duration>,
        items: usize,
        bytes: usize,
    }
    let character = CharacterName::parse("Mira").map_err(|e| e.to_string())?;
    let chat = ChatId::parse("long").map_err(|e| e.to_string())?;
    let query = |i: usize| json!({"query": questions[i % questions.len()], "limit": 10});
    let mut chats = Vec::new();
    for &size in sizes {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let bindings = json!({"s": {"character": "Mira", "chatId": "long", "architecture": "agent-tavern", "contextMode": "dsh-native"}});
        let mut bench = new_bench(dir.path(), bindings, ranker)?;
        let mut lines = vec![line(
            &json!({"user_name": "Kai", "character_name": "Mira", "chat_metadata": {}}),
        )?];
        for i in 0..size {
            lines.push(message(i)?);
        }
        let revision = bench
            .store
            .rewrite_chat(&character, &chat, &lines, None)
            .await
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        bench.call("s", "tavern_history_search", query(0)).await?;
        let build = started.elapsed().as_secs_f64() * 1000.0;
        for i in 0..50 {
            bench.call("s", "tavern_history_search", query(i)).await?;
        }
        chats.push(Chat {
            size,
            bench,
            _dir: dir,
            revision,
            build,
            warm: Vec::new(),
            after_append: Vec::new(),
            items: 0,
            bytes: 0,
        });
    }
    // The sizes take turns query by query, so a busy moment of the machine weighs on all of
    // them alike (measured one after the other, the ratio moved by half between runs); their
    // p50s are compared window by window (see `WINDOW`).
    for round in 0..LATENCY_ROUNDS {
        for i in 0..questions.len() {
            for c in &mut chats {
                let started = Instant::now();
                let answer = c.bench.call("s", "tavern_history_search", query(i)).await?;
                let took = started.elapsed();
                c.warm.push(took);
                if round == 0 {
                    c.items += answer["items"].as_array().map_or(0, Vec::len);
                    c.bytes += answer.to_string().len();
                }
            }
        }
    }
    for i in 0..100 {
        for c in &mut chats {
            c.revision = c
                .bench
                .store
                .append_lines(&character, &chat, &[message(c.size + i)?], &c.revision)
                .await
                .map_err(|e| e.to_string())?;
            let started = Instant::now();
            c.bench.call("s", "tavern_history_search", query(i)).await?;
            c.after_append.push(started.elapsed());
        }
    }
    Ok(chats
        .into_iter()
        .map(|mut c| HistoryLatency {
            messages: c.size,
            build_ms: c.build,
            // In the order asked, before the whole run is sorted for its p50.
            window_p50_ms: c
                .warm
                .chunks_exact(WINDOW)
                .map(|w| percentile(&mut w.to_vec(), 0.5))
                .collect(),
            p50_ms: percentile(&mut c.warm, 0.5),
            p50_after_append_ms: percentile(&mut c.after_append, 0.5),
            items: c.items as f64 / questions.len() as f64,
            bytes: c.bytes as f64 / questions.len() as f64,
        })
        .collect())
}

/// `settings`: how the ranker was set up, for the JSON document's `meta.rankerSettings`.
async fn run(
    path: &str,
    as_json: bool,
    misses: bool,
    (ranker, settings): &(RankerRef, Value),
) -> Result<()> {
    let data = longmemeval::read_json(path)?;
    if longmemeval::is_longmemeval(&data) {
        let questions = longmemeval::load(&data)?;
        drop(data);
        let report = longmemeval::run(&questions, misses, ranker).await?;
        if as_json {
            let mut doc = longmemeval::json(&report);
            doc["meta"]["rankerSettings"] = settings.clone();
            println!("{doc}");
        } else {
            longmemeval::print(&report);
        }
        return Ok(());
    }
    let (convs, malformed, dropped) = load(&data)?;
    drop(data);
    let history = history_latency(&convs, &[100, 10_000], ranker).await?;
    let report = run_locomo(&convs, malformed, dropped, ranker).await?;
    let mut lat = report.latency.clone();
    let latency: Vec<(f64, f64)> = lat
        .iter_mut()
        .map(|l| (percentile(l, 0.5), percentile(l, 0.99)))
        .collect();
    let mut build = report.history_build.clone();
    let categories: Vec<(u64, &str)> = std::iter::once((0, "overall"))
        .chain(CATEGORIES.iter().copied())
        .collect();
    if as_json {
        let mut obj = serde_json::Map::new();
        for (m, method) in METHODS.iter().enumerate() {
            let mut per = serde_json::Map::new();
            for (c, name) in &categories {
                let ks: serde_json::Map<String, Value> = KS
                    .iter()
                    .map(|k| (k.to_string(), json!(report.recall.percent(m, *c, *k))))
                    .collect();
                per.insert((*name).to_owned(), Value::Object(ks));
            }
            obj.insert((*method).to_owned(), Value::Object(per));
        }
        obj.insert(
            "meta".into(),
            json!({
                "ranker": ranker.get().name(), "rankerSettings": settings,
                "questions": report.questions, "malformedEvidence": report.malformed,
                "questionsWithoutEvidence": report.dropped,
                "latencyMs": METHODS.iter().zip(&latency).map(|(m, (p50, p99))| (m.to_string(), json!({"p50": p50, "p99": p99}))).collect::<serde_json::Map<_, _>>(),
                "memoryOpenMs": report.memory_open.as_secs_f64() * 1000.0, "memoryRecords": report.memory_records,
                "historyBuildMsP50": percentile(&mut build, 0.5),
                "historyLatency": history.iter().map(|h| json!({"messages": h.messages, "buildMs": h.build_ms, "p50Ms": h.p50_ms, "p50AfterAppendMs": h.p50_after_append_ms, "itemsPerQuery": h.items, "bytesPerQuery": h.bytes})).collect::<Vec<_>>(),
                "historyRatio": match &history[..] { [small, large] => { let (median, q1, q3, windows) = window_ratios(small, large); let some = |x: f64| (windows > 0).then_some(x); json!({"pooled": large.p50_ms / small.p50_ms, "windows": windows, "windowMedian": some(median), "windowQ1": some(q1), "windowQ3": some(q3)}) } _ => Value::Null },
            }),
        );
        println!("{}", Value::Object(obj));
        return Ok(());
    }
    println!(
        "{} questions with well-formed evidence ({} malformed evidence entries skipped, {} questions left without evidence)\n",
        report.questions, report.malformed, report.dropped
    );
    println!("| method | category | n | recall@5 | recall@10 | recall@25 | recall@50 |");
    println!("|---|---|---|---|---|---|---|");
    for (m, method) in METHODS.iter().enumerate() {
        for (c, name) in &categories {
            let n = report.recall.count.get(c).copied().unwrap_or(0);
            let r: Vec<String> = KS
                .iter()
                .map(|k| format!("{:.1}", report.recall.percent(m, *c, *k)))
                .collect();
            let name = if *c == 0 {
                format!("**{name}**")
            } else {
                (*name).to_owned()
            };
            println!("| `{method}` | {name} | {n} | {} |", r.join(" | "));
        }
    }
    println!("\n| measurement | value |\n|---|---|");
    for (method, (p50, p99)) in METHODS.iter().zip(&latency) {
        println!("| `{method}` query latency p50 / p99 | {p50:.3} ms / {p99:.3} ms |");
    }
    println!(
        "| memory index build (open the store: {} records) | {:.1} ms |",
        report.memory_records,
        report.memory_open.as_secs_f64() * 1000.0
    );
    println!(
        "| history index build (first query of a chat, p50 of {}) | {:.2} ms |",
        build.len(),
        percentile(&mut build, 0.5)
    );
    for h in &history {
        println!(
            "| history search, {} messages: build / warm p50 / p50 after one append | {:.2} ms / {:.3} ms / {:.3} ms |",
            h.messages, h.build_ms, h.p50_ms, h.p50_after_append_ms
        );
    }
    for h in &history {
        println!(
            "| history search, {} messages: messages / bytes returned per query | {:.2} / {:.0} |",
            h.messages, h.items, h.bytes
        );
    }
    if let [small, large] = &history[..] {
        let windows = match window_ratios(small, large) {
            (_, _, _, 0) => format!("n/a (fewer than {WINDOW} queries)"),
            (median, q1, q3, n) => format!("{median:.2}× ({q1:.2}–{q3:.2}×, {n} windows)"),
        };
        println!(
            "| history search p50, 10,000 vs 100 messages, window by window ({WINDOW} questions each; median, middle half) | {windows} |"
        );
        println!(
            "| history search p50, 10,000 vs 100 messages, all queries pooled | {:.2}× |",
            large.p50_ms / small.p50_ms
        );
    }
    Ok(())
}

/// The ranker memory and history search hand their candidates to: the lexical one, with
/// `--word-vectors FILE` a [`VectorRanker`] over those vectors, or with `--sentence-encoder
/// DIR` a [`tavern_search::SentenceRanker`] over that BERT model (`--vector-weight W` either
/// way).
fn ranker(args: &[String]) -> Result<(RankerRef, Value)> {
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| {
                args.get(i + 1)
                    .cloned()
                    .ok_or(format!("{name} needs a value"))
            })
            .transpose()
    };
    // `--vector-pool N`, for either ranker.
    let pool_size = || -> Result<Option<usize>> {
        value("--vector-pool")?
            .map(|n| {
                n.parse()
                    .map_err(|_| format!("--vector-pool {n:?} is not a count"))
            })
            .transpose()
    };
    if let Some(dir) = value("--sentence-encoder")? {
        for other in [
            "--word-vectors",
            "--vector-closeness",
            "--no-vector-pool-idf",
        ] {
            if args.iter().any(|a| a == other) {
                return Err(format!(
                    "--sentence-encoder and {other}: that option is the word vectors' own"
                ));
            }
        }
        let started = Instant::now();
        let encoder = tavern_search::bert::BertEncoder::open(std::path::Path::new(&dir))
            .map_err(|e| format!("{dir}: {e}"))?;
        eprintln!(
            "sentence encoder: {} read in {:.1} s",
            encoder.name(),
            started.elapsed().as_secs_f64()
        );
        let mut ranker = tavern_search::SentenceRanker::new(Arc::new(encoder));
        if let Some(w) = value("--vector-weight")? {
            let weight = w
                .parse::<f32>()
                .ok()
                .filter(|w| (0.0..=0.95).contains(w))
                .ok_or(format!("--vector-weight {w:?}: a number within 0 and 0.95"))?;
            ranker = ranker.with_weight(weight);
        }
        if let Some(n) = pool_size()? {
            ranker = ranker.with_pool(n);
        }
        let settings = json!({
            "weight": ranker.weight(),
            "pool": tavern_search::Ranker::pool(&ranker, 0),
            "encoder": ranker.encoder().name(),
        });
        return Ok((RankerRef::new(ranker), settings));
    }
    let Some(path) = value("--word-vectors")? else {
        for option in [
            "--vector-weight",
            "--vector-pool",
            "--vector-closeness",
            "--no-vector-pool-idf",
        ] {
            if args.iter().any(|a| a == option) {
                return Err(format!(
                    "{option} needs --word-vectors or --sentence-encoder: it sets their ranker"
                ));
            }
        }
        return Ok((RankerRef::default(), Value::Null));
    };
    let started = Instant::now();
    let weight = value("--vector-weight")?
        .map(|w| {
            w.parse::<f32>()
                .map_err(|_| format!("--vector-weight {w:?} is not a number"))
        })
        .transpose()?;
    let mut ranker = VectorRanker::open(std::path::Path::new(&path), weight)
        .map_err(|e| format!("{path}: {e}"))?;
    eprintln!(
        "word vectors: {} words of {} dimensions read in {:.1} s",
        ranker.vectors().len(),
        ranker.vectors().dims(),
        started.elapsed().as_secs_f64()
    );
    if let Some(c) = value("--vector-closeness")? {
        ranker = ranker.with_closeness(match c.as_str() {
            "mean" => tavern_search::Closeness::Mean,
            "best" => tavern_search::Closeness::BestMatch,
            "both" => tavern_search::Closeness::Both,
            _ => return Err(format!("--vector-closeness {c:?}: mean, best or both")),
        });
    }
    if args.iter().any(|a| a == "--no-vector-pool-idf") {
        ranker = ranker.with_pool_idf(false);
    }
    if let Some(n) = pool_size()? {
        ranker = ranker.with_pool(n);
    }
    let settings = json!({
        "weight": ranker.weight(),
        "closeness": format!("{:?}", ranker.closeness()),
        "poolIdf": ranker.pool_idf(),
        "words": ranker.vectors().len(),
        "dims": ranker.vectors().dims(),
    });
    Ok((RankerRef::new(ranker), settings))
}

/// The one benchmark file among `args`: not a flag, nor the value a flag takes.
fn benchmark_file(args: &[String]) -> Result<&String> {
    const SWITCHES: [&str; 3] = ["--json", "--misses", "--no-vector-pool-idf"];
    const VALUED: [&str; 5] = [
        "--sentence-encoder",
        "--word-vectors",
        "--vector-weight",
        "--vector-pool",
        "--vector-closeness",
    ];
    let mut files = Vec::new();
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        if VALUED.contains(&a.as_str()) {
            rest.next().ok_or(format!("{a} needs a value"))?;
        } else if a.starts_with("--") && !SWITCHES.contains(&a.as_str()) {
            return Err(format!("{a:?} is not an option"));
        } else if !a.starts_with("--") {
            files.push(a);
        }
    }
    match files.as_slice() {
        [one] => Ok(one),
        [] => Err("no benchmark file given".into()),
        more => Err(format!("one benchmark file, not {}", more.len())),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let as_json = args.iter().any(|a| a == "--json");
    let path = match benchmark_file(&args) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("retrieval-bench: {e}\nusage: retrieval-bench FILE [--json] [--misses] [--word-vectors VECTORS [--vector-weight W] [--vector-pool N] [--vector-closeness mean|best|both] [--no-vector-pool-idf]] [--sentence-encoder DIR [--vector-weight W]]  (a LoCoMo or LongMemEval JSON file, gzip'd or not; VECTORS a GloVe/fastText text file: memory and history search then rank through tavern_search::VectorRanker; DIR a BERT sentence-transformers folder such as scripts/sentence-encoder.sh fetches: they rank through tavern_search::SentenceRanker)");
            std::process::exit(2);
        }
    };
    // Two workers, as `tavern-bridge` runs the tools (the file store then reads in place
    // instead of handing each read to the blocking pool).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("retrieval-bench: {e}");
            std::process::exit(1);
        }
    };
    let ranker = match ranker(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("retrieval-bench: {e}");
            std::process::exit(2);
        }
    };
    let misses = args.iter().any(|a| a == "--misses");
    if let Err(e) = runtime.block_on(run(path, as_json, misses, &ranker)) {
        eprintln!("retrieval-bench: {e}");
        std::process::exit(1);
    }
}
