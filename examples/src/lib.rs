//! Shared helpers for the runnable examples in `src/bin/`.
