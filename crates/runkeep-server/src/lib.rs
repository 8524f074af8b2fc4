//! runkeep over HTTP.
//!
//! - [`api`]: the versioned JSON API's routes, one module per part of the
//!   contract (runs, claims, checkpoints, events, documents, parks, prune);
//!   every write carries its fence to the store, which checks it.
//! - [`problem`]: every error as RFC 9457 problem details (from
//!   `runkeep-http`).
//! - [`auth`]: bearer tokens bound to a tenant and a [`auth::Role`]; the
//!   [`auth::Principal`] extractor every tenant route takes.
//! - [`manners`]: body limit, timeouts, concurrency limit, graceful shutdown.
//! - [`metrics`]: Prometheus `/metrics`.
//! - [`tokens`]: the token store ([`tokens::TokenStore`], an
//!   [`auth::Authenticator`] over a hashed `tokens.json`).
//! - [`server`]: [`server::ServerConfig`], [`server::app`] and
//!   [`server::serve`]: the API with `/healthz`, `/readyz`, `/metrics`,
//!   `/openapi.json` and the manners, on a listener.
//! - [`state`]: [`state::AppState`], what every handler shares.
//! - [`client`]: [`client::HttpStore`], a `RunStore` over the API (from
//!   `runkeep-http`).
//! - [`console`]: the web console at `/` (embedded files).
//! - [`wire`]: the API's JSON shapes ([`wire_threads`]: the thread routes),
//!   from `runkeep-http`, which also holds the operation table and
//!   [`openapi`], the OpenAPI 3.1 document built from it.

pub mod api;
pub mod auth;
pub mod console;
pub mod manners;
pub mod metrics;
pub mod server;
pub mod state;
pub mod tokens;

// The HTTP contract lives in `runkeep-http`; these are its old paths here.
pub use runkeep_http::wire::threads as wire_threads;
pub use runkeep_http::{client, openapi, problem, wire};
