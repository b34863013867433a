//! The seam every store backend shares: an engine table rebuilt from an ordered log of
//! operations. `FsStore` keeps the log in checksummed files (`fs::log`), `PgStore` in
//! operation tables (`pg::ops`), `MemStore` nowhere (it applies each operation as it is
//! prepared); all three apply the same operations to the same tables, so a store's contracts
//! (CAS, audit, TTL, search) are enforced once, here in `engine`, whatever keeps the log.
//!
//! A backend's log must give: appends in one total order that every reader sees alike
//! (file offsets, database sequence numbers), an append refused when the writer's copy is
//! behind (the file lock plus catch-up, `max(seq) <= $mirror`), reads since a position, and a
//! compaction that replaces the log with [`OpTable::snapshot`] behind a marker telling every
//! reader to rebuild (a replaced file, a `reset` row).
//!
//! What a backend reads back goes through one function, [`replay`]: entries in log order
//! ([`Entry::Op`] text or an [`Entry::Reset`] marker) are decoded (on two threads when a large
//! store opens), unreadable ones skipped and reported, a reset starts the table afresh, and the
//! rest applied in order. How the log is *kept* differs on purpose: the file log is a
//! synchronous append under an advisory lock, the database log an async conditional insert in
//! one round trip; a common trait over both would force one of them into the other's shape.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tavern_search::Region;

use crate::error::StoreError;

use super::memory_table::{MemoryOp, MemoryTable};
use super::variable_table::{VariableOp, VariableTable};

/// An engine table rebuilt from a log of its operations.
pub(crate) trait OpTable: Default + Send {
    /// One logged operation (serialized as JSON in every backend's log).
    type Op: Serialize + DeserializeOwned + Send;

    /// Applies one operation.
    fn apply_op(&mut self, op: Self::Op);

    /// Applies many operations in order (may be faster than one by one).
    fn apply_ops(&mut self, ops: Vec<Self::Op>) {
        for op in ops {
            self.apply_op(op);
        }
    }

    /// The table as operations that rebuild it (one per record or scope), for compaction.
    fn snapshot(&self) -> Vec<Self::Op>;

    /// How many operations [`OpTable::snapshot`] would produce (whether a log is bloated).
    fn snapshot_len(&self) -> usize;

    /// Appends the table's image to `out` and what it reads where it lies to `rest` (what
    /// [`OpTable::read_image`] reads back) and returns `true`; `false` for a table that keeps
    /// no image, or one that found its image's bytes damaged while writing (nothing of what
    /// it appended is to be kept: [`OpTable::heal`] first).
    fn write_image(&self, _out: &mut Vec<u8>, _rest: &mut Vec<u8>) -> bool {
        false
    }

    /// The table an image holds: `bytes` what [`OpTable::write_image`] appended to `out`, as
    /// read from the start of `image`, where they lie followed by what it appended to `rest`
    /// (read there again when first needed, so it must stay as it is while the table is
    /// used).
    ///
    /// # Errors
    /// Why the bytes are not such an image, in lowercase words.
    fn read_image(_bytes: &[u8], _image: &Region) -> Result<Self, String> {
        Err("this table keeps no image".into())
    }

    /// Rebuilds what the table read from its image's region and found damaged there (a
    /// search index from its records); whether it did.
    fn heal(&mut self) -> bool {
        false
    }

    /// Whether [`OpTable::heal`] has something to rebuild (cheap: callers move the rebuild
    /// off their thread only then).
    #[cfg(feature = "postgres")]
    fn needs_heal(&self) -> bool {
        false
    }

    /// Whether the table could not read back something of its image that only its log (or
    /// rows) holds again (a record: the file changed since it was opened): nothing it
    /// answered or prepared since is to be used, and the owner reads the table again.
    fn lost(&self) -> bool {
        false
    }
}

impl OpTable for MemoryTable {
    type Op = MemoryOp;

    fn apply_op(&mut self, op: MemoryOp) {
        self.apply(op);
    }

    fn apply_ops(&mut self, ops: Vec<MemoryOp>) {
        self.apply_many(ops);
    }

    fn snapshot(&self) -> Vec<MemoryOp> {
        MemoryTable::snapshot(self)
    }

    fn snapshot_len(&self) -> usize {
        self.len()
    }

    fn write_image(&self, out: &mut Vec<u8>, rest: &mut Vec<u8>) -> bool {
        MemoryTable::write_image(self, out, rest)
    }

    fn read_image(bytes: &[u8], image: &Region) -> Result<Self, String> {
        MemoryTable::read_image(bytes, image).map_err(|e| e.to_string())
    }

    fn heal(&mut self) -> bool {
        MemoryTable::heal(self)
    }

    #[cfg(feature = "postgres")]
    fn needs_heal(&self) -> bool {
        MemoryTable::needs_heal(self)
    }

    fn lost(&self) -> bool {
        MemoryTable::lost(self)
    }
}

impl OpTable for VariableTable {
    type Op = VariableOp;

    fn apply_op(&mut self, op: VariableOp) {
        self.apply(op);
    }

    fn snapshot(&self) -> Vec<VariableOp> {
        VariableTable::snapshot(self)
    }

    fn snapshot_len(&self) -> usize {
        self.scope_count()
    }
}

/// One entry of a backend's log, as read back in log order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Entry<'a> {
    /// An operation's JSON text.
    Op(&'a str),
    /// A compaction marker: the entries after it rebuild the whole table.
    Reset,
}

/// An operation that could not be decoded, skipped by [`replay`].
#[derive(Debug)]
pub(crate) struct Unreadable {
    /// Its index in the replayed batch (the caller knows its line or sequence number).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only PgStore names rows
    pub(crate) index: usize,
    /// Why, in the decoder's words.
    pub(crate) reason: String,
}

/// What [`replay`] did.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    /// Whether the batch held a reset (the table was rebuilt from what followed it).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))] // only PgStore counts since one
    pub(crate) reset: bool,
    /// The operations after the last reset that could not be decoded, in order.
    pub(crate) unreadable: Vec<Unreadable>,
}

/// Below this many operations a replay decodes on the calling thread.
const PARALLEL_DECODE_MIN: usize = 4096;

/// Applies a batch read from a log to `table`: entries before the batch's last reset are
/// dropped and the table starts afresh there; operations that cannot be decoded are skipped
/// (a corrupt line or row is never fatal) and returned for the caller to report.
///
/// # Errors
/// Only if a decoding thread panicked (a bug, not bad input): then nothing was applied.
pub(crate) fn replay<T: OpTable>(
    table: &mut T,
    entries: &[Entry<'_>],
) -> Result<Replayed, StoreError> {
    let start = entries
        .iter()
        .rposition(|e| matches!(e, Entry::Reset))
        .map_or(0, |i| i + 1);
    let reset = start > 0;
    let texts: Vec<(usize, &str)> = entries[start..]
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Entry::Op(text) => Some((start + i, *text)),
            Entry::Reset => None,
        })
        .collect();
    let decode = |&(index, text): &(usize, &str)| {
        serde_json::from_str::<T::Op>(text).map_err(|e| Unreadable {
            index,
            reason: e.to_string(),
        })
    };
    let decoded: Vec<Result<T::Op, Unreadable>> = if texts.len() < PARALLEL_DECODE_MIN {
        texts.iter().map(decode).collect()
    } else {
        // Opening a large store: decode the two halves on two threads, keeping order.
        let (front, back) = texts.split_at(texts.len() / 2);
        std::thread::scope(|s| {
            let back = s.spawn(|| back.iter().map(decode).collect::<Vec<_>>());
            let mut all: Vec<_> = front.iter().map(decode).collect();
            // A panicking decoder is a bug, not bad input: never load half a log.
            all.extend(back.join().map_err(|_| {
                StoreError::Internal("decoding an operation log panicked; nothing loaded".into())
            })?);
            Ok::<_, StoreError>(all)
        })?
    };
    let mut ops = Vec::with_capacity(decoded.len());
    let mut unreadable = Vec::new();
    for d in decoded {
        match d {
            Ok(op) => ops.push(op),
            Err(u) => unreadable.push(u),
        }
    }
    if reset {
        *table = T::default();
    }
    table.apply_ops(ops);
    Ok(Replayed { reset, unreadable })
}

/// The table as the log lines or rows a compaction writes, one per [`OpTable::snapshot`] op.
///
/// # Errors
/// [`StoreError::Internal`] if an operation cannot be encoded (a bug).
pub(crate) fn encode_snapshot<T: OpTable>(table: &T) -> Result<Vec<String>, StoreError> {
    table
        .snapshot()
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Internal(format!("cannot encode a snapshot: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::variable_table::VariableOp;
    use tavern_core::{AgentId, Revision, ScopeKey};

    /// A real (empty) scope write: enough for a table to count its scope.
    fn scope_op(agent: &str) -> VariableOp {
        VariableOp {
            scope: ScopeKey::Agent {
                agent: AgentId::parse(agent.to_owned()).expect("a valid agent id"),
            },
            records: Vec::new(),
            scope_revision: Revision::compute("variable-scope", None, &serde_json::json!(agent)),
            audit: Vec::new(),
        }
    }

    fn ops_of(table: &VariableTable) -> Vec<String> {
        encode_snapshot(table).expect("encodes")
    }

    #[test]
    fn a_replay_skips_what_it_cannot_read_and_restarts_at_the_last_reset() {
        // A real table's snapshot gives real operation texts to replay.
        let lines: Vec<String> = ["s1", "s2", "s3"]
            .iter()
            .map(|a| serde_json::to_string(&scope_op(a)).expect("encodes"))
            .collect();
        let mut table = VariableTable::default();
        let batch = [
            Entry::Op(&lines[0]),
            Entry::Op("{not json"),
            Entry::Reset,
            Entry::Op(&lines[1]),
            Entry::Op("[]"),
            Entry::Op(&lines[2]),
        ];
        let done = replay(&mut table, &batch).expect("replays");
        assert!(done.reset);
        // Only what follows the reset counts: the bad line before it is gone with the rest.
        let bad: Vec<usize> = done.unreadable.iter().map(|u| u.index).collect();
        assert_eq!(bad, vec![4]);
        assert_eq!(table.scope_count(), 2, "s2 and s3, not s1");
        let mut expected = VariableTable::default();
        replay(&mut expected, &[Entry::Op(&lines[1]), Entry::Op(&lines[2])]).expect("replays");
        assert_eq!(ops_of(&table), ops_of(&expected));
        // Without a reset a batch extends the table.
        let more = replay(&mut table, &[Entry::Op(&lines[0])]).expect("replays");
        assert!(!more.reset && more.unreadable.is_empty());
        assert_eq!(table.scope_count(), 3);
    }

    #[test]
    fn a_large_replay_decodes_in_order_as_a_small_one_does() {
        let mut lines = Vec::new();
        for i in 0..(PARALLEL_DECODE_MIN + 7) {
            let mut op = scope_op(&format!("s{}", i % 50));
            op.scope_revision = Revision::compute("variable-scope", None, &serde_json::json!(i));
            lines.push(serde_json::to_string(&op).expect("encodes"));
        }
        let entries: Vec<Entry<'_>> = lines.iter().map(|l| Entry::Op(l)).collect();
        let mut parallel = VariableTable::default();
        replay(&mut parallel, &entries).expect("replays");
        let mut serial = VariableTable::default();
        for chunk in entries.chunks(100) {
            replay(&mut serial, chunk).expect("replays");
        }
        assert_eq!(ops_of(&parallel), ops_of(&serial));
    }
}
