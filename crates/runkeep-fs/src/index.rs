//! The session index: what a listing page and `claim_next` consult instead
//! of walking every run directory (issue 11, item 2).
//!
//! # What it holds
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
//! - inotify unavailable, or the per-user watch limit
//!   (`fs.inotify.max_user_watches`) reached: the index needs about
//!   [`WATCHES_PER_RUN`] watches per run;
//! - after an inotify queue overflow the index is rebuilt (one walk).
//!
//! What the kernel does not report, and the index therefore sees late (at
//! the run's next reported change, or never): a change written through a
//! shared memory mapping (`mmap`, no `IN_MODIFY`), bytes changed beneath the
//! filesystem (block device, another host on a shared block device), and a
//! row that changes with time only (a lease lapsing, a park deadline, a
//! deferral ending) — which is not a change at all: the summary keeps the
//! instants and every filter is judged at the page's `now`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

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

/// inotify watches one run costs: its directory, `checkpoints/`, `claims/`
/// and `.runkeep/` (a parent also watches its `children/`).
pub(crate) const WATCHES_PER_RUN: usize = 4;

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

struct Entry {
    key: DirKey,
    /// The watch descriptors this entry added (the map says which it still
    /// owns).
    wds: Vec<i32>,
    /// Sub-run directories (a top-level entry only).
    children: BTreeSet<RunId>,
    summary: Option<Summary>,
    /// Bumped by every change of `summary` (see [`SessionIndex::reconcile`]).
    generation: u64,
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

/// The built index.
struct Built {
    fd: OwnedFd,
    base: PathBuf,
    wds: HashMap<i32, (u32, Kind)>,
    slots: Vec<Option<Entry>>,
    free: Vec<u32>,
    dirs: HashMap<DirKey, u32>,
    by_id: BTreeMap<RowKey, u32>,
    by_created: BTreeMap<RowKey, u32>,
}

/// What a drain found to re-read.
#[derive(Default)]
struct Dirty {
    rebuild: bool,
    top: BTreeSet<String>,
    runs: BTreeSet<u32>,
    children: BTreeSet<u32>,
    child_names: BTreeSet<(u32, String)>,
}

/// An add_watch failure that makes the index unusable.
fn fatal(e: rustix::io::Errno, path: &Path) -> Option<Refusal> {
    if e == rustix::io::Errno::NOENT || e == rustix::io::Errno::NOTDIR {
        return None;
    }
    let why = if e == rustix::io::Errno::NOSPC {
        format!(
            "the inotify watch limit was reached while watching {} (the index needs about {WATCHES_PER_RUN} watches per run; raise fs.inotify.max_user_watches, e.g. `sysctl fs.inotify.max_user_watches=1048576`)",
            path.display()
        )
    } else {
        format!("cannot watch {} ({e})", path.display())
    };
    Some(Refusal(why))
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

impl Built {
    fn build(base: &Path, hook: Option<BuildHook>) -> Result<Built, Refusal> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| Refusal(format!("inotify_init failed ({e})")))?;
        let mut b = Built {
            fd,
            base: base.to_path_buf(),
            wds: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            dirs: HashMap::new(),
            by_id: BTreeMap::new(),
            by_created: BTreeMap::new(),
        };
        let wd = inotify::add_watch(&b.fd, base, mask(Kind::Base)).map_err(|e| {
            fatal(e, base).unwrap_or_else(|| Refusal(format!("{} is gone", base.display())))
        })?;
        b.wds.insert(wd, (u32::MAX, Kind::Base));
        let names = run_names(base);
        if let Some(hook) = hook {
            // Tests: changes between the store directory's read and the
            // runs' (each must be read or queued).
            hook();
        }
        for run in names {
            b.reload_top(run.as_str())?;
        }
        Ok(b)
    }

    fn dir_of(&self, k: &DirKey) -> PathBuf {
        match &k.0 {
            Some(p) => self
                .base
                .join(p.as_str())
                .join(CHILDREN_DIR)
                .join(k.1.as_str()),
            None => self.base.join(k.1.as_str()),
        }
    }

    fn entry(&self, slot: u32) -> Option<&Entry> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    fn slot_for(&mut self, key: DirKey) -> u32 {
        if let Some(s) = self.dirs.get(&key) {
            return *s;
        }
        let entry = Entry {
            key: key.clone(),
            wds: Vec::new(),
            children: BTreeSet::new(),
            summary: None,
            generation: 0,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(entry);
                s
            }
            None => {
                self.slots.push(Some(entry));
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.dirs.insert(key, slot);
        slot
    }

    fn watch(&mut self, slot: u32, path: &Path, kind: Kind) -> Result<Option<i32>, Refusal> {
        match inotify::add_watch(&self.fd, path, mask(kind)) {
            Ok(wd) => {
                self.wds.insert(wd, (slot, kind));
                Ok(Some(wd))
            }
            Err(e) => match fatal(e, path) {
                Some(r) => Err(r),
                None => Ok(None),
            },
        }
    }

    /// Drops the watches of `slot` not in `keep` that it still owns.
    fn unwatch(&mut self, slot: u32, old: &[i32], keep: &[i32]) {
        for wd in old {
            if keep.contains(wd) {
                continue;
            }
            if self.wds.get(wd).is_some_and(|(s, _)| *s == slot) {
                self.wds.remove(wd);
                let _ = inotify::remove_watch(&self.fd, *wd);
            }
        }
    }

    fn set_summary(&mut self, slot: u32, summary: Option<Summary>) {
        let Some(e) = self.entry(slot) else { return };
        let key = e.key.clone();
        let old = e.summary.as_ref().map(|o| {
            (
                o.key(ListOrder::RunId, &key),
                o.key(ListOrder::CreatedAt, &key),
            )
        });
        if let Some((by_id, by_created)) = old {
            self.by_id.remove(&by_id);
            self.by_created.remove(&by_created);
        }
        if let Some(new) = &summary {
            self.by_id.insert(new.key(ListOrder::RunId, &key), slot);
            self.by_created
                .insert(new.key(ListOrder::CreatedAt, &key), slot);
        }
        if let Some(Some(e)) = self.slots.get_mut(slot as usize) {
            e.summary = summary;
            e.generation += 1;
        }
    }

    fn remove(&mut self, slot: u32) {
        let Some(e) = self.entry(slot) else { return };
        let (key, wds) = (e.key.clone(), e.wds.clone());
        let children: Vec<RunId> = e.children.iter().cloned().collect();
        for c in children {
            if let Some(s) = self.dirs.get(&(Some(key.1.clone()), c)).copied() {
                self.remove(s);
            }
        }
        self.set_summary(slot, None);
        self.unwatch(slot, &wds, &[]);
        self.dirs.remove(&key);
        self.slots[slot as usize] = None;
        self.free.push(slot);
    }

    /// Re-reads one run directory: watches first, then the files.
    fn reload(&mut self, slot: u32) -> Result<(), Refusal> {
        let Some(e) = self.entry(slot) else {
            return Ok(());
        };
        let (key, old) = (e.key.clone(), e.wds.clone());
        let dir = self.dir_of(&key);
        if !is_real_dir(&dir) {
            self.remove(slot);
            return Ok(());
        }
        let mut wds = Vec::with_capacity(WATCHES_PER_RUN + 1);
        wds.extend(self.watch(slot, &dir, Kind::Run)?);
        wds.extend(self.watch(slot, &dir.join(CHECKPOINTS_DIR), Kind::Rows)?);
        wds.extend(self.watch(slot, &dir.join(CLAIMS_DIR), Kind::Rows)?);
        wds.extend(self.watch(slot, &dir.join(META_DIR), Kind::Meta)?);
        if key.0.is_none() {
            wds.extend(self.watch(slot, &dir.join(CHILDREN_DIR), Kind::Children)?);
        }
        self.unwatch(slot, &old, &wds);
        if let Some(Some(e)) = self.slots.get_mut(slot as usize) {
            e.wds = wds;
        }
        let c = Candidate {
            run: key.1.clone(),
            parent: key.0.clone(),
            dir,
        };
        let read = listing::read_run(&c, &Ctx::store("list_runs"));
        self.set_summary(slot, read.as_ref().and_then(Summary::of));
        Ok(())
    }

    /// A top-level run directory named `name` appeared, changed or went.
    fn reload_top(&mut self, name: &str) -> Result<(), Refusal> {
        let Ok(run) = RunId::new(name) else {
            return Ok(());
        };
        let key = (None, run);
        if !is_real_dir(&self.dir_of(&key)) {
            if let Some(s) = self.dirs.get(&key).copied() {
                self.remove(s);
            }
            return Ok(());
        }
        let slot = self.slot_for(key);
        self.reload(slot)?;
        self.rescan_children(slot)
    }

    /// Re-reads a top-level run's `children/` (its watch is in place).
    fn rescan_children(&mut self, slot: u32) -> Result<(), Refusal> {
        let Some(e) = self.entry(slot) else {
            return Ok(());
        };
        let (parent, known) = (e.key.1.clone(), e.children.clone());
        let dir = self.dir_of(&e.key).join(CHILDREN_DIR);
        let now: BTreeSet<RunId> = run_names(&dir).into_iter().collect();
        for gone in known.difference(&now) {
            if let Some(s) = self
                .dirs
                .get(&(Some(parent.clone()), gone.clone()))
                .copied()
            {
                self.remove(s);
            }
        }
        for c in &now {
            let s = self.slot_for((Some(parent.clone()), c.clone()));
            self.reload(s)?;
        }
        if let Some(Some(e)) = self.slots.get_mut(slot as usize) {
            e.children = now;
        }
        Ok(())
    }

    /// A sub-run directory `name` of the top-level run at `slot` appeared,
    /// changed or went.
    fn reload_child(&mut self, slot: u32, name: &str) -> Result<(), Refusal> {
        let (Some(e), Ok(run)) = (self.entry(slot), RunId::new(name)) else {
            return Ok(());
        };
        let key = (Some(e.key.1.clone()), run.clone());
        if is_real_dir(&self.dir_of(&key)) {
            let s = self.slot_for(key);
            if let Some(Some(e)) = self.slots.get_mut(slot as usize) {
                e.children.insert(run);
            }
            self.reload(s)
        } else {
            if let Some(s) = self.dirs.get(&key).copied() {
                self.remove(s);
            }
            if let Some(Some(e)) = self.slots.get_mut(slot as usize) {
                e.children.remove(&run);
            }
            Ok(())
        }
    }

    /// Drains the queued events into what must be re-read.
    fn drain(&mut self) -> Dirty {
        let mut d = Dirty::default();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 16384];
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
                self.wds.remove(&wd);
                continue;
            }
            let Some((slot, kind)) = self.wds.get(&wd).copied() else {
                continue;
            };
            let name = ev
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let itself = flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF);
            match kind {
                Kind::Base if itself => d.rebuild = true,
                Kind::Base => {
                    if crate::listing::is_listed_run_name(&name) {
                        d.top.insert(name);
                    }
                }
                Kind::Run if itself => {
                    d.runs.insert(slot);
                }
                Kind::Run => match name.as_str() {
                    CHECKPOINTS_DIR | CLAIMS_DIR | META_DIR => {
                        d.runs.insert(slot);
                    }
                    // Only a top-level run's sub-runs are runs (a
                    // grandchild lives beside its own parent, CS-68).
                    CHILDREN_DIR if self.entry(slot).is_some_and(|e| e.key.0.is_none()) => {
                        d.children.insert(slot);
                    }
                    _ => {}
                },
                Kind::Rows => {
                    d.runs.insert(slot);
                }
                Kind::Meta => {
                    if itself || name == LIFECYCLE_FILE {
                        d.runs.insert(slot);
                    }
                }
                Kind::Children if itself => {
                    d.children.insert(slot);
                }
                Kind::Children => {
                    if crate::listing::is_listed_run_name(&name) {
                        d.child_names.insert((slot, name));
                    }
                }
            }
        }
        if crate::testing_hooks::mutation_named("index-ignores-events") {
            return Dirty::default();
        }
        d
    }

    /// Brings the index up to the directory: every change queued so far.
    /// `Ok(false)`: an overflow; rebuild.
    fn sync(&mut self) -> Result<bool, Refusal> {
        let d = self.drain();
        if d.rebuild {
            return Ok(false);
        }
        for name in &d.top {
            self.reload_top(name)?;
        }
        for slot in d.children {
            // `children/` appeared (or went): watch it, then read it.
            self.reload(slot)?;
            self.rescan_children(slot)?;
        }
        for (slot, name) in &d.child_names {
            self.reload_child(*slot, name)?;
        }
        for slot in d.runs {
            self.reload(slot)?;
        }
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
    ) -> Vec<Found> {
        let map = match order {
            ListOrder::RunId => &self.by_id,
            ListOrder::CreatedAt => &self.by_created,
        };
        let range = match after {
            Some(a) => map.range((Bound::Excluded(a.clone()), Bound::Unbounded)),
            None => map.range::<RowKey, _>(..),
        };
        let mut out = Vec::new();
        for (k, slot) in range {
            if out.len() >= want {
                break;
            }
            let Some(e) = self.entry(*slot) else { continue };
            let Some(s) = &e.summary else { continue };
            if keep(s) {
                out.push(Found {
                    key: k.clone(),
                    candidate: Candidate {
                        run: e.key.1.clone(),
                        parent: e.key.0.clone(),
                        dir: self.dir_of(&e.key),
                    },
                    generation: e.generation,
                });
            }
        }
        out
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
fn build_into(state: &Mutex<State>, base: &Path, hook: Option<BuildHook>) {
    let built = match remote(base) {
        Some(why) => Err(Refusal(why)),
        None => Built::build(base, hook),
    };
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(*st, State::Building) {
        *st = match built {
            Ok(b) => State::Built(Box::new(b)),
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
        let spawned = std::thread::Builder::new()
            .name("runkeep-fs-index".into())
            .spawn(move || {
                build_into(&state, &dir, hook);
                BUILDS.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            BUILDS.fetch_sub(1, Ordering::SeqCst);
            *st = refused(base, format!("cannot start the index thread ({e})"));
        }
    }

    /// Runs `f` on the index brought up to date with the directory, or
    /// answers `None` when the index cannot be used (yet): the caller walks.
    fn with<T>(&self, base: &Path, off: bool, f: impl FnOnce(&Built) -> T) -> Option<T> {
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
                Ok(true) => Some(f(b)),
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
        if let State::Built(b) = &mut *st {
            let key = (found.candidate.parent.clone(), found.candidate.run.clone());
            if let Some(slot) = b.dirs.get(&key).copied() {
                if b.entry(slot)
                    .is_some_and(|e| e.generation == found.generation && e.summary != summary)
                {
                    b.set_summary(slot, summary);
                }
            }
        }
    }

    /// Whether the index is in use, and why not (tests, benches).
    #[cfg(feature = "testing")]
    pub(crate) fn status(&self) -> std::result::Result<usize, String> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &*st {
            State::Built(b) => Ok(b.dirs.len()),
            State::Refused(why) => Err(why.clone()),
            State::Unbuilt => Err("not built yet (the first listing starts it)".into()),
            State::Building => Err("being built".into()),
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
