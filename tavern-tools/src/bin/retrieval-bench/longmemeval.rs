//! LongMemEval (Wu et al., ICLR 2025): each question brings its own haystack of dated chat
//! sessions; evidence is marked per user turn (`has_answer`) and per session. Scored with the
//! official retrieval protocol (`src/retrieval/run_retrieval.py` and `eval_utils.py` of
//! xiaowu0162/LongMemEval): the corpus is the question's user turns, abstention questions and
//! questions without an evidence turn are skipped, recall_any@k / recall_all@k / NDCG@k at
//! the turn level and, through the official turn-to-session mapping, at the session level.
//!
//! Three systems on the same documents, each question on its own: memory search (each user
//! turn a memory of a fresh store, written at its turn's date, asked at the question's date),
//! history search (the haystack as one SillyTavern chat, sessions in date order, user and
//! assistant turns; the user turns of its ranking count) and the plain BM25 the benchmark's
//! authors use (lower-cased `\w+` words, `rank_bm25` Okapi defaults) on the same user turns.
//! Every system's session level comes from its turn ranking; the reference is also scored on
//! the official session granularity (a session's user turns joined as one document), which is
//! what published session-level BM25 figures use.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tavern_core::calendar::days_from_civil;
use tavern_core::record::MEMORY_CONTENT_MAX_BYTES;
use tavern_core::{
    CharacterName, ChatId, FixedOffset, MemoryId, MemoryKind, MemorySource, MemoryWrite, ScopeKey,
    Timestamp,
};
use tavern_search::RankerRef;
use tavern_store::mem::MemStore;
use tavern_store::{ManualClock, MemoryQuery, MemorySearchExt, MemoryStore};
use tavern_tools::history::{HistoryIndex, SearchTime};

use super::{line, percentile, st_date, Result};

/// The cut-offs reported.
const K_ANY: [usize; 2] = [5, 10];
/// The cut-off of recall_all and NDCG.
const K_ALL: usize = 10;
/// Results asked of each system per question: enough user turns for ten distinct sessions
/// in nearly every haystack (the rest of the corpus is appended in corpus order, as the
/// official ranking lists every document).
const ASKED: usize = 100;
/// The systems, in report order.
pub(crate) const SYSTEMS: [&str; 3] = ["memory", "history", "bm25"];
/// Where the report keeps the reference's scores with sessions as documents.
const SESSION_DOCUMENTS: usize = SYSTEMS.len();

/// One turn of a haystack session.
struct Turn {
    user: bool,
    text: String,
    evidence: bool,
}

struct Session {
    id: String,
    /// Epoch milliseconds.
    at: i64,
    turns: Vec<Turn>,
}

/// One question with its haystack.
pub(crate) struct Question {
    id: String,
    kind: String,
    text: String,
    /// Epoch milliseconds.
    at: i64,
    sessions: Vec<Session>,
}

/// LongMemEval's `2023/05/20 (Sat) 02:21` as epoch milliseconds.
fn parse_date(text: &str) -> Option<i64> {
    let mut parts = text.split_whitespace();
    let mut ymd = parts.next()?.split('/');
    let (y, m, d): (i64, u32, u32) = (
        ymd.next()?.parse().ok()?,
        ymd.next()?.parse().ok()?,
        ymd.next()?.parse().ok()?,
    );
    let time = parts.find(|p| p.contains(':'))?;
    let (h, min) = time.split_once(':')?;
    let (h, min): (i64, i64) = (h.parse().ok()?, min.parse().ok()?);
    Some((days_from_civil(y, m, d) * 1440 + h * 60 + min) * 60_000)
}

/// Whether the file is LongMemEval's (an array of items with a `question_id`).
pub(crate) fn is_longmemeval(data: &Value) -> bool {
    data.as_array()
        .and_then(|a| a.first())
        .is_some_and(|item| item.get("question_id").is_some())
}

/// Reads a JSON file, gzip'd or not.
pub(crate) fn read_json(path: &str) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let text = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut text = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut text)
            .map_err(|e| format!("{path}: not gzip'd UTF-8 JSON: {e}"))?;
        text
    } else {
        String::from_utf8(bytes).map_err(|e| format!("{path}: not UTF-8: {e}"))?
    };
    serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
}

/// The questions, sessions sorted by date (stable: the file's order breaks ties).
pub(crate) fn load(data: &Value) -> Result<Vec<Question>> {
    let items = data.as_array().ok_or("expected a JSON array")?;
    let mut out = Vec::new();
    for item in items {
        let id = item["question_id"].as_str().ok_or("no question_id")?;
        let field = |name: &str| {
            item[name]
                .as_array()
                .ok_or_else(|| format!("{id}: no {name}"))
        };
        let (ids, dates, sessions) = (
            field("haystack_session_ids")?,
            field("haystack_dates")?,
            field("haystack_sessions")?,
        );
        if ids.len() != sessions.len() || dates.len() != sessions.len() {
            return Err(format!(
                "{id}: haystack ids, dates and sessions differ in length"
            ));
        }
        let mut haystack = Vec::new();
        for ((sid, date), turns) in ids.iter().zip(dates).zip(sessions) {
            let date = date.as_str().unwrap_or("");
            haystack.push(Session {
                id: sid.as_str().unwrap_or("").to_owned(),
                at: parse_date(date).ok_or_else(|| format!("{id}: unreadable date {date:?}"))?,
                turns: turns
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| Turn {
                        user: t["role"] == "user",
                        text: t["content"].as_str().unwrap_or("").to_owned(),
                        evidence: t["has_answer"] == true,
                    })
                    .collect(),
            });
        }
        haystack.sort_by_key(|s| s.at);
        let date = item["question_date"].as_str().unwrap_or("");
        out.push(Question {
            id: id.to_owned(),
            kind: item["question_type"]
                .as_str()
                .unwrap_or("unknown")
                .to_owned(),
            text: item["question"].as_str().unwrap_or("").to_owned(),
            at: parse_date(date).ok_or_else(|| format!("{id}: unreadable date {date:?}"))?,
            sessions: haystack,
        });
    }
    Ok(out)
}

/// The official corpus of one question: its user turns, with the session each belongs to and
/// whether it is evidence (a `has_answer` turn of an answer session).
struct Corpus<'a> {
    /// (session index, turn index within the session) per document.
    docs: Vec<(usize, usize)>,
    texts: Vec<&'a str>,
    evidence: Vec<bool>,
}

impl<'a> Corpus<'a> {
    fn of(q: &'a Question) -> Self {
        let mut c = Corpus {
            docs: Vec::new(),
            texts: Vec::new(),
            evidence: Vec::new(),
        };
        for (s, session) in q.sessions.iter().enumerate() {
            for (t, turn) in session.turns.iter().enumerate() {
                if turn.user {
                    c.docs.push((s, t));
                    c.texts.push(&turn.text);
                    c.evidence
                        .push(turn.evidence && session.id.contains("answer"));
                }
            }
        }
        c
    }
}

/// The four numbers reported per level, summed over questions.
#[derive(Default, Clone, Copy)]
struct Sums {
    any5: f64,
    any10: f64,
    all10: f64,
    ndcg10: f64,
    n: usize,
}

impl Sums {
    fn add(&mut self, m: [f64; 4]) {
        self.any5 += m[0];
        self.any10 += m[1];
        self.all10 += m[2];
        self.ndcg10 += m[3];
        self.n += 1;
    }

    fn json(&self) -> Value {
        let pct = |v: f64| (v / self.n.max(1) as f64 * 1000.0).round() / 10.0;
        json!({"any@5": pct(self.any5), "any@10": pct(self.any10), "all@10": pct(self.all10),
               "ndcg@10": pct(self.ndcg10), "n": self.n})
    }
}

/// The official DCG: the first two ranks undiscounted, then `1 / log2(rank)`.
fn dcg(relevances: &[f64]) -> f64 {
    relevances
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if i == 0 {
                *r
            } else {
                r / ((i + 1) as f64).log2()
            }
        })
        .sum()
}

/// recall_any@k for each of [`K_ANY`], recall_all@[`K_ALL`] and NDCG@[`K_ALL`] of a full
/// ranking of `ids` (document ids, several documents may share one) against `correct`.
fn evaluate(ranking: &[usize], ids: &[&str], correct: &HashSet<&str>, ks: [usize; 3]) -> [f64; 4] {
    let recalled =
        |k: usize| -> HashSet<&str> { ranking.iter().take(k).map(|&i| ids[i]).collect() };
    let any = |k| f64::from(u8::from(correct.iter().any(|c| recalled(k).contains(c))));
    let all_k = recalled(ks[2]);
    let all = f64::from(u8::from(correct.iter().all(|c| all_k.contains(c))));
    let rel = |i: usize| f64::from(u8::from(correct.contains(ids[i])));
    let mut ideal: Vec<f64> = (0..ids.len()).map(rel).collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    ideal.truncate(ks[2]);
    let actual: Vec<f64> = ranking.iter().take(ks[2]).map(|&i| rel(i)).collect();
    let ideal = dcg(&ideal);
    let ndcg = if ideal == 0.0 {
        0.0
    } else {
        dcg(&actual) / ideal
    };
    [any(ks[0]), any(ks[1]), all, ndcg]
}

/// The official turn-to-session evaluation: each cut-off grows until the ranking's first
/// documents span that many distinct sessions.
fn evaluate_sessions(ranking: &[usize], sessions: &[&str], correct: &HashSet<&str>) -> [f64; 4] {
    let effective = |k: usize| {
        let mut seen = HashSet::new();
        let mut n = 0;
        for &i in ranking {
            if seen.len() >= k {
                break;
            }
            seen.insert(sessions[i]);
            n += 1;
        }
        n.max(k)
    };
    let [a5, _, _, _] = evaluate(ranking, sessions, correct, [effective(5); 3]);
    let [_, a10, all10, ndcg10] = evaluate(ranking, sessions, correct, [effective(10); 3]);
    [a5, a10, all10, ndcg10]
}

/// Completes a system's ranking (best first, distinct documents) with the documents it left
/// out, in corpus order reversed — where the official `argsort(scores)[::-1]` puts documents
/// that share a zero score.
fn complete(mut ranking: Vec<usize>, len: usize) -> Vec<usize> {
    let mut seen = vec![false; len];
    ranking.retain(|&i| i < len && !std::mem::replace(&mut seen[i], true));
    ranking.extend((0..len).rev().filter(|&i| !seen[i]));
    ranking
}

/// `rank_bm25`'s `BM25Okapi` (k1 1.5, b 0.75, epsilon 0.25) over lower-cased `\w+` words.
struct Okapi {
    docs: Vec<HashMap<String, f64>>,
    len: Vec<f64>,
    idf: HashMap<String, f64>,
    avg: f64,
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

impl Okapi {
    fn new(texts: &[&str]) -> Self {
        let (mut docs, mut len, mut df) = (Vec::new(), Vec::new(), HashMap::<String, f64>::new());
        for text in texts {
            let mut tf: HashMap<String, f64> = HashMap::new();
            let w = words(text);
            len.push(w.len() as f64);
            for t in w {
                *tf.entry(t).or_default() += 1.0;
            }
            for t in tf.keys() {
                *df.entry(t.clone()).or_default() += 1.0;
            }
            docs.push(tf);
        }
        let n = docs.len() as f64;
        let mut idf: HashMap<String, f64> = df
            .iter()
            .map(|(t, f)| (t.clone(), ((n - f + 0.5) / (f + 0.5)).ln()))
            .collect();
        let average = idf.values().sum::<f64>() / idf.len().max(1) as f64;
        for v in idf.values_mut() {
            if *v < 0.0 {
                *v = 0.25 * average;
            }
        }
        let avg = len.iter().sum::<f64>() / len.len().max(1) as f64;
        Self {
            docs,
            len,
            idf,
            avg,
        }
    }

    /// Every document, best first; ties as `argsort(...)[::-1]` leaves them (later first).
    fn rank(&self, query: &str) -> Vec<usize> {
        let q = words(query);
        let (k1, b) = (1.5, 0.75);
        let mut scored: Vec<(f64, usize)> = self
            .docs
            .iter()
            .enumerate()
            .map(|(i, doc)| {
                let s = q
                    .iter()
                    .filter_map(|t| Some((self.idf.get(t)?, doc.get(t)?)))
                    .map(|(idf, tf)| {
                        idf * tf * (k1 + 1.0)
                            / (tf + k1 * (1.0 - b + b * self.len[i] / self.avg.max(1e-9)))
                    })
                    .sum::<f64>();
                (s, i)
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        scored.into_iter().map(|(_, i)| i).collect()
    }
}

/// Sums per system, level (`0` turn, `1` session) and question type (`""` overall).
#[derive(Default)]
pub(crate) struct Report {
    /// The ranker memory and history search ranked through.
    ranker: String,
    sums: BTreeMap<(usize, usize, String), Sums>,
    latency: [Vec<Duration>; 3],
    questions: usize,
    skipped_abstention: usize,
    skipped_no_target: usize,
    turns: usize,
}

impl Report {
    fn add(&mut self, system: usize, level: usize, kind: &str, m: [f64; 4]) {
        for k in ["", kind] {
            self.sums
                .entry((system, level, k.to_owned()))
                .or_default()
                .add(m);
        }
    }

    fn sums(&self, system: usize, level: usize, kind: &str) -> Sums {
        self.sums
            .get(&(system, level, kind.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self.sums.keys().map(|k| k.2.clone()).collect();
        kinds.retain(|k| !k.is_empty());
        kinds.sort();
        kinds.dedup();
        kinds
    }
}

/// The memory text of a turn: within the store's limit, cut at a character boundary.
fn memory_content(text: &str) -> String {
    let mut end = text.len().min(MEMORY_CONTENT_MAX_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let content = text[..end].trim();
    if content.is_empty() {
        "(empty)".to_owned()
    } else {
        content.to_owned()
    }
}

/// Memory search's ranking of the corpus.
async fn memory_ranking(
    q: &Question,
    corpus: &Corpus<'_>,
    ranker: &RankerRef,
) -> Result<(Vec<usize>, Duration)> {
    let clock = Arc::new(ManualClock::new(Timestamp(0)));
    let store = MemStore::new(clock.clone());
    let scope = ScopeKey::Chat {
        character: CharacterName::parse("Assistant").map_err(|e| e.to_string())?,
        chat: ChatId::parse("haystack").map_err(|e| e.to_string())?,
    };
    for (doc, &(s, t)) in corpus.docs.iter().enumerate() {
        clock.set(Timestamp(q.sessions[s].at + t as i64 * 60_000));
        let write = MemoryWrite {
            id: MemoryId::parse(format!("t{doc}")).map_err(|e| e.to_string())?,
            scope: scope.clone(),
            kind: MemoryKind::Episodic,
            content: memory_content(corpus.texts[doc]),
            tags: Vec::new(),
            importance: 0.5,
            confidence: 0.8,
            source: MemorySource::system(),
            expires_at: None,
        };
        store
            .put(write, None, false)
            .await
            .map_err(|e| format!("{}: {e}", q.id))?;
    }
    clock.set(Timestamp(q.at));
    let mut query = MemoryQuery::new(q.text.clone(), vec![scope]);
    query.limit = ASKED;
    query.ranker = ranker.clone();
    let started = Instant::now();
    let found = store
        .search_prepared(&query)
        .await
        .map_err(|e| e.to_string())?;
    let took = started.elapsed();
    let ranking = found
        .hits
        .iter()
        .filter_map(|h| h.record.id.as_str().strip_prefix('t')?.parse().ok())
        .collect();
    Ok((ranking, took))
}

/// History search's ranking of the corpus: its user-turn results in order.
fn history_ranking(
    q: &Question,
    corpus: &Corpus<'_>,
    ranker: &RankerRef,
) -> Result<(Vec<usize>, Duration)> {
    let mut lines = Vec::new();
    let mut doc_of_message = Vec::new();
    let by_turn: HashMap<(usize, usize), usize> = corpus
        .docs
        .iter()
        .enumerate()
        .map(|(doc, st)| (*st, doc))
        .collect();
    for (s, session) in q.sessions.iter().enumerate() {
        for (t, turn) in session.turns.iter().enumerate() {
            lines.push(line(&json!({
                "name": if turn.user { "User" } else { "Assistant" },
                "is_user": turn.user,
                "send_date": st_date(session.at + t as i64 * 60_000),
                "mes": turn.text,
            }))?);
            doc_of_message.push(by_turn.get(&(s, t)).copied());
        }
    }
    let mut index = HistoryIndex::new();
    index.extend(&lines);
    let started = Instant::now();
    // Assistant turns take places in the ranking too: ask for enough messages to keep
    // `ASKED` user turns in nearly every haystack.
    let at = SearchTime {
        now: Timestamp(q.at),
        zone: &FixedOffset(0),
    };
    let (hits, _) = index.search_from(&q.text, ASKED * 2, 0, ranker, Some(at));
    let took = started.elapsed();
    let ranking = hits
        .iter()
        .filter_map(|h| doc_of_message.get(h.index).copied().flatten())
        .collect();
    Ok((ranking, took))
}

/// Scores every question; with `misses`, prints to stderr where each system ranked the
/// evidence of each question it did not fully recall in the first ten.
pub(crate) async fn run(
    questions: &[Question],
    misses: bool,
    ranker: &RankerRef,
) -> Result<Report> {
    let mut report = Report {
        ranker: ranker.get().name().to_owned(),
        ..Report::default()
    };
    for q in questions {
        if q.id.contains("_abs") {
            report.skipped_abstention += 1;
            continue;
        }
        let corpus = Corpus::of(q);
        if !corpus.evidence.iter().any(|e| *e) {
            report.skipped_no_target += 1;
            continue;
        }
        report.questions += 1;
        report.turns += corpus.docs.len();
        let len = corpus.docs.len();
        // Turn ids are unique per document; session ids name each document's session.
        let turn_ids: Vec<String> = (0..len).map(|i| i.to_string()).collect();
        let turn_ids: Vec<&str> = turn_ids.iter().map(String::as_str).collect();
        // As the official ids have it: a turn of an answer session that is not evidence is
        // named `noans` instead of `answer`, so after the turn number is stripped it belongs to
        // another "session" than the evidence — finding it does not count as finding the
        // answer session.
        let session_ids: Vec<String> = corpus
            .docs
            .iter()
            .enumerate()
            .map(|(i, &(s, _))| {
                let id = &q.sessions[s].id;
                if corpus.evidence[i] || !id.contains("answer") {
                    id.clone()
                } else {
                    id.replace("answer", "noans")
                }
            })
            .collect();
        let session_of: Vec<&str> = session_ids.iter().map(String::as_str).collect();
        let correct_turns: HashSet<&str> = (0..len)
            .filter(|&i| corpus.evidence[i])
            .map(|i| turn_ids[i])
            .collect();
        let correct_sessions: HashSet<&str> = (0..len)
            .filter(|&i| corpus.evidence[i])
            .map(|i| session_of[i])
            .collect();

        let (memory, memory_took) = memory_ranking(q, &corpus, ranker).await?;
        let (history, history_took) = history_ranking(q, &corpus, ranker)?;
        let started = Instant::now();
        let okapi = Okapi::new(&corpus.texts).rank(&q.text);
        let okapi_took = started.elapsed();
        for (system, ranking) in [memory, history, okapi].into_iter().enumerate() {
            let ranking = complete(ranking, len);
            let ks = [K_ANY[0], K_ANY[1], K_ALL];
            let m = evaluate(&ranking, &turn_ids, &correct_turns, ks);
            if misses && m[2] < 1.0 {
                eprintln!(
                    "\n## {} missed {} ({}): {}",
                    SYSTEMS[system], q.id, q.kind, q.text
                );
                for (rank, &i) in ranking.iter().enumerate() {
                    if corpus.evidence[i] || rank < 3 {
                        let text: String = corpus.texts[i].chars().take(160).collect();
                        let mark = if corpus.evidence[i] { "E" } else { " " };
                        eprintln!("  {mark} #{rank}: {}", text.replace('\n', " "));
                    }
                }
            }
            report.add(system, 0, &q.kind, m);
            report.add(
                system,
                1,
                &q.kind,
                evaluate_sessions(&ranking, &session_of, &correct_sessions),
            );
        }
        // The reference on the official session granularity too (a session's user turns as
        // one document), as the benchmark's authors report it.
        let session_texts: Vec<String> = q
            .sessions
            .iter()
            .map(|s| {
                s.turns
                    .iter()
                    .filter(|t| t.user)
                    .map(|t| t.text.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let texts: Vec<&str> = session_texts.iter().map(String::as_str).collect();
        // Officially, an answer session without an evidence user turn is `noans` too.
        let ids: Vec<String> = q
            .sessions
            .iter()
            .map(|s| {
                let evidence = s.turns.iter().any(|t| t.user && t.evidence);
                if evidence || !s.id.contains("answer") {
                    s.id.clone()
                } else {
                    s.id.replace("answer", "noans")
                }
            })
            .collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let ranking = Okapi::new(&texts).rank(&q.text);
        report.add(
            SESSION_DOCUMENTS,
            1,
            &q.kind,
            evaluate(
                &ranking,
                &ids,
                &correct_sessions,
                [K_ANY[0], K_ANY[1], K_ALL],
            ),
        );
        for (i, took) in [memory_took, history_took, okapi_took]
            .into_iter()
            .enumerate()
        {
            report.latency[i].push(took);
        }
    }
    Ok(report)
}

/// The `--json` document.
pub(crate) fn json(report: &Report) -> Value {
    let mut systems = serde_json::Map::new();
    for (s, name) in SYSTEMS.iter().enumerate() {
        let by_type: serde_json::Map<String, Value> = report
            .kinds()
            .into_iter()
            .map(|k| {
                let v = json!({"turn": report.sums(s, 0, &k).json(), "session": report.sums(s, 1, &k).json()});
                (k, v)
            })
            .collect();
        systems.insert(
            (*name).to_owned(),
            json!({"turn": report.sums(s, 0, "").json(), "session": report.sums(s, 1, "").json(), "byType": by_type}),
        );
    }
    let mut latency = report.latency.clone();
    json!({
        "benchmark": "longmemeval",
        "systems": systems,
        "meta": {
            "ranker": report.ranker,
            "questions": report.questions,
            "skippedAbstention": report.skipped_abstention,
            "skippedWithoutEvidenceTurn": report.skipped_no_target,
            "userTurns": report.turns,
            "bm25SessionDocuments": report.sums(SESSION_DOCUMENTS, 1, "").json(),
            "queryP50Ms": SYSTEMS.iter().zip(latency.iter_mut()).map(|(n, l)| ((*n).to_owned(), json!(percentile(l, 0.5)))).collect::<serde_json::Map<_, _>>(),
        },
    })
}

/// The Markdown tables.
pub(crate) fn print(report: &Report) {
    println!(
        "LongMemEval: {} questions scored ({} abstention and {} without an evidence turn skipped), {} user turns\n",
        report.questions, report.skipped_abstention, report.skipped_no_target, report.turns
    );
    println!("| system | type | n | turn any@5 | any@10 | all@10 | NDCG@10 | session any@5 | any@10 | all@10 | NDCG@10 |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let kinds: Vec<String> = std::iter::once(String::new())
        .chain(report.kinds())
        .collect();
    for (s, name) in SYSTEMS.iter().enumerate() {
        for k in &kinds {
            let (t, ss) = (report.sums(s, 0, k).json(), report.sums(s, 1, k).json());
            let cell = |m: &Value, key: &str| format!("{:.1}", m[key].as_f64().unwrap_or(0.0));
            let label = if k.is_empty() {
                "**overall**".to_owned()
            } else {
                k.clone()
            };
            println!(
                "| `{name}` | {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                t["n"],
                cell(&t, "any@5"),
                cell(&t, "any@10"),
                cell(&t, "all@10"),
                cell(&t, "ndcg@10"),
                cell(&ss, "any@5"),
                cell(&ss, "any@10"),
                cell(&ss, "all@10"),
                cell(&ss, "ndcg@10"),
            );
        }
    }
    let sessions = report.sums(SESSION_DOCUMENTS, 1, "").json();
    println!(
        "\nThe reference with sessions as documents (the official session granularity): any@5 {} · any@10 {} · all@10 {} · NDCG@10 {}",
        sessions["any@5"], sessions["any@10"], sessions["all@10"], sessions["ndcg@10"]
    );
    let mut latency = report.latency.clone();
    println!("\n| system | query p50 |\n|---|---|");
    for (name, l) in SYSTEMS.iter().zip(latency.iter_mut()) {
        println!("| `{name}` | {:.3} ms |", percentile(l, 0.5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_parse_as_the_benchmark_writes_them() {
        let at = parse_date("2023/05/20 (Sat) 02:21");
        assert_eq!(
            at,
            Some((days_from_civil(2023, 5, 20) * 1440 + 141) * 60_000)
        );
        assert_eq!(parse_date("yesterday"), None);
    }

    #[test]
    fn metrics_follow_the_official_definitions() {
        let ids = ["a", "b", "c", "d"];
        let correct: HashSet<&str> = ["c", "d"].into_iter().collect();
        // c at rank 2 (undiscounted, as the official DCG does), d at rank 4.
        let m = evaluate(&[0, 2, 1, 3], &ids, &correct, [1, 2, 3]);
        assert_eq!(m[..3], [0.0, 1.0, 0.0]);
        let m = evaluate(&[0, 2, 1, 3], &ids, &correct, [1, 2, 4]);
        assert_eq!(m[2], 1.0);
        // DCG 0 + 1/log2(2) + 0 + 1/log2(4) = 1.5 over the ideal 1 + 1/log2(2) = 2.
        assert!((m[3] - 0.75).abs() < 1e-12, "{}", m[3]);
        // Sessions: the cut-off grows to span k distinct sessions.
        let sessions = ["s1", "s1", "s2", "s3"];
        let correct: HashSet<&str> = ["s3"].into_iter().collect();
        let m = evaluate_sessions(&[0, 1, 2, 3], &sessions, &correct);
        assert_eq!(m[1], 1.0);
        assert_eq!(complete(vec![2, 2, 9], 4), [2, 3, 1, 0]);
    }
}
