//! Stop words for every lexical ranking (memories, chat history, lore free text): English and
//! Chinese function words that say nothing about which text a query is about ("the", "is",
//! "的", "什么"), so they never make an unrelated text match. One list, used by all three.
//!
//! Tokens are case-folded Latin words before stemming, CJK bigrams or a lone CJK character. A
//! CJK token is a stop word when it is a listed function-word bigram or made only of function
//! characters.

use tavern_core::tokens::is_cjk;

/// English function words (lowercase): articles, pronouns, auxiliaries, prepositions,
/// conjunctions and question words.
const ENGLISH: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "all",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "down",
    "during",
    "each",
    "few",
    "for",
    "from",
    "further",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "just",
    "me",
    "might",
    "more",
    "most",
    "must",
    "my",
    "myself",
    "no",
    "nor",
    "not",
    "now",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "ours",
    "ourselves",
    "out",
    "over",
    "own",
    "s",
    "same",
    "shall",
    "she",
    "should",
    "so",
    "some",
    "such",
    "t",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "whose",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
    "d",
    "ll",
    "m",
    "re",
    "ve",
    "don",
    "doesn",
    "didn",
    "isn",
    "aren",
    "wasn",
    "weren",
    "won",
    "also",
    "let",
    "us",
    "tell",
];

/// Chinese function characters: particles, pronouns, the copula, common prepositions and
/// conjunctions, measure word `个`.
const CHINESE_CHARS: &str =
    "的了是在和与及或也都就而着过吗呢吧啊呀哦么之其把被让给从对向于为以这那哪我你他她它们个不很还又再才嘛呐什怎";

/// Chinese function words of two characters (as query bigrams).
const CHINESE_BIGRAMS: &[&str] = &[
    "什么", "怎么", "为何", "这个", "那个", "这些", "那些", "这里", "那里", "哪里", "哪个", "我们",
    "你们", "他们", "她们", "它们", "一个", "一些", "一下", "没有", "可以", "因为", "所以", "但是",
    "如果", "就是", "还是", "已经", "自己", "这样", "那样", "怎样", "然后", "告诉", "关于", "有关",
    "一点", "有没", "是不", "是否", "请问",
];

/// Whether a query token is a stop word.
pub fn is_stop_word(token: &str) -> bool {
    let mut chars = token.chars();
    let Some(first) = chars.next() else {
        return true;
    };
    if is_cjk(first) {
        CHINESE_BIGRAMS.contains(&token) || token.chars().all(|c| CHINESE_CHARS.contains(c))
    } else {
        ENGLISH.contains(&token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(token, is a stop word)`.
    #[test]
    fn function_words_are_stop_words_and_content_words_are_not() {
        let cases: &[(&str, bool)] = &[
            ("the", true),
            ("what", true),
            ("s", true),
            ("forest", false),
            ("的", true),
            ("什么", true),
            ("我们", true),
            ("门在", false),
            ("银色", false),
            ("剑", false),
            ("", true),
        ];
        for (token, stop) in cases {
            assert_eq!(is_stop_word(token), *stop, "{token:?}");
        }
    }
}
