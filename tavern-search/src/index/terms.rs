//! A shard's term dictionary: token → term id. The terms of an index read from an image lie
//! in sorted arrays as the image wrote them (packed keys, then the longer words in one
//! string), found by bisection, so an open inserts nothing into a hash map (a store of 100,000
//! memories holds a quarter of a million terms) and holds 8 bytes a packed term rather than a
//! hash map's 20–40; terms added since, and every term of an index built from documents, are
//! in hash maps.

use rustc_hash::FxHashMap;

use crate::bytes::{ImageError, Put, Take};

/// Token → term id.
#[derive(Debug, Default, Clone)]
pub(super) struct Terms {
    /// Packed keys read from an image, ascending: term `i` is the `i`-th.
    sorted_keys: Vec<u64>,
    /// Longer words read from an image, ascending, one after the other, and where each ends:
    /// term `sorted_keys.len() + i` is the `i`-th.
    sorted_words: Box<str>,
    word_ends: Vec<u32>,
    /// Terms added since (every term, when the index was not read from an image).
    packed: FxHashMap<u64, u32>,
    words: FxHashMap<Box<str>, u32>,
}

/// One term as [`Terms::sorted`] gives it: its key (a packed token, or the word) and its id.
pub(super) enum Key<'a> {
    Packed(u64),
    Word(&'a str),
}

impl Terms {
    /// The term id of `token` (`key`: its packed form, when it has one).
    pub(super) fn get(&self, token: &str, key: Option<u64>) -> Option<u32> {
        match key {
            Some(key) => match self.sorted_keys.binary_search(&key) {
                Ok(i) => u32::try_from(i).ok(),
                Err(_) => self.packed.get(&key).copied(),
            },
            None => match self.sorted_word(token) {
                Some(i) => u32::try_from(self.sorted_keys.len() + i).ok(),
                None => self.words.get(token).copied(),
            },
        }
    }

    /// Names `token` term `id` (it has none: [`Terms::get`] found none).
    pub(super) fn insert(&mut self, token: &str, key: Option<u64>, id: u32) {
        match key {
            Some(key) => {
                self.packed.insert(key, id);
            }
            None => {
                self.words.insert(token.into(), id);
            }
        }
    }

    /// Makes room for about `more` packed terms.
    pub(super) fn reserve(&mut self, more: usize) {
        self.packed.reserve(more);
    }

    /// The `i`-th sorted word.
    fn word_at(&self, i: usize) -> Option<&str> {
        let start = i
            .checked_sub(1)
            .map_or(Some(0), |p| self.word_ends.get(p).map(|e| *e as usize))?;
        self.sorted_words
            .get(start..*self.word_ends.get(i)? as usize)
    }

    /// Which sorted word `token` is.
    fn sorted_word(&self, token: &str) -> Option<usize> {
        let (mut low, mut high) = (0, self.word_ends.len());
        while low < high {
            let mid = low + (high - low) / 2;
            match self.word_at(mid).unwrap_or_default().cmp(token) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// Every term with its id: packed keys ascending, then words ascending (as
    /// [`Terms::write`] writes them and [`Terms::read`] numbers them).
    pub(super) fn sorted(&self) -> Vec<(Key<'_>, u32)> {
        let mut packed: Vec<(u64, u32)> = (0u32..)
            .zip(&self.sorted_keys)
            .map(|(id, key)| (*key, id))
            .chain(self.packed.iter().map(|(key, id)| (*key, *id)))
            .collect();
        packed.sort_unstable_by_key(|(key, _)| *key);
        let first_word = self.sorted_keys.len();
        let mut words: Vec<(&str, u32)> = (0..self.word_ends.len())
            .filter_map(|i| Some((self.word_at(i)?, u32::try_from(first_word + i).ok()?)))
            .chain(self.words.iter().map(|(word, id)| (&**word, *id)))
            .collect();
        words.sort_unstable_by_key(|(word, _)| *word);
        let mut all: Vec<(Key<'_>, u32)> = packed
            .into_iter()
            .map(|(key, id)| (Key::Packed(key), id))
            .collect();
        all.extend(words.into_iter().map(|(word, id)| (Key::Word(word), id)));
        all
    }

    /// Writes the keys of `sorted` ([`Terms::sorted`]), calling `each` after each with its
    /// old id to write what goes with it.
    pub(super) fn write(
        sorted: &[(Key<'_>, u32)],
        out: &mut Vec<u8>,
        mut each: impl FnMut(u32, &mut Vec<u8>),
    ) {
        let packed = sorted
            .iter()
            .take_while(|(key, _)| matches!(key, Key::Packed(_)))
            .count();
        out.put_len(packed);
        out.put_len(sorted.len() - packed);
        for (key, id) in sorted {
            match key {
                Key::Packed(key) => out.put_u64(*key),
                Key::Word(word) => out.put_str(word),
            }
            each(*id, out);
        }
    }

    /// Reads the terms [`Terms::write`] wrote, numbered as they come, calling `each` after
    /// each to read what goes with it.
    ///
    /// # Errors
    /// [`ImageError`] when the bytes end early or the keys are not strictly ascending.
    pub(super) fn read(
        bytes: &mut Take<'_>,
        mut each: impl FnMut(&mut Take<'_>) -> Result<(), ImageError>,
    ) -> Result<Self, ImageError> {
        // Each term takes 16 bytes at least: its key (or its word's length) and its lists'
        // count.
        let packed = bytes.len(16, "packed terms")?;
        let words = bytes.len(16, "word terms")?;
        let mut terms = Self {
            sorted_keys: Vec::with_capacity(packed),
            word_ends: Vec::with_capacity(words),
            ..Self::default()
        };
        for _ in 0..packed {
            let key = bytes.u64("packed term")?;
            if terms.sorted_keys.last().is_some_and(|last| *last >= key) {
                return Err(unordered());
            }
            terms.sorted_keys.push(key);
            each(bytes)?;
        }
        let mut all = String::new();
        let mut last = 0;
        for _ in 0..words {
            let word = bytes.str("term")?;
            if !terms.word_ends.is_empty() && all.get(last..).is_none_or(|l| l >= word) {
                return Err(unordered());
            }
            last = all.len();
            all.push_str(word);
            terms.word_ends.push(
                u32::try_from(all.len())
                    .map_err(|_| ImageError::Invalid("terms too long".into()))?,
            );
            each(bytes)?;
        }
        terms.sorted_words = all.into_boxed_str();
        Ok(terms)
    }

    /// How many terms there are.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.sorted_keys.len() + self.word_ends.len() + self.packed.len() + self.words.len()
    }
}

fn unordered() -> ImageError {
    ImageError::Invalid("terms out of order or repeated".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Each term followed by its old id in 8 bytes (as an image follows it by its lists).
    fn write(terms: &Terms) -> Vec<u8> {
        let mut out = Vec::new();
        Terms::write(&terms.sorted(), &mut out, |id, out| {
            out.put_u64(u64::from(id))
        });
        out
    }

    /// Read back, with the old id of each term by its new one.
    fn read(bytes: &[u8]) -> Result<(Terms, Vec<u32>), ImageError> {
        let mut old = Vec::new();
        let terms = Terms::read(&mut Take::new(bytes), |b| {
            old.push(u32::try_from(b.u64("old id")?).unwrap_or(u32::MAX));
            Ok(())
        })?;
        Ok((terms, old))
    }

    fn token(i: u8) -> (String, Option<u64>) {
        // Packed keys and longer words, some sharing a prefix.
        match i % 3 {
            0 => (format!("w{i}"), Some(u64::from(i) << 8 | 3)),
            1 => (format!("longerword{i}"), None),
            _ => (format!("longerword{}x", i / 2), None),
        }
    }

    proptest! {
        /// Terms read from an image (then more added) find every token as the dictionary they
        /// were written from did, under the ids the image gave them; unknown tokens are not
        /// found.
        #[test]
        fn terms_read_back_find_what_was_written(
            first in prop::collection::btree_set(any::<u8>(), 0..60),
            more in prop::collection::btree_set(any::<u8>(), 0..60),
        ) {
            let mut made = Terms::default();
            for (id, i) in (0u32..).zip(&first) {
                let (t, k) = token(*i);
                made.insert(&t, k, id);
            }
            let (mut read, old) = read(&write(&made)).unwrap();
            prop_assert_eq!(read.len(), first.len());
            for i in &first {
                let (t, k) = token(*i);
                let new = read.get(&t, k).unwrap();
                prop_assert_eq!(Some(old[new as usize]), made.get(&t, k));
            }
            let next = u32::try_from(first.len()).unwrap();
            for (id, i) in (next..).zip(more.iter().filter(|i| !first.contains(i))) {
                let (t, k) = token(*i);
                prop_assert!(read.get(&t, k).is_none());
                read.insert(&t, k, id);
                prop_assert_eq!(read.get(&t, k), Some(id));
            }
            // Written again (sorted and added alike), read again: the same ids for each.
            let (again, old_again) = read_back_ids(&read);
            for i in first.iter().chain(&more) {
                let (t, k) = token(*i);
                let new = again.get(&t, k).unwrap();
                prop_assert_eq!(Some(old_again[new as usize]), read.get(&t, k));
            }
        }

        /// Terms written whole, then cut or with bytes changed: refused or read, never a
        /// panic; a cut one is always refused, and one read finds its keys only in order.
        #[test]
        fn damaged_terms_are_refused_not_a_panic(
            first in prop::collection::btree_set(any::<u8>(), 1..40),
            cut in any::<prop::sample::Index>(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut made = Terms::default();
            for (id, i) in (0u32..).zip(&first) {
                let (t, k) = token(*i);
                made.insert(&t, k, id);
            }
            let bytes = write(&made);
            prop_assert!(read(&bytes[..cut.index(bytes.len())]).is_err());
            let mut damaged = bytes.clone();
            for (at, x) in &flips {
                let i = at.index(damaged.len());
                damaged[i] ^= x | 1;
            }
            if let Ok((terms, _)) = read(&damaged) {
                prop_assert!(terms.sorted_keys.windows(2).all(|w| w[0] < w[1]));
                for i in &first {
                    let (t, k) = token(*i);
                    let _ = terms.get(&t, k);
                }
            }
        }
    }

    fn read_back_ids(terms: &Terms) -> (Terms, Vec<u32>) {
        read(&write(terms)).unwrap()
    }

    /// Keys written out of order or twice are refused; in order, they are found.
    #[test]
    fn repeated_or_unordered_keys_are_refused() {
        let terms = |packed: &[u64], words: &[&str]| {
            let mut out = Vec::new();
            out.put_len(packed.len());
            out.put_len(words.len());
            for key in packed {
                out.put_u64(*key);
                out.put_u64(0);
            }
            for word in words {
                out.put_str(word);
                out.put_u64(0);
            }
            Terms::read(&mut Take::new(&out), |b| b.u64("lists").map(|_| ()))
        };
        assert!(terms(&[5, 5], &[]).is_err());
        assert!(terms(&[6, 5], &[]).is_err());
        assert!(terms(&[], &["longerb", "longera"]).is_err());
        assert!(terms(&[], &["longera", "longera"]).is_err());
        let read = terms(&[5, 6], &["longera", "longerb"]).unwrap();
        assert_eq!(read.get("", Some(6)), Some(1));
        assert_eq!(read.get("longerb", None), Some(3));
        assert_eq!(read.get("longerc", None), None);
        assert_eq!(read.get("", Some(7)), None);
    }
}
