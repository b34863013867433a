//! The translation against JavaScript's own semantics (`regress`) and hostile keys.

use super::*;
use proptest::prelude::*;

fn js_find(pattern: &str, flags: &str, text: &str) -> Option<usize> {
    regress::Regex::with_flags(pattern, regress::Flags::from(flags))
        .expect("valid JavaScript")
        .find(text)
        .map(|m| m.start())
}

fn ours(pattern: &str, flags: &str, text: &str) -> Option<usize> {
    JsRegex::new(pattern, flags)
        .unwrap_or_else(|e| panic!("{pattern:?} /{flags}: {e}"))
        .find_start(text)
        .expect("within the step limit")
}

#[track_caller]
fn same(pattern: &str, flags: &str, text: &str) {
    assert_eq!(
        ours(pattern, flags, text),
        js_find(pattern, flags, text),
        "/{pattern}/{flags} on {text:?} (as {:?})",
        translate(pattern, flags)
    );
}

#[test]
fn where_the_syntaxes_differ_the_meaning_is_javascripts() {
    let cases: &[(&str, &str, &[&str])] = &[
        (r"\d+", "", &["abc １２ 12", "１２"]),
        (r"\bcat\b", "", &["a cat.", "écat", "concat", "猫cat猫"]),
        (r"a.b", "", &["a\nb a\rb a\u{2028}b axb", "a\rb"]),
        (r"a.b", "s", &["a\nb", "a\rb"]),
        (r"\s", "", &["a\u{FEFF}b", "a\u{85}b", "ab"]),
        (r"[^]", "", &["", "\n"]),
        (r"a[]", "", &["a", "ab"]),
        (r"[[]x", "", &["[x", "x"]),
        (r"a{", "", &["a{", "a"]),
        (r"a{2}", "", &["aa", "a"]),
        (r"x{1,}y", "", &["xxy"]),
        (r"{x}", "", &["{x}"]),
        (r"\uD83D\uDE00", "", &["😀", "x"]),
        (r"\u{1F600}", "u", &["😀"]),
        (r"\x41\u0042", "", &["AB"]),
        (r"\cJ", "", &["\n"]),
        (r"\c", "", &["\\c"]),
        (r"[\c]", "", &["c", "\\"]),
        (r"[a-\d]", "", &["-", "5", "b"]),
        (r"[\b]", "", &["\u{8}", "b"]),
        (r"[\w-]", "", &["-", "!"]),
        (r"[&&a]", "", &["&", "a"]),
        (r"[~-~]", "", &["~"]),
        (r"(\w)\1", "", &["abba", "abc"]),
        (r"(?<q>['`])\w+\k<q>", "", &["say 'hi'", "say 'hi`"]),
        (r"(?<=\$)\d+", "", &["cost $42", "42"]),
        (r"(?<!no )way", "", &["no way", "a way"]),
        (r"foo(?!bar)", "", &["foobar foobaz"]),
        (r"^abc$", "m", &["x\nabc\ny", "abc"]),
        (r"^abc", "", &["\u{1}abc"]),
        (r"HELLO", "i", &["say hello"]),
        (r"\p{Script=Han}+", "u", &["abc 漢字"]),
        (r"\/path\.", "", &["a /path."]),
        (r"a\-b\#c", "", &["a-b#c"]),
        (r"\0", "", &["a\0"]),
        (r"a|", "", &["b"]),
        (r"(?:ab)+?", "", &["ababab"]),
        (r"[^\s\S]", "", &["anything"]),
        (r"[\D]", "", &["1a"]),
        (r"\u00e9", "i", &["É"]),
    ];
    for (pattern, flags, texts) in cases {
        for text in *texts {
            same(pattern, flags, text);
        }
    }
}

/// Browsers (where SillyTavern runs) keep `\w` ASCII under `i` outside unicode mode; the
/// `regress` crate does not, so this is checked on its own.
#[test]
fn word_characters_stay_ascii_under_ignore_case() {
    assert_eq!(
        ours(r"\w+", "i", "ſK é _x"),
        Some(2),
        "ſ (two bytes) is not a word character"
    );
    assert_eq!(ours(r"\bcat\b", "", "猫cat猫"), Some(3));
    assert_eq!(
        ours(r"(?=c)\bcat\b", "", "猫cat猫"),
        Some(3),
        "the backtracking spelling too"
    );
    assert_eq!(ours(r"\bcat", "", "écat"), Some(2));
}

#[test]
fn what_has_no_bounded_equivalent_is_refused_with_the_reason() {
    for (pattern, why) in [
        (r"\uD800", "surrogate"),
        (r"(a)\2", "missing group"),
        (r"\07", "octal"),
    ] {
        let err = JsRegex::new(pattern, "").expect_err(pattern);
        assert!(err.contains(why), "{pattern}: {err}");
    }
    // Invalid JavaScript is refused as JavaScript refuses it.
    assert!(JsRegex::new("(a", "").is_err());
    assert!(JsRegex::new("a{1000}{1000}", "").is_err());
    assert!(
        JsRegex::new("(?:a{1000}){1000}", "").is_err(),
        "too large to compile"
    );
}

/// The keys that froze a bridge (#30 F4): each answers correctly on a long hostile text.
/// A backtracking engine would not return from these within a day.
#[test]
fn exponential_keys_run_in_bounded_time() {
    let long_a = "a".repeat(5000);
    let words = "a1".repeat(2500);
    let cases: [(&str, &str, Option<usize>); 6] = [
        ("(a|a)*c", &long_a, None),
        (r"(\w|\d)+!", &words, None),
        ("(?:a|aa)+z", &long_a, None),
        ("a*a*a*a*a*a*a*a*a*a*b", &long_a, None),
        ("(a?){28}a{28}", &long_a, Some(0)),
        ("(a+)+b", &long_a, None),
    ];
    for (pattern, text, expected) in cases {
        assert_eq!(ours(pattern, "", text), expected, "{pattern}");
    }
    // With look-around the backtracking machine runs, and gives up instead of hanging.
    let hostile = JsRegex::new(r"(a|a)*\1c", "").expect("compiles");
    assert_eq!(hostile.find_start(&long_a[..40]), Err(StepLimit));
}

fn atom() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_owned()),
        Just("b".to_owned()),
        Just("1".to_owned()),
        Just(" ".to_owned()),
        Just("é".to_owned()),
        Just(".".to_owned()),
        Just(r"\d".to_owned()),
        Just(r"\w".to_owned()),
        Just(r"\W".to_owned()),
        Just(r"\s".to_owned()),
        Just(r"\b".to_owned()),
        Just(r"\B".to_owned()),
        Just("[ab]".to_owned()),
        Just("[^a1]".to_owned()),
        Just(r"[\d\s]".to_owned()),
        Just("[a-c]".to_owned()),
        Just("^".to_owned()),
        Just("$".to_owned()),
        Just("{".to_owned()),
        Just(r"\u00e9".to_owned()),
    ]
}

fn pattern() -> impl Strategy<Value = String> {
    let piece = (
        atom(),
        prop_oneof![
            Just(""),
            Just("?"),
            Just("*"),
            Just("+"),
            Just("{1,2}"),
            Just("*?")
        ],
    )
        .prop_map(|(a, q)| {
            if a == "^" || a == "$" || a == r"\b" || a == r"\B" || a == "{" {
                a
            } else {
                format!("{a}{q}")
            }
        });
    prop::collection::vec(piece, 1..5).prop_flat_map(|pieces| {
        let joined = pieces.concat();
        prop_oneof![
            Just(joined.clone()),
            Just(format!("({joined})+")),
            Just(format!("(?:{joined})|b")),
            Just(format!("(?={joined})a")),
            Just(format!("({joined})\\1")),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]
    /// Random keys over the constructs cards use find what JavaScript finds, where it finds it.
    #[test]
    fn random_keys_match_as_javascript_does(
        p in pattern(),
        flags in prop_oneof![Just(""), Just("i"), Just("m"), Just("s"), Just("im")],
        text in "[ab1 é_\n１A]{0,12}",
    ) {
        prop_assume!(regress::Regex::with_flags(&p, regress::Flags::from(flags)).is_ok());
        let re = JsRegex::new(&p, flags).map_err(|e| TestCaseError::fail(format!("{p:?}: {e}")))?;
        let got = re.find_start(&text).map_err(|_| TestCaseError::fail("step limit"))?;
        prop_assert_eq!(got, js_find(&p, flags, &text), "/{}/{} on {:?} as {:?}", p, flags, text, translate(&p, flags));
    }
}
