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
