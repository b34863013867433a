//! JavaScript regular expressions — as SillyTavern's world-info keys are written — run on
//! engines whose cost is bounded: the pattern is checked as JavaScript (the `regress` parser,
//! so a key SillyTavern could not compile is refused here too), then translated. A pattern
//! without look-around or back-references (almost every key) runs on the `regex` crate, in
//! time linear in the text whatever the pattern (`/(a|a)*c/` costs what `/ac/` costs); the
//! rest run on `fancy-regex`'s backtracking machine, which gives up after [`BACKTRACK_LIMIT`]
//! steps. A card's key can cost a search time in proportion to the text, never exponential
//! time.
//!
//! The translation keeps the meaning browsers give a key (SillyTavern runs in one) where the
//! syntaxes differ: `\d`, `\w`, `\b` are ASCII (`１２` is not `\d`, `猫cat猫` has `\bcat\b`,
//! `ſ` is not `\w` even under `i`), `.` stops at `\r`, U+2028 and U+2029 as well as `\n`, `\s`
//! is JavaScript's list of spaces, `[` inside a class is a character, `{` that does not start
//! a quantifier is a character, `\uD83D\uDE00` is one code point, `[^]` is any character and
//! `[]` none, Annex B's octal escapes (`\07`, `\1` with no group) are characters, named groups
//! are numbered. What has no bounded equivalent (a lone surrogate, a quantified look-ahead) is
//! refused with the reason. Checked against V8 itself (`tests/data/js_regex_v8_cases.json`,
//! 363 cases): where they still differ is listed in the test, by kind — UTF-16 code units
//! (astral characters outside `u`), Unicode case folding past JavaScript's non-unicode one
//! (`ſ`, the Kelvin sign), `^`/`$` under `m` at `\r` and U+2028, and references to groups
//! that did not take part.

use std::fmt::Write as _;

/// Most backtracking steps one match may take (look-around and back-references only; every
/// other pattern runs in linear time). About a millisecond of work.
pub(crate) const BACKTRACK_LIMIT: usize = 100_000;

/// Most memory a compiled pattern (and its lazy DFA cache) may take, in bytes: a key such as
/// `/a{1000}{1000}/` is refused instead of compiled.
const SIZE_LIMIT: usize = 1 << 20;

/// A compiled key.
#[derive(Debug)]
pub(crate) enum JsRegex {
    /// No look-around or back-reference: linear time.
    Linear(regex::Regex),
    /// Look-around or back-references: backtracking, at most [`BACKTRACK_LIMIT`] steps.
    Backtracking(fancy_regex::Regex),
}

/// A match gave up: the pattern needed more than [`BACKTRACK_LIMIT`] steps on this text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepLimit;

impl JsRegex {
    /// Compiles `/pattern/flags` (flags from `gimsuy`); `Err` says why it cannot be used.
    pub(crate) fn new(pattern: &str, flags: &str) -> Result<Self, String> {
        regress::Regex::with_flags(pattern, regress::Flags::from(flags))
            .map_err(|e| e.to_string())?;
        let translated = translate(pattern, flags)?;
        let refused = |e: &dyn std::fmt::Display| format!("cannot be run within bounds: {e}");
        if needs_backtracking(pattern) {
            fancy_regex::RegexBuilder::new(&translated)
                .backtrack_limit(BACKTRACK_LIMIT)
                .delegate_size_limit(SIZE_LIMIT)
                .delegate_dfa_size_limit(SIZE_LIMIT)
                .build()
                .map(Self::Backtracking)
                .map_err(|e| refused(&e))
        } else {
            regex::RegexBuilder::new(&translated)
                .size_limit(SIZE_LIMIT)
                .dfa_size_limit(SIZE_LIMIT)
                .build()
                .map(Self::Linear)
                .map_err(|e| refused(&e))
        }
    }

    /// Whether checks run on the backtracking machine (each up to [`BACKTRACK_LIMIT`] steps).
    pub(crate) fn backtracks(&self) -> bool {
        matches!(self, Self::Backtracking(_))
    }

    /// The byte offset where the leftmost match starts, if any.
    pub(crate) fn find_start(&self, text: &str) -> Result<Option<usize>, StepLimit> {
        match self {
            Self::Linear(re) => Ok(re.find(text).map(|m| m.start())),
            Self::Backtracking(re) => match re.find(text) {
                Ok(m) => Ok(m.map(|m| m.start())),
                Err(_) => Err(StepLimit),
            },
        }
    }
}

/// The characters JavaScript's `\s` matches.
const JS_SPACE: &str = r"\t\n\x{B}\x{C}\r \x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}\x{FEFF}";
/// JavaScript's `\d` and `\w` (ASCII whatever the flags).
const JS_DIGIT: &str = "0-9";
const JS_WORD: &str = "0-9A-Za-z_";

/// Whether a (valid JavaScript) pattern has look-around or back-references, which only a
/// backtracking engine runs.
fn needs_backtracking(pattern: &str) -> bool {
    let chars: Vec<char> = pattern.chars().collect();
    let (mut i, mut in_class) = (0, false);
    while i < chars.len() {
        match chars[i] {
            '\\' if !in_class => {
                if chars
                    .get(i + 1)
                    .is_some_and(|c| matches!(c, '1'..='9' | 'k'))
                {
                    return true;
                }
                i += 1;
            }
            '\\' => i += 1,
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '(' if !in_class => {
                let rest: String = chars[i + 1..].iter().take(3).collect();
                if ["?=", "?!", "?<=", "?<!"]
                    .iter()
                    .any(|h| rest.starts_with(h))
                {
                    return true;
                }
            }
            _ => {}
        }
        i += 1;
    }
    false
}

/// Translates a JavaScript pattern (already known to be valid JavaScript) to the syntax of
/// the engine that will run it, with the same meaning.
pub(crate) fn translate(pattern: &str, flags: &str) -> Result<String, String> {
    let chars: Vec<char> = pattern.chars().collect();
    if let Some(c) = flags.chars().find(|c| flags.matches(*c).count() > 1) {
        return Err(format!("the flag {c} is given twice"));
    }
    let (groups, names) = capture_groups(&chars);
    if let Some((name, _)) = names
        .iter()
        .enumerate()
        .find(|(i, (n, _))| names[..*i].iter().any(|(m, _)| m == n))
        .map(|(_, g)| g)
    {
        return Err(format!("two groups are named {name}"));
    }
    let mut t = Translator {
        backtracking: needs_backtracking(pattern),
        groups,
        names,
        chars,
        i: 0,
        out: String::with_capacity(pattern.len() * 2),
        unicode: flags.contains('u'),
        dot_all: flags.contains('s'),
    };
    let mut prefix = String::new();
    if flags.contains('i') {
        prefix.push('i');
    }
    if flags.contains('m') {
        prefix.push('m');
    }
    if !prefix.is_empty() {
        t.out.push_str(&format!("(?{prefix})"));
    }
    t.run()?;
    Ok(t.out)
}

/// The capturing groups of a pattern: how many, and the number of each named one (for telling
/// back-references from escapes, and for turning named references into numbered ones).
fn capture_groups(chars: &[char]) -> (usize, Vec<(String, usize)>) {
    let (mut n, mut i, mut in_class) = (0, 0, false);
    let mut names = Vec::new();
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '(' if !in_class => {
                let rest = &chars[i + 1..];
                let named = rest.starts_with(&['?', '<'])
                    && !rest.starts_with(&['?', '<', '='])
                    && !rest.starts_with(&['?', '<', '!']);
                if rest.first() != Some(&'?') || named {
                    n += 1;
                }
                if named {
                    let name: String = rest[2..].iter().take_while(|c| **c != '>').collect();
                    names.push((name, n));
                }
            }
            _ => {}
        }
        i += 1;
    }
    (n, names)
}

struct Translator {
    /// For `fancy-regex` (which has no ASCII `\b`) rather than `regex`.
    backtracking: bool,
    chars: Vec<char>,
    i: usize,
    out: String,
    groups: usize,
    /// Named groups and their numbers (references to them are written as numbers: the
    /// backtracking engine refuses names and numbers in one pattern).
    names: Vec<(String, usize)>,
    unicode: bool,
    dot_all: bool,
}

/// One member of a character class.
enum ClassAtom {
    Char(char),
    /// A class escape (`\d`, `\W`, …) as class-body syntax.
    Set(String),
}

fn push_literal(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() || c == '_' || (!c.is_ascii() && !c.is_whitespace()) {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:X}}}", c as u32);
    }
}

fn class_char(out: &mut String, c: char) {
    let _ = write!(out, "\\x{{{:X}}}", c as u32);
}

impl Translator {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).copied()
    }

    fn starts_with(&self, s: &str) -> bool {
        (self.i..)
            .zip(s.chars())
            .all(|(k, c)| self.chars.get(k) == Some(&c))
    }

    fn run(&mut self) -> Result<(), String> {
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                '\\' => self.escape()?,
                '[' => self.class()?,
                '.' => self.out.push_str(if self.dot_all {
                    "(?s:.)"
                } else {
                    r"[^\n\r\x{2028}\x{2029}]"
                }),
                '(' => self.group()?,
                ')' | '|' | '^' | '$' | '*' | '+' | '?' => self.out.push(c),
                '{' => match self.quantifier_len() {
                    Some(len) => {
                        self.out.push('{');
                        self.out.extend(&self.chars[self.i..self.i + len]);
                        self.i += len;
                    }
                    None => push_literal(&mut self.out, '{'),
                },
                _ => push_literal(&mut self.out, c),
            }
        }
        Ok(())
    }

    /// After a `{`: the length of `n}`, `n,}` or `n,m}` when that follows, else `None` (a
    /// literal brace, as JavaScript reads it outside unicode mode).
    fn quantifier_len(&self) -> Option<usize> {
        let rest = &self.chars[self.i..];
        let digits = |from: usize| {
            rest[from..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count()
        };
        let lo = digits(0);
        if lo == 0 {
            return None;
        }
        let mut k = lo;
        if rest.get(k) == Some(&',') {
            k += 1;
            k += digits(k);
        }
        (rest.get(k) == Some(&'}')).then_some(k + 1)
    }

    fn group(&mut self) -> Result<(), String> {
        if self.peek(0) != Some('?') {
            self.out.push('(');
            return Ok(());
        }
        for head in ["?:", "?=", "?!", "?<=", "?<!"] {
            if self.starts_with(head) {
                self.out.push('(');
                self.out.push_str(head);
                self.i += head.len();
                return Ok(());
            }
        }
        if self.starts_with("?<") {
            // A named group is numbered like any other; its references become numbers.
            let name_len = self.chars[self.i + 2..]
                .iter()
                .take_while(|c| **c != '>')
                .count();
            self.out.push('(');
            self.i += 2 + name_len + 1;
            return Ok(());
        }
        Err("unsupported group syntax".to_owned())
    }

    /// Whether a quantifier comes next (`*`, `+`, `?`, or a `{n…}` one).
    fn quantifier_follows(&self) -> bool {
        match self.peek(0) {
            Some('*' | '+' | '?') => true,
            Some('{') => {
                let rest: String = self.chars[self.i + 1..].iter().take(24).collect();
                let digits = rest.chars().take_while(char::is_ascii_digit).count();
                digits > 0 && {
                    let after: String = rest.chars().skip(digits).collect();
                    after.starts_with('}') || after.starts_with(',')
                }
            }
            _ => false,
        }
    }

    /// Annex B's legacy octal escape, its first digit `first` already read: up to three octal
    /// digits worth at most 0o377; `\8` and `\9` are those digits themselves.
    fn legacy_octal(&mut self, first: char) -> char {
        let Some(mut value) = first.to_digit(8) else {
            return first;
        };
        let mut taken = 1;
        while taken < 3 {
            let Some(d) = self.peek(0).and_then(|c| c.to_digit(8)) else {
                break;
            };
            if value * 8 + d > 0o377 {
                break;
            }
            value = value * 8 + d;
            self.i += 1;
            taken += 1;
        }
        char::from_u32(value).unwrap_or('\0')
    }

    /// A code point from `\uHHHH` (already past the `u`), joining a surrogate pair.
    fn unicode_escape(&mut self) -> Result<Option<char>, String> {
        if self.unicode && self.peek(0) == Some('{') {
            let hex: String = self.chars[self.i + 1..]
                .iter()
                .take_while(|c| **c != '}')
                .collect();
            let code = u32::from_str_radix(&hex, 16).map_err(|_| "bad \\u{…} escape".to_owned())?;
            self.i += hex.len() + 2;
            return char::from_u32(code)
                .map(Some)
                .ok_or_else(|| "a lone surrogate cannot be matched".to_owned());
        }
        let Some(unit) = self.hex_digits(0, 4) else {
            return Ok(None);
        };
        self.i += 4;
        if (0xD800..0xDC00).contains(&unit) && self.starts_with("\\u") {
            if let Some(low) = self
                .hex_digits(2, 4)
                .filter(|l| (0xDC00..0xE000).contains(l))
            {
                self.i += 6;
                let code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                return char::from_u32(code)
                    .map(Some)
                    .ok_or_else(|| "bad surrogate pair".to_owned());
            }
        }
        char::from_u32(unit)
            .map(Some)
            .ok_or_else(|| "a lone surrogate cannot be matched".to_owned())
    }

    fn hex_digits(&self, from: usize, n: usize) -> Option<u32> {
        let s: String = self
            .chars
            .get(self.i + from..self.i + from + n)?
            .iter()
            .collect();
        if s.chars().all(|c| c.is_ascii_hexdigit()) {
            u32::from_str_radix(&s, 16).ok()
        } else {
            None
        }
    }

    /// An escape that means one character, after the backslash and its letter `c`; `None`
    /// when `c` is not such an escape.
    fn char_escape(&mut self, c: char) -> Result<Option<char>, String> {
        Ok(Some(match c {
            't' => '\t',
            'n' => '\n',
            'r' => '\r',
            'v' => '\u{B}',
            'f' => '\u{C}',
            '0' if !self.peek(0).is_some_and(|d| d.is_ascii_digit()) => '\0',
            'c' => match self.peek(0).filter(char::is_ascii_alphabetic) {
                Some(letter) => {
                    self.i += 1;
                    char::from(letter as u8 % 32)
                }
                None => return Ok(None),
            },
            'x' => match self.hex_digits(0, 2) {
                Some(code) => {
                    self.i += 2;
                    char::from_u32(code).unwrap_or('\0')
                }
                None => 'x',
            },
            'u' => self.unicode_escape()?.unwrap_or('u'),
            _ => return Ok(None),
        }))
    }

    /// A class escape (`\d`…) as class-body syntax, or a Unicode property in unicode mode.
    fn set_escape(&mut self, c: char) -> Option<String> {
        let (body, negated) = match c {
            'd' => (JS_DIGIT, false),
            'D' => (JS_DIGIT, true),
            'w' => (JS_WORD, false),
            'W' => (JS_WORD, true),
            's' => (JS_SPACE, false),
            'S' => (JS_SPACE, true),
            'p' | 'P' if self.unicode && self.peek(0) == Some('{') => {
                let name: String = self.chars[self.i..]
                    .iter()
                    .take_while(|ch| **ch != '}')
                    .collect();
                self.i += name.chars().count() + 1;
                return Some(format!("\\{c}{name}}}"));
            }
            _ => return None,
        };
        Some(if negated {
            format!("[^{body}]")
        } else {
            body.to_owned()
        })
    }

    fn escape(&mut self) -> Result<(), String> {
        let Some(c) = self.peek(0) else {
            return Err("a pattern cannot end with a backslash".to_owned());
        };
        self.i += 1;
        match c {
            'b' | 'B' if self.quantifier_follows() => {
                return Err(format!("nothing to repeat after \\{c}"));
            }
            'b' | 'B' if self.backtracking => {
                // An ASCII word boundary spelled with look-around.
                let w = "(?-i:[0-9A-Za-z_])";
                let _ = if c == 'b' {
                    write!(self.out, "(?:(?<={w})(?!{w})|(?<!{w})(?={w}))")
                } else {
                    write!(self.out, "(?:(?<={w})(?={w})|(?<!{w})(?!{w}))")
                };
            }
            'b' => self.out.push_str(r"(?-u:\b)"),
            'B' => self.out.push_str(r"(?-u:\B)"),
            '1'..='9' => {
                let digits: String = std::iter::once(c)
                    .chain(
                        self.chars[self.i..]
                            .iter()
                            .copied()
                            .take_while(char::is_ascii_digit),
                    )
                    .collect();
                let n: usize = digits.parse().unwrap_or(usize::MAX);
                if n <= self.groups {
                    self.i += digits.len() - 1;
                    let _ = write!(self.out, "(?:\\{n})");
                } else if self.unicode {
                    return Err(format!("\\{digits} names a group that does not exist"));
                } else {
                    // Annex B: not a reference, so an octal escape (or `\8`, `\9`: the digit).
                    let ch = self.legacy_octal(c);
                    push_literal(&mut self.out, ch);
                }
            }
            '0' if self.peek(0).is_some_and(|d| d.is_ascii_digit()) && !self.unicode => {
                let ch = self.legacy_octal(c);
                push_literal(&mut self.out, ch);
            }
            'k' if !self.names.is_empty() || self.unicode => {
                if self.peek(0) != Some('<') {
                    return Err("\\k without a group name".to_owned());
                }
                let name: String = self.chars[self.i + 1..]
                    .iter()
                    .take_while(|ch| **ch != '>')
                    .collect();
                self.i += name.chars().count() + 2;
                let Some(n) = self.names.iter().find(|(m, _)| *m == name).map(|(_, n)| *n) else {
                    return Err(format!("no group is named {name}"));
                };
                let _ = write!(self.out, "(?:\\{n})");
            }
            _ => {
                if let Some(set) = self.set_escape(c) {
                    // Class escapes keep their ASCII meaning under `i`, outside unicode mode;
                    // in it `\w` under `i` takes ſ and K too, and `\p{Lu}` any case — what
                    // case folding the class gives.
                    if self.unicode {
                        let _ = write!(self.out, "[{set}]");
                    } else {
                        let _ = write!(self.out, "(?-i:[{set}])");
                    }
                } else if let Some(ch) = self.char_escape(c)? {
                    push_literal(&mut self.out, ch);
                } else if c == '0' {
                    return Err("octal escapes are not allowed in unicode mode".to_owned());
                } else if c == 'c' {
                    // `\c` without a letter is a backslash and a `c` (Annex B).
                    push_literal(&mut self.out, '\\');
                    push_literal(&mut self.out, 'c');
                } else {
                    push_literal(&mut self.out, c);
                }
            }
        }
        Ok(())
    }

    fn class_atom(&mut self) -> Result<ClassAtom, String> {
        let c = self.peek(0).ok_or("unterminated character class")?;
        self.i += 1;
        if c != '\\' {
            return Ok(ClassAtom::Char(c));
        }
        let e = self.peek(0).ok_or("unterminated character class")?;
        self.i += 1;
        if let Some(set) = self.set_escape(e) {
            return Ok(ClassAtom::Set(set));
        }
        if e == 'b' {
            return Ok(ClassAtom::Char('\u{8}'));
        }
        if let Some(ch) = self.char_escape(e)? {
            return Ok(ClassAtom::Char(ch));
        }
        if e.is_ascii_digit() {
            if self.unicode {
                return Err("octal escapes are not allowed in unicode mode".to_owned());
            }
            return Ok(ClassAtom::Char(self.legacy_octal(e)));
        }
        if e == 'c' {
            // Annex B: in a class, `\c` also takes a digit or `_`.
            if let Some(d) = self.peek(0).filter(|d| d.is_ascii_digit() || *d == '_') {
                self.i += 1;
                return Ok(ClassAtom::Char(char::from(d as u8 % 32)));
            }
            // `[\c]` is a backslash and a `c`; push the `c` back for the next atom.
            self.i -= 1;
            return Ok(ClassAtom::Char('\\'));
        }
        Ok(ClassAtom::Char(e))
    }

    fn class(&mut self) -> Result<(), String> {
        let negated = self.peek(0) == Some('^');
        if negated {
            self.i += 1;
        }
        if self.peek(0) == Some(']') {
            self.i += 1;
            // `[]` matches nothing, `[^]` any character.
            self.out.push_str(if negated {
                r"[\x{0}-\x{10FFFF}]"
            } else {
                r"[^\x{0}-\x{10FFFF}]"
            });
            return Ok(());
        }
        let mut body = String::new();
        loop {
            match self.peek(0) {
                None => return Err("unterminated character class".to_owned()),
                Some(']') => {
                    self.i += 1;
                    break;
                }
                Some(_) => {}
            }
            let atom = self.class_atom()?;
            let range_follows = self.peek(0) == Some('-') && self.peek(1).is_some_and(|c| c != ']');
            match atom {
                ClassAtom::Char(lo) if range_follows => {
                    self.i += 1;
                    match self.class_atom()? {
                        ClassAtom::Char(hi) => {
                            if hi < lo {
                                return Err("range out of order in character class".to_owned());
                            }
                            class_char(&mut body, lo);
                            body.push('-');
                            class_char(&mut body, hi);
                        }
                        ClassAtom::Set(set) => {
                            // `[a-\d]`: the dash is a character (Annex B).
                            class_char(&mut body, lo);
                            class_char(&mut body, '-');
                            body.push_str(&set);
                        }
                    }
                }
                ClassAtom::Char(c) => class_char(&mut body, c),
                ClassAtom::Set(set) => body.push_str(&set),
            }
        }
        self.out.push('[');
        if negated {
            self.out.push('^');
        }
        self.out.push_str(&body);
        self.out.push(']');
        Ok(())
    }
}

#[cfg(test)]
mod tests;
