//! What every handler shares.

use std::sync::Arc;

use runkeep::RunStore;

use crate::auth::SharedAuthenticator;
use crate::metrics::Metrics;

/// The state the API router is built with.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The backing store (memory, directory root or PostgreSQL). It checks
    /// every fence; the server never does.
    pub store: Arc<dyn RunStore>,
    /// Checks bearer tokens.
    pub auth: SharedAuthenticator,
    /// Counters for `/metrics`.
    pub metrics: Arc<Metrics>,
}
