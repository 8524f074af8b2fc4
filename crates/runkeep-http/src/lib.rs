//! The runkeep HTTP contract: what a Rust program links to talk to
//! `runkeep serve`, and what the server is built from.
//!
//! - [`wire`]: the API's JSON shapes, one module per area (runs, leases,
//!   checkpoints, parks, events, documents, steps, threads), with lossless
//!   conversions to and from the core types.
//! - [`routes`]: the operation table ([`Operation`]: name, method, path,
//!   role, unfenced role, kind, parameters, body and answer of each
//!   operation, declared once; [`OperationSpec`] and its markers in
//!   [`op`]); the server's router, admission, role checks and auth matrix,
//!   [`HttpStore`]'s requests, the OpenAPI document and `operations.json`
//!   are built from it.
//! - [`openapi`]: the OpenAPI 3.1 document, built from the table and the
//!   wire types (committed as `crates/runkeep-http/openapi.json`).
//! - [`problem`]: every error as RFC 9457 problem details, and back
//!   ([`problem::Problem::into_error`]). With the `into-response` feature,
//!   a [`problem::Problem`] is an axum response.
//! - [`client`]: [`client::HttpStore`], a `RunStore` over the API.
//! - [`holder`]: how the server tags a holder with its token.
//!
//! The server (`runkeep-server`) re-exports these modules under their old
//! paths (`runkeep_server::wire`, `runkeep_server::client`, …).

pub mod client;
pub mod holder;
pub mod openapi;
pub mod problem;
pub mod routes;
pub mod wire;

pub use client::{HttpStore, HttpStoreOptions};
pub use problem::{Problem, ProblemType};
pub use routes::{op, Operation, OperationKind, OperationSpec, Role, RouteSpec};
