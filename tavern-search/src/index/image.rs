//! The index as bytes and back ([`Bm25Index::write_image`], [`Bm25Index::read_image`]): what
//! a store saves so that opening it does not tokenize and index every record again. The image
//! holds the index exactly (scores after reading it are bit-identical); only the block maps of
//! chat-like indexes are rebuilt from their lists. It comes in two parts: what an open reads
//! (documents, groups, term keys, and per posting list its count, length and checksum) and
//! the postings themselves, which the caller stores apart (after the rest of its file) and
//! hands back as a [`Region`] read when a list is first needed ([`super::lists`]). Reading
//! checks every reference (documents, lists, groups); a posting list that does not decode ends
//! where it stops decoding, one whose bytes fail their checksum decodes as empty and marks the
//! index damaged ([`Bm25Index::damaged`]), and a posting of a document the image does not hold
//! is dropped, so a damaged image (the store's checksum stops what an open reads, the lists'
//! own checksums the postings) is an error, short lists or a damaged mark, never a panic.

use rustc_hash::FxHashMap;

use super::lists::Lists;
use super::terms::Terms;
use super::{top, Bm25Index, GroupLists, GroupStats, Shard, SHARDS};
use crate::bytes::{ImageError, Put, Take};
use crate::region::Region;

/// The first bytes of an index image and its format version.
const MAGIC: &[u8; 8] = b"tvbm25\0\x05";

fn invalid(message: String) -> ImageError {
    ImageError::Invalid(message)
}

impl Bm25Index {
    /// Appends the index's image to `out` and its postings to `postings`
    /// ([`Bm25Index::read_image`] reads them back: the postings as a [`Region`] holding what
    /// was appended to `postings`, from where it was before). `false` when a posting list
    /// copied from the image this index was read from failed its checksum (written as
    /// empty, the index marked [`Bm25Index::damaged`]): what was appended is not to be kept.
    #[must_use]
    pub fn write_image(&self, out: &mut Vec<u8>, postings: &mut Vec<u8>) -> bool {
        out.extend_from_slice(MAGIC);
        let n = self.generation.len();
        out.put_len(n);
        for i in 0..n {
            out.put_u32(self.generation[i]);
            out.put_f32(self.doc_len.get(i).copied().unwrap_or(0.0));
            out.put_u32(self.group.get(i).copied().unwrap_or(0));
            out.put_u8(u8::from(self.alive.get(i).copied().unwrap_or(false)));
        }
        out.put_u32(self.live_docs);
        out.put_f64(self.total_len);
        out.put_len(self.groups.len());
        for g in &self.groups {
            out.put_u32(g.docs);
            out.put_f64(g.len);
        }
        out.put_len(self.dead_docs);
        out.put_u8(u8::from(self.stale));
        out.put_len(self.dirty.len());
        for word in &self.dirty {
            out.put_u64(*word);
        }
        out.put_u8(u8::from(self.last.is_some()));
        out.put_u32(self.last.unwrap_or(0));
        out.put_u32(self.next_doc);
        out.put_u8(u8::from(self.exact_only));
        out.put_u8(u8::from(self.bounds_broken));
        out.put_u8(u8::from(self.min_len.is_some()));
        out.put_f32(self.min_len.unwrap_or(0.0));
        for shard in &self.shards {
            shard.write_image(out, postings);
        }
        !self.damaged()
    }

    /// Reads an index written by [`Bm25Index::write_image`] from the front of `bytes`, its
    /// postings lying in `postings` (read there when first needed, so the region's source
    /// must stay as it is for as long as the index is used).
    ///
    /// # Errors
    /// [`ImageError`] when the bytes are not such an image, end early, or refer to documents,
    /// lists or groups they do not hold, or to postings beyond `postings` (postings are
    /// checked when first decoded: against their checksum, and one of a document the image
    /// does not hold is dropped then).
    pub fn read_image(bytes: &mut Take<'_>, postings: &Region) -> Result<Self, ImageError> {
        if bytes.bytes(MAGIC.len(), "index image header")? != MAGIC {
            return Err(invalid("not an index image of this version".into()));
        }
        let n = bytes.len(13, "documents")?;
        let mut index = Self {
            generation: Vec::with_capacity(n),
            doc_len: Vec::with_capacity(n),
            group: Vec::with_capacity(n),
            alive: Vec::with_capacity(n),
            ..Self::default()
        };
        for _ in 0..n {
            index.generation.push(bytes.u32("generation")?);
            index.doc_len.push(bytes.f32("document length")?);
            index.group.push(bytes.u32("document group")?);
            index.alive.push(bytes.flag("document alive")?);
        }
        index.live_docs = bytes.u32("live documents")?;
        index.total_len = bytes.f64("total length")?;
        let groups = bytes.len(12, "groups")?;
        index.groups = (0..groups)
            .map(|_| {
                Ok(GroupStats {
                    docs: bytes.u32("group documents")?,
                    len: bytes.f64("group length")?,
                })
            })
            .collect::<Result<_, ImageError>>()?;
        index.dead_docs = usize::try_from(bytes.u64("dead documents")?)
            .map_err(|_| invalid("dead documents out of range".into()))?;
        index.stale = bytes.flag("stale")?;
        let dirty = bytes.len(8, "dirty words")?;
        index.dirty = (0..dirty)
            .map(|_| bytes.u64("dirty word"))
            .collect::<Result<_, _>>()?;
        let has_last = bytes.flag("has last")?;
        let last = bytes.u32("last")?;
        index.last = has_last.then_some(last);
        index.next_doc = bytes.u32("next document")?;
        index.exact_only = bytes.flag("exact only")?;
        index.bounds_broken = bytes.flag("bounds broken")?;
        let has_min = bytes.flag("has shortest length")?;
        let min_len = bytes.f32("shortest length")?;
        index.min_len = has_min.then_some(min_len);
        let mut shards = Vec::with_capacity(SHARDS);
        let mut at = 0;
        for _ in 0..SHARDS {
            shards.push(Shard::read_image(bytes, n, postings, &mut at)?);
        }
        if at != postings.len() {
            return Err(invalid(format!(
                "{} bytes of postings after the lists",
                postings.len() - at
            )));
        }
        index.shards = shards
            .try_into()
            .map_err(|_| invalid("shard count".into()))?;
        index.check()?;
        Ok(index)
    }

    /// Whether a posting list read from the image's region could not be read or failed its
    /// checksum: it was taken as empty, so searches may miss documents. The owner rebuilds the
    /// index from its documents' texts, and saves no image of this one.
    pub fn damaged(&self) -> bool {
        self.shards.iter().any(|s| s.postings.damaged())
    }

    /// Reads every posting list not read yet (each shard's in one read, decoding none) and
    /// says whether all pass their checksums: what an integrity check asks of an index read
    /// from an image.
    pub fn postings_whole(&self) -> bool {
        self.shards.iter().all(|s| s.postings.verify())
    }

    /// Every live document and its group, by document.
    pub fn live_documents(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.alive
            .iter()
            .zip(&self.group)
            .enumerate()
            .filter(|(_, (alive, _))| **alive)
            .filter_map(|(doc, (_, group))| Some((u32::try_from(doc).ok()?, *group)))
    }

    /// What every operation on the index takes for granted of a read image.
    fn check(&self) -> Result<(), ImageError> {
        let n = self.generation.len();
        if self.next_doc as usize > n || self.last.is_some_and(|d| d as usize >= n) {
            return Err(invalid(format!(
                "next or last document beyond the {n} documents held"
            )));
        }
        let mut live = 0u32;
        let mut per_group = vec![0u32; self.groups.len()];
        for (i, &alive) in self.alive.iter().enumerate() {
            let g = self.group[i] as usize;
            let Some(count) = per_group.get_mut(g) else {
                return Err(invalid(format!("document {i} in unknown group {g}")));
            };
            if alive {
                live += 1;
                *count += 1;
            }
        }
        let counts_agree = self
            .groups
            .iter()
            .zip(&per_group)
            .all(|(g, n)| g.docs == *n);
        if live != self.live_docs || !counts_agree {
            return Err(invalid(
                "live document counts disagree with the documents".into(),
            ));
        }
        Ok(())
    }
}

impl Shard {
    fn write_image(&self, out: &mut Vec<u8>, postings: &mut Vec<u8>) {
        out.put_len(self.map_block);
        // Terms by key (read back numbered so), each with its lists.
        Terms::write(&self.terms.sorted(), out, |id, out| {
            let pairs: Vec<(u32, u32)> = match self.lists.get(id as usize) {
                None | Some(GroupLists::Empty) => Vec::new(),
                Some(GroupLists::One { group, list }) => vec![(*group, *list)],
                Some(GroupLists::Many(all)) => all.to_vec(),
            };
            out.put_len(pairs.len());
            for (group, list) in pairs {
                out.put_u32(group);
                out.put_u32(list);
            }
        });
        out.put_len(self.postings.len());
        self.postings.write_all(out, postings, |list, out| {
            out.put_f32(self.max_tf.get(list).copied().unwrap_or(0.0));
        });
        out.put_len(self.doc_postings.len());
        for count in &self.doc_postings {
            out.put_u16(*count);
        }
    }

    fn read_image(
        bytes: &mut Take<'_>,
        docs: usize,
        postings: &Region,
        at: &mut u64,
    ) -> Result<Self, ImageError> {
        let map_block = usize::try_from(bytes.u64("block size")?)
            .map_err(|_| invalid("block size out of range".into()))?;
        let mut lists = Vec::new();
        let terms = Terms::read(bytes, |bytes| {
            let pairs = bytes.len(8, "term lists")?;
            let mut all = Vec::with_capacity(pairs);
            for _ in 0..pairs {
                all.push((bytes.u32("list group")?, bytes.u32("list id")?));
            }
            if !all.windows(2).all(|w| w[0].0 < w[1].0) {
                return Err(invalid(format!(
                    "term {}'s lists are not by group",
                    lists.len()
                )));
            }
            lists.push(match all.len() {
                0 => GroupLists::Empty,
                1 => GroupLists::One {
                    group: all[0].0,
                    list: all[0].1,
                },
                _ => GroupLists::Many(Box::new(all)),
            });
            Ok(())
        })?;
        lists.shrink_to_fit();
        let mut shard = Self {
            map_block,
            terms,
            lists,
            ..Self::default()
        };
        // Largest frequency, count, length, checksum.
        let lists = bytes.len(10, "posting lists")?;
        shard.max_tf.reserve_exact(lists);
        // The postings stay where they lie until a search or an edit needs them.
        let max_tf = &mut shard.max_tf;
        shard.postings = Lists::read(bytes, lists, docs, postings, at, |bytes| {
            max_tf.push(bytes.f32("largest term frequency")?);
            Ok(())
        })?;
        let named_lists_exist = shard
            .lists
            .iter()
            .all(|l| l.lists().all(|list| (list as usize) < lists));
        if !named_lists_exist {
            return Err(invalid(
                "a term names a list the image does not hold".into(),
            ));
        }
        let counts = bytes.len(2, "document posting counts")?;
        shard.doc_postings = (0..counts)
            .map(|_| bytes.u16("document posting count"))
            .collect::<Result<_, _>>()?;
        // Block maps are rebuilt for the lists long enough to keep one (every list decoded:
        // chat-like indexes are small, and a search of one walks most of them).
        if shard.map_block > 0 {
            // Every list decoded and kept first (the region is of no more use), then mapped.
            shard.postings.decode_all();
            let mut maps = FxHashMap::default();
            for list in 0..shard.postings.len() {
                let id = u32::try_from(list).map_err(|_| invalid("too many lists".into()))?;
                top::BlockMap::rebuild(&mut maps, id, &shard.postings.get(list), shard.map_block);
            }
            shard.maps = maps;
        }
        Ok(shard)
    }
}
