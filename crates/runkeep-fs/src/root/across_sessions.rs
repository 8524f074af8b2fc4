//! Listings and `claim_next` over a tenant or a project: the sessions'
//! own listings merged k-way in the core's total order (row key, then
//! project and session), each session read a page at a time, so a page
//! reads at most `limit + 1` rows of each session.

use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use runkeep::checkpoint::Checkpoint;
use runkeep::listing::{ListQuery, RowKey, MAX_LIMIT};
use runkeep::{
    CheckpointStore, ClaimNextFilter, ClaimOptions, ClaimOutcome, Error, Lease, ListOptions,
    ListingScope, Result, RunDigest, RunPage, RunRow, RunScope, Timestamp,
};

use super::layout::{self, key_of, session_scope, SessionKey};
use super::routing;
use super::session_cache::RootInner;
use crate::diagnose::Diagnosis;
use crate::fs_store::FsStore;

/// How many candidates `claim_next` reads from a session at a time (the
/// first claimable run is usually near the front; more are read as the
/// merge consumes them).
const CLAIM_FETCH: usize = 32;

/// One session's rows in order, read a page at a time.
struct Stream {
    store: FsStore,
    scope: ListingScope,
    rows: VecDeque<RunRow>,
    next: Option<String>,
    /// In `claim_next`'s order: where the next page starts.
    next_key: Option<RowKey>,
}

/// The k-way merge of the sessions' listings in the core's order.
struct Merge {
    fetched: Arc<AtomicU64>,
    order: runkeep::ListOrder,
    /// Merging `claim_next`'s candidates: in its order (priority first,
    /// [`RunRow::claim_key`]), each session asked for its own.
    claim: bool,
    options: ListOptions,
    streams: Vec<Stream>,
    heads: BinaryHeap<std::cmp::Reverse<(RowKey, usize)>>,
}

impl Merge {
    /// Starts every session's listing after the query's cursor. `options`
    /// are what each session is asked (filters, the page's instant, the
    /// fetch size); the cursor is re-issued for each session's scope.
    async fn start(
        fetched: Arc<AtomicU64>,
        sessions: Vec<(SessionKey, FsStore)>,
        query: &ListQuery,
        options: ListOptions,
        claim: bool,
    ) -> Result<Self> {
        let mut m = Merge {
            fetched,
            order: query.order,
            claim,
            options,
            streams: Vec::with_capacity(sessions.len()),
            heads: BinaryHeap::new(),
        };
        for (k, store) in sessions {
            let scope = session_scope(&k);
            // The same position as a cursor the session's listing accepts
            // (bound to its scope, order and filters; a session's keys
            // carry no tie-break): strictly after the cursor's run in the
            // cursor's own session and before it, and from that run on
            // (just before it) in a session that sorts after it.
            let cursor = match &query.after {
                Some(after) => {
                    let later = after.has_tie()
                        && (k.project_id.as_str(), k.session_id.as_str())
                            > (after.project.as_str(), after.session.as_str());
                    let at = if later {
                        after.just_before()
                    } else {
                        after.without_tie()
                    };
                    Some(ListQuery::new(&scope, &m.options)?.encode_cursor(&at))
                }
                None => None,
            };
            m.streams.push(Stream {
                store,
                scope,
                rows: VecDeque::new(),
                next: cursor,
                next_key: None,
            });
            let i = m.streams.len() - 1;
            m.fetch(i, true).await?;
        }
        Ok(m)
    }

    /// Reads the next page of stream `i` (the first one with `first`) and
    /// queues its head.
    async fn fetch(&mut self, i: usize, first: bool) -> Result<()> {
        let s = &mut self.streams[i];
        if self.claim {
            if !first && s.next_key.is_none() {
                return Ok(());
            }
            let (rows, next) = s
                .store
                .claim_page(&s.scope, &self.options, s.next_key.take())
                .await?;
            self.fetched.fetch_add(rows.len() as u64, Ordering::Relaxed);
            s.rows.extend(rows);
            s.next_key = next;
        } else {
            if !first && s.next.is_none() {
                return Ok(());
            }
            let page = s
                .store
                .list_runs(
                    &s.scope,
                    &ListOptions {
                        cursor: s.next.take(),
                        ..self.options.clone()
                    },
                )
                .await?;
            self.fetched
                .fetch_add(page.entries.len() as u64, Ordering::Relaxed);
            s.rows.extend(page.entries);
            s.next = page.cursor;
        }
        if s.rows.is_empty() && (s.next.is_some() || s.next_key.is_some()) {
            // A page whose rows all fell to the filters: read on.
            return Box::pin(self.fetch(i, false)).await;
        }
        if let Some(r) = self.streams[i].rows.front() {
            let k = self.key_of(r);
            self.heads.push(std::cmp::Reverse((k, i)));
        }
        Ok(())
    }

    /// The next row in merged order.
    async fn next(&mut self) -> Result<Option<(RowKey, RunRow)>> {
        let Some(std::cmp::Reverse((key, i))) = self.heads.pop() else {
            return Ok(None);
        };
        let Some(row) = self.streams[i].rows.pop_front() else {
            return Ok(None);
        };
        match self.streams[i].rows.front() {
            Some(r) => {
                let k = self.key_of(r);
                self.heads.push(std::cmp::Reverse((k, i)))
            }
            None => self.fetch(i, false).await?,
        }
        Ok(Some((key, row)))
    }

    /// A row's place in the merge.
    fn key_of(&self, r: &RunRow) -> RowKey {
        if self.claim {
            r.claim_key(self.order)
        } else {
            r.key(self.order)
        }
    }
}

/// Re-reads a just-claimed run's park against the filter (it may have
/// been answered between the listing and the claim).
async fn still_matches(
    store: &FsStore,
    scope: &RunScope,
    filter: &ClaimNextFilter,
    now: Timestamp,
) -> Result<bool> {
    let Some(states) = &filter.park else {
        return Ok(true);
    };
    let cps = store.list_checkpoints(scope).await?;
    let headers: Vec<_> = cps.iter().map(Checkpoint::header).collect();
    let d = RunDigest::from_headers(&headers);
    Ok(
        runkeep::park::park_precedence(&d.parks, &d.fence_history, now)
            .is_some_and(|p| states.contains(&p.state)),
    )
}

/// A page of the runs under `scope`: the sessions' listings merged
/// k-way in the core's order, each read at most a page past the cursor.
pub(super) async fn list_across(
    inner: &Arc<RootInner>,
    scope: &ListingScope,
    options: &ListOptions,
) -> Result<RunPage> {
    let query = ListQuery::new(scope, &options.judged_at(|| inner.clock.now()))?;
    let sessions = routing::sessions(inner, scope).await?;
    let fetch = ListOptions {
        order: query.order,
        park: query.park.clone(),
        claimed: query.claimed,
        status: query.status.clone(),
        min_priority: query.min_priority,
        // One row past the page tells whether more remain.
        limit: Some((query.limit + 1).min(MAX_LIMIT)),
        cursor: None,
        now: Some(query.now),
    };
    let mut merge = Merge::start(inner.fetched.clone(), sessions, &query, fetch, false).await?;
    let mut rows = Vec::with_capacity(query.limit + 1);
    while rows.len() <= query.limit {
        let Some((key, row)) = merge.next().await? else {
            break;
        };
        if row.scope.is_within(scope) && query.is_after_cursor(&key) && query.matches(&row) {
            rows.push((key, row));
        }
    }
    Ok(query.page_from_sorted(rows))
}

/// The first claimable run under `scope` in the merged order, claimed
/// through its session's lease.
pub(super) async fn claim_next_across(
    inner: &Arc<RootInner>,
    scope: &ListingScope,
    filter: &ClaimNextFilter,
    options: &ClaimOptions,
) -> Result<Option<(RunScope, Lease)>> {
    let now = options.judged_at(|| inner.clock.now());
    let query = ListQuery::claim_next(scope, filter, now)?;
    let options = options.clone().at(now);
    let sessions = routing::sessions(inner, scope).await?;
    let fetch = ListOptions {
        order: filter.order,
        park: filter.park.clone(),
        claimed: Some(false),
        status: None,
        min_priority: None,
        limit: Some(CLAIM_FETCH),
        cursor: None,
        now: Some(now),
    };
    let stores: HashMap<SessionKey, FsStore> = sessions.iter().cloned().collect();
    let mut merge = Merge::start(inner.fetched.clone(), sessions, &query, fetch, true).await?;
    let mut contended = None;
    // The first claimable run in the merged order, the rule MemoryStore
    // applies over (row key, scope); each candidate is claimed through
    // its session's lease, so two callers never get one run at one
    // fence.
    while let Some((_, row)) = merge.next().await? {
        if !(query.matches(&row) && row.is_claimable(now)) {
            continue;
        }
        let Some(store) = stores.get(&key_of(&row.scope)) else {
            continue;
        };
        #[cfg(feature = "testing")]
        {
            let pause = inner.pause.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some((barrier, seen)) = pause {
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(row.scope.clone());
                barrier.wait().await;
            }
        }
        match store.claim(&row.scope, &options).await {
            Ok(ClaimOutcome::Acquired(lease)) => {
                if !still_matches(store, &row.scope, filter, now).await? {
                    store.release(&row.scope, lease.fence).await?;
                    continue;
                }
                return Ok(Some((row.scope, lease)));
            }
            Ok(
                ClaimOutcome::Held(_)
                | ClaimOutcome::Finished(_)
                | ClaimOutcome::NotBefore(_)
                | ClaimOutcome::AtLimit(_),
            ) => {}
            Err(e @ Error::Contended { .. }) => contended = Some(e),
            Err(e) => return Err(e),
        }
    }
    match contended {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

/// A read-only health scan of every session under `scope`
/// ([`crate::FsRootStore::diagnose`]): each session's own scan summed,
/// plus the tenant, project, session or `runs` entries that are symbolic
/// links (listed in `unreadable`: runkeep never follows them).
pub(super) fn diagnose(
    inner: &RootInner,
    scope: &ListingScope,
    now: Timestamp,
) -> Result<Diagnosis> {
    let mut d = Diagnosis::default();
    for (_, store) in inner.sessions_under(scope)? {
        d.add(store.diagnose(now)?);
    }
    for link in layout::links_under(&inner.root, scope)? {
        d.unreadable.push((
            link,
            "a symbolic link: runkeep never follows a link out of the root, so the sessions behind it are neither listed nor written".into(),
        ));
    }
    Ok(d)
}
