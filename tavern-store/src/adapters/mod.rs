//! The adapters: each implements every port (`crate::ports`) over one kind of storage —
//! `fs` (files under one root: the embedded default), `mem` (strict, in memory, for tests),
//! `pg` (PostgreSQL, feature `postgres`) — on the shared engine (`crate::engine`), so all of
//! them enforce the same contracts.

pub mod fs;
pub mod mem;
#[cfg(feature = "postgres")]
pub mod pg;
