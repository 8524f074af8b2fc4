//! Threads: a LangGraph-style checkpoint chain kept in one run
//! ([`runkeep_http::wire::threads`] has the shapes).
//!
//! What a checkpoint saver needs that the per-run checkpoint routes cannot
//! answer without the client reading the whole run: the latest checkpoint
//! of a namespace in checkpoint-id order, a listing filtered by metadata
//! with `before` and `limit`, a listing across every thread of a session,
//! channel values rebuilt from versions, pending writes under LangGraph's
//! conflict rule, and deleting a thread.
//!
//! # Storage
//!
//! Everything is kept as ordinary runkeep checkpoints of the run, so every
//! write is fenced by the store like any other write and the run's lease is
//! the thread's write ownership:
//!
//! - a thread checkpoint `(ns, checkpointId)` is the runkeep checkpoint
//!   `tc-<ns key>-<id key>` ([`record_id`]) whose state holds
//!   `threadRecord: "checkpoint"`, the thread, ns, ids, the checkpoint
//!   document, its metadata and the blobs (channel values) it changed;
//! - its pending writes are the runkeep checkpoint `tw-<ns key>-<id key>`
//!   (`threadRecord: "writes"`), one record per thread checkpoint, changed
//!   by [`runkeep::CheckpointStore::update_checkpoint`] with the core's
//!   conflict rule ([`runkeep::thread_writes::merge`]): the store reads,
//!   merges and writes under its own lock or transaction, so batches of
//!   one checkpoint sent through any number of servers in front of one
//!   store at once are all kept. A write batch that
//!   carries `park` makes this record a runkeep park: the console shows
//!   it, and its answer is the decision a worker resumes the graph with.
//!
//! Layout v2: a checkpoint record also keeps `locations`, for each channel
//! of its `channel_versions` the record id holding that version's blob
//! (its own for the blobs it carries, else its parent's location when the
//! parent holds the same version: one point read of the parent at write
//! time). Each blob is stored once, in the record that introduced it.
//!
//! Reads: the latest of a namespace is one names-only
//! [`runkeep::CheckpointStore::checkpoint_ids`] query (`tc-<ns key>-r`,
//! limit 1: raw ids sort as checkpoint ids), then point reads of the
//! record, the records its blobs live in (each once) and its writes
//! record — independent of the thread's length. A read by id is a point
//! read; a one-namespace page (`ns`, `before`, `filter`, `limit`) pages the
//! ids and reads only what it returns. Old-layout records, a channel with
//! no known location, a namespace holding hashed ids, and listings without
//! `ns` scan the run's checkpoints once (`list_checkpoints`); the listing
//! across threads with `ns` pages each thread like a one-namespace page.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use runkeep::thread_writes::{self, WritesBatch};
use runkeep::{Checkpoint, CheckpointId, ListOptions, ListingScope, RunScope};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::claims::checked;
use super::extract::{JsonBody, RunAddr, TenantParam, Q};
use super::runs::ApiResult;
use crate::problem::Problem;
use crate::state::AppState;
use runkeep_http::wire::params::{
    DeleteThreadQuery, GetThreadQuery, ListThreadQuery, ListThreadsQuery,
};
use runkeep_http::wire::threads::{
    DeleteThreadCheckpointsBody, MaybeThreadCheckpoint, PutThreadCheckpointBody,
    PutThreadWritesBody, StoredThreadWrite, ThreadBlobBody, ThreadCheckpointBody,
    ThreadCheckpointList, ThreadCheckpointsDeleted, ThreadDeleted, ThreadParkState,
};
use runkeep_http::wire::{self, Done, PendingBody};

use runkeep::thread_writes::KIND_WRITES;
/// The state key that marks a thread record, and its kind.
pub use runkeep::thread_writes::RECORD_KEY;
const KIND_CHECKPOINT: &str = "checkpoint";

/// Longest checkpoint id kept as itself in a record id (longer or
/// non-id-safe ones are hashed).
const RAW_ID_MAX: usize = 96;

fn hashed(text: &str, hex_len: usize) -> String {
    let mut h = Sha256::new();
    h.update(text.as_bytes());
    let d = h.finalize();
    let mut s = hex::encode(d);
    s.truncate(hex_len);
    s
}

fn id_safe(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= RAW_ID_MAX
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The runkeep checkpoint id of a thread record: `t<kind>-<ns>-<id>` where
/// `<ns>` is `0` for the root namespace or 20 hex digits of SHA-256 of the
/// namespace, and `<id>` is `r<checkpoint id>` when the id is id-safe and
/// short, else `h` and 40 hex digits of its SHA-256. The record also keeps
/// the namespace and id as given; a read checks them.
pub fn record_id(kind: &str, ns: &str, checkpoint_id: &str) -> String {
    let k = if kind == KIND_CHECKPOINT { "c" } else { "w" };
    let n = if ns.is_empty() {
        "0".to_string()
    } else {
        hashed(ns, 20)
    };
    let c = if id_safe(checkpoint_id) {
        format!("r{checkpoint_id}")
    } else {
        format!("h{}", hashed(checkpoint_id, 40))
    };
    format!("t{k}-{n}-{c}")
}

fn checkpoint_id(field: &str, id: &str) -> Result<CheckpointId, Problem> {
    CheckpointId::new(id).map_err(|e| Problem::from(e).with_field(field))
}

fn not_empty(field: &str, v: &str) -> Result<(), Problem> {
    if v.is_empty() {
        return Err(Problem::invalid(field, format!("{field} may not be empty")));
    }
    Ok(())
}

fn text(state: &Map<String, Value>, key: &str) -> Option<String> {
    state.get(key).and_then(Value::as_str).map(str::to_string)
}

fn object(state: &Map<String, Value>, key: &str) -> Map<String, Value> {
    state
        .get(key)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// The text a version is matched by: a string as itself, anything else as
/// its JSON text.
fn version_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One thread checkpoint record, parsed.
struct CpRecord {
    thread: String,
    ns: String,
    id: String,
    parent: Option<String>,
    checkpoint: Map<String, Value>,
    metadata: Map<String, Value>,
    blobs: Vec<ThreadBlobBody>,
    fence: Option<u64>,
    created_at: i64,
}

/// One writes record, parsed.
struct WritesRecord {
    record: String,
    writes: Vec<StoredThreadWrite>,
    pending: Option<PendingBody>,
}

fn parse_blobs(v: Option<&Value>) -> Vec<ThreadBlobBody> {
    v.cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

fn parse_writes(v: Option<&Value>) -> Vec<StoredThreadWrite> {
    v.cloned()
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default()
}

fn cp_record(cp: &Checkpoint) -> Option<CpRecord> {
    let s = &cp.state;
    if s.get(RECORD_KEY).and_then(Value::as_str) != Some(KIND_CHECKPOINT) {
        return None;
    }
    Some(CpRecord {
        thread: text(s, "thread")?,
        ns: text(s, "ns")?,
        id: text(s, "checkpointId")?,
        parent: text(s, "parentId"),
        checkpoint: object(s, "checkpoint"),
        metadata: object(s, "metadata"),
        blobs: parse_blobs(s.get("blobs")),
        fence: cp.fence.map(runkeep::Fence::get),
        created_at: cp.created_at.as_millis(),
    })
}

fn writes_key(cp: &Checkpoint) -> Option<(String, String)> {
    let s = &cp.state;
    if s.get(RECORD_KEY).and_then(Value::as_str) != Some(KIND_WRITES) {
        return None;
    }
    Some((text(s, "ns")?, text(s, "checkpointId")?))
}

fn writes_record(cp: &Checkpoint) -> WritesRecord {
    WritesRecord {
        record: cp.id.to_string(),
        writes: parse_writes(cp.state.get("writes")),
        pending: cp.pending.as_ref().map(Into::into),
    }
}

/// A thread, read in one scan.
struct Thread {
    run: String,
    checkpoints: Vec<CpRecord>,
    writes: HashMap<(String, String), WritesRecord>,
    /// `(ns, channel, version) → blob`, the later write winning (the
    /// store's total order: a later holding's write outranks an earlier's).
    blobs: HashMap<(String, String, String), ThreadBlobBody>,
}

impl Thread {
    async fn load(state: &AppState, scope: &RunScope) -> Result<Self, Problem> {
        let all = state.store.list_checkpoints(scope).await?;
        let mut t = Thread {
            run: scope.run_id.to_string(),
            checkpoints: Vec::new(),
            writes: HashMap::new(),
            blobs: HashMap::new(),
        };
        for cp in &all {
            if let Some(r) = cp_record(cp) {
                for b in &r.blobs {
                    t.blobs.insert(
                        (r.ns.clone(), b.channel.clone(), b.version.clone()),
                        b.clone(),
                    );
                }
                t.checkpoints.push(r);
            } else if let Some(key) = writes_key(cp) {
                t.writes.insert(key, writes_record(cp));
            }
        }
        Ok(t)
    }

    fn body(&self, r: &CpRecord) -> ThreadCheckpointBody {
        let mut values = Vec::new();
        if let Some(Value::Object(versions)) = r.checkpoint.get("channel_versions") {
            for (channel, v) in versions {
                let key = (r.ns.clone(), channel.clone(), version_text(v));
                if let Some(b) = self.blobs.get(&key) {
                    values.push(b.clone());
                }
            }
        }
        let w = self.writes.get(&(r.ns.clone(), r.id.clone()));
        checkpoint_body(r, &self.run, values, w)
    }

    /// The checkpoints matching `sel`, newest first.
    fn select<'a>(&'a self, sel: &Selection) -> Vec<&'a CpRecord> {
        let mut v: Vec<&CpRecord> = self.checkpoints.iter().filter(|r| sel.admits(r)).collect();
        v.sort_by(|a, b| b.id.cmp(&a.id).then_with(|| a.ns.cmp(&b.ns)));
        v
    }
}

fn sorted(mut w: Vec<StoredThreadWrite>) -> Vec<StoredThreadWrite> {
    w.sort_by(|a, b| (&a.task_path, &a.task_id, a.idx).cmp(&(&b.task_path, &b.task_id, b.idx)));
    w
}

/// What a listing keeps.
#[derive(Default)]
struct Selection {
    ns: Option<String>,
    id: Option<String>,
    before: Option<String>,
    filter: Map<String, Value>,
}

impl Selection {
    fn admits(&self, r: &CpRecord) -> bool {
        self.ns.as_ref().is_none_or(|ns| *ns == r.ns)
            && self.id.as_ref().is_none_or(|id| *id == r.id)
            && self.before.as_ref().is_none_or(|b| r.id < *b)
            && self
                .filter
                .iter()
                .all(|(k, v)| r.metadata.get(k).unwrap_or(&Value::Null) == v)
    }
}

fn parse_filter(filter: Option<&str>) -> Result<Map<String, Value>, Problem> {
    match filter {
        None | Some("") => Ok(Map::new()),
        Some(f) => serde_json::from_str::<Map<String, Value>>(f).map_err(|e| {
            Problem::invalid(
                "filter",
                format!("filter must be a JSON object of metadata keys to the values they must equal: {e}"),
            )
        }),
    }
}

pub(super) async fn put_checkpoint(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<PutThreadCheckpointBody>,
) -> ApiResult<Done> {
    let fence = wire::opt_fence("fence", body.fence)?;
    not_empty("thread", &body.thread)?;
    not_empty("checkpointId", &body.checkpoint_id)?;
    let id = checkpoint_id(
        "checkpointId",
        &record_id(KIND_CHECKPOINT, &body.ns, &body.checkpoint_id),
    )?;
    let mut s = Map::new();
    s.insert(RECORD_KEY.into(), KIND_CHECKPOINT.into());
    s.insert("thread".into(), body.thread.into());
    s.insert("ns".into(), body.ns.into());
    s.insert("checkpointId".into(), body.checkpoint_id.into());
    if let Some(p) = body.parent_id {
        s.insert("parentId".into(), p.into());
    }
    s.insert("checkpoint".into(), Value::Object(body.checkpoint));
    s.insert("metadata".into(), Value::Object(body.metadata));
    let locations = locations(&state, &scope, &s, &body.blobs, id.as_str()).await?;
    s.insert(LOCATIONS.into(), Value::Object(locations));
    s.insert(
        "blobs".into(),
        serde_json::to_value(&body.blobs).unwrap_or(Value::Array(vec![])),
    );
    let cp = Checkpoint {
        id,
        created_at: state.store.now(),
        run_created_at: None,
        pending: None,
        fence: None,
        state: s,
    };
    checked(
        &state,
        state.store.write_checkpoint(&scope, &cp, fence).await,
    )?;
    Ok(Json(Done { done: true }))
}

/// The state key of a record's blob locations (layout v2): for each
/// channel of its `channel_versions`, the record id holding the blob of
/// that (channel, version).
const LOCATIONS: &str = "locations";

/// The key of a namespace in record ids (`0` for the root namespace).
fn ns_key(ns: &str) -> String {
    if ns.is_empty() {
        "0".to_string()
    } else {
        hashed(ns, 20)
    }
}

/// Where each channel of the checkpoint being written finds its blob: this
/// record for the blobs it carries; else the parent record's location for
/// the channel when the parent holds the same version (one point read of
/// the parent). A channel found nowhere has no entry (a read then falls
/// back to the scan).
async fn locations(
    state: &AppState,
    scope: &RunScope,
    record: &Map<String, Value>,
    blobs: &[ThreadBlobBody],
    own: &str,
) -> Result<Map<String, Value>, Problem> {
    let mut out = Map::new();
    let Some(Value::Object(versions)) = object(record, "checkpoint")
        .get("channel_versions")
        .cloned()
    else {
        return Ok(out);
    };
    let mut parent: Option<Option<Map<String, Value>>> = None;
    for (channel, v) in &versions {
        let version = version_text(v);
        if blobs
            .iter()
            .any(|b| b.channel == *channel && b.version == version)
        {
            out.insert(channel.clone(), own.into());
            continue;
        }
        if parent.is_none() {
            parent = Some(match (text(record, "parentId"), text(record, "ns")) {
                (Some(pid), Some(ns)) => {
                    let rid = record_id(KIND_CHECKPOINT, &ns, &pid);
                    match CheckpointId::new(&rid) {
                        Ok(id) => state
                            .store
                            .read_checkpoint(scope, &id)
                            .await?
                            .filter(|cp| cp_record(cp).is_some_and(|r| r.ns == ns && r.id == pid))
                            .map(|cp| cp.state),
                        Err(_) => None,
                    }
                }
                _ => None,
            });
        }
        let Some(Some(p)) = &parent else { continue };
        let same = object(p, "checkpoint")
            .get("channel_versions")
            .and_then(|pv| pv.get(channel))
            .is_some_and(|pv| version_text(pv) == version);
        if let (true, Some(at)) = (same, object(p, LOCATIONS).get(channel)) {
            out.insert(channel.clone(), at.clone());
        }
    }
    Ok(out)
}

/// Reads one thread checkpoint the v2 way: its record, the records its
/// blobs live in (each once), and its writes record. `None` when the
/// record predates layout v2 or a channel's location is unknown: the
/// caller then takes the scan.
async fn read_direct(
    state: &AppState,
    scope: &RunScope,
    cp: &Checkpoint,
) -> Result<Option<ThreadCheckpointBody>, Problem> {
    let Some(r) = cp_record(cp) else {
        return Ok(None);
    };
    let Some(Value::Object(locs)) = cp.state.get(LOCATIONS) else {
        return Ok(None);
    };
    let versions = match r.checkpoint.get("channel_versions") {
        Some(Value::Object(v)) => v.clone(),
        _ => Map::new(),
    };
    let mut records: HashMap<String, Vec<ThreadBlobBody>> = HashMap::new();
    records.insert(cp.id.to_string(), r.blobs.clone());
    let mut values = Vec::new();
    for (channel, v) in &versions {
        let Some(at) = locs.get(channel).and_then(Value::as_str) else {
            return Ok(None);
        };
        if !records.contains_key(at) {
            let Ok(id) = CheckpointId::new(at) else {
                return Ok(None);
            };
            let blobs = match state.store.read_checkpoint(scope, &id).await? {
                Some(other) => match cp_record(&other) {
                    Some(o) if o.ns == r.ns => o.blobs,
                    _ => return Ok(None),
                },
                None => return Ok(None),
            };
            records.insert(at.to_string(), blobs);
        }
        let version = version_text(v);
        match records[at]
            .iter()
            .rev()
            .find(|b| b.channel == *channel && b.version == version)
        {
            Some(b) => values.push(b.clone()),
            None => return Ok(None),
        }
    }
    let wid = checkpoint_id("checkpointId", &record_id(KIND_WRITES, &r.ns, &r.id))?;
    let w = state
        .store
        .read_checkpoint(scope, &wid)
        .await?
        .filter(|w| writes_key(w).is_some_and(|(ns, id)| ns == r.ns && id == r.id))
        .map(|w| writes_record(&w));
    Ok(Some(checkpoint_body(
        &r,
        scope.run_id.as_ref(),
        values,
        w.as_ref(),
    )))
}

/// A thread checkpoint as answered: its record, the values of its
/// versions and its writes record (if any), however they were read.
fn checkpoint_body(
    r: &CpRecord,
    run: &str,
    values: Vec<ThreadBlobBody>,
    w: Option<&WritesRecord>,
) -> ThreadCheckpointBody {
    ThreadCheckpointBody {
        thread: r.thread.clone(),
        run: run.to_string(),
        ns: r.ns.clone(),
        checkpoint_id: r.id.clone(),
        parent_id: r.parent.clone(),
        checkpoint: r.checkpoint.clone(),
        metadata: r.metadata.clone(),
        values,
        writes: w.map(|w| sorted(w.writes.clone())).unwrap_or_default(),
        fence: r.fence,
        created_at: r.created_at,
        park: w.and_then(|w| {
            w.pending.clone().map(|pending| ThreadParkState {
                checkpoint: w.record.clone(),
                pending,
            })
        }),
    }
}

/// Whether the namespace holds checkpoints under hashed ids (not in
/// checkpoint-id order: listing it by id then takes the scan).
async fn has_hashed(state: &AppState, scope: &RunScope, ns: &str) -> Result<bool, Problem> {
    let q = runkeep::CheckpointIdQuery {
        prefix: format!("tc-{}-h", ns_key(ns)),
        before: None,
        limit: Some(1),
    };
    Ok(!state.store.checkpoint_ids(scope, &q).await?.is_empty())
}

/// The newest checkpoints of `ns` (below `before`, admitted by `filter`),
/// at most `limit`, read page by page in id order without the scan;
/// `None` when the namespace or a record needs the scan.
async fn list_direct(
    state: &AppState,
    scope: &RunScope,
    ns: &str,
    before: Option<&str>,
    filter: &Map<String, Value>,
    limit: usize,
) -> Result<Option<Vec<ThreadCheckpointBody>>, Problem> {
    if has_hashed(state, scope, ns).await? {
        return Ok(None);
    }
    let mut cursor = match before {
        Some(b) if id_safe(b) => Some(checkpoint_id("before", &record_id(KIND_CHECKPOINT, ns, b))?),
        Some(_) => return Ok(None),
        None => None,
    };
    let mut out = Vec::new();
    while out.len() < limit {
        let q = runkeep::CheckpointIdQuery {
            prefix: format!("tc-{}-r", ns_key(ns)),
            before: cursor.clone(),
            limit: Some((limit - out.len()).clamp(1, 64)),
        };
        let ids = state.store.checkpoint_ids(scope, &q).await?;
        let Some(last) = ids.last().cloned() else {
            break;
        };
        for id in ids {
            let Some(cp) = state.store.read_checkpoint(scope, &id).await? else {
                continue;
            };
            let admitted = cp_record(&cp).is_some_and(|r| {
                r.ns == ns
                    && filter
                        .iter()
                        .all(|(k, v)| r.metadata.get(k).unwrap_or(&Value::Null) == v)
            });
            if !admitted {
                continue;
            }
            match read_direct(state, scope, &cp).await? {
                Some(b) => out.push(b),
                None => return Ok(None),
            }
            if out.len() == limit {
                break;
            }
        }
        cursor = Some(last);
    }
    Ok(Some(out))
}

pub(super) async fn put_writes(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<PutThreadWritesBody>,
) -> ApiResult<Done> {
    let fence = wire::opt_fence("fence", body.fence)?;
    not_empty("thread", &body.thread)?;
    not_empty("checkpointId", &body.checkpoint_id)?;
    not_empty("taskId", &body.task_id)?;
    let park = match &body.park {
        Some(p) => {
            let pending = runkeep::PendingDecision {
                request: p.request.clone(),
                parked_at: state.store.now(),
                deadline_at: p
                    .deadline_at
                    .map(|d| wire::instant("park.deadlineAt", d))
                    .transpose()?,
                resolved_at: None,
                decision: None,
                extra: Map::new(),
            };
            pending
                .validate()
                .map_err(|e| Problem::from(e).with_field("park.request"))?;
            Some(pending)
        }
        None => None,
    };
    let rid = record_id(KIND_WRITES, &body.ns, &body.checkpoint_id);
    let id = checkpoint_id("checkpointId", &rid)?;
    let batch = WritesBatch {
        thread: body.thread,
        ns: body.ns,
        checkpoint_id: body.checkpoint_id,
        task_id: body.task_id,
        task_path: body.task_path,
        writes: body
            .writes
            .into_iter()
            .map(|w| (w.idx, w.channel, w.value_type, w.data))
            .collect(),
        park,
        resume: body.resume,
        resume_of: body.resume_of,
    };
    // The conflict rule is the core's (`thread_writes::merge`); the store
    // runs it under its own lock or transaction, so batches arriving
    // through different servers at once are all kept.
    let now = state.store.now();
    let at = id.clone();
    let update: runkeep::CheckpointUpdate =
        Arc::new(move |old| Ok(thread_writes::merge(&at, old, &batch, now)));
    checked(
        &state,
        state
            .store
            .update_checkpoint(&scope, &id, update, fence)
            .await,
    )?;
    Ok(Json(Done { done: true }))
}

pub(super) async fn get_checkpoint(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    Q(q): Q<GetThreadQuery>,
) -> ApiResult<MaybeThreadCheckpoint> {
    let ns = q.ns.clone().unwrap_or_default();
    // Layout v2: one point read (by id) or one names-only query (the
    // latest), then the blobs' records; the scan only for what needs it.
    let direct = match &q.checkpoint_id {
        Some(id) => {
            let rid = checkpoint_id("checkpointId", &record_id(KIND_CHECKPOINT, &ns, id))?;
            match state.store.read_checkpoint(&scope, &rid).await? {
                None => Some(None),
                Some(cp) if cp_record(&cp).is_some_and(|r| r.ns == ns && r.id == *id) => {
                    read_direct(&state, &scope, &cp).await?.map(Some)
                }
                Some(_) => None,
            }
        }
        None => list_direct(&state, &scope, &ns, None, &Map::new(), 1)
            .await?
            .map(|mut v| v.pop()),
    };
    if let Some(found) = direct {
        return Ok(Json(MaybeThreadCheckpoint { checkpoint: found }));
    }
    let thread = Thread::load(&state, &scope).await?;
    let sel = Selection {
        ns: Some(q.ns.unwrap_or_default()),
        id: q.checkpoint_id,
        ..Selection::default()
    };
    let found = thread.select(&sel).first().map(|r| thread.body(r));
    Ok(Json(MaybeThreadCheckpoint { checkpoint: found }))
}

pub(super) async fn list_checkpoints(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    Q(q): Q<ListThreadQuery>,
) -> ApiResult<ThreadCheckpointList> {
    let sel = Selection {
        ns: q.ns,
        id: q.checkpoint_id,
        before: q.before,
        filter: parse_filter(q.filter.as_deref())?,
    };
    let limit = q.limit.unwrap_or(usize::MAX);
    // A page of one namespace, without the scan (layout v2).
    if let (Some(ns), None, true) = (&sel.ns, &sel.id, limit <= 10_000) {
        if let Some(checkpoints) = list_direct(
            &state,
            &scope,
            ns,
            sel.before.as_deref(),
            &sel.filter,
            limit,
        )
        .await?
        {
            return Ok(Json(ThreadCheckpointList { checkpoints }));
        }
    }
    let thread = Thread::load(&state, &scope).await?;
    let checkpoints = thread
        .select(&sel)
        .into_iter()
        .take(limit)
        .map(|r| thread.body(r))
        .collect();
    Ok(Json(ThreadCheckpointList { checkpoints }))
}

pub(super) async fn list_threads(
    State(state): State<AppState>,
    TenantParam(tenant): TenantParam,
    Q(q): Q<ListThreadsQuery>,
) -> ApiResult<ThreadCheckpointList> {
    let project = q
        .project
        .as_deref()
        .map(runkeep::ProjectId::new)
        .transpose()
        .map_err(|e| Problem::from(e).with_field("project"))?;
    let session = q
        .session
        .as_deref()
        .map(runkeep::SessionId::new)
        .transpose()
        .map_err(|e| Problem::from(e).with_field("session"))?;
    let listing = ListingScope::from_parts(tenant, project, session)
        .map_err(|e| Problem::from(e).with_field("session"))?;
    let sel = Selection {
        ns: q.ns,
        id: None,
        before: q.before,
        filter: parse_filter(q.filter.as_deref())?,
    };
    let limit = q.limit.unwrap_or(usize::MAX);
    // Newest first across threads: (checkpoint id desc, thread, ns).
    let mut found: BTreeMap<(std::cmp::Reverse<String>, String, String), ThreadCheckpointBody> =
        BTreeMap::new();
    let mut options = ListOptions {
        limit: Some(runkeep::listing::MAX_LIMIT),
        ..ListOptions::default()
    };
    loop {
        let page = state.store.list_runs(&listing, &options).await?;
        for row in &page.entries {
            if row.damaged.is_some() {
                continue;
            }
            // One namespace: at most `limit` bodies of this thread, read
            // without the scan (layout v2).
            if let (Some(ns), true) = (&sel.ns, limit <= 10_000) {
                if let Some(bodies) = list_direct(
                    &state,
                    &row.scope,
                    ns,
                    sel.before.as_deref(),
                    &sel.filter,
                    limit,
                )
                .await?
                {
                    for b in bodies {
                        let key = (
                            std::cmp::Reverse(b.checkpoint_id.clone()),
                            b.thread.clone(),
                            b.ns.clone(),
                        );
                        found.insert(key, b);
                        if found.len() > limit {
                            found.pop_last();
                        }
                    }
                    continue;
                }
            }
            let thread = Thread::load(&state, &row.scope).await?;
            for r in thread.select(&sel) {
                let key = (
                    std::cmp::Reverse(r.id.clone()),
                    r.thread.clone(),
                    r.ns.clone(),
                );
                found.insert(key, thread.body(r));
                if found.len() > limit {
                    found.pop_last();
                }
            }
        }
        match page.cursor {
            Some(c) if !page.entries.is_empty() => options.cursor = Some(c),
            _ => break,
        }
    }
    Ok(Json(ThreadCheckpointList {
        checkpoints: found.into_values().collect(),
    }))
}

pub(super) async fn delete_thread(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    Q(q): Q<DeleteThreadQuery>,
) -> ApiResult<ThreadDeleted> {
    let fence = wire::opt_fence("fence", q.fence)?;
    // Names only: every thread record id starts `tc-` or `tw-`.
    let mut ids = Vec::new();
    for prefix in ["tc-", "tw-"] {
        let q = runkeep::CheckpointIdQuery {
            prefix: prefix.into(),
            before: None,
            limit: None,
        };
        ids.extend(state.store.checkpoint_ids(&scope, &q).await?);
    }
    let mut checkpoint_count = 0;
    for id in &ids {
        if checked(
            &state,
            state.store.delete_checkpoint(&scope, id, fence).await,
        )? {
            checkpoint_count += 1;
        }
    }
    Ok(Json(ThreadDeleted { checkpoint_count }))
}

/// Most checkpoints one delete request may name.
const MAX_DELETE: usize = 10_000;

pub(super) async fn delete_checkpoints(
    State(state): State<AppState>,
    RunAddr(scope): RunAddr,
    JsonBody(body): JsonBody<DeleteThreadCheckpointsBody>,
) -> ApiResult<ThreadCheckpointsDeleted> {
    let fence = wire::opt_fence("fence", body.fence)?;
    if body.checkpoints.len() > MAX_DELETE {
        return Err(Problem::invalid(
            "checkpoints",
            format!("at most {MAX_DELETE} checkpoints per request"),
        ));
    }
    // Every id is checked before anything is deleted.
    let mut ids = Vec::with_capacity(body.checkpoints.len());
    for c in &body.checkpoints {
        not_empty("checkpoints.checkpointId", &c.checkpoint_id)?;
        ids.push((
            checkpoint_id(
                "checkpoints.checkpointId",
                &record_id(KIND_CHECKPOINT, &c.ns, &c.checkpoint_id),
            )?,
            checkpoint_id(
                "checkpoints.checkpointId",
                &record_id(KIND_WRITES, &c.ns, &c.checkpoint_id),
            )?,
        ));
    }
    let mut deleted = 0;
    for (cp, writes) in &ids {
        // Each delete is fenced by the store: a stale fence is refused at
        // the first one, before anything is deleted.
        let gone = checked(
            &state,
            state.store.delete_checkpoint(&scope, cp, fence).await,
        )?;
        checked(
            &state,
            state.store.delete_checkpoint(&scope, writes, fence).await,
        )?;
        if gone {
            deleted += 1;
        }
    }
    Ok(Json(ThreadCheckpointsDeleted { deleted }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_ids_are_valid_and_distinct() {
        let cases = [
            ("", "1ef4f797-8335-6428-8001-8a1503f9b875"),
            ("", "x"),
            ("node:abc|sub:def", "1ef4f797-8335-6428-8001-8a1503f9b875"),
            ("", "id with spaces"),
            ("", &"z".repeat(200)),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (ns, id) in cases {
            for kind in [KIND_CHECKPOINT, KIND_WRITES] {
                let rid = record_id(kind, ns, id);
                CheckpointId::new(&rid).unwrap();
                assert!(seen.insert(rid));
            }
        }
        assert_eq!(record_id(KIND_CHECKPOINT, "", "abc"), "tc-0-rabc");
    }
}
