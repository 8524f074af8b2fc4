//! `HttpStore`: a [`RunStore`](runkeep::RunStore) over the JSON API, so code written against
//! the contract (the worker runtime, the soak, the conformance kit) runs
//! through `runkeep serve` unchanged.
//!
//! # How it answers
//!
//! - **Errors keep their variant.** Every problem the server answers is
//!   mapped back to the `runkeep::Error` variant the backing store
//!   returned ([`Problem::into_error`]): `FencedOut` with both fences,
//!   `Contended`, `Conflict`, `NotFound`, `InvalidInput`…
//! - **A lost reply is outcome unknown.** A write whose request may have
//!   reached the server but whose answer did not come back (reset
//!   connection, the reply timeout, a 408 from the server's own request
//!   timeout, which cancels the handler mid-write) answers an
//!   `Error::Unavailable` for which [`Error::is_outcome_unknown`] is true:
//!   the worker runtime then resolves the step by reading back, never by
//!   repeating it blindly. A request that never connected answers a plain
//!   `Unavailable` (nothing was sent). Reads answer `Unavailable` either way.
//! - **Bounded.** Every request has a reply timeout
//!   ([`HttpStoreOptions::request_timeout`]; long-polls their wait plus a
//!   margin), so a server that went away is an error, not a hang, and a
//!   server that comes back is used again by the next call.
//! - **Several servers.** [`HttpStore::with_servers`] takes the URLs of
//!   several `runkeep serve` processes in front of one backing store (the
//!   CLI: `--store http://A,http://B`). Requests go to one server until it
//!   fails, then to the next: a request that could not connect (nothing
//!   was sent) goes to the next server at once, and so does a read whose
//!   answer was lost; a write whose answer was lost is outcome unknown as
//!   above, and the calls after it (the renewal that fences the attempt
//!   off, the read-back) go to the next server. A worker whose server was
//!   killed thus renews its leases through another instead of losing
//!   them. A server that answers, even with a refusal, is kept: every
//!   server answers for the same store.
//! - **The store's clock.** Every answer carries the store's clock
//!   ([`crate::routes::NOW_HEADER`]); [`CheckpointStore::now`] answers the
//!   machine clock corrected by the offset last measured, like `PgStore`.
//!   Tests may replace it with [`HttpStoreOptions::clock`]. **Writes never
//!   carry a client instant**: a claim with [`ClaimOptions::now`] set is
//!   refused (`InvalidInput`) before anything is sent, and a park answer is
//!   recorded at the server's clock whatever `now` it is given; a client
//!   cannot move a lease's expiry or back-date an answer. Reads (`lease`,
//!   `find_pending`, `resume_point`, `list_runs`) still send their `now`:
//!   a read judged at another instant is a view that changes nothing.
//! - **Tenants.** A token is bound to one tenant; an `HttpStore` holds one
//!   token per tenant it serves ([`HttpStore::with_token`]). A run of a
//!   tenant it holds no token for is refused with `InvalidInput` (like a
//!   directory store bound to one session), and a listing of such a tenant
//!   is an empty page (the contract's answer for a tenant a store does not
//!   hold).
//! - **Waiting.** [`CheckpointStore::watch`] is woken by a background
//!   long-poll of the server's wait routes (which wait on the backing
//!   store's own watch), with a fallback interval for the moment between
//!   the subscription and the long-poll reaching the server.
//!   [`HttpStore::claim_next_waiting`] long-polls `claim_next`;
//!   [`HttpStore::follow_events`] is the SSE tail, resuming with
//!   `Last-Event-ID` across disconnects and server restarts.

use runkeep::RemoteClock;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{Stream, StreamExt};
use runkeep::{
    AuditRecord, Checkpoint, CheckpointId, CheckpointStore, ClaimNextFilter, ClaimOptions,
    ClaimOutcome, Clock, EnqueueOptions, Error, EventBatch, EvidenceStore, Fence, Handover,
    Integrity, Lease, LeaseSummary, Lifecycle, ListOptions, ListingScope, MessageSnapshot,
    NewAuditEvent, NewEvent, NextClaim, Outcome, ParkResolution, PersistedEvent, ReadEventsOptions,
    Result, RunPage, RunRecord, RunScope, Step, StepCommit, StepReceipt, SystemClock, TenantId,
    Timestamp, Watch, WatchTopic,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::openapi::Payload;
use crate::problem::{Problem, ProblemType, PROBLEM_JSON};
use crate::routes::{op, Operation, OperationSpec, NOW_HEADER};
use crate::wire::*;

/// How an [`HttpStore`] talks to the server.
#[derive(Clone, Debug)]
pub struct HttpStoreOptions {
    /// The longest wait for an answer to one request (long-polls add their
    /// own wait). Past it a read is `Unavailable` and a write outcome
    /// unknown.
    pub request_timeout: Duration,
    /// The longest wait for a connection.
    pub connect_timeout: Duration,
    /// The fallback interval of a [`Watch`] (its wake-ups come from the
    /// long-poll; this covers a change the long-poll could not see).
    pub watch_fallback: Duration,
    /// How long one background long-poll of a watch waits on the server.
    pub watch_wait: Duration,
    /// **Tests only.** Answer [`CheckpointStore::now`] from this clock (the
    /// backing store's own `ManualClock` in the conformance kit) instead of
    /// the offset measured from the server's answers.
    pub clock: Option<Arc<dyn Clock>>,
    /// **Tests only.** The backing store's `ManualClock`, for the
    /// conformance kit's claims at chosen instants: a claim carrying
    /// [`ClaimOptions::now`] is sent with this clock set to that instant for
    /// the call (one such claim at a time) and put back after. The server
    /// never takes a client instant; without this option such a claim is
    /// refused.
    pub steer_clock: Option<runkeep::ManualClock>,
    /// The machine clock the measured offset is added to.
    pub local_clock: Arc<dyn Clock>,
}

impl Default for HttpStoreOptions {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            watch_fallback: Duration::from_secs(1),
            watch_wait: Duration::from_secs(25),
            clock: None,
            steer_clock: None,
            local_clock: Arc::new(SystemClock),
        }
    }
}

/// Puts a steered clock back ([`HttpStore::steer`]).
struct SteeredClock<'a> {
    clock: runkeep::ManualClock,
    before: Timestamp,
    _lock: tokio::sync::MutexGuard<'a, ()>,
}

impl Drop for SteeredClock<'_> {
    fn drop(&mut self) {
        self.clock.set(self.before);
    }
}

/// The server answers a release or snooze under a stale fence 409
/// `fenced-out` like every write; the contract's answer is `false`.
fn stale_is_false(answer: Result<Done>) -> Result<bool> {
    match answer {
        Ok(d) => Ok(d.done),
        Err(e) if e.is_fenced_out() => Ok(false),
        Err(e) => Err(e),
    }
}

/// A [`RunStore`](runkeep::RunStore) over `runkeep serve`'s API (module docs).
#[derive(Clone)]
pub struct HttpStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The servers' base URLs, in the order given: one `runkeep serve`, or
    /// several in front of one store ([`HttpStore::with_servers`]).
    bases: Vec<String>,
    /// The server requests go to ([`Inner::bases`] index): the first, until
    /// it fails; then the next that answers.
    current: std::sync::atomic::AtomicUsize,
    client: reqwest::Client,
    tokens: HashMap<TenantId, String>,
    options: HttpStoreOptions,
    /// The store's clock: the local clock plus the offset last measured.
    store_clock: RemoteClock,
    /// The last event seq this client has seen per run (appends, reads,
    /// steps): where an events watch starts, so a change after `watch()`
    /// is never missed.
    seen: std::sync::Mutex<HashMap<RunScope, u64>>,
    /// One steered claim at a time ([`HttpStoreOptions::steer_clock`]).
    steering: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for HttpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        let mut tenants: Vec<&str> = self.inner.tokens.keys().map(|t| t.as_str()).collect();
        tenants.sort_unstable();
        f.debug_struct("HttpStore")
            .field("bases", &self.inner.bases)
            .field("tenants", &tenants)
            .finish_non_exhaustive()
    }
}

/// What kind of call a request is: a read is repeatable; a write whose
/// reply was lost is outcome unknown.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Read,
    Write,
}

impl Kind {
    /// A `GET` is a read; anything else a write.
    fn of(op: Operation) -> Self {
        if op.method() == reqwest::Method::GET {
            Kind::Read
        } else {
            Kind::Write
        }
    }
}

/// How one request to one server failed.
enum Sent {
    /// The server answered (a problem, a refusal): no other server would
    /// answer otherwise.
    Answered(Error),
    /// It was never sent (no connection): another server may take it.
    Not(Error),
    /// It was sent and its answer lost: a read may go to another server; a
    /// write is outcome unknown.
    Lost(Error),
}

/// What a request is about: the ids that fill its operation's path
/// ([`Operation::fill`]).
#[derive(Clone, Copy)]
enum At<'a> {
    /// Nothing (`/v1/clock`, `/v1/whoami`).
    Root,
    /// A tenant.
    Tenant(&'a TenantId),
    /// A session.
    Session(&'a TenantId, &'a runkeep::ProjectId, &'a runkeep::SessionId),
    /// A run.
    Run(&'a RunScope),
    /// One checkpoint of a run.
    Checkpoint(&'a RunScope, &'a CheckpointId),
    /// One schedule of a session (tenant, project, session, name).
    Schedule([&'a str; 4]),
}

impl At<'_> {
    /// `op`'s path for this target.
    fn path(self, op: Operation) -> String {
        fn run(scope: &RunScope) -> [(&'static str, &str); 4] {
            [
                ("tenant", scope.tenant_id.as_str()),
                ("project", scope.project_id.as_str()),
                ("session", scope.session_id.as_str()),
                ("run", scope.run_id.as_str()),
            ]
        }
        match self {
            At::Root => op.fill(&[]),
            At::Tenant(tenant) => op.fill(&[("tenant", tenant.as_str())]),
            At::Session(tenant, project, session) => op.fill(&[
                ("tenant", tenant.as_str()),
                ("project", project.as_str()),
                ("session", session.as_str()),
            ]),
            At::Run(scope) => op.fill(&run(scope)),
            At::Checkpoint(scope, id) => {
                let mut params = run(scope).to_vec();
                params.push(("checkpoint", id.as_str()));
                op.fill(&params)
            }
            At::Schedule([tenant, project, session, schedule]) => op.fill(&[
                ("tenant", tenant),
                ("project", project),
                ("session", session),
                ("schedule", schedule),
            ]),
        }
    }
}

impl HttpStore {
    /// A store at `base_url` (`http://127.0.0.1:7420`) with no token yet.
    pub fn new(base_url: impl Into<String>, options: HttpStoreOptions) -> Result<Self> {
        Self::with_servers([base_url.into()], options)
    }

    /// A store behind several `runkeep serve` processes in front of one
    /// backing store (`base_urls`, at least one), with no token yet.
    /// Requests go to the first until it fails, then fail over
    /// ([module docs](self), "Several servers"): a request that could not
    /// connect (nothing was sent) goes to the next server at once, a read
    /// whose answer was lost too; a write whose answer was lost is outcome
    /// unknown as always, and the calls after it (the renewal that fences
    /// it off, the read-back) go to the next server.
    pub fn with_servers(
        base_urls: impl IntoIterator<Item = String>,
        options: HttpStoreOptions,
    ) -> Result<Self> {
        let mut bases = Vec::new();
        for base in base_urls {
            let base = base.trim_end_matches('/').to_string();
            if !(base.starts_with("http://") || base.starts_with("https://")) {
                return Err(Error::invalid(format!(
                    "HttpStore address {base:?} is not an http:// or https:// URL"
                )));
            }
            bases.push(base);
        }
        if bases.is_empty() {
            return Err(Error::invalid("an HttpStore needs at least one server URL"));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Error::backend("HttpStore: build the HTTP client", e))?;
        Ok(Self {
            inner: Arc::new(Inner {
                bases,
                current: std::sync::atomic::AtomicUsize::new(0),
                client,
                tokens: HashMap::new(),
                store_clock: RemoteClock::new(options.local_clock.clone()),
                options,
                seen: std::sync::Mutex::new(HashMap::new()),
                steering: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// A claim's options as sent: with [`HttpStoreOptions::steer_clock`]
    /// (tests only) an explicit `now` becomes the backing store's clock
    /// for as long as the returned guard lives; otherwise unchanged (and
    /// [`ClaimBody::of`] refuses a `now`).
    async fn steer(&self, options: &ClaimOptions) -> (ClaimOptions, Option<SteeredClock<'_>>) {
        let Some(now) = options.now else {
            return (options.clone(), None);
        };
        let Some(steered) = self.steer_at(now).await else {
            return (options.clone(), None);
        };
        let mut sent = options.clone();
        sent.now = None;
        (sent, Some(steered))
    }

    /// The backing store's clock at `now` while the guard lives, when
    /// [`HttpStoreOptions::steer_clock`] is set (tests only).
    async fn steer_at(&self, now: Timestamp) -> Option<SteeredClock<'_>> {
        let clock = self.inner.options.steer_clock.as_ref()?;
        let lock = self.inner.steering.lock().await;
        let before = clock.now();
        clock.set(now);
        Some(SteeredClock {
            clock: clock.clone(),
            before,
            _lock: lock,
        })
    }

    /// With `secret` as the token for `tenant`.
    pub fn with_token(self, tenant: TenantId, secret: impl Into<String>) -> Self {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|a| Inner {
            bases: a.bases.clone(),
            current: std::sync::atomic::AtomicUsize::new(
                a.current.load(std::sync::atomic::Ordering::Relaxed),
            ),
            client: a.client.clone(),
            tokens: a.tokens.clone(),
            options: a.options.clone(),
            store_clock: a.store_clock.detached(),
            seen: std::sync::Mutex::new(HashMap::new()),
            steering: tokio::sync::Mutex::new(()),
        });
        inner.tokens.insert(tenant, secret.into());
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Connects with one token, asking the server which tenant it is for.
    pub async fn connect(
        base_url: impl Into<String>,
        secret: impl Into<String>,
        options: HttpStoreOptions,
    ) -> Result<Self> {
        let store = Self::new(base_url, options)?;
        let secret = secret.into();
        let who: WhoAmI = store
            .send::<op::Whoami>(&secret, At::Root, &[], &NoBody, None)
            .await?;
        let tenant = TenantId::new(who.tenant)?;
        Ok(store.with_token(tenant, secret))
    }

    /// The base URL requests go to now (the first server's, until it
    /// fails).
    pub fn base_url(&self) -> &str {
        &self.inner.bases[self.server()]
    }

    /// Every server's base URL, in the order given.
    pub fn base_urls(&self) -> &[String] {
        &self.inner.bases
    }

    /// The index of the server requests go to now.
    fn server(&self) -> usize {
        self.inner
            .current
            .load(std::sync::atomic::Ordering::Relaxed)
            % self.inner.bases.len()
    }

    /// Server `failed` did not answer: later requests go to the next one
    /// (unless another request moved on already).
    fn fail_over(&self, failed: usize) {
        let n = self.inner.bases.len();
        if n > 1 {
            let _ = self.inner.current.compare_exchange(
                failed,
                (failed + 1) % n,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }

    fn token(&self, tenant: &TenantId) -> Result<&str> {
        self.inner
            .tokens
            .get(tenant)
            .map(String::as_str)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "this HttpStore holds no token for tenant {tenant}; add one with HttpStore::with_token (a token serves one tenant)"
                ))
            })
    }

    fn run_query(
        scope: &RunScope,
        mut q: Vec<(&'static str, String)>,
    ) -> Vec<(&'static str, String)> {
        if let Some(p) = &scope.parent_run_id {
            q.push(("parent", p.to_string()));
        }
        q
    }

    /// One request of the operation `S` (its marker, [`crate::op`]): its
    /// method from the table, `body` sent when it takes one, the answer
    /// read as its answer type. A `GET` is a read (repeatable); anything
    /// else a write, whose lost reply is outcome unknown. With several
    /// servers it fails over ([`HttpStore::with_servers`]).
    async fn send<S: OperationSpec>(
        &self,
        token: &str,
        at: At<'_>,
        query: &[(&'static str, String)],
        body: &S::Body,
        extra_wait: Option<Duration>,
    ) -> Result<S::Answer>
    where
        S::Answer: DeserializeOwned,
    {
        let kind = Kind::of(S::OP);
        let n = self.inner.bases.len();
        let first = self.server();
        let mut tried = 0;
        loop {
            let server = (first + tried) % n;
            tried += 1;
            let last = tried == n;
            match self
                .send_to::<S>(server, token, at, query, body, extra_wait)
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(Sent::Answered(e)) => return Err(e),
                // Nothing was sent: the next server, at once.
                Err(Sent::Not(e)) => {
                    self.fail_over(server);
                    if last {
                        return Err(e);
                    }
                }
                // The answer was lost: a read is repeated on the next
                // server; a write is outcome unknown (it may have landed),
                // and the calls that resolve it go to the next server.
                Err(Sent::Lost(e)) => {
                    self.fail_over(server);
                    if last || kind == Kind::Write {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// [`HttpStore::send`] to server `server` alone.
    async fn send_to<S: OperationSpec>(
        &self,
        server: usize,
        token: &str,
        at: At<'_>,
        query: &[(&'static str, String)],
        body: &S::Body,
        extra_wait: Option<Duration>,
    ) -> std::result::Result<S::Answer, Sent>
    where
        S::Answer: DeserializeOwned,
    {
        let op = S::OP;
        let operation = op.name();
        let kind = Kind::of(op);
        let base = &self.inner.bases[server];
        let url = format!("{base}{}", at.path(op));
        let timeout = self.inner.options.request_timeout + extra_wait.unwrap_or_default();
        let mut req = self
            .inner
            .client
            .request(op.method(), &url)
            .bearer_auth(token)
            .timeout(timeout);
        if !query.is_empty() {
            req = req.query(query);
        }
        if <S::Body as Payload>::PRESENT {
            req = req.json(body);
        }
        let res = match req.send().await {
            Ok(r) => r,
            Err(e) => return Err(self.transport(base, operation, kind, e)),
        };
        self.note_clock(res.headers());
        let status = res.status();
        let is_problem = res
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with(PROBLEM_JSON));
        let bytes = match res.bytes().await {
            Ok(b) => b,
            Err(e) => return Err(self.transport(base, operation, kind, e)),
        };
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                Sent::Answered(Error::backend(
                    format!("HttpStore {operation}: the server's answer is not the API's JSON"),
                    e,
                ))
            });
        }
        if is_problem {
            if let Ok(p) = serde_json::from_slice::<Problem>(&bytes) {
                // The server's request timeout cancels the handler, which
                // may have been writing: the write's outcome is unknown.
                if kind == Kind::Write && p.kind() == Some(ProblemType::Timeout) {
                    return Err(Sent::Answered(Error::outcome_unknown(
                        format!(
                            "HttpStore {operation}: the server timed the request out while it was being served"
                        ),
                        std::io::Error::other("request timeout"),
                    )));
                }
                return Err(Sent::Answered(p.into_error(operation)));
            }
        }
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).to_string();
        if status.is_server_error() {
            let message = format!(
                "HttpStore {operation}: the server answered {status} without a problem body"
            );
            if kind == Kind::Write && status != reqwest::StatusCode::SERVICE_UNAVAILABLE {
                return Err(Sent::Answered(Error::outcome_unknown(
                    message,
                    std::io::Error::other(text),
                )));
            }
            return Err(Sent::Answered(Error::unavailable(
                message,
                std::io::Error::other(text),
            )));
        }
        Err(Sent::Answered(Error::Backend {
            message: format!(
                "HttpStore {operation}: the server answered {status} without a problem body: {text}"
            ),
            source: None,
        }))
    }

    /// A request that failed in transport: not sent (no connection), or
    /// sent with its answer lost.
    fn transport(
        &self,
        base: &str,
        operation: &'static str,
        kind: Kind,
        e: reqwest::Error,
    ) -> Sent {
        if e.is_connect() || e.is_builder() {
            return Sent::Not(Error::unavailable(
                format!("HttpStore {operation}: cannot connect to {base}; nothing was sent; retry"),
                e,
            ));
        }
        Sent::Lost(match kind {
            Kind::Write => Error::outcome_unknown(
                format!(
                    "HttpStore {operation}: the request was sent to {base} but no answer came back (within {} ms or at all); the change may or may not be stored: read it back before repeating it",
                    self.inner.options.request_timeout.as_millis()
                ),
                e,
            ),
            Kind::Read => Error::unavailable(
                format!("HttpStore {operation}: no answer from {base}; retry"),
                e,
            ),
        })
    }

    fn note_seq(&self, scope: &RunScope, seq: u64) {
        let mut seen = self.inner.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= 10_000 && !seen.contains_key(scope) {
            // Bounded: forgetting only costs a watch one spurious wake-up.
            seen.clear();
        }
        let e = seen.entry(scope.clone()).or_insert(0);
        *e = (*e).max(seq);
    }

    fn seen_seq(&self, scope: &RunScope) -> u64 {
        let seen = self.inner.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(scope).copied().unwrap_or(0)
    }

    fn note_clock(&self, headers: &reqwest::header::HeaderMap) {
        if let Some(now) = headers
            .get(NOW_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok())
            .and_then(|v| Timestamp::from_millis(v).ok())
        {
            self.inner.store_clock.observe(now);
        }
    }

    /// A request of `S` about `at` (in its tenant, with that tenant's
    /// token).
    async fn call<S: OperationSpec>(
        &self,
        tenant: &TenantId,
        at: At<'_>,
        query: &[(&'static str, String)],
        body: &S::Body,
    ) -> Result<S::Answer>
    where
        S::Answer: DeserializeOwned,
    {
        let token = self.token(tenant)?.to_string();
        self.send::<S>(&token, at, query, body, None).await
    }

    /// A read of the run `scope` (an operation that takes no body).
    async fn run_get<S: OperationSpec<Body = NoBody>>(
        &self,
        scope: &RunScope,
        query: Vec<(&'static str, String)>,
    ) -> Result<S::Answer>
    where
        S::Answer: DeserializeOwned,
    {
        self.call::<S>(
            &scope.tenant_id,
            At::Run(scope),
            &Self::run_query(scope, query),
            &NoBody,
        )
        .await
    }

    /// A write to the run `scope`.
    async fn run_write<S: OperationSpec>(
        &self,
        scope: &RunScope,
        body: &S::Body,
    ) -> Result<S::Answer>
    where
        S::Answer: DeserializeOwned,
    {
        self.call::<S>(
            &scope.tenant_id,
            At::Run(scope),
            &Self::run_query(scope, vec![]),
            body,
        )
        .await
    }

    /// `claim_next`, waiting up to `wait` (at most 30 s) on the server for a
    /// run to become runnable when none is.
    pub async fn claim_next_waiting(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
        wait: Duration,
    ) -> Result<Option<(RunScope, Lease)>> {
        let (options, _steered) = self.steer(options).await;
        let body = claim_next_body(scope, filter, &options, wait)?;
        let token = self.token(scope.tenant_id())?.to_string();
        let answer: ClaimNextAnswer = self
            .send::<op::ClaimNext>(
                &token,
                At::Tenant(scope.tenant_id()),
                &[],
                &body,
                Some(wait),
            )
            .await?;
        match answer.claimed {
            None => Ok(None),
            Some(c) => Ok(Some((
                c.run.to_scope("run").map_err(problem_error)?,
                c.lease.to_lease().map_err(problem_error)?,
            ))),
        }
    }

    /// The run's summary (lease, lifecycle, latest and pending checkpoint,
    /// last seq) in one call; `NotFound` for a run that does not exist.
    pub async fn summary(&self, scope: &RunScope) -> Result<RunSummary> {
        self.run_get::<op::RunSummary>(scope, vec![]).await
    }

    /// The live tail of a run's events after `since_seq`, over SSE. It
    /// reconnects by itself (to the same server, or a restarted one)
    /// resuming with `Last-Event-ID`, so each event is yielded once, in
    /// order; a connection failure is yielded as an `Err` item (the stream
    /// then retries), a problem answered by the server ends it. Dropping the
    /// stream stops it.
    pub fn follow_events(
        &self,
        scope: &RunScope,
        since_seq: u64,
    ) -> Pin<Box<dyn Stream<Item = Result<PersistedEvent>> + Send>> {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<PersistedEvent>>(256);
        let store = self.clone();
        let scope = scope.clone();
        tokio::spawn(async move {
            let mut last = since_seq;
            let mut backoff =
                runkeep::backoff::Doubling::new(Duration::from_millis(50), Duration::from_secs(1));
            loop {
                match store.tail_once(&scope, &mut last, &tx).await {
                    Tail::Closed => return,
                    Tail::Ended(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    Tail::Dropped(e) => {
                        if let Some(e) = e {
                            if tx.send(Err(e)).await.is_err() {
                                return;
                            }
                        } else {
                            backoff.reset();
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }))
    }

    async fn tail_once(
        &self,
        scope: &RunScope,
        last: &mut u64,
        tx: &tokio::sync::mpsc::Sender<Result<PersistedEvent>>,
    ) -> Tail {
        let token = match self.token(&scope.tenant_id) {
            Ok(t) => t.to_string(),
            Err(e) => return Tail::Ended(e),
        };
        let op = op::TailEvents::OP;
        // Several servers: the one in use; a dropped tail moves to the next.
        let server = self.server();
        let base = &self.inner.bases[server];
        let url = format!("{base}{}", At::Run(scope).path(op));
        let req = self
            .inner
            .client
            .request(op.method(), &url)
            .bearer_auth(token)
            .header("last-event-id", last.to_string())
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .query(&Self::run_query(scope, vec![]));
        let res = tokio::select! {
            r = tokio::time::timeout(self.inner.options.request_timeout, req.send()) => r,
            _ = tx.closed() => return Tail::Closed,
        };
        let res = match res {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                self.fail_over(server);
                let (Sent::Not(e) | Sent::Lost(e) | Sent::Answered(e)) =
                    self.transport(base, op.name(), Kind::Read, e);
                return Tail::Dropped(Some(e));
            }
            Err(_) => {
                self.fail_over(server);
                return Tail::Dropped(Some(Error::Unavailable {
                    message: "HttpStore tail_events: no answer within the request timeout".into(),
                    source: None,
                    outcome_unknown: false,
                }));
            }
        };
        self.note_clock(res.headers());
        if !res.status().is_success() {
            let status = res.status();
            let bytes = res.bytes().await.unwrap_or_default();
            let e = match serde_json::from_slice::<Problem>(&bytes) {
                Ok(p) => p.into_error(op.name()),
                Err(_) => Error::Unavailable {
                    message: format!("HttpStore tail_events: the server answered {status}"),
                    source: None,
                    outcome_unknown: false,
                },
            };
            return if e.is_retryable() {
                Tail::Dropped(Some(e))
            } else {
                Tail::Ended(e)
            };
        }
        let mut body = res.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        // The server sends a keep-alive every 15 s: three missed is a dead
        // connection.
        let idle = Duration::from_secs(45);
        loop {
            let chunk = tokio::select! {
                c = tokio::time::timeout(idle, body.next()) => c,
                _ = tx.closed() => return Tail::Closed,
            };
            let chunk = match chunk {
                Err(_) | Ok(None) => return Tail::Dropped(None),
                Ok(Some(Err(_))) => return Tail::Dropped(None),
                Ok(Some(Ok(c))) => c,
            };
            buf.extend_from_slice(&chunk);
            while let Some(end) = find_frame_end(&buf) {
                let frame: Vec<u8> = buf.drain(..end.0).collect();
                buf.drain(..end.1);
                let Some(frame) = SseFrame::parse(&String::from_utf8_lossy(&frame)) else {
                    continue;
                };
                match frame.event.as_deref() {
                    Some("event") => {
                        let parsed = serde_json::from_str::<EventBody>(&frame.data)
                            .ok()
                            .and_then(|b| b.to_event().ok());
                        let Some(e) = parsed else {
                            return Tail::Ended(Error::corrupted(
                                "HttpStore tail_events: the server sent an event that is not the API's JSON",
                            ));
                        };
                        if e.seq <= *last {
                            continue;
                        }
                        *last = e.seq;
                        if tx.send(Ok(e)).await.is_err() {
                            return Tail::Closed;
                        }
                    }
                    Some("problem") => {
                        let e = serde_json::from_str::<Problem>(&frame.data)
                            .map(|p| p.into_error(op.name()))
                            .unwrap_or_else(|_| {
                                Error::corrupted("HttpStore tail_events: bad problem frame")
                            });
                        return if e.is_retryable() {
                            Tail::Dropped(Some(e))
                        } else {
                            Tail::Ended(e)
                        };
                    }
                    _ => {}
                }
            }
        }
    }

    fn watch_task(&self, topic: WatchTopic, tx: tokio::sync::watch::Sender<u64>) {
        let store = self.clone();
        let wait = store.inner.options.watch_wait;
        let fallback = store.inner.options.watch_fallback;
        // An events watch starts at the last seq this client has seen, so an
        // append after `watch()` always wakes it (one before it may, too:
        // wake-ups may be spurious).
        let mut since: Option<u64> = match &topic {
            WatchTopic::Events(scope) => Some(self.seen_seq(scope)),
            WatchTopic::Runnable(_) => None,
        };
        tokio::spawn(async move {
            loop {
                let r: Result<Waited> = match &topic {
                    WatchTopic::Runnable(scope) => {
                        let mut q = vec![("timeoutMs", wait.as_millis().to_string())];
                        if let Some(p) = scope.project_id() {
                            q.push(("project", p.to_string()));
                        }
                        if let Some(s) = scope.session_id() {
                            q.push(("session", s.to_string()));
                        }
                        let token = match store.token(scope.tenant_id()) {
                            Ok(t) => t.to_string(),
                            Err(_) => return,
                        };
                        let call = store.send::<op::WaitRunnable>(
                            &token,
                            At::Tenant(scope.tenant_id()),
                            &q,
                            &NoBody,
                            Some(wait),
                        );
                        tokio::select! {
                            r = call => r,
                            _ = tx.closed() => return,
                        }
                    }
                    WatchTopic::Events(scope) => {
                        let head = match since {
                            Some(s) => Ok(s),
                            None => {
                                let r: Result<EventBatchBody> = tokio::select! {
                                    r = store.run_get::<op::ReadEvents>(scope, vec![("sinceSeq", u64::MAX.to_string())]) => r,
                                    _ = tx.closed() => return,
                                };
                                r.map(|b| b.last_seq)
                            }
                        };
                        match head {
                            Err(e) => Err(e),
                            Ok(head) => {
                                since = Some(head);
                                let q = Self::run_query(
                                    scope,
                                    vec![
                                        ("sinceSeq", head.to_string()),
                                        ("timeoutMs", wait.as_millis().to_string()),
                                    ],
                                );
                                let token = match store.token(&scope.tenant_id) {
                                    Ok(t) => t.to_string(),
                                    Err(_) => return,
                                };
                                let call = store.send::<op::WaitEvents>(
                                    &token,
                                    At::Run(scope),
                                    &q,
                                    &NoBody,
                                    Some(wait),
                                );
                                tokio::select! {
                                    r = call => r,
                                    _ = tx.closed() => return,
                                }
                            }
                        }
                    }
                };
                match r {
                    Ok(w) => {
                        if let Some(s) = w.last_seq {
                            since = Some(s);
                        }
                        if w.changed {
                            tx.send_modify(|n| *n = n.wrapping_add(1));
                        }
                    }
                    Err(_) => {
                        // The server is away: the fallback interval wakes the
                        // watcher meanwhile; try again after it.
                        tokio::select! {
                            _ = tokio::time::sleep(fallback) => {}
                            _ = tx.closed() => return,
                        }
                    }
                }
            }
        });
    }
}

enum Tail {
    /// The consumer dropped the stream.
    Closed,
    /// The connection ended (with the error, if one is worth telling):
    /// reconnect.
    Dropped(Option<Error>),
    /// A refusal that reconnecting cannot cure.
    Ended(Error),
}

/// The end of the first SSE frame in `buf`: (frame length, separator length).
fn find_frame_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if i + 3 < buf.len() && &buf[i..i + 4] == b"\r\n\r\n" {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

/// One Server-Sent Events frame (the fields the API sends).
struct SseFrame {
    event: Option<String>,
    data: String,
}

impl SseFrame {
    fn parse(frame: &str) -> Option<Self> {
        let mut event = None;
        let mut data: Vec<&str> = Vec::new();
        for line in frame.lines() {
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => event = Some(value.to_string()),
                "data" => data.push(value),
                _ => {}
            }
        }
        if event.is_none() && data.is_empty() {
            return None;
        }
        Some(Self {
            event,
            data: data.join("\n"),
        })
    }
}

/// The path ids of schedule `name` in `session` (a session scope).
fn schedule_ids<'a>(session: &'a ListingScope, name: &'a str) -> [&'a str; 4] {
    [
        session.tenant_id().as_str(),
        session.project_id().map(|p| p.as_str()).unwrap_or(""),
        session.session_id().map(|s| s.as_str()).unwrap_or(""),
        name,
    ]
}

fn problem_error(p: Problem) -> Error {
    Error::corrupted(format!(
        "the server's answer does not convert: {}",
        p.into_details().detail.unwrap_or_default()
    ))
}

fn ms(t: Timestamp) -> String {
    t.as_millis().to_string()
}

fn fence_json(f: Option<Fence>) -> Option<u64> {
    f.map(Fence::get)
}

#[async_trait]
impl CheckpointStore for HttpStore {
    async fn write_checkpoint(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let body = WriteCheckpointBody {
            checkpoint: checkpoint.into(),
            fence: fence_json(fence),
        };
        let cp: CheckpointBody = self.run_write::<op::WriteCheckpoint>(scope, &body).await?;
        cp.to_checkpoint("checkpoint").map_err(problem_error)
    }

    async fn read_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
    ) -> Result<Option<Checkpoint>> {
        let m: MaybeCheckpoint = self
            .call::<op::ReadCheckpoint>(
                &scope.tenant_id,
                At::Checkpoint(scope, id),
                &Self::run_query(scope, vec![]),
                &NoBody,
            )
            .await?;
        m.checkpoint
            .map(|c| c.to_checkpoint("checkpoint").map_err(problem_error))
            .transpose()
    }

    async fn list_checkpoints(&self, scope: &RunScope) -> Result<Vec<Checkpoint>> {
        // Every checkpoint with its state, in pages of the server's largest
        // (`after` the last id of the previous page; a short page is the last).
        let mut out: Vec<Checkpoint> = Vec::new();
        loop {
            let mut q = vec![
                ("fields", "full".to_string()),
                ("limit", MAX_CHECKPOINTS_PAGE.to_string()),
            ];
            if let Some(last) = out.last() {
                q.push(("after", last.id.to_string()));
            }
            let Array(v) = self.run_get::<op::ListCheckpoints>(scope, q).await?;
            let n = v.len();
            for c in v {
                out.push(c.into_checkpoint("checkpoint").map_err(problem_error)?);
            }
            if n < MAX_CHECKPOINTS_PAGE {
                return Ok(out);
            }
        }
    }

    async fn delete_checkpoint(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        fence: Option<Fence>,
    ) -> Result<bool> {
        let mut q = vec![];
        if let Some(f) = fence {
            q.push(("fence", f.get().to_string()));
        }
        let d: Done = self
            .call::<op::DeleteCheckpoint>(
                &scope.tenant_id,
                At::Checkpoint(scope, id),
                &Self::run_query(scope, q),
                &NoBody,
            )
            .await?;
        Ok(d.done)
    }

    /// Refused (`Unsupported`): `update` is a function of this process and
    /// cannot be sent to the server. A LangGraph thread's pending writes,
    /// the read-modify-write the server offers, go through its thread
    /// writes route, which runs the update in the server's store.
    async fn update_checkpoint(
        &self,
        _scope: &RunScope,
        id: &CheckpointId,
        _update: runkeep::CheckpointUpdate,
        _fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        Err(runkeep::Error::Unsupported {
            message: format!(
                "update_checkpoint of {id}: an update function cannot be sent over HTTP; \
                 use a store in this process, or the server's thread writes route"
            ),
        })
    }

    async fn resolve_park(
        &self,
        scope: &RunScope,
        id: &CheckpointId,
        resolution: ParkResolution,
        // Over HTTP the server answers at its store's clock (module docs);
        // tests steer that clock ([`HttpStoreOptions::steer_clock`]).
        now: Timestamp,
        fence: Option<Fence>,
    ) -> Result<Checkpoint> {
        let _steered = self.steer_at(now).await;
        let body = ResolveBody {
            resolution: ResolutionBody::of(&resolution),
            fence: fence_json(fence),
        };
        let cp: CheckpointBody = self
            .call::<op::ResolvePark>(
                &scope.tenant_id,
                At::Checkpoint(scope, id),
                &Self::run_query(scope, vec![]),
                &body,
            )
            .await?;
        cp.to_checkpoint("checkpoint").map_err(problem_error)
    }

    async fn prune_checkpoints(
        &self,
        scope: &RunScope,
        keep_last: usize,
        fence: Option<Fence>,
    ) -> Result<Vec<CheckpointId>> {
        let body = PruneBody {
            keep_last,
            fence: fence_json(fence),
        };
        let p: Pruned = self.run_write::<op::PruneCheckpoints>(scope, &body).await?;
        p.deleted.into_iter().map(CheckpointId::new).collect()
    }

    async fn list_runs(&self, scope: &ListingScope, options: &ListOptions) -> Result<RunPage> {
        if !self.inner.tokens.contains_key(scope.tenant_id()) {
            // A tenant this store does not hold: nothing of it is here.
            return Ok(RunPage::default());
        }
        let mut q: Vec<(&'static str, String)> = vec![];
        if let Some(p) = scope.project_id() {
            q.push(("project", p.to_string()));
        }
        if let Some(s) = scope.session_id() {
            q.push(("session", s.to_string()));
        }
        q.push(("order", order_name(options.order).to_string()));
        if let Some(p) = options.min_priority {
            q.push(("minPriority", p.to_string()));
        }
        if let Some(park) = &options.park {
            q.push((
                "park",
                park.iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            ));
        }
        if let Some(c) = options.claimed {
            q.push(("claimed", c.to_string()));
        }
        if let Some(status) = &options.status {
            q.push((
                "status",
                status
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            ));
        }
        if let Some(l) = options.limit {
            q.push(("limit", l.to_string()));
        }
        if let Some(c) = &options.cursor {
            q.push(("cursor", c.clone()));
        }
        if let Some(n) = options.now {
            q.push(("now", ms(n)));
        }
        let page: RunPageBody = self
            .call::<op::ListRuns>(
                scope.tenant_id(),
                At::Tenant(scope.tenant_id()),
                &q,
                &NoBody,
            )
            .await?;
        page.to_page().map_err(problem_error)
    }

    async fn claim(&self, scope: &RunScope, options: &ClaimOptions) -> Result<ClaimOutcome> {
        let (options, _steered) = self.steer(options).await;
        let a: ClaimAnswer = self
            .run_write::<op::Claim>(scope, &ClaimBody::of(&options)?)
            .await?;
        a.to_outcome().map_err(problem_error)
    }

    async fn release(&self, scope: &RunScope, fence: Fence) -> Result<bool> {
        let d: Result<Done> = self
            .run_write::<op::Release>(
                scope,
                &ReleaseBody {
                    fence: Some(fence.get()),
                },
            )
            .await;
        stale_is_false(d)
    }

    async fn lease(&self, scope: &RunScope, now: Timestamp) -> Result<Option<LeaseSummary>> {
        let l: MaybeLease = self
            .run_get::<op::Lease>(scope, vec![("now", ms(now))])
            .await?;
        l.lease
            .map(|l| l.to_summary().map_err(problem_error))
            .transpose()
    }

    async fn claim_next(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
    ) -> Result<Option<(RunScope, Lease)>> {
        self.claim_next_waiting(scope, filter, options, Duration::ZERO)
            .await
    }

    /// One request (`POST …/claim-next-batch`): the server claims through
    /// its store's own `claim_next_batch`.
    async fn claim_next_batch(
        &self,
        scope: &ListingScope,
        filter: &ClaimNextFilter,
        options: &ClaimOptions,
        max: usize,
    ) -> Result<Vec<(RunScope, Lease)>> {
        runkeep::batch::check_size("claim_next_batch", max)?;
        let (options, _steered) = self.steer(options).await;
        let body = ClaimNextBatchBody {
            max: u32::try_from(max).expect("checked against MAX_BATCH"),
            claim: claim_next_body(scope, filter, &options, Duration::ZERO)?,
        };
        let token = self.token(scope.tenant_id())?.to_string();
        let answer: ClaimNextBatchAnswer = self
            .send::<op::ClaimNextBatch>(&token, At::Tenant(scope.tenant_id()), &[], &body, None)
            .await?;
        answer
            .claimed
            .into_iter()
            .map(|c| {
                Ok((
                    c.run.to_scope("run").map_err(problem_error)?,
                    c.lease.to_lease().map_err(problem_error)?,
                ))
            })
            .collect()
    }

    fn now(&self) -> Timestamp {
        match &self.inner.options.clock {
            Some(c) => c.now(),
            None => self.inner.store_clock.now(),
        }
    }

    async fn lifecycle(&self, scope: &RunScope) -> Result<Lifecycle> {
        let l: LifecycleBody = self.run_get::<op::Lifecycle>(scope, vec![]).await?;
        l.to_lifecycle().map_err(problem_error)
    }

    async fn enqueue(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
    ) -> Result<Checkpoint> {
        let body = EnqueueBody::of(checkpoint, options, None);
        let a: EnqueueAnswer = self.run_write::<op::Enqueue>(scope, &body).await?;
        match a {
            EnqueueAnswer::Written(cp) => cp.to_checkpoint("checkpoint").map_err(problem_error),
            EnqueueAnswer::Once(_) => Err(Error::backend(
                "HttpStore enqueue: the server answered an enqueue without an idempotency key as one with a key",
                std::io::Error::other("unexpected answer"),
            )),
        }
    }

    async fn enqueue_once(
        &self,
        scope: &RunScope,
        checkpoint: &Checkpoint,
        options: &EnqueueOptions,
        dedupe: Option<&runkeep::Dedupe>,
    ) -> Result<runkeep::Enqueued> {
        let body = EnqueueBody::of(checkpoint, options, dedupe);
        let a: EnqueueAnswer = self.run_write::<op::Enqueue>(scope, &body).await?;
        a.to_enqueued(scope).map_err(problem_error)
    }

    async fn set_priority(
        &self,
        scope: &RunScope,
        priority: runkeep::Priority,
    ) -> Result<Lifecycle> {
        let body = SetPriorityBody {
            priority: i64::from(priority.get()),
        };
        let l: LifecycleBody = self.run_write::<op::SetPriority>(scope, &body).await?;
        l.to_lifecycle().map_err(problem_error)
    }

    async fn key_holdings(
        &self,
        session: &ListingScope,
        key: &str,
    ) -> Result<Vec<runkeep::KeyHolding>> {
        let (Some(project), Some(id)) = (session.project_id(), session.session_id()) else {
            return Err(Error::invalid(format!(
                "concurrency keys are counted per session; scope {session} names no session"
            )));
        };
        let tenant = session.tenant_id();
        let at = At::Session(tenant, project, id);
        let body: KeyHoldingsBody = self
            .call::<op::KeyHoldings>(tenant, at, &[("key", key.to_string())], &NoBody)
            .await?;
        body.holdings
            .iter()
            .map(|h| h.to_holding().map_err(problem_error))
            .collect()
    }

    async fn finish(&self, scope: &RunScope, fence: Fence, outcome: &Outcome) -> Result<Lifecycle> {
        let body = FinishBody {
            fence: fence.get(),
            outcome: outcome.into(),
        };
        let l: LifecycleBody = self.run_write::<op::Finish>(scope, &body).await?;
        l.to_lifecycle().map_err(problem_error)
    }

    async fn snooze(&self, scope: &RunScope, fence: Fence, until: Timestamp) -> Result<bool> {
        let body = SnoozeBody {
            fence: fence.get(),
            until: until.as_millis(),
        };
        let d: Result<Done> = self.run_write::<op::Snooze>(scope, &body).await;
        stale_is_false(d)
    }

    async fn fail_attempt(
        &self,
        scope: &RunScope,
        fence: Fence,
        error: &runkeep::AttemptError,
        max_attempts: Option<u32>,
    ) -> Result<Lifecycle> {
        let body = FailAttemptBody {
            fence: fence.get(),
            error: error.into(),
            max_attempts,
        };
        let l: LifecycleBody = self.run_write::<op::FailAttempt>(scope, &body).await?;
        l.to_lifecycle().map_err(problem_error)
    }

    async fn cancel(&self, scope: &RunScope, reason: Option<&str>) -> Result<Lifecycle> {
        let body = CancelBody {
            reason: reason.map(str::to_owned),
        };
        let l: LifecycleBody = self.run_write::<op::Cancel>(scope, &body).await?;
        l.to_lifecycle().map_err(problem_error)
    }

    async fn reopen(&self, scope: &RunScope) -> Result<Lifecycle> {
        let l: LifecycleBody = self.run_write::<op::Reopen>(scope, &NoBody).await?;
        l.to_lifecycle().map_err(problem_error)
    }

    async fn put_schedule(
        &self,
        session: &ListingScope,
        schedule: &runkeep::scheduling::Schedule,
    ) -> Result<runkeep::scheduling::Schedule> {
        let s = runkeep::scheduling::schedule::session_of(session)?;
        schedule.validate()?;
        let ids = schedule_ids(&s, &schedule.name);
        let body = ScheduleBody::of(schedule, self.now());
        let stored: ScheduleBody = self
            .call::<op::PutSchedule>(s.tenant_id(), At::Schedule(ids), &[], &body)
            .await?;
        stored.to_schedule(self.now()).map_err(problem_error)
    }

    async fn get_schedule(
        &self,
        session: &ListingScope,
        name: &str,
    ) -> Result<Option<runkeep::scheduling::Schedule>> {
        let s = runkeep::scheduling::schedule::session_of(session)?;
        runkeep::scheduling::schedule::check_name(name)?;
        if !self.inner.tokens.contains_key(s.tenant_id()) {
            return Ok(None);
        }
        let m: MaybeSchedule = self
            .call::<op::GetSchedule>(
                s.tenant_id(),
                At::Schedule(schedule_ids(&s, name)),
                &[],
                &NoBody,
            )
            .await?;
        m.schedule
            .map(|b| b.to_schedule(self.now()).map_err(problem_error))
            .transpose()
    }

    async fn list_schedules(
        &self,
        scope: &ListingScope,
    ) -> Result<Vec<runkeep::scheduling::ScheduleEntry>> {
        if !self.inner.tokens.contains_key(scope.tenant_id()) {
            return Ok(Vec::new());
        }
        let mut q: Vec<(&'static str, String)> = vec![];
        if let Some(p) = scope.project_id() {
            q.push(("project", p.to_string()));
        }
        if let Some(s) = scope.session_id() {
            q.push(("session", s.to_string()));
        }
        let list: ScheduleList = self
            .call::<op::ListSchedules>(
                scope.tenant_id(),
                At::Tenant(scope.tenant_id()),
                &q,
                &NoBody,
            )
            .await?;
        list.schedules
            .iter()
            .map(|e| e.to_entry().map_err(problem_error))
            .collect()
    }

    async fn delete_schedule(&self, session: &ListingScope, name: &str) -> Result<bool> {
        let s = runkeep::scheduling::schedule::session_of(session)?;
        runkeep::scheduling::schedule::check_name(name)?;
        let d: Done = self
            .call::<op::DeleteSchedule>(
                s.tenant_id(),
                At::Schedule(schedule_ids(&s, name)),
                &[],
                &NoBody,
            )
            .await?;
        Ok(d.done)
    }

    async fn advance_schedule(
        &self,
        session: &ListingScope,
        name: &str,
        from: Option<Timestamp>,
        to: Timestamp,
    ) -> Result<bool> {
        let s = runkeep::scheduling::schedule::session_of(session)?;
        runkeep::scheduling::schedule::check_name(name)?;
        let body = AdvanceScheduleBody {
            from: from.map(Timestamp::as_millis),
            to: to.as_millis(),
        };
        let d: Done = self
            .call::<op::AdvanceSchedule>(
                s.tenant_id(),
                At::Schedule(schedule_ids(&s, name)),
                &[],
                &body,
            )
            .await?;
        Ok(d.done)
    }

    async fn prune_finished(
        &self,
        scope: &ListingScope,
        policy: &runkeep::scheduling::RetentionPolicy,
        now: Option<Timestamp>,
        limit: usize,
    ) -> Result<runkeep::scheduling::PruneReport> {
        runkeep::scheduling::retention::check_limit(limit)?;
        let body = crate::wire::PruneFinishedBody {
            project: scope.project_id().map(ToString::to_string),
            session: scope.session_id().map(ToString::to_string),
            keep_finished_for_ms: policy.keep_finished_for.as_millis(),
            now: now.map(Timestamp::as_millis),
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
        };
        let token = self.token(scope.tenant_id())?.to_string();
        let answer: crate::wire::PruneReportBody = self
            .send::<op::PruneFinished>(&token, At::Tenant(scope.tenant_id()), &[], &body, None)
            .await?;
        answer.to_report().map_err(problem_error)
    }

    async fn latest_checkpoint(&self, scope: &RunScope) -> Result<Option<Checkpoint>> {
        let m: MaybeCheckpoint = self.run_get::<op::LatestCheckpoint>(scope, vec![]).await?;
        m.checkpoint
            .map(|c| c.to_checkpoint("checkpoint").map_err(problem_error))
            .transpose()
    }

    async fn find_pending(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let m: MaybeCheckpoint = self
            .run_get::<op::FindPending>(scope, vec![("now", ms(now))])
            .await?;
        m.checkpoint
            .map(|c| c.to_checkpoint("checkpoint").map_err(problem_error))
            .transpose()
    }

    async fn resume_point(&self, scope: &RunScope, now: Timestamp) -> Result<Option<Checkpoint>> {
        let m: MaybeCheckpoint = self
            .run_get::<op::ResumePoint>(scope, vec![("now", ms(now))])
            .await?;
        m.checkpoint
            .map(|c| c.to_checkpoint("checkpoint").map_err(problem_error))
            .transpose()
    }

    fn watch(&self, topic: &WatchTopic) -> Watch {
        let fallback = self.inner.options.watch_fallback;
        let tenant = match topic {
            WatchTopic::Runnable(s) => s.tenant_id(),
            WatchTopic::Events(s) => &s.tenant_id,
        };
        if tokio::runtime::Handle::try_current().is_err() || self.token(tenant).is_err() {
            return Watch::polling(fallback);
        }
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        self.watch_task(topic.clone(), tx);
        Watch::notified(rx, fallback)
    }
}

#[async_trait]
impl EvidenceStore for HttpStore {
    async fn append_events(
        &self,
        scope: &RunScope,
        events: &[NewEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<PersistedEvent>> {
        let body = AppendEventsBody {
            events: events.iter().map(Into::into).collect(),
            fence: fence_json(fence),
        };
        let a: Appended = self.run_write::<op::AppendEvents>(scope, &body).await?;
        if let Some(last) = a.events.last() {
            self.note_seq(scope, last.seq);
        }
        a.events
            .iter()
            .map(|e| e.to_event().map_err(problem_error))
            .collect()
    }

    async fn read_events(
        &self,
        scope: &RunScope,
        options: &ReadEventsOptions,
    ) -> Result<EventBatch> {
        // The server answers at most MAX_EVENTS_PAGE events a request: the
        // events after `since_seq` (up to `limit`) are read in pages. A
        // strict read checks the whole log with its first page; damage a
        // later page meets (appended since) is `Corrupted` as well.
        let mut out = EventBatch::default();
        let mut since = options.since_seq;
        let mut first = true;
        loop {
            let left = options
                .limit
                .map_or(MAX_EVENTS_PAGE, |l| l.saturating_sub(out.events.len()));
            let page = left.min(MAX_EVENTS_PAGE);
            let mut q = vec![("sinceSeq", since.to_string()), ("limit", page.to_string())];
            if options.integrity == Integrity::Strict && first {
                q.push(("integrity", "strict".to_string()));
            }
            let b: EventBatchBody = self.run_get::<op::ReadEvents>(scope, q).await?;
            self.note_seq(scope, b.last_seq);
            let (more, next) = (b.more, b.next_since_seq);
            let batch = b.to_batch().map_err(problem_error)?;
            if options.integrity == Integrity::Strict && !first && !batch.skipped.is_empty() {
                return Err(Error::corrupted(format!(
                    "transcript of run {}: a damaged record after seq {since}",
                    scope.run_id
                )));
            }
            first = false;
            out.last_seq = out.last_seq.max(batch.last_seq);
            for s in batch.skipped {
                if !out.skipped.iter().any(|k| k.position == s.position) {
                    out.skipped.push(s);
                }
            }
            out.events.extend(batch.events);
            let more_wanted = options.limit.is_none_or(|l| out.events.len() < l);
            match (more, next) {
                (true, Some(n)) if more_wanted && n > since => since = n,
                _ => return Ok(out),
            }
        }
    }

    async fn write_run_record(
        &self,
        scope: &RunScope,
        record: &RunRecord,
        fence: Option<Fence>,
    ) -> Result<()> {
        let body = RecordBody {
            record: record.clone(),
            fence: fence_json(fence),
        };
        let _: Done = self.run_write::<op::WriteRunRecord>(scope, &body).await?;
        Ok(())
    }

    async fn read_run_record(&self, scope: &RunScope) -> Result<Option<RunRecord>> {
        let r: MaybeRecord = self.run_get::<op::ReadRunRecord>(scope, vec![]).await?;
        Ok(r.record)
    }

    async fn write_messages(
        &self,
        scope: &RunScope,
        messages: &[Value],
        through_event_seq: u64,
        fence: Option<Fence>,
    ) -> Result<()> {
        let body = WriteMessagesBody {
            messages: messages.to_vec(),
            through_event_seq,
            fence: fence_json(fence),
        };
        let _: Done = self.run_write::<op::WriteMessages>(scope, &body).await?;
        Ok(())
    }

    async fn read_messages(&self, scope: &RunScope) -> Result<MessageSnapshot> {
        let m: MessagesBody = self.run_get::<op::ReadMessages>(scope, vec![]).await?;
        Ok(m.to_snapshot())
    }

    async fn write_report(
        &self,
        scope: &RunScope,
        report: &str,
        fence: Option<Fence>,
    ) -> Result<()> {
        let body = ReportBody {
            report: report.to_string(),
            fence: fence_json(fence),
        };
        let _: Done = self.run_write::<op::WriteReport>(scope, &body).await?;
        Ok(())
    }

    async fn read_report(&self, scope: &RunScope) -> Result<Option<String>> {
        let r: MaybeReport = self.run_get::<op::ReadReport>(scope, vec![]).await?;
        Ok(r.report)
    }

    async fn append_audit(
        &self,
        scope: &RunScope,
        events: &[NewAuditEvent],
        fence: Option<Fence>,
    ) -> Result<Vec<AuditRecord>> {
        let body = AppendAuditBody {
            events: events.iter().map(Into::into).collect(),
            fence: fence_json(fence),
        };
        let a: AuditList = self.run_write::<op::AppendAudit>(scope, &body).await?;
        a.records
            .iter()
            .map(|r| r.to_record().map_err(problem_error))
            .collect()
    }

    async fn read_audit(&self, scope: &RunScope, since_seq: u64) -> Result<Vec<AuditRecord>> {
        let a: AuditList = self
            .run_get::<op::ReadAudit>(scope, vec![("sinceSeq", since_seq.to_string())])
            .await?;
        a.records
            .iter()
            .map(|r| r.to_record().map_err(problem_error))
            .collect()
    }

    async fn commit_step(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
    ) -> Result<StepReceipt> {
        let body = CommitStepBody {
            fence: fence.get(),
            step: step.into(),
        };
        let r: StepReceiptBody = self.run_write::<op::CommitStep>(scope, &body).await?;
        if let Some(last) = r.events.last() {
            self.note_seq(scope, last.seq);
        }
        r.to_receipt().map_err(problem_error)
    }

    /// One request (`POST …/steps/hand-over`): the server commits the step
    /// and claims through its store's own `commit_step_and_claim_next`
    /// (one transaction on PostgreSQL). Two cases the route cannot carry
    /// take the provided body's two requests instead: a next claim in
    /// another tenant than the step's (the path names one tenant, and a
    /// token serves one), and a claim at a chosen instant under
    /// [`HttpStoreOptions::steer_clock`] (tests only: steering the backing
    /// store's clock for one request would move the step's instant too).
    ///
    /// A lost reply is outcome unknown for both parts: the step may have
    /// committed and the next run may have been claimed under
    /// `next.options.holder`, in which case that run stays held until its
    /// lease expires.
    async fn commit_step_and_claim_next(
        &self,
        scope: &RunScope,
        fence: Fence,
        step: &Step,
        next: &NextClaim,
    ) -> Result<Handover> {
        let steered = next.options.now.is_some() && self.inner.options.steer_clock.is_some();
        if next.scope.tenant_id() != &scope.tenant_id || steered {
            let receipt = self.commit_step(scope, fence, step).await?;
            let next = self
                .claim_next(&next.scope, &next.filter, &next.options)
                .await;
            return Ok(Handover { receipt, next });
        }
        let body = HandOverBody {
            fence: fence.get(),
            step: step.into(),
            next: NextClaimBody::of(next)?,
        };
        let a: HandOverAnswer = self
            .run_write::<op::CommitStepAndClaimNext>(scope, &body)
            .await?;
        if let Some(last) = a.receipt.events.last() {
            self.note_seq(scope, last.seq);
        }
        let receipt = a.receipt.to_receipt().map_err(problem_error)?;
        let next = match (a.next, a.next_error) {
            (None, None) => Ok(None),
            (None, Some(p)) => Err(p.into_error("claim_next")),
            (Some(c), None) => Ok(Some((
                c.run.to_scope("next.run").map_err(problem_error)?,
                c.lease.to_lease().map_err(problem_error)?,
            ))),
            (Some(_), Some(p)) => Err(Error::corrupted(format!(
                "the server's hand-over answered both a next run and a claim error: {}",
                p.into_details().detail.unwrap_or_default()
            ))),
        };
        Ok(Handover { receipt, next })
    }

    /// One request (`POST {tenant}/steps`) when every step is in one
    /// tenant: the server commits through its store's own `commit_steps`.
    /// Steps in several tenants (a token serves one) take the provided
    /// body's one request per step.
    async fn commit_steps(&self, steps: &[StepCommit]) -> Result<Vec<Result<StepReceipt>>> {
        runkeep::batch::check_group(steps)?;
        let tenant = &steps[0].scope.tenant_id;
        if steps.iter().any(|s| &s.scope.tenant_id != tenant) {
            return runkeep::batch::commit_one_by_one(steps, |s| {
                self.commit_step(&s.scope, s.fence, &s.step)
            })
            .await;
        }
        for s in steps {
            s.step.validate(&s.scope)?;
        }
        let body = CommitStepsBody {
            steps: steps
                .iter()
                .map(|s| StepCommitBody {
                    run: (&s.scope).into(),
                    fence: s.fence.get(),
                    step: (&s.step).into(),
                })
                .collect(),
        };
        let token = self.token(tenant)?.to_string();
        let answer: CommitStepsAnswer = self
            .send::<op::CommitSteps>(&token, At::Tenant(tenant), &[], &body, None)
            .await?;
        if answer.outcomes.len() != steps.len() {
            return Err(Error::corrupted(format!(
                "the server answered {} outcomes to a group commit of {} steps",
                answer.outcomes.len(),
                steps.len()
            )));
        }
        Ok(steps
            .iter()
            .zip(answer.outcomes)
            .map(|(s, o)| match (o.receipt, o.problem) {
                (Some(r), None) => {
                    if let Some(last) = r.events.last() {
                        self.note_seq(&s.scope, last.seq);
                    }
                    r.to_receipt().map_err(problem_error)
                }
                (None, Some(p)) => Err(p.into_error("commit_step")),
                _ => Err(Error::corrupted(format!(
                    "the server's group commit answered run {} with neither or both of a receipt and a problem",
                    s.scope.run_id
                ))),
            })
            .collect())
    }
}

/// `claim-next`'s body for a claim under `scope` and `filter`, waiting up
/// to `wait` (zero: not at all).
fn claim_next_body(
    scope: &ListingScope,
    filter: &ClaimNextFilter,
    options: &ClaimOptions,
    wait: Duration,
) -> Result<ClaimNextBody> {
    let claim = ClaimBody::of(options)?;
    Ok(ClaimNextBody {
        project: scope.project_id().map(ToString::to_string),
        session: scope.session_id().map(ToString::to_string),
        park: filter
            .park
            .as_ref()
            .map(|v| v.iter().map(|p| (*p).into()).collect()),
        order: filter.order.into(),
        holder: claim.holder,
        ttl_ms: claim.ttl_ms,
        max_attempts: claim.max_attempts,
        wait_ms: (!wait.is_zero()).then_some(wait.as_millis() as u64),
    })
}
