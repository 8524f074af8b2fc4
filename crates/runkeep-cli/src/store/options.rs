//! What a store is opened with besides its address: durability, the
//! PostgreSQL pool and watch, the HTTP request timeout. A command builds
//! one [`StoreOptions`] (through `Ctx::store_options`) and hands it to
//! every open; nothing is kept in process-wide state, so two stores of one
//! process can be opened differently.

use std::time::Duration;

/// How much a write survives (`--durability`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, clap::ValueEnum)]
pub enum DurabilityArg {
    /// Atomic publish: survives a process crash.
    #[default]
    ProcessCrash,
    /// fsync of files and directories: survives power loss.
    PowerLoss,
}

/// How many PostgreSQL operations a command runs at once, which sets its
/// pool when `--pg-pool-size` is not given.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PoolDemand {
    /// One operation at a time, with a spare (most commands): 2.
    Command,
    /// The doctor's checks, some of them side by side: 4.
    Doctor,
    /// `serve`: as many as the requests it serves at once, up to 16.
    Serve {
        /// `--max-concurrent`.
        max_concurrent: usize,
    },
    /// One soak worker process: its runs stepped at once, plus one for
    /// the lease keeper.
    SoakWorker {
        /// The worker's `--concurrency`.
        concurrency: usize,
    },
}

/// The most connections `serve` pools by default, however many requests it
/// serves at once.
pub const MAX_SERVE_POOL: usize = 16;

impl PoolDemand {
    /// The pool this demand gets when `--pg-pool-size` is not given (at
    /// least 1).
    pub fn default_pool_size(self) -> usize {
        let n = match self {
            PoolDemand::Command => 2,
            PoolDemand::Doctor => 4,
            PoolDemand::Serve { max_concurrent } => max_concurrent.min(MAX_SERVE_POOL),
            PoolDemand::SoakWorker { concurrency } => concurrency.saturating_add(1),
        };
        n.max(1)
    }
}

/// Everything a store is opened with besides its address and scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// `--durability` (directory stores).
    pub durability: DurabilityArg,
    /// Most pooled connections of a PostgreSQL store.
    pub pg_pool_size: usize,
    /// How often a PostgreSQL watch re-reads when no notification came
    /// (`events --follow --interval`); `None`: the store's default.
    pub pg_watch_fallback: Option<Duration>,
    /// The longest one request to an `http://` store may wait for its
    /// answer; `None`: the client's default.
    pub http_request_timeout: Option<Duration>,
    /// `--pg-direct-url`: PostgreSQL itself when the store's URL is a
    /// transaction-mode pooler's (`PgOptions::direct_url`).
    pub pg_direct_url: Option<String>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            durability: DurabilityArg::default(),
            pg_pool_size: PoolDemand::Command.default_pool_size(),
            pg_watch_fallback: None,
            http_request_timeout: None,
            pg_direct_url: None,
        }
    }
}

impl StoreOptions {
    /// The options of a command with `demand`: `--pg-pool-size` (given or
    /// from `RUNKEEP_PG_POOL_SIZE`) wins over the demand's default.
    pub fn new(durability: DurabilityArg, pg_pool_size: Option<usize>, demand: PoolDemand) -> Self {
        Self {
            durability,
            pg_pool_size: pg_pool_size.unwrap_or_else(|| demand.default_pool_size()),
            ..Self::default()
        }
    }

    /// The same options with a PostgreSQL watch re-reading at least every
    /// `interval` (LISTEN/NOTIFY wakes a follow; the interval only bounds
    /// how late a missed notification — a reconnecting listener — is
    /// noticed).
    #[must_use]
    pub fn with_pg_watch_fallback(mut self, interval: Duration) -> Self {
        self.pg_watch_fallback = Some(interval);
        self
    }

    /// The same options with `http://` requests answered within `timeout`
    /// (a server that went away is an error within it, never a hang).
    #[must_use]
    pub fn with_http_request_timeout(mut self, timeout: Duration) -> Self {
        self.http_request_timeout = Some(timeout);
        self
    }
}

/// `--pg-direct-url URL`: a postgres:// URL (its password registered as
/// a secret, as the store's is).
pub fn parse_pg_direct_url(s: &str) -> Result<String, String> {
    match s.parse::<super::StoreAddress>()? {
        super::StoreAddress::Postgres(a) => Ok(a.url().to_string()),
        _ => {
            Err("--pg-direct-url takes a postgres:// URL straight to the PostgreSQL server".into())
        }
    }
}

/// `--pg-pool-size N`: at least 1.
pub fn parse_pg_pool_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("the PostgreSQL pool needs at least 1 connection (0 would refuse every operation); pass 1 or more".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number of connections (pass 1 or more)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_of_no_connections_is_refused_with_what_to_pass() {
        assert_eq!(parse_pg_pool_size("1"), Ok(1));
        assert_eq!(parse_pg_pool_size("32"), Ok(32));
        let e = parse_pg_pool_size("0").unwrap_err();
        assert!(e.contains("at least 1 connection"), "{e}");
        assert!(parse_pg_pool_size("-1").is_err());
        assert!(parse_pg_pool_size("many").is_err());
    }

    #[test]
    fn each_command_pools_what_it_runs_at_once_unless_the_size_is_given() {
        let d = DurabilityArg::ProcessCrash;
        assert_eq!(
            StoreOptions::new(d, None, PoolDemand::Command).pg_pool_size,
            2
        );
        assert_eq!(
            StoreOptions::new(d, None, PoolDemand::Doctor).pg_pool_size,
            4
        );
        let serve = |max_concurrent| PoolDemand::Serve { max_concurrent };
        assert_eq!(StoreOptions::new(d, None, serve(8)).pg_pool_size, 8);
        assert_eq!(StoreOptions::new(d, None, serve(64)).pg_pool_size, 16);
        let worker = |concurrency| PoolDemand::SoakWorker { concurrency };
        assert_eq!(StoreOptions::new(d, None, worker(3)).pg_pool_size, 4);
        assert_eq!(StoreOptions::new(d, Some(7), serve(64)).pg_pool_size, 7);
        assert_eq!(StoreOptions::new(d, Some(1), worker(3)).pg_pool_size, 1);
    }
}
