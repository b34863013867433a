//! A shard's posting lists by list id, those of an image read where they lie (a [`Region`]
//! of the store's image file) when a search or an edit first needs them: opening a large
//! store reads and copies none of the postings (about 3 bytes a posting), and most lists are
//! never read between two opens. A list is decoded once, by whichever call needs it first
//! (searches share the shard, so the decoding is behind a [`OnceLock`]); it is checked against
//! its checksum first, and one that cannot be read or fails it decodes as empty and marks the
//! lists damaged ([`Lists::damaged`]: the owner rebuilds the index from its records).
//! Decoded lists are kept while they hold at most [`KEPT_POSTINGS`] postings in all; past
//! that a list is decoded for the call that reads it and dropped after, so a long-lived
//! process searching a large store does not come to hold every list it ever read decoded
//! (12 bytes a posting, four times their encoded size).

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::Posting;
use crate::bytes::{ImageError, Put, Take};
use crate::region::{checksum as check, Region};

/// How many decoded postings of image lists a shard keeps (12 bytes each: 24 MiB), in lists
/// decoded whole while they fit; lists made or changed since the image are always kept.
pub(super) const KEPT_POSTINGS: usize = 1 << 21;

/// Posting lists by list id.
#[derive(Default)]
pub(super) struct Lists {
    decoded: Vec<OnceLock<Vec<Posting>>>,
    /// How many postings of image lists decoded for a read are kept in `decoded` (counted
    /// before they are placed: at most `keep_limit`).
    kept: AtomicUsize,
    /// [`KEPT_POSTINGS`] for lists read from an image.
    keep_limit: usize,
    /// Where the image lists' encoded postings lie, one after the other.
    region: Region,
    /// Per image list, where its bytes start in `region`, and one past the last list's end;
    /// lists past the image's (made since) always are decoded.
    starts: Vec<u64>,
    /// Per image list, how many postings it holds (known without decoding it).
    counts: Vec<u32>,
    /// Per image list, its bytes' checksum ([`check`]).
    checks: Vec<u32>,
    /// Documents the image held: a posting of another is dropped when decoded.
    docs: usize,
    /// Whether an image list could not be read or failed its checksum (it decoded as empty).
    damaged: AtomicBool,
}

impl Clone for Lists {
    fn clone(&self) -> Self {
        Self {
            decoded: self.decoded.clone(),
            kept: AtomicUsize::new(self.kept.load(Ordering::Relaxed)),
            keep_limit: self.keep_limit,
            region: self.region.clone(),
            starts: self.starts.clone(),
            counts: self.counts.clone(),
            checks: self.checks.clone(),
            docs: self.docs,
            damaged: AtomicBool::new(self.damaged()),
        }
    }
}

impl fmt::Debug for Lists {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lists")
            .field("lists", &self.decoded.len())
            .field("image_lists", &self.counts.len())
            .field("region", &self.region)
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

    /// List `l`'s postings, decoded now if they are not yet (an unknown id has none): kept
    /// decoded while the shard's kept postings stay within [`KEPT_POSTINGS`], otherwise
    /// decoded for the caller alone.
    pub(super) fn get(&self, l: usize) -> Cow<'_, [Posting]> {
        let Some(slot) = self.decoded.get(l) else {
            return Cow::Borrowed(&[]);
        };
        if let Some(list) = slot.get() {
            return Cow::Borrowed(list);
        }
        let list = self.decode(l);
        let n = list.len();
        let room = self
            .kept
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |kept| {
                kept.checked_add(n).filter(|k| *k <= self.keep_limit)
            })
            .is_ok();
        if !room {
            return Cow::Owned(list);
        }
        if slot.set(list).is_err() {
            // Another call placed it first: its postings are counted once.
            self.kept.fetch_sub(n, Ordering::Relaxed);
        }
        match slot.get() {
            Some(list) => Cow::Borrowed(list),
            None => Cow::Borrowed(&[]),
        }
    }

    /// Keeps at most `n` decoded postings of image lists from now on (tests of what is not
    /// kept, with lists of a few postings).
    #[cfg(test)]
    pub(super) fn keep_at_most(&mut self, n: usize) {
        self.keep_limit = n;
    }

    /// Whether list `l` is held decoded (made since the image, changed, or kept after a
    /// read).
    #[cfg(test)]
    pub(super) fn is_decoded(&self, l: usize) -> bool {
        self.decoded.get(l).is_some_and(|slot| slot.get().is_some())
    }

    /// List `l` to change, decoded first if it is not yet; `None` for an unknown id.
    pub(super) fn get_mut(&mut self, l: usize) -> Option<&mut Vec<Posting>> {
        if self.decoded.get(l)?.get().is_none() {
            let list = self.decode(l);
            self.decoded[l] = OnceLock::from(list);
        }
        self.decoded.get_mut(l)?.get_mut()
    }

    /// Decodes every list, so the image's region is no longer read (chat-like indexes, whose
    /// searches walk most lists, and compactions, which rewrite them all).
    pub(super) fn decode_all(&mut self) {
        for l in 0..self.decoded.len() {
            if self.decoded[l].get().is_none() {
                let list = self.decode(l);
                self.decoded[l] = OnceLock::from(list);
            }
        }
        self.region = Region::default();
        self.starts = Vec::new();
        self.counts = Vec::new();
        self.checks = Vec::new();
    }

    /// Every list to change (all decoded first: a compaction rewrites them all).
    pub(super) fn all_mut(&mut self) -> impl Iterator<Item = &mut Vec<Posting>> + '_ {
        self.decode_all();
        self.decoded.iter_mut().filter_map(OnceLock::get_mut)
    }

    /// Whether an image list could not be read or failed its checksum: it decoded as empty,
    /// so the index no longer holds every posting it should.
    pub(super) fn damaged(&self) -> bool {
        self.damaged.load(Ordering::Relaxed)
    }

    /// The image lists' bytes, all of them, in one read (`None`, the lists marked damaged, when
    /// they cannot be read) and where they begin in the region.
    fn all_bytes(&self) -> Option<(Vec<u8>, u64)> {
        let (first, last) = (*self.starts.first()?, *self.starts.last()?);
        let bytes = usize::try_from(last.saturating_sub(first))
            .ok()
            .and_then(|len| self.region.read(first, len).ok());
        if bytes.is_none() {
            self.damaged.store(true, Ordering::Relaxed);
        }
        Some((bytes?, first))
    }

    /// Image list `l`'s bytes within `all` (read from `first` on), when they pass their check;
    /// `None`, the lists marked damaged, otherwise.
    fn checked_in<'a>(&self, all: &'a [u8], first: u64, l: usize) -> Option<&'a [u8]> {
        let raw = self.image_list(l).and_then(|(start, len, _, expected)| {
            let at = usize::try_from(start.checked_sub(first)?).ok()?;
            all.get(at..at.checked_add(len)?)
                .filter(|raw| check(raw) == expected)
        });
        if raw.is_none() {
            self.damaged.store(true, Ordering::Relaxed);
        }
        raw
    }

    /// Checks every image list not decoded yet against its checksum, reading them in one go
    /// and decoding none; whether all passed (those that fail mark the lists damaged).
    pub(super) fn verify(&self) -> bool {
        let undecoded: Vec<usize> = (0..self.counts.len())
            .filter(|&l| self.decoded[l].get().is_none())
            .collect();
        if !undecoded.is_empty() {
            if let Some((all, first)) = self.all_bytes() {
                for l in undecoded {
                    let _ = self.checked_in(&all, first, l);
                }
            }
        }
        !self.damaged()
    }

    /// Where image list `l`'s bytes lie in the region, how many postings and what checksum
    /// it has; `None` when it is not one.
    fn image_list(&self, l: usize) -> Option<(u64, usize, usize, u32)> {
        let (&start, &end) = (self.starts.get(l)?, self.starts.get(l + 1)?);
        let len = usize::try_from(end.checked_sub(start)?).ok()?;
        Some((
            start,
            len,
            *self.counts.get(l)? as usize,
            *self.checks.get(l)?,
        ))
    }

    /// Image list `l`'s bytes, read and checked; `None` (the lists marked damaged) when they
    /// cannot be read or fail their checksum.
    fn image_bytes(&self, start: u64, len: usize, expected: u32) -> Option<Vec<u8>> {
        match self.region.read(start, len) {
            Ok(bytes) if check(&bytes) == expected => Some(bytes),
            _ => {
                self.damaged.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// Decodes image list `l` (empty when it is not one, or when its bytes cannot be read or
    /// fail their checksum). Bytes that do not decode end the list, and a posting of a
    /// document the image does not hold is dropped: never a panic later.
    fn decode(&self, l: usize) -> Vec<Posting> {
        let Some((start, len, count, expected)) = self.image_list(l) else {
            // An image list whose place cannot be told (a length beyond this platform's
            // sizes) is damage too; a list of none is empty.
            if l < self.counts.len() {
                self.damaged.store(true, Ordering::Relaxed);
            }
            return Vec::new();
        };
        match self.image_bytes(start, len, expected) {
            Some(bytes) => decode_postings(&bytes, count, self.docs),
            None => Vec::new(),
        }
    }

    /// Writes every list as an image holds it: in `out` (after what `before` writes of each)
    /// its posting count, byte length and checksum, in `tail` its postings
    /// ([`decode_postings`] reads them). A list still in the image's region is copied from
    /// it (read in one go), checked first: one that fails is written as it decodes (empty)
    /// and the lists are marked damaged.
    pub(super) fn write_all(
        &self,
        out: &mut Vec<u8>,
        tail: &mut Vec<u8>,
        mut before: impl FnMut(usize, &mut Vec<u8>),
    ) {
        let undecoded = (0..self.counts.len()).any(|l| self.decoded[l].get().is_none());
        // One read of this shard's lists rather than one per list (a large store holds
        // hundreds of thousands of lists, most never decoded).
        let all = if undecoded { self.all_bytes() } else { None };
        let mut bytes = Vec::new();
        for l in 0..self.decoded.len() {
            before(l, out);
            if self.decoded[l].get().is_none() && l < self.counts.len() {
                let raw = all
                    .as_ref()
                    .and_then(|(all, first)| self.checked_in(all, *first, l));
                if let (Some(raw), Some((_, _, count, expected))) = (raw, self.image_list(l)) {
                    out.put_varint(count as u64);
                    out.put_varint(raw.len() as u64);
                    out.put_u32(expected);
                    tail.extend_from_slice(raw);
                    continue;
                }
                self.damaged.store(true, Ordering::Relaxed);
            }
            let list = match self.decoded[l].get() {
                Some(list) => list.as_slice(),
                None => &[],
            };
            bytes.clear();
            encode_postings(list, &mut bytes);
            out.put_varint(list.len() as u64);
            out.put_varint(bytes.len() as u64);
            out.put_u32(check(&bytes));
            tail.extend_from_slice(&bytes);
        }
    }

    /// Reads `n` lists written by [`Lists::write_all`] from `bytes`, their postings lying in
    /// `region` from `*at` on (moved past them), for an index of `docs` documents, calling
    /// `each` with the bytes before each list (what the image writes before it). The
    /// postings are read when first used.
    ///
    /// # Errors
    /// [`ImageError`] when the bytes end early, a list claims more postings than its bytes
    /// can hold, or the lists run past the region.
    pub(super) fn read(
        bytes: &mut Take<'_>,
        n: usize,
        docs: usize,
        region: &Region,
        at: &mut u64,
        mut each: impl FnMut(&mut Take<'_>) -> Result<(), ImageError>,
    ) -> Result<Self, ImageError> {
        let mut starts = Vec::with_capacity(n + 1);
        let (mut counts, mut checks) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            each(bytes)?;
            let count = bytes.varint("postings")?;
            let len = bytes.varint("posting bytes")?;
            // A posting takes three bytes at least.
            if count.saturating_mul(3) > len {
                return Err(ImageError::Invalid(format!(
                    "{count} postings in {len} bytes"
                )));
            }
            starts.push(*at);
            counts.push(
                u32::try_from(count)
                    .map_err(|_| ImageError::Invalid(format!("{count} postings in one list")))?,
            );
            checks.push(bytes.u32("posting list checksum")?);
            *at = at
                .checked_add(len)
                .filter(|end| *end <= region.len())
                .ok_or_else(|| {
                    ImageError::Invalid(format!(
                        "posting lists run past their {} bytes",
                        region.len()
                    ))
                })?;
        }
        starts.push(*at);
        let mut decoded = Vec::with_capacity(n);
        decoded.resize_with(n, OnceLock::new);
        Ok(Self {
            decoded,
            kept: AtomicUsize::new(0),
            keep_limit: KEPT_POSTINGS,
            region: region.clone(),
            starts,
            counts,
            checks,
            docs,
            damaged: AtomicBool::new(false),
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

    /// Lists made one by one, holding `lists`.
    fn made_of(lists: &[Vec<Posting>]) -> Lists {
        let mut made = Lists::default();
        for list in lists {
            let l = made.push_empty();
            made.get_mut(l as usize).unwrap().extend_from_slice(list);
        }
        made
    }

    fn write(lists: &Lists) -> (Vec<u8>, Vec<u8>) {
        let (mut out, mut tail) = (Vec::new(), Vec::new());
        lists.write_all(&mut out, &mut tail, |_, _| {});
        (out, tail)
    }

    fn read_back(out: &[u8], tail: Vec<u8>, n: usize) -> Result<Lists, ImageError> {
        let region = Region::in_memory(tail);
        let mut at = 0;
        Lists::read(&mut Take::new(out), n, 4, &region, &mut at, |_| Ok(()))
    }

    /// Past the postings a shard keeps decoded, a list read is decoded for its caller alone
    /// (the same postings each time, never kept); one changed is kept whatever the limit, and
    /// the image written again holds every list as it is.
    #[test]
    fn lists_past_the_kept_postings_are_decoded_for_each_read() {
        let lists = [
            vec![(0, 1.0, 1), (3, 0.5, 2)],
            vec![(1, 1.0, 1)],
            vec![(2, 2.5, 1)],
        ];
        let made = made_of(&lists);
        let (out, tail) = write(&made);
        let mut read = read_back(&out, tail.clone(), 3).unwrap();
        read.keep_at_most(2);
        assert!(matches!(read.get(0), Cow::Borrowed(l) if l == &lists[0][..]));
        assert!(read.is_decoded(0), "the first two postings are kept");
        for _ in 0..2 {
            assert!(matches!(read.get(2), Cow::Owned(l) if l == lists[2]));
            assert!(!read.is_decoded(2), "past the limit: decoded, not kept");
        }
        read.get_mut(1).unwrap().push((2, 1.0, 1));
        assert!(
            read.is_decoded(1),
            "a changed list is kept whatever the limit"
        );
        assert_eq!(read.get(1), &[(1u32, 1.0f32, 1u32), (2, 1.0, 1)][..]);
        let again = {
            let (out, tail) = write(&read);
            read_back(&out, tail, 3).unwrap()
        };
        assert_eq!(again.get(0), &lists[0][..]);
        assert_eq!(again.get(1), read.get(1));
        assert_eq!(again.get(2), &lists[2][..]);
        assert!(
            read.verify(),
            "lists not kept are still checked where they lie"
        );
    }

    /// A list read from an image is decoded when first asked for, and an edit decodes it
    /// first; what is written again is the same bytes; one whose bytes fail their checksum
    /// decodes as empty and marks the lists damaged.
    #[test]
    fn lists_read_lazily_and_write_back_the_same() {
        let lists = [vec![(0, 1.0, 1), (3, 0.5, 2)], vec![], vec![(2, 2.5, 1)]];
        let made = made_of(&lists);
        let (out, tail) = write(&made);
        let mut read = read_back(&out, tail.clone(), 3).unwrap();
        assert!(read.decoded.iter().all(|slot| slot.get().is_none()));
        assert!(read.is_empty_list(1) && !read.is_empty_list(0));
        assert_eq!(write(&read), (out.clone(), tail.clone()), "copied as read");
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
        let mut expected = Lists::default();
        for list in [
            read.get(0).to_vec(),
            lists[1].clone(),
            lists[2].clone(),
            vec![],
        ] {
            let l = expected.push_empty();
            expected
                .get_mut(l as usize)
                .unwrap()
                .extend_from_slice(&list);
        }
        assert_eq!(
            write(&read),
            write(&expected),
            "a mix of copied and encoded"
        );
        assert!(!read.damaged());
        let all: Vec<Vec<Posting>> = read.all_mut().map(|l| l.clone()).collect();
        assert_eq!(all[1], lists[1]);
        assert_eq!(all.len(), 4);

        // One byte of list 2 changed: list 0 still reads, list 2 is empty and marks damage;
        // written again, it is refused by its checksum too.
        let mut bad = tail.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let damaged = read_back(&out, bad.clone(), 3).unwrap();
        assert_eq!(damaged.get(0), &lists[0][..]);
        assert!(!damaged.damaged());
        assert!(damaged.get(2).is_empty());
        assert!(damaged.damaged());
        let copied = read_back(&out, bad, 3).unwrap();
        let _ = write(&copied);
        assert!(
            copied.damaged(),
            "a list copied when writing is checked too"
        );
        // Lists claiming more postings than their bytes hold, or bytes past the region, are
        // refused.
        let mut claims = Vec::new();
        claims.put_varint(5);
        claims.put_varint(4);
        claims.put_u32(0);
        assert!(read_back(&claims, vec![0; 4], 1).is_err());
        assert!(read_back(&out, tail[..tail.len() - 1].to_vec(), 3).is_err());
    }
}
