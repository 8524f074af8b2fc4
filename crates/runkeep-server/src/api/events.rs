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
use axum::{Extension, Json};
use futures_util::Stream;
use runkeep::{Integrity, ReadEventsOptions, WatchTopic};
use serde::Deserialize;

use super::claims::checked;
use super::extract::{JsonBody, RunAddr, Q};
use super::runs::ApiResult;
use crate::auth::Principal;
use crate::problem::Problem;
use crate::state::AppState;
use crate::wire::{self, Appended, EventBatchBody, EventBody, Waited};

/// The longest long-poll (`claim_next`'s `waitMs`, the waits' `timeoutMs`).
pub const MAX_WAIT_MS: u64 = 30_000;
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

/// An event read's query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReadQuery {
    /// Only events with `seq` above this (exclusive; default 0).
    since_seq: Option<u64>,
    /// `tolerant` (default: skip damaged records and list them) or `strict`.
    integrity: Option<String>,
    /// At most this many events.
    limit: Option<usize>,
    /// The parent run, for a sub-run.
    #[expect(
        dead_code,
        reason = "read only by serde: the parent is part of the run address, parsed so that deny_unknown_fields accepts it"
    )]
    parent: Option<String>,
}

pub(super) async fn read(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    Q(q): Q<ReadQuery>,
) -> ApiResult<EventBatchBody> {
    let integrity = match q.integrity.as_deref() {
        None | Some("tolerant") => Integrity::Tolerant,
        Some("strict") => Integrity::Strict,
        Some(other) => {
            return Err(Problem::invalid(
                "integrity",
                format!("integrity {other:?} is not one of tolerant, strict"),
            ))
        }
    };
    let batch = state
        .store
        .read_events(
            &scope,
            &ReadEventsOptions {
                since_seq: super::extract::seq_param("sinceSeq", q.since_seq)?,
                integrity,
                limit: q.limit,
            },
        )
        .await?;
    Ok(Json((&batch).into()))
}

/// The tail's query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Start after this `seq` (the `Last-Event-ID` header wins over it).
    since_seq: Option<u64>,
    /// The parent run, for a sub-run.
    #[expect(
        dead_code,
        reason = "read only by serde: the parent is part of the run address, parsed so that deny_unknown_fields accepts it"
    )]
    parent: Option<String>,
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

/// The events wait's query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitEventsQuery {
    /// Answer as soon as the log's last `seq` is above this.
    since_seq: Option<u64>,
    /// Wait at most this long, ms (at most 30 000; default 25 000).
    timeout_ms: Option<u64>,
    /// The parent run, for a sub-run.
    #[expect(
        dead_code,
        reason = "read only by serde: the parent is part of the run address, parsed so that deny_unknown_fields accepts it"
    )]
    parent: Option<String>,
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
