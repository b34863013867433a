//! Bounded line reading for line-delimited protocols (MCP on stdio, the bridge's NDJSON): a
//! line longer than the limit is consumed without being held in memory.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line read from the input.
#[derive(Debug)]
pub enum Line {
    /// A complete frame (terminator removed).
    Frame(Vec<u8>),
    /// A line longer than the limit, skipped; `head` is its start (for the id).
    TooLong {
        /// The line's first bytes, up to the limit.
        head: Vec<u8>,
        /// Its whole length in bytes.
        len: usize,
    },
    /// End of input.
    End,
}

/// Reads one line of at most `max` bytes; a longer one is consumed to its end without being
/// kept beyond its first `max` bytes.
pub async fn read_line(
    input: &mut (impl AsyncBufRead + Unpin),
    max: usize,
) -> std::io::Result<Line> {
    let mut buf = Vec::new();
    let mut len = 0usize;
    loop {
        let chunk = input.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(if len == 0 {
                Line::End
            } else if len > max {
                Line::TooLong { head: buf, len }
            } else {
                Line::Frame(buf)
            });
        }
        let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        len += part.len();
        if buf.len() < max {
            let room = max - buf.len();
            buf.extend_from_slice(&part[..part.len().min(room)]);
        }
        let used = done.unwrap_or(part.len());
        input.consume(used);
        if done.is_some() {
            return Ok(if len > max {
                Line::TooLong { head: buf, len }
            } else {
                Line::Frame(buf)
            });
        }
    }
}
