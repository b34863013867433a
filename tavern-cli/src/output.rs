//! The output layer: the only code that prints. Reports go to stdout (text, or one JSON
//! document with `--json`), warnings and errors to stderr as one line each. Also the pure
//! formatting helpers commands use to build their text (tables, times, sources).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;

use tavern_core::{MemorySource, SourceKind, Timestamp};
use unicode_width::UnicodeWidthStr;

use crate::{exit, CliError, Report};

/// Prints a report; returns its exit code.
pub fn print_report(report: &Report, json: bool) -> u8 {
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    let mut out = std::io::stdout().lock();
    let written = if json {
        serde_json::to_string_pretty(&report.json)
            .map_err(std::io::Error::other)
            .and_then(|s| writeln!(out, "{s}"))
    } else if report.text.is_empty() {
        Ok(())
    } else if report.text.ends_with('\n') {
        write!(out, "{}", report.text)
    } else {
        writeln!(out, "{}", report.text)
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => report.exit,
        // A closed pipe (`tavern memory ls | head`) is not an error worth a message.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => report.exit,
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            exit::FAILURE
        }
    }
}

/// Tells the user something while a command still runs (where a server listens): one line
/// on stderr, so stdout keeps only the report.
pub fn announce(line: &str) {
    eprintln!("{line}");
}

/// Prints an error as one line (with what to do about it, when there is a hint); returns its
/// exit code.
pub fn print_error(err: &CliError) -> u8 {
    let mut line = one_line(&err.to_string());
    if let Some(hint) = err.hint() {
        line = format!("{line}; {hint}");
    }
    eprintln!("error: {line}");
    err.exit_code()
}

/// Prints a command-line error: help and version as clap shows them, anything else as one
/// line (exit 2).
pub fn print_clap_error(err: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            u8::try_from(err.exit_code()).unwrap_or(exit::USAGE)
        }
        _ => {
            let text = err.render().to_string();
            let line = text
                .lines()
                .map(str::trim)
                .filter(|l| {
                    !l.is_empty()
                        && !l.starts_with("Usage:")
                        && !l.starts_with("For more information")
                        && !l.starts_with("tip:")
                })
                .collect::<Vec<_>>()
                .join(" ");
            let line = line.strip_prefix("error: ").unwrap_or(&line);
            eprintln!("error: {line}");
            exit::USAGE
        }
    }
}

/// Text on one line: line breaks become spaces.
pub fn one_line(text: &str) -> String {
    text.split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` on one line in at most `max` terminal columns (a Chinese character takes two), `…`
/// when cut. Control characters (a tab, an escape) become spaces: a terminal would act on them.
pub fn excerpt(text: &str, max: usize) -> String {
    let flat: String = one_line(text)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.width() <= max {
        return flat;
    }
    // Room for the `…` (one column). Measured as the terminal measures the whole prefix, not
    // character by character: an emoji with its presentation selector (`❤️`) takes two columns
    // though its characters count one and none.
    let room = max.saturating_sub(1);
    let mut cut = String::new();
    let mut fits = 0;
    for c in flat.chars() {
        cut.push(c);
        if cut.width() > room {
            break;
        }
        fits = cut.len();
    }
    cut.truncate(fits);
    // A joiner left at the end would join the `…` to the emoji before it.
    while cut.ends_with('\u{200d}') {
        cut.pop();
    }
    cut.push('…');
    cut
}

/// A plain-text table: a header row, then rows, columns padded to their widest cell — widths
/// as a terminal shows them (a Chinese character takes two columns), so names and excerpts in
/// Chinese line up.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.width()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.width());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut s = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            s.push_str(cell);
            if i + 1 < n {
                let pad = widths[i].saturating_sub(cell.width()) + 2;
                s.extend(std::iter::repeat_n(' ', pad));
            }
        }
        s.truncate(s.trim_end().len());
        s
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// A time as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn time(t: Timestamp) -> String {
    let secs = t.0.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = tavern_core::calendar::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Where a write came from, in a few words: `tool call C (session S, turn T)`, `user`, …
pub fn source(s: &MemorySource) -> String {
    let kind = match s.kind {
        SourceKind::Tool => "tool",
        SourceKind::User => "user",
        SourceKind::Import => "import",
        SourceKind::System => "system",
    };
    let mut out = match &s.tool_call_id {
        Some(call) => format!("{kind} call {call}"),
        None => kind.to_owned(),
    };
    let mut detail = Vec::new();
    if let Some(session) = &s.session {
        detail.push(format!("session {session}"));
    }
    if let Some(turn) = s.turn {
        detail.push(format!("turn {turn}"));
    }
    if let Some(m) = &s.message_id {
        detail.push(format!("message {m}"));
    }
    if !detail.is_empty() {
        out.push_str(&format!(" ({})", detail.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(time(Timestamp(0)), "1970-01-01 00:00:00");
        assert_eq!(time(Timestamp(1_700_000_000_123)), "2023-11-14 22:13:20");
    }

    #[test]
    fn tables_pad_columns_and_excerpts_cut_on_terminal_columns() {
        let t = table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    BB\nxyz  1\n");
        // Chinese takes two columns a character: the next column starts where the terminal
        // shows the longest cell end.
        let t = table(
            &["NAME", "TEXT"],
            &[
                vec!["白羽".into(), "a".into()],
                vec!["Kai".into(), "b".into()],
                vec!["七大姑".into(), "c".into()],
            ],
        );
        assert_eq!(t, "NAME    TEXT\n白羽    a\nKai     b\n七大姑  c\n");
        // Cut to columns: two a Chinese character, one the `…`.
        assert_eq!(excerpt("银色大门\n很远", 7), "银色大…");
        assert_eq!(excerpt("银色大门\n很远", 6), "银色…");
        assert_eq!(excerpt("银色大门", 8), "银色大门");
        assert_eq!(excerpt("short", 10), "short");
        assert_eq!(excerpt("a longer line", 5), "a lo…");
        // Emoji with a presentation selector take two columns each, as the terminal shows them.
        let hearts = excerpt("❤️❤️❤️❤️❤️❤️", 5);
        assert!(hearts.width() <= 5, "{hearts}: {}", hearts.width());
        assert_eq!(hearts, "❤️❤️…");
        // Tabs and escapes become spaces and count as one column each.
        assert_eq!(excerpt("a\tb\u{1b}[2Jc", 20), "a b [2Jc");
        assert_eq!(excerpt("a\t\t\t\t\t\t\tb", 5), "a   …");
        // A joined emoji is never left with its joiner before the `…`.
        let family = excerpt("ab👨\u{200d}👩\u{200d}👧 and more", 5);
        assert!(
            family.width() <= 5 && !family.contains("\u{200d}…"),
            "{family:?}"
        );
    }
}
