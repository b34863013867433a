//! Bytes of an image read where they lie, when first needed: the posting lists of a saved
//! index stay in the store's file (or any [`ReadAt`]) instead of being copied onto the heap
//! at open.

use std::fmt;
use std::sync::Arc;

/// Something whose bytes can be read at an offset — a file the caller keeps open, or bytes
/// in memory. A store's image file is never written in place (a new image replaces it by
/// rename), so what is read later is what was there at open; the lists it holds carry their
/// own checksums all the same.
pub trait ReadAt: Send + Sync {
    /// Fills `buf` with the bytes at `offset`.
    ///
    /// # Errors
    /// Any I/O error, and [`std::io::ErrorKind::UnexpectedEof`] when fewer bytes lie there.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let slice = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(slice);
        Ok(())
    }
}

/// The checksum of an item read where it lies (a posting list, a record): the low half of
/// its bytes' XXH3-64, taken when the item is written or first read, checked when it is read
/// again.
pub fn checksum(bytes: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(bytes) as u32
}

/// A stretch of a [`ReadAt`]: `len` bytes from `offset`.
#[derive(Clone)]
pub struct Region {
    source: Arc<dyn ReadAt>,
    offset: u64,
    len: u64,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Default for Region {
    /// No bytes.
    fn default() -> Self {
        Self::in_memory(Vec::new())
    }
}

impl Region {
    /// `len` bytes of `source` from `offset`.
    pub fn new(source: Arc<dyn ReadAt>, offset: u64, len: u64) -> Self {
        Self {
            source,
            offset,
            len,
        }
    }

    /// All of `bytes`.
    pub fn in_memory(bytes: Vec<u8>) -> Self {
        let len = bytes.len() as u64;
        Self::new(Arc::new(bytes), 0, len)
    }

    /// The `len` bytes from `at` of this region, as a region of their own; `None` when they
    /// run past it.
    pub fn sub(&self, at: u64, len: u64) -> Option<Region> {
        let end = at.checked_add(len)?;
        let offset = self.offset.checked_add(at)?;
        (end <= self.len).then(|| Self::new(self.source.clone(), offset, len))
    }

    /// How many bytes the region holds.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `len` bytes at `at` in the region.
    ///
    /// # Errors
    /// [`std::io::ErrorKind::UnexpectedEof`] for bytes beyond the region, or the source's
    /// error.
    pub fn read(&self, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let end = at.checked_add(len as u64);
        let offset = self.offset.checked_add(at);
        let Some(offset) = offset.filter(|_| end.is_some_and(|end| end <= self.len)) else {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        };
        // The region's length is the caller's word (a file's, checked against its size): a
        // length no allocation can hold is an error, not an abort.
        let mut buf = Vec::new();
        buf.try_reserve_exact(len)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        buf.resize(len, 0);
        self.source.read_at(offset, &mut buf)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_reads_only_its_own_bytes() {
        let region = Region::new(Arc::new(b"headerLISTStail".to_vec()), 6, 5);
        assert_eq!(region.read(0, 5).unwrap(), b"LISTS");
        assert_eq!(region.read(1, 2).unwrap(), b"IS");
        assert_eq!(region.read(5, 0).unwrap(), b"");
        for (at, len) in [(0, 6), (5, 1), (u64::MAX, 2)] {
            let e = region.read(at, len).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{at} {len}");
        }
        // A region claiming more than its source holds fails when read, not before.
        let long = Region::new(Arc::new(vec![1, 2, 3]), 1, 10);
        assert_eq!(long.read(0, 2).unwrap(), vec![2, 3]);
        assert!(long.read(1, 3).is_err());
        let sub = region.sub(1, 3).unwrap();
        assert_eq!(sub.read(0, 3).unwrap(), b"IST");
        assert!(
            sub.read(1, 3).is_err(),
            "a sub-region reads only its own bytes"
        );
        assert!(region.sub(3, 3).is_none() && region.sub(u64::MAX, 2).is_none());
        assert_eq!(region.sub(5, 0).unwrap().len(), 0);
    }
}
