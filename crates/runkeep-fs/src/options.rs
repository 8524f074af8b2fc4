//! What a directory store is opened with: [`FsOptions`], the
//! [`Attribution`] of its directory and the [`Durability`] of its writes.
//! Every module takes these from here, never from the crate root.

use std::sync::Arc;
use std::time::Duration;

use runkeep::{Clock, ProjectId, SessionId, TenantId};

/// The tenant, project and session a store's directory belongs to. The
/// directory layout records none of them; the store is told once, here.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Attribution {
    /// Tenant.
    pub tenant_id: TenantId,
    /// Project.
    pub project_id: ProjectId,
    /// Session.
    pub session_id: SessionId,
}

/// What a successful write survives.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Durability {
    /// Survives the writing process being killed at any instant: whole files
    /// are published by rename from a unique temporary name, holdings by
    /// hard link, log lines by one append; nothing is fsynced, so a power
    /// loss or kernel crash may lose (never tear) recent writes.
    #[default]
    ProcessCrash,
    /// Additionally survives power loss: every published file and log append
    /// is fsynced, and so is the directory whose entries changed, before the
    /// call returns. If an fsync fails, the store turns read-only (sticky
    /// failure) instead of pretending later writes are durable.
    PowerLoss,
}

/// Options of [`crate::FsStore::open`]. `FsOptions::default()` is the
/// machine clock, process-crash durability, read-write, no attribution and
/// a [`FsOptions::DEFAULT_PRUNE_GRACE`] prune grace period.
#[derive(Clone, Debug)]
pub struct FsOptions {
    /// The scope the directory belongs to. Required for listing; per-run
    /// operations on another scope are refused when it is set.
    pub attribution: Option<Attribution>,
    /// The durability level.
    pub durability: Durability,
    /// Open for reading only: nothing in the directory is created, linked
    /// or removed (no hard-link probe, no store directory created), and
    /// every write is refused with [`runkeep::Error::Unsupported`]. What read-only
    /// tools (`runkeep runs`, `show`, `events`) use.
    pub read_only: bool,
    /// The store's clock (contract v2): what claims, expiry, listing,
    /// `available_at`, `finished_at` and event timestamps are judged by when
    /// a call passes no instant. `None`: the machine clock. On a directory
    /// every process judges by its own store's clock; see
    /// `docs/design/directory/lifecycle.md`
    /// for what a skewed clock can still do.
    pub clock: Option<Arc<dyn Clock>>,
    /// How long a holding name in a run's `claims/` is kept, whatever its
    /// distance below the top, once it appeared (default
    /// [`FsOptions::DEFAULT_PRUNE_GRACE`]). Pruning after a claim or a
    /// release removes only names more than 32 below the top *and* older
    /// than this. It protects a claimer that links `top + 1` without
    /// checking afterwards (the reference implementation sharing the
    /// directory): a name it is still aiming at cannot be emptied under it
    /// while its read-to-link time stays below the grace period, so its
    /// link collides instead of issuing a fence a second time. A name's age
    /// is judged by its inode change time against that of the top holding
    /// (both stamped by the filesystem, never by [`FsOptions::clock`]). The
    /// cost: a run claimed or renewed faster than 33 fences per grace period
    /// keeps every name of the last grace period (see
    /// `docs/design/directory/lease-and-fencing.md`). `Duration::ZERO` turns
    /// it off (pruning by count alone); only do that when no other
    /// implementation claims runs in this directory.
    pub prune_grace: Duration,
}

impl FsOptions {
    /// The default [`FsOptions::prune_grace`]: 5 s. A claimer's read of
    /// `claims/` to its link takes well under a millisecond on a local disk
    /// and tens of milliseconds on a slow or contended one; 5 s covers a
    /// descheduled or briefly paused process too, and still lets a run that
    /// is renewed every few seconds keep only its 33-name window.
    pub const DEFAULT_PRUNE_GRACE: Duration = Duration::from_secs(5);
}

impl Default for FsOptions {
    fn default() -> Self {
        Self {
            attribution: None,
            durability: Durability::default(),
            read_only: false,
            clock: None,
            prune_grace: Self::DEFAULT_PRUNE_GRACE,
        }
    }
}
