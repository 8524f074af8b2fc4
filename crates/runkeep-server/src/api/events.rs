//! Events: append (fenced), read after `sinceSeq`, the live tail as
//! Server-Sent Events, and the long-poll wait behind `HttpStore::watch`.
//!
//! # The tail
//!
//! `GET …/events/stream` sends every event after `sinceSeq` (or after the
//! `Last-Event-ID` header, which wins: a reconnecting `EventSource` sends
//! it) as one SSE `event: event` whose `id` is the event's `seq` and whose
//! `data` is the event's JSON, then waits on the store's watch for more.
//! Seqs are the store's, so a client that reconnects, to this server or to
//! a restarted one on the same store, with the last id it saw gets exactly
//! the events after it: none lost, none repeated.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::{Stream, StreamExt};
use runkeep::{Integrity, ReadEventsOptions, WatchTopic};

use super::answers::{kib, AnswerBudget, ChargedBytes, HEAVY_KIB, READ_FACTOR};
use super::claims::checked;
use super::extract::{JsonBody, RunAddr, Q};
use super::runs::ApiResult;
use crate::auth::Principal;
use crate::problem::Problem;
use crate::state::AppState;
use runkeep_http::wire::params::{ReadQuery, StreamQuery, WaitEventsQuery};
use runkeep_http::wire::{self, Appended, EventBody, Waited};

pub use runkeep_http::wire::MAX_WAIT_MS;
/// The default wait when none is given.
const DEFAULT_WAIT_MS: u64 = 25_000;
/// How many events the tail reads per store call.
pub const SSE_BATCH: usize = 500;

pub(super) fn bounded_wait(ms: Option<u64>) -> Result<Duration, Problem> {
    let ms = ms.unwrap_or(DEFAULT_WAIT_MS);
    if ms > MAX_WAIT_MS {
        return Err(Problem::invalid(
            "timeoutMs",
            format!("timeoutMs {ms} is above the limit of {MAX_WAIT_MS} ms; wait again instead"),
        ));
    }
    Ok(Duration::from_millis(ms))
}

pub(super) async fn append(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<wire::AppendEventsBody>,
) -> ApiResult<Appended> {
    let events: Vec<runkeep::NewEvent> = body.events.iter().map(Into::into).collect();
    let fence = wire::opt_fence("fence", body.fence)?;
    let out = checked(
        &state,
        state.store.append_events(&scope, &events, fence).await,
    )?;
    Ok(Json(Appended {
        events: out.iter().map(Into::into).collect(),
    }))
}

pub use runkeep_http::wire::{DEFAULT_EVENTS_PAGE, MAX_EVENTS_PAGE};
/// What one chunk of a streamed page aims at, bytes: the events read from
/// the store and serialized at once.
const CHUNK_BYTES: usize = 256 * 1024;
/// The most events one chunk reads.
const MAX_CHUNK_EVENTS: usize = 256;

/// A page of events as it is streamed: read from the store a chunk at a
/// time, each chunk serialized once and charged to the answer budget while
/// it is in flight.
struct Pager {
    state: AppState,
    scope: runkeep::RunScope,
    answers: AnswerBudget,
    tenant: String,
    key: String,
    strict: bool,
    /// The last seq sent (the next chunk reads after it).
    since: u64,
    /// Events the page may still hold.
    remaining: usize,
    sent: usize,
    /// Bytes per event, as seen so far (0: none seen).
    per_event: usize,
    skipped: std::collections::BTreeMap<u64, String>,
    last_seq: u64,
    /// The store had no more events at the last read.
    at_end: bool,
    /// Chunks read so far.
    chunks: usize,
}

impl Pager {
    fn chunk_len(&self) -> usize {
        let n = match self.per_event {
            0 => 1,
            b => (CHUNK_BYTES / b).clamp(1, MAX_CHUNK_EVENTS),
        };
        n.min(self.remaining)
    }

    /// The next chunk of the page's events, serialized (`None`: the page
    /// is complete). The first chunk starts the object.
    async fn next(&mut self) -> Result<Option<ChargedBytes>, Problem> {
        let first = self.chunks == 0;
        if !first && (self.remaining == 0 || self.at_end) {
            return Ok(None);
        }
        let want = self.chunk_len();
        let estimate = match self.per_event {
            0 => self.answers.before_read(&self.key),
            b => kib(b.saturating_mul(want)).saturating_mul(READ_FACTOR),
        };
        let mut held = self.answers.charge(&self.tenant, estimate).await?;
        // After the first chunk, each is heavy work (answers.rs).
        let heavy = if first { 0 } else { HEAVY_KIB };
        let turn = self.answers.heavy(&self.tenant, heavy).await;
        // A strict read checks the whole log once, with the first chunk;
        // damage the later chunks meet ends the answer (below).
        let integrity = if self.strict && first {
            Integrity::Strict
        } else {
            Integrity::Tolerant
        };
        let batch = self
            .state
            .store
            .read_events(
                &self.scope,
                &ReadEventsOptions {
                    since_seq: self.since,
                    integrity,
                    limit: Some(want),
                },
            )
            .await?;
        if self.strict && !first && !batch.skipped.is_empty() {
            return Err(Problem::from(runkeep::Error::corrupted(format!(
                "transcript of run {}: a damaged record after seq {}",
                self.scope.run_id, self.since
            ))));
        }
        self.last_seq = self.last_seq.max(batch.last_seq);
        for s in &batch.skipped {
            self.skipped
                .entry(s.position)
                .or_insert_with(|| crate::problem::redact_paths(&s.reason));
        }
        self.at_end = batch.events.len() < want;
        self.chunks += 1;
        self.remaining -= batch.events.len();
        let (since, sent) = (self.since, self.sent);
        let events = batch.events;
        let out = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            if first {
                out.extend_from_slice(b"{\"events\":[");
            }
            let mut last = since;
            for (i, e) in events.iter().enumerate() {
                if sent + i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut out, &EventBody::from(e)).unwrap_or_default();
                last = last.max(e.seq);
            }
            (out, last, events.len())
        })
        .await
        .map_err(|_| {
            Problem::new(
                crate::problem::ProblemType::Backend,
                "the answer could not be written",
            )
        })?;
        let (bytes, last, n) = out;
        if n > 0 {
            let body = bytes.len().saturating_sub(if first { 11 } else { 0 });
            self.per_event = body.div_ceil(n).max(1);
            self.answers.learn(&self.key, self.per_event);
        }
        drop(turn);
        self.since = last;
        self.sent += n;
        held.set_bytes(bytes.len()).await?;
        Ok(Some(ChargedBytes::new(bytes, Some(held))))
    }

    /// The object's end: what was skipped, the log's last seq, whether more
    /// events follow the page and where the next page starts.
    fn trailer(&self) -> Vec<u8> {
        let skipped: Vec<wire::SkippedBody> = self
            .skipped
            .iter()
            .map(|(p, r)| wire::SkippedBody {
                position: *p,
                reason: r.clone(),
            })
            .collect();
        let more = self.remaining == 0 && !self.at_end && self.since < self.last_seq;
        let mut tail = serde_json::json!({
            "skipped": skipped,
            "lastSeq": self.last_seq,
            "more": more,
        });
        // Only after events: an empty page's next read is its own sinceSeq
        // (which may be any number a client sent).
        if self.sent > 0 {
            tail["nextSinceSeq"] = serde_json::json!(self.since);
        }
        let mut out = b"],".to_vec();
        let t = serde_json::to_vec(&tail).unwrap_or_default();
        // `{"skipped":…}` without its `{`: the object continues.
        out.extend_from_slice(&t[1..]);
        out
    }
}

pub(super) async fn read(
    State(state): State<AppState>,
    Extension(answers): Extension<AnswerBudget>,
    RunAddr(scope): RunAddr,
    Q(q): Q<ReadQuery>,
) -> Result<Response, Problem> {
    let strict = match q.integrity.as_deref() {
        None | Some("tolerant") => false,
        Some("strict") => true,
        Some(other) => {
            return Err(Problem::invalid(
                "integrity",
                format!("integrity {other:?} is not one of tolerant, strict"),
            ))
        }
    };
    let limit = q.limit.unwrap_or(DEFAULT_EVENTS_PAGE);
    if limit > MAX_EVENTS_PAGE {
        return Err(Problem::invalid(
            "limit",
            format!(
                "limit {limit} is above the maximum of {MAX_EVENTS_PAGE} events a page; read in pages (each answer's nextSinceSeq, while more is true)"
            ),
        ));
    }
    let since = super::extract::seq_param("sinceSeq", q.since_seq)?;
    let mut pager = Pager {
        tenant: scope.tenant_id.to_string(),
        key: format!("events {scope}"),
        state,
        scope,
        answers,
        strict,
        since,
        remaining: limit,
        sent: 0,
        per_event: 0,
        skipped: Default::default(),
        last_seq: 0,
        at_end: false,
        chunks: 0,
    };
    // The first chunk before the head: a run that cannot be read, a strict
    // read of a damaged log or a full budget is a problem answer.
    let first = pager.next().await?;
    let head = futures_util::stream::iter(first.map(|c| Ok::<_, std::io::Error>(c.into_bytes())));
    let rest = futures_util::stream::unfold(Some(pager), |p| async move {
        let mut p = p?;
        match p.next().await {
            Ok(Some(c)) => Some((Ok(c.into_bytes()), Some(p))),
            Ok(None) => Some((Ok(bytes::Bytes::from(p.trailer())), None)),
            Err(e) => {
                // The head is sent: the answer can only be cut short.
                tracing::warn!(run = %p.scope, problem = ?e.detail, "event read: a later chunk failed; the answer is cut short");
                Some((
                    Err(std::io::Error::other("event read failed mid-answer")),
                    None,
                ))
            }
        }
    });
    let body = axum::body::Body::from_stream(head.chain(rest));
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

pub(super) async fn stream(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RunAddr(scope): RunAddr,
    headers: HeaderMap,
    Q(q): Q<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let since = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Problem::invalid(
                    "Last-Event-ID",
                    "Last-Event-ID is not an event seq (a whole number)",
                )
            })
            .and_then(|n| super::extract::seq_param("Last-Event-ID", Some(n)))?,
        None => super::extract::seq_param("sinceSeq", q.since_seq)?,
    };
    // Fail before the stream starts when the run's log cannot be read.
    state
        .store
        .read_events(
            &scope,
            &ReadEventsOptions {
                since_seq: u64::MAX,
                ..Default::default()
            },
        )
        .await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        let _client = state.metrics.sse_client();
        // A revoked token's tail ends (with a 401 `problem` event).
        let revoked = crate::auth::revoked(state.auth.clone(), principal);
        tokio::pin!(revoked);
        let end_revoked = |tx: tokio::sync::mpsc::Sender<Event>| async move {
            let p = crate::auth::revoked_problem();
            let data = serde_json::to_string(&p).unwrap_or_default();
            let _ = tx.send(Event::default().event("problem").data(data)).await;
        };
        let mut since = since;
        loop {
            if futures_util::FutureExt::now_or_never(&mut revoked).is_some() {
                return end_revoked(tx).await;
            }
            let mut watch = state.store.watch(&WatchTopic::Events(scope.clone()));
            let batch = state
                .store
                .read_events(
                    &scope,
                    &ReadEventsOptions {
                        since_seq: since,
                        integrity: Integrity::Tolerant,
                        limit: Some(SSE_BATCH),
                    },
                )
                .await;
            let events = match batch {
                Ok(b) => b.events,
                Err(e) => {
                    tracing::warn!(run = %scope, error = %e, "event tail: read failed; closing the stream");
                    let p = Problem::from(e);
                    let data = serde_json::to_string(&p).unwrap_or_default();
                    let _ = tx.send(Event::default().event("problem").data(data)).await;
                    return;
                }
            };
            let full = events.len() == SSE_BATCH;
            for e in &events {
                let data = serde_json::to_string(&EventBody::from(e)).unwrap_or_default();
                let ev = Event::default()
                    .event("event")
                    .id(e.seq.to_string())
                    .data(data);
                if tx.send(ev).await.is_err() {
                    return;
                }
                since = since.max(e.seq);
            }
            if full {
                continue;
            }
            tokio::select! {
                _ = watch.changed() => {}
                _ = tx.closed() => return,
                () = &mut revoked => return end_revoked(tx).await,
            }
        }
    });
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok)));
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

pub(super) async fn wait(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RunAddr(scope): RunAddr,
    Q(q): Q<WaitEventsQuery>,
) -> ApiResult<Waited> {
    let timeout = bounded_wait(q.timeout_ms)?;
    let since = super::extract::seq_param("sinceSeq", q.since_seq)?;
    let deadline = tokio::time::Instant::now() + timeout;
    let head = ReadEventsOptions {
        since_seq: u64::MAX,
        ..Default::default()
    };
    let revoked = crate::auth::revoked(state.auth.clone(), principal);
    tokio::pin!(revoked);
    loop {
        let mut watch = state.store.watch(&WatchTopic::Events(scope.clone()));
        let last = state.store.read_events(&scope, &head).await?.last_seq;
        if last > since {
            return Ok(Json(Waited {
                changed: true,
                last_seq: Some(last),
            }));
        }
        tokio::select! {
            woke = tokio::time::timeout_at(deadline, watch.changed()) => {
                if woke.is_err() {
                    return Ok(Json(Waited {
                        changed: false,
                        last_seq: Some(last),
                    }));
                }
            }
            () = &mut revoked => return Err(crate::auth::revoked_problem()),
        }
    }
}
