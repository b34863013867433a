//! SillyTavern asset formats, read from real files: character cards (V1/V2/V3, JSON or PNG),
//! world info books (current, old and KoboldAI shapes, and books embedded in cards).

pub mod card;
pub mod group;
pub mod lenient;
pub mod personas;
pub mod png;
pub mod provider;
pub mod world;

use thiserror::Error;

/// Why an asset could not be read. Messages name the asset, never a path.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AssetError {
    /// A PNG without a character card in it (no `chara`/`ccv3` text chunk).
    #[error("{0} is not a character card: it has no chara or ccv3 text chunk")]
    NotACard(String),
    /// Not a PNG, or a PNG whose chunks run past the end.
    #[error("{name} is not a readable png: {reason}")]
    BadPng {
        /// The asset.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The embedded or stored JSON could not be parsed even leniently.
    #[error("{name} has unreadable json: {reason}")]
    BadJson {
        /// The asset.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The file is larger than assets may be (`DirAssets::with_max_bytes`); it is not read.
    #[error("{name} is {size} bytes, over the limit of {max} bytes for an asset")]
    TooLarge {
        /// The asset.
        name: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The JSON is not shaped like the asset it should be.
    #[error("{name} is not a {kind}: {reason}")]
    WrongShape {
        /// The asset.
        name: String,
        /// What it should have been.
        kind: &'static str,
        /// What is wrong.
        reason: String,
    },
}
