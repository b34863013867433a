//! Just enough PNG to find text chunks: walk the chunk list, no pixel decoding, no CRC
//! enforcement (real cards are sometimes re-saved by tools that get it wrong).

use super::AssetError;

const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// The `tEXt` chunks of a PNG as `(keyword, text bytes)`, in file order, wherever they sit
/// (before or after the image data).
///
/// # Errors
/// [`AssetError::BadPng`] for a missing signature or a chunk running past the end.
pub fn text_chunks(name: &str, bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, AssetError> {
    let bad = |reason: &str| AssetError::BadPng {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if bytes.get(..8) != Some(&SIGNATURE[..]) {
        return Err(bad("missing png signature"));
    }
    let mut out = Vec::new();
    let mut pos = 8usize;
    while pos < bytes.len() {
        let header = bytes
            .get(pos..pos + 8)
            .ok_or_else(|| bad("truncated chunk header"))?;
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let kind = &header[4..8];
        let data_end = pos
            .checked_add(8)
            .and_then(|p| p.checked_add(len))
            .ok_or_else(|| bad("chunk length overflows"))?;
        let data = bytes
            .get(pos + 8..data_end)
            .ok_or_else(|| bad("chunk runs past the end of the file"))?;
        if kind == b"tEXt" {
            if let Some(nul) = data.iter().position(|b| *b == 0) {
                // tEXt keywords are Latin-1; card keywords are ASCII.
                let keyword: String = data[..nul].iter().map(|b| char::from(*b)).collect();
                out.push((keyword, data[nul + 1..].to_vec()));
            }
        }
        if kind == b"IEND" {
            break;
        }
        pos = data_end + 4; // skip the CRC
    }
    Ok(out)
}
