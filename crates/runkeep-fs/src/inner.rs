//! The state of one directory store ([`Inner`]) and the guards every
//! operation passes before it touches a run: the scope the store is bound
//! to, a run path that never leads out of the store (no symbolic link is
//! followed), a store opened read-only, and a store that turned
//! sticky-failed after an fsync failed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use runkeep::listing::RowKey;
use runkeep::{Clock, Error, ListOrder, Result, RunScope, SystemClock, Timestamp};

use crate::index::{Found, SessionIndex, Summary};
use crate::options::{Attribution, Durability, FsOptions};
use crate::sys::{self, Ctx};
use crate::testing_hooks::{Switch, Switches};

/// The state of one directory store, shared by its clones.
pub(crate) struct Inner {
    pub(crate) base: PathBuf,
    pub(crate) attribution: Option<Attribution>,
    pub(crate) durability: Durability,
    pub(crate) read_only: bool,
    pub(crate) tmpfile: AtomicBool,
    pub(crate) poisoned: Mutex<Option<String>>,
    pub(crate) clock: Arc<dyn Clock>,
    /// [`crate::FsOptions::prune_grace`].
    pub(crate) prune_grace: std::time::Duration,
    /// The session index the listing and `claim_next` consult.
    pub(crate) index: SessionIndex,
    /// The parts of this store a test switched off (feature `testing`;
    /// empty and always on without it).
    pub(crate) switches: Switches,
}

impl Inner {
    /// The state of a store opened on `base` (absolute) with `options`;
    /// `tmpfile`: whether holdings are published through `O_TMPFILE` (what
    /// the probe at open found). Touches nothing.
    pub(crate) fn new(base: PathBuf, options: FsOptions, tmpfile: bool) -> Inner {
        Inner {
            base,
            attribution: options.attribution,
            durability: options.durability,
            read_only: options.read_only,
            tmpfile: AtomicBool::new(tmpfile),
            poisoned: Mutex::new(None),
            clock: options.clock.unwrap_or_else(|| Arc::new(SystemClock)),
            prune_grace: options.prune_grace,
            index: SessionIndex::default(),
            switches: Switches::default(),
        }
    }

    pub(crate) fn run_dir(&self, scope: &RunScope) -> PathBuf {
        match &scope.parent_run_id {
            Some(parent) => self
                .base
                .join(parent.as_str())
                .join("children")
                .join(scope.run_id.as_str()),
            None => self.base.join(scope.run_id.as_str()),
        }
    }

    pub(crate) fn base(&self) -> &Path {
        &self.base
    }

    /// The store's clock now.
    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// True when `session` (a scope naming a session) is this store's
    /// (a store opened without attribution takes any).
    pub(crate) fn is_bound_to(&self, session: &runkeep::ListingScope) -> bool {
        self.attribution.as_ref().is_none_or(|a| {
            a.tenant_id == *session.tenant_id()
                && session.project_id() == Some(&a.project_id)
                && session.session_id() == Some(&a.session_id)
        })
    }

    pub(crate) fn attribution(&self) -> Option<&Attribution> {
        self.attribution.as_ref()
    }

    pub(crate) fn tmpfile_enabled(&self) -> bool {
        self.tmpfile.load(Ordering::Relaxed)
    }

    pub(crate) fn disable_tmpfile(&self) {
        self.tmpfile.store(false, Ordering::Relaxed);
    }

    /// Refuses a scope this store is not bound to, and a run whose
    /// directory would lead out of the store.
    pub(crate) fn check_scope(&self, scope: &RunScope) -> Result<()> {
        self.check_inside(scope)?;
        let Some(a) = &self.attribution else {
            return Ok(());
        };
        if a.tenant_id != scope.tenant_id
            || a.project_id != scope.project_id
            || a.session_id != scope.session_id
        {
            return Err(Error::invalid(format!(
                "this store is bound to {}/{}/{} (directory {}), but the run {} belongs to {}/{}/{}; open the store on that session's runs/ directory",
                a.tenant_id,
                a.project_id,
                a.session_id,
                self.base.display(),
                scope.run_id,
                scope.tenant_id,
                scope.project_id,
                scope.session_id
            )));
        }
        Ok(())
    }

    /// Refuses a run whose directory, or a directory on the way to it
    /// (`<parent>`, `<parent>/children`), is a symbolic link: a run never
    /// reads or writes outside the store's directory. The
    /// listing and the doctor skip such entries for the same reason.
    fn check_inside(&self, scope: &RunScope) -> Result<()> {
        let mut path = self.base.clone();
        let parts: Vec<&str> = match &scope.parent_run_id {
            Some(p) => vec![p.as_str(), "children", scope.run_id.as_str()],
            None => vec![scope.run_id.as_str()],
        };
        for part in parts {
            path.push(part);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(sys::symlink_refusal(
                        "run",
                        scope.run_id.as_str(),
                        &path,
                        "store",
                        "the run's directory",
                    ));
                }
                Ok(_) => {}
                Err(e) if sys::is_not_found(&e) => return Ok(()),
                Err(e) => {
                    return Err(Ctx::new(scope, "open the run").io(
                        "inspect the run directory",
                        &path,
                        e,
                    ))
                }
            }
        }
        Ok(())
    }

    /// Refuses writes after a failed fsync (sticky failure).
    /// Refuses any write on a store opened read-only, before anything else
    /// is looked at.
    pub(crate) fn refuse_read_only(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::Unsupported {
                message: format!(
                    "the store at {} was opened read-only, so it refuses writes; open it without `read_only` to write",
                    self.base.display()
                ),
            });
        }
        Ok(())
    }

    pub(crate) fn check_poison(&self) -> Result<()> {
        self.refuse_read_only()?;
        let p = self.poisoned.lock().unwrap_or_else(|p| p.into_inner());
        match &*p {
            Some(why) => Err(Error::Backend {
                message: format!(
                    "the store at {} refuses writes since an fsync failed ({why}); what was written before it may not be durable. Check the disk, then open the store again",
                    self.base.display()
                ),
                source: None,
            }),
            None => Ok(()),
        }
    }

    /// Passes an error through, turning the store sticky-failed when it is a
    /// failed fsync under [`Durability::PowerLoss`].
    pub(crate) fn note(&self, e: Error) -> Error {
        if self.durability == Durability::PowerLoss {
            let failed = match &e {
                Error::Backend {
                    source: Some(s), ..
                } => sys::is_sync_failure(s.as_ref()),
                _ => false,
            };
            if failed {
                let mut p = self.poisoned.lock().unwrap_or_else(|p| p.into_inner());
                if p.is_none() {
                    *p = Some(e.to_string());
                }
            }
        }
        e
    }

    /// [`SessionIndex::candidates`] on this store's index (`None`: walk).
    pub(crate) fn index_candidates(
        &self,
        order: ListOrder,
        after: Option<&RowKey>,
        want: usize,
        keep: &dyn Fn(&Summary) -> bool,
    ) -> Option<Vec<Found>> {
        if self.switches.is_off(Switch::Index) {
            return None;
        }
        self.index.candidates(&self.base, order, after, want, keep)
    }

    /// [`Self::index_candidates`] in `claim_next`'s order (priority first),
    /// dropping the keys `skip` says are at their limit without visiting
    /// their entries.
    pub(crate) fn index_claim_candidates_skipping(
        &self,
        order: ListOrder,
        after: Option<&RowKey>,
        want: usize,
        now: Timestamp,
        keep: &dyn Fn(&Summary) -> bool,
        skip: &dyn Fn(&str, u32, u32) -> bool,
    ) -> Option<Vec<Found>> {
        if self.switches.is_off(Switch::Index) {
            return None;
        }
        self.index
            .claim_candidates_skipping(&self.base, order, after, want, now, keep, skip)
    }

    /// [`SessionIndex::reconcile`] on this store's index.
    pub(crate) fn index_reconcile(&self, found: &Found, summary: Option<Summary>) {
        self.index.reconcile(found, summary);
    }
}
