//! Who is asking: bearer tokens bound to one tenant and one [`Role`].
//!
//! The shared interface is fixed here so the API handlers and the token
//! store can be written apart: a handler takes a [`Principal`] (an axum
//! extractor, implemented in this module from the `Authorization: Bearer`
//! header and the state's [`Authenticator`]) and asks it
//! [`Principal::require`] for the role the route needs and
//! [`Principal::tenant_scope`] for the tenant named in the path (another
//! tenant's path answers 404, as if it did not exist).

use std::sync::Arc;

use runkeep::TenantId;

/// What a token may do. Ordered: each role can do all the one before it can.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads: listings, summaries, checkpoints, events, documents, audit.
    Reader,
    /// Also claims, renews, releases its own lease, writes with its fence.
    Worker,
    /// Also answers parks, releases any lease, reopens, prunes.
    Operator,
}

/// The authenticated caller of one request.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Principal {
    /// The only tenant this caller can address.
    pub tenant: TenantId,
    /// What it may do there.
    pub role: Role,
    /// The token's id (never the secret), for logs and audit.
    pub token_id: String,
}

/// Checks a presented bearer secret. Implementations compare in constant
/// time and never log the secret.
pub trait Authenticator: Send + Sync + std::fmt::Debug {
    /// The principal the secret belongs to, or `None` when it is unknown or
    /// revoked.
    fn authenticate(&self, secret: &str) -> Option<Principal>;
}

/// The authenticator the server's state holds.
pub type SharedAuthenticator = Arc<dyn Authenticator>;
