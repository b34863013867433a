//! The AgentTavern management API: what the engine keeps — sessions with their architecture
//! and context mode, projection status, memories with their history, variables, lore, the
//! tavern-mode prompt, settings — over HTTP, for a panel, a script or another host. Built on
//! [`tavern_runtime::Runtime`] alone, so every host serves the same handlers: `tavern serve`
//! on a data directory, or a host's own web server through its adapter.
//!
//! Every write names the revision it read (`409` with the current revision when stale) and is
//! audited as the user's. Callers are admitted by a bearer token, or — without one — only when
//! they name a loopback host. Errors are JSON with stable codes ([`ApiError`]); the OpenAPI
//! document is generated from the types ([`openapi::ApiDoc`]).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use tavern_api::{Api, ApiConfig};
//! use tavern_runtime::{testkit::MemHost, Runtime, RuntimeConfig};
//! use tavern_store::{mem::MemStore, SystemClock};
//! use tavern_tools::assets::provider::MemAssets;
//!
//! let clock = Arc::new(SystemClock);
//! let store = Arc::new(MemStore::new(clock.clone()));
//! let runtime = Runtime::new(Arc::new(MemHost::capable()), store, Arc::new(MemAssets::default()), clock, RuntimeConfig::default());
//! let api = Api::new(Arc::new(runtime), ApiConfig { token: Some("s3cret".into()) });
//! // An axum router: serve it with `axum::serve`, or call it as a tower service.
//! let _router: axum::Router = api.router();
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod app;
mod auth;
pub mod error;
mod extract;
pub mod forward;
pub mod openapi;
pub mod panel;
pub mod routes;
pub mod scope;

pub use app::{Api, ApiConfig, MAX_BODY_BYTES, MAX_PANEL_SESSIONS};
pub use auth::is_loopback_name;
pub use error::ApiError;
pub use forward::{Forwarded, ForwardedResponse};
