//! Checkpoints: the header the store reads, the host's opaque state, and the
//! one total order every backend uses for "latest".
//!
//! # The total order
//!
//! Checkpoints of a run are ordered by [`OrderKey`] =
//! `(fence, unstamped, created_at, id)`. Every checkpoint runkeep writes
//! carries the fence it was written under (the presented fence, or for an
//! unfenced write the run's fence at the time; none if the run was never
//! claimed), so a superseded holder's late write can never outrank anything
//! its successor wrote, whatever its clock says. "Latest", the resume point,
//! pending lookup and pruning all use this one order.
//!
//! # Unstamped checkpoints among stamped ones
//!
//! The reference implementation writes checkpoints without a fence. In a
//! directory shared with it, a run can hold both: a reference worker that
//! takes a run over from a runkeep worker (fence 5 → 6) writes an
//! unstamped checkpoint that must rank above runkeep's fence-5 work, or a
//! runkeep worker resuming the run would discard it. The rule:
//!
//! - An unstamped checkpoint takes the **highest fence stamped on any
//!   checkpoint of the run created at or before it** (its `createdAt`), or
//!   none when there is no such checkpoint ([`FenceHistory`]).
//! - At an equal fence it ranks **above** the stamped checkpoints (it was
//!   written after them, by a holder the store could not see), and unstamped
//!   checkpoints among themselves keep the reference's `createdAt` order.
//!
//! So a run written only by the reference keeps the reference's order, a run
//! written only by runkeep keeps the fence order, and in a mixed run the
//! takeover's checkpoint is latest in both directions (a runkeep takeover
//! stamps a fence above every earlier one). The placement compares
//! `createdAt` values written by different processes, so it assumes their
//! clocks agree to within the time between a takeover and the previous
//! holder's last checkpoint (one host, or hosts kept in sync): a reference
//! checkpoint stamped earlier than the runkeep checkpoints it followed ranks
//! below them, and one stamped later than a runkeep takeover's checkpoint
//! ranks above it — the reference itself orders everything by `createdAt`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::id::CheckpointId;
use crate::lease::Fence;
use crate::park::{ParkState, PendingDecision};
use crate::scope::RunScope;
use crate::time::Timestamp;

/// Largest serialized checkpoint accepted, in bytes (64 MiB).
pub const MAX_CHECKPOINT_BYTES: usize = 64 * 1024 * 1024;

/// Most JSON values (every scalar, array and object, nested ones included)
/// a checkpoint's state may hold (1 048 576). A value costs a reader far
/// more in memory than its bytes on the wire (`[0,0,…]` is 2 bytes a value
/// on the wire, 32 or more parsed), so the byte limit alone does not bound
/// what reading a checkpoint back costs. Store large arrays of numbers as
/// one string (base64, or a blob elsewhere referenced from the state).
pub const MAX_CHECKPOINT_VALUES: usize = 1 << 20;

/// How many JSON values `values` hold (nested ones included), counting at
/// most `limit + 1`: the walk stops as soon as the limit is passed.
pub fn count_values<'a>(values: impl IntoIterator<Item = &'a Value>, limit: usize) -> usize {
    let mut stack: Vec<&Value> = values.into_iter().collect();
    let mut n = 0;
    while let Some(v) = stack.pop() {
        n += 1;
        if n > limit {
            break;
        }
        match v {
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(o) => stack.extend(o.values()),
            _ => {}
        }
    }
    n
}

/// Bytes written, nothing kept.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The compact JSON length of `value`, without building the text.
pub fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut c = ByteCount(0);
    match serde_json::to_writer(&mut c, value) {
        Ok(()) => c.0,
        Err(_) => usize::MAX,
    }
}

/// JSON keys the store owns; the host's state may not use them.
pub const RESERVED_CHECKPOINT_KEYS: [&str; 6] = [
    "id",
    "createdAt",
    "runCreatedAt",
    "pending",
    "fence",
    "schemaVersion",
];

/// A resume point of a run.
#[derive(Clone, PartialEq, Debug)]
pub struct Checkpoint {
    /// Its id; writing an existing id replaces that checkpoint.
    pub id: CheckpointId,
    /// When this checkpoint was written.
    pub created_at: Timestamp,
    /// When the run started; write-once per run, carried on every checkpoint.
    pub run_created_at: Option<Timestamp>,
    /// Present when the run parked here, waiting on a human decision.
    pub pending: Option<PendingDecision>,
    /// The fence this checkpoint was written under. Set by the store on
    /// write; any value the caller puts here is replaced.
    pub fence: Option<Fence>,
    /// The host's own state, preserved as given (keys of
    /// [`RESERVED_CHECKPOINT_KEYS`] excluded).
    pub state: Map<String, Value>,
}

/// The total order key `(fence, unstamped, created_at, id)`: for a stamped
/// checkpoint its own fence, for an unstamped one the fence its run's
/// [`FenceHistory`] places it at (`None` sorts first).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct OrderKey {
    /// The fence it was written under, stamped or placed.
    pub fence: Option<Fence>,
    /// True for a checkpoint without its own fence stamp.
    pub unstamped: bool,
    /// Written at.
    pub created_at: Timestamp,
    /// Id (the last tie-break).
    pub id: CheckpointId,
}

/// The highest fence stamped on a run's checkpoints as a function of
/// `createdAt`: the steps `(created_at, fence)` of a staircase, ascending in
/// both. Places unstamped checkpoints in the total order (module docs).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct FenceHistory(Vec<(Timestamp, Fence)>);

impl FenceHistory {
    /// Built from `(fence, created_at)` of every checkpoint of a run.
    pub fn of(items: impl IntoIterator<Item = (Option<Fence>, Timestamp)>) -> Self {
        let mut points: Vec<(Timestamp, Fence)> = items
            .into_iter()
            .filter_map(|(f, t)| f.map(|f| (t, f)))
            .collect();
        points.sort();
        let mut steps: Vec<(Timestamp, Fence)> = Vec::new();
        for (t, f) in points {
            if steps.last().is_none_or(|(_, top)| f > *top) {
                steps.push((t, f));
            }
        }
        Self(steps)
    }

    /// Records one more checkpoint; true when the staircase changed (so
    /// unstamped checkpoints may have moved).
    pub fn note(&mut self, fence: Option<Fence>, at: Timestamp) -> bool {
        let Some(f) = fence else { return false };
        if self.at(at).is_some_and(|top| top >= f) {
            return false;
        }
        let i = self.0.partition_point(|(t, _)| *t <= at);
        self.0.insert(i, (at, f));
        let mut j = i + 1;
        while j < self.0.len() && self.0[j].1 <= f {
            self.0.remove(j);
        }
        j = i;
        // An earlier step at the same instant is superseded by this one.
        while j > 0 && self.0[j - 1].0 == at {
            self.0.remove(j - 1);
            j -= 1;
        }
        true
    }

    /// The highest stamped fence on a checkpoint created at or before `at`.
    pub fn at(&self, at: Timestamp) -> Option<Fence> {
        let i = self.0.partition_point(|(t, _)| *t <= at);
        i.checked_sub(1).map(|i| self.0[i].1)
    }

    /// True when no checkpoint carries a fence.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The order key of a checkpoint of this run.
    pub fn key(&self, fence: Option<Fence>, created_at: Timestamp, id: &CheckpointId) -> OrderKey {
        match fence {
            Some(f) => OrderKey {
                fence: Some(f),
                unstamped: false,
                created_at,
                id: id.clone(),
            },
            None => OrderKey {
                fence: self.at(created_at),
                unstamped: true,
                created_at,
                id: id.clone(),
            },
        }
    }
}

/// What the store reads of a checkpoint (no host state).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointHeader {
    /// Id.
    pub id: CheckpointId,
    /// Written at.
    pub created_at: Timestamp,
    /// Run start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_created_at: Option<Timestamp>,
    /// Fence written under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<Fence>,
    /// Park header, when parked here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub park: Option<ParkHeader>,
}

impl CheckpointHeader {
    /// The total-order key among the run whose stamps are `history`.
    pub fn order_key(&self, history: &FenceHistory) -> OrderKey {
        history.key(self.fence, self.created_at, &self.id)
    }
}

/// What the store reads of a park.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkHeader {
    /// `request.type`.
    pub request_type: String,
    /// Parked at.
    pub parked_at: Timestamp,
    /// Absolute deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<Timestamp>,
    /// Answered at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<Timestamp>,
}

impl ParkHeader {
    /// State at `now` (resolved first, then expired, else outstanding).
    pub fn state(&self, now: Timestamp) -> ParkState {
        crate::park::park_state(self.resolved_at, self.deadline_at, now)
    }
}

impl Checkpoint {
    /// A checkpoint with the given state and no park.
    pub fn new(id: CheckpointId, created_at: Timestamp, state: Map<String, Value>) -> Self {
        Self {
            id,
            created_at,
            run_created_at: None,
            pending: None,
            fence: None,
            state,
        }
    }

    /// Sets the run's start instant.
    pub fn with_run_created_at(mut self, at: Timestamp) -> Self {
        self.run_created_at = Some(at);
        self
    }

    /// Parks here.
    pub fn with_pending(mut self, pending: PendingDecision) -> Self {
        self.pending = Some(pending);
        self
    }

    /// The total-order key among the run whose stamps are `history`.
    pub fn order_key(&self, history: &FenceHistory) -> OrderKey {
        history.key(self.fence, self.created_at, &self.id)
    }

    /// The header.
    pub fn header(&self) -> CheckpointHeader {
        CheckpointHeader {
            id: self.id.clone(),
            created_at: self.created_at,
            run_created_at: self.run_created_at,
            fence: self.fence,
            park: self.pending.as_ref().map(PendingDecision::header),
        }
    }

    /// Validation every backend applies before a write (the same rules a read
    /// applies, so a checkpoint that was accepted can always be read back):
    /// no reserved key in the state, a `runId` in the state (if any) equal to
    /// the scope's, a valid park, and a bounded size.
    pub fn validate_for_write(&self, scope: &RunScope) -> Result<()> {
        for key in RESERVED_CHECKPOINT_KEYS {
            if self.state.contains_key(key) {
                return Err(Error::invalid(format!(
                    "checkpoint {} of run {}: its state uses the reserved key {key:?}; set that through the Checkpoint fields instead",
                    self.id, scope.run_id
                )));
            }
        }
        if let Some(v) = self.state.get("runId") {
            if v.as_str() != Some(scope.run_id.as_str()) {
                return Err(Error::invalid(format!(
                    "checkpoint {} names runId {v} but is being written to run {}",
                    self.id, scope.run_id
                )));
            }
        }
        if let Some(p) = &self.pending {
            p.validate().map_err(|e| {
                Error::invalid(format!(
                    "checkpoint {} of run {}: {e}",
                    self.id, scope.run_id
                ))
            })?;
        }
        let values = count_values(self.state.values(), MAX_CHECKPOINT_VALUES);
        if values > MAX_CHECKPOINT_VALUES {
            return Err(Error::invalid(format!(
                "checkpoint {} of run {} holds more than {MAX_CHECKPOINT_VALUES} JSON values; store large arrays as one string (e.g. base64) or elsewhere, referenced from the state",
                self.id, scope.run_id
            )));
        }
        let size = self.json_len();
        if size > MAX_CHECKPOINT_BYTES {
            return Err(Error::invalid(format!(
                "checkpoint {} of run {} is {size} bytes; the limit is {MAX_CHECKPOINT_BYTES}",
                self.id, scope.run_id
            )));
        }
        Ok(())
    }

    /// The compact length of [`Checkpoint::to_json`], computed without
    /// copying the state.
    /// The state holds no reserved key ([`Checkpoint::validate_for_write`] refuses
    /// them), so the two objects merge without overlap.
    pub fn json_len(&self) -> usize {
        let header = self.header_json();
        if self.state.is_empty() {
            return json_len(&header);
        }
        // `{h}` and `{s}` merged: `{h,s}` (the header is never empty).
        json_len(&header)
            .saturating_add(json_len(&self.state))
            .saturating_sub(1)
    }

    /// The header fields of [`Checkpoint::to_json`], without the state.
    fn header_json(&self) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("id".into(), Value::String(self.id.to_string()));
        if let Some(r) = self.run_created_at {
            out.insert("runCreatedAt".into(), Value::from(r.as_millis()));
        }
        out.insert("createdAt".into(), Value::from(self.created_at.as_millis()));
        if let Some(p) = &self.pending {
            out.insert("pending".into(), p.to_json());
        }
        if let Some(f) = self.fence {
            out.insert("fence".into(), Value::from(f.get()));
        }
        out
    }

    /// The flat JSON object form (state ∪ header fields) used on disk and in
    /// database rows. Field names follow the reference layout (`id`,
    /// `createdAt`, `runCreatedAt`, `pending`); `fence` is additive.
    pub fn to_json(&self) -> Map<String, Value> {
        let mut out = self.state.clone();
        // The header wins over a state key of the same name (validation
        // refuses such keys; a read of foreign data keeps the header).
        out.extend(self.header_json());
        out
    }

    /// Parses the flat JSON object form. `schemaVersion` is left to the
    /// caller (it belongs to the storage format, not the checkpoint).
    pub fn from_json(mut obj: Map<String, Value>) -> Result<Self> {
        obj.remove("schemaVersion");
        let id = match obj.remove("id") {
            Some(Value::String(s)) => CheckpointId::new(s)?,
            _ => {
                return Err(Error::corrupted(
                    "not a usable checkpoint: missing string `id`",
                ))
            }
        };
        let created_at = match obj.remove("createdAt") {
            Some(v) => number_instant(&v).ok_or_else(|| {
                Error::corrupted(format!(
                    "checkpoint {id}: `createdAt` is not a valid instant"
                ))
            })?,
            None => {
                return Err(Error::corrupted(format!(
                    "checkpoint {id}: missing `createdAt`"
                )))
            }
        };
        let run_created_at = match obj.remove("runCreatedAt") {
            None | Some(Value::Null) => None,
            Some(v) => Some(number_instant(&v).ok_or_else(|| {
                Error::corrupted(format!(
                    "checkpoint {id}: `runCreatedAt` is not a valid instant"
                ))
            })?),
        };
        let fence = match obj.remove("fence") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().and_then(|n| Fence::new(n).ok()).ok_or_else(|| {
                Error::corrupted(format!("checkpoint {id}: `fence` {v} is not a fence"))
            })?),
        };
        let pending = match obj.remove("pending") {
            None | Some(Value::Null) => None,
            Some(v) => Some(PendingDecision::from_json(v).map_err(|e| {
                Error::corrupted(format!("checkpoint {id}: malformed `pending`: {e}"))
            })?),
        };
        Ok(Self {
            id,
            created_at,
            run_created_at,
            pending,
            fence,
            state: obj,
        })
    }
}

fn number_instant(v: &Value) -> Option<Timestamp> {
    if let Some(i) = v.as_i64() {
        return Timestamp::from_millis(i).ok();
    }
    v.as_f64().and_then(|f| Timestamp::from_f64(f).ok())
}

/// The fence history of a run's checkpoints.
pub fn history_of(cps: &[Checkpoint]) -> FenceHistory {
    FenceHistory::of(cps.iter().map(|c| (c.fence, c.created_at)))
}

/// Sorts checkpoints into the total order (oldest first).
pub fn sort_checkpoints(cps: &mut [Checkpoint]) {
    let history = history_of(cps);
    cps.sort_by_cached_key(|c| c.order_key(&history));
}

/// The latest checkpoint under the total order.
pub fn latest(cps: &[Checkpoint]) -> Option<&Checkpoint> {
    let history = history_of(cps);
    cps.iter().max_by_key(|c| c.order_key(&history))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_round_trip_preserves_state_and_header() {
        let raw = json!({
            "id": "cp_a", "runId": "run_a", "iteration": 3, "messages": [{"role": "user"}],
            "createdAt": 10, "runCreatedAt": 5, "fence": 2, "schemaVersion": 1,
            "pending": {"request": {"type": "tool_review", "x": 1}, "parkedAt": 9, "deadlineAt": 20}
        });
        let cp = Checkpoint::from_json(raw.as_object().unwrap().clone()).unwrap();
        assert_eq!(cp.fence, Some(Fence::new(2).unwrap()));
        assert_eq!(cp.state.get("iteration"), Some(&json!(3)));
        assert!(!cp.state.contains_key("schemaVersion"));
        let back = Checkpoint::from_json(cp.to_json()).unwrap();
        assert_eq!(back, cp);
    }

    #[test]
    fn json_len_is_the_compact_length_of_to_json() {
        for raw in [
            json!({"id": "cp_a", "createdAt": 10}),
            json!({"id": "cp_a", "createdAt": 10, "runId": "r", "xs": [1, [2, {"a": "é\"q"}]]}),
            json!({
                "id": "cp_b", "createdAt": 10, "runCreatedAt": 5, "fence": 7, "z": null,
                "pending": {"request": {"type": "t"}, "parkedAt": 9}
            }),
        ] {
            let cp = Checkpoint::from_json(raw.as_object().unwrap().clone()).unwrap();
            let text = serde_json::to_vec(&cp.to_json()).unwrap();
            assert_eq!(
                cp.json_len(),
                text.len(),
                "{}",
                String::from_utf8_lossy(&text)
            );
        }
    }

    #[test]
    fn too_many_values_are_refused_before_any_byte_limit() {
        let scope = RunScope::new(
            crate::TenantId::new("t").unwrap(),
            crate::ProjectId::new("p").unwrap(),
            crate::SessionId::new("s").unwrap(),
            crate::RunId::new("r").unwrap(),
        );
        let mut cp = Checkpoint::from_json(
            json!({"id": "cp_a", "createdAt": 10})
                .as_object()
                .unwrap()
                .clone(),
        )
        .unwrap();
        // MAX_CHECKPOINT_VALUES values in all (the array itself is one): accepted.
        cp.state.insert(
            "xs".into(),
            Value::Array(vec![Value::from(0); MAX_CHECKPOINT_VALUES - 1]),
        );
        cp.validate_for_write(&scope).unwrap();
        // One more: refused, saying what to do instead.
        cp.state.insert("y".into(), Value::from(1));
        let e = cp.validate_for_write(&scope).unwrap_err().to_string();
        assert!(e.contains("more than 1048576 JSON values"), "{e}");
        assert!(e.contains("as one string"), "{e}");
        assert_eq!(count_values([&json!([[1, 2], {"a": {}}])], 100), 6);
    }

    #[test]
    fn fence_orders_before_clock() {
        let mk = |id: &str, f: Option<u64>, at: i64| {
            let mut c = Checkpoint::new(
                CheckpointId::new(id).unwrap(),
                Timestamp::from_millis(at).unwrap(),
                Map::new(),
            );
            c.fence = f.map(|f| Fence::new(f).unwrap());
            c
        };
        let cps = vec![
            mk("cp_late_zombie", Some(1), 999),
            mk("cp_new_holder", Some(2), 5),
            mk("cp_b", Some(2), 5),
        ];
        assert_eq!(latest(&cps).unwrap().id.as_str(), "cp_new_holder");
    }

    fn mk(id: &str, f: Option<u64>, at: i64) -> Checkpoint {
        let mut c = Checkpoint::new(
            CheckpointId::new(id).unwrap(),
            Timestamp::from_millis(at).unwrap(),
            Map::new(),
        );
        c.fence = f.map(|f| Fence::new(f).unwrap());
        c
    }

    fn order(mut cps: Vec<Checkpoint>) -> Vec<String> {
        sort_checkpoints(&mut cps);
        cps.into_iter().map(|c| c.id.to_string()).collect()
    }

    #[test]
    fn a_reference_takeover_of_a_runkeep_run_is_latest() {
        // runkeep worked at fences 4 and 5; a reference worker took the
        // run over (fence 6, which it does not stamp) and checkpointed.
        let cps = vec![
            mk("cp_rk_a", Some(4), 10),
            mk("cp_rk_b", Some(5), 20),
            mk("cp_ref", None, 30),
        ];
        assert_eq!(latest(&cps).unwrap().id.as_str(), "cp_ref");
        // Then runkeep takes it back (fence 7) and resumes from it.
        let mut cps = cps;
        cps.push(mk("cp_rk_c", Some(7), 40));
        assert_eq!(order(cps), ["cp_rk_a", "cp_rk_b", "cp_ref", "cp_rk_c"]);
    }

    #[test]
    fn a_runkeep_takeover_of_a_reference_run_is_latest() {
        // The reference wrote (unstamped) under fences 1..3; runkeep took
        // over at 4.
        let cps = vec![
            mk("cp_ref_a", None, 10),
            mk("cp_ref_b", None, 20),
            mk("cp_rk", Some(4), 22),
        ];
        assert_eq!(order(cps.clone()), ["cp_ref_a", "cp_ref_b", "cp_rk"]);
        // The reference takes it back and writes again after runkeep.
        let mut cps = cps;
        cps.push(mk("cp_ref_c", None, 25));
        assert_eq!(latest(&cps).unwrap().id.as_str(), "cp_ref_c");
        // A zombie runkeep write at the superseded fence 4 still ranks
        // below the reference worker's checkpoint that followed fence 4.
        cps.push(mk("cp_rk_zombie", Some(4), 99));
        assert_eq!(latest(&cps).unwrap().id.as_str(), "cp_ref_c");
    }

    #[test]
    fn runs_written_by_one_side_keep_their_own_order() {
        let reference = vec![
            mk("cp_b", None, 20),
            mk("cp_a", None, 10),
            mk("cp_c", None, 20),
        ];
        assert_eq!(order(reference), ["cp_a", "cp_b", "cp_c"]);
        let ours = vec![mk("cp_x", Some(2), 5), mk("cp_y", Some(1), 50)];
        assert_eq!(order(ours), ["cp_y", "cp_x"]);
    }

    #[test]
    fn fence_history_noted_one_by_one_equals_the_history_built_at_once() {
        let points = [
            (Some(3), 50),
            (None, 10),
            (Some(1), 10),
            (Some(2), 40),
            (Some(2), 5),
            (Some(5), 40),
            (Some(4), 60),
            (Some(9), 1),
        ];
        let mut h = FenceHistory::default();
        for (i, (f, t)) in points.iter().enumerate() {
            let f = f.map(|f| Fence::new(f).unwrap());
            let t = Timestamp::from_millis(*t).unwrap();
            let before = h.clone();
            let changed = h.note(f, t);
            let all = FenceHistory::of(points[..=i].iter().map(|(f, t)| {
                (
                    f.map(|f| Fence::new(f).unwrap()),
                    Timestamp::from_millis(*t).unwrap(),
                )
            }));
            assert_eq!(h, all, "after {i}");
            assert_eq!(changed, before != h, "after {i}");
        }
    }

    #[test]
    fn write_validation_refuses_reserved_keys_and_foreign_run_ids() {
        let scope = RunScope::new(
            "tnt_a".parse().unwrap(),
            "prj_a".parse().unwrap(),
            "ses_a".parse().unwrap(),
            "run_a".parse().unwrap(),
        );
        let mut state = Map::new();
        state.insert("fence".into(), json!(99));
        let cp = Checkpoint::new("cp_a".parse().unwrap(), Timestamp::EPOCH, state);
        assert!(cp.validate_for_write(&scope).is_err());
        let mut state = Map::new();
        state.insert("runId".into(), json!("run_other"));
        let cp = Checkpoint::new("cp_a".parse().unwrap(), Timestamp::EPOCH, state);
        let err = cp.validate_for_write(&scope).unwrap_err();
        assert!(err.to_string().contains("run_other"), "{err}");
    }

    #[test]
    fn damaged_json_is_corrupted_not_a_panic() {
        for bad in [
            json!({}),
            json!({"id": "../x", "createdAt": 1}),
            json!({"id": "cp_a", "createdAt": "x"}),
            json!({"id": "cp_a", "createdAt": -1}),
            json!({"id":"cp_a","createdAt":1,"pending":{"parkedAt":1}}),
        ] {
            assert!(
                Checkpoint::from_json(bad.as_object().unwrap().clone()).is_err(),
                "{bad}"
            );
        }
    }
}
