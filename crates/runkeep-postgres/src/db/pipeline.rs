//! Pipelined statements: several statements sent back to back on one
//! connection and awaited together, so they cost one round trip.
//!
//! tokio-postgres writes a request to its connection as soon as the query
//! future is first polled (a statement already prepared needs nothing
//! else), and the server answers requests in the order it received them.
//! [`send`] polls every future in order, so `BEGIN`, the statements and
//! `COMMIT` leave in that order, in one write when the connection task runs
//! after them. Statements are prepared first ([`prepare`]): a statement
//! still to prepare would wait for its `Parse` and reach the server after
//! the ones queued behind it.
//!
//! Within a transaction a failed statement aborts it: every later statement
//! of the pipeline fails too (each query ends with its own `Sync`, so the
//! server reads on), and a pipelined `COMMIT` then answers `ROLLBACK`. So a
//! pipeline of writes and `COMMIT` is all or nothing, and the first error
//! names what failed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use deadpool_postgres::Object;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Row, Statement};

/// A statement parameter the statement owns.
pub(crate) type Param = Box<dyn ToSql + Sync + Send>;

/// One statement of a pipeline: what it does (for errors), its SQL and its
/// parameters.
pub(crate) struct Stmt {
    pub what: &'static str,
    pub sql: String,
    pub params: Vec<Param>,
}

impl Stmt {
    pub fn new(what: &'static str, sql: impl Into<String>, params: Vec<Param>) -> Self {
        Self {
            what,
            sql: sql.into(),
            params,
        }
    }
}

/// `stmts` as one statement: every one but the last a data-modifying
/// `WITH` item, the last the statement itself, their parameters numbered on
/// (`$1` of the second is `$n + 1` when the first has `n`). One executor
/// start, one `Bind`/`Execute`/`Sync` and one reply instead of one each.
///
/// The items run on one snapshot and do not see each other's changes
/// (PostgreSQL's rule for data-modifying `WITH`): the caller sends no two
/// statements that touch the same row (a row updated twice in one statement
/// keeps only one of the updates), and none that reads what another
/// writes. Foreign keys are checked at the end of the statement, so an
/// item may insert rows referencing a row another item updates. `None`
/// for no statement; one statement is answered as it is.
pub(crate) fn merged(what: &'static str, stmts: Vec<Stmt>) -> Option<Stmt> {
    if stmts.len() <= 1 {
        return stmts.into_iter().next();
    }
    let n = stmts.len();
    let mut sql = String::with_capacity(stmts.iter().map(|s| s.sql.len() + 16).sum());
    let mut params: Vec<Param> = Vec::with_capacity(stmts.iter().map(|s| s.params.len()).sum());
    for (i, s) in stmts.into_iter().enumerate() {
        if i == 0 {
            sql.push_str("WITH ");
        } else if i < n - 1 {
            sql.push_str(", ");
        } else {
            sql.push(' ');
        }
        if i < n - 1 {
            sql.push_str(&format!("w{i} AS ("));
        }
        renumbered(&s.sql, params.len(), &mut sql);
        if i < n - 1 {
            sql.push(')');
        }
        params.extend(s.params);
    }
    Some(Stmt::new(what, sql, params))
}

/// Appends `sql` to `out` with every placeholder `$k` outside a quoted
/// literal or identifier written as `$(k + by)`.
fn renumbered(sql: &str, by: usize, out: &mut String) {
    let bytes = sql.as_bytes();
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b == b'$' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let end = (i + 1..bytes.len())
                    .find(|&j| !bytes[j].is_ascii_digit())
                    .unwrap_or(bytes.len());
                let k: usize = sql[i + 1..end].parse().unwrap_or(0);
                out.push_str(&format!("${}", k + by));
                i = end;
                continue;
            }
            None => {}
        }
        // Placeholders and quotes are ASCII: copy up to the next byte that
        // may start one.
        let next = (i + 1..bytes.len())
            .find(|&j| matches!(bytes[j], b'$' | b'\'' | b'"'))
            .unwrap_or(bytes.len());
        out.push_str(&sql[i..next]);
        i = next;
    }
}

/// A statement ready to send.
pub(crate) enum Prepared {
    /// Prepared on this connection (kept in its cache).
    Named(Statement),
    /// Sent unnamed, parsed with each execution (behind a pooler: module
    /// `pooled`), with its parameter types.
    Unnamed(Arc<[Type]>),
}

/// The server's answer to one request.
pub(crate) type Reply = std::result::Result<Vec<Row>, tokio_postgres::Error>;

type ReplyFuture<'a> = Pin<Box<dyn Future<Output = Reply> + Send + 'a>>;

/// Polls every future, in order, each time the task wakes, until the first
/// `awaited` are done (the rest are dropped then: their requests were sent
/// on their first poll, their replies are discarded by the connection):
/// whatever a future sends on its first poll reaches the connection in this
/// order. Answers the first `awaited` outputs.
async fn in_order<F: Future + Unpin>(mut futs: Vec<F>, awaited: usize) -> Vec<F::Output> {
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, (f, o)) in futs.iter_mut().zip(out.iter_mut()).enumerate() {
            if o.is_none() {
                match Pin::new(f).poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => pending |= i < awaited,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    drop(futs);
    out.into_iter().take(awaited).flatten().collect()
}

/// Prepares (or finds in the connection's cache) every statement; the ones
/// not cached yet are prepared together, in one round trip.
pub(crate) async fn prepare(
    c: &Object,
    stmts: &[Stmt],
) -> std::result::Result<Vec<Prepared>, (usize, tokio_postgres::Error)> {
    type Preparing<'a> =
        Pin<Box<dyn Future<Output = Result<Statement, tokio_postgres::Error>> + Send + 'a>>;
    let futs: Vec<Preparing<'_>> = stmts
        .iter()
        .map(|s| Box::pin(c.prepare_cached(&s.sql)) as Preparing<'_>)
        .collect();
    let n = futs.len();
    in_order(futs, n)
        .await
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.map(Prepared::Named).map_err(|e| (i, e)))
        .collect()
}

/// One statement's request on `client`: its first poll sends it.
fn request<'a>(
    client: &'a tokio_postgres::Client,
    stmt: &'a Stmt,
    prepared: &'a Prepared,
    params: &'a [&'a (dyn ToSql + Sync)],
    typed: &'a [(&'a (dyn ToSql + Sync), Type)],
) -> ReplyFuture<'a> {
    match prepared {
        Prepared::Named(st) => Box::pin(client.query(st, params)),
        Prepared::Unnamed(_) => Box::pin(client.query_typed(&stmt.sql, typed)),
    }
}

/// `params` paired with the types an unnamed statement needs (empty for a
/// named one).
fn typed<'a>(
    params: &[&'a (dyn ToSql + Sync)],
    prepared: &Prepared,
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    match prepared {
        Prepared::Named(_) => Vec::new(),
        Prepared::Unnamed(types) => params.iter().copied().zip(types.iter().cloned()).collect(),
    }
}

/// One statement on `c` (named or unnamed as prepared), awaited.
pub(crate) async fn query(
    client: &tokio_postgres::Client,
    sql: &str,
    prepared: &Prepared,
    params: &[&(dyn ToSql + Sync)],
) -> Reply {
    match prepared {
        Prepared::Named(st) => client.query(st, params).await,
        Prepared::Unnamed(_) => client.query_typed(sql, &typed(params, prepared)).await,
    }
}

/// Sends `BEGIN` (when `begin`), the statements (`prepared[i]` for
/// `stmts[i]`), `COMMIT` (when `commit`) and then `then` back to back on
/// `c`, and awaits every reply but `then`'s: one round trip. The replies
/// come in the same order. `then` (its statement and its prepared form) is
/// sent and not waited for: its reply is discarded, after the caller has
/// its answer, and the connection can serve the next caller meanwhile (the
/// server answers in order).
pub(crate) async fn send(
    c: &Object,
    begin: bool,
    stmts: &[Stmt],
    prepared: &[Prepared],
    commit: bool,
    then: Option<(&Stmt, &Prepared)>,
) -> Vec<Reply> {
    let client: &tokio_postgres::Client = c;
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = stmts
        .iter()
        .map(|s| {
            s.params
                .iter()
                .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                .collect()
        })
        .collect();
    let typed_params: Vec<Vec<(&(dyn ToSql + Sync), Type)>> = params
        .iter()
        .zip(prepared)
        .map(|(p, st)| typed(p, st))
        .collect();
    let then_params: Vec<&(dyn ToSql + Sync)> = then.map_or_else(Vec::new, |(s, _)| {
        s.params
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect()
    });
    let then_typed = then.map_or_else(Vec::new, |(_, st)| typed(&then_params, st));
    let mut futs: Vec<ReplyFuture<'_>> = Vec::with_capacity(stmts.len() + 3);
    if begin {
        futs.push(Box::pin(async move {
            client.batch_execute("BEGIN").await.map(|()| Vec::new())
        }));
    }
    for (((s, st), p), t) in stmts.iter().zip(prepared).zip(&params).zip(&typed_params) {
        futs.push(request(client, s, st, p, t));
    }
    if commit {
        futs.push(Box::pin(async move {
            client.batch_execute("COMMIT").await.map(|()| Vec::new())
        }));
    }
    let awaited = futs.len();
    if let Some((s, st)) = then {
        futs.push(request(client, s, st, &then_params, &then_typed));
    }
    in_order(futs, awaited).await
}

/// An open transaction on a pooled connection. Dropped before its commit
/// (a refusal, an error, a claim that changed nothing, a cancelled
/// caller), it rolls back in the background: the caller does not wait for
/// the `ROLLBACK`, and the connection returns to the pool only after it
/// (or is closed, when the rollback cannot be sent or gets no reply).
pub(crate) struct Tx {
    conn: Option<Object>,
    reply_timeout: Duration,
}

impl Tx {
    pub fn new(conn: Object, reply_timeout: Duration) -> Self {
        Self {
            conn: Some(conn),
            reply_timeout,
        }
    }

    /// The connection (present until the transaction ends).
    pub fn conn(&self) -> &Object {
        self.conn
            .as_ref()
            .expect("a transaction keeps its connection until it ends")
    }

    /// Ends the transaction's hold on the connection: `keep` returns it to
    /// the pool (the session is idle again), otherwise it is closed (its
    /// state is unknown: a commit got no reply).
    pub fn end(mut self, keep: bool) {
        if let Some(c) = self.conn.take() {
            if !keep {
                drop(Object::take(c));
            }
        }
    }
}

/// Closes a connection unless told it is clean.
struct Detach(Option<Object>);

impl Drop for Detach {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            drop(Object::take(c));
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let bound = self.reply_timeout;
        // The guard travels into the task: a task that never runs (its
        // runtime shutting down) closes the connection instead of handing
        // it back mid-transaction.
        let mut guard = Detach(Some(conn));
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    let ok = match guard.0.as_ref() {
                        Some(c) => matches!(
                            tokio::time::timeout(bound, c.batch_execute("ROLLBACK")).await,
                            Ok(Ok(()))
                        ),
                        None => false,
                    };
                    if ok {
                        // Clean: back to the pool.
                        drop(guard.0.take());
                    }
                });
            }
            Err(_) => drop(guard),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_numbers_every_statement_s_parameters_on() {
        let a = Stmt::new(
            "a",
            "INSERT INTO t (x, y) VALUES ($1, $2::bigint)",
            vec![Box::new(1_i64), Box::new(2_i64)],
        );
        let b = Stmt::new(
            "b",
            "UPDATE u SET s = 'x$1', \"q$2\" = $1 WHERE k = $10",
            vec![Box::new(3_i64)],
        );
        let c = Stmt::new("c", "DELETE FROM v WHERE k = $1", vec![Box::new(4_i64)]);
        let m = merged("all", vec![a, b, c]).expect("statements");
        assert_eq!(
            m.sql,
            "WITH w0 AS (INSERT INTO t (x, y) VALUES ($1, $2::bigint)), \
             w1 AS (UPDATE u SET s = 'x$1', \"q$2\" = $3 WHERE k = $12) \
             DELETE FROM v WHERE k = $4"
        );
        assert_eq!(m.params.len(), 4);
        assert_eq!(m.what, "all");
    }

    #[test]
    fn merged_answers_one_statement_as_it_is() {
        let a = Stmt::new("a", "SELECT $1", vec![Box::new(1_i64)]);
        let m = merged("all", vec![a]).expect("one");
        assert_eq!((m.what, m.sql.as_str()), ("a", "SELECT $1"));
        assert!(merged("none", Vec::new()).is_none());
    }
}
