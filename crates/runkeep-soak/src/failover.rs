//! The failover chaos (`runkeep soak --chaos failover --pair DIR`): while
//! the workers drain, the pair's primary is killed with `kill -9` while a
//! worker's transaction is open on it, and the standby is promoted. The
//! workers reach the pair through its multi-host URL
//! (`target_session_attrs=read-write`) and must find the new primary by
//! themselves; the audit then proves that no acknowledged write was lost
//! and no fence was issued twice.
//!
//! The pair is the one `scripts/pg-pair.sh up DIR sync|async` set up: it
//! writes `DIR/pair.env` ([`Pair::read`]).
//!
//! How "mid-transaction" is made sure of, not hoped for:
//!
//! - **Synchronous standby**: the standby's WAL receiver is stopped
//!   (SIGSTOP) first. Every commit on the primary then waits for the
//!   standby's acknowledgement (`wait_event = 'SyncRep'`) and none can be
//!   answered. Once a worker's commit is seen waiting, the primary is
//!   killed: that commit is in flight, committed locally and not
//!   acknowledged, at the kill. The receiver is resumed and the standby
//!   promoted. The worker's answer is lost: it takes the outcome-unknown
//!   path (fence the attempt off with a renewal, read the step back by its
//!   id).
//! - **Asynchronous standby**: no commit waits for the standby, so nothing
//!   can be held open without changing what is measured. The primary is
//!   killed the moment a worker's transaction is seen open in
//!   `pg_stat_activity` (the report says how many were, at the last look
//!   before the kill).
//!
//! The promotion is `SELECT pg_promote(true, 60)` on the standby: what
//! `pg_ctl promote` does, without running a program as the cluster's user.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_postgres::NoTls;

use crate::BackendChaos;

/// The file `scripts/pg-pair.sh up` writes in the pair's directory.
pub const PAIR_FILE: &str = "pair.env";

/// How long the chaos waits for a worker's transaction to be open on the
/// primary before it gives up on this failover (a strike error).
pub const OPEN_TRANSACTION_WAIT: Duration = Duration::from_secs(20);

/// Replication of the pair's standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Replication {
    /// `synchronous_standby_names` names the standby: a commit is
    /// acknowledged once the standby has it.
    Sync,
    /// A commit is acknowledged before the standby has it.
    Async,
}

/// A primary/standby pair on loopback, as `scripts/pg-pair.sh` wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The pair's directory.
    pub dir: PathBuf,
    /// The replication the script set up.
    pub mode: Replication,
    /// The primary's port on 127.0.0.1.
    pub primary_port: u16,
    /// The standby's port on 127.0.0.1.
    pub standby_port: u16,
    /// The primary's data directory (its `postmaster.pid` names the
    /// process the chaos kills).
    pub primary_data: PathBuf,
    /// The multi-host URL workers use.
    pub url: String,
}

/// Why a pair cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    /// No `pair.env` in the directory.
    #[error("{dir} holds no PostgreSQL pair ({file} is missing: {source}); create one with: scripts/pg-pair.sh up {dir} sync")]
    Missing {
        /// The directory.
        dir: String,
        /// The file looked for.
        file: String,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A line or a key is wrong.
    #[error("{file}: {what}; it is written by scripts/pg-pair.sh up, do not edit it")]
    Malformed {
        /// The file.
        file: String,
        /// What is wrong.
        what: String,
    },
}

impl Pair {
    /// Reads `dir/pair.env`.
    pub fn read(dir: &Path) -> Result<Self, PairError> {
        let file = dir.join(PAIR_FILE);
        let shown = file.display().to_string();
        let text = std::fs::read_to_string(&file).map_err(|source| PairError::Missing {
            dir: dir.display().to_string(),
            file: PAIR_FILE.into(),
            source,
        })?;
        Self::parse(dir, &shown, &text)
    }

    fn parse(dir: &Path, shown: &str, text: &str) -> Result<Self, PairError> {
        let malformed = |what: String| PairError::Malformed {
            file: shown.to_string(),
            what,
        };
        let value = |key: &str| -> Result<&str, PairError> {
            text.lines()
                .filter_map(|l| l.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| malformed(format!("no {key}")))
        };
        let port = |key: &str| -> Result<u16, PairError> {
            let v = value(key)?;
            v.parse()
                .map_err(|_| malformed(format!("{key}={v} is not a port")))
        };
        let mode = match value("PAIR_MODE")? {
            "sync" => Replication::Sync,
            "async" => Replication::Async,
            other => return Err(malformed(format!("PAIR_MODE={other}: sync or async"))),
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            mode,
            primary_port: port("PAIR_PRIMARY_PORT")?,
            standby_port: port("PAIR_STANDBY_PORT")?,
            primary_data: PathBuf::from(value("PAIR_PRIMARY_DATA")?),
            url: value("PAIR_URL")?.to_string(),
        })
    }

    /// The postmaster's pid, from the first line of its `postmaster.pid`.
    fn primary_pid(&self) -> Result<i32, String> {
        let file = self.primary_data.join("postmaster.pid");
        let text = std::fs::read_to_string(&file).map_err(|e| {
            format!(
                "cannot read {}: {e} (is the primary running?)",
                file.display()
            )
        })?;
        text.lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| format!("{} does not start with a pid", file.display()))
    }
}

/// A direct connection to one server of the pair (database `postgres`):
/// the chaos looks at each server itself, never through the multi-host URL.
async fn connect(port: u16) -> Result<tokio_postgres::Client, String> {
    let (client, conn) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname("postgres")
        .application_name("runkeep-soak-failover")
        .connect_timeout(Duration::from_secs(5))
        .connect(NoTls)
        .await
        .map_err(|e| format!("cannot connect to 127.0.0.1:{port}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// What the failover did, for the report.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct FailoverRecord {
    /// `sync` or `async`.
    pub replication: String,
    /// Workers' transactions open on the primary at the last look before
    /// the kill.
    pub open_transactions: u64,
    /// Of those, commits waiting for the standby's acknowledgement (sync
    /// only; held there by the stopped WAL receiver, so still in flight at
    /// the kill).
    pub commits_in_flight: u64,
    /// Milliseconds `pg_promote` took.
    pub promote_ms: u64,
}

/// The failover chaos: one failover, struck once, `after` (jittered
/// ×0.5–1.5) into the soak.
#[derive(Debug)]
pub struct FailoverChaos {
    pair: Pair,
    /// The workers' `application_name`.
    app: String,
    after: Duration,
    done: Mutex<Option<FailoverRecord>>,
}

impl FailoverChaos {
    /// One failover of `pair`, `after` into the soak, watching the
    /// transactions of workers connected as `app`.
    pub fn new(pair: Pair, app: String, after: Duration) -> Self {
        Self {
            pair,
            app,
            after,
            done: Mutex::new(None),
        }
    }

    /// What the failover did; `None` when it never happened (the drain
    /// ended first, or every strike failed).
    pub fn record(&self) -> Option<FailoverRecord> {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn fail_over(&self) -> Result<FailoverRecord, String> {
        let pid = self.pair.primary_pid()?;
        let primary = connect(self.pair.primary_port).await?;
        let standby = connect(self.pair.standby_port).await?;
        let in_recovery: bool = standby
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .map_err(|e| format!("standby: {e}"))?
            .get(0);
        if !in_recovery {
            return Err(format!(
                "127.0.0.1:{} is not a standby (already promoted?): make a fresh pair",
                self.pair.standby_port
            ));
        }
        // Sync: hold every commit in flight by stopping the standby's WAL
        // receiver.
        let receiver = match self.pair.mode {
            Replication::Sync => {
                let row = standby
                    .query_opt("SELECT pid FROM pg_stat_wal_receiver", &[])
                    .await
                    .map_err(|e| format!("standby: pg_stat_wal_receiver: {e}"))?
                    .ok_or("the standby has no WAL receiver (not streaming)")?;
                let pid = signal_pid(row.get(0))?;
                rustix::process::kill_process(pid, rustix::process::Signal::Stop)
                    .map_err(|e| format!("SIGSTOP of the WAL receiver: {e}"))?;
                Some(pid)
            }
            Replication::Async => None,
        };
        let looked = self.wait_for_open_transaction(&primary).await;
        let killed = match &looked {
            Ok(_) => signal_pid(pid).and_then(|p| {
                rustix::process::kill_process(p, rustix::process::Signal::Kill)
                    .map_err(|e| format!("kill -9 of the primary ({pid}): {e}"))
            }),
            Err(_) => Ok(()),
        };
        if let Some(r) = receiver {
            let _ = rustix::process::kill_process(r, rustix::process::Signal::Cont);
        }
        let (open, in_flight) = looked?;
        killed?;
        drop(primary);
        let started = Instant::now();
        let promoted: bool = standby
            .query_one("SELECT pg_promote(true, 60)", &[])
            .await
            .map_err(|e| format!("pg_promote: {e}"))?
            .get(0);
        if !promoted {
            return Err("pg_promote did not finish within 60 s".into());
        }
        Ok(FailoverRecord {
            replication: match self.pair.mode {
                Replication::Sync => "sync",
                Replication::Async => "async",
            }
            .into(),
            open_transactions: open,
            commits_in_flight: in_flight,
            promote_ms: started.elapsed().as_millis() as u64,
        })
    }

    /// Polls the primary until a worker's transaction is open (sync: until
    /// a worker's commit waits for the standby). Answers (open, waiting for
    /// the standby) at that look.
    async fn wait_for_open_transaction(
        &self,
        primary: &tokio_postgres::Client,
    ) -> Result<(u64, u64), String> {
        let deadline = Instant::now() + OPEN_TRANSACTION_WAIT;
        loop {
            let row = primary
                .query_one(
                    "SELECT count(*) FILTER (WHERE xact_start IS NOT NULL AND state <> 'idle'), \
                            count(*) FILTER (WHERE wait_event = 'SyncRep') \
                     FROM pg_stat_activity WHERE application_name = $1",
                    &[&self.app],
                )
                .await
                .map_err(|e| format!("primary: pg_stat_activity: {e}"))?;
            let (open, waiting) = (row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64);
            let ready = match self.pair.mode {
                Replication::Sync => waiting > 0,
                Replication::Async => open > 0,
            };
            if ready {
                return Ok((open, waiting));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no worker transaction was open on the primary within {} s (workers connected as {}?)",
                    OPEN_TRANSACTION_WAIT.as_secs(),
                    self.app
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn signal_pid(pid: i32) -> Result<rustix::process::Pid, String> {
    rustix::process::Pid::from_raw(pid).ok_or_else(|| format!("{pid} is not a process id"))
}

impl BackendChaos for FailoverChaos {
    fn strike(&self) -> Pin<Box<dyn Future<Output = Result<Option<String>, String>> + Send + '_>> {
        Box::pin(async move {
            if self.record().is_some() {
                return Ok(None);
            }
            let record = self.fail_over().await?;
            *self.done.lock().unwrap_or_else(|p| p.into_inner()) = Some(record);
            Ok(Some(
                "failovers (the primary killed with kill -9 mid-transaction, the standby promoted)"
                    .into(),
            ))
        })
    }

    fn heal(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {})
    }

    fn every(&self) -> Option<Duration> {
        Some(self.after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "PAIR_MODE=sync\nPAIR_PRIMARY_PORT=5433\nPAIR_STANDBY_PORT=5434\nPAIR_PRIMARY_DATA=/d/primary\nPAIR_STANDBY_DATA=/d/standby\nPAIR_URL=postgres://postgres@127.0.0.1:5433,127.0.0.1:5434/rk?target_session_attrs=read-write\n";

    #[test]
    fn a_pair_file_is_read_key_by_key() {
        let p = Pair::parse(Path::new("/d"), "/d/pair.env", GOOD).expect("parses");
        assert_eq!(p.mode, Replication::Sync);
        assert_eq!((p.primary_port, p.standby_port), (5433, 5434));
        assert_eq!(p.primary_data, PathBuf::from("/d/primary"));
        assert!(p.url.ends_with("target_session_attrs=read-write"));
    }

    #[test]
    fn a_pair_file_missing_a_key_or_with_a_bad_value_is_refused() {
        let no_port = GOOD.replace("PAIR_STANDBY_PORT=5434\n", "");
        let e = Pair::parse(Path::new("/d"), "/d/pair.env", &no_port).unwrap_err();
        assert!(e.to_string().contains("no PAIR_STANDBY_PORT"), "{e}");
        let bad_mode = GOOD.replace("PAIR_MODE=sync", "PAIR_MODE=quorum");
        let e = Pair::parse(Path::new("/d"), "/d/pair.env", &bad_mode).unwrap_err();
        assert!(e.to_string().contains("sync or async"), "{e}");
    }

    #[test]
    fn a_directory_without_a_pair_is_refused_with_the_command_that_makes_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = Pair::read(dir.path()).unwrap_err();
        assert!(
            e.to_string().contains("scripts/pg-pair.sh up"),
            "the refusal says how to make a pair: {e}"
        );
    }
}
