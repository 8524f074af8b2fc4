//! The atomic step commit (contract v2): everything one step of a run
//! writes — events, a checkpoint (a park is a checkpoint with `pending`),
//! the message snapshot, the run record and, for the last step, the finish —
//! in one call, under one fence check, all or nothing.
//!
//! Every part is validated before anything is written, so bad input changes
//! nothing. The memory store applies a step as one change under its lock; a
//! SQL backend as one transaction. The directory backend cannot make several
//! files change at once; it orders the writes so a crash between them leaves
//! at most what an at-least-once worker already tolerates (its
//! `docs/design/directory/lifecycle.md` says exactly what).

use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::evidence::{check_json_document, NewEvent, PersistedEvent, RunRecord};
use crate::id::RunId;
use crate::lease::{Fence, TopHolding};
use crate::lifecycle::{self, Lifecycle, Outcome};
use crate::scope::RunScope;
use crate::time::Timestamp;

/// A new message snapshot.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct MessagesUpdate {
    /// The conversation as of this step.
    pub messages: Vec<Value>,
    /// The last event the snapshot accounts for; `None` ⇒ the last event of
    /// this step (or, when the step appends none, the run's last event).
    pub through_event_seq: Option<u64>,
}

/// One step of a run.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct Step {
    /// Events to append, in order.
    pub events: Vec<NewEvent>,
    /// A checkpoint to write (with `pending` to park the run here).
    pub checkpoint: Option<Checkpoint>,
    /// A new message snapshot.
    pub messages: Option<MessagesUpdate>,
    /// A new run record.
    pub run_record: Option<RunRecord>,
    /// Finish the run with this step (its last).
    pub finish: Option<Outcome>,
}

impl Step {
    /// True when the step writes nothing.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.checkpoint.is_none()
            && self.messages.is_none()
            && self.run_record.is_none()
            && self.finish.is_none()
    }

    /// Validates every part against the same rules the single writes apply.
    pub fn validate(&self, scope: &RunScope) -> Result<()> {
        for e in &self.events {
            e.validate()?;
        }
        if let Some(cp) = &self.checkpoint {
            cp.validate_for_write(scope)?;
        }
        if let Some(m) = &self.messages {
            check_json_document("message snapshot", &m.messages, &m.messages)?;
        }
        if let Some(r) = &self.run_record {
            check_json_document("run record", r, r.values())?;
        }
        if let Some(o) = &self.finish {
            o.validate(&scope.run_id)?;
        }
        if self.is_empty() {
            return Err(Error::invalid(format!(
                "commit_step on run {}: the step writes nothing",
                scope.run_id
            )));
        }
        Ok(())
    }

    /// The `through_event_seq` a snapshot records, given the events this
    /// step appended and the run's last `seq` before it.
    pub fn through_seq(
        update: &MessagesUpdate,
        appended: &[PersistedEvent],
        last_seq_before: u64,
    ) -> u64 {
        update
            .through_event_seq
            .unwrap_or_else(|| appended.last().map(|e| e.seq).unwrap_or(last_seq_before))
    }
}

/// A step's finish, decided before anything of the step is applied (so a
/// refused finish leaves nothing): the lifecycle it records and the
/// tombstone that ends the lease.
#[derive(Clone, PartialEq, Debug)]
pub struct StepFinish {
    /// The lifecycle after the finish.
    pub lifecycle: Lifecycle,
    /// The tombstone's fence (`fence + 1`).
    pub tombstone: Fence,
}

impl StepFinish {
    /// Applies it to a run whose top holding and lifecycle are kept
    /// together (the memory store, a database row).
    pub fn apply(&self, top: &mut Option<TopHolding>, lifecycle: &mut Lifecycle) {
        *lifecycle = self.lifecycle.clone();
        *top = Some(TopHolding::Released {
            fence: self.tombstone,
        });
    }
}

impl Step {
    /// Decides the step's finish (if any) against the run's lifecycle at
    /// `now`: `Conflict` for a finished run, else what it will record.
    pub fn plan_finish(
        &self,
        run: &RunId,
        current: &Lifecycle,
        fence: Fence,
        now: Timestamp,
    ) -> Result<Option<StepFinish>> {
        let Some(o) = &self.finish else {
            return Ok(None);
        };
        Ok(Some(StepFinish {
            lifecycle: lifecycle::after_finish(run, current, o, fence, now)?,
            tombstone: fence.next(run)?,
        }))
    }
}

/// What a committed step wrote.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct StepReceipt {
    /// The events as recorded (with their `seq`).
    pub events: Vec<PersistedEvent>,
    /// The checkpoint as stored (with its fence).
    pub checkpoint: Option<Checkpoint>,
    /// The lifecycle after the step (set when the step finished the run).
    pub lifecycle: Option<Lifecycle>,
}
