//! What the index keeps of a run's row, and how it answers the filters.

use runkeep::listing::{ListQuery, RowKey};
use runkeep::park::ParkState;
use runkeep::scheduling::Priority;
use runkeep::{ListOrder, RunStatus, Timestamp, TopHolding};

use super::common::DirKey;
use crate::listing::RunRead;

/// When a run's park precedence changes state: what the park filter needs
/// at any instant, without the park headers.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub(super) struct ParkTimes {
    /// Some park is answered.
    pub(super) resolved: bool,
    /// Some unanswered park has no deadline (outstanding forever).
    pub(super) open_forever: bool,
    /// The latest deadline of an unanswered park (outstanding before it).
    pub(super) last_deadline: Option<Timestamp>,
    /// The earliest deadline of an unanswered park (expired from it on).
    pub(super) first_deadline: Option<Timestamp>,
}

impl ParkTimes {
    /// The state [`runkeep::park::park_precedence`] answers at `now`: the
    /// highest-ranked state of any park (outstanding, then expired, then
    /// resolved).
    pub(super) fn state(&self, now: Timestamp) -> Option<ParkState> {
        if self.open_forever || self.last_deadline.is_some_and(|d| now < d) {
            Some(ParkState::Outstanding)
        } else if self.first_deadline.is_some_and(|d| now >= d) {
            Some(ParkState::Expired)
        } else if self.resolved {
            Some(ParkState::Resolved)
        } else {
            None
        }
    }
}

/// What the index knows of a run's row.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Summary {
    pub(super) damaged: bool,
    pub(super) created: Option<Timestamp>,
    pub(super) status: RunStatus,
    pub(super) available_at: Option<Timestamp>,
    /// The live lease's expiry (a top holding that is a lease).
    pub(super) live_until: Option<Timestamp>,
    pub(super) park: ParkTimes,
    /// The run's priority (the priority order and `claim_next`'s order).
    pub(super) priority: Priority,
    /// The run's concurrency key and limit: `claim_next` skips the runs of
    /// a key at its limit without reading them.
    pub(crate) concurrency: Option<(String, u32)>,
    /// The run's deadline: a run past it is never skipped for its key (a
    /// claim finishes it first, `lifecycle::plan_claim`).
    pub(crate) deadline: Option<Timestamp>,
}

impl Summary {
    /// The summary of a run read as the walk reads it; `None` when the run
    /// is not a row.
    pub(crate) fn of(read: &RunRead) -> Option<Summary> {
        let created = read.created();
        let (digest, state) = match (&read.digest, &read.state) {
            (Ok(d), Ok(s)) => (d, s),
            _ => {
                return Some(Summary {
                    damaged: true,
                    created,
                    status: RunStatus::Active,
                    available_at: None,
                    live_until: None,
                    park: ParkTimes::default(),
                    priority: read
                        .state
                        .as_ref()
                        .map(|s| s.lifecycle.priority)
                        .unwrap_or_default(),
                    concurrency: None,
                    deadline: None,
                })
            }
        };
        if digest.latest.is_none() || digest.checkpoint_count == 0 {
            return None;
        }
        let mut park = ParkTimes::default();
        for h in &digest.parks {
            let Some(p) = &h.park else { continue };
            if p.resolved_at.is_some() {
                park.resolved = true;
                continue;
            }
            match p.deadline_at {
                None => park.open_forever = true,
                Some(d) => {
                    park.last_deadline = Some(park.last_deadline.map_or(d, |x| x.max(d)));
                    park.first_deadline = Some(park.first_deadline.map_or(d, |x| x.min(d)));
                }
            }
        }
        let live_until = match &state.top {
            Some(TopHolding::Lease { expires_at, .. }) => Some(*expires_at),
            _ => None,
        };
        Some(Summary {
            damaged: false,
            created,
            status: state.lifecycle.status,
            available_at: state.lifecycle.available_at,
            live_until,
            park,
            priority: state.lifecycle.priority,
            concurrency: state
                .lifecycle
                .concurrency
                .as_ref()
                .map(|c| (c.key.clone(), c.limit)),
            deadline: state.lifecycle.deadline,
        })
    }

    pub(super) fn unheld(&self, now: Timestamp) -> bool {
        self.live_until
            .is_none_or(|t| runkeep::lease::is_expired(t, now))
    }

    /// [`ListQuery::matches`] on the row this summarizes.
    pub(crate) fn matches(&self, q: &ListQuery) -> bool {
        if self.damaged {
            return true;
        }
        if let Some(states) = &q.park {
            match self.park.state(q.now) {
                Some(s) if states.contains(&s) => {}
                _ => return false,
            }
        }
        if q.min_priority.is_some_and(|p| self.priority < p) {
            return false;
        }
        if let Some(statuses) = &q.status {
            if !statuses.contains(&self.status) {
                return false;
            }
        }
        match q.claimed {
            None => true,
            Some(true) => !self.unheld(q.now),
            Some(false) => self.unheld(q.now),
        }
    }

    /// The key `claim_next` may skip this run for when the key is at its
    /// limit at `now` (none once its deadline passed).
    pub(crate) fn skippable_key(&self, now: Timestamp) -> Option<&(String, u32)> {
        crate::listing::skippable_key(self.concurrency.as_ref(), self.deadline, now)
    }

    /// An undamaged row whose lifecycle is finished (what a prune looks at).
    pub(crate) fn finished(&self) -> bool {
        !self.damaged && self.status.is_finished()
    }

    /// [`runkeep::RunRow::is_claimable`] on the row this summarizes.
    pub(crate) fn claimable(&self, now: Timestamp) -> bool {
        !self.damaged
            && !self.status.is_finished()
            && self.available_at.is_none_or(|at| now >= at)
            && self.unheld(now)
    }

    pub(super) fn key(&self, order: ListOrder, k: &DirKey) -> RowKey {
        let key = RowKey::new(order, &k.1, k.0.as_ref(), self.created);
        if order == ListOrder::Priority {
            key.with_priority(self.priority)
        } else {
            key
        }
    }

    /// The key `claim_next` takes the run in ([`runkeep::RunRow::claim_key`]).
    pub(super) fn claim_key(&self, order: ListOrder, k: &DirKey) -> RowKey {
        self.key(order, k).with_priority(self.priority)
    }
}
