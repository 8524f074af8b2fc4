//! The doctor's read-only scan of a store directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use runkeep::{
    LeaseSummary, ProjectId, Result, RunScope, SessionId, TenantId, Timestamp, TopHolding,
};

use crate::claims::{self, KEEP_BELOW_TOP, SCRATCH_TTL};
use crate::lock::META_DIR;
use crate::sys::{self, Ctx};
use crate::{checkpoints, listing, transcript, Attribution, Inner, FENCED_OUT_LOG};

/// What a health scan found. Every list is empty on a healthy store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnosis {
    /// Run directories scanned (top-level, sub-runs and bare shells).
    pub runs_scanned: u64,
    /// Transient files (claim scratch files, atomic-write sidecars) older
    /// than the scratch TTL (ten minutes, wall clock): left by a process that
    /// died mid-write. Harmless to readers; safe to delete.
    pub scratch_leftovers: Vec<PathBuf>,
    /// Transcripts or audit trails whose last record is not
    /// newline-terminated (a writer died mid-append); the next append heals.
    pub torn_transcripts: Vec<PathBuf>,
    /// Checkpoint files that cannot be read, with the reason.
    pub damaged_checkpoints: Vec<(PathBuf, String)>,
    /// Claims directories holding more than the pruning window (33
    /// holdings), with their count: pruning is failing or another writer
    /// does not prune.
    pub oversized_claims: Vec<(PathBuf, usize)>,
    /// Runs whose top holding expired (or is unreadable) without being
    /// released or taken over: a worker died holding them. They are free.
    pub expired_unreclaimed: Vec<(RunScope, LeaseSummary)>,
    /// Runs whose writes were refused as fenced out, with the persisted
    /// count: more than one process believed it held the run (the
    /// single-open-writer check).
    pub fenced_out_refusals: Vec<(RunScope, u64)>,
}

impl Diagnosis {
    /// True when nothing was found.
    pub fn is_clean(&self) -> bool {
        self.scratch_leftovers.is_empty()
            && self.torn_transcripts.is_empty()
            && self.damaged_checkpoints.is_empty()
            && self.oversized_claims.is_empty()
            && self.expired_unreclaimed.is_empty()
            && self.fenced_out_refusals.is_empty()
    }
}

fn old_transients(dir: &Path, now: SystemTime, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !sys::is_transient_name(name) {
            continue;
        }
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let age = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .unwrap_or_default();
        if age >= SCRATCH_TTL {
            out.push(e.path());
        }
    }
}

pub(crate) fn diagnose(inner: &Inner, now: Timestamp) -> Result<Diagnosis> {
    let ctx = Ctx::store("diagnose");
    // Without attribution the rows still need a scope; the placeholder ids
    // say plainly that the directory did not tell.
    let unattributed = || Attribution {
        tenant_id: TenantId::new("unattributed").expect("valid id"),
        project_id: ProjectId::new("unattributed").expect("valid id"),
        session_id: SessionId::new("unattributed").expect("valid id"),
    };
    let attribution = inner.attribution().cloned().unwrap_or_else(unattributed);
    let wall = SystemTime::now();
    let mut d = Diagnosis::default();
    // Hard-link probes left by a process that died inside FsStore::open.
    if let Ok(rd) = fs::read_dir(inner.base()) {
        for e in rd.flatten() {
            let name = e.file_name();
            if !name.to_string_lossy().starts_with(".runkeep-probe-") {
                continue;
            }
            let old = e
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|m| wall.duration_since(m).ok())
                .is_some_and(|age| age >= SCRATCH_TTL);
            if old {
                d.scratch_leftovers.push(e.path());
            }
        }
    }
    for c in listing::enumerate(inner.base(), &ctx)? {
        d.runs_scanned += 1;
        let scope = c.scope(&attribution);
        let rctx = Ctx::new(&scope, "diagnose");
        let claims_dir = c.dir.join(claims::CLAIMS_DIR);
        let cps_dir = c.dir.join(checkpoints::CHECKPOINTS_DIR);
        for dir in [&c.dir, &claims_dir, &cps_dir, &c.dir.join(META_DIR)] {
            old_transients(dir, wall, &mut d.scratch_leftovers);
        }
        for log in [transcript::TRANSCRIPT, transcript::AUDIT] {
            let p = c.dir.join(log);
            if transcript::is_torn(&p) {
                d.torn_transcripts.push(p);
            }
        }
        if let Ok(Some(list)) = checkpoints::entries(&cps_dir) {
            for e in list {
                let path = cps_dir.join(&e.name);
                let stem = &e.name[..e.name.len() - ".json".len()];
                let outcome = match runkeep::CheckpointId::new(stem) {
                    Err(_) => Err(format!("{} is not named for a checkpoint id", e.name)),
                    Ok(_) if !e.regular => Err(format!("{} is not a regular file", e.name)),
                    Ok(_) => match sys::read_opt(&path) {
                        Ok(Some(bytes)) => checkpoints::decode(&bytes, &path, &rctx)
                            .map(|_| ())
                            .map_err(|e| e.to_string()),
                        Ok(None) => Ok(()),
                        Err(e) => Err(e.to_string()),
                    },
                };
                if let Err(why) = outcome {
                    d.damaged_checkpoints.push((path, why));
                }
            }
        }
        if let Ok(Some(s)) = claims::scan(&claims_dir) {
            if s.holdings.len() as u64 > KEEP_BELOW_TOP + 1 {
                d.oversized_claims
                    .push((claims_dir.clone(), s.holdings.len()));
            }
        }
        match claims::read_top(&c.dir, &rctx) {
            Ok(Some(top @ (TopHolding::Lease { .. } | TopHolding::Unreadable { .. })))
                if !top.is_live(now) =>
            {
                d.expired_unreclaimed
                    .push((scope.clone(), top.summary(now)));
            }
            _ => {}
        }
        if let Ok(Some(bytes)) = sys::read_opt(&c.dir.join(META_DIR).join(FENCED_OUT_LOG)) {
            let n = bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .count() as u64;
            if n > 0 {
                d.fenced_out_refusals.push((scope, n));
            }
        }
    }
    Ok(d)
}
