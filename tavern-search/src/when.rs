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
/// (epoch milliseconds), with calendar days ("yesterday", "last Friday") counted in UTC;
/// `None` when there is none.
pub fn time_window(query: &str, now: i64) -> Option<TimeWindow> {
    time_window_in(query, now, 0)
}

/// [`time_window`] with calendar days counted `offset_minutes` east of UTC (the user's zone).
pub fn time_window_in(query: &str, now: i64, offset_minutes: i32) -> Option<TimeWindow> {
    let query: String = query.chars().take(MAX_QUERY_CHARS).collect();
    let day = Days {
        now,
        offset: i64::from(offset_minutes).saturating_mul(MINUTE),
    };
    english(&query, day).or_else(|| chinese(&query, day))
}

/// Now, and how to find the calendar days around it in the user's zone.
#[derive(Clone, Copy)]
struct Days {
    now: i64,
    /// Milliseconds east of UTC.
    offset: i64,
}

impl Days {
    /// The whole calendar day `back` days before today (0: today up to now).
    fn day(self, back: i64) -> TimeWindow {
        let local = self.now.saturating_add(self.offset);
        let today = local
            .div_euclid(DAY)
            .saturating_mul(DAY)
            .saturating_sub(self.offset);
        if back == 0 {
            return TimeWindow {
                from: today,
                to: self.now,
            };
        }
        let from = today.saturating_sub(back.saturating_mul(DAY));
        TimeWindow {
            from,
            to: from.saturating_add(DAY - 1),
        }
    }

    /// Monday = 0 for today in the user's zone.
    fn weekday(self) -> i64 {
        weekday(self.now.saturating_add(self.offset))
    }
}

/// Words before "last" that make it a verb ("will it last two days"). Not "to": "listen to
/// last Friday's show" is the common case.
const VERB_BEFORE_LAST: [&str; 13] = [
    "will", "would", "can", "could", "should", "might", "may", "must", "does", "do", "did", "it",
    "they",
];

fn english(query: &str, days: Days) -> Option<TimeWindow> {
    let now = days.now;
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
            "yesterday" => return Some(days.day(1)),
            "today" | "tonight" => return Some(days.day(0)),
            // "last week", "last Friday", "last 3 months", "past few weeks" — not "the last
            // day of the trip", not "will it last two days", not "the past years".
            "last" | "past" => {
                let before = i.checked_sub(1).map_or("", |j| words[j]);
                if *word == "last" && VERB_BEFORE_LAST.contains(&before) {
                    continue;
                }
                if let Some(unit) = Unit::of_word(next(1)) {
                    if next(2) == "of" || next(1).ends_with('s') {
                        continue;
                    }
                    if *word == "past" {
                        return Some(TimeWindow::back(now, unit.days() * DAY));
                    }
                    let center = now.saturating_sub(unit.days() * DAY);
                    return Some(TimeWindow::around(center, unit.slack()));
                }
                if let Some(day) = WEEKDAYS.iter().position(|d| *d == next(1)) {
                    // The most recent such day before today.
                    let back = (days.weekday() - day as i64 - 1).rem_euclid(7) + 1;
                    return Some(days.day(back));
                }
                // A count after "last" needs "the" before it ("in the last two days"; "the
                // battery will last two days" is the verb).
                let Some(n) = number_word(next(1)) else {
                    continue;
                };
                if *word == "last" && !matches!(before, "the" | "these") {
                    continue;
                }
                // "last 3 months", "past couple of weeks", "last few days"
                let unit_at = if next(2) == "of" { 3 } else { 2 };
                if let Some(unit) = Unit::of_word(next(unit_at)) {
                    return Some(TimeWindow::back(now, n.saturating_mul(unit.days() * DAY)));
                }
            }
            // "this week", "this month", "this year" (not "to this day")
            "this" => {
                if let Some(unit) = Unit::of_word(next(1)).filter(|u| !matches!(u, Unit::Day)) {
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

/// A fixed Chinese time word: the word, days back (0: a span up to now), the slack or span in
/// days, and the characters that, right before or after it, make it part of another word
/// (`之前天天`, `马上周末`, `日本周边`, `过去年轻`).
type Fixed = (&'static str, i64, i64, &'static str, &'static str);

const FIXED: [Fixed; 10] = [
    ("前天", 2, 0, "之以目眼提从先事", ""),
    ("昨天", 1, 0, "", ""),
    ("今天", 0, 0, "", ""),
    ("上周", 7, 4, "马", "边围"),
    ("上个星期", 7, 4, "", ""),
    ("上个月", 30, 15, "", ""),
    ("去年", 365, 183, "过失", "轻纪"),
    ("本周", 0, 7, "日", "边围"),
    ("这周", 0, 7, "", "边围"),
    ("本月", 0, 30, "日", ""),
];

fn chinese(query: &str, days: Days) -> Option<TimeWindow> {
    if !query.chars().any(is_cjk) {
        return None;
    }
    let chars: Vec<char> = query.chars().collect();
    // "<n>天前" first: in `五天前天气` the number names the day, not `前天`.
    if let Some(window) = chinese_ago(&chars, days.now) {
        return Some(window);
    }
    for (word, back, slack, bad_before, bad_after) in FIXED {
        let word: Vec<char> = word.chars().collect();
        let found = chars.windows(word.len()).enumerate().any(|(at, w)| {
            w == word.as_slice()
                && at
                    .checked_sub(1)
                    .is_none_or(|b| !bad_before.contains(chars[b]))
                && chars
                    .get(at + word.len())
                    .is_none_or(|c| !bad_after.contains(*c))
        });
        if found {
            return Some(match (back, slack) {
                (_, 0) => days.day(back),
                (0, span) => TimeWindow::back(days.now, span * DAY),
                (back, slack) => {
                    TimeWindow::around(days.now.saturating_sub(back * DAY), slack * DAY)
                }
            });
        }
    }
    None
}

/// "<n>天前", "<n>周前", "<n>个星期前", "<n>个月前", "<n>年前".
fn chinese_ago(chars: &[char], now: i64) -> Option<TimeWindow> {
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
        let Some(n) = chinese_number(&head[start..]) else {
            continue;
        };
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
        // Yesterday is the calendar day, not the last 48 hours.
        let yesterday = w("yesterday").unwrap();
        assert!(yesterday.contains(day(2023, 3, 27)) && !yesterday.contains(day(2023, 3, 28)));
        assert!(w("the last couple of weeks")
            .unwrap()
            .contains(day(2023, 3, 16)));
        assert!(w("in the past couple of days")
            .unwrap()
            .contains(day(2023, 3, 27)));
        for none in [
            "How many weeks ago did I go?",
            "What did I buy in May?",
            "the last one",
            "What did I do on the last day of my trip?",
            "the last weekend of May",
            "Will the battery last two days?",
            "I have loved it to this day",
            "over the past years",
            "",
        ] {
            assert_eq!(w(none), None, "{none}");
        }
    }

    /// Calendar days are the user's: at UTC+9 on Saturday 08:00 (Friday 23:00 UTC), "last
    /// Friday" is yesterday, and "today" began at local midnight.
    #[test]
    fn days_are_counted_in_the_users_zone() {
        let hour = 60 * MINUTE;
        let saturday_8_local = days_from_civil(2023, 4, 7) * DAY + 23 * hour; // Fri 23:00 UTC
        let friday_noon_local = days_from_civil(2023, 4, 7) * DAY + 3 * hour; // Fri 03:00 UTC
        let friday = time_window_in("last Friday", saturday_8_local, 540).unwrap();
        assert!(friday.contains(friday_noon_local), "{friday:?}");
        assert!(!friday.contains(saturday_8_local));
        let today = time_window_in("today", saturday_8_local, 540).unwrap();
        assert_eq!(today.from, days_from_civil(2023, 4, 7) * DAY + 15 * hour);
        // In UTC it is still Friday: last Friday is a week back.
        let utc = time_window("last Friday", saturday_8_local).unwrap();
        assert!(!utc.contains(friday_noon_local));
    }

    #[test]
    fn chinese_expressions_too() {
        let w = |q: &str| time_window(q, now());
        assert!(w("我三天前说了什么？").unwrap().contains(day(2023, 3, 25)));
        assert!(w("两个星期前去了哪里").unwrap().contains(day(2023, 3, 14)));
        assert!(w("十二天前").unwrap().contains(day(2023, 3, 16)));
        assert!(w("上个月买的书").unwrap().contains(day(2023, 2, 26)));
        assert!(w("昨天").unwrap().contains(day(2023, 3, 27)));
        // The number names the day: five days back, not the day before yesterday.
        assert!(w("五天前天气好吗").unwrap().contains(day(2023, 3, 23)));
        for none in [
            "从前有座山",
            "我之前天天跑步吗",
            "这周围有什么",
            "日本周边的岛",
            "马上周末了",
            "过去年轻的时候",
            "以前提到的书",
        ] {
            assert_eq!(w(none), None, "{none}");
        }
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
