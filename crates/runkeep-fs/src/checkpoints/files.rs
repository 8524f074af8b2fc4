//! Checkpoint files: `checkpoints/<id>.json`, compact JSON stamped
//! `schemaVersion: 1`; their names, encoding, reads, the directory's
//! entries, and the sidecar a new checkpoint is written to before it is
//! published. Below the digest ([`super::digest`]) and the operations.

use std::io;
use std::path::Path;

use runkeep::{Checkpoint, CheckpointId, Result};
use serde_json::{Map, Value};

use crate::lock::META_DIR;
use crate::options::Durability;
use crate::sys::{self, Ctx};
use crate::testing_hooks::{self, Pause};

/// The checkpoints directory of a run.
pub(crate) const CHECKPOINTS_DIR: &str = "checkpoints";
/// The record schema version this build writes and reads.
pub(crate) const SCHEMA_VERSION: u64 = 1;

/// The file name of a checkpoint.
pub(crate) fn file_name(id: &CheckpointId) -> String {
    format!("{id}.json")
}

/// Checks a record's `schemaVersion` stamp: absent reads as 1 (records
/// predating the stamp); a non-integer or a version above this build's is
/// refused (a partial read written back would destroy fields).
pub(crate) fn check_schema(obj: &Map<String, Value>, path: &Path, ctx: &Ctx) -> Result<()> {
    match obj.get("schemaVersion") {
        None => Ok(()),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=SCHEMA_VERSION).contains(&n) => Ok(()),
            Some(n) if n > SCHEMA_VERSION => Err(ctx.corrupted(
                path,
                format!(
                    "record written at schema version {n}; this build reads up to {SCHEMA_VERSION}. Refusing to read it (fields this build does not know would be lost if it were written back); upgrade runkeep to read this data"
                ),
            )),
            _ => Err(ctx.corrupted(
                path,
                format!("record has a malformed schemaVersion {v}; expected a whole number ≥ 1"),
            )),
        },
    }
}

/// The on-disk bytes of a checkpoint.
pub(crate) fn encode(cp: &Checkpoint) -> Vec<u8> {
    let mut m = cp.to_json();
    m.insert("schemaVersion".into(), Value::from(SCHEMA_VERSION));
    sys::record_json(&Value::Object(m))
}

/// Parses a checkpoint file.
pub(crate) fn decode(bytes: &[u8], path: &Path, ctx: &Ctx) -> Result<Checkpoint> {
    testing_hooks::count_checkpoint_read(path);
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ctx.corrupted(path, format!("not a usable checkpoint: invalid JSON ({e})")))?;
    let Value::Object(m) = v else {
        return Err(ctx.corrupted(path, "not a usable checkpoint: not a JSON object"));
    };
    check_schema(&m, path, ctx)?;
    let cp = Checkpoint::from_json(m)
        .map_err(|e| ctx.corrupted(path, format!("not a usable checkpoint: {e}")))?;
    let expected = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if expected != file_name(&cp.id) {
        return Err(ctx.corrupted(
            path,
            format!(
                "not a usable checkpoint: the file holds checkpoint {}",
                cp.id
            ),
        ));
    }
    Ok(cp)
}

/// Reads one checkpoint; `None` when absent.
pub(crate) fn read_one(run_dir: &Path, id: &CheckpointId, ctx: &Ctx) -> Result<Option<Checkpoint>> {
    let path = run_dir.join(CHECKPOINTS_DIR).join(file_name(id));
    match sys::read_opt(&path) {
        Ok(None) => Ok(None),
        Ok(Some(bytes)) => decode(&bytes, &path, ctx).map(Some),
        Err(e) if e.raw_os_error() == Some(sys::errno::ISDIR) => {
            Err(ctx.corrupted(&path, "not a usable checkpoint: not a regular file"))
        }
        Err(e) => Err(ctx.io("read the checkpoint", &path, e)),
    }
}

/// One `*.json` entry of a checkpoints directory.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) ino: u64,
    pub(crate) regular: bool,
}

/// Lists the record entries (`*.json`, not hidden) of a checkpoints
/// directory with their inode numbers; `None` when it does not exist.
pub(crate) fn entries(cps_dir: &Path) -> io::Result<Option<Vec<Entry>>> {
    testing_hooks::count_checkpoint_listing(cps_dir);
    let Some(items) = sys::list_dir(cps_dir)? else {
        return Ok(None);
    };
    let mut out: Vec<Entry> = items
        .into_iter()
        .filter(|i| !i.name.starts_with('.') && i.name.ends_with(".json"))
        .map(|i| Entry {
            regular: i.file_type.is_file(),
            ino: i.ino,
            name: i.name,
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(out))
}

/// Reads every checkpoint of a run, in the total order. Never silently
/// short: a damaged entry fails the call. A file that vanishes between the
/// directory read and its own read was deleted meanwhile and is left out
/// (a concurrent delete or prune never fails a read).
pub(crate) fn read_all(run_dir: &Path, ctx: &Ctx) -> Result<Vec<Checkpoint>> {
    let dir = run_dir.join(CHECKPOINTS_DIR);
    let Some(list) = entries(&dir).map_err(|e| ctx.io("list the checkpoints", &dir, e))? else {
        return Ok(Vec::new());
    };
    let mut cps = read_entries(&dir, &list, ctx)?;
    runkeep::checkpoint::sort_checkpoints(&mut cps);
    Ok(cps)
}

/// Reads the listed entries, leaving out those deleted meanwhile.
pub(super) fn read_entries(dir: &Path, list: &[Entry], ctx: &Ctx) -> Result<Vec<Checkpoint>> {
    testing_hooks::pause_once(Pause::CheckpointsBeforeRead);
    let mut out = Vec::with_capacity(list.len());
    for e in list {
        let path = dir.join(&e.name);
        if !e.regular {
            return Err(ctx.corrupted(&path, "not a usable checkpoint: not a regular file"));
        }
        let stem = &e.name[..e.name.len() - ".json".len()];
        if CheckpointId::new(stem).is_err() {
            return Err(ctx.corrupted(
                &path,
                "not a usable checkpoint: its name is not a checkpoint id ([A-Za-z0-9_-], starting with a letter or digit)",
            ));
        }
        match sys::read_opt(&path) {
            Ok(Some(bytes)) => out.push(decode(&bytes, &path, ctx)?),
            // Listed, then gone: a concurrent delete or prune removed it
            // (a replacement is a rename, which never leaves the name
            // missing). It is not part of the run any more, so the answer is
            // the run after that delete, not a short list. Re-reading the
            // whole directory instead could starve under steady churn.
            Ok(None) => continue,
            Err(e) if e.raw_os_error() == Some(sys::errno::ISDIR) => {
                return Err(ctx.corrupted(&path, "not a usable checkpoint: not a regular file"))
            }
            Err(e) => return Err(ctx.io("read the checkpoint", &path, e)),
        }
    }
    Ok(out)
}

/// Writes a checkpoint's bytes to a sidecar in the run's meta directory
/// (`.runkeep/`, same filesystem as `checkpoints/`, ignored by the
/// reference), so that creating it leaves the checkpoints directory — and
/// therefore its stamp — untouched until the publishing rename. A leftover
/// of a crash ends in `.tmp` and is reported by the doctor like any other.
pub(crate) fn sidecar(
    run_dir: &Path,
    name: &str,
    bytes: &[u8],
    durability: Durability,
) -> io::Result<sys::TempFile> {
    let meta = run_dir.join(META_DIR);
    sys::ensure_dir(&meta, durability)?;
    sys::TempFile::write_beside(
        &meta,
        &run_dir.join(CHECKPOINTS_DIR),
        name,
        bytes,
        durability,
    )
}
