//! A shard's posting lists by list id, those read from an image kept as its bytes until a
//! search or an edit first needs them: opening a large store then copies each list's bytes
//! (about 3 a posting) instead of turning every posting of every term into heap entries, and
//! most lists are never read between two opens. A list is decoded once, by whichever call
//! needs it first (searches share the shard, so the decoding is behind a [`OnceLock`]).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use super::Posting;
use crate::bytes::{Put, Take};

/// Posting lists by list id.
#[derive(Default)]
pub(super) struct Lists {
    decoded: Vec<OnceLock<Vec<Posting>>>,
    /// The image lists' encoded postings, one after the other (empty when none is left).
    /// Shared by clones; a `Vec` so reading it copies each list's bytes once.
    image: Arc<Vec<u8>>,
    /// Per image list, where its bytes start in `image`, and one past the last list's end;
    /// lists past the image's (made since) always are decoded.
    starts: Vec<usize>,
    /// Per image list, how many postings it holds (known without decoding it).
    counts: Vec<u32>,
    /// Documents the image held: a posting of another is dropped when decoded.
    docs: usize,
    /// Bytes of `image` whose lists are decoded (so held twice): past half of it, the next
    /// edit keeps only the rest ([`Lists::repack`]).
    decoded_bytes: AtomicUsize,
}

impl Clone for Lists {
    fn clone(&self) -> Self {
        Self {
            decoded: self.decoded.clone(),
            image: self.image.clone(),
            starts: self.starts.clone(),
            counts: self.counts.clone(),
            docs: self.docs,
            decoded_bytes: AtomicUsize::new(self.decoded_bytes.load(Ordering::Relaxed)),
        }
    }
}

impl fmt::Debug for Lists {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lists")
            .field("lists", &self.decoded.len())
            .field("image_lists", &self.counts.len())
            .field("image_bytes", &self.image.len())
            .finish()
    }
}

impl PartialEq for Lists {
    /// The same postings in the same lists, however much of each is decoded.
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && (0..self.len()).all(|l| self.get(l) == other.get(l))
    }
}

impl Lists {
    /// How many lists there are.
    pub(super) fn len(&self) -> usize {
        self.decoded.len()
    }

    /// Makes room for `more` lists.
    pub(super) fn reserve(&mut self, more: usize) {
        self.decoded.reserve(more);
    }

    /// Adds an empty list; its id.
    pub(super) fn push_empty(&mut self) -> u32 {
        let id = u32::try_from(self.decoded.len()).unwrap_or(u32::MAX);
        self.decoded.push(OnceLock::from(Vec::new()));
        id
    }

    /// Whether list `l` holds no posting (without decoding it).
    pub(super) fn is_empty_list(&self, l: usize) -> bool {
        match self.decoded.get(l).and_then(OnceLock::get) {
            Some(list) => list.is_empty(),
            None => self.counts.get(l).is_none_or(|n| *n == 0),
        }
    }

    /// List `l`'s postings, decoded now if they are not yet (an unknown id has none).
    pub(super) fn get(&self, l: usize) -> &[Posting] {
        match self.decoded.get(l) {
            Some(slot) => slot.get_or_init(|| self.decode(l)).as_slice(),
            None => &[],
        }
    }

    /// List `l` to change, decoded first if it is not yet; `None` for an unknown id.
    pub(super) fn get_mut(&mut self, l: usize) -> Option<&mut Vec<Posting>> {
        if self.decoded.get(l)?.get().is_none() {
            let list = self.decode(l);
            self.decoded[l] = OnceLock::from(list);
        }
        // Searches decode lists too (behind `&self`): every edit looks whether it is time.
        self.repack();
        self.decoded.get_mut(l)?.get_mut()
    }

    /// When more than half of the image bytes belong to decoded lists (held twice), keeps
    /// only the bytes of the lists still undecoded: the copy is paid for by the bytes freed,
    /// so a store whose searches and edits come to decode most lists holds about what it did
    /// before lists were read lazily. An index whose lists are all decoded keeps none.
    pub(super) fn repack(&mut self) {
        let decoded = self.decoded_bytes.load(Ordering::Relaxed);
        if self.image.is_empty() || decoded * 2 <= self.image.len() {
            return;
        }
        let lists = self.counts.len();
        let undecoded = |l: usize| self.decoded.get(l).is_some_and(|s| s.get().is_none());
        let left: usize = (0..lists)
            .filter(|&l| undecoded(l))
            .map(|l| self.starts[l + 1] - self.starts[l])
            .sum();
        let mut image = Vec::with_capacity(left);
        let mut starts = Vec::with_capacity(lists + 1);
        for l in 0..lists {
            starts.push(image.len());
            if undecoded(l) {
                image.extend_from_slice(&self.image[self.starts[l]..self.starts[l + 1]]);
            }
        }
        starts.push(image.len());
        self.image = Arc::new(image);
        self.starts = starts;
        self.decoded_bytes = AtomicUsize::new(0);
    }

    /// Every list to change (all decoded first: a compaction rewrites them all).
    pub(super) fn all_mut(&mut self) -> impl Iterator<Item = &mut Vec<Posting>> + '_ {
        for l in 0..self.decoded.len() {
            if self.decoded[l].get().is_none() {
                let list = self.decode(l);
                self.decoded[l] = OnceLock::from(list);
            }
        }
        // Nothing is left to read from the image bytes.
        self.image = Arc::default();
        self.starts = Vec::new();
        self.counts = Vec::new();
        self.decoded.iter_mut().filter_map(OnceLock::get_mut)
    }

    /// Decodes image list `l` (empty when it is not one). Bytes that do not decode end the
    /// list, and a posting of a document the image does not hold is dropped: a damaged image
    /// that passed its checks leaves short lists, never a panic later.
    fn decode(&self, l: usize) -> Vec<Posting> {
        let (Some(&start), Some(&end), Some(&count)) = (
            self.starts.get(l),
            self.starts.get(l + 1),
            self.counts.get(l),
        ) else {
            return Vec::new();
        };
        let Some(bytes) = self.image.get(start..end) else {
            return Vec::new();
        };
        self.decoded_bytes.fetch_add(bytes.len(), Ordering::Relaxed);
        decode_postings(bytes, count as usize, self.docs)
    }

    /// Writes list `l` as an image holds it: its posting count, its byte length, its
    /// postings ([`decode_postings`] reads them). A list still as image bytes is copied.
    pub(super) fn write_list(&self, l: usize, out: &mut Vec<u8>) {
        if self.decoded.get(l).and_then(OnceLock::get).is_none() {
            if let (Some(&start), Some(&end), Some(&count)) = (
                self.starts.get(l),
                self.starts.get(l + 1),
                self.counts.get(l),
            ) {
                out.put_len(count as usize);
                out.put_len(end - start);
                out.extend_from_slice(&self.image[start..end]);
                return;
            }
        }
        let list = self.get(l);
        let mut bytes = Vec::with_capacity(list.len() * 3);
        encode_postings(list, &mut bytes);
        out.put_len(list.len());
        out.put_len(bytes.len());
        out.extend_from_slice(&bytes);
    }

    /// Reads `n` lists written by [`Lists::write_list`] from `bytes`, for an index of `docs`
    /// documents, calling `each` with every list's id before it is read (for what the image
    /// writes before each list). The postings stay as bytes until first used.
    ///
    /// # Errors
    /// [`ImageError`] when the bytes end early or a list claims more postings than its bytes
    /// can hold.
    pub(super) fn read(
        bytes: &mut Take<'_>,
        n: usize,
        docs: usize,
        mut each: impl FnMut(&mut Take<'_>) -> Result<(), crate::bytes::ImageError>,
    ) -> Result<Self, crate::bytes::ImageError> {
        // Room for every byte left (the lists are most of them): growing step by step would
        // copy a large store's postings again and again. The rest is given back below.
        let mut image = Vec::with_capacity(bytes.left());
        let (mut starts, mut counts) = (Vec::with_capacity(n + 1), Vec::with_capacity(n));
        for _ in 0..n {
            each(bytes)?;
            let count = bytes.len(3, "postings")?;
            let len = bytes.len(1, "posting bytes")?;
            // A posting takes three bytes at least.
            if count.saturating_mul(3) > len {
                return Err(crate::bytes::ImageError::Invalid(format!(
                    "{count} postings in {len} bytes"
                )));
            }
            starts.push(image.len());
            counts.push(u32::try_from(count).map_err(|_| {
                crate::bytes::ImageError::Invalid(format!("{count} postings in one list"))
            })?);
            image.extend_from_slice(bytes.bytes(len, "posting bytes")?);
        }
        starts.push(image.len());
        image.shrink_to_fit();
        let mut decoded = Vec::with_capacity(n);
        decoded.resize_with(n, OnceLock::new);
        Ok(Self {
            decoded,
            image: Arc::new(image),
            starts,
            counts,
            docs,
            decoded_bytes: AtomicUsize::new(0),
        })
    }
}

/// `tf` as a count of halves when it is one exactly (below 2²⁴, so the float holds it): what
/// weights of ½ and 1 give.
fn halves(tf: f32) -> Option<u32> {
    let h = tf * 2.0;
    let whole = (0.0..16_777_216.0).contains(&h) && h.fract() == 0.0;
    let h = whole.then_some(h as u32)?;
    ((h as f32 / 2.0).to_bits() == tf.to_bits()).then_some(h)
}

/// Appends `list`: documents as zigzag deltas (a list re-indexed out of order goes back),
/// term frequencies as whole halves when they are (a posting takes 3 bytes, not 12),
/// generations as varints.
fn encode_postings(list: &[Posting], out: &mut Vec<u8>) {
    let mut previous = 0i64;
    for &(doc, tf, generation) in list {
        let delta = i64::from(doc) - previous;
        previous = i64::from(doc);
        out.put_varint(((delta << 1) ^ (delta >> 63)) as u64);
        match halves(tf) {
            Some(h) => out.put_varint(u64::from(h) << 1),
            None => {
                out.put_varint(1);
                out.put_f32(tf);
            }
        }
        out.put_varint(u64::from(generation));
    }
}

/// Reads at most `count` postings [`encode_postings`] wrote, keeping those of documents below
/// `docs`; stops at bytes that do not decode.
fn decode_postings(bytes: &[u8], count: usize, docs: usize) -> Vec<Posting> {
    let mut take = Take::new(bytes);
    let mut list: Vec<Posting> = Vec::with_capacity(count);
    let mut previous = 0i64;
    for _ in 0..count {
        let Ok(zigzag) = take.varint("posting document") else {
            break;
        };
        let delta = (zigzag >> 1) as i64 ^ -((zigzag & 1) as i64);
        previous = previous.wrapping_add(delta);
        let Ok(code) = take.varint("term frequency") else {
            break;
        };
        let tf = if code & 1 == 0 {
            (code >> 1) as f32 / 2.0
        } else {
            match take.f32("term frequency") {
                Ok(tf) => tf,
                Err(_) => break,
            }
        };
        let Some(generation) = take
            .varint("posting generation")
            .ok()
            .and_then(|g| u32::try_from(g).ok())
        else {
            break;
        };
        if let Some(doc) = u32::try_from(previous)
            .ok()
            .filter(|d| (*d as usize) < docs)
        {
            list.push((doc, tf, generation));
        }
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Postings come back as they were written, whatever their order or frequencies.
        #[test]
        fn postings_round_trip(
            list in prop::collection::vec((0u32..1000, prop_oneof![(0u32..40).prop_map(|h| h as f32 / 2.0), any::<f32>()], any::<u32>()), 0..50),
        ) {
            let mut bytes = Vec::new();
            encode_postings(&list, &mut bytes);
            let back = decode_postings(&bytes, list.len(), 1000);
            prop_assert_eq!(back.len(), list.len());
            for (a, b) in back.iter().zip(&list) {
                prop_assert_eq!((a.0, a.1.to_bits(), a.2), (b.0, b.1.to_bits(), b.2));
            }
        }

        /// Damaged bytes give a short list of held documents, never a panic.
        #[test]
        fn damaged_postings_decode_short(bytes in prop::collection::vec(any::<u8>(), 0..64), count in 0usize..40) {
            let list = decode_postings(&bytes, count, 7);
            prop_assert!(list.len() <= count);
            prop_assert!(list.iter().all(|p| p.0 < 7));
        }
    }

    /// A list read from an image is decoded when first asked for, and an edit decodes it
    /// first; what is written again is the same bytes.
    #[test]
    fn lists_read_lazily_and_write_back_the_same() {
        let lists = [vec![(0, 1.0, 1), (3, 0.5, 2)], vec![], vec![(2, 2.5, 1)]];
        let mut bytes = Vec::new();
        for list in &lists {
            let mut payload = Vec::new();
            encode_postings(list, &mut payload);
            bytes.put_len(list.len());
            bytes.put_len(payload.len());
            bytes.extend_from_slice(&payload);
        }
        let mut read = Lists::read(&mut Take::new(&bytes), 3, 4, |_| Ok(())).unwrap();
        assert!(read.decoded.iter().all(|slot| slot.get().is_none()));
        assert!(read.is_empty_list(1) && !read.is_empty_list(0));
        let mut again = Vec::new();
        for l in 0..3 {
            read.write_list(l, &mut again);
        }
        assert_eq!(again, bytes, "copied as it was read");
        assert_eq!(read.get(2), &lists[2][..]);
        assert!(
            read.decoded[0].get().is_none(),
            "only what was asked for is decoded"
        );
        read.get_mut(0).unwrap().push((3, 1.0, 3));
        let added = read.push_empty();
        assert_eq!(added, 3);
        assert_eq!(
            read.get(0),
            &[(0u32, 1.0f32, 1u32), (3, 0.5, 2), (3, 1.0, 3)][..]
        );
        // Lists 0 and 2 decoded: most bytes are held twice, so an edit keeps only list 1's.
        read.repack();
        assert!(read.image.len() < bytes.len() / 2, "{}", read.image.len());
        let mut again = Vec::new();
        for l in 0..3 {
            read.write_list(l, &mut again);
        }
        let mut expected = Vec::new();
        for list in [read.get(0).to_vec(), lists[1].clone(), lists[2].clone()] {
            let mut payload = Vec::new();
            encode_postings(&list, &mut payload);
            expected.put_len(list.len());
            expected.put_len(payload.len());
            expected.extend_from_slice(&payload);
        }
        assert_eq!(again, expected, "the same lists after the repack");
        let all: Vec<Vec<Posting>> = read.all_mut().map(|l| l.clone()).collect();
        assert_eq!(all[1], lists[1]);
        assert_eq!(all.len(), 4);
        // A list claiming more postings than its bytes hold is refused.
        let mut bad = Vec::new();
        bad.put_len(5);
        bad.put_len(4);
        bad.extend_from_slice(&[0; 4]);
        assert!(Lists::read(&mut Take::new(&bad), 1, 4, |_| Ok(())).is_err());
    }
}
