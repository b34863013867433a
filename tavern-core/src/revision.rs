//! Record revisions: SHA-256 over a written-down canonical encoding of JSON values (see
//! `docs/FORMATS.md`, "Canonical encoding v1"). Not `serde_json` output and not `std::hash`, so
//! revisions are stable across crate versions, platforms and field orders.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{excerpt, CoreError};

/// Nesting deeper than this is refused before any recursion over a value.
pub const MAX_JSON_DEPTH: usize = 32;

/// An opaque record revision: `r1-` followed by 32 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Revision(String);

impl Revision {
    /// A place for a revision about to be computed (never stored nor shown: not a valid one).
    pub(crate) fn unset() -> Self {
        Self(String::new())
    }

    /// Computes a revision for `content` in `domain` (e.g. `memory`, `variable`), chained to the
    /// previous revision of the same record so that A→B→A never revives an old revision.
    pub fn compute(domain: &str, previous: Option<&Revision>, content: &Value) -> Self {
        let mut w = CanonicalWriter::new(domain, previous);
        encode_value(&mut w.buf, content);
        w.finish()
    }

    /// Parses a revision a caller sent back (e.g. from a tool argument).
    ///
    /// # Errors
    /// [`CoreError::InvalidId`] when it is not of the `r1-<32 hex>` form.
    pub fn parse(value: impl Into<String>) -> Result<Self, CoreError> {
        let value = value.into();
        if Self::is_valid(&value) {
            Ok(Self(value))
        } else {
            Err(CoreError::InvalidId {
                kind: "revision",
                value: excerpt(&value),
                reason: "expected r1- followed by 32 lowercase hex digits",
            })
        }
    }

    /// Whether `value` is a revision's text, without copying it.
    pub fn is_valid(value: &str) -> bool {
        value.len() == 35
            && value.starts_with("r1-")
            && value[3..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    /// The revision's 32 hex digits as a number: a table holding many keeps them so, without
    /// a string each ([`Revision::from_u128`] gives the revision back).
    pub fn to_u128(&self) -> u128 {
        self.0
            .get(3..)
            .and_then(|hex| u128::from_str_radix(hex, 16).ok())
            .unwrap_or(0)
    }

    /// The revision whose digits are `digits` (see [`Revision::to_u128`]).
    pub fn from_u128(digits: u128) -> Self {
        Self(format!("r1-{digits:032x}"))
    }

    /// The revision text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Revision {
    type Error = CoreError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl From<Revision> for String {
    fn from(r: Revision) -> String {
        r.0
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A revision's input written piece by piece for content of a fixed shape: the same bytes
/// (and so the same revision) as [`Revision::compute`] of the JSON value the pieces describe,
/// without building that value — a record's revision is computed on every write and import,
/// and building a `serde_json::Value` for it cost more than hashing it.
///
/// The caller writes the value in canonical order: an object's length, then its keys in byte
/// order, each followed by its value.
///
/// Crate-private: a caller that writes keys out of order would compute a revision no JSON
/// path agrees with, so only this crate's records (each checked against the JSON path by a
/// property test) use it.
#[derive(Debug)]
pub(crate) struct CanonicalWriter {
    buf: Vec<u8>,
}

impl CanonicalWriter {
    /// Starts the input of a revision in `domain` chained to `previous`.
    pub fn new(domain: &str, previous: Option<&Revision>) -> Self {
        Self::with_capacity(domain, previous, 256)
    }

    /// [`CanonicalWriter::new`] with room for `capacity` bytes, so that the input of a large
    /// record is not copied again as it grows.
    pub fn with_capacity(domain: &str, previous: Option<&Revision>, capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(capacity);
        encode_str(&mut buf, "agent-tavern/revision/v1");
        encode_str(&mut buf, domain);
        match previous {
            Some(prev) => encode_str(&mut buf, &prev.0),
            None => buf.push(b'N'),
        }
        Self { buf }
    }

    /// An object of `len` entries (its keys and values follow).
    pub fn object(&mut self, len: usize) -> &mut Self {
        self.buf.push(b'O');
        self.buf.extend_from_slice(&len32(len).to_be_bytes());
        self
    }

    /// An array of `len` items (they follow).
    pub fn array(&mut self, len: usize) -> &mut Self {
        self.buf.push(b'A');
        self.buf.extend_from_slice(&len32(len).to_be_bytes());
        self
    }

    /// A string (an object key too).
    pub fn str(&mut self, s: &str) -> &mut Self {
        encode_str(&mut self.buf, s);
        self
    }

    /// `null`.
    pub fn null(&mut self) -> &mut Self {
        self.buf.push(b'N');
        self
    }

    /// A signed integer.
    pub fn int(&mut self, i: i64) -> &mut Self {
        self.buf.push(b'I');
        self.buf.extend_from_slice(&i.to_be_bytes());
        self
    }

    /// An unsigned integer (as JSON holds it: signed when it fits).
    pub fn uint(&mut self, u: u64) -> &mut Self {
        match i64::try_from(u) {
            Ok(i) => self.int(i),
            Err(_) => {
                self.buf.push(b'U');
                self.buf.extend_from_slice(&u.to_be_bytes());
                self
            }
        }
    }

    /// A signed integer, or `null`.
    pub fn opt_int(&mut self, i: Option<i64>) -> &mut Self {
        match i {
            Some(i) => self.int(i),
            None => self.null(),
        }
    }

    /// A string, or `null`.
    pub fn opt_str(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            Some(s) => self.str(s),
            None => self.null(),
        }
    }

    /// A floating-point number, as JSON holds one: `null` when it is not finite, `-0.0` as
    /// `0.0`.
    pub fn float(&mut self, f: f64) -> &mut Self {
        if !f.is_finite() {
            return self.null();
        }
        let f = if f == 0.0 { 0.0 } else { f };
        self.buf.push(b'D');
        self.buf.extend_from_slice(&f.to_bits().to_be_bytes());
        self
    }

    /// The revision of what was written.
    pub fn finish(self) -> Revision {
        let digest = Sha256::digest(&self.buf);
        // Built in place (`format!` grew the string twice per record of an import).
        let mut text = String::with_capacity(35);
        text.push_str("r1-");
        push_hex(&mut text, &digest[..16]);
        Revision(text)
    }
}

/// Appends the canonical encoding (v1) of `value` to `out`.
///
/// `N` null · `T` true · `F` false · `I` i64 (8 bytes BE) · `U` u64 above `i64::MAX` (8 bytes BE)
/// · `D` other numbers as IEEE-754 f64 bits (8 bytes BE, `-0.0` as `0.0`) · `S` u32 BE byte
/// length + UTF-8 · `A` u32 BE count + items · `O` u32 BE count + (key as `S`, value) pairs
/// sorted by key bytes. Values nested deeper than [`MAX_JSON_DEPTH`] encode as `X` (callers
/// validate depth before computing revisions; this keeps the function total).
pub fn encode_value(out: &mut Vec<u8>, value: &Value) {
    encode_at(out, value, 0);
}

fn encode_at(out: &mut Vec<u8>, value: &Value, depth: usize) {
    if depth > MAX_JSON_DEPTH {
        out.push(b'X');
        return;
    }
    match value {
        Value::Null => out.push(b'N'),
        Value::Bool(true) => out.push(b'T'),
        Value::Bool(false) => out.push(b'F'),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push(b'I');
                out.extend_from_slice(&i.to_be_bytes());
            } else if let Some(u) = n.as_u64() {
                out.push(b'U');
                out.extend_from_slice(&u.to_be_bytes());
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                let f = if f == 0.0 { 0.0 } else { f };
                out.push(b'D');
                out.extend_from_slice(&f.to_bits().to_be_bytes());
            }
        }
        Value::String(s) => encode_str(out, s),
        Value::Array(items) => {
            out.push(b'A');
            out.extend_from_slice(&len32(items.len()).to_be_bytes());
            for item in items {
                encode_at(out, item, depth + 1);
            }
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'O');
            out.extend_from_slice(&len32(entries.len()).to_be_bytes());
            for (k, v) in entries {
                encode_str(out, k);
                encode_at(out, v, depth + 1);
            }
        }
    }
}

fn encode_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'S');
    out.extend_from_slice(&len32(s.len()).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Lengths above `u32::MAX` cannot occur for validated records (limits are in KiB); saturate
/// rather than panic so the function stays total.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

/// Lowercase hex digits, by value.
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The two lowercase hex digits of `b`.
fn hex_pair(b: u8) -> [u8; 2] {
    [
        HEX_DIGITS[usize::from(b >> 4)],
        HEX_DIGITS[usize::from(b & 15)],
    ]
}

/// Appends the lowercase hex of `bytes` to `out`.
fn push_hex(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        out.extend(hex_pair(*b).map(char::from));
    }
}

/// A short stable digest (16 hex digits) of arbitrary bytes, for ids derived from content.
pub fn short_digest(parts: &[&[u8]]) -> String {
    hex(&short_digest_raw(parts))
}

/// [`short_digest`] as its 16 ASCII hex digits, with nothing allocated (log lines by the
/// million).
pub fn short_digest_ascii(parts: &[&[u8]]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (pair, b) in out.chunks_exact_mut(2).zip(short_digest_raw(parts)) {
        pair.copy_from_slice(&hex_pair(b));
    }
    out
}

fn short_digest_raw(parts: &[&[u8]]) -> [u8; 8] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize()[..8]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Pins the canonical encoding: if this changes, every stored revision changes meaning. The
    /// expected values were computed by the independent Python reference in `docs/FORMATS.md`.
    #[test]
    fn golden_revisions_are_pinned() {
        let v =
            json!({"b": [1, -2, 1.5, "x", null, true], "a": {"好感度": 18446744073709551615u64}});
        assert_eq!(
            Revision::compute("variable", None, &v).as_str(),
            "r1-02b682aa2a757b82739adcc5f383fa52"
        );
        let prev = Revision::parse("r1-00000000000000000000000000000000").unwrap();
        assert_eq!(
            Revision::compute("memory", Some(&prev), &json!("hello")).as_str(),
            "r1-00528a0202f1bcdf1ac1c07fd2772fcb"
        );
    }

    #[test]
    fn key_order_and_negative_zero_do_not_matter() {
        let a = json!({"x": 1, "y": [0.0]});
        let b: Value = serde_json::from_str(r#"{"y": [-0.0], "x": 1}"#).unwrap();
        assert_eq!(
            Revision::compute("d", None, &a),
            Revision::compute("d", None, &b)
        );
    }

    proptest::proptest! {
        /// The allocation-free digest of log lines is the digest's text, byte for byte.
        #[test]
        fn short_digest_ascii_is_the_short_digest(
            parts in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..4),
        ) {
            let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            let ascii = short_digest_ascii(&parts);
            let text = short_digest(&parts);
            proptest::prop_assert_eq!(&ascii[..], text.as_bytes());
        }
    }

    #[test]
    fn chaining_prevents_aba() {
        let a = Revision::compute("variable", None, &json!("A"));
        let b = Revision::compute("variable", Some(&a), &json!("B"));
        let a2 = Revision::compute("variable", Some(&b), &json!("A"));
        assert_ne!(a, a2);
    }

    #[test]
    fn a_revision_is_its_digits() {
        for text in [
            "r1-00000000000000000000000000000000",
            "r1-0123456789abcdef0123456789abcdef",
            "r1-ffffffffffffffffffffffffffffffff",
        ] {
            let r = Revision::parse(text).unwrap();
            assert_eq!(Revision::from_u128(r.to_u128()), r);
        }
        let r = Revision::compute("memory", None, &serde_json::json!({"a": 1}));
        assert_eq!(Revision::from_u128(r.to_u128()), r);
        assert_ne!(r.to_u128(), 0);
    }

    #[test]
    fn parse_rejects_forgeries() {
        for bad in [
            "",
            "r1-",
            "r2-00000000000000000000000000000000",
            "r1-0000000000000000000000000000000G",
        ] {
            assert!(Revision::parse(bad).is_err(), "{bad}");
            assert!(!Revision::is_valid(bad), "{bad}");
        }
    }
}
