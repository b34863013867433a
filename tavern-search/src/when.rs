//! Temporal anchoring: the span of time a query points at relative to now — "four weeks ago",
//! "5 days ago", "last Friday", "this month", "三天前", "上个月". A search that knows when each
//! document was written favours those written then ([`TimeWindow::contains`]); a query without
//! such words has no window and ranks as before. Absolute dates ("in May 2023") are left to
//! the words themselves: the history and memory indexes already hold each document's day as
//! words.
//!
//! Deterministic and bounded: only the first [`MAX_QUERY_CHARS`] characters are read, and the
//! first expression found wins.

use tavern_core::tokens::is_cjk;

/// Characters of a query read for a time expression.
pub const MAX_QUERY_CHARS: usize = 500;

/// How much a query's time expression lifts what was written in the span it names; the rest
/// keep their scores. Strong on purpose: someone who says "five days ago" means then, and a
/// document from elsewhere still wins when it matches the words three times better.
pub const TIME_BOOST: f32 = 3.0;

const MINUTE: i64 = 60_000;
const DAY: i64 = 1_440 * MINUTE;

/// A span of epoch milliseconds, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindow {
    /// The earliest instant in the window.
    pub from: i64,
    /// The latest instant in the window.
    pub to: i64,
}

impl TimeWindow {
    /// Whether `at` (epoch milliseconds) falls in the window.
    pub fn contains(&self, at: i64) -> bool {
        (self.from..=self.to).contains(&at)
    }

    fn around(center: i64, slack: i64) -> Self {
        Self {
            from: center.saturating_sub(slack),
            to: center.saturating_add(slack),
        }
    }

    fn back(now: i64, span: i64) -> Self {
        Self {
            from: now.saturating_sub(span),
            to: now,
        }
    }
}

/// A unit of time and its length in days.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    fn days(self) -> i64 {
        match self {
            Self::Day => 1,
            Self::Week => 7,
            Self::Month => 30,
            Self::Year => 365,
        }
    }

    /// How far either side of "N units ago" still counts: a day for days, half a unit
    /// otherwise (people round: "four weeks ago" is rarely exactly 28 days).
    fn slack(self) -> i64 {
        match self {
            Self::Day => DAY,
            other => other.days() * DAY / 2,
        }
    }

    fn of_word(word: &str) -> Option<Self> {
        match word.trim_end_matches('s') {
            "day" | "night" => Some(Self::Day),
            "week" | "weekend" => Some(Self::Week),
            "month" => Some(Self::Month),
            "year" => Some(Self::Year),
            _ => None,
        }
    }
}

fn number_word(word: &str) -> Option<i64> {
    const WORDS: [&str; 13] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve",
    ];
    match word {
        "a" | "an" => Some(1),
        "couple" => Some(2),
        "few" | "several" => Some(3),
        _ => word
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .or_else(|| WORDS.iter().position(|w| *w == word).map(|n| n as i64)),
    }
}

const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// Monday = 0 for the day `ms` falls on (UTC).
fn weekday(ms: i64) -> i64 {
    // 1970-01-01 was a Thursday.
    (ms.div_euclid(DAY) + 3).rem_euclid(7)
}

/// The window an English or Chinese time expression in `query` points at, relative to `now`
/// (epoch milliseconds); `None` when there is none.
pub fn time_window(query: &str, now: i64) -> Option<TimeWindow> {
    let query: String = query.chars().take(MAX_QUERY_CHARS).collect();
    english(&query, now).or_else(|| chinese(&query, now))
}

fn english(query: &str, now: i64) -> Option<TimeWindow> {
    let lower = query.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    for (i, word) in words.iter().enumerate() {
        let next = |k: usize| words.get(i + k).copied().unwrap_or("");
        match *word {
            // "<n> <unit>s ago", "a couple of weeks ago"
            "ago" if i >= 2 => {
                let Some(unit) = Unit::of_word(words[i - 1]) else {
                    continue;
                };
                let count = match words[i - 2] {
                    "of" => i.checked_sub(3).and_then(|j| number_word(words[j])),
                    other => number_word(other),
                };
                if let Some(n) = count {
                    let center = now.saturating_sub(n.saturating_mul(unit.days() * DAY));
                    return Some(TimeWindow::around(center, unit.slack()));
                }
            }
            "yesterday" => return Some(TimeWindow::around(now.saturating_sub(DAY), DAY)),
            "today" | "tonight" => return Some(TimeWindow::back(now, DAY)),
            // "last week", "last Friday", "last 3 months", "past few weeks"
            "last" | "past" => {
                if let Some(unit) = Unit::of_word(next(1)) {
                    if *word == "past" {
                        return Some(TimeWindow::back(now, unit.days() * DAY));
                    }
                    let center = now.saturating_sub(unit.days() * DAY);
                    return Some(TimeWindow::around(center, unit.slack()));
                }
                if let Some(day) = WEEKDAYS.iter().position(|d| *d == next(1)) {
                    // The most recent such day before today.
                    let back = (weekday(now) - day as i64 - 1).rem_euclid(7) + 1;
                    return Some(TimeWindow::around(now.saturating_sub(back * DAY), DAY));
                }
                let (n, unit_at) = match (number_word(next(1)), next(1)) {
                    (Some(n), _) => (n, 2),
                    (None, "couple") => (2, 3),
                    _ => continue,
                };
                if let Some(unit) = Unit::of_word(next(unit_at)) {
                    return Some(TimeWindow::back(now, n.saturating_mul(unit.days() * DAY)));
                }
            }
            "this" => {
                if let Some(unit) = Unit::of_word(next(1)) {
                    return Some(TimeWindow::back(now, unit.days() * DAY));
                }
            }
            _ => {}
        }
    }
    None
}

/// `一`–`十`, `两`, and digits before a Chinese unit.
fn chinese_number(chars: &[char]) -> Option<i64> {
    let digits: String = chars.iter().take_while(|c| c.is_ascii_digit()).collect();
    if !digits.is_empty() {
        return digits.parse().ok().filter(|n| (1..=1000).contains(n));
    }
    let value = |c: char| "一二三四五六七八九".find(c).map(|i| (i / 3) as i64 + 1);
    match chars {
        ['十', rest @ ..] => Some(10 + rest.first().and_then(|c| value(*c)).unwrap_or(0)),
        [c, '十', rest @ ..] => {
            Some(value(*c)? * 10 + rest.first().and_then(|c| value(*c)).unwrap_or(0))
        }
        ['两', ..] => Some(2),
        ['几', ..] => Some(3),
        [c, ..] => value(*c),
        [] => None,
    }
}

fn chinese(query: &str, now: i64) -> Option<TimeWindow> {
    if !query.chars().any(is_cjk) {
        return None;
    }
    const FIXED: [(&str, i64, i64); 10] = [
        ("前天", -2, 1),
        ("昨天", -1, 1),
        ("今天", 0, 1),
        ("上周", -7, 4),
        ("上个星期", -7, 4),
        ("上个月", -30, 15),
        ("去年", -365, 183),
        ("本周", 0, 7),
        ("这周", 0, 7),
        ("本月", 0, 30),
    ];
    for (word, offset, slack) in FIXED {
        if query.contains(word) {
            return Some(if offset == 0 {
                TimeWindow::back(now, slack * DAY)
            } else {
                TimeWindow::around(now.saturating_add(offset * DAY), slack * DAY)
            });
        }
    }
    // "<n>天前", "<n>周前", "<n>个星期前", "<n>个月前", "<n>年前"
    let chars: Vec<char> = query.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if *c != '前' || i == 0 {
            continue;
        }
        let before = &chars[..i];
        let (unit, len) = match before {
            [.., '个', '星', '期'] => (Unit::Week, 3),
            [.., '个', '月'] => (Unit::Month, 2),
            [.., '天'] => (Unit::Day, 1),
            [.., '周'] => (Unit::Week, 1),
            [.., '年'] => (Unit::Year, 1),
            _ => continue,
        };
        let head = &before[..before.len() - len];
        // The number is the run of digits or numerals right before the unit.
        let start = head
            .iter()
            .rposition(|c| !(c.is_ascii_digit() || "一二三四五六七八九十两几".contains(*c)))
            .map_or(0, |p| p + 1);
        let n = chinese_number(&head[start..])?;
        let center = now.saturating_sub(n.saturating_mul(unit.days() * DAY));
        return Some(TimeWindow::around(center, unit.slack()));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tavern_core::calendar::days_from_civil;

    /// 2023-03-28 (a Tuesday) 20:35 UTC.
    fn now() -> i64 {
        (days_from_civil(2023, 3, 28) * 1440 + 20 * 60 + 35) * MINUTE
    }

    fn day(y: i64, m: u32, d: u32) -> i64 {
        days_from_civil(y, m, d) * DAY + 12 * 60 * MINUTE
    }

    #[test]
    fn english_expressions_point_where_people_mean() {
        let w = |q: &str| time_window(q, now());
        let four_weeks = w("What milestone did I mention four weeks ago?").unwrap();
        assert!(four_weeks.contains(day(2023, 2, 28)) && !four_weeks.contains(day(2023, 3, 20)));
        let five_days = w("What did I do 5 days ago?").unwrap();
        assert!(five_days.contains(day(2023, 3, 23)) && !five_days.contains(day(2023, 3, 20)));
        assert!(w("a couple of weeks ago")
            .unwrap()
            .contains(day(2023, 3, 14)));
        // The Friday before Tuesday the 28th is the 24th.
        let friday = w("the artist I started to listen to last Friday").unwrap();
        assert!(friday.contains(day(2023, 3, 24)) && !friday.contains(day(2023, 3, 17)));
        let month = w("What certification did I complete last month?").unwrap();
        assert!(month.contains(day(2023, 2, 27)) && !month.contains(day(2023, 3, 27)));
        let past = w("trips in the past three months").unwrap();
        assert!(past.contains(day(2023, 1, 5)) && past.contains(day(2023, 3, 27)));
        assert!(!past.contains(day(2022, 12, 1)));
        assert!(w("How much did I make this month?")
            .unwrap()
            .contains(day(2023, 3, 1)));
        assert!(w("yesterday").unwrap().contains(day(2023, 3, 27)));
        for none in [
            "How many weeks ago did I go?",
            "What did I buy in May?",
            "the last one",
            "",
        ] {
            assert_eq!(w(none), None, "{none}");
        }
    }

    #[test]
    fn chinese_expressions_too() {
        let w = |q: &str| time_window(q, now());
        assert!(w("我三天前说了什么？").unwrap().contains(day(2023, 3, 25)));
        assert!(w("两个星期前去了哪里").unwrap().contains(day(2023, 3, 14)));
        assert!(w("十二天前").unwrap().contains(day(2023, 3, 16)));
        assert!(w("上个月买的书").unwrap().contains(day(2023, 2, 26)));
        assert!(w("昨天").unwrap().contains(day(2023, 3, 27)));
        assert_eq!(w("从前有座山"), None);
    }

    #[test]
    fn long_or_odd_queries_are_bounded_and_never_panic() {
        let long = "ago ".repeat(10_000) + "5 days ago";
        assert_eq!(
            time_window(&long, now()),
            None,
            "only the first 500 characters are read"
        );
        for q in [
            "ago",
            "last",
            "9999999999999999999 days ago",
            "前",
            "个月前",
            "十前",
        ] {
            let _ = time_window(q, now());
        }
        assert!(time_window("1000 years ago", i64::MIN).is_some());
    }
}
