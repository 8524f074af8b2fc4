//! The listing of runs with durable state: rows, the per-run digest every
//! backend keeps, filters, the stable orders, the cursor and paging.
//!
//! # Orders
//!
//! Only keys that cannot move are sort keys, so a run that checkpoints again
//! between pages is neither lost nor repeated:
//!
//! - [`ListOrder::RunId`]: `(0, 0, run_id, parent)`.
//! - [`ListOrder::CreatedAt`]: unrecorded `run_created_at` ⇒ `(0, 0, run_id,
//!   parent)`; recorded ⇒ `(1, run_created_at, run_id, parent)`. Unrecorded
//!   runs come first; a recorded `0` sorts after all of them.
//!
//! The parent is part of the key, so the same run id under two parents pages
//! correctly. Across sessions (a tenant or project listing) the same run id
//! may recur, so a row's key ends with its project and session
//! ([`RowKey::project`], [`RowKey::session`]): the order is total over a
//! whole tenant, and a page boundary between two such rows loses neither.
//!
//! # Cursor
//!
//! Opaque and versioned: it encodes the last row's key together with the
//! order, the filters and the scope it was issued for, plus a checksum. A
//! cursor from another order, filter or scope, or one that was edited, is
//! refused with [`Error::InvalidInput`].

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{CheckpointHeader, FenceHistory, OrderKey};
use crate::error::{Error, Result};
use crate::id::{CheckpointId, ProjectId, RunId, SessionId};
use crate::lease::{LeaseSummary, TopHolding};
use crate::lifecycle::{Lifecycle, RunStatus};
use crate::park::{park_precedence, ParkState, ParkSummary};
use crate::scheduling::Priority;
use crate::scope::{ListingScope, RunScope};
use crate::time::Timestamp;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page size; larger requests are clamped.
pub const MAX_LIMIT: usize = 1000;

/// Listing order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ListOrder {
    /// By run id (the default).
    #[default]
    RunId,
    /// By run start instant, unrecorded first.
    CreatedAt,
    /// By priority, highest first, then run id
    /// ([`crate::scheduling::priority`]).
    Priority,
}

impl ListOrder {
    fn code(self) -> &'static str {
        match self {
            ListOrder::RunId => "runId",
            ListOrder::CreatedAt => "createdAt",
            ListOrder::Priority => "priority",
        }
    }
}

impl std::str::FromStr for ListOrder {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "runId" | "run-id" | "run_id" => Ok(ListOrder::RunId),
            "createdAt" | "created-at" | "created_at" => Ok(ListOrder::CreatedAt),
            "priority" => Ok(ListOrder::Priority),
            other => Err(Error::invalid(format!(
                "order {other:?} is not one of runId, createdAt, priority (run-id, created-at also read)"
            ))),
        }
    }
}

/// Options of a listing call.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    /// Order.
    pub order: ListOrder,
    /// Keep only rows whose park is in this set. `None` ⇒ no filter. An empty
    /// set is refused (it would be ambiguous: "nothing" or "no filter").
    pub park: Option<Vec<ParkState>>,
    /// `Some(true)`: only runs held live; `Some(false)`: only runs nobody holds
    /// live (never claimed, released, expired or unreadable holding).
    pub claimed: Option<bool>,
    /// Page size; default [`DEFAULT_LIMIT`], `0` reads as 1, clamped to [`MAX_LIMIT`].
    pub limit: Option<usize>,
    /// Continue after this cursor.
    pub cursor: Option<String>,
    /// The instant expiry is judged at; the store's clock when `None`.
    pub now: Option<Timestamp>,
    /// Keep only rows whose lifecycle status is in this set. `None` ⇒ no
    /// filter; an empty set is refused.
    pub status: Option<Vec<RunStatus>>,
    /// Keep only rows whose priority is at least this. `None` ⇒ no filter.
    pub min_priority: Option<Priority>,
}

impl ListOptions {
    /// These options with `now` filled from the store's clock when unset.
    pub fn judged_at(&self, store_now: impl FnOnce() -> Timestamp) -> ListOptions {
        let mut o = self.clone();
        if o.now.is_none() {
            o.now = Some(store_now());
        }
        o
    }
}

/// One run with durable state. A row is addressable: its `scope` can be
/// passed to every per-run operation.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRow {
    /// The run's address.
    #[serde(flatten)]
    pub scope: RunScope,
    /// Run start (minimum over its checkpoints); absent when never recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_created_at: Option<Timestamp>,
    /// Number of checkpoints.
    pub checkpoint_count: u64,
    /// Latest checkpoint under the total order; absent only on a damaged row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_checkpoint_id: Option<CheckpointId>,
    /// Its `created_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_checkpoint_at: Option<Timestamp>,
    /// The park by precedence; absent when never parked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<ParkSummary>,
    /// The top holding; absent when never claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<LeaseSummary>,
    /// Set when the run's records could not be read: the error, so the row is
    /// flagged instead of failing the page or vanishing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
    /// Lifecycle status (contract v2); `active` for a run without a record.
    /// Serialized only when not `active`, so a row of a run that never left
    /// the v1 shape reads as it did (absent means active).
    #[serde(default, skip_serializing_if = "is_active")]
    pub status: RunStatus,
    /// When it was finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Takeovers from expired leases so far (serialized when not 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// Not claimable before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_at: Option<Timestamp>,
    /// Dead-lettered: failed because its holders kept losing it
    /// ([`Lifecycle::is_dead_lettered`]). Carried on the row so that a
    /// listing of dead letters reads no lifecycle record per failed run.
    /// Serialized only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dead_lettered: bool,
    /// Its priority (serialized when not 0).
    #[serde(default, skip_serializing_if = "Priority::is_default")]
    pub priority: Priority,
    /// Its concurrency key, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
}

fn is_active(s: &RunStatus) -> bool {
    *s == RunStatus::Active
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_rank(n: &i64) -> bool {
    *n == 0
}

impl RunRow {
    /// A flagged row for a run whose records could not be read.
    pub fn damaged(scope: RunScope, error: &Error, claim: Option<LeaseSummary>) -> Self {
        Self {
            scope,
            run_created_at: None,
            checkpoint_count: 0,
            latest_checkpoint_id: None,
            latest_checkpoint_at: None,
            park: None,
            claim,
            damaged: Some(error.to_string()),
            status: RunStatus::Active,
            finished_at: None,
            attempts: 0,
            available_at: None,
            dead_lettered: false,
            priority: Priority::default(),
            concurrency_key: None,
        }
    }

    /// Sets the lifecycle columns from `l`.
    pub fn with_lifecycle(mut self, l: &Lifecycle) -> Self {
        self.status = l.status;
        self.finished_at = l.finished_at;
        self.attempts = l.attempts;
        self.available_at = l.available_at;
        self.dead_lettered = l.is_dead_lettered();
        self.priority = l.priority;
        self.concurrency_key = l.concurrency.as_ref().map(|c| c.key.clone());
        self
    }

    /// True when a claim at `now` may take this run: active, not deferred
    /// past `now`, not damaged, nobody holding it live.
    pub fn is_claimable(&self, now: Timestamp) -> bool {
        self.damaged.is_none()
            && !self.status.is_finished()
            && self.available_at.is_none_or(|at| now >= at)
            && self.is_unheld()
    }

    /// The key `claim_next` takes this row in: highest priority first,
    /// then `order`.
    pub fn claim_key(&self, order: ListOrder) -> RowKey {
        self.key(order).with_priority(self.priority)
    }

    /// The sort key of this row in `order`.
    pub fn key(&self, order: ListOrder) -> RowKey {
        let k = RowKey::new(
            order,
            &self.scope.run_id,
            self.scope.parent_run_id.as_ref(),
            self.run_created_at,
        );
        if order == ListOrder::Priority {
            k.with_priority(self.priority)
        } else {
            k
        }
        .in_session(&self.scope.project_id, &self.scope.session_id)
    }

    /// True when nobody holds the run live at the page's instant.
    pub fn is_unheld(&self) -> bool {
        self.claim.as_ref().is_none_or(|c| c.expired)
    }
}

/// A page of rows. `cursor` is present iff the page is non-empty and more
/// rows remain after it.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct RunPage {
    /// Rows.
    pub entries: Vec<RunRow>,
    /// Continue here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// The sort key of a row.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct RowKey {
    /// [`Priority::rank`] in the priority order and in `claim_next`'s keys
    /// (higher priorities first); 0 otherwise.
    #[serde(default, skip_serializing_if = "is_zero_rank")]
    pub prio: i64,
    /// 0 = unrecorded (or run-id order), 1 = recorded.
    pub rank: u8,
    /// `run_created_at` when ranked 1.
    pub stamp: i64,
    /// Run id.
    pub run_id: String,
    /// Parent id, empty for a top-level run.
    pub parent: String,
    /// The row's project: breaks ties between runs of the same id in
    /// different sessions of a tenant or project listing. Empty in a key
    /// built by [`RowKey::new`] alone (a single session's walk, which needs
    /// no tie-break) and in cursors issued before it existed; see
    /// [`ListQuery::is_after_cursor`] for how an empty one compares.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub project: String,
    /// The row's session (the tie-break's second part, with `project`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session: String,
}

impl RowKey {
    /// The key of a run in `order`.
    pub fn new(
        order: ListOrder,
        run: &RunId,
        parent: Option<&RunId>,
        created: Option<Timestamp>,
    ) -> Self {
        let (rank, stamp) = match (order, created) {
            (ListOrder::CreatedAt, Some(t)) => (1, t.as_millis()),
            _ => (0, 0),
        };
        Self {
            prio: 0,
            rank,
            stamp,
            run_id: run.to_string(),
            parent: parent.map(|p| p.to_string()).unwrap_or_default(),
            project: String::new(),
            session: String::new(),
        }
    }

    /// This key ranked by `priority` first (higher first).
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.prio = priority.rank();
        self
    }

    /// This key with the tie-break of a row in `project`/`session`.
    pub fn in_session(mut self, project: &ProjectId, session: &SessionId) -> Self {
        self.project = project.to_string();
        self.session = session.to_string();
        self
    }

    /// True when the key carries the project/session tie-break.
    pub fn has_tie(&self) -> bool {
        !self.project.is_empty() || !self.session.is_empty()
    }

    /// The key without its tie-break: `(prio, rank, stamp, run_id, parent)`.
    fn base(&self) -> (i64, u8, i64, &str, &str) {
        (self.prio, self.rank, self.stamp, &self.run_id, &self.parent)
    }

    /// This key without its tie-break.
    pub fn without_tie(&self) -> RowKey {
        RowKey {
            project: String::new(),
            session: String::new(),
            ..self.clone()
        }
    }

    /// A key just below this one (without a tie-break): no run's key lies
    /// between the two, so a cursor there continues with this key's own
    /// run. What continues one session's listing at a run that a cursor of
    /// a wider listing stopped at in an earlier session. It holds a
    /// character no id can hold (ids are ASCII, the module's id rule), so
    /// it is never a row's key.
    pub fn just_before(&self) -> RowKey {
        // The largest string below an id: its last character lowered by
        // one, followed by the highest character. Every id character is at
        // least `-`, so the lowered one is still a character.
        fn below(s: &str) -> String {
            let mut out: String = s
                .chars()
                .take(s.chars().count().saturating_sub(1))
                .collect();
            if let Some(last) = s.chars().last() {
                out.push(char::from_u32(u32::from(last) - 1).unwrap_or('\0'));
            }
            out.push(char::MAX);
            out
        }
        let mut k = self.without_tie();
        if k.parent.is_empty() {
            k.run_id = below(&k.run_id);
            k.parent = char::MAX.to_string();
        } else {
            k.parent = below(&k.parent);
        }
        k
    }
}

/// Per-run summary every backend keeps up to date with each write, so a
/// listing never parses a run's checkpoints.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunDigest {
    /// Minimum `run_created_at` over the run's checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_created_at: Option<Timestamp>,
    /// Number of checkpoints.
    pub checkpoint_count: u64,
    /// The latest checkpoint's header (total order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest: Option<CheckpointHeader>,
    /// The header of every checkpoint carrying a park.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parks: Vec<CheckpointHeader>,
    /// The fence history of the run's checkpoints, which places unstamped
    /// ones in the total order. Required (no default), so a digest stored
    /// before it existed does not parse and is rebuilt.
    pub fence_history: FenceHistory,
    /// Whether any checkpoint of the run is unstamped (their place moves
    /// when the history does).
    pub has_unstamped: bool,
}

impl RunDigest {
    /// The header of the pending park at `now`: the latest (total order)
    /// checkpoint whose park is outstanding, as [`crate::park::find_pending`]
    /// finds it among whole checkpoints. A backend that keeps a digest
    /// answers `find_pending` with this and one checkpoint read.
    pub fn pending_park(&self, now: Timestamp) -> Option<&CheckpointHeader> {
        self.parks
            .iter()
            .filter(|h| {
                h.park
                    .as_ref()
                    .is_some_and(|p| p.state(now) == crate::park::ParkState::Outstanding)
            })
            .max_by_key(|h| h.order_key(&self.fence_history))
    }

    /// Built from every checkpoint header of a run.
    pub fn from_headers<'a>(headers: impl IntoIterator<Item = &'a CheckpointHeader>) -> Self {
        let headers: Vec<&CheckpointHeader> = headers.into_iter().collect();
        let mut d = RunDigest {
            fence_history: FenceHistory::of(headers.iter().map(|h| (h.fence, h.created_at))),
            ..RunDigest::default()
        };
        for h in headers {
            d.checkpoint_count += 1;
            d.merge(h.clone());
        }
        d
    }

    fn merge(&mut self, h: CheckpointHeader) {
        if let Some(r) = h.run_created_at {
            self.run_created_at = Some(self.run_created_at.map_or(r, |m| m.min(r)));
        }
        self.has_unstamped |= h.fence.is_none();
        self.parks.retain(|p| p.id != h.id);
        if h.park.is_some() {
            self.parks.push(h.clone());
        }
        let history = &self.fence_history;
        if self
            .latest
            .as_ref()
            .is_none_or(|l| h.order_key(history) >= l.order_key(history))
        {
            self.latest = Some(h);
        }
    }

    /// Applies a write of `h`. `replaced` says whether a checkpoint with the
    /// same id existed. Returns false (and leaves the digest unchanged) when
    /// the digest cannot be updated incrementally: the replaced checkpoint
    /// was the latest and the new one sorts lower; the replaced one may
    /// have carried the minimum `run_created_at` and the new one does not
    /// carry that same value; or the run mixes stamped and unstamped
    /// checkpoints and this write may move the unstamped ones (a new step in
    /// the fence history, a replaced stamp, an unstamped write into a run
    /// with stamps). The caller then rebuilds it from all headers.
    #[must_use]
    pub fn apply_write(&mut self, h: CheckpointHeader, replaced: bool) -> bool {
        let mut history = self.fence_history.clone();
        let moved = history.note(h.fence, h.created_at);
        let unstamped = self.has_unstamped || h.fence.is_none();
        // Only the place of unstamped checkpoints depends on the history;
        // a run without stamps, or without unstamped checkpoints, is kept
        // incrementally as before.
        if (unstamped && moved)
            || (h.fence.is_none() && !history.is_empty())
            || (replaced && unstamped && !history.is_empty())
        {
            return false;
        }
        if replaced {
            if let Some(l) = &self.latest {
                if l.id == h.id && h.order_key(&history) < l.order_key(&history) {
                    return false;
                }
            }
            if self.run_created_at.is_some() && h.run_created_at != self.run_created_at {
                return false;
            }
            self.fence_history = history;
            self.merge(h);
        } else {
            self.fence_history = history;
            self.checkpoint_count += 1;
            self.merge(h);
        }
        true
    }

    /// The latest checkpoint's order key.
    pub fn latest_key(&self) -> Option<OrderKey> {
        self.latest
            .as_ref()
            .map(|l| l.order_key(&self.fence_history))
    }

    /// The listing row, judged at `now`; `None` for a run with no checkpoints.
    pub fn row(&self, scope: RunScope, top: Option<&TopHolding>, now: Timestamp) -> Option<RunRow> {
        let latest = self.latest.as_ref()?;
        if self.checkpoint_count == 0 {
            return None;
        }
        Some(RunRow {
            scope,
            run_created_at: self.run_created_at,
            checkpoint_count: self.checkpoint_count,
            latest_checkpoint_id: Some(latest.id.clone()),
            latest_checkpoint_at: Some(latest.created_at),
            park: park_precedence(&self.parks, &self.fence_history, now),
            claim: top.map(|t| t.summary(now)),
            damaged: None,
            status: RunStatus::Active,
            finished_at: None,
            attempts: 0,
            available_at: None,
            dead_lettered: false,
            priority: Priority::default(),
            concurrency_key: None,
        })
    }
}

/// A validated listing request: every backend builds one and uses it to
/// filter, order and page.
#[derive(Clone, Debug)]
pub struct ListQuery {
    /// The scope.
    pub scope: ListingScope,
    /// Order.
    pub order: ListOrder,
    /// Park filter (never empty).
    pub park: Option<Vec<ParkState>>,
    /// Claimed filter.
    pub claimed: Option<bool>,
    /// Status filter (never empty).
    pub status: Option<Vec<RunStatus>>,
    /// Lowest priority kept.
    pub min_priority: Option<Priority>,
    /// Effective page size.
    pub limit: usize,
    /// Start strictly after this key.
    pub after: Option<RowKey>,
    /// The page's instant.
    pub now: Timestamp,
}

#[derive(Serialize, Deserialize)]
struct CursorBody {
    v: u8,
    o: String,
    f: String,
    s: String,
    k: RowKey,
    c: String,
}

const CURSOR_PREFIX: &str = "rk1.";

/// The checksum of a cursor body. The tie-break joins the summed parts only
/// when the key has one, so a cursor issued without it stays valid.
fn key_checksum(order: &str, filters: &str, scope: &str, k: &RowKey) -> String {
    let (rank, stamp) = (k.rank.to_string(), k.stamp.to_string());
    let mut parts = vec![
        "v1", order, filters, scope, &rank, &stamp, &k.run_id, &k.parent,
    ];
    if k.has_tie() {
        parts.push(&k.project);
        parts.push(&k.session);
    }
    checksum(&parts)
}

fn checksum(parts: &[&str]) -> String {
    // FNV-1a 64 over the parts with separators: detects edits and damage. It
    // is not a secret; it makes a cursor something only a listing issues.
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    for p in parts {
        h.write(p.as_bytes());
        h.write(&[0x1f]);
    }
    format!("{:016x}", h.finish())
}

impl ListQuery {
    /// Validates options against a scope.
    pub fn new(scope: &ListingScope, options: &ListOptions) -> Result<Self> {
        if let Some(p) = &options.park {
            if p.is_empty() {
                return Err(Error::invalid(
                    "park filter is an empty set; pass no park filter to list every run, or name at least one of outstanding, expired, resolved",
                ));
            }
        }
        let mut park = options.park.clone();
        if let Some(p) = park.as_mut() {
            p.sort();
            p.dedup();
        }
        if options.status.as_ref().is_some_and(Vec::is_empty) {
            return Err(Error::invalid(
                "status filter is an empty set; pass no status filter to list every run, or name at least one of active, completed, failed, cancelled",
            ));
        }
        let mut status = options.status.clone();
        if let Some(s) = status.as_mut() {
            s.sort();
            s.dedup();
        }
        let limit = options.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
        let mut q = Self {
            scope: scope.clone(),
            order: options.order,
            park,
            claimed: options.claimed,
            status,
            min_priority: options.min_priority,
            limit,
            after: None,
            now: options.now.unwrap_or_else(Timestamp::now),
        };
        if let Some(c) = &options.cursor {
            q.after = Some(q.decode_cursor(c)?);
        }
        Ok(q)
    }

    /// The query `claim_next` filters candidates with: the filter's park
    /// states and order, nobody holding the run live at `now`.
    pub fn claim_next(
        scope: &ListingScope,
        filter: &crate::store::ClaimNextFilter,
        now: Timestamp,
    ) -> Result<Self> {
        Self::new(
            scope,
            &ListOptions {
                order: filter.order,
                park: filter.park.clone(),
                claimed: Some(false),
                limit: Some(1),
                cursor: None,
                now: Some(now),
                status: None,
                min_priority: None,
            },
        )
    }

    fn filter_digest(&self) -> String {
        let park = self
            .park
            .as_ref()
            .map(|p| p.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","))
            .unwrap_or_else(|| "*".into());
        let claimed = match self.claimed {
            None => "*",
            Some(true) => "claimed",
            Some(false) => "unclaimed",
        };
        let status = self
            .status
            .as_ref()
            .map(|v| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","))
            .unwrap_or_else(|| "*".into());
        let mut digest = if status == "*" {
            // The digest of a query without a status filter is the one
            // contract v1 issued, so its cursors stay valid.
            format!("park={park};claimed={claimed}")
        } else {
            format!("park={park};claimed={claimed};status={status}")
        };
        if let Some(p) = self.min_priority {
            digest.push_str(&format!(";minPriority={p}"));
        }
        digest
    }

    fn body_checksum(&self, k: &RowKey) -> String {
        key_checksum(
            self.order.code(),
            &self.filter_digest(),
            &self.scope.to_string(),
            k,
        )
    }

    /// Encodes a cursor positioned at `key`.
    pub fn encode_cursor(&self, key: &RowKey) -> String {
        let body = CursorBody {
            v: 1,
            o: self.order.code().into(),
            f: self.filter_digest(),
            s: self.scope.to_string(),
            k: key.clone(),
            c: self.body_checksum(key),
        };
        let json = serde_json::to_vec(&body).unwrap_or_default();
        format!(
            "{CURSOR_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
        )
    }

    fn decode_cursor(&self, cursor: &str) -> Result<RowKey> {
        let not_ours = || {
            Error::invalid(format!(
                "cursor {cursor:?} is not a cursor this listing issued (order {})",
                self.order.code()
            ))
        };
        let raw = cursor.strip_prefix(CURSOR_PREFIX).ok_or_else(not_ours)?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(raw)
            .map_err(|_| not_ours())?;
        let body: CursorBody = serde_json::from_slice(&bytes).map_err(|_| not_ours())?;
        if body.v != 1 {
            return Err(Error::invalid(format!(
                "cursor has version {}; this listing issues version 1",
                body.v
            )));
        }
        if body.c != key_checksum(&body.o, &body.f, &body.s, &body.k) {
            return Err(Error::invalid(format!(
                "cursor {cursor:?} is malformed: its checksum does not match (edited or damaged)"
            )));
        }
        if body.o != self.order.code() {
            return Err(Error::invalid(format!(
                "cursor was issued for order {} and cannot continue a listing in order {}",
                body.o,
                self.order.code()
            )));
        }
        if body.f != self.filter_digest() {
            return Err(Error::invalid(format!(
                "cursor was issued for filters [{}] and cannot continue a listing with filters [{}]",
                body.f,
                self.filter_digest()
            )));
        }
        if body.s != self.scope.to_string() {
            return Err(Error::invalid(format!(
                "cursor was issued for scope {} and cannot continue a listing of {}",
                body.s, self.scope
            )));
        }
        Ok(body.k)
    }

    /// True when a row passes the filters. A damaged row passes every filter:
    /// its park and claim cannot be established, and hiding it would hide the
    /// damage.
    pub fn matches(&self, row: &RunRow) -> bool {
        if row.damaged.is_some() {
            return true;
        }
        if let Some(states) = &self.park {
            match &row.park {
                Some(p) if states.contains(&p.state) => {}
                _ => return false,
            }
        }
        if let Some(statuses) = &self.status {
            if !statuses.contains(&row.status) {
                return false;
            }
        }
        if self.min_priority.is_some_and(|p| row.priority < p) {
            return false;
        }
        match self.claimed {
            None => true,
            Some(true) => !row.is_unheld(),
            Some(false) => row.is_unheld(),
        }
    }

    /// True when a row with `key` lies after the cursor.
    ///
    /// Keys compare as `(rank, stamp, run_id, parent)`, then by the
    /// tie-break `(project, session)` when both the key and the cursor
    /// carry one. A key without it (a single session's walk builds its keys
    /// with [`RowKey::new`]) is not after a cursor at the same run; a
    /// cursor without it (one issued before the tie-break existed, or by a
    /// single session) continues strictly after its run, as it always did.
    pub fn is_after_cursor(&self, key: &RowKey) -> bool {
        let Some(a) = &self.after else {
            return true;
        };
        match key.base().cmp(&a.base()) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => {
                a.has_tie()
                    && key.has_tie()
                    && (&key.project, &key.session) > (&a.project, &a.session)
            }
        }
    }

    /// Builds a page from candidate rows in any order: filters, orders,
    /// slices, and sets the cursor iff rows remain.
    pub fn paginate(&self, rows: impl IntoIterator<Item = RunRow>) -> RunPage {
        let mut keyed: Vec<(RowKey, RunRow)> = rows
            .into_iter()
            .filter(|r| r.scope.is_within(&self.scope))
            .map(|r| (r.key(self.order), r))
            .filter(|(k, r)| self.is_after_cursor(k) && self.matches(r))
            .collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        self.page_from_sorted(keyed)
    }

    /// Builds a page from rows already filtered and sorted by key, after the
    /// cursor. At most `limit + 1` are needed.
    pub fn page_from_sorted(&self, sorted: Vec<(RowKey, RunRow)>) -> RunPage {
        let more = sorted.len() > self.limit;
        let entries: Vec<(RowKey, RunRow)> = sorted.into_iter().take(self.limit).collect();
        let cursor = if more {
            entries.last().map(|(k, _)| self.encode_cursor(k))
        } else {
            None
        };
        RunPage {
            entries: entries.into_iter().map(|(_, r)| r).collect(),
            cursor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> ListingScope {
        ListingScope::tenant("tnt_a".parse().unwrap())
    }

    /// Cursors already issued carry this checksum: its bytes must not
    /// change (the value from the hand-written FNV-1a 64 it was made with).
    #[test]
    fn cursor_checksums_are_the_fnv_1a_64_issued() {
        let parts = [
            "v1",
            "runId",
            "",
            "t/p/s",
            "7",
            "1700000000000",
            "run_abc",
            "",
        ];
        assert_eq!(checksum(&parts), "0b2561b5f166de50");
    }

    #[test]
    fn cursors_are_bound_to_order_filters_and_scope() {
        let q = ListQuery::new(&scope(), &ListOptions::default()).unwrap();
        let key = RowKey::new(ListOrder::RunId, &"run_b".parse().unwrap(), None, None);
        let c = q.encode_cursor(&key);
        let ok = ListQuery::new(
            &scope(),
            &ListOptions {
                cursor: Some(c.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(ok.after, Some(key));
        let other_order = ListOptions {
            cursor: Some(c.clone()),
            order: ListOrder::CreatedAt,
            ..Default::default()
        };
        assert!(ListQuery::new(&scope(), &other_order)
            .unwrap_err()
            .to_string()
            .contains("order"));
        let other_filter = ListOptions {
            cursor: Some(c.clone()),
            claimed: Some(false),
            ..Default::default()
        };
        assert!(ListQuery::new(&scope(), &other_filter).is_err());
        let other_scope = ListingScope::tenant("tnt_b".parse().unwrap());
        assert!(ListQuery::new(
            &other_scope,
            &ListOptions {
                cursor: Some(c),
                ..Default::default()
            }
        )
        .is_err());
        for forged in ["run_c", "::run_a", "rk1.", "rk1.!!!", "0:0:run_a"] {
            let err = ListQuery::new(
                &scope(),
                &ListOptions {
                    cursor: Some(forged.into()),
                    ..Default::default()
                },
            )
            .unwrap_err();
            assert!(
                err.to_string().contains("not a cursor this listing issued"),
                "{forged}: {err}"
            );
        }
        // An edited cursor (valid base64 JSON with a changed key) is refused.
        let forged = CursorBody {
            v: 1,
            o: "runId".into(),
            f: "park=*;claimed=*".into(),
            s: "tnt_a".into(),
            k: RowKey {
                prio: 0,
                rank: 0,
                stamp: 0,
                run_id: "run_z".into(),
                parent: String::new(),
                project: String::new(),
                session: String::new(),
            },
            c: "0000000000000000".into(),
        };
        let forged = format!(
            "{CURSOR_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(serde_json::to_vec(&forged).unwrap())
        );
        let err = ListQuery::new(
            &scope(),
            &ListOptions {
                cursor: Some(forged),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
    }

    #[test]
    fn limits_are_clamped_and_empty_park_filter_refused() {
        assert_eq!(
            ListQuery::new(
                &scope(),
                &ListOptions {
                    limit: Some(0),
                    ..Default::default()
                }
            )
            .unwrap()
            .limit,
            1
        );
        assert_eq!(
            ListQuery::new(
                &scope(),
                &ListOptions {
                    limit: Some(usize::MAX),
                    ..Default::default()
                }
            )
            .unwrap()
            .limit,
            MAX_LIMIT
        );
        assert!(ListQuery::new(
            &scope(),
            &ListOptions {
                park: Some(vec![]),
                ..Default::default()
            }
        )
        .is_err());
    }

    #[test]
    fn replacing_the_checkpoint_that_carried_the_minimum_run_start_asks_for_a_rebuild() {
        let h = |id: &str, rca: Option<i64>| CheckpointHeader {
            id: id.parse().unwrap(),
            created_at: Timestamp::from_millis(10).unwrap(),
            run_created_at: rca.map(|r| Timestamp::from_millis(r).unwrap()),
            fence: None,
            park: None,
        };
        let mut d = RunDigest::from_headers(&[h("cp_a", Some(1)), h("cp_b", Some(5))]);
        assert_eq!(d.run_created_at, Some(Timestamp::from_millis(1).unwrap()));
        // cp_a (which carried the minimum 1) is rewritten with 5: the true
        // minimum is now 5, which an incremental merge cannot know.
        assert!(!d.apply_write(h("cp_a", Some(5)), true));
        // Rewriting with the same minimum stays incremental.
        assert!(d.apply_write(h("cp_a", Some(1)), true));
        assert_eq!(d.checkpoint_count, 2);
    }

    #[test]
    fn created_at_order_puts_unrecorded_first_and_zero_after_them() {
        let z = RowKey::new(ListOrder::CreatedAt, &"run_z".parse().unwrap(), None, None);
        let a = RowKey::new(
            ListOrder::CreatedAt,
            &"run_a".parse().unwrap(),
            None,
            Some(Timestamp::EPOCH),
        );
        assert!(z < a);
    }
}
