//! A session's recurring schedules
//! ([`runkeep::scheduling::schedule`]): one file per schedule,
//! `<runs>/.runkeep/schedules/<name>.json`, each changed under its own
//! kernel-released lock `<name>.lock` beside it (flock, exclusive): a put
//! and a cursor's compare-and-set read the file, apply the core rule
//! ([`schedule::on_put`], [`schedule::advance`]) and replace the file
//! atomically (sidecar + rename) before the lock is let go, so two
//! processes advancing one cursor from one value cannot both win. Reads
//! take no lock (a rename is atomic). `.runkeep` is no run id, so the
//! listing and the doctor never take the directory for a run.
//!
//! The file carries the schedule's session, so a store opened without
//! attribution still lists each schedule with the session it was put in.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use runkeep::scheduling::schedule::{self, Schedule, ScheduleEntry};
use runkeep::{Error, ListingScope, ProjectId, Result, SessionId, TenantId, Timestamp};
use rustix::fs::{flock, FlockOperation};
use serde::{Deserialize, Serialize};

use crate::inner::Inner;
use crate::lock::META_DIR;
use crate::sys::{self, Ctx};

/// The directory of schedules inside [`META_DIR`].
pub(crate) const SCHEDULES_DIR: &str = "schedules";

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    tenant_id: TenantId,
    project_id: ProjectId,
    session_id: SessionId,
    schedule: Schedule,
}

fn dir(inner: &Inner) -> PathBuf {
    inner.base().join(META_DIR).join(SCHEDULES_DIR)
}

/// Refuses a session this store is not bound to.
fn check_session(inner: &Inner, session: &ListingScope) -> Result<ListingScope> {
    let session = schedule::session_of(session)?;
    if let Some(a) = inner.attribution() {
        let mine = ListingScope::session(
            a.tenant_id.clone(),
            a.project_id.clone(),
            a.session_id.clone(),
        );
        if mine != session {
            return Err(Error::invalid(format!(
                "this store is bound to {mine} (directory {}), but the schedule belongs to {session}; open the store on that session's runs/ directory",
                inner.base().display()
            )));
        }
    }
    Ok(session)
}

fn ctx() -> Ctx {
    Ctx::store("schedule")
}

/// The schedule's lock, held until dropped.
fn lock(inner: &Inner, name: &str) -> Result<File> {
    let d = dir(inner);
    sys::ensure_dir(&d, inner.durability)
        .map_err(|e| ctx().io("create the schedules directory", &d, e))?;
    let path = d.join(format!("{name}.lock"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(sys::FILE_MODE)
        .custom_flags(rustix::fs::OFlags::CLOEXEC.bits() as i32)
        .open(&path)
        .map_err(|e| ctx().io("open the schedule lock", &path, e))?;
    loop {
        match flock(&file, FlockOperation::LockExclusive) {
            Ok(()) => return Ok(file),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                return Err(Error::Unsupported {
                    message: format!(
                        "cannot lock {} ({e}); schedules need advisory locks (flock): move the store to a local filesystem",
                        path.display()
                    ),
                })
            }
        }
    }
}

fn read(path: &Path) -> Result<Option<Stored>> {
    match sys::read_opt(path).map_err(|e| ctx().io("read the schedule", path, e))? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ctx().corrupted(path, e)),
    }
}

fn write(inner: &Inner, stored: &Stored) -> Result<()> {
    let d = dir(inner);
    let name = format!("{}.json", stored.schedule.name);
    let bytes = serde_json::to_vec(stored).map_err(|e| Error::invalid(e.to_string()))?;
    sys::write_atomic(&d, &name, &bytes, inner.durability)
        .map_err(|e| inner.note(ctx().io("write the schedule", &d.join(&name), e)))
}

fn file(inner: &Inner, name: &str) -> PathBuf {
    dir(inner).join(format!("{name}.json"))
}

pub(crate) fn put(inner: &Inner, session: &ListingScope, incoming: &Schedule) -> Result<Schedule> {
    let session = check_session(inner, session)?;
    incoming.validate()?;
    inner.check_poison()?;
    let _lock = lock(inner, &incoming.name)?;
    let existing = read(&file(inner, &incoming.name))?;
    let stored = schedule::on_put(
        existing.as_ref().map(|s| &s.schedule),
        incoming,
        inner.now(),
    )?;
    write(
        inner,
        &Stored {
            tenant_id: session.tenant_id().clone(),
            project_id: session.project_id().expect("a session").clone(),
            session_id: session.session_id().expect("a session").clone(),
            schedule: stored.clone(),
        },
    )?;
    Ok(stored)
}

pub(crate) fn get(inner: &Inner, session: &ListingScope, name: &str) -> Result<Option<Schedule>> {
    check_session(inner, session)?;
    schedule::check_name(name)?;
    Ok(read(&file(inner, name))?.map(|s| s.schedule))
}

pub(crate) fn list(inner: &Inner, scope: &ListingScope) -> Result<Vec<ScheduleEntry>> {
    let d = dir(inner);
    let Some(items) = sys::list_dir(&d).map_err(|e| ctx().io("list the schedules", &d, e))? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for item in items {
        let Some(name) = item.name.strip_suffix(".json") else {
            continue;
        };
        if schedule::check_name(name).is_err() {
            continue;
        }
        let Some(s) = read(&d.join(&item.name))? else {
            continue;
        };
        let session = ListingScope::session(s.tenant_id, s.project_id, s.session_id);
        if schedule::is_under(&session, scope) {
            out.push(ScheduleEntry {
                session,
                schedule: s.schedule,
            });
        }
    }
    schedule::sort_entries(&mut out);
    Ok(out)
}

pub(crate) fn delete(inner: &Inner, session: &ListingScope, name: &str) -> Result<bool> {
    check_session(inner, session)?;
    schedule::check_name(name)?;
    inner.check_poison()?;
    let path = file(inner, name);
    if !path.exists() {
        return Ok(false);
    }
    let _lock = lock(inner, name)?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if sys::is_not_found(&e) => Ok(false),
        Err(e) => Err(ctx().io("delete the schedule", &path, e)),
    }
}

pub(crate) fn advance(
    inner: &Inner,
    session: &ListingScope,
    name: &str,
    from: Option<Timestamp>,
    to: Timestamp,
) -> Result<bool> {
    let session = check_session(inner, session)?;
    schedule::check_name(name)?;
    inner.check_poison()?;
    let _lock = lock(inner, name)?;
    let mut stored =
        read(&file(inner, name))?.ok_or_else(|| schedule::not_found(&session, name))?;
    if !schedule::advance(&mut stored.schedule, from, to)? {
        return Ok(false);
    }
    write(inner, &stored)?;
    Ok(true)
}
