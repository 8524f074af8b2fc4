//! Recurring schedules on the wire ([`runkeep::scheduling::schedule`]):
//! a schedule's body, a listing entry, the cursor's compare-and-set, and
//! the path and query of the schedule routes.

use runkeep::scheduling::schedule::{MissedTicks, Schedule, ScheduleEntry, ScheduledRunOptions};
use runkeep::{ListingScope, Priority, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::problem::Problem;

/// Which missed-tick policy.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum MissedPolicy {
    /// Only the newest due tick is enqueued.
    Skip,
    /// The newest `max` due ticks, oldest first.
    CatchUp,
}

/// The missed-tick policy: `skip` (only the newest due tick is enqueued)
/// or `catchUp` with `max` (the newest `max` due ticks, oldest first).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MissedBody {
    /// `skip` or `catchUp`.
    pub policy: MissedPolicy,
    /// With `catchUp` (and only then): at most this many ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1000)]
    pub max: Option<u32>,
}

/// A recurring schedule: a cron in a time zone that enqueues one run per
/// tick (id `run_<name>-<YYYYMMDDTHHMMSSZ>`) into its session.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleBody {
    /// Unique in its session: 1 to 64 characters of [A-Za-z0-9_-]. On a
    /// put, the path's name (a body naming another is refused).
    #[serde(default)]
    pub name: String,
    /// 5 fields (minute first) or 6 (seconds first).
    #[schema(min_length = 1, max_length = 256)]
    pub cron: String,
    /// An IANA time zone (default `UTC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Each run's `input` (its first checkpoint's state).
    #[serde(default)]
    pub input: Value,
    /// The missed-tick policy (default `skip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<MissedBody>,
    /// Each run's priority (higher runs first).
    #[serde(default)]
    #[schema(minimum = -1_000_000, maximum = 1_000_000)]
    pub priority: i32,
    /// Each run's concurrency key and limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<super::ConcurrencyBody>,
    /// Each run's attempt limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub max_attempts: Option<u32>,
    /// How long each run is kept once finished, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 31_622_400_000_i64)]
    pub retention_ms: Option<u64>,
    /// No tick is due while paused.
    #[serde(default)]
    pub paused: bool,
    /// When it was created (epoch ms; on a create, default the store's
    /// clock; kept by later puts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub created_at: Option<i64>,
    /// When it was last resumed (epoch ms): no tick at or before is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub resumed_at: Option<i64>,
    /// The last tick enqueued (epoch ms; answers only: a put never moves it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub cursor: Option<i64>,
    /// The next tick a scheduler would enqueue (answers only; none while paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub next_tick: Option<i64>,
    /// The run of the last tick enqueued (answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<String>,
}

impl ScheduleBody {
    /// The wire form of `s` at `now` (for its next tick).
    pub fn of(s: &Schedule, now: Timestamp) -> Self {
        Self {
            name: s.name.clone(),
            cron: s.cron.clone(),
            timezone: Some(s.timezone.clone()),
            input: s.input.clone(),
            missed: Some(match s.missed {
                MissedTicks::Skip => MissedBody {
                    policy: MissedPolicy::Skip,
                    max: None,
                },
                MissedTicks::CatchUp { max } => MissedBody {
                    policy: MissedPolicy::CatchUp,
                    max: Some(max),
                },
            }),
            priority: s.options.priority.get(),
            concurrency: s.options.concurrency.as_ref().map(Into::into),
            max_attempts: s.options.max_attempts,
            retention_ms: s.options.retention_ms,
            paused: s.paused,
            created_at: Some(s.created_at.as_millis()),
            resumed_at: s.resumed_at.map(Timestamp::as_millis),
            cursor: s.cursor.map(Timestamp::as_millis),
            next_tick: s.next_tick(now).map(Timestamp::as_millis),
            last_run: s.last_run().map(|r| r.to_string()),
        }
    }

    /// The core schedule (`created_at` defaulting to `now`), validated.
    pub fn to_schedule(&self, now: Timestamp) -> Result<Schedule, Problem> {
        let bad = |f: &str, e: runkeep::Error| Problem::from(e).with_field(f);
        let missed = match &self.missed {
            None => MissedTicks::Skip,
            Some(m) => match (m.policy, m.max) {
                (MissedPolicy::Skip, None) => MissedTicks::Skip,
                (MissedPolicy::CatchUp, Some(max)) => MissedTicks::CatchUp { max },
                _ => {
                    return Err(Problem::invalid(
                        "missed",
                        "missed is {\"policy\":\"skip\"} or {\"policy\":\"catchUp\",\"max\":N}",
                    ))
                }
            },
        };
        let created_at = match self.created_at {
            Some(ms) => Timestamp::from_millis(ms).map_err(|e| bad("createdAt", e))?,
            None => now,
        };
        let mut s = Schedule::new(self.name.clone(), self.cron.clone(), created_at);
        if let Some(tz) = &self.timezone {
            s.timezone = tz.clone();
        }
        s.input = self.input.clone();
        s.missed = missed;
        s.paused = self.paused;
        s.resumed_at = self
            .resumed_at
            .map(Timestamp::from_millis)
            .transpose()
            .map_err(|e| bad("resumedAt", e))?;
        s.cursor = self
            .cursor
            .map(Timestamp::from_millis)
            .transpose()
            .map_err(|e| bad("cursor", e))?;
        s.options = ScheduledRunOptions {
            priority: Priority::new(i64::from(self.priority)).map_err(|e| bad("priority", e))?,
            concurrency: self
                .concurrency
                .as_ref()
                .map(|c| c.to_concurrency("concurrency"))
                .transpose()?,
            max_attempts: self.max_attempts,
            retention_ms: self.retention_ms,
        };
        s.validate().map_err(Problem::from)?;
        Ok(s)
    }
}

/// A schedule with its session (a listing's entry).
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleEntryBody {
    /// Its tenant.
    pub tenant_id: String,
    /// Its project.
    pub project_id: String,
    /// Its session.
    pub session_id: String,
    /// The schedule.
    pub schedule: ScheduleBody,
}

impl ScheduleEntryBody {
    /// The wire form of `e` at `now`.
    pub fn of(e: &ScheduleEntry, now: Timestamp) -> Self {
        Self {
            tenant_id: e.session.tenant_id().to_string(),
            project_id: e
                .session
                .project_id()
                .map(ToString::to_string)
                .unwrap_or_default(),
            session_id: e
                .session
                .session_id()
                .map(ToString::to_string)
                .unwrap_or_default(),
            schedule: ScheduleBody::of(&e.schedule, now),
        }
    }

    /// The core entry.
    pub fn to_entry(&self) -> Result<ScheduleEntry, Problem> {
        let session = ListingScope::session(
            self.tenant_id.parse().map_err(Problem::from)?,
            self.project_id.parse().map_err(Problem::from)?,
            self.session_id.parse().map_err(Problem::from)?,
        );
        Ok(ScheduleEntry {
            session,
            schedule: self.schedule.to_schedule(Timestamp::EPOCH)?,
        })
    }
}

/// The schedules under a scope, by session then name.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleList {
    /// The schedules.
    pub schedules: Vec<ScheduleEntryBody>,
}

/// One schedule, or `null` when there is none.
#[derive(Clone, PartialEq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaybeSchedule {
    /// The schedule.
    pub schedule: Option<ScheduleBody>,
}

/// The cursor's compare-and-set: move it from `from` (absent: no cursor)
/// to `to`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdvanceScheduleBody {
    /// The cursor the caller read (epoch ms; absent: none yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub from: Option<i64>,
    /// The new cursor (epoch ms), after `from`.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub to: i64,
}

/// The path of a schedule route.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SchedulePath {
    /// The tenant id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub tenant: String,
    /// The project id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub project: String,
    /// The session id: 1 to 128 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")]
    pub session: String,
    /// The schedule's name: 1 to 64 characters of [A-Za-z0-9_-], starting with a letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub schedule: String,
}

/// The query of the schedule listing: a project, and a session in it, to
/// narrow the tenant's schedules to.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListSchedulesQuery {
    /// Only this project's schedules.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub project: Option<String>,
    /// Only this session's (with `project`).
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$"
    )]
    pub session: Option<String>,
}
