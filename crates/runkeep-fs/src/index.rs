//! The session index: what a listing page and `claim_next` consult instead
//! of walking every run directory (issue 11, item 2).
//!
//! # What it holds, and where
//!
//! One entry per run directory at both levels (`<base>/run_*`,
//! `<base>/run_*/children/run_*`), each with a small [`Summary`] of the run's
//! row: whether it is a row at all, damaged or not, its `runCreatedAt` (the
//! created-at key), lifecycle status, deferral, when its live lease ends and
//! when its parks change state. That is enough to order every row in both
//! orders and to decide the park, claimed and status filters (and
//! claimability) at any instant, so a page visits only the entries it
//! returns (plus the ones a filter rejects, decided in memory); each row on
//! the page is still built from the run's files, exactly as the walk builds
//! it, and the entry is corrected from what was read.
//!
//! The entries and both orders live in an ordered on-disk B-tree (redb) in
//! an unnamed temporary file (`O_TMPFILE` on the store's filesystem, else
//! the system temporary directory), with a fixed page cache
//! ([`CACHE_BYTES`]): the process keeps nothing per run in memory, so a
//! listing's resident memory does not grow with the store. The file is
//! scratch — never synced for durability, gone with the process, rebuilt by
//! the next one — and a failure of it drops the index (the listing walks).
//!
//! # How it stays true: inotify, not trust
//!
//! The index never believes it saw every write. Every directory a row
//! depends on is watched with inotify — the store directory, each run
//! directory, its `checkpoints/`, `claims/` and `.runkeep/` (for the
//! lifecycle record), and each `children/` — and every listing first drains
//! the events queued since the last one and re-reads the runs they name:
//! O(changed runs), whoever changed them (this process, another runkeep
//! process, the reference implementation, a hand edit). The kernel queues an
//! event before the changing system call returns, so a change whose call
//! returned before the listing started is in the drained queue: the
//! listing sees it (nothing is seen *late* on a local filesystem). Watches
//! are added before a directory is read, so a change racing the first read
//! is either read or queued.
//!
//! Where this cannot be honoured the index is not used and the listing walks
//! the directories as before (correct, O(runs) per page), with one log line
//! saying why:
//! - a network or FUSE filesystem (NFS, SMB, 9p, Ceph, …: inotify does not
//!   see other hosts' writes);
//! - inotify unavailable;
//! - after an inotify queue overflow the index is rebuilt (one walk).
//!
//! # Over the watch budget: swept by stamp
//!
//! A run directory costs up to five watches (see [`watched_dirs`]) from a
//! per-user limit (`fs.inotify.max_user_watches`). The index holds at most
//! half of that limit (a second listing process and the user's other
//! inotify users keep theirs), or less if `add_watch` says the limit is
//! reached. Run directories past it are **swept** instead: each keeps the
//! [`Stamp`] of its directories taken before it was read, and a sweeper
//! thread compares every swept stamp with the directories at least every
//! [`SWEEP_EVERY`] (pausing four times as long as a pass took) and re-reads
//! the runs whose stamp moved or was too young to trust. Runs that are not
//! finished take watches from finished ones (which are then swept), so the
//! runs that change keep seeing every change at once. What a swept run's
//! row sees late, and the bound: a change that adds, removes or renames a
//! name in the run's directory, `checkpoints/`, `claims/`, `.runkeep/` or
//! `children/` (every write of this store and of the reference does) is in
//! the index after the next sweep pass that starts after it — within one
//! pause plus two passes; a change that rewrites a file in place without
//! touching a name (a hand edit with `>`) is not seen until the run's next
//! such change. A page's rows are read from the files anyway; what is late
//! is a swept run's place in the order and its filters.
//!
//! What the kernel does not report, and the index therefore sees late (at
//! the run's next reported change, or never): a change written through a
//! shared memory mapping (`mmap`, no `IN_MODIFY`), bytes changed beneath the
//! filesystem (block device, another host on a shared block device), and a
//! row that changes with time only (a lease lapsing, a park deadline, a
//! deferral ending) — which is not a change at all: the summary keeps the
//! instants and every filter is judged at the page's `now`.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, Table, TableDefinition};
use runkeep::listing::{ListQuery, RowKey};
use runkeep::park::ParkState;
use runkeep::{ListOrder, RunId, RunStatus, Timestamp, TopHolding};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

use crate::checkpoints::CHECKPOINTS_DIR;
use crate::claims::CLAIMS_DIR;
use crate::listing::{self, Candidate, RunRead};
use crate::lock::META_DIR;
use crate::run_state::LIFECYCLE_FILE;
use crate::sys::Ctx;

/// The directory a run's sub-runs live in.
const CHILDREN_DIR: &str = "children";

/// A run directory: `(parent, run)`.
type DirKey = (Option<RunId>, RunId);

/// When a run's park precedence changes state: what the park filter needs
/// at any instant, without the park headers.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
struct ParkTimes {
    /// Some park is answered.
    resolved: bool,
    /// Some unanswered park has no deadline (outstanding forever).
    open_forever: bool,
    /// The latest deadline of an unanswered park (outstanding before it).
    last_deadline: Option<Timestamp>,
    /// The earliest deadline of an unanswered park (expired from it on).
    first_deadline: Option<Timestamp>,
}

impl ParkTimes {
    /// The state [`runkeep::park::park_precedence`] answers at `now`: the
    /// highest-ranked state of any park (outstanding, then expired, then
    /// resolved).
    fn state(&self, now: Timestamp) -> Option<ParkState> {
        if self.open_forever || self.last_deadline.is_some_and(|d| now < d) {
            Some(ParkState::Outstanding)
        } else if self.first_deadline.is_some_and(|d| now >= d) {
            Some(ParkState::Expired)
        } else if self.resolved {
            Some(ParkState::Resolved)
        } else {
            None
        }
    }
}

/// What the index knows of a run's row.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Summary {
    damaged: bool,
    created: Option<Timestamp>,
    status: RunStatus,
    available_at: Option<Timestamp>,
    /// The live lease's expiry (a top holding that is a lease).
    live_until: Option<Timestamp>,
    park: ParkTimes,
}

impl Summary {
    /// The summary of a run read as the walk reads it; `None` when the run
    /// is not a row.
    pub(crate) fn of(read: &RunRead) -> Option<Summary> {
        let created = read.created();
        let (digest, state) = match (&read.digest, &read.state) {
            (Ok(d), Ok(s)) => (d, s),
            _ => {
                return Some(Summary {
                    damaged: true,
                    created,
                    status: RunStatus::Active,
                    available_at: None,
                    live_until: None,
                    park: ParkTimes::default(),
                })
            }
        };
        if digest.latest.is_none() || digest.checkpoint_count == 0 {
            return None;
        }
        let mut park = ParkTimes::default();
        for h in &digest.parks {
            let Some(p) = &h.park else { continue };
            if p.resolved_at.is_some() {
                park.resolved = true;
                continue;
            }
            match p.deadline_at {
                None => park.open_forever = true,
                Some(d) => {
                    park.last_deadline = Some(park.last_deadline.map_or(d, |x| x.max(d)));
                    park.first_deadline = Some(park.first_deadline.map_or(d, |x| x.min(d)));
                }
            }
        }
        let live_until = match &state.top {
            Some(TopHolding::Lease { expires_at, .. }) => Some(*expires_at),
            _ => None,
        };
        Some(Summary {
            damaged: false,
            created,
            status: state.lifecycle.status,
            available_at: state.lifecycle.available_at,
            live_until,
            park,
        })
    }

    fn unheld(&self, now: Timestamp) -> bool {
        self.live_until
            .is_none_or(|t| runkeep::lease::is_expired(t, now))
    }

    /// [`ListQuery::matches`] on the row this summarizes.
    pub(crate) fn matches(&self, q: &ListQuery) -> bool {
        if self.damaged {
            return true;
        }
        if let Some(states) = &q.park {
            match self.park.state(q.now) {
                Some(s) if states.contains(&s) => {}
                _ => return false,
            }
        }
        if let Some(statuses) = &q.status {
            if !statuses.contains(&self.status) {
                return false;
            }
        }
        match q.claimed {
            None => true,
            Some(true) => !self.unheld(q.now),
            Some(false) => self.unheld(q.now),
        }
    }

    /// [`runkeep::RunRow::is_claimable`] on the row this summarizes.
    pub(crate) fn claimable(&self, now: Timestamp) -> bool {
        !self.damaged
            && !self.status.is_finished()
            && self.available_at.is_none_or(|at| now >= at)
            && self.unheld(now)
    }

    fn key(&self, order: ListOrder, k: &DirKey) -> RowKey {
        RowKey::new(order, &k.1, k.0.as_ref(), self.created)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// The store directory: run directories come and go here.
    Base,
    /// A run directory: its subdirectories come and go here.
    Run,
    /// `checkpoints/` or `claims/`: every change matters.
    Rows,
    /// `.runkeep/`: only the lifecycle record matters.
    Meta,
    /// A run's `children/`: sub-run directories come and go here.
    Children,
}

/// The events a watch asks for.
fn mask(kind: Kind) -> WatchFlags {
    let tree = WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR;
    match kind {
        Kind::Base | Kind::Run | Kind::Children => tree,
        // In-place rewrites too (a truncated checkpoint, an edited body).
        Kind::Rows => tree | WatchFlags::MODIFY | WatchFlags::ATTRIB | WatchFlags::CLOSE_WRITE,
        Kind::Meta => tree | WatchFlags::CLOSE_WRITE,
    }
}

/// The scratch store's tables. Keys and values are this module's own
/// encodings (below); nothing here outlives the process.
///
/// - `entries`: directory key (`run`, or `parent/run` for a sub-run) →
///   [`Entry`];
/// - `watches`: watch descriptor → its [`Kind`] and directory key;
/// - `by_id`, `by_created`: the order's [`RowKey`], encoded so that byte
///   order is key order → the entry's generation, summary and directory key
///   (a page reads one table only).
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
const WATCHES: TableDefinition<i32, &[u8]> = TableDefinition::new("watches");
const BY_ID: TableDefinition<&[u8], &[u8]> = TableDefinition::new("by_id");
const BY_CREATED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("by_created");
/// Entries without watches (over the watch budget): swept by stamp.
const SWEPT: TableDefinition<&str, ()> = TableDefinition::new("swept");
/// Watched entries of finished runs: the first to give up their watches
/// when a run that is not finished needs them.
const EVICTABLE: TableDefinition<&str, ()> = TableDefinition::new("evictable");

/// The scratch store's page cache: what the index may keep resident,
/// whatever the number of runs (the rest is read back from the file, which
/// the kernel's page cache serves).
const CACHE_BYTES: usize = 4 << 20;

/// Non-durable commits between two durable ones: redb keeps the pages a
/// non-durable commit freed in memory until a durable commit, so an
/// occasional fsync of the scratch file keeps that bounded too.
const DURABLE_EVERY: u32 = 256;

/// Runs read between two commits while building.
const BUILD_BATCH: usize = 512;

/// A directory's key in the tables: `run` or `parent/run` (ids never contain
/// `/`).
fn dir_key(k: &DirKey) -> String {
    match &k.0 {
        Some(p) => format!("{}/{}", p.as_str(), k.1.as_str()),
        None => k.1.as_str().to_owned(),
    }
}

fn parse_dir_key(s: &str) -> Option<DirKey> {
    match s.split_once('/') {
        Some((p, r)) => Some((Some(RunId::new(p).ok()?), RunId::new(r).ok()?)),
        None => Some((None, RunId::new(s).ok()?)),
    }
}

/// `RowKey` (without its tie-break, which a single session's keys never
/// carry) as bytes whose order is the key's order: rank, the stamp with its
/// sign flipped (big-endian), the run id, a 0 byte (below every id byte, so
/// a prefix sorts first, as `String` does), the parent.
fn encode_key(k: &RowKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + k.run_id.len() + k.parent.len());
    out.push(k.rank);
    out.extend_from_slice(&((k.stamp as u64) ^ (1 << 63)).to_be_bytes());
    out.extend_from_slice(k.run_id.as_bytes());
    out.push(0);
    out.extend_from_slice(k.parent.as_bytes());
    out
}

const SUMMARY_LEN: usize = 2 + 5 * 8;

fn status_code(s: RunStatus) -> u8 {
    match s {
        RunStatus::Active => 0,
        RunStatus::Completed => 1,
        RunStatus::Failed => 2,
        RunStatus::Cancelled => 3,
    }
}

fn status_of(c: u8) -> RunStatus {
    match c {
        1 => RunStatus::Completed,
        2 => RunStatus::Failed,
        3 => RunStatus::Cancelled,
        _ => RunStatus::Active,
    }
}

impl Summary {
    /// Fixed layout: presence flags, status, then five instants (epoch ms,
    /// 0 when absent).
    fn encode(&self, out: &mut Vec<u8>) {
        let times = [
            self.created,
            self.available_at,
            self.live_until,
            self.park.last_deadline,
            self.park.first_deadline,
        ];
        let mut flags = 0u8;
        for (i, t) in times.iter().enumerate() {
            if t.is_some() {
                flags |= 1 << i;
            }
        }
        if self.damaged {
            flags |= 1 << 5;
        }
        if self.park.resolved {
            flags |= 1 << 6;
        }
        if self.park.open_forever {
            flags |= 1 << 7;
        }
        out.push(flags);
        out.push(status_code(self.status));
        for t in times {
            out.extend_from_slice(&t.map_or(0, Timestamp::as_millis).to_le_bytes());
        }
    }

    fn decode(b: &[u8]) -> Option<Summary> {
        let (&flags, rest) = b.split_first()?;
        let (&status, rest) = rest.split_first()?;
        let mut times = [None; 5];
        for (i, t) in times.iter_mut().enumerate() {
            let ms = i64::from_le_bytes(rest.get(i * 8..i * 8 + 8)?.try_into().ok()?);
            if flags & (1 << i) != 0 {
                *t = Some(Timestamp::from_millis(ms).ok()?);
            }
        }
        Some(Summary {
            damaged: flags & (1 << 5) != 0,
            created: times[0],
            status: status_of(status),
            available_at: times[1],
            live_until: times[2],
            park: ParkTimes {
                resolved: flags & (1 << 6) != 0,
                open_forever: flags & (1 << 7) != 0,
                last_deadline: times[3],
                first_deadline: times[4],
            },
        })
    }
}

/// One run directory's entry.
#[derive(Default)]
struct Entry {
    /// Bumped by every change of `summary` (see [`SessionIndex::reconcile`]).
    generation: u64,
    summary: Option<Summary>,
    /// Unwatched (over the watch budget): the stamp of its directories when
    /// it was last read, and whether that stamp was too young to trust
    /// (see [`Stamp`]).
    stamp: Option<Stamp>,
    /// The watch descriptors this entry added (the watches table says which
    /// it still owns).
    wds: Vec<i32>,
}

/// What an unwatched run directory looked like when it was read: a hash of
/// the identity, mode, mtime and ctime of each directory a watch would
/// cover (or of the error that stat gave). Every writer of a row's files —
/// the reference's atomic writes (sidecar + rename) and claim links, this
/// store's publishes, a sub-run appearing — adds or removes a name in one
/// of them, which moves that directory's mtime and ctime.
///
/// `racy`: a directory's ctime was within [`RACY_NS`] of the instant the
/// stamp was taken, so a later change in the same timestamp tick could
/// leave the stamp equal; such an entry is read again at the next sweep
/// whatever its stamp says, until its stamp is old enough to trust.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    hash: u64,
    racy: bool,
}

/// How young a directory's ctime makes a stamp untrustworthy.
const RACY_NS: i128 = 2_000_000_000;

/// The stamp of the run directory `dir` now (taken before it is read).
fn stamp_of(dir: &Path, top_level: bool, racy_ns: i128) -> Stamp {
    use std::hash::{Hash, Hasher};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut racy = false;
    for (path, _) in watched_dirs(dir, top_level) {
        match rustix::fs::lstat(&path) {
            Ok(st) => {
                (
                    st.st_dev,
                    st.st_ino,
                    st.st_mode,
                    st.st_mtime,
                    st.st_mtime_nsec,
                    st.st_ctime,
                    st.st_ctime_nsec,
                )
                    .hash(&mut h);
                let ctime = i128::from(st.st_ctime) * 1_000_000_000 + i128::from(st.st_ctime_nsec);
                if ctime + racy_ns > now {
                    racy = true;
                }
            }
            Err(e) => e.raw_os_error().hash(&mut h),
        }
    }
    Stamp {
        hash: h.finish(),
        racy,
    }
}

impl Entry {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(9 + SUMMARY_LEN + 4 * self.wds.len());
        out.extend_from_slice(&self.generation.to_le_bytes());
        match &self.summary {
            Some(s) => {
                out.push(1);
                s.encode(&mut out);
            }
            None => out.push(0),
        }
        match &self.stamp {
            Some(st) => {
                out.push(1 + u8::from(st.racy));
                out.extend_from_slice(&st.hash.to_le_bytes());
            }
            None => out.push(0),
        }
        for wd in &self.wds {
            out.extend_from_slice(&wd.to_le_bytes());
        }
        out
    }

    fn decode(b: &[u8]) -> Option<Entry> {
        let generation = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let (summary, rest) = match *b.get(8)? {
            1 => (
                Some(Summary::decode(b.get(9..9 + SUMMARY_LEN)?)?),
                b.get(9 + SUMMARY_LEN..)?,
            ),
            _ => (None, b.get(9..)?),
        };
        let (stamp, rest) = match *rest.first()? {
            0 => (None, rest.get(1..)?),
            flag => (
                Some(Stamp {
                    hash: u64::from_le_bytes(rest.get(1..9)?.try_into().ok()?),
                    racy: flag == 2,
                }),
                rest.get(9..)?,
            ),
        };
        let wds = rest
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Some(Entry {
            generation,
            summary,
            stamp,
            wds,
        })
    }
}

/// An order map's value: the entry's generation, summary and directory key.
fn encode_row(generation: u64, s: &Summary, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + SUMMARY_LEN + key.len());
    out.extend_from_slice(&generation.to_le_bytes());
    s.encode(&mut out);
    out.extend_from_slice(key.as_bytes());
    out
}

fn decode_row(b: &[u8]) -> Option<(u64, Summary, DirKey)> {
    let generation = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    let summary = Summary::decode(b.get(8..8 + SUMMARY_LEN)?)?;
    let key = parse_dir_key(std::str::from_utf8(b.get(8 + SUMMARY_LEN..)?).ok()?)?;
    Some((generation, summary, key))
}

fn kind_code(k: Kind) -> u8 {
    match k {
        Kind::Base => 0,
        Kind::Run => 1,
        Kind::Rows => 2,
        Kind::Meta => 3,
        Kind::Children => 4,
    }
}

fn kind_of(c: u8) -> Kind {
    match c {
        0 => Kind::Base,
        1 => Kind::Run,
        2 => Kind::Rows,
        3 => Kind::Meta,
        _ => Kind::Children,
    }
}

/// A candidate the index found, with its entry's generation.
pub(crate) struct Found {
    pub(crate) key: RowKey,
    pub(crate) candidate: Candidate,
    generation: u64,
}

/// Why the index cannot be used.
#[derive(Clone, Debug)]
struct Refusal(String);

/// A failure of the scratch store: the index is dropped and the listing
/// walks (correct, O(runs)), rather than answering from a store it cannot
/// trust.
fn store_failed(e: impl std::fmt::Display) -> Refusal {
    Refusal(format!("the session index's scratch file failed ({e})"))
}

/// The built index: the inotify descriptor and the scratch store.
struct Built {
    fd: OwnedFd,
    base: PathBuf,
    db: Database,
    tally: Tally,
    /// Non-durable commits since the last durable one.
    lazy_commits: u32,
}

/// Counts the index keeps beside its tables.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Run directories indexed.
    entries: usize,
    /// Run directories without watches (swept by stamp).
    swept: usize,
    /// inotify watches held, the store directory's included.
    watches: u64,
    /// How many watches the index may hold (see [`watch_budget`]).
    budget: u64,
    /// A sweeper thread is running for this index.
    sweeper: bool,
    /// How young a ctime makes a stamp untrustworthy ([`RACY_NS`]; a test
    /// seam sets 0).
    racy_ns: i128,
}

/// The watches one index may hold: half of this user's limit
/// (`fs.inotify.max_user_watches`, shared by every process of the user), so
/// a second listing process and the user's other inotify users still get
/// theirs. Past it, run directories are swept by stamp instead of watched.
fn watch_budget() -> u64 {
    IndexOutlook::watch_limit().map_or(8192, |l| l / 2)
}

/// What a drain found to re-read.
#[derive(Default)]
struct Dirty {
    rebuild: bool,
    top: BTreeSet<String>,
    runs: BTreeSet<String>,
    children: BTreeSet<String>,
    child_names: BTreeSet<(String, String)>,
}

/// An add_watch failure that makes the index unusable (ENOSPC, the watch
/// limit, is not one: the run directory is swept instead).
fn fatal(e: rustix::io::Errno, path: &Path) -> Option<Refusal> {
    if e == rustix::io::Errno::NOENT || e == rustix::io::Errno::NOTDIR {
        return None;
    }
    Some(Refusal(format!("cannot watch {} ({e})", path.display())))
}

/// What adding one watch gave.
enum Watched {
    Yes(i32),
    /// The directory is not there (nothing to watch).
    Absent,
    /// The user's inotify watch limit is reached.
    NoRoom,
}

/// Whether `path` is a real directory (not a link to one).
fn is_real_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

/// Run directories named `run_*` in `dir` (the walk's rule).
fn run_names(dir: &Path) -> Vec<RunId> {
    crate::sys::list_dir(dir)
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .filter(|i| i.file_type.is_dir() && crate::listing::is_listed_run_name(&i.name))
        .filter_map(|i| RunId::new(&i.name).ok())
        .collect()
}

/// The scratch store's unnamed file: on the store's own filesystem when it
/// can hold one (`O_TMPFILE`: no name ever appears in the store directory),
/// else in the system's temporary directory.
fn scratch_file(base: &Path) -> Result<std::fs::File, Refusal> {
    tempfile::tempfile_in(base)
        .or_else(|_| tempfile::tempfile())
        .map_err(|e| {
            Refusal(format!(
                "cannot create the session index's scratch file ({e})"
            ))
        })
}

/// One write transaction's view of the index: every change goes through
/// here.
struct Writer<'t> {
    fd: BorrowedFd<'t>,
    base: &'t Path,
    tally: &'t mut Tally,
    entries: Table<'t, &'static str, &'static [u8]>,
    swept: Table<'t, &'static str, ()>,
    evictable: Table<'t, &'static str, ()>,
    watches: Table<'t, i32, &'static [u8]>,
    by_id: Table<'t, &'static [u8], &'static [u8]>,
    by_created: Table<'t, &'static [u8], &'static [u8]>,
}

impl Built {
    fn build(
        base: &Path,
        hook: Option<BuildHook>,
        budget: Option<u64>,
        racy_ns: Option<i128>,
    ) -> Result<Built, Refusal> {
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(
                redb::backends::FileBackend::new(scratch_file(base)?).map_err(store_failed)?,
            )
            .map_err(store_failed)?;
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| Refusal(format!("inotify_init failed ({e})")))?;
        let mut b = Built {
            fd,
            base: base.to_path_buf(),
            db,
            tally: Tally {
                budget: budget.unwrap_or_else(watch_budget),
                racy_ns: racy_ns.unwrap_or(RACY_NS),
                ..Tally::default()
            },
            lazy_commits: 0,
        };
        let wd = inotify::add_watch(&b.fd, base, mask(Kind::Base)).map_err(|e| {
            fatal(e, base).unwrap_or_else(|| Refusal(format!("{} is gone", base.display())))
        })?;
        b.write(|w| w.add_watch(wd, Kind::Base, ""))?;
        // The store directory is read a batch at a time (never every name
        // at once: the build's memory does not grow with the store either);
        // a name created meanwhile is read or queued (the watch is in
        // place), a name gone meanwhile is dropped by its read.
        let mut names = std::fs::read_dir(base)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| crate::listing::is_listed_run_name(n));
        let mut hook = hook;
        loop {
            let batch: Vec<String> = names.by_ref().take(BUILD_BATCH).collect();
            if let Some(hook) = hook.take() {
                // Tests: changes between the store directory's read and the
                // runs' (each must be read or queued).
                hook();
            }
            if batch.is_empty() {
                break;
            }
            b.write(|w| {
                for run in &batch {
                    w.reload_top(run)?;
                }
                Ok(())
            })?;
        }
        b.durable()?;
        Ok(b)
    }

    /// Runs `f` in one write transaction and commits it (durably every
    /// [`DURABLE_EVERY`] commits, see there).
    fn write<T>(
        &mut self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        let mut tx = self.db.begin_write().map_err(store_failed)?;
        self.lazy_commits += 1;
        let durable = self.lazy_commits >= DURABLE_EVERY;
        if durable {
            self.lazy_commits = 0;
        }
        tx.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(store_failed)?;
        let out = {
            let mut w = Writer {
                fd: self.fd.as_fd(),
                base: &self.base,
                tally: &mut self.tally,
                entries: tx.open_table(ENTRIES).map_err(store_failed)?,
                swept: tx.open_table(SWEPT).map_err(store_failed)?,
                evictable: tx.open_table(EVICTABLE).map_err(store_failed)?,
                watches: tx.open_table(WATCHES).map_err(store_failed)?,
                by_id: tx.open_table(BY_ID).map_err(store_failed)?,
                by_created: tx.open_table(BY_CREATED).map_err(store_failed)?,
            };
            f(&mut w)?
        };
        tx.commit().map_err(store_failed)?;
        Ok(out)
    }

    /// A durable commit (nothing else): releases what the lazy ones kept.
    fn durable(&mut self) -> Result<(), Refusal> {
        self.lazy_commits = DURABLE_EVERY;
        self.write(|_| Ok(()))
    }

    fn dir_of(&self, k: &DirKey) -> PathBuf {
        dir_of(&self.base, k)
    }

    /// An entry's generation and summary, read back.
    fn entry(&self, key: &DirKey) -> Result<Option<Entry>, Refusal> {
        let tx = self.db.begin_read().map_err(store_failed)?;
        let t = tx.open_table(ENTRIES).map_err(store_failed)?;
        let got = t.get(dir_key(key).as_str()).map_err(store_failed)?;
        Ok(got.and_then(|v| Entry::decode(v.value())))
    }

    /// Drains the queued events into what must be re-read.
    fn drain(&mut self) -> Result<Dirty, Refusal> {
        let mut d = Dirty::default();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 16384];
        let tx = self.db.begin_read().map_err(store_failed)?;
        let watches = tx.open_table(WATCHES).map_err(store_failed)?;
        let mut gone = Vec::new();
        let mut reader = inotify::Reader::new(self.fd.as_fd(), &mut buf);
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                Err(e) if e == rustix::io::Errno::INTR => continue,
                // EAGAIN: drained. Anything else: rebuild rather than trust.
                Err(e) if e == rustix::io::Errno::AGAIN => break,
                Err(_) => {
                    d.rebuild = true;
                    break;
                }
            };
            let flags = ev.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                d.rebuild = true;
                continue;
            }
            let wd = ev.wd();
            if flags.contains(ReadFlags::IGNORED) {
                gone.push(wd);
                continue;
            }
            let Some(v) = watches.get(wd).map_err(store_failed)? else {
                continue;
            };
            let (kind, owner) = match v.value().split_first() {
                Some((k, rest)) => (kind_of(*k), String::from_utf8_lossy(rest).into_owned()),
                None => continue,
            };
            let name = ev
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let itself = flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF);
            let top_level = !owner.contains('/');
            match kind {
                Kind::Base if itself => d.rebuild = true,
                Kind::Base => {
                    if crate::listing::is_listed_run_name(&name) {
                        d.top.insert(name);
                    }
                }
                Kind::Run if itself => {
                    d.runs.insert(owner);
                }
                Kind::Run => match name.as_str() {
                    CHECKPOINTS_DIR | CLAIMS_DIR | META_DIR => {
                        d.runs.insert(owner);
                    }
                    // Only a top-level run's sub-runs are runs (a
                    // grandchild lives beside its own parent, CS-68).
                    CHILDREN_DIR if top_level => {
                        d.children.insert(owner);
                    }
                    _ => {}
                },
                Kind::Rows => {
                    d.runs.insert(owner);
                }
                Kind::Meta => {
                    if itself || name == LIFECYCLE_FILE {
                        d.runs.insert(owner);
                    }
                }
                Kind::Children if itself => {
                    d.children.insert(owner);
                }
                Kind::Children => {
                    if crate::listing::is_listed_run_name(&name) {
                        d.child_names.insert((owner, name));
                    }
                }
            }
        }
        drop(watches);
        drop(tx);
        if !gone.is_empty() {
            // The kernel dropped these watches (their directory went).
            self.write(|w| {
                for wd in gone {
                    if w.watches.remove(wd).map_err(store_failed)?.is_some() {
                        w.tally.watches -= 1;
                    }
                }
                Ok(())
            })?;
        }
        if crate::testing_hooks::mutation_named("index-ignores-events") {
            return Ok(Dirty::default());
        }
        Ok(d)
    }

    /// Brings the index up to the directory: every change queued so far.
    /// `Ok(false)`: an overflow; rebuild.
    fn sync(&mut self) -> Result<bool, Refusal> {
        let d = self.drain()?;
        if d.rebuild {
            return Ok(false);
        }
        if d.top.is_empty()
            && d.runs.is_empty()
            && d.children.is_empty()
            && d.child_names.is_empty()
        {
            return Ok(true);
        }
        self.write(|w| {
            for name in &d.top {
                w.reload_top(name)?;
            }
            for key in &d.children {
                // `children/` appeared (or went): watch it, then read it.
                let Some(k) = parse_dir_key(key) else {
                    continue;
                };
                w.reload(&k)?;
                w.rescan_children(&k)?;
            }
            for (parent, name) in &d.child_names {
                let Some(k) = parse_dir_key(parent) else {
                    continue;
                };
                w.reload_child(&k, name)?;
            }
            for key in &d.runs {
                let Some(k) = parse_dir_key(key) else {
                    continue;
                };
                w.reload(&k)?;
            }
            Ok(())
        })?;
        Ok(true)
    }

    /// Up to `want` entries after `after` in `order` whose summary passes
    /// `keep`.
    fn scan(
        &self,
        order: ListOrder,
        after: Option<&RowKey>,
        want: usize,
        keep: &dyn Fn(&Summary) -> bool,
    ) -> Result<Vec<Found>, Refusal> {
        let tx = self.db.begin_read().map_err(store_failed)?;
        let map = tx
            .open_table(match order {
                ListOrder::RunId => BY_ID,
                ListOrder::CreatedAt => BY_CREATED,
            })
            .map_err(store_failed)?;
        let from = after.map(|a| encode_key(&a.without_tie()));
        let range = match &from {
            Some(a) => map.range::<&[u8]>((Bound::Excluded(a.as_slice()), Bound::Unbounded)),
            None => map.range::<&[u8]>(..),
        }
        .map_err(store_failed)?;
        let mut out = Vec::new();
        for item in range {
            if out.len() >= want {
                break;
            }
            let (_, v) = item.map_err(store_failed)?;
            let Some((generation, s, key)) = decode_row(v.value()) else {
                return Err(store_failed("an undecodable row"));
            };
            if keep(&s) {
                out.push(Found {
                    key: s.key(order, &key),
                    candidate: Candidate {
                        dir: self.dir_of(&key),
                        run: key.1,
                        parent: key.0,
                    },
                    generation,
                });
            }
        }
        Ok(out)
    }
}

impl Built {
    /// Swept entries after `after` (at most `n`), with their stamps.
    fn swept_batch(&self, after: Option<&str>, n: usize) -> Result<Vec<(String, Stamp)>, Refusal> {
        let tx = self.db.begin_read().map_err(store_failed)?;
        let swept = tx.open_table(SWEPT).map_err(store_failed)?;
        let entries = tx.open_table(ENTRIES).map_err(store_failed)?;
        let range = match after {
            Some(a) => swept.range::<&str>((Bound::Excluded(a), Bound::Unbounded)),
            None => swept.range::<&str>(..),
        }
        .map_err(store_failed)?;
        let mut out = Vec::new();
        for item in range.take(n) {
            let (k, _) = item.map_err(store_failed)?;
            let key = k.value().to_owned();
            let got = entries.get(key.as_str()).map_err(store_failed)?;
            if let Some(stamp) = got
                .and_then(|v| Entry::decode(v.value()))
                .and_then(|e| e.stamp)
            {
                out.push((key, stamp));
            }
        }
        Ok(out)
    }

    /// Re-reads the swept entries `keys` (their directories changed, or
    /// their stamps were too young to trust).
    fn resweep(&mut self, keys: &[String]) -> Result<(), Refusal> {
        self.write(|w| {
            for key in keys {
                let Some(k) = parse_dir_key(key) else {
                    continue;
                };
                w.reload(&k)?;
                if k.0.is_none() {
                    w.rescan_children(&k)?;
                }
            }
            Ok(())
        })
    }

    /// Starts the sweeper thread if entries are swept and none runs.
    fn ensure_sweeper(&mut self, state: &Arc<Mutex<State>>, paused: &Arc<AtomicBool>) {
        if self.tally.swept == 0 || self.tally.sweeper {
            return;
        }
        self.tally.sweeper = true;
        let (weak, paused) = (Arc::downgrade(state), paused.clone());
        let spawned = std::thread::Builder::new()
            .name("runkeep-fs-sweep".into())
            .spawn(move || sweeper(&weak, &paused));
        if let Err(e) = spawned {
            tracing::warn!(
                "cannot start the index's sweeper thread ({e}); retried at the next listing"
            );
            self.tally.sweeper = false;
        }
    }
}

/// The least pause between two sweeps.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Swept entries read per lock hold.
const SWEEP_BATCH: usize = 1024;

/// The sweeper: while the store lives and entries are swept, a pass over
/// every swept entry's stamp, then a pause of at least [`SWEEP_EVERY`] and
/// four times the pass (so it takes at most a fifth of a core).
fn sweeper(state: &Weak<Mutex<State>>, paused: &AtomicBool) {
    let mut pace = SWEEP_EVERY;
    loop {
        std::thread::sleep(pace);
        let Some(state) = state.upgrade() else { return };
        if paused.load(std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        let started = Instant::now();
        if sweep_pass(&state, true).is_none() {
            return;
        }
        pace = SWEEP_EVERY.max(started.elapsed() * 4);
    }
}

/// One pass over every swept entry: stamps are compared without the lock,
/// the changed (or racy) entries re-read with it. `(checked, re-read)`, or
/// `None` when there is no index (or, with `stop_if_idle`, nothing swept:
/// the sweeper then ends, under the lock, so a later swept entry starts a
/// new one).
fn sweep_pass(state: &Mutex<State>, stop_if_idle: bool) -> Option<(usize, usize)> {
    let (mut checked, mut reread) = (0, 0);
    let mut after: Option<String> = None;
    loop {
        let (batch, base, racy_ns) = {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let State::Built(b) = &mut *st else {
                return None;
            };
            if stop_if_idle && after.is_none() && b.tally.swept == 0 {
                b.tally.sweeper = false;
                return None;
            }
            match b.swept_batch(after.as_deref(), SWEEP_BATCH) {
                Ok(batch) => (batch, b.base.clone(), b.tally.racy_ns),
                Err(Refusal(why)) => {
                    let base = b.base.clone();
                    *st = refused(&base, why);
                    return None;
                }
            }
        };
        let Some((last, _)) = batch.last() else { break };
        after = Some(last.clone());
        checked += batch.len();
        let changed: Vec<String> = batch
            .into_iter()
            .filter(|(key, stamp)| {
                stamp.racy
                    || parse_dir_key(key).is_none_or(|k| {
                        stamp_of(&dir_of(&base, &k), k.0.is_none(), racy_ns).hash != stamp.hash
                    })
            })
            .map(|(key, _)| key)
            .collect();
        if changed.is_empty() {
            continue;
        }
        reread += changed.len();
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        let State::Built(b) = &mut *st else {
            return None;
        };
        if let Err(Refusal(why)) = b.resweep(&changed) {
            *st = refused(&base, why);
            return None;
        }
    }
    Some((checked, reread))
}

/// The directories watched for one run directory: itself, `checkpoints/`,
/// `claims/`, `.runkeep/` and (a top-level run's) `children/` — those that
/// exist get a watch.
fn watched_dirs(dir: &Path, top_level: bool) -> Vec<(PathBuf, Kind)> {
    let mut out = vec![
        (dir.to_path_buf(), Kind::Run),
        (dir.join(CHECKPOINTS_DIR), Kind::Rows),
        (dir.join(CLAIMS_DIR), Kind::Rows),
        (dir.join(META_DIR), Kind::Meta),
    ];
    if top_level {
        out.push((dir.join(CHILDREN_DIR), Kind::Children));
    }
    out
}

/// What the session index of one store directory needs from this machine
/// (`runkeep doctor`'s `store.listing-index`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexOutlook {
    /// Run directories the index would hold (top-level runs and sub-runs).
    pub run_dirs: u64,
    /// inotify watches one process's index of this store holds: one per
    /// directory it watches (counted as the index counts them).
    pub watches: u64,
    /// Why the index is never used on this store, whatever the limits (a
    /// network or FUSE filesystem), if so.
    pub refused: Option<String>,
}

impl IndexOutlook {
    /// The outlook of the store directory `base` (reads every run
    /// directory's entries: O(runs), for diagnosis, not for a listing).
    pub fn of(base: &Path) -> IndexOutlook {
        let mut out = IndexOutlook {
            refused: remote(base),
            watches: 1,
            ..Default::default()
        };
        let mut count = |dir: &Path, top: bool| {
            out.run_dirs += 1;
            out.watches += watched_dirs(dir, top)
                .iter()
                .filter(|(p, _)| is_real_dir(p))
                .count() as u64;
        };
        for run in run_names(base) {
            let dir = base.join(run.as_str());
            count(&dir, true);
            for child in run_names(&dir.join(CHILDREN_DIR)) {
                count(&dir.join(CHILDREN_DIR).join(child.as_str()), false);
            }
        }
        out
    }

    /// This user's inotify watch limit (`fs.inotify.max_user_watches`),
    /// shared by every process of the user; `None` when it cannot be read.
    pub fn watch_limit() -> Option<u64> {
        std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// The directory of a run in the store at `base`.
fn dir_of(base: &Path, k: &DirKey) -> PathBuf {
    match &k.0 {
        Some(p) => base.join(p.as_str()).join(CHILDREN_DIR).join(k.1.as_str()),
        None => base.join(k.1.as_str()),
    }
}

impl Writer<'_> {
    fn entry(&self, key: &str) -> Result<Option<Entry>, Refusal> {
        let got = self.entries.get(key).map_err(store_failed)?;
        Ok(got.and_then(|v| Entry::decode(v.value())))
    }

    fn put_entry(&mut self, key: &str, e: &Entry) -> Result<(), Refusal> {
        let old = self
            .entries
            .insert(key, e.encode().as_slice())
            .map_err(store_failed)?;
        if old.is_none() {
            self.tally.entries += 1;
        }
        Ok(())
    }

    fn add_watch(&mut self, wd: i32, kind: Kind, owner: &str) -> Result<(), Refusal> {
        let mut v = Vec::with_capacity(1 + owner.len());
        v.push(kind_code(kind));
        v.extend_from_slice(owner.as_bytes());
        if self
            .watches
            .insert(wd, v.as_slice())
            .map_err(store_failed)?
            .is_none()
        {
            self.tally.watches += 1;
        }
        Ok(())
    }

    fn watch(&mut self, owner: &str, path: &Path, kind: Kind) -> Result<Watched, Refusal> {
        match inotify::add_watch(self.fd, path, mask(kind)) {
            Ok(wd) => {
                self.add_watch(wd, kind, owner)?;
                Ok(Watched::Yes(wd))
            }
            Err(e) if e == rustix::io::Errno::NOSPC => Ok(Watched::NoRoom),
            Err(e) => match fatal(e, path) {
                Some(r) => Err(r),
                None => Ok(Watched::Absent),
            },
        }
    }

    /// Drops the watches of `owner` not in `keep` that it still owns.
    fn unwatch(&mut self, owner: &str, old: &[i32], keep: &[i32]) -> Result<(), Refusal> {
        for wd in old {
            if keep.contains(wd) {
                continue;
            }
            let owned = self
                .watches
                .get(*wd)
                .map_err(store_failed)?
                .is_some_and(|v| v.value().get(1..) == Some(owner.as_bytes()));
            if owned {
                self.watches.remove(*wd).map_err(store_failed)?;
                self.tally.watches -= 1;
                let _ = inotify::remove_watch(self.fd, *wd);
            }
        }
        Ok(())
    }

    /// Replaces the summary of the entry `key` (which exists), keeping the
    /// order maps in step and bumping its generation.
    fn set_summary(&mut self, k: &DirKey, summary: Option<Summary>) -> Result<(), Refusal> {
        let key = dir_key(k);
        let Some(mut e) = self.entry(&key)? else {
            return Ok(());
        };
        if let Some(o) = &e.summary {
            self.by_id
                .remove(encode_key(&o.key(ListOrder::RunId, k)).as_slice())
                .map_err(store_failed)?;
            self.by_created
                .remove(encode_key(&o.key(ListOrder::CreatedAt, k)).as_slice())
                .map_err(store_failed)?;
        }
        e.generation += 1;
        if let Some(new) = &summary {
            let row = encode_row(e.generation, new, &key);
            self.by_id
                .insert(
                    encode_key(&new.key(ListOrder::RunId, k)).as_slice(),
                    row.as_slice(),
                )
                .map_err(store_failed)?;
            self.by_created
                .insert(
                    encode_key(&new.key(ListOrder::CreatedAt, k)).as_slice(),
                    row.as_slice(),
                )
                .map_err(store_failed)?;
        }
        e.summary = summary;
        self.put_entry(&key, &e)
    }

    /// The sub-runs indexed under the top-level run `parent`.
    fn children_of(&self, parent: &RunId) -> Result<BTreeSet<RunId>, Refusal> {
        // Keys `parent/child`: from `parent/` up to `parent0` ('0' follows
        // '/').
        let lo = format!("{}/", parent.as_str());
        let hi = format!("{}0", parent.as_str());
        let mut out = BTreeSet::new();
        for item in self
            .entries
            .range::<&str>(lo.as_str()..hi.as_str())
            .map_err(store_failed)?
        {
            let (k, _) = item.map_err(store_failed)?;
            if let Some((_, c)) = k.value().split_once('/') {
                if let Ok(c) = RunId::new(c) {
                    out.insert(c);
                }
            }
        }
        Ok(out)
    }

    fn remove(&mut self, k: &DirKey) -> Result<(), Refusal> {
        let key = dir_key(k);
        let Some(e) = self.entry(&key)? else {
            return Ok(());
        };
        if k.0.is_none() {
            for c in self.children_of(&k.1)? {
                self.remove(&(Some(k.1.clone()), c))?;
            }
        }
        self.set_summary(k, None)?;
        self.unwatch(&key, &e.wds, &[])?;
        self.mark(&key, false, false)?;
        if self
            .entries
            .remove(key.as_str())
            .map_err(store_failed)?
            .is_some()
        {
            self.tally.entries -= 1;
        }
        Ok(())
    }

    /// Keeps the swept and evictable tables (and their tally) in step with
    /// an entry: `swept` when it has no watches, `evictable` when it is
    /// watched and its run finished.
    fn mark(&mut self, key: &str, swept: bool, evictable: bool) -> Result<(), Refusal> {
        let was = if swept {
            self.swept.insert(key, ()).map_err(store_failed)?.is_some()
        } else {
            self.swept.remove(key).map_err(store_failed)?.is_some()
        };
        match (was, swept) {
            (false, true) => self.tally.swept += 1,
            (true, false) => self.tally.swept -= 1,
            _ => {}
        }
        if evictable {
            self.evictable.insert(key, ()).map_err(store_failed)?;
        } else {
            self.evictable.remove(key).map_err(store_failed)?;
        }
        Ok(())
    }

    /// Re-reads one run directory: watches first (or, over the watch
    /// budget, its stamp), then the files.
    fn reload(&mut self, k: &DirKey) -> Result<(), Refusal> {
        let key = dir_key(k);
        let Some(mut e) = self.entry(&key)? else {
            return Ok(());
        };
        let dir = dir_of(self.base, k);
        if !is_real_dir(&dir) {
            return self.remove(k);
        }
        let top = k.0.is_none();
        let wants = watched_dirs(&dir, top);
        // The budget counts the directories there now; every one is still
        // asked for (one created meanwhile is then watched, not missed).
        let need = wants.iter().filter(|(p, _)| is_real_dir(p)).count() as u64;
        let held = e.wds.len() as u64;
        let finished = e.summary.as_ref().is_some_and(|s| s.status.is_finished());
        let room = |t: &Tally| t.watches.saturating_sub(held) + need <= t.budget;
        // A run that is not finished may take the watches of a finished
        // one (which is then swept); a finished one waits for room.
        while !room(self.tally) && !finished && self.evict_one(&key)? {}
        let mut watched = room(self.tally);
        let mut enospc = false;
        let mut wds = Vec::with_capacity(wants.len());
        if watched {
            for (path, kind) in wants {
                match self.watch(&key, &path, kind)? {
                    Watched::Yes(wd) => wds.push(wd),
                    Watched::Absent => {}
                    Watched::NoRoom => {
                        // Other watchers of this user took the rest of the
                        // limit: hold no more than the index has now.
                        tracing::warn!(
                            "the inotify watch limit was reached at {} watches held by the index of {}; run directories past it are swept by stamp (raise fs.inotify.max_user_watches, e.g. `sysctl fs.inotify.max_user_watches=1048576`)",
                            self.tally.watches,
                            self.base.display()
                        );
                        watched = false;
                        enospc = true;
                        break;
                    }
                }
            }
        }
        if watched {
            self.unwatch(&key, &e.wds, &wds)?;
            e.wds = wds;
            e.stamp = None;
        } else {
            let mut all = e.wds.clone();
            all.extend(wds);
            self.unwatch(&key, &all, &[])?;
            if enospc {
                // ENOSPC within the budget: other watchers of this user
                // hold the rest; never ask for more than is held now.
                self.tally.budget = self.tally.budget.min(self.tally.watches.max(1));
            }
            e.wds = Vec::new();
            // The stamp before the read: a change after it moves it.
            e.stamp = Some(stamp_of(&dir, top, self.tally.racy_ns));
        }
        self.put_entry(&key, &e)?;
        let c = Candidate {
            run: k.1.clone(),
            parent: k.0.clone(),
            dir,
        };
        let read = listing::read_run(&c, &Ctx::store("list_runs"));
        let summary = read.as_ref().and_then(Summary::of);
        let finished = summary.as_ref().is_some_and(|s| s.status.is_finished());
        self.mark(&key, !watched, watched && finished)?;
        self.set_summary(k, summary)
    }

    /// Takes the watches of one finished run (not `except`), which is then
    /// swept; `false` when there is none.
    fn evict_one(&mut self, except: &str) -> Result<bool, Refusal> {
        let mut victim = None;
        for item in self.evictable.range::<&str>(..).map_err(store_failed)? {
            let (k, _) = item.map_err(store_failed)?;
            if k.value() != except {
                victim = Some(k.value().to_owned());
                break;
            }
        }
        let Some(victim) = victim else {
            return Ok(false);
        };
        let (Some(vk), Some(mut ve)) = (parse_dir_key(&victim), self.entry(&victim)?) else {
            self.evictable
                .remove(victim.as_str())
                .map_err(store_failed)?;
            return Ok(true);
        };
        let dir = dir_of(self.base, &vk);
        self.unwatch(&victim, &ve.wds, &[])?;
        ve.wds = Vec::new();
        // Events queued for the dropped watches since the last drain go
        // with them: stamp, then read the run again now.
        ve.stamp = Some(stamp_of(&dir, vk.0.is_none(), self.tally.racy_ns));
        self.put_entry(&victim, &ve)?;
        self.mark(&victim, true, false)?;
        let c = Candidate {
            run: vk.1.clone(),
            parent: vk.0.clone(),
            dir,
        };
        let read = listing::read_run(&c, &Ctx::store("list_runs"));
        self.set_summary(&vk, read.as_ref().and_then(Summary::of))?;
        Ok(true)
    }

    /// Makes sure the entry `k` exists (empty), then re-reads it.
    fn load(&mut self, k: &DirKey) -> Result<(), Refusal> {
        let key = dir_key(k);
        if self.entry(&key)?.is_none() {
            self.put_entry(&key, &Entry::default())?;
        }
        self.reload(k)
    }

    /// A top-level run directory named `name` appeared, changed or went.
    fn reload_top(&mut self, name: &str) -> Result<(), Refusal> {
        let Ok(run) = RunId::new(name) else {
            return Ok(());
        };
        let k = (None, run);
        if !is_real_dir(&dir_of(self.base, &k)) {
            return self.remove(&k);
        }
        self.load(&k)?;
        self.rescan_children(&k)
    }

    /// Re-reads a top-level run's `children/` (its watch is in place).
    fn rescan_children(&mut self, k: &DirKey) -> Result<(), Refusal> {
        if self.entry(&dir_key(k))?.is_none() {
            return Ok(());
        }
        let parent = k.1.clone();
        let known = self.children_of(&parent)?;
        let dir = dir_of(self.base, k).join(CHILDREN_DIR);
        let now: BTreeSet<RunId> = run_names(&dir).into_iter().collect();
        for gone in known.difference(&now) {
            self.remove(&(Some(parent.clone()), gone.clone()))?;
        }
        for c in now {
            self.load(&(Some(parent.clone()), c))?;
        }
        Ok(())
    }

    /// A sub-run directory `name` of the top-level run `k` appeared,
    /// changed or went.
    fn reload_child(&mut self, k: &DirKey, name: &str) -> Result<(), Refusal> {
        let Ok(run) = RunId::new(name) else {
            return Ok(());
        };
        if self.entry(&dir_key(k))?.is_none() {
            return Ok(());
        }
        let child = (Some(k.1.clone()), run);
        if is_real_dir(&dir_of(self.base, &child)) {
            self.load(&child)
        } else {
            self.remove(&child)
        }
    }
}

/// Filesystems where inotify does not see other hosts' (or the server's)
/// writes: `statfs` magic numbers.
const REMOTE_MAGIC: &[i64] = &[
    0x6969,                 // NFS
    0x517B,                 // SMB
    0xFF53_4D42_u32 as i64, // CIFS
    0xFE53_4D42_u32 as i64, // SMB2
    0x6573_5546,            // FUSE
    0x0102_1997,            // 9P
    0x00C3_6400,            // Ceph
    0x5346_414F,            // AFS
    0x7375_7245,            // Coda
    0x564C,                 // NCP
    0x0116_1970,            // GFS2
    0x7461_636F,            // OCFS2
    0x0BD0_0BD0,            // Lustre
    0x4750_4653,            // GPFS
];

fn remote(base: &Path) -> Option<String> {
    let st = rustix::fs::statfs(base).ok()?;
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    REMOTE_MAGIC.contains(&magic).then(|| {
        format!("{} is on a network or FUSE filesystem (statfs type {magic:#x}), where inotify does not see other hosts' writes", base.display())
    })
}

/// The index of one store (shared by its clones and its build thread).
#[derive(Default)]
pub(crate) struct SessionIndex {
    state: Arc<Mutex<State>>,
    hook: Mutex<Option<BuildHook>>,
    /// Test seams: the watch budget of the next build (`None`: half the
    /// user's limit) and its racy window (`None`: [`RACY_NS`]).
    budget: Mutex<(Option<u64>, Option<i128>)>,
    /// Test seam: the sweeper skips its passes while set.
    sweeper_paused: Arc<AtomicBool>,
}

#[derive(Default)]
enum State {
    /// Not built yet: the next listing starts the build.
    #[default]
    Unbuilt,
    /// Being built by a background thread; listings walk meanwhile.
    Building,
    /// Cannot be used; the listing walks. (The reason was logged when it
    /// was refused; tests and benches read it back through `status`.)
    Refused(#[cfg_attr(not(feature = "testing"), allow(dead_code))] String),
    Built(Box<Built>),
}

fn refused(base: &Path, why: String) -> State {
    tracing::warn!(
        "the directory store at {} lists by walking every run directory (O(runs) per page): {why}",
        base.display()
    );
    State::Refused(why)
}

/// Index builds running in this process, and how many may.
static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
const MAX_BUILDS: usize = 2;

/// A test's code run inside the build (after the store directory was read).
type BuildHook = Box<dyn FnOnce() + Send>;

/// Builds the index of `base` and installs it, unless the state moved on.
fn build_into(
    state: &Arc<Mutex<State>>,
    base: &Path,
    hook: Option<BuildHook>,
    budget: (Option<u64>, Option<i128>),
    paused: &Arc<AtomicBool>,
) {
    let built = match remote(base) {
        Some(why) => Err(Refusal(why)),
        None => Built::build(base, hook, budget.0, budget.1),
    };
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(*st, State::Building) {
        *st = match built {
            Ok(mut b) => {
                if b.tally.swept > 0 {
                    tracing::warn!(
                        "the index of {} holds {} inotify watches (its budget: half of fs.inotify.max_user_watches); {} run directories past it are swept by stamp, so other processes' changes to them are seen within seconds rather than at once (raise fs.inotify.max_user_watches, e.g. `sysctl fs.inotify.max_user_watches=1048576`)",
                        base.display(),
                        b.tally.watches,
                        b.tally.swept
                    );
                }
                b.ensure_sweeper(state, paused);
                State::Built(Box::new(b))
            }
            Err(Refusal(why)) => refused(base, why),
        };
    }
}

impl SessionIndex {
    /// Starts the build on a background thread (the caller holds the lock
    /// and has seen `Unbuilt`): the listing that needs the index first
    /// walks, so a one-shot listing (a CLI call) costs what the walk costs.
    fn start_build(&self, st: &mut State, base: &Path) {
        use std::sync::atomic::Ordering;
        if BUILDS.fetch_add(1, Ordering::SeqCst) >= MAX_BUILDS {
            // Enough builds running in this process (a root store opening
            // many sessions): stay unbuilt, walk, and try at the next page.
            BUILDS.fetch_sub(1, Ordering::SeqCst);
            *st = State::Unbuilt;
            return;
        }
        *st = State::Building;
        let (state, dir) = (self.state.clone(), base.to_path_buf());
        let hook = self.hook.lock().unwrap_or_else(|p| p.into_inner()).take();
        let budget = *self.budget.lock().unwrap_or_else(|p| p.into_inner());
        let paused = self.sweeper_paused.clone();
        let spawned = std::thread::Builder::new()
            .name("runkeep-fs-index".into())
            .spawn(move || {
                build_into(&state, &dir, hook, budget, &paused);
                BUILDS.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            BUILDS.fetch_sub(1, Ordering::SeqCst);
            *st = refused(base, format!("cannot start the index thread ({e})"));
        }
    }

    /// Runs `f` on the index brought up to date with the directory, or
    /// answers `None` when the index cannot be used (yet): the caller walks.
    fn with<T>(
        &self,
        base: &Path,
        off: bool,
        f: impl FnOnce(&Built) -> Result<T, Refusal>,
    ) -> Option<T> {
        if off {
            return None;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *st {
            State::Refused(_) | State::Building => None,
            State::Unbuilt => {
                self.start_build(&mut st, base);
                None
            }
            State::Built(b) => match b.sync() {
                Ok(true) => match f(b) {
                    Ok(v) => {
                        b.ensure_sweeper(&self.state, &self.sweeper_paused);
                        Some(v)
                    }
                    Err(Refusal(why)) => {
                        *st = refused(base, why);
                        None
                    }
                },
                Ok(false) => {
                    tracing::info!(
                        "the directory store's index at {} missed events (inotify queue overflow); rebuilding it",
                        base.display()
                    );
                    self.start_build(&mut st, base);
                    None
                }
                Err(Refusal(why)) => {
                    *st = refused(base, why);
                    None
                }
            },
        }
    }

    /// Up to `want` candidates after `after` in `order` whose summary passes
    /// `keep`, from an index brought up to date first; `None` when the index
    /// cannot be used (yet).
    pub(crate) fn candidates(
        &self,
        base: &Path,
        off: bool,
        order: ListOrder,
        after: Option<&RowKey>,
        want: usize,
        keep: &dyn Fn(&Summary) -> bool,
    ) -> Option<Vec<Found>> {
        self.with(base, off, |b| b.scan(order, after, want, keep))
    }

    /// Corrects a run's entry from a read the caller made after the index
    /// answered, unless the entry was re-read since (then the read may be
    /// older than the entry). A change after the read is still queued and
    /// re-read at the next sync.
    pub(crate) fn reconcile(&self, found: &Found, summary: Option<Summary>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State::Built(b) = &mut *st else { return };
        let key = (found.candidate.parent.clone(), found.candidate.run.clone());
        // Read first: a write transaction only when the entry is wrong.
        let stale = match b.entry(&key) {
            Ok(e) => e.is_some_and(|e| e.generation == found.generation && e.summary != summary),
            Err(_) => false,
        };
        if stale {
            if let Err(Refusal(why)) = b.write(|w| w.set_summary(&key, summary)) {
                *st = refused(b.base.clone().as_path(), why);
            }
        }
    }

    /// Whether the index is in use, and why not (tests, benches).
    #[cfg(feature = "testing")]
    pub(crate) fn status(&self) -> std::result::Result<usize, String> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &*st {
            State::Built(b) => Ok(b.tally.entries),
            State::Refused(why) => Err(why.clone()),
            State::Unbuilt => Err("not built yet (the first listing starts it)".into()),
            State::Building => Err("being built".into()),
        }
    }

    /// `(entries, swept, watches held)` of the built index (tests).
    #[cfg(feature = "testing")]
    pub(crate) fn counts(&self) -> std::result::Result<(usize, usize, u64), String> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &*st {
            State::Built(b) => Ok((b.tally.entries, b.tally.swept, b.tally.watches)),
            _ => Err("the index is not built".into()),
        }
    }

    /// Starts the build if needed and waits for it (tests, benches).
    #[cfg(feature = "testing")]
    pub(crate) fn wait_built(&self, base: &Path) -> std::result::Result<usize, String> {
        loop {
            {
                let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                match &*st {
                    State::Unbuilt => self.start_build(&mut st, base),
                    State::Building => {}
                    _ => break,
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        self.status()
    }
}

impl crate::Inner {
    /// [`SessionIndex::candidates`] on this store's index.
    pub(crate) fn index_candidates(
        &self,
        order: ListOrder,
        after: Option<&RowKey>,
        want: usize,
        keep: &dyn Fn(&Summary) -> bool,
    ) -> Option<Vec<Found>> {
        let off = self.no_index.load(std::sync::atomic::Ordering::Relaxed);
        self.index
            .candidates(self.base(), off, order, after, want, keep)
    }

    /// [`SessionIndex::reconcile`] on this store's index.
    pub(crate) fn index_reconcile(&self, found: &Found, summary: Option<Summary>) {
        self.index.reconcile(found, summary);
    }
}

#[cfg(feature = "testing")]
impl crate::FsStore {
    /// Test seam: never use the session index (every listing walks).
    #[doc(hidden)]
    pub fn testing_disable_index(&self) {
        self.inner
            .no_index
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Test seam: `Ok(run directories indexed)` when the index is in use,
    /// else why not.
    #[doc(hidden)]
    pub fn testing_index_status(&self) -> std::result::Result<usize, String> {
        self.inner.index.status()
    }

    /// Test seam: the inotify watches the next index build may hold (the
    /// store directory's included); run directories past it are swept.
    #[doc(hidden)]
    pub fn testing_set_index_watch_budget(&self, watches: u64) {
        self.inner
            .index
            .budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0 = Some(watches);
    }

    /// Test seam: stamps of the next index build are trusted however young
    /// (no racy window), so a sweep re-reads only runs whose stamp moved.
    #[doc(hidden)]
    pub fn testing_trust_young_index_stamps(&self) {
        self.inner
            .index
            .budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1 = Some(0);
    }

    /// Test seam: the index's background sweeper skips its passes while
    /// `paused` (so a test decides when a sweep happens).
    #[doc(hidden)]
    pub fn testing_pause_index_sweeper(&self, paused: bool) {
        self.inner
            .index
            .sweeper_paused
            .store(paused, std::sync::atomic::Ordering::Relaxed);
    }

    /// Test seam: one sweep pass now; `Some((checked, re-read))`.
    #[doc(hidden)]
    pub fn testing_index_sweep(&self) -> Option<(usize, usize)> {
        sweep_pass(&self.inner.index.state, false)
    }

    /// Test seam: `(run directories indexed, swept by stamp, inotify
    /// watches held)`.
    #[doc(hidden)]
    pub fn testing_index_counts(&self) -> std::result::Result<(usize, usize, u64), String> {
        self.inner.index.counts()
    }

    /// Test seam: runs `f` inside the next index build, after the store
    /// directory was read and before any run directory is.
    #[doc(hidden)]
    pub fn testing_on_index_build(&self, f: impl FnOnce() + Send + 'static) {
        *self
            .inner
            .index
            .hook
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
    }

    /// Test seam: starts building the index if needed and waits for it;
    /// answers as [`FsStore::testing_index_status`].
    #[doc(hidden)]
    pub fn testing_wait_index(&self) -> std::result::Result<usize, String> {
        self.inner.index.wait_built(self.inner.base())
    }

    /// Test seam: the listing by walking every run directory, never the
    /// index (the oracle the index is checked against).
    #[doc(hidden)]
    pub fn testing_list_runs_walk(
        &self,
        scope: &runkeep::ListingScope,
        options: &runkeep::ListOptions,
    ) -> runkeep::Result<runkeep::RunPage> {
        crate::listing::list_runs_walk(&self.inner, scope, options)
    }
}
