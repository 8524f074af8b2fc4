//! Recurring schedules: a cron expression in a time zone that enqueues one
//! run per tick (docs/design/schedules.md).
//!
//! # The rules
//!
//! - A [`Schedule`] lives in one session (the queue its runs go to) under a
//!   name unique in that session. Its runs are enqueued there.
//! - **One run per tick, whoever enqueues it.** The run of the tick at
//!   instant `t` has the id [`run_id_for`]`(name, t)`: `run_`, the name, a
//!   dash and the tick in UTC (`run_nightly-20261206T212130Z`; the tick is a
//!   fixed 16 characters, so the id names one schedule and one tick; `run_`
//!   because a directory store lists only `run_*` runs). Any number
//!   of schedulers (CLI loops, servers) enqueue the same tick under the same
//!   id; the store's `enqueue` answers `Conflict` to all but the first, and a
//!   scheduler counts that as done. No lock between schedulers is needed for
//!   exactly-once: the run id is the lock.
//! - **The cursor** is the last tick enqueued. Only
//!   [`CheckpointStore::advance_schedule`]
//!   moves it, compare-and-set ([`advance`]): a scheduler that read an old
//!   cursor cannot move it back. A put keeps the stored cursor and
//!   `created_at` ([`on_put`]).
//! - **Due ticks** ([`ticks_due`]) are the cron's instants strictly after
//!   the schedule's *base* (the cursor, else `created_at`, and never before
//!   `resumed_at`) and at or before `now`. None while paused.
//! - **Missed ticks** (several due at once: nothing ran the scheduler for a
//!   while) follow the schedule's [`MissedTicks`]: `Skip` enqueues only the
//!   newest due tick; `CatchUp { max }` enqueues the newest `max` of them,
//!   oldest first. The ticks before those are skipped for good (the cursor
//!   moves past them).
//! - Pausing stops ticks; resuming sets `resumed_at`, so ticks that fell in
//!   the pause are not due (a pause is not a miss).
//! - [`run_due`] is the scheduler's one pass, shared by `runkeep schedule
//!   run` and `runkeep serve`: for each schedule, enqueue each due tick
//!   (a `Conflict` counts as enqueued by another), then advance the cursor to
//!   the last tick handled.

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::id::{CheckpointId, RunId};
use crate::lifecycle::EnqueueOptions;
use crate::scheduling::{Concurrency, Priority};
use crate::scope::{ListingScope, RunScope};
use crate::store::CheckpointStore;
use crate::time::{Timestamp, Ttl};

/// The longest schedule name, in bytes (the run id adds 21).
pub const MAX_NAME_LEN: usize = 64;
/// The most missed ticks one catch-up enqueues.
pub const MAX_CATCH_UP: u32 = 1000;
/// The largest serialized input, in bytes (64 KiB).
pub const MAX_INPUT_BYTES: usize = 64 * 1024;
/// The id of the first checkpoint of every scheduled run.
pub const FIRST_CHECKPOINT: &str = "scheduled";

/// What happens to ticks that fell due while no scheduler ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "camelCase")]
pub enum MissedTicks {
    /// Enqueue only the newest due tick; the older ones are skipped.
    #[default]
    Skip,
    /// Enqueue the newest `max` due ticks, oldest first (1 to
    /// [`MAX_CATCH_UP`]); older ones are skipped.
    CatchUp {
        /// At most this many ticks per catch-up.
        max: u32,
    },
}

impl MissedTicks {
    /// How many of the due ticks are enqueued (the newest ones).
    pub fn keep(self) -> usize {
        match self {
            MissedTicks::Skip => 1,
            MissedTicks::CatchUp { max } => max as usize,
        }
    }

    /// Parses `skip` or `catch-up[:MAX]` (MAX default 100).
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(format!(
                "missed-tick policy {text:?}: use skip, catch-up or catch-up:MAX (MAX 1 to {MAX_CATCH_UP})"
            ))
        };
        match text {
            "skip" => Ok(MissedTicks::Skip),
            "catch-up" | "catchup" => Ok(MissedTicks::CatchUp { max: 100 }),
            _ => {
                let max = text
                    .strip_prefix("catch-up:")
                    .or_else(|| text.strip_prefix("catchup:"))
                    .ok_or_else(bad)?
                    .parse::<u32>()
                    .map_err(|_| bad())?;
                let p = MissedTicks::CatchUp { max };
                p.validate()?;
                Ok(p)
            }
        }
    }

    /// Refuses a catch-up of 0 or above [`MAX_CATCH_UP`].
    pub fn validate(self) -> Result<()> {
        if let MissedTicks::CatchUp { max } = self {
            if max == 0 || max > MAX_CATCH_UP {
                return Err(Error::invalid(format!(
                    "catch-up max {max} is out of range; catch up 1 to {MAX_CATCH_UP} missed ticks (or skip them)"
                )));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for MissedTicks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MissedTicks::Skip => f.write_str("skip"),
            MissedTicks::CatchUp { max } => write!(f, "catch-up:{max}"),
        }
    }
}

/// The enqueue options each run of a schedule gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledRunOptions {
    /// Its priority.
    #[serde(default, skip_serializing_if = "Priority::is_default")]
    pub priority: Priority,
    /// Its concurrency key and limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// Its attempt limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// How long it is kept once finished, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<u64>,
}

impl ScheduledRunOptions {
    /// The enqueue options of one run.
    pub fn enqueue_options(&self) -> Result<EnqueueOptions> {
        Ok(EnqueueOptions {
            priority: self.priority,
            concurrency: self.concurrency.clone(),
            max_attempts: self.max_attempts,
            retention: self.retention_ms.map(Ttl::from_millis).transpose()?,
            ..EnqueueOptions::default()
        })
    }
}

/// A recurring schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Schedule {
    /// Unique in its session: 1 to [`MAX_NAME_LEN`] bytes of the id alphabet.
    pub name: String,
    /// A cron expression: 5 fields (minute first) or 6 (seconds first).
    pub cron: String,
    /// An IANA time zone (`UTC`, `Europe/Paris`): the cron's wall clock.
    #[serde(default = "utc")]
    pub timezone: String,
    /// The `input` of each run's first checkpoint.
    #[serde(default)]
    pub input: Value,
    /// The missed-tick policy.
    #[serde(default)]
    pub missed: MissedTicks,
    /// Each run's enqueue options.
    #[serde(default)]
    pub options: ScheduledRunOptions,
    /// No tick is due while paused.
    #[serde(default)]
    pub paused: bool,
    /// When it was created (kept by later puts).
    pub created_at: Timestamp,
    /// When it was last resumed: no tick at or before is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<Timestamp>,
    /// The last tick enqueued (moved only by `advance_schedule`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Timestamp>,
}

fn utc() -> String {
    "UTC".into()
}

impl Schedule {
    /// A schedule created at `now`: UTC, input `null`, `Skip`, not paused.
    pub fn new(name: impl Into<String>, cron: impl Into<String>, now: Timestamp) -> Self {
        Self {
            name: name.into(),
            cron: cron.into(),
            timezone: utc(),
            input: Value::Null,
            missed: MissedTicks::Skip,
            options: ScheduledRunOptions::default(),
            paused: false,
            created_at: now,
            resumed_at: None,
            cursor: None,
        }
    }

    /// Refuses a bad name, cron, time zone, policy, input or options.
    pub fn validate(&self) -> Result<()> {
        check_name(&self.name)?;
        parse_cron(&self.cron)?;
        parse_zone(&self.timezone)?;
        self.missed.validate()?;
        let size = serde_json::to_vec(&self.input)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_INPUT_BYTES {
            return Err(Error::invalid(format!(
                "schedule {:?}: the input is {size} bytes; the limit is {MAX_INPUT_BYTES}",
                self.name
            )));
        }
        let probe = RunId::new(format!("run_{}-20000101T000000Z", self.name))?;
        self.options.enqueue_options()?.validate(&probe)?;
        if self.next_tick_after(self.base()).is_none() {
            return Err(Error::invalid(format!(
                "schedule {:?}: cron {:?} never fires after its creation",
                self.name, self.cron
            )));
        }
        Ok(())
    }

    /// Ticks are due strictly after this instant.
    pub fn base(&self) -> Timestamp {
        let mut base = self.created_at;
        if let Some(r) = self.resumed_at {
            base = base.max(r);
        }
        if let Some(c) = self.cursor {
            base = base.max(c);
        }
        base
    }

    /// The first tick strictly after `after` (`None`: the cron never fires
    /// again, or the schedule does not parse).
    pub fn next_tick_after(&self, after: Timestamp) -> Option<Timestamp> {
        let cron = parse_cron(&self.cron).ok()?;
        let tz = parse_zone(&self.timezone).ok()?;
        next_after(&cron, tz, after)
    }

    /// Pauses or resumes it at `now`: a resume of a paused schedule sets
    /// `resumed_at`, so the ticks of the pause are not due.
    pub fn set_paused(&mut self, paused: bool, now: Timestamp) {
        if self.paused && !paused {
            self.resumed_at = Some(now);
        }
        self.paused = paused;
    }

    /// The next tick a scheduler would enqueue at `now` (`None` while
    /// paused).
    pub fn next_tick(&self, now: Timestamp) -> Option<Timestamp> {
        if self.paused {
            return None;
        }
        self.next_tick_after(self.base().max(now.offset(-1)))
    }

    /// The run id of the last tick enqueued.
    pub fn last_run(&self) -> Option<RunId> {
        self.cursor.map(|t| run_id_for(&self.name, t))
    }
}

/// Refuses a name no schedule can have.
pub fn check_name(name: &str) -> Result<()> {
    if name.len() > MAX_NAME_LEN {
        return Err(Error::invalid(format!(
            "schedule name {name:?} is {} bytes long; the limit is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    RunId::new(name).map_err(|e| {
        Error::invalid(format!(
            "schedule name {name:?}: {}",
            e.to_string().trim_start_matches("invalid input: ")
        ))
    })?;
    Ok(())
}

fn parse_cron(text: &str) -> Result<Cron> {
    Cron::new(text)
        .with_seconds_optional()
        .parse()
        .map_err(|e| Error::invalid(format!("cron expression {text:?}: {e}")))
}

fn parse_zone(text: &str) -> Result<Tz> {
    Tz::from_str(text).map_err(|_| {
        Error::invalid(format!(
            "time zone {text:?} is not an IANA zone name (such as UTC or Europe/Paris)"
        ))
    })
}

fn to_chrono(t: Timestamp, tz: Tz) -> DateTime<Tz> {
    tz.from_utc_datetime(
        &DateTime::<Utc>::from_timestamp_millis(t.as_millis())
            .unwrap_or_default()
            .naive_utc(),
    )
}

fn next_after(cron: &Cron, tz: Tz, after: Timestamp) -> Option<Timestamp> {
    let next = cron
        .find_next_occurrence(&to_chrono(after, tz), false)
        .ok()?;
    let t = Timestamp::from_millis(next.timestamp_millis()).ok()?;
    (t > after).then_some(t)
}

/// The run id of `name`'s tick at `tick`: `run_{name}-{YYYYMMDDTHHMMSSZ}`
/// (the tick in UTC; a tick is a whole second).
pub fn run_id_for(name: &str, tick: Timestamp) -> RunId {
    let at = DateTime::<Utc>::from_timestamp_millis(tick.as_millis()).unwrap_or_default();
    RunId::new(format!("run_{name}-{}", at.format("%Y%m%dT%H%M%SZ")))
        .expect("a checked schedule name and a UTC instant make a valid run id")
}

/// The ticks to enqueue at `now`, oldest first: the newest
/// [`MissedTicks::keep`] of the cron's instants in `(base, now]`; none
/// while paused. Reads only the instants it may return (plus a bounded
/// search back from `now`), however long nothing ran.
pub fn ticks_due(schedule: &Schedule, now: Timestamp) -> Result<Vec<Timestamp>> {
    if schedule.paused {
        return Ok(Vec::new());
    }
    let cron = parse_cron(&schedule.cron)?;
    let tz = parse_zone(&schedule.timezone)?;
    let base = schedule.base();
    if now <= base {
        return Ok(Vec::new());
    }
    let keep = schedule.missed.keep();
    // Look back from `now` over a doubling span until it holds `keep` ticks
    // or reaches the base: never walks the whole gap tick by tick.
    let mut span: i64 = 60_000;
    loop {
        let from = now.offset(-span).max(base);
        let mut ticks = Vec::new();
        let mut at = from;
        while let Some(t) = next_after(&cron, tz, at) {
            if t > now {
                break;
            }
            ticks.push(t);
            at = t;
        }
        if ticks.len() >= keep || from == base {
            let cut = ticks.len().saturating_sub(keep);
            return Ok(ticks.split_off(cut));
        }
        span = span.saturating_mul(2);
    }
}

/// The stored schedule after a put of `incoming` over `existing` at `now`
/// (the store's clock): a new one starts with no cursor; a replacement
/// keeps the stored `created_at` and cursor (only `advance_schedule` moves
/// it), and one that resumes a paused schedule without a newer
/// `resumed_at` of its own is resumed at `now` (so every client's resume
/// drops the pause's ticks).
pub fn on_put(
    existing: Option<&Schedule>,
    incoming: &Schedule,
    now: Timestamp,
) -> Result<Schedule> {
    incoming.validate()?;
    let mut stored = incoming.clone();
    match existing {
        None => stored.cursor = None,
        Some(old) => {
            stored.created_at = old.created_at;
            stored.cursor = old.cursor;
            if old.paused && !incoming.paused && incoming.resumed_at <= old.resumed_at {
                stored.resumed_at = Some(now);
            }
        }
    }
    Ok(stored)
}

/// The cursor's compare-and-set: moves `stored` to `to` and answers true
/// only when its cursor is `from`; `InvalidInput` unless `to` is after
/// `from` (a cursor never moves back).
pub fn advance(stored: &mut Schedule, from: Option<Timestamp>, to: Timestamp) -> Result<bool> {
    if from.is_some_and(|f| to <= f) {
        return Err(Error::invalid(format!(
            "advance of schedule {:?}: the new cursor {to} is not after {}",
            stored.name,
            from.map(|f| f.to_string()).unwrap_or_default()
        )));
    }
    if stored.cursor != from {
        return Ok(false);
    }
    stored.cursor = Some(to);
    Ok(true)
}

/// The scope a schedule lives in must name a session.
pub fn session_of(scope: &ListingScope) -> Result<ListingScope> {
    match (scope.project_id(), scope.session_id()) {
        (Some(p), Some(s)) => Ok(ListingScope::session(
            scope.tenant_id().clone(),
            p.clone(),
            s.clone(),
        )),
        _ => Err(Error::invalid(format!(
            "a schedule lives in one session (its runs' queue); scope {scope} names no session"
        ))),
    }
}

/// Whether a schedule of `session` is listed under `scope` (a tenant,
/// project or session prefix).
pub fn is_under(session: &ListingScope, scope: &ListingScope) -> bool {
    session.tenant_id() == scope.tenant_id()
        && scope
            .project_id()
            .is_none_or(|p| session.project_id() == Some(p))
        && scope
            .session_id()
            .is_none_or(|s| session.session_id() == Some(s))
}

/// The listing's order: by tenant, project, session, then name.
pub fn sort_entries(entries: &mut [ScheduleEntry]) {
    entries.sort_by(|a, b| {
        let key = |e: &ScheduleEntry| {
            (
                e.session.tenant_id().clone(),
                e.session.project_id().cloned(),
                e.session.session_id().cloned(),
                e.schedule.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
}

/// The refusal of an operation on a schedule that does not exist.
pub fn not_found(session: &ListingScope, name: &str) -> Error {
    Error::NotFound {
        what: format!("schedule {name:?} in {session}"),
    }
}

/// A schedule and the session it lives in (what a listing answers).
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleEntry {
    /// Its session.
    pub session: ListingScope,
    /// The schedule.
    pub schedule: Schedule,
}

/// The run scope of `name`'s tick at `tick` in `session`.
pub fn run_scope_for(session: &ListingScope, name: &str, tick: Timestamp) -> Result<RunScope> {
    let s = session_of(session)?;
    Ok(RunScope::new(
        s.tenant_id().clone(),
        s.project_id().expect("a session scope").clone(),
        s.session_id().expect("a session scope").clone(),
        run_id_for(name, tick),
    ))
}

/// The first checkpoint of the tick's run: `input` and `schedule` (name
/// and tick) in its state.
pub fn first_checkpoint(schedule: &Schedule, tick: Timestamp, now: Timestamp) -> Checkpoint {
    let mut state = Map::new();
    state.insert("input".into(), schedule.input.clone());
    state.insert(
        "schedule".into(),
        serde_json::json!({ "name": schedule.name, "tick": tick.as_millis() }),
    );
    Checkpoint::new(
        CheckpointId::new(FIRST_CHECKPOINT).expect("a valid checkpoint id"),
        now,
        state,
    )
    .with_run_created_at(now)
}

/// What one pass did to one schedule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulePass {
    /// The schedule's name.
    pub name: String,
    /// Runs this pass created.
    pub enqueued: Vec<RunId>,
    /// Due ticks whose run already existed (another scheduler's).
    pub already: Vec<RunId>,
    /// Whether this pass moved the cursor (false: nothing due, or another
    /// scheduler moved it first).
    pub advanced: bool,
    /// The error that stopped the schedule's pass, if any.
    pub error: Option<String>,
}

/// One pass of the scheduler over every schedule under `scope` at `now`.
pub async fn run_due(
    store: &(impl CheckpointStore + ?Sized),
    scope: &ListingScope,
    now: Timestamp,
) -> Result<Vec<SchedulePass>> {
    let mut out = Vec::new();
    for entry in store.list_schedules(scope).await? {
        out.push(run_one(store, &entry, now).await);
    }
    Ok(out)
}

/// One pass over one schedule (see [`run_due`]).
pub async fn run_one(
    store: &(impl CheckpointStore + ?Sized),
    entry: &ScheduleEntry,
    now: Timestamp,
) -> SchedulePass {
    let s = &entry.schedule;
    let mut pass = SchedulePass {
        name: s.name.clone(),
        ..SchedulePass::default()
    };
    let ticks = match ticks_due(s, now) {
        Ok(t) => t,
        Err(e) => {
            pass.error = Some(e.to_string());
            return pass;
        }
    };
    let options = match s.options.enqueue_options() {
        Ok(o) => o,
        Err(e) => {
            pass.error = Some(e.to_string());
            return pass;
        }
    };
    let mut done = None;
    for tick in ticks {
        let result = match run_scope_for(&entry.session, &s.name, tick) {
            Ok(scope) => {
                let cp = first_checkpoint(s, tick, now);
                store.enqueue(&scope, &cp, &options).await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(_) => pass.enqueued.push(run_id_for(&s.name, tick)),
            Err(Error::Conflict { .. }) => pass.already.push(run_id_for(&s.name, tick)),
            Err(e) => {
                pass.error = Some(e.to_string());
                break;
            }
        }
        done = Some(tick);
    }
    if let Some(to) = done {
        match store
            .advance_schedule(&entry.session, &s.name, s.cursor, to)
            .await
        {
            Ok(moved) => pass.advanced = moved,
            Err(e) => pass.error = pass.error.take().or(Some(e.to_string())),
        }
    }
    pass
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        let t = DateTime::parse_from_rfc3339(text).unwrap();
        Timestamp::from_millis(t.timestamp_millis()).unwrap()
    }

    #[test]
    fn validation_refuses_bad_names_crons_zones_and_policies() {
        let now = at("2026-01-01T00:00:00Z");
        assert!(Schedule::new("nightly", "0 3 * * *", now)
            .validate()
            .is_ok());
        assert!(Schedule::new("", "* * * * *", now).validate().is_err());
        assert!(Schedule::new("a.b", "* * * * *", now).validate().is_err());
        assert!(Schedule::new("x".repeat(65), "* * * * *", now)
            .validate()
            .is_err());
        assert!(Schedule::new("n", "61 * * * *", now).validate().is_err());
        assert!(Schedule::new("n", "not cron", now).validate().is_err());
        let mut s = Schedule::new("n", "* * * * *", now);
        s.timezone = "Mars/Olympus".into();
        assert!(s.validate().is_err());
        s.timezone = "Europe/Paris".into();
        assert!(s.validate().is_ok());
        s.missed = MissedTicks::CatchUp { max: 0 };
        assert!(s.validate().is_err());
        s.missed = MissedTicks::CatchUp {
            max: MAX_CATCH_UP + 1,
        };
        assert!(s.validate().is_err());
        assert_eq!(
            MissedTicks::parse("catch-up:5").unwrap(),
            MissedTicks::CatchUp { max: 5 }
        );
        assert!(MissedTicks::parse("sometimes").is_err());
    }

    #[test]
    fn run_ids_are_deterministic_and_distinct_per_tick() {
        let t = at("2026-12-06T21:21:30Z");
        assert_eq!(
            run_id_for("nightly", t).as_str(),
            "run_nightly-20261206T212130Z"
        );
        assert_eq!(run_id_for("nightly", t), run_id_for("nightly", t));
        assert_ne!(
            run_id_for("nightly", t),
            run_id_for("nightly", t.offset(1000))
        );
        let long = "x".repeat(MAX_NAME_LEN);
        assert!(RunId::new(run_id_for(&long, t).as_str()).is_ok());
    }

    #[test]
    fn due_ticks_are_after_the_base_and_at_or_before_now() {
        let mut s = Schedule::new("five", "*/5 * * * *", at("2026-01-01T00:00:00Z"));
        s.missed = MissedTicks::CatchUp { max: 100 };
        let due = ticks_due(&s, at("2026-01-01T00:15:00Z")).unwrap();
        assert_eq!(
            due,
            vec![
                at("2026-01-01T00:05:00Z"),
                at("2026-01-01T00:10:00Z"),
                at("2026-01-01T00:15:00Z")
            ]
        );
        s.cursor = Some(at("2026-01-01T00:10:00Z"));
        assert_eq!(
            ticks_due(&s, at("2026-01-01T00:14:59Z")).unwrap(),
            Vec::<Timestamp>::new()
        );
        assert_eq!(
            ticks_due(&s, at("2026-01-01T00:15:00Z")).unwrap(),
            vec![at("2026-01-01T00:15:00Z")]
        );
        s.paused = true;
        assert!(ticks_due(&s, at("2026-01-01T01:00:00Z"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn skip_takes_the_newest_and_catch_up_the_newest_max() {
        // Every second; the scheduler was away for 10 ticks.
        let start = at("2026-01-01T00:00:00Z");
        let mut s = Schedule::new("sec", "* * * * * *", start);
        s.cursor = Some(start);
        let now = start.offset(10_000);
        s.missed = MissedTicks::Skip;
        assert_eq!(ticks_due(&s, now).unwrap(), vec![now]);
        s.missed = MissedTicks::CatchUp { max: 3 };
        assert_eq!(
            ticks_due(&s, now).unwrap(),
            vec![now.offset(-2000), now.offset(-1000), now]
        );
        s.missed = MissedTicks::CatchUp { max: 100 };
        let all = ticks_due(&s, now).unwrap();
        assert_eq!(all.len(), 10);
        assert_eq!(all[0], start.offset(1000));
    }

    #[test]
    fn a_long_gap_is_not_walked_tick_by_tick() {
        // A year of per-second ticks: only the newest few are looked at.
        let start = at("2025-01-01T00:00:00Z");
        let mut s = Schedule::new("sec", "* * * * * *", start);
        s.missed = MissedTicks::CatchUp { max: 2 };
        let now = at("2026-01-01T00:00:00Z");
        assert_eq!(ticks_due(&s, now).unwrap(), vec![now.offset(-1000), now]);
    }

    #[test]
    fn a_resume_drops_the_ticks_of_the_pause() {
        let start = at("2026-01-01T00:00:00Z");
        let mut s = Schedule::new("sec", "* * * * * *", start);
        s.missed = MissedTicks::CatchUp { max: 100 };
        s.cursor = Some(start.offset(1000));
        s.resumed_at = Some(start.offset(5500));
        assert_eq!(
            ticks_due(&s, start.offset(7000)).unwrap(),
            vec![start.offset(6000), start.offset(7000)]
        );
    }

    /// The scheduler did not run for 10 ticks: a skip schedule enqueues the
    /// newest only, a catch-up one the newest `max`, and the cursor of both
    /// moves to the newest tick (the rest are skipped for good).
    #[tokio::test]
    async fn missed_ticks_follow_the_policy_through_a_store() {
        use crate::memory::MemoryStore;
        use crate::time::ManualClock;
        let start = at("2026-01-01T00:00:00Z");
        let clock = ManualClock::new(start);
        let store = MemoryStore::with_clock(std::sync::Arc::new(clock.clone()));
        let session = ListingScope::session(
            "t".parse().unwrap(),
            "p".parse().unwrap(),
            "s".parse().unwrap(),
        );
        let mut skip = Schedule::new("skip", "* * * * * *", start);
        skip.missed = MissedTicks::Skip;
        let mut catch = Schedule::new("catch", "* * * * * *", start);
        catch.missed = MissedTicks::CatchUp { max: 4 };
        store.put_schedule(&session, &skip).await.unwrap();
        store.put_schedule(&session, &catch).await.unwrap();
        // One pass at +1 s: both enqueue their first tick.
        let passes = run_due(&store, &session, start.offset(1000)).await.unwrap();
        assert!(passes.iter().all(|p| p.enqueued.len() == 1 && p.advanced));
        // Nothing runs for 10 ticks.
        let now = start.offset(11_000);
        let passes = run_due(&store, &session, now).await.unwrap();
        let by = |n: &str| passes.iter().find(|p| p.name == n).unwrap().clone();
        assert_eq!(by("skip").enqueued, vec![run_id_for("skip", now)]);
        assert_eq!(
            by("catch").enqueued,
            (8..=11)
                .map(|s| run_id_for("catch", start.offset(s * 1000)))
                .collect::<Vec<_>>()
        );
        for name in ["skip", "catch"] {
            let s = store.get_schedule(&session, name).await.unwrap().unwrap();
            assert_eq!(s.cursor, Some(now), "{name}'s cursor");
        }
        // The skipped ticks stay skipped: nothing is due at the same instant.
        let again = run_due(&store, &session, now).await.unwrap();
        assert!(again.iter().all(|p| p.enqueued.is_empty()));
        // A pause of 5 ticks, then a resume: none of the pause's ticks.
        let mut c = store
            .get_schedule(&session, "catch")
            .await
            .unwrap()
            .unwrap();
        c.set_paused(true, now);
        store.put_schedule(&session, &c).await.unwrap();
        let paused = run_due(&store, &session, now.offset(3000)).await.unwrap();
        assert!(paused
            .iter()
            .find(|p| p.name == "catch")
            .unwrap()
            .enqueued
            .is_empty());
        c.set_paused(false, now.offset(5500));
        store.put_schedule(&session, &c).await.unwrap();
        let resumed = run_due(&store, &session, now.offset(6000)).await.unwrap();
        assert_eq!(
            resumed.iter().find(|p| p.name == "catch").unwrap().enqueued,
            vec![run_id_for("catch", now.offset(6000))]
        );
    }

    #[test]
    fn time_zones_move_the_wall_clock() {
        let s = {
            let mut s = Schedule::new("paris", "0 9 * * *", at("2026-01-01T00:00:00Z"));
            s.timezone = "Europe/Paris".into();
            s
        };
        // 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer.
        assert_eq!(
            s.next_tick_after(at("2026-01-01T00:00:00Z")),
            Some(at("2026-01-01T08:00:00Z"))
        );
        assert_eq!(
            s.next_tick_after(at("2026-07-01T00:00:00Z")),
            Some(at("2026-07-01T07:00:00Z"))
        );
    }

    #[test]
    fn a_put_keeps_the_cursor_and_the_cursor_only_moves_forward() {
        let t0 = at("2026-01-01T00:00:00Z");
        let mut old = Schedule::new("n", "* * * * *", t0);
        old.cursor = Some(t0.offset(60_000));
        let mut new = Schedule::new("n", "*/2 * * * *", t0.offset(999_000));
        new.cursor = None;
        let stored = on_put(Some(&old), &new, t0).unwrap();
        assert_eq!(stored.cursor, old.cursor);
        assert_eq!(stored.created_at, t0);
        assert_eq!(stored.cron, "*/2 * * * *");
        let mut created = new.clone();
        created.cursor = Some(t0);
        assert_eq!(on_put(None, &created, t0).unwrap().cursor, None);
        // A put that unpauses resumes at the store's instant.
        let mut paused = old.clone();
        paused.paused = true;
        let resumed = on_put(Some(&paused), &old, t0.offset(5000)).unwrap();
        assert_eq!(resumed.resumed_at, Some(t0.offset(5000)));

        let mut s = stored;
        assert!(!advance(&mut s, None, t0.offset(120_000)).unwrap());
        assert!(advance(&mut s, Some(t0.offset(60_000)), t0.offset(120_000)).unwrap());
        assert_eq!(s.cursor, Some(t0.offset(120_000)));
        assert!(!advance(&mut s, Some(t0.offset(60_000)), t0.offset(180_000)).unwrap());
        assert!(advance(&mut s, Some(t0.offset(120_000)), t0.offset(120_000)).is_err());
    }
}
