//! The listing (top-level runs and their sub-runs, `run_*` directories
//! only) and `claim_next`.
//!
//! A page comes from the session index ([`crate::index`]) when it can be
//! used: the index picks the candidates after the cursor in key order whose
//! summary passes the filters, and each candidate is read here exactly as
//! the walk reads it. Where the index cannot be used (being built, refused)
//! the page is the walk's, which is also the index's oracle in the tests.
//!
//! The walk: runs are the directories named `run_*` directly under the base
//! directory and under `<base>/<parent>/children/`. In run-id order the key
//! is known from the names alone, so rows are built lazily in key order and
//! the walk stops as soon as the page is full: one digest and one claims
//! directory per row considered. In created-at order the run start comes
//! from each run's digest (a small file, never a checkpoint) and only the
//! key is kept. A damaged run is a flagged row; a run directory removed
//! mid-walk is simply not a row.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use runkeep::listing::{ListQuery, RowKey};
use runkeep::scheduling::Priority;
use runkeep::{
    ClaimNextFilter, ClaimOptions, ClaimOutcome, Error, Lease, ListOptions, ListOrder,
    ListingScope, Result, RunDigest, RunId, RunPage, RunRow, RunScope,
};

use crate::index::Summary;
use crate::inner::Inner;
use crate::options::Attribution;
use crate::sys::{self, Ctx};
use crate::{checkpoints, claims, keys, run_state};

/// A run directory found by the walk.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    pub(crate) run: RunId,
    pub(crate) parent: Option<RunId>,
    pub(crate) dir: PathBuf,
}

impl Candidate {
    pub(crate) fn scope(&self, a: &Attribution) -> RunScope {
        let s = RunScope::new(
            a.tenant_id.clone(),
            a.project_id.clone(),
            a.session_id.clone(),
            self.run.clone(),
        );
        match &self.parent {
            Some(p) => s.with_parent(p.clone()),
            None => s,
        }
    }
}

/// The prefix of every run directory a listing takes, at both levels (the
/// reference's listing rule): runs under other ids are readable and writable
/// by id but never listed nor handed out by `claim_next`.
pub const LISTED_RUN_PREFIX: &str = "run_";

/// Whether a directory entry named `name` is a run the listing takes
/// ([`LISTED_RUN_PREFIX`]): the one test of that rule, for the walk, the
/// index, the watches, the root's session probe and `enqueue`.
pub fn is_listed_run_name(name: &str) -> bool {
    name.starts_with(LISTED_RUN_PREFIX)
}

fn run_dirs(dir: &Path, ctx: &Ctx) -> Result<Vec<(RunId, PathBuf)>> {
    let items = sys::list_dir(dir)
        .map_err(|e| ctx.io("list run directories in", dir, e))?
        .unwrap_or_default();
    let out = items
        .into_iter()
        .filter(|i| i.file_type.is_dir() && is_listed_run_name(&i.name))
        .filter_map(|i| Some((RunId::new(&i.name).ok()?, dir.join(&i.name))))
        .collect();
    Ok(out)
}

/// Every run directory at both levels (creates nothing).
pub(crate) fn enumerate(base: &Path, ctx: &Ctx) -> Result<Vec<Candidate>> {
    use rustix::fs::{openat, Mode, OFlags};
    let mut out = Vec::new();
    // Sub-runs live inside their parents, so every run directory is probed
    // for `children/`: relative to one open descriptor of the base
    // directory, a missing one costs a single short lookup.
    let base_fd = openat(
        rustix::fs::CWD,
        base,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok();
    for (run, dir) in run_dirs(base, ctx)? {
        let children = dir.join("children");
        let exists = match &base_fd {
            Some(fd) => openat(
                fd,
                format!("{run}/children"),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .is_ok(),
            None => true,
        };
        let kids = if exists {
            run_dirs(&children, ctx).unwrap_or_default()
        } else {
            Vec::new()
        };
        for (child, cdir) in kids {
            out.push(Candidate {
                run: child,
                parent: Some(run.clone()),
                dir: cdir,
            });
        }
        out.push(Candidate {
            run,
            parent: None,
            dir,
        });
    }
    Ok(out)
}

/// A run's digest, or why it could not be read; `None` when the run has no
/// checkpoints (or vanished).
fn digest_of(c: &Candidate, ctx: &Ctx) -> Option<DigestRead> {
    match checkpoints::current_digest(&c.dir, ctx) {
        Ok(Some(d)) if d.checkpoint_count > 0 => Some(Ok(d)),
        Ok(_) => None,
        Err(e) => {
            if !c.dir.is_dir() {
                return None;
            }
            Some(Err(e))
        }
    }
}

/// What a row is built from: the run's digest (or why it could not be
/// read), then its top holding and lifecycle (contract v2 columns).
pub(crate) struct RunRead {
    pub(crate) digest: DigestRead,
    pub(crate) state: Result<run_state::RunState>,
}

impl RunRead {
    /// The run start the created-at order sorts by.
    pub(crate) fn created(&self) -> Option<runkeep::Timestamp> {
        self.digest.as_ref().ok().and_then(|d| d.run_created_at)
    }

    /// The listing row at `now`; `None` when the run is not a row.
    fn row(&self, scope: RunScope, now: runkeep::Timestamp) -> Option<RunRow> {
        match (&self.digest, &self.state) {
            (Ok(d), Ok(state)) => d
                .row(scope, state.top.as_ref(), now)
                .map(|r| r.with_lifecycle(&state.lifecycle)),
            (Err(e), state) => {
                let claim = state
                    .as_ref()
                    .ok()
                    .and_then(|s| s.top.as_ref())
                    .map(|t| t.summary(now));
                let mut row = RunRow::damaged(scope, e, claim);
                // Its place in the priority orders stays the run's.
                if let Ok(s) = state {
                    row.priority = s.lifecycle.priority;
                }
                Some(row)
            }
            (Ok(_), Err(e)) => Some(RunRow::damaged(scope, e, None)),
        }
    }
}

/// Reads what a run's row is built from (the digest first, then the
/// state); `None` when the run has no checkpoints or vanished.
pub(crate) fn read_run(c: &Candidate, ctx: &Ctx) -> Option<RunRead> {
    let digest = digest_of(c, ctx)?;
    Some(RunRead {
        digest,
        state: run_state::read_state(&c.dir, ctx),
    })
}

fn scope_matches(a: &Attribution, scope: &ListingScope) -> bool {
    a.tenant_id == *scope.tenant_id()
        && scope.project_id().is_none_or(|p| *p == a.project_id)
        && scope.session_id().is_none_or(|s| *s == a.session_id)
}

/// A run's digest as read: the digest, or why it could not be read.
type DigestRead = std::result::Result<RunDigest, Error>;

/// The validated query and the attribution, or the early answer (an empty
/// page for a scope the store is not bound to).
fn prepare<'a>(
    inner: &'a Inner,
    scope: &ListingScope,
    options: &ListOptions,
) -> Result<Option<(ListQuery, &'a Attribution)>> {
    let q = ListQuery::new(scope, &options.judged_at(|| inner.now()))?;
    let Some(a) = inner.attribution() else {
        return Err(Error::invalid(format!(
            "list_runs: the store at {} was opened without attribution, so it cannot say which tenant, project or session its runs belong to (a row that carries no scope cannot be resumed or swept). Pass FsOptions::attribution; refusing rather than returning rows stamped with a guessed tenant",
            inner.base().display()
        )));
    };
    if !scope_matches(a, scope) {
        return Ok(None);
    }
    Ok(Some((q, a)))
}

/// One page of the listing: from the session index when it can be used
/// ([`crate::index`]), else by walking every run directory.
pub(crate) fn list_runs(
    inner: &Inner,
    scope: &ListingScope,
    options: &ListOptions,
) -> Result<RunPage> {
    let Some((q, a)) = prepare(inner, scope, options)? else {
        return Ok(RunPage::default());
    };
    match indexed_page(inner, &q, a) {
        Some(page) => Ok(page),
        None => walk_page(inner, &q, a),
    }
}

/// Up to `want` top-level runs after `after` (run-id order) whose index
/// summary reads finished, and where the next page starts (`None`: no
/// more); no run is read (a prune judges each under its lock). `Ok(None)`
/// when the index cannot answer (the caller pages through the listing).
pub(crate) fn finished_page(
    inner: &Inner,
    scope: &ListingScope,
    after: Option<&RowKey>,
    want: usize,
) -> Result<Option<(Vec<RunScope>, Option<RowKey>)>> {
    let Some((_, a)) = prepare(inner, scope, &ListOptions::default())? else {
        return Ok(Some((Vec::new(), None)));
    };
    let Some(batch) = inner.index_candidates(ListOrder::RunId, after, want, &|s| s.finished())
    else {
        return Ok(None);
    };
    let next = (batch.len() == want)
        .then(|| batch.last().map(|f| f.key.clone()))
        .flatten();
    let runs = batch
        .into_iter()
        .filter(|f| f.candidate.parent.is_none())
        .map(|f| f.candidate.scope(a))
        .collect();
    Ok(Some((runs, next)))
}

/// One page by walking every run directory (the index's oracle in tests).
#[cfg(feature = "testing")]
pub(crate) fn list_runs_walk(
    inner: &Inner,
    scope: &ListingScope,
    options: &ListOptions,
) -> Result<RunPage> {
    let Some((q, a)) = prepare(inner, scope, options)? else {
        return Ok(RunPage::default());
    };
    walk_page(inner, &q, a)
}

/// How many candidates a page asks the index for at a time beyond what it
/// still needs (a candidate whose fresh read no longer matches is skipped).
const SLACK: usize = 8;

/// One page from the index: the index picks the candidates after the
/// cursor whose summary passes the filters; each is read from its files
/// and checked again, and its entry corrected from that read. `None` when
/// the index cannot be used.
fn indexed_page(inner: &Inner, q: &ListQuery, a: &Attribution) -> Option<RunPage> {
    let ctx = Ctx::store("list_runs");
    let mut after = q.after.clone();
    let mut page: Vec<(RowKey, RunRow)> = Vec::new();
    'pages: loop {
        let want = q.limit + 1 - page.len() + SLACK;
        let batch = inner.index_candidates(q.order, after.as_ref(), want, &|s| s.matches(q))?;
        let exhausted = batch.len() < want;
        for found in batch {
            after = Some(found.key.clone());
            let c = &found.candidate;
            let read = read_run(c, &ctx);
            inner.index_reconcile(&found, read.as_ref().and_then(Summary::of));
            let Some(row) = read.and_then(|r| r.row(c.scope(a), q.now)) else {
                continue;
            };
            if q.matches(&row) {
                page.push((found.key, row));
                if page.len() > q.limit {
                    break 'pages;
                }
            }
        }
        if exhausted {
            break;
        }
    }
    Some(q.page_from_sorted(page))
}

/// A run's priority as its lifecycle record says (the default when it has
/// none or it cannot be read: the row then reads damaged or default too).
fn priority_of(c: &Candidate, ctx: &Ctx) -> Priority {
    run_state::read_record(&c.dir, ctx)
        .ok()
        .flatten()
        .map(|r| r.lifecycle.priority)
        .unwrap_or_default()
}

/// One page by walking every run directory: O(runs) directory entries,
/// O(page) rows in run-id order, every run's digest in created-at order and
/// every run's lifecycle record in the priority order (`claim_next`'s
/// order is [`walk_claim`]'s). Holds one key per run, never a digest per
/// run.
fn walk_page(inner: &Inner, q: &ListQuery, a: &Attribution) -> Result<RunPage> {
    let ctx = Ctx::store("list_runs");
    let candidates = enumerate(inner.base(), &ctx)?;
    // Run-id order needs no digest to sort, so digests are read only for the
    // rows the page reaches; created-at order needs every run's start first.
    let mut keyed: Vec<(RowKey, Candidate)> = candidates
        .into_iter()
        .filter_map(|c| {
            let created = match q.order {
                ListOrder::RunId | ListOrder::Priority => None,
                ListOrder::CreatedAt => digest_of(&c, &ctx)?.ok().and_then(|d| d.run_created_at),
            };
            let mut k = RowKey::new(q.order, &c.run, c.parent.as_ref(), created);
            if q.order == ListOrder::Priority {
                k = k.with_priority(priority_of(&c, &ctx));
            }
            Some((k, c))
        })
        .filter(|(k, _)| q.is_after_cursor(k))
        .collect();
    keyed.sort_by(|x, y| x.0.cmp(&y.0));
    let mut page: Vec<(RowKey, RunRow)> = Vec::new();
    for (k, c) in keyed {
        let Some(row) = read_run(&c, &ctx).and_then(|r| r.row(c.scope(a), q.now)) else {
            continue;
        };
        if q.matches(&row) {
            page.push((k, row));
            if page.len() > q.limit {
                break;
            }
        }
    }
    Ok(q.page_from_sorted(page))
}

/// How many candidates `claim_next` asks the index for at a time.
const CLAIM_PAGE: usize = 16;

/// The key a run's claim may be skipped for while that key is at its limit
/// at `now`: its key, unless its deadline has passed (the core judges the
/// deadline before the key, so such a run is finished by its claim, never
/// skipped). The one rule for the index's entries, its summaries and the
/// walk.
pub(crate) fn skippable_key(
    concurrency: Option<&(String, u32)>,
    deadline: Option<runkeep::Timestamp>,
    now: runkeep::Timestamp,
) -> Option<&(String, u32)> {
    match deadline {
        Some(d) if now >= d => None,
        _ => concurrency,
    }
}

/// A `claim_next` candidate found by the walk ([`walk_claim`]).
struct Walked {
    key: RowKey,
    candidate: Candidate,
    skippable: Option<(String, u32)>,
}

/// `claim_next`'s candidates when the index cannot be used (being built,
/// refused, switched off): every run directory once per call, in claim
/// order ([`RunRow::claim_key`]) after `after`. Each run's lifecycle record
/// is read once — its priority places it, its status drops a finished run,
/// its key and deadline say whether it may be skipped — and the runs of a
/// key at its limit (counted once per key per call from the key's held set
/// into `busy`, as the index path counts) are dropped before any of their
/// rows is read. O(runs) directory entries and records per call, not per
/// page; rows are read only as the caller reaches them.
fn walk_claim(
    inner: &Inner,
    q: &ListQuery,
    a: &Attribution,
    after: Option<&RowKey>,
    busy: &RefCell<HashMap<String, u32>>,
) -> Result<Vec<Walked>> {
    let ctx = Ctx::store("claim_next");
    let now = q.now;
    let mut out = Vec::new();
    for c in enumerate(inner.base(), &ctx)? {
        let created = match q.order {
            ListOrder::RunId | ListOrder::Priority => None,
            ListOrder::CreatedAt => match digest_of(&c, &ctx) {
                None => continue,
                Some(d) => d.ok().and_then(|d| d.run_created_at),
            },
        };
        let lifecycle = run_state::read_record(&c.dir, &ctx)
            .ok()
            .flatten()
            .map(|r| r.lifecycle);
        let key = RowKey::new(q.order, &c.run, c.parent.as_ref(), created)
            .with_priority(lifecycle.as_ref().map(|l| l.priority).unwrap_or_default());
        if after.is_some_and(|a| key.without_tie() <= a.without_tie()) {
            continue;
        }
        let mut skippable = None;
        if let Some(l) = &lifecycle {
            if l.status.is_finished() {
                // A finished run stays finished (only a reopen, under
                // the run lock, changes that; the next call sees it).
                continue;
            }
            let concurrency = l.concurrency.as_ref().map(|c| (c.key.clone(), c.limit));
            skippable = skippable_key(concurrency.as_ref(), l.deadline, now).cloned();
        }
        if let Some((k, limit)) = &skippable {
            let held = *busy
                .borrow_mut()
                .entry(k.clone())
                .or_insert_with(|| keys::held_now(inner, &c.scope(a), k, now));
            if held >= *limit {
                continue;
            }
        }
        out.push(Walked {
            key,
            candidate: c,
            skippable,
        });
    }
    out.sort_by(|x, y| x.key.cmp(&y.key));
    Ok(out)
}

/// One `claim_next` candidate: from the index (its entry, corrected from
/// the read) or from the walk.
enum Next {
    Indexed(crate::index::Found),
    Walked(Walked),
}

/// Takes the next run nobody holds live (scan-and-claim): candidates in the
/// filter's order, each claimed through the lease (link arbitration), so two
/// concurrent callers never get one run at one fence. From the index, a
/// call reads only the candidates it tries (the index skips held,
/// finished, deferred and non-matching runs in memory, and the streams of
/// keys at their limit unvisited); without it, the call walks every run
/// directory once ([`walk_claim`]), dropping the runs of keys at their
/// limit before reading their rows.
pub(crate) fn claim_next(
    inner: &Inner,
    scope: &ListingScope,
    filter: &ClaimNextFilter,
    options: &ClaimOptions,
) -> Result<Option<(RunScope, Lease)>> {
    let now = options.judged_at(|| inner.now());
    let list = ListOptions {
        order: filter.order,
        park: filter.park.clone(),
        claimed: Some(false),
        limit: Some(CLAIM_PAGE),
        cursor: None,
        now: Some(now),
        status: None,
        min_priority: None,
    };
    let Some((q, a)) = prepare(inner, scope, &list)? else {
        return Ok(None);
    };
    let ctx = Ctx::store("claim_next");
    let mut contended = None;
    let mut after: Option<RowKey> = None;
    // Runs of each concurrency key held live, counted once per call: from
    // the index's leases of the key (no file read), or (a run the index
    // did not hand out, the walk) from the key's held set (`crate::keys`).
    // The entries of a key at its limit are skipped without reading their
    // runs. The claim counts again under the key lock; this only saves
    // the reads (and the key lock's queue).
    let busy: RefCell<HashMap<String, u32>> = RefCell::default();
    let at_limit = |c: Option<&(String, u32)>| {
        c.is_some_and(|(k, limit)| busy.borrow().get(k).is_some_and(|h| h >= limit))
    };
    let held_of = |key: &str, indexed: u32| -> u32 {
        *busy.borrow_mut().entry(key.to_owned()).or_insert(indexed)
    };
    loop {
        let indexed = inner.index_claim_candidates_skipping(
            q.order,
            after.as_ref(),
            CLAIM_PAGE,
            now,
            &|s| s.claimable(now) && s.matches(&q) && !at_limit(s.skippable_key(now)),
            &|key, limit, indexed| held_of(key, indexed) >= limit,
        );
        // From the index: a page of candidates, each read only when its
        // turn comes (the first claimable one usually ends the call).
        // Without it: every candidate left, from one walk.
        let (candidates, more): (Vec<Next>, bool) = match indexed {
            Some(batch) => {
                let more = batch.len() == CLAIM_PAGE;
                (batch.into_iter().map(Next::Indexed).collect(), more)
            }
            None => {
                let walked = walk_claim(inner, &q, a, after.as_ref(), &busy)?;
                (walked.into_iter().map(Next::Walked).collect(), false)
            }
        };
        for next in candidates {
            let (key, c, skippable) = match &next {
                Next::Indexed(f) => (&f.key, &f.candidate, f.skippable_key(now)),
                Next::Walked(w) => (&w.key, &w.candidate, w.skippable.as_ref()),
            };
            after = Some(key.clone());
            if let Some((k, limit)) = skippable {
                let held = *busy
                    .borrow_mut()
                    .entry(k.clone())
                    .or_insert_with(|| keys::held_now(inner, &c.scope(a), k, now));
                if held >= *limit {
                    continue;
                }
            }
            let read = read_run(c, &ctx);
            if let Next::Indexed(found) = &next {
                inner.index_reconcile(found, read.as_ref().and_then(Summary::of));
            }
            let row = match read.and_then(|r| r.row(c.scope(a), now)) {
                Some(row) if q.matches(&row) => row,
                _ => continue,
            };
            if !row.is_claimable(now) {
                // Damaged, finished, deferred past `now` or held.
                continue;
            }
            match claims::claim(inner, &row.scope, &options.clone().at(now)) {
                Ok(ClaimOutcome::Acquired(lease)) => {
                    if filter.park.is_some() && !still_matches(inner, &row.scope, filter, now) {
                        // Answered (or otherwise changed) between the listing
                        // and the claim: give it back and keep looking.
                        if claims::release(inner, &row.scope, lease.fence)? {
                            keys::after_end(inner, &row.scope, "claim_next");
                        }
                        continue;
                    }
                    return Ok(Some((row.scope, lease)));
                }
                Ok(ClaimOutcome::AtLimit(b)) => {
                    busy.borrow_mut().insert(b.key, b.held);
                }
                Ok(
                    ClaimOutcome::Held(_) | ClaimOutcome::Finished(_) | ClaimOutcome::NotBefore(_),
                ) => {}
                Err(e @ Error::Contended { .. }) => contended = Some(e),
                Err(e) => return Err(e),
            }
        }
        if !more {
            break;
        }
    }
    match contended {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

/// Re-reads a just-claimed run's park against the filter.
fn still_matches(
    inner: &Inner,
    scope: &RunScope,
    filter: &ClaimNextFilter,
    now: runkeep::Timestamp,
) -> bool {
    let ctx = Ctx::new(scope, "claim_next");
    let Ok(Some(d)) = checkpoints::current_digest(&inner.run_dir(scope), &ctx) else {
        return false;
    };
    let park = runkeep::park::park_precedence(&d.parks, &d.fence_history, now);
    match (&filter.park, park) {
        (Some(states), Some(p)) => states.contains(&p.state),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// Up to `list.limit` rows after `after` in `claim_next`'s order for
/// `list.order` (priority first, [`RunRow::claim_key`]) that `list`'s
/// filters keep, and where the next page starts (`None`: no more). What
/// the root store merges its sessions' `claim_next` candidates from.
pub(crate) fn claim_page(
    inner: &Inner,
    scope: &ListingScope,
    list: &ListOptions,
    after: Option<RowKey>,
) -> Result<(Vec<RunRow>, Option<RowKey>)> {
    claim_page_with(inner, scope, list, after, true)
}

/// [`claim_page`], from the index only when `index` (the walk otherwise:
/// the oracle in the tests).
pub(crate) fn claim_page_with(
    inner: &Inner,
    scope: &ListingScope,
    list: &ListOptions,
    after: Option<RowKey>,
    index: bool,
) -> Result<(Vec<RunRow>, Option<RowKey>)> {
    let Some((mut q, a)) = prepare(inner, scope, list)? else {
        return Ok((Vec::new(), None));
    };
    q.after = after;
    let now = q.now;
    let ctx = Ctx::store("claim_next");
    let want = q.limit;
    // As `claim_next`: a key's live holdings counted once per page (from
    // the index, else its held set), and the runs of a key at its limit
    // skipped unread.
    let busy: RefCell<HashMap<String, u32>> = RefCell::default();
    let at_limit = |c: Option<&(String, u32)>| {
        c.is_some_and(|(k, limit)| busy.borrow().get(k).is_some_and(|h| h >= limit))
    };
    let held_of = |key: &str, indexed: u32| -> u32 {
        *busy.borrow_mut().entry(key.to_owned()).or_insert(indexed)
    };
    let batch = if index {
        inner.index_claim_candidates_skipping(
            q.order,
            q.after.as_ref(),
            want,
            now,
            &|s| s.claimable(now) && s.matches(&q) && !at_limit(s.skippable_key(now)),
            &|key, limit, indexed| held_of(key, indexed) >= limit,
        )
    } else {
        None
    };
    let Some(batch) = batch else {
        // The walk, as `claim_next`'s: the runs of a key at its limit and
        // finished runs dropped before any row is read; rows read until
        // the page holds `want`.
        let mut rows = Vec::new();
        let mut last = None;
        let mut more = false;
        for w in walk_claim(inner, &q, a, q.after.as_ref(), &busy)? {
            if rows.len() == want {
                more = true;
                break;
            }
            last = Some(w.key.clone());
            let row = read_run(&w.candidate, &ctx).and_then(|r| r.row(w.candidate.scope(a), now));
            if let Some(row) = row {
                if q.matches(&row) && row.is_claimable(now) {
                    rows.push(row);
                }
            }
        }
        return Ok((rows, last.filter(|_| more)));
    };
    let more = batch.len() == want;
    let mut rows = Vec::with_capacity(batch.len());
    let mut last = None;
    for found in batch {
        last = Some(found.key.clone());
        let c = &found.candidate;
        if let Some((key, limit)) = found.skippable_key(now) {
            let held = *busy
                .borrow_mut()
                .entry(key.clone())
                .or_insert_with(|| keys::held_now(inner, &c.scope(a), key, now));
            if held >= *limit {
                continue;
            }
        }
        let read = read_run(c, &ctx);
        inner.index_reconcile(&found, read.as_ref().and_then(Summary::of));
        if let Some(row) = read.and_then(|r| r.row(c.scope(a), now)) {
            if q.matches(&row) && row.is_claimable(now) {
                rows.push(row);
            }
        }
    }
    Ok((rows, last.filter(|_| more)))
}
