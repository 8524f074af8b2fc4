//! Parks: a run waiting on a human decision.
//!
//! - State at an instant: `resolved` if answered (checked first, so an answer
//!   after the deadline still reads resolved), else `expired` if a deadline is
//!   set and `now >= deadline`, else `outstanding`.
//! - Precedence over a run's parks: outstanding > expired > resolved; within a
//!   state, the latest checkpoint under the total order wins. The listing and
//!   the pending lookup use the same rule, so they always agree on *which*
//!   park, not only on whether.
//! - Resolution is compare-and-set: only an unanswered park can be answered; a
//!   second answer is refused with [`Error::Conflict`] and changes nothing.
//! - Pruning never deletes an unanswered park.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::checkpoint::{
    history_of, Checkpoint, CheckpointHeader, FenceHistory, OrderKey, ParkHeader,
};
use crate::error::{Error, Result};
use crate::id::CheckpointId;
use crate::time::Timestamp;

/// The three states of a park. Closed on purpose: claim state is a sibling.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParkState {
    /// Waiting for an answer.
    Outstanding,
    /// The deadline passed without an answer.
    Expired,
    /// Answered.
    Resolved,
}

impl ParkState {
    fn rank(self) -> u8 {
        match self {
            ParkState::Outstanding => 2,
            ParkState::Expired => 1,
            ParkState::Resolved => 0,
        }
    }

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ParkState::Outstanding => "outstanding",
            ParkState::Expired => "expired",
            ParkState::Resolved => "resolved",
        }
    }
}

impl std::str::FromStr for ParkState {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "outstanding" => Ok(ParkState::Outstanding),
            "expired" => Ok(ParkState::Expired),
            "resolved" => Ok(ParkState::Resolved),
            other => Err(Error::invalid(format!(
                "park state {other:?} is not one of outstanding, expired, resolved"
            ))),
        }
    }
}

/// The park rule.
pub fn park_state(
    resolved_at: Option<Timestamp>,
    deadline_at: Option<Timestamp>,
    now: Timestamp,
) -> ParkState {
    if resolved_at.is_some() {
        ParkState::Resolved
    } else if deadline_at.is_some_and(|d| now >= d) {
        ParkState::Expired
    } else {
        ParkState::Outstanding
    }
}

/// A run's pending human decision, recorded on the checkpoint it parked at.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingDecision {
    /// The human-facing request; must carry a string `type`.
    pub request: Map<String, Value>,
    /// When the run parked.
    pub parked_at: Timestamp,
    /// Absolute deadline, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<Timestamp>,
    /// When it was answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<Timestamp>,
    /// The answer, kept as evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Value>,
    /// Any other fields, preserved.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl PendingDecision {
    /// A new, unanswered park.
    pub fn new(request_type: &str, mut request: Map<String, Value>, parked_at: Timestamp) -> Self {
        request.insert("type".into(), Value::String(request_type.to_string()));
        Self {
            request,
            parked_at,
            deadline_at: None,
            resolved_at: None,
            decision: None,
            extra: Map::new(),
        }
    }

    /// With an absolute deadline.
    pub fn with_deadline(mut self, at: Timestamp) -> Self {
        self.deadline_at = Some(at);
        self
    }

    /// `request.type`.
    pub fn request_type(&self) -> &str {
        self.request
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// State at `now`.
    pub fn state(&self, now: Timestamp) -> ParkState {
        park_state(self.resolved_at, self.deadline_at, now)
    }

    /// The header the store reads.
    pub fn header(&self) -> ParkHeader {
        ParkHeader {
            request_type: self.request_type().to_string(),
            parked_at: self.parked_at,
            deadline_at: self.deadline_at,
            resolved_at: self.resolved_at,
        }
    }

    /// Checks the park's shape.
    pub fn validate(&self) -> Result<()> {
        match self.request.get("type") {
            Some(Value::String(t)) if !t.is_empty() => Ok(()),
            _ => Err(Error::invalid(
                "park request must carry a non-empty string `type`",
            )),
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    pub(crate) fn from_json(v: Value) -> Result<Self> {
        let p: PendingDecision =
            serde_json::from_value(v).map_err(|e| Error::corrupted(e.to_string()))?;
        p.validate().map_err(|e| Error::corrupted(e.to_string()))?;
        Ok(p)
    }
}

/// The park summary on a listing row.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkSummary {
    /// State at the page's `now`.
    pub state: ParkState,
    /// The checkpoint that parked.
    pub checkpoint_id: CheckpointId,
    /// `request.type`.
    pub request_type: String,
    /// Parked at.
    pub parked_at: Timestamp,
    /// Deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at: Option<Timestamp>,
    /// Answered at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<Timestamp>,
}

/// The precedence rule over a run's checkpoint headers: the park a listing
/// row shows. `history` is the run's [`FenceHistory`] (over all its
/// checkpoints, not only the parked ones).
pub fn park_precedence<'a>(
    headers: impl IntoIterator<Item = &'a CheckpointHeader>,
    history: &FenceHistory,
    now: Timestamp,
) -> Option<ParkSummary> {
    let mut best: Option<(u8, OrderKey, ParkSummary)> = None;
    for h in headers {
        let Some(p) = &h.park else { continue };
        let state = p.state(now);
        let key = (state.rank(), h.order_key(history));
        if best.as_ref().is_none_or(|(r, k, _)| key > (*r, k.clone())) {
            best = Some((
                key.0,
                key.1,
                ParkSummary {
                    state,
                    checkpoint_id: h.id.clone(),
                    request_type: p.request_type.clone(),
                    parked_at: p.parked_at,
                    deadline_at: p.deadline_at,
                    resolved_at: p.resolved_at,
                },
            ));
        }
    }
    best.map(|(_, _, s)| s)
}

/// The pending lookup: the latest (total order) checkpoint whose park is
/// outstanding at `now`. Agrees with [`park_precedence`] by construction,
/// and with [`crate::listing::RunDigest::pending_park`] over the same
/// checkpoints' headers (a test checks both).
pub fn find_pending(cps: &[Checkpoint], now: Timestamp) -> Option<&Checkpoint> {
    let history = history_of(cps);
    cps.iter()
        .filter(|c| {
            c.pending
                .as_ref()
                .is_some_and(|p| p.state(now) == ParkState::Outstanding)
        })
        .max_by_key(|c| c.order_key(&history))
}

/// Every checkpoint whose park expired unanswered at `now`.
pub fn expired_parks(cps: &[Checkpoint], now: Timestamp) -> Vec<&Checkpoint> {
    cps.iter()
        .filter(|c| {
            c.pending
                .as_ref()
                .is_some_and(|p| p.state(now) == ParkState::Expired)
        })
        .collect()
}

/// How a park is answered.
#[derive(Clone, PartialEq, Debug)]
pub enum ParkResolution {
    /// A human's answer.
    Answer(Value),
    /// Give up on an expired park: recorded as a pause (not a refusal).
    /// Refused unless the park has actually expired at `now`.
    Expire,
}

/// The compare-and-set rule: answers the park on `cp` at `now`, or refuses.
/// Backends apply it atomically with the write that records it.
pub fn resolve(cp: &mut Checkpoint, resolution: ParkResolution, now: Timestamp) -> Result<()> {
    let id = cp.id.clone();
    let Some(p) = cp.pending.as_mut() else {
        return Err(Error::Conflict {
            message: format!("checkpoint {id} is not parked; there is nothing to answer"),
        });
    };
    if let Some(at) = p.resolved_at {
        return Err(Error::Conflict {
            message: format!(
                "the park on checkpoint {id} was already answered at {at}; a second answer is refused"
            ),
        });
    }
    match resolution {
        ParkResolution::Answer(decision) => {
            p.decision = Some(decision);
        }
        ParkResolution::Expire => {
            if p.state(now) != ParkState::Expired {
                return Err(Error::Conflict {
                    message: format!(
                        "the park on checkpoint {id} has not expired at {now} (deadline {:?}); only an expired park can be expired",
                        p.deadline_at.map(|d| d.as_millis())
                    ),
                });
            }
            p.decision = Some(serde_json::json!({
                "action": "pause",
                "reason": "the park expired without an answer"
            }));
        }
    }
    p.resolved_at = Some(now);
    Ok(())
}

/// The pruning rule: which checkpoints to delete to keep the newest
/// `keep_last` (total order). Unanswered parks (outstanding or expired) are
/// never candidates, whatever their age.
pub fn prune_victims(cps: &[Checkpoint], keep_last: usize) -> Vec<CheckpointId> {
    let history = history_of(cps);
    let mut sorted: Vec<&Checkpoint> = cps.iter().collect();
    sorted.sort_by_cached_key(|c| c.order_key(&history));
    let removable = sorted.len().saturating_sub(keep_last);
    sorted
        .into_iter()
        .take(removable)
        .filter(|c| c.pending.as_ref().is_none_or(|p| p.resolved_at.is_some()))
        .map(|c| c.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Fence;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms).unwrap()
    }
    fn cp(id: &str, created: i64, park: Option<PendingDecision>) -> Checkpoint {
        let mut c = Checkpoint::new(id.parse().unwrap(), at(created), Map::new());
        c.pending = park;
        c.fence = Some(Fence::FIRST);
        c
    }
    fn park(parked: i64, deadline: Option<i64>) -> PendingDecision {
        let mut p = PendingDecision::new("tool_review", Map::new(), at(parked));
        p.deadline_at = deadline.map(at);
        p
    }

    #[test]
    fn state_rule_checks_resolved_first_and_boundary_is_expired() {
        assert_eq!(
            park_state(Some(at(1)), Some(at(0)), at(5)),
            ParkState::Resolved
        );
        assert_eq!(park_state(None, Some(at(5)), at(5)), ParkState::Expired);
        assert_eq!(park_state(None, Some(at(5)), at(4)), ParkState::Outstanding);
        assert_eq!(
            park_state(None, None, at(i64::from(i32::MAX))),
            ParkState::Outstanding
        );
    }

    #[test]
    fn a_live_park_beats_a_newer_resolved_one_and_lookup_agrees() {
        let mut resolved = park(50, None);
        resolved.resolved_at = Some(at(60));
        let cps = vec![
            cp("cp_a", 10, Some(park(10, None))),
            cp("cp_b", 50, Some(resolved)),
        ];
        let headers: Vec<_> = cps.iter().map(Checkpoint::header).collect();
        let s = park_precedence(&headers, &crate::checkpoint::history_of(&cps), at(100)).unwrap();
        assert_eq!(s.state, ParkState::Outstanding);
        assert_eq!(s.checkpoint_id.as_str(), "cp_a");
        assert_eq!(find_pending(&cps, at(100)).unwrap().id.as_str(), "cp_a");
    }

    #[test]
    fn second_answer_is_refused_and_changes_nothing() {
        let mut c = cp("cp_a", 1, Some(park(1, None)));
        resolve(
            &mut c,
            ParkResolution::Answer(serde_json::json!("yes")),
            at(5),
        )
        .unwrap();
        let before = c.clone();
        let err = resolve(
            &mut c,
            ParkResolution::Answer(serde_json::json!("no")),
            at(6),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Conflict { .. }), "{err}");
        assert_eq!(c, before);
        let mut not_parked = cp("cp_b", 1, None);
        assert!(resolve(&mut not_parked, ParkResolution::Answer(Value::Null), at(1)).is_err());
        let mut live = cp("cp_c", 1, Some(park(1, Some(100))));
        assert!(resolve(&mut live, ParkResolution::Expire, at(50)).is_err());
        resolve(&mut live, ParkResolution::Expire, at(100)).unwrap();
    }

    #[test]
    fn prune_never_deletes_an_unanswered_park() {
        let mut answered = park(2, None);
        answered.resolved_at = Some(at(3));
        let cps = vec![
            cp("cp_1", 1, Some(park(1, None))),
            cp("cp_2", 2, Some(answered)),
            cp("cp_3", 3, Some(park(3, Some(4)))),
            cp("cp_4", 4, None),
            cp("cp_5", 5, None),
        ];
        let victims = prune_victims(&cps, 1);
        let ids: Vec<_> = victims.iter().map(|v| v.as_str()).collect();
        assert_eq!(ids, ["cp_2", "cp_4"]);
    }

    #[test]
    fn the_digest_finds_the_same_pending_park_as_the_full_read() {
        // Outstanding, expired, resolved and unparked checkpoints, some
        // unstamped (their place depends on the fence history): at every
        // instant the digest's headers name the checkpoint find_pending
        // finds among the whole checkpoints.
        let mut resolved = park(30, None);
        resolved.resolved_at = Some(at(35));
        let mut cps = vec![
            cp("cp_1", 10, Some(park(10, Some(100)))),
            cp("cp_2", 20, None),
            cp("cp_3", 30, Some(resolved)),
            cp("cp_4", 40, Some(park(40, Some(60)))),
            cp("cp_5", 50, Some(park(50, None))),
        ];
        cps[1].fence = Some(Fence::new(3).unwrap());
        cps[4].fence = None;
        let digest = crate::listing::RunDigest::from_headers(
            cps.iter().map(|c| c.header()).collect::<Vec<_>>().iter(),
        );
        for now in [0, 45, 59, 60, 99, 100, 1_000] {
            assert_eq!(
                digest.pending_park(at(now)).map(|h| h.id.clone()),
                find_pending(&cps, at(now)).map(|c| c.id.clone()),
                "at {now}"
            );
        }
        cps.remove(4);
        let digest = crate::listing::RunDigest::from_headers(
            cps.iter().map(|c| c.header()).collect::<Vec<_>>().iter(),
        );
        assert_eq!(
            digest
                .pending_park(at(70))
                .map(|h| h.id.as_str().to_owned()),
            Some("cp_1".to_owned()),
            "cp_4 expired at 60, cp_1 outstanding until 100"
        );
        assert_eq!(
            digest.pending_park(at(100)),
            None,
            "every park expired or resolved"
        );
    }
}
