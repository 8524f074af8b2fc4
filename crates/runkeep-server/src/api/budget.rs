//! What request bodies may cost the server, together.
//!
//! Each body is bounded on its own before it is parsed
//! ([`super::extract::scan_json`]: values and nesting). This module bounds
//! them together: every request's body is charged to one [`BodyBudget`] of
//! memory, in KiB, for as long as the request is handled, and a body that
//! finds no room within [`BODY_BUDGET_WAIT`] is refused 503 `overloaded`
//! (with `Retry-After`) having changed nothing.
//!
//! A body is charged twice, each time up to what is known of it:
//!
//! 1. **its declared length**, before a byte of it is read, when it is
//!    larger than [`super::extract::INLINE_PARSE_BYTES`] (a chunked body:
//!    the whole body limit) — so many large uploads cannot be buffered at
//!    once;
//! 2. **what parsing it will cost**, after the scan has counted its values
//!    and before it is parsed: [`BYTES_PER_VALUE`] per value plus its bytes,
//!    when that is over 1 MiB. Parsed JSON costs far more than its bytes —
//!    `[0,0,…]` is 2 bytes a value on the wire and about 220 bytes a value
//!    in a server that parses it, stores it and answers it (measured with
//!    `examples/body_rss.rs`) — so a charge by bytes alone would let a few
//!    hundred dense 2 MiB bodies cost tens of GB.
//!
//! The budget holds the dearest single body (the value limit's cost plus the
//! body limit) and at least twice the body limit, so any body the limits
//! accept can be served alone.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::extract::{INLINE_PARSE_BYTES, MAX_BODY_VALUES};
use crate::problem::{Problem, ProblemType};

/// What one parsed value is charged (measured about 220 bytes: the value,
/// its array slot with growth, the stored copy and the answer's).
pub const BYTES_PER_VALUE: usize = 256;

/// How long a body waits for room in the [`BodyBudget`].
pub const BODY_BUDGET_WAIT: Duration = Duration::from_secs(2);

/// Bodies charged less than this after the scan are not charged again.
const SMALL_KIB: u32 = 1024;

/// The memory request bodies in flight may take together (module docs).
#[derive(Clone, Debug)]
pub struct BodyBudget {
    kib: Arc<Semaphore>,
    total_kib: u32,
    limit_kib: u32,
}

fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX / 4)
}

impl BodyBudget {
    /// The budget for bodies of at most `body_limit` bytes.
    pub fn new(body_limit: usize) -> Self {
        let limit_kib = kib(body_limit);
        let dearest =
            kib(MAX_BODY_VALUES.saturating_mul(BYTES_PER_VALUE)).saturating_add(limit_kib);
        let total_kib = dearest.max(limit_kib.saturating_mul(2));
        Self {
            kib: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
            limit_kib,
        }
    }

    /// The whole budget, KiB.
    pub fn total_kib(&self) -> u32 {
        self.total_kib
    }
}

/// One request's charge: what it holds of the budget, given back when the
/// last clone is dropped (after its response head). The request carries it
/// in its extensions for the body extractor.
#[derive(Clone, Debug)]
pub struct Charge(Arc<ChargeInner>);

#[derive(Debug)]
struct ChargeInner {
    budget: BodyBudget,
    held: Mutex<(u32, Vec<OwnedSemaphorePermit>)>,
}

impl Charge {
    fn new(budget: BodyBudget) -> Self {
        Self(Arc::new(ChargeInner {
            budget,
            held: Mutex::new((0, Vec::new())),
        }))
    }

    /// Raises what this request holds to `kib` (capped at the budget),
    /// waiting at most [`BODY_BUDGET_WAIT`]; 503 `overloaded` when there is
    /// no room.
    pub async fn raise_to(&self, kib: u32) -> Result<(), Problem> {
        let want = kib.min(self.0.budget.total_kib);
        let more = {
            let held = self.0.held.lock().unwrap_or_else(|p| p.into_inner());
            want.saturating_sub(held.0)
        };
        if more == 0 {
            return Ok(());
        }
        let permit = tokio::time::timeout(
            BODY_BUDGET_WAIT,
            self.0.budget.kib.clone().acquire_many_owned(more),
        )
        .await;
        match permit {
            Ok(Ok(p)) => {
                let mut held = self.0.held.lock().unwrap_or_else(|p| p.into_inner());
                held.0 += more;
                held.1.push(p);
                Ok(())
            }
            _ => Err(Problem::new(
                ProblemType::Overloaded,
                "request bodies in flight already take this server's memory budget for bodies; nothing was changed, retry later",
            )),
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
}

/// The middleware: puts a [`Charge`] on the request, charges a large
/// declared body before it is read (module docs, step 1), and holds the
/// charge until the response head.
pub async fn charge_bodies(
    State(budget): State<BodyBudget>,
    mut req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let chunked = req
        .headers()
        .contains_key(axum::http::header::TRANSFER_ENCODING);
    let first = match declared {
        Some(n) if n > INLINE_PARSE_BYTES => kib(n).min(budget.limit_kib),
        None if chunked => budget.limit_kib,
        _ => 0,
    };
    let charge = Charge::new(budget);
    if first > 0 {
        if let Err(p) = charge.raise_to(first).await {
            return p.with_instance(req.uri().path()).into_response();
        }
    }
    req.extensions_mut().insert(charge.clone());
    let res = next.run(req).await;
    drop(charge);
    res
}
