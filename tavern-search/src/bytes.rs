//! A little-endian byte codec for saved images (an index, a store's table): what is written
//! with [`Put`] is read back with [`Take`], every read checked against what is left, so a
//! short or damaged image is an [`ImageError`], never a panic or an allocation it names.

/// Why an image could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The bytes end before the value being read.
    #[error("image ends early reading {what} ({need} bytes needed, {left} left)")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes it needed.
        need: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// A value that cannot be what was written (a wrong tag, a reference out of range).
    #[error("image is inconsistent: {0}")]
    Invalid(String),
}

/// Writing values to an image.
pub trait Put {
    /// A `u8`.
    fn put_u8(&mut self, v: u8);
    /// A `u16`.
    fn put_u16(&mut self, v: u16);
    /// A `u32`.
    fn put_u32(&mut self, v: u32);
    /// A `u64`.
    fn put_u64(&mut self, v: u64);
    /// An `f32`, bit for bit.
    fn put_f32(&mut self, v: f32);
    /// An `f64`, bit for bit.
    fn put_f64(&mut self, v: f64);
    /// A length (as a `u64`).
    fn put_len(&mut self, n: usize);
    /// A string: its length, then its bytes.
    fn put_str(&mut self, s: &str);
    /// A `u64` in 1 to 10 bytes, 7 bits each, low first (LEB128): small numbers stay small.
    fn put_varint(&mut self, v: u64);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_f32(&mut self, v: f32) {
        self.put_u32(v.to_bits());
    }
    fn put_f64(&mut self, v: f64) {
        self.put_u64(v.to_bits());
    }
    fn put_len(&mut self, n: usize) {
        self.put_u64(n as u64);
    }
    fn put_str(&mut self, s: &str) {
        self.put_len(s.len());
        self.extend_from_slice(s.as_bytes());
    }
    fn put_varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.push(v as u8);
    }
}

/// Reading an image back, front to back.
#[derive(Debug, Clone)]
pub struct Take<'a> {
    bytes: &'a [u8],
}

impl<'a> Take<'a> {
    /// Reads `bytes` from their start.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    /// How many bytes are left.
    pub fn left(&self) -> usize {
        self.bytes.len()
    }

    /// Every byte left (nothing is left after).
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// [`ImageError::Truncated`] when fewer are left.
    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ImageError> {
        if n > self.bytes.len() {
            return Err(ImageError::Truncated {
                what,
                need: n,
                left: self.bytes.len(),
            });
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ImageError> {
        let mut out = [0; N];
        out.copy_from_slice(self.bytes(N, what)?);
        Ok(out)
    }

    /// A `u8`.
    ///
    /// # Errors
    /// [`ImageError::Truncated`].
    pub fn u8(&mut self, what: &'static str) -> Result<u8, ImageError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A `u16`.
    ///
    /// # Errors
    /// [`ImageError::Truncated`].
    pub fn u16(&mut self, what: &'static str) -> Result<u16, ImageError> {
        self.array(what).map(u16::from_le_bytes)
    }

    /// A `u32`.
    ///
    /// # Errors
    /// [`ImageError::Truncated`].
    pub fn u32(&mut self, what: &'static str) -> Result<u32, ImageError> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// A `u64`.
    ///
    /// # Errors
    /// [`ImageError::Truncated`].
    pub fn u64(&mut self, what: &'static str) -> Result<u64, ImageError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// An `f32`.
    ///
    /// # Errors
    /// [`ImageError::Truncated`].
    pub fn f32(&mut self, what: &'static str) -> Result<f32, ImageError> {
        self.u32(what).map(f32::from_bits)
    }

    /// An `f64`.
    ///
    /// # Errors
    /// [`ImageError::Truncated`].
    pub fn f64(&mut self, what: &'static str) -> Result<f64, ImageError> {
        self.u64(what).map(f64::from_bits)
    }

    /// A `u64` written by [`Put::put_varint`].
    ///
    /// # Errors
    /// [`ImageError::Truncated`]; [`ImageError::Invalid`] past 10 bytes or 64 bits.
    #[inline]
    pub fn varint(&mut self, what: &'static str) -> Result<u64, ImageError> {
        // One byte, the common case, without the loop.
        if let Some((&b, rest)) = self.bytes.split_first() {
            if b < 0x80 {
                self.bytes = rest;
                return Ok(u64::from(b));
            }
        }
        let mut v = 0u64;
        for (i, &b) in self.bytes.iter().enumerate().take(10) {
            let bits = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                break;
            }
            v |= bits << (7 * i);
            if b < 0x80 {
                self.bytes = &self.bytes[i + 1..];
                return Ok(v);
            }
        }
        if self.bytes.len() < 10 && self.bytes.iter().all(|b| *b >= 0x80) {
            return Err(ImageError::Truncated {
                what,
                need: self.bytes.len() + 1,
                left: self.bytes.len(),
            });
        }
        Err(ImageError::Invalid(format!(
            "{what} is not a 64-bit varint"
        )))
    }

    /// A `bool` written as a `u8` (0 or 1).
    ///
    /// # Errors
    /// [`ImageError::Truncated`]; [`ImageError::Invalid`] for another byte.
    pub fn flag(&mut self, what: &'static str) -> Result<bool, ImageError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(ImageError::Invalid(format!(
                "{what} is {other}, not 0 or 1"
            ))),
        }
    }

    /// A count of items of at least `item` bytes each: refused when the bytes left cannot
    /// hold that many, so a damaged count never asks for a huge allocation.
    ///
    /// # Errors
    /// [`ImageError::Truncated`].
    pub fn len(&mut self, item: usize, what: &'static str) -> Result<usize, ImageError> {
        let n = self.u64(what)?;
        let left = self.bytes.len();
        match usize::try_from(n) {
            Ok(n) if n.saturating_mul(item.max(1)) <= left => Ok(n),
            _ => Err(ImageError::Truncated {
                what,
                need: usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(item.max(1)),
                left,
            }),
        }
    }

    /// A string written by [`Put::put_str`].
    ///
    /// # Errors
    /// [`ImageError::Truncated`]; [`ImageError::Invalid`] when it is not UTF-8.
    pub fn str(&mut self, what: &'static str) -> Result<&'a str, ImageError> {
        let n = self.len(1, what)?;
        std::str::from_utf8(self.bytes(n, what)?)
            .map_err(|_| ImageError::Invalid(format!("{what} is not utf-8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value comes back as written; reading past the end or a count the bytes cannot
    /// hold is an error, not a panic.
    #[test]
    fn values_come_back_and_short_input_is_an_error() {
        let mut out = Vec::new();
        out.put_u8(7);
        out.put_u16(65_000);
        out.put_u32(4_000_000_000);
        out.put_u64(u64::MAX - 3);
        out.put_f32(-0.0);
        out.put_f64(f64::NAN);
        out.put_str("灯笼 lantern");
        out.put_u8(1);
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            out.put_varint(v);
        }
        let mut r = Take::new(&out);
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.u16("b").unwrap(), 65_000);
        assert_eq!(r.u32("c").unwrap(), 4_000_000_000);
        assert_eq!(r.u64("d").unwrap(), u64::MAX - 3);
        assert_eq!(r.f32("e").unwrap().to_bits(), (-0.0f32).to_bits());
        assert!(r.f64("f").unwrap().is_nan());
        assert_eq!(r.str("g").unwrap(), "灯笼 lantern");
        assert!(r.flag("h").unwrap());
        for v in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(r.varint("v").unwrap(), v);
        }
        assert_eq!(r.left(), 0);
        // Cut short, or longer than 64 bits: refused.
        assert!(Take::new(&[0x80, 0x80]).varint("v").is_err());
        assert!(Take::new(&[0xff; 11]).varint("v").is_err());
        assert!(
            Take::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02])
                .varint("v")
                .is_err()
        );
        assert!(matches!(
            r.u32("past the end"),
            Err(ImageError::Truncated {
                what: "past the end",
                need: 4,
                left: 0
            })
        ));
        let mut huge = Vec::new();
        huge.put_u64(u64::MAX);
        assert!(Take::new(&huge).len(12, "postings").is_err());
        let mut bad = Vec::new();
        bad.put_u8(2);
        assert!(matches!(
            Take::new(&bad).flag("alive"),
            Err(ImageError::Invalid(_))
        ));
    }
}
