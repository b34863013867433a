//! The content digest behind chat revisions: a chain over a chat's `\n`-separated segments, so
//! the same bytes give the same digest in every store, and appending extends the digest without
//! reading what came before.
//!
//! `c₀ = SHA-256("agent-tavern chat v2")`, `cᵢ = SHA-256(cᵢ₋₁ ‖ segmentᵢ)`, where the segments
//! are the chat's bytes split at every `\n` (none for an empty chat). A store that keeps lines
//! (one segment each, joined by `\n` as SillyTavern writes them) and a store that keeps the file
//! therefore agree, and a digest known at one length extends over appended lines alone.

use sha2::{Digest, Sha256};

use crate::revision::hex;

const SEED: &[u8] = b"agent-tavern chat v2";

/// Hex digits of the chain shown in a label (128 bits).
const LABEL_HEX: usize = 32;

/// The digest of a chat's content so far: the chain, how many segments and bytes it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChatDigest {
    chain: [u8; 32],
    segments: u64,
    bytes: u64,
}

impl Default for ChatDigest {
    fn default() -> Self {
        Self::empty()
    }
}

impl ChatDigest {
    /// The digest of an empty chat.
    pub fn empty() -> Self {
        Self {
            chain: Sha256::digest(SEED).into(),
            segments: 0,
            bytes: 0,
        }
    }

    /// A digest kept elsewhere (e.g. in a database row) from its parts: [`ChatDigest::chain`],
    /// segments and bytes.
    pub fn from_parts(chain: [u8; 32], segments: u64, bytes: u64) -> Self {
        Self {
            chain,
            segments,
            bytes,
        }
    }

    /// The chain value, to keep the digest and extend it later ([`ChatDigest::from_parts`]).
    pub fn chain(&self) -> [u8; 32] {
        self.chain
    }

    /// The digest of `bytes` (a whole chat file).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        let mut digest = Self::empty();
        // From empty, every byte string starts a segment.
        let _ = digest.append(bytes);
        digest
    }

    /// The digest of lines joined by `\n` (no `\n` at the end), as SillyTavern writes a chat.
    pub fn of_lines<'a>(lines: impl IntoIterator<Item = &'a str>) -> Self {
        let mut digest = Self::empty();
        for line in lines {
            digest.push_segment(line.as_bytes());
        }
        digest
    }

    /// Adds one segment: the bytes after the next `\n` (for the first segment, from the start).
    pub fn push_segment(&mut self, segment: &[u8]) {
        let mut h = Sha256::new();
        h.update(self.chain);
        h.update(segment);
        self.chain = h.finalize().into();
        let separator = u64::from(self.segments > 0);
        self.bytes = self
            .bytes
            .saturating_add(separator)
            .saturating_add(segment.len() as u64);
        self.segments = self.segments.saturating_add(1);
    }

    /// Extends the digest over bytes appended to the content. Returns `false`, changing
    /// nothing, when they do not start a new segment (they would continue the last one, which
    /// only a digest of the whole content can cover).
    #[must_use]
    pub fn append(&mut self, appended: &[u8]) -> bool {
        if appended.is_empty() {
            return true;
        }
        let rest = if self.segments == 0 {
            appended
        } else {
            match appended.strip_prefix(b"\n") {
                Some(rest) => rest,
                None => return false,
            }
        };
        for segment in rest.split(|b| *b == b'\n') {
            self.push_segment(segment);
        }
        true
    }

    /// Segments covered (lines, blank ones included).
    pub fn segments(&self) -> u64 {
        self.segments
    }

    /// Bytes covered.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// `segments-bytes-chain`: the text a chat revision is made of (128 bits of the chain).
    pub fn label(&self) -> String {
        let chain = hex(&self.chain);
        format!(
            "{}-{}-{}",
            self.segments,
            self.bytes,
            &chain[..LABEL_HEX.min(chain.len())]
        )
    }
}

/// A parsed [`ChatDigest::label`]: what a revision says about the content it was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestLabel {
    /// Segments the content had.
    pub segments: u64,
    /// Bytes the content had.
    pub bytes: u64,
    /// The label's chain digits.
    pub chain: String,
}

impl DigestLabel {
    /// Parses a label; `None` for anything [`ChatDigest::label`] does not produce.
    pub fn parse(label: &str) -> Option<Self> {
        let mut parts = label.split('-');
        let segments = parts.next()?.parse().ok()?;
        let bytes = parts.next()?.parse().ok()?;
        let chain = parts.next()?;
        let hex_ok = chain.len() == LABEL_HEX
            && chain
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (parts.next().is_none() && hex_ok).then(|| Self {
            segments,
            bytes,
            chain: chain.to_owned(),
        })
    }

    /// Whether the label's chain digits are those of `chain` (a [`ChatDigest::chain`]).
    pub fn matches_chain(&self, chain: &[u8; 32]) -> bool {
        hex(chain).get(..LABEL_HEX) == Some(self.chain.as_str())
    }

    /// Whether `digest` is the content this label was issued for.
    pub fn names(&self, digest: &ChatDigest) -> bool {
        digest.label() == self.to_string()
    }
}

impl std::fmt::Display for DigestLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}-{}", self.segments, self.bytes, self.chain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lines_and_bytes_agree() {
        let lines = [
            "{\"user_name\":\"u\"}",
            "{\"mes\":\"你好\"}",
            "{\"mes\":\"b\"}",
        ];
        let bytes = lines.join("\n");
        assert_eq!(
            ChatDigest::of_lines(lines),
            ChatDigest::of_bytes(bytes.as_bytes())
        );
        assert_eq!(
            ChatDigest::of_bytes(bytes.as_bytes()).bytes(),
            bytes.len() as u64
        );
        assert_eq!(ChatDigest::of_bytes(bytes.as_bytes()).segments(), 3);
    }

    #[test]
    fn distinguishes_what_a_line_store_cannot_hold() {
        let plain = ChatDigest::of_bytes(b"{}\n{}");
        assert_ne!(plain, ChatDigest::of_bytes(b"{}\n{}\n"));
        assert_ne!(plain, ChatDigest::of_bytes(b"{}\r\n{}"));
        assert_ne!(plain, ChatDigest::of_bytes(b"{}\n\n{}"));
        assert_eq!(ChatDigest::of_bytes(b""), ChatDigest::empty());
        assert_ne!(ChatDigest::of_bytes(b"\n"), ChatDigest::empty());
    }

    #[test]
    fn an_append_that_continues_the_last_line_is_refused() {
        let mut d = ChatDigest::of_bytes(b"{}\n{\"a\"");
        let before = d;
        assert!(!d.append(b":1}"));
        assert_eq!(d, before);
        assert!(d.append(b""));
        assert_eq!(d, before);
    }

    #[test]
    fn labels_round_trip_and_reject_other_text() {
        let d = ChatDigest::of_bytes(b"{}\n{}");
        let label = DigestLabel::parse(&d.label()).unwrap();
        assert!(label.names(&d));
        assert!(!label.names(&ChatDigest::of_bytes(b"{}")));
        assert!(label.matches_chain(&d.chain()));
        assert!(!label.matches_chain(&ChatDigest::of_bytes(b"{}").chain()));
        assert_eq!(
            ChatDigest::from_parts(d.chain(), d.segments(), d.bytes()),
            d
        );
        assert_eq!(label.to_string(), d.label());
        for bad in [
            "",
            "1-2",
            "1-2-xyz",
            "a-2-00000000000000000000000000000000",
            "1-2-3-4",
        ] {
            assert_eq!(DigestLabel::parse(bad), None, "{bad}");
        }
    }

    proptest! {
        /// Any split of any content into a prefix and an appended rest gives the digest of the
        /// whole, whenever the rest starts a new segment (and is refused otherwise).
        #[test]
        fn appending_equals_digesting_the_whole(
            content in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'a'), Just(b'\r'), any::<u8>()], 0..64),
            cut in 0usize..64,
        ) {
            let cut = cut.min(content.len());
            let (prefix, rest) = content.split_at(cut);
            let whole = ChatDigest::of_bytes(&content);
            let mut d = ChatDigest::of_bytes(prefix);
            let starts = rest.is_empty() || prefix.is_empty() || rest[0] == b'\n';
            prop_assert_eq!(d.append(rest), starts);
            if starts {
                prop_assert_eq!(d, whole);
            }
            prop_assert_eq!(whole.bytes(), content.len() as u64);
        }
    }
}
