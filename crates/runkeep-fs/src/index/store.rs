//! The scratch store: the index's tables in an unnamed temporary file
//! (redb), their encodings, and every change to them (one write
//! transaction's [`Writer`]).

use std::collections::BTreeSet;
use std::ops::Bound;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, Table, TableDefinition};
use runkeep::listing::RowKey;
use runkeep::{ListOrder, RunId, RunStatus, Timestamp};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags};

use super::common::{
    dir_of, is_real_dir, mask, run_names, store_failed, watched_dirs, DirKey, Found, Kind, Refusal,
    CHILDREN_DIR,
};
use super::outlook::IndexOutlook;
use super::summary::{ParkTimes, Summary};
use super::sweep::{stamp_of, Stamp, RACY_NS};
use crate::checkpoints::CHECKPOINTS_DIR;
use crate::claims::CLAIMS_DIR;
use crate::listing::{self, Candidate};
use crate::lock::META_DIR;
use crate::run_state::LIFECYCLE_FILE;
use crate::sys::Ctx;

/// The scratch store's tables. Keys and values are this module's own
/// encodings (below); nothing here outlives the process.
///
/// - `entries`: directory key (`run`, or `parent/run` for a sub-run) →
///   [`Entry`];
/// - `watches`: watch descriptor → its [`Kind`] and directory key;
/// - `by_id`, `by_created`, `by_priority`: the order's [`RowKey`], encoded
///   so that byte order is key order → the entry's generation, summary and
///   directory key (a page reads one table only);
/// - `claim_free_*`, `claim_keyed_*`: `claim_next`'s key (priority first,
///   [`runkeep::RunRow::claim_key`]) in run-id and created-at order, split
///   into the runs it never skips and one stream per key and limit;
/// - `held_by_key`: each run of a concurrency key whose top holding is a
///   lease, under its key, with the lease's expiry.
pub(super) const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
pub(super) const WATCHES: TableDefinition<i32, &[u8]> = TableDefinition::new("watches");
pub(super) const BY_ID: TableDefinition<&[u8], &[u8]> = TableDefinition::new("by_id");
pub(super) const BY_CREATED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("by_created");
pub(super) const BY_PRIORITY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("by_priority");
/// `claim_next`'s streams: the runs it never skips for a key (no key, or a
/// deadline: a run past it is finished by its claim whatever its key), in
/// its key for run-id and for created-at order...
pub(super) const CLAIM_FREE_ID: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("claim_free_id");
pub(super) const CLAIM_FREE_CREATED: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("claim_free_created");
/// ... and every other run under its key and limit ([`keyed_prefix`]),
/// then the same key: a key at its limit is one stream dropped, not its
/// entries scanned.
pub(super) const CLAIM_KEYED_ID: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("claim_keyed_id");
pub(super) const CLAIM_KEYED_CREATED: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("claim_keyed_created");
/// The runs of each concurrency key whose top holding is a lease: the key
/// (never a 0 byte), 0, the directory key → the lease's expiry (ms).
/// `claim_next` counts a key's live holdings here ([`held_live`]):
/// a range of the key's leases, not a read of each run's files.
pub(super) const HELD_BY_KEY: TableDefinition<&[u8], i64> = TableDefinition::new("held_by_key");

/// The `held_by_key` prefix of `key`.
fn held_prefix(key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 1);
    out.extend_from_slice(key.as_bytes());
    out.push(0);
    out
}

/// The prefix of a keyed claim stream: the key (never a 0 byte), 0, the
/// limit (big-endian).
pub(super) fn keyed_prefix(key: &str, limit: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 5);
    out.extend_from_slice(key.as_bytes());
    out.push(0);
    out.extend_from_slice(&limit.to_be_bytes());
    out
}

/// The first prefix after every key of `key`/`limit`'s stream.
fn keyed_prefix_end(key: &str, limit: u32) -> Vec<u8> {
    match limit.checked_add(1) {
        Some(l) => keyed_prefix(key, l),
        None => {
            let mut out = key.as_bytes().to_vec();
            out.push(1);
            out
        }
    }
}

/// The key and limit at the start of a keyed claim table's key.
fn parse_keyed_prefix(b: &[u8]) -> Option<(String, u32)> {
    let z = b.iter().position(|c| *c == 0)?;
    let key = std::str::from_utf8(&b[..z]).ok()?.to_owned();
    let limit = u32::from_be_bytes(b.get(z + 1..z + 5)?.try_into().ok()?);
    Some((key, limit))
}

impl Summary {
    /// The key this run holds a lease of and that lease's expiry: its
    /// `held_by_key` row (`None`: no key, or no lease on top).
    fn key_lease(&self) -> Option<(&str, Timestamp)> {
        Some((self.concurrency.as_ref()?.0.as_str(), self.live_until?))
    }

    /// The keyed claim stream this run sits in (`None`: the free one).
    pub(super) fn claim_stream(&self) -> Option<(&str, u32)> {
        match (&self.concurrency, self.deadline) {
            (Some((k, l)), None) => Some((k.as_str(), *l)),
            _ => None,
        }
    }
}
/// Entries without watches (over the watch budget): swept by stamp.
pub(super) const SWEPT: TableDefinition<&str, ()> = TableDefinition::new("swept");
/// Watched entries of finished runs: the first to give up their watches
/// when a run that is not finished needs them.
pub(super) const EVICTABLE: TableDefinition<&str, ()> = TableDefinition::new("evictable");

/// The scratch store's page cache: what the index may keep resident,
/// whatever the number of runs (the rest is read back from the file, which
/// the kernel's page cache serves).
pub(super) const CACHE_BYTES: usize = 4 << 20;

/// Non-durable commits between two durable ones: redb keeps the pages a
/// non-durable commit freed in memory until a durable commit, so an
/// occasional fsync of the scratch file keeps that bounded too.
pub(super) const DURABLE_EVERY: u32 = 256;

/// Runs that may take a finished run's watches per write transaction (each
/// eviction queues about four `IN_IGNORED` events; the queue holds
/// `fs.inotify.max_queued_events`, 16 384 by default, between two drains).
pub(super) const EVICTIONS_PER_WRITE: u32 = 256;

/// Build batches between two durable commits: a copy-on-write page freed
/// by a non-durable commit is reused only after a durable one, so without
/// them the scratch file grows with every batch's garbage (measured:
/// 71 MB at 31 000 runs into a build of 100 000).
pub(super) const BUILD_DURABLE_EVERY: u32 = 4;

/// Runs read between two commits while building.
pub(super) const BUILD_BATCH: usize = 512;

/// A directory's key in the tables: `run` or `parent/run` (ids never contain
/// `/`).
pub(super) fn dir_key(k: &DirKey) -> String {
    match &k.0 {
        Some(p) => format!("{}/{}", p.as_str(), k.1.as_str()),
        None => k.1.as_str().to_owned(),
    }
}

pub(super) fn parse_dir_key(s: &str) -> Option<DirKey> {
    match s.split_once('/') {
        Some((p, r)) => Some((Some(RunId::new(p).ok()?), RunId::new(r).ok()?)),
        None => Some((None, RunId::new(s).ok()?)),
    }
}

/// `RowKey` (without its tie-break, which a single session's keys never
/// carry) as bytes whose order is the key's order: the priority rank and
/// then the stamp with their sign flipped (big-endian) around the rank, the
/// run id, a 0 byte (below every id byte, so a prefix sorts first, as
/// `String` does), the parent.
pub(super) fn encode_key(k: &RowKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + k.run_id.len() + k.parent.len());
    out.extend_from_slice(&((k.prio as u64) ^ (1 << 63)).to_be_bytes());
    out.push(k.rank);
    out.extend_from_slice(&((k.stamp as u64) ^ (1 << 63)).to_be_bytes());
    out.extend_from_slice(k.run_id.as_bytes());
    out.push(0);
    out.extend_from_slice(k.parent.as_bytes());
    out
}

pub(super) const SUMMARY_LEN: usize = 2 + 5 * 8;

pub(super) fn status_code(s: RunStatus) -> u8 {
    match s {
        RunStatus::Active => 0,
        RunStatus::Completed => 1,
        RunStatus::Failed => 2,
        RunStatus::Cancelled => 3,
    }
}

pub(super) fn status_of(c: u8) -> RunStatus {
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
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
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
        out.extend_from_slice(&self.priority.get().to_le_bytes());
        out.push(u8::from(self.deadline.is_some()));
        out.extend_from_slice(&self.deadline.map_or(0, Timestamp::as_millis).to_le_bytes());
        match &self.concurrency {
            Some((key, limit)) => {
                out.extend_from_slice(&limit.to_le_bytes());
                // Keys are at most 128 bytes (`concurrency::MAX_KEY_LEN`).
                out.push(key.len().min(255) as u8);
                out.extend_from_slice(&key.as_bytes()[..key.len().min(255)]);
            }
            None => {
                out.extend_from_slice(&0u32.to_le_bytes());
                out.push(0);
            }
        }
    }

    /// The summary at the start of `b`, and the bytes it took.
    pub(super) fn decode(b: &[u8]) -> Option<(Summary, usize)> {
        let (&flags, rest) = b.split_first()?;
        let (&status, rest) = rest.split_first()?;
        let mut times = [None; 5];
        for (i, t) in times.iter_mut().enumerate() {
            let ms = i64::from_le_bytes(rest.get(i * 8..i * 8 + 8)?.try_into().ok()?);
            if flags & (1 << i) != 0 {
                *t = Some(Timestamp::from_millis(ms).ok()?);
            }
        }
        let tail = rest.get(40..)?;
        let priority = i32::from_le_bytes(tail.get(..4)?.try_into().ok()?);
        let deadline = match *tail.get(4)? {
            0 => None,
            _ => Some(
                Timestamp::from_millis(i64::from_le_bytes(tail.get(5..13)?.try_into().ok()?))
                    .ok()?,
            ),
        };
        let tail = tail.get(13..)?;
        let limit = u32::from_le_bytes(tail.get(..4)?.try_into().ok()?);
        let len = usize::from(*tail.get(4)?);
        let key = std::str::from_utf8(tail.get(5..5 + len)?).ok()?;
        let concurrency = (limit > 0).then(|| (key.to_owned(), limit));
        let summary = Summary {
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
            priority: runkeep::scheduling::Priority::new(i64::from(priority)).ok()?,
            concurrency,
            deadline,
        };
        Some((summary, SUMMARY_LEN + 18 + len))
    }
}

/// One run directory's entry.
#[derive(Default)]
pub(super) struct Entry {
    /// Bumped by every change of `summary` (see [`SessionIndex::reconcile`]).
    pub(super) generation: u64,
    pub(super) summary: Option<Summary>,
    /// Unwatched (over the watch budget): the stamp of its directories when
    /// it was last read, and whether that stamp was too young to trust
    /// (see [`Stamp`]).
    pub(super) stamp: Option<Stamp>,
    /// The watch descriptors this entry added (the watches table says which
    /// it still owns).
    pub(super) wds: Vec<i32>,
}

impl Entry {
    pub(super) fn encode(&self) -> Vec<u8> {
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

    pub(super) fn decode(b: &[u8]) -> Option<Entry> {
        let generation = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let (summary, rest) = match *b.get(8)? {
            1 => {
                let (s, used) = Summary::decode(b.get(9..)?)?;
                (Some(s), b.get(9 + used..)?)
            }
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
pub(super) fn encode_row(generation: u64, s: &Summary, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + SUMMARY_LEN + key.len());
    out.extend_from_slice(&generation.to_le_bytes());
    s.encode(&mut out);
    out.extend_from_slice(key.as_bytes());
    out
}

pub(super) fn decode_row(b: &[u8]) -> Option<(u64, Summary, DirKey)> {
    let generation = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    let (summary, used) = Summary::decode(b.get(8..)?)?;
    let key = parse_dir_key(std::str::from_utf8(b.get(8 + used..)?).ok()?)?;
    Some((generation, summary, key))
}

pub(super) fn kind_code(k: Kind) -> u8 {
    match k {
        Kind::Base => 0,
        Kind::Run => 1,
        Kind::Rows => 2,
        Kind::Meta => 3,
        Kind::Children => 4,
    }
}

pub(super) fn kind_of(c: u8) -> Kind {
    match c {
        0 => Kind::Base,
        1 => Kind::Run,
        2 => Kind::Rows,
        3 => Kind::Meta,
        _ => Kind::Children,
    }
}

/// Where the index of a store is in its life: what a listing asks it
/// for first (and the sweeper thread before each pass).
#[derive(Default)]
pub(super) enum State {
    /// Not built yet: the next listing starts the build.
    #[default]
    Unbuilt,
    /// Being built by a background thread; listings walk meanwhile.
    Building,
    /// Cannot be used; the listing walks. (The reason was logged when it
    /// was refused; tests and benches read it back through `status`.)
    Refused(
        #[cfg_attr(
            not(feature = "testing"),
            allow(dead_code, reason = "read only by the test seams")
        )]
        String,
    ),
    Built(Box<Built>),
}

/// The index given up, with the log line saying why the listing walks.
pub(super) fn refused(base: &Path, why: String) -> State {
    tracing::warn!(
        "the directory store at {} lists by walking every run directory (O(runs) per page): {why}",
        base.display()
    );
    State::Refused(why)
}

/// A test's code run inside the build (after the store directory was read).
pub(super) type BuildHook = Box<dyn FnOnce() + Send>;

/// The built index: the inotify descriptor and the scratch store.
pub(super) struct Built {
    pub(super) fd: OwnedFd,
    pub(super) base: PathBuf,
    pub(super) db: Database,
    pub(super) tally: Tally,
    /// Non-durable commits since the last durable one.
    pub(super) lazy_commits: u32,
}

/// Counts the index keeps beside its tables.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Tally {
    /// Run directories indexed.
    pub(super) entries: usize,
    /// Run directories without watches (swept by stamp).
    pub(super) swept: usize,
    /// inotify watches held, the store directory's included.
    pub(super) watches: u64,
    /// How many watches the index may hold (see [`watch_budget`]).
    pub(super) budget: u64,
    /// A sweeper thread is running for this index.
    pub(super) sweeper: bool,
    /// Evictions this write transaction may still make.
    pub(super) evictions_left: u32,
    /// Evictions made since the build began.
    pub(super) evicted: u64,
    /// How young a ctime makes a stamp untrustworthy ([`RACY_NS`]; a test
    /// seam sets 0).
    pub(super) racy_ns: i128,
    /// The budget is this index's own (a test seam), not the process's.
    pub(super) own_budget: bool,
}

/// inotify watches held by every index of this process: the budget is the
/// process's, whatever the number of stores it lists (a root of many
/// sessions opens one index per session).
pub(super) static PROCESS_WATCHES: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

impl Tally {
    /// Counts `delta` watches added (or, negative, removed).
    pub(super) fn held(&mut self, delta: i64) {
        use std::sync::atomic::Ordering;
        if delta >= 0 {
            self.watches += delta as u64;
            PROCESS_WATCHES.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.watches -= delta.unsigned_abs();
            PROCESS_WATCHES.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// What the budget is measured against: the watches held by every
    /// index of this process (a budget set by a test seam: this index's).
    pub(super) fn process_watches(&self) -> u64 {
        if self.own_budget {
            self.watches
        } else {
            PROCESS_WATCHES.load(std::sync::atomic::Ordering::Relaxed)
        }
    }
}

impl Drop for Built {
    fn drop(&mut self) {
        // Its watches go with its inotify descriptor.
        let n = self.tally.watches;
        PROCESS_WATCHES.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The watches this process's indexes may hold together
/// ([`IndexOutlook::watch_budget`]; 8 192 when the limit cannot be read).
pub(super) fn watch_budget() -> u64 {
    IndexOutlook::watch_budget().unwrap_or(8192)
}

/// What a drain found to re-read.
#[derive(Default)]
pub(super) struct Dirty {
    pub(super) rebuild: bool,
    pub(super) top: BTreeSet<String>,
    pub(super) runs: BTreeSet<String>,
    pub(super) children: BTreeSet<String>,
    pub(super) child_names: BTreeSet<(String, String)>,
}

/// An add_watch failure that makes the index unusable (ENOSPC, the watch
/// limit, is not one: the run directory is swept instead).
pub(super) fn fatal(e: rustix::io::Errno, path: &Path) -> Option<Refusal> {
    if e == rustix::io::Errno::NOENT || e == rustix::io::Errno::NOTDIR {
        return None;
    }
    Some(Refusal(format!("cannot watch {} ({e})", path.display())))
}

/// What adding one watch gave.
pub(super) enum Watched {
    Yes(i32),
    /// The directory is not there (nothing to watch).
    Absent,
    /// The user's inotify watch limit is reached.
    NoRoom,
}

/// The scratch store's unnamed file: on the store's own filesystem when it
/// can hold one (`O_TMPFILE`: no name ever appears in the store directory),
/// else in the system's temporary directory.
pub(super) fn scratch_file(base: &Path) -> Result<std::fs::File, Refusal> {
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
pub(super) struct Writer<'t> {
    pub(super) fd: BorrowedFd<'t>,
    pub(super) base: &'t Path,
    pub(super) tally: &'t mut Tally,
    pub(super) entries: Table<'t, &'static str, &'static [u8]>,
    pub(super) swept: Table<'t, &'static str, ()>,
    pub(super) evictable: Table<'t, &'static str, ()>,
    pub(super) watches: Table<'t, i32, &'static [u8]>,
    pub(super) by_id: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) by_created: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) by_priority: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) claim_free_id: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) claim_free_created: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) claim_keyed_id: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) claim_keyed_created: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) held_by_key: Table<'t, &'static [u8], i64>,
}

/// What a test set for the next build (test seams). The default: the
/// process's watch budget and [`RACY_NS`].
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct BuildSettings {
    /// The watches the build may hold, its own (`None`: half the user's
    /// limit, shared by every index of the process).
    pub(super) watch_budget: Option<u64>,
    /// The racy window of its stamps (`None`: [`RACY_NS`]).
    pub(super) racy_ns: Option<i128>,
}

impl Built {
    pub(super) fn build(
        base: &Path,
        hook: Option<BuildHook>,
        settings: BuildSettings,
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
                budget: settings.watch_budget.unwrap_or_else(watch_budget),
                own_budget: settings.watch_budget.is_some(),
                racy_ns: settings.racy_ns.unwrap_or(RACY_NS),
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
        let mut batches = 0u32;
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
            batches += 1;
            if batches.is_multiple_of(BUILD_DURABLE_EVERY) {
                b.durable()?;
            }
        }
        b.durable()?;
        Ok(b)
    }

    /// Runs `f` in one write transaction and commits it (durably every
    /// [`DURABLE_EVERY`] commits, see there).
    pub(super) fn write<T>(
        &mut self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        let mut tx = self.db.begin_write().map_err(store_failed)?;
        self.tally.evictions_left = EVICTIONS_PER_WRITE;
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
                by_priority: tx.open_table(BY_PRIORITY).map_err(store_failed)?,
                claim_free_id: tx.open_table(CLAIM_FREE_ID).map_err(store_failed)?,
                claim_free_created: tx.open_table(CLAIM_FREE_CREATED).map_err(store_failed)?,
                claim_keyed_id: tx.open_table(CLAIM_KEYED_ID).map_err(store_failed)?,
                claim_keyed_created: tx.open_table(CLAIM_KEYED_CREATED).map_err(store_failed)?,
                held_by_key: tx.open_table(HELD_BY_KEY).map_err(store_failed)?,
            };
            f(&mut w)?
        };
        tx.commit().map_err(store_failed)?;
        Ok(out)
    }

    /// A durable commit (nothing else): releases what the lazy ones kept.
    pub(super) fn durable(&mut self) -> Result<(), Refusal> {
        self.lazy_commits = DURABLE_EVERY;
        self.write(|_| Ok(()))
    }

    pub(super) fn dir_of(&self, k: &DirKey) -> PathBuf {
        dir_of(&self.base, k)
    }

    /// An entry's generation and summary, read back.
    pub(super) fn entry(&self, key: &DirKey) -> Result<Option<Entry>, Refusal> {
        let tx = self.db.begin_read().map_err(store_failed)?;
        let t = tx.open_table(ENTRIES).map_err(store_failed)?;
        let got = t.get(dir_key(key).as_str()).map_err(store_failed)?;
        Ok(got.and_then(|v| Entry::decode(v.value())))
    }

    /// Drains the queued events into what must be re-read.
    pub(super) fn drain(&mut self) -> Result<Dirty, Refusal> {
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
                    // grandchild lives beside its own parent, not inside it).
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
                        w.tally.held(-1);
                    }
                }
                Ok(())
            })?;
        }
        if crate::testing_hooks::mutation() == crate::testing_hooks::Mutation::IndexIgnoresEvents {
            return Ok(Dirty::default());
        }
        Ok(d)
    }

    /// Brings the index up to the directory: every change queued so far.
    /// `Ok(false)`: an overflow; rebuild.
    pub(super) fn sync(&mut self) -> Result<bool, Refusal> {
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
    pub(super) fn scan(
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
                ListOrder::Priority => BY_PRIORITY,
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
                    concurrency: s.concurrency.clone(),
                    deadline: s.deadline,
                });
            }
        }
        Ok(out)
    }

    /// Up to `want` entries after `after` in `claim_next`'s key for `order`
    /// whose summary passes `keep`, merging the free stream with one stream
    /// per key and limit; a stream `skip` answers true for (the key is at
    /// that limit) is dropped whole, its entries never visited: a call costs
    /// one seek per key plus the entries it visits, whatever the number of
    /// runs waiting behind saturated keys. `skip` is given the key's live
    /// leases at `now` as the index has them ([`held_live`]).
    pub(super) fn scan_claim(
        &self,
        order: ListOrder,
        after: Option<&RowKey>,
        want: usize,
        now: Timestamp,
        keep: &dyn Fn(&Summary) -> bool,
        skip: &dyn Fn(&str, u32, u32) -> bool,
    ) -> Result<Vec<Found>, Refusal> {
        use std::cmp::Reverse;
        let tx = self.db.begin_read().map_err(store_failed)?;
        let held = tx.open_table(HELD_BY_KEY).map_err(store_failed)?;
        let (free, keyed) = match order {
            ListOrder::CreatedAt => (CLAIM_FREE_CREATED, CLAIM_KEYED_CREATED),
            ListOrder::RunId | ListOrder::Priority => (CLAIM_FREE_ID, CLAIM_KEYED_ID),
        };
        let free = tx.open_table(free).map_err(store_failed)?;
        let keyed = tx.open_table(keyed).map_err(store_failed)?;
        let from = after.map(|a| encode_key(&a.without_tie()));
        type Stream<'r> = (
            Option<(String, u32)>,
            usize,
            redb::Range<'r, &'static [u8], &'static [u8]>,
        );
        let mut streams: Vec<Stream<'_>> = Vec::new();
        let range = match &from {
            Some(a) => free.range::<&[u8]>((Bound::Excluded(a.as_slice()), Bound::Unbounded)),
            None => free.range::<&[u8]>(..),
        }
        .map_err(store_failed)?;
        streams.push((None, 0, range));
        // One stream per key and limit: the first entry at or after each
        // prefix names the next one.
        let mut at: Vec<u8> = Vec::new();
        loop {
            let first = keyed
                .range::<&[u8]>((Bound::Included(at.as_slice()), Bound::Unbounded))
                .map_err(store_failed)?
                .next();
            let Some(item) = first else { break };
            let (k, _) = item.map_err(store_failed)?;
            let Some((key, limit)) = parse_keyed_prefix(k.value()) else {
                return Err(store_failed("an undecodable keyed claim entry"));
            };
            let p = keyed_prefix(&key, limit);
            let end = keyed_prefix_end(&key, limit);
            let start = match &from {
                Some(a) => Bound::Excluded([p.as_slice(), a].concat()),
                None => Bound::Included(p.clone()),
            };
            let range = keyed
                .range::<&[u8]>((
                    match &start {
                        Bound::Excluded(b) => Bound::Excluded(b.as_slice()),
                        Bound::Included(b) => Bound::Included(b.as_slice()),
                        Bound::Unbounded => Bound::Unbounded,
                    },
                    Bound::Excluded(end.as_slice()),
                ))
                .map_err(store_failed)?;
            streams.push((Some((key, limit)), p.len(), range));
            at = end;
        }
        let mut heads: std::collections::BinaryHeap<Reverse<(Vec<u8>, usize)>> =
            std::collections::BinaryHeap::new();
        let mut pending: Vec<Option<Vec<u8>>> = vec![None; streams.len()];
        let advance = |streams: &mut Vec<Stream<'_>>,
                       pending: &mut Vec<Option<Vec<u8>>>,
                       heads: &mut std::collections::BinaryHeap<Reverse<(Vec<u8>, usize)>>,
                       i: usize|
         -> Result<(), Refusal> {
            if let Some(item) = streams[i].2.next() {
                let (k, v) = item.map_err(store_failed)?;
                let skip_len = streams[i].1;
                heads.push(Reverse((k.value()[skip_len..].to_vec(), i)));
                pending[i] = Some(v.value().to_vec());
            }
            Ok(())
        };
        for i in 0..streams.len() {
            advance(&mut streams, &mut pending, &mut heads, i)?;
        }
        let mut out = Vec::new();
        while out.len() < want {
            let Some(Reverse((_, i))) = heads.pop() else {
                break;
            };
            let Some(v) = pending[i].take() else { continue };
            if let Some((key, limit)) = &streams[i].0 {
                if skip(key, *limit, held_live(&held, key, now)?) {
                    // The key is at this limit: the whole stream waits.
                    continue;
                }
            }
            let Some((generation, s, key)) = decode_row(&v) else {
                return Err(store_failed("an undecodable row"));
            };
            if keep(&s) {
                out.push(Found {
                    key: s.claim_key(order, &key),
                    candidate: Candidate {
                        dir: self.dir_of(&key),
                        run: key.1,
                        parent: key.0,
                    },
                    generation,
                    concurrency: s.concurrency.clone(),
                    deadline: s.deadline,
                });
            }
            advance(&mut streams, &mut pending, &mut heads, i)?;
        }
        Ok(out)
    }
}

/// The runs of `key` whose top holding is a lease live at `now`, from the
/// `held_by_key` table: what the index saw of the key's holdings (the
/// claim itself counts again from the key's held set under its lock).
fn held_live(
    table: &redb::ReadOnlyTable<&'static [u8], i64>,
    key: &str,
    now: Timestamp,
) -> Result<u32, Refusal> {
    let lo = held_prefix(key);
    let mut hi = key.as_bytes().to_vec();
    hi.push(1);
    let mut n = 0;
    for item in table
        .range::<&[u8]>(lo.as_slice()..hi.as_slice())
        .map_err(store_failed)?
    {
        let (_, until) = item.map_err(store_failed)?;
        let live = Timestamp::from_millis(until.value())
            .is_ok_and(|t| !runkeep::lease::is_expired(t, now));
        if live {
            n += 1;
        }
    }
    Ok(n)
}

impl Writer<'_> {
    pub(super) fn entry(&self, key: &str) -> Result<Option<Entry>, Refusal> {
        let got = self.entries.get(key).map_err(store_failed)?;
        Ok(got.and_then(|v| Entry::decode(v.value())))
    }

    pub(super) fn put_entry(&mut self, key: &str, e: &Entry) -> Result<(), Refusal> {
        let old = self
            .entries
            .insert(key, e.encode().as_slice())
            .map_err(store_failed)?;
        if old.is_none() {
            self.tally.entries += 1;
        }
        Ok(())
    }

    pub(super) fn add_watch(&mut self, wd: i32, kind: Kind, owner: &str) -> Result<(), Refusal> {
        let mut v = Vec::with_capacity(1 + owner.len());
        v.push(kind_code(kind));
        v.extend_from_slice(owner.as_bytes());
        if self
            .watches
            .insert(wd, v.as_slice())
            .map_err(store_failed)?
            .is_none()
        {
            self.tally.held(1);
        }
        Ok(())
    }

    pub(super) fn watch(
        &mut self,
        owner: &str,
        path: &Path,
        kind: Kind,
    ) -> Result<Watched, Refusal> {
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
    pub(super) fn unwatch(
        &mut self,
        owner: &str,
        old: &[i32],
        keep: &[i32],
    ) -> Result<(), Refusal> {
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
                self.tally.held(-1);
                let _ = inotify::remove_watch(self.fd, *wd);
            }
        }
        Ok(())
    }

    /// Replaces the summary of the entry `key` (which exists), keeping the
    /// order maps in step and bumping its generation.
    pub(super) fn set_summary(
        &mut self,
        k: &DirKey,
        summary: Option<Summary>,
    ) -> Result<(), Refusal> {
        let key = dir_key(k);
        let Some(mut e) = self.entry(&key)? else {
            return Ok(());
        };
        self.apply_summary(k, &key, &mut e, summary)?;
        self.put_entry(&key, &e)
    }

    /// Gives the entry `e` (of `k`, keyed `key`) the summary `summary`: the
    /// order tables follow and its generation is bumped; the caller stores
    /// `e`.
    fn apply_summary(
        &mut self,
        k: &DirKey,
        key: &str,
        e: &mut Entry,
        summary: Option<Summary>,
    ) -> Result<(), Refusal> {
        if let Some(o) = &e.summary {
            if let Some((held, _)) = o.key_lease() {
                self.held_by_key
                    .remove(
                        [held_prefix(held).as_slice(), key.as_bytes()]
                            .concat()
                            .as_slice(),
                    )
                    .map_err(store_failed)?;
            }
            self.by_id
                .remove(encode_key(&o.key(ListOrder::RunId, k)).as_slice())
                .map_err(store_failed)?;
            self.by_created
                .remove(encode_key(&o.key(ListOrder::CreatedAt, k)).as_slice())
                .map_err(store_failed)?;
            self.by_priority
                .remove(encode_key(&o.key(ListOrder::Priority, k)).as_slice())
                .map_err(store_failed)?;
            let id = encode_key(&o.claim_key(ListOrder::RunId, k));
            let created = encode_key(&o.claim_key(ListOrder::CreatedAt, k));
            match o.claim_stream() {
                None => {
                    self.claim_free_id
                        .remove(id.as_slice())
                        .map_err(store_failed)?;
                    self.claim_free_created
                        .remove(created.as_slice())
                        .map_err(store_failed)?;
                }
                Some((key, limit)) => {
                    let p = keyed_prefix(key, limit);
                    self.claim_keyed_id
                        .remove([p.as_slice(), &id].concat().as_slice())
                        .map_err(store_failed)?;
                    self.claim_keyed_created
                        .remove([p.as_slice(), &created].concat().as_slice())
                        .map_err(store_failed)?;
                }
            }
        }
        e.generation += 1;
        if let Some(new) = &summary {
            if let Some((held, until)) = new.key_lease() {
                self.held_by_key
                    .insert(
                        [held_prefix(held).as_slice(), key.as_bytes()]
                            .concat()
                            .as_slice(),
                        until.as_millis(),
                    )
                    .map_err(store_failed)?;
            }
            let row = encode_row(e.generation, new, key);
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
            self.by_priority
                .insert(
                    encode_key(&new.key(ListOrder::Priority, k)).as_slice(),
                    row.as_slice(),
                )
                .map_err(store_failed)?;
            let id = encode_key(&new.claim_key(ListOrder::RunId, k));
            let created = encode_key(&new.claim_key(ListOrder::CreatedAt, k));
            match new.claim_stream() {
                None => {
                    self.claim_free_id
                        .insert(id.as_slice(), row.as_slice())
                        .map_err(store_failed)?;
                    self.claim_free_created
                        .insert(created.as_slice(), row.as_slice())
                        .map_err(store_failed)?;
                }
                Some((key, limit)) => {
                    let p = keyed_prefix(key, limit);
                    self.claim_keyed_id
                        .insert([p.as_slice(), &id].concat().as_slice(), row.as_slice())
                        .map_err(store_failed)?;
                    self.claim_keyed_created
                        .insert([p.as_slice(), &created].concat().as_slice(), row.as_slice())
                        .map_err(store_failed)?;
                }
            }
        }
        e.summary = summary;
        Ok(())
    }

    /// The sub-runs indexed under the top-level run `parent`.
    pub(super) fn children_of(&self, parent: &RunId) -> Result<BTreeSet<RunId>, Refusal> {
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

    pub(super) fn remove(&mut self, k: &DirKey) -> Result<(), Refusal> {
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
    pub(super) fn mark(&mut self, key: &str, swept: bool, evictable: bool) -> Result<(), Refusal> {
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
    pub(super) fn reload(&mut self, k: &DirKey) -> Result<(), Refusal> {
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
        let held = e.wds.len() as u64;
        let fits = |t: &Tally, n: u64| t.process_watches().saturating_sub(held) + n <= t.budget;
        // Near the budget, it counts the directories there now (a stat
        // each, so only there); every one is still asked for (one created
        // meanwhile is then watched, not missed).
        let most = wants.len() as u64;
        let need = if fits(self.tally, most) {
            most
        } else {
            wants.iter().filter(|(p, _)| is_real_dir(p)).count() as u64
        };
        // A run known not to be finished (read before, now changed) may
        // take the watches of a finished one, which is then swept; a run
        // not read yet (every run of a build) or finished waits for room.
        let unfinished = e.summary.as_ref().is_some_and(|s| !s.status.is_finished());
        let room = |t: &Tally| fits(t, need);
        while !room(self.tally) && unfinished && self.evict_one(&key)? {}
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
                self.tally.budget = self.tally.budget.min(self.tally.process_watches().max(1));
            }
            e.wds = Vec::new();
            // The stamp before the read: a change after it moves it.
            e.stamp = Some(stamp_of(&dir, top, self.tally.racy_ns));
        }
        let summary = read_summary(k, dir);
        let finished = summary.as_ref().is_some_and(|s| s.status.is_finished());
        self.mark(&key, !watched, watched && finished)?;
        self.apply_summary(k, &key, &mut e, summary)?;
        self.put_entry(&key, &e)
    }

    /// Takes the watches of one finished run (not `except`), which is then
    /// swept; `false` when there is none.
    pub(super) fn evict_one(&mut self, except: &str) -> Result<bool, Refusal> {
        // Each dropped watch queues an IN_IGNORED event: a bounded number
        // per transaction keeps the queue far below its limit between two
        // drains.
        if self.tally.evictions_left == 0 {
            return Ok(false);
        }
        self.tally.evictions_left -= 1;
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
        self.tally.evicted += 1;
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
        self.mark(&victim, true, false)?;
        let summary = read_summary(&vk, dir);
        self.apply_summary(&vk, &victim, &mut ve, summary)?;
        self.put_entry(&victim, &ve)?;
        Ok(true)
    }

    /// Makes sure the entry `k` exists (empty), then re-reads it.
    pub(super) fn load(&mut self, k: &DirKey) -> Result<(), Refusal> {
        let key = dir_key(k);
        if self.entry(&key)?.is_none() {
            self.put_entry(&key, &Entry::default())?;
        }
        self.reload(k)
    }

    /// A top-level run directory named `name` appeared, changed or went.
    pub(super) fn reload_top(&mut self, name: &str) -> Result<(), Refusal> {
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
    pub(super) fn rescan_children(&mut self, k: &DirKey) -> Result<(), Refusal> {
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
    pub(super) fn reload_child(&mut self, k: &DirKey, name: &str) -> Result<(), Refusal> {
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

/// The summary of the run directory `dir` of `k`, read as the walk reads it.
fn read_summary(k: &DirKey, dir: PathBuf) -> Option<Summary> {
    let c = Candidate {
        run: k.1.clone(),
        parent: k.0.clone(),
        dir,
    };
    listing::read_run(&c, &Ctx::store("list_runs"))
        .as_ref()
        .and_then(Summary::of)
}
