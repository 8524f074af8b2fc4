//! Connecting: the pool and its per-connection settings, the schema
//! migration and version check, the offset to the server's clock, and the
//! `LISTEN` connection's start.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use runkeep::watch::Notifier;
use runkeep::RemoteClock;
use runkeep::{Error, Result, Timestamp};

use crate::error::{map_pg, map_pool};
use crate::options::PgOptions;
use crate::row::NOW_SQL;
use crate::schema::{self, SCHEMA_VERSION};
use crate::store::PgStore;
use crate::wake;

impl PgStore {
    /// Connects to `url` (a `postgres://` URL or a key=value string),
    /// applies the embedded migrations to `options.schema` (under an
    /// advisory lock: concurrent `connect`s are safe) and checks the
    /// server answers.
    ///
    /// # Errors
    /// `Unsupported` when the schema is at a newer version than this binary
    /// ([`SCHEMA_VERSION`]); `Unavailable` when the server cannot be
    /// reached; `InvalidInput` for a bad URL, schema name or option.
    pub async fn connect(url: &str, options: PgOptions) -> Result<Self> {
        Self::migrate(url, &options).await?;
        let store = Self::open_migrated(url, options)?;
        store.measure_offset().await?;
        store.ensure_listener();
        Ok(store)
    }

    /// Applies the embedded migrations to `options.schema` on a connection
    /// of its own and answers the version now applied (`runkeep migrate`).
    pub async fn migrate(url: &str, options: &PgOptions) -> Result<i32> {
        let config = Self::pg_config(url, options)?;
        let (mut client, conn) = config
            .connect(NoTls)
            .await
            .map_err(|e| map_pg("connect (to migrate)", e))?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "runkeep-postgres: migration connection ended");
            }
        });
        let r = schema::migrate(&mut client, &options.schema).await;
        drop(client);
        let _ = driver.await;
        r
    }

    /// The runkeep schema version recorded in `options.schema` (0 when the
    /// schema has never been migrated), read on a connection of its own
    /// without changing anything: what `runkeep` checks before a read-only
    /// command and what the doctor reports.
    ///
    /// # Errors
    /// `Unavailable` when the server cannot be reached; `InvalidInput` for a
    /// bad URL or schema name.
    pub async fn schema_version(url: &str, options: &PgOptions) -> Result<i32> {
        let config = Self::pg_config(url, options)?;
        let (client, conn) = config
            .connect(NoTls)
            .await
            .map_err(|e| map_pg("connect (to read the schema version)", e))?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "runkeep-postgres: version connection ended");
            }
        });
        let r = schema::current_version(&client, &options.schema).await;
        drop(client);
        let _ = driver.await;
        r
    }

    /// Builds a store on a schema that [`PgStore::migrate`] (or
    /// [`PgStore::connect`]) already brought to [`SCHEMA_VERSION`], without
    /// connecting yet: connections open on first use, on the runtime that
    /// uses them. For callers that must build a store inside a running
    /// runtime without awaiting (test fixtures); everyone else calls
    /// `connect`. Every pooled connection checks the schema version when
    /// it opens and refuses a newer one.
    pub fn open_migrated(url: &str, options: PgOptions) -> Result<Self> {
        schema::validate_schema_name(&options.schema)?;
        if options.pool_size == 0 {
            return Err(Error::invalid("PgOptions::pool_size must be at least 1"));
        }
        let config = Self::pg_config(url, &options)?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let schema_name = options.schema.clone();
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
                let schema_name = schema_name.clone();
                Box::pin(async move {
                    let found = schema::current_version(client, &schema_name)
                        .await
                        .map_err(|e| deadpool_postgres::HookError::message(e.to_string()))?;
                    schema::refuse_newer(&schema_name, found)
                        .map_err(|e| deadpool_postgres::HookError::message(e.to_string()))?;
                    if found < SCHEMA_VERSION {
                        return Err(deadpool_postgres::HookError::message(format!(
                            "PostgreSQL schema {schema_name:?} is at runkeep schema version {found}, older than {SCHEMA_VERSION}; run `runkeep migrate` (or PgStore::connect) first"
                        )));
                    }
                    Ok(())
                })
            }))
            .build()
            .map_err(|e| Error::invalid(format!("PostgreSQL pool: {e}")))?;
        Ok(Self {
            pool,
            config,
            channel: format!("runkeep_{}", options.schema),
            server_clock: RemoteClock::new(options.local_clock.clone()),
            options,
            notifier: Arc::new(Notifier::default()),
            listener: Mutex::new(None),
            coalescer: Mutex::new(None),
            notify_statements: Arc::new(AtomicU64::new(0)),
        })
    }

    pub(crate) fn pg_config(url: &str, options: &PgOptions) -> Result<tokio_postgres::Config> {
        schema::validate_schema_name(&options.schema)?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            Error::invalid(format!(
                "PostgreSQL connection string does not parse ({e}); pass postgres://user@host:port/database"
            ))
        })?;
        let ms = |d: Duration| d.as_millis().max(1);
        let extra = format!(
            "-c search_path={} -c statement_timeout={} -c lock_timeout={} -c idle_in_transaction_session_timeout={}",
            options.schema,
            ms(options.statement_timeout),
            ms(options.lock_timeout),
            ms(options.idle_in_transaction_timeout)
        );
        let opts = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {extra}"),
            _ => extra,
        };
        config
            .options(&opts)
            .connect_timeout(options.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name("runkeep");
        }
        Ok(config)
    }

    pub(crate) async fn conn(&self, what: &str) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::PostCreateHook(h) => Error::Unsupported {
                message: format!("{what}: {h}"),
            },
            other => map_pool(what, other),
        })
    }

    pub(crate) async fn measure_offset(&self) -> Result<()> {
        let c = self.conn("read the server clock").await?;
        self.server_now(&c).await?;
        Ok(())
    }

    pub(crate) async fn server_now<C: GenericClient + Sync>(&self, c: &C) -> Result<Timestamp> {
        let row = self
            .rows(c, "read the server clock", NOW_SQL, &[])
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::corrupted("the server clock query answered no row"))?;
        let ms: i64 = row.get(0);
        let now = Timestamp::from_millis(ms)
            .map_err(|e| Error::corrupted(format!("the server clock is out of range: {e}")))?;
        self.note_server_now(now);
        Ok(now)
    }

    /// Keeps the offset [`CheckpointStore::now`](runkeep::CheckpointStore::now) adds to the local clock.
    pub(crate) fn note_server_now(&self, now: Timestamp) {
        self.server_clock.observe(now);
    }

    /// Starts the listener connection once, on the current runtime (none:
    /// watches poll).
    pub(crate) fn ensure_listener(&self) -> bool {
        let mut guard = self.listener.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = guard.as_ref() {
            if !h.is_finished() {
                return true;
            }
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        *guard = Some(handle.spawn(wake::listen_loop(
            self.config.clone(),
            self.channel.clone(),
            self.notifier.clone(),
        )));
        true
    }
}
