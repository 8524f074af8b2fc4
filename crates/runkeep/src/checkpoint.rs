//! Checkpoints: the header the store reads, the host's opaque state, and the
//! one total order every backend uses for "latest".
//!
//! # The total order
//!
//! Checkpoints of a run are ordered by [`OrderKey`] = `(fence, created_at, id)`.
//! Every checkpoint carries the fence it was written under (the presented
//! fence, or for an unfenced write the run's fence at the time; none if the
//! run was never claimed), so a superseded holder's late write can never
//! outrank anything its successor wrote, whatever its clock says. "Latest",
//! the resume point, pending lookup and pruning all use this one order.

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

/// The total order key `(fence, created_at, id)`; `None` fences sort first.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct OrderKey(pub Option<Fence>, pub Timestamp, pub CheckpointId);

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
    /// The total-order key.
    pub fn order_key(&self) -> OrderKey {
        OrderKey(self.fence, self.created_at, self.id.clone())
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

    /// The total-order key.
    pub fn order_key(&self) -> OrderKey {
        OrderKey(self.fence, self.created_at, self.id.clone())
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
        let size = serde_json::to_vec(&self.to_json())
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_CHECKPOINT_BYTES {
            return Err(Error::invalid(format!(
                "checkpoint {} of run {} is {size} bytes; the limit is {MAX_CHECKPOINT_BYTES}",
                self.id, scope.run_id
            )));
        }
        Ok(())
    }

    /// The flat JSON object form (state ∪ header fields) used on disk and in
    /// database rows. Field names follow the reference layout (`id`,
    /// `createdAt`, `runCreatedAt`, `pending`); `fence` is additive.
    pub fn to_json(&self) -> Map<String, Value> {
        let mut out = Map::new();
        out.insert("id".into(), Value::String(self.id.to_string()));
        for (k, v) in &self.state {
            out.insert(k.clone(), v.clone());
        }
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

/// Sorts checkpoints into the total order (oldest first).
pub fn sort_checkpoints(cps: &mut [Checkpoint]) {
    cps.sort_by_key(Checkpoint::order_key);
}

/// The latest checkpoint under the total order.
pub fn latest(cps: &[Checkpoint]) -> Option<&Checkpoint> {
    cps.iter().max_by_key(|c| c.order_key())
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
