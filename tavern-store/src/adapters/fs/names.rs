//! Encoding validated ids into file names that cannot escape their folder or hit reserved
//! device names.
//!
//! Two encodings: [`encode`] (private documents: sessions, the legacy chat layout) escapes
//! everything but `a-z 0-9 - _`, so it also avoids case-insensitive collisions; [`encode_readable`]
//! (SillyTavern's `chats/<character>/<chat>.jsonl`) keeps the name as the user wrote it and
//! escapes only what is unsafe on Linux, macOS or Windows, so a chat's file is `<chat id>.jsonl`
//! wherever that is safe.

use tavern_core::revision::short_digest;

/// Longest encoded name before it is shortened with a digest.
const MAX_ENCODED: usize = 240;

/// Encodes one path segment: `_` + the bytes, with everything but `a-z 0-9 - _` written as
/// `%XX`. The leading `_` keeps the name away from `.`/`..`, hidden files and device names
/// (`con`, `nul`, …). Longer results are cut and suffixed with `~` + a digest of the input.
pub(crate) fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len() + 1);
    out.push('_');
    for b in segment.bytes() {
        if b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > MAX_ENCODED {
        out.truncate(MAX_ENCODED - 18);
        // Never leave half a `%XX` escape behind the cut.
        while out.ends_with('%') || out[out.len().saturating_sub(2)..].starts_with('%') {
            out.pop();
        }
        out.push('~');
        out.push_str(&short_digest(&[segment.as_bytes()]));
    }
    out
}

/// Decodes a name made by [`encode`]; `None` for shortened or foreign names.
pub(crate) fn decode(name: &str) -> Option<String> {
    let rest = name.strip_prefix('_')?;
    if rest.contains('~') {
        return None;
    }
    let mut bytes = Vec::with_capacity(rest.len());
    let mut it = rest.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hi = char::from(it.next()?).to_digit(16)?;
            let lo = char::from(it.next()?).to_digit(16)?;
            bytes.push(u8::try_from(hi * 16 + lo).ok()?);
        } else {
            bytes.push(b);
        }
    }
    let s = String::from_utf8(bytes).ok()?;
    (encode(&s) == name).then_some(s)
}

/// Longest readable name before it is shortened with a digest (plus `.jsonl` or `.lock` it
/// stays within the 255-byte limit of common file systems).
const MAX_READABLE: usize = 240;

/// Windows device names, reserved with any extension (`aux.txt`) and in any case.
const RESERVED: [&str; 4] = ["con", "prn", "aux", "nul"];

/// Whether `segment` starts with a Windows device name: the part before the first `.`, without
/// trailing spaces, is `CON`, `PRN`, `AUX`, `NUL`, `COM0`–`COM9` or `LPT0`–`LPT9` (also with the
/// superscript digits `¹²³` Windows treats the same), in any case.
fn is_reserved_device(segment: &str) -> bool {
    let base = segment
        .split('.')
        .next()
        .unwrap_or("")
        .trim_end_matches(' ');
    let lower = base.to_lowercase();
    if RESERVED.contains(&lower.as_str()) {
        return true;
    }
    let mut chars = lower.chars();
    let prefix: String = chars.by_ref().take(3).collect();
    let rest: Vec<char> = chars.collect();
    (prefix == "com" || prefix == "lpt")
        && rest.len() == 1
        && (rest[0].is_ascii_digit() || matches!(rest[0], '¹' | '²' | '³'))
}

/// Whether `c` at position `at` (of `len` characters) must be escaped in a readable name.
fn unsafe_char(c: char, at: usize, len: usize) -> bool {
    let first = at == 0;
    let last = at + 1 == len;
    c.is_control()
        || matches!(c, '%' | '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|')
        // Hidden files and the store's own `.tmp-*` files; `_` starts only legacy names.
        || (first && matches!(c, '.' | '_'))
        // Windows drops trailing dots and spaces; leading spaces are easy to lose.
        || ((first || last) && c.is_whitespace())
        || (last && c == '.')
}

fn push_escaped(out: &mut String, c: char) {
    let mut buf = [0u8; 4];
    for b in c.encode_utf8(&mut buf).bytes() {
        out.push_str(&format!("%{b:02X}"));
    }
}

/// Encodes one path segment readably: the text itself, with `%XX` (its UTF-8 bytes) only for
/// `%`, control characters, `/ \ : * ? " < > |`, a leading `.` or `_`, leading or trailing
/// whitespace, a trailing `.`, and the first character of a Windows device name (`CON`,
/// `aux.txt`, `LPT1`). Because `%` is always escaped, a name without `%` is exactly its text and
/// an encoded name can never equal another segment's plain name. Longer results are cut and end
/// in `%~` plus a digest of the input (never produced by escaping, so never decoded).
///
/// Case-insensitive file systems (Windows, macOS by default) see `Mira` and `mira` as one file,
/// exactly as SillyTavern does with its own chat files.
pub(crate) fn encode_readable(segment: &str) -> String {
    let len = segment.chars().count();
    let reserved = is_reserved_device(segment);
    let mut out = String::with_capacity(segment.len() + 2);
    for (i, c) in segment.chars().enumerate() {
        if unsafe_char(c, i, len) || (i == 0 && reserved) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    if out.len() > MAX_READABLE {
        let digest = short_digest(&[segment.as_bytes()]);
        let mut cut = MAX_READABLE - digest.len() - 2;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        // Never leave half a `%XX` escape behind the cut.
        let tail = out.len().saturating_sub(2);
        if let Some(p) = out.as_bytes()[tail..].iter().position(|b| *b == b'%') {
            out.truncate(tail + p);
        }
        out.push_str("%~");
        out.push_str(&digest);
    }
    out
}

/// Decodes a name made by [`encode_readable`]; `None` for shortened names and for names that
/// [`encode_readable`] would not have produced (foreign or legacy files).
pub(crate) fn decode_readable(name: &str) -> Option<String> {
    if name.contains("%~") {
        return None;
    }
    let mut bytes = Vec::with_capacity(name.len());
    let mut it = name.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let hi = char::from(it.next()?).to_digit(16)?;
            let lo = char::from(it.next()?).to_digit(16)?;
            bytes.push(u8::try_from(hi * 16 + lo).ok()?);
        } else {
            bytes.push(b);
        }
    }
    let s = String::from_utf8(bytes).ok()?;
    (encode_readable(&s) == name).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(chat id, file stem)`: ordinary names stay as they are; only what some file system
    /// refuses or mangles is escaped.
    #[test]
    fn readable_names_keep_ordinary_chat_ids_and_escape_only_the_unsafe() {
        let cases: &[(&str, &str)] = &[
            (
                "Seraphina - 2024-09-19@20h03m29s",
                "Seraphina - 2024-09-19@20h03m29s",
            ),
            (
                "七大姑 - 2024-10-05@21h59m30s",
                "七大姑 - 2024-10-05@21h59m30s",
            ),
            (
                "Branch #38 - 2024-1-5@16h52m07s",
                "Branch #38 - 2024-1-5@16h52m07s",
            ),
            ("Mira 🌙 (draft), Mira's day", "Mira 🌙 (draft), Mira's day"),
            ("a.b", "a.b"),
            ("x..y", "x..y"),
            ("100%", "100%25"),
            ("%41", "%2541"),
            ("CON", "%43ON"),
            ("con", "%63on"),
            ("aux.txt", "%61ux.txt"),
            ("Nul .txt", "%4Eul .txt"),
            ("LPT1", "%4CPT1"),
            ("COM²", "%43OM²"),
            ("CONSOLE", "CONSOLE"),
            ("COM10", "COM10"),
            ("end.", "end%2E"),
            ("..x", "%2E.x"),
            (".hidden", "%2Ehidden"),
            (".tmp-abc", "%2Etmp-abc"),
            ("_legacy", "%5Flegacy"),
            ("a_b", "a_b"),
            ("a:b*c?", "a%3Ab%2Ac%3F"),
            ("tab\tin", "tab%09in"),
            ("ends ", "ends%20"),
            ("Seraphina", "Seraphina"),
        ];
        for (id, stem) in cases {
            assert_eq!(encode_readable(id), *stem, "{id:?}");
            assert_eq!(decode_readable(stem).as_deref(), Some(*id), "{stem:?}");
        }
    }

    #[test]
    fn readable_names_never_collide_and_stay_short() {
        // A plain name never contains `%`, so no encoded name equals another id's plain name.
        let ids = ["CON", "%43ON", "con", "a.", "a%2E", "_x", "%5Fx", "x", "X"];
        let names: std::collections::HashSet<String> =
            ids.iter().map(|i| encode_readable(i)).collect();
        assert_eq!(names.len(), ids.len());
        for long in ["长".repeat(66), "%".repeat(200), "x".repeat(1000)] {
            let e = encode_readable(&long);
            assert!(e.len() <= MAX_READABLE, "{}", e.len());
            if e.contains("%~") {
                assert_eq!(decode_readable(&e), None);
            } else {
                assert_eq!(decode_readable(&e).as_deref(), Some(long.as_str()));
            }
        }
        assert_ne!(
            encode_readable(&"%".repeat(200)),
            encode_readable(&format!("{}!", "%".repeat(199)))
        );
        for foreign in ["%4", "%zz", "%41", "_%4Dira", "a%2Eb"] {
            assert_eq!(decode_readable(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn hostile_segments_stay_single_safe_names() {
        for s in [
            "..",
            ".",
            "a/b",
            "a\\b",
            "a\0b",
            "CON",
            "nul",
            "Aa",
            "门之主",
            &"x".repeat(1000),
        ] {
            let e = encode(s);
            assert!(e.starts_with('_'));
            assert!(e.len() <= MAX_ENCODED, "{e}");
            assert!(
                e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"%_-~".contains(&b)),
                "{e}"
            );
        }
        assert_ne!(encode("Aa"), encode("aa"), "no case-insensitive collisions");
    }

    #[test]
    fn short_names_round_trip() {
        for s in ["Seraphina - 2024-09-19@20h03m29s", "门之主", "a.b"] {
            assert_eq!(decode(&encode(s)).as_deref(), Some(s));
        }
        assert_eq!(decode(&encode(&"y".repeat(500))), None);
        assert_eq!(decode("foreign.jsonl"), None);
    }
}
