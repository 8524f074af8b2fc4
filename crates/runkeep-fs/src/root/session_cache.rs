//! The state of a root ([`RootInner`]) and its session stores: opened on
//! first use and kept for the store's life, created (directories and all)
//! only by a write.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use runkeep::{Clock, Error, ListingScope, Result};

use super::layout::{self, SessionKey};
use crate::fs_store::FsStore;
use crate::options::{Attribution, Durability, FsOptions};

/// The state of one root, shared by its clones.
pub(crate) struct RootInner {
    pub(super) root: PathBuf,
    pub(super) durability: Durability,
    pub(super) read_only: bool,
    pub(super) clock: Arc<dyn Clock>,
    /// [`crate::FsRootOptions::prune_grace`], handed to every session.
    pub(super) prune_grace: std::time::Duration,
    sessions: Mutex<HashMap<SessionKey, FsStore>>,
    /// Rows read from sessions' listings (what a page cost; a test seam).
    pub(crate) fetched: Arc<AtomicU64>,
    /// Test seam: a pause before `claim_next`'s first claim.
    #[cfg(feature = "testing")]
    pub(crate) pause: Mutex<Option<ClaimPause>>,
}

/// Where `claim_next` pauses once (test seam): the candidate it is about
/// to claim is recorded, then it waits at the barrier.
#[cfg(feature = "testing")]
pub(crate) type ClaimPause = (
    Arc<tokio::sync::Barrier>,
    Arc<Mutex<Vec<runkeep::RunScope>>>,
);

impl RootInner {
    /// The state of a root opened (and checked) at `root`, with no session
    /// open yet.
    pub(super) fn new(
        root: PathBuf,
        durability: Durability,
        read_only: bool,
        clock: Arc<dyn Clock>,
        prune_grace: std::time::Duration,
    ) -> RootInner {
        RootInner {
            root,
            durability,
            read_only,
            clock,
            prune_grace,
            sessions: Mutex::new(HashMap::new()),
            fetched: Arc::new(AtomicU64::new(0)),
            #[cfg(feature = "testing")]
            pause: Mutex::new(None),
        }
    }

    /// Forgets the store of a session (its directory was tidied away).
    pub(super) fn forget(&self, k: &SessionKey) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(k);
    }

    pub(super) fn cached(&self, k: &SessionKey) -> Option<FsStore> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(k)
            .cloned()
    }

    pub(super) fn open_session(&self, k: &SessionKey) -> Result<FsStore> {
        let store = FsStore::open(
            layout::session_path(&self.root, k),
            FsOptions {
                attribution: Some(Attribution {
                    tenant_id: k.tenant_id.clone(),
                    project_id: k.project_id.clone(),
                    session_id: k.session_id.clone(),
                }),
                durability: self.durability,
                read_only: self.read_only,
                clock: Some(self.clock.clone()),
                prune_grace: self.prune_grace,
            },
        )?;
        let mut cache = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        Ok(cache.entry(k.clone()).or_insert(store).clone())
    }

    /// The store of a session that exists; `None` (and nothing created)
    /// when it does not.
    pub(super) fn existing(&self, k: &SessionKey) -> Result<Option<FsStore>> {
        if !layout::check_path(&self.root, k)? {
            return Ok(None);
        }
        if let Some(s) = self.cached(k) {
            return Ok(Some(s));
        }
        self.open_session(k).map(Some)
    }

    /// The store of a session, creating its directory (a call that may
    /// write). Refused on a read-only root before anything is created.
    pub(super) fn creating(&self, k: &SessionKey) -> Result<FsStore> {
        if self.read_only {
            return Err(Error::Unsupported {
                message: format!(
                    "the root at {} was opened read-only, so it refuses writes; open it without `read_only` to write",
                    self.root.display()
                ),
            });
        }
        if layout::check_path(&self.root, k)? {
            if let Some(s) = self.cached(k) {
                return Ok(s);
            }
        }
        let store = match self.open_session(k) {
            Ok(s) => s,
            // Another process tidied the directory away between the open's
            // create and its check (a refused call of its own): once more.
            Err(_) if !layout::check_path(&self.root, k)? => self.open_session(k)?,
            Err(e) => return Err(e),
        };
        // Created by the open: a link swapped in meanwhile is refused too.
        layout::check_path(&self.root, k)?;
        Ok(store)
    }

    pub(super) fn sessions_under(
        &self,
        scope: &ListingScope,
    ) -> Result<Vec<(SessionKey, FsStore)>> {
        let mut out = Vec::new();
        for k in layout::session_keys(&self.root, scope)? {
            match self.existing(&k) {
                Ok(Some(s)) => out.push((k, s)),
                // Vanished, or swapped for a link since it was listed.
                Ok(None) | Err(Error::Unsupported { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}
