//! Encoding validated ids into file names that cannot escape their folder, collide on
//! case-insensitive file systems, or hit reserved device names.

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

#[cfg(test)]
mod tests {
    use super::*;

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
