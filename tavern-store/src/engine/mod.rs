//! Store logic shared by every adapter: CAS checks, audit, TTL, search and variable scopes over
//! in-memory tables. Adapters add persistence around `prepare_*` (pure checks producing an
//! operation) and `apply` (mutation), so both adapters enforce exactly the same contracts.

pub(crate) mod memory_table;
pub(crate) mod variable_table;
