//! The floor every job stands on: the pool and what the store keeps beside
//! it ([`Db`]), connecting (`connect`), statements sent together
//! (`pipeline`), the transaction skeleton (`tx`), the run's row and its
//! mapping to the core's types (`row`), the checkpoint upsert that keeps
//! the digest (`digest`), notifying and listening (`wake`), and what
//! changes behind a transaction-mode pooler (`pooled`). Nothing
//! here imports a job module or [`PgStore`](crate::PgStore): the jobs take
//! a `&Db`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use serde_json::Value;
use tokio_postgres::Row;

use runkeep::watch::Notifier;
use runkeep::{Clock, Error, RemoteClock, Result, Timestamp, Watch, WatchTopic};

use crate::options::PgOptions;

pub(crate) mod connect;
pub(crate) mod digest;
pub(crate) mod pipeline;
pub(crate) mod pooled;
pub(crate) mod row;
pub(crate) mod tx;
pub(crate) mod wake;

/// The pool and what every transaction needs beside it: the options, the
/// `NOTIFY` channel, the server's clock, the watchers, the listener and
/// the coalescing queue.
pub(crate) struct Db {
    pub(crate) pool: Pool,
    /// The configuration of the sessions the store opens for itself (the
    /// listener, the coalescing task): PostgreSQL directly, never through a
    /// pooler.
    pub(crate) config: tokio_postgres::Config,
    /// Set when the pool's URL is a transaction-mode pooler
    /// ([`PgOptions::direct_url`]): statements then go unnamed.
    pub(crate) pooled: Option<pooled::Pooled>,
    pub(crate) options: PgOptions,
    pub(crate) channel: String,
    /// The server's clock: the local clock plus the offset last measured.
    pub(crate) server_clock: RemoteClock,
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Where [`NotifyMode::Coalesced`](crate::NotifyMode::Coalesced) queues
    /// payloads for its background task (started on first use).
    pub(crate) coalescer: Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>,
    /// `NOTIFY` statements sent (each may carry many notifications).
    pub(crate) notify_statements: Arc<AtomicU64>,
    /// How many runs past the ones asked for `claim_next`'s candidate
    /// statement reads, for the claimers locking the first ones.
    pub(crate) head_slack: crate::claims::HeadSlack,
}

/// A session a statement runs on: a pooled connection, or a transaction
/// open on one.
pub(crate) trait Session: deadpool_postgres::GenericClient + Sync {
    /// The driver's client underneath.
    fn client(&self) -> &tokio_postgres::Client;
}

impl Session for deadpool_postgres::Object {
    fn client(&self) -> &tokio_postgres::Client {
        self
    }
}

impl Session for deadpool_postgres::Transaction<'_> {
    fn client(&self) -> &tokio_postgres::Client {
        tokio_postgres::Transaction::client(self)
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some(h) = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.abort();
        }
    }
}

impl Db {
    pub(crate) fn check_payload(&self, what: &str, bytes: usize) -> Result<()> {
        if bytes > self.options.max_payload_bytes {
            return Err(Error::invalid(format!(
                "{what} is {bytes} bytes of JSON; this PostgreSQL store's limit is {} bytes (PgOptions::max_payload_bytes); store large bodies elsewhere and reference them",
                self.options.max_payload_bytes
            )));
        }
        Ok(())
    }

    pub(crate) fn check_json(&self, what: &str, v: &Value) -> Result<()> {
        let bytes = serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
        self.check_payload(what, bytes)
    }

    /// The store's clock: the test clock, else the machine's corrected by
    /// the offset to the server last measured.
    pub(crate) fn now(&self) -> Timestamp {
        match &self.options.clock {
            Some(c) => c.now(),
            None => self.server_clock.now(),
        }
    }

    /// A watch on `topic`, woken by the listener (polling while it cannot
    /// run).
    pub(crate) fn watch(&self, topic: &WatchTopic) -> Watch {
        if !self.ensure_listener() {
            return Watch::polling(self.options.watch_fallback);
        }
        self.notifier.subscribe(topic, self.options.watch_fallback)
    }

    /// The instant a statement judges at when it is not the server's
    /// clock: the caller's, else the test clock's.
    pub(crate) fn fixed_now(&self, given: Option<Timestamp>) -> Option<Timestamp> {
        given.or_else(|| self.options.clock.as_ref().map(|c| c.now()))
    }

    /// The instant a listing statement judged at (its last column); the
    /// offset to the server is kept when it was the server's clock.
    pub(crate) fn listed_now(&self, r: &Row, fixed: Option<Timestamp>) -> Result<Timestamp> {
        let ms: i64 = r.get(r.len() - 1);
        let now = Timestamp::from_millis(ms)
            .map_err(|e| Error::corrupted(format!("the server clock is out of range: {e}")))?;
        if fixed.is_none() {
            self.note_server_now(now);
        }
        Ok(now)
    }
}
