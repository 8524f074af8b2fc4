//! Test seams, compiled to no-ops without the `testing` feature.
//!
//! Production code calls these at the points a test may want to break: an
//! injected errno before a system call, a deliberately broken publish mode
//! (to prove the race tests can fail), a pause point inside the critical
//! section (to measure the residual window). Without the feature every hook
//! is an empty inline function.

use std::io;
use std::path::Path;

use runkeep::Fence;

/// Where a fault can be injected.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Point {
    /// Creating a directory.
    Mkdir,
    /// Creating or writing a whole-file sidecar.
    Write,
    /// Renaming a sidecar onto its target.
    Rename,
    /// `fsync` of a file or directory.
    Fsync,
    /// Appending to a transcript or audit trail.
    Append,
    /// Creating a claim scratch file.
    ScratchCreate,
    /// The hard link that publishes a holding (also the probe at open).
    Link,
}

/// The store deliberately broken, to prove a test catches it: every
/// mutation a test can switch on (`RUNKEEP_FS_TEST_MUTATION=<name>`, across
/// processes), one enum, parsed in one place ([`Mutation::parse`]).
#[derive(Clone, PartialEq, Eq, Debug)]
#[cfg_attr(
    not(feature = "testing"),
    allow(dead_code, reason = "read only by the test seams")
)]
pub(crate) enum Mutation {
    /// The correct store.
    None,
    /// `per-fence-scratch`: the scratch name is a function of the fence
    /// (`.tmp-<fence>`), created without exclusivity: two publishers of one
    /// fence share it.
    PerFenceScratch,
    /// `open-exclusive-then-write`: the holding is created exclusively and
    /// then written (no link).
    OpenExclusiveThenWrite,
    /// `no-write-fence`: writes skip the fence check (a store that fences
    /// nothing).
    NoWriteFence,
    /// `no-run-lock`: the run lock is never taken (check-then-act and seq
    /// assignment unprotected).
    NoRunLock,
    /// `no-post-link-check`: the check after a holding's link is skipped
    /// (brings back "a fence issued twice").
    NoPostLinkCheck,
    /// `no-append-recheck`: an append does not check the fence again right
    /// before it writes.
    NoAppendRecheck,
    /// `step-checkpoint-first`: `commit_step` publishes its checkpoint
    /// before its events.
    StepCheckpointFirst,
    /// `index-ignores-events`: the session index misses event appends.
    IndexIgnoresEvents,
    /// `key-count-zero`: a claim of a keyed run passes 0 as the count of
    /// the key's other live holdings (the limit is never enforced).
    KeyCountZero,
    /// `no-key-lock`: the concurrency key lock is never taken (count and
    /// publish race).
    NoKeyLock,
    /// `held-after-log`: a keyed claim enters its run in the key's held set
    /// only after logging its holding (not before linking it).
    HeldAfterLog,
    /// `prune-no-rejudge`: a prune deletes a run the listing showed due
    /// without judging it again under its run lock.
    PruneNoRejudge,
    /// `no-dir-fsync` / `no-file-fsync`, optionally `:<name>`: the `fsync`
    /// of directories or of files removed, everywhere or only for paths
    /// with a component equal to `<name>` or a file name starting with
    /// `<name>.` (`no-dir-fsync:claims`, `no-file-fsync:transcript.jsonl`).
    NoSync {
        /// Which syncs.
        of: Synced,
        /// Only for paths named so.
        only: Option<String>,
    },
}

/// What an `fsync` syncs (the `no-dir-fsync` / `no-file-fsync` mutations).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Synced {
    /// A directory (its entries).
    Dir,
    /// A file (its bytes).
    File,
}

#[cfg_attr(
    not(feature = "testing"),
    allow(dead_code, reason = "read only by the test seams")
)]
impl Mutation {
    /// The mutation called `name`. An unknown name panics: a test that
    /// misspells its mutation would otherwise run the correct store and
    /// pass for the wrong reason.
    pub(crate) fn parse(name: &str) -> Mutation {
        let (kind, only) = match name.split_once(':') {
            Some((k, n)) => (k, Some(n.to_string())),
            None => (name, None),
        };
        match (kind, only) {
            ("" | "none", None) => Mutation::None,
            ("per-fence-scratch", None) => Mutation::PerFenceScratch,
            ("open-exclusive-then-write", None) => Mutation::OpenExclusiveThenWrite,
            ("no-write-fence", None) => Mutation::NoWriteFence,
            ("no-run-lock", None) => Mutation::NoRunLock,
            ("no-post-link-check", None) => Mutation::NoPostLinkCheck,
            ("no-append-recheck", None) => Mutation::NoAppendRecheck,
            ("step-checkpoint-first", None) => Mutation::StepCheckpointFirst,
            ("index-ignores-events", None) => Mutation::IndexIgnoresEvents,
            ("key-count-zero", None) => Mutation::KeyCountZero,
            ("no-key-lock", None) => Mutation::NoKeyLock,
            ("held-after-log", None) => Mutation::HeldAfterLog,
            ("prune-no-rejudge", None) => Mutation::PruneNoRejudge,
            ("no-dir-fsync", only) => Mutation::NoSync {
                of: Synced::Dir,
                only,
            },
            ("no-file-fsync", only) => Mutation::NoSync {
                of: Synced::File,
                only,
            },
            _ => panic!(
                "RUNKEEP_FS_TEST_MUTATION={name:?} names no mutation of runkeep-fs (see testing_hooks::Mutation)"
            ),
        }
    }
}

#[cfg(feature = "testing")]
pub(crate) fn fault(point: Point, path: &Path) -> io::Result<()> {
    crate::testing::check(point, path)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn fault(_point: Point, _path: &Path) -> io::Result<()> {
    Ok(())
}

#[cfg(feature = "testing")]
pub(crate) fn mutation() -> Mutation {
    match std::env::var("RUNKEEP_FS_TEST_MUTATION") {
        Ok(name) => Mutation::parse(&name),
        Err(_) => Mutation::None,
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn mutation() -> Mutation {
    Mutation::None
}

/// True when a test forces the scratch-name publish (no `O_TMPFILE`).
#[cfg(feature = "testing")]
pub(crate) fn force_scratch() -> bool {
    std::env::var("RUNKEEP_FS_TEST_PUBLISH").as_deref() == Ok("scratch")
        || matches!(
            mutation(),
            Mutation::PerFenceScratch | Mutation::OpenExclusiveThenWrite
        )
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn force_scratch() -> bool {
    false
}

/// A point where a test may stop this process (SIGSTOP) inside a critical
/// section: `RUNKEEP_FS_TEST_PAUSE=<name>`, across processes. One enum, so a
/// call site cannot misspell its point, and a test that names no point is
/// refused ([`Pause::asked`]) instead of never pausing and passing for the
/// wrong reason. Without the `testing` feature the names are not compiled
/// in and every pause is an empty inline function.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pause {
    /// `before-append-write`: an append checked its fence, not yet written.
    BeforeAppendWrite,
    /// `mid-append-write`: part of an append's bytes landed, the rest not.
    MidAppendWrite,
    /// `after-fence-check`: a fenced write checked its fence, not yet published.
    AfterFenceCheck,
    /// `scratch-before-link`: a holding written to its scratch name, not linked.
    ScratchBeforeLink,
    /// `open-exclusive-before-write`: a holding created, not yet written
    /// (the `open-exclusive-then-write` mutation).
    OpenExclusiveBeforeWrite,
    /// `claim-before-link`: a claim about to link its holding.
    ClaimBeforeLink,
    /// `dead-letter-after-link`: a claim that dead-letters linked its holding.
    DeadLetterAfterLink,
    /// `release-before-link`: a release about to link its tombstone.
    ReleaseBeforeLink,
    /// `enqueue-after-record`: an enqueue wrote its run record.
    EnqueueAfterRecord,
    /// `finish-after-record`: a finish wrote its run record.
    FinishAfterRecord,
    /// `checkpoints-before-read`: a checkpoint listing read its directory,
    /// not yet the files.
    CheckpointsBeforeRead,
    /// `step-after-check`: a step commit checked its fence.
    StepAfterCheck,
    /// `step-after-events`: a step commit appended its events.
    StepAfterEvents,
    /// `step-after-messages`: a step commit appended its messages.
    StepAfterMessages,
    /// `step-after-record`: a step commit wrote its run record.
    StepAfterRecord,
    /// `step-after-checkpoint`: a step commit published its checkpoint.
    StepAfterCheckpoint,
    /// `key-after-count`: a claim of a keyed run counted the key's live
    /// holdings under the key lock, not yet linked its own.
    KeyAfterCount,
    /// `key-after-link`: a claim of a keyed run linked its holding, not yet
    /// logged it in the key's history.
    KeyAfterLink,
    /// `prune-before-lock`: a prune found a finished run due in the
    /// listing, not yet locked it to judge it again and delete it.
    PruneBeforeLock,
}

#[cfg(feature = "testing")]
impl Pause {
    /// Every point, for [`Pause::asked`].
    const ALL: [Pause; 19] = [
        Pause::BeforeAppendWrite,
        Pause::MidAppendWrite,
        Pause::AfterFenceCheck,
        Pause::ScratchBeforeLink,
        Pause::OpenExclusiveBeforeWrite,
        Pause::ClaimBeforeLink,
        Pause::DeadLetterAfterLink,
        Pause::ReleaseBeforeLink,
        Pause::EnqueueAfterRecord,
        Pause::FinishAfterRecord,
        Pause::CheckpointsBeforeRead,
        Pause::StepAfterCheck,
        Pause::StepAfterEvents,
        Pause::StepAfterMessages,
        Pause::StepAfterRecord,
        Pause::StepAfterCheckpoint,
        Pause::KeyAfterCount,
        Pause::KeyAfterLink,
        Pause::PruneBeforeLock,
    ];

    /// Its name in `RUNKEEP_FS_TEST_PAUSE`.
    fn name(self) -> &'static str {
        match self {
            Pause::BeforeAppendWrite => "before-append-write",
            Pause::MidAppendWrite => "mid-append-write",
            Pause::AfterFenceCheck => "after-fence-check",
            Pause::ScratchBeforeLink => "scratch-before-link",
            Pause::OpenExclusiveBeforeWrite => "open-exclusive-before-write",
            Pause::ClaimBeforeLink => "claim-before-link",
            Pause::DeadLetterAfterLink => "dead-letter-after-link",
            Pause::ReleaseBeforeLink => "release-before-link",
            Pause::EnqueueAfterRecord => "enqueue-after-record",
            Pause::FinishAfterRecord => "finish-after-record",
            Pause::CheckpointsBeforeRead => "checkpoints-before-read",
            Pause::StepAfterCheck => "step-after-check",
            Pause::StepAfterEvents => "step-after-events",
            Pause::StepAfterMessages => "step-after-messages",
            Pause::StepAfterRecord => "step-after-record",
            Pause::StepAfterCheckpoint => "step-after-checkpoint",
            Pause::KeyAfterCount => "key-after-count",
            Pause::KeyAfterLink => "key-after-link",
            Pause::PruneBeforeLock => "prune-before-lock",
        }
    }

    /// The point `RUNKEEP_FS_TEST_PAUSE` names, if set. A name that is no
    /// point panics (a misspelt point would never pause).
    fn asked() -> Option<Pause> {
        let name = std::env::var("RUNKEEP_FS_TEST_PAUSE").ok()?;
        if name.is_empty() {
            return None;
        }
        let point = Pause::ALL.into_iter().find(|p| p.name() == name);
        Some(point.unwrap_or_else(|| {
            panic!("RUNKEEP_FS_TEST_PAUSE={name:?} names no pause point of runkeep-fs (see testing_hooks::Pause)")
        }))
    }
}

/// Stops this process (SIGSTOP) at `point` when a test asked for it.
#[cfg(feature = "testing")]
pub(crate) fn pause(point: Pause) {
    if Pause::asked() == Some(point) {
        if let Some(pid) = rustix::process::Pid::from_raw(std::process::id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::Stop);
            // A process-directed stop reaches this thread at its next signal
            // check; sleep so that happens here, inside the critical section.
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn pause(_point: Pause) {}

/// A test's override of the lock wait bound, in milliseconds.
#[cfg(feature = "testing")]
pub(crate) fn lock_wait_override() -> Option<u64> {
    std::env::var("RUNKEEP_FS_TEST_LOCK_WAIT_MS")
        .ok()?
        .parse()
        .ok()
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn lock_wait_override() -> Option<u64> {
    None
}

/// Stops this process (SIGSTOP) at `point` the first time it is reached,
/// when a test asked for it; later passes run on (so a retry loop after the
/// pause is not stopped again).
#[cfg(feature = "testing")]
pub(crate) fn pause_once(point: Pause) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: AtomicBool = AtomicBool::new(false);
    if Pause::asked() == Some(point) && !DONE.swap(true, Ordering::SeqCst) {
        pause(point);
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn pause_once(_point: Pause) {}

/// An event a race test reads back to prove which interleaving happened:
/// one `<pid> <line>` per event in the file `RUNKEEP_FS_TEST_TRACE` names.
/// One enum, so a call site cannot misspell its event; without the
/// `testing` feature the lines are not compiled in.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(
    not(feature = "testing"),
    allow(dead_code, reason = "read only by the test seams")
)]
pub(crate) enum Trace<'a> {
    /// `linked <fence>`: a claim linked its holding.
    Linked(Fence),
    /// `tombstone <fence>`: a release linked its tombstone.
    Tombstone(Fence),
    /// `refused-after-link <fence> above <top>`: a link the run had already
    /// moved past (the post-link check refused it).
    RefusedAfterLink {
        /// The fence linked.
        fence: Fence,
        /// The holding above it.
        above: Fence,
    },
    /// `watch-woke <store directory>`: a watch thread woke on an inotify
    /// event (not on its interval).
    WatchWoke(&'a Path),
    /// `key-counted <run> <held>`: a claim of a keyed run counted the
    /// key's other live holdings under the key lock.
    KeyCounted(&'a str, u32),
    /// `prune-listed <run>`: a prune found the run finished before its
    /// `now` in the listing (before its lock); `prune-kept <run>` /
    /// `prune-deleted <run>`: what the judgement under the lock decided.
    PruneListed(&'a str),
    /// See [`Trace::PruneListed`].
    PruneKept(&'a str),
    /// See [`Trace::PruneListed`].
    PruneDeleted(&'a str),
}

#[cfg(feature = "testing")]
impl Trace<'_> {
    /// Its line in the trace file (without the pid).
    fn line(self) -> String {
        match self {
            Trace::Linked(fence) => format!("linked {fence}"),
            Trace::Tombstone(fence) => format!("tombstone {fence}"),
            Trace::RefusedAfterLink { fence, above } => {
                format!("refused-after-link {fence} above {above}")
            }
            Trace::WatchWoke(base) => format!("watch-woke {}", base.display()),
            Trace::KeyCounted(run, held) => format!("key-counted {run} {held}"),
            Trace::PruneListed(run) => format!("prune-listed {run}"),
            Trace::PruneKept(run) => format!("prune-kept {run}"),
            Trace::PruneDeleted(run) => format!("prune-deleted {run}"),
        }
    }
}

/// Records `event` in the file a test named in `RUNKEEP_FS_TEST_TRACE`, one
/// `<pid> <line>` per call (a single `O_APPEND` write, so lines of
/// concurrent processes never interleave).
#[cfg(feature = "testing")]
pub(crate) fn trace(event: Trace<'_>) {
    use std::io::Write;
    let Ok(path) = std::env::var("RUNKEEP_FS_TEST_TRACE") else {
        return;
    };
    let line = format!("{} {}\n", std::process::id(), event.line());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn trace(_event: Trace<'_>) {}

/// True when a test removed the post-link check (the mutation that brings
/// back "a fence issued twice"), to prove the race tests catch it.
#[cfg(feature = "testing")]
pub(crate) fn skip_post_link_check() -> bool {
    mutation() == Mutation::NoPostLinkCheck
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn skip_post_link_check() -> bool {
    false
}

/// A point where a test may slow this process down without stopping it (a
/// slow disk, a descheduled process): `RUNKEEP_FS_TEST_DELAY=<point>:<ms>`,
/// several separated by `,`, across processes. One enum, like [`Pause`]: a
/// call site cannot misspell its point, a test that names no point is
/// refused, and without the `testing` feature the names are not compiled
/// in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Delay {
    /// `append-before-recheck`: an append about to check its fence again.
    AppendBeforeRecheck,
    /// `claim-before-link`: a claim about to link its holding.
    ClaimBeforeLink,
    /// `claim-after-link`: a claim linked its holding and released the
    /// run lock, not yet handed the lease back.
    ClaimAfterLink,
    /// `release-before-link`: a release about to link its tombstone.
    ReleaseBeforeLink,
    /// `document-before-lock`: a document written to its sidecar, the run
    /// lock not yet taken.
    DocumentBeforeLock,
    /// `fsync`: every `fsync` of a file.
    Fsync,
}

#[cfg(feature = "testing")]
impl Delay {
    /// Every point, for [`Delay::asked`].
    const ALL: [Delay; 6] = [
        Delay::AppendBeforeRecheck,
        Delay::ClaimBeforeLink,
        Delay::ClaimAfterLink,
        Delay::ReleaseBeforeLink,
        Delay::DocumentBeforeLock,
        Delay::Fsync,
    ];

    /// Its name in `RUNKEEP_FS_TEST_DELAY`.
    fn name(self) -> &'static str {
        match self {
            Delay::AppendBeforeRecheck => "append-before-recheck",
            Delay::ClaimBeforeLink => "claim-before-link",
            Delay::ClaimAfterLink => "claim-after-link",
            Delay::ReleaseBeforeLink => "release-before-link",
            Delay::DocumentBeforeLock => "document-before-lock",
            Delay::Fsync => "fsync",
        }
    }

    /// The milliseconds `RUNKEEP_FS_TEST_DELAY` gives this point, if any.
    fn asked(self) -> Option<u64> {
        self.ms_in(&std::env::var("RUNKEEP_FS_TEST_DELAY").ok()?)
    }

    /// The milliseconds `spec` (`<point>:<ms>,…`) gives this point. A name
    /// that is no point, or a malformed item, panics (a misspelt delay would
    /// never slow anything down).
    fn ms_in(self, spec: &str) -> Option<u64> {
        let mut ms = None;
        for item in spec.split(',').filter(|i| !i.is_empty()) {
            let parsed = item.split_once(':').and_then(|(p, n)| {
                let point = Delay::ALL.into_iter().find(|d| d.name() == p)?;
                Some((point, n.parse::<u64>().ok()?))
            });
            match parsed {
                Some((point, n)) if point == self => ms = Some(n),
                Some(_) => {}
                None => panic!(
                    "RUNKEEP_FS_TEST_DELAY={spec:?}: {item:?} is not <point>:<ms> with a delay point of runkeep-fs (see testing_hooks::Delay)"
                ),
            }
        }
        ms
    }
}

/// Sleeps at `point` for the milliseconds a test gave in
/// `RUNKEEP_FS_TEST_DELAY`.
#[cfg(feature = "testing")]
pub(crate) fn delay(point: Delay) {
    if let Some(ms) = point.asked() {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn delay(_point: Delay) {}

/// A part of one store a test switches off ([`Switches`]). One enum, like
/// [`Mutation`]; without the `testing` feature nothing can switch a part
/// off and its name is not compiled in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Switch {
    /// `no-index`: the session index; every listing walks.
    Index,
    /// `no-inotify`: inotify; every watch polls.
    Inotify,
}

#[cfg(feature = "testing")]
impl Switch {
    fn bit(self) -> u8 {
        match self {
            Switch::Index => 1,
            Switch::Inotify => 2,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Switch::Index => "no-index",
            Switch::Inotify => "no-inotify",
        }
    }
}

/// The parts of one store a test switched off. Without the `testing`
/// feature it holds nothing and every part is on.
#[derive(Default, Debug)]
pub(crate) struct Switches {
    #[cfg(feature = "testing")]
    off: std::sync::atomic::AtomicU8,
}

impl Switches {
    /// Switches `part` off for the rest of the store's life.
    #[cfg(feature = "testing")]
    pub(crate) fn switch_off(&self, part: Switch) {
        self.off
            .fetch_or(part.bit(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a test switched `part` off.
    #[cfg(feature = "testing")]
    pub(crate) fn is_off(&self, part: Switch) -> bool {
        self.off.load(std::sync::atomic::Ordering::Relaxed) & part.bit() != 0
    }

    #[cfg(not(feature = "testing"))]
    #[inline(always)]
    pub(crate) fn is_off(&self, _part: Switch) -> bool {
        false
    }

    /// Why `part` cannot be used when a test switched it off (for the log
    /// line of the fallback); `None` when it is on.
    #[cfg(feature = "testing")]
    pub(crate) fn off_reason(&self, part: Switch) -> Option<String> {
        self.is_off(part).then(|| {
            format!(
                "{} switched this store's {part:?} off (test seam)",
                part.name()
            )
        })
    }

    #[cfg(not(feature = "testing"))]
    #[inline(always)]
    pub(crate) fn off_reason(&self, _part: Switch) -> Option<String> {
        None
    }
}

/// When a test asked for a short write at `point` on `path`: the error the
/// write fails with after landing part of its buffer (half of it).
#[cfg(feature = "testing")]
pub(crate) fn short_write(point: Point, path: &Path) -> Option<io::Error> {
    crate::testing::check_short_write(point, path)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn short_write(_point: Point, _path: &Path) -> Option<io::Error> {
    None
}

/// True when a test asked this process to stop at pause point `point` (so a
/// caller can put the point inside a write: part of it landed, the rest not).
#[cfg(feature = "testing")]
pub(crate) fn pause_requested(point: Pause) -> bool {
    Pause::asked() == Some(point)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn pause_requested(_point: Pause) -> bool {
    false
}

/// True when a test removed the `fsync` (`of` a directory or a file) of `path`
/// to prove the power-loss harness (`crates/runkeep-powerloss`) catches a
/// missing sync: `RUNKEEP_FS_TEST_MUTATION=no-dir-fsync` (every directory
/// sync), `no-file-fsync` (every file sync), or either with `:<name>`,
/// only for paths with a component equal to `<name>` or a file name
/// starting with `<name>.` (`no-dir-fsync:claims`,
/// `no-file-fsync:transcript.jsonl`).
#[cfg(feature = "testing")]
pub(crate) fn skip_sync(of: Synced, path: &Path) -> bool {
    let Mutation::NoSync { of: removed, only } = mutation() else {
        return false;
    };
    if removed != of {
        return false;
    }
    match only {
        None => true,
        Some(name) => {
            path.components().any(|c| c.as_os_str() == name.as_str())
                || path
                    .file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with(&format!("{name}.")))
        }
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn skip_sync(_of: Synced, _path: &Path) -> bool {
    false
}

/// Counts one checkpoint body parsed at `path` (tests ask how many
/// checkpoint files an answer read).
#[cfg(feature = "testing")]
pub(crate) fn count_checkpoint_read(path: &Path) {
    crate::testing::note_checkpoint_read(path);
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn count_checkpoint_read(_path: &Path) {}

/// Counts one listing of a checkpoints directory (`cps_dir`).
#[cfg(feature = "testing")]
pub(crate) fn count_checkpoint_listing(cps_dir: &Path) {
    crate::testing::note_checkpoint_dir_op(cps_dir, crate::testing::DirOp::Listing);
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn count_checkpoint_listing(_cps_dir: &Path) {}

/// Counts one `stat` of a checkpoints directory or of one of its entries.
#[cfg(feature = "testing")]
pub(crate) fn count_checkpoint_stat(cps_dir: &Path) {
    crate::testing::note_checkpoint_dir_op(cps_dir, crate::testing::DirOp::Stat);
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn count_checkpoint_stat(_cps_dir: &Path) {}

/// Counts what one transcript read cost (bytes read, lines parsed), keyed
/// by the transcript's path: the test that a page costs O(log n + page),
/// not the log's length, counts it (`transcript.rs`).
#[cfg(feature = "testing")]
pub(crate) fn note_transcript_read(path: &Path, cost: crate::transcript::ReadCost) {
    if !crate::testing::counting() {
        return;
    }
    let mut r = TRANSCRIPT_READS.lock().unwrap_or_else(|p| p.into_inner());
    match r.get_mut(path) {
        Some(c) => {
            c.bytes += cost.bytes;
            c.lines += cost.lines;
        }
        None => {
            r.insert(path.to_path_buf(), cost);
        }
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub(crate) fn note_transcript_read(_path: &Path, _cost: crate::transcript::ReadCost) {}

/// Per transcript path: what its reads have cost so far (a hash map: a
/// lookup per read must not grow with the runs a process has read).
#[cfg(feature = "testing")]
static TRANSCRIPT_READS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<std::path::PathBuf, crate::transcript::ReadCost>>,
> = std::sync::LazyLock::new(Default::default);

/// What the reads of the transcript at `path` have cost so far (by any
/// store of this process).
#[cfg(feature = "testing")]
#[cfg_attr(
    not(test),
    allow(dead_code, reason = "read by the integration tests, not by this crate")
)]
pub(crate) fn transcript_reads(path: &Path) -> crate::transcript::ReadCost {
    let r = TRANSCRIPT_READS.lock().unwrap_or_else(|p| p.into_inner());
    r.get(path).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{Mutation, Synced};

    #[cfg(feature = "testing")]
    #[test]
    fn every_delay_is_named_once_and_a_misspelt_one_is_refused() {
        use super::Delay;
        for d in Delay::ALL {
            let spec = format!("{}:7", d.name());
            assert_eq!(d.ms_in(&spec), Some(7), "{d:?}");
            let others = Delay::ALL.into_iter().filter(|o| *o != d);
            assert!(others.map(|o| o.ms_in(&spec)).all(|ms| ms.is_none()));
        }
        assert_eq!(
            Delay::Fsync.ms_in("claim-after-link:300,fsync:3000"),
            Some(3000)
        );
        // A typo must not run undelayed and pass for the wrong reason.
        let typo = std::panic::catch_unwind(|| Delay::Fsync.ms_in("claim-after-lnk:300"));
        assert!(typo.is_err(), "a misspelt delay point was accepted");
        let no_ms = std::panic::catch_unwind(|| Delay::Fsync.ms_in("fsync"));
        assert!(no_ms.is_err(), "a delay without milliseconds was accepted");
    }

    #[test]
    fn every_mutation_is_named_once_and_a_misspelt_one_is_refused() {
        assert_eq!(Mutation::parse("no-run-lock"), Mutation::NoRunLock);
        assert_eq!(Mutation::parse("none"), Mutation::None);
        assert_eq!(
            Mutation::parse("no-dir-fsync:claims"),
            Mutation::NoSync {
                of: Synced::Dir,
                only: Some("claims".into())
            }
        );
        assert_eq!(
            Mutation::parse("no-file-fsync"),
            Mutation::NoSync {
                of: Synced::File,
                only: None
            }
        );
        // A typo must not run the correct store and pass for the wrong reason.
        let typo = std::panic::catch_unwind(|| Mutation::parse("no-rum-lock"));
        assert!(typo.is_err(), "a misspelt mutation was accepted");
        let suffixed = std::panic::catch_unwind(|| Mutation::parse("no-run-lock:claims"));
        assert!(
            suffixed.is_err(),
            "a mutation that takes no name accepted one"
        );
    }
}
