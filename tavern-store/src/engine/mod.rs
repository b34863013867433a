//! Store logic shared by every adapter: CAS checks, audit, TTL, search and variable scopes over
//! in-memory tables. Adapters add persistence around `prepare_*` (pure checks producing an
//! operation) and `apply` (mutation), so every adapter enforces exactly the same contracts;
//! [`oplog::OpTable`] is the seam where a backend's operation log meets the tables.

pub(crate) mod memory_table;
pub(crate) mod oplog;
pub(crate) mod variable_table;
