//! Where a root keeps what: telling a root from a session directory (and
//! refusing the wrong open), the root marker, the path of a session, and
//! the walk that finds the sessions under a listing scope (symbolic links
//! are never followed: they are reported, not entered).

use std::path::{Path, PathBuf};

use runkeep::{Error, ListingScope, ProjectId, Result, RunScope, SessionId, TenantId};
use serde_json::Value;

use crate::options::Durability;
use crate::sys::{self, Ctx};

/// The file that marks a directory as a root of many sessions.
pub const ROOT_MARKER: &str = ".runkeep-root.json";
/// The root layout version this crate writes and reads.
pub const ROOT_LAYOUT_VERSION: u64 = 1;
/// The directory inside a session directory that [`crate::FsStore::open`]
/// takes (the reference's `baseDir`).
pub const SESSION_RUNS_DIR: &str = "runs";

/// A session under a root: its directory is
/// `<tenant>/<project>/<session>/`. Ordered tenant, project, session (the
/// order sessions are listed in).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub(super) struct SessionKey {
    pub(super) tenant_id: TenantId,
    pub(super) project_id: ProjectId,
    pub(super) session_id: SessionId,
}

/// Opens the root directory `root`: its absolute path once it exists
/// (created unless `read_only`) and carries the marker (written unless
/// `read_only`). Refuses a file, a session directory or a session's
/// `runs/`, a missing root opened read-only, and a newer layout.
pub(super) fn open_root(root: &Path, durability: Durability, read_only: bool) -> Result<PathBuf> {
    let ctx = Ctx::store("open");
    let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    match std::fs::metadata(&root) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::invalid(format!(
                "{} is not a directory; a root of many sessions is a directory",
                root.display()
            )))
        }
        Err(e) if sys::is_not_found(&e) && read_only => {
            return Err(Error::NotFound {
                what: format!(
                    "a root of many sessions at {} (opened read-only, so it is not created; the first write creates it)",
                    root.display()
                ),
            })
        }
        Err(e) if sys::is_not_found(&e) => sys::ensure_dir(&root, durability)
            .map_err(|e| ctx.io("create the root directory", &root, e))?,
        Err(e) => return Err(ctx.io("open the root directory", &root, e)),
    }
    if !read_marker(&root)? {
        refuse_session_as_root(&root)?;
        if read_only {
            return Err(Error::invalid(format!(
                "{} is not a runkeep root (no {ROOT_MARKER}); opened read-only, it is not marked: open it once for writing, or check the path",
                root.display()
            )));
        }
        let body = sys::record_json(&marker_body());
        sys::write_atomic(&root, ROOT_MARKER, &body, durability)
            .map_err(|e| ctx.io("write the root marker in", &root, e))?;
    }
    Ok(root)
}

/// What a root directory holds, besides what a root may hold.
enum Shape {
    /// Empty, or only what a root holds.
    Root,
    /// It holds `runs/`: a session directory.
    SessionDir,
    /// It holds `run_*` directories or `index.json`: a session's `runs/`.
    RunsDir,
}

fn shape_of(dir: &Path) -> Result<Shape> {
    let ctx = Ctx::store("open");
    let items = sys::list_dir(dir)
        .map_err(|e| ctx.io("list", dir, e))?
        .unwrap_or_default();
    if items
        .iter()
        .any(|i| i.name == SESSION_RUNS_DIR && i.file_type.is_dir())
    {
        return Ok(Shape::SessionDir);
    }
    if items.iter().any(|i| {
        (crate::listing::is_listed_run_name(&i.name) && i.file_type.is_dir())
            || i.name == "index.json"
    }) {
        return Ok(Shape::RunsDir);
    }
    Ok(Shape::Root)
}

/// Refuses a directory that is a session, not a root, naming the open to
/// use instead.
fn refuse_session_as_root(dir: &Path) -> Result<()> {
    match shape_of(dir)? {
        Shape::Root => Ok(()),
        Shape::SessionDir => Err(Error::invalid(format!(
            "{} is one session's directory (it holds {SESSION_RUNS_DIR}/), not a root of many sessions; open {}/{SESSION_RUNS_DIR} as one session (FsStore::open; CLI: --store fs:{}/{SESSION_RUNS_DIR}), or give the root another, empty directory",
            dir.display(),
            dir.display(),
            dir.display()
        ))),
        Shape::RunsDir => Err(Error::invalid(format!(
            "{} is one session's runs/ directory (it holds run_* directories or index.json), not a root of many sessions; open it as one session (FsStore::open; CLI: --store fs:{}), or give the root another, empty directory",
            dir.display(),
            dir.display()
        ))),
    }
}

/// Refuses to open a root of many sessions as one session's `runs/`
/// directory ([`crate::FsStore::open`] calls it): its runs would be written
/// beside the tenants, outside every session.
pub(crate) fn refuse_root_as_session(dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dir.join(ROOT_MARKER)) {
        Ok(_) => Err(Error::invalid(format!(
            "{} is a root of many sessions ({ROOT_MARKER}), not one session's runs/ directory; open it with FsRootStore::open (CLI: --store root:{}), or open one session's directory {}/<tenant>/<project>/<session>/{SESSION_RUNS_DIR}",
            dir.display(),
            dir.display(),
            dir.display()
        ))),
        Err(_) => Ok(()),
    }
}

fn marker_body() -> Value {
    serde_json::json!({
        "runkeepRoot": ROOT_LAYOUT_VERSION,
        "layout": "<tenant>/<project>/<session>/runs",
    })
}

/// Reads the marker: `Ok(false)` when absent; a newer layout is refused.
fn read_marker(root: &Path) -> Result<bool> {
    let ctx = Ctx::store("open");
    let path = root.join(ROOT_MARKER);
    let Some(bytes) = sys::read_opt(&path).map_err(|e| ctx.io("read the root marker", &path, e))?
    else {
        return Ok(false);
    };
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|_| ctx.corrupted(&path, "the root marker is not valid JSON"))?;
    match v.get("runkeepRoot").and_then(Value::as_u64) {
        Some(n) if n <= ROOT_LAYOUT_VERSION => Ok(true),
        Some(n) => Err(Error::Unsupported {
            message: format!(
                "{} declares root layout version {n}, newer than version {ROOT_LAYOUT_VERSION} this runkeep knows; upgrade runkeep",
                path.display()
            ),
        }),
        None => Err(ctx.corrupted(&path, "the root marker has no runkeepRoot version")),
    }
}

/// The session a run belongs to.
pub(super) fn key_of(scope: &RunScope) -> SessionKey {
    SessionKey {
        tenant_id: scope.tenant_id.clone(),
        project_id: scope.project_id.clone(),
        session_id: scope.session_id.clone(),
    }
}

/// The listing scope of one session.
pub(super) fn session_scope(k: &SessionKey) -> ListingScope {
    ListingScope::session(
        k.tenant_id.clone(),
        k.project_id.clone(),
        k.session_id.clone(),
    )
}

/// The `runs/` directory of a session (pure).
pub(super) fn session_path(root: &Path, k: &SessionKey) -> PathBuf {
    root.join(k.tenant_id.as_str())
        .join(k.project_id.as_str())
        .join(k.session_id.as_str())
        .join(SESSION_RUNS_DIR)
}

/// Refuses a session whose tenant, project, session or `runs`
/// directory is a symbolic link (or not a directory). `Ok(false)` when
/// the session has no `runs/` directory yet.
pub(super) fn check_path(root: &Path, k: &SessionKey) -> Result<bool> {
    let mut path = root.to_path_buf();
    for part in [
        k.tenant_id.as_str(),
        k.project_id.as_str(),
        k.session_id.as_str(),
        SESSION_RUNS_DIR,
    ] {
        path.push(part);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(sys::symlink_refusal(
                    "session",
                    &format!("{}/{}/{}", k.tenant_id, k.project_id, k.session_id),
                    &path,
                    "root",
                    "the directory",
                ));
            }
            Ok(m) if !m.is_dir() => {
                return Err(Error::invalid(format!(
                    "session {}/{}/{}: {} is not a directory; a root holds <tenant>/<project>/<session>/{SESSION_RUNS_DIR}/ directories only",
                    k.tenant_id,
                    k.project_id,
                    k.session_id,
                    path.display()
                )))
            }
            Ok(_) => {}
            Err(e) if sys::is_not_found(&e) => return Ok(false),
            Err(e) => {
                return Err(Ctx::store("open a session").io(
                    "inspect the session directory",
                    &path,
                    e,
                ))
            }
        }
    }
    Ok(true)
}

/// Directory names under `dir` that are ids, skipping symlinks and
/// anything else that is not a plain directory.
fn child_ids<T>(dir: &Path, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>> {
    let ctx = Ctx::store("list sessions");
    let items = sys::list_dir(dir)
        .map_err(|e| ctx.io("list", dir, e))?
        .unwrap_or_default();
    Ok(items
        .into_iter()
        .filter(|i| i.file_type.is_dir())
        .filter_map(|i| parse(&i.name))
        .collect())
}

/// The existing sessions under a prefix, in (project, session) order.
pub(super) fn session_keys(root: &Path, scope: &ListingScope) -> Result<Vec<SessionKey>> {
    let t = scope.tenant_id().clone();
    let tenant_dir = root.join(t.as_str());
    if std::fs::symlink_metadata(&tenant_dir).is_ok_and(|m| !m.is_dir()) {
        return Ok(Vec::new());
    }
    let projects = match scope.project_id() {
        Some(p) => vec![p.clone()],
        None => child_ids(&tenant_dir, |n| ProjectId::new(n).ok())?,
    };
    let mut out = Vec::new();
    for p in projects {
        let project_dir = tenant_dir.join(p.as_str());
        if std::fs::symlink_metadata(&project_dir).is_ok_and(|m| !m.is_dir()) {
            continue;
        }
        let sessions = match scope.session_id() {
            Some(s) => vec![s.clone()],
            None => child_ids(&project_dir, |n| SessionId::new(n).ok())?,
        };
        for s in sessions {
            let runs = project_dir.join(s.as_str()).join(SESSION_RUNS_DIR);
            let session_dir = project_dir.join(s.as_str());
            let plain = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
            if plain(&session_dir) && plain(&runs) {
                out.push(SessionKey {
                    tenant_id: t.clone(),
                    project_id: p.clone(),
                    session_id: s,
                });
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Tenant, project, session and `runs` entries under a prefix that are
/// symbolic links (what listings skip).
pub(super) fn links_under(root: &Path, scope: &ListingScope) -> Result<Vec<PathBuf>> {
    let ctx = Ctx::store("diagnose");
    let is_link = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    let links = |dir: &Path| -> Result<Vec<PathBuf>> {
        Ok(sys::list_dir(dir)
            .map_err(|e| ctx.io("list", dir, e))?
            .unwrap_or_default()
            .into_iter()
            .filter(|i| i.file_type.is_symlink() && !i.name.starts_with('.'))
            .map(|i| dir.join(i.name))
            .collect())
    };
    let mut out = Vec::new();
    let tenant_dir = root.join(scope.tenant_id().as_str());
    if is_link(&tenant_dir) {
        return Ok(vec![tenant_dir]);
    }
    let projects: Vec<PathBuf> = match scope.project_id() {
        Some(p) => vec![tenant_dir.join(p.as_str())],
        None => {
            out.extend(links(&tenant_dir)?);
            child_ids(&tenant_dir, |n| Some(tenant_dir.join(n)))?
        }
    };
    for project_dir in projects {
        if is_link(&project_dir) {
            out.push(project_dir);
            continue;
        }
        let sessions: Vec<PathBuf> = match scope.session_id() {
            Some(s) => vec![project_dir.join(s.as_str())],
            None => {
                out.extend(links(&project_dir)?);
                child_ids(&project_dir, |n| Some(project_dir.join(n)))?
            }
        };
        for session_dir in sessions {
            let runs = session_dir.join(SESSION_RUNS_DIR);
            if is_link(&session_dir) {
                out.push(session_dir);
            } else if is_link(&runs) {
                out.push(runs);
            }
        }
    }
    Ok(out)
}
