//! Connecting: the pool and its per-connection settings, the schema
//! migration and version check, the offset to the server's clock, and the
//! `LISTEN` connection's start.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use runkeep::watch::Notifier;
use runkeep::RemoteClock;
use runkeep::{Error, Result, Timestamp};

use crate::db::pooled::{self, Pooled};
use crate::db::row::NOW_SQL;
use crate::db::wake;
use crate::db::Db;
use crate::error::{map_pg, map_pool};
use crate::options::PgOptions;
use crate::schema::{self, SCHEMA_VERSION};

impl Db {
    /// Connects, migrates, measures the clock offset and starts the listener ([`crate::PgStore::connect`]).
    pub(crate) async fn connect(url: &str, options: PgOptions) -> Result<Self> {
        Self::migrate(url, &options).await?;
        let store = Self::open_migrated(url, options)?;
        store.measure_offset().await?;
        store.ensure_listener();
        Ok(store)
    }

    /// Migrates on a connection of its own ([`crate::PgStore::migrate`]).
    pub(crate) async fn migrate(url: &str, options: &PgOptions) -> Result<i32> {
        let config = Self::pg_config(Self::direct_url(url, options), options)?;
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

    /// The recorded schema version ([`crate::PgStore::schema_version`]).
    pub(crate) async fn schema_version(url: &str, options: &PgOptions) -> Result<i32> {
        let config = Self::pg_config(Self::direct_url(url, options), options)?;
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

    /// The pool on a migrated schema, not connected yet ([`crate::PgStore::open_migrated`]).
    pub(crate) fn open_migrated(url: &str, options: PgOptions) -> Result<Self> {
        let head_slack = crate::claims::HeadSlack::new(options.claim_slack);
        schema::validate_schema_name(&options.schema)?;
        if options.pool_size == 0 {
            return Err(Error::invalid("PgOptions::pool_size must be at least 1"));
        }
        // The store's own sessions go straight to PostgreSQL; the pool's
        // through the pooler when there is one.
        let config = Self::pg_config(Self::direct_url(url, &options), &options)?;
        let pooled = match options.direct_url {
            Some(_) => Some(Pooled::new(config.clone(), options.reply_timeout)),
            None => None,
        };
        let pool_config = match pooled {
            Some(_) => Self::pooled_config(url, &options)?,
            None => config.clone(),
        };
        let manager = Manager::from_config(
            pool_config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let schema_name = options.schema.clone();
        let checked = pooled.is_some().then(|| options.clone());
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
                let schema_name = schema_name.clone();
                let checked = checked.clone();
                Box::pin(async move {
                    if let Some(options) = checked {
                        return pooled::check_session(client, &options)
                            .await
                            .map_err(|e| deadpool_postgres::HookError::message(e.to_string()));
                    }
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
            pooled,
            channel: format!("runkeep_{}", options.schema),
            server_clock: RemoteClock::new(options.local_clock.clone()),
            options,
            notifier: Arc::new(Notifier::default()),
            listener: Mutex::new(None),
            coalescer: Mutex::new(None),
            notify_statements: Arc::new(AtomicU64::new(0)),
            head_slack,
        })
    }

    /// Where the store's own sessions connect: [`PgOptions::direct_url`]
    /// when the URL is a pooler's, else the URL.
    fn direct_url<'a>(url: &'a str, options: &'a PgOptions) -> &'a str {
        options.direct_url.as_deref().unwrap_or(url)
    }

    /// The pool's configuration through a transaction-mode pooler: no
    /// session settings at connect (the role's defaults carry them,
    /// checked by [`pooled::check_session`]).
    fn pooled_config(url: &str, options: &PgOptions) -> Result<tokio_postgres::Config> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            Error::invalid(format!(
                "PostgreSQL connection string (the pooler's) does not parse ({e}); pass postgres://user@host:port/database"
            ))
        })?;
        if config.get_options().is_some_and(|o| !o.is_empty()) {
            return Err(Error::invalid(
                "the pooler's connection string sets `options`, which a transaction-mode pooler refuses or drops; give session settings as the role's defaults (ALTER ROLE … SET) instead",
            ));
        }
        config
            .connect_timeout(options.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name("runkeep");
        }
        Ok(config)
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

    pub(crate) async fn server_now<C: crate::db::Session>(&self, c: &C) -> Result<Timestamp> {
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
