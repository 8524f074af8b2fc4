//! The session stores of a root: opened on first use and kept for the
//! store's life, created (directories and all) only by a write.

use runkeep::{Error, ListingScope, Result};

use super::{RootInner, SessionKey};
use crate::options::{Attribution, FsOptions};
use crate::FsStore;

impl RootInner {
    pub(super) fn cached(&self, k: &SessionKey) -> Option<FsStore> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(k)
            .cloned()
    }

    pub(super) fn open_session(&self, k: &SessionKey) -> Result<FsStore> {
        let store = FsStore::open(
            self.session_path(k),
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
        if !self.check_path(k)? {
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
        if self.check_path(k)? {
            if let Some(s) = self.cached(k) {
                return Ok(s);
            }
        }
        let store = match self.open_session(k) {
            Ok(s) => s,
            // Another process tidied the directory away between the open's
            // create and its check (a refused call of its own): once more.
            Err(_) if !self.check_path(k)? => self.open_session(k)?,
            Err(e) => return Err(e),
        };
        // Created by the open: a link swapped in meanwhile is refused too.
        self.check_path(k)?;
        Ok(store)
    }

    pub(super) fn sessions_under(
        &self,
        scope: &ListingScope,
    ) -> Result<Vec<(SessionKey, FsStore)>> {
        let mut out = Vec::new();
        for k in self.session_keys(scope)? {
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
