//! SillyTavern's text macros, substituted as SillyTavern substitutes them before a model sees
//! card text, a greeting, lore or a persona (its `substituteParams`): `{{char}}`, `{{user}}`,
//! `{{persona}}`, `{{description}}`, `{{scenario}}`, `{{personality}}`, `{{time}}`,
//! `{{date}}`, `{{weekday}}`, `{{idle_duration}}`, `{{random::a::b}}` (or `{{random:a,b}}`),
//! `{{pick::a::b}}` (the same choice every time in one chat), `{{// comments}}` (removed), and
//! the legacy `<USER>`, `<BOT>`, `<CHAR>`. Names match in any case; a macro this does not know
//! is left as written. The text is data: nothing in it is ever run.
//!
//! Work is bounded: `{{description}}` inside the description is expanded once, not forever, and
//! the result is at most [`MAX_GROWTH`] bytes longer than the text (past that, the rest is left
//! as written).

use sha2::{Digest, Sha256};

use crate::calendar::{civil_from_days, MONTHS};
use crate::Timestamp;

/// The most bytes substitution may add to a text.
pub const MAX_GROWTH: usize = 256 * 1024;

/// What macros stand for in one place.
#[derive(Debug, Clone)]
pub struct MacroContext<'a> {
    /// The character's name (`{{char}}`, `<BOT>`, `<CHAR>`).
    pub character: &'a str,
    /// The persona's name (`{{user}}`, `<USER>`).
    pub user: &'a str,
    /// The persona's description (`{{persona}}`).
    pub persona: &'a str,
    /// The card's description, scenario and personality.
    pub description: &'a str,
    /// `{{scenario}}`.
    pub scenario: &'a str,
    /// `{{personality}}`.
    pub personality: &'a str,
    /// The time `{{time}}`, `{{date}}` and `{{weekday}}` show.
    pub now: Timestamp,
    /// The user's offset from UTC in minutes (SillyTavern shows the browser's local time).
    pub utc_offset_minutes: i32,
    /// When the user last wrote (`{{idle_duration}}`); `None`: "just now".
    pub last_user_message: Option<Timestamp>,
    /// What `{{pick}}` is stable within (the chat's id).
    pub chat: &'a str,
    /// What `{{random}}` draws from: the same seed gives the same choices.
    pub seed: u64,
}

/// The head of a macro's value worth keeping: a longer value could never be substituted in
/// full (a text grows by at most [`MAX_GROWTH`]), so a caller that copies values (a 30 MiB card
/// description, per search) need not copy more. Cut at a character boundary.
pub fn value_head(value: &str) -> &str {
    const KEEP: usize = MAX_GROWTH + 64 * 1024;
    if value.len() <= KEEP {
        return value;
    }
    let mut end = KEEP;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

/// `text` with its macros substituted, borrowed when it has none (no `{` or `<`): a caller
/// going over many texts copies only those that change.
pub fn substitute_cow<'t>(text: &'t str, ctx: &MacroContext<'_>) -> std::borrow::Cow<'t, str> {
    if text.contains(['{', '<']) {
        std::borrow::Cow::Owned(substitute(text, ctx))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// `text` with its macros substituted.
pub fn substitute(text: &str, ctx: &MacroContext<'_>) -> String {
    let mut budget = MAX_GROWTH;
    expand(text, ctx, 0, &mut budget)
}

/// How deep `{{description}}`-like macros expand (their values may hold macros too).
const MAX_DEPTH: usize = 2;

fn expand(text: &str, ctx: &MacroContext<'_>, depth: usize, budget: &mut usize) -> String {
    if !text.contains(['{', '<']) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut offset = 0usize;
    while !rest.is_empty() {
        if rest.starts_with("{{") {
            if let Some(end) = rest[2..].find("}}") {
                let body = &rest[2..2 + end];
                let whole = &rest[..end + 4];
                let value = macro_value(body, ctx, depth, offset, budget);
                match value {
                    Some(v) if v.len() <= whole.len() + *budget => {
                        *budget = (*budget + whole.len()).saturating_sub(v.len());
                        out.push_str(&v);
                    }
                    _ => out.push_str(whole),
                }
                offset += whole.len();
                rest = &rest[whole.len()..];
                continue;
            }
        }
        if rest.starts_with('<') {
            let legacy: [(&str, &str); 3] = [
                ("<user>", ctx.user),
                ("<bot>", ctx.character),
                ("<char>", ctx.character),
            ];
            if let Some((tag, name)) = legacy.iter().find(|(tag, _)| {
                rest.len() >= tag.len()
                    && rest.is_char_boundary(tag.len())
                    && rest[..tag.len()].eq_ignore_ascii_case(tag)
            }) {
                if name.len() <= tag.len() + *budget {
                    *budget = (*budget + tag.len()).saturating_sub(name.len());
                    out.push_str(name);
                } else {
                    out.push_str(&rest[..tag.len()]);
                }
                offset += tag.len();
                rest = &rest[tag.len()..];
                continue;
            }
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        offset += c.len_utf8();
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// What one macro (`body` between the braces, found at byte `offset`) becomes; `None`: left
/// as written.
fn macro_value(
    body: &str,
    ctx: &MacroContext<'_>,
    depth: usize,
    offset: usize,
    budget: &mut usize,
) -> Option<String> {
    let trimmed = body.trim();
    if trimmed.starts_with("//") {
        return Some(String::new());
    }
    let lower = trimmed.to_lowercase();
    let nested = |value: &str, budget: &mut usize| {
        if depth < MAX_DEPTH {
            expand(value, ctx, depth + 1, budget)
        } else {
            value.to_owned()
        }
    };
    match lower.as_str() {
        "char" => return Some(ctx.character.to_owned()),
        "user" => return Some(ctx.user.to_owned()),
        "persona" => return Some(nested(ctx.persona, budget)),
        "description" => return Some(nested(ctx.description, budget)),
        "scenario" => return Some(nested(ctx.scenario, budget)),
        "personality" => return Some(nested(ctx.personality, budget)),
        "time" => return Some(time_of_day(local(ctx))),
        "date" => return Some(date(local(ctx))),
        "weekday" => return Some(weekday(local(ctx))),
        // SillyTavern says "just now" when the chat has no earlier user message.
        "idle_duration" => {
            return Some(ctx.last_user_message.map_or_else(
                || "just now".to_owned(),
                |t| humanize(ctx.now.0.saturating_sub(t.0)),
            ));
        }
        _ => {}
    }
    for (name, stable) in [("random", false), ("pick", true)] {
        let Some(args) = lower
            .strip_prefix(name)
            .and_then(|_| options(&trimmed[name.len()..]))
        else {
            continue;
        };
        if args.is_empty() {
            return Some(String::new());
        }
        let mut h = Sha256::new();
        if stable {
            h.update(ctx.chat.as_bytes());
        } else {
            h.update(ctx.seed.to_le_bytes());
        }
        h.update(offset.to_le_bytes());
        h.update(trimmed.as_bytes());
        let d = h.finalize();
        let n = u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
        let i = usize::try_from(n % args.len() as u64).unwrap_or(0);
        return Some(args[i].to_owned());
    }
    None
}

/// The options of `::a::b` or `:a,b` (SillyTavern's two spellings); `None` if neither.
fn options(rest: &str) -> Option<Vec<&str>> {
    if let Some(list) = rest.strip_prefix("::") {
        Some(list.split("::").collect())
    } else {
        rest.strip_prefix(':')
            .map(|list| list.split(',').map(str::trim).collect())
    }
}

/// Milliseconds since the epoch in the user's local time.
fn local(ctx: &MacroContext<'_>) -> i64 {
    ctx.now.0 + i64::from(ctx.utc_offset_minutes) * 60_000
}

/// `3:05 PM` (moment's `LT` in English).
fn time_of_day(ms: i64) -> String {
    let minutes = ms.div_euclid(60_000).rem_euclid(24 * 60);
    let (h, m) = (minutes / 60, minutes % 60);
    let h12 = if h % 12 == 0 { 12 } else { h % 12 };
    format!("{h12}:{m:02} {}", if h < 12 { "AM" } else { "PM" })
}

/// `December 3, 2026` (moment's `LL` in English).
fn date(ms: i64) -> String {
    let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
    let month = MONTHS[(m as usize).saturating_sub(1).min(11)];
    format!("{month} {d}, {y}")
}

/// `Thursday`.
fn weekday(ms: i64) -> String {
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = ms.div_euclid(86_400_000);
    DAYS[usize::try_from(days.rem_euclid(7)).unwrap_or(0)].to_owned()
}

/// A duration as moment's `humanize()` says it (`a few seconds`, `5 minutes`, `an hour`…).
fn humanize(ms: i64) -> String {
    let s = ms / 1000;
    let (m, h, d) = (s as f64 / 60.0, s as f64 / 3600.0, s as f64 / 86400.0);
    let round = |x: f64| x.round() as i64;
    match s {
        _ if s < 45 => "a few seconds".into(),
        _ if s < 90 => "a minute".into(),
        _ if m < 45.0 => format!("{} minutes", round(m)),
        _ if m < 90.0 => "an hour".into(),
        _ if h < 22.0 => format!("{} hours", round(h)),
        _ if h < 36.0 => "a day".into(),
        _ if d < 26.0 => format!("{} days", round(d)),
        _ if d < 45.0 => "a month".into(),
        _ if d < 320.0 => format!("{} months", round(d / 30.4)),
        _ if d < 548.0 => "a year".into(),
        _ => format!("{} years", round(d / 365.25)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> MacroContext<'static> {
        MacroContext {
            character: "Seraphina",
            user: "白羽",
            persona: "A traveler; {{char}} calls them friend.",
            description: "{{char}} guards the glade. {{description}}",
            scenario: "{{user}} wakes in the glade.",
            personality: "gentle",
            // 2026-12-03 15:05 UTC, a Thursday.
            now: Timestamp(1_796_310_300_000),
            utc_offset_minutes: 0,
            last_user_message: Some(Timestamp(1_796_310_000_000)),
            chat: "Seraphina - 1",
            seed: 7,
        }
    }

    /// `(text, substituted)`: SillyTavern's macros in any case, unknown ones left alone.
    #[test]
    fn sillytavern_macros_are_substituted() {
        let cases: &[(&str, &str)] = &[
            ("{{char}} and {{user}}", "Seraphina and 白羽"),
            ("{{CHAR}}, {{User}}", "Seraphina, 白羽"),
            ("<USER> <bot> <Char>", "白羽 Seraphina Seraphina"),
            ("{{persona}}", "A traveler; Seraphina calls them friend."),
            ("{{scenario}}", "白羽 wakes in the glade."),
            ("{{personality}}", "gentle"),
            (
                "at {{time}} on {{weekday}}, {{date}}",
                "at 3:05 PM on Thursday, December 3, 2026",
            ),
            ("idle {{idle_duration}}", "idle 5 minutes"),
            ("a{{// a note for the card's author}}b", "ab"),
            ("{{unknown}} {{ char}", "{{unknown}} {{ char}"),
            ("{{random::}}", ""),
            ("森林{{user}}", "森林白羽"),
            ("{{", "{{"),
            ("}}{{char", "}}{{char"),
        ];
        for (text, want) in cases {
            assert_eq!(substitute(text, &ctx()), *want, "{text:?}");
        }
    }

    #[test]
    fn a_description_that_names_itself_expands_a_bounded_number_of_times() {
        let out = substitute("{{description}}", &ctx());
        assert!(
            out.starts_with("Seraphina guards the glade. Seraphina guards the glade."),
            "{out}"
        );
        assert!(out.len() < 200, "{out}");
        // Many copies of a long value stop at the growth bound.
        let long = "x".repeat(100_000);
        let c = MacroContext {
            personality: &long,
            ..ctx()
        };
        let out = substitute(&"{{personality}}".repeat(10), &c);
        assert!(out.len() <= 10 * 15 + MAX_GROWTH, "{}", out.len());
        assert!(
            out.contains("{{personality}}"),
            "the rest is left as written"
        );
    }

    #[test]
    fn pick_is_stable_per_chat_and_random_follows_its_seed() {
        let text = "{{pick::red::green::blue}} {{pick:1,2,3,4,5,6,7,8}}";
        let a = substitute(text, &ctx());
        assert_eq!(a, substitute(text, &ctx()), "the same chat picks the same");
        let options: Vec<String> = (0..40)
            .map(|i| {
                let chat = format!("chat {i}");
                substitute(
                    "{{pick::red::green::blue}}",
                    &MacroContext {
                        chat: &chat,
                        ..ctx()
                    },
                )
            })
            .collect();
        assert!(options
            .iter()
            .all(|o| ["red", "green", "blue"].contains(&o.as_str())));
        assert!(
            options.iter().any(|o| o != &options[0]),
            "other chats pick otherwise"
        );
        let draws: Vec<String> = (0..40)
            .map(|seed| substitute("{{random::a::b::c}}", &MacroContext { seed, ..ctx() }))
            .collect();
        assert!(draws.iter().all(|o| ["a", "b", "c"].contains(&o.as_str())));
        assert!(draws.iter().any(|o| o != &draws[0]));
    }

    #[test]
    fn local_time_follows_the_offset_and_durations_read_as_moment_says() {
        let c = MacroContext {
            utc_offset_minutes: 8 * 60,
            ..ctx()
        };
        assert_eq!(substitute("{{time}} {{weekday}}", &c), "11:05 PM Thursday");
        for (ms, want) in [
            (10_000, "a few seconds"),
            (60_000, "a minute"),
            (20 * 60_000, "20 minutes"),
            (3_600_000, "an hour"),
            (5 * 3_600_000, "5 hours"),
            (30 * 3_600_000, "a day"),
            (3 * 86_400_000, "3 days"),
        ] {
            assert_eq!(humanize(ms), want, "{ms}");
        }
    }
}
