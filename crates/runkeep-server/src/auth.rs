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

use crate::problem::{Problem, ProblemType};

pub use runkeep_http::routes::Role;

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

    /// Whether `principal` (authenticated earlier by this authenticator) is
    /// still allowed: `false` once its token is revoked. What the API's
    /// long-polls and event tails ask while they wait ([`revoked`]).
    fn still_valid(&self, principal: &Principal) -> bool {
        let _ = principal;
        true
    }

    /// How often [`Authenticator::still_valid`] should be asked by a
    /// request that waits; `None` when tokens cannot be revoked while the
    /// server runs (nothing to watch).
    fn revocation_check_every(&self) -> Option<std::time::Duration> {
        None
    }
}

/// Resolves once `principal` is no longer valid (its token revoked, or the
/// token file unreadable: fail closed), asking `auth` every
/// [`Authenticator::revocation_check_every`]; never when `auth` cannot
/// revoke. Long-polls answer 401 ([`revoked_problem`]) and event tails end
/// when it resolves.
pub async fn revoked(auth: SharedAuthenticator, principal: Principal) {
    let Some(every) = auth.revocation_check_every() else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !auth.still_valid(&principal) {
            return;
        }
    }
}

/// The answer of a long-poll (and the last event of a tail) whose token was
/// revoked while it waited.
pub fn revoked_problem() -> Problem {
    Problem::new(
        ProblemType::Unauthorized,
        "the bearer token was revoked while this request waited",
    )
}

/// The authenticator the server's state holds.
pub type SharedAuthenticator = Arc<dyn Authenticator>;

fn article(role: Role) -> &'static str {
    match role {
        Role::Operator => "an",
        _ => "a",
    }
}

impl Principal {
    /// `Ok` when this caller's role is at least `role`, else the 403
    /// problem naming the role needed.
    pub fn require(&self, role: Role) -> Result<(), Problem> {
        if self.role >= role {
            return Ok(());
        }
        let mut p = Problem::new(
            ProblemType::Forbidden,
            format!(
                "this operation needs {} {role} token; this token ({}) is {} {}",
                article(role),
                self.token_id,
                article(self.role),
                self.role
            ),
        );
        p.required_role = Some(role.as_str().to_string());
        Err(p)
    }

    /// `Ok` when `tenant` is this caller's tenant, else the 404 answered for
    /// a run that does not exist ([`Problem::no_such_run`]): another
    /// tenant's data is not there for this caller.
    pub fn tenant_scope(&self, tenant: &TenantId) -> Result<(), Problem> {
        if &self.tenant == tenant {
            Ok(())
        } else {
            Err(Problem::no_such_run())
        }
    }

    /// Authenticates the `Authorization: Bearer <secret>` header with
    /// `auth`: no header, another scheme or an unknown secret is the 401
    /// problem (which never echoes what was presented).
    pub fn from_headers(
        headers: &axum::http::HeaderMap,
        auth: &dyn Authenticator,
    ) -> Result<Principal, Problem> {
        let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
            return Err(Problem::new(
                ProblemType::Unauthorized,
                "no bearer token: send `Authorization: Bearer <token>` (`runkeep token create` makes one)",
            ));
        };
        let secret = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|s| !s.is_empty());
        let Some(secret) = secret else {
            return Err(Problem::new(
                ProblemType::Unauthorized,
                "the Authorization header is not `Bearer <token>`",
            ));
        };
        auth.authenticate(secret).ok_or_else(|| {
            Problem::new(
                ProblemType::Unauthorized,
                "the bearer token is unknown or revoked",
            )
        })
    }
}

/// The extractor: the principal the API's auth layer put on the request,
/// or, on a route without that layer, the one the `Authorization` header
/// authenticates to (401 otherwise).
impl axum::extract::FromRequestParts<crate::state::AppState> for Principal {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &crate::state::AppState,
    ) -> Result<Self, Self::Rejection> {
        if let Some(p) = parts.extensions.get::<Principal>() {
            return Ok(p.clone());
        }
        let p = Principal::from_headers(&parts.headers, state.auth.as_ref())?;
        parts.extensions.insert(p.clone());
        Ok(p)
    }
}

/// An in-memory [`Authenticator`] over a fixed set of secrets (tests,
/// embedding). Secrets are compared in constant time over the whole set.
#[derive(Default)]
pub struct StaticTokens {
    tokens: Vec<(Vec<u8>, Principal)>,
}

impl std::fmt::Debug for StaticTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("StaticTokens")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl StaticTokens {
    /// No tokens.
    pub fn new() -> Self {
        Self::default()
    }

    /// With a token `secret` for `tenant` at `role` (its id is
    /// `static-<n>`).
    pub fn with(mut self, secret: impl Into<String>, tenant: TenantId, role: Role) -> Self {
        let token_id = format!("static-{}", self.tokens.len() + 1);
        self.tokens.push((
            secret.into().into_bytes(),
            Principal {
                tenant,
                role,
                token_id,
            },
        ));
        self
    }
}

impl Authenticator for StaticTokens {
    fn authenticate(&self, secret: &str) -> Option<Principal> {
        use subtle::ConstantTimeEq as _;
        let presented = secret.as_bytes();
        let mut found = None;
        for (s, p) in &self.tokens {
            // Every secret is compared, each in constant time.
            if bool::from(s.as_slice().ct_eq(presented)) && found.is_none() {
                found = Some(p.clone());
            }
        }
        found
    }
}
