//! Timestamps as epoch milliseconds; the core never reads a clock.

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch (UTC), supplied by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The timestamp as epoch milliseconds.
    pub fn millis(self) -> i64 {
        self.0
    }

    /// This timestamp moved forward by `ms` milliseconds (saturating).
    pub fn plus_millis(self, ms: i64) -> Self {
        Timestamp(self.0.saturating_add(ms))
    }
}

/// The user's offset from UTC at a moment, in minutes: what `{{time}}` and `{{date}}` show and
/// how SillyTavern's send dates written in local time are read. A function of the moment, so
/// daylight saving time comes out right; the core never reads the system's zone itself.
pub trait UtcOffsets: Send + Sync + std::fmt::Debug {
    /// Minutes east of UTC at `at` (UTC+8: 480).
    fn minutes_at(&self, at: Timestamp) -> i32;
}

/// One offset all year round (UTC: 0, the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FixedOffset(pub i32);

impl UtcOffsets for FixedOffset {
    fn minutes_at(&self, _at: Timestamp) -> i32 {
        self.0
    }
}

impl FixedOffset {
    /// Parses `+08:00`, `-05:30`, `+0800`, `+8`, `UTC` or `Z`; `None` for anything else or an
    /// offset beyond ±18 hours.
    pub fn parse(text: &str) -> Option<Self> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("utc") || t.eq_ignore_ascii_case("z") {
            return Some(Self(0));
        }
        let (sign, rest) = match t.as_bytes().first()? {
            b'+' => (1, &t[1..]),
            b'-' => (-1, &t[1..]),
            _ => return None,
        };
        let (h, m) = match rest.split_once(':') {
            Some((h, m)) => (h, m),
            None if rest.len() == 4 => rest.split_at(2),
            None => (rest, "0"),
        };
        if h.is_empty() || h.len() > 2 || m.is_empty() || m.len() > 2 {
            return None;
        }
        let (h, m): (i32, i32) = (h.parse().ok()?, m.parse().ok()?);
        let minutes = h * 60 + m;
        (m < 60 && minutes <= 18 * 60).then_some(Self(sign * minutes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_in_the_forms_people_write_them() {
        for (text, minutes) in [
            ("+08:00", 480),
            ("-05:30", -330),
            ("+0545", 345),
            ("+8", 480),
            ("UTC", 0),
            ("z", 0),
            ("-00:00", 0),
        ] {
            assert_eq!(
                FixedOffset::parse(text),
                Some(FixedOffset(minutes)),
                "{text}"
            );
        }
        for bad in [
            "", "8", "+", "+19:00", "+08:60", "+08:0x", "local", "+123:00",
        ] {
            assert_eq!(FixedOffset::parse(bad), None, "{bad}");
        }
    }
}
