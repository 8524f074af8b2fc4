//! What a directory store is opened with: [`FsOptions`], the
//! [`Attribution`] of its directory and the [`Durability`] of its writes.
//! Every module takes these from here, never from the crate root.

use std::sync::Arc;

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

/// Options of [`crate::FsStore::open`].
#[derive(Clone, Debug, Default)]
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
}
