//! The route handlers, one module per resource.

pub mod chat;
pub mod lore;
pub mod memories;
pub mod sessions;
pub mod settings;
pub mod store;
pub mod variables;
