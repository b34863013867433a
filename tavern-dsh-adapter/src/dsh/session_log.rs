//! DSH's session logs on disk, as stock DSH writes them (row `session-persistence-jsonl`,
//! 0.1.0-rc.6/rc.8): `<root>/--<project>--/<session>/session.jsonl.zstd` — one zstd frame per
//! append batch, each frame's text whole lines — or `session.jsonl` with `compression: none`.
//! Either way the first line is a `{"type":"session"}` header, and by default (`packChunks`)
//! runs of three or more `assistant/chunk` deltas are packed into one row
//! (`text-chunks`, `reasoning-chunks`, `tool-call-chunks` with `seq0`, `time0` and `dt`),
//! which [`expand_row`] turns back into the events the host emitted, so seqs stay
//! contiguous for the projector.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// The log file names stock DSH uses (uncompressed, zstd), in the order they are looked for.
pub const LOG_NAMES: [&str; 2] = ["session.jsonl", "session.jsonl.zstd"];

/// The most text a compressed log is decoded to at once; a larger log is refused by name
/// (a long roleplay session's log is a few MiB).
pub const MAX_DECODED_BYTES: u64 = 256 * 1024 * 1024;

/// A session id as DSH names its directory (`encodeSegment`): `[A-Za-z0-9._-]` kept, every
/// other UTF-16 code unit (and `~`) as `~XXXX`; `.` and `..` escaped whole.
pub fn segment(id: &str) -> String {
    match id {
        "." => return "~002E".into(),
        ".." => return "~002E~002E".into(),
        _ => {}
    }
    let mut out = String::with_capacity(id.len());
    for unit in id.encode_utf16() {
        match char::from_u32(u32::from(unit)) {
            Some(c) if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') => out.push(c),
            _ => out.push_str(&format!("~{unit:04X}")),
        }
    }
    out
}

/// `session`'s log under `root` (any project folder), uncompressed or zstd.
pub fn find(root: &Path, session: &str) -> Option<PathBuf> {
    let dir = segment(session);
    for entry in std::fs::read_dir(root).ok()?.filter_map(Result::ok) {
        for name in LOG_NAMES {
            let candidate = entry.path().join(&dir).join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// Whether `path` is a zstd log (by its name, as DSH decides).
pub fn is_zstd(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "zstd")
}

/// What [`decode_frames`] decoded: the text of every whole frame, and how many compressed
/// bytes those frames took (where the next read starts).
#[derive(Debug, Default)]
pub struct Decoded {
    /// The frames' text: whole lines, each ending in `\n`.
    pub text: Vec<u8>,
    /// Compressed bytes consumed.
    pub consumed: u64,
}

/// Decodes the whole zstd frames at the start of `bytes`. A torn last frame (the host is
/// writing it, or died mid-write) ends the decoding without an error: it is read again next
/// time. A frame whose checksum does not match is corruption.
///
/// # Errors
/// A bad checksum, a frame that is not zstd, or more than [`MAX_DECODED_BYTES`] of text.
pub fn decode_frames(bytes: &[u8]) -> Result<Decoded, String> {
    use std::io::Read;
    let mut out = Decoded::default();
    let mut rest = bytes;
    while !rest.is_empty() {
        const MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
        if !rest.starts_with(&MAGIC[..rest.len().min(4)]) {
            return Err(format!("not a zstd frame at byte {}", out.consumed));
        }
        let mut reader = rest;
        let Ok(mut decoder) = ruzstd::decoding::StreamingDecoder::new(&mut reader) else {
            // A frame's magic and a header that does not end: a torn tail.
            break;
        };
        let room = MAX_DECODED_BYTES.saturating_sub(out.text.len() as u64) + 1;
        let mut frame = Vec::new();
        if (&mut decoder).take(room).read_to_end(&mut frame).is_err() {
            // The frame ends past the file's end: written next, or torn.
            break;
        }
        if out.text.len() as u64 + frame.len() as u64 > MAX_DECODED_BYTES {
            return Err(format!(
                "the log decodes to more than {MAX_DECODED_BYTES} bytes"
            ));
        }
        let inner = &decoder.decoder;
        if let (Some(stored), Some(computed)) = (
            inner.get_checksum_from_data(),
            inner.get_calculated_checksum(),
        ) {
            if stored != computed {
                return Err(format!(
                    "zstd frame at byte {} fails its checksum",
                    out.consumed
                ));
            }
        }
        drop(decoder);
        let used = rest.len() - reader.len();
        out.consumed += used as u64;
        out.text.extend_from_slice(&frame);
        rest = reader;
    }
    Ok(out)
}

/// The events of one log row: itself when it is an event (it has a `seq`), the chunk events a
/// packed row stands for, nothing for the header or anything else.
pub fn expand_row(row: Value) -> Vec<(u64, Value)> {
    if let Some(seq) = row.get("seq").and_then(Value::as_u64) {
        return vec![(seq, row)];
    }
    let chunk_type = match row.get("type").and_then(Value::as_str) {
        Some("text-chunks") => "text-delta",
        Some("reasoning-chunks") => "reasoning-delta",
        Some("tool-call-chunks") => "tool-call-delta",
        _ => return Vec::new(),
    };
    let (Some(seq0), Some(time0), Some(data)) = (
        row.get("seq0").and_then(Value::as_u64),
        row.get("time0").and_then(Value::as_i64),
        row.get("data").and_then(Value::as_object),
    ) else {
        return Vec::new();
    };
    let parts = if chunk_type == "tool-call-delta" {
        "args"
    } else {
        "texts"
    };
    let (Some(parts), Some(dt)) = (
        data.get(parts).and_then(Value::as_array),
        data.get("dt").and_then(Value::as_array),
    ) else {
        return Vec::new();
    };
    let mut time = time0;
    let mut out = Vec::with_capacity(parts.len());
    for (k, part) in parts.iter().enumerate() {
        if k > 0 {
            time += dt.get(k - 1).and_then(Value::as_i64).unwrap_or(0);
        }
        let mut chunk = Map::new();
        chunk.insert("type".into(), json!(chunk_type));
        chunk.insert(
            "index".into(),
            data.get("index").cloned().unwrap_or(json!(0)),
        );
        if chunk_type == "tool-call-delta" {
            chunk.insert("id".into(), data.get("id").cloned().unwrap_or(Value::Null));
            if let Some(name) = data.get("name") {
                chunk.insert("name".into(), name.clone());
            }
            chunk.insert("argumentsDelta".into(), part.clone());
        } else {
            chunk.insert("text".into(), part.clone());
        }
        let seq = seq0 + k as u64;
        out.push((
            seq,
            json!({
                "type": "assistant/chunk",
                "seq": seq,
                "time": time,
                "data": {"turn": data.get("turn"), "step": data.get("step"), "chunk": chunk},
            }),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_encoded_as_dsh_encodes_them() {
        assert_eq!(segment("session-0b1c-42"), "session-0b1c-42");
        assert_eq!(segment("a b/c~"), "a~0020b~002Fc~007E");
        assert_eq!(segment(".."), "~002E~002E");
        assert_eq!(segment("夜"), "~591C");
        assert_eq!(segment("🌙"), "~D83C~DF19");
    }

    fn frame(text: &str) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(
            text.as_bytes(),
            ruzstd::encoding::CompressionLevel::Fastest,
        )
    }

    #[test]
    fn whole_frames_are_decoded_and_a_torn_last_frame_waits_for_the_next_read() {
        let (a, b, c) = (
            frame("{\"type\":\"session\"}\n"),
            frame("{\"seq\":0}\n{\"seq\":1}\n"),
            frame("{\"seq\":2}\n"),
        );
        let mut file = [a.clone(), b.clone()].concat();
        file.extend_from_slice(&c[..c.len() - 3]);
        let decoded = decode_frames(&file).unwrap();
        assert_eq!(
            decoded.text,
            b"{\"type\":\"session\"}\n{\"seq\":0}\n{\"seq\":1}\n"
        );
        assert_eq!(decoded.consumed, (a.len() + b.len()) as u64);
        // The host finishes the frame: the next read starts where the last one stopped.
        file.extend_from_slice(&c[c.len() - 3..]);
        let next = decode_frames(&file[decoded.consumed as usize..]).unwrap();
        assert_eq!(next.text, b"{\"seq\":2}\n");
        // Bytes that are no zstd frame are corruption, never skipped silently.
        let mut bad = a;
        bad.extend_from_slice(b"garbage that is not a frame");
        assert!(decode_frames(&bad)
            .unwrap_err()
            .contains("not a zstd frame"));
    }

    #[test]
    fn a_packed_row_expands_to_its_contiguous_chunk_events() {
        let row = json!({"type": "text-chunks", "seq0": 7, "time0": 1000,
            "data": {"turn": 1, "step": 2, "index": 0, "dt": [5, 10], "texts": ["a", "b", "c"]}});
        let events = expand_row(row);
        assert_eq!(
            events.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            vec![7, 8, 9]
        );
        assert_eq!(
            events[2].1,
            json!({"type": "assistant/chunk", "seq": 9, "time": 1015,
                "data": {"turn": 1, "step": 2, "chunk": {"type": "text-delta", "index": 0, "text": "c"}}})
        );
        assert!(expand_row(json!({"type": "session", "version": 0})).is_empty());
    }
}
