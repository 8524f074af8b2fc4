//! The doctor's read-only scan of a store directory.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use runkeep::lease::MAX_FENCE;
use runkeep::{
    Fence, LeaseSummary, ProjectId, ReadEventsOptions, Result, RunScope, SessionId, TenantId,
    Timestamp, TopHolding,
};

use crate::claims::{self, KEEP_BELOW_TOP, SCRATCH_TTL};
use crate::fenced_write::FENCED_OUT_LOG;
use crate::inner::Inner;
use crate::lock::META_DIR;
use crate::options::Attribution;
use crate::sys::{self, Ctx};
use crate::{checkpoints, listing, transcript};

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
    /// newline-terminated (a writer died mid-append); the next append removes
    /// it (terminates it instead while it is younger than 2 s).
    pub torn_transcripts: Vec<PathBuf>,
    /// Checkpoint files that cannot be read, with the reason.
    pub damaged_checkpoints: Vec<(PathBuf, String)>,
    /// Claims directories holding names that pruning should have removed
    /// (more than 32 below the top, and appeared more than the store's
    /// prune grace period, [`crate::FsOptions::prune_grace`], before the
    /// top did), with their count of holdings: pruning is failing or another
    /// writer does not prune. A run claimed faster than 33 fences per grace
    /// period holds more than 33 names by design; those are not listed.
    pub oversized_claims: Vec<(PathBuf, usize)>,
    /// Transcripts (and audit trails) damaged *inside*: a record that is not
    /// valid JSON (or not an event) followed by more records, a `seq` that
    /// appears twice, or a `seq` lower than the one before it. Readers skip
    /// such records silently, so events are lost or ambiguous. A torn final
    /// record is not listed here (see `torn_transcripts`). One entry per
    /// finding: the file and what is wrong, naming line and seq.
    pub damaged_transcripts: Vec<(PathBuf, String)>,
    /// Paths the scan needed but could not read (a run directory, its
    /// checkpoints or claims directory, a transcript), with the reason
    /// (usually permission denied). What they hold was not examined.
    pub unreadable: Vec<(PathBuf, String)>,
    /// Runs whose top holding expired without being released or taken over:
    /// a worker died holding them. They are free. Runs at the fence ceiling
    /// and unreadable holdings are listed apart (`fence_ceiling`,
    /// `unreadable_holdings`).
    pub expired_unreclaimed: Vec<(RunScope, LeaseSummary)>,
    /// Runs whose top holding body cannot be read (garbage, not a regular
    /// file), with the holding's path. They read as expired and anonymous:
    /// the next claim lands above them.
    pub unreadable_holdings: Vec<(RunScope, PathBuf)>,
    /// Runs whose top holding is at the fence ceiling (`MAX_FENCE`), with
    /// the holding's path: no claim, renewal or release can be issued any
    /// more (`Fence::next` refuses), so the run is wedged.
    pub fence_ceiling: Vec<(RunScope, PathBuf)>,
    /// Runs whose writes were refused as fenced out, with the persisted
    /// count: more than one process believed it held the run (the
    /// single-open-writer check).
    pub fenced_out_refusals: Vec<(RunScope, u64)>,
}

impl Diagnosis {
    /// The age past which a scratch file is a leftover
    /// ([`Diagnosis::scratch_leftovers`]; the claim path sweeps at the same
    /// age).
    pub const SCRATCH_TTL: Duration = SCRATCH_TTL;
    /// The age below which a torn final line may still be in flight from a
    /// writer that takes no lock: the next append terminates it instead of
    /// removing it ([`Diagnosis::torn_transcripts`]).
    pub const TORN_GRACE: Duration = transcript::TORN_GRACE;

    /// True when nothing was found.
    pub fn is_clean(&self) -> bool {
        self.scratch_leftovers.is_empty()
            && self.torn_transcripts.is_empty()
            && self.damaged_checkpoints.is_empty()
            && self.damaged_transcripts.is_empty()
            && self.unreadable.is_empty()
            && self.oversized_claims.is_empty()
            && self.expired_unreclaimed.is_empty()
            && self.unreadable_holdings.is_empty()
            && self.fence_ceiling.is_empty()
            && self.fenced_out_refusals.is_empty()
    }

    /// Adds another scan's findings to this one (a root sums its
    /// sessions'). Destructured, so a new field cannot be forgotten.
    pub(crate) fn add(&mut self, other: Diagnosis) {
        let Diagnosis {
            runs_scanned,
            scratch_leftovers,
            torn_transcripts,
            damaged_checkpoints,
            oversized_claims,
            damaged_transcripts,
            unreadable,
            expired_unreclaimed,
            unreadable_holdings,
            fence_ceiling,
            fenced_out_refusals,
        } = other;
        self.runs_scanned += runs_scanned;
        self.scratch_leftovers.extend(scratch_leftovers);
        self.torn_transcripts.extend(torn_transcripts);
        self.damaged_checkpoints.extend(damaged_checkpoints);
        self.oversized_claims.extend(oversized_claims);
        self.damaged_transcripts.extend(damaged_transcripts);
        self.unreadable.extend(unreadable);
        self.expired_unreclaimed.extend(expired_unreclaimed);
        self.unreadable_holdings.extend(unreadable_holdings);
        self.fence_ceiling.extend(fence_ceiling);
        self.fenced_out_refusals.extend(fenced_out_refusals);
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
        // A run directory this process cannot list hides everything in it:
        // say so instead of finding nothing.
        if let Err(e) = fs::read_dir(&c.dir) {
            if !sys::is_not_found(&e) {
                d.unreadable.push((c.dir.clone(), reason(&e)));
            }
            continue;
        }
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
        inspect_transcript(&c.dir, &rctx, &mut d);
        inspect_audit(&c.dir.join(transcript::AUDIT), &mut d);
        match checkpoints::entries(&cps_dir) {
            Ok(Some(list)) => {
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
            Ok(None) => {}
            Err(e) => d.unreadable.push((cps_dir.clone(), reason(&e))),
        }
        match claims::scan(&claims_dir) {
            Ok(Some(s)) => {
                if s.holdings.len() as u64 > KEEP_BELOW_TOP + 1
                    && claims::overdue(&claims_dir, &s, inner.prune_grace) > 0
                {
                    d.oversized_claims
                        .push((claims_dir.clone(), s.holdings.len()));
                }
            }
            Ok(None) => {}
            Err(e) => d.unreadable.push((claims_dir.clone(), reason(&e))),
        }
        match claims::read_top(&c.dir, &rctx) {
            Ok(Some(top)) => {
                let holding = holding_path(&claims_dir, top.fence());
                if top.fence().get() >= MAX_FENCE {
                    // Wedged whatever the holding says: nothing can be
                    // issued above it, not even a renewal or a release.
                    d.fence_ceiling.push((scope.clone(), holding));
                } else if let TopHolding::Unreadable { .. } = top {
                    d.unreadable_holdings.push((scope.clone(), holding));
                } else if matches!(top, TopHolding::Lease { .. }) && !top.is_live(now) {
                    d.expired_unreclaimed
                        .push((scope.clone(), top.summary(now)));
                }
            }
            Ok(None) => {}
            // The claims directory was unreadable: already recorded above.
            Err(_) => {}
        }
        match sys::read_opt(&c.dir.join(META_DIR).join(FENCED_OUT_LOG)) {
            Ok(Some(bytes)) => {
                let n = bytes
                    .split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .count() as u64;
                if n > 0 {
                    d.fenced_out_refusals.push((scope, n));
                }
            }
            Ok(None) => {}
            Err(e) => d
                .unreadable
                .push((c.dir.join(META_DIR).join(FENCED_OUT_LOG), reason(&e))),
        }
    }
    Ok(d)
}

/// The run's top holding as the store reads it, with the path of its
/// file ([`crate::FsStore::top_holding`]); `None` when the run was never
/// claimed. Reads only.
pub(crate) fn top_holding(
    inner: &Inner,
    scope: &RunScope,
) -> Result<Option<(TopHolding, PathBuf)>> {
    let run_dir = inner.run_dir(scope);
    let ctx = Ctx::new(scope, "top_holding");
    let top = claims::read_top(&run_dir, &ctx)?;
    Ok(top.map(|t| {
        let path = holding_path(&run_dir.join(claims::CLAIMS_DIR), t.fence());
        (t, path)
    }))
}

/// The canonical path of the holding at `fence` in `claims_dir`.
fn holding_path(claims_dir: &Path, fence: Fence) -> PathBuf {
    claims_dir.join(format!("{fence}.json"))
}

/// An I/O error for an operator: "permission denied (EACCES)".
fn reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::PermissionDenied => {
            format!(
                "permission denied (EACCES) for uid {}",
                rustix::process::geteuid().as_raw()
            )
        }
        _ => e.to_string(),
    }
}

/// Damage inside the transcript: what the tolerant reader skips silently
/// (records that are not events, not followed by a torn tail) and `seq`
/// values that repeat or go backwards.
fn inspect_transcript(run_dir: &Path, ctx: &Ctx, d: &mut Diagnosis) {
    let path = run_dir.join(transcript::TRANSCRIPT);
    let bytes = match sys::read_opt(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return,
        Err(e) => {
            d.unreadable.push((path, reason(&e)));
            return;
        }
    };
    // Positions count non-empty lines, as the reader does.
    let lines: Vec<&[u8]> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let torn = !bytes.is_empty() && bytes.last() != Some(&b'\n');
    // What the store's own (tolerant) reader skips, in its words.
    match transcript::read_transcript(run_dir, &ReadEventsOptions::default(), ctx) {
        Ok(batch) => {
            for s in &batch.skipped {
                // The torn final record is `torn_transcripts`' finding.
                if torn && s.position == lines.len() as u64 {
                    continue;
                }
                d.damaged_transcripts
                    .push((path.clone(), format!("line {}: {}", s.position, s.reason)));
            }
        }
        Err(e) => {
            d.unreadable.push((path, e.to_string()));
            return;
        }
    }
    let mut first_line: HashMap<u64, u64> = HashMap::new();
    let mut previous: Option<(u64, u64)> = None;
    for (i, raw) in lines.iter().enumerate() {
        let line = i as u64 + 1;
        let Ok(serde_json::Value::Object(m)) = serde_json::from_slice::<serde_json::Value>(raw)
        else {
            continue;
        };
        if !matches!(m.get("type"), Some(serde_json::Value::String(_))) {
            continue;
        }
        // Legacy unsequenced lines take their position, like the reader.
        let seq = match m.get("seq") {
            None => line,
            Some(v) => match v.as_u64().filter(|s| *s > 0) {
                Some(s) => s,
                None => continue,
            },
        };
        match first_line.get(&seq) {
            Some(first) => d.damaged_transcripts.push((
                path.clone(),
                format!("seq {seq} appears twice (lines {first} and {line})"),
            )),
            None => {
                if let Some((prev_seq, prev_line)) = previous.filter(|(p, _)| seq < *p) {
                    d.damaged_transcripts.push((
                        path.clone(),
                        format!(
                            "seq {seq} on line {line} comes after seq {prev_seq} on line {prev_line} (out of order)"
                        ),
                    ));
                }
                first_line.insert(seq, line);
            }
        }
        previous = Some((seq, line));
    }
}

/// Audit records that are not JSON objects, before the final line (a torn
/// final line is `torn_transcripts`' finding).
fn inspect_audit(path: &Path, d: &mut Diagnosis) {
    let bytes = match sys::read_opt(path) {
        Ok(Some(b)) => b,
        Ok(None) => return,
        Err(e) => {
            d.unreadable.push((path.to_path_buf(), reason(&e)));
            return;
        }
    };
    let terminated = bytes.last() == Some(&b'\n');
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    // `split` yields an empty last piece after a final newline.
    let complete = if terminated {
        lines.len() - 1
    } else {
        lines.len().saturating_sub(1)
    };
    for (i, line) in lines.iter().take(complete).enumerate() {
        if line.is_empty() {
            continue;
        }
        if !matches!(
            serde_json::from_slice::<serde_json::Value>(line),
            Ok(serde_json::Value::Object(_))
        ) {
            d.damaged_transcripts.push((
                path.to_path_buf(),
                format!("line {}: is not a JSON object", i + 1),
            ));
        }
    }
}
