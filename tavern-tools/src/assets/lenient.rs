//! Lenient JSON for real-world cards: invalid UTF-8 and lone UTF-16 surrogate escapes (which
//! JavaScript writes happily and `serde_json` rejects) become U+FFFD instead of failing.

use serde_json::Value;

/// Parses JSON bytes, repairing invalid UTF-8 and lone surrogate escapes.
///
/// # Errors
/// The `serde_json` error text when the repaired input is still not JSON.
pub fn parse_lenient(bytes: &[u8]) -> Result<Value, String> {
    let text = String::from_utf8_lossy(bytes);
    match serde_json::from_str(&text) {
        Ok(v) => Ok(v),
        Err(first) => {
            serde_json::from_str(&repair_surrogates(&text)).map_err(|_| first.to_string())
        }
    }
}

/// Replaces `\uXXXX` escapes of lone surrogates with `\ufffd`; well-formed pairs are kept.
pub fn repair_surrogates(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut last = 0;
    let escape_at = |i: usize| -> Option<u16> {
        let hex = bytes.get(i + 2..i + 6)?;
        if bytes.get(i) != Some(&b'\\') || bytes.get(i + 1) != Some(&b'u') {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    };
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            if let Some(unit) = escape_at(i) {
                let high = (0xD800..0xDC00).contains(&unit);
                let low = (0xDC00..0xE000).contains(&unit);
                let paired =
                    high && escape_at(i + 6).is_some_and(|n| (0xDC00..0xE000).contains(&n));
                if paired {
                    i += 12;
                    continue;
                }
                if high || low {
                    out.push_str(&text[last..i]);
                    out.push_str("\\ufffd");
                    i += 6;
                    last = i;
                    continue;
                }
                i += 6;
                continue;
            }
            // Any other escape: skip the escaped character so `\\u` is not misread.
            i += 2;
            continue;
        }
        i += 1;
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lone_surrogates_become_replacement_characters() {
        let v =
            parse_lenient(br#"{"a":"x\ud83d y","b":"\ude00","c":"\ud83d\ude00","d":"\\ud83d"}"#)
                .unwrap();
        assert_eq!(v["a"], "x\u{fffd} y");
        assert_eq!(v["b"], "\u{fffd}");
        assert_eq!(v["c"], "😀");
        assert_eq!(v["d"], "\\ud83d", "an escaped backslash is not an escape");
    }

    #[test]
    fn invalid_utf8_is_replaced_and_garbage_still_fails() {
        let v = parse_lenient(b"{\"a\":\"\xff\"}").unwrap();
        assert_eq!(v["a"], "\u{fffd}");
        assert!(parse_lenient(b"{\"a\":").is_err());
    }
}
