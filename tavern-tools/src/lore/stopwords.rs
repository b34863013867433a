//! Stop words for lore free-text ranking: English and Chinese function words that say nothing
//! about which entry a query is about ("the", "is", "的", "什么"), so they never make an
//! unrelated entry match. Keyword activation is not affected: a key is matched as written.
//!
//! Tokens are those of [`tavern_store::search::query_tokens`]: lowercase Latin words, CJK
//! bigrams (or a lone CJK character). A CJK token is a stop word when it is a listed
//! function-word bigram or made only of function characters.

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
    "may",
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
    if tavern_core::tokens::is_cjk(first) {
        CHINESE_BIGRAMS.contains(&token) || token.chars().all(|c| CHINESE_CHARS.contains(c))
    } else {
        ENGLISH.contains(&token)
    }
}

/// The query tokens of `text` for lore ranking: [`tavern_store::search::query_tokens`] without
/// stop words.
pub fn content_tokens(text: &str) -> Vec<String> {
    let mut tokens = tavern_store::search::query_tokens(text);
    tokens.retain(|t| !is_stop_word(t));
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(query, tokens kept for ranking)`.
    #[test]
    fn function_words_are_dropped_and_content_words_kept() {
        let cases: &[(&str, &[&str])] = &[
            ("what is the forest", &["forest"]),
            ("The Shadowfang beasts", &["shadowfang", "beasts"]),
            ("is it", &[]),
            ("这是什么", &[]),
            ("银色大门在哪里", &["银色", "色大", "大门", "门在"]),
            ("告诉我塔罗牌", &["诉我", "我塔", "塔罗", "罗牌"]),
            ("的", &[]),
            ("剑", &["剑"]),
            ("tell me about Eldoria", &["eldoria"]),
        ];
        for (query, kept) in cases {
            assert_eq!(content_tokens(query), *kept, "{query:?}");
        }
    }
}
