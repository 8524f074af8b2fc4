//! What request bodies may cost the server, together.
//!
//! Each body is bounded on its own before it is parsed
//! ([`super::extract::scan_json`]: values and nesting). This module bounds
//! them together: every request's body is charged to one [`BodyBudget`] of
//! memory, in KiB, for as long as the request is handled, and a body that
//! finds no room within [`BODY_BUDGET_WAIT`] is refused 503 `overloaded`
//! (with `Retry-After`) having changed nothing.
//!
//! A body is charged for what it costs, never for what it declares:
//!
//! 1. **its bytes, as they arrive** ([`Charge::read_body`]): each chunk is
//!    charged before the next is read, so a connection that declares
//!    `Content-Length: 68157440` and sends nothing holds nothing (it held
//!    the whole body limit before its first byte; five of them held the
//!    budget);
//! 2. **what parsing it will cost**, after the scan has counted its values
//!    and before it is parsed: [`BYTES_PER_VALUE`] per value plus its bytes,
//!    when that is over 1 MiB. Parsed JSON costs far more than its bytes —
//!    `[0,0,…]` is 2 bytes a value on the wire and about 220 bytes a value
//!    in a server that parses it, stores it and answers it (measured with
//!    `examples/body_rss.rs`) — so a charge by bytes alone would let a few
//!    hundred dense 2 MiB bodies cost tens of GB.
//!
//! # Shares
//!
//! The charge is counted per tenant and per token of the request's bearer
//! token (the route's guard has authenticated it): one token may hold at
//! most the dearest single body (the value limit's cost plus the body
//! limit), so any body the limits accept can still be served; one tenant
//! that plus one body limit; the whole budget that plus two body limits.
//! So a tenant at its share always leaves two whole body limits' bytes to
//! every other tenant (and a token at its share one to the rest of its
//! tenant). With the default 65 MiB limit: 322 MiB a token, 387 MiB a
//! tenant, 517 MiB in all.
//!
//! # Slow uploads
//!
//! Holding budget therefore needs bytes sent; holding it long needs them
//! sent slowly. A body that pauses longer than the grace
//! ([`DEFAULT_RATE_GRACE`], 10 s) or whose average rate from its first
//! byte falls below the minimum rate ([`DEFAULT_MIN_RATE`], 64 KiB/s) once
//! the grace has passed is dropped with 408 `timeout` (and the connection
//! closed), having changed nothing.
//!
//! A route that takes no body (every `GET` and `DELETE`) refuses a request
//! that announces one (`Content-Length` above 0, or `Transfer-Encoding`)
//! with 413 before it is authenticated or admitted ([`refuse_bodies`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::extract::MAX_BODY_VALUES;
use crate::auth::Principal;
use crate::problem::{Problem, ProblemType};

/// What one parsed value is charged (measured about 220 bytes: the value,
/// its array slot with growth, the stored copy and the answer's).
pub const BYTES_PER_VALUE: usize = 256;

/// How long a body waits for room in the [`BodyBudget`].
pub const BODY_BUDGET_WAIT: Duration = Duration::from_secs(2);

/// The slowest average upload rate accepted after the grace, bytes a second.
pub const DEFAULT_MIN_RATE: u64 = 64 * 1024;

/// How long an upload may take before its rate is judged, and the longest
/// pause between two of its chunks.
pub const DEFAULT_RATE_GRACE: Duration = Duration::from_secs(10);

/// Bodies charged less than this after the scan are not charged again.
const SMALL_KIB: u32 = 1024;

/// The memory request bodies in flight may take together (module docs).
#[derive(Clone, Debug)]
pub struct BodyBudget(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    total_kib: u32,
    tenant_kib: u32,
    token_kib: u32,
    limit_bytes: usize,
    min_rate: u64,
    grace: Duration,
    ledger: Mutex<Ledger>,
    freed: Notify,
}

/// KiB held, in all and by tenant and token key; only keys holding some
/// are present.
#[derive(Debug, Default)]
struct Ledger {
    total: u32,
    tenants: HashMap<String, u32>,
    tokens: HashMap<String, u32>,
}

/// Which share a refused body found full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Full {
    Token,
    Tenant,
    Total,
}

fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX / 4)
}

impl BodyBudget {
    /// The budget for bodies of at most `body_limit` bytes, with the
    /// default shares and upload rate (module docs).
    pub fn new(body_limit: usize) -> Self {
        let limit_kib = kib(body_limit);
        let dearest =
            kib(MAX_BODY_VALUES.saturating_mul(BYTES_PER_VALUE)).saturating_add(limit_kib);
        let token_kib = dearest.max(limit_kib.saturating_mul(2));
        let tenant_kib = token_kib.saturating_add(limit_kib);
        let total_kib = tenant_kib.saturating_add(limit_kib.saturating_mul(2));
        Self(Arc::new(Inner {
            total_kib,
            tenant_kib,
            token_kib,
            limit_bytes: body_limit,
            min_rate: DEFAULT_MIN_RATE,
            grace: DEFAULT_RATE_GRACE,
            ledger: Mutex::new(Ledger::default()),
            freed: Notify::new(),
        }))
    }

    /// The same budget with another minimum upload rate (bytes a second;
    /// 0: none) and grace (module docs, slow uploads).
    pub fn with_min_rate(self, min_rate: u64, grace: Duration) -> Self {
        let i = &self.0;
        Self(Arc::new(Inner {
            total_kib: i.total_kib,
            tenant_kib: i.tenant_kib,
            token_kib: i.token_kib,
            limit_bytes: i.limit_bytes,
            min_rate,
            grace,
            ledger: Mutex::new(Ledger::default()),
            freed: Notify::new(),
        }))
    }

    /// The whole budget, KiB.
    pub fn total_kib(&self) -> u32 {
        self.0.total_kib
    }

    /// The most one tenant's bodies may hold, KiB.
    pub fn tenant_kib(&self) -> u32 {
        self.0.tenant_kib
    }

    /// The most one token's bodies may hold, KiB.
    pub fn token_kib(&self) -> u32 {
        self.0.token_kib
    }

    /// The largest body accepted, bytes.
    pub fn limit_bytes(&self) -> usize {
        self.0.limit_bytes
    }

    /// KiB held now, in all.
    pub fn held_kib(&self) -> u32 {
        self.ledger().total
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.0.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn try_take(&self, who: &Who, more: u32) -> Result<(), Full> {
        let mut l = self.ledger();
        let tenant = l.tenants.get(&who.tenant).copied().unwrap_or(0);
        let token = l.tokens.get(&who.token).copied().unwrap_or(0);
        if tenant.saturating_add(more) > self.0.tenant_kib {
            return Err(Full::Tenant);
        }
        if token.saturating_add(more) > self.0.token_kib {
            return Err(Full::Token);
        }
        if l.total.saturating_add(more) > self.0.total_kib {
            return Err(Full::Total);
        }
        l.total += more;
        *l.tenants.entry(who.tenant.clone()).or_default() += more;
        *l.tokens.entry(who.token.clone()).or_default() += more;
        Ok(())
    }

    fn give_back(&self, who: &Who, kib: u32) {
        if kib == 0 {
            return;
        }
        {
            let mut guard = self.ledger();
            let l = &mut *guard;
            l.total = l.total.saturating_sub(kib);
            for (map, key) in [(&mut l.tenants, &who.tenant), (&mut l.tokens, &who.token)] {
                if let Some(n) = map.get_mut(key) {
                    *n = n.saturating_sub(kib);
                    if *n == 0 {
                        map.remove(key);
                    }
                }
            }
        }
        self.0.freed.notify_waiters();
    }
}

/// Who a charge counts against: the tenant's key and the token's
/// (`tenant/token-id`); `""` for a request without a principal.
#[derive(Clone, Debug, Default)]
struct Who {
    tenant: String,
    token: String,
    principal: Option<Principal>,
}

/// One request's charge: what it holds of the budget, given back when the
/// last clone is dropped (after its response head). The request carries it
/// in its extensions for the body extractor.
#[derive(Clone, Debug)]
pub struct Charge(Arc<ChargeInner>);

#[derive(Debug)]
struct ChargeInner {
    budget: BodyBudget,
    who: Who,
    held: Mutex<u32>,
}

impl Drop for ChargeInner {
    fn drop(&mut self) {
        let held = *self.held.get_mut().unwrap_or_else(PoisonError::into_inner);
        self.budget.give_back(&self.who, held);
    }
}

impl Charge {
    fn new(budget: BodyBudget, principal: Option<Principal>) -> Self {
        let who = match principal {
            Some(p) => Who {
                tenant: p.tenant.as_str().to_string(),
                token: format!("{}/{}", p.tenant.as_str(), p.token_id),
                principal: Some(p),
            },
            None => Who::default(),
        };
        Self(Arc::new(ChargeInner {
            budget,
            who,
            held: Mutex::new(0),
        }))
    }

    fn refusal(&self, full: Full) -> Problem {
        let b = &self.0.budget.0;
        let who = self.0.who.principal.as_ref();
        let detail = match (full, who) {
            (Full::Tenant, Some(p)) => format!(
                "tenant {}'s request bodies in flight already hold its share ({} MiB) of this server's memory budget for bodies; nothing was changed, retry later (other tenants are not held back)",
                p.tenant,
                b.tenant_kib / 1024
            ),
            (Full::Token, Some(p)) => format!(
                "this token's ({}) request bodies in flight already hold its share ({} MiB) of this server's memory budget for bodies; nothing was changed, retry later",
                p.token_id,
                b.token_kib / 1024
            ),
            _ => "request bodies in flight already take this server's memory budget for bodies; nothing was changed, retry later".to_string(),
        };
        Problem::new(ProblemType::Overloaded, detail)
    }

    /// Raises what this request holds to `kib` (capped at the token's
    /// share), waiting at most [`BODY_BUDGET_WAIT`]; 503 `overloaded` when
    /// there is no room.
    pub async fn raise_to(&self, kib: u32) -> Result<(), Problem> {
        let budget = &self.0.budget;
        let want = kib.min(budget.0.token_kib);
        let deadline = Instant::now() + BODY_BUDGET_WAIT;
        loop {
            let freed = budget.0.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let full = {
                let mut held = self.0.held.lock().unwrap_or_else(PoisonError::into_inner);
                let more = want.saturating_sub(*held);
                if more == 0 {
                    return Ok(());
                }
                match budget.try_take(&self.0.who, more) {
                    Ok(()) => {
                        *held += more;
                        return Ok(());
                    }
                    Err(full) => full,
                }
            };
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(self.refusal(full));
            }
        }
    }

    /// Charges what parsing a body of `bytes` bytes and `values` values
    /// will cost, when that is over 1 MiB (module docs, step 2).
    pub async fn parsing(&self, bytes: usize, values: usize) -> Result<(), Problem> {
        let cost = kib(values.saturating_mul(BYTES_PER_VALUE).saturating_add(bytes));
        if cost < SMALL_KIB {
            return Ok(());
        }
        self.raise_to(cost).await
    }

    /// Reads `body` to its end, charging its bytes as they arrive (module
    /// docs, step 1): 413 over the body limit (a declared length at once),
    /// 503 when the budget has no room for the next chunk, 408 for an
    /// upload that pauses or trickles (module docs, slow uploads), 400 for
    /// a body that could not be read.
    pub async fn read_body(&self, declared: Option<u64>, body: Body) -> Result<Bytes, Problem> {
        let b = &self.0.budget.0;
        let too_large = || {
            Problem::new(
                ProblemType::PayloadTooLarge,
                format!(
                    "the body is larger than this server accepts ({} bytes); nothing was changed",
                    b.limit_bytes
                ),
            )
        };
        if declared.is_some_and(|n| n > b.limit_bytes as u64) {
            return Err(too_large());
        }
        let mut body = body;
        let mut buf = Vec::with_capacity(
            declared.map_or(0, |n| (n as usize).min(super::extract::INLINE_PARSE_BYTES)),
        );
        let start = Instant::now();
        let mut last = start;
        loop {
            let deadline = if b.min_rate == 0 {
                None
            } else {
                let paced =
                    start + b.grace + Duration::from_secs_f64(buf.len() as f64 / b.min_rate as f64);
                Some(paced.min(last + b.grace))
            };
            let frame = match deadline {
                Some(d) => match tokio::time::timeout_at(d, body.frame()).await {
                    Ok(f) => f,
                    Err(_) => {
                        return Err(Problem::new(
                            ProblemType::Timeout,
                            format!(
                                "the request body arrived too slowly ({} bytes in {:.1} s): this server drops a body that pauses over {} s or averages under {} KiB/s after its first {} s; nothing was changed",
                                buf.len(),
                                start.elapsed().as_secs_f64(),
                                b.grace.as_secs_f64(),
                                b.min_rate / 1024,
                                b.grace.as_secs_f64()
                            ),
                        ))
                    }
                },
                None => body.frame().await,
            };
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| {
                if is_length_limit(&e) {
                    too_large()
                } else {
                    Problem::new(ProblemType::MalformedBody, "the body could not be read")
                }
            })?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            if buf.len() + data.len() > b.limit_bytes {
                return Err(too_large());
            }
            self.raise_to(kib(buf.len() + data.len())).await?;
            buf.extend_from_slice(&data);
            last = Instant::now();
        }
        Ok(Bytes::from(buf))
    }
}

/// Whether a body error is a body limit's (tower-http's or axum's).
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// The middleware, inside the route's guard: puts a [`Charge`] for the
/// request's principal on the request and holds it until the response
/// head. Nothing is charged here: the body extractor charges bytes as they
/// arrive ([`Charge::read_body`]).
pub async fn charge_bodies(
    State(budget): State<BodyBudget>,
    mut req: Request,
    next: Next,
) -> Response {
    let principal = req.extensions().get::<Principal>().cloned();
    let charge = Charge::new(budget, principal);
    req.extensions_mut().insert(charge.clone());
    let mut res = next.run(req).await;
    if res.status() == StatusCode::REQUEST_TIMEOUT {
        // The body was not read to its end: the connection cannot be
        // reused.
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    drop(charge);
    res
}

/// Refuses a body on a route that takes none (every `GET`, `HEAD` and
/// `DELETE` of the API): a request that announces one (`Content-Length`
/// above 0, or `Transfer-Encoding`) is 413 `payload-too-large`, before it
/// is authenticated and before a byte of the body is read; the connection
/// is closed.
pub async fn refuse_bodies(req: Request, next: Next) -> Response {
    let bodyless = matches!(*req.method(), Method::GET | Method::HEAD | Method::DELETE);
    if !bodyless || !announces_body(&req) {
        return next.run(req).await;
    }
    let mut res = Problem::new(
        ProblemType::PayloadTooLarge,
        format!(
            "{} takes no request body; send none (no Content-Length above 0, no Transfer-Encoding)",
            req.method()
        ),
    )
    .with_instance(req.uri().path())
    .into_response();
    res.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    res
}

fn announces_body(req: &Request) -> bool {
    let h = req.headers();
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use runkeep::TenantId;

    fn charge(budget: &BodyBudget, tenant: &str, token: &str) -> Charge {
        Charge::new(
            budget.clone(),
            Some(Principal {
                tenant: TenantId::new(tenant).unwrap(),
                role: crate::auth::Role::Worker,
                token_id: token.into(),
            }),
        )
    }

    #[test]
    fn the_default_shares_leave_every_other_tenant_two_body_limits() {
        let b = BodyBudget::new(crate::api::DEFAULT_BODY_LIMIT);
        let limit = kib(crate::api::DEFAULT_BODY_LIMIT);
        let dearest = kib(MAX_BODY_VALUES * BYTES_PER_VALUE) + limit;
        assert_eq!(b.token_kib(), dearest);
        assert_eq!(b.tenant_kib(), dearest + limit);
        assert_eq!(b.total_kib() - b.tenant_kib(), 2 * limit);
    }

    #[tokio::test]
    async fn a_token_and_a_tenant_hold_at_most_their_shares_and_give_them_back() {
        let b = BodyBudget::new(1024 * 1024); // 1 MiB bodies
        let (token, tenant, total) = (b.token_kib(), b.tenant_kib(), b.total_kib());
        let a1 = charge(&b, "a", "t1");
        a1.raise_to(token).await.unwrap();
        // The same token: no more.
        let a1b = charge(&b, "a", "t1");
        let p = a1b.raise_to(1).await.unwrap_err();
        assert!(p.detail.as_deref().unwrap().contains("this token's (t1)"));
        // Another token of the tenant: up to the tenant's share.
        let a2 = charge(&b, "a", "t2");
        a2.raise_to(tenant - token).await.unwrap();
        let a3 = charge(&b, "a", "t3");
        let p = a3.raise_to(1).await.unwrap_err();
        assert!(p.detail.as_deref().unwrap().contains("tenant a's"));
        // Another tenant: the rest of the budget.
        let b1 = charge(&b, "b", "u1");
        b1.raise_to(total - tenant).await.unwrap();
        assert_eq!(b.held_kib(), total);
        // A waiter gets room as soon as a charge is given back.
        let waiter = charge(&b, "b", "u2");
        let wait = tokio::spawn(async move { waiter.raise_to(10).await.map(|()| waiter) });
        tokio::task::yield_now().await;
        drop(a2);
        let waiter = wait.await.unwrap().unwrap();
        drop((a1, a1b, a3, b1, waiter));
        assert_eq!(b.held_kib(), 0);
        assert!(b.ledger().tenants.is_empty() && b.ledger().tokens.is_empty());
    }
}
