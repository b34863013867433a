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

use serde::de::DeserializeOwned;
use serde::Serialize;

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
