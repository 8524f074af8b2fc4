//! `runkeep serve`: the store over HTTP (`runkeep_server`).
//!
//! Opens the store like every command (`--store`, creating a missing
//! directory; a PostgreSQL schema must have been migrated), makes sure the
//! token file holds a token (started with none, it creates an operator
//! token for `--tenant` and prints it once, or writes it to `--token-out`),
//! refuses a token file other users can read (`chmod 600` it), prints the
//! address it listens
//! on (`listening on http://ADDR`, the real port when `--listen` asks for
//! port 0), and serves until SIGTERM or Ctrl-C, then shuts down gracefully:
//! new connections are refused, event streams are ended, requests in flight
//! finish (for up to `--shutdown-grace`), exit 0.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use runkeep_server::auth::Role;
use runkeep_server::server::{self, Server, ServerConfig, Stopped};
use runkeep_server::tokens::TokenFile;
use serde_json::json;

use crate::commands::token::{token_error, TokenFileArg};
use crate::context::Ctx;
use crate::duration::parse_duration;

/// `--retain-duty`: a share in (0, 1].
fn parse_duty(s: &str) -> Result<runkeep::scheduling::PruneDuty, String> {
    let share: f64 = s
        .parse()
        .map_err(|e| format!("{s}: not a number ({e}); give a share such as 0.25"))?;
    runkeep::scheduling::PruneDuty::new(share).map_err(|e| e.to_string())
}
use crate::error::{CliError, CliResult, Exit};
use crate::output::{emit, emit_json_line, note, warn};
use crate::store::{OpenMode, PoolDemand, StoreAddress};

/// `runkeep serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (the bound address is printed).
    #[arg(long, default_value = server::DEFAULT_LISTEN, value_name = "ADDR")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub file: TokenFileArg,
    /// Largest request body in bytes (413 above it).
    #[arg(long, default_value_t = runkeep_server::api::DEFAULT_BODY_LIMIT, value_name = "BYTES")]
    pub body_limit: usize,
    /// Memory large answers in flight may take together, in bytes (a checkpoint, a checkpoint listing, a page of events); each tenant's share is half, and an answer that finds no room within 5s is 503 with Retry-After.
    #[arg(long, default_value_t = runkeep_server::api::answers::DEFAULT_ANSWER_BUDGET, value_name = "BYTES")]
    pub answer_budget: usize,
    /// Longest a request may take up to its answer, body upload included (408 / 503 after it); at least 35s (long-polls wait up to 30s).
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub request_timeout: Duration,
    /// Longest a client may take to send a request head or stay idle on a connection.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub header_timeout: Duration,
    /// Longest a write may wait for a client that stopped reading; then its connection is dropped.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub write_timeout: Duration,
    /// Most short requests served at once, all tenants together (503 with Retry-After above it); long-polls and event tails count under --max-waits instead.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_concurrent: usize,
    /// Most short requests of one tenant served at once (503 with Retry-After above it; other tenants are not held back).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_concurrent_per_tenant: usize,
    /// Most short requests of one token served at once (503 with Retry-After above it).
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub max_concurrent_per_token: usize,
    /// Most long-polls (events/wait, runnable/wait, claim-next with waitMs) and event tails at once, all tenants together.
    #[arg(long, default_value_t = 2048, value_name = "N")]
    pub max_waits: usize,
    /// Most long-polls and event tails of one tenant at once.
    #[arg(long, default_value_t = 512, value_name = "N")]
    pub max_waits_per_tenant: usize,
    /// Most long-polls and event tails of one token at once.
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_waits_per_token: usize,
    /// Also run the scheduler of recurring schedules (`runkeep schedule`) over the --tenant/--project/--session scope (`--session ''`: the whole project); any number of servers may run it at once, each tick is enqueued once.
    #[arg(long)]
    pub schedules: bool,
    /// Longest a shutdown waits for requests in flight.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub shutdown_grace: Duration,
    /// How often the token file is looked at: the longest a `runkeep token revoke` takes to reach the server.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub token_reload: Duration,
    /// On a first start (no token in --tokens yet), write the new operator token to this file instead of printing it: created with mode 0600, never overwritten (an existing file is refused before any token is made). Nothing secret goes to stdout. Ignored once the token file holds tokens.
    #[arg(long, value_name = "PATH")]
    pub token_out: Option<PathBuf>,
    /// Serve a fresh in-memory store seeded with demo runs (parked, claimed, stuck, finished, dead-lettered), with new operator, worker and reader tokens in a temporary token file; prints the console's address and the tokens. Uses neither --store nor --tokens; nothing outlives the process.
    #[arg(long)]
    pub demo: bool,
    /// Delete finished runs older than this (e.g. 30d) in the scope of --tenant/--project/--session, periodically, in bounded batches (`runkeep prune --finished-before` on a timer; a run's own retention wins). Off unless given.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_ttl)]
    pub retain_finished: Option<runkeep::Ttl>,
    /// With --retain-finished: runs deleted per batch.
    #[arg(long, default_value_t = 1000, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=runkeep::scheduling::retention::MAX_PRUNE_BATCH as i64))]
    pub retain_batch: u32,
    /// With --retain-finished: the pause between two batches (claims and listings keep their share of the store).
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub retain_pause: Duration,
    /// With --retain-finished: the share of the prune's time spent in batches (above 0, at most 1): after a batch that took T it pauses at least T × (1 − SHARE) / SHARE, so a batch slowed by a loaded store is followed by a longer pause (the longer of this and --retain-pause). 1: only --retain-pause.
    #[arg(long, default_value = "0.25", value_parser = parse_duty, value_name = "SHARE")]
    pub retain_duty: runkeep::scheduling::PruneDuty,
    /// With --retain-finished: how often a round of batches starts.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub retain_every: Duration,
    /// PostgreSQL store: how often a long-poll or event tail re-reads the store when no notification came (changes through any server sharing the store wake it at once by LISTEN/NOTIFY; this only covers a notification lost while the listener reconnects, and a lease that lapses). Default 5s.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub watch_fallback: Option<Duration>,
}

pub(crate) fn serve_error(e: server::ServeError) -> CliError {
    match e {
        server::ServeError::Tokens(t) => token_error(t),
        server::ServeError::Config(message) => CliError::usage(message)
            .hint("see `runkeep serve --help` for the limits and their defaults"),
        e @ server::ServeError::Io { .. } => CliError::config(e.to_string()).hint(
            "pick another --listen address or port (port 0 picks a free one), or stop what uses it",
        ),
        other => CliError::failed(other.to_string()),
    }
}

/// Runs `runkeep serve`.
pub async fn run(ctx: &Ctx, args: ServeArgs) -> CliResult<Exit> {
    let config = ServerConfig {
        listen: args.listen,
        body_limit: args.body_limit,
        answer_budget: args.answer_budget,
        request_timeout: args.request_timeout,
        header_read_timeout: args.header_timeout,
        write_timeout: args.write_timeout,
        concurrency_limit: args.max_concurrent,
        tenant_concurrency_limit: args.max_concurrent_per_tenant,
        token_concurrency_limit: args.max_concurrent_per_token,
        wait_limit: args.max_waits,
        tenant_wait_limit: args.max_waits_per_tenant,
        token_wait_limit: args.max_waits_per_token,
        shutdown_grace: args.shutdown_grace,
        tokens: args.file.tokens.clone(),
        token_reload_every: args.token_reload,
        readiness_scope: ctx.scope.listing()?,
        ..ServerConfig::default()
    };
    config.check().map_err(serve_error)?;
    if args.demo && args.token_out.is_some() {
        return Err(CliError::usage(
            "--token-out is where the first start's operator token goes; --demo makes its own tokens and prints them",
        )
        .hint("drop --token-out for the demo"));
    }
    if args.demo {
        return crate::commands::serve_demo::run(ctx, &args, config).await;
    }
    // A PostgreSQL pool as wide as the requests served at once, up to 16
    // (--pg-pool-size overrides it).
    let mut options = ctx.store_options(PoolDemand::Serve {
        max_concurrent: args.max_concurrent,
    });
    if let Some(every) = args.watch_fallback {
        if !matches!(ctx.global.store, StoreAddress::Postgres(_)) {
            return Err(
                CliError::usage("--watch-fallback applies to a PostgreSQL store only")
                    .hint("drop --watch-fallback, or serve a postgres:// store"),
            );
        }
        options = options.with_pg_watch_fallback(every);
    }
    // A directory (or memory) store is created on first use; a PostgreSQL
    // schema is only migrated by `runkeep migrate`.
    let mode = match &ctx.global.store {
        StoreAddress::Postgres(_) => OpenMode::Existing,
        _ => OpenMode::Create,
    };
    let opened = ctx.open(mode, &options).await?;

    let file = TokenFile::new(&args.file.tokens);
    let tokens = file.list().map_err(token_error)?;
    if tokens.is_empty() {
        // Made before the token, so a refusal leaves no token nobody has.
        let out = match &args.token_out {
            Some(path) => Some((path, create_token_out(path)?)),
            None => None,
        };
        let created = match file.create(&ctx.scope.tenant, Role::Operator, Some("first start")) {
            Ok(c) => c,
            Err(e) => {
                if let Some((path, _)) = &out {
                    let _ = std::fs::remove_file(path);
                }
                return Err(token_error(e));
            }
        };
        let r = &created.record;
        if let Some((path, out)) = out {
            if let Err(e) = write_token_out(out, created.secret()) {
                // Nobody has the token: take it back.
                let _ = std::fs::remove_file(path);
                let _ = file.revoke(&r.id);
                return Err(CliError::failed(format!(
                    "cannot write the first token to --token-out {}: {e}; it was revoked, nothing is served",
                    path.display()
                )));
            }
            if ctx.json() {
                emit_json_line(&json!({
                    "event": "token-created",
                    "id": r.id,
                    "tenant": r.tenant,
                    "role": r.role,
                    "tokens": file.path(),
                    "tokenOut": path,
                }))?;
            } else {
                emit(&format!(
                    "No token was configured, so this is the first one: an operator token for tenant {} (id {}), stored hashed in {}. It was written to {} (mode 0600) and is not shown here.\n\nSend it as `Authorization: Bearer <token>`. Create others with `runkeep token create --tenant T --role worker|operator|reader`, list them with `runkeep token list`, revoke one with `runkeep token revoke ID`.\n\n",
                    r.tenant,
                    r.id,
                    file.path().display(),
                    path.display()
                ))?;
            }
        } else if ctx.json() {
            emit_json_line(&json!({
                "event": "token-created",
                "id": r.id,
                "tenant": r.tenant,
                "role": r.role,
                "tokens": file.path(),
                "token": created.secret(),
            }))?;
        } else {
            emit(&format!(
                "No token was configured, so this is the first one: an operator token for tenant {} (id {}), stored hashed in {}. It is shown only now; keep it secret:\n\n    {}\n\nSend it as `Authorization: Bearer <token>`. Create others with `runkeep token create --tenant T --role worker|operator|reader`, list them with `runkeep token list`, revoke one with `runkeep token revoke ID`.\n\n",
                r.tenant,
                r.id,
                file.path().display(),
                created.secret()
            ))?;
        }
    } else {
        if let Some(path) = &args.token_out {
            note(&format!(
                "{} holds tokens already: no first token is made, and --token-out {} is left alone",
                file.path().display(),
                path.display()
            ));
        }
        if tokens.iter().all(|t| !t.is_active()) {
            warn(&format!(
                "every token in {} is revoked: every API request will be refused (401); create one with `runkeep token create --role operator`",
                file.path().display()
            ));
        }
    }

    let state = server::state(&config, opened.store.clone()).map_err(serve_error)?;
    // Retention runs beside the server and stops with it (the task is
    // aborted when `serve` returns).
    let retention = match args.retain_finished {
        Some(keep) => Some(AbortOnDrop(tokio::spawn(
            crate::commands::prune::retain_finished(
                opened.store.clone(),
                ctx.scope.listing()?,
                runkeep::scheduling::RetentionPolicy::keep_for(keep),
                args.retain_batch as usize,
                args.retain_every,
                args.retain_pause,
                args.retain_duty,
            ),
        ))),
        None => None,
    };
    let _retention = retention;
    let address = ctx.global.store.to_string();
    let served = serve_until_signal(ctx, config, state, &address, |_| Ok(()));
    if !args.schedules {
        return served.await;
    }
    let scope = ctx.scope.listing()?;
    let store = opened.store.clone();
    tokio::select! {
        r = served => r,
        r = crate::commands::schedule::drive(ctx, store.as_ref(), &scope, Duration::from_secs(1), None) => r.map(|_| Exit::Ok),
    }
}

/// Creates `--token-out` for the first token: mode 0600, never over an
/// existing file or symlink (`O_EXCL`): it may hold another server's token,
/// and a planted link could point anywhere.
fn create_token_out(path: &Path) -> CliResult<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                CliError::config(format!(
                    "--token-out {} exists: runkeep never writes a token over a file (it may hold another server's token); nothing was created",
                    path.display()
                ))
                .hint("move it away or remove it, or pick another path")
            } else {
                CliError::config(format!(
                    "cannot create --token-out {}: {e}; nothing was created",
                    path.display()
                ))
            }
        })
}

/// Writes the token and a newline, and syncs it.
fn write_token_out(mut out: File, secret: &str) -> std::io::Result<()> {
    out.write_all(secret.as_bytes())?;
    out.write_all(b"\n")?;
    out.sync_all()
}

/// Binds `config.listen`, prints the address (then what `announce` prints
/// for it), serves `state` until SIGTERM or Ctrl-C, then shuts down
/// gracefully (`runkeep serve` and `runkeep serve --demo`).
pub(crate) async fn serve_until_signal(
    ctx: &Ctx,
    config: ServerConfig,
    state: runkeep_server::state::AppState,
    store_label: &str,
    announce: impl FnOnce(SocketAddr) -> CliResult<()>,
) -> CliResult<Exit> {
    // Registered before the address is announced: a SIGTERM from then on
    // is a graceful stop, never the default kill.
    let shutdown = runkeep_server::manners::shutdown_signal()
        .map_err(|e| CliError::failed(format!("cannot listen for SIGTERM and Ctrl-C: {e}")))?;
    let server = Server::bind(config, state).await.map_err(serve_error)?;
    let address = server
        .local_addr()
        .map_err(|e| CliError::failed(format!("the listening socket has no address: {e}")))?;
    if ctx.json() {
        emit_json_line(&json!({
            "event": "listening",
            "address": format!("http://{address}"),
            "store": store_label,
        }))?;
    } else {
        emit(&format!(
            "runkeep serve: store {store_label}; listening on http://{address} (SIGTERM or Ctrl-C stops it)\n",
        ))?;
    }
    announce(address)?;
    let stopped = server
        .run(shutdown)
        .await
        .map_err(|e| CliError::failed(format!("serving on {address}: {e}")))?;
    match stopped {
        Stopped::Drained => {
            if !ctx.json() {
                emit("runkeep serve: stopped; every request in flight was answered\n")?;
            }
        }
        Stopped::GraceElapsed { connections } => warn(&format!(
            "stopped after --shutdown-grace with requests still in flight ({connections} connection(s) were open at the signal)"
        )),
    }
    Ok(Exit::Ok)
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
