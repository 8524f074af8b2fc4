//! Transactions: prepared pipelines, `BEGIN` with the row lock and clock
//! in one round trip, the writes with `COMMIT` in one more, and the
//! reply-timeout errors.

use std::sync::atomic::Ordering;
use tokio_postgres::types::ToSql;

use tokio_postgres::Row;

use runkeep::{Checkpoint, Error, Result, RunScope, Timestamp};

use crate::db::digest::checkpoint_stmt;
use crate::db::pipeline::{self, Param, Prepared, Stmt, Tx};
use crate::db::row::{
    save_stmt_with, sql_after_lock, sql_ensure, sql_lock, state_of, Key, RunState,
};
use crate::db::wake;
use crate::db::{Db, Session};
use crate::error::{map_commit, map_pg};
use crate::options::NotifyMode;

/// What a transaction reads in the round trip that begins it.
#[derive(Default)]
pub(crate) struct Opening<'a> {
    /// Statements to run first, before the run's row is created or locked
    /// (a lock that must be taken before the row's: the dedupe key's).
    pub(crate) first: Vec<Stmt>,
    /// Create the run's row first: writes that may create a run (never a
    /// fenced one: a fence needs a holding, so the row exists).
    pub(crate) create: bool,
    /// Read the instant every judgement uses (after the lock).
    pub(crate) clock: bool,
    /// Whether this checkpoint exists (what the digest needs to know).
    pub(crate) checkpoint: Option<&'a str>,
    /// Statements to run after those, under the lock.
    pub(crate) more: Vec<Stmt>,
}

/// What [`Db::open`] read.
pub(crate) struct Opened {
    /// The run's row; `None` when absent.
    pub(crate) state: Option<RunState>,
    /// The judging instant (the test clock's, or the server's read after
    /// the lock); only when asked for.
    pub(crate) now: Option<Timestamp>,
    /// The asked-for checkpoint exists.
    pub(crate) checkpoint_exists: bool,
    /// The rows of [`Opening::more`], in order.
    pub(crate) more: Vec<Vec<Row>>,
}

impl Opened {
    pub(crate) fn now(&self) -> Timestamp {
        self.now.unwrap_or(Timestamp::EPOCH)
    }
}

/// How the replies of an opening's statements are laid out
/// ([`Db::opening_stmts`], read by [`Db::opened`]).
pub(crate) struct OpeningShape {
    first: usize,
    create: bool,
    after: bool,
    clock: bool,
    test_clock: bool,
    more: usize,
}

/// The run's row as a judge sees it: locked, with what the opening read.
pub(crate) struct Locked {
    /// The run's key columns.
    pub(crate) key: Key,
    /// The row existed when it was locked.
    pub(crate) found: bool,
    /// The row's state (the default when it did not exist); what is saved
    /// when the verdict asks for it.
    pub(crate) run: RunState,
    /// The judging instant ([`Opened::now`]).
    pub(crate) now: Timestamp,
    /// The checkpoint named in the opening exists.
    pub(crate) checkpoint_exists: bool,
    /// The rows of [`Opening::more`], in order.
    pub(crate) more: Vec<Vec<Row>>,
    /// The top holding as the lock found it (what the key's history is
    /// brought up from when the row is saved).
    pub(crate) before: Option<runkeep::TopHolding>,
    /// The instant the opening read, if it read one.
    pub(crate) read_now: Option<Timestamp>,
}

impl Locked {
    /// `key`'s row as [`Db::opened`] read it under its lock.
    pub(crate) fn new(key: Key, o: Opened) -> Self {
        Self {
            key,
            found: o.state.is_some(),
            before: o.state.as_ref().and_then(|s| s.top.clone()),
            now: o.now(),
            read_now: o.now,
            run: o.state.unwrap_or_default(),
            checkpoint_exists: o.checkpoint_exists,
            more: o.more,
        }
    }
}

/// What a judge decided, with the caller's answer.
pub(crate) enum Verdict<T> {
    /// Nothing to write: the transaction rolls back, unwaited.
    Keep(T),
    /// These writes, then `COMMIT`.
    Write(T, Writes),
}

/// The writes a verdict sends with `COMMIT`, in order.
#[derive(Default)]
pub(crate) struct Writes {
    stmts: Vec<Stmt>,
    /// A checkpoint to store (already stamped), where it goes among the
    /// statements, and whether one with its id exists.
    checkpoint: Option<(usize, Box<Checkpoint>, bool)>,
    /// Save the judged row last.
    save: bool,
    /// More columns the save sets (a step's documents: one `UPDATE` of
    /// the row, which a merged write needs).
    save_also: Vec<(&'static str, Param)>,
    /// Send the writes as one statement ([`pipeline::merged`]).
    merged: bool,
    /// Whom to wake right after the `COMMIT`.
    notify: Wake,
    /// The instant a change of holding is recorded at in the key's history
    /// (`None`: the instant the opening read, else the clock's).
    at: Option<Timestamp>,
}

/// Whom a committed write wakes (module `wake`, right after its `COMMIT`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) enum Wake {
    /// Nobody: no notification.
    #[default]
    Nobody,
    /// The run's watchers: the run changed.
    Changed,
    /// The run's watchers, telling them it has new events.
    NewEvents,
}

impl Wake {
    /// The notification that wakes whom `self` names about `scope`.
    pub(crate) fn payload(self, scope: &RunScope) -> Option<String> {
        match self {
            Wake::Nobody => None,
            Wake::Changed => Some(wake::payload(scope, false)),
            Wake::NewEvents => Some(wake::payload(scope, true)),
        }
    }
}

impl Writes {
    /// A statement, after those already given.
    pub(crate) fn stmt(mut self, s: Stmt) -> Self {
        self.stmts.push(s);
        self
    }

    /// Statements, after those already given.
    pub(crate) fn stmts(mut self, s: impl IntoIterator<Item = Stmt>) -> Self {
        self.stmts.extend(s);
        self
    }

    /// Stores `stored` here, keeping the row's digest (which may take one
    /// more round trip to read the headers: [`checkpoint_stmt`]).
    pub(crate) fn checkpoint(mut self, stored: Checkpoint, exists: bool) -> Self {
        self.checkpoint = Some((self.stmts.len(), Box::new(stored), exists));
        self
    }

    /// Saves the judged row (after every other write).
    pub(crate) fn save(mut self) -> Self {
        self.save = true;
        self
    }

    /// Saves the judged row, setting `columns` too (each to its value).
    pub(crate) fn save_also(mut self, columns: Vec<(&'static str, Param)>) -> Self {
        self.save_also.extend(columns);
        self.save()
    }

    /// Sends the writes as one statement ([`pipeline::merged`]): only for
    /// writes of which no two touch the same row.
    pub(crate) fn merged(mut self, merged: bool) -> Self {
        self.merged = merged;
        self
    }

    /// Records a change of holding at `at` (the claim's instant).
    pub(crate) fn at(mut self, at: Timestamp) -> Self {
        self.at = Some(at);
        self
    }

    /// Wakes the run's watchers after the `COMMIT` ([`Wake::Changed`] or
    /// [`Wake::NewEvents`]).
    pub(crate) fn notify(mut self, wake: Wake) -> Self {
        self.notify = wake;
        self
    }

    /// Leaves out the save of `run`, for the caller to send with other
    /// runs' ([`save_many_stmt`](crate::db::row::save_many_stmt)), when it
    /// is a plain one: no more columns, and no key holding to record (a
    /// run without a concurrency key). Answers whether it was left out.
    pub(crate) fn save_apart(&mut self, run: &RunState) -> bool {
        let plain = self.save && self.save_also.is_empty() && run.lifecycle.concurrency.is_none();
        if plain {
            self.save = false;
        }
        plain
    }
}

impl Db {
    /// Every write on one run's row: `BEGIN`, the row lock and what
    /// `opening` asks for (the clock, a checkpoint's existence, more reads)
    /// in one round trip; then `judge`, the core's rule, on the locked row;
    /// then its writes (and the saved row) with `COMMIT` in one more (a
    /// checkpoint whose digest needs the headers adds one read between).
    /// A judge that refuses, or keeps, rolls back without waiting.
    pub(crate) async fn write_locked<T>(
        &self,
        what: &'static str,
        scope: &RunScope,
        opening: Opening<'_>,
        judge: impl FnOnce(&mut Locked) -> Result<Verdict<T>>,
    ) -> Result<T> {
        let (tx, mut locked) = self.lock_row(what, scope, opening).await?;
        let (value, w) = match judge(&mut locked)? {
            Verdict::Keep(v) => return Ok(v),
            Verdict::Write(v, w) => (v, w),
        };
        let (stmts, notify) = self.written(&tx, what, scope, &mut locked, w).await?;
        self.commit_notify(tx, what, stmts, scope, notify).await?;
        Ok(value)
    }

    /// [`Self::write_locked`]'s first round trip: the transaction, with
    /// `scope`'s row locked and what `opening` asks for read.
    pub(crate) async fn lock_row(
        &self,
        what: &'static str,
        scope: &RunScope,
        opening: Opening<'_>,
    ) -> Result<(Tx, Locked)> {
        let key = Key::of(scope);
        let (tx, o) = self.open(what, scope, &key, opening).await?;
        Ok((tx, Locked::new(key, o)))
    }

    /// A verdict's writes as the statements to send with `COMMIT` (the
    /// checkpoint's may take a read first), and its notification.
    pub(crate) async fn written(
        &self,
        tx: &Tx,
        what: &str,
        scope: &RunScope,
        locked: &mut Locked,
        w: Writes,
    ) -> Result<(Vec<Stmt>, Wake)> {
        let mut stmts = w.stmts;
        if let Some((at, stored, exists)) = w.checkpoint {
            let s =
                checkpoint_stmt(self, tx, what, scope, &mut locked.run, &stored, exists).await?;
            stmts.insert(at, s);
        }
        if w.save {
            stmts.extend(crate::keys::holding_stmts(
                self,
                &locked.key,
                locked.before.as_ref(),
                &locked.run,
                w.at.or(locked.read_now),
            ));
            stmts.push(save_stmt_with(&locked.key, &locked.run, w.save_also)?);
        }
        if w.merged {
            stmts = pipeline::merged("the writes", stmts).into_iter().collect();
        }
        Ok((stmts, w.notify))
    }
}

impl Db {
    /// `Unavailable`: a statement got no reply within `reply_timeout`.
    pub(crate) fn no_reply(&self, what: &str) -> Error {
        Error::Unavailable {
            message: format!(
                "PostgreSQL: {what}: no reply within {} ms (PgOptions::reply_timeout; a partition, or an overloaded server); nothing was committed; retry",
                self.options.reply_timeout.as_millis()
            ),
            source: None,
            outcome_unknown: false,
        }
    }

    /// `Unavailable`, outcome unknown: `COMMIT` was sent, no reply came.
    pub(crate) fn commit_unanswered(&self, what: &str) -> Error {
        Error::outcome_unknown(
            format!(
                "PostgreSQL: {what}: commit: COMMIT was sent but no reply came within {} ms (PgOptions::reply_timeout); the change may or may not be stored: read it back before repeating it",
                self.options.reply_timeout.as_millis()
            ),
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )
    }

    /// Prepares `stmts` on `c` (one round trip only for those the
    /// connection has not prepared yet); behind a pooler, answers their
    /// parameter types instead (described once per process, module
    /// `pooled`), for unnamed statements.
    pub(crate) async fn prepare(
        &self,
        c: &deadpool_postgres::Object,
        what: &str,
        stmts: &[Stmt],
    ) -> Result<Vec<Prepared>> {
        if let Some(pooled) = &self.pooled {
            let sqls: Vec<&str> = stmts.iter().map(|s| s.sql.as_str()).collect();
            return match pooled.types(&sqls).await {
                Ok(types) => Ok(types.into_iter().map(Prepared::Unnamed).collect()),
                Err((i, e)) => {
                    tracing::debug!(
                        what,
                        statement = stmts[i].what,
                        "runkeep-postgres: describing failed"
                    );
                    Err(e)
                }
            };
        }
        match tokio::time::timeout(self.options.reply_timeout, pipeline::prepare(c, stmts)).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err((i, e))) => Err(map_pg(&format!("{what}: {}: prepare", stmts[i].what), e)),
            Err(_) => Err(self.no_reply(&format!("{what}: prepare"))),
        }
    }

    /// The rows of every statement, or the first statement's error (the
    /// ones after it only fail because the transaction was aborted).
    pub(crate) fn replies(
        what: &str,
        stmts: &[Stmt],
        replies: impl Iterator<Item = pipeline::Reply>,
    ) -> Result<Vec<Vec<Row>>> {
        stmts
            .iter()
            .zip(replies)
            .map(|(s, r)| r.map_err(|e| map_pg(&format!("{what}: {}", s.what), e)))
            .collect()
    }

    /// Begins a transaction with `stmts`: `BEGIN` and the statements in one
    /// round trip. Answers the open transaction and every statement's rows.
    pub(crate) async fn begin(
        &self,
        what: &'static str,
        stmts: Vec<Stmt>,
    ) -> Result<(Tx, Vec<Vec<Row>>)> {
        let conn = self.conn(what).await?;
        // Outside the transaction: a failed prepare leaves nothing open.
        let prepared = self.prepare(&conn, what, &stmts).await?;
        let tx = Tx::new(conn, self.options.reply_timeout);
        let sent = tokio::time::timeout(
            self.options.reply_timeout,
            pipeline::send(tx.conn(), true, &stmts, &prepared, false, None),
        )
        .await
        .map_err(|_| self.no_reply(&format!("{what}: begin")))?;
        let mut replies = sent.into_iter();
        if let Some(Err(e)) = replies.next() {
            return Err(map_pg(&format!("{what}: begin"), e));
        }
        let rows = Self::replies(what, &stmts, replies)?;
        Ok((tx, rows))
    }

    /// More statements in the open transaction, in one round trip.
    pub(crate) async fn run(&self, tx: &Tx, what: &str, stmts: Vec<Stmt>) -> Result<Vec<Vec<Row>>> {
        let prepared = self.prepare(tx.conn(), what, &stmts).await?;
        let sent = tokio::time::timeout(
            self.options.reply_timeout,
            pipeline::send(tx.conn(), false, &stmts, &prepared, false, None),
        )
        .await
        .map_err(|_| self.no_reply(what))?;
        Self::replies(what, &stmts, sent.into_iter())
    }

    /// The writes and `COMMIT` in one round trip. A write the server
    /// refuses rolls everything back (its error is answered); a fault while
    /// `COMMIT` is in flight (any connection fault of this round trip: the
    /// writes and `COMMIT` left together) leaves the outcome unknown.
    pub(crate) async fn commit(&self, tx: Tx, what: &str, stmts: Vec<Stmt>) -> Result<()> {
        self.commit_then(tx, what, stmts, None).await
    }

    /// [`Self::commit`], with the change of `scope` notified right after
    /// the `COMMIT` (module `wake`) unless `notify` is [`Wake::Nobody`]:
    /// sent with it, not waited for.
    pub(crate) async fn commit_notify(
        &self,
        tx: Tx,
        what: &str,
        stmts: Vec<Stmt>,
        scope: &RunScope,
        notify: Wake,
    ) -> Result<()> {
        let payloads: Vec<String> = notify.payload(scope).into_iter().collect();
        self.commit_waking(tx, what, stmts, payloads).await
    }

    /// [`Self::commit`], with `payloads` (module `wake`) notified right
    /// after the `COMMIT`: one statement for them all, sent with it and
    /// not waited for (or queued once committed, when coalesced).
    pub(crate) async fn commit_waking(
        &self,
        tx: Tx,
        what: &str,
        stmts: Vec<Stmt>,
        payloads: Vec<String>,
    ) -> Result<()> {
        if payloads.is_empty() {
            return self.commit(tx, what, stmts).await;
        }
        if self.options.notify == NotifyMode::Coalesced {
            if let Some(queue) = self.coalescer() {
                self.commit(tx, what, stmts).await?;
                // Queued only once committed; the task sends them shortly.
                for p in payloads {
                    let _ = queue.send(p);
                }
                return Ok(());
            }
            // No runtime to run the task on: notify as Immediate does.
        }
        let notify = match <[String; 1]>::try_from(payloads) {
            Ok([one]) => Stmt::new(
                "notify",
                wake::NOTIFY_SQL,
                vec![Box::new(self.channel.clone()), Box::new(one)],
            ),
            Err(many) => Stmt::new(
                "notify",
                wake::NOTIFY_MANY_SQL,
                vec![Box::new(self.channel.clone()), Box::new(many)],
            ),
        };
        self.notify_statements.fetch_add(1, Ordering::Relaxed);
        self.commit_then(tx, what, stmts, Some(notify)).await
    }

    /// The queue of the coalescing task, started on first use on the
    /// current runtime (`None` outside one).
    fn coalescer(&self) -> Option<tokio::sync::mpsc::UnboundedSender<String>> {
        let mut guard = self.coalescer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(q) = guard.as_ref().filter(|q| !q.is_closed()) {
            return Some(q.clone());
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let (queue, rx) = tokio::sync::mpsc::unbounded_channel();
        // The task ends once the store (the only sender) is dropped and
        // the queue is drained.
        handle.spawn(wake::coalesce_loop(
            self.config.clone(),
            self.channel.clone(),
            rx,
            self.options.reply_timeout,
            self.notify_statements.clone(),
        ));
        *guard = Some(queue.clone());
        Some(queue)
    }

    pub(crate) async fn commit_then(
        &self,
        tx: Tx,
        what: &str,
        mut stmts: Vec<Stmt>,
        then: Option<Stmt>,
    ) -> Result<()> {
        let n = stmts.len();
        stmts.extend(then);
        let mut prepared = self.prepare(tx.conn(), what, &stmts).await?;
        let then = (stmts.len() > n).then(|| (stmts.remove(n), prepared.remove(n)));
        let Ok(sent) = tokio::time::timeout(
            self.options.reply_timeout,
            pipeline::send(
                tx.conn(),
                false,
                &stmts,
                &prepared,
                true,
                then.as_ref().map(|(s, p)| (s, p)),
            ),
        )
        .await
        else {
            // The session's state is unknown: close it.
            tx.end(false);
            return Err(self.commit_unanswered(what));
        };
        tx.end(true);
        let mut replies = sent.into_iter();
        for (s, r) in stmts.iter().zip(replies.by_ref()) {
            if let Err(e) = r {
                let what = format!("{what}: {}", s.what);
                return Err(if e.code().is_some() {
                    // The server refused it: COMMIT answered ROLLBACK.
                    map_pg(&what, e)
                } else {
                    map_commit(&format!("{what} (with COMMIT)"), e)
                });
            }
        }
        match replies.next() {
            Some(Err(e)) => Err(map_commit(&format!("{what}: commit"), e)),
            _ => Ok(()),
        }
    }

    /// One statement on its own, outside a transaction: its reply is its
    /// commit (one round trip). A statement the server refuses stored
    /// nothing; a fault or no reply while it was in flight leaves the
    /// outcome unknown (the connection is closed then).
    pub(crate) async fn write_alone(&self, what: &str, stmt: Stmt) -> Result<()> {
        let conn = self.conn(what).await?;
        let stmts = [stmt];
        let prepared = self.prepare(&conn, what, &stmts).await?;
        let Ok(mut sent) = tokio::time::timeout(
            self.options.reply_timeout,
            pipeline::send(&conn, false, &stmts, &prepared, false, None),
        )
        .await
        else {
            drop(deadpool_postgres::Object::take(conn));
            return Err(self.commit_unanswered(what));
        };
        match sent.pop() {
            Some(Err(e)) => {
                let what = format!("{what}: {}", stmts[0].what);
                Err(if e.code().is_some() {
                    map_pg(&what, e)
                } else {
                    drop(deadpool_postgres::Object::take(conn));
                    map_commit(&what, e)
                })
            }
            _ => Ok(()),
        }
    }

    /// Begins a transaction on `scope`'s row: locks it (creating it first
    /// when asked) and reads what `o` asks for, in one round trip.
    pub(crate) async fn open(
        &self,
        what: &'static str,
        scope: &RunScope,
        key: &Key,
        o: Opening<'_>,
    ) -> Result<(Tx, Opened)> {
        let (stmts, shape) = self.opening_stmts(key, o);
        let (tx, rows) = self.begin(what, stmts).await?;
        let opened = self.opened(scope, &shape, &mut rows.into_iter())?;
        Ok((tx, opened))
    }

    /// The statements of `o` on `key`'s row (what [`Self::open`] sends
    /// after `BEGIN`), and how to read their replies ([`Self::opened`]).
    pub(crate) fn opening_stmts(&self, key: &Key, o: Opening<'_>) -> (Vec<Stmt>, OpeningShape) {
        let mut stmts = Vec::with_capacity(3 + o.first.len() + o.more.len());
        let n_first = o.first.len();
        stmts.extend(o.first);
        if o.create {
            stmts.push(Stmt::new(
                "create the run row",
                sql_ensure(),
                key.owned(vec![]),
            ));
        }
        stmts.push(Stmt::new("lock the run row", sql_lock(), key.owned(vec![])));
        let test_clock = self.options.clock.as_ref().map(|c| c.now());
        let after = o.clock || o.checkpoint.is_some();
        if after {
            let fixed: Option<i64> = match (o.clock, test_clock) {
                (true, Some(t)) => Some(t.as_millis()),
                (true, None) => None,
                (false, _) => Some(0),
            };
            let id: Option<String> = o.checkpoint.map(str::to_string);
            stmts.push(Stmt::new(
                "read the clock",
                sql_after_lock(),
                key.owned(vec![Box::new(fixed), Box::new(id)]),
            ));
        }
        let shape = OpeningShape {
            first: n_first,
            create: o.create,
            after,
            clock: o.clock,
            test_clock: test_clock.is_some(),
            more: o.more.len(),
        };
        stmts.extend(o.more);
        (stmts, shape)
    }

    /// What the statements of [`Self::opening_stmts`] read, taken from
    /// `rows` (their replies, in order; the ones after are left).
    pub(crate) fn opened(
        &self,
        scope: &RunScope,
        shape: &OpeningShape,
        rows: &mut impl Iterator<Item = Vec<Row>>,
    ) -> Result<Opened> {
        // The first statements' rows: only their effect (a lock) matters.
        rows.take(shape.first).for_each(drop);
        if shape.create {
            rows.next();
        }
        let state = match rows.next().and_then(|r| r.into_iter().next()) {
            Some(r) => Some(state_of(scope, &r)?),
            None => None,
        };
        let mut opened = Opened {
            state,
            now: None,
            checkpoint_exists: false,
            more: Vec::with_capacity(shape.more),
        };
        if shape.after {
            let r = rows
                .next()
                .and_then(|r| r.into_iter().next())
                .ok_or_else(|| Error::corrupted("the clock query answered no row"))?;
            if shape.clock {
                let ms: i64 = r.get(0);
                let now = Timestamp::from_millis(ms).map_err(|e| {
                    Error::corrupted(format!("the server clock is out of range: {e}"))
                })?;
                if !shape.test_clock {
                    self.note_server_now(now);
                }
                opened.now = Some(now);
            }
            opened.checkpoint_exists = r.get(1);
        }
        opened.more.extend(rows.take(shape.more));
        Ok(opened)
    }

    pub(crate) async fn rows<C: Session>(
        &self,
        c: &C,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let bound = self.options.reply_timeout;
        let st = match &self.pooled {
            Some(pooled) => {
                Prepared::Unnamed(pooled.types(&[sql]).await.map_err(|(_, e)| e)?.remove(0))
            }
            None => Prepared::Named(
                tokio::time::timeout(bound, c.prepare_cached(sql))
                    .await
                    .map_err(|_| self.no_reply(&format!("{what}: prepare")))?
                    .map_err(|e| map_pg(&format!("{what}: prepare"), e))?,
            ),
        };
        tokio::time::timeout(bound, pipeline::query(c.client(), sql, &st, params))
            .await
            .map_err(|_| self.no_reply(what))?
            .map_err(|e| map_pg(what, e))
    }

    pub(crate) async fn row_opt<C: Session>(
        &self,
        c: &C,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>> {
        Ok(self.rows(c, what, sql, params).await?.into_iter().next())
    }
}
